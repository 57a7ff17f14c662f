//! The RayService side (KubeRay v1.7.0 `rayservice_controller.go`): pending/active clusters,
//! zero-downtime (NewCluster) upgrades, in-place updates, promotion, delayed deletion, status.

use super::conditions;
use super::hash::{hash_spec, hash_spec_first_groups};
use super::kube::Kube;
use super::kubelet::is_running_and_ready;
use super::names::*;
use super::pods::{controller_ref, rand_suffix};
use super::{ClusterKey, SimOptions, SimState, serve};
use crate::json::{arr_at, get, i64_at, now_rfc3339, str_at, string_map};
use anyhow::Result;
use kube::api::{DeleteParams, Patch, PropagationPolicy};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The JSON a zero-valued Go `RayClusterStatus` marshals to (Quantity and HeadInfo are not
/// omitted by `omitempty`).
fn zero_cluster_status() -> Value {
    json!({"desiredCPU": "0", "desiredGPU": "0", "desiredMemory": "0", "desiredTPU": "0", "head": {}})
}

fn zero_service_status() -> Value {
    json!({"rayClusterStatus": zero_cluster_status()})
}

fn cluster_spec(svc: &Value) -> Value {
    get(svc, &["spec", "rayClusterConfig"])
        .cloned()
        .unwrap_or_else(|| json!({}))
}

/// `isClusterSpecHashEqual`.
fn is_hash_equal(svc: &Value, cluster: &Value, partial: bool) -> bool {
    let cluster_hash = str_at(cluster, &["metadata", "annotations", HASH_ANNOTATION]);
    let goal = cluster_spec(svc);
    let goal_hash = if !partial {
        hash_spec(&goal)
    } else {
        let Ok(n) = str_at(
            cluster,
            &["metadata", "annotations", NUM_WORKER_GROUPS_ANNOTATION],
        )
        .parse::<usize>() else {
            // KubeRay treats an unreadable count as "equal" here.
            return true;
        };
        if arr_at(&goal, &["workerGroupSpecs"]).len() >= n {
            hash_spec_first_groups(&goal, n)
        } else {
            String::new()
        }
    };
    cluster_hash == goal_hash
}

/// `isZeroDowntimeUpgradeEnabled` (RayServiceIncrementalUpgrade gate on by default in v1.7).
fn zero_downtime_enabled(svc: &Value) -> bool {
    if let Some(t) = get(svc, &["spec", "upgradeStrategy", "type"]).and_then(Value::as_str) {
        return t == "NewCluster" || t == "NewClusterWithIncrementalUpgrade";
    }
    !std::env::var("ENABLE_ZERO_DOWNTIME").is_ok_and(|v| v.eq_ignore_ascii_case("false"))
}

fn conds(svc: &Value) -> &[Value] {
    arr_at(svc, &["status", "conditions"])
}

/// `shouldPrepareNewCluster`.
pub fn should_prepare_new_cluster(
    svc: &Value,
    active: Option<&Value>,
    pending: Option<&Value>,
    is_pending_serving: bool,
) -> bool {
    if is_pending_serving || conditions::is_true(conds(svc), "RollbackInProgress") {
        return false;
    }
    let Some(cluster) = pending.or(active) else {
        return true;
    };
    if is_hash_equal(svc, cluster, false) || is_hash_equal(svc, cluster, true) {
        return false;
    }
    zero_downtime_enabled(svc)
}

/// `shouldUpdateCluster`.
pub fn should_update_cluster(svc: &Value, cluster: Option<&Value>, is_active: bool) -> bool {
    let Some(cluster) = cluster else {
        return false;
    };
    if is_active {
        if conditions::is_true(conds(svc), "UpgradeInProgress") {
            return false;
        }
        if str_at(
            cluster,
            &["metadata", "annotations", KUBERAY_VERSION_ANNOTATION],
        ) != KUBERAY_VERSION
        {
            return true;
        }
    }
    if is_hash_equal(svc, cluster, false) {
        return false;
    }
    is_hash_equal(svc, cluster, true)
}

/// `constructRayClusterForRayService`.
pub fn construct_cluster(svc: &Value, name: &str) -> Value {
    let mut labels = string_map(svc, &["metadata", "labels"]);
    labels.insert(
        ORIGINATED_FROM_CR_NAME.into(),
        str_at(svc, &["metadata", "name"]).into(),
    );
    labels.insert(ORIGINATED_FROM_CRD.into(), RAY_SERVICE_CRD.into());
    let mut annotations = string_map(svc, &["metadata", "annotations"]);
    let spec = cluster_spec(svc);
    annotations.insert(HASH_ANNOTATION.into(), hash_spec(&spec));
    annotations.insert(
        NUM_WORKER_GROUPS_ANNOTATION.into(),
        arr_at(&spec, &["workerGroupSpecs"]).len().to_string(),
    );
    annotations.insert(KUBERAY_VERSION_ANNOTATION.into(), KUBERAY_VERSION.into());
    json!({
        "apiVersion": API_VERSION,
        "kind": "RayCluster",
        "metadata": {
            "name": name,
            "namespace": str_at(svc, &["metadata", "namespace"]),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [controller_ref(svc, "RayService")],
        },
        "spec": spec,
    })
}

/// `modifyRayCluster`: spec, labels and annotations from the goal; `suspend` kept as is.
fn modify_cluster(current: &Value, goal: &Value) -> Value {
    let mut c = current.clone();
    let suspend = get(current, &["spec", "suspend"]).cloned();
    c["spec"] = goal["spec"].clone();
    match suspend {
        Some(s) => c["spec"]["suspend"] = s,
        None => crate::json::remove(&mut c, &["spec", "suspend"]),
    }
    c["metadata"]["labels"] = goal["metadata"]["labels"].clone();
    c["metadata"]["annotations"] = goal["metadata"]["annotations"].clone();
    c
}

fn head_of<'a>(cluster: &Value, pods: &'a [Value]) -> Option<&'a Value> {
    super::cluster::cluster_pods(cluster, pods)
        .into_iter()
        .find(|p| str_at(p, &["metadata", "labels", NODE_TYPE_LABEL]) == "head")
}

