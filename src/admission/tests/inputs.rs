//! Rule 1: a plan or RayService that cannot be read, the KubeRay release
//! whose rules apply, a RayService with no cluster yet or recreated under
//! the same name.

use super::*;

#[test]
fn missing_rayservice_is_an_error_and_leaves_the_gate_alone() {
    let d = Scenario::new().missing().decide();
    assert_eq!(d.status.phase, Phase::Error);
    assert_eq!(
        d.status.message.as_deref(),
        Some("RayService ml/llm not found")
    );
    assert_eq!(d.gate, None);
    assert_eq!(cond(&d.status, "Ready").status, "False");
    assert_eq!(d.events[0].reason, "RayServiceUnavailable");
}

#[test]
fn a_bad_spec_and_a_missing_rayservice_are_both_reported_and_nothing_is_written() {
    let d = Scenario::new()
        .spec(json!({"rayServiceRef": {"name": "llm"},
               "maintenanceWindows": [{"schedule": "61 * * * *", "duration": "1h"}]}))
        .missing()
        .decide();
    assert_eq!(d.status.phase, Phase::Error);
    assert_eq!(d.gate, None, "a missing RayService is never written");
    assert_eq!(
        d.status.waiting_for.as_deref(),
        Some("InvalidSpec, RayServiceUnavailable")
    );
    let msg = d.status.message.as_deref().unwrap_or_default();
    assert!(
        msg.starts_with("InvalidSpec: spec.maintenanceWindows[0]")
            && msg.contains("; RayServiceUnavailable: RayService ml/llm not found"),
        "{msg}"
    );
    let ready = cond(&d.status, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.message.as_str()),
        ("False", msg)
    );
    let reasons: Vec<&str> = d.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["InvalidSpec", "RayServiceUnavailable"]);

    // Once the RayService exists, the bad spec alone remains, already reported.
    let d = Scenario::new()
        .spec(json!({"rayServiceRef": {"name": "llm"},
                   "maintenanceWindows": [{"schedule": "61 * * * *", "duration": "1h"}]}))
        .status(d.status)
        .decide();
    assert_eq!((d.status.phase, d.gate), (Phase::Error, Some(Gate::Hold)));
    assert_eq!(d.status.waiting_for.as_deref(), Some("InvalidSpec"));
    assert!(d.events.is_empty(), "{:?}", d.events);
}

#[test]
fn invalid_spec_is_an_error_that_keeps_holding() {
    let d = Scenario::new()
        .spec(json!({"rayServiceRef": {"name": "llm"}, "headroom": {"nvidia.com/gpu": "two"}}))
        .clusters(&[])
        .decide();
    assert_eq!(d.status.phase, Phase::Error);
    assert!(
        d.status
            .message
            .as_deref()
            .unwrap()
            .contains("spec.headroom[nvidia.com/gpu]"),
        "{:?}",
        d.status.message
    );
    assert_eq!(d.gate, Some(Gate::Hold));
}

#[test]
fn no_active_cluster_yet_is_pending_with_the_gate_held() {
    let svc = Ok(ServiceFacts::default());
    let d = Scenario::new().service(svc).decide();
    assert_eq!(d.status.phase, Phase::Pending);
    assert_eq!(d.status.waiting_for.as_deref(), Some("first cluster"));
    assert_eq!(d.gate, Some(Gate::Hold));
}

#[test]
fn a_rayservice_refused_whole_is_an_error_before_its_first_cluster() {
    let svc = Ok(ServiceFacts::default());
    let e = super::ChangeError::OverBudget {
        kind: "RayService",
        name: "svc".into(),
        error: crate::kuberay::over_budget::OverBudget {
            path: "spec.rayClusterConfig.workerGroupSpecs".into(),
            bound: crate::kuberay::over_budget::Bound::WorkerGroups,
            found: 5000,
        },
    };
    let msg = e.to_string();
    assert!(
        msg.starts_with(
            "RayService svc: spec.rayClusterConfig.workerGroupSpecs: 5000 worker groups"
        ),
        "{msg}"
    );
    let d = Scenario::new().service(svc).change_is(Err(e)).decide();
    assert_eq!(d.status.phase, Phase::Error);
    assert_eq!(d.status.waiting_for.as_deref(), Some("InvalidRayService"));
    assert_eq!(d.status.message.as_deref(), Some(msg.as_str()));
    assert_eq!(d.gate, Some(Gate::Hold));
}

