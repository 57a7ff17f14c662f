//! The `raygate` binary: the operator (`run`) and the offline commands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};
use tracing::{error, info};

use raygate::controller::lists::{self, InitialLists, InitialListsArg};
use raygate::controller::release::Scope;
use raygate::controller::{self, Settings};
use raygate::kubectl::{self, bounded_client, say};
use raygate::kuberay::KubeRayVersion;
use raygate::leader::{self, Fence, LeaderConfig};
use raygate::metrics::Metrics;
use raygate::server::{self, Health};
use raygate::telemetry::{self, LogFormat};
use raygate::upgradeplan;
use raygate::{Error, Result};

/// Capacity gate for KubeRay RayService upgrades.
///
/// A change under spec.rayClusterConfig makes KubeRay build a second
/// RayCluster next to the running one; raygate admits that upgrade only when
/// both clusters fit, and reports every decision in an UpgradePlan.
#[derive(Parser, Debug)]
#[command(name = "raygate", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the operator: watch UpgradePlans and gate their RayServices.
    Run(RunArgs),
    #[command(flatten)]
    Kubectl(kubectl::Command),
    /// Print the UpgradePlan CustomResourceDefinition as YAML.
    Crd,
    /// Give every gate back and remove raygate's finalizers, before
    /// uninstalling raygate or taking namespaces out of its scope.
    Release(ReleaseArgs),
}

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("scope").required(true).args(["all", "namespace", "except_namespace"])))]
struct ReleaseArgs {
    #[command(flatten)]
    kube: KubeArgs,
    /// Every UpgradePlan in the cluster.
    #[arg(long)]
    all: bool,
    /// Only the UpgradePlans of these namespaces (repeat or comma-separate).
    #[arg(short = 'n', long, value_name = "NS", value_delimiter = ',')]
    namespace: Vec<String>,
    /// Every UpgradePlan except those of these namespaces (repeat or
    /// comma-separate): after narrowing raygate from all namespaces to these.
    #[arg(long, value_name = "NS", value_delimiter = ',')]
    except_namespace: Vec<String>,
    /// Stop the operator first: set this Deployment (NAMESPACE/NAME) to zero
    /// replicas and wait until its pods are gone, so it cannot take the
    /// gates again.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    scale_down: Option<String>,
    /// How long to wait for the operator's pods to go (with --scale-down).
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    wait_seconds: u64,
}

