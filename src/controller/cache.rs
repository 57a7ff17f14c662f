//! Watches and caches: what raygate keeps in memory, and which changes wake
//! a plan up.
//!
//! Pods and Nodes are cluster-wide (free capacity is a cluster-wide fact) and
//! can be numerous, so the cache keeps a slim copy: requests, placement and
//! the few labels and conditions the decision reads. KubeRay rewrites
//! RayService and RayCluster status constantly; each watch passes on only the
//! changes the decision depends on, so status churn causes no reconcile storm.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::core::DeserializeGuard;

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use futures::stream::BoxStream;
use futures::{StreamExt, future};
use jiff::Timestamp;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, info, warn};

use super::latency::{Cause, CauseKind, Causes};
use crate::capacity::node::skip_reason;

use crate::capacity::dra::{DraKind, DraState};
use crate::capacity::record::PodPhase;
use crate::capacity::{CapacityIndex, PartialPod, PodBody};
use crate::kuberay::{LABEL_ORIGINATED_FROM_CR_NAME, RayCluster, RayService};

fn hash<T: Hash>(t: &T) -> u64 {
    let mut h = DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

pub use crate::capacity::slim::{slim_limit_range, slim_node};

/// Only the overhead is read (for pods not created yet).
pub fn slim_runtime_class(rc: &mut k8s_openapi::api::node::v1::RuntimeClass) {
    rc.metadata.managed_fields = None;
    rc.scheduling = None;
}

/// RayCluster specs are kept (the pending cluster's spec says what its pods
/// will be) within raygate's bounds ([`crate::kuberay::budget`]: one over
/// them keeps only the finding); managedFields are not needed.
pub fn slim_cluster(c: &mut DeserializeGuard<RayCluster>) {
    match &mut c.0 {
        Ok(c) => {
            c.metadata.managed_fields = None;
            if crate::kuberay::budget::prune(&mut c.spec, "spec") {
                give_back_memory();
            }
        }
        Err(e) => e.metadata.managed_fields = None,
    }
}

/// Reading an over-budget object from the watch costs tens of MB in small
/// allocations (85 MB for 5,000 groups, `cargo bench --bench object_memory`),
/// all freed once it is pruned; glibc keeps such freed pages, so the process
/// would stay that large after the object is gone. `malloc_trim` returns them.
/// Called only for objects over the bounds, so an ordinary event costs nothing.
///
/// One trim now is not enough: the RayService and RayCluster watches decode
/// such objects on different threads, and a deletion brings several events at
/// once (seen in CI under load: 113 MiB kept after deletion against 67-78 on
/// a quiet machine), so a trim can run while another decode still holds its
/// pages. [`LateTrim`] trims once more after the burst has been quiet.
fn give_back_memory() {
    trim();
    LATE_TRIM.schedule();
}

fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and only releases free memory; it
    // is thread-safe (it locks each arena).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How long a burst of over-budget objects must have been quiet before the
/// late trim.
const LATE_TRIM_QUIET: std::time::Duration = std::time::Duration::from_secs(2);

/// A trim that runs once a burst of over-budget reads has been quiet for
/// [`LATE_TRIM_QUIET`]: one task per burst however many objects it brings.
/// A process-wide fact (the allocator is one per process), so a static.
struct LateTrim {
    /// Bumped on every over-budget read; the task trims when it did not move
    /// during a whole quiet period.
    reads: std::sync::atomic::AtomicU64,
    scheduled: std::sync::atomic::AtomicBool,
}

static LATE_TRIM: LateTrim = LateTrim {
    reads: std::sync::atomic::AtomicU64::new(0),
    scheduled: std::sync::atomic::AtomicBool::new(false),
};

impl LateTrim {
    fn schedule(&'static self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.reads.fetch_add(1, SeqCst);
        // Outside a runtime (the CLI, benches) the trim above is all there is.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.scheduled.swap(true, SeqCst) {
            return;
        }
        rt.spawn(async move {
            loop {
                let mut seen = self.reads.load(SeqCst);
                loop {
                    tokio::time::sleep(LATE_TRIM_QUIET).await;
                    let now = self.reads.load(SeqCst);
                    if now == seen {
                        break;
                    }
                    seen = now;
                }
                trim();
                self.scheduled.store(false, SeqCst);
                // A read after the last check found the flag still set and
                // spawned nothing: go round again for it, unless a read since
                // the flag was cleared has already spawned its own task.
                if self.reads.load(SeqCst) == seen || self.scheduled.swap(true, SeqCst) {
                    break;
                }
            }
        });
    }
}

