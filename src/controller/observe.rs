//! Turning the caches into the decision's inputs for one plan.
//!
//! This is where raygate looks at the world: which RayService a plan points
//! to, which clusters and pods it has, what change is pending, which
//! reservations other plans hold ([`World`]). The decision itself, the fit
//! included, stays in [`crate::admission`].

use std::cell::OnceCell;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::LimitRange;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::ResourceExt;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{ObjectRef, Store};

use super::latency::plan_key;
use crate::admission::fit::{OnIndex, Placement, PlanKey};
use crate::admission::ledger::{self, Candidate};
use crate::admission::objects::{
    self, ClusterObject, incremental_of, new_cluster_pods, status_cluster, surge_of,
};
use crate::admission::observed::{DynPod, PodRef};
use crate::admission::pass::Pass;
use crate::admission::surge;
use crate::admission::{Cluster, Inputs, ServiceError, Settings};
use crate::capacity::{ClusterState, PodGroup, PodRecord};
use crate::kuberay::{
    self, ANNOTATION_KUBERAY_VERSION, KubeRayVersion, RayCluster, RayService, Release, Releases,
};
use crate::upgradeplan::{Admission, UpgradePlan};

/// Everything the caches hold.
#[derive(Clone)]
pub struct Stores {
    pub plans: Store<UpgradePlan>,
    pub services: Store<DeserializeGuard<RayService>>,
    pub clusters: Store<DeserializeGuard<RayCluster>>,
    /// Nodes and pods, aggregated per node (see [`crate::capacity::index`]).
    pub capacity: super::cache::SharedIndex,
    /// The last admission pass (see `World::pass`).
    pub pass: PassCache,
    pub limit_ranges: Store<LimitRange>,
    pub runtime_classes: Store<RuntimeClass>,
}

/// Admissions written but maybe not yet seen in the plan cache; the ledger
/// must count them or a quick second decision could double-book capacity.
pub type Overlay = HashMap<(String, String), Admission>;

fn service(
    stores: &Stores,
    ns: &str,
    name: &str,
) -> Result<Arc<DeserializeGuard<RayService>>, ServiceError> {
    stores
        .services
        .get(&ObjectRef::new(name).within(ns))
        .ok_or_else(|| ServiceError::NotFound {
            namespace: ns.to_string(),
            name: name.to_string(),
        })
}

/// The RayClusters KubeRay created for `svc` ([`objects::is_cluster_of`]).
fn clusters_of(stores: &Stores, svc: &RayService) -> Vec<Arc<DeserializeGuard<RayCluster>>> {
    stores
        .clusters
        .state()
        .into_iter()
        .filter(|c| {
            let meta = match &c.0 {
                Ok(c) => &c.metadata,
                Err(e) => &e.metadata,
            };
            objects::is_cluster_of(meta, svc)
        })
        .collect()
}

fn guard_name<K: kube::Resource>(g: &DeserializeGuard<K>) -> String {
    match &g.0 {
        Ok(k) => k.meta().name.clone().unwrap_or_default(),
        Err(e) => e.metadata.name.clone().unwrap_or_default(),
    }
}

fn pods_by_cluster(
    stores: &Stores,
    ns: &str,
    names: &BTreeSet<String>,
) -> BTreeMap<String, Vec<PodRef>> {
    let mut out: BTreeMap<String, Vec<PodRef>> = BTreeMap::new();
    let Ok(index) = super::cache::read_index(&stores.capacity) else {
        return out;
    };
    for c in names {
        let pods: Vec<PodRef> = index
            .cluster_pods(ns, c)
            .into_iter()
            .map(|(key, body)| -> PodRef {
                Arc::new(PodRecord {
                    key,
                    body: body.clone(),
                })
            })
            .collect();
        if !pods.is_empty() {
            out.insert(c.clone(), pods);
        }
    }
    out
}

