//! `raygate fit`: whether a RayService's new cluster fits next to the running one, as
//! JSON or text.

use std::path::Path;

use serde::Serialize;

use super::input::{in_file, kind_of, parse_as, read_one, read_service, read_state};
use super::{FitArgs, field, kuberay_version, plan_groups};
use crate::admission::Hold;
use crate::capacity::{self, ClusterState, FitReport, FitRequest, PodRecord, ResourceList};
use crate::kuberay::{self, Classification, KubeRayVersion, OldSide, RayService, Verdict};
use crate::quantity::{Quantity, readable};
use crate::{Error, Result};

/// `fit -o json`: the fit report, or why there is nothing to fit.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FitJson<'a> {
    /// False when KubeRay builds no new cluster for the change (`verdict`
    /// says what it does instead); `fits` is then true.
    new_cluster_needed: bool,
    /// The verdict, when the old side was known (`--old`, or the live cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    verdict: Option<Verdict>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(flatten)]
    report: Option<&'a FitReport>,
    /// Free for the new cluster: `free` minus `reserved` and `headroom`, as
    /// `status.capacity.available` of an UpgradePlan and the FREE column.
    #[serde(skip_serializing_if = "Option::is_none")]
    available: Option<ResourceList>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fits: Option<bool>,
    /// Live, with an UpgradePlan for the RayService: every hold the
    /// controller would put on the change whatever the capacity (its policy,
    /// its maintenance windows); empty when none. Absent offline or without
    /// a plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    holds: Option<&'a [Hold]>,
    /// Live, with an UpgradePlan: what the controller's own decision says
    /// of the change now (other plans' reservations and queue left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    decision: Option<&'a DecisionSummary>,
    /// What in the manifest defeats raygate, as `explain` reports it: a file
    /// that sets `spec.upgradeStrategy` would override the gate.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    errors: &'a [super::explain::ManifestError],
    /// Offline, for a Kueue-managed RayService: its ClusterQueue's quota,
    /// decided from the state's Kueue objects as the controller with
    /// `--kueue` decides it. `fits` is then the nodes' and the quota's.
    #[serde(skip_serializing_if = "Option::is_none")]
    quota: Option<&'a StateQuota>,
    /// With `quota`: whether the new cluster fits the nodes alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    nodes_fit: Option<bool>,
}

/// `fit --state` for a Kueue-managed RayService (label
/// `kueue.x-k8s.io/queue-name`): the quota the controller with `--kueue`
/// checks ([`crate::admission::quota`]), from the ClusterQueues,
/// LocalQueues and raygate reservation Workloads in the state.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StateQuota {
    /// `None`: not checked (the state has no ClusterQueue or LocalQueue).
    pub fits: Option<bool>,
    /// What the plan would wait for in `WaitingForQuota`
    /// (`quota: nvidia.com/gpu 8 > 4 left`, `quota unknown`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    pub message: String,
    /// The hold the controller puts on the change whatever the quota:
    /// `KueueWouldSuspend` for a RayService that is not elastic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<&'static str>,
    /// The numbers, as the plan's `status.quota`.
    #[serde(flatten)]
    pub status: crate::upgradeplan::QuotaStatus,
}

/// [`StateQuota`] of `svc`'s new cluster needing `needed`; `None` when
/// Kueue does not manage the RayService.
pub(crate) fn state_quota(
    objects: &crate::kueue::KueueObjects,
    svc: &RayService,
    needed: &ResourceList,
) -> Option<StateQuota> {
    use crate::admission::quota as aq;
    let managed = crate::kueue::Managed::of(&svc.metadata)?;
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let hold = (!managed.elastic).then_some("KueueWouldSuspend");
    let status = crate::upgradeplan::QuotaStatus {
        local_queue: managed.queue.to_string(),
        ..Default::default()
    };
    if objects.is_empty() {
        return Some(StateQuota {
            fits: None,
            waiting_for: None,
            message: format!(
                "not checked: the state has no ClusterQueue or LocalQueue (add \
                 clusterqueues.v1beta2.kueue.x-k8s.io,localqueues.v1beta2.kueue.x-k8s.io,\
                 workloads.v1beta2.kueue.x-k8s.io to the kubectl get of the state); LocalQueue {}",
                managed.queue
            ),
            hold,
            status,
        });
    }
    let queue = aq::queue_quota(
        ns,
        &managed.queue,
        |ns, q| objects.cluster_queue_of(ns, q),
        objects.cluster_queues.clone(),
        &objects.reservations,
        None,
    );
    Some(match queue {
        Err(e) => StateQuota {
            fits: Some(false),
            waiting_for: Some("quota unknown".into()),
            message: format!(
                "the quota of LocalQueue {} cannot be read: {e}",
                managed.queue
            ),
            hold,
            status,
        },
        Ok(q) => {
            let r = crate::kueue::quota::fit(&q.cluster_queue, &q.all, &q.uncounted, needed);
            let text = aq::quota_text(&r, &managed.queue);
            StateQuota {
                fits: Some(r.fits),
                waiting_for: (!r.fits).then(|| aq::short_of(&r)),
                message: if r.fits {
                    format!("the new cluster fits the quota of {text}")
                } else {
                    format!("the new cluster does not fit the quota of {text}")
                },
                hold,
                status: aq::status_of(&managed.queue, &r, None),
            }
        }
    })
}

