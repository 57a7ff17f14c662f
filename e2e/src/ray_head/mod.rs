//! `ray-head`: the stand-in for Ray itself at its HTTP interface (see e2e/README.md,
//! "Ray stand-in"). The real KubeRay operator runs with `HTTP_PROXY` pointing here; every
//! request it makes to a Ray head's dashboard or Serve proxy arrives as an absolute-form proxy
//! request and is answered as that head would, from per-cluster Serve state. Nothing is dialed.

pub mod control;
pub mod dispatch;
pub mod duration;
pub mod http;
pub mod route;
pub mod schema;
pub mod serve;
pub mod world;

use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Options {
    pub listen: SocketAddr,
    pub addr_file: PathBuf,
    pub deploy_delay: Duration,
    pub cluster_domain: String,
}

/// Serves until `shutdown` resolves. Writes the bound address to `addr_file` once the
/// Service and Pod watches have listed (so the first proxied request can be routed).
pub async fn run(
    client: kube::Client,
    opts: Options,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    if !opts.listen.ip().is_loopback() {
        bail!(
            "--listen {}: ray-head binds loopback addresses only (e.g. 127.0.0.1:0)",
            opts.listen
        );
    }
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("bind {}", opts.listen))?;
    let addr = listener.local_addr().context("local address")?;
    let (world, tasks) = world::World::start(&client);
    tracing::info!(%addr, "listening; waiting for the Service and Pod watches to list");
    world
        .wait_core_ready()
        .await
        .context("initial list of Services and Pods")?;
    write_addr_file(&opts.addr_file, &addr.to_string())?;
    tracing::info!(
        %addr,
        addr_file = %opts.addr_file.display(),
        deploy_delay_ms = opts.deploy_delay.as_millis() as u64,
        cluster_domain = %opts.cluster_domain,
        "ready"
    );
    let shared = Arc::new(http::Shared {
        world,
        registry: Mutex::new(dispatch::Registry::default()),
        deploy_delay: opts.deploy_delay,
        cluster_domain: opts.cluster_domain,
    });
    http::serve(listener, shared, shutdown).await;
    for t in tasks {
        t.abort();
    }
    tracing::info!("stopped");
    Ok(())
}

/// Written via a temporary file and a rename, so a reader never sees a partial address.
fn write_addr_file(path: &std::path::Path, addr: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, addr).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))?;
    Ok(())
}
