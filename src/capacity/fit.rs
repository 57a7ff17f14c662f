//! Will the new cluster's pods fit next to the old one? Answered by placing
//! them, one by one, the way the scheduler would have to.
//!
//! Order: `reserved` pods first (other admitted upgrades that are not bound
//! yet: their capacity is promised), then the new pods, each group largest
//! first (accelerators, then cpu, then memory; ties by name). Each pod goes
//! to the feasible node that leaves the least free of its dominant resource
//! (best fit; ties by node name), and its request is taken from that node,
//! so fragmentation shows: two nodes with 8 free GPUs each cannot take one
//! 16-GPU pod.
//!
//! Headroom is a cluster-wide floor, not a per-node one: a new pod is placed
//! only if, afterwards, the summed free amount of each resource it requests
//! stays ≥ the headroom, and the fit also fails if the final free amounts
//! are below it (reserved pods can eat into headroom too). A per-node
//! reading would need a node to hold the whole headroom, which is not what
//! "keep 4 GPUs spare" means.
//!
//! Reserved pods that cannot be placed make the fit fail: the capacity an
//! admitted upgrade counts on is gone, and admitting more would overcommit.
//! Reserved pods already bound to a node in the state are skipped, since
//! they are counted there.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::node::{
    Amounts, Capacity, Names, Rows, SkippedNode, add_amount, amount, capacity, node_name, to_list,
    units_of,
};
use super::requests::{pod_name, pod_requests_borrowed, runtime_class_overhead};
use super::scheduling::{REASON_TOO_MANY_PODS, Wording, aggregate_message, insufficient};
use super::statics::Statics;
use super::{
    CPU, MEMORY, PODS, ResourceList, from_scheduler_units, is_extended_resource, scheduler_units,
    sum,
};
use crate::capacity::ClusterState;
use crate::capacity::dra::{self, DraView, PodDemand, Undecided, alloc::NodeRequest};
use crate::podgroup::PodGroup;

/// What to fit.
#[derive(Clone, Debug, Default)]
pub struct FitRequest {
    /// The new cluster's pods (not created yet), as groups.
    pub pods: Vec<PodGroup>,
    /// Pods of other admitted upgrades that are not bound yet.
    pub reserved: Vec<PodGroup>,
    /// Cluster-wide amounts that must stay free.
    pub headroom: ResourceList,
    /// The old, still running cluster's total, only for `required`.
    pub old_requests: ResourceList,
}

/// A pod that found no node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unplaced {
    pub pod: String,
    pub reason: String,
    /// True for a pod from `FitRequest::reserved`.
    pub reserved: bool,
}

/// The answer, with the numbers behind it. Amounts are in scheduler units
/// (see [`crate::capacity`]); `pods` counts pod slots.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FitReport {
    pub fits: bool,
    /// Old + new: what both clusters need while they run side by side.
    pub required: ResourceList,
    pub new_requests: ResourceList,
    pub old_requests: ResourceList,
    pub reserved: ResourceList,
    pub headroom: ResourceList,
    /// Summed over usable nodes.
    pub allocatable: ResourceList,
    /// Summed over usable nodes, before placing anything.
    pub free: ResourceList,
    /// Per resource, `new + reserved + headroom − free` where positive. It
    /// can be empty while `fits` is false: fragmentation or placement rules.
    pub shortfall: ResourceList,
    pub unplaced: Vec<Unplaced>,
    /// Pod → node, for reserved and new pods alike.
    pub placements: BTreeMap<String, String>,
    pub skipped_nodes: Vec<SkippedNode>,
}

/// One group of identical pods to place (see [`crate::podgroup::PodGroup`]).
pub(crate) struct Entry<'a> {
    /// The first pod's key, for ordering.
    key: String,
    /// Every pod's key, in placement order.
    keys: Vec<String>,
    pod: &'a Pod,
    reserved: bool,
    req: Vec<(usize, i128)>,
    dominant: usize,
    /// (accelerators, cpu, memory), compared descending.
    size: (i128, i128, i128),
    /// What the pod asks of DRA; `None` on a cluster without DRA or a pod asking nothing.
    dra: Option<Rc<PodDemand>>,
    /// Devices its claims ask, per class (`deviceclass.resource.kubernetes.io/<class>`),
    /// counted in the totals and the shortfall only.
    devices: Vec<(usize, i128)>,
    /// Per usable node, its DRA requests there (the devices each may take), built on the
    /// first look at the node: they do not change while placing, only which devices are
    /// held does.
    dra_nodes: std::cell::RefCell<Vec<Option<NodeRequests>>>,
    /// The ids of the extended resources a DeviceClass maps for it (`PodDemand::mapped`).
    dra_mapped: Vec<usize>,
    /// The static filters' feasible nodes less those whose devices can never serve it
    /// (one request, too few candidates whatever is held), built on its first scan.
    dra_feasible: std::cell::RefCell<Option<Rc<[ScanNode]>>>,
}

/// A pod's DRA requests on one node, or why raygate cannot decide them.
type NodeRequests = Result<Rc<[NodeRequest]>, Undecided>;

/// A node of a scan, with the pod's one request there when it is one count of some
/// candidates (the allocator takes the first free ones: it finds them when enough are free).
type ScanNode = (usize, Option<(u32, Arc<[usize]>)>);

fn pod_key(pod: &Pod) -> String {
    match pod.metadata.namespace.as_deref().filter(|n| !n.is_empty()) {
        Some(ns) => format!("{ns}/{}", pod_name(pod)),
        None => pod_name(pod),
    }
}

/// The resource whose leftover decides best fit: the largest accelerator
/// request, else cpu, else memory, else pod slots.
fn dominant(req: &[(usize, i128)], names: &Names) -> usize {
    let name = |i: usize| names.names.get(i).map(String::as_str).unwrap_or("");
    let accel = req
        .iter()
        .filter(|(i, _)| is_extended_resource(name(*i)))
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| name(b.0).cmp(name(a.0))));
    if let Some(&(i, _)) = accel {
        return i;
    }
    for want in [CPU, MEMORY] {
        if let Some(&(i, _)) = req.iter().find(|(i, _)| name(*i) == want) {
            return i;
        }
    }
    names.get(PODS).unwrap_or(0)
}

fn entry<'a>(
    pod: &'a Pod,
    reserved: bool,
    state: &ClusterState,
    names: &mut Names,
) -> crate::Result<Entry<'a>> {
    let mut req = pod_requests_borrowed(pod, &state.limit_ranges)?;
    for (k, v) in runtime_class_overhead(pod, &state.runtime_classes)? {
        req.entry(k)
            .and_modify(|a| *a = a.saturating_add(&v))
            .or_insert(v);
    }
    let req = units_of(&req, names);
    let name = |i: usize| names.names.get(i).map(String::as_str).unwrap_or("");
    let of = |pred: &dyn Fn(&str) -> bool| -> i128 {
        req.iter()
            .filter(|(i, _)| pred(name(*i)))
            .fold(0i128, |acc, (_, u)| acc.saturating_add(*u))
    };
    let size = (
        of(&is_extended_resource),
        of(&|n| n == CPU),
        of(&|n| n == MEMORY),
    );
    let dominant = dominant(&req, names);
    let key = pod_key(pod);
    Ok(Entry {
        keys: vec![key.clone()],
        key,
        pod,
        reserved,
        req,
        dominant,
        size,
        dra: None,
        devices: Vec::new(),
        dra_nodes: Default::default(),
        dra_mapped: Vec::new(),
        dra_feasible: Default::default(),
    })
}

