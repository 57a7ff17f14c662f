//! Per node, the devices kube-scheduler's allocator would consider, and which are in use.
//!
//! As `GatherPools` (`structured/internal/*/pools_*.go`): the slices of a pool (driver,
//! pool name) are those of its newest generation; a pool whose newest generation does not
//! have all `resourceSliceCount` slices yet is incomplete: none of its devices are
//! allocated, and a request for `All` devices on that node fails.
//!
//! Kept across decisions ([`Views`], in the state): a ResourceSlice or an allocated
//! ResourceClaim marks its pool changed, and the next decision rebuilds that pool and the
//! nodes it touches only, as the index patches the static verdicts of changed nodes only.
//! Each node keeps the devices each request shape may take; a DeviceClass change (or the
//! plain-count classes) starts a new class epoch, and answers of an older epoch are not
//! used. A view built from nothing gives the same answers: the index's property test
//! checks it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::PodDemand;
use super::select::Selectors;
use super::{Device, DeviceId, DraState, Exact, PoolId, Undecided};
use crate::capacity::node::{NodeId, node_name};
use crate::capacity::statics::Layout;
use k8s_openapi::api::core::v1::Node;

/// One device on a node.
#[derive(Debug, Clone)]
pub struct NodeDevice {
    /// Shared by the pool's part and the node's view.
    pub id: Arc<DeviceId>,
    pub device: Arc<Device>,
    /// Its pool also publishes `sharedCounters` (partitionable devices).
    pub partitionable: bool,
}

/// Per request shape: (class epoch, class, request selectors, what raygate does not model
/// in the request, the devices it may take). A node sees a handful of request shapes, so
/// a scan finds one without building a key.
type NodeCandidates = Vec<(
    u64,
    String,
    Vec<String>,
    Option<&'static str>,
    Result<Arc<[usize]>, Undecided>,
)>;

/// A node's devices, in the order the allocator tries them.
#[derive(Debug, Default)]
pub struct NodeDevices {
    pub devices: Vec<NodeDevice>,
    /// Held by an allocated ResourceClaim.
    pub used: Vec<bool>,
    /// Some pool on the node is being updated (its newest generation is incomplete).
    pub incomplete: bool,
    /// The devices each request shape may take, kept until the node or a class changes.
    candidates: Mutex<NodeCandidates>,
}

impl NodeDevices {
    fn candidates(&self) -> MutexGuard<'_, NodeCandidates> {
        // Entries are pushed whole: a panic elsewhere cannot leave a half-written one.
        crate::sync::lock(&self.candidates)
    }
}

/// What one pool's newest generation puts on each node: (node, incomplete, devices).
type PoolPart = Vec<(String, bool, Vec<NodeDevice>)>;

/// The views of every node, as of the last decision.
#[derive(Debug, Default, Clone)]
struct Built {
    parts: BTreeMap<PoolId, Arc<PoolPart>>,
    /// Node → the pools with slices on it.
    node_pools: HashMap<String, BTreeSet<PoolId>>,
    nodes: HashMap<String, Arc<NodeDevices>>,
    devices: usize,
}

#[derive(Debug, Default)]
struct Inner {
    /// `None`: build every pool (nothing built yet).
    built: Option<Arc<Built>>,
    /// Pools whose slices or held devices changed since.
    changed: BTreeSet<PoolId>,
    /// Bumped when a DeviceClass changes: candidates of older epochs are not used.
    epoch: u64,
    /// The plain-count classes the epoch is for.
    plain: BTreeSet<String>,
    /// Bumped whenever `built` is built or patched.
    version: u64,
    /// The views of the index's usable nodes as of `built` and `epoch`, kept until the
    /// nodes, the views or the classes change.
    usable: Option<Arc<Usable>>,
}

/// What one class adds to the fit's totals on the usable nodes (see
/// [`super::run::DraRun::credit`]), before anything is placed.
#[derive(Debug)]
pub(crate) struct Total {
    /// Matching devices on every usable node.
    pub(crate) allocatable: i128,
    /// Of them, free before placing anything.
    pub(crate) free_before: i128,
    /// Per usable node with matching devices (its index in the layout), those devices.
    pub(crate) nodes: Vec<(usize, Arc<[usize]>)>,
}

/// (credited resource name, class, whether it is an extended resource the class maps).
type TotalKey = (String, String, bool);

