//! One admission decision at Kubernetes' scalability limit: 5,000 nodes,
//! 150,000 realistic pods, placing a 250-pod new cluster next to 50
//! reserved pods. From scratch (every pod summed per decision) against the
//! incremental index (per-node aggregates read), in the same run, with the
//! ratio printed. Run by hand: `cargo bench --bench fit`.

mod common;

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use raygate::capacity::{ClusterState, FitRequest, PodGroup, fit, node_free};
use raygate::quantity::Quantity;

fn request() -> FitRequest {
    FitRequest {
        pods: common::new_cluster("ray/next"),
        reserved: vec![PodGroup::indexed(
            common::worker("other-gpu-worker-0", 2),
            50,
            "other-gpu-worker-".into(),
        )],
        headroom: BTreeMap::from([("nvidia.com/gpu".to_string(), Quantity::from_units(16))]),
        old_requests: BTreeMap::new(),
    }
}

fn bench(c: &mut Criterion) {
    let (state, mut index) = common::cluster();
    let rules = ClusterState::default();
    let req = request();
    // The first decision after a node changed also evaluates the groups'
    // static filters (selectors, taints) on every node; later ones find them
    // cached. Measured by changing a node's zone label before each run.
    let mut colds: Vec<f64> = (0..11)
        .map(|k| {
            let mut n = common::node(1);
            if let Some(l) = n.metadata.labels.as_mut() {
                l.insert("topology.kubernetes.io/zone".into(), format!("zone-x{k}"));
            }
            index.apply_node(n);
            let t = std::time::Instant::now();
            let _ = black_box(index.fit(&rules, &req));
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    colds.sort_by(f64::total_cmp);
    let cold = colds[colds.len() / 2];
    let (a, b) = (
        fit(&state, &req).map(|r| (r.fits, r.placements.len())),
        index
            .fit(&rules, &req)
            .map(|r| (r.fits, r.placements.len())),
    );
    assert_eq!(a.ok(), b.ok(), "the index answers as the from-scratch path");
    if let Ok(r) = index.fit(&rules, &req) {
        println!(
            "the decision: fits {}, {} pods placed, {} unplaced",
            r.fits,
            r.placements.len(),
            r.unplaced.len()
        );
    }

    c.bench_function(
        "decision from scratch (5k nodes, 150k pods, 250 new pods)",
        |b| b.iter(|| fit(black_box(&state), black_box(&req)).map(|r| r.fits)),
    );
    c.bench_function(
        "decision on the index (5k nodes, 150k pods, 250 new pods)",
        |b| {
            b.iter(|| {
                index
                    .fit(black_box(&rules), black_box(&req))
                    .map(|r| r.fits)
            })
        },
    );
    c.bench_function("free capacity from scratch", |b| {
        b.iter(|| node_free(black_box(&state)).map(|r| r.usable.len()))
    });
    c.bench_function("free capacity on the index", |b| {
        b.iter(|| index.node_free().map(|r| r.usable.len()))
    });

    let scratch = common::median_ms(11, || {
        let _ = black_box(fit(&state, &req));
    });
    let incremental = common::median_ms(51, || {
        let _ = black_box(index.fit(&rules, &req));
    });
    let scratch_cpu = common::mean_cpu_ms(11, || {
        let _ = black_box(fit(&state, &req));
    });
    let incremental_cpu = common::mean_cpu_ms(51, || {
        let _ = black_box(index.fit(&rules, &req));
    });
    if let (Some(s), Some(i)) = (scratch_cpu, incremental_cpu) {
        println!(
            "decision, mean on-CPU time (waits for a core left out): from scratch {s:.1} ms, \
             index {i:.2} ms, {:.0}x faster",
            s / i
        );
    }
    println!(
        "decision (5,000 nodes, 150,000 pods, 250-pod cluster): from scratch {scratch:.1} ms, \
         index {incremental:.2} ms, {:.0}x faster; the first one after a node change {cold:.2} ms (median of 11), \
         {:.0}x",
        scratch / incremental,
        scratch / cold
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);
