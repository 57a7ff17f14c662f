//! The devices of the usable nodes while the fit places pods.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use super::view::{ScanNode, Total, Usable};
use super::{DraView, PodDemand, Undecided, alloc::NodeRequest};
use crate::capacity::dra;
use crate::capacity::node::{Capacity, Names, NodeId, ResourceId, Rows, amount, node_name};

/// A pod's DRA requests on one node, or why raygate cannot decide them.
pub(crate) type NodeRequests = Result<Rc<[NodeRequest]>, Undecided>;

/// Per usable node, one pod's DRA requests there (the devices each may take), built on the
/// first look at the node: they do not change while placing, only which devices are held
/// does. Kept by the pod's entry, filled by [`DraRun`].
#[derive(Default)]
pub(crate) struct RequestsByNode(RefCell<Vec<Option<NodeRequests>>>);

/// One pod's DRA demand as the run reads it on a node: what it asks, where its per-node
/// requests are kept, and the rows and names that tell where a device plugin serves a
/// mapped extended resource instead.
pub(crate) struct Ask<'q> {
    pub(crate) demand: &'q PodDemand,
    pub(crate) kept: &'q RequestsByNode,
    pub(crate) rows: &'q Rows,
    pub(crate) names: &'q Names,
}

/// A usable node's devices while placing.
struct DraNode<'a> {
    name: &'a str,
    /// A pool of the node is incomplete: the allocator refuses `allocationMode: All`.
    incomplete: bool,
    /// Per device, whether it is held (by the cluster's claims, a bound pod whose claim
    /// raygate has not seen allocated, or a pod placed so far).
    busy: Vec<bool>,
    /// How many of `busy` are free, kept as devices are held and released.
    free: usize,
    /// The devices held for bound pods whose claims raygate has not seen allocated
    /// ([`dra::assume`]), ascending: before placing anything, `busy` is the view's `used`
    /// and these.
    unseen: Vec<usize>,
}

impl DraNode<'_> {
    fn new(name: &str, incomplete: bool, busy: Vec<bool>) -> DraNode<'_> {
        let free = busy.iter().filter(|u| !**u).count();
        DraNode {
            name,
            incomplete,
            busy,
            free,
            unseen: Vec::new(),
        }
    }

    /// How many of `cands` are free; an unknown device counts as held.
    fn free_among(&self, cands: &[usize]) -> usize {
        // Candidates are distinct device indices, in order: as many as the devices are all
        // of them.
        if cands.len() == self.busy.len() {
            return self.free;
        }
        free_among(&self.busy, cands)
    }

    /// Marks `devices` held (`busy`) or free.
    fn set(&mut self, devices: &[usize], busy: bool) {
        for &d in devices {
            if let Some(u) = self.busy.get_mut(d)
                && *u != busy
            {
                *u = busy;
                if busy {
                    self.free = self.free.saturating_sub(1);
                } else {
                    self.free = self.free.saturating_add(1);
                }
            }
        }
    }
}

/// How many of `cands` are free in `busy`; an unknown device counts as held.
fn free_among(busy: &[bool], cands: &[usize]) -> usize {
    cands
        .iter()
        .filter(|&&c| !busy.get(c).copied().unwrap_or(true))
        .count()
}

/// What a device class adds to the fit's totals, credited once per resource.
pub(crate) struct Credit {
    pub(crate) resource: ResourceId,
    /// Matching devices on every usable node.
    pub(crate) allocatable: i128,
    /// Of them, free before placing anything.
    pub(crate) free_before: i128,
    /// Of them, free now (after the pods placed so far).
    pub(crate) free_now: i128,
}

/// The devices of the usable nodes while placing: which are held, by the cluster's claims
/// and by pods placed so far.
pub(crate) struct DraRun<'a> {
    pub(in crate::capacity) view: DraView<'a>,
    /// Per usable node, in the order of [`Capacity::nodes`].
    nodes: Vec<DraNode<'a>>,
    /// The views of the usable nodes and the class totals on them, kept by the index.
    usable: Arc<Usable>,
    /// A pod placed held or released a device: free counts differ from those before
    /// placing (the views' less [`DraNode::unseen`]).
    moved: bool,
    /// Nodes (by index) with [`DraNode::unseen`] devices held this decision: they depend
    /// on the pods, so the totals kept across decisions do not count them.
    unseen_nodes: Vec<usize>,
    /// Totals already credited, by resource name.
    credited: std::collections::HashSet<String>,
}

