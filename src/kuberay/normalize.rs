//! Normalise a RayClusterSpec (as `serde_json::Value`) to what KubeRay actually hashes.
//!
//! KubeRay compares `sha1(json.Marshal(spec))` of Go structs, i.e. JSON after a Go
//! unmarshal → marshal round trip of what the API server stored. Two specs are "the same
//! for KubeRay" when those Go JSON documents are equal. We compare semantically instead,
//! so we reproduce what that round trip (and the API server before it) changes:
//!
//! 1. **Pruning** — fields the release's Go types don't know (RayClusterSpec,
//!    HeadGroupSpec, WorkerGroupSpec level, see [`Rules`]) are pruned by the API server and
//!    dropped by Go; they never count. We report them as pruned paths.
//! 2. **CRD defaults** (`default:` in the v1.7.0 CRDs, the same since v1.1 except where
//!    noted): `workerGroupSpecs[].numOfHosts: 1`, `replicas: 0`, `minReplicas: 0`,
//!    `maxReplicas: 2147483647`, `priority: 0` (v1.7.0+), `networkPolicy.mode: DenyAll`
//!    (v1.7.0+), container/headService `ports[].protocol: TCP`, and the volume-source
//!    defaults (`azureDisk.fsType: ext4`, `azureDisk.readOnly: false`, `rbd.pool: rbd`,
//!    `rbd.user: admin`, `rbd.keyring: /etc/ceph/keyring`, `iscsi.iscsiInterface: default`,
//!    `scaleIO.fsType: xfs`, `scaleIO.storageMode: ThinProvisioned`), `fileKeyRef.optional:
//!    false`. Applied (like the API server) only where the key is absent or null.
//! 3. **Go round trip**:
//!    - quantities (`resources.limits/requests` of every container, init/ephemeral container,
//!      pod-level `resources`, `autoscalerOptions.resources`, PVC templates; `overhead`;
//!      `emptyDir.sizeLimit`; `resourceFieldRef.divisor`) become `Quantity::canonical()`
//!      (Go's `Quantity.String()`): `1000m` ≡ `1`, but `1Gi` ≢ `1073741824`.
//!    - `null` ≡ absent (Go unmarshals null to the zero value / nil).
//!    - `""` ≡ absent for string fields (omitempty drops it; non-omitempty strings like
//!      `name` emit `""` for both), except the few `*string` fields (`managedBy`,
//!      `runtimeClassName`, `storageClassName`, `autoscalerOptions.image/imagePullPolicy`,
//!      `authOptions.secretName`, `ingressOptions.host/path/pathType`) where `""` is kept.
//!    - `false` is **kept** by default, because most optional bools in these types are
//!      `*bool` (`enableInTreeAutoscaling`, `suspend`, `enableIngress`,
//!      `securityContext.privileged`, `configMap.optional`, …) and Go emits `false` for a
//!      non-nil pointer. Only known plain-`bool` omitempty fields drop `false`: `stdin`,
//!      `stdinOnce`, `tty`, `hostNetwork`, `hostPID`, `hostIPC`, `readOnly` (except in
//!      `csi`/`azureDisk`, where it is `*bool`).
//!    - `0` is kept by default (`*int32`/`*int64` fields), dropped only for known plain
//!      omitempty / zero-emitting ints: `numOfHosts`, `containerPort`, `hostPort`, probe
//!      `initialDelaySeconds`/`timeoutSeconds`/`periodSeconds`/`successThreshold`/
//!      `failureThreshold`, `weight`, `maxSkew`.
//!    - `[]` ≡ absent (omitempty slices), except `containers` and `nodeSelectorTerms`
//!      (non-omitempty: Go emits `[]` vs `null`).
//!    - `{}` ≡ absent for non-pointer structs (`metadata`, `template`, `spec`,
//!      `scaleStrategy`, `headGroupSpec`, container `resources`) and omitempty maps
//!      (`labels`, `annotations`, `nodeSelector`, `limits`, …); **kept** for pointer
//!      structs (`emptyDir: {}`, `securityContext: {}`, `autoscalerOptions: {}`, pod-level
//!      `resources: {}`) and for `rayStartParams` (a non-omitempty map: `{}` vs `null`).
//!    - map entries are never dropped (a label `""` is a value).
//! 4. **Muting** per release ([`Rules::muted`]) gives the "muted" form KubeRay hashes.

