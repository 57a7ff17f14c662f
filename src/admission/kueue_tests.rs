//! Rule 3 of [`super::rules`]: a suspended serving cluster and a change Kueue
//! would turn into a suspension are reported as what they are (issue 38,
//! case b: never `Idle`, never silent about an outage). From the objects, as
//! the controller and `kubectl raygate fit` build the inputs.

use super::objects::{ClusterObject, inputs};
use super::*;
use crate::capacity::ClusterState;
use crate::kuberay::{KubeRayVersion, RayCluster, RayService, Release};
use crate::upgradeplan::{Phase, UpgradePlanSpec, condition};
use serde_json::{Value, json};

const SVC: &str = include_str!("../../tests/fixtures/rayservice-llm.yaml");
const ACTIVE: &str = include_str!("../../tests/fixtures/raycluster-llm-active.yaml");
const IMAGE: &str = "rayproject/ray-ml:2.42.0-py311-gpu";

fn now() -> Timestamp {
    "2026-12-07T06:00:00Z".parse().unwrap()
}

fn plan(status: Option<UpgradePlanStatus>) -> UpgradePlan {
    let spec: UpgradePlanSpec =
        serde_json::from_value(json!({"rayServiceRef": {"name": "llm"}})).unwrap();
    let mut p = UpgradePlan::new("llm-plan", spec);
    p.metadata.namespace = Some("ml".into());
    p.metadata.generation = Some(1);
    p.status = status;
    p
}

/// Room for the fixture's new cluster: a head node and a node of 32 GPUs.
fn state() -> ClusterState {
    let node = |name: &str, labels: Value, gpus: &str| {
        json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "labels": labels},
         "status": {"allocatable": {"cpu": "256", "memory": "2048Gi", "pods": "110",
             "nvidia.com/gpu": gpus},
             "conditions": [{"type": "Ready", "status": "True"}]}})
    };
    ClusterState::from_list(json!({"kind": "List", "apiVersion": "v1", "items": [
        node("cpu-0", json!({"node.kubernetes.io/instance-type": "m6i.2xlarge"}), "0"),
        node("gpu-0", json!({"nvidia.com/gpu.product": "NVIDIA-A10G"}), "32")]}))
    .unwrap()
}

/// The fixture's RayService, serving from the fixture's cluster, edited.
fn service(edit: impl FnOnce(&mut Value)) -> RayService {
    let mut v: Value = serde_saphyr::from_str(SVC).unwrap();
    v["metadata"]["uid"] = json!("3f8a2c1e-5b7d-4c1a-9e0f-2d6b8a4c7e91");
    v["status"] = json!({"activeServiceStatus": {"rayClusterName": "llm-7x9kq"}});
    edit(&mut v);
    serde_json::from_value(v).unwrap()
}

/// The fixture's active cluster, stamped by KubeRay v1.6.2 (a release whose
/// `suspend` toggle is applied in place), edited.
fn active(edit: impl FnOnce(&mut Value)) -> RayCluster {
    let mut v: Value = serde_saphyr::from_str(ACTIVE).unwrap();
    v["metadata"]["annotations"]["ray.io/kuberay-version"] = json!("v1.6.2");
    edit(&mut v);
    serde_json::from_value(v).unwrap()
}

