//! Proves the harness is real: Kubernetes v1.36 (apiserver, scheduler, controller-manager),
//! kwok nodes, and the real KubeRay operator (`RAYGATE_KUBERAY_VERSION`, default v1.6.2)
//! driving RayService upgrades against `ray-head`, the Ray stand-in.
//!
//! Isolation: every test starts its own control plane (Nodes are cluster-wide, and several
//! tests depend on exact capacity). With `RAYGATE_E2E_KUBECONFIG` set, tests share that
//! cluster instead; node names are unique per test and no test relies on other tests' nodes
//! being absent, except that the "does not fit" test needs every node to have fewer than
//! 16 GPUs.
//!
//! Run: `e2e/setup` once, then `cargo test -p raygate-e2e --test harness`.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use raygate_e2e::apis::{rc_api, rs_api};
use raygate_e2e::json::{arr_at, i64_at, str_at};
use raygate_e2e::{Check, ControlPlane, FakeNode, create_namespace, rand_suffix, wait_for};
use serde_json::{Value, json};
use std::time::Duration;

/// Generous: CI runs three suites at once on 2 cores, and a pending cluster's pods (kwok,
/// the scheduler, the endpointslice controller, KubeRay's requeue) took over 90 s under load.
const T: Duration = Duration::from_secs(180);

fn control_plane() -> ControlPlane {
    ControlPlane::start().unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"))
}

/// Panics while the control plane is still alive, so its Drop sees the failure and keeps logs.
fn or_panic(r: Result<()>) {
    if let Err(e) = r {
        panic!("{e:#}");
    }
}

/// ray-head's control annotation: the Serve application status it reports.
const APP_STATUS: &str = "ray-head.e2e.raygate.dev/app-status";

async fn nodes(client: &Client, specs: &[(&str, u32)]) -> Vec<String> {
    let tag = rand_suffix();
    let mut names = Vec::new();
    for (prefix, gpus) in specs {
        let name = format!("{prefix}-{tag}");
        FakeNode::new(&name)
            .cpu("32")
            .memory("256Gi")
            .gpu(*gpus)
            .create(client)
            .await
            .expect("create fake node");
        names.push(name);
    }
    names
}

async fn get_json(api: &Api<DynamicObject>, name: &str) -> Result<Value> {
    Ok(serde_json::to_value(api.get(name).await?)?)
}

async fn list_json(api: &Api<DynamicObject>) -> Result<Vec<Value>> {
    let l = api.list(&ListParams::default()).await?;
    l.items
        .into_iter()
        .map(|o| Ok(serde_json::to_value(o)?))
        .collect()
}

async fn pods_of(client: &Client, ns: &str, cluster: &str) -> Result<Vec<Value>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let l = api
        .list(&ListParams::default().labels(&format!("ray.io/cluster={cluster}")))
        .await?;
    l.items
        .into_iter()
        .map(|p| Ok(serde_json::to_value(p)?))
        .collect()
}

/// A realistic RayService: CPU head, one GPU worker group (4 GPUs per worker), one Serve app.
fn ray_service(name: &str, image: &str, replicas: i64, extra_spec: Value) -> Value {
    let mut v = json!({
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name},
        "spec": {
            "serveConfigV2": "applications:\n  - name: llm\n    import_path: serve_app:app\n    route_prefix: /\n    deployments:\n      - name: LLMServer\n        num_replicas: 1\n        ray_actor_options:\n          num_gpus: 4\n",
            "rayClusterConfig": {
                "rayVersion": "2.9.0",
                "headGroupSpec": {
                    "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
                    "template": {"spec": {"containers": [{
                        "name": "ray-head",
                        "image": "rayproject/ray:2.9.0",
                        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}},
                    }]}},
                },
                "workerGroupSpecs": [{
                    "groupName": "gpu",
                    "replicas": replicas,
                    "minReplicas": 0,
                    "maxReplicas": 4,
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{
                        "name": "ray-worker",
                        "image": image,
                        "resources": {
                            "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"},
                            "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"},
                        },
                    }]}},
                }],
            },
        },
    });
    if let (Some(spec), Some(extra)) = (v["spec"].as_object_mut(), extra_spec.as_object()) {
        for (k, e) in extra {
            spec.insert(k.clone(), e.clone());
        }
    }
    v
}

