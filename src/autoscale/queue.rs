//! Which waiting plans have a capacity request open. Pure.
//!
//! Requests follow the admission queue (priority, then waiting time, then
//! name: [`QueueKey`]'s order) and at most `max_open` plans
//! have buffers at once, so a GitOps sync that changes twenty RayServices
//! does not buy twenty clusters' worth of nodes at once: the first
//! `max_open` plans ask, the others are `Queued` and ask as those ahead are
//! admitted (their buffers deleted) or withdrawn.
//!
//! The slots come from the plans' recorded state, which a replica reads
//! with some lag; [`may_open`] also counts the plans that have buffers right
//! now, so the cap holds even while a plan ahead is still closing.

use std::collections::{BTreeMap, BTreeSet};

use crate::admission::ledger::QueueKey;

use crate::upgradeplan::PlanKey;

/// A waiting plan's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Among the first `max_open`: it may have buffers.
    Open,
    /// Behind them: `position` is 1 for the first plan after the open ones.
    Queued { position: u32 },
}

/// Every plan's slot, of the plans waiting for capacity with requests on,
/// in the admission queue's order.
pub fn slots(mut wants: Vec<QueueKey>, max_open: usize) -> BTreeMap<PlanKey, Slot> {
    wants.sort();
    wants
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let slot = if i < max_open {
                Slot::Open
            } else {
                Slot::Queued {
                    position: u32::try_from(i - max_open + 1).unwrap_or(u32::MAX),
                }
            };
            (w.plan(), slot)
        })
        .collect()
}

/// Whether `me` may create its buffers now: its slot is open and fewer than
/// `max_open` other plans have buffers.
pub fn may_open(
    me: &PlanKey,
    slots: &BTreeMap<PlanKey, Slot>,
    open_now: &BTreeSet<PlanKey>,
    max_open: usize,
) -> bool {
    slots.get(me) == Some(&Slot::Open) && open_now.iter().filter(|k| *k != me).count() < max_open
}

/// The slot of `me` among `others` (the other plans that want a request):
/// an open slot waits as the first queued one while `max_open` other plans
/// still have buffers (one ahead still closing, or overtaken in the queue).
pub fn slot_of(
    me: &QueueKey,
    others: &[QueueKey],
    open_now: &BTreeSet<PlanKey>,
    max_open: usize,
) -> Slot {
    let key = me.plan();
    let mut wants: Vec<QueueKey> = others.iter().filter(|k| k.plan() != key).cloned().collect();
    wants.push(me.clone());
    let slots = slots(wants, max_open);
    match slots.get(&key) {
        Some(Slot::Open) if !may_open(&key, &slots, open_now, max_open) => {
            Slot::Queued { position: 1 }
        }
        Some(slot) => *slot,
        // Never: `me` is among the wants.
        None => Slot::Queued { position: 1 },
    }
}

/// Plans that have buffers but no open slot (admitted, withdrawn, gone,
/// requests turned off, or overtaken in the queue): theirs are deleted.
pub fn to_close(slots: &BTreeMap<PlanKey, Slot>, open_now: &BTreeSet<PlanKey>) -> Vec<PlanKey> {
    open_now
        .iter()
        .filter(|k| slots.get(*k) != Some(&Slot::Open))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::ledger::{self, Candidate};

    fn want(name: &str, priority: i32, minute: u32) -> QueueKey {
        ledger::tests::key(name, priority, &format!("2026-12-04T10:{minute:02}:00Z"))
    }

    fn key(n: &str) -> PlanKey {
        PlanKey::new("ml", n)
    }

    #[test]
    fn the_first_max_open_in_queue_order_ask_and_the_rest_queue() {
        let s = slots(
            vec![
                want("c", 0, 3),
                want("a", 0, 1),
                want("hi", 5, 9),
                want("b", 0, 2),
            ],
            2,
        );
        assert_eq!(s[&key("hi")], Slot::Open);
        assert_eq!(s[&key("a")], Slot::Open);
        assert_eq!(s[&key("b")], Slot::Queued { position: 1 });
        assert_eq!(s[&key("c")], Slot::Queued { position: 2 });
        assert!(slots(vec![want("a", 0, 1)], 0)[&key("a")] == Slot::Queued { position: 1 });
    }

    /// The same order as the admission queue, so requests go to the plans
    /// raygate will admit first.
    #[test]
    fn the_order_is_the_admission_queues() {
        let wants = vec![
            want("x", 1, 5),
            want("y", 1, 5),
            want("z", 3, 9),
            want("w", -2, 0),
            want("v", 1, 2),
        ];
        let mut cands: Vec<Candidate> = wants
            .iter()
            .map(|w| Candidate {
                key: w.clone(),
                pods: vec![],
                headroom: Default::default(),
            })
            .collect();
        ledger::order(&mut cands);
        let s = slots(wants, 1);
        let first: Vec<_> = s
            .iter()
            .filter(|(_, v)| **v == Slot::Open)
            .map(|(k, _)| k.name.clone())
            .collect();
        assert_eq!(first, [cands[0].key.name.clone()]);
        for (i, c) in cands.iter().enumerate().skip(1) {
            assert_eq!(s[&key(&c.key.name)], Slot::Queued { position: i as u32 });
        }
    }

    #[test]
    fn a_plan_opens_only_when_fewer_than_the_cap_have_buffers() {
        let s = slots(vec![want("a", 0, 1), want("b", 0, 2)], 1);
        let none = BTreeSet::new();
        assert!(may_open(&key("a"), &s, &none, 1));
        assert!(!may_open(&key("b"), &s, &none, 1), "queued");
        // b was open before a arrived ahead of it: a waits until b closes.
        let b_open = BTreeSet::from([key("b")]);
        assert!(!may_open(&key("a"), &s, &b_open, 1));
        assert_eq!(to_close(&s, &b_open), vec![key("b")]);
        // Its own buffers do not count against it.
        assert!(may_open(&key("a"), &s, &BTreeSet::from([key("a")]), 1));
        // Buffers of a plan no longer waiting are closed.
        assert_eq!(
            to_close(&s, &BTreeSet::from([key("gone")])),
            vec![key("gone")]
        );
        assert!(to_close(&s, &BTreeSet::from([key("a")])).is_empty());
    }
}
