//! The loop that applies the decision: watch, observe, decide, write.
//!
//! One reconcile of an UpgradePlan gathers its inputs from the caches
//! ([`observe`]), asks [`crate::admission::decide`], then writes in a fixed
//! order: the plan status first (it records the decision), the gate second.
//! A crash between the two leaves a status that the next reconcile completes,
//! never an open gate without a recorded admission. The steps are listed,
//! numbered, on `reconcile_plan`; the files below hold them: `start` (the
//! caches and the plan watcher), `record` (decide and write the status),
//! `overlay` (admissions written, not yet in the plan cache), `gating` (the
//! gate's writes), `export` (Events and metrics), `events` (the queue that
//! sends Events in the background).
pub mod buffers;
pub mod cache;
pub mod coalesce;
pub mod events;
mod export;
pub mod gate;
mod gating;
pub mod govern;
pub mod kueue_probe;
pub mod latency;
pub mod lists;
pub mod observe;
mod overlay;
pub mod patch;
mod record;
pub mod release;
pub mod reservations;
mod start;
pub mod written;

use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::{StreamExt, future};
use jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tokio::sync::Mutex;
use tracing::{Instrument, debug, info, warn};

use crate::admission;
use crate::kuberay::KubeRayVersion;
use crate::leader::Fence;
use crate::metrics::Metrics;
use crate::server::Health;
use crate::sync::lock;
use crate::upgradeplan::UpgradePlan;
use crate::{Error, Result};

use export::{gate_released, publish, report};
use gating::{GatesWritten, give_back_gate, set_gate, sweep_orphans};
use observe::{Overlay, Stores};
use record::{record, write_status};
use start::{plan_controller, spawn_cache, spawn_caches};

/// Finalizer that lets raygate release the gate when a plan is deleted.
pub const FINALIZER: &str = "raygate.io/release-gate";

#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespaces whose UpgradePlans, RayServices, RayClusters and LimitRanges
    /// are watched (one watch per namespace); empty for all. Pods and Nodes are
    /// always watched cluster-wide: free capacity is a cluster-wide fact.
    pub namespaces: Vec<String>,
    /// `--kuberay-version`: the release assumed where no watched RayCluster is
    /// stamped with one (see [`crate::kuberay::release`]).
    pub kuberay_version: Option<KubeRayVersion>,
    /// `--kuberay-incremental-upgrades`: the operator's `RayServiceIncrementalUpgrade`
    /// feature gate; `None`: the release's default.
    pub incremental_gate: Option<bool>,
    /// Identity in Events (`reportingInstance`).
    pub instance: String,
    /// `--max-priority` and the default batching: read into every plan's
    /// settings.
    pub operator: crate::admission::settings::Operator,
    /// Capacity requests to the node autoscaler (`--capacity-requests` and
    /// the defaults of `spec.capacity`).
    pub capacity: crate::autoscale::Defaults,
    /// `--dra-plain-count-class`: DeviceClasses counted as plain units (see
    /// [`crate::capacity::dra`]).
    pub dra_plain_count: Vec<String>,
    /// `--batch-window`: how long the wake-ups of a plan are gathered before
    /// it is reconciled (see [`coalesce`]).
    pub batch_window: Duration,
    /// Kueue quota is a dimension of Kueue-managed RayServices' admissions,
    /// reserved with raygate's Workloads ([`reservations`]): `--kueue`, as
    /// decided at start-up ([`crate::kueue::probe::decide`]).
    pub kueue: bool,
    /// `--initial-lists`, resolved at start-up ([`lists::probe`]): how every
    /// cache fetches its initial state.
    pub initial_lists: lists::InitialLists,
}