async fn create_rs(client: &Client, ns: &str, rs: &Value) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(rs.clone())?;
    rs_api(client, ns)
        .create(&PostParams::default(), &obj)
        .await?;
    Ok(())
}

async fn json_patch(api: &Api<DynamicObject>, name: &str, ops: Value) -> Result<()> {
    let p: json_patch::Patch = serde_json::from_value(ops)?;
    api.patch(name, &PatchParams::default(), &Patch::<()>::Json(p))
        .await?;
    Ok(())
}

fn summary(rs: &Value) -> String {
    let st = &rs["status"];
    let conds: Vec<String> = arr_at(st, &["conditions"])
        .iter()
        .map(|c| {
            format!(
                "{}={}({})",
                str_at(c, &["type"]),
                str_at(c, &["status"]),
                str_at(c, &["reason"])
            )
        })
        .collect();
    format!(
        "gen={} observed={} active={:?} apps={} pending={:?} pendingState={:?} pendingApps={} endpoints={} conds=[{}]",
        i64_at(rs, &["metadata", "generation"]).unwrap_or(0),
        i64_at(st, &["observedGeneration"]).unwrap_or(0),
        str_at(st, &["activeServiceStatus", "rayClusterName"]),
        st["activeServiceStatus"]["applicationStatuses"],
        str_at(st, &["pendingServiceStatus", "rayClusterName"]),
        str_at(st, &["pendingServiceStatus", "rayClusterStatus", "state"]),
        st["pendingServiceStatus"]["applicationStatuses"],
        i64_at(st, &["numServeEndpoints"]).unwrap_or(0),
        conds.join(",")
    )
}

fn cond_true(obj: &Value, ty: &str) -> bool {
    arr_at(obj, &["status", "conditions"])
        .iter()
        .any(|c| c["type"] == ty && c["status"] == "True")
}

/// Waits until the service has an active cluster, no pending one, and the app RUNNING.
async fn wait_serving(client: &Client, ns: &str, name: &str) -> Result<Value> {
    let api = rs_api(client, ns);
    wait_for(&format!("RayService {name} serving"), T, || async {
        let rs = get_json(&api, name).await?;
        let st = &rs["status"];
        let ok = !str_at(st, &["activeServiceStatus", "rayClusterName"]).is_empty()
            && str_at(st, &["pendingServiceStatus", "rayClusterName"]).is_empty()
            && str_at(
                st,
                &[
                    "activeServiceStatus",
                    "applicationStatuses",
                    "llm",
                    "status",
                ],
            ) == "RUNNING"
            && cond_true(&rs, "Ready")
            && !cond_true(&rs, "UpgradeInProgress")
            && i64_at(st, &["observedGeneration"]) == i64_at(&rs, &["metadata", "generation"]);
        Ok(if ok {
            Check::Done(rs.clone())
        } else {
            Check::NotYet(summary(&rs))
        })
    })
    .await
}

/// Waits until the operator has reconciled the current generation.
async fn wait_observed(client: &Client, ns: &str, name: &str) -> Result<Value> {
    let api = rs_api(client, ns);
    wait_for(&format!("RayService {name} observed"), T, || async {
        let rs = get_json(&api, name).await?;
        let ok = i64_at(&rs, &["status", "observedGeneration"])
            == i64_at(&rs, &["metadata", "generation"]);
        Ok(if ok {
            Check::Done(rs.clone())
        } else {
            Check::NotYet(summary(&rs))
        })
    })
    .await
}

fn active_of(rs: &Value) -> String {
    str_at(rs, &["status", "activeServiceStatus", "rayClusterName"]).to_string()
}

