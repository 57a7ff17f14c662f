//! The I/O of Kueue quota ([`crate::admission::quota`], `--kueue`): caches
//! of ClusterQueues, LocalQueues and raygate's own reservation Workloads,
//! the facts a decision reads from them, and the writes that make the
//! reservations match the decisions. Mirrors [`super::buffers`]:
//!
//! - a plan whose status names a reservation (`status.quota.reservation`)
//!   gets its Workload by server-side apply under a name derived from plan
//!   and change, so a restarted raygate finds and reuses it; then condition
//!   `PodsReady=True` (Kueue's `waitForPodsReady` would evict a Workload
//!   whose pods never come: measured on v0.19.0);
//! - any other reservation of the plan (another change; the transition
//!   completed, withdrawn, abandoned; the plan deleted) is deleted;
//! - a sweep deletes what no plan names any more (the owner reference lets
//!   the garbage collector do it too), and `raygate release` deletes all.
//!
//! Inert without `--kueue`: nothing is watched, read or written, and the
//! decisions have no quota dimension.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::watcher;
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use super::{Context, cache, gate, guarded, spawn_cache};
use crate::admission::quota::{QuotaFacts, ServiceWorkload};
use crate::admission::{Decision, Inputs};
use crate::kueue::quota::Released;
use crate::kueue::reservation::{self, LABEL_FINGERPRINT, LABEL_PLAN_UID, Owner, SELECTOR};
use crate::kueue::types::{ClusterQueue, LocalQueue, Workload};
use crate::leader::Fence;
use crate::upgradeplan::{Phase, QuotaReservation, UpgradePlan};
use crate::{Error, Result};

/// A sweep leaves younger reservations alone: their plan's status may not
/// be in the cache yet.
const SWEEP_GRACE: Duration = Duration::from_secs(60);
/// How long start-up waits for the Kueue caches before going on without.
const CACHE_WAIT: Duration = Duration::from_secs(20);

/// The caches; all `None` without `--kueue`.
pub struct Shell {
    cluster_queues: Option<Store<ClusterQueue>>,
    local_queues: Option<Store<LocalQueue>>,
    workloads: Option<Store<Workload>>,
    /// Granted reservations raygate deleted whose usage Kueue's
    /// ClusterQueue status may still show ([`crate::kueue::quota::Released`]).
    released: std::sync::Mutex<Vec<Released>>,
}

fn label<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// Plans a ClusterQueue or LocalQueue change may let through: those
/// waiting for quota.
fn waiting_for_quota(plans: &Store<UpgradePlan>) -> Vec<ObjectRef<UpgradePlan>> {
    plans
        .state()
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::WaitingForQuota)
        })
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

impl Shell {
    pub fn off() -> Shell {
        Shell {
            cluster_queues: None,
            local_queues: None,
            workloads: None,
            released: Default::default(),
        }
    }

    /// On, with empty caches (tests of the writes).
    #[cfg(test)]
    pub fn empty() -> Shell {
        use kube::runtime::reflector;
        Shell {
            cluster_queues: Some(reflector::store().0),
            local_queues: Some(reflector::store().0),
            workloads: Some(reflector::store().0),
            released: Default::default(),
        }
    }

    /// Watches ClusterQueues (cluster-wide), LocalQueues and raygate's
    /// Workloads in `namespaces` (all when empty).
    pub fn spawn(
        client: &Client,
        namespaces: &[String],
        enabled: bool,
        lists: super::lists::InitialLists,
        plans: Store<UpgradePlan>,
        tx: mpsc::UnboundedSender<ObjectRef<UpgradePlan>>,
    ) -> Shell {
        if !enabled {
            return Shell::off();
        }
        let p1 = plans.clone();
        let cluster_queues = spawn_cache(
            watcher(Api::<ClusterQueue>::all(client.clone()), lists.config()).default_backoff(),
            |_| {},
            |_: &ClusterQueue| None,
            move |_: &ClusterQueue| waiting_for_quota(&p1),
            tx.clone(),
        );
        let p2 = plans.clone();
        let local_queues = spawn_cache(
            cache::scoped_watcher::<LocalQueue>(client, namespaces, lists.config()),
            |_| {},
            |_: &LocalQueue| None,
            move |_: &LocalQueue| waiting_for_quota(&p2),
            tx.clone(),
        );
        let workloads = spawn_cache(
            cache::scoped_watcher::<Workload>(client, namespaces, lists.config().labels(SELECTOR)),
            |_| {},
            |_: &Workload| None,
            move |w: &Workload| super::buffers::plans_of(&plans, &w.metadata, |_| false),
            tx,
        );
        Shell {
            cluster_queues: Some(cluster_queues),
            local_queues: Some(local_queues),
            workloads: Some(workloads),
            released: Default::default(),
        }
    }

