//! The `UpgradePlan` custom resource: how a platform team tells raygate to
//! gate one RayService, and where raygate reports what it decided.
//!
//! The spec is the user's intent (policy, priority, headroom, stall rules);
//! the status is raygate's own record. Everything the controller needs to
//! resume after a restart (admitted fingerprint, reservation, transition
//! start) lives in the status, never in memory.

pub mod batching;
#[cfg(test)]
mod crd_tests;
pub mod ownership;
pub mod validation;
pub mod windows;

pub use batching::{BatchStatus, BatchedChange, BatchingSpec};
pub use windows::WindowsStatus;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

/// A Kubernetes quantity: plain or suffixed number, as `kubectl` accepts.
/// Negative amounts are refused: no resource can be left free below zero.
const QUANTITY_PATTERN: &str = r"^\+?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?\d+))?$";
/// A DNS-1123 subdomain, as Kubernetes requires of object names.
pub const DNS1123_SUBDOMAIN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A Go-style duration of hours, minutes, seconds (`90s`, `1h30m`, `1.5h`).
/// Go durations, bounded: at most four parts of at most six digits (so
/// `99999999999999999999h` is refused by the apiserver, not only by raygate).
pub(crate) const DURATION_PATTERN: &str = r"^([0-9]{1,6}(\.[0-9]{1,9})?(h|m|s|ms)){1,4}$";