use serde_json::{Map, Value};

use super::version::{MutedField, Rules};
use crate::quantity::Quantity;

/// A normalised RayClusterSpec.
#[derive(Clone, Debug, PartialEq)]
pub struct Normalized {
    /// After pruning, defaults and the Go round trip (muted fields still present).
    pub full: Value,
    /// `full` with the release's muted fields removed: what KubeRay hashes.
    pub muted: Value,
    /// Readable paths of fields pruned because this release doesn't know them.
    pub pruned: Vec<String>,
}

/// Normalise a RayClusterSpec JSON value for the given release.
///
/// `what` names the object in errors (e.g. `RayService ml/llm spec.rayClusterConfig`).
pub fn normalize_cluster_spec(
    spec: &Value,
    rules: &Rules,
    what: &str,
) -> crate::Result<Normalized> {
    let mut v = spec.clone();
    if !v.is_object() {
        return Err(crate::Error::invalid(
            what,
            "RayClusterSpec must be an object",
        ));
    }
    let pruned = prune_unknown(&mut v, rules);
    apply_defaults(&mut v, rules);
    let mut path = Vec::new();
    go_round_trip(&mut v, &mut path, what)?;
    let full = v.clone();
    mute(&mut v, rules);
    Ok(Normalized {
        full,
        muted: v,
        pruned,
    })
}

fn group_name(g: &Value, i: usize) -> String {
    g.get("groupName")
        .and_then(Value::as_str)
        .map_or_else(|| i.to_string(), str::to_string)
}

fn prune_unknown(v: &mut Value, rules: &Rules) -> Vec<String> {
    let mut pruned = Vec::new();
    let Some(top) = v.as_object_mut() else {
        return pruned;
    };
    retain_known(top, rules.cluster_fields, "", &mut pruned);
    if let Some(Value::Object(head)) = top.get_mut("headGroupSpec") {
        retain_known(head, rules.head_fields, "headGroupSpec.", &mut pruned);
    }
    if let Some(Value::Array(groups)) = top.get_mut("workerGroupSpecs") {
        for (i, g) in groups.iter_mut().enumerate() {
            let prefix = format!("workerGroupSpecs[{}].", group_name(g, i));
            if let Value::Object(m) = g {
                retain_known(m, rules.worker_fields, &prefix, &mut pruned);
            }
        }
    }
    pruned
}

fn retain_known(m: &mut Map<String, Value>, known: &[&str], prefix: &str, out: &mut Vec<String>) {
    let unknown: Vec<String> = m
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .cloned()
        .collect();
    for k in unknown {
        m.remove(&k);
        out.push(format!("{prefix}{k}"));
    }
}

fn set_default(m: &mut Map<String, Value>, key: &str, val: Value) {
    match m.get(key) {
        None | Some(Value::Null) => {
            m.insert(key.to_string(), val);
        }
        _ => {}
    }
}

fn apply_defaults(v: &mut Value, rules: &Rules) {
    let v17 = rules.version >= super::version::KubeRayVersion::latest();
    let Some(top) = v.as_object_mut() else { return };
    if v17 && let Some(Value::Object(np)) = top.get_mut("networkPolicy") {
        set_default(np, "mode", Value::from("DenyAll"));
    }
    if let Some(Value::Array(groups)) = top.get_mut("workerGroupSpecs") {
        for g in groups.iter_mut() {
            if let Value::Object(m) = g {
                set_default(m, "numOfHosts", Value::from(1));
                set_default(m, "replicas", Value::from(0));
                set_default(m, "minReplicas", Value::from(0));
                set_default(m, "maxReplicas", Value::from(2_147_483_647));
                if v17 {
                    set_default(m, "priority", Value::from(0));
                }
            }
        }
    }
    // Pod-template and headService defaults, anywhere below.
    defaults_walk(v, None);
}

