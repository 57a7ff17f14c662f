//! The devices of the usable nodes while the fit places pods.

use std::rc::Rc;
use std::sync::Arc;

use super::{DraView, PodDemand, Undecided, alloc::NodeRequest};
use crate::capacity::dra;
use crate::capacity::fit::Entry;
use crate::capacity::node::{Capacity, Names, amount, node_name};

/// The devices of the usable nodes while placing: which are held, by the cluster's claims
/// and by pods placed so far.
pub(crate) struct DraRun<'a> {
    pub(in crate::capacity) view: DraView<'a>,
    /// Per usable node: its name, whether a pool is incomplete, and device busy flags.
    nodes: Vec<(&'a str, bool, Vec<bool>)>,
    /// Totals already credited, by resource name.
    credited: std::collections::HashSet<String>,
}

impl<'a> DraRun<'a> {
    pub(in crate::capacity) fn new(state: &'a dra::DraState, cap: &Capacity<'a>) -> DraRun<'a> {
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

    pub(in crate::capacity) fn free_devices(&self, n: usize) -> i128 {
        self.nodes.get(n).map_or(0, |(_, _, used)| {
            used.iter().filter(|u| !**u).count() as i128
        })
    }

    pub(in crate::capacity) fn hold(&mut self, n: usize, devices: &[usize]) {
        if let Some((_, _, used)) = self.nodes.get_mut(n) {
            for &d in devices {
                if let Some(u) = used.get_mut(d) {
                    *u = true;
                }
            }
        }
    }

    pub(in crate::capacity) fn release(&mut self, n: usize, devices: &[usize]) {
        if let Some((_, _, used)) = self.nodes.get_mut(n) {
            for &d in devices {
                if let Some(u) = used.get_mut(d) {
                    *u = false;
                }
            }
        }
    }

    /// The requests of `d` (entry `e`) on node `n` and the devices they would take.
    pub(in crate::capacity) fn allocate(
        &mut self,
        e: &Entry<'_>,
        d: &PodDemand,
        n: usize,
        rows: &crate::capacity::node::Rows,
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
    pub(in crate::capacity) fn never(
        &mut self,
        e: &Entry<'_>,
        d: &PodDemand,
        n: usize,
        rows: &crate::capacity::node::Rows,
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
    pub(in crate::capacity) fn shortcut(
        &mut self,
        e: &Entry<'_>,
        d: &PodDemand,
        n: usize,
        rows: &crate::capacity::node::Rows,
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
    pub(in crate::capacity) fn free_among(&self, n: usize, cands: &[usize]) -> usize {
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
    pub(in crate::capacity) fn can_allocate(
        &mut self,
        e: &Entry<'_>,
        d: &PodDemand,
        n: usize,
        rows: &crate::capacity::node::Rows,
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
    pub(in crate::capacity) fn requests_on(
        &mut self,
        e: &Entry<'_>,
        d: &PodDemand,
        n: usize,
        rows: &crate::capacity::node::Rows,
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
    pub(in crate::capacity) fn node_requests(
        &mut self,
        d: &PodDemand,
        n: usize,
        rows: &crate::capacity::node::Rows,
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
    pub(in crate::capacity) fn credit(
        &mut self,
        d: &PodDemand,
        rows: &crate::capacity::node::Rows,
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
