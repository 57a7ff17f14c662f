use super::*;
use crate::admission::observed::PodRef;
use crate::capacity::ClusterState;
use crate::upgradeplan::{Phase, TransitionOutcome, UpgradePlanSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::json;
use std::sync::Arc;

const NOW: &str = "2026-12-02T12:00:00Z";
/// The `metadata.uid` of the RayService [`service`] describes.
const SERVICE_UID: &str = "9d4c-first";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn plan(spec: serde_json::Value, status: Option<UpgradePlanStatus>) -> UpgradePlan {
    let spec: UpgradePlanSpec = serde_json::from_value(spec).unwrap();
    let mut p = UpgradePlan::new("llm-plan", spec);
    p.metadata.namespace = Some("ml".into());
    p.metadata.generation = Some(2);
    p.status = status;
    p
}

fn auto_plan(status: Option<UpgradePlanStatus>) -> UpgradePlan {
    plan(
        json!({"rayServiceRef": {"name": "llm"}, "stallAfter": "30m"}),
        status,
    )
}

fn gpu_pod(name: &str, gpus: u32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml",
            "labels": {"ray.io/node-type": "worker", "ray.io/group": "gpu"}},
        "spec": {"containers": [{"name": "ray-worker", "resources": {
            "requests": {"cpu": "4", "memory": "16Gi"},
            "limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
    }))
    .unwrap()
}

/// Ready nodes `gpu-0..`, each with these GPUs (also for `incremental_tests`).
pub(super) fn state(gpus_per_node: &[u32]) -> ClusterState {
    let items: Vec<_> = gpus_per_node
        .iter()
        .enumerate()
        .map(|(i, g)| {
            json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": format!("gpu-{i}")},
                "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                    "nvidia.com/gpu": g.to_string()},
                    "conditions": [{"type": "Ready", "status": "True"}]}})
        })
        .collect();
    ClusterState::from_list(json!({"kind": "List", "apiVersion": "v1", "items": items})).unwrap()
}

fn change(pods: Vec<Pod>) -> ChangeFacts {
    ChangeFacts {
        fingerprint: "abc123def456".into(),
        triggering_paths: vec![
            "workerGroupSpecs[gpu].template.spec.containers[ray-worker].image".into(),
        ],
        new_pods: pods
            .into_iter()
            .map(crate::capacity::PodGroup::from)
            .collect(),
        surge: None,
    }
}

fn service(active: &str, pending: Option<&str>) -> Result<ServiceFacts, ServiceError> {
    Ok(ServiceFacts {
        uid: Some(SERVICE_UID.into()),
        active_cluster: Some(active.into()),
        pending_cluster: pending.map(Into::into),
        pending_apps: BTreeMap::new(),
        ..Default::default()
    })
}

/// Runs `decide` with a real fit against `st`; a pending cluster, if any,
/// was built from the change `change()` describes.
fn run(
    p: &UpgradePlan,
    svc: Result<ServiceFacts, ServiceError>,
    ch: Result<Option<ChangeFacts>, ChangeError>,
    st: &ClusterState,
    clusters: &[&str],
    pods: BTreeMap<String, Vec<PodRef>>,
    at: Timestamp,
) -> Decision {
    run_built_from(p, svc, ch, st, clusters, pods, at, Some("abc123def456"))
}

#[allow(clippy::too_many_arguments)]
fn run_built_from(
    p: &UpgradePlan,
    svc: Result<ServiceFacts, ServiceError>,
    ch: Result<Option<ChangeFacts>, ChangeError>,
    st: &ClusterState,
    clusters: &[&str],
    pods: BTreeMap<String, Vec<PodRef>>,
    at: Timestamp,
    pending_fingerprint: Option<&str>,
) -> Decision {
    decide(&Inputs {
        now: at,
        plan: p,
        settings: Settings::of(p),
        release: crate::kuberay::Release::assumed(crate::kuberay::KubeRayVersion::latest()),
        service: svc,
        change: ch,
        verdict: Some(Verdict::NewCluster),
        incremental: None,
        clusters: clusters.iter().map(|s| s.to_string()).collect(),
        pods,
        pending_ready: false,
        pending_fingerprint: pending_fingerprint.map(Into::into),
        gate: GateFacts::default(),
        admission_unseen: false,
        quota: None,
        capacity_request: None,
        cluster: &fit::Alone(st),
    })
}

fn cond<'a>(s: &'a UpgradePlanStatus, t: &str) -> &'a Condition {
    s.conditions.iter().find(|c| c.type_ == t).unwrap()
}

