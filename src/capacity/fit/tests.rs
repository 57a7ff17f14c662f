//! The fit end to end: placement order, best fit, reservations, headroom, the report.

use super::*;
use crate::capacity::canonical_map;
use crate::capacity::node::tests::{node, pod};
use crate::quantity::Quantity;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub(super) fn gpu_node(name: &str, gpus: u32) -> Node {
    node(
        name,
        json!({"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": gpus.to_string()}),
        json!({"pool": "gpu"}),
    )
}

pub(super) fn gpu_pod(name: &str, gpus: u32) -> Pod {
    pod(
        name,
        json!({"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": gpus.to_string()}),
        None,
    )
}

pub(super) fn state(nodes: Vec<Node>, pods: Vec<Pod>) -> ClusterState {
    ClusterState {
        nodes,
        pods: pods
            .iter()
            .map(crate::capacity::PodRecord::from_pod)
            .collect(),
        ..Default::default()
    }
}

pub(super) fn request(pods: Vec<Pod>) -> FitRequest {
    FitRequest {
        pods: groups(pods),
        ..Default::default()
    }
}

pub(super) fn groups(pods: Vec<Pod>) -> Vec<PodGroup> {
    pods.into_iter().map(PodGroup::from).collect()
}

pub(super) fn list(pairs: &[(&str, &str)]) -> ResourceList {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity::parse(v).unwrap()))
        .collect()
}

pub(super) fn strings(l: &ResourceList) -> Vec<(String, String)> {
    canonical_map(l).into_iter().collect()
}

pub(super) fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn fits_and_places_deterministically() {
    let s = state(vec![gpu_node("b", 8), gpu_node("a", 8)], vec![]);
    let r = fit(&s, &request(vec![gpu_pod("w-1", 8), gpu_pod("w-0", 8)])).unwrap();
    assert!(r.fits);
    assert!(r.unplaced.is_empty());
    assert!(r.shortfall.is_empty());
    // Equal size: sorted by key; equal leftover: node by name.
    assert_eq!(
        r.placements,
        BTreeMap::from([
            ("default/w-0".to_string(), "a".to_string()),
            ("default/w-1".to_string(), "b".to_string()),
        ])
    );
    assert_eq!(
        strings(&r.new_requests),
        pairs(&[
            ("cpu", "8"),
            ("memory", "32Gi"),
            ("nvidia.com/gpu", "16"),
            ("pods", "2")
        ])
    );
    assert_eq!(canonical_map(&r.allocatable)["nvidia.com/gpu"], "16");
    assert_eq!(canonical_map(&r.free)["pods"], "220");
    // Same input, same answer.
    let again = fit(&s, &request(vec![gpu_pod("w-0", 8), gpu_pod("w-1", 8)])).unwrap();
    assert_eq!(again, r);
}

#[test]
fn a_group_places_like_its_copies() {
    let s = state(
        vec![gpu_node("a", 8), gpu_node("b", 8), gpu_node("c", 4)],
        vec![pod("used", json!({"nvidia.com/gpu": "2"}), Some("b"))],
    );
    let mut t = gpu_pod("w-0", 2);
    t.metadata.namespace = Some("ml".into());
    let group = PodGroup::indexed(t, 11, "w-".into());
    let one_by_one = FitRequest {
        pods: groups(crate::podgroup::expand(std::slice::from_ref(&group))),
        ..Default::default()
    };
    let grouped = FitRequest {
        pods: vec![group],
        ..Default::default()
    };
    let a = fit(&s, &one_by_one).unwrap();
    let b = fit(&s, &grouped).unwrap();
    assert_eq!(a, b);
    assert!(!b.fits);
    // 6 + 8 + 4 = 18 free GPUs: 9 pods of 2 placed, 2 left over.
    assert_eq!(b.placements.len(), 9);
    assert_eq!(b.unplaced.len(), 2);
}

#[test]
fn fragmentation_is_not_capacity() {
    let s = state(vec![gpu_node("a", 8), gpu_node("b", 8)], vec![]);
    let r = fit(&s, &request(vec![gpu_pod("big", 16)])).unwrap();
    assert!(!r.fits);
    assert!(r.shortfall.is_empty(), "{:?}", r.shortfall);
    assert_eq!(
        r.unplaced,
        [Unplaced {
            pod: "default/big".to_string(),
            reason: "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.".to_string(),
            reserved: false,
        }]
    );
}

