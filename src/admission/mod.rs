//! The decision: given what is observed about one UpgradePlan's RayService,
//! should its pending NewCluster upgrade be held, admitted, or tracked?
//!
//! Everything here is pure. The controller gathers [`Inputs`] from its caches
//! and applies the returned [`Decision`] (status, gate, events). Because the
//! whole decision is recomputed from objects every time, killing raygate at
//! any point loses nothing: the admitted fingerprint and the transition start
//! live in the plan's status.
//!
//! - [`rules`]: the rules, in order (see there);
//! - [`fit`]: the capacity step, over the ledger, the queue and the pass;
//! - [`render`]: the status, conditions and messages the rules produce;
//! - [`settings`]: the plan's spec as typed values;
//! - [`ledger`], [`priority`], [`pass`]: the cluster-wide queue;
//! - [`stall`]: why a running transition is not finishing;
//! - [`surge`]: what an incremental upgrade needs and holds.

pub mod fit;
pub mod ledger;
pub mod pass;
pub mod priority;
pub mod render;
pub mod rules;
pub mod settings;
pub mod stall;
pub mod surge;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use crate::kuberay::Verdict;
use crate::kuberay::incremental;
use crate::upgradeplan::{PlanUpgradeType, UpgradePlan, UpgradePlanStatus};

pub use fit::Cluster;
pub use settings::Settings;

/// The value raygate wants in `spec.upgradeStrategy.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// `None`: KubeRay leaves a pending rayClusterConfig change untouched.
    Hold,
    /// `NewCluster`: KubeRay may prepare the new cluster now.
    Open,
    /// `NewClusterWithIncrementalUpgrade`: KubeRay may prepare the new cluster
    /// now and move traffic to it step by step.
    OpenIncremental,
}

impl Gate {
    /// The gate that lets an upgrade through with the plan's strategy.
    pub fn open(t: PlanUpgradeType) -> Gate {
        match t {
            PlanUpgradeType::NewCluster => Gate::Open,
            PlanUpgradeType::NewClusterWithIncrementalUpgrade => Gate::OpenIncremental,
        }
    }

    pub fn strategy(self) -> &'static str {
        match self {
            Gate::Hold => "None",
            Gate::Open => PlanUpgradeType::NewCluster.as_str(),
            Gate::OpenIncremental => PlanUpgradeType::NewClusterWithIncrementalUpgrade.as_str(),
        }
    }
}

/// What a decision did with an upgrade, as counted by
/// `raygate_admissions_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Admitted,
    HeldCapacity,
    HeldPolicy,
    HeldWindow,
    Completed,
    Stalled,
    /// No rule decides it; its series has been exported (at 0) since the
    /// first release, and dashboards may query it.
    Aborted,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Admitted,
        Outcome::HeldCapacity,
        Outcome::HeldPolicy,
        Outcome::HeldWindow,
        Outcome::Completed,
        Outcome::Stalled,
        Outcome::Aborted,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::HeldCapacity => "held_capacity",
            Outcome::HeldPolicy => "held_policy",
            Outcome::HeldWindow => "held_window",
            Outcome::Completed => "completed",
            Outcome::Stalled => "stalled",
            Outcome::Aborted => "aborted",
        }
    }
}

/// What the RayService says about its clusters.
#[derive(Debug, Clone, Default)]
pub struct ServiceFacts {
    /// `metadata.uid`: a RayService deleted and recreated under the same
    /// name is another object, whose transitions start afresh.
    pub uid: Option<String>,
    pub active_cluster: Option<String>,
    pub pending_cluster: Option<String>,
    /// Pending service's Serve apps: name → status.
    pub pending_apps: BTreeMap<String, String>,
    /// Incremental upgrades (KubeRay v1.5+): Serve `target_capacity` of the
    /// pending and active clusters, and traffic routed to the pending one.
    pub pending_target_capacity: Option<i32>,
    pub pending_traffic_percent: Option<i32>,
    pub active_target_capacity: Option<i32>,
}

/// A detected change that needs a new cluster (verdict NewCluster with the
/// gate open).
#[derive(Debug, Clone)]
pub struct ChangeFacts {
    pub fingerprint: String,
    pub triggering_paths: Vec<String>,
    /// The pods KubeRay will create for the new cluster, as groups.
    pub new_pods: Vec<crate::capacity::PodGroup>,
    /// An incremental upgrade's surge: what is fitted instead of `new_pods`.
    pub surge: Option<surge::Surge>,
}

impl ChangeFacts {
    /// The pods that must fit for the change to be admitted.
    pub fn pods_to_fit(&self) -> &[crate::capacity::PodGroup] {
        self.surge.as_ref().map_or(&self.new_pods, |s| &s.pods)
    }
}

/// The gate as observed on the RayService.
#[derive(Debug, Clone, Default)]
pub struct GateFacts {
    /// Current `spec.upgradeStrategy.type`.
    pub value: Option<String>,
    /// Another field manager that owns the field too. It overrides raygate
    /// when the value it keeps is not the one decided.
    pub other_owner: Option<String>,
    /// raygate's own field manager owns the field.
    pub owned_by_us: bool,
    /// The RayService's `metadata.uid`, sent with every gate write as a
    /// precondition: the apiserver then refuses the write if the object is
    /// gone (or was replaced) instead of creating one.
    pub uid: Option<String>,
}

