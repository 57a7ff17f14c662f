//! scale: raygate at cluster scale on the real control plane (kube-apiserver v1.36, kwok
//! nodes, the real KubeRay operator), measured, not asserted. Run through `e2e/scale`,
//! which builds raygate in release mode first.
//!
//! The story: `--nodes` kwok nodes (a fifth of the GPU nodes' worth of headroom missing),
//! raygate started, `--services` RayServices each with an UpgradePlan brought up by the real
//! operator, then plain pods up to `--pods` in all, and raygate restarted on that full
//! cluster; then `--waiting` of the services change their worker image at once and wait for
//! GPUs, and a batch of GPU nodes is added. Reported: raygate's time to ready on the full
//! cluster, its resident memory (now and peak), the time from the capacity change to each
//! admission (p50/p99/max), the time until every upgrade completed, and the
//! reconcile-duration p50/p99 from raygate's own `/metrics` histogram.

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::{
    Check, ControlPlane, FakeNode, GpuRayService, Raygate, create_namespace, wait_for,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// GPUs per GPU node; each RayService's worker group takes `WORKERS` of them.
const GPUS_PER_NODE: u32 = 8;
const WORKERS: u32 = 2;
const FILLER_PER_REQUEST: usize = 64;

#[derive(Parser, Debug)]
#[command(about = "raygate at scale on the real control plane (see e2e/scale)")]
struct Args {
    /// Nodes in all (GPU nodes for the services plus CPU nodes).
    #[arg(long, default_value_t = 1000)]
    nodes: u32,
    /// Pods in all: the services' Ray pods plus plain filler pods bound to the CPU nodes.
    #[arg(long, default_value_t = 30_000)]
    pods: u32,
    /// RayServices, each with an UpgradePlan.
    #[arg(long, default_value_t = 200)]
    services: u32,
    /// Services whose upgrade waits for capacity, then is admitted once nodes are added.
    #[arg(long, default_value_t = 50)]
    waiting: u32,
    /// Namespaces the services are spread over.
    #[arg(long, default_value_t = 10)]
    namespaces: u32,
    /// Give up on any one phase after this many seconds.
    #[arg(long, default_value_t = 1200)]
    timeout: u64,
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// One GPU worker group of `WORKERS` pods on the GPU pool, a 1-CPU head.
fn ray_service(name: &str, image: &str) -> Value {
    GpuRayService::new(name, image)
        .replicas(i64::from(WORKERS))
        .head("1", "2Gi")
        .worker("1", "4Gi")
        .node_selector("raygate.io/pool", "gpu")
        .build()
}

/// A plain pod as a Deployment would make it, bound to `node` (the scheduler's throughput
/// is not what this run measures).
fn filler(name: &str, node: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "filler", "pod-template-hash": "5d8f7c9b4"},
                     "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T00:00:00Z"}},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "app", "image": "registry.k8s.io/pause:3.10",
                "env": [{"name": "LOG_LEVEL", "value": "info"}, {"name": "REGION", "value": "eu-west-1"}],
                "ports": [{"containerPort": 8080, "name": "http"}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 10},
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}
            }]
        }
    }))?)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// `p` of a Prometheus histogram from its cumulative `_bucket` lines: the upper bound of the
/// first bucket holding that fraction of observations.
fn histogram_quantile(metrics: &str, name: &str, p: f64) -> Option<f64> {
    let mut buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    buckets
        .iter()
        .find(|(_, c)| *c >= p * total)
        .map(|(le, _)| *le)
}

/// Resident set size now and at its peak, in MiB, from /proc.
fn rss_mib(pid: u32) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| -> Option<f64> {
        status
            .lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse::<f64>()
            .ok()
    };
    match (kib("VmRSS:"), kib("VmHWM:")) {
        (Some(now), Some(peak)) => Ok((now / 1024.0, peak / 1024.0)),
        _ => bail!("no VmRSS/VmHWM in /proc/{pid}/status"),
    }
}

async fn plans_by_phase(client: &Client) -> Result<BTreeMap<String, String>> {
    let plans: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ar("raygate.io", "v1alpha1", "UpgradePlan", "upgradeplans"),
    );
    Ok(plans
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| {
            let key = format!(
                "{}/{}",
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default()
            );
            let phase = p.data["status"]["phase"].as_str().unwrap_or("").to_string();
            (key, phase)
        })
        .collect())
}

