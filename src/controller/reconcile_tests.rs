//! The reconcile glue against a mock apiserver, as kube-rs `controller-rs`
//! tests its own: a real [`Context`] over caches filled by hand and a kube
//! [`Client`] over a `tower_test` mock service that answers each request
//! and records it. What is checked is the order and the set of writes; the
//! decision itself is `admission`'s, tested there.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use kube::client::Body;
use kube::runtime::reflector;
use kube::runtime::watcher::Event as WatchEvent;
use serde_json::{Value, json};

use super::*;
use crate::upgradeplan::UpgradePlanStatus;

const NS: &str = "ml";

fn plan() -> UpgradePlan {
    serde_json::from_value(json!({
        "apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
        "metadata": {"name": "llm", "namespace": NS, "uid": "plan-uid", "resourceVersion": "1",
            "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": [FINALIZER]},
        "spec": {"rayServiceRef": {"name": "llm"}}
    }))
    .unwrap()
}

/// A RayService KubeRay has not created a cluster for yet: the decision is
/// `Pending` with the gate held, so one status write and one gate write.
fn service() -> Value {
    json!({
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": "llm", "namespace": NS, "uid": "svc-uid", "resourceVersion": "7"},
        "spec": {}
    })
}

fn context(client: Client, fence: Fence) -> Arc<Context> {
    context_with(client, fence, super::reservations::Shell::off())
}

fn context_with(
    client: Client,
    fence: Fence,
    reservations: super::reservations::Shell,
) -> Arc<Context> {
    let (plans, mut w) = reflector::store();
    w.apply_watcher_event(&WatchEvent::Apply(plan()));
    let (services, mut w) = reflector::store();
    w.apply_watcher_event(&WatchEvent::Apply(
        serde_json::from_value(service()).unwrap(),
    ));
    let stores = Stores {
        plans,
        services,
        clusters: reflector::store().0,
        capacity: Arc::new(std::sync::RwLock::new(crate::capacity::CapacityIndex::new())),
        pass: Default::default(),
        limit_ranges: reflector::store().0,
        runtime_classes: reflector::store().0,
    };
    let settings = Settings {
        namespaces: vec![],
        kuberay_version: None,
        incremental_gate: None,
        instance: "test".into(),
        operator: Default::default(),
        capacity: crate::autoscale::Defaults::default(),
        dra_plain_count: vec![],
        batch_window: std::time::Duration::ZERO,
        kueue: false,
        initial_lists: Default::default(),
    };
    Arc::new(Context::new(
        client,
        Arc::new(fence),
        stores,
        Arc::new(Metrics::new().unwrap()),
        settings.clone(),
        buffers::Shell::off(settings.capacity),
        reservations,
        Arc::new(latency::Causes::default()),
    ))
}

/// One request the mock apiserver answered: `METHOD path` and its body.
type Seen = Arc<StdMutex<Vec<(String, Value)>>>;

/// Answers every request until the client is gone: status writes with
/// `status_write`, reads of the plan and gate writes with the objects, and
/// anything else (Events) by echoing the body.
fn apiserver(status_write: StatusCode) -> (Client, Seen, tokio::task::JoinHandle<()>) {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen: Seen = Default::default();
    let log = seen.clone();
    let task = tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let line = format!("{} {}", req.method(), req.uri().path());
            let bytes = req.into_body().collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            log.lock().unwrap().push((line.clone(), body.clone()));
            let plan_path = format!("/apis/raygate.io/v1alpha1/namespaces/{NS}/upgradeplans/llm");
            let (code, answer) = if line == format!("PATCH {plan_path}/status") {
                if status_write == StatusCode::OK {
                    // The plan as written: the next version, with the status sent.
                    let mut written = serde_json::to_value(plan()).unwrap();
                    written["metadata"]["resourceVersion"] = json!("2");
                    written["status"] = body["status"].clone();
                    (StatusCode::OK, written)
                } else {
                    (
                        status_write,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "Conflict", "code": status_write.as_u16(),
                            "message": "the object has been modified"}),
                    )
                }
            } else if line == format!("GET {plan_path}") {
                (StatusCode::OK, serde_json::to_value(plan()).unwrap())
            } else if line.starts_with("PATCH /apis/ray.io/v1/") {
                (StatusCode::OK, service())
            } else {
                (StatusCode::CREATED, body)
            };
            let response = Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                .unwrap();
            send.send_response(response);
        }
    });
    (Client::new(mock, "default"), seen, task)
}

/// The `METHOD path` of every request the mock answered, in order.
fn requested(seen: &Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|(l, _)| l.clone())
        .collect()
}

