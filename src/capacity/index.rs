//! Per-node capacity kept up to date from watch events, so that free
//! capacity is a read, not a scan of every pod.
//!
//! As kube-scheduler keeps `NodeInfo.Requested`: each pod event subtracts
//! the pod's previous contribution from its node and adds the new one, in
//! scheduler units, with the request parsed once when the event arrives
//! ([`PodRecord`]). Every change bumps the index's generation counter, so a
//! decision made on one generation can be reused until the cluster changes.
//!
//! A relist (the watch restarted) updates records in place and then drops
//! those it did not see, so memory never holds two copies of the cluster.
//!
//! `node::capacity` computes the same from scratch; a property
//! test checks the two agree on any sequence of events.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use std::borrow::Cow;

use super::node::{
    Amounts, Bound, Capacity, Counted, Names, NodeId, ResourceId, Rows, SkippedNode, add_amount,
    allocatable_of, node_name, record_error, skip_reason,
};
use super::record::{PartialPod, PodBody, PodRecord, ResName, Strings};
use super::statics::{Layout, StaticsCache};
use super::{PODS, PodKey};

#[derive(Debug)]
struct Slot {
    /// `None` while pods name a node the index has not seen (or no more).
    node: Option<Arc<Node>>,
    skip: Option<(String, &'static str)>,
    allocatable: Result<Amounts, String>,
    requested: Amounts,
    pods: usize,
    /// Counted pods whose request did not parse.
    broken: usize,
    epoch: u32,
    /// Its row in [`CapacityIndex::rows`] while usable.
    row: Option<NodeId>,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            node: None,
            skip: None,
            allocatable: Ok(Amounts::new()),
            requested: Amounts::new(),
            pods: 0,
            broken: 0,
            epoch: 0,
            row: None,
        }
    }
}

impl Slot {
    fn usable(&self) -> bool {
        self.node.is_some() && self.skip.is_none()
    }
}

/// A pod; its key (`namespace/name`) is the map's, not stored twice.
#[derive(Debug)]
struct Entry {
    body: PodBody,
    epoch: u32,
}

/// The keys of `map` a relist did not see (`seen` false): what it ended as gone.
fn unseen<K: Clone, V>(map: &HashMap<K, V>, seen: impl Fn(&V) -> bool) -> Vec<K> {
    map.iter()
        .filter(|(_, v)| !seen(v))
        .map(|(k, _)| k.clone())
        .collect()
}

/// `namespace/name` back into its parts (names and namespaces have no `/`).
fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// The cluster's nodes and pods, aggregated per node.
#[derive(Debug, Default)]
pub struct CapacityIndex {
    names: Names,
    /// [`ResName`] → id in `names`.
    local: Vec<Option<ResourceId>>,
    strings: Strings,
    nodes: HashMap<Arc<str>, Slot>,
    /// Usable nodes, sorted by name; and the skipped ones with why.
    usable: Layout,
    skipped: Vec<SkippedNode>,
    /// The usable nodes' aggregates in the order of `usable`, patched by
    /// each pod event, so a decision borrows them instead of copying.
    rows: Rows,
    /// Per row: counted pods whose request did not parse.
    broken_rows: Vec<usize>,
    /// The first usable node (by name) whose allocatable did not parse.
    allocatable_error: Option<String>,
    /// Static verdicts per group shape, patched on the next decision
    /// after a node change for the changed nodes only.
    statics: StaticsCache,
    /// `namespace/name` → pod.
    pods: HashMap<Box<str>, Entry>,
    /// (namespace, `ray.io/cluster`) → keys of its pods.
    by_cluster: HashMap<ClusterKey, HashSet<Box<str>>>,
    generation: u64,
    /// Bumped with `generation` by pod and node changes only: what
    /// `dra::assume::unseen` reads of the cluster besides the DRA objects.
    cluster_generation: u64,
    /// ResourceSlices, DeviceClasses, ResourceClaims and ResourceClaimTemplates.
    dra: super::dra::DraState,
    /// Devices bound pods hold that no claim seen accounts for, per generation.
    unseen: super::dra::unseen::UnseenCache,
    pod_epoch: u32,
    node_epoch: u32,
}

/// (namespace, `ray.io/cluster`).
type ClusterKey = (Arc<str>, Arc<str>);

fn flat_key(ns: &str, name: &str) -> Box<str> {
    format!("{ns}/{name}").into_boxed_str()
}

impl CapacityIndex {
    pub fn new() -> CapacityIndex {
        let mut i = CapacityIndex::default();
        i.names.id(PODS);
        i
    }

