//! Deciding and recording: the decision made under the overlay lock and
//! its status written before anything else.

use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use tracing::{debug, info};

use super::observe::{self, Overlay, World};
use super::overlay;
use super::{Context, buffers, gate, guarded, patch, reservations, written};
use crate::Result;
use crate::admission::{self, Decision, GateFacts};
use crate::sync::lock;
use crate::upgradeplan::{PlanKey, UpgradePlan, UpgradePlanStatus};

/// A decision whose status is on the plan.
pub(super) struct Recorded {
    /// The plan as the decision saw it.
    pub(super) plan: UpgradePlan,
    pub(super) seen: Seen,
    pub(super) decision: Decision,
    /// The status before the decision.
    pub(super) prev: UpgradePlanStatus,
}

/// Decides and writes the status; `Err(action)` when it could not be
/// written on current input (the plan keeps changing, or is gone). In steps:
///
/// 1. Decide under the overlay lock and reserve the admission there
///    ([`overlay::decide_reserving`]), so that a decision made while the
///    status is written counts it; the lock is not held across the write.
/// 2. Pace: a held plan whose figures alone moved is written later
///    ([`paced`]).
/// 3. Write the status, unless it is unchanged or paced ([`write_status`]).
/// 4. Not written: the reservation goes back ([`overlay::unreserve`]); the
///    plan is read again and decided again (twice at most), never a
///    decision made on stale input re-applied.
pub(super) async fn record(
    plan: &UpgradePlan,
    ctx: &Context,
    now: Timestamp,
) -> Result<std::result::Result<Recorded, Action>> {
    let (ns, name) = (plan.namespace().unwrap_or_default(), plan.name_any());
    let key = PlanKey::new(ns.clone(), name.clone());
    let mut current = plan.clone();
    let mut attempts = 0;
    // Read once, before the lock: Kueue's Workload of the RayService after
    // raygate had it derived again (an API call only in that state).
    let service_workload = reservations::service_workload(ctx, plan).await;
    loop {
        // 1. Decide, the admission reserved in the overlay.
        let (seen, mut decision, reserved_before) = overlay::decide_reserving(ctx, plan, |o| {
            decide_now(ctx, &current, o, now, service_workload.clone())
        })
        .await;
        let prev = current.status.clone().unwrap_or_default();
        // 2. Pace the figures of a held plan.
        let pace = paced(ctx, &key, &prev, &decision);
        // 3. Write the status.
        let written = if decision.status == prev {
            lock(&ctx.status_written).settled(&key);
            Ok(true)
        } else if let Some(wait) = pace {
            debug!(plan = %name, namespace = %ns, wait = ?wait, "only the figures moved: written later");
            decision.requeue = decision.requeue.min(wait);
            Ok(true)
        } else {
            write_status(ctx, &current, &decision.status).await
        };
        if matches!(written, Ok(true)) {
            if decision.status != prev && pace.is_none() {
                let at = Timestamp::now();
                ctx.causes.status_written(&key, at);
            }
            return Ok(Ok(Recorded {
                plan: current,
                seen,
                decision,
                prev,
            }));
        }
        // 4. Not written: the reservation goes back to what it was.
        overlay::unreserve(ctx, &key, reserved_before).await;
        written?;
        // Someone wrote the plan since the cache saw it: decide again on
        // what is there now, never re-apply a decision made on stale input.
        attempts += 1;
        if attempts == 2 {
            return Ok(Err(Action::requeue(Duration::from_secs(1))));
        }
        let api: Api<UpgradePlan> = Api::namespaced(ctx.client.clone(), &ns);
        match guarded(&ctx.fence, "reading the UpgradePlan", api.get_opt(&name)).await?? {
            Some(fresh) => current = fresh,
            None => return Ok(Err(Action::await_change())),
        }
    }
}

