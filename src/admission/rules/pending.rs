//! Rule 4 (and the dispatch to rule 3): a change that is not admitted yet
//! waits for policy, its batch, approval, the window, then capacity (and
//! Kueue's quota), and is admitted once nothing holds it.

use super::suspension::{kueue_support_off, kueue_would_suspend};
use super::*;

impl Rules<'_> {
    /// Rules 3 and 4: a change that is not admitted yet.
    pub(super) fn evaluate(&self, b: &mut Builder<'_>) {
        b.gate = Some(Gate::Hold);
        // A change not admitted holds no quota unless this decision says so.
        b.status.quota = None;
        b.drop_condition(condition::QUOTA_AVAILABLE);
        if let Some(s) = &self.svc.suspension {
            b.status.pending_change = None;
            return b.rule(self.suspended(s, &b.prev));
        }
        match &self.inp.incremental {
            Some(Err(p)) => return b.error(p.into(), p.to_string(), Some(Gate::Hold)),
            Some(Ok(opts)) => b.status.incremental = Some(render::incremental_status(opts)),
            None => {}
        }
        let change = match &self.inp.change {
            Err(e) => {
                return b.error(
                    EventReason::InvalidRayService,
                    e.to_string(),
                    Some(Gate::Hold),
                );
            }
            Ok(None) => return self.nothing_pending(b),
            Ok(Some(c)) => c,
        };
        self.record_pending(b, change);
        match (&self.svc.kueue, &self.inp.quota) {
            (Some(kueue), _) if !kueue.elastic => {
                return b.rule(kueue_would_suspend(change, kueue, &b.prev));
            }
            (Some(kueue), None) => return b.rule(kueue_support_off(change, kueue, &b.prev)),
            _ => {}
        }
        let batched =
            crate::admission::batch::gather(b, self.inp, self.settings.batching.as_ref(), change);
        let holds = crate::admission::holds(
            self.inp.plan,
            self.settings,
            &change.fingerprint,
            self.now(),
        );
        // A change held by its policy waits for a human first; the windows
        // are checked once the policy lets it through.
        let held = holds.iter().find(|h| h.is_policy());
        // A batch is gathered whatever the approval; a pause still shows first.
        if let (Some(until), Some(policy)) = (batched, &self.settings.batching)
            && held != Some(&Hold::Paused)
        {
            return crate::admission::batch::hold(b, self.inp, policy, until);
        }
        if held.is_none() && self.approval_is_news(b, change) {
            self.approved(b, change);
        }
        if held.is_none()
            && let Some(window) = holds.first()
        {
            let r = Ruling::new(window.phase(), WaitingFor::from(window), window.message());
            return b.rule(r.outcome(window.outcome()));
        }
        let report = match crate::admission::fit::of_change(self.inp, self.settings, change) {
            Ok(r) => r,
            Err(e) => {
                return b.error(
                    EventReason::InvalidRayService,
                    e.to_string(),
                    Some(Gate::Hold),
                );
            }
        };
        b.status.capacity = Some(render::capacity_status(&report));
        b.observed.fitted(&report);
        b.conditions([capacity_condition(&report)]);
        b.resources_offered(&self.settings.headroom, &report);
        if let Some(hold) = held {
            return b.rule(await_policy(change, &report, hold, &b.prev));
        }
        if report.fits {
            match &self.inp.gate.other_owner {
                Some(owner) => b.rule(self.overridden(change, owner)),
                None => {
                    if let (Some(kueue), Some(quota)) = (&self.svc.kueue, &self.inp.quota)
                        && !crate::admission::quota::allows(
                            b,
                            change,
                            &report,
                            kueue,
                            quota,
                            self.inp.plan.metadata.name.as_deref().unwrap_or_default(),
                        )
                    {
                        return;
                    }
                    self.admit(b, change, &report)
                }
            }
        } else {
            b.rule(wait_for_capacity(change, &report, &b.prev));
        }
    }

    /// Nothing needs a new cluster: `Idle`, or still `Completed` after a
    /// transition.
    fn nothing_pending(&self, b: &mut Builder<'_>) {
        b.status.pending_change = None;
        let completed = b.prev.last_transition.as_ref().and_then(|t| t.outcome)
            == Some(TransitionOutcome::Completed)
            && b.prev.phase == Phase::Completed;
        b.status.phase = if completed {
            Phase::Completed
        } else {
            Phase::Idle
        };
        let verdict = self
            .inp
            .verdict
            .map(|v| format!("{v:?}"))
            .unwrap_or_default();
        if completed {
            // What the completing decision wrote ([`Self::promoted`]) stays:
            // deciding again on it writes nothing.
            b.status.message = b.prev.message.clone();
            b.condition(
                condition::UPGRADE_ADMITTED,
                Status::False,
                Reason::Completed,
                "transition completed",
            );
        } else {
            b.status.message = Some(format!("no new cluster needed (verdict {verdict})"));
            b.condition(
                condition::UPGRADE_ADMITTED,
                Status::False,
                Reason::NoPendingChange,
                "nothing to admit",
            );
        }
        b.conditions(no_new_cluster_needed());
        b.requeue = REQUEUE_IDLE;
    }

    /// The pending change, seen since its first detection.
    fn record_pending(&self, b: &mut Builder<'_>, change: &ChangeFacts) {
        let detected = match &b.prev.pending_change {
            Some(p) if p.fingerprint == change.fingerprint => p.detected_time,
            _ => self.now(),
        };
        b.status.pending_change = Some(PendingChange {
            fingerprint: change.fingerprint.clone(),
            triggering_paths: change.triggering_paths.clone(),
            detected_time: detected,
        });
        b.condition(
            condition::UPGRADE_ADMITTED,
            Status::False,
            Reason::Pending,
            "waiting for admission",
        );
        b.requeue = REQUEUE_WAITING;
    }

    /// The approval of `change`, with who gave it, for the audit trail.
    fn approved(&self, b: &mut Builder<'_>, change: &ChangeFacts) {
        let by = render::approver(self.inp.plan)
            .map(|m| format!(" by field manager {m}"))
            .unwrap_or_default();
        b.change_event(
            false,
            EventReason::Approved,
            &change.fingerprint,
            format!("change {} approved (spec.approve){by}", change.fingerprint),
        );
    }

    /// `policy: Manual` and this change's approval not acted on yet: it was
    /// waiting for it, or arrives approved.
    fn approval_is_news(&self, b: &Builder<'_>, change: &ChangeFacts) -> bool {
        let fp = change.fingerprint.as_str();
        let same = |x: Option<&str>| x == Some(fp);
        let pending = b
            .prev
            .pending_change
            .as_ref()
            .map(|p| p.fingerprint.as_str());
        // An `Error` keeps the pending change it had, so it cannot tell: no
        // Event rather than one per retry.
        self.inp.plan.spec.policy == Policy::Manual
            && (matches!(b.prev.phase, Phase::WaitingForApproval | Phase::Batching)
                || (b.prev.phase != Phase::Error && !same(pending)))
            && !same(b.prev.admitted.as_ref().map(|a| a.fingerprint.as_str()))
    }

    /// A change that fits while another field manager owns the gate: raygate
    /// cannot open it (or, when it already reads open, could not close it
    /// again), so nothing is admitted or reserved. KubeRay may still start
    /// the upgrade on that manager's value: it is then tracked as unadmitted.
    fn overridden(&self, change: &ChangeFacts, owner: &str) -> Ruling {
        let value = self.inp.gate.value.as_ref().map_or("unset", |v| v.as_str());
        let fp = &change.fingerprint;
        let message = format!(
            "change {fp} fits, but field manager {owner:?} owns spec.upgradeStrategy.type ({value}): \
             raygate cannot set it, so it admits nothing and reserves nothing; remove upgradeStrategy.type \
             from that manager's source of truth (see the GitOps guide)"
        );
        Ruling::new(
            Phase::Pending,
            WaitingFor::Hold(waiting::HoldKind::GateOverridden),
            message,
        )
        .condition(Cond::set(
            condition::UPGRADE_ADMITTED,
            Status::False,
            Reason::GateOverridden,
            format!(
                "change {fp} fits but is not admitted: field manager {owner:?} owns spec.upgradeStrategy.type ({value})"
            ),
        ))
        .gate(Gate::Hold)
        .requeue(REQUEUE_WAITING)
    }

    fn admit(
        &self,
        b: &mut Builder<'_>,
        change: &ChangeFacts,
        report: &crate::capacity::FitReport,
    ) {
        // No longer pending: `admitted` names it from here on, as the next
        // decision (rule 2) says (one status write per admission, not two).
        b.status.pending_change = None;
        b.status.admitted = Some(Admission {
            fingerprint: change.fingerprint.clone(),
            admitted_time: self.now(),
            from_cluster: b.status.active_cluster.clone(),
            to_cluster: None,
            surge: change
                .surge
                .as_ref()
                .map(|s| s.budget.clone())
                .unwrap_or_default(),
        });
        if let (Some(inc), Some(_)) = (b.status.incremental.as_mut(), &change.surge) {
            inc.surge_held = render::quantities(&report.new_requests);
            inc.last_progress_time = Some(self.now());
        }
        let batch = crate::admission::batch::admitted(b);
        let fp = &change.fingerprint;
        let event = change_event(
            false,
            EventReason::Admitted,
            fp,
            format!(
                "admitted change {fp}{batch} ({}); new cluster requests {}",
                change
                    .triggering_paths
                    .first()
                    .map(String::as_str)
                    .unwrap_or("rayClusterConfig"),
                render::resources_text(&report.new_requests)
            ),
        );
        b.rule(
            self.awaiting_kuberay_ruling()
                .condition(Cond::set(
                    condition::UPGRADE_ADMITTED,
                    Status::True,
                    Reason::Admitted,
                    format!("change {fp} admitted"),
                ))
                .outcome(Outcome::Admitted)
                .requeue(REQUEUE_ACTIVE)
                .event(event),
        );
    }
}

