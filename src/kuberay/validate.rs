//! The parts of KubeRay's RayService validation (`utils/validation.go`
//! `ValidateRayServiceSpec` → `ValidateRayClusterSpec`) that a change can trip.
//!
//! `Reconcile` validates first: a RayService that fails is marked failed (v1.6: condition
//! `Ready=False, reason ValidationFailed`; v1.5: only a Warning event and a requeue) and
//! nothing else runs, so no cluster is created or updated and no Serve config is
//! submitted, whatever else changed.
//!
//! Read at v1.5.0, v1.5.2, v1.6.0, v1.6.1, v1.6.2 and v1.7.0 (`git diff` of
//! `utils/validation.go` between the tags: v1.5.0→v1.5.2 adds the `authOptions` check,
//! v1.6.0→v1.6.2 changes nothing, v1.6.2→v1.7.0 keeps every check below and adds those under
//! [`Rules::validates_v1_7_cluster_checks`] and `stepSizePercent <= maxSurgePercent`, see
//! `classify::validate_upgrade`). Checks that the differential conformance test
//! (`e2e/tests/conformance.rs`) found missing are marked with their corpus case.

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
    let head = cluster.get("headGroupSpec").unwrap_or(&Value::Null);
    if let Some(e) = group_error("Head", head) {
        return Some(e);
    }
    let head_env = head
        .pointer("/template/spec/containers/0/env")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let env = |name: &str| {
        head_env
            .iter()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
            .map(|e| e.get("value").and_then(Value::as_str).unwrap_or(""))
    };
    let autoscaler_v2_env = env(AUTOSCALER_V2_ENV).is_some_and(|v| v == "1" || v == "true");
    let autoscaler_v2 = autoscaling
        && cluster
            .pointer("/autoscalerOptions/version")
            .and_then(Value::as_str)
            .is_some_and(|v| v == "v2");
    for (i, g) in groups.iter().enumerate() {
        let name = g
            .get("groupName")
            .and_then(Value::as_str)
            .map_or_else(|| i.to_string(), str::to_string);
        if let Some(e) = group_error(&name, g) {
            return Some(e);
        }
        // c66-idle-timeout-without-v2.
        if rules.validates_idle_timeout
            && let Some(t) = g.get("idleTimeoutSeconds").and_then(Value::as_i64)
        {
            if t < 0 {
                return Some(format!(
                    "worker group {name}: idleTimeoutSeconds must be non-negative, got {t}"
                ));
            }
            if !autoscaler_v2 && !autoscaler_v2_env {
                return Some(format!(
                    "worker group {name}: idleTimeoutSeconds is set, but autoscaler v2 is not enabled"
                ));
            }
        }
        if rules.validates_v1_7_cluster_checks
            && let Some(e) = priority_error(&name, g, cluster, autoscaler_v2_env)
        {
            return Some(e);
        }
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
    let annotation = |k: &str| {
        new.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(String::as_str)
    };
    let ft_options = cluster
        .get("gcsFaultToleranceOptions")
        .is_some_and(|o| !o.is_null());
    if ft_options && annotation(FT_ENABLED_ANNOTATION).is_some_and(|v| !v.is_empty()) {
        return Some(format!(
            "{FT_ENABLED_ANNOTATION} annotation and GcsFaultToleranceOptions are both set"
        ));
    }
    let gcs_ft = ft_options
        || annotation(FT_ENABLED_ANNOTATION).is_some_and(|v| v.eq_ignore_ascii_case("true"));
    // c68-redis-address-env.
    if !gcs_ft && env(REDIS_ADDRESS_ENV).is_some() {
        return Some(format!(
            "{REDIS_ADDRESS_ENV} is set which implicitly enables GCS fault tolerance, but GcsFaultToleranceOptions is not set"
        ));
    }
    let start_param = |k: &str| {
        head.pointer(&format!("/rayStartParams/{k}"))
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty())
    };
    if ft_options {
        let conflict = if start_param("redis-password") {
            Some("`redis-password` in rayStartParams")
        } else if env("REDIS_PASSWORD").is_some() {
            Some("`REDIS_PASSWORD` env var in head Pod")
        } else if env(REDIS_ADDRESS_ENV).is_some() {
            Some("`RAY_REDIS_ADDRESS` env var in head Pod")
        } else if annotation("ray.io/external-storage-namespace").is_some_and(|v| !v.is_empty()) {
            Some("`ray.io/external-storage-namespace` annotation")
        } else {
            None
        };
        if let Some(what) = conflict {
            return Some(format!(
                "cannot set {what} when GcsFaultToleranceOptions is enabled"
            ));
        }
        if rules.validates_v1_7_cluster_checks {
            let opts = cluster
                .get("gcsFaultToleranceOptions")
                .unwrap_or(&Value::Null);
            let backend = opts.get("backend").and_then(Value::as_str).unwrap_or("");
            if backend == "rocksdb" {
                return Some(format!(
                    "the embedded RocksDB GCS fault tolerance backend (gcsFaultToleranceOptions.backend: rocksdb) requires the GCSFaultToleranceEmbeddedStorage feature gate (off by default in {})",
                    rules.version
                ));
            }
            if opts.get("storage").is_some_and(|v| !v.is_null()) {
                return Some(
                    "cannot set gcsFaultToleranceOptions.storage when backend is 'redis' - it only applies to the 'rocksdb' backend".into(),
                );
            }
        }
    }
    // c67-redis-username.
    if start_param("redis-username") || env("REDIS_USERNAME").is_some() {
        return Some(
            "cannot set redis username in rayStartParams or environment variables - use GcsFaultToleranceOptions.RedisUsername instead"
                .into(),
        );
    }
    // c65-autoscaler-v2-env.
    if !autoscaling && autoscaler_v2_env {
        return Some(format!(
            "environment variable {AUTOSCALER_V2_ENV} cannot be set when enableInTreeAutoscaling is false"
        ));
    }
    if rules.validates_idle_timeout
        && let Some(t) = cluster
            .pointer("/autoscalerOptions/idleTimeoutSeconds")
            .and_then(Value::as_i64)
            .filter(|t| *t < 0)
    {
        return Some(format!(
            "autoscalerOptions.idleTimeoutSeconds must be non-negative, got {t}"
        ));
    }
    if rules.validates_v1_7_cluster_checks {
        let start_cmd_env = cluster
            .pointer("/autoscalerOptions/env")
            .and_then(Value::as_array)
            .is_some_and(|env| {
                env.iter().any(|e| {
                    e.get("name").and_then(Value::as_str) == Some(AUTOSCALER_START_CMD_ENV)
                })
            });
        if start_cmd_env {
            return Some(format!(
                "autoscalerOptions.env must not contain {AUTOSCALER_START_CMD_ENV}: it is managed by KubeRay"
            ));
        }
        if present(cluster, "historyServerOptions") {
            return Some(format!(
                "historyServerOptions needs the RayClusterHistoryServer feature gate (off by default in {})",
                rules.version
            ));
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
    if rules.validates_v1_7_cluster_checks {
        for (field, gate) in [
            ("networkPolicy", "RayClusterNetworkPolicy"),
            ("tlsOptions", "RayClusterMTLS"),
        ] {
            if present(cluster, field) {
                return Some(format!(
                    "spec.{field} requires the {gate} feature gate (off by default in {})",
                    rules.version
                ));
            }
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

const AUTOSCALER_V2_ENV: &str = "RAY_enable_autoscaler_v2";
const AUTOSCALER_START_CMD_ENV: &str = "KUBERAY_GEN_AUTOSCALER_START_CMD";

/// A field given with a value (Go: a non-nil pointer).
fn present(v: &Value, field: &str) -> bool {
    v.get(field).is_some_and(|f| !f.is_null())
}

/// v1.7.0 `validateWorkerGroupPriority`: a non-zero `priority` needs Ray 2.56.0 and
/// autoscaler v2 (by `autoscalerOptions.version` or the head's env var).
fn priority_error(
    name: &str,
    g: &Value,
    cluster: &Value,
    autoscaler_v2_env: bool,
) -> Option<String> {
    // IsAutoscalingV2Enabled reads autoscalerOptions.version alone (not
    // enableInTreeAutoscaling).
    let autoscaler_v2 = cluster
        .pointer("/autoscalerOptions/version")
        .and_then(Value::as_str)
        == Some("v2");
    let priority = g
        .get("priority")
        .and_then(Value::as_i64)
        .filter(|p| *p != 0)?;
    let ray_version = cluster
        .get("rayVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if ray_version.is_empty() {
        return Some(format!(
            "worker group {name}: priority is set, but rayVersion is not set (Ray 2.56.0 or later is required)"
        ));
    }
    match generic_version(ray_version) {
        None => Some(format!(
            "worker group {name}: priority is set, but rayVersion {ray_version:?} is not a version"
        )),
        Some(v) if v < vec![2, 56, 0] => Some(format!(
            "worker group {name}: priority is set, but the minimum Ray version is 2.56.0, got {ray_version}"
        )),
        Some(_) if autoscaler_v2 || autoscaler_v2_env => None,
        Some(_) => Some(format!(
            "worker group {name}: priority is set to {priority}, but autoscaler v2 is not enabled"
        )),
    }
}
const REDIS_ADDRESS_ENV: &str = "RAY_REDIS_ADDRESS";
const FT_ENABLED_ANNOTATION: &str = "ray.io/ft-enabled";

/// `validateRayGroupResources` and `validateRayGroupLabels` for one group (head or worker).
fn group_error(name: &str, g: &Value) -> Option<String> {
    let params = g.get("rayStartParams").and_then(Value::as_object);
    let param = |k: &str| {
        params
            .and_then(|p| p.get(k))
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty())
    };
    // c64-group-resources-twice.
    let start_resources = ["num-cpus", "num-gpus", "memory", "resources"]
        .iter()
        .any(|k| param(k));
    let resources = g
        .get("resources")
        .and_then(Value::as_object)
        .is_some_and(|r| !r.is_empty());
    if start_resources && resources {
        return Some(format!(
            "resource fields should not be set in both rayStartParams and Resources for {name} group"
        ));
    }
    // c63-ray-start-labels (the key alone, even with an empty value).
    if params.is_some_and(|p| p.contains_key("labels")) {
        return Some(format!(
            "rayStartParams['labels'] is not supported for {name} group; please use the top-level Labels field instead"
        ));
    }
    // c69-invalid-group-label.
    for (k, v) in g
        .get("labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        if !qualified_name(k) {
            return Some(format!("invalid label key for {name} group: '{k}'"));
        }
        let v = v.as_str().unwrap_or("");
        if !label_value(v) {
            return Some(format!(
                "invalid label value for key '{k}' in {name} group: '{v}'"
            ));
        }
    }
    None
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters (label name/value).
fn label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `IsValidLabelValue`: empty, or a label name.
fn label_value(s: &str) -> bool {
    s.is_empty() || label_name(s)
}

/// `IsQualifiedName`: `[prefix/]name`, prefix a DNS-1123 subdomain.
fn qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        None => label_name(s),
        Some((prefix, name)) => {
            let dns_label = |l: &str| {
                let b = l.as_bytes();
                let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
                b.first().is_some_and(edge)
                    && b.last().is_some_and(edge)
                    && b.len() <= 63
                    && b.iter().all(|c| edge(c) || *c == b'-')
            };
            !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(dns_label)
                && label_name(name)
        }
    }
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
    fn group_resources_labels_and_head_env() {
        let s = svc(json!({}));
        let err = |c: Value, v: &str| cluster_spec_error(&s, &c, &rules(v));
        let twice = json!({"workerGroupSpecs": [group(json!({
            "rayStartParams": {"num-cpus": "1"}, "resources": {"CPU": "1"}}))]});
        assert!(err(twice, "1.5.0").unwrap().contains("both rayStartParams"));
        let one = json!({"workerGroupSpecs": [group(json!({"resources": {"CPU": "1"}}))]});
        assert!(err(one, "1.6.1").is_none());
        let labels_param = json!({"headGroupSpec": {"rayStartParams": {"labels": ""}}});
        assert!(err(labels_param, "1.5.2").unwrap().contains("Head group"));
        for (k, ok) in [
            ("zone", true),
            ("ray.io/zone", true),
            ("a-b_c.d", true),
            ("bad key", false),
            ("Ray.io/zone", false),
            ("/zone", false),
            ("-zone", false),
        ] {
            let c = json!({"workerGroupSpecs": [group(json!({"labels": {k: "v"}}))]});
            assert_eq!(err(c, "1.6.1").is_none(), ok, "{k}");
        }
        let bad_value = json!({"workerGroupSpecs": [group(json!({"labels": {"k": "a b"}}))]});
        assert!(err(bad_value, "1.6.1").unwrap().contains("label value"));
        let env = |name: &str, value: &str| {
            json!({"headGroupSpec": {"template": {"spec": {"containers": [
                {"name": "ray-head", "env": [{"name": name, "value": value}]}]}}}})
        };
        assert!(err(env("RAY_enable_autoscaler_v2", "1"), "1.5.0").is_some());
        assert!(err(env("RAY_enable_autoscaler_v2", "0"), "1.5.0").is_none());
        let mut auto = env("RAY_enable_autoscaler_v2", "true");
        auto["enableInTreeAutoscaling"] = json!(true);
        assert!(err(auto, "1.6.1").is_none());
        assert!(err(env("RAY_REDIS_ADDRESS", "r:6379"), "1.5.2").is_some());
        let mut ft = env("RAY_REDIS_ADDRESS", "r:6379");
        ft["gcsFaultToleranceOptions"] = json!({"redisAddress": "r:6379"});
        assert!(
            err(ft, "1.6.1")
                .unwrap()
                .contains("GcsFaultToleranceOptions is enabled")
        );
        let ft_ok = json!({"gcsFaultToleranceOptions": {"redisAddress": "r:6379"}});
        assert!(err(ft_ok, "1.6.1").is_none());
        assert!(err(env("REDIS_USERNAME", "u"), "1.5.2").is_some());
        let user = json!({"headGroupSpec": {"rayStartParams": {"redis-username": "u"}}});
        assert!(err(user, "1.6.1").unwrap().contains("redis username"));
        // Not modelled before v1.5.
        assert!(err(env("RAY_REDIS_ADDRESS", "r:6379"), "1.4").is_none());
    }

    #[test]
    fn idle_timeout_needs_autoscaler_v2_from_v1_6() {
        let s = svc(json!({}));
        let c = json!({"workerGroupSpecs": [group(json!({"idleTimeoutSeconds": 60}))]});
        assert!(cluster_spec_error(&s, &c, &rules("1.5.2")).is_none());
        assert!(
            cluster_spec_error(&s, &c, &rules("1.6.0"))
                .unwrap()
                .contains("autoscaler v2")
        );
        let v2 = json!({"enableInTreeAutoscaling": true, "autoscalerOptions": {"version": "v2"},
            "workerGroupSpecs": [group(json!({"idleTimeoutSeconds": 60}))]});
        assert!(cluster_spec_error(&s, &v2, &rules("1.6.1")).is_none());
        let negative = json!({"enableInTreeAutoscaling": true, "autoscalerOptions": {"version": "v2", "idleTimeoutSeconds": -1}});
        assert!(cluster_spec_error(&s, &negative, &rules("1.6.1")).is_some());
        assert!(cluster_spec_error(&s, &negative, &rules("1.5.2")).is_none());
    }

    #[test]
    fn v1_7_checks_only_from_v1_7() {
        let s = svc(json!({}));
        let err = |c: &Value, v: &str| cluster_spec_error(&s, c, &rules(v));
        let prio = |ray: &str, v2: bool| {
            let mut c =
                json!({"rayVersion": ray, "workerGroupSpecs": [group(json!({"priority": 5}))]});
            if v2 {
                c["autoscalerOptions"] = json!({"version": "v2"});
            }
            c
        };
        assert!(
            err(&prio("2.56.0", false), "1.7")
                .unwrap()
                .contains("autoscaler v2")
        );
        assert!(
            err(&prio("2.50.0", true), "1.7")
                .unwrap()
                .contains("2.56.0")
        );
        assert!(err(&prio("2.56.0", true), "1.7").is_none());
        assert!(err(&prio("2.50.0", false), "1.6.2").is_none());
        let cmd = json!({"autoscalerOptions": {"env": [{"name": "KUBERAY_GEN_AUTOSCALER_START_CMD", "value": "x"}]}});
        assert!(
            err(&cmd, "1.7")
                .unwrap()
                .contains("KUBERAY_GEN_AUTOSCALER_START_CMD")
        );
        assert!(err(&cmd, "1.6.2").is_none());
        for (field, gate) in [
            ("networkPolicy", "RayClusterNetworkPolicy"),
            ("tlsOptions", "RayClusterMTLS"),
            ("historyServerOptions", "RayClusterHistoryServer"),
        ] {
            let c = json!({field: {}});
            assert!(err(&c, "1.7").unwrap().contains(gate), "{field}");
            assert!(err(&c, "1.6.2").is_none(), "{field}");
        }
        let rocks = json!({"gcsFaultToleranceOptions": {"backend": "rocksdb"}});
        assert!(
            err(&rocks, "1.7")
                .unwrap()
                .contains("GCSFaultToleranceEmbeddedStorage")
        );
        assert!(err(&rocks, "1.6.2").is_none());
        let storage = json!({"gcsFaultToleranceOptions": {"redisAddress": "r:6379", "storage": {"size": "1Gi"}}});
        assert!(err(&storage, "1.7").unwrap().contains("storage"));
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
