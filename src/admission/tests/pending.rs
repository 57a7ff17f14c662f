//! Rule 4: a pending change waits for policy, approval, the window, then
//! capacity, and is admitted once nothing holds it.

use super::*;

#[test]
fn nothing_pending_is_idle_with_the_gate_held() {
    let d = Scenario::new().decide();
    assert_eq!(d.status.phase, Phase::Idle);
    assert_eq!(d.gate, Some(Gate::Hold));
    assert_eq!(d.status.active_cluster.as_deref(), Some("llm-a"));
    assert_eq!(cond(&d.status, "Ready").status, "True");
}

#[test]
fn an_upgrade_that_fits_is_admitted_and_opens_the_gate() {
    let ch = change(vec![gpu_pod("w0", 8), gpu_pod("w1", 8)]);
    let d = Scenario::new().change(ch).capacity(&[8, 8]).decide();
    assert_eq!(d.status.phase, Phase::Admitted);
    assert_eq!(d.gate, Some(Gate::Open));
    assert_eq!(d.outcome, Some(Outcome::Admitted));
    let adm = d.status.admitted.as_ref().unwrap();
    assert_eq!(adm.fingerprint, "abc123def456");
    assert_eq!(adm.from_cluster.as_deref(), Some("llm-a"));
    assert_eq!(cond(&d.status, "UpgradeAdmitted").status, "True");
    assert_eq!(d.events.last().unwrap().reason, "Admitted");
}

#[test]
fn an_upgrade_that_does_not_fit_waits_with_the_exact_shortfall() {
    let ch = change((0..4).map(|i| gpu_pod(&format!("w{i}"), 4)).collect());
    let d = Scenario::new().change(ch).decide();
    assert_eq!(d.status.phase, Phase::WaitingForCapacity);
    assert_eq!(d.gate, Some(Gate::Hold));
    let cap = d.status.capacity.as_ref().unwrap();
    assert_eq!(
        cap.shortfall.get("nvidia.com/gpu").map(String::as_str),
        Some("8")
    );
    // The columns compare: needed − free = short.
    assert_eq!(cap.gpus_needed.as_deref(), Some("16"));
    assert_eq!(cap.gpus_free.as_deref(), Some("8"));
    assert_eq!(cap.gpus_short.as_deref(), Some("8"));
    assert_eq!(cap.gpus_peak.as_deref(), Some("16"));
    // The same numbers for the gauges, typed: nothing parses the status back.
    assert_eq!(d.observed.shortfall.get("nvidia.com/gpu"), Some(&8.0));
    assert_eq!(d.observed.free.get("nvidia.com/gpu"), Some(&8.0));
    assert_eq!(cap.cpu_needed.as_deref(), Some("16"));
    assert_eq!(cap.cpu_short.as_deref(), Some("0"));
    assert_eq!(cap.needed.get("memory").map(String::as_str), Some("64Gi"));
    assert_eq!(
        d.status.waiting_for.as_deref(),
        Some("capacity: nvidia.com/gpu 8")
    );
    assert_eq!(cond(&d.status, "CapacityAvailable").status, "False");
    assert_eq!(
        d.status.pending_change.as_ref().unwrap().detected_time,
        now()
    );
    assert_eq!(d.events[0].reason, "WaitingForCapacity");

    // Waiting time counts from first detection, and the event is not repeated.
    let later: Timestamp = "2026-12-02T12:10:00Z".parse().unwrap();
    let ch = change((0..4).map(|i| gpu_pod(&format!("w{i}"), 4)).collect());
    let d2 = Scenario::new()
        .status(d.status.clone())
        .change(ch)
        .at(later)
        .decide();
    assert_eq!(
        d2.status.pending_change.as_ref().unwrap().detected_time,
        now()
    );
    assert!(d2.events.is_empty());
    assert_eq!(
        cond(&d2.status, "CapacityAvailable").last_transition_time,
        cond(&d.status, "CapacityAvailable").last_transition_time
    );
}

#[test]
fn fragmentation_waits_even_without_a_total_shortfall() {
    let ch = change(vec![gpu_pod("big", 16)]);
    let d = Scenario::new().change(ch).capacity(&[8, 8]).decide();
    assert_eq!(d.status.phase, Phase::WaitingForCapacity);
    assert_eq!(
        d.status.waiting_for.as_deref(),
        Some("capacity (fragmented)")
    );
}

