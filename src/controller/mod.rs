//! The loop that applies the decision: watch, observe, decide, write.
//!
//! One reconcile of an UpgradePlan gathers its inputs from the caches
//! ([`observe`]), asks [`crate::admission::decide`], then writes in a fixed
//! order: the plan status first (it records the decision), the gate second.
//! A crash between the two leaves a status that the next reconcile completes,
//! never an open gate without a recorded admission.

pub mod buffers;
pub mod cache;
pub mod coalesce;
pub mod gate;
pub mod govern;
pub mod kueue_probe;
pub mod latency;
pub mod lists;
pub mod observe;
pub mod patch;
pub mod release;
pub mod reservations;
pub mod written;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::{StreamExt, future};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::LimitRange;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::Mutex;
use tracing::{Instrument, debug, info, warn};

use crate::admission::{self, Decision, GateFacts, Outcome};
use crate::kuberay::{KubeRayVersion, LABEL_ORIGINATED_FROM_CR_NAME, RayCluster, RayService};
use crate::leader::Fence;
use crate::metrics::{Metrics, PlanObservation};
use crate::server::Health;
use crate::sync::lock;
use crate::upgradeplan::{Fingerprint, Phase, PlanKey, UpgradePlan, UpgradePlanStatus};
use crate::{Error, Result};

use observe::{Overlay, Stores, World};

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
    pub recorder: Recorder,
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

/// The gates raygate wrote, per plan: the RayService's uid, the value, and
/// the RayService's `resourceVersion` in the cache when it was written. A
/// reconcile that runs before the watch delivers the write (the plan's own
/// status write wakes it at once) sees the old value in the cache; while
/// the cache still shows that same version, nothing has been observed since
/// the write, and applying it again would be a request for nothing.
#[derive(Default)]
struct GatesWritten(HashMap<PlanKey, (String, &'static str, String, Timestamp)>);

impl GatesWritten {
    /// Entries older than this are dropped (a plan deleted meanwhile).
    const KEEP: Duration = Duration::from_secs(600);

    fn unseen(&self, key: &PlanKey, uid: &str, gate: &str, cached: &str) -> bool {
        self.0
            .get(key)
            .is_some_and(|(u, g, rv, _)| u == uid && *g == gate && rv == cached)
    }

    fn written(
        &mut self,
        key: PlanKey,
        uid: &str,
        gate: &'static str,
        cached: String,
        now: Timestamp,
    ) {
        self.0
            .retain(|_, w| now.duration_since(w.3).as_secs_f64() < Self::KEEP.as_secs_f64());
        self.0.insert(key, (uid.to_string(), gate, cached, now));
    }
}

fn in_scope(settings: &Settings, ns: Option<&str>) -> bool {
    settings.namespaces.is_empty() || ns.is_some_and(|n| settings.namespaces.iter().any(|s| s == n))
}

/// Plans that reference a RayService.
fn plans_for(plans: &Store<UpgradePlan>, ns: &str, svc: &str) -> Vec<ObjectRef<UpgradePlan>> {
    plans
        .state()
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(ns) && p.spec.ray_service_ref.name == svc)
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// A plan's `spec.approve` set or changed (after its first sighting) is an
/// event that can let its upgrade through; any plan event queues it.
fn note_plan(
    causes: &latency::Causes,
    approvals: &mut HashMap<PlanKey, Option<Fingerprint>>,
    plan: &UpgradePlan,
) {
    let key = plan.key();
    let now = Timestamp::now();
    causes.queued([&key], now);
    let approve = plan.spec.approve.clone().filter(|a| !a.is_empty());
    let before = approvals.insert(key.clone(), approve.clone());
    if let (Some(before), Some(a)) = (before, approve)
        && before.as_ref() != Some(&a)
    {
        let object = format!("upgradeplan/{}/{}", key.namespace, key.name);
        info!(stage = "event received", cause = "approval", object = %object, fingerprint = %a, "plan approved");
        causes.note(latency::Cause {
            kind: latency::CauseKind::Approval,
            object,
            at: now,
            resources: vec![],
            plan: Some(key),
        });
    }
}

/// A RayService's spec changed (its generation moved, after its first
/// sighting): an event that can let its plans' upgrade through at once.
fn note_service(
    causes: &latency::Causes,
    generations: &std::sync::Mutex<HashMap<(String, String), Option<i64>>>,
    meta: &kube::api::ObjectMeta,
    plans: &[ObjectRef<UpgradePlan>],
) {
    let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
        return;
    };
    let now = Timestamp::now();
    let keys: Vec<PlanKey> = plans.iter().map(PlanKey::from).collect();
    causes.queued(&keys, now);
    let mut generations = lock(generations);
    let before = generations.insert((ns.clone(), name.clone()), meta.generation);
    if before.is_none() || before == Some(meta.generation) {
        return;
    }
    let object = format!("rayservice/{ns}/{name}");
    info!(stage = "event received", cause = "rayservice", object = %object, "RayService spec changed");
    for key in keys {
        causes.note(latency::Cause {
            kind: latency::CauseKind::RayService,
            object: object.clone(),
            at: now,
            resources: vec![],
            plan: Some(key),
        });
    }
}

/// Start a cache: a watcher that slims objects, fills a store, and sends the
/// plans to wake for each relevant change into `tx`.
fn spawn_cache<K, S, P, M>(
    events: impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    slim: S,
    predicate: P,
    mapper: M,
    tx: mpsc::UnboundedSender<ObjectRef<UpgradePlan>>,
) -> Store<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
    S: FnMut(&mut K) + Send + 'static,
    P: Fn(&K) -> Option<u64> + Send + 'static,
    M: Fn(&K) -> Vec<ObjectRef<UpgradePlan>> + Send + 'static,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&Default::default()).to_string();
    let stream = events
        .modify(slim)
        .reflect(writer)
        .touched_objects()
        .predicate_filter(predicate, Default::default())
        .for_each(move |ev| {
            match ev {
                Ok(obj) => {
                    for r in mapper(&obj) {
                        let _ = tx.unbounded_send(r);
                    }
                }
                Err(e) => warn!(kind = %kind, error = %e, "watch error"),
            }
            future::ready(())
        });
    tokio::spawn(stream);
    reader
}

