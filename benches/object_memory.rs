//! Memory raygate keeps per RayService (issue 26): the hostile object of the issue, 5,000
//! worker groups of one replica (about 1.2 MB, with the managedFields a `kubectl apply`
//! gives it), beside an ordinary 4-group RayService, each as the watch delivers it
//! (`DeserializeGuard<RayService>`) and as the cache keeps it after
//! `controller::cache::slim_service` (spec within `kuberay::budget`, no Serve config,
//! managedFields reduced to the gate's owners). Live heap with a counting allocator, with
//! the peak while the object is read, and the ratios. Run by hand:
//! `cargo bench --bench object_memory`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use kube::core::DeserializeGuard;
use raygate::controller::cache::slim_service;
use raygate::kuberay::RayService;
use serde_json::{Value, json};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn grew(by: isize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn rayservice(groups: usize) -> String {
    let container = json!({"name": "ray-worker", "image": "rayproject/ray:2.46.0",
        "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"},
                      "requests": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"}}});
    let workers: Vec<Value> = (0..groups)
        .map(|i| {
            json!({"groupName": format!("g{i:04}"), "replicas": 1, "minReplicas": 1,
                "maxReplicas": 1, "rayStartParams": {},
                "template": {"spec": {"containers": [container]}}})
        })
        .collect();
    let fields: serde_json::Map<String, Value> = (0..groups)
        .map(|i| {
            (
                format!("k:{{\"groupName\":\"g{i:04}\"}}"),
                json!({".": {}, "f:groupName": {},
                "f:replicas": {}, "f:minReplicas": {}, "f:maxReplicas": {}, "f:rayStartParams": {},
                "f:template": {"f:spec": {"f:containers": {}}}}),
            )
        })
        .collect();
    let serve = "applications:\n- name: app\n  import_path: m:app\n".repeat(20);
    json!({"apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": "hostile", "namespace": "tenant", "uid": "u-1", "generation": 1,
            "managedFields": [
                {"manager": "kubectl", "operation": "Apply", "apiVersion": "ray.io/v1",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:serveConfigV2": {},
                    "f:rayClusterConfig": {"f:workerGroupSpecs": fields}}}},
                {"manager": "raygate", "operation": "Apply", "apiVersion": "ray.io/v1",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:upgradeStrategy": {"f:type": {}}}}}]},
        "spec": {"serveConfigV2": serve, "upgradeStrategy": {"type": "None"},
            "rayClusterConfig": {"rayVersion": "2.46.0",
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                    {"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}}},
                "workerGroupSpecs": workers}}})
    .to_string()
}

fn main() {
    for (what, groups) in [("ordinary, 4 groups", 4), ("hostile, 5,000 groups", 5_000)] {
        let text = rayservice(groups);
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let mut obj: DeserializeGuard<RayService> = match serde_json::from_str(&text) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("{what}: {e}");
                continue;
            }
        };
        let received = LIVE.load(Ordering::Relaxed) - base;
        slim_service(&mut obj);
        let kept = LIVE.load(Ordering::Relaxed) - base;
        let peak = PEAK.load(Ordering::Relaxed) - base;
        let refused = obj
            .0
            .as_ref()
            .ok()
            .and_then(|s| s.spec.ray_cluster_config.as_ref())
            .and_then(|c| c.over_budget.as_ref())
            .map(|e| e.to_string());
        println!(
            "{what}: {} B as JSON; {received} B as received, {kept} B kept ({:.1}x smaller), \
             peak {peak} B while read; {}",
            text.len(),
            received as f64 / kept.max(1) as f64,
            refused.unwrap_or_else(|| "kept whole".into())
        );
        drop(obj);
    }
}
