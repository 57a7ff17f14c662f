//! KubeRay operator versions and the per-version rules raygate applies.
//!
//! Every rule was read from the KubeRay source at the cited tag (file paths relative to
//! `ray-operator/controllers/ray/`). Rules are per *release* (patch level matters: v1.5.2
//! and v1.6.1 back-ported behaviour that v1.5.0/v1.6.0 lack).

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use super::types::UpgradeType;

/// A released KubeRay operator version (`vMAJOR.MINOR.PATCH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeRayVersion {
    pub major: u16,
    pub minor: u16,
    pub patch: u16,
}

const fn v(minor: u16, patch: u16) -> KubeRayVersion {
    KubeRayVersion {
        major: 1,
        minor,
        patch,
    }
}

/// Every release whose rules raygate knows, oldest first (the v1.1.0 … v1.7.0 tags).
pub const SUPPORTED: &[KubeRayVersion] = &[
    v(1, 0),
    v(1, 1),
    v(2, 0),
    v(2, 1),
    v(2, 2),
    v(3, 0),
    v(3, 1),
    v(3, 2),
    v(4, 0),
    v(4, 1),
    v(4, 2),
    v(5, 0),
    v(5, 1),
    v(5, 2),
    v(6, 0),
    v(6, 1),
    v(6, 2),
    v(7, 0),
];

impl KubeRayVersion {
    /// The newest supported release, v1.7.0.
    pub const fn latest() -> KubeRayVersion {
        v(7, 0)
    }

    /// All supported releases, oldest first.
    pub fn supported() -> &'static [KubeRayVersion] {
        SUPPORTED
    }

    /// Parse `1.7`, `v1.7`, `1.7.0` or `v1.7.0`. `MAJOR.MINOR` means the newest
    /// supported patch release of that minor (so `1.5` is v1.5.2). Unsupported versions
    /// are an error listing the supported ones.
    pub fn parse(s: &str) -> crate::Result<KubeRayVersion> {
        let t = s.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        let parts: Vec<&str> = t.split('.').collect();
        let bad = |reason: &str| {
            crate::Error::invalid(format!("KubeRay version {s:?}"), reason.to_string())
        };
        let num = |p: &str| {
            p.parse::<u16>()
                .map_err(|_| bad("expected MAJOR.MINOR[.PATCH]"))
        };
        let (major, minor, patch) = match parts.as_slice() {
            [ma, mi] => (num(ma)?, num(mi)?, None),
            [ma, mi, pa] => (num(ma)?, num(mi)?, Some(num(pa)?)),
            _ => return Err(bad("expected MAJOR.MINOR[.PATCH]")),
        };
        let found = SUPPORTED
            .iter()
            .filter(|k| k.major == major && k.minor == minor && patch.is_none_or(|p| k.patch == p))
            .max()
            .copied();
        found.ok_or_else(|| {
            let list: Vec<String> = SUPPORTED.iter().map(|k| k.to_string()).collect();
            bad(&format!("unsupported; supported: {}", list.join(", ")))
        })
    }

    /// The string KubeRay writes into `ray.io/kuberay-version` (`utils.KUBERAY_VERSION`).
    pub fn tag(&self) -> String {
        self.to_string()
    }

    /// The rules of this release.
    pub fn rules(&self) -> Rules {
        Rules::for_version(*self)
    }
}

impl fmt::Display for KubeRayVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for KubeRayVersion {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        KubeRayVersion::parse(s)
    }
}

impl Serialize for KubeRayVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl Default for KubeRayVersion {
    fn default() -> Self {
        KubeRayVersion::latest()
    }
}