fn kueue(v: &mut Value, elastic: bool) {
    v["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = json!("team-a");
    if elastic {
        v["metadata"]["annotations"] = json!({"kueue.x-k8s.io/elastic-job": "true"});
    }
}

fn worker_image(v: &mut Value) {
    v["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] =
        json!(IMAGE);
}

fn suspend(v: &mut Value) {
    v["spec"]["rayClusterConfig"]["suspend"] = json!(true);
}

fn decide_on(p: &UpgradePlan, svc: &RayService, rc: &RayCluster) -> Decision {
    decide_with_quota(p, svc, rc, None)
}

fn decide_with_quota(
    p: &UpgradePlan,
    svc: &RayService,
    rc: &RayCluster,
    quota: Option<quota::QuotaFacts>,
) -> Decision {
    decide_with_pods(p, svc, rc, quota, BTreeMap::new())
}

fn decide_with_pods(
    p: &UpgradePlan,
    svc: &RayService,
    rc: &RayCluster,
    quota: Option<quota::QuotaFacts>,
    pods: BTreeMap<String, Vec<observed::PodRef>>,
) -> Decision {
    let st = state();
    let alone = fit::Alone(&st);
    let release = Release::assumed(KubeRayVersion::parse("1.6.2").unwrap());
    let clusters = [ClusterObject {
        name: "llm-7x9kq".into(),
        cluster: Ok(rc),
    }];
    let mut inp = inputs(
        p,
        &Default::default(),
        &release,
        now(),
        false,
        &alone,
        Ok(svc),
        &clusters,
        pods,
    );
    inp.quota = quota;
    decide(&inp)
}

fn cond<'a>(
    d: &'a Decision,
    t: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    d.status.conditions.iter().find(|c| c.type_ == t)
}

#[test]
fn kueues_suspension_with_an_image_change_is_an_outage_not_idle() {
    // Case (b): Kueue set suspend on top of the user's image change; KubeRay
    // v1.6.2 is about to rewrite the serving cluster in place.
    let svc = service(|v| {
        kueue(v, false);
        worker_image(v);
        suspend(v);
    });
    let d = decide_on(&plan(None), &svc, &active(|_| {}));
    assert_eq!(d.status.phase, Phase::Suspended);
    assert_eq!(d.gate, Some(Gate::Hold));
    let msg = d.status.message.as_deref().unwrap();
    assert!(
        msg.contains("applied in place to the serving cluster: its pods are deleted (outage)")
            && msg.contains("spec.rayClusterConfig.suspend is set to true together with")
            && msg.contains("image")
            && msg.contains("LocalQueue team-a"),
        "{msg}"
    );
    let c = cond(&d, condition::SERVICE_SUSPENDED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "Suspending")
    );
    assert_eq!(cond(&d, condition::READY).unwrap().status, "False");
    assert_eq!(d.events.len(), 1);
    assert!(d.events[0].warning);
    assert_eq!(d.events[0].reason, "ServiceSuspended");

    // KubeRay rewrote the cluster: the spec equals it now, and it is still
    // no `Idle`; the same report is not an Event again.
    let rewritten = active(|v| {
        v["spec"]["suspend"] = json!(true);
        v["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] =
            json!(IMAGE);
    });
    let d1 = decide_on(&plan(Some(d.status.clone())), &svc, &rewritten);
    assert_eq!(d1.status.phase, Phase::Suspended);
    let c = cond(&d1, condition::SERVICE_SUSPENDED).unwrap();
    assert_eq!(c.reason, "ClusterSuspended");
    assert!(
        d1.status
            .message
            .as_deref()
            .unwrap()
            .contains("llm-7x9kq is suspended"),
        "{:?}",
        d1.status.message
    );
    assert_eq!(
        d1.events.len(),
        1,
        "a new state, one Event: {:?}",
        d1.events
    );
    let d2 = decide_on(&plan(Some(d1.status.clone())), &svc, &rewritten);
    assert!(d2.events.is_empty(), "{:?}", d2.events);

    // Resumed (suspend cleared and applied): the condition goes.
    let resumed = service(|v| {
        kueue(v, false);
        worker_image(v);
    });
    let running = active(|v| {
        v["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] =
            json!(IMAGE);
    });
    let d3 = decide_on(&plan(Some(d2.status.clone())), &resumed, &running);
    assert_eq!(d3.status.phase, Phase::Idle);
    assert!(cond(&d3, condition::SERVICE_SUSPENDED).is_none());
}

#[test]
fn a_user_setting_suspend_with_another_change_is_reported_too_without_kueue() {
    let svc = service(|v| {
        worker_image(v);
        suspend(v);
    });
    let d = decide_on(&plan(None), &svc, &active(|_| {}));
    assert_eq!(d.status.phase, Phase::Suspended);
    let msg = d.status.message.as_deref().unwrap();
    assert!(msg.contains("(outage)") && !msg.contains("Kueue"), "{msg}");
}

#[test]
fn a_cluster_change_kueue_would_suspend_is_held_with_its_reason_and_one_warning() {
    let svc = service(|v| {
        kueue(v, false);
        worker_image(v);
    });
    let d = decide_on(&plan(None), &svc, &active(|_| {}));
    assert_eq!(d.status.phase, Phase::Pending);
    assert_eq!(d.status.waiting_for.as_deref(), Some("KueueWouldSuspend"));
    assert_eq!(d.gate, Some(Gate::Hold));
    let msg = d.status.message.as_deref().unwrap();
    assert!(
        msg.contains("Kueue v0.19 turns a rayClusterConfig change of a RayService it manages (LocalQueue team-a) into a suspension")
            && msg.contains("an outage")
            && msg.contains("spec.rayClusterConfig.workerGroupSpecs[gpu-workers]")
            && msg.contains("docs/kueue.md"),
        "{msg}"
    );
    let c = cond(&d, condition::UPGRADE_ADMITTED).unwrap();
    assert_eq!(c.reason, "KueueWouldSuspend");
    assert_eq!(d.outcome, Some(Outcome::HeldPolicy));
    let warnings: Vec<_> = d.events.iter().filter(|e| e.warning).collect();
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].reason, "KueueWouldSuspend");
    let again = decide_on(&plan(Some(d.status.clone())), &svc, &active(|_| {}));
    assert!(again.events.is_empty(), "{:?}", again.events);

    // Elastic: Kueue does not suspend, but without raygate's Kueue support
    // (no `--kueue`) the new cluster's pods would stay gated: held, saying so.
    let elastic = service(|v| {
        kueue(v, true);
        worker_image(v);
    });
    let d = decide_on(&plan(None), &elastic, &active(|_| {}));
    assert_eq!(d.status.phase, Phase::Pending, "{:?}", d.status.message);
    assert_eq!(d.status.waiting_for.as_deref(), Some("KueueSupportOff"));
    assert!(d.status.message.as_deref().unwrap().contains("--kueue"));
    assert_eq!(d.gate, Some(Gate::Hold));
    // With it, the change goes on to the capacity step and the quota.
    let roomy = quota::QuotaFacts {
        queue: Ok(quota::QueueQuota {
            cluster_queue: cq("team-a", None, 100, 0),
            all: vec![cq("team-a", None, 100, 0)],
            uncounted: Default::default(),
        }),
        reservation: None,
        service_workload: None,
    };
    let d = decide_with_quota(&plan(None), &elastic, &active(|_| {}), Some(roomy));
    assert_eq!(d.status.waiting_for.as_deref(), Some("quota reservation"));
}