/// A RayService is kept with what raygate reads: its rayClusterConfig within
/// raygate's bounds ([`crate::kuberay::budget`]), not its Serve config (a
/// Serve-only change is KubeRay's to apply in place), and of its managedFields
/// only who owns the gate.
pub fn slim_service(s: &mut DeserializeGuard<RayService>) {
    match &mut s.0 {
        Ok(s) => {
            crate::upgradeplan::ownership::slim_managed_fields(&mut s.metadata.managed_fields);
            s.spec.serve_config_v2 = None;
            if let Some(c) = &mut s.spec.ray_cluster_config
                && crate::kuberay::budget::prune(c, "spec.rayClusterConfig")
            {
                give_back_memory();
            }
        }
        Err(e) => {
            crate::upgradeplan::ownership::slim_managed_fields(&mut e.metadata.managed_fields)
        }
    }
}

/// RayServices keep managedFields: they tell who owns the gate field.
pub fn service_changes(g: &DeserializeGuard<RayService>) -> Option<u64> {
    Some(match &g.0 {
        Err(e) => hash(&("invalid", &e.error, e.metadata.generation)),
        Ok(s) => {
            let status = s.status.as_ref();
            let names = status.map(|st| {
                let name = |x: &Option<crate::kuberay::RayServiceStatus>| {
                    x.as_ref().and_then(|x| x.ray_cluster_name.clone())
                };
                (
                    name(&st.active_service_status),
                    name(&st.pending_service_status),
                )
            });
            let apps: BTreeMap<String, Option<String>> = status
                .and_then(|st| st.pending_service_status.as_ref())
                .and_then(|p| p.application_statuses.as_ref())
                .map(|a| {
                    a.iter()
                        .map(|(k, v)| (k.clone(), v.status.clone()))
                        .collect()
                })
                .unwrap_or_default();
            let gate_owners: Vec<Option<String>> = s
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .map(|m| m.manager.clone())
                .collect();
            hash(&(
                s.metadata.generation,
                s.metadata.deletion_timestamp.is_some(),
                names,
                apps,
                gate_owners,
            ))
        }
    })
}

pub fn cluster_changes(g: &DeserializeGuard<RayCluster>) -> Option<u64> {
    Some(match &g.0 {
        Err(e) => hash(&("invalid", &e.error)),
        Ok(c) => hash(&(
            c.metadata.generation,
            c.metadata.deletion_timestamp.is_some(),
            c.status.as_ref().and_then(|s| s.state.clone()),
        )),
    })
}

/// Nodes wake waiting plans when their capacity or schedulability changes.
pub fn node_changes(n: &Node) -> Option<u64> {
    let spec = n.spec.as_ref();
    let status = n.status.as_ref();
    let alloc: Option<BTreeMap<String, String>> = status
        .and_then(|s| s.allocatable.as_ref())
        .map(|a| a.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect());
    let ready: Option<String> = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone());
    let taints: Vec<(String, Option<String>, String)> = spec
        .and_then(|s| s.taints.as_ref())
        .map(|ts| {
            ts.iter()
                .map(|t| (t.key.clone(), t.value.clone(), t.effect.clone()))
                .collect()
        })
        .unwrap_or_default();
    Some(hash(&(
        alloc,
        ready,
        taints,
        spec.and_then(|s| s.unschedulable),
        n.metadata.labels.clone(),
    )))
}