    /// Changes with every event that changes capacity or a Ray pod.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A pod or node change: a new generation of the cluster.
    fn bump_cluster(&mut self) {
        self.generation += 1;
        self.cluster_generation += 1;
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// The record for a watched pod, sharing this index's strings.
    pub fn record(&mut self, pod: &PartialPod) -> PodRecord {
        pod.to_record(&mut self.strings)
    }

    fn local(&mut self, r: ResName) -> ResourceId {
        let i = r.index();
        if self.local.len() <= i {
            self.local.resize(i + 1, None);
        }
        match self.local[i] {
            Some(id) => id,
            None => {
                let id = self.names.id(r.as_str());
                self.local[i] = Some(id);
                id
            }
        }
    }

    /// Adds (`sign` 1) or takes away (`sign` -1) a pod's share of its node.
    fn account(&mut self, body: &PodBody, sign: i128) {
        let Some(node) = body.holds() else { return };
        let units: Vec<(ResourceId, i128)> = match &body.requests {
            Ok(u) => u
                .iter()
                .filter(|(r, _)| r.as_str() != PODS)
                .map(|&(r, u)| (r, i128::from(u)))
                .collect::<Vec<_>>()
                .into_iter()
                .map(|(r, u)| (self.local(r), u))
                .collect(),
            Err(_) => vec![],
        };
        let pods_id = self.local_pods();
        let width = self.names.names.len();
        let slot = match self.nodes.get_mut(node) {
            Some(s) => s,
            None => {
                let name = self.strings.get(node);
                let epoch = self.node_epoch;
                self.nodes.entry(name).or_insert_with(|| Slot {
                    epoch,
                    ..Default::default()
                })
            }
        };
        if body.requests.is_err() {
            slot.broken = slot.broken.saturating_add_signed(sign as isize);
        } else {
            for (r, u) in units {
                add_amount(&mut slot.requested, r, sign * u);
            }
            add_amount(&mut slot.requested, pods_id, sign);
            slot.pods = slot.pods.saturating_add_signed(sign as isize);
        }
        if width != self.rows.width() {
            // A resource no node had before: every row grows a column.
            self.reorder();
        } else if let Some(row) = slot.row {
            self.rows.set_requested(row, &slot.requested, slot.pods);
            if let Some(b) = self.broken_rows.get_mut(row.index()) {
                *b = slot.broken;
            }
        }
    }

    fn local_pods(&mut self) -> ResourceId {
        self.names.id(PODS)
    }

    fn unlink(&mut self, key: &str, body: &PodBody, ns: &Arc<str>) {
        if let Some(c) = &body.ray {
            let k = (ns.clone(), c.cluster.clone());
            if let Some(set) = self.by_cluster.get_mut(&k) {
                set.remove(key);
                if set.is_empty() {
                    self.by_cluster.remove(&k);
                }
            }
        }
    }

    /// A pod was added or changed; returns what it was before. A change of
    /// nothing the record keeps (a pod IP, a container restart count) is
    /// not a change of the cluster: the generation stays.
    pub fn apply_pod(&mut self, rec: PodRecord) -> Option<PodBody> {
        let ns = self.strings.get(&rec.key.0);
        let key = flat_key(&ns, &rec.key.1);
        if let Some(e) = self.pods.get_mut(&key)
            && e.body == rec.body
        {
            e.epoch = self.pod_epoch;
            return Some(e.body.clone());
        }
        self.bump_cluster();
        let old = self.pods.remove(&key);
        if let Some(o) = &old {
            self.account(&o.body, -1);
            self.unlink(&key, &o.body, &ns);
        }
        self.account(&rec.body, 1);
        if let Some(c) = &rec.body.ray {
            self.by_cluster
                .entry((ns.clone(), c.cluster.clone()))
                .or_default()
                .insert(key.clone());
        }
        self.pods.insert(
            key,
            Entry {
                body: rec.body,
                epoch: self.pod_epoch,
            },
        );
        old.map(|o| o.body)
    }

    /// A pod was deleted; returns what it was.
    pub fn delete_pod(&mut self, ns: &str, name: &str) -> Option<PodBody> {
        let key = flat_key(ns, name);
        let old = self.pods.remove(&key)?;
        self.bump_cluster();
        self.account(&old.body, -1);
        let ns = self.strings.get(ns);
        self.unlink(&key, &old.body, &ns);
        Some(old.body)
    }

    /// The pod watch restarted: records seen from now on are current.
    pub fn begin_pod_relist(&mut self) {
        self.pod_epoch = self.pod_epoch.wrapping_add(1);
    }

    /// The relist is complete: pods it did not list are gone.
    pub fn end_pod_relist(&mut self) {
        let epoch = self.pod_epoch;
        let gone = unseen(&self.pods, |e| e.epoch == epoch);
        for key in gone {
            let (ns, name) = split_key(&key);
            self.delete_pod(ns, name);
        }
        self.strings.prune();
        self.pods.shrink_to_fit();
    }

    /// A node was added or changed (already slimmed).
    pub fn apply_node(&mut self, node: Node) {
        let name = self.strings.get(node_name(&node));
        if let Some(slot) = self.nodes.get_mut(&name)
            && slot.node.as_deref() == Some(&node)
        {
            slot.epoch = self.node_epoch;
            return;
        }
        self.bump_cluster();
        let skip = skip_reason(&node);
        let allocatable = allocatable_of(&node, &mut self.names).map_err(|e| e.to_string());
        let slot = self.nodes.entry(name).or_default();
        slot.node = Some(Arc::new(node));
        slot.skip = skip;
        slot.allocatable = allocatable;
        slot.epoch = self.node_epoch;
        self.reorder();
    }

    /// A node was deleted. Its pods stay counted under its name, as they
    /// are until their own delete events arrive.
    pub fn delete_node(&mut self, name: &str) {
        self.bump_cluster();
        let mut drop_slot = false;
        if let Some(slot) = self.nodes.get_mut(name) {
            slot.node = None;
            slot.skip = None;
            slot.allocatable = Ok(Amounts::new());
            drop_slot = slot.pods == 0 && slot.broken == 0;
        }
        if drop_slot {
            self.nodes.remove(name);
        }
        self.reorder();
    }

    pub fn begin_node_relist(&mut self) {
        self.node_epoch = self.node_epoch.wrapping_add(1);
    }

    pub fn end_node_relist(&mut self) {
        let epoch = self.node_epoch;
        let gone = unseen(&self.nodes, |s| s.node.is_none() || s.epoch == epoch);
        for n in gone {
            self.delete_node(&n);
        }
    }

    /// Sorts the usable nodes and lays out their rows again (a node came,
    /// went or changed; a new resource appeared). O(nodes), not O(pods).
    fn reorder(&mut self) {
        let mut usable: Vec<Arc<str>> = self
            .nodes
            .iter()
            .filter(|(_, s)| s.usable())
            .map(|(n, _)| n.clone())
            .collect();
        usable.sort();
        let mut rows = Rows::new(self.names.names.len(), usable.len());
        let mut broken_rows = Vec::with_capacity(usable.len());
        let mut nodes = Vec::with_capacity(usable.len());
        let mut allocatable_error = None;
        for slot in self.nodes.values_mut() {
            slot.row = None;
        }
        for name in &usable {
            let Some(slot) = self.nodes.get_mut(name) else {
                continue;
            };
            let Some(node) = slot.node.clone() else {
                continue;
            };
            let none = Amounts::new();
            let allocatable = match &slot.allocatable {
                Ok(a) => a,
                Err(e) => {
                    allocatable_error.get_or_insert_with(|| e.clone());
                    &none
                }
            };
            slot.row = Some(rows.len().into());
            rows.push(allocatable, &slot.requested, slot.pods);
            broken_rows.push(slot.broken);
            nodes.push(node);
        }
        self.rows = rows;
        self.broken_rows = broken_rows;
        self.allocatable_error = allocatable_error;
        let mut skipped: Vec<SkippedNode> = self
            .nodes
            .iter()
            .filter(|(_, s)| s.node.is_some())
            .filter_map(|(n, s)| {
                s.skip.as_ref().map(|(reason, sched)| SkippedNode {
                    node: n.to_string(),
                    reason: reason.clone(),
                    scheduler_reason: sched,
                })
            })
            .collect();
        skipped.sort_by(|a, b| a.node.cmp(&b.node));
        self.usable = Arc::new(nodes);
        self.skipped = skipped;
    }

    /// The DRA objects the fit reads.
    pub fn dra(&self) -> &super::dra::DraState {
        &self.dra
    }

    /// Changes the DRA objects (a ResourceSlice, DeviceClass, ResourceClaim or
    /// ResourceClaimTemplate event) with `f`, which says whether anything changed: a
    /// change of capacity like a pod's.
    pub fn update_dra(&mut self, f: impl FnOnce(&mut super::dra::DraState) -> bool) -> bool {
        let changed = f(&mut self.dra);
        if changed {
            self.generation += 1;
        }
        changed
    }

    /// Classes counted as plain units (`--dra-plain-count-class`).
    pub fn set_dra_plain_count(&mut self, classes: impl IntoIterator<Item = String>) {
        self.update_dra(|d| {
            d.plain_count = classes.into_iter().collect();
            true
        });
    }

    /// Whether `ns/name` is counted on a usable node.
    pub(crate) fn counted_on_usable(&self, ns: &str, name: &str) -> bool {
        self.pods
            .get(&*flat_key(ns, name))
            .and_then(|e| e.body.holds())
            .and_then(|n| self.nodes.get(n))
            .is_some_and(Slot::usable)
    }

    /// The pods of one RayCluster.
    pub fn cluster_pods(&self, ns: &str, cluster: &str) -> Vec<(PodKey, &PodBody)> {
        let k: ClusterKey = (Arc::from(ns), Arc::from(cluster));
        let mut out: Vec<(PodKey, &PodBody)> = self
            .by_cluster
            .get(&k)
            .into_iter()
            .flatten()
            .filter_map(|key| {
                let e = self.pods.get(key)?;
                let (ns, name) = split_key(key);
                Some(((Arc::from(ns), Arc::from(name)), &e.body))
            })
            .collect();
        out.sort_by(|a, b| a.0.1.cmp(&b.0.1));
        out
    }

    /// Free capacity, read from the aggregates: O(nodes), not O(pods), and
    /// borrowed, not copied.
    pub(crate) fn capacity(&self) -> crate::Result<Capacity<'_>> {
        if let Some(e) = &self.allocatable_error {
            return Err(record_error(e));
        }
        if self.broken_rows.iter().any(|&b| b > 0) {
            let bad = self.pods.values().find_map(|e| match &e.body.requests {
                Err(msg)
                    if e.body
                        .holds()
                        .and_then(|n| self.nodes.get(n))
                        .is_some_and(Slot::usable) =>
                {
                    Some(msg.clone())
                }
                _ => None,
            });
            if let Some(msg) = bad {
                return Err(record_error(&msg));
            }
        }
        Ok(Capacity {
            names: Cow::Borrowed(&self.names),
            nodes: self.usable.iter().map(|n| &**n).collect(),
            rows: Cow::Borrowed(&self.rows),
            skipped: Cow::Borrowed(&self.skipped),
            bound: Bound::Index(self),
            statics: Some((&self.statics, &self.usable)),
            dra: (!self.dra.is_empty()).then_some(&self.dra),
            unseen: Some((&self.unseen, self.cluster_generation)),
        })
    }