#[test]
fn the_release_applied_is_recorded_and_a_disagreeing_flag_reported_once() {
    use crate::kuberay::{KubeRayVersion, Releases};
    let flag = KubeRayVersion::parse("1.7").ok();
    let release = Releases::from_stamps([("ml", "v1.6.2")], flag).for_namespace("ml");
    let d = Scenario::new()
        .change(change(vec![gpu_pod("w0", 8)]))
        .capacity(&[8, 8])
        .release(release.clone())
        .decide();
    // The decision goes on with the stamped release: the upgrade is admitted.
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::Admitted, Some(Gate::Open))
    );
    let r = d.status.kube_ray_release.as_ref().unwrap();
    assert_eq!(
        (r.version.as_str(), r.source.as_str()),
        ("v1.6.2", "RayCluster")
    );
    let c = cond(&d.status, "KubeRayRelease");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "FlagMismatch")
    );
    let warned: Vec<_> = d
        .events
        .iter()
        .filter(|e| e.reason == "KubeRayReleaseMismatch")
        .collect();
    assert_eq!(warned.len(), 1, "{:?}", d.events);
    assert!(warned[0].warning);
    // Already reported: the next decision keeps the condition without a new Event.
    let again = Scenario::new()
        .status(d.status.clone())
        .change(change(vec![gpu_pod("w0", 8)]))
        .capacity(&[8, 8])
        .release(release)
        .decide();
    assert!(
        again
            .events
            .iter()
            .all(|e| e.reason != "KubeRayReleaseMismatch"),
        "{:?}",
        again.events
    );
    assert_eq!(cond(&again.status, "KubeRayRelease").reason, "FlagMismatch");

    // Agreeing stamps: True, no Event.
    let ok = Releases::from_stamps([("ml", "v1.6.2")], None).for_namespace("ml");
    let d = Scenario::new()
        .change(change(vec![gpu_pod("w0", 8)]))
        .capacity(&[8, 8])
        .release(ok)
        .decide();
    let c = cond(&d.status, "KubeRayRelease");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Stamped"));
    assert!(c.message.contains("v1.6.2's rules apply"), "{}", c.message);
}

#[test]
fn a_kuberay_without_the_gate_field_is_an_error_and_the_gate_is_left_alone() {
    use crate::kuberay::Releases;
    let old = Releases::from_stamps([("ml", "v1.2.2")], None).for_namespace("ml");
    let d = Scenario::new()
        .change(change(vec![gpu_pod("w0", 8)]))
        .capacity(&[8, 8])
        .release(old)
        .decide();
    assert_eq!(d.status.phase, Phase::Error);
    assert_eq!(d.gate, None, "the field does not exist in this release");
    assert_eq!(d.status.waiting_for.as_deref(), Some("KubeRayNotGateable"));
    let c = cond(&d.status, "KubeRayRelease");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NotGateable")
    );
}

/// The same name, another object: [`service`] recreated (issue 26).
fn recreated(active: &str, pending: Option<&str>) -> Result<ServiceFacts, ServiceError> {
    let mut s = service(active, pending)?;
    s.uid = Some("51e0-second".into());
    Ok(s)
}

#[test]
fn the_rayservice_uid_is_recorded() {
    let st = admitted_status();
    assert_eq!(st.ray_service_uid.as_deref(), Some(SERVICE_UID));
    // The priority it is ranked by, for `kubectl raygate queue`.
    assert_eq!(st.effective_priority, Some(0));
    // Kept while the RayService cannot be read (deleted, not yet recreated).
    let d = Scenario::new().status(st).missing().decide();
    assert_eq!(d.status.ray_service_uid.as_deref(), Some(SERVICE_UID));
    assert!(d.status.admitted.is_some());
}