/// The usable nodes' views in the order of the capacity's nodes, and the class totals on
/// them: what every decision would otherwise map (a hash lookup per node) and sum again.
#[derive(Debug)]
pub(crate) struct Usable {
    /// The index's layout they are for (`None`: a from-scratch capacity, never kept).
    layout: Option<Layout>,
    /// (`Inner::version`, `Inner::epoch`) they are for.
    key: (u64, u64),
    /// Per usable node, its devices, if any pool publishes on it.
    pub(crate) nodes: Vec<Option<Arc<NodeDevices>>>,
    totals: Mutex<Vec<(TotalKey, Arc<Total>)>>,
    /// Scan lists by (demand, the static filters' feasible nodes).
    scans: Mutex<Vec<Scan>>,
}

/// A node of a scan, with the pod's one request there when it is one count of some
/// candidates (the allocator takes the first free ones: it finds them when enough are free).
pub(crate) type ScanNode = (NodeId, Option<(u32, Arc<[usize]>)>);

/// A scan list kept: it reads only the demand, the feasible nodes and the nodes' devices
/// and allocatable, which the usable views are kept for.
type Scan = (PodDemand, Arc<[NodeId]>, Arc<[ScanNode]>);

impl Usable {
    /// The total kept for `key`, if any.
    pub(crate) fn total(&self, key: &TotalKey) -> Option<Arc<Total>> {
        crate::sync::lock(&self.totals)
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, t)| t.clone())
    }

    /// Scan lists kept at most; past it they start again (a handful of pod shapes ask
    /// DRA devices at once).
    const MAX_SCANS: usize = 16;

    /// The scan list kept for `demand` on `feasible`, if any.
    pub(crate) fn scan(&self, demand: &PodDemand, feasible: &[NodeId]) -> Option<Arc<[ScanNode]>> {
        crate::sync::lock(&self.scans)
            .iter()
            .find(|(d, f, _)| d == demand && **f == *feasible)
            .map(|(.., l)| l.clone())
    }

    /// Keeps `list` for `demand` on `feasible`.
    pub(crate) fn keep_scan(&self, demand: &PodDemand, feasible: &[NodeId], list: Arc<[ScanNode]>) {
        let mut s = crate::sync::lock(&self.scans);
        if s.len() >= Self::MAX_SCANS {
            s.clear();
        }
        s.push((demand.clone(), Arc::from(feasible), list));
    }

    /// Keeps `total` for `key`.
    pub(crate) fn keep_total(&self, key: TotalKey, total: Arc<Total>) {
        let mut t = crate::sync::lock(&self.totals);
        if !t.iter().any(|(k, _)| *k == key) {
            t.push((key, total));
        }
    }
}

/// The node views a state keeps across decisions. A cache, not state: two states with the
/// same objects are equal whatever it holds, and a clone starts empty (its objects may
/// then change apart from the original's).
#[derive(Default)]
pub struct Views(Mutex<Inner>);

impl Clone for Views {
    fn clone(&self) -> Views {
        Views::default()
    }
}

impl PartialEq for Views {
    fn eq(&self, _: &Views) -> bool {
        true
    }
}

impl std::fmt::Debug for Views {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.inner();
        write!(
            f,
            "Views(built: {}, changed pools: {})",
            i.built.is_some(),
            i.changed.len()
        )
    }
}

