//! Which plan governs which RayService, and which gates must be given back.
//!
//! One plan per RayService: when several reference the same one, the oldest
//! (creation time, then name) governs and the others are reported as a
//! `Conflict` and never touch the gate. A plan gives a gate back only when no
//! other plan governs that RayService: all plans write the gate with the same
//! field manager, so a release by one would undo another's hold.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;

use crate::upgradeplan::condition::{self, Reason, Status};
use crate::upgradeplan::{Phase, UpgradePlan, UpgradePlanStatus};

fn key(p: &UpgradePlan) -> (Option<jiff::Timestamp>, String) {
    (
        p.metadata.creation_timestamp.as_ref().map(|t| t.0),
        p.name_any(),
    )
}

/// The plan that governs `ns/svc` among `plans`, leaving out `except`.
pub fn governor<'a>(
    plans: &'a [Arc<UpgradePlan>],
    ns: &str,
    svc: &str,
    except: Option<&UpgradePlan>,
) -> Option<&'a UpgradePlan> {
    plans
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| p.namespace().as_deref() == Some(ns) && p.spec.ray_service_ref.name == svc)
        .filter(|p| except.is_none_or(|e| !same(p, e)))
        .min_by(|a, b| key(a).cmp(&key(b)))
}

fn same(a: &UpgradePlan, b: &UpgradePlan) -> bool {
    a.namespace() == b.namespace() && a.name_any() == b.name_any()
}

/// `Some(governing plan's name)` when another plan governs `me`'s RayService.
pub fn conflict_with(plans: &[Arc<UpgradePlan>], me: &UpgradePlan) -> Option<String> {
    let ns = me.namespace().unwrap_or_default();
    let g = governor(plans, &ns, &me.spec.ray_service_ref.name, None)?;
    (!same(g, me)).then(|| g.name_any())
}

/// The RayService whose gate `me` recorded but no longer references (its
/// reference was edited): given back before the plan does anything else.
pub fn recorded_elsewhere(me: &UpgradePlan) -> Option<String> {
    me.status
        .as_ref()
        .and_then(|s| s.ray_service.clone())
        .filter(|r| *r != me.spec.ray_service_ref.name)
}

/// The gate `me` holds and must give back when it stops governing: the
/// recorded RayService, or (status not written yet, or written by an older
/// raygate) the referenced one if `me` governs it. `None` when another plan
/// governs it now.
pub fn gate_to_release(plans: &[Arc<UpgradePlan>], me: &UpgradePlan) -> Option<String> {
    let ns = me.namespace().unwrap_or_default();
    let recorded = me.status.as_ref().and_then(|s| s.ray_service.clone());
    let target = match recorded {
        Some(r) => r,
        None if conflict_with(plans, me).is_none() => me.spec.ray_service_ref.name.clone(),
        None => return None,
    };
    governor(plans, &ns, &target, Some(me))
        .is_none()
        .then_some(target)
}

/// Whether any plan in `plans` governs `ns/svc`.
pub fn governed(plans: &[Arc<UpgradePlan>], ns: &str, svc: &str) -> bool {
    governor(plans, ns, svc, None).is_some()
}

/// The status of a plan that does not govern its RayService.
pub fn conflict_status(
    me: &UpgradePlan,
    governor: &str,
    now: jiff::Timestamp,
) -> UpgradePlanStatus {
    let prev = me.status.clone().unwrap_or_default();
    let svc = &me.spec.ray_service_ref.name;
    let message = format!(
        "RayService {svc} is gated by UpgradePlan {governor}, the oldest plan for it; \
         this plan does not touch the gate. Delete this plan, or {governor} to hand over"
    );
    // Only a Conflict keeps its transition time: the condition is the same.
    let kept: Vec<Condition> = prev
        .conditions
        .into_iter()
        .filter(|c| c.reason == Reason::Conflict.as_str())
        .collect();
    let ready = condition::make(
        &kept,
        condition::READY,
        Status::False,
        Reason::Conflict,
        message.clone(),
        me.metadata.generation,
        now,
    );
    UpgradePlanStatus {
        phase: Phase::Error,
        observed_generation: me.metadata.generation,
        conditions: vec![ready],
        waiting_for: Some(Reason::Conflict.as_str().into()),
        message: Some(message),
        ..Default::default()
    }
}