// The printer columns repeat `type_ = "string"`, which clippy takes for a
// duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "raygate.io",
    version = "v1alpha1",
    kind = "UpgradePlan",
    plural = "upgradeplans",
    singular = "upgradeplan",
    shortname = "uplan",
    category = "raygate",
    namespaced,
    status = "UpgradePlanStatus",
    doc = "Gates NewCluster upgrades of one KubeRay RayService on free cluster capacity.",
    printcolumn(
        name = "RayService",
        type_ = "string",
        json_path = ".spec.rayServiceRef.name"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "GPUs Needed",
        type_ = "string",
        json_path = ".status.capacity.gpusNeeded",
        description = "GPUs the new cluster requests"
    ),
    printcolumn(
        name = "GPUs Free",
        type_ = "string",
        json_path = ".status.capacity.gpusFree",
        description = "GPUs free for the new cluster (after reservations and headroom)"
    ),
    printcolumn(
        name = "GPUs Short",
        type_ = "string",
        json_path = ".status.capacity.gpusShort",
        description = "GPUs missing for the new cluster to fit"
    ),
    printcolumn(
        name = "Waiting For",
        type_ = "string",
        json_path = ".status.waitingFor",
        description = "Short reason the upgrade is not moving"
    ),
    // `-o wide` columns.
    printcolumn = r#"{"name":"CPU Needed","type":"string","jsonPath":".status.capacity.cpuNeeded","priority":1}"#,
    printcolumn = r#"{"name":"CPU Free","type":"string","jsonPath":".status.capacity.cpuFree","priority":1}"#,
    printcolumn = r#"{"name":"CPU Short","type":"string","jsonPath":".status.capacity.cpuShort","priority":1}"#,
    printcolumn = r#"{"name":"Memory Needed","type":"string","jsonPath":".status.capacity.memoryNeeded","priority":1}"#,
    printcolumn = r#"{"name":"Memory Free","type":"string","jsonPath":".status.capacity.memoryFree","priority":1}"#,
    printcolumn = r#"{"name":"Memory Short","type":"string","jsonPath":".status.capacity.memoryShort","priority":1}"#,
    printcolumn = r#"{"name":"KubeRay","type":"string","jsonPath":".status.kubeRayRelease.version","priority":1,"description":"KubeRay release whose rules apply"}"#,
    printcolumn = r#"{"name":"Capacity Request","type":"string","jsonPath":".status.capacityRequest.state","priority":1,"description":"What raygate asked the node autoscaler for (spec.capacity.request)"}"#,
    printcolumn = r#"{"name":"Quota GPUs Needed","type":"string","jsonPath":".status.quota.gpusNeeded","priority":1,"description":"GPUs of Kueue quota the new cluster needs in its ClusterQueue"}"#,
    printcolumn = r#"{"name":"Quota GPUs Left","type":"string","jsonPath":".status.quota.gpusLeft","priority":1,"description":"GPUs of Kueue quota left in the ClusterQueue, cohort borrowing included"}"#,
    printcolumn = r#"{"name":"Batch Release","type":"string","jsonPath":".status.batch.releaseTime","description":"When the gathered cluster changes are released to the gate (spec.batching)"}"#,
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct UpgradePlanSpec {
    /// The RayService (same namespace) whose upgrades this plan gates.
    /// Immutable: to gate another RayService, create another plan (raygate
    /// gives the first one's gate back when that plan is deleted).
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf",
        "message": "rayServiceRef is immutable; create another UpgradePlan instead"
    }]))]
    pub ray_service_ref: RayServiceRef,

    /// `Auto` admits a fitting upgrade; `Manual` admits only the change whose
    /// fingerprint is in `approve`; `Paused` admits nothing.
    #[serde(default)]
    pub policy: Policy,

    /// Fingerprint of the pending change to admit under `policy: Manual`
    /// (shown in `status.pendingChange.fingerprint`).
    pub approve: Option<String>,

    /// Higher priority plans are admitted first when capacity is contended.
    #[serde(default)]
    #[schemars(range(min = -1000, max = 1000))]
    pub priority: i32,

    /// Resources to always leave free cluster-wide, per resource name
    /// (`nvidia.com/gpu: 2` or `memory: 64Gi`). A name no node offers is
    /// reported (condition `ResourcesOffered`, Event `ResourceNotOffered`).
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "int_or_string_map"
    )]
    #[schemars(schema_with = "quantity_map_schema")]
    pub headroom: BTreeMap<String, String>,

    /// How long a transition may take before it is reported Stalled.
    /// At least `1m`: `0s` would report every transition Stalled at once.
    #[serde(default = "default_stall_after")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 72))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "duration(self) >= duration('1m')",
        "message": "stallAfter must be at least 1m"
    }]))]
    pub stall_after: String,

    /// When set, upgrades are admitted only inside one of these windows (in
    /// `timeZone`); at most 50.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub maintenance_windows: Vec<MaintenanceWindow>,

    /// Freezes: no upgrade is admitted while one of these is open, whatever
    /// the maintenance windows say (deny wins); at most 50.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub deny_windows: Vec<MaintenanceWindow>,

    /// The IANA time zone the window schedules are read in (`Europe/Berlin`);
    /// unset: `UTC`. A start that does not exist on a spring-forward night
    /// starts when the clocks have jumped, shifted by the gap; one that
    /// happens twice on a fall-back night starts at the first
    /// (docs/upgradeplan.md).
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$")
    )]
    pub time_zone: Option<String>,

    /// Asking the node autoscaler for the new cluster while the upgrade waits
    /// for capacity (docs/autoscaling.md).
    pub capacity: Option<CapacitySpec>,

    /// The strategy raygate admits upgrades with: the value it writes into the
    /// RayService's `spec.upgradeStrategy.type` when it opens the gate.
    /// `NewCluster`: a full second cluster, the whole new cluster must fit.
    /// `NewClusterWithIncrementalUpgrade` (KubeRay v1.5+, feature gate
    /// `RayServiceIncrementalUpgrade`, in-tree autoscaling, the RayService's
    /// `upgradeStrategy.clusterUpgradeOptions`, which stay the user's): only the
    /// surge must fit (docs/how-it-works.md).
    #[serde(default, skip_serializing_if = "PlanUpgradeType::is_new_cluster")]
    pub upgrade_type: PlanUpgradeType,

    /// Gather cluster-recreating changes into one new cluster: a change is
    /// held (phase `Batching`) until the cluster spec has been unchanged for
    /// `quietPeriod`, at most `maxDelay` after the batch's first change
    /// (docs/upgradeplan.md). Unset: the operator's
    /// `--default-batching-quiet-period` (default: no batching).
    pub batching: Option<BatchingSpec>,
}

/// `spec.upgradeType`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PlanUpgradeType {
    #[default]
    NewCluster,
    NewClusterWithIncrementalUpgrade,
}

impl PlanUpgradeType {
    fn is_new_cluster(&self) -> bool {
        *self == PlanUpgradeType::NewCluster
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PlanUpgradeType::NewCluster => "NewCluster",
            PlanUpgradeType::NewClusterWithIncrementalUpgrade => "NewClusterWithIncrementalUpgrade",
        }
    }
}