/// The caches a controller reads besides the plans': spawned, filling.
struct Caches {
    services: Store<DeserializeGuard<RayService>>,
    clusters: Store<DeserializeGuard<RayCluster>>,
    capacity: cache::SharedIndex,
    capacity_ready: cache::IndexReady,
    limit_ranges: Store<LimitRange>,
    runtime_classes: Store<RuntimeClass>,
    buffers: buffers::Shell,
    reservations: reservations::Shell,
}

impl Caches {
    /// Waits until every cache has listed once; the stores to decide on.
    /// `kueue_missing`: the start-up probe found Kueue's API or access
    /// missing (`--kueue=true`): its caches are not waited for.
    async fn synced(
        self,
        plans: Store<UpgradePlan>,
        kueue_missing: bool,
    ) -> Result<(Stores, buffers::Shell, reservations::Shell)> {
        for (what, ready) in [
            (
                "RayServices",
                self.services.wait_until_ready().await.is_ok(),
            ),
            (
                "RayClusters",
                self.clusters.wait_until_ready().await.is_ok(),
            ),
            ("Pods and Nodes", self.capacity_ready.wait().await),
            (
                "LimitRanges",
                self.limit_ranges.wait_until_ready().await.is_ok(),
            ),
            (
                "RuntimeClasses",
                self.runtime_classes.wait_until_ready().await.is_ok(),
            ),
        ] {
            if !ready {
                return Err(Error::invalid(
                    "cache",
                    format!("{what} cache did not sync"),
                ));
            }
        }
        self.buffers.wait_ready().await;
        if !kueue_missing {
            self.reservations.wait_ready().await;
        }
        let stores = Stores {
            plans,
            services: self.services,
            clusters: self.clusters,
            capacity: self.capacity,
            pass: Default::default(),
            limit_ranges: self.limit_ranges,
            runtime_classes: self.runtime_classes,
        };
        Ok((stores, self.buffers, self.reservations))
    }
}