/// Static placement rules depend on these fields only, so pods sharing them
/// (a worker group) share one evaluation over all nodes.
fn signature(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    let required = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    serde_json::json!([
        spec.and_then(|s| s.node_name.as_ref()),
        spec.and_then(|s| s.node_selector.as_ref()),
        required,
        spec.and_then(|s| s.tolerations.as_ref()),
    ])
    .to_string()
}

/// The entry of a group: the template's request, evaluated once, and the
/// keys of its pods (sorted, as single pods would be ordered), leaving out
/// reserved pods already bound (they are counted on their node).
fn group_entry<'a>(
    g: &'a PodGroup,
    reserved: bool,
    state: &ClusterState,
    names: &mut Names,
    bound: &super::node::Bound<'_>,
) -> crate::Result<Option<Entry<'a>>> {
    let ns = g.template.metadata.namespace.clone().unwrap_or_default();
    let mut keys = Vec::with_capacity(g.count);
    for i in 0..g.count {
        let name = g.name(i);
        if reserved && !name.is_empty() && bound.contains(&ns, &name) {
            continue;
        }
        keys.push(match ns.as_str() {
            "" => name,
            ns => format!("{ns}/{name}"),
        });
    }
    if keys.is_empty() {
        return Ok(None);
    }
    keys.sort();
    let mut e = entry(&g.template, reserved, state, names)?;
    e.key = keys[0].clone();
    e.keys = keys;
    Ok(Some(e))
}

/// Knobs that do not change the answer, only how it is told.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FitOptions {
    pub wording: Wording,
}

/// Places every pod; see the module docs for the rules. Reasons use the
/// default [`Wording`] (current releases); see [`fit_with`].
pub fn fit(state: &ClusterState, req: &FitRequest) -> crate::Result<FitReport> {
    fit_with(state, req, &FitOptions::default())
}

/// [`fit`] with explicit options.
pub fn fit_with(
    state: &ClusterState,
    req: &FitRequest,
    opts: &FitOptions,
) -> crate::Result<FitReport> {
    fit_on(&capacity(state)?, state, req, opts)
}

/// [`fit_with`] on capacity already computed (from scratch or read from the
/// index); `rules` gives the LimitRanges and RuntimeClasses for new pods.
pub(crate) fn fit_on(
    cap: &Capacity<'_>,
    rules: &ClusterState,
    req: &FitRequest,
    opts: &FitOptions,
) -> crate::Result<FitReport> {
    let mut p = Placer::new(cap, opts);
    let reserved = p.entries(&req.reserved, true, rules, &cap.bound)?;
    let new = p.entries(&req.pods, false, rules, &cap.bound)?;
    let headroom = p.headroom(&req.headroom);
    let reserved_total = Placer::total(&reserved);
    let (mut placements, mut unplaced) = p.place(&reserved, &headroom);
    let (pl, un) = p.place(&new, &headroom);
    placements.extend(pl);
    unplaced.extend(un);
    Ok(p.report(
        &new,
        &reserved_total,
        &headroom,
        placements.into_iter().collect(),
        unplaced,
        &req.old_requests,
    ))
}

/// A pod's request in scheduler units, shared by the copies of a group.
type Units = Rc<[(usize, i128)]>;

/// Where the undo log stood; see [`Placer::undo`].
pub(crate) struct Mark {
    placed: usize,
    keys: usize,
}

/// Free capacity seen through an overlay, as cluster-autoscaler's delta
/// snapshot: untouched nodes are read from the base rows in place, a node's
/// row is copied on its first write. A decision that places 250 pods copies
/// at most 250 rows, not 5,000.
pub(crate) struct Overlay<'c> {
    base: &'c Rows,
    /// Node → where its copied row starts in `rows`; `usize::MAX` if untouched.
    copied: Vec<usize>,
    rows: Vec<i128>,
}

impl<'c> Overlay<'c> {
    pub(crate) fn new(base: &'c Rows) -> Self {
        Overlay {
            base,
            copied: vec![usize::MAX; base.len()],
            rows: Vec::new(),
        }
    }

    /// What is free on node `n` now.
    pub(crate) fn get(&self, n: usize) -> &[i128] {
        match self.copied.get(n) {
            Some(&at) if at != usize::MAX => &self.rows[at..at + self.base.width()],
            _ => self.base.free(n),
        }
    }

    /// `free[n][r] += x`. Ids past the base's width are resources no node
    /// has: nothing is ever taken from them, so nothing is given back.
    pub(crate) fn add(&mut self, n: usize, r: usize, x: i128) {
        let w = self.base.width();
        if r >= w || n >= self.copied.len() {
            return;
        }
        if self.copied[n] == usize::MAX {
            self.copied[n] = self.rows.len();
            self.rows.extend_from_slice(self.base.free(n));
        }
        let v = &mut self.rows[self.copied[n] + r];
        *v = v.saturating_add(x);
    }
}

/// Free capacity being placed on, with an undo log: one snapshot on which
/// several fits are tried in turn, each kept or reverted in O(its pods).
pub(crate) struct Placer<'c, 'a> {
    cap: &'c Capacity<'a>,
    wording: Wording,
    names: Names,
    free: Overlay<'c>,
    free_before: Amounts,
    cluster_free: Amounts,
    allocatable: Amounts,
    /// Per placement signature, computed (or found in the index's cache)
    /// on first use.
    statics: HashMap<String, Arc<Statics>>,
    /// Every pod placed, in order.
    placed: Vec<Placed>,
    /// Devices on the usable nodes, when the cluster has DRA objects.
    dra: Option<DraRun<'a>>,
    /// Keys handed out, for `name#2` on duplicates.
    seen: HashMap<String, usize>,
    seen_log: Vec<String>,
}

impl<'c, 'a> Placer<'c, 'a> {
    pub(crate) fn new(cap: &'c Capacity<'a>, opts: &FitOptions) -> Self {
        let names = cap.names.clone().into_owned();
        let free_before = cap.rows.total_free();
        Placer {
            cap,
            wording: opts.wording,
            names,
            cluster_free: free_before.clone(),
            free_before,
            allocatable: cap.rows.total_allocatable(),
            free: Overlay::new(&cap.rows),
            statics: HashMap::new(),
            dra: cap.dra.map(|state| DraRun::new(state, cap)),
            placed: Vec::new(),
            seen: HashMap::new(),
            seen_log: Vec::new(),
        }
    }

