//! Which nodes can take pods, and what is free on each.
//!
//! Free = allocatable − Σ requests of the non-terminal pods bound to the node
//! (`spec.nodeName`), in scheduler units (see the module docs of
//! [`crate::capacity`]). Every such pod also takes one of `allocatable.pods`.
//! Pods are indexed by node in one pass, so the cost is O(nodes + pods).

use std::borrow::Cow;
use std::collections::HashMap;

use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

pub use super::scheduling::node_name;

use super::requests::Req;
use super::{PODS, ResourceList, from_scheduler_units, parse_resource_list_with, scheduler_units};
use crate::capacity::ClusterState;

pub(crate) use super::ids::{NodeId, ResourceId};

/// A node left out of the capacity, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedNode {
    pub node: String,
    pub reason: String,
    /// The reason in scheduler words, for the aggregated message.
    #[serde(skip)]
    pub scheduler_reason: &'static str,
}

/// A usable node's capacity.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFree {
    pub node: String,
    pub allocatable: ResourceList,
    pub requested: ResourceList,
    pub free: ResourceList,
    /// Non-terminal pods bound here.
    pub pods: usize,
}

/// All nodes, split into usable (sorted by name) and skipped.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    pub usable: Vec<NodeFree>,
    pub skipped: Vec<SkippedNode>,
}

/// Why a node cannot take new pods, if it cannot.
pub fn skip_reason(node: &Node) -> Option<(String, &'static str)> {
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return Some((
            "unschedulable (cordoned)".to_string(),
            super::scheduling::REASON_UNSCHEDULABLE,
        ));
    }
    let status = node.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => {}
        Some(c) => {
            return Some((
                format!("not ready (Ready condition is {})", c.status),
                "node(s) were not ready",
            ));
        }
        None => {
            return Some((
                "not ready (no Ready condition)".to_string(),
                "node(s) were not ready",
            ));
        }
    }
    if status
        .and_then(|s| s.allocatable.as_ref())
        .is_none_or(|a| a.is_empty())
    {
        return Some((
            "no allocatable resources in status".to_string(),
            "node(s) had no allocatable resources",
        ));
    }
    None
}

/// Interns resource names so per-node amounts are dense vectors.
#[derive(Default, Debug, Clone)]
pub(crate) struct Names {
    index: HashMap<String, usize>,
    pub(crate) names: Vec<String>,
}

impl Names {
    pub(crate) fn id(&mut self, name: &str) -> ResourceId {
        if let Some(&i) = self.index.get(name) {
            return ResourceId::from(i);
        }
        let i = self.names.len();
        self.names.push(name.to_string());
        self.index.insert(name.to_string(), i);
        ResourceId::from(i)
    }

    pub(crate) fn get(&self, name: &str) -> Option<ResourceId> {
        self.index.get(name).copied().map(ResourceId::from)
    }

    /// The name of `r`; empty for an id this table did not hand out.
    pub(crate) fn name(&self, r: ResourceId) -> &str {
        self.names.get(r.index()).map(String::as_str).unwrap_or("")
    }
}

/// Amounts in scheduler units, indexed by [`Names`]; missing = 0.
pub(crate) type Amounts = Vec<i128>;

/// Amount `i`; ids past the end (a resource no node has) are 0.
pub(crate) fn amount(v: &[i128], r: ResourceId) -> i128 {
    v.get(r.index()).copied().unwrap_or(0)
}

pub(crate) fn add_amount(v: &mut Amounts, r: ResourceId, x: i128) {
    let i = r.index();
    if v.len() <= i {
        v.resize(i + 1, 0);
    }
    v[i] = v[i].saturating_add(x);
}

/// A request in scheduler units, always including one pod slot.
pub(crate) fn units_of(list: &Req<'_>, names: &mut Names) -> Vec<(ResourceId, i128)> {
    let mut out: Vec<(ResourceId, i128)> = list
        .iter()
        .filter(|(k, _)| **k != PODS)
        .map(|(k, q)| (names.id(k), scheduler_units(k, q)))
        .filter(|&(_, u)| u != 0)
        .collect();
    out.push((names.id(PODS), 1));
    out
}