    /// [`super::fit()`] on this index's free capacity; `rules` gives the
    /// LimitRanges and RuntimeClasses new pods are admitted with.
    pub fn fit(
        &self,
        rules: &super::ClusterState,
        req: &super::FitRequest,
    ) -> crate::Result<super::FitReport> {
        super::fit::fit_on(&self.capacity()?, rules, req, &Default::default())
    }

    /// Per-node capacity, as [`super::node_free`] gives it.
    pub fn node_free(&self) -> crate::Result<super::NodeSummary> {
        super::node::summary(&self.capacity()?)
    }

    /// Static filter runs (node name, taints, selector, affinity) made for
    /// decisions on this index so far: a node change costs one per changed
    /// node and group shape, not one per node.
    pub fn static_evaluations(&self) -> usize {
        self.statics.evaluated()
    }

    /// Forgets the cached static verdicts, so the next decision evaluates
    /// every node again (what every node change cost before the verdicts
    /// were patched; the benches' baseline).
    pub fn forget_static_verdicts(&self) {
        self.statics.clear();
    }
}

impl Counted for CapacityIndex {
    fn counted_on_usable(&self, ns: &str, name: &str) -> bool {
        CapacityIndex::counted_on_usable(self, ns, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::ClusterState;
    use crate::capacity::node::capacity;
    use crate::capacity::node::tests::{node, pod};
    use k8s_openapi::api::core::v1::Pod;
    use proptest::prelude::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    /// What the index should equal: the same objects, from scratch.
    struct Model {
        nodes: BTreeMap<String, Node>,
        pods: BTreeMap<(String, String), Pod>,
        /// ResourceSlices, DeviceClasses and ResourceClaims by kind and name.
        dra: BTreeMap<(String, String), serde_json::Value>,
    }

    fn oracle(m: &Model) -> ClusterState {
        let dra: Vec<serde_json::Value> = m.dra.values().cloned().collect();
        ClusterState {
            nodes: m.nodes.values().cloned().collect(),
            pods: m.pods.values().map(PodRecord::from_pod).collect(),
            // Built afresh: no CEL verdicts of earlier steps, unlike the index's.
            dra: crate::capacity::dra::tests::state_of(&dra),
            ..Default::default()
        }
    }

    fn check(index: &CapacityIndex, m: &Model) -> Result<(), TestCaseError> {
        let state = oracle(m);
        let want = capacity(&state);
        let got = index.capacity();
        match (want, got) {
            (Ok(w), Ok(g)) => {
                prop_assert_eq!(
                    crate::capacity::node::summary(&w).unwrap(),
                    crate::capacity::node::summary(&g).unwrap()
                );
                for (ns, name) in m.pods.keys() {
                    prop_assert_eq!(w.bound.contains(ns, name), g.bound.contains(ns, name));
                }
            }
            (Err(_), Err(_)) => {}
            (w, g) => prop_assert!(
                false,
                "oracle {:?} index {:?}",
                w.map(|_| ()),
                g.map(|_| ())
            ),
        }
        // A fit that reads the static filters (selector, taints): the
        // index's cached, patched verdicts answer as a fit from scratch.
        // And one on DRA devices: the index's device view and the CEL verdicts it kept
        // from earlier steps answer as a view built from scratch.
        for req in [static_request(), dra_request(), claim_request()] {
            let want = crate::capacity::fit(&state, &req);
            let got = index.fit(&ClusterState::default(), &req);
            match (want, got) {
                (Ok(w), Ok(g)) => prop_assert_eq!(w, g),
                (Err(_), Err(_)) => {}
                (w, g) => prop_assert!(false, "oracle {:?} index {:?}", w.is_ok(), g.is_ok()),
            }
        }
        Ok(())
    }

    /// Two pods asking for `example.com/gpu`, which no node has in allocatable: DRA
    /// serves it through the `gpu` DeviceClass, when there is one.
    fn dra_request() -> crate::capacity::FitRequest {
        let p = pod("d", json!({"cpu": "100m", "example.com/gpu": "1"}), None);
        crate::capacity::FitRequest {
            pods: vec![crate::capacity::PodGroup::indexed(p, 2, "d-".into())],
            ..Default::default()
        }
    }

    /// Two pods whose claim (template `a/two`) asks two devices of class `gpu`, the second
    /// with a selector of its own: the allocator's general path (several requests, a
    /// request's selectors), not the one-count shortcut.
    fn claim_request() -> crate::capacity::FitRequest {
        let mut p = pod("c", json!({"cpu": "100m"}), None);
        p.metadata.namespace = Some("a".into());
        if let Some(spec) = p.spec.as_mut() {
            spec.resource_claims = Some(vec![
                serde_json::from_value(json!({"name": "gpus", "resourceClaimTemplateName": "two"}))
                    .unwrap(),
            ]);
        }
        crate::capacity::FitRequest {
            pods: vec![crate::capacity::PodGroup::indexed(p, 2, "c-".into())],
            ..Default::default()
        }
    }

    fn two_template() -> serde_json::Value {
        crate::capacity::dra::tests::template(
            "a",
            "two",
            json!([{"name": "any", "exactly": {"deviceClassName": "gpu"}},
                   {"name": "even", "exactly": {"deviceClassName": "gpu", "selectors": [
                       {"cel": {"expression": "device.attributes[\"gpu.example.com\"].index % 2 == 0"}}]}}]),
        )
    }

    /// The class's selectors, by variant: none, by product, by device index.
    const DRA_SELECTORS: [Option<&str>; 3] = [
        None,
        Some(r#"device.attributes["gpu.example.com"].productName == "H100""#),
        Some(r#"device.attributes["gpu.example.com"].index % 2 == 1"#),
    ];

    fn apply_dra(index: &mut CapacityIndex, m: &mut Model, op: &Op) {
        use crate::capacity::dra::tests::{allocated_claim, class, slice_with};
        let (kind, name, obj) = match *op {
            Op::Slice {
                node,
                part,
                generation,
                count,
                devices,
                h100,
            } => {
                let name = format!("n{node}-{part}");
                let pool = format!("n{node}");
                let product = if h100 { "H100" } else { "A100" };
                let o = slice_with(&name, &pool, &pool, generation, count, devices, product);
                ("ResourceSlice", name, Some(o))
            }
            Op::DeleteSlice { node, part } => ("ResourceSlice", format!("n{node}-{part}"), None),
            Op::Class(Some(sel)) => (
                "DeviceClass",
                "gpu".to_string(),
                Some(class("gpu", DRA_SELECTORS[sel], Some("example.com/gpu"))),
            ),
            Op::Class(None) => ("DeviceClass", "gpu".to_string(), None),
            Op::Claim { i, node, mask } => {
                let devices: Vec<String> = (0..4)
                    .filter(|d| mask & (1 << d) != 0)
                    .map(|d| format!("gpu-{d}"))
                    .collect();
                let devices: Vec<&str> = devices.iter().map(String::as_str).collect();
                let o = allocated_claim("a", &format!("c{i}"), &format!("n{node}"), &devices);
                ("ResourceClaim", format!("a/c{i}"), Some(o))
            }
            Op::DeleteClaim(i) => ("ResourceClaim", format!("a/c{i}"), None),
            Op::DraRelist(mask) => {
                // Slice `n{node}-{part}` stays with bit node*2+part, claim `a/c{i}` with bit 10+i.
                let keep = |kind: &str, name: &str| -> bool {
                    let bit = match kind {
                        "ResourceSlice" => {
                            name.trim_start_matches('n').split_once('-').map(|(n, p)| {
                                n.parse::<u32>().unwrap() * 2 + p.parse::<u32>().unwrap()
                            })
                        }
                        "ResourceClaim" => Some(10 + name[3..].parse::<u32>().unwrap()),
                        _ => None,
                    };
                    bit.is_none_or(|b| mask & (1 << b) != 0)
                };
                m.dra.retain(|(kind, name), _| keep(kind, name));
                let seen = |kind: &str| -> std::collections::BTreeSet<String> {
                    m.dra
                        .keys()
                        .filter(|(k, _)| k == kind)
                        .map(|(_, n)| n.clone())
                        .collect()
                };
                let (slices, claims) = (seen("ResourceSlice"), seen("ResourceClaim"));
                index.update_dra(|d| {
                    use crate::capacity::dra::DraKind;
                    d.retain(DraKind::Slice, &slices) | d.retain(DraKind::Claim, &claims)
                });
                return;
            }
            _ => return,
        };
        let key = (kind.to_string(), name.clone());
        match obj {
            Some(o) => {
                index.update_dra(|d| match kind {
                    "ResourceSlice" => d.apply_slice(&serde_json::from_value(o.clone()).unwrap()),
                    "DeviceClass" => d.apply_class(&serde_json::from_value(o.clone()).unwrap()),
                    _ => d.apply_claim(&serde_json::from_value(o.clone()).unwrap()),
                });
                m.dra.insert(key, o);
            }
            None => {
                index.update_dra(|d| match kind {
                    "ResourceSlice" => d.delete_slice(&name),
                    "DeviceClass" => d.delete_class(&name),
                    _ => d.delete_claim("a", name.trim_start_matches("a/")),
                });
                m.dra.remove(&key);
            }
        }
    }

    /// Two one-GPU pods for the `pool: gpu` nodes, tolerating nothing.
    fn static_request() -> crate::capacity::FitRequest {
        let mut p = pod("w", json!({"cpu": "100m", "nvidia.com/gpu": "1"}), None);
        p.spec.as_mut().unwrap().node_selector =
            Some(BTreeMap::from([("pool".to_string(), "gpu".to_string())]));
        crate::capacity::FitRequest {
            pods: vec![crate::capacity::PodGroup::indexed(p, 2, "w-".into())],
            ..Default::default()
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Pod {
            i: usize,
            node: Option<usize>,
            phase: usize,
            cpu: u32,
            gpu: u32,
            ray: bool,
            bad: bool,
        },
        DeletePod(usize),
        Node {
            i: usize,
            ready: bool,
            cordoned: bool,
            gpu: u32,
            bad: bool,
            /// Labelled `pool: gpu` (else `cpu`) and tainted: the static
            /// filters the fit's cached verdicts keep.
            pool: bool,
            tainted: bool,
        },
        DeleteNode(usize),
        /// Relist: keep pods whose bit is set, then drop the rest.
        Relist(u16),
        NodeRelist(u8),
        /// ResourceSlice `n{node}-{part}` of pool `n{node}` on node `n{node}`: `devices`
        /// GPUs `gpu-0..`, in a pool generation of `count` slices.
        Slice {
            node: usize,
            part: usize,
            generation: i64,
            count: i64,
            devices: usize,
            h100: bool,
        },
        DeleteSlice {
            node: usize,
            part: usize,
        },
        /// The `gpu` DeviceClass mapping `example.com/gpu`, with selector variant n
        /// ([`DRA_SELECTORS`]); `None` deletes it.
        Class(Option<usize>),
        /// Claim `a/c{i}` allocated the devices of `mask` in pool `n{node}`.
        Claim {
            i: usize,
            node: usize,
            mask: u8,
        },
        DeleteClaim(usize),
        /// DRA relist: keep the slices and claims whose bits are set (see `apply_dra`).
        DraRelist(u16),
    }

    const PHASES: [Option<&str>; 5] = [
        None,
        Some("Pending"),
        Some("Running"),
        Some("Succeeded"),
        Some("Failed"),
    ];

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..12usize, proptest::option::of(0..5usize), 0..5usize, 0..4000u32, 0..3u32, any::<bool>(), proptest::bool::weighted(0.05))
                .prop_map(|(i, node, phase, cpu, gpu, ray, bad)| Op::Pod { i, node, phase, cpu, gpu, ray, bad }),
            1 => (0..12usize).prop_map(Op::DeletePod),
            2 => (0..5usize, proptest::bool::weighted(0.8), proptest::bool::weighted(0.2), 0..9u32, proptest::bool::weighted(0.05), any::<bool>(), proptest::bool::weighted(0.2))
                .prop_map(|(i, ready, cordoned, gpu, bad, pool, tainted)| Op::Node { i, ready, cordoned, gpu, bad, pool, tainted }),
            1 => (0..5usize).prop_map(Op::DeleteNode),
            1 => any::<u16>().prop_map(Op::Relist),
            1 => any::<u8>().prop_map(Op::NodeRelist),
            2 => (0..5usize, 0..2usize, 1..3i64, 1..3i64, 0..5usize, any::<bool>())
                .prop_map(|(node, part, generation, count, devices, h100)| Op::Slice { node, part, generation, count, devices, h100 }),
            1 => (0..5usize, 0..2usize).prop_map(|(node, part)| Op::DeleteSlice { node, part }),
            1 => proptest::option::weighted(0.85, 0..3usize).prop_map(Op::Class),
            1 => (0..4usize, 0..5usize, 0..16u8).prop_map(|(i, node, mask)| Op::Claim { i, node, mask }),
            1 => (0..4usize).prop_map(Op::DeleteClaim),
            1 => any::<u16>().prop_map(Op::DraRelist),
        ]
    }

    fn make_pod(
        i: usize,
        node: Option<usize>,
        phase: usize,
        cpu: u32,
        gpu: u32,
        ray: bool,
        bad: bool,
    ) -> Pod {
        let name = format!("p{i}");
        let node = node.map(|n| format!("n{n}"));
        let cpu = if bad {
            "1.1.1".to_string()
        } else {
            format!("{cpu}m")
        };
        let mut requests = json!({"cpu": cpu, "nvidia.com/gpu": gpu.to_string()});
        if ray && gpu > 0 {
            // The class's mapped resource: bound on a node that publishes devices, the pod
            // holds some until its claim is seen (`dra::assume`), per decision, beside the
            // totals the index keeps across decisions.
            requests["example.com/gpu"] = json!(gpu.to_string());
        }
        let mut p = pod(&name, requests, node.as_deref());
        p.metadata.namespace = Some(if i.is_multiple_of(2) { "a" } else { "b" }.to_string());
        if ray {
            p.metadata.labels = Some(BTreeMap::from([
                ("ray.io/cluster".to_string(), format!("c{}", i % 3)),
                ("ray.io/group".to_string(), "gpu".to_string()),
            ]));
        }
        if let Some(ph) = PHASES[phase] {
            p.status = Some(serde_json::from_value(json!({"phase": ph})).unwrap());
        }
        p
    }

    fn make_node(
        i: usize,
        ready: bool,
        cordoned: bool,
        gpu: u32,
        bad: bool,
        pool: bool,
        tainted: bool,
    ) -> Node {
        let cpu = if bad { "x" } else { "4" };
        let mut allocatable = json!({"cpu": cpu, "nvidia.com/gpu": gpu.to_string(), "pods": "5"});
        if gpu == 7 {
            // A device plugin serves the class's mapped resource here: the node leaves the
            // class's kept totals (the layout changes with it).
            allocatable["example.com/gpu"] = json!("1");
        }
        let mut n = node(
            &format!("n{i}"),
            allocatable,
            json!({"pool": if pool { "gpu" } else { "cpu" }}),
        );
        if tainted {
            n.spec = Some(
                serde_json::from_value(
                    json!({"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}),
                )
                .unwrap(),
            );
        }
        if !ready {
            n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        }
        if cordoned {
            n.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
        }
        n
    }

    fn key_of(i: usize) -> (String, String) {
        (
            if i.is_multiple_of(2) { "a" } else { "b" }.to_string(),
            format!("p{i}"),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        #[test]
        fn the_index_equals_the_from_scratch_oracle(ops in proptest::collection::vec(op(), 1..60)) {
            let mut index = CapacityIndex::new();
            let mut m = Model { nodes: BTreeMap::new(), pods: BTreeMap::new(), dra: BTreeMap::new() };
            let t = two_template();
            index.update_dra(|d| d.apply_template(&serde_json::from_value(t.clone()).unwrap()));
            m.dra.insert(("ResourceClaimTemplate".into(), "a/two".into()), t);
            for op in ops {
                apply_dra(&mut index, &mut m, &op);
                match op {
                    Op::Pod { i, node, phase, cpu, gpu, ray, bad } => {
                        let p = make_pod(i, node, phase, cpu, gpu, ray, bad);
                        index.apply_pod(PodRecord::from_pod(&p));
                        m.pods.insert(key_of(i), p);
                    }
                    Op::DeletePod(i) => {
                        let (ns, name) = key_of(i);
                        let had = m.pods.remove(&key_of(i)).is_some();
                        prop_assert_eq!(index.delete_pod(&ns, &name).is_some(), had);
                    }
                    Op::Node { i, ready, cordoned, gpu, bad, pool, tainted } => {
                        let n = make_node(i, ready, cordoned, gpu, bad, pool, tainted);
                        index.apply_node(n.clone());
                        m.nodes.insert(format!("n{i}"), n);
                    }
                    Op::DeleteNode(i) => {
                        index.delete_node(&format!("n{i}"));
                        m.nodes.remove(&format!("n{i}"));
                    }
                    Op::Relist(mask) => {
                        index.begin_pod_relist();
                        m.pods.retain(|(_, name), _| {
                            let i: usize = name[1..].parse().unwrap();
                            mask & (1 << i) != 0
                        });
                        for p in m.pods.values() {
                            index.apply_pod(PodRecord::from_pod(p));
                        }
                        index.end_pod_relist();
                    }
                    Op::NodeRelist(mask) => {
                        index.begin_node_relist();
                        m.nodes.retain(|name, _| {
                            let i: usize = name[1..].parse().unwrap();
                            mask & (1 << i) != 0
                        });
                        for n in m.nodes.values() {
                            index.apply_node(n.clone());
                        }
                        index.end_node_relist();
                    }
                    _ => {} // DRA objects: apply_dra
                }
                check(&index, &m)?;
                prop_assert_eq!(index.pod_count(), m.pods.len());
            }
            // Ray pods are found by cluster.
            for c in 0..3 {
                for ns in ["a", "b"] {
                    let got: Vec<String> = index.cluster_pods(ns, &format!("c{c}")).iter().map(|(k, _)| k.1.to_string()).collect();
                    let mut want: Vec<String> = m.pods.iter()
                        .filter(|((pns, _), p)| pns == ns && p.metadata.labels.as_ref().and_then(|l| l.get("ray.io/cluster")) == Some(&format!("c{c}")))
                        .map(|((_, n), _)| n.clone()).collect();
                    want.sort();
                    prop_assert_eq!(got, want);
                }
            }
        }
    }

    #[test]
    fn a_decision_borrows_the_rows_and_a_new_resource_widens_them() {
        let mut index = CapacityIndex::new();
        index.apply_node(node("a", json!({"cpu": "8"}), json!({})));
        let cap = index.capacity().unwrap();
        assert!(matches!(cap.rows, Cow::Borrowed(_)));
        let width = cap.rows.width();
        // A pod asking for a resource no node has widens every row.
        index.apply_pod(PodRecord::from_pod(&pod(
            "x",
            json!({"cpu": "1", "example.com/fpga": "1"}),
            Some("a"),
        )));
        let cap = index.capacity().unwrap();
        assert_eq!(cap.rows.width(), width + 1);
        let state = ClusterState {
            nodes: vec![node("a", json!({"cpu": "8"}), json!({}))],
            pods: vec![PodRecord::from_pod(&pod(
                "x",
                json!({"cpu": "1", "example.com/fpga": "1"}),
                Some("a"),
            ))],
            ..Default::default()
        };
        let want = capacity(&state).unwrap();
        assert_eq!(
            crate::capacity::node::summary(&cap).unwrap(),
            crate::capacity::node::summary(&want).unwrap()
        );
    }

    #[test]
    fn cached_static_verdicts_follow_node_changes_evaluating_only_those_nodes() {
        let mut index = CapacityIndex::new();
        for n in ["a", "b", "c"] {
            index.apply_node(node(n, json!({"cpu": "8"}), json!({"pool": "cpu"})));
        }
        let mut p = pod("w", json!({"cpu": "1"}), None);
        p.spec.as_mut().unwrap().node_selector =
            Some(BTreeMap::from([("pool".to_string(), "gpu".to_string())]));
        let req = crate::capacity::FitRequest {
            pods: vec![p.into()],
            ..Default::default()
        };
        let rules = ClusterState::default();
        assert!(!index.fit(&rules, &req).unwrap().fits);
        assert_eq!(index.static_evaluations(), 3, "every node, once");
        // Asked again on the same nodes: the cached verdicts answer alike.
        assert!(!index.fit(&rules, &req).unwrap().fits);
        assert_eq!(index.static_evaluations(), 3);
        // One node changes: only it is evaluated again.
        index.apply_node(node("b", json!({"cpu": "8"}), json!({"pool": "gpu"})));
        let r = index.fit(&rules, &req).unwrap();
        assert!(r.fits);
        assert_eq!(r.placements.values().collect::<Vec<_>>(), ["b"]);
        assert_eq!(index.static_evaluations(), 4);
        // A node added before it: one more; a node deleted: none.
        index.apply_node(node("aa", json!({"cpu": "8"}), json!({"pool": "cpu"})));
        assert!(index.fit(&rules, &req).unwrap().fits);
        assert_eq!(index.static_evaluations(), 5);
        index.delete_node("b");
        assert!(!index.fit(&rules, &req).unwrap().fits);
        assert_eq!(index.static_evaluations(), 5);
        // A pod event keeps the layout (and the verdicts).
        let layout = index.usable.clone();
        index.apply_pod(PodRecord::from_pod(&pod(
            "x",
            json!({"cpu": "1"}),
            Some("a"),
        )));
        assert!(Arc::ptr_eq(&layout, &index.usable));
        // Forgotten, every node is evaluated again (the benches' baseline).
        index.forget_static_verdicts();
        assert!(!index.fit(&rules, &req).unwrap().fits);
        assert_eq!(index.static_evaluations(), 8);
    }

    #[test]
    fn free_capacity_is_a_read_and_generations_move() {
        let mut index = CapacityIndex::new();
        index.apply_node(node(
            "a",
            json!({"cpu": "8", "nvidia.com/gpu": "8"}),
            json!({}),
        ));
        let g0 = index.generation();
        index.apply_pod(PodRecord::from_pod(&pod(
            "x",
            json!({"nvidia.com/gpu": "2"}),
            Some("a"),
        )));
        assert!(index.generation() > g0);
        let s = index.node_free().unwrap();
        assert_eq!(
            crate::capacity::canonical_map(&s.usable[0].free)["nvidia.com/gpu"],
            "6"
        );
        let g1 = index.generation();
        index.apply_pod(PodRecord::from_pod(&pod(
            "x",
            json!({"nvidia.com/gpu": "2"}),
            Some("a"),
        )));
        assert_eq!(index.generation(), g1, "nothing the record keeps changed");
        assert!(index.delete_pod("default", "x").is_some());
        let s = index.node_free().unwrap();
        assert_eq!(
            crate::capacity::canonical_map(&s.usable[0].free)["nvidia.com/gpu"],
            "8"
        );
    }
}
