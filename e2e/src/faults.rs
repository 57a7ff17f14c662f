//! Fault injection for e2e tests: a TCP proxy the test can black-hole, the apiserver's
//! audit log (who wrote what, when) and per-replica ServiceAccount identities, so a test
//! can tell which raygate replica made a write.

use crate::control_plane::ControlPlane;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
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
    cp.kubectl_ok(&["create", "serviceaccount", name, "-n", ns])?;
    if let Some(role) = cluster_role {
        let binding = format!("{ns}-{name}-{role}");
        let sa = format!("{ns}:{name}");
        cp.kubectl_ok(&[
            "create",
            "clusterrolebinding",
            &binding,
            "--clusterrole",
            role,
            "--serviceaccount",
            &sa,
        ])?;
    }
    let token = cp.kubectl_ok(&["create", "token", name, "-n", ns, "--duration=1h"])?;
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

/// A pod to place, as kube-scheduler sees it: its effective requests (per resource the
/// larger of the containers' sum and the largest init container, a container's request
/// defaulting to its limit as the apiserver defaults it) and its node selector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodShape {
    pub name: String,
    pub requests: BTreeMap<String, f64>,
    pub node_selector: BTreeMap<String, String>,
}

impl PodShape {
    /// The shape of a PodSpec given as JSON (a pod's or a template's `spec`).
    pub fn of_spec(name: &str, spec: &Value) -> Result<PodShape> {
        let per_container = |c: &Value| -> Result<BTreeMap<String, f64>> {
            let mut out = BTreeMap::new();
            for key in ["limits", "requests"] {
                if let Some(m) = c["resources"][key].as_object() {
                    for (r, q) in m {
                        let q = q
                            .as_str()
                            .and_then(quantity)
                            .with_context(|| format!("{name}: resources.{key}.{r}: {q}"))?;
                        out.insert(r.clone(), q);
                    }
                }
            }
            Ok(out)
        };
        let mut requests: BTreeMap<String, f64> = BTreeMap::new();
        for c in spec["containers"].as_array().into_iter().flatten() {
            for (r, q) in per_container(c)? {
                *requests.entry(r).or_default() += q;
            }
        }
        for c in spec["initContainers"].as_array().into_iter().flatten() {
            for (r, q) in per_container(c)? {
                let e = requests.entry(r).or_default();
                *e = e.max(q);
            }
        }
        for (r, q) in spec["overhead"].as_object().into_iter().flatten() {
            let q = q.as_str().and_then(quantity).unwrap_or(0.0);
            *requests.entry(r.clone()).or_default() += q;
        }
        let node_selector = spec["nodeSelector"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        Ok(PodShape {
            name: name.to_string(),
            requests,
            node_selector,
        })
    }
}

/// The pods of the RayCluster a RayService's `spec.rayClusterConfig` makes (what a
/// NewCluster upgrade creates): one head, and `replicas` pods per worker group.
pub fn new_cluster_pods(ray_service: &Value) -> Result<Vec<PodShape>> {
    let rc = &ray_service["spec"]["rayClusterConfig"];
    let mut pods = vec![PodShape::of_spec(
        "head",
        &rc["headGroupSpec"]["template"]["spec"],
    )?];
    for g in rc["workerGroupSpecs"].as_array().into_iter().flatten() {
        let group = g["groupName"].as_str().unwrap_or("workers");
        let replicas = g["replicas"].as_i64().unwrap_or(1).max(0);
        let shape = PodShape::of_spec(group, &g["template"]["spec"])?;
        for i in 0..replicas {
            pods.push(PodShape {
                name: format!("{group}-{i}"),
                ..shape.clone()
            });
        }
    }
    Ok(pods)
}

/// Why a node takes no new pod: cordoned, not Ready, or a NoSchedule/NoExecute taint (the
/// fixtures' pods tolerate none).
fn unschedulable(node: &k8s_openapi::api::core::v1::Node) -> Option<String> {
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable) == Some(true) {
        return Some("cordoned".into());
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return Some("not Ready".into());
    }
    spec.and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .find(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .map(|t| format!("taint {}:{}", t.key, t.effect))
}

/// One schedulable node: its labels (for node selectors) and free amount per resource.
#[derive(Debug, Clone, Default)]
pub struct NodeFree {
    pub labels: BTreeMap<String, String>,
    pub free: BTreeMap<String, f64>,
}

/// The cluster as the test counts it at one moment: what each node has free, from its
/// allocatable and the pods bound to it.
#[derive(Debug, Clone, Default)]
pub struct Free {
    /// Schedulable nodes by name.
    pub nodes: BTreeMap<String, NodeFree>,
    /// Nodes left out, with the reason.
    pub skipped: Vec<String>,
}

impl Free {
    /// Per schedulable node, allocatable minus the requests of the pods bound to it that
    /// are not Succeeded or Failed, leaving out pods labelled `ray.io/cluster` with one
    /// of `exclude` (the new cluster's own pods). Unbound pods take nothing: neither
    /// kube-scheduler nor raygate counts them against a node.
    pub fn count(
        nodes: &[k8s_openapi::api::core::v1::Node],
        pods: &[k8s_openapi::api::core::v1::Pod],
        exclude: &BTreeSet<String>,
    ) -> Result<Free> {
        let mut free = Free::default();
        for n in nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            if let Some(why) = unschedulable(n) {
                free.skipped.push(format!("{name}: {why}"));
                continue;
            }
            let mut amounts = BTreeMap::new();
            for (r, q) in n
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .into_iter()
                .flatten()
            {
                let v = quantity(&q.0)
                    .with_context(|| format!("node {name}: status.allocatable.{r}: {:?}", q.0))?;
                amounts.insert(r.clone(), v);
            }
            let labels = n.metadata.labels.clone().unwrap_or_default();
            free.nodes.insert(
                name,
                NodeFree {
                    labels,
                    free: amounts,
                },
            );
        }
        for p in pods {
            let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_ref()) else {
                continue;
            };
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            let cluster = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("ray.io/cluster"));
            if cluster.is_some_and(|c| exclude.contains(c)) {
                continue;
            }
            let Some(NodeFree { free: amounts, .. }) = free.nodes.get_mut(node) else {
                continue;
            };
            let name = p.metadata.name.clone().unwrap_or_default();
            let shape = PodShape::of_spec(&name, &serde_json::to_value(&p.spec)?)?;
            for (r, q) in shape.requests {
                *amounts.entry(r).or_default() -= q;
            }
        }
        Ok(free)
    }

    /// The free amount of `r` summed over schedulable nodes.
    pub fn total(&self, r: &str) -> f64 {
        self.nodes
            .values()
            .map(|n| n.free.get(r).copied().unwrap_or(0.0).max(0.0))
            .sum()
    }
}

