//! The placer: free capacity seen through an overlay, an undo log, and best fit.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::entry::{Entry, ScanNode, group_entry, signature};
use super::explain::{explain, headroom_violation, undecided_reason};
use super::overlay::Overlay;
use super::{FitOptions, FitReport, Unplaced};
use crate::capacity::dra::run::{Ask, DraRun};
use crate::capacity::dra::{self, Undecided};
use crate::capacity::node::{
    Amounts, Capacity, Names, NodeId, ResourceId, add_amount, amount, node_name, to_list,
};
use crate::capacity::requests::pod_requests_borrowed;
use crate::capacity::scheduling::Wording;
use crate::capacity::statics::Statics;
use crate::capacity::{ClusterState, ResourceList, scheduler_units, sum};
use crate::podgroup::PodGroup;

/// A pod's request in scheduler units, shared by the copies of a group.
type Units = Rc<[(ResourceId, i128)]>;

/// Where the undo log stood; see [`Placer::undo`].
pub(crate) struct Mark {
    placed: usize,
    keys: usize,
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
        bound: &crate::capacity::node::Bound<'_>,
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
        let mut last: Option<NodeId> = None;
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
            placements.push((
                key.clone(),
                node_name(self.cap.nodes[n.index()]).to_string(),
            ));
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

    /// The DRA run and `e`'s demand as it reads it; `None` without DRA or for a pod asking
    /// nothing of it.
    fn dra_ask<'p>(&'p mut self, e: &'p Entry<'_>) -> Option<(&'p mut DraRun<'a>, Ask<'p>)> {
        let (Some(demand), Some(run)) = (e.dra.as_deref(), self.dra.as_mut()) else {
            return None;
        };
        let ask = Ask {
            demand,
            kept: &e.dra_nodes,
            rows: &self.cap.rows,
            names: &self.names,
        };
        Some((run, ask))
    }

    /// Whether node `n` has room for one copy of `e` now: `Some(devices it takes)`.
    fn fits(&mut self, e: &Entry<'_>, n: NodeId) -> Result<Option<Vec<usize>>, Undecided> {
        if !self.rows_fit(e, n) {
            return Ok(None);
        }
        match self.dra_ask(e) {
            Some((run, ask)) => run.allocate(&ask, n),
            None => Ok(Some(Vec::new())),
        }
    }

    /// [`Placer::fits`] without the devices: what the scan of every node asks.
    fn can_fit(&mut self, e: &Entry<'_>, n: NodeId) -> Result<bool, Undecided> {
        if !self.rows_fit(e, n) {
            return Ok(false);
        }
        match self.dra_ask(e) {
            Some((run, ask)) => run.can_allocate(&ask, n),
            None => Ok(true),
        }
    }

    /// The node's rows have room for `e`; an extended resource a DeviceClass maps does not
    /// count where the node's allocatable has none of it (DRA serves it there).
    fn rows_fit(&self, e: &Entry<'_>, n: NodeId) -> bool {
        let f = self.free.get(n);
        e.req
            .iter()
            .all(|&(r, u)| amount(f, r) >= u || self.served_by_dra(e, n, r))
    }

    fn served_by_dra(&self, e: &Entry<'_>, n: NodeId, r: ResourceId) -> bool {
        e.dra.is_some() && e.dra_mapped.contains(&r) && amount(self.cap.rows.allocatable(n), r) == 0
    }

    /// The nodes a scan for `e` visits: the static filters' feasible nodes, less (for a
    /// pod asking DRA devices) those that would answer "no" to it whatever is placed, each
    /// with its one-count request when that is all it asks there ([`DraRun::shortcut`]).
    /// Kept in the order given, so the first node whose devices raygate cannot decide
    /// is still the first met.
    /// Kept across decisions with the usable nodes' device views ([`DraRun::scan`]).
    fn scan_list(&mut self, e: &Entry<'_>, feasible: &[NodeId]) -> Option<Arc<[ScanNode]>> {
        let (run, ask) = self.dra_ask(e)?;
        if let Some(l) = e.dra_feasible.borrow().as_ref() {
            return Some(l.clone());
        }
        let list = match run.scan(ask.demand, feasible) {
            Some(l) => l,
            None => {
                let list: Arc<[ScanNode]> = feasible
                    .iter()
                    .copied()
                    .filter(|&n| !run.never(&ask, n))
                    .collect::<Vec<NodeId>>()
                    .into_iter()
                    .map(|n| (n, run.shortcut(&ask, n)))
                    .collect();
                run.keep_scan(ask.demand, feasible, list.clone());
                list
            }
        };
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
        feasible: &[NodeId],
    ) -> Result<Option<(NodeId, Vec<usize>)>, Undecided> {
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
        let mut best: Option<(i128, NodeId)> = None;
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
        chosen: Option<NodeId>,
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
    fn take(&mut self, e: &Entry<'_>, n: NodeId, req: &Units, devices: Vec<usize>) {
        let mut cluster_only: Vec<(ResourceId, i128)> = e.devices.clone();
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
        for c in credit {
            add_amount(&mut self.allocatable, c.resource, c.allocatable);
            add_amount(&mut self.free_before, c.resource, c.free_before);
            add_amount(&mut self.cluster_free, c.resource, c.free_now);
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
        let headroom_kept = ResourceId::all(width).all(|r| {
            let h = amount(headroom, r);
            h <= 0 || amount(&self.cluster_free, r) >= h
        });
        let mut shortfall = Amounts::new();
        for r in ResourceId::all(width) {
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
            dra_pools_updating: self
                .dra
                .as_ref()
                .map(DraRun::updating_nodes)
                .unwrap_or_default(),
        }
    }
}

fn add_amount_pair(v: &mut Vec<(ResourceId, i128)>, id: ResourceId, x: i128) {
    match v.iter_mut().find(|(r, _)| *r == id) {
        Some(p) => p.1 = p.1.saturating_add(x),
        None => v.push((id, x)),
    }
}

/// One pod placed, for the undo log.
struct Placed {
    node: NodeId,
    /// Taken from the node's row and cluster-wide.
    units: Units,
    /// Taken cluster-wide only: devices, and extended resources DRA served.
    cluster_only: Vec<(ResourceId, i128)>,
    /// Devices held on the node.
    devices: Vec<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::fit::tests::{gpu_node, gpu_pod, state};
    use crate::capacity::node::capacity;
    use crate::capacity::node::tests::pod;
    use serde_json::json;

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
        assert_ne!(p.free.get(0.into()), cap.free(0.into()));
        p.undo(mark);
        for n in NodeId::all(cap.nodes.len()) {
            assert_eq!(p.free.get(n), cap.free(n), "node {n:?}");
        }
        assert_eq!(p.cluster_free, p.free_before);
        // The same group again, after the undo, places as on a fresh placer.
        let again = p
            .entries(std::slice::from_ref(&group), false, &rules, &cap.bound)
            .unwrap();
        let (placed_again, _) = p.place(&again, &Amounts::new());
        assert_eq!(placed_again, placed);
    }
}
