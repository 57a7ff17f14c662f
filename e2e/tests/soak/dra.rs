//! A seeded random soak on DRA GPUs (issue 36, item 3), on its own control plane: two nodes
//! whose GPUs exist only as ResourceSlices the test publishes as a driver would (16 devices
//! per node, in two slices), the DeviceClass `gpu` behind `nvidia.com/gpu`, the real
//! kube-scheduler allocating, three RayServices of one 8-GPU worker (24 of 32 devices
//! used: one change at a time fits). Random steps among
//!
//! - a change (a new worker image: a new cluster of 8 more devices),
//! - a node's pool republished under the next generation, its two new slices 0-6 s apart
//!   (old and new generations both present, the new one incomplete meanwhile), then the
//!   old generation deleted,
//! - a node's slices withdrawn for 3-10 s, then republished,
//! - the DeviceClass narrowed to `gpu-0..7` for 3-10 s, then widened,
//! - raygate killed (-9) and started again,
//! - nothing for a few seconds,
//!
//! checked every 500 ms: never a third cluster; a gate `None` only with a plan; and no pod of
//! a cluster raygate admitted on an undisturbed pool left Unschedulable (admitted more than
//! [`GRACE`] after the last withdrawal, narrowing or republishing ended, and the pod's
//! Unschedulable condition set after that admission). Then every change must end.
//!
//! `RAYGATE_SOAK_SEED`, `RAYGATE_SOAK_SECONDS` (default 90) and `RAYGATE_SOAK_MINUTES` as for
//! the other soaks.

use super::*;
use raygate_e2e::dra;
use std::sync::{Arc, Mutex};

const DRA_SERVICES: usize = 3;
const NODES: usize = 2;
/// How long after a disturbance raygate's caches may still hold what was true before it.
const GRACE: Duration = Duration::from_secs(3);

fn dsvc(i: usize) -> String {
    format!("d{i}")
}

/// Publishes `node`'s pool at `generation` as two slices of 8 devices.
async fn publish(
    slices: &Api<DynamicObject>,
    node: &str,
    generation: i64,
    gap: Duration,
) -> Result<()> {
    for (half, devices) in [(0, 0..8), (1, 8..16)] {
        let obj = dra::slice(
            &format!("{node}-g{generation}-{half}"),
            node,
            generation,
            2,
            devices,
        );
        slices
            .create(&PostParams::default(), &serde_json::from_value(obj)?)
            .await?;
        if half == 0 {
            tokio::time::sleep(gap).await;
        }
    }
    Ok(())
}

/// Deletes `node`'s slices of generations below `keep_from`.
async fn withdraw(slices: &Api<DynamicObject>, node: &str, keep_from: i64) -> Result<()> {
    for s in slices.list(&ListParams::default()).await?.items {
        let v = serde_json::to_value(&s)?;
        let generation = v["spec"]["pool"]["generation"].as_i64().unwrap_or(0);
        if str_at(&v, &["spec", "nodeName"]) == node && generation < keep_from {
            let _ = slices
                .delete(
                    &s.metadata.name.clone().unwrap_or_default(),
                    &DeleteParams::default(),
                )
                .await;
        }
    }
    Ok(())
}

/// When the last disturbance of the devices ended (`None` while one lasts).
#[derive(Clone)]
struct Calm(Arc<Mutex<Option<k8s_openapi::jiff::Timestamp>>>);

impl Calm {
    fn disturb(&self) {
        *self.0.lock().expect("lock") = None;
    }
    fn settle(&self) {
        *self.0.lock().expect("lock") = Some(k8s_openapi::jiff::Timestamp::now());
    }
    fn since(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        *self.0.lock().expect("lock")
    }
}

fn ts(v: &Value) -> Option<k8s_openapi::jiff::Timestamp> {
    v.as_str().and_then(|s| s.parse().ok())
}

