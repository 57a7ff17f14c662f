//! The offline commands: `explain` and `fit` answer, before anything is
//! applied, what KubeRay will do with a RayService change and whether the
//! new cluster fits. Their JSON output is a stable contract for scripts and
//! CI; the text output is for people. [`crate::kubectl`] runs the same
//! commands on objects read from a live cluster.
//!
//! Every input error names the file it came from and, where it can, the
//! field inside it: `new.yaml: RayService ml/llm spec.rayClusterConfig...`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::Value;

use crate::capacity::{self, ClusterState, FitReport, FitRequest, ResourceList};
use crate::kuberay::{
    self, Classification, KubeRayVersion, OldSide, RayCluster, RayService, Verdict,
};
use crate::quantity::Quantity;
use crate::{Error, Result};

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned, short, for people.
    #[default]
    Text,
    /// A single JSON object, for scripts.
    Json,
    /// The JSON object as YAML.
    Yaml,
}

impl Output {
    /// Renders a report for scripts, or `None` for the text form.
    pub(crate) fn structured<T: Serialize>(self, v: &T) -> Result<Option<String>> {
        Ok(match self {
            Output::Text => None,
            Output::Json => Some(serde_json::to_string_pretty(v)? + "\n"),
            Output::Yaml => Some(
                serde_saphyr::to_string(v).map_err(|e| Error::invalid("output", e.to_string()))?,
            ),
        })
    }
}

