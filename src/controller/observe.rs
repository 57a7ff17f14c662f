//! Turning the caches into the decision's inputs for one plan.
//!
//! This is where raygate looks at the world: which RayService a plan points
//! to, which clusters and pods it has, what change is pending, which
//! reservations other plans hold. The decision itself stays in
//! [`crate::admission`].

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{LimitRange, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::ResourceExt;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::admission::ledger::{self, Candidate};
use crate::admission::pass::{self, Pass};
use crate::admission::{ChangeFacts, GateFacts, ServiceFacts};
use crate::capacity::{
    self, CapacityIndex, ClusterState, FitReport, FitRequest, PodGroup, ResourceList,
};
use crate::kuberay::{self, KubeRayVersion, LABEL_ORIGINATED_FROM_CR_NAME, RayCluster, RayService};
use crate::quantity::Quantity;
use crate::upgradeplan::{Admission, Phase, UpgradePlan};

use super::gate;

/// Everything the caches hold.
#[derive(Clone)]
pub struct Stores {
    pub plans: Store<UpgradePlan>,
    pub services: Store<DeserializeGuard<RayService>>,
    pub clusters: Store<DeserializeGuard<RayCluster>>,
    /// Nodes and pods, aggregated per node (see [`crate::capacity::index`]).
    pub capacity: super::cache::SharedIndex,
    /// The last admission pass (see [`current_pass`]).
    pub pass: PassCache,
    pub limit_ranges: Store<LimitRange>,
    pub runtime_classes: Store<RuntimeClass>,
}

/// Admissions written but maybe not yet seen in the plan cache; the ledger
/// must count them or a quick second decision could double-book capacity.
pub type Overlay = HashMap<(String, String), Admission>;

/// What was observed for one plan, owned, so the inputs can borrow it.
pub struct Observation {
    pub service_name: String,
    pub service: Result<ServiceFacts, String>,
    pub change: Result<Option<ChangeFacts>, String>,
    pub verdict: String,
    pub clusters: BTreeSet<String>,
    pub pods: BTreeMap<String, Vec<Arc<Pod>>>,
    pub pending_ready: bool,
    /// Fingerprint of the pending RayCluster's spec (see [`cluster_fingerprint`]).
    pub pending_fingerprint: Option<String>,
    pub gate: GateFacts,
    /// Another manager that owns the gate field (not yet judged an override).
    pub gate_other_owner: Option<String>,
    pub gate_owned_by_us: bool,
}

fn service(
    stores: &Stores,
    ns: &str,
    name: &str,
) -> Result<Arc<DeserializeGuard<RayService>>, String> {
    stores
        .services
        .get(&ObjectRef::new(name).within(ns))
        .ok_or_else(|| format!("RayService {ns}/{name} not found"))
}

/// The RayClusters KubeRay created for a service.
fn clusters_of(stores: &Stores, ns: &str, svc: &str) -> Vec<Arc<DeserializeGuard<RayCluster>>> {
    stores
        .clusters
        .state()
        .into_iter()
        .filter(|c| {
            let meta = match &c.0 {
                Ok(c) => &c.metadata,
                Err(e) => &e.metadata,
            };
            meta.namespace.as_deref() == Some(ns)
                && meta
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_ORIGINATED_FROM_CR_NAME))
                    .map(String::as_str)
                    == Some(svc)
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
) -> BTreeMap<String, Vec<Arc<Pod>>> {
    let mut out: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
    let Ok(index) = super::cache::read_index(&stores.capacity) else {
        return out;
    };
    for c in names {
        let pods: Vec<Arc<Pod>> = index
            .cluster_pods(ns, c)
            .into_iter()
            .map(|(key, body)| Arc::new(body.to_pod(&key)))
            .collect();
        if !pods.is_empty() {
            out.insert(c.clone(), pods);
        }
    }
    out
}

/// The service's spec with the gate forced open: raygate's own `None` must
/// not hide what KubeRay would do once the gate opens.
fn with_gate_open(svc: &RayService) -> RayService {
    let mut s = svc.clone();
    let strategy = s.spec.upgrade_strategy.get_or_insert_with(Default::default);
    strategy.type_ = Some(kuberay::UpgradeType::NewCluster);
    s
}

/// The pods KubeRay will create for the service's new cluster, named after
/// `<service>-next` (the real name is random and not known yet).
fn new_cluster_pods(svc: &RayService, version: KubeRayVersion) -> crate::Result<Vec<PodGroup>> {
    let ns = svc.namespace().unwrap_or_default();
    let name = format!("{}-next", svc.name_any());
    kuberay::planned_groups(&name, &ns, svc.cluster_config()?, version)
}

/// A cluster name the RayService status gives (empty means none).
fn status_cluster(s: Option<&kuberay::RayServiceStatus>) -> Option<String> {
    s.and_then(|s| s.ray_cluster_name.clone())
        .filter(|n| !n.is_empty())
}

fn same_plan(a: &UpgradePlan, b: &UpgradePlan) -> bool {
    a.namespace() == b.namespace() && a.name_any() == b.name_any()
}

/// Since when a plan's pending change has waited (now if not recorded yet).
fn waiting_since(plan: &UpgradePlan, now: Timestamp) -> Timestamp {
    plan.status
        .as_ref()
        .and_then(|s| s.pending_change.as_ref())
        .and_then(|c| c.detected_time.parse().ok())
        .unwrap_or(now)
}

pub fn observe(stores: &Stores, plan: &UpgradePlan, version: KubeRayVersion) -> Observation {
    let ns = plan.namespace().unwrap_or_default();
    let svc_name = plan.spec.ray_service_ref.name.clone();
    let mut obs = Observation {
        service_name: svc_name.clone(),
        service: Err(String::new()),
        change: Ok(None),
        verdict: String::new(),
        clusters: BTreeSet::new(),
        pods: BTreeMap::new(),
        pending_ready: false,
        pending_fingerprint: None,
        gate: GateFacts::default(),
        gate_other_owner: None,
        gate_owned_by_us: false,
    };
    let guard = match service(stores, &ns, &svc_name) {
        Ok(g) => g,
        Err(msg) => {
            obs.service = Err(msg);
            return obs;
        }
    };
    let svc = match &guard.0 {
        Ok(s) => s,
        Err(e) => {
            obs.service = Err(format!(
                "RayService {ns}/{svc_name} cannot be read: {}",
                e.error
            ));
            return obs;
        }
    };
    let managed = svc.metadata.managed_fields.as_deref().unwrap_or(&[]);
    obs.gate_other_owner = gate::other_owner(managed);
    obs.gate_owned_by_us = gate::owned_by_us(managed);
    obs.gate.value = svc
        .spec
        .upgrade_strategy
        .as_ref()
        .and_then(|u| u.type_.as_ref())
        .map(|t| t.as_str().to_string());

    let status = svc.status.as_ref();
    let active = status_cluster(status.and_then(|s| s.active_service_status.as_ref()));
    let pending = status_cluster(status.and_then(|s| s.pending_service_status.as_ref()));
    let pending_apps = status
        .and_then(|s| s.pending_service_status.as_ref())
        .and_then(|p| p.application_statuses.as_ref())
        .map(|apps| {
            apps.iter()
                .map(|(k, v)| (k.clone(), v.status.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();

    let clusters = clusters_of(stores, &ns, &svc_name);
    obs.clusters = clusters.iter().map(|c| guard_name(c)).collect();
    obs.pods = pods_by_cluster(stores, &ns, &obs.clusters);
    let find = |name: &Option<String>| {
        name.as_ref()
            .and_then(|n| clusters.iter().find(|c| &guard_name(c) == n).cloned())
    };
    let pending_cluster = find(&pending);
    obs.pending_ready = pending_cluster
        .as_ref()
        .and_then(|c| c.0.as_ref().ok())
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.state.as_deref())
        == Some("ready");
    obs.pending_fingerprint = pending_cluster
        .as_ref()
        .and_then(|c| c.0.as_ref().ok())
        .and_then(|c| cluster_fingerprint(c, version));

    // KubeRay compares the spec with the pending cluster when there is one.
    let base = pending_cluster.or_else(|| find(&active));
    obs.change = match (&active, base) {
        (None, _) => Ok(None),
        (Some(a), None) => Err(format!(
            "active RayCluster {ns}/{a} named in the RayService status does not exist (yet)"
        )),
        (Some(_), Some(base)) => match &base.0 {
            Err(e) => Err(format!(
                "RayCluster {} cannot be read: {}",
                guard_name(&base),
                e.error
            )),
            Ok(cluster) => change_against(svc, cluster, version, &mut obs.verdict),
        },
    };
    obs.service = Ok(ServiceFacts {
        active_cluster: active,
        pending_cluster: pending,
        pending_apps,
    });
    obs
}

/// The fingerprint a RayCluster's own spec has, computed as a change's is
/// (muted fields left out), so it can be compared with an admitted one.
fn cluster_fingerprint(c: &RayCluster, version: KubeRayVersion) -> Option<String> {
    let spec = serde_json::to_value(&c.spec).ok()?;
    let n = kuberay::normalize::normalize_cluster_spec(&spec, &version.rules(), "RayCluster spec")
        .ok()?;
    Some(kuberay::classify::fingerprint(&n.muted))
}

fn change_against(
    svc: &RayService,
    cluster: &RayCluster,
    version: KubeRayVersion,
    verdict_out: &mut String,
) -> Result<Option<ChangeFacts>, String> {
    let open = with_gate_open(svc);
    let c = kuberay::classify(&kuberay::OldSide::RayCluster(cluster), &open, version)
        .map_err(|e| e.to_string())?;
    *verdict_out = format!("{:?}", c.verdict);
    if c.verdict != kuberay::Verdict::NewCluster {
        return Ok(None);
    }
    let pods = new_cluster_pods(svc, version).map_err(|e| e.to_string())?;
    Ok(Some(ChangeFacts {
        fingerprint: c.fingerprint.clone(),
        triggering_paths: c.triggering_paths.clone(),
        new_pods: pods,
    }))
}

/// The current admission of a plan: its status, or a just-written one.
fn admission_of(plan: &UpgradePlan, overlay: &Overlay) -> Option<Admission> {
    let key = (plan.namespace().unwrap_or_default(), plan.name_any());
    plan.status
        .as_ref()
        .and_then(|s| s.admitted.clone())
        .or_else(|| overlay.get(&key).cloned())
}

/// Unbound pods of every other plan's admitted upgrade (every plan's
/// with `me` = `None`).
pub fn ledger_pods(
    stores: &Stores,
    me: Option<&UpgradePlan>,
    overlay: &Overlay,
    version: KubeRayVersion,
) -> Vec<PodGroup> {
    let mut out = vec![];
    for p in stores.plans.state() {
        if me.is_some_and(|me| same_plan(&p, me)) {
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
        let pending = status_cluster(
            svc.status
                .as_ref()
                .and_then(|s| s.pending_service_status.as_ref()),
        )
        .or(adm.to_cluster.clone());
        let clusters = clusters_of(stores, &ns, &svc.name_any());
        let pending_cluster = pending
            .as_ref()
            .and_then(|n| clusters.iter().find(|c| &guard_name(c) == n))
            .and_then(|c| c.0.as_ref().ok());
        let planned = match pending_cluster {
            Some(c) => kuberay::planned_groups(&c.name_any(), &ns, &c.spec, version),
            None => new_cluster_pods(svc, version),
        };
        let Ok(planned) = planned else { continue };
        let existing: Vec<Arc<Pod>> = match &pending {
            Some(n) => pods_by_cluster(stores, &ns, &BTreeSet::from([n.clone()]))
                .remove(n)
                .unwrap_or_default(),
            None => vec![],
        };
        let refs: Vec<&Pod> = existing.iter().map(|p| p.as_ref()).collect();
        out.extend(ledger::unbound(&planned, &refs));
    }
    out
}

fn headroom(plan: &UpgradePlan) -> ResourceList {
    plan.spec
        .headroom
        .iter()
        .filter_map(|(k, v)| Quantity::parse(v).ok().map(|q| (k.clone(), q)))
        .collect()
}

/// Other plans waiting for capacity, plus `me` (with its pods), in
/// admission order.
pub fn queue(
    stores: &Stores,
    me: Option<(&UpgradePlan, &[PodGroup])>,
    version: KubeRayVersion,
) -> Vec<Candidate> {
    let now = Timestamp::now();
    let mut q = vec![];
    for p in stores.plans.state() {
        if me.is_some_and(|(me, _)| same_plan(&p, me)) {
            continue;
        }
        let Some(status) = p.status.as_ref() else {
            continue;
        };
        if status.phase != Phase::WaitingForCapacity || status.admitted.is_some() {
            continue;
        }
        let ns = p.namespace().unwrap_or_default();
        let Ok(guard) = service(stores, &ns, &p.spec.ray_service_ref.name) else {
            continue;
        };
        let Ok(svc) = &guard.0 else { continue };
        let Ok(pods) = new_cluster_pods(svc, version) else {
            continue;
        };
        q.push(Candidate {
            namespace: ns,
            name: p.name_any(),
            priority: crate::admission::priority::of(&p),
            waiting_since: waiting_since(&p, now),
            pods,
            headroom: headroom(&p),
        });
    }
    if let Some((me, my_pods)) = me {
        q.push(Candidate {
            namespace: me.namespace().unwrap_or_default(),
            name: me.name_any(),
            priority: crate::admission::priority::of(me),
            waiting_since: waiting_since(me, now),
            pods: my_pods.to_vec(),
            headroom: headroom(me),
        });
    }
    ledger::order(&mut q);
    q
}

/// The rules new pods are admitted with (LimitRanges, RuntimeClasses);
/// nodes and pods are read from the capacity index.
pub fn cluster_state(stores: &Stores) -> ClusterState {
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

/// The last admission pass and what it was computed on.
pub type PassCache = Arc<std::sync::Mutex<Option<(u64, Arc<Pass>)>>>;

/// A digest of everything the pass reads: the index's generation, every
/// plan, RayService and RayCluster version, the admissions not yet cached.
/// Order-independent, as the stores are unordered.
fn world_key(stores: &Stores, generation: u64, overlay: &Overlay) -> u64 {
    fn h<T: Hash>(t: T) -> u64 {
        let mut s = DefaultHasher::new();
        t.hash(&mut s);
        s.finish()
    }
    let mut key = h(("generation", generation));
    for p in stores.plans.state() {
        let m = &p.metadata;
        key = key.wrapping_add(h(("plan", &m.namespace, &m.name, &m.resource_version)));
    }
    for s in stores.services.state() {
        let m = match &s.0 {
            Ok(s) => &s.metadata,
            Err(e) => &e.metadata,
        };
        key = key.wrapping_add(h(("svc", &m.namespace, &m.name, &m.resource_version)));
    }
    for c in stores.clusters.state() {
        let m = match &c.0 {
            Ok(c) => &c.metadata,
            Err(e) => &e.metadata,
        };
        key = key.wrapping_add(h(("rc", &m.namespace, &m.name, &m.resource_version)));
    }
    for (k, a) in overlay {
        key = key.wrapping_add(h(("overlay", k, &a.fingerprint, &a.to_cluster)));
    }
    key
}

/// The admission pass for the world as it is now: computed once per change
/// of it (see [`crate::admission::pass`]), then read by every reconcile.
fn current_pass(
    stores: &Stores,
    index: &CapacityIndex,
    rules: &ClusterState,
    overlay: &Overlay,
    version: KubeRayVersion,
) -> crate::Result<Arc<Pass>> {
    let key = world_key(stores, index.generation(), overlay);
    if let Ok(cached) = stores.pass.lock()
        && let Some((k, pass)) = cached.as_ref()
        && *k == key
    {
        return Ok(pass.clone());
    }
    let ledger = ledger_pods(stores, None, overlay, version);
    let q = queue(stores, None, version);
    let pass = Arc::new(pass::run(&index.capacity()?, rules, &ledger, &q)?);
    if let Ok(mut cached) = stores.pass.lock() {
        *cached = Some((key, pass.clone()));
    }
    Ok(pass)
}

/// Fit of `change` for `me`, with the ledger and the queue ahead reserved.
/// A plan waiting for capacity reads its result from the admission pass;
/// any other (a first decision, an admission fitted again) is fitted alone.
pub fn evaluate_fit(
    stores: &Stores,
    state: &ClusterState,
    me: &UpgradePlan,
    overlay: &Overlay,
    version: KubeRayVersion,
    change: &ChangeFacts,
    old_pods: &[Arc<Pod>],
) -> crate::Result<FitReport> {
    let key = (me.namespace().unwrap_or_default(), me.name_any());
    let index = super::cache::read_index(&stores.capacity)?;
    let old_requests =
        capacity::total_requests(old_pods.iter().map(|p| p.as_ref()), &state.limit_ranges)?;
    let waiting = me
        .status
        .as_ref()
        .is_some_and(|s| s.phase == Phase::WaitingForCapacity && s.admitted.is_none())
        && !overlay.contains_key(&key);
    if waiting {
        let pass = current_pass(stores, &index, state, overlay, version)?;
        if let Some(result) = pass.get(&key.0, &key.1) {
            let mut report = result.clone().map_err(|e| {
                crate::Error::invalid(format!("UpgradePlan {}/{}", key.0, key.1), e)
            })?;
            report.required = capacity::sum(&old_requests, &report.new_requests);
            report.old_requests = old_requests;
            return Ok(report);
        }
    }
    let ledger = ledger_pods(stores, Some(me), overlay, version);
    let q = queue(stores, Some((me, &change.new_pods)), version);
    let reserved = ledger::reserved_on(&index, state, &ledger, &q, (&key.0, &key.1))?;
    index.fit(
        state,
        &FitRequest {
            pods: change.new_pods.clone(),
            reserved,
            headroom: headroom(me),
            old_requests,
        },
    )
}