/// One sample of the DRA soak's invariants.
async fn dra_check(client: &Client, ns: &str, calm: &Calm) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for i in 0..DRA_SERVICES {
        let s = dsvc(i);
        let cs = clusters(client, ns)
            .list(&ListParams::default().labels(&format!("ray.io/originated-from-cr-name={s}")))
            .await?
            .items;
        if cs.len() > 2 {
            bail!("{s}: a third cluster ({} RayClusters)", cs.len());
        }
        let rs = get(&services(client, ns), &s).await?;
        let p = get(&plans(client, ns), &s).await?;
        let pending = str_at(&rs, &["status", "pendingServiceStatus", "rayClusterName"]);
        let admitted = ts(&p["status"]["admitted"]["admittedTime"]);
        let (Some(admitted), Some(calm_since), false) =
            (admitted, calm.since(), pending.is_empty())
        else {
            continue;
        };
        if admitted.as_second() < calm_since.as_second() + GRACE.as_secs() as i64 {
            continue;
        }
        let lp = ListParams::default().labels(&format!("ray.io/cluster={pending}"));
        for pod in pods.list(&lp).await?.items {
            let stuck_since = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .find(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
                .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0));
            if let Some(t) = stuck_since
                && t.as_second() >= admitted.as_second()
            {
                bail!(
                    "{s}: pod {:?} of cluster {pending}, admitted at {admitted} on a pool calm since \
                     {calm_since}, Unschedulable since {t}: {:?}",
                    pod.metadata.name,
                    str_at(&p, &["status", "message"])
                );
            }
        }
    }
    Ok(())
}

