//! The capacity step of a decision: does the change's new cluster fit, with
//! the capacity that admitted upgrades hold and waiting ones ahead take?
//!
//! A plan waiting for capacity reads its result from the admission pass
//! ([`super::pass`], computed once per change of the cluster); any other (a
//! first decision, an admission fitted again) is fitted alone, after the
//! ledger and the waiting upgrades ahead of it in queue order. What is
//! observed (free capacity, the other plans' claims) comes through
//! [`Cluster`]; the choices are made here.

use std::sync::Arc;

use super::ledger::{self, Candidate, QueueKey};
use super::pass::Pass;
use super::{ChangeFacts, Inputs, Settings};
use crate::capacity::{self, CapacityIndex, ClusterState, FitReport, FitRequest, PodGroup};
use crate::upgradeplan::{Phase, PlanKey};

/// Free capacity at one moment, to place pods on.
pub trait Placement {
    fn fit(&self, req: &FitRequest) -> crate::Result<FitReport>;
    /// Runs the admission pass: `ledger`, then `queue` (in admission order).
    fn pass(&self, ledger: &[PodGroup], queue: &[Candidate]) -> crate::Result<Pass>;
}

/// The controller's capacity index (held read-locked for one fit), with the
/// rules new pods are admitted with.
pub struct OnIndex<'a, I: std::ops::Deref<Target = CapacityIndex>> {
    pub index: I,
    pub rules: &'a ClusterState,
}

impl<I: std::ops::Deref<Target = CapacityIndex>> Placement for OnIndex<'_, I> {
    fn fit(&self, req: &FitRequest) -> crate::Result<FitReport> {
        self.index.fit(self.rules, req)
    }

    fn pass(&self, ledger: &[PodGroup], queue: &[Candidate]) -> crate::Result<Pass> {
        super::pass::run_on(&self.index, self.rules, ledger, queue)
    }
}

/// The rest of the cluster as one plan's fit sees it. The controller
/// implements it on its caches; nothing is read until a decision reaches
/// the capacity step, which most reconciles never do.
pub trait Cluster {
    /// The LimitRanges and RuntimeClasses new pods are admitted with.
    fn rules(&self) -> &ClusterState;
    /// Free capacity now: one consistent snapshot for a whole fit.
    fn capacity(&self) -> crate::Result<Box<dyn Placement + '_>>;
    /// Unbound pods of the admitted upgrades of every plan but `except`.
    fn ledger(&self, except: Option<&PlanKey>) -> Vec<PodGroup>;
    /// The plans waiting for capacity, but `except`, in no particular order.
    fn waiting(&self, except: Option<&PlanKey>) -> Vec<Candidate>;
    /// The admission pass for the cluster as it is now; `run` computes it
    /// when none computed on the same objects is kept.
    fn pass(&self, run: &dyn Fn() -> crate::Result<Pass>) -> crate::Result<Arc<Pass>>;
}

/// The fit of `change`, with the ledger and the queue ahead reserved; the
/// transition's peak counts the active cluster's pods.
pub fn of_change(
    inp: &Inputs<'_>,
    settings: &Settings,
    change: &ChangeFacts,
) -> crate::Result<FitReport> {
    let cluster = inp.cluster;
    let old_pods = inp
        .service
        .as_ref()
        .ok()
        .and_then(|s| s.active_cluster.as_ref())
        .and_then(|a| inp.pods.get(a))
        .map(Vec::as_slice)
        .unwrap_or_default();
    let old_requests = super::observed::total_requests(
        old_pods.iter().map(|p| p.as_ref()),
        &cluster.rules().limit_ranges,
    )?;
    let key = inp.key();
    if waits_in_queue(inp) {
        let pass = cluster.pass(&|| run_pass(cluster))?;
        if let Some(result) = pass.get(&key.namespace, &key.name) {
            let mut report = match result {
                Ok(r) => r.clone(),
                // The pass keeps the error; each decision reports it as its own.
                Err(e) => {
                    return Err(crate::Error::invalid(
                        format!("UpgradePlan {}/{}", key.namespace, key.name),
                        e.to_string(),
                    ));
                }
            };
            report.required = capacity::sum(&old_requests, &report.new_requests);
            report.old_requests = old_requests;
            return Ok(report);
        }
    }
    let ledger = cluster.ledger(Some(&key));
    let mut queue = cluster.waiting(Some(&key));
    queue.push(Candidate {
        key: QueueKey::of(inp.plan, settings.priority, inp.prev(), inp.now),
        pods: change.pods_to_fit().to_vec(),
        headroom: settings.headroom.clone(),
    });
    ledger::order(&mut queue);
    let place = cluster.capacity()?;
    let reserved = ledger::reserved_with(
        |r| place.fit(r),
        &ledger,
        &queue,
        (&key.namespace, &key.name),
    )?;
    place.fit(&FitRequest {
        pods: change.pods_to_fit().to_vec(),
        reserved,
        headroom: settings.headroom.clone(),
        old_requests,
    })
}

