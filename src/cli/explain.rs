//! `raygate explain`: what KubeRay will do with a RayService change, as JSON or text.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::input::{in_file, kind_of, parse_as, read_one, read_service};
use super::{ExplainArgs, field, kuberay_version, plan, sum_requests};
use crate::capacity;
use crate::kuberay::{
    self, Classification, KubeRayVersion, OldSide, RayCluster, RayService, Verdict,
};
use crate::{Error, Result};

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
    /// Mistakes in the new manifest that break raygate's gating (empty when
    /// none): a PR check fails on them whatever the verdict.
    errors: &'a [ManifestError],
    /// Advice (`MoveToServeConfig`, `ReplicasWithAutoscaling`; empty when
    /// none): never changes the verdict nor the exit code.
    advice: Vec<super::advice::Advice>,
    /// The RayService is Kueue-managed: what Kueue does with the change, and
    /// the quota it needs against what `--kueue-queue-left` says is left.
    #[serde(skip_serializing_if = "Option::is_none")]
    kueue: Option<KueueNote>,
}

/// What Kueue does with a change of a RayService it manages.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct KueueNote {
    #[serde(flatten)]
    pub managed: crate::kueue::Managed,
    /// What Kueue v0.19 does with this change.
    pub behaviour: String,
    /// Per resource given by `--kueue-queue-left`: needed, left, and whether it fits.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quota: Vec<QuotaLine>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct QuotaLine {
    pub resource: String,
    pub needed: String,
    pub left: String,
    pub fits: bool,
}

/// The Kueue note of `new` for a change classified `c` whose new cluster
/// requests `requests`; `left` is what the ClusterQueue has left.
pub(crate) fn kueue_note(
    new: &RayService,
    c: &Classification,
    requests: &capacity::ResourceList,
    left: &[(String, crate::quantity::Quantity)],
) -> Option<KueueNote> {
    let managed = crate::kueue::Managed::of(&new.metadata)?;
    let behaviour = match (c.verdict, managed.elastic) {
        (Verdict::NewCluster, false) => format!(
            "Kueue v0.19 turns this rayClusterConfig change into a suspension: KubeRay would rewrite \
             the serving cluster in place (an outage); raygate holds it (KueueWouldSuspend) and the \
             chart's ValidatingAdmissionPolicy refuses it. Remedy: {}",
            crate::kueue::REMEDY
        ),
        (Verdict::NewCluster, true) => "elastic job: Kueue keeps its Workload and does not suspend; \
             the new cluster's pods carry Kueue's elastic-job scheduling gate, and its quota (needed \
             below) must be left in the ClusterQueue next to the serving cluster's"
            .to_string(),
        (Verdict::InPlaceClusterUpdate, _) if c.outage.is_some() => {
            "Kueue suspends the RayService through this same field until it admits its Workload again"
                .to_string()
        }
        _ => managed.behaviour().to_string(),
    };
    let quota = left
        .iter()
        .map(|(r, l)| {
            let needed = requests.get(r).cloned().unwrap_or_default();
            QuotaLine {
                resource: r.clone(),
                needed: needed.canonical(),
                left: l.canonical(),
                fits: needed <= *l,
            }
        })
        .collect();
    Some(KueueNote {
        managed,
        behaviour,
        quota,
    })
}

/// A mistake in a RayService manifest, with its field path.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct ManifestError {
    pub path: String,
    pub message: String,
}

/// What in a RayService manifest (as written in Git) defeats raygate: only
/// raygate may set `spec.upgradeStrategy` of a gated RayService (its gate,
/// docs/gitops.md); a GitOps tool that applies it overrides the gate.
pub(crate) fn manifest_errors(file: &RayService) -> Vec<ManifestError> {
    let Some(t) = file
        .spec
        .upgrade_strategy
        .as_ref()
        .and_then(|u| u.type_.as_ref())
    else {
        return vec![];
    };
    vec![ManifestError {
        path: "spec.upgradeStrategy.type".into(),
        message: format!(
            "set to {}: raygate owns this field (its gate) on a gated RayService; a manifest \
             that sets it overrides the gate (GateOverridden) and its upgrades are no longer \
             held for capacity. Remove spec.upgradeStrategy from the manifest (docs/gitops.md)",
            t.as_str()
        ),
    }]
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
    let errors = manifest_errors(&new);
    explain_against(args, version, &old, old_path, &new, &errors, &[])
}