#[test]
fn headroom_is_kept_free() {
    let ch = change(vec![gpu_pod("w0", 8)]);
    let d = Scenario::new()
        .spec(json!({"rayServiceRef": {"name": "llm"}, "headroom": {"nvidia.com/gpu": "2"}}))
        .change(ch)
        .capacity(&[8, 1])
        .decide();
    assert_eq!(d.status.phase, Phase::WaitingForCapacity);
    // FREE is what is left for the new cluster once the headroom is kept.
    let cap = d.status.capacity.as_ref().unwrap();
    assert_eq!(
        (
            cap.gpus_needed.as_deref(),
            cap.gpus_free.as_deref(),
            cap.gpus_short.as_deref()
        ),
        (Some("8"), Some("7"), Some("1"))
    );
    assert_eq!(
        cap.free.get("nvidia.com/gpu").map(String::as_str),
        Some("9")
    );
}

/// `headroom: {gpu: 2}` (no node offers `gpu`) held an upgrade forever with
/// nothing but "short by gpu 2": the name is reported once, the decision kept.
#[test]
fn a_resource_no_node_offers_is_reported_once() {
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 8)])));
    let d = Scenario::new()
        .spec(json!({"rayServiceRef": {"name": "llm"}, "headroom": {"gpu": "2"}}))
        .change_is(ch())
        .capacity(&[8, 8])
        .decide();
    assert_eq!(d.status.phase, Phase::WaitingForCapacity, "still held");
    let c = cond(&d.status, "ResourcesOffered");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NotOffered")
    );
    assert!(
        c.message
            .starts_with("spec.headroom names gpu that no schedulable node offers"),
        "{}",
        c.message
    );
    assert!(
        c.message
            .ends_with("(schedulable nodes offer: cpu, memory, nvidia.com/gpu, pods)"),
        "{}",
        c.message
    );
    let warned: Vec<_> = d
        .events
        .iter()
        .filter(|e| e.reason == "ResourceNotOffered")
        .collect();
    assert_eq!(warned.len(), 1, "{:?}", d.events);
    assert!(warned[0].warning);
    // Next decision: same names, no second Event.
    let again = plan(
        json!({"rayServiceRef": {"name": "llm"}, "headroom": {"gpu": "2"}}),
        Some(d.status.clone()),
    );
    let d2 = Scenario::new()
        .plan(&again)
        .change_is(ch())
        .capacity(&[8, 8])
        .decide();
    assert!(d2.events.iter().all(|e| e.reason != "ResourceNotOffered"));
    assert_eq!(cond(&d2.status, "ResourcesOffered").status, "False");

    // The new cluster requesting what no node has (CPU-only nodes) is said too.
    let d = Scenario::new().change_is(ch()).capacity(&[0]).decide();
    let c = cond(&d.status, "ResourcesOffered");
    assert!(
        c.message
            .starts_with("the new cluster requests nvidia.com/gpu that no schedulable node offers"),
        "{}",
        c.message
    );

    // A correct headroom: True, and no Event.
    let ok = plan(
        json!({"rayServiceRef": {"name": "llm"}, "headroom": {"nvidia.com/gpu": 2}}),
        None,
    );
    let d = Scenario::new()
        .plan(&ok)
        .change_is(ch())
        .capacity(&[8, 8])
        .decide();
    assert_eq!(d.status.phase, Phase::Admitted);
    assert_eq!(cond(&d.status, "ResourcesOffered").status, "True");
    assert!(d.events.iter().all(|e| e.reason != "ResourceNotOffered"));
}

#[test]
fn paused_and_manual_policies_wait_for_approval() {
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 1)])));
    let d = Scenario::new()
        .spec(json!({"rayServiceRef": {"name": "llm"}, "policy": "Paused"}))
        .change_is(ch())
        .decide();
    assert_eq!((d.status.phase, d.gate), (Phase::Paused, Some(Gate::Hold)));
    assert_eq!(d.status.waiting_for.as_deref(), Some("policy Paused"));
    assert_eq!(d.events.len(), 1, "{:?}", d.events);
    assert_eq!(
        (d.events[0].reason.as_str(), d.events[0].change.as_deref()),
        ("Paused", Some("abc123def456"))
    );

    let d = Scenario::new()
        .spec(json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual", "approve": "other"}))
        .change_is(ch())
        .decide();
    assert_eq!(d.status.phase, Phase::WaitingForApproval);
    assert!(
        d.status
            .message
            .as_deref()
            .unwrap()
            .contains("\"approve\":\"abc123def456\"")
    );
    assert!(
        !d.events.iter().any(|e| e.reason == "Approved"),
        "{:?}",
        d.events
    );

    let d = Scenario::new()
        .spec(json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual", "approve": "abc123def456"}))
        .change_is(ch())
        .decide();
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::Admitted, Some(Gate::Open))
    );
}