/// The plan watcher and the controller over it: every plan event is noted
/// in `causes` (an approval can let an upgrade through). With several
/// namespaces, one watcher per namespace ([`cache::scoped_watcher`]), so
/// that reads need only Roles there.
fn plan_controller(
    client: &Client,
    ns: &[String],
    lists: lists::InitialLists,
    causes: &Arc<latency::Causes>,
) -> (Controller<UpgradePlan>, Store<UpgradePlan>) {
    let (plans, plan_writer) = reflector::store();
    let mut approvals = std::collections::HashMap::new();
    let noted = causes.clone();
    let plan_events =
        cache::scoped_watcher::<UpgradePlan>(client, ns, lists.config().any_semantic())
            .reflect(plan_writer)
            .applied_objects()
            .inspect(move |p| {
                if let Ok(p) = p {
                    note_plan(&noted, &mut approvals, p);
                }
            });
    // No debounce: a plan's own events (an approval, a spec change) are
    // reconciled at once; the caches' wake-ups are gathered by `coalesce`.
    let controller = Controller::for_stream(plan_events, plans.clone())
        .with_config(ControllerConfig::default().debounce(Duration::ZERO));
    (controller, plans)
}

/// Starts every cache but the plans': each relevant change sends the plans
/// it concerns into `tx`.
fn spawn_caches(
    client: &Client,
    settings: &Settings,
    plans: &Store<UpgradePlan>,
    causes: &Arc<latency::Causes>,
    tx: mpsc::UnboundedSender<ObjectRef<UpgradePlan>>,
) -> Caches {
    let ns = &settings.namespaces;
    let lists = settings.initial_lists;
    let p = plans.clone();
    let services = spawn_cache(
        cache::slimmed_watcher::<DeserializeGuard<RayService>>(
            client,
            ns,
            lists.config(),
            cache::slim_service,
        ),
        |_| {},
        cache::service_changes,
        {
            let (causes, generations) = (causes.clone(), std::sync::Mutex::new(HashMap::new()));
            move |s: &DeserializeGuard<RayService>| {
                let meta = cache::guard_meta(s);
                let plans = match (&meta.namespace, &meta.name) {
                    (Some(ns), Some(n)) => plans_for(&p, ns, n),
                    _ => vec![],
                };
                note_service(&causes, &generations, meta, &plans);
                plans
            }
        },
        tx.clone(),
    );
    let p = plans.clone();
    let clusters = spawn_cache(
        cache::slimmed_watcher::<DeserializeGuard<RayCluster>>(
            client,
            ns,
            lists.config().labels(LABEL_ORIGINATED_FROM_CR_NAME),
            cache::slim_cluster,
        ),
        |_| {},
        cache::cluster_changes,
        move |c: &DeserializeGuard<RayCluster>| {
            cache::cluster_service(c)
                .map(|(ns, svc)| plans_for(&p, &ns, &svc))
                .unwrap_or_default()
        },
        tx.clone(),
    );
    // Pods map to plans through their cluster's origin label.
    let (p, cl, tx_pods, tx_nodes) = (plans.clone(), clusters.clone(), tx.clone(), tx.clone());
    let p_all = plans.clone();
    let (queued_pods, queued_nodes) = (causes.clone(), causes.clone());
    let (capacity, capacity_ready) = cache::spawn_capacity_index(
        client.clone(),
        &settings.dra_plain_count,
        lists,
        causes.clone(),
        move |ns, cluster| {
            let plans = cl
                .get(&ObjectRef::new(cluster).within(ns))
                .and_then(|c| cache::cluster_service(&c))
                .map(|(ns, svc)| plans_for(&p, &ns, &svc))
                .unwrap_or_default();
            let keys: Vec<PlanKey> = plans.iter().map(PlanKey::from).collect();
            queued_pods.queued(&keys, Timestamp::now());
            for r in plans {
                let _ = tx_pods.unbounded_send(r);
            }
        },
        move || {
            let plans = p_all.state();
            let keys: Vec<PlanKey> = plans.iter().map(|x| x.key()).collect();
            queued_nodes.queued(&keys, Timestamp::now());
            for x in plans.iter() {
                let _ = tx_nodes.unbounded_send(ObjectRef::from_obj(x.as_ref()));
            }
        },
    );
    let limit_ranges = spawn_cache(
        // Defaults for the pods a RayCluster will create, in its own namespace.
        cache::scoped_watcher::<LimitRange>(client, ns, lists.config()),
        cache::slim_limit_range,
        |_: &LimitRange| None,
        |_: &LimitRange| vec![],
        tx.clone(),
    );
    let buffers = buffers::Shell::spawn(
        client,
        ns,
        settings.capacity.clone(),
        lists,
        plans.clone(),
        tx.clone(),
    );
    let reservations =
        reservations::Shell::spawn(client, ns, settings.kueue, lists, plans.clone(), tx.clone());
    let runtime_classes = spawn_cache(
        watcher(Api::<RuntimeClass>::all(client.clone()), lists.config()).default_backoff(),
        cache::slim_runtime_class,
        |_: &RuntimeClass| None,
        |_: &RuntimeClass| vec![],
        tx,
    );
    Caches {
        services,
        clusters,
        capacity,
        capacity_ready,
        limit_ranges,
        runtime_classes,
        buffers,
        reservations,
    }
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
            recorder: Recorder::new(client.clone(), reporter),
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

/// Gives back the gate of the RayService `plan` governs, unless another plan
/// governs that RayService now; the RayService given back, if any.
async fn give_back_gate(
    ctx: &Context,
    plans: &[Arc<UpgradePlan>],
    plan: &UpgradePlan,
) -> Result<Option<String>> {
    let Some(name) = govern::gate_to_release(plans, plan) else {
        return Ok(None);
    };
    release_gate(ctx, &plan.namespace().unwrap_or_default(), &name).await?;
    Ok(Some(name))
}

/// Give back the gate of `ns/name`. Only the RayService in the cache is
/// patched, by its uid: an apply would create a missing one.
async fn release_gate(ctx: &Context, ns: &str, name: &str) -> Result<()> {
    let Some(uid) = ctx
        .stores
        .services
        .get(&ObjectRef::new(name).within(ns))
        .and_then(|s| cache::guard_meta(&s).uid.clone())
    else {
        return Ok(());
    };
    let services: gate::Services = Api::namespaced(ctx.client.clone(), ns);
    let target = gate::Target { name, uid: &uid };
    match guarded(
        &ctx.fence,
        "giving back the gate",
        gate::release(&services, target),
    )
    .await?
    {
        Ok(()) => {
            info!(namespace = %ns, rayservice = %name, "gate released");
            Ok(())
        }
        // Gone: nothing is gated any more.
        Err(e) if gate::is_gone(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Gates raygate still holds on RayServices that no plan governs any more
/// (a plan deleted after its finalizer was removed by hand, a reference
/// edited while raygate was down) are given back.
async fn sweep_orphans(ctx: &Context) {
    let plans = ctx.stores.plans.state();
    for svc in ctx.stores.services.state() {
        let meta = cache::guard_meta(&svc);
        let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
            continue;
        };
        let owned = gate::owned_by_us(meta.managed_fields.as_deref().unwrap_or(&[]));
        if !owned || !in_scope(&ctx.settings, Some(ns)) || govern::governed(&plans, ns, name) {
            continue;
        }
        warn!(namespace = %ns, rayservice = %name, "no UpgradePlan governs this RayService; giving its gate back");
        if let Err(e) = release_gate(ctx, ns, name).await {
            warn!(namespace = %ns, rayservice = %name, error = %e, "giving back an orphaned gate");
        }
    }
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

async fn reconcile_plan(plan: Arc<UpgradePlan>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_timer();
    ctx.fence.check()?;
    let ns = plan.namespace().unwrap_or_default();
    let api: Api<UpgradePlan> = Api::namespaced(ctx.client.clone(), &ns);
    if !in_scope(&ctx.settings, plan.namespace().as_deref()) {
        leave(&api, &plan, &ctx).await?;
        return Ok(Action::await_change());
    }
    // Our own last status write, if the cache has not delivered it yet.
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
        publish(
            ctx,
            plan,
            None,
            &admission::EventNote {
                warning: false,
                reason: admission::EventReason::GateReleased,
                note: format!("raygate no longer gates {name}"),
                change: None,
            },
        )
        .await;
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
    ctx.decisions.lock().await.remove(&plan.key());
    Ok(Action::await_change())
}

/// One reconcile of a plan that raygate governs: observe, decide, record
/// the decision, then act on it.
async fn apply(plan: &UpgradePlan, ctx: &Context) -> Result<Action> {
    let now = Timestamp::now();
    let plans = ctx.stores.plans.state();
    // The reference was edited (an apiserver without CEL rules lets it):
    // the gate of the RayService it named goes back first.
    if let Some(old) = govern::recorded_elsewhere(plan) {
        return hand_over(plan, ctx, &plans, &old).await;
    }
    if let Some(governor) = govern::conflict_with(&plans, plan) {
        return report_conflict(plan, ctx, &governor, now).await;
    }
    let r = match record(plan, ctx, now).await? {
        Ok(r) => r,
        Err(later) => return Ok(later),
    };
    // Before the gate: an admitted plan's buffers go before KubeRay creates
    // the pods that will use their capacity.
    buffers::act(ctx, &r.plan, &r.seen.wanted).await;
    // The gate opens only on a granted reservation: made (or dropped) first.
    reservations::act(
        ctx,
        &r.plan,
        r.seen.reservation.as_ref(),
        r.seen.keep_reservation.as_deref(),
    )
    .await;
    reservations::refresh(ctx, &r.plan, &r.prev, &r.decision).await;
    let requeue = set_gate(ctx, &r).await?;
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
    let ns = plan.namespace().unwrap_or_default();
    ctx.decisions
        .lock()
        .await
        .remove(&PlanKey::new(ns, plan.name_any()));
    if write_status(ctx, plan, &govern::handed_over_status(plan, old)).await? {
        publish(
            ctx,
            plan,
            None,
            &admission::EventNote {
                warning: false,
                reason: admission::EventReason::GateReleased,
                note: format!("rayServiceRef changed: raygate no longer gates {old}"),
                change: None,
            },
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

/// A decision whose status is on the plan.
struct Recorded {
    /// The plan as the decision saw it.
    plan: UpgradePlan,
    seen: Seen,
    decision: Decision,
    /// The status before the decision.
    prev: UpgradePlanStatus,
}

/// Decides and writes the status; `Err(action)` when it could not be
/// written on current input (the plan keeps changing, or is gone).
async fn record(
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
        // Decide under the lock and reserve the admission there, so that a
        // decision made while the status is written counts it; the lock is
        // not held across the write.
        let (seen, mut decision, reserved_before) = {
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
            let (seen, decision, pass_at) =
                decide_now(ctx, &current, &overlay, now, service_workload.clone());
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
        };
        let prev = current.status.clone().unwrap_or_default();
        // A held plan's figures moving (nodes arriving one by one) are
        // written at most every PROGRESS_EVERY; the requeue writes them.
        let pace = (decision.events.is_empty()
            && !matches!(
                decision.gate,
                Some(admission::Gate::Open | admission::Gate::OpenIncremental)
            )
            && written::progress_only(&prev, &decision.status))
        .then(|| lock(&ctx.status_written).progress_wait(&key, Timestamp::now()))
        .flatten();
        let written = if decision.status == prev {
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
        // Not written: the reservation goes back to what it was.
        {
            let mut overlay = ctx.decisions.lock().await;
            match reserved_before {
                Some(a) => overlay.insert(key.clone(), a),
                None => overlay.remove(&key),
            };
        }
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

/// Writes the gate decided, unless another manager overrides it or it is
/// already set by raygate; the requeue interval, shortened when the apply
/// finds a new owner.
async fn set_gate(ctx: &Context, r: &Recorded) -> Result<Duration> {
    let d = &r.decision;
    let Some(gate) = d.gate.filter(|_| d.overridden_by.is_none()) else {
        return Ok(d.requeue);
    };
    let (ns, name) = (r.plan.namespace().unwrap_or_default(), r.plan.name_any());
    let key = PlanKey::new(ns.clone(), name.clone());
    if gate.is_set(r.seen.gate.value.as_ref()) && r.seen.gate.owned_by_us {
        return Ok(d.requeue);
    }
    let service = r.plan.spec.ray_service_ref.name.as_str();
    // Only the RayService the decision read: never a create.
    let Some(uid) = r.seen.gate.uid.as_deref() else {
        return Ok(d.requeue);
    };
    let cached = ctx
        .stores
        .services
        .get(&ObjectRef::new(service).within(&ns))
        .and_then(|s| cache::guard_meta(&s).resource_version.clone());
    if let Some(rv) = &cached
        && lock(&ctx.gates_written).unseen(&key, uid, gate.strategy(), rv)
    {
        debug!(plan = %name, rayservice = %service, gate = gate.strategy(),
               "gate written, not in the cache yet: not written again");
        return Ok(d.requeue);
    }
    let services: gate::Services = Api::namespaced(ctx.client.clone(), &ns);
    let target = gate::Target { name: service, uid };
    match guarded(
        &ctx.fence,
        "setting the gate",
        gate::apply(&services, target, gate),
    )
    .await?
    {
        Ok(()) => {
            let at = Timestamp::now();
            if let Some(rv) = cached {
                lock(&ctx.gates_written).written(key.clone(), uid, gate.strategy(), rv, at);
            }
            let timed = matches!(
                gate,
                admission::Gate::Open | admission::Gate::OpenIncremental
            )
            .then(|| {
                ctx.causes
                    .admitted(&PlanKey::new(ns.clone(), name.clone()), at)
            })
            .flatten();
            match timed {
                Some(t) => {
                    ctx.metrics
                        .admission_latency(t.cause.kind.as_str(), t.seconds);
                    let after = |x| latency::ms_after(t.cause.at, x);
                    info!(plan = %name, rayservice = %service, gate = gate.strategy(),
                          stage = "gate written", cause = t.cause.kind.as_str(), cause_object = %t.cause.object,
                          cause_at = %t.cause.at, latency_ms = (t.seconds * 1e3) as i64,
                          queued_ms = after(t.stages.queued), started_ms = after(t.stages.started),
                          pass_ms = after(t.stages.pass), decided_ms = after(t.stages.decided),
                          status_ms = after(t.stages.status), "gate set");
                }
                None => {
                    info!(plan = %name, rayservice = %service, gate = gate.strategy(), stage = "gate written", "gate set");
                }
            }
            Ok(d.requeue)
        }
        Err(e) if gate::is_gone(&e) => {
            // Deleted (or replaced) since the cache saw it: decide again
            // shortly, on what the cache shows then.
            info!(plan = %name, rayservice = %service, "RayService gone before the gate was set; not creating it");
            Ok(Duration::from_secs(2))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            // Taken over since our cache saw it: look again shortly, when
            // the cache shows the new owner and the override is reported.
            warn!(plan = %name, rayservice = %service, message = %e.message, "gate field owned by another manager");
            Ok(Duration::from_secs(2))
        }
        Err(e) => Err(e.into()),
    }
}

/// Events and metrics of a recorded decision.
async fn report(ctx: &Context, r: &Recorded, now: Timestamp) {
    let (d, plan, prev) = (&r.decision, &r.plan, &r.prev);
    let service = plan.spec.ray_service_ref.name.as_str();
    if d.observed.newly_overridden {
        ctx.metrics
            .gate_override(&plan.namespace().unwrap_or_default(), &plan.name_any());
    }
    if d.observed.recreations_avoided > 0 {
        ctx.metrics.recreations_avoided(
            &plan.namespace().unwrap_or_default(),
            d.observed.recreations_avoided,
        );
    }
    for ev in &d.events {
        publish(ctx, plan, Some(service), ev).await;
    }
    if let Some(outcome) = d.outcome
        && (d.status.phase != prev.phase || outcome == Outcome::Admitted)
    {
        ctx.metrics.admission(outcome);
    }
    observe_metrics(ctx, plan, service, d, now);
    let open = d.status.capacity_request.as_ref().and_then(|c| {
        use crate::upgradeplan::CapacityRequestState as S;
        let overdue = match c.state {
            S::Requested => false,
            S::NotDelivered => true,
            S::Queued | S::Failed => return None,
        };
        Some((seconds_since(c.requested_time?, now), overdue))
    });
    ctx.metrics.observe_capacity_request(
        &plan.namespace().unwrap_or_default(),
        &plan.name_any(),
        open,
    );
}

/// What the writes after a decision need from its observation.
struct Seen {
    gate: GateFacts,
    /// The plan's capacity request objects as the decision wants them.
    wanted: buffers::Wanted,
    /// The quota reservation to create, and the one to keep (the others go).
    reservation: Option<crate::kueue::types::Workload>,
    keep_reservation: Option<String>,
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
async fn write_status(
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

/// Each decision's Event, twice: regarding the plan (its RayService as
/// `related`), for `kubectl describe upgradeplan`, and regarding the RayService
/// (the plan as `related`), for `kubectl describe rayservice`, where a user
/// looks first when an upgrade does not happen (issue 32: raygate was
/// invisible there; `describe` lists only Events *regarding* the object). Two
/// requests per Event, sent together; Events come after the status and gate
/// writes, so they add nothing to an admission's latency.
async fn publish(
    ctx: &Context,
    plan: &UpgradePlan,
    service: Option<&str>,
    note: &admission::EventNote,
) {
    let ns = plan.namespace().unwrap_or_default();
    let related = service.and_then(|svc_name| {
        let svc = ctx
            .stores
            .services
            .get(&ObjectRef::new(svc_name).within(&ns))?;
        svc.0.as_ref().ok().map(|svc| svc.object_ref(&()))
    });
    let ev = Event {
        type_: if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: note.reason.as_str().to_string(),
        note: Some(truncate(note.note.clone(), 1000)),
        action: note.action(),
        secondary: related,
    };
    if ctx.fence.check().is_err() {
        return;
    }
    let bound = ctx.fence.api_timeout();
    let plan_ref = plan.object_ref(&());
    // `Event` is not `Clone`: the same fields, the objects swapped.
    let on_service = ev.secondary.clone().map(|svc| {
        let ev = Event {
            type_: ev.type_,
            reason: ev.reason.clone(),
            note: ev.note.clone(),
            action: ev.action.clone(),
            secondary: Some(plan_ref.clone()),
        };
        (ev, svc)
    });
    let on_plan = async {
        match tokio::time::timeout(bound, ctx.recorder.publish(&ev, &plan_ref)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "failed to record event on plan"),
            Err(_) => warn!(timeout = ?bound, "recording an event on the plan timed out"),
        }
    };
    let on_svc = async {
        let Some((ev, svc)) = &on_service else {
            return;
        };
        match tokio::time::timeout(bound, ctx.recorder.publish(ev, svc)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "failed to record event on the RayService"),
            Err(_) => warn!(timeout = ?bound, "recording an event on the RayService timed out"),
        }
    };
    tokio::join!(on_plan, on_svc);
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

fn seconds_since(t: Timestamp, now: Timestamp) -> f64 {
    now.duration_since(t).as_secs_f64().max(0.0)
}

fn observe_metrics(ctx: &Context, plan: &UpgradePlan, svc: &str, d: &Decision, now: Timestamp) {
    // What the decision observed (`Decision::observed`), never the status
    // read again.
    let o = &d.observed;
    let none = std::collections::BTreeMap::new();
    ctx.metrics.observe_plan(&PlanObservation {
        namespace: &plan.namespace().unwrap_or_default(),
        plan: &plan.name_any(),
        rayservice: svc,
        phase: o.phase,
        waiting_seconds: o.waiting_since.map(|t| seconds_since(t, now)),
        transition_seconds: o.transition_since.map(|t| seconds_since(t, now)),
        stalled: o.phase == Phase::Stalled,
        gate_overridden: o.gate_overridden,
        shortfall: o.capacity_shortfall().unwrap_or(&none),
        pods_pending_unschedulable: o.unschedulable_pods,
        kuberay_release_mismatch: o.kuberay_release_mismatch,
    });
    // Only from a fit made now: a status carried over from an earlier
    // decision would export stale free capacity as current.
    if !o.free.is_empty() {
        ctx.metrics.set_cluster_free(&o.free);
    }
}

#[cfg(test)]
mod reconcile_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> PlanKey {
        PlanKey::new("ns", n)
    }

    #[test]
    fn a_gate_written_is_not_written_again_until_the_cache_moves() {
        let now = Timestamp::now();
        let mut w = GatesWritten::default();
        assert!(!w.unseen(&key("a"), "uid-1", "NewCluster", "10"));
        w.written(key("a"), "uid-1", "NewCluster", "10".into(), now);
        // The cache still shows the version the write was made on.
        assert!(w.unseen(&key("a"), "uid-1", "NewCluster", "10"));
        // Anything observed since (our write, or someone else's): decide on it.
        assert!(!w.unseen(&key("a"), "uid-1", "NewCluster", "11"));
        // Another value, another RayService, another plan: written.
        assert!(!w.unseen(&key("a"), "uid-1", "None", "10"));
        assert!(!w.unseen(&key("a"), "uid-2", "NewCluster", "10"));
        assert!(!w.unseen(&key("b"), "uid-1", "NewCluster", "10"));
    }

    #[test]
    fn gates_written_are_forgotten_after_a_while() {
        let now = Timestamp::now();
        let mut w = GatesWritten::default();
        w.written(key("a"), "uid-1", "NewCluster", "10".into(), now);
        let later = now + GatesWritten::KEEP + Duration::from_secs(1);
        w.written(key("b"), "uid-2", "NewCluster", "7".into(), later);
        assert_eq!(w.0.len(), 1);
        assert!(w.unseen(&key("b"), "uid-2", "NewCluster", "7"));
    }
}