impl Views {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Every update below leaves `Inner` whole before anything can panic.
        crate::sync::lock(&self.0)
    }

    /// A slice of `pool`, or a claim holding one of its devices, changed.
    pub(super) fn pool_changed(&mut self, pool: &PoolId) {
        let i = self.0.get_mut().unwrap_or_else(|e| e.into_inner());
        if i.built.is_some() && !i.changed.contains(pool) {
            i.changed.insert(pool.clone());
        }
    }

    /// A DeviceClass changed: what each request shape may take is computed again.
    pub(super) fn classes_changed(&mut self) {
        let i = self.0.get_mut().unwrap_or_else(|e| e.into_inner());
        i.epoch += 1;
    }

    /// Forgets everything: the next decision builds every view (a restart).
    pub fn clear(&self) {
        *self.inner() = Inner::default();
    }

    /// The views of `nodes` (the capacity's usable nodes; `layout`, the index's, when it
    /// has one) as of `built` and `key`: kept across decisions for the index's layout.
    fn usable(
        &self,
        built: &Built,
        key: (u64, u64),
        layout: Option<&Layout>,
        nodes: &[&Node],
    ) -> Arc<Usable> {
        let mut i = self.inner();
        if let (Some(u), Some(l)) = (&i.usable, layout)
            && u.key == key
            && u.layout.as_ref().is_some_and(|k| Arc::ptr_eq(k, l))
        {
            return u.clone();
        }
        let u = Arc::new(Usable {
            layout: layout.cloned(),
            key,
            nodes: nodes
                .iter()
                .map(|n| built.nodes.get(node_name(n)).cloned())
                .collect(),
            totals: Mutex::default(),
            scans: Mutex::default(),
        });
        if layout.is_some() {
            i.usable = Some(u.clone());
        }
        u
    }

    /// The views as of `state`, patched for the pools changed since the last call, the
    /// class epoch their candidates are for, and the views' version.
    fn current(&self, state: &DraState) -> (Arc<Built>, u64, u64) {
        let mut i = self.inner();
        if i.plain != state.plain_count {
            i.plain = state.plain_count.clone();
            i.epoch += 1;
        }
        let built = match i.built.take() {
            None => {
                i.version += 1;
                Arc::new(build_all(state))
            }
            Some(mut b) => {
                let changed = std::mem::take(&mut i.changed);
                if !changed.is_empty() {
                    i.version += 1;
                    patch(Arc::make_mut(&mut b), state, &changed);
                }
                b
            }
        };
        i.changed.clear();
        i.built = Some(built.clone());
        (built, i.epoch, i.version)
    }
}

/// A pool's part: its newest generation's slices (by name) spread over their nodes.
fn pool_part(state: &DraState, pool: &PoolId) -> PoolPart {
    let slices: Vec<&super::Slice> = state
        .pools()
        .get(pool)
        .into_iter()
        .flatten()
        .filter_map(|k| state.slices().get(k))
        .collect();
    let Some(newest) = slices.iter().map(|s| s.generation).max() else {
        return vec![];
    };
    let slices: Vec<&super::Slice> = slices
        .into_iter()
        .filter(|s| s.generation == newest)
        .collect();
    let complete = slices
        .first()
        .is_some_and(|s| slices.len() as i64 == s.slice_count);
    let partitionable = slices.iter().any(|s| s.shared_counters);
    let mut part: PoolPart = Vec::new();
    for s in slices {
        let Some(node) = s.node.as_deref() else {
            continue;
        };
        let at = match part.iter().position(|(n, _, _)| n == node) {
            Some(at) => at,
            None => {
                part.push((node.to_string(), false, Vec::new()));
                part.len() - 1
            }
        };
        let entry = &mut part[at];
        if !complete {
            entry.1 = true;
            continue;
        }
        for d in &s.devices {
            entry.2.push(NodeDevice {
                id: Arc::new(DeviceId {
                    driver: pool.0.clone(),
                    pool: pool.1.clone(),
                    device: d.name.clone(),
                }),
                device: d.clone(),
                partitionable,
            });
        }
    }
    part
}

/// A node's view from the parts of its pools, in pool order.
fn node_view(state: &DraState, b: &Built, pools: &BTreeSet<PoolId>, node: &str) -> NodeDevices {
    let mut n = NodeDevices::default();
    for p in pools {
        for (_, incomplete, devices) in b
            .parts
            .get(p)
            .into_iter()
            .flat_map(|x| x.iter())
            .filter(|(at, _, _)| at == node)
        {
            n.incomplete |= incomplete;
            for d in devices {
                n.used.push(state.is_held(&d.id));
                n.devices.push(d.clone());
            }
        }
    }
    n
}

fn build_all(state: &DraState) -> Built {
    let all: BTreeSet<PoolId> = state.pools().keys().cloned().collect();
    let mut b = Built::default();
    patch(&mut b, state, &all);
    b
}

/// Rebuilds the parts of `pools` and the nodes they touch, before or after.
fn patch(b: &mut Built, state: &DraState, pools: &BTreeSet<PoolId>) {
    let mut touched: BTreeSet<String> = BTreeSet::new();
    for p in pools {
        if let Some(old) = b.parts.remove(p) {
            for (node, _, _) in old.iter() {
                touched.insert(node.clone());
                if let Some(ps) = b.node_pools.get_mut(node) {
                    ps.remove(p);
                }
            }
        }
        let part = pool_part(state, p);
        if part.is_empty() {
            continue;
        }
        for (node, _, _) in &part {
            touched.insert(node.clone());
            b.node_pools
                .entry(node.clone())
                .or_default()
                .insert(p.clone());
        }
        b.parts.insert(p.clone(), Arc::new(part));
    }
    for node in touched {
        if let Some(old) = b.nodes.remove(&node) {
            b.devices -= old.devices.len();
        }
        match b.node_pools.get(&node) {
            Some(ps) if !ps.is_empty() => {
                let v = node_view(state, b, ps, &node);
                b.devices += v.devices.len();
                b.nodes.insert(node, Arc::new(v));
            }
            _ => {
                b.node_pools.remove(&node);
            }
        }
    }
}

