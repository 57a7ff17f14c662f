//! Capacity for an incremental upgrade (`spec.upgradeType:
//! NewClusterWithIncrementalUpgrade`): the surge, not a second cluster.
//!
//! KubeRay starts the new cluster at head + `minReplicas` and lets the Ray
//! autoscaler grow it as Serve's target capacity moves, at most
//! `maxSurgePercent` ahead of the traffic, while the old cluster shrinks
//! ([`crate::kuberay::incremental`]). So what must fit on top of the running
//! cluster is, per group:
//!
//! - the head: one new head pod, in full;
//! - a worker group with the same pod shape as the running one:
//!   `minReplicas + ceil(maxSurgePercent × active workers)`, at most
//!   `maxReplicas`; the rest reuses the room the old cluster's workers free;
//! - a new worker group, or one whose pods ask for more of any resource (more
//!   GPUs per worker): in full, since the old workers' room does not hold them.
//!
//! An admitted incremental upgrade keeps its budget ([`SurgeBudget`]) for the
//! whole transition: the ledger holds what the budget allows beyond the pods
//! the RayService holds now ([`held`]), so room the old cluster frees between
//! two steps is not given to another upgrade.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::LimitRange;

use super::observed::ObservedPod;
pub use super::observed::{HEAD, group_of};
use crate::capacity::{PodGroup, ResourceList, pod_requests};
use crate::kuberay::incremental::{GroupBounds, Options};
use crate::upgradeplan::SurgeBudget;

/// What an incremental upgrade needs: the pods to fit now, and the budget to
/// keep for the transition.
#[derive(Debug, Clone, PartialEq)]
pub struct Surge {
    /// The new cluster's pods at the peak of the surge.
    pub pods: Vec<PodGroup>,
    pub budget: Vec<SurgeBudget>,
}

/// The running cluster's workers of one group.
#[derive(Debug, Clone, Default)]
pub struct ActiveGroup {
    pub pods: usize,
    /// What one of its pods requests (kube-scheduler's effective requests).
    pub requests: ResourceList,
}

/// The active cluster's pods per worker group (the head is left out).
pub fn active_groups<P: ObservedPod + ?Sized>(
    pods: &[&P],
    limit_ranges: &[LimitRange],
) -> crate::Result<BTreeMap<String, ActiveGroup>> {
    let mut out: BTreeMap<String, ActiveGroup> = BTreeMap::new();
    for p in pods {
        let g = group_of(*p);
        if g == HEAD {
            continue;
        }
        let entry = out.entry(g).or_default();
        if entry.pods == 0 {
            entry.requests = p.requests(limit_ranges)?;
        }
        entry.pods += 1;
    }
    Ok(out)
}

/// A new pod asks for more of some resource than an old one: the room an old
/// pod frees does not hold it.
fn grew(new: &ResourceList, old: &ResourceList) -> bool {
    new.iter()
        .any(|(k, q)| old.get(k).is_none_or(|o| q > o) && !q.is_zero())
}

/// The surge of the new cluster `full` (head, then worker groups, as
/// [`crate::kuberay::planned_groups`] plans it) next to `active`.
pub fn plan(
    full: &[PodGroup],
    bounds: &[(String, GroupBounds)],
    active: &BTreeMap<String, ActiveGroup>,
    opts: &Options,
    limit_ranges: &[LimitRange],
) -> crate::Result<Surge> {
    let mut pods = Vec::new();
    let mut budget = Vec::new();
    for g in full {
        let name = group_of(&g.template);
        if name == HEAD {
            pods.push(g.clone());
            budget.push(SurgeBudget {
                group: HEAD.into(),
                pods: g.count as i64,
                shares_active: false,
            });
            continue;
        }
        let b = bounds
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| *b)
            .unwrap_or(GroupBounds {
                min_pods: g.count,
                max_pods: g.count,
            });
        let new_requests = pod_requests(&g.template, limit_ranges)?;
        let (count, shares_active) = match active.get(&name) {
            Some(a) if a.pods > 0 && !grew(&new_requests, &a.requests) => {
                let surge = (a.pods * usize::from(opts.max_surge_percent)).div_ceil(100);
                (b.min_pods.saturating_add(surge).min(b.max_pods), true)
            }
            // In full: as many as the running group has, or the spec asks for.
            a => {
                let running = a.map_or(0, |a| a.pods);
                (
                    g.count
                        .max(running)
                        .clamp(b.min_pods, b.max_pods.max(b.min_pods)),
                    false,
                )
            }
        };
        let running = active.get(&name).map_or(0, |a| a.pods);
        budget.push(SurgeBudget {
            group: name,
            pods: (count + if shares_active { running } else { 0 }) as i64,
            shares_active,
        });
        if count > 0 {
            let mut p = g.clone();
            p.count = count;
            pods.push(p);
        }
    }
    Ok(Surge { pods, budget })
}

/// Bound pods per group ([`group_of`]).
pub fn bound_by_group<P: ObservedPod + ?Sized>(pods: &[&P]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in pods {
        if p.is_bound() {
            *out.entry(group_of(*p)).or_default() += 1;
        }
    }
    out
}

