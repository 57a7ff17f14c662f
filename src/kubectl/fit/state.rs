//! The cluster state read live, as the controller caches it: nodes, LimitRanges,
//! RuntimeClasses, DRA objects and non-terminal pods page by page.

use k8s_openapi::api::core::v1::{LimitRange, Node};
use kube::Client;
use kube::api::{Api, ListParams, ObjectList};

use crate::capacity::record::Strings;
use crate::capacity::slim;
use crate::capacity::{ClusterState, PartialPod, PodRecord};
use crate::kubectl::PAGE;
use crate::{Error, Result};

/// Nodes and LimitRanges slimmed as the controller caches them, and
/// non-terminal pods as its records, page by page.
pub(super) async fn live_state(client: &Client) -> Result<ClusterState> {
    let mut nodes: Vec<Node> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    nodes.iter_mut().for_each(slim::slim_node);
    let mut limit_ranges: Vec<LimitRange> = Api::<LimitRange>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    limit_ranges.iter_mut().for_each(slim::slim_limit_range);
    // Pods as the controller watches them: partial objects straight into records,
    // a page at a time, so a large cluster's full Pods are never all in memory.
    let pods_api = Api::<PartialPod>::all(client.clone());
    let mut strings = Strings::default();
    let mut pods = vec![];
    let mut lp = ListParams::default()
        .limit(PAGE)
        .fields("status.phase!=Succeeded,status.phase!=Failed");
    while let Some(token) = add_page(&mut pods, &mut strings, pods_api.list(&lp).await?) {
        lp = lp.continue_token(&token);
    }
    if nodes.is_empty() {
        return Err(Error::invalid("cluster state", "the cluster has no nodes"));
    }
    let runtime_classes = Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let (dra, warnings) = live_dra(client).await;
    Ok(ClusterState {
        nodes,
        pods,
        limit_ranges,
        runtime_classes,
        strings,
        dra,
        // Live, the quota is the controller's decision's (`decide_live`).
        kueue: Default::default(),
        warnings,
    })
}

/// The cluster's resource.k8s.io/v1 objects; a kind that cannot be listed (an older
/// cluster, no RBAC) is left out with a warning: its devices then count as absent.
async fn live_dra(client: &Client) -> (crate::capacity::dra::DraState, Vec<String>) {
    use k8s_openapi::api::resource::v1::{
        DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
    };
    let mut dra = crate::capacity::dra::DraState::default();
    let mut warnings = Vec::new();
    let lp = ListParams::default();
    match Api::<ResourceSlice>::all(client.clone()).list(&lp).await {
        Ok(l) => l.items.iter().for_each(|o| {
            dra.apply_slice(o);
        }),
        Err(e) => warnings.push(format!("resourceslices not read: {e}")),
    }
    match Api::<DeviceClass>::all(client.clone()).list(&lp).await {
        Ok(l) => l.items.iter().for_each(|o| {
            dra.apply_class(o);
        }),
        Err(e) => warnings.push(format!("deviceclasses not read: {e}")),
    }
    match Api::<ResourceClaim>::all(client.clone()).list(&lp).await {
        Ok(l) => l.items.iter().for_each(|o| {
            dra.apply_claim(o);
        }),
        Err(e) => warnings.push(format!("resourceclaims not read: {e}")),
    }
    match Api::<ResourceClaimTemplate>::all(client.clone())
        .list(&lp)
        .await
    {
        Ok(l) => l.items.iter().for_each(|o| {
            dra.apply_template(o);
        }),
        Err(e) => warnings.push(format!("resourceclaimtemplates not read: {e}")),
    }
    (dra, warnings)
}

/// Adds a page of listed pods as records; the token of the next page, if any.
fn add_page(
    pods: &mut Vec<PodRecord>,
    strings: &mut Strings,
    page: ObjectList<PartialPod>,
) -> Option<String> {
    pods.extend(page.items.iter().map(|p| p.to_record(strings)));
    page.metadata.continue_.filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{Value, json};

    #[test]
    fn listed_pages_become_the_records_of_the_full_pods() {
        let pod = |name: &str, node: &str| {
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ml",
                    "labels": {"ray.io/cluster": "chat-abcde", "ray.io/node-type": "worker"},
                    "managedFields": [{"manager": "kubelet", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]},
                "spec": {"nodeName": node,
                    "containers": [{"name": "ray-worker", "image": "ray:2.9",
                        "env": [{"name": "RAY_ADDRESS", "value": "x"}],
                        "readinessProbe": {"exec": {"command": ["true"]}},
                        "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"},
                                      "limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Running", "podIP": "10.244.0.7",
                    "conditions": [{"type": "Ready", "status": "True"}]}
            })
        };
        let list = |items: Vec<Value>, token: &str| -> ObjectList<PartialPod> {
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PodList",
                "metadata": {"resourceVersion": "42", "continue": token},
                "items": items,
            }))
            .unwrap()
        };
        let (first, second) = (pod("w-1", "gpu-1"), pod("w-2", "gpu-2"));
        let (mut pods, mut strings) = (vec![], Strings::default());
        let next = add_page(&mut pods, &mut strings, list(vec![first.clone()], "page-2"));
        assert_eq!(next.as_deref(), Some("page-2"));
        // The last page has an empty continue token.
        let next = add_page(&mut pods, &mut strings, list(vec![second.clone()], ""));
        assert_eq!(next, None);
        let full: Vec<PodRecord> = [first, second]
            .into_iter()
            .map(|p| PodRecord::from_pod(&serde_json::from_value::<Pod>(p).unwrap()))
            .collect();
        assert_eq!(pods, full);
        assert_eq!(pods[1].body.cluster(), Some("chat-abcde"));
    }
}