#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// The current object: the previous RayService manifest, or the live
    /// active RayCluster (`kubectl get raycluster NAME -o yaml`). Without
    /// it, the live RayService and its active RayCluster are read from the
    /// cluster.
    #[arg(long, value_name = "FILE")]
    pub old: Option<PathBuf>,
    /// The new RayService manifest.
    #[arg(short = 'f', long, visible_alias = "filename", value_name = "FILE")]
    pub new: PathBuf,
    /// KubeRay release whose rules to apply (e.g. 1.7, v1.6.1). An
    /// unsupported release is invalid input (exit 1). Default: the release
    /// that stamped the live RayCluster (`ray.io/kuberay-version`) when
    /// reading the cluster, else the newest.
    #[arg(long, value_name = "X.Y")]
    pub kuberay_version: Option<String>,
    /// Assume KubeRay runs with zero-downtime upgrades disabled
    /// (ENABLE_ZERO_DOWNTIME=false).
    #[arg(long)]
    pub zero_downtime_disabled: bool,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct FitArgs {
    /// Cluster state: the v1 List `kubectl get nodes,pods,limitranges,runtimeclasses -A -o yaml` prints.
    /// Without it, the state is read from the cluster.
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// The RayService whose new cluster must fit.
    #[arg(short = 'f', long, visible_alias = "filename", value_name = "FILE")]
    pub new: PathBuf,
    /// Resources to leave free cluster-wide, e.g. `--headroom nvidia.com/gpu=2`
    /// (repeatable). Reading the cluster, the RayService's UpgradePlan's
    /// headroom applies when none is given.
    #[arg(long, value_name = "RESOURCE=QUANTITY", value_parser = parse_headroom_item)]
    pub headroom: Vec<(String, Quantity)>,
    /// KubeRay release whose rules to apply (e.g. 1.7, v1.6.1). Default: the
    /// release that stamped the live active RayCluster when reading the
    /// cluster, else the newest.
    #[arg(long, value_name = "X.Y")]
    pub kuberay_version: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// `--kuberay-version` → a supported release, or invalid input; the newest
/// when not given.
pub(crate) fn kuberay_version(s: Option<&str>) -> Result<KubeRayVersion> {
    s.map_or(Ok(KubeRayVersion::latest()), |s| {
        KubeRayVersion::parse(s).map_err(|e| Error::invalid("--kuberay-version", e.to_string()))
    })
}

/// One `--headroom RESOURCE=QUANTITY` (a usage error when malformed).
fn parse_headroom_item(item: &str) -> std::result::Result<(String, Quantity), String> {
    let (k, v) = item
        .split_once('=')
        .ok_or_else(|| format!("{item:?} is not RESOURCE=QUANTITY"))?;
    let k = k.trim();
    if k.is_empty() {
        return Err(format!("{item:?} has no resource name"));
    }
    let q = Quantity::parse_amount(v.trim()).map_err(|e| format!("{k}: {}", e.reason()))?;
    Ok((k.to_string(), q))
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// Puts the file name in front of an error about its content.
pub(crate) fn in_file<T>(path: &Path, r: Result<T>) -> Result<T> {
    r.map_err(|e| match e {
        Error::Input { .. } => e,
        other => Error::Input {
            path: shown(path),
            reason: other.to_string(),
        },
    })
}

/// The largest input file read (256 MiB): `kubectl get nodes,pods -A -o
/// yaml` of a 100,000-pod cluster fits; an endless input (`/dev/zero`, a
/// stuck pipe) stops with an error instead of growing until memory runs out.
pub const MAX_INPUT_BYTES: u64 = 256 << 20;

/// A file's text, refusing more than `max` bytes and invalid UTF-8.
fn read_bounded(path: &Path, max: u64) -> Result<String> {
    use std::io::Read;
    let err = |reason: String| Error::Input {
        path: shown(path),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| err(e.to_string()))?;
    if bytes.len() as u64 > max {
        return Err(err(format!(
            "larger than {} MiB; raygate reads at most that much",
            max >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|e| err(format!("not UTF-8 text: {e}")))
}

/// Every YAML/JSON document of a file (multi-document YAML accepted),
/// null documents dropped; each must be an object.
fn read_docs(path: &Path) -> Result<Vec<Value>> {
    let text = read_bounded(path, MAX_INPUT_BYTES)?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| Error::Input {
        path: shown(path),
        reason: format!("not valid YAML: {e}"),
    })?;
    let mut out = vec![];
    for (i, doc) in docs.into_iter().enumerate() {
        match doc {
            Value::Null => {}
            Value::Object(_) => out.push(doc),
            other => {
                return Err(Error::Input {
                    path: shown(path),
                    reason: format!(
                        "document {}: expected a Kubernetes object, found {}",
                        i + 1,
                        type_name(&other)
                    ),
                });
            }
        }
    }
    if out.is_empty() {
        return Err(Error::Input {
            path: shown(path),
            reason: "no objects found".into(),
        });
    }
    Ok(out)
}

/// Read every object in a YAML or JSON file; `List` objects are flattened
/// and multi-document YAML is accepted.
pub fn read_objects(path: &Path) -> Result<Vec<Value>> {
    let mut out = vec![];
    for doc in read_docs(path)? {
        if kind_of(&doc).ends_with("List") {
            match doc.get("items") {
                Some(Value::Array(items)) => {
                    for (i, item) in items.iter().enumerate() {
                        if !item.is_object() {
                            return Err(Error::Input {
                                path: shown(path),
                                reason: format!(
                                    "items[{i}]: expected a Kubernetes object, found {}",
                                    type_name(item)
                                ),
                            });
                        }
                        out.push(item.clone());
                    }
                }
                None | Some(Value::Null) => {}
                Some(other) => {
                    return Err(Error::Input {
                        path: shown(path),
                        reason: format!("items: expected a list, found {}", type_name(other)),
                    });
                }
            }
        } else {
            out.push(doc);
        }
    }
    Ok(out)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn kind_of(v: &Value) -> &str {
    v.get("kind").and_then(Value::as_str).unwrap_or("")
}

/// Exactly one object of `kind` from a file.
fn read_one(path: &Path, kinds: &[&str]) -> Result<Value> {
    let objs = read_objects(path)?;
    let found: Vec<String> = objs
        .iter()
        .map(|o| match kind_of(o) {
            "" => "an object without kind".to_string(),
            k => k.to_string(),
        })
        .collect();
    let mut matching: Vec<Value> = objs
        .into_iter()
        .filter(|o| kinds.contains(&kind_of(o)))
        .collect();
    match matching.len() {
        1 => Ok(matching.remove(0)),
        0 => {
            let mut found = found;
            found.dedup();
            Err(Error::Input {
                path: shown(path),
                reason: format!(
                    "no {} object found (found {})",
                    kinds.join(" or "),
                    found.join(", ")
                ),
            })
        }
        n => Err(Error::Input {
            path: shown(path),
            reason: format!("{n} {} objects found, expected one", kinds.join("/")),
        }),
    }
}

/// One step of a path into a JSON value.
#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

fn child<'a>(v: &'a Value, s: &Seg) -> Option<&'a Value> {
    match s {
        Seg::Key(k) => v.get(k),
        Seg::Index(i) => v.get(*i),
    }
}

fn child_mut<'a>(v: &'a mut Value, s: &Seg) -> Option<&'a mut Value> {
    match s {
        Seg::Key(k) => v.get_mut(k),
        Seg::Index(i) => v.get_mut(*i),
    }
}

fn show_path(at: &[Seg]) -> String {
    let mut s = String::new();
    for seg in at {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// The field a typed parse fails on, found without positions (serde's
/// buffering of flattened structs loses them): descend into the child whose
/// emptying (`{}`, `[]`, a scalar made `{}`) or removal makes the parse succeed, as far as that holds.
fn locate_parse_error<T: serde::de::DeserializeOwned>(v: &Value) -> Option<String> {
    const BUDGET: usize = 2_000;
    let mut tries = 0;
    let mut at: Vec<Seg> = Vec::new();
    'descend: loop {
        let mut node = v;
        for s in &at {
            node = child(node, s)?;
        }
        let children: Vec<Seg> = match node {
            Value::Object(m) => m.keys().cloned().map(Seg::Key).collect(),
            Value::Array(a) => (0..a.len()).map(Seg::Index).collect(),
            _ => break,
        };
        for c in children {
            for empty in [true, false] {
                tries += 1;
                if tries > BUDGET {
                    break 'descend;
                }
                let mut trial = v.clone();
                let mut parent = &mut trial;
                for s in &at {
                    parent = child_mut(parent, s)?;
                }
                if empty {
                    match child_mut(parent, &c) {
                        Some(x @ Value::Object(_)) => *x = Value::Object(Default::default()),
                        Some(x @ Value::Array(_)) => *x = Value::Array(Vec::new()),
                        // A scalar where an object belongs (`metadata: 5`).
                        Some(x) => *x = Value::Object(Default::default()),
                        None => continue,
                    }
                } else {
                    match (&mut *parent, &c) {
                        (Value::Object(m), Seg::Key(k)) => {
                            m.remove(k);
                        }
                        (Value::Array(a), Seg::Index(i)) if *i < a.len() => {
                            a.remove(*i);
                        }
                        _ => continue,
                    }
                }
                if serde_json::from_value::<T>(trial).is_ok() {
                    at.push(c);
                    continue 'descend;
                }
            }
        }
        break;
    }
    (!at.is_empty()).then(|| show_path(&at))
}

fn parse_as<T: serde::de::DeserializeOwned>(path: &Path, v: Value) -> Result<T> {
    match serde_json::from_value::<T>(v.clone()) {
        Ok(t) => Ok(t),
        Err(e) => {
            let at = locate_parse_error::<T>(&v)
                .map(|p| format!("{p}: "))
                .unwrap_or_default();
            Err(Error::Input {
                path: shown(path),
                reason: format!("{at}{e}"),
            })
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewClusterSummary {
    pods: usize,
    requests: BTreeMap<String, String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExplainOutput<'a> {
    #[serde(flatten)]
    classification: &'a Classification,
    new_cluster: NewClusterSummary,
}

fn sum_requests(pods: &[k8s_openapi::api::core::v1::Pod]) -> Result<ResourceList> {
    let mut total = ResourceList::new();
    for p in pods {
        capacity::add_into(&mut total, &capacity::pod_requests(p, &[])?);
    }
    Ok(total)
}

/// The pods KubeRay would create for the service's cluster spec, named as a
/// cluster `<service>-next`.
fn plan(svc: &RayService, version: KubeRayVersion) -> Result<Vec<k8s_openapi::api::core::v1::Pod>> {
    let name = format!(
        "{}-next",
        svc.metadata.name.as_deref().unwrap_or("rayservice")
    );
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    kuberay::planned_pods(&name, ns, svc.cluster_config()?, version)
}

/// [`plan`] as groups: what the fit places.
fn plan_groups(svc: &RayService, version: KubeRayVersion) -> Result<Vec<capacity::PodGroup>> {
    let name = format!(
        "{}-next",
        svc.metadata.name.as_deref().unwrap_or("rayservice")
    );
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    kuberay::planned_groups(&name, ns, svc.cluster_config()?, version)
}

/// Parses a RayService manifest and checks it on its own (worker groups,
/// every quantity, the pods it plans), so later errors cannot be its.
pub(crate) fn read_service(path: &Path, version: KubeRayVersion) -> Result<RayService> {
    let svc: RayService = parse_as(path, read_one(path, &["RayService"])?)?;
    in_file(
        path,
        kuberay::classify(&OldSide::RayService(&svc), &svc, version),
    )?;
    in_file(path, plan(&svc, version).and_then(|p| sum_requests(&p)))?;
    Ok(svc)
}

/// What the change is compared with.
pub(crate) enum Old {
    /// The live RayCluster KubeRay compares the spec with, and the live
    /// RayService whose `serveConfigV2` KubeRay last submitted to it.
    Live(Box<RayCluster>, Box<RayService>),
    Service(Box<RayService>),
    Cluster(Box<RayCluster>),
}

pub fn explain(args: &ExplainArgs) -> Result<String> {
    let version = kuberay_version(args.kuberay_version.as_deref())?;
    let Some(old_path) = &args.old else {
        return Err(Error::invalid(
            "--old",
            "missing (or read the live cluster: `kubectl raygate explain -f FILE`)",
        ));
    };
    let old = read_one(old_path, &["RayService", "RayCluster"])?;
    let old = if kind_of(&old) == "RayCluster" {
        Old::Cluster(Box::new(parse_as(old_path, old)?))
    } else {
        Old::Service(Box::new(parse_as(old_path, old)?))
    };
    let new = read_service(&args.new, version)?;
    explain_against(args, version, &old, old_path, &new, &[])
}

/// `explain` once both sides are read; `old_source` names the old side in
/// errors, `notes` are extra `label value` lines for the text output.
pub(crate) fn explain_against(
    args: &ExplainArgs,
    version: KubeRayVersion,
    old: &Old,
    old_source: &Path,
    new: &RayService,
    notes: &[(&str, String)],
) -> Result<String> {
    let opts = kuberay::ClassifyOptions {
        zero_downtime_enabled: !args.zero_downtime_disabled,
        ..Default::default()
    };
    let side = match old {
        Old::Cluster(c) | Old::Live(c, _) => OldSide::RayCluster(c),
        Old::Service(s) => OldSide::RayService(s),
    };
    // The new side was checked on its own: what fails now is the old side.
    let mut classification = in_file(
        old_source,
        kuberay::classify_with(&side, new, version, &opts),
    )?;
    if let Old::Live(_, live) = old {
        classification = with_live_serve_config(classification, live, new);
    }
    let pods = in_file(&args.new, plan(new, version))?;
    let requests = in_file(&args.new, sum_requests(&pods))?;
    let out = ExplainOutput {
        classification: &classification,
        new_cluster: NewClusterSummary {
            pods: pods.len(),
            requests: capacity::canonical_map(&requests),
        },
    };
    Ok(match args.output.structured(&out)? {
        Some(s) => s,
        None => {
            let mut s = String::new();
            for (label, value) in notes {
                field(&mut s, label, value);
            }
            s + &explain_text(
                &classification,
                &out.new_cluster,
                matches!(old, Old::Cluster(_)),
            )
        }
    })
}

/// A RayCluster carries no Serve config: KubeRay compares `serveConfigV2`
/// with what it last submitted, the live RayService's. The cluster decides
/// the verdict; a Serve config change turns `NoChange` into `ServeConfigUpdate`.
pub(crate) fn with_live_serve_config(
    mut c: kuberay::Classification,
    live: &RayService,
    new: &RayService,
) -> kuberay::Classification {
    c.serve_config_paths = kuberay::classify::serve_config_changes(
        live.spec.serve_config_v2.as_deref(),
        new.spec.serve_config_v2.as_deref(),
    );
    if c.verdict == kuberay::Verdict::NoChange && !c.rejected && !c.serve_config_paths.is_empty() {
        c.verdict = kuberay::Verdict::ServeConfigUpdate;
        c.reason = "Only the Serve config changed: resubmitted to the running cluster.".into();
    }
    c
}

/// What the new cluster of a RayService requests in total, and how many pods it has.
pub(crate) fn new_cluster_requests(
    svc: &RayService,
    version: KubeRayVersion,
) -> Result<(usize, ResourceList)> {
    let pods = plan(svc, version)?;
    Ok((pods.len(), sum_requests(&pods)?))
}

/// Width of the label column in text output.
const LABEL: usize = 14;
/// Text lines are wrapped to this many columns.
const WIDTH: usize = 100;

/// `label value`, the value wrapped at word boundaries and indented under itself.
pub(crate) fn field(s: &mut String, label: &str, value: &str) {
    let mut line = format!("{label:<LABEL$}");
    let mut used = 0;
    for word in value.split_whitespace() {
        if used > 0 && LABEL + used + 1 + word.len() > WIDTH {
            s.push_str(line.trim_end());
            s.push('\n');
            line = " ".repeat(LABEL);
            used = 0;
        }
        if used > 0 {
            line.push(' ');
            used += 1;
        }
        line.push_str(word);
        used += word.len();
    }
    s.push_str(line.trim_end());
    s.push('\n');
}

fn path_list(s: &mut String, title: &str, paths: &[String]) {
    if paths.is_empty() {
        return;
    }
    s.push_str(&format!("{title} ({}):\n", paths.len()));
    for p in paths {
        s.push_str(&format!("  {p}\n"));
    }
}

/// `name  value` rows, names padded to the longest, values right-aligned.
fn quantity_rows(s: &mut String, rows: &BTreeMap<String, String>) {
    let kw = rows.keys().map(String::len).max().unwrap_or(0);
    let vw = rows.values().map(String::len).max().unwrap_or(0);
    for (k, v) in rows {
        s.push_str(&format!("  {k:<kw$}  {v:>vw$}\n"));
    }
}

fn explain_text(c: &Classification, new: &NewClusterSummary, old_is_cluster: bool) -> String {
    let mut s = String::new();
    field(&mut s, "Verdict:", &format!("{:?}", c.verdict));
    field(&mut s, "Why:", &c.reason);
    if let Some(held) = &c.held_reason {
        field(&mut s, "Held because:", held);
    }
    let strategy = match &c.upgrade_strategy {
        Some(t) => format!("upgradeStrategy {t}"),
        None => "upgradeStrategy unset".to_string(),
    };
    let zd = if c.zero_downtime {
        "zero-downtime upgrades on"
    } else {
        "zero-downtime upgrades off"
    };
    field(
        &mut s,
        "KubeRay:",
        &format!("{} rules, {strategy}, {zd}", c.kuberay_version),
    );
    field(&mut s, "Fingerprint:", &c.fingerprint);
    if old_is_cluster {
        field(
            &mut s,
            "Serve config:",
            "not compared (--old is a RayCluster; KubeRay compares against what it last submitted)",
        );
    }
    let triggering = match c.verdict {
        Verdict::NewCluster => "Changes that need a new cluster",
        Verdict::Held => "Changes that would need a new cluster",
        Verdict::InPlaceClusterUpdate => "Changes applied to the running cluster",
        Verdict::NoChange | Verdict::ServeConfigUpdate => "Triggering changes",
    };
    let sections: [(String, &[String]); 5] = [
        (triggering.to_string(), &c.triggering_paths),
        (
            format!("Exempt, muted by KubeRay {}", c.kuberay_version),
            &c.exempt_paths,
        ),
        (
            "Serve config changes (resubmitted)".to_string(),
            &c.serve_config_paths,
        ),
        (
            "Other spec changes (no cluster effect)".to_string(),
            &c.other_paths,
        ),
        (
            format!("Ignored, unknown to KubeRay {}", c.kuberay_version),
            &c.ignored_paths,
        ),
    ];
    if sections.iter().any(|(_, p)| !p.is_empty()) {
        s.push('\n');
    }
    for (title, paths) in &sections {
        path_list(&mut s, title, paths);
    }
    s.push('\n');
    let plural = if new.pods == 1 { "" } else { "s" };
    field(
        &mut s,
        "New spec:",
        &format!("{} pod{plural}, requesting in total:", new.pods),
    );
    quantity_rows(&mut s, &new.requests);
    s
}

/// Pods in the state that belong to the service's current cluster: the one
/// its status names, or (for a manifest without status) KubeRay's naming
/// pattern `<service>-<5 characters>`.
fn old_cluster_pods(
    state: &ClusterState,
    svc: &RayService,
) -> Vec<k8s_openapi::api::core::v1::Pod> {
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let active = svc
        .status
        .as_ref()
        .and_then(|s| s.active_service_status.as_ref())
        .and_then(|a| a.ray_cluster_name.clone());
    let matches = |cluster: &str| match &active {
        Some(a) => cluster == a,
        None => cluster
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|suffix| {
                suffix.len() == 5 && suffix.chars().all(|c| c.is_ascii_alphanumeric())
            }),
    };
    state
        .pods
        .iter()
        .filter(|p| {
            (if p.key.0.is_empty() {
                "default"
            } else {
                &*p.key.0
            }) == ns
        })
        .filter(|p| !p.is_terminal())
        .filter(|p| p.body.cluster().is_some_and(matches))
        .map(|p| p.body.to_pod(&p.key))
        .collect()
}

/// What `fit` found: the output, the answer, and what was skipped in the input.
#[derive(Debug)]
pub struct FitOutcome {
    pub text: String,
    pub fits: bool,
    /// Objects of the state that were ignored (for stderr).
    pub warnings: Vec<String>,
}

pub(crate) fn read_state(path: &Path) -> Result<ClusterState> {
    // Streamed: a typed list (`NodeList`) gives its items their kind, and
    // pods go straight into records (a dump of 150,000 pods is GiBs).
    let err = |reason: String| Error::Input {
        path: shown(path),
        reason,
    };
    let open = || std::fs::File::open(path).map_err(|e| err(e.to_string()));
    let max = capacity::state::MAX_STATE_BYTES;
    let state = match ClusterState::read(open()?, max) {
        // JSON documents joined by `---` (a multi-document YAML file).
        Err(e) if e.to_string().contains("trailing characters") && path.is_file() => {
            ClusterState::read_as(open()?, max, Some(true))
        }
        other => other,
    }
    .map_err(|e| err(e.to_string()))?;
    if state.nodes.is_empty() {
        return Err(Error::Input {
            path: shown(path),
            reason: format!(
                "no Node objects found ({} pods, {} other objects): expected what `kubectl get nodes,pods -A -o yaml` prints",
                state.pods.len(),
                state.warnings.len()
            ),
        });
    }
    Ok(state)
}

pub fn fit(args: &FitArgs) -> Result<FitOutcome> {
    let version = kuberay_version(args.kuberay_version.as_deref())?;
    let Some(state_path) = &args.state else {
        return Err(Error::invalid(
            "--state",
            "missing (or read the live cluster: `kubectl raygate fit -f FILE`)",
        ));
    };
    let state = read_state(state_path)?;
    let svc = read_service(&args.new, version)?;
    let headroom: ResourceList = args.headroom.iter().cloned().collect();
    fit_in(args, version, state, state_path, &svc, headroom, &[])
}

/// `fit` once the state and the service are read. The service's status
/// names its active cluster, whose pods are the old side.
pub(crate) fn fit_in(
    args: &FitArgs,
    version: KubeRayVersion,
    state: ClusterState,
    state_source: &Path,
    svc: &RayService,
    headroom: ResourceList,
    notes: &[(&str, String)],
) -> Result<FitOutcome> {
    let pods = in_file(&args.new, plan_groups(svc, version))?;
    let old_pods = old_cluster_pods(&state, svc);
    let old_requests = in_file(
        state_source,
        capacity::total_requests(old_pods.iter(), &state.limit_ranges),
    )?;
    // The new pods were checked with the manifest: what fails now is the state.
    let report = in_file(
        state_source,
        capacity::fit(
            &state,
            &FitRequest {
                pods,
                reserved: vec![],
                headroom,
                old_requests,
            },
        ),
    )?;
    let text = match args.output.structured(&report)? {
        Some(s) => s,
        None => {
            let mut s = String::new();
            for (label, value) in notes {
                field(&mut s, label, value);
            }
            s + &fit_text(&report)
        }
    };
    Ok(FitOutcome {
        text,
        fits: report.fits,
        warnings: state.warnings,
    })
}

fn list_text(m: &ResourceList) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", v.canonical()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn fit_why(r: &FitReport) -> String {
    let total = r
        .new_requests
        .get(capacity::PODS)
        .map_or(0, Quantity::value);
    let unplaced = r.unplaced.iter().filter(|u| !u.reserved).count();
    if r.fits {
        return format!(
            "every new pod ({total}) has a node, next to the running cluster{}",
            if r.headroom.is_empty() {
                ""
            } else {
                ", and the headroom stays free"
            }
        );
    }
    let mut why = Vec::new();
    if unplaced > 0 {
        let verb = if unplaced == 1 { "has" } else { "have" };
        why.push(format!("{unplaced} of {total} new pods {verb} no node"));
    }
    if r.shortfall.is_empty() {
        if unplaced > 0 {
            why.push(
                "the usable nodes have enough free in total, but not on any one node \
                 (fragmentation) or not where the pods may run (placement rules)"
                    .to_string(),
            );
        }
    } else {
        let what = if r.headroom.is_empty() {
            "short of"
        } else {
            "with the headroom, short of"
        };
        why.push(format!("{what} {}", list_text(&r.shortfall)));
    }
    if why.is_empty() {
        why.push("the headroom is not kept".to_string());
    }
    why.join("; ")
}

/// Rows of cells, each column padded to its widest cell (first column left-aligned,
/// the others right-aligned).
fn table(s: &mut String, rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let w = widths.get(c).copied().unwrap_or(0);
            if c == 0 {
                line.push_str(&format!("{cell:<w$}"));
            } else {
                line.push_str(&format!("  {cell:>w$}"));
            }
        }
        s.push_str(line.trim_end());
        s.push('\n');
    }
}

/// `  key  value` lines, keys padded to the longest.
fn pairs(s: &mut String, title: &str, rows: &[(&str, &str)]) {
    if rows.is_empty() {
        return;
    }
    s.push_str(&format!("\n{title} ({}):\n", rows.len()));
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in rows {
        s.push_str(&format!("  {k:<w$}  {v}\n"));
    }
}

fn fit_text(r: &FitReport) -> String {
    let mut s = String::new();
    field(&mut s, "Fits:", if r.fits { "yes" } else { "NO" });
    field(&mut s, "Why:", &fit_why(r));
    if !r.headroom.is_empty() {
        field(&mut s, "Headroom:", &list_text(&r.headroom));
    }
    s.push('\n');
    let show = |m: &ResourceList, k: &str| {
        m.get(k)
            .map(Quantity::canonical)
            .unwrap_or_else(|| "-".into())
    };
    let mut rows = vec![
        [
            "RESOURCE",
            "NEW",
            "OLD+NEW",
            "ALLOCATABLE",
            "FREE",
            "SHORTFALL",
        ]
        .map(str::to_string)
        .to_vec(),
    ];
    let names: std::collections::BTreeSet<&String> =
        r.new_requests.keys().chain(r.shortfall.keys()).collect();
    for k in names {
        rows.push(vec![
            k.clone(),
            show(&r.new_requests, k),
            show(&r.required, k),
            show(&r.allocatable, k),
            show(&r.free, k),
            show(&r.shortfall, k),
        ]);
    }
    table(&mut s, &rows);
    let unplaced: Vec<(&str, &str)> = r
        .unplaced
        .iter()
        .map(|u| (u.pod.as_str(), u.reason.as_str()))
        .collect();
    pairs(&mut s, "Unplaced pods", &unplaced);
    let placed: Vec<(&str, &str)> = r
        .placements
        .iter()
        .map(|(p, n)| (p.as_str(), n.as_str()))
        .collect();
    pairs(&mut s, "Placements", &placed);
    let skipped: Vec<(&str, &str)> = r
        .skipped_nodes
        .iter()
        .map(|n| (n.node.as_str(), n.reason.as_str()))
        .collect();
    pairs(&mut s, "Skipped nodes", &skipped);
    s
}