pub(crate) fn to_list(v: &[i128], names: &Names) -> ResourceList {
    v.iter()
        .enumerate()
        .filter(|(_, u)| **u != 0)
        .filter_map(|(i, &u)| {
            let n = names.names.get(i)?;
            Some((n.clone(), from_scheduler_units(n, u)))
        })
        .collect()
}

/// The usable nodes as the fit simulation sees them. Borrowed from the
/// index (no per-decision copy of 5,000 aggregates) or owned when computed
/// from scratch.
#[derive(Debug, Clone)]
pub(crate) struct Capacity<'a> {
    pub(crate) names: Cow<'a, Names>,
    /// Usable nodes, sorted by name.
    pub(crate) nodes: Vec<&'a Node>,
    /// Per usable node, in the order of `nodes`.
    pub(crate) rows: Cow<'a, Rows>,
    pub(crate) skipped: Cow<'a, [SkippedNode]>,
    pub(crate) bound: Bound<'a>,
    /// The index's cache of static verdicts and its node layout (the
    /// `Arc`s behind `nodes`); none from scratch.
    pub(crate) statics: Option<(&'a super::statics::StaticsCache, &'a super::statics::Layout)>,
    /// The cluster's DRA objects, when it has any (see [`super::dra`]).
    pub(crate) dra: Option<&'a super::dra::DraState>,
    /// The index's kept `dra::assume::unseen` and its pod-and-node generation; none from
    /// scratch.
    pub(crate) unseen: Option<(&'a super::dra::unseen::UnseenCache, u64)>,
}

/// Which pods are bound to a usable node and counted there.
#[derive(Debug, Clone)]
pub(crate) enum Bound<'a> {
    /// (namespace, name), from a from-scratch pass.
    Set(std::collections::HashSet<(String, String)>),
    /// Looked up in the incremental index.
    Index(&'a dyn Counted),
}

/// Which pods are counted on a usable node, asked of the incremental index
/// ([`super::index::CapacityIndex`]) without this oracle depending on it.
pub(crate) trait Counted: std::fmt::Debug + Sync {
    fn counted_on_usable(&self, ns: &str, name: &str) -> bool;
}

impl Bound<'_> {
    pub(crate) fn contains(&self, ns: &str, name: &str) -> bool {
        match self {
            Bound::Set(s) => s.contains(&(ns.to_string(), name.to_string())),
            Bound::Index(i) => i.counted_on_usable(ns, name),
        }
    }
}

impl Capacity<'_> {
    /// What is free on node `n`, one amount per resource id (`width` of them).
    pub(crate) fn free(&self, n: NodeId) -> &[i128] {
        self.rows.free(n)
    }
}

/// Per-node amounts as dense rows of `width` resource ids, one allocation
/// for all nodes: reading node `n` is a slice, and the index patches one
/// row per pod event instead of the fit copying every node's vector.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Rows {
    width: usize,
    allocatable: Vec<i128>,
    requested: Vec<i128>,
    /// `max(0, allocatable − requested)`, kept with the two.
    free: Vec<i128>,
    pods: Vec<usize>,
}

impl Rows {
    /// Empty rows for resource ids `0..width`.
    pub(crate) fn new(width: usize, nodes: usize) -> Rows {
        Rows {
            width,
            allocatable: Vec::with_capacity(width * nodes),
            requested: Vec::with_capacity(width * nodes),
            free: Vec::with_capacity(width * nodes),
            pods: Vec::with_capacity(nodes),
        }
    }

    pub(crate) fn width(&self) -> usize {
        self.width
    }

    pub(crate) fn len(&self) -> usize {
        self.pods.len()
    }

