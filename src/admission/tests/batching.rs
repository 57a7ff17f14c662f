//! `spec.batching` through the whole decision, on fixed instants: several
//! commits make one admission, a revert drops out, approval releases, a
//! change during a transition waits visibly as the next batch.

use super::*;
use jiff::SignedDuration;

const IMAGE: &str = "workerGroupSpecs[gpu].template.spec.containers[ray-worker].image";
const MEMORY: &str =
    "workerGroupSpecs[gpu].template.spec.containers[ray-worker].resources.limits.memory";
const GROUP: &str = "workerGroupSpecs[gpu2]";

fn batched(extra: serde_json::Value, status: Option<UpgradePlanStatus>) -> UpgradePlan {
    let mut spec = json!({"rayServiceRef": {"name": "llm"}, "stallAfter": "30m",
                          "batching": {"quietPeriod": "30m", "maxDelay": "6h"}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    plan(spec, status)
}

fn commit(fp: &str, paths: &[&str]) -> ChangeFacts {
    let mut c = change(vec![gpu_pod("w0", 8)]);
    c.fingerprint = fp.into();
    c.triggering_paths = paths.iter().map(|p| p.to_string()).collect();
    c
}

fn at(minutes: i64) -> Timestamp {
    now() + SignedDuration::from_mins(minutes)
}

/// Decides on an idle world with 8 free GPUs and `c` pending.
fn step(p: &UpgradePlan, c: Option<ChangeFacts>, t: Timestamp) -> Decision {
    Scenario::new().plan(p).change_is(Ok(c)).at(t).decide()
}

fn reasons(d: &Decision) -> Vec<&'static str> {
    d.events.iter().map(|e| e.reason.as_str()).collect()
}

#[test]
fn three_commits_in_the_quiet_period_are_one_admission() {
    let d1 = step(
        &batched(json!({}), None),
        Some(commit("c1", &[IMAGE])),
        at(0),
    );
    assert_eq!(
        (d1.status.phase, d1.gate),
        (Phase::Batching, Some(Gate::Hold))
    );
    assert_eq!(d1.outcome, Some(Outcome::HeldBatching));
    assert_eq!(reasons(&d1), ["Batching"]);
    assert_eq!(d1.status.waiting_for.as_deref(), Some("batch: 1 change"));
    let b = d1.status.batch.as_ref().unwrap();
    assert_eq!(b.release_time, Some(at(30)));
    assert!(d1.requeue <= REQUEUE_WAITING);

    // Decided again without a change: nothing moves, no Event.
    let again = step(
        &batched(json!({}), Some(d1.status.clone())),
        Some(commit("c1", &[IMAGE])),
        at(10),
    );
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert_eq!(again.status.batch, d1.status.batch);

    let d2 = step(
        &batched(json!({}), Some(d1.status)),
        Some(commit("c2", &[IMAGE, MEMORY])),
        at(20),
    );
    assert_eq!(d2.status.phase, Phase::Batching);
    let d3 = step(
        &batched(json!({}), Some(d2.status)),
        Some(commit("c3", &[IMAGE, MEMORY, GROUP])),
        at(40),
    );
    let b = d3.status.batch.as_ref().unwrap();
    assert_eq!(b.change_count, 3);
    assert_eq!(b.fingerprint, "c3");
    assert_eq!(b.first_change_time, at(0));
    assert_eq!(
        b.release_time,
        Some(at(70)),
        "the quiet period restarted at 40"
    );
    let listed: Vec<&[String]> = b.changes.iter().map(|c| c.paths.as_slice()).collect();
    assert_eq!(
        listed,
        [
            &[IMAGE.to_string()][..],
            &[MEMORY.to_string()],
            &[GROUP.to_string()]
        ]
    );
    assert_eq!(d3.status.pending_change.as_ref().unwrap().fingerprint, "c3");

    // Still held one second before the release.
    let early = step(
        &batched(json!({}), Some(d3.status.clone())),
        Some(commit("c3", &[IMAGE, MEMORY, GROUP])),
        at(70) - SignedDuration::from_secs(1),
    );
    assert_eq!(early.status.phase, Phase::Batching);
    assert_eq!(early.requeue, Duration::from_secs(1));

    let go = step(
        &batched(json!({}), Some(d3.status)),
        Some(commit("c3", &[IMAGE, MEMORY, GROUP])),
        at(70),
    );
    assert_eq!(
        (go.status.phase, go.gate),
        (Phase::Admitted, Some(Gate::Open))
    );
    assert_eq!(reasons(&go), ["BatchReleased", "Admitted"]);
    assert!(
        go.events[0].note.contains("3 changes, 1 recreation"),
        "{}",
        go.events[0].note
    );
    assert!(
        go.events[1].note.contains("(batch of 3 changes)"),
        "{}",
        go.events[1].note
    );
    assert_eq!(go.observed.recreations_avoided, 2);
    assert_eq!(go.status.batch, None, "the batch leaves with its admission");
    assert_eq!(go.status.admitted.as_ref().unwrap().fingerprint, "c3");
}

#[test]
fn a_change_needing_no_new_cluster_is_never_held_and_a_revert_drops_the_batch() {
    // Serve config only: nothing needs a new cluster, nothing is batched.
    let idle = step(&batched(json!({}), None), None, at(0));
    assert_eq!(idle.status.phase, Phase::Idle);
    assert_eq!(idle.status.batch, None);

    let d1 = step(
        &batched(json!({}), None),
        Some(commit("c1", &[IMAGE])),
        at(0),
    );
    // Reverted to the active cluster's spec: no change, no batch, no recreation.
    let back = step(&batched(json!({}), Some(d1.status)), None, at(5));
    assert_eq!(back.status.phase, Phase::Idle);
    assert_eq!(back.status.batch, None);
    assert_eq!(back.gate, Some(Gate::Hold));
    // A new commit later starts a new batch from there.
    let again = step(
        &batched(json!({}), Some(back.status)),
        Some(commit("c2", &[IMAGE])),
        at(50),
    );
    let b = again.status.batch.unwrap();
    assert_eq!((b.change_count, b.first_change_time), (1, at(50)));
}

#[test]
fn a_revert_inside_the_batch_takes_its_change_out() {
    let d1 = step(
        &batched(json!({}), None),
        Some(commit("c1", &[IMAGE])),
        at(0),
    );
    let d2 = step(
        &batched(json!({}), Some(d1.status)),
        Some(commit("c2", &[IMAGE, MEMORY])),
        at(10),
    );
    let d3 = step(
        &batched(json!({}), Some(d2.status)),
        Some(commit("c1", &[IMAGE])),
        at(20),
    );
    let b = d3.status.batch.as_ref().unwrap();
    assert_eq!((b.change_count, b.fingerprint.as_str()), (1, "c1"));
    assert_eq!(b.release_time, Some(at(50)));
    let go = step(
        &batched(json!({}), Some(d3.status)),
        Some(commit("c1", &[IMAGE])),
        at(50),
    );
    assert_eq!(go.status.phase, Phase::Admitted);
    assert_eq!(go.observed.recreations_avoided, 0);
}

#[test]
fn max_delay_releases_a_batch_that_never_goes_quiet() {
    let spec = json!({"batching": {"quietPeriod": "30m", "maxDelay": "1h"}});
    let mut status = None;
    for (i, m) in [0, 20, 40].iter().enumerate() {
        let d = step(
            &batched(spec.clone(), status),
            Some(commit(&format!("c{i}"), &[IMAGE])),
            at(*m),
        );
        assert_eq!(d.status.phase, Phase::Batching, "{m}");
        status = Some(d.status);
    }
    let d = step(
        &batched(spec.clone(), status),
        Some(commit("c3", &[IMAGE])),
        at(60),
    );
    assert_eq!(d.status.phase, Phase::Admitted);
    assert!(
        d.events[0].note.contains("released (MaxDelay): 4 changes"),
        "{:?}",
        d.events
    );
}

#[test]
fn approving_a_batched_change_releases_it_at_once_and_a_pause_still_wins() {
    let manual = json!({"policy": "Manual"});
    let d1 = step(
        &batched(manual.clone(), None),
        Some(commit("c1", &[IMAGE])),
        at(0),
    );
    assert_eq!(d1.status.phase, Phase::Batching);
    assert!(
        d1.status
            .message
            .as_deref()
            .unwrap()
            .contains("approving c1 releases it now")
    );
    let approved = json!({"policy": "Manual", "approve": "c1"});
    let d2 = step(
        &batched(approved, Some(d1.status.clone())),
        Some(commit("c1", &[IMAGE])),
        at(1),
    );
    assert_eq!(
        (d2.status.phase, d2.gate),
        (Phase::Admitted, Some(Gate::Open))
    );
    assert_eq!(reasons(&d2), ["BatchReleased", "Approved", "Admitted"]);
    assert!(
        d2.events[0].note.contains("(Approved)"),
        "{}",
        d2.events[0].note
    );
    // Released by the quiet period, a Manual change waits for approval.
    let d3 = step(
        &batched(manual, Some(d1.status.clone())),
        Some(commit("c1", &[IMAGE])),
        at(30),
    );
    assert_eq!(d3.status.phase, Phase::WaitingForApproval);
    // A pause shows first, the batch is still gathered.
    let paused = step(
        &batched(json!({"policy": "Paused"}), Some(d1.status)),
        Some(commit("c2", &[IMAGE])),
        at(5),
    );
    assert_eq!(paused.status.phase, Phase::Paused);
    assert_eq!(paused.status.batch.unwrap().change_count, 2);
}

#[test]
fn without_batching_nothing_is_gathered() {
    let d = step(&auto_plan(None), Some(commit("c1", &[IMAGE])), at(0));
    assert_eq!(d.status.phase, Phase::Admitted);
    assert_eq!(d.status.batch, None);
    assert_eq!(d.observed.recreations_avoided, 0);
}

#[test]
fn a_change_during_a_transition_waits_as_the_next_batch() {
    // Admitted c1, KubeRay is building llm-b from it.
    let go = step(&auto_plan(None), Some(commit("c1", &[IMAGE])), at(0));
    let upgrading = Scenario::new()
        .status(go.status)
        .upgrading("llm-a", "llm-b")
        .at(at(1))
        .built_from(Some("c1"))
        .decide();
    assert_eq!(upgrading.status.phase, Phase::Upgrading);
    assert_eq!(upgrading.status.batch, None);
    // A further commit (compared with the pending cluster, as KubeRay does).
    let during = Scenario::new()
        .status(upgrading.status)
        .upgrading("llm-a", "llm-b")
        .change(commit("c2", &[MEMORY]))
        .at(at(2))
        .built_from(Some("c1"))
        .decide();
    assert_eq!(
        (during.status.phase, during.gate),
        (Phase::Upgrading, Some(Gate::Hold))
    );
    let next = during.status.batch.as_ref().unwrap();
    assert_eq!(next.after_transition_to.as_deref(), Some("llm-b"));
    assert_eq!((next.change_count, next.release_time), (1, None));
    assert_eq!(reasons(&during), ["Batching"]);
    assert!(during.events[0].note.contains("never as a third cluster"));
    assert!(
        during
            .status
            .message
            .as_deref()
            .unwrap()
            .contains("next batch: 1 change (c2) waits"),
        "{:?}",
        during.status.message
    );
    // Promoted and the old cluster gone: completed, then the next batch goes
    // to the gate (no batching configured: at once).
    let done = Scenario::new()
        .status(during.status)
        .serving("llm-b")
        .change(commit("c2", &[MEMORY]))
        .at(at(3))
        .built_from(None)
        .decide();
    assert_eq!(done.status.phase, Phase::Completed);
    let next = Scenario::new()
        .status(done.status)
        .serving("llm-b")
        .change(commit("c2", &[MEMORY]))
        .capacity(&[16])
        .at(at(4))
        .decide();
    assert_eq!(next.status.phase, Phase::Admitted);
    assert_eq!(next.status.admitted.unwrap().fingerprint, "c2");
}

#[test]
fn with_batching_the_next_batch_keeps_its_first_change_time() {
    let go = step(
        &batched(json!({}), None),
        Some(commit("c1", &[IMAGE])),
        at(0),
    );
    let go = step(
        &batched(json!({}), Some(go.status)),
        Some(commit("c1", &[IMAGE])),
        at(30),
    );
    assert_eq!(go.status.phase, Phase::Admitted);
    let during = Scenario::new()
        .plan(&batched(json!({}), Some(go.status)))
        .upgrading("llm-a", "llm-b")
        .change(commit("c2", &[MEMORY]))
        .at(at(31))
        .built_from(Some("c1"))
        .decide();
    assert_eq!(
        during.status.batch.as_ref().unwrap().first_change_time,
        at(31)
    );
    let mut st = during.status;
    st.admitted = None;
    st.phase = Phase::Completed;
    let after = Scenario::new()
        .plan(&batched(json!({}), Some(st)))
        .serving("llm-b")
        .change(commit("c2", &[MEMORY]))
        .capacity(&[16])
        .at(at(40))
        .decide();
    assert_eq!(after.status.phase, Phase::Batching);
    let b = after.status.batch.unwrap();
    assert_eq!(
        (b.first_change_time, b.release_time),
        (at(31), Some(at(61)))
    );
    assert_eq!(b.after_transition_to, None);
}
