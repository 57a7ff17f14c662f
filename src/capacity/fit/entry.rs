//! One entry per group of identical pods: its request in scheduler units, its size for
//! the order, and what it asks of DRA, computed once per group.

use std::rc::Rc;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::capacity::dra::{PodDemand, run::RequestsByNode};
use crate::capacity::node::{Names, ResourceId, units_of};
use crate::capacity::requests::{pod_name, pod_requests_borrowed, runtime_class_overhead};
use crate::capacity::{CPU, ClusterState, MEMORY, PODS, is_extended_resource};
use crate::podgroup::PodGroup;

/// One group of identical pods to place (see [`PodGroup`]).
pub(crate) struct Entry<'a> {
    /// The first pod's key, for ordering.
    pub(in crate::capacity) key: String,
    /// Every pod's key, in placement order.
    pub(in crate::capacity) keys: Vec<String>,
    pub(in crate::capacity) pod: &'a Pod,
    pub(in crate::capacity) reserved: bool,
    pub(in crate::capacity) req: Vec<(ResourceId, i128)>,
    pub(in crate::capacity) dominant: ResourceId,
    /// (accelerators, cpu, memory), compared descending.
    pub(in crate::capacity) size: (i128, i128, i128),
    /// What the pod asks of DRA; `None` on a cluster without DRA or a pod asking nothing.
    pub(in crate::capacity) dra: Option<Rc<PodDemand>>,
    /// Devices its claims ask, per class (`deviceclass.resource.kubernetes.io/<class>`),
    /// counted in the totals and the shortfall only.
    pub(in crate::capacity) devices: Vec<(ResourceId, i128)>,
    /// Per usable node, its DRA requests there.
    pub(in crate::capacity) dra_nodes: RequestsByNode,
    /// The ids of the extended resources a DeviceClass maps for it (`PodDemand::mapped`).
    pub(in crate::capacity) dra_mapped: Vec<ResourceId>,
    /// The static filters' feasible nodes less those whose devices can never serve it
    /// (one request, too few candidates whatever is held), built on its first scan.
    pub(in crate::capacity) dra_feasible: std::cell::RefCell<Option<Arc<[ScanNode]>>>,
}

pub(super) use crate::capacity::dra::view::ScanNode;

fn pod_key(pod: &Pod) -> String {
    match pod.metadata.namespace.as_deref().filter(|n| !n.is_empty()) {
        Some(ns) => format!("{ns}/{}", pod_name(pod)),
        None => pod_name(pod),
    }
}

/// The resource whose leftover decides best fit: the largest accelerator
/// request, else cpu, else memory, else pod slots.
fn dominant(req: &[(ResourceId, i128)], names: &Names) -> ResourceId {
    let name = |r: ResourceId| names.name(r);
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
    names.get(PODS).unwrap_or(ResourceId::from(0))
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
    let name = |r: ResourceId| names.name(r);
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
pub(super) fn signature(pod: &Pod) -> String {
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
pub(super) fn group_entry<'a>(
    g: &'a PodGroup,
    reserved: bool,
    state: &ClusterState,
    names: &mut Names,
    bound: &crate::capacity::node::Bound<'_>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::fit;
    use crate::capacity::fit::tests::{gpu_node, gpu_pod, request, state};
    use crate::capacity::node::tests::pod;
    use serde_json::json;

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
        assert_eq!(names.name(es[0].dominant), "nvidia.com/gpu");
        assert_eq!(names.name(es[2].dominant), "cpu");
    }
}
