//! The fit with DRA devices: pods placed with their device requests in the same pass as
//! cpu, memory and pod slots.

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use super::tests::*;
use crate::capacity::node::tests::{node, pod};
use crate::capacity::{ClusterState, FitRequest, PodGroup, canonical_map, fit};

fn dra_node(name: &str) -> Node {
    node(name, json!({"cpu": "64", "memory": "512Gi"}), json!({}))
}

fn plugin_node(name: &str, gpus: u32) -> Node {
    node(
        name,
        json!({"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": gpus.to_string()}),
        json!({}),
    )
}

fn gpu_pod(name: &str, gpus: u32) -> Pod {
    pod(
        name,
        json!({"cpu": "1", "nvidia.com/gpu": gpus.to_string()}),
        None,
    )
}

fn claim_pod(name: &str, template: &str) -> Pod {
    let mut p = pod(name, json!({"cpu": "1"}), None);
    if let Some(spec) = p.spec.as_mut() {
        spec.resource_claims = Some(vec![
            serde_json::from_value(json!({"name": "gpus", "resourceClaimTemplateName": template}))
                .unwrap(),
        ]);
    }
    p
}

fn state(nodes: Vec<Node>, objects: &[Value]) -> ClusterState {
    ClusterState {
        nodes,
        dra: state_of(objects),
        ..Default::default()
    }
}

fn request(pods: Vec<Pod>) -> FitRequest {
    FitRequest {
        pods: pods.into_iter().map(PodGroup::from).collect(),
        ..Default::default()
    }
}

fn mapping() -> Value {
    class("gpu", None, Some("nvidia.com/gpu"))
}

#[test]
fn mapped_gpus_count_on_nodes_that_publish_them_in_slices() {
    let s = state(
        vec![dra_node("a"), dra_node("b")],
        &[
            slice("a", "a", "a", 1, 8),
            slice("b", "b", "b", 1, 8),
            mapping(),
        ],
    );
    let r = fit(&s, &request(vec![gpu_pod("w-0", 8), gpu_pod("w-1", 8)])).unwrap();
    assert!(r.fits, "{:?}", r.unplaced);
    assert_eq!(canonical_map(&r.free)["nvidia.com/gpu"], "16");
    assert_eq!(r.placements["default/w-0"], "a");
    assert_eq!(r.placements["default/w-1"], "b");

    let r = fit(
        &s,
        &request(vec![
            gpu_pod("w-0", 8),
            gpu_pod("w-1", 8),
            gpu_pod("w-2", 1),
        ]),
    )
    .unwrap();
    assert!(!r.fits);
    assert_eq!(canonical_map(&r.shortfall)["nvidia.com/gpu"], "1");
    assert_eq!(
        r.unplaced[0].reason,
        "0/2 nodes are available: 2 cannot allocate all claims."
    );

    // Without the DeviceClass nothing maps: the scheduler finds no nvidia.com/gpu.
    let bare = state(vec![dra_node("a")], &[slice("a", "a", "a", 1, 8)]);
    let r = fit(&bare, &request(vec![gpu_pod("w-0", 1)])).unwrap();
    assert_eq!(
        r.unplaced[0].reason,
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    );
}

#[test]
fn device_plugin_nodes_keep_counting_allocatable() {
    let s = state(
        vec![plugin_node("a", 4), dra_node("b")],
        &[
            // a's slice is ignored for nvidia.com/gpu: a's allocatable has it.
            slice("a", "a", "a", 1, 8),
            slice("b", "b", "b", 1, 2),
            mapping(),
        ],
    );
    let r = fit(&s, &request(vec![gpu_pod("big", 4), gpu_pod("small", 2)])).unwrap();
    assert!(r.fits, "{:?}", r.unplaced);
    assert_eq!(r.placements["default/big"], "a");
    assert_eq!(r.placements["default/small"], "b");
    assert_eq!(canonical_map(&r.free)["nvidia.com/gpu"], "6");
    let r = fit(&s, &request(vec![gpu_pod("x", 5)])).unwrap();
    assert!(!r.fits);
}

