//! The I/O of capacity requests ([`crate::autoscale`]): the caches of the
//! PodTemplates and CapacityBuffers raygate made, and the writes that create,
//! find again and delete them. What should exist is decided purely
//! ([`crate::autoscale::queue`], [`crate::autoscale::shapes`]); this file only
//! makes the cluster match, and never blocks a gate on it:
//!
//! - a plan whose request is open gets its objects by server-side apply under
//!   names derived from plan, change and shape, so a restarted raygate applies
//!   the same names and never duplicates them;
//! - a plan admitted, withdrawn, superseded, queued behind others or deleted
//!   loses them; when admitted, before its gate opens (else the autoscaler
//!   would keep the capacity free a second time for the placeholders);
//! - a sweep deletes what no plan wants any more (a plan deleted while raygate
//!   was down: the owner reference lets Kubernetes' garbage collector do it
//!   too), and `raygate release` deletes them all;
//! - an object of an open request deleted or edited by someone else (a user's
//!   `kubectl edit`, `delete`) wakes its plan and is applied again: a buffer
//!   scaled up by hand would make the autoscaler buy nodes no plan needs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::channel::mpsc;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::PodTemplate;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use super::{Context, cache, gate, guarded, spawn_cache};
use crate::admission::ledger::QueueKey;
use crate::admission::settings::Operator;
use crate::admission::{self, Decision, Inputs};
use crate::autoscale::buffer::CapacityBuffer;
use crate::autoscale::request;
use crate::autoscale::shapes::Objects;
use crate::autoscale::{self, Defaults, LABEL_FINGERPRINT, LABEL_PLAN_UID};
use crate::leader::Fence;
use crate::sync::lock;
use crate::upgradeplan::{CapacityRequestState, Phase, PlanKey, UpgradePlan};
use crate::{Error, Result};

/// The selector of every object raygate makes for a request.
const SELECTOR: &str = "app.kubernetes.io/managed-by=raygate";
/// A sweep leaves younger objects alone: their plan's status may not be in
/// the cache yet.
const SWEEP_GRACE: Duration = Duration::from_secs(60);
/// How long start-up waits for the CapacityBuffer cache before going on
/// without it (the CRD may be missing: the plans then report it).
const CACHE_WAIT: Duration = Duration::from_secs(20);

/// The caches and the bookkeeping of requests; inert when requests are off.
pub struct Shell {
    pub defaults: Defaults,
    buffers: Option<Store<CapacityBuffer>>,
    templates: Option<Store<PodTemplate>>,
    ready: Arc<AtomicBool>,
    /// Plans whose objects this process created and the cache may not show
    /// yet: they count against the cap at once.
    recent: std::sync::Mutex<BTreeSet<PlanKey>>,
    /// Why the last attempt to create a plan's objects failed.
    errors: std::sync::Mutex<BTreeMap<PlanKey, String>>,
    /// The resourceVersion of each PodTemplate as raygate last applied it
    /// (namespace, name): the cache keeps no template body, and nothing but
    /// raygate writes one, so another version means an edit by someone else.
    written: std::sync::Mutex<BTreeMap<(String, String), String>>,
}

