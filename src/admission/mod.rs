//! The decision: given what is observed about one UpgradePlan's RayService,
//! should its pending NewCluster upgrade be held, admitted, or tracked?
//!
//! Everything here is pure. The controller gathers [`Inputs`] from its caches
//! and applies the returned [`Decision`] (status, gate, events). Because the
//! whole decision is recomputed from objects every time, killing raygate at
//! any point loses nothing: the admitted fingerprint and the transition start
//! live in the plan's status.
//!
//! The rules, in order:
//! 1. A plan or RayService that cannot be read is an `Error`; the gate stays
//!    closed (a broken input never opens it).
//! 2. An admitted change is tracked: `Admitted` until KubeRay names the new
//!    cluster (gate open), then `Upgrading` (gate closed again so a further
//!    commit cannot start another cluster), `Stalled` when [`stall`] says so,
//!    `Completed` once the old cluster and its pods are gone.
//! 3. A pending change waits for policy (`Paused`, `Manual` approval), the
//!    maintenance window, then capacity: the new cluster's pods must fit in
//!    free capacity minus the ledger's reservations and the plan's headroom.

pub mod ledger;
pub mod pass;
pub mod priority;
pub mod stall;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::capacity::FitReport;
use crate::quantity::Quantity;
use crate::schedule::{self, Window};
use crate::upgradeplan::{
    Admission, CapacityStatus, PendingChange, Phase, Policy, TransitionRecord, UpgradePlan,
    UpgradePlanStatus,
};

/// The resource name shown in the GPU printer columns.
pub const GPU_RESOURCES: [&str; 3] = ["nvidia.com/gpu", "amd.com/gpu", "google.com/tpu"];

/// The value raygate wants in `spec.upgradeStrategy.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// `None`: KubeRay leaves a pending rayClusterConfig change untouched.
    Hold,
    /// `NewCluster`: KubeRay may prepare the new cluster now.
    Open,
}

impl Gate {
    pub fn strategy(self) -> &'static str {
        match self {
            Gate::Hold => "None",
            Gate::Open => "NewCluster",
        }
    }
}

/// What the RayService says about its clusters.
#[derive(Debug, Clone, Default)]
pub struct ServiceFacts {
    pub active_cluster: Option<String>,
    pub pending_cluster: Option<String>,
    /// Pending service's Serve apps: name → status.
    pub pending_apps: BTreeMap<String, String>,
}

/// A detected change that needs a new cluster (verdict NewCluster with the
/// gate open).
#[derive(Debug, Clone)]
pub struct ChangeFacts {
    pub fingerprint: String,
    pub triggering_paths: Vec<String>,
    /// The pods KubeRay will create for the new cluster, as groups.
    pub new_pods: Vec<crate::capacity::PodGroup>,
}

/// The gate as observed on the RayService.
#[derive(Debug, Clone, Default)]
pub struct GateFacts {
    /// Current `spec.upgradeStrategy.type`.
    pub value: Option<String>,
    /// Another field manager owns the field (our apply was refused).
    pub overridden_by: Option<String>,
}

pub struct Inputs<'a> {
    pub now: Timestamp,
    pub plan: &'a UpgradePlan,
    /// `Err` when the RayService is missing or unreadable, with the message.
    pub service: Result<ServiceFacts, String>,
    /// `Ok(None)`: nothing needs a new cluster (verdict in `verdict`).
    pub change: Result<Option<ChangeFacts>, String>,
    /// The classification verdict, for messages.
    pub verdict: String,
    /// Names of the RayClusters that exist for the service.
    pub clusters: BTreeSet<String>,
    /// Pods per cluster name (only the service's clusters).
    pub pods: BTreeMap<String, Vec<&'a Pod>>,
    /// Whether the pending cluster reports itself ready.
    pub pending_ready: bool,
    /// Fingerprint of the pending RayCluster's own spec, computed like the
    /// change's; `None` while it is not in the cache (or unreadable).
    pub pending_fingerprint: Option<String>,
    pub gate: GateFacts,
    /// Evaluates the fit of a change against free capacity and the ledger.
    pub fit: &'a dyn Fn(&ChangeFacts) -> crate::Result<FitReport>,
}

/// One Event to record, on the plan and on the RayService.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventNote {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

#[derive(Debug, Clone)]
pub struct Decision {
    pub status: UpgradePlanStatus,
    /// `None` when raygate must not touch the gate (no RayService).
    pub gate: Option<Gate>,
    pub events: Vec<EventNote>,
    /// For `raygate_admissions_total{outcome}`.
    pub outcome: Option<&'static str>,
    pub requeue: Duration,
}

