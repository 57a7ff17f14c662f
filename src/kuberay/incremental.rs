//! KubeRay's `NewClusterWithIncrementalUpgrade` (v1.5.0+): what it requires of a
//! RayService and what its pending cluster looks like.
//!
//! With this strategy KubeRay creates the pending RayCluster with every worker group's
//! `replicas` unset (so at `minReplicas`, `GetWorkerGroupDesiredReplicas`), and then
//! moves Serve's `target_capacity` by `stepSizePercent` every `intervalSeconds`, the
//! pending cluster at most `maxSurgePercent` ahead of the traffic it serves
//! (`rayservice_controller.go` `reconcileServeTargetCapacity`); the Ray autoscaler grows
//! the pending cluster and shrinks the active one to follow. The peak is the active
//! cluster plus the pending one at `minReplicas` + `maxSurgePercent` of the workers.
//!
//! Checks read from `utils/validation.go` `ValidateClusterUpgradeOptions` at v1.5.0,
//! v1.5.2, v1.6.0, v1.6.2 and v1.7.0; run only when the operator's
//! `RayServiceIncrementalUpgrade` feature gate is on (`IsIncrementalUpgradeEnabled`).

use std::fmt;

use serde_json::Value;

use super::types::{RayService, UpgradeType};
use super::version::Rules;

/// `spec.upgradeStrategy.clusterUpgradeOptions` as KubeRay reads them, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// How far the pending cluster's capacity may run ahead of its traffic (CRD default
    /// 100, the whole cluster).
    pub max_surge_percent: u8,
    /// How much `target_capacity` moves per step.
    pub step_size_percent: u8,
    /// Seconds between steps.
    pub interval_seconds: u32,
}

impl Options {
    /// Steps KubeRay takes to move all traffic (`ceil(100 / stepSizePercent)`; a step of
    /// 0 never moves, reported as 0 steps).
    pub fn steps(&self) -> u32 {
        let s = u32::from(self.step_size_percent);
        if s == 0 { 0 } else { 100u32.div_ceil(s) }
    }
}

/// Why a RayService cannot be upgraded incrementally under a release, with the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The release has no `NewClusterWithIncrementalUpgrade` (before v1.5.0).
    NotSupported { version: String },
    /// The operator's `RayServiceIncrementalUpgrade` feature gate is off: KubeRay would
    /// treat the type as zero-downtime disabled and never upgrade.
    FeatureGateOff { version: String },
    /// `spec.rayClusterConfig.enableInTreeAutoscaling` is not true.
    AutoscalingOff,
    /// `spec.upgradeStrategy.clusterUpgradeOptions` is missing.
    OptionsMissing,
    /// An option KubeRay's validation rejects: the field and why.
    InvalidOption { field: &'static str, why: String },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NotSupported { version } => write!(
                f,
                "spec.upgradeType: NewClusterWithIncrementalUpgrade needs KubeRay v1.5.0 or later; the RayService's KubeRay is {version}"
            ),
            Problem::FeatureGateOff { version } => write!(
                f,
                "spec.upgradeType: NewClusterWithIncrementalUpgrade needs the KubeRay operator's RayServiceIncrementalUpgrade feature gate (off by default in {version}): start KubeRay with --feature-gates=RayServiceIncrementalUpgrade=true and raygate with --kuberay-incremental-upgrades=true"
            ),
            Problem::AutoscalingOff => write!(
                f,
                "RayService spec.rayClusterConfig.enableInTreeAutoscaling must be true for NewClusterWithIncrementalUpgrade (the Ray autoscaler grows the new cluster)"
            ),
            Problem::OptionsMissing => write!(
                f,
                "RayService spec.upgradeStrategy.clusterUpgradeOptions is required for NewClusterWithIncrementalUpgrade (maxSurgePercent, stepSizePercent, intervalSeconds, gatewayClassName)"
            ),
            Problem::InvalidOption { field, why } => write!(
                f,
                "RayService spec.upgradeStrategy.clusterUpgradeOptions.{field} {why}"
            ),
        }
    }
}

