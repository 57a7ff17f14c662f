//! Differential conformance of `raygate explain` against the real KubeRay operator.
//!
//! The corpus (`e2e/conformance/cases/*.yaml`, each a JSON Patch against
//! `e2e/conformance/base.yaml`, a short why, and the outcome expected from reading KubeRay's
//! source per release) is run against each pinned KubeRay release on one control plane:
//! every case gets its own RayService, all are created at once, settle (active cluster,
//! apps RUNNING in the ray-head stand-in, `observedGeneration` caught up), are changed at
//! once and observed together. What the operator did is one of:
//!
//! - `NewCluster`: a second (pending) RayCluster was prepared;
//! - `InPlace`: the active RayCluster's spec was updated (its `metadata.generation` moved);
//! - `Serve`: only the Serve config was resubmitted to the active cluster (ray-head's
//!   `configPuts` for it grew); `InPlace+Serve` both;
//! - `Nothing`: none of these, decided once the operator has caught up with the change
//!   (`observedGeneration`, or a validation-failure event / condition: a rejected RayService
//!   never catches up) and nothing moved for a quiet window.
//!
//! `raygate explain` (the real CLI binary) must predict exactly that, RayService vs
//! RayService and live RayCluster (`kubectl get raycluster -o yaml`) vs RayService; the
//! latter cannot know the previous Serve config, so it is held to the cluster part only.
//!
//! Cases with a `gated` outcome (the incremental-upgrade fields: `upgradeStrategy.type:
//! NewClusterWithIncrementalUpgrade`, `clusterUpgradeOptions`) also run against each release
//! started with its `RayServiceIncrementalUpgrade` feature gate on (`up --incremental`, which
//! installs the Gateway API CRDs it needs), on a control plane of their own, both releases
//! at once; raygate predicts them with `--kuberay-incremental-upgrades=true`. Only whether a
//! pending cluster is prepared is observed there, which KubeRay decides before it looks at
//! the Gateway, so no gateway controller is needed.
//! The agreement table is docs/kuberay-conformance.md, followed by the hand-kept
//! `e2e/conformance/findings.md` (every disagreement found, what KubeRay really does and
//! what raygate assumed); a stale copy fails the test, `RAYGATE_BLESS=1` rewrites it.
//!
//! Run: `e2e/setup`, `cargo build -p raygate`, then
//! `cargo test -p raygate-e2e --test conformance` (about 3 min per release on 2 cores).
//! A disagreement is fixed in `src/kuberay`, never here.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Event;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use raygate_e2e::{ControlPlane, FakeNode, KubeRay, Options};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The KubeRay releases the corpus runs against (v1.7.0 is not served by the module proxy).
const VERSIONS: &[&str] = &["v1.6.2", "v1.5.2"];
const TABLE: &str = "docs/kuberay-conformance.md";
const BLESS_ENV: &str = "RAYGATE_BLESS";
/// Run only this release (for development; the table is then neither checked nor written).
const ONLY_ENV: &str = "RAYGATE_CONFORMANCE_ONLY";
const NAMESPACE: &str = "conformance";
/// How long nothing may move before "nothing (more) happened" is decided. KubeRay requeues
/// every RayService every 2 s, so this is several reconciles of each.
const QUIET: Duration = Duration::from_secs(6);
const SETTLE_TIMEOUT: Duration = Duration::from_secs(240);
const OBSERVE_TIMEOUT: Duration = Duration::from_secs(150);

/// What the operator did with a change (or what raygate predicts it does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    NewCluster,
    InPlace,
    InPlaceServe,
    Serve,
    Nothing,
}

impl Outcome {
    fn parse(s: &str) -> Result<Outcome> {
        Ok(match s {
            "NewCluster" => Outcome::NewCluster,
            "InPlace" => Outcome::InPlace,
            "InPlace+Serve" => Outcome::InPlaceServe,
            "Serve" => Outcome::Serve,
            "Nothing" => Outcome::Nothing,
            other => bail!(
                "unknown outcome {other:?} (NewCluster, InPlace, InPlace+Serve, Serve, Nothing)"
            ),
        })
    }