/// The capacity index, shared by its two watchers (writers) and the
/// reconciles (readers). A std lock: it is never held across an await.
pub type SharedIndex = Arc<RwLock<CapacityIndex>>;

/// Reads the index; a poisoned lock (a writer panicked) is an error, not a
/// panic in every reconcile after it.
pub fn read_index(index: &SharedIndex) -> crate::Result<RwLockReadGuard<'_, CapacityIndex>> {
    index
        .read()
        .map_err(|_| crate::Error::invalid("capacity index", "poisoned by a panic"))
}

/// What wakes a Ray pod's plan: bound, phase, scheduling conditions, deletion.
fn wake_key(b: &PodBody) -> (Option<&str>, PodPhase, Vec<(bool, &str)>, bool) {
    let conds = b
        .ray
        .as_ref()
        .map(|r| r.conditions.iter().map(|c| (c.ready, &*c.status)).collect())
        .unwrap_or_default();
    (b.node.as_deref(), b.phase, conds, b.deleting)
}

/// Whether a pod event should wake the plan of the pod's cluster.
fn pod_wakes(old: Option<&PodBody>, new: Option<&PodBody>) -> Option<(String, String)> {
    let b = new.or(old)?;
    let cluster = b.cluster()?.to_string();
    let changed = match (old, new) {
        (Some(o), Some(n)) => wake_key(o) != wake_key(n),
        _ => true,
    };
    changed.then_some((String::new(), cluster))
}

/// Both watchers have listed once.
#[derive(Clone)]
pub struct IndexReady(tokio::sync::watch::Receiver<u8>);

impl IndexReady {
    pub async fn wait(mut self) -> bool {
        self.0.wait_for(|n| *n >= 2).await.is_ok()
    }
}

/// Starts the pod and node watchers that keep the capacity index: pods as
/// [`PartialPod`]s, so only what the capacity model reads is parsed. Ray pod
/// changes wake their plan through `wake` (namespace, cluster); node
/// changes that matter ([`node_changes`]) wake every plan (`wake_all`).
///
/// Events that can let a held upgrade through (a node turning usable, a pod
/// gone from a node) are noted in `causes` with the time they arrived.
pub fn spawn_capacity_index(
    client: kube::Client,
    dra_plain_count: &[String],
    lists: super::lists::InitialLists,
    causes: Arc<Causes>,
    wake: impl Fn(&str, &str) + Send + 'static,
    wake_all: impl Fn() + Send + Sync + 'static,
) -> (SharedIndex, IndexReady) {
    let mut fresh = CapacityIndex::new();
    fresh.set_dra_plain_count(dra_plain_count.iter().cloned());
    let index: SharedIndex = Arc::new(RwLock::new(fresh));
    let wake_all: Arc<dyn Fn() + Send + Sync> = Arc::new(wake_all);
    spawn_dra::<ResourceSlice>(&client, &index, &wake_all, lists, DraKind::Slice);
    spawn_dra::<DeviceClass>(&client, &index, &wake_all, lists, DraKind::Class);
    spawn_dra::<ResourceClaim>(&client, &index, &wake_all, lists, DraKind::Claim);
    spawn_dra::<ResourceClaimTemplate>(&client, &index, &wake_all, lists, DraKind::Template);
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(0u8);
    let ready_tx = Arc::new(ready_tx);

    let pods = watcher(
        Api::<PartialPod>::all(client.clone()),
        lists
            .config()
            .fields("status.phase!=Succeeded,status.phase!=Failed"),
    )
    .default_backoff();
    let (idx, ready, noted) = (index.clone(), ready_tx.clone(), causes.clone());
    let mut listed = false;
    tokio::spawn(pods.for_each(move |ev| {
        let woken = match ev {
            Ok(ev) => match idx.write() {
                Ok(mut i) => pod_event(&mut i, ev, &ready, &mut listed, &noted),
                Err(_) => None,
            },
            Err(e) => {
                warn!(kind = "Pod", error = %e, "watch error");
                None
            }
        };
        if let Some((ns, cluster)) = woken {
            wake(&ns, &cluster);
        }
        future::ready(())
    }));

    let nodes = watcher(Api::<Node>::all(client), lists.config()).default_backoff();
    let (idx, ready) = (index.clone(), ready_tx);
    let mut seen: HashMap<String, Option<u64>> = HashMap::new();
    let mut listed = false;
    tokio::spawn(nodes.for_each(move |ev| {
        let wakes = match ev {
            Ok(ev) => match idx.write() {
                Ok(mut i) => node_event(&mut i, ev, &ready, &mut seen, &mut listed, &causes),
                Err(_) => false,
            },
            Err(e) => {
                warn!(kind = "Node", error = %e, "watch error");
                false
            }
        };
        if wakes {
            wake_all();
        }
        future::ready(())
    }));
    (index, IndexReady(ready_rx))
}

