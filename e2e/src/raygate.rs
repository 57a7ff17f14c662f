//! Running the raygate operator binary against a test control plane.

use crate::control_plane::ControlPlane;
use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A `raygate run` child process, killed on drop. Its metrics server binds a
/// free loopback port, read back from its log.
pub struct Raygate {
    child: Child,
    log: PathBuf,
    metrics_addr: String,
}

impl Raygate {
    /// Starts `raygate run` (found next to the test executable; build it with
    /// `cargo build -p raygate`) and waits until it serves /readyz. Unless
    /// `extra_args` say otherwise, `--kuberay-version` is the control plane's
    /// operator's, as a deployment sets it: raygate's rules depend on it.
    pub fn spawn(cp: &ControlPlane, extra_args: &[&str]) -> Result<Raygate> {
        let version = cp
            .kuberay_version()
            .filter(|_| {
                !extra_args
                    .iter()
                    .any(|a| a.starts_with("--kuberay-version"))
            })
            .map(|v| format!("--kuberay-version={v}"));
        let bin = crate::workspace_bin("raygate").context(
            "raygate binary not found next to the test executable: run `cargo build -p raygate` first",
        )?;
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = cp.log_dir();
        std::fs::create_dir_all(&dir)?;
        let log = dir.join(format!("raygate-{n}.log"));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(&bin)
            .arg("run")
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .args(["--metrics-addr", "127.0.0.1:0", "--log-format", "text"])
            .args(version.iter())
            .args(extra_args)
            .env(
                "RUST_LOG",
                std::env::var("RAYGATE_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let mut rg = Raygate {
            child,
            log,
            metrics_addr: String::new(),
        };
        let start = Instant::now();
        loop {
            if let Some(addr) = rg.logs().lines().find_map(|l| {
                l.contains("serving /metrics")
                    .then(|| l.split("addr=").nth(1))
                    .flatten()
                    .map(|a| {
                        a.trim()
                            .trim_start_matches("Some(")
                            .trim_end_matches(')')
                            .to_string()
                    })
            }) {
                rg.metrics_addr = addr;
                break;
            }
            if !rg.is_running() || start.elapsed() > Duration::from_secs(30) {
                bail!("raygate did not start; log:\n{}", rg.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        while rg.get("/readyz").ok().map(|(code, _)| code) != Some(200) {
            if !rg.is_running() || start.elapsed() > Duration::from_secs(60) {
                bail!("raygate never became ready; log:\n{}", rg.logs());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(rg)
    }

    /// Where /metrics, /healthz and /readyz are served (`127.0.0.1:PORT`).
    pub fn metrics_addr(&self) -> &str {
        &self.metrics_addr
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The operating-system process id (for /proc and signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a crash or an OOM kill would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A plain HTTP/1.1 GET against the metrics server: (status, body).
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        let mut s = TcpStream::connect(&self.metrics_addr)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: raygate\r\nConnection: close\r\n\r\n"
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        let code = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .context("no HTTP status")?;
        let body = out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((code, body))
    }

    pub fn metrics(&self) -> Result<String> {
        match self.get("/metrics")? {
            (200, body) => Ok(body),
            (code, body) => bail!("/metrics answered {code}: {body}"),
        }
    }
}

impl Drop for Raygate {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let logs = self.logs();
            let lines: Vec<&str> = logs.lines().collect();
            eprintln!(
                "raygate-e2e: raygate log {} (last 60 lines):\n{}",
                self.log.display(),
                lines[lines.len().saturating_sub(60)..].join("\n")
            );
        }
    }
}