/// Requeue intervals: tight while something moves, relaxed when idle.
const REQUEUE_ACTIVE: Duration = Duration::from_secs(5);
const REQUEUE_WAITING: Duration = Duration::from_secs(15);
const REQUEUE_IDLE: Duration = Duration::from_secs(120);

/// How long an admission may wait for KubeRay to name the new cluster before
/// it is fitted again: capacity measured then may be gone by now (after a
/// restart, or with KubeRay down), so an old admission never opens the gate
/// on its own.
pub const ADMISSION_TTL: Duration = Duration::from_secs(120);

/// Parsed plan settings.
struct Settings {
    stall_after: Duration,
    windows: Vec<Window>,
}

fn settings(plan: &UpgradePlan) -> crate::Result<Settings> {
    let spec = &plan.spec;
    for (name, value) in &spec.headroom {
        Quantity::parse_amount_field(&format!("spec.headroom[{name}]"), value)?;
    }
    let stall_after = schedule::parse_duration("spec.stallAfter", &spec.stall_after)?;
    let windows = spec
        .maintenance_windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            Window::parse(
                &format!("spec.maintenanceWindows[{i}]"),
                &w.schedule,
                &w.duration,
            )
        })
        .collect::<crate::Result<Vec<_>>>()?;
    Ok(Settings {
        stall_after,
        windows,
    })
}

/// Decide for one plan.
pub fn decide(inp: &Inputs<'_>) -> Decision {
    let prev = inp.plan.status.clone().unwrap_or_default();
    let mut b = Builder::new(inp, &prev);

    let settings = match settings(inp.plan) {
        Ok(s) => s,
        Err(e) => return b.error("InvalidSpec", e.to_string(), Some(Gate::Hold)),
    };
    let svc = match &inp.service {
        Ok(s) => s,
        Err(msg) => return b.error("RayServiceUnavailable", msg.clone(), None),
    };
    b.status.active_cluster = svc.active_cluster.clone();
    b.status.pending_cluster = svc.pending_cluster.clone();
    if let Some(owner) = &inp.gate.overridden_by {
        b.gate_overridden(owner, inp.gate.value.as_deref());
    }

    if let Some(admitted) = prev.admitted.clone() {
        return track(b, inp, svc, &settings, admitted);
    }
    if let Some(pending) = &svc.pending_cluster {
        // A transition raygate did not admit: the gate was overridden, or it
        // started before the plan existed. Track it rather than pretend.
        let admitted = Admission {
            fingerprint: inp
                .change
                .as_ref()
                .ok()
                .and_then(|c| c.as_ref())
                .map(|c| c.fingerprint.clone())
                .unwrap_or_default(),
            admitted_time: inp.now.to_string(),
            from_cluster: svc.active_cluster.clone(),
            to_cluster: Some(pending.clone()),
        };
        if svc.active_cluster.is_some() {
            b.events.push(EventNote {
                warning: true,
                reason: "UnadmittedUpgrade",
                note: format!("KubeRay started cluster {pending} without raygate's admission"),
            });
            return track(b, inp, svc, &settings, admitted);
        }
    }
    if svc.active_cluster.is_none() {
        b.status.phase = Phase::Pending;
        b.waiting(
            "first cluster",
            "the RayService has no active RayCluster yet; KubeRay is creating it",
        );
        b.gate = Some(Gate::Hold);
        b.requeue = REQUEUE_ACTIVE;
        return b.finish();
    }
    evaluate(b, inp, &settings)
}

