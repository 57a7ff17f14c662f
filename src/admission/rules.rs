//! The rules of the decision, in order:
//!
//! 1. A plan or RayService that cannot be read is an `Error`; the gate stays
//!    closed (a broken input never opens it). The KubeRay release whose rules
//!    apply is recorded ([`crate::kuberay::release`]); one without
//!    `spec.upgradeStrategy` (before v1.3) is an `Error` and the gate is not touched.
//!    A RayService with another UID than the one recorded was deleted and
//!    recreated: the old one's admission ends `Replaced`, and the new one is
//!    decided from an empty status.
//! 2. An admitted change is tracked: `Admitted` until KubeRay names the new
//!    cluster (gate open), then `Upgrading` (gate closed again so a further
//!    commit cannot start another cluster: such a commit is shown as the next
//!    batch, `batch::during_transition`; an incremental upgrade's stays open
//!    until the new cluster is promoted, as KubeRay moves traffic only under
//!    that type), `Stalled` when [`super::stall`]
//!    says so, `Completed` once the old cluster and its pods are gone. A
//!    Kueue-managed new cluster whose re-derived Workload Kueue does not admit
//!    (`quota::refresh`, path B) stays suspended: `Upgrading` waiting
//!    for `KueueWorkloadPending` (Kueue's reason, a Warning Event), `Stalled`
//!    after `stallAfter`.
//! 3. A serving cluster that is suspended, or that `rayClusterConfig.suspend:
//!    true` is about to suspend in place (KubeRay v1.5.2–v1.6.2), is
//!    `Suspended` (condition `ServiceSuspended`, a Warning Event), never `Idle`:
//!    after KubeRay's in-place rewrite the spec equals the live cluster and
//!    nothing looks changed. The gate stays closed.
//!    A change that needs a new cluster on a RayService Kueue manages
//!    without `kueue.x-k8s.io/elastic-job: "true"` is held (`KueueWouldSuspend`,
//!    a Warning Event): Kueue would turn it into a suspension, an outage.
//!    An elastic one is held too while raygate's Kueue support is off
//!    (`KueueSupportOff`): Kueue would keep its new cluster's pods gated.
//!    Then, a plan with `spec.upgradeType: NewClusterWithIncrementalUpgrade` whose
//!    RayService or KubeRay release cannot upgrade so is an `Error` (the
//!    reason and field in the message, [`crate::kuberay::incremental`]); the
//!    gate stays closed.
//! 4. A pending change waits for policy `Paused`, then its batch
//!    (`spec.batching`, [`super::batch`]: until the cluster spec is quiet,
//!    at most `maxDelay`; approving its fingerprint releases it), then
//!    `Manual` approval, the maintenance window, then capacity: the new cluster's pods (an
//!    incremental upgrade's: its surge, [`super::surge`]) must fit in free
//!    capacity minus the ledger's reservations and the plan's headroom. The
//!    gate opens with the plan's `upgradeType`. A change held by policy is
//!    fitted too, so what it needs and whether it would fit are reported
//!    while it waits for a human. A change that fits is not admitted while
//!    another field manager owns the gate (e.g. the RayService's creator set
//!    `spec.upgradeStrategy.type`): raygate could not open it, so it stays
//!    `Pending` (GateOverridden), with no Admitted Event and nothing reserved.
//!    A RayService Kueue manages (with raygate's Kueue support on) must then
//!    fit its ClusterQueue's quota too, and Kueue must have admitted raygate's
//!    reservation Workload for the new cluster ([`super::quota`]):
//!    `WaitingForQuota` until then.
//!
//! Each rule fills in a [`Builder`]; [`super::render`] writes the result out.

use std::time::Duration;

use jiff::Timestamp;

use super::render::{self, Builder};
use super::{
    ADMISSION_TTL, ChangeFacts, EventReason, Gate, Hold, Inputs, Outcome, REQUEUE_ACTIVE,
    REQUEUE_IDLE, REQUEUE_WAITING, ServiceFacts, Settings, stall,
};
use crate::kuberay::ReleaseProblem;
use crate::upgradeplan::{
    Admission, PendingChange, Phase, Policy, TransitionOutcome, TransitionRecord, condition,
};
use condition::{Reason, Status};

