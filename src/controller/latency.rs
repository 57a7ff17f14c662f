//! From the event that made an upgrade fit to its gate write: which event
//! that was, and when each step after it happened.
//!
//! The watches note every event that can let a held upgrade through, with
//! the time raygate received it ([`Causes::note`]): a node that became
//! usable (added Ready, turned Ready, uncordoned, a taint or its capacity
//! changed), a pod deleted or finished on a node (its request given back),
//! a plan's `spec.approve` set, a RayService's spec changed. When a
//! reconcile admits an upgrade and writes its gate, [`cause_of`] picks the
//! event that let it through: the latest one received after the plan's
//! previous decision (which did not admit it) and before the admitting
//! one, among those that give back a resource the plan was short of (a
//! node's allocatable, a pod's request) or concern the plan itself (its
//! approval, its RayService). When several arrived together (a batch of
//! nodes), that is the last of them, the one the admission needed last.
//!
//! The stages between are kept per plan: when a watch last woke it (queued
//! for a reconcile), when its reconcile started, when the admission pass it
//! read was computed, when the status and the gate were written. One log
//! line per admission carries them all (milliseconds after the cause), and
//! `raygate_admission_latency_seconds{cause}` the total.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;

use jiff::Timestamp;

use crate::sync::lock;
use crate::upgradeplan::PlanKey;

/// Kinds of events that can let a held upgrade through; a label value of
/// `raygate_admission_latency_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CauseKind {
    /// A node became usable, or its capacity, taints or labels changed.
    Node,
    /// A pod was deleted or finished: its request went back to its node.
    Pod,
    /// The plan's `spec.approve` was set.
    Approval,
    /// The plan's RayService spec changed (a change that fits at once).
    RayService,
}

impl CauseKind {
    pub const ALL: [CauseKind; 4] = [
        CauseKind::Node,
        CauseKind::Pod,
        CauseKind::Approval,
        CauseKind::RayService,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CauseKind::Node => "node",
            CauseKind::Pod => "pod",
            CauseKind::Approval => "approval",
            CauseKind::RayService => "rayservice",
        }
    }
}

/// One event, as raygate received it.
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    pub kind: CauseKind,
    /// `node/<name>`, `pod/<ns>/<name>`, `upgradeplan/<ns>/<name>`, ...
    pub object: String,
    /// When the watch delivered it.
    pub at: Timestamp,
    /// Resources it gave back (a node's allocatable, a pod's request);
    /// empty for events of one plan.
    pub resources: Vec<String>,
    /// The one plan it concerns (approval, RayService); `None`: any plan.
    pub plan: Option<PlanKey>,
}

/// The cause of an admission decided at `decided`. `held` is the plan's
/// previous decision (which did not admit it): when, and what it was short
/// of if it waited for capacity (empty: unknown). Events of other kinds
/// count only while waiting for capacity; with no previous decision (raygate
/// started since), only an event of the plan itself can be told to be the
/// cause. Pure; see the module doc.
pub fn cause_of<'a>(
    log: impl DoubleEndedIterator<Item = &'a Cause>,
    plan: &PlanKey,
    held: Option<&(Timestamp, Option<BTreeSet<String>>)>,
    decided: Timestamp,
) -> Option<&'a Cause> {
    let since = held.map(|h| h.0);
    let short = held.and_then(|h| h.1.as_ref());
    let mut any = None;
    for c in log.rev() {
        if c.at > decided {
            continue;
        }
        if since.is_some_and(|s| c.at <= s) {
            break;
        }
        match (&c.plan, short) {
            (Some(p), _) if p == plan => return Some(c),
            (Some(_), _) | (None, None) => continue,
            (None, Some(short)) => {
                if short.is_empty() || c.resources.iter().any(|r| short.contains(r)) {
                    return Some(c);
                }
            }
        }
        any.get_or_insert(c);
    }
    any
}

/// The stages of one plan's way to its gate write.
#[derive(Clone, Debug, Default)]
pub struct Stages {
    /// A watch last sent the plan to the reconcile queue.
    pub queued: Option<Timestamp>,
    /// Its reconcile started.
    pub started: Option<Timestamp>,
    /// The admission pass its decision read was computed.
    pub pass: Option<Timestamp>,
    /// The decision was made (the caches read).
    pub decided: Option<Timestamp>,
    /// Its status was written.
    pub status: Option<Timestamp>,
}

/// A plan's last decision that did not admit it: when, and what it lacked
/// if it waited for capacity.
type Held = (Timestamp, Option<BTreeSet<String>>);

