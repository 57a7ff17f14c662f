//! Rollout cadence on the real stack (issue 33): `spec.batching` against
//! Kubernetes v1.36, kwok nodes and the real KubeRay operator of
//! `RAYGATE_KUBERAY_VERSION`, `ray-head` answering as Ray.
//!
//! Three cluster-recreating commits (image tag, memory, a new worker group)
//! within the quiet period make exactly one new RayCluster: every RayCluster
//! the operator ever creates is counted from a watch, not read from the end
//! state. The BatchReleased Event and `raygate_recreations_avoided_total`
//! are checked. Needs `e2e/setup` and `cargo build --workspace --bins`.

use anyhow::Result;
use futures::StreamExt;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::json::str_at;
use raygate_e2e::{
    Check, ControlPlane, FakeNode, GpuRayService, Raygate, create_namespace, wait_for,
    workspace_bin,
};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const T: Duration = Duration::from_secs(180);
/// Long enough for three patches and their reconciles on a loaded machine,
/// short enough for CI.
const QUIET: &str = "40s";

struct Env {
    client: Client,
    ns: String,
    rg: Raygate,
    cp: ControlPlane,
}

async fn env(gpu_nodes: &[u32]) -> Env {
    let cp = ControlPlane::start()
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))
        .expect("install the UpgradePlan CRD");
    let client = cp.client().await.expect("client");
    let ns = create_namespace(&client, "rg").await.expect("namespace");
    for (i, gpus) in gpu_nodes.iter().enumerate() {
        FakeNode::new(format!("gpu-{i}"))
            .cpu("32")
            .memory("256Gi")
            .gpu(*gpus)
            .create(&client)
            .await
            .expect("create fake node");
    }
    let rg = Raygate::spawn(&cp, &[]).unwrap_or_else(|e| panic!("{e:#}"));
    Env { client, ns, rg, cp }
}

fn api(e: &Env, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let version = if group == "ray.io" { "v1" } else { "v1alpha1" };
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(e.client.clone(), &e.ns, &ar)
}

fn plans(e: &Env) -> Api<DynamicObject> {
    api(e, "raygate.io", "UpgradePlan", "upgradeplans")
}

fn services(e: &Env) -> Api<DynamicObject> {
    api(e, "ray.io", "RayService", "rayservices")
}

fn clusters(e: &Env) -> Api<DynamicObject> {
    api(e, "ray.io", "RayCluster", "rayclusters")
}

async fn create(a: &Api<DynamicObject>, v: Value) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(v)?;
    a.create(&PostParams::default(), &obj).await?;
    Ok(())
}

async fn get(a: &Api<DynamicObject>, name: &str) -> Result<Value> {
    Ok(serde_json::to_value(a.get(name).await?)?)
}

fn describe(p: &Value) -> String {
    format!(
        "phase={} waitingFor={:?} message={:?} batch={}",
        str_at(p, &["status", "phase"]),
        str_at(p, &["status", "waitingFor"]),
        str_at(p, &["status", "message"]),
        p["status"]["batch"]
    )
}

/// Waits until the plan satisfies `ok`.
async fn wait_plan(e: &Env, what: &str, ok: impl Fn(&Value) -> bool) -> Result<Value> {
    let a = plans(e);
    wait_for(what, T, || async {
        let p = get(&a, "llm").await?;
        Ok(if ok(&p) {
            Check::Done(p)
        } else {
            Check::NotYet(describe(&p))
        })
    })
    .await
}

/// Applies `edit` to the RayService's worker groups, as `kubectl patch` would.
async fn edit_workers(e: &Env, edit: impl Fn(&mut Value)) -> Result<()> {
    let current = get(&services(e), "llm").await?;
    let mut groups = current["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
    edit(&mut groups);
    let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
    services(e)
        .patch("llm", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn gate(e: &Env) -> Result<String> {
    let rs = get(&services(e), "llm").await?;
    Ok(str_at(&rs, &["spec", "upgradeStrategy", "type"]).to_string())
}

/// Every RayCluster name the namespace ever had, from a watch started now.
fn watch_creations(e: &Env) -> Arc<Mutex<BTreeSet<String>>> {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    // With a backoff: once the test ends and its control plane is gone, a watcher without one
    // retries in a loop that never yields (loopback refuses at once), and the runtime's shutdown
    // then waits for it forever (seen in CI: cadence@v1.5.2 hung at the end of a passed test).
    let stream = watcher(clusters(e), watcher::Config::default()).default_backoff();
    let into = seen.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            let objs = match ev {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => vec![o],
                _ => vec![],
            };
            for o in objs {
                if let Some(n) = o.metadata.name {
                    into.lock().unwrap().insert(n);
                }
            }
        }
    });
    seen
}

