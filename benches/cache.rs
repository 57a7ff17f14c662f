//! Memory of raygate's pod cache at 150,000 realistic pods, measured as
//! live heap with a counting allocator: the index of pod records raygate
//! keeps, beside full `Pod` objects as received (measured on 10,000 and
//! given per pod). Run by hand: `cargo bench --bench cache`.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use raygate::capacity::CapacityIndex;

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

const FULL_SAMPLE: usize = 10_000;

fn main() {
    let per = |b: isize, n: usize| b as f64 / n as f64;
    let mb = |b: isize| b as f64 / (1024.0 * 1024.0);

    let base = LIVE.load(Ordering::Relaxed);
    let full: Vec<Pod> = (0..FULL_SAMPLE)
        .map(|i| serde_json::from_value(common::pod_json(i)).unwrap_or_default())
        .collect();
    let full_bytes = LIVE.load(Ordering::Relaxed) - base;
    drop(full);

    // Nodes first, as after a start; then every pod through the watch type.
    let base = LIVE.load(Ordering::Relaxed);
    let t = Instant::now();
    let mut index = CapacityIndex::new();
    for i in 0..common::NODES {
        index.apply_node(common::node(i));
    }
    let nodes_bytes = LIVE.load(Ordering::Relaxed) - base;
    for i in 0..common::PODS {
        let rec = index.record(&common::partial(i));
        index.apply_pod(rec);
    }
    let built = t.elapsed();
    let total = LIVE.load(Ordering::Relaxed) - base;
    let pods_bytes = total - nodes_bytes;

    // A relist replaces records in place: the peak stays one copy.
    let before = LIVE.load(Ordering::Relaxed);
    index.begin_pod_relist();
    for i in 0..common::PODS {
        let rec = index.record(&common::partial(i));
        index.apply_pod(rec);
    }
    index.end_pod_relist();
    let after = LIVE.load(Ordering::Relaxed);

    println!("pods: {}", common::PODS);
    println!(
        "as received (full Pod, {FULL_SAMPLE} measured): {:>8.0} bytes/pod ({:.0} MiB at {} pods)",
        per(full_bytes, FULL_SAMPLE),
        per(full_bytes, FULL_SAMPLE) * common::PODS as f64 / (1024.0 * 1024.0),
        common::PODS
    );
    println!(
        "as raygate keeps them (index):         {:>8.0} bytes/pod ({:.1} MiB; built in {built:?})",
        per(pods_bytes, common::PODS),
        mb(pods_bytes)
    );
    println!(
        "ratio:                                 {:>8.1}x smaller",
        per(full_bytes, FULL_SAMPLE) / per(pods_bytes, common::PODS)
    );
    println!(
        "nodes ({}): {:.1} MiB; after a relist: {:+.1} MiB",
        common::NODES,
        mb(nodes_bytes),
        mb(after - before)
    );
    assert_eq!(index.pod_count(), common::PODS);
}
