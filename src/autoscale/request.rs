//! A plan's capacity request as part of its decision. Pure: from what the
//! controller observed ([`Facts`]: the other plans waiting with a request,
//! the plans that have objects now, this plan's buffers, its last apply
//! error), [`settle`] picks the plan's slot in the request queue under the
//! cap ([`super::queue`]), builds the objects an open slot wants
//! ([`super::shapes`]), completes the status ([`super::report`]) and says
//! what the plan's objects should be ([`Wanted`]).
//!
//! The controller (`controller::buffers`) reserves the slot under one lock
//! (two plans reconciled at once must not both take the last one) and makes
//! the cluster match [`Wanted`]; it decides nothing.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::LimitRange;

use super::buffer::CapacityBuffer;
use super::queue::{self, Slot};
use super::report;
use super::shapes::{self, Objects, Owner};
use super::{Defaults, Request};
use crate::admission::ledger::QueueKey;
use crate::admission::{Decision, Inputs};
use crate::upgradeplan::CapacityRequestState;
use crate::upgradeplan::{Fingerprint, PlanKey};

/// What one decision reads about capacity requests.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// `--capacity-requests` and the defaults of `spec.capacity`.
    pub defaults: Defaults,
    /// The other plans waiting for capacity with a request, as their
    /// recorded status says (the queue the slots follow).
    pub others: Vec<QueueKey>,
    /// The plans that have objects now: in the cache, or reserved by this
    /// process and not in the cache yet. They count against the cap.
    pub open_now: BTreeSet<PlanKey>,
    /// This plan's CapacityBuffers in the cache, of any change.
    pub buffers: Vec<Arc<CapacityBuffer>>,
    /// Why the last apply of this plan's objects failed, if it did.
    pub apply_error: Option<String>,
    /// The LimitRanges of the plan's namespace: the shapes are the pods as
    /// the apiserver admits them.
    pub limit_ranges: Vec<LimitRange>,
}

/// What a decision wants done with the plan's objects.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Wanted {
    /// Keep these (one change's) and no other.
    Open {
        fingerprint: Fingerprint,
        objects: Vec<Objects>,
    },
    /// None.
    #[default]
    Close,
}

impl Wanted {
    /// The plan takes (or keeps) a request slot.
    pub fn opens(&self) -> bool {
        matches!(self, Wanted::Open { .. })
    }
}

/// Completes `d`, decided on `inp`, with the plan's capacity request
/// ([`report::annotate`]) and says what its objects should be.
pub fn settle(inp: &Inputs<'_>, f: &Facts, d: &mut Decision) -> Wanted {
    let plan = inp.plan;
    let request = super::resolve(plan, &f.defaults).map_err(|e| e.to_string());
    let fingerprint = report::waiting_change(d);
    let mut slot = None;
    let mut objects = None;
    let mut error = f.apply_error.clone();
    if let (Ok(Some(r)), Some(fp), true) = (&request, &fingerprint, f.defaults.enabled) {
        let priority = inp.settings.as_ref().map(|s| s.priority).unwrap_or(0);
        let me = QueueKey::of(plan, priority, Some(&d.status), inp.now);
        slot = Some(queue::slot_of(
            &me,
            &f.others,
            &f.open_now,
            f.defaults.max_open,
        ));
        if slot == Some(Slot::Open) {
            match build(inp, fp, r, &f.limit_ranges) {
                Ok(o) => objects = Some(o),
                Err(e) => error = Some(e.to_string()),
            }
        }
    }
    let facts = report::Facts {
        enabled: f.defaults.enabled,
        request,
        slot,
        max_open: f.defaults.max_open,
        buffers: f.buffers.iter().map(AsRef::as_ref).collect(),
        error,
    };
    report::annotate(d, plan, &facts, inp.now);
    let state = d.status.capacity_request.as_ref().map(|r| r.state);
    let open = matches!(
        state,
        Some(CapacityRequestState::Requested | CapacityRequestState::NotDelivered)
    );
    // The last apply failed (the CRD missing, a 403) and the plan still has
    // its slot: keep what was applied and try again, without deleting in
    // between. Closing here made the status alternate Failed/Requested and
    // the PodTemplates be applied and deleted on every reconcile, each write
    // waking the plan again: a hot loop for as long as the fault lasted.
    let retrying =
        state == Some(CapacityRequestState::Failed) && objects.is_some() && f.apply_error.is_some();
    match (open || retrying, objects, fingerprint) {
        (true, Some(objects), Some(fingerprint)) => Wanted::Open {
            fingerprint,
            objects,
        },
        _ => Wanted::Close,
    }
}