/// A ClusterQueue `name` of GPUs (and plenty of CPU and memory), `used` of
/// them reserved.
fn cq(name: &str, cohort: Option<&str>, gpus: i64, used: i64) -> crate::kueue::types::ClusterQueue {
    serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {"cohortName": cohort, "resourceGroups": [{
            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
            "flavors": [{"name": "default", "resources": [
                {"name": "cpu", "nominalQuota": "1000"},
                {"name": "memory", "nominalQuota": "10Ti"},
                {"name": "nvidia.com/gpu", "nominalQuota": gpus.to_string()}]}]}]},
        "status": {"flavorsReservation": [{"name": "default", "resources": [
            {"name": "nvidia.com/gpu", "total": used.to_string()}]}]}
    }))
    .unwrap()
}

fn facts(
    all: Vec<crate::kueue::types::ClusterQueue>,
    reservation: Option<crate::upgradeplan::QuotaReservation>,
) -> quota::QuotaFacts {
    quota::QuotaFacts {
        queue: Ok(quota::QueueQuota {
            cluster_queue: all[0].clone(),
            all,
            uncounted: Default::default(),
        }),
        reservation,
        service_workload: None,
    }
}

#[test]
fn a_kueue_managed_change_waits_for_quota_then_for_its_reservation_then_is_admitted() {
    let svc = service(|v| {
        kueue(v, true);
        worker_image(v);
    });
    let rc = active(|_| {});
    // The serving cluster holds the queue's 8 GPUs: nothing left for the new one.
    let d = decide_with_quota(
        &plan(None),
        &svc,
        &rc,
        Some(facts(vec![cq("team-a", None, 8, 8)], None)),
    );
    assert_eq!(
        d.status.phase,
        Phase::WaitingForQuota,
        "{:?}",
        d.status.message
    );
    assert_eq!(d.gate, Some(Gate::Hold));
    let w = d.status.waiting_for.as_deref().unwrap();
    assert!(
        w.starts_with("quota: nvidia.com/gpu ") && w.ends_with("> 0 left"),
        "{w}"
    );
    let q = d.status.quota.as_ref().unwrap();
    assert_eq!(
        (q.local_queue.as_str(), q.cluster_queue.as_deref()),
        ("team-a", Some("team-a"))
    );
    assert_eq!(q.gpus_left.as_deref(), Some("0"));
    assert!(q.reservation.is_none(), "nothing reserved while short");
    let msg = d.status.message.as_deref().unwrap();
    assert!(
        msg.contains("fits the nodes but not the quota of ClusterQueue team-a"),
        "{msg}"
    );
    assert_eq!(
        cond(&d, condition::QUOTA_AVAILABLE).unwrap().reason,
        "InsufficientQuota"
    );
    assert_eq!(d.outcome, Some(Outcome::HeldCapacity));
    let warn: Vec<_> = d
        .events
        .iter()
        .filter(|e| e.reason == "WaitingForQuota")
        .collect();
    assert_eq!(warn.len(), 1);
    let again = decide_with_quota(
        &plan(Some(d.status.clone())),
        &svc,
        &rc,
        Some(facts(vec![cq("team-a", None, 8, 8)], None)),
    );
    assert!(again.events.is_empty(), "{:?}", again.events);
    // The numbers moving are no news either.
    let moved = decide_with_quota(
        &plan(Some(d.status.clone())),
        &svc,
        &rc,
        Some(facts(vec![cq("team-a", None, 9, 8)], None)),
    );
    assert_ne!(moved.status.waiting_for, d.status.waiting_for);
    assert!(moved.events.is_empty(), "{:?}", moved.events);

    // team-b in the cohort lends its idle 16: it fits; raygate reserves it first.
    let all = vec![
        cq("team-a", Some("ml"), 8, 8),
        cq("team-b", Some("ml"), 16, 0),
    ];
    let d = decide_with_quota(&plan(None), &svc, &rc, Some(facts(all.clone(), None)));
    assert_eq!(d.status.phase, Phase::WaitingForQuota);
    assert_eq!(d.status.waiting_for.as_deref(), Some("quota reservation"));
    let q = d.status.quota.as_ref().unwrap();
    let r = q.reservation.clone().unwrap();
    assert_eq!(
        r.workload,
        quota::reservation_name("llm-plan", &r.fingerprint)
    );
    assert!(!r.granted);
    assert_eq!(q.cohort.as_deref(), Some("ml"));
    assert_eq!(
        cond(&d, condition::QUOTA_AVAILABLE).unwrap().reason,
        "QuotaPending"
    );

    // Kueue admitted the reservation: the gate opens, the reservation stays.
    let granted = crate::upgradeplan::QuotaReservation {
        granted: true,
        ..r.clone()
    };
    let d = decide_with_quota(
        &plan(Some(d.status.clone())),
        &svc,
        &rc,
        Some(facts(all.clone(), Some(granted.clone()))),
    );
    assert_eq!(d.status.phase, Phase::Admitted, "{:?}", d.status.message);
    assert_eq!(d.gate, Some(Gate::Open));
    assert_eq!(
        d.status.quota.as_ref().unwrap().reservation,
        Some(granted.clone())
    );
    // Tracked: still held.
    let d = decide_with_quota(
        &plan(Some(d.status.clone())),
        &svc,
        &rc,
        Some(facts(all, Some(granted.clone()))),
    );
    assert_eq!(d.status.phase, Phase::Admitted);
    assert_eq!(d.status.quota.as_ref().unwrap().reservation, Some(granted));

    // Withdrawn (the spec went back): no reservation is wanted any more.
    let back = service(|v| kueue(v, true));
    let d = decide_with_quota(
        &plan(Some(d.status.clone())),
        &back,
        &rc,
        Some(facts(vec![cq("team-a", None, 8, 8)], None)),
    );
    assert_eq!(d.status.phase, Phase::Idle);
    assert!(d.status.quota.is_none());
    assert!(cond(&d, condition::QUOTA_AVAILABLE).is_none());

    // Kueue's objects cannot be read: held, never admitted on a guess.
    let unread = quota::QuotaFacts {
        queue: Err("LocalQueue ml/team-a not found".into()),
        reservation: None,
        service_workload: None,
    };
    let d = decide_with_quota(&plan(None), &svc, &rc, Some(unread));
    assert_eq!(
        (d.status.phase, d.status.waiting_for.as_deref()),
        (Phase::WaitingForQuota, Some("quota unknown"))
    );
    assert!(
        d.status
            .message
            .as_deref()
            .unwrap()
            .contains("LocalQueue ml/team-a not found")
    );
}

