//! Batching (`spec.batching`): several commits that each need a new cluster
//! cost one new cluster, not one each.
//!
//! A change that needs a new cluster is held (phase `Batching`) until the
//! RayService's cluster spec has been unchanged for `quietPeriod`, but never
//! longer than `maxDelay` after the batch's first change; then it goes
//! through the gate as any change (windows, approval, capacity). Approving the
//! batch's fingerprint (`policy: Manual`) releases it at once. Changes that
//! need no new cluster never reach this: they are not held by it.
//!
//! Pure: the batch is derived from the previous `status.batch`, the change
//! observed now and `now`, so a restart loses nothing and the same inputs
//! always give the same batch:
//!
//! - a fingerprint seen for the first time is a new change: appended, and the
//!   quiet period restarts;
//! - a fingerprint the batch already went through is a revert inside the
//!   batch: the changes after it drop out (the quiet period restarts too, the
//!   spec did change); a revert to the active cluster's spec leaves no change
//!   at all, and the caller drops the batch;
//! - the same fingerprint as before: nothing moves.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::render::Builder;
use super::stall::human_duration;
use super::{ChangeFacts, EventReason, Inputs, Outcome, REQUEUE_WAITING};
use crate::schedule;
use crate::upgradeplan::{BatchStatus, BatchedChange, BatchingSpec, Phase, Policy, batching};

/// The default of `maxDelay` (also `--default-batching-max-delay`'s).
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(6 * 3600);

/// A plan's batching, as typed durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    pub quiet_period: Duration,
    /// Never less than `quiet_period`.
    pub max_delay: Duration,
}

/// The operator's batching flags (`--default-batching-quiet-period`,
/// `--default-batching-max-delay`), carried in [`super::settings::Operator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    /// `None`: plans without `spec.batching` are not batched.
    pub batching: Option<Batching>,
    /// `maxDelay` of a `spec.batching` that does not set it.
    pub max_delay: Duration,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            batching: None,
            max_delay: DEFAULT_MAX_DELAY,
        }
    }
}

impl Defaults {
    /// From the flags: an empty or zero quiet period is no default batching.
    pub fn parse(quiet_period: &str, max_delay: &str) -> crate::Result<Defaults> {
        let max_delay = schedule::parse_duration("--default-batching-max-delay", max_delay)?;
        let quiet = match quiet_period.trim() {
            "" => Duration::ZERO,
            q => schedule::parse_duration("--default-batching-quiet-period", q)?,
        };
        Ok(Defaults {
            batching: (!quiet.is_zero()).then_some(Batching {
                quiet_period: quiet,
                max_delay: max_delay.max(quiet),
            }),
            max_delay,
        })
    }
}

impl Batching {
    /// `spec.batching` (or the operator's default `d` when unset); `None`
    /// when the plan is not batched (`quietPeriod: 0s` turns a default off).
    pub fn of(spec: Option<&BatchingSpec>, d: Defaults) -> crate::Result<Option<Batching>> {
        let Some(spec) = spec else {
            return Ok(d.batching);
        };
        let quiet = schedule::parse_duration("spec.batching.quietPeriod", &spec.quiet_period);
        let max = spec
            .max_delay
            .as_deref()
            .map(|m| schedule::parse_duration("spec.batching.maxDelay", m))
            .transpose();
        let (quiet, max) = match (quiet, max) {
            (Ok(q), Ok(m)) => (q, m),
            (q, m) => {
                let errors = [q.err(), m.err()].into_iter().flatten().collect();
                return Err(crate::Error::all(errors).unwrap_or_else(|| {
                    crate::Error::invalid("spec.batching", "invalid durations")
                }));
            }
        };
        if let Some(m) = max
            && m < quiet
        {
            return Err(crate::Error::invalid(
                "spec.batching.maxDelay",
                format!(
                    "{} is less than quietPeriod {}",
                    spec.max_delay.as_deref().unwrap_or_default(),
                    spec.quiet_period
                ),
            ));
        }
        Ok((!quiet.is_zero()).then(|| Batching {
            quiet_period: quiet,
            max_delay: max.unwrap_or(d.max_delay).max(quiet),
        }))
    }
}

