//! Rule 2: an admitted (or unadmitted but running) transition, from the
//! admission to `Completed` or `Stalled`.

use super::*;

#[test]
fn admitted_keeps_the_gate_open_until_kuberay_names_the_cluster() {
    let ch = Ok(Some(change(vec![gpu_pod("w0", 8)])));
    // Restarted raygate sees the same objects: still admitted, no second admission.
    let d = Scenario::new()
        .status(admitted_status())
        .change_is(ch)
        .decide();
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::Admitted, Some(Gate::Open))
    );
    assert_eq!(d.outcome, None);
    assert!(d.events.is_empty());
}

#[test]
fn a_superseded_admission_is_withdrawn_and_reevaluated() {
    let mut ch = change(vec![gpu_pod("w0", 16)]);
    ch.fingerprint = "fffeeeddd000".into();
    let d = Scenario::new()
        .status(admitted_status())
        .change(ch)
        .decide();
    assert_eq!(d.status.phase, Phase::WaitingForCapacity);
    assert_eq!(d.gate, Some(Gate::Hold));
    assert!(d.status.admitted.is_none());
    assert!(d.events.iter().any(|e| e.reason == "AdmissionWithdrawn"));
}

#[test]
fn an_admission_kuberay_does_not_act_on_is_fitted_again() {
    let p = auto_plan(Some(admitted_status()));
    let later = now() + ADMISSION_TTL + Duration::from_secs(1);
    // Capacity is gone by now: the old admission must not keep the gate open.
    let d = Scenario::new()
        .plan(&p)
        .change(change(vec![gpu_pod("w0", 8)]))
        .capacity(&[4])
        .at(later)
        .decide();
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::WaitingForCapacity, Some(Gate::Hold))
    );
    assert!(d.status.admitted.is_none());
    assert!(d.events.iter().any(|e| e.reason == "AdmissionExpired"));
    // Within the bound it stays admitted.
    let d = Scenario::new()
        .plan(&p)
        .change(change(vec![gpu_pod("w0", 8)]))
        .capacity(&[4])
        .at(now() + Duration::from_secs(60))
        .decide();
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::Admitted, Some(Gate::Open))
    );
}

#[test]
fn an_admission_decided_again_on_its_own_status_is_the_same() {
    // The status an admission writes is what the next decision on the same
    // world writes: else every admission costs a second status write.
    let first = admitted_status();
    let d = Scenario::new()
        .status(first.clone())
        .change(change(vec![gpu_pod("w0", 8)]))
        .at(now() + jiff::SignedDuration::from_secs(1))
        .decide();
    assert_eq!(differing(&first, &d.status), Vec::<String>::new());
}

#[test]
fn a_pending_cluster_built_from_another_change_is_not_adopted() {
    let d = Scenario::new()
        .status(admitted_status())
        .upgrading("llm-a", "llm-b")
        .built_from(Some("0000other000"))
        .decide();
    assert_eq!(d.gate, Some(Gate::Hold));
    let adm = d.status.admitted.as_ref().unwrap();
    assert_eq!(adm.fingerprint, "0000other000", "tracked as what it is");
    assert_eq!(adm.to_cluster.as_deref(), Some("llm-b"));
    let ev = d
        .events
        .iter()
        .find(|e| e.reason == "AdmissionMismatch")
        .unwrap();
    assert!(ev.warning && ev.note.contains("abc123def456"), "{ev:?}");
}

#[test]
fn a_pending_cluster_not_yet_readable_is_adopted_only_once_checked() {
    let d = Scenario::new()
        .status(admitted_status())
        .upgrading("llm-a", "llm-b")
        .clusters(&["llm-a"])
        .built_from(None)
        .decide();
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::Upgrading, Some(Gate::Hold))
    );
    assert_eq!(d.status.admitted.as_ref().unwrap().to_cluster, None);
    let d = Scenario::new()
        .status(d.status)
        .upgrading("llm-a", "llm-b")
        .decide();
    let adm = d.status.admitted.as_ref().unwrap();
    assert_eq!(
        (adm.fingerprint.as_str(), adm.to_cluster.as_deref()),
        ("abc123def456", Some("llm-b"))
    );
    assert!(d.events.iter().all(|e| e.reason != "AdmissionMismatch"));
    // Upgrading is reported when the cluster is adopted, though the phase
    // already said Upgrading while it was checked.
    let upgrading: Vec<_> = d
        .events
        .iter()
        .filter(|e| e.reason == "Upgrading")
        .collect();
    assert_eq!(upgrading.len(), 1, "{:?}", d.events);
    assert_eq!(upgrading[0].change.as_deref(), Some("abc123def456"));
    let again = Scenario::new()
        .status(d.status)
        .upgrading("llm-a", "llm-b")
        .decide();
    assert!(again.events.is_empty(), "{:?}", again.events);
}

