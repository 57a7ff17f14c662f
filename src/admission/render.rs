//! What the rules produce, written out: the status they fill in, its
//! conditions (with their transition times kept), and the texts of
//! messages and capacity columns.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::rules::{REQUEUE_IDLE, REQUEUE_WAITING};
use super::{Decision, EventNote, Gate, Inputs, Outcome};
use crate::capacity::{self, ACCELERATORS, FitReport, ResourceList};
use crate::kuberay::{Release, ReleaseProblem, ReleaseSource};
use crate::quantity::Quantity;
use crate::upgradeplan::{
    CapacityStatus, KubeRayReleaseStatus, Phase, UpgradePlanStatus, condition,
};

/// Carries the new status while rules fill it in.
pub struct Builder<'a> {
    inp: &'a Inputs<'a>,
    pub prev: UpgradePlanStatus,
    pub status: UpgradePlanStatus,
    pub gate: Option<Gate>,
    pub events: Vec<EventNote>,
    pub outcome: Option<Outcome>,
    pub requeue: Duration,
    gate_overridden: bool,
}

impl<'a> Builder<'a> {
    pub fn new(inp: &'a Inputs<'a>) -> Self {
        let prev = inp.prev().cloned().unwrap_or_default();
        let status = UpgradePlanStatus {
            observed_generation: inp.plan.metadata.generation,
            // The RayService whose gate this plan holds from now on.
            ray_service: Some(inp.plan.spec.ray_service_ref.name.clone()),
            // Until the RayService is read again (it may be missing now).
            ray_service_uid: prev.ray_service_uid.clone(),
            effective_priority: inp.settings.as_ref().ok().map(|s| s.priority),
            conditions: prev.conditions.clone(),
            last_transition: prev.last_transition.clone(),
            ..Default::default()
        };
        Builder {
            inp,
            prev,
            status,
            gate: None,
            events: vec![],
            outcome: None,
            requeue: REQUEUE_IDLE,
            gate_overridden: false,
        }
    }

    /// Hold the change in `phase` for a reason other than capacity.
    pub fn hold(&mut self, phase: Phase, short: &str, long: &str, outcome: Outcome) {
        self.status.phase = phase;
        self.waiting(short, long);
        self.outcome = Some(outcome);
    }

    pub fn waiting(&mut self, short: &str, long: &str) {
        self.status.waiting_for = Some(short.to_string());
        self.status.message = Some(long.to_string());
    }

    pub fn event(&mut self, warning: bool, reason: &'static str, note: String) {
        self.events.push(EventNote {
            warning,
            reason,
            note,
        });
    }

    /// An input that cannot be used: reported once per message, the
    /// admission and pending change kept as they were.
    pub fn error(&mut self, reason: &'static str, msg: String, gate: Option<Gate>) {
        self.status.phase = Phase::Error;
        self.status.admitted = self.prev.admitted.clone();
        self.status.pending_change = self.prev.pending_change.clone();
        self.waiting(reason, &msg);
        self.gate = gate;
        self.requeue = REQUEUE_WAITING;
        if self.prev.phase != Phase::Error || self.prev.message.as_deref() != Some(msg.as_str()) {
            self.event(true, reason, msg);
        }
    }

    /// Reports another manager's hold on the gate; its Event comes first,
    /// before those of the rules.
    pub fn gate_overridden(&mut self, owner: &str, value: Option<&str>) {
        self.gate_overridden = true;
        let msg = format!(
            "spec.upgradeStrategy.type is {} and owned by field manager {owner:?}; raygate will not fight it. \
             Remove upgradeStrategy from the source of truth (see the GitOps guide)",
            value.unwrap_or("unset")
        );
        if !self
            .prev
            .conditions
            .iter()
            .any(|c| c.type_ == condition::GATE_OVERRIDDEN && c.status == "True")
        {
            self.events.insert(
                0,
                EventNote {
                    warning: true,
                    reason: "GateOverridden",
                    note: msg.clone(),
                },
            );
        }
        self.condition(
            condition::GATE_OVERRIDDEN,
            true,
            "OwnedByOtherManager",
            &msg,
        );
    }

    /// Records the KubeRay release whose rules apply; a flag that disagrees with the
    /// RayClusters' stamp, or a release raygate does not know, is a False condition
    /// and one Warning Event when it appears.
    pub fn kuberay_release(&mut self, r: &Release) {
        self.status.kube_ray_release = Some(KubeRayReleaseStatus {
            version: r.version.to_string(),
            source: r.source.as_str().to_string(),
        });
        match r.problem() {
            Some((problem, msg)) => {
                let already =
                    self.prev.conditions.iter().any(|c| {
                        c.type_ == condition::KUBERAY_RELEASE && c.reason == problem.as_str()
                    });
                if !already {
                    self.event(true, release_event_reason(problem), msg.clone());
                }
                self.condition(condition::KUBERAY_RELEASE, false, problem.as_str(), &msg);
            }
            None => {
                let reason = match r.source {
                    ReleaseSource::Namespace | ReleaseSource::Cluster => "Stamped",
                    ReleaseSource::Flag => "Flag",
                    ReleaseSource::Default => "Default",
                };
                let msg = format!("{}'s rules apply: {}", r.version, r.describe());
                self.condition(condition::KUBERAY_RELEASE, true, reason, &msg);
            }
        }
    }

