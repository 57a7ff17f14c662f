//! A DRA driver stood in by the test (the real kube-scheduler allocates from what it
//! publishes): ResourceSlices of `gpu.example.com` devices, one pool per node, and the
//! DeviceClass `gpu` that maps `nvidia.com/gpu` to them (DRAExtendedResource, on by default
//! in v1.36).

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

/// The driver the slices name.
pub const DRIVER: &str = "gpu.example.com";
/// The class's selector matching every device of the driver.
pub const EVERY_DEVICE: &str = "device.driver == \"gpu.example.com\"";
/// The class's selector matching devices `gpu-0`..`gpu-7` only (a narrowed class).
pub const LOW_DEVICES: &str =
    "device.driver == \"gpu.example.com\" && device.attributes[\"gpu.example.com\"].index < 8";

/// One ResourceSlice of `node`'s pool at `generation` (of `count` slices), with devices
/// `gpu-<i>` for `i` in `devices` (attribute `index` = i).
pub fn slice(
    name: &str,
    node: &str,
    generation: i64,
    count: i64,
    devices: std::ops::Range<usize>,
) -> Value {
    let devices: Vec<Value> = devices
        .map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"index": {"int": i}}}))
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": devices}})
}

/// The DeviceClass `gpu`, selecting with `cel`, behind `nvidia.com/gpu`.
pub fn gpu_class(cel: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": cel}}],
            "extendedResourceName": "nvidia.com/gpu"}})
}

fn all(client: &Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("resource.k8s.io", "v1", kind),
            plural,
        ),
    )
}

pub fn slices_api(client: &Client) -> Api<DynamicObject> {
    all(client, "ResourceSlice", "resourceslices")
}

pub fn classes_api(client: &Client) -> Api<DynamicObject> {
    all(client, "DeviceClass", "deviceclasses")
}
