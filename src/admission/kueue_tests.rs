//! Rule 3 of [`super::rules`]: a suspended serving cluster and a change Kueue
//! would turn into a suspension are reported as what they are (issue 38,
//! case b: never `Idle`, never silent about an outage). From the objects, as
//! the controller and `kubectl raygate fit` build the inputs. Kueue's quota
//! (rule 4) is tested in `reservation`, its Workload refresh during a
//! transition (rule 2) in `transition`, on the fixtures here.

use super::objects::{ClusterObject, inputs};
use super::*;
use crate::capacity::ClusterState;
use crate::kuberay::{KubeRayVersion, RayCluster, RayService, Release};
use crate::upgradeplan::{Phase, UpgradePlanSpec, condition};
use serde_json::{Value, json};

mod reservation;
mod transition;

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
    v["metadata"]["uid"] = json!(UID);
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
    decide_over(p, svc, &[("llm-7x9kq", rc)], quota, pods)
}

/// Decides during a transition from the fixture's active cluster to
/// `pending` (`llm-next1`).
fn decide_in_transition(p: &UpgradePlan, svc: &RayService, pending: &RayCluster) -> Decision {
    let rc = active(|_| {});
    let clusters = [("llm-7x9kq", &rc), ("llm-next1", pending)];
    decide_over(p, svc, &clusters, None, BTreeMap::new())
}

/// KubeRay's pending cluster `llm-next1`: the RayService's cluster spec.
fn pending_cluster(svc: &RayService) -> RayCluster {
    let mut pending = serde_json::to_value(active(|_| {})).unwrap();
    pending["metadata"]["name"] = json!("llm-next1");
    pending["spec"] = serde_json::to_value(&svc.spec.ray_cluster_config).unwrap();
    serde_json::from_value(pending).unwrap()
}

/// Decides on these RayClusters (name, object) under KubeRay v1.6.2, as the
/// controller builds the inputs.
fn decide_over(
    p: &UpgradePlan,
    svc: &RayService,
    clusters: &[(&str, &RayCluster)],
    quota: Option<quota::QuotaFacts>,
    pods: BTreeMap<String, Vec<observed::PodRef>>,
) -> Decision {
    let st = state();
    let alone = fit::Alone(&st);
    let release = Release::assumed(KubeRayVersion::parse("1.6.2").unwrap());
    let clusters: Vec<ClusterObject<'_>> = clusters
        .iter()
        .map(|(name, rc)| ClusterObject {
            name: (*name).into(),
            cluster: Ok(*rc),
        })
        .collect();
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

/// The fixture's RayService's UID, as a status records it.
const UID: &str = "3f8a2c1e-5b7d-4c1a-9e0f-2d6b8a4c7e91";

/// The fingerprint raygate gives the change of `svc`, as first seen.
fn fingerprint_of(svc: &RayService) -> String {
    let d = decide_on(&plan(None), svc, &active(|_| {}));
    d.status.pending_change.unwrap().fingerprint.to_string()
}

/// A status with change `fp` admitted `secs` ago from the fixture's
/// cluster, KubeRay's new cluster `to` named or not yet.
fn admitted(phase: Phase, fp: &str, secs: i64, to: Option<&str>) -> UpgradePlanStatus {
    UpgradePlanStatus {
        phase,
        ray_service_uid: Some(UID.into()),
        admitted: Some(crate::upgradeplan::Admission {
            fingerprint: fp.into(),
            admitted_time: now() - jiff::SignedDuration::from_secs(secs),
            from_cluster: Some("llm-7x9kq".into()),
            to_cluster: to.map(Into::into),
            surge: vec![],
        }),
        ..Default::default()
    }
}

/// `status.quota` with raygate's reservation Workload of `fp` admitted by Kueue.
fn granted(fp: &str) -> crate::upgradeplan::QuotaStatus {
    crate::upgradeplan::QuotaStatus {
        local_queue: "team-a".into(),
        reservation: Some(crate::upgradeplan::QuotaReservation {
            workload: quota::reservation_name("llm-plan", fp),
            fingerprint: fp.into(),
            granted: true,
        }),
        ..Default::default()
    }
}

/// KubeRay builds `llm-next1` for the RayService (`UpgradeInProgress`).
fn upgrade_in_progress(v: &mut Value) {
    v["status"]["pendingServiceStatus"] = json!({"rayClusterName": "llm-next1"});
    v["status"]["conditions"] = json!([{"type": "UpgradeInProgress", "status": "True",
        "reason": "r", "message": "", "lastTransitionTime": "2026-12-07T05:00:00Z"}]);
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
