//! The types of `status.conditions`, spelled once for the decision that sets
//! them and the controller that reads them back.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The plan was reconciled without error and nothing is stalled.
pub const READY: &str = "Ready";
/// The pending change's new cluster fits (or none is needed).
pub const CAPACITY_AVAILABLE: &str = "CapacityAvailable";
/// raygate let the pending change through.
pub const UPGRADE_ADMITTED: &str = "UpgradeAdmitted";
/// The running transition is not finishing.
pub const STALLED: &str = "Stalled";
/// Another field manager owns the gate field.
pub const GATE_OVERRIDDEN: &str = "GateOverridden";
/// The KubeRay release raygate applies is the one running: False when
/// `--kuberay-version` disagrees with the RayClusters' stamp, the stamp is a
/// release raygate does not know, or the release cannot be gated.
pub const KUBERAY_RELEASE: &str = "KubeRayRelease";
/// raygate asked the node autoscaler for the new cluster (`spec.capacity`).
pub const CAPACITY_REQUESTED: &str = "CapacityRequested";
/// Every resource the headroom names and the new cluster requests is
/// offered by a schedulable node: False when one is not (a typo such as
/// `gpu` for `nvidia.com/gpu` would hold the upgrade forever).
pub const RESOURCES_OFFERED: &str = "ResourcesOffered";
/// `spec.approve` names the pending change (or the admitted or last one):
/// False when it matches none of them. Absent while `spec.approve` is unset.
pub const APPROVAL_MATCHED: &str = "ApprovalMatched";
/// The serving cluster is suspended or being suspended
/// (`rayClusterConfig.suspend`). Absent while it is not.
pub const SERVICE_SUSPENDED: &str = "ServiceSuspended";
/// Kueue manages the RayService: its ClusterQueue has the quota for the
/// new cluster. Absent for a RayService Kueue does not manage.
pub const QUOTA_AVAILABLE: &str = "QuotaAvailable";

/// `metav1.Condition.status`: raygate only ever writes `True` or `False`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
}

impl Status {
    pub fn of(ok: bool) -> Status {
        if ok { Status::True } else { Status::False }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
        }
    }
}

/// The reasons of the plan's conditions. They are API (`kubectl wait`,
/// alerts and scripts match them): [`Reason::as_str`] must never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    // Ready
    Reconciled,
    Error,
    Stalled,
    /// Another plan governs the RayService.
    Conflict,
    // UpgradeAdmitted, CapacityAvailable, Stalled
    NoPendingChange,
    Pending,
    GateOverridden,
    Admitted,
    Completed,
    Fits,
    InsufficientCapacity,
    Progressing,
    NotUpgrading,
    /// Stalled: see `admission::stall::StallReason`.
    Unschedulable,
    ServeNotHealthy,
    Timeout,
    // GateOverridden
    OwnedByOtherManager,
    OwnedByRaygate,
    // KubeRayRelease: where the release was read, or its problem
    // (`kuberay::ReleaseProblem`).
    Stamped,
    Flag,
    Default,
    FlagMismatch,
    UnknownRelease,
    NotGateable,
    // ResourcesOffered
    Offered,
    NotOffered,
    // ApprovalMatched
    Matched,
    NoSuchChange,
    // CapacityRequested
    Queued,
    Requested,
    NotDelivered,
    Failed,
    // ServiceSuspended
    /// `rayClusterConfig.suspend: true` is being applied in place.
    Suspending,
    /// The active cluster is suspended.
    ClusterSuspended,
    // UpgradeAdmitted: Kueue would suspend the change.
    KueueWouldSuspend,
    // QuotaAvailable
    QuotaFits,
    InsufficientQuota,
    /// Quota known, but the reservation Kueue must admit is not yet.
    QuotaPending,
    // Stalled: Kueue has not admitted the RayService's re-derived
    // Workload, so the new cluster stays suspended.
    KueueWorkloadPending,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Reconciled => "Reconciled",
            Reason::Error => "Error",
            Reason::Stalled => "Stalled",
            Reason::Conflict => "Conflict",
            Reason::NoPendingChange => "NoPendingChange",
            Reason::Pending => "Pending",
            Reason::GateOverridden => "GateOverridden",
            Reason::Admitted => "Admitted",
            Reason::Completed => "Completed",
            Reason::Fits => "Fits",
            Reason::InsufficientCapacity => "InsufficientCapacity",
            Reason::Progressing => "Progressing",
            Reason::NotUpgrading => "NotUpgrading",
            Reason::Unschedulable => "Unschedulable",
            Reason::ServeNotHealthy => "ServeNotHealthy",
            Reason::Timeout => "Timeout",
            Reason::OwnedByOtherManager => "OwnedByOtherManager",
            Reason::OwnedByRaygate => "OwnedByRaygate",
            Reason::Stamped => "Stamped",
            Reason::Flag => "Flag",
            Reason::Default => "Default",
            Reason::FlagMismatch => "FlagMismatch",
            Reason::UnknownRelease => "UnknownRelease",
            Reason::NotGateable => "NotGateable",
            Reason::Offered => "Offered",
            Reason::NotOffered => "NotOffered",
            Reason::Matched => "Matched",
            Reason::NoSuchChange => "NoSuchChange",
            Reason::Queued => "Queued",
            Reason::Requested => "Requested",
            Reason::NotDelivered => "NotDelivered",
            Reason::Failed => "Failed",
            Reason::Suspending => "Suspending",
            Reason::ClusterSuspended => "ClusterSuspended",
            Reason::KueueWouldSuspend => "KueueWouldSuspend",
            Reason::QuotaFits => "QuotaFits",
            Reason::InsufficientQuota => "InsufficientQuota",
            Reason::QuotaPending => "QuotaPending",
            Reason::KueueWorkloadPending => "KueueWorkloadPending",
        }
    }
}