/// Reconciles one RayService.
pub async fn reconcile(
    k: &Kube,
    state: &mut SimState,
    opts: &SimOptions,
    svc: &Value,
    clusters: &BTreeMap<ClusterKey, Value>,
    pods: &[Value],
) -> Result<()> {
    let ns = str_at(svc, &["metadata", "namespace"]).to_string();
    let name = str_at(svc, &["metadata", "name"]).to_string();
    let managed_by = str_at(svc, &["spec", "managedBy"]);
    if !managed_by.is_empty() && managed_by != KUBERAY_CONTROLLER {
        return Ok(());
    }
    let active_name = str_at(svc, &["status", "activeServiceStatus", "rayClusterName"]).to_string();
    let pending_name =
        str_at(svc, &["status", "pendingServiceStatus", "rayClusterName"]).to_string();

    let has_clusters_to_clean =
        clean_up_clusters(k, state, opts, svc, clusters, &active_name, &pending_name).await?;
    let finalizers: Vec<String> = arr_at(svc, &["metadata", "finalizers"])
        .iter()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect();
    let has_finalizer = finalizers.iter().any(|f| f == RAY_SERVICE_FINALIZER);
    if get(svc, &["metadata", "deletionTimestamp"]).is_some() {
        // The finalizer goes once every RayCluster of the service is gone.
        if !has_clusters_to_clean && has_finalizer {
            let rest: Vec<&String> = finalizers
                .iter()
                .filter(|f| *f != RAY_SERVICE_FINALIZER)
                .collect();
            set_finalizers(k, svc, json!(rest)).await?;
            tracing::info!(service = %name, "no RayClusters left; removed finalizer");
        }
        return Ok(());
    }
    if !has_finalizer {
        let mut all = finalizers.clone();
        all.push(RAY_SERVICE_FINALIZER.to_string());
        set_finalizers(k, svc, json!(all)).await?;
        tracing::info!(service = %name, "added finalizer");
        return Ok(());
    }
    if get(svc, &["spec", "upgradeStrategy", "type"]).and_then(Value::as_str)
        == Some("NewClusterWithIncrementalUpgrade")
    {
        tracing::warn!(service = %name, "NewClusterWithIncrementalUpgrade is not simulated; behaving like NewCluster");
    }

    // reconcileRayCluster
    let get_cluster = |n: &str| {
        (!n.is_empty())
            .then(|| clusters.get(&(ns.clone(), n.to_string())).cloned())
            .flatten()
    };
    let mut active = get_cluster(&active_name);
    let mut pending = get_cluster(&pending_name);
    if !pending_name.is_empty() && pending.is_none() {
        let obj = construct_cluster(svc, &pending_name);
        let created = k.create(&k.res.ray_cluster, &ns, &obj).await?;
        tracing::info!(service = %name, cluster = %pending_name, namespace = %ns, "created pending RayCluster");
        pending = Some(created);
    } else {
        if should_update_cluster(svc, active.as_ref(), true)
            && let Some(a) = &active
        {
            let goal = construct_cluster(svc, &active_name);
            let updated = k
                .replace(&k.res.ray_cluster, &ns, &modify_cluster(a, &goal))
                .await?;
            tracing::info!(service = %name, cluster = %active_name, "updated active RayCluster in place");
            active = Some(updated);
        }
        if should_update_cluster(svc, pending.as_ref(), false)
            && let Some(p) = &pending
        {
            let goal = construct_cluster(svc, &pending_name);
            let updated = k
                .replace(&k.res.ray_cluster, &ns, &modify_cluster(p, &goal))
                .await?;
            tracing::info!(service = %name, cluster = %pending_name, "updated pending RayCluster in place");
            pending = Some(updated);
        }
    }

    // updateHeadPodServeLabel: KubeRay errors out (and requeues) while a head pod is missing.
    let exclude_head = crate::json::bool_at(svc, &["spec", "excludeHeadPodFromServeSvc"]);
    let mut head_serve: BTreeMap<String, bool> = BTreeMap::new();
    for c in [active.as_ref(), pending.as_ref()].into_iter().flatten() {
        let Some(head) = head_of(c, pods) else {
            tracing::debug!(service = %name, cluster = str_at(c, &["metadata", "name"]), "head pod not found yet");
            return Ok(());
        };
        let healthy = !exclude_head && is_running_and_ready(head);
        let want = if healthy { "true" } else { "false" };
        let pod_name = str_at(head, &["metadata", "name"]).to_string();
        if str_at(head, &["metadata", "labels", SERVE_LABEL]) != want {
            let patch = Patch::Merge(json!({"metadata": {"labels": {SERVE_LABEL: want}}}));
            k.patch(&k.res.pod, Some(&ns), &pod_name, &patch).await?;
        }
        head_serve.insert(pod_name, healthy);
    }

    // reconcileServe
    let (mut pending_ready, mut pending_apps) = (false, None);
    if let Some(p) = &pending {
        (pending_ready, pending_apps) = serve::reconcile(svc, p);
    }
    let (mut active_ready, mut active_apps) = (false, None);
    if let Some(a) = &active
        && pending.is_none()
        && !should_prepare_new_cluster(svc, Some(a), None, false)
    {
        (active_ready, active_apps) = serve::reconcile(svc, a);
    }

    // reconcileServicesToReadyCluster: the head/serve Services follow the ready cluster.
    // No Service objects exist; the selector target is remembered in memory.
    let key = (ns.clone(), name.clone());
    let mut serving_target = None;
    if pending_ready || active_ready {
        let target = if pending_ready {
            &pending_name
        } else {
            &active_name
        };
        state.serve_target.insert(key.clone(), target.clone());
        serving_target = Some(target.clone());
    }

    // calculateStatus
    let old_status = svc.get("status").cloned().unwrap_or_else(|| json!({}));
    let mut st = old_status.clone();
    if !st.is_object() {
        st = json!({});
    }
    let generation = i64_at(svc, &["metadata", "generation"]).unwrap_or(0);
    st["observedGeneration"] = json!(generation);
    for (field, cluster, apps) in [
        ("activeServiceStatus", &active, &mut active_apps),
        ("pendingServiceStatus", &pending, &mut pending_apps),
    ] {
        if !st.get(field).is_some_and(Value::is_object) {
            st[field] = json!({});
        }
        st[field]["rayClusterStatus"] = cluster
            .as_ref()
            .and_then(|c| c.get("status").cloned())
            .unwrap_or_else(zero_cluster_status);
        match apps.take().filter(|a| !a.is_empty()) {
            Some(a) => st[field]["applicationStatuses"] = Value::Object(a),
            None => crate::json::remove(&mut st, &[field, "applicationStatuses"]),
        }
    }
    let mut is_pending_serving = false;
    if let Some(target) = serving_target
        && (target == pending_name || target == active_name)
    {
        if active_name != target {
            tracing::info!(service = %name, old = %active_name, new = %pending_name, "promoting pending RayCluster to active");
            st["activeServiceStatus"] = st["pendingServiceStatus"].take();
            st["pendingServiceStatus"] = zero_service_status();
        }
        is_pending_serving = target == pending_name;
    }
    if should_prepare_new_cluster(svc, active.as_ref(), pending.as_ref(), is_pending_serving) {
        let new_name = format!("{name}-{}", rand_suffix());
        tracing::info!(service = %name, cluster = %new_name, "preparing a new pending RayCluster");
        st["pendingServiceStatus"] =
            json!({"rayClusterName": new_name, "rayClusterStatus": zero_cluster_status()});
    }
    let endpoints = count_serve_endpoints(state.serve_target.get(&key), &ns, pods, &head_serve);
    if endpoints > 0 {
        st["numServeEndpoints"] = json!(endpoints);
    } else {
        crate::json::remove(&mut st, &["numServeEndpoints"]);
    }
    calculate_conditions(&mut st, generation);
    let ready = conditions::is_true(arr_at(&st, &["conditions"]), "Ready");
    if ready {
        st["serviceStatus"] = json!("Running");
    } else {
        crate::json::remove(&mut st, &["serviceStatus"]);
    }

    if inconsistent_statuses(&old_status, &st) {
        st["lastUpdateTime"] = json!(now_rfc3339());
        let mut updated = svc.clone();
        updated["status"] = st;
        k.replace_status(&k.res.ray_service, &ns, &updated).await?;
        tracing::info!(service = %name, namespace = %ns, "updated RayService status");
    }
    Ok(())
}

