//! Partial, lenient typed views of KubeRay's `ray.io/v1` `RayService` and `RayCluster`.
//!
//! Only the fields raygate reads are typed; everything else is kept in an `extra` map on
//! every struct (`#[serde(flatten)]`), so a deserialize → serialize round trip loses
//! nothing at our levels. Every field is optional, so odd or partial objects still
//! deserialize; the functions that need a field report a clear [`crate::Error`] when it
//! is missing. Pod templates use `k8s-openapi` types (which accept numeric quantities).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{PodTemplateSpec, ResourceRequirements};
use kube::CustomResource;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use serde_with::skip_serializing_none;

/// Annotation KubeRay's RayService controller puts on every RayCluster it creates: the
/// hash of the RayService's `rayClusterConfig` with the muted fields cleared
/// (`utils.HashWithoutReplicasAndWorkersToDeleteKey`, v1.1.0+).
pub const ANNOTATION_HASH: &str = "ray.io/hash-without-replicas-and-workers-to-delete";
/// Annotation with the operator version that created / last updated the RayCluster
/// (`utils.KubeRayVersion`, value `utils.KUBERAY_VERSION` e.g. `v1.7.0`; v1.2.0+).
pub const ANNOTATION_KUBERAY_VERSION: &str = "ray.io/kuberay-version";
/// Annotation with the number of worker groups at creation / last update, used for the
/// "worker groups appended" in-place update (`utils.NumWorkerGroupsKey`, v1.1.0+).
pub const ANNOTATION_NUM_WORKER_GROUPS: &str = "ray.io/num-worker-groups";
/// Label on a RayCluster: name of the custom resource that created it
/// (`utils.RayOriginatedFromCRNameLabelKey`).
pub const LABEL_ORIGINATED_FROM_CR_NAME: &str = "ray.io/originated-from-cr-name";
/// Label on a RayCluster: kind of the custom resource that created it, e.g. `RayService`
/// (`utils.RayOriginatedFromCRDLabelKey`).
pub const LABEL_ORIGINATED_FROM_CRD: &str = "ray.io/originated-from-crd";
/// Pod labels naming a pod's cluster and group, kept below `kuberay` and
/// `capacity` (the index keys pods by them).
pub use crate::podgroup::{LABEL_CLUSTER, LABEL_GROUP, LABEL_NODE_TYPE};
/// Pod label: always `yes` (`utils.RayNodeLabelKey`).
pub const LABEL_IS_RAY_NODE: &str = "ray.io/is-ray-node";
/// Pod label: `<cluster>-head` / `<cluster>-worker` (`utils.RayIDLabelKey`).
pub const LABEL_IDENTIFIER: &str = "ray.io/identifier";
/// `ray.io/group` value of the head pod (`utils.RayNodeHeadGroupLabelValue`).
pub const HEAD_GROUP_LABEL_VALUE: &str = "headgroup";
/// RayService condition type set while a new cluster is being prepared (v1.3.0+).
pub const CONDITION_UPGRADE_IN_PROGRESS: &str = "UpgradeInProgress";
/// RayService condition type set while an incremental upgrade is rolled back (v1.6.0+).
pub const CONDITION_ROLLBACK_IN_PROGRESS: &str = "RollbackInProgress";

type Extra = Map<String, Value>;

// Every `Option` field below is left out when `None` (`#[skip_serializing_none]`), as Go's
// `omitempty` pointers are: a round trip adds no `null`s.