/// A RayClusterSpec field KubeRay clears before hashing, so changing it alone never
/// prepares a new cluster nor updates the cluster in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum MutedField {
    /// `workerGroupSpecs[].replicas`: v1.1.0+
    /// (`rayservice_controller.go` `generateHashWithoutReplicasAndWorkersToDelete`).
    WorkerReplicas,
    /// `workerGroupSpecs[].scaleStrategy.workersToDelete`: v1.1.0+ (same function).
    WorkerWorkersToDelete,
    /// `workerGroupSpecs[].minReplicas`: v1.2.0+ (same function, v1.2.0 adds Min/Max).
    WorkerMinReplicas,
    /// `workerGroupSpecs[].maxReplicas`: v1.2.0+.
    WorkerMaxReplicas,
    /// `headGroupSpec.template.spec.tolerations`: v1.5.2, v1.6.0+
    /// (`utils/util.go` `GenerateHashWithoutReplicasAndWorkersToDelete`, "Kueue may inject").
    HeadTolerations,
    /// `headGroupSpec.template.spec.schedulingGates`: v1.5.2, v1.6.0+.
    HeadSchedulingGates,
    /// `workerGroupSpecs[].template.spec.tolerations`: v1.5.2, v1.6.0+.
    WorkerTolerations,
    /// `workerGroupSpecs[].template.spec.schedulingGates`: v1.5.2, v1.6.0+.
    WorkerSchedulingGates,
    /// Cluster-level `upgradeStrategy`: v1.6.0+ (`updatedRayClusterSpec.UpgradeStrategy = nil`).
    ClusterUpgradeStrategy,
    /// Cluster-level `suspend`: v1.7.0+ (`rayservice_controller.go` `rayClusterSpecForHashing`
    /// clears `Suspend`; `modifyRayCluster` keeps the live cluster's value).
    ClusterSuspend,
}

impl MutedField {
    /// Readable path pattern.
    pub fn path(&self) -> &'static str {
        match self {
            MutedField::WorkerReplicas => "workerGroupSpecs[*].replicas",
            MutedField::WorkerWorkersToDelete => {
                "workerGroupSpecs[*].scaleStrategy.workersToDelete"
            }
            MutedField::WorkerMinReplicas => "workerGroupSpecs[*].minReplicas",
            MutedField::WorkerMaxReplicas => "workerGroupSpecs[*].maxReplicas",
            MutedField::HeadTolerations => "headGroupSpec.template.spec.tolerations",
            MutedField::HeadSchedulingGates => "headGroupSpec.template.spec.schedulingGates",
            MutedField::WorkerTolerations => "workerGroupSpecs[*].template.spec.tolerations",
            MutedField::WorkerSchedulingGates => {
                "workerGroupSpecs[*].template.spec.schedulingGates"
            }
            MutedField::ClusterUpgradeStrategy => "upgradeStrategy",
            MutedField::ClusterSuspend => "suspend",
        }
    }
}

/// What happens when the active RayCluster's `ray.io/num-worker-groups` annotation is
/// missing or not a number, in the "worker groups appended" check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum BadGroupCountAnnotation {
    /// v1.1–v1.2 `shouldPrepareNewRayCluster`: `strconv.Atoi` error → `DoNothing`.
    DoNothing,
    /// v1.3.0+ `isClusterSpecHashEqual(partial=true)`: `strconv.Atoi` error → `return true`,
    /// i.e. the cluster is updated in place.
    UpdateInPlace,
}

/// How `utils.GetWorkerGroupDesiredReplicas` clamps replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ReplicaClamp {
    /// v1.1–v1.5: `if *Min > *Max { Max } else if Replicas == nil || *Replicas < *Min { Min }
    /// else if *Replicas > *Max { Max } else { *Replicas }` (nil Min/Max would panic in Go;
    /// we use the CRD defaults 0 / 2147483647).
    MinAboveMaxUsesMax,
    /// v1.6.0+: `Min = Deref(MinReplicas, 0)`, `Max = Deref(MaxReplicas, MaxInt32)`, no
    /// Min>Max branch (validation rejects it): `Replicas == nil || < Min → Min; > Max → Max`.
    DerefDefaults,
}