/// A resource.k8s.io/v1 kind the capacity index keeps (slim, see
/// [`crate::capacity::dra`]).
trait DraObject:
    kube::Resource<DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + 'static
{
    fn apply(&self, d: &mut DraState) -> bool;
}

/// Each kind's patch of the DRA state, one line each.
macro_rules! dra_objects {
    ($($kind:ty => $apply:ident),* $(,)?) => {
        $(impl DraObject for $kind {
            fn apply(&self, d: &mut DraState) -> bool {
                d.$apply(self)
            }
        })*
    };
}

dra_objects!(
    ResourceSlice => apply_slice,
    DeviceClass => apply_class,
    ResourceClaim => apply_claim,
    ResourceClaimTemplate => apply_template,
);

/// Watches one DRA kind cluster-wide into the index; a change wakes every plan, as a
/// node's does. On a cluster without resource.k8s.io/v1 the watch only logs and retries
/// with backoff.
fn spawn_dra<K: DraObject>(
    client: &kube::Client,
    index: &SharedIndex,
    wake_all: &Arc<dyn Fn() + Send + Sync>,
    lists: super::lists::InitialLists,
    kind: DraKind,
) {
    let w = watcher(Api::<K>::all(client.clone()), lists.config()).default_backoff();
    let (idx, wake_all) = (index.clone(), wake_all.clone());
    // Keys listed since the relist began: the objects not among them are gone.
    let mut seen: Option<BTreeSet<String>> = None;
    tokio::spawn(w.for_each(move |ev| {
        let changed = match ev {
            Ok(ev) => match idx.write() {
                Ok(mut i) => dra_event(&mut i, ev, kind, &mut seen),
                Err(_) => false,
            },
            Err(e) => {
                warn!(kind = ?kind, error = %e, "watch error");
                false
            }
        };
        if changed {
            wake_all();
        }
        future::ready(())
    }));
}

fn dra_key<K: kube::Resource>(o: &K) -> String {
    crate::capacity::dra::key(o.meta().namespace.as_deref(), o.meta().name.as_deref())
}

fn dra_event<K: DraObject>(
    index: &mut CapacityIndex,
    ev: watcher::Event<K>,
    kind: DraKind,
    seen: &mut Option<BTreeSet<String>>,
) -> bool {
    match ev {
        watcher::Event::Init => {
            *seen = Some(BTreeSet::new());
            false
        }
        watcher::Event::InitDone => match seen.take() {
            Some(keys) => index.update_dra(|d| d.retain(kind, &keys)),
            None => false,
        },
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
            if let Some(keys) = seen.as_mut() {
                keys.insert(dra_key(&o));
            }
            index.update_dra(|d| o.apply(d))
        }
        watcher::Event::Delete(o) => {
            let k = dra_key(&o);
            index.update_dra(|d| match kind {
                DraKind::Slice => d.delete_slice(&k),
                DraKind::Class => d.delete_class(&k),
                DraKind::Claim | DraKind::Template => {
                    let (ns, name) = k.split_once('/').unwrap_or(("", &k));
                    if kind == DraKind::Claim {
                        d.delete_claim(ns, name)
                    } else {
                        d.delete_template(ns, name)
                    }
                }
            })
        }
    }
}

