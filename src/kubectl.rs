//! `kubectl raygate`: the commands a platform engineer runs against a live
//! cluster. The same commands are `raygate approve|pause|resume|queue|...`.
//!
//! Nothing here decides anything: approval is the merge patch of
//! `spec.approve` that docs/upgradeplan.md describes, the queue order is
//! [`crate::admission::ledger::order`] (the controller's), and `explain` /
//! `fit` are the offline commands of [`crate::cli`] fed with live objects.
//!
//! Exit codes: 0 done; 1 invalid input, or the object does not allow it
//! (not found, nothing to approve, another fingerprint pending); 2 usage;
//! 3 no fit with `--fail-if-no-fit`; 4 the cluster could not be reached or
//! refused the request (including a concurrent change of the plan).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{LimitRange, Node};
use kube::api::{Api, ListParams, ObjectList, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};
use serde_with::skip_serializing_none;

use crate::admission::ledger::{self, Candidate};
use crate::capacity::record::Strings;
use crate::capacity::slim;
use crate::capacity::{ACCELERATORS, ClusterState, PartialPod, PodRecord, ResourceList};
use crate::cli::{self, ExplainArgs, FitArgs, Old};
use crate::kuberay::{self, RayCluster, RayService, UpgradeType};
use crate::quantity::Quantity;
use crate::upgradeplan::{Policy, UpgradePlan, UpgradePlanStatus};
use crate::{Error, Result};

/// The field manager of this command's writes, so `managedFields` shows who approved.
pub const FIELD_MANAGER: &str = "kubectl-raygate";
/// Where `pause` keeps the policy that `resume` restores.
pub const PAUSED_POLICY_ANNOTATION: &str = "raygate.io/paused-policy";

/// Exit code when the cluster could not be reached or refused the request.
const EXIT_API: u8 = 4;
/// Exit code of `fit --fail-if-no-fit` when the new cluster does not fit.
const EXIT_NO_FIT: u8 = 3;
/// Page size when listing pods: a large cluster's pods are never all in memory
/// as received, only as records for the fit.
const PAGE: u32 = 500;

/// kubectl's connection flags.
#[derive(Args, Debug, Clone, Default)]
pub struct KubeArgs {
    /// Kubeconfig file (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace (default: the context's namespace).
    #[arg(short = 'n', long, value_name = "NS")]
    pub namespace: Option<String>,
}

