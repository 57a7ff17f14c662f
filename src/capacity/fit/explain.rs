//! Why a pod found no node, in the scheduler's words.

use std::collections::BTreeMap;

use super::entry::Entry;
use super::overlay::Overlay;
use crate::capacity::PODS;
use crate::capacity::dra::Undecided;
use crate::capacity::from_scheduler_units;
use crate::capacity::node::{Amounts, Names, NodeId, SkippedNode, amount};
use crate::capacity::scheduling::{REASON_TOO_MANY_PODS, aggregate_message, insufficient};
use crate::capacity::statics::Statics;

/// Why no node took the pod, as the scheduler's aggregated message. Nodes
/// are counted per reason id and per resource first; the message's strings
/// are made once per reason, not once per node. A node whose rows fit
/// (`rows_fit`) failed on DRA devices.
pub(super) fn explain(
    e: &Entry<'_>,
    statics: &Statics,
    free: &Overlay<'_>,
    names: &Names,
    skipped: &[SkippedNode],
    rows_fit: &dyn Fn(NodeId) -> bool,
) -> String {
    if let Some(why) = e.dra.as_ref().and_then(|d| d.impossible.as_ref()) {
        return why.clone();
    }
    let mut devices = 0usize;
    let (verdicts, reason_text) = (&statics.verdicts, &statics.reasons);
    let mut by_reason = vec![0usize; reason_text.len()];
    let mut by_resource = vec![0usize; names.names.len()];
    for (n, verdict) in NodeId::all(verdicts.len()).zip(verdicts) {
        if let Some(id) = verdict {
            if let Some(c) = by_reason.get_mut(*id) {
                *c += 1;
            }
            continue;
        }
        if rows_fit(n) {
            devices += 1;
            continue;
        }
        let f = free.get(n);
        for &(r, u) in &e.req {
            if amount(f, r) < u
                && let Some(c) = by_resource.get_mut(r.index())
            {
                *c += 1;
            }
        }
    }
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut bump = |r: String, k: usize| {
        if k > 0 {
            *reasons.entry(r).or_insert(0) += k;
        }
    };
    for s in skipped {
        bump(s.scheduler_reason.to_string(), 1);
    }
    bump(REASON_DEVICES.to_string(), devices);
    for (text, &k) in reason_text.iter().zip(&by_reason) {
        bump(text.clone(), k);
    }
    for (name, &k) in names.names.iter().zip(&by_resource) {
        if name == PODS {
            bump(REASON_TOO_MANY_PODS.to_string(), k);
        } else {
            bump(insufficient(name), k);
        }
    }
    aggregate_message(verdicts.len() + skipped.len(), &reasons)
}

/// The scheduler's words for a node whose devices cannot satisfy the pod's claims.
pub const REASON_DEVICES: &str = "cannot allocate all claims";

/// The reason of a pod raygate cannot place because it cannot decide its devices.
pub(super) fn undecided_reason(u: &Undecided) -> String {
    format!(
        "raygate cannot decide its DRA devices exactly: {u} (--dra-plain-count-class CLASS \
         counts a class's devices as plain units)"
    )
}

/// A reason if placing `e` would take cluster-wide free below headroom.
pub(super) fn headroom_violation(
    e: &Entry<'_>,
    cluster_free: &Amounts,
    headroom: &Amounts,
    names: &Names,
) -> Option<String> {
    e.req.iter().find_map(|&(r, u)| {
        let h = amount(headroom, r);
        let after = amount(cluster_free, r) - u;
        if h > 0 && after < h {
            let n = names.name(r);
            Some(format!(
                "placing it would leave {} {n} free cluster-wide, below the headroom of {}",
                from_scheduler_units(n, after.max(0)),
                from_scheduler_units(n, h)
            ))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use crate::capacity::fit::tests::{gpu_node, gpu_pod, pairs, request, state, strings};
    use crate::capacity::node::tests::{node, pod};
    use crate::capacity::{ClusterState, FitOptions, Wording};
    use crate::capacity::{canonical_map, fit, fit_with};
    use serde_json::json;
    use std::collections::BTreeMap;

    #[test]
    fn aggregated_reason_mixes_filters_and_skipped_nodes() {
        let mut tainted = gpu_node("t", 8);
        tainted.spec = Some(
            serde_json::from_value(json!({"taints": [
            {"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]}))
            .unwrap(),
        );
        let mut cordoned = gpu_node("c", 8);
        cordoned.spec = Some(serde_json::from_value(json!({"unschedulable": true})).unwrap());
        let cpu = node(
            "cpu-1",
            json!({"cpu": "64", "memory": "256Gi"}),
            json!({"pool": "cpu"}),
        );
        let s = state(
            vec![gpu_node("a", 4), gpu_node("b", 2), tainted, cordoned, cpu],
            vec![],
        );
        let mut p = gpu_pod("w", 8);
        if let Some(spec) = p.spec.as_mut() {
            spec.node_selector = Some(BTreeMap::from([("pool".to_string(), "gpu".to_string())]));
        }
        let old = FitOptions {
            wording: Wording::V1_20,
        };
        let r = fit_with(&s, &request(vec![p.clone()]), &old).unwrap();
        assert_eq!(
            r.unplaced[0].reason,
            "0/5 nodes are available: 1 node(s) didn't match Pod's node affinity, \
             1 node(s) had taint {dedicated: infer}, that the pod didn't tolerate, \
             1 node(s) were unschedulable, 2 Insufficient nvidia.com/gpu."
        );
        let r2 = fit(&s, &request(vec![p])).unwrap();
        assert_eq!(
            r2.unplaced[0].reason,
            "0/5 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
             1 node(s) had untolerated taint {dedicated: infer}, 1 node(s) were unschedulable, \
             2 Insufficient nvidia.com/gpu."
        );
        assert_eq!(r.skipped_nodes.len(), 1);
        assert_eq!(r.skipped_nodes[0].node, "c");
        assert_eq!(canonical_map(&r.allocatable)["nvidia.com/gpu"], "14");
    }

    #[test]
    fn pod_slots_and_missing_resources() {
        let s = state(
            vec![node("a", json!({"cpu": "8", "pods": "1"}), json!({}))],
            vec![pod("x", json!({}), Some("a"))],
        );
        let r = fit(&s, &request(vec![pod("p", json!({"cpu": "1"}), None)])).unwrap();
        assert_eq!(
            r.unplaced[0].reason,
            "0/1 nodes are available: 1 Too many pods."
        );
        assert_eq!(canonical_map(&r.shortfall)["pods"], "1");

        let s = state(vec![node("a", json!({"cpu": "8"}), json!({}))], vec![]);
        let r = fit(
            &s,
            &request(vec![pod("p", json!({"example.com/fpga": "1"}), None)]),
        )
        .unwrap();
        assert_eq!(
            r.unplaced[0].reason,
            "0/1 nodes are available: 1 Insufficient example.com/fpga."
        );
        assert_eq!(strings(&r.shortfall), pairs(&[("example.com/fpga", "1")]));

        let r = fit(
            &ClusterState::default(),
            &request(vec![pod("p", json!({"cpu": "1"}), None)]),
        )
        .unwrap();
        assert_eq!(r.unplaced[0].reason, "no nodes available to schedule pods");
    }
}
