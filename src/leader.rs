//! Leader election on a `coordination.k8s.io/v1` Lease, so that with several
//! replicas exactly one reconciles (admissions must be decided by one writer:
//! two would both see the same free GPUs and both admit).
//!
//! The pattern is the standard safe one: wait for the Lease, run the work,
//! and if leadership is lost, or can no longer be *proven*, drop the work
//! and return [`Error::LeadershipLost`] so the process exits non-zero and
//! Kubernetes restarts it as a fresh standby. Work is never resumed in
//! place after a loss; all state the controller needs is in the
//! `UpgradePlan` status, so a restart costs only a cache resync.
//!
//! [`kube_lease_manager`]'s `watch()` acquires and renews the Lease in a task
//! of its own, retries API errors itself (backoff 1 s to 30 s) and reports
//! only changes of leadership; dropping its receiver releases the Lease. What
//! it cannot report is a renewal that keeps failing or hangs: it still says
//! "leader" while the Lease runs out and another replica takes over. So
//! raygate adds only a watchdog, which reads the Lease itself and stops the
//! work (and fences every write, [`Fence`]) shortly before the last renewal
//! it has seen expires.

use std::future::Future;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_lease_manager::LeaseManagerBuilder;

use crate::Error;
use crate::server::Health;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Fencing for writes: every write first asks [`Fence::check`], which allows
/// it only while the last confirmed renewal of our Lease is still valid by
/// a margin, and is bounded by [`Fence::api_timeout`], shorter than that
/// margin. So a write can neither start nor still be in flight once another
/// replica may have taken over.
#[derive(Debug)]
pub struct Fence {
    enabled: bool,
    grace: Duration,
    /// Milliseconds since the epoch until which writes are allowed.
    until_ms: AtomicU64,
}

/// API timeout when leader election is off: nothing to fence, but a hung
/// apiserver must still not hang a reconcile forever.
const UNFENCED_TIMEOUT: Duration = Duration::from_secs(10);

impl Fence {
    /// No election: every write is allowed.
    pub fn open() -> Fence {
        Fence {
            enabled: false,
            grace: Duration::ZERO,
            until_ms: AtomicU64::new(u64::MAX),
        }
    }

    /// Election on: nothing is allowed until a renewal is confirmed.
    pub fn closed(grace: Duration) -> Fence {
        Fence {
            enabled: true,
            grace,
            until_ms: AtomicU64::new(0),
        }
    }

    pub fn for_config(cfg: &LeaderConfig) -> Fence {
        if cfg.enabled {
            Fence::closed(cfg.grace)
        } else {
            Fence::open()
        }
    }

    /// Bound for one API call: a quarter of the grace (the watchdog stops
    /// the work half a grace before expiry, so a call started just before
    /// that ends a quarter grace before another replica can take over).
    pub fn api_timeout(&self) -> Duration {
        if self.enabled {
            (self.grace / 4).max(Duration::from_millis(500))
        } else {
            UNFENCED_TIMEOUT
        }
    }

    /// The Lease was confirmed ours until `valid_until`.
    pub fn confirm(&self, valid_until: SystemTime) {
        let stop = deadline(valid_until, self.grace);
        let ms = stop
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.until_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// Leadership is over: refuse everything from now on.
    pub fn revoke(&self) {
        if self.enabled {
            self.until_ms.store(0, Ordering::Release);
        }
    }

    /// Ok while a write may start: it will end (see [`Fence::api_timeout`])
    /// before the lease we last confirmed could be taken over.
    pub fn check(&self) -> crate::Result<()> {
        self.check_at(SystemTime::now())
    }

    fn check_at(&self, now: SystemTime) -> crate::Result<()> {
        let until = self.until_ms.load(Ordering::Acquire);
        let now_ms = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let margin = u64::try_from(self.api_timeout().as_millis()).unwrap_or(u64::MAX);
        if !self.enabled || now_ms.saturating_add(margin) < until {
            Ok(())
        } else {
            Err(Error::Fenced(
                "the leader lease is not confirmed valid long enough for this write".into(),
            ))
        }
    }
}

/// How this replica takes part in leader election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Off for a single replica or local runs: the work just runs.
    pub enabled: bool,
    /// Namespace of the Lease; empty means the client's default namespace
    /// (in a pod: the pod's own namespace).
    pub namespace: String,
    pub lease_name: String,
    /// Unique per replica; see [`default_identity`].
    pub identity: String,
    /// How long a renewal stays valid (whole seconds, as the Lease stores it).
    pub lease_duration: Duration,
    /// How long before expiry the holder renews; also the clock skew the
    /// replicas tolerate. Whole seconds, less than `lease_duration`.
    pub grace: Duration,
}