    /// Appends a node's row; ids at or past `width` must be zero.
    pub(crate) fn push(&mut self, allocatable: &[i128], requested: &[i128], pods: usize) {
        let w = self.width;
        self.allocatable
            .extend(ResourceId::all(w).map(|r| amount(allocatable, r)));
        self.requested
            .extend(ResourceId::all(w).map(|r| amount(requested, r)));
        self.free.extend(ResourceId::all(w).map(|r| {
            amount(allocatable, r)
                .saturating_sub(amount(requested, r))
                .max(0)
        }));
        self.pods.push(pods);
    }

    /// Replaces row `n`'s requests (a pod came or went).
    pub(crate) fn set_requested(&mut self, n: NodeId, requested: &[i128], pods: usize) {
        let (w, n) = (self.width, n.index());
        for i in 0..w {
            let r = amount(requested, ResourceId::from(i));
            self.requested[n * w + i] = r;
            self.free[n * w + i] = self.allocatable[n * w + i].saturating_sub(r).max(0);
        }
        self.pods[n] = pods;
    }

    fn row(v: &[i128], w: usize, n: NodeId) -> &[i128] {
        v.get(n.index() * w..(n.index() + 1) * w).unwrap_or(&[])
    }

    pub(crate) fn allocatable(&self, n: NodeId) -> &[i128] {
        Self::row(&self.allocatable, self.width, n)
    }

    pub(crate) fn requested(&self, n: NodeId) -> &[i128] {
        Self::row(&self.requested, self.width, n)
    }

    pub(crate) fn free(&self, n: NodeId) -> &[i128] {
        Self::row(&self.free, self.width, n)
    }

    pub(crate) fn pods(&self, n: NodeId) -> usize {
        self.pods.get(n.index()).copied().unwrap_or(0)
    }

    /// Column sums over every row of `v`.
    fn column_sums(&self, v: &[i128]) -> Amounts {
        let mut out = vec![0i128; self.width];
        for row in v.chunks_exact(self.width.max(1)) {
            for (o, x) in out.iter_mut().zip(row) {
                *o = o.saturating_add(*x);
            }
        }
        out
    }

    pub(crate) fn total_allocatable(&self) -> Amounts {
        self.column_sums(&self.allocatable)
    }

    pub(crate) fn total_free(&self) -> Amounts {
        self.column_sums(&self.free)
    }
}

/// A node's allocatable in scheduler units.
pub(crate) fn allocatable_of(node: &Node, names: &mut Names) -> crate::Result<Amounts> {
    let mut a = Amounts::new();
    if let Some(alloc) = node.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
        let field = || format!("node {}: status.allocatable", node_name(node));
        for (k, q) in parse_resource_list_with(field, alloc)? {
            add_amount(&mut a, names.id(&k), scheduler_units(&k, &q));
        }
    }
    Ok(a)
}

/// The error a pod record kept when its request did not parse, as it was.
pub(crate) fn record_error(message: &str) -> crate::Error {
    match message.split_once(": ") {
        Some((what, reason)) => crate::Error::invalid(what, reason),
        None => crate::Error::invalid("pod", message),
    }
}