/// The behaviour of one KubeRay release that raygate models.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rules {
    pub version: KubeRayVersion,
    /// Fields cleared before hashing (see [`MutedField`] for the evidence of each).
    pub muted: Vec<MutedField>,
    /// In-place update when worker groups are only appended at the end and everything
    /// else hashes equal: v1.1.0+ (v1.1–v1.2 `shouldPrepareNewRayCluster` "Case 2/3",
    /// v1.3.0+ `shouldUpdateCluster` → `isClusterSpecHashEqual(partial=true)`).
    /// v1.1–v1.2 require strictly more groups (`>`), v1.3.0+ use `>=`.
    pub in_place_append: bool,
    pub bad_group_count_annotation: BadGroupCountAnnotation,
    /// The active RayCluster is updated in place (whatever changed, so no new cluster)
    /// when its `ray.io/kuberay-version` annotation differs from the operator's version:
    /// v1.2.0+ (v1.2 `shouldPrepareNewRayCluster` "Case 1", v1.3.0+ `shouldUpdateCluster`,
    /// skipped while the RayService has condition `UpgradeInProgress`).
    pub version_annotation_updates_in_place: bool,
    /// Toggling `rayClusterConfig.suspend` (vs the live cluster) updates the cluster in
    /// place before any hash check: v1.5.2, v1.6.1, v1.6.2 only (`shouldUpdateCluster`,
    /// ray-project/kuberay#4686); v1.7.0 instead mutes `suspend` (see `ClusterSuspend`).
    pub suspend_toggle_updates_in_place: bool,
    /// `RayService.spec.upgradeStrategy` exists (v1.3.0+, `rayservice_types.go`); before,
    /// the field is pruned and only `ENABLE_ZERO_DOWNTIME` counts.
    pub upgrade_strategy_field: bool,
    /// Valid `upgradeStrategy.type` values (`utils/validation.go` `validateRayService*`):
    /// v1.3–v1.4 `None | NewCluster`; v1.5.0+ adds `NewClusterWithIncrementalUpgrade`.
    pub upgrade_types: Vec<UpgradeType>,
    /// Default of the `RayServiceIncrementalUpgrade` feature gate
    /// (`pkg/features/features.go`): Alpha/false in v1.5–v1.6, Beta/true in v1.7.0.
    pub incremental_upgrade_gate_default: bool,
    /// `clusterUpgradeOptions.stepSizePercent > maxSurgePercent` fails validation: v1.7.0+
    /// (`utils/validation.go` `ValidateClusterUpgradeOptions`, ray-project/kuberay#4663,
    /// commit fb47c0665 "Directly fail RayService when stepSize is greater than maxSurge");
    /// v1.5.0–v1.6.2 check only that each lies in 0..=100 and accept it.
    pub validates_step_size_within_surge: bool,
    /// `shouldPrepareNewCluster` compares against the pending cluster when there is one
    /// (v1.3.0+); v1.1–v1.2 never prepare while a pending cluster exists.
    pub compares_pending_cluster: bool,
    /// Worker group `suspend` exists and yields zero pods: v1.3.0+ (`GetWorkerGroupDesiredReplicas`).
    pub worker_group_suspend: bool,
    /// `GetWorkerGroupDesiredReplicas` multiplies by `numOfHosts` (v1.4.0+; before, the
    /// caller multiplies by `max(1, numOfHosts)` in `reconcilePods`).
    pub desired_includes_num_of_hosts: bool,
    pub replica_clamp: ReplicaClamp,
    /// `shouldPrepareNewCluster` returns false while the RayService has condition
    /// `RollbackInProgress` (v1.6.0+).
    pub rollback_blocks_new_cluster: bool,
    /// `utils/validation.go` `ValidateRayClusterSpec` / `ValidateRayServiceSpec` checks that
    /// raygate models (v1.5.0+; read at v1.5.0, v1.5.2, v1.6.0, v1.6.1): a RayService failing
    /// them is rejected and KubeRay applies nothing, not even its Serve config. Worker-group
    /// `suspend: true` with autoscaling, `headService.metadata.name` set, a negative
    /// `rayClusterDeletionDelaySeconds`.
    pub validates_cluster_spec: bool,
    /// `minReplicas > maxReplicas` or a negative bound fails validation: v1.6.0+.
    pub validates_replica_bounds: bool,
    /// A worker group's `idleTimeoutSeconds` (negative, or set without autoscaler v2) and a
    /// negative `autoscalerOptions.idleTimeoutSeconds` fail validation: v1.6.0+
    /// (`validateWorkerGroupIdleTimeout`, read at v1.6.0 and v1.6.1; absent in v1.5.x).
    pub validates_idle_timeout: bool,
    /// Default of the `RayJobDeletionPolicy` feature gate, without which a worker group
    /// with `suspend: true` fails validation (`pkg/features/features.go`): Alpha/false in
    /// v1.5, Beta/true in v1.6.0+.
    pub job_deletion_policy_gate_default: bool,
    /// `RayClusterSpec.authOptions` exists (v1.5.2, v1.6.0+; not in v1.5.0) and
    /// `mode: token` requires `rayVersion` >= 2.52.0.
    pub auth_options: bool,
    /// `utils/validation.go` checks added in v1.7.0 (diffed v1.6.2..v1.7.0; none of them
    /// exist in v1.5.0–v1.6.2): a worker group `priority` other than 0 needs `rayVersion`
    /// at least 2.56.0 and autoscaler v2 (`validateWorkerGroupPriority`);
    /// `autoscalerOptions.env` must not set `KUBERAY_GEN_AUTOSCALER_START_CMD`;
    /// `networkPolicy`, `tlsOptions`, `historyServerOptions` and the `rocksdb` GCS FT
    /// backend each need an Alpha feature gate that is off by default
    /// (`pkg/features/features.go`: `RayClusterNetworkPolicy`, `RayClusterMTLS`,
    /// `RayClusterHistoryServer`, `GCSFaultToleranceEmbeddedStorage`); the `redis` backend
    /// rejects `gcsFaultToleranceOptions.storage` (`validateGcsFaultToleranceBackend`).
    pub validates_v1_7_cluster_checks: bool,
    /// Fields of RayClusterSpec / HeadGroupSpec / WorkerGroupSpec this release's Go types
    /// know (`apis/ray/v1/raycluster_types.go`); others are pruned by the API server and
    /// dropped by Go's unmarshal, so they can never trigger anything.
    #[serde(skip)]
    pub cluster_fields: &'static [&'static str],
    #[serde(skip)]
    pub head_fields: &'static [&'static str],
    #[serde(skip)]
    pub worker_fields: &'static [&'static str],
}

