//! The cluster-wide reservation ledger and the admission queue.
//!
//! Two upgrades that each fit alone must never both be admitted when they do
//! not fit together. Free capacity alone cannot tell: an admitted upgrade's
//! pods take capacity only once the scheduler binds them. So every decision
//! first places, in simulation, the still-unbound pods of every admitted
//! upgrade (the ledger), then the waiting upgrades ordered before this one
//! (priority, then waiting time) that fit, and only then this one.

use std::collections::BTreeMap;

use super::observed::{ObservedPod, kind_of};
use jiff::Timestamp;

#[cfg(test)]
use crate::capacity::{ClusterState, fit};
use crate::capacity::{FitRequest, PodGroup, ResourceList};

/// A waiting upgrade competing for capacity.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub namespace: String,
    pub name: String,
    pub priority: i32,
    pub waiting_since: Timestamp,
    pub pods: Vec<PodGroup>,
    pub headroom: ResourceList,
}

impl Candidate {
    fn key(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
}

/// Admission order: higher priority first, then longer waiting, then name
/// (so every replica and every restart computes the same order).
pub fn order(queue: &mut [Candidate]) {
    queue.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(a.waiting_since.cmp(&b.waiting_since))
            .then(a.key().cmp(&b.key()))
    });
}

/// The pods to treat as already placed when deciding for `me`: the ledger
/// (unbound pods of admitted upgrades) plus every candidate ahead of `me` in
/// `queue` (already ordered) that fits on top of what came before it.
/// Candidates ahead that do not fit do not block the ones behind them.
#[cfg(test)]
pub(crate) fn reserved_for(
    state: &ClusterState,
    ledger: &[PodGroup],
    queue: &[Candidate],
    me: (&str, &str),
) -> crate::Result<Vec<PodGroup>> {
    reserved_with(|r| fit(state, r), ledger, queue, me)
}

/// `reserved_for` with any way to fit (the controller's index, a state read
/// whole, or a bench's baseline).
pub fn reserved_with(
    fit: impl Fn(&FitRequest) -> crate::Result<crate::capacity::FitReport>,
    ledger: &[PodGroup],
    queue: &[Candidate],
    me: (&str, &str),
) -> crate::Result<Vec<PodGroup>> {
    let mut reserved = ledger.to_vec();
    for c in queue {
        if c.key() == me {
            break;
        }
        let report = fit(&FitRequest {
            pods: c.pods.clone(),
            reserved: reserved.clone(),
            headroom: c.headroom.clone(),
            old_requests: ResourceList::new(),
        })?;
        if report.fits {
            reserved.extend(c.pods.iter().cloned());
        }
    }
    Ok(reserved)
}