/// Whether `c` is a condition of `type_` with `status`.
pub fn is(c: &Condition, type_: &str, status: Status) -> bool {
    c.type_ == type_ && c.status == status.as_str()
}

/// One condition in the `metav1.Condition` shape. `lastTransitionTime`
/// is kept from `prev` while the status of that type holds, else `now`:
/// a condition that is only rewritten has not transitioned.
pub fn make(
    prev: &[Condition],
    type_: &str,
    status: Status,
    reason: Reason,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let since = prev
        .iter()
        .find(|c| is(c, type_, status))
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: type_.to_string(),
        status: status.as_str().to_string(),
        reason: reason.as_str().to_string(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// Puts `c` in place of the condition of its type, or adds it.
pub fn set(conditions: &mut Vec<Condition>, c: Condition) {
    match conditions.iter_mut().find(|x| x.type_ == c.type_) {
        Some(x) => *x = c,
        None => conditions.push(c),
    }
}

#[cfg(test)]
mod tests {
    use crate::upgradeplan::condition;
    use jiff::Timestamp;

    /// A condition rewritten with the same status keeps its transition time;
    /// a flip takes `now`.
    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        use condition::{Reason, Status};
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:05:00Z".parse().unwrap();
        let mut conds = vec![];
        let c = condition::make(
            &conds,
            condition::READY,
            Status::True,
            Reason::Reconciled,
            "ok".into(),
            Some(3),
            t0,
        );
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.observed_generation),
            ("True", "Reconciled", Some(3))
        );
        condition::set(&mut conds, c);
        let same = condition::make(
            &conds,
            condition::READY,
            Status::True,
            Reason::Reconciled,
            "still ok".into(),
            Some(4),
            t1,
        );
        assert_eq!(same.last_transition_time.0, t0);
        let flip = condition::make(
            &conds,
            condition::READY,
            Status::False,
            Reason::Error,
            "bad".into(),
            Some(4),
            t1,
        );
        assert_eq!(flip.last_transition_time.0, t1);
        condition::set(&mut conds, flip);
        assert_eq!(conds.len(), 1);
        assert!(condition::is(&conds[0], condition::READY, Status::False));
    }
}
