//! The RayCluster side (KubeRay v1.7.0 `raycluster_controller.go` reconcilePods +
//! calculateStatus): keep one head and the desired workers per group, and report status.

use super::conditions;
use super::hash::hash_spec;
use super::kube::Kube;
use super::kubelet::{is_running_and_ready, is_terminating};
use super::names::*;
use super::pods::{autoscaling_enabled, head_pod, rand_suffix, worker_pod};
use crate::json::{arr_at, get, i64_at, now_rfc3339, str_at};
use crate::quantity::Quantity;
use anyhow::{Result, bail};
use kube::api::{DeleteParams, ListParams};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};

const MAX_I32: i64 = i32::MAX as i64;

/// `utils.GetWorkerGroupDesiredReplicas`: clamp(replicas, min, max) × numOfHosts, 0 if suspended.
pub fn desired_workers(group: &Value) -> i64 {
    if crate::json::bool_at(group, &["suspend"]) {
        return 0;
    }
    let min = i64_at(group, &["minReplicas"]).unwrap_or(0);
    let max = i64_at(group, &["maxReplicas"]).unwrap_or(MAX_I32);
    let r = match i64_at(group, &["replicas"]) {
        None => min,
        Some(r) if r < min => min,
        Some(r) if r > max => max,
        Some(r) => r,
    };
    r * num_of_hosts(group)
}

fn num_of_hosts(group: &Value) -> i64 {
    i64_at(group, &["numOfHosts"])
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

/// `utils.CheckAllPodsRunning`.
pub fn all_pods_running(pods: &[&Value]) -> bool {
    !pods.is_empty()
        && pods.iter().all(|p| {
            str_at(p, &["status", "phase"]) == "Running"
                && !arr_at(p, &["status", "conditions"])
                    .iter()
                    .any(|c| c["type"] == "Ready" && c["status"] != "True")
        })
}

fn suspend_status(cluster: &Value) -> &'static str {
    let conds = arr_at(cluster, &["status", "conditions"]);
    if conditions::is_true(conds, "RayClusterSuspending") {
        "RayClusterSuspending"
    } else if conditions::is_true(conds, "RayClusterSuspended") {
        "RayClusterSuspended"
    } else {
        ""
    }
}

fn is_worker(p: &Value) -> bool {
    str_at(p, &["metadata", "labels", NODE_TYPE_LABEL]) == "worker"
}

fn is_head(p: &Value) -> bool {
    str_at(p, &["metadata", "labels", NODE_TYPE_LABEL]) == "head"
}

/// Pods of this cluster, by the `ray.io/cluster` label.
pub fn cluster_pods<'a>(cluster: &Value, pods: &'a [Value]) -> Vec<&'a Value> {
    let ns = str_at(cluster, &["metadata", "namespace"]);
    let name = str_at(cluster, &["metadata", "name"]);
    pods.iter()
        .filter(|p| {
            str_at(p, &["metadata", "namespace"]) == ns
                && str_at(p, &["metadata", "labels", RAY_CLUSTER_LABEL]) == name
        })
        .collect()
}

/// Reconciles pods and status of one RayCluster. Returns the cluster as now stored.
pub async fn reconcile(k: &Kube, cluster: &Value, all_pods: &[Value]) -> Result<Value> {
    let managed_by = str_at(cluster, &["spec", "managedBy"]);
    if !managed_by.is_empty() && managed_by != KUBERAY_CONTROLLER {
        return Ok(cluster.clone());
    }
    if get(cluster, &["metadata", "deletionTimestamp"]).is_some() {
        return Ok(cluster.clone());
    }
    let ns = str_at(cluster, &["metadata", "namespace"]).to_string();
    let name = str_at(cluster, &["metadata", "name"]).to_string();
    let pods = cluster_pods(cluster, all_pods);
    let result = reconcile_pods(k, cluster, &pods).await;
    let changed = match &result {
        Ok(c) => *c,
        Err(e) => {
            tracing::warn!(cluster = %name, namespace = %ns, error = %format!("{e:#}"), "reconcile pods failed");
            true
        }
    };
    let fresh;
    let pods = if changed {
        let lp = ListParams::default().labels(&format!("{RAY_CLUSTER_LABEL}={name}"));
        let k_ns = Kube {
            namespace: Some(ns.clone()),
            ..k.clone()
        };
        fresh = k_ns.list(&k.res.pod, &lp).await?;
        fresh.iter().collect()
    } else {
        pods
    };
    let new_status = calculate_status(cluster, &pods, result.is_err());
    let old_status = cluster.get("status").cloned().unwrap_or_else(|| json!({}));
    if !inconsistent_cluster_status(&old_status, &new_status) {
        return Ok(cluster.clone());
    }
    let mut updated = cluster.clone();
    updated["status"] = new_status;
    let stored = k.replace_status(&k.res.ray_cluster, &ns, &updated).await?;
    tracing::info!(cluster = %name, namespace = %ns, state = str_at(&stored, &["status", "state"]), "updated RayCluster status");
    Ok(stored)
}

