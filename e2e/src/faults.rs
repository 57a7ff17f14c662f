//! Fault injection for e2e tests: a TCP proxy the test can black-hole, the apiserver's
//! audit log (who wrote what, when) and per-replica ServiceAccount identities, so a test
//! can tell which raygate replica made a write.

use crate::control_plane::ControlPlane;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A loopback TCP proxy to one address. `blackhole(true)` makes every connection, old and
/// new, swallow what it is sent in both directions without closing: to the client the
/// server hangs, as when a network path or an apiserver stops answering. `blackhole(false)`
/// closes the connections that lost bytes, so clients reconnect to a working path.
pub struct TcpProxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
}

struct ProxyState {
    blackholed: AtomicBool,
    stopped: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub fn start(target: SocketAddr) -> Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").context("bind the proxy")?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let state = Arc::new(ProxyState {
            blackholed: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
        });
        let st = state.clone();
        std::thread::spawn(move || {
            while !st.stopped.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        if let Ok(server) = TcpStream::connect(target) {
                            st.pipe(client, server);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(TcpProxy { addr, state })
    }

    /// Where clients connect (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// On: every byte is dropped, no connection is closed. Off: the connections that were
    /// black-holed are closed (their streams lost bytes) and new ones work again.
    pub fn blackhole(&self, on: bool) {
        let was = self.state.blackholed.swap(on, Ordering::AcqRel);
        if was && !on {
            self.state.close_all();
        }
    }
}

impl ProxyState {
    fn pipe(self: &Arc<Self>, client: TcpStream, server: TcpStream) {
        let clones = [client.try_clone(), server.try_clone()];
        if let Ok(mut conns) = self.conns.lock() {
            conns.extend(clones.into_iter().flatten());
        }
        for (from, to) in [
            (client.try_clone(), server.try_clone()),
            (Ok(server), Ok(client)),
        ] {
            let (Ok(mut from), Ok(mut to)) = (from, to) else {
                continue;
            };
            let st = self.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if st.blackholed.load(Ordering::Acquire) {
                                continue;
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = to.shutdown(Shutdown::Both);
                let _ = from.shutdown(Shutdown::Both);
            });
        }
    }

    fn close_all(&self) {
        if let Ok(mut conns) = self.conns.lock() {
            for c in conns.drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::Release);
        self.state.close_all();
    }
}

/// One write request as the apiserver's audit log records it (`ResponseComplete`).
#[derive(Debug, Clone)]
pub struct AuditEvent {
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub code: i64,
    /// When the apiserver received the request.
    pub received: k8s_openapi::jiff::Timestamp,
    /// When it completed.
    pub completed: k8s_openapi::jiff::Timestamp,
}

impl AuditEvent {
    /// The write took effect (2xx).
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }

    fn from_json(v: &Value) -> Option<AuditEvent> {
        let s = |path: &[&str]| {
            path.iter()
                .try_fold(v, |v, k| v.get(k))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let ts = |k: &str| {
            v.get(k)?
                .as_str()?
                .parse::<k8s_openapi::jiff::Timestamp>()
                .ok()
        };
        Some(AuditEvent {
            user: s(&["user", "username"]),
            verb: s(&["verb"]),
            resource: s(&["objectRef", "resource"]),
            subresource: s(&["objectRef", "subresource"]),
            namespace: s(&["objectRef", "namespace"]),
            name: s(&["objectRef", "name"]),
            code: v.pointer("/responseStatus/code")?.as_i64()?,
            received: ts("requestReceivedTimestamp")?,
            completed: ts("stageTimestamp")?,
        })
    }
}

impl std::fmt::Display for AuditEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {} {}{} {}/{} -> {} (received {}, completed {})",
            self.user,
            self.verb,
            self.resource,
            if self.subresource.is_empty() { "" } else { "/" },
            self.subresource,
            self.namespace,
            self.name,
            self.code,
            self.received,
            self.completed
        )
    }
}

/// Every complete event of an audit log written by `up --audit-log`.
pub fn audit_events(path: &Path) -> Result<Vec<AuditEvent>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("stage").and_then(Value::as_str) == Some("ResponseComplete"))
        .filter_map(|v| AuditEvent::from_json(&v))
        .collect())
}

/// The username the apiserver gives ServiceAccount `ns/name`.
pub fn service_account_user(ns: &str, name: &str) -> String {
    format!("system:serviceaccount:{ns}:{name}")
}