/// How often gates no plan governs any more are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Shared by all reconciles.
pub struct Context {
    /// For writes: every call on it is bounded (see [`guarded`]).
    pub client: Client,
    /// Every write asks it first.
    pub fence: Arc<Fence>,
    pub stores: Stores,
    pub metrics: Arc<Metrics>,
    /// Events, sent in the background ([`events`]).
    pub events: events::EventQueue,
    pub settings: Settings,
    /// Decisions run one at a time so each sees the admissions before it;
    /// the overlay holds admissions not yet seen in the plan cache (reserved
    /// before their status is written). Never held across an API call.
    decisions: Mutex<Overlay>,
    /// Capacity requests: their caches and bookkeeping.
    pub buffers: buffers::Shell,
    /// Kueue quota reservations: their caches (`--kueue`).
    pub reservations: reservations::Shell,
    /// Events that can let an upgrade through, and each plan's stages.
    pub causes: Arc<latency::Causes>,
    /// Gates written that the RayService cache may not show yet.
    gates_written: std::sync::Mutex<GatesWritten>,
    /// Status writes the plan cache may not show yet (see [`written`]).
    status_written: std::sync::Mutex<written::StatusWritten>,
}

fn in_scope(settings: &Settings, ns: Option<&str>) -> bool {
    settings.namespaces.is_empty() || ns.is_some_and(|n| settings.namespaces.iter().any(|s| s == n))
}

impl Context {
    /// `client` serves the writes (short timeouts), the Events' too.
    #[allow(clippy::too_many_arguments)]
    fn new(
        client: Client,
        fence: Arc<Fence>,
        stores: Stores,
        metrics: Arc<Metrics>,
        settings: Settings,
        buffers: buffers::Shell,
        reservations: reservations::Shell,
        causes: Arc<latency::Causes>,
    ) -> Context {
        let reporter = Reporter {
            controller: "raygate".into(),
            instance: Some(settings.instance.clone()),
        };
        Context {
            events: events::EventQueue::start(
                Recorder::new(client.clone(), reporter),
                fence.clone(),
                metrics.clone(),
            ),
            client,
            fence,
            stores,
            metrics,
            settings,
            decisions: Mutex::new(Overlay::new()),
            buffers,
            reservations,
            causes,
            gates_written: Default::default(),
            status_written: Default::default(),
        }
    }
}

/// Every [`SWEEP_EVERY`], gives back gates no plan governs and deletes
/// capacity requests no plan needs, once the plan cache has synced.
fn spawn_sweeper(ctx: Arc<Context>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if ctx.stores.plans.wait_until_ready().await.is_err() {
            return;
        }
        loop {
            sweep_orphans(&ctx).await;
            buffers::sweep(&ctx).await;
            reservations::sweep(&ctx).await;
            tokio::time::sleep(SWEEP_EVERY).await;
        }
    })
}

/// Run the controller until shutdown. `watch` serves the long-running
/// watches; `client` (with short timeouts) every other call.
pub async fn run(
    watch: Client,
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    fence: Arc<Fence>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let causes = Arc::new(latency::Causes::default());
    let (controller, plans) = plan_controller(
        &watch,
        &settings.namespaces,
        settings.initial_lists,
        &causes,
    );
    let (tx, rx) = mpsc::unbounded::<ObjectRef<UpgradePlan>>();
    let caches = spawn_caches(&watch, &settings, &plans, &causes, tx);
    let wakeups = coalesce::coalesce(rx, settings.batch_window);
    info!("waiting for caches to sync");
    let (stores, buffers, reservations) = caches.synced(plans, health.is_kueue_missing()).await?;
    info!("caches synced");
    health.set_ready(true);
    if health.is_kueue_missing() {
        // `--kueue=true` without what it needs at start-up: not ready
        // until the Kueue caches sync (Kueue installed, access granted).
        let (synced, health) = (reservations.synced(), health.clone());
        tokio::spawn(async move {
            if synced.await {
                info!("Kueue caches synced: Kueue support ready (--kueue=true)");
                health.set_kueue_missing(false);
            }
        });
    }

    let ctx = Arc::new(Context::new(
        client,
        fence,
        stores,
        metrics,
        settings,
        buffers,
        reservations,
        causes,
    ));
    let sweeper = spawn_sweeper(ctx.clone());
    controller
        .reconcile_on(wakeups)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            match res {
                Ok((obj, _)) => debug!(plan = %obj, "reconciled"),
                // Logged once, with the plan, by `error_policy`.
                Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                Err(e) => debug!(error = %e, "controller error"),
            }
            future::ready(())
        })
        .await;
    sweeper.abort();
    Ok(())
}