/// Returns whether any pod was created or deleted.
async fn reconcile_pods(k: &Kube, cluster: &Value, pods: &[&Value]) -> Result<bool> {
    let ns = str_at(cluster, &["metadata", "namespace"]);
    let suspend = suspend_status(cluster);
    let spec_suspend = crate::json::bool_at(cluster, &["spec", "suspend"]);
    let mut changed = false;
    if suspend == "RayClusterSuspending" {
        for p in pods.iter().filter(|p| !is_terminating(p)) {
            delete_pod(k, ns, p).await?;
            changed = true;
        }
        return Ok(changed);
    }
    if suspend == "RayClusterSuspended" || spec_suspend {
        return Ok(false);
    }

    let heads: Vec<&&Value> = pods.iter().filter(|p| is_head(p)).collect();
    match heads.len() {
        0 => {
            let hash = hash_spec(cluster.get("spec").unwrap_or(&Value::Null));
            let pod = head_pod(cluster, &hash);
            let created = k.create(&k.res.pod, ns, &pod).await?;
            tracing::info!(
                pod = str_at(&created, &["metadata", "name"]),
                namespace = ns,
                "created head pod"
            );
            changed = true;
        }
        1 => {}
        n => bail!("{n} head pods found; expected exactly one"),
    }

    let groups = arr_at(cluster, &["spec", "workerGroupSpecs"]);
    for group in groups {
        let gname = str_at(group, &["groupName"]);
        let group_pods: Vec<&Value> = pods
            .iter()
            .copied()
            .filter(|p| is_worker(p) && str_at(p, &["metadata", "labels", GROUP_LABEL]) == gname)
            .collect();
        if crate::json::bool_at(group, &["suspend"]) {
            for p in group_pods.iter().filter(|p| !is_terminating(p)) {
                delete_pod(k, ns, p).await?;
                changed = true;
            }
            continue;
        }
        let hosts = num_of_hosts(group);
        if hosts > 1 {
            changed |= reconcile_multi_host(k, cluster, group, &group_pods).await?;
            continue;
        }
        let mut deleted = BTreeSet::new();
        for w in arr_at(group, &["scaleStrategy", "workersToDelete"]) {
            if let Some(pod_name) = w.as_str()
                && group_pods
                    .iter()
                    .any(|p| str_at(p, &["metadata", "name"]) == pod_name)
            {
                k.delete(&k.res.pod, ns, pod_name, &DeleteParams::default())
                    .await?;
                deleted.insert(pod_name.to_string());
                changed = true;
            }
        }
        let running: Vec<&Value> = group_pods
            .iter()
            .copied()
            .filter(|p| !deleted.contains(str_at(p, &["metadata", "name"])))
            .collect();
        let diff = desired_workers(group) - running.len() as i64;
        if diff > 0 {
            let mut used: BTreeSet<usize> = running
                .iter()
                .filter_map(|p| {
                    str_at(p, &["metadata", "labels", REPLICA_INDEX_LABEL])
                        .parse()
                        .ok()
                })
                .collect();
            let mut next = 0usize;
            for _ in 0..diff {
                while used.contains(&next) {
                    next += 1;
                }
                used.insert(next);
                let pod = worker_pod(cluster, group, next, None, 0);
                let created = k.create(&k.res.pod, ns, &pod).await?;
                tracing::info!(
                    pod = str_at(&created, &["metadata", "name"]),
                    group = gname,
                    namespace = ns,
                    "created worker pod"
                );
                changed = true;
            }
        } else if diff < 0 && !autoscaling_enabled(cluster) {
            // Without the autoscaler KubeRay deletes surplus workers itself (in list order);
            // with it, the autoscaler is the only one that picks victims.
            for p in running.iter().take((-diff) as usize) {
                delete_pod(k, ns, p).await?;
                changed = true;
            }
        }
    }
    Ok(changed)
}