/// Tolerance for comparing quantities parsed as floats.
fn exceeds(need: f64, have: f64) -> bool {
    need > have + 1e-9 * have.abs().max(1.0)
}

/// One node per pod such that every node's free amounts cover its pods, or None: pods
/// cannot span nodes, so a sum that fits may still not place (two 8-GPU workers on
/// two nodes with 4 free each). Exhaustive (the fixtures are a few pods on a few nodes),
/// largest pods first.
pub fn place(free: &Free, pods: &[PodShape]) -> Option<Vec<(String, String)>> {
    let mut order: Vec<&PodShape> = pods.iter().collect();
    let key = |p: &PodShape| {
        let g = |r: &str| p.requests.get(r).copied().unwrap_or(0.0);
        (g("nvidia.com/gpu"), g("cpu"), g("memory"))
    };
    order.sort_by(|a, b| {
        key(b)
            .partial_cmp(&key(a))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut left: Vec<(String, NodeFree)> = free
        .nodes
        .iter()
        .map(|(n, f)| (n.clone(), f.clone()))
        .collect();
    let mut chosen = Vec::new();
    let mut budget = 1_000_000u32;
    fn go(
        order: &[&PodShape],
        left: &mut [(String, NodeFree)],
        chosen: &mut Vec<(String, String)>,
        budget: &mut u32,
    ) -> bool {
        let Some((pod, rest)) = order.split_first() else {
            return true;
        };
        for i in 0..left.len() {
            if *budget == 0 {
                return false;
            }
            *budget -= 1;
            let (
                name,
                NodeFree {
                    labels,
                    free: amounts,
                },
            ) = &left[i];
            let selected = pod
                .node_selector
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v));
            let fits = pod
                .requests
                .iter()
                .all(|(r, q)| *q <= 0.0 || !exceeds(*q, amounts.get(r).copied().unwrap_or(0.0)));
            if !selected || !fits {
                continue;
            }
            chosen.push((pod.name.clone(), name.clone()));
            for (r, q) in &pod.requests {
                *left[i].1.free.entry(r.clone()).or_default() -= q;
            }
            if go(rest, left, chosen, budget) {
                return true;
            }
            for (r, q) in &pod.requests {
                *left[i].1.free.entry(r.clone()).or_default() += q;
            }
            chosen.pop();
        }
        false
    }
    go(&order, &mut left, &mut chosen, &mut budget).then_some(chosen)
}

