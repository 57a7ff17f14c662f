//! Builds head and worker Pods for a RayCluster the way KubeRay v1.7.0 does
//! (`common/pod.go`, `raycluster_controller.go` buildHeadPod/buildWorkerPod), reduced to what
//! matters to a scheduler and to raygate: names, labels, owner references, resources, the
//! injected `wait-gcs-ready` init container and the autoscaler sidecar.

use super::names::*;
use crate::json::{arr_at, get, obj_mut, str_at, string_map};
use serde_json::{Map, Value, json};

/// Go `rand.String(5)` from k8s.io/apimachinery: lowercase consonants and digits.
pub fn rand_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect()
}

/// `utils.PodName`: prefix truncated to 50 chars + `-head-` / `-worker-` (a generateName).
fn pod_generate_name(prefix: &str, node_type: &str) -> String {
    let p: String = prefix.chars().take(50).collect();
    format!("{p}-{node_type}-").to_lowercase()
}

/// Controller owner reference (`SetControllerReference`).
pub fn controller_ref(owner: &Value, kind: &str) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": str_at(owner, &["metadata", "name"]),
        "uid": str_at(owner, &["metadata", "uid"]),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// `utils.IsAutoscalingEnabled`: `enableInTreeAutoscaling` is nil/false by default in v1.7.
pub fn autoscaling_enabled(cluster: &Value) -> bool {
    crate::json::bool_at(cluster, &["spec", "enableInTreeAutoscaling"])
}

fn head_service_fqdn(cluster: &Value) -> String {
    format!(
        "{}-head-svc.{}.svc.cluster.local",
        str_at(cluster, &["metadata", "name"]),
        str_at(cluster, &["metadata", "namespace"])
    )
}

fn head_port(cluster: &Value) -> String {
    match get(
        cluster,
        &["spec", "headGroupSpec", "rayStartParams", "port"],
    ) {
        Some(Value::String(s)) => s.clone(),
        _ => "6379".into(),
    }
}

/// `labelPod` plus the RayService serve label and the template/top-level labels.
fn pod_labels(
    cluster: &Value,
    group_spec: &Value,
    node_type: &str,
    group: &str,
) -> Map<String, Value> {
    let name = str_at(cluster, &["metadata", "name"]);
    let mut labels = Map::new();
    for (k, v) in [
        (IS_RAY_NODE_LABEL, "yes".to_string()),
        (RAY_CLUSTER_LABEL, name.to_string()),
        (NODE_TYPE_LABEL, node_type.to_string()),
        (GROUP_LABEL, group.to_string()),
        (IDENTIFIER_LABEL, format!("{name}-{node_type}")),
        (APP_NAME_LABEL, "kuberay".to_string()),
        (CREATED_BY_LABEL, "kuberay-operator".to_string()),
    ] {
        labels.insert(k.into(), Value::String(v));
    }
    let mut overrides = string_map(group_spec, &["template", "metadata", "labels"]);
    overrides.extend(string_map(group_spec, &["labels"]));
    for (k, v) in overrides {
        if k == NODE_TYPE_LABEL || k == GROUP_LABEL || k == RAY_CLUSTER_LABEL {
            continue;
        }
        labels.insert(k, Value::String(v));
    }
    let created_by_service =
        str_at(cluster, &["metadata", "labels", ORIGINATED_FROM_CRD]) == RAY_SERVICE_CRD;
    if created_by_service {
        // Workers are always serve-eligible; the head starts "false" and the RayService
        // controller flips it once the proxy is healthy (updateHeadPodServeLabel).
        let v = if node_type == "head" { "false" } else { "true" };
        labels.insert(SERVE_LABEL.into(), Value::String(v.into()));
    }
    labels
}

fn bash_command() -> Value {
    json!(["/bin/bash", "-c", "--"])
}