async fn wait_phases(client: &Client, want: &[&str], n: usize, timeout: Duration) -> Result<()> {
    wait_for(&format!("{n} plans in {want:?}"), timeout, || async {
        let phases = plans_by_phase(client).await?;
        let done = phases
            .values()
            .filter(|p| want.contains(&p.as_str()))
            .count();
        Ok(if done >= n {
            Check::Done(())
        } else {
            let mut hist: BTreeMap<&str, usize> = BTreeMap::new();
            for p in phases.values() {
                *hist.entry(p.as_str()).or_default() += 1;
            }
            Check::NotYet(format!("{done}/{n}: {hist:?}"))
        })
    })
    .await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let a = Args::parse();
    let timeout = Duration::from_secs(a.timeout);
    let gpu_nodes = (a.services * WORKERS).div_ceil(GPUS_PER_NODE);
    let extra_gpu_nodes = (a.waiting * WORKERS).div_ceil(GPUS_PER_NODE);
    let cpu_nodes = a
        .nodes
        .checked_sub(gpu_nodes + extra_gpu_nodes)
        .context("--nodes too small for the GPU nodes the services need")?;
    let ray_pods = a.services * (1 + WORKERS);
    let fillers = a.pods.saturating_sub(ray_pods) as usize;
    let t_all = Instant::now();
    eprintln!(
        "scale: {} nodes ({gpu_nodes} GPU + {extra_gpu_nodes} added later, {cpu_nodes} CPU), {} pods ({ray_pods} Ray + {fillers} plain), {} services, {} waiting",
        a.nodes, a.pods, a.services, a.waiting
    );

    let cp = ControlPlane::start()?;
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))?;
    let client = cp.client().await?;

    let t = Instant::now();
    let mut nodes: Vec<FakeNode> = (0..gpu_nodes)
        .map(|i| {
            FakeNode::new(format!("gpu-{i}"))
                .cpu("96")
                .memory("768Gi")
                .gpu(GPUS_PER_NODE)
                .label("raygate.io/pool", "gpu")
        })
        .collect();
    nodes.extend((0..cpu_nodes).map(|i| {
        FakeNode::new(format!("cpu-{i}"))
            .cpu("64")
            .memory("256Gi")
            .pods(110)
    }));
    stream::iter(nodes.iter().map(|n| n.create(&client)))
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    eprintln!(
        "scale: {} nodes Ready in {:.0} s",
        nodes.len(),
        t.elapsed().as_secs_f64()
    );

    // raygate first, then the services: KubeRay brings them up while kwok has only their
    // pods to start (with 29,400 filler pods queued ahead, kwok's four pod workers kept the
    // Ray pods Pending for minutes on 2 cores).
    let mut rg = Raygate::spawn(&cp, &[])?;
    let t = Instant::now();
    let mut namespaces = Vec::new();
    for _ in 0..a.namespaces {
        namespaces.push(create_namespace(&client, "svc").await?);
    }
    let plan_ar = ar("raygate.io", "v1alpha1", "UpgradePlan", "upgradeplans");
    let rs_ar = ar("ray.io", "v1", "RayService", "rayservices");
    let services: Vec<(String, String)> = (0..a.services)
        .map(|i| {
            (
                namespaces[(i % a.namespaces) as usize].clone(),
                format!("svc-{i}"),
            )
        })
        .collect();
    stream::iter(services.iter().map(|(ns, name)| {
        let (client, plan_ar, rs_ar) = (client.clone(), plan_ar.clone(), rs_ar.clone());
        async move {
            let plans: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &plan_ar);
            let plan = json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
                              "metadata": {"name": name}, "spec": {"rayServiceRef": {"name": name}}});
            plans.create(&PostParams::default(), &serde_json::from_value(plan)?).await?;
            let rs: Api<DynamicObject> = Api::namespaced_with(client, ns, &rs_ar);
            rs.create(&PostParams::default(), &serde_json::from_value(ray_service(name, "rayproject/ray:2.9.0-gpu"))?)
                .await?;
            Ok::<_, anyhow::Error>(())
        }
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<_>>()
    .await?;
    wait_phases(&client, &["Idle"], services.len(), timeout).await?;
    eprintln!(
        "scale: {} services serving, plans Idle, in {:.0} s",
        services.len(),
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    let filler_ns = create_namespace(&client, "filler").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &filler_ns);
    let per_node = fillers.div_ceil(cpu_nodes.max(1) as usize);
    stream::iter((0..fillers).map(|i| {
        let pods = pods.clone();
        async move {
            let p = filler(
                &format!("filler-{i}"),
                &format!("cpu-{}", i / per_node.max(1)),
            )?;
            pods.create(&PostParams::default(), &p)
                .await
                .context("create filler pod")?;
            Ok::<_, anyhow::Error>(())
        }
    }))
    .buffer_unordered(FILLER_PER_REQUEST)
    .try_collect::<Vec<_>>()
    .await?;
    eprintln!(
        "scale: {fillers} plain pods created in {:.0} s",
        t.elapsed().as_secs_f64()
    );

    wait_for("kwok to start every plain pod", timeout, || async {
        let pending = pods
            .list_metadata(
                &ListParams::default()
                    .fields("status.phase=Pending")
                    .limit(1),
            )
            .await?;
        Ok(match pending.items.first() {
            None => Check::Done(()),
            Some(p) => Check::NotYet(format!("{:?} still Pending", p.metadata.name)),
        })
    })
    .await?;
    eprintln!(
        "scale: plain pods Running in {:.0} s",
        t.elapsed().as_secs_f64()
    );

    // raygate restarted on the full cluster (as after a rollout): its initial lists of
    // every node and pod, then every plan re-decided.
    rg.signal("TERM")?;
    if rg.wait_exit(Duration::from_secs(30)).is_none() {
        rg.kill();
    }
    let t = Instant::now();
    let mut rg = Raygate::spawn(&cp, &[])?;
    let ready_s = t.elapsed().as_secs_f64();
    eprintln!("scale: raygate restarted, ready in {ready_s:.1} s");
    // The waiting upgrades: every GPU is taken, so each holds at WaitingForCapacity.
    let waiting = &services[..a.waiting as usize];
    for (ns, name) in waiting {
        let rs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &rs_ar);
        let cur = rs.get(name).await?;
        let mut groups = cur.data["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
        groups[0]["template"]["spec"]["containers"][0]["image"] =
            json!("rayproject/ray:2.10.0-gpu");
        let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
        rs.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    wait_phases(&client, &["WaitingForCapacity"], waiting.len(), timeout).await?;
    eprintln!("scale: {} upgrades waiting for capacity", waiting.len());

    // The capacity change: new GPU nodes; timed from when the last of them is schedulable.
    let added: Vec<FakeNode> = (0..extra_gpu_nodes)
        .map(|i| {
            FakeNode::new(format!("gpu-new-{i}"))
                .cpu("96")
                .memory("768Gi")
                .gpu(GPUS_PER_NODE)
                .label("raygate.io/pool", "gpu")
        })
        .collect();
    stream::iter(added.iter().map(|n| n.create(&client)))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let t0 = Instant::now();
    let keys: Vec<String> = waiting.iter().map(|(ns, n)| format!("{ns}/{n}")).collect();
    let mut admitted: BTreeMap<String, f64> = BTreeMap::new();
    while admitted.len() < keys.len() {
        if t0.elapsed() > timeout {
            bail!(
                "only {} of {} upgrades admitted after {timeout:?}",
                admitted.len(),
                keys.len()
            );
        }
        let phases = plans_by_phase(&client).await?;
        for k in &keys {
            let p = phases.get(k).map(String::as_str).unwrap_or("");
            if matches!(p, "Admitted" | "Upgrading" | "Completed") && !admitted.contains_key(k) {
                admitted.insert(k.clone(), t0.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut lat: Vec<f64> = admitted.values().copied().collect();
    lat.sort_by(f64::total_cmp);
    wait_phases(&client, &["Completed"], waiting.len(), timeout).await?;
    let completed_s = t0.elapsed().as_secs_f64();

    let metrics = rg.metrics()?;
    let (rss, peak) = rss_mib(rg.pid())?;
    let total_pods = Api::<Pod>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await?
        .items
        .len();
    let q = |p| {
        histogram_quantile(&metrics, "raygate_reconcile_duration_seconds", p)
            .map(|s| format!("{:.0} ms", s * 1000.0))
            .unwrap_or_else(|| "n/a".into())
    };
    println!("| what | measured |");
    println!("|---|---|");
    println!(
        "| cluster | {} nodes, {total_pods} pods, {} RayServices with UpgradePlans (KubeRay {} {}) |",
        a.nodes,
        a.services,
        cp.kuberay_version().unwrap_or("none"),
        std::env::var("RAYGATE_KUBERAY_ARGS").unwrap_or_default()
    );
    println!("| raygate restarted on the full cluster: ready (initial lists) | {ready_s:.1} s |");
    println!("| raygate resident memory (now / peak) | {rss:.0} MiB / {peak:.0} MiB |");
    println!(
        "| capacity change → admission, {} upgrades (p50 / p99 / max) | {:.2} s / {:.2} s / {:.2} s |",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        percentile(&lat, 1.0)
    );
    println!(
        "| capacity change → all {} upgrades Completed | {completed_s:.0} s |",
        lat.len()
    );
    println!(
        "| reconcile duration from /metrics (p50 / p99, bucket upper bounds) | {} / {} |",
        q(0.5),
        q(0.99)
    );
    println!("| whole run | {:.0} s |", t_all.elapsed().as_secs_f64());
    rg.kill();
    Ok(())
}
