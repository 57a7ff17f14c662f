//! The decision: given what is observed about one UpgradePlan's RayService,
//! should its pending NewCluster upgrade be held, admitted, or tracked?
//!
//! Everything here is pure. The controller gathers [`Inputs`] from its caches
//! and applies the returned [`Decision`] (status, gate, events). Because the
//! whole decision is recomputed from objects every time, killing raygate at
//! any point loses nothing: the admitted fingerprint and the transition start
//! live in the plan's status.
//!
//! - [`rules`]: the rules, in order (see there), each ending in a
//!   [`rules::ruling::Ruling`] that [`render`] writes out once;
//! - [`fit`]: the capacity step, over the ledger, the queue and the pass;
//! - [`render`]: the status, conditions and messages the rules produce;
//! - [`settings`]: the plan's spec as typed values;
//! - [`hold`]: what holds a pending change before capacity (policy, windows);
//! - [`batch`]: gathering cluster changes into one new cluster (`spec.batching`);
//! - [`ledger`], [`priority`], [`pass`]: the cluster-wide queue;
//! - [`quota`]: Kueue's quota as a second capacity dimension;
//! - [`stall`]: why a running transition is not finishing;
//! - [`surge`]: what an incremental upgrade needs and holds.

pub mod batch;
pub mod fit;
pub mod hold;
pub mod ledger;
pub mod objects;
pub mod observed;
pub mod pass;
pub mod priority;
pub mod quota;
pub mod render;
pub mod rules;
pub mod settings;
pub mod stall;
pub mod surge;
pub mod texts;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;

use crate::kuberay::incremental;
use crate::kuberay::{UpgradeType, Verdict};
use crate::upgradeplan::{Fingerprint, PlanKey, PlanUpgradeType, UpgradePlan, UpgradePlanStatus};

pub use fit::Cluster;
pub use hold::{Hold, batch_hold, gate_hold, holds};
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

    /// The value of `spec.upgradeStrategy.type` this gate writes.
    pub fn upgrade_type(self) -> UpgradeType {
        match self {
            Gate::Hold => UpgradeType::None,
            Gate::Open => UpgradeType::NewCluster,
            Gate::OpenIncremental => UpgradeType::NewClusterWithIncrementalUpgrade,
        }
    }

    /// Whether the RayService already reads this gate.
    pub fn is_set(self, value: Option<&UpgradeType>) -> bool {
        value == Some(&self.upgrade_type())
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
    /// Gathered into a batch (`spec.batching`).
    HeldBatching,
    Completed,
    Stalled,
    /// No rule decides it; its series has been exported (at 0) since the
    /// first release, and dashboards may query it.
    Aborted,
}

impl Outcome {
    pub const ALL: [Outcome; 8] = [
        Outcome::Admitted,
        Outcome::HeldCapacity,
        Outcome::HeldPolicy,
        Outcome::HeldWindow,
        Outcome::HeldBatching,
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
            Outcome::HeldBatching => "held_batching",
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
    /// Kueue manages the RayService (its `kueue.x-k8s.io/queue-name` label),
    /// and whether it is elastic.
    pub kueue: Option<crate::kueue::Managed>,
    /// The serving cluster is suspended, or `rayClusterConfig.suspend` is
    /// about to suspend it in place.
    pub suspension: Option<Suspension>,
    /// KubeRay's condition `UpgradeInProgress` is `True`: it applies nothing
    /// to the active cluster meanwhile (not even a suspension).
    pub upgrade_in_progress: bool,
    /// Kueue has stopped the RayService (`rayClusterConfig.suspend: true` on
    /// one it manages): its pod templates are then Kueue's restore of its
    /// Workload's (without the flavor's node labels and tolerations, for
    /// one), not a spec anyone wrote.
    pub kueue_stopped: bool,
}

/// `rayClusterConfig.suspend` takes the serving cluster's pods away: never
/// reported as `Idle`, whoever set it (a user, or Kueue stopping a
/// RayService that no longer matches its Workload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Suspension {
    /// `spec.rayClusterConfig.suspend: true` while the active cluster is not
    /// suspended: KubeRay rewrites it in place and deletes its pods. The
    /// prediction, with the field paths ([`crate::kuberay::Classification::outage`]).
    Applying { outage: String },
    /// The active RayCluster `cluster` has `spec.suspend: true`: no pod serves.
    Suspended { cluster: String },
}