#[test]
fn a_recreated_rayservice_never_completes_the_old_change() {
    // Under way: the old RayService's new cluster llm-b exists.
    let mut st = admitted_status();
    st.phase = Phase::Upgrading;
    st.admitted.as_mut().unwrap().to_cluster = Some("llm-b".into());
    // Deleted and recreated with the same name: its first cluster llm-c is
    // active, the old clusters are gone (or not its own).
    let later: Timestamp = "2026-12-02T12:05:00Z".parse().unwrap();
    let d = Scenario::new()
        .status(st)
        .service(recreated("llm-c", None))
        .at(later)
        .decide();
    assert_eq!(d.status.phase, Phase::Idle, "{:?}", d.status.message);
    assert!(d.status.admitted.is_none());
    assert_ne!(d.outcome, Some(Outcome::Completed));
    let t = d.status.last_transition.as_ref().unwrap();
    assert_eq!(
        (t.fingerprint.as_str(), t.outcome),
        ("abc123def456", Some(TransitionOutcome::Replaced))
    );
    assert_eq!(d.status.ray_service_uid.as_deref(), Some("51e0-second"));
    let reasons: Vec<_> = d.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["RayServiceReplaced"], "{:?}", d.events);
    assert!(
        d.events[0].note.contains("abc123def456"),
        "{}",
        d.events[0].note
    );
    assert_eq!(d.gate, Some(Gate::Hold));

    // The next reconcile: the new RayService is idle, nothing more reported.
    let d2 = Scenario::new()
        .status(d.status.clone())
        .service(recreated("llm-c", None))
        .at(later)
        .decide();
    assert_eq!(d2.status.phase, Phase::Idle);
    assert!(d2.events.is_empty(), "{:?}", d2.events);
}

#[test]
fn a_recreated_rayservice_starts_afresh() {
    // Waiting since 12:00 for the old RayService's change.
    let ch = change(vec![gpu_pod("w0", 8)]);
    let waiting = Scenario::new()
        .change(ch.clone())
        .capacity(&[0])
        .decide()
        .status;
    assert_eq!(waiting.phase, Phase::WaitingForCapacity);
    // Recreated with a change of the same fingerprint: it is a new change,
    // detected now, and the old admission is not carried over.
    let later: Timestamp = "2026-12-02T12:05:00Z".parse().unwrap();
    let still = Scenario::new()
        .status(waiting.clone())
        .service(recreated("llm-c", None))
        .change(ch.clone())
        .capacity(&[0])
        .at(later)
        .decide();
    assert_eq!(
        still.status.pending_change.as_ref().unwrap().detected_time,
        later
    );
    let d = Scenario::new()
        .status(waiting)
        .service(recreated("llm-c", None))
        .change(ch.clone())
        .at(later)
        .decide();
    assert_eq!(d.status.phase, Phase::Admitted);
    assert_eq!(d.status.admitted.as_ref().unwrap().admitted_time, later);
    assert_eq!(
        d.status.admitted.as_ref().unwrap().from_cluster.as_deref(),
        Some("llm-c")
    );
    assert!(d.status.last_transition.is_none());

    // Admitted for the old RayService, recreated before KubeRay acted: the
    // admission is not the new one's (its gate opens only by its own fit).
    let d = Scenario::new()
        .status(admitted_status())
        .service(recreated("llm-c", None))
        .change(ch)
        .capacity(&[0])
        .at(later)
        .decide();
    assert_eq!(d.status.phase, Phase::WaitingForCapacity);
    assert_eq!(d.gate, Some(Gate::Hold));
    assert_eq!(
        d.status.last_transition.as_ref().unwrap().outcome,
        Some(TransitionOutcome::Replaced)
    );

    // A status written before raygate recorded UIDs is not a replacement.
    let mut legacy = admitted_status();
    legacy.ray_service_uid = None;
    let d = Scenario::new()
        .status(legacy)
        .service(recreated("llm-a", None))
        .change(change(vec![gpu_pod("w0", 8)]))
        .decide();
    assert_eq!(d.status.phase, Phase::Admitted);
    assert!(d.events.is_empty(), "{:?}", d.events);
}