/// The serve Service selects `ray.io/serve=true` pods of the target cluster; endpoints are
/// the ready ones (KubeRay counts ready EndpointSlice endpoints).
fn count_serve_endpoints(
    target: Option<&String>,
    ns: &str,
    pods: &[Value],
    head_serve: &BTreeMap<String, bool>,
) -> i64 {
    let Some(target) = target else {
        return 0;
    };
    pods.iter()
        .filter(|p| {
            str_at(p, &["metadata", "namespace"]) == ns
                && str_at(p, &["metadata", "labels", RAY_CLUSTER_LABEL]) == target
                && is_running_and_ready(p)
        })
        .filter(|p| {
            let name = str_at(p, &["metadata", "name"]);
            match head_serve.get(name) {
                Some(h) => *h,
                None => str_at(p, &["metadata", "labels", SERVE_LABEL]) == "true",
            }
        })
        .count() as i64
}

/// `calculateConditions`.
fn calculate_conditions(st: &mut Value, generation: i64) {
    let mut c: Vec<Value> = arr_at(st, &["conditions"]).to_vec();
    if c.is_empty() {
        let m = "RayService is initializing";
        conditions::set(&mut c, "Ready", "False", "Initializing", m, generation);
        conditions::set(
            &mut c,
            "UpgradeInProgress",
            "False",
            "Initializing",
            m,
            generation,
        );
    }
    if i64_at(st, &["numServeEndpoints"]).unwrap_or(0) > 0 {
        conditions::set(
            &mut c,
            "Ready",
            "True",
            "NonZeroServeEndpoints",
            "Number of serve endpoints is greater than 0",
            generation,
        );
    } else if conditions::is_true(&c, "Ready") {
        conditions::set(
            &mut c,
            "Ready",
            "False",
            "ZeroServeEndpoints",
            "Number of serve endpoints dropped to 0",
            generation,
        );
    }
    let active = str_at(st, &["activeServiceStatus", "rayClusterName"]);
    let pending = str_at(st, &["pendingServiceStatus", "rayClusterName"]);
    if !active.is_empty() && !pending.is_empty() {
        conditions::set(
            &mut c,
            "UpgradeInProgress",
            "True",
            "BothActivePendingClustersExist",
            "Both active and pending Ray clusters exist",
            generation,
        );
    } else if !active.is_empty() {
        conditions::set(
            &mut c,
            "UpgradeInProgress",
            "False",
            "NoPendingCluster",
            "Active Ray cluster exists and no pending Ray cluster",
            generation,
        );
    } else {
        let reason = conditions::find(&c, "UpgradeInProgress")
            .map(|x| str_at(x, &["reason"]).to_string())
            .unwrap_or_default();
        let keep = reason == "Initializing" || reason == "InitializingTimeout";
        if !keep {
            conditions::set(
                &mut c,
                "UpgradeInProgress",
                "Unknown",
                "NoActiveCluster",
                "No active Ray cluster exists, and the RayService is not initializing. Please open a GitHub issue in the KubeRay repository.",
                generation,
            );
        }
    }
    st["conditions"] = json!(c);
}