    /// Waits a little for the caches; a Kueue without the `v1beta2` API (or
    /// without RBAC) is logged, and Kueue-managed RayServices then wait with
    /// `quota unknown` rather than be admitted on the nodes alone.
    pub async fn wait_ready(&self) {
        let (Some(c), Some(l), Some(w)) =
            (&self.cluster_queues, &self.local_queues, &self.workloads)
        else {
            return;
        };
        let all = async {
            c.wait_until_ready().await.is_ok()
                && l.wait_until_ready().await.is_ok()
                && w.wait_until_ready().await.is_ok()
        };
        match tokio::time::timeout(CACHE_WAIT, all).await {
            Ok(true) => info!("ClusterQueue, LocalQueue and reservation Workload caches synced"),
            _ => warn!(
                "the Kueue caches did not sync within {CACHE_WAIT:?} (is Kueue v0.19 with \
                 kueue.x-k8s.io/v1beta2 installed, and may raygate list ClusterQueues, LocalQueues \
                 and Workloads?); Kueue-managed RayServices wait with \"quota unknown\""
            ),
        }
    }

    /// Resolves once every Kueue cache has synced (never without
    /// `--kueue`); the watches retry on their own, so Kueue installed or
    /// access granted after start-up ends it.
    pub fn synced(&self) -> impl std::future::Future<Output = bool> + Send + 'static {
        let stores = (
            self.cluster_queues.clone(),
            self.local_queues.clone(),
            self.workloads.clone(),
        );
        async move {
            let (Some(c), Some(l), Some(w)) = stores else {
                return false;
            };
            c.wait_until_ready().await.is_ok()
                && l.wait_until_ready().await.is_ok()
                && w.wait_until_ready().await.is_ok()
        }
    }

    fn workloads(&self) -> Vec<Arc<Workload>> {
        self.workloads.iter().flat_map(|s| s.state()).collect()
    }

    fn of_plan(&self, uid: &str) -> Vec<Arc<Workload>> {
        self.workloads()
            .into_iter()
            .filter(|w| label(&w.metadata, LABEL_PLAN_UID) == Some(&reservation::label_value(uid)))
            .collect()
    }

    /// Records that the granted ones among `names` (in `ns`) are being
    /// deleted now, for [`crate::kueue::quota::without_released`].
    fn releasing(&self, ns: &str, names: &[String]) {
        let (Some(w), Some(c)) = (&self.workloads, &self.cluster_queues) else {
            return;
        };
        let cqs: Vec<ClusterQueue> = c.state().iter().map(|c| c.as_ref().clone()).collect();
        let now = Timestamp::now();
        let mut released = crate::sync::lock(&self.released);
        for n in names {
            if let Some(r) = w
                .get(&ObjectRef::new(n).within(ns))
                .and_then(|w| Released::of(&w, &cqs, now))
                && !released.iter().any(|x| x.workload == r.workload)
            {
                released.push(r);
            }
        }
    }

    /// Every ClusterQueue, the usage of reservations raygate deleted taken
    /// out of the statuses Kueue has not written since.
    fn cluster_queues_now(&self, cqs: &Store<ClusterQueue>) -> Vec<ClusterQueue> {
        let mut all: Vec<ClusterQueue> = cqs.state().iter().map(|c| c.as_ref().clone()).collect();
        let now = Timestamp::now();
        let mut released = crate::sync::lock(&self.released);
        released.retain(|r| all.iter().any(|c| r.still_counted(c, now)));
        crate::kueue::quota::without_released(&mut all, &released, now);
        all
    }

    /// The ClusterQueue a LocalQueue of `ns` points at.
    fn cluster_queue_of(&self, ns: &str, queue: &str) -> Option<String> {
        self.local_queues
            .as_ref()?
            .get(&ObjectRef::new(queue).within(ns))?
            .spec
            .cluster_queue
            .clone()
    }
}