#[test]
fn missing_rayservice_is_an_error_and_leaves_the_gate_alone() {
    let p = auto_plan(None);
    let d = run(
        &p,
        Err(ServiceError::NotFound {
            namespace: "ml".into(),
            name: "llm".into(),
        }),
        Ok(None),
        &state(&[8]),
        &[],
        BTreeMap::new(),
        now(),
    );
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
    let p = plan(
        json!({"rayServiceRef": {"name": "llm"},
               "maintenanceWindows": [{"schedule": "61 * * * *", "duration": "1h"}]}),
        None,
    );
    let d = run(
        &p,
        Err(ServiceError::NotFound {
            namespace: "ml".into(),
            name: "llm".into(),
        }),
        Ok(None),
        &state(&[8]),
        &[],
        BTreeMap::new(),
        now(),
    );
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
    let d = run(
        &plan(
            json!({"rayServiceRef": {"name": "llm"},
                   "maintenanceWindows": [{"schedule": "61 * * * *", "duration": "1h"}]}),
            Some(d.status),
        ),
        service("llm-a", None),
        Ok(None),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!((d.status.phase, d.gate), (Phase::Error, Some(Gate::Hold)));
    assert_eq!(d.status.waiting_for.as_deref(), Some("InvalidSpec"));
    assert!(d.events.is_empty(), "{:?}", d.events);
}

#[test]
fn invalid_spec_is_an_error_that_keeps_holding() {
    let p = plan(
        json!({"rayServiceRef": {"name": "llm"}, "headroom": {"nvidia.com/gpu": "two"}}),
        None,
    );
    let d = run(
        &p,
        service("llm-a", None),
        Ok(None),
        &state(&[8]),
        &[],
        BTreeMap::new(),
        now(),
    );
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
    let p = auto_plan(None);
    let svc = Ok(ServiceFacts::default());
    let d = run(&p, svc, Ok(None), &state(&[8]), &[], BTreeMap::new(), now());
    assert_eq!(d.status.phase, Phase::Pending);
    assert_eq!(d.status.waiting_for.as_deref(), Some("first cluster"));
    assert_eq!(d.gate, Some(Gate::Hold));
}

#[test]
fn a_rayservice_refused_whole_is_an_error_before_its_first_cluster() {
    let p = auto_plan(None);
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
    let d = run(&p, svc, Err(e), &state(&[8]), &[], BTreeMap::new(), now());
    assert_eq!(d.status.phase, Phase::Error);
    assert_eq!(d.status.waiting_for.as_deref(), Some("InvalidRayService"));
    assert_eq!(d.status.message.as_deref(), Some(msg.as_str()));
    assert_eq!(d.gate, Some(Gate::Hold));
}

#[test]
fn nothing_pending_is_idle_with_the_gate_held() {
    let p = auto_plan(None);
    let d = run(
        &p,
        service("llm-a", None),
        Ok(None),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.phase, Phase::Idle);
    assert_eq!(d.gate, Some(Gate::Hold));
    assert_eq!(d.status.active_cluster.as_deref(), Some("llm-a"));
    assert_eq!(cond(&d.status, "Ready").status, "True");
}

#[test]
fn an_upgrade_that_fits_is_admitted_and_opens_the_gate() {
    let p = auto_plan(None);
    let ch = change(vec![gpu_pod("w0", 8), gpu_pod("w1", 8)]);
    let d = run(
        &p,
        service("llm-a", None),
        Ok(Some(ch)),
        &state(&[8, 8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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
    let p = auto_plan(None);
    let ch = change((0..4).map(|i| gpu_pod(&format!("w{i}"), 4)).collect());
    let d = run(
        &p,
        service("llm-a", None),
        Ok(Some(ch)),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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
    let p2 = auto_plan(Some(d.status.clone()));
    let ch = change((0..4).map(|i| gpu_pod(&format!("w{i}"), 4)).collect());
    let d2 = run(
        &p2,
        service("llm-a", None),
        Ok(Some(ch)),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        later,
    );
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
    let p = auto_plan(None);
    let ch = change(vec![gpu_pod("big", 16)]);
    let d = run(
        &p,
        service("llm-a", None),
        Ok(Some(ch)),
        &state(&[8, 8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.phase, Phase::WaitingForCapacity);
    assert_eq!(
        d.status.waiting_for.as_deref(),
        Some("capacity (fragmented)")
    );
}

#[test]
fn headroom_is_kept_free() {
    let p = plan(
        json!({"rayServiceRef": {"name": "llm"}, "headroom": {"nvidia.com/gpu": "2"}}),
        None,
    );
    let ch = change(vec![gpu_pod("w0", 8)]);
    let d = run(
        &p,
        service("llm-a", None),
        Ok(Some(ch)),
        &state(&[8, 1]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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

#[test]
fn paused_and_manual_policies_wait_for_approval() {
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 1)])));
    let paused = plan(
        json!({"rayServiceRef": {"name": "llm"}, "policy": "Paused"}),
        None,
    );
    let d = run(
        &paused,
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!((d.status.phase, d.gate), (Phase::Paused, Some(Gate::Hold)));
    assert_eq!(d.status.waiting_for.as_deref(), Some("policy Paused"));
    assert_eq!(d.events.len(), 1, "{:?}", d.events);
    assert_eq!(
        (d.events[0].reason.as_str(), d.events[0].change.as_deref()),
        ("Paused", Some("abc123def456"))
    );

    let manual = plan(
        json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual", "approve": "other"}),
        None,
    );
    let d = run(
        &manual,
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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

    let approved = plan(
        json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual", "approve": "abc123def456"}),
        None,
    );
    let d = run(
        &approved,
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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
    let d = run(
        &manual(None),
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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
    let d2 = run(
        &manual(Some(d.status.clone())),
        service("llm-a", None),
        ch(),
        &state(&[2]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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
    let waiting = run(
        &plan(
            json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual"}),
            None,
        ),
        service("llm-a", None),
        Ok(Some(change(vec![gpu_pod("w0", 4)]))),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    let mut approved = plan(
        json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual", "approve": "abc123def456"}),
        Some(waiting.status),
    );
    approved.metadata.managed_fields = Some(vec![
        serde_json::from_value(json!({"manager": "kubectl-raygate", "operation": "Update",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:approve": {}}}}))
        .unwrap(),
    ]);
    let d = run(
        &approved,
        service("llm-a", None),
        Ok(Some(change(vec![gpu_pod("w0", 4)]))),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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
    let d = run(
        &plan(
            json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual", "approve": "abc123def456"}),
            Some(d.status),
        ),
        service("llm-a", None),
        Ok(Some(change(vec![gpu_pod("w0", 4)]))),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert!(d.events.is_empty(), "{:?}", d.events);
}

#[test]
fn an_approval_outside_the_window_is_reported_once() {
    let spec = json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual", "approve": "abc123def456",
        "maintenanceWindows": [{"schedule": "0 2 * * *", "duration": "2h"}]});
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 4)])));
    let d = run(
        &plan(spec.clone(), None),
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.phase, Phase::Pending);
    let reasons: Vec<&str> = d.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Approved"]);
    let in_window: Timestamp = "2026-12-02T03:00:00Z".parse().unwrap();
    let d = run(
        &plan(spec, Some(d.status)),
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        in_window,
    );
    let reasons: Vec<&str> = d.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Admitted"]);
}

#[test]
fn events_of_different_changes_or_texts_are_never_one_series() {
    let ev = |change: Option<&str>, note: &str| EventNote {
        warning: false,
        reason: EventReason::Admitted,
        note: note.into(),
        change: change.map(Into::into),
    };
    let a = ev(Some("07e0ddeed0e9"), "admitted change 07e0ddeed0e9");
    let b = ev(Some("21dbea861227"), "admitted change 21dbea861227");
    assert!(
        a.action().starts_with("Gate 07e0ddeed0e9 "),
        "{}",
        a.action()
    );
    assert_ne!(a.action(), b.action());
    assert_ne!(
        ev(None, "spec.stallAfter: bad").action(),
        ev(None, "spec.priority: bad").action()
    );
    assert_eq!(
        a.action(),
        a.clone().action(),
        "the same Event repeated is one series"
    );
    assert!(a.action().len() <= 128, "the API's limit for action");
}

#[test]
fn closed_maintenance_window_holds() {
    let p = plan(
        json!({"rayServiceRef": {"name": "llm"}, "maintenanceWindows": [{"schedule": "0 2 * * *", "duration": "2h"}]}),
        None,
    );
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 1)])));
    let d = run(
        &p,
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.phase, Phase::Pending);
    assert_eq!(d.status.waiting_for.as_deref(), Some("maintenance window"));
    let in_window: Timestamp = "2026-12-02T03:00:00Z".parse().unwrap();
    let d = run(
        &p,
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        in_window,
    );
    assert_eq!(d.status.phase, Phase::Admitted);
}

fn admitted_status() -> UpgradePlanStatus {
    let p = auto_plan(None);
    let ch = change(vec![gpu_pod("w0", 8)]);
    run(
        &p,
        service("llm-a", None),
        Ok(Some(ch)),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    )
    .status
}

#[test]
fn admitted_keeps_the_gate_open_until_kuberay_names_the_cluster() {
    let p = auto_plan(Some(admitted_status()));
    let ch = Ok(Some(change(vec![gpu_pod("w0", 8)])));
    // Restarted raygate sees the same objects: still admitted, no second admission.
    let d = run(
        &p,
        service("llm-a", None),
        ch,
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::Admitted, Some(Gate::Open))
    );
    assert_eq!(d.outcome, None);
    assert!(d.events.is_empty());
}

#[test]
fn a_superseded_admission_is_withdrawn_and_reevaluated() {
    let p = auto_plan(Some(admitted_status()));
    let mut ch = change(vec![gpu_pod("w0", 16)]);
    ch.fingerprint = "fffeeeddd000".into();
    let d = run(
        &p,
        service("llm-a", None),
        Ok(Some(ch)),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.phase, Phase::WaitingForCapacity);
    assert_eq!(d.gate, Some(Gate::Hold));
    assert!(d.status.admitted.is_none());
    assert!(d.events.iter().any(|e| e.reason == "AdmissionWithdrawn"));
}

#[test]
fn once_the_new_cluster_is_named_the_gate_closes_and_the_transition_is_tracked() {
    let p = auto_plan(Some(admitted_status()));
    let d = run(
        &p,
        service("llm-a", Some("llm-b")),
        Ok(None),
        &state(&[8]),
        &["llm-a", "llm-b"],
        BTreeMap::new(),
        now(),
    );
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
        let again = run(
            &auto_plan(Some(d.status.clone())),
            service("llm-a", Some("llm-b")),
            Ok(None),
            &state(&[8]),
            &["llm-a", "llm-b"],
            BTreeMap::new(),
            now() + jiff::SignedDuration::from_secs(secs),
        );
        assert_eq!(differing(&d.status, &again.status), Vec::<String>::new());
    }
}

#[test]
fn unschedulable_new_pods_stall_the_transition() {
    let mut st = admitted_status();
    st.phase = Phase::Upgrading;
    let p = auto_plan(Some(st));
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "llm-b-gpu-worker-x"},
        "spec": {"containers": [{"name": "w"}]},
        "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]}
    }))
    .unwrap();
    let pods = BTreeMap::from([("llm-b".to_string(), vec![Arc::new(pod) as PodRef])]);
    let d = run(
        &p,
        service("llm-a", Some("llm-b")),
        Ok(None),
        &state(&[8]),
        &["llm-a", "llm-b"],
        pods,
        now(),
    );
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
fn completed_only_when_the_old_cluster_and_its_pods_are_gone() {
    let mut st = admitted_status();
    st.phase = Phase::Upgrading;
    st.admitted.as_mut().unwrap().to_cluster = Some("llm-b".into());
    let p = auto_plan(Some(st));
    // Promoted, but the old cluster still exists (rayClusterDeletionDelaySeconds).
    let d = run(
        &p,
        service("llm-b", None),
        Ok(None),
        &state(&[8]),
        &["llm-a", "llm-b"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.phase, Phase::Upgrading);
    assert_eq!(
        d.status.waiting_for.as_deref(),
        Some("old cluster deletion")
    );

    let later: Timestamp = "2026-12-02T12:05:00Z".parse().unwrap();
    let d = run(
        &p,
        service("llm-b", None),
        Ok(None),
        &state(&[8]),
        &["llm-b"],
        BTreeMap::new(),
        later,
    );
    assert_eq!(d.status.phase, Phase::Completed);
    assert!(d.status.admitted.is_none());
    let t = d.status.last_transition.as_ref().unwrap();
    assert_eq!(
        (t.outcome, t.duration_seconds),
        (Some(TransitionOutcome::Completed), Some(300))
    );
    assert_eq!(d.outcome, Some(Outcome::Completed));

    // The next reconcile keeps showing Completed while nothing else changes.
    let p2 = auto_plan(Some(d.status.clone()));
    let d2 = run(
        &p2,
        service("llm-b", None),
        Ok(None),
        &state(&[8]),
        &["llm-b"],
        BTreeMap::new(),
        later,
    );
    assert_eq!(d2.status.phase, Phase::Completed);
    assert!(d2.events.is_empty());
    // And writes nothing more: the completing decision's status is the
    // next one's (one status write per completion, not two).
    assert_eq!(differing(&d.status, &d2.status), Vec::<String>::new());
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
    let p = auto_plan(Some(st));
    let d = run(
        &p,
        Err(ServiceError::NotFound {
            namespace: "ml".into(),
            name: "llm".into(),
        }),
        Ok(None),
        &state(&[8]),
        &[],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.ray_service_uid.as_deref(), Some(SERVICE_UID));
    assert!(d.status.admitted.is_some());
}

#[test]
fn a_recreated_rayservice_never_completes_the_old_change() {
    // Under way: the old RayService's new cluster llm-b exists.
    let mut st = admitted_status();
    st.phase = Phase::Upgrading;
    st.admitted.as_mut().unwrap().to_cluster = Some("llm-b".into());
    let p = auto_plan(Some(st));
    // Deleted and recreated with the same name: its first cluster llm-c is
    // active, the old clusters are gone (or not its own).
    let later: Timestamp = "2026-12-02T12:05:00Z".parse().unwrap();
    let d = run(
        &p,
        recreated("llm-c", None),
        Ok(None),
        &state(&[8]),
        &["llm-c"],
        BTreeMap::new(),
        later,
    );
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
    let d2 = run(
        &auto_plan(Some(d.status.clone())),
        recreated("llm-c", None),
        Ok(None),
        &state(&[8]),
        &["llm-c"],
        BTreeMap::new(),
        later,
    );
    assert_eq!(d2.status.phase, Phase::Idle);
    assert!(d2.events.is_empty(), "{:?}", d2.events);
}

#[test]
fn a_recreated_rayservice_starts_afresh() {
    // Waiting since 12:00 for the old RayService's change.
    let p = auto_plan(None);
    let ch = change(vec![gpu_pod("w0", 8)]);
    let waiting = run(
        &p,
        service("llm-a", None),
        Ok(Some(ch.clone())),
        &state(&[0]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    )
    .status;
    assert_eq!(waiting.phase, Phase::WaitingForCapacity);
    // Recreated with a change of the same fingerprint: it is a new change,
    // detected now, and the old admission is not carried over.
    let later: Timestamp = "2026-12-02T12:05:00Z".parse().unwrap();
    let still = run(
        &auto_plan(Some(waiting.clone())),
        recreated("llm-c", None),
        Ok(Some(ch.clone())),
        &state(&[0]),
        &["llm-c"],
        BTreeMap::new(),
        later,
    );
    assert_eq!(
        still.status.pending_change.as_ref().unwrap().detected_time,
        later
    );
    let d = run(
        &auto_plan(Some(waiting)),
        recreated("llm-c", None),
        Ok(Some(ch.clone())),
        &state(&[8]),
        &["llm-c"],
        BTreeMap::new(),
        later,
    );
    assert_eq!(d.status.phase, Phase::Admitted);
    assert_eq!(d.status.admitted.as_ref().unwrap().admitted_time, later);
    assert_eq!(
        d.status.admitted.as_ref().unwrap().from_cluster.as_deref(),
        Some("llm-c")
    );
    assert!(d.status.last_transition.is_none());

    // Admitted for the old RayService, recreated before KubeRay acted: the
    // admission is not the new one's (its gate opens only by its own fit).
    let d = run(
        &auto_plan(Some(admitted_status())),
        recreated("llm-c", None),
        Ok(Some(ch)),
        &state(&[0]),
        &["llm-c"],
        BTreeMap::new(),
        later,
    );
    assert_eq!(d.status.phase, Phase::WaitingForCapacity);
    assert_eq!(d.gate, Some(Gate::Hold));
    assert_eq!(
        d.status.last_transition.as_ref().unwrap().outcome,
        Some(TransitionOutcome::Replaced)
    );

    // A status written before raygate recorded UIDs is not a replacement.
    let mut legacy = admitted_status();
    legacy.ray_service_uid = None;
    let d = run(
        &auto_plan(Some(legacy)),
        recreated("llm-a", None),
        Ok(Some(change(vec![gpu_pod("w0", 8)]))),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.phase, Phase::Admitted);
    assert!(d.events.is_empty(), "{:?}", d.events);
}

#[test]
fn a_transition_started_without_admission_is_tracked_and_reported() {
    let p = auto_plan(None);
    let d = run(
        &p,
        service("llm-a", Some("llm-b")),
        Ok(None),
        &state(&[8]),
        &["llm-a", "llm-b"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.phase, Phase::Upgrading);
    assert!(d.events.iter().any(|e| e.reason == "UnadmittedUpgrade"));
}

#[test]
fn gate_override_is_reported_not_fought() {
    let p = auto_plan(None);
    let st = state(&[8]);
    let d = decide(&Inputs {
        now: now(),
        plan: &p,
        settings: Settings::of(&p),
        release: crate::kuberay::Release::assumed(crate::kuberay::KubeRayVersion::latest()),
        service: service("llm-a", None),
        change: Ok(None),
        verdict: Some(Verdict::NoChange),
        incremental: None,
        clusters: BTreeSet::from(["llm-a".to_string()]),
        pods: BTreeMap::new(),
        pending_ready: false,
        pending_fingerprint: None,
        gate: GateFacts {
            value: Some("NewCluster".into()),
            other_owner: Some("argocd-controller".into()),
            owned_by_us: false,
            uid: None,
        },
        admission_unseen: false,
        quota: None,
        capacity_request: None,
        cluster: &fit::Alone(&st),
    });
    let c = cond(&d.status, "GateOverridden");
    assert_eq!(c.status, "True");
    assert!(c.message.contains("argocd-controller"));
    assert!(d.events.iter().any(|e| e.reason == "GateOverridden"));
    assert!(d.observed.newly_overridden);
    // Visible in `kubectl get upgradeplans` (WAITING FOR), with the manager.
    assert_eq!(
        d.status.waiting_for.as_deref(),
        Some("GateOverridden: argocd-controller keeps NewCluster")
    );
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
    let d = run(
        &p,
        Ok(svc),
        Ok(None),
        &state(&[8]),
        &["llm-a", "llm-b"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!((d.status.phase, d.gate), (Phase::Stalled, Some(Gate::Hold)));
    let msg = d.status.message.as_deref().unwrap();
    assert!(
        msg.starts_with("ServeNotHealthy: app llm DEPLOY_FAILED"),
        "{msg}"
    );
    assert!(msg.contains("revert spec.rayClusterConfig"), "{msg}");
}

#[test]
fn a_pending_cluster_built_from_another_change_is_not_adopted() {
    let p = auto_plan(Some(admitted_status()));
    let d = run_built_from(
        &p,
        service("llm-a", Some("llm-b")),
        Ok(None),
        &state(&[8]),
        &["llm-a", "llm-b"],
        BTreeMap::new(),
        now(),
        Some("0000other000"),
    );
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
    let p = auto_plan(Some(admitted_status()));
    let d = run_built_from(
        &p,
        service("llm-a", Some("llm-b")),
        Ok(None),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
        None,
    );
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::Upgrading, Some(Gate::Hold))
    );
    assert_eq!(d.status.admitted.as_ref().unwrap().to_cluster, None);
    let d = run(
        &auto_plan(Some(d.status)),
        service("llm-a", Some("llm-b")),
        Ok(None),
        &state(&[8]),
        &["llm-a", "llm-b"],
        BTreeMap::new(),
        now(),
    );
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
    let again = run(
        &auto_plan(Some(d.status)),
        service("llm-a", Some("llm-b")),
        Ok(None),
        &state(&[8]),
        &["llm-a", "llm-b"],
        BTreeMap::new(),
        now(),
    );
    assert!(again.events.is_empty(), "{:?}", again.events);
}

#[test]
fn an_admission_kuberay_does_not_act_on_is_fitted_again() {
    let p = auto_plan(Some(admitted_status()));
    let later = now() + ADMISSION_TTL + Duration::from_secs(1);
    // Capacity is gone by now: the old admission must not keep the gate open.
    let d = run(
        &p,
        service("llm-a", None),
        Ok(Some(change(vec![gpu_pod("w0", 8)]))),
        &state(&[4]),
        &["llm-a"],
        BTreeMap::new(),
        later,
    );
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::WaitingForCapacity, Some(Gate::Hold))
    );
    assert!(d.status.admitted.is_none());
    assert!(d.events.iter().any(|e| e.reason == "AdmissionExpired"));
    // Within the bound it stays admitted.
    let d = run(
        &p,
        service("llm-a", None),
        Ok(Some(change(vec![gpu_pod("w0", 8)]))),
        &state(&[4]),
        &["llm-a"],
        BTreeMap::new(),
        now() + Duration::from_secs(60),
    );
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::Admitted, Some(Gate::Open))
    );
}