/// `t + d`, saturating at the largest timestamp (durations are bounded by
/// [`schedule::MAX_DURATION`], so this never saturates in practice).
pub fn after(t: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// The batch once the cluster spec is seen with `fingerprint` (differing from
/// the active cluster's in `paths`) at `now`. See the module doc.
pub fn observe(
    prev: Option<&BatchStatus>,
    fingerprint: &str,
    paths: &[String],
    now: Timestamp,
) -> BatchStatus {
    let listed = |p: &[String]| p.iter().take(batching::MAX_LISTED_PATHS).cloned().collect();
    let Some(prev) = prev.filter(|p| !p.changes.is_empty()) else {
        return BatchStatus {
            fingerprint: fingerprint.into(),
            change_count: 1,
            first_change_time: now,
            last_change_time: now,
            changes: vec![BatchedChange {
                fingerprint: fingerprint.into(),
                seen_time: now,
                paths: listed(paths),
            }],
            ..Default::default()
        };
    };
    let mut b = prev.clone();
    if b.fingerprint == fingerprint {
        return b;
    }
    b.fingerprint = fingerprint.into();
    b.last_change_time = now;
    if let Some(i) = b.changes.iter().position(|c| c.fingerprint == fingerprint) {
        // Back to what the spec was after change i: the later ones drop out.
        let dropped = (b.changes.len() - i - 1) as u32;
        b.changes.truncate(i + 1);
        b.change_count = b.change_count.saturating_sub(dropped).max(1);
        return b;
    }
    let touched: std::collections::BTreeSet<&String> =
        b.changes.iter().flat_map(|c| &c.paths).collect();
    let fresh: Vec<String> = paths
        .iter()
        .filter(|p| !touched.contains(p))
        .cloned()
        .collect();
    let change = BatchedChange {
        fingerprint: fingerprint.into(),
        seen_time: now,
        paths: if fresh.is_empty() {
            listed(paths)
        } else {
            listed(&fresh)
        },
    };
    if b.changes.len() >= batching::MAX_LISTED_CHANGES {
        if let Some(last) = b.changes.last_mut() {
            *last = change;
        }
    } else {
        b.changes.push(change);
    }
    b.change_count = b.change_count.saturating_add(1);
    b
}

/// Why a batch was released, as `status.batch.released` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The spec was unchanged for `quietPeriod`.
    QuietPeriod,
    /// `maxDelay` after the first change, however busy the spec still is.
    MaxDelay,
    /// `policy: Manual` and `spec.approve` names the batch's fingerprint.
    Approved,
}

impl Released {
    pub fn as_str(self) -> &'static str {
        match self {
            Released::QuietPeriod => "QuietPeriod",
            Released::MaxDelay => "MaxDelay",
            Released::Approved => "Approved",
        }
    }
}

/// When `batch` is released under `policy`: `lastChangeTime + quietPeriod`,
/// at most `firstChangeTime + maxDelay`.
pub fn release_time(batch: &BatchStatus, policy: &Batching) -> Timestamp {
    after(batch.last_change_time, policy.quiet_period)
        .min(after(batch.first_change_time, policy.max_delay))
}

/// Fills in `batch.releaseTime` and `batch.released`; `Err(until)` while
/// the batch holds its change, `Ok(why)` once released.
pub fn release(
    batch: &mut BatchStatus,
    policy: &Batching,
    approved: bool,
    now: Timestamp,
) -> Result<Released, Timestamp> {
    let at = release_time(batch, policy);
    batch.release_time = Some(at);
    let why = if approved {
        Released::Approved
    } else if now < at {
        batch.released = None;
        return Err(at);
    } else if at < after(batch.last_change_time, policy.quiet_period) {
        Released::MaxDelay
    } else {
        Released::QuietPeriod
    };
    batch.released = Some(why.as_str().to_string());
    Ok(why)
}

/// "3 changes, 1 recreation": what a batch saves, for its Event.
pub fn summary(batch: &BatchStatus) -> String {
    let n = batch.change_count;
    format!("{n} change{}, 1 recreation", if n == 1 { "" } else { "s" })
}