/// What a decision on `inputs` reads of Kueue: `None` without `--kueue`
/// or for a RayService Kueue does not manage.
pub fn facts(
    ctx: &Context,
    inputs: &Inputs<'_>,
    service_workload: Option<ServiceWorkload>,
) -> Option<QuotaFacts> {
    let shell = &ctx.reservations;
    let cqs = shell.cluster_queues.as_ref()?;
    let managed = inputs.service.as_ref().ok()?.kueue.clone()?;
    let ns = inputs.plan.namespace().unwrap_or_default();
    let uid = inputs.plan.metadata.uid.clone().unwrap_or_default();
    // The pending change's reservation first (a stale one may still exist).
    let fp = inputs
        .change
        .as_ref()
        .ok()
        .and_then(|c| c.as_ref())
        .map(|c| reservation::label_value(&c.fingerprint));
    let mut mine = shell.of_plan(&uid);
    mine.sort_by_key(|w| label(&w.metadata, LABEL_FINGERPRINT) != fp.as_deref());
    let reservation = mine.first().map(|w| QuotaReservation {
        workload: w.name_any(),
        fingerprint: label(&w.metadata, LABEL_FINGERPRINT)
            .unwrap_or_default()
            .into(),
        granted: w.quota_granted(),
    });
    let all = shell.cluster_queues_now(cqs);
    let workloads = shell.workloads();
    let queue = crate::admission::quota::queue_quota(
        &ns,
        &managed.queue,
        |ns, q| shell.cluster_queue_of(ns, q),
        all,
        workloads.iter().map(AsRef::as_ref),
        Some(&uid),
    );
    Some(QuotaFacts {
        queue,
        reservation,
        service_workload,
    })
}

/// The reservation the decision wants, built; `None`: none (or it cannot
/// be built: then the plan stays waiting, which the status says).
pub fn wanted(inputs: &Inputs<'_>, d: &Decision) -> Option<Workload> {
    let r = d.status.quota.as_ref()?.reservation.as_ref()?;
    let managed = inputs.service.as_ref().ok()?.kueue.clone()?;
    let change = inputs.change.as_ref().ok()?.as_ref()?;
    if change.fingerprint != r.fingerprint {
        // Tracking an admitted change: the Workload exists; keep it as is.
        return None;
    }
    let plan = inputs.plan;
    let ns = plan.namespace().unwrap_or_default();
    let name = plan.name_any();
    let uid = plan.metadata.uid.clone()?;
    let priority = inputs.settings.as_ref().map(|s| s.priority).unwrap_or(0);
    match reservation::workload(
        &Owner {
            namespace: &ns,
            name: &name,
            uid: &uid,
        },
        &r.workload,
        &managed.queue,
        &r.fingerprint,
        change.pods_to_fit(),
        priority,
    ) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(plan = %name, namespace = %ns, error = %e, "cannot build the quota reservation");
            None
        }
    }
}

/// The name of the reservation the decision keeps (to create or keep).
pub fn keep(d: &Decision) -> Option<String> {
    d.status
        .quota
        .as_ref()
        .and_then(|q| q.reservation.as_ref())
        .map(|r| r.workload.clone())
}

/// Makes the plan's reservations match the decision: creates `wanted` if
/// the cache does not show it, deletes every other. Never an error of the
/// reconcile: the gate opens only on a granted reservation, so a failure
/// here holds the plan, which retries.
pub async fn act(ctx: &Context, plan: &UpgradePlan, wanted: Option<&Workload>, keep: Option<&str>) {
    let shell = &ctx.reservations;
    if shell.workloads.is_none() {
        return;
    }
    let (Some(uid), ns) = (
        plan.metadata.uid.as_deref(),
        plan.namespace().unwrap_or_default(),
    ) else {
        return;
    };
    if let Some(w) = wanted {
        let name = w.name_any();
        let cached = shell
            .workloads
            .as_ref()
            .and_then(|s| s.get(&ObjectRef::new(&name).within(&ns)));
        let needs_ready = cached.as_ref().is_none_or(|c| !pods_ready(c));
        if cached.is_none() {
            match apply(ctx, &ns, w).await {
                Ok(()) => info!(plan = %plan.name_any(), namespace = %ns, workload = %name,
                                "quota reservation created in Kueue"),
                Err(e) => {
                    warn!(plan = %plan.name_any(), namespace = %ns, error = %e, "creating the quota reservation");
                    return;
                }
            }
        }
        if needs_ready && let Err(e) = mark_pods_ready(ctx, &ns, &name).await {
            warn!(plan = %plan.name_any(), namespace = %ns, error = %e, "marking the quota reservation PodsReady");
        }
    }
    let stale: Vec<String> = shell
        .of_plan(uid)
        .iter()
        .map(|w| w.name_any())
        .filter(|n| Some(n.as_str()) != keep)
        .collect();
    shell.releasing(&ns, &stale);
    if let Err(e) = delete_named(&ctx.client, &ctx.fence, &ns, &stale).await {
        warn!(plan = %plan.name_any(), namespace = %ns, error = %e, "deleting quota reservations (retried)");
    } else if !stale.is_empty() {
        info!(plan = %plan.name_any(), namespace = %ns, workloads = ?stale, "quota reservations deleted");
    }
}