#[test]
fn best_fit_picks_the_tightest_node() {
    let s = state(
        vec![gpu_node("a", 8), gpu_node("b", 8), gpu_node("c", 8)],
        vec![
            pod("used-b", json!({"nvidia.com/gpu": "4"}), Some("b")),
            pod("used-c", json!({"nvidia.com/gpu": "6"}), Some("c")),
        ],
    );
    let r = fit(
        &s,
        &request(vec![gpu_pod("x", 2), gpu_pod("y", 4), gpu_pod("z", 8)]),
    )
    .unwrap();
    assert!(r.fits);
    // z (8) first: only a. y (4): b leaves 0. x (2): c leaves 0.
    let got: Vec<(&str, &str)> = r
        .placements
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        got,
        [("default/x", "c"), ("default/y", "b"), ("default/z", "a")]
    );
}

#[test]
fn reservations_consume_capacity() {
    let s = state(vec![gpu_node("a", 8), gpu_node("b", 8)], vec![]);
    let first = fit(&s, &request(vec![gpu_pod("one-0", 8)])).unwrap();
    assert!(first.fits);
    let mut second = request(vec![gpu_pod("two-0", 8), gpu_pod("two-1", 8)]);
    second.reserved = groups(vec![gpu_pod("one-0", 8)]);
    let r = fit(&s, &second).unwrap();
    assert!(!r.fits);
    assert_eq!(canonical_map(&r.reserved)["nvidia.com/gpu"], "8");
    assert_eq!(r.placements["default/one-0"], "a");
    assert_eq!(r.placements["default/two-0"], "b");
    assert_eq!(
        r.unplaced,
        [Unplaced {
            pod: "default/two-1".to_string(),
            reason: "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.".to_string(),
            reserved: false,
        }]
    );
    // 16 new + 8 reserved − 16 free = 8 GPUs short.
    assert_eq!(canonical_map(&r.shortfall)["nvidia.com/gpu"], "8");

    // Once the reserved pod is bound it counts on its node, not twice.
    let bound = state(
        vec![gpu_node("a", 8), gpu_node("b", 8)],
        vec![pod(
            "one-0",
            json!({"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}),
            Some("a"),
        )],
    );
    let mut again = request(vec![gpu_pod("two-0", 8)]);
    again.reserved = groups(vec![gpu_pod("one-0", 8)]);
    let r = fit(&bound, &again).unwrap();
    assert!(r.fits);
    assert!(r.reserved.is_empty());
    assert_eq!(r.placements["default/two-0"], "b");
}

#[test]
fn unplaceable_reservation_fails_the_fit() {
    let s = state(vec![gpu_node("a", 8)], vec![]);
    let mut req = request(vec![pod("tiny", json!({"cpu": "1"}), None)]);
    req.reserved = groups(vec![gpu_pod("r", 16)]);
    let r = fit(&s, &req).unwrap();
    assert!(!r.fits);
    assert_eq!(r.unplaced.len(), 1);
    assert!(r.unplaced[0].reserved);
    assert_eq!(r.placements["default/tiny"], "a");
}

#[test]
fn headroom_is_a_cluster_wide_floor() {
    let s = state(vec![gpu_node("a", 8), gpu_node("b", 8)], vec![]);
    let mut req = request(vec![gpu_pod("w-0", 8), gpu_pod("w-1", 4)]);
    req.headroom = list(&[("nvidia.com/gpu", "4")]);
    let r = fit(&s, &req).unwrap();
    assert!(r.fits, "{:?}", r.unplaced);
    assert!(r.shortfall.is_empty());

    req.headroom = list(&[("nvidia.com/gpu", "5")]);
    let r = fit(&s, &req).unwrap();
    assert!(!r.fits);
    assert_eq!(strings(&r.shortfall), pairs(&[("nvidia.com/gpu", "1")]));
    assert_eq!(r.placements.len(), 1);
    assert_eq!(
        r.unplaced,
        [Unplaced {
            pod: "default/w-1".to_string(),
            reason: "placing it would leave 4 nvidia.com/gpu free cluster-wide, below the \
                     headroom of 5"
                .to_string(),
            reserved: false,
        }]
    );

    // Reserved pods may already have eaten the headroom.
    let mut req = request(vec![pod("cpu-only", json!({"cpu": "1"}), None)]);
    req.reserved = groups(vec![gpu_pod("r", 8), gpu_pod("r2", 6)]);
    req.headroom = list(&[("nvidia.com/gpu", "4")]);
    let r = fit(&s, &req).unwrap();
    assert!(r.unplaced.is_empty());
    assert!(!r.fits);
    assert_eq!(strings(&r.shortfall), pairs(&[("nvidia.com/gpu", "2")]));
}

#[test]
fn shortfall_and_required_numbers_are_exact() {
    let s = state(
        vec![
            node("a", json!({"cpu": "8", "memory": "16Gi"}), json!({})),
            node("b", json!({"cpu": "4", "memory": "8Gi"}), json!({})),
        ],
        vec![pod(
            "busy",
            json!({"cpu": "1500m", "memory": "1Gi"}),
            Some("a"),
        )],
    );
    // free: cpu 10.5, memory 23Gi
    let mut req = request(vec![
        pod("n-0", json!({"cpu": "6", "memory": "10Gi"}), None),
        pod("n-1", json!({"cpu": "6", "memory": "10Gi"}), None),
    ]);
    req.headroom = list(&[("cpu", "500m")]);
    req.old_requests = list(&[("cpu", "12"), ("memory", "20Gi")]);
    let r = fit(&s, &req).unwrap();
    assert!(!r.fits);
    assert_eq!(canonical_map(&r.free)["cpu"], "10500m");
    assert_eq!(canonical_map(&r.free)["memory"], "23Gi");
    // cpu: 12 + 0.5 − 10.5 = 2; memory 20Gi < 23Gi: no shortfall.
    assert_eq!(strings(&r.shortfall), pairs(&[("cpu", "2")]));
    assert_eq!(
        strings(&r.required),
        pairs(&[("cpu", "24"), ("memory", "40Gi"), ("pods", "2")])
    );
    assert_eq!(
        strings(&r.old_requests),
        pairs(&[("cpu", "12"), ("memory", "20Gi")])
    );
    assert_eq!(r.placements["default/n-0"], "a");
    assert_eq!(
        r.unplaced[0].reason,
        "0/2 nodes are available: 2 Insufficient cpu, 2 Insufficient memory."
    );
}

#[test]
fn limit_only_gpu_and_limit_ranges_count_for_new_pods() {
    let mut s = state(vec![gpu_node("a", 8)], vec![]);
    s.limit_ranges = vec![
        serde_json::from_value(json!({
        "metadata": {"name": "lr", "namespace": "default"},
        "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "40"}}]}}))
        .unwrap(),
    ];
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "w", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}))
    .unwrap();
    let r = fit(&s, &request(vec![p.clone(), p])).unwrap();
    assert!(!r.fits);
    assert_eq!(
        strings(&r.new_requests),
        pairs(&[("cpu", "80"), ("nvidia.com/gpu", "16"), ("pods", "2")])
    );
    assert_eq!(r.placements["default/w"], "a");
    assert_eq!(r.unplaced[0].pod, "default/w#2");
}

#[test]
fn malformed_pods_are_errors() {
    let s = state(vec![gpu_node("a", 8)], vec![]);
    let bad = pod("bad", json!({"nvidia.com/gpu": "x"}), None);
    assert!(matches!(
        fit(&s, &request(vec![bad])),
        Err(crate::Error::Quantity { .. })
    ));
    let s = state(
        vec![gpu_node("a", 8)],
        vec![pod("bound", json!({"cpu": "1.1.1"}), Some("a"))],
    );
    assert!(fit(&s, &request(vec![])).is_err());
}

#[test]
fn report_serializes_camel_case_with_canonical_strings() {
    let s = state(vec![gpu_node("a", 8)], vec![]);
    let r = fit(&s, &request(vec![gpu_pod("w", 2)])).unwrap();
    let v: Value = serde_json::to_value(&r).unwrap();
    assert_eq!(v["fits"], json!(true));
    assert_eq!(v["newRequests"]["memory"], json!("16Gi"));
    assert_eq!(v["placements"]["default/w"], json!("a"));
    for k in [
        "required",
        "oldRequests",
        "reserved",
        "allocatable",
        "free",
        "shortfall",
        "unplaced",
        "skippedNodes",
    ] {
        assert!(v.get(k).is_some(), "{k}");
    }
}