/// Creates ServiceAccount `ns/name`, binds it to ClusterRole `cluster_role` (unless None),
/// requests a one-hour token for it and writes a kubeconfig with that token. `server`
/// replaces the apiserver address (e.g. a [`TcpProxy`] in front of it).
pub fn service_account_kubeconfig(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    cluster_role: Option<&str>,
    server: Option<SocketAddr>,
) -> Result<PathBuf> {
    let run = |args: &[&str]| -> Result<String> {
        let out = cp.kubectl(args)?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    run(&["create", "serviceaccount", name, "-n", ns])?;
    if let Some(role) = cluster_role {
        let binding = format!("{ns}-{name}-{role}");
        let sa = format!("{ns}:{name}");
        run(&[
            "create",
            "clusterrolebinding",
            &binding,
            "--clusterrole",
            role,
            "--serviceaccount",
            &sa,
        ])?;
    }
    let token = run(&["create", "token", name, "-n", ns, "--duration=1h"])?;
    let admin = std::fs::read_to_string(cp.kubeconfig_path())?;
    let mut out = String::new();
    for line in admin.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed.starts_with("token:") {
            out.push_str(&format!("{indent}token: {token}\n"));
        } else if let (Some(addr), true) = (server, trimmed.starts_with("server:")) {
            out.push_str(&format!("{indent}server: https://{addr}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    // Next to the admin kubeconfig, not in logs/ (archived when a test fails).
    let dir = cp
        .kubeconfig_path()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| cp.log_dir());
    let path = dir.join(format!("kubeconfig-{ns}-{name}"));
    std::fs::write(&path, out)?;
    Ok(path)
}

/// Compacts etcd's history up to its current revision (etcd's v3 JSON gateway on the
/// client port), so that watches resuming from an older resourceVersion get `410 Gone`
/// and must relist. Returns the revision compacted at.
pub fn etcd_compact(cp: &ControlPlane) -> Result<i64> {
    let port = cp.port("etcd")?;
    // Any key: the response header carries the store's current revision.
    let range = etcd_post(port, "/v3/kv/range", r#"{"key":"AA==","limit":1}"#)?;
    let revision: i64 = range
        .pointer("/header/revision")
        .and_then(|r| {
            r.as_str()
                .and_then(|s| s.parse().ok())
                .or_else(|| r.as_i64())
        })
        .with_context(|| format!("no revision in {range}"))?;
    etcd_post(
        port,
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{revision}","physical":true}}"#),
    )?;
    Ok(revision)
}

fn etcd_post(port: u16, path: &str, body: &str) -> Result<Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, rest) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    if head.split_whitespace().nth(1) != Some("200") {
        bail!("etcd POST {path}: {head}\n{rest}");
    }
    // The gateway may answer chunked; the JSON object is what lies between the braces.
    let json = rest
        .find('{')
        .zip(rest.rfind('}'))
        .map(|(a, b)| &rest[a..=b])
        .unwrap_or(rest);
    serde_json::from_str(json).with_context(|| format!("etcd POST {path}: {rest}"))
}

/// A CA and a serving certificate it signed for `localhost` and `127.0.0.1`, made with
/// openssl (as cert-manager would issue one): `dir/tls.crt` and `dir/tls.key` (what
/// `raygate run --metrics-cert-dir dir` reads) and `dir/ca.crt` (for a verifying client).
/// Returns the CA's path.
pub fn metrics_certificates(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let openssl = |args: &[&str]| -> Result<()> {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .context("run openssl")?;
        if !out.status.success() {
            bail!(
                "openssl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509", "-days", "1", "-subj", "/CN=raygate-e2e-ca"][..],
            &ec,
            &["-keyout", "ca.key", "-out", "ca.crt"],
        ]
        .concat(),
    )?;
    openssl(
        &[
            &["req", "-subj", "/CN=localhost"][..],
            &ec,
            &["-keyout", "tls.key", "-out", "tls.csr"],
        ]
        .concat(),
    )?;
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "san.ext",
        "-out",
        "tls.crt",
    ])?;
    Ok(dir.join("ca.crt"))
}

/// A Kubernetes quantity as a number of base units (`500m` = 0.5, `16Gi` = 16 × 2^30);
/// None when it does not parse. Precise enough to compare capacities in tests.
pub fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => return None,
    };
    num.parse::<f64>().ok().map(|n| n * mult)
}

/// The admission recorded on `plan` respected capacity: for every resource the new
/// cluster needs, `needed ≤ free − reserved − headroom`, from the plan's own recorded
/// `status.capacity` (what raygate saw at the decision) and its `spec.headroom`,
/// recomputed here rather than read from `status.capacity.available`.
pub fn check_admission_fit(plan: &Value) -> Result<()> {
    let cap = &plan["status"]["capacity"];
    let needed = cap["needed"]
        .as_object()
        .filter(|m| !m.is_empty())
        .with_context(|| format!("no status.capacity.needed recorded: {cap}"))?;
    let amount = |m: &Value, r: &str| -> Result<f64> {
        match m.get(r).and_then(Value::as_str) {
            None => Ok(0.0),
            Some(q) => quantity(q).with_context(|| format!("{r}: bad quantity {q:?}")),
        }
    };
    let mut wrong = vec![];
    for (r, need) in needed {
        let need = need
            .as_str()
            .and_then(quantity)
            .with_context(|| format!("needed {r}: {need}"))?;
        let free = amount(&cap["free"], r)?;
        let reserved = amount(&cap["reserved"], r)?;
        let headroom = amount(&plan["spec"]["headroom"], r)?;
        let left = free - reserved - headroom;
        if need > left + left.abs() * 1e-9 {
            wrong.push(format!(
                "{r}: needed {need} > free {free} - reserved {reserved} - headroom {headroom}"
            ));
        }
    }
    if !wrong.is_empty() {
        bail!("admitted without room: {}", wrong.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_and_the_admission_check() {
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("16Gi"), Some(16.0 * 1024f64.powi(3)));
        assert_eq!(quantity("4"), Some(4.0));
        assert_eq!(quantity("1x"), None);
        let plan = |free: &str| {
            json!({"spec": {"headroom": {"nvidia.com/gpu": "2"}},
                   "status": {"capacity": {"needed": {"nvidia.com/gpu": "8", "cpu": "4"},
                     "free": {"nvidia.com/gpu": free, "cpu": "16"},
                     "reserved": {"nvidia.com/gpu": "4"}}}})
        };
        assert!(check_admission_fit(&plan("14")).is_ok());
        let err = check_admission_fit(&plan("13")).unwrap_err().to_string();
        assert!(err.contains("nvidia.com/gpu: needed 8 > free 13"), "{err}");
        assert!(check_admission_fit(&json!({"status": {}})).is_err());
    }
}