/// A change that is not admitted yet: policy, window, capacity.
fn evaluate(mut b: Builder<'_>, inp: &Inputs<'_>, settings: &Settings) -> Decision {
    b.gate = Some(Gate::Hold);
    let change = match &inp.change {
        Err(msg) => return b.error("InvalidRayService", msg.clone(), Some(Gate::Hold)),
        Ok(None) => {
            b.status.pending_change = None;
            let completed = b
                .prev
                .last_transition
                .as_ref()
                .and_then(|t| t.outcome.as_deref())
                == Some("Completed")
                && b.prev.phase == Phase::Completed;
            b.status.phase = if completed {
                Phase::Completed
            } else {
                Phase::Idle
            };
            b.status.message = Some(format!("no new cluster needed (verdict {})", inp.verdict));
            b.condition(
                "UpgradeAdmitted",
                false,
                "NoPendingChange",
                "nothing to admit",
            );
            b.condition(
                "CapacityAvailable",
                true,
                "NoPendingChange",
                "no new cluster needed",
            );
            b.requeue = REQUEUE_IDLE;
            return b.finish();
        }
        Ok(Some(c)) => c,
    };
    let detected = match &b.prev.pending_change {
        Some(p) if p.fingerprint == change.fingerprint => p.detected_time.clone(),
        _ => inp.now.to_string(),
    };
    b.status.pending_change = Some(PendingChange {
        fingerprint: change.fingerprint.clone(),
        triggering_paths: change.triggering_paths.clone(),
        detected_time: detected,
    });
    b.condition("UpgradeAdmitted", false, "Pending", "waiting for admission");
    b.requeue = REQUEUE_WAITING;

    let spec = &inp.plan.spec;
    match spec.policy {
        Policy::Paused => {
            return b.hold(
                Phase::WaitingForApproval,
                "policy Paused",
                "the plan's policy is Paused; set policy to Auto or Manual to proceed",
                "held_policy",
            );
        }
        Policy::Manual if spec.approve.as_deref() != Some(change.fingerprint.as_str()) => {
            let how = format!(
                "policy Manual: approve with `kubectl raygate approve {0} --fingerprint {1}` \
                 (or kubectl patch upgradeplan {0} --type merge -p '{{\"spec\":{{\"approve\":\"{1}\"}}}}')",
                inp.plan.metadata.name.as_deref().unwrap_or_default(),
                change.fingerprint
            );
            return b.hold(Phase::WaitingForApproval, "approval", &how, "held_policy");
        }
        _ => {}
    }
    if !schedule::any_open(&settings.windows, inp.now) {
        return b.hold(
            Phase::Pending,
            "maintenance window",
            "no maintenance window is open now (UTC)",
            "held_window",
        );
    }
    let report = match (inp.fit)(change) {
        Ok(r) => r,
        Err(e) => return b.error("InvalidRayService", e.to_string(), Some(Gate::Hold)),
    };
    b.status.capacity = Some(capacity_status(&report));
    if !report.fits {
        b.status.phase = Phase::WaitingForCapacity;
        let (short, long) = shortfall_text(&report);
        b.condition("CapacityAvailable", false, "InsufficientCapacity", &long);
        b.waiting(&short, &long);
        b.outcome = Some("held_capacity");
        if b.prev.phase != Phase::WaitingForCapacity {
            b.events.push(EventNote {
                warning: true,
                reason: "WaitingForCapacity",
                note: long,
            });
        }
        return b.finish();
    }
    b.condition(
        "CapacityAvailable",
        true,
        "Fits",
        "the new cluster fits in free capacity",
    );
    b.condition(
        "UpgradeAdmitted",
        true,
        "Admitted",
        &format!("change {} admitted", change.fingerprint),
    );
    b.status.phase = Phase::Admitted;
    b.status.waiting_for = Some("KubeRay".into());
    b.status.message = Some("admitted; waiting for KubeRay to create the new cluster".into());
    b.status.admitted = Some(Admission {
        fingerprint: change.fingerprint.clone(),
        admitted_time: inp.now.to_string(),
        from_cluster: b.status.active_cluster.clone(),
        to_cluster: None,
    });
    b.gate = Some(Gate::Open);
    b.outcome = Some("admitted");
    b.requeue = REQUEUE_ACTIVE;
    b.events.push(EventNote {
        warning: false,
        reason: "Admitted",
        note: format!(
            "admitted change {} ({}); new cluster requests {}",
            change.fingerprint,
            change
                .triggering_paths
                .first()
                .map(String::as_str)
                .unwrap_or("rayClusterConfig"),
            resources_text(&report.new_requests)
        ),
    });
    b.finish()
}