fn ray_start_command(node_type: &str, params: &Value, fqdn: &str, port: &str) -> String {
    let mut cmd = if node_type == "head" {
        "ray start --head".to_string()
    } else {
        format!("ray start --address={fqdn}:{port}")
    };
    if let Some(m) = params.as_object() {
        let mut keys: Vec<&String> = m.keys().collect();
        keys.sort();
        for k in keys {
            if node_type == "worker" && k == "address" {
                continue;
            }
            match m.get(k) {
                Some(Value::String(v)) => cmd.push_str(&format!(" --{k}={v}")),
                Some(other) => cmd.push_str(&format!(" --{k}={other}")),
                None => {}
            }
        }
    }
    if !cmd.contains("--block") {
        cmd.push_str(" --block");
    }
    if !cmd.contains("--metrics-export-port") {
        cmd.push_str(" --metrics-export-port=8080");
    }
    cmd
}

fn push_env(container: &mut Value, name: &str, value: Value) {
    let env = obj_mut(container, &[])
        .entry("env")
        .or_insert_with(|| json!([]));
    if let Some(a) = env.as_array_mut() {
        if a.iter()
            .any(|e| e.get("name").and_then(Value::as_str) == Some(name))
        {
            return;
        }
        let mut e = json!({"name": name});
        match value {
            Value::String(s) => e["value"] = Value::String(s),
            other => e["valueFrom"] = other,
        }
        a.push(e);
    }
}

fn push_volume_mount(container: &mut Value, name: &str, path: &str) {
    let mounts = obj_mut(container, &[])
        .entry("volumeMounts")
        .or_insert_with(|| json!([]));
    if let Some(a) = mounts.as_array_mut()
        && !a
            .iter()
            .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(path))
    {
        a.push(json!({"name": name, "mountPath": path}));
    }
}

fn push_empty_dir(spec: &mut Value, name: &str, medium: Option<&str>) {
    let vols = obj_mut(spec, &[])
        .entry("volumes")
        .or_insert_with(|| json!([]));
    if let Some(a) = vols.as_array_mut()
        && !a
            .iter()
            .any(|v| v.get("name").and_then(Value::as_str) == Some(name))
    {
        let ed = match medium {
            Some(m) => json!({"medium": m}),
            None => json!({}),
        };
        a.push(json!({"name": name, "emptyDir": ed}));
    }
}