/// A detected change that needs a new cluster (verdict NewCluster with the
/// gate open).
#[derive(Debug, Clone)]
pub struct ChangeFacts {
    pub fingerprint: Fingerprint,
    pub triggering_paths: Vec<String>,
    /// The pods KubeRay will create for the new cluster, as groups.
    pub new_pods: Vec<crate::capacity::PodGroup>,
    /// An incremental upgrade's surge: what is fitted instead of `new_pods`.
    pub surge: Option<surge::Surge>,
}

impl ChangeFacts {
    /// The pods that must fit for the change to be admitted: its surge when
    /// incremental, else the whole new cluster.
    pub fn pods_to_fit(&self) -> &[crate::capacity::PodGroup] {
        self.surge.as_ref().map_or(&self.new_pods, |s| &s.pods)
    }
}

/// [`ChangeFacts::pods_to_fit`] of a change's pods taken apart (the pass's
/// queue keeps only these).
fn fitted_pods(
    new_pods: Vec<crate::capacity::PodGroup>,
    surge: Option<surge::Surge>,
) -> Vec<crate::capacity::PodGroup> {
    surge.map_or(new_pods, |s| s.pods)
}

/// The gate as observed on the RayService.
#[derive(Debug, Clone, Default)]
pub struct GateFacts {
    /// Current `spec.upgradeStrategy.type`.
    pub value: Option<UpgradeType>,
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

/// Why the RayService gives no facts: the decision is an `Error` with this
/// message (`RayServiceUnavailable`).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("RayService {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    /// The object is there but does not deserialize.
    #[error("RayService {namespace}/{name} cannot be read: {error}")]
    Unreadable {
        namespace: String,
        name: String,
        error: String,
    },
}

/// Why the pending change cannot be worked out: the decision is an `Error`
/// with this message (`InvalidRayService`).
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// KubeRay compares the spec with this cluster, which is not cached.
    #[error(
        "active RayCluster {namespace}/{cluster} named in the RayService status does not exist (yet)"
    )]
    ActiveClusterMissing { namespace: String, cluster: String },
    /// The cluster the spec is compared with does not deserialize.
    #[error("RayCluster {cluster} cannot be read: {error}")]
    ClusterUnreadable { cluster: String, error: String },
    /// A spec over raygate's bounds per object: not planned at all
    /// ([`crate::kuberay::budget`]).
    #[error("{kind} {name}: {error}")]
    OverBudget {
        /// `RayService` or `RayCluster`.
        kind: &'static str,
        name: String,
        error: crate::kuberay::over_budget::OverBudget,
    },
    /// The spec, its pods or its surge cannot be classified or computed.
    #[error("{0}")]
    Invalid(#[from] crate::Error),
}

/// Everything one decision reads.
pub struct Inputs<'a> {
    pub now: Timestamp,
    pub plan: &'a UpgradePlan,
    /// The plan's spec, parsed when the plan was read.
    pub settings: crate::Result<Settings>,
    /// The KubeRay release whose rules classified the change, and where it was read.
    pub release: crate::kuberay::Release,
    /// `Err` when the RayService is missing or unreadable.
    pub service: Result<ServiceFacts, ServiceError>,
    /// `Ok(None)`: nothing needs a new cluster (see `verdict`).
    pub change: Result<Option<ChangeFacts>, ChangeError>,
    /// How KubeRay would treat the spec; `None` when nothing was classified.
    pub verdict: Option<Verdict>,
    /// `spec.upgradeType: NewClusterWithIncrementalUpgrade`: the RayService's
    /// options under its release, or why it cannot be upgraded so. `None` for
    /// `NewCluster` plans (or no readable RayService).
    pub incremental: Option<Result<incremental::Options, incremental::Problem>>,
    /// Names of the RayClusters that exist for the service.
    pub clusters: BTreeSet<String>,
    /// Pods per cluster name (only the service's clusters).
    pub pods: BTreeMap<String, Vec<observed::PodRef>>,
    /// Whether the pending cluster reports itself ready.
    pub pending_ready: bool,
    /// Fingerprint of the pending RayCluster's own spec, computed like the
    /// change's; `None` while it is not in the cache (or unreadable).
    pub pending_fingerprint: Option<Fingerprint>,
    /// Kueue's slice stamps of the RayService's cluster spec and of the
    /// pending RayCluster (`quota::rebuild`).
    pub pending_stamp: quota::PendingStamp,
    pub gate: GateFacts,
    /// This plan's admission was just written and the plan cache does not
    /// show it yet: its capacity is already held.
    pub admission_unseen: bool,
    /// Free capacity and the other plans' claims, read only if the decision
    /// reaches the capacity step.
    pub cluster: &'a dyn Cluster,
    /// Kueue's quota for a Kueue-managed RayService, when raygate's Kueue
    /// support is on (`--kueue`); `None`: quota is not a dimension.
    pub quota: Option<quota::QuotaFacts>,
    /// The capacity requests to the node autoscaler, as the controller sees
    /// them; `None` (the offline tools, the live fit): the decision leaves
    /// `status.capacityRequest` as the rules rendered it and wants no objects.
    pub capacity_request: Option<crate::autoscale::request::Facts>,
}