#[test]
fn an_elastic_transition_has_kueue_derive_the_services_workload_again_once_upgrading() {
    let fp = "0123456789ab";
    let status = UpgradePlanStatus {
        phase: Phase::Upgrading,
        ray_service_uid: Some("3f8a2c1e-5b7d-4c1a-9e0f-2d6b8a4c7e91".into()),
        admitted: Some(crate::upgradeplan::Admission {
            fingerprint: fp.into(),
            admitted_time: now() - jiff::SignedDuration::from_secs(30),
            from_cluster: Some("llm-7x9kq".into()),
            to_cluster: Some("llm-next1".into()),
            surge: vec![],
        }),
        quota: Some(crate::upgradeplan::QuotaStatus {
            local_queue: "team-a".into(),
            reservation: Some(crate::upgradeplan::QuotaReservation {
                workload: quota::reservation_name("llm-plan", fp),
                fingerprint: fp.into(),
                granted: true,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let svc = |elastic: bool, in_progress: bool| {
        service(|v| {
            kueue(v, elastic);
            worker_image(v);
            v["status"]["pendingServiceStatus"] = json!({"rayClusterName": "llm-next1"});
            if in_progress {
                v["status"]["conditions"] = json!([{"type": "UpgradeInProgress", "status": "True",
                    "reason": "r", "message": "", "lastTransitionTime": "2026-12-07T05:00:00Z"}]);
            }
        })
    };
    // The pending cluster's pods, as KubeRay makes them and Kueue's
    // elastic-job gate holds them (unbound).
    let pod = |node_type: &str, bound: bool| -> observed::PodRef {
        let mut v = json!({"metadata": {"name": format!("llm-next1-{node_type}"),
            "labels": {"ray.io/node-type": node_type, "ray.io/group": "g"}},
            "spec": {"containers": [{"name": "ray"}]}});
        if bound {
            v["spec"]["nodeName"] = json!("gpu-1");
        }
        std::sync::Arc::new(serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(v).unwrap())
    };
    let gated = || vec![pod("head", false), pod("worker", false)];
    let refreshed_with = |s: &RayService, st: &UpgradePlanStatus, pods: Vec<observed::PodRef>| {
        let d = decide_with_pods(
            &plan(Some(st.clone())),
            s,
            &active(|_| {}),
            None,
            BTreeMap::from([("llm-next1".to_string(), pods)]),
        );
        assert_eq!(d.status.phase, Phase::Upgrading, "{:?}", d.status.message);
        let q = d.status.quota.clone().unwrap();
        assert!(
            q.reservation.is_some_and(|r| r.granted),
            "kept while the transition runs"
        );
        q.workload_refreshed_for
    };
    let refreshed = |s: &RayService| refreshed_with(s, &status, gated());
    assert_eq!(refreshed(&svc(true, true)).as_deref(), Some("llm-next1"));
    // Not before KubeRay made the pending cluster's pods, nor while one of
    // them is bound (not held by Kueue's gate), nor in the first seconds of
    // the transition: measured, a Workload deleted in the instant KubeRay
    // created the cluster left it suspended for 5 minutes.
    let upgrading = svc(true, true);
    assert_eq!(refreshed_with(&upgrading, &status, vec![]), None);
    assert_eq!(
        refreshed_with(&upgrading, &status, vec![pod("worker", false)]),
        None,
        "no head pod yet"
    );
    assert_eq!(
        refreshed_with(
            &upgrading,
            &status,
            vec![pod("head", true), pod("worker", false)]
        ),
        None,
        "a bound pod is not gated"
    );
    let mut fresh = status.clone();
    if let Some(a) = fresh.admitted.as_mut() {
        a.admitted_time = now() - jiff::SignedDuration::from_secs(3);
    }
    assert_eq!(
        refreshed_with(&upgrading, &fresh, gated()),
        None,
        "settling"
    );
    // Never without UpgradeInProgress (the active cluster would be suspended),
    // nor for a RayService Kueue suspends on a change anyway.
    assert_eq!(refreshed(&svc(true, false)), None);
    assert_eq!(refreshed(&svc(false, true)), None);
}

#[test]
fn kueues_transient_suspend_during_the_workload_refresh_is_no_admission_mismatch() {
    // Measured with Kueue v0.19.0 (raygate's own refresh of the service's
    // Workload): in one sample the RayService and the pending cluster KubeRay
    // just built both carried Kueue's `suspend: true`. That is the admitted
    // change, not another one: no AdmissionMismatch, the admission kept.
    let changed = |extra: &dyn Fn(&mut Value)| {
        service(|v| {
            kueue(v, true);
            worker_image(v);
            extra(v);
        })
    };
    // The admitted change: the image bump, as raygate fingerprinted it.
    let d = decide_on(&plan(None), &changed(&|_| {}), &active(|_| {}));
    let fp = d
        .status
        .pending_change
        .as_ref()
        .unwrap()
        .fingerprint
        .clone();
    let status = UpgradePlanStatus {
        phase: Phase::Admitted,
        ray_service_uid: Some("3f8a2c1e-5b7d-4c1a-9e0f-2d6b8a4c7e91".into()),
        admitted: Some(crate::upgradeplan::Admission {
            fingerprint: fp.clone(),
            admitted_time: now() - jiff::SignedDuration::from_secs(2),
            from_cluster: Some("llm-7x9kq".into()),
            to_cluster: None,
            surge: vec![],
        }),
        ..Default::default()
    };
    for suspended in [false, true] {
        let svc = changed(&|v: &mut Value| {
            if suspended {
                suspend(v);
            }
            v["status"]["pendingServiceStatus"] = json!({"rayClusterName": "llm-next1"});
            v["status"]["conditions"] = json!([{"type": "UpgradeInProgress", "status": "True",
                "reason": "r", "message": "", "lastTransitionTime": "2026-12-07T05:00:00Z"}]);
        });
        // KubeRay's pending cluster: the RayService's cluster spec (with
        // the suspension KubeRay copies to the pending cluster).
        let mut pending = serde_json::to_value(active(|_| {})).unwrap();
        pending["metadata"]["name"] = json!("llm-next1");
        pending["spec"] = serde_json::to_value(&svc.spec.ray_cluster_config).unwrap();
        let pending: RayCluster = serde_json::from_value(pending).unwrap();
        let rc = active(|_| {});
        let st = state();
        let alone = fit::Alone(&st);
        let release = Release::assumed(KubeRayVersion::parse("1.6.2").unwrap());
        let clusters = [
            ClusterObject {
                name: "llm-7x9kq".into(),
                cluster: Ok(&rc),
            },
            ClusterObject {
                name: "llm-next1".into(),
                cluster: Ok(&pending),
            },
        ];
        let p = plan(Some(status.clone()));
        let inp = inputs(
            &p,
            &Default::default(),
            &release,
            now(),
            false,
            &alone,
            Ok(&svc),
            &clusters,
            BTreeMap::new(),
        );
        let d = decide(&inp);
        assert!(
            d.events.iter().all(|e| e.reason != "AdmissionMismatch"),
            "suspend {suspended}: {:?}",
            d.events
        );
        let a = d.status.admitted.as_ref().unwrap();
        assert_eq!(
            (a.fingerprint.as_str(), a.to_cluster.as_deref()),
            (fp.as_str(), Some("llm-next1")),
            "suspend {suspended}"
        );
        assert_eq!(d.status.phase, Phase::Upgrading, "suspend {suspended}");
    }
}

#[test]
fn kueues_template_rewrite_at_the_workload_refresh_is_no_change_made_during_the_transition() {
    // Measured with Kueue v0.19.0 (raygate's refresh of the elastic
    // service's Workload, path B): Kueue's stop and restart rewrote the pod
    // templates' `kueue.x-k8s.io/workload` and `…/workload-slice-name` (and
    // `suspend`) on the RayService; against the pending cluster, built
    // before, raygate read a change "made while the transition runs" (a
    // false Batching Event). It is the admitted change: no Event.
    let writes = |v: &mut Value, wl: &str| {
        for ptr in [
            "/spec/rayClusterConfig/headGroupSpec/template",
            "/spec/rayClusterConfig/workerGroupSpecs/0/template",
        ] {
            let t = v.pointer_mut(ptr).unwrap();
            t["metadata"]["annotations"]["kueue.x-k8s.io/workload"] = json!(wl);
            t["metadata"]["annotations"]["kueue.x-k8s.io/workload-slice-name"] = json!(wl);
            t["metadata"]["labels"]["kueue.x-k8s.io/podset"] = json!("p");
        }
        // The ResourceFlavor's node labels, written at admission too.
        v["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]
            ["pool.example/flavor"] = json!("a100");
    };
    let admitted_svc = service(|v| {
        kueue(v, true);
        worker_image(v);
        writes(v, "rayservice-llm-1a2b3");
    });
    let d = decide_on(&plan(None), &admitted_svc, &active(|_| {}));
    let fp = d
        .status
        .pending_change
        .as_ref()
        .unwrap()
        .fingerprint
        .clone();
    let status = UpgradePlanStatus {
        phase: Phase::Upgrading,
        ray_service_uid: Some("3f8a2c1e-5b7d-4c1a-9e0f-2d6b8a4c7e91".into()),
        admitted: Some(crate::upgradeplan::Admission {
            fingerprint: fp.clone(),
            admitted_time: now() - jiff::SignedDuration::from_secs(20),
            from_cluster: Some("llm-7x9kq".into()),
            to_cluster: Some("llm-next1".into()),
            surge: vec![],
        }),
        ..Default::default()
    };
    // KubeRay's pending cluster: the spec as admitted (the old Workload's names).
    let mut pending = serde_json::to_value(active(|_| {})).unwrap();
    pending["metadata"]["name"] = json!("llm-next1");
    pending["spec"] = serde_json::to_value(&admitted_svc.spec.ray_cluster_config).unwrap();
    let pending: RayCluster = serde_json::from_value(pending).unwrap();
    // Kueue's stop (templates restored, suspended), then its restart (the
    // re-derived Workload's names).
    let stopped = |v: &mut Value| {
        // Kueue's restore puts back the Workload's templates: the user's
        // own metadata, without Kueue's.
        let original: Value = serde_saphyr::from_str(SVC).unwrap();
        for ptr in [
            "/spec/rayClusterConfig/headGroupSpec/template/metadata",
            "/spec/rayClusterConfig/workerGroupSpecs/0/template/metadata",
        ] {
            *v.pointer_mut(ptr).unwrap() =
                original.pointer(ptr).cloned().unwrap_or_else(|| json!({}));
        }
        // …and its nodeSelector: without the flavor's labels while stopped.
        let ns = "/spec/rayClusterConfig/workerGroupSpecs/0/template/spec/nodeSelector";
        *v.pointer_mut(ns).unwrap() = original.pointer(ns).cloned().unwrap();
        suspend(v);
    };
    let restarted = |v: &mut Value| writes(v, "rayservice-llm-9z8y7");
    for (what, edit) in [
        ("stopped", &stopped as &dyn Fn(&mut Value)),
        ("restarted", &restarted),
    ] {
        let svc = service(|v| {
            kueue(v, true);
            worker_image(v);
            writes(v, "rayservice-llm-1a2b3");
            edit(v);
            v["status"]["pendingServiceStatus"] = json!({"rayClusterName": "llm-next1"});
            v["status"]["conditions"] = json!([{"type": "UpgradeInProgress", "status": "True",
                "reason": "r", "message": "", "lastTransitionTime": "2026-12-07T05:00:00Z"}]);
        });
        let rc = active(|_| {});
        let st = state();
        let alone = fit::Alone(&st);
        let release = Release::assumed(KubeRayVersion::parse("1.6.2").unwrap());
        let clusters = [
            ClusterObject {
                name: "llm-7x9kq".into(),
                cluster: Ok(&rc),
            },
            ClusterObject {
                name: "llm-next1".into(),
                cluster: Ok(&pending),
            },
        ];
        let p = plan(Some(status.clone()));
        let inp = inputs(
            &p,
            &Default::default(),
            &release,
            now(),
            false,
            &alone,
            Ok(&svc),
            &clusters,
            BTreeMap::new(),
        );
        let d = decide(&inp);
        assert!(
            d.events
                .iter()
                .all(|e| e.reason != EventReason::Batching
                    && e.reason != EventReason::AdmissionMismatch),
            "{what}: {:?}",
            d.events
        );
        assert_eq!(d.status.batch, None, "{what}");
        assert_eq!(d.status.phase, Phase::Upgrading, "{what}");
        assert_eq!(
            d.status.admitted.as_ref().map(|a| a.fingerprint.as_str()),
            Some(fp.as_str()),
            "{what}"
        );
    }
}

#[test]
fn a_blocked_workload_refresh_is_reported_as_kueue_workload_pending_then_stalled() {
    // Measured with Kueue v0.19.0 (the cohort e2e test holds the LocalQueue
    // across raygate's refresh, path B): Kueue's re-derived Workload of the
    // RayService stays pending, the new cluster suspended, while raygate
    // said "Upgrading, waiting for new cluster, transition is progressing".
    let changed = service(|v| {
        kueue(v, true);
        worker_image(v);
    });
    let first = decide_on(&plan(None), &changed, &active(|_| {}));
    let fp = first
        .status
        .pending_change
        .as_ref()
        .unwrap()
        .fingerprint
        .clone();
    let fp = fp.as_str();
    let status = |refreshed: Option<&str>, since: i64, waiting: Option<&str>| UpgradePlanStatus {
        phase: Phase::Upgrading,
        waiting_for: waiting.map(str::to_string),
        ray_service_uid: Some("3f8a2c1e-5b7d-4c1a-9e0f-2d6b8a4c7e91".into()),
        admitted: Some(crate::upgradeplan::Admission {
            fingerprint: fp.into(),
            admitted_time: now() - jiff::SignedDuration::from_secs(since),
            from_cluster: Some("llm-7x9kq".into()),
            to_cluster: Some("llm-next1".into()),
            surge: vec![],
        }),
        quota: Some(crate::upgradeplan::QuotaStatus {
            local_queue: "team-a".into(),
            reservation: Some(crate::upgradeplan::QuotaReservation {
                workload: quota::reservation_name("llm-plan", fp),
                fingerprint: fp.into(),
                granted: true,
            }),
            workload_refreshed_for: refreshed.map(str::to_string),
            ..Default::default()
        }),
        ..Default::default()
    };
    let svc = service(|v| {
        kueue(v, true);
        worker_image(v);
        v["status"]["pendingServiceStatus"] = json!({"rayClusterName": "llm-next1"});
        v["status"]["conditions"] = json!([{"type": "UpgradeInProgress", "status": "True",
            "reason": "r", "message": "", "lastTransitionTime": "2026-12-07T05:00:00Z"}]);
    });
    // Kueue's Workloads of the RayService as listed: the old one being
    // deleted, the re-derived one pending.
    let wl = |name: &str, deleting: bool, reserved: Option<(&str, &str)>| {
        let mut v = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": "ml"}, "spec": {"podSets": []}});
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-12-07T05:59:59Z");
            v["status"] = json!({"conditions": [{"type": "QuotaReserved", "status": "True",
                "reason": "QuotaReserved", "message": "", "lastTransitionTime": "2026-12-07T05:00:00Z"}]});
        }
        if let Some((status, reason)) = reserved {
            v["status"] = json!({"conditions": [{"type": "QuotaReserved", "status": status,
                "reason": reason, "message": if status == "False" { "LocalQueue team-a is stopped" } else { "" },
                "lastTransitionTime": "2026-12-07T05:59:59Z"}]});
        }
        serde_json::from_value::<crate::kueue::types::Workload>(v).unwrap()
    };
    let pending = quota::ServiceWorkload::of(&[
        wl("rayservice-llm-old", true, None),
        wl("rayservice-llm-new", false, Some(("False", "Inadmissible"))),
    ])
    .unwrap();
    assert_eq!(
        pending,
        quota::ServiceWorkload {
            name: "rayservice-llm-new".into(),
            admitted: false,
            why: Some("Inadmissible: LocalQueue team-a is stopped".into()),
        }
    );
    let admitted = quota::ServiceWorkload::of(&[wl(
        "rayservice-llm-new",
        false,
        Some(("True", "QuotaReserved")),
    )])
    .unwrap();
    assert!(admitted.admitted);
    assert_eq!(quota::ServiceWorkload::of(&[wl("x", true, None)]), None);

    let decide_for = |st: UpgradePlanStatus, w: &quota::ServiceWorkload| {
        let mut f = facts(vec![cq("team-a", None, 16, 16)], None);
        f.service_workload = Some(w.clone());
        decide_with_quota(&plan(Some(st)), &svc, &active(|_| {}), Some(f))
    };
    // Blocked: said so, with Kueue's words, one Warning Event.
    let d = decide_for(status(Some("llm-next1"), 30, Some("new cluster")), &pending);
    assert_eq!(d.status.phase, Phase::Upgrading);
    assert_eq!(
        d.status.waiting_for.as_deref(),
        Some("KueueWorkloadPending")
    );
    let c = cond(&d, condition::STALLED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "KueueWorkloadPending")
    );
    assert!(
        c.message.contains("Workload rayservice-llm-new")
            && c.message.contains("LocalQueue team-a is stopped")
            && c.message.contains("llm-next1 stays suspended"),
        "{}",
        c.message
    );
    let warned: Vec<_> = d
        .events
        .iter()
        .filter(|e| e.reason == EventReason::KueueWorkloadPending)
        .collect();
    assert!(warned.len() == 1 && warned[0].warning, "{:?}", d.events);
    assert_eq!(d.gate, Some(Gate::Hold));
    // Once: the next decision says it again, without an Event.
    let d = decide_for(
        status(Some("llm-next1"), 40, Some("KueueWorkloadPending")),
        &pending,
    );
    assert_eq!(
        d.status.waiting_for.as_deref(),
        Some("KueueWorkloadPending")
    );
    assert!(d.events.is_empty(), "{:?}", d.events);
    // After stallAfter: Stalled, with the same reason.
    let d = decide_for(
        status(Some("llm-next1"), 36_000, Some("KueueWorkloadPending")),
        &pending,
    );
    assert_eq!(d.status.phase, Phase::Stalled);
    let c = cond(&d, condition::STALLED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "KueueWorkloadPending")
    );
    assert!(d.events.iter().any(|e| e.reason == EventReason::Stalled));
    // Admitted, not looked at by Kueue yet, or no refresh done yet for this
    // pending cluster: progressing.
    let fresh = quota::ServiceWorkload::of(&[wl("rayservice-llm-new", false, None)]).unwrap();
    assert_eq!((fresh.admitted, fresh.why.as_deref()), (false, None));
    for (refreshed, w) in [
        (Some("llm-next1"), &admitted),
        (Some("llm-next1"), &fresh),
        (None, &pending),
        (Some("llm-older"), &pending),
    ] {
        let d = decide_for(status(refreshed, 30, Some("new cluster")), w);
        assert_eq!(
            (d.status.phase, d.status.waiting_for.as_deref()),
            (Phase::Upgrading, Some("new cluster")),
            "{refreshed:?} {w:?}"
        );
        let c = cond(&d, condition::STALLED).unwrap();
        assert_eq!(c.reason, "Progressing");
    }
}