/// What an admitted incremental transition still holds in the ledger: per
/// budget entry, the pods it allows beyond those the RayService holds now
/// (the new cluster's bound pods, and the old cluster's where they share the
/// budget), as pods of the new cluster (`full` gives their templates).
pub fn held(
    full: &[PodGroup],
    budget: &[SurgeBudget],
    active_bound: &BTreeMap<String, usize>,
    pending_bound: &BTreeMap<String, usize>,
) -> Vec<PodGroup> {
    budget
        .iter()
        .filter_map(|b| {
            let template = full.iter().find(|g| group_of(&g.template) == b.group)?;
            let mut used = pending_bound.get(&b.group).copied().unwrap_or(0);
            if b.shares_active {
                used += active_bound.get(&b.group).copied().unwrap_or(0);
            }
            let left = usize::try_from(b.pods).unwrap_or(0).saturating_sub(used);
            (left > 0).then(|| {
                let mut g = template.clone();
                g.count = left;
                g
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod(name: &str, node_type: &str, group: &str, gpus: u32, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "n",
                "labels": {"ray.io/node-type": node_type, "ray.io/group": group}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {
                "cpu": "1", "nvidia.com/gpu": gpus.to_string()}}}]}
        }))
        .unwrap()
    }

    fn full(workers: usize, gpus: u32) -> Vec<PodGroup> {
        vec![
            PodGroup::from(pod("s-next-head", "head", "headgroup", 0, None)),
            PodGroup::indexed(
                pod("s-next-gpu-worker-0", "worker", "gpu", gpus, None),
                workers,
                "s-next-gpu-worker-".into(),
            ),
        ]
    }

    fn opts(max_surge: u8) -> Options {
        Options {
            max_surge_percent: max_surge,
            step_size_percent: 10,
            interval_seconds: 30,
        }
    }

    fn bounds(min: usize, max: usize) -> Vec<(String, GroupBounds)> {
        vec![(
            "gpu".into(),
            GroupBounds {
                min_pods: min,
                max_pods: max,
            },
        )]
    }

    fn active(n: usize, gpus: u32) -> BTreeMap<String, ActiveGroup> {
        let pods: Vec<Pod> = (0..n)
            .map(|i| pod(&format!("a-{i}"), "worker", "gpu", gpus, Some("n1")))
            .collect();
        let refs: Vec<&Pod> = pods.iter().collect();
        active_groups(&refs, &[]).unwrap()
    }

    fn counts(s: &Surge) -> Vec<(String, usize)> {
        s.pods
            .iter()
            .map(|g| (group_of(&g.template), g.count))
            .collect()
    }

    #[test]
    fn same_shape_needs_min_plus_ceil_surge() {
        // 10 workers, maxSurge 25 %, min 1: 1 + ceil(2.5) = 4 new workers.
        let s = plan(&full(10, 8), &bounds(1, 20), &active(10, 8), &opts(25), &[]).unwrap();
        assert_eq!(counts(&s), vec![("head".into(), 1), ("gpu".into(), 4)]);
        assert_eq!(
            s.budget[1],
            SurgeBudget {
                group: "gpu".into(),
                pods: 14,
                shares_active: true
            }
        );
        // ceil: 1 worker at 1 % surges 1.
        let s = plan(&full(1, 8), &bounds(0, 5), &active(1, 8), &opts(1), &[]).unwrap();
        assert_eq!(counts(&s)[1], ("gpu".into(), 1));
        // Clamped to maxReplicas.
        let s = plan(&full(10, 8), &bounds(2, 3), &active(10, 8), &opts(100), &[]).unwrap();
        assert_eq!(counts(&s)[1], ("gpu".into(), 3));
        // maxSurge 0 at min 0: only the head.
        let s = plan(&full(4, 8), &bounds(0, 8), &active(4, 8), &opts(0), &[]).unwrap();
        assert_eq!(counts(&s), vec![("head".into(), 1)]);
    }

    #[test]
    fn grown_or_new_groups_count_in_full() {
        // 4 workers of 4 GPUs become 8-GPU workers: the freed room does not hold them.
        let s = plan(&full(4, 8), &bounds(1, 8), &active(4, 4), &opts(25), &[]).unwrap();
        assert_eq!(counts(&s)[1], ("gpu".into(), 4));
        assert!(!s.budget[1].shares_active);
        // Fewer GPUs per worker: the old room holds them.
        let s = plan(&full(4, 4), &bounds(1, 8), &active(4, 8), &opts(25), &[]).unwrap();
        assert_eq!(counts(&s)[1], ("gpu".into(), 2));
        // A group the running cluster does not have.
        let s = plan(&full(3, 8), &bounds(1, 8), &BTreeMap::new(), &opts(25), &[]).unwrap();
        assert_eq!(counts(&s)[1], ("gpu".into(), 3));
    }

    #[test]
    fn the_budget_is_held_for_the_whole_transition() {
        let f = full(10, 8);
        let s = plan(&f, &bounds(1, 20), &active(10, 8), &opts(25), &[]).unwrap();
        let held_at = |active: usize, pending: usize, head: usize| {
            let a = BTreeMap::from([("gpu".to_string(), active)]);
            let p = BTreeMap::from([("gpu".to_string(), pending), (HEAD.to_string(), head)]);
            held(&f, &s.budget, &a, &p)
                .iter()
                .map(|g| (group_of(&g.template), g.count))
                .collect::<Vec<_>>()
        };
        // Admitted, nothing bound yet: the head and 4 workers.
        assert_eq!(
            held_at(10, 0, 0),
            vec![("head".into(), 1), ("gpu".into(), 4)]
        );
        // Surge bound: nothing more held.
        assert_eq!(held_at(10, 4, 1), vec![]);
        // The old cluster shrank by 3 before the new one grew: the room is kept.
        assert_eq!(held_at(7, 4, 1), vec![("gpu".into(), 3)]);
        // Near the end: the old cluster is gone, the new one has 10.
        assert_eq!(held_at(0, 10, 1), vec![("gpu".into(), 4)]);
    }
}