/// An admitted (or unadmitted but running) transition.
fn track(
    mut b: Builder<'_>,
    inp: &Inputs<'_>,
    svc: &ServiceFacts,
    settings: &Settings,
    mut admitted: Admission,
) -> Decision {
    b.gate = Some(Gate::Hold);
    b.requeue = REQUEUE_ACTIVE;
    // What was measured at admission stays visible during the transition.
    b.status.capacity = b.prev.capacity.clone();
    let start = admitted
        .admitted_time
        .parse::<Timestamp>()
        .unwrap_or(inp.now);
    let running_for = Duration::try_from(inp.now.duration_since(start)).unwrap_or_default();
    let current_fp = inp
        .change
        .as_ref()
        .ok()
        .and_then(|c| c.as_ref())
        .map(|c| c.fingerprint.clone());

    match (&svc.pending_cluster, &admitted.to_cluster) {
        // Admitted, KubeRay has not acted yet.
        (None, None) if svc.active_cluster == admitted.from_cluster => {
            if current_fp.as_deref() != Some(admitted.fingerprint.as_str()) {
                // The spec moved on (new commit or revert) before KubeRay acted:
                // withdraw and evaluate what is there now.
                b.status.admitted = None;
                b.events.push(EventNote {
                    warning: false,
                    reason: "AdmissionWithdrawn",
                    note: format!(
                        "change {} was superseded before KubeRay started it",
                        admitted.fingerprint
                    ),
                });
                return evaluate(b, inp, settings);
            }
            if running_for > ADMISSION_TTL {
                b.status.admitted = None;
                b.events.push(EventNote {
                    warning: true,
                    reason: "AdmissionExpired",
                    note: format!(
                        "KubeRay did not start change {} within {}; fitting it again",
                        admitted.fingerprint,
                        stall::human_duration(ADMISSION_TTL)
                    ),
                });
                return evaluate(b, inp, settings);
            }
            b.status.phase = Phase::Admitted;
            b.status.waiting_for = Some("KubeRay".into());
            b.status.message =
                Some("admitted; waiting for KubeRay to create the new cluster".into());
            b.status.admitted = Some(admitted);
            b.gate = Some(Gate::Open);
            b.finish()
        }
        // KubeRay named a new cluster for an admission: adopt it only once
        // its spec is known to be the admitted change.
        (Some(pending), None) if !admitted.fingerprint.is_empty() => {
            match inp.pending_fingerprint.as_deref() {
                None => {
                    b.status.admitted = Some(admitted);
                    b.status.phase = Phase::Upgrading;
                    b.status.waiting_for = Some("new cluster".into());
                    b.status.message = Some(format!(
                        "KubeRay named cluster {pending}; it is checked against the admitted change once it exists"
                    ));
                    b.finish()
                }
                Some(fp) if fp != admitted.fingerprint => {
                    b.events.push(EventNote {
                        warning: true,
                        reason: "AdmissionMismatch",
                        note: format!(
                            "KubeRay built cluster {pending} from change {fp}, not from the admitted change {}; \
                             admission withdrawn, the gate stays closed and the transition is tracked as unadmitted",
                            admitted.fingerprint
                        ),
                    });
                    let unadmitted = Admission {
                        fingerprint: fp.to_string(),
                        admitted_time: inp.now.to_string(),
                        from_cluster: admitted.from_cluster.clone(),
                        to_cluster: Some(pending.clone()),
                    };
                    track(b, inp, svc, settings, unadmitted)
                }
                Some(_) => {
                    admitted.to_cluster = Some(pending.clone());
                    track(b, inp, svc, settings, admitted)
                }
            }
        }
        // The new cluster exists or existed: the transition is under way.
        (Some(pending), _) => {
            admitted.to_cluster = Some(pending.clone());
            b.status.admitted = Some(admitted.clone());
            b.status.last_transition = Some(TransitionRecord {
                fingerprint: admitted.fingerprint.clone(),
                start: admitted.admitted_time.clone(),
                end: None,
                outcome: None,
                duration_seconds: None,
            });
            if b.prev.phase == Phase::Admitted {
                b.events.push(EventNote {
                    warning: false,
                    reason: "Upgrading",
                    note: format!("KubeRay is creating cluster {pending}; gate closed again"),
                });
            }
            let pods = inp.pods.get(pending).map(Vec::as_slice).unwrap_or(&[]);
            match stall::diagnose(
                pods,
                &svc.pending_apps,
                inp.pending_ready,
                running_for,
                settings.stall_after,
            ) {
                Some(s) => stalled(b, s, &admitted),
                None => {
                    b.status.phase = Phase::Upgrading;
                    b.status.waiting_for = Some(if inp.pending_ready {
                        "serve apps".into()
                    } else {
                        "new cluster".into()
                    });
                    b.status.message = Some(format!(
                        "transition to {pending} running for {}",
                        stall::human_duration(running_for)
                    ));
                    b.condition("Stalled", false, "Progressing", "transition is progressing");
                    b.finish()
                }
            }
        }
        // KubeRay dropped the new cluster without promoting it (the spec was
        // reverted): the transition is over, the old cluster stays.
        (None, Some(to)) if svc.active_cluster == admitted.from_cluster => {
            b.status.admitted = None;
            b.status.last_transition = Some(ended(&admitted, "Abandoned", inp.now, running_for));
            b.events.push(EventNote {
                warning: true,
                reason: "Abandoned",
                note: format!("KubeRay dropped new cluster {to} without promoting it"),
            });
            evaluate(b, inp, settings)
        }
        // Promoted (or never named and the active cluster changed under us).
        _ => {
            let old = admitted.from_cluster.clone().unwrap_or_default();
            let old_left =
                inp.clusters.contains(&old) || inp.pods.get(&old).is_some_and(|p| !p.is_empty());
            if old_left && !old.is_empty() {
                b.status.admitted = Some(admitted);
                b.status.phase = Phase::Upgrading;
                b.status.waiting_for = Some("old cluster deletion".into());
                b.status.message = Some(format!(
                    "promoted; waiting for KubeRay to delete {old} and its pods"
                ));
                return b.finish();
            }
            b.status.admitted = None;
            b.status.pending_change = None;
            b.status.last_transition = Some(ended(&admitted, "Completed", inp.now, running_for));
            b.status.phase = Phase::Completed;
            b.status.waiting_for = None;
            b.status.message = Some(format!(
                "upgrade to {} completed in {}",
                svc.active_cluster.as_deref().unwrap_or("?"),
                stall::human_duration(running_for)
            ));
            b.condition("Stalled", false, "Completed", "transition completed");
            b.condition(
                "UpgradeAdmitted",
                false,
                "Completed",
                "transition completed",
            );
            b.outcome = Some("completed");
            b.events.push(EventNote {
                warning: false,
                reason: "Completed",
                note: format!(
                    "change {} completed in {}",
                    admitted.fingerprint,
                    stall::human_duration(running_for)
                ),
            });
            b.requeue = REQUEUE_WAITING;
            b.finish()
        }
    }
}

