//! What the rules produce, written out: the status they fill in, its
//! conditions (with their transition times kept), and the texts of
//! messages and capacity columns.

use std::fmt::Display;
use std::time::Duration;

use super::rules::ruling::{self, Cond, Ruling};
use super::rules::waiting::WaitingFor;
use super::{
    Decision, EventNote, EventReason, Gate, Inputs, Outcome, REQUEUE_IDLE, REQUEUE_WAITING,
};
use crate::capacity::{self, ACCELERATORS, FitReport, ResourceList, sum_of};
use crate::kuberay::incremental::Options;
use crate::kuberay::{Release, ReleaseProblem, ReleaseSource};
use crate::quantity::Quantity;
use crate::upgradeplan::{
    CapacityStatus, IncrementalStatus, KubeRayReleaseStatus, Phase, UpgradePlanStatus, condition,
};
use condition::{Reason, Status};

/// Carries the new status while rules fill it in.
pub struct Builder<'a> {
    inp: &'a Inputs<'a>,
    pub prev: UpgradePlanStatus,
    pub status: UpgradePlanStatus,
    pub gate: Option<Gate>,
    pub events: Vec<EventNote>,
    pub outcome: Option<Outcome>,
    pub requeue: Duration,
    pub observed: super::Observations,
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
            observed: Default::default(),
            gate_overridden: false,
        }
    }

    /// Hold the change in `phase` for a reason other than capacity.
    pub fn hold(&mut self, phase: Phase, short: &str, long: &str, outcome: Outcome) {
        self.status.phase = phase;
        self.waiting(short, long);
        self.outcome = Some(outcome);
    }

    /// `status.waitingFor` (a [`WaitingFor`] where the rules name it) and
    /// `status.message`.
    pub fn waiting(&mut self, short: impl Display, long: &str) {
        self.status.waiting_for = Some(short.to_string());
        self.status.message = Some(long.to_string());
    }

    /// Writes out what a rule decided ([`Ruling`]).
    pub fn rule(&mut self, r: Ruling) {
        self.status.phase = r.phase;
        self.status.waiting_for = r.waiting_for.map(|w| w.to_string());
        self.status.message = Some(r.message);
        self.conditions(r.conditions);
        if let Some(o) = r.outcome {
            self.outcome = Some(o);
        }
        if let Some(g) = r.gate {
            self.gate = Some(g);
        }
        if let Some(q) = r.requeue {
            self.requeue = q;
        }
        self.events.extend(r.event);
    }

    /// Sets (or drops) these conditions, in order.
    pub fn conditions(&mut self, conditions: impl IntoIterator<Item = Cond>) {
        for c in conditions {
            match c {
                Cond::Set {
                    type_,
                    status,
                    reason,
                    message,
                } => self.condition(type_, status, reason, &message),
                Cond::Drop(type_) => self.drop_condition(type_),
            }
        }
    }

    /// An Event about the plan as a whole (no particular change).
    pub fn event(&mut self, warning: bool, reason: EventReason, note: String) {
        self.events.push(ruling::plan_event(warning, reason, note));
    }

    /// An Event about the change `fingerprint`: kept apart from the Events
    /// of every other change (see [`EventNote::change`]).
    pub fn change_event(
        &mut self,
        warning: bool,
        reason: EventReason,
        fingerprint: &str,
        note: String,
    ) {
        self.events
            .push(ruling::change_event(warning, reason, fingerprint, note));
    }

    /// An input that cannot be used: see [`Builder::errors`].
    pub fn error(&mut self, reason: EventReason, msg: String, gate: Option<Gate>) {
        self.errors(&[(reason, msg)], gate)
    }

    /// Inputs that cannot be used, every one of them reported at once (the
    /// column lists their reasons, the message each one's text), each with
    /// one Event when it appears; the admission and pending change are kept
    /// as they were.
    pub fn errors(&mut self, problems: &[(EventReason, String)], gate: Option<Gate>) {
        self.status.phase = Phase::Error;
        self.status.admitted = self.prev.admitted.clone();
        self.status.pending_change = self.prev.pending_change.clone();
        self.status.batch = self.prev.batch.clone();
        let short = WaitingFor::Errors(problems.iter().map(|(reason, _)| *reason).collect());
        let long = match problems {
            [(_, msg)] => msg.clone(),
            _ => problems
                .iter()
                .map(|(reason, msg)| format!("{reason}: {msg}"))
                .collect::<Vec<_>>()
                .join("; "),
        };
        self.waiting(short, &long);
        self.gate = gate;
        self.requeue = REQUEUE_WAITING;
        let reported = (self.prev.phase == Phase::Error)
            .then(|| self.prev.message.clone())
            .flatten()
            .unwrap_or_default();
        for (reason, msg) in problems {
            if !reported.contains(msg.as_str()) {
                self.event(true, *reason, msg.clone());
            }
        }
    }

    /// Reports another manager's hold on the gate; its Event comes first,
    /// before those of the rules. `true` when the hold is new (no
    /// `GateOverridden=True` before).
    pub fn gate_overridden(&mut self, owner: &str, value: Option<&str>) -> bool {
        self.gate_overridden = true;
        let msg = format!(
            "spec.upgradeStrategy.type is {} and owned by field manager {owner:?}; raygate will not fight it. \
             Remove upgradeStrategy from the source of truth (see the GitOps guide)",
            value.unwrap_or("unset")
        );
        let new = !self
            .prev
            .conditions
            .iter()
            .any(|c| condition::is(c, condition::GATE_OVERRIDDEN, Status::True));
        if new {
            self.events.insert(
                0,
                EventNote {
                    warning: true,
                    reason: EventReason::GateOverridden,
                    note: msg.clone(),
                    change: None,
                },
            );
        }
        self.condition(
            condition::GATE_OVERRIDDEN,
            Status::True,
            Reason::OwnedByOtherManager,
            &msg,
        );
        // In the WAITING FOR column of `kubectl get upgradeplans`: while
        // another manager keeps the gate, raygate's own reason is moot.
        let kept = WaitingFor::GateKeptBy {
            owner: owner.to_string(),
            value: value.map(str::to_string),
        };
        self.status.waiting_for = Some(kept.to_string());
        new
    }

    /// Records the KubeRay release whose rules apply; a flag that disagrees with the
    /// RayClusters' stamp, or a release raygate does not know, is a False condition
    /// and one Warning Event when it appears.
    pub fn kuberay_release(&mut self, r: &Release) {
        self.status.kube_ray_release = Some(KubeRayReleaseStatus {
            version: r.version.to_string(),
            source: r.source,
        });
        match r.problem() {
            Some((problem, msg)) => {
                let already = self.prev.conditions.iter().any(|c| {
                    c.type_ == condition::KUBERAY_RELEASE
                        && c.reason == release_reason(problem).as_str()
                });
                if !already {
                    self.event(true, problem.into(), msg.clone());
                }
                self.condition(
                    condition::KUBERAY_RELEASE,
                    Status::False,
                    release_reason(problem),
                    &msg,
                );
            }
            None => {
                let reason = match r.source {
                    ReleaseSource::Namespace | ReleaseSource::Cluster => Reason::Stamped,
                    ReleaseSource::Flag => Reason::Flag,
                    ReleaseSource::Default => Reason::Default,
                };
                let msg = format!("{}'s rules apply: {}", r.version, r.describe());
                self.condition(condition::KUBERAY_RELEASE, Status::True, reason, &msg);
            }
        }
    }

    /// Set a condition, keeping `lastTransitionTime` when the status is unchanged.
    pub fn condition(&mut self, type_: &str, status: Status, reason: Reason, message: &str) {
        let cond = condition::make(
            &self.prev.conditions,
            type_,
            status,
            reason,
            message.to_string(),
            self.inp.plan.metadata.generation,
            self.inp.now,
        );
        condition::set(&mut self.status.conditions, cond);
    }

    /// Warns about resource names of the headroom and of the new cluster's
    /// requests that no schedulable node offers (`allocatable` absent or 0):
    /// such a name can never be satisfied, so a typo (`gpu`) would hold the
    /// upgrade forever. Condition `ResourcesOffered` and one Warning Event per
    /// set of names; the decision itself is unchanged.
    pub fn resources_offered(&mut self, headroom: &ResourceList, r: &FitReport) {
        let offered = |k: &str| r.allocatable.get(k).is_some_and(|q| !q.is_zero());
        let in_headroom: Vec<&str> = headroom
            .keys()
            .map(String::as_str)
            .filter(|k| !offered(k))
            .collect();
        let requested: Vec<&str> = r
            .new_requests
            .keys()
            .map(String::as_str)
            .filter(|k| !offered(k))
            .collect();
        if in_headroom.is_empty() && requested.is_empty() {
            self.condition(
                condition::RESOURCES_OFFERED,
                Status::True,
                Reason::Offered,
                "every resource of spec.headroom and of the new cluster is offered by a schedulable node",
            );
            return;
        }
        let mut problems = vec![];
        if !in_headroom.is_empty() {
            problems.push(format!(
                "spec.headroom names {} that no schedulable node offers, so that headroom can never be kept",
                in_headroom.join(", ")
            ));
        }
        if !requested.is_empty() {
            let updating = if r.dra_pools_updating.is_empty() {
                String::new()
            } else {
                format!(
                    ", or once the DRA pool being republished on node {} is complete",
                    r.dra_pools_updating.join(", node ")
                )
            };
            problems.push(format!(
                "the new cluster requests {} that no schedulable node offers: it fits only once such a \
                 node joins (a node autoscaler may add one){updating}",
                requested.join(", ")
            ));
        }
        let nodes_offer: Vec<&str> = r
            .allocatable
            .iter()
            .filter(|(_, q)| !q.is_zero())
            .map(|(k, _)| k.as_str())
            .collect();
        let msg = format!(
            "{} (schedulable nodes offer: {})",
            problems.join("; "),
            if nodes_offer.is_empty() {
                "nothing".to_string()
            } else {
                nodes_offer.join(", ")
            }
        );
        self.warn_once(
            condition::RESOURCES_OFFERED,
            Reason::NotOffered,
            EventReason::ResourceNotOffered,
            msg,
        );
    }

    /// A problem that holds nothing but must not go unsaid: condition
    /// `type_` False with `msg`, and one Warning Event `event` while the
    /// condition did not already say the same.
    fn warn_once(&mut self, type_: &str, reason: Reason, event: EventReason, msg: String) {
        let already = self
            .prev
            .conditions
            .iter()
            .any(|c| condition::is(c, type_, Status::False) && c.message == msg);
        self.condition(type_, Status::False, reason, &msg);
        if !already {
            self.event(true, event, msg);
        }
    }

    /// Drops a condition (when what it reports on is gone).
    pub fn drop_condition(&mut self, type_: &str) {
        self.status.conditions.retain(|c| c.type_ != type_);
    }

    /// `spec.approve` that names no change raygate knows of for this plan
    /// (pending, admitted, or the last transition's) is reported, not
    /// silently ignored: a mistyped or outdated fingerprint admits nothing.
    fn approval_matched(&mut self) {
        // Under `policy: Auto` `spec.approve` is ignored (docs/upgradeplan.md): a
        // fingerprint left from a Manual approval is no mistake to warn about.
        let Some(approve) = self
            .inp
            .plan
            .spec
            .approve
            .clone()
            .filter(|_| self.inp.plan.spec.policy != crate::upgradeplan::Policy::Auto)
        else {
            self.drop_condition(condition::APPROVAL_MATCHED);
            return;
        };
        let pending = self
            .status
            .pending_change
            .as_ref()
            .map(|p| p.fingerprint.as_str());
        let known = [
            pending,
            self.status
                .admitted
                .as_ref()
                .map(|a| a.fingerprint.as_str()),
            self.status
                .last_transition
                .as_ref()
                .map(|t| t.fingerprint.as_str()),
        ];
        if known.contains(&Some(approve.as_str())) {
            self.condition(
                condition::APPROVAL_MATCHED,
                Status::True,
                Reason::Matched,
                &format!("spec.approve names change {approve}"),
            );
            return;
        }
        let msg = match pending {
            Some(fp) => format!(
                "spec.approve {approve:?} matches no change of this plan: the pending change is {fp} \
                 (kubectl raygate approve to approve it)"
            ),
            None => format!(
                "spec.approve {approve:?} matches no change of this plan: no change is pending"
            ),
        };
        self.warn_once(
            condition::APPROVAL_MATCHED,
            Reason::NoSuchChange,
            EventReason::ApprovalUnmatched,
            msg,
        );
    }

    fn has_condition(&self, type_: &str) -> bool {
        self.status.conditions.iter().any(|c| c.type_ == type_)
    }

    /// Settles the conditions the rules did not set and returns the decision.
    pub fn finish(mut self, overridden_by: Option<String>) -> Decision {
        if !self.gate_overridden && self.has_condition(condition::GATE_OVERRIDDEN) {
            self.condition(
                condition::GATE_OVERRIDDEN,
                Status::False,
                Reason::OwnedByRaygate,
                "raygate owns the gate",
            );
        }
        if self.inp.settings.is_ok() && self.inp.service.is_ok() {
            self.approval_matched();
        }
        let phase = self.status.phase;
        if phase != Phase::Stalled
            && phase != Phase::Upgrading
            && self.has_condition(condition::STALLED)
        {
            self.condition(
                condition::STALLED,
                Status::False,
                Reason::NotUpgrading,
                "no transition in progress",
            );
        }
        let (status, reason) = match phase {
            Phase::Error => (Status::False, Reason::Error),
            Phase::Stalled => (Status::False, Reason::Stalled),
            // Not an error of raygate's, but nothing serves: never `True`.
            Phase::Suspended => (Status::False, Reason::ClusterSuspended),
            _ => (Status::True, Reason::Reconciled),
        };
        // The condition message must not be empty: the shape requires one.
        let msg = self
            .status
            .message
            .clone()
            .unwrap_or_else(|| "reconciled".into());
        self.condition(condition::READY, status, reason, &msg);
        self.status.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        Decision {
            status: self.status,
            gate: self.gate,
            events: self.events,
            outcome: self.outcome,
            requeue: self.requeue,
            overridden_by,
            observed: self.observed,
            capacity_objects: Default::default(),
        }
    }
}