/// `ValidateClusterUpgradeOptions` for `svc` under `rules`, with the feature gate as the
/// operator runs it; the options when KubeRay would accept them.
pub fn validate(svc: &RayService, rules: &Rules, gate: bool) -> Result<Options, Problem> {
    let version = rules.version.to_string();
    if !rules
        .upgrade_types
        .contains(&UpgradeType::NewClusterWithIncrementalUpgrade)
    {
        return Err(Problem::NotSupported { version });
    }
    if !gate {
        return Err(Problem::FeatureGateOff { version });
    }
    let autoscaling = svc
        .spec
        .ray_cluster_config
        .as_ref()
        .and_then(|c| c.enable_in_tree_autoscaling)
        .unwrap_or(false);
    if !autoscaling {
        return Err(Problem::AutoscalingOff);
    }
    let opts = svc
        .spec
        .upgrade_strategy
        .as_ref()
        .and_then(|s| s.extra.get("clusterUpgradeOptions"))
        .filter(|o| o.is_object())
        .ok_or(Problem::OptionsMissing)?;
    options(opts, rules)
}

/// The option checks alone, in KubeRay's order.
pub fn options(opts: &Value, rules: &Rules) -> Result<Options, Problem> {
    let int = |k: &str| opts.get(k).and_then(Value::as_i64);
    let invalid = |field, why: &str| Problem::InvalidOption {
        field,
        why: why.to_string(),
    };
    // The CRD defaults maxSurgePercent to 100.
    let max_surge = int("maxSurgePercent").unwrap_or(100);
    let max_surge = u8::try_from(max_surge)
        .ok()
        .filter(|m| *m <= 100)
        .ok_or_else(|| invalid("maxSurgePercent", "must be between 0 and 100"))?;
    let step = int("stepSizePercent")
        .and_then(|s| u8::try_from(s).ok())
        .filter(|s| *s <= 100)
        .ok_or_else(|| invalid("stepSizePercent", "must be set and between 0 and 100"))?;
    if rules.validates_step_size_within_surge && step > max_surge {
        return Err(Problem::InvalidOption {
            field: "stepSizePercent",
            why: format!(
                "{step} must be less than or equal to maxSurgePercent {max_surge} (KubeRay {})",
                rules.version
            ),
        });
    }
    let interval = int("intervalSeconds")
        .filter(|i| *i > 0)
        .and_then(|i| u32::try_from(i).ok())
        .ok_or_else(|| invalid("intervalSeconds", "must be greater than 0"))?;
    if opts
        .get("gatewayClassName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(invalid("gatewayClassName", "is required"));
    }
    Ok(Options {
        max_surge_percent: max_surge,
        step_size_percent: step,
        interval_seconds: interval,
    })
}

/// Pods of one worker group KubeRay's pending cluster starts with (`minReplicas`, as
/// `replicas` is unset) and may grow to (`maxReplicas`), hosts included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupBounds {
    pub min_pods: usize,
    pub max_pods: usize,
}

