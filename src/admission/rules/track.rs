//! Rule 2: an admitted (or unadmitted but running) transition, from the
//! admission to `Completed`, `Stalled` or `Abandoned`.

use super::*;

impl Rules<'_> {
    /// Rule 2: an admitted (or unadmitted but running) transition.
    pub(super) fn track(&self, b: &mut Builder<'_>, admitted: Admission) {
        // KubeRay moves traffic step by step only while the type says
        // NewClusterWithIncrementalUpgrade (`IsIncrementalUpgradeEnabled`); set
        // back to None it would switch all traffic to the new cluster at its
        // current size. An incremental transition keeps the gate open to its
        // end; a NewCluster one closes it so a further commit cannot start
        // another cluster.
        b.gate = Some(if admitted.surge.is_empty() {
            Gate::Hold
        } else {
            Gate::OpenIncremental
        });
        b.requeue = REQUEUE_ACTIVE;
        // What was measured at admission stays visible during the transition,
        // and the quota reservation stays held until it ends.
        b.status.capacity = b.prev.capacity.clone();
        b.status.quota = b.prev.quota.clone();
        b.status.incremental = b.prev.incremental.clone();
        let pods = self.pending_pods(&admitted);
        crate::admission::quota::refresh(b, self.svc, pods);
        let svc = self.svc;
        let to = svc
            .pending_cluster
            .as_deref()
            .or(admitted.to_cluster.as_deref());
        crate::admission::batch::during_transition(b, self.inp, to, &admitted.fingerprint);
        self.rebuild(b, &admitted, pods);
        match (&svc.pending_cluster, &admitted.to_cluster) {
            (None, None) if svc.active_cluster == admitted.from_cluster => {
                self.awaiting_kuberay(b, admitted)
            }
            (Some(pending), None) if !admitted.fingerprint.is_empty() => {
                self.adopt(b, pending, admitted)
            }
            (Some(pending), _) => self.transition(b, pending, admitted),
            // KubeRay dropped the new cluster without promoting it (the spec
            // was reverted): the transition is over, the old cluster stays.
            (None, Some(to)) if svc.active_cluster == admitted.from_cluster => {
                b.status.admitted = None;
                b.status.last_transition =
                    Some(self.ended(&admitted, TransitionOutcome::Abandoned));
                b.change_event(
                    true,
                    EventReason::Abandoned,
                    &admitted.fingerprint,
                    format!(
                        "KubeRay dropped new cluster {to} of change {} without promoting it",
                        admitted.fingerprint
                    ),
                );
                self.evaluate(b)
            }
            // Promoted (or never named and the active cluster changed under us).
            _ => self.promoted(b, admitted),
        }
    }

    /// KubeRay missed Kueue's restart of the RayService after the refresh
    /// (`quota::rebuild`): the gate opens so KubeRay builds the new cluster
    /// again, stamped as Kueue admitted it. Not for an incremental upgrade
    /// (its gate is open anyway), nor while a further change waits as the
    /// next batch or the spec cannot be read: it would go with it.
    fn rebuild(
        &self,
        b: &mut Builder<'_>,
        admitted: &Admission,
        pods: crate::admission::quota::PendingPods,
    ) {
        if !admitted.surge.is_empty() || b.status.batch.is_some() || self.inp.change.is_err() {
            return;
        }
        let Some(note) = crate::admission::quota::rebuild(
            b.status.quota.as_ref(),
            self.svc,
            &self.inp.pending_stamp,
            pods,
        ) else {
            return;
        };
        b.gate = Some(Gate::Open);
        if !Gate::Open.is_set(self.inp.gate.value.as_ref()) {
            b.change_event(false, EventReason::Upgrading, &admitted.fingerprint, note);
        }
    }

    /// The pending cluster's pods as the Kueue Workload refresh reads them.
    fn pending_pods(&self, admitted: &Admission) -> crate::admission::quota::PendingPods {
        let pods = self
            .svc
            .pending_cluster
            .as_ref()
            .and_then(|c| self.inp.pods.get(c))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let live = || pods.iter().filter(|p| !p.is_terminal());
        let since = self.now().duration_since(admitted.admitted_time);
        crate::admission::quota::PendingPods {
            head: live().any(|p| p.node_type() == Some(crate::admission::observed::HEAD)),
            any_bound: live().any(|p| p.is_bound()),
            since_admission: std::time::Duration::try_from(since).unwrap_or_default(),
        }
    }

    /// Admitted, KubeRay has not acted yet: the gate stays open unless the
    /// spec moved on or the admission is too old to trust.
    fn awaiting_kuberay(&self, b: &mut Builder<'_>, admitted: Admission) {
        if self.change_fingerprint().as_deref() != Some(admitted.fingerprint.as_str()) {
            // The spec moved on (new commit or revert) before KubeRay acted:
            // withdraw and evaluate what is there now.
            b.status.admitted = None;
            b.change_event(
                false,
                EventReason::AdmissionWithdrawn,
                &admitted.fingerprint,
                format!(
                    "change {} was superseded before KubeRay started it",
                    admitted.fingerprint
                ),
            );
            return self.evaluate(b);
        }
        if self.running_for(&admitted) > ADMISSION_TTL {
            b.status.admitted = None;
            b.change_event(
                true,
                EventReason::AdmissionExpired,
                &admitted.fingerprint,
                format!(
                    "KubeRay did not start change {} within {}; fitting it again",
                    admitted.fingerprint,
                    stall::human_duration(ADMISSION_TTL)
                ),
            );
            return self.evaluate(b);
        }
        b.status.admitted = Some(admitted);
        b.rule(self.awaiting_kuberay_ruling());
    }

    /// KubeRay named a new cluster for an admission: adopt it only once its
    /// spec is known to be the admitted change.
    fn adopt(&self, b: &mut Builder<'_>, pending: &str, mut admitted: Admission) {
        match self.inp.pending_fingerprint.as_deref() {
            None => {
                b.status.admitted = Some(admitted);
                b.rule(Ruling::new(
                    Phase::Upgrading,
                    WaitingFor::NewCluster,
                    format!(
                        "KubeRay named cluster {pending}; it is checked against the admitted change once it exists"
                    ),
                ));
            }
            Some(fp) if fp != admitted.fingerprint => {
                b.change_event(
                    true,
                    EventReason::AdmissionMismatch,
                    &admitted.fingerprint,
                    format!(
                        "KubeRay built cluster {pending} from change {fp}, not from the admitted change {}; \
                         admission withdrawn, the gate stays closed and the transition is tracked as unadmitted",
                        admitted.fingerprint
                    ),
                );
                let unadmitted = Admission {
                    fingerprint: fp.into(),
                    admitted_time: self.now(),
                    from_cluster: admitted.from_cluster.clone(),
                    to_cluster: Some(pending.to_string()),
                    surge: vec![],
                };
                self.track(b, unadmitted)
            }
            Some(_) => {
                admitted.to_cluster = Some(pending.to_string());
                self.track(b, admitted)
            }
        }
    }

    /// The new cluster exists or existed: the transition is under way.
    fn transition(&self, b: &mut Builder<'_>, pending: &str, mut admitted: Admission) {
        admitted.to_cluster = Some(pending.to_string());
        b.status.admitted = Some(admitted.clone());
        b.status.last_transition = Some(TransitionRecord {
            fingerprint: admitted.fingerprint.clone(),
            start: admitted.admitted_time,
            end: None,
            outcome: None,
            duration_seconds: None,
        });
        // Once per new cluster: the first decision that records it, whether
        // or not an earlier one saw its name before its spec.
        let recorded = b
            .prev
            .admitted
            .as_ref()
            .map(|a| a.to_cluster.as_deref() == Some(pending));
        if recorded == Some(false) {
            let gate = if admitted.surge.is_empty() {
                "gate closed again"
            } else {
                "gate kept at NewClusterWithIncrementalUpgrade while KubeRay moves traffic"
            };
            b.change_event(
                false,
                EventReason::Upgrading,
                &admitted.fingerprint,
                format!(
                    "KubeRay is creating cluster {pending} for change {}; {gate}",
                    admitted.fingerprint
                ),
            );
        }
        let running_for = self.running_for(&admitted);
        // An incremental transition stalls when a step does not move for
        // stallAfter, however long the whole transition takes.
        let stalled_for = match b.status.incremental.as_mut() {
            Some(inc) => {
                let since =
                    render::incremental_progress(inc, self.svc, self.now(), admitted.admitted_time);
                stall::Elapsed::SinceStep(
                    Duration::try_from(self.now().duration_since(since)).unwrap_or_default(),
                )
            }
            None => stall::Elapsed::Transition(running_for),
        };
        let pods: Vec<&crate::admission::observed::DynPod> = self
            .inp
            .pods
            .get(pending)
            .map(|p| p.iter().map(AsRef::as_ref).collect())
            .unwrap_or_default();
        let blocked =
            crate::admission::quota::blocked(b.prev.quota.as_ref(), self.inp.quota.as_ref())
                .filter(|_| !self.inp.pending_ready);
        let stall_after = self.settings.stall_after;
        let ruling = match blocked {
            // Path B blocked: Kueue has not admitted the Workload it derived
            // again, so the new cluster stays suspended (not "progressing").
            Some(w) => {
                kueue_workload_pending(pending, w, &admitted, stalled_for, stall_after, &b.prev)
            }
            None => match stall::diagnose(
                &pods,
                &self.svc.pending_apps,
                self.inp.pending_ready,
                stalled_for,
                stall_after,
            ) {
                Some(s) => stalled(s, &admitted, &b.prev),
                None => progressing(
                    pending,
                    &admitted,
                    self.inp.pending_ready,
                    b.status.incremental.as_ref(),
                    crate::admission::batch::next_note(b),
                ),
            },
        };
        b.rule(ruling);
    }

    /// Promoted: `Completed` once the old cluster and its pods are gone.
    fn promoted(&self, b: &mut Builder<'_>, admitted: Admission) {
        // The new cluster serves everything: no step is left to take.
        b.gate = Some(Gate::Hold);
        let old = admitted.from_cluster.clone().unwrap_or_default();
        let inp = self.inp;
        let old_left =
            inp.clusters.contains(&old) || inp.pods.get(&old).is_some_and(|p| !p.is_empty());
        if old_left && !old.is_empty() {
            b.status.admitted = Some(admitted);
            return b.rule(Ruling::new(
                Phase::Upgrading,
                WaitingFor::OldClusterDeletion,
                format!("promoted; waiting for KubeRay to delete {old} and its pods"),
            ));
        }
        let took = stall::human_duration(self.running_for(&admitted));
        b.status.admitted = None;
        b.status.pending_change = None;
        b.status.last_transition = Some(self.ended(&admitted, TransitionOutcome::Completed));
        b.status.capacity = None;
        // The transition is over: its quota reservation goes.
        b.status.quota = None;
        let fp = &admitted.fingerprint;
        let message = format!(
            "upgrade to {} completed in {took}",
            self.svc.active_cluster.as_deref().unwrap_or("?"),
        );
        let completed = |type_| {
            Cond::set(
                type_,
                Status::False,
                Reason::Completed,
                "transition completed",
            )
        };
        let r = Ruling::new(Phase::Completed, None, message)
            .condition(completed(condition::STALLED))
            .condition(completed(condition::UPGRADE_ADMITTED))
            .outcome(Outcome::Completed)
            .requeue(REQUEUE_WAITING)
            .event(change_event(
                false,
                EventReason::Completed,
                fp,
                format!("change {fp} completed in {took}"),
            ));
        b.rule(r.conditions(no_new_cluster_needed()));
    }
}

