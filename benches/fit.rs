//! Fit on a synthetic 2k-node / 50k-pod cluster: the size the controller
//! must handle every reconcile. Run: `cargo bench --bench fit`.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{LimitRange, Node, Pod};
use raygate::capacity::{ClusterState, FitRequest, fit, node_free};
use raygate::quantity::Quantity;
use serde_json::json;

const NODES: usize = 2_000;
const PODS: usize = 50_000;

fn node(i: usize) -> Node {
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
    let v = json!({
        "metadata": {"name": format!("node-{i:05}"), "labels": {
            "pool": if gpu { "gpu" } else { "cpu" },
            "topology.kubernetes.io/zone": format!("zone-{}", i % 3)}},
        "spec": {"taints": taints},
        "status": {"allocatable": alloc,
                   "conditions": [{"type": "Ready", "status": "True"}]}
    });
    serde_json::from_value(v).unwrap_or_default()
}

fn pod(i: usize, node: Option<String>, gpus: u32) -> Pod {
    let v = json!({
        "metadata": {"name": format!("pod-{i:06}"), "namespace": format!("ns-{}", i % 50)},
        "spec": {
            "nodeName": node,
            "nodeSelector": if gpus > 0 { json!({"pool": "gpu"}) } else { json!({}) },
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "1"}}}],
            "containers": [
                {"name": "main", "resources": {
                    "requests": {"cpu": "250m", "memory": "1Gi"},
                    "limits": {"nvidia.com/gpu": gpus.to_string()}}},
                {"name": "sidecar", "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}
            ]},
        "status": {"phase": if i.is_multiple_of(20) { "Succeeded" } else { "Running" }}
    });
    serde_json::from_value(v).unwrap_or_default()
}

fn state() -> ClusterState {
    let nodes = (0..NODES).map(node).collect();
    let pods = (0..PODS)
        .map(|i| {
            let n = i % NODES;
            let gpus = if n.is_multiple_of(4) && i.is_multiple_of(3) {
                1
            } else {
                0
            };
            raygate::capacity::PodRecord::from_pod(&pod(i, Some(format!("node-{n:05}")), gpus))
        })
        .collect();
    let lr: LimitRange = serde_json::from_value(json!({
        "metadata": {"name": "defaults", "namespace": "ray"},
        "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "100m"}}]}
    }))
    .unwrap_or_default();
    ClusterState {
        nodes,
        pods,
        limit_ranges: vec![lr],
        runtime_classes: vec![],
        ..Default::default()
    }
}

fn request() -> FitRequest {
    let mk = |prefix: &str, n: usize, gpus: u32| -> Vec<Pod> {
        (0..n)
            .map(|i| {
                let mut p = pod(i, None, gpus);
                p.metadata.name = Some(format!("{prefix}-{i}"));
                p.metadata.namespace = Some("ray".to_string());
                p.status = None;
                p
            })
            .collect()
    };
    FitRequest {
        pods: mk("new-worker", 200, 4)
            .into_iter()
            .map(Into::into)
            .collect(),
        reserved: mk("other-worker", 50, 2)
            .into_iter()
            .map(Into::into)
            .collect(),
        headroom: BTreeMap::from([("nvidia.com/gpu".to_string(), Quantity::from_units(16))]),
        old_requests: BTreeMap::new(),
    }
}

fn bench(c: &mut Criterion) {
    let s = state();
    let req = request();
    c.bench_function("node_free 2k nodes / 50k pods", |b| {
        b.iter(|| node_free(black_box(&s)).map(|r| r.usable.len()))
    });
    c.bench_function("fit 250 pods on 2k nodes / 50k pods", |b| {
        b.iter(|| fit(black_box(&s), black_box(&req)).map(|r| r.fits))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);