#[derive(Args, Debug)]
struct KubeArgs {
    /// Kubeconfig file; without it, KUBECONFIG, ~/.kube/config or the
    /// in-cluster service account are used, in that order.
    #[arg(long, env = "RAYGATE_KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long, value_name = "NAME")]
    context: Option<String>,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    kube: KubeArgs,
    /// Namespace whose UpgradePlans to watch; repeat or comma-separate for
    /// several. Default: all namespaces. Plans, RayServices, RayClusters and
    /// LimitRanges are then watched in each of these namespaces only (Roles
    /// there suffice); Pods and Nodes always cluster-wide, since free capacity
    /// is cluster-wide.
    #[arg(
        long = "namespace",
        env = "RAYGATE_NAMESPACES",
        value_delimiter = ',',
        value_name = "NS"
    )]
    namespaces: Vec<String>,
    /// Address for /metrics.
    #[arg(long, env = "RAYGATE_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Serve /metrics over HTTPS, only to bearer tokens the API server accepts
    /// (TokenReview) whose user may `get` the non-resource URL /metrics
    /// (SubjectAccessReview), as kubebuilder operators do. `false` serves plain
    /// HTTP to anyone: for local use.
    #[arg(long, env = "RAYGATE_METRICS_SECURE", default_value_t = true, action = clap::ArgAction::Set)]
    metrics_secure: bool,
    /// Directory with the /metrics certificate, `tls.crt` and `tls.key` (a mounted
    /// kubernetes.io/tls Secret, e.g. from cert-manager); re-read when they change.
    /// Without it a self-signed certificate is generated at start.
    #[arg(long, env = "RAYGATE_METRICS_CERT_DIR", value_name = "DIR")]
    metrics_cert_dir: Option<PathBuf>,
    /// Address for the kubelet probes /healthz and /readyz (never authenticated).
    #[arg(long, env = "RAYGATE_HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    health_addr: SocketAddr,
    /// Log format: json (one object per line) or text.
    #[arg(long, env = "RAYGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
    /// Elect a leader with a coordination.k8s.io Lease, so several replicas
    /// can run and only one acts.
    #[arg(long, env = "RAYGATE_LEADER_ELECT", default_value_t = false, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// DeviceClass whose devices count as plain units (repeat or comma-separate). raygate
    /// refuses to guess where it cannot follow the scheduler's DRA allocator exactly (a CEL
    /// selector it cannot evaluate, partitionable devices, consumable capacity, device
    /// taints) and holds the upgrade, saying so; for these classes every device a class
    /// matches counts as one unit instead: selectors that cannot be evaluated match, and
    /// taints, counters and capacity are ignored.
    #[arg(
        long,
        env = "RAYGATE_DRA_PLAIN_COUNT_CLASS",
        value_delimiter = ',',
        value_name = "CLASS"
    )]
    dra_plain_count_class: Vec<String>,
    /// How long raygate gathers the changes that wake an UpgradePlan (node,
    /// pod, RayService and RayCluster events) before reconciling it: a burst
    /// is one reconcile per plan, and no change waits longer than this to be
    /// acted on, however long the burst lasts. A plan's own changes (an
    /// approval, a spec edit) are not delayed. Units: ms, s.
    #[arg(
        long,
        env = "RAYGATE_BATCH_WINDOW",
        default_value = "50ms",
        value_name = "DURATION"
    )]
    batch_window: String,
    /// Namespace of the leader-election Lease (default: POD_NAMESPACE or "default").
    #[arg(long, env = "RAYGATE_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, env = "RAYGATE_LEASE_NAME", default_value = "raygate-leader")]
    lease_name: String,
    /// Seconds a leader's lease lasts without renewal before another replica takes over.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Seconds before the lease expires by which a leader must have renewed it,
    /// or it stops acting (must be less than --lease-duration-seconds).
    #[arg(long, default_value_t = 5)]
    lease_grace_seconds: u64,
    /// Ceiling on spec.priority: N for every namespace, NAMESPACE=N for one
    /// (repeat or comma-separate). Tenants cannot jump the cluster-wide
    /// queue above it. Default: no ceiling.
    #[arg(
        long,
        env = "RAYGATE_MAX_PRIORITY",
        value_delimiter = ',',
        value_name = "[NS=]N"
    )]
    max_priority: Vec<String>,
    /// KubeRay release to assume only where no RayCluster says which one runs.
    /// raygate reads the release from `ray.io/kuberay-version`, which the
    /// KubeRay operator stamps on every RayCluster it writes (the newest stamp
    /// in the RayService's namespace, else in any watched namespace), and the
    /// stamps win: a flag that disagrees is reported (condition
    /// KubeRayRelease=False, a Warning Event, raygate_kuberay_release_mismatch),
    /// never applied over them. `1.6` means the newest 1.6.x raygate knows.
    /// Default: none, i.e. the newest release raygate knows where nothing is
    /// stamped yet.
    #[arg(long, env = "RAYGATE_KUBERAY_RELEASE", value_name = "X.Y[.Z]")]
    kuberay_version: Option<KubeRayVersion>,
    /// Whether the KubeRay operator runs with its RayServiceIncrementalUpgrade
    /// feature gate on (`--feature-gates=RayServiceIncrementalUpgrade=true`),
    /// which plans with spec.upgradeType: NewClusterWithIncrementalUpgrade
    /// need. raygate cannot read the operator's flags. Default: the release's
    /// default (off in v1.5 and v1.6, on from v1.7).
    #[arg(long, env = "RAYGATE_KUBERAY_INCREMENTAL_UPGRADES", value_name = "BOOL", action = clap::ArgAction::Set)]
    kuberay_incremental_upgrades: Option<bool>,
    /// Let plans ask the node autoscaler for the capacity a held upgrade
    /// misses (spec.capacity.request: CapacityBuffer): raygate then watches and
    /// writes PodTemplates and autoscaling.x-k8s.io/v1beta1 CapacityBuffers
    /// labelled app.kubernetes.io/managed-by=raygate in the watched namespaces
    /// (the CRD of Karpenter or cluster-autoscaler, and RBAC for both, are
    /// needed; see docs/autoscaling.md). Off: such plans report that nothing
    /// was asked and hold as usual.
    #[arg(long, env = "RAYGATE_CAPACITY_REQUESTS", default_value_t = false, action = clap::ArgAction::Set)]
    capacity_requests: bool,
    /// spec.capacity.request of plans that do not set it: None, or
    /// CapacityBuffer to ask for every held upgrade's capacity (needs
    /// --capacity-requests=true).
    #[arg(long, env = "RAYGATE_CAPACITY_REQUEST_DEFAULT", value_enum, default_value_t = CapacityRequestArg::None)]
    capacity_request_default: CapacityRequestArg,
    /// spec.capacity.maxWait of plans that do not set it: how long the
    /// autoscaler may take before a plan reports CapacityNotDelivered
    /// (condition, Warning Event, raygate_capacity_request_not_delivered and
    /// the RaygateCapacityNotDelivered alert). raygate keeps holding.
    #[arg(
        long,
        env = "RAYGATE_CAPACITY_MAX_WAIT",
        default_value = "15m",
        value_name = "DURATION"
    )]
    capacity_max_wait: String,
    /// How many plans may have a capacity request open at once; the others
    /// queue in admission order (priority, then waiting time), so a GitOps
    /// sync of many RayServices does not buy every new cluster at once.
    #[arg(
        long,
        env = "RAYGATE_MAX_OPEN_CAPACITY_REQUESTS",
        default_value_t = 3,
        value_name = "N"
    )]
    max_open_capacity_requests: usize,
    /// Kueue v0.19 quota for RayServices labelled kueue.x-k8s.io/queue-name
    /// (docs/kueue.md): their upgrades must fit the ClusterQueue's quota left
    /// (cohort borrowing included) as well as the nodes, and raygate reserves
    /// the new cluster's quota with its own Workload (owned by the plan,
    /// deleted when the transition ends) before opening the gate. raygate
    /// then watches ClusterQueues, LocalQueues and its own Workloads.
    /// auto: on iff, at start-up, the API server serves kueue.x-k8s.io/v1beta2
    /// workloads, clusterqueues and localqueues and raygate may list, watch
    /// and write what it needs (SelfSubjectAccessReviews); otherwise off, with
    /// one log line saying why (restart raygate after installing Kueue).
    /// true: required; if Kueue or the access is missing, an error is logged,
    /// Kueue-managed RayServices wait with "quota unknown" and /readyz fails
    /// until the Kueue caches sync. false: off. Off, Kueue-managed RayServices
    /// are still detected and a change Kueue would suspend is held
    /// (KueueWouldSuspend). Chart: kueue.reservations.enabled.
    #[arg(
        long,
        env = "RAYGATE_KUEUE",
        default_value = "auto",
        value_name = "auto|true|false",
        value_parser = clap::builder::ValueParser::new(parse_kueue_mode)
    )]
    kueue: raygate::kueue::probe::Mode,
    /// spec.batching.quietPeriod of plans that do not set spec.batching: a
    /// change that needs a new cluster is held (phase Batching) until the
    /// RayService's cluster spec has been unchanged this long, so several
    /// commits make one new cluster. Empty or 0s: plans without
    /// spec.batching are not batched.
    #[arg(
        long,
        env = "RAYGATE_DEFAULT_BATCHING_QUIET_PERIOD",
        default_value = "",
        value_name = "DURATION"
    )]
    default_batching_quiet_period: String,
    /// spec.batching.maxDelay of plans that do not set it (and of the
    /// default above): the longest a batch is held after its first change.
    #[arg(
        long,
        env = "RAYGATE_DEFAULT_BATCHING_MAX_DELAY",
        default_value = "6h",
        value_name = "DURATION"
    )]
    default_batching_max_delay: String,
    /// How the caches fetch their initial state at start-up and after a
    /// watch expires. auto: one streaming list per kind (Kubernetes WatchList:
    /// a single watch with sendInitialEvents=true, served from the
    /// apiserver's watch cache; beta and on by default since v1.32) where the
    /// apiserver serves it, asked once at start-up (bounded to 5 s), else
    /// paginated lists of 500 objects. streaming: always (the caches never
    /// sync on an apiserver without WatchList). paginated: always lists.
    /// Readiness means every cache synced in each mode.
    #[arg(
        long,
        env = "RAYGATE_INITIAL_LISTS",
        value_enum,
        default_value_t = InitialListsArg::Auto
    )]
    initial_lists: InitialListsArg,
}

