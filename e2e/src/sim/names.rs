//! Label, annotation and value constants of KubeRay v1.7.0 (`utils/constant.go`),
//! plus kuberay-sim's own knobs.

pub const GROUP: &str = "ray.io";
pub const VERSION: &str = "v1";
pub const API_VERSION: &str = "ray.io/v1";

pub const KUBERAY_VERSION: &str = "v1.7.0";
pub const KUBERAY_CONTROLLER: &str = "ray.io/kuberay-operator";

pub const ORIGINATED_FROM_CR_NAME: &str = "ray.io/originated-from-cr-name";
pub const ORIGINATED_FROM_CRD: &str = "ray.io/originated-from-crd";
pub const RAY_SERVICE_CRD: &str = "RayService";
pub const RAY_CLUSTER_LABEL: &str = "ray.io/cluster";
pub const NODE_TYPE_LABEL: &str = "ray.io/node-type";
pub const GROUP_LABEL: &str = "ray.io/group";
pub const IS_RAY_NODE_LABEL: &str = "ray.io/is-ray-node";
pub const IDENTIFIER_LABEL: &str = "ray.io/identifier";
pub const SERVE_LABEL: &str = "ray.io/serve";
pub const APP_NAME_LABEL: &str = "app.kubernetes.io/name";
pub const CREATED_BY_LABEL: &str = "app.kubernetes.io/created-by";
pub const REPLICA_INDEX_LABEL: &str = "ray.io/worker-group-replica-index";
pub const REPLICA_NAME_LABEL: &str = "ray.io/worker-group-replica-name";
pub const HOST_INDEX_LABEL: &str = "ray.io/replica-host-index";
pub const RAY_SERVICE_FINALIZER: &str = "ray.io/rayservice-finalizer";
pub const HEAD_GROUP: &str = "headgroup";

pub const HASH_ANNOTATION: &str = "ray.io/hash-without-replicas-and-workers-to-delete";
pub const NUM_WORKER_GROUPS_ANNOTATION: &str = "ray.io/num-worker-groups";
pub const KUBERAY_VERSION_ANNOTATION: &str = "ray.io/kuberay-version";
pub const RECREATE_HASH_ANNOTATION: &str = "ray.io/upgrade-strategy-recreate-hash";

/// Forces serve application statuses: `DEPLOY_FAILED` (all apps) or `app=STATUS,app2=STATUS`.
pub const SERVE_STATUS_ANNOTATION: &str = "kuberay-sim.raygate.io/serve-status";
/// Node label that marks nodes whose pods kuberay-sim "runs" (our stand-in for a kubelet).
pub const FAKE_NODE_LABEL: &str = "raygate.io/fake-node";

/// Default `spec.rayClusterDeletionDelaySeconds` (`RayClusterDeletionDelayDuration`).
pub const DEFAULT_DELETION_DELAY_SECONDS: i64 = 60;