/// The controller's decision on the change, as `kubectl raygate fit` ran it
/// (`admission::decide` on the live objects, with the file's spec).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionSummary {
    pub phase: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The gate the controller would write (`None`, `NewCluster`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
    /// The batch the change would ride, as `status.batch` would say it
    /// (`spec.batching`, or a change made during a transition): the
    /// changes gathered, their paths and the release time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<crate::upgradeplan::BatchStatus>,
}

impl DecisionSummary {
    /// The `Decision:` line: what raygate *would* do with the file applied now
    /// (`fit -f` runs before `kubectl apply`), so an admission reads "would be
    /// admitted now", not as if it had happened; a hold reads "would be held".
    pub fn line(&self) -> String {
        let would = match self.phase.as_str() {
            "Admitted" => {
                return "would be admitted now: raygate would open the gate and KubeRay would \
                        build the new cluster"
                    .to_string();
            }
            "WaitingForCapacity" | "WaitingForQuota" | "WaitingForApproval" | "Batching"
            | "Paused" | "Pending" | "Error" => "would be held: ",
            _ => "",
        };
        let mut s = format!("{would}{}", self.phase);
        if let Some(w) = self.waiting_for.as_deref().filter(|w| !w.is_empty()) {
            s.push_str(&format!(" (waiting for {w})"));
        }
        if let Some(m) = self.message.as_deref().filter(|m| !m.is_empty()) {
            s.push_str(&format!(": {m}"));
        }
        s
    }
}

/// The batch a change rides, as `fit` prints it (the status's own words:
/// `kubectl raygate queue` shows its count and release time): a `Batch:`
/// line, then one `Batched:` line per change listed, oldest first, with
/// when it was seen and the field paths it touched.
pub(crate) fn batch_notes(b: &crate::upgradeplan::BatchStatus) -> Vec<(&'static str, String)> {
    let n = b.change_count;
    let changes = format!("{n} cluster change{}", if n == 1 { "" } else { "s" });
    let when = match (&b.after_transition_to, b.release_time, &b.released) {
        (Some(to), ..) => format!(
            "waits for the transition to {to} to end (the next batch, never a third cluster)"
        ),
        (None, Some(t), Some(why)) => format!("released at {t} ({why})"),
        (None, Some(t), None) => format!("held until {t} (spec.batching)"),
        (None, None, _) => "not released yet".to_string(),
    };
    let mut out = vec![(
        "Batch:",
        format!(
            "{changes} into one new cluster, fingerprint {}; {when}",
            b.fingerprint
        ),
    )];
    let unlisted = (n as usize).saturating_sub(b.changes.len());
    if unlisted > 0 {
        out.push((
            "Batched:",
            format!("{unlisted} earlier change(s) not listed (the status keeps the last 20)"),
        ));
    }
    for c in &b.changes {
        let paths = if c.paths.is_empty() {
            "(paths not recorded)".to_string()
        } else {
            c.paths.join(", ")
        };
        out.push((
            "Batched:",
            format!("{} seen {}: {paths}", c.fingerprint, c.seen_time),
        ));
    }
    out
}

/// Offline, with `--old`: the change's fingerprint and the field paths that
/// make KubeRay build a new cluster (what it would bring to a batch).
pub(crate) fn change_note(c: &Classification) -> (&'static str, String) {
    change_line(&c.fingerprint, &c.triggering_paths)
}

fn change_line(fingerprint: &str, triggering: &[String]) -> (&'static str, String) {
    let paths = if triggering.is_empty() {
        "no field path recorded".to_string()
    } else {
        triggering.join(", ")
    };
    // Relative to `rayClusterConfig`, as `status.batch.changes[].paths`.
    (
        "Change:",
        format!("{fingerprint} (under rayClusterConfig): {paths}"),
    )
}