async fn cluster_names(client: &Client, ns: &str) -> Result<Vec<String>> {
    Ok(list_json(&rc_api(client, ns))
        .await?
        .iter()
        .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
        .map(|c| str_at(c, &["metadata", "name"]).to_string())
        .collect())
}

fn worker_pods(pods: &[Value], group: &str) -> Vec<Value> {
    pods.iter()
        .filter(|p| {
            str_at(p, &["metadata", "labels", "ray.io/node-type"]) == "worker"
                && str_at(p, &["metadata", "labels", "ray.io/group"]) == group
                && p["metadata"]["deletionTimestamp"].is_null()
        })
        .cloned()
        .collect()
}

async fn wait_workers(
    client: &Client,
    ns: &str,
    cluster: &str,
    group: &str,
    n: usize,
) -> Result<Vec<Value>> {
    wait_for(
        &format!("{n} running {group} workers in {cluster}"),
        T,
        || async {
            let pods = pods_of(client, ns, cluster).await?;
            let w = worker_pods(&pods, group);
            let running = w
                .iter()
                .filter(|p| str_at(p, &["status", "phase"]) == "Running")
                .count();
            let all = pods.len();
            Ok(if w.len() == n && running == n {
                Check::Done(w)
            } else {
                Check::NotYet(format!(
                    "{} {group} workers, {running} running, {all} pods in cluster",
                    w.len()
                ))
            })
        },
    )
    .await
}

#[tokio::test]
async fn real_scheduler_binds_pods_that_fit_and_reports_insufficient_gpu() {
    let cp = control_plane();
    or_panic(real_scheduler_binds_pods_that_fit_and_reports_insufficient_gpu_body(&cp).await);
}

async fn real_scheduler_binds_pods_that_fit_and_reports_insufficient_gpu_body(
    cp: &ControlPlane,
) -> Result<()> {
    let client = cp.client().await?;
    let ns = create_namespace(&client, "sched").await?;
    nodes(&client, &[("gpu-a", 8), ("gpu-b", 8)]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = |name: &str, gpus: u32| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
        }))?)
    };
    pods.create(&PostParams::default(), &pod("too-big", 16)?)
        .await?;
    pods.create(&PostParams::default(), &pod("fits", 4)?)
        .await?;

    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let msg = wait_for("FailedScheduling event for too-big", T, || async {
        let l = events.list(&ListParams::default()).await?;
        let seen: Vec<String> = l
            .items
            .iter()
            .map(|e| {
                format!(
                    "{}:{}:{}",
                    e.involved_object.name.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.message.clone().unwrap_or_default()
                )
            })
            .collect();
        Ok(
            match l.items.iter().find(|e| {
                e.involved_object.name.as_deref() == Some("too-big")
                    && e.reason.as_deref() == Some("FailedScheduling")
            }) {
                Some(e) => Check::Done(e.message.clone().unwrap_or_default()),
                None => Check::NotYet(format!("events: {seen:?}")),
            },
        )
    })
    .await?;
    assert!(
        msg.contains("Insufficient nvidia.com/gpu"),
        "unexpected message: {msg}"
    );

    let node = wait_for("fits to be bound and Running", T, || async {
        let p = serde_json::to_value(pods.get("fits").await?)?;
        let node = str_at(&p, &["spec", "nodeName"]).to_string();
        let phase = str_at(&p, &["status", "phase"]).to_string();
        Ok(if !node.is_empty() && phase == "Running" {
            Check::Done(node)
        } else {
            Check::NotYet(format!("node={node:?} phase={phase}"))
        })
    })
    .await?;
    assert!(node.starts_with("gpu-"));
    let big = serde_json::to_value(pods.get("too-big").await?)?;
    assert_eq!(str_at(&big, &["status", "phase"]), "Pending");
    assert_eq!(str_at(&big, &["spec", "nodeName"]), "");
    Ok(())
}

#[tokio::test]
async fn rayservice_gets_a_running_cluster_and_serve_app() {
    let cp = control_plane();
    or_panic(rayservice_gets_a_running_cluster_and_serve_app_body(&cp).await);
}