#[tokio::test]
async fn the_status_is_written_before_the_gate() {
    let (client, seen, task) = apiserver(StatusCode::OK);
    let ctx = context(client, Fence::open());
    reconcile_plan(Arc::new(plan()), ctx.clone()).await.unwrap();
    task.abort();
    let seen = seen.lock().unwrap().clone();
    let lines: Vec<&str> = seen.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(
        lines,
        [
            "PATCH /apis/raygate.io/v1alpha1/namespaces/ml/upgradeplans/llm/status",
            "PATCH /apis/ray.io/v1/namespaces/ml/rayservices/llm",
        ],
        "the status records the decision first, then the gate acts on it"
    );
    assert_eq!(seen[0].1["status"]["phase"], "Pending");
    assert_eq!(seen[1].1["spec"]["upgradeStrategy"]["type"], "None");
    assert_eq!(seen[1].1["metadata"]["uid"], "svc-uid", "never a create");
}

#[tokio::test]
async fn a_reconcile_before_the_cache_shows_our_write_decides_on_that_write() {
    let (client, seen, task) = apiserver(StatusCode::OK);
    let ctx = context(client, Fence::open());
    reconcile_plan(Arc::new(plan()), ctx.clone()).await.unwrap();
    // Woken again (a node, a pod) while the cache still shows version 1:
    // decided on the written version 2, so nothing to write; not a 409,
    // a GET and a second decision.
    reconcile_plan(Arc::new(plan()), ctx.clone()).await.unwrap();
    task.abort();
    let lines = requested(&seen);
    assert_eq!(
        lines,
        [
            "PATCH /apis/raygate.io/v1alpha1/namespaces/ml/upgradeplans/llm/status",
            "PATCH /apis/ray.io/v1/namespaces/ml/rayservices/llm",
        ]
    );
}

#[tokio::test]
async fn a_conflict_on_the_status_write_writes_no_gate() {
    let (client, seen, task) = apiserver(StatusCode::CONFLICT);
    let ctx = context(client, Fence::open());
    let action = reconcile_plan(Arc::new(plan()), ctx.clone()).await.unwrap();
    task.abort();
    // Read again and decided again once, then left to a requeue: a decision
    // made on stale input is never applied.
    assert_eq!(action, Action::requeue(Duration::from_secs(1)));
    let lines = requested(&seen);
    assert_eq!(
        lines,
        [
            "PATCH /apis/raygate.io/v1alpha1/namespaces/ml/upgradeplans/llm/status",
            "GET /apis/raygate.io/v1alpha1/namespaces/ml/upgradeplans/llm",
            "PATCH /apis/raygate.io/v1alpha1/namespaces/ml/upgradeplans/llm/status",
        ]
    );
}

#[tokio::test]
async fn a_replica_without_the_lease_writes_nothing() {
    let (client, seen, task) = apiserver(StatusCode::OK);
    // Election on, no renewal confirmed: this replica does not lead.
    let ctx = context(client, Fence::closed(Duration::from_secs(10)));
    let err = reconcile_plan(Arc::new(plan()), ctx.clone()).await;
    assert!(matches!(err, Err(Error::Fenced(_))), "{err:?}");
    // Past the reconcile's own check, every write asks the fence again.
    let err = apply(&plan(), &ctx).await;
    assert!(matches!(err, Err(Error::Fenced(_))), "{err:?}");
    task.abort();
    assert!(
        seen.lock().unwrap().is_empty(),
        "not a write, not even a read"
    );
}

/// The RayService's Workloads as Kueue lists them: Kueue's own and, with the
/// same job uid label by mistake or not, one of raygate's reservations.
fn kueue_apiserver() -> (Client, Seen, tokio::task::JoinHandle<()>) {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen: Seen = Default::default();
    let log = seen.clone();
    let task = tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let line = format!("{} {}", req.method(), req.uri());
            log.lock().unwrap().push((line.clone(), Value::Null));
            let answer = if line
                .starts_with("GET /apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads?")
            {
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                    "metadata": {}, "items": [
                    {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                     "metadata": {"name": "rayservice-llm-7f2a", "namespace": NS,
                        "labels": {"kueue.x-k8s.io/job-uid": "svc-uid"}}},
                    {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                     "metadata": {"name": "llm-abc-quota", "namespace": NS,
                        "labels": {"kueue.x-k8s.io/job-uid": "svc-uid", "raygate.io/reservation": "quota"}}}]})
            } else if line.starts_with("PATCH ") {
                json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                    "metadata": {"name": "llm-abc-quota", "namespace": NS}, "spec": {"podSets": []}})
            } else {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})
            };
            let response = Response::builder()
                .status(StatusCode::OK)
                .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                .unwrap();
            send.send_response(response);
        }
    });
    (Client::new(mock, "default"), seen, task)
}