/// `spec.capacity`: how a plan waiting for capacity asks the node autoscaler
/// for it. Admission never depends on the answer: raygate still admits only
/// when the new cluster fits on Ready nodes.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacitySpec {
    /// `CapacityBuffer`: while the upgrade waits for capacity, raygate keeps one
    /// PodTemplate and one `autoscaling.x-k8s.io/v1beta1` CapacityBuffer per pod
    /// shape of the new cluster (and one for the headroom), so that Karpenter or
    /// cluster-autoscaler provisions it; they are deleted when the gate opens or
    /// the change goes. `None`: never. Unset: the operator's
    /// `--capacity-request-default` (default `None`).
    pub request: Option<CapacityRequestMode>,
    /// `spec.provisioningStrategy` of the CapacityBuffers. Unset:
    /// `buffer.x-k8s.io/active-capacity`, the only strategy open-source
    /// cluster-autoscaler honours.
    #[schemars(length(min = 1, max = 253))]
    pub provisioning_strategy: Option<String>,
    /// How long the autoscaler may take to deliver before the plan reports
    /// `CapacityNotDelivered` (condition, Event, alert); raygate keeps holding
    /// and the request stays open. Unset: the operator's
    /// `--capacity-max-wait` (default 15m).
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max_wait: Option<String>,
}

/// `spec.capacity.request`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CapacityRequestMode {
    None,
    CapacityBuffer,
}

fn default_stall_after() -> String {
    "30m".to_string()
}

/// Quantities as Kubernetes takes them everywhere else (`resources.requests`):
/// an integer or a string (`x-kubernetes-int-or-string`), so `nvidia.com/gpu: 2`
/// is accepted. The pattern applies to strings; `minimum` to integers.
fn quantity_map_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "x-kubernetes-int-or-string": true,
            "pattern": QUANTITY_PATTERN,
            "minimum": 0
        }
    })
}

/// A map of int-or-string quantities, each kept as its string (`2` → `"2"`).
fn int_or_string_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum IntOrString {
        Int(i64),
        Uint(u64),
        Str(String),
    }
    let m: BTreeMap<String, IntOrString> = Deserialize::deserialize(d)?;
    Ok(m.into_iter()
        .map(|(k, v)| {
            let v = match v {
                IntOrString::Int(i) => i.to_string(),
                IntOrString::Uint(u) => u.to_string(),
                IntOrString::Str(s) => s,
            };
            (k, v)
        })
        .collect())
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RayServiceRef {
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS1123_SUBDOMAIN))]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Policy {
    #[default]
    Auto,
    Manual,
    Paused,
}

/// A recurring window: starts whenever `schedule` (5-field cron, in the
/// plan's `timeZone`) matches and lasts `duration`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// `minute hour day-of-month month day-of-week`, e.g. `0 2 * * 1-5`.
    #[schemars(length(min = 9, max = 100))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": validation::CRON_RULE,
        "message": "schedule must be 5 cron fields (*, N, N-M, each with an optional /STEP, comma-separated): minute 0-59, hour 0-23, day of month 1-31, month 1-12, day of week 0-7"
    }]))]
    pub schedule: String,
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 72))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "duration(self) >= duration('1m') && duration(self) <= duration('744h')",
        "message": "duration must be between 1m and 744h (31 days)"
    }]))]
    pub duration: String,
}

/// Where an upgrade stands, as one word for `kubectl get`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum Phase {
    /// Nothing to upgrade.
    #[default]
    Idle,
    /// A change was detected and is being evaluated.
    Pending,
    /// `spec.batching`: the change is gathered with the next ones until the
    /// cluster spec is quiet (`status.batch.releaseTime`).
    Batching,
    WaitingForCapacity,
    /// Kueue manages the RayService and its ClusterQueue lacks the quota
    /// for the new cluster (the nodes may have room).
    WaitingForQuota,
    /// The serving cluster is suspended (`rayClusterConfig.suspend`), or
    /// KubeRay is suspending it in place: no pod serves.
    Suspended,
    /// `policy: Manual` and the pending change is not approved.
    WaitingForApproval,
    /// `policy: Paused`: nothing is admitted until the policy changes.
    Paused,
    /// Admitted; KubeRay has not named the new cluster yet.
    Admitted,
    /// The second cluster exists and the transition is under way.
    Upgrading,
    Stalled,
    Completed,
    Error,
}