/// A watch's first full list counts once towards the index being ready
/// (a relist after a watch error does not count again).
fn listed_once(listed: &mut bool, ready: &tokio::sync::watch::Sender<u8>) {
    if !std::mem::replace(listed, true) {
        ready.send_modify(|n| *n += 1);
    }
}

fn pod_event(
    index: &mut CapacityIndex,
    ev: watcher::Event<PartialPod>,
    ready: &tokio::sync::watch::Sender<u8>,
    listed: &mut bool,
    causes: &Causes,
) -> Option<(String, String)> {
    match ev {
        watcher::Event::Init => {
            index.begin_pod_relist();
            None
        }
        watcher::Event::InitDone => {
            index.end_pod_relist();
            listed_once(listed, ready);
            None
        }
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
            let rec = index.record(&p);
            let ns = rec.key.0.to_string();
            let new = rec.body.clone();
            let old = index.apply_pod(rec);
            pod_wakes(old.as_ref(), Some(&new)).map(|(_, c)| (ns, c))
        }
        watcher::Event::Delete(p) => {
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let name = p.metadata.name.clone().unwrap_or_default();
            let old = index.delete_pod(&ns, &name);
            if let Some(b) = old.as_ref().filter(|b| b.holds().is_some()) {
                // Its request goes back to its node (a pod that finished
                // arrives here too: the watch leaves out terminal pods).
                let object = format!("pod/{ns}/{name}");
                debug!(stage = "event received", cause = "pod", object = %object, "pod gone from its node");
                causes.note(Cause {
                    kind: CauseKind::Pod,
                    object,
                    at: Timestamp::now(),
                    resources: b
                        .requests
                        .as_ref()
                        .map(|u| u.iter().map(|(r, _)| r.as_str().to_string()).collect())
                        .unwrap_or_default(),
                    plan: None,
                });
            }
            pod_wakes(old.as_ref(), None).map(|(_, c)| (ns, c))
        }
    }
}

fn node_event(
    index: &mut CapacityIndex,
    ev: watcher::Event<Node>,
    ready: &tokio::sync::watch::Sender<u8>,
    seen: &mut HashMap<String, Option<u64>>,
    listed: &mut bool,
    causes: &Causes,
) -> bool {
    match ev {
        watcher::Event::Init => {
            index.begin_node_relist();
            false
        }
        watcher::Event::InitDone => {
            index.end_node_relist();
            listed_once(listed, ready);
            true
        }
        watcher::Event::Apply(mut n) | watcher::Event::InitApply(mut n) => {
            slim_node(&mut n);
            let key = node_changes(&n);
            let name = n.metadata.name.clone().unwrap_or_default();
            let changed = seen.insert(name.clone(), key) != Some(key);
            // After the first list, a change that leaves the node usable can
            // let an upgrade through (Ready, uncordoned, more capacity).
            if changed && *listed && skip_reason(&n).is_none() {
                let object = format!("node/{name}");
                info!(stage = "event received", cause = "node", object = %object, "node usable");
                causes.note(Cause {
                    kind: CauseKind::Node,
                    object,
                    at: Timestamp::now(),
                    resources: n
                        .status
                        .as_ref()
                        .and_then(|s| s.allocatable.as_ref())
                        .map(|a| a.keys().cloned().collect())
                        .unwrap_or_default(),
                    plan: None,
                });
            }
            index.apply_node(n);
            changed
        }
        watcher::Event::Delete(n) => {
            let name = n.metadata.name.clone().unwrap_or_default();
            seen.remove(&name);
            index.delete_node(&name);
            true
        }
    }
}

