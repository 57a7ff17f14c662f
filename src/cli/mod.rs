//! The offline commands: `explain` and `fit` answer, before anything is
//! applied, what KubeRay will do with a RayService change and whether the
//! new cluster fits. Their JSON output is a stable contract for scripts and
//! CI; the text output is for people. [`crate::kubectl`] runs the same
//! commands on objects read from a live cluster.
//!
//! Every input error names the file it came from and, where it can, the
//! field inside it: `new.yaml: RayService ml/llm spec.rayClusterConfig...`.
//!
//! - `input`: reading files (bounded in size), YAML/JSON, and errors that name the field.
//! - [`explain`](fn@explain): what KubeRay will do with a change, and its text.
//! - [`fit`](fn@fit): whether the new cluster fits, and its text.
//! - [`advice`]: advice on a change, never changing a verdict.

pub mod advice;
mod explain;
mod fit;
mod input;

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::capacity::{self, ResourceList};
use crate::kuberay::{self, KubeRayVersion, RayService};
use crate::quantity::Quantity;
use crate::{Error, Result};

pub use explain::explain;
pub(crate) use explain::with_live_serve_config;
pub(crate) use explain::{Old, explain_against, manifest_errors};
pub(crate) use fit::{Context as FitContext, batch_notes, fit_in};
pub use fit::{DecisionSummary, FitOutcome, fit};
pub(crate) use fit::{needs_new_cluster, no_new_cluster};
pub use input::{MAX_INPUT_BYTES, read_objects};
pub(crate) use input::{in_file, read_service};

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
    /// Whether KubeRay runs with its RayServiceIncrementalUpgrade feature
    /// gate on (`--feature-gates=RayServiceIncrementalUpgrade=true`), which
    /// decides what `upgradeStrategy.type: NewClusterWithIncrementalUpgrade`
    /// does. Default: the release's default (off in v1.5 and v1.6, on from v1.7).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub kuberay_incremental_upgrades: Option<bool>,
    /// For a RayService Kueue manages (label `kueue.x-k8s.io/queue-name`): what its
    /// ClusterQueue has left of a resource, cohort borrowing included, e.g.
    /// `--kueue-queue-left nvidia.com/gpu=8` (repeatable). The new cluster's
    /// requests are compared with it; a resource not given is not compared.
    #[arg(long, value_name = "RESOURCE=QUANTITY", value_parser = parse_headroom_item)]
    pub kueue_queue_left: Vec<(String, Quantity)>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct FitArgs {
    /// Cluster state: the v1 List `kubectl get nodes,pods,limitranges,runtimeclasses -A -o yaml` prints.
    /// On a cluster with Dynamic Resource Allocation add
    /// `resourceslices,deviceclasses,resourceclaims,resourceclaimtemplates` to the kinds.
    /// For a RayService Kueue manages (label kueue.x-k8s.io/queue-name) add
    /// `clusterqueues.v1beta2.kueue.x-k8s.io,localqueues.v1beta2.kueue.x-k8s.io,workloads.v1beta2.kueue.x-k8s.io`:
    /// its ClusterQueue's quota is then decided as the controller with --kueue decides it
    /// (`fits` is the nodes' and the quota's; `quota` has the numbers; docs/kueue.md).
    /// Without it, the state is read from the cluster.
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// Offline: the current object (the previous RayService manifest, or the
    /// live RayCluster), as for `explain --old`. When KubeRay builds no new
    /// cluster for the change (a replicas-only or Serve-only change), there is
    /// nothing to fit and `fit` says so (exit 0). Without it, the whole new
    /// cluster is fitted. Reading the cluster, the live objects are the old side.
    #[arg(long, value_name = "FILE")]
    pub old: Option<PathBuf>,
    /// DeviceClass whose devices count as plain units (repeat or comma-separate): where
    /// raygate cannot follow the scheduler's DRA allocator exactly (a selector it cannot
    /// evaluate, partitionable devices, consumable capacity, device taints) it reports the
    /// pods unplaced and says why; for these classes every matching device counts as one.
    #[arg(long, value_name = "CLASS", value_delimiter = ',')]
    pub dra_plain_count_class: Vec<String>,
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
    kuberay::planned_pods(&name, ns, kuberay::checked_cluster_config(svc)?, version)
}

/// [`plan`] as groups: what the fit places.
fn plan_groups(svc: &RayService, version: KubeRayVersion) -> Result<Vec<capacity::PodGroup>> {
    let name = format!(
        "{}-next",
        svc.metadata.name.as_deref().unwrap_or("rayservice")
    );
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    kuberay::planned_groups(&name, ns, kuberay::checked_cluster_config(svc)?, version)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_wrap_under_their_column() {
        let mut s = String::new();
        field(&mut s, "Why:", &"word ".repeat(30));
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 2, "{s}");
        assert!(lines.iter().all(|l| l.len() <= WIDTH), "{s}");
        assert!(lines[0].starts_with("Why:          word"), "{s}");
        assert!(
            lines[1].starts_with(&format!("{}word", " ".repeat(LABEL))),
            "{s}"
        );
        let mut s = String::new();
        field(&mut s, "Fits:", "yes");
        assert_eq!(s, "Fits:         yes\n");
    }

    #[test]
    fn headroom_items() {
        let (k, q) = parse_headroom_item(" nvidia.com/gpu = 2 ").unwrap();
        assert_eq!(
            (k.as_str(), q.canonical()),
            ("nvidia.com/gpu", "2".to_string())
        );
        assert!(
            parse_headroom_item("gpu")
                .unwrap_err()
                .contains("RESOURCE=QUANTITY")
        );
        assert!(
            parse_headroom_item("=2")
                .unwrap_err()
                .contains("no resource name")
        );
        assert!(
            parse_headroom_item("cpu=x")
                .unwrap_err()
                .starts_with("cpu: ")
        );
    }
}