/// `utils.InconsistentRayServiceStatuses`: the fields whose change triggers a status write.
pub fn inconsistent_statuses(old: &Value, new: &Value) -> bool {
    str_at(old, &["serviceStatus"]) != str_at(new, &["serviceStatus"])
        || i64_at(old, &["numServeEndpoints"]).unwrap_or(0)
            != i64_at(new, &["numServeEndpoints"]).unwrap_or(0)
        || arr_at(old, &["conditions"]) != arr_at(new, &["conditions"])
        || ["activeServiceStatus", "pendingServiceStatus"]
            .iter()
            .any(|f| inconsistent_service_status(get(old, &[f]), get(new, &[f])))
}

fn inconsistent_service_status(old: Option<&Value>, new: Option<&Value>) -> bool {
    let empty = json!({});
    let old = old.unwrap_or(&empty);
    let new = new.unwrap_or(&empty);
    if str_at(old, &["rayClusterName"]) != str_at(new, &["rayClusterName"]) {
        return true;
    }
    let apps = |v: &Value| -> Map<String, Value> {
        get(v, &["applicationStatuses"])
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let (oa, na) = (apps(old), apps(new));
    if oa.len() != na.len() {
        return true;
    }
    for (app, n) in &na {
        let Some(o) = oa.get(app) else {
            return true;
        };
        if str_at(o, &["status"]) != str_at(n, &["status"])
            || str_at(o, &["message"]) != str_at(n, &["message"])
        {
            return true;
        }
        let deps = |v: &Value| -> Map<String, Value> {
            get(v, &["serveDeploymentStatuses"])
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default()
        };
        let (od, nd) = (deps(o), deps(n));
        if od.len() != nd.len() {
            return true;
        }
        for (d, nds) in &nd {
            match od.get(d) {
                Some(ods)
                    if str_at(ods, &["status"]) == str_at(nds, &["status"])
                        && str_at(ods, &["message"]) == str_at(nds, &["message"]) => {}
                _ => return true,
            }
        }
    }
    [
        "targetCapacity",
        "trafficRoutedPercent",
        "lastTrafficMigratedTime",
    ]
    .iter()
    .any(|f| get(old, &[f]) != get(new, &[f]))
}

/// Replaces `metadata.finalizers`, guarded by the resourceVersion we read (KubeRay does a
/// full Update; the effect on the object is the same).
async fn set_finalizers(k: &Kube, svc: &Value, finalizers: Value) -> Result<()> {
    let patch = Patch::Merge(json!({"metadata": {
        "resourceVersion": str_at(svc, &["metadata", "resourceVersion"]),
        "finalizers": finalizers,
    }}));
    let ns = str_at(svc, &["metadata", "namespace"]);
    let name = str_at(svc, &["metadata", "name"]);
    k.patch(&k.res.ray_service, Some(ns), name, &patch).await?;
    Ok(())
}

/// `cleanUpRayClusterInstance`: clusters that are neither active nor pending are deleted
/// (background propagation) once their deletion delay has passed. The schedule lives in
/// memory, as KubeRay's does, so a restart of the simulator restarts the delay. When the
/// RayService is being deleted, all its clusters go at once. Returns whether any cluster
/// remains to be cleaned up.
async fn clean_up_clusters(
    k: &Kube,
    state: &mut SimState,
    opts: &SimOptions,
    svc: &Value,
    clusters: &BTreeMap<ClusterKey, Value>,
    active: &str,
    pending: &str,
) -> Result<bool> {
    let ns = str_at(svc, &["metadata", "namespace"]);
    let svc_name = str_at(svc, &["metadata", "name"]);
    let svc_deleted = get(svc, &["metadata", "deletionTimestamp"]).is_some();
    let delay = if svc_deleted {
        Duration::ZERO
    } else {
        opts.deletion_delay_override.unwrap_or_else(|| {
            let s = i64_at(svc, &["spec", "rayClusterDeletionDelaySeconds"])
                .unwrap_or(DEFAULT_DELETION_DELAY_SECONDS)
                .max(0);
            Duration::from_secs(s as u64)
        })
    };
    let mut has_to_clean = false;
    for ((cns, cname), c) in clusters {
        if cns != ns
            || str_at(c, &["metadata", "labels", ORIGINATED_FROM_CR_NAME]) != svc_name
            || str_at(c, &["metadata", "labels", ORIGINATED_FROM_CRD]) != RAY_SERVICE_CRD
        {
            continue;
        }
        if !svc_deleted && (cname == active || cname == pending) {
            continue;
        }
        has_to_clean = true;
        if get(c, &["metadata", "deletionTimestamp"]).is_some() {
            continue;
        }
        let key = (cns.clone(), cname.clone());
        let due = svc_deleted
            || state
                .deletion_at
                .get(&key)
                .is_some_and(|at| Instant::now() >= *at);
        match state.deletion_at.get(&key) {
            _ if due => {
                let dp = DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Background),
                    ..DeleteParams::default()
                };
                k.delete(&k.res.ray_cluster, cns, cname, &dp).await?;
                tracing::info!(service = svc_name, cluster = %cname, namespace = %cns, "deleted dangling RayCluster");
            }
            Some(_) => {}
            None => {
                state.deletion_at.insert(key, Instant::now() + delay);
                tracing::info!(service = svc_name, cluster = %cname, delay_seconds = delay.as_secs(), "scheduled dangling RayCluster for deletion");
            }
        }
    }
    Ok(has_to_clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc() -> Value {
        json!({
            "metadata": {"name": "s", "namespace": "n", "uid": "u", "generation": 1},
            "spec": {"rayClusterConfig": {
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "h", "image": "ray:1"}]}}},
                "workerGroupSpecs": [{"groupName": "g", "replicas": 1, "template": {"spec": {"containers": [{"name": "w", "image": "ray:1"}]}}}]
            }}
        })
    }

    #[test]
    fn upgrade_rules() {
        let s = svc();
        let c = construct_cluster(&s, "s-abcde");
        assert_eq!(c["metadata"]["labels"][ORIGINATED_FROM_CR_NAME], "s");
        assert_eq!(
            c["metadata"]["annotations"][NUM_WORKER_GROUPS_ANNOTATION],
            "1"
        );
        assert_eq!(c["metadata"]["ownerReferences"][0]["kind"], "RayService");
        assert!(should_prepare_new_cluster(&s, None, None, false));
        assert!(!should_prepare_new_cluster(&s, Some(&c), None, false));

        let mut replicas = s.clone();
        replicas["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = json!(5);
        assert!(!should_prepare_new_cluster(
            &replicas,
            Some(&c),
            None,
            false
        ));
        assert!(!should_update_cluster(&replicas, Some(&c), true));

        let mut image = s.clone();
        image["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]
            [0]["image"] = json!("ray:2");
        assert!(should_prepare_new_cluster(&image, Some(&c), None, false));
        assert!(!should_update_cluster(&image, Some(&c), true));
        image["spec"]["upgradeStrategy"] = json!({"type": "None"});
        assert!(!should_prepare_new_cluster(&image, Some(&c), None, false));

        let mut appended = s.clone();
        let g = appended["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].clone();
        appended["spec"]["rayClusterConfig"]["workerGroupSpecs"]
            .as_array_mut()
            .unwrap()
            .push(g);
        assert!(!should_prepare_new_cluster(
            &appended,
            Some(&c),
            None,
            false
        ));
        assert!(should_update_cluster(&appended, Some(&c), true));

        let mut old = c.clone();
        old["metadata"]["annotations"][KUBERAY_VERSION_ANNOTATION] = json!("v1.6.0");
        assert!(should_update_cluster(&s, Some(&old), true));
        assert!(!should_update_cluster(&s, Some(&old), false));
    }

    #[test]
    fn conditions_follow_cluster_names() {
        let mut st =
            json!({"activeServiceStatus": {}, "pendingServiceStatus": {"rayClusterName": "p"}});
        calculate_conditions(&mut st, 1);
        let c = st["conditions"].as_array().unwrap();
        assert_eq!(
            conditions::find(c, "Ready").unwrap()["reason"],
            "Initializing"
        );
        assert_eq!(
            conditions::find(c, "UpgradeInProgress").unwrap()["reason"],
            "Initializing"
        );
        st["activeServiceStatus"]["rayClusterName"] = json!("a");
        st["numServeEndpoints"] = json!(2);
        calculate_conditions(&mut st, 1);
        let c = st["conditions"].as_array().unwrap();
        assert!(conditions::is_true(c, "Ready"));
        assert!(conditions::is_true(c, "UpgradeInProgress"));
    }
}