/// Events kept at most: enough for every event between two decisions of a
/// plan on a busy cluster (a reconcile follows an event within a second);
/// past it the oldest go, and an admission is timed from the oldest kept.
const KEEP: usize = 16_384;

#[derive(Default)]
struct Inner {
    log: VecDeque<Cause>,
    /// Per plan: its last decision that did not admit it, and what it was
    /// short of then if it waited for capacity.
    held: HashMap<PlanKey, Held>,
    /// Per plan: the stages of its next decision so far (queued, started).
    live: HashMap<PlanKey, Stages>,
    /// Per plan: the stages of its last decision.
    stages: HashMap<PlanKey, Stages>,
}

/// The events and stages, shared by the watches and the reconciles.
#[derive(Default)]
pub struct Causes {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Causes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Causes")
    }
}

/// What an admission's log line and histogram get.
#[derive(Clone, Debug)]
pub struct Timed {
    pub cause: Cause,
    pub stages: Stages,
    /// Seconds from the cause to the gate write.
    pub seconds: f64,
}

impl Causes {
    /// A watch received an event that can let an upgrade through.
    pub fn note(&self, cause: Cause) {
        let mut inner = lock(&self.inner);
        if inner.log.len() >= KEEP {
            inner.log.pop_front();
        }
        inner.log.push_back(cause);
    }

    /// Plans were sent to the reconcile queue at `at`: kept if they were
    /// not queued already (the batch window only moves the start).
    pub fn queued<'a>(&self, plans: impl IntoIterator<Item = &'a PlanKey>, at: Timestamp) {
        let mut inner = lock(&self.inner);
        for p in plans {
            inner
                .live
                .entry(p.clone())
                .or_default()
                .queued
                .get_or_insert(at);
        }
    }

    /// `plan`'s reconcile started.
    pub fn started(&self, plan: &PlanKey, at: Timestamp) {
        lock(&self.inner)
            .live
            .entry(plan.clone())
            .or_default()
            .started = Some(at);
    }

    /// `plan` was decided at `at`, on a pass computed at `pass`: the stages
    /// so far are this decision's; wakes from now on queue the next one.
    pub fn decided(&self, plan: &PlanKey, at: Timestamp, pass: Option<Timestamp>) {
        let mut inner = lock(&self.inner);
        let live = inner.live.entry(plan.clone()).or_default();
        let stages = Stages {
            queued: live.queued.take(),
            started: live.started,
            pass,
            decided: Some(at),
            status: None,
        };
        inner.stages.insert(plan.clone(), stages);
    }

    /// The status of `plan`'s last decision was written at `at`.
    pub fn status_written(&self, plan: &PlanKey, at: Timestamp) {
        if let Some(s) = lock(&self.inner).stages.get_mut(plan) {
            s.status = Some(at);
        }
    }

    /// A decision that did not admit `plan` (it holds, or tracks an
    /// admission made before): events up to `at` did not let it through.
    /// `short`: what it lacks, if it waits for capacity.
    pub fn held(&self, plan: &PlanKey, at: Timestamp, short: Option<BTreeSet<String>>) {
        lock(&self.inner).held.insert(plan.clone(), (at, short));
    }

    /// `plan`'s gate was written at `gate` for an admission decided at its
    /// recorded `decided` stage: the cause and stages, if a cause is known
    /// (none when raygate started after it).
    pub fn admitted(&self, plan: &PlanKey, gate: Timestamp) -> Option<Timed> {
        let mut inner = lock(&self.inner);
        let stages = inner.stages.get(plan).cloned().unwrap_or_default();
        let held = inner.held.remove(plan);
        let decided = stages.decided.unwrap_or(gate);
        let cause = cause_of(inner.log.iter(), plan, held.as_ref(), decided)?.clone();
        let seconds = gate.duration_since(cause.at).as_secs_f64().max(0.0);
        Some(Timed {
            cause,
            stages,
            seconds,
        })
    }

    /// The plan is gone.
    pub fn forget(&self, plan: &PlanKey) {
        let mut inner = lock(&self.inner);
        inner.held.remove(plan);
        inner.live.remove(plan);
        inner.stages.remove(plan);
    }
}

