//! Rule 2 for an elastic RayService Kueue manages: during the transition
//! Kueue derives the RayService's Workload again (path B of
//! [`crate::admission::quota`]), and what it rewrites meanwhile is neither
//! a mismatch nor a new change; a Workload it does not admit is said as such.

use super::*;

#[test]
fn an_elastic_transition_has_kueue_derive_the_services_workload_again_once_upgrading() {
    let fp = "0123456789ab";
    let status = UpgradePlanStatus {
        quota: Some(granted(fp)),
        ..admitted(Phase::Upgrading, fp, 30, Some("llm-next1"))
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
    let fp = fingerprint_of(&changed(&|_| {}));
    let status = admitted(Phase::Admitted, &fp, 2, None);
    for suspended in [false, true] {
        let svc = changed(&|v: &mut Value| {
            if suspended {
                suspend(v);
            }
            upgrade_in_progress(v);
        });
        // KubeRay's pending cluster: the RayService's cluster spec (with
        // the suspension KubeRay copies to the pending cluster).
        let pending = pending_cluster(&svc);
        let d = decide_in_transition(&plan(Some(status.clone())), &svc, &pending);
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
        stamp(v, wl);
        templates(v, |t| {
            t["metadata"]["labels"]["kueue.x-k8s.io/podset"] = json!("p")
        });
        // The ResourceFlavor's node labels, written at admission too.
        v["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]
            ["pool.example/flavor"] = json!("a100");
    };
    let admitted_svc = service(|v| {
        kueue(v, true);
        worker_image(v);
        writes(v, "rayservice-llm-1a2b3");
    });
    let fp = fingerprint_of(&admitted_svc);
    let status = admitted(Phase::Upgrading, &fp, 20, Some("llm-next1"));
    // KubeRay's pending cluster: the spec as admitted (the old Workload's names).
    let pending = pending_cluster(&admitted_svc);
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
            upgrade_in_progress(v);
        });
        let d = decide_in_transition(&plan(Some(status.clone())), &svc, &pending);
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
    let fp = fingerprint_of(&changed);
    let fp = fp.as_str();
    let status = |refreshed: Option<&str>, since: i64, waiting: Option<&str>| UpgradePlanStatus {
        waiting_for: waiting.map(str::to_string),
        quota: Some(crate::upgradeplan::QuotaStatus {
            workload_refreshed_for: refreshed.map(str::to_string),
            ..granted(fp)
        }),
        ..admitted(Phase::Upgrading, fp, since, Some("llm-next1"))
    };
    let svc = service(|v| {
        kueue(v, true);
        worker_image(v);
        upgrade_in_progress(v);
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
    // Admitted, not looked at by Kueue yet, or no refresh done yet in this
    // transition: progressing. (Done for a pending cluster KubeRay has built
    // again since, `rebuild`, it still holds: the refresh is once per
    // transition.)
    let fresh = quota::ServiceWorkload::of(&[wl("rayservice-llm-new", false, None)]).unwrap();
    assert_eq!((fresh.admitted, fresh.why.as_deref()), (false, None));
    for (refreshed, w) in [
        (Some("llm-next1"), &admitted),
        (Some("llm-next1"), &fresh),
        (None, &pending),
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

#[test]
fn a_pending_cluster_kuberay_left_with_the_deleted_workloads_stamp_is_built_again() {
    // Measured in CI (Kueue v0.19.0, KubeRay v1.6.2, under load): after
    // raygate's refresh Kueue stopped and restarted the RayService within
    // 0.35 s; KubeRay, reconciling 3 s apart, saw neither, so the pending
    // cluster kept the deleted Workload's slice stamp and Kueue's ungater
    // never released its pods (the transition timed out). The gate opens so
    // KubeRay builds the new cluster again, stamped as Kueue admitted it.
    let svc_with = |wl: &str, extra: &dyn Fn(&mut Value)| {
        service(|v| {
            kueue(v, true);
            worker_image(v);
            stamp(v, wl);
            extra(v);
            upgrade_in_progress(v);
            // raygate closed the gate once KubeRay built the new cluster.
            v["spec"]["upgradeStrategy"]["type"] = json!("None");
        })
    };
    let built = svc_with("rayservice-llm-afd38", &|_| {});
    let fp = fingerprint_of(&service(|v| {
        kueue(v, true);
        worker_image(v);
        stamp(v, "rayservice-llm-afd38");
    }));
    let refreshed = UpgradePlanStatus {
        quota: Some(crate::upgradeplan::QuotaStatus {
            workload_refreshed_for: Some("llm-next1".into()),
            ..granted(&fp)
        }),
        ..admitted(Phase::Upgrading, &fp, 30, Some("llm-next1"))
    };
    let stale = pending_cluster(&built);
    let decide = |st: &UpgradePlanStatus, svc: &RayService, pending: &RayCluster| {
        let d = decide_in_transition(&plan(Some(st.clone())), svc, pending);
        assert_eq!(d.status.phase, Phase::Upgrading, "{:?}", d.status.message);
        let rebuilt = d.events.iter().any(|e| {
            e.reason == EventReason::Upgrading && e.note.contains("builds the new cluster again")
        });
        (d.gate, rebuilt)
    };
    let restarted = svc_with("rayservice-llm-f18c1", &|_| {});
    assert_eq!(
        decide(&refreshed, &restarted, &stale),
        (Some(Gate::Open), true),
        "KubeRay missed the restart: built again"
    );
    // Not before the refresh, not while Kueue has the RayService stopped or
    // KubeRay carried the stop to the pending cluster (its restart follows),
    // not once the stamps agree, and not with a further change waiting.
    let before = UpgradePlanStatus {
        quota: Some(granted(&fp)),
        ..refreshed.clone()
    };
    let mut caught = stale.clone();
    caught.spec.suspend = Some(true);
    let edited = svc_with("rayservice-llm-f18c1", &|v| {
        v["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
            ["image"] = json!("rayproject/ray:2.11.0-gpu");
    });
    for (what, st, svc, pending) in [
        ("before the refresh", &before, &restarted, &stale),
        ("suspended by KubeRay", &refreshed, &restarted, &caught),
        ("stamps agree", &refreshed, &built, &stale),
        ("a further change", &refreshed, &edited, &stale),
    ] {
        assert_eq!(
            decide(st, svc, pending),
            (Some(Gate::Hold), false),
            "{what}"
        );
    }
    let stopped = svc_with("rayservice-llm-f18c1", &|v| suspend(v));
    assert!(!decide(&refreshed, &stopped, &stale).1, "Kueue's stop");
    // KubeRay built it again (a new name, the new stamp): the gate closes,
    // and the Workload is not derived again (once per transition).
    let mut again = serde_json::to_value(pending_cluster(&restarted)).unwrap();
    again["metadata"]["name"] = json!("llm-next2");
    let again: RayCluster = serde_json::from_value(again).unwrap();
    let mut svc2 = serde_json::to_value(&restarted).unwrap();
    svc2["status"]["pendingServiceStatus"] = json!({"rayClusterName": "llm-next2"});
    let svc2: RayService = serde_json::from_value(svc2).unwrap();
    let rc = active(|_| {});
    let d = decide_over(
        &plan(Some(refreshed.clone())),
        &svc2,
        &[
            ("llm-7x9kq", &rc),
            ("llm-next1", &stale),
            ("llm-next2", &again),
        ],
        None,
        BTreeMap::new(),
    );
    assert_eq!(d.gate, Some(Gate::Hold), "{:?}", d.status.message);
    assert_eq!(
        d.status
            .admitted
            .as_ref()
            .and_then(|a| a.to_cluster.as_deref()),
        Some("llm-next2")
    );
    assert_eq!(
        d.status
            .quota
            .as_ref()
            .and_then(|q| q.workload_refreshed_for.as_deref()),
        Some("llm-next1"),
        "derived again once per transition"
    );
    assert!(
        d.events.iter().all(
            |e| e.reason != EventReason::AdmissionMismatch && e.reason != EventReason::Batching
        ),
        "{:?}",
        d.events
    );
}

/// Calls `f` on the fixture's head and worker pod templates.
fn templates(v: &mut Value, mut f: impl FnMut(&mut Value)) {
    for ptr in [
        "/spec/rayClusterConfig/headGroupSpec/template",
        "/spec/rayClusterConfig/workerGroupSpecs/0/template",
    ] {
        f(v.pointer_mut(ptr).unwrap());
    }
}

/// Kueue's admission stamp of Workload `wl` on the fixture's templates
/// (`kueue.x-k8s.io/workload` and `…/workload-slice-name`, as its start
/// writes them).
fn stamp(v: &mut Value, wl: &str) {
    templates(v, |t| {
        t["metadata"]["annotations"]["kueue.x-k8s.io/workload"] = json!(wl);
        t["metadata"]["annotations"]["kueue.x-k8s.io/workload-slice-name"] = json!(wl);
    });
}