const CLUSTER_1_1: &[&str] = &[
    "headGroupSpec",
    "workerGroupSpecs",
    "rayVersion",
    "enableInTreeAutoscaling",
    "autoscalerOptions",
    "headServiceAnnotations",
    "suspend",
];
const CLUSTER_1_3: &[&str] = &[
    "headGroupSpec",
    "workerGroupSpecs",
    "rayVersion",
    "enableInTreeAutoscaling",
    "autoscalerOptions",
    "headServiceAnnotations",
    "suspend",
    "managedBy",
    "gcsFaultToleranceOptions",
];
const CLUSTER_1_5_2: &[&str] = &[
    "headGroupSpec",
    "workerGroupSpecs",
    "rayVersion",
    "enableInTreeAutoscaling",
    "autoscalerOptions",
    "headServiceAnnotations",
    "suspend",
    "managedBy",
    "gcsFaultToleranceOptions",
    "authOptions",
];
const CLUSTER_1_6: &[&str] = &[
    "headGroupSpec",
    "workerGroupSpecs",
    "rayVersion",
    "enableInTreeAutoscaling",
    "autoscalerOptions",
    "headServiceAnnotations",
    "suspend",
    "managedBy",
    "gcsFaultToleranceOptions",
    "upgradeStrategy",
    "authOptions",
];
const CLUSTER_1_7: &[&str] = &[
    "headGroupSpec",
    "workerGroupSpecs",
    "rayVersion",
    "enableInTreeAutoscaling",
    "autoscalerOptions",
    "headServiceAnnotations",
    "suspend",
    "managedBy",
    "gcsFaultToleranceOptions",
    "upgradeStrategy",
    "authOptions",
    "historyServerOptions",
    "networkPolicy",
    "tlsOptions",
];
const HEAD_1_1: &[&str] = &[
    "serviceType",
    "headService",
    "enableIngress",
    "rayStartParams",
    "template",
];
const HEAD_1_5: &[&str] = &[
    "serviceType",
    "headService",
    "enableIngress",
    "rayStartParams",
    "template",
    "resources",
    "labels",
];
const HEAD_1_7: &[&str] = &[
    "serviceType",
    "headService",
    "enableIngress",
    "rayStartParams",
    "template",
    "resources",
    "labels",
    "ingressOptions",
];
const WORKER_1_1: &[&str] = &[
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "numOfHosts",
    "rayStartParams",
    "template",
    "scaleStrategy",
];
const WORKER_1_3: &[&str] = &[
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "numOfHosts",
    "rayStartParams",
    "template",
    "scaleStrategy",
    "suspend",
    "idleTimeoutSeconds",
];
const WORKER_1_5: &[&str] = &[
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "numOfHosts",
    "rayStartParams",
    "template",
    "scaleStrategy",
    "suspend",
    "idleTimeoutSeconds",
    "resources",
    "labels",
];
const WORKER_1_7: &[&str] = &[
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "numOfHosts",
    "rayStartParams",
    "template",
    "scaleStrategy",
    "suspend",
    "idleTimeoutSeconds",
    "resources",
    "labels",
    "priority",
];