fn plugin(e: &Env, args: &[&str]) -> (i32, String, String) {
    let bin = workspace_bin("kubectl-raygate")
        .expect("kubectl-raygate binary (cargo build --workspace --bins)");
    let out = std::process::Command::new(bin)
        .args(args)
        .arg("--kubeconfig")
        .arg(e.cp.kubeconfig_path())
        .env_remove("KUBECONFIG")
        .output()
        .expect("run kubectl-raygate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `events.k8s.io/v1` notes about UpgradePlan llm with `reason`.
async fn notes(e: &Env, reason: &str) -> Result<Vec<String>> {
    notes_of(e, "llm", reason).await
}

async fn notes_of(e: &Env, plan: &str, reason: &str) -> Result<Vec<String>> {
    let a: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(e.client.clone(), &e.ns);
    let fields = format!("regarding.kind=UpgradePlan,regarding.name={plan},reason={reason}");
    let l = a.list(&ListParams::default().fields(&fields)).await?;
    Ok(l.items
        .into_iter()
        .map(|ev| ev.note.unwrap_or_default())
        .collect())
}

/// One commit's edit of the worker groups.
type Edit = Box<dyn Fn(&mut Value)>;

fn or_panic<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_commits_in_the_quiet_period_make_one_new_cluster() {
    let e = env(&[8, 8]).await;
    // The apiserver refuses what raygate would refuse (the CRD's CEL rule and pattern).
    for (spec, want) in [
        (
            json!({"batching": {"quietPeriod": "1h", "maxDelay": "10m"}}),
            "maxDelay must be at least quietPeriod",
        ),
        (
            json!({"batching": {"quietPeriod": "soon"}}),
            "spec.batching.quietPeriod",
        ),
        (json!({"timeZone": "Europe/Berlin Summer"}), "spec.timeZone"),
    ] {
        let mut full = json!({"rayServiceRef": {"name": "llm"}});
        for (k, v) in spec.as_object().into_iter().flatten() {
            full[k] = v.clone();
        }
        let bad = json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
                         "metadata": {"name": "bad"}, "spec": full});
        let err = create(&plans(&e), bad)
            .await
            .expect_err("the apiserver refuses it");
        assert!(format!("{err:#}").contains(want), "{want}: {err:#}");
    }
    or_panic(
        create(
            &plans(&e),
            json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
                   "metadata": {"name": "llm"},
                   "spec": {"rayServiceRef": {"name": "llm"}, "stallAfter": "10m",
                            "batching": {"quietPeriod": QUIET, "maxDelay": "10m"}}}),
        )
        .await,
    );
    let seen = watch_creations(&e);
    let svc = GpuRayService::new("llm", "rayproject/ray:2.9.0-gpu")
        .replicas(1)
        .gpus(4)
        .serve_deployment("LLM")
        .build();
    or_panic(create(&services(&e), svc).await);
    or_panic(
        wait_plan(&e, "plan Idle", |p| {
            str_at(p, &["status", "phase"]) == "Idle"
        })
        .await,
    );
    let first: BTreeSet<String> = seen.lock().unwrap().clone();
    assert_eq!(first.len(), 1, "the RayService's first cluster: {first:?}");

    // Three commits, each seen by raygate before the next (it records each
    // in status.batch), all within the quiet period.
    let commits: [(&str, Edit); 3] = [
        (
            "image tag",
            Box::new(|g: &mut Value| {
                g[0]["template"]["spec"]["containers"][0]["image"] =
                    json!("rayproject/ray:2.10.0-gpu")
            }),
        ),
        (
            "memory",
            Box::new(|g: &mut Value| {
                g[0]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] =
                    json!("24Gi")
            }),
        ),
        (
            "a new worker group",
            Box::new(|g: &mut Value| {
                let mut cpu = g[0].clone();
                cpu["groupName"] = json!("cpu-workers");
                cpu["template"]["spec"]["containers"][0]["resources"] =
                    json!({"requests": {"cpu": "2", "memory": "4Gi"}});
                if let Some(a) = g.as_array_mut() {
                    a.push(cpu);
                }
            }),
        ),
    ];
    let mut fingerprints = vec![];
    for (i, (what, edit)) in commits.iter().enumerate() {
        or_panic(edit_workers(&e, edit).await);
        let n = i as u64 + 1;
        let p = or_panic(
            wait_plan(&e, &format!("commit {} ({what}) in the batch", n), |p| {
                str_at(p, &["status", "phase"]) == "Batching"
                    && p["status"]["batch"]["changeCount"].as_u64() == Some(n)
            })
            .await,
        );
        fingerprints.push(str_at(&p, &["status", "batch", "fingerprint"]).to_string());
        assert_eq!(or_panic(gate(&e).await), "None", "held while batching");
        assert!(
            !str_at(&p, &["status", "batch", "releaseTime"]).is_empty(),
            "{}",
            describe(&p)
        );
    }
    // What `kubectl raygate queue` shows of the batch.
    let (code, out, err) = plugin(&e, &["queue", "-n", &e.ns]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("BATCH") && out.contains("3 until "), "{out}");
    assert!(out.contains("Batching"), "{out}");
    let p = or_panic(get(&plans(&e), "llm").await);
    let paths: Vec<String> = p["status"]["batch"]["changes"]
        .as_array()
        .map(|c| c.iter().map(|c| c["paths"].to_string()).collect())
        .unwrap_or_default();
    assert_eq!(paths.len(), 3, "{paths:?}");
    assert!(paths[0].contains("image"), "{paths:?}");
    assert!(paths[1].contains("memory"), "{paths:?}");
    assert!(paths[2].contains("cpu-workers"), "{paths:?}");
    assert_eq!(
        seen.lock().unwrap().clone(),
        first,
        "no cluster while batching"
    );

    // Released after the quiet period, admitted, one transition.
    let done = or_panic(
        wait_plan(&e, "plan Completed", |p| {
            str_at(p, &["status", "phase"]) == "Completed"
        })
        .await,
    );
    assert_eq!(
        str_at(&done, &["status", "lastTransition", "fingerprint"]),
        fingerprints[2],
        "the last commit's spec was admitted"
    );
    let all = seen.lock().unwrap().clone();
    let created: Vec<&String> = all.difference(&first).collect();
    assert_eq!(created.len(), 1, "exactly one new RayCluster ever: {all:?}");

    let released = or_panic(notes(&e, "BatchReleased").await);
    assert_eq!(released.len(), 1, "{released:?}");
    assert!(
        released[0].contains("3 changes, 1 recreation"),
        "{released:?}"
    );
    let admitted = or_panic(notes(&e, "Admitted").await);
    assert!(
        admitted.iter().any(|n| n.contains("(batch of 3 changes)")),
        "{admitted:?}"
    );
    let metrics = e.rg.metrics().expect("metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("raygate_recreations_avoided_total{")
                && l.contains(&format!("namespace=\"{}\"", e.ns))
                && l.ends_with(" 2")),
        "{metrics}"
    );
}