/// Multi-host groups: whole replicas of `numOfHosts` pods sharing a replica name.
async fn reconcile_multi_host(
    k: &Kube,
    cluster: &Value,
    group: &Value,
    pods: &[&Value],
) -> Result<bool> {
    let ns = str_at(cluster, &["metadata", "namespace"]);
    let hosts = num_of_hosts(group) as usize;
    let want = (desired_workers(group) as usize) / hosts;
    let mut by_replica: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for p in pods {
        by_replica
            .entry(str_at(p, &["metadata", "labels", REPLICA_NAME_LABEL]).to_string())
            .or_default()
            .push(p);
    }
    let mut changed = false;
    // Incomplete replicas cannot run a multi-host workload: drop them whole.
    let mut complete: Vec<(String, Vec<&Value>)> = Vec::new();
    for (rname, rpods) in by_replica {
        if rname.is_empty() || rpods.len() != hosts {
            for p in rpods.iter().filter(|p| !is_terminating(p)) {
                delete_pod(k, ns, p).await?;
                changed = true;
            }
        } else {
            complete.push((rname, rpods));
        }
    }
    if complete.len() > want && !autoscaling_enabled(cluster) {
        for (_, rpods) in complete.iter().skip(want) {
            for p in rpods {
                delete_pod(k, ns, p).await?;
                changed = true;
            }
        }
    }
    let mut used: BTreeSet<usize> = complete
        .iter()
        .filter_map(|(_, ps)| ps.first())
        .filter_map(|p| {
            str_at(p, &["metadata", "labels", REPLICA_INDEX_LABEL])
                .parse()
                .ok()
        })
        .collect();
    let mut next = 0usize;
    for _ in complete.len()..want {
        while used.contains(&next) {
            next += 1;
        }
        used.insert(next);
        let rname = format!("{}-{}", str_at(group, &["groupName"]), rand_suffix());
        for host in 0..hosts {
            let pod = worker_pod(cluster, group, next, Some(&rname), host);
            k.create(&k.res.pod, ns, &pod).await?;
            changed = true;
        }
    }
    Ok(changed)
}

async fn delete_pod(k: &Kube, ns: &str, p: &Value) -> Result<()> {
    let name = str_at(p, &["metadata", "name"]);
    k.delete(&k.res.pod, ns, name, &DeleteParams::default())
        .await?;
    tracing::info!(pod = name, namespace = ns, "deleted pod");
    Ok(())
}

/// `utils.CalculatePodResource`: requests, falling back to limits, summed over containers.
fn pod_resources(template: &Value) -> BTreeMap<String, Quantity> {
    let mut total: BTreeMap<String, Quantity> = BTreeMap::new();
    for c in arr_at(template, &["spec", "containers"]) {
        let mut res: BTreeMap<String, Quantity> = BTreeMap::new();
        for (src, overwrite) in [("requests", true), ("limits", false)] {
            if let Some(m) = get(c, &["resources", src]).and_then(Value::as_object) {
                for (k, v) in m {
                    if let Some(q) = Quantity::from_json(v)
                        && (overwrite || !res.contains_key(k))
                    {
                        res.insert(k.clone(), q);
                    }
                }
            }
        }
        for (k, q) in res {
            let e = total.entry(k).or_default();
            *e = e.plus(q);
        }
    }
    total
}

/// `utils.IsGPUResourceKey`.
fn is_gpu_key(k: &str) -> bool {
    if k.ends_with("gpu") {
        return true;
    }
    // nvidia.com/mig-<n>g.<m>gb
    k.strip_prefix("nvidia.com/mig-")
        .and_then(|rest| rest.strip_suffix("gb"))
        .and_then(|rest| rest.split_once("g."))
        .is_some_and(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && a.chars().all(|c| c.is_ascii_digit())
                && b.chars().all(|c| c.is_ascii_digit())
        })
}

fn set_nonzero(m: &mut Map<String, Value>, key: &str, v: i64) {
    if v != 0 {
        m.insert(key.into(), json!(v));
    } else {
        m.remove(key);
    }
}