/// The new cluster `pending` stays suspended because Kueue has not admitted
/// `w`, the RayService's Workload raygate had it derive again (path B of
/// [`crate::admission::quota`]; e.g. its LocalQueue on `stopPolicy: Hold`, or no
/// quota): said as such, with Kueue's own reason, one Warning Event; after
/// `stallAfter` of the transition, `Stalled`. The old cluster serves on.
fn kueue_workload_pending(
    pending: &str,
    w: &crate::admission::quota::ServiceWorkload,
    admitted: &Admission,
    elapsed: stall::Elapsed,
    stall_after: Duration,
    prev: &UpgradePlanStatus,
) -> Ruling {
    let why = w.why.as_deref().unwrap_or("Kueue gave no reason");
    let msg = format!(
        "new cluster {pending} stays suspended: Kueue has not admitted Workload {} of the RayService \
         ({why}); the serving cluster is untouched",
        w.name
    );
    if elapsed.duration() >= stall_after {
        let s = stall::Stall {
            reason: stall::StallReason::KueueWorkloadPending,
            message: format!("{msg}; {elapsed}"),
            unschedulable_pods: 0,
        };
        return stalled(s, admitted, prev);
    }
    let news = !same_wait(prev, None, Some(&WaitingFor::KueueWorkloadPending), None);
    let fp = &admitted.fingerprint;
    let event = change_event(
        true,
        EventReason::KueueWorkloadPending,
        fp,
        format!(
            "change {fp}: {msg}; Stalled after stallAfter ({})",
            stall::human_duration(stall_after)
        ),
    );
    let message = format!(
        "transition to {pending} running since {}: {msg}",
        admitted.admitted_time
    );
    Ruling::new(Phase::Upgrading, WaitingFor::KueueWorkloadPending, message)
        .condition(Cond::set(
            condition::STALLED,
            Status::False,
            Reason::KueueWorkloadPending,
            msg,
        ))
        .event_if(news, event)
}