/// [`GroupBounds`] per worker group name of `svc`'s cluster spec under `rules`.
pub fn group_bounds(svc: &RayService, rules: &Rules) -> Vec<(String, GroupBounds)> {
    let groups = svc
        .spec
        .ray_cluster_config
        .as_ref()
        .and_then(|c| c.worker_group_specs.as_ref());
    groups
        .into_iter()
        .flatten()
        .filter_map(|g| {
            let name = g.group_name.clone()?;
            let pods = |replicas: Option<i32>| {
                let mut at = g.clone();
                at.replicas = replicas;
                at.min_replicas = replicas.or(g.min_replicas);
                usize::try_from(super::pods::desired_worker_pods(&at, rules)).unwrap_or(0)
            };
            let min_pods = pods(None);
            let max_pods = pods(Some(g.max_replicas.unwrap_or(i32::MAX)));
            Some((name, GroupBounds { min_pods, max_pods }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberay::KubeRayVersion;
    use serde_json::json;

    fn rules(v: &str) -> Rules {
        KubeRayVersion::parse(v).unwrap().rules()
    }

    fn svc(autoscaling: bool, opts: Option<Value>) -> RayService {
        let mut strategy = json!({"type": "None"});
        if let Some(o) = opts {
            strategy["clusterUpgradeOptions"] = o;
        }
        serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "s", "namespace": "n"},
            "spec": {"upgradeStrategy": strategy, "rayClusterConfig": {
                "enableInTreeAutoscaling": autoscaling,
                "headGroupSpec": {},
                "workerGroupSpecs": [
                    {"groupName": "gpu", "replicas": 4, "minReplicas": 1, "maxReplicas": 6},
                    {"groupName": "multi", "minReplicas": 1, "maxReplicas": 2, "numOfHosts": 2}
                ]}}
        }))
        .unwrap()
    }

    fn good() -> Value {
        json!({"maxSurgePercent": 50, "stepSizePercent": 25, "intervalSeconds": 30, "gatewayClassName": "gw"})
    }

    #[test]
    fn validation_per_release_and_gate() {
        let s = svc(true, Some(good()));
        assert!(matches!(
            validate(&s, &rules("1.4"), true),
            Err(Problem::NotSupported { .. })
        ));
        let off = validate(&s, &rules("1.6.2"), false).unwrap_err();
        assert!(matches!(off, Problem::FeatureGateOff { .. }));
        assert!(off.to_string().contains("v1.6.2"), "{off}");
        let o = validate(&s, &rules("1.6.2"), true).unwrap();
        assert_eq!(
            (o.max_surge_percent, o.step_size_percent, o.interval_seconds),
            (50, 25, 30)
        );
        assert_eq!(o.steps(), 4);
        assert_eq!(
            validate(&svc(false, Some(good())), &rules("1.7"), true),
            Err(Problem::AutoscalingOff)
        );
        assert_eq!(
            validate(&svc(true, None), &rules("1.7"), true),
            Err(Problem::OptionsMissing)
        );
    }

    #[test]
    fn options_like_validate_cluster_upgrade_options() {
        let with = |k: &str, v: Value| {
            let mut o = good();
            o[k] = v;
            o
        };
        let field = |r: Result<Options, Problem>| match r {
            Err(Problem::InvalidOption { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            field(options(
                &with("maxSurgePercent", json!(101)),
                &rules("1.6.2")
            )),
            "maxSurgePercent"
        );
        assert_eq!(
            field(options(
                &with("stepSizePercent", json!(-1)),
                &rules("1.6.2")
            )),
            "stepSizePercent"
        );
        assert_eq!(
            field(options(&with("intervalSeconds", json!(0)), &rules("1.6.2"))),
            "intervalSeconds"
        );
        assert_eq!(
            field(options(
                &with("gatewayClassName", json!("")),
                &rules("1.6.2")
            )),
            "gatewayClassName"
        );
        // stepSizePercent > maxSurgePercent: v1.7.0 only (kuberay#4663).
        let over = with("stepSizePercent", json!(60));
        assert!(options(&over, &rules("1.5.2")).is_ok());
        assert!(options(&over, &rules("1.6.2")).is_ok());
        let e = options(&over, &rules("1.7")).unwrap_err();
        assert!(
            e.to_string()
                .contains("clusterUpgradeOptions.stepSizePercent 60"),
            "{e}"
        );
        // maxSurgePercent defaults to 100.
        let mut unset = good();
        unset.as_object_mut().unwrap().remove("maxSurgePercent");
        assert_eq!(
            options(&unset, &rules("1.7")).unwrap().max_surge_percent,
            100
        );
    }

    #[test]
    fn bounds_count_hosts() {
        let b = group_bounds(&svc(true, None), &rules("1.6.2"));
        assert_eq!(
            b[0],
            (
                "gpu".into(),
                GroupBounds {
                    min_pods: 1,
                    max_pods: 6
                }
            )
        );
        assert_eq!(
            b[1],
            (
                "multi".into(),
                GroupBounds {
                    min_pods: 2,
                    max_pods: 4
                }
            )
        );
    }
}
