//! The slim copies raygate caches: only what capacity reads, so a watch of
//! every Node costs what the index needs, not what the kubelet publishes.
//! Shared by the controller's caches and `kubectl raygate`'s snapshot.

use k8s_openapi::api::core::v1::{LimitRange, Node};

/// Keep only what node capacity reads; `status.images` alone can be large.
pub fn slim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    // Moves with every heartbeat: kept, each one would count as a change of
    // the node in the capacity index (a new generation, the admission pass
    // computed again) though nothing the index reads changed.
    node.metadata.resource_version = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.node_info = None;
        status.daemon_endpoints = None;
        status.addresses = None;
        if let Some(cs) = status.conditions.as_mut() {
            cs.retain(|c| c.type_ == "Ready");
            for c in cs.iter_mut() {
                // Heartbeats change every few seconds and mean nothing here.
                c.last_heartbeat_time = None;
            }
        }
    }
}

pub fn slim_limit_range(lr: &mut LimitRange) {
    lr.metadata.managed_fields = None;
}