#[tokio::test]
async fn kueues_workload_of_the_service_is_deleted_once_per_pending_cluster_never_raygates() {
    use crate::upgradeplan::{QuotaReservation, QuotaStatus};
    let (client, seen, task) = kueue_apiserver();
    let ctx = context_with(client, Fence::open(), super::reservations::Shell::empty());
    let quota = |refreshed: Option<&str>| QuotaStatus {
        local_queue: "team-a".into(),
        reservation: Some(QuotaReservation {
            workload: "llm-abc-quota".into(),
            fingerprint: "abc".into(),
            granted: true,
        }),
        workload_refreshed_for: refreshed.map(Into::into),
        ..Default::default()
    };
    let decision = |refreshed: Option<&str>| admission::Decision {
        status: UpgradePlanStatus {
            ray_service_uid: Some("svc-uid".into()),
            quota: Some(quota(refreshed)),
            ..Default::default()
        },
        gate: None,
        events: vec![],
        outcome: None,
        requeue: Duration::from_secs(5),
        overridden_by: None,
        observed: Default::default(),
        capacity_objects: Default::default(),
    };
    let before = UpgradePlanStatus {
        quota: Some(quota(None)),
        ..Default::default()
    };
    super::reservations::refresh(&ctx, &plan(), &before, &decision(Some("llm-next"))).await;
    // Recorded already: nothing again. Not asked: nothing.
    let after = UpgradePlanStatus {
        quota: Some(quota(Some("llm-next"))),
        ..Default::default()
    };
    super::reservations::refresh(&ctx, &plan(), &after, &decision(Some("llm-next"))).await;
    super::reservations::refresh(&ctx, &plan(), &before, &decision(None)).await;
    task.abort();
    let lines = requested(&seen);
    assert_eq!(
        lines,
        [
            "GET /apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads?&labelSelector=kueue.x-k8s.io%2Fjob-uid%3Dsvc-uid",
            "DELETE /apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads/rayservice-llm-7f2a?",
        ]
    );
}

#[tokio::test]
async fn a_wanted_reservation_is_applied_then_marked_pods_ready_and_nothing_else_is_deleted() {
    let (client, seen, task) = kueue_apiserver();
    let ctx = context_with(client, Fence::open(), super::reservations::Shell::empty());
    let groups = [crate::podgroup::PodGroup::from(
        serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(json!({
            "metadata": {"labels": {"ray.io/node-type": "head", "ray.io/group": "headgroup"}},
            "spec": {"containers": [{"name": "ray-head"}]}}))
        .unwrap(),
    )];
    let w = crate::kueue::reservation::workload(
        &crate::kueue::reservation::Owner {
            namespace: NS,
            name: "llm",
            uid: "plan-uid",
        },
        "llm-abc-quota",
        &crate::kueue::LocalQueueName::new("team-a"),
        "abc",
        &groups,
        0,
    )
    .unwrap();
    super::reservations::act(&ctx, &plan(), Some(&w), Some("llm-abc-quota")).await;
    task.abort();
    let seen = seen.lock().unwrap().clone();
    let lines: Vec<&str> = seen.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with(
            "PATCH /apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads/llm-abc-quota?"
        ) && lines[0].contains("fieldManager=raygate"),
        "server-side apply under raygate's field manager: {}",
        lines[0]
    );
    assert!(
        lines[1].starts_with(
            "PATCH /apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads/llm-abc-quota/status?"
        ),
        "then PodsReady: {}",
        lines[1]
    );
}

/// Issue 32, item 5: a decision's Event is recorded regarding the plan (the
/// RayService related) and regarding the RayService (the plan related), so
/// `kubectl describe rayservice` shows it.
#[tokio::test]
async fn an_event_is_recorded_on_the_plan_and_on_the_rayservice() {
    let (client, seen, task) = apiserver(StatusCode::OK);
    let ctx = context(client, Fence::open());
    let note = admission::EventNote {
        warning: true,
        reason: admission::EventReason::WaitingForCapacity,
        note: "new cluster needs nvidia.com/gpu 16".into(),
        change: Some("abc123def456".into()),
    };
    publish(&ctx, &plan(), Some("llm"), &note).await;
    ctx.events.drained().await;
    task.abort();
    let seen = seen.lock().unwrap().clone();
    let events: Vec<&Value> = seen
        .iter()
        .filter(|(l, _)| l == "POST /apis/events.k8s.io/v1/namespaces/ml/events")
        .map(|(_, b)| b)
        .collect();
    let pairs: std::collections::BTreeSet<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["regarding"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                e["related"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        pairs,
        [
            ("RayService".to_string(), "UpgradePlan".to_string()),
            ("UpgradePlan".to_string(), "RayService".to_string()),
        ]
        .into_iter()
        .collect(),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .all(|e| e["reason"] == "WaitingForCapacity" && e["type"] == "Warning"),
        "{events:?}"
    );
}
