//! The overlay's bookkeeping: admissions decided and written, not yet in
//! the plan cache, so that the next decision counts them (see
//! [`Overlay`]). Kept under one lock with the
//! decision; never held across an API call.

use jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;

use super::Context;
use super::observe::Overlay;
use crate::admission::Decision;
use crate::upgradeplan::{Admission, Phase, PlanKey, UpgradePlan};

/// Decides under the overlay lock (`decide`: the observation and the
/// decision made on the overlay, and when the admission pass it used was
/// run) and reserves the admission there (or drops the plan's entry when
/// it is not admitted); the entry it replaced, for [`unreserve`]. `plan` is
/// the plan as the cache showed it.
pub(super) async fn decide_reserving<T>(
    ctx: &Context,
    plan: &UpgradePlan,
    decide: impl FnOnce(&Overlay) -> (T, Decision, Option<Timestamp>),
) -> (T, Decision, Option<Admission>) {
    let key = plan.key();
    let mut overlay = ctx.decisions.lock().await;
    // The cache caught up with what we wrote: the entry is no longer
    // needed. The cache's copy, not `current`: that may be our own
    // write or a fresh read, which other plans' decisions do not see.
    if ctx
        .stores
        .plans
        .get(&ObjectRef::from_obj(plan))
        .is_some_and(|p| p.status.as_ref().is_some_and(|s| s.admitted.is_some()))
    {
        overlay.remove(&key);
    }
    let decided = Timestamp::now();
    let (seen, decision, pass_at) = decide(&overlay);
    ctx.causes.decided(&key, decided, pass_at);
    if decision.status.admitted.is_none() {
        // Events up to here did not let it through.
        let short = (decision.status.phase == Phase::WaitingForCapacity).then(|| {
            decision
                .status
                .capacity
                .as_ref()
                .map(|c| c.shortfall.keys().cloned().collect())
                .unwrap_or_default()
        });
        ctx.causes.held(&key, decided, short);
    }
    let before = match decision.status.admitted.clone() {
        Some(admitted) => overlay.insert(key.clone(), admitted),
        None => overlay.remove(&key),
    };
    (seen, decision, before)
}

/// A decision's status was not written: the plan's entry goes back to what
/// it was before [`decide_reserving`].
pub(super) async fn unreserve(ctx: &Context, key: &PlanKey, before: Option<Admission>) {
    let mut overlay = ctx.decisions.lock().await;
    match before {
        Some(a) => overlay.insert(key.clone(), a),
        None => overlay.remove(key),
    };
}

/// The plan is deleted or governs nothing any more: its entry goes.
pub(super) async fn forget(ctx: &Context, key: &PlanKey) {
    ctx.decisions.lock().await.remove(key);
}