/// A plan the pass answers for: recorded as waiting for capacity, and not
/// admitted (not even in a write the cache has not shown yet).
fn waits_in_queue(inp: &Inputs<'_>) -> bool {
    inp.prev()
        .is_some_and(|s| s.phase == Phase::WaitingForCapacity && s.admitted.is_none())
        && !inp.admission_unseen
}

/// The pass over every admitted and waiting upgrade.
fn run_pass(cluster: &dyn Cluster) -> crate::Result<Pass> {
    let ledger = cluster.ledger(None);
    let mut queue = cluster.waiting(None);
    ledger::order(&mut queue);
    cluster.capacity()?.pass(&ledger, &queue)
}

/// A cluster read whole (a file, or `kubectl raygate fit`'s live lists),
/// with no other plan's reservations or queue: what the unit tests and the
/// live fit decide against.
pub struct Alone<'a>(pub &'a ClusterState);

impl Placement for Alone<'_> {
    fn fit(&self, req: &FitRequest) -> crate::Result<FitReport> {
        capacity::fit(self.0, req)
    }

    fn pass(&self, ledger: &[PodGroup], queue: &[Candidate]) -> crate::Result<Pass> {
        super::pass::run(&capacity::node::capacity(self.0)?, self.0, ledger, queue)
    }
}

