//! What KubeRay will do with a RayService change.
//!
//! The decision order follows KubeRay's RayService controller (per release, see
//! [`Rules`]):
//!
//! 0. `validateRayService` (first thing in `Reconcile`): an invalid
//!    `upgradeStrategy.type` (or incomplete `NewClusterWithIncrementalUpgrade` options),
//!    or a cluster spec that fails [`validate::cluster_spec_error`], fails the RayService
//!    and nothing is applied, not even the Serve config → `Held`, `rejected`.
//! 1. `shouldUpdateCluster(active)` — skipped while the RayService has condition
//!    `UpgradeInProgress`:
//!    a. (v1.2.0+) the cluster's `ray.io/kuberay-version` annotation differs from the
//!    operator's → the cluster is rewritten in place from the RayService (its hash
//!    annotation too, so `shouldPrepareNewCluster` then sees equal hashes) →
//!    `InPlaceClusterUpdate`;
//!    b. (v1.5.2, v1.6.1, v1.6.2) `rayClusterConfig.suspend` differs from the cluster's →
//!    rewritten in place → `InPlaceClusterUpdate`.
//! 2. `isClusterSpecHashEqual(full)`: muted forms equal → no cluster change.
//! 3. `isClusterSpecHashEqual(partial)`: only worker groups appended at the end (the first
//!    `ray.io/num-worker-groups` groups hash equal) → `InPlaceClusterUpdate`. A missing or
//!    non-numeric annotation means "update in place" (v1.3.0+) or "do nothing" (v1.1–v1.2).
//! 4. Otherwise `shouldPrepareNewCluster` → `isZeroDowntimeUpgradeEnabled`: `NewCluster`
//!    when zero-downtime upgrades are enabled, else `Held` (KubeRay silently applies
//!    nothing to the cluster). While `RollbackInProgress` (v1.6.0+) no new cluster is
//!    prepared either → `Held`.
//!
//! Serve config: KubeRay resubmits `serveConfigV2` when the string differs from what it
//! last submitted (`checkIfNeedSubmitServeApplications`), to the active cluster unless a
//! new cluster is being prepared (then to the new one).

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::diff::{self, Path};
use super::fingerprint::Fingerprint;
use super::normalize::{Normalized, normalize_cluster_spec};
use super::types::{
    ANNOTATION_HASH, ANNOTATION_KUBERAY_VERSION, ANNOTATION_NUM_WORKER_GROUPS,
    CONDITION_ROLLBACK_IN_PROGRESS, CONDITION_UPGRADE_IN_PROGRESS, RayCluster, RayClusterSpec,
    RayService, UpgradeType, object_name,
};
use super::validate;
use super::version::{BadGroupCountAnnotation, KubeRayVersion, Rules};

mod strategy;

use strategy::{Strategy, strategy, validate_upgrade};

/// What the change is compared against.
#[derive(Clone, Copy, Debug)]
pub enum OldSide<'a> {
    /// The previous version of the RayService (e.g. the stored object vs a new manifest).
    RayService(&'a RayService),
    /// The live active RayCluster: how KubeRay itself detects a pending change (it
    /// compares `spec.rayClusterConfig` against the cluster's hash annotation; we compare
    /// against its `spec`). The previous serve config is unknown on this side.
    RayCluster(&'a RayCluster),
}

/// Outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// Nothing KubeRay acts on changed.
    NoChange,
    /// Only `serveConfigV2` changed: resubmitted to the running cluster.
    ServeConfigUpdate,
    /// The active RayCluster is updated in place (no second cluster).
    InPlaceClusterUpdate,
    /// A new (pending) RayCluster will be created next to the active one.
    NewCluster,
    /// A new cluster would be needed but KubeRay will not create one (and applies nothing
    /// to the cluster): see `heldReason`.
    Held,
}

/// Options for KubeRay operator settings that are not in the objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassifyOptions {
    /// The operator's `ENABLE_ZERO_DOWNTIME` env var (anything but `false` → true). Only
    /// consulted when `upgradeStrategy.type` is unset (it takes precedence).
    pub zero_downtime_enabled: bool,
    /// The operator's `RayServiceIncrementalUpgrade` feature gate; `None` → the release's
    /// default (off in v1.5–v1.6, on in v1.7).
    pub incremental_upgrade_gate: Option<bool>,
}

impl Default for ClassifyOptions {
    fn default() -> Self {
        ClassifyOptions {
            zero_downtime_enabled: true,
            incremental_upgrade_gate: None,
        }
    }
}

/// The result of [`classify`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Classification {
    pub verdict: Verdict,
    /// Why a needed new cluster is not created (only for `Held`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_reason: Option<String>,
    /// KubeRay's validation rejects the new RayService: it applies nothing, not even the
    /// Serve config (the verdict is then `Held`, or `NoChange` when nothing changed).
    pub rejected: bool,
    /// Changed `rayClusterConfig` fields that drive the verdict (relative to
    /// `rayClusterConfig`).
    pub triggering_paths: Vec<String>,
    /// Changed fields that KubeRay mutes (e.g. `workerGroupSpecs[gpu].replicas`).
    pub exempt_paths: Vec<String>,
    /// Changed Serve config (`serveConfigV2.applications[llm]...`, or `serveConfigV2`).
    pub serve_config_paths: Vec<String>,
    /// Other changed RayService `spec` fields that trigger nothing by themselves.
    pub other_paths: Vec<String>,
    /// Fields on either side this KubeRay release does not know (pruned, ignored).
    pub ignored_paths: Vec<String>,
    /// The release whose rules were applied.
    pub kuberay_version: KubeRayVersion,
    /// `spec.upgradeStrategy.type` of the new RayService as given (`None` when unset).
    pub upgrade_strategy: Option<UpgradeType>,
    /// Whether zero-downtime upgrades (a second cluster) are enabled for this RayService.
    pub zero_downtime: bool,
    /// A new cluster is created with `NewClusterWithIncrementalUpgrade`: its worker groups
    /// start without `replicas` (at `minReplicas`) and grow as traffic moves.
    pub incremental: bool,
    /// sha256 of the normalised, muted new `rayClusterConfig` (hex, 12 chars).
    pub fingerprint: Fingerprint,
    /// Short human explanation.
    pub reason: String,
    /// The change takes the serving cluster's pods away (an outage), and
    /// why: set when `rayClusterConfig.suspend` goes to `true` and KubeRay
    /// applies it in place to the active cluster (rule 1b), whatever else
    /// changed with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outage: Option<String>,
}

/// Classify with default [`ClassifyOptions`].
pub fn classify(
    old: &OldSide<'_>,
    new: &RayService,
    version: KubeRayVersion,
) -> crate::Result<Classification> {
    classify_with(old, new, version, &ClassifyOptions::default())
}