/// The pods a waiting plan needs to fit: its surge when incremental, else
/// the whole new cluster.
fn pods_to_fit(
    stores: &Stores,
    plan: &UpgradePlan,
    svc: &RayService,
    release: &Release,
    limit_ranges: &[LimitRange],
) -> crate::Result<Vec<PodGroup>> {
    let full = new_cluster_pods(svc, release.version)?;
    let Some(opts) = incremental_of(plan, svc, release) else {
        return Ok(full);
    };
    let opts = opts.map_err(|p| crate::Error::invalid("RayService", p.to_string()))?;
    let active = active_pods(stores, svc);
    let refs: Vec<&DynPod> = active.iter().map(|p| p.as_ref()).collect();
    Ok(surge_of(svc, &full, &refs, &opts, release.version, limit_ranges)?.pods)
}

/// The pods of the RayService's active cluster.
fn active_pods(stores: &Stores, svc: &RayService) -> Vec<PodRef> {
    let ns = svc.namespace().unwrap_or_default();
    let Some(active) = status_cluster(
        svc.status
            .as_ref()
            .and_then(|s| s.active_service_status.as_ref()),
    ) else {
        return vec![];
    };
    pods_by_cluster(stores, &ns, &BTreeSet::from([active.clone()]))
        .remove(&active)
        .unwrap_or_default()
}

/// The KubeRay releases the watched RayClusters are stamped with
/// (`ray.io/kuberay-version`); `flag` is `--kuberay-version`.
pub fn releases(stores: &Stores, flag: Option<KubeRayVersion>) -> Releases {
    let clusters = stores.clusters.state();
    let stamps = clusters.iter().filter_map(|c| {
        let meta = match &c.0 {
            Ok(c) => &c.metadata,
            Err(e) => &e.metadata,
        };
        let stamp = meta.annotations.as_ref()?.get(ANNOTATION_KUBERAY_VERSION)?;
        Some((meta.namespace.as_deref()?, stamp.as_str()))
    });
    Releases::from_stamps(stamps, flag)
}

/// The inputs of one decision for `plan`, read from the caches; `cluster`
/// answers the capacity questions if the decision asks them. `release` is
/// the KubeRay release of the plan's namespace (see [`releases`]).
pub fn observe<'a>(
    stores: &Stores,
    plan: &'a UpgradePlan,
    release: &Release,
    now: Timestamp,
    admission_unseen: bool,
    cluster: &'a dyn Cluster,
) -> Inputs<'a> {
    let ns = plan.namespace().unwrap_or_default();
    let svc_name = &plan.spec.ray_service_ref.name;
    let decide_on = |service, clusters: &[ClusterObject<'_>], pods| {
        objects::inputs(
            plan,
            release,
            now,
            admission_unseen,
            cluster,
            service,
            clusters,
            pods,
        )
    };
    let guard = match service(stores, &ns, svc_name) {
        Ok(g) => g,
        Err(e) => return decide_on(Err(e), &[], BTreeMap::new()),
    };
    let svc = match &guard.0 {
        Ok(s) => s,
        Err(e) => {
            let e = ServiceError::Unreadable {
                namespace: ns.clone(),
                name: svc_name.clone(),
                error: e.error.to_string(),
            };
            return decide_on(Err(e), &[], BTreeMap::new());
        }
    };
    let clusters = clusters_of(stores, svc);
    let objects: Vec<ClusterObject<'_>> = clusters
        .iter()
        .map(|c| ClusterObject {
            name: guard_name(c),
            cluster: c.0.as_ref().map_err(|e| e.error.to_string()),
        })
        .collect();
    let names: BTreeSet<String> = objects.iter().map(|c| c.name.clone()).collect();
    let pods = pods_by_cluster(stores, &ns, &names);
    decide_on(Ok(svc), &objects, pods)
}

