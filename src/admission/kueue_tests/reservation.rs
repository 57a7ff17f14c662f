//! Rule 4 for a RayService Kueue manages, with raygate's Kueue support on:
//! the new cluster must fit its ClusterQueue's quota, and Kueue must admit
//! raygate's reservation Workload, before the change is admitted.

use super::*;

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
