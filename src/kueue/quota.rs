//! Quota as a capacity dimension: how much of each resource a ClusterQueue
//! can still reserve for a new cluster, with what its cohort may lend, and
//! whether a new cluster fits in it.
//!
//! The arithmetic is Kueue v0.19.0's (`pkg/cache/resource_node.go`
//! `available`, `potentialAvailable`, hierarchical cohorts), for a cohort of
//! ClusterQueues without quota of its own:
//! - a queue's *guaranteed* quota is `nominal − lendingLimit` (0 without a
//!   lending limit: all of its nominal quota is lendable);
//! - the cohort's pool is the sum of its members' lendable quota minus the
//!   sum of their usage above their guaranteed quota;
//! - a queue can still reserve `max(0, guaranteed − usage)` of its own, plus
//!   what the pool has left, bounded by its borrowing limit
//!   (`lendable − max(0, usage − guaranteed) + borrowingLimit`);
//! - without a cohort: `max(0, nominal − usage)`.
//!
//! Usage is `status.flavorsReservation` (quota reserved, admitted or not),
//! plus raygate's own reservations Kueue has not counted yet. A Cohort
//! object's own quota (`kueue.x-k8s.io` `Cohort.spec.resourceGroups`) is not
//! counted: raygate then under-estimates what can be borrowed, never over.
//!
//! The new cluster is fitted as one pod set per resource group: the first
//! flavor, in the queue's order, in which every resource it needs of that
//! group fits. Kueue may split pod sets over flavors, so a cluster that fits
//! here fits in Kueue; the reverse may hold back a cluster Kueue would admit
//! (then raygate's reservation Workload is what decides: Kueue admits it or
//! not).

use std::collections::BTreeMap;

use serde::Serialize;

use super::types::{ClusterQueue, FlavorUsage};
use crate::capacity::ResourceList;
use crate::quantity::Quantity;

/// What one flavor of the queue can still reserve of one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Left {
    pub nominal: Quantity,
    /// Reserved now, raygate's uncounted reservations included.
    pub used: Quantity,
    /// Of `left`, what would be borrowed from the cohort.
    pub borrowable: Quantity,
    pub left: Quantity,
}

/// One needed resource against the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Line {
    pub resource: String,
    /// The flavor it was fitted in (`None`: no resource group of the queue
    /// covers it, and Kueue admits no workload that requests it).
    pub flavor: Option<String>,
    pub needed: Quantity,
    /// What is left in that flavor (zero when uncovered).
    pub left: Quantity,
    /// Of `left`, what the cohort would lend.
    pub borrowable: Quantity,
}

impl Line {
    pub fn fits(&self) -> bool {
        self.flavor.is_some() && self.needed <= self.left
    }
}

/// Whether a new cluster fits the queue's quota, resource by resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaReport {
    pub cluster_queue: String,
    pub cohort: Option<String>,
    pub fits: bool,
    pub lines: Vec<Line>,
}

impl QuotaReport {
    /// The lines that do not fit.
    pub fn short(&self) -> impl Iterator<Item = &Line> {
        self.lines.iter().filter(|l| !l.fits())
    }