/// The current admission of a plan: its status, or a just-written one.
fn admission_of(plan: &UpgradePlan, overlay: &Overlay) -> Option<Admission> {
    let key = plan_key(plan);
    plan.status
        .as_ref()
        .and_then(|s| s.admitted.clone())
        .or_else(|| overlay.get(&key).cloned())
}

/// Unbound pods of every admitted upgrade but `except`'s.
fn ledger_pods(
    stores: &Stores,
    except: Option<&PlanKey>,
    overlay: &Overlay,
    releases: &Releases,
) -> Vec<PodGroup> {
    let mut out = vec![];
    for p in stores.plans.state() {
        if except.is_some_and(|k| *k == plan_key(&p)) {
            continue;
        }
        let Some(adm) = admission_of(&p, overlay) else {
            continue;
        };
        let ns = p.namespace().unwrap_or_default();
        let Ok(guard) = service(stores, &ns, &p.spec.ray_service_ref.name) else {
            continue;
        };
        let Ok(svc) = &guard.0 else { continue };
        let version = releases.for_namespace(&ns).version;
        let pending = status_cluster(
            svc.status
                .as_ref()
                .and_then(|s| s.pending_service_status.as_ref()),
        )
        .or(adm.to_cluster.clone());
        let clusters = clusters_of(stores, svc);
        let pending_cluster = pending
            .as_ref()
            .and_then(|n| clusters.iter().find(|c| &guard_name(c) == n))
            .and_then(|c| c.0.as_ref().ok());
        let planned = match pending_cluster {
            Some(c) => kuberay::planned_groups(&c.name_any(), &ns, &c.spec, version),
            None => new_cluster_pods(svc, version),
        };
        let Ok(planned) = planned else { continue };
        let existing: Vec<PodRef> = match &pending {
            Some(n) => pods_by_cluster(stores, &ns, &BTreeSet::from([n.clone()]))
                .remove(n)
                .unwrap_or_default(),
            None => vec![],
        };
        let refs: Vec<&DynPod> = existing.iter().map(|p| p.as_ref()).collect();
        if !adm.surge.is_empty() {
            // An incremental transition holds its surge budget to the end.
            let Ok(full) = new_cluster_pods(svc, version) else {
                continue;
            };
            let active: Vec<PodRef> = match &adm.from_cluster {
                Some(a) => pods_by_cluster(stores, &ns, &BTreeSet::from([a.clone()]))
                    .remove(a)
                    .unwrap_or_default(),
                None => vec![],
            };
            let active: Vec<&DynPod> = active.iter().map(|p| p.as_ref()).collect();
            out.extend(surge::held(
                &full,
                &adm.surge,
                &surge::bound_by_group(&active),
                &surge::bound_by_group(&refs),
            ));
            continue;
        }
        out.extend(ledger::unbound(&planned, &refs));
    }
    out
}

/// Plans waiting for capacity but `except`, with the pods of their new
/// cluster. A plan whose spec does not parse is left out: its own decision
/// is an error, never an admission. A plan admitted in a write the cache
/// has not shown yet is in the ledger already; counted here too, its pods
/// would be reserved twice and hold back the plans behind it.
fn waiting_plans(
    stores: &Stores,
    except: Option<&PlanKey>,
    overlay: &Overlay,
    releases: &Releases,
    now: Timestamp,
) -> Vec<Candidate> {
    let mut q = vec![];
    for p in stores.plans.state() {
        if except.is_some_and(|k| *k == plan_key(&p)) {
            continue;
        }
        let Some(status) = p.status.as_ref() else {
            continue;
        };
        if !status.queued_for_capacity() || admission_of(&p, overlay).is_some() {
            continue;
        }
        let Ok(settings) = Settings::of(&p) else {
            continue;
        };
        let ns = p.namespace().unwrap_or_default();
        let Ok(guard) = service(stores, &ns, &p.spec.ray_service_ref.name) else {
            continue;
        };
        let Ok(svc) = &guard.0 else { continue };
        let limit_ranges: Vec<LimitRange> = stores
            .limit_ranges
            .state()
            .iter()
            .filter(|l| l.metadata.namespace.as_deref() == Some(ns.as_str()))
            .map(|l| l.as_ref().clone())
            .collect();
        let release = releases.for_namespace(&ns);
        let Ok(pods) = pods_to_fit(stores, &p, svc, &release, &limit_ranges) else {
            continue;
        };
        q.push(Candidate {
            namespace: ns,
            name: p.name_any(),
            priority: settings.priority,
            waiting_since: status
                .pending_change
                .as_ref()
                .map_or(now, |c| c.detected_time),
            pods,
            headroom: settings.headroom,
        });
    }
    q
}