/// Name of the Lease when nothing else is configured.
pub const DEFAULT_LEASE_NAME: &str = "raygate-leader";

impl Default for LeaderConfig {
    /// Enabled, `raygate-leader` in the client's namespace, 15 s lease
    /// renewed 5 s early (client-go's 15 s / 10 s renew deadline): a crashed
    /// leader is replaced within ~15 s.
    fn default() -> Self {
        LeaderConfig {
            enabled: true,
            namespace: String::new(),
            lease_name: DEFAULT_LEASE_NAME.to_owned(),
            identity: default_identity(),
            lease_duration: Duration::from_secs(15),
            grace: Duration::from_secs(5),
        }
    }
}

impl LeaderConfig {
    /// Checks the config and returns (duration, grace) in seconds, the
    /// Lease's unit. kube-lease-manager panics on bad values, so we refuse
    /// them first.
    pub fn validate(&self) -> crate::Result<(u64, u64)> {
        let invalid = |reason: &str| Error::invalid("leader election", reason.to_owned());
        if self.lease_name.is_empty() {
            return Err(invalid("lease name is empty"));
        }
        if self.identity.is_empty() {
            return Err(invalid("identity is empty"));
        }
        let whole = |d: Duration| d.subsec_nanos() == 0 && d.as_secs() > 0;
        if !whole(self.lease_duration) || !whole(self.grace) {
            return Err(invalid(
                "lease duration and grace must be whole seconds greater than zero",
            ));
        }
        if self.grace >= self.lease_duration {
            return Err(invalid("grace must be shorter than the lease duration"));
        }
        if i32::try_from(self.lease_duration.as_secs()).is_err() {
            return Err(invalid("lease duration is too long"));
        }
        Ok((self.lease_duration.as_secs(), self.grace.as_secs()))
    }
}

/// The Lease holder identity: `POD_NAME` (downward API) if set, else
/// `hostname-pid`, so two processes on one machine never share it.
pub fn default_identity() -> String {
    identity_from(
        std::env::var("POD_NAME").ok(),
        hostname(),
        std::process::id(),
    )
}

fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

fn identity_from(pod_name: Option<String>, hostname: Option<String>, pid: u32) -> String {
    match pod_name
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
    {
        Some(pod) => pod,
        None => format!("{}-{pid}", hostname.as_deref().unwrap_or("raygate")),
    }
}

