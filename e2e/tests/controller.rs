//! raygate end to end: the raygate binary against Kubernetes v1.36 (apiserver,
//! scheduler, garbage collector), kwok nodes and the real KubeRay operator of
//! `RAYGATE_KUBERAY_VERSION` (v1.6.2 by default; `e2e/run-tests` runs this suite
//! for v1.6.2 and v1.5.2, on v1.5.2 without the four tests whose outcome does not
//! depend on KubeRay: see `args_for` in `e2e/run-suites`), with `ray-head` answering as Ray.
//!
//! Every test starts its own control plane: Nodes are cluster-wide and each
//! scenario depends on exact free capacity. Needs `e2e/setup` and
//! `cargo build --workspace --bins` (for the raygate binary) first.

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Event;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use raygate_e2e::apis::{plan_api, rc_api, rs_api};
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::json::{arr_at, str_at};
use raygate_e2e::{
    Check, ControlPlane, FakeNode, GpuRayService, Options, Raygate, create_namespace, wait_for,
    workspace_bin,
};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

const T: Duration = Duration::from_secs(120);

struct Env {
    client: Client,
    ns: String,
    rg: Raygate,
    // Dropped last: stops the control plane after the processes using it.
    cp: ControlPlane,
}

async fn env(gpu_nodes: &[u32]) -> Env {
    env_with(gpu_nodes, &[]).await
}

async fn env_with(gpu_nodes: &[u32], raygate_args: &[&str]) -> Env {
    let cp = ControlPlane::start()
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    env_on(cp, gpu_nodes, raygate_args).await
}

/// [`env`] on a control plane whose apiserver writes an audit log of every write.
async fn env_audited(gpu_nodes: &[u32]) -> Env {
    let opts = Options::from_env().unwrap_or_else(|e| panic!("{e:#}"));
    let cp = ControlPlane::start_audited(opts)
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    env_on(cp, gpu_nodes, &[]).await
}

async fn env_on(cp: ControlPlane, gpu_nodes: &[u32], raygate_args: &[&str]) -> Env {
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))
        .expect("install the UpgradePlan CRD");
    let client = cp.client().await.expect("client");
    let ns = create_namespace(&client, "rg").await.expect("namespace");
    for (i, gpus) in gpu_nodes.iter().enumerate() {
        add_node(&client, &format!("gpu-{i}"), *gpus).await;
    }
    let rg = Raygate::spawn(&cp, raygate_args).unwrap_or_else(|e| panic!("{e:#}"));
    Env { client, ns, rg, cp }
}

async fn add_node(client: &Client, name: &str, gpus: u32) {
    FakeNode::new(name)
        .cpu("32")
        .memory("256Gi")
        .gpu(gpus)
        .create(client)
        .await
        .expect("create fake node");
}

/// A GPU RayService: CPU head, one worker group of `replicas` × `gpus` GPUs, one Serve app.
fn ray_service(name: &str, image: &str, replicas: i64, gpus: u32) -> Value {
    GpuRayService::new(name, image)
        .replicas(replicas)
        .gpus(gpus)
        .serve_deployment("LLM")
        .build()
}

fn plan(name: &str, service: &str, extra: Value) -> Value {
    let mut spec = json!({"rayServiceRef": {"name": service}, "stallAfter": "10m"});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan", "metadata": {"name": name}, "spec": spec})
}

async fn create(api: &Api<DynamicObject>, v: Value) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(v)?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

async fn get(api: &Api<DynamicObject>, name: &str) -> Result<Value> {
    Ok(serde_json::to_value(api.get(name).await?)?)
}

