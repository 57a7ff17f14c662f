//! What raygate wrote to plans' status, until the plan cache shows it.
//!
//! Since a wake-up is reconciled within the batch window (see
//! [`super::coalesce`]), a plan is often reconciled again before the watch
//! has delivered its own last status write. Deciding on the cached copy
//! then sends a write with a stale `resourceVersion`: a 409, a GET and a
//! second decision, three requests for nothing (issue 22's scale run saw
//! one such pair per admission). The apiserver's answer to the write *is*
//! the newest plan; [`StatusWritten::newest`] hands it to the reconcile
//! while the cache still shows the version it replaced.
//!
//! It also paces a held plan's progress: while nodes arrive one after
//! another, every waiting plan's shortfall changes with each, and writing
//! each step would be one request per node per waiting plan. A change
//! that is only such numbers ([`progress_only`]) waits [`PROGRESS_EVERY`]
//! from when it was first seen unwritten, and at least that long after the
//! plan's last write; anything else (a phase, an admission, a condition's
//! status or reason) is written at once and carries the figures with it.
//! Trailing, not leading: the first node of a burst used to write every
//! waiting plan's figures at once, one status write per waiting plan in the
//! very window in which those plans' admissions compete for the apiserver
//! (5,000-node run: 229 status writes for 99 admissions); an admission that
//! comes within the interval now writes once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;

