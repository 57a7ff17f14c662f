//! Decisions for plans with `spec.upgradeType: NewClusterWithIncrementalUpgrade`.

use super::surge::{self, Surge};
use super::*;
use crate::capacity::{ClusterState, PodGroup};
use crate::kuberay::incremental::{GroupBounds, Options, Problem};
use crate::kuberay::{KubeRayVersion, Release};
use crate::upgradeplan::{Admission, IncrementalStatus, Phase, UpgradePlanSpec};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn plan(upgrade_type: &str, status: Option<UpgradePlanStatus>) -> UpgradePlan {
    let spec: UpgradePlanSpec = serde_json::from_value(json!({
        "rayServiceRef": {"name": "llm"}, "stallAfter": "10m", "upgradeType": upgrade_type
    }))
    .unwrap();
    let mut p = UpgradePlan::new("llm-plan", spec);
    p.metadata.namespace = Some("ml".into());
    p.status = status;
    p
}

fn pod(name: &str, node_type: &str, gpus: u32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml",
            "labels": {"ray.io/node-type": node_type, "ray.io/group": if node_type == "head" { "headgroup" } else { "gpu" }}},
        "spec": {"containers": [{"name": "ray", "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
    }))
    .unwrap()
}

use super::tests::state as nodes;

fn opts() -> Options {
    Options {
        max_surge_percent: 25,
        step_size_percent: 25,
        interval_seconds: 30,
    }
}

/// A new cluster of 4 × 8-GPU workers next to an active one of 4 such
/// workers: the surge is the head and min 0 + ceil(25 % × 4) = 1 worker.
fn change(incremental: bool) -> ChangeFacts {
    let full = vec![
        PodGroup::from(pod("llm-next-head", "head", 0)),
        PodGroup::indexed(
            pod("llm-next-gpu-worker-0", "worker", 8),
            4,
            "llm-next-gpu-worker-".into(),
        ),
    ];
    let active: Vec<Pod> = (0..4)
        .map(|i| pod(&format!("llm-a-w{i}"), "worker", 8))
        .collect();
    let refs: Vec<&Pod> = active.iter().collect();
    let bounds = vec![(
        "gpu".to_string(),
        GroupBounds {
            min_pods: 0,
            max_pods: 8,
        },
    )];
    let surge: Option<Surge> = incremental.then(|| {
        surge::plan(
            &full,
            &bounds,
            &surge::active_groups(&refs, &[]).unwrap(),
            &opts(),
            &[],
        )
        .unwrap()
    });
    ChangeFacts {
        fingerprint: "abc123def456".into(),
        triggering_paths: vec!["workerGroupSpecs[gpu].template.spec.containers[ray].image".into()],
        new_pods: full,
        surge,
    }
}

struct Case {
    plan: UpgradePlan,
    svc: ServiceFacts,
    change: Option<ChangeFacts>,
    incremental: Option<Result<Options, Problem>>,
    now: Timestamp,
}

fn decide_on(c: &Case, st: &ClusterState) -> Decision {
    decide(&inputs(c, st))
}

fn inputs<'a>(c: &'a Case, st: &'a ClusterState) -> Inputs<'a> {
    Inputs {
        now: c.now,
        plan: &c.plan,
        settings: Settings::of(&c.plan),
        release: Release::assumed(KubeRayVersion::parse("1.6.2").unwrap()),
        service: Ok(c.svc.clone()),
        change: Ok(c.change.clone()),
        verdict: Some(Verdict::NewCluster),
        incremental: c.incremental.clone(),
        clusters: ["llm-a".to_string(), "llm-b".to_string()].into(),
        pods: BTreeMap::new(),
        pending_ready: false,
        pending_fingerprint: Some("abc123def456".into()),
        gate: GateFacts::default(),
        admission_unseen: false,
        quota: None,
        capacity_request: None,
        cluster: Box::leak(Box::new(fit::Alone(st))),
    }
}

fn active_only() -> ServiceFacts {
    ServiceFacts {
        active_cluster: Some("llm-a".into()),
        ..Default::default()
    }
}