    /// Set a condition, keeping `lastTransitionTime` when the status is unchanged.
    pub fn condition(&mut self, type_: &str, ok: bool, reason: &str, message: &str) {
        let status = if ok { "True" } else { "False" };
        let since = self
            .prev
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(self.inp.now));
        let cond = Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            observed_generation: self.inp.plan.metadata.generation,
            last_transition_time: since,
        };
        match self.status.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => *c = cond,
            None => self.status.conditions.push(cond),
        }
    }

    fn has_condition(&self, type_: &str) -> bool {
        self.status.conditions.iter().any(|c| c.type_ == type_)
    }

    /// Settles the conditions the rules did not set and returns the decision.
    pub fn finish(mut self, overridden_by: Option<String>) -> Decision {
        if !self.gate_overridden && self.has_condition(condition::GATE_OVERRIDDEN) {
            self.condition(
                condition::GATE_OVERRIDDEN,
                false,
                "OwnedByRaygate",
                "raygate owns the gate",
            );
        }
        let phase = self.status.phase;
        if phase != Phase::Stalled
            && phase != Phase::Upgrading
            && self.has_condition(condition::STALLED)
        {
            self.condition(
                condition::STALLED,
                false,
                "NotUpgrading",
                "no transition in progress",
            );
        }
        let (ok, reason) = match phase {
            Phase::Error => (false, "Error"),
            Phase::Stalled => (false, "Stalled"),
            _ => (true, "Reconciled"),
        };
        // The condition message must not be empty: the shape requires one.
        let msg = self
            .status
            .message
            .clone()
            .unwrap_or_else(|| "reconciled".into());
        self.condition(condition::READY, ok, reason, &msg);
        self.status.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        Decision {
            status: self.status,
            gate: self.gate,
            events: self.events,
            outcome: self.outcome,
            requeue: self.requeue,
            overridden_by,
        }
    }
}

/// The Event reason of a release problem.
fn release_event_reason(p: ReleaseProblem) -> &'static str {
    match p {
        ReleaseProblem::FlagMismatch => "KubeRayReleaseMismatch",
        ReleaseProblem::UnknownRelease => "UnknownKubeRayRelease",
        ReleaseProblem::NotGateable => "KubeRayNotGateable",
    }
}

/// Sum of `names` in `m`, canonical; `None` when `m` has none of them.
fn sum_of(m: &ResourceList, names: &[&str]) -> Option<String> {
    let mut total: Option<Quantity> = None;
    for n in names {
        if let Some(q) = m.get(*n) {
            total = Some(match total {
                Some(t) => t.checked_add(q).unwrap_or(t),
                None => q.clone(),
            });
        }
    }
    total.map(|q| q.canonical())
}

/// The status numbers, arranged so the printer columns compare: the new
/// cluster's needs, what is free for it, and the difference when short.
pub fn capacity_status(r: &FitReport) -> CapacityStatus {
    let available = available_for_new(r);
    let needs_gpus = sum_of(&r.new_requests, &ACCELERATORS).is_some();
    let short = |names: &[&str], needed: bool| {
        needed.then(|| sum_of(&r.shortfall, names).unwrap_or_else(|| "0".into()))
    };
    CapacityStatus {
        required: capacity::canonical_map(&r.required),
        needed: capacity::canonical_map(&r.new_requests),
        free: capacity::canonical_map(&r.free),
        available: capacity::canonical_map(&available),
        reserved: capacity::canonical_map(&r.reserved),
        shortfall: capacity::canonical_map(&r.shortfall),
        gpus_needed: sum_of(&r.new_requests, &ACCELERATORS),
        gpus_free: sum_of(&available, &ACCELERATORS).or_else(|| Some("0".into())),
        gpus_short: short(&ACCELERATORS, needs_gpus),
        gpus_peak: sum_of(&r.required, &ACCELERATORS),
        cpu_needed: sum_of(&r.new_requests, &[capacity::CPU]),
        cpu_free: sum_of(&available, &[capacity::CPU]),
        cpu_short: short(&[capacity::CPU], r.new_requests.contains_key(capacity::CPU)),
        memory_needed: sum_of(&r.new_requests, &[capacity::MEMORY]),
        memory_free: sum_of(&available, &[capacity::MEMORY]),
        memory_short: short(
            &[capacity::MEMORY],
            r.new_requests.contains_key(capacity::MEMORY),
        ),
        unplaced: r
            .unplaced
            .iter()
            .take(10)
            .map(|u| format!("{}: {}", u.pod, u.reason))
            .collect(),
    }
}