    /// The part a live-RayCluster comparison can know: what happens to the clusters.
    fn cluster_part(self) -> Outcome {
        match self {
            Outcome::InPlaceServe => Outcome::InPlace,
            Outcome::Serve => Outcome::Nothing,
            o => o,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::NewCluster => "NewCluster",
            Outcome::InPlace => "InPlace",
            Outcome::InPlaceServe => "InPlace+Serve",
            Outcome::Serve => "Serve",
            Outcome::Nothing => "Nothing",
        })
    }
}

/// One corpus entry, resolved to full manifests.
struct Case {
    id: String,
    why: String,
    base: Value,
    changed: Value,
    expect: BTreeMap<String, Outcome>,
    /// With the operator's RayServiceIncrementalUpgrade feature gate on (`gated`).
    gated: Option<BTreeMap<String, Outcome>>,
}

impl Case {
    fn expected(&self, version: &str, gate: bool) -> Option<Outcome> {
        if gate {
            self.gated.as_ref()?.get(version).copied()
        } else {
            self.expect.get(version).copied()
        }
    }
}

/// An outcome for every release, or a map release -> outcome.
fn parse_expect(v: Option<&Value>, what: &str) -> Result<BTreeMap<String, Outcome>> {
    Ok(match v {
        Some(Value::String(s)) => {
            let o = Outcome::parse(s).with_context(|| what.to_string())?;
            VERSIONS.iter().map(|v| (v.to_string(), o)).collect()
        }
        Some(Value::Object(m)) => {
            let mut e = BTreeMap::new();
            for v in VERSIONS {
                let s = m
                    .get(*v)
                    .and_then(Value::as_str)
                    .with_context(|| format!("{what}.{v} missing"))?;
                e.insert(v.to_string(), Outcome::parse(s)?);
            }
            ensure!(m.len() == VERSIONS.len(), "{what} has unknown versions");
            e
        }
        _ => bail!("{what} must be an outcome or a map version -> outcome"),
    })
}

fn e2e_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn repo_root() -> PathBuf {
    raygate_e2e::control_plane::repo_root()
}

fn read_yaml(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    serde_saphyr::from_str(&text).with_context(|| format!("parse {}", path.display()))
}

fn apply_ops(doc: &mut Value, ops: Option<&Value>, what: &str) -> Result<()> {
    let Some(ops) = ops else { return Ok(()) };
    let patch: json_patch::Patch =
        serde_json::from_value(ops.clone()).with_context(|| format!("{what}: not a JSON Patch"))?;
    json_patch::patch(doc, &patch).with_context(|| format!("{what}: patch does not apply"))
}