/// `explain` once both sides are read; `old_source` names the old side in
/// errors, `errors` are the file's [`manifest_errors`], `notes` are extra
/// `label value` lines for the text output.
pub(crate) fn explain_against(
    args: &ExplainArgs,
    version: KubeRayVersion,
    old: &Old,
    old_source: &Path,
    new: &RayService,
    errors: &[ManifestError],
    notes: &[(&str, String)],
) -> Result<String> {
    let opts = kuberay::ClassifyOptions {
        zero_downtime_enabled: !args.zero_downtime_disabled,
        incremental_upgrade_gate: args.kuberay_incremental_upgrades,
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
    if !errors.is_empty() {
        // Reported as an error, not as a change without effect.
        classification
            .other_paths
            .retain(|p| !p.starts_with("upgradeStrategy"));
    }
    let pods = in_file(&args.new, plan(new, version))?;
    let requests = in_file(&args.new, sum_requests(&pods))?;
    let kueue = kueue_note(new, &classification, &requests, &args.kueue_queue_left);
    let out = ExplainOutput {
        classification: &classification,
        new_cluster: NewClusterSummary {
            pods: pods.len(),
            requests: capacity::canonical_map(&requests),
        },
        errors,
        kueue,
        advice: super::advice::advice(
            classification.verdict,
            &classification.triggering_paths,
            new,
        ),
    };
    Ok(match args.output.structured(&out)? {
        Some(s) => s,
        None => {
            let mut s = String::new();
            for (label, value) in notes {
                field(&mut s, label, value);
            }
            let mut text = explain_text(
                &classification,
                &out.new_cluster,
                matches!(old, Old::Cluster(_)),
                errors,
            );
            for a in &out.advice {
                field(&mut text, "Advice:", &format!("{}: {}", a.path, a.message));
            }
            if let Some(k) = &out.kueue {
                kueue_text(&mut text, k);
            }
            s + &text
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

fn explain_text(
    c: &Classification,
    new: &NewClusterSummary,
    old_is_cluster: bool,
    errors: &[ManifestError],
) -> String {
    let mut s = String::new();
    for e in errors {
        field(&mut s, "ERROR:", &format!("{}: {}", e.path, e.message));
    }
    field(&mut s, "Verdict:", &format!("{:?}", c.verdict));
    field(&mut s, "Why:", &c.reason);
    if let Some(held) = &c.held_reason {
        field(&mut s, "Held because:", held);
    }
    if let Some(outage) = &c.outage {
        field(&mut s, "OUTAGE:", outage);
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

/// The Kueue lines of the text output.
pub(crate) fn kueue_text(s: &mut String, k: &KueueNote) {
    s.push('\n');
    let elastic = if k.managed.elastic { ", elastic" } else { "" };
    field(
        s,
        "Kueue:",
        &format!(
            "managed (LocalQueue {}{elastic}): {}",
            k.managed.queue, k.behaviour
        ),
    );
    for q in &k.quota {
        let verdict = if q.fits { "fits" } else { "SHORT" };
        field(
            s,
            "Quota:",
            &format!(
                "{} {} needed, {} left: {verdict}",
                q.resource, q.needed, q.left
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_sections_are_left_out_and_quantities_right_aligned() {
        let mut s = String::new();
        path_list(&mut s, "Triggering changes", &[]);
        assert_eq!(s, "");
        path_list(&mut s, "Triggering changes", &["a.b".into()]);
        assert_eq!(s, "Triggering changes (1):\n  a.b\n");
        let mut s = String::new();
        let rows = BTreeMap::from([
            ("cpu".to_string(), "64500m".to_string()),
            ("nvidia.com/gpu".to_string(), "8".to_string()),
        ]);
        quantity_rows(&mut s, &rows);
        assert_eq!(s, "  cpu             64500m\n  nvidia.com/gpu       8\n");
    }

    #[test]
    fn a_kueue_managed_change_says_what_kueue_does_and_the_quota_it_needs() {
        let base: serde_json::Value =
            serde_saphyr::from_str(include_str!("../../tests/fixtures/rayservice-llm.yaml"))
                .unwrap();
        let with = |elastic: bool, image: &str| -> RayService {
            let mut v = base.clone();
            v["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team-a".into();
            if elastic {
                v["metadata"]["annotations"] =
                    serde_json::json!({"kueue.x-k8s.io/elastic-job": "true"});
            }
            v["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]
                [0]["image"] = image.into();
            serde_json::from_value(v).unwrap()
        };
        let old = with(false, "rayproject/ray-ml:2.41.0-py311-gpu");
        let v = KubeRayVersion::parse("1.6.2").unwrap();
        let new = with(false, "rayproject/ray-ml:2.42.0-py311-gpu");
        let c = kuberay::classify(&OldSide::RayService(&old), &new, v).unwrap();
        assert_eq!(c.verdict, Verdict::NewCluster);
        let requests = sum_requests(&plan(&new, v).unwrap()).unwrap();
        let gpu = |n: i64| {
            (
                "nvidia.com/gpu".to_string(),
                crate::quantity::Quantity::from_units(n),
            )
        };
        let note = kueue_note(&new, &c, &requests, &[gpu(1)]).unwrap();
        assert!(note.behaviour.contains("an outage") && note.behaviour.contains("docs/kueue.md"));
        assert_eq!(note.quota.len(), 1);
        assert!(!note.quota[0].fits, "{:?}", note.quota);
        let mut s = String::new();
        kueue_text(&mut s, &note);
        assert!(
            s.contains("managed (LocalQueue team-a)") && s.contains("SHORT"),
            "{s}"
        );

        let elastic = with(true, "rayproject/ray-ml:2.42.0-py311-gpu");
        let note = kueue_note(&elastic, &c, &requests, &[gpu(1000)]).unwrap();
        assert!(note.behaviour.starts_with("elastic job") && note.quota[0].fits);
        let json = serde_json::to_value(&note).unwrap();
        assert_eq!(
            (json["queue"].as_str(), json["elastic"].as_bool()),
            (Some("team-a"), Some(true))
        );
        // Not managed: no note.
        let plain: RayService = serde_json::from_value(base.clone()).unwrap();
        assert!(kueue_note(&plain, &c, &requests, &[]).is_none());
    }
}