/// The transition stalled: said with its reason and how to cancel; one
/// Warning Event when it stalls.
fn stalled(s: stall::Stall, admitted: &Admission, prev: &UpgradePlanStatus) -> Ruling {
    // KubeRay cancels a pending cluster only when the RayService spec goes
    // back to the active cluster's, and that spec belongs to the user: the
    // gate stays closed and the message says how to cancel.
    let msg = format!(
        "{}: {}; the gate stays closed; to cancel, revert spec.rayClusterConfig to the active cluster's config",
        s.reason, s.message
    );
    let fp = &admitted.fingerprint;
    let event = change_event(
        true,
        EventReason::Stalled,
        fp,
        format!("transition of change {fp} stalled: {msg}"),
    );
    let r = Ruling::new(Phase::Stalled, WaitingFor::Stalled(s.reason), msg)
        .condition(Cond::set(
            condition::STALLED,
            Status::True,
            s.reason.condition_reason(),
            s.message,
        ))
        .event_if(prev.phase != Phase::Stalled, event);
    match prev.phase {
        Phase::Stalled => r,
        _ => r.outcome(Outcome::Stalled),
    }
}

/// The transition to `pending` is moving: since when, and an incremental
/// upgrade's step, traffic and target capacities; `next` says what waits
/// for it to end.
fn progressing(
    pending: &str,
    admitted: &Admission,
    ready: bool,
    incremental: Option<&crate::upgradeplan::IncrementalStatus>,
    next: String,
) -> Ruling {
    let waiting_for = if ready {
        WaitingFor::ServeApps
    } else {
        WaitingFor::NewCluster
    };
    let steps = incremental.map_or(String::new(), |inc| {
        let pct = |v: Option<i32>| v.map_or("-".to_string(), |v| format!("{v}%"));
        format!(
            " (incremental: step {}, new cluster target capacity {}, traffic {}, old cluster target capacity {})",
            inc.step.as_deref().unwrap_or("0"),
            pct(inc.target_capacity),
            pct(inc.traffic_routed_percent),
            pct(inc.active_target_capacity),
        )
    });
    // A time, not a duration: deciding again a second later writes nothing
    // (a duration rewrote the status each time).
    let message = format!(
        "transition to {pending} running since {}{steps}{next}",
        admitted.admitted_time
    );
    Ruling::new(Phase::Upgrading, waiting_for, message).condition(Cond::set(
        condition::STALLED,
        Status::False,
        Reason::Progressing,
        "transition is progressing",
    ))
}