fn load_corpus() -> Result<Vec<Case>> {
    let dir = e2e_dir().join("conformance");
    let base = read_yaml(&dir.join("base.yaml"))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("cases"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for path in files {
        let id = path
            .file_stem()
            .and_then(|s| s.to_str())
            .context("case file name")?
            .to_string();
        let what = format!("case {id}");
        ensure!(
            id.len() <= 30
                && id.starts_with(|c: char| c.is_ascii_lowercase())
                && id
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{what}: the file name is the RayService name: a DNS-1035 label of at most 30 characters"
        );
        let doc = read_yaml(&path)?;
        let obj = doc
            .as_object()
            .with_context(|| format!("{what}: not a mapping"))?;
        for k in obj.keys() {
            ensure!(
                ["why", "base", "change", "expect", "gated"].contains(&k.as_str()),
                "{what}: unknown key {k:?} (why, base, change, expect, gated)"
            );
        }
        let why = obj
            .get("why")
            .and_then(Value::as_str)
            .with_context(|| format!("{what}: `why` missing"))?
            .to_string();
        let mut b = base.clone();
        b["metadata"]["name"] = json!(id);
        apply_ops(&mut b, obj.get("base"), &format!("{what} base"))?;
        let mut changed = b.clone();
        apply_ops(&mut changed, obj.get("change"), &format!("{what} change"))?;
        ensure!(changed != b, "{what}: the change changes nothing");
        let expect = parse_expect(obj.get("expect"), &format!("{what}: expect"))?;
        let gated = obj
            .get("gated")
            .map(|g| parse_expect(Some(g), &format!("{what}: gated")))
            .transpose()?;
        cases.push(Case {
            id,
            why,
            base: b,
            changed,
            expect,
            gated,
        });
    }
    Ok(cases)
}

fn raygate_bin() -> PathBuf {
    raygate_e2e::workspace_bin("raygate").unwrap_or_else(|| {
        panic!("raygate binary not found next to the test executable: run `cargo build -p raygate` first")
    })
}

/// `raygate explain --old OLD --new NEW --kuberay-version V -o json`, with
/// `--kuberay-incremental-upgrades=true` when the operator runs with that feature gate.
fn explain(bin: &Path, old: &Path, new: &Path, version: &str, gate: bool) -> Result<Value> {
    let out = Command::new(bin)
        .arg("explain")
        .arg("--old")
        .arg(old)
        .arg("--new")
        .arg(new)
        .args(["--kuberay-version", version, "-o", "json"])
        .args(gate.then_some("--kuberay-incremental-upgrades=true"))
        .output()
        .with_context(|| format!("run {}", bin.display()))?;
    ensure!(
        out.status.success(),
        "raygate explain --old {} --new {} failed ({}): {}",
        old.display(),
        new.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).context("raygate explain -o json: not JSON")
}

/// raygate's classification as an observable outcome.
fn predicted(c: &Value) -> Result<Outcome> {
    let serve = c["serveConfigPaths"]
        .as_array()
        .is_some_and(|a| !a.is_empty());
    let rejected = c["rejected"].as_bool().unwrap_or(false);
    Ok(match c["verdict"].as_str().unwrap_or("") {
        "NewCluster" => Outcome::NewCluster,
        "InPlaceClusterUpdate" if serve => Outcome::InPlaceServe,
        "InPlaceClusterUpdate" => Outcome::InPlace,
        "ServeConfigUpdate" => Outcome::Serve,
        // A needed cluster change KubeRay will not make; the Serve config is still
        // submitted to the active cluster unless validation rejected the RayService.
        "Held" if serve && !rejected => Outcome::Serve,
        "Held" | "NoChange" => Outcome::Nothing,
        other => bail!("unknown verdict {other:?} in {c}"),
    })
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    std::fs::write(path, serde_json::to_vec_pretty(v)?)
        .with_context(|| format!("write {}", path.display()))
}

/// Runs `f` over `items` on a few threads (each call runs the raygate CLI), in order.
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> Result<R> + Sync) -> Result<Vec<R>> {
    const THREADS: usize = 4;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<Result<R>>>> =
        items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(item) = items.get(i) else { break };
                    let r = f(item);
                    if let Ok(mut slot) = slots[i].lock() {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .ok()
                .flatten()
                .unwrap_or_else(|| Err(anyhow::anyhow!("a prediction thread panicked")))
        })
        .collect()
}

/// The RayService-vs-RayService predictions of every case for one release.
fn predict_all(
    bin: &Path,
    dir: &Path,
    cases: &[&Case],
    version: &str,
    gate: bool,
) -> Result<Vec<Outcome>> {
    par_map(cases, |c| {
        let old = dir.join(format!("{}.base.json", c.id));
        let new = dir.join(format!("{}.changed.json", c.id));
        write_json(&old, &c.base)?;
        write_json(&new, &c.changed)?;
        predicted(&explain(bin, &old, &new, version, gate)?)
            .with_context(|| format!("case {} @ {}", c.id, label(version, gate)))
    })
}

/// A release as the table names it.
fn label(version: &str, gate: bool) -> String {
    if gate {
        format!("{version} +RayServiceIncrementalUpgrade")
    } else {
        version.to_string()
    }
}

/// The corpus is well formed and raygate agrees with the outcome read from KubeRay's
/// source for every case (no control plane needed; the live test checks the operator).
#[test]
fn corpus_matches_kuberay_source_reading() {
    let cases = load_corpus().unwrap_or_else(|e| panic!("{e:#}"));
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let bin = raygate_bin();
    let dir = tempfile::tempdir().unwrap();
    let mut bad = Vec::new();
    for v in VERSIONS {
        for gate in [false, true] {
            let run: Vec<&Case> = cases
                .iter()
                .filter(|c| c.expected(v, gate).is_some())
                .collect();
            let got =
                predict_all(&bin, dir.path(), &run, v, gate).unwrap_or_else(|e| panic!("{e:#}"));
            for (c, p) in run.iter().zip(got) {
                let want = c.expected(v, gate);
                if want != Some(p) {
                    bad.push(format!(
                        "{} @ {}: source reading {want:?}, raygate {p}",
                        c.id,
                        label(v, gate)
                    ));
                }
            }
        }
    }
    assert!(
        cases.iter().filter(|c| c.gated.is_some()).count() >= 6,
        "the incremental-upgrade cases (with `gated`) are missing"
    );
    assert!(bad.is_empty(), "raygate disagrees:\n{}", bad.join("\n"));
}

