//! Running kuberay-sim for tests: as a child process (the real binary) or in-process.

use crate::control_plane::ControlPlane;
use crate::sim::{self, SimOptions};
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How to start the simulator.
#[derive(Debug, Clone, Default)]
pub struct KubeRaySimOptions {
    /// Only this namespace (None: all).
    pub namespace: Option<String>,
    /// Overrides every RayService's deletion delay.
    pub deletion_delay_override: Option<Duration>,
    /// The binary; default: `kuberay-sim` next to the test executable.
    /// In this crate's integration tests pass `env!("CARGO_BIN_EXE_kuberay-sim")`.
    pub binary: Option<PathBuf>,
    /// Extra CLI arguments.
    pub extra_args: Vec<String>,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A kuberay-sim child process, killed on drop.
pub struct KubeRaySim {
    child: Child,
    log: PathBuf,
}

impl KubeRaySim {
    /// Spawns the binary against `cp`, logging to `ControlPlane::log_dir()`.
    pub fn spawn(cp: &ControlPlane, opts: KubeRaySimOptions) -> Result<KubeRaySim> {
        let bin = match opts.binary {
            Some(b) => b,
            None => crate::workspace_bin("kuberay-sim")
                .context("kuberay-sim binary not found next to the test executable; build it or pass KubeRaySimOptions::binary")?,
        };
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = cp.log_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let log = dir.join(format!("kuberay-sim-{n}.log"));
        let file =
            std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = Command::new(&bin);
        cmd.arg("--kubeconfig").arg(cp.kubeconfig_path());
        if let Some(ns) = &opts.namespace {
            cmd.arg("--namespace").arg(ns);
        }
        if let Some(d) = opts.deletion_delay_override {
            cmd.arg("--deletion-delay-override-seconds")
                .arg(d.as_secs().to_string());
        }
        cmd.args(&opts.extra_args)
            .env(
                "RUST_LOG",
                std::env::var("KUBERAY_SIM_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        Ok(KubeRaySim { child, log })
    }

    /// Path of the log file.
    pub fn log_path(&self) -> &std::path::Path {
        &self.log
    }

    /// The log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for KubeRaySim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let logs = self.logs();
            let lines: Vec<&str> = logs.lines().collect();
            eprintln!(
                "raygate-e2e: kuberay-sim log {} (last 40 lines):\n{}",
                self.log.display(),
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
    }
}

/// The simulator as a task on the current tokio runtime; aborted on drop.
pub struct InProcessSim(tokio::task::JoinHandle<Result<()>>);

impl InProcessSim {
    pub fn start(client: kube::Client, opts: SimOptions) -> InProcessSim {
        InProcessSim(tokio::spawn(sim::run(client, opts)))
    }
}

impl Drop for InProcessSim {
    fn drop(&mut self) {
        self.0.abort();
    }
}