/// `calculateStatus` of the RayCluster controller (status-conditions gate on, as in v1.7).
pub fn calculate_status(cluster: &Value, pods: &[&Value], reconcile_failed: bool) -> Value {
    let mut st = cluster.get("status").cloned().unwrap_or_else(|| json!({}));
    if !st.is_object() {
        st = json!({});
    }
    let old_state = str_at(&st, &["state"]).to_string();
    let mut conds: Vec<Value> = arr_at(&st, &["conditions"]).to_vec();
    if !reconcile_failed {
        conditions::remove(&mut conds, "RayClusterReplicaFailure");
    }
    let generation = i64_at(cluster, &["metadata", "generation"]).unwrap_or(0);
    let groups = arr_at(cluster, &["spec", "workerGroupSpecs"]);
    let workers: Vec<&&Value> = pods.iter().filter(|p| is_worker(p)).collect();
    let ready = workers.iter().filter(|p| is_running_and_ready(p)).count() as i64;
    let available = workers
        .iter()
        .filter(|p| str_at(p, &["status", "phase"]) == "Running")
        .count() as i64;
    let desired: i64 = groups.iter().map(desired_workers).sum();
    let active_groups = || {
        groups
            .iter()
            .filter(|g| !crate::json::bool_at(g, &["suspend"]))
    };
    let min: i64 = active_groups()
        .map(|g| i64_at(g, &["minReplicas"]).unwrap_or(0) * num_of_hosts(g))
        .sum();
    let max: i64 = active_groups()
        .map(|g| i64_at(g, &["maxReplicas"]).unwrap_or(MAX_I32) * num_of_hosts(g))
        .sum::<i64>()
        .min(MAX_I32);

    let mut res =
        pod_resources(get(cluster, &["spec", "headGroupSpec", "template"]).unwrap_or(&Value::Null));
    for g in active_groups() {
        let n = i64_at(g, &["replicas"]).unwrap_or(0) * num_of_hosts(g);
        for (k, q) in pod_resources(g.get("template").unwrap_or(&Value::Null)) {
            let e = res.entry(k).or_default();
            *e = e.plus(q.times(n));
        }
    }
    let gpu = res
        .iter()
        .filter(|(k, q)| is_gpu_key(k) && q.milli != 0)
        .fold(Quantity::default(), |a, (_, q)| a.plus(*q));

    let m = st.as_object_mut().map(std::mem::take).unwrap_or_default();
    let mut m = m;
    if generation != 0 {
        m.insert("observedGeneration".into(), json!(generation));
    }
    set_nonzero(&mut m, "readyWorkerReplicas", ready);
    set_nonzero(&mut m, "availableWorkerReplicas", available);
    set_nonzero(&mut m, "desiredWorkerReplicas", desired);
    set_nonzero(&mut m, "minWorkerReplicas", min);
    set_nonzero(&mut m, "maxWorkerReplicas", max);
    let q = |k: &str| res.get(k).copied().unwrap_or_default().format();
    m.insert("desiredCPU".into(), json!(q("cpu")));
    m.insert("desiredMemory".into(), json!(q("memory")));
    m.insert("desiredGPU".into(), json!(gpu.format()));
    m.insert("desiredTPU".into(), json!(q("google.com/tpu")));

    let mut state = old_state.clone();
    if !reconcile_failed && pods.len() as i64 == desired + 1 && all_pods_running(pods) {
        state = "ready".into();
        m.remove("reason");
    }

    let head = pods.iter().find(|p| is_head(p));
    match head {
        None => conditions::set(
            &mut conds,
            "HeadPodReady",
            "False",
            "HeadPodNotFound",
            "Head Pod not found",
            0,
        ),
        Some(h) => {
            let ready_cond = arr_at(h, &["status", "conditions"])
                .iter()
                .find(|c| c["type"] == "Ready");
            match ready_cond {
                None => conditions::set(&mut conds, "HeadPodReady", "False", "Unknown", "", 0),
                Some(c) => {
                    let status = str_at(c, &["status"]);
                    let mut reason = str_at(c, &["reason"]).to_string();
                    if status == "True" && reason.is_empty() {
                        reason = "HeadPodRunningAndReady".into();
                    }
                    if reason.is_empty() {
                        reason = "Unknown".into();
                    }
                    conditions::set(
                        &mut conds,
                        "HeadPodReady",
                        status,
                        &reason,
                        str_at(c, &["message"]),
                        0,
                    );
                }
            }
        }
    }
    let suspend = suspend_status(cluster);
    if !conditions::is_true(&conds, "RayClusterProvisioned") && suspend != "RayClusterSuspended" {
        if all_pods_running(pods) {
            conditions::set(
                &mut conds,
                "RayClusterProvisioned",
                "True",
                "AllPodRunningAndReadyFirstTime",
                "All Ray Pods are ready for the first time",
                0,
            );
        } else {
            conditions::set(
                &mut conds,
                "RayClusterProvisioned",
                "False",
                "RayClusterPodsProvisioning",
                "RayCluster Pods are being provisioned for first time",
                0,
            );
        }
    }
    let spec_suspend = crate::json::bool_at(cluster, &["spec", "suspend"]);
    match suspend {
        "RayClusterSuspending" => {
            if pods.is_empty() {
                conditions::set(
                    &mut conds,
                    "RayClusterProvisioned",
                    "False",
                    "RayClusterPodsProvisioning",
                    "RayCluster has been suspended",
                    0,
                );
                conditions::set(
                    &mut conds,
                    "RayClusterSuspending",
                    "False",
                    "RayClusterSuspending",
                    "",
                    0,
                );
                conditions::set(
                    &mut conds,
                    "RayClusterSuspended",
                    "True",
                    "RayClusterSuspended",
                    "",
                    0,
                );
            }
        }
        "RayClusterSuspended" => {
            if !spec_suspend {
                conditions::set(
                    &mut conds,
                    "RayClusterSuspended",
                    "False",
                    "RayClusterSuspended",
                    "",
                    0,
                );
            }
        }
        _ => {
            conditions::set(
                &mut conds,
                "RayClusterSuspended",
                "False",
                "RayClusterSuspended",
                "",
                0,
            );
            let s = if spec_suspend { "True" } else { "False" };
            conditions::set(
                &mut conds,
                "RayClusterSuspending",
                s,
                "RayClusterSuspending",
                "",
                0,
            );
        }
    }
    if spec_suspend && pods.is_empty() {
        state = "suspended".into();
    }
    m.insert("conditions".into(), json!(conds));
    if state.is_empty() {
        m.remove("state");
    } else {
        m.insert("state".into(), json!(state));
    }
    let mut head_info = Map::new();
    if let Some(h) = head {
        head_info.insert("podName".into(), json!(str_at(h, &["metadata", "name"])));
    }
    m.insert("head".into(), Value::Object(head_info));
    let now = now_rfc3339();
    m.insert("lastUpdateTime".into(), json!(now));
    if state != old_state {
        let times = m.entry("stateTransitionTimes").or_insert_with(|| json!({}));
        if let Some(t) = times.as_object_mut() {
            t.insert(state.clone(), json!(now));
        }
    }
    Value::Object(m)
}