#[test]
fn a_surge_that_fits_is_admitted_where_a_new_cluster_is_held() {
    // 16 GPUs free: the whole new cluster (32) does not fit, its surge (8) does.
    let st = nodes(&[8, 8]);
    let inc = Case {
        plan: plan("NewClusterWithIncrementalUpgrade", None),
        svc: active_only(),
        change: Some(change(true)),
        incremental: Some(Ok(opts())),
        now: at("2026-12-02T12:00:00Z"),
    };
    let d = decide_on(&inc, &st);
    assert_eq!(d.status.phase, Phase::Admitted, "{:?}", d.status.message);
    assert_eq!(d.gate, Some(Gate::OpenIncremental));
    assert_eq!(
        d.gate.unwrap().strategy(),
        "NewClusterWithIncrementalUpgrade"
    );
    let adm = d.status.admitted.as_ref().unwrap();
    assert_eq!(adm.surge.len(), 2);
    let status = d.status.incremental.as_ref().unwrap();
    assert_eq!(
        (status.max_surge_percent, status.step_size_percent),
        (25, 25)
    );
    assert_eq!(status.surge_held["nvidia.com/gpu"], "8");
    assert_eq!(
        d.status.capacity.as_ref().unwrap().gpus_needed.as_deref(),
        Some("8")
    );

    let blue_green = Case {
        plan: plan("NewCluster", None),
        change: Some(change(false)),
        incremental: None,
        ..inc
    };
    let d = decide_on(&blue_green, &st);
    assert_eq!(d.status.phase, Phase::WaitingForCapacity);
    assert_eq!(d.gate, Some(Gate::Hold));
    assert_eq!(
        d.status.capacity.as_ref().unwrap().gpus_short.as_deref(),
        Some("16")
    );
}

#[test]
fn the_gate_closes_once_the_new_cluster_is_promoted() {
    let mut status = upgrading("2026-12-02T11:40:00Z", "2026-12-02T11:59:00Z");
    if let Some(a) = status.admitted.as_mut() {
        a.to_cluster = Some("llm-b".into());
    }
    let mut c = Case {
        plan: plan("NewClusterWithIncrementalUpgrade", Some(status)),
        svc: ServiceFacts {
            active_cluster: Some("llm-b".into()),
            ..Default::default()
        },
        change: None,
        incremental: Some(Ok(opts())),
        now: at("2026-12-02T12:00:00Z"),
    };
    let d = decide_on(&c, &nodes(&[64]));
    // llm-a still exists in `clusters`: waiting for its deletion, gate closed.
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::Upgrading, Some(Gate::Hold))
    );
    c.plan.status = Some(d.status);
    let st = nodes(&[64]);
    let d = decide(&Inputs {
        clusters: ["llm-b".to_string()].into(),
        ..inputs(&c, &st)
    });
    assert_eq!(
        (d.status.phase, d.gate),
        (Phase::Completed, Some(Gate::Hold))
    );
}

#[test]
fn a_surge_that_does_not_fit_is_held() {
    let d = decide_on(
        &Case {
            plan: plan("NewClusterWithIncrementalUpgrade", None),
            svc: active_only(),
            change: Some(change(true)),
            incremental: Some(Ok(opts())),
            now: at("2026-12-02T12:00:00Z"),
        },
        &nodes(&[4]),
    );
    assert_eq!(d.status.phase, Phase::WaitingForCapacity);
    assert_eq!(d.gate, Some(Gate::Hold));
    assert_eq!(
        d.status.capacity.as_ref().unwrap().gpus_short.as_deref(),
        Some("4")
    );
}

#[test]
fn a_release_or_rayservice_that_cannot_upgrade_incrementally_is_an_error() {
    for (problem, reason) in [
        (
            Problem::FeatureGateOff {
                version: "v1.6.2".into(),
            },
            "IncrementalUpgradeGateOff",
        ),
        (
            Problem::NotSupported {
                version: "v1.4.2".into(),
            },
            "IncrementalUpgradeNotSupported",
        ),
        (Problem::OptionsMissing, "InvalidIncrementalUpgrade"),
    ] {
        let d = decide_on(
            &Case {
                plan: plan("NewClusterWithIncrementalUpgrade", None),
                svc: active_only(),
                change: Some(change(true)),
                incremental: Some(Err(problem.clone())),
                now: at("2026-12-02T12:00:00Z"),
            },
            &nodes(&[64]),
        );
        assert_eq!(d.status.phase, Phase::Error);
        assert_eq!(d.gate, Some(Gate::Hold));
        assert_eq!(d.status.waiting_for.as_deref(), Some(reason));
        assert_eq!(d.events.last().unwrap().reason, reason);
        assert_eq!(
            d.status.message.as_deref(),
            Some(problem.to_string().as_str())
        );
    }
}