/// What comes with the answer: lines printed before it and, live, the
/// holds of the RayService's UpgradePlan.
pub(crate) struct Context<'a> {
    pub notes: &'a [(&'a str, String)],
    /// Lines printed after the answer (`Fits:`, `Why:`): the change fitted.
    pub after: &'a [(&'a str, String)],
    /// `None` offline or without a plan.
    pub holds: Option<&'a [Hold]>,
    /// `None` offline or without a plan.
    pub decision: Option<&'a DecisionSummary>,
    /// Offline: check a Kueue-managed RayService's quota against the
    /// state's Kueue objects (live, the decision does).
    pub quota_from_state: bool,
}

/// Does KubeRay build a second cluster for this change? `Held` counts: the
/// question is whether the one it would build fits.
pub(crate) fn needs_new_cluster(c: &Classification) -> bool {
    matches!(c.verdict, Verdict::NewCluster | Verdict::Held)
}

/// The answer when KubeRay builds no new cluster: it fits, there is nothing
/// to place (an in-place update's appended groups are not fitted here).
pub(crate) fn no_new_cluster(
    args: &FitArgs,
    c: &Classification,
    notes: &[(&str, String)],
) -> Result<FitOutcome> {
    let why = format!("verdict {:?}: {}", c.verdict, c.reason);
    let out = FitJson {
        new_cluster_needed: false,
        verdict: Some(c.verdict),
        reason: Some(&c.reason),
        report: None,
        available: None,
        fits: Some(true),
        holds: None,
        decision: None,
        errors: &[],
        quota: None,
        nodes_fit: None,
    };
    let text = match args.output.structured(&out)? {
        Some(s) => s,
        None => {
            let mut s = String::new();
            for (label, value) in notes {
                field(&mut s, label, value);
            }
            field(&mut s, "Fits:", "yes: no new cluster is needed");
            field(&mut s, "Why:", &why);
            if c.verdict == Verdict::InPlaceClusterUpdate {
                field(
                    &mut s,
                    "Note:",
                    "KubeRay adds the new worker groups to the running cluster; their pods are \
                     scheduled like any other pods and not fitted here",
                );
            }
            s
        }
    };
    Ok(FitOutcome {
        text,
        fits: true,
        held: false,
        warnings: vec![],
    })
}

/// Pods in the state that belong to the service's current cluster: the one
/// its status names, or (for a manifest without status) KubeRay's naming
/// pattern `<service>-<5 characters>`.
fn old_cluster_pods<'a>(state: &'a ClusterState, svc: &RayService) -> Vec<&'a PodRecord> {
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
        .collect()
}

/// What `fit` found: the output, the answer, and what was skipped in the input.
#[derive(Debug)]
pub struct FitOutcome {
    pub text: String,
    pub fits: bool,
    /// The RayService's UpgradePlan holds the change whatever the capacity
    /// (live only): the upgrade would not proceed now.
    pub held: bool,
    /// Objects of the state that were ignored (for stderr).
    pub warnings: Vec<String>,
}