fn decide_with_gate(
    p: &UpgradePlan,
    ch: Result<Option<ChangeFacts>, ChangeError>,
    st: &ClusterState,
    gate: GateFacts,
) -> Decision {
    decide(&Inputs {
        now: now(),
        plan: p,
        settings: Settings::of(p),
        release: crate::kuberay::Release::assumed(crate::kuberay::KubeRayVersion::latest()),
        service: service("llm-a", None),
        change: ch,
        verdict: Some(Verdict::NewCluster),
        incremental: None,
        clusters: BTreeSet::from(["llm-a".to_string()]),
        pods: BTreeMap::new(),
        pending_ready: false,
        pending_fingerprint: None,
        gate,
        admission_unseen: false,
        quota: None,
        capacity_request: None,
        cluster: &fit::Alone(st),
    })
}

fn owned_by(owner: &str, value: &str) -> GateFacts {
    GateFacts {
        value: Some(value.into()),
        other_owner: Some(owner.into()),
        owned_by_us: true,
        uid: None,
    }
}

#[test]
fn an_override_is_new_only_in_the_decision_that_first_sees_it() {
    let st = state(&[8]);
    let first = decide_with_gate(
        &auto_plan(None),
        Ok(None),
        &st,
        owned_by("argocd-controller", "NewCluster"),
    );
    assert!(first.overridden_by.is_some());
    assert!(first.observed.newly_overridden);
    let again = decide_with_gate(
        &auto_plan(Some(first.status)),
        Ok(None),
        &st,
        owned_by("argocd-controller", "NewCluster"),
    );
    assert!(again.overridden_by.is_some());
    assert!(!again.observed.newly_overridden);
    assert!(again.events.iter().all(|e| e.reason != "GateOverridden"));
}

