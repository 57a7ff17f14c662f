//! Running the raygate operator binary against a test control plane.

use crate::control_plane::ControlPlane;
use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A `raygate run` child process, killed on drop. Its metrics and probe servers bind
/// free loopback ports, read back from its log. Unless the arguments say otherwise,
/// /metrics is served without authentication over plain HTTP (`--metrics-secure=false`);
/// with `--metrics-secure=true` it is HTTPS, and [`Raygate::get_with`] uses curl.
pub struct Raygate {
    child: Child,
    log: PathBuf,
    metrics_addr: String,
    health_addr: String,
    metrics_https: bool,
}

/// The address at the end of the first log line containing `what`.
fn logged_addr(logs: &str, what: &str) -> Option<String> {
    logs.lines().find(|l| l.contains(what)).and_then(|l| {
        let rest = l.rsplit("addr=").next()?;
        let token = rest.split_whitespace().next()?;
        Some(
            token
                .trim_start_matches("Some(")
                .trim_end_matches(')')
                .trim_matches('"')
                .to_string(),
        )
    })
}

impl Raygate {
    /// Starts `raygate run` (found next to the test executable; build it with
    /// `cargo build -p raygate`) and waits until it serves /readyz. As the chart
    /// starts it: no `--kuberay-version` (raygate reads the release from the
    /// RayClusters the operator stamps), the chart's `--max-priority=0` and `--kueue=false` unless the
    /// test gives its own ceiling, and nothing from the test's environment but
    /// `RUST_LOG` and `opts.env`.
    pub fn spawn(cp: &ControlPlane, extra_args: &[&str]) -> Result<Raygate> {
        Raygate::spawn_with(cp, &Spawn::args(extra_args))
    }

