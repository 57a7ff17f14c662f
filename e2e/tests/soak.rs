//! A seeded randomized soak on the real control plane (Kubernetes v1.36, kwok, the real
//! KubeRay operator): random spec changes of several RayServices, nodes added, removed and
//! cordoned, competing plain pods, plan policy and priority edits, raygate killed (-9) and
//! restarted, with invariants checked after every step, then a settle phase in which every
//! change must end.
//!
//! Reproducible: `RAYGATE_SOAK_SEED=N` replays a run (the seed is printed at the start and
//! on failure); `RAYGATE_SOAK_STEPS` (default 80) and `RAYGATE_SOAK_SECONDS` (default 240)
//! bound it. Needs `e2e/setup` and `cargo build --workspace --bins`.

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::json::str_at;
use raygate_e2e::seeded::{self, Rng};
use raygate_e2e::{
    Check, ControlPlane, FakeNode, GpuRayService, Raygate, create_namespace, wait_for,
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const SERVICES: usize = 3;
const T: Duration = Duration::from_secs(180);

/// The soak edits priorities in -10..=10: a ceiling that lets them all rank (the chart's
/// default, 0, would cap the positive ones).
const SOAK_ARGS: &[&str] = &["--max-priority=10"];

fn dyn_api(client: &Client, ns: &str, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let (g, v) = group.split_once('/').unwrap_or((group, "v1"));
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, v, kind), plural);
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn plans(client: &Client, ns: &str) -> Api<DynamicObject> {
    dyn_api(
        client,
        ns,
        "raygate.io/v1alpha1",
        "UpgradePlan",
        "upgradeplans",
    )
}

fn services(client: &Client, ns: &str) -> Api<DynamicObject> {
    dyn_api(client, ns, "ray.io/v1", "RayService", "rayservices")
}

fn clusters(client: &Client, ns: &str) -> Api<DynamicObject> {
    dyn_api(client, ns, "ray.io/v1", "RayCluster", "rayclusters")
}

async fn get(api: &Api<DynamicObject>, name: &str) -> Result<Value> {
    Ok(serde_json::to_value(api.get(name).await?)?)
}

async fn merge(api: &Api<DynamicObject>, name: &str, patch: Value) -> Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn ray_service(name: &str, image: &str, replicas: i64) -> Value {
    GpuRayService::new(name, image)
        .replicas(replicas)
        .gpus(4)
        .head("1", "4Gi")
        .worker("2", "8Gi")
        .build()
}

async fn add_node(client: &Client, name: &str) -> Result<()> {
    FakeNode::new(name)
        .cpu("32")
        .memory("256Gi")
        .gpu(8)
        .create(client)
        .await?;
    Ok(())
}