/// The record of a transition that is over.
fn ended(admitted: &Admission, outcome: &str, now: Timestamp, took: Duration) -> TransitionRecord {
    TransitionRecord {
        fingerprint: admitted.fingerprint.clone(),
        start: admitted.admitted_time.clone(),
        end: Some(now.to_string()),
        outcome: Some(outcome.to_string()),
        duration_seconds: Some(took.as_secs() as i64),
    }
}

fn stalled(mut b: Builder<'_>, s: stall::Stall, admitted: &Admission) -> Decision {
    b.status.phase = Phase::Stalled;
    b.status.waiting_for = Some(s.reason.to_string());
    b.condition("Stalled", true, s.reason, &s.message);
    // KubeRay cancels a pending cluster only when the RayService spec goes
    // back to the active cluster's, and that spec belongs to the user: the
    // gate stays closed and the message says how to cancel.
    let msg = format!(
        "{}: {}; the gate stays closed; to cancel, revert spec.rayClusterConfig to the active cluster's config",
        s.reason, s.message
    );
    b.status.message = Some(msg.clone());
    if b.prev.phase != Phase::Stalled {
        b.outcome = Some("stalled");
        b.events.push(EventNote {
            warning: true,
            reason: "Stalled",
            note: format!(
                "transition of change {} stalled: {msg}",
                admitted.fingerprint
            ),
        });
    }
    b.finish()
}

/// Carries the new status while rules fill it in.
struct Builder<'a> {
    inp: &'a Inputs<'a>,
    prev: &'a UpgradePlanStatus,
    status: UpgradePlanStatus,
    gate: Option<Gate>,
    events: Vec<EventNote>,
    outcome: Option<&'static str>,
    requeue: Duration,
    gate_overridden: bool,
}

