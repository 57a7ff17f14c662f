//! The rules of the decision, in order (rule 1 here, rule 2 in `track.rs`,
//! rule 3 in `suspension.rs`, rule 4 in `pending.rs`; their tests in
//! `admission/tests/{inputs,tracking,pending}.rs`, `kueue_tests.rs` and
//! `incremental_tests.rs`):
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
//!    after `stallAfter`. One KubeRay left stamped with the deleted Workload
//!    (it missed Kueue's stop and restart, so Kueue would keep its pods
//!    gated) has the gate opened until KubeRay builds it again
//!    (`quota::rebuild`), unless a further change waits.
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
//! A rule that ends the decision returns a [`Ruling`] (the phase, what the
//! plan waits for, the message, the conditions it rests on, its Event when
//! it is news: [`ruling`]) and [`Builder::rule`] writes it out once; what
//! a rule records on its way (the pending change, the admission, a
//! transition's Events) goes on the [`Builder`] directly. `waitingFor` is a
//! [`WaitingFor`], spelled in [`waiting`] only.

use std::time::Duration;

use jiff::Timestamp;

use super::render::{self, Builder};
use super::{
    ADMISSION_TTL, ChangeFacts, EventReason, Gate, Hold, Inputs, Outcome, REQUEUE_ACTIVE,
    REQUEUE_IDLE, REQUEUE_WAITING, ServiceFacts, Settings, stall,
};
use crate::kuberay::ReleaseProblem;
use crate::upgradeplan::{
    Admission, Fingerprint, PendingChange, Phase, Policy, TransitionOutcome, TransitionRecord,
    UpgradePlanStatus, condition,
};
use condition::{Reason, Status};

mod pending;
pub mod ruling;
mod suspension;
mod track;
pub mod waiting;

use ruling::{Cond, Ruling, change_event, same_wait};
pub use waiting::WaitingFor;

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
        (_, None) => b.rule(
            Ruling::new(
                Phase::Pending,
                WaitingFor::FirstCluster,
                "the RayService has no active RayCluster yet; KubeRay is creating it",
            )
            .gate(Gate::Hold)
            .requeue(REQUEUE_ACTIVE),
        ),
        (None, Some(_)) => r.evaluate(b),
    }
}

/// The hold a pending change waits for, as `waitingFor` names it (here, not
/// in [`waiting`]: a hold is rendered with the plan's texts, so `waiting`
/// stays a leaf the renderer can import).
impl From<&Hold> for WaitingFor {
    fn from(h: &Hold) -> Self {
        use waiting::HoldKind;
        WaitingFor::Hold(match h {
            Hold::Paused => HoldKind::Paused,
            Hold::Approval { .. } => HoldKind::Approval,
            Hold::Window { .. } => HoldKind::Window,
            Hold::Batching { .. } => HoldKind::Batching,
            Hold::GateOverridden { .. } => HoldKind::GateOverridden,
        })
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

    fn change_fingerprint(&self) -> Option<Fingerprint> {
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

    /// Admitted, until KubeRay names the new cluster: the gate open with the
    /// plan's `upgradeType`.
    fn awaiting_kuberay_ruling(&self) -> Ruling {
        Ruling::new(
            Phase::Admitted,
            WaitingFor::KubeRay,
            "admitted; waiting for KubeRay to create the new cluster",
        )
        .gate(Gate::open(self.settings.upgrade_type))
    }

    /// How long the transition of `admitted` has run.
    fn running_for(&self, admitted: &Admission) -> Duration {
        Duration::try_from(self.now().duration_since(admitted.admitted_time)).unwrap_or_default()
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

/// Nothing needs a new cluster (idle, suspended, or a transition just
/// completed): the capacity conditions say so, the last fit's figures go.
fn no_new_cluster_needed() -> [Cond; 2] {
    [
        // Checked on the next change's fit.
        Cond::Drop(condition::RESOURCES_OFFERED),
        Cond::set(
            condition::CAPACITY_AVAILABLE,
            Status::True,
            Reason::NoPendingChange,
            "no new cluster needed",
        ),
    ]
}