/// A namespaced kind raygate watches (every bound a watcher and its store need).
pub trait Watched:
    kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType: Default>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType: Default>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static
{
}

/// A watch of one kind in raygate's scope, with backoff: cluster-wide when
/// `namespaces` is empty, else one watcher per namespace, merged
/// ([`merge_namespaces`]), so that a namespaced install needs only Roles in
/// those namespaces to read them.
pub fn scoped_watcher<K>(
    client: &kube::Client,
    namespaces: &[String],
    wc: watcher::Config,
) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
where
    K: Watched,
{
    slimmed_watcher(client, namespaces, wc, |_| {})
}

/// [`scoped_watcher`] with `slim` applied to each object as it arrives, before
/// [`merge_namespaces`] keeps a copy: what is dropped is never held.
pub fn slimmed_watcher<K>(
    client: &kube::Client,
    namespaces: &[String],
    wc: watcher::Config,
    slim: fn(&mut K),
) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
where
    K: Watched,
{
    let watch =
        |api: Api<K>, wc: watcher::Config| watcher(api, wc).default_backoff().modify(slim).boxed();
    match namespaces {
        [] => watch(Api::<K>::all(client.clone()), wc),
        [one] => watch(Api::<K>::namespaced(client.clone(), one), wc),
        many => merge_namespaces(
            many.iter()
                .map(|ns| watch(Api::<K>::namespaced(client.clone(), ns), wc.clone()))
                .collect(),
        ),
    }
}

/// Merges the watch streams of several namespaces into one stream with the
/// semantics of a single watcher, so one reflector store can keep it.
///
/// A store treats `Init` .. `InitDone` as "replace everything": passing each
/// namespace's relist through would drop the other namespaces' objects. So:
/// one `Init` first, every namespace's first list (and any change meanwhile)
/// held back and given as `InitApply`s, one `InitDone` once all have listed;
/// after that, a namespace that relists (e.g. after 410 Gone) gives `Apply`
/// for what it lists and `Delete` for what it knew and no longer lists. The
/// last-seen object of each key is kept for those deletions: plans,
/// RayServices and RayClusters are few, unlike pods.
pub fn merge_namespaces<K>(
    streams: Vec<BoxStream<'static, watcher::Result<watcher::Event<K>>>>,
) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
where
    K: kube::Resource + Clone + Send + 'static,
{
    let merge = Merge::new(streams.len());
    let tagged = futures::stream::select_all(
        streams
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.map(move |ev| (i, ev)).boxed()),
    );
    futures::stream::once(future::ready(Ok(watcher::Event::Init)))
        .chain(
            tagged
                .scan(merge, |m, (i, ev)| future::ready(Some(m.step(i, ev))))
                .flat_map(futures::stream::iter),
        )
        .boxed()
}

/// State of [`merge_namespaces`]: per namespace, the objects it last listed
/// or changed (by name), and the names seen by a relist in progress.
struct Merge<K> {
    known: Vec<BTreeMap<String, K>>,
    relisting: Vec<Option<std::collections::BTreeSet<String>>>,
    listed: Vec<bool>,
    synced: bool,
}

impl<K: kube::Resource + Clone> Merge<K> {
    fn new(n: usize) -> Merge<K> {
        Merge {
            known: vec![BTreeMap::new(); n],
            relisting: vec![None; n],
            listed: vec![false; n],
            synced: false,
        }
    }

