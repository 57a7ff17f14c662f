//! What KubeRay does, as data and pure functions.
//!
//! - [`types`]: partial typed `ray.io/v1` RayService / RayCluster (unknown fields kept).
//! - [`version`]: supported KubeRay releases and the per-release rules, each citing its source.
//! - [`normalize`]: a RayClusterSpec as KubeRay hashes it (Go JSON round trip, CRD defaults,
//!   muted fields).
//! - [`diff`]: structural diff with readable, name-keyed paths.
//! - [`classify`](mod@classify): what KubeRay will do with a RayService change.
//! - [`pods`]: the pods KubeRay will create for a cluster spec.
//! - [`release`]: which release runs, read from the RayClusters' `ray.io/kuberay-version`.
//! - [`validate`]: the RayService validation that makes KubeRay reject a change.
//! - [`valid`]: what the apiserver refuses in the pods KubeRay would create (a fraction of a GPU).

pub mod budget;
pub mod classify;
pub mod diff;
pub mod incremental;
pub mod normalize;
pub mod over_budget;
pub mod pods;
pub mod release;
pub mod types;
pub mod valid;
pub mod validate;
pub mod version;

pub use classify::{Classification, ClassifyOptions, OldSide, Verdict, classify, classify_with};
pub use pods::{
    PlanOptions, checked_cluster_config, desired_worker_pods, planned_groups, planned_groups_with,
    planned_pods, planned_pods_with,
};
pub use release::{Release, ReleaseProblem, ReleaseSource, Releases};
pub use types::{
    ANNOTATION_HASH, ANNOTATION_KUBERAY_VERSION, ANNOTATION_NUM_WORKER_GROUPS, LABEL_CLUSTER,
    LABEL_GROUP, LABEL_NODE_TYPE, LABEL_ORIGINATED_FROM_CR_NAME, LABEL_ORIGINATED_FROM_CRD,
    RayCluster, RayClusterSpec, RayService, RayServiceSpec, RayServiceStatus, UpgradeType,
};
pub use version::{KubeRayVersion, Rules};
