//! What a rule decided, as data: the phase, what the plan waits for, the
//! message, the conditions it rests on, the Event it is worth and what it
//! does to the gate. A rule that ends the decision returns a [`Ruling`]
//! from its facts and the previous status; [`Builder::rule`] writes it out
//! once, so the rule reads as a decision, not as status edits.
//!
//! [`Builder::rule`]: crate::admission::render::Builder::rule

use std::time::Duration;

use super::waiting::WaitingFor;
use crate::admission::{EventNote, EventReason, Gate, Outcome};
use crate::upgradeplan::condition::{Reason, Status};
use crate::upgradeplan::{Phase, UpgradePlanStatus};

/// What a rule decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Ruling {
    pub phase: Phase,
    /// `None`: waiting for nothing (idle, completed).
    pub waiting_for: Option<WaitingFor>,
    /// `status.message`.
    pub message: String,
    /// The conditions the ruling rests on, set (or dropped) in this order.
    pub conditions: Vec<Cond>,
    /// For `raygate_admissions_total{outcome}`; `None` leaves it as it is.
    pub outcome: Option<Outcome>,
    /// The Event, when the ruling is news ([`same_wait`]).
    pub event: Option<EventNote>,
    /// `None` leaves the gate as the rules set it so far.
    pub gate: Option<Gate>,
    pub requeue: Option<Duration>,
}

impl Ruling {
    /// A ruling that sets nothing but the phase, `waitingFor` and message.
    pub fn new(
        phase: Phase,
        waiting_for: impl Into<Option<WaitingFor>>,
        message: impl Into<String>,
    ) -> Self {
        Ruling {
            phase,
            waiting_for: waiting_for.into(),
            message: message.into(),
            conditions: vec![],
            outcome: None,
            event: None,
            gate: None,
            requeue: None,
        }
    }

    pub fn condition(mut self, c: Cond) -> Self {
        self.conditions.push(c);
        self
    }

    /// Several conditions, in order.
    pub fn conditions(mut self, cs: impl IntoIterator<Item = Cond>) -> Self {
        self.conditions.extend(cs);
        self
    }

    pub fn outcome(mut self, o: Outcome) -> Self {
        self.outcome = Some(o);
        self
    }

    pub fn event(mut self, e: EventNote) -> Self {
        self.event = Some(e);
        self
    }

    /// The Event, when `news`.
    pub fn event_if(mut self, news: bool, e: EventNote) -> Self {
        if news {
            self.event = Some(e);
        }
        self
    }

    pub fn gate(mut self, g: Gate) -> Self {
        self.gate = Some(g);
        self
    }

    pub fn requeue(mut self, r: Duration) -> Self {
        self.requeue = Some(r);
        self
    }
}

/// A condition a ruling sets, or drops (when what it reports on is gone).
#[derive(Debug, Clone, PartialEq)]
pub enum Cond {
    Set {
        type_: &'static str,
        status: Status,
        reason: Reason,
        message: String,
    },
    Drop(&'static str),
}

impl Cond {
    pub fn set(
        type_: &'static str,
        status: Status,
        reason: Reason,
        message: impl Into<String>,
    ) -> Cond {
        Cond::Set {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// An Event about the change `fingerprint` (none when empty: an unadmitted
/// transition may have no known change).
pub fn change_event(
    warning: bool,
    reason: EventReason,
    fingerprint: &str,
    note: String,
) -> EventNote {
    EventNote {
        warning,
        reason,
        note,
        change: (!fingerprint.is_empty()).then(|| fingerprint.to_string()),
    }
}

/// An Event about the plan as a whole.
pub fn plan_event(warning: bool, reason: EventReason, note: String) -> EventNote {
    EventNote {
        warning,
        reason,
        note,
        change: None,
    }
}

/// Whether the previous status already waited so: in `phase` (when given),
/// for `waiting_for` (when given), on the change `fingerprint` (when given).
/// A wait's Event is recorded when it starts, not on every decision.
pub fn same_wait(
    prev: &UpgradePlanStatus,
    phase: Option<Phase>,
    waiting_for: Option<&WaitingFor>,
    fingerprint: Option<&str>,
) -> bool {
    let pending = prev.pending_change.as_ref().map(|p| p.fingerprint.as_str());
    phase.is_none_or(|p| prev.phase == p)
        && waiting_for.is_none_or(|w| w.was(prev.waiting_for.as_deref()))
        && fingerprint.is_none_or(|fp| pending == Some(fp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upgradeplan::PendingChange;

    #[test]
    fn a_wait_is_news_when_any_of_its_facts_changed() {
        let prev = UpgradePlanStatus {
            phase: Phase::WaitingForCapacity,
            waiting_for: Some("capacity: nvidia.com/gpu 8".into()),
            pending_change: Some(PendingChange {
                fingerprint: "abc".into(),
                triggering_paths: vec![],
                detected_time: jiff::Timestamp::UNIX_EPOCH,
            }),
            ..Default::default()
        };
        let capacity = WaitingFor::Capacity("capacity: nvidia.com/gpu 8".into());
        assert!(same_wait(
            &prev,
            Some(Phase::WaitingForCapacity),
            None,
            Some("abc")
        ));
        assert!(same_wait(&prev, None, Some(&capacity), None));
        assert!(!same_wait(
            &prev,
            Some(Phase::WaitingForCapacity),
            None,
            Some("def")
        ));
        assert!(!same_wait(&prev, Some(Phase::Stalled), None, None));
        assert!(!same_wait(&prev, None, Some(&WaitingFor::KubeRay), None));
    }
}