impl Phase {
    pub const ALL: [Phase; 13] = [
        Phase::Idle,
        Phase::Pending,
        Phase::Batching,
        Phase::WaitingForCapacity,
        Phase::WaitingForQuota,
        Phase::Suspended,
        Phase::WaitingForApproval,
        Phase::Paused,
        Phase::Admitted,
        Phase::Upgrading,
        Phase::Stalled,
        Phase::Completed,
        Phase::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "Idle",
            Phase::Pending => "Pending",
            Phase::Batching => "Batching",
            Phase::WaitingForCapacity => "WaitingForCapacity",
            Phase::WaitingForQuota => "WaitingForQuota",
            Phase::Suspended => "Suspended",
            Phase::WaitingForApproval => "WaitingForApproval",
            Phase::Paused => "Paused",
            Phase::Admitted => "Admitted",
            Phase::Upgrading => "Upgrading",
            Phase::Stalled => "Stalled",
            Phase::Completed => "Completed",
            Phase::Error => "Error",
        }
    }

    /// Phases in which an admitted upgrade holds a reservation or a running transition.
    pub fn is_in_flight(self) -> bool {
        matches!(self, Phase::Admitted | Phase::Upgrading | Phase::Stalled)
    }
}

#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradePlanStatus {
    #[serde(default)]
    pub phase: Phase,
    /// The RayService whose gate this plan holds. Recorded so that a plan
    /// that stops governing it (its reference changed, another plan governs
    /// it) gives that gate back first.
    pub ray_service: Option<String>,
    /// That RayService's `metadata.uid` when it was last read. A RayService
    /// deleted and recreated under the same name has another: what the plan
    /// recorded about the old one (an admission, a transition, a pending
    /// change) is ended, never completed by the new one's clusters.
    #[serde(rename = "rayServiceUID")]
    pub ray_service_uid: Option<String>,
    /// The priority raygate ranks this plan by: `spec.priority` capped by
    /// the operator's ceiling for the namespace (`--max-priority`).
    pub effective_priority: Option<i32>,
    pub observed_generation: Option<i64>,
    /// Ready, CapacityAvailable, UpgradeAdmitted, Stalled, GateOverridden, KubeRayRelease,
    /// CapacityRequested, ResourcesOffered, ApprovalMatched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// One short phrase for the printer column (`capacity: nvidia.com/gpu 8`).
    pub waiting_for: Option<String>,
    /// The longer explanation of the current phase.
    pub message: Option<String>,
    pub pending_change: Option<PendingChange>,
    /// The change raygate let through; present from admission until the
    /// transition ends. While it is present, the new cluster's unbound pods
    /// (rebuilt from the RayService spec) are part of the cluster-wide ledger.
    pub admitted: Option<Admission>,
    pub capacity: Option<CapacityStatus>,
    pub active_cluster: Option<String>,
    pub pending_cluster: Option<String>,
    pub last_transition: Option<TransitionRecord>,
    /// The KubeRay release whose rules raygate applies to the RayService, and
    /// where it was read.
    pub kube_ray_release: Option<KubeRayReleaseStatus>,
    /// What raygate asked the node autoscaler for, and what it reports
    /// (`spec.capacity.request`); absent when nothing is asked.
    pub capacity_request: Option<CapacityRequestStatus>,
    /// An incremental upgrade's step, target capacity and surge held
    /// (`spec.upgradeType: NewClusterWithIncrementalUpgrade`).
    pub incremental: Option<IncrementalStatus>,
    /// The cluster changes gathered for the next new cluster (`spec.batching`),
    /// or made while a transition runs (the next batch).
    pub batch: Option<BatchStatus>,
    /// Whether the maintenance and deny windows let an upgrade start now,
    /// why not, and when that changes (`nextOpen`, `nextClose`).
    pub windows: Option<WindowsStatus>,
    /// The RayService is Kueue-managed: the quota its new cluster needs in
    /// its ClusterQueue, what is left, and raygate's reservation there.
    pub quota: Option<QuotaStatus>,
}