/// `RayService.spec`.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "ray.io",
    version = "v1",
    kind = "RayService",
    namespaced,
    status = "RayServiceStatuses",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct RayServiceSpec {
    #[serde(default)]
    pub ray_cluster_config: Option<RayClusterSpec>,
    /// Serve config as a YAML string (`serveConfigV2`).
    #[serde(default)]
    pub serve_config_v2: Option<String>,
    #[serde(default)]
    pub upgrade_strategy: Option<RayServiceUpgradeStrategy>,
    #[serde(default)]
    pub ray_cluster_deletion_delay_seconds: Option<i64>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `RayService.spec.upgradeStrategy`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayServiceUpgradeStrategy {
    #[serde(rename = "type", default)]
    pub type_: Option<UpgradeType>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `RayService.spec.upgradeStrategy.type`. Unknown strings are kept verbatim.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum UpgradeType {
    /// `None`: never prepare a new RayCluster (v1.3.0+).
    None,
    /// `NewCluster`: blue/green upgrade with a full second cluster (v1.3.0+).
    NewCluster,
    /// `NewClusterWithIncrementalUpgrade`: second cluster scaled up gradually (v1.5.0+,
    /// behind the `RayServiceIncrementalUpgrade` feature gate).
    NewClusterWithIncrementalUpgrade,
    /// Anything else, verbatim.
    Other(String),
}

impl UpgradeType {
    pub fn as_str(&self) -> &str {
        match self {
            UpgradeType::None => "None",
            UpgradeType::NewCluster => "NewCluster",
            UpgradeType::NewClusterWithIncrementalUpgrade => "NewClusterWithIncrementalUpgrade",
            UpgradeType::Other(s) => s,
        }
    }
}

impl From<&str> for UpgradeType {
    fn from(s: &str) -> Self {
        match s {
            "None" => UpgradeType::None,
            "NewCluster" => UpgradeType::NewCluster,
            "NewClusterWithIncrementalUpgrade" => UpgradeType::NewClusterWithIncrementalUpgrade,
            other => UpgradeType::Other(other.to_string()),
        }
    }
}

impl fmt::Display for UpgradeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for UpgradeType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for UpgradeType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(UpgradeType::from(s.as_str()))
    }
}

/// `RayService.status`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayServiceStatuses {
    #[serde(default)]
    pub active_service_status: Option<RayServiceStatus>,
    #[serde(default)]
    pub pending_service_status: Option<RayServiceStatus>,
    #[serde(default)]
    pub conditions: Option<Vec<Condition>>,
    #[serde(default)]
    pub service_status: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `RayService.status.activeServiceStatus` / `pendingServiceStatus`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayServiceStatus {
    #[serde(default)]
    pub ray_cluster_name: Option<String>,
    #[serde(default)]
    pub application_statuses: Option<BTreeMap<String, AppStatus>>,
    /// Serve `target_capacity` (percent) during an incremental upgrade (v1.5+).
    #[serde(default)]
    pub target_capacity: Option<i32>,
    /// Traffic routed to this cluster (percent) during an incremental upgrade (v1.5+).
    #[serde(default)]
    pub traffic_routed_percent: Option<i32>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// One Serve application's status.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AppStatus {
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub serve_deployment_statuses: Option<BTreeMap<String, ServeDeploymentStatus>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// One Serve deployment's status.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServeDeploymentStatus {
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// The `metav1.Condition` shape, lenient (every field optional, times kept as strings).
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type", default)]
    pub type_: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub last_transition_time: Option<String>,
    #[serde(default)]
    pub observed_generation: Option<i64>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `RayCluster.spec`, also `RayService.spec.rayClusterConfig`.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "ray.io",
    version = "v1",
    kind = "RayCluster",
    namespaced,
    status = "RayClusterStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct RayClusterSpec {
    #[serde(default)]
    pub head_group_spec: Option<HeadGroupSpec>,
    #[serde(default)]
    pub worker_group_specs: Option<Vec<WorkerGroupSpec>>,
    /// `*bool` in Go: `false` is kept by Go's JSON (not omitted).
    #[serde(default)]
    pub enable_in_tree_autoscaling: Option<bool>,
    #[serde(default)]
    pub autoscaler_options: Option<AutoscalerOptions>,
    #[serde(default)]
    pub suspend: Option<bool>,
    #[serde(default)]
    pub ray_version: Option<String>,
    /// Cluster-level upgrade strategy (`Recreate` | `None`, v1.6.0+).
    #[serde(default)]
    pub upgrade_strategy: Option<RayClusterUpgradeStrategy>,
    #[serde(flatten)]
    pub extra: Extra,
    /// Set only by [`super::budget::prune`], on a spec raygate would not keep
    /// whole: never read from nor written to the API.
    #[serde(skip)]
    pub over_budget: Option<super::over_budget::OverBudget>,
}

