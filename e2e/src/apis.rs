//! The dynamic APIs the suites read and write: raygate's UpgradePlans and KubeRay's
//! RayServices and RayClusters in a namespace (one definition, not one per suite).

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};

fn namespaced(
    client: &Client,
    ns: &str,
    gvk: GroupVersionKind,
    plural: &str,
) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

/// `raygate.io/v1alpha1` UpgradePlans in `ns`.
pub fn plan_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    namespaced(
        client,
        ns,
        GroupVersionKind::gvk("raygate.io", "v1alpha1", "UpgradePlan"),
        "upgradeplans",
    )
}

/// `ray.io/v1` RayServices in `ns`.
pub fn rs_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    namespaced(
        client,
        ns,
        GroupVersionKind::gvk("ray.io", "v1", "RayService"),
        "rayservices",
    )
}

/// `ray.io/v1` RayClusters in `ns`.
pub fn rc_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    namespaced(
        client,
        ns,
        GroupVersionKind::gvk("ray.io", "v1", "RayCluster"),
        "rayclusters",
    )
}