/// The from-scratch computation: every pod, every time. The controller
/// keeps [`super::index::CapacityIndex`] instead; this stays as the
/// one-shot path (`raygate fit --state`) and as the index's test oracle.
pub(crate) fn capacity(state: &ClusterState) -> crate::Result<Capacity<'_>> {
    let mut names = Names::default();
    names.id(PODS);
    let mut skipped = Vec::new();
    let mut usable: Vec<&Node> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for node in &state.nodes {
        let name = node_name(node);
        if !seen.insert(name) {
            continue; // a duplicate listing of the same node
        }
        match skip_reason(node) {
            Some((reason, sched)) => skipped.push(SkippedNode {
                node: name.to_string(),
                reason,
                scheduler_reason: sched,
            }),
            None => usable.push(node),
        }
    }
    usable.sort_by(|a, b| node_name(a).cmp(node_name(b)));
    skipped.sort_by(|a, b| a.node.cmp(&b.node));

    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(usable.len());
    let mut allocatable = Vec::with_capacity(usable.len());
    for (slot, node) in usable.iter().enumerate() {
        by_name.insert(node_name(node), slot);
        allocatable.push(allocatable_of(node, &mut names)?);
    }

    let mut requested = vec![Amounts::new(); usable.len()];
    let mut pods = vec![0usize; usable.len()];
    let mut bound = std::collections::HashSet::new();
    for pod in &state.pods {
        let Some(node) = pod.body.holds() else {
            continue; // not bound (holds nothing yet) or terminal
        };
        let Some(&slot) = by_name.get(node) else {
            continue; // bound to a skipped or unknown node
        };
        let units = pod.body.units_with_slot().map_err(|e| record_error(&e))?;
        for (r, u) in units {
            add_amount(&mut requested[slot], names.id(r), u);
        }
        pods[slot] += 1;
        bound.insert((pod.key.0.to_string(), pod.key.1.to_string()));
    }
    let mut rows = Rows::new(names.names.len(), usable.len());
    for n in 0..usable.len() {
        rows.push(&allocatable[n], &requested[n], pods[n]);
    }
    Ok(Capacity {
        names: Cow::Owned(names),
        nodes: usable,
        rows: Cow::Owned(rows),
        skipped: Cow::Owned(skipped),
        bound: Bound::Set(bound),
        statics: None,
        dra: (!state.dra.is_empty()).then_some(&state.dra),
        unseen: None,
    })
}

/// Per-node capacity of the cluster; see the module docs.
pub fn node_free(state: &ClusterState) -> crate::Result<NodeSummary> {
    summary(&capacity(state)?)
}

