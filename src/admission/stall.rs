//! Why a running transition is not finishing.
//!
//! A NewCluster transition stalls in three ways users meet in practice: the
//! new pods cannot be scheduled, the new cluster is up but its Serve apps
//! never become healthy, or it simply takes longer than the plan allows.
//! The first two are reported as soon as they are seen; the last one after
//! `stallAfter`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::observed::ObservedPod;

use crate::upgradeplan::condition::Reason;

/// Serve application states that will not recover on their own.
const FAILED_APP_STATES: [&str; 2] = ["DEPLOY_FAILED", "UNHEALTHY"];
/// Serve application states that count as done for the promotion.
const HEALTHY_APP_STATES: [&str; 2] = ["RUNNING", "HEALTHY"];

/// Why a transition stalled: the `Stalled` condition's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallReason {
    /// New pods the scheduler cannot place.
    Unschedulable,
    /// Serve apps failed, or not healthy after `stallAfter`.
    ServeNotHealthy,
    /// Longer than `stallAfter` for any other reason.
    Timeout,
    /// Longer than `stallAfter` with the new cluster suspended because Kueue
    /// has not admitted the RayService's re-derived Workload.
    KueueWorkloadPending,
}

impl StallReason {
    pub fn as_str(self) -> &'static str {
        self.condition_reason().as_str()
    }

    /// The `Stalled` condition's reason.
    pub fn condition_reason(self) -> Reason {
        match self {
            StallReason::Unschedulable => Reason::Unschedulable,
            StallReason::ServeNotHealthy => Reason::ServeNotHealthy,
            StallReason::Timeout => Reason::Timeout,
            StallReason::KueueWorkloadPending => Reason::KueueWorkloadPending,
        }
    }
}

impl std::fmt::Display for StallReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    pub reason: StallReason,
    pub message: String,
    /// Pods of the new cluster the scheduler reported unschedulable.
    pub unschedulable_pods: u32,
}

/// How long a transition has gone without finishing, as `stallAfter` is
/// measured against: a NewCluster transition from its admission, an
/// incremental one from its last step (it may take long as a whole, but a
/// step that does not move is stuck).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elapsed {
    /// Since the transition was admitted.
    Transition(Duration),
    /// Since the incremental upgrade last moved a step.
    SinceStep(Duration),
}

impl Elapsed {
    pub fn duration(self) -> Duration {
        match self {
            Elapsed::Transition(d) | Elapsed::SinceStep(d) => d,
        }
    }
}

/// `transition running for 31m`, `no incremental step for 15m`.
impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            Elapsed::Transition(_) => "transition running for",
            Elapsed::SinceStep(_) => "no incremental step for",
        };
        write!(f, "{what} {}", human_duration(self.duration()))
    }
}

/// Diagnose the new cluster of a transition. `apps` is the pending service's
/// `applicationStatuses` (app name → status string).
pub fn diagnose<P: ObservedPod + ?Sized>(
    new_cluster_pods: &[&P],
    apps: &BTreeMap<String, String>,
    cluster_ready: bool,
    elapsed: Elapsed,
    stall_after: Duration,
) -> Option<Stall> {
    let unschedulable: Vec<&str> = new_cluster_pods
        .iter()
        .filter_map(|p| p.unschedulable_message())
        .collect();
    if !unschedulable.is_empty() {
        return Some(Stall {
            reason: StallReason::Unschedulable,
            message: format!(
                "{} {} {}",
                unschedulable.len(),
                if unschedulable.len() == 1 {
                    "pod"
                } else {
                    "pods"
                },
                summarize_scheduler_message(unschedulable[0])
            ),
            unschedulable_pods: unschedulable.len() as u32,
        });
    }
    let failed: Vec<String> = apps
        .iter()
        .filter(|(_, s)| FAILED_APP_STATES.contains(&s.as_str()))
        .map(|(name, s)| format!("app {name} {s}"))
        .collect();
    if !failed.is_empty() {
        return Some(Stall {
            reason: StallReason::ServeNotHealthy,
            message: failed.join(", "),
            unschedulable_pods: 0,
        });
    }
    if elapsed.duration() > stall_after {
        let waiting_apps: Vec<String> = apps
            .iter()
            .filter(|(_, s)| !HEALTHY_APP_STATES.contains(&s.as_str()))
            .map(|(name, s)| format!("app {name} {s}"))
            .collect();
        let (reason, detail) = if cluster_ready && !waiting_apps.is_empty() {
            (StallReason::ServeNotHealthy, waiting_apps.join(", "))
        } else if cluster_ready {
            (
                StallReason::Timeout,
                "new cluster is ready but not yet promoted".to_string(),
            )
        } else {
            (StallReason::Timeout, "new cluster is not ready".to_string())
        };
        return Some(Stall {
            reason,
            message: format!(
                "{detail}; {elapsed} (stallAfter {})",
                human_duration(stall_after)
            ),
            unschedulable_pods: 0,
        });
    }
    None
}