fn pods_ready(w: &Workload) -> bool {
    w.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "PodsReady" && c.status == "True")
    })
}

async fn apply(ctx: &Context, ns: &str, w: &Workload) -> Result<()> {
    let api: Api<Workload> = Api::namespaced(ctx.client.clone(), ns);
    let name = w.name_any();
    guarded(
        &ctx.fence,
        "applying a quota reservation Workload",
        api.patch(
            &name,
            &PatchParams::apply(gate::FIELD_MANAGER).force(),
            &Patch::Apply(w),
        ),
    )
    .await?
    .map_err(|e| api_error(&name, e))?;
    Ok(())
}

/// `PodsReady=True`: the reservation has no pods, and Kueue must not evict
/// it for that (`waitForPodsReady`).
async fn mark_pods_ready(ctx: &Context, ns: &str, name: &str) -> Result<()> {
    let api: Api<Workload> = Api::namespaced(ctx.client.clone(), ns);
    let body = serde_json::json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "status": {"conditions": [{
            "type": "PodsReady", "status": "True", "reason": "QuotaReservation",
            "message": "raygate's quota reservation for a RayService's new cluster has no pods of its own",
            "lastTransitionTime": Timestamp::now().to_string(),
        }]}
    });
    guarded(
        &ctx.fence,
        "marking a quota reservation PodsReady",
        api.patch_status(
            name,
            &PatchParams::apply(gate::FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        ),
    )
    .await?
    .map_err(|e| api_error(name, e))?;
    Ok(())
}

fn api_error(name: &str, e: kube::Error) -> Error {
    let why = match &e {
        kube::Error::Api(s) if s.code == 404 => {
            "the Workload API (kueue.x-k8s.io/v1beta2) is not installed: install Kueue v0.19 or turn --kueue off"
                .to_string()
        }
        kube::Error::Api(s) if s.code == 403 => format!(
            "raygate may not write Workloads here ({}); grant it with the chart's kueue.reservations.enabled",
            s.message
        ),
        _ => e.to_string(),
    };
    Error::invalid(format!("Workload {name}"), why)
}