/// Deletes a pod that may already be gone: the pod garbage collector removes the pods of
/// a deleted node.
async fn delete_pod(pods: &Api<Pod>, name: &str) -> Result<()> {
    match pods.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

struct World {
    client: Client,
    ns: String,
    other_ns: String,
    nodes: Vec<String>,
    next_node: usize,
    competing: Vec<String>,
    next_pod: usize,
    image_version: usize,
}

fn svc(i: usize) -> String {
    format!("s{i}")
}

impl World {
    /// One random step; returns what it did.
    async fn step(&mut self, rng: &mut Rng, rg: &mut Raygate, cp: &ControlPlane) -> Result<String> {
        let i = rng.below(SERVICES);
        let s = svc(i);
        Ok(match rng.below(9) {
            0 | 1 => {
                self.image_version += 1;
                let image = format!("rayproject/ray:2.{}.0-gpu", 10 + self.image_version);
                let rs = get(&services(&self.client, &self.ns), &s).await?;
                let mut groups = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
                groups[0]["template"]["spec"]["containers"][0]["image"] = json!(image);
                merge(
                    &services(&self.client, &self.ns),
                    &s,
                    json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}}),
                )
                .await?;
                format!("{s}: worker image {image}")
            }
            2 => {
                let replicas = 1 + rng.below(2);
                let rs = get(&services(&self.client, &self.ns), &s).await?;
                let mut groups = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
                groups[0]["replicas"] = json!(replicas);
                merge(
                    &services(&self.client, &self.ns),
                    &s,
                    json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}}),
                )
                .await?;
                format!("{s}: {replicas} workers")
            }
            3 if self.nodes.len() < 6 => {
                let name = format!("gpu-{}", self.next_node);
                self.next_node += 1;
                add_node(&self.client, &name).await?;
                self.nodes.push(name.clone());
                format!("node {name} added")
            }
            3 | 4 if self.nodes.len() > 2 => {
                let name = self.nodes.remove(rng.below(self.nodes.len()));
                let api: Api<Node> = Api::all(self.client.clone());
                api.delete(&name, &DeleteParams::default()).await?;
                format!("node {name} removed")
            }
            5 => {
                let name = &self.nodes[rng.below(self.nodes.len())];
                let api: Api<Node> = Api::all(self.client.clone());
                let node = api.get(name).await?;
                let cordoned = node.spec.and_then(|s| s.unschedulable).unwrap_or(false);
                api.patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"unschedulable": !cordoned}})),
                )
                .await?;
                format!(
                    "node {name} {}",
                    if cordoned { "uncordoned" } else { "cordoned" }
                )
            }
            6 => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.other_ns);
                if self.competing.len() < 2 && rng.below(2) == 0 {
                    let name = format!("batch-{}", self.next_pod);
                    self.next_pod += 1;
                    let pod: Pod = serde_json::from_value(json!({
                        "metadata": {"name": name},
                        "spec": {"containers": [{"name": "c", "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
                    }))?;
                    pods.create(&PostParams::default(), &pod).await?;
                    self.competing.push(name.clone());
                    format!("competing pod {name} (4 GPUs)")
                } else if let Some(name) = self.competing.pop() {
                    delete_pod(&pods, &name).await?;
                    format!("competing pod {name} deleted")
                } else {
                    "nothing".into()
                }
            }
            7 => {
                let policy = if rng.below(3) == 0 { "Paused" } else { "Auto" };
                let priority = i64::try_from(rng.below(21)).unwrap_or(0) - 10;
                merge(
                    &plans(&self.client, &self.ns),
                    &s,
                    json!({"spec": {"policy": policy, "priority": priority}}),
                )
                .await?;
                format!("plan {s}: {policy}, priority {priority}")
            }
            _ => {
                rg.kill();
                *rg = Raygate::spawn(cp, SOAK_ARGS)?;
                "raygate killed (-9) and restarted".into()
            }
        })
    }

    /// The invariants, on what the apiserver says right now.
    async fn check(&self) -> Result<()> {
        let (p_api, s_api) = (
            plans(&self.client, &self.ns),
            services(&self.client, &self.ns),
        );
        let all = clusters(&self.client, &self.ns)
            .list(&ListParams::default())
            .await?;
        for i in 0..SERVICES {
            let s = svc(i);
            let before = get(&p_api, &s).await?;
            let rs = get(&s_api, &s).await?;
            let after = get(&p_api, &s).await?;
            // The gate is open only for a recorded admission (status first, then the gate;
            // the plan is read before and after the RayService so a transition ending in
            // between is not mistaken for one).
            let admitted = |p: &Value| !p["status"]["admitted"].is_null();
            if str_at(&rs, &["spec", "upgradeStrategy", "type"]) == "NewCluster"
                && !admitted(&before)
                && !admitted(&after)
            {
                bail!("{s}: gate NewCluster without status.admitted");
            }
            // Never two pending clusters: besides the active one, at most one cluster of
            // this service newer than it.
            let active = str_at(&rs, &["status", "activeServiceStatus", "rayClusterName"]);
            let created = |c: &DynamicObject| c.metadata.creation_timestamp.clone();
            let mine: Vec<&DynamicObject> = all
                .items
                .iter()
                .filter(|c| {
                    c.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("ray.io/originated-from-cr-name"))
                        .is_some_and(|n| *n == s)
                })
                .collect();
            let active_created = mine
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(active))
                .and_then(|c| created(c));
            let newer = mine
                .iter()
                .filter(|c| c.metadata.name.as_deref() != Some(active))
                .filter(|c| active_created.is_none() || created(c) >= active_created)
                .count();
            if newer > 1 {
                bail!("{s}: {newer} pending clusters besides the active {active:?}");
            }
            // At admission the new cluster fit: GPUs needed <= free for it.
            if str_at(&after, &["status", "phase"]) == "Admitted" {
                let num = |k: &str| {
                    str_at(&after, &["status", "capacity", k])
                        .parse::<i64>()
                        .ok()
                };
                if let (Some(need), Some(free)) = (num("gpusNeeded"), num("gpusFree"))
                    && need > free
                {
                    bail!("{s}: admitted needing {need} GPUs with {free} free for it");
                }
            }
        }
        Ok(())
    }

    /// Every obstacle goes away; every change must then end.
    async fn settle(&mut self) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.other_ns);
        for name in self.competing.drain(..) {
            delete_pod(&pods, &name).await?;
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        for n in &self.nodes {
            nodes
                .patch(
                    n,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"unschedulable": false}})),
                )
                .await?;
        }
        while self.nodes.len() < 7 {
            let name = format!("gpu-{}", self.next_node);
            self.next_node += 1;
            add_node(&self.client, &name).await?;
            self.nodes.push(name);
        }
        for i in 0..SERVICES {
            merge(
                &plans(&self.client, &self.ns),
                &svc(i),
                json!({"spec": {"policy": "Auto"}}),
            )
            .await?;
        }
        let p_api = plans(&self.client, &self.ns);
        for i in 0..SERVICES {
            let s = svc(i);
            wait_for(&format!("{s}'s last change to end"), T, || async {
                let p = get(&p_api, &s).await?;
                let phase = str_at(&p, &["status", "phase"]).to_string();
                let rs = get(&services(&self.client, &self.ns), &s).await?;
                let gate = str_at(&rs, &["spec", "upgradeStrategy", "type"]).to_string();
                Ok(
                    if matches!(phase.as_str(), "Idle" | "Completed") && gate == "None" {
                        Check::Done(())
                    } else {
                        Check::NotYet(format!(
                            "phase {phase}, gate {gate}, {:?}",
                            str_at(&p, &["status", "message"])
                        ))
                    },
                )
            })
            .await?;
        }
        Ok(())
    }
}

