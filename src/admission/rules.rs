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
//!    commit cannot start another cluster), `Stalled` when [`super::stall`]
//!    says so, `Completed` once the old cluster and its pods are gone.
//! 3. A pending change waits for policy (`Paused`, `Manual` approval), the
//!    maintenance window, then capacity: the new cluster's pods must fit in
//!    free capacity minus the ledger's reservations and the plan's headroom.
//!
//! Each rule fills in a [`Builder`]; [`super::render`] writes the result out.

use std::time::Duration;

use jiff::Timestamp;

use super::render::{self, Builder};
use super::{ADMISSION_TTL, ChangeFacts, Gate, Inputs, Outcome, ServiceFacts, Settings, stall};
use crate::kuberay::ReleaseProblem;
use crate::schedule;
use crate::upgradeplan::{
    Admission, PendingChange, Phase, Policy, TransitionOutcome, TransitionRecord, condition,
};

/// Requeue intervals: tight while something moves, relaxed when idle.
pub(crate) const REQUEUE_ACTIVE: Duration = Duration::from_secs(5);
pub(crate) const REQUEUE_WAITING: Duration = Duration::from_secs(15);
pub(crate) const REQUEUE_IDLE: Duration = Duration::from_secs(120);

/// Rule 1, then rules 2 and 3.
pub(super) fn apply(b: &mut Builder<'_>, inp: &Inputs<'_>) {
    let settings = match &inp.settings {
        Ok(s) => s,
        Err(e) => return b.error("InvalidSpec", e.to_string(), Some(Gate::Hold)),
    };
    let svc = match &inp.service {
        Ok(s) => s,
        Err(msg) => return b.error("RayServiceUnavailable", msg.clone(), None),
    };
    b.kuberay_release(&inp.release);
    if let Some((ReleaseProblem::NotGateable, msg)) = inp.release.problem() {
        // The field is pruned by such a release's CRD: nothing to write.
        return b.error("KubeRayNotGateable", msg, None);
    }
    b.status.active_cluster = svc.active_cluster.clone();
    b.status.pending_cluster = svc.pending_cluster.clone();
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
            b.event(
                true,
                "UnadmittedUpgrade",
                format!("KubeRay started cluster {pending} without raygate's admission"),
            );
            let unadmitted = Admission {
                fingerprint: r.change_fingerprint().unwrap_or_default(),
                admitted_time: inp.now,
                from_cluster: svc.active_cluster.clone(),
                to_cluster: Some(pending.clone()),
            };
            r.track(b, unadmitted)
        }
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
            "RayServiceReplaced",
            format!(
                "RayService {name} was deleted and recreated (UID {was} is now {is}){what}; \
                 the new RayService starts afresh"
            ),
        );
    }

    /// Rule 3: a change that is not admitted yet.
    fn evaluate(&self, b: &mut Builder<'_>) {
        b.gate = Some(Gate::Hold);
        let change = match &self.inp.change {
            Err(msg) => return b.error("InvalidRayService", msg.clone(), Some(Gate::Hold)),
            Ok(None) => return self.nothing_pending(b),
            Ok(Some(c)) => c,
        };
        self.record_pending(b, change);
        if self.held_by_policy(b, change) {
            return;
        }
        if !schedule::any_open(&self.settings.windows, self.now()) {
            return b.hold(
                Phase::Pending,
                "maintenance window",
                "no maintenance window is open now (UTC)",
                Outcome::HeldWindow,
            );
        }
        let report = match super::fit::of_change(self.inp, self.settings, change) {
            Ok(r) => r,
            Err(e) => return b.error("InvalidRayService", e.to_string(), Some(Gate::Hold)),
        };
        b.status.capacity = Some(render::capacity_status(&report));
        if report.fits {
            self.admit(b, change, &report);
        } else {
            wait_for_capacity(b, &report);
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
        b.status.message = Some(format!("no new cluster needed (verdict {verdict})"));
        b.condition(
            condition::UPGRADE_ADMITTED,
            false,
            "NoPendingChange",
            "nothing to admit",
        );
        b.condition(
            condition::CAPACITY_AVAILABLE,
            true,
            "NoPendingChange",
            "no new cluster needed",
        );
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
            false,
            "Pending",
            "waiting for admission",
        );
        b.requeue = REQUEUE_WAITING;
    }

    /// `Paused`, or `Manual` without this change's approval.
    fn held_by_policy(&self, b: &mut Builder<'_>, change: &ChangeFacts) -> bool {
        let spec = &self.inp.plan.spec;
        match spec.policy {
            Policy::Paused => b.hold(
                Phase::WaitingForApproval,
                "policy Paused",
                "the plan's policy is Paused; set policy to Auto or Manual to proceed",
                Outcome::HeldPolicy,
            ),
            Policy::Manual if spec.approve.as_deref() != Some(change.fingerprint.as_str()) => {
                let how = render::approval_hint(
                    self.inp.plan.metadata.name.as_deref().unwrap_or_default(),
                    &change.fingerprint,
                );
                b.hold(
                    Phase::WaitingForApproval,
                    "approval",
                    &how,
                    Outcome::HeldPolicy,
                )
            }
            _ => return false,
        }
        true
    }

    fn admit(
        &self,
        b: &mut Builder<'_>,
        change: &ChangeFacts,
        report: &crate::capacity::FitReport,
    ) {
        b.condition(
            condition::CAPACITY_AVAILABLE,
            true,
            "Fits",
            "the new cluster fits in free capacity",
        );
        b.condition(
            condition::UPGRADE_ADMITTED,
            true,
            "Admitted",
            &format!("change {} admitted", change.fingerprint),
        );
        b.status.phase = Phase::Admitted;
        b.waiting(
            "KubeRay",
            "admitted; waiting for KubeRay to create the new cluster",
        );
        b.status.admitted = Some(Admission {
            fingerprint: change.fingerprint.clone(),
            admitted_time: self.now(),
            from_cluster: b.status.active_cluster.clone(),
            to_cluster: None,
        });
        b.gate = Some(Gate::Open);
        b.outcome = Some(Outcome::Admitted);
        b.requeue = REQUEUE_ACTIVE;
        b.event(
            false,
            "Admitted",
            format!(
                "admitted change {} ({}); new cluster requests {}",
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
        b.gate = Some(Gate::Hold);
        b.requeue = REQUEUE_ACTIVE;
        // What was measured at admission stays visible during the transition.
        b.status.capacity = b.prev.capacity.clone();
        let svc = self.svc;
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
                b.event(
                    true,
                    "Abandoned",
                    format!("KubeRay dropped new cluster {to} without promoting it"),
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
            b.event(
                false,
                "AdmissionWithdrawn",
                format!(
                    "change {} was superseded before KubeRay started it",
                    admitted.fingerprint
                ),
            );
            return self.evaluate(b);
        }
        if self.running_for(&admitted) > ADMISSION_TTL {
            b.status.admitted = None;
            b.event(
                true,
                "AdmissionExpired",
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
        b.gate = Some(Gate::Open);
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
                b.event(
                    true,
                    "AdmissionMismatch",
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
        if b.prev.phase == Phase::Admitted {
            b.event(
                false,
                "Upgrading",
                format!("KubeRay is creating cluster {pending}; gate closed again"),
            );
        }
        let running_for = self.running_for(&admitted);
        let pods: Vec<&k8s_openapi::api::core::v1::Pod> = self
            .inp
            .pods
            .get(pending)
            .map(|p| p.iter().map(AsRef::as_ref).collect())
            .unwrap_or_default();
        match stall::diagnose(
            &pods,
            &self.svc.pending_apps,
            self.inp.pending_ready,
            running_for,
            self.settings.stall_after,
        ) {
            Some(s) => stalled(b, s, &admitted),
            None => {
                b.status.phase = Phase::Upgrading;
                b.status.waiting_for = Some(if self.inp.pending_ready {
                    "serve apps".into()
                } else {
                    "new cluster".into()
                });
                b.status.message = Some(format!(
                    "transition to {pending} running for {}",
                    stall::human_duration(running_for)
                ));
                b.condition(
                    condition::STALLED,
                    false,
                    "Progressing",
                    "transition is progressing",
                );
            }
        }
    }

    /// Promoted: `Completed` once the old cluster and its pods are gone.
    fn promoted(&self, b: &mut Builder<'_>, admitted: Admission) {
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
        b.status.message = Some(format!(
            "upgrade to {} completed in {took}",
            self.svc.active_cluster.as_deref().unwrap_or("?"),
        ));
        b.condition(
            condition::STALLED,
            false,
            "Completed",
            "transition completed",
        );
        b.condition(
            condition::UPGRADE_ADMITTED,
            false,
            "Completed",
            "transition completed",
        );
        b.outcome = Some(Outcome::Completed);
        b.event(
            false,
            "Completed",
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

/// The new cluster does not fit: wait, with the exact shortfall.
fn wait_for_capacity(b: &mut Builder<'_>, report: &crate::capacity::FitReport) {
    b.status.phase = Phase::WaitingForCapacity;
    let (short, long) = render::shortfall_text(report);
    b.condition(
        condition::CAPACITY_AVAILABLE,
        false,
        "InsufficientCapacity",
        &long,
    );
    b.waiting(&short, &long);
    b.outcome = Some(Outcome::HeldCapacity);
    if b.prev.phase != Phase::WaitingForCapacity {
        b.event(true, "WaitingForCapacity", long);
    }
}

fn stalled(b: &mut Builder<'_>, s: stall::Stall, admitted: &Admission) {
    b.status.phase = Phase::Stalled;
    b.status.waiting_for = Some(s.reason.to_string());
    b.condition(condition::STALLED, true, s.reason, &s.message);
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
        b.event(
            true,
            "Stalled",
            format!(
                "transition of change {} stalled: {msg}",
                admitted.fingerprint
            ),
        );
    }
}
