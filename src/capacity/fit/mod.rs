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

mod entry;
mod explain;
mod overlay;
mod placer;

use std::collections::BTreeMap;

use serde::Serialize;

use super::ResourceList;
use super::node::{Capacity, SkippedNode, capacity};
use super::scheduling::Wording;
use crate::capacity::ClusterState;
use crate::podgroup::PodGroup;

pub use explain::REASON_DEVICES;
pub(crate) use placer::Placer;

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
    /// Usable nodes whose DRA pool is being republished: its newest generation's
    /// ResourceSlices are not all there yet, so the scheduler allocates none of that
    /// pool's devices and neither does the fit. Said in the hold's message, where a
    /// resource would otherwise look like a name no node offers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dra_pools_updating: Vec<String>,
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

#[cfg(test)]
mod tests;