#[test]
fn claims_from_templates_fragment_and_allocated_devices_are_used() {
    let objects = [
        slice("a", "a", "a", 1, 8),
        slice("b", "b", "b", 1, 8),
        class("gpu", None, None),
        template(
            "default",
            "two",
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu", "count": 2}}]),
        ),
        // 7 of a's devices and 7 of b's are held: one free on each.
        allocated_claim(
            "other",
            "x",
            "a",
            &[
                "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6",
            ],
        ),
        allocated_claim(
            "other",
            "y",
            "b",
            &[
                "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7",
            ],
        ),
    ];
    let s = state(vec![dra_node("a"), dra_node("b")], &objects);
    let r = fit(&s, &request(vec![claim_pod("w", "two")])).unwrap();
    assert!(!r.fits, "2 free devices, on two nodes");
    let class_total = "deviceclass.resource.kubernetes.io/gpu";
    assert_eq!(canonical_map(&r.free)[class_total], "2");
    assert_eq!(canonical_map(&r.new_requests)[class_total], "2");
    assert!(r.shortfall.is_empty(), "fragmentation, not a shortfall");
    let one = template(
        "default",
        "one",
        json!([{"name": "g", "exactly": {"deviceClassName": "gpu"}}]),
    );
    let mut more = objects.to_vec();
    more.push(one);
    let s = state(vec![dra_node("a"), dra_node("b")], &more);
    let r = fit(
        &s,
        &request(vec![
            claim_pod("p", "one"),
            claim_pod("q", "one"),
            claim_pod("r", "one"),
        ]),
    )
    .unwrap();
    assert_eq!(r.placements.len(), 2);
    assert_eq!(canonical_map(&r.shortfall)[class_total], "1");
}

#[test]
fn all_mode_selectors_and_first_available() {
    let objects = [
        slice("a", "a", "a", 1, 4),
        slice_with("b", "b", "b", 1, 1, 2, "A100"),
        class("gpu", None, None),
        class(
            "h100",
            Some(r#"device.attributes["gpu.example.com"].productName == "H100""#),
            None,
        ),
        template(
            "default",
            "all",
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}}]),
        ),
        template(
            "default",
            "h100x2",
            json!([{"name": "g", "exactly": {"deviceClassName": "h100", "count": 2}}]),
        ),
        template(
            "default",
            "fa",
            json!([{"name": "g", "firstAvailable": [
                {"name": "h", "deviceClassName": "h100", "count": 4},
                {"name": "any", "deviceClassName": "gpu", "count": 2}]}]),
        ),
    ];
    let s = state(vec![dra_node("a"), dra_node("b")], &objects);
    // `All` on b (2 devices) and two H100 on a: both fit, the H100 pair only on a.
    let r = fit(
        &s,
        &request(vec![claim_pod("h", "h100x2"), claim_pod("x", "all")]),
    )
    .unwrap();
    assert!(r.fits, "{:?}", r.unplaced);
    assert_eq!(r.placements["default/h"], "a");
    // x takes all of a remaining node: with a's two left busy... `All` needs every device free.
    assert_eq!(r.placements["default/x"], "b");
    let r = fit(
        &s,
        &request(vec![
            claim_pod("h", "h100x2"),
            claim_pod("x", "all"),
            claim_pod("y", "all"),
        ]),
    )
    .unwrap();
    assert_eq!(r.unplaced.len(), 1, "a has devices in use: All fails there");
    let r = fit(
        &s,
        &request(vec![claim_pod("f", "fa"), claim_pod("g", "fa")]),
    )
    .unwrap();
    assert!(r.fits, "{:?}", r.unplaced);
}

#[test]
fn what_raygate_cannot_decide_holds_and_says_so() {
    let mut tainted = slice("a", "a", "a", 1, 8);
    tainted["spec"]["devices"][0]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
    let mut s = state(vec![dra_node("a")], &[tainted, mapping()]);
    let r = fit(&s, &request(vec![gpu_pod("w", 1)])).unwrap();
    assert!(!r.fits);
    assert!(
        r.unplaced[0].reason.contains("raygate cannot decide")
            && r.unplaced[0].reason.contains("device taints")
            && r.unplaced[0].reason.contains("--dra-plain-count-class"),
        "{}",
        r.unplaced[0].reason
    );
    s.dra.plain_count.insert("gpu".into());
    let r = fit(&s, &request(vec![gpu_pod("w", 8)])).unwrap();
    assert!(r.fits, "{:?}", r.unplaced);

    let s = state(
        vec![dra_node("a")],
        &[slice("a", "a", "a", 1, 8), mapping()],
    );
    let r = fit(&s, &request(vec![claim_pod("w", "missing")])).unwrap();
    assert_eq!(
        r.unplaced[0].reason,
        "ResourceClaimTemplate default/missing (claim gpus) not found"
    );
}