/// `BuildPod`: command/args for `ray start`, env vars, /dev/shm, metrics port.
fn finish_ray_container(pod: &mut Value, cluster: &Value, node_type: &str, params: &Value) {
    let fqdn = head_service_fqdn(cluster);
    let port = head_port(cluster);
    let cluster_name = str_at(cluster, &["metadata", "name"]).to_string();
    let start = ray_start_command(node_type, params, &fqdn, &port);
    let Some(c0) = pod
        .pointer_mut("/spec/containers/0")
        .filter(|c| c.is_object())
    else {
        return;
    };
    let existing = [arr_at(c0, &["command"]), arr_at(c0, &["args"])]
        .concat()
        .iter()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join(" ");
    if !existing.contains("ray start") {
        let generated = format!("ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {start}");
        let args = if existing.is_empty() {
            generated
        } else {
            format!("{existing} && {generated}")
        };
        c0["command"] = bash_command();
        c0["args"] = json!([args]);
    }
    push_env(
        c0,
        "RAY_CLUSTER_NAME",
        json!({"fieldRef": {"fieldPath": format!("metadata.labels['{RAY_CLUSTER_LABEL}']")}}),
    );
    push_env(
        c0,
        "RAY_CLOUD_INSTANCE_ID",
        json!({"fieldRef": {"fieldPath": "metadata.name"}}),
    );
    push_env(
        c0,
        "RAY_NODE_TYPE_NAME",
        json!({"fieldRef": {"fieldPath": format!("metadata.labels['{GROUP_LABEL}']")}}),
    );
    push_env(c0, "KUBERAY_GEN_RAY_START_CMD", Value::String(start));
    push_env(c0, "RAY_PORT", Value::String(port.clone()));
    push_env(c0, "RAY_ADDRESS", Value::String(format!("{fqdn}:{port}")));
    push_env(
        c0,
        "RAY_USAGE_STATS_KUBERAY_IN_USE",
        Value::String("1".into()),
    );
    if node_type == "head" {
        push_env(
            c0,
            "RAY_CLUSTER_NAME_FOR_DASHBOARD",
            Value::String(cluster_name),
        );
    }
    push_volume_mount(c0, "shared-mem", "/dev/shm");
    let ports = obj_mut(c0, &[]).entry("ports").or_insert_with(|| json!([]));
    if let Some(a) = ports.as_array_mut()
        && !a
            .iter()
            .any(|p| p.get("name").and_then(Value::as_str) == Some("metrics"))
    {
        a.push(json!({"name": "metrics", "containerPort": 8080, "protocol": "TCP"}));
    }
    if let Some(spec) = pod.get_mut("spec") {
        push_empty_dir(spec, "shared-mem", Some("Memory"));
    }
    let init_env = [
        ("FQ_RAY_IP", fqdn.clone()),
        ("RAY_IP", fqdn.split('.').next().unwrap_or("").to_string()),
    ];
    if let Some(inits) = pod
        .pointer_mut("/spec/initContainers")
        .and_then(Value::as_array_mut)
    {
        for ic in inits {
            for (k, v) in &init_env {
                push_env(ic, k, Value::String(v.clone()));
            }
        }
    }
}

fn base_pod(
    cluster: &Value,
    group_spec: &Value,
    generate_name: String,
    labels: Map<String, Value>,
) -> Value {
    let template = group_spec
        .get("template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut annotations = template
        .pointer("/metadata/annotations")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if !annotations.is_object() {
        annotations = json!({});
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": generate_name,
            "namespace": str_at(cluster, &["metadata", "namespace"]),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [controller_ref(cluster, "RayCluster")],
        },
        "spec": template.get("spec").cloned().unwrap_or_else(|| json!({"containers": []})),
    })
}