/// The batch of `change` in a decision that is not tracking a transition
/// (rule 4 of [`super::rules`]): gathered into `status.batch` with its
/// Events; `Some(until)` while it holds the change. Without batching the
/// status has no batch.
pub(super) fn gather(
    b: &mut Builder<'_>,
    inp: &Inputs<'_>,
    policy: Option<&Batching>,
    change: &ChangeFacts,
) -> Option<Timestamp> {
    let Some(policy) = policy else {
        b.status.batch = None;
        return None;
    };
    let prev = b.prev.batch.clone();
    let mut batch = observe(
        prev.as_ref(),
        &change.fingerprint,
        &change.triggering_paths,
        inp.now,
    );
    batch.after_transition_to = None;
    let spec = &inp.plan.spec;
    let approved =
        spec.policy == Policy::Manual && spec.approve.as_deref() == Some(&change.fingerprint);
    let joined = prev.as_ref().map(|p| p.fingerprint.as_str()) != Some(&change.fingerprint);
    let fp = &change.fingerprint;
    let held = match release(&mut batch, policy, approved, inp.now) {
        Err(until) => {
            if joined {
                let paths = batch
                    .changes
                    .last()
                    .map(|c| c.paths.join(", "))
                    .unwrap_or_default();
                b.change_event(
                    false,
                    EventReason::Batching,
                    fp,
                    format!(
                        "change {fp} ({paths}) joins the batch of the next new cluster ({}); held until {until}",
                        plural(batch.change_count, "change")
                    ),
                );
            }
            Some(until)
        }
        Ok(why) => {
            let was_released = prev.as_ref().is_some_and(|p| p.released.is_some());
            if joined || !was_released {
                b.change_event(
                    false,
                    EventReason::BatchReleased,
                    fp,
                    format!(
                        "batch released ({}): {}; change {fp} goes to the gate",
                        why.as_str(),
                        summary(&batch)
                    ),
                );
            }
            None
        }
    };
    b.status.batch = Some(batch);
    held
}

/// Holds the change in phase `Batching` until `until`.
pub(super) fn hold(b: &mut Builder<'_>, inp: &Inputs<'_>, policy: &Batching, until: Timestamp) {
    let Some(batch) = b.status.batch.clone() else {
        return;
    };
    let approve = match inp.plan.spec.policy {
        Policy::Manual => format!("; approving {} releases it now", batch.fingerprint),
        _ => String::new(),
    };
    b.hold(
        Phase::Batching,
        &format!("batch: {}", plural(batch.change_count, "change")),
        &format!(
            "batching {} into one new cluster: released at {until} ({} after the last change at {}, at most {} after the first at {}){approve}",
            plural(batch.change_count, "change"),
            human_duration(policy.quiet_period),
            batch.last_change_time,
            human_duration(policy.max_delay),
            batch.first_change_time,
        ),
        Outcome::HeldBatching,
    );
    let left = Duration::try_from(until.duration_since(inp.now)).unwrap_or_default();
    b.requeue = left.clamp(Duration::from_secs(1), REQUEUE_WAITING);
}

/// A batch is admitted: it leaves the status, and what it saved is counted.
/// The text for the Admitted Event (empty for a batch of one, or none).
pub(super) fn admitted(b: &mut Builder<'_>) -> String {
    match b.status.batch.take() {
        Some(batch) => {
            b.observed.recreations_avoided = batch.change_count.saturating_sub(1);
            format!(" (batch of {})", plural(batch.change_count, "change"))
        }
        None => String::new(),
    }
}