/// How many of these pods the scheduler reported unschedulable.
pub fn count_unschedulable<P: ObservedPod + ?Sized>(pods: &[&P]) -> u32 {
    pods.iter()
        .filter(|p| p.unschedulable_message().is_some())
        .count() as u32
}

/// `0/3 nodes are available: 3 Insufficient nvidia.com/gpu.` → `Insufficient nvidia.com/gpu`.
fn summarize_scheduler_message(msg: &str) -> String {
    let reasons = msg.split_once("available: ").map_or(msg, |(_, r)| r);
    let first = reasons.split(',').next().unwrap_or(reasons).trim();
    let first = first.trim_end_matches('.');
    // Drop the leading node count ("3 Insufficient ..."), it describes nodes, not pods.
    match first.split_once(' ') {
        Some((n, rest)) if n.chars().all(|c| c.is_ascii_digit()) => rest.to_string(),
        _ => first.to_string(),
    }
}

/// `5400s` → `1h30m`; seconds shown only under an hour.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, sec) = (s / 3600, (s % 3600) / 60, s % 60);
    match (h, m, sec) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, _) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pending_pod(msg: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "w"},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg
            }]}
        }))
        .unwrap()
    }

    fn apps(list: &[(&str, &str)]) -> BTreeMap<String, String> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    const MIN: Elapsed = Elapsed::Transition(Duration::from_secs(60));
    const STALL_AFTER: Duration = Duration::from_secs(30 * 60);

    fn minutes(m: u64) -> Elapsed {
        Elapsed::Transition(Duration::from_secs(m * 60))
    }

    #[test]
    fn unschedulable_pods_are_reported_at_once() {
        let p = pending_pod("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.");
        let pods = vec![&p, &p, &p, &p];
        let s = diagnose(&pods, &apps(&[]), false, MIN, STALL_AFTER).unwrap();
        assert_eq!(s.reason, StallReason::Unschedulable);
        assert_eq!(s.message, "4 pods Insufficient nvidia.com/gpu");
        assert_eq!(s.unschedulable_pods, 4);
    }

    #[test]
    fn failed_serve_app_is_reported_at_once() {
        let s = diagnose::<Pod>(
            &[],
            &apps(&[("llm", "DEPLOY_FAILED"), ("ok", "RUNNING")]),
            true,
            MIN,
            STALL_AFTER,
        )
        .unwrap();
        assert_eq!(
            (s.reason, s.message.as_str()),
            (StallReason::ServeNotHealthy, "app llm DEPLOY_FAILED")
        );
    }

    #[test]
    fn slow_transition_times_out_after_stall_after() {
        assert_eq!(
            diagnose::<Pod>(
                &[],
                &apps(&[("llm", "DEPLOYING")]),
                true,
                minutes(29),
                STALL_AFTER
            ),
            None
        );
        let s = diagnose::<Pod>(
            &[],
            &apps(&[("llm", "DEPLOYING")]),
            true,
            minutes(31),
            STALL_AFTER,
        )
        .unwrap();
        assert_eq!(s.reason, StallReason::ServeNotHealthy);
        assert_eq!(
            s.message,
            "app llm DEPLOYING; transition running for 31m (stallAfter 30m)"
        );
        let s = diagnose::<Pod>(&[], &apps(&[]), false, minutes(31), STALL_AFTER).unwrap();
        assert_eq!(s.reason, StallReason::Timeout);
    }

    #[test]
    fn bound_pods_are_not_unschedulable() {
        let mut p = pending_pod("0/1 nodes are available: 1 Insufficient cpu.");
        p.spec.as_mut().unwrap().node_name = Some("n1".into());
        assert_eq!(diagnose(&[&p], &apps(&[]), false, MIN, STALL_AFTER), None);
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_duration(Duration::from_secs(45)), "45s");
        assert_eq!(human_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(human_duration(Duration::from_secs(1800)), "30m");
        assert_eq!(human_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(human_duration(Duration::from_secs(7200)), "2h");
    }

    #[test]
    fn an_incremental_upgrade_stalls_on_a_step_that_does_not_move() {
        let s = diagnose::<Pod>(
            &[],
            &apps(&[]),
            false,
            Elapsed::SinceStep(Duration::from_secs(15 * 60)),
            Duration::from_secs(10 * 60),
        )
        .unwrap();
        assert_eq!(
            s.message,
            "new cluster is not ready; no incremental step for 15m (stallAfter 10m)"
        );
    }
}