/// Milliseconds from `from` to `to`, for log fields; -1 when unknown.
pub fn ms_after(from: Timestamp, to: Option<Timestamp>) -> i64 {
    to.map_or(-1, |t| t.duration_since(from).as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
    }

    fn node(name: &str, ms: i64, res: &[&str]) -> Cause {
        Cause {
            kind: CauseKind::Node,
            object: format!("node/{name}"),
            at: t(ms),
            resources: res.iter().map(|r| r.to_string()).collect(),
            plan: None,
        }
    }

    fn key(n: &str) -> PlanKey {
        PlanKey::new("ns", n)
    }

    fn short(r: &[&str]) -> BTreeSet<String> {
        r.iter().map(|r| r.to_string()).collect()
    }

    #[test]
    fn the_cause_is_the_last_event_that_gave_back_what_the_plan_was_short_of() {
        let log = [
            node("gpu-0", 100, &["cpu", "nvidia.com/gpu"]),
            node("gpu-1", 200, &["cpu", "nvidia.com/gpu"]),
            node("cpu-0", 300, &["cpu"]),
            node("gpu-2", 900, &["cpu", "nvidia.com/gpu"]),
        ];
        let gpu = |at| (t(at), Some(short(&["nvidia.com/gpu"])));
        let a = key("a");
        // Decided at 500 after being held at 50: gpu-1, not the CPU node after it.
        let c = cause_of(log.iter(), &a, Some(&gpu(50)), t(500)).unwrap();
        assert_eq!(c.object, "node/gpu-1");
        // Events at or before the decision that held it are not the cause.
        assert!(cause_of(log.iter(), &a, Some(&gpu(200)), t(250)).is_none());
        // Nothing it was short of came back: the last event of any kind.
        let c = cause_of(log.iter(), &a, Some(&gpu(250)), t(500)).unwrap();
        assert_eq!(c.object, "node/cpu-0");
        // Shortfall unknown: the last event.
        let c = cause_of(log.iter(), &a, Some(&(t(0), Some(short(&[])))), t(500)).unwrap();
        assert_eq!(c.object, "node/cpu-0");
        // Not waiting for capacity (idle, waiting for approval): no node is the cause.
        assert!(cause_of(log.iter(), &a, Some(&(t(0), None)), t(500)).is_none());
        // Never held since raygate started: no capacity event can be told.
        assert!(cause_of(log.iter(), &a, None, t(500)).is_none());
    }

    #[test]
    fn an_approval_is_the_cause_for_its_own_plan_only() {
        let approval = Cause {
            kind: CauseKind::Approval,
            object: "upgradeplan/ns/b".into(),
            at: t(400),
            resources: vec![],
            plan: Some(key("b")),
        };
        let log = [node("gpu-0", 100, &["nvidia.com/gpu"]), approval.clone()];
        let gpu = (t(50), Some(short(&["nvidia.com/gpu"])));
        assert_eq!(
            cause_of(log.iter(), &key("b"), Some(&gpu), t(500)),
            Some(&approval)
        );
        assert_eq!(
            cause_of(log.iter(), &key("b"), Some(&(t(50), None)), t(500)),
            Some(&approval)
        );
        assert_eq!(
            cause_of(log.iter(), &key("a"), Some(&gpu), t(500)).map(|c| &c.object),
            Some(&"node/gpu-0".to_string())
        );
    }

    #[test]
    fn every_cause_is_a_label_the_histogram_has() {
        let kinds: Vec<&str> = CauseKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(kinds, crate::metrics::ADMISSION_CAUSES);
    }

    #[test]
    fn an_admission_is_timed_from_its_cause_to_the_gate_write_once() {
        let causes = Causes::default();
        let p = key("a");
        causes.held(&p, t(0), Some(short(&["nvidia.com/gpu"])));
        causes.note(node("gpu-0", 100, &["nvidia.com/gpu"]));
        causes.queued([&p], t(110));
        // Wakes while queued do not move when it was queued.
        causes.queued([&p], t(150));
        causes.started(&p, t(310));
        causes.decided(&p, t(320), Some(t(315)));
        // A wake after the decision (its own status write) is the next one's.
        causes.queued([&p], t(450));
        causes.status_written(&p, t(400));
        let timed = causes.admitted(&p, t(600)).unwrap();
        assert_eq!(ms_after(timed.cause.at, timed.stages.status), 300);
        assert_eq!(ms_after(timed.cause.at, timed.stages.pass), 215);
        assert_eq!(timed.cause.object, "node/gpu-0");
        assert!((timed.seconds - 0.5).abs() < 1e-9);
        assert_eq!(ms_after(timed.cause.at, timed.stages.queued), 10);
        assert_eq!(ms_after(timed.cause.at, timed.stages.started), 210);
        assert_eq!(ms_after(timed.cause.at, None), -1);
    }
}