/// Head Pod (`buildHeadPod`): generateName `<cluster>-head-`, plus the autoscaler sidecar
/// (500m/512Mi) when in-tree autoscaling is on.
pub fn head_pod(cluster: &Value, cluster_hash: &str) -> Value {
    let head = get(cluster, &["spec", "headGroupSpec"])
        .cloned()
        .unwrap_or_else(|| json!({}));
    let name = str_at(cluster, &["metadata", "name"]);
    let labels = pod_labels(cluster, &head, "head", HEAD_GROUP);
    let mut pod = base_pod(cluster, &head, pod_generate_name(name, "head"), labels);
    if autoscaling_enabled(cluster) {
        let image = pod
            .pointer("/spec/containers/0/image")
            .cloned()
            .unwrap_or(Value::Null);
        let start = "ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) --cluster-namespace $(RAY_CLUSTER_NAMESPACE)";
        let mut autoscaler = json!({
            "name": "autoscaler",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "env": [
                {"name": "RAY_CLUSTER_NAME", "valueFrom": {"fieldRef": {"fieldPath": format!("metadata.labels['{RAY_CLUSTER_LABEL}']")}}},
                {"name": "RAY_CLUSTER_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "RAY_HEAD_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "KUBERAY_CRD_VER", "value": "v1"},
                {"name": "KUBERAY_GEN_AUTOSCALER_START_CMD", "value": start},
            ],
            "command": bash_command(),
            "args": [start],
            "resources": {
                "limits": {"cpu": "500m", "memory": "512Mi"},
                "requests": {"cpu": "500m", "memory": "512Mi"},
            },
        });
        if let Some(opts) = get(cluster, &["spec", "autoscalerOptions"]) {
            for (from, to) in [
                ("resources", "resources"),
                ("image", "image"),
                ("imagePullPolicy", "imagePullPolicy"),
                ("securityContext", "securityContext"),
                ("command", "command"),
                ("args", "args"),
            ] {
                if let Some(v) = opts.get(from).filter(|v| !v.is_null()) {
                    autoscaler[to] = v.clone();
                }
            }
            for list in ["env", "envFrom", "volumeMounts"] {
                if let Some(extra) = opts.get(list).and_then(Value::as_array) {
                    let entry = obj_mut(&mut autoscaler, &[])
                        .entry(list)
                        .or_insert_with(|| json!([]));
                    if let Some(a) = entry.as_array_mut() {
                        a.extend(extra.iter().cloned());
                    }
                }
            }
        }
        push_volume_mount(&mut autoscaler, "ray-logs", "/tmp/ray");
        if let Some(c0) = pod.pointer_mut("/spec/containers/0") {
            push_volume_mount(c0, "ray-logs", "/tmp/ray");
        }
        if let Some(cs) = pod
            .pointer_mut("/spec/containers")
            .and_then(Value::as_array_mut)
        {
            cs.push(autoscaler);
        }
        if let Some(spec) = pod.get_mut("spec") {
            push_empty_dir(spec, "ray-logs", None);
        }
    }
    let params = head
        .get("rayStartParams")
        .cloned()
        .unwrap_or_else(|| json!({}));
    finish_ray_container(&mut pod, cluster, "head", &params);
    let ann = obj_mut(&mut pod, &["metadata", "annotations"]);
    ann.insert(
        RECREATE_HASH_ANNOTATION.into(),
        Value::String(cluster_hash.into()),
    );
    ann.insert(
        KUBERAY_VERSION_ANNOTATION.into(),
        Value::String(KUBERAY_VERSION.into()),
    );
    pod
}