/// The `KubeRayRelease` condition's reason for a release problem: the
/// problem's own name.
fn release_reason(p: ReleaseProblem) -> Reason {
    match p {
        ReleaseProblem::FlagMismatch => Reason::FlagMismatch,
        ReleaseProblem::UnknownRelease => Reason::UnknownRelease,
        ReleaseProblem::NotGateable => Reason::NotGateable,
    }
}

/// NEEDED, FREE, SHORT of one resource for one row of `kubectl get
/// upgradeplans -o wide`, in one readable unit (`64.5 129`, never `64500m 129`
/// nor `195692000Ki`); the exact values are in the status maps.
fn row_in_one_unit(resource: &str, cells: [Option<Quantity>; 3]) -> [Option<String>; 3] {
    let present: Vec<&Quantity> = cells.iter().flatten().collect();
    let mut printed = crate::quantity::readable(resource, &present).into_iter();
    cells.map(|c| c.and_then(|_| printed.next()))
}

/// `status.incremental` before any step: the options KubeRay will use.
pub fn incremental_status(o: &Options) -> IncrementalStatus {
    IncrementalStatus {
        max_surge_percent: i32::from(o.max_surge_percent),
        step_size_percent: i32::from(o.step_size_percent),
        interval_seconds: i32::try_from(o.interval_seconds).unwrap_or(i32::MAX),
        ..Default::default()
    }
}