/// `--kueue`: auto, true or false.
fn parse_kueue_mode(s: &str) -> std::result::Result<raygate::kueue::probe::Mode, String> {
    s.parse()
}

/// `--capacity-request-default`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum CapacityRequestArg {
    #[value(name = "None")]
    None,
    #[value(name = "CapacityBuffer")]
    CapacityBuffer,
}

#[tokio::main]
async fn main() -> ExitCode {
    // The release ships this binary as the kubectl plugin too (one static
    // binary, not two): started as `kubectl-raygate`, it is the plugin.
    if std::env::args_os()
        .next()
        .is_some_and(|a| kubectl::plugin::invoked_as_plugin(&a))
    {
        return kubectl::plugin::main().await;
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Kubectl(c) => {
            use clap::CommandFactory;
            kubectl::run(c, Cli::command(), "raygate").await
        }
        Command::Crd => match upgradeplan::crd_yaml() {
            Ok(text) => kubectl::emit(&text, ExitCode::SUCCESS),
            Err(e) => fail(&e),
        },
        Command::Release(args) => match release(&args).await {
            Ok(text) => kubectl::emit(&text, ExitCode::SUCCESS),
            // Name the cluster that could not be reached, as kubectl raygate does.
            Err(Error::Kube(k)) if !matches!(k, kube::Error::Api(_)) => {
                let server = config(&args.kube)
                    .await
                    .map(|c| c.cluster_url.to_string())
                    .ok();
                say(&format!(
                    "raygate: {}",
                    kubectl::unreachable(&k, server.as_deref())
                ));
                ExitCode::from(1)
            }
            Err(e) => fail(&e),
        },
        Command::Run(args) => match run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error!(error = %e, "raygate stopped");
                say(&format!("raygate: {e}"));
                ExitCode::FAILURE
            }
        },
    }
}