/// The rules new pods are admitted with (LimitRanges, RuntimeClasses);
/// nodes and pods are read from the capacity index.
fn cluster_state(stores: &Stores) -> ClusterState {
    ClusterState {
        limit_ranges: stores
            .limit_ranges
            .state()
            .iter()
            .map(|l| l.as_ref().clone())
            .collect(),
        runtime_classes: stores
            .runtime_classes
            .state()
            .iter()
            .map(|r| r.as_ref().clone())
            .collect(),
        ..Default::default()
    }
}

/// The last admission pass, the world it was computed on, and when.
pub type PassCache = Arc<std::sync::Mutex<Option<CachedPass>>>;

#[derive(Debug)]
pub struct CachedPass {
    world: WorldDigest,
    pass: Arc<Pass>,
    at: Timestamp,
}

/// A digest of what the pass reads: the index's generation; of each
/// RayService and RayCluster, what their change filters keep (spec
/// generation, deletion, the clusters named, the cluster state, the release
/// stamp: KubeRay's other status rewrites do not move it); of each plan, its
/// spec generation, phase, admission (from the status or written but not
/// cached yet) and waiting time. Order-independent, as the stores are
/// unordered.
#[derive(Debug, PartialEq)]
struct WorldDigest {
    /// Everything but the plans.
    rest: u64,
    /// Per plan: its digest, and whether it holds an admission.
    plans: HashMap<PlanKey, (u64, bool)>,
}

fn h<T: Hash>(t: T) -> u64 {
    let mut s = DefaultHasher::new();
    t.hash(&mut s);
    s.finish()
}

fn world_digest(stores: &Stores, generation: u64, overlay: &Overlay) -> WorldDigest {
    let mut rest = h(("generation", generation));
    for s in stores.services.state() {
        let m = match &s.0 {
            Ok(s) => &s.metadata,
            Err(e) => &e.metadata,
        };
        let changes = super::cache::service_changes(&s);
        rest = rest.wrapping_add(h(("svc", &m.namespace, &m.name, changes)));
    }
    for c in stores.clusters.state() {
        let m = match &c.0 {
            Ok(c) => &c.metadata,
            Err(e) => &e.metadata,
        };
        let stamp = m
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_KUBERAY_VERSION));
        let changes = super::cache::cluster_changes(&c);
        rest = rest.wrapping_add(h(("rc", &m.namespace, &m.name, &m.labels, stamp, changes)));
    }
    let mut plans = HashMap::new();
    for p in stores.plans.state() {
        let status = p.status.as_ref();
        let admission = admission_of(&p, overlay);
        let digest = h((
            p.metadata.generation,
            serde_json::to_string(&p.spec).ok(),
            status.map(|s| s.phase),
            admission.as_ref().map(|a| (&a.fingerprint, &a.to_cluster)),
            status
                .and_then(|s| s.pending_change.as_ref())
                .map(|c| c.detected_time),
        ));
        plans.insert(plan_key(&p), (digest, admission.is_some()));
    }
    WorldDigest { rest, plans }
}

