//! What a recorded decision tells the world: Events and metrics.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::Context;
use super::record::Recorded;
use crate::admission::{self, Decision, Outcome};
use crate::metrics::PlanObservation;
use crate::upgradeplan::{Phase, UpgradePlan};

/// Events and metrics of a recorded decision.
pub(super) async fn report(ctx: &Context, r: &Recorded, now: Timestamp) {
    let (d, plan, prev) = (&r.decision, &r.plan, &r.prev);
    let service = plan.spec.ray_service_ref.name.as_str();
    if d.observed.newly_overridden {
        ctx.metrics
            .gate_override(&plan.namespace().unwrap_or_default(), &plan.name_any());
    }
    if d.observed.recreations_avoided > 0 {
        ctx.metrics.recreations_avoided(
            &plan.namespace().unwrap_or_default(),
            d.observed.recreations_avoided,
        );
    }
    for ev in &d.events {
        publish(ctx, plan, Some(service), ev).await;
    }
    if let Some(outcome) = d.outcome
        && (d.status.phase != prev.phase || outcome == Outcome::Admitted)
    {
        ctx.metrics.admission(outcome);
    }
    observe_metrics(ctx, plan, service, d, now);
    let open = d
        .observed
        .capacity_request
        .map(|(since, overdue)| (seconds_since(since, now), overdue));
    ctx.metrics.observe_capacity_request(
        &plan.namespace().unwrap_or_default(),
        &plan.name_any(),
        open,
    );
}

/// The `GateReleased` Event of a plan whose gate went back (`note` says
/// which RayService and why), about the plan alone.
pub(super) async fn gate_released(ctx: &Context, plan: &UpgradePlan, note: String) {
    let note = admission::EventNote {
        warning: false,
        reason: admission::EventReason::GateReleased,
        note,
        change: None,
    };
    publish(ctx, plan, None, &note).await;
}

/// Each decision's Event, twice: regarding the plan (its RayService as
/// `related`), for `kubectl describe upgradeplan`, and regarding the RayService
/// (the plan as `related`), for `kubectl describe rayservice`, where a user
/// looks first when an upgrade does not happen (issue 32: raygate was
/// invisible there; `describe` lists only Events *regarding* the object).
/// Queued, not awaited ([`super::events`]): in a burst they trail the status
/// and gate writes instead of competing with them in the apiserver.
pub(super) async fn publish(
    ctx: &Context,
    plan: &UpgradePlan,
    service: Option<&str>,
    note: &admission::EventNote,
) {
    let ns = plan.namespace().unwrap_or_default();
    let related = service.and_then(|svc_name| {
        let svc = ctx
            .stores
            .services
            .get(&ObjectRef::new(svc_name).within(&ns))?;
        svc.0.as_ref().ok().map(|svc| svc.object_ref(&()))
    });
    if ctx.fence.check().is_err() {
        return;
    }
    let plan_ref = plan.object_ref(&());
    let event = |secondary: Option<ObjectReference>| Event {
        type_: if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: note.reason.as_str().to_string(),
        note: Some(truncate(note.note.clone(), 1000)),
        action: note.action(),
        secondary,
    };
    ctx.events.send(event(related.clone()), plan_ref.clone());
    if let Some(svc) = related {
        ctx.events.send(event(Some(plan_ref)), svc);
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

fn seconds_since(t: Timestamp, now: Timestamp) -> f64 {
    now.duration_since(t).as_secs_f64().max(0.0)
}

fn observe_metrics(ctx: &Context, plan: &UpgradePlan, svc: &str, d: &Decision, now: Timestamp) {
    // What the decision observed (`Decision::observed`), never the status
    // read again.
    let o = &d.observed;
    let none = std::collections::BTreeMap::new();
    ctx.metrics.observe_plan(&PlanObservation {
        namespace: &plan.namespace().unwrap_or_default(),
        plan: &plan.name_any(),
        rayservice: svc,
        phase: o.phase,
        waiting_seconds: o.waiting_since.map(|t| seconds_since(t, now)),
        transition_seconds: o.transition_since.map(|t| seconds_since(t, now)),
        stalled: o.phase == Phase::Stalled,
        gate_overridden: o.gate_overridden,
        shortfall: o.capacity_shortfall().unwrap_or(&none),
        pods_pending_unschedulable: o.unschedulable_pods,
        kuberay_release_mismatch: o.kuberay_release_mismatch,
    });
    // Only from a fit made now: a status carried over from an earlier
    // decision would export stale free capacity as current.
    if !o.free.is_empty() {
        ctx.metrics.set_cluster_free(&o.free);
    }
}