/// `status.quota`: Kueue's quota as a capacity dimension (docs/kueue.md).
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaStatus {
    /// The RayService's `kueue.x-k8s.io/queue-name`.
    pub local_queue: String,
    /// The LocalQueue's ClusterQueue, once read.
    pub cluster_queue: Option<String>,
    /// The ClusterQueue's cohort, whose members' unused lendable quota counts.
    pub cohort: Option<String>,
    /// Per resource the new cluster requests: needed, left, and the flavor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<QuotaResourceStatus>,
    /// GPUs (all accelerator resources) needed and left: printer columns.
    pub gpus_needed: Option<String>,
    pub gpus_left: Option<String>,
    /// raygate's reservation Workload for the change (owned by this plan).
    pub reservation: Option<QuotaReservation>,
    /// The pending RayCluster for which raygate had Kueue derive the
    /// RayService's Workload again (docs/kueue.md): an elastic RayService's
    /// Workload is not re-derived on a cluster change, and Kueue's
    /// elastic-job scheduling gate keeps the new cluster's pods unscheduled.
    pub workload_refreshed_for: Option<String>,
}

#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaResourceStatus {
    pub name: String,
    /// The ResourceFlavor it was counted in; absent when the ClusterQueue
    /// does not cover the resource (Kueue admits nothing that requests it).
    pub flavor: Option<String>,
    pub needed: String,
    pub left: String,
    /// Of `left`, what the cohort would lend.
    pub borrowable: String,
}

/// raygate's Workload that holds the new cluster's quota in Kueue for the
/// transition; Kueue admitting it is the quota granted.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaReservation {
    pub workload: String,
    /// The change it reserves for.
    pub fingerprint: String,
    /// Kueue admitted it (`QuotaReserved` or `Admitted` is `True`).
    pub granted: bool,
}

impl UpgradePlanStatus {
    /// Waiting in the admission queue: held for capacity alone
    /// (`WaitingForCapacity`) and not admitted. Only such a plan competes for
    /// capacity in the controller's admission pass and has a place in
    /// `kubectl raygate queue`; a change held for approval, by a pause, a
    /// maintenance window, an overridden gate or an error waits outside it.
    pub fn queued_for_capacity(&self) -> bool {
        self.phase == Phase::WaitingForCapacity && self.admitted.is_none()
    }
}

/// The KubeRay release raygate applies, as recorded in status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeRayReleaseStatus {
    /// The release whose rules apply (`v1.6.2`).
    pub version: String,
    /// Where it was read: `RayCluster` (the newest `ray.io/kuberay-version` the
    /// operator stamped on the namespace's RayClusters), `OtherNamespace` (no
    /// RayCluster here yet: the newest stamp elsewhere), `Flag`
    /// (`--kuberay-version`, nothing stamped) or `Default` (the newest release
    /// raygate knows).
    #[schemars(extend("enum" = ["RayCluster", "OtherNamespace", "Flag", "Default"]))]
    pub source: String,
}

/// The types of `status.conditions`, spelled once for the decision that sets
/// them and the controller that reads them back.
pub mod condition {
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
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingChange {
    /// Stable hash of the new cluster config (muted fields excluded).
    pub fingerprint: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub triggering_paths: Vec<String>,
    /// RFC 3339 time the change was first seen; waiting time counts from here.
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub detected_time: Timestamp,
}

#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    pub fingerprint: String,
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub admitted_time: Timestamp,
    /// The active cluster when the upgrade was admitted: the one to retire.
    pub from_cluster: Option<String>,
    /// The pending cluster KubeRay created for this admission, once named.
    pub to_cluster: Option<String>,
    /// Incremental upgrades: what the transition may hold per pod group,
    /// reserved until it ends (empty for `NewCluster`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub surge: Vec<SurgeBudget>,
}

/// The pods of one group an incremental transition may hold at its peak.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SurgeBudget {
    /// `head`, or the worker group's name.
    pub group: String,
    /// Pods of this group the RayService may hold: with `sharesActive`, the
    /// active cluster's pods of the group count against it (a pod the
    /// autoscaler removes there frees room the new cluster takes); without
    /// (the head, a new group, a group whose pods grew), only the new
    /// cluster's pods.
    pub pods: i64,
    pub shares_active: bool,
}

/// `status.incremental`: an incremental upgrade's progress, as KubeRay reports it
/// on the RayService.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IncrementalStatus {
    pub max_surge_percent: i32,
    pub step_size_percent: i32,
    pub interval_seconds: i32,
    /// `3/4`: steps of `stepSizePercent` the traffic moved, of all.
    pub step: Option<String>,
    /// The new cluster's Serve `target_capacity` (percent).
    pub target_capacity: Option<i32>,
    /// Traffic routed to the new cluster (percent).
    pub traffic_routed_percent: Option<i32>,
    /// The old cluster's Serve `target_capacity` (percent).
    pub active_target_capacity: Option<i32>,
    /// What raygate reserves beyond the old cluster for the transition.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub surge_held: BTreeMap<String, String>,
    /// When the transition last moved (target capacity or traffic); a step
    /// that does not move for `stallAfter` is a stall.
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub last_progress_time: Option<Timestamp>,
}