impl CachedPass {
    /// Whether the pass still holds for `now`: the same world, but for
    /// plans the pass itself let through that hold their admission now (in
    /// their status or written but not cached yet). Recording what the pass
    /// decided does not change what it decided: without this, each of N
    /// admissions of one pass computed the pass again, twice (the written
    /// admission, then the status in the cache).
    fn holds_for(&self, now: &WorldDigest) -> bool {
        holds(&self.world, now, |k| {
            self.pass
                .get(&k.0, &k.1)
                .is_some_and(|r| r.as_ref().is_ok_and(|r| r.fits))
        })
    }
}

/// Whether a pass computed on `then` holds on `now`; `let_through`: the
/// pass admitted that plan.
fn holds(then: &WorldDigest, now: &WorldDigest, let_through: impl Fn(&PlanKey) -> bool) -> bool {
    then.rest == now.rest
        && then.plans.len() == now.plans.len()
        && now
            .plans
            .iter()
            .all(|(k, (digest, admitted))| match then.plans.get(k) {
                Some((d, _)) if d == digest => true,
                Some((_, false)) if *admitted => let_through(k),
                _ => false,
            })
}

/// The caches as one decision's [`Cluster`]: the capacity index, the other
/// plans' admissions (with those written but not yet cached) and queue, the
/// last admission pass. Built per decision; the rules are read once, lazily.
pub struct World<'a> {
    stores: &'a Stores,
    overlay: &'a Overlay,
    releases: &'a Releases,
    now: Timestamp,
    rules: OnceCell<ClusterState>,
    /// When the pass this decision read was computed.
    pass_at: std::cell::Cell<Option<Timestamp>>,
}

impl<'a> World<'a> {
    pub fn new(
        stores: &'a Stores,
        overlay: &'a Overlay,
        releases: &'a Releases,
        now: Timestamp,
    ) -> Self {
        World {
            stores,
            overlay,
            releases,
            now,
            rules: OnceCell::new(),
            pass_at: Default::default(),
        }
    }

    /// When the admission pass this world's decision read was computed;
    /// `None` if it read none.
    pub fn pass_at(&self) -> Option<Timestamp> {
        self.pass_at.get()
    }
}