/// While a transition to `to` runs, a further cluster change waits for it
/// to end: never a third cluster, nor a pending cluster KubeRay would
/// prepare and drop. It is shown as the next batch (`status.batch` with
/// `afterTransitionTo`), one Event when a change joins it.
pub fn during_transition(b: &mut Builder<'_>, inp: &Inputs<'_>, to: Option<&str>, admitted: &str) {
    let change = match (&inp.change, to) {
        (Ok(Some(c)), Some(to)) if c.fingerprint != admitted => (c, to),
        _ => {
            b.status.batch = None;
            return;
        }
    };
    let (c, to) = change;
    let prev = b
        .prev
        .batch
        .clone()
        .filter(|p| p.after_transition_to.is_some());
    // While Kueue has the service stopped, its templates are Kueue's restore
    // (e.g. without the flavor's node selector), not a change: nothing joins
    // the next batch until Kueue starts it again.
    if inp.service.as_ref().is_ok_and(|s| s.kueue_stopped) {
        b.status.batch = prev;
        return;
    }
    let mut batch = observe(prev.as_ref(), &c.fingerprint, &c.triggering_paths, inp.now);
    batch.after_transition_to = Some(to.to_string());
    batch.release_time = None;
    batch.released = None;
    if prev.as_ref().map(|p| p.fingerprint.as_str()) != Some(&c.fingerprint) {
        let fp = &c.fingerprint;
        b.change_event(
            false,
            EventReason::Batching,
            fp,
            format!(
                "change {fp} ({}) was made while the transition to {to} runs: it waits for it to end, \
                 as the next batch ({}), never as a third cluster",
                c.triggering_paths.join(", "),
                plural(batch.change_count, "change")
            ),
        );
    }
    b.status.batch = Some(batch);
}

/// What the message of a running transition adds about the next batch.
pub(super) fn next_note(b: &Builder<'_>) -> String {
    b.status
        .batch
        .as_ref()
        .filter(|x| x.after_transition_to.is_some())
        .map(|x| {
            format!(
                "; next batch: {} ({}) waits for the transition to end",
                plural(x.change_count, "change"),
                x.fingerprint
            )
        })
        .unwrap_or_default()
}