/// Rule 1, then rules 2 and 3.
pub(super) fn apply(b: &mut Builder<'_>, inp: &Inputs<'_>) {
    let (settings, svc) = match (&inp.settings, &inp.service) {
        (Ok(settings), Ok(svc)) => (settings, svc),
        (settings, service) => {
            // Every problem at once, so fixing one does not reveal the next.
            let mut problems = vec![];
            if let Err(e) = settings {
                problems.push((EventReason::InvalidSpec, e.to_string()));
            }
            if let Err(e) = service {
                problems.push((EventReason::RayServiceUnavailable, e.to_string()));
            }
            // A RayService that is not there is never written: an apply
            // would create it.
            let gate = service.is_ok().then_some(Gate::Hold);
            return b.errors(&problems, gate);
        }
    };
    b.kuberay_release(&inp.release);
    if let Some((ReleaseProblem::NotGateable, msg)) = inp.release.problem() {
        // The field is pruned by such a release's CRD: nothing to write.
        return b.error(EventReason::KubeRayNotGateable, msg, None);
    }
    b.status.active_cluster = svc.active_cluster.clone();
    b.status.pending_cluster = svc.pending_cluster.clone();
    if svc.suspension.is_none() {
        b.drop_condition(condition::SERVICE_SUSPENDED);
    }
    b.status.windows = super::hold::windows_status(settings, inp.now);
    let r = Rules { inp, svc, settings };
    if let (Some(was), Some(is)) = (b.prev.ray_service_uid.clone(), svc.uid.as_deref())
        && was != is
    {
        r.replaced(b, &was, is);
    }
    b.status.ray_service_uid = svc.uid.clone();
    if let Some(admitted) = b.prev.admitted.clone() {
        return r.track(b, admitted);
    }
    match (&svc.pending_cluster, &svc.active_cluster) {
        // A transition raygate did not admit: the gate was overridden, or it
        // started before the plan existed. Track it rather than pretend.
        (Some(pending), Some(_)) => {
            let fingerprint = r.change_fingerprint().unwrap_or_default();
            b.change_event(
                true,
                EventReason::UnadmittedUpgrade,
                &fingerprint,
                format!("KubeRay started cluster {pending} without raygate's admission"),
            );
            let unadmitted = Admission {
                fingerprint,
                admitted_time: inp.now,
                from_cluster: svc.active_cluster.clone(),
                to_cluster: Some(pending.clone()),
                surge: vec![],
            };
            r.track(b, unadmitted)
        }
        // A RayService raygate refuses whole (over its bounds) is refused at once,
        // not only once KubeRay has made its first cluster.
        (_, None) if let Err(e) = &inp.change => b.error(
            EventReason::InvalidRayService,
            e.to_string(),
            Some(Gate::Hold),
        ),
        (_, None) => {
            b.status.phase = Phase::Pending;
            b.waiting(
                "first cluster",
                "the RayService has no active RayCluster yet; KubeRay is creating it",
            );
            b.gate = Some(Gate::Hold);
            b.requeue = REQUEUE_ACTIVE;
        }
        (None, Some(_)) => r.evaluate(b),
    }
}

/// What every rule reads.
struct Rules<'a> {
    inp: &'a Inputs<'a>,
    svc: &'a ServiceFacts,
    settings: &'a Settings,
}