/// `CapacityAvailable` for a fitted change.
fn capacity_condition(report: &crate::capacity::FitReport) -> Cond {
    if report.fits {
        Cond::set(
            condition::CAPACITY_AVAILABLE,
            Status::True,
            Reason::Fits,
            "the new cluster fits in free capacity",
        )
    } else {
        let (_, long) = render::shortfall_text(report);
        Cond::set(
            condition::CAPACITY_AVAILABLE,
            Status::False,
            Reason::InsufficientCapacity,
            long,
        )
    }
}

/// The new cluster does not fit: wait, with the exact shortfall; one
/// Warning Event when the change starts waiting.
fn wait_for_capacity(
    change: &ChangeFacts,
    report: &crate::capacity::FitReport,
    prev: &UpgradePlanStatus,
) -> Ruling {
    let fp = &change.fingerprint;
    let (short, long) = render::shortfall_text(report);
    let news = !same_wait(prev, Some(Phase::WaitingForCapacity), None, Some(fp));
    let event = change_event(true, EventReason::WaitingForCapacity, fp, long.clone());
    Ruling::new(Phase::WaitingForCapacity, WaitingFor::Capacity(short), long)
        .outcome(Outcome::HeldCapacity)
        .event_if(news, event)
}

/// Held by policy, with what the change needs and whether it would fit
/// now; one Event when the change starts waiting.
fn await_policy(
    change: &ChangeFacts,
    report: &crate::capacity::FitReport,
    hold: &Hold,
    prev: &UpgradePlanStatus,
) -> Ruling {
    let needs = render::needs_text(report);
    let fp = &change.fingerprint;
    let (reason, what) = match hold {
        Hold::Paused => (EventReason::Paused, "is held: the plan's policy is Paused"),
        // Only policy holds come here.
        Hold::Approval { .. }
        | Hold::Window { .. }
        | Hold::Batching { .. }
        | Hold::GateOverridden { .. } => (
            EventReason::WaitingForApproval,
            "waits for approval (policy Manual)",
        ),
    };
    let news = !same_wait(prev, Some(hold.phase()), None, Some(fp));
    let paths = change.triggering_paths.join(", ");
    let event = change_event(
        false,
        reason,
        fp,
        format!("change {fp} ({paths}) {what}; {needs}"),
    );
    let message = format!("{}; {needs}", hold.message());
    Ruling::new(hold.phase(), WaitingFor::from(hold), message)
        .outcome(hold.outcome())
        .event_if(news, event)
}