fn plural(n: u32, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn paths(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    const IMAGE: &str = "workerGroupSpecs[gpu].template.spec.containers[ray-worker].image";
    const MEMORY: &str = "workerGroupSpecs[gpu].template.spec.containers[ray-worker].resources";

    fn policy() -> Batching {
        Batching {
            quiet_period: Duration::from_secs(30 * 60),
            max_delay: Duration::from_secs(6 * 3600),
        }
    }

    #[test]
    fn a_new_commit_restarts_the_quiet_period() {
        let p = policy();
        let mut b = observe(None, "aaaa", &paths(&[IMAGE]), at("2026-12-07T10:00:00Z"));
        assert_eq!(
            release(&mut b, &p, false, at("2026-12-07T10:20:00Z")),
            Err(at("2026-12-07T10:30:00Z"))
        );
        // Seen again: nothing moves.
        let mut same = observe(
            Some(&b),
            "aaaa",
            &paths(&[IMAGE]),
            at("2026-12-07T10:25:00Z"),
        );
        assert_eq!(same.last_change_time, at("2026-12-07T10:00:00Z"));
        assert_eq!(
            release(&mut same, &p, false, at("2026-12-07T10:29:59Z")),
            Err(at("2026-12-07T10:30:00Z"))
        );
        // A second commit at 10:25 restarts it.
        let mut b2 = observe(
            Some(&b),
            "bbbb",
            &paths(&[IMAGE, MEMORY]),
            at("2026-12-07T10:25:00Z"),
        );
        assert_eq!(b2.change_count, 2);
        assert_eq!(b2.first_change_time, at("2026-12-07T10:00:00Z"));
        assert_eq!(b2.changes[1].paths, paths(&[MEMORY]), "only what is new");
        assert_eq!(
            release(&mut b2, &p, false, at("2026-12-07T10:30:00Z")),
            Err(at("2026-12-07T10:55:00Z"))
        );
        assert_eq!(b2.released, None);
        assert_eq!(
            release(&mut b2, &p, false, at("2026-12-07T10:55:00Z")),
            Ok(Released::QuietPeriod)
        );
        assert_eq!(b2.released.as_deref(), Some("QuietPeriod"));
        assert_eq!(summary(&b2), "2 changes, 1 recreation");
    }

    #[test]
    fn max_delay_caps_a_batch_that_never_goes_quiet() {
        let p = Batching {
            quiet_period: Duration::from_secs(30 * 60),
            max_delay: Duration::from_secs(3600),
        };
        let mut b = observe(None, "c0", &paths(&[IMAGE]), at("2026-12-07T10:00:00Z"));
        // A commit every 20 minutes: the quiet period never passes.
        for (i, t) in ["10:20", "10:40", "11:00"].iter().enumerate() {
            let now = at(&format!("2026-12-07T{t}:00Z"));
            b = observe(Some(&b), &format!("c{}", i + 1), &paths(&[IMAGE]), now);
            let r = release(&mut b, &p, false, now);
            if i < 2 {
                assert!(r.is_err(), "{t}: {r:?}");
                assert!(b.release_time.unwrap() <= at("2026-12-07T11:00:00Z"));
            } else {
                assert_eq!(r, Ok(Released::MaxDelay), "{t}");
            }
        }
        assert_eq!(b.change_count, 4);
        // A value changed again under the same path lists that path.
        assert_eq!(b.changes[3].paths, paths(&[IMAGE]));
    }

    #[test]
    fn a_revert_inside_the_batch_drops_the_reverted_change() {
        let p = policy();
        let b1 = observe(None, "one", &paths(&[IMAGE]), at("2026-12-07T10:00:00Z"));
        let b2 = observe(
            Some(&b1),
            "two",
            &paths(&[IMAGE, MEMORY]),
            at("2026-12-07T10:10:00Z"),
        );
        let mut back = observe(
            Some(&b2),
            "one",
            &paths(&[IMAGE]),
            at("2026-12-07T10:20:00Z"),
        );
        assert_eq!(back.change_count, 1);
        assert_eq!(back.changes, b1.changes);
        assert_eq!(back.fingerprint, "one");
        // The spec did change: the quiet period counts from the revert.
        assert_eq!(
            release(&mut back, &p, false, at("2026-12-07T10:31:00Z")),
            Err(at("2026-12-07T10:50:00Z"))
        );
    }

    #[test]
    fn approval_releases_at_once() {
        let mut b = observe(None, "aaaa", &paths(&[IMAGE]), at("2026-12-07T10:00:00Z"));
        assert_eq!(
            release(&mut b, &policy(), true, at("2026-12-07T10:00:01Z")),
            Ok(Released::Approved)
        );
        assert_eq!(summary(&b), "1 change, 1 recreation");
    }

    #[test]
    fn the_listed_changes_are_bounded_and_the_count_goes_on() {
        let mut b = observe(None, "f0", &paths(&[IMAGE]), at("2026-12-07T10:00:00Z"));
        for i in 1..100 {
            let now = at("2026-12-07T10:00:00Z")
                .checked_add(SignedDuration::from_secs(i))
                .unwrap();
            let many: Vec<String> = (0..50).map(|j| format!("p{i}.{j}")).collect();
            b = observe(Some(&b), &format!("f{i}"), &many, now);
        }
        assert_eq!(b.change_count, 100);
        assert_eq!(b.changes.len(), batching::MAX_LISTED_CHANGES);
        assert!(
            b.changes
                .iter()
                .all(|c| c.paths.len() <= batching::MAX_LISTED_PATHS)
        );
        assert_eq!(b.changes.last().unwrap().fingerprint, "f99");
    }

    #[test]
    fn spec_and_defaults() {
        let spec = |q: &str, m: Option<&str>| BatchingSpec {
            quiet_period: q.into(),
            max_delay: m.map(Into::into),
        };
        let d = Defaults::default();
        assert_eq!(Batching::of(None, d).unwrap(), None);
        assert_eq!(
            Batching::of(Some(&spec("30m", Some("6h"))), d).unwrap(),
            Some(policy())
        );
        assert_eq!(
            Batching::of(Some(&spec("30m", None)), d).unwrap(),
            Some(policy())
        );
        // Off for this plan whatever the default.
        let on = Defaults::parse("10m", "1h").unwrap();
        assert_eq!(
            Batching::of(None, on).unwrap(),
            Some(Batching {
                quiet_period: Duration::from_secs(600),
                max_delay: Duration::from_secs(3600)
            })
        );
        assert_eq!(Batching::of(Some(&spec("0s", None)), on).unwrap(), None);
        assert_eq!(Defaults::parse("", "6h").unwrap().batching, None);
        assert!(Defaults::parse("soon", "6h").is_err());
        let e = Batching::of(Some(&spec("1h", Some("30m"))), d)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("spec.batching.maxDelay: 30m is less than"),
            "{e}"
        );
        let e = Batching::of(Some(&spec("x", Some("y"))), d)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("spec.batching.quietPeriod") && e.contains("spec.batching.maxDelay"),
            "{e}"
        );
    }
}