use crate::upgradeplan::{PlanKey, UpgradePlan, UpgradePlanStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// At most one progress-only status write per plan this often.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Entries older than this are dropped (a plan deleted meanwhile).
const KEEP: Duration = Duration::from_secs(600);

struct Entry {
    /// The `resourceVersion` the write replaced.
    replaced: Option<String>,
    /// The plan as the apiserver answered the write.
    written: Arc<UpgradePlan>,
    at: Timestamp,
}

/// Per plan, its last status write, and since when figures have waited
/// unwritten (see the module doc).
#[derive(Default)]
pub struct StatusWritten {
    last: HashMap<PlanKey, Entry>,
    progress_since: HashMap<PlanKey, Timestamp>,
}

impl StatusWritten {
    /// `written` is what the apiserver answered to a status write made on
    /// `before` at `at`.
    pub fn record(&mut self, before: &UpgradePlan, written: UpgradePlan, at: Timestamp) {
        let keep = KEEP.as_secs_f64();
        self.last
            .retain(|_, e| at.duration_since(e.at).as_secs_f64() < keep);
        self.progress_since
            .retain(|_, t| at.duration_since(*t).as_secs_f64() < keep);
        // Whatever was written carries the figures that waited.
        self.progress_since.remove(&before.key());
        self.last.insert(
            before.key(),
            Entry {
                replaced: before.resource_version(),
                written: Arc::new(written),
                at,
            },
        );
    }

    /// The newest known copy of `cached`: what raygate wrote, while the
    /// cache still shows the version that write replaced; else `cached`.
    pub fn newest(&self, cached: Arc<UpgradePlan>) -> Arc<UpgradePlan> {
        match self.last.get(&cached.key()) {
            Some(e)
                if e.replaced.is_some()
                    && e.replaced == cached.resource_version()
                    && e.written.uid() == cached.uid() =>
            {
                e.written.clone()
            }
            _ => cached,
        }
    }

    /// How long a progress-only write of the plan must still wait, if at
    /// all: [`PROGRESS_EVERY`] after it was first seen unwritten (noted
    /// now if it was not). Every write clears that mark, so this is also
    /// at least as long after the plan's last write.
    pub fn progress_wait(&mut self, key: &PlanKey, now: Timestamp) -> Option<Duration> {
        let since = *self.progress_since.entry(key.clone()).or_insert(now);
        let left = PROGRESS_EVERY.as_secs_f64() - now.duration_since(since).as_secs_f64().max(0.0);
        (left > 0.0).then(|| Duration::from_secs_f64(left))
    }

    /// The plan's status is as written again: no figures wait.
    pub fn settled(&mut self, key: &PlanKey) {
        self.progress_since.remove(key);
    }

    pub fn forget(&mut self, key: &PlanKey) {
        self.last.remove(key);
        self.progress_since.remove(key);
    }
}

/// `next` differs from `prev` only in what a held plan reports as capacity
/// comes and goes: the capacity figures, the printer column, the message and
/// the conditions' messages. The phase, the admission, the pending change,
/// each condition's type, status and reason, and the rest are the same.
pub fn progress_only(prev: &UpgradePlanStatus, next: &UpgradePlanStatus) -> bool {
    if prev == next || prev.phase != next.phase || prev.admitted.is_some() {
        return false;
    }
    let strip = |s: &UpgradePlanStatus| {
        let mut s = s.clone();
        s.capacity = None;
        s.waiting_for = None;
        s.message = None;
        for c in &mut s.conditions {
            c.message = String::new();
        }
        s
    };
    strip(prev) == strip(next)
}

/// The status fields `next` changes from `prev` (`conditions[Ready]` for a
/// condition), for the log line of a status write: what moved, and so why
/// it was written.
pub fn changed_fields(prev: Option<&UpgradePlanStatus>, next: &UpgradePlanStatus) -> Vec<String> {
    let as_map = |s: Option<&UpgradePlanStatus>| match s.map(serde_json::to_value) {
        Some(Ok(serde_json::Value::Object(m))) => m,
        _ => serde_json::Map::new(),
    };
    let (a, b) = (as_map(prev), as_map(Some(next)));
    let mut out = vec![];
    for k in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
        if a.get(k) == b.get(k) {
            continue;
        }
        if k == "conditions" {
            let named = |c: &Condition| c.type_.clone();
            let old = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
            for c in &next.conditions {
                if !old.contains(c) {
                    out.push(format!("conditions[{}]", named(c)));
                }
            }
            for c in old {
                if !next.conditions.iter().any(|n| n.type_ == c.type_) {
                    out.push(format!("conditions[{}]", named(c)));
                }
            }
        } else {
            out.push(k.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upgradeplan::{CapacityStatus, Phase};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn plan(rv: &str) -> UpgradePlan {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
            "metadata": {"name": "svc", "namespace": "ns", "uid": "u1", "resourceVersion": rv},
            "spec": {"rayServiceRef": {"name": "svc"}}
        }))
        .unwrap()
    }

    fn waiting(short: &str) -> UpgradePlanStatus {
        UpgradePlanStatus {
            phase: Phase::WaitingForCapacity,
            waiting_for: Some(format!("capacity: nvidia.com/gpu {short}")),
            message: Some(format!("short of {short} nvidia.com/gpu")),
            capacity: Some(CapacityStatus {
                shortfall: [("nvidia.com/gpu".to_string(), short.to_string())].into(),
                ..Default::default()
            }),
            conditions: vec![Condition {
                type_: "CapacityAvailable".into(),
                status: "False".into(),
                reason: "Insufficient".into(),
                message: format!("short of {short}"),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_written_plan_stands_in_for_the_version_it_replaced() {
        let rv = |p: Arc<UpgradePlan>| p.resource_version().unwrap_or_default();
        let mut w = StatusWritten::default();
        let mut after = plan("11");
        after.status = Some(waiting("4"));
        w.record(&plan("10"), after.clone(), Timestamp::now());
        let got = w.newest(Arc::new(plan("10")));
        assert_eq!(
            (rv(got.clone()), got.status.clone()),
            ("11".into(), after.status),
            "cache behind: ours"
        );
        assert_eq!(
            rv(w.newest(Arc::new(plan("11")))),
            "11",
            "caught up: the cache's"
        );
        let cached = w.newest(Arc::new(plan("12")));
        assert_eq!(
            (rv(cached.clone()), cached.status.is_none()),
            ("12".into(), true),
            "moved on: the cache's"
        );
        let mut recreated = plan("10");
        recreated.metadata.uid = Some("u2".into());
        let got = w.newest(Arc::new(recreated));
        assert_eq!(
            (rv(got.clone()), got.uid()),
            ("10".into(), Some("u2".into())),
            "another object of the same name: never ours"
        );
    }

    fn secs(d: Option<Duration>) -> Option<f64> {
        d.map(|d| (d.as_secs_f64() * 100.0).round() / 100.0)
    }

    #[test]
    fn progress_waits_out_the_interval_after_the_last_write() {
        let mut w = StatusWritten::default();
        let k = PlanKey::new("ns", "svc");
        let t0 = Timestamp::now();
        let at = |s: i64| t0 + jiff::SignedDuration::from_secs(s);
        w.record(&plan("1"), plan("4"), t0);
        assert_eq!(
            secs(w.progress_wait(&k, at(2))),
            Some(5.0),
            "first seen unwritten at +2 s: waits until +7 s"
        );
        assert_eq!(secs(w.progress_wait(&k, at(6))), Some(1.0));
        assert_eq!(w.progress_wait(&k, at(7)), None);
        w.forget(&k);
        assert_eq!(
            secs(w.progress_wait(&k, at(8))),
            Some(5.0),
            "forgotten: seen anew"
        );
    }

    #[test]
    fn figures_wait_from_when_they_were_first_seen_not_from_the_last_write() {
        let mut w = StatusWritten::default();
        let k = PlanKey::new("ns", "svc");
        let t0 = Timestamp::now();
        let at = |s: i64| t0 + jiff::SignedDuration::from_secs(s);
        // Never written by this process (or long ago): the first node of a
        // burst does not write at once.
        assert_eq!(secs(w.progress_wait(&k, t0)), Some(5.0));
        assert_eq!(secs(w.progress_wait(&k, at(3))), Some(2.0), "the next node");
        assert_eq!(
            w.progress_wait(&k, at(5)),
            None,
            "written with the latest figures"
        );
        // The admission (any write) carries them: nothing waits after it.
        w.record(&plan("1"), plan("2"), at(4));
        assert_eq!(secs(w.progress_wait(&k, at(10))), Some(5.0));
        // Back to what was written: the next figures wait the full interval.
        w.settled(&k);
        assert_eq!(secs(w.progress_wait(&k, at(20))), Some(5.0));
    }

    #[test]
    fn the_log_names_the_fields_a_write_changes() {
        let (a, b) = (waiting("8"), waiting("4"));
        assert_eq!(
            changed_fields(Some(&a), &b),
            [
                "capacity",
                "conditions[CapacityAvailable]",
                "message",
                "waitingFor"
            ]
        );
        assert!(changed_fields(Some(&a), &a).is_empty());
        assert!(changed_fields(None, &a).contains(&"phase".to_string()));
    }

    #[test]
    fn only_capacity_figures_and_their_words_are_progress() {
        let (a, b) = (waiting("8"), waiting("4"));
        assert!(progress_only(&a, &b));
        assert!(!progress_only(&a, &a), "no change is not a write at all");
        let mut phase = b.clone();
        phase.phase = Phase::Admitted;
        assert!(!progress_only(&a, &phase));
        let mut reason = b.clone();
        reason.conditions[0].reason = "Fits".into();
        assert!(!progress_only(&a, &reason));
        let mut status = b.clone();
        status.conditions[0].status = "True".into();
        assert!(!progress_only(&a, &status));
        let mut more = b.clone();
        more.conditions.push(a.conditions[0].clone());
        assert!(!progress_only(&a, &more));
        let mut other = b.clone();
        other.effective_priority = Some(3);
        assert!(!progress_only(&a, &other));
    }
}