impl Inputs<'_> {
    /// The plan's key.
    pub fn key(&self) -> PlanKey {
        self.plan.key()
    }

    /// The previous status, as recorded on the plan.
    fn prev(&self) -> Option<&UpgradePlanStatus> {
        self.plan.status.as_ref()
    }
}

/// The reasons of the Events raygate records. They are API (`kubectl events
/// --for`, alerts and scripts match them): [`EventReason::as_str`] must never
/// change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventReason {
    /// Another field manager owns the gate field.
    GateOverridden,
    /// `--kuberay-version` disagrees with the RayClusters' stamp.
    KubeRayReleaseMismatch,
    /// The stamped KubeRay release is one raygate does not know.
    UnknownKubeRayRelease,
    /// The KubeRay release has no `spec.upgradeStrategy` (before v1.3).
    KubeRayNotGateable,
    ResourceNotOffered,
    ApprovalUnmatched,
    /// The plan's spec cannot be used.
    InvalidSpec,
    /// The RayService is missing or cannot be read.
    RayServiceUnavailable,
    /// The RayService (or its clusters) cannot be classified or fitted.
    InvalidRayService,
    IncrementalUpgradeNotSupported,
    IncrementalUpgradeGateOff,
    InvalidIncrementalUpgrade,
    UnadmittedUpgrade,
    RayServiceReplaced,
    Paused,
    WaitingForApproval,
    Approved,
    Admitted,
    Abandoned,
    AdmissionWithdrawn,
    AdmissionExpired,
    AdmissionMismatch,
    Upgrading,
    Completed,
    WaitingForCapacity,
    Stalled,
    /// The gate was given back (plan deleted, reference changed).
    GateReleased,
    /// Another plan governs the RayService.
    Conflict,
    CapacityRequested,
    CapacityNotDelivered,
    CapacityDelivered,
    CapacityRequestFailed,
    /// The serving cluster is suspended, or being suspended in place.
    ServiceSuspended,
    /// Kueue would turn the pending change into a suspension (an outage).
    KueueWouldSuspend,
    /// The new cluster fits the nodes but not the ClusterQueue's quota.
    WaitingForQuota,
    /// A change joined the batch of the next new cluster (`spec.batching`).
    Batching,
    /// The batch was released to the gate ("3 changes, 1 recreation").
    BatchReleased,
    /// Kueue has not admitted the RayService's re-derived Workload: the new
    /// cluster stays suspended.
    KueueWorkloadPending,
}

