//! A real local control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager)
//! started through `e2e/control-plane`, or an existing one named by `RAYGATE_E2E_KUBECONFIG`.

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

const SETUP_HINT: &str = "run `e2e/setup` once to build the control-plane binaries (see e2e/README.md), \
or set RAYGATE_E2E_KUBECONFIG to reuse a running cluster";

/// Handle on a control plane; stops it on drop if this handle started it.
pub struct ControlPlane {
    dir: Option<tempfile::TempDir>,
    kubeconfig: PathBuf,
    script: PathBuf,
    owned: bool,
    started: bool,
    kubectl: Option<PathBuf>,
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
    /// Starts a fresh control plane in a new temporary directory (or reuses
    /// `RAYGATE_E2E_KUBECONFIG`). Processes are stopped when the handle drops, also when
    /// startup fails half-way.
    pub fn start() -> Result<ControlPlane> {
        let script = script_path();
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
        };
        let dir_path = cp.cp_dir()?;
        let out = Command::new(&cp.script)
            .arg("up")
            .arg("--dir")
            .arg(&dir_path)
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

    /// The admin kubeconfig.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client for the admin kubeconfig.
    pub async fn client(&self) -> Result<Client> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("read {}", self.kubeconfig.display()))?;
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
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
            let out = self.kubectl(&args)?;
            if !out.status.success() {
                bail!(
                    "kubectl {} failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                );
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

/// Creates a namespace named `<prefix>-<random>` and returns its name.
pub async fn create_namespace(client: &Client, prefix: &str) -> Result<String> {
    let name = format!("{prefix}-{}", crate::sim::pods::rand_suffix());
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    api.create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("create namespace {name}"))?;
    Ok(name)
}