/// Quantities as status strings.
pub fn quantities(m: &ResourceList) -> std::collections::BTreeMap<String, String> {
    capacity::canonical_map(m)
}

/// Records what KubeRay reports of an incremental transition (target
/// capacities, traffic, the step) and returns when it last moved: `now` when
/// it moved since the previous status, else the recorded time (the admission
/// when nothing is recorded).
pub fn incremental_progress(
    inc: &mut IncrementalStatus,
    svc: &super::ServiceFacts,
    now: jiff::Timestamp,
    admitted: jiff::Timestamp,
) -> jiff::Timestamp {
    let seen = (
        svc.pending_target_capacity,
        svc.pending_traffic_percent,
        svc.active_target_capacity,
    );
    let before = (
        inc.target_capacity,
        inc.traffic_routed_percent,
        inc.active_target_capacity,
    );
    if seen != before {
        inc.last_progress_time = Some(now);
    }
    (
        inc.target_capacity,
        inc.traffic_routed_percent,
        inc.active_target_capacity,
    ) = seen;
    let step = u32::try_from(inc.step_size_percent).unwrap_or(0);
    if step > 0 {
        let moved = u32::try_from(svc.pending_traffic_percent.unwrap_or(0)).unwrap_or(0);
        inc.step = Some(format!(
            "{}/{}",
            moved.div_ceil(step),
            100u32.div_ceil(step)
        ));
    }
    *inc.last_progress_time.get_or_insert(admitted)
}