fn defaults_walk(v: &mut Value, key: Option<&str>) {
    match v {
        Value::Object(m) => {
            match key {
                Some("azureDisk") => {
                    set_default(m, "fsType", Value::from("ext4"));
                    set_default(m, "readOnly", Value::from(false));
                }
                Some("rbd") => {
                    set_default(m, "pool", Value::from("rbd"));
                    set_default(m, "user", Value::from("admin"));
                    set_default(m, "keyring", Value::from("/etc/ceph/keyring"));
                }
                Some("iscsi") => set_default(m, "iscsiInterface", Value::from("default")),
                Some("scaleIO") => {
                    set_default(m, "fsType", Value::from("xfs"));
                    set_default(m, "storageMode", Value::from("ThinProvisioned"));
                }
                Some("fileKeyRef") => set_default(m, "optional", Value::from(false)),
                _ => {}
            }
            for (k, child) in m.iter_mut() {
                if k == "ports"
                    && let Value::Array(ports) = child
                {
                    for p in ports.iter_mut() {
                        if let Value::Object(pm) = p {
                            set_default(pm, "protocol", Value::from("TCP"));
                        }
                    }
                }
                defaults_walk(child, Some(k));
            }
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                defaults_walk(item, key);
            }
        }
        _ => {}
    }
}

/// A path segment while walking.
#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

fn render(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if k.contains(['.', '/']) => s.push_str(&format!("[{k}]")),
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn last_key(path: &[Seg]) -> Option<&str> {
    path.iter().rev().find_map(|s| match s {
        Seg::Key(k) => Some(k.as_str()),
        Seg::Index(_) => None,
    })
}

/// Key of the object that contains the current object (skipping list indices).
fn parent_key(path: &[Seg]) -> Option<&str> {
    let mut keys = path.iter().rev().filter_map(|s| match s {
        Seg::Key(k) => Some(k.as_str()),
        Seg::Index(_) => None,
    });
    keys.next();
    keys.next()
}

/// Whether the object at `path` is a Go map (entries are values, never omitted).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ObjKind {
    Struct,
    Map { quantities: bool, omitempty: bool },
}

/// `headGroupSpec.resources` / `workerGroupSpecs[i].resources` are `map[string]string`
/// (v1.5.0+); every other `resources` is a ResourceRequirements struct.
fn is_group_level(path: &[Seg]) -> bool {
    matches!(path, [Seg::Key(h), Seg::Key(_)] if h == "headGroupSpec")
        || matches!(path, [Seg::Key(w), Seg::Index(_), Seg::Key(_)] if w == "workerGroupSpecs")
}

pub(crate) const PLAIN_MAP_FIELDS: &[&str] = &[
    "labels",
    "annotations",
    "nodeSelector",
    "rayStartParams",
    "headServiceAnnotations",
    "matchLabels",
    "volumeAttributes",
];

fn obj_kind(path: &[Seg]) -> ObjKind {
    match last_key(path) {
        Some("limits" | "requests" | "overhead" | "capacity") => ObjKind::Map {
            quantities: true,
            omitempty: true,
        },
        Some("rayStartParams") => ObjKind::Map {
            quantities: false,
            omitempty: false,
        },
        Some("resources") if is_group_level(path) => ObjKind::Map {
            quantities: false,
            omitempty: true,
        },
        Some("options") if parent_key(path) == Some("flexVolume") => ObjKind::Map {
            quantities: false,
            omitempty: true,
        },
        Some(k) if PLAIN_MAP_FIELDS.contains(&k) => ObjKind::Map {
            quantities: false,
            omitempty: true,
        },
        _ => ObjKind::Struct,
    }
}

/// Whether the object at `path` is a Go map (for readable diff paths).
pub(crate) fn is_map_at(path_keys: &[Option<&str>]) -> bool {
    let segs: Vec<Seg> = path_keys
        .iter()
        .enumerate()
        .map(|(i, k)| k.map_or(Seg::Index(i), |k| Seg::Key(k.to_string())))
        .collect();
    matches!(obj_kind(&segs), ObjKind::Map { .. })
}

fn is_pointer_string(parent: Option<&str>, key: &str) -> bool {
    matches!(key, "managedBy" | "runtimeClassName" | "storageClassName")
        || (parent == Some("autoscalerOptions") && matches!(key, "image" | "imagePullPolicy"))
        || (parent == Some("authOptions") && key == "secretName")
        || (parent == Some("ingressOptions") && matches!(key, "host" | "path" | "pathType"))
}

fn is_plain_bool(parent: Option<&str>, key: &str) -> bool {
    match key {
        "stdin" | "stdinOnce" | "tty" | "hostNetwork" | "hostPID" | "hostIPC" => true,
        "readOnly" => !matches!(parent, Some("csi" | "azureDisk")),
        _ => false,
    }
}