/// Every node's devices, with class matches computed once per (node, request shape) and
/// kept across decisions.
#[derive(Debug)]
pub struct DraView<'a> {
    pub state: &'a DraState,
    built: Arc<Built>,
    epoch: u64,
    version: u64,
    selectors: Selectors,
}

impl<'a> DraView<'a> {
    pub fn new(state: &'a DraState) -> DraView<'a> {
        let (built, epoch, version) = state.views.current(state);
        // Verdicts on every device for each selector, and as many again for devices and
        // selectors gone since: past that, start over.
        let selectors: usize = state.classes().values().map(|c| c.selectors.len()).sum();
        state
            .verdicts
            .bound(2 * built.devices.saturating_mul(selectors.max(1)) + 4096);
        DraView {
            state,
            built,
            epoch,
            version,
            selectors: Selectors::with(state.verdicts.clone()),
        }
    }

    /// The views of the capacity's usable nodes `nodes`, in their order; kept across
    /// decisions for the index's `layout`.
    pub(crate) fn usable(&self, layout: Option<&Layout>, nodes: &[&Node]) -> Arc<Usable> {
        self.state
            .views
            .usable(&self.built, (self.version, self.epoch), layout, nodes)
    }

    /// The devices of `node`, if any pool publishes on it.
    pub fn node(&self, node: &str) -> Option<&NodeDevices> {
        self.built.nodes.get(node).map(|n| &**n)
    }

    /// The devices of `node` (indices into its `devices`) that `req` may take, in order,
    /// whether in use or not: the class's selectors and the request's.
    pub fn candidates(&mut self, node: &str, req: &Exact) -> Result<Arc<[usize]>, Undecided> {
        let devs = self.built.nodes.get(node).cloned();
        self.candidates_in(devs.as_ref(), req)
    }

    /// [`DraView::candidates`] on a node's devices found already (`None`: it has none).
    pub(crate) fn candidates_in(
        &mut self,
        devs: Option<&Arc<NodeDevices>>,
        req: &Exact,
    ) -> Result<Arc<[usize]>, Undecided> {
        // Nodes without devices have no entry of their own and are answered at once.
        let Some(devs) = devs else {
            return self.compute(&NodeDevices::default(), req).map(Arc::from);
        };
        let epoch = self.epoch;
        if let Some((.., c)) =
            devs.candidates()
                .iter()
                .find(|(e, class, selectors, unmodeled, _)| {
                    *e == epoch
                        && *class == req.class
                        && *selectors == req.selectors
                        && *unmodeled == req.unmodeled
                })
        {
            return c.clone();
        }
        let c = self.compute(devs, req).map(Arc::from);
        let mut kept = devs.candidates();
        kept.retain(|(e, ..)| *e == epoch);
        kept.push((
            epoch,
            req.class.clone(),
            req.selectors.clone(),
            req.unmodeled,
            c.clone(),
        ));
        c
    }

    fn compute(&mut self, devs: &NodeDevices, req: &Exact) -> Result<Vec<usize>, Undecided> {
        let plain = self.state.plain_count.contains(&req.class);
        if let Some(why) = req.unmodeled.filter(|_| !plain) {
            return Err(Undecided(format!(
                "a request for class {} uses {why}",
                req.class
            )));
        }
        let Some(class) = self.state.classes().get(&req.class) else {
            // The scheduler cannot allocate it either: no device matches.
            return Ok(vec![]);
        };
        let mut out = Vec::new();
        for (i, d) in devs.devices.iter().enumerate() {
            let mut all = true;
            for expr in class.selectors.iter().chain(&req.selectors) {
                match self.selectors.matches(expr, &d.id.driver, &d.device) {
                    Ok(true) => {}
                    Ok(false) => {
                        all = false;
                        break;
                    }
                    Err(_) if plain => {}
                    Err(e) => {
                        return Err(Undecided(format!("class {}: {e}", req.class)));
                    }
                }
            }
            if !all {
                continue;
            }
            if !plain {
                let why = d.device.unmodeled.or(d
                    .partitionable
                    .then_some("partitionable devices (sharedCounters)"));
                if let Some(why) = why {
                    return Err(Undecided(format!(
                        "class {} matches device {}/{}/{} with {why}",
                        req.class, d.id.driver, d.id.pool, d.id.device
                    )));
                }
            }
            out.push(i);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Mode;
    use super::super::tests::*;
    use super::*;
    use serde_json::json;

    fn exact(class: &str) -> Exact {
        Exact {
            class: class.into(),
            selectors: vec![],
            mode: Mode::Count(1),
            unmodeled: None,
        }
    }

    #[test]
    fn only_the_newest_complete_generation_counts() {
        let s = state_of(&[
            slice("a-old", "a", "a", 1, 8),
            slice("a-new", "a", "a", 2, 4),
            // b's newest generation says two slices, only one is there.
            slice("b-old", "b", "b", 1, 8),
            slice_with("b-new", "b", "b", 2, 2, 4, "H100"),
            class("gpu", None, None),
        ]);
        let mut v = DraView::new(&s);
        assert_eq!(v.node("a").unwrap().devices.len(), 4);
        assert!(!v.node("a").unwrap().incomplete);
        assert!(v.node("b").unwrap().devices.is_empty());
        assert!(v.node("b").unwrap().incomplete);
        assert_eq!(v.candidates("a", &exact("gpu")).unwrap().len(), 4);
        assert!(v.candidates("c", &exact("gpu")).unwrap().is_empty());
        assert!(v.candidates("a", &exact("nope")).unwrap().is_empty());
    }

    #[test]
    fn allocated_claims_use_devices_and_selectors_filter() {
        let s = state_of(&[
            slice("a", "a", "a", 1, 4),
            slice_with("b", "b", "b", 1, 1, 2, "A100"),
            class(
                "h100",
                Some(r#"device.attributes["gpu.example.com"].productName == "H100""#),
                None,
            ),
            allocated_claim("ns", "c", "a", &["gpu-0", "gpu-2"]),
        ]);
        let mut v = DraView::new(&s);
        assert_eq!(v.node("a").unwrap().used, [true, false, true, false]);
        assert_eq!(v.candidates("a", &exact("h100")).unwrap()[..], [0, 1, 2, 3]);
        assert!(v.candidates("b", &exact("h100")).unwrap().is_empty());
        let mut req = exact("h100");
        req.selectors = vec![r#"device.attributes["gpu.example.com"].index % 2 == 1"#.into()];
        assert_eq!(v.candidates("a", &req).unwrap()[..], [1, 3]);
    }

    #[test]
    fn a_request_raygate_cannot_model_never_shares_an_answer_with_one_it_can() {
        let s = state_of(&[slice("a", "a", "a", 1, 2), class("gpu", None, None)]);
        let mut v = DraView::new(&s);
        assert_eq!(v.candidates("a", &exact("gpu")).unwrap()[..], [0, 1]);
        let mut admin = exact("gpu");
        admin.unmodeled = Some("admin access");
        assert!(v.candidates("a", &admin).is_err());
        assert_eq!(v.candidates("a", &exact("gpu")).unwrap()[..], [0, 1]);
    }

    #[test]
    fn what_cannot_be_decided_is_refused_unless_counted_plainly() {
        let mut tainted = slice("a", "a", "a", 1, 2);
        tainted["spec"]["devices"][1]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
        let mut s = state_of(&[
            tainted,
            class(
                "mem",
                Some(r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("1Gi")) > 0"#),
                None,
            ),
            class("gpu", None, None),
        ]);
        {
            let mut v = DraView::new(&s);
            let e = v.candidates("a", &exact("gpu")).unwrap_err();
            assert!(e.0.contains("device taints"), "{e}");
            let e = v.candidates("a", &exact("mem")).unwrap_err();
            assert!(e.0.contains("class mem"), "{e}");
        }
        s.plain_count.insert("gpu".into());
        s.plain_count.insert("mem".into());
        let mut v = DraView::new(&s);
        assert_eq!(v.candidates("a", &exact("gpu")).unwrap()[..], [0, 1]);
        assert_eq!(v.candidates("a", &exact("mem")).unwrap()[..], [0, 1]);
    }
}