/// The planned pods of an admitted cluster that the scheduler has not bound
/// yet. Real pod names carry random suffixes, so pods are matched by kind
/// (head, or worker of a group) and counted.
pub fn unbound<P: ObservedPod + ?Sized>(planned: &[PodGroup], existing: &[&P]) -> Vec<PodGroup> {
    let mut bound: BTreeMap<(String, String), usize> = BTreeMap::new();
    for p in existing {
        if p.is_bound() {
            *bound.entry(kind_of(*p)).or_default() += 1;
        }
    }
    planned
        .iter()
        .filter_map(|g| {
            let n = bound.get_mut(&kind_of(&g.template)).map_or(0, |n| {
                let take = (*n).min(g.count);
                *n -= take;
                take
            });
            (n < g.count).then(|| g.skip(n))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn gpu_pod(name: &str, group: &str, gpus: u32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml",
                "labels": {"ray.io/node-type": "worker", "ray.io/group": group}},
            "spec": {"containers": [{"name": "ray-worker", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus.to_string()},
                "limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
        }))
        .unwrap()
    }

    fn node(name: &str, gpus: u32) -> serde_json::Value {
        json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": name},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()},
                "conditions": [{"type": "Ready", "status": "True"}]}})
    }

    fn state(nodes: Vec<serde_json::Value>) -> ClusterState {
        ClusterState::from_list(json!({"kind": "List", "apiVersion": "v1", "items": nodes}))
            .unwrap()
    }

    fn cand(name: &str, priority: i32, since: &str, pods: Vec<Pod>) -> Candidate {
        Candidate {
            namespace: "ml".into(),
            name: name.into(),
            priority,
            waiting_since: since.parse().unwrap(),
            pods: pods.into_iter().map(PodGroup::from).collect(),
            headroom: ResourceList::new(),
        }
    }

    #[test]
    fn order_is_priority_then_waiting_time_then_name() {
        let mut q = vec![
            cand("c", 0, "2026-12-01T10:00:00Z", vec![]),
            cand("b", 5, "2026-12-01T12:00:00Z", vec![]),
            cand("a", 0, "2026-12-01T10:00:00Z", vec![]),
            cand("d", 0, "2026-12-01T09:00:00Z", vec![]),
        ];
        order(&mut q);
        let names: Vec<_> = q.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["b", "d", "a", "c"]);
    }

    #[test]
    fn an_earlier_candidate_that_fits_reserves_its_pods() {
        let s = state(vec![node("n1", 8)]);
        let a = cand(
            "a",
            0,
            "2026-12-01T09:00:00Z",
            vec![gpu_pod("a-w-0", "gpu", 8)],
        );
        let b = cand(
            "b",
            0,
            "2026-12-01T10:00:00Z",
            vec![gpu_pod("b-w-0", "gpu", 8)],
        );
        let q = vec![a.clone(), b.clone()];
        assert!(reserved_for(&s, &[], &q, ("ml", "a")).unwrap().is_empty());
        let for_b = reserved_for(&s, &[], &q, ("ml", "b")).unwrap();
        assert_eq!(for_b.len(), 1);
        let report = fit(
            &s,
            &FitRequest {
                pods: b.pods.clone(),
                reserved: for_b,
                headroom: ResourceList::new(),
                old_requests: ResourceList::new(),
            },
        )
        .unwrap();
        assert!(!report.fits, "b must wait for a");
    }

    #[test]
    fn a_candidate_ahead_that_does_not_fit_does_not_block() {
        let s = state(vec![node("n1", 8)]);
        let big = cand(
            "big",
            9,
            "2026-12-01T09:00:00Z",
            vec![gpu_pod("big-w-0", "gpu", 16)],
        );
        let small = cand(
            "small",
            0,
            "2026-12-01T10:00:00Z",
            vec![gpu_pod("s-w-0", "gpu", 4)],
        );
        let q = vec![big, small];
        assert!(
            reserved_for(&s, &[], &q, ("ml", "small"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn ledger_pods_are_always_reserved() {
        let s = state(vec![node("n1", 8)]);
        let ledger = vec![PodGroup::from(gpu_pod("x-w-0", "gpu", 8))];
        let q = vec![cand(
            "a",
            0,
            "2026-12-01T09:00:00Z",
            vec![gpu_pod("a-w-0", "gpu", 1)],
        )];
        let r = reserved_for(&s, &ledger, &q, ("ml", "b")).unwrap();
        assert_eq!(
            r.len(),
            1,
            "a no longer fits after the ledger, so only the ledger pod"
        );
    }

    #[test]
    fn bound_pods_leave_the_ledger_by_kind() {
        let planned: Vec<PodGroup> = vec![
            gpu_pod("c-gpu-worker-0", "gpu", 8),
            gpu_pod("c-gpu-worker-1", "gpu", 8),
            gpu_pod("c-cpu-worker-0", "cpu", 0),
        ]
        .into_iter()
        .map(PodGroup::from)
        .collect();
        let mut real = gpu_pod("c-gpu-worker-x7k2p", "gpu", 8);
        real.spec.as_mut().unwrap().node_name = Some("n1".into());
        let unbound_real = gpu_pod("c-gpu-worker-q9z1m", "gpu", 8);
        let left = unbound(&planned, &[&real, &unbound_real]);
        let groups: Vec<_> = left.iter().map(|g| kind_of(&g.template).1).collect();
        assert_eq!(groups, ["gpu", "cpu"]);
    }
}