    /// `nvidia.com/gpu 8 needed, 4 left (2 borrowable)` for each short
    /// resource (or each resource when all fit), `; `-separated.
    pub fn text(&self) -> String {
        let short: Vec<&Line> = self.short().collect();
        let lines: Vec<&Line> = if short.is_empty() {
            self.lines.iter().collect()
        } else {
            short
        };
        lines
            .iter()
            .map(|l| match &l.flavor {
                None => format!(
                    "{} {} needed, not covered by ClusterQueue {}",
                    l.resource,
                    l.needed.canonical(),
                    self.cluster_queue
                ),
                Some(f) => format!(
                    "{} {} needed, {} left in flavor {f} ({} of it borrowable from the cohort)",
                    l.resource,
                    l.needed.canonical(),
                    l.left.canonical(),
                    l.borrowable.canonical()
                ),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

type Key = (String, String);

fn usage_of(list: &[FlavorUsage]) -> BTreeMap<Key, Quantity> {
    let mut m = BTreeMap::new();
    for f in list {
        for r in &f.resources {
            if let Some(t) = &r.total {
                m.insert((f.name.clone(), r.name.clone()), t.clone());
            }
        }
    }
    m
}

/// One queue's quota of one flavor and resource: nominal, lendable, the
/// borrowing limit, and its usage.
struct Member {
    nominal: Quantity,
    lendable: Quantity,
    borrowing_limit: Option<Quantity>,
    used: Quantity,
}

impl Member {
    fn guaranteed(&self) -> Quantity {
        self.nominal.saturating_sub_floor0(&self.lendable)
    }
    /// Usage above the guaranteed quota: what it takes from the pool.
    fn in_pool(&self) -> Quantity {
        self.used.saturating_sub_floor0(&self.guaranteed())
    }
}

fn members(cq: &ClusterQueue, extra_used: &ResourceList) -> BTreeMap<Key, Member> {
    let used = usage_of(
        cq.status
            .as_ref()
            .map(|s| s.flavors_reservation.as_slice())
            .unwrap_or_default(),
    );
    let mut m = BTreeMap::new();
    for g in &cq.spec.resource_groups {
        for f in &g.flavors {
            for r in &f.resources {
                let key = (f.name.clone(), r.name.clone());
                let nominal = r.nominal_quota.clone().unwrap_or_default();
                let lendable = match &r.lending_limit {
                    Some(l) if *l < nominal => l.clone(),
                    _ => nominal.clone(),
                };
                let mut u = used.get(&key).cloned().unwrap_or_default();
                if let Some(x) = extra_used.get(&r.name) {
                    u = u.saturating_add(x);
                }
                m.insert(
                    key,
                    Member {
                        nominal,
                        lendable,
                        borrowing_limit: r.borrowing_limit.clone(),
                        used: u,
                    },
                );
            }
        }
    }
    m
}

/// What `cq` can still reserve, per flavor and resource. `all` is every
/// ClusterQueue (its cohort is found by `spec.cohortName`; `cq` itself may
/// be among them); `uncounted` is what raygate reserved in `cq` that its
/// status does not show yet, counted against every flavor (conservative).
pub fn left(
    cq: &ClusterQueue,
    all: &[ClusterQueue],
    uncounted: &ResourceList,
) -> BTreeMap<Key, Left> {
    let own = members(cq, uncounted);
    let name = cq.metadata.name.as_deref();
    let cohort = cq.spec.cohort_name.as_deref().filter(|c| !c.is_empty());
    let others: Vec<BTreeMap<Key, Member>> = match cohort {
        None => vec![],
        Some(c) => all
            .iter()
            .filter(|o| o.spec.cohort_name.as_deref() == Some(c))
            .filter(|o| o.metadata.name.as_deref() != name)
            .map(|o| members(o, &ResourceList::new()))
            .collect(),
    };
    own.iter()
        .map(|(key, me)| {
            let l = match cohort {
                None => Left {
                    nominal: me.nominal.clone(),
                    used: me.used.clone(),
                    borrowable: Quantity::zero(),
                    left: me.nominal.saturating_sub_floor0(&me.used),
                },
                Some(_) => {
                    let local = me.guaranteed().saturating_sub_floor0(&me.used);
                    let mut lendable = me.lendable.clone();
                    let mut taken = me.in_pool();
                    for o in others.iter().filter_map(|o| o.get(key)) {
                        lendable = lendable.saturating_add(&o.lendable);
                        taken = taken.saturating_add(&o.in_pool());
                    }
                    let mut parent = lendable.saturating_sub_floor0(&taken);
                    if let Some(b) = &me.borrowing_limit {
                        let limit = me
                            .lendable
                            .saturating_sub_floor0(&me.in_pool())
                            .saturating_add(b);
                        parent = parent.min(limit);
                    }
                    let total = local.saturating_add(&parent);
                    Left {
                        nominal: me.nominal.clone(),
                        used: me.used.clone(),
                        borrowable: total
                            .saturating_sub_floor0(&me.nominal.saturating_sub_floor0(&me.used)),
                        left: total,
                    }
                }
            };
            (key.clone(), l)
        })
        .collect()
}

/// Whether `needed` (the new cluster's requests, per resource) fits what
/// `cq` has left: see the module doc.
pub fn fit(
    cq: &ClusterQueue,
    all: &[ClusterQueue],
    uncounted: &ResourceList,
    needed: &ResourceList,
) -> QuotaReport {
    let left = left(cq, all, uncounted);
    let needed: Vec<(&String, &Quantity)> = needed
        .iter()
        .filter(|(r, q)| !q.is_zero() && r.as_str() != crate::capacity::PODS)
        .collect();
    let mut lines = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    for g in &cq.spec.resource_groups {
        let wanted: Vec<&(&String, &Quantity)> = needed
            .iter()
            .filter(|(r, _)| g.covered_resources.iter().any(|c| c == *r))
            .collect();
        if wanted.is_empty() {
            continue;
        }
        let line = |flavor: &str, r: &String, q: &Quantity| {
            let l = left.get(&(flavor.to_string(), r.to_string()));
            Line {
                resource: r.to_string(),
                flavor: Some(flavor.to_string()),
                needed: q.clone(),
                left: l.map(|l| l.left.clone()).unwrap_or_default(),
                borrowable: l.map(|l| l.borrowable.clone()).unwrap_or_default(),
            }
        };
        let tried: Vec<Vec<Line>> = g
            .flavors
            .iter()
            .map(|f| wanted.iter().map(|(r, q)| line(&f.name, r, q)).collect())
            .collect();
        let chosen = tried
            .iter()
            .find(|ls| ls.iter().all(Line::fits))
            .or(tried.first());
        for (r, _) in &wanted {
            covered.insert(r.to_string());
        }
        match chosen {
            Some(ls) => lines.extend(ls.iter().cloned()),
            None => lines.extend(wanted.iter().map(|(r, q)| Line {
                resource: r.to_string(),
                flavor: None,
                needed: (*q).clone(),
                left: Quantity::zero(),
                borrowable: Quantity::zero(),
            })),
        }
    }
    for (r, q) in &needed {
        if !covered.contains(*r) {
            lines.push(Line {
                resource: r.to_string(),
                flavor: None,
                needed: (*q).clone(),
                left: Quantity::zero(),
                borrowable: Quantity::zero(),
            });
        }
    }
    lines.sort_by(|a, b| a.resource.cmp(&b.resource));
    QuotaReport {
        cluster_queue: cq.metadata.name.clone().unwrap_or_default(),
        cohort: cq.spec.cohort_name.clone().filter(|c| !c.is_empty()),
        fits: lines.iter().all(Line::fits),
        lines,
    }
}

/// How long a deleted reservation's usage may still be taken out of its
/// ClusterQueue's status at most: Kueue writes a ClusterQueue's status at
/// most once per `constants.UpdatesBatchPeriod` (1 s) after a Workload
/// event, from its cache, which no longer holds the deleted Workload.
pub const RELEASE_LAG: std::time::Duration = std::time::Duration::from_secs(30);

/// A reservation raygate deleted while Kueue had admitted it: Kueue frees its
/// quota at once, but the ClusterQueue's `status.flavorsReservation`, which
/// raygate reads, still counts it until Kueue next writes that status
/// (measured ~1 s on v0.19.0): a change made in that second would read the
/// queue as full (a false `WaitingForQuota`).
#[derive(Debug, Clone, PartialEq)]
pub struct Released {
    /// The Workload, `namespace/name`: recorded once however often its
    /// deletion is retried.
    pub workload: String,
    pub cluster_queue: String,
    /// The ClusterQueue's `metadata.resourceVersion` when it was deleted:
    /// while the status is still that one, Kueue has not written it since.
    pub seen_version: Option<String>,
    /// What it held, per (flavor, resource): `status.admission`'s
    /// `podSetAssignments[].flavors` and `resourceUsage`.
    pub usage: BTreeMap<(String, String), Quantity>,
    pub at: jiff::Timestamp,
}

impl Released {
    /// The record of deleting `w` now; `None` unless Kueue had granted it
    /// (only then does the status count it).
    pub fn of(
        w: &super::types::Workload,
        cqs: &[ClusterQueue],
        at: jiff::Timestamp,
    ) -> Option<Released> {
        if !w.quota_granted() {
            return None;
        }
        let a = w.status.as_ref()?.admission.as_ref()?;
        let mut usage: BTreeMap<(String, String), Quantity> = BTreeMap::new();
        for ps in &a.pod_set_assignments {
            for (r, q) in &ps.resource_usage {
                let Some(flavor) = ps.flavors.get(r) else {
                    continue;
                };
                let e = usage.entry((flavor.clone(), r.clone())).or_default();
                *e = e.saturating_add(q);
            }
        }
        let seen_version = cqs
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(a.cluster_queue.as_str()))
            .and_then(|c| c.metadata.resource_version.clone());
        Some(Released {
            workload: format!(
                "{}/{}",
                w.metadata.namespace.as_deref().unwrap_or_default(),
                w.metadata.name.as_deref().unwrap_or_default()
            ),
            cluster_queue: a.cluster_queue.clone(),
            seen_version,
            usage,
            at,
        })
    }

    /// Whether `cq`'s status may still count it: the same ClusterQueue,
    /// not written by Kueue since the deletion, and within [`RELEASE_LAG`].
    pub fn still_counted(&self, cq: &ClusterQueue, now: jiff::Timestamp) -> bool {
        let young = std::time::Duration::try_from(now.duration_since(self.at))
            .is_ok_and(|d| d < RELEASE_LAG);
        young
            && self.seen_version.is_some()
            && cq.metadata.name.as_deref() == Some(self.cluster_queue.as_str())
            && cq.metadata.resource_version == self.seen_version
    }
}

/// `cqs` with the usage of `released` reservations taken out of the
/// statuses that still count them ([`Released::still_counted`]), never
/// below 0: Kueue's own view, which its status shows a second later.
pub fn without_released(cqs: &mut [ClusterQueue], released: &[Released], now: jiff::Timestamp) {
    for cq in cqs.iter_mut() {
        let mine: Vec<&Released> = released
            .iter()
            .filter(|r| r.still_counted(cq, now))
            .collect();
        let Some(status) = cq.status.as_mut().filter(|_| !mine.is_empty()) else {
            continue;
        };
        for f in &mut status.flavors_reservation {
            for res in &mut f.resources {
                let key = (f.name.clone(), res.name.clone());
                for r in &mine {
                    if let (Some(t), Some(u)) = (res.total.as_mut(), r.usage.get(&key)) {
                        *t = t.saturating_sub_floor0(u);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(n: i64) -> Quantity {
        Quantity::from_units(n)
    }

    /// A ClusterQueue with one flavor `a100` of GPUs and CPUs.
    fn cq(name: &str, cohort: Option<&str>, gpu: serde_json::Value, used_gpu: i64) -> ClusterQueue {
        serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {"cohortName": cohort, "resourceGroups": [{
                "coveredResources": ["cpu", "nvidia.com/gpu"],
                "flavors": [{"name": "a100", "resources": [
                    {"name": "cpu", "nominalQuota": "100"},
                    gpu]}]}]},
            "status": {"flavorsReservation": [{"name": "a100", "resources": [
                {"name": "nvidia.com/gpu", "total": used_gpu.to_string()}]}]}
        }))
        .unwrap()
    }

    fn gpu(nominal: i64) -> serde_json::Value {
        json!({"name": "nvidia.com/gpu", "nominalQuota": nominal.to_string()})
    }

    fn needs(gpus: i64) -> ResourceList {
        [
            ("cpu".to_string(), q(4)),
            ("nvidia.com/gpu".to_string(), q(gpus)),
        ]
        .into()
    }

    fn gpu_left(cq: &ClusterQueue, all: &[ClusterQueue]) -> Quantity {
        left(cq, all, &ResourceList::new())[&("a100".to_string(), "nvidia.com/gpu".to_string())]
            .left
            .clone()
    }

    #[test]
    fn alone_a_queue_has_nominal_minus_reserved() {
        // Issue 38's platform: 16 GPUs of nominal quota, one 8-GPU worker runs.
        let a = cq("team-a", None, gpu(16), 8);
        assert_eq!(gpu_left(&a, &[]), q(8));
        let r = fit(&a, &[], &ResourceList::new(), &needs(8));
        assert!(r.fits, "{r:?}");
        let r = fit(&a, &[], &ResourceList::new(), &needs(16));
        assert!(!r.fits);
        assert_eq!(
            r.text(),
            "nvidia.com/gpu 16 needed, 8 left in flavor a100 (0 of it borrowable from the cohort)"
        );
        // raygate's own reservation not counted by Kueue yet takes its part.
        let r = fit(
            &a,
            &[],
            &[("nvidia.com/gpu".to_string(), q(4))].into(),
            &needs(8),
        );
        assert!(!r.fits);
        assert_eq!(r.short().next().unwrap().left, q(4));
        // Over-used (quota lowered under running workloads): nothing left, no underflow.
        assert_eq!(gpu_left(&cq("a", None, gpu(4), 8), &[]), q(0));
    }

    #[test]
    fn a_cohort_lends_its_unused_lendable_quota_within_the_borrowing_limit() {
        let a = cq("team-a", Some("ml"), gpu(16), 8);
        let b = cq("team-b", Some("ml"), gpu(16), 0);
        let other = cq("team-c", Some("other"), gpu(64), 0);
        let all = [a.clone(), b.clone(), other];
        // 8 of its own + all 16 of team-b's.
        assert_eq!(gpu_left(&a, &all), q(24));
        let l = &left(&a, &all, &ResourceList::new())[&("a100".into(), "nvidia.com/gpu".into())];
        assert_eq!((l.borrowable.clone(), l.used.clone()), (q(16), q(8)));
        // team-b uses 12 of its 16: 4 to lend.
        let b12 = cq("team-b", Some("ml"), gpu(16), 12);
        assert_eq!(gpu_left(&a, &[a.clone(), b12.clone()]), q(12));
        // team-b lends at most 6 and keeps 10 guaranteed: using 12, it lends 4.
        let b_lend6 = cq(
            "team-b",
            Some("ml"),
            json!({"name": "nvidia.com/gpu", "nominalQuota": "16", "lendingLimit": "6"}),
            12,
        );
        assert_eq!(gpu_left(&a, &[a.clone(), b_lend6]), q(12));
        let b_lend6_idle = cq(
            "team-b",
            Some("ml"),
            json!({"name": "nvidia.com/gpu", "nominalQuota": "16", "lendingLimit": "6"}),
            0,
        );
        assert_eq!(gpu_left(&a, &[a.clone(), b_lend6_idle]), q(14));
        // team-a may borrow at most 2.
        let a_b2 = cq(
            "team-a",
            Some("ml"),
            json!({"name": "nvidia.com/gpu", "nominalQuota": "16", "borrowingLimit": "2"}),
            8,
        );
        assert_eq!(gpu_left(&a_b2, &[a_b2.clone(), b.clone()]), q(10));
        // Already borrowing 4 (uses 20 of 16): 0 of its own, 12 more from the pool.
        let a20 = cq("team-a", Some("ml"), gpu(16), 20);
        assert_eq!(gpu_left(&a20, &[a20.clone(), b.clone()]), q(12));
        // The report names the borrowed part.
        let r = fit(&a, &all, &ResourceList::new(), &needs(20));
        assert!(r.fits, "{r:?}");
        assert!(
            r.text()
                .contains("24 left in flavor a100 (16 of it borrowable"),
            "{}",
            r.text()
        );
    }

    #[test]
    fn flavors_are_tried_in_order_and_uncovered_resources_never_fit() {
        let two: ClusterQueue = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": "team-a"},
            "spec": {"resourceGroups": [{
                "coveredResources": ["nvidia.com/gpu"],
                "flavors": [
                    {"name": "a100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "4"}]},
                    {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "8"}]}]}]}
        }))
        .unwrap();
        let gpus: ResourceList = [("nvidia.com/gpu".to_string(), q(8))].into();
        let r = fit(&two, &[], &ResourceList::new(), &gpus);
        assert!(r.fits);
        assert_eq!(r.lines[0].flavor.as_deref(), Some("h100"));
        // Too many for either: the first flavor is reported.
        let r = fit(
            &two,
            &[],
            &ResourceList::new(),
            &[("nvidia.com/gpu".to_string(), q(9))].into(),
        );
        assert_eq!(
            (r.fits, r.lines[0].flavor.as_deref()),
            (false, Some("a100"))
        );
        // cpu is not covered: Kueue admits nothing that requests it.
        let r = fit(&two, &[], &ResourceList::new(), &needs(2));
        assert!(!r.fits);
        assert!(
            r.text()
                .contains("cpu 4 needed, not covered by ClusterQueue team-a"),
            "{}",
            r.text()
        );
        // Zero requests and pod slots are not quota.
        let r = fit(
            &two,
            &[],
            &ResourceList::new(),
            &[
                ("cpu".to_string(), q(0)),
                ("pods".to_string(), q(3)),
                ("nvidia.com/gpu".to_string(), q(1)),
            ]
            .into(),
        );
        assert!(r.fits, "{r:?}");
    }

    #[test]
    fn a_deleted_reservation_is_not_counted_while_kueues_status_lags() {
        // Measured with Kueue v0.19.0: raygate deleted its granted 8-GPU
        // reservation at Completed; ClusterQueue team (16 nominal, the
        // service's 8 + the reservation's 8) still showed 16 reserved for
        // ~1 s, and a change made then read "8 needed, 0 left".
        let mut team = cq("team", None, gpu(16), 16);
        team.metadata.resource_version = Some("41".into());
        let other = {
            let mut o = cq("other", None, gpu(16), 16);
            o.metadata.resource_version = Some("41".into());
            o
        };
        let w: super::super::types::Workload = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "llm-abc-quota", "namespace": "ml"},
            "spec": {"podSets": []},
            "status": {
                "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "r",
                    "message": "", "lastTransitionTime": "2026-12-07T00:00:00Z"}],
                "admission": {"clusterQueue": "team", "podSetAssignments": [
                    {"name": "head", "flavors": {"cpu": "a100"}, "resourceUsage": {"cpu": "2"}},
                    {"name": "gpu-workers", "flavors": {"cpu": "a100", "nvidia.com/gpu": "a100"},
                     "resourceUsage": {"cpu": "4", "nvidia.com/gpu": "8"}}]}}
        }))
        .unwrap();
        let t0: jiff::Timestamp = "2026-12-07T06:00:00Z".parse().unwrap();
        let r = Released::of(&w, &[team.clone()], t0).unwrap();
        assert_eq!(r.seen_version.as_deref(), Some("41"));
        assert_eq!(r.usage[&("a100".into(), "nvidia.com/gpu".into())], q(8));
        assert_eq!(r.usage[&("a100".into(), "cpu".into())], q(6));
        let at = |s: i64| t0 + jiff::SignedDuration::from_secs(s);
        // Kueue's status still counts it: taken out (the other queue untouched).
        let mut cqs = vec![team.clone(), other.clone()];
        without_released(&mut cqs, std::slice::from_ref(&r), at(1));
        assert_eq!(gpu_left(&cqs[0], &cqs), q(8));
        assert!(fit(&cqs[0], &cqs, &ResourceList::new(), &needs(8)).fits);
        assert_eq!(gpu_left(&cqs[1], &cqs), q(0));
        // Kueue wrote the status since (it no longer counts it): as reported.
        let mut caught_up = cq("team", None, gpu(16), 8);
        caught_up.metadata.resource_version = Some("42".into());
        let mut cqs = vec![caught_up];
        without_released(&mut cqs, std::slice::from_ref(&r), at(1));
        assert_eq!(gpu_left(&cqs[0], &cqs), q(8));
        // Never beyond the bound, never below 0, and only granted ones.
        let mut cqs = vec![team.clone()];
        without_released(&mut cqs, std::slice::from_ref(&r), at(31));
        assert_eq!(gpu_left(&cqs[0], &cqs), q(0));
        let mut low = cq("team", None, gpu(16), 4);
        low.metadata.resource_version = Some("41".into());
        let mut cqs = vec![low];
        without_released(&mut cqs, &[r.clone(), r.clone()], at(1));
        assert_eq!(gpu_left(&cqs[0], &cqs), q(16));
        let mut pending = w.clone();
        pending.status.as_mut().unwrap().conditions.clear();
        assert_eq!(Released::of(&pending, &[team], t0), None);
    }
}