#[test]
fn an_override_is_judged_against_the_gate_decided_in_the_same_decision() {
    let p = auto_plan(None);
    let st = state(&[8]);
    // Nothing pending: raygate holds; argocd keeps the gate open.
    let d = decide_with_gate(&p, Ok(None), &st, owned_by("argocd", "NewCluster"));
    assert_eq!(d.gate, Some(Gate::Hold));
    assert_eq!(d.overridden_by.as_deref(), Some("argocd"));
    assert_eq!(cond(&d.status, "GateOverridden").status, "True");
    // The value raygate wants now, but owned by argocd too: raygate could
    // not open the gate later (the apply would conflict), so it is
    // overridden all the same.
    let d = decide_with_gate(&p, Ok(None), &st, owned_by("argocd", "None"));
    assert_eq!(d.overridden_by.as_deref(), Some("argocd"));
    assert_eq!(cond(&d.status, "GateOverridden").status, "True");
    // raygate alone: not overridden.
    let mut mine = owned_by("argocd", "None");
    mine.other_owner = None;
    let d = decide_with_gate(&p, Ok(None), &st, mine);
    assert_eq!(d.overridden_by, None);
    assert!(
        d.status
            .conditions
            .iter()
            .all(|c| c.type_ != "GateOverridden")
    );
}