pub fn fit(args: &FitArgs) -> Result<FitOutcome> {
    let version = kuberay_version(args.kuberay_version.as_deref())?;
    let Some(state_path) = &args.state else {
        return Err(Error::invalid(
            "--state",
            "missing (or read the live cluster: `kubectl raygate fit -f FILE`)",
        ));
    };
    let svc = read_service(&args.new, version)?;
    let mut notes = vec![];
    let mut after = vec![];
    match &args.old {
        Some(old_path) => {
            let old = read_one(old_path, &["RayService", "RayCluster"])?;
            let c = if kind_of(&old) == "RayCluster" {
                let old: kuberay::RayCluster = parse_as(old_path, old)?;
                in_file(
                    old_path,
                    kuberay::classify(&OldSide::RayCluster(&old), &svc, version),
                )?
            } else {
                let old: RayService = parse_as(old_path, old)?;
                in_file(
                    old_path,
                    kuberay::classify(&OldSide::RayService(&old), &svc, version),
                )?
            };
            if !needs_new_cluster(&c) {
                return no_new_cluster(args, &c, &notes);
            }
            after.push(change_note(&c));
        }
        None => notes.push((
            "Compared to:",
            "nothing (no --old): the whole new cluster is fitted, as if KubeRay built one; \
             give --old to fit only a change that needs a new cluster"
                .to_string(),
        )),
    }
    let mut state = read_state(state_path)?;
    state
        .dra
        .plain_count
        .extend(args.dra_plain_count_class.iter().cloned());
    let headroom: ResourceList = args.headroom.iter().cloned().collect();
    let context = Context {
        notes: &notes,
        after: &after,
        holds: None,
        decision: None,
        quota_from_state: true,
    };
    fit_in(args, version, state, state_path, &svc, headroom, &context)
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
    context: &Context<'_>,
) -> Result<FitOutcome> {
    let pods = in_file(&args.new, plan_groups(svc, version))?;
    let old_pods = old_cluster_pods(&state, svc);
    let old_requests = in_file(
        state_source,
        crate::admission::observed::total_requests(old_pods.iter().copied(), &state.limit_ranges),
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
    let available = available(&report);
    let errors = super::manifest_errors(svc);
    let quota = context
        .quota_from_state
        .then(|| state_quota(&state.kueue, svc, &report.new_requests))
        .flatten();
    let nodes_fit = report.fits;
    let quota_fits = quota.as_ref().and_then(|q| q.fits).unwrap_or(true);
    let quota_held = quota.as_ref().is_some_and(|q| q.hold.is_some());
    // `fits` in the JSON is the answer: the nodes' and the quota's.
    let mut shown = report.clone();
    shown.fits = nodes_fit && quota_fits;
    let out = FitJson {
        new_cluster_needed: true,
        verdict: None,
        reason: None,
        report: Some(&shown),
        available: Some(available),
        fits: None,
        holds: context.holds,
        decision: context.decision,
        errors: &errors,
        quota: quota.as_ref(),
        nodes_fit: quota.as_ref().map(|_| nodes_fit),
    };
    let text = match args.output.structured(&out)? {
        Some(s) => s,
        None => {
            let mut s = String::new();
            for e in &errors {
                field(&mut s, "ERROR:", &format!("{}: {}", e.path, e.message));
            }
            for (label, value) in context.notes {
                field(&mut s, label, value);
            }
            if let Some(q) = &quota {
                quota_lines(&mut s, q, nodes_fit);
            }
            s + &fit_text(&report, shown.fits, context.after)
        }
    };
    Ok(FitOutcome {
        text,
        fits: nodes_fit && quota_fits,
        held: context.holds.is_some_and(|h| !h.is_empty()) || quota_held,
        warnings: state.warnings,
    })
}

/// The `Kueue:` and `Quota:` lines of a Kueue-managed RayService.
fn quota_lines(s: &mut String, q: &StateQuota, nodes_fit: bool) {
    if let Some(h) = q.hold {
        field(
            s,
            "Held:",
            &format!(
                "{h}: the RayService is Kueue-managed (LocalQueue {}) without \
                 kueue.x-k8s.io/elastic-job: \"true\"; {}; {}",
                q.status.local_queue,
                crate::kueue::Managed {
                    queue: crate::kueue::LocalQueueName::new(q.status.local_queue.clone()),
                    elastic: false,
                }
                .behaviour(),
                crate::kueue::REMEDY
            ),
        );
    }
    let line = match (q.fits, &q.waiting_for) {
        (None, _) => q.message.clone(),
        (Some(true), _) => format!("yes: {}", q.message),
        (Some(false), w) => format!(
            "NO: would wait in WaitingForQuota ({}){}: {}",
            w.as_deref().unwrap_or("quota"),
            if nodes_fit {
                ", though it fits the nodes"
            } else {
                ""
            },
            q.message
        ),
    };
    field(s, "Quota:", &line);
}

/// Free for the new cluster: `free − reserved − headroom`, never below zero
/// (the meaning of FREE in `kubectl get upgradeplans` and here).
fn available(r: &FitReport) -> ResourceList {
    capacity::sub_floor0(&r.free, &capacity::sum(&r.reserved, &r.headroom))
}

fn list_text(m: &ResourceList) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", readable(k, &[v]).concat()))
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
        // A resource no node offers is no shortfall that waiting closes
        // (a typo such as `gpu` for `nvidia.com/gpu`): say so.
        let missing = crate::admission::texts::not_offered(r);
        if !missing.is_empty() {
            why.push(format!(
                "no node offers {}",
                missing
                    .iter()
                    .map(|m| format!("`{m}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let short: ResourceList = r
            .shortfall
            .iter()
            .filter(|(k, _)| !missing.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let what = if r.headroom.is_empty() {
            "short of"
        } else {
            "with the headroom, short of"
        };
        if !short.is_empty() {
            why.push(format!("{what} {}", list_text(&short)));
        }
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

/// `fits`: the answer (the nodes' and, offline, the quota's, whose `Quota:`
/// line comes before); the rest is the nodes'. `after`: lines under `Why:`
/// (offline with `--old`, the change's paths).
fn fit_text(r: &FitReport, fits: bool, after: &[(&str, String)]) -> String {
    let mut s = String::new();
    field(&mut s, "Fits:", if fits { "yes" } else { "NO" });
    let why = fit_why(r);
    if r.fits && !fits {
        field(
            &mut s,
            "Why:",
            &format!("the quota (see Quota:); the nodes: {why}"),
        );
    } else {
        field(&mut s, "Why:", &why);
    }
    for (label, value) in after {
        field(&mut s, label, value);
    }
    if !r.headroom.is_empty() {
        field(&mut s, "Headroom:", &list_text(&r.headroom));
    }
    let minus = if r.headroom.is_empty() {
        "allocatable minus the pods running now"
    } else {
        "allocatable minus the pods running now and the headroom"
    };
    field(
        &mut s,
        "FREE:",
        &format!(
            "{minus}: what the new cluster may use, as GPUS FREE in `kubectl get upgradeplans` \
             (which also subtracts reservations)"
        ),
    );
    s.push('\n');
    let free = available(r);
    let mut columns: Vec<(&str, &ResourceList)> = vec![
        ("NEW", &r.new_requests),
        ("OLD+NEW", &r.required),
        ("ALLOCATABLE", &r.allocatable),
    ];
    if !r.headroom.is_empty() {
        columns.push(("HEADROOM", &r.headroom));
    }
    columns.push(("FREE", &free));
    columns.push(("SHORTFALL", &r.shortfall));
    let mut head = vec!["RESOURCE".to_string()];
    head.extend(columns.iter().map(|(h, _)| h.to_string()));
    let mut rows = vec![head];
    let names: std::collections::BTreeSet<&String> =
        r.new_requests.keys().chain(r.shortfall.keys()).collect();
    for k in names {
        // One readable unit per row, as kubectl prints allocatable: `64.5 129`,
        // not `64500m 129` nor `195692000Ki`; `-o json` keeps the exact values.
        let present: Vec<&Quantity> = columns.iter().filter_map(|(_, m)| m.get(k)).collect();
        let mut printed = readable(k, &present).into_iter();
        let mut row = vec![k.clone()];
        for (_, m) in &columns {
            row.push(match m.get(k) {
                Some(_) => printed.next().unwrap_or_default(),
                None => "-".into(),
            });
        }
        rows.push(row);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_is_one_line_with_what_it_waits_for() {
        let d = DecisionSummary {
            phase: "WaitingForCapacity".into(),
            waiting_for: Some("capacity: nvidia.com/gpu 8".into()),
            message: Some("short by nvidia.com/gpu 8".into()),
            gate: Some("None".into()),
            batch: None,
        };
        assert_eq!(
            d.line(),
            "would be held: WaitingForCapacity (waiting for capacity: nvidia.com/gpu 8): short by nvidia.com/gpu 8"
        );
        let admitted = DecisionSummary {
            phase: "Admitted".into(),
            waiting_for: Some(String::new()),
            message: None,
            gate: Some("NewCluster".into()),
            batch: None,
        };
        // Issue 32: `fit -f` before the apply; not "admitted; waiting for KubeRay".
        assert_eq!(
            admitted.line(),
            "would be admitted now: raygate would open the gate and KubeRay would build the new cluster"
        );
        let upgrading = DecisionSummary {
            phase: "Upgrading".into(),
            ..admitted.clone()
        };
        assert_eq!(upgrading.line(), "Upgrading");
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            serde_json::json!({"phase": "WaitingForCapacity",
                "waitingFor": "capacity: nvidia.com/gpu 8",
                "message": "short by nvidia.com/gpu 8", "gate": "None"})
        );
    }
    use crate::capacity::Unplaced;
    use crate::capacity::tests::rl;

    fn report(fits: bool, unplaced: usize, shortfall: &[(&str, &str)]) -> FitReport {
        FitReport {
            fits,
            required: ResourceList::new(),
            new_requests: rl(&[("pods", "3")]),
            old_requests: ResourceList::new(),
            reserved: ResourceList::new(),
            headroom: ResourceList::new(),
            allocatable: rl(&[("nvidia.com/gpu", "16"), ("pods", "220")]),
            free: ResourceList::new(),
            shortfall: rl(shortfall),
            unplaced: (0..unplaced)
                .map(|i| Unplaced {
                    pod: format!("ml/p-{i}"),
                    reason: "no node".into(),
                    reserved: false,
                })
                .collect(),
            placements: Default::default(),
            skipped_nodes: vec![],
            dra_pools_updating: vec![],
        }
    }

    #[test]
    fn why_names_the_cause() {
        assert_eq!(
            fit_why(&report(true, 0, &[])),
            "every new pod (3) has a node, next to the running cluster"
        );
        assert_eq!(
            fit_why(&report(false, 1, &[("nvidia.com/gpu", "2")])),
            "1 of 3 new pods has no node; short of nvidia.com/gpu=2"
        );
        assert!(fit_why(&report(false, 2, &[])).contains("(fragmentation)"));
        let mut kept = report(false, 0, &[]);
        kept.headroom = rl(&[("cpu", "1")]);
        assert_eq!(fit_why(&kept), "the headroom is not kept");
        // Issue 32, item 4: `gpu` (for `nvidia.com/gpu`) is offered by no node:
        // said so, not counted as a shortfall that waiting would close.
        let mut typo = report(false, 0, &[("gpu", "2")]);
        typo.headroom = rl(&[("gpu", "2")]);
        assert_eq!(fit_why(&typo), "no node offers `gpu`");
        let both = report(false, 1, &[("gpu", "2"), ("nvidia.com/gpu", "8")]);
        assert_eq!(
            fit_why(&both),
            "1 of 3 new pods has no node; no node offers `gpu`; short of nvidia.com/gpu=8"
        );
    }

    /// Live, the holds of the RayService's UpgradePlan come with the fit: the
    /// lines before it, `holds` in JSON, and `held` for the exit code.
    #[test]
    fn the_holds_of_a_plan_come_with_the_fit() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cmd {
            #[command(flatten)]
            args: FitArgs,
        }
        let fx = |f: &str| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/cli")
                .join(f)
        };
        let state = fx("state-fits.yaml");
        let new = fx("rayservice-llm-image-bump.yaml");
        let run = |output: &str, holds: Option<&[Hold]>, notes: &[(&str, String)]| {
            let new = new.display().to_string();
            let args = Cmd::try_parse_from(["fit", "--new", &new, "-o", output])
                .unwrap()
                .args;
            let version = kuberay_version(None).unwrap();
            let svc = read_service(&args.new, version).unwrap();
            let context = Context {
                notes,
                after: &[],
                holds,
                decision: None,
                quota_from_state: false,
            };
            fit_in(
                &args,
                version,
                read_state(&state).unwrap(),
                &state,
                &svc,
                ResourceList::new(),
                &context,
            )
            .unwrap()
        };
        let held = [Hold::Paused];
        let note = [("Held:", Hold::Paused.message())];
        let o = run("json", Some(&held), &note);
        assert!(o.fits && o.held, "{}", o.text);
        let v: serde_json::Value = serde_json::from_str(&o.text).unwrap();
        assert_eq!(v["holds"][0]["hold"], "Paused", "{v}");
        assert_eq!(v["holds"][0]["phase"], "Paused", "{v}");
        let o = run("text", Some(&held), &note);
        assert!(
            o.text
                .starts_with("Held:         the plan's policy is Paused"),
            "{}",
            o.text
        );
        assert!(o.text.contains("\nFits:         yes\n"), "{}", o.text);
        // A plan that holds nothing: `holds: []`; offline, no `holds` at all.
        let o = run("json", Some(&[]), &[]);
        let v: serde_json::Value = serde_json::from_str(&o.text).unwrap();
        assert!(!o.held);
        assert_eq!(v["holds"], serde_json::json!([]), "{v}");
        let o = run("json", None, &[]);
        let v: serde_json::Value = serde_json::from_str(&o.text).unwrap();
        assert_eq!(v.get("holds"), None, "{v}");
    }

    fn fixture(f: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cli")
            .join(f)
    }

    /// The image bump of `llm-chat`, labelled for Kueue (elastic or not).
    fn kueue_service(dir: &Path, elastic: bool) -> std::path::PathBuf {
        let text = std::fs::read_to_string(fixture("rayservice-llm-image-bump.yaml")).unwrap();
        let mut v: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        v["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team-inference".into();
        if elastic {
            v["metadata"]["annotations"] =
                serde_json::json!({"kueue.x-k8s.io/elastic-job": "true"});
        }
        let path = dir.join(format!("svc-{elastic}.json"));
        std::fs::write(&path, v.to_string()).unwrap();
        path
    }

    /// state-fits.yaml followed by `kueue` (a second YAML document).
    fn state_with(dir: &Path, kueue: &str) -> std::path::PathBuf {
        let nodes = std::fs::read_to_string(fixture("state-fits.yaml")).unwrap();
        let path = dir.join("state.yaml");
        std::fs::write(&path, format!("{nodes}\n---\n{kueue}")).unwrap();
        path
    }

    fn run_fit(state: &Path, new: &Path, output: &str) -> FitOutcome {
        use clap::Parser;
        #[derive(Parser)]
        struct Cmd {
            #[command(flatten)]
            args: FitArgs,
        }
        let (state, new) = (state.display().to_string(), new.display().to_string());
        let args = Cmd::try_parse_from(["fit", "--state", &state, "-f", &new, "-o", output])
            .unwrap()
            .args;
        fit(&args).unwrap()
    }

    /// Issue 38: `fit --state` with Kueue's objects decides the quota of a
    /// Kueue-managed RayService as the controller with `--kueue` does: the
    /// cohort's lendable quota, other plans' reservations Kueue has not
    /// admitted, `WaitingForQuota` with the numbers.
    #[test]
    fn fit_with_kueue_objects_in_the_state_answers_for_the_quota_too() {
        let dir = tempfile::tempdir().unwrap();
        let kueue = std::fs::read_to_string(fixture("state-kueue.yaml")).unwrap();
        let state = state_with(dir.path(), &kueue);
        let elastic = kueue_service(dir.path(), true);

        // 16 nominal − 8 reserved − 4 of another plan's reservation: 4 left
        // for 8 needed (the cohort's pool has no more: training uses its 4
        // lendable GPUs above its guaranteed 4).
        let o = run_fit(&state, &elastic, "json");
        assert!(!o.fits && !o.held, "{}", o.text);
        let v: serde_json::Value = serde_json::from_str(&o.text).unwrap();
        assert_eq!(v["fits"], false, "{v}");
        assert_eq!(v["nodesFit"], true, "{v}");
        let q = &v["quota"];
        assert_eq!(q["fits"], false, "{q}");
        assert_eq!(q["waitingFor"], "quota: nvidia.com/gpu 8 > 4 left", "{q}");
        assert_eq!(
            (&q["localQueue"], &q["clusterQueue"], &q["cohort"]),
            (
                &"team-inference".into(),
                &"inference".into(),
                &"gpus".into()
            )
        );
        assert_eq!(
            (&q["gpusNeeded"], &q["gpusLeft"]),
            (&"8".into(), &"4".into())
        );
        assert!(q.get("hold").is_none(), "elastic: {q}");
        let gpu = q["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "nvidia.com/gpu")
            .unwrap();
        assert_eq!(
            (&gpu["flavor"], &gpu["borrowable"]),
            (&"a100".into(), &"0".into()),
            "its own nominal quota is not used up: nothing borrowed; {gpu}"
        );
        // The controller's own words and numbers (admission::quota).
        assert_eq!(
            q["message"],
            "the new cluster does not fit the quota of ClusterQueue inference in cohort gpus \
             (LocalQueue team-inference): nvidia.com/gpu 8 needed, 4 left in flavor a100 \
             (0 of it borrowable from the cohort)"
        );
        let o = run_fit(&state, &elastic, "text");
        assert!(
            o.text.contains(
                "Quota:        NO: would wait in WaitingForQuota (quota: nvidia.com/gpu 8 > 4 left)"
            ) && o.text.contains(
                "\nFits:         NO\nWhy:          the quota (see Quota:); the nodes: every new pod"
            ),
            "{}",
            o.text
        );

        // Without the other plan's reservation: 8 left, it fits.
        let freed = kueue
            .replace("embed-0a1b2c3d4e5f-quota", "embed-quota")
            .replace(
                "raygate.io/reservation: quota",
                "raygate.io/reservation: none",
            );
        let o = run_fit(&state_with(dir.path(), &freed), &elastic, "json");
        let v: serde_json::Value = serde_json::from_str(&o.text).unwrap();
        assert!(o.fits, "{v}");
        assert_eq!(
            (&v["fits"], &v["quota"]["fits"]),
            (&true.into(), &true.into())
        );
        assert!(v["quota"].get("waitingFor").is_none(), "{v}");

        // Not elastic: held as the controller holds it (KueueWouldSuspend),
        // whatever the quota.
        let o = run_fit(&state, &kueue_service(dir.path(), false), "text");
        assert!(o.held, "{}", o.text);
        assert!(
            o.text.contains("Held:         KueueWouldSuspend:"),
            "{}",
            o.text
        );

        // The LocalQueue missing: quota unknown, as the controller waits.
        let lost = kueue.replace("name: team-inference\n", "name: other\n");
        let o = run_fit(&state_with(dir.path(), &lost), &elastic, "json");
        let v: serde_json::Value = serde_json::from_str(&o.text).unwrap();
        assert!(!o.fits);
        assert_eq!(v["quota"]["waitingFor"], "quota unknown", "{v}");
        assert!(
            v["quota"]["message"]
                .as_str()
                .unwrap()
                .contains("LocalQueue inference/team-inference not found"),
            "{v}"
        );

        // No Kueue objects in the state: not checked, the nodes decide.
        let o = run_fit(&fixture("state-fits.yaml"), &elastic, "json");
        let v: serde_json::Value = serde_json::from_str(&o.text).unwrap();
        assert!(o.fits, "{v}");
        assert_eq!(v["quota"]["fits"], serde_json::Value::Null, "{v}");
        assert!(
            v["quota"]["message"]
                .as_str()
                .unwrap()
                .starts_with("not checked")
        );
        // A RayService Kueue does not manage: no quota at all.
        let o = run_fit(&state, &fixture("rayservice-llm-image-bump.yaml"), "json");
        let v: serde_json::Value = serde_json::from_str(&o.text).unwrap();
        assert!(
            v.get("quota").is_none() && v.get("nodesFit").is_none(),
            "{v}"
        );
    }

    /// `fit` lists a batch as the status holds it: the count, the release
    /// time (or the transition it waits for), and each change's paths.
    #[test]
    fn a_batch_is_listed_with_its_changes_paths_and_release_time() {
        use crate::upgradeplan::{BatchStatus, BatchedChange};
        let at = |s: &str| -> jiff::Timestamp { s.parse().unwrap() };
        let image = "workerGroupSpecs[gpu].template.spec.containers[ray-worker].image";
        let memory =
            "workerGroupSpecs[gpu].template.spec.containers[ray-worker].resources.limits.memory";
        let mut b = BatchStatus {
            fingerprint: "bbbbbbbbbbbb".into(),
            change_count: 2,
            first_change_time: at("2026-12-07T10:00:00Z"),
            last_change_time: at("2026-12-07T10:20:00Z"),
            release_time: Some(at("2026-12-07T10:50:00Z")),
            changes: vec![
                BatchedChange {
                    fingerprint: "aaaaaaaaaaaa".into(),
                    seen_time: at("2026-12-07T10:00:00Z"),
                    paths: vec![image.into()],
                },
                BatchedChange {
                    fingerprint: "bbbbbbbbbbbb".into(),
                    seen_time: at("2026-12-07T10:20:00Z"),
                    paths: vec![memory.into()],
                },
            ],
            ..Default::default()
        };
        let text = |b: &BatchStatus| {
            let mut s = String::new();
            for (label, value) in batch_notes(b) {
                crate::cli::field(&mut s, label, &value);
            }
            s
        };
        let notes = batch_notes(&b);
        assert_eq!(
            notes[0],
            (
                "Batch:",
                "2 cluster changes into one new cluster, fingerprint bbbbbbbbbbbb; held until \
                 2026-12-07T10:50:00Z (spec.batching)"
                    .to_string()
            )
        );
        assert_eq!(
            notes[1..],
            [
                (
                    "Batched:",
                    format!("aaaaaaaaaaaa seen 2026-12-07T10:00:00Z: {image}")
                ),
                (
                    "Batched:",
                    format!("bbbbbbbbbbbb seen 2026-12-07T10:20:00Z: {memory}")
                ),
            ]
        );
        // Printed as the other fields, one line each (long paths wrap under the column).
        let t = text(&b);
        assert_eq!(t.matches("Batched:").count(), 2, "{t}");
        assert!(t.starts_with("Batch:        2 cluster changes"), "{t}");
        b.released = Some("QuietPeriod".into());
        assert!(
            batch_notes(&b)[0]
                .1
                .ends_with("released at 2026-12-07T10:50:00Z (QuietPeriod)")
        );
        b.after_transition_to = Some("chat-x7k2p".into());
        b.change_count = 23;
        let notes = batch_notes(&b);
        assert!(
            notes[0].1.ends_with("waits for the transition to chat-x7k2p to end (the next batch, never a third cluster)"),
            "{notes:?}"
        );
        assert_eq!(
            notes[1].1,
            "21 earlier change(s) not listed (the status keeps the last 20)"
        );
        // In -o json, under `decision.batch`, as the status spells it.
        let d = DecisionSummary {
            phase: "Upgrading".into(),
            waiting_for: None,
            message: None,
            gate: Some("None".into()),
            batch: Some(b),
        };
        let j = serde_json::to_value(&d).unwrap();
        assert_eq!(j["batch"]["changes"][1]["paths"][0], memory);
        assert_eq!(j["batch"]["afterTransitionTo"], "chat-x7k2p");
    }

    #[test]
    fn offline_with_old_the_change_lists_its_paths() {
        let (label, value) = change_line(
            "0123456789ab",
            &["headGroupSpec.template.spec.containers[ray-head].image".into()],
        );
        assert_eq!(label, "Change:");
        assert_eq!(
            value,
            "0123456789ab (under rayClusterConfig): headGroupSpec.template.spec.containers[ray-head].image"
        );
    }

    #[test]
    fn table_columns_are_padded_to_the_widest_cell() {
        let mut s = String::new();
        let rows = [["A", "BB"], ["ccc", "1"]].map(|r| r.map(str::to_string).to_vec());
        table(&mut s, &rows);
        assert_eq!(s, "A    BB\nccc   1\n");
    }
}