async fn soak(seed: u64, rg: &mut Option<Raygate>, cp: &ControlPlane) -> Result<()> {
    let mut rng = Rng::new(seed);
    let steps = seeded::env_num("RAYGATE_SOAK_STEPS").unwrap_or(80);
    let budget = seeded::budget(240);
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))?;
    let client = cp.client().await?;
    let ns = create_namespace(&client, "soak").await?;
    let other_ns = create_namespace(&client, "batch").await?;
    let mut world = World {
        client: client.clone(),
        ns: ns.clone(),
        other_ns,
        nodes: vec![],
        next_node: 0,
        competing: vec![],
        next_pod: 0,
        image_version: 0,
    };
    for _ in 0..3 {
        let name = format!("gpu-{}", world.next_node);
        world.next_node += 1;
        add_node(&client, &name).await?;
        world.nodes.push(name);
    }
    let mut r = Raygate::spawn(cp, SOAK_ARGS)?;
    for i in 0..SERVICES {
        let s = svc(i);
        let plan = json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
            "metadata": {"name": s}, "spec": {"rayServiceRef": {"name": s}, "stallAfter": "10m"}});
        plans(&client, &ns)
            .create(&PostParams::default(), &serde_json::from_value(plan)?)
            .await?;
        services(&client, &ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(ray_service(&s, "rayproject/ray:2.9.0-gpu", 1))?,
            )
            .await?;
    }
    let start = Instant::now();
    let mut n = 0;
    while n < steps && start.elapsed() < budget {
        n += 1;
        let did = world
            .step(&mut rng, &mut r, cp)
            .await
            .with_context(|| format!("step {n}"))?;
        eprintln!("soak step {n} ({:?}): {did}", start.elapsed());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let checked = world.check().await;
        if let Err(e) = checked {
            *rg = Some(r);
            return Err(e.context(format!("invariant broken after step {n} ({did})")));
        }
    }
    eprintln!("soak: {n} steps in {:?}; settling", start.elapsed());
    let settled = world.settle().await;
    let logs = r.logs();
    *rg = Some(r);
    settled?;
    world.check().await?;
    if logs.contains("panicked") {
        bail!("raygate panicked:\n{logs}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_random_soak_keeps_every_invariant() {
    let seed = seeded::seed();
    eprintln!("soak: RAYGATE_SOAK_SEED={seed}");
    let cp = ControlPlane::start()
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    let mut rg = None;
    let result = soak(seed, &mut rg, &cp).await;
    if let Err(e) = result {
        panic!("soak failed; replay with RAYGATE_SOAK_SEED={seed}: {e:#}");
    }
    drop(rg);
}

#[path = "soak/dra.rs"]
mod dra_soak;