/// An incremental transition under way since `admitted`, last seen moving at
/// `progress` with traffic at 25 %.
fn upgrading(admitted: &str, progress: &str) -> UpgradePlanStatus {
    UpgradePlanStatus {
        phase: Phase::Upgrading,
        admitted: Some(Admission {
            fingerprint: "abc123def456".into(),
            admitted_time: at(admitted),
            from_cluster: Some("llm-a".into()),
            to_cluster: Some("llm-b".into()),
            surge: change(true).surge.unwrap().budget,
        }),
        incremental: Some(IncrementalStatus {
            max_surge_percent: 25,
            step_size_percent: 25,
            interval_seconds: 30,
            target_capacity: Some(50),
            traffic_routed_percent: Some(25),
            active_target_capacity: Some(75),
            last_progress_time: Some(at(progress)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn moving(pending_traffic: i32) -> ServiceFacts {
    ServiceFacts {
        active_cluster: Some("llm-a".into()),
        pending_cluster: Some("llm-b".into()),
        pending_target_capacity: Some(50),
        pending_traffic_percent: Some(pending_traffic),
        active_target_capacity: Some(75),
        ..Default::default()
    }
}

#[test]
fn an_incremental_transition_stalls_only_when_a_step_does_not_move() {
    let st = nodes(&[64]);
    // Running for an hour (stallAfter 10m), but the last step moved 2 minutes ago.
    let d = decide_on(
        &Case {
            plan: plan(
                "NewClusterWithIncrementalUpgrade",
                Some(upgrading("2026-12-02T11:00:00Z", "2026-12-02T11:58:00Z")),
            ),
            svc: moving(25),
            change: Some(change(true)),
            incremental: Some(Ok(opts())),
            now: at("2026-12-02T12:00:00Z"),
        },
        &st,
    );
    assert_eq!(d.status.phase, Phase::Upgrading, "{:?}", d.status.message);
    // KubeRay moves traffic only while the type stays incremental.
    assert_eq!(d.gate, Some(Gate::OpenIncremental));
    let msg = d.status.message.as_deref().unwrap();
    assert!(
        msg.contains("step 1/4, new cluster target capacity 50%, traffic 25%"),
        "{msg}"
    );
    let inc = d.status.incremental.as_ref().unwrap();
    assert_eq!(inc.step.as_deref(), Some("1/4"));
    assert_eq!(inc.last_progress_time, Some(at("2026-12-02T11:58:00Z")));

    // Traffic moved since the last status: the progress time is now.
    let d = decide_on(
        &Case {
            plan: plan(
                "NewClusterWithIncrementalUpgrade",
                Some(upgrading("2026-12-02T11:00:00Z", "2026-12-02T11:00:00Z")),
            ),
            svc: moving(50),
            change: Some(change(true)),
            incremental: Some(Ok(opts())),
            now: at("2026-12-02T12:00:00Z"),
        },
        &st,
    );
    assert_eq!(d.status.phase, Phase::Upgrading);
    let inc = d.status.incremental.as_ref().unwrap();
    assert_eq!(inc.step.as_deref(), Some("2/4"));
    assert_eq!(inc.last_progress_time, Some(at("2026-12-02T12:00:00Z")));

    // No step for 15 minutes: stalled, and the message says so.
    let d = decide_on(
        &Case {
            plan: plan(
                "NewClusterWithIncrementalUpgrade",
                Some(upgrading("2026-12-02T11:40:00Z", "2026-12-02T11:45:00Z")),
            ),
            svc: moving(25),
            change: Some(change(true)),
            incremental: Some(Ok(opts())),
            now: at("2026-12-02T12:00:00Z"),
        },
        &st,
    );
    assert_eq!(d.status.phase, Phase::Stalled);
    assert_eq!(d.gate, Some(Gate::OpenIncremental));
    let msg = d.status.message.unwrap();
    assert!(msg.contains("no incremental step for 15m"), "{msg}");
}
