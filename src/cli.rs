//! The offline commands: `explain` and `fit` answer, before anything is
//! applied, what KubeRay will do with a RayService change and whether the
//! new cluster fits. Their JSON output is a stable contract for scripts and
//! CI; the text output is for people.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::Value;

use crate::capacity::{self, ClusterState, FitReport, FitRequest, ResourceList};
use crate::kuberay::{self, Classification, KubeRayVersion, OldSide, RayCluster, RayService};
use crate::quantity::Quantity;
use crate::{Error, Result};

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned, short, for people.
    #[default]
    Text,
    /// A single JSON object, for scripts.
    Json,
}

#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// The current object: the previous RayService manifest, or the live
    /// active RayCluster (`kubectl get raycluster NAME -o yaml`).
    #[arg(long, value_name = "FILE")]
    pub old: PathBuf,
    /// The new RayService manifest.
    #[arg(long, value_name = "FILE")]
    pub new: PathBuf,
    /// KubeRay release whose rules to apply (e.g. 1.7, v1.6.1).
    #[arg(long, value_name = "X.Y", default_value_t = KubeRayVersion::latest())]
    pub kuberay_version: KubeRayVersion,
    /// Assume KubeRay runs with zero-downtime upgrades disabled
    /// (ENABLE_ZERO_DOWNTIME=false).
    #[arg(long)]
    pub zero_downtime_disabled: bool,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct FitArgs {
    /// Cluster state: the v1 List `kubectl get nodes,pods,limitranges -A -o yaml` prints.
    #[arg(long, value_name = "FILE")]
    pub state: PathBuf,
    /// The RayService whose new cluster must fit.
    #[arg(long, value_name = "FILE")]
    pub new: PathBuf,
    /// Resources to leave free, e.g. `--headroom nvidia.com/gpu=2` (repeatable).
    #[arg(long, value_name = "RESOURCE=QUANTITY")]
    pub headroom: Vec<String>,
    #[arg(long, value_name = "X.Y", default_value_t = KubeRayVersion::latest())]
    pub kuberay_version: KubeRayVersion,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Read every object in a YAML or JSON file; `List` objects are flattened
/// and multi-document YAML is accepted.
pub fn read_objects(path: &Path) -> Result<Vec<Value>> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Error::Input {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| Error::Input {
        path: shown.clone(),
        reason: format!("not valid YAML: {e}"),
    })?;
    let mut out = vec![];
    for doc in docs {
        match doc {
            Value::Null => {}
            Value::Object(ref m)
                if m.get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List")) =>
            {
                let items = m
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                out.extend(items);
            }
            Value::Object(_) => out.push(doc),
            other => {
                return Err(Error::Input {
                    path: shown,
                    reason: format!("expected Kubernetes objects, found {}", type_name(&other)),
                });
            }
        }
    }
    if out.is_empty() {
        return Err(Error::Input {
            path: shown,
            reason: "no objects found".into(),
        });
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
    let mut matching: Vec<Value> = objs
        .into_iter()
        .filter(|o| kinds.contains(&kind_of(o)))
        .collect();
    match matching.len() {
        1 => Ok(matching.remove(0)),
        0 => Err(Error::Input {
            path: path.display().to_string(),
            reason: format!("no {} object found", kinds.join(" or ")),
        }),
        n => Err(Error::Input {
            path: path.display().to_string(),
            reason: format!("{n} {} objects found, expected one", kinds.join("/")),
        }),
    }
}

fn parse_as<T: serde::de::DeserializeOwned>(path: &Path, v: Value) -> Result<T> {
    serde_json::from_value(v).map_err(|e| Error::Input {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
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

pub fn explain(args: &ExplainArgs) -> Result<String> {
    let old = read_one(&args.old, &["RayService", "RayCluster"])?;
    let new: RayService = parse_as(&args.new, read_one(&args.new, &["RayService"])?)?;
    let old_kind = kind_of(&old).to_string();
    let opts = kuberay::ClassifyOptions {
        zero_downtime_enabled: !args.zero_downtime_disabled,
        ..Default::default()
    };
    let classification = if old_kind == "RayCluster" {
        let c: RayCluster = parse_as(&args.old, old)?;
        kuberay::classify_with(&OldSide::RayCluster(&c), &new, args.kuberay_version, &opts)?
    } else {
        let s: RayService = parse_as(&args.old, old)?;
        kuberay::classify_with(&OldSide::RayService(&s), &new, args.kuberay_version, &opts)?
    };
    let name = format!(
        "{}-next",
        new.metadata.name.as_deref().unwrap_or("rayservice")
    );
    let ns = new
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let pods = kuberay::planned_pods(&name, &ns, new.cluster_config()?, args.kuberay_version)?;
    let requests = sum_requests(&pods)?;
    let out = ExplainOutput {
        classification: &classification,
        new_cluster: NewClusterSummary {
            pods: pods.len(),
            requests: capacity::canonical_map(&requests),
        },
    };
    Ok(match args.output {
        Output::Json => serde_json::to_string_pretty(&out)? + "\n",
        Output::Text => explain_text(&classification, &out.new_cluster),
    })
}

fn explain_text(c: &Classification, new: &NewClusterSummary) -> String {
    let mut s = String::new();
    let line = |s: &mut String, k: &str, v: &str| s.push_str(&format!("{k:<16}{v}\n"));
    line(&mut s, "Verdict:", &format!("{:?}", c.verdict));
    line(&mut s, "Why:", &c.reason);
    line(&mut s, "KubeRay rules:", &c.kuberay_version.to_string());
    let list = |s: &mut String, title: &str, paths: &[String]| {
        if paths.is_empty() {
            return;
        }
        s.push_str(&format!("{title}\n"));
        for p in paths {
            s.push_str(&format!("  {p}\n"));
        }
    };
    list(
        &mut s,
        "Triggering changes (need a new cluster):",
        &c.triggering_paths,
    );
    list(
        &mut s,
        "Exempt changes (autoscaler-owned, ignored by KubeRay):",
        &c.exempt_paths,
    );
    list(
        &mut s,
        "Serve config changes (applied in place):",
        &c.serve_config_paths,
    );
    let req = new
        .requests
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    line(
        &mut s,
        "New cluster:",
        &format!("{} pods, requests {req}", new.pods),
    );
    s
}

fn parse_headroom(items: &[String]) -> Result<ResourceList> {
    let mut out = ResourceList::new();
    for item in items {
        let (k, v) = item.split_once('=').ok_or_else(|| {
            Error::invalid("--headroom", format!("{item:?} is not RESOURCE=QUANTITY"))
        })?;
        out.insert(
            k.to_string(),
            Quantity::parse_field(&format!("--headroom {k}"), v)?,
        );
    }
    Ok(out)
}

/// Pods in the state that belong to the service's current cluster: the one
/// its status names, or (for a manifest without status) KubeRay's naming
/// pattern `<service>-<5 characters>`.
fn old_cluster_pods<'a>(
    state: &'a ClusterState,
    svc: &RayService,
) -> Vec<&'a k8s_openapi::api::core::v1::Pod> {
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
        .filter(|p| p.metadata.namespace.as_deref().unwrap_or("default") == ns)
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(kuberay::LABEL_CLUSTER))
                .is_some_and(|c| matches(c))
        })
        .collect()
}