// ---------------------------------------------------------------- the live part

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("ray.io", "v1", kind), plural)
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn i(v: &Value, ptr: &str) -> i64 {
    v.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

/// ray-head's `GET /_e2e/clusters`: `(namespace, cluster) → configPuts`.
fn ray_head_puts(cp: &ControlPlane) -> Result<BTreeMap<(String, String), i64>> {
    let rows = cp.ray_head_clusters()?;
    Ok(rows
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                (s(r, "/namespace").to_string(), s(r, "/name").to_string()),
                i(r, "/configPuts"),
            )
        })
        .collect())
}

/// A case's RayService is settled: one ready active cluster, apps RUNNING, status current.
fn settled(svc: &Value, puts: &BTreeMap<(String, String), i64>) -> Option<String> {
    let active = s(svc, "/status/activeServiceStatus/rayClusterName");
    let ok = !active.is_empty()
        && s(svc, "/status/pendingServiceStatus/rayClusterName").is_empty()
        && i(svc, "/status/observedGeneration") == i(svc, "/metadata/generation")
        && s(
            svc,
            "/status/activeServiceStatus/applicationStatuses/app/status",
        ) == "RUNNING"
        && puts
            .get(&(NAMESPACE.to_string(), active.to_string()))
            .is_some_and(|n| *n >= 1);
    ok.then(|| active.to_string())
}

/// What a case looked like just before its change.
struct Before {
    active: String,
    generation: i64,
    puts: i64,
    cluster_yaml: PathBuf,
}

#[derive(Default, Clone, PartialEq, Eq, Debug)]
struct Seen {
    new_cluster: bool,
    in_place: bool,
    serve: bool,
    /// The operator has looked at the changed RayService (caught up, or rejected it).
    decided: bool,
}

impl Seen {
    fn outcome(&self) -> Outcome {
        match (self.new_cluster, self.in_place, self.serve) {
            (true, _, _) => Outcome::NewCluster,
            (false, true, true) => Outcome::InPlaceServe,
            (false, true, false) => Outcome::InPlace,
            (false, false, true) => Outcome::Serve,
            (false, false, false) => Outcome::Nothing,
        }
    }
}

struct Row {
    case: usize,
    version: String,
    /// The operator ran with its RayServiceIncrementalUpgrade feature gate on.
    gate: bool,
    observed: Outcome,
    rs: Outcome,
    live: Outcome,
}

impl Row {
    fn agrees(&self) -> bool {
        self.rs == self.observed && self.live == self.observed.cluster_part()
    }
}

/// `cases` are indexed into the whole corpus by `Row::case`.
async fn run_version(
    version: &str,
    gate: bool,
    cases: &[(usize, &Case)],
    bin: &Path,
) -> Result<Vec<Row>> {
    let t0 = Instant::now();
    let name = label(version, gate);
    let opts = Options {
        kuberay: KubeRay::parse(version)?,
        crds: true,
    };
    let cp = if gate {
        ControlPlane::start_incremental(opts)?
    } else {
        ControlPlane::start_with(opts)?
    };
    let client = cp.client().await?;
    eprintln!("[{name}] control plane up in {:?}", t0.elapsed());
    let only: Vec<&Case> = cases.iter().map(|(_, c)| *c).collect();
    match observe_version(version, gate, &only, bin, &cp, &client).await {
        Ok(rows) => {
            eprintln!("[{name}] done in {:?}", t0.elapsed());
            Ok(rows
                .into_iter()
                .map(|mut r| {
                    r.case = cases[r.case].0;
                    r
                })
                .collect())
        }
        // Panic while the control plane is alive, so its Drop keeps the logs.
        Err(e) => panic!("[{name}] {e:#}"),
    }
}

