//! ray-head: answers the KubeRay operator's HTTP calls to Ray heads (dashboard Serve API and
//! Serve proxy health), as an HTTP forward proxy. See e2e/README.md, "Ray stand-in".

use anyhow::{Context, Result};
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use raygate_e2e::ray_head::{Options, duration::parse_duration, run};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    about = "Stand-in for Ray's HTTP interface, for the real KubeRay operator",
    long_about = "Stand-in for Ray's HTTP interface, for the real KubeRay operator.\n\n\
        Run the operator with HTTP_PROXY=http://<the address written to --addr-file>. \
        Requests to http://<head-svc>.<ns>.svc.<domain>:8265/api/serve/applications/ and \
        http://<head-pod-ip>:8000/-/healthz are answered as that RayCluster's Ray head would; \
        nothing is ever dialed. Tests control it through annotations \
        (ray-head.e2e.raygate.dev/app-status, /app-message, /proxy-healthy) on a RayCluster or \
        its RayService, and observe it with GET /_e2e/clusters at the listen address."
)]
struct Args {
    /// Kubeconfig of the apiserver to watch (Services, head Pods, RayClusters, RayServices).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Address to listen on; loopback only. Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// File to write the bound `127.0.0.1:PORT` to once ready (written atomically).
    #[arg(long)]
    addr_file: PathBuf,
    /// How long a newly submitted or changed Serve application stays DEPLOYING before RUNNING
    /// (e.g. 0s, 500ms, 1s, 2m).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    deploy_delay: Duration,
    /// Cluster DNS domain in head Service names (the operator's CLUSTER_DOMAIN).
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
}

async fn client(path: &PathBuf) -> Result<Client> {
    let kc = Kubeconfig::read_from(path).with_context(|| format!("read {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT; exiting"),
        () = term => tracing::info!("SIGTERM; exiting"),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let client = client(&args.kubeconfig).await?;
    let opts = Options {
        listen: args.listen,
        addr_file: args.addr_file,
        deploy_delay: args.deploy_delay,
        cluster_domain: args.cluster_domain,
    };
    run(client, opts, shutdown_signal()).await
}