    fn step(
        &mut self,
        i: usize,
        ev: watcher::Result<watcher::Event<K>>,
    ) -> Vec<watcher::Result<watcher::Event<K>>> {
        use watcher::Event;
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => return vec![Err(e)],
        };
        let name = |o: &K| o.meta().name.clone().unwrap_or_default();
        if !self.synced {
            match ev {
                Event::Init => self.known[i].clear(),
                Event::InitApply(o) | Event::Apply(o) => {
                    self.known[i].insert(name(&o), o);
                }
                Event::Delete(o) => {
                    self.known[i].remove(&name(&o));
                }
                Event::InitDone => self.listed[i] = true,
            }
            if !self.listed.iter().all(|l| *l) {
                return vec![];
            }
            self.synced = true;
            let mut out: Vec<_> = self
                .known
                .iter()
                .flat_map(|m| m.values().cloned())
                .map(|o| Ok(Event::InitApply(o)))
                .collect();
            out.push(Ok(Event::InitDone));
            return out;
        }
        match ev {
            Event::Init => {
                self.relisting[i] = Some(Default::default());
                vec![]
            }
            Event::InitApply(o) | Event::Apply(o) => {
                let n = name(&o);
                if let Some(seen) = self.relisting[i].as_mut() {
                    seen.insert(n.clone());
                }
                self.known[i].insert(n, o.clone());
                vec![Ok(Event::Apply(o))]
            }
            Event::Delete(o) => {
                self.known[i].remove(&name(&o));
                vec![Ok(Event::Delete(o))]
            }
            Event::InitDone => {
                let Some(seen) = self.relisting[i].take() else {
                    return vec![];
                };
                let gone: Vec<String> = self.known[i]
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                gone.iter()
                    .filter_map(|k| self.known[i].remove(k))
                    .map(|o| Ok(Event::Delete(o)))
                    .collect()
            }
        }
    }
}

/// The metadata of a cached object, read or not: an object that did not
/// deserialise still has a name, labels and managed fields to act on.
pub fn guard_meta<K: kube::Resource>(g: &DeserializeGuard<K>) -> &kube::api::ObjectMeta {
    match &g.0 {
        Ok(k) => k.meta(),
        Err(e) => &e.metadata,
    }
}