#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityStatus {
    /// Old plus new cluster requests, per resource: the transition's peak.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub required: BTreeMap<String, String>,
    /// Requests of the new cluster alone, per resource.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub needed: BTreeMap<String, String>,
    /// Free on schedulable nodes, before this upgrade, per resource.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub free: BTreeMap<String, String>,
    /// Free for the new cluster: `free` minus `reserved` and the headroom,
    /// per resource of `needed`; `needed − available` is the shortfall.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub available: BTreeMap<String, String>,
    /// Reserved by other admitted upgrades whose pods are not bound yet.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reserved: BTreeMap<String, String>,
    /// How much more is needed for the new cluster to fit, per resource.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shortfall: BTreeMap<String, String>,
    /// GPUs (all accelerator resources) of `needed`, `available`,
    /// `shortfall` and `required`: printer columns that compare at a glance.
    pub gpus_needed: Option<String>,
    pub gpus_free: Option<String>,
    pub gpus_short: Option<String>,
    pub gpus_peak: Option<String>,
    pub cpu_needed: Option<String>,
    pub cpu_free: Option<String>,
    pub cpu_short: Option<String>,
    pub memory_needed: Option<String>,
    pub memory_free: Option<String>,
    pub memory_short: Option<String>,
    /// Pods that could not be placed, with the scheduler-style reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unplaced: Vec<String>,
}

#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransitionRecord {
    pub fingerprint: String,
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub start: Timestamp,
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub end: Option<Timestamp>,
    /// `Completed`; `Abandoned` when KubeRay dropped the new cluster unpromoted;
    /// `Replaced` when the RayService was deleted and recreated meanwhile.
    #[schemars(with = "Option<String>", extend("enum" = ["Completed", "Abandoned", "Replaced"]))]
    pub outcome: Option<TransitionOutcome>,
    pub duration_seconds: Option<i64>,
}

/// How a transition ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransitionOutcome {
    /// The new cluster was promoted and the old one is gone.
    Completed,
    /// KubeRay dropped the new cluster without promoting it.
    Abandoned,
    /// The RayService was deleted and recreated under the same name (another
    /// UID) during the transition: it did not finish, it ended.
    Replaced,
}

/// `status.capacityRequest`: the CapacityBuffers kept for the pending change.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityRequestStatus {
    /// `Requested`: the buffers exist; `Queued`: behind other plans'
    /// requests (`--max-open-capacity-requests`); `NotDelivered`: requested
    /// longer than `spec.capacity.maxWait` ago; `Failed`: they could not be
    /// created (the message says why).
    #[schemars(with = "String", extend("enum" = ["Requested", "Queued", "NotDelivered", "Failed"]))]
    pub state: CapacityRequestState,
    /// The pending change the request is for.
    pub fingerprint: String,
    /// When the oldest buffer of this change was created.
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub requested_time: Option<Timestamp>,
    /// `Queued`: 1-based place among the plans waiting for a request.
    // `int64` in the schema: the apiserver knows no `uint32` and warns on
    // every CRD apply about a format it does not know.
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub queue_position: Option<u32>,
    /// The CapacityBuffers and what the autoscaler reports on each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buffers: Vec<BufferStatus>,
    pub message: Option<String>,
}

/// `status.capacityRequest.state`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CapacityRequestState {
    #[default]
    Requested,
    Queued,
    NotDelivered,
    Failed,
}

impl CapacityRequestState {
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityRequestState::Requested => "Requested",
            CapacityRequestState::Queued => "Queued",
            CapacityRequestState::NotDelivered => "NotDelivered",
            CapacityRequestState::Failed => "Failed",
        }
    }
}

/// One CapacityBuffer of a request, with its `Provisioning` condition as the
/// autoscaler wrote it (Karpenter: `True` fits existing capacity, `False`
/// `RequiresNewCapacity` with "x/n virtual pods required new capacity, f failed";
/// cluster-autoscaler: `True` only means processed). Reported, never admitted on.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BufferStatus {
    pub name: String,
    /// Pods of this shape asked for (`spec.replicas`).
    pub replicas: i32,
    /// `ReadyForProvisioning` is not `True` (the autoscaler could not read the
    /// buffer or its PodTemplate): its reason and message.
    pub not_ready: Option<String>,
    /// `Provisioning` condition: status, reason and message.
    pub provisioning: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// The CRD as committed under `crds/` and shipped in the chart.