/// Per-node capacity from a computed [`Capacity`].
pub(crate) fn summary(cap: &Capacity<'_>) -> crate::Result<NodeSummary> {
    let usable = NodeId::all(cap.nodes.len())
        .zip(&cap.nodes)
        .map(|(n, node)| NodeFree {
            node: node_name(node).to_string(),
            allocatable: to_list(cap.rows.allocatable(n), &cap.names),
            requested: to_list(cap.rows.requested(n), &cap.names),
            free: {
                // Keep zero-free entries for resources the node has.
                let free = cap.free(n);
                cap.rows
                    .allocatable(n)
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| **a != 0)
                    .filter_map(|(i, _)| {
                        let name = cap.names.names.get(i)?;
                        Some((
                            name.clone(),
                            from_scheduler_units(name, amount(free, i.into())),
                        ))
                    })
                    .collect()
            },
            pods: cap.rows.pods(n),
        })
        .collect();
    Ok(NodeSummary {
        usable,
        skipped: cap.skipped.to_vec(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::capacity::canonical_map;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{Value, json};
    use std::collections::BTreeMap;

    /// A Ready node with `allocatable` (pods: 110 unless given).
    pub(crate) fn node(name: &str, alloc: Value, labels: Value) -> Node {
        let mut alloc = alloc;
        if let Some(m) = alloc.as_object_mut() {
            m.entry("pods").or_insert(json!("110"));
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap()
    }

    /// A single-container pod requesting `req`, optionally bound to `node`.
    pub(crate) fn pod(name: &str, req: Value, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [
                {"name": "c", "resources": {"requests": req}}]}
        }))
        .unwrap()
    }

    fn state(nodes: Vec<Node>, pods: Vec<Pod>) -> ClusterState {
        ClusterState {
            nodes,
            pods: pods.iter().map(super::super::PodRecord::from_pod).collect(),
            ..Default::default()
        }
    }

    fn free_of(s: &NodeSummary, node: &str) -> BTreeMap<String, String> {
        let n = s.usable.iter().find(|n| n.node == node).unwrap();
        canonical_map(&n.free)
    }

    #[test]
    fn free_subtracts_bound_non_terminal_pods() {
        let mut done = pod("done", json!({"cpu": "4"}), Some("a"));
        done.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
        let mut failed = pod("failed", json!({"nvidia.com/gpu": "8"}), Some("a"));
        failed.status = Some(serde_json::from_value(json!({"phase": "Failed"})).unwrap());
        let mut running = pod(
            "run",
            json!({"cpu": "1500m", "memory": "4Gi", "nvidia.com/gpu": "2"}),
            Some("a"),
        );
        running.status = Some(serde_json::from_value(json!({"phase": "Running"})).unwrap());
        let s = state(
            vec![node(
                "a",
                json!({"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"}),
                json!({}),
            )],
            vec![
                running,
                pod("pending", json!({"cpu": "1"}), Some("a")), // bound, no phase yet
                pod("unbound", json!({"cpu": "7"}), None),
                pod("elsewhere", json!({"cpu": "7"}), Some("gone")),
                done,
                failed,
            ],
        );
        let sum = node_free(&s).unwrap();
        assert_eq!(
            free_of(&sum, "a"),
            BTreeMap::from([
                ("cpu".to_string(), "5500m".to_string()),
                ("memory".to_string(), "60Gi".to_string()),
                ("nvidia.com/gpu".to_string(), "6".to_string()),
                ("pods".to_string(), "108".to_string()),
            ])
        );
        assert_eq!(sum.usable[0].pods, 2);
        assert_eq!(canonical_map(&sum.usable[0].requested)["cpu"], "2500m");
    }

    #[test]
    fn pod_slots_run_out_and_overcommit_floors_at_zero() {
        let s = state(
            vec![node("a", json!({"cpu": "2", "pods": "2"}), json!({}))],
            vec![
                pod("p1", json!({"cpu": "2"}), Some("a")),
                pod("p2", json!({"cpu": "1"}), Some("a")),
                pod("p3", json!({}), Some("a")),
            ],
        );
        let sum = node_free(&s).unwrap();
        assert_eq!(free_of(&sum, "a")["pods"], "0");
        assert_eq!(free_of(&sum, "a")["cpu"], "0");
    }

    #[test]
    fn unusable_nodes_are_skipped_with_reasons() {
        let mut cordoned = node("c", json!({"cpu": "8"}), json!({}));
        cordoned.spec = Some(serde_json::from_value(json!({"unschedulable": true})).unwrap());
        let not_ready: Node = serde_json::from_value(json!({"metadata": {"name": "nr"},
            "status": {"allocatable": {"cpu": "8"},
                       "conditions": [{"type": "Ready", "status": "False"}]}}))
        .unwrap();
        let unknown: Node = serde_json::from_value(json!({"metadata": {"name": "nu"},
            "status": {"allocatable": {"cpu": "8"}, "conditions": [{"type": "Ready", "status": "Unknown"}]}}))
        .unwrap();
        let no_cond: Node = serde_json::from_value(json!({"metadata": {"name": "nc"},
            "status": {"allocatable": {"cpu": "8"}}}))
        .unwrap();
        let no_alloc: Node = serde_json::from_value(json!({"metadata": {"name": "na"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
        .unwrap();
        let s = state(
            vec![
                cordoned,
                not_ready,
                unknown,
                no_cond,
                no_alloc,
                node("ok", json!({"cpu": "1"}), json!({})),
            ],
            vec![pod("on-cordoned", json!({"cpu": "1"}), Some("c"))],
        );
        let sum = node_free(&s).unwrap();
        assert_eq!(sum.usable.len(), 1);
        assert_eq!(sum.usable[0].node, "ok");
        let skipped: Vec<(&str, &str)> = sum
            .skipped
            .iter()
            .map(|s| (s.node.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(
            skipped,
            [
                ("c", "unschedulable (cordoned)"),
                ("na", "no allocatable resources in status"),
                ("nc", "not ready (no Ready condition)"),
                ("nr", "not ready (Ready condition is False)"),
                ("nu", "not ready (Ready condition is Unknown)"),
            ]
        );
    }

    #[test]
    fn malformed_allocatable_is_an_error() {
        let s = state(vec![node("a", json!({"cpu": "eight"}), json!({}))], vec![]);
        let err = node_free(&s).unwrap_err().to_string();
        assert!(
            err.starts_with("node a: status.allocatable[cpu]: invalid quantity"),
            "{err}"
        );
    }
}