#[test]
fn a_change_awaiting_approval_reports_what_it_needs_and_whether_it_fits() {
    let manual = |status| {
        plan(
            json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual"}),
            status,
        )
    };
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 4)])));
    let d = Scenario::new().plan(&manual(None)).change_is(ch()).decide();
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::WaitingForApproval, Some(Gate::Hold))
    );
    let cap = d
        .status
        .capacity
        .as_ref()
        .expect("capacity while awaiting approval");
    assert_eq!(
        (cap.gpus_needed.as_deref(), cap.gpus_free.as_deref()),
        (Some("4"), Some("8"))
    );
    let c = cond(&d.status, "CapacityAvailable");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Fits"));
    let msg = d.status.message.as_deref().unwrap_or_default();
    assert!(
        msg.contains("kubectl raygate approve")
            && msg.contains(
                "new cluster needs cpu 4, memory 16Gi, nvidia.com/gpu 4, pods 1 and fits now"
            ),
        "{msg}"
    );
    assert_eq!(d.events.len(), 1, "{:?}", d.events);
    let ev = &d.events[0];
    assert_eq!(
        (ev.reason.as_str(), ev.change.as_deref(), ev.warning),
        ("WaitingForApproval", Some("abc123def456"), false)
    );
    assert!(ev.note.contains("change abc123def456"), "{}", ev.note);

    // Still waiting: no second Event; capacity gone: the condition says so,
    // and the phase stays WaitingForApproval (no capacity Event either).
    let d2 = Scenario::new()
        .plan(&manual(Some(d.status.clone())))
        .change_is(ch())
        .capacity(&[2])
        .decide();
    assert_eq!(d2.status.phase, Phase::WaitingForApproval);
    assert!(d2.events.is_empty(), "{:?}", d2.events);
    let c = cond(&d2.status, "CapacityAvailable");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "InsufficientCapacity")
    );
    assert_eq!(
        d2.status.capacity.as_ref().unwrap().gpus_short.as_deref(),
        Some("2")
    );
    assert!(
        d2.status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("short by nvidia.com/gpu 2"),
        "{:?}",
        d2.status.message
    );
}

#[test]
fn an_approval_is_reported_once_with_who_approved() {
    let waiting = Scenario::new()
        .spec(json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual"}))
        .change(change(vec![gpu_pod("w0", 4)]))
        .decide();
    let mut approved = plan(
        json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual", "approve": "abc123def456"}),
        Some(waiting.status),
    );
    approved.metadata.managed_fields = Some(vec![
        serde_json::from_value(json!({"manager": "kubectl-raygate", "operation": "Update",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:approve": {}}}}))
        .unwrap(),
    ]);
    let d = Scenario::new()
        .plan(&approved)
        .change(change(vec![gpu_pod("w0", 4)]))
        .decide();
    let reasons: Vec<&str> = d.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Approved", "Admitted"]);
    assert!(
        d.events[0]
            .note
            .contains("by field manager kubectl-raygate"),
        "{}",
        d.events[0].note
    );
    assert!(
        d.events
            .iter()
            .all(|e| e.change.as_deref() == Some("abc123def456"))
    );
    // Admitted: the approval is not reported again.
    let d = Scenario::new().spec(json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual", "approve": "abc123def456"})).status(d.status).change(change(vec![gpu_pod("w0", 4)])).decide();
    assert!(d.events.is_empty(), "{:?}", d.events);
}

#[test]
fn an_approval_outside_the_window_is_reported_once() {
    let spec = json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual", "approve": "abc123def456",
        "maintenanceWindows": [{"schedule": "0 2 * * *", "duration": "2h"}]});
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 4)])));
    let d = Scenario::new().spec(spec.clone()).change_is(ch()).decide();
    assert_eq!(d.status.phase, Phase::Pending);
    let reasons: Vec<&str> = d.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Approved"]);
    let in_window: Timestamp = "2026-12-02T03:00:00Z".parse().unwrap();
    let d = Scenario::new()
        .spec(spec)
        .status(d.status)
        .change_is(ch())
        .at(in_window)
        .decide();
    let reasons: Vec<&str> = d.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Admitted"]);
}