#[test]
fn a_pool_with_two_generations_counts_the_newest() {
    let s = state(
        vec![dra_node("a")],
        &[
            slice("a-1", "a", "a", 1, 8),
            slice("a-2", "a", "a", 2, 2),
            mapping(),
        ],
    );
    assert!(fit(&s, &request(vec![gpu_pod("w", 2)])).unwrap().fits);
    assert!(!fit(&s, &request(vec![gpu_pod("w", 3)])).unwrap().fits);
    assert!(
        fit(&s, &request(vec![gpu_pod("w", 2)]))
            .unwrap()
            .dra_pools_updating
            .is_empty()
    );
}

#[test]
fn a_pool_republished_under_an_incomplete_generation_is_reported_as_updating() {
    // Generation 2 of 2 slices has only one: the scheduler counts none of the pool.
    let s = state(
        vec![dra_node("a")],
        &[
            slice("a-1", "a", "a", 1, 8),
            super::tests::slice_with("a-2-0", "a", "a", 2, 2, 8, "H100"),
            mapping(),
        ],
    );
    let r = fit(&s, &request(vec![gpu_pod("w", 2)])).unwrap();
    assert!(!r.fits);
    assert_eq!(r.dra_pools_updating, ["a"]);
    let (short, long) = crate::admission::texts::shortfall_text(&r);
    assert!(short.contains("republished"), "{short}");
    assert!(
        long.contains("republishing its pool on node a") && !long.contains("check the name"),
        "{long}"
    );
}

/// The claim kube-scheduler makes for `pod`'s DRA-backed extended resources, allocated
/// `devices` of pool `node` (its nodeSelector naming the node), or not yet allocated.
fn extended_claim(pod: &str, node: &str, devices: &[&str]) -> Value {
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": "container-0-request-0", "driver": "gpu.example.com", "pool": node, "device": d}))
        .collect();
    let status = if devices.is_empty() {
        json!({})
    } else {
        json!({"allocation": {"devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}})
    };
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": format!("{pod}-extended-resources-abcde"), "namespace": "default",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": format!("uid-{pod}"), "controller": true}]},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0",
            "exactly": {"deviceClassName": "gpu", "count": devices.len().max(8)}}]}},
        "status": status})
}

fn bound_gpu_pod(name: &str, gpus: u32, node: &str) -> Pod {
    crate::capacity::node::tests::pod(
        name,
        json!({"cpu": "1", "nvidia.com/gpu": gpus.to_string()}),
        Some(node),
    )
}

fn with_pods(mut s: ClusterState, pods: &[Pod]) -> ClusterState {
    s.pods = pods
        .iter()
        .map(crate::capacity::PodRecord::from_pod)
        .collect();
    s
}

const EIGHT: [&str; 8] = [
    "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7",
];

#[test]
fn a_bound_pods_devices_are_held_before_its_claim_is_seen_allocated() {
    // The DRA soak's fault (seed 1796650050817463273): the scheduler binds a pod after
    // writing its extended-resource claim's allocation, and raygate saw the pod bound first.
    let bound = bound_gpu_pod("old", 8, "a");
    for objects in [
        vec![slice("a", "a", "a", 1, 8), mapping()],
        // The claim seen, its allocation not yet.
        vec![
            slice("a", "a", "a", 1, 8),
            mapping(),
            extended_claim("old", "a", &[]),
        ],
    ] {
        let s = with_pods(
            state(vec![dra_node("a")], &objects),
            std::slice::from_ref(&bound),
        );
        let r = fit(&s, &request(vec![gpu_pod("new", 8)])).unwrap();
        assert!(!r.fits, "the 8 devices are the bound pod's: {objects:?}");
        assert_eq!(
            canonical_map(&r.free).get("nvidia.com/gpu"),
            None,
            "none free"
        );
    }
    // Seen allocated: held once, not twice (16 devices, 8 of them the bound pod's).
    let s = with_pods(
        state(
            vec![dra_node("a")],
            &[
                slice("a", "a", "a", 1, 16),
                mapping(),
                extended_claim("old", "a", &EIGHT),
            ],
        ),
        std::slice::from_ref(&bound),
    );
    let r = fit(&s, &request(vec![gpu_pod("new", 8)])).unwrap();
    assert!(r.fits, "{:?}", r.unplaced);
    assert_eq!(canonical_map(&r.free)["nvidia.com/gpu"], "8");
}