const APP_STATUS: &str = "ray-head.e2e.raygate.dev/app-status";

/// The RayService `name`'s status cluster names: (active, pending).
async fn service_clusters(e: &Env, name: &str) -> Result<(String, String)> {
    let rs = get(&services(e), name).await?;
    Ok((
        str_at(&rs, &["status", "activeServiceStatus", "rayClusterName"]).to_string(),
        str_at(&rs, &["status", "pendingServiceStatus", "rayClusterName"]).to_string(),
    ))
}

/// Keeps `name`'s active cluster serving and makes every cluster KubeRay
/// creates from now on report its Serve app DEPLOYING (it copies the
/// RayService's annotations), so a transition stays open; with `image`, the
/// same patch edits the worker image.
async fn hold_transitions_open(e: &Env, name: &str, active: &str, image: &str) -> Result<()> {
    let running = json!({"metadata": {"annotations": {APP_STATUS: "RUNNING"}}});
    clusters(e)
        .patch(active, &PatchParams::default(), &Patch::Merge(&running))
        .await?;
    let current = get(&services(e), name).await?;
    let mut groups = current["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
    groups[0]["template"]["spec"]["containers"][0]["image"] = json!(image);
    let patch = json!({"metadata": {"annotations": {APP_STATUS: "DEPLOYING"}},
                       "spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
    services(e)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn set_image(e: &Env, name: &str, image: &str) -> Result<()> {
    let current = get(&services(e), name).await?;
    let mut groups = current["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
    groups[0]["template"]["spec"]["containers"][0]["image"] = json!(image);
    let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
    services(e)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn of(seen: &Arc<Mutex<BTreeSet<String>>>, prefix: &str) -> BTreeSet<String> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|n| n.starts_with(prefix))
        .cloned()
        .collect()
}

/// A second cluster edit while a transition runs: what the real KubeRay does
/// with it alone (a RayService raygate does not gate, `upgradeStrategy:
/// NewCluster`: measured and printed for the record), and that under raygate
/// it waits, visibly, as the next batch, with no third cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_during_a_transition_waits_as_the_next_batch() {
    let e = env(&[8, 8, 8]).await;
    let seen = watch_creations(&e);

    // KubeRay alone.
    let mut raw = GpuRayService::new("raw", "rayproject/ray:2.9.0-gpu")
        .replicas(1)
        .gpus(2)
        .serve_deployment("LLM")
        .build();
    raw["spec"]["upgradeStrategy"] = json!({"type": "NewCluster"});
    or_panic(create(&services(&e), raw).await);
    let raw_active = or_panic(
        wait_for("raw serving", T, || async {
            let (active, _) = service_clusters(&e, "raw").await?;
            Ok(if active.is_empty() {
                Check::NotYet("no active cluster".into())
            } else {
                Check::Done(active)
            })
        })
        .await,
    );
    or_panic(hold_transitions_open(&e, "raw", &raw_active, "rayproject/ray:2.10.0-gpu").await);
    let p1 = or_panic(
        wait_for("raw pending cluster", T, || async {
            let (_, pending) = service_clusters(&e, "raw").await?;
            Ok(if pending.is_empty() {
                Check::NotYet("no pending cluster".into())
            } else {
                Check::Done(pending)
            })
        })
        .await,
    );
    or_panic(set_image(&e, "raw", "rayproject/ray:2.11.0-gpu").await);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (_, pending_after) = or_panic(service_clusters(&e, "raw").await);
    let existing: BTreeSet<String> = or_panic(
        clusters(&e)
            .list(&ListParams::default())
            .await
            .map_err(anyhow::Error::from),
    )
    .items
    .into_iter()
    .filter_map(|c| c.metadata.name)
    .filter(|n| n.starts_with("raw-"))
    .collect();
    let image_of = |c: &Value| {
        str_at(
            &c["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0],
            &["image"],
        )
        .to_string()
    };
    let pending_image = match pending_after.as_str() {
        "" => String::new(),
        p => image_of(&or_panic(get(&clusters(&e), p).await)),
    };
    // What the pending cluster's worker pods run (KubeRay may rewrite the
    // spec of a cluster without replacing its pods).
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(e.client.clone(), &e.ns);
    let pod_images: Vec<String> = or_panic(
        pods.list(&ListParams::default().labels(&format!(
            "ray.io/cluster={pending_after},ray.io/node-type=worker"
        )))
        .await
        .map_err(anyhow::Error::from),
    )
    .items
    .iter()
    .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
    .filter_map(|c| c.image.clone())
    .collect();
    println!(
        "KubeRay {} alone, a second edit during a transition: created {:?}; pending before {p1}, \
         30 s after the edit {pending_after} (worker image {pending_image} in its spec, its worker \
         pods run {pod_images:?}); existing now {existing:?}",
        e.cp.kuberay_version().unwrap_or_default(),
        of(&seen, "raw-"),
    );
    // Then the pending cluster's app turns RUNNING: what is promoted, and is
    // another cluster built for the second edit?
    let running = json!({"metadata": {"annotations": {APP_STATUS: "RUNNING"}}});
    if !pending_after.is_empty() {
        or_panic(
            clusters(&e)
                .patch(
                    &pending_after,
                    &PatchParams::default(),
                    &Patch::Merge(&running),
                )
                .await
                .map_err(anyhow::Error::from),
        );
    }
    or_panic(
        services(&e)
            .patch("raw", &PatchParams::default(), &Patch::Merge(&running))
            .await
            .map_err(anyhow::Error::from),
    );
    tokio::time::sleep(Duration::from_secs(45)).await;
    let (active_then, pending_then) = or_panic(service_clusters(&e, "raw").await);
    let active_image = match active_then.as_str() {
        "" => String::new(),
        a => image_of(&or_panic(get(&clusters(&e), a).await)),
    };
    println!(
        "KubeRay {} alone, 45 s after the pending cluster serves: active {active_then} (worker image \
         {active_image}), pending {pending_then:?}; created {:?}",
        e.cp.kuberay_version().unwrap_or_default(),
        of(&seen, "raw-"),
    );

    // Under raygate, no batching: the edit waits as the next batch.
    or_panic(
        create(
            &plans(&e),
            json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
                   "metadata": {"name": "gov"},
                   "spec": {"rayServiceRef": {"name": "gov"}, "stallAfter": "10m"}}),
        )
        .await,
    );
    let gov = GpuRayService::new("gov", "rayproject/ray:2.9.0-gpu")
        .replicas(1)
        .gpus(2)
        .serve_deployment("LLM")
        .build();
    or_panic(create(&services(&e), gov).await);
    let plan_of = |want: &'static str| {
        let e = &e;
        async move {
            let a = plans(e);
            wait_for(&format!("plan gov {want}"), T, || async {
                let p = get(&a, "gov").await?;
                Ok(if str_at(&p, &["status", "phase"]) == want {
                    Check::Done(p)
                } else {
                    Check::NotYet(describe(&p))
                })
            })
            .await
        }
    };
    let idle = or_panic(plan_of("Idle").await);
    let active = str_at(&idle, &["status", "activeCluster"]).to_string();
    or_panic(hold_transitions_open(&e, "gov", &active, "rayproject/ray:2.10.0-gpu").await);
    let up = or_panic(plan_of("Upgrading").await);
    let first = str_at(&up, &["status", "admitted", "fingerprint"]).to_string();
    let p1 = or_panic(
        wait_for("gov pending cluster", T, || async {
            let (_, pending) = service_clusters(&e, "gov").await?;
            Ok(if pending.is_empty() {
                Check::NotYet("no pending cluster".into())
            } else {
                Check::Done(pending)
            })
        })
        .await,
    );
    or_panic(set_image(&e, "gov", "rayproject/ray:2.11.0-gpu").await);
    let a = plans(&e);
    let during = or_panic(
        wait_for("the edit shown as the next batch", T, || async {
            let p = get(&a, "gov").await?;
            Ok(
                if str_at(&p, &["status", "batch", "afterTransitionTo"]) == p1 {
                    Check::Done(p)
                } else {
                    Check::NotYet(describe(&p))
                },
            )
        })
        .await,
    );
    let next = str_at(&during, &["status", "batch", "fingerprint"]).to_string();
    assert_ne!(next, first);
    assert!(
        str_at(&during, &["status", "message"]).contains("next batch: 1 change"),
        "{}",
        describe(&during)
    );
    let rs = or_panic(get(&services(&e), "gov").await);
    assert_eq!(str_at(&rs, &["spec", "upgradeStrategy", "type"]), "None");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let gov_created = of(&seen, "gov-");
    assert_eq!(
        gov_created.len(),
        2,
        "the first cluster and the transition's, no third: {gov_created:?}"
    );
    // Let the transition finish (new clusters serve from now on): the next
    // batch then goes, as one more new cluster.
    let running = json!({"metadata": {"annotations": {APP_STATUS: "RUNNING"}}});
    or_panic(
        services(&e)
            .patch("gov", &PatchParams::default(), &Patch::Merge(&running))
            .await
            .map_err(anyhow::Error::from),
    );
    or_panic(
        clusters(&e)
            .patch(&p1, &PatchParams::default(), &Patch::Merge(&running))
            .await
            .map_err(anyhow::Error::from),
    );
    let done = or_panic(
        wait_for("the next batch completed", T, || async {
            let p = get(&a, "gov").await?;
            Ok(
                if str_at(&p, &["status", "phase"]) == "Completed"
                    && str_at(&p, &["status", "lastTransition", "fingerprint"]) == next
                {
                    Check::Done(p)
                } else {
                    Check::NotYet(describe(&p))
                },
            )
        })
        .await,
    );
    assert_eq!(done["status"]["batch"], Value::Null);
    let gov_created = of(&seen, "gov-");
    assert_eq!(gov_created.len(), 3, "{gov_created:?}");
    let joined = or_panic(notes_of(&e, "gov", "Batching").await);
    assert!(
        joined
            .iter()
            .any(|n| n.contains("never as a third cluster")),
        "{joined:?}"
    );
}