impl EventReason {
    /// Every reason, for tests that check the spellings.
    pub const ALL: [EventReason; 38] = [
        EventReason::GateOverridden,
        EventReason::KubeRayReleaseMismatch,
        EventReason::UnknownKubeRayRelease,
        EventReason::KubeRayNotGateable,
        EventReason::ResourceNotOffered,
        EventReason::ApprovalUnmatched,
        EventReason::InvalidSpec,
        EventReason::RayServiceUnavailable,
        EventReason::InvalidRayService,
        EventReason::IncrementalUpgradeNotSupported,
        EventReason::IncrementalUpgradeGateOff,
        EventReason::InvalidIncrementalUpgrade,
        EventReason::UnadmittedUpgrade,
        EventReason::RayServiceReplaced,
        EventReason::Paused,
        EventReason::WaitingForApproval,
        EventReason::Approved,
        EventReason::Admitted,
        EventReason::Abandoned,
        EventReason::AdmissionWithdrawn,
        EventReason::AdmissionExpired,
        EventReason::AdmissionMismatch,
        EventReason::Upgrading,
        EventReason::Completed,
        EventReason::WaitingForCapacity,
        EventReason::Stalled,
        EventReason::GateReleased,
        EventReason::Conflict,
        EventReason::CapacityRequested,
        EventReason::CapacityNotDelivered,
        EventReason::CapacityDelivered,
        EventReason::CapacityRequestFailed,
        EventReason::ServiceSuspended,
        EventReason::KueueWouldSuspend,
        EventReason::WaitingForQuota,
        EventReason::Batching,
        EventReason::BatchReleased,
        EventReason::KueueWorkloadPending,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::GateOverridden => "GateOverridden",
            EventReason::KubeRayReleaseMismatch => "KubeRayReleaseMismatch",
            EventReason::UnknownKubeRayRelease => "UnknownKubeRayRelease",
            EventReason::KubeRayNotGateable => "KubeRayNotGateable",
            EventReason::ResourceNotOffered => "ResourceNotOffered",
            EventReason::ApprovalUnmatched => "ApprovalUnmatched",
            EventReason::InvalidSpec => "InvalidSpec",
            EventReason::RayServiceUnavailable => "RayServiceUnavailable",
            EventReason::InvalidRayService => "InvalidRayService",
            EventReason::IncrementalUpgradeNotSupported => "IncrementalUpgradeNotSupported",
            EventReason::IncrementalUpgradeGateOff => "IncrementalUpgradeGateOff",
            EventReason::InvalidIncrementalUpgrade => "InvalidIncrementalUpgrade",
            EventReason::UnadmittedUpgrade => "UnadmittedUpgrade",
            EventReason::RayServiceReplaced => "RayServiceReplaced",
            EventReason::Paused => "Paused",
            EventReason::WaitingForApproval => "WaitingForApproval",
            EventReason::Approved => "Approved",
            EventReason::Admitted => "Admitted",
            EventReason::Abandoned => "Abandoned",
            EventReason::AdmissionWithdrawn => "AdmissionWithdrawn",
            EventReason::AdmissionExpired => "AdmissionExpired",
            EventReason::AdmissionMismatch => "AdmissionMismatch",
            EventReason::Upgrading => "Upgrading",
            EventReason::Completed => "Completed",
            EventReason::WaitingForCapacity => "WaitingForCapacity",
            EventReason::Stalled => "Stalled",
            EventReason::GateReleased => "GateReleased",
            EventReason::Conflict => "Conflict",
            EventReason::CapacityRequested => "CapacityRequested",
            EventReason::CapacityNotDelivered => "CapacityNotDelivered",
            EventReason::CapacityDelivered => "CapacityDelivered",
            EventReason::CapacityRequestFailed => "CapacityRequestFailed",
            EventReason::ServiceSuspended => "ServiceSuspended",
            EventReason::KueueWouldSuspend => "KueueWouldSuspend",
            EventReason::WaitingForQuota => "WaitingForQuota",
            EventReason::Batching => "Batching",
            EventReason::BatchReleased => "BatchReleased",
            EventReason::KueueWorkloadPending => "KueueWorkloadPending",
        }
    }
}

/// Tests and logs compare a reason with its spelling.
impl PartialEq<&str> for EventReason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for EventReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<crate::kuberay::ReleaseProblem> for EventReason {
    fn from(p: crate::kuberay::ReleaseProblem) -> Self {
        use crate::kuberay::ReleaseProblem as P;
        match p {
            P::FlagMismatch => EventReason::KubeRayReleaseMismatch,
            P::UnknownRelease => EventReason::UnknownKubeRayRelease,
            P::NotGateable => EventReason::KubeRayNotGateable,
        }
    }
}

impl From<&incremental::Problem> for EventReason {
    fn from(p: &incremental::Problem) -> Self {
        use incremental::Problem as P;
        match p {
            P::NotSupported { .. } => EventReason::IncrementalUpgradeNotSupported,
            P::FeatureGateOff { .. } => EventReason::IncrementalUpgradeGateOff,
            P::AutoscalingOff | P::OptionsMissing | P::InvalidOption { .. } => {
                EventReason::InvalidIncrementalUpgrade
            }
        }
    }
}

/// One Event to record, on the plan and on the RayService.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventNote {
    pub warning: bool,
    pub reason: EventReason,
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
    /// What the decision saw, as numbers: the controller exports these and
    /// never derives them again from the status it rendered.
    pub observed: Observations,
    /// The plan's capacity request objects, as the decision wants them
    /// ([`crate::autoscale::request`]); the controller only makes the
    /// cluster match.
    pub capacity_objects: crate::autoscale::request::Wanted,
}

/// What a decision observed, for metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observations {
    /// Pods of the pending cluster the scheduler reported unschedulable.
    pub unschedulable_pods: u32,
    /// Another field manager took the gate since the last decision (the
    /// `GateOverridden` condition was not `True` before).
    pub newly_overridden: bool,
    /// Of the fit made by this decision (none when it made none, e.g. while
    /// tracking an admitted change): per resource, in base units (cores,
    /// bytes, devices), what the new cluster lacks ...
    pub shortfall: BTreeMap<String, f64>,
    /// ... and what is free on schedulable nodes.
    pub free: BTreeMap<String, f64>,
    /// New clusters a batch admitted now saved (its changes but one):
    /// `raygate_recreations_avoided_total`.
    pub recreations_avoided: u32,
    /// The plan's gauges, read off the finished decision.
    pub phase: crate::upgradeplan::Phase,
    /// Since when the pending change has been held, while a phase holds it.
    pub waiting_since: Option<Timestamp>,
    /// When the running transition was admitted, while one runs.
    pub transition_since: Option<Timestamp>,
    /// Another field manager keeps the gate.
    pub gate_overridden: bool,
    /// The `KubeRayRelease` condition is `False` for a release raygate
    /// gates (a release too old to gate is reported, not a mismatch).
    pub kuberay_release_mismatch: bool,
    /// An open capacity request: when it was made, and whether it is past
    /// its `maxWait` (`NotDelivered`).
    pub capacity_request: Option<(Timestamp, bool)>,
}