async fn observe_version(
    version: &str,
    gate: bool,
    cases: &[&Case],
    bin: &Path,
    cp: &ControlPlane,
    client: &Client,
) -> Result<Vec<Row>> {
    let t0 = Instant::now();
    // Room for every case at once (about 0.2 CPU and 0.4Gi per RayService, doubled while a
    // new cluster is prepared).
    for n in 0..3 {
        FakeNode::new(format!("conformance-{n}"))
            .cpu("64")
            .memory("256Gi")
            .pods(250)
            .create(client)
            .await?;
    }
    let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ns_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await
        .context("create namespace")?;
    let rs_api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &resource("RayService", "rayservices"),
    );
    let rc_api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &resource("RayCluster", "rayclusters"),
    );
    let ev_api: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);

    // Create every base RayService at once.
    let creates = cases.iter().map(|c| {
        let api = rs_api.clone();
        let obj: Result<DynamicObject> = serde_json::from_value(c.base.clone()).map_err(Into::into);
        async move {
            api.create(&PostParams::default(), &obj?)
                .await
                .with_context(|| format!("create RayService {}", c.id))
        }
    });
    for r in futures::future::join_all(creates).await {
        r?;
    }

    // Settle.
    let mut active: BTreeMap<String, String> = BTreeMap::new();
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let puts = ray_head_puts(cp).unwrap_or_default();
        let list = rs_api.list(&ListParams::default()).await?;
        active.clear();
        let mut pending = Vec::new();
        for o in list.items {
            let v = serde_json::to_value(&o)?;
            let name = s(&v, "/metadata/name").to_string();
            match settled(&v, &puts) {
                Some(a) => {
                    active.insert(name, a);
                }
                None => pending.push(name),
            }
        }
        if active.len() == cases.len() {
            break;
        }
        if Instant::now() >= deadline {
            bail!(
                "RayServices not settled after {SETTLE_TIMEOUT:?}: {}",
                pending.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    eprintln!(
        "[{}] {} RayServices settled in {:?}",
        label(version, gate),
        cases.len(),
        t0.elapsed()
    );

    // Snapshot the active clusters.
    let dir = tempfile::tempdir()?;
    let puts = ray_head_puts(cp)?;
    let mut before: BTreeMap<String, Before> = BTreeMap::new();
    for c in cases {
        let a = active[&c.id].clone();
        let rc = serde_json::to_value(rc_api.get(&a).await?)?;
        let out = cp.kubectl(&["get", "raycluster", &a, "-n", NAMESPACE, "-o", "yaml"])?;
        ensure!(
            out.status.success(),
            "kubectl get raycluster {a}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster_yaml = dir.path().join(format!("{}.raycluster.yaml", c.id));
        std::fs::write(&cluster_yaml, &out.stdout)?;
        before.insert(
            c.id.clone(),
            Before {
                generation: i(&rc, "/metadata/generation"),
                puts: puts
                    .get(&(NAMESPACE.to_string(), a.clone()))
                    .copied()
                    .unwrap_or(0),
                active: a,
                cluster_yaml,
            },
        );
    }

    // Change every RayService at once.
    let t_change = Instant::now();
    let replaces = cases.iter().map(|c| {
        let api = rs_api.clone();
        async move {
            // KubeRay writes the object too (finalizers, annotations): a read-modify-write
            // can lose that race, so retry a conflict from a fresh read, as a user's
            // `kubectl apply` would.
            let mut attempt = 0;
            loop {
                attempt += 1;
                let mut cur = serde_json::to_value(api.get(&c.id).await?)?;
                cur["spec"] = c.changed["spec"].clone();
                cur["metadata"]["labels"] = c.changed["metadata"]["labels"].clone();
                let obj: DynamicObject = serde_json::from_value(cur)?;
                match api.replace(&c.id, &PostParams::default(), &obj).await {
                    Err(kube::Error::Api(e)) if e.code == 409 && attempt < 10 => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    r => break r.with_context(|| format!("change RayService {}", c.id)),
                }
            }
        }
    });
    for r in futures::future::join_all(replaces).await {
        r?;
    }

    // Observe.
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut last_move = Instant::now();
    loop {
        let puts = ray_head_puts(cp)?;
        let services = rs_api.list(&ListParams::default()).await?;
        let clusters = rc_api.list(&ListParams::default()).await?;
        let events = ev_api.list(&ListParams::default()).await?;
        let rejected: BTreeSet<String> = events
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("InvalidRayServiceSpec"))
            .filter_map(|e| e.involved_object.name.clone())
            .collect();
        let clusters: Vec<Value> = clusters
            .items
            .iter()
            .map(serde_json::to_value)
            .collect::<std::result::Result<_, _>>()?;
        for o in services.items {
            let v = serde_json::to_value(&o)?;
            let name = s(&v, "/metadata/name").to_string();
            let Some(b) = before.get(&name) else { continue };
            let prev = seen.get(&name).cloned().unwrap_or_default();
            let mut now = prev.clone();
            let status_active = s(&v, "/status/activeServiceStatus/rayClusterName");
            now.new_cluster |= !s(&v, "/status/pendingServiceStatus/rayClusterName").is_empty()
                || (!status_active.is_empty() && status_active != b.active)
                || clusters.iter().any(|rc| {
                    s(rc, "/metadata/labels/ray.io~1originated-from-cr-name") == name
                        && s(rc, "/metadata/name") != b.active
                });
            now.in_place |= clusters.iter().any(|rc| {
                s(rc, "/metadata/name") == b.active && i(rc, "/metadata/generation") > b.generation
            });
            now.serve |= puts
                .get(&(NAMESPACE.to_string(), b.active.clone()))
                .is_some_and(|n| *n > b.puts);
            let validation_failed = rejected.contains(&name)
                || v.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .any(|c| s(c, "/reason") == "ValidationFailed");
            now.decided |= i(&v, "/status/observedGeneration") == i(&v, "/metadata/generation")
                || validation_failed;
            if now != prev {
                last_move = Instant::now();
            }
            seen.insert(name, now);
        }
        let all_decided = seen.len() == cases.len() && seen.values().all(|s| s.decided);
        if all_decided && last_move.elapsed() >= QUIET {
            break;
        }
        if t_change.elapsed() >= OBSERVE_TIMEOUT {
            let undecided: Vec<&String> = seen
                .iter()
                .filter(|(_, s)| !s.decided)
                .map(|(n, _)| n)
                .collect();
            bail!("the operator did not catch up within {OBSERVE_TIMEOUT:?}: {undecided:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "[{}] changes observed in {:?} (total {:?})",
        label(version, gate),
        t_change.elapsed(),
        t0.elapsed()
    );

    // Predictions.
    let rs = predict_all(bin, dir.path(), cases, version, gate)?;
    let live = par_map(cases, |c| {
        let new = dir.path().join(format!("{}.changed.json", c.id));
        predicted(&explain(
            bin,
            &before[&c.id].cluster_yaml,
            &new,
            version,
            gate,
        )?)
        .with_context(|| format!("case {} @ {} (live RayCluster)", c.id, label(version, gate)))
    })?;
    Ok(cases
        .iter()
        .zip(rs.into_iter().zip(live))
        .enumerate()
        .map(|(idx, (c, (rs, live)))| Row {
            case: idx,
            version: version.to_string(),
            gate,
            observed: seen[&c.id].outcome(),
            rs,
            live,
        })
        .collect())
}

/// What the live runs found where raygate had assumed otherwise (kept by hand, shown
/// under the table).
const FINDINGS: &str = "conformance/findings.md";

fn render(cases: &[Case], rows: &[Row], findings: &str) -> String {
    let mut by_case: BTreeMap<usize, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by_case.entry(r.case).or_default().push(r);
    }
    let agree = rows.iter().filter(|r| r.agrees()).count();
    let mut s = String::new();
    s.push_str("# raygate vs the real KubeRay operator\n\n");
    s.push_str(
        "Generated by `cargo test -p raygate-e2e --test conformance` (`RAYGATE_BLESS=1` rewrites it; \
         a stale copy fails the test). Each case (`e2e/conformance/cases/<case>.yaml`) is a change \
         to a settled RayService, run against the real operator of each release; *observed* is what \
         the operator did, *RayService* and *live RayCluster* are `raygate explain` with the previous \
         RayService or the live active RayCluster as `--old` (the latter knows no previous Serve \
         config, so only its cluster part is compared).\n\n",
    );
    s.push_str(
        "Outcomes: `NewCluster` a pending RayCluster is prepared; `InPlace` the active RayCluster's \
         spec is updated; `Serve` the Serve config is resubmitted to the active cluster; `Nothing` \
         none of these.\n\n",
    );
    let gated = cases.iter().filter(|c| c.gated.is_some()).count();
    s.push_str(&format!(
        "Agreement: **{agree}/{}** (case × release), releases {}; the {gated} cases on the \
         incremental-upgrade fields also with each release's `RayServiceIncrementalUpgrade` feature \
         gate on (`+RayServiceIncrementalUpgrade`: `e2e/control-plane up --incremental`, raygate told \
         `--kuberay-incremental-upgrades=true`).\n\n",
        rows.len(),
        VERSIONS.join(", ")
    ));
    s.push_str("| case | release | observed | RayService | live RayCluster | agree | why |\n");
    s.push_str("|---|---|---|---|---|---|---|\n");
    for (idx, rs) in by_case {
        let c = &cases[idx];
        for r in rs {
            s.push_str(&format!(
                "| `{}` | {} | {} | {} | {} | {} | {} |\n",
                c.id,
                label(&r.version, r.gate),
                r.observed,
                r.rs,
                r.live,
                if r.agrees() { "yes" } else { "**no**" },
                c.why.replace('|', "\\|")
            ));
        }
    }
    if !findings.is_empty() {
        s.push('\n');
        s.push_str(findings);
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raygate_explain_agrees_with_real_kuberay() {
    let cases = load_corpus().unwrap_or_else(|e| panic!("{e:#}"));
    let bin = raygate_bin();
    let only = std::env::var(ONLY_ENV).ok().filter(|v| !v.is_empty());
    let versions: Vec<&str> = VERSIONS
        .iter()
        .copied()
        .filter(|v| only.as_deref().is_none_or(|o| o == *v))
        .collect();
    let mut rows = Vec::new();
    let all: Vec<(usize, &Case)> = cases.iter().enumerate().collect();
    for v in &versions {
        match run_version(v, false, &all, &bin).await {
            Ok(r) => rows.extend(r),
            Err(e) => panic!("[{v}] {e:#}"),
        }
    }
    // The incremental-upgrade cases with the feature gate on: a few RayServices per
    // release, both releases at once (each on its own control plane and runtime).
    let gated: Vec<(usize, &Case)> = all
        .iter()
        .copied()
        .filter(|(_, c)| c.gated.is_some())
        .collect();
    let passes = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let handles: Vec<_> = versions
                .iter()
                .map(|v| {
                    let (gated, bin) = (&gated, &bin);
                    scope.spawn(move || {
                        tokio::runtime::Builder::new_multi_thread()
                            .worker_threads(2)
                            .enable_all()
                            .build()
                            .map_err(anyhow::Error::from)
                            .and_then(|rt| rt.block_on(run_version(v, true, gated, bin)))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect::<Vec<_>>()
        })
    });
    for r in passes {
        rows.extend(r.unwrap_or_else(|e| panic!("{e:#}")));
    }
    rows.sort_by_key(|r| r.case);
    let findings = std::fs::read_to_string(e2e_dir().join(FINDINGS))
        .unwrap_or_else(|e| panic!("read e2e/{FINDINGS}: {e}"));
    let table = render(&cases, &rows, &findings);
    let path = repo_root().join(TABLE);
    if only.is_none() && std::env::var_os(BLESS_ENV).is_some_and(|v| v == "1") {
        std::fs::write(&path, &table).unwrap();
    }
    let mut problems: Vec<String> = rows
        .iter()
        .filter(|r| !r.agrees())
        .map(|r| {
            format!(
                "{} @ {}: observed {}, raygate (RayService) {}, raygate (live RayCluster) {}",
                cases[r.case].id,
                label(&r.version, r.gate),
                r.observed,
                r.rs,
                r.live
            )
        })
        .collect();
    for r in &rows {
        let c = &cases[r.case];
        let want = c.expected(&r.version, r.gate);
        if want != Some(r.observed) {
            problems.push(format!(
                "{} @ {}: observed {}, but the corpus expects {want:?} (fix the case's `expect` or `gated`)",
                c.id,
                label(&r.version, r.gate),
                r.observed
            ));
        }
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if only.is_some() {
        eprintln!("{table}");
    } else if checked_in != table {
        problems.push(format!(
            "{TABLE} is stale: rerun with {BLESS_ENV}=1 and commit it"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