/// The status of a plan that just gave back the gate of a RayService it no
/// longer references: a fresh start for the one it references now.
pub fn handed_over_status(me: &UpgradePlan, released: &str) -> UpgradePlanStatus {
    UpgradePlanStatus {
        phase: Phase::Pending,
        observed_generation: me.metadata.generation,
        message: Some(format!(
            "gave back the gate of RayService {released}; now gating {}",
            me.spec.ray_service_ref.name
        )),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(name: &str, svc: &str, created: &str, recorded: Option<&str>) -> Arc<UpgradePlan> {
        let mut p: UpgradePlan = serde_json::from_value(json!({
            "apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
            "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
            "spec": {"rayServiceRef": {"name": svc}}
        }))
        .unwrap();
        p.status = recorded.map(|r| UpgradePlanStatus {
            ray_service: Some(r.into()),
            ..Default::default()
        });
        Arc::new(p)
    }

    #[test]
    fn the_oldest_plan_governs_and_the_others_are_in_conflict() {
        let plans = vec![
            plan("b-auto", "llm", "2026-01-02T00:00:00Z", None),
            plan("a-paused", "llm", "2026-01-01T00:00:00Z", Some("llm")),
            plan("c-same-time", "llm", "2026-01-01T00:00:00Z", None),
        ];
        assert_eq!(conflict_with(&plans, &plans[1]), None);
        assert_eq!(
            conflict_with(&plans, &plans[0]).as_deref(),
            Some("a-paused")
        );
        assert_eq!(
            conflict_with(&plans, &plans[2]).as_deref(),
            Some("a-paused")
        );
        let st = conflict_status(&plans[0], "a-paused", jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(st.phase, Phase::Error);
        assert_eq!(st.conditions[0].reason, "Conflict");
        assert!(st.message.unwrap().contains("UpgradePlan a-paused"));
        assert_eq!(st.ray_service, None, "a loser records no gate");
    }

    #[test]
    fn deleting_a_losing_plan_never_releases_the_governors_gate() {
        let plans = vec![
            plan("old", "llm", "2026-01-01T00:00:00Z", Some("llm")),
            plan("new", "llm", "2026-01-02T00:00:00Z", None),
        ];
        assert_eq!(gate_to_release(&plans, &plans[1]), None);
        assert_eq!(gate_to_release(&plans, &plans[0]), None, "new takes over");
        let alone = vec![plans[0].clone()];
        assert_eq!(gate_to_release(&alone, &alone[0]).as_deref(), Some("llm"));
    }

    #[test]
    fn an_edited_reference_gives_the_recorded_gate_back() {
        let p = plan("p", "chat", "2026-01-01T00:00:00Z", Some("llm"));
        assert_eq!(recorded_elsewhere(&p).as_deref(), Some("llm"));
        assert_eq!(
            gate_to_release(std::slice::from_ref(&p), &p).as_deref(),
            Some("llm")
        );
        // ...unless another plan governs llm now.
        let other = plan("q", "llm", "2026-01-03T00:00:00Z", None);
        assert_eq!(gate_to_release(&[p.clone(), other.clone()], &p), None);
        assert!(governed(&[other], "ml", "llm"));
        assert!(!governed(std::slice::from_ref(&p), "ml", "llm"));
        assert_eq!(
            recorded_elsewhere(&plan("p", "llm", "2026-01-01T00:00:00Z", Some("llm"))),
            None
        );
        let st = handed_over_status(&p, "llm");
        assert_eq!((st.phase, st.admitted), (Phase::Pending, None));
    }
}