async fn rayservice_gets_a_running_cluster_and_serve_app_body(cp: &ControlPlane) -> Result<()> {
    let client = cp.client().await?;
    let ns = create_namespace(&client, "first").await?;
    nodes(&client, &[("cpu", 0), ("gpu-a", 8)]).await;
    create_rs(
        &client,
        &ns,
        &ray_service("llm", "rayproject/ray:2.9.0-gpu", 2, json!({})),
    )
    .await?;

    let rs = wait_serving(&client, &ns, "llm").await?;
    let rs_uid = str_at(&rs, &["metadata", "uid"]).to_string();
    let active = active_of(&rs);
    let suffix = active.strip_prefix("llm-").context("cluster name prefix")?;
    assert_eq!(suffix.len(), 5);
    assert!(
        suffix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    );
    assert_eq!(i64_at(&rs, &["status", "numServeEndpoints"]), Some(3));
    assert_eq!(str_at(&rs, &["status", "serviceStatus"]), "Running");

    let rc = get_json(&rc_api(&client, &ns), &active).await?;
    assert_eq!(
        str_at(
            &rc,
            &["metadata", "labels", "ray.io/originated-from-cr-name"]
        ),
        "llm"
    );
    assert_eq!(
        str_at(&rc, &["metadata", "labels", "ray.io/originated-from-crd"]),
        "RayService"
    );
    assert_eq!(
        Some(str_at(
            &rc,
            &["metadata", "annotations", "ray.io/kuberay-version"]
        )),
        cp.kuberay_version()
    );
    assert_eq!(
        str_at(
            &rc,
            &["metadata", "annotations", "ray.io/num-worker-groups"]
        ),
        "1"
    );
    assert_eq!(
        str_at(
            &rc,
            &[
                "metadata",
                "annotations",
                "ray.io/hash-without-replicas-and-workers-to-delete"
            ]
        )
        .len(),
        32
    );
    let owner = &rc["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            owner["kind"].as_str(),
            owner["uid"].as_str(),
            owner["controller"].as_bool()
        ),
        (Some("RayService"), Some(rs_uid.as_str()), Some(true))
    );
    assert_eq!(str_at(&rc, &["status", "state"]), "ready");
    assert!(cond_true(&rc, "HeadPodReady") && cond_true(&rc, "RayClusterProvisioned"));
    assert_eq!(i64_at(&rc, &["status", "readyWorkerReplicas"]), Some(2));
    assert_eq!(i64_at(&rc, &["status", "desiredWorkerReplicas"]), Some(2));
    assert_eq!(str_at(&rc, &["status", "desiredGPU"]), "8");

    let pods = pods_of(&client, &ns, &active).await?;
    assert_eq!(pods.len(), 3);
    for p in &pods {
        assert!(
            !str_at(p, &["spec", "nodeName"]).is_empty(),
            "unbound pod {p}"
        );
        assert_eq!(str_at(p, &["status", "phase"]), "Running");
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "RayCluster");
        let name = str_at(p, &["metadata", "name"]);
        match str_at(p, &["metadata", "labels", "ray.io/node-type"]) {
            "head" => assert!(name.starts_with(&format!("{active}-head-")), "{name}"),
            "worker" => {
                assert!(name.starts_with(&format!("{active}-gpu-worker-")), "{name}");
                assert_eq!(p["spec"]["initContainers"][0]["name"], "wait-gcs-ready");
                assert!(str_at(p, &["spec", "nodeName"]).starts_with("gpu-a-"));
            }
            other => panic!("unexpected node type {other}"),
        }
    }

    // Deletion: KubeRay v1.5.x and v1.6.0-v1.6.1 put no finalizer on a RayService and leave
    // its RayClusters (owner references) and their pods to the garbage collector; v1.6.2 adds
    // `ray.io/rayservice-finalizer` with a full Update on the first reconcile and, on
    // deletion, deletes the RayClusters itself at once before removing it.
    let want: Vec<Value> = match cp.kuberay_version() {
        Some("v1.5.2" | "v1.6.1") => vec![],
        _ => vec![json!("ray.io/rayservice-finalizer")],
    };
    assert_eq!(
        arr_at(&rs, &["metadata", "finalizers"]),
        want.as_slice(),
        "{}",
        rs["metadata"]["finalizers"]
    );
    rs_api(&client, &ns)
        .delete("llm", &Default::default())
        .await?;
    wait_for("RayService, RayClusters and pods to be gone", T, || async {
        let svcs = list_json(&rs_api(&client, &ns)).await?.len();
        let clusters = list_json(&rc_api(&client, &ns)).await?.len();
        let pods = pods_of(&client, &ns, &active).await?.len();
        Ok(if svcs + clusters + pods == 0 {
            Check::Done(())
        } else {
            Check::NotYet(format!("{svcs} services, {clusters} clusters, {pods} pods"))
        })
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn image_edit_upgrades_through_a_pending_cluster() {
    let cp = control_plane();
    or_panic(image_edit_upgrades_through_a_pending_cluster_body(&cp).await);
}

async fn image_edit_upgrades_through_a_pending_cluster_body(cp: &ControlPlane) -> Result<()> {
    let client = cp.client().await?;
    let ns = create_namespace(&client, "upgrade").await?;
    nodes(&client, &[("cpu", 0), ("gpu-a", 8), ("gpu-b", 8)]).await;
    create_rs(
        &client,
        &ns,
        &ray_service(
            "llm",
            "rayproject/ray:2.9.0-gpu",
            2,
            json!({"rayClusterDeletionDelaySeconds": 2}),
        ),
    )
    .await?;
    let old = active_of(&wait_serving(&client, &ns, "llm").await?);
    let old_hash = str_at(
        &get_json(&rc_api(&client, &ns), &old).await?,
        &[
            "metadata",
            "annotations",
            "ray.io/hash-without-replicas-and-workers-to-delete",
        ],
    )
    .to_string();

    let api = rs_api(&client, &ns);
    json_patch(
        &api,
        "llm",
        json!([{"op": "replace",
        "path": "/spec/rayClusterConfig/workerGroupSpecs/0/template/spec/containers/0/image",
        "value": "rayproject/ray:2.10.0-gpu"}]),
    )
    .await?;

    let pending = wait_for("a pending cluster with UpgradeInProgress", T, || async {
        let rs = get_json(&api, "llm").await?;
        let p = str_at(&rs, &["status", "pendingServiceStatus", "rayClusterName"]).to_string();
        Ok(if !p.is_empty() && cond_true(&rs, "UpgradeInProgress") {
            Check::Done(p)
        } else {
            Check::NotYet(summary(&rs))
        })
    })
    .await?;
    assert_ne!(pending, old);
    assert_eq!(
        active_of(&get_json(&api, "llm").await?),
        old,
        "old cluster stays active while pending"
    );

    let rs = wait_for("promotion of the pending cluster", T, || async {
        let rs = get_json(&api, "llm").await?;
        let done = active_of(&rs) == pending
            && str_at(&rs, &["status", "pendingServiceStatus", "rayClusterName"]).is_empty()
            && !cond_true(&rs, "UpgradeInProgress");
        Ok(if done {
            Check::Done(rs.clone())
        } else {
            Check::NotYet(summary(&rs))
        })
    })
    .await?;
    assert_eq!(
        str_at(
            &rs,
            &[
                "status",
                "activeServiceStatus",
                "applicationStatuses",
                "llm",
                "status"
            ]
        ),
        "RUNNING"
    );
    let new_rc = get_json(&rc_api(&client, &ns), &pending).await?;
    assert_ne!(
        str_at(
            &new_rc,
            &[
                "metadata",
                "annotations",
                "ray.io/hash-without-replicas-and-workers-to-delete"
            ]
        ),
        old_hash
    );
    for w in worker_pods(&pods_of(&client, &ns, &pending).await?, "gpu") {
        assert_eq!(
            w["spec"]["containers"][0]["image"],
            "rayproject/ray:2.10.0-gpu"
        );
    }

    wait_for("old RayCluster and its pods to be gone", T, || async {
        let names = cluster_names(&client, &ns).await?;
        let pods = pods_of(&client, &ns, &old).await?;
        Ok(if !names.contains(&old) && pods.is_empty() {
            Check::Done(())
        } else {
            Check::NotYet(format!("clusters={names:?}, {} old pods", pods.len()))
        })
    })
    .await?;
    assert_eq!(cluster_names(&client, &ns).await?, vec![pending]);
    Ok(())
}

#[tokio::test]
async fn replicas_edit_keeps_the_cluster_and_in_place_updates_scale_pods() {
    let cp = control_plane();
    or_panic(replicas_edit_keeps_the_cluster_and_in_place_updates_scale_pods_body(&cp).await);
}

async fn replicas_edit_keeps_the_cluster_and_in_place_updates_scale_pods_body(
    cp: &ControlPlane,
) -> Result<()> {
    let client = cp.client().await?;
    let ns = create_namespace(&client, "scale").await?;
    nodes(&client, &[("cpu", 0), ("gpu-a", 8), ("gpu-b", 8)]).await;
    create_rs(
        &client,
        &ns,
        &ray_service("llm", "rayproject/ray:2.9.0-gpu", 1, json!({})),
    )
    .await?;
    let active = active_of(&wait_serving(&client, &ns, "llm").await?);
    let rs_api = rs_api(&client, &ns);
    let rc_api = rc_api(&client, &ns);

    // KubeRay v1.7 mutes replicas in the hash: no new cluster, and no in-place update either.
    json_patch(&rs_api, "llm", json!([{"op": "replace", "path": "/spec/rayClusterConfig/workerGroupSpecs/0/replicas", "value": 2}])).await?;
    let rs = wait_observed(&client, &ns, "llm").await?;
    assert_eq!(
        str_at(&rs, &["status", "pendingServiceStatus", "rayClusterName"]),
        "",
        "{}",
        summary(&rs)
    );
    assert_eq!(active_of(&rs), active);
    assert_eq!(cluster_names(&client, &ns).await?, vec![active.clone()]);
    let rc = get_json(&rc_api, &active).await?;
    assert_eq!(rc["spec"]["workerGroupSpecs"][0]["replicas"], 1);

    // Scaling the RayCluster itself (what the autoscaler does) scales pods in place.
    json_patch(
        &rc_api,
        &active,
        json!([{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}]),
    )
    .await?;
    wait_workers(&client, &ns, &active, "gpu", 2).await?;
    json_patch(
        &rc_api,
        &active,
        json!([{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}]),
    )
    .await?;
    wait_workers(&client, &ns, &active, "gpu", 1).await?;

    // Appending a worker group is KubeRay's in-place update: the whole spec (with replicas 2
    // from the earlier edit) is applied to the existing cluster.
    json_patch(
        &rs_api,
        "llm",
        json!([{"op": "add", "path": "/spec/rayClusterConfig/workerGroupSpecs/-", "value": {
        "groupName": "cpu", "replicas": 1, "minReplicas": 0, "maxReplicas": 2, "rayStartParams": {},
        "template": {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.9.0",
            "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}]}}}}]),
    )
    .await?;
    wait_workers(&client, &ns, &active, "cpu", 1).await?;
    wait_workers(&client, &ns, &active, "gpu", 2).await?;
    let rs = wait_serving(&client, &ns, "llm").await?;
    assert_eq!(active_of(&rs), active);
    assert_eq!(cluster_names(&client, &ns).await?, vec![active.clone()]);
    let rc = get_json(&rc_api, &active).await?;
    assert_eq!(
        str_at(
            &rc,
            &["metadata", "annotations", "ray.io/num-worker-groups"]
        ),
        "2"
    );
    Ok(())
}

#[tokio::test]
async fn upgrade_strategy_none_blocks_new_clusters_until_newcluster() {
    let cp = control_plane();
    or_panic(upgrade_strategy_none_blocks_new_clusters_until_newcluster_body(&cp).await);
}

async fn upgrade_strategy_none_blocks_new_clusters_until_newcluster_body(
    cp: &ControlPlane,
) -> Result<()> {
    let client = cp.client().await?;
    let ns = create_namespace(&client, "none").await?;
    nodes(&client, &[("cpu", 0), ("gpu-a", 8), ("gpu-b", 8)]).await;
    create_rs(
        &client,
        &ns,
        &ray_service(
            "llm",
            "rayproject/ray:2.9.0-gpu",
            2,
            json!({"upgradeStrategy": {"type": "None"}, "rayClusterDeletionDelaySeconds": 1}),
        ),
    )
    .await?;
    let old = active_of(&wait_serving(&client, &ns, "llm").await?);
    let api = rs_api(&client, &ns);

    json_patch(
        &api,
        "llm",
        json!([{"op": "replace",
        "path": "/spec/rayClusterConfig/workerGroupSpecs/0/template/spec/containers/0/image",
        "value": "rayproject/ray:2.10.0-gpu"}]),
    )
    .await?;
    let rs = wait_observed(&client, &ns, "llm").await?;
    assert_eq!(
        str_at(&rs, &["status", "pendingServiceStatus", "rayClusterName"]),
        "",
        "{}",
        summary(&rs)
    );
    assert_eq!(cluster_names(&client, &ns).await?, vec![old.clone()]);
    for w in worker_pods(&pods_of(&client, &ns, &old).await?, "gpu") {
        assert_eq!(
            w["spec"]["containers"][0]["image"],
            "rayproject/ray:2.9.0-gpu"
        );
    }

    json_patch(
        &api,
        "llm",
        json!([{"op": "replace", "path": "/spec/upgradeStrategy/type", "value": "NewCluster"}]),
    )
    .await?;
    let rs = wait_for("the NewCluster upgrade to complete", T, || async {
        let rs = get_json(&api, "llm").await?;
        let a = active_of(&rs);
        let done = !a.is_empty() && a != old && !cond_true(&rs, "UpgradeInProgress");
        Ok(if done {
            Check::Done(rs.clone())
        } else {
            Check::NotYet(summary(&rs))
        })
    })
    .await?;
    let new = active_of(&rs);
    for w in worker_pods(&pods_of(&client, &ns, &new).await?, "gpu") {
        assert_eq!(
            w["spec"]["containers"][0]["image"],
            "rayproject/ray:2.10.0-gpu"
        );
    }
    Ok(())
}

#[tokio::test]
async fn forced_serve_failure_stalls_the_upgrade() {
    let cp = control_plane();
    or_panic(forced_serve_failure_stalls_the_upgrade_body(&cp).await);
}

async fn forced_serve_failure_stalls_the_upgrade_body(cp: &ControlPlane) -> Result<()> {
    let client = cp.client().await?;
    let ns = create_namespace(&client, "stall").await?;
    nodes(&client, &[("cpu", 0), ("gpu-a", 8), ("gpu-b", 8)]).await;
    create_rs(
        &client,
        &ns,
        &ray_service("llm", "rayproject/ray:2.9.0-gpu", 2, json!({})),
    )
    .await?;
    let old = active_of(&wait_serving(&client, &ns, "llm").await?);
    let api = rs_api(&client, &ns);
    // The active cluster keeps serving (its own annotation wins over the RayService's); the
    // new cluster inherits the RayService's annotations (KubeRay copies them) and fails.
    rc_api(&client, &ns)
        .patch(
            &old,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {APP_STATUS: "RUNNING"}}})),
        )
        .await?;
    let merge = json!({
        "metadata": {"annotations": {APP_STATUS: "DEPLOY_FAILED"}},
        "spec": {"rayClusterConfig": {"rayVersion": "2.10.0"}},
    });
    api.patch("llm", &PatchParams::default(), &Patch::Merge(merge))
        .await?;
    // The pending cluster's readiness is read from the RayCluster itself: the
    // copy in the RayService's `pendingServiceStatus.rayClusterStatus` is only
    // written along with another status change (KubeRay v1.6.2
    // `utils.InconsistentRayServiceStatuses`: "The RayClusterStatus field is
    // only for observability in RayService CR, and changes to it will not
    // trigger the status update"), so once the app is DEPLOY_FAILED and the
    // cluster turns ready later, that copy stays empty for good.
    let clusters = rc_api(&client, &ns);
    let (rs, pending) = wait_for(
        "pending cluster ready with DEPLOY_FAILED app",
        T,
        || async {
            let rs = get_json(&api, "llm").await?;
            let p = str_at(&rs, &["status", "pendingServiceStatus", "rayClusterName"]).to_string();
            let ready = !p.is_empty()
                && str_at(&get_json(&clusters, &p).await?, &["status", "state"]) == "ready";
            let app = str_at(
                &rs,
                &[
                    "status",
                    "pendingServiceStatus",
                    "applicationStatuses",
                    "llm",
                    "status",
                ],
            ) == "DEPLOY_FAILED";
            Ok(if !p.is_empty() && ready && app {
                Check::Done((rs.clone(), p))
            } else {
                Check::NotYet(summary(&rs))
            })
        },
    )
    .await?;
    assert_eq!(active_of(&rs), old);
    assert!(cond_true(&rs, "UpgradeInProgress"));
    assert_eq!(pods_of(&client, &ns, &pending).await?.len(), 3);
    Ok(())
}

#[tokio::test]
async fn kubectl_reports_a_v1_36_server_and_the_pinned_kuberay_operator_runs() {
    let cp = control_plane();
    or_panic(kubectl_reports_a_v1_36_server_and_the_pinned_kuberay_operator_runs_body(&cp).await);
}

async fn kubectl_reports_a_v1_36_server_and_the_pinned_kuberay_operator_runs_body(
    cp: &ControlPlane,
) -> Result<()> {
    let out = cp.kubectl(&["version", "-o", "json"])?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl version: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(str_at(&v, &["clientVersion", "gitVersion"]), "v1.36.3");
    assert!(
        str_at(&v, &["serverVersion", "gitVersion"]).starts_with("v1.36."),
        "{v}"
    );
    assert_eq!(str_at(&v, &["serverVersion", "minor"]), "36");

    // The operator is the binary built from the pinned module: `up` logs the module version
    // (from `go version -m`), and the operator stamps its compiled-in version on clusters.
    let version = cp
        .kuberay_version()
        .context("this test needs a KubeRay operator")?;
    let log = std::fs::read_to_string(cp.log_dir().join("kuberay-operator.log"))?;
    let first = log.lines().next().unwrap_or_default();
    assert!(
        first.contains(&format!(
            "github.com/ray-project/kuberay/ray-operator@{version}"
        )),
        "{first}"
    );
    let client = cp.client().await?;
    let ns = create_namespace(&client, "version").await?;
    let rc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "plain"},
        "spec": ray_service("x", "rayproject/ray:2.9.0", 0, json!({}))["spec"]["rayClusterConfig"].clone(),
    }))?;
    let rcs = rc_api(&client, &ns);
    rcs.create(&PostParams::default(), &rc).await?;
    // Both versions put `kuberay_version=<KUBERAY_VERSION>;...` into the Ray usage-stats tag
    // env var of every pod (v1.6 also annotates pods with ray.io/kuberay-version; v1.5 not).
    let seen = wait_for(
        "KubeRay to stamp its version on the head pod",
        T,
        || async {
            let pods = pods_of(&client, &ns, "plain").await?;
            let v = pods.iter().find_map(|p| {
                p["spec"]["containers"][0]["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e["value"].as_str())
                    .find_map(|v| v.strip_prefix("kuberay_version="))
                    .and_then(|v| v.split(';').next())
                    .map(str::to_string)
            });
            Ok(match v {
                Some(v) => Check::Done(v),
                None => Check::NotYet(format!("{} pods", pods.len())),
            })
        },
    )
    .await?;
    assert_eq!(seen, version);
    Ok(())
}