#[test]
fn once_the_new_cluster_is_named_the_gate_closes_and_the_transition_is_tracked() {
    let d = Scenario::new()
        .status(admitted_status())
        .upgrading("llm-a", "llm-b")
        .decide();
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::Upgrading, Some(Gate::Hold))
    );
    assert_eq!(
        d.status.admitted.as_ref().unwrap().to_cluster.as_deref(),
        Some("llm-b")
    );
    assert_eq!(d.status.pending_cluster.as_deref(), Some("llm-b"));
    assert!(d.events.iter().any(|e| e.reason == "Upgrading"));
    assert!(
        d.status
            .message
            .as_deref()
            .unwrap_or("")
            .contains("running since"),
        "{:?}",
        d.status.message
    );
    // Decided again later on the same world: nothing to write.
    for secs in [1, 90] {
        let again = Scenario::new()
            .status(d.status.clone())
            .upgrading("llm-a", "llm-b")
            .at(now() + jiff::SignedDuration::from_secs(secs))
            .decide();
        assert_eq!(differing(&d.status, &again.status), Vec::<String>::new());
    }
}

#[test]
fn a_transition_started_without_admission_is_tracked_and_reported() {
    let d = Scenario::new().upgrading("llm-a", "llm-b").decide();
    assert_eq!(d.status.phase, Phase::Upgrading);
    assert!(d.events.iter().any(|e| e.reason == "UnadmittedUpgrade"));
}

#[test]
fn unschedulable_new_pods_stall_the_transition() {
    let mut st = admitted_status();
    st.phase = Phase::Upgrading;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "llm-b-gpu-worker-x"},
        "spec": {"containers": [{"name": "w"}]},
        "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]}
    }))
    .unwrap();
    let pods = BTreeMap::from([("llm-b".to_string(), vec![Arc::new(pod) as PodRef])]);
    let d = Scenario::new()
        .status(st)
        .upgrading("llm-a", "llm-b")
        .pods(pods)
        .decide();
    assert_eq!(d.status.phase, Phase::Stalled);
    assert_eq!(d.gate, Some(Gate::Hold));
    let c = cond(&d.status, "Stalled");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "Unschedulable")
    );
    assert_eq!(c.message, "1 pod Insufficient nvidia.com/gpu");
    assert_eq!(d.observed.unschedulable_pods, 1);
    // Tracking fits nothing: no free capacity is reported as current.
    assert!(d.observed.free.is_empty() && d.observed.shortfall.is_empty());
    // The cluster is recorded by this decision: Upgrading, then Stalled.
    let reasons: Vec<&str> = d.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Upgrading", "Stalled"]);
}

#[test]
fn a_stall_keeps_the_gate_closed_and_says_how_to_cancel() {
    let mut st = admitted_status();
    st.phase = Phase::Upgrading;
    let p = plan(
        json!({"rayServiceRef": {"name": "llm"}, "stallAfter": "30m"}),
        Some(st),
    );
    let mut svc = service("llm-a", Some("llm-b")).unwrap();
    svc.pending_apps = BTreeMap::from([("llm".to_string(), "DEPLOY_FAILED".to_string())]);
    let d = Scenario::new()
        .plan(&p)
        .service(Ok(svc))
        .clusters(&["llm-a", "llm-b"])
        .decide();
    assert_eq!((d.status.phase, d.gate), (Phase::Stalled, Some(Gate::Hold)));
    let msg = d.status.message.as_deref().unwrap();
    assert!(
        msg.starts_with("ServeNotHealthy: app llm DEPLOY_FAILED"),
        "{msg}"
    );
    assert!(msg.contains("revert spec.rayClusterConfig"), "{msg}");
}

#[test]
fn completed_only_when_the_old_cluster_and_its_pods_are_gone() {
    let mut st = admitted_status();
    st.phase = Phase::Upgrading;
    st.admitted.as_mut().unwrap().to_cluster = Some("llm-b".into());
    let p = auto_plan(Some(st));
    // Promoted, but the old cluster still exists (rayClusterDeletionDelaySeconds).
    let d = Scenario::new()
        .plan(&p)
        .serving("llm-b")
        .clusters(&["llm-a", "llm-b"])
        .decide();
    assert_eq!(d.status.phase, Phase::Upgrading);
    assert_eq!(
        d.status.waiting_for.as_deref(),
        Some("old cluster deletion")
    );

    let later: Timestamp = "2026-12-02T12:05:00Z".parse().unwrap();
    let d = Scenario::new().plan(&p).serving("llm-b").at(later).decide();
    assert_eq!(d.status.phase, Phase::Completed);
    assert!(d.status.admitted.is_none());
    let t = d.status.last_transition.as_ref().unwrap();
    assert_eq!(
        (t.outcome, t.duration_seconds),
        (Some(TransitionOutcome::Completed), Some(300))
    );
    assert_eq!(d.outcome, Some(Outcome::Completed));

    // The next reconcile keeps showing Completed while nothing else changes.
    let d2 = Scenario::new()
        .status(d.status.clone())
        .serving("llm-b")
        .at(later)
        .decide();
    assert_eq!(d2.status.phase, Phase::Completed);
    assert!(d2.events.is_empty());
    // And writes nothing more: the completing decision's status is the
    // next one's (one status write per completion, not two).
    assert_eq!(differing(&d.status, &d2.status), Vec::<String>::new());
}