/// The objects of the plan's pending change.
fn build(
    inp: &Inputs<'_>,
    fingerprint: &str,
    r: &Request,
    limit_ranges: &[LimitRange],
) -> crate::Result<Vec<Objects>> {
    let change = inp
        .change
        .as_ref()
        .ok()
        .and_then(|c| c.as_ref())
        .ok_or_else(|| crate::Error::invalid("capacity request", "no pending change"))?;
    let settings = inp
        .settings
        .as_ref()
        .map_err(|e| crate::Error::invalid("capacity request", e.to_string()))?;
    let shapes = shapes::shapes(change.pods_to_fit(), &settings.headroom, limit_ranges)?;
    let PlanKey {
        namespace: ns,
        name,
    } = inp.key();
    let uid = inp
        .plan
        .metadata
        .uid
        .as_deref()
        .ok_or_else(|| crate::Error::invalid("capacity request", "the plan has no uid yet"))?;
    Ok(shapes::objects(
        Owner {
            namespace: &ns,
            name: &name,
            uid,
        },
        fingerprint,
        &r.strategy,
        &shapes,
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use jiff::Timestamp;
    use serde_json::json;

    use super::*;
    use crate::admission::fit::Alone;
    use crate::admission::ledger::tests::key;
    use crate::admission::{ChangeFacts, ServiceFacts, decide};
    use crate::capacity::{ClusterState, PodGroup};
    use crate::upgradeplan::{
        CapacityRequestMode, UpgradePlan, UpgradePlanSpec, UpgradePlanStatus,
    };

    const FP: &str = "07e0ddeed0e9";

    fn now() -> Timestamp {
        "2026-12-04T10:30:00Z".parse().unwrap()
    }

    /// `ml/<name>`, waiting for capacity since 10:<minute>.
    fn plan(name: &str, minute: u32) -> UpgradePlan {
        let spec: UpgradePlanSpec =
            serde_json::from_value(json!({"rayServiceRef": {"name": name}})).unwrap();
        let mut p = UpgradePlan::new(name, spec);
        p.metadata.namespace = Some("ml".into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p.metadata.generation = Some(1);
        p.status = Some(waiting_status(minute));
        p
    }

    /// Held for capacity since 10:<minute>.
    fn waiting_status(minute: u32) -> UpgradePlanStatus {
        let mut s = report::tests::waiting().status;
        if let Some(c) = s.pending_change.as_mut() {
            c.detected_time = format!("2026-12-04T10:{minute:02}:00Z").parse().unwrap();
        }
        s
    }

    /// The decision the rules made for `p`: held for capacity.
    fn held(p: &UpgradePlan) -> Decision {
        let mut d = report::tests::waiting();
        d.status = p.status.clone().unwrap();
        d
    }

    fn gpu_worker() -> PodGroup {
        PodGroup::from(
            serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(json!({
                "metadata": {"name": "llm-next-gpu-worker-0", "namespace": "ml",
                    "labels": {"ray.io/node-type": "worker", "ray.io/group": "gpu"}},
                "spec": {"containers": [{"name": "w", "resources": {
                    "requests": {"cpu": "1", "nvidia.com/gpu": "8"},
                    "limits": {"nvidia.com/gpu": "8"}}}]}
            }))
            .unwrap(),
        )
    }

    /// Requests on, at most `max_open` plans with buffers at once.
    fn facts(max_open: usize, others: Vec<QueueKey>, open: &[&str]) -> Facts {
        Facts {
            defaults: Defaults {
                enabled: true,
                mode: CapacityRequestMode::CapacityBuffer,
                max_open,
                ..Defaults::default()
            },
            others,
            open_now: open.iter().map(|n| PlanKey::new("ml", *n)).collect(),
            ..Facts::default()
        }
    }

    /// Settles `p`'s held decision with `f`.
    fn settled(p: &UpgradePlan, f: &Facts) -> (Decision, Wanted) {
        let state = ClusterState::default();
        let alone = Alone(&state);
        let mut inp = no_service(p, &alone);
        inp.service = Ok(ServiceFacts::default());
        inp.change = Ok(Some(ChangeFacts {
            fingerprint: FP.into(),
            triggering_paths: vec![],
            new_pods: vec![gpu_worker()],
            surge: None,
        }));
        inp.capacity_request = Some(f.clone());
        let mut d = held(p);
        let w = settle(&inp, f, &mut d);
        (d, w)
    }

    /// The inputs of `p` whose RayService is missing.
    fn no_service<'a>(p: &'a UpgradePlan, alone: &'a Alone<'a>) -> Inputs<'a> {
        crate::admission::objects::inputs(
            p,
            &Default::default(),
            &crate::kuberay::Release::assumed(crate::kuberay::KubeRayVersion::latest()),
            now(),
            false,
            alone,
            Err(crate::admission::ServiceError::NotFound {
                namespace: "ml".into(),
                name: "me".into(),
            }),
            &[],
            BTreeMap::new(),
        )
    }

    fn state(d: &Decision) -> Option<(CapacityRequestState, Option<u32>)> {
        d.status
            .capacity_request
            .as_ref()
            .map(|r| (r.state, r.queue_position))
    }

    #[test]
    fn an_open_slot_wants_the_objects_of_the_pending_change() {
        let me = plan("me", 5);
        let (mut d, w) = settled(&me, &facts(1, vec![], &[]));
        assert_eq!(state(&d), Some((CapacityRequestState::Requested, None)));
        // The request's gauge is read off the decision, as the others are.
        crate::admission::Observations::gauges(&mut d);
        assert!(
            matches!(d.observed.capacity_request, Some((_, false))),
            "{:?}",
            d.observed.capacity_request
        );
        let Wanted::Open {
            fingerprint,
            objects,
        } = w
        else {
            panic!("{w:?}")
        };
        assert_eq!(fingerprint, FP);
        assert!(!objects.is_empty());
        assert!(d.status.waiting_for.unwrap().ends_with("(requested)"));
    }

    /// Two plans waiting, one slot: the one waiting longer has it, the other
    /// queues first in line and wants no objects.
    #[test]
    fn the_last_slot_goes_to_the_plan_that_waited_longer() {
        let me = plan("me", 5);
        let earlier = key("earlier", 0, "2026-12-04T10:01:00Z");
        let (d, w) = settled(&me, &facts(1, vec![earlier], &[]));
        assert_eq!(state(&d), Some((CapacityRequestState::Queued, Some(1))));
        assert_eq!(w, Wanted::Close);
        // Waiting longer than the other, it takes the slot.
        let later = key("later", 0, "2026-12-04T10:09:00Z");
        let (d, w) = settled(&me, &facts(1, vec![later], &[]));
        assert_eq!(state(&d), Some((CapacityRequestState::Requested, None)));
        assert!(w.opens());
    }

    #[test]
    fn a_queued_plan_says_its_place_behind_the_open_ones() {
        let me = plan("me", 5);
        let others = vec![
            key("a", 0, "2026-12-04T10:01:00Z"),
            key("b", 0, "2026-12-04T10:02:00Z"),
            key("c", 0, "2026-12-04T10:03:00Z"),
            // Behind: waited less.
            key("d", 0, "2026-12-04T10:09:00Z"),
        ];
        let (d, w) = settled(&me, &facts(2, others, &[]));
        assert_eq!(state(&d), Some((CapacityRequestState::Queued, Some(2))));
        assert_eq!(w, Wanted::Close);
        assert!(
            d.status
                .waiting_for
                .unwrap()
                .ends_with("(request queued #2)"),
            "the place shows in the column"
        );
    }

    /// First in the queue, but the cap is taken by plans that still have
    /// buffers (one ahead before it was overtaken, still closing): it waits.
    #[test]
    fn the_cap_holds_while_other_plans_still_have_buffers() {
        let me = plan("me", 5);
        let (d, w) = settled(&me, &facts(1, vec![], &["closing"]));
        assert_eq!(state(&d), Some((CapacityRequestState::Queued, Some(1))));
        assert_eq!(w, Wanted::Close);
        // Its own buffers do not count against it.
        let (_, w) = settled(&me, &facts(1, vec![], &["me"]));
        assert!(w.opens());
    }

    /// The last apply failed (a 403, the CRD missing): the status says why,
    /// and the objects are still wanted, so they are applied again without
    /// being deleted in between.
    #[test]
    fn a_failed_apply_is_retried_without_closing() {
        let me = plan("me", 5);
        let mut f = facts(1, vec![], &["me"]);
        f.apply_error = Some("raygate may not write CapacityBuffers here".into());
        let (d, w) = settled(&me, &f);
        assert_eq!(state(&d), Some((CapacityRequestState::Failed, None)));
        assert!(w.opens(), "{w:?}");
        // Queued, a failed plan has nothing to retry.
        f.others = vec![key("earlier", 0, "2026-12-04T10:01:00Z")];
        f.open_now.clear();
        let (_, w) = settled(&me, &f);
        assert_eq!(w, Wanted::Close);
    }

    /// The controller's decision runs the same step: no capacity facts (the
    /// offline tools), no request status and no objects.
    #[test]
    fn decide_settles_the_request_only_with_capacity_facts() {
        let me = plan("me", 5);
        let (_, w) = settled(&me, &facts(1, vec![], &[]));
        assert!(w.opens());
        let state = ClusterState::default();
        let alone = Alone(&state);
        let f = facts(1, vec![], &[]);
        let mut inp = no_service(&me, &alone);
        let d = decide(&inp);
        assert_eq!(d.capacity_objects, Wanted::Close);
        inp.capacity_request = Some(f);
        // No RayService: nothing waits for capacity, nothing is asked.
        let d = decide(&inp);
        assert_eq!(d.capacity_objects, Wanted::Close);
        assert!(d.status.capacity_request.is_none());
    }
}