fn is_plain_int(key: &str) -> bool {
    matches!(
        key,
        "numOfHosts"
            | "containerPort"
            | "hostPort"
            | "initialDelaySeconds"
            | "timeoutSeconds"
            | "periodSeconds"
            | "successThreshold"
            | "failureThreshold"
            | "weight"
            | "maxSkew"
    )
}

fn keeps_empty_list(key: &str) -> bool {
    matches!(key, "containers" | "nodeSelectorTerms")
}

/// Non-pointer struct fields: `{}` is the same as absent for Go.
fn is_value_struct(path_to_child: &[Seg], key: &str) -> bool {
    match key {
        "metadata" | "template" | "spec" | "scaleStrategy" | "headGroupSpec" => true,
        // Container.Resources is a value; PodSpec.Resources and autoscalerOptions.resources
        // are pointers; group-level resources is an omitempty map.
        "resources" => {
            is_group_level(path_to_child)
                || matches!(
                    parent_key(path_to_child),
                    Some("containers" | "initContainers" | "ephemeralContainers")
                )
        }
        _ => false,
    }
}

fn quantity_string(v: &Value, field: &str) -> crate::Result<String> {
    let s = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => {
            return Err(crate::Error::Quantity {
                field: field.to_string(),
                value: other.to_string(),
                reason: "not a string or number".to_string(),
            });
        }
    };
    Ok(Quantity::parse_amount_field(field, &s)?.canonical())
}

fn field_name(what: &str, path: &[Seg]) -> String {
    format!("{what}.{}", render(path))
}

fn go_round_trip(v: &mut Value, path: &mut Vec<Seg>, what: &str) -> crate::Result<()> {
    match v {
        Value::Object(m) => match obj_kind(path) {
            ObjKind::Map { quantities, .. } => {
                for (k, val) in m.iter_mut() {
                    path.push(Seg::Key(k.clone()));
                    if quantities {
                        *val = if val.is_null() {
                            Value::from("0")
                        } else {
                            Value::from(quantity_string(val, &field_name(what, path))?)
                        };
                    } else if val.is_null() {
                        *val = Value::from("");
                    }
                    path.pop();
                }
            }
            ObjKind::Struct => {
                let parent = last_key(path).map(str::to_string);
                let keys: Vec<String> = m.keys().cloned().collect();
                for k in keys {
                    path.push(Seg::Key(k.clone()));
                    let mut drop = false;
                    if let Some(child) = m.get_mut(&k) {
                        if matches!(k.as_str(), "sizeLimit" | "divisor") && !child.is_null() {
                            *child = Value::from(quantity_string(child, &field_name(what, path))?);
                        } else {
                            go_round_trip(child, path, what)?;
                        }
                        drop = match child {
                            Value::Null => true,
                            Value::String(s) => {
                                s.is_empty() && !is_pointer_string(parent.as_deref(), &k)
                            }
                            Value::Bool(b) => !*b && is_plain_bool(parent.as_deref(), &k),
                            Value::Number(n) => is_plain_int(&k) && n.as_f64() == Some(0.0),
                            Value::Array(a) => a.is_empty() && !keeps_empty_list(&k),
                            Value::Object(o) => {
                                o.is_empty()
                                    && (is_value_struct(path, &k)
                                        || matches!(
                                            obj_kind(path),
                                            ObjKind::Map {
                                                omitempty: true,
                                                ..
                                            }
                                        ))
                            }
                        };
                    }
                    if drop {
                        m.remove(&k);
                    }
                    path.pop();
                }
            }
        },
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(Seg::Index(i));
                if item.is_null() {
                    *item = Value::Object(Map::new());
                }
                go_round_trip(item, path, what)?;
                path.pop();
            }
        }
        _ => {}
    }
    Ok(())
}

/// Removes `key` from the object at `parent` (a JSON pointer, `""` for `v` itself), if any.
fn remove_at(v: &mut Value, parent: &str, key: &str) {
    if let Some(Value::Object(m)) = v.pointer_mut(parent) {
        m.remove(key);
    }
}

