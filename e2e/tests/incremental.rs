//! Incremental upgrades end to end on the real KubeRay operator started with
//! `--feature-gates=RayServiceIncrementalUpgrade=true` (`up --incremental`, which also installs
//! the Gateway API CRDs it needs), one control plane for all scenarios. CI runs it on v1.6.2
//! and on v1.5.2 (`e2e/run-suites incremental@v1.5.2`): the gate exists since v1.5.0, alpha
//! and off by default in both (`pkg/features/features.go`).
//!
//! The Gateways and HTTPRoutes KubeRay creates are programmed by the real Traefik (its
//! kubernetesGateway provider, started by `up --incremental` with the GatewayClass
//! [`GATEWAY_CLASS`]), which writes the statuses KubeRay waits for.
//!
//! Stand-in (e2e/README.md): Ray's autoscaler (the test sets each RayCluster's worker replicas
//! from the Serve `target_capacity` KubeRay last PUT to its head, as Ray's autoscaler follows
//! Serve's demand).

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use raygate_e2e::control_plane::{Options, repo_root};
use raygate_e2e::json::str_at;
use raygate_e2e::{
    Check, ControlPlane, FakeNode, GpuRayService, Raygate, create_namespace, wait_for,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const T: Duration = Duration::from_secs(150);
/// The GatewayClass `e2e/control-plane up --incremental` creates for Traefik.
const GATEWAY_CLASS: &str = "traefik";
/// Traefik's `controllerName` (pkg/provider/kubernetes/gateway/kubernetes.go).
const TRAEFIK_CONTROLLER: &str = "traefik.io/gateway-controller";

fn api(
    client: &Client,
    ns: &str,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(client.clone(), ns, &ar)
}
fn plans(c: &Client, ns: &str) -> Api<DynamicObject> {
    api(
        c,
        ns,
        "raygate.io",
        "v1alpha1",
        "UpgradePlan",
        "upgradeplans",
    )
}
fn services(c: &Client, ns: &str) -> Api<DynamicObject> {
    api(c, ns, "ray.io", "v1", "RayService", "rayservices")
}
fn clusters(c: &Client, ns: &str) -> Api<DynamicObject> {
    api(c, ns, "ray.io", "v1", "RayCluster", "rayclusters")
}

async fn create(a: &Api<DynamicObject>, v: Value) -> Result<()> {
    let o: DynamicObject = serde_json::from_value(v)?;
    a.create(&PostParams::default(), &o).await?;
    Ok(())
}
async fn get(a: &Api<DynamicObject>, name: &str) -> Result<Value> {
    Ok(serde_json::to_value(a.get(name).await?)?)
}

/// 2 workers × 2 GPUs, autoscaled in-tree (minReplicas 0, maxReplicas 2), incremental options
/// with `max_surge` percent.
fn service(name: &str, max_surge: i64) -> Value {
    let mut v = GpuRayService::new(name, "rayproject/ray:2.9.0-gpu")
        .replicas(2)
        .gpus(2)
        .serve_deployment("LLM")
        .build();
    v["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] = json!(true);
    v["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = json!(2);
    // No `type`: that field is raygate's (a creator setting it would own it and override the gate).
    v["spec"]["upgradeStrategy"] = json!({"clusterUpgradeOptions": {
        "maxSurgePercent": max_surge, "stepSizePercent": 50, "intervalSeconds": 2, "gatewayClassName": GATEWAY_CLASS}});
    v
}

fn plan(name: &str, upgrade_type: &str) -> Value {
    json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan", "metadata": {"name": name},
           "spec": {"rayServiceRef": {"name": name}, "stallAfter": "10m", "upgradeType": upgrade_type}})
}

async fn wait_phase(c: &Client, ns: &str, name: &str, want: &str) -> Result<Value> {
    let a = plans(c, ns);
    wait_for(
        &format!("UpgradePlan {name} in phase {want}"),
        T,
        || async {
            let p = get(&a, name).await?;
            let ph = str_at(&p, &["status", "phase"]).to_string();
            Ok(if ph == want {
                Check::Done(p)
            } else {
                Check::NotYet(format!(
                    "phase={ph} waitingFor={:?} message={:?}",
                    str_at(&p, &["status", "waitingFor"]),
                    str_at(&p, &["status", "message"])
                ))
            })
        },
    )
    .await
}

async fn bump(c: &Client, ns: &str, svc: &str, image: &str) -> Result<()> {
    let cur = get(&services(c, ns), svc).await?;
    let mut groups = cur["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
    groups[0]["template"]["spec"]["containers"][0]["image"] = json!(image);
    let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
    services(c, ns)
        .patch(svc, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// One pass of the Ray autoscaler stand-in (the gateway controller is the real Traefik).
async fn stand_ins(cp: &ControlPlane, c: &Client, ns: &str) -> Result<()> {
    let pp = PatchParams::default();
    // Ray's autoscaler: workers follow Serve's target_capacity (% of maxReplicas).
    let seen = cp.ray_head_clusters()?;
    let rows = seen
        .as_array()
        .cloned()
        .or_else(|| seen["clusters"].as_array().cloned())
        .unwrap_or_default();
    let rcs = clusters(c, ns);
    for row in rows {
        if str_at(&row, &["namespace"]) != ns {
            continue;
        }
        let Some(tc) = row["lastConfig"]["target_capacity"].as_f64() else {
            continue;
        };
        let name = str_at(&row, &["name"]).to_string();
        let Ok(rc) = get(&rcs, &name).await else {
            continue;
        };
        let mut groups = rc["spec"]["workerGroupSpecs"].clone();
        let max = groups[0]["maxReplicas"].as_i64().unwrap_or(0);
        let want = ((tc / 100.0) * max as f64).ceil() as i64;
        if groups[0]["replicas"].as_i64() != Some(want) {
            eprintln!("autoscaler stand-in: {name} target_capacity {tc} -> {want} workers");
            groups[0]["replicas"] = json!(want);
            rcs.patch(
                &name,
                &pp,
                &Patch::Merge(&json!({"spec": {"workerGroupSpecs": groups}})),
            )
            .await?;
        }
    }
    Ok(())
}

fn condition_true(conds: &Value, t: &str) -> bool {
    conds
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
}

/// The RayService's Gateway is Accepted and Programmed and its HTTPRoute Accepted and
/// ResolvedRefs for that Gateway, written by Traefik (what KubeRay v1.6.2's
/// `utils.IsGatewayReady` / `IsHTTPRouteReady` check before they move traffic). Returns the
/// route's backends (2 while an upgrade runs: the active and the pending Serve Service).
async fn gateway_programmed_by_traefik(c: &Client, ns: &str, svc: &str) -> Result<Value> {
    let gw = get(
        &api(
            c,
            ns,
            "gateway.networking.k8s.io",
            "v1",
            "Gateway",
            "gateways",
        ),
        &format!("{svc}-gateway"),
    )
    .await?;
    let gconds = &gw["status"]["conditions"];
    if !condition_true(gconds, "Accepted") || !condition_true(gconds, "Programmed") {
        bail!(
            "Gateway {svc}-gateway not Accepted+Programmed: {}",
            gw["status"]
        );
    }
    let route = get(
        &api(
            c,
            ns,
            "gateway.networking.k8s.io",
            "v1",
            "HTTPRoute",
            "httproutes",
        ),
        &format!("{svc}-httproute"),
    )
    .await?;
    let parents = route["status"]["parents"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ok = parents.iter().any(|p| {
        p["controllerName"] == TRAEFIK_CONTROLLER
            && p["parentRef"]["name"] == format!("{svc}-gateway").as_str()
            && condition_true(&p["conditions"], "Accepted")
            && condition_true(&p["conditions"], "ResolvedRefs")
    });
    if !ok {
        bail!(
            "HTTPRoute {svc}-httproute not Accepted+ResolvedRefs by {TRAEFIK_CONTROLLER}: {}",
            route["status"]
        );
    }
    Ok(
        json!({"addresses": gw["status"]["addresses"], "backends": route["spec"]["rules"][0]["backendRefs"]}),
    )
}

/// GPUs requested by the namespace's pods: (all, only those bound to a node).
async fn gpus_requested2(c: &Client, ns: &str) -> Result<(u64, u64)> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    let (mut all, mut bound) = (0, 0);
    for p in pods.list(&ListParams::default()).await?.items {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).is_some();
        let g = pod_gpus(&p);
        all += g;
        if node {
            bound += g;
        }
    }
    Ok((all, bound))
}

fn pod_gpus(p: &Pod) -> u64 {
    let Some(spec) = &p.spec else { return 0 };
    spec.containers
        .iter()
        .map(|ct| {
            let r = ct.resources.clone().unwrap_or_default();
            r.limits
                .as_ref()
                .and_then(|l| l.get("nvidia.com/gpu"))
                .or_else(|| r.requests.as_ref().and_then(|l| l.get("nvidia.com/gpu")))
                .and_then(|q| q.0.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

async fn gpus_requested(c: &Client, ns: &str) -> Result<u64> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    let mut n = 0;
    for p in pods.list(&ListParams::default()).await?.items {
        let Some(spec) = p.spec else { continue };
        if p.metadata.deletion_timestamp.is_some()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running")
        {
            continue;
        }
        for ct in spec.containers {
            let r = ct.resources.unwrap_or_default();
            let q = r
                .limits
                .as_ref()
                .and_then(|l| l.get("nvidia.com/gpu"))
                .or_else(|| r.requests.as_ref().and_then(|l| l.get("nvidia.com/gpu")));
            n += q.and_then(|q| q.0.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    Ok(n)
}

/// The GPUs raygate reserved beyond the active cluster (`status.admitted.surge`: per group,
/// the pods the RayService may hold; with `sharesActive` the active cluster's `active_workers`
/// count against it). The head has no GPUs; each worker has `gpus_per_worker`.
fn reserved_gpus(p: &Value, active_workers: u64, gpus_per_worker: u64) -> u64 {
    let s = &p["status"]["admitted"]["surge"];
    eprintln!("status.admitted.surge = {s}");
    let mut n = 0;
    for g in s.as_array().cloned().unwrap_or_default() {
        if str_at(&g, &["group"]) == "head" {
            continue;
        }
        let pods = g["pods"].as_u64().unwrap_or(0);
        let extra = if g["sharesActive"].as_bool() == Some(true) {
            pods.saturating_sub(active_workers)
        } else {
            pods
        };
        n += extra * gpus_per_worker;
    }
    n
}

/// A CPU-only copy of [`service`] whose creator sets `spec.upgradeStrategy.type` itself.
fn creator_typed(name: &str, ty: &str) -> Value {
    let mut v = service(name, 50);
    v["spec"]["upgradeStrategy"]["type"] = json!(ty);
    v["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]
        ["limits"] = json!({});
    v
}

/// Who owns `spec.upgradeStrategy.type` of a RayService (managedFields).
fn type_owners(svc: &Value) -> Vec<String> {
    svc["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["fieldsV1"]["f:spec"]["f:upgradeStrategy"]
                .get("f:type")
                .is_some()
        })
        .map(|m| str_at(m, &["manager"]).to_string())
        .collect()
}

/// The condition `t` of the plan `p` as read (one read for the status and its conditions:
/// two reads could see two different writes).
fn condition_of(p: &Value, t: &str) -> Value {
    p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| str_at(x, &["type"]) == t)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The RayService's creator sets `spec.upgradeStrategy.type` with the real kubectl (`create`
/// owns what it sets as field manager `kubectl-create`, `apply --server-side` as `kubectl`):
/// raygate reports GateOverridden naming that manager from the start, never takes the field,
/// and a change that fits is not admitted (phase Pending, UpgradeAdmitted False, nothing in
/// `status.admitted`, no Admitted Event): it does not claim to gate what it cannot.
async fn a_creator_owned_gate_is_reported_not_claimed(cp: &ControlPlane, c: &Client) -> Result<()> {
    let ns = create_namespace(c, "inc-owned").await?;
    let dir = tempfile::tempdir()?;
    for (name, how, ty) in [
        ("created", "create", "None"),
        ("applied", "apply", "NewClusterWithIncrementalUpgrade"),
    ] {
        create(
            &plans(c, &ns),
            plan(name, "NewClusterWithIncrementalUpgrade"),
        )
        .await?;
        let file = dir.path().join(format!("{name}.json"));
        std::fs::write(&file, serde_json::to_vec(&creator_typed(name, ty))?)?;
        let f = file.to_string_lossy().to_string();
        let args: Vec<&str> = match how {
            "create" => vec!["create", "-n", &ns, "-f", &f],
            _ => vec!["apply", "--server-side", "-n", &ns, "-f", &f],
        };
        cp.kubectl_ok(&args)?;
    }
    for (name, manager, value) in [
        ("created", "kubectl-create", "None"),
        ("applied", "kubectl", "NewClusterWithIncrementalUpgrade"),
    ] {
        let want = format!("GateOverridden: {manager} keeps {value}");
        wait_for(&format!("{name}: {want}"), T, || async {
            let p = get(&plans(c, &ns), name).await?;
            let cond = condition_of(&p, "GateOverridden");
            Ok(
                if str_at(&p, &["status", "waitingFor"]) == want
                    && str_at(&cond, &["status"]) == "True"
                {
                    Check::Done(())
                } else {
                    Check::NotYet(format!("{} {cond}", p["status"]))
                },
            )
        })
        .await?;
        let owners = type_owners(&get(&services(c, &ns), name).await?);
        if owners != [manager] {
            bail!("{name}: spec.upgradeStrategy.type owned by {owners:?}, want only {manager}");
        }
    }
    // A change that fits (no GPUs, 64 CPUs free) under the creator's `None`.
    wait_phase(c, &ns, "created", "Idle").await?;
    bump(c, &ns, "created", "rayproject/ray:2.10.0-gpu").await?;
    let p = wait_for("created: the change seen", T, || async {
        let p = get(&plans(c, &ns), "created").await?;
        let cond = condition_of(&p, "UpgradeAdmitted");
        Ok(if str_at(&cond, &["reason"]) == "GateOverridden" {
            Check::Done(p)
        } else {
            Check::NotYet(format!("{} {cond}", p["status"]))
        })
    })
    .await?;
    let st = &p["status"];
    if str_at(st, &["phase"]) != "Pending"
        || !st["admitted"].is_null()
        || st["pendingChange"].is_null()
    {
        bail!("an overridden gate is claimed: {st}");
    }
    // Still so a few reconciles later, and the field untouched.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let p = get(&plans(c, &ns), "created").await?;
    let svc = get(&services(c, &ns), "created").await?;
    if str_at(&p, &["status", "phase"]) != "Pending"
        || str_at(&svc, &["spec", "upgradeStrategy", "type"]) != "None"
        || type_owners(&svc) != ["kubectl-create"]
    {
        bail!(
            "after 4 s: plan {} service {}",
            p["status"],
            svc["metadata"]["managedFields"]
        );
    }
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.clone(), &ns);
    let admitted = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Admitted"))
        .count();
    if admitted != 0 {
        bail!("{admitted} Admitted Events for a gate raygate does not own");
    }
    // Why raygate cannot gate a field another manager owns, even sharing its value: a
    // non-forced server-side apply of the same value succeeds (shared ownership), of
    // another value is refused with a conflict naming the owner.
    let probe = |ty: &str| {
        json!({"apiVersion": "ray.io/v1", "kind": "RayService",
               "metadata": {"name": "applied"}, "spec": {"upgradeStrategy": {"type": ty}}})
    };
    let pp = PatchParams::apply("e2e-probe");
    let svcs = services(c, &ns);
    svcs.patch(
        "applied",
        &pp,
        &Patch::Apply(&probe("NewClusterWithIncrementalUpgrade")),
    )
    .await?;
    match svcs
        .patch("applied", &pp, &Patch::Apply(&probe("None")))
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 409 && e.message.contains("\"kubectl\"") => {}
        other => bail!("applying another value to a co-owned gate field: {other:?}"),
    }
    Ok(())
}

/// (1) an incremental upgrade that fits only as a surge is admitted and completes while a
/// NewCluster upgrade of the same size is held; (3) the peak GPUs requested by pods during it
/// stay within the running cluster plus raygate's reservation; (2) a surge that does not fit
/// is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incremental_upgrade_is_admitted_on_its_surge() {
    let cp = ControlPlane::start_incremental(Options::from_env().expect("options"))
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))
        .expect("CRD");
    let c = cp.client().await.expect("client");
    let ns = create_namespace(&c, "inc").await.expect("ns");
    // 10 GPUs: two services of 4 GPUs each leave 2 free, one 2-GPU worker.
    for (n, g) in [("gpu-0", 8), ("gpu-1", 2)] {
        FakeNode::new(n)
            .cpu("32")
            .memory("256Gi")
            .gpu(g)
            .create(&c)
            .await
            .expect("node");
    }
    let _rg = Raygate::spawn(&cp, &["--kuberay-incremental-upgrades=true"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let peak_bound = Arc::new(AtomicU64::new(0));
    // Set once Traefik has made the Gateway and the HTTPRoute with both clusters ready.
    let traefik_ready = Arc::new(AtomicBool::new(false));
    let bg = async {
        while !stop.load(Ordering::Relaxed) {
            if let Err(e) = stand_ins(&cp, &c, &ns).await {
                eprintln!("stand-ins: {e:#}");
            }
            if !traefik_ready.load(Ordering::Relaxed)
                && let Ok(seen) = gateway_programmed_by_traefik(&c, &ns, "inc").await
                && seen["backends"].as_array().is_some_and(|b| b.len() == 2)
            {
                eprintln!(
                    "Traefik programmed Gateway inc-gateway and HTTPRoute inc-httproute: {seen}"
                );
                traefik_ready.store(true, Ordering::Relaxed);
            }
            if let Ok((g, b)) = gpus_requested2(&c, &ns).await {
                peak.fetch_max(g, Ordering::Relaxed);
                peak_bound.fetch_max(b, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let run = async {
        create(
            &plans(&c, &ns),
            plan("inc", "NewClusterWithIncrementalUpgrade"),
        )
        .await?;
        create(&plans(&c, &ns), plan("nc", "NewCluster")).await?;
        create(&services(&c, &ns), service("inc", 50)).await?;
        create(&services(&c, &ns), service("nc", 50)).await?;
        wait_phase(&c, &ns, "inc", "Idle").await?;
        wait_phase(&c, &ns, "nc", "Idle").await?;
        let before = gpus_requested(&c, &ns).await?;
        if before != 8 {
            bail!("expected 8 GPUs running before the upgrades, found {before}");
        }
        peak.store(0, Ordering::Relaxed);
        peak_bound.store(0, Ordering::Relaxed);
        bump(&c, &ns, "nc", "rayproject/ray:2.10.0-gpu").await?;
        bump(&c, &ns, "inc", "rayproject/ray:2.10.0-gpu").await?;
        let admitted = wait_phase(&c, &ns, "inc", "Upgrading").await?;
        let reserved = reserved_gpus(&admitted, 2, 2);
        let held = get(&plans(&c, &ns), "nc").await?;
        if str_at(&held, &["status", "phase"]) != "WaitingForCapacity" {
            bail!(
                "the NewCluster upgrade of the same size should be held: {}",
                held["status"]
            );
        }
        wait_phase(&c, &ns, "inc", "Completed").await?;
        // KubeRay moved the traffic, so it saw both ready: check it was Traefik's doing.
        if !traefik_ready.load(Ordering::Relaxed) {
            bail!(
                "Traefik never made Gateway inc-gateway and HTTPRoute inc-httproute (both clusters) ready"
            );
        }
        let all = peak.load(Ordering::Relaxed);
        let p = peak_bound.load(Ordering::Relaxed);
        eprintln!(
            "incremental upgrade: peak GPUs requested by pods bound to nodes {p}, by all pods incl. Pending {all}; active {before} + reservation {reserved} = {}",
            before + reserved
        );
        if p > before + reserved {
            bail!("peak {p} GPUs exceeds active {before} + reservation {reserved}");
        }
        if str_at(&get(&plans(&c, &ns), "nc").await?, &["status", "phase"]) != "WaitingForCapacity"
        {
            bail!("the NewCluster upgrade must still be held");
        }
        // (2) a surge of 100% (2 workers, 4 GPUs) does not fit in the 2 free GPUs.
        let patch = json!({"spec": {"upgradeStrategy": {"clusterUpgradeOptions": {"maxSurgePercent": 100, "stepSizePercent": 50}}}});
        services(&c, &ns)
            .patch("inc", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        bump(&c, &ns, "inc", "rayproject/ray:2.11.0-gpu").await?;
        wait_phase(&c, &ns, "inc", "WaitingForCapacity").await?;
        Ok::<(), anyhow::Error>(())
    };
    let (r, (), owned) = tokio::join!(
        async {
            let r = run.await;
            stop.store(true, Ordering::Relaxed);
            r
        },
        bg,
        a_creator_owned_gate_is_reported_not_claimed(&cp, &c)
    );
    r.unwrap_or_else(|e| panic!("{e:#}"));
    owned.unwrap_or_else(|e| panic!("creator-owned gate: {e:#}"));
}