/// `-o` of the cluster commands, as kubectl spells it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[default]
    Text,
    /// More columns (CPU and memory).
    Wide,
    Json,
    Yaml,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Say what KubeRay will do with a RayService change. With --old, offline;
    /// without it, against the live RayService and its RayCluster.
    Explain {
        #[command(flatten)]
        args: ExplainArgs,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Check whether a RayService's new cluster fits. With --state, offline;
    /// without it, against the live nodes and pods. Exit 0 whether or not it
    /// fits, unless --fail-if-no-fit.
    Fit {
        #[command(flatten)]
        args: FitArgs,
        /// Exit 3 when the new cluster does not fit (for CI gates).
        #[arg(long)]
        fail_if_no_fit: bool,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Approve an UpgradePlan's pending change (policy Manual): sets
    /// spec.approve to its fingerprint and prints what it approves.
    Approve {
        /// The UpgradePlan.
        plan: String,
        /// Approve only if this is the pending fingerprint (the one you reviewed).
        #[arg(long, value_name = "FP")]
        fingerprint: Option<String>,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Pause an UpgradePlan: admit nothing until resumed (a running
    /// transition is still tracked to its end).
    Pause {
        plan: String,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Resume a paused UpgradePlan with the policy it had before `pause`.
    Resume {
        plan: String,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// The upgrades raygate is running and those waiting, in the order it
    /// will consider them: priority, then waiting time.
    Queue {
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
        output: Format,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Print a shell completion script.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Runs a command; `cli` is the binary's whole command line definition (for
/// completion) and `bin` its name.
pub async fn run(command: Command, cli: clap::Command, bin: &str) -> ExitCode {
    let kube_args = match &command {
        Command::Explain { kube, .. }
        | Command::Fit { kube, .. }
        | Command::Approve { kube, .. }
        | Command::Pause { kube, .. }
        | Command::Resume { kube, .. }
        | Command::Queue { kube, .. } => Some(kube.clone()),
        Command::Completion { .. } => None,
    };
    let result = match command {
        Command::Explain { args, kube } => explain(&args, &kube).await.map(|t| (t, 0)),
        Command::Fit {
            args,
            fail_if_no_fit,
            kube,
        } => fit(&args, &kube).await.map(|o| {
            let code = if fail_if_no_fit && !o.fits {
                EXIT_NO_FIT
            } else {
                0
            };
            for w in &o.warnings {
                say(&format!("{bin}: warning: {w}"));
            }
            (o.text, code)
        }),
        Command::Approve {
            plan,
            fingerprint,
            kube,
        } => approve(&kube, &plan, fingerprint.as_deref())
            .await
            .map(|t| (t, 0)),
        Command::Pause { plan, kube } => pause(&kube, &plan).await.map(|t| (t, 0)),
        Command::Resume { plan, kube } => resume(&kube, &plan).await.map(|t| (t, 0)),
        Command::Queue {
            all_namespaces,
            output,
            kube,
        } => queue(&kube, all_namespaces, output).await.map(|t| (t, 0)),
        Command::Completion { shell } => {
            let mut cli = cli;
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut cli, bin, &mut buf);
            Ok((String::from_utf8_lossy(&buf).into_owned(), 0))
        }
    };
    match result {
        Ok((text, code)) => emit(&text, ExitCode::from(code)),
        Err(e) => {
            let msg = match (&e, &kube_args) {
                (Error::Kube(k), Some(args)) if !matches!(k, kube::Error::Api(_)) => {
                    let server = kube_config(args.kubeconfig.as_deref(), args.context.as_deref())
                        .await
                        .map(|c| c.cluster_url.to_string())
                        .ok();
                    unreachable(k, server.as_deref())
                }
                _ => e.to_string(),
            };
            say(&format!("{bin}: {msg}"));
            ExitCode::from(exit_code(&e))
        }
    }
}

/// A cluster that could not be reached, named by its server URL (from the
/// kubeconfig in use), with the whole cause: `client error (Connect)` alone
/// does not say which cluster or why.
pub fn unreachable(e: &kube::Error, server: Option<&str>) -> String {
    let mut cause = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !cause.contains(&text) {
            cause.push_str(": ");
            cause.push_str(&text);
        }
        source = s.source();
    }
    format!(
        "cannot reach the Kubernetes API server at {}: {cause}",
        server.unwrap_or("(server unknown)")
    )
}

/// 1 for what the user can fix in the input, 4 for the cluster's answers.
pub fn exit_code(e: &Error) -> u8 {
    match e {
        Error::Kube(kube::Error::Api(s)) if s.is_not_found() => 1,
        Error::Kube(_) => EXIT_API,
        _ => 1,
    }
}

/// Writes the output; a closed stdout (`... | head`) is not a crash, unlike
/// `print!`, which panics on it.
pub fn emit(text: &str, code: ExitCode) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => code,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => code,
        Err(e) => {
            say(&format!("raygate: writing output: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// A line on stderr, ignoring a closed stderr (`eprintln!` would panic).
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The client configuration kubectl would use: an explicit file, else the
/// context asked for in the usual kubeconfig, else whatever is inferred
/// (KUBECONFIG, ~/.kube/config, the in-cluster service account).
pub async fn kube_config(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<kube::Config> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    Ok(match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                Error::invalid(format!("--kubeconfig {}", path.display()), e.to_string())
            })?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| Error::invalid("kubeconfig", e.to_string()))?
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::invalid("kubeconfig", e.to_string()))?,
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::invalid("kubernetes config", e.to_string()))?,
    })
}

/// A client as kubectl would build it, and the namespace to use.
pub async fn connect(args: &KubeArgs) -> Result<(Client, String)> {
    let config = kube_config(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let ns = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((Client::try_from(config)?, ns))
}

fn not_found(e: kube::Error, what: String) -> Error {
    match &e {
        kube::Error::Api(s) if s.is_not_found() => Error::invalid(what, "not found"),
        _ => Error::Kube(e),
    }
}

async fn get_plan(api: &Api<UpgradePlan>, ns: &str, name: &str) -> Result<UpgradePlan> {
    api.get(name)
        .await
        .map_err(|e| not_found(e, format!("upgradeplan {ns}/{name}")))
}

/// A merge patch of the plan, refused by the apiserver (409) if the plan
/// changed since it was read, so what was printed is what was approved.
async fn patch_plan(api: &Api<UpgradePlan>, plan: &UpgradePlan, mut patch: Value) -> Result<()> {
    if let (Some(rv), Some(obj)) = (plan.resource_version(), patch.as_object_mut()) {
        let meta = obj.entry("metadata").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert("resourceVersion".into(), Value::String(rv));
        }
    }
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch(&plan.name_any(), &params, &Patch::Merge(&patch))
        .await?;
    Ok(())
}

// ------------------------------------------------------------ approve, pause

async fn approve(kube: &KubeArgs, name: &str, want: Option<&str>) -> Result<String> {
    let (client, ns) = connect(kube).await?;
    let api: Api<UpgradePlan> = Api::namespaced(client, &ns);
    let plan = get_plan(&api, &ns, name).await?;
    let approval = approval(&plan, want)?;
    if plan.spec.approve.as_deref() != Some(approval.fingerprint.as_str()) {
        patch_plan(
            &api,
            &plan,
            json!({"spec": {"approve": approval.fingerprint}}),
        )
        .await?;
    }
    Ok(approval.text)
}

/// What `approve` will write and say; refused when nothing (or something
/// else than `want`) is pending.
struct Approval {
    fingerprint: String,
    text: String,
}

fn approval(plan: &UpgradePlan, want: Option<&str>) -> Result<Approval> {
    let what = format!(
        "upgradeplan {}/{}",
        plan.namespace().unwrap_or_default(),
        plan.name_any()
    );
    let status = plan.status.clone().unwrap_or_default();
    let Some(pending) = &status.pending_change else {
        let why = match &status.admitted {
            Some(a) => format!(
                "nothing to approve: change {} is already admitted (phase {})",
                a.fingerprint,
                status.phase.as_str()
            ),
            None => format!(
                "nothing to approve: no pending change (phase {})",
                status.phase.as_str()
            ),
        };
        return Err(Error::invalid(what, why));
    };
    if let Some(w) = want
        && w != pending.fingerprint
    {
        return Err(Error::invalid(
            what,
            format!(
                "the pending change is {}, not {w}: review it again (kubectl raygate explain)",
                pending.fingerprint
            ),
        ));
    }
    let mut s = String::new();
    let already = plan.spec.approve.as_deref() == Some(pending.fingerprint.as_str());
    let verb = if already {
        "Already approved"
    } else {
        "Approved"
    };
    cli::field(
        &mut s,
        &format!("{verb}:"),
        &format!(
            "change {} of {what} (RayService {})",
            pending.fingerprint, plan.spec.ray_service_ref.name
        ),
    );
    match plan.spec.policy {
        Policy::Manual => {}
        Policy::Auto => cli::field(
            &mut s,
            "Note:",
            "policy is Auto: the change is admitted as soon as it fits, approved or not",
        ),
        Policy::Paused => cli::field(
            &mut s,
            "Note:",
            "policy is Paused: nothing is admitted until `kubectl raygate resume`",
        ),
    }
    cli::field(&mut s, "Phase:", status.phase.as_str());
    if let Some(w) = &status.waiting_for {
        cli::field(&mut s, "Waiting for:", w);
    }
    if let Some(cap) = &status.capacity {
        if !cap.needed.is_empty() {
            cli::field(&mut s, "Needs:", &resources(&cap.needed));
        }
        if !cap.available.is_empty() {
            cli::field(&mut s, "Free for it:", &resources(&cap.available));
        }
        if !cap.shortfall.is_empty() {
            cli::field(&mut s, "Short by:", &resources(&cap.shortfall));
        }
    }
    s.push_str(&format!(
        "\nChanges that need a new cluster ({}):\n",
        pending.triggering_paths.len()
    ));
    for p in &pending.triggering_paths {
        s.push_str(&format!("  {p}\n"));
    }
    Ok(Approval {
        fingerprint: pending.fingerprint.clone(),
        text: s,
    })
}

fn resources(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn pause(kube: &KubeArgs, name: &str) -> Result<String> {
    let (client, ns) = connect(kube).await?;
    let api: Api<UpgradePlan> = Api::namespaced(client, &ns);
    let plan = get_plan(&api, &ns, name).await?;
    match pause_patch(&plan) {
        None => Ok(format!("upgradeplan {ns}/{name} is already paused\n")),
        Some(patch) => {
            patch_plan(&api, &plan, patch).await?;
            Ok(format!(
                "upgradeplan {ns}/{name} paused (was {:?}); `resume` restores it\n",
                plan.spec.policy
            ))
        }
    }
}

/// The patch that pauses a plan, keeping its policy for `resume`.
fn pause_patch(plan: &UpgradePlan) -> Option<Value> {
    if plan.spec.policy == Policy::Paused {
        return None;
    }
    Some(json!({
        "metadata": {"annotations": {PAUSED_POLICY_ANNOTATION: format!("{:?}", plan.spec.policy)}},
        "spec": {"policy": "Paused"},
    }))
}

async fn resume(kube: &KubeArgs, name: &str) -> Result<String> {
    let (client, ns) = connect(kube).await?;
    let api: Api<UpgradePlan> = Api::namespaced(client, &ns);
    let plan = get_plan(&api, &ns, name).await?;
    match resume_patch(&plan) {
        None => Ok(format!(
            "upgradeplan {ns}/{name} is not paused (policy {:?})\n",
            plan.spec.policy
        )),
        Some((policy, patch)) => {
            patch_plan(&api, &plan, patch).await?;
            Ok(format!(
                "upgradeplan {ns}/{name} resumed (policy {policy})\n"
            ))
        }
    }
}

/// The patch that restores the policy `pause` kept (`Auto` when it kept
/// none or something unknown), and removes the note.
fn resume_patch(plan: &UpgradePlan) -> Option<(&'static str, Value)> {
    if plan.spec.policy != Policy::Paused {
        return None;
    }
    let kept = plan.annotations().get(PAUSED_POLICY_ANNOTATION);
    let policy = match kept.map(String::as_str) {
        Some("Manual") => "Manual",
        _ => "Auto",
    };
    Some((
        policy,
        json!({
            "metadata": {"annotations": {PAUSED_POLICY_ANNOTATION: null}},
            "spec": {"policy": policy},
        }),
    ))
}

// ------------------------------------------------------------------- queue

/// One upgrade in the queue view; `None` fields are left out.
#[skip_serializing_none]
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    /// 1-based place among the waiting upgrades; none for admitted ones.
    pub position: Option<usize>,
    pub namespace: String,
    pub name: String,
    pub ray_service: String,
    pub phase: String,
    /// The priority the controller ranks the plan by (`status.effectivePriority`:
    /// `spec.priority` under the namespace's `--max-priority`).
    pub priority: i32,
    /// `spec.priority`, when the ceiling lowered it.
    pub requested_priority: Option<i32>,
    /// Since when the change has waited (waiting) or was admitted (admitted).
    pub since: Option<String>,
    pub fingerprint: Option<String>,
    /// What the new cluster requests.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub needs: BTreeMap<String, String>,
    pub waiting_for: Option<String>,
    /// Held in the ledger for an admitted upgrade until its pods are bound.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub reserved: BTreeMap<String, String>,
}

/// The queue: admitted upgrades first (they hold reservations), then the
/// waiting ones in the controller's admission order.
pub fn queue_entries(plans: &[UpgradePlan]) -> Vec<QueueEntry> {
    let mut admitted = vec![];
    let mut waiting = vec![];
    let mut by_key = BTreeMap::new();
    for p in plans {
        let Some(status) = &p.status else { continue };
        let key = (p.namespace().unwrap_or_default(), p.name_any());
        if let Some(a) = &status.admitted {
            admitted.push(QueueEntry {
                position: None,
                since: Some(a.admitted_time.to_string()),
                fingerprint: Some(a.fingerprint.clone()),
                needs: status
                    .capacity
                    .as_ref()
                    .map(|c| c.needed.clone())
                    .unwrap_or_default(),
                reserved: status
                    .capacity
                    .as_ref()
                    .map(|c| c.needed.clone())
                    .unwrap_or_default(),
                ..entry(p, status)
            });
        } else if let Some(c) = &status.pending_change {
            waiting.push(Candidate {
                namespace: key.0.clone(),
                name: key.1.clone(),
                priority: effective_priority(p, status),
                waiting_since: c.detected_time,
                pods: vec![],
                headroom: ResourceList::new(),
            });
            by_key.insert(
                key,
                QueueEntry {
                    since: Some(c.detected_time.to_string()),
                    fingerprint: Some(c.fingerprint.clone()),
                    needs: status
                        .capacity
                        .as_ref()
                        .map(|c| c.needed.clone())
                        .unwrap_or_default(),
                    ..entry(p, status)
                },
            );
        }
    }
    admitted
        .sort_by(|a, b| (&a.since, &a.namespace, &a.name).cmp(&(&b.since, &b.namespace, &b.name)));
    ledger::order(&mut waiting);
    let mut out = admitted;
    for (i, c) in waiting.iter().enumerate() {
        if let Some(mut e) = by_key.remove(&(c.namespace.clone(), c.name.clone())) {
            e.position = Some(i + 1);
            out.push(e);
        }
    }
    out
}

/// The priority the controller ranks `p` by: what it recorded, else (a
/// status written before raygate recorded it) `spec.priority`.
fn effective_priority(p: &UpgradePlan, status: &UpgradePlanStatus) -> i32 {
    status.effective_priority.unwrap_or(p.spec.priority)
}

fn entry(p: &UpgradePlan, status: &UpgradePlanStatus) -> QueueEntry {
    QueueEntry {
        position: None,
        namespace: p.namespace().unwrap_or_default(),
        name: p.name_any(),
        ray_service: p.spec.ray_service_ref.name.clone(),
        phase: status.phase.as_str().to_string(),
        priority: effective_priority(p, status),
        requested_priority: Some(p.spec.priority)
            .filter(|&asked| asked != effective_priority(p, status)),
        since: None,
        fingerprint: None,
        needs: BTreeMap::new(),
        waiting_for: status.waiting_for.clone(),
        reserved: BTreeMap::new(),
    }
}

async fn queue(kube: &KubeArgs, all: bool, output: Format) -> Result<String> {
    let (client, ns) = connect(kube).await?;
    let api: Api<UpgradePlan> = if all {
        Api::all(client)
    } else {
        Api::namespaced(client, &ns)
    };
    let plans = api.list(&ListParams::default()).await?.items;
    let entries = queue_entries(&plans);
    render_queue(&entries, all, output, Timestamp::now())
}

fn sum_q(m: &BTreeMap<String, String>, names: &[&str]) -> Option<Quantity> {
    let mut total: Option<Quantity> = None;
    for n in names {
        if let Some(q) = m.get(*n).and_then(|v| Quantity::parse(v).ok()) {
            total = Some(match total {
                Some(t) => t.saturating_add(&q),
                None => q,
            });
        }
    }
    total
}

/// One column of quantities in one unit, as kubectl prints a column
/// (`18000m 64500m`, never `18 64500m`); `-` where there is none.
fn column_in_one_unit(cells: &[Option<Quantity>]) -> Vec<String> {
    let present: Vec<&Quantity> = cells.iter().flatten().collect();
    let mut printed = crate::quantity::in_one_unit(&present).into_iter();
    cells
        .iter()
        .map(|c| match c {
            Some(_) => printed.next().unwrap_or_else(|| "-".into()),
            None => "-".into(),
        })
        .collect()
}

fn age(since: Option<&str>, now: Timestamp) -> String {
    let Some(t) = since.and_then(|s| s.parse::<Timestamp>().ok()) else {
        return "-".into();
    };
    let secs = now.duration_since(t).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

pub fn render_queue(
    entries: &[QueueEntry],
    all: bool,
    output: Format,
    now: Timestamp,
) -> Result<String> {
    let structured = match output {
        Format::Json => cli::Output::Json,
        Format::Yaml => cli::Output::Yaml,
        Format::Text | Format::Wide => cli::Output::Text,
    };
    if let Some(s) = structured.structured(&json!({"items": entries}))? {
        return Ok(s);
    }
    if entries.is_empty() {
        return Ok("No upgrades waiting or admitted.\n".into());
    }
    let wide = output == Format::Wide;
    let mut head = vec!["#"];
    if all {
        head.push("NAMESPACE");
    }
    head.extend(["NAME", "PHASE", "PRIORITY", "WAITING", "GPUS NEEDED"]);
    if wide {
        head.extend(["CPU NEEDED", "MEMORY NEEDED"]);
    }
    head.extend(["RESERVED", "WAITING FOR"]);
    if wide {
        head.push("FINGERPRINT");
    }
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    let column = |names: &[&str], of: fn(&QueueEntry) -> &BTreeMap<String, String>| {
        column_in_one_unit(
            &entries
                .iter()
                .map(|e| sum_q(of(e), names))
                .collect::<Vec<_>>(),
        )
    };
    let gpus_needed = column(&ACCELERATORS, |e| &e.needs);
    let cpu_needed = column(&["cpu"], |e| &e.needs);
    let memory_needed = column(&["memory"], |e| &e.needs);
    let gpus_reserved = column(&ACCELERATORS, |e| &e.reserved);
    for (i, e) in entries.iter().enumerate() {
        let cell = |c: &[String]| c.get(i).cloned().unwrap_or_else(|| "-".into());
        let mut r = vec![
            e.position
                .map_or_else(|| "admitted".into(), |p| p.to_string()),
        ];
        if all {
            r.push(e.namespace.clone());
        }
        r.push(e.name.clone());
        r.push(e.phase.clone());
        r.push(match e.requested_priority {
            Some(asked) => format!("{} (asked {asked})", e.priority),
            None => e.priority.to_string(),
        });
        r.push(if e.position.is_some() {
            age(e.since.as_deref(), now)
        } else {
            "-".into()
        });
        r.push(cell(&gpus_needed));
        if wide {
            r.push(cell(&cpu_needed));
            r.push(cell(&memory_needed));
        }
        r.push(if wide {
            match resources(&e.reserved) {
                s if s.is_empty() => "-".into(),
                s => s,
            }
        } else {
            cell(&gpus_reserved)
        });
        r.push(e.waiting_for.clone().unwrap_or_else(|| "-".into()));
        if wide {
            r.push(e.fingerprint.clone().unwrap_or_else(|| "-".into()));
        }
        rows.push(r);
    }
    Ok(columns(&rows))
}

/// kubectl's table: left-aligned columns, three spaces apart.
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            let w = widths.get(c).copied().unwrap_or(0);
            line.push_str(&format!("{cell:<w$}   "));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

// ------------------------------------------------------------- explain, fit

/// Where the file's RayService lives: its own namespace, else `-n`/the
/// context's. A file naming another namespace than an explicit `-n` is
/// refused, as `kubectl apply` refuses it, so the answer is about the object
/// the user is about to change.
fn service_namespace(
    svc: &RayService,
    file: &Path,
    explicit: Option<&str>,
    default_ns: &str,
) -> Result<String> {
    match (svc.namespace().filter(|n| !n.is_empty()), explicit) {
        (Some(own), Some(flag)) if own != flag => Err(Error::invalid(
            file.display().to_string(),
            format!(
                "the namespace from the provided object {own:?} does not match the namespace \
                 {flag:?}. You must pass '--namespace={own}' to perform this operation."
            ),
        )),
        (Some(own), _) => Ok(own),
        (None, flag) => Ok(flag.unwrap_or(default_ns).to_string()),
    }
}

async fn live_service(client: &Client, ns: &str, name: &str) -> Result<Option<RayService>> {
    Api::<RayService>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(Error::from)
}

/// The cluster KubeRay compares a spec with: the pending one while a
/// transition runs, else the active one (as the controller does).
fn compared_cluster(live: &RayService) -> Option<(String, &'static str)> {
    let status = live.status.as_ref()?;
    let name = |s: Option<&kuberay::RayServiceStatus>| {
        s.and_then(|s| s.ray_cluster_name.clone())
            .filter(|n| !n.is_empty())
    };
    name(status.pending_service_status.as_ref())
        .map(|n| (n, "pending"))
        .or_else(|| name(status.active_service_status.as_ref()).map(|n| (n, "active")))
}

/// Does raygate gate this RayService (own `spec.upgradeStrategy.type`, and
/// no other field manager with it: then raygate reports GateOverridden)?
fn gated_by_raygate(live: &RayService) -> bool {
    let managed = live.metadata.managed_fields.as_deref().unwrap_or(&[]);
    crate::upgradeplan::ownership::owned_by_us(managed)
        && crate::upgradeplan::ownership::other_owner(managed).is_none()
}

/// The KubeRay release whose rules apply to a live RayCluster: `--kuberay-version`
/// when given, else the release that last wrote the cluster (KubeRay stamps
/// `ray.io/kuberay-version` and rewrites the active cluster when the operator's
/// version changes, so it is the running operator's), else the newest. Judging a
/// v1.6.1 cluster by v1.7.0's rules would predict that version rewrite.
fn live_version(
    flag: Option<&str>,
    cluster: Option<&RayCluster>,
) -> Result<(kuberay::KubeRayVersion, Option<String>)> {
    if flag.is_some() {
        return Ok((cli::kuberay_version(flag)?, None));
    }
    let stamped = cluster.and_then(|c| c.annotations().get(kuberay::ANNOTATION_KUBERAY_VERSION));
    let latest = kuberay::KubeRayVersion::latest();
    Ok(
        match stamped.map(|v| (v, kuberay::release::Stamp::parse(v))) {
            Some((_, Some(s))) if s.known => (
                s.rules,
                Some(format!(
                    "{}, the release that last wrote the RayCluster (ray.io/kuberay-version)",
                    s.rules
                )),
            ),
            Some((v, Some(s))) => (
                s.rules,
                Some(format!(
                    "{}: the RayCluster was written by KubeRay {v}, a release raygate does not \
                 know; the rules of the nearest older one (--kuberay-version to choose)",
                    s.rules
                )),
            ),
            Some((v, None)) => (
                latest,
                Some(format!(
                    "{latest}: the RayCluster's ray.io/kuberay-version {v:?} is not a release \
                 (--kuberay-version to choose)"
                )),
            ),
            None => (latest, None),
        },
    )
}

async fn explain(args: &ExplainArgs, kube: &KubeArgs) -> Result<String> {
    if args.old.is_some() {
        return cli::explain(args);
    }
    // Read once for its name and namespace; again below with the live release's rules.
    let first = cli::read_service(
        &args.new,
        cli::kuberay_version(args.kuberay_version.as_deref())?,
    )?;
    let (client, default_ns) = connect(kube).await?;
    let ns = service_namespace(&first, &args.new, kube.namespace.as_deref(), &default_ns)?;
    let name = first.name_any();
    let Some(live) = live_service(&client, &ns, &name).await? else {
        let (version, _) = live_version(args.kuberay_version.as_deref(), None)?;
        return created(args, &first, &format!("RayService {ns}/{name}"), version);
    };
    let Some((cluster, role)) = compared_cluster(&live) else {
        let (version, _) = live_version(args.kuberay_version.as_deref(), None)?;
        return created(
            args,
            &first,
            &format!("RayService {ns}/{name} (no cluster yet)"),
            version,
        );
    };
    let rc: RayCluster = Api::<RayCluster>::namespaced(client, &ns)
        .get(&cluster)
        .await
        .map_err(|e| not_found(e, format!("RayCluster {ns}/{cluster} ({role})")))?;
    let (version, version_note) = live_version(args.kuberay_version.as_deref(), Some(&rc))?;
    let mut new = cli::read_service(&args.new, version)?;
    new.metadata.namespace = Some(ns.clone());
    let errors = cli::manifest_errors(&new);
    let mut notes = vec![(
        "Compared to:",
        format!("RayCluster {ns}/{cluster} ({role}, live)"),
    )];
    if let Some(n) = version_note {
        notes.push(("Release:", n));
    }
    if let Some(note) = with_live_gate(&mut new, &live) {
        notes.push(("Gate:", note));
    }
    let label = format!("RayCluster {ns}/{cluster}");
    cli::explain_against(
        args,
        version,
        &Old::Live(Box::new(rc), Box::new(live)),
        Path::new(&label),
        &new,
        &errors,
        &notes,
    )
}

/// The gate KubeRay will see once the file is applied: `kubectl apply` leaves
/// raygate's gate in place when the file does not set it, and what matters is
/// what KubeRay does once raygate opens it. Returns a note when raygate gates it.
fn with_live_gate(new: &mut RayService, live: &RayService) -> Option<String> {
    let file_sets_gate = new
        .spec
        .upgrade_strategy
        .as_ref()
        .and_then(|u| u.type_.as_ref())
        .is_some();
    if file_sets_gate {
        return None;
    }
    if gated_by_raygate(live) {
        new.spec
            .upgrade_strategy
            .get_or_insert_with(Default::default)
            .type_ = Some(UpgradeType::NewCluster);
        return Some(
            "raygate gates this RayService: a new cluster waits for its admission \
             (kubectl raygate queue)"
                .to_string(),
        );
    }
    new.spec.upgrade_strategy = live.spec.upgrade_strategy.clone();
    None
}

/// `explain` for a RayService that has no cluster yet: applying it creates one.
fn created(
    args: &ExplainArgs,
    new: &RayService,
    what: &str,
    version: kuberay::KubeRayVersion,
) -> Result<String> {
    let (pods, requests) = cli::in_file(&args.new, cli::new_cluster_requests(new, version))?;
    let requests = crate::capacity::canonical_map(&requests);
    let errors = cli::manifest_errors(new);
    let out = json!({
        "verdict": "Create",
        "reason": format!("{what} does not exist: applying it creates its first RayCluster, which raygate does not hold"),
        "newCluster": {"pods": pods, "requests": requests},
        "errors": errors,
    });
    if let Some(s) = args.output.structured(&out)? {
        return Ok(s);
    }
    let mut s = String::new();
    for e in &errors {
        cli::field(&mut s, "ERROR:", &format!("{}: {}", e.path, e.message));
    }
    cli::field(&mut s, "Verdict:", "Create");
    cli::field(
        &mut s,
        "Why:",
        &format!(
            "{what} does not exist: applying it creates its first RayCluster, which raygate does not hold"
        ),
    );
    cli::field(
        &mut s,
        "New spec:",
        &format!("{pods} pods, requesting in total:"),
    );
    s.push_str(&format!("  {}\n", resources(&requests)));
    Ok(s)
}

async fn fit(args: &FitArgs, kube: &KubeArgs) -> Result<cli::FitOutcome> {
    if let Some(path) = &args.state {
        let mut o = cli::fit(args)?;
        o.warnings = o
            .warnings
            .iter()
            .map(|w| format!("{}: {w}", path.display()))
            .collect();
        return Ok(o);
    }
    let first = cli::read_service(
        &args.new,
        cli::kuberay_version(args.kuberay_version.as_deref())?,
    )?;
    let (client, default_ns) = connect(kube).await?;
    let ns = service_namespace(&first, &args.new, kube.namespace.as_deref(), &default_ns)?;
    let name = first.name_any();
    let mut notes = vec![];
    // The old side is the live service's active cluster; its pods are the old
    // side of the fit, its KubeRay release says which pods the new one gets.
    let live = live_service(&client, &ns, &name).await?;
    let active = match live.as_ref().and_then(|l| l.status.as_ref()) {
        Some(status) => match status
            .active_service_status
            .as_ref()
            .and_then(|a| a.ray_cluster_name.as_deref())
            .filter(|n| !n.is_empty())
        {
            Some(c) => {
                Api::<RayCluster>::namespaced(client.clone(), &ns)
                    .get_opt(c)
                    .await?
            }
            None => None,
        },
        None => None,
    };
    let (version, version_note) = live_version(args.kuberay_version.as_deref(), active.as_ref())?;
    let mut svc = cli::read_service(&args.new, version)?;
    svc.metadata.namespace = Some(ns.clone());
    if let Some(n) = version_note {
        notes.push(("Release:", n));
    }
    // Nothing to fit when KubeRay builds no new cluster for the file (the
    // change completed, or only replicas or the Serve config changed).
    if let Some(live) = &live
        && let Some((cluster, role)) = compared_cluster(live)
    {
        let rc = match (&active, role) {
            (Some(a), "active") if a.name_any() == cluster => Some(a.clone()),
            _ => {
                Api::<RayCluster>::namespaced(client.clone(), &ns)
                    .get_opt(&cluster)
                    .await?
            }
        };
        if let Some(rc) = rc {
            let mut as_applied = svc.clone();
            with_live_gate(&mut as_applied, live);
            let label = format!("RayCluster {ns}/{cluster}");
            let c = cli::in_file(
                Path::new(&label),
                kuberay::classify(&kuberay::OldSide::RayCluster(&rc), &as_applied, version),
            )?;
            let c = cli::with_live_serve_config(c, live, &as_applied);
            if !cli::needs_new_cluster(&c) {
                notes.insert(
                    0,
                    (
                        "Compared to:",
                        format!("RayCluster {ns}/{cluster} ({role}, live)"),
                    ),
                );
                return cli::no_new_cluster(args, &c, &notes);
            }
        }
    }
    match live {
        Some(live) => svc.status = live.status,
        None => {
            svc.status = None;
            notes.push((
                "Note:",
                format!("RayService {ns}/{name} does not exist yet: no old cluster"),
            ));
        }
    }
    let mut headroom: ResourceList = args.headroom.iter().cloned().collect();
    let plans = plans_in(&client, &ns).await?;
    if let Some(plan) = plans.iter().find(|p| p.spec.ray_service_ref.name == name) {
        if headroom.is_empty() {
            for (k, v) in &plan.spec.headroom {
                let q = Quantity::parse_field(
                    &format!("UpgradePlan {ns}/{} spec.headroom[{k}]", plan.name_any()),
                    v,
                )?;
                headroom.insert(k.clone(), q);
            }
        }
        notes.push((
            "UpgradePlan:",
            format!(
                "{ns}/{} (policy {:?}, priority {})",
                plan.name_any(),
                plan.spec.policy,
                plan.spec.priority
            ),
        ));
    }
    let mut state = live_state(&client).await?;
    state
        .dra
        .plain_count
        .extend(args.dra_plain_count_class.iter().cloned());
    let reserved = reservations(&plans, &name);
    if !reserved.is_empty() {
        notes.push((
            "Reserved:",
            format!(
                "by upgrades admitted in {ns} (not counted here; see `kubectl raygate queue`): {}",
                resources(&reserved)
            ),
        ));
    }
    cli::fit_in(
        args,
        version,
        state,
        Path::new("cluster state"),
        &svc,
        headroom,
        &notes,
    )
}

/// The UpgradePlans of a namespace; none where raygate's CRD is not
/// installed (the fit is then the plain scheduler question).
async fn plans_in(client: &Client, ns: &str) -> Result<Vec<UpgradePlan>> {
    match Api::<UpgradePlan>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(list.items),
        // An unknown resource type is the apiserver's plain "404 page not
        // found", not a NotFound Status.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(vec![]),
        Err(e) => Err(e.into()),
    }
}

/// What admitted upgrades of other RayServices hold in the ledger, summed.
fn reservations(plans: &[UpgradePlan], except: &str) -> BTreeMap<String, String> {
    let mut total = ResourceList::new();
    for p in plans
        .iter()
        .filter(|p| p.spec.ray_service_ref.name != except)
    {
        let Some(status) = p.status.as_ref() else {
            continue;
        };
        if let (Some(_), Some(capacity)) = (&status.admitted, &status.capacity) {
            let list: ResourceList = capacity
                .needed
                .iter()
                .filter_map(|(k, v)| Quantity::parse(v).ok().map(|q| (k.clone(), q)))
                .collect();
            crate::capacity::add_into(&mut total, &list);
        }
    }
    crate::capacity::canonical_map(&total)
}

/// Nodes and LimitRanges slimmed as the controller caches them, and
/// non-terminal pods as its records, page by page.
async fn live_state(client: &Client) -> Result<ClusterState> {
    let mut nodes: Vec<Node> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    nodes.iter_mut().for_each(slim::slim_node);
    let mut limit_ranges: Vec<LimitRange> = Api::<LimitRange>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    limit_ranges.iter_mut().for_each(slim::slim_limit_range);
    // Pods as the controller watches them: partial objects straight into records,
    // a page at a time, so a large cluster's full Pods are never all in memory.
    let pods_api = Api::<PartialPod>::all(client.clone());
    let mut strings = Strings::default();
    let mut pods = vec![];
    let mut lp = ListParams::default()
        .limit(PAGE)
        .fields("status.phase!=Succeeded,status.phase!=Failed");
    while let Some(token) = add_page(&mut pods, &mut strings, pods_api.list(&lp).await?) {
        lp = lp.continue_token(&token);
    }
    if nodes.is_empty() {
        return Err(Error::invalid("cluster state", "the cluster has no nodes"));
    }
    let runtime_classes = Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let (dra, warnings) = live_dra(client).await;
    Ok(ClusterState {
        nodes,
        pods,
        limit_ranges,
        runtime_classes,
        strings,
        dra,
        warnings,
    })
}

/// The cluster's resource.k8s.io/v1 objects; a kind that cannot be listed (an older
/// cluster, no RBAC) is left out with a warning: its devices then count as absent.
async fn live_dra(client: &Client) -> (crate::capacity::dra::DraState, Vec<String>) {
    use k8s_openapi::api::resource::v1::{
        DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
    };
    let mut dra = crate::capacity::dra::DraState::default();
    let mut warnings = Vec::new();
    let lp = ListParams::default();
    match Api::<ResourceSlice>::all(client.clone()).list(&lp).await {
        Ok(l) => l.items.iter().for_each(|o| {
            dra.apply_slice(o);
        }),
        Err(e) => warnings.push(format!("resourceslices not read: {e}")),
    }
    match Api::<DeviceClass>::all(client.clone()).list(&lp).await {
        Ok(l) => l.items.iter().for_each(|o| {
            dra.apply_class(o);
        }),
        Err(e) => warnings.push(format!("deviceclasses not read: {e}")),
    }
    match Api::<ResourceClaim>::all(client.clone()).list(&lp).await {
        Ok(l) => l.items.iter().for_each(|o| {
            dra.apply_claim(o);
        }),
        Err(e) => warnings.push(format!("resourceclaims not read: {e}")),
    }
    match Api::<ResourceClaimTemplate>::all(client.clone())
        .list(&lp)
        .await
    {
        Ok(l) => l.items.iter().for_each(|o| {
            dra.apply_template(o);
        }),
        Err(e) => warnings.push(format!("resourceclaimtemplates not read: {e}")),
    }
    (dra, warnings)
}

/// Adds a page of listed pods as records; the token of the next page, if any.
fn add_page(
    pods: &mut Vec<PodRecord>,
    strings: &mut Strings,
    page: ObjectList<PartialPod>,
) -> Option<String> {
    pods.extend(page.items.iter().map(|p| p.to_record(strings)));
    page.metadata.continue_.filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upgradeplan::{Admission, CapacityStatus, PendingChange, Phase, UpgradePlanSpec};
    use k8s_openapi::api::core::v1::Pod;

    fn plan(name: &str, priority: i32, status: Option<UpgradePlanStatus>) -> UpgradePlan {
        let spec: UpgradePlanSpec = serde_json::from_value(
            json!({"rayServiceRef": {"name": name}, "priority": priority, "policy": "Manual"}),
        )
        .unwrap();
        let mut p = UpgradePlan::new(name, spec);
        p.metadata.namespace = Some("ml".into());
        p.status = status;
        p
    }

    fn waiting(fp: &str, since: &str, gpus: &str) -> Option<UpgradePlanStatus> {
        Some(UpgradePlanStatus {
            phase: Phase::WaitingForCapacity,
            waiting_for: Some(format!("capacity: nvidia.com/gpu {gpus}")),
            pending_change: Some(PendingChange {
                fingerprint: fp.into(),
                triggering_paths: vec![
                    "workerGroupSpecs[gpu].template.spec.containers[ray-worker].image".into(),
                ],
                detected_time: since.parse().unwrap(),
            }),
            capacity: Some(CapacityStatus {
                needed: BTreeMap::from([
                    ("nvidia.com/gpu".into(), gpus.into()),
                    ("cpu".into(), "8".into()),
                ]),
                available: BTreeMap::from([("nvidia.com/gpu".into(), "2".into())]),
                shortfall: BTreeMap::from([("nvidia.com/gpu".into(), "6".into())]),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn now() -> Timestamp {
        "2026-12-02T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn queue_ranks_by_the_priority_the_controller_uses() {
        // team-a asks for 1000, the ceiling (--max-priority=0) made it 0: the
        // older team-b plan stays ahead, and the view says why.
        let capped = |mut s: Option<UpgradePlanStatus>, p: i32| {
            if let Some(s) = s.as_mut() {
                s.effective_priority = Some(p);
            }
            s
        };
        let plans = vec![
            plan(
                "team-a",
                1000,
                capped(waiting("fp1", "2026-12-02T11:30:00Z", "8"), 0),
            ),
            plan(
                "team-b",
                0,
                capped(waiting("fp2", "2026-12-02T11:00:00Z", "8"), 0),
            ),
        ];
        let q = queue_entries(&plans);
        let names: Vec<_> = q.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["team-b", "team-a"]);
        assert_eq!((q[1].priority, q[1].requested_priority), (0, Some(1000)));
        assert_eq!((q[0].priority, q[0].requested_priority), (0, None));
        let text = render_queue(&q, false, Format::Text, now()).unwrap();
        assert!(text.contains("0 (asked 1000)"), "{text}");
        // A status from before raygate recorded it: spec.priority, as before.
        let plans = vec![
            plan("team-a", 1000, waiting("fp1", "2026-12-02T11:30:00Z", "8")),
            plan("team-b", 0, waiting("fp2", "2026-12-02T11:00:00Z", "8")),
        ];
        assert_eq!(queue_entries(&plans)[0].name, "team-a");
    }

    #[test]
    fn queue_lists_admitted_then_waiting_in_admission_order() {
        let admitted = Some(UpgradePlanStatus {
            phase: Phase::Admitted,
            admitted: Some(Admission {
                fingerprint: "aaa".into(),
                admitted_time: "2026-12-02T11:59:00Z".parse().unwrap(),
                ..Default::default()
            }),
            capacity: Some(CapacityStatus {
                needed: BTreeMap::from([("nvidia.com/gpu".into(), "8".into())]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let plans = vec![
            plan("late", 0, waiting("fp1", "2026-12-02T11:30:00Z", "8")),
            plan("early", 0, waiting("fp2", "2026-12-02T11:00:00Z", "8")),
            plan("urgent", 5, waiting("fp3", "2026-12-02T11:50:00Z", "16")),
            plan("running", 0, admitted),
            plan("idle", 0, Some(UpgradePlanStatus::default())),
            plan("new", 0, None),
        ];
        let q = queue_entries(&plans);
        let names: Vec<_> = q.iter().map(|e| (e.position, e.name.as_str())).collect();
        assert_eq!(
            names,
            [
                (None, "running"),
                (Some(1), "urgent"),
                (Some(2), "early"),
                (Some(3), "late")
            ]
        );
        assert_eq!(q[0].reserved["nvidia.com/gpu"], "8");
        assert_eq!(q[1].needs["nvidia.com/gpu"], "16");
        let text = render_queue(&q, false, Format::Text, now()).unwrap();
        insta::assert_snapshot!("queue_text", text);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "#", "NAME", "PHASE", "PRIORITY", "WAITING", "GPUS", "NEEDED", "RESERVED",
                "WAITING", "FOR"
            ]
        );
        assert!(
            lines[1].starts_with("admitted   running   Admitted"),
            "{text}"
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            [
                "1",
                "urgent",
                "WaitingForCapacity",
                "5",
                "10m",
                "16",
                "-",
                "capacity:",
                "nvidia.com/gpu",
                "16"
            ]
        );
        assert!(lines[3].contains(" 60m "), "{text}");
        let wide = render_queue(&q, true, Format::Wide, now()).unwrap();
        insta::assert_snapshot!("queue_wide", wide);
        assert!(wide.lines().next().unwrap().contains("NAMESPACE"), "{wide}");
        assert!(wide.contains("nvidia.com/gpu 8"), "{wide}");
        let v: Value =
            serde_json::from_str(&render_queue(&q, false, Format::Json, now()).unwrap()).unwrap();
        assert_eq!(v["items"][1]["name"], "urgent");
        assert_eq!(v["items"][1]["position"], 1);
        assert_eq!(v["items"][0].get("position"), None);
    }

    /// CPU NEEDED of one plan at 500m and another at 8 reads `500m 8000m`.
    #[test]
    fn queue_columns_are_in_one_unit() {
        let mut half = waiting("fp1", "2026-12-02T11:30:00Z", "1");
        if let Some(c) = half.as_mut().and_then(|s| s.capacity.as_mut()) {
            c.needed.insert("cpu".into(), "500m".into());
            c.needed.insert("memory".into(), "1Gi".into());
        }
        let mut whole = waiting("fp2", "2026-12-02T11:00:00Z", "8");
        if let Some(c) = whole.as_mut().and_then(|s| s.capacity.as_mut()) {
            c.needed.insert("memory".into(), "512Mi".into());
        }
        let entries = queue_entries(&[plan("a", 0, half), plan("b", 0, whole)]);
        let wide = render_queue(&entries, false, Format::Wide, now()).unwrap();
        let cols: Vec<Vec<&str>> = wide
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect())
            .collect();
        // # NAME PHASE PRIORITY WAITING GPUS CPU MEMORY ...
        assert_eq!(cols[0][6..8], ["8000m", "512Mi"], "{wide}");
        assert_eq!(cols[1][6..8], ["500m", "1024Mi"], "{wide}");
    }

    #[test]
    fn an_empty_queue_says_so() {
        let text = render_queue(&[], false, Format::Text, now()).unwrap();
        assert_eq!(text, "No upgrades waiting or admitted.\n");
    }

    #[test]
    fn approval_names_the_change_and_what_it_needs() {
        let p = plan(
            "chat",
            0,
            waiting("6aca5d208cb0", "2026-12-02T11:00:00Z", "8"),
        );
        let a = approval(&p, None).unwrap();
        assert_eq!(a.fingerprint, "6aca5d208cb0");
        insta::assert_snapshot!("approval", a.text);
        assert!(
            a.text
                .starts_with("Approved:     change 6aca5d208cb0 of upgradeplan ml/chat"),
            "{}",
            a.text
        );
        assert!(
            a.text.contains("Needs:        cpu 8, nvidia.com/gpu 8"),
            "{}",
            a.text
        );
        assert!(
            a.text.contains("Short by:     nvidia.com/gpu 6"),
            "{}",
            a.text
        );
        assert!(
            a.text
                .contains("  workerGroupSpecs[gpu].template.spec.containers[ray-worker].image\n")
        );
        let err = approval(&p, Some("0123456789ab"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("the pending change is 6aca5d208cb0, not 0123456789ab"),
            "{err}"
        );
        let idle = plan("chat", 0, None);
        let err = approval(&idle, None).err().unwrap().to_string();
        assert_eq!(
            err,
            "upgradeplan ml/chat: nothing to approve: no pending change (phase Idle)"
        );
    }

    #[test]
    fn pause_keeps_the_policy_and_resume_restores_it() {
        let p = plan("chat", 0, None);
        let patch = pause_patch(&p).unwrap();
        assert_eq!(patch["spec"]["policy"], "Paused");
        assert_eq!(
            patch["metadata"]["annotations"][PAUSED_POLICY_ANNOTATION],
            "Manual"
        );
        assert!(resume_patch(&p).is_none(), "not paused");
        let mut paused = p.clone();
        paused.spec.policy = Policy::Paused;
        paused.metadata.annotations = Some(BTreeMap::from([(
            PAUSED_POLICY_ANNOTATION.into(),
            "Manual".into(),
        )]));
        assert!(pause_patch(&paused).is_none(), "already paused");
        let (policy, patch) = resume_patch(&paused).unwrap();
        assert_eq!(policy, "Manual");
        assert_eq!(
            patch["metadata"]["annotations"][PAUSED_POLICY_ANNOTATION],
            Value::Null
        );
        paused.metadata.annotations = None;
        assert_eq!(resume_patch(&paused).unwrap().0, "Auto");
    }

    #[test]
    fn a_serve_config_change_is_seen_against_the_live_rayservice() {
        let svc = |route: &str| -> RayService {
            serde_json::from_value(json!({
                "apiVersion": "ray.io/v1", "kind": "RayService",
                "metadata": {"name": "chat", "namespace": "ml"},
                "spec": {
                    "serveConfigV2": format!("applications:\n  - name: chat\n    import_path: a:b\n    route_prefix: {route}\n"),
                    "rayClusterConfig": {
                        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                            {"name": "ray-head", "image": "rayproject/ray:2.9.0"}]}}},
                        "workerGroupSpecs": []
                    }
                }
            }))
            .unwrap()
        };
        let v = kuberay::KubeRayVersion::latest();
        let (live, new) = (svc("/"), svc("/chat"));
        // What the cluster side alone says: nothing changed.
        let cluster_only = kuberay::classify(&kuberay::OldSide::RayService(&new), &new, v).unwrap();
        assert_eq!(cluster_only.verdict, kuberay::Verdict::NoChange);
        let c = cli::with_live_serve_config(cluster_only.clone(), &live, &new);
        assert_eq!(c.verdict, kuberay::Verdict::ServeConfigUpdate);
        assert_eq!(
            c.serve_config_paths,
            ["serveConfigV2.applications[chat].route_prefix"]
        );
        let same = cli::with_live_serve_config(cluster_only, &new, &new);
        assert_eq!(same.verdict, kuberay::Verdict::NoChange);
        assert!(same.serve_config_paths.is_empty());
    }

    #[test]
    fn a_live_cluster_is_judged_by_the_release_that_wrote_it() {
        let rc = |v: &str| -> RayCluster {
            serde_json::from_value(json!({
                "apiVersion": "ray.io/v1", "kind": "RayCluster",
                "metadata": {"name": "c", "annotations": {"ray.io/kuberay-version": v}},
                "spec": {"workerGroupSpecs": []}
            }))
            .unwrap()
        };
        let latest = kuberay::KubeRayVersion::latest();
        let (v, note) = live_version(None, Some(&rc("v1.6.1"))).unwrap();
        assert_eq!(v.to_string(), "v1.6.1");
        assert!(
            note.unwrap()
                .starts_with("v1.6.1, the release that last wrote")
        );
        let (v, note) = live_version(Some("1.5"), Some(&rc("v1.6.1"))).unwrap();
        assert_eq!((v.to_string(), note), ("v1.5.2".to_string(), None));
        // A release raygate does not know: the nearest older one's rules, said so.
        let (v, note) = live_version(None, Some(&rc("v9.0.0"))).unwrap();
        assert_eq!(v, latest);
        assert!(
            note.unwrap()
                .contains("KubeRay v9.0.0, a release raygate does not know")
        );
        let (v, note) = live_version(None, Some(&rc("v1.6.3"))).unwrap();
        assert_eq!(v.to_string(), "v1.6.2");
        assert!(note.unwrap().contains("nearest older"));
        let (v, note) = live_version(None, Some(&rc("nightly"))).unwrap();
        assert_eq!(v, latest);
        assert!(note.unwrap().contains("\"nightly\" is not a release"));
        assert_eq!(live_version(None, None).unwrap(), (latest, None));
        assert!(live_version(Some("0.1"), None).is_err());
    }

    #[test]
    fn the_files_namespace_must_match_an_explicit_namespace() {
        let svc = |ns: Option<&str>| {
            let mut s: RayService = serde_json::from_value(json!({
                "apiVersion": "ray.io/v1", "kind": "RayService",
                "metadata": {"name": "chat"}, "spec": {}
            }))
            .unwrap();
            s.metadata.namespace = ns.map(str::to_owned);
            s
        };
        let f = Path::new("svc.yaml");
        assert_eq!(
            service_namespace(&svc(None), f, None, "ctx").unwrap(),
            "ctx"
        );
        assert_eq!(
            service_namespace(&svc(None), f, Some("ml"), "ctx").unwrap(),
            "ml"
        );
        assert_eq!(
            service_namespace(&svc(Some("ml")), f, None, "ctx").unwrap(),
            "ml"
        );
        assert_eq!(
            service_namespace(&svc(Some("ml")), f, Some("ml"), "ctx").unwrap(),
            "ml"
        );
        let err = service_namespace(&svc(Some("ml")), f, Some("dev"), "ctx")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "svc.yaml: the namespace from the provided object \"ml\" does not match"
            ),
            "{err}"
        );
    }

    #[test]
    fn api_errors_exit_4_and_not_found_exits_1() {
        let status = |code: u16, reason: &str| {
            Error::Kube(kube::Error::Api(Box::new(kube::core::Status {
                code,
                reason: reason.into(),
                ..Default::default()
            })))
        };
        assert_eq!(exit_code(&status(404, "NotFound")), 1);
        assert_eq!(exit_code(&status(409, "Conflict")), 4);
        assert_eq!(exit_code(&Error::invalid("x", "y")), 1);
    }

    #[test]
    fn listed_pages_become_the_records_of_the_full_pods() {
        let pod = |name: &str, node: &str| {
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ml",
                    "labels": {"ray.io/cluster": "chat-abcde", "ray.io/node-type": "worker"},
                    "managedFields": [{"manager": "kubelet", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]},
                "spec": {"nodeName": node,
                    "containers": [{"name": "ray-worker", "image": "ray:2.9",
                        "env": [{"name": "RAY_ADDRESS", "value": "x"}],
                        "readinessProbe": {"exec": {"command": ["true"]}},
                        "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"},
                                      "limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Running", "podIP": "10.244.0.7",
                    "conditions": [{"type": "Ready", "status": "True"}]}
            })
        };
        let list = |items: Vec<Value>, token: &str| -> ObjectList<PartialPod> {
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PodList",
                "metadata": {"resourceVersion": "42", "continue": token},
                "items": items,
            }))
            .unwrap()
        };
        let (first, second) = (pod("w-1", "gpu-1"), pod("w-2", "gpu-2"));
        let (mut pods, mut strings) = (vec![], Strings::default());
        let next = add_page(&mut pods, &mut strings, list(vec![first.clone()], "page-2"));
        assert_eq!(next.as_deref(), Some("page-2"));
        // The last page has an empty continue token.
        let next = add_page(&mut pods, &mut strings, list(vec![second.clone()], ""));
        assert_eq!(next, None);
        let full: Vec<PodRecord> = [first, second]
            .into_iter()
            .map(|p| PodRecord::from_pod(&serde_json::from_value::<Pod>(p).unwrap()))
            .collect();
        assert_eq!(pods, full);
        assert_eq!(pods[1].body.cluster(), Some("chat-abcde"));
    }
}
