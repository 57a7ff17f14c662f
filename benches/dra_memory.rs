//! Memory raygate keeps per ResourceSlice and per allocated ResourceClaim (its slim DRA
//! records, `capacity::dra::DraState`), measured as live heap with a counting allocator at the
//! `dra` bench's size: 1,250 slices of 8 GPUs as the NVIDIA DRA driver publishes them, and one
//! allocated claim per GPU (10,000). Run by hand: `cargo bench --bench dra_memory`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use raygate::capacity::dra::DraState;
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
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const SLICES: usize = 1_250;
const DEVICES: usize = 8;

fn slice(i: usize) -> ResourceSlice {
    let node = format!("node-{i:05}");
    let devices: Vec<_> = (0..DEVICES)
        .map(|d| {
            json!({"name": format!("gpu-{d}"), "attributes": {
                "productName": {"string": "NVIDIA H100 80GB HBM3"}, "index": {"int": d},
                "uuid": {"string": format!("GPU-{i:05}-{d}")},
                "driverVersion": {"version": "580.65.6"}, "architecture": {"string": "Hopper"}},
                "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu.nvidia.com")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices}}))
    .unwrap_or_default()
}

fn claim(i: usize, d: usize) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": format!("svc-worker-{i:05}-{d}-gpus-x7k2p"), "namespace": "team-1"},
        "spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu",
            "driver": "gpu.nvidia.com", "pool": format!("node-{i:05}"), "device": format!("gpu-{d}")}]}}}}))
    .unwrap_or_default()
}

fn main() {
    let full: Vec<ResourceSlice> = (0..100).map(slice).collect();
    let base = LIVE.load(Ordering::Relaxed);
    let full2: Vec<ResourceSlice> = full.clone();
    let full_per = (LIVE.load(Ordering::Relaxed) - base) as f64 / full2.len() as f64;
    drop((full, full2));

    let mut state = DraState::default();
    let base = LIVE.load(Ordering::Relaxed);
    for i in 0..SLICES {
        let s = slice(i);
        state.apply_slice(&s);
    }
    let slices = LIVE.load(Ordering::Relaxed) - base;
    let base = LIVE.load(Ordering::Relaxed);
    for i in 0..SLICES {
        for d in 0..DEVICES {
            let c = claim(i, d);
            state.apply_claim(&c);
        }
    }
    let claims = LIVE.load(Ordering::Relaxed) - base;
    let n_claims = SLICES * DEVICES;
    println!(
        "ResourceSlice ({DEVICES} devices, 5 attributes, 1 capacity each): as received {full_per:.0} \
         bytes, as raygate keeps it {:.0} bytes ({:.1} MiB for {SLICES}), {:.1}x smaller",
        slices as f64 / SLICES as f64,
        slices as f64 / (1024.0 * 1024.0),
        full_per / (slices as f64 / SLICES as f64)
    );
    println!(
        "allocated ResourceClaim (1 request, 1 device): {:.0} bytes ({:.1} MiB for {n_claims})",
        claims as f64 / n_claims as f64,
        claims as f64 / (1024.0 * 1024.0)
    );
    assert_eq!(state.slices().len(), SLICES);
    assert_eq!(state.claims().len(), n_claims);
}