#[test]
fn a_gone_pods_claim_does_not_cover_a_bound_pods_unseen_one() {
    // `gone`'s claim is still allocated (its pod deleted, the claim not yet), `new` is bound
    // on the other 8 devices with its claim not seen: all 16 are held, as the scheduler has
    // them. Counting the gone pod's claim for the bound pod would leave 8 looking free.
    let s = with_pods(
        state(
            vec![dra_node("a")],
            &[
                slice("a", "a", "a", 1, 16),
                mapping(),
                extended_claim("gone", "a", &EIGHT),
            ],
        ),
        &[bound_gpu_pod("new", 8, "a")],
    );
    let r = fit(&s, &request(vec![gpu_pod("next", 8)])).unwrap();
    assert!(
        !r.fits,
        "16 devices held: 8 by the claim, 8 by the bound pod"
    );
    assert_eq!(
        canonical_map(&r.free).get("nvidia.com/gpu"),
        None,
        "none free"
    );
}

#[test]
fn bound_pods_on_device_plugin_nodes_hold_no_devices() {
    // A device plugin serves nvidia.com/gpu on b: its pods count in allocatable there, and
    // a's devices stay free.
    let s = with_pods(
        state(
            vec![dra_node("a"), plugin_node("b", 8)],
            &[slice("a", "a", "a", 1, 8), mapping()],
        ),
        &[bound_gpu_pod("p", 8, "b")],
    );
    let r = fit(&s, &request(vec![gpu_pod("new", 8)])).unwrap();
    assert!(r.fits, "{:?}", r.unplaced);
    assert_eq!(r.placements["default/new"], "a");
}

#[test]
fn the_index_keeps_unseen_holds_per_generation_and_a_bound_pod_moves_it() {
    // The index keeps what bound pods hold beyond the claims seen for its generation, and
    // the class totals across decisions (they read the DRA objects and the nodes only): a
    // pod bound between two decisions must still take its devices out of the free count,
    // and its claim seen allocated must not take them twice.
    let mut index = crate::capacity::CapacityIndex::new();
    index.apply_node(dra_node("a"));
    index.update_dra(|d| {
        let s = slice("a", "a", "a", 1, 16);
        let c = mapping();
        d.apply_slice(&serde_json::from_value(s).unwrap())
            | d.apply_class(&serde_json::from_value(c).unwrap())
    });
    let (rules, req) = (ClusterState::default(), request(vec![gpu_pod("new", 8)]));
    let free = |index: &crate::capacity::CapacityIndex| {
        let r = index.fit(&rules, &req).unwrap();
        let free = canonical_map(&r.free)
            .get("nvidia.com/gpu")
            .cloned()
            .unwrap_or_else(|| "0".to_string());
        (r.fits, free)
    };
    assert_eq!(free(&index), (true, "16".to_string()));
    index.apply_pod(crate::capacity::PodRecord::from_pod(&bound_gpu_pod(
        "old", 8, "a",
    )));
    assert_eq!(
        free(&index),
        (true, "8".to_string()),
        "bound, claim not seen"
    );
    assert_eq!(
        free(&index),
        (true, "8".to_string()),
        "the same generation again"
    );
    let claim = extended_claim("old", "a", &EIGHT);
    index.update_dra(|d| d.apply_claim(&serde_json::from_value(claim).unwrap()));
    assert_eq!(
        free(&index),
        (true, "8".to_string()),
        "claim seen: held once"
    );
    index.apply_pod(crate::capacity::PodRecord::from_pod(&bound_gpu_pod(
        "older", 8, "a",
    )));
    assert_eq!(free(&index), (false, "0".to_string()), "all 16 held");
    // The driver republishes the pool with 24 devices: no pod or claim moved, so the kept
    // holds still apply, now on the new views.
    index.update_dra(|d| {
        let s = slice("a", "a", "a", 2, 24);
        d.apply_slice(&serde_json::from_value(s).unwrap())
    });
    assert_eq!(free(&index), (true, "8".to_string()), "24 devices, 16 held");
}