/// How long a held plan's moving figures (nodes arriving one by one) wait:
/// [`written::PROGRESS_EVERY`] from when first seen unwritten and after the
/// last write; the requeue writes them. `None`: written now (an Event, an opening gate, or more than the
/// figures changed).
fn paced(
    ctx: &Context,
    key: &PlanKey,
    prev: &UpgradePlanStatus,
    decision: &Decision,
) -> Option<Duration> {
    (decision.events.is_empty()
        && !matches!(
            decision.gate,
            Some(admission::Gate::Open | admission::Gate::OpenIncremental)
        )
        && written::progress_only(prev, &decision.status))
    .then(|| lock(&ctx.status_written).progress_wait(key, Timestamp::now()))
    .flatten()
}

/// What the writes after a decision need from its observation.
pub(super) struct Seen {
    pub(super) gate: GateFacts,
    /// The plan's capacity request objects as the decision wants them.
    pub(super) wanted: buffers::Wanted,
    /// The quota reservation to create, and the one to keep (the others go).
    pub(super) reservation: Option<crate::kueue::types::Workload>,
    pub(super) keep_reservation: Option<String>,
}

/// Observe and decide without awaiting: the decision borrows caches and a
/// lazily built cluster state that must not live across an await.
fn decide_now(
    ctx: &Context,
    plan: &UpgradePlan,
    overlay: &Overlay,
    now: Timestamp,
    service_workload: Option<crate::admission::quota::ServiceWorkload>,
) -> (Seen, Decision, Option<Timestamp>) {
    let releases = observe::releases(&ctx.stores, ctx.settings.kuberay_version)
        .with_incremental_gate(ctx.settings.incremental_gate);
    let world = World::new(&ctx.stores, overlay, &releases, &ctx.settings.operator, now);
    let key = plan.key();
    let release = releases.for_namespace(&key.namespace);
    let mut inputs = observe::observe(
        &ctx.stores,
        plan,
        &release,
        now,
        overlay.contains_key(&key),
        &world,
    );
    inputs.quota = reservations::facts(ctx, &inputs, service_workload);
    let decision = buffers::decide(ctx, &mut inputs);
    let wanted = decision.capacity_objects.clone();
    let reservation = reservations::wanted(&inputs, &decision);
    let seen = Seen {
        gate: inputs.gate,
        wanted,
        reservation,
        keep_reservation: reservations::keep(&decision),
    };
    (seen, decision, world.pass_at())
}

/// Writes the status (see [`patch`]); `false` when the plan changed since it
/// was read (the apiserver refused the precondition).
pub(super) async fn write_status(
    ctx: &Context,
    plan: &UpgradePlan,
    status: &UpgradePlanStatus,
) -> Result<bool> {
    let ns = plan.namespace().unwrap_or_default();
    let name = plan.name_any();
    let api: Api<UpgradePlan> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(body) = patch::ownership_upgrade(plan) {
        let params = PatchParams {
            field_manager: Some(gate::FIELD_MANAGER.to_string()),
            ..Default::default()
        };
        let merge = Patch::Merge(&body);
        let call = api.patch(&name, &params, &merge);
        return match guarded(&ctx.fence, "taking over the status fields", call).await? {
            Ok(_) => {
                info!(plan = %name, namespace = %ns, "status fields taken over by server-side apply");
                Ok(false)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        };
    }
    let body = patch::status_apply(plan, status)?;
    // Forced: raygate alone writes status, and an apply that conflicted with
    // a stray manager would leave the plan's status stuck.
    let params = PatchParams::apply(gate::FIELD_MANAGER).force();
    let apply = Patch::Apply(&body);
    let call = api.patch_status(&name, &params, &apply);
    match guarded(&ctx.fence, "writing the UpgradePlan status", call).await? {
        Ok(written) => {
            lock(&ctx.status_written).record(plan, written, Timestamp::now());
            let changed = written::changed_fields(plan.status.as_ref(), status);
            info!(plan = %name, namespace = %ns, phase = status.phase.as_str(),
                  waiting_for = status.waiting_for.as_deref().unwrap_or(""),
                  changed = %changed.join(","), "status updated");
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            debug!(plan = %name, namespace = %ns, "status changed since read; reading it again");
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}