async fn dra_soak(seed: u64, cp: &ControlPlane, rg: &mut Option<Raygate>) -> Result<String> {
    let mut rng = Rng::new(seed);
    let budget = seeded::budget(90);
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))?;
    let client = cp.client().await?;
    let ns = create_namespace(&client, "dra-soak").await?;
    let slices = dra::slices_api(&client);
    let classes = dra::classes_api(&client);
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(dra::gpu_class(dra::EVERY_DEVICE))?,
        )
        .await?;
    let mut generation = [1i64; NODES];
    for (n, g) in generation.iter().enumerate() {
        let node = format!("dra-{n}");
        FakeNode::new(&node)
            .cpu("64")
            .memory("512Gi")
            .create(&client)
            .await?;
        publish(&slices, &node, *g, Duration::ZERO).await?;
    }
    *rg = Some(Raygate::spawn(cp, SOAK_ARGS)?);
    for i in 0..DRA_SERVICES {
        let s = dsvc(i);
        let plan = json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
            "metadata": {"name": s}, "spec": {"rayServiceRef": {"name": s}, "stallAfter": "10m"}});
        plans(&client, &ns)
            .create(&PostParams::default(), &serde_json::from_value(plan)?)
            .await?;
        let rs = GpuRayService::new(&s, "rayproject/ray:2.9.0-gpu")
            .replicas(1)
            .gpus(8)
            .build();
        services(&client, &ns)
            .create(&PostParams::default(), &serde_json::from_value(rs)?)
            .await?;
    }
    for i in 0..DRA_SERVICES {
        let s = dsvc(i);
        wait_for(&format!("{s} Idle"), T, || async {
            let p = get(&plans(&client, &ns), &s).await?;
            Ok(if str_at(&p, &["status", "phase"]) == "Idle" {
                Check::Done(())
            } else {
                Check::NotYet(str_at(&p, &["status", "message"]).to_string())
            })
        })
        .await?;
    }
    let calm = Calm(Arc::new(Mutex::new(Some(
        k8s_openapi::jiff::Timestamp::now(),
    ))));
    let checker = {
        let (client, ns, calm) = (client.clone(), ns.clone(), calm.clone());
        tokio::spawn(async move {
            let mut samples = 0u64;
            loop {
                if let Err(e) = dra_check(&client, &ns, &calm).await {
                    return (samples, Some(e));
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let start = Instant::now();
    let (mut steps, mut changes, mut disturbances, mut kills) = (0u64, 0u64, 0u64, 0u64);
    let mut image = 10u64;
    let stepped: Result<()> = async {
        while start.elapsed() < budget && !checker.is_finished() {
            steps += 1;
            let n = rng.below(NODES);
            let node = format!("dra-{n}");
            let pause = Duration::from_secs(3 + rng.below(8) as u64);
            let did = match rng.below(10) {
                0..=3 => {
                    let s = dsvc(rng.below(DRA_SERVICES));
                    image += 1;
                    changes += 1;
                    let img = format!("rayproject/ray:2.{image}.0-gpu");
                    let rs = get(&services(&client, &ns), &s).await?;
                    let mut groups = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
                    groups[0]["template"]["spec"]["containers"][0]["image"] = json!(img);
                    merge(
                        &services(&client, &ns),
                        &s,
                        json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}}),
                    )
                    .await?;
                    format!("{s}: change to {img}")
                }
                4 | 5 => {
                    disturbances += 1;
                    calm.disturb();
                    generation[n] += 1;
                    let gap = Duration::from_millis(rng.below(6000) as u64);
                    publish(&slices, &node, generation[n], gap).await?;
                    withdraw(&slices, &node, generation[n]).await?;
                    calm.settle();
                    format!(
                        "{node}: pool republished as generation {} ({gap:?} incomplete)",
                        generation[n]
                    )
                }
                6 => {
                    disturbances += 1;
                    calm.disturb();
                    generation[n] += 1;
                    withdraw(&slices, &node, generation[n]).await?;
                    tokio::time::sleep(pause).await;
                    publish(&slices, &node, generation[n], Duration::ZERO).await?;
                    calm.settle();
                    format!("{node}: slices withdrawn for {pause:?}, republished")
                }
                7 => {
                    disturbances += 1;
                    calm.disturb();
                    let narrow =
                        |cel: &str| json!({"spec": {"selectors": [{"cel": {"expression": cel}}]}});
                    classes
                        .patch(
                            "gpu",
                            &PatchParams::default(),
                            &Patch::Merge(&narrow(dra::LOW_DEVICES)),
                        )
                        .await?;
                    tokio::time::sleep(pause).await;
                    classes
                        .patch(
                            "gpu",
                            &PatchParams::default(),
                            &Patch::Merge(&narrow(dra::EVERY_DEVICE)),
                        )
                        .await?;
                    calm.settle();
                    format!("DeviceClass narrowed for {pause:?}")
                }
                8 => {
                    kills += 1;
                    if let Some(mut r) = rg.take() {
                        r.kill();
                    }
                    *rg = Some(Raygate::spawn(cp, SOAK_ARGS)?);
                    "raygate killed (-9) and started again".to_string()
                }
                _ => {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    "nothing for 3 s".to_string()
                }
            };
            eprintln!("dra soak step {steps} ({:?}): {did}", start.elapsed());
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        eprintln!("dra soak: {steps} steps in {:?}; settling", start.elapsed());
        for i in 0..DRA_SERVICES {
            let s = dsvc(i);
            wait_for(
                &format!("{s}'s last change to end"),
                Duration::from_secs(300),
                || async {
                    let p = get(&plans(&client, &ns), &s).await?;
                    let rs = get(&services(&client, &ns), &s).await?;
                    let gate = str_at(&rs, &["spec", "upgradeStrategy", "type"]).to_string();
                    let phase = str_at(&p, &["status", "phase"]).to_string();
                    let n = clusters(&client, &ns)
                        .list(
                            &ListParams::default()
                                .labels(&format!("ray.io/originated-from-cr-name={s}")),
                        )
                        .await?
                        .items
                        .len();
                    Ok(
                        if matches!(phase.as_str(), "Idle" | "Completed")
                            && gate == "None"
                            && n == 1
                        {
                            Check::Done(())
                        } else {
                            Check::NotYet(format!(
                                "phase {phase}, gate {gate}, {n} clusters: {}",
                                str_at(&p, &["status", "message"])
                            ))
                        },
                    )
                },
            )
            .await?;
        }
        Ok(())
    }
    .await;
    let checked = if checker.is_finished() {
        Some(checker.await?)
    } else {
        checker.abort();
        None
    };
    if let Some((samples, Some(e))) = checked {
        return Err(e.context(format!(
            "invariant broken after {samples} samples, step {steps}"
        )));
    }
    stepped?;
    Ok(format!(
        "{steps} steps in {:?}: {changes} changes, {disturbances} pool disturbances, {kills} raygate kills",
        start.elapsed()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_soak_on_dra_pools_keeps_every_invariant() {
    let seed = seeded::seed();
    eprintln!("dra soak: RAYGATE_SOAK_SEED={seed}");
    let cp = ControlPlane::start()
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    let mut rg = None;
    match dra_soak(seed, &cp, &mut rg).await {
        Ok(said) => eprintln!("dra soak figures: seed {seed}, {said}"),
        Err(e) => {
            let logs = rg.as_ref().map(Raygate::logs).unwrap_or_default();
            panic!(
                "dra soak failed; replay with RAYGATE_SOAK_SEED={seed}: {e:#}\nraygate's log (last 60 lines):\n{}",
                logs.lines()
                    .rev()
                    .take(60)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    let logs = rg.as_ref().map(Raygate::logs).unwrap_or_default();
    assert!(!logs.contains("panicked"), "raygate panicked:\n{logs}");
    drop(rg);
}