impl Rules<'_> {
    fn now(&self) -> Timestamp {
        self.inp.now
    }

    /// The pending cluster's pods as the Kueue Workload refresh reads them.
    fn pending_pods(&self, admitted: &Admission) -> super::quota::PendingPods {
        let pods = self
            .svc
            .pending_cluster
            .as_ref()
            .and_then(|c| self.inp.pods.get(c))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let live = || pods.iter().filter(|p| !p.is_terminal());
        let since = self.now().duration_since(admitted.admitted_time);
        super::quota::PendingPods {
            head: live().any(|p| p.node_type() == Some(super::observed::HEAD)),
            any_bound: live().any(|p| p.is_bound()),
            since_admission: std::time::Duration::try_from(since).unwrap_or_default(),
        }
    }

    fn change_fingerprint(&self) -> Option<String> {
        self.inp
            .change
            .as_ref()
            .ok()
            .and_then(|c| c.as_ref())
            .map(|c| c.fingerprint.clone())
    }

    /// Rule 1: the RayService was deleted and recreated under the same name
    /// (another UID). What the plan recorded belongs to the old object: its
    /// transition ends `Replaced` (never `Completed` by the new object's
    /// clusters), its pending change is dropped, and the rules go on from
    /// an empty status, as for a new RayService.
    fn replaced(&self, b: &mut Builder<'_>, was: &str, is: &str) {
        let name = &self.inp.plan.spec.ray_service_ref.name;
        let prev = std::mem::take(&mut b.prev);
        b.prev.conditions = prev.conditions;
        b.status.last_transition = None;
        let what = match &prev.admitted {
            Some(admitted) => {
                b.status.last_transition = Some(self.ended(admitted, TransitionOutcome::Replaced));
                format!(
                    "; the transition of change {} ended unfinished (Replaced)",
                    admitted.fingerprint
                )
            }
            None => String::new(),
        };
        b.event(
            true,
            EventReason::RayServiceReplaced,
            format!(
                "RayService {name} was deleted and recreated (UID {was} is now {is}){what}; \
                 the new RayService starts afresh"
            ),
        );
    }

    /// Rules 3 and 4: a change that is not admitted yet.
    fn evaluate(&self, b: &mut Builder<'_>) {
        b.gate = Some(Gate::Hold);
        // A change not admitted holds no quota unless this decision says so.
        b.status.quota = None;
        b.drop_condition(condition::QUOTA_AVAILABLE);
        if let Some(s) = &self.svc.suspension {
            return self.suspended(b, s);
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
            (Some(kueue), _) if !kueue.elastic => return kueue_would_suspend(b, change, kueue),
            (Some(kueue), None) => return kueue_support_off(b, change, kueue),
            _ => {}
        }
        let batched = super::batch::gather(b, self.inp, self.settings.batching.as_ref(), change);
        let holds = super::holds(
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
            return super::batch::hold(b, self.inp, policy, until);
        }
        if held.is_none() && self.approval_is_news(b, change) {
            self.approved(b, change);
        }
        if held.is_none()
            && let Some(window) = holds.first()
        {
            return b.hold(
                window.phase(),
                window.waiting_for(),
                &window.message(),
                window.outcome(),
            );
        }
        let report = match super::fit::of_change(self.inp, self.settings, change) {
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
        capacity_condition(b, &report);
        b.resources_offered(&self.settings.headroom, &report);
        if let Some(hold) = held {
            return self.await_policy(b, change, &report, hold);
        }
        if report.fits {
            match &self.inp.gate.other_owner {
                Some(owner) => self.overridden(b, change, owner),
                None => {
                    if let (Some(kueue), Some(quota)) = (&self.svc.kueue, &self.inp.quota)
                        && !super::quota::allows(
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
            wait_for_capacity(b, change, &report);
        }
    }

    /// Rule 3a: the serving cluster is suspended or being suspended in
    /// place: `Suspended`, never `Idle`, whatever the verdict (once KubeRay
    /// has rewritten the cluster, the spec equals it and nothing "changed").
    /// The gate stays closed; one Warning Event when it starts.
    fn suspended(&self, b: &mut Builder<'_>, s: &super::Suspension) {
        b.status.pending_change = None;
        b.status.phase = Phase::Suspended;
        let by = match &self.svc.kueue {
            Some(k) => format!(
                "; the RayService is managed by Kueue (LocalQueue {}), which suspends a RayService \
                 whose cluster spec no longer matches its Workload and resumes it once it admits \
                 the new one (docs/kueue.md)",
                k.queue
            ),
            None => String::new(),
        };
        let (reason, short, long) = match s {
            super::Suspension::Applying { outage } => (
                Reason::Suspending,
                "suspension (outage)",
                format!("spec.rayClusterConfig.suspend is true: {outage}{by}"),
            ),
            super::Suspension::Suspended { cluster } => (
                Reason::ClusterSuspended,
                "suspended",
                format!(
                    "the active RayCluster {cluster} is suspended (spec.suspend: true): no pod serves; \
                     clear spec.rayClusterConfig.suspend to resume it{by}"
                ),
            ),
        };
        b.condition(condition::SERVICE_SUSPENDED, Status::True, reason, &long);
        b.condition(
            condition::UPGRADE_ADMITTED,
            Status::False,
            Reason::NoPendingChange,
            "the service is suspended: nothing to admit",
        );
        no_new_cluster_needed(b);
        b.waiting(short, &long);
        b.requeue = REQUEUE_ACTIVE;
        let news = b.prev.phase != Phase::Suspended || b.prev.waiting_for.as_deref() != Some(short);
        if news {
            b.event(true, EventReason::ServiceSuspended, long);
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
        no_new_cluster_needed(b);
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

    /// Held by policy, with what the change needs and whether it would fit
    /// now; one Event when the change starts waiting.
    fn await_policy(
        &self,
        b: &mut Builder<'_>,
        change: &ChangeFacts,
        report: &crate::capacity::FitReport,
        hold: &Hold,
    ) {
        let needs = render::needs_text(report);
        let fp = &change.fingerprint;
        let (phase, short, how) = (hold.phase(), hold.waiting_for(), hold.message());
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
        let news = b.prev.phase != phase
            || b.prev
                .pending_change
                .as_ref()
                .map(|p| p.fingerprint.as_str())
                != Some(fp);
        b.hold(phase, short, &format!("{how}; {needs}"), hold.outcome());
        if news {
            let paths = change.triggering_paths.join(", ");
            b.change_event(
                false,
                reason,
                fp,
                format!("change {fp} ({paths}) {what}; {needs}"),
            );
        }
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
    fn overridden(&self, b: &mut Builder<'_>, change: &ChangeFacts, owner: &str) {
        let value = self.inp.gate.value.as_ref().map_or("unset", |v| v.as_str());
        b.condition(
            condition::UPGRADE_ADMITTED,
            Status::False,
            Reason::GateOverridden,
            &format!(
                "change {} fits but is not admitted: field manager {owner:?} owns spec.upgradeStrategy.type ({value})",
                change.fingerprint
            ),
        );
        b.status.phase = Phase::Pending;
        b.waiting(
            "GateOverridden",
            &format!(
                "change {} fits, but field manager {owner:?} owns spec.upgradeStrategy.type ({value}): \
                 raygate cannot set it, so it admits nothing and reserves nothing; remove upgradeStrategy.type \
                 from that manager's source of truth (see the GitOps guide)",
                change.fingerprint
            ),
        );
        b.gate = Some(Gate::Hold);
        b.requeue = REQUEUE_WAITING;
    }

    fn admit(
        &self,
        b: &mut Builder<'_>,
        change: &ChangeFacts,
        report: &crate::capacity::FitReport,
    ) {
        b.condition(
            condition::UPGRADE_ADMITTED,
            Status::True,
            Reason::Admitted,
            &format!("change {} admitted", change.fingerprint),
        );
        b.status.phase = Phase::Admitted;
        // No longer pending: `admitted` names it from here on, as the next
        // decision (rule 2) says (one status write per admission, not two).
        b.status.pending_change = None;
        b.waiting(
            "KubeRay",
            "admitted; waiting for KubeRay to create the new cluster",
        );
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
        b.gate = Some(Gate::open(self.settings.upgrade_type));
        b.outcome = Some(Outcome::Admitted);
        b.requeue = REQUEUE_ACTIVE;
        let batch = super::batch::admitted(b);
        b.change_event(
            false,
            EventReason::Admitted,
            &change.fingerprint,
            format!(
                "admitted change {}{batch} ({}); new cluster requests {}",
                change.fingerprint,
                change
                    .triggering_paths
                    .first()
                    .map(String::as_str)
                    .unwrap_or("rayClusterConfig"),
                render::resources_text(&report.new_requests)
            ),
        );
    }

    /// Rule 2: an admitted (or unadmitted but running) transition.
    fn track(&self, b: &mut Builder<'_>, admitted: Admission) {
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
        super::quota::refresh(b, self.svc, self.pending_pods(&admitted));
        let svc = self.svc;
        let to = svc
            .pending_cluster
            .as_deref()
            .or(admitted.to_cluster.as_deref());
        super::batch::during_transition(b, self.inp, to, &admitted.fingerprint);
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

    /// How long the transition of `admitted` has run.
    fn running_for(&self, admitted: &Admission) -> Duration {
        Duration::try_from(self.now().duration_since(admitted.admitted_time)).unwrap_or_default()
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
        b.status.phase = Phase::Admitted;
        b.waiting(
            "KubeRay",
            "admitted; waiting for KubeRay to create the new cluster",
        );
        b.status.admitted = Some(admitted);
        b.gate = Some(Gate::open(self.settings.upgrade_type));
    }

    /// KubeRay named a new cluster for an admission: adopt it only once its
    /// spec is known to be the admitted change.
    fn adopt(&self, b: &mut Builder<'_>, pending: &str, mut admitted: Admission) {
        match self.inp.pending_fingerprint.as_deref() {
            None => {
                b.status.admitted = Some(admitted);
                b.status.phase = Phase::Upgrading;
                b.waiting(
                    "new cluster",
                    &format!(
                        "KubeRay named cluster {pending}; it is checked against the admitted change once it exists"
                    ),
                );
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
                    fingerprint: fp.to_string(),
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
                Duration::try_from(self.now().duration_since(since)).unwrap_or_default()
            }
            None => running_for,
        };
        // Path B blocked: Kueue has not admitted the Workload it derived
        // again, so the new cluster stays suspended (not "progressing").
        if !self.inp.pending_ready
            && let Some(w) =
                super::quota::blocked(b.prev.quota.as_ref(), self.inp.quota.as_ref(), pending)
        {
            let w = w.clone();
            return kueue_workload_pending(
                b,
                pending,
                &w,
                &admitted,
                stalled_for,
                self.settings.stall_after,
            );
        }
        let pods: Vec<&super::observed::DynPod> = self
            .inp
            .pods
            .get(pending)
            .map(|p| p.iter().map(AsRef::as_ref).collect())
            .unwrap_or_default();
        match stall::diagnose(
            &pods,
            &self.svc.pending_apps,
            self.inp.pending_ready,
            stalled_for,
            self.settings.stall_after,
        ) {
            Some(mut s) => {
                if b.status.incremental.is_some() {
                    s.message = s
                        .message
                        .replace("; transition running for ", "; no incremental step for ");
                }
                stalled(b, s, &admitted)
            }
            None => {
                b.status.phase = Phase::Upgrading;
                b.status.waiting_for = Some(if self.inp.pending_ready {
                    "serve apps".into()
                } else {
                    "new cluster".into()
                });
                let steps = b.status.incremental.as_ref().map_or(String::new(), |inc| {
                    let pct = |v: Option<i32>| v.map_or("-".to_string(), |v| format!("{v}%"));
                    format!(
                        " (incremental: step {}, new cluster target capacity {}, traffic {}, old cluster target capacity {})",
                        inc.step.as_deref().unwrap_or("0"),
                        pct(inc.target_capacity),
                        pct(inc.traffic_routed_percent),
                        pct(inc.active_target_capacity),
                    )
                });
                // A time, not a duration: deciding again a second later
                // writes nothing (a duration rewrote the status each time).
                b.status.message = Some(format!(
                    "transition to {pending} running since {}{steps}{}",
                    admitted.admitted_time,
                    super::batch::next_note(b)
                ));
                b.condition(
                    condition::STALLED,
                    Status::False,
                    Reason::Progressing,
                    "transition is progressing",
                );
            }
        }
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
            b.status.phase = Phase::Upgrading;
            b.waiting(
                "old cluster deletion",
                &format!("promoted; waiting for KubeRay to delete {old} and its pods"),
            );
            return;
        }
        let took = stall::human_duration(self.running_for(&admitted));
        b.status.admitted = None;
        b.status.pending_change = None;
        b.status.last_transition = Some(self.ended(&admitted, TransitionOutcome::Completed));
        b.status.phase = Phase::Completed;
        b.status.waiting_for = None;
        b.status.capacity = None;
        // The transition is over: its quota reservation goes.
        b.status.quota = None;
        no_new_cluster_needed(b);
        b.status.message = Some(format!(
            "upgrade to {} completed in {took}",
            self.svc.active_cluster.as_deref().unwrap_or("?"),
        ));
        b.condition(
            condition::STALLED,
            Status::False,
            Reason::Completed,
            "transition completed",
        );
        b.condition(
            condition::UPGRADE_ADMITTED,
            Status::False,
            Reason::Completed,
            "transition completed",
        );
        b.outcome = Some(Outcome::Completed);
        b.change_event(
            false,
            EventReason::Completed,
            &admitted.fingerprint,
            format!("change {} completed in {took}", admitted.fingerprint),
        );
        b.requeue = REQUEUE_WAITING;
    }

    /// The record of a transition that is over.
    fn ended(&self, admitted: &Admission, outcome: TransitionOutcome) -> TransitionRecord {
        TransitionRecord {
            fingerprint: admitted.fingerprint.clone(),
            start: admitted.admitted_time,
            end: Some(self.now()),
            outcome: Some(outcome),
            duration_seconds: Some(self.running_for(admitted).as_secs() as i64),
        }
    }
}

/// Rule 3b: a change that needs a new cluster, on a RayService Kueue
/// manages without `elastic-job`: Kueue v0.19 stops such a RayService when
/// its pod sets no longer match its Workload (`ensureOneWorkload`, "No
/// matching Workload") by setting `rayClusterConfig.suspend`, which KubeRay
/// applies in place to the serving cluster (issue 38, case b). raygate
/// keeps the gate closed and says so; it cannot keep Kueue from acting on
/// the spec: the chart's ValidatingAdmissionPolicy refuses such an edit.
fn kueue_would_suspend(b: &mut Builder<'_>, change: &ChangeFacts, kueue: &crate::kueue::Managed) {
    let fp = &change.fingerprint;
    let path = change
        .triggering_paths
        .first()
        .map(String::as_str)
        .unwrap_or("rayClusterConfig");
    let long = format!(
        "change {fp} (spec.rayClusterConfig.{path}) is not admitted: Kueue v0.19 turns a rayClusterConfig \
         change of a RayService it manages (LocalQueue {}) into a suspension: KubeRay would rewrite \
         the serving cluster in place (an outage). Remedy: {}",
        kueue.queue,
        crate::kueue::REMEDY
    );
    kueue_hold(b, fp, KUEUE_WOULD_SUSPEND, long);
}

/// `status.waitingFor` of [`kueue_would_suspend`].
const KUEUE_WOULD_SUSPEND: &str = "KueueWouldSuspend";

/// Rule 3c: an elastic Kueue-managed RayService while raygate's Kueue
/// support is off (no `--kueue`): admitted, its new cluster's pods would stay
/// held by Kueue's `kueue.x-k8s.io/elastic-job` scheduling gate (measured on
/// Kueue v0.19.0: workload slices do not cover a NewCluster transition) and
/// its quota would be counted nowhere. Held, with the remedy.
fn kueue_support_off(b: &mut Builder<'_>, change: &ChangeFacts, kueue: &crate::kueue::Managed) {
    let fp = &change.fingerprint;
    let long = format!(
        "change {fp} is not admitted: the RayService is an elastic Kueue job (LocalQueue {}), whose new \
         cluster's pods Kueue v0.19 keeps gated (kueue.x-k8s.io/elastic-job) and whose quota it does not \
         count; raygate completes such an upgrade only with its Kueue support on (--kueue=auto finds \
         Kueue's API and its access at start-up, see raygate's start-up log; --kueue=true requires it; \
         chart kueue.reservations.enabled; docs/kueue.md)",
        kueue.queue
    );
    kueue_hold(b, fp, KUEUE_SUPPORT_OFF, long);
}

/// The hold of a Kueue rule (3b, 3c): `UpgradeAdmitted=False`, phase
/// `Pending` waiting for `waiting_for`, and one Warning Event per change and
/// kind of hold.
fn kueue_hold(b: &mut Builder<'_>, fp: &str, waiting_for: &str, long: String) {
    b.condition(
        condition::UPGRADE_ADMITTED,
        Status::False,
        Reason::KueueWouldSuspend,
        &long,
    );
    let news = b.prev.waiting_for.as_deref() != Some(waiting_for)
        || b.prev
            .pending_change
            .as_ref()
            .map(|p| p.fingerprint.as_str())
            != Some(fp);
    b.hold(Phase::Pending, waiting_for, &long, Outcome::HeldPolicy);
    if news {
        b.change_event(true, EventReason::KueueWouldSuspend, fp, long);
    }
}

/// `status.waitingFor` of [`kueue_support_off`].
const KUEUE_SUPPORT_OFF: &str = "KueueSupportOff";

/// `CapacityAvailable` for a fitted change.
fn capacity_condition(b: &mut Builder<'_>, report: &crate::capacity::FitReport) {
    if report.fits {
        b.condition(
            condition::CAPACITY_AVAILABLE,
            Status::True,
            Reason::Fits,
            "the new cluster fits in free capacity",
        );
    } else {
        let (_, long) = render::shortfall_text(report);
        b.condition(
            condition::CAPACITY_AVAILABLE,
            Status::False,
            Reason::InsufficientCapacity,
            &long,
        );
    }
}

/// Nothing needs a new cluster (idle, or a transition just completed): the
/// capacity conditions say so, the last fit's figures go.
fn no_new_cluster_needed(b: &mut Builder<'_>) {
    // Checked on the next change's fit.
    b.drop_condition(condition::RESOURCES_OFFERED);
    b.condition(
        condition::CAPACITY_AVAILABLE,
        Status::True,
        Reason::NoPendingChange,
        "no new cluster needed",
    );
}

/// The new cluster does not fit: wait, with the exact shortfall.
fn wait_for_capacity(
    b: &mut Builder<'_>,
    change: &ChangeFacts,
    report: &crate::capacity::FitReport,
) {
    b.status.phase = Phase::WaitingForCapacity;
    let (short, long) = render::shortfall_text(report);
    b.waiting(&short, &long);
    b.outcome = Some(Outcome::HeldCapacity);
    if b.prev.phase != Phase::WaitingForCapacity
        || b.prev
            .pending_change
            .as_ref()
            .map(|p| p.fingerprint.as_str())
            != Some(change.fingerprint.as_str())
    {
        b.change_event(
            true,
            EventReason::WaitingForCapacity,
            &change.fingerprint,
            long,
        );
    }
}

/// `waitingFor` of a transition whose new cluster Kueue keeps suspended.
const KUEUE_WORKLOAD_PENDING: &str = "KueueWorkloadPending";

/// The new cluster `pending` stays suspended because Kueue has not admitted
/// `w`, the RayService's Workload raygate had it derive again (path B of
/// [`super::quota`]; e.g. its LocalQueue on `stopPolicy: Hold`, or no
/// quota): said as such, with Kueue's own reason, one Warning Event; after
/// `stallAfter` of the transition, `Stalled`. The old cluster serves on.
fn kueue_workload_pending(
    b: &mut Builder<'_>,
    pending: &str,
    w: &super::quota::ServiceWorkload,
    admitted: &Admission,
    running_for: Duration,
    stall_after: Duration,
) {
    let why = w.why.as_deref().unwrap_or("Kueue gave no reason");
    let msg = format!(
        "new cluster {pending} stays suspended: Kueue has not admitted Workload {} of the RayService \
         ({why}); the serving cluster is untouched",
        w.name
    );
    if running_for >= stall_after {
        let s = stall::Stall {
            reason: stall::StallReason::KueueWorkloadPending,
            message: format!(
                "{msg}; transition running for {}",
                stall::human_duration(running_for)
            ),
            unschedulable_pods: 0,
        };
        return stalled(b, s, admitted);
    }
    let news = b.prev.waiting_for.as_deref() != Some(KUEUE_WORKLOAD_PENDING);
    b.status.phase = Phase::Upgrading;
    b.status.waiting_for = Some(KUEUE_WORKLOAD_PENDING.into());
    b.status.message = Some(format!(
        "transition to {pending} running since {}: {msg}",
        admitted.admitted_time
    ));
    b.condition(
        condition::STALLED,
        Status::False,
        Reason::KueueWorkloadPending,
        &msg,
    );
    if news {
        b.change_event(
            true,
            EventReason::KueueWorkloadPending,
            &admitted.fingerprint,
            format!(
                "change {}: {msg}; Stalled after stallAfter ({})",
                admitted.fingerprint,
                stall::human_duration(stall_after)
            ),
        );
    }
}

fn stalled(b: &mut Builder<'_>, s: stall::Stall, admitted: &Admission) {
    b.status.phase = Phase::Stalled;
    b.status.waiting_for = Some(s.reason.to_string());
    b.condition(
        condition::STALLED,
        Status::True,
        s.reason.condition_reason(),
        &s.message,
    );
    // KubeRay cancels a pending cluster only when the RayService spec goes
    // back to the active cluster's, and that spec belongs to the user: the
    // gate stays closed and the message says how to cancel.
    let msg = format!(
        "{}: {}; the gate stays closed; to cancel, revert spec.rayClusterConfig to the active cluster's config",
        s.reason, s.message
    );
    b.status.message = Some(msg.clone());
    if b.prev.phase != Phase::Stalled {
        b.outcome = Some(Outcome::Stalled);
        b.change_event(
            true,
            EventReason::Stalled,
            &admitted.fingerprint,
            format!(
                "transition of change {} stalled: {msg}",
                admitted.fingerprint
            ),
        );
    }
}