/// Deletes `names` in `ns`; gone already is fine.
async fn delete_named(client: &Client, fence: &Fence, ns: &str, names: &[String]) -> Result<()> {
    let api: Api<Workload> = Api::namespaced(client.clone(), ns);
    for name in names {
        match guarded(
            fence,
            "deleting a quota reservation",
            api.delete(name, &DeleteParams::default()),
        )
        .await?
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A deleted plan: its reservations go now.
pub async fn forget(ctx: &Context, plan: &UpgradePlan) -> Result<()> {
    if let Some(uid) = plan.metadata.uid.as_deref() {
        let names: Vec<String> = ctx
            .reservations
            .of_plan(uid)
            .iter()
            .map(|w| w.name_any())
            .collect();
        let ns = plan.namespace().unwrap_or_default();
        ctx.reservations.releasing(&ns, &names);
        delete_named(&ctx.client, &ctx.fence, &ns, &names).await?;
    }
    Ok(())
}

/// What raygate's admitted reservations hold, per (ClusterQueue, resource),
/// in base units (Kueue's `status.admission.podSetAssignments[].resourceUsage`).
pub fn reserved(workloads: &[Arc<Workload>]) -> BTreeMap<(String, String), f64> {
    let mut out: BTreeMap<(String, String), f64> = BTreeMap::new();
    for w in workloads.iter().filter(|w| w.quota_granted()) {
        let Some(a) = w.status.as_ref().and_then(|s| s.admission.as_ref()) else {
            continue;
        };
        for ps in &a.pod_set_assignments {
            for (r, q) in &ps.resource_usage {
                *out.entry((a.cluster_queue.clone(), r.clone())).or_default() +=
                    q.milli_value() as f64 / 1000.0;
            }
        }
    }
    out
}

/// Deletes the reservations no plan's status names (a plan gone, a change
/// over), older than `SWEEP_GRACE`; exports what the others hold.
pub async fn sweep(ctx: &Context) {
    let shell = &ctx.reservations;
    if shell.workloads.is_none() {
        return;
    }
    ctx.metrics
        .observe_quota_reserved(&reserved(&shell.workloads()));
    let plans = ctx.stores.plans.state();
    let named: BTreeMap<String, String> = plans
        .iter()
        .filter_map(|p| {
            let r = p.status.as_ref()?.quota.as_ref()?.reservation.as_ref()?;
            Some((
                reservation::label_value(p.metadata.uid.as_deref()?),
                r.workload.clone(),
            ))
        })
        .collect();
    let now = Timestamp::now();
    let mut by_ns: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for w in shell.workloads() {
        let old = w.metadata.creation_timestamp.as_ref().is_none_or(|t| {
            Duration::try_from(now.duration_since(t.0)).unwrap_or_default() > SWEEP_GRACE
        });
        let wanted = label(&w.metadata, LABEL_PLAN_UID)
            .and_then(|u| named.get(u))
            .is_some_and(|n| *n == w.name_any());
        if old && !wanted {
            by_ns
                .entry(w.namespace().unwrap_or_default())
                .or_default()
                .push(w.name_any());
        }
    }
    for (ns, names) in by_ns {
        warn!(namespace = %ns, workloads = ?names, "quota reservations no plan wants; deleting them");
        shell.releasing(&ns, &names);
        if let Err(e) = delete_named(&ctx.client, &ctx.fence, &ns, &names).await {
            warn!(namespace = %ns, error = %e, "deleting quota reservations");
        }
    }
}

/// `raygate release`: deletes every reservation raygate made in
/// `namespace` (all when `None`); Kueue not installed or never granted is
/// fine (nothing to delete). Their names, `ns/name`.
pub async fn release(
    client: &Client,
    namespace: Option<&str>,
    covers: impl Fn(&str) -> bool,
) -> Result<Vec<String>> {
    let fence = Fence::open();
    let api: Api<Workload> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let lp = ListParams::default().labels(SELECTOR);
    let items = match guarded(&fence, "listing quota reservations", api.list_metadata(&lp)).await? {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => vec![],
        Err(e) => return Err(e.into()),
    };
    let mut by_ns: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for w in &items {
        by_ns
            .entry(w.namespace().unwrap_or_default())
            .or_default()
            .push(w.name_any());
    }
    let mut done = vec![];
    for (ns, names) in by_ns.into_iter().filter(|(ns, _)| covers(ns)) {
        delete_named(client, &fence, &ns, &names).await?;
        done.extend(names.iter().map(|n| format!("{ns}/{n}")));
    }
    Ok(done)
}

/// Kueue labels the Workload of a job with the job's uid
/// (`constants.JobUIDLabel`).
const LABEL_JOB_UID: &str = "kueue.x-k8s.io/job-uid";

/// Kueue's own Workload of the plan's RayService, read (one bounded list by
/// its `kueue.x-k8s.io/job-uid` label) only while a transition runs whose
/// Workload raygate has had Kueue derive again (`status.quota.
/// workloadRefreshedFor`): whether Kueue admitted it is what decides if
/// the new cluster can leave its suspension. `None` otherwise, or when the
/// read fails (logged; the transition is then reported as before).
pub async fn service_workload(ctx: &Context, plan: &UpgradePlan) -> Option<ServiceWorkload> {
    ctx.reservations.workloads.as_ref()?;
    let status = plan.status.as_ref()?;
    status.quota.as_ref()?.workload_refreshed_for.as_ref()?;
    if !matches!(status.phase, Phase::Upgrading | Phase::Stalled) {
        return None;
    }
    let uid = status.ray_service_uid.as_deref()?;
    let ns = plan.namespace().unwrap_or_default();
    let api: Api<Workload> = Api::namespaced(ctx.client.clone(), &ns);
    let lp = ListParams::default()
        .labels(&format!("{LABEL_JOB_UID}={uid}"))
        .limit(16);
    match guarded(
        &ctx.fence,
        "reading the RayService's Kueue Workload",
        api.list(&lp),
    )
    .await
    {
        Ok(Ok(l)) => {
            let ours: Vec<Workload> = l
                .items
                .into_iter()
                .filter(|w| label(&w.metadata, reservation::LABEL_RESERVATION).is_none())
                .collect();
            ServiceWorkload::of(&ours)
        }
        Ok(Err(e)) => {
            warn!(plan = %plan.name_any(), namespace = %ns, error = %e, "reading the RayService's Kueue Workload");
            None
        }
        Err(e) => {
            warn!(plan = %plan.name_any(), namespace = %ns, error = %e, "reading the RayService's Kueue Workload");
            None
        }
    }
}

/// The decision asked Kueue to derive the RayService's Workload again
/// (`admission::quota::refresh`: `status.quota.workloadRefreshedFor`
/// newly set): its Workloads (not raygate's) are deleted, once per pending
/// cluster; Kueue makes a new one from the spec at once. A failure is logged
/// (the transition then waits, gated, as without it).
pub async fn refresh(
    ctx: &Context,
    plan: &UpgradePlan,
    prev: &crate::upgradeplan::UpgradePlanStatus,
    d: &Decision,
) {
    if ctx.reservations.workloads.is_none() {
        return;
    }
    let now = d
        .status
        .quota
        .as_ref()
        .and_then(|q| q.workload_refreshed_for.as_deref());
    let before = prev
        .quota
        .as_ref()
        .and_then(|q| q.workload_refreshed_for.as_deref());
    let (Some(pending), Some(uid)) = (now, d.status.ray_service_uid.as_deref()) else {
        return;
    };
    if before == Some(pending) {
        return;
    }
    let ns = plan.namespace().unwrap_or_default();
    let api: Api<Workload> = Api::namespaced(ctx.client.clone(), &ns);
    let lp = ListParams::default().labels(&format!("{LABEL_JOB_UID}={uid}"));
    let listed = match guarded(
        &ctx.fence,
        "listing the RayService's Workloads",
        api.list_metadata(&lp),
    )
    .await
    {
        Ok(Ok(l)) => l.items,
        Ok(Err(e)) => {
            warn!(plan = %plan.name_any(), namespace = %ns, error = %e, "listing the RayService's Kueue Workload");
            return;
        }
        Err(e) => {
            warn!(plan = %plan.name_any(), namespace = %ns, error = %e, "listing the RayService's Kueue Workload");
            return;
        }
    };
    let names: Vec<String> = listed
        .iter()
        .filter(|w| label(&w.metadata, reservation::LABEL_RESERVATION).is_none())
        .map(|w| w.name_any())
        .collect();
    match delete_named(&ctx.client, &ctx.fence, &ns, &names).await {
        Ok(()) => {
            info!(plan = %plan.name_any(), namespace = %ns, pending = %pending, workloads = ?names,
                        "Kueue's Workload of the RayService deleted: Kueue derives it again from the new cluster")
        }
        Err(e) => {
            warn!(plan = %plan.name_any(), namespace = %ns, error = %e, "deleting the RayService's Kueue Workload")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_admitted_reservations_count_per_cluster_queue_and_resource() {
        let w = |cq: &str, gpus: &str, granted: bool| -> Arc<Workload> {
            Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                    "metadata": {"name": "w", "namespace": "ml"},
                    "spec": {"podSets": []},
                    "status": {
                        "conditions": [{"type": "QuotaReserved", "status": if granted { "True" } else { "False" },
                            "reason": "r", "message": "", "lastTransitionTime": "2026-12-07T00:00:00Z"}],
                        "admission": {"clusterQueue": cq, "podSetAssignments": [
                            {"name": "head", "resourceUsage": {"cpu": "2"}},
                            {"name": "gpu", "resourceUsage": {"cpu": "8", "nvidia.com/gpu": gpus}}]}}
                }))
                .unwrap(),
            )
        };
        let r = reserved(&[w("a", "8", true), w("a", "4", true), w("b", "8", false)]);
        assert_eq!(r[&("a".to_string(), "nvidia.com/gpu".to_string())], 12.0);
        assert_eq!(r[&("a".to_string(), "cpu".to_string())], 20.0);
        assert!(
            !r.keys().any(|(cq, _)| cq == "b"),
            "not admitted: holds nothing"
        );
    }
}
