//! The parts of KubeRay's RayService validation (`utils/validation.go`
//! `ValidateRayServiceSpec` → `ValidateRayClusterSpec`) that a change can trip.
//!
//! `Reconcile` validates first: a RayService that fails is marked failed (v1.6: condition
//! `Ready=False, reason ValidationFailed`; v1.5: only a Warning event and a requeue) and
//! nothing else runs, so no cluster is created or updated and no Serve config is
//! submitted, whatever else changed.

use serde_json::Value;

use super::types::RayService;
use super::version::Rules;

/// The first validation error KubeRay reports for the new RayService, if any.
///
/// `cluster` is the normalised (`full`, CRD defaults applied) `rayClusterConfig`.
pub fn cluster_spec_error(new: &RayService, cluster: &Value, rules: &Rules) -> Option<String> {
    if !rules.validates_cluster_spec {
        return None;
    }
    let autoscaling = cluster
        .get("enableInTreeAutoscaling")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let groups = cluster
        .get("workerGroupSpecs")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (i, g) in groups.iter().enumerate() {
        let name = g
            .get("groupName")
            .and_then(Value::as_str)
            .map_or_else(|| i.to_string(), str::to_string);
        if rules.validates_replica_bounds {
            let min = g.get("minReplicas").and_then(Value::as_i64);
            let max = g.get("maxReplicas").and_then(Value::as_i64);
            if let Some(m) = min.filter(|m| *m < 0) {
                return Some(format!("worker group {name} has negative minReplicas {m}"));
            }
            if let Some(m) = max.filter(|m| *m < 0) {
                return Some(format!("worker group {name} has negative maxReplicas {m}"));
            }
            if let (Some(lo), Some(hi)) = (min, max)
                && lo > hi
            {
                return Some(format!(
                    "worker group {name} has minReplicas {lo} greater than maxReplicas {hi}"
                ));
            }
        }
    }
    let suspended = groups
        .iter()
        .find(|g| g.get("suspend").and_then(Value::as_bool) == Some(true))
        .and_then(|g| g.get("groupName").and_then(Value::as_str));
    if let Some(name) = suspended {
        if !rules.job_deletion_policy_gate_default {
            return Some(format!(
                "worker group {name} can be suspended only when the RayJobDeletionPolicy feature gate is enabled (off by default in {})",
                rules.version
            ));
        }
        if autoscaling {
            return Some(format!(
                "worker group {name} cannot be suspended with Autoscaler enabled"
            ));
        }
    }
    if rules.auth_options
        && cluster
            .pointer("/authOptions/mode")
            .and_then(Value::as_str)
            .is_some_and(|m| m == "token")
    {
        let ray_version = cluster
            .get("rayVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        match generic_version(ray_version) {
            _ if ray_version.is_empty() => {
                return Some(
                    "authOptions.mode is 'token' but rayVersion is not set (Ray 2.52.0 or later is required)"
                        .into(),
                );
            }
            None => {
                return Some(format!(
                    "authOptions.mode is 'token' but rayVersion {ray_version:?} is not a version"
                ));
            }
            Some(v) if v < vec![2, 52, 0] => {
                return Some(format!(
                    "authOptions.mode is 'token' but the minimum Ray version is 2.52.0, got {ray_version}"
                ));
            }
            Some(_) => {}
        }
    }
    if cluster
        .pointer("/headGroupSpec/headService/metadata/name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty())
    {
        return Some(
            "spec.rayClusterConfig.headGroupSpec.headService.metadata.name must not be set".into(),
        );
    }
    if let Some(d) = new
        .spec
        .ray_cluster_deletion_delay_seconds
        .filter(|d| *d < 0)
    {
        return Some(format!(
            "spec.rayClusterDeletionDelaySeconds must be non-negative, got {d}"
        ));
    }
    None
}

/// `k8s.io/apimachinery/pkg/util/version.ParseGeneric`: `v?` then two or more
/// dot-separated numbers (the first without a leading zero), anything after ignored.
/// Components are padded with zeros to three for comparison.
fn generic_version(s: &str) -> Option<Vec<u64>> {
    let t = s.trim();
    let t = t.strip_prefix('v').unwrap_or(t);
    let numeric_end = t
        .char_indices()
        .scan(false, |after_dot_ok, (i, c)| {
            let ok = c.is_ascii_digit() || (c == '.' && *after_dot_ok);
            *after_dot_ok = c.is_ascii_digit();
            ok.then_some(i + c.len_utf8())
        })
        .last()?;
    let numbers = t[..numeric_end].trim_end_matches('.');
    let parts: Vec<&str> = numbers.split('.').collect();
    if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
        return None;
    }
    if parts[0].len() > 1 && parts[0].starts_with('0') {
        return None;
    }
    let mut v: Vec<u64> = parts
        .iter()
        .map(|p| p.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    while v.len() < 3 {
        v.push(0);
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberay::KubeRayVersion;
    use serde_json::json;

    fn svc(extra: Value) -> RayService {
        serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "s", "namespace": "n"},
            "spec": extra,
        }))
        .unwrap()
    }
    fn rules(v: &str) -> Rules {
        KubeRayVersion::parse(v).unwrap().rules()
    }
    fn group(extra: Value) -> Value {
        let mut g = json!({"groupName": "g", "minReplicas": 0, "maxReplicas": 4});
        if let (Value::Object(m), Value::Object(e)) = (&mut g, extra) {
            m.extend(e);
        }
        g
    }

    #[test]
    fn replica_bounds_from_v1_6() {
        let c = json!({"workerGroupSpecs": [group(json!({"minReplicas": 5}))]});
        let s = svc(json!({}));
        assert!(cluster_spec_error(&s, &c, &rules("1.5.2")).is_none());
        let e = cluster_spec_error(&s, &c, &rules("1.6.1")).unwrap();
        assert!(
            e.contains("minReplicas 5 greater than maxReplicas 4"),
            "{e}"
        );
        let neg = json!({"workerGroupSpecs": [group(json!({"maxReplicas": -1}))]});
        assert!(
            cluster_spec_error(&s, &neg, &rules("1.6.0"))
                .unwrap()
                .contains("negative maxReplicas")
        );
    }

    #[test]
    fn worker_group_suspend_needs_gate_and_no_autoscaler() {
        let s = svc(json!({}));
        let c = json!({"workerGroupSpecs": [group(json!({"suspend": true}))]});
        let e = cluster_spec_error(&s, &c, &rules("1.5.2")).unwrap();
        assert!(e.contains("RayJobDeletionPolicy"), "{e}");
        assert!(cluster_spec_error(&s, &c, &rules("1.6.1")).is_none());
        let auto = json!({"enableInTreeAutoscaling": true, "workerGroupSpecs": [group(json!({"suspend": true}))]});
        assert!(
            cluster_spec_error(&s, &auto, &rules("1.6.1"))
                .unwrap()
                .contains("Autoscaler")
        );
        let off = json!({"workerGroupSpecs": [group(json!({"suspend": false}))]});
        assert!(cluster_spec_error(&s, &off, &rules("1.5.2")).is_none());
        // Not modelled before v1.5.
        assert!(cluster_spec_error(&s, &c, &rules("1.4")).is_none());
    }

    #[test]
    fn auth_token_needs_ray_2_52() {
        let s = svc(json!({}));
        let c = |v: &str| json!({"rayVersion": v, "authOptions": {"mode": "token"}});
        for (v, ok) in [
            ("2.52.0", true),
            ("2.53", true),
            ("v2.60.1-rc1", true),
            ("2.46.0", false),
            ("", false),
            ("latest", false),
        ] {
            assert_eq!(
                cluster_spec_error(&s, &c(v), &rules("1.6.1")).is_none(),
                ok,
                "{v}"
            );
        }
        // v1.5.0 has no authOptions (pruned before validation).
        assert!(cluster_spec_error(&s, &c("2.46.0"), &rules("1.5.0")).is_none());
        assert!(cluster_spec_error(&s, &c("2.46.0"), &rules("1.5.2")).is_some());
        let disabled = json!({"rayVersion": "2.46.0", "authOptions": {"mode": "disabled"}});
        assert!(cluster_spec_error(&s, &disabled, &rules("1.6.1")).is_none());
    }

    #[test]
    fn head_service_name_and_deletion_delay() {
        let named = json!({"headGroupSpec": {"headService": {"metadata": {"name": "x"}}}});
        assert!(cluster_spec_error(&svc(json!({})), &named, &rules("1.6.1")).is_some());
        let delay = svc(json!({"rayClusterDeletionDelaySeconds": -1}));
        assert!(
            cluster_spec_error(&delay, &json!({}), &rules("1.5.2"))
                .unwrap()
                .contains("rayClusterDeletionDelaySeconds")
        );
    }

    #[test]
    fn generic_versions() {
        assert_eq!(generic_version("2.52"), Some(vec![2, 52, 0]));
        assert_eq!(generic_version(" v2.9.3abc"), Some(vec![2, 9, 3]));
        assert_eq!(generic_version("2"), None);
        assert_eq!(generic_version("02.1"), None);
        assert_eq!(generic_version("x2.1"), None);
    }
}