/// `headGroupSpec`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeadGroupSpec {
    #[serde(default)]
    pub template: Option<PodTemplateSpec>,
    #[serde(default)]
    pub ray_start_params: Option<BTreeMap<String, Value>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// One entry of `workerGroupSpecs`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerGroupSpec {
    #[serde(default)]
    pub group_name: Option<String>,
    #[serde(default)]
    pub replicas: Option<i32>,
    #[serde(default)]
    pub min_replicas: Option<i32>,
    #[serde(default)]
    pub max_replicas: Option<i32>,
    #[serde(default)]
    pub num_of_hosts: Option<i32>,
    #[serde(default)]
    pub suspend: Option<bool>,
    #[serde(default)]
    pub scale_strategy: Option<ScaleStrategy>,
    #[serde(default)]
    pub template: Option<PodTemplateSpec>,
    #[serde(default)]
    pub ray_start_params: Option<BTreeMap<String, Value>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `workerGroupSpecs[].scaleStrategy`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleStrategy {
    #[serde(default)]
    pub workers_to_delete: Option<Vec<String>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `autoscalerOptions`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalerOptions {
    /// Replaces the autoscaler sidecar's whole `resources` when set.
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `RayCluster.spec.upgradeStrategy` (v1.6.0+).
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayClusterUpgradeStrategy {
    #[serde(rename = "type", default)]
    pub type_: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `RayCluster.status`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayClusterStatus {
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub conditions: Option<Vec<Condition>>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl RayService {
    /// `spec.rayClusterConfig`, or a clear error naming the object.
    pub fn cluster_config(&self) -> crate::Result<&RayClusterSpec> {
        self.spec.ray_cluster_config.as_ref().ok_or_else(|| {
            crate::Error::invalid(
                format!("RayService {}", object_name(&self.metadata)),
                "spec.rayClusterConfig is missing",
            )
        })
    }

    /// Whether `status.conditions` has `type` with status `True`.
    pub fn condition_true(&self, type_: &str) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_.as_deref() == Some(type_) && c.status.as_deref() == Some("True")
                })
            })
    }
}

impl RayCluster {
    /// A metadata annotation, if present.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }
}