impl<'a> Builder<'a> {
    fn new(inp: &'a Inputs<'a>, prev: &'a UpgradePlanStatus) -> Self {
        let status = UpgradePlanStatus {
            observed_generation: inp.plan.metadata.generation,
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
    fn hold(mut self, phase: Phase, short: &str, long: &str, outcome: &'static str) -> Decision {
        self.status.phase = phase;
        self.waiting(short, long);
        self.outcome = Some(outcome);
        self.finish()
    }

    fn waiting(&mut self, short: &str, long: &str) {
        self.status.waiting_for = Some(short.to_string());
        self.status.message = Some(long.to_string());
    }

    fn error(mut self, reason: &'static str, msg: String, gate: Option<Gate>) -> Decision {
        self.status.phase = Phase::Error;
        self.status.admitted = self.prev.admitted.clone();
        self.status.pending_change = self.prev.pending_change.clone();
        self.waiting(reason, &msg);
        self.gate = gate;
        self.requeue = REQUEUE_WAITING;
        if self.prev.phase != Phase::Error || self.prev.message.as_deref() != Some(msg.as_str()) {
            self.events.push(EventNote {
                warning: true,
                reason,
                note: msg,
            });
        }
        self.finish()
    }

    fn gate_overridden(&mut self, owner: &str, value: Option<&str>) {
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
            .any(|c| c.type_ == "GateOverridden" && c.status == "True")
        {
            self.events.push(EventNote {
                warning: true,
                reason: "GateOverridden",
                note: msg.clone(),
            });
        }
        self.condition("GateOverridden", true, "OwnedByOtherManager", &msg);
    }

    /// Set a condition, keeping `lastTransitionTime` when the status is unchanged.
    fn condition(&mut self, type_: &str, ok: bool, reason: &str, message: &str) {
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

    fn finish(mut self) -> Decision {
        if !self.gate_overridden
            && self
                .status
                .conditions
                .iter()
                .any(|c| c.type_ == "GateOverridden")
        {
            self.condition(
                "GateOverridden",
                false,
                "OwnedByRaygate",
                "raygate owns the gate",
            );
        }
        let stalled = self.status.phase == Phase::Stalled;
        if !stalled
            && self.status.conditions.iter().any(|c| c.type_ == "Stalled")
            && self.status.phase != Phase::Upgrading
        {
            self.condition(
                "Stalled",
                false,
                "NotUpgrading",
                "no transition in progress",
            );
        }
        let (ok, reason) = match self.status.phase {
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
        self.condition("Ready", ok, reason, &msg);
        self.status.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        Decision {
            status: self.status,
            gate: self.gate,
            events: self.events,
            outcome: self.outcome,
            requeue: self.requeue,
        }
    }
}

/// The status numbers, arranged so the printer columns compare: the new
/// cluster's needs, what is free for it, and the difference when short.
fn capacity_status(r: &FitReport) -> CapacityStatus {
    let pick = |m: &crate::capacity::ResourceList, names: &[&str]| -> Option<String> {
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
    };
    let available = available_for_new(r);
    let needs_gpus = pick(&r.new_requests, &GPU_RESOURCES).is_some();
    let short = |names: &[&str], needed: bool| {
        needed.then(|| pick(&r.shortfall, names).unwrap_or_else(|| "0".into()))
    };
    CapacityStatus {
        required: crate::capacity::canonical_map(&r.required),
        needed: crate::capacity::canonical_map(&r.new_requests),
        free: crate::capacity::canonical_map(&r.free),
        available: crate::capacity::canonical_map(&available),
        reserved: crate::capacity::canonical_map(&r.reserved),
        shortfall: crate::capacity::canonical_map(&r.shortfall),
        gpus_needed: pick(&r.new_requests, &GPU_RESOURCES),
        gpus_free: pick(&available, &GPU_RESOURCES).or_else(|| Some("0".into())),
        gpus_short: short(&GPU_RESOURCES, needs_gpus),
        gpus_peak: pick(&r.required, &GPU_RESOURCES),
        cpu_needed: pick(&r.new_requests, &["cpu"]),
        cpu_free: pick(&available, &["cpu"]),
        cpu_short: short(&["cpu"], r.new_requests.contains_key("cpu")),
        memory_needed: pick(&r.new_requests, &["memory"]),
        memory_free: pick(&available, &["memory"]),
        memory_short: short(&["memory"], r.new_requests.contains_key("memory")),
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
fn available_for_new(r: &FitReport) -> crate::capacity::ResourceList {
    let taken = crate::capacity::sum(&r.reserved, &r.headroom);
    let left = crate::capacity::sub_floor0(&r.free, &taken);
    left.into_iter()
        .filter(|(k, _)| r.new_requests.contains_key(k) || GPU_RESOURCES.contains(&k.as_str()))
        .collect()
}

/// (`short for the column`, `long for message and events`).
fn shortfall_text(r: &FitReport) -> (String, String) {
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
    let free_of_needed: crate::capacity::ResourceList = r
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

fn resources_text(m: &crate::capacity::ResourceList) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {}", v.canonical()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