/// One write: refused unless this replica's lease is confirmed (fencing),
/// and bounded so it cannot still be in flight when another replica may
/// have taken over. The inner result is the API's answer.
pub async fn guarded<T>(
    fence: &Fence,
    what: &str,
    call: impl std::future::Future<Output = std::result::Result<T, kube::Error>>,
) -> Result<std::result::Result<T, kube::Error>> {
    fence.check()?;
    let after = fence.api_timeout();
    tokio::time::timeout(after, call)
        .await
        .map_err(|_| Error::Timeout {
            what: what.to_string(),
            after,
        })
}

/// One reconcile, in a span naming the plan (every log line in it says
/// which plan it is about).
async fn reconcile(plan: Arc<UpgradePlan>, ctx: Arc<Context>) -> Result<Action> {
    let key = plan.key();
    let span = tracing::info_span!("reconcile", namespace = %key.namespace, plan = %key.name);
    let now = Timestamp::now();
    ctx.causes.started(&key, now);
    debug!(parent: &span, stage = "reconcile started", "reconcile started");
    reconcile_plan(plan, ctx).instrument(span).await
}

/// One reconcile of a plan, in steps (the `// N.` markers here and in
/// [`apply`]):
///
/// 1. Fence: a replica without the Lease writes nothing; a plan outside
///    the watched namespaces is left ([`leave`]: gate given back, finalizer
///    dropped).
/// 2. The plan as raygate last wrote it, if the cache has not delivered
///    that write yet ([`written`]); the finalizer added, or on deletion the
///    gate given back ([`cleanup`]).
/// 3. Governance ([`govern`]): an edited reference hands the old gate back
///    ([`hand_over`]); a second plan on one RayService is reported, nothing
///    touched ([`report_conflict`]).
/// 4. Observe, decide, record ([`record::record`]): the inputs from the
///    caches ([`observe`]), [`admission::decide`] under the overlay lock
///    ([`overlay`]), the status written first: it records the decision.
/// 5. Capacity requests ([`buffers`]): an admitted plan's go before KubeRay
///    creates the pods that will use their capacity.
/// 6. The Kueue quota reservation ([`reservations`]): the gate opens only
///    on a granted one, so it is made (or dropped) first.
/// 7. The gate ([`gating::set_gate`]): `spec.upgradeStrategy.type` by
///    server-side apply, never forced.
/// 8. Events and metrics ([`export::report`]).
async fn reconcile_plan(plan: Arc<UpgradePlan>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_timer();
    // 1. Fence and scope.
    ctx.fence.check()?;
    let ns = plan.namespace().unwrap_or_default();
    let api: Api<UpgradePlan> = Api::namespaced(ctx.client.clone(), &ns);
    if !in_scope(&ctx.settings, plan.namespace().as_deref()) {
        leave(&api, &plan, &ctx).await?;
        return Ok(Action::await_change());
    }
    // 2. Our own last status write, if the cache has not delivered it yet;
    // then the finalizer: steps 3-8 in `apply`, or `cleanup`.
    let plan = lock(&ctx.status_written).newest(plan);
    finalizer(&api, FINALIZER, plan, |event| async {
        match event {
            Finalizer::Apply(p) => apply(&p, &ctx).await,
            Finalizer::Cleanup(p) => cleanup(&p, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// A plan outside the watched namespaces: raygate no longer governs it, so
/// it gives the gate back and drops its finalizer (else the plan could
/// never be deleted, and the RayService would stay held).
async fn leave(api: &Api<UpgradePlan>, plan: &UpgradePlan, ctx: &Context) -> Result<()> {
    if !plan.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let ns = plan.namespace().unwrap_or_default();
    give_back_gate(ctx, &ctx.stores.plans.state(), plan).await?;
    release::remove_finalizer(api, plan, &ctx.fence).await?;
    info!(plan = %plan.name_any(), namespace = %ns, "plan outside the watched namespaces: gate given back, finalizer removed");
    Ok(())
}

fn error_policy(plan: Arc<UpgradePlan>, err: &Error, ctx: Arc<Context>) -> Action {
    warn!(plan = %plan.name_any(), error = %err, "reconcile failed");
    ctx.metrics.reconcile_error(err.metric_label());
    Action::requeue(Duration::from_secs(10))
}

/// The plan was deleted: give the gate back so KubeRay behaves as without
/// raygate, unless another plan governs that RayService now.
async fn cleanup(plan: &UpgradePlan, ctx: &Context) -> Result<Action> {
    let ns = plan.namespace().unwrap_or_default();
    if let Some(name) = give_back_gate(ctx, &ctx.stores.plans.state(), plan).await? {
        gate_released(ctx, plan, format!("raygate no longer gates {name}")).await;
    }
    // Its capacity request goes with it (the owner reference would let the
    // garbage collector do it too, once the plan object is gone).
    if let Err(e) = buffers::forget(ctx, plan).await {
        warn!(plan = %plan.name_any(), error = %e, "deleting the plan's capacity request (the garbage collector and the sweep retry)");
    }
    if let Err(e) = reservations::forget(ctx, plan).await {
        warn!(plan = %plan.name_any(), error = %e, "deleting the plan's quota reservation (the garbage collector and the sweep retry)");
    }
    ctx.metrics.forget_plan(&ns, &plan.name_any());
    ctx.causes.forget(&plan.key());
    lock(&ctx.status_written).forget(&plan.key());
    overlay::forget(ctx, &plan.key()).await;
    Ok(Action::await_change())
}

/// One reconcile of a plan that raygate governs: steps 3 to 8 of
/// [`reconcile_plan`].
async fn apply(plan: &UpgradePlan, ctx: &Context) -> Result<Action> {
    let now = Timestamp::now();
    let plans = ctx.stores.plans.state();
    // 3. Governance. The reference was edited (an apiserver without CEL
    // rules lets it): the gate of the RayService it named goes back first.
    if let Some(old) = govern::recorded_elsewhere(plan) {
        return hand_over(plan, ctx, &plans, &old).await;
    }
    if let Some(governor) = govern::conflict_with(&plans, plan) {
        return report_conflict(plan, ctx, &governor, now).await;
    }
    // 4. Observe, decide, write the status.
    let r = match record(plan, ctx, now).await? {
        Ok(r) => r,
        Err(later) => return Ok(later),
    };
    // 5. Before the gate: an admitted plan's buffers go before KubeRay
    // creates the pods that will use their capacity.
    buffers::act(ctx, &r.plan, &r.seen.wanted).await;
    // 6. The gate opens only on a granted reservation: made (or dropped) first.
    reservations::act(
        ctx,
        &r.plan,
        r.seen.reservation.as_ref(),
        r.seen.keep_reservation.as_deref(),
    )
    .await;
    reservations::refresh(ctx, &r.plan, &r.prev, &r.decision).await;
    // 7. The gate.
    let requeue = set_gate(ctx, &r).await?;
    // 8. Events and metrics.
    report(ctx, &r, now).await;
    Ok(Action::requeue(requeue))
}

/// Gives back the gate of the RayService `plan` no longer references.
async fn hand_over(
    plan: &UpgradePlan,
    ctx: &Context,
    plans: &[Arc<UpgradePlan>],
    old: &str,
) -> Result<Action> {
    give_back_gate(ctx, plans, plan).await?;
    overlay::forget(ctx, &plan.key()).await;
    if write_status(ctx, plan, &govern::handed_over_status(plan, old)).await? {
        gate_released(
            ctx,
            plan,
            format!("rayServiceRef changed: raygate no longer gates {old}"),
        )
        .await;
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// Another plan governs `plan`'s RayService: say so, touch nothing.
async fn report_conflict(
    plan: &UpgradePlan,
    ctx: &Context,
    governor: &str,
    now: Timestamp,
) -> Result<Action> {
    let st = govern::conflict_status(plan, governor, now);
    if plan.status.as_ref() != Some(&st) && write_status(ctx, plan, &st).await? {
        let note = admission::EventNote {
            warning: true,
            reason: admission::EventReason::Conflict,
            note: st.message.clone().unwrap_or_default(),
            change: None,
        };
        publish(ctx, plan, None, &note).await;
    }
    Ok(Action::requeue(Duration::from_secs(30)))
}

#[cfg(test)]
mod reconcile_tests;