/// The test's own verdict on an admission, from the cluster it recounted: the new
/// cluster's pods must fit per resource in the sum (`needed ≤ free − reserved −
/// headroom`, `reserved` being what other admitted upgrades still have to place) and, as
/// pods cannot span nodes, one by one on the nodes' free amounts. `Ok` says where they
/// go; `Err` gives the numbers.
pub fn recount_fit(
    free: &Free,
    new_pods: &[PodShape],
    reserved: &BTreeMap<String, f64>,
    headroom: &BTreeMap<String, f64>,
) -> Result<String> {
    let mut needed: BTreeMap<&str, f64> = BTreeMap::new();
    for p in new_pods {
        for (r, q) in &p.requests {
            *needed.entry(r.as_str()).or_default() += q;
        }
    }
    let mut wrong = vec![];
    for (r, need) in &needed {
        let f = free.total(r);
        let res = reserved.get(*r).copied().unwrap_or(0.0);
        let head = headroom.get(*r).copied().unwrap_or(0.0);
        if exceeds(*need, f - res - head) {
            wrong.push(format!(
                "{r}: needed {need} > free {f} - reserved {res} - headroom {head}"
            ));
        }
    }
    let nodes = free
        .nodes
        .iter()
        .map(|(n, NodeFree { free: a, .. })| {
            let g = a.get("nvidia.com/gpu").copied().unwrap_or(0.0);
            format!("{n} {g} GPU free")
        })
        .collect::<Vec<_>>()
        .join(", ");
    let placed = place(free, new_pods);
    if placed.is_none() {
        wrong.push(format!(
            "the new cluster's pods do not place one per node ({nodes}; skipped: {:?})",
            free.skipped
        ));
    }
    if !wrong.is_empty() {
        bail!("admitted without room: {}", wrong.join("; "));
    }
    Ok(format!(
        "fits: {} ({nodes})",
        placed
            .unwrap_or_default()
            .iter()
            .map(|(p, n)| format!("{p}->{n}"))
            .collect::<Vec<_>>()
            .join(" ")
    ))
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

    fn node(name: &str, gpus: u32, extra: Value) -> k8s_openapi::api::core::v1::Node {
        let mut v = json!({"metadata": {"name": name, "labels": {"pool": "gpu"}},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": gpus.to_string()},
                       "conditions": [{"type": "Ready", "status": "True"}]}});
        if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            for (k, x) in extra {
                v.insert(k.clone(), x.clone());
            }
        }
        serde_json::from_value(v).unwrap()
    }

    fn pod(
        name: &str,
        node: &str,
        gpus: u32,
        cluster: &str,
        phase: &str,
    ) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"ray.io/cluster": cluster}},
            "spec": {"nodeName": node, "containers": [{"name": "c",
                "resources": {"requests": {"cpu": "4", "memory": "16Gi"},
                              "limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    /// The faults suite's shape: 3 nodes x 8 GPUs; the new cluster is a CPU head and
    /// `replicas` workers of `gpus` GPUs.
    fn new_cluster(replicas: i64, gpus: u32) -> Vec<PodShape> {
        let rs = crate::GpuRayService::new("svc", "img:2")
            .replicas(replicas)
            .gpus(gpus)
            .build();
        new_cluster_pods(&rs).unwrap()
    }

    #[test]
    fn the_recount_admits_what_fits_and_refuses_what_does_not() {
        let shapes = new_cluster(2, 4);
        assert_eq!(shapes.len(), 3);
        assert_eq!(shapes[0].requests["cpu"], 2.0);
        assert_eq!(shapes[1].requests["nvidia.com/gpu"], 4.0);
        assert_eq!(shapes[2].requests["memory"], 16.0 * 1024f64.powi(3));
        let none = BTreeMap::new();
        let nodes = vec![
            node("gpu-0", 8, json!({})),
            node("gpu-1", 8, json!({})),
            node("gpu-2", 8, json!({})),
        ];
        // 4 + 4 + 4 GPUs used: 12 free, 4 on each node.
        let pods = vec![
            pod("a", "gpu-0", 4, "old", "Running"),
            pod("b", "gpu-1", 4, "old", "Running"),
            pod("c", "gpu-2", 4, "other", "Running"),
            pod("done", "gpu-2", 4, "other", "Succeeded"),
        ];
        let free = Free::count(&nodes, &pods, &BTreeSet::new()).unwrap();
        assert_eq!(free.total("nvidia.com/gpu"), 12.0);
        // Two 4-GPU workers: they fit, each on a node.
        let ok = recount_fit(&free, &new_cluster(2, 4), &none, &none).unwrap();
        assert!(ok.contains("fits"), "{ok}");
        // An admission without capacity: 16 GPUs needed, 12 free.
        let err = recount_fit(&free, &new_cluster(2, 8), &none, &none)
            .unwrap_err()
            .to_string();
        assert!(err.contains("nvidia.com/gpu: needed 16 > free 12"), "{err}");
        // The sum fits (8 <= 12) but an 8-GPU worker fits on no node (4 free on each).
        let err = recount_fit(&free, &new_cluster(1, 8), &none, &none)
            .unwrap_err()
            .to_string();
        assert!(err.contains("do not place one per node"), "{err}");
        assert!(!err.contains("needed"), "{err}");
        // Reservations of other admitted upgrades and the headroom come off the sum.
        let reserved = BTreeMap::from([("nvidia.com/gpu".to_string(), 4.0)]);
        let headroom = BTreeMap::from([("nvidia.com/gpu".to_string(), 1.0)]);
        let err = recount_fit(&free, &new_cluster(2, 4), &reserved, &headroom)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("needed 8 > free 12 - reserved 4 - headroom 1"),
            "{err}"
        );
        assert!(recount_fit(&free, &new_cluster(2, 4), &reserved, &none).is_ok());
        // The new cluster's own pods, if they exist already, are not counted against it.
        let mut with_new = pods.clone();
        with_new.push(pod("new-w", "gpu-0", 4, "svc-new", "Pending"));
        let counted = Free::count(&nodes, &with_new, &BTreeSet::new()).unwrap();
        assert!(recount_fit(&counted, &new_cluster(3, 4), &none, &none).is_err());
        let excluded =
            Free::count(&nodes, &with_new, &BTreeSet::from(["svc-new".to_string()])).unwrap();
        assert!(recount_fit(&excluded, &new_cluster(3, 4), &none, &none).is_ok());
    }

    #[test]
    fn cordoned_not_ready_and_tainted_nodes_take_nothing() {
        let nodes = vec![
            node("ok", 8, json!({})),
            node("cordoned", 8, json!({"spec": {"unschedulable": true}})),
            node(
                "tainted",
                8,
                json!({"spec": {"taints": [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]}}),
            ),
            node(
                "down",
                8,
                json!({"status": {"allocatable": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "False"}]}}),
            ),
        ];
        let free = Free::count(&nodes, &[], &BTreeSet::new()).unwrap();
        assert_eq!(free.total("nvidia.com/gpu"), 8.0);
        assert_eq!(free.skipped.len(), 3, "{:?}", free.skipped);
        let none = BTreeMap::new();
        assert!(recount_fit(&free, &new_cluster(2, 4), &none, &none).is_ok());
        assert!(recount_fit(&free, &new_cluster(3, 4), &none, &none).is_err());
        // A node selector no node matches places nothing.
        let mut shapes = new_cluster(1, 1);
        shapes[1].node_selector.insert("pool".into(), "cpu".into());
        assert!(recount_fit(&free, &shapes, &none, &none).is_err());
    }

    #[test]
    fn init_containers_and_limits_make_the_effective_request() {
        let spec = json!({"containers": [
                {"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "nvidia.com/gpu": "2"}}},
                {"resources": {"requests": {"cpu": "500m"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "3"}}}]});
        let s = PodShape::of_spec("p", &spec).unwrap();
        assert_eq!(s.requests["cpu"], 3.0);
        assert_eq!(s.requests["nvidia.com/gpu"], 2.0);
        assert!(
            PodShape::of_spec(
                "p",
                &json!({"containers": [{"resources": {"requests": {"cpu": "x1"}}}]})
            )
            .is_err()
        );
    }
}