/// Change the worker image (and optionally replicas) the way `kubectl patch` would.
async fn bump_worker(e: &Env, svc: &str, image: &str, replicas: Option<i64>) -> Result<()> {
    let current = get(&rs_api(&e.client, &e.ns), svc).await?;
    let mut groups = current["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
    groups[0]["template"]["spec"]["containers"][0]["image"] = json!(image);
    if let Some(r) = replicas {
        groups[0]["replicas"] = json!(r);
    }
    let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
    rs_api(&e.client, &e.ns)
        .patch(svc, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn phase(p: &Value) -> &str {
    str_at(p, &["status", "phase"])
}

fn describe(p: &Value) -> String {
    format!(
        "phase={} waitingFor={:?} message={:?}",
        phase(p),
        str_at(p, &["status", "waitingFor"]),
        str_at(p, &["status", "message"])
    )
}

async fn wait_phase(e: &Env, plan: &str, want: &str) -> Result<Value> {
    let api = plan_api(&e.client, &e.ns);
    wait_for(
        &format!("UpgradePlan {plan} in phase {want}"),
        T,
        || async {
            let p = get(&api, plan).await?;
            Ok(if phase(&p) == want {
                Check::Done(p)
            } else {
                Check::NotYet(describe(&p))
            })
        },
    )
    .await
}

async fn gate(e: &Env, svc: &str) -> Result<String> {
    let rs = get(&rs_api(&e.client, &e.ns), svc).await?;
    Ok(str_at(&rs, &["spec", "upgradeStrategy", "type"]).to_string())
}

async fn cluster_names(e: &Env) -> Result<BTreeSet<String>> {
    let l = rc_api(&e.client, &e.ns)
        .list(&ListParams::default())
        .await?;
    Ok(l.items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect())
}

/// Waits until `plan` is Completed with a transition other than `after`'s;
/// the fingerprint of the change it completed.
async fn wait_completed_after(e: &Env, plan: &str, after: &str) -> Result<String> {
    let api = plan_api(&e.client, &e.ns);
    wait_for(
        &format!("UpgradePlan {plan} Completed after change {after}"),
        T,
        || async {
            let p = get(&api, plan).await?;
            let fp = str_at(&p, &["status", "lastTransition", "fingerprint"]);
            Ok(if phase(&p) == "Completed" && fp != after {
                Check::Done(fp.to_string())
            } else {
                Check::NotYet(format!("{} lastTransition {fp}", describe(&p)))
            })
        },
    )
    .await
}

/// The `events.k8s.io/v1` Events about UpgradePlan `name` with `reason`:
/// (action, note, series count).
async fn plan_events(e: &Env, name: &str, reason: &str) -> Result<Vec<(String, String, i32)>> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(e.client.clone(), &e.ns);
    let fields = format!("regarding.kind=UpgradePlan,regarding.name={name},reason={reason}");
    let l = api.list(&ListParams::default().fields(&fields)).await?;
    Ok(l.items
        .into_iter()
        .map(|ev| {
            (
                ev.action.unwrap_or_default(),
                ev.note.unwrap_or_default(),
                ev.series.map_or(1, |s| s.count),
            )
        })
        .collect())
}

/// `kubectl-raygate ARGS` against the test's cluster: (exit code, stdout, stderr).
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

async fn set_policy(e: &Env, plan: &str, policy: &str) -> Result<()> {
    let patch = json!({"spec": {"policy": policy}});
    plan_api(&e.client, &e.ns)
        .patch(plan, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Events regarding UpgradePlan `name` with `reason`, as `kubectl describe
/// upgradeplan` lists them (core/v1 `involvedObject`).
async fn events_for(e: &Env, name: &str, reason: &str) -> Result<usize> {
    events_regarding(e, "UpgradePlan", name, reason).await
}

/// Events regarding the object `kind`/`name` with `reason`, as `kubectl
/// describe` lists them (core/v1 `involvedObject`).
async fn events_regarding(e: &Env, kind: &str, name: &str, reason: &str) -> Result<usize> {
    let api: Api<Event> = Api::namespaced(e.client.clone(), &e.ns);
    let l = api.list(&ListParams::default()).await?;
    Ok(l.items
        .iter()
        .filter(|ev| {
            ev.involved_object.kind.as_deref() == Some(kind)
                && ev.involved_object.name.as_deref() == Some(name)
                && ev.reason.as_deref() == Some(reason)
        })
        .count())
}

/// A service with its plan, serving and Idle behind a closed gate.
async fn service_with_plan(
    e: &Env,
    svc: &str,
    replicas: i64,
    gpus: u32,
    plan_extra: Value,
) -> Result<()> {
    create(&plan_api(&e.client, &e.ns), plan(svc, svc, plan_extra)).await?;
    create(
        &rs_api(&e.client, &e.ns),
        ray_service(svc, "rayproject/ray:2.9.0-gpu", replicas, gpus),
    )
    .await?;
    wait_phase(e, svc, "Idle").await?;
    let g = gate(e, svc).await?;
    if g != "None" {
        bail!("gate should be closed once the plan is Idle, found {g:?}");
    }
    Ok(())
}

fn or_panic<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}"))
}

/// Also the release detection: raygate starts with the chart's old default
/// `--kuberay-version=1.7` on an older operator (v1.6.2, v1.5.2). Judged by
/// v1.7.0's rules, the v1.6.2-stamped cluster looked due for KubeRay's in-place
/// version rewrite, so the image change was "no new cluster" and was never
/// applied; the stamp on the RayCluster must win and the flag be reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_that_fits_is_admitted_and_completes() {
    let e = env_with(&[8, 8], &["--kuberay-version=1.7"]).await;
    let operator =
        e.cp.kuberay_version()
            .expect("a KubeRay operator")
            .to_string();
    assert_ne!(
        operator, "v1.7.0",
        "the flag must disagree with the operator"
    );
    // Issue 35: v1.36's apiserver serves streaming lists (WatchList), and raygate's
    // caches use them (probed once at start-up; the fallback is the next test's).
    or_panic(initial_lists_logged(&e, "streaming").await);
    or_panic(service_with_plan(&e, "llm", 1, 6, json!({})).await);
    let before = or_panic(cluster_names(&e).await);
    assert_eq!(before.len(), 1);

    or_panic(bump_worker(&e, "llm", "rayproject/ray:2.10.0-gpu", None).await);
    let done = or_panic(wait_phase(&e, "llm", "Completed").await);
    let t = &done["status"]["lastTransition"];
    assert_eq!(str_at(t, &["outcome"]), "Completed");
    assert!(
        t["durationSeconds"].as_i64().is_some(),
        "duration recorded: {t}"
    );
    assert!(!str_at(t, &["fingerprint"]).is_empty());

    let after = or_panic(cluster_names(&e).await);
    assert_eq!(after.len(), 1, "old cluster deleted: {after:?}");
    assert!(
        after.is_disjoint(&before),
        "a new cluster replaced the old one"
    );
    assert_eq!(
        str_at(&done, &["status", "activeCluster"]),
        after.iter().next().unwrap().as_str()
    );
    assert_eq!(
        or_panic(gate(&e, "llm").await),
        "None",
        "gate closed again after the transition"
    );
    assert_eq!(
        or_panic(events_for(&e, "llm", "Admitted").await),
        1,
        "one Admitted event, on the plan (its RayService related)"
    );
    assert!(or_panic(events_for(&e, "llm", "Completed").await) >= 1);
    // And on the RayService, for `kubectl describe rayservice` (issue 32, item 5).
    assert_eq!(
        or_panic(events_regarding(&e, "RayService", "llm", "Admitted").await),
        1,
        "one Admitted event on the RayService (its plan related)"
    );
    assert!(or_panic(events_regarding(&e, "RayService", "llm", "Completed").await) >= 1);

    // The release applied is the one the operator stamped, and the flag is reported.
    let release = &done["status"]["kubeRayRelease"];
    assert_eq!(str_at(release, &["version"]), operator, "{release}");
    assert_eq!(str_at(release, &["source"]), "RayCluster", "{release}");
    let cond = arr_at(&done, &["status", "conditions"])
        .iter()
        .find(|c| str_at(c, &["type"]) == "KubeRayRelease")
        .cloned()
        .unwrap_or_default();
    assert_eq!(str_at(&cond, &["status"]), "False", "{cond}");
    assert_eq!(str_at(&cond, &["reason"]), "FlagMismatch", "{cond}");
    assert!(
        str_at(&cond, &["message"]).contains(&format!("stamped {operator}")),
        "{cond}"
    );
    assert!(or_panic(events_for(&e, "llm", "KubeRayReleaseMismatch").await) >= 1);
    let metrics = e.rg.metrics().expect("metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("raygate_kuberay_release_mismatch{")
                && l.contains("upgradeplan=\"llm\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );

    more_upgrades_each_have_their_own_events(&e, str_at(t, &["fingerprint"])).await;
}

/// One Admitted, one Upgrading and one Completed Event per change, each
/// naming it (in its note and action), none folded into a series.
async fn own_events(e: &Env, changes: &[String]) {
    let distinct: BTreeSet<&String> = changes.iter().collect();
    assert_eq!(distinct.len(), changes.len(), "{changes:?}");
    for reason in ["Admitted", "Upgrading", "Completed"] {
        let evs = or_panic(plan_events(e, "llm", reason).await);
        assert_eq!(evs.len(), changes.len(), "{reason}: {evs:?}");
        for fp in changes {
            let ev = evs
                .iter()
                .filter(|(_, note, _)| note.contains(fp.as_str()))
                .count();
            assert_eq!(ev, 1, "one {reason} Event names change {fp}: {evs:?}");
        }
        assert!(
            evs.iter().all(|(action, _, count)| *count == 1
                && changes.iter().any(|fp| action.contains(fp.as_str()))),
            "{reason}: {evs:?}"
        );
    }
}

/// Issue 25: after the first upgrade, two more in a row and one under
/// `policy: Manual`, then a paused one. Each change has its own Admitted,
/// Upgrading and Completed Events naming it (kube's Recorder folded them
/// into one series keeping the first note); while a change waits for
/// approval the status, the columns and `approve` show what it needs.
async fn more_upgrades_each_have_their_own_events(e: &Env, first: &str) {
    let mut changes = vec![first.to_string()];
    for image in ["rayproject/ray:2.11.0-gpu", "rayproject/ray:2.12.0-gpu"] {
        or_panic(bump_worker(e, "llm", image, None).await);
        let last = changes.last().cloned().unwrap_or_default();
        changes.push(or_panic(wait_completed_after(e, "llm", &last).await));
    }

    own_events(e, &changes).await;

    // Manual: the change waits, fitted, with what it needs in status and columns.
    or_panic(set_policy(e, "llm", "Manual").await);
    or_panic(bump_worker(e, "llm", "rayproject/ray:2.13.0-gpu", None).await);
    let p = or_panic(wait_phase(e, "llm", "WaitingForApproval").await);
    let pending = str_at(&p, &["status", "pendingChange", "fingerprint"]).to_string();
    let cap = &p["status"]["capacity"];
    assert_eq!(str_at(cap, &["gpusNeeded"]), "6", "{}", p["status"]);
    assert_eq!(str_at(cap, &["gpusShort"]), "0", "{}", p["status"]);
    let fits = arr_at(&p, &["status", "conditions"])
        .iter()
        .find(|c| str_at(c, &["type"]) == "CapacityAvailable")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (str_at(&fits, &["status"]), str_at(&fits, &["reason"])),
        ("True", "Fits"),
        "{fits}"
    );
    let out =
        e.cp.kubectl(&["get", "uplan", "-n", &e.ns])
            .expect("kubectl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let row: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("llm "))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row.get(2..4),
        Some(&["WaitingForApproval", "6"][..]),
        "{text}"
    );
    let (code, queue, err) = plugin(e, &["queue", "-n", &e.ns]);
    assert_eq!(code, 0, "{err}");
    let row: Vec<&str> = queue
        .lines()
        .find(|l| l.contains("WaitingForApproval"))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row.get(1..3),
        Some(&["llm", "WaitingForApproval"][..]),
        "{queue}"
    );
    assert_eq!(row.get(5), Some(&"6"), "GPUS NEEDED: {queue}");
    let (code, out, err) = plugin(e, &["approve", "llm", "-n", &e.ns]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("change {pending}"))
            && out.contains("Needs:")
            && out.contains("nvidia.com/gpu 6"),
        "{out}"
    );
    changes.push(or_panic(
        wait_completed_after(e, "llm", changes.last().unwrap()).await,
    ));
    assert_eq!(changes.last(), Some(&pending));

    // Paused has its own phase.
    or_panic(set_policy(e, "llm", "Paused").await);
    or_panic(bump_worker(e, "llm", "rayproject/ray:2.14.0-gpu", None).await);
    let p = or_panic(wait_phase(e, "llm", "Paused").await);
    let paused = str_at(&p, &["status", "pendingChange", "fingerprint"]).to_string();
    assert_eq!(str_at(&p, &["status", "waitingFor"]), "policy Paused");
    assert_eq!(str_at(&p, &["status", "capacity", "gpusNeeded"]), "6");

    // Every change its own Events, on the real apiserver.
    own_events(e, &changes).await;
    for (reason, fp, also) in [
        ("WaitingForApproval", &pending, "nvidia.com/gpu 6"),
        ("Approved", &pending, "kubectl-raygate"),
        ("Paused", &paused, "nvidia.com/gpu 6"),
    ] {
        // An Event is published after the status and gate writes: the phase
        // can be seen before it.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let evs = or_panic(plan_events(e, "llm", reason).await);
            let ok = evs.len() == 1 && evs[0].1.contains(fp.as_str()) && evs[0].1.contains(also);
            if ok {
                break;
            }
            assert!(
                evs.len() <= 1 && std::time::Instant::now() < deadline,
                "{reason}: {evs:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// raygate's start-up line saying how its caches list (logged once the
/// probe answered, which may be after /readyz first answers), checked to say `mode`.
async fn initial_lists_logged(e: &Env, mode: &str) -> Result<String> {
    let line = wait_for(
        "raygate's initial-lists line",
        Duration::from_secs(30),
        || async {
            Ok(
                match e.rg.logs().lines().find(|l| l.contains("initial lists")) {
                    Some(l) => Check::Done(l.to_string()),
                    None => Check::NotYet("not logged yet".into()),
                },
            )
        },
    )
    .await?;
    anyhow::ensure!(line.contains(mode), "expected {mode}: {line}");
    Ok(line)
}

/// Issue 35: on an apiserver that refuses streaming lists (its WatchList feature
/// gate off, as on some managed control planes) raygate's start-up probe falls
/// back to paginated lists, its caches sync, and it gates as before: the upgrade
/// completes on what the paged caches hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_streaming_lists_the_caches_page_and_an_upgrade_still_completes() {
    let opts = Options::from_env().unwrap_or_else(|e| panic!("{e:#}"));
    let cp = ControlPlane::start_with_apiserver_args(opts, &["--feature-gates=WatchList=false"])
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    let e = env_on(cp, &[8, 8], &[]).await;
    let line = or_panic(initial_lists_logged(&e, "paginated").await);
    assert!(line.contains("refused"), "{line}");
    or_panic(service_with_plan(&e, "llm", 1, 6, json!({})).await);
    or_panic(bump_worker(&e, "llm", "rayproject/ray:2.10.0-gpu", None).await);
    let done = or_panic(wait_phase(&e, "llm", "Completed").await);
    assert_eq!(
        str_at(&done, &["status", "lastTransition", "outcome"]),
        "Completed"
    );
    assert_eq!(or_panic(gate(&e, "llm").await), "None");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_that_does_not_fit_waits_until_a_node_is_added() {
    let e = env(&[8]).await;
    or_panic(service_with_plan(&e, "llm", 1, 6, json!({})).await);
    or_panic(bump_worker(&e, "llm", "rayproject/ray:2.10.0-gpu", None).await);
    let p = or_panic(wait_phase(&e, "llm", "WaitingForCapacity").await);
    let cap = &p["status"]["capacity"];
    assert_eq!(
        str_at(cap, &["shortfall", "nvidia.com/gpu"]),
        "4",
        "6 needed, 2 free: {cap}"
    );
    // The columns compare: the new cluster's 6 against 2 free for it; the
    // transition's peak (old + new) is kept beside them.
    assert_eq!(str_at(cap, &["gpusNeeded"]), "6");
    assert_eq!(str_at(cap, &["gpusFree"]), "2");
    assert_eq!(str_at(cap, &["gpusShort"]), "4");
    assert_eq!(str_at(cap, &["gpusPeak"]), "12");
    assert_eq!(
        str_at(&p, &["status", "waitingFor"]),
        "capacity: nvidia.com/gpu 4"
    );
    let cond = arr_at(&p, &["status", "conditions"])
        .iter()
        .find(|c| str_at(c, &["type"]) == "CapacityAvailable")
        .cloned()
        .unwrap_or_default();
    assert_eq!(str_at(&cond, &["status"]), "False");

    // Held: no second cluster, gate closed, and it stays so.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(or_panic(cluster_names(&e).await).len(), 1);
    assert_eq!(or_panic(gate(&e, "llm").await), "None");

    // What an operator sees with the real kubectl.
    let out =
        e.cp.kubectl(&["get", "upgradeplans", "-n", &e.ns])
            .expect("kubectl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let header: Vec<&str> = text
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "RAYSERVICE",
            "PHASE",
            "GPUS",
            "NEEDED",
            "GPUS",
            "FREE",
            "GPUS",
            "SHORT",
            "WAITING",
            "FOR",
            // spec.batching's release time (issue 33), empty for a plan that does not batch.
            "BATCH",
            "RELEASE",
            "AGE"
        ],
        "{text}"
    );
    assert!(
        text.contains("WaitingForCapacity") && text.contains("capacity: nvidia.com/gpu 4"),
        "{text}"
    );
    let wide =
        e.cp.kubectl(&["get", "uplan", "-n", &e.ns, "-o", "wide"])
            .expect("kubectl");
    let wide = String::from_utf8_lossy(&wide.stdout).to_string();
    assert!(
        wide.contains("CPU NEEDED") && wide.contains("MEMORY FREE"),
        "{wide}"
    );
    // Started as the chart starts it (no --kuberay-version): the release is the
    // operator's own stamp, shown in the wide columns.
    let operator = e.cp.kuberay_version().expect("a KubeRay operator");
    assert!(
        wide.contains("KUBERAY") && wide.contains(operator),
        "{wide}"
    );
    let release = arr_at(&p, &["status", "conditions"])
        .iter()
        .find(|c| str_at(c, &["type"]) == "KubeRayRelease")
        .cloned()
        .unwrap_or_default();
    assert_eq!(str_at(&release, &["status"]), "True", "{release}");
    assert_eq!(str_at(&release, &["reason"]), "Stamped", "{release}");

    let metrics = e.rg.metrics().expect("scrape /metrics");
    let phase_line = format!(
        "raygate_upgradeplan_phase{{namespace=\"{}\",phase=\"WaitingForCapacity\",rayservice=\"llm\",upgradeplan=\"llm\"}} 1",
        e.ns
    );
    assert!(
        metrics.contains(&phase_line),
        "missing {phase_line} in\n{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "raygate_capacity_shortfall{{namespace=\"{}\",resource=\"nvidia.com/gpu\",upgradeplan=\"llm\"}} 4",
            e.ns
        )),
        "{metrics}"
    );

    // Capacity arrives: the upgrade proceeds without anything else being done.
    add_node(&e.client, "gpu-new", 8).await;
    or_panic(wait_phase(&e, "llm", "Completed").await);
    assert_eq!(or_panic(cluster_names(&e).await).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_upgrades_that_fit_alone_but_not_together_go_one_after_the_other() {
    // 14 GPUs; two services with 4 each leave 6 free: room for one new 4-GPU worker, not two.
    let e = env(&[8, 6]).await;
    or_panic(service_with_plan(&e, "alpha", 1, 4, json!({})).await);
    or_panic(service_with_plan(&e, "beta", 1, 4, json!({})).await);
    or_panic(bump_worker(&e, "alpha", "rayproject/ray:2.10.0-gpu", None).await);
    or_panic(bump_worker(&e, "beta", "rayproject/ray:2.10.0-gpu", None).await);

    let api = plan_api(&e.client, &e.ns);
    let in_flight = ["Admitted", "Upgrading", "Stalled"];
    // (most plans in flight at once, order of admission)
    let seen = std::sync::Arc::new(std::sync::Mutex::new((0usize, Vec::<String>::new())));
    let r = wait_for("both upgrades completed", Duration::from_secs(180), || {
        let (api, seen) = (api.clone(), seen.clone());
        async move {
            let a = get(&api, "alpha").await?;
            let b = get(&api, "beta").await?;
            let flying: Vec<&str> = [("alpha", &a), ("beta", &b)]
                .into_iter()
                .filter(|(_, p)| in_flight.contains(&phase(p)))
                .map(|(n, _)| n)
                .collect();
            if let Ok(mut s) = seen.lock() {
                s.0 = s.0.max(flying.len());
                for n in flying {
                    if !s.1.iter().any(|x| x == n) {
                        s.1.push(n.to_string());
                    }
                }
            }
            Ok(if phase(&a) == "Completed" && phase(&b) == "Completed" {
                Check::Done(())
            } else {
                Check::NotYet(format!("alpha {} / beta {}", describe(&a), describe(&b)))
            })
        }
    })
    .await;
    or_panic(r);
    let (max_together, order) = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(max_together, 1, "never two admitted at once");
    assert_eq!(
        order.len(),
        2,
        "both were admitted, one after the other: {order:?}"
    );
    assert_eq!(or_panic(cluster_names(&e).await).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_and_serve_config_changes_are_never_held() {
    // Tight on purpose: a new cluster would not fit, so any hold would show.
    let e = env(&[8]).await;
    or_panic(service_with_plan(&e, "llm", 1, 6, json!({})).await);
    let before = or_panic(cluster_names(&e).await);

    let rs = rs_api(&e.client, &e.ns);
    let mut groups =
        or_panic(get(&rs, "llm").await)["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
    groups[0]["replicas"] = json!(2);
    groups[0]["minReplicas"] = json!(1);
    let serve = "applications:\n  - name: llm\n    import_path: serve_llm:app\n    route_prefix: /\n    deployments:\n      - name: LLM\n        num_replicas: 2\n";
    let patch =
        json!({"spec": {"serveConfigV2": serve, "rayClusterConfig": {"workerGroupSpecs": groups}}});
    rs.patch("llm", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");

    let api = plan_api(&e.client, &e.ns);
    for _ in 0..20 {
        let p = or_panic(get(&api, "llm").await);
        assert_eq!(phase(&p), "Idle", "{}", describe(&p));
        assert!(
            p["status"]["pendingChange"].is_null(),
            "no pending change: {}",
            p["status"]
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(or_panic(cluster_names(&e).await), before, "no new cluster");
    let p = or_panic(get(&api, "llm").await);
    assert!(
        str_at(&p, &["status", "message"]).contains("NoChange")
            || str_at(&p, &["status", "message"]).contains("ServeConfigUpdate"),
        "{}",
        describe(&p)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_raygate_mid_transition_changes_nothing() {
    let mut e = env(&[8, 8]).await;
    or_panic(service_with_plan(&e, "llm", 1, 6, json!({})).await);
    or_panic(bump_worker(&e, "llm", "rayproject/ray:2.10.0-gpu", None).await);
    // Mid-transition: Admitted lasts only until KubeRay names the new
    // cluster (often under a second), Upgrading until the old one is gone.
    let api = plan_api(&e.client, &e.ns);
    let admitted = or_panic(
        wait_for(
            "UpgradePlan llm admitted (Admitted or Upgrading)",
            T,
            || async {
                let p = get(&api, "llm").await?;
                Ok(if matches!(phase(&p), "Admitted" | "Upgrading") {
                    Check::Done(p)
                } else {
                    Check::NotYet(describe(&p))
                })
            },
        )
        .await,
    );
    let fingerprint = str_at(&admitted, &["status", "admitted", "fingerprint"]).to_string();
    e.rg.kill();
    // KubeRay goes on while raygate is down.
    tokio::time::sleep(Duration::from_secs(3)).await;
    e.rg = Raygate::spawn(&e.cp, &[]).unwrap_or_else(|err| panic!("{err:#}"));
    let done = or_panic(wait_phase(&e, "llm", "Completed").await);
    assert_eq!(
        str_at(&done, &["status", "lastTransition", "fingerprint"]),
        fingerprint
    );
    // The kill may land between the status write and the Events, so fewer
    // may exist; a second admission would add more.
    let admitted_events = or_panic(events_for(&e, "llm", "Admitted").await);
    assert!(
        admitted_events <= 1,
        "admitted at most once (one event on the plan), saw {admitted_events}"
    );
    assert_eq!(or_panic(cluster_names(&e).await).len(), 1);
    assert_eq!(or_panic(gate(&e, "llm").await), "None");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_give_a_clear_status_not_a_crash() {
    let mut e = env_audited(&[8]).await;
    let api = plan_api(&e.client, &e.ns);

    // A plan whose RayService does not exist, with a bad schedule too: both
    // are reported, and raygate never writes (so never creates) the
    // RayService: a server-side apply of a missing object is a create.
    // A minute out of range is refused at apply by the CRD's rule (issue 32, item 9);
    // a reversed range passes the rule and raygate reports it.
    let refused = json!({"maintenanceWindows": [{"schedule": "61 * * * *", "duration": "1h"}]});
    let err = create(&api, plan("orphan", "missing", refused))
        .await
        .expect_err("the apiserver refuses minute 61");
    assert!(format!("{err:#}").contains("minute 0-59"), "{err:#}");
    let bad_window =
        json!({"maintenanceWindows": [{"schedule": "30-10 * * * *", "duration": "1h"}]});
    or_panic(create(&api, plan("orphan", "missing", bad_window)).await);
    let p = or_panic(wait_phase(&e, "orphan", "Error").await);
    let msg = str_at(&p, &["status", "message"]);
    assert!(
        msg.contains("RayServiceUnavailable: RayService")
            && msg.contains("not found")
            && msg.contains("InvalidSpec: spec.maintenanceWindows[0]"),
        "{}",
        describe(&p)
    );
    assert_eq!(
        str_at(&p, &["status", "waitingFor"]),
        "InvalidSpec, RayServiceUnavailable"
    );
    // The reconcile that wrote this status goes straight on to the gate.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let audit = raygate_e2e::faults::audit_events(&e.cp.audit_log_path().expect("audit log"))
        .expect("read the audit log");
    let writes: Vec<String> = audit
        .iter()
        .filter(|a| a.resource == "rayservices" && a.name == "missing")
        .map(ToString::to_string)
        .collect();
    assert!(
        writes.is_empty(),
        "writes to the missing RayService: {writes:?}"
    );
    assert!(
        or_panic(
            rs_api(&e.client, &e.ns)
                .get_opt("missing")
                .await
                .map_err(Into::into)
        )
        .is_none(),
        "no RayService created"
    );
    let logs = e.rg.logs();
    assert!(
        !logs
            .lines()
            .any(|l| l.contains("reconcile failed") && l.contains("orphan")),
        "a missing RayService is a status, not a failing reconcile:\n{logs}"
    );

    // What the gate relies on, on the real apiserver: an apply carrying a
    // uid is refused when no object exists (409, not a create) and when the
    // object has another uid (deleted and created again).
    let ghost = json!({"apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": "ghost", "uid": "6f1c0f5e-0000-4000-8000-000000000000"},
        "spec": {"upgradeStrategy": {"type": "None"}}});
    match rs_api(&e.client, &e.ns)
        .patch(
            "ghost",
            &PatchParams::apply("e2e-gate"),
            &Patch::Apply(&ghost),
        )
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 409 && s.message.contains("uid mismatch") => {}
        other => panic!("an apply with a uid of a missing object: {other:?}"),
    }

    // A RayService KubeRay gives no cluster: the real operator refuses a head
    // Service name set in a RayService (ValidateRayServiceSpec, v1.5 and v1.6).
    let ns2 = create_namespace(&e.client, "rg-early").await.expect("ns");
    let api2 = plan_api(&e.client, &ns2);
    or_panic(create(&api2, plan("early", "early", json!({}))).await);
    let mut early = ray_service("early", "img", 1, 1);
    early["spec"]["rayClusterConfig"]["headGroupSpec"]["headService"] =
        json!({"metadata": {"name": "early-head"}});
    or_panic(create(&rs_api(&e.client, &ns2), early).await);
    let p = or_panic(
        wait_for("plan Pending for the first cluster", T, || async {
            let p = get(&api2, "early").await?;
            Ok(if phase(&p) == "Pending" {
                Check::Done(p)
            } else {
                Check::NotYet(describe(&p))
            })
        })
        .await,
    );
    assert_eq!(str_at(&p, &["status", "waitingFor"]), "first cluster");

    // A quantity the CRD pattern accepts but Kubernetes cannot parse.
    or_panic(service_with_plan(&e, "llm", 1, 2, json!({})).await);
    let rs = rs_api(&e.client, &e.ns);
    let mut groups =
        or_panic(get(&rs, "llm").await)["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
    groups[0]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] =
        json!("1e1.5");
    let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
    rs.patch("llm", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");
    let p = or_panic(wait_phase(&e, "llm", "Error").await);
    let msg = str_at(&p, &["status", "message"]);
    assert!(
        msg.contains("1e1.5") && msg.contains("memory"),
        "message names the field and value: {msg}"
    );
    let mut replaced = ghost.clone();
    replaced["metadata"]["name"] = json!("llm");
    match rs
        .patch(
            "llm",
            &PatchParams::apply("e2e-gate"),
            &Patch::Apply(&replaced),
        )
        .await
    {
        Err(kube::Error::Api(s))
            if s.code == 422
                && s.message.contains("metadata.uid")
                && s.message.contains("field is immutable") => {}
        other => panic!("an apply with another object's uid: {other:?}"),
    }
    assert_eq!(
        or_panic(gate(&e, "llm").await),
        "None",
        "a broken input never opens the gate"
    );

    // raygate is still alive and serving.
    assert!(e.rg.is_running(), "raygate crashed:\n{}", e.rg.logs());
    assert_eq!(e.rg.get("/healthz").expect("healthz").0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someone_else_flipping_the_gate_is_reported_not_fought() {
    let e = env(&[8, 8]).await;
    or_panic(service_with_plan(&e, "llm", 1, 2, json!({})).await);
    let patch = json!({"spec": {"upgradeStrategy": {"type": "NewCluster"}}});
    rs_api(&e.client, &e.ns)
        .patch(
            "llm",
            &PatchParams {
                field_manager: Some("argocd-controller".into()),
                ..Default::default()
            },
            &Patch::Merge(&patch),
        )
        .await
        .expect("patch");
    let api = plan_api(&e.client, &e.ns);
    let p = or_panic(
        wait_for("GateOverridden condition", T, || async {
            let p = get(&api, "llm").await?;
            let c = arr_at(&p, &["status", "conditions"])
                .iter()
                .find(|c| {
                    str_at(c, &["type"]) == "GateOverridden" && str_at(c, &["status"]) == "True"
                })
                .cloned();
            Ok(match c {
                Some(c) => Check::Done(c),
                None => Check::NotYet(describe(&p)),
            })
        })
        .await,
    );
    assert!(
        str_at(&p, &["message"]).contains("argocd-controller"),
        "{p}"
    );
    // raygate does not take the field back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(or_panic(gate(&e, "llm").await), "NewCluster");
    // `kubectl get upgradeplans` shows it (WAITING FOR), with the manager.
    let out =
        e.cp.kubectl(&["get", "upgradeplans", "llm", "-n", &e.ns])
            .expect("kubectl get upgradeplans");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("GateOverridden: argocd-controller keeps NewCluster"),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(or_panic(events_for(&e, "llm", "GateOverridden").await) >= 1);
    let metrics = e.rg.metrics().expect("metrics");
    assert!(
        metrics.contains(&format!(
            "raygate_gate_overridden{{namespace=\"{}\",rayservice=\"llm\",upgradeplan=\"llm\"}} 1",
            e.ns
        )),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_leader_and_fail_over() {
    let args = [
        "--leader-elect",
        "true",
        "--lease-namespace",
        "default",
        "--lease-duration-seconds",
        "4",
        "--lease-grace-seconds",
        "2",
    ];
    let mut e = env_with(&[8, 8], &args).await;
    let mut second = Raygate::spawn(&e.cp, &args).unwrap_or_else(|err| panic!("{err:#}"));
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(e.client.clone(), "default");
    let holder = || async {
        let l = leases.get("raygate-leader").await?;
        Ok::<_, anyhow::Error>(l.spec.and_then(|s| s.holder_identity).unwrap_or_default())
    };
    let first_leader = or_panic(
        wait_for("a lease holder", T, || async {
            let h = holder().await?;
            Ok(if h.is_empty() {
                Check::NotYet("no holder".into())
            } else {
                Check::Done(h)
            })
        })
        .await,
    );
    // The standby reports ready too (so rolling updates proceed), but only the leader acts.
    or_panic(service_with_plan(&e, "llm", 1, 2, json!({})).await);
    let acting = [&e.rg, &second]
        .iter()
        .filter(|r| r.logs().contains("status updated"))
        .count();
    assert_eq!(acting, 1, "exactly one replica writes status");

    // Kill whichever leads; the other takes over and keeps gating.
    if e.rg.logs().contains("status updated") {
        e.rg.kill();
    } else {
        second.kill();
    }
    or_panic(
        wait_for("a new lease holder", T, || async {
            let h = holder().await?;
            Ok(if !h.is_empty() && h != first_leader {
                Check::Done(())
            } else {
                Check::NotYet(h)
            })
        })
        .await,
    );
    or_panic(bump_worker(&e, "llm", "rayproject/ray:2.10.0-gpu", None).await);
    or_panic(wait_phase(&e, "llm", "Completed").await);
}

/// Status is written by server-side apply; a status an older raygate wrote with merge
/// patches (operation `Update`) is taken over, so a field it left behind is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_is_server_side_applied_and_a_merge_patched_one_is_taken_over() {
    let e = env(&[8]).await;
    or_panic(service_with_plan(&e, "llm", 1, 4, json!({})).await);
    let api = plan_api(&e.client, &e.ns);
    // What raygate 0.1 did: a merge patch of status under its field manager.
    let old_style = json!({"status": {"pendingCluster": "stale-from-0.1"}});
    let params = PatchParams {
        field_manager: Some("raygate".into()),
        ..Default::default()
    };
    or_panic(
        api.patch_status("llm", &params, &Patch::Merge(&old_style))
            .await
            .map_err(Into::into),
    );
    let owners = |p: &DynamicObject| -> Vec<String> {
        p.metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| m.manager.as_deref() == Some("raygate"))
            .map(|m| {
                format!(
                    "{}/{}",
                    m.operation.as_deref().unwrap_or(""),
                    m.subresource.as_deref().unwrap_or("")
                )
            })
            .collect()
    };
    let taken_over = wait_for(
        "the stale status field removed by raygate's apply",
        T,
        || async {
            let p = api.get("llm").await?;
            let v = serde_json::to_value(&p)?;
            let o = owners(&p);
            Ok(
                if v["status"].get("pendingCluster").is_none()
                    && !o.iter().any(|m| m == "Update/status")
                {
                    Check::Done(o)
                } else {
                    Check::NotYet(format!(
                        "pendingCluster={} owners={o:?}",
                        v["status"]["pendingCluster"]
                    ))
                },
            )
        },
    )
    .await;
    let o = or_panic(taken_over);
    assert!(
        o.iter().any(|m| m == "Apply/status"),
        "raygate applies status: {o:?}"
    );
    let p = or_panic(get(&api, "llm").await);
    assert_eq!(phase(&p), "Idle", "{}", describe(&p));
    assert_eq!(or_panic(gate(&e, "llm").await), "None");
}

/// raygate reads the status times and the transition outcome as types, so the apiserver must
/// refuse a value raygate could not read (the CRD's `format: date-time` and `enum`): one
/// hand-edited plan would otherwise break the watch of every plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apiserver_refuses_status_values_raygate_could_not_read() {
    let cp = ControlPlane::start_with(raygate_e2e::control_plane::Options::without_kuberay())
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))
        .expect("install the UpgradePlan CRD");
    let client = cp.client().await.expect("client");
    let ns = create_namespace(&client, "crd").await.expect("namespace");
    let api = plan_api(&client, &ns);
    or_panic(create(&api, plan("p", "llm", json!({}))).await);
    let status = |s: Value| Patch::Merge(json!({ "status": s }));
    let valid = json!({
        "pendingChange": {"fingerprint": "f", "detectedTime": "2026-12-03T12:00:00.123456789Z"},
        "lastTransition": {"fingerprint": "f", "start": "2026-12-03T11:00:00Z",
                           "end": "2026-12-03T11:30:00Z", "outcome": "Completed"},
    });
    api.patch_status("p", &PatchParams::default(), &status(valid))
        .await
        .expect("valid times and outcome are accepted");
    for (field, bad) in [
        (
            "detectedTime",
            json!({"pendingChange": {"fingerprint": "f", "detectedTime": "yesterday"}}),
        ),
        (
            "admittedTime",
            json!({"admitted": {"fingerprint": "f", "admittedTime": "12:00"}}),
        ),
        (
            "end",
            json!({"lastTransition": {"fingerprint": "f", "start": "2026-12-03T11:00:00Z", "end": "soon"}}),
        ),
        (
            "outcome",
            json!({"lastTransition": {"fingerprint": "f", "start": "2026-12-03T11:00:00Z", "outcome": "Exploded"}}),
        ),
    ] {
        match api
            .patch_status("p", &PatchParams::default(), &status(bad))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 422 => {
                assert!(e.message.contains(field), "{field}: {}", e.message)
            }
            other => panic!("{field}: expected 422 Invalid, got {other:?}"),
        }
    }
}

/// `kubectl create -f` of a List of `items`.
fn kubectl_create(e: &Env, items: Vec<Value>) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("objects.json");
    std::fs::write(
        &file,
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": items}))?,
    )?;
    e.cp.kubectl_ok(&["create", "-f", &file.to_string_lossy()])?;
    Ok(())
}

/// A node's 8 GPUs published in a ResourceSlice, as a DRA driver's kubelet plugin does.
fn gpu_slice(node: &str) -> Value {
    let devices: Vec<Value> = (0..8)
        .map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"index": {"int": i}}}))
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": node},
        "spec": {"driver": "gpu.example.com", "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices}})
}

/// Dynamic Resource Allocation: the nodes publish their GPUs in ResourceSlices, not in
/// allocatable, and a DeviceClass maps `nvidia.com/gpu` to them (DRAExtendedResource, on by
/// default in v1.36). The running cluster holds 6 of the one node's 8 devices (through the
/// claim the scheduler made for its worker); the upgrade's 6 more are held, with the
/// shortfall in `nvidia.com/gpu`, and no pod is left Unschedulable. A second node alone
/// changes nothing (no devices); once its ResourceSlice appears the upgrade is admitted
/// and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_on_dra_gpus_waits_until_a_node_publishes_its_devices() {
    let e = env(&[]).await;
    add_node(&e.client, "dra-0", 0).await;
    or_panic(kubectl_create(
        &e,
        vec![
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": "gpu"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.example.com\""}}],
                    "extendedResourceName": "nvidia.com/gpu"}}),
            gpu_slice("dra-0"),
        ],
    ));
    or_panic(service_with_plan(&e, "llm", 1, 6, json!({})).await);
    or_panic(bump_worker(&e, "llm", "rayproject/ray:2.10.0-gpu", None).await);
    let p = or_panic(wait_phase(&e, "llm", "WaitingForCapacity").await);
    let cap = &p["status"]["capacity"];
    assert_eq!(
        str_at(cap, &["shortfall", "nvidia.com/gpu"]),
        "4",
        "6 needed, 2 of the DRA node's devices free: {cap}"
    );
    assert_eq!(str_at(cap, &["gpusFree"]), "2", "{cap}");

    // A node without a ResourceSlice has no GPUs: still held.
    add_node(&e.client, "dra-1", 0).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let p = or_panic(get(&plan_api(&e.client, &e.ns), "llm").await);
    assert_eq!(phase(&p), "WaitingForCapacity", "{}", describe(&p));
    assert_eq!(or_panic(cluster_names(&e).await).len(), 1);
    assert_eq!(or_panic(gate(&e, "llm").await), "None");
    let pods: Api<DynamicObject> = Api::namespaced_with(
        e.client.clone(),
        &e.ns,
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods"),
    );
    let listed = or_panic(
        pods.list(&ListParams::default())
            .await
            .map_err(anyhow::Error::from),
    );
    for pod in &listed.items {
        let v = serde_json::to_value(pod).unwrap_or_default();
        let unschedulable = arr_at(&v, &["status", "conditions"]).iter().any(|c| {
            str_at(c, &["type"]) == "PodScheduled" && str_at(c, &["reason"]) == "Unschedulable"
        });
        assert!(!unschedulable, "pod left Unschedulable: {v}");
    }

    // Its devices are published: the upgrade goes ahead.
    or_panic(kubectl_create(&e, vec![gpu_slice("dra-1")]));
    or_panic(wait_phase(&e, "llm", "Completed").await);
}