pub fn crd_yaml() -> crate::Result<String> {
    use kube::CustomResourceExt;
    let yaml = serde_saphyr::to_string(&UpgradePlan::crd())
        .map_err(|e| crate::Error::invalid("UpgradePlan CRD", e.to_string()))?;
    Ok(format!(
        "# Generated by `raygate crd`; do not edit.\n---\n{yaml}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn only_a_change_waiting_for_capacity_alone_is_queued() {
        for phase in Phase::ALL {
            let s = UpgradePlanStatus {
                phase,
                ..Default::default()
            };
            assert_eq!(
                s.queued_for_capacity(),
                phase == Phase::WaitingForCapacity,
                "{phase:?}"
            );
        }
        let admitted = UpgradePlanStatus {
            phase: Phase::WaitingForCapacity,
            admitted: Some(Admission::default()),
            ..Default::default()
        };
        assert!(!admitted.queued_for_capacity());
    }

    #[test]
    fn committed_crd_is_current() {
        let committed = include_str!("../crds/raygate.io_upgradeplans.yaml");
        assert!(
            committed == crd_yaml().unwrap(),
            "crds/raygate.io_upgradeplans.yaml is stale: run `cargo run -- crd > crds/raygate.io_upgradeplans.yaml`"
        );
    }

    #[test]
    fn spec_defaults_fill_in() {
        let spec: UpgradePlanSpec =
            serde_json::from_value(serde_json::json!({"rayServiceRef": {"name": "llm"}})).unwrap();
        assert_eq!(spec.policy, Policy::Auto);
        assert_eq!(spec.stall_after, "30m");
        assert_eq!(spec.priority, 0);
    }

    #[test]
    fn status_times_keep_their_precision_and_absent_fields_are_left_out() {
        let t: Timestamp = "2026-12-02T12:00:00.123456789Z".parse().unwrap();
        let status = UpgradePlanStatus {
            admitted: Some(Admission {
                fingerprint: "abc".into(),
                admitted_time: t,
                from_cluster: Some("llm-a".into()),
                to_cluster: None,
                surge: vec![],
            }),
            last_transition: Some(TransitionRecord {
                fingerprint: "abc".into(),
                start: t,
                end: None,
                outcome: Some(TransitionOutcome::Abandoned),
                duration_seconds: None,
            }),
            ..Default::default()
        };
        let v = serde_json::to_value(&status).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"phase": "Idle",
                "admitted": {"fingerprint": "abc", "admittedTime": "2026-12-02T12:00:00.123456789Z",
                             "fromCluster": "llm-a"},
                "lastTransition": {"fingerprint": "abc", "start": "2026-12-02T12:00:00.123456789Z",
                                   "outcome": "Abandoned"}})
        );
        let back: UpgradePlanStatus = serde_json::from_value(v).unwrap();
        assert_eq!(back, status);
        let spec = serde_json::to_value(UpgradePlanSpec {
            ray_service_ref: RayServiceRef { name: "llm".into() },
            policy: Policy::Auto,
            approve: None,
            priority: 0,
            headroom: BTreeMap::new(),
            stall_after: "30m".into(),
            maintenance_windows: vec![],
            deny_windows: vec![],
            time_zone: None,
            capacity: None,
            upgrade_type: PlanUpgradeType::NewCluster,
            batching: None,
        })
        .unwrap();
        assert_eq!(
            spec,
            serde_json::json!({"rayServiceRef": {"name": "llm"}, "policy": "Auto",
                               "priority": 0, "stallAfter": "30m"})
        );
    }

    #[test]
    fn crd_has_printer_columns_and_status() {
        let crd = UpgradePlan::crd();
        let v = &crd.spec.versions[0];
        let cols: Vec<_> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            cols,
            [
                "RayService",
                "Phase",
                "GPUs Needed",
                "GPUs Free",
                "GPUs Short",
                "Waiting For",
                "CPU Needed",
                "CPU Free",
                "CPU Short",
                "Memory Needed",
                "Memory Free",
                "Memory Short",
                "KubeRay",
                "Capacity Request",
                "Quota GPUs Needed",
                "Quota GPUs Left",
                "Batch Release",
                "Age"
            ]
        );
        assert!(v.subresources.as_ref().unwrap().status.is_some());
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["uplan".to_string()][..])
        );
    }

    /// Status times and outcomes are typed when read: the apiserver must refuse a value that
    /// would not deserialise, or one hand-edited plan would break the watch of every plan.
    #[test]
    fn crd_lets_the_apiserver_refuse_status_values_raygate_could_not_read() {
        let crd = serde_json::to_value(UpgradePlan::crd()).unwrap();
        let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"];
        for path in [
            "/pendingChange/properties/detectedTime",
            "/admitted/properties/admittedTime",
            "/lastTransition/properties/start",
            "/lastTransition/properties/end",
        ] {
            let field = status.pointer(path).unwrap_or_else(|| panic!("{path}"));
            assert_eq!(field["format"], "date-time", "{path}: {field}");
        }
        assert_eq!(
            status
                .pointer("/lastTransition/properties/outcome/enum")
                .unwrap(),
            &serde_json::json!(["Completed", "Abandoned", "Replaced"])
        );
    }

    /// `headroom: {nvidia.com/gpu: 2}` is what users write (as in pod
    /// resources): the schema takes integers and strings, raygate reads both.
    #[test]
    fn headroom_takes_integers_and_strings() {
        let crd = serde_json::to_value(UpgradePlan::crd()).unwrap();
        let h = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["headroom"]["additionalProperties"];
        assert_eq!(h["x-kubernetes-int-or-string"], true, "{h}");
        assert!(h.get("type").is_none(), "int-or-string has no type: {h}");
        assert_eq!(h["pattern"], QUANTITY_PATTERN, "{h}");
        assert_eq!(h["minimum"].as_f64(), Some(0.0), "{h}");
        let spec: UpgradePlanSpec = serde_json::from_value(serde_json::json!({
            "rayServiceRef": {"name": "llm"},
            "headroom": {"nvidia.com/gpu": 2, "memory": "64Gi"}
        }))
        .unwrap();
        assert_eq!(spec.headroom["nvidia.com/gpu"], "2");
        assert_eq!(spec.headroom["memory"], "64Gi");
        let yaml: UpgradePlanSpec =
            serde_saphyr::from_str("rayServiceRef: {name: llm}\nheadroom: {nvidia.com/gpu: 2}\n")
                .unwrap();
        assert_eq!(yaml.headroom["nvidia.com/gpu"], "2");
    }

    #[test]
    fn schema_patterns_accept_what_users_write() {
        let quantity = regex::Regex::new(QUANTITY_PATTERN).unwrap();
        for good in ["1", "500m", "1Gi", "1.5", "2e3", "8", ".5", "+1"] {
            assert!(quantity.is_match(good), "{good}");
        }
        for bad in ["", "1 Gi", "Gi", "1KiB", "1.5.5", "0x10", "-4", "-0.5"] {
            assert!(!quantity.is_match(bad), "{bad}");
        }
        let duration = regex::Regex::new(DURATION_PATTERN).unwrap();
        for good in ["30m", "1h30m", "90s", "2h"] {
            assert!(duration.is_match(good), "{good}");
        }
        for bad in [
            "",
            "30",
            "1d",
            "m",
            "1h 30m",
            "99999999999999999999h",
            "1h1h1h1h1h",
        ] {
            assert!(!duration.is_match(bad), "{bad}");
        }
        let dns = regex::Regex::new(DNS1123_SUBDOMAIN).unwrap();
        for good in ["llm", "chat-v2", "a.b-c"] {
            assert!(dns.is_match(good), "{good}");
        }
        for bad in ["", "LLM", "x\nforged log line", "-a", "a_b", "a..b"] {
            assert!(!dns.is_match(bad), "{bad}");
        }
    }

    #[test]
    fn ray_service_ref_is_immutable_and_a_dns_name() {
        let crd = serde_json::to_value(UpgradePlan::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let r = &spec["properties"]["rayServiceRef"];
        assert_eq!(
            r["x-kubernetes-validations"][0]["rule"], "self == oldSelf",
            "{r}"
        );
        assert_eq!(r["properties"]["name"]["pattern"], DNS1123_SUBDOMAIN, "{r}");
        assert!(
            spec["properties"].get("onStall").is_none(),
            "onStall is gone"
        );
    }

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
