//! kuberay-sim: stands in for the KubeRay v1.7.0 operator on the RayService upgrade path.
//! See e2e/SIMULATION.md for what it simulates and where it simplifies.

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use raygate_e2e::sim::{SimOptions, run};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Parser, Debug)]
#[command(about = "KubeRay v1.7.0 stand-in for raygate's e2e tests")]
struct Args {
    /// Kubeconfig file (default: KUBECONFIG, ~/.kube/config or in-cluster).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Only watch this namespace (default: all).
    #[arg(long)]
    namespace: Option<String>,
    /// Replace every RayService's spec.rayClusterDeletionDelaySeconds.
    #[arg(long)]
    deletion_delay_override_seconds: Option<u64>,
    /// Periodic requeue interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    resync_millis: u64,
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

async fn client(kubeconfig: Option<PathBuf>) -> Result<Client> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = Kubeconfig::read_from(&p).with_context(|| format!("read {}", p.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
        None => Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Plain text when logging to a file (as the test harness does).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let sub = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match args.log_format {
        LogFormat::Json => sub.json().init(),
        LogFormat::Text => sub.init(),
    }
    let client = client(args.kubeconfig).await?;
    let opts = SimOptions {
        namespace: args.namespace,
        deletion_delay_override: args
            .deletion_delay_override_seconds
            .map(Duration::from_secs),
        resync: Duration::from_millis(args.resync_millis.max(50)),
    };
    tokio::select! {
        r = run(client, opts) => r,
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("interrupted; exiting");
            Ok(())
        }
    }
}