    /// `spawn` with another kubeconfig (an identity of its own, a proxy) and environment
    /// (e.g. `POD_NAME`, its Lease identity). Returns once it serves /readyz (a standby
    /// replica is ready too).
    pub fn spawn_with(cp: &ControlPlane, opts: &Spawn<'_>) -> Result<Raygate> {
        let extra_args = opts.args;
        let given = |flag: &str| extra_args.iter().any(|a| a.starts_with(flag));
        let mut defaults: Vec<&str> = vec![];
        if !given("--metrics-secure") {
            defaults.push("--metrics-secure=false");
        }
        if !given("--health-addr") {
            defaults.extend(["--health-addr", "127.0.0.1:0"]);
        }
        // The chart's default (values.yaml `maxPriority: ["0"]`): tenants' priorities are
        // capped unless a test sets its own ceiling, as a platform team would.
        if !given("--max-priority") && opts.binary.is_none() {
            defaults.push("--max-priority=0");
        }
        // The chart renders `--kueue={{ kueue.reservations.enabled }}`, false by default: a
        // test that wants Kueue support (or the auto probe) says so.
        if !given("--kueue") && opts.binary.is_none() {
            defaults.push("--kueue=false");
        }
        let bin = match opts.binary {
            Some(b) => b.to_path_buf(),
            None => crate::workspace_bin("raygate").context(
                "raygate binary not found next to the test executable: run `cargo build -p raygate` first",
            )?,
        };
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = cp.log_dir();
        std::fs::create_dir_all(&dir)?;
        let log = dir.join(format!("raygate-{n}.log"));
        let file = std::fs::File::create(&log)?;
        let mut cmd = match opts.wrapper.split_first() {
            Some((w, wargs)) => {
                let mut c = Command::new(w);
                c.args(wargs).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        // The harness's own settings (RAYGATE_KUBERAY_VERSION chooses the operator it
        // runs, RAYGATE_E2E_DIR, ...) share raygate's RAYGATE_ prefix: none may reach
        // raygate, which a deployment never gives them.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("RAYGATE_") {
                cmd.env_remove(key);
            }
        }
        let child = cmd
            .arg("run")
            .arg("--kubeconfig")
            .arg(opts.kubeconfig.unwrap_or(cp.kubeconfig_path()))
            .args(["--metrics-addr", "127.0.0.1:0", "--log-format", "text"])
            .args(&defaults)
            .args(extra_args)
            .env(
                "RUST_LOG",
                std::env::var("RAYGATE_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(opts.env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let mut rg = Raygate {
            child,
            log,
            metrics_addr: String::new(),
            health_addr: String::new(),
            metrics_https: false,
        };
        let start = Instant::now();
        loop {
            let logs = rg.logs();
            if let (Some(m), Some(h)) = (
                logged_addr(&logs, "serving /metrics"),
                logged_addr(&logs, "serving /healthz"),
            ) {
                rg.metrics_addr = m;
                rg.health_addr = h;
                rg.metrics_https = logs
                    .lines()
                    .find(|l| l.contains("serving /metrics"))
                    .is_some_and(|l| l.contains("scheme=https"));
                break;
            }
            if !rg.is_running() || start.elapsed() > Duration::from_secs(30) {
                bail!("raygate did not start; log:\n{}", rg.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if !opts.unready {
            rg.wait_ready(Duration::from_secs(60).saturating_sub(start.elapsed()))?;
        }
        Ok(rg)
    }

    /// Waits up to `within` for `/readyz` to answer 200 (every cache synced).
    pub fn wait_ready(&mut self, within: Duration) -> Result<()> {
        let start = Instant::now();
        while self.get("/readyz").ok().map(|(code, _)| code) != Some(200) {
            if !self.is_running() || start.elapsed() > within {
                bail!("raygate never became ready; log:\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// Where /metrics is served (`127.0.0.1:PORT`).
    pub fn metrics_addr(&self) -> &str {
        &self.metrics_addr
    }

    /// Where /healthz and /readyz are served (`127.0.0.1:PORT`).
    pub fn health_addr(&self) -> &str {
        &self.health_addr
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

    /// Sends `signal` (`STOP`, `CONT`, `TERM`, ...) with kill(1).
    pub fn signal(&self, signal: &str) -> Result<()> {
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()?
            .success();
        if !ok {
            bail!("kill -{signal} {} failed", self.child.id());
        }
        Ok(())
    }

    /// Waits up to `timeout` for the process to exit; its status, or None if still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if start.elapsed() >= timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, as a crash or an OOM kill would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether /metrics is HTTPS (raygate said so in its log).
    pub fn metrics_https(&self) -> bool {
        self.metrics_https
    }

    /// A GET: /healthz and /readyz to the probe server (plain HTTP), anything else to
    /// the metrics server (HTTPS without verifying the certificate when it is HTTPS, as
    /// a scraper with `insecureSkipVerify` does): (status, body).
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        self.get_with(path, None)
    }

    /// `get` with `Authorization: Bearer <token>`.
    pub fn get_with(&self, path: &str, token: Option<&str>) -> Result<(u16, String)> {
        if path.starts_with("/healthz") || path.starts_with("/readyz") {
            http_get(&self.health_addr, path, token)
        } else if self.metrics_https {
            self.get_https(path, token, None)
        } else {
            http_get(&self.metrics_addr, path, token)
        }
    }

    /// A plain-HTTP GET to the metrics server, whatever it serves.
    pub fn get_plain(&self, path: &str, token: Option<&str>) -> Result<(u16, String)> {
        http_get(&self.metrics_addr, path, token)
    }

    /// An HTTPS GET to the metrics server with curl: `ca` None skips verification,
    /// Some(file) verifies the server's certificate against that CA (for the name
    /// `localhost`, resolved to the metrics address).
    pub fn get_https(
        &self,
        path: &str,
        token: Option<&str>,
        ca: Option<&Path>,
    ) -> Result<(u16, String)> {
        let port = self
            .metrics_addr
            .rsplit(':')
            .next()
            .context("metrics address without a port")?;
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"]);
        match ca {
            None => {
                cmd.arg("-k");
            }
            Some(ca) => {
                cmd.arg("--cacert").arg(ca);
            }
        }
        if let Some(t) = token {
            cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        cmd.args([
            "--resolve",
            &format!("localhost:{port}:127.0.0.1"),
            &format!("https://localhost:{port}{path}"),
        ]);
        let out = cmd.output().context("run curl")?;
        if !out.status.success() {
            bail!(
                "curl https://localhost:{port}{path} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').context("no status from curl")?;
        Ok((code.trim().parse().context("HTTP status")?, body.to_owned()))
    }

    pub fn metrics(&self) -> Result<String> {
        match self.get("/metrics")? {
            (200, body) => Ok(body),
            (code, body) => bail!("/metrics answered {code}: {body}"),
        }
    }
}

/// A plain HTTP/1.1 GET: (status, body); an error when the answer is not HTTP.
fn http_get(addr: &str, path: &str, token: Option<&str>) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: raygate\r\n{auth}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let out = String::from_utf8_lossy(&raw);
    if !out.starts_with("HTTP/") {
        bail!("not an HTTP answer from {addr}: {} bytes", raw.len());
    }
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

/// How [`Raygate::spawn_with`] starts raygate.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spawn<'a> {
    /// Instead of the control plane's admin kubeconfig.
    pub kubeconfig: Option<&'a Path>,
    /// Extra environment variables.
    pub env: &'a [(&'a str, &'a str)],
    /// Extra `raygate run` arguments.
    pub args: &'a [&'a str],
    /// An older raygate binary to start instead of this checkout's ([`older_raygate`]): the
    /// defaults for flags added since (`--max-priority`, `--kueue`) are not given to it.
    pub binary: Option<&'a Path>,
    /// Return once raygate serves its probes, without waiting for `/readyz`: for a test that
    /// watches readiness itself (one started where its caches cannot sync yet).
    pub unready: bool,
    /// A command raygate runs under (`["heaptrack", "-o", FILE]`: the scale run's heap
    /// profile); empty: none. [`Raygate::pid`] is then the wrapper's.
    pub wrapper: &'a [&'a str],
}

impl<'a> Spawn<'a> {
    pub fn args(args: &'a [&'a str]) -> Spawn<'a> {
        Spawn {
            args,
            ..Spawn::default()
        }
    }
}

/// The older raygate `e2e/build-older-raygate` built (the commit in e2e/older-raygate.commit):
/// `$RAYGATE_OLDER_RAYGATE`, or its place in the cache.
pub fn older_raygate() -> Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("RAYGATE_OLDER_RAYGATE") {
        return Ok(p.into());
    }
    let root = crate::control_plane::repo_root();
    let commit = std::fs::read_to_string(root.join("e2e/older-raygate.commit"))
        .context("read e2e/older-raygate.commit")?;
    let cache = std::env::var_os("RAYGATE_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache/raygate"))
        })
        .context("neither RAYGATE_CACHE nor HOME is set")?;
    let bin = cache.join(format!("bin/raygate-{}/raygate", commit.trim()));
    anyhow::ensure!(
        bin.is_file(),
        "{} not built: run e2e/build-older-raygate (e2e/run-tests does)",
        bin.display()
    );
    Ok(bin)
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
