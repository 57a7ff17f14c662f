//! `UpgradePlan.spec`: the user's intent (policy, priority, headroom, stall
//! rules, windows, capacity requests, batching), and the CRD glue the
//! `CustomResource` derive generates from it.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use super::{
    BatchingSpec, DNS1123_SUBDOMAIN, DURATION_PATTERN, Fingerprint, QUANTITY_PATTERN,
    UpgradePlanStatus, validation,
};

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
    pub approve: Option<Fingerprint>,

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