fn mute(v: &mut Value, rules: &Rules) {
    for f in &rules.muted {
        match f {
            MutedField::ClusterSuspend => remove_at(v, "", "suspend"),
            MutedField::ClusterUpgradeStrategy => remove_at(v, "", "upgradeStrategy"),
            MutedField::HeadTolerations => {
                remove_at(v, "/headGroupSpec/template/spec", "tolerations")
            }
            MutedField::HeadSchedulingGates => {
                remove_at(v, "/headGroupSpec/template/spec", "schedulingGates")
            }
            _ => {}
        }
    }
    if let Some(Value::Array(groups)) = v.get_mut("workerGroupSpecs") {
        for g in groups.iter_mut() {
            for f in &rules.muted {
                match f {
                    MutedField::WorkerReplicas => remove_at(g, "", "replicas"),
                    MutedField::WorkerMinReplicas => remove_at(g, "", "minReplicas"),
                    MutedField::WorkerMaxReplicas => remove_at(g, "", "maxReplicas"),
                    MutedField::WorkerWorkersToDelete => {
                        remove_at(g, "/scaleStrategy", "workersToDelete");
                        if g.get("scaleStrategy")
                            .and_then(Value::as_object)
                            .is_some_and(Map::is_empty)
                        {
                            remove_at(g, "", "scaleStrategy");
                        }
                    }
                    MutedField::WorkerTolerations => remove_at(g, "/template/spec", "tolerations"),
                    MutedField::WorkerSchedulingGates => {
                        remove_at(g, "/template/spec", "schedulingGates")
                    }
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberay::version::KubeRayVersion;
    use serde_json::json;

    fn norm(v: Value) -> Normalized {
        normalize_cluster_spec(&v, &KubeRayVersion::latest().rules(), "t").unwrap()
    }

    fn spec_with_limits(limits: Value) -> Value {
        json!({"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
            {"name": "ray-head", "image": "ray", "resources": {"limits": limits}}]}}}})
    }

    #[test]
    fn quantities_canonical() {
        let a = norm(spec_with_limits(
            json!({"cpu": "1000m", "memory": "1024Mi", "nvidia.com/gpu": 1}),
        ));
        let b = norm(spec_with_limits(
            json!({"cpu": 1, "memory": "1Gi", "nvidia.com/gpu": "1"}),
        ));
        assert_eq!(a, b);
        let lim =
            &a.full["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"];
        assert_eq!(lim["cpu"], "1");
        assert_eq!(lim["memory"], "1Gi");
        // Go keeps the format: 1Gi and 1073741824 are different strings.
        let c = norm(spec_with_limits(
            json!({"cpu": "1", "memory": "1073741824", "nvidia.com/gpu": 1}),
        ));
        assert_ne!(a.full, c.full);
    }

    #[test]
    fn other_quantity_fields() {
        let n = norm(json!({"headGroupSpec": {"template": {"spec": {
            "overhead": {"cpu": "250m", "memory": "120Mi"},
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2048Mi"}}],
            "containers": [{"name": "c", "env": [{"name": "M", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1024Ki"}}}]}]
        }}}}));
        let spec = &n.full["headGroupSpec"]["template"]["spec"];
        assert_eq!(spec["volumes"][0]["emptyDir"]["sizeLimit"], "2Gi");
        assert_eq!(spec["overhead"]["cpu"], "250m");
        assert_eq!(
            spec["containers"][0]["env"][0]["valueFrom"]["resourceFieldRef"]["divisor"],
            "1Mi"
        );
    }

    #[test]
    fn bad_quantity_names_the_field() {
        let err = normalize_cluster_spec(
            &json!({"workerGroupSpecs": [{"groupName": "gpu", "template": {"spec": {"containers": [
                {"name": "w", "resources": {"requests": {"memory": "12 GB"}}}]}}}]}),
            &KubeRayVersion::latest().rules(),
            "RayService ml/llm spec.rayClusterConfig",
        )
        .unwrap_err();
        match &err {
            crate::Error::Quantity { field, value, .. } => {
                assert_eq!(
                    field,
                    "RayService ml/llm spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].resources.requests.memory"
                );
                assert_eq!(value, "12 GB");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn empty_and_null_omission() {
        let a = norm(json!({
            "rayVersion": "", "headServiceAnnotations": {}, "autoscalerOptions": null,
            "headGroupSpec": {"rayStartParams": {}, "template": {"metadata": {"labels": {}}, "spec": {
                "containers": [{"name": "h", "image": "ray", "env": [], "resources": {"limits": {}}, "tty": false,
                                 "volumeMounts": [{"name": "v", "mountPath": "/v", "readOnly": false}]}],
                "tolerations": [], "nodeSelector": {}, "hostNetwork": false}}},
            "workerGroupSpecs": [{"groupName": "g", "rayStartParams": {}, "scaleStrategy": {},
                                  "template": {"spec": {"containers": [{"name": "w", "ports": []}]}}}]
        }));
        let b = norm(json!({
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
                "containers": [{"name": "h", "image": "ray", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}}},
            "workerGroupSpecs": [{"groupName": "g", "rayStartParams": {},
                                  "template": {"spec": {"containers": [{"name": "w"}]}}}]
        }));
        assert_eq!(a.full, b.full);
    }

    #[test]
    fn pointer_fields_are_not_omitted() {
        let base = json!({"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "h"}]}}}});
        let mut with_false = base.clone();
        with_false["enableInTreeAutoscaling"] = json!(false);
        assert_ne!(
            norm(base.clone()).full,
            norm(with_false).full,
            "*bool false is emitted by Go"
        );
        let mut empty_ptr = base.clone();
        empty_ptr["headGroupSpec"]["template"]["spec"]["containers"][0]["securityContext"] =
            json!({});
        assert_ne!(
            norm(base.clone()).full,
            norm(empty_ptr).full,
            "pointer struct {{}} is emitted"
        );
        let mut no_params = base.clone();
        no_params["headGroupSpec"]
            .as_object_mut()
            .unwrap()
            .remove("rayStartParams");
        assert_ne!(
            norm(base.clone()).full,
            norm(no_params).full,
            "rayStartParams is not omitempty"
        );
        let mut label = base.clone();
        label["headGroupSpec"]["template"]["metadata"] = json!({"labels": {"team": ""}});
        assert_eq!(
            norm(label).full["headGroupSpec"]["template"]["metadata"]["labels"]["team"],
            ""
        );
        let mut emptydir = base.clone();
        emptydir["headGroupSpec"]["template"]["spec"]["volumes"] =
            json!([{"name": "tmp", "emptyDir": {}}]);
        assert_eq!(
            norm(emptydir).full["headGroupSpec"]["template"]["spec"]["volumes"][0]["emptyDir"],
            json!({})
        );
    }

    #[test]
    fn crd_defaults() {
        let absent = norm(
            json!({"workerGroupSpecs": [{"groupName": "g", "template": {"spec": {"containers": [
            {"name": "w", "ports": [{"name": "metrics", "containerPort": 8080}]}]}}}]}),
        );
        let explicit = norm(
            json!({"workerGroupSpecs": [{"groupName": "g", "numOfHosts": 1, "replicas": 0,
            "minReplicas": 0, "maxReplicas": 2147483647, "priority": 0,
            "template": {"spec": {"containers": [{"name": "w", "ports": [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]}]}}}]}),
        );
        assert_eq!(absent, explicit);
        assert_eq!(absent.full["workerGroupSpecs"][0]["numOfHosts"], 1);
        let two = norm(json!({"workerGroupSpecs": [{"groupName": "g", "numOfHosts": 2}]}));
        assert_ne!(absent.muted, two.muted);
        // numOfHosts: 0 is omitted by Go (plain int32 omitempty) and is not 1.
        let zero = norm(json!({"workerGroupSpecs": [{"groupName": "g", "numOfHosts": 0}]}));
        assert!(zero.full["workerGroupSpecs"][0].get("numOfHosts").is_none());
    }

    #[test]
    fn prunes_unknown_fields_per_version() {
        let spec = json!({"futureField": 1, "workerGroupSpecs": [{"groupName": "g", "priority": 3, "labels": {"a": "b"}}]});
        let old =
            normalize_cluster_spec(&spec, &KubeRayVersion::parse("1.4").unwrap().rules(), "t")
                .unwrap();
        assert_eq!(
            old.pruned,
            vec![
                "futureField",
                "workerGroupSpecs[g].labels",
                "workerGroupSpecs[g].priority"
            ]
        );
        let new = norm(spec);
        assert_eq!(new.pruned, vec!["futureField"]);
        assert_eq!(new.full["workerGroupSpecs"][0]["priority"], 3);
    }

    #[test]
    fn group_level_resources_is_a_map() {
        let n = norm(
            json!({"workerGroupSpecs": [{"groupName": "g", "resources": {"TPU": "4", "x": ""}}]}),
        );
        assert_eq!(
            n.full["workerGroupSpecs"][0]["resources"],
            json!({"TPU": "4", "x": ""})
        );
    }
}