impl<'a> DraRun<'a> {
    /// The usable nodes whose pool's newest generation is incomplete.
    pub(crate) fn updating_nodes(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.incomplete)
            .map(|n| n.name.to_string())
            .collect()
    }

    pub(in crate::capacity) fn new(state: &'a dra::DraState, cap: &Capacity<'a>) -> DraRun<'a> {
        let view = DraView::new(state);
        let usable = view.usable(cap.statics.map(|(_, layout)| layout), &cap.nodes);
        let nodes = cap
            .nodes
            .iter()
            .zip(&usable.nodes)
            .map(|(&node, devs)| {
                let name: &'a str = node_name(node);
                match devs {
                    Some(d) => DraNode::new(name, d.incomplete, d.used.clone()),
                    None => DraNode::new(name, false, Vec::new()),
                }
            })
            .collect();
        let mut run = DraRun {
            view,
            nodes,
            usable,
            moved: false,
            unseen_nodes: Vec::new(),
            credited: Default::default(),
        };
        let unseen = match cap.unseen {
            Some((cache, cluster)) => dra::assume::kept(cache, cluster, state, cap),
            None => Arc::new(dra::assume::unseen(state, cap)),
        };
        run.hold_unseen(&unseen);
        run
    }

    /// Holds, first fit among each class's free devices, what bound pods hold beyond the
    /// claims seen ([`dra::assume`]).
    fn hold_unseen(&mut self, unseen: &dra::assume::Unseen) {
        for (&n, held) in unseen {
            let devs = self.devices(n);
            for (class, count) in held {
                let x = one_of(class.clone());
                // A class raygate cannot evaluate here holds nothing more: its pods are
                // not placed on the node anyway.
                let Ok(cands) = self.view.candidates_in(devs.as_ref(), &x) else {
                    continue;
                };
                let Some(d) = self.nodes.get_mut(n.index()) else {
                    continue;
                };
                let free: Vec<usize> = cands
                    .iter()
                    .copied()
                    .filter(|&c| d.busy.get(c) == Some(&false))
                    .take(*count as usize)
                    .collect();
                d.set(&free, true);
                d.unseen.extend(free);
            }
            if let Some(d) = self.nodes.get_mut(n.index())
                && !d.unseen.is_empty()
            {
                d.unseen.sort_unstable();
                self.unseen_nodes.push(n.index());
            }
        }
        self.unseen_nodes.sort_unstable();
    }

    /// Node `n`'s device view, as the index keeps it for the usable nodes (an `Arc`: the
    /// caller holds it while it borrows `self` mutably).
    fn devices(&self, n: NodeId) -> Option<Arc<super::view::NodeDevices>> {
        self.usable.nodes.get(n.index()).cloned().flatten()
    }

    fn node(&self, n: NodeId) -> Option<&DraNode<'a>> {
        self.nodes.get(n.index())
    }

    pub(in crate::capacity) fn free_devices(&self, n: NodeId) -> i128 {
        self.node(n).map_or(0, |d| d.free as i128)
    }

    pub(in crate::capacity) fn hold(&mut self, n: NodeId, devices: &[usize]) {
        self.moved = true;
        if let Some(d) = self.nodes.get_mut(n.index()) {
            d.set(devices, true);
        }
    }

    pub(in crate::capacity) fn release(&mut self, n: NodeId, devices: &[usize]) {
        self.moved = true;
        if let Some(d) = self.nodes.get_mut(n.index()) {
            d.set(devices, false);
        }
    }

    /// The requests of `ask` on node `n` and the devices they would take.
    pub(in crate::capacity) fn allocate(
        &mut self,
        ask: &Ask<'_>,
        n: NodeId,
    ) -> Result<Option<Vec<usize>>, Undecided> {
        let Some(reqs) = self.requests_on(ask, n)? else {
            return Ok(None);
        };
        let Some(node) = self.node(n) else {
            return Ok(None);
        };
        dra::allocate(&node.busy, node.incomplete, &reqs)
    }

    /// Whether node `n` answers `Ok(false)` to `ask` whatever is held: one request (so no
    /// search before it can exceed the allocator's bound), none of whose alternatives has
    /// enough candidates.
    pub(in crate::capacity) fn never(&mut self, ask: &Ask<'_>, n: NodeId) -> bool {
        match self.requests_on(ask, n) {
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

    /// The one-count request of `ask` on node `n`, when that is all it asks there and
    /// [`DraRun::can_allocate`]'s shortcut answers for it.
    pub(in crate::capacity) fn shortcut(
        &mut self,
        ask: &Ask<'_>,
        n: NodeId,
    ) -> Option<(u32, Arc<[usize]>)> {
        let reqs = self.requests_on(ask, n).ok()??;
        one_count(&reqs).map(|(k, cands)| (k, cands.clone()))
    }

    /// The scan list kept for `demand` on `feasible` (see [`Usable::scan`]).
    pub(in crate::capacity) fn scan(
        &self,
        demand: &PodDemand,
        feasible: &[NodeId],
    ) -> Option<Arc<[ScanNode]>> {
        self.usable.scan(demand, feasible)
    }

    /// Keeps `list` for `demand` on `feasible` as long as the usable nodes' views.
    pub(in crate::capacity) fn keep_scan(
        &self,
        demand: &PodDemand,
        feasible: &[NodeId],
        list: Arc<[ScanNode]>,
    ) {
        self.usable.keep_scan(demand, feasible, list);
    }

    /// How many of `cands` are free on node `n` now.
    pub(in crate::capacity) fn free_among(&self, n: NodeId, cands: &[usize]) -> usize {
        self.node(n).map_or(0, |d| d.free_among(cands))
    }

    /// Whether [`DraRun::allocate`] finds devices. One request of a count (a mapped
    /// extended resource, a one-request claim) is taken first fit, never backtracked: it
    /// finds devices exactly when enough of its candidates are free, counted without
    /// building the allocation.
    pub(in crate::capacity) fn can_allocate(
        &mut self,
        ask: &Ask<'_>,
        n: NodeId,
    ) -> Result<bool, Undecided> {
        let Some(reqs) = self.requests_on(ask, n)? else {
            return Ok(false);
        };
        let Some(node) = self.node(n) else {
            return Ok(false);
        };
        if let Some((k, cands)) = one_count(&reqs) {
            return Ok(node.free_among(cands) >= k as usize);
        }
        Ok(dra::allocate(&node.busy, node.incomplete, &reqs)?.is_some())
    }

    /// The requests of `ask` on node `n` (`None`: none can be satisfied), kept in `ask.kept`.
    fn requests_on(
        &mut self,
        ask: &Ask<'_>,
        n: NodeId,
    ) -> Result<Option<Rc<[NodeRequest]>>, Undecided> {
        let d = ask.demand;
        if let Some(u) = &d.undecided {
            return Err(u.clone());
        }
        if d.impossible.is_some() || n.index() >= self.nodes.len() {
            return Ok(None);
        }
        let mut kept = ask.kept.0.borrow_mut();
        if kept.len() < self.nodes.len() {
            kept.resize(self.nodes.len(), None);
        }
        if let Some(r) = &kept[n.index()] {
            return r.clone().map(Some);
        }
        let r = self.node_requests(d, n, ask.rows, ask.names).map(Rc::from);
        kept[n.index()] = Some(r.clone());
        r.map(Some)
    }

    /// The requests of `d` on node `n`: per alternative, the devices it may take.
    fn node_requests(
        &mut self,
        d: &PodDemand,
        n: NodeId,
        rows: &Rows,
        names: &Names,
    ) -> Result<Vec<NodeRequest>, Undecided> {
        let devs = self.devices(n);
        let devs = devs.as_ref();
        let mut reqs = Vec::with_capacity(d.claims.len() + d.mapped.len());
        for r in &d.claims {
            let mut alternatives = Vec::with_capacity(r.alternatives.len());
            for x in &r.alternatives {
                alternatives.push((x.mode, self.view.candidates_in(devs, x)?));
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
            let c = self.view.candidates_in(devs, &x)?;
            reqs.push(NodeRequest {
                alternatives: vec![(x.mode, c)],
            });
        }
        Ok(reqs)
    }

    /// Totals to credit for the classes `d` names, once each. A class's own total is its
    /// matching devices on every usable node; an extended resource it maps counts them
    /// where the node's allocatable has none.
    pub(in crate::capacity) fn credit(
        &mut self,
        d: &PodDemand,
        rows: &Rows,
        names: &mut Names,
    ) -> Vec<Credit> {
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
            let id = names.id(&name);
            let total = self.total(name, class, mapped.is_some(), rows, id);
            let free_before = total.free_before - self.unseen_among(&total);
            let free_now = if self.moved {
                total
                    .nodes
                    .iter()
                    .map(|(i, c)| self.nodes.get(*i).map_or(0, |d| d.free_among(c)) as i128)
                    .sum()
            } else {
                free_before
            };
            let credit = Credit {
                resource: id,
                allocatable: total.allocatable,
                free_before,
                free_now,
            };
            out.push(credit);
        }
        out
    }
}

/// One device of `class`, no selectors of its own: the devices the class offers, as the
/// fit's totals and the holds of bound pods count them.
fn one_of(class: String) -> dra::Exact {
    dra::Exact {
        class,
        selectors: Vec::new(),
        mode: dra::Mode::Count(1),
        unmodeled: None,
    }
}

impl DraRun<'_> {
    /// How many of `total`'s devices [`DraRun::hold_unseen`] held this decision: a kept
    /// total counts them free, as they were in the views (both lists ascending, so a
    /// binary search finds each).
    fn unseen_among(&self, total: &Total) -> i128 {
        let mut held = 0;
        for &i in &self.unseen_nodes {
            let Ok(at) = total.nodes.binary_search_by_key(&i, |(n, _)| *n) else {
                continue;
            };
            let (Some(d), Some((_, cands))) = (self.nodes.get(i), total.nodes.get(at)) else {
                continue;
            };
            held += d
                .unseen
                .iter()
                .filter(|u| cands.binary_search(u).is_ok())
                .count() as i128;
        }
        held
    }

    /// The matching devices of `class` on the usable nodes (where the node's allocatable
    /// has none of `id`, for an extended resource it maps), kept with the usable nodes'
    /// views across decisions.
    fn total(
        &mut self,
        name: String,
        class: String,
        mapped: bool,
        rows: &Rows,
        id: ResourceId,
    ) -> Arc<Total> {
        let key = (name, class, mapped);
        if let Some(t) = self.usable.total(&key) {
            return t;
        }
        let x = one_of(key.1.clone());
        let mut t = Total {
            allocatable: 0,
            free_before: 0,
            nodes: Vec::new(),
        };
        let usable = self.usable.clone();
        for (n, devs) in NodeId::all(usable.nodes.len()).zip(&usable.nodes) {
            // No device on the node: it adds nothing (whatever the request).
            let Some(devs) = devs.as_ref().filter(|d| !d.devices.is_empty()) else {
                continue;
            };
            if mapped && amount(rows.allocatable(n), id) > 0 {
                continue;
            }
            let Ok(c) = self.view.candidates_in(Some(devs), &x) else {
                continue;
            };
            t.allocatable += c.len() as i128;
            t.free_before += free_among(&devs.used, &c) as i128;
            if !c.is_empty() {
                t.nodes.push((n.index(), c));
            }
        }
        let t = Arc::new(t);
        usable.keep_total(key, t.clone());
        t
    }
}

/// The one request of `reqs` when it is a count with one alternative of few enough
/// candidates: the allocator takes it first fit, so it fits exactly when `k` of them are
/// free.
fn one_count(reqs: &[NodeRequest]) -> Option<(u32, &Arc<[usize]>)> {
    match reqs {
        [r] => match &r.alternatives[..] {
            [(dra::Mode::Count(k), cands)] if cands.len() <= dra::alloc::MAX_STEPS => {
                Some((*k, cands))
            }
            _ => None,
        },
        _ => None,
    }
}