/// `namespace/name` (or what is known of it) for messages.
pub(crate) fn object_name(meta: &kube::api::ObjectMeta) -> String {
    match (&meta.namespace, &meta.name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.clone(),
        _ => "<unnamed>".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVC: &str = r#"{
      "apiVersion": "ray.io/v1", "kind": "RayService",
      "metadata": {"name": "llm", "namespace": "ml"},
      "spec": {
        "serveConfigV2": "applications: []\n",
        "upgradeStrategy": {"type": "SomethingNew", "clusterUpgradeOptions": {"maxSurgePercent": 50}},
        "excludeHeadPodFromServeSvc": true,
        "rayClusterConfig": {
          "rayVersion": "2.41.0",
          "futureField": {"x": 1},
          "headGroupSpec": {"rayStartParams": {"num-cpus": "0"}, "serviceType": "ClusterIP",
            "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.41.0"}]}}},
          "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "idleTimeoutSeconds": 60,
            "scaleStrategy": {"workersToDelete": ["a"], "later": true},
            "template": {"spec": {"containers": [{"name": "ray-worker", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}]
        }
      },
      "status": {"serviceStatus": "Running", "observedGeneration": 3,
        "activeServiceStatus": {"rayClusterName": "llm-abc", "applicationStatuses": {"app": {"status": "RUNNING", "healthLastUpdateTime": "x",
           "serveDeploymentStatuses": {"d": {"status": "HEALTHY", "replicas": 2}}}}},
        "conditions": [{"type": "Ready", "status": "True", "reason": "x", "lastTransitionTime": "2024-01-01T00:00:00Z"}]}
    }"#;

    #[test]
    fn round_trip_keeps_unknown_fields() {
        let v: Value = serde_json::from_str(SVC).unwrap();
        let svc: RayService = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(
            svc.spec.upgrade_strategy.as_ref().unwrap().type_,
            Some(UpgradeType::Other("SomethingNew".into()))
        );
        let back = serde_json::to_value(&svc).unwrap();
        // numeric quantity becomes a string in k8s-openapi: compare everything else.
        let mut expected = v.clone();
        expected["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]
            [0]["resources"]["limits"]["nvidia.com/gpu"] = Value::from("1");
        assert_eq!(back, expected);
        assert!(svc.condition_true("Ready"));
        assert!(!svc.condition_true(CONDITION_UPGRADE_IN_PROGRESS));
    }

    #[test]
    fn odd_objects_deserialize() {
        let svc: RayService = serde_json::from_str(
            r#"{"apiVersion":"ray.io/v1","kind":"RayService","metadata":{"name":"x"},"spec":{}}"#,
        )
        .unwrap();
        let err = svc.cluster_config().unwrap_err().to_string();
        assert!(err.contains("rayClusterConfig"), "{err}");
        let rc: RayCluster = serde_json::from_str(
            r#"{"apiVersion":"ray.io/v1","kind":"RayCluster","metadata":{"name":"c","annotations":{"ray.io/kuberay-version":"v1.7.0"}},
                "spec":{"workerGroupSpecs":[{}]}, "status": {"state": "ready", "readyWorkerReplicas": 2}}"#,
        )
        .unwrap();
        assert_eq!(rc.annotation(ANNOTATION_KUBERAY_VERSION), Some("v1.7.0"));
        assert_eq!(rc.status.as_ref().unwrap().state.as_deref(), Some("ready"));
        let back = serde_json::to_value(&rc).unwrap();
        assert_eq!(back["status"]["readyWorkerReplicas"], 2);
    }

    /// Numbers under resource lists become strings in k8s-openapi's Quantity.
    fn stringify_quantities(v: &mut Value, key: Option<&str>) {
        match v {
            Value::Object(m) => {
                for (k, child) in m.iter_mut() {
                    if matches!(key, Some("limits" | "requests" | "overhead")) && child.is_number()
                    {
                        *child = Value::from(child.to_string());
                    } else {
                        stringify_quantities(child, Some(k));
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|e| stringify_quantities(e, key)),
            _ => {}
        }
    }

    #[test]
    fn fixtures_round_trip() {
        for (name, text) in [
            (
                "rayservice-llm",
                include_str!("../../tests/fixtures/rayservice-llm.yaml"),
            ),
            (
                "raycluster-llm-active",
                include_str!("../../tests/fixtures/raycluster-llm-active.yaml"),
            ),
            (
                "raycluster-multihost",
                include_str!("../../tests/fixtures/raycluster-multihost.yaml"),
            ),
        ] {
            let mut raw: Value = serde_saphyr::from_str(text).unwrap();
            stringify_quantities(&mut raw, None);
            let back = if raw["kind"] == "RayService" {
                serde_json::to_value(serde_saphyr::from_str::<RayService>(text).unwrap()).unwrap()
            } else {
                serde_json::to_value(serde_saphyr::from_str::<RayCluster>(text).unwrap()).unwrap()
            };
            assert_eq!(back, raw, "{name}");
        }
    }

    #[test]
    fn none_fields_are_left_out() {
        let empty = |v: Value| v == serde_json::json!({});
        assert!(empty(
            serde_json::to_value(RayServiceSpec::default()).unwrap()
        ));
        assert!(empty(
            serde_json::to_value(RayClusterSpec::default()).unwrap()
        ));
        assert!(empty(
            serde_json::to_value(WorkerGroupSpec::default()).unwrap()
        ));
        assert!(empty(serde_json::to_value(Condition::default()).unwrap()));
        assert!(empty(
            serde_json::to_value(RayServiceStatuses::default()).unwrap()
        ));
        let g = WorkerGroupSpec {
            replicas: Some(0),
            suspend: Some(false),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(g).unwrap(),
            serde_json::json!({"replicas": 0, "suspend": false})
        );
    }
}