/// The RayService's creator set `spec.upgradeStrategy.type` (kubectl create /
/// apply own what they set): a change that fits is not admitted, nothing is
/// reserved, and the status says why instead of claiming an admission.
#[test]
fn a_change_that_fits_under_another_owners_gate_is_not_admitted() {
    let p = auto_plan(None);
    let st = state(&[8]);
    for value in ["None", "NewCluster"] {
        let ch = Ok(Some(change(vec![gpu_pod("w0", 8)])));
        let d = decide_with_gate(&p, ch, &st, owned_by("kubectl-create", value));
        assert_eq!(d.status.phase, Phase::Pending, "{value}");
        assert!(d.status.admitted.is_none(), "nothing reserved: {value}");
        assert_eq!(d.overridden_by.as_deref(), Some("kubectl-create"));
        assert_ne!(d.gate, Some(Gate::Open), "{value}");
        let admitted = cond(&d.status, "UpgradeAdmitted");
        assert_eq!(
            (admitted.status.as_str(), admitted.reason.as_str()),
            ("False", "GateOverridden")
        );
        assert_eq!(cond(&d.status, "GateOverridden").status, "True");
        assert!(d.events.iter().all(|e| e.reason != "Admitted"), "{value}");
        assert_eq!(d.outcome, None, "{value}");
        assert_eq!(
            d.status.waiting_for.as_deref(),
            Some(format!("GateOverridden: kubectl-create keeps {value}").as_str())
        );
    }
}