impl Cluster for Alone<'_> {
    fn rules(&self) -> &ClusterState {
        self.0
    }

    fn capacity(&self) -> crate::Result<Box<dyn Placement + '_>> {
        Ok(Box::new(Alone(self.0)))
    }

    fn ledger(&self, _: Option<&PlanKey>) -> Vec<PodGroup> {
        vec![]
    }

    fn waiting(&self, _: Option<&PlanKey>) -> Vec<Candidate> {
        vec![]
    }

    fn pass(&self, run: &dyn Fn() -> crate::Result<Pass>) -> crate::Result<Arc<Pass>> {
        run().map(Arc::new)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::{BTreeMap, BTreeSet};

    use serde_json::json;

    use super::*;
    use crate::admission::pass::tests::gpu_pod;
    use crate::admission::{GateFacts, ServiceFacts};
    use crate::capacity::ResourceList;
    use crate::upgradeplan::{PendingChange, UpgradePlan, UpgradePlanSpec, UpgradePlanStatus};

    /// [`Alone`] with other plans: `ledger` admitted, `waiting` queued.
    struct Others<'a> {
        state: &'a ClusterState,
        ledger: Vec<PodGroup>,
        waiting: Vec<Candidate>,
        passes: Cell<usize>,
    }

    impl Cluster for Others<'_> {
        fn rules(&self) -> &ClusterState {
            self.state
        }
        fn capacity(&self) -> crate::Result<Box<dyn Placement + '_>> {
            Ok(Box::new(Alone(self.state)))
        }
        fn ledger(&self, _: Option<&PlanKey>) -> Vec<PodGroup> {
            self.ledger.clone()
        }
        fn waiting(&self, except: Option<&PlanKey>) -> Vec<Candidate> {
            self.waiting
                .iter()
                .filter(|c| except.is_none_or(|k| *k != c.key.plan()))
                .cloned()
                .collect()
        }
        fn pass(&self, run: &dyn Fn() -> crate::Result<Pass>) -> crate::Result<Arc<Pass>> {
            self.passes.set(self.passes.get() + 1);
            run().map(Arc::new)
        }
    }

    fn one_node(gpus: u32) -> ClusterState {
        ClusterState::from_list(json!({"kind": "List", "items": [
            {"kind": "Node", "metadata": {"name": "n0"},
             "status": {"allocatable": {"cpu": "64", "pods": "110", "nvidia.com/gpu": gpus.to_string()},
                        "conditions": [{"type": "Ready", "status": "True"}]}}]}))
        .unwrap()
    }

    fn candidate(name: &str, priority: i32, gpus: u32) -> Candidate {
        Candidate {
            key: ledger::tests::key(name, priority, "2026-12-02T11:00:00Z"),
            pods: vec![PodGroup::from(gpu_pod(&format!("{name}-w-0"), gpus))],
            headroom: ResourceList::new(),
        }
    }

    fn plan(priority: i32, status: Option<UpgradePlanStatus>) -> UpgradePlan {
        let spec: UpgradePlanSpec =
            serde_json::from_value(json!({"rayServiceRef": {"name": "llm"}, "priority": priority}))
                .unwrap();
        let mut p = UpgradePlan::new("me", spec);
        p.metadata.namespace = Some("ml".into());
        p.status = status;
        p
    }

    fn waiting_status() -> UpgradePlanStatus {
        UpgradePlanStatus {
            phase: Phase::WaitingForCapacity,
            pending_change: Some(PendingChange {
                fingerprint: "abc".into(),
                triggering_paths: vec![],
                detected_time: "2026-12-02T10:00:00Z".parse().unwrap(),
            }),
            ..Default::default()
        }
    }

    fn fit_for(p: &UpgradePlan, cluster: &dyn Cluster, unseen: bool) -> FitReport {
        let inp = Inputs {
            now: "2026-12-02T12:00:00Z".parse().unwrap(),
            plan: p,
            settings: Settings::of(p),
            release: crate::kuberay::Release::assumed(crate::kuberay::KubeRayVersion::latest()),
            service: Ok(ServiceFacts::default()),
            change: Ok(None),
            verdict: None,
            incremental: None,
            clusters: BTreeSet::new(),
            pods: BTreeMap::new(),
            pending_ready: false,
            pending_fingerprint: None,
            pending_stamp: Default::default(),
            gate: GateFacts::default(),
            admission_unseen: unseen,
            quota: None,
            capacity_request: None,
            cluster,
        };
        let change = ChangeFacts {
            fingerprint: "abc".into(),
            triggering_paths: vec![],
            new_pods: vec![PodGroup::from(gpu_pod("me-w-0", 8))],
            surge: None,
        };
        of_change(&inp, inp.settings.as_ref().unwrap(), &change).unwrap()
    }

    #[test]
    fn a_first_decision_comes_after_the_ledger_and_the_queue_ahead() {
        let state = one_node(16);
        let others = |ledger: u32, ahead: i32| Others {
            state: &state,
            ledger: vec![PodGroup::from(gpu_pod("adm-w-0", ledger))],
            waiting: vec![candidate("other", ahead, 8)],
            passes: Cell::new(0),
        };
        // 16 GPUs: 4 admitted, 8 for a plan of higher priority: 4 left.
        let c = others(4, 5);
        let r = fit_for(&plan(0, None), &c, false);
        assert!(!r.fits);
        assert_eq!(
            r.shortfall["nvidia.com/gpu"],
            crate::quantity::Quantity::from_units(4)
        );
        assert_eq!(c.passes.get(), 0, "only a plan in the queue reads the pass");
        // Ahead of the other plan, it fits.
        assert!(fit_for(&plan(9, None), &others(4, 5), false).fits);
    }

    #[test]
    fn a_waiting_plan_reads_its_result_from_the_pass() {
        let state = one_node(16);
        let mut me = candidate("me", 0, 8);
        me.key.since = "2026-12-02T10:00:00Z".parse().unwrap();
        let c = Others {
            state: &state,
            ledger: vec![],
            waiting: vec![candidate("other", 5, 12), me],
            passes: Cell::new(0),
        };
        let p = plan(0, Some(waiting_status()));
        let r = fit_for(&p, &c, false);
        assert_eq!(c.passes.get(), 1);
        assert!(!r.fits, "the other plan ahead takes 12 of 16");
        // An admission written but not seen yet is fitted alone, not read
        // from a pass that counts it as waiting.
        let r = fit_for(&p, &c, true);
        assert_eq!(c.passes.get(), 1);
        assert!(!r.fits);
    }
}