/// `spec.approve: deadbeef0000` matching nothing was accepted silently.
#[test]
fn an_approval_that_matches_no_change_is_reported() {
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 1)])));
    let manual = |approve: &str, status| {
        plan(
            json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual", "approve": approve}),
            status,
        )
    };
    let p = manual("deadbeef0000", None);
    let d = Scenario::new().plan(&p).change_is(ch()).decide();
    assert_eq!(d.status.phase, Phase::WaitingForApproval);
    let c = cond(&d.status, "ApprovalMatched");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NoSuchChange")
    );
    assert_eq!(
        c.message,
        "spec.approve \"deadbeef0000\" matches no change of this plan: the pending change is \
         abc123def456 (kubectl raygate approve to approve it)"
    );
    let warned: Vec<_> = d
        .events
        .iter()
        .filter(|e| e.reason == "ApprovalUnmatched")
        .collect();
    assert_eq!(warned.len(), 1, "{:?}", d.events);
    // Reported once.
    let d2 = Scenario::new()
        .plan(&manual("deadbeef0000", Some(d.status.clone())))
        .change_is(ch())
        .decide();
    assert!(d2.events.iter().all(|e| e.reason != "ApprovalUnmatched"));
    // Nothing pending at all.
    let d = Scenario::new().plan(&manual("deadbeef0000", None)).decide();
    assert!(
        cond(&d.status, "ApprovalMatched")
            .message
            .ends_with("no change is pending")
    );
    // The right fingerprint: True; admitted.
    let d = Scenario::new()
        .plan(&manual("abc123def456", None))
        .change_is(ch())
        .decide();
    assert_eq!(d.status.phase, Phase::Admitted);
    assert_eq!(cond(&d.status, "ApprovalMatched").status, "True");
    // Unset: no condition.
    let d = Scenario::new().change_is(ch()).decide();
    assert!(
        d.status
            .conditions
            .iter()
            .all(|c| c.type_ != "ApprovalMatched")
    );
}

/// Issue 32, item 8: after a Manual approval and a switch to Auto, the next
/// upgrade raised `ApprovalUnmatched`, though `spec.approve` is ignored under
/// Auto. Item 12: the approval hint names the plan's namespace.
#[test]
fn an_approval_left_under_auto_is_ignored_not_warned_about() {
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 1)])));
    let d = Scenario::new()
        .spec(
            json!({"rayServiceRef": {"name": "llm"}, "policy": "Auto", "approve": "deadbeef0000"}),
        )
        .change_is(ch())
        .decide();
    assert_eq!(d.status.phase, Phase::Admitted);
    assert!(
        d.events.iter().all(|e| e.reason != "ApprovalUnmatched"),
        "{:?}",
        d.events
    );
    assert!(
        d.status
            .conditions
            .iter()
            .all(|c| c.type_ != "ApprovalMatched"),
        "{:?}",
        d.status.conditions
    );
    let d = Scenario::new()
        .spec(json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual"}))
        .change_is(ch())
        .decide();
    assert_eq!(d.status.phase, Phase::WaitingForApproval);
    let msg = d.status.message.unwrap_or_default();
    assert!(
        msg.contains("kubectl raygate approve llm-plan -n ml --fingerprint abc123def456"),
        "{msg}"
    );
}

#[test]
fn closed_maintenance_window_holds() {
    let p = plan(
        json!({"rayServiceRef": {"name": "llm"}, "maintenanceWindows": [{"schedule": "0 2 * * *", "duration": "2h"}]}),
        None,
    );
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 1)])));
    let d = Scenario::new().plan(&p).change_is(ch()).decide();
    assert_eq!(d.status.phase, Phase::Pending);
    assert_eq!(d.status.waiting_for.as_deref(), Some("maintenance window"));
    let in_window: Timestamp = "2026-12-02T03:00:00Z".parse().unwrap();
    let d = Scenario::new()
        .plan(&p)
        .change_is(ch())
        .at(in_window)
        .decide();
    assert_eq!(d.status.phase, Phase::Admitted);
}
