//! A real local control plane started through `e2e/control-plane`: etcd, kube-apiserver,
//! kube-scheduler, kube-controller-manager (Kubernetes v1.36), kwok for the nodes and pod
//! lifecycle, and (unless `KubeRay::None`) `ray-head` and the real KubeRay operator. Or an
//! existing cluster named by `RAYGATE_E2E_KUBECONFIG`.

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Reuse this cluster instead of starting one (it is never stopped by the harness).
pub const REUSE_ENV: &str = "RAYGATE_E2E_KUBECONFIG";
/// Path of the `control-plane` script, if not `<repo>/e2e/control-plane`.
pub const SCRIPT_ENV: &str = "RAYGATE_E2E_CONTROL_PLANE";
/// The ray-head binary `control-plane up` starts.
pub const RAY_HEAD_ENV: &str = "RAYGATE_RAY_HEAD_BIN";

const SETUP_HINT: &str = "run `e2e/setup` once to build the control-plane binaries (see e2e/README.md), \
or set RAYGATE_E2E_KUBECONFIG to reuse a running cluster";

/// Which KubeRay operator runs (env `RAYGATE_KUBERAY_VERSION`, default v1.6.2).
pub const KUBERAY_VERSION_ENV: &str = "RAYGATE_KUBERAY_VERSION";
/// The KubeRay versions `e2e/setup` builds.
pub const KUBERAY_VERSIONS: [&str; 2] = ["v1.6.2", "v1.5.2"];

/// The KubeRay operator of a control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeRay {
    /// The real operator built from `github.com/ray-project/kuberay/ray-operator@<version>`.
    Version(String),
    /// No operator and no ray-head (the CRDs of v1.6.2 are still installed).
    None,
}

impl KubeRay {
    /// `RAYGATE_KUBERAY_VERSION` (`v1.6.2`, `v1.5.2` or `none`), default v1.6.2.
    pub fn from_env() -> Result<KubeRay> {
        match std::env::var(KUBERAY_VERSION_ENV) {
            Ok(v) if !v.is_empty() => KubeRay::parse(&v),
            _ => Ok(KubeRay::Version(KUBERAY_VERSIONS[0].to_string())),
        }
    }

    /// `v1.6.2`, `v1.5.2` or `none`.
    pub fn parse(s: &str) -> Result<KubeRay> {
        if s == "none" {
            Ok(KubeRay::None)
        } else if KUBERAY_VERSIONS.contains(&s) {
            Ok(KubeRay::Version(s.to_string()))
        } else {
            bail!(
                "unknown KubeRay version {s:?} ({KUBERAY_VERSION_ENV}): one of {KUBERAY_VERSIONS:?} or none"
            )
        }
    }

    /// The `--kuberay` argument of `control-plane up`.
    pub fn arg(&self) -> &str {
        match self {
            KubeRay::Version(v) => v,
            KubeRay::None => "none",
        }
    }
}

/// How to start a control plane.
#[derive(Debug, Clone)]
pub struct Options {
    pub kuberay: KubeRay,
    /// Install the KubeRay CRDs (without them no operator is started).
    pub crds: bool,
}

impl Options {
    /// The operator of `RAYGATE_KUBERAY_VERSION` (default v1.6.2), with its CRDs.
    pub fn from_env() -> Result<Options> {
        Ok(Options {
            kuberay: KubeRay::from_env()?,
            crds: true,
        })
    }

    /// No KubeRay operator, no ray-head; the CRDs are installed.
    pub fn without_kuberay() -> Options {
        Options {
            kuberay: KubeRay::None,
            crds: true,
        }
    }
}

/// Handle on a control plane; stops it on drop if this handle started it.
pub struct ControlPlane {
    dir: Option<tempfile::TempDir>,
    kubeconfig: PathBuf,
    script: PathBuf,
    owned: bool,
    started: bool,
    kubectl: Option<PathBuf>,
    kuberay: KubeRay,
}

/// The repository root (parent of the `e2e` crate).
pub fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

fn script_path() -> PathBuf {
    std::env::var_os(SCRIPT_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("e2e").join("control-plane"))
}