/// Everything one decision reads.
pub struct Inputs<'a> {
    pub now: Timestamp,
    pub plan: &'a UpgradePlan,
    /// The plan's spec, parsed when the plan was read.
    pub settings: crate::Result<Settings>,
    /// The KubeRay release whose rules classified the change, and where it was read.
    pub release: crate::kuberay::Release,
    /// `Err` when the RayService is missing or unreadable, with the message.
    pub service: Result<ServiceFacts, String>,
    /// `Ok(None)`: nothing needs a new cluster (see `verdict`).
    pub change: Result<Option<ChangeFacts>, String>,
    /// How KubeRay would treat the spec; `None` when nothing was classified.
    pub verdict: Option<Verdict>,
    /// `spec.upgradeType: NewClusterWithIncrementalUpgrade`: the RayService's
    /// options under its release, or why it cannot be upgraded so. `None` for
    /// `NewCluster` plans (or no readable RayService).
    pub incremental: Option<Result<incremental::Options, incremental::Problem>>,
    /// Names of the RayClusters that exist for the service.
    pub clusters: BTreeSet<String>,
    /// Pods per cluster name (only the service's clusters).
    pub pods: BTreeMap<String, Vec<Arc<Pod>>>,
    /// Whether the pending cluster reports itself ready.
    pub pending_ready: bool,
    /// Fingerprint of the pending RayCluster's own spec, computed like the
    /// change's; `None` while it is not in the cache (or unreadable).
    pub pending_fingerprint: Option<String>,
    pub gate: GateFacts,
    /// This plan's admission was just written and the plan cache does not
    /// show it yet: its capacity is already held.
    pub admission_unseen: bool,
    /// Free capacity and the other plans' claims, read only if the decision
    /// reaches the capacity step.
    pub cluster: &'a dyn Cluster,
}

impl Inputs<'_> {
    /// The plan's `(namespace, name)`.
    pub fn key(&self) -> fit::PlanKey {
        (
            self.plan.metadata.namespace.clone().unwrap_or_default(),
            self.plan.metadata.name.clone().unwrap_or_default(),
        )
    }

    /// The previous status, as recorded on the plan.
    fn prev(&self) -> Option<&UpgradePlanStatus> {
        self.plan.status.as_ref()
    }
}

/// One Event to record, on the plan and on the RayService.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventNote {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
    /// The fingerprint of the change the Event is about, if any: Events of
    /// different changes must never be folded into one series.
    pub change: Option<String>,
}

impl EventNote {
    /// The Event's `action`. kube's Recorder folds Events with the same
    /// type, reason, action, reporter and objects into one series and keeps
    /// the first note (`EventKey` in kube-runtime's `events.rs`; client-go's
    /// recorder keys them alike), so the action names the change the Event
    /// is about and a digest of what it says (`Gate 07e0ddeed0e9 5d2c9a10`,
    /// `Gate - 5d2c9a10` for none): Events of different changes, or saying
    /// different things, stay apart, and only the same Event repeated is
    /// counted in `series.count`.
    pub fn action(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest: String = Sha256::digest(self.note.as_bytes())
            .iter()
            .take(4)
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("Gate {} {digest}", self.change.as_deref().unwrap_or("-"))
    }
}

#[derive(Debug, Clone)]
pub struct Decision {
    pub status: UpgradePlanStatus,
    /// `None` when raygate must not touch the gate (no RayService).
    pub gate: Option<Gate>,
    pub events: Vec<EventNote>,
    /// For `raygate_admissions_total{outcome}`.
    pub outcome: Option<Outcome>,
    pub requeue: Duration,
    /// The field manager that keeps another gate value than `gate`: raygate
    /// reports it and does not write the gate.
    pub overridden_by: Option<String>,
}

/// Requeue intervals: tight while something moves, relaxed when idle.
pub(crate) const REQUEUE_ACTIVE: Duration = Duration::from_secs(5);
pub(crate) const REQUEUE_WAITING: Duration = Duration::from_secs(15);
pub(crate) const REQUEUE_IDLE: Duration = Duration::from_secs(120);

/// How long an admission may wait for KubeRay to name the new cluster before
/// it is fitted again: capacity measured then may be gone by now (after a
/// restart, or with KubeRay down), so an old admission never opens the gate
/// on its own.
pub const ADMISSION_TTL: Duration = Duration::from_secs(120);

/// Decide for one plan: the rules fill in the status, then an override of
/// the gate by another field manager is reported.
pub fn decide(inp: &Inputs<'_>) -> Decision {
    let mut b = render::Builder::new(inp);
    rules::apply(&mut b, inp);
    let overridden_by = overridden_by(&inp.gate, b.gate);
    // Reported only on a readable plan and RayService: the rules stop
    // before the gate is known otherwise.
    if let (Some(owner), Ok(_), Ok(_)) = (&overridden_by, &inp.settings, &inp.service) {
        b.gate_overridden(owner, inp.gate.value.as_deref());
    }
    b.finish(overridden_by)
}

/// Another manager owns the gate: report it, don't fight it. Whatever value
/// it keeps, even the one raygate wants now, raygate cannot move the field
/// away from it (a non-forced server-side apply of another value conflicts
/// with a second owner even after sharing its value: checked on Kubernetes
/// v1.36 by the e2e incremental suite), so it gates nothing.
fn overridden_by(gate: &GateFacts, wanted: Option<Gate>) -> Option<String> {
    match (&gate.other_owner, wanted) {
        (Some(owner), Some(_)) => Some(owner.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod incremental_tests;
