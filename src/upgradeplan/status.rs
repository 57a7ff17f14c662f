//! `UpgradePlan.status`: raygate's own record. Everything the controller
//! needs to resume after a restart (admitted fingerprint, reservation,
//! transition start) lives here, never in memory.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use super::{BatchStatus, Fingerprint, WindowsStatus};
use crate::kuberay::ReleaseSource;

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
    pub fingerprint: Fingerprint,
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
    pub source: ReleaseSource,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingChange {
    /// Stable hash of the new cluster config (muted fields excluded).
    pub fingerprint: Fingerprint,
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
    pub fingerprint: Fingerprint,
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
    pub fingerprint: Fingerprint,
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
    pub fingerprint: Fingerprint,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