/// Free capacity left for the new cluster once reservations and headroom are
/// taken, per resource it requests (and every accelerator, so the GPU column
/// shows what is free even when none is requested): `free − reserved −
/// headroom`, never below zero. The fit's shortfall is `new − this`.
fn available_for_new(r: &FitReport) -> ResourceList {
    let taken = capacity::sum(&r.reserved, &r.headroom);
    let left = capacity::sub_floor0(&r.free, &taken);
    left.into_iter()
        .filter(|(k, _)| r.new_requests.contains_key(k) || ACCELERATORS.contains(&k.as_str()))
        .collect()
}

/// (`short for the column`, `long for message and events`).
pub fn shortfall_text(r: &FitReport) -> (String, String) {
    if r.shortfall.is_empty() {
        let reason = r
            .unplaced
            .first()
            .map(|u| u.reason.clone())
            .unwrap_or_default();
        return (
            "capacity (fragmented)".to_string(),
            format!(
                "enough free capacity in total but {} pods cannot be placed on any single node: {reason}",
                r.unplaced.len()
            ),
        );
    }
    let short = format!("capacity: {}", resources_text(&r.shortfall));
    let free_of_needed: ResourceList = r
        .free
        .iter()
        .filter(|(k, _)| r.new_requests.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let long = format!(
        "new cluster needs {} but only {} is free (reserved by other upgrades: {}); short by {}",
        resources_text(&r.new_requests),
        resources_text(&free_of_needed),
        if r.reserved.is_empty() {
            "none".to_string()
        } else {
            resources_text(&r.reserved)
        },
        resources_text(&r.shortfall)
    );
    (short, long)
}

pub fn resources_text(m: &ResourceList) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {}", v.canonical()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How to approve a change under `policy: Manual`.
pub fn approval_hint(plan: &str, fingerprint: &str) -> String {
    format!(
        "policy Manual: approve with `kubectl raygate approve {plan} --fingerprint {fingerprint}` \
         (or kubectl patch upgradeplan {plan} --type merge -p '{{\"spec\":{{\"approve\":\"{fingerprint}\"}}}}')"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::Unplaced;
    use crate::capacity::tests::rl;

    fn report() -> FitReport {
        FitReport {
            fits: false,
            required: ResourceList::new(),
            new_requests: rl(&[("nvidia.com/gpu", "8"), ("amd.com/gpu", "2"), ("cpu", "4")]),
            old_requests: ResourceList::new(),
            reserved: rl(&[("nvidia.com/gpu", "2")]),
            headroom: ResourceList::new(),
            allocatable: ResourceList::new(),
            free: rl(&[("nvidia.com/gpu", "6"), ("cpu", "64"), ("memory", "1Ti")]),
            shortfall: rl(&[("nvidia.com/gpu", "4"), ("amd.com/gpu", "2")]),
            unplaced: vec![],
            placements: Default::default(),
            skipped_nodes: vec![],
        }
    }

    #[test]
    fn gpu_columns_add_up_every_accelerator() {
        let c = capacity_status(&report());
        assert_eq!(c.gpus_needed.as_deref(), Some("10"));
        assert_eq!(c.gpus_free.as_deref(), Some("4"), "6 free − 2 reserved");
        assert_eq!(c.gpus_short.as_deref(), Some("6"));
        assert_eq!(c.cpu_short.as_deref(), Some("0"));
        assert_eq!(c.memory_needed, None);
        assert!(!c.available.contains_key("memory"), "not requested");
    }

    #[test]
    fn shortfall_reads_as_needs_free_reserved_short() {
        let (short, long) = shortfall_text(&report());
        assert_eq!(short, "capacity: amd.com/gpu 2, nvidia.com/gpu 4");
        assert_eq!(
            long,
            "new cluster needs amd.com/gpu 2, cpu 4, nvidia.com/gpu 8 but only cpu 64, nvidia.com/gpu 6 \
             is free (reserved by other upgrades: nvidia.com/gpu 2); short by amd.com/gpu 2, nvidia.com/gpu 4"
        );
        let fragmented = FitReport {
            shortfall: ResourceList::new(),
            unplaced: vec![Unplaced {
                pod: "w-0".into(),
                reason: "no node has 16 GPUs".into(),
                reserved: false,
            }],
            ..report()
        };
        assert_eq!(shortfall_text(&fragmented).0, "capacity (fragmented)");
    }
}
