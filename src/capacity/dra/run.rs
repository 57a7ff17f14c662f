//! The devices of the usable nodes while the fit places pods.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

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
    /// Held before placing anything, when bound pods hold devices no claim seen accounts
    /// for ([`dra::assume`]); else the view's `used`.
    before: Option<Vec<bool>>,
}

impl DraNode<'_> {
    /// How many of `cands` are free; an unknown device counts as held.
    fn free_among(&self, cands: &[usize]) -> usize {
        free_among(&self.busy, cands)
    }

    /// Marks `devices` held (`busy`) or free.
    fn set(&mut self, devices: &[usize], busy: bool) {
        for &d in devices {
            if let Some(u) = self.busy.get_mut(d) {
                *u = busy;
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
        let nodes = cap
            .nodes
            .iter()
            .map(|&node| {
                let name: &'a str = node_name(node);
                match view.node(name) {
                    Some(d) => DraNode {
                        name,
                        incomplete: d.incomplete,
                        busy: d.used.clone(),
                        before: None,
                    },
                    None => DraNode {
                        name,
                        incomplete: false,
                        busy: Vec::new(),
                        before: None,
                    },
                }
            })
            .collect();
        let mut run = DraRun {
            view,
            nodes,
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
            let Some(name) = self.node(n).map(|d| d.name) else {
                continue;
            };
            for (class, count) in held {
                let x = one_of(class.clone());
                // A class raygate cannot evaluate here holds nothing more: its pods are
                // not placed on the node anyway.
                let Ok(cands) = self.view.candidates(name, &x) else {
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
                d.before = Some(d.busy.clone());
            }
        }
    }

    fn node(&self, n: NodeId) -> Option<&DraNode<'a>> {
        self.nodes.get(n.index())
    }

    pub(in crate::capacity) fn free_devices(&self, n: NodeId) -> i128 {
        self.node(n)
            .map_or(0, |d| d.busy.iter().filter(|u| !**u).count() as i128)
    }

    pub(in crate::capacity) fn hold(&mut self, n: NodeId, devices: &[usize]) {
        if let Some(d) = self.nodes.get_mut(n.index()) {
            d.set(devices, true);
        }
    }

    pub(in crate::capacity) fn release(&mut self, n: NodeId, devices: &[usize]) {
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
        let node = self.nodes[n.index()].name;
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
            let x = one_of(class);
            let id = names.id(&name);
            let mut credit = Credit {
                resource: id,
                allocatable: 0,
                free_before: 0,
                free_now: 0,
            };
            for (n, node) in NodeId::all(self.nodes.len()).zip(&self.nodes) {
                if mapped.is_some() && amount(rows.allocatable(n), id) > 0 {
                    continue;
                }
                // No device on the node: it adds nothing (whatever the request).
                if node.busy.is_empty() {
                    continue;
                }
                let Ok(c) = self.view.candidates(node.name, &x) else {
                    continue;
                };
                let base = match &node.before {
                    Some(b) => b.as_slice(),
                    None => self
                        .view
                        .node(node.name)
                        .map(|d| d.used.as_slice())
                        .unwrap_or(&[]),
                };
                credit.allocatable += c.len() as i128;
                credit.free_before += free_among(base, &c) as i128;
                credit.free_now += node.free_among(&c) as i128;
            }
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