fn check_groups(spec: &RayClusterSpec, what: &str) -> crate::Result<()> {
    let mut seen = BTreeSet::new();
    for (i, g) in spec.worker_group_specs.iter().flatten().enumerate() {
        match g.group_name.as_deref() {
            None | Some("") => {
                return Err(crate::Error::invalid(
                    format!("{what}.workerGroupSpecs[{i}]"),
                    "worker group without groupName",
                ));
            }
            Some(n) if !seen.insert(n) => {
                return Err(crate::Error::invalid(
                    format!("{what}.workerGroupSpecs[{i}]"),
                    format!("duplicate groupName {n:?}"),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// sha256 over the canonical JSON (sorted keys) of a value, hex, first 12 chars.
pub fn fingerprint(v: &Value) -> String {
    let mut canonical = v.clone();
    canonical.sort_all_objects();
    let digest = Sha256::digest(canonical.to_string().as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..12].to_string()
}

/// The fingerprint that names a change: [`fingerprint`] of the muted cluster
/// spec without its top-level `suspend`. The one derivation for both a
/// RayService's `rayClusterConfig` and a RayCluster's own spec.
///
/// `suspend` is left out for every KubeRay release (not only v1.7.0+, which
/// mutes it for its hash) because a suspension is not a new cluster: Kueue
/// flips it on a managed RayService for a moment (e.g. while it re-derives
/// its Workload) and KubeRay copies it to the pending cluster, so counting it
/// made raygate read "another change" mid-transition (a false
/// `AdmissionMismatch`, measured with Kueue v0.19.0). Suspension is reported
/// by its own rules ([`Classification::outage`], phase `Suspended`), and the
/// verdict still compares the muted forms with `suspend` as KubeRay does.
///
/// What Kueue writes into the pod templates when it starts or stops a job
/// (its Workload's and slice's names, the pod set and queue labels:
/// [`crate::kueue::without_admission_writes`]) is left out too: they change
/// whenever Kueue re-derives the RayService's Workload (raygate's refresh,
/// path B), which made the same change read as another one made during the
/// transition (a false `Batching` Event, measured with Kueue v0.19.0).
pub fn change_fingerprint(muted: &Value) -> Fingerprint {
    let mut v = crate::kueue::without_admission_writes(muted);
    if let Value::Object(m) = &mut v {
        m.remove("suspend");
    }
    Fingerprint::from(fingerprint(&v))
}

fn truncate_groups(v: &Value, n: usize) -> Value {
    let mut v = v.clone();
    if let Some(Value::Array(groups)) = v.get_mut("workerGroupSpecs") {
        groups.truncate(n);
        if groups.is_empty()
            && let Value::Object(m) = &mut v
        {
            m.remove("workerGroupSpecs");
        }
    }
    v
}

fn group_count(v: &Value) -> usize {
    v.get("workerGroupSpecs")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

/// Serve config changes as readable paths.
pub fn serve_config_changes(old: Option<&str>, new: Option<&str>) -> Vec<String> {
    if old == new {
        return Vec::new();
    }
    let root = Path::root("serveConfigV2");
    let parse = |s: Option<&str>| -> Option<Option<Value>> {
        match s {
            None => Some(None),
            Some(s) => serde_saphyr::from_str::<Value>(s)
                .ok()
                .filter(|v| v.is_object() || v.is_null())
                .map(|v| if v.is_null() { None } else { Some(v) }),
        }
    };
    match (parse(old), parse(new)) {
        (Some(a), Some(b)) => {
            let changes = diff::diff_under(&root, a.as_ref(), b.as_ref());
            if changes.is_empty() {
                // Same content, different text: KubeRay still resubmits.
                vec![root.to_string()]
            } else {
                diff::paths(&changes)
            }
        }
        _ => vec![root.to_string()],
    }
}

fn other_spec_changes(old: &RayService, new: &RayService) -> crate::Result<Vec<String>> {
    let strip = |s: &RayService| -> crate::Result<Value> {
        let mut v = serde_json::to_value(&s.spec)?;
        if let Value::Object(m) = &mut v {
            m.remove("rayClusterConfig");
            m.remove("serveConfigV2");
        }
        Ok(v)
    };
    Ok(diff::paths(&diff::diff(&strip(old)?, &strip(new)?)))
}

struct OldInfo {
    spec: Value,
    what: String,
    suspend: bool,
    /// `Some(Ok(n))` parsed annotation, `Some(Err(()))` missing/bad, `None` n/a (RayService).
    group_count: Option<Result<usize, ()>>,
    /// The cluster's kuberay-version annotation (RayCluster side only).
    version_annotation: Option<Option<String>>,
    hash_missing: bool,
}

fn old_info<'a>(old: &OldSide<'a>) -> crate::Result<(OldInfo, Option<&'a RayService>)> {
    match old {
        OldSide::RayService(svc) => {
            let what = format!(
                "RayService {} spec.rayClusterConfig",
                object_name(&svc.metadata)
            );
            let cfg = svc.cluster_config()?;
            check_groups(cfg, &what)?;
            Ok((
                OldInfo {
                    spec: serde_json::to_value(cfg)?,
                    what,
                    suspend: cfg.suspend.unwrap_or(false),
                    group_count: None,
                    version_annotation: None,
                    hash_missing: false,
                },
                Some(svc),
            ))
        }
        OldSide::RayCluster(rc) => {
            let what = format!("RayCluster {} spec", object_name(&rc.metadata));
            check_groups(&rc.spec, &what)?;
            let count = rc
                .annotation(ANNOTATION_NUM_WORKER_GROUPS)
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or(());
            Ok((
                OldInfo {
                    spec: serde_json::to_value(&rc.spec)?,
                    what,
                    suspend: rc.spec.suspend.unwrap_or(false),
                    group_count: Some(count),
                    version_annotation: Some(
                        rc.annotation(ANNOTATION_KUBERAY_VERSION)
                            .map(str::to_string),
                    ),
                    hash_missing: rc.annotation(ANNOTATION_HASH).is_none(),
                },
                None,
            ))
        }
    }
}

/// What changed between the two sides, as readable paths, before any rule applies.
struct Changes {
    old: Normalized,
    new: Normalized,
    /// Every changed cluster field, muted ones included.
    all_paths: Vec<String>,
    /// Changed fields KubeRay hashes.
    hashed_paths: Vec<String>,
    /// Changed fields KubeRay mutes.
    exempt_paths: Vec<String>,
    ignored_paths: Vec<String>,
    serve_config_paths: Vec<String>,
    other_paths: Vec<String>,
}

/// Step 1: both cluster specs as this release hashes them, and their differences.
fn changes(
    old: &OldInfo,
    old_svc: Option<&RayService>,
    new: &RayService,
    new_cfg: &RayClusterSpec,
    new_what: &str,
    rules: &Rules,
) -> crate::Result<Changes> {
    let new_n = normalize_cluster_spec(&serde_json::to_value(new_cfg)?, rules, new_what)?;
    let old_n = normalize_cluster_spec(&old.spec, rules, &old.what)?;

    // The paths that name the change leave Kueue's own pod-template writes
    // out, as its fingerprint does ([`change_fingerprint`]); the verdict
    // still compares the forms KubeRay hashes, with them.
    let named = crate::kueue::without_admission_writes;
    let hashed_paths = diff::paths(&diff::diff(&named(&old_n.muted), &named(&new_n.muted)));
    let hashed: BTreeSet<&String> = hashed_paths.iter().collect();
    let all_paths = diff::paths(&diff::diff(&named(&old_n.full), &named(&new_n.full)));
    let exempt_paths = all_paths
        .iter()
        .filter(|p| !hashed.contains(p))
        .cloned()
        .collect();

    let mut ignored_paths: Vec<String> = old_n
        .pruned
        .iter()
        .chain(new_n.pruned.iter())
        .cloned()
        .collect();
    ignored_paths.sort();
    ignored_paths.dedup();

    let (serve_config_paths, other_paths) = match old_svc {
        Some(o) => (
            serve_config_changes(
                o.spec.serve_config_v2.as_deref(),
                new.spec.serve_config_v2.as_deref(),
            ),
            other_spec_changes(o, new)?,
        ),
        None => (Vec::new(), Vec::new()),
    };
    Ok(Changes {
        old: old_n,
        new: new_n,
        all_paths,
        hashed_paths,
        exempt_paths,
        ignored_paths,
        serve_config_paths,
        other_paths,
    })
}

/// Which changed paths a verdict names as triggering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Triggering {
    Nothing,
    /// The hashed changes; led by the hash annotation when the cluster lacks it.
    Hashed {
        missing_hash: bool,
    },
    /// Every change: the whole spec is applied in place, so nothing is exempt.
    All,
}

/// What KubeRay's checks decided (step 2), before it becomes a [`Classification`].
#[derive(Debug, PartialEq)]
struct Decision {
    verdict: Verdict,
    triggering: Triggering,
    reason: String,
    held_reason: Option<String>,
    rejected: bool,
    incremental: bool,
    outage: Option<String>,
}

impl Decision {
    fn new(verdict: Verdict, triggering: Triggering, reason: impl Into<String>) -> Decision {
        Decision {
            verdict,
            triggering,
            reason: reason.into(),
            held_reason: None,
            rejected: false,
            incremental: false,
            outage: None,
        }
    }
}

/// Step 2: KubeRay's checks in its order (see the module docs); the first that applies decides.
fn decide(
    d: &Changes,
    old: &OldInfo,
    new: &RayService,
    new_suspend: bool,
    s: &Strategy,
    rules: &Rules,
) -> Decision {
    let version = rules.version;
    let serve_changed = !d.serve_config_paths.is_empty();
    let hashed = Triggering::Hashed {
        missing_hash: old.hash_missing,
    };
    let held = |held_reason: String| {
        let serve_note = if serve_changed {
            " The Serve config change is still submitted to the active cluster."
        } else {
            ""
        };
        Decision {
            held_reason: Some(held_reason),
            ..Decision::new(
                Verdict::Held,
                hashed,
                format!(
                    "A new RayCluster would be needed, but KubeRay will not create one.{serve_note}"
                ),
            )
        }
    };

    // 0. validateRayService.
    let invalid = validate::cluster_spec_error(new, &d.new.full, rules)
        .or_else(|| validate_upgrade(new, rules, s.gate));
    if let Some(invalid) = invalid {
        let any_cluster_change = d.old.full != d.new.full || old.hash_missing;
        let decision = if any_cluster_change || serve_changed {
            Decision {
                held_reason: Some(invalid),
                ..Decision::new(
                    Verdict::Held,
                    Triggering::Hashed {
                        missing_hash: false,
                    },
                    "KubeRay rejects the RayService and applies nothing.",
                )
            }
        } else {
            Decision::new(
                Verdict::NoChange,
                Triggering::Nothing,
                "Nothing KubeRay acts on changed (but the RayService fails KubeRay validation).",
            )
        };
        return Decision {
            rejected: true,
            ..decision
        };
    }

    let upgrade_in_progress = new.condition_true(CONDITION_UPGRADE_IN_PROGRESS);

    // 1a. KubeRay-version annotation (RayCluster side, v1.2.0+).
    if rules.version_annotation_updates_in_place
        && !upgrade_in_progress
        && let Some(annotation) = &old.version_annotation
        && annotation.as_deref() != Some(version.tag().as_str())
    {
        return if d.old.full != d.new.full {
            Decision::new(
                Verdict::InPlaceClusterUpdate,
                Triggering::All,
                format!(
                    "The active RayCluster's {ANNOTATION_KUBERAY_VERSION} is {} but the operator is {}: KubeRay rewrites the cluster in place from the RayService (no new cluster).",
                    annotation.as_deref().unwrap_or("unset"),
                    version.tag()
                ),
            )
        } else if serve_changed {
            Decision::new(
                Verdict::ServeConfigUpdate,
                Triggering::Nothing,
                "Only the Serve config changed: resubmitted to the running cluster.",
            )
        } else {
            Decision::new(
                Verdict::NoChange,
                Triggering::Nothing,
                format!(
                    "No spec change; KubeRay refreshes the cluster's annotations to {} in place.",
                    version.tag()
                ),
            )
        };
    }

    // 1b. Suspend toggle (v1.5.2, v1.6.1, v1.6.2).
    // Checked against the real operator by the conformance cases
    // c25-suspend and c26-suspend-and-image (e2e/conformance/cases): the
    // active cluster is rewritten with the image change too, and suspended.
    if rules.suspend_toggle_updates_in_place && !upgrade_in_progress && new_suspend != old.suspend {
        if !new_suspend {
            return Decision::new(
                Verdict::InPlaceClusterUpdate,
                Triggering::All,
                "rayClusterConfig.suspend cleared: KubeRay applies the whole RayService cluster spec in place (shouldUpdateCluster) and the suspended cluster's pods are created again.",
            );
        }
        // The changes KubeRay hashes first (what a new cluster would have
        // been built for), then the muted ones it applies along.
        let others: Vec<&String> = d
            .hashed_paths
            .iter()
            .chain(d.exempt_paths.iter())
            .filter(|p| *p != "suspend")
            .collect();
        let with = match others.as_slice() {
            [] => String::new(),
            [one] => format!(" together with {one}"),
            [first, second] => format!(" together with {first} and {second}"),
            [first, second, rest @ ..] => format!(
                " together with {first}, {second} and {} other change(s)",
                rest.len()
            ),
        };
        return Decision {
            outage: Some(format!(
                "applied in place to the serving cluster: its pods are deleted (outage): \
                 spec.rayClusterConfig.suspend is set to true{with}, and KubeRay {version} rewrites \
                 the active RayCluster with it (shouldUpdateCluster, ray-project/kuberay#4686) instead \
                 of preparing a new one"
            )),
            ..Decision::new(
                Verdict::InPlaceClusterUpdate,
                Triggering::All,
                "rayClusterConfig.suspend set to true: KubeRay applies the whole RayService cluster spec in place to the serving cluster (shouldUpdateCluster) and deletes its pods.",
            )
        };
    }

    // 2. Full hash equality.
    if !old.hash_missing && d.old.muted == d.new.muted {
        return if serve_changed {
            Decision::new(
                Verdict::ServeConfigUpdate,
                Triggering::Nothing,
                "Only the Serve config changed: KubeRay resubmits it to the running cluster.",
            )
        } else if !d.exempt_paths.is_empty() {
            Decision::new(
                Verdict::NoChange,
                Triggering::Nothing,
                format!(
                    "Only fields KubeRay {} mutes changed; the cluster is left as is.",
                    version.tag()
                ),
            )
        } else {
            Decision::new(
                Verdict::NoChange,
                Triggering::Nothing,
                "Nothing KubeRay acts on changed.",
            )
        };
    }

    // 3. Worker groups appended at the end.
    let old_count = match old.group_count {
        None => Ok(group_count(&d.old.muted)),
        Some(r) => r,
    };
    match old_count {
        Err(()) => {
            return match rules.bad_group_count_annotation {
                BadGroupCountAnnotation::UpdateInPlace => Decision::new(
                    Verdict::InPlaceClusterUpdate,
                    hashed,
                    format!(
                        "The active RayCluster's {ANNOTATION_NUM_WORKER_GROUPS} annotation is missing or not a number: KubeRay {} treats that as 'groups appended' and updates the cluster in place.",
                        version.tag()
                    ),
                ),
                BadGroupCountAnnotation::DoNothing => held(format!(
                    "The active RayCluster's {ANNOTATION_NUM_WORKER_GROUPS} annotation is missing or not a number: KubeRay {} does nothing",
                    version.tag()
                )),
            };
        }
        // v1.1–v1.2 check `goal > n`, v1.3.0+ `goal >= n`; with `goal == n` the
        // truncated hash is the full hash, which already differed, so both reduce to
        // "more groups now, and the first n hash equal".
        Ok(n) => {
            if rules.in_place_append
                && group_count(&d.new.muted) > n
                && !old.hash_missing
                && truncate_groups(&d.new.muted, n) == truncate_groups(&d.old.muted, n)
            {
                return Decision::new(
                    Verdict::InPlaceClusterUpdate,
                    hashed,
                    format!(
                        "Worker groups were only appended at the end: KubeRay {} adds them to the running cluster in place.",
                        version.tag()
                    ),
                );
            }
        }
    }

    // 4. New cluster, unless rolling back or zero-downtime is off.
    if rules.rollback_blocks_new_cluster && new.condition_true(CONDITION_ROLLBACK_IN_PROGRESS) {
        return held(
            "the RayService has condition RollbackInProgress: KubeRay prepares no new cluster until the rollback completes".into(),
        );
    }
    if !s.zero_downtime {
        return held(s.zero_downtime_off.clone());
    }
    let mut reason = if s.incremental {
        "The cluster spec changed: KubeRay creates a new RayCluster and moves traffic to it incrementally (NewClusterWithIncrementalUpgrade)."
            .to_string()
    } else {
        "The cluster spec changed: KubeRay creates a new RayCluster next to the active one and switches over when it is ready."
            .to_string()
    };
    if serve_changed {
        reason.push_str(" The new Serve config is deployed on the new cluster.");
    }
    Decision {
        incremental: s.incremental,
        ..Decision::new(Verdict::NewCluster, hashed, reason)
    }
}

/// Step 3: the decision with the paths it names, as reported.
fn classification(
    d: Changes,
    s: Strategy,
    decision: Decision,
    version: KubeRayVersion,
) -> Classification {
    let (triggering_paths, exempt_paths) = match decision.triggering {
        Triggering::Nothing => (Vec::new(), d.exempt_paths),
        Triggering::Hashed { missing_hash } => {
            let mut paths = d.hashed_paths;
            if missing_hash {
                paths.insert(0, format!("metadata.annotations[{ANNOTATION_HASH}]"));
            }
            (paths, d.exempt_paths)
        }
        Triggering::All => (d.all_paths, Vec::new()),
    };
    Classification {
        verdict: decision.verdict,
        held_reason: decision.held_reason,
        rejected: decision.rejected,
        triggering_paths,
        exempt_paths,
        serve_config_paths: d.serve_config_paths,
        other_paths: d.other_paths,
        ignored_paths: d.ignored_paths,
        kuberay_version: version,
        upgrade_strategy: s.given,
        zero_downtime: s.zero_downtime,
        incremental: decision.incremental,
        fingerprint: change_fingerprint(&d.new.muted),
        reason: decision.reason,
        outage: decision.outage,
    }
}

/// Classify a change from `old` to `new` under the given KubeRay release: what
/// changed, what KubeRay's checks make of it, and the report.
pub fn classify_with(
    old: &OldSide<'_>,
    new: &RayService,
    version: KubeRayVersion,
    opts: &ClassifyOptions,
) -> crate::Result<Classification> {
    let rules = version.rules();
    let new_what = format!(
        "RayService {} spec.rayClusterConfig",
        object_name(&new.metadata)
    );
    let new_cfg = new.cluster_config()?;
    check_groups(new_cfg, &new_what)?;
    let (old, old_svc) = old_info(old)?;
    let changes = changes(&old, old_svc, new, new_cfg, &new_what, &rules)?;
    let strategy = strategy(new, &rules, opts);
    let decision = decide(
        &changes,
        &old,
        new,
        new_cfg.suspend.unwrap_or(false),
        &strategy,
        &rules,
    );
    Ok(classification(changes, strategy, decision, version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberay::types::Condition;
    use serde_json::json;

    const SVC: &str = include_str!("../../tests/fixtures/rayservice-llm.yaml");
    const ACTIVE: &str = include_str!("../../tests/fixtures/raycluster-llm-active.yaml");

    fn svc() -> RayService {
        serde_saphyr::from_str(SVC).unwrap()
    }
    fn active() -> RayCluster {
        serde_saphyr::from_str(ACTIVE).unwrap()
    }
    fn ver(s: &str) -> KubeRayVersion {
        KubeRayVersion::parse(s).unwrap()
    }
    /// Mutate the RayService through JSON.
    fn edit(base: &RayService, f: impl FnOnce(&mut Value)) -> RayService {
        let mut v = serde_json::to_value(base).unwrap();
        f(&mut v);
        serde_json::from_value(v).unwrap()
    }
    fn cfg(v: &mut Value) -> &mut Value {
        &mut v["spec"]["rayClusterConfig"]
    }
    fn worker(v: &mut Value) -> &mut Value {
        &mut v["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    }
    fn run(old: &RayService, new: &RayService, v: &str) -> Classification {
        classify(&OldSide::RayService(old), new, ver(v)).unwrap()
    }
    const IMAGE: &str = "workerGroupSpecs[gpu-workers].template.spec.containers[ray-worker].image";

    fn bump_image(v: &mut Value) {
        worker(v)["template"]["spec"]["containers"][0]["image"] =
            json!("rayproject/ray-ml:2.42.0-py311-gpu");
    }

    #[test]
    fn no_change() {
        let c = run(&svc(), &svc(), "1.7");
        assert_eq!(c.verdict, Verdict::NoChange);
        assert!(
            c.triggering_paths.is_empty()
                && c.exempt_paths.is_empty()
                && c.serve_config_paths.is_empty()
        );
        assert_eq!(c.fingerprint.len(), 12);
        assert_eq!(c.kuberay_version, ver("1.7.0"));
        assert_eq!(c.upgrade_strategy, Some(UpgradeType::NewCluster));
    }

    #[test]
    fn replicas_only_is_exempt() {
        let new = edit(&svc(), |v| worker(v)["replicas"] = json!(4));
        let c = run(&svc(), &new, "1.7");
        assert_eq!(c.verdict, Verdict::NoChange);
        assert_eq!(
            c.exempt_paths,
            vec!["workerGroupSpecs[gpu-workers].replicas"]
        );
        assert_eq!(c.fingerprint, run(&svc(), &svc(), "1.7").fingerprint);
    }

    #[test]
    fn image_bump_new_cluster() {
        let new = edit(&svc(), |v| {
            bump_image(v);
            worker(v)["replicas"] = json!(3);
        });
        let c = run(&svc(), &new, "1.7");
        assert_eq!(c.verdict, Verdict::NewCluster);
        assert_eq!(c.triggering_paths, vec![IMAGE]);
        assert_eq!(
            c.exempt_paths,
            vec!["workerGroupSpecs[gpu-workers].replicas"]
        );
        assert!(!c.incremental);
        assert_ne!(c.fingerprint, run(&svc(), &svc(), "1.7").fingerprint);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["verdict"], "NewCluster");
        assert_eq!(json["triggeringPaths"][0], IMAGE);
        assert_eq!(json["kuberayVersion"], "v1.7.0");
        assert_eq!(json["upgradeStrategy"], "NewCluster");
        assert!(json.get("heldReason").is_none());
    }

    #[test]
    fn serve_config_update() {
        let new = edit(&svc(), |v| {
            let s = v["spec"]["serveConfigV2"]
                .as_str()
                .unwrap()
                .replace("num_replicas: 2", "num_replicas: 3");
            v["spec"]["serveConfigV2"] = json!(s);
        });
        let c = run(&svc(), &new, "1.7");
        assert_eq!(c.verdict, Verdict::ServeConfigUpdate);
        assert_eq!(
            c.serve_config_paths,
            vec!["serveConfigV2.applications[llm].deployments[VLLMDeployment].num_replicas"]
        );
        assert_eq!(c.fingerprint, run(&svc(), &svc(), "1.7").fingerprint);
        // An added app, and an unparseable config.
        let added = edit(&svc(), |v| {
            let s = v["spec"]["serveConfigV2"].as_str().unwrap().to_string()
                + "  - name: rerank\n    import_path: rerank:app\n";
            v["spec"]["serveConfigV2"] = json!(s);
        });
        assert_eq!(
            run(&svc(), &added, "1.7").serve_config_paths,
            vec!["serveConfigV2.applications[rerank]"]
        );
        let broken = edit(&svc(), |v| {
            v["spec"]["serveConfigV2"] = json!("applications: [: bad")
        });
        let c = run(&svc(), &broken, "1.7");
        assert_eq!(c.verdict, Verdict::ServeConfigUpdate);
        assert_eq!(c.serve_config_paths, vec!["serveConfigV2"]);
    }

    #[test]
    fn append_group_in_place_in_every_version() {
        let new = edit(&svc(), |v| {
            let mut g = worker(v).clone();
            g["groupName"] = json!("spare");
            cfg(v)["workerGroupSpecs"].as_array_mut().unwrap().push(g);
        });
        for v in KubeRayVersion::supported() {
            let c = classify(&OldSide::RayService(&svc()), &new, *v).unwrap();
            assert_eq!(c.verdict, Verdict::InPlaceClusterUpdate, "{v}");
            assert_eq!(c.triggering_paths, vec!["workerGroupSpecs[spare]"], "{v}");
        }
        // Appended but an existing group changed too → new cluster.
        let both = edit(&new, bump_image);
        assert_eq!(run(&svc(), &both, "1.7").verdict, Verdict::NewCluster);
        // Inserted at the front → new cluster.
        let front = edit(&svc(), |v| {
            let mut g = worker(v).clone();
            g["groupName"] = json!("spare");
            cfg(v)["workerGroupSpecs"]
                .as_array_mut()
                .unwrap()
                .insert(0, g);
        });
        assert_eq!(run(&svc(), &front, "1.7").verdict, Verdict::NewCluster);
        // Removing a group → new cluster.
        let removed = edit(&svc(), |v| cfg(v)["workerGroupSpecs"] = json!([]));
        let c = run(&svc(), &removed, "1.7");
        assert_eq!(c.verdict, Verdict::NewCluster);
        assert_eq!(c.triggering_paths, vec!["workerGroupSpecs"]);
    }

    #[test]
    fn held_with_none_and_with_zero_downtime_disabled() {
        let none = edit(&svc(), |v| {
            v["spec"]["upgradeStrategy"]["type"] = json!("None");
            bump_image(v);
        });
        let c = run(&svc(), &none, "1.7");
        assert_eq!(c.verdict, Verdict::Held);
        assert_eq!(c.triggering_paths, vec![IMAGE]);
        assert!(
            c.held_reason.as_deref().unwrap().contains("None"),
            "{:?}",
            c.held_reason
        );
        assert!(!c.zero_downtime);
        assert_eq!(c.other_paths, vec!["upgradeStrategy.type"]);

        let unset = edit(&svc(), |v| {
            v["spec"].as_object_mut().unwrap().remove("upgradeStrategy");
            bump_image(v);
        });
        let off = ClassifyOptions {
            zero_downtime_enabled: false,
            ..Default::default()
        };
        let c = classify_with(&OldSide::RayService(&svc()), &unset, ver("1.7"), &off).unwrap();
        assert_eq!(c.verdict, Verdict::Held);
        assert!(
            c.held_reason
                .as_deref()
                .unwrap()
                .contains("ENABLE_ZERO_DOWNTIME")
        );
        // upgradeStrategy.type takes precedence over the env var.
        let typed = edit(&svc(), bump_image);
        let c = classify_with(&OldSide::RayService(&svc()), &typed, ver("1.7"), &off).unwrap();
        assert_eq!(c.verdict, Verdict::NewCluster);
        // Before v1.3 the field does not exist: only the env var counts.
        let c = classify(&OldSide::RayService(&svc()), &none, ver("1.2")).unwrap();
        assert_eq!(c.verdict, Verdict::NewCluster);
        // Held still reports the serve change (applied to the active cluster).
        let both = edit(&none, |v| {
            let s = v["spec"]["serveConfigV2"]
                .as_str()
                .unwrap()
                .replace("num_replicas: 1", "num_replicas: 2");
            v["spec"]["serveConfigV2"] = json!(s);
        });
        let c = run(&svc(), &both, "1.7");
        assert_eq!(c.verdict, Verdict::Held);
        assert_eq!(
            c.serve_config_paths,
            vec!["serveConfigV2.applications[embed].deployments[Embedder].num_replicas"]
        );
        assert!(c.reason.contains("still submitted"));
    }

    fn incremental(v: &mut Value) {
        v["spec"]["upgradeStrategy"] = json!({"type": "NewClusterWithIncrementalUpgrade",
            "clusterUpgradeOptions": {"maxSurgePercent": 50, "stepSizePercent": 25, "intervalSeconds": 30, "gatewayClassName": "istio"}});
        bump_image(v);
    }

    #[test]
    fn incremental_upgrade_per_version() {
        let new = edit(&svc(), incremental);
        let c = run(&svc(), &new, "1.7");
        assert_eq!(c.verdict, Verdict::NewCluster);
        assert!(c.incremental && c.zero_downtime);
        // v1.5–v1.6: feature gate off by default → zero-downtime disabled → held.
        let c = run(&svc(), &new, "1.6");
        assert_eq!(c.verdict, Verdict::Held);
        assert!(
            c.held_reason
                .unwrap()
                .contains("RayServiceIncrementalUpgrade")
        );
        let gate_on = ClassifyOptions {
            incremental_upgrade_gate: Some(true),
            ..Default::default()
        };
        let c = classify_with(&OldSide::RayService(&svc()), &new, ver("1.5"), &gate_on).unwrap();
        assert_eq!(c.verdict, Verdict::NewCluster);
        assert!(c.incremental);
        // v1.3–v1.4: not a valid type → validation fails → nothing applied.
        let c = run(&svc(), &new, "1.4");
        assert_eq!(c.verdict, Verdict::Held);
        assert!(c.held_reason.unwrap().contains("invalid"));
        // Incomplete options / no autoscaling fail validation in v1.7.
        let no_opts = edit(&new, |v| {
            v["spec"]["upgradeStrategy"]
                .as_object_mut()
                .unwrap()
                .remove("clusterUpgradeOptions");
        });
        assert!(
            run(&svc(), &no_opts, "1.7")
                .held_reason
                .unwrap()
                .contains("clusterUpgradeOptions")
        );
        let no_autoscaling = edit(&new, |v| cfg(v)["enableInTreeAutoscaling"] = json!(false));
        assert!(
            run(&svc(), &no_autoscaling, "1.7")
                .held_reason
                .unwrap()
                .contains("enableInTreeAutoscaling")
        );
        let bogus = edit(&svc(), |v| {
            v["spec"]["upgradeStrategy"]["type"] = json!("BlueGreen");
            bump_image(v);
        });
        let c = run(&svc(), &bogus, "1.7");
        assert_eq!(c.verdict, Verdict::Held);
        assert_eq!(
            c.upgrade_strategy,
            Some(UpgradeType::Other("BlueGreen".into()))
        );
    }

    /// `stepSizePercent > maxSurgePercent` is rejected by v1.7.0 only (kuberay#4663);
    /// v1.5.2 and v1.6.2 with the gate on accept it and create the new cluster.
    #[test]
    fn step_size_above_max_surge_rejected_from_v1_7() {
        let over = edit(&edit(&svc(), incremental), |v| {
            v["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["stepSizePercent"] = json!(60);
        });
        let c = run(&svc(), &over, "1.7");
        assert!(c.rejected);
        assert_eq!(c.verdict, Verdict::Held);
        let why = c.held_reason.unwrap();
        assert!(
            why.contains("stepSizePercent 60") && why.contains("maxSurgePercent 50"),
            "{why}"
        );
        let gate_on = ClassifyOptions {
            incremental_upgrade_gate: Some(true),
            ..Default::default()
        };
        for v in ["1.5.2", "1.6.2"] {
            let c = classify_with(&OldSide::RayService(&svc()), &over, ver(v), &gate_on).unwrap();
            assert!(!c.rejected, "{v}");
            assert_eq!(c.verdict, Verdict::NewCluster, "{v}");
            assert!(c.incremental, "{v}");
        }
        // Out of range is rejected by every release with the type.
        let out = edit(&over, |v| {
            v["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["stepSizePercent"] = json!(101);
        });
        let c = classify_with(&OldSide::RayService(&svc()), &out, ver("1.6.2"), &gate_on).unwrap();
        assert!(c.rejected);
    }

    /// (field, mutation) pairs for the muted-field table.
    type Edit = Box<dyn Fn(&mut Value)>;

    fn field_edits() -> Vec<(&'static str, Edit)> {
        vec![
            (
                "replicas",
                Box::new(|v: &mut Value| worker(v)["replicas"] = json!(3)),
            ),
            (
                "minReplicas",
                Box::new(|v: &mut Value| worker(v)["minReplicas"] = json!(2)),
            ),
            (
                "maxReplicas",
                Box::new(|v: &mut Value| worker(v)["maxReplicas"] = json!(8)),
            ),
            (
                "workersToDelete",
                Box::new(|v: &mut Value| {
                    worker(v)["scaleStrategy"] =
                        json!({"workersToDelete": ["llm-gpu-workers-worker-abc"]})
                }),
            ),
            (
                "workerTolerations",
                Box::new(|v: &mut Value| {
                    worker(v)["template"]["spec"]["tolerations"] =
                        json!([{"key": "kueue", "operator": "Exists"}])
                }),
            ),
            (
                "workerSchedulingGates",
                Box::new(|v: &mut Value| {
                    worker(v)["template"]["spec"]["schedulingGates"] =
                        json!([{"name": "kueue.x-k8s.io/admission"}])
                }),
            ),
            (
                "headTolerations",
                Box::new(|v: &mut Value| {
                    cfg(v)["headGroupSpec"]["template"]["spec"]["tolerations"] =
                        json!([{"key": "kueue", "operator": "Exists"}])
                }),
            ),
            (
                "headSchedulingGates",
                Box::new(|v: &mut Value| {
                    cfg(v)["headGroupSpec"]["template"]["spec"]["schedulingGates"] =
                        json!([{"name": "kueue.x-k8s.io/admission"}])
                }),
            ),
            (
                "clusterUpgradeStrategy",
                Box::new(|v: &mut Value| cfg(v)["upgradeStrategy"] = json!({"type": "Recreate"})),
            ),
            (
                "suspend",
                Box::new(|v: &mut Value| cfg(v)["suspend"] = json!(true)),
            ),
        ]
    }

    fn expected(field: &str, v: KubeRayVersion) -> Verdict {
        let at_least = |s: &str| v >= ver(s);
        let suspend_in_place = [ver("1.5.2"), ver("1.6.1"), ver("1.6.2")].contains(&v);
        let muted = match field {
            "replicas" | "workersToDelete" => true,
            "minReplicas" | "maxReplicas" => at_least("1.2.0"),
            "workerTolerations"
            | "workerSchedulingGates"
            | "headTolerations"
            | "headSchedulingGates" => v == ver("1.5.2") || at_least("1.6.0"),
            // Unknown before v1.6.0: pruned, so it cannot trigger either.
            "clusterUpgradeStrategy" => true,
            "suspend" => at_least("1.7.0"),
            _ => false,
        };
        if field == "suspend" && suspend_in_place {
            Verdict::InPlaceClusterUpdate
        } else if muted {
            Verdict::NoChange
        } else {
            Verdict::NewCluster
        }
    }

    #[test]
    fn muted_fields_per_version_table() {
        for v in KubeRayVersion::supported() {
            for (field, f) in field_edits() {
                let new = edit(&svc(), |x| f(x));
                let c = classify(&OldSide::RayService(&svc()), &new, *v).unwrap();
                assert_eq!(c.verdict, expected(field, *v), "{field} @ {v}: {c:?}");
                if c.verdict == Verdict::NoChange {
                    let listed = !c.exempt_paths.is_empty() || !c.ignored_paths.is_empty();
                    assert!(
                        listed,
                        "{field} @ {v}: change must be reported as exempt or ignored"
                    );
                    assert_eq!(
                        c.fingerprint,
                        run(&svc(), &svc(), &v.to_string()).fingerprint,
                        "{field} @ {v}"
                    );
                }
            }
        }
    }

    #[test]
    fn quantity_equivalence_like_go() {
        let milli = edit(&svc(), |v| {
            worker(v)["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] =
                json!("8000m")
        });
        assert_eq!(run(&svc(), &milli, "1.7").verdict, Verdict::NoChange);
        let base = edit(&svc(), |v| {
            worker(v)["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] =
                json!("1Gi")
        });
        let bytes = edit(&svc(), |v| {
            worker(v)["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] =
                json!("1073741824")
        });
        let c = run(&base, &bytes, "1.7");
        assert_eq!(c.verdict, Verdict::NewCluster);
        assert_eq!(
            c.triggering_paths,
            vec![
                "workerGroupSpecs[gpu-workers].template.spec.containers[ray-worker].resources.limits[memory]"
            ]
        );
        let gpu = edit(&svc(), |v| {
            worker(v)["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] =
                json!(2)
        });
        assert_eq!(
            run(&svc(), &gpu, "1.7").triggering_paths,
            vec![
                "workerGroupSpecs[gpu-workers].template.spec.containers[ray-worker].resources.limits[nvidia.com/gpu]"
            ]
        );
    }

    #[test]
    fn defaults_and_empties() {
        let hosts1 = edit(&svc(), |v| worker(v)["numOfHosts"] = json!(1));
        assert_eq!(run(&svc(), &hosts1, "1.7").verdict, Verdict::NoChange);
        let hosts2 = edit(&svc(), |v| worker(v)["numOfHosts"] = json!(2));
        let c = run(&svc(), &hosts2, "1.7");
        assert_eq!(c.verdict, Verdict::NewCluster);
        assert_eq!(
            c.triggering_paths,
            vec!["workerGroupSpecs[gpu-workers].numOfHosts"]
        );
        let empties = edit(&svc(), |v| {
            worker(v)["template"]["spec"]["containers"][0]["args"] = json!([]);
            worker(v)["template"]["metadata"] = json!({"annotations": {}});
            cfg(v)["headServiceAnnotations"] = json!(null);
        });
        assert_eq!(run(&svc(), &empties, "1.7").verdict, Verdict::NoChange);
        let autoscale_off = edit(&svc(), |v| {
            cfg(v)
                .as_object_mut()
                .unwrap()
                .remove("enableInTreeAutoscaling");
        });
        let explicit_false = edit(&svc(), |v| cfg(v)["enableInTreeAutoscaling"] = json!(false));
        let c = run(&autoscale_off, &explicit_false, "1.7");
        assert_eq!(c.verdict, Verdict::NewCluster, "Go keeps *bool false");
        assert_eq!(c.triggering_paths, vec!["enableInTreeAutoscaling"]);
        let reordered = edit(&svc(), |v| {
            let mut g = worker(v).clone();
            g["groupName"] = json!("b");
            let mut a = g.clone();
            a["groupName"] = json!("a");
            cfg(v)["workerGroupSpecs"] = json!([a, g]);
        });
        let swapped = edit(&reordered, |v| {
            let groups = cfg(v)["workerGroupSpecs"].as_array_mut().unwrap();
            groups.swap(0, 1);
        });
        let c = run(&reordered, &swapped, "1.7");
        assert_eq!(c.verdict, Verdict::NewCluster);
        assert_eq!(c.triggering_paths, vec!["workerGroupSpecs (order)"]);
    }

    #[test]
    fn live_cluster_as_old_side() {
        let rc = active();
        let c = classify(&OldSide::RayCluster(&rc), &svc(), ver("1.7")).unwrap();
        assert_eq!(c.verdict, Verdict::NoChange, "{c:?}");
        assert_eq!(
            c.exempt_paths,
            vec!["workerGroupSpecs[gpu-workers].replicas"]
        );
        assert!(c.serve_config_paths.is_empty());
        let new = edit(&svc(), bump_image);
        let c = classify(&OldSide::RayCluster(&rc), &new, ver("1.7")).unwrap();
        assert_eq!(c.verdict, Verdict::NewCluster);
        assert_eq!(c.triggering_paths, vec![IMAGE]);
        let appended = edit(&svc(), |v| {
            let mut g = worker(v).clone();
            g["groupName"] = json!("spare");
            cfg(v)["workerGroupSpecs"].as_array_mut().unwrap().push(g);
        });
        let c = classify(&OldSide::RayCluster(&rc), &appended, ver("1.7")).unwrap();
        assert_eq!(c.verdict, Verdict::InPlaceClusterUpdate);
    }

    fn annotate(rc: &RayCluster, key: &str, value: Option<&str>) -> RayCluster {
        let mut rc = rc.clone();
        let ann = rc.metadata.annotations.get_or_insert_with(Default::default);
        match value {
            Some(v) => ann.insert(key.to_string(), v.to_string()),
            None => ann.remove(key),
        };
        rc
    }

    #[test]
    fn kuberay_version_annotation_rule() {
        let new = edit(&svc(), bump_image);
        // Operator upgraded to v1.7.0, cluster created by v1.6.2: rewritten in place.
        let rc = annotate(&active(), ANNOTATION_KUBERAY_VERSION, Some("v1.6.2"));
        let c = classify(&OldSide::RayCluster(&rc), &new, ver("1.7")).unwrap();
        assert_eq!(c.verdict, Verdict::InPlaceClusterUpdate);
        assert!(c.triggering_paths.contains(&IMAGE.to_string()));
        assert!(c.reason.contains("v1.6.2"));
        // Missing annotation counts as different.
        let rc_none = annotate(&active(), ANNOTATION_KUBERAY_VERSION, None);
        assert_eq!(
            classify(&OldSide::RayCluster(&rc_none), &new, ver("1.7"))
                .unwrap()
                .verdict,
            Verdict::InPlaceClusterUpdate
        );
        // v1.1 has no such rule.
        assert_eq!(
            classify(&OldSide::RayCluster(&rc), &new, ver("1.1"))
                .unwrap()
                .verdict,
            Verdict::NewCluster
        );
        // Skipped while UpgradeInProgress.
        let upgrading = {
            let mut s = new.clone();
            s.status = Some(crate::kuberay::types::RayServiceStatuses {
                conditions: Some(vec![Condition {
                    type_: Some(CONDITION_UPGRADE_IN_PROGRESS.into()),
                    status: Some("True".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            });
            s
        };
        assert_eq!(
            classify(&OldSide::RayCluster(&rc), &upgrading, ver("1.7"))
                .unwrap()
                .verdict,
            Verdict::NewCluster
        );
        // No spec change: nothing to do but refresh annotations.
        let c = classify(&OldSide::RayCluster(&rc), &svc(), ver("1.7")).unwrap();
        assert_eq!(
            c.verdict,
            Verdict::InPlaceClusterUpdate,
            "replicas 3 → 2 are rewritten too"
        );
        assert_eq!(
            c.triggering_paths,
            vec!["workerGroupSpecs[gpu-workers].replicas"]
        );
    }

    #[test]
    fn cluster_annotations_missing() {
        let new = edit(&svc(), bump_image);
        let no_count = annotate(&active(), ANNOTATION_NUM_WORKER_GROUPS, None);
        assert_eq!(
            classify(&OldSide::RayCluster(&no_count), &new, ver("1.7"))
                .unwrap()
                .verdict,
            Verdict::InPlaceClusterUpdate
        );
        let old = annotate(&no_count, ANNOTATION_KUBERAY_VERSION, Some("v1.2.0"));
        let c = classify(&OldSide::RayCluster(&old), &new, ver("1.2.0")).unwrap();
        assert_eq!(c.verdict, Verdict::Held);
        assert!(
            c.held_reason
                .unwrap()
                .contains(ANNOTATION_NUM_WORKER_GROUPS)
        );
        let no_hash = annotate(&active(), ANNOTATION_HASH, None);
        let c = classify(&OldSide::RayCluster(&no_hash), &svc(), ver("1.7")).unwrap();
        assert_eq!(c.verdict, Verdict::NewCluster);
        assert_eq!(
            c.triggering_paths,
            vec![format!("metadata.annotations[{ANNOTATION_HASH}]")]
        );
    }

    #[test]
    fn malformed_input_is_an_error() {
        let no_cfg = edit(&svc(), |v| {
            v["spec"]
                .as_object_mut()
                .unwrap()
                .remove("rayClusterConfig");
        });
        let err = classify(&OldSide::RayService(&svc()), &no_cfg, ver("1.7"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ml/llm") && err.contains("rayClusterConfig"),
            "{err}"
        );
        let err = classify(&OldSide::RayService(&no_cfg), &svc(), ver("1.7"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("rayClusterConfig"), "{err}");
        let nameless = edit(&svc(), |v| {
            worker(v).as_object_mut().unwrap().remove("groupName");
        });
        let err = classify(&OldSide::RayService(&svc()), &nameless, ver("1.7"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("workerGroupSpecs[0]") && err.contains("groupName"),
            "{err}"
        );
        let bad_q = edit(&svc(), |v| {
            worker(v)["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] =
                json!("30 GiB")
        });
        match classify(&OldSide::RayService(&svc()), &bad_q, ver("1.7")).unwrap_err() {
            crate::Error::Quantity { field, .. } => {
                assert!(
                    field.ends_with(
                        "workerGroupSpecs[0].template.spec.containers[0].resources.limits.memory"
                    ),
                    "{field}"
                )
            }
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn ignored_fields_reported() {
        let new = edit(&svc(), |v| worker(v)["priority"] = json!(5));
        let c = run(&svc(), &new, "1.6");
        assert_eq!(c.verdict, Verdict::NoChange);
        assert_eq!(
            c.ignored_paths,
            vec!["workerGroupSpecs[gpu-workers].priority"]
        );
        // v1.7.0 knows the field and validates it: a priority needs Ray 2.56 and
        // autoscaler v2.
        let c = run(&svc(), &new, "1.7");
        assert_eq!((c.verdict, c.rejected), (Verdict::Held, true));
        assert!(c.held_reason.unwrap().contains("priority"));
    }

    #[test]
    fn validation_rejects_and_applies_nothing() {
        // minReplicas > maxReplicas: v1.6 validation rejects the RayService, v1.5.2 mutes it.
        let bad_bounds = edit(&svc(), |v| {
            worker(v)["minReplicas"] = json!(50);
            bump_image(v);
        });
        let c = run(&svc(), &bad_bounds, "1.6.1");
        assert_eq!(c.verdict, Verdict::Held);
        assert!(c.rejected);
        assert!(c.held_reason.unwrap().contains("greater than maxReplicas"));
        let c = run(&svc(), &bad_bounds, "1.5.2");
        assert_eq!(c.verdict, Verdict::NewCluster);
        assert!(!c.rejected);
        // Worker-group suspend: the RayJobDeletionPolicy gate is off by default in v1.5.
        let suspended = edit(&svc(), |v| worker(v)["suspend"] = json!(true));
        let c = run(&svc(), &suspended, "1.5.2");
        assert_eq!((c.verdict, c.rejected), (Verdict::Held, true));
        // Rejected: the Serve config is not submitted either.
        let serve_too = edit(&suspended, |v| {
            v["spec"]["serveConfigV2"] = json!("applications: []\n");
        });
        let c = run(&svc(), &serve_too, "1.5.2");
        assert_eq!((c.verdict, c.rejected), (Verdict::Held, true));
        assert!(c.reason.contains("applies nothing"), "{}", c.reason);
        let unchanged = run(&suspended, &suspended, "1.5.2");
        assert_eq!(
            (unchanged.verdict, unchanged.rejected),
            (Verdict::NoChange, true)
        );
        assert!(!run(&svc(), &svc(), "1.5.2").rejected);
    }

    #[test]
    fn auth_options_known_from_v1_5_2() {
        let base = edit(&svc(), |v| cfg(v)["rayVersion"] = json!("2.52.0"));
        let token = edit(&base, |v| cfg(v)["authOptions"] = json!({"mode": "token"}));
        for (ver_s, verdict) in [
            ("1.5.0", Verdict::NoChange),
            ("1.5.2", Verdict::NewCluster),
            ("1.6.1", Verdict::NewCluster),
        ] {
            let c = run(&base, &token, ver_s);
            assert_eq!(c.verdict, verdict, "{ver_s}");
        }
        assert_eq!(
            run(&base, &token, "1.5.0").ignored_paths,
            vec!["authOptions"]
        );
    }

    #[test]
    fn other_spec_fields() {
        let new = edit(&svc(), |v| {
            v["spec"]["rayClusterDeletionDelaySeconds"] = json!(300)
        });
        let c = run(&svc(), &new, "1.7");
        assert_eq!(c.verdict, Verdict::NoChange);
        assert_eq!(c.other_paths, vec!["rayClusterDeletionDelaySeconds"]);
    }

    #[test]
    fn fingerprint_is_of_the_canonical_json() {
        // sha256 of `{"a":[{"c":null,"d":"x\"y"}],"b":1.5,"z":true}`: keys sorted at
        // every level, no spaces, arrays in order.
        let v = json!({"z": true, "b": 1.5, "a": [{"d": "x\"y", "c": null}]});
        assert_eq!(fingerprint(&v), "7e3ff6fc6b18");
    }

    #[test]
    fn the_decision_names_its_paths() {
        let norm = || Normalized {
            full: json!({}),
            muted: json!({}),
            pruned: vec![],
        };
        let changes = || Changes {
            old: norm(),
            new: norm(),
            all_paths: vec!["a".into(), "workerGroupSpecs[g].replicas".into()],
            hashed_paths: vec!["a".into()],
            exempt_paths: vec!["workerGroupSpecs[g].replicas".into()],
            ignored_paths: vec![],
            serve_config_paths: vec![],
            other_paths: vec![],
        };
        let strategy = || strategy(&svc(), &ver("1.7").rules(), &ClassifyOptions::default());
        let run = |t: Triggering| {
            let d = Decision::new(Verdict::NewCluster, t, "r");
            classification(changes(), strategy(), d, ver("1.7"))
        };
        let c = run(Triggering::Hashed { missing_hash: true });
        assert_eq!(
            c.triggering_paths,
            [
                format!("metadata.annotations[{ANNOTATION_HASH}]"),
                "a".into()
            ]
        );
        assert_eq!(c.exempt_paths, ["workerGroupSpecs[g].replicas"]);
        let c = run(Triggering::All);
        assert_eq!(c.triggering_paths, ["a", "workerGroupSpecs[g].replicas"]);
        assert!(c.exempt_paths.is_empty());
        let c = run(Triggering::Nothing);
        assert!(c.triggering_paths.is_empty());
        assert_eq!(c.fingerprint, fingerprint(&json!({})));
    }

    #[test]
    fn the_change_fingerprint_leaves_suspend_out_for_every_release() {
        // Regression: Kueue's transient `suspend: true` on a managed
        // RayService made its change look like another one (AdmissionMismatch).
        let suspended = |on: bool| {
            edit(&svc(), |v| {
                v["spec"]["rayClusterConfig"]["suspend"] = json!(on)
            })
        };
        for v in KubeRayVersion::supported() {
            let base = classify(&OldSide::RayService(&svc()), &svc(), *v).unwrap();
            for on in [true, false] {
                let c = classify(&OldSide::RayService(&svc()), &suspended(on), *v).unwrap();
                assert_eq!(c.fingerprint, base.fingerprint, "suspend {on} @ {v}");
            }
            // Suspend together with an image bump: the image bump's fingerprint.
            let bumped = edit(&svc(), bump_image);
            let both = edit(&bumped, |x| {
                x["spec"]["rayClusterConfig"]["suspend"] = json!(true)
            });
            let a = classify(&OldSide::RayService(&svc()), &bumped, *v).unwrap();
            let b = classify(&OldSide::RayService(&svc()), &both, *v).unwrap();
            assert_eq!(a.fingerprint, b.fingerprint, "image + suspend @ {v}");
            assert_ne!(a.fingerprint, base.fingerprint, "image @ {v}");
        }
        // Kueue's Workload annotations on the pod templates (renamed when
        // raygate has Kueue derive the Workload again) are no change either;
        // a user's annotation is.
        let annotated = |wl: &str, user: Option<&str>| {
            let mut a = json!({"kueue.x-k8s.io/workload": wl,
                "kueue.x-k8s.io/workload-slice-name": wl});
            if let Some(u) = user {
                a["kueue.x-k8s.io/podset-required-topology"] = json!(u);
            }
            json!({"headGroupSpec": {"template": {"metadata": {"annotations": a.clone()}}},
                "workerGroupSpecs": [{"groupName": "g", "template": {"metadata": {"annotations": a}}}]})
        };
        assert_eq!(
            change_fingerprint(&annotated("rayservice-llm-1", None)),
            change_fingerprint(&annotated("rayservice-llm-2", None))
        );
        assert_ne!(
            change_fingerprint(&annotated("rayservice-llm-1", Some("rack"))),
            change_fingerprint(&annotated("rayservice-llm-1", Some("zone")))
        );
        // Only the top-level field: a nested `suspend` (a worker group's) counts.
        let nested = json!({"workerGroupSpecs": [{"groupName": "g", "suspend": true}]});
        let unset = json!({"workerGroupSpecs": [{"groupName": "g"}]});
        assert_ne!(change_fingerprint(&nested), change_fingerprint(&unset));
        assert_eq!(
            change_fingerprint(&json!({"suspend": true, "a": 1})),
            fingerprint(&json!({"a": 1}))
        );
    }

    #[test]
    fn kueues_admission_writes_name_no_change_but_still_count_for_kuberay() {
        // Measured with Kueue v0.19.0: its stop/restart of an elastic
        // RayService (raygate's refresh of the Workload, path B) rewrote the
        // templates' `kueue.x-k8s.io/workload` and `…/workload-slice-name`
        // and `suspend`; raygate read "another change" during the transition.
        let kueue_writes = |wl: &'static str, queue_labels: bool, gate: bool| {
            move |v: &mut Value| {
                for ptr in [
                    "/spec/rayClusterConfig/headGroupSpec/template",
                    "/spec/rayClusterConfig/workerGroupSpecs/0/template",
                ] {
                    let t = v.pointer_mut(ptr).unwrap();
                    t["metadata"]["annotations"]["kueue.x-k8s.io/workload"] = json!(wl);
                    t["metadata"]["annotations"]["kueue.x-k8s.io/workload-slice-name"] = json!(wl);
                    if queue_labels {
                        t["metadata"]["labels"]["kueue.x-k8s.io/podset"] = json!("head");
                        t["metadata"]["labels"]["kueue.x-k8s.io/local-queue-name"] = json!("team");
                        t["metadata"]["labels"]["kueue.x-k8s.io/cluster-queue-name"] =
                            json!("team");
                    }
                    if gate {
                        t["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/topology"}]);
                    }
                }
            }
        };
        let bumped = edit(&svc(), bump_image);
        let base = run(&svc(), &bumped, "1.6.2");
        for v in KubeRayVersion::supported() {
            let base = classify(&OldSide::RayService(&svc()), &bumped, *v).unwrap();
            let a = edit(&bumped, kueue_writes("rayservice-llm-old", true, false));
            let b = edit(&bumped, kueue_writes("rayservice-llm-new", true, true));
            let b = edit(&b, |x| cfg(x)["suspend"] = json!(true));
            for new in [&a, &b] {
                let c = classify(&OldSide::RayService(&svc()), new, *v).unwrap();
                assert_eq!(c.fingerprint, base.fingerprint, "@ {v}");
            }
            // Against a cluster built before Kueue's rewrite: KubeRay hashes
            // the annotations (a new cluster), but nothing names a change.
            let c = classify(&OldSide::RayService(&a), &b, *v).unwrap();
            assert_eq!(c.fingerprint, base.fingerprint, "@ {v}");
            assert!(
                c.triggering_paths
                    .iter()
                    .chain(&c.exempt_paths)
                    .all(|p| p == "suspend"),
                "@ {v}: {c:?}"
            );
            let only = edit(&a, kueue_writes("rayservice-llm-new", false, false));
            let c = classify(&OldSide::RayService(&a), &only, *v).unwrap();
            assert_eq!(c.verdict, Verdict::NewCluster, "@ {v}: KubeRay hashes them");
            assert!(c.triggering_paths.is_empty(), "@ {v}: {c:?}");
        }
        // The flavor's nodeSelector and tolerations still name a change.
        let placed = edit(&bumped, |x| {
            worker(x)["template"]["spec"]["nodeSelector"]["pool"] = json!("a100")
        });
        let c = run(&bumped, &placed, "1.6.2");
        assert_ne!(c.fingerprint, base.fingerprint);
        assert_eq!(
            c.triggering_paths,
            vec!["workerGroupSpecs[gpu-workers].template.spec.nodeSelector[pool]".to_string()]
        );
        // A user's own annotation in the same template still counts.
        let own = edit(&bumped, |x| {
            worker(x)["template"]["metadata"]["annotations"]["team.example/owner"] = json!("ml")
        });
        assert_ne!(run(&svc(), &own, "1.6.2").fingerprint, base.fingerprint);
    }

    #[test]
    fn suspend_with_another_change_is_predicted_as_an_outage_with_its_paths() {
        // Case (b) of issue 38: Kueue sets suspend while the image changed.
        let both = edit(&svc(), |v| {
            cfg(v)["suspend"] = json!(true);
            bump_image(v);
        });
        let c = run(&svc(), &both, "1.6.2");
        assert_eq!(c.verdict, Verdict::InPlaceClusterUpdate);
        let outage = c.outage.as_deref().unwrap();
        assert!(
            outage.starts_with(
                "applied in place to the serving cluster: its pods are deleted (outage)"
            ) && outage.contains("spec.rayClusterConfig.suspend is set to true together with")
                && outage.contains(IMAGE),
            "{outage}"
        );
        assert!(
            c.triggering_paths.contains(&IMAGE.to_string()),
            "{:?}",
            c.triggering_paths
        );
        let json = serde_json::to_value(&c).unwrap();
        assert!(json["outage"].is_string());

        // Alone, it is an outage too; clearing it resumes; v1.7.0 mutes it.
        let alone = edit(&svc(), |v| cfg(v)["suspend"] = json!(true));
        let c = run(&svc(), &alone, "1.6.2");
        assert!(
            c.outage
                .as_deref()
                .unwrap()
                .contains("set to true, and KubeRay v1.6.2")
        );
        let c = run(&alone, &svc(), "1.6.2");
        assert_eq!(
            (c.verdict, c.outage.is_none()),
            (Verdict::InPlaceClusterUpdate, true)
        );
        let c = run(&svc(), &both, "1.7.0");
        assert_eq!((c.verdict, c.outage), (Verdict::NewCluster, None));
        let json = serde_json::to_value(run(&svc(), &svc(), "1.6.2")).unwrap();
        assert!(json.get("outage").is_none(), "absent when none");
    }
}