#[test]
fn the_override_event_comes_before_the_events_of_the_rules() {
    let p = auto_plan(None);
    let st = state(&[8]);
    let ch = Ok(Some(change(vec![gpu_pod("w0", 8)])));
    let d = decide_with_gate(&p, ch, &st, owned_by("argocd", "None"));
    assert_eq!(d.overridden_by.as_deref(), Some("argocd"));
    let reasons: Vec<_> = d.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons[0], "GateOverridden", "{reasons:?}");
    // Reported once: the next decision sees the condition already True.
    let p2 = auto_plan(Some(d.status));
    let ch = Ok(Some(change(vec![gpu_pod("w0", 8)])));
    let d2 = decide_with_gate(&p2, ch, &st, owned_by("argocd", "None"));
    assert!(d2.events.iter().all(|e| e.reason != "GateOverridden"));
}

#[test]
fn an_invalid_spec_leaves_an_overridden_gate_alone_without_judging_it() {
    let p = plan(
        json!({"rayServiceRef": {"name": "llm"}, "stallAfter": "soon"}),
        None,
    );
    let d = decide_with_gate(&p, Ok(None), &state(&[8]), owned_by("argocd", "NewCluster"));
    assert_eq!((d.status.phase, d.gate), (Phase::Error, Some(Gate::Hold)));
    assert_eq!(d.overridden_by.as_deref(), Some("argocd"), "not written");
    assert!(
        d.status
            .conditions
            .iter()
            .all(|c| c.type_ != "GateOverridden")
    );
    assert!(
        d.status
            .message
            .as_deref()
            .unwrap()
            .starts_with("spec.stallAfter"),
        "{:?}",
        d.status.message
    );
}

