//! `status.waitingFor`: what a plan waits for, as one type whose
//! spellings live here only. The status keeps it a string (the CRD column
//! `WAITING FOR`, read by people and scripts): its `Display` is
//! the one place a phrase is written, so a phrase never drifts between the
//! rule that sets it and the one that compares it with the previous status.

use std::fmt;

use crate::admission::EventReason;
use crate::admission::stall::StallReason;

/// What a plan waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitingFor {
    /// The RayService has no active RayCluster yet.
    FirstCluster,
    /// Admitted: KubeRay has not named the new cluster yet.
    KubeRay,
    /// The new cluster is named, not ready (or not checked against the
    /// admitted change yet).
    NewCluster,
    /// The new cluster is ready; its Serve apps are not.
    ServeApps,
    /// Promoted: KubeRay has not deleted the old cluster and its pods yet.
    OldClusterDeletion,
    /// `rayClusterConfig.suspend: true` is about to suspend the serving
    /// cluster in place.
    Suspension,
    /// The serving cluster is suspended.
    Suspended,
    /// A hold before capacity ([`crate::admission::Hold`]): policy,
    /// approval, window, batch, another field manager's gate.
    Hold(HoldKind),
    /// Kueue would turn the change into a suspension (rule 3b).
    KueueWouldSuspend,
    /// An elastic Kueue job while raygate's Kueue support is off (rule 3c).
    KueueSupportOff,
    /// Kueue has not admitted the re-derived Workload of the new cluster.
    KueueWorkloadPending,
    /// The new cluster does not fit: the short text of the fit
    /// ([`crate::admission::texts::shortfall_text`]).
    Capacity(String),
    /// The transition stalled, for this reason.
    Stalled(StallReason),
    /// Inputs that cannot be used: their Event reasons.
    Errors(Vec<EventReason>),
    /// Another field manager keeps the gate at `value` (`None` when unset).
    GateKeptBy {
        owner: String,
        value: Option<String>,
    },
}

/// The kinds of [`crate::admission::Hold`], as `waitingFor` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind {
    Paused,
    Approval,
    Window,
    Batching,
    GateOverridden,
}

impl WaitingFor {
    /// Whether the previous status waited for this already (its Event was
    /// recorded then).
    pub fn was(&self, previous: Option<&str>) -> bool {
        previous == Some(self.to_string().as_str())
    }
}

impl fmt::Display for WaitingFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phrase = match self {
            WaitingFor::FirstCluster => "first cluster",
            WaitingFor::KubeRay => "KubeRay",
            WaitingFor::NewCluster => "new cluster",
            WaitingFor::ServeApps => "serve apps",
            WaitingFor::OldClusterDeletion => "old cluster deletion",
            WaitingFor::Suspension => "suspension (outage)",
            WaitingFor::Suspended => "suspended",
            WaitingFor::Hold(HoldKind::Paused) => "policy Paused",
            WaitingFor::Hold(HoldKind::Approval) => "approval",
            WaitingFor::Hold(HoldKind::Window) => "maintenance window",
            WaitingFor::Hold(HoldKind::Batching) => "batch",
            WaitingFor::Hold(HoldKind::GateOverridden) => "GateOverridden",
            WaitingFor::KueueWouldSuspend => "KueueWouldSuspend",
            WaitingFor::KueueSupportOff => "KueueSupportOff",
            WaitingFor::KueueWorkloadPending => "KueueWorkloadPending",
            WaitingFor::Capacity(short) => short,
            WaitingFor::Stalled(reason) => reason.as_str(),
            WaitingFor::Errors(reasons) => {
                let names: Vec<&str> = reasons.iter().map(|r| r.as_str()).collect();
                return f.write_str(&names.join(", "));
            }
            WaitingFor::GateKeptBy { owner, value } => {
                let value = value.as_deref().unwrap_or("unset");
                return write!(f, "GateOverridden: {owner} keeps {value}");
            }
        };
        f.write_str(phrase)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Hold;

    /// The phrases are API (the `WAITING FOR` column, `kubectl raygate
    /// queue`): these are the spellings the rules wrote inline before.
    #[test]
    fn phrases_are_spelled_as_before() {
        let cases = [
            (WaitingFor::FirstCluster, "first cluster"),
            (WaitingFor::KubeRay, "KubeRay"),
            (WaitingFor::NewCluster, "new cluster"),
            (WaitingFor::ServeApps, "serve apps"),
            (WaitingFor::OldClusterDeletion, "old cluster deletion"),
            (WaitingFor::Suspension, "suspension (outage)"),
            (WaitingFor::Suspended, "suspended"),
            (WaitingFor::from(&Hold::Paused), "policy Paused"),
            (WaitingFor::Hold(HoldKind::GateOverridden), "GateOverridden"),
            (WaitingFor::KueueWouldSuspend, "KueueWouldSuspend"),
            (WaitingFor::KueueSupportOff, "KueueSupportOff"),
            (WaitingFor::KueueWorkloadPending, "KueueWorkloadPending"),
            (WaitingFor::Stalled(StallReason::Timeout), "Timeout"),
            (
                WaitingFor::Errors(vec![
                    EventReason::InvalidSpec,
                    EventReason::RayServiceUnavailable,
                ]),
                "InvalidSpec, RayServiceUnavailable",
            ),
            (
                WaitingFor::GateKeptBy {
                    owner: "argocd".into(),
                    value: None,
                },
                "GateOverridden: argocd keeps unset",
            ),
        ];
        for (w, phrase) in cases {
            assert_eq!(w.to_string(), phrase);
            assert!(w.was(Some(phrase)));
        }
    }

    /// Each hold is named with the phrase it had before `WaitingFor` (the status keeps it).
    #[test]
    fn holds_are_named_as_before() {
        let holds = [
            (Hold::Paused, "policy Paused"),
            (
                Hold::Window {
                    message: "closed".into(),
                },
                "maintenance window",
            ),
            (
                Hold::GateOverridden {
                    owner: "argocd".into(),
                    value: "None".into(),
                },
                "GateOverridden",
            ),
        ];
        for (h, said) in holds {
            assert_eq!(WaitingFor::from(&h).to_string(), said);
        }
    }
}
