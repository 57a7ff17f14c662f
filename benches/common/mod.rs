//! A synthetic cluster at Kubernetes' scalability limit, shared by the
//! benchmarks: nodes and pods as the apiserver returns them (labels, owner
//! references, env, probes, status conditions).

#![allow(dead_code)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use raygate::capacity::{CapacityIndex, ClusterState, PartialPod, PodGroup};
use serde_json::{Value, json};

pub const NODES: usize = 5_000;
pub const PODS: usize = 150_000;

/// Every fourth node has 8 GPUs and a taint.
pub fn node(i: usize) -> Node {
    let gpu = i.is_multiple_of(4);
    let mut alloc = json!({"cpu": "63500m", "memory": "503Gi", "pods": "110",
                           "ephemeral-storage": "900Gi"});
    if gpu {
        alloc["nvidia.com/gpu"] = json!("8");
    }
    let taints = if gpu {
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": format!("node-{i:05}"), "labels": {
            "pool": if gpu { "gpu" } else { "cpu" },
            "topology.kubernetes.io/zone": format!("zone-{}", i % 3)}},
        "spec": {"taints": taints},
        "status": {"allocatable": alloc,
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap_or_default()
}

/// Pod `i` as JSON, bound to node `i % NODES`; one in nine on a GPU node
/// asks for a GPU (3-4 of a GPU node's 8 are taken, as a scheduler could
/// have bound them, so a new cluster is really placed); a third are Ray pods.
pub fn pod_json(i: usize) -> Value {
    let n = i % NODES;
    let gpus = if n.is_multiple_of(4) && i.is_multiple_of(9) {
        1
    } else {
        0
    };
    let env: Vec<_> = (0..20)
        .map(|k| json!({"name": format!("VAR_{k}"), "value": format!("value-{i}-{k}")}))
        .collect();
    let mut labels = json!({"app": format!("svc-{}", i % 500), "pod-template-hash": "5d8f7c9b4"});
    if i.is_multiple_of(3) {
        labels["ray.io/cluster"] = json!(format!("svc-{}-abcde", i % 500));
        labels["ray.io/node-type"] = json!("worker");
        labels["ray.io/group"] = json!("gpu");
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("svc-{}-worker-{i:06}", i % 500), "namespace": format!("team-{}", i % 40),
            "uid": format!("00000000-0000-0000-0000-{i:012}"), "resourceVersion": "123456",
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": labels,
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T10:00:00Z", "prometheus.io/scrape": "true"},
            "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "svc", "uid": "x", "controller": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:containers": {}}}}]
        },
        "spec": {
            "nodeName": format!("node-{n:05}"),
            "nodeSelector": if gpus > 0 { json!({"pool": "gpu"}) } else { json!({}) },
            "containers": [{
                "name": "main", "image": "rayproject/ray:2.9.0-gpu", "command": ["/bin/bash", "-lc", "--"],
                "args": ["ray start --block --address=svc-head:6379"], "env": env,
                "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": gpus.to_string()}},
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "log", "mountPath": "/tmp/ray"}],
                "readinessProbe": {"exec": {"command": ["bash", "-c", "wget -T 2 -q -O- http://localhost:52365/-/healthz"]}, "periodSeconds": 5},
                "livenessProbe": {"exec": {"command": ["bash", "-c", "wget -T 2 -q -O- http://localhost:52365/-/healthz"]}, "periodSeconds": 5}
            }, {"name": "sidecar", "image": "fluent-bit:3", "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}],
            "initContainers": [{"name": "init", "image": "busybox", "command": ["sh", "-c", "true"],
                "resources": {"requests": {"cpu": "1"}}}],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}, {"name": "log", "emptyDir": {}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        },
        "status": {
            "phase": "Running", "podIP": "10.1.2.3", "hostIP": "10.0.0.1", "qosClass": "Burstable",
            "startTime": "2026-12-01T10:00:00Z",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-01T10:00:01Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T10:00:09Z"},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-12-01T10:00:09Z"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T10:00:00Z"}],
            "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "image": "rayproject/ray:2.9.0-gpu",
                "imageID": "docker-pullable://rayproject/ray@sha256:0123456789abcdef", "containerID": "containerd://abcdef",
                "state": {"running": {"startedAt": "2026-12-01T10:00:05Z"}}}]
        }
    })
}

/// A pod as raygate's watch parses it: the JSON text into [`PartialPod`].
pub fn partial(i: usize) -> PartialPod {
    let text = pod_json(i).to_string();
    serde_json::from_str(&text).unwrap_or_default()
}

/// The same cluster as records (for the from-scratch path) and as an index.
pub fn cluster() -> (ClusterState, CapacityIndex) {
    let nodes: Vec<Node> = (0..NODES).map(node).collect();
    let mut index = CapacityIndex::new();
    let mut pods = Vec::with_capacity(PODS);
    for i in 0..PODS {
        let rec = index.record(&partial(i));
        pods.push(rec.clone());
        index.apply_pod(rec);
    }
    for n in &nodes {
        index.apply_node(n.clone());
    }
    let state = ClusterState {
        nodes,
        pods,
        ..Default::default()
    };
    (state, index)
}

/// A new worker pod template asking for `gpus` GPUs (as KubeRay builds it).
pub fn worker(name: &str, gpus: u32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ray",
            "labels": {"ray.io/node-type": "worker", "ray.io/group": "gpu", "ray.io/cluster": "next"}},
        "spec": {
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "initContainers": [{"name": "wait-gcs-ready", "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}}}],
            "containers": [{"name": "ray-worker", "resources": {
                "requests": {"cpu": "4", "memory": "16Gi"},
                "limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
    }))
    .unwrap_or_default()
}

/// A 250-pod new cluster: a head and 249 one-GPU workers.
pub fn new_cluster(prefix: &str) -> Vec<PodGroup> {
    let mut head = worker(&format!("{prefix}-head"), 0);
    if let Some(s) = head.spec.as_mut() {
        s.node_selector = Some(BTreeMap::new());
    }
    vec![
        PodGroup::from(head),
        PodGroup::indexed(
            worker(&format!("{prefix}-gpu-worker-0"), 1),
            249,
            format!("{prefix}-gpu-worker-"),
        ),
    ]
}

/// Time this thread has spent on a CPU, in milliseconds (Linux's
/// `/proc/thread-self/schedstat`): on a machine shared with other builds,
/// wall time counts the waits for a core, this does not. `None` elsewhere.
pub fn cpu_ms() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e6)
}

/// Mean on-CPU time of `runs` runs of `f` (see [`cpu_ms`]), in
/// milliseconds. A mean over the batch, not a median: the kernel updates the
/// counter at scheduler ticks, too coarse for one run of a millisecond.
pub fn mean_cpu_ms(runs: usize, mut f: impl FnMut()) -> Option<f64> {
    let s = cpu_ms()?;
    for _ in 0..runs {
        f();
    }
    Some((cpu_ms()? - s) / runs.max(1) as f64)
}

/// Median of `runs` timings of `f`, in milliseconds.
pub fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = std::time::Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}