fn decide_with_release(p: &UpgradePlan, release: crate::kuberay::Release) -> Decision {
    decide(&Inputs {
        now: now(),
        plan: p,
        settings: Settings::of(p),
        release,
        service: service("llm-a", None),
        change: Ok(Some(change(vec![gpu_pod("w0", 8)]))),
        verdict: Some(Verdict::NewCluster),
        incremental: None,
        clusters: BTreeSet::from(["llm-a".to_string()]),
        pods: BTreeMap::new(),
        pending_ready: false,
        pending_fingerprint: None,
        gate: GateFacts::default(),
        admission_unseen: false,
        quota: None,
        capacity_request: None,
        cluster: &fit::Alone(&state(&[8, 8])),
    })
}

#[test]
fn the_release_applied_is_recorded_and_a_disagreeing_flag_reported_once() {
    use crate::kuberay::{KubeRayVersion, Releases};
    let flag = KubeRayVersion::parse("1.7").ok();
    let release = Releases::from_stamps([("ml", "v1.6.2")], flag).for_namespace("ml");
    let d = decide_with_release(&auto_plan(None), release.clone());
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
    let again = decide_with_release(&auto_plan(Some(d.status.clone())), release);
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
    let d = decide_with_release(&auto_plan(None), ok);
    let c = cond(&d.status, "KubeRayRelease");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Stamped"));
    assert!(c.message.contains("v1.6.2's rules apply"), "{}", c.message);
}

#[test]
fn a_kuberay_without_the_gate_field_is_an_error_and_the_gate_is_left_alone() {
    use crate::kuberay::Releases;
    let old = Releases::from_stamps([("ml", "v1.2.2")], None).for_namespace("ml");
    let d = decide_with_release(&auto_plan(None), old);
    assert_eq!(d.status.phase, Phase::Error);
    assert_eq!(d.gate, None, "the field does not exist in this release");
    assert_eq!(d.status.waiting_for.as_deref(), Some("KubeRayNotGateable"));
    let c = cond(&d.status, "KubeRayRelease");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NotGateable")
    );
}