pub fn fit(args: &FitArgs) -> Result<(String, bool)> {
    let items = read_objects(&args.state)?;
    let state = ClusterState::from_list(
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}),
    )
    .map_err(|e| Error::Input {
        path: args.state.display().to_string(),
        reason: e.to_string(),
    })?;
    let svc: RayService = parse_as(&args.new, read_one(&args.new, &["RayService"])?)?;
    let name = format!(
        "{}-next",
        svc.metadata.name.as_deref().unwrap_or("rayservice")
    );
    let ns = svc
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let pods = kuberay::planned_pods(&name, &ns, svc.cluster_config()?, args.kuberay_version)?;
    let mut old_requests = ResourceList::new();
    for p in old_cluster_pods(&state, &svc) {
        capacity::add_into(
            &mut old_requests,
            &capacity::pod_requests(p, &state.limit_ranges)?,
        );
    }
    let report = capacity::fit(
        &state,
        &FitRequest {
            pods,
            reserved: vec![],
            headroom: parse_headroom(&args.headroom)?,
            old_requests,
        },
    )?;
    let text = match args.output {
        Output::Json => serde_json::to_string_pretty(&report)? + "\n",
        Output::Text => fit_text(&report),
    };
    Ok((text, report.fits))
}

fn fit_text(r: &FitReport) -> String {
    let mut s = String::new();
    s.push_str(if r.fits {
        "Fits: yes, every pod of the new cluster has a node\n"
    } else {
        "Fits: NO\n"
    });
    let names: std::collections::BTreeSet<&String> = r
        .required
        .keys()
        .chain(r.free.keys())
        .chain(r.shortfall.keys())
        .collect();
    s.push_str(&format!(
        "\n{:<20}{:>14}{:>14}{:>14}{:>14}{:>14}\n",
        "RESOURCE", "NEW", "OLD+NEW", "ALLOCATABLE", "FREE", "SHORTFALL"
    ));
    let show = |m: &ResourceList, k: &str| {
        m.get(k)
            .map(|q| q.canonical())
            .unwrap_or_else(|| "-".into())
    };
    for k in names {
        if !(r.new_requests.contains_key(k) || r.shortfall.contains_key(k)) {
            continue;
        }
        s.push_str(&format!(
            "{:<20}{:>14}{:>14}{:>14}{:>14}{:>14}\n",
            k,
            show(&r.new_requests, k),
            show(&r.required, k),
            show(&r.allocatable, k),
            show(&r.free, k),
            show(&r.shortfall, k)
        ));
    }
    if !r.unplaced.is_empty() {
        s.push_str(&format!("\nUnplaced pods ({}):\n", r.unplaced.len()));
        for u in &r.unplaced {
            s.push_str(&format!("  {:<40} {}\n", u.pod, u.reason));
        }
    }
    if !r.placements.is_empty() {
        s.push_str(&format!("\nPlacements ({}):\n", r.placements.len()));
        for (pod, node) in &r.placements {
            s.push_str(&format!("  {pod:<40} -> {node}\n"));
        }
    }
    s
}