fn label<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// The plans an object raygate made wakes: its owner (by the uid label),
/// and the plans `also` names.
pub(super) fn plans_of(
    plans: &Store<UpgradePlan>,
    object: &kube::api::ObjectMeta,
    also: impl Fn(&UpgradePlan) -> bool,
) -> Vec<ObjectRef<UpgradePlan>> {
    let uid = label(object, LABEL_PLAN_UID);
    plans
        .state()
        .iter()
        .filter(|p| uid.is_some() && p.metadata.uid.as_deref() == uid || also(p))
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

impl Shell {
    /// No requests: nothing is watched or written.
    pub fn off(defaults: Defaults) -> Shell {
        Shell {
            defaults,
            buffers: None,
            templates: None,
            ready: Arc::new(AtomicBool::new(false)),
            recent: Default::default(),
            errors: Default::default(),
            written: Default::default(),
        }
    }

    /// Watches raygate's PodTemplates and CapacityBuffers in `namespaces`
    /// (all when empty); a buffer's change wakes its plan and the plans
    /// queued for a request.
    pub fn spawn(
        client: &Client,
        namespaces: &[String],
        defaults: Defaults,
        lists: super::lists::InitialLists,
        plans: Store<UpgradePlan>,
        tx: mpsc::UnboundedSender<ObjectRef<UpgradePlan>>,
    ) -> Shell {
        if !defaults.enabled {
            return Shell::off(defaults);
        }
        let wc = lists.config().labels(SELECTOR);
        let plans_of_template = plans.clone();
        let buffers = spawn_cache(
            cache::scoped_watcher::<CapacityBuffer>(client, namespaces, wc.clone()),
            |_| {},
            |_: &CapacityBuffer| None,
            move |b: &CapacityBuffer| {
                let queued = |p: &UpgradePlan| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.capacity_request.as_ref())
                        .is_some_and(|r| r.state == CapacityRequestState::Queued)
                };
                plans_of(&plans, &b.metadata, queued)
            },
            tx.clone(),
        );
        // A template deleted or edited by hand wakes its plan, which applies
        // it again (the buffer naming a missing template is not ready).
        let templates = spawn_cache(
            cache::scoped_watcher::<PodTemplate>(client, namespaces, wc),
            |t: &mut PodTemplate| t.template = None,
            |_: &PodTemplate| None,
            move |t: &PodTemplate| plans_of(&plans_of_template, &t.metadata, |_| false),
            tx,
        );
        let ready = Arc::new(AtomicBool::new(false));
        tokio::spawn({
            let (ready, b, t) = (ready.clone(), buffers.clone(), templates.clone());
            async move {
                if b.wait_until_ready().await.is_ok() && t.wait_until_ready().await.is_ok() {
                    ready.store(true, Ordering::SeqCst);
                    info!("CapacityBuffer and PodTemplate caches synced");
                }
            }
        });
        Shell {
            defaults,
            buffers: Some(buffers),
            templates: Some(templates),
            ready,
            recent: Default::default(),
            errors: Default::default(),
            written: Default::default(),
        }
    }

    /// Waits a little for the caches, so the cap holds from the start.
    pub async fn wait_ready(&self) {
        if self.buffers.is_none() {
            return;
        }
        let deadline = tokio::time::Instant::now() + CACHE_WAIT;
        while !self.ready.load(Ordering::SeqCst) {
            if tokio::time::Instant::now() >= deadline {
                warn!(
                    "the CapacityBuffer cache did not sync within {CACHE_WAIT:?} (is the \
                     autoscaling.x-k8s.io/v1beta1 CRD installed, and may raygate list it?); \
                     plans asking for capacity report it"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn buffers_of(&self, uid: &str) -> Vec<Arc<CapacityBuffer>> {
        self.buffers
            .iter()
            .flat_map(|s| s.state())
            .filter(|b| label(&b.metadata, LABEL_PLAN_UID) == Some(uid))
            .collect()
    }

    fn templates_of(&self, uid: &str) -> Vec<Arc<PodTemplate>> {
        self.templates
            .iter()
            .flat_map(|s| s.state())
            .filter(|t| label(&t.metadata, LABEL_PLAN_UID) == Some(uid))
            .collect()
    }

    /// Plans that have objects now: cached, or reserved here (`recent`, the
    /// caller holds its lock so deciding and reserving are one step).
    fn open_now(
        &self,
        recent: &BTreeSet<PlanKey>,
        plans: &[Arc<UpgradePlan>],
    ) -> BTreeSet<PlanKey> {
        let by_uid: BTreeMap<&str, PlanKey> = plans
            .iter()
            .filter_map(|p| Some((p.metadata.uid.as_deref()?, p.key())))
            .collect();
        let mut open = recent.clone();
        for b in self.buffers.iter().flat_map(|s| s.state()) {
            let Some(uid) = label(&b.metadata, LABEL_PLAN_UID) else {
                continue;
            };
            open.insert(by_uid.get(uid).cloned().unwrap_or_else(|| {
                PlanKey::new(b.namespace().unwrap_or_default(), format!("uid:{uid}"))
            }));
        }
        open
    }
}

pub use crate::autoscale::request::Wanted;

/// A plan that wants a request, as the cache records it.
fn recorded_want(p: &UpgradePlan, d: &Defaults, operator: &Operator) -> Option<QueueKey> {
    let s = p.status.as_ref()?;
    if s.phase != Phase::WaitingForCapacity || s.admitted.is_some() || s.pending_change.is_none() {
        return None;
    }
    autoscale::resolve(p, d).ok()??;
    Some(QueueKey::of(
        p,
        operator.ceilings.of(p),
        Some(s),
        Timestamp::MAX,
    ))
}

/// What a decision on `plan` reads about capacity requests, with `recent`
/// (the plans this process reserved a slot for) counted as open.
fn facts(
    ctx: &Context,
    plan: &UpgradePlan,
    plans: &[Arc<UpgradePlan>],
    recent: &BTreeSet<PlanKey>,
) -> request::Facts {
    let shell = &ctx.buffers;
    let key = plan.key();
    let ns = key.namespace.as_str();
    let mut f = request::Facts {
        defaults: shell.defaults.clone(),
        buffers: plan
            .metadata
            .uid
            .as_deref()
            .map(|uid| shell.buffers_of(uid))
            .unwrap_or_default(),
        apply_error: lock(&shell.errors).get(&key).cloned(),
        ..request::Facts::default()
    };
    // The queue, the open requests and the LimitRanges matter only to a plan
    // that asks for capacity with requests on (`request::settle` reads them
    // for no other): every other reconcile skips the scan of every plan.
    if shell.defaults.enabled && matches!(autoscale::resolve(plan, &shell.defaults), Ok(Some(_))) {
        f.others = plans
            .iter()
            .filter(|p| p.key() != key)
            .filter_map(|p| recorded_want(p, &shell.defaults, &ctx.settings.operator))
            .collect();
        f.open_now = shell.open_now(recent, plans);
        f.limit_ranges = ctx
            .stores
            .limit_ranges
            .state()
            .iter()
            .filter(|l| l.metadata.namespace.as_deref() == Some(ns))
            .map(|l| l.as_ref().clone())
            .collect();
    }
    f
}

/// Decides on `inputs` with what is observed of capacity requests, and
/// reserves the slot the decision takes. Deciding and reserving are one
/// step under the lock of `recent`: two plans reconciled at once (before
/// either's objects reach the cache) must not both take the last slot. The
/// decision is made on a copy of the open plans; if another plan reserved
/// one since, it is made again under the lock, on what is open now.
pub fn decide(ctx: &Context, inputs: &mut Inputs<'_>) -> Decision {
    let shell = &ctx.buffers;
    let plans = ctx.stores.plans.state();
    let recent = lock(&shell.recent).clone();
    let seen = facts(ctx, inputs.plan, &plans, &recent);
    let open_seen = seen.open_now.clone();
    inputs.capacity_request = Some(seen);
    let d = admission::decide(inputs);
    let key = inputs.plan.key();
    shell.reserve(key, &plans, &open_seen, d, |open_now| {
        if let Some(f) = inputs.capacity_request.as_mut() {
            f.open_now = open_now;
        }
        admission::decide(inputs)
    })
}

impl Shell {
    /// Reserves `key`'s slot if `d`, decided on the open plans `seen`,
    /// takes one. Under the lock of `recent`, on the plans open now: when
    /// another plan reserved one since (or the cache moved), `again`
    /// decides on what is open now, and only its answer is reserved.
    fn reserve(
        &self,
        key: PlanKey,
        plans: &[Arc<UpgradePlan>],
        seen: &BTreeSet<PlanKey>,
        d: Decision,
        again: impl FnOnce(BTreeSet<PlanKey>) -> Decision,
    ) -> Decision {
        if !d.capacity_objects.opens() {
            return d;
        }
        let mut recent = lock(&self.recent);
        let open_now = self.open_now(&recent, plans);
        let d = if open_now == *seen {
            d
        } else {
            again(open_now)
        };
        if d.capacity_objects.opens() {
            recent.insert(key);
        }
        d
    }
}

/// Makes the plan's objects match `wanted`. Never an error of the
/// reconcile, so nothing here can keep a gate closed: a failure to create is
/// recorded for the plan's status, a failure to delete is logged and retried
/// by the next reconcile and the sweep.
pub async fn act(ctx: &Context, plan: &UpgradePlan, wanted: &Wanted) {
    let shell = &ctx.buffers;
    if shell.buffers.is_none() {
        return;
    }
    let key = plan.key();
    let Some(uid) = plan.metadata.uid.clone() else {
        return;
    };
    let ns = key.namespace.clone();
    let keep = match wanted {
        Wanted::Open {
            fingerprint,
            objects,
        } => {
            match create(ctx, &ns, objects).await {
                Ok(0) => {}
                Ok(n) => {
                    info!(plan = %key.name, namespace = %ns, change = %fingerprint, shapes = n,
                          "capacity requested from the node autoscaler");
                }
                Err(e) => {
                    warn!(plan = %key.name, namespace = %ns, error = %e, "creating the capacity request");
                    lock(&shell.errors).insert(key.clone(), e.to_string());
                    // What was created shows in the cache; the reservation
                    // must not hold a slot for objects that do not exist.
                    lock(&shell.recent).remove(&key);
                    return;
                }
            }
            lock(&shell.errors).remove(&key);
            Some(fingerprint.as_str())
        }
        Wanted::Close => {
            lock(&shell.errors).remove(&key);
            None
        }
    };
    match delete_stale(ctx, &ns, &uid, keep).await {
        Ok(0) => {}
        Ok(n) => {
            info!(plan = %key.name, namespace = %ns, objects = n, "capacity request objects deleted")
        }
        Err(e) => {
            warn!(plan = %key.name, namespace = %ns, error = %e, "deleting capacity request objects (retried)");
            return;
        }
    }
    if keep.is_none() {
        lock(&shell.recent).remove(&key);
    }
}

/// Whether the cached buffer still says what raygate applied: the fields
/// raygate sets, as it set them (the autoscaler writes only the status).
fn buffer_intact(cached: &CapacityBuffer, wanted: &CapacityBuffer) -> bool {
    let (c, w) = (&cached.spec, &wanted.spec);
    (w.replicas.is_none() || c.replicas == w.replicas)
        && (w.pod_template_ref.is_none() || c.pod_template_ref == w.pod_template_ref)
        && (w.provisioning_strategy.is_none() || c.provisioning_strategy == w.provisioning_strategy)
}

/// Whether only raygate's field manager ever wrote the object: any other
/// writer (`kubectl edit`, a merge patch) leaves an entry of its own.
fn only_ours(meta: &kube::api::ObjectMeta) -> bool {
    meta.managed_fields.as_ref().is_some_and(|m| {
        !m.is_empty()
            && m.iter()
                .all(|f| f.manager.as_deref() == Some(gate::FIELD_MANAGER))
    })
}

/// Applies the objects the cache does not show as raygate applied them
/// (missing, or edited by someone else); how many shapes were written.
async fn create(ctx: &Context, ns: &str, objects: &[Objects]) -> Result<usize> {
    let shell = &ctx.buffers;
    let template_intact = |name: &str| {
        let t = shell
            .templates
            .as_ref()
            .and_then(|s| s.get(&ObjectRef::new(name).within(ns)));
        t.is_some_and(|t| {
            match lock(&shell.written).get(&(ns.to_string(), name.to_string())) {
                Some(rv) => t.metadata.resource_version.as_ref() == Some(rv),
                // Not applied by this process (it restarted): intact if
                // nobody else wrote it.
                None => only_ours(&t.metadata),
            }
        })
    };
    let buffer_ok = |o: &Objects, name: &str| {
        shell
            .buffers
            .as_ref()
            .and_then(|s| s.get(&ObjectRef::new(name).within(ns)))
            .is_some_and(|b| buffer_intact(&b, &o.buffer))
    };
    let templates: Api<PodTemplate> = Api::namespaced(ctx.client.clone(), ns);
    let buffers: Api<CapacityBuffer> = Api::namespaced(ctx.client.clone(), ns);
    let params = PatchParams::apply(gate::FIELD_MANAGER).force();
    let mut written = 0;
    for o in objects {
        let name = o.template.metadata.name.clone().unwrap_or_default();
        let (t_ok, b_ok) = (template_intact(&name), buffer_ok(o, &name));
        if t_ok && b_ok {
            continue;
        }
        // The template first: a buffer naming a missing one is reported
        // not ready by the autoscaler.
        if !t_ok {
            let applied = guarded(
                &ctx.fence,
                "applying a PodTemplate",
                templates.patch(&name, &params, &Patch::Apply(&o.template)),
            )
            .await?
            .map_err(|e| api_error("PodTemplate", &name, e))?;
            if let Some(rv) = applied.metadata.resource_version {
                lock(&shell.written).insert((ns.to_string(), name.clone()), rv);
            }
        }
        if !b_ok {
            guarded(
                &ctx.fence,
                "applying a CapacityBuffer",
                buffers.patch(&name, &params, &Patch::Apply(&o.buffer)),
            )
            .await?
            .map_err(|e| api_error("CapacityBuffer", &name, e))?;
        }
        written += 1;
    }
    Ok(written)
}

fn api_error(kind: &str, name: &str, e: kube::Error) -> Error {
    let why = match &e {
        kube::Error::Api(s) if s.code == 404 && kind == "CapacityBuffer" => {
            "the CapacityBuffer API (autoscaling.x-k8s.io/v1beta1) is not installed: install the \
             autoscaler's CRD (docs/autoscaling.md)"
                .to_string()
        }
        kube::Error::Api(s) if s.code == 403 => format!(
            "raygate may not write {kind}s here ({}); grant it with the chart's \
             capacityRequests.enabled or config/components/capacity-requests",
            s.message
        ),
        _ => e.to_string(),
    };
    Error::invalid(format!("{kind} {name}"), why)
}

/// Deletes the plan's objects of any change but `keep`'s; how many.
async fn delete_stale(ctx: &Context, ns: &str, uid: &str, keep: Option<&str>) -> Result<usize> {
    let shell = &ctx.buffers;
    let stale =
        |meta: &kube::api::ObjectMeta| keep.is_none() || label(meta, LABEL_FINGERPRINT) != keep;
    let buffers: Vec<String> = shell
        .buffers_of(uid)
        .iter()
        .filter(|b| stale(&b.metadata))
        .map(|b| b.name_any())
        .collect();
    let templates: Vec<String> = shell
        .templates_of(uid)
        .iter()
        .filter(|t| stale(&t.metadata))
        .map(|t| t.name_any())
        .collect();
    delete_named(&ctx.client, &ctx.fence, ns, &buffers, &templates).await?;
    Ok(buffers.len() + templates.len())
}

/// Deletes buffers first (the autoscaler drops their placeholders), then
/// templates; gone already is fine.
async fn delete_named(
    client: &Client,
    fence: &Fence,
    ns: &str,
    buffers: &[String],
    templates: &[String],
) -> Result<()> {
    let b_api: Api<CapacityBuffer> = Api::namespaced(client.clone(), ns);
    let t_api: Api<PodTemplate> = Api::namespaced(client.clone(), ns);
    let dp = DeleteParams::default();
    for name in buffers {
        match guarded(fence, "deleting a CapacityBuffer", b_api.delete(name, &dp)).await? {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    for name in templates {
        match guarded(fence, "deleting a PodTemplate", t_api.delete(name, &dp)).await? {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A deleted plan: its objects go now (the garbage collector would too,
/// through the owner reference, once the plan object is gone).
pub async fn forget(ctx: &Context, plan: &UpgradePlan) -> Result<()> {
    let key = plan.key();
    lock(&ctx.buffers.errors).remove(&key);
    if let Some(uid) = plan.metadata.uid.as_deref() {
        delete_stale(ctx, &key.namespace, uid, None).await?;
    }
    lock(&ctx.buffers.recent).remove(&key);
    Ok(())
}

/// Deletes the objects no plan wants: of a plan gone, of a change that is
/// not its plan's recorded pending one, of a plan no longer waiting with an
/// open request. Objects younger than `SWEEP_GRACE` are left to their
/// plan's reconcile.
pub async fn sweep(ctx: &Context) {
    let shell = &ctx.buffers;
    if shell.buffers.is_none() || !shell.ready.load(Ordering::SeqCst) {
        return;
    }
    let plans = ctx.stores.plans.state();
    let wanted: BTreeMap<&str, &str> = plans
        .iter()
        .filter_map(|p| {
            let s = p.status.as_ref()?;
            let r = s.capacity_request.as_ref()?;
            // Failed: the plan retries an apply that failed (its objects
            // exist only then), see `settle`.
            let open = matches!(
                r.state,
                CapacityRequestState::Requested
                    | CapacityRequestState::NotDelivered
                    | CapacityRequestState::Failed
            ) && s.phase == Phase::WaitingForCapacity;
            open.then_some((p.metadata.uid.as_deref()?, r.fingerprint.as_str()))
        })
        .collect();
    let now = Timestamp::now();
    let old = |meta: &kube::api::ObjectMeta| {
        meta.creation_timestamp.as_ref().is_none_or(|t| {
            Duration::try_from(now.duration_since(t.0)).unwrap_or_default() > SWEEP_GRACE
        })
    };
    let unwanted = |meta: &kube::api::ObjectMeta| {
        let fp = label(meta, LABEL_FINGERPRINT);
        match label(meta, LABEL_PLAN_UID).and_then(|u| wanted.get(u)) {
            Some(want) => fp != Some(&want[..want.len().min(63)]),
            None => true,
        }
    };
    let stale = |m: &&kube::api::ObjectMeta| old(m) && unwanted(m);
    let buffers: Vec<Arc<CapacityBuffer>> = shell.buffers.iter().flat_map(|s| s.state()).collect();
    let templates: Vec<Arc<PodTemplate>> = shell.templates.iter().flat_map(|s| s.state()).collect();
    let by_ns = by_namespace(
        buffers.iter().map(|b| &b.metadata).filter(stale),
        templates.iter().map(|t| &t.metadata).filter(stale),
    );
    for (ns, (buffers, templates)) in by_ns {
        warn!(namespace = %ns, buffers = ?buffers, templates = ?templates,
              "capacity request objects no plan wants; deleting them");
        if let Err(e) = delete_named(&ctx.client, &ctx.fence, &ns, &buffers, &templates).await {
            warn!(namespace = %ns, error = %e, "deleting capacity request objects");
        }
    }
    // Versions of templates gone are forgotten (bounded by what exists).
    let templates: BTreeSet<(String, String)> = shell
        .templates
        .iter()
        .flat_map(|s| s.state())
        .map(|t| (t.namespace().unwrap_or_default(), t.name_any()))
        .collect();
    lock(&shell.written).retain(|k, _| templates.contains(k));
    // Plans whose objects are gone no longer count against the cap.
    let open: BTreeSet<String> = shell
        .buffers
        .iter()
        .flat_map(|s| s.state())
        .filter_map(|b| label(&b.metadata, LABEL_PLAN_UID).map(str::to_string))
        .collect();
    let live: BTreeMap<PlanKey, Option<String>> = plans
        .iter()
        .map(|p| (p.key(), p.metadata.uid.clone()))
        .collect();
    lock(&shell.recent).retain(|k| {
        live.get(k)
            .and_then(|u| u.as_ref())
            .is_some_and(|u| open.contains(u) || wanted.contains_key(u.as_str()))
    });
}

/// The names of buffers and of templates, per namespace.
fn by_namespace<'m>(
    buffers: impl Iterator<Item = &'m kube::api::ObjectMeta>,
    templates: impl Iterator<Item = &'m kube::api::ObjectMeta>,
) -> BTreeMap<String, (Vec<String>, Vec<String>)> {
    let mut by_ns: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    let name = |m: &kube::api::ObjectMeta| m.name.clone().unwrap_or_default();
    for m in buffers {
        let ns = m.namespace.clone().unwrap_or_default();
        by_ns.entry(ns).or_default().0.push(name(m));
    }
    for m in templates {
        let ns = m.namespace.clone().unwrap_or_default();
        by_ns.entry(ns).or_default().1.push(name(m));
    }
    by_ns
}

/// `raygate release`: deletes every PodTemplate and CapacityBuffer raygate
/// made in `namespaces` (all when `None`); the CapacityBuffer API missing is
/// fine (nothing to delete). Their names, `ns/name`.
pub async fn release(
    client: &Client,
    namespace: Option<&str>,
    covers: impl Fn(&str) -> bool,
) -> Result<Vec<String>> {
    let fence = Fence::open();
    let lp = ListParams::default().labels(SELECTOR);
    let (b_api, t_api): (Api<CapacityBuffer>, Api<PodTemplate>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    // Not installed (404), or not granted (403: capacity requests were never
    // enabled, so raygate could not have made any): nothing to delete.
    let absent =
        |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 403);
    let buffers = match guarded(&fence, "listing CapacityBuffers", b_api.list_metadata(&lp)).await?
    {
        Ok(l) => l.items,
        Err(e) if absent(&e) => vec![],
        Err(e) => return Err(e.into()),
    };
    let templates = match guarded(&fence, "listing PodTemplates", t_api.list_metadata(&lp)).await? {
        Ok(l) => l.items,
        Err(e) if absent(&e) => vec![],
        Err(e) => return Err(e.into()),
    };
    let by_ns = by_namespace(
        buffers.iter().map(|b| &b.metadata),
        templates.iter().map(|t| &t.metadata),
    );
    let mut done = vec![];
    for (ns, (b, t)) in by_ns.into_iter().filter(|(ns, _)| covers(ns)) {
        delete_named(client, &fence, &ns, &b, &t).await?;
        done.extend(b.iter().map(|n| format!("{ns}/{n}")));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscale::buffer::{CapacityBufferSpec, LocalObjectRef};

    fn buffer(replicas: Option<i32>, template: &str, strategy: Option<&str>) -> CapacityBuffer {
        CapacityBuffer::new(
            "b",
            CapacityBufferSpec {
                provisioning_strategy: strategy.map(str::to_string),
                pod_template_ref: Some(LocalObjectRef {
                    name: template.to_string(),
                }),
                replicas,
            },
        )
    }

    /// A decision that takes a request slot, or not.
    fn decided(opens: bool) -> Decision {
        let mut d = crate::autoscale::report::tests::waiting();
        if opens {
            d.capacity_objects = Wanted::Open {
                fingerprint: "abc".into(),
                objects: vec![],
            };
        }
        d
    }

    /// Two plans decided at once, each on the plans open before either
    /// reserved: the first to reserve takes the last slot, the second is
    /// decided again on what is open now and reserves nothing.
    #[test]
    fn two_plans_decided_at_once_do_not_both_take_the_last_slot() {
        let shell = Shell::off(Defaults {
            enabled: true,
            max_open: 1,
            ..Defaults::default()
        });
        let key = |n: &str| PlanKey::new("ml", n);
        let seen = BTreeSet::new();
        let d = shell.reserve(key("a"), &[], &seen, decided(true), |_| {
            panic!("nothing moved: the decision stands")
        });
        assert!(d.capacity_objects.opens());
        let mut asked = None;
        let d = shell.reserve(key("b"), &[], &seen, decided(true), |open| {
            asked = Some(open);
            decided(false)
        });
        assert_eq!(asked, Some(BTreeSet::from([key("a")])));
        assert!(!d.capacity_objects.opens());
        assert_eq!(*lock(&shell.recent), BTreeSet::from([key("a")]));
        // A decision that takes no slot reserves nothing and is not redone.
        let d = shell.reserve(key("c"), &[], &seen, decided(false), |_| {
            panic!("not asked")
        });
        assert!(!d.capacity_objects.opens());
    }

    #[test]
    fn an_object_written_by_another_manager_is_not_only_ours() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let entry = |m: &str| ManagedFieldsEntry {
            manager: Some(m.to_string()),
            ..Default::default()
        };
        let meta = |m: Option<Vec<ManagedFieldsEntry>>| kube::api::ObjectMeta {
            managed_fields: m,
            ..Default::default()
        };
        assert!(only_ours(&meta(Some(vec![entry(gate::FIELD_MANAGER)]))));
        assert!(!only_ours(&meta(Some(vec![
            entry(gate::FIELD_MANAGER),
            entry("kubectl-edit")
        ]))));
        // Nothing recorded: not known to be ours, applied again.
        assert!(!only_ours(&meta(None)));
        assert!(!only_ours(&meta(Some(vec![]))));
    }

    #[test]
    fn a_buffer_edited_by_hand_is_not_intact() {
        let want = buffer(Some(1), "t", Some(autoscale::ACTIVE_CAPACITY));
        assert!(buffer_intact(&want.clone(), &want));
        // Scaled up by hand: the autoscaler would buy for five.
        assert!(!buffer_intact(
            &buffer(Some(5), "t", Some(autoscale::ACTIVE_CAPACITY)),
            &want
        ));
        assert!(!buffer_intact(
            &buffer(Some(1), "other", Some(autoscale::ACTIVE_CAPACITY)),
            &want
        ));
        assert!(!buffer_intact(&buffer(Some(1), "t", Some("x")), &want));
        // A field raygate does not set (the server's default) is not compared.
        let unset = buffer(Some(1), "t", None);
        assert!(buffer_intact(
            &buffer(Some(1), "t", Some(autoscale::ACTIVE_CAPACITY)),
            &unset
        ));
    }
}