/// The status numbers, arranged so the printer columns compare: the new
/// cluster's needs, what is free for it, and the difference when short.
pub fn capacity_status(r: &FitReport) -> CapacityStatus {
    let available = available_for_new(r);
    let needs_gpus = sum_of(&r.new_requests, &ACCELERATORS).is_some();
    let short = |names: &[&str], needed: bool| {
        needed.then(|| sum_of(&r.shortfall, names).unwrap_or_else(Quantity::zero))
    };
    let [gpus_needed, gpus_free, gpus_short] = row_in_one_unit(
        "nvidia.com/gpu",
        [
            sum_of(&r.new_requests, &ACCELERATORS),
            sum_of(&available, &ACCELERATORS).or_else(|| Some(Quantity::zero())),
            short(&ACCELERATORS, needs_gpus),
        ],
    );
    let [cpu_needed, cpu_free, cpu_short] = row_in_one_unit(
        capacity::CPU,
        [
            sum_of(&r.new_requests, &[capacity::CPU]),
            sum_of(&available, &[capacity::CPU]),
            short(&[capacity::CPU], r.new_requests.contains_key(capacity::CPU)),
        ],
    );
    let [memory_needed, memory_free, memory_short] = row_in_one_unit(
        capacity::MEMORY,
        [
            sum_of(&r.new_requests, &[capacity::MEMORY]),
            sum_of(&available, &[capacity::MEMORY]),
            short(
                &[capacity::MEMORY],
                r.new_requests.contains_key(capacity::MEMORY),
            ),
        ],
    );
    CapacityStatus {
        required: capacity::canonical_map(&r.required),
        needed: capacity::canonical_map(&r.new_requests),
        free: capacity::canonical_map(&r.free),
        available: capacity::canonical_map(&available),
        reserved: capacity::canonical_map(&r.reserved),
        shortfall: capacity::canonical_map(&r.shortfall),
        gpus_needed,
        gpus_free,
        gpus_short,
        gpus_peak: sum_of(&r.required, &ACCELERATORS).map(|q| q.canonical()),
        cpu_needed,
        cpu_free,
        cpu_short,
        memory_needed,
        memory_free,
        memory_short,
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

// The texts of capacity (issue 32: numbers that add up, one readable unit per
// resource, resources no node offers named) live in `texts`.
pub use super::texts::{needs_text, resources_text, shortfall_text};

/// The field manager that wrote `spec.approve` (e.g. `kubectl-raygate`), as
/// the plan's managedFields record it: who approved, for the audit trail.
pub fn approver(plan: &crate::upgradeplan::UpgradePlan) -> Option<String> {
    plan.metadata
        .managed_fields
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|m| {
            m.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:spec"))
                .and_then(|s| s.get("f:approve"))
                .is_some()
        })
        .and_then(|m| m.manager.clone())
}

/// How to approve a change under `policy: Manual`: commands that name the
/// plan's namespace, so they work from any current namespace.
pub fn approval_hint(plan: &str, namespace: &str, fingerprint: &str) -> String {
    let ns = if namespace.is_empty() {
        String::new()
    } else {
        format!(" -n {namespace}")
    };
    format!(
        "policy Manual: approve with `kubectl raygate approve {plan}{ns} --fingerprint {fingerprint}` \
         (or kubectl patch upgradeplan {plan}{ns} --type merge -p '{{\"spec\":{{\"approve\":\"{fingerprint}\"}}}}')"
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
            allocatable: rl(&[("nvidia.com/gpu", "8"), ("amd.com/gpu", "2"), ("cpu", "64")]),
            free: rl(&[("nvidia.com/gpu", "6"), ("cpu", "64"), ("memory", "1Ti")]),
            shortfall: rl(&[("nvidia.com/gpu", "4"), ("amd.com/gpu", "2")]),
            unplaced: vec![],
            placements: Default::default(),
            skipped_nodes: vec![],
            dra_pools_updating: vec![],
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

    /// `kubectl get upgradeplans -o wide` prints CPU NEEDED, FREE, SHORT side by
    /// side: one unit per row, as kubectl prints.
    #[test]
    fn wide_columns_of_a_row_share_one_unit() {
        let r = FitReport {
            new_requests: rl(&[("cpu", "64500m"), ("memory", "426496Mi")]),
            free: rl(&[("cpu", "129"), ("memory", "833Gi")]),
            shortfall: ResourceList::new(),
            reserved: ResourceList::new(),
            ..report()
        };
        let c = capacity_status(&r);
        assert_eq!(
            (
                c.cpu_needed.as_deref(),
                c.cpu_free.as_deref(),
                c.cpu_short.as_deref()
            ),
            (Some("64.5"), Some("129"), Some("0"))
        );
        assert_eq!(
            (c.memory_needed.as_deref(), c.memory_free.as_deref()),
            (Some("416.5Gi"), Some("833Gi"))
        );
        // The maps keep canonical quantities (scripts parse them).
        assert_eq!(c.available["cpu"], "129");
    }

    #[test]
    fn shortfall_reads_as_needs_free_reserved_short() {
        let (short, long) = shortfall_text(&report());
        assert_eq!(short, "capacity: amd.com/gpu 2, nvidia.com/gpu 4");
        assert_eq!(
            long,
            "new cluster needs amd.com/gpu 2, cpu 4, nvidia.com/gpu 8 but only cpu 64, nvidia.com/gpu 4 \
             is free for it (free on the nodes: cpu 64, nvidia.com/gpu 6; reserved by other upgrades: \
             nvidia.com/gpu 2); short by amd.com/gpu 2, nvidia.com/gpu 4"
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
