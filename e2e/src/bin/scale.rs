//! scale: raygate at cluster scale on the real control plane (kube-apiserver v1.36, kwok
//! nodes, the real KubeRay operator), measured, not asserted. Run through `e2e/scale`,
//! which builds raygate in release mode first.
//!
//! The story: `--nodes` kwok nodes (a fifth of the GPU nodes' worth of headroom missing),
//! raygate started, `--services` RayServices each with an UpgradePlan brought up by the real
//! operator, then plain pods up to `--pods` in all, and raygate restarted on that full
//! cluster; then `--waiting` of the services change their worker image at once and wait for
//! GPUs, and a batch of GPU nodes is added. Reported: raygate's time to ready on the full
//! cluster, its resident memory (now and peak), the latency of each admission as raygate
//! recorded it (from the event that let it through, the last added node as raygate received
//! it, to the gate write: its log line per admission and `raygate_admission_latency_seconds`;
//! the driver's own watch of the plans is printed beside it, as an upper bound only), the
//! stages in between, the time until every upgrade completed, the reconcile-duration p50/p99,
//! and raygate's cost to the apiserver read from the apiserver's audit log: raygate runs as
//! its own user (`raygate`, a token added to the control plane before the nodes), the only
//! user the audit policy logs, one event per request (RequestReceived). Each run's figures
//! are also written as JSON to `docs/scale-runs/` (`--out`).
//!
//! With `--dra` (issue 35) every fourth GPU node the services start on publishes its GPUs as
//! a ResourceSlice instead of allocatable `nvidia.com/gpu`, behind the DeviceClass `gpu`
//! (`extendedResourceName: nvidia.com/gpu`), so the figures are raygate's with its DRA
//! watches and device views busy; the table and the JSON say so (`dra`, and the counts).

// The figures' `json!` is larger than the default limit expands.
#![recursion_limit = "256"]

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use raygate_e2e::control_plane::Options;
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::dra;
use raygate_e2e::raygate::Spawn;
use raygate_e2e::{
    Check, ControlPlane, FakeNode, GpuRayService, Raygate, create_namespace, wait_for,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use jiff::Timestamp;

/// GPUs per GPU node; each RayService's worker group takes `WORKERS` of them.
const GPUS_PER_NODE: u32 = 8;
const WORKERS: u32 = 2;
const FILLER_PER_REQUEST: usize = 64;
/// Under `--dra`, one GPU node in this many is a DRA node (a quarter).
const DRA_ONE_IN: u32 = 4;
/// ResourceSlices created at a time, as many as nodes.
const SLICES_IN_FLIGHT: usize = 32;

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
    /// Seconds raygate is watched at rest (every plan decided, nothing changing) to count
    /// its requests per minute.
    #[arg(long, default_value_t = 60)]
    rest: u64,
    /// Where the run's figures go as JSON (a file per run); empty: nowhere.
    #[arg(long, default_value = "docs/scale-runs")]
    out: String,
    /// Where raygate's logs and the audit log are copied after the run (a directory per
    /// run under it); empty: not kept.
    #[arg(long, default_value_t = std::env::temp_dir().join("raygate-scale").display().to_string())]
    keep_logs: String,
    /// A note on the machine, kept in the JSON (e.g. what else ran on it).
    #[arg(long, default_value = "")]
    note: String,
    /// DRA GPUs: every fourth GPU node the services start on (gpu-0, gpu-4, ...) has no
    /// `nvidia.com/gpu` in its allocatable and publishes its 8 GPUs as one ResourceSlice of
    /// the driver gpu.example.com instead (one pool per node), and the DeviceClass `gpu`
    /// (`extendedResourceName: nvidia.com/gpu`) maps the services' GPU requests to them: the
    /// real scheduler allocates a ResourceClaim for each worker it puts there. The GPU nodes
    /// added for the capacity change stay device-plugin nodes, so each admission is still
    /// timed from the node it waited for. The JSON file's name ends in `-dra`.
    #[arg(long)]
    dra: bool,
    /// Run the restarted raygate (the one whose memory and latency are measured) under
    /// `heaptrack -o FILE`: a heap profile of the run (`heaptrack_print FILE.zst`). Its
    /// allocations then cost more, so the run's latencies are not comparable; the RSS figures
    /// are raygate's own (its process under the wrapper) and include heaptrack's library.
    #[arg(long, default_value = "")]
    heap_profile: String,
    /// The raygate binary to run instead of the release build beside the driver: `e2e/scale
    /// --musl` gives the image's static build (x86_64-unknown-linux-musl, musl's allocator),
    /// so memory and latency are those of raygate as the chart runs it. Kept in the JSON.
    #[arg(long, default_value = "")]
    raygate_bin: String,
}