/// `headroom: {gpu: 2}` (no node offers `gpu`) held an upgrade forever with
/// nothing but "short by gpu 2": the name is reported once, the decision kept.
#[test]
fn a_resource_no_node_offers_is_reported_once() {
    let p = plan(
        json!({"rayServiceRef": {"name": "llm"}, "headroom": {"gpu": "2"}}),
        None,
    );
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 8)])));
    let d = run(
        &p,
        service("llm-a", None),
        ch(),
        &state(&[8, 8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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
    let d2 = run(
        &again,
        service("llm-a", None),
        ch(),
        &state(&[8, 8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert!(d2.events.iter().all(|e| e.reason != "ResourceNotOffered"));
    assert_eq!(cond(&d2.status, "ResourcesOffered").status, "False");

    // The new cluster requesting what no node has (CPU-only nodes) is said too.
    let d = run(
        &auto_plan(None),
        service("llm-a", None),
        ch(),
        &state(&[0]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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
    let d = run(
        &ok,
        service("llm-a", None),
        ch(),
        &state(&[8, 8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.phase, Phase::Admitted);
    assert_eq!(cond(&d.status, "ResourcesOffered").status, "True");
    assert!(d.events.iter().all(|e| e.reason != "ResourceNotOffered"));
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
    let d = run(
        &p,
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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
    let d2 = run(
        &manual("deadbeef0000", Some(d.status.clone())),
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert!(d2.events.iter().all(|e| e.reason != "ApprovalUnmatched"));
    // Nothing pending at all.
    let d = run(
        &manual("deadbeef0000", None),
        service("llm-a", None),
        Ok(None),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert!(
        cond(&d.status, "ApprovalMatched")
            .message
            .ends_with("no change is pending")
    );
    // The right fingerprint: True; admitted.
    let d = run(
        &manual("abc123def456", None),
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.phase, Phase::Admitted);
    assert_eq!(cond(&d.status, "ApprovalMatched").status, "True");
    // Unset: no condition.
    let d = run(
        &auto_plan(None),
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert!(
        d.status
            .conditions
            .iter()
            .all(|c| c.type_ != "ApprovalMatched")
    );
}

/// Reasons are API: each is spelled as its variant, and no two are alike.
#[test]
fn event_reasons_are_spelled_as_their_names() {
    let mut seen = std::collections::BTreeSet::new();
    for r in EventReason::ALL {
        assert_eq!(r.as_str(), format!("{r:?}"));
        assert!(seen.insert(r.as_str()), "{r:?} twice");
    }
    use crate::kuberay::ReleaseProblem as P;
    let release: Vec<&str> = [P::FlagMismatch, P::UnknownRelease, P::NotGateable]
        .into_iter()
        .map(|p| EventReason::from(p).as_str())
        .collect();
    assert_eq!(
        release,
        [
            "KubeRayReleaseMismatch",
            "UnknownKubeRayRelease",
            "KubeRayNotGateable"
        ]
    );
    let off = incremental::Problem::FeatureGateOff {
        version: "v1.6.2".into(),
    };
    assert_eq!(
        EventReason::from(&off).as_str(),
        "IncrementalUpgradeGateOff"
    );
    for (s, want) in [
        (stall::StallReason::Unschedulable, "Unschedulable"),
        (stall::StallReason::ServeNotHealthy, "ServeNotHealthy"),
        (stall::StallReason::Timeout, "Timeout"),
        (
            stall::StallReason::KueueWorkloadPending,
            "KueueWorkloadPending",
        ),
    ] {
        assert_eq!((s.as_str(), s.condition_reason().as_str()), (want, want));
    }
}

/// The gate is compared with the RayService's typed value, unknown values included.
#[test]
fn a_gate_is_set_only_when_the_value_is_the_same() {
    use crate::kuberay::UpgradeType as T;
    assert!(Gate::Hold.is_set(Some(&T::None)));
    assert!(Gate::Open.is_set(Some(&T::NewCluster)));
    assert!(Gate::OpenIncremental.is_set(Some(&T::NewClusterWithIncrementalUpgrade)));
    assert!(!Gate::Hold.is_set(None));
    assert!(!Gate::Open.is_set(Some(&T::None)));
    assert!(!Gate::Open.is_set(Some(&T::Other("newcluster".into()))));
    for g in [Gate::Hold, Gate::Open, Gate::OpenIncremental] {
        assert_eq!(g.upgrade_type().as_str(), g.strategy());
    }
}

/// Fields of `a` and `b` that differ (for a readable assertion).
fn differing(a: &UpgradePlanStatus, b: &UpgradePlanStatus) -> Vec<String> {
    crate::controller::written::changed_fields(Some(a), b)
}

#[test]
fn an_admission_decided_again_on_its_own_status_is_the_same() {
    // The status an admission writes is what the next decision on the same
    // world writes: else every admission costs a second status write.
    let first = admitted_status();
    let p = auto_plan(Some(first.clone()));
    let d = run(
        &p,
        service("llm-a", None),
        Ok(Some(change(vec![gpu_pod("w0", 8)]))),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now() + jiff::SignedDuration::from_secs(1),
    );
    assert_eq!(differing(&first, &d.status), Vec::<String>::new());
}

/// Issue 32, item 8: after a Manual approval and a switch to Auto, the next
/// upgrade raised `ApprovalUnmatched`, though `spec.approve` is ignored under
/// Auto. Item 12: the approval hint names the plan's namespace.
#[test]
fn an_approval_left_under_auto_is_ignored_not_warned_about() {
    let ch = || Ok(Some(change(vec![gpu_pod("w0", 1)])));
    let p = plan(
        json!({"rayServiceRef": {"name": "llm"}, "policy": "Auto", "approve": "deadbeef0000"}),
        None,
    );
    let d = run(
        &p,
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
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
    let manual = plan(
        json!({"rayServiceRef": {"name": "llm"}, "policy": "Manual"}),
        None,
    );
    let d = run(
        &manual,
        service("llm-a", None),
        ch(),
        &state(&[8]),
        &["llm-a"],
        BTreeMap::new(),
        now(),
    );
    assert_eq!(d.status.phase, Phase::WaitingForApproval);
    let msg = d.status.message.unwrap_or_default();
    assert!(
        msg.contains("kubectl raygate approve llm-plan -n ml --fingerprint abc123def456"),
        "{msg}"
    );
}
mod batching;