fn tail(bytes: &[u8], lines: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

impl ControlPlane {
    /// Starts a fresh control plane with the KubeRay operator of `RAYGATE_KUBERAY_VERSION`
    /// (default v1.6.2); see `start_with`.
    pub fn start() -> Result<ControlPlane> {
        ControlPlane::start_with(Options::from_env()?)
    }

    /// Starts a fresh control plane in a new temporary directory (or reuses
    /// `RAYGATE_E2E_KUBECONFIG`). Processes are stopped when the handle drops, also when
    /// startup fails half-way or the test panics.
    pub fn start_with(opts: Options) -> Result<ControlPlane> {
        ControlPlane::start_inner(opts, &[])
    }

    /// Like `start_with`, and the apiserver writes an audit log of every write request
    /// (`up --audit-log`), read with [`ControlPlane::audit_log_path`]. Not with
    /// `RAYGATE_E2E_KUBECONFIG`: a reused cluster has no audit log here.
    pub fn start_audited(opts: Options) -> Result<ControlPlane> {
        if std::env::var_os(REUSE_ENV).is_some() {
            bail!(
                "{REUSE_ENV} is set, but this test needs the apiserver's audit log of a control plane it starts"
            );
        }
        ControlPlane::start_inner(opts, &["--audit-log"])
    }

    /// Like `start_with`, plus Karpenter with its kwok cloud provider (`up --karpenter`:
    /// the CapacityBuffer feature gate on, its CRDs installed, one 8-GPU instance type; no
    /// NodePool: the test makes its own). Not with `RAYGATE_E2E_KUBECONFIG`.
    pub fn start_with_karpenter(opts: Options) -> Result<ControlPlane> {
        if std::env::var_os(REUSE_ENV).is_some() {
            bail!("{REUSE_ENV} is set, but this test needs Karpenter in a control plane it starts");
        }
        ControlPlane::start_inner(opts, &["--karpenter"])
    }

    /// Like `start_with`, plus the real Kueue manager (`up --kueue`: its CRDs as released, its
    /// webhooks for Jobs, RayClusters, RayServices and its own kinds registered by `url:`, the
    /// frameworks batch/job, ray.io/raycluster, ray.io/rayservice). No queue exists: the test
    /// makes its ResourceFlavors, ClusterQueues and LocalQueues. `pods_ready_timeout` (e.g.
    /// `"20s"`) sets Kueue's `waitForPodsReady.timeout` (its default is on, 30 min). Not with
    /// `RAYGATE_E2E_KUBECONFIG`.
    pub fn start_with_kueue(
        opts: Options,
        pods_ready_timeout: Option<&str>,
    ) -> Result<ControlPlane> {
        if std::env::var_os(REUSE_ENV).is_some() {
            bail!("{REUSE_ENV} is set, but this test needs Kueue in a control plane it starts");
        }
        match pods_ready_timeout {
            Some(t) => {
                ControlPlane::start_inner(opts, &["--kueue", "--kueue-pods-ready-timeout", t])
            }
            None => ControlPlane::start_inner(opts, &["--kueue"]),
        }
    }

    /// Like `start_with`, with more kube-apiserver flags (`up --apiserver-arg`, kept across
    /// `restart`), e.g. a feature gate turned off. Not with `RAYGATE_E2E_KUBECONFIG`.
    pub fn start_with_apiserver_args(opts: Options, args: &[&str]) -> Result<ControlPlane> {
        if std::env::var_os(REUSE_ENV).is_some() {
            bail!("{REUSE_ENV} is set, but this test needs an apiserver started with {args:?}");
        }
        let up: Vec<String> = args
            .iter()
            .map(|a| format!("--apiserver-arg={a}"))
            .collect();
        let up: Vec<&str> = up.iter().map(String::as_str).collect();
        ControlPlane::start_inner(opts, &up)
    }

    /// Like `start_with`, with the operator's RayServiceIncrementalUpgrade feature gate on and
    /// the Gateway API CRDs it needs (`up --incremental`). Not with `RAYGATE_E2E_KUBECONFIG`.
    pub fn start_incremental(opts: Options) -> Result<ControlPlane> {
        if std::env::var_os(REUSE_ENV).is_some() {
            bail!(
                "{REUSE_ENV} is set, but this test needs an operator started with RayServiceIncrementalUpgrade"
            );
        }
        ControlPlane::start_inner(opts, &["--incremental"])
    }

    fn start_inner(opts: Options, up_args: &[&str]) -> Result<ControlPlane> {
        let script = script_path();
        let kuberay = if opts.crds {
            opts.kuberay.clone()
        } else {
            KubeRay::None
        };
        let dir = tempfile::Builder::new()
            .prefix("raygate-e2e-")
            .tempdir()
            .context("create a temporary directory for the control plane")?;
        if let Some(kc) = std::env::var_os(REUSE_ENV) {
            let kubeconfig = PathBuf::from(kc);
            if !kubeconfig.is_file() {
                bail!("{REUSE_ENV}={} is not a file", kubeconfig.display());
            }
            let mut cp = ControlPlane {
                dir: Some(dir),
                kubeconfig,
                script,
                owned: false,
                started: false,
                kubectl: None,
                kuberay,
            };
            cp.kubectl = cp.find_kubectl();
            return Ok(cp);
        }
        if !script.is_file() {
            bail!("{} not found; {SETUP_HINT}", script.display());
        }
        // A subdirectory: `down` removes the directory it was given.
        let kubeconfig = dir.path().join("cp").join("kubeconfig");
        let mut cp = ControlPlane {
            dir: Some(dir),
            kubeconfig,
            script,
            owned: true,
            started: true,
            kubectl: None,
            kuberay,
        };
        let dir_path = cp.cp_dir()?;
        let mut cmd = Command::new(&cp.script);
        cmd.arg("up")
            .arg("--dir")
            .arg(&dir_path)
            .arg("--kuberay")
            .arg(cp.kuberay.arg());
        if !opts.crds {
            cmd.arg("--no-crds");
        }
        cmd.args(up_args);
        // ray-head is a binary of this crate: cargo builds it next to the test executable.
        if std::env::var_os(RAY_HEAD_ENV).is_none()
            && let Some(b) = crate::workspace_bin("ray-head")
        {
            cmd.env(RAY_HEAD_ENV, b);
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run {} up", cp.script.display()))?;
        if !out.status.success() {
            bail!(
                "control plane failed to start ({}); {SETUP_HINT}.\nstdout (tail):\n{}\nstderr (tail):\n{}",
                out.status,
                tail(&out.stdout, 20),
                tail(&out.stderr, 40)
            );
        }
        if !cp.kubeconfig.is_file() {
            bail!(
                "{} up succeeded but wrote no {}; {SETUP_HINT}",
                cp.script.display(),
                cp.kubeconfig.display()
            );
        }
        cp.kubectl = cp.find_kubectl();
        Ok(cp)
    }

    fn cp_dir(&self) -> Result<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.path().join("cp"))
            .context("control plane directory already released")
    }

    /// `DIR/karpenter-instance-types.json` of `up --karpenter`: Karpenter's kwok provider
    /// reads it only at start, so a test rewrites it and then restarts Karpenter.
    pub fn karpenter_instance_types(&self) -> Result<PathBuf> {
        Ok(self.cp_dir()?.join("karpenter-instance-types.json"))
    }

    /// Where tests may put logs: the control plane's `logs/` (archived by `down` when a test
    /// failed) if this handle started it, else a scratch directory.
    pub fn log_dir(&self) -> PathBuf {
        match (&self.dir, self.owned) {
            (Some(d), true) => d.path().join("cp").join("logs"),
            (Some(d), false) => d.path().to_path_buf(),
            (None, _) => std::env::temp_dir(),
        }
    }

    fn find_kubectl(&self) -> Option<PathBuf> {
        let out = Command::new(&self.script).arg("bin-dir").output().ok()?;
        if !out.status.success() {
            return None;
        }
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("kubectl");
        p.is_file().then_some(p)
    }

    /// The KubeRay operator version running (`None`: no operator).
    pub fn kuberay_version(&self) -> Option<&str> {
        match &self.kuberay {
            KubeRay::Version(v) => Some(v),
            KubeRay::None => None,
        }
    }

    /// `127.0.0.1:PORT` of ray-head (the operator's HTTP proxy and the `/_e2e/` API), if it runs.
    pub fn ray_head_addr(&self) -> Option<String> {
        let dir = self.cp_dir().ok()?;
        let addr = std::fs::read_to_string(dir.join("ray-head.addr")).ok()?;
        let addr = addr.trim();
        (!addr.is_empty()).then(|| addr.to_string())
    }

    /// `GET /_e2e/clusters` of ray-head: what it saw per RayCluster (Serve config PUTs, last
    /// config, application statuses).
    pub fn ray_head_clusters(&self) -> Result<serde_json::Value> {
        let addr = self
            .ray_head_addr()
            .context("no ray-head in this control plane")?;
        let body = http_get(&addr, "/_e2e/clusters")?;
        serde_json::from_str(&body).with_context(|| format!("ray-head /_e2e/clusters: {body}"))
    }

    /// `DIR/logs/audit.log` (JSON lines) of a control plane from [`ControlPlane::start_audited`].
    pub fn audit_log_path(&self) -> Result<PathBuf> {
        Ok(self.cp_dir()?.join("logs").join("audit.log"))
    }

    /// The apiserver's port on 127.0.0.1.
    pub fn apiserver_port(&self) -> Result<u16> {
        self.port("apiserver")
    }

    /// A component's port on 127.0.0.1, as `DIR/ports` lists it (`etcd`, `apiserver`, ...).
    pub fn port(&self, component: &str) -> Result<u16> {
        let ports = std::fs::read_to_string(self.cp_dir()?.join("ports"))?;
        let prefix = format!("{component}=");
        ports
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|p| p.trim().parse().ok())
            .with_context(|| format!("no {component} port in DIR/ports"))
    }

    /// `control-plane restart COMPONENT`: stops one component (`etcd`, `kube-apiserver`, ...)
    /// and starts it again on the same ports, returning once it is healthy.
    pub fn restart(&self, component: &str) -> Result<()> {
        self.restart_with(component, &[])
    }

    /// `control-plane restart --stop-only COMPONENT`: stops one component and leaves it
    /// stopped (a fault: Karpenter down); [`ControlPlane::restart`] starts it again.
    pub fn stop(&self, component: &str) -> Result<()> {
        self.restart_with(component, &["--stop-only"])
    }

    fn restart_with(&self, component: &str, flags: &[&str]) -> Result<()> {
        if !self.owned {
            bail!("cannot restart {component} of a reused cluster");
        }
        let out = Command::new(&self.script)
            .arg("restart")
            .arg("--dir")
            .arg(self.cp_dir()?)
            .args(flags)
            .arg(component)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run {} restart", self.script.display()))?;
        if !out.status.success() {
            bail!(
                "control-plane restart {component} failed ({}):\n{}",
                out.status,
                tail(&out.stderr, 30)
            );
        }
        Ok(())
    }

    /// The admin kubeconfig.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client for the admin kubeconfig.
    pub async fn client(&self) -> Result<Client> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("read {}", self.kubeconfig.display()))?;
        let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        // kube's client has no timeouts of its own: a call that never returns would hang a
        // test past every deadline. Reads are bounded just above a watch's 290 s, so watches
        // are not cut; `wait_for` bounds each of its probes more tightly.
        config.connect_timeout = Some(std::time::Duration::from_secs(30));
        config.read_timeout = Some(std::time::Duration::from_secs(295));
        config.write_timeout = Some(std::time::Duration::from_secs(30));
        Ok(Client::try_from(config)?)
    }

    /// Runs kubectl (the control plane's own build, else `kubectl` on PATH) against this cluster.
    pub fn kubectl(&self, args: &[&str]) -> Result<Output> {
        let bin = self
            .kubectl
            .clone()
            .unwrap_or_else(|| PathBuf::from("kubectl"));
        Command::new(&bin)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run {}", bin.display()))
    }

    /// [`ControlPlane::kubectl`] that must succeed: its stdout, trimmed; an error
    /// with the arguments, stdout and stderr otherwise.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl(args)?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// `kubectl apply -f` a CRD manifest and wait until it is Established.
    pub fn install_crd_file(&self, path: &Path) -> Result<()> {
        let p = path.to_string_lossy();
        for args in [
            vec!["apply", "-f", &*p],
            vec![
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "-f",
                &*p,
            ],
        ] {
            // `kubectl wait` on a CRD the apiserver has not given a status
            // yet fails at once (".status.conditions accessor error: <nil>")
            // instead of waiting: seen under load. Ask again shortly.
            let mut attempts = 0;
            loop {
                let out = self.kubectl(&args)?;
                if out.status.success() {
                    break;
                }
                let err = String::from_utf8_lossy(&out.stderr);
                attempts += 1;
                if attempts < 10 && err.contains("accessor error") {
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    continue;
                }
                bail!("kubectl {} failed: {err}", args.join(" "));
            }
        }
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if self.owned
            && self.started
            && let Ok(dir) = self.cp_dir()
        {
            if panicking && dir.is_dir() {
                // `down` archives the logs when DIR/failed exists.
                let _ = std::fs::write(dir.join("failed"), b"test panicked\n");
            }
            match Command::new(&self.script)
                .arg("down")
                .arg("--dir")
                .arg(&dir)
                .stdin(Stdio::null())
                .output()
            {
                Ok(o) if o.status.success() => {
                    if panicking {
                        eprint!("{}", String::from_utf8_lossy(&o.stderr));
                    }
                }
                Ok(o) => eprintln!(
                    "raygate-e2e: control-plane down failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                ),
                Err(e) => eprintln!("raygate-e2e: could not run control-plane down: {e}"),
            }
        }
    }
}

/// A plain HTTP/1.1 GET to a loopback address; the body of a 200 answer.
fn http_get(addr: &str, path: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    if head.split_whitespace().nth(1) != Some("200") {
        bail!("GET http://{addr}{path}: {head}");
    }
    // ray-head may answer chunked; decode that simple form.
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut rest = body;
        let mut decoded = String::new();
        while let Some((len, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(len.trim(), 16).context("bad chunk size")?;
            if n == 0 || tail.len() < n {
                break;
            }
            decoded.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        return Ok(decoded);
    }
    Ok(body.to_string())
}

/// Five random characters of the alphabet Kubernetes uses for generated names.
pub fn rand_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect()
}

/// Creates a namespace named `<prefix>-<random>` and returns its name.
pub async fn create_namespace(client: &Client, prefix: &str) -> Result<String> {
    let name = format!("{prefix}-{}", rand_suffix());
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    api.create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("create namespace {name}"))?;
    Ok(name)
}