/// Whether GPU node `i` publishes its GPUs as a ResourceSlice (under `--dra`).
fn is_dra_node(dra: bool, i: u32) -> bool {
    dra && i.is_multiple_of(DRA_ONE_IN)
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
/// first bucket holding that fraction of observations. The series of every other label
/// (`cause`) are summed per bound, as `sum by (le)` does (before, they were interleaved).
fn histogram_quantile(metrics: &str, name: &str, p: f64) -> Option<f64> {
    let series: Vec<(f64, f64)> = metrics
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
    let mut buckets: Vec<(f64, f64)> = vec![];
    for (le, n) in series {
        match buckets.iter_mut().find(|(b, _)| *b == le) {
            Some((_, sum)) => *sum += n,
            None => buckets.push((le, n)),
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    buckets
        .iter()
        .find(|(_, c)| *c >= p * total)
        .map(|(le, _)| *le)
}

/// Resident set size now and at its peak, in MiB, from /proc.
/// `pid`, or under a wrapper (`--heap-profile`) the raygate process it started.
fn raygate_pid(pid: u32) -> u32 {
    let comm = |p: u32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        if comm(p).trim() == "raygate" {
            return p;
        }
        let tasks = std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten();
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            todo.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    pid
}

fn rss_mib(pid: u32) -> Result<(f64, f64)> {
    let pid = raygate_pid(pid);
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

/// The driver's record of when it saw each waiting plan admitted, from a watch on the
/// plans started before the capacity change: no requests of its own in the measured window
/// (it listed every plan each 100 ms before, load on the apiserver it measures).
struct AdmissionWatch {
    events: futures::stream::BoxStream<'static, kube::runtime::watcher::Result<DynamicObject>>,
    keys: Vec<String>,
}

impl AdmissionWatch {
    async fn start(client: &Client, keys: Vec<String>) -> Result<Self> {
        use kube::runtime::{WatchStreamExt, watcher};
        let plans: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &ar("raygate.io", "v1alpha1", "UpgradePlan", "upgradeplans"),
        );
        let mut raw = watcher(plans, watcher::Config::default()).boxed();
        // The initial list first, so that nothing after it is missed.
        while let Some(ev) = raw.try_next().await? {
            if matches!(ev, watcher::Event::InitDone) {
                break;
            }
        }
        Ok(AdmissionWatch {
            events: raw.applied_objects().boxed(),
            keys,
        })
    }

    /// Seconds after `t0` at which each plan was first seen admitted (or past it).
    async fn wait(&mut self, t0: Instant, timeout: Duration) -> Result<BTreeMap<String, f64>> {
        let mut admitted: BTreeMap<String, f64> = BTreeMap::new();
        while admitted.len() < self.keys.len() {
            let left = timeout.saturating_sub(t0.elapsed());
            let next = tokio::time::timeout(left, self.events.try_next()).await;
            let Ok(next) = next else {
                bail!(
                    "only {} of {} upgrades admitted after {timeout:?}",
                    admitted.len(),
                    self.keys.len()
                );
            };
            let Some(p) = next? else {
                bail!("the plan watch ended");
            };
            let key = format!(
                "{}/{}",
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default()
            );
            let phase = p.data["status"]["phase"].as_str().unwrap_or("");
            if matches!(phase, "Admitted" | "Upgrading" | "Completed")
                && self.keys.contains(&key)
                && !admitted.contains_key(&key)
            {
                admitted.insert(key, t0.elapsed().as_secs_f64());
            }
        }
        Ok(admitted)
    }
}

async fn wait_phases(client: &Client, want: &[&str], n: usize, timeout: Duration) -> Result<()> {
    wait_for(&format!("{n} plans in {want:?}"), timeout, || async {
        // A list of every plan is load on the apiserver KubeRay is bringing the
        // services up on: once a second or so is enough for phases minutes long.
        tokio::time::sleep(Duration::from_secs(1)).await;
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

/// The audit policy of the run: every request of the user `raygate`, two events each (when
/// received, with its URI: `limit`, `continue`, `allowWatchBookmarks` show; and when
/// answered, which gives the apiserver's time for it), and the writes
/// to the GPU nodes added for the capacity change (`added`, by any user: kwok's status that
/// makes one Ready, the node controller's taint removal), so that an admission can be timed
/// from the apiserver's write of the node it waited for; nothing else (the other clients'
/// writes at this scale would slow the apiserver they are measured on).
fn audit_policy(added: &[String]) -> String {
    let names = added
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [ResponseStarted]
rules:
  - level: Metadata
    users: [raygate]
  - level: Metadata
    verbs: [create, update, patch]
    resources:
      - group: \"\"
        resources: [nodes, nodes/status]
        resourceNames: [{names}]
  - level: None
"
    )
}

/// raygate as its own user, the one the audit log records: a token (in `system:masters`,
/// as the admin) added to the control plane's token file, the policy above, the apiserver
/// restarted to read both. Returns raygate's kubeconfig.
fn raygate_identity(cp: &ControlPlane, added: &[String]) -> Result<PathBuf> {
    let dir = cp
        .audit_log_path()?
        .parent()
        .and_then(Path::parent)
        .context("control plane directory")?
        .to_path_buf();
    let token = format!("{:032x}", rand::random::<u128>());
    let mut tokens = std::fs::read_to_string(dir.join("tokens.csv"))?;
    if !tokens.ends_with('\n') {
        tokens.push('\n');
    }
    tokens.push_str(&format!("{token},raygate,raygate,\"system:masters\"\n"));
    std::fs::write(dir.join("tokens.csv"), tokens)?;
    std::fs::write(dir.join("audit-policy.yaml"), audit_policy(added))?;
    cp.restart("kube-apiserver")?;
    let admin = std::fs::read_to_string(dir.join("token"))?;
    let kubeconfig = std::fs::read_to_string(cp.kubeconfig_path())?.replace(admin.trim(), &token);
    let path = dir.join("raygate.kubeconfig");
    std::fs::write(&path, kubeconfig)?;
    Ok(path)
}

/// One request of raygate's, from the audit log.
#[derive(Debug, Clone)]
struct Request {
    at: Timestamp,
    verb: String,
    /// `resource` or `resource/subresource`.
    what: String,
    uri: String,
    user: String,
    /// The object's name.
    name: String,
    /// From received to answered, in the apiserver (its ResponseComplete event).
    apiserver_ms: Option<f64>,
}

fn audited(path: &Path) -> Result<Vec<Request>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    // auditID → milliseconds from received to answered.
    let answered: BTreeMap<String, f64> = events
        .iter()
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter_map(|e| {
            let from: Timestamp = e["requestReceivedTimestamp"].as_str()?.parse().ok()?;
            let to: Timestamp = e["stageTimestamp"].as_str()?.parse().ok()?;
            Some((e["auditID"].as_str()?.to_string(), secs(from, to) * 1e3))
        })
        .collect();
    Ok(events
        .iter()
        .filter(|e| e["stage"] == "RequestReceived")
        .filter_map(|e| {
            let o = &e["objectRef"];
            let mut what = o["resource"].as_str().unwrap_or("-").to_string();
            if let Some(sub) = o["subresource"].as_str() {
                what = format!("{what}/{sub}");
            }
            Some(Request {
                at: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
                verb: e["verb"].as_str()?.to_string(),
                what,
                uri: e["requestURI"].as_str().unwrap_or("").to_string(),
                user: e["user"]["username"].as_str().unwrap_or("").to_string(),
                name: o["name"].as_str().unwrap_or("").to_string(),
                apiserver_ms: e["auditID"]
                    .as_str()
                    .and_then(|id| answered.get(id).copied()),
            })
        })
        .collect())
}

fn between(reqs: &[Request], from: Timestamp, to: Timestamp) -> Vec<&Request> {
    reqs.iter().filter(|r| r.at >= from && r.at <= to).collect()
}

/// Leader election and long-running watches: not what a decision costs.
fn is_background(r: &Request) -> bool {
    r.verb == "watch" || r.what == "leases"
}

/// `verb resource` → count.
fn by_kind(reqs: &[&Request]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in reqs {
        *m.entry(format!("{} {}", r.verb, r.what)).or_default() += 1;
    }
    m
}

/// `key=value` or `key="value"` of a text log line: the last one (the event's fields come
/// after its spans', `reconcile{namespace=.. plan=..}`).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!(" {key}=");
    let rest = &line[line.rfind(&pat)? + pat.len()..];
    match rest.strip_prefix('"') {
        Some(q) => q.split('"').next(),
        None => rest.split_whitespace().next(),
    }
}

fn log_time(line: &str) -> Option<Timestamp> {
    line.split_whitespace().next()?.parse().ok()
}

/// One admission as raygate's log line "gate written" tells it.
#[derive(Debug, Clone)]
struct Admitted {
    plan: String,
    at: Timestamp,
    cause: String,
    cause_object: String,
    /// When raygate received the cause.
    cause_at: Option<Timestamp>,
    /// Milliseconds after the cause: total, and each stage.
    ms: BTreeMap<&'static str, f64>,
}

const STAGES: [&str; 6] = [
    "queued_ms",
    "started_ms",
    "pass_ms",
    "decided_ms",
    "status_ms",
    "latency_ms",
];

fn admissions_logged(logs: &str) -> Vec<Admitted> {
    logs.lines()
        .filter(|l| field(l, "stage") == Some("gate written") && field(l, "latency_ms").is_some())
        .filter_map(|l| {
            Some(Admitted {
                plan: field(l, "plan")?.to_string(),
                at: log_time(l)?,
                cause: field(l, "cause")?.to_string(),
                cause_object: field(l, "cause_object").unwrap_or("").to_string(),
                cause_at: field(l, "cause_at").and_then(|t| t.parse().ok()),
                ms: STAGES
                    .iter()
                    .filter_map(|k| Some((*k, field(l, k)?.parse::<f64>().ok()?)))
                    .collect(),
            })
        })
        .collect()
}

/// When raygate received the last of `nodes` as usable (its "event received" line).
fn last_node_received(logs: &str, nodes: &[String]) -> Option<Timestamp> {
    logs.lines()
        .filter(|l| {
            field(l, "stage") == Some("event received") && field(l, "cause") == Some("node")
        })
        .filter(|l| {
            field(l, "object")
                .and_then(|o| o.strip_prefix("node/"))
                .is_some_and(|n| nodes.iter().any(|x| x == n))
        })
        .filter_map(log_time)
        .max()
}

/// (count, total ms) of the admission passes raygate computed at or after `from`.
fn passes_after(logs: &str, from: Timestamp) -> (usize, f64) {
    logs.lines()
        .filter(|l| field(l, "stage") == Some("pass computed"))
        .filter(|l| log_time(l).is_some_and(|t| t >= from))
        .filter_map(|l| field(l, "ms")?.parse::<f64>().ok())
        .fold((0, 0.0), |(n, t), ms| (n + 1, t + ms))
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn secs(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The apiserver's own share of a start: every pod streamed as raygate's initial list asks
/// for it (a watch with `sendInitialEvents=true`), to a reader that only splits lines and
/// counts bytes, up to the bookmark that ends the initial events. Returns (seconds, events,
/// bytes).
async fn bare_streaming_list(client: &Client, path: &str) -> Result<(f64, u64, u64)> {
    use futures::io::AsyncBufReadExt;
    let uri = format!(
        "{path}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=900"
    );
    let req = hyper::Request::get(uri).body(Vec::new())?;
    let t = Instant::now();
    let body = client.request_stream(req).await?;
    futures::pin_mut!(body);
    let (mut events, mut bytes, mut line) = (0u64, 0u64, Vec::with_capacity(1 << 16));
    loop {
        line.clear();
        let n = body.read_until(b'\n', &mut line).await?;
        if n == 0 {
            bail!("{path}: the stream ended before its initial-events-end bookmark");
        }
        bytes += n as u64;
        events += 1;
        // The bookmark's annotation; an object's own text cannot hold it unescaped.
        let mark = br#""k8s.io/initial-events-end""#;
        if line.starts_with(br#"{"type":"BOOKMARK""#) && line.windows(mark.len()).any(|w| w == mark)
        {
            return Ok((t.elapsed().as_secs_f64(), events - 1, bytes));
        }
    }
}

/// The release profile raygate was built with: Cargo.toml's, or what the environment
/// `e2e/scale` ran in overrode (it builds with the same environment).
fn release_profile() -> String {
    let over: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("CARGO_PROFILE_RELEASE_"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if over.is_empty() {
        "Cargo.toml [profile.release]".to_string()
    } else {
        format!("Cargo.toml [profile.release] with {}", over.join(" "))
    }
}

fn git(args: &[&str]) -> String {
    std::process::Command::new("git")
        .args(args)
        .current_dir(repo_root())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The label names of the apiserver's `apiserver_request_total` (which client sent a
/// request is not one of them in v1.36: hence the audit log).
fn request_total_labels(cp: &ControlPlane) -> Vec<String> {
    let Ok(metrics) = cp.kubectl_ok(&["get", "--raw", "/metrics"]) else {
        return vec![];
    };
    let Some(line) = metrics
        .lines()
        .find(|l| l.starts_with("apiserver_request_total{"))
    else {
        return vec![];
    };
    line.split('{')
        .nth(1)
        .and_then(|r| r.split('}').next())
        .map(|ls| {
            ls.split("\",")
                .filter_map(|kv| kv.split('=').next())
                .map(|k| k.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
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
    let dra_nodes: Vec<String> = (0..gpu_nodes)
        .filter(|i| is_dra_node(a.dra, *i))
        .map(|i| format!("gpu-{i}"))
        .collect();
    eprintln!(
        "scale: {} nodes ({gpu_nodes} GPU + {extra_gpu_nodes} added later, {cpu_nodes} CPU), {} pods ({ray_pods} Ray + {fillers} plain), {} services, {} waiting",
        a.nodes, a.pods, a.services, a.waiting
    );
    if a.dra {
        eprintln!(
            "scale: DRA: {} of the {gpu_nodes} GPU nodes publish their GPUs as ResourceSlices",
            dra_nodes.len()
        );
    }

    let load_start = loadavg();
    // The checkout as built (e2e/scale builds just before): later commits during the run
    // (docs) are not what ran.
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let commit = git(&["rev-parse", "HEAD"]);
    let added_names: Vec<String> = (0..extra_gpu_nodes)
        .map(|i| format!("gpu-new-{i}"))
        .collect();
    let cp = ControlPlane::start_audited(Options::from_env()?)?;
    let kubeconfig = raygate_identity(&cp, &added_names)?;
    let binary = (!a.raygate_bin.is_empty()).then(|| std::path::Path::new(&a.raygate_bin));
    let spawn = Spawn {
        kubeconfig: Some(&kubeconfig),
        binary,
        // What the harness gives this checkout's binary by default, and withholds from an
        // older one named by `binary`: the chart's values, for whichever build runs here.
        args: &["--max-priority=0", "--kueue=false"],
        ..Spawn::default()
    };
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))?;
    let client = cp.client().await?;

    let t = Instant::now();
    let mut nodes: Vec<FakeNode> = (0..gpu_nodes)
        .map(|i| {
            let node = FakeNode::new(format!("gpu-{i}"))
                .cpu("96")
                .memory("768Gi")
                .label("raygate.io/pool", "gpu");
            if is_dra_node(a.dra, i) {
                // Its GPUs are its ResourceSlice's devices only, as with a DRA driver.
                node.label("raygate.io/gpus", "dra")
            } else {
                node.gpu(GPUS_PER_NODE)
            }
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
    // The DRA driver's view, before any GPU pod is scheduled: the class that maps
    // `nvidia.com/gpu` to devices, and each DRA node's pool.
    let dra_slices = if a.dra {
        let t = Instant::now();
        dra::classes_api(&client)
            .create(
                &PostParams::default(),
                &serde_json::from_value(dra::gpu_class(dra::EVERY_DEVICE))?,
            )
            .await
            .context("create the DeviceClass gpu")?;
        let n = dra::publish_pools(
            &client,
            &dra_nodes,
            GPUS_PER_NODE as usize,
            SLICES_IN_FLIGHT,
        )
        .await?;
        eprintln!(
            "scale: DeviceClass gpu and {n} ResourceSlices ({} devices) created in {:.1} s",
            n * GPUS_PER_NODE as usize,
            t.elapsed().as_secs_f64()
        );
        n
    } else {
        0
    };
    let dra_devices = dra_slices * GPUS_PER_NODE as usize;

    // raygate first, then the services: KubeRay brings them up while kwok has only their
    // pods to start (with 29,400 filler pods queued ahead, kwok's four pod workers kept the
    // Ray pods Pending for minutes on 2 cores).
    let mut rg = Raygate::spawn_with(&cp, &spawn)?;
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
    let heap_wrapper: Vec<&str> = if a.heap_profile.is_empty() {
        vec![]
    } else {
        vec!["heaptrack", "-o", a.heap_profile.as_str()]
    };
    let t = Instant::now();
    let restarted_at = Timestamp::now();
    // Ready is /readyz 200: every cache synced (the harness's own wait stops at 60 s).
    let mut rg = Raygate::spawn_with(
        &cp,
        &Spawn {
            unready: true,
            wrapper: &heap_wrapper,
            ..spawn
        },
    )?;
    rg.wait_ready(Duration::from_secs(900))?;
    let ready_s = t.elapsed().as_secs_f64();
    eprintln!("scale: raygate restarted, ready in {ready_s:.1} s");
    let (_, peak_after_lists) = rss_mib(rg.pid())?;
    // At rest: every plan decided again after the restart, nothing changing.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let rest_from = Timestamp::now();
    tokio::time::sleep(Duration::from_secs(a.rest)).await;
    let rest_to = Timestamp::now();
    eprintln!("scale: {} s at rest watched", a.rest);
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
    let keys: Vec<String> = waiting.iter().map(|(ns, n)| format!("{ns}/{n}")).collect();
    let mut admissions = AdmissionWatch::start(&client, keys.clone()).await?;
    let capacity_at = Timestamp::now();
    stream::iter(added.iter().map(|n| n.create(&client)))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let t0 = Instant::now();
    let admitted = admissions.wait(t0, timeout).await?;
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
    // (in all, allocated): the claims the scheduler made for the workers on DRA nodes.
    let dra_claims = if a.dra {
        let claims = dra::claims_api(&client)
            .list(&ListParams::default())
            .await?
            .items;
        let allocated = claims
            .iter()
            .filter(|c| !c.data["status"]["allocation"].is_null())
            .count();
        Some((claims.len(), allocated))
    } else {
        None
    };
    // The apiserver's own share of the restart's ready time, on the same cluster: every pod
    // streamed as raygate's initial list asks for it, to a reader that decodes nothing.
    let (bare_s, bare_pods, bare_bytes) = bare_streaming_list(&client, "/api/v1/pods")
        .await
        .context("the bare streaming list of pods")?;
    eprintln!(
        "scale: {bare_pods} pods ({:.0} MB) streamed to a bare reader in {bare_s:.1} s",
        bare_bytes as f64 / 1e6
    );
    let q = |name: &str, p| {
        histogram_quantile(&metrics, name, p)
            .map(|s| format!("{:.0} ms", s * 1000.0))
            .unwrap_or_else(|| "n/a".into())
    };

    // raygate's own record of each admission.
    let logs = rg.logs();
    let wanted: Vec<&str> = waiting.iter().map(|(_, n)| n.as_str()).collect();
    let mut logged: BTreeMap<String, Admitted> = BTreeMap::new();
    for adm in admissions_logged(&logs) {
        if wanted.contains(&adm.plan.as_str()) && adm.at >= capacity_at {
            logged.entry(adm.plan.clone()).or_insert(adm);
        }
    }
    let last_node = last_node_received(&logs, &added_names);
    // -1: a stage the decision did not go through (no pass read).
    let stage = |k: &str| {
        sorted(
            logged
                .values()
                .filter_map(|a| a.ms.get(k).copied())
                .filter(|ms| *ms >= 0.0)
                .collect(),
        )
    };
    let latency = sorted(stage("latency_ms").iter().map(|ms| ms / 1e3).collect());
    let from_last_node = sorted(
        last_node
            .map(|n| logged.values().map(|a| secs(n, a.at)).collect())
            .unwrap_or_default(),
    );
    let mut causes: BTreeMap<String, usize> = BTreeMap::new();
    for a in logged.values() {
        *causes.entry(a.cause.clone()).or_default() += 1;
    }
    let last_gate = logged.values().map(|a| a.at).max().unwrap_or(capacity_at);
    let (passes, pass_ms) = passes_after(&logs, capacity_at);

    // raygate's requests, from the apiserver's audit log.
    let (reqs, node_writes): (Vec<Request>, Vec<Request>) = audited(&cp.audit_log_path()?)?
        .into_iter()
        .partition(|r| r.user == "raygate");
    // Per admission: from the apiserver's last write of the node it waited for (its cause)
    // before raygate received that node, to the gate write; and that watch delay.
    let (mut from_write, mut watch_delay) = (Vec::new(), Vec::new());
    for a in logged.values() {
        let (Some(node), Some(cause_at)) = (a.cause_object.strip_prefix("node/"), a.cause_at)
        else {
            continue;
        };
        if let Some(w) = node_writes
            .iter()
            .filter(|w| w.name == node && w.at <= cause_at)
            .map(|w| w.at)
            .max()
        {
            from_write.push(secs(w, a.at));
            watch_delay.push(secs(w, cause_at));
        }
    }
    let (from_write, watch_delay) = (sorted(from_write), sorted(watch_delay));
    let startup = between(&reqs, restarted_at, rest_from);
    let lists: Vec<&&Request> = startup.iter().filter(|r| r.verb == "list").collect();
    let paged = lists.iter().filter(|r| r.uri.contains("limit=")).count();
    let continued = lists.iter().filter(|r| r.uri.contains("continue=")).count();
    let watches: Vec<&&Request> = startup.iter().filter(|r| r.verb == "watch").collect();
    let bookmarked = watches
        .iter()
        .filter(|r| r.uri.contains("allowWatchBookmarks=true"))
        .count();
    // Streaming lists (raygate's --initial-lists, issue 35): a watch that sends the
    // initial state instead of a list.
    let streamed = watches
        .iter()
        .filter(|r| r.uri.contains("sendInitialEvents=true"))
        .count();
    let rest = between(&reqs, rest_from, rest_to);
    let minutes = secs(rest_from, rest_to) / 60.0;
    let rest_per_min = rest.len() as f64 / minutes;
    let rest_foreground: Vec<&Request> =
        rest.iter().copied().filter(|r| !is_background(r)).collect();
    let admission_window = between(&reqs, capacity_at, last_gate + Duration::from_millis(500));
    let admission_foreground: Vec<&Request> = admission_window
        .iter()
        .copied()
        .filter(|r| !is_background(r))
        .collect();
    let per_admission = admission_foreground.len() as f64 / logged.len().max(1) as f64;
    // Per admission, its own: the requests on its plan and its RayService from the capacity
    // change to its gate write (the window above also holds the next steps of the plans
    // admitted first, and other plans' writes), plus the Events created in the window, per
    // admission (an Event's name is not in the audit record of its create).
    let events_in_window = admission_foreground
        .iter()
        .filter(|r| r.what == "events")
        .count();
    let own: Vec<f64> = logged
        .values()
        .map(|adm| {
            admission_foreground
                .iter()
                .filter(|r| r.at <= adm.at && r.name == adm.plan)
                .filter(|r| r.what.starts_with("upgradeplans") || r.what == "rayservices")
                .count() as f64
        })
        .collect();
    let own_per_admission = own.iter().sum::<f64>() / own.len().max(1) as f64
        + events_in_window as f64 / logged.len().max(1) as f64;
    // The apiserver's time for raygate's writes in the window, by kind: p50 / max ms.
    let mut apiserver_ms: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in &admission_foreground {
        if let Some(ms) = r.apiserver_ms {
            apiserver_ms
                .entry(format!("{} {}", r.verb, r.what))
                .or_default()
                .push(ms);
        }
    }
    let apiserver_ms: BTreeMap<String, (f64, f64)> = apiserver_ms
        .into_iter()
        .map(|(k, v)| {
            let v = sorted(v);
            (
                k,
                (percentile(&v, 0.5).round(), percentile(&v, 1.0).round()),
            )
        })
        .collect();
    let labels = request_total_labels(&cp);

    let p = percentile;
    println!("| what | measured |");
    println!("|---|---|");
    println!(
        "| cluster | {} nodes, {total_pods} pods, {} RayServices with UpgradePlans (KubeRay {} {}) |",
        a.nodes,
        a.services,
        cp.kuberay_version().unwrap_or("none"),
        std::env::var("RAYGATE_KUBERAY_ARGS").unwrap_or_default()
    );
    match dra_claims {
        Some((claims, allocated)) => println!(
            "| DRA | on: {} of {gpu_nodes} GPU nodes publish their GPUs as ResourceSlices instead of allocatable ({dra_slices} slices, one pool per node, {dra_devices} devices, driver {}), DeviceClass `gpu` with `extendedResourceName: nvidia.com/gpu`; the added GPU nodes are device-plugin nodes; ResourceClaims at the end: {claims} ({allocated} allocated) |",
            dra_nodes.len(),
            dra::DRIVER
        ),
        None => println!("| DRA | off: every GPU is allocatable `nvidia.com/gpu` |"),
    }
    println!(
        "| machine | {} cores; load average at start {load_start}, at the end {} |",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    println!("| raygate restarted on the full cluster: ready (initial lists) | {ready_s:.1} s |");
    println!(
        "| the apiserver alone: every pod streamed as that list asks (`sendInitialEvents=true`) to a reader that decodes nothing | {bare_s:.1} s ({bare_pods} pods, {:.0} MB) |",
        bare_bytes as f64 / 1e6
    );
    println!(
        "| raygate resident memory (now / peak; peak right after the initial lists) | {rss:.0} MiB / {peak:.0} MiB; {peak_after_lists:.0} MiB |"
    );
    println!(
        "| admission latency as raygate recorded it: cause → gate write, {} of {} upgrades (p50 / p99 / max) | {:.2} s / {:.2} s / {:.2} s (causes: {causes:?}) |",
        latency.len(),
        a.waiting,
        p(&latency, 0.5),
        p(&latency, 0.99),
        p(&latency, 1.0)
    );
    println!(
        "| the apiserver's write of the node each admission waited for (its cause) → gate write (p50 / p99 / max); that write → raygate received it (p50 / max) | {:.2} s / {:.2} s / {:.2} s; {:.3} s / {:.3} s |",
        p(&from_write, 0.5),
        p(&from_write, 0.99),
        p(&from_write, 1.0),
        p(&watch_delay, 0.5),
        p(&watch_delay, 1.0)
    );
    println!(
        "| last added node received by raygate → gate write (p50 / p99 / max) | {:.2} s / {:.2} s / {:.2} s |",
        p(&from_last_node, 0.5),
        p(&from_last_node, 0.99),
        p(&from_last_node, 1.0)
    );
    let stages: Vec<String> = STAGES
        .iter()
        .map(|k| {
            let v = stage(k);
            let name = k.trim_end_matches("_ms");
            if v.is_empty() {
                // Every one before the cause: already queued (or started) by an
                // earlier event when the cause arrived.
                format!("{name} before the cause")
            } else {
                format!("{name} {:.0} / {:.0}", p(&v, 0.5), p(&v, 1.0))
            }
        })
        .collect();
    println!(
        "| stages, ms after the cause (p50 / max) | {} |",
        stages.join("; ")
    );
    println!(
        "| `raygate_admission_latency_seconds` (p50 / p99, bucket upper bounds) | {} / {} |",
        q("raygate_admission_latency_seconds", 0.5),
        q("raygate_admission_latency_seconds", 0.99)
    );
    println!(
        "| admission passes computed from the capacity change to the last gate write | {passes} ({pass_ms:.0} ms in all) |"
    );
    println!(
        "| the driver's watch of the plans: capacity change (its last node created) → admitted seen (p50 / p99; an upper bound) | {:.2} s / {:.2} s |",
        p(&lat, 0.5),
        p(&lat, 0.99)
    );
    println!(
        "| capacity change → all {} upgrades Completed | {completed_s:.0} s |",
        lat.len()
    );
    println!(
        "| reconcile duration from /metrics (p50 / p99, bucket upper bounds) | {} / {} |",
        q("raygate_reconcile_duration_seconds", 0.5),
        q("raygate_reconcile_duration_seconds", 0.99)
    );
    println!(
        "| API requests per admission (audit log; capacity change to the last gate write, leases and watches left out) | {per_admission:.2} ({:?}) |",
        by_kind(&admission_foreground)
    );
    println!(
        "| API requests per admission, its own (on its plan and RayService until its gate write, + the window's Events per admission) | {own_per_admission:.2} |"
    );
    println!(
        "| the apiserver's time for raygate's writes in that window, by kind (received → answered, p50 / max ms) | {apiserver_ms:?} |"
    );
    println!(
        "| API requests per minute at rest ({} s) | {rest_per_min:.1} in all; {:.1} without leases and watches ({:?}) |",
        a.rest,
        rest_foreground.len() as f64 / minutes,
        by_kind(&rest)
    );
    println!(
        "| initial lists after the restart | {} list requests, {paged} with `limit`, {continued} with `continue` ({:?}); {} watches, {bookmarked} with `allowWatchBookmarks=true`, {streamed} streaming lists (`sendInitialEvents=true`) |",
        lists.len(),
        by_kind(&lists.iter().map(|r| **r).collect::<Vec<_>>()),
        watches.len()
    );
    println!("| `apiserver_request_total` labels | {labels:?} |");
    println!("| whole run | {:.0} s |", t_all.elapsed().as_secs_f64());

    if !a.out.is_empty() {
        let date = Timestamp::now();
        let mut figures = json!({
            "date": date.to_string(),
            "commit": commit,
            "commit_dirty": dirty,
            "nodes": a.nodes,
            "pods": total_pods,
            "services": a.services,
            "waiting": a.waiting,
            "admitted": logged.len(),
            "latency_p50_s": p(&latency, 0.5),
            "latency_p99_s": p(&latency, 0.99),
            "latency_max_s": p(&latency, 1.0),
            "latency_from": "raygate's log line per admission: the event that let it through (as raygate received it) to the gate write",
            "causes": causes,
            "cause_objects": logged.values().map(|a| a.cause_object.clone()).collect::<std::collections::BTreeSet<_>>(),
            "node_write_to_gate_p50_s": p(&from_write, 0.5),
            "node_write_to_gate_p99_s": p(&from_write, 0.99),
            "node_write_to_gate_max_s": p(&from_write, 1.0),
            "node_write_to_received_p50_s": p(&watch_delay, 0.5),
            "node_write_to_received_max_s": p(&watch_delay, 1.0),
            "last_added_node_to_gate_p50_s": p(&from_last_node, 0.5),
            "last_added_node_to_gate_p99_s": p(&from_last_node, 0.99),
            "stages_ms_after_cause_p50": STAGES.iter().map(|k| (k.to_string(), p(&stage(k), 0.5))).collect::<BTreeMap<_, _>>(),
            "stages_ms_after_cause_max": STAGES.iter().map(|k| (k.to_string(), p(&stage(k), 1.0))).collect::<BTreeMap<_, _>>(),
            "histogram_p50_le_s": histogram_quantile(&metrics, "raygate_admission_latency_seconds", 0.5),
            "histogram_p99_le_s": histogram_quantile(&metrics, "raygate_admission_latency_seconds", 0.99),
            "passes_computed": passes,
            "passes_ms": pass_ms,
            "driver_poll_p50_s": p(&lat, 0.5),
            "driver_poll_p99_s": p(&lat, 0.99),
            "completed_s": completed_s,
            "api_requests_per_admission": per_admission,
            "api_requests_per_admission_by_kind": by_kind(&admission_foreground),
            "api_requests_per_admission_own": own_per_admission,
            "apiserver_ms_in_admission_window_p50_max": apiserver_ms,
            "api_requests_per_minute_at_rest": rest_per_min,
            "api_requests_per_minute_at_rest_without_leases_and_watches": rest_foreground.len() as f64 / minutes,
            "api_requests_at_rest_by_kind": by_kind(&rest),
            "rest_s": a.rest,
            "initial_lists": lists.len(),
            "initial_lists_with_limit": paged,
            "initial_lists_with_continue": continued,
            "initial_lists_by_kind": by_kind(&lists.iter().map(|r| **r).collect::<Vec<_>>()),
            "initial_watches": watches.len(),
            "initial_watches_with_bookmarks": bookmarked,
            "initial_streaming_lists": streamed,
            "apiserver_request_total_labels": labels,
            "rss_mib": peak,
            "rss_mib_now": rss,
            "rss_mib_after_initial_lists": peak_after_lists,
            "ready_s": ready_s,
            "whole_run_s": t_all.elapsed().as_secs_f64(),
            "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "load_average_start": load_start,
            "load_average_end": loadavg(),
            "note": a.note,
            "kuberay": cp.kuberay_version().unwrap_or("none"),
            "kuberay_args": std::env::var("RAYGATE_KUBERAY_ARGS").unwrap_or_default(),
            "kwok_parallelism": std::env::var("RAYGATE_KWOK_PARALLELISM").unwrap_or_default(),
            "release_profile": if a.raygate_bin.is_empty() {
                release_profile()
            } else {
                "--raygate-bin's (e2e/scale --musl: Cargo.toml [profile.release])".to_string()
            },
        });
        // Set apart from the macro above, which is at the recursion limit.
        figures["dra"] = json!(a.dra);
        figures["dra_nodes"] = json!(dra_nodes.len());
        figures["dra_resourceslices"] = json!(dra_slices);
        figures["dra_devices"] = json!(dra_devices);
        figures["dra_driver"] = json!(a.dra.then_some(dra::DRIVER));
        figures["dra_resourceclaims_at_end"] = json!(dra_claims.map(|(n, _)| n));
        figures["dra_resourceclaims_allocated_at_end"] = json!(dra_claims.map(|(_, n)| n));
        figures["bare_pod_stream_s"] = json!(bare_s);
        figures["bare_pod_stream_pods"] = json!(bare_pods);
        figures["bare_pod_stream_bytes"] = json!(bare_bytes);
        figures["raygate_bin"] = json!(if a.raygate_bin.is_empty() {
            "release build of this checkout (host target)"
        } else {
            a.raygate_bin.as_str()
        });
        figures["heap_profile"] = json!((!a.heap_profile.is_empty()).then_some(&a.heap_profile));
        let dir = repo_root().join(&a.out);
        std::fs::create_dir_all(&dir)?;
        let stamp = date.strftime("%Y-%m-%dT%H%M%SZ");
        let suffix = if a.dra { "-dra" } else { "" };
        let file = dir.join(format!("{stamp}-{}nodes{suffix}.json", a.nodes));
        std::fs::write(&file, serde_json::to_string_pretty(&figures)? + "\n")?;
        eprintln!("scale: figures written to {}", file.display());
    }
    if !a.keep_logs.is_empty() {
        let dir =
            Path::new(&a.keep_logs).join(Timestamp::now().strftime("%Y-%m-%dT%H%M%SZ").to_string());
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(cp.log_dir())? {
            let path = entry?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name == "audit.log" || name.starts_with("raygate") {
                std::fs::copy(&path, dir.join(&name))?;
            }
        }
        eprintln!(
            "scale: raygate's logs and the audit log kept in {}",
            dir.display()
        );
    }
    if !a.heap_profile.is_empty() {
        // raygate itself, not the wrapper: heaptrack writes its profile once raygate exits.
        let own = raygate_pid(rg.pid());
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &own.to_string()])
            .status();
        if rg.wait_exit(Duration::from_secs(120)).is_none() {
            eprintln!("scale: heaptrack did not finish within 120 s");
        }
        eprintln!("scale: heap profile in {}*", a.heap_profile);
    }
    rg.kill();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_of_the_gpu_nodes_are_dra_nodes_under_dra_only() {
        let dra: Vec<u32> = (0..8).filter(|i| is_dra_node(true, *i)).collect();
        assert_eq!(dra, [0, 4]);
        assert!((0..8).all(|i| !is_dra_node(false, i)));
    }

    #[test]
    fn a_histogram_quantile_sums_the_series_of_each_bound() {
        let m = "x_bucket{cause=\"node\",le=\"0.2\"} 0\n\
                 x_bucket{cause=\"node\",le=\"0.5\"} 8\n\
                 x_bucket{cause=\"node\",le=\"+Inf\"} 10\n\
                 x_bucket{cause=\"pod\",le=\"0.2\"} 1\n\
                 x_bucket{cause=\"pod\",le=\"0.5\"} 1\n\
                 x_bucket{cause=\"pod\",le=\"+Inf\"} 1\n";
        assert_eq!(histogram_quantile(m, "x", 0.05), Some(0.2));
        assert_eq!(histogram_quantile(m, "x", 0.5), Some(0.5));
        assert_eq!(histogram_quantile(m, "x", 0.99), Some(f64::INFINITY));
    }

    #[test]
    fn a_gate_line_is_read_from_raygates_text_log() {
        let line = "2026-12-04T22:40:01.743512Z  INFO reconcile{namespace=svc-ab plan=svc-3}: \
            raygate::controller: gate set plan=svc-3 rayservice=svc-3 gate=\"NewCluster\" \
            stage=\"gate written\" cause=\"node\" cause_object=node/gpu-new-1 \
            cause_at=2026-12-04T22:40:01.331Z latency_ms=412 queued_ms=0 started_ms=201 \
            pass_ms=-1 decided_ms=229 status_ms=318";
        let a = admissions_logged(line);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].plan, "svc-3");
        assert_eq!(a[0].cause, "node");
        assert_eq!(a[0].cause_object, "node/gpu-new-1");
        assert_eq!(
            a[0].cause_at.map(|t| t.to_string()).as_deref(),
            Some("2026-12-04T22:40:01.331Z")
        );
        assert_eq!(a[0].ms["latency_ms"], 412.0);
        assert_eq!(a[0].ms["pass_ms"], -1.0);
        assert_eq!(a[0].at.to_string(), "2026-12-04T22:40:01.743512Z");
    }
}
