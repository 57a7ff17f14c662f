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
    // The first decision after a node changed: its groups' static filters
    // (selectors, taints) are patched for the changed node only. Measured by
    // changing a node's zone label before each run, against the same with
    // the verdicts forgotten (every node evaluated again, as before).
    let mut first_after_change = |forget: bool, k: usize| {
        let mut n = common::node(1);
        if let Some(l) = n.metadata.labels.as_mut() {
            l.insert("topology.kubernetes.io/zone".into(), format!("zone-x{k}"));
        }
        let t = std::time::Instant::now();
        index.apply_node(n);
        let event = t.elapsed().as_secs_f64() * 1e3;
        if forget {
            index.forget_static_verdicts();
        }
        let evaluated = index.static_evaluations();
        let t = std::time::Instant::now();
        let _ = black_box(index.fit(&rules, &req));
        let decision = t.elapsed().as_secs_f64() * 1e3;
        (event, decision, index.static_evaluations() - evaluated)
    };
    let _ = first_after_change(false, 100);
    let (mut full, mut patched) = (vec![], vec![]);
    for k in 0..11 {
        full.push(first_after_change(true, 2 * k));
        patched.push(first_after_change(false, 2 * k + 1));
    }
    let median = |v: &[(f64, f64, usize)], f: fn(&(f64, f64, usize)) -> f64| {
        let mut xs: Vec<f64> = v.iter().map(f).collect();
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    let (full_ms, patched_ms) = (median(&full, |x| x.1), median(&patched, |x| x.1));
    let event_ms = median(&patched, |x| x.0);
    println!(
        "the first decision after a node change (5,000 nodes; median of 11, wall): every node's \
         static filters evaluated again {full_ms:.2} ms ({} filter runs), only the changed node's \
         {patched_ms:.2} ms ({} filter runs), {:.1}x faster; the node event itself (index update) {event_ms:.2} ms",
        full[0].2,
        patched[0].2,
        full_ms / patched_ms
    );
    let cold = patched_ms;
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