/// Invalid input exits 1 with the message; clap's own usage errors exit 2.
fn fail(e: &Error) -> ExitCode {
    say(&format!("raygate: {e}"));
    ExitCode::from(1)
}

async fn config(args: &KubeArgs) -> Result<kube::Config> {
    kubectl::kube_config(args.kubeconfig.as_deref(), args.context.as_deref()).await
}

/// `--batch-window`, at most [`MAX_BATCH_WINDOW`]: longer only delays every
/// admission.
fn batch_window(s: &str) -> Result<Duration> {
    let d = raygate::schedule::parse_duration("--batch-window", s)?;
    if d > MAX_BATCH_WINDOW {
        return Err(Error::invalid(
            "--batch-window",
            format!(
                "{s} is longer than {MAX_BATCH_WINDOW:?}: every admission would wait that long"
            ),
        ));
    }
    Ok(d)
}

const MAX_BATCH_WINDOW: Duration = Duration::from_secs(5);

/// A client whose every call is bounded by `timeout`.
/// `--kueue`: probe the API server unless it is `false`, log the one line
/// that says what was decided and why, and mark `/readyz` when `true` lacks
/// what it needs ([`raygate::kueue::probe::decide`]).
async fn kueue_support(config: &kube::Config, args: &RunArgs, health: &Health) -> Result<bool> {
    use raygate::kueue::probe::{self, Level, Mode};
    let found = match args.kueue {
        Mode::Off => None,
        Mode::Auto | Mode::On => {
            let client = bounded_client(config.clone(), Duration::from_secs(5))?;
            controller::kueue_probe::run(&client, &args.namespaces).await
        }
    };
    let outcome = probe::decide(args.kueue, found.as_ref());
    let mode = args.kueue.to_string();
    match outcome.level {
        Level::Info => info!(kueue = %mode, enabled = outcome.enabled, "{}", outcome.message),
        Level::Warn => {
            tracing::warn!(kueue = %mode, enabled = outcome.enabled, "{}", outcome.message)
        }
        Level::Error => error!(kueue = %mode, enabled = outcome.enabled, "{}", outcome.message),
    }
    health.set_kueue_missing(outcome.not_ready.is_some());
    Ok(outcome.enabled)
}