impl Observations {
    /// Records the numbers of a fit.
    pub fn fitted(&mut self, r: &crate::capacity::FitReport) {
        self.shortfall = as_numbers(&r.shortfall);
        self.free = as_numbers(&r.free);
    }

    /// The shortfall exported as a gauge: only while the plan waits for
    /// capacity (a fit made for another reason is not a plan held short).
    pub fn capacity_shortfall(&self) -> Option<&BTreeMap<String, f64>> {
        (self.phase == crate::upgradeplan::Phase::WaitingForCapacity).then_some(&self.shortfall)
    }

    /// Records the gauges of the finished decision `d`.
    pub(crate) fn gauges(d: &mut Decision) {
        use crate::upgradeplan::{Phase, condition};
        let s = &d.status;
        let o = &mut d.observed;
        o.phase = s.phase;
        o.waiting_since = matches!(
            s.phase,
            Phase::Pending
                | Phase::Batching
                | Phase::WaitingForCapacity
                | Phase::WaitingForApproval
                | Phase::Paused
        )
        .then(|| s.pending_change.as_ref().map(|c| c.detected_time))
        .flatten();
        o.transition_since = s
            .admitted
            .as_ref()
            .filter(|_| s.phase.is_in_flight())
            .map(|a| a.admitted_time);
        o.gate_overridden = d.overridden_by.is_some();
        o.capacity_request = s.capacity_request.as_ref().and_then(|c| {
            use crate::upgradeplan::CapacityRequestState as S;
            let overdue = match c.state {
                S::Requested => false,
                S::NotDelivered => true,
                S::Queued | S::Failed => return None,
            };
            Some((c.requested_time?, overdue))
        });
        o.kuberay_release_mismatch = s.conditions.iter().any(|c| {
            condition::is(c, condition::KUBERAY_RELEASE, condition::Status::False)
                && c.reason != condition::Reason::NotGateable.as_str()
        });
    }
}

/// Quantities as plain numbers in their base unit, for gauges.
fn as_numbers(list: &crate::capacity::ResourceList) -> BTreeMap<String, f64> {
    list.iter()
        .map(|(k, q)| (k.clone(), q.milli_value() as f64 / 1000.0))
        .collect()
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

/// Decide for one plan, the whole decision: the rules fill in the status,
/// an override of the gate by another field manager is reported, the
/// capacity request is settled (its slot, its objects, its status), and the
/// gauges are read off the result.
pub fn decide(inp: &Inputs<'_>) -> Decision {
    let mut b = render::Builder::new(inp);
    rules::apply(&mut b, inp);
    let overridden_by = overridden_by(&inp.gate, b.gate);
    // Reported only on a readable plan and RayService: the rules stop
    // before the gate is known otherwise.
    if let (Some(owner), Ok(_), Ok(_)) = (&overridden_by, &inp.settings, &inp.service) {
        b.observed.newly_overridden =
            b.gate_overridden(owner, inp.gate.value.as_ref().map(UpgradeType::as_str));
    }
    b.observed.unschedulable_pods = pending_unschedulable(inp);
    let mut d = b.finish(overridden_by);
    if let Some(f) = &inp.capacity_request {
        d.capacity_objects = crate::autoscale::request::settle(inp, f, &mut d);
    }
    Observations::gauges(&mut d);
    d
}

/// Pods of the pending cluster the scheduler reported unschedulable.
fn pending_unschedulable(inp: &Inputs<'_>) -> u32 {
    let pods = inp
        .service
        .as_ref()
        .ok()
        .and_then(|s| s.pending_cluster.as_ref())
        .and_then(|c| inp.pods.get(c));
    match pods {
        Some(pods) => {
            let pods: Vec<&observed::DynPod> = pods.iter().map(AsRef::as_ref).collect();
            stall::count_unschedulable(&pods)
        }
        None => 0,
    }
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

#[cfg(test)]
mod kueue_tests;
