//! One admission pass per change of the cluster.
//!
//! Every waiting upgrade used to be fitted on its own, after re-placing the
//! ledger and every upgrade ahead of it: U waiting plans cost U(U+1)/2 fits
//! after each Node event. The pass does it once, on one snapshot with an
//! undo log (as cluster-autoscaler's delta snapshot): the reservations of
//! admitted upgrades first, then each waiting upgrade in queue order, kept
//! when it fits and undone when it does not. Each reconcile then reads its
//! plan's result.

use std::collections::{BTreeMap, HashMap};

use super::ledger::Candidate;
use crate::capacity::fit::Placer;
use crate::capacity::node::Capacity;
use crate::capacity::{ClusterState, FitOptions, FitReport, PodGroup, ResourceList};
use crate::upgradeplan::PlanKey;

/// The pass's answer per waiting plan, `(namespace, name)` → its fit (with
/// reservations and the upgrades ahead placed), or why it could not be
/// computed (a pod template whose request does not parse: that plan is
/// skipped, the others are not held up by it).
#[derive(Debug, Default)]
pub struct Pass {
    results: HashMap<PlanKey, crate::Result<FitReport>>,
}

impl Pass {
    pub fn get(&self, ns: &str, name: &str) -> Option<&crate::Result<FitReport>> {
        self.results.get(&PlanKey::new(ns, name))
    }

    pub fn len(&self) -> usize {
        self.results.len()
    }

    pub fn is_empty(&self) -> bool {
        self.results.is_empty()
    }
}

/// `run` on the controller's capacity index.
pub fn run_on(
    index: &crate::capacity::CapacityIndex,
    rules: &ClusterState,
    ledger: &[PodGroup],
    queue: &[Candidate],
) -> crate::Result<Pass> {
    run(&index.capacity()?, rules, ledger, queue)
}

/// Runs the pass: `ledger` (unbound pods of admitted upgrades), then
/// `queue` (already in admission order).
pub(crate) fn run(
    cap: &Capacity<'_>,
    rules: &ClusterState,
    ledger: &[PodGroup],
    queue: &[Candidate],
) -> crate::Result<Pass> {
    let mut p = Placer::new(cap, &FitOptions::default());
    let reserved = p.entries(ledger, true, rules, &cap.bound)?;
    let mut reserved_total = Placer::total(&reserved);
    let (placed, base_unplaced) = p.place(&reserved, &Default::default());
    // Kept sorted, so each report clones a map instead of sorting again.
    let mut base_placements: BTreeMap<String, String> = placed.into_iter().collect();
    let mut results = HashMap::new();
    for c in queue {
        let mark = p.mark();
        let new = match p.entries(&c.pods, false, rules, &cap.bound) {
            Ok(n) => n,
            Err(e) => {
                p.undo(mark);
                results.insert(c.key.plan(), Err(e));
                continue;
            }
        };
        let headroom = p.headroom(&c.headroom);
        let (placed, mut unplaced) = p.place(&new, &headroom);
        let mut placements = base_placements.clone();
        placements.extend(placed.iter().cloned());
        let mut all_unplaced = base_unplaced.clone();
        all_unplaced.append(&mut unplaced);
        let report = p.report(
            &new,
            &reserved_total,
            &headroom,
            placements,
            all_unplaced,
            &ResourceList::new(),
        );
        if report.fits {
            for (i, u) in Placer::total(&new).into_iter().enumerate() {
                crate::capacity::node::add_amount(&mut reserved_total, i.into(), u);
            }
            base_placements.extend(placed);
        } else {
            p.undo(mark);
        }
        results.insert(c.key.plan(), Ok(report));
    }
    Ok(Pass { results })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::admission::ledger::{self, tests::reserved_for};
    use crate::capacity::node::capacity;
    use crate::capacity::{FitRequest, fit};
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    /// A Ray GPU worker pod requesting 1 CPU and `gpus` GPUs (also used by `admission::fit`'s tests).
    pub(in crate::admission) fn gpu_pod(name: &str, gpus: u32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml",
                "labels": {"ray.io/node-type": "worker", "ray.io/group": "gpu"}},
            "spec": {"containers": [{"name": "w", "resources": {
                "requests": {"cpu": "1", "nvidia.com/gpu": gpus.to_string()}}}]}
        }))
        .unwrap()
    }

    fn state(gpus: &[u32]) -> ClusterState {
        let items: Vec<_> = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| json!({"kind": "Node", "metadata": {"name": format!("n{i}")},
                "status": {"allocatable": {"cpu": "64", "pods": "110", "nvidia.com/gpu": g.to_string()},
                    "conditions": [{"type": "Ready", "status": "True"}]}}))
            .collect();
        ClusterState::from_list(json!({"kind": "List", "items": items})).unwrap()
    }

    fn cand(name: &str, priority: i32, pods: Vec<(u32, usize)>) -> Candidate {
        Candidate {
            key: ledger::tests::key(name, priority, "2026-12-01T10:00:00Z"),
            pods: pods
                .into_iter()
                .map(|(g, n)| {
                    PodGroup::indexed(gpu_pod(&format!("{name}-w-0"), g), n, format!("{name}-w-"))
                })
                .collect(),
            headroom: ResourceList::new(),
        }
    }

    #[test]
    fn one_pass_agrees_with_fitting_each_plan_after_those_ahead() {
        let s = state(&[8, 8, 4, 2]);
        let ledger = vec![PodGroup::from(gpu_pod("adm-w-0", 4))];
        let mut q = vec![
            cand("a", 5, vec![(4, 2)]),
            cand("b", 4, vec![(8, 1)]),
            cand("c", 3, vec![(2, 2)]),
            cand("d", 2, vec![(16, 1)]),
            cand("e", 1, vec![(2, 1)]),
        ];
        ledger::order(&mut q);
        let cap = capacity(&s).unwrap();
        let pass = run(&cap, &s, &ledger, &q).unwrap();
        assert_eq!(pass.len(), 5);
        let mut fits = vec![];
        for c in &q {
            let reserved = reserved_for(&s, &ledger, &q, (&c.key.namespace, &c.key.name)).unwrap();
            let alone = fit(
                &s,
                &FitRequest {
                    pods: c.pods.clone(),
                    reserved,
                    headroom: ResourceList::new(),
                    old_requests: ResourceList::new(),
                },
            )
            .unwrap();
            let name = &c.key.name;
            let got = pass.get("ml", name).unwrap().as_ref().unwrap();
            assert_eq!(got.fits, alone.fits, "{name}");
            assert_eq!(got.shortfall, alone.shortfall, "{name}");
            assert_eq!(got.reserved, alone.reserved, "{name}");
            fits.push((name.as_str(), got.fits));
        }
        // 8+8+4+2 GPUs, 4 reserved (on the 4-GPU node): a takes 8, b 8; c
        // (2 × 2) finds 2 left and is undone, so e (2) gets them.
        assert_eq!(
            fits,
            [
                ("a", true),
                ("b", true),
                ("c", false),
                ("d", false),
                ("e", true)
            ]
        );
    }
}