/// `utils.InconsistentRayClusterStatus`: only these fields trigger a status write.
pub fn inconsistent_cluster_status(old: &Value, new: &Value) -> bool {
    ["state", "reason"]
        .iter()
        .any(|k| str_at(old, &[k]) != str_at(new, &[k]))
        || [
            "readyWorkerReplicas",
            "availableWorkerReplicas",
            "desiredWorkerReplicas",
            "minWorkerReplicas",
            "maxWorkerReplicas",
        ]
        .iter()
        .any(|k| i64_at(old, &[k]).unwrap_or(0) != i64_at(new, &[k]).unwrap_or(0))
        || get(old, &["endpoints"]) != get(new, &["endpoints"])
        || norm_head(old) != norm_head(new)
        || arr_at(old, &["conditions"]) != arr_at(new, &["conditions"])
}

fn norm_head(st: &Value) -> Value {
    get(st, &["head"]).cloned().unwrap_or_else(|| json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desired_clamps_and_multiplies() {
        assert_eq!(
            desired_workers(&json!({"replicas": 5, "maxReplicas": 3})),
            3
        );
        assert_eq!(
            desired_workers(&json!({"replicas": 0, "minReplicas": 2})),
            2
        );
        assert_eq!(desired_workers(&json!({"replicas": 2, "numOfHosts": 4})), 8);
        assert_eq!(desired_workers(&json!({"replicas": 2, "suspend": true})), 0);
        assert_eq!(desired_workers(&json!({})), 0);
    }

    #[test]
    fn gpu_keys() {
        assert!(is_gpu_key("nvidia.com/gpu"));
        assert!(is_gpu_key("amd.com/gpu"));
        assert!(is_gpu_key("nvidia.com/mig-2g.32gb"));
        assert!(!is_gpu_key("cpu"));
    }

    #[test]
    fn status_sums_resources() {
        let cluster = json!({
            "metadata": {"name": "c", "namespace": "n", "generation": 2},
            "spec": {
                "headGroupSpec": {"template": {"spec": {"containers": [{"resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}]}}},
                "workerGroupSpecs": [{"groupName": "g", "replicas": 2, "template": {"spec": {"containers": [
                    {"resources": {"limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"}}}]}}}]
            }
        });
        let st = calculate_status(&cluster, &[], false);
        assert_eq!(st["desiredCPU"], "18");
        assert_eq!(st["desiredMemory"], "136Gi");
        assert_eq!(st["desiredGPU"], "8");
        assert_eq!(st["desiredWorkerReplicas"], 2);
        assert_eq!(st["maxWorkerReplicas"], 2147483647);
        assert!(st.get("state").is_none());
        assert!(!conditions::is_true(
            st["conditions"].as_array().unwrap(),
            "HeadPodReady"
        ));
    }
}
