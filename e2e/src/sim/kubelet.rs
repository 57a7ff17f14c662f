//! The part of a kubelet the simulation needs, for pods bound to fake nodes: report them
//! Running/Ready once the real scheduler has bound them, and finish graceful deletions
//! (without a kubelet a bound pod would stay Terminating forever and keep its node capacity).

use super::kube::Kube;
use crate::json::{arr_at, get, now_rfc3339, str_at};
use anyhow::Result;
use kube::api::{DeleteParams, Patch, Preconditions};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// `utils.IsRunningAndReady`.
pub fn is_running_and_ready(pod: &Value) -> bool {
    str_at(pod, &["status", "phase"]) == "Running"
        && arr_at(pod, &["status", "conditions"])
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

pub fn is_terminating(pod: &Value) -> bool {
    get(pod, &["metadata", "deletionTimestamp"]).is_some()
}

/// The status a kubelet would report for a started pod whose containers are all ready.
pub fn running_status(pod: &Value) -> Value {
    let now = now_rfc3339();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
    let uid = str_at(pod, &["metadata", "uid"]);
    let container_status = |c: &Value, init: bool| {
        let name = str_at(c, &["name"]);
        let image = str_at(c, &["image"]);
        let state = if init {
            json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}})
        } else {
            json!({"running": {"startedAt": now}})
        };
        let mut s = json!({
            "name": name,
            "image": image,
            "imageID": format!("kuberay-sim://{image}"),
            "containerID": format!("kuberay-sim://{uid}/{name}"),
            "ready": true,
            "restartCount": 0,
            "state": state,
        });
        if !init {
            s["started"] = json!(true);
        }
        s
    };
    let containers: Vec<Value> = arr_at(pod, &["spec", "containers"])
        .iter()
        .map(|c| container_status(c, false))
        .collect();
    let inits: Vec<Value> = arr_at(pod, &["spec", "initContainers"])
        .iter()
        .map(|c| container_status(c, true))
        .collect();
    let mut status = json!({
        "phase": "Running",
        "startTime": now,
        "conditions": [cond("Initialized"), cond("Ready"), cond("ContainersReady")],
        "containerStatuses": containers,
    });
    if !inits.is_empty() {
        status["initContainerStatuses"] = json!(inits);
    }
    json!({ "status": status })
}

/// Acts on every listed pod bound to a fake node. Returns the pods with updated statuses
/// (terminated pods are dropped).
pub async fn run_pods(k: &Kube, pods: Vec<Value>, fake_nodes: &BTreeSet<String>) -> Vec<Value> {
    let mut out = Vec::with_capacity(pods.len());
    for pod in pods {
        let node = str_at(&pod, &["spec", "nodeName"]).to_string();
        if node.is_empty() || !fake_nodes.contains(&node) {
            out.push(pod);
            continue;
        }
        match step(k, &pod).await {
            Ok(Some(updated)) => out.push(updated),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(pod = str_at(&pod, &["metadata", "name"]), error = %format!("{e:#}"), "kubelet step failed");
                out.push(pod);
            }
        }
    }
    out
}

async fn step(k: &Kube, pod: &Value) -> Result<Option<Value>> {
    let ns = str_at(pod, &["metadata", "namespace"]);
    let name = str_at(pod, &["metadata", "name"]);
    if is_terminating(pod) {
        // The kubelet's final step of graceful deletion: delete with grace period 0.
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(str_at(pod, &["metadata", "uid"]).to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        k.delete(&k.res.pod, ns, name, &dp).await?;
        tracing::info!(pod = name, namespace = ns, "finished pod termination");
        return Ok(None);
    }
    let phase = str_at(pod, &["status", "phase"]);
    if phase == "Running" || phase == "Succeeded" || phase == "Failed" {
        return Ok(Some(pod.clone()));
    }
    let patch = Patch::Strategic(running_status(pod));
    let updated = k.patch_status(&k.res.pod, Some(ns), name, &patch).await?;
    tracing::info!(
        pod = name,
        namespace = ns,
        node = str_at(pod, &["spec", "nodeName"]),
        "pod marked Running"
    );
    Ok(Some(updated))
}