/// Runs `work` only while this replica is the leader.
///
/// Disabled: runs `work` directly. Enabled: waits for the Lease (logging
/// "waiting for leadership"), sets the health leader flag, then runs `work`
/// until it ends, then releases the Lease (a standby then finds it free
/// when its current wait, at most one lease duration, ends); or until leadership is lost, in which case `work` is dropped
/// mid-flight and [`Error::LeadershipLost`] is returned.
///
/// To shut down cleanly, let `work` finish (e.g. on SIGTERM); dropping this
/// future while leading does not release the Lease, it then simply expires.
pub async fn run_as_leader<F, Fut>(
    client: kube::Client,
    cfg: LeaderConfig,
    health: Arc<Health>,
    fence: Arc<Fence>,
    work: F,
) -> crate::Result<()>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = crate::Result<()>>,
{
    if !cfg.enabled {
        health.set_leader(true);
        let result = work().await;
        health.set_leader(false);
        return result;
    }

    let (duration, grace) = cfg.validate()?;
    let namespace = if cfg.namespace.is_empty() {
        client.default_namespace().to_owned()
    } else {
        cfg.namespace.clone()
    };
    let manager = LeaseManagerBuilder::new(client.clone(), &cfg.lease_name)
        .with_namespace(&namespace)
        .with_identity(&cfg.identity)
        .with_duration(duration)
        .with_grace(grace)
        .build()
        .await?;

    health.set_leader(false);
    tracing::info!(
        lease = %format!("{namespace}/{}", cfg.lease_name),
        identity = %cfg.identity,
        "waiting for leadership"
    );
    let (mut leading, manager_task) = manager.watch().await;
    if leading.wait_for(|l| *l).await.is_err() {
        return Err(Error::LeadershipLost {
            reason: manager_ended(manager_task).await,
        });
    }
    let acquired_at = SystemTime::now();
    fence.confirm(acquired_at + cfg.lease_duration);
    health.set_leader(true);
    tracing::info!(identity = %cfg.identity, "acquired leadership");

    let lease = LeaseWatch {
        api: Api::namespaced(client, &namespace),
        name: cfg.lease_name.clone(),
        identity: cfg.identity.clone(),
        duration: cfg.lease_duration,
        grace: cfg.grace,
        fence: fence.clone(),
    };
    let outcome = tokio::select! {
        biased;
        reason = taken_over(&mut leading) => Err(reason),
        reason = lease.watchdog(earlier(acquired_at + cfg.lease_duration, cfg.grace)) => Err(reason),
        result = work() => Ok(result),
    };
    fence.revoke();
    health.set_leader(false);

    match outcome {
        Ok(result) => {
            // The manager releases the Lease once nobody listens any more.
            drop(leading);
            match tokio::time::timeout(cfg.grace, manager_task).await {
                Ok(Ok(Ok(_))) => tracing::info!(identity = %cfg.identity, "released leadership"),
                Ok(Ok(Err(e))) => {
                    tracing::warn!(error = %e, "releasing the lease; it will expire instead");
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "releasing the lease; it will expire instead");
                }
                Err(_) => tracing::warn!("releasing the lease timed out; it will expire instead"),
            }
            result
        }
        Err(reason) => {
            // Not ours any more, or not provably: no release, no further renewal.
            manager_task.abort();
            health.set_ready(false);
            tracing::error!(%reason, "leadership lost; stopping work");
            Err(Error::LeadershipLost { reason })
        }
    }
}

/// Returns once the manager says the Lease is no longer ours.
async fn taken_over(leading: &mut tokio::sync::watch::Receiver<bool>) -> String {
    match leading.wait_for(|l| !*l).await {
        Ok(_) => "the lease was taken over".to_owned(),
        Err(_) => "the lease manager stopped".to_owned(),
    }
}

/// Why the manager's task ended before it ever reported leadership.
async fn manager_ended(
    task: tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
) -> String {
    match task.await {
        Ok(Ok(_)) => "the lease manager stopped".to_owned(),
        Ok(Err(e)) => format!("the lease manager stopped: {e}"),
        Err(e) => format!("the lease manager failed: {e}"),
    }
}

struct LeaseWatch {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    grace: Duration,
    fence: Arc<Fence>,
}

/// What one read of the Lease says about us.
#[derive(Debug, PartialEq)]
enum Seen {
    /// We hold it; valid until this instant (renewTime + duration).
    Ours(SystemTime),
    Other(Option<String>),
}

fn seen(lease: &Lease, identity: &str) -> Seen {
    let spec = lease.spec.as_ref();
    let holder = spec.and_then(|s| s.holder_identity.clone());
    if holder.as_deref() != Some(identity) {
        return Seen::Other(holder);
    }
    let renew = spec.and_then(|s| s.renew_time.as_ref());
    let secs = spec.and_then(|s| s.lease_duration_seconds);
    match (renew, secs.and_then(|s| u64::try_from(s).ok())) {
        (Some(renew), Some(secs)) => {
            Seen::Ours(SystemTime::from(renew.0) + Duration::from_secs(secs))
        }
        // Held by us but without a time: treat as already expired.
        _ => Seen::Ours(SystemTime::UNIX_EPOCH),
    }
}