async fn release(args: &ReleaseArgs) -> Result<String> {
    let scope = Scope::new(&args.namespace, &args.except_namespace)?;
    let client = bounded_client(config(&args.kube).await?, Duration::from_secs(30))?;
    if let Some(target) = &args.scale_down {
        let (ns, name) = target
            .split_once('/')
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
            .ok_or_else(|| {
                Error::invalid("--scale-down", format!("{target:?} is not NAMESPACE/NAME"))
            })?;
        controller::release::scale_down(&client, ns, name, Duration::from_secs(args.wait_seconds))
            .await?;
    }
    let done = controller::release::release(&client, &scope).await?;
    let mut out = String::new();
    for g in &done.gates {
        out.push_str(&format!("gate given back: RayService {g}\n"));
    }
    for f in &done.finalizers {
        out.push_str(&format!("finalizer removed: UpgradePlan {f}\n"));
    }
    for b in &done.capacity_requests {
        out.push_str(&format!("capacity request deleted: CapacityBuffer {b}\n"));
    }
    for w in &done.quota_reservations {
        out.push_str(&format!("quota reservation deleted: Workload {w}\n"));
    }
    out.push_str(&format!(
        "released {} gates, removed {} finalizers\n",
        done.gates.len(),
        done.finalizers.len()
    ));
    Ok(out)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn run(args: RunArgs) -> Result<()> {
    telemetry::init(args.log_format)?;
    // The gate is spec.upgradeStrategy.type, which KubeRay reads from v1.3 on.
    if let Some(v) = args.kuberay_version
        && !v.rules().upgrade_strategy_field
    {
        return Err(Error::invalid(
            "--kuberay-version",
            format!(
                "KubeRay {v} has no spec.upgradeStrategy; raygate can gate KubeRay v1.3 and newer \
                 (raygate explain and fit still work for older releases)"
            ),
        ));
    }
    // Carried in the controller's settings into every plan's (no process-wide state).
    let operator = raygate::admission::settings::Operator::parse(
        &args.max_priority,
        &args.default_batching_quiet_period,
        &args.default_batching_max_delay,
    )?;
    let config = config(&args.kube).await?;
    let metrics = Arc::new(Metrics::new()?);
    let health = Arc::new(Health::starting(args.leader_elect));

    let (listener, addr) = server::bind(args.metrics_addr).await?;
    let (health_listener, health_addr) = server::bind(args.health_addr).await?;
    let (auth, tls) = if args.metrics_secure {
        // A scrape waits for at most two short reviews.
        let client = bounded_client(config.clone(), Duration::from_secs(5))?;
        let certs = Arc::new(server::tls::Certificates::new(
            args.metrics_cert_dir.as_deref(),
        )?);
        if certs.is_self_signed() {
            info!(
                "no --metrics-cert-dir: generated a self-signed certificate for /metrics \
                 (scrapers must skip verification, or mount a certificate)"
            );
        }
        certs.spawn_reloader();
        (
            Some(Arc::new(server::MetricsAuth::new(client))),
            Some(certs.server_config()?),
        )
    } else {
        if let Some(dir) = &args.metrics_cert_dir {
            return Err(Error::invalid(
                "--metrics-cert-dir",
                format!(
                    "{} is given but --metrics-secure=false serves plain HTTP",
                    dir.display()
                ),
            ));
        }
        tracing::warn!(
            "--metrics-secure=false: /metrics is served over plain HTTP to anyone who can connect"
        );
        (None, None)
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    // `addr` last: the e2e harness reads it from the end of these lines.
    info!(secure = args.metrics_secure, %scheme, %addr, "serving /metrics");
    info!(addr = %health_addr, "serving /healthz, /readyz");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let http = tokio::spawn(server::serve_metrics(
        listener,
        metrics.clone(),
        auth,
        tls,
        stopped(stop_rx.clone()),
    ));
    // /readyz asks the API server when it has not answered lately (a probe at most
    // every few seconds, bounded: a probe must answer before the kubelet's timeout).
    let probe_client = bounded_client(config.clone(), server::PROBE_TIMEOUT)?;
    let probes = tokio::spawn(server::serve_health(
        health_listener,
        health.clone(),
        Some(probe_client),
        stopped(stop_rx.clone()),
    ));

    let mut settings = Settings {
        namespaces: args.namespaces.clone(),
        kuberay_version: args.kuberay_version,
        incremental_gate: args.kuberay_incremental_upgrades,
        instance: leader::default_identity(),
        operator,
        capacity: raygate::autoscale::Defaults {
            enabled: args.capacity_requests,
            mode: match args.capacity_request_default {
                CapacityRequestArg::None => upgradeplan::CapacityRequestMode::None,
                CapacityRequestArg::CapacityBuffer => {
                    upgradeplan::CapacityRequestMode::CapacityBuffer
                }
            },
            max_wait: raygate::schedule::parse_duration(
                "--capacity-max-wait",
                &args.capacity_max_wait,
            )?,
            max_open: args.max_open_capacity_requests,
        },
        dra_plain_count: args.dra_plain_count_class.clone(),
        batch_window: batch_window(&args.batch_window)?,
        kueue: kueue_support(&config, &args, &health).await?,
        initial_lists: InitialLists::default(),
    };
    let lease_namespace = args
        .lease_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| "default".into());
    let leader_cfg = LeaderConfig {
        enabled: args.leader_elect,
        namespace: lease_namespace,
        lease_name: args.lease_name.clone(),
        identity: settings.instance.clone(),
        lease_duration: Duration::from_secs(args.lease_duration_seconds),
        grace: Duration::from_secs(args.lease_grace_seconds),
    };
    // Watches run for minutes; every other call is bounded by the fence.
    let fence = Arc::new(Fence::for_config(&leader_cfg));
    let watch = kube::Client::try_from(config.clone())?;
    let probed = match args.initial_lists {
        InitialListsArg::Auto => Some(lists::probe(&watch, Duration::from_secs(5)).await),
        _ => None,
    };
    let (initial_lists, why) = lists::resolve(args.initial_lists, probed.as_ref());
    info!(initial_lists = initial_lists.as_str(), reason = %why, "initial lists");
    settings.initial_lists = initial_lists;
    let writes = bounded_client(config, fence.api_timeout())?;
    let work = {
        let (writes, metrics, health) = (writes.clone(), metrics.clone(), health.clone());
        let (rx, fence) = (stop_rx.clone(), fence.clone());
        move || controller::run(watch, writes, settings, metrics, health, fence, stopped(rx))
    };
    let signal = tokio::spawn({
        let tx = stop_tx.clone();
        async move {
            shutdown_signal().await;
            info!("shutting down");
            let _ = tx.send(true);
        }
    });
    let result = leader::run_as_leader(writes, leader_cfg, health, fence, work).await;
    let _ = stop_tx.send(true);
    signal.abort();
    let _ = http.await;
    let _ = probes.await;
    result
}