/// Worker Pod (`buildWorkerPod`): generateName `<cluster>-<group>-worker-`, the injected
/// `wait-gcs-ready` init container (200m/256Mi requests and limits), and the multi-host
/// indexing labels that v1.7 enables by default.
pub fn worker_pod(
    cluster: &Value,
    group: &Value,
    replica_index: usize,
    replica_name: Option<&str>,
    host_index: usize,
) -> Value {
    let cluster_name = str_at(cluster, &["metadata", "name"]);
    let group_name = str_at(group, &["groupName"]);
    let mut labels = pod_labels(cluster, group, "worker", group_name);
    labels.insert(
        REPLICA_INDEX_LABEL.into(),
        Value::String(replica_index.to_string()),
    );
    if let Some(rn) = replica_name {
        labels.insert(REPLICA_NAME_LABEL.into(), Value::String(rn.into()));
        labels.insert(
            HOST_INDEX_LABEL.into(),
            Value::String(host_index.to_string()),
        );
    }
    let mut pod = base_pod(
        cluster,
        group,
        pod_generate_name(&format!("{cluster_name}-{group_name}"), "worker"),
        labels,
    );
    let fqdn = head_service_fqdn(cluster);
    let port = head_port(cluster);
    if let Some(c0) = pod.pointer("/spec/containers/0").cloned() {
        let script = format!(
            "\n\t\t\t\t\tSECONDS=0\n\t\t\t\t\twhile true; do\n\t\t\t\t\t\tif (( SECONDS <= 120 )); then\n\t\t\t\t\t\t\tif ray health-check --address {fqdn}:{port} > /dev/null 2>&1; then\n\t\t\t\t\t\t\t\techo \"GCS is ready.\"\n\t\t\t\t\t\t\t\tbreak\n\t\t\t\t\t\t\tfi\n\t\t\t\t\t\t\techo \"$SECONDS seconds elapsed: Waiting for GCS to be ready.\"\n\t\t\t\t\t\telse\n\t\t\t\t\t\t\tif ray health-check --address {fqdn}:{port}; then\n\t\t\t\t\t\t\t\techo \"GCS is ready. Any error messages above can be safely ignored.\"\n\t\t\t\t\t\t\t\tbreak\n\t\t\t\t\t\t\tfi\n\t\t\t\t\t\t\techo \"$SECONDS seconds elapsed: Still waiting for GCS to be ready.\"\n\t\t\t\t\t\tfi\n\t\t\t\t\t\tsleep 5\n\t\t\t\t\tdone\n\t\t\t\t"
        );
        let mut init = json!({
            "name": "wait-gcs-ready",
            "image": c0.get("image").cloned().unwrap_or(Value::Null),
            "command": bash_command(),
            "args": [script],
            "resources": {
                "limits": {"cpu": "200m", "memory": "256Mi"},
                "requests": {"cpu": "200m", "memory": "256Mi"},
            },
        });
        for k in ["imagePullPolicy", "securityContext", "env", "volumeMounts"] {
            if let Some(v) = c0.get(k).filter(|v| !v.is_null()) {
                init[k] = v.clone();
            }
        }
        let inits = obj_mut(&mut pod, &["spec"])
            .entry("initContainers")
            .or_insert_with(|| json!([]));
        if let Some(a) = inits.as_array_mut() {
            a.push(init);
        }
    }
    let params = group
        .get("rayStartParams")
        .cloned()
        .unwrap_or_else(|| json!({}));
    finish_ray_container(&mut pod, cluster, "worker", &params);
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Value {
        json!({
            "metadata": {"name": "svc-abcde", "namespace": "ns", "uid": "u1",
                         "labels": {ORIGINATED_FROM_CRD: "RayService"}},
            "spec": {
                "enableInTreeAutoscaling": true,
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                    {"name": "ray-head", "image": "rayproject/ray:2.9.0",
                     "resources": {"requests": {"cpu": "2"}}}]}}},
                "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "template": {
                    "metadata": {"labels": {"team": "a", "ray.io/group": "evil"}},
                    "spec": {"containers": [{"name": "w", "image": "rayproject/ray:2.9.0-gpu",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}]
            }
        })
    }

    #[test]
    fn head_pod_shape() {
        let p = head_pod(&cluster(), "H");
        assert_eq!(p["metadata"]["generateName"], "svc-abcde-head-");
        assert_eq!(p["metadata"]["labels"][NODE_TYPE_LABEL], "head");
        assert_eq!(p["metadata"]["labels"][GROUP_LABEL], "headgroup");
        assert_eq!(p["metadata"]["labels"][SERVE_LABEL], "false");
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "RayCluster");
        assert_eq!(p["metadata"]["ownerReferences"][0]["controller"], true);
        let cs = p["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[1]["name"], "autoscaler");
        assert_eq!(cs[1]["resources"]["requests"]["cpu"], "500m");
        assert!(
            cs[0]["args"][0]
                .as_str()
                .unwrap()
                .contains("ray start --head")
        );
    }

    #[test]
    fn worker_pod_shape() {
        let c = cluster();
        let p = worker_pod(&c, &c["spec"]["workerGroupSpecs"][0], 0, None, 0);
        assert_eq!(p["metadata"]["generateName"], "svc-abcde-gpu-worker-");
        assert_eq!(p["metadata"]["labels"][GROUP_LABEL], "gpu");
        assert_eq!(p["metadata"]["labels"]["team"], "a");
        assert_eq!(p["metadata"]["labels"][SERVE_LABEL], "true");
        assert_eq!(p["metadata"]["labels"][REPLICA_INDEX_LABEL], "0");
        let init = &p["spec"]["initContainers"][0];
        assert_eq!(init["name"], "wait-gcs-ready");
        assert_eq!(init["resources"]["requests"]["memory"], "256Mi");
        assert_eq!(
            p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "1"
        );
    }
}
