//! Devices a bound pod holds before raygate has seen its claim allocated.
//!
//! For a pod's DRA-backed extended resource (`nvidia.com/gpu` mapped by a DeviceClass), the
//! scheduler creates a claim for the pod, writes its allocation and only then binds the pod
//! (`DynamicResources` PreBind). raygate reads pods and claims on two watches, so it can see
//! the pod bound before the claim's allocation: the devices then look free while the pod
//! holds them, and an upgrade was admitted on them (the DRA soak, seed 1796650050817463273:
//! two upgrades admitted on the same freed devices; the second's pod Unschedulable). The
//! scheduler itself never sees this gap, as its assume cache holds the allocation it wrote.
//!
//! So per node and mapped resource: what the bound pods there request, less what the
//! allocated extended-resource claims of those same pods hold, is held too ([`unseen`]),
//! taken first fit from the class's free devices as the allocator would. A claim whose pod is
//! gone (left allocated until `resourceclaim-controller` deletes it) covers nothing: its
//! devices are held through the claim already, and the scheduler counts them too.
//!
//! Not covered: claims a pod makes from a ResourceClaimTemplate (the pod's claims are not in
//! raygate's slim pod record); the scheduler writes their allocation before binding in the
//! same way, so the window is the same one watch event.

use std::collections::HashMap;
use std::sync::Arc;

pub(crate) use super::unseen::{Unseen, UnseenCache};
use super::{DraState, Mode, class_for_resource};
use crate::capacity::node::{Capacity, NodeId, amount, node_name};

/// What the bound pods of each usable node hold through DRA-backed extended resources
/// beyond the allocated claims raygate has seen for them (see the module docs).
pub(crate) fn unseen(state: &DraState, cap: &Capacity<'_>) -> Unseen {
    unseen_reading(state, cap, &mut false)
}

/// [`unseen`], setting `read_slices` when a claim's node came from its pool's slices.
fn unseen_reading(state: &DraState, cap: &Capacity<'_>, read_slices: &mut bool) -> Unseen {
    // 1. The extended resources a DeviceClass maps, among those some pod requests.
    let mapped: Vec<(crate::capacity::node::ResourceId, &str)> = cap
        .names
        .names
        .iter()
        .filter_map(|name| {
            let class = class_for_resource(state, name)?;
            Some((cap.names.get(name)?, class))
        })
        .collect();
    if mapped.is_empty() {
        return Unseen::new();
    }
    // 2. Per node where no device plugin serves it: what the bound pods request.
    let mut wanted: HashMap<(&str, &str), (NodeId, i128)> = HashMap::new();
    for (n, node) in NodeId::all(cap.nodes.len()).zip(&cap.nodes) {
        let (alloc, req) = (cap.rows.allocatable(n), cap.rows.requested(n));
        for &(r, class) in &mapped {
            let asked = amount(req, r);
            if asked > 0 && amount(alloc, r) == 0 {
                wanted.entry((node_name(node), class)).or_insert((n, 0)).1 += asked;
            }
        }
    }
    if wanted.is_empty() {
        return Unseen::new();
    }
    // 3. Less what the allocated claims of those pods hold (a gone pod's claim covers
    //    nothing: its devices are held through the claim).
    for (key, claim) in state.extended_claims() {
        let (Some(pod), Some(first)) = (&claim.extended_for, claim.allocated.first()) else {
            continue;
        };
        let node = match &claim.node {
            Some(n) => Some(n.as_str()),
            None => {
                *read_slices = true;
                state.pool_node(&first.driver, &first.pool)
            }
        };
        let Some(node) = node else {
            continue;
        };
        let ns = key.split_once('/').map_or("", |(ns, _)| ns);
        let mut counted = None;
        for alt in claim
            .spec
            .requests
            .iter()
            .filter_map(|r| r.alternatives.first())
        {
            let Some(w) = wanted.get_mut(&(node, alt.class.as_str())) else {
                continue;
            };
            if !*counted.get_or_insert_with(|| cap.bound.contains(ns, pod)) {
                break;
            }
            if let Mode::Count(k) = alt.mode {
                w.1 -= i128::from(k);
            }
        }
    }
    // 4. What is left, per node.
    let mut out = Unseen::new();
    for ((_, class), (n, left)) in wanted {
        if left > 0 {
            out.entry(n)
                .or_default()
                .push((class.to_string(), u32::try_from(left).unwrap_or(u32::MAX)));
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// [`unseen`] of `cap`, from `cache` when nothing it read has changed: the pods and nodes
/// (`cluster`, the index's pod-and-node generation), the claims and classes, and the slices
/// only when a claim named no node (its node then comes from its pool's slices). Every
/// decision of a pass reads the same, and a ResourceSlice event (a driver republishing)
/// moves neither pods nor claims, so the claims are walked once per change of what they
/// depend on.
pub(crate) fn kept(
    cache: &UnseenCache,
    cluster: u64,
    state: &DraState,
    cap: &Capacity<'_>,
) -> Arc<Unseen> {
    let (claims, slices) = state.versions();
    cache.get_or(cluster, claims, slices, |read_slices| {
        unseen_reading(state, cap, read_slices)
    })
}
