//! Memory of raygate's pod cache: live heap bytes for 100k realistic pods,
//! as the apiserver sends them and as raygate keeps them after slimming
//! (`controller::cache::slim_pod`). Measured with a counting allocator, not
//! estimated. Run: `cargo bench --bench cache`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use raygate::controller::cache::slim_pod;
use serde_json::json;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const PODS: usize = 100_000;

/// A pod as a busy cluster has them: env, volumes, probes, managedFields.
fn pod(i: usize) -> Pod {
    let env: Vec<_> = (0..20)
        .map(|k| json!({"name": format!("VAR_{k}"), "value": format!("value-{i}-{k}")}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("svc-{}-worker-{i:06}", i % 500), "namespace": format!("team-{}", i % 40),
            "uid": format!("00000000-0000-0000-0000-{i:012}"), "resourceVersion": "123456",
            "labels": {"app": "svc", "ray.io/cluster": format!("svc-{}", i % 500), "ray.io/node-type": "worker",
                       "ray.io/group": "gpu", "pod-template-hash": "5d8f7c9b4"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T10:00:00Z", "prometheus.io/scrape": "true"},
            "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "svc", "uid": "x", "controller": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:containers": {}}}}]
        },
        "spec": {
            "nodeName": format!("node-{}", i % 2000),
            "containers": [{
                "name": "ray-worker", "image": "rayproject/ray:2.9.0-gpu", "command": ["/bin/bash", "-lc", "--"],
                "args": ["ray start --block --address=svc-head:6379"], "env": env,
                "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"nvidia.com/gpu": "4"}},
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "log", "mountPath": "/tmp/ray"}],
                "readinessProbe": {"exec": {"command": ["bash", "-c", "wget -T 2 -q -O- http://localhost:52365/-/healthz"]}, "periodSeconds": 5},
                "livenessProbe": {"exec": {"command": ["bash", "-c", "wget -T 2 -q -O- http://localhost:52365/-/healthz"]}, "periodSeconds": 5}
            }],
            "initContainers": [{"name": "wait-gcs-ready", "image": "rayproject/ray:2.9.0-gpu",
                "command": ["/bin/bash", "-lc", "--"], "args": ["until ray health-check; do sleep 5; done"],
                "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "200m", "memory": "256Mi"}}}],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}, {"name": "log", "emptyDir": {}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        },
        "status": {
            "phase": "Running", "podIP": "10.1.2.3", "hostIP": "10.0.0.1", "qosClass": "Burstable",
            "startTime": "2026-12-01T10:00:00Z",
            "conditions": [
                {"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "ray-worker", "ready": true, "restartCount": 0, "image": "rayproject/ray:2.9.0-gpu",
                "imageID": "docker-pullable://rayproject/ray@sha256:0123456789abcdef", "containerID": "containerd://abcdef",
                "state": {"running": {"startedAt": "2026-12-01T10:00:05Z"}}}]
        }
    }))
    .unwrap_or_default()
}

fn main() {
    let base = LIVE.load(Ordering::Relaxed);
    let t = Instant::now();
    let mut pods: Vec<Pod> = (0..PODS).map(pod).collect();
    let full = LIVE.load(Ordering::Relaxed) - base;
    let built = t.elapsed();
    let t = Instant::now();
    for p in pods.iter_mut() {
        slim_pod(p);
    }
    let slimming = t.elapsed();
    pods.shrink_to_fit();
    let slim = LIVE.load(Ordering::Relaxed) - base;
    let mb = |b: isize| b as f64 / (1024.0 * 1024.0);
    println!("pods: {PODS}");
    println!(
        "as received: {:>8.1} MiB live heap ({:.0} bytes/pod; built in {built:?})",
        mb(full),
        full as f64 / PODS as f64
    );
    println!(
        "as cached:   {:>8.1} MiB live heap ({:.0} bytes/pod; slimmed in {slimming:?})",
        mb(slim),
        slim as f64 / PODS as f64
    );
    println!(
        "saved:       {:>8.1}%",
        100.0 * (1.0 - slim as f64 / full as f64)
    );
    assert!(slim < full, "slimming must reduce memory");
}