/// When the work must stop if no newer renewal has been seen: half the
/// grace before expiry, leaving the other half for clock skew against the
/// replica that would take over.
fn deadline(valid_until: SystemTime, grace: Duration) -> SystemTime {
    earlier(valid_until, grace / 2)
}

/// `t - d`, saturating instead of panicking on underflow.
fn earlier(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// When to read the Lease next. The manager renews `grace` before expiry,
/// so look just after that; if the renewal has not shown up, look again
/// every `grace/8` until the deadline.
fn next_poll(now: SystemTime, valid_until: SystemTime, grace: Duration) -> SystemTime {
    let expected = earlier(valid_until, grace * 3 / 4);
    let at = if now < expected {
        expected
    } else {
        now + grace / 8
    };
    at.min(deadline(valid_until, grace)).max(now)
}

impl LeaseWatch {
    /// Returns (why) once leadership can no longer be confirmed.
    async fn watchdog(&self, mut valid_until: SystemTime) -> String {
        let mut first = true;
        loop {
            let now = SystemTime::now();
            let stop = deadline(valid_until, self.grace);
            if now >= stop {
                return format!(
                    "no renewal of lease {:?} confirmed in time (valid until {}, lease duration {:?})",
                    self.name,
                    jiff::Timestamp::try_from(valid_until)
                        .map_or_else(|_| "?".to_owned(), |t| t.to_string()),
                    self.duration,
                );
            }
            if !first {
                let wait = next_poll(now, valid_until, self.grace)
                    .duration_since(now)
                    .unwrap_or_default();
                tokio::time::sleep(wait).await;
            }
            first = false;

            // Bound the read so a hung request cannot carry us past the deadline.
            let budget = stop
                .duration_since(SystemTime::now())
                .unwrap_or_default()
                .min(self.grace / 4);
            match tokio::time::timeout(budget, self.api.get_opt(&self.name)).await {
                Ok(Ok(Some(lease))) => match seen(&lease, &self.identity) {
                    Seen::Ours(until) => {
                        valid_until = valid_until.max(until);
                        self.fence.confirm(valid_until);
                    }
                    Seen::Other(holder) => {
                        self.fence.revoke();
                        return format!("lease {:?} is now held by {holder:?}", self.name);
                    }
                },
                Ok(Ok(None)) => {
                    self.fence.revoke();
                    return format!("lease {:?} was deleted", self.name);
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "reading the leader lease"),
                Err(_) => tracing::warn!(timeout = ?budget, "reading the leader lease timed out"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let cfg = LeaderConfig::default();
        assert!(cfg.enabled);
        assert_eq!(cfg.lease_name, "raygate-leader");
        assert!(cfg.namespace.is_empty(), "client default namespace");
        assert!(!cfg.identity.is_empty());
        assert_eq!(cfg.validate().unwrap(), (15, 5));
    }

    #[test]
    fn validate_rejects_what_would_panic_in_the_lease_manager() {
        let ok = LeaderConfig::default();
        let bad = [
            LeaderConfig {
                grace: secs(15),
                ..ok.clone()
            },
            LeaderConfig {
                grace: secs(0),
                ..ok.clone()
            },
            LeaderConfig {
                lease_duration: Duration::from_millis(15_500),
                ..ok.clone()
            },
            LeaderConfig {
                identity: String::new(),
                ..ok.clone()
            },
            LeaderConfig {
                lease_name: String::new(),
                ..ok.clone()
            },
        ];
        for cfg in bad {
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.starts_with("leader election:"), "{cfg:?}: {err}");
        }
    }

    #[test]
    fn identity_prefers_pod_name_then_host_and_pid() {
        assert_eq!(
            identity_from(Some("raygate-7d9f-abcde".into()), Some("node1".into()), 42),
            "raygate-7d9f-abcde"
        );
        assert_eq!(
            identity_from(Some("  ".into()), Some("node1".into()), 42),
            "node1-42"
        );
        assert_eq!(identity_from(None, None, 7), "raygate-7");
        let id = default_identity();
        assert!(!id.is_empty());
        if std::env::var("POD_NAME").is_err() {
            assert!(id.ends_with(&format!("-{}", std::process::id())), "{id}");
        }
    }

    #[test]
    fn watchdog_schedule_looks_after_renewal_and_stops_before_expiry() {
        let t = SystemTime::UNIX_EPOCH + secs(1_000_000);
        let grace = secs(4);
        // Far from expiry: first look is 3 s before (1 s after the renewal).
        assert_eq!(next_poll(t - secs(10), t, grace), t - secs(3));
        // Renewal overdue: retry every grace/8.
        assert_eq!(
            next_poll(t - secs(3), t, grace),
            t - secs(3) + Duration::from_millis(500)
        );
        // Never past the deadline, never in the past.
        assert_eq!(deadline(t, grace), t - secs(2));
        assert_eq!(
            next_poll(t - Duration::from_millis(2100), t, grace),
            t - secs(2)
        );
        assert_eq!(next_poll(t - secs(1), t, grace), t - secs(1));
    }

    fn lease(holder: Option<&str>, renew: Option<SystemTime>, secs: Option<i32>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                renew_time: renew
                    .map(|t| MicroTime(k8s_openapi::jiff::Timestamp::try_from(t).unwrap())),
                lease_duration_seconds: secs,
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn fence_allows_writes_only_well_inside_the_confirmed_lease() {
        let t = SystemTime::UNIX_EPOCH + secs(1_700_000_000);
        let f = Fence::closed(secs(4));
        assert_eq!(f.api_timeout(), secs(1));
        assert!(f.check_at(t).is_err(), "nothing before a confirmed renewal");
        f.confirm(t + secs(15));
        // Writes stop half a grace (2 s) plus one API timeout (1 s) before expiry.
        assert!(f.check_at(t + secs(11)).is_ok());
        assert!(f.check_at(t + Duration::from_millis(12_001)).is_err());
        // An older confirmation never shortens a newer one.
        f.confirm(t + secs(5));
        assert!(f.check_at(t + secs(11)).is_ok());
        f.revoke();
        assert!(f.check_at(t).is_err(), "revoked");
        let open = Fence::open();
        open.revoke();
        assert!(open.check_at(t).is_ok(), "no election: never fenced");
        assert_eq!(open.api_timeout(), secs(10));
    }

    #[test]
    fn reading_the_lease() {
        let t = SystemTime::UNIX_EPOCH + secs(1_700_000_000);
        assert_eq!(
            seen(&lease(Some("me"), Some(t), Some(15)), "me"),
            Seen::Ours(t + secs(15))
        );
        assert_eq!(
            seen(&lease(Some("you"), Some(t), Some(15)), "me"),
            Seen::Other(Some("you".into()))
        );
        assert_eq!(seen(&lease(None, None, None), "me"), Seen::Other(None));
        assert_eq!(seen(&Lease::default(), "me"), Seen::Other(None));
        assert_eq!(
            seen(&lease(Some("me"), None, Some(15)), "me"),
            Seen::Ours(SystemTime::UNIX_EPOCH)
        );
    }

    #[tokio::test]
    async fn disabled_runs_work_directly_and_passes_its_result() {
        // A client that points nowhere: disabled election must not touch it.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let health = Arc::new(Health::new());
        let cfg = LeaderConfig {
            enabled: false,
            ..LeaderConfig::default()
        };
        let h = health.clone();
        let result = run_as_leader(
            client,
            cfg,
            health.clone(),
            Arc::new(Fence::open()),
            || async move {
                assert!(h.is_leader(), "leader while working");
                Err(Error::invalid("work", "boom"))
            },
        )
        .await;
        assert_eq!(result.unwrap_err().to_string(), "work: boom");
        assert!(!health.is_leader());
    }

    #[tokio::test]
    async fn enabled_refuses_bad_config_before_calling_the_api() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let cfg = LeaderConfig {
            grace: secs(30),
            ..LeaderConfig::default()
        };
        let fence = Arc::new(Fence::for_config(&cfg));
        let err = run_as_leader(client, cfg, Arc::new(Health::new()), fence, || async {
            Ok(())
        })
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }), "{err}");
    }
}