impl Cluster for World<'_> {
    fn rules(&self) -> &ClusterState {
        self.rules.get_or_init(|| cluster_state(self.stores))
    }

    fn capacity(&self) -> crate::Result<Box<dyn Placement + '_>> {
        Ok(Box::new(OnIndex {
            index: super::cache::read_index(&self.stores.capacity)?,
            rules: self.rules(),
        }))
    }

    fn ledger(&self, except: Option<&PlanKey>) -> Vec<PodGroup> {
        ledger_pods(self.stores, except, self.overlay, self.releases)
    }

    fn waiting(&self, except: Option<&PlanKey>) -> Vec<Candidate> {
        waiting_plans(self.stores, except, self.overlay, self.releases, self.now)
    }

    /// Kept per digest of the world (see `world_digest`). The index is not
    /// held while `run` reads it again: a second read lock taken by the same
    /// thread waits behind a queued writer forever.
    fn pass(&self, run: &dyn Fn() -> crate::Result<Pass>) -> crate::Result<Arc<Pass>> {
        let generation = super::cache::read_index(&self.stores.capacity)?.generation();
        let world = world_digest(self.stores, generation, self.overlay);
        if let Ok(cached) = self.stores.pass.lock()
            && let Some(c) = cached.as_ref()
            && c.holds_for(&world)
        {
            self.pass_at.set(Some(c.at));
            return Ok(c.pass.clone());
        }
        let started = std::time::Instant::now();
        let pass = Arc::new(run()?);
        let at = Timestamp::now();
        tracing::info!(
            stage = "pass computed",
            generation,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "admission pass computed"
        );
        self.pass_at.set(Some(at));
        if let Ok(mut cached) = self.stores.pass.lock() {
            *cached = Some(CachedPass {
                world,
                pass: pass.clone(),
                at,
            });
        }
        Ok(pass)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberay::LABEL_ORIGINATED_FROM_CR_NAME;
    use crate::upgradeplan::{Phase, PlanUpgradeType};
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use std::sync::RwLock;

    fn rayservice() -> RayService {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/samples/ray_v1_rayservice_llm_gpu.yaml"
        ))
        .unwrap();
        serde_saphyr::from_str(&text).unwrap()
    }

    /// A plan for the sample RayService, recorded as waiting for capacity.
    fn waiting_plan(svc: &RayService) -> UpgradePlan {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
            "metadata": {"name": "llm", "namespace": svc.namespace()},
            "spec": {"rayServiceRef": {"name": svc.name_any()}},
            "status": {"phase": "WaitingForCapacity"}
        }))
        .unwrap()
    }

    fn stores(plan: UpgradePlan, svc: RayService) -> Stores {
        let (plans, mut w) = reflector::store();
        w.apply_watcher_event(&Event::Apply(plan));
        let (services, mut w) = reflector::store();
        w.apply_watcher_event(&Event::Apply(DeserializeGuard(Ok(svc))));
        Stores {
            plans,
            services,
            clusters: reflector::store().0,
            capacity: Arc::new(RwLock::new(crate::capacity::CapacityIndex::new())),
            pass: PassCache::default(),
            limit_ranges: reflector::store().0,
            runtime_classes: reflector::store().0,
        }
    }

    /// The sample RayService upgraded incrementally (maxSurge 50 %) next to
    /// its active cluster `llm-a` of 2 bound workers.
    fn incremental_stores() -> (Stores, PlanKey) {
        let mut svc = rayservice();
        svc.spec.upgrade_strategy = Some(
            serde_json::from_value(
                serde_json::json!({"type": "None", "clusterUpgradeOptions": {
                "maxSurgePercent": 50, "stepSizePercent": 25, "intervalSeconds": 30,
                "gatewayClassName": "gw"}}),
            )
            .unwrap(),
        );
        svc.status = Some(
            serde_json::from_value(
                serde_json::json!({"activeServiceStatus": {"rayClusterName": "llm-a"}}),
            )
            .unwrap(),
        );
        let mut plan = waiting_plan(&svc);
        plan.spec.upgrade_type = PlanUpgradeType::NewClusterWithIncrementalUpgrade;
        let key = plan_key(&plan);
        let stores = stores(plan, svc);
        let mut index = stores.capacity.write().unwrap();
        for i in 0..2 {
            let pod: crate::capacity::PartialPod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("llm-a-gpu-a100-worker-{i}"), "namespace": "ml-serving",
                    "labels": {"ray.io/cluster": "llm-a", "ray.io/node-type": "worker",
                        "ray.io/group": "gpu-a100"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "ray-worker", "resources": {
                    "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}}}]}
            }))
            .unwrap();
            let rec = index.record(&pod);
            index.apply_pod(rec);
        }
        drop(index);
        (stores, key)
    }

    fn counts(groups: &[PodGroup]) -> Vec<(String, usize)> {
        groups
            .iter()
            .map(|g| (surge::group_of(&g.template), g.count))
            .collect()
    }

    #[test]
    fn an_incremental_plan_queues_its_surge_and_holds_its_budget_once_admitted() {
        let (stores, key) = incremental_stores();
        let now = Timestamp::now();
        let releases = Releases::default().with_incremental_gate(Some(true));
        let none = Overlay::new();
        // minReplicas 2 + ceil(50 % × 2 running) = 3 workers (maxReplicas 4), and the head.
        let q = waiting_plans(&stores, None, &none, &releases, now);
        assert_eq!(
            counts(&q[0].pods),
            vec![("head".into(), 1), ("gpu-a100".into(), 3)]
        );
        // Admitted with that budget: the old cluster's 2 bound workers count
        // against it, the head and 3 workers are held.
        let budget = vec![
            crate::upgradeplan::SurgeBudget {
                group: "head".into(),
                pods: 1,
                shares_active: false,
            },
            crate::upgradeplan::SurgeBudget {
                group: "gpu-a100".into(),
                pods: 5,
                shares_active: true,
            },
        ];
        let admitted = Overlay::from([(
            key,
            Admission {
                fingerprint: "f".into(),
                admitted_time: now,
                from_cluster: Some("llm-a".into()),
                to_cluster: None,
                surge: budget,
            },
        )]);
        let ledger = ledger_pods(&stores, None, &admitted, &releases);
        assert_eq!(
            counts(&ledger),
            vec![("head".into(), 1), ("gpu-a100".into(), 3)]
        );
        // The gate off (v1.6 default): the plan is left out of the queue, its
        // own decision reports the error.
        let off = Releases::from_stamps([("ml-serving", "v1.6.2")], None);
        assert!(waiting_plans(&stores, None, &none, &off, now).is_empty());
    }

    #[test]
    fn a_pass_holds_while_only_its_own_admissions_are_recorded() {
        let svc = rayservice();
        let plan = waiting_plan(&svc);
        let key = plan_key(&plan);
        let stores_now = stores(plan.clone(), svc);
        let none = Overlay::new();
        let then = world_digest(&stores_now, 7, &none);
        assert!(holds(&then, &world_digest(&stores_now, 7, &none), |_| {
            false
        }));
        // Another index generation: computed again.
        assert!(!holds(&then, &world_digest(&stores_now, 8, &none), |_| {
            true
        }));
        // The plan's admission written (not cached yet): holds if the pass
        // admitted it, not otherwise.
        let admitted = Overlay::from([(
            key.clone(),
            Admission {
                fingerprint: "f".into(),
                admitted_time: Timestamp::now(),
                from_cluster: None,
                to_cluster: None,
                surge: Default::default(),
            },
        )]);
        let now = world_digest(&stores_now, 7, &admitted);
        assert_ne!(now, then);
        assert!(holds(&then, &now, |k| *k == key));
        assert!(!holds(&then, &now, |_| false));
        // KubeRay rewriting the RayService status (a new resourceVersion,
        // nothing the filters keep) does not move the digest.
        let mut svc = rayservice();
        svc.metadata.resource_version = Some("999".into());
        let churned = stores(plan, svc);
        assert_eq!(world_digest(&churned, 7, &none), then);
    }

    /// The sample RayService, active on `llm-abcde`, whose cluster is in the store.
    fn serving(svc: &mut RayService, plan: UpgradePlan) -> Stores {
        svc.status = Some(
            serde_json::from_value(serde_json::json!({
                "activeServiceStatus": {"rayClusterName": "llm-abcde"}
            }))
            .unwrap(),
        );
        let cluster: RayCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "llm-abcde", "namespace": svc.namespace(),
                "labels": {LABEL_ORIGINATED_FROM_CR_NAME: svc.name_any()},
                "annotations": {kuberay::ANNOTATION_NUM_WORKER_GROUPS: "1",
                    ANNOTATION_KUBERAY_VERSION: KubeRayVersion::latest().tag()}},
            "spec": svc.spec.ray_cluster_config,
        }))
        .unwrap();
        let mut stores = stores(plan, svc.clone());
        let (clusters, mut w) = reflector::store();
        w.apply_watcher_event(&Event::Apply(DeserializeGuard(Ok(cluster))));
        stores.clusters = clusters;
        stores
    }

    #[test]
    fn a_fractional_gpu_is_an_error_with_its_path_and_the_gate_stays_closed() {
        let mut svc = rayservice();
        let plan = waiting_plan(&svc);
        let mut changed = svc.clone();
        let worker = &mut changed
            .spec
            .ray_cluster_config
            .as_mut()
            .unwrap()
            .worker_group_specs
            .as_mut()
            .unwrap()[0];
        let resources = worker
            .template
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .resources
            .as_mut()
            .unwrap();
        for list in [&mut resources.limits, &mut resources.requests] {
            list.as_mut().unwrap().insert(
                "nvidia.com/gpu".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("1.5".into()),
            );
        }
        let stores = serving(&mut svc, plan.clone());
        changed.status = svc.status.clone();
        let (services, mut w) = reflector::store();
        w.apply_watcher_event(&Event::Apply(DeserializeGuard(Ok(changed))));
        let stores = Stores { services, ..stores };
        let releases = Releases::default();
        let now = Timestamp::now();
        let overlay = Overlay::new();
        let world = World::new(&stores, &overlay, &releases, now);
        let release = releases.for_namespace("ml-serving");
        let inp = observe(&stores, &plan, &release, now, false, &world);
        let d = crate::admission::decide(&inp);
        let msg = d.status.message.clone().unwrap_or_default();
        assert_eq!(d.status.phase, Phase::Error, "{msg}");
        assert!(
            msg.contains(
                "RayService ml-serving/llm: spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].resources.limits[nvidia.com/gpu]: 1.5 must be an integer"
            ),
            "{msg}"
        );
        assert_eq!(d.gate, Some(crate::admission::Gate::Hold));
        assert!(d.status.admitted.is_none());
        assert!(
            d.events.iter().any(|e| e.reason == "InvalidRayService"),
            "{:?}",
            d.events
        );
    }

    #[test]
    fn clusters_of_a_deleted_rayservice_of_the_same_name_are_not_its_own() {
        let mut svc = rayservice();
        svc.metadata.uid = Some("new-uid".into());
        let plan = waiting_plan(&svc);
        let stores = serving(&mut svc, plan);
        let cluster = |uid: Option<&str>| -> RayCluster {
            let mut c = stores.clusters.state()[0].0.as_ref().unwrap().clone();
            c.metadata.owner_references = uid.map(|uid| {
                vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        api_version: "ray.io/v1".into(),
                        kind: "RayService".into(),
                        name: svc.name_any(),
                        uid: uid.into(),
                        controller: Some(true),
                        ..Default::default()
                    },
                ]
            });
            c
        };
        let (clusters, mut w) = reflector::store();
        w.apply_watcher_event(&Event::Apply(DeserializeGuard(Ok(cluster(Some(
            "old-uid",
        ))))));
        let stores = Stores { clusters, ..stores };
        assert!(clusters_of(&stores, &svc).is_empty());
        for owner in [Some("new-uid"), None] {
            let (clusters, mut w) = reflector::store();
            w.apply_watcher_event(&Event::Apply(DeserializeGuard(Ok(cluster(owner)))));
            let stores = Stores {
                clusters,
                ..stores.clone()
            };
            assert_eq!(clusters_of(&stores, &svc).len(), 1, "{owner:?}");
        }
    }

    #[test]
    fn an_admission_the_cache_has_not_shown_is_in_the_ledger_and_not_in_the_queue() {
        let svc = rayservice();
        let plan = waiting_plan(&svc);
        let key = plan_key(&plan);
        let stores = stores(plan, svc);
        let now = Timestamp::now();
        let version = Releases::default();

        let none = Overlay::new();
        assert_eq!(waiting_plans(&stores, None, &none, &version, now).len(), 1);
        assert!(ledger_pods(&stores, None, &none, &version).is_empty());

        let admitted = Overlay::from([(
            key,
            Admission {
                fingerprint: "f".into(),
                admitted_time: now,
                from_cluster: None,
                to_cluster: None,
                surge: vec![],
            },
        )]);
        assert!(waiting_plans(&stores, None, &admitted, &version, now).is_empty());
        let ledger = ledger_pods(&stores, None, &admitted, &version);
        assert!(
            !ledger.is_empty(),
            "the admitted plan's pods are reserved once"
        );
    }
}