/// The RayService a RayCluster belongs to (KubeRay's origin label).
pub fn cluster_service(c: &DeserializeGuard<RayCluster>) -> Option<(String, String)> {
    let meta = guard_meta(c);
    let svc = meta
        .labels
        .as_ref()?
        .get(LABEL_ORIGINATED_FROM_CR_NAME)?
        .clone();
    Some((meta.namespace.clone()?, svc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(ns: &str, name: &str, v: &str) -> k8s_openapi::api::core::v1::ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns},
            "data": {"v": v}}))
        .unwrap()
    }

    /// What a store holds: (namespace/name, data.v), sorted.
    fn held(
        store: &kube::runtime::reflector::Store<k8s_openapi::api::core::v1::ConfigMap>,
    ) -> Vec<String> {
        let mut v: Vec<String> = store
            .state()
            .iter()
            .map(|c| {
                format!(
                    "{}/{}={}",
                    c.metadata.namespace.as_deref().unwrap_or(""),
                    c.metadata.name.as_deref().unwrap_or(""),
                    c.data
                        .as_ref()
                        .and_then(|d| d.get("v"))
                        .map_or("", |s| s.as_str())
                )
            })
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn namespaces_merge_into_one_store_and_a_relist_drops_only_its_own_deletions() {
        use futures::channel::mpsc::unbounded;
        use kube::runtime::reflector;
        use watcher::Event::*;
        let (a_tx, a_rx) = unbounded();
        let (b_tx, b_rx) = unbounded();
        let (store, writer) = reflector::store();
        let mut merged = merge_namespaces(vec![a_rx.boxed(), b_rx.boxed()]).reflect(writer);
        let mut next = async || merged.next().await.unwrap().unwrap();

        assert!(matches!(next().await, Init));
        a_tx.unbounded_send(Ok(Init)).unwrap();
        a_tx.unbounded_send(Ok(InitApply(cm("a", "x", "1"))))
            .unwrap();
        a_tx.unbounded_send(Ok(InitDone)).unwrap();
        // a listed; a change in a while b still lists is held back too.
        a_tx.unbounded_send(Ok(Apply(cm("a", "x", "2")))).unwrap();
        b_tx.unbounded_send(Ok(Init)).unwrap();
        b_tx.unbounded_send(Ok(InitApply(cm("b", "y", "1"))))
            .unwrap();
        b_tx.unbounded_send(Ok(InitApply(cm("b", "z", "1"))))
            .unwrap();
        b_tx.unbounded_send(Ok(InitDone)).unwrap();
        let mut seen = vec![];
        loop {
            let ev = next().await;
            let done = matches!(ev, InitDone);
            seen.push(ev);
            if done {
                break;
            }
        }
        assert_eq!(seen.len(), 4, "three InitApply then InitDone: {seen:?}");
        assert!(store.wait_until_ready().await.is_ok());
        assert_eq!(held(&store), ["a/x=2", "b/y=1", "b/z=1"]);

        // b relists (after a 410 Gone): z is gone, y changed; a keeps its objects.
        b_tx.unbounded_send(Ok(Init)).unwrap();
        b_tx.unbounded_send(Ok(InitApply(cm("b", "y", "3"))))
            .unwrap();
        b_tx.unbounded_send(Ok(InitDone)).unwrap();
        assert!(matches!(next().await, Apply(_)));
        assert!(matches!(next().await, Delete(o) if o.metadata.name.as_deref() == Some("z")));
        assert_eq!(held(&store), ["a/x=2", "b/y=3"]);

        // Ordinary changes pass through.
        a_tx.unbounded_send(Ok(Delete(cm("a", "x", "2")))).unwrap();
        assert!(matches!(next().await, Delete(_)));
        assert_eq!(held(&store), ["b/y=3"]);
    }

    #[test]
    fn node_heartbeats_do_not_trigger() {
        let mk = |beat: &str| -> Node {
            serde_json::from_value(json!({
                "metadata": {"name": "n", "resourceVersion": beat},
                "status": {"allocatable": {"nvidia.com/gpu": "8"},
                    "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": beat}]}
            }))
            .unwrap()
        };
        let (mut a, mut b) = (mk("2026-12-02T10:00:00Z"), mk("2026-12-02T10:00:10Z"));
        slim_node(&mut a);
        slim_node(&mut b);
        assert_eq!(node_changes(&a), node_changes(&b));
        // Nor do they change the capacity index (no new generation).
        let mut index = CapacityIndex::new();
        index.apply_node(a.clone());
        let g = index.generation();
        index.apply_node(b);
        assert_eq!(index.generation(), g);
        let mut c = mk("2026-12-02T10:00:10Z");
        c.status
            .as_mut()
            .unwrap()
            .allocatable
            .as_mut()
            .unwrap()
            .insert(
                "nvidia.com/gpu".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("16".into()),
            );
        assert_ne!(node_changes(&a), node_changes(&c));
    }

    #[test]
    fn service_status_churn_is_filtered() {
        let mk = |extra: serde_json::Value| -> DeserializeGuard<RayService> {
            serde_json::from_value(json!({
                "apiVersion": "ray.io/v1", "kind": "RayService",
                "metadata": {"name": "s", "namespace": "ml", "generation": 3},
                "spec": {"rayClusterConfig": {}},
                "status": {"activeServiceStatus": {"rayClusterName": "s-abc", "rayClusterStatus": extra}}
            }))
            .unwrap()
        };
        let a = mk(json!({"lastUpdateTime": "2026-12-02T10:00:00Z"}));
        let b = mk(json!({"lastUpdateTime": "2026-12-02T10:00:05Z"}));
        assert_eq!(service_changes(&a), service_changes(&b));
    }
}