    /// Entries for `groups`, sorted largest first, keys made unique.
    pub(crate) fn entries<'g>(
        &mut self,
        groups: &'g [PodGroup],
        reserved: bool,
        rules: &ClusterState,
        bound: &super::node::Bound<'_>,
    ) -> crate::Result<Vec<Entry<'g>>> {
        let mut out = Vec::new();
        for g in groups {
            if let Some(mut e) = group_entry(g, reserved, rules, &mut self.names, bound)? {
                self.demand(&mut e, rules)?;
                out.push(e);
            }
        }
        out.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.key.cmp(&b.key)));
        for e in out.iter_mut() {
            for key in e.keys.iter_mut() {
                let n = self.seen.entry(key.clone()).or_insert(0);
                *n += 1;
                let original = key.clone();
                if *n > 1 {
                    *key = format!("{key}#{n}");
                }
                self.seen_log.push(original);
            }
            e.key = e.keys.first().cloned().unwrap_or_default();
        }
        Ok(out)
    }

    pub(crate) fn headroom(&mut self, list: &ResourceList) -> Amounts {
        let mut headroom = Amounts::new();
        for (k, q) in list {
            add_amount(
                &mut headroom,
                self.names.id(k),
                scheduler_units(k, q).max(0),
            );
        }
        headroom
    }

    /// The summed request of the entries.
    pub(crate) fn total(entries: &[Entry<'_>]) -> Amounts {
        let mut t = Amounts::new();
        for e in entries {
            let n = e.keys.len() as i128;
            for &(r, u) in e.req.iter().chain(&e.devices) {
                add_amount(&mut t, r, u.saturating_mul(n));
            }
        }
        t
    }

    pub(crate) fn mark(&self) -> Mark {
        Mark {
            placed: self.placed.len(),
            keys: self.seen_log.len(),
        }
    }

    /// Gives back what was placed (and the keys handed out) since `m`.
    pub(crate) fn undo(&mut self, m: Mark) {
        while self.placed.len() > m.placed {
            let Some(p) = self.placed.pop() else {
                break;
            };
            for &(r, u) in p.units.iter() {
                self.free.add(p.node, r, u);
                add_amount(&mut self.cluster_free, r, u);
            }
            for &(r, u) in &p.cluster_only {
                add_amount(&mut self.cluster_free, r, u);
            }
            if let Some(d) = self.dra.as_mut() {
                d.release(p.node, &p.devices);
            }
        }
        while self.seen_log.len() > m.keys {
            let Some(k) = self.seen_log.pop() else { break };
            if let Some(n) = self.seen.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.seen.remove(&k);
                }
            }
        }
    }

    /// Places every pod of `entries` in order (see the module docs); new
    /// pods (not reserved) also keep the cluster-wide `headroom`.
    pub(crate) fn place(
        &mut self,
        entries: &[Entry<'_>],
        headroom: &Amounts,
    ) -> (Vec<(String, String)>, Vec<Unplaced>) {
        let mut placements = Vec::new();
        let mut unplaced = Vec::new();
        for e in entries {
            self.place_group(e, headroom, &mut placements, &mut unplaced);
        }
        (placements, unplaced)
    }

    /// Places the copies of one entry. Once a copy went to a node, that node
    /// stays the best while it fits (only its leftover went down), so the
    /// next copy needs no scan; the copies after a failure fail alike.
    fn place_group(
        &mut self,
        e: &Entry<'_>,
        headroom: &Amounts,
        placements: &mut Vec<(String, String)>,
        unplaced: &mut Vec<Unplaced>,
    ) {
        let statics = self.statics_for(e.pod);
        let req: Units = e.req.clone().into();
        let mut last: Option<usize> = None;
        for (k, key) in e.keys.iter().enumerate() {
            let chosen = match last.map(|n| self.fits(e, n).map(|d| d.map(|d| (n, d)))) {
                Some(Ok(Some(c))) => Ok(Some(c)),
                Some(Err(u)) => Err(u),
                _ => self.best_node(e, &statics.feasible),
            };
            let chosen = match chosen {
                Ok(c) => c,
                Err(u) => {
                    let reason = undecided_reason(&u);
                    unplaced.extend(e.keys[k..].iter().map(|key| Unplaced {
                        pod: key.clone(),
                        reason: reason.clone(),
                        reserved: e.reserved,
                    }));
                    return;
                }
            };
            let (chosen, devices) = match chosen {
                Some((n, d)) => (Some(n), d),
                None => (None, Vec::new()),
            };
            if let Some(reason) = self.failure(e, chosen, &statics, headroom) {
                unplaced.extend(e.keys[k..].iter().map(|key| Unplaced {
                    pod: key.clone(),
                    reason: reason.clone(),
                    reserved: e.reserved,
                }));
                return;
            }
            let Some(n) = chosen else { return };
            self.take(e, n, &req, devices);
            placements.push((key.clone(), node_name(self.cap.nodes[n]).to_string()));
            last = Some(n);
        }
    }

    /// The static filters of `pod` on every node, evaluated once per
    /// placement signature (and kept by the index across decisions).
    fn statics_for(&mut self, pod: &Pod) -> Arc<Statics> {
        let sig = signature(pod);
        if let Some(s) = self.statics.get(&sig) {
            return s.clone();
        }
        let s = match self.cap.statics {
            Some((cache, nodes)) => {
                cache.get((sig.clone(), self.wording), pod, nodes, self.wording)
            }
            None => Arc::new(Statics::compute(pod, &self.cap.nodes, self.wording)),
        };
        self.statics.insert(sig, s.clone());
        s
    }

    /// Whether node `n` has room for one copy of `e` now: `Some(devices it takes)`.
    fn fits(&mut self, e: &Entry<'_>, n: usize) -> Result<Option<Vec<usize>>, Undecided> {
        if !self.rows_fit(e, n) {
            return Ok(None);
        }
        match (&e.dra, self.dra.as_mut()) {
            (Some(d), Some(run)) => run.allocate(e, d, n, &self.cap.rows, &self.names),
            _ => Ok(Some(Vec::new())),
        }
    }

    /// [`Placer::fits`] without the devices: what the scan of every node asks.
    fn can_fit(&mut self, e: &Entry<'_>, n: usize) -> Result<bool, Undecided> {
        if !self.rows_fit(e, n) {
            return Ok(false);
        }
        match (&e.dra, self.dra.as_mut()) {
            (Some(d), Some(run)) => run.can_allocate(e, d, n, &self.cap.rows, &self.names),
            _ => Ok(true),
        }
    }

    /// The node's rows have room for `e`; an extended resource a DeviceClass maps does not
    /// count where the node's allocatable has none of it (DRA serves it there).
    fn rows_fit(&self, e: &Entry<'_>, n: usize) -> bool {
        let f = self.free.get(n);
        e.req
            .iter()
            .all(|&(r, u)| amount(f, r) >= u || self.served_by_dra(e, n, r))
    }

    fn served_by_dra(&self, e: &Entry<'_>, n: usize, r: usize) -> bool {
        e.dra.is_some() && e.dra_mapped.contains(&r) && amount(self.cap.rows.allocatable(n), r) == 0
    }

    /// The nodes a scan for `e` visits: the static filters' feasible nodes, less (for a
    /// pod asking DRA devices) those that would answer "no" to it whatever is placed, each
    /// with its one-count request when that is all it asks there ([`DraRun::shortcut`]).
    /// Kept in the order given, so the first node whose devices raygate cannot decide
    /// is still the first met.
    fn scan_list(&mut self, e: &Entry<'_>, feasible: &[usize]) -> Option<Rc<[ScanNode]>> {
        let (Some(d), Some(run)) = (&e.dra, self.dra.as_mut()) else {
            return None;
        };
        if let Some(l) = e.dra_feasible.borrow().as_ref() {
            return Some(l.clone());
        }
        let (rows, names) = (&self.cap.rows, &self.names);
        let list: Rc<[ScanNode]> = feasible
            .iter()
            .copied()
            .filter(|&n| !run.never(e, d, n, rows, names))
            .collect::<Vec<usize>>()
            .into_iter()
            .map(|n| (n, run.shortcut(e, d, n, rows, names)))
            .collect();
        *e.dra_feasible.borrow_mut() = Some(list.clone());
        Some(list)
    }

    /// [`Placer::can_fit`] on a node of the scan list.
    fn can_fit_scanned(&mut self, e: &Entry<'_>, node: &ScanNode) -> Result<bool, Undecided> {
        let (n, shortcut) = node;
        match (shortcut, self.dra.as_ref()) {
            (Some((k, cands)), Some(run)) => {
                Ok(self.rows_fit(e, *n) && run.free_among(*n, cands) >= *k as usize)
            }
            _ => self.can_fit(e, *n),
        }
    }

    /// Best fit: the feasible node that leaves the least of the dominant
    /// resource, first by name on ties. On a node where DRA serves the dominant resource,
    /// its leftover is the devices left.
    fn best_node(
        &mut self,
        e: &Entry<'_>,
        feasible: &[usize],
    ) -> Result<Option<(usize, Vec<usize>)>, Undecided> {
        let dom_req = e
            .req
            .iter()
            .find(|(r, _)| *r == e.dominant)
            .map_or(0, |x| x.1);
        let list = self.scan_list(e, feasible);
        let plain: Vec<ScanNode>;
        let nodes: &[ScanNode] = match &list {
            Some(l) => l,
            None => {
                plain = feasible.iter().map(|&n| (n, None)).collect();
                &plain
            }
        };
        let mut best: Option<(i128, usize)> = None;
        for node in nodes {
            let n = node.0;
            if !self.can_fit_scanned(e, node)? {
                continue;
            }
            let left = if self.served_by_dra(e, n, e.dominant) {
                self.dra.as_ref().map_or(0, |d| d.free_devices(n)) - dom_req
            } else {
                amount(self.free.get(n), e.dominant) - dom_req
            };
            if best.as_ref().is_none_or(|(b, _)| left < *b) {
                best = Some((left, n));
            }
        }
        let Some((_, n)) = best else {
            return Ok(None);
        };
        // The devices, on the chosen node only.
        Ok(self.fits(e, n)?.map(|d| (n, d)))
    }

    /// Why a copy of `e` cannot go to `chosen`, if it cannot: no node took
    /// it, or (new pods only) it would eat into the headroom.
    fn failure(
        &self,
        e: &Entry<'_>,
        chosen: Option<usize>,
        statics: &Statics,
        headroom: &Amounts,
    ) -> Option<String> {
        match chosen {
            None => Some(explain(
                e,
                statics,
                &self.free,
                &self.names,
                &self.cap.skipped,
                &|n| self.rows_fit(e, n),
            )),
            Some(_) if !e.reserved => {
                headroom_violation(e, &self.cluster_free, headroom, &self.names)
            }
            Some(_) => None,
        }
    }

    /// Takes one copy's request (and `devices`) from node `n`, in the undo log. Extended
    /// resources DRA serves on `n` leave the node's row alone but count cluster-wide.
    fn take(&mut self, e: &Entry<'_>, n: usize, req: &Units, devices: Vec<usize>) {
        let mut cluster_only: Vec<(usize, i128)> = e.devices.clone();
        let units: Units =
            if e.dra.is_some() && req.iter().any(|&(r, _)| self.served_by_dra(e, n, r)) {
                let (dra, rows): (Vec<_>, Vec<_>) = req
                    .iter()
                    .copied()
                    .partition(|&(r, _)| self.served_by_dra(e, n, r));
                cluster_only.extend(dra);
                rows.into()
            } else {
                req.clone()
            };
        for &(r, u) in units.iter() {
            self.free.add(n, r, -u);
            add_amount(&mut self.cluster_free, r, -u);
        }
        for &(r, u) in &cluster_only {
            add_amount(&mut self.cluster_free, r, -u);
        }
        if let Some(d) = self.dra.as_mut() {
            d.hold(n, &devices);
        }
        self.placed.push(Placed {
            node: n,
            units,
            cluster_only,
            devices,
        });
    }

    /// Resolves `e`'s DRA demand, and credits the totals with the devices of the classes
    /// it names (once per class).
    fn demand(&mut self, e: &mut Entry<'_>, rules: &ClusterState) -> crate::Result<()> {
        let Some(run) = self.dra.as_mut() else {
            return Ok(());
        };
        // Only extended resources map to devices: overhead (cpu, memory) cannot.
        let req: ResourceList = pod_requests_borrowed(e.pod, &rules.limit_ranges)?
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let d = dra::pod_demand(e.pod, &req, run.view.state);
        if d.is_empty() {
            return Ok(());
        }
        for r in &d.claims {
            if let Some(x) = r.alternatives.first() {
                let id = self
                    .names
                    .id(&format!("{}{}", dra::IMPLICIT_PREFIX, x.class));
                if let dra::Mode::Count(k) = x.mode {
                    add_amount_pair(&mut e.devices, id, i128::from(k));
                    e.size.0 = e.size.0.saturating_add(i128::from(k));
                }
            }
        }
        let credit = run.credit(&d, &self.cap.rows, &mut self.names);
        for (id, total, free, now) in credit {
            add_amount(&mut self.allocatable, id, total);
            add_amount(&mut self.free_before, id, free);
            add_amount(&mut self.cluster_free, id, now);
        }
        e.dra_mapped = d
            .mapped
            .iter()
            .filter_map(|(m, _, _)| self.names.get(m))
            .collect();
        e.dra = Some(Rc::new(d));
        Ok(())
    }

    /// The answer for `new` placed after reservations totalling `reserved`.
    pub(crate) fn report(
        &self,
        new: &[Entry<'_>],
        reserved: &Amounts,
        headroom: &Amounts,
        placements: BTreeMap<String, String>,
        unplaced: Vec<Unplaced>,
        old_requests: &ResourceList,
    ) -> FitReport {
        let width = self.names.names.len();
        let new_total = Self::total(new);
        // Only where there is a headroom: a device class's free count is an estimate (a
        // `firstAvailable` request counts its first alternative) and may go below zero.
        let headroom_kept = (0..width).all(|r| {
            let h = amount(headroom, r);
            h <= 0 || amount(&self.cluster_free, r) >= h
        });
        let mut shortfall = Amounts::new();
        for r in 0..width {
            let need = amount(&new_total, r)
                .saturating_add(amount(reserved, r))
                .saturating_add(amount(headroom, r))
                .saturating_sub(amount(&self.free_before, r));
            if need > 0 {
                add_amount(&mut shortfall, r, need);
            }
        }
        let new_requests = to_list(&new_total, &self.names);
        FitReport {
            fits: unplaced.is_empty() && headroom_kept,
            required: sum(old_requests, &new_requests),
            new_requests,
            old_requests: old_requests.clone(),
            reserved: to_list(reserved, &self.names),
            headroom: to_list(headroom, &self.names),
            allocatable: to_list(&self.allocatable, &self.names),
            free: to_list(&self.free_before, &self.names),
            shortfall: to_list(&shortfall, &self.names),
            unplaced,
            placements,
            skipped_nodes: self.cap.skipped.to_vec(),
        }
    }
}

/// Why no node took the pod, as the scheduler's aggregated message. Nodes
/// are counted per reason id and per resource first; the message's strings
/// are made once per reason, not once per node. A node whose rows fit
/// (`rows_fit`) failed on DRA devices.
fn explain(
    e: &Entry<'_>,
    statics: &Statics,
    free: &Overlay<'_>,
    names: &Names,
    skipped: &[SkippedNode],
    rows_fit: &dyn Fn(usize) -> bool,
) -> String {
    if let Some(why) = e.dra.as_ref().and_then(|d| d.impossible.as_ref()) {
        return why.clone();
    }
    let mut devices = 0usize;
    let (verdicts, reason_text) = (&statics.verdicts, &statics.reasons);
    let mut by_reason = vec![0usize; reason_text.len()];
    let mut by_resource = vec![0usize; names.names.len()];
    for (n, verdict) in verdicts.iter().enumerate() {
        if let Some(id) = verdict {
            if let Some(c) = by_reason.get_mut(*id) {
                *c += 1;
            }
            continue;
        }
        if rows_fit(n) {
            devices += 1;
            continue;
        }
        let f = free.get(n);
        for &(r, u) in &e.req {
            if amount(f, r) < u
                && let Some(c) = by_resource.get_mut(r)
            {
                *c += 1;
            }
        }
    }
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut bump = |r: String, k: usize| {
        if k > 0 {
            *reasons.entry(r).or_insert(0) += k;
        }
    };
    for s in skipped {
        bump(s.scheduler_reason.to_string(), 1);
    }
    bump(REASON_DEVICES.to_string(), devices);
    for (text, &k) in reason_text.iter().zip(&by_reason) {
        bump(text.clone(), k);
    }
    for (name, &k) in names.names.iter().zip(&by_resource) {
        if name == PODS {
            bump(REASON_TOO_MANY_PODS.to_string(), k);
        } else {
            bump(insufficient(name), k);
        }
    }
    aggregate_message(verdicts.len() + skipped.len(), &reasons)
}

/// The scheduler's words for a node whose devices cannot satisfy the pod's claims.
pub const REASON_DEVICES: &str = "cannot allocate all claims";

/// The reason of a pod raygate cannot place because it cannot decide its devices.
fn undecided_reason(u: &Undecided) -> String {
    format!(
        "raygate cannot decide its DRA devices exactly: {u} (--dra-plain-count-class CLASS \
         counts a class's devices as plain units)"
    )
}

fn add_amount_pair(v: &mut Vec<(usize, i128)>, id: usize, x: i128) {
    match v.iter_mut().find(|(r, _)| *r == id) {
        Some(p) => p.1 = p.1.saturating_add(x),
        None => v.push((id, x)),
    }
}

/// One pod placed, for the undo log.
struct Placed {
    node: usize,
    /// Taken from the node's row and cluster-wide.
    units: Units,
    /// Taken cluster-wide only: devices, and extended resources DRA served.
    cluster_only: Vec<(usize, i128)>,
    /// Devices held on the node.
    devices: Vec<usize>,
}

/// The devices of the usable nodes while placing: which are held, by the cluster's claims
/// and by pods placed so far.
pub(crate) struct DraRun<'a> {
    view: DraView<'a>,
    /// Per usable node: its name, whether a pool is incomplete, and device busy flags.
    nodes: Vec<(&'a str, bool, Vec<bool>)>,
    /// Totals already credited, by resource name.
    credited: std::collections::HashSet<String>,
}

impl<'a> DraRun<'a> {
    fn new(state: &'a dra::DraState, cap: &Capacity<'a>) -> DraRun<'a> {
        let view = DraView::new(state);
        let nodes = cap
            .nodes
            .iter()
            .map(|&node| {
                let name: &'a str = node_name(node);
                match view.node(name) {
                    Some(d) => (name, d.incomplete, d.used.clone()),
                    None => (name, false, Vec::new()),
                }
            })
            .collect();
        DraRun {
            view,
            nodes,
            credited: Default::default(),
        }
    }

    fn free_devices(&self, n: usize) -> i128 {
        self.nodes.get(n).map_or(0, |(_, _, used)| {
            used.iter().filter(|u| !**u).count() as i128
        })
    }

    fn hold(&mut self, n: usize, devices: &[usize]) {
        if let Some((_, _, used)) = self.nodes.get_mut(n) {
            for &d in devices {
                if let Some(u) = used.get_mut(d) {
                    *u = true;
                }
            }
        }
    }

    fn release(&mut self, n: usize, devices: &[usize]) {
        if let Some((_, _, used)) = self.nodes.get_mut(n) {
            for &d in devices {
                if let Some(u) = used.get_mut(d) {
                    *u = false;
                }
            }
        }
    }

    /// The requests of `d` (entry `e`) on node `n` and the devices they would take.
    fn allocate(
        &mut self,
        e: &Entry<'_>,
        d: &PodDemand,
        n: usize,
        rows: &super::node::Rows,
        names: &Names,
    ) -> Result<Option<Vec<usize>>, Undecided> {
        let Some(reqs) = self.requests_on(e, d, n, rows, names)? else {
            return Ok(None);
        };
        let (_, incomplete, used) = &self.nodes[n];
        dra::allocate(used, *incomplete, &reqs)
    }

    /// Whether node `n` answers `Ok(false)` to `d` whatever is held: one request (so no
    /// search before it can exceed the allocator's bound), none of whose alternatives has
    /// enough candidates.
    fn never(
        &mut self,
        e: &Entry<'_>,
        d: &PodDemand,
        n: usize,
        rows: &super::node::Rows,
        names: &Names,
    ) -> bool {
        match self.requests_on(e, d, n, rows, names) {
            Ok(None) => true,
            Ok(Some(reqs)) => match &reqs[..] {
                [r] => r.alternatives.iter().all(|(mode, cands)| match mode {
                    dra::Mode::Count(k) => cands.len() < *k as usize,
                    dra::Mode::All => cands.is_empty(),
                }),
                _ => false,
            },
            Err(_) => false,
        }
    }

    /// The one-count request of `d` on node `n`, when that is all it asks there and
    /// [`DraRun::can_allocate`]'s shortcut answers for it.
    fn shortcut(
        &mut self,
        e: &Entry<'_>,
        d: &PodDemand,
        n: usize,
        rows: &super::node::Rows,
        names: &Names,
    ) -> Option<(u32, Arc<[usize]>)> {
        let reqs = self.requests_on(e, d, n, rows, names).ok()??;
        match &reqs[..] {
            [r] => match &r.alternatives[..] {
                [(dra::Mode::Count(k), cands)] if cands.len() <= dra::alloc::MAX_STEPS => {
                    Some((*k, cands.clone()))
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// How many of `cands` are free on node `n` now.
    fn free_among(&self, n: usize, cands: &[usize]) -> usize {
        let used = self.nodes.get(n).map_or(&[][..], |x| x.2.as_slice());
        cands
            .iter()
            .filter(|&&c| !used.get(c).copied().unwrap_or(true))
            .count()
    }

    /// Whether [`DraRun::allocate`] finds devices. One request of a count (a mapped
    /// extended resource, a one-request claim) is taken first fit, never backtracked: it
    /// finds devices exactly when enough of its candidates are free, counted without
    /// building the allocation.
    fn can_allocate(
        &mut self,
        e: &Entry<'_>,
        d: &PodDemand,
        n: usize,
        rows: &super::node::Rows,
        names: &Names,
    ) -> Result<bool, Undecided> {
        let Some(reqs) = self.requests_on(e, d, n, rows, names)? else {
            return Ok(false);
        };
        let (_, incomplete, used) = &self.nodes[n];
        if let [r] = &reqs[..]
            && let [(dra::Mode::Count(k), cands)] = &r.alternatives[..]
            && cands.len() <= dra::alloc::MAX_STEPS
        {
            let free = cands
                .iter()
                .filter(|&&c| !used.get(c).copied().unwrap_or(true))
                .count();
            return Ok(free >= *k as usize);
        }
        Ok(dra::allocate(used, *incomplete, &reqs)?.is_some())
    }

    /// The requests of `d` on node `n` (`None`: none can be satisfied), kept in the entry.
    fn requests_on(
        &mut self,
        e: &Entry<'_>,
        d: &PodDemand,
        n: usize,
        rows: &super::node::Rows,
        names: &Names,
    ) -> Result<Option<Rc<[NodeRequest]>>, Undecided> {
        if let Some(u) = &d.undecided {
            return Err(u.clone());
        }
        if d.impossible.is_some() || n >= self.nodes.len() {
            return Ok(None);
        }
        let mut kept = e.dra_nodes.borrow_mut();
        if kept.len() < self.nodes.len() {
            kept.resize(self.nodes.len(), None);
        }
        if let Some(r) = &kept[n] {
            return r.clone().map(Some);
        }
        let r = self.node_requests(d, n, rows, names).map(Rc::from);
        kept[n] = Some(r.clone());
        r.map(Some)
    }

    /// The requests of `d` on node `n`: per alternative, the devices it may take.
    fn node_requests(
        &mut self,
        d: &PodDemand,
        n: usize,
        rows: &super::node::Rows,
        names: &Names,
    ) -> Result<Vec<NodeRequest>, Undecided> {
        let node = self.nodes[n].0;
        let mut reqs = Vec::with_capacity(d.claims.len() + d.mapped.len());
        for r in &d.claims {
            let mut alternatives = Vec::with_capacity(r.alternatives.len());
            for x in &r.alternatives {
                alternatives.push((x.mode, self.view.candidates(node, x)?));
            }
            reqs.push(NodeRequest { alternatives });
        }
        for (resource, count, class) in &d.mapped {
            let on_node = names
                .get(resource)
                .is_some_and(|r| amount(rows.allocatable(n), r) > 0);
            if on_node {
                continue; // a device plugin serves it here
            }
            let x = dra::Exact {
                class: class.clone(),
                selectors: Vec::new(),
                mode: dra::Mode::Count(*count),
                unmodeled: None,
            };
            let c = self.view.candidates(node, &x)?;
            reqs.push(NodeRequest {
                alternatives: vec![(x.mode, c)],
            });
        }
        Ok(reqs)
    }

    /// Totals to credit for the classes `d` names, once each: (resource id, allocatable,
    /// free before, free now). A class's own total is its matching devices on every usable
    /// node; an extended resource it maps counts them where the node's allocatable has none.
    fn credit(
        &mut self,
        d: &PodDemand,
        rows: &super::node::Rows,
        names: &mut Names,
    ) -> Vec<(usize, i128, i128, i128)> {
        let mut wanted: Vec<(String, String, Option<String>)> = Vec::new();
        for r in &d.claims {
            for x in &r.alternatives {
                wanted.push((
                    format!("{}{}", dra::IMPLICIT_PREFIX, x.class),
                    x.class.clone(),
                    None,
                ));
            }
        }
        for (resource, _, class) in &d.mapped {
            wanted.push((resource.clone(), class.clone(), Some(resource.clone())));
        }
        let mut out = Vec::new();
        for (name, class, mapped) in wanted {
            if !self.credited.insert(name.clone()) {
                continue;
            }
            let x = dra::Exact {
                class,
                selectors: Vec::new(),
                mode: dra::Mode::Count(1),
                unmodeled: None,
            };
            let id = names.id(&name);
            let (mut total, mut free, mut now) = (0i128, 0i128, 0i128);
            for n in 0..self.nodes.len() {
                let node = self.nodes[n].0;
                if mapped.is_some() && amount(rows.allocatable(n), id) > 0 {
                    continue;
                }
                // No device on the node: it adds nothing (whatever the request).
                if self.nodes[n].2.is_empty() {
                    continue;
                }
                let Ok(c) = self.view.candidates(node, &x) else {
                    continue;
                };
                let base = self
                    .view
                    .node(node)
                    .map(|d| d.used.as_slice())
                    .unwrap_or(&[]);
                let busy = &self.nodes[n].2;
                total += c.len() as i128;
                free += c
                    .iter()
                    .filter(|&&i| !base.get(i).copied().unwrap_or(true))
                    .count() as i128;
                now += c
                    .iter()
                    .filter(|&&i| !busy.get(i).copied().unwrap_or(true))
                    .count() as i128;
            }
            out.push((id, total, free, now));
        }
        out
    }
}

/// A reason if placing `e` would take cluster-wide free below headroom.
fn headroom_violation(
    e: &Entry<'_>,
    cluster_free: &Amounts,
    headroom: &Amounts,
    names: &Names,
) -> Option<String> {
    e.req.iter().find_map(|&(r, u)| {
        let h = amount(headroom, r);
        let after = amount(cluster_free, r) - u;
        if h > 0 && after < h {
            let n = names.names.get(r).map(String::as_str).unwrap_or("");
            Some(format!(
                "placing it would leave {} {n} free cluster-wide, below the headroom of {}",
                from_scheduler_units(n, after.max(0)),
                from_scheduler_units(n, h)
            ))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::canonical_map;
    use crate::capacity::node::tests::{node, pod};
    use crate::quantity::Quantity;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::{Value, json};

    fn gpu_node(name: &str, gpus: u32) -> Node {
        node(
            name,
            json!({"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": gpus.to_string()}),
            json!({"pool": "gpu"}),
        )
    }

    fn gpu_pod(name: &str, gpus: u32) -> Pod {
        pod(
            name,
            json!({"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": gpus.to_string()}),
            None,
        )
    }

    fn state(nodes: Vec<Node>, pods: Vec<Pod>) -> ClusterState {
        ClusterState {
            nodes,
            pods: pods
                .iter()
                .map(crate::capacity::PodRecord::from_pod)
                .collect(),
            ..Default::default()
        }
    }

    fn request(pods: Vec<Pod>) -> FitRequest {
        FitRequest {
            pods: groups(pods),
            ..Default::default()
        }
    }

    fn groups(pods: Vec<Pod>) -> Vec<PodGroup> {
        pods.into_iter().map(PodGroup::from).collect()
    }

    fn list(pairs: &[(&str, &str)]) -> ResourceList {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity::parse(v).unwrap()))
            .collect()
    }

    fn strings(l: &ResourceList) -> Vec<(String, String)> {
        canonical_map(l).into_iter().collect()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn fits_and_places_deterministically() {
        let s = state(vec![gpu_node("b", 8), gpu_node("a", 8)], vec![]);
        let r = fit(&s, &request(vec![gpu_pod("w-1", 8), gpu_pod("w-0", 8)])).unwrap();
        assert!(r.fits);
        assert!(r.unplaced.is_empty());
        assert!(r.shortfall.is_empty());
        // Equal size: sorted by key; equal leftover: node by name.
        assert_eq!(
            r.placements,
            BTreeMap::from([
                ("default/w-0".to_string(), "a".to_string()),
                ("default/w-1".to_string(), "b".to_string()),
            ])
        );
        assert_eq!(
            strings(&r.new_requests),
            pairs(&[
                ("cpu", "8"),
                ("memory", "32Gi"),
                ("nvidia.com/gpu", "16"),
                ("pods", "2")
            ])
        );
        assert_eq!(canonical_map(&r.allocatable)["nvidia.com/gpu"], "16");
        assert_eq!(canonical_map(&r.free)["pods"], "220");
        // Same input, same answer.
        let again = fit(&s, &request(vec![gpu_pod("w-0", 8), gpu_pod("w-1", 8)])).unwrap();
        assert_eq!(again, r);
    }

    #[test]
    fn a_group_places_like_its_copies() {
        let s = state(
            vec![gpu_node("a", 8), gpu_node("b", 8), gpu_node("c", 4)],
            vec![pod("used", json!({"nvidia.com/gpu": "2"}), Some("b"))],
        );
        let mut t = gpu_pod("w-0", 2);
        t.metadata.namespace = Some("ml".into());
        let group = PodGroup::indexed(t, 11, "w-".into());
        let one_by_one = FitRequest {
            pods: groups(crate::podgroup::expand(std::slice::from_ref(&group))),
            ..Default::default()
        };
        let grouped = FitRequest {
            pods: vec![group],
            ..Default::default()
        };
        let a = fit(&s, &one_by_one).unwrap();
        let b = fit(&s, &grouped).unwrap();
        assert_eq!(a, b);
        assert!(!b.fits);
        // 6 + 8 + 4 = 18 free GPUs: 9 pods of 2 placed, 2 left over.
        assert_eq!(b.placements.len(), 9);
        assert_eq!(b.unplaced.len(), 2);
    }

    proptest::proptest! {
        /// The overlay reads exactly as a full copy of the free rows that
        /// every write went to.
        #[test]
        fn the_overlay_reads_as_a_copy(
            ops in proptest::collection::vec((0..6usize, 0..5usize, -9i128..9), 0..40),
        ) {
            let mut rows = Rows::new(4, 6);
            for n in 0..6i128 {
                rows.push(&[10 + n, 8, 3, 0], &[1, 2 * n, 0, 0], 1);
            }
            let mut copy: Vec<Vec<i128>> = (0..6).map(|n| rows.free(n).to_vec()).collect();
            let mut o = Overlay::new(&rows);
            for (n, r, x) in ops {
                o.add(n, r, x);
                if r < 4 {
                    copy[n][r] += x;
                }
                for (m, row) in copy.iter().enumerate() {
                    proptest::prop_assert_eq!(o.get(m), &row[..]);
                }
            }
        }
    }

    #[test]
    fn undo_gives_back_every_row() {
        let s = state(
            vec![gpu_node("a", 8), gpu_node("b", 8), gpu_node("c", 4)],
            vec![pod("used", json!({"nvidia.com/gpu": "2"}), Some("b"))],
        );
        let cap = capacity(&s).unwrap();
        let mut p = Placer::new(&cap, &FitOptions::default());
        let rules = ClusterState::default();
        let mark = p.mark();
        let group = PodGroup::indexed(gpu_pod("w-0", 2), 7, "w-".into());
        let new = p
            .entries(std::slice::from_ref(&group), false, &rules, &cap.bound)
            .unwrap();
        let (placed, _) = p.place(&new, &Amounts::new());
        assert_eq!(placed.len(), 7);
        assert_ne!(p.free.get(0), cap.free(0));
        p.undo(mark);
        for n in 0..cap.nodes.len() {
            assert_eq!(p.free.get(n), cap.free(n), "node {n}");
        }
        assert_eq!(p.cluster_free, p.free_before);
        // The same group again, after the undo, places as on a fresh placer.
        let again = p
            .entries(std::slice::from_ref(&group), false, &rules, &cap.bound)
            .unwrap();
        let (placed_again, _) = p.place(&again, &Amounts::new());
        assert_eq!(placed_again, placed);
    }

    #[test]
    fn fragmentation_is_not_capacity() {
        let s = state(vec![gpu_node("a", 8), gpu_node("b", 8)], vec![]);
        let r = fit(&s, &request(vec![gpu_pod("big", 16)])).unwrap();
        assert!(!r.fits);
        assert!(r.shortfall.is_empty(), "{:?}", r.shortfall);
        assert_eq!(
            r.unplaced,
            [Unplaced {
                pod: "default/big".to_string(),
                reason: "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.".to_string(),
                reserved: false,
            }]
        );
    }

    #[test]
    fn best_fit_picks_the_tightest_node() {
        let s = state(
            vec![gpu_node("a", 8), gpu_node("b", 8), gpu_node("c", 8)],
            vec![
                pod("used-b", json!({"nvidia.com/gpu": "4"}), Some("b")),
                pod("used-c", json!({"nvidia.com/gpu": "6"}), Some("c")),
            ],
        );
        let r = fit(
            &s,
            &request(vec![gpu_pod("x", 2), gpu_pod("y", 4), gpu_pod("z", 8)]),
        )
        .unwrap();
        assert!(r.fits);
        // z (8) first: only a. y (4): b leaves 0. x (2): c leaves 0.
        let got: Vec<(&str, &str)> = r
            .placements
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            [("default/x", "c"), ("default/y", "b"), ("default/z", "a")]
        );
    }

    #[test]
    fn largest_pods_are_placed_first() {
        let s = state(vec![gpu_node("a", 8)], vec![]);
        let mut small_cpu = pod("a-small", json!({"cpu": "1"}), None);
        small_cpu.metadata.namespace = None;
        let r = fit(
            &s,
            &request(vec![
                small_cpu,
                gpu_pod("b-gpu2", 2),
                gpu_pod("c-gpu4", 4),
                pod("d-cpu8", json!({"cpu": "8"}), None),
            ]),
        )
        .unwrap();
        assert!(r.fits);
        let mut names = Names::default();
        let mut es: Vec<Entry> = Vec::new();
        let pods = [
            gpu_pod("b-gpu2", 2),
            pod("d-cpu8", json!({"cpu": "8"}), None),
            gpu_pod("c-gpu4", 4),
        ];
        for p in &pods {
            es.push(entry(p, false, &s, &mut names).unwrap());
        }
        es.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.key.cmp(&b.key)));
        let keys: Vec<&str> = es.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["default/c-gpu4", "default/b-gpu2", "default/d-cpu8"]);
        assert_eq!(names.names[es[0].dominant], "nvidia.com/gpu");
        assert_eq!(names.names[es[2].dominant], "cpu");
    }

    #[test]
    fn reservations_consume_capacity() {
        let s = state(vec![gpu_node("a", 8), gpu_node("b", 8)], vec![]);
        let first = fit(&s, &request(vec![gpu_pod("one-0", 8)])).unwrap();
        assert!(first.fits);
        let mut second = request(vec![gpu_pod("two-0", 8), gpu_pod("two-1", 8)]);
        second.reserved = groups(vec![gpu_pod("one-0", 8)]);
        let r = fit(&s, &second).unwrap();
        assert!(!r.fits);
        assert_eq!(canonical_map(&r.reserved)["nvidia.com/gpu"], "8");
        assert_eq!(r.placements["default/one-0"], "a");
        assert_eq!(r.placements["default/two-0"], "b");
        assert_eq!(
            r.unplaced,
            [Unplaced {
                pod: "default/two-1".to_string(),
                reason: "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.".to_string(),
                reserved: false,
            }]
        );
        // 16 new + 8 reserved − 16 free = 8 GPUs short.
        assert_eq!(canonical_map(&r.shortfall)["nvidia.com/gpu"], "8");

        // Once the reserved pod is bound it counts on its node, not twice.
        let bound = state(
            vec![gpu_node("a", 8), gpu_node("b", 8)],
            vec![pod(
                "one-0",
                json!({"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}),
                Some("a"),
            )],
        );
        let mut again = request(vec![gpu_pod("two-0", 8)]);
        again.reserved = groups(vec![gpu_pod("one-0", 8)]);
        let r = fit(&bound, &again).unwrap();
        assert!(r.fits);
        assert!(r.reserved.is_empty());
        assert_eq!(r.placements["default/two-0"], "b");
    }

    #[test]
    fn unplaceable_reservation_fails_the_fit() {
        let s = state(vec![gpu_node("a", 8)], vec![]);
        let mut req = request(vec![pod("tiny", json!({"cpu": "1"}), None)]);
        req.reserved = groups(vec![gpu_pod("r", 16)]);
        let r = fit(&s, &req).unwrap();
        assert!(!r.fits);
        assert_eq!(r.unplaced.len(), 1);
        assert!(r.unplaced[0].reserved);
        assert_eq!(r.placements["default/tiny"], "a");
    }

    #[test]
    fn headroom_is_a_cluster_wide_floor() {
        let s = state(vec![gpu_node("a", 8), gpu_node("b", 8)], vec![]);
        let mut req = request(vec![gpu_pod("w-0", 8), gpu_pod("w-1", 4)]);
        req.headroom = list(&[("nvidia.com/gpu", "4")]);
        let r = fit(&s, &req).unwrap();
        assert!(r.fits, "{:?}", r.unplaced);
        assert!(r.shortfall.is_empty());

        req.headroom = list(&[("nvidia.com/gpu", "5")]);
        let r = fit(&s, &req).unwrap();
        assert!(!r.fits);
        assert_eq!(strings(&r.shortfall), pairs(&[("nvidia.com/gpu", "1")]));
        assert_eq!(r.placements.len(), 1);
        assert_eq!(
            r.unplaced,
            [Unplaced {
                pod: "default/w-1".to_string(),
                reason: "placing it would leave 4 nvidia.com/gpu free cluster-wide, below the \
                         headroom of 5"
                    .to_string(),
                reserved: false,
            }]
        );

        // Reserved pods may already have eaten the headroom.
        let mut req = request(vec![pod("cpu-only", json!({"cpu": "1"}), None)]);
        req.reserved = groups(vec![gpu_pod("r", 8), gpu_pod("r2", 6)]);
        req.headroom = list(&[("nvidia.com/gpu", "4")]);
        let r = fit(&s, &req).unwrap();
        assert!(r.unplaced.is_empty());
        assert!(!r.fits);
        assert_eq!(strings(&r.shortfall), pairs(&[("nvidia.com/gpu", "2")]));
    }

    #[test]
    fn shortfall_and_required_numbers_are_exact() {
        let s = state(
            vec![
                node("a", json!({"cpu": "8", "memory": "16Gi"}), json!({})),
                node("b", json!({"cpu": "4", "memory": "8Gi"}), json!({})),
            ],
            vec![pod(
                "busy",
                json!({"cpu": "1500m", "memory": "1Gi"}),
                Some("a"),
            )],
        );
        // free: cpu 10.5, memory 23Gi
        let mut req = request(vec![
            pod("n-0", json!({"cpu": "6", "memory": "10Gi"}), None),
            pod("n-1", json!({"cpu": "6", "memory": "10Gi"}), None),
        ]);
        req.headroom = list(&[("cpu", "500m")]);
        req.old_requests = list(&[("cpu", "12"), ("memory", "20Gi")]);
        let r = fit(&s, &req).unwrap();
        assert!(!r.fits);
        assert_eq!(canonical_map(&r.free)["cpu"], "10500m");
        assert_eq!(canonical_map(&r.free)["memory"], "23Gi");
        // cpu: 12 + 0.5 − 10.5 = 2; memory 20Gi < 23Gi: no shortfall.
        assert_eq!(strings(&r.shortfall), pairs(&[("cpu", "2")]));
        assert_eq!(
            strings(&r.required),
            pairs(&[("cpu", "24"), ("memory", "40Gi"), ("pods", "2")])
        );
        assert_eq!(
            strings(&r.old_requests),
            pairs(&[("cpu", "12"), ("memory", "20Gi")])
        );
        assert_eq!(r.placements["default/n-0"], "a");
        assert_eq!(
            r.unplaced[0].reason,
            "0/2 nodes are available: 2 Insufficient cpu, 2 Insufficient memory."
        );
    }

    #[test]
    fn aggregated_reason_mixes_filters_and_skipped_nodes() {
        let mut tainted = gpu_node("t", 8);
        tainted.spec = Some(
            serde_json::from_value(json!({"taints": [
            {"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]}))
            .unwrap(),
        );
        let mut cordoned = gpu_node("c", 8);
        cordoned.spec = Some(serde_json::from_value(json!({"unschedulable": true})).unwrap());
        let cpu = node(
            "cpu-1",
            json!({"cpu": "64", "memory": "256Gi"}),
            json!({"pool": "cpu"}),
        );
        let s = state(
            vec![gpu_node("a", 4), gpu_node("b", 2), tainted, cordoned, cpu],
            vec![],
        );
        let mut p = gpu_pod("w", 8);
        if let Some(spec) = p.spec.as_mut() {
            spec.node_selector = Some(BTreeMap::from([("pool".to_string(), "gpu".to_string())]));
        }
        let old = FitOptions {
            wording: Wording::V1_20,
        };
        let r = fit_with(&s, &request(vec![p.clone()]), &old).unwrap();
        assert_eq!(
            r.unplaced[0].reason,
            "0/5 nodes are available: 1 node(s) didn't match Pod's node affinity, \
             1 node(s) had taint {dedicated: infer}, that the pod didn't tolerate, \
             1 node(s) were unschedulable, 2 Insufficient nvidia.com/gpu."
        );
        let r2 = fit(&s, &request(vec![p])).unwrap();
        assert_eq!(
            r2.unplaced[0].reason,
            "0/5 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
             1 node(s) had untolerated taint {dedicated: infer}, 1 node(s) were unschedulable, \
             2 Insufficient nvidia.com/gpu."
        );
        assert_eq!(r.skipped_nodes.len(), 1);
        assert_eq!(r.skipped_nodes[0].node, "c");
        assert_eq!(canonical_map(&r.allocatable)["nvidia.com/gpu"], "14");
    }

    #[test]
    fn pod_slots_and_missing_resources() {
        let s = state(
            vec![node("a", json!({"cpu": "8", "pods": "1"}), json!({}))],
            vec![pod("x", json!({}), Some("a"))],
        );
        let r = fit(&s, &request(vec![pod("p", json!({"cpu": "1"}), None)])).unwrap();
        assert_eq!(
            r.unplaced[0].reason,
            "0/1 nodes are available: 1 Too many pods."
        );
        assert_eq!(canonical_map(&r.shortfall)["pods"], "1");

        let s = state(vec![node("a", json!({"cpu": "8"}), json!({}))], vec![]);
        let r = fit(
            &s,
            &request(vec![pod("p", json!({"example.com/fpga": "1"}), None)]),
        )
        .unwrap();
        assert_eq!(
            r.unplaced[0].reason,
            "0/1 nodes are available: 1 Insufficient example.com/fpga."
        );
        assert_eq!(strings(&r.shortfall), pairs(&[("example.com/fpga", "1")]));

        let r = fit(
            &ClusterState::default(),
            &request(vec![pod("p", json!({"cpu": "1"}), None)]),
        )
        .unwrap();
        assert_eq!(r.unplaced[0].reason, "no nodes available to schedule pods");
    }

    #[test]
    fn limit_only_gpu_and_limit_ranges_count_for_new_pods() {
        let mut s = state(vec![gpu_node("a", 8)], vec![]);
        s.limit_ranges = vec![
            serde_json::from_value(json!({
            "metadata": {"name": "lr", "namespace": "default"},
            "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "40"}}]}}))
            .unwrap(),
        ];
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": "w", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}))
        .unwrap();
        let r = fit(&s, &request(vec![p.clone(), p])).unwrap();
        assert!(!r.fits);
        assert_eq!(
            strings(&r.new_requests),
            pairs(&[("cpu", "80"), ("nvidia.com/gpu", "16"), ("pods", "2")])
        );
        assert_eq!(r.placements["default/w"], "a");
        assert_eq!(r.unplaced[0].pod, "default/w#2");
    }

    #[test]
    fn malformed_pods_are_errors() {
        let s = state(vec![gpu_node("a", 8)], vec![]);
        let bad = pod("bad", json!({"nvidia.com/gpu": "x"}), None);
        assert!(matches!(
            fit(&s, &request(vec![bad])),
            Err(crate::Error::Quantity { .. })
        ));
        let s = state(
            vec![gpu_node("a", 8)],
            vec![pod("bound", json!({"cpu": "1.1.1"}), Some("a"))],
        );
        assert!(fit(&s, &request(vec![])).is_err());
    }

    #[test]
    fn report_serializes_camel_case_with_canonical_strings() {
        let s = state(vec![gpu_node("a", 8)], vec![]);
        let r = fit(&s, &request(vec![gpu_pod("w", 2)])).unwrap();
        let v: Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["fits"], json!(true));
        assert_eq!(v["newRequests"]["memory"], json!("16Gi"));
        assert_eq!(v["placements"]["default/w"], json!("a"));
        for k in [
            "required",
            "oldRequests",
            "reserved",
            "allocatable",
            "free",
            "shortfall",
            "unplaced",
            "skippedNodes",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
    }
}
