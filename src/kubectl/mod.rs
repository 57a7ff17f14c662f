//! `kubectl raygate`: the commands a platform engineer runs against a live
//! cluster. The same commands are `raygate approve|pause|resume|queue|...`.
//!
//! Nothing here decides anything: approval is the merge patch of
//! `spec.approve` that docs/upgradeplan.md describes, the queue is the plans
//! [`crate::upgradeplan::UpgradePlanStatus::queued_for_capacity`] in
//! [`crate::admission::ledger::order`] (the controller's), and `explain` /
//! `fit` are the offline commands of [`crate::cli`] fed with live objects,
//! with the plan's spec read by [`crate::admission::Settings`] and its holds
//! by [`crate::admission::holds`].
//!
//! Exit codes: 0 done; 1 invalid input, or the object does not allow it
//! (not found, nothing to approve, another fingerprint pending); 2 usage;
//! 3 no fit (or held by the UpgradePlan) with `--fail-if-no-fit`; 4 the
//! cluster could not be reached or refused the request (including a
//! concurrent change of the plan).
//!
//! Here: the commands, connecting, dispatch and what they share; in
//! `approve.rs` `approve`, `pause` and `resume` (the writes of `spec.approve`
//! and `spec.policy`); in `queue.rs` the admission queue as the controller
//! orders it; in `fit.rs` live `explain` and `fit`, and reading the live
//! cluster state.

mod approve;
mod fit;
pub mod plugin;
mod queue;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::cli::{ExplainArgs, FitArgs};
use crate::upgradeplan::UpgradePlan;
use crate::{Error, Result};

use approve::{approve, pause, resume};
pub use fit::OperatorFlags;
use fit::{explain, fit};
use queue::queue;

pub use queue::{QueueEntry, queue_entries, render_queue};

/// The field manager of this command's writes, so `managedFields` shows who approved.
pub const FIELD_MANAGER: &str = "kubectl-raygate";
/// Where `pause` keeps the policy that `resume` restores.
pub const PAUSED_POLICY_ANNOTATION: &str = "raygate.io/paused-policy";

/// Exit code when the cluster could not be reached or refused the request.
const EXIT_API: u8 = 4;
/// Exit code of `fit --fail-if-no-fit` when the new cluster does not fit or
/// its UpgradePlan holds the change.
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
    /// without it, against the live nodes and pods, and with the holds its
    /// UpgradePlan puts on the change whatever the capacity (policy Paused,
    /// policy Manual without approval of this change, no maintenance window
    /// open now: `Held:` lines, `holds` in JSON). Exit 0 whether or not it
    /// fits or is held, unless --fail-if-no-fit.
    Fit {
        #[command(flatten)]
        args: FitArgs,
        #[command(flatten)]
        operator: OperatorFlags,
        /// Exit 3 when the new cluster does not fit, or (live) when its
        /// UpgradePlan holds the change: either way the upgrade would not
        /// proceed now (for CI gates).
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
        fingerprint: Option<crate::upgradeplan::Fingerprint>,
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
    /// The upgrades raygate is running, those waiting for capacity in the
    /// order it will consider them (priority, then waiting time), then the
    /// changes held otherwise (approval, pause, maintenance window, error),
    /// which have no place in the queue yet (`-` in #).
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
            operator,
            fail_if_no_fit,
            kube,
        } => fit(&args, &operator, &kube).await.map(|o| {
            let code = if fail_if_no_fit && (!o.fits || o.held) {
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

/// How long one API call of the plugin may take: kube's client has no read
/// timeout of its own, and a plugin that hangs on a stalled apiserver is
/// worse than one that says so.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A client whose every call (connect, each read, each write) is bounded by
/// `timeout`: kube's client has none of its own.
pub fn bounded_client(mut config: kube::Config, timeout: std::time::Duration) -> Result<Client> {
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Ok(Client::try_from(config)?)
}

/// A client as kubectl would build it (every call bounded by
/// [`REQUEST_TIMEOUT`]), and the namespace to use.
pub async fn connect(args: &KubeArgs) -> Result<(Client, String)> {
    let config = kube_config(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let ns = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((bounded_client(config, REQUEST_TIMEOUT)?, ns))
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

/// `name value, ...` of a status map.
fn resources(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::upgradeplan::{
        CapacityStatus, PendingChange, Phase, UpgradePlanSpec, UpgradePlanStatus,
    };
    use jiff::Timestamp;

    pub(crate) fn plan(
        name: &str,
        priority: i32,
        status: Option<UpgradePlanStatus>,
    ) -> UpgradePlan {
        let spec: UpgradePlanSpec = serde_json::from_value(
            json!({"rayServiceRef": {"name": name}, "priority": priority, "policy": "Manual"}),
        )
        .unwrap();
        let mut p = UpgradePlan::new(name, spec);
        p.metadata.namespace = Some("ml".into());
        p.status = status;
        p
    }

    pub(crate) fn waiting(fp: &str, since: &str, gpus: &str) -> Option<UpgradePlanStatus> {
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

    pub(crate) fn now() -> Timestamp {
        "2026-12-02T12:00:00Z".parse().unwrap()
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
}