impl Rules {
    pub fn for_version(version: KubeRayVersion) -> Rules {
        let at_least = |minor: u16, patch: u16| version >= v(minor, patch);
        let mut muted = vec![
            MutedField::WorkerReplicas,
            MutedField::WorkerWorkersToDelete,
        ];
        if at_least(2, 0) {
            muted.extend([MutedField::WorkerMinReplicas, MutedField::WorkerMaxReplicas]);
        }
        // v1.5.2 back-ported the tolerations/schedulingGates muting that v1.6.0 ships.
        if version == v(5, 2) || at_least(6, 0) {
            muted.extend([
                MutedField::HeadTolerations,
                MutedField::HeadSchedulingGates,
                MutedField::WorkerTolerations,
                MutedField::WorkerSchedulingGates,
            ]);
        }
        if at_least(6, 0) {
            muted.push(MutedField::ClusterUpgradeStrategy);
        }
        if at_least(7, 0) {
            muted.push(MutedField::ClusterSuspend);
        }
        let upgrade_types = if at_least(5, 0) {
            vec![
                UpgradeType::None,
                UpgradeType::NewCluster,
                UpgradeType::NewClusterWithIncrementalUpgrade,
            ]
        } else if at_least(3, 0) {
            vec![UpgradeType::None, UpgradeType::NewCluster]
        } else {
            vec![]
        };
        Rules {
            version,
            muted,
            in_place_append: true,
            bad_group_count_annotation: if at_least(3, 0) {
                BadGroupCountAnnotation::UpdateInPlace
            } else {
                BadGroupCountAnnotation::DoNothing
            },
            version_annotation_updates_in_place: at_least(2, 0),
            suspend_toggle_updates_in_place: matches!(version, x if x == v(5, 2) || x == v(6, 1) || x == v(6, 2)),
            upgrade_strategy_field: at_least(3, 0),
            upgrade_types,
            incremental_upgrade_gate_default: at_least(7, 0),
            validates_step_size_within_surge: at_least(7, 0),
            compares_pending_cluster: at_least(3, 0),
            worker_group_suspend: at_least(3, 0),
            desired_includes_num_of_hosts: at_least(4, 0),
            replica_clamp: if at_least(6, 0) {
                ReplicaClamp::DerefDefaults
            } else {
                ReplicaClamp::MinAboveMaxUsesMax
            },
            rollback_blocks_new_cluster: at_least(6, 0),
            validates_cluster_spec: at_least(5, 0),
            validates_replica_bounds: at_least(6, 0),
            validates_idle_timeout: at_least(6, 0),
            job_deletion_policy_gate_default: at_least(6, 0),
            auth_options: at_least(5, 2),
            validates_v1_7_cluster_checks: at_least(7, 0),
            cluster_fields: if at_least(7, 0) {
                CLUSTER_1_7
            } else if at_least(6, 0) {
                CLUSTER_1_6
            } else if at_least(5, 2) {
                CLUSTER_1_5_2
            } else if at_least(3, 0) {
                CLUSTER_1_3
            } else {
                CLUSTER_1_1
            },
            head_fields: if at_least(7, 0) {
                HEAD_1_7
            } else if at_least(5, 0) {
                HEAD_1_5
            } else {
                HEAD_1_1
            },
            worker_fields: if at_least(7, 0) {
                WORKER_1_7
            } else if at_least(5, 0) {
                WORKER_1_5
            } else if at_least(3, 0) {
                WORKER_1_3
            } else {
                WORKER_1_1
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chart's values schema accepts exactly the `kuberayVersion` values
    /// `raygate run --kuberay-version` starts with (a known release that can be
    /// gated), so a wrong one fails `helm install` instead of the pod.
    #[test]
    fn the_charts_values_schema_accepts_what_raygate_run_accepts() {
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../charts/raygate/values.schema.json")).unwrap();
        let pattern = schema["properties"]["kuberayVersion"]["pattern"]
            .as_str()
            .unwrap();
        let re = regex::Regex::new(pattern).unwrap();
        assert!(re.is_match(""), "empty: read from the cluster");
        for prefix in ["", "v"] {
            for minor in 0..=9u16 {
                let mut forms = vec![format!("{prefix}1.{minor}")];
                forms.extend((0..=9u16).map(|p| format!("{prefix}1.{minor}.{p}")));
                for s in forms {
                    let starts =
                        KubeRayVersion::parse(&s).is_ok_and(|v| v.rules().upgrade_strategy_field);
                    assert_eq!(re.is_match(&s), starts, "{s:?} against {pattern}");
                }
            }
        }
    }

    #[test]
    fn parse_forms() {
        assert_eq!(KubeRayVersion::parse("1.7").unwrap(), v(7, 0));
        assert_eq!(KubeRayVersion::parse("v1.7.0").unwrap(), v(7, 0));
        assert_eq!(KubeRayVersion::parse("1.7.0").unwrap(), v(7, 0));
        assert_eq!(KubeRayVersion::parse("1.5").unwrap(), v(5, 2));
        assert_eq!(KubeRayVersion::parse("v1.5.0").unwrap(), v(5, 0));
        assert_eq!(KubeRayVersion::latest(), v(7, 0));
        assert_eq!(KubeRayVersion::latest().tag(), "v1.7.0");
        for bad in ["", "1", "1.0", "2.0", "1.7.9", "x.y", "1.7.0.1"] {
            assert!(KubeRayVersion::parse(bad).is_err(), "{bad}");
        }
        let msg = KubeRayVersion::parse("1.0").unwrap_err().to_string();
        assert!(msg.contains("v1.7.0"), "{msg}");
        assert_eq!(SUPPORTED.first(), Some(&v(1, 0)));
        assert!(SUPPORTED.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn feature_table() {
        let r = |s: &str| KubeRayVersion::parse(s).unwrap().rules();
        assert!(!r("1.1").version_annotation_updates_in_place);
        assert!(r("1.2").version_annotation_updates_in_place);
        assert_eq!(
            r("1.2").bad_group_count_annotation,
            BadGroupCountAnnotation::DoNothing
        );
        assert_eq!(
            r("1.3").bad_group_count_annotation,
            BadGroupCountAnnotation::UpdateInPlace
        );
        assert!(r("1.2").upgrade_types.is_empty());
        assert_eq!(r("1.4").upgrade_types.len(), 2);
        assert_eq!(r("1.5").upgrade_types.len(), 3);
        assert!(!r("1.6").incremental_upgrade_gate_default);
        assert!(r("1.7").incremental_upgrade_gate_default);
        assert!(r("1.5.2").suspend_toggle_updates_in_place);
        assert!(!r("1.6.0").suspend_toggle_updates_in_place);
        assert!(r("1.6.1").suspend_toggle_updates_in_place);
        assert!(!r("1.7").suspend_toggle_updates_in_place);
        assert!(!r("1.3").desired_includes_num_of_hosts);
        assert!(r("1.4").desired_includes_num_of_hosts);
        assert_eq!(r("1.5").replica_clamp, ReplicaClamp::MinAboveMaxUsesMax);
        assert_eq!(r("1.6").replica_clamp, ReplicaClamp::DerefDefaults);
        assert!(!r("1.5.0").cluster_fields.contains(&"authOptions"));
        assert!(r("1.5.2").cluster_fields.contains(&"authOptions"));
        assert!(!r("1.5.2").cluster_fields.contains(&"upgradeStrategy"));
        assert!(r("1.6.1").cluster_fields.contains(&"authOptions"));
        assert!(!r("1.5.2").validates_replica_bounds && r("1.6.0").validates_replica_bounds);
        assert!(!r("1.5.2").job_deletion_policy_gate_default);
        assert!(r("1.6.1").job_deletion_policy_gate_default);
        assert!(!r("1.5.0").auth_options && r("1.5.2").auth_options);
        for old in ["1.5.0", "1.5.2", "1.6.0", "1.6.2"] {
            assert!(!r(old).validates_step_size_within_surge, "{old}");
            assert!(!r(old).validates_v1_7_cluster_checks, "{old}");
        }
        assert!(
            r("1.7").validates_step_size_within_surge && r("1.7").validates_v1_7_cluster_checks
        );
        let json = serde_json::to_value(r("1.7")).unwrap();
        assert_eq!(json["version"], "v1.7.0");
        assert_eq!(json["muted"][0], "workerReplicas");
    }
}
