//! A DRA driver stood in by the test (the real kube-scheduler allocates from what it
//! publishes): ResourceSlices of `gpu.example.com` devices, one pool per node, and the
//! DeviceClass `gpu` that maps `nvidia.com/gpu` to them (DRAExtendedResource, on by default
//! in v1.36).

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt, stream};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
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

/// ResourceClaims of every namespace (the scheduler makes one per pod whose extended
/// resource it allocates from devices).
pub fn claims_api(client: &Client) -> Api<DynamicObject> {
    all(client, "ResourceClaim", "resourceclaims")
}

/// Publishes one pool per node of `nodes` as a driver would at start: a single
/// ResourceSlice `<node>-gpus` (generation 1) of devices `gpu-0`..`gpu-<devices-1>`,
/// `in_flight` creates at a time (thousands of nodes one by one would take minutes).
/// Returns the slices created.
pub async fn publish_pools(
    client: &Client,
    nodes: &[String],
    devices: usize,
    in_flight: usize,
) -> Result<usize> {
    let slices = slices_api(client);
    stream::iter(nodes.iter().map(|node| {
        let slices = slices.clone();
        async move {
            let obj = slice(&format!("{node}-gpus"), node, 1, 1, 0..devices);
            slices
                .create(&PostParams::default(), &serde_json::from_value(obj)?)
                .await
                .with_context(|| format!("create the ResourceSlice of node {node}"))?;
            Ok::<_, anyhow::Error>(())
        }
    }))
    .buffer_unordered(in_flight.max(1))
    .try_collect::<Vec<_>>()
    .await?;
    Ok(nodes.len())
}
