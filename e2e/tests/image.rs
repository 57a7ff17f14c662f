//! The image as users run it: the image CI builds (`scripts/build-image`, the repository's
//! Dockerfile on an empty base) is started with podman as a kubelet would start the chart's
//! pod, configured only by what the chart renders, and gates a real upgrade on the real
//! KubeRay operator. `scripts/release` is run end to end with a local target.
//!
//! Real: the image and its static binary, the container runtime (podman with runc: user,
//! capabilities, seccomp, read-only root, the memory limit in the kernel's cgroup), the chart
//! as `helm template` renders it, its RBAC on the apiserver (RBAC is enforced there), a bound
//! ServiceAccount token from the TokenRequest API, the Pods the Deployment controller makes
//! and kube-scheduler places. Not real: a kubelet. kwok reports the chart's Pods Running; the
//! test starts one container per Pod and translates the rendered container spec field by
//! field ([`translate`]), failing on any field it does not carry, and it probes the container
//! as a kubelet does. Each container has its own network namespace (slirp4netns), as a pod
//! has, so both replicas listen on the chart's ports; the apiserver on the host's loopback is
//! `kubernetes.default.svc` there (a name its serving certificate holds), standing in for the
//! `kubernetes` Service's ClusterIP and kube-proxy.
//!
//! Needs `e2e/setup`, `e2e/setup-tools` (helm, podman, buildah, runc, slirp4netns,
//! musl-gcc, the musl Rust target) and root (podman's storage, as CI runs). The image is
//! built (cached: the cargo target directory, and an image of the same binary is reused) by
//! `scripts/build-image`, or taken from `RAYGATE_IMAGE` (an image in podman's storage).

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use raygate_e2e::apis::{plan_api, rs_api};
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::json::str_at;
use raygate_e2e::{Check, ControlPlane, FakeNode, GpuRayService, create_namespace, wait_for};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const RELEASE: &str = "rg";
const NS: &str = "raygate-system";
const T: Duration = Duration::from_secs(120);
/// The chart's values this suite renders with, besides the defaults.
const VALUES: &[&str] = &["--set", "capacityRequests.enabled=true"];
/// The image stays under this (issue 34's goal).
const MAX_IMAGE_BYTES: u64 = 40 * 1000 * 1000;
/// Where in-cluster config looks (kube's `incluster_config`, client-go's `rest.InClusterConfig`).
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The podman flags this machine needs: runc (crun fails on cgroup v1 hosts here) and
/// cgroupfs (no systemd).
const PODMAN_GLOBAL: &[&str] = &["--runtime", "runc", "--cgroup-manager=cgroupfs"];
/// The sandbox's limits are below podman's default ulimits, which it cannot raise.
const ULIMITS: &[&str] = &[
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

// ---------------------------------------------------------------------------
// tools

fn cache_dir() -> PathBuf {
    if let Some(c) = std::env::var_os("RAYGATE_CACHE") {
        return PathBuf::from(c);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache").join("raygate")
}

fn helm() -> PathBuf {
    if let Some(p) = std::env::var_os("RAYGATE_HELM") {
        return PathBuf::from(p);
    }
    let p = cache_dir().join("bin/helm");
    assert!(
        p.is_file(),
        "helm not found at {}: run `e2e/setup-tools`",
        p.display()
    );
    p
}

/// Runs `cmd`; its stdout if it exits 0, else an error with both outputs.
fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn podman(args: &[&str]) -> Result<String> {
    output(Command::new("podman").args(PODMAN_GLOBAL).args(args))
}

/// The image under test, built once per test process.
#[derive(Debug, Clone)]
struct Image {
    /// A reference podman resolves locally.
    reference: String,
    /// The config digest (podman's image id).
    id: String,
}

fn image() -> Image {
    static BUILT: Mutex<Option<Image>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = built.as_ref() {
        return i.clone();
    }
    let reference = match std::env::var("RAYGATE_IMAGE") {
        Ok(r) if !r.is_empty() => r,
        _ => {
            let t0 = Instant::now();
            let out = output(
                Command::new(repo_root().join("scripts/build-image"))
                    .args(["--tag", "localhost/raygate:e2e"])
                    .current_dir(repo_root())
                    .stderr(Stdio::inherit()),
            )
            .unwrap_or_else(|e| panic!("scripts/build-image: {e:#}"));
            eprintln!("image: scripts/build-image in {:?}:\n{out}", t0.elapsed());
            key(&out, "image").unwrap_or_else(|| panic!("no image= in {out}"))
        }
    };
    let id = podman(&["image", "inspect", "--format", "{{.Id}}", &reference])
        .unwrap_or_else(|e| panic!("the image {reference}: {e:#}"))
        .trim()
        .to_string();
    let i = Image { reference, id };
    *built = Some(i.clone());
    i
}

/// `key=value` of a script's output.
fn key(text: &str, k: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{k}=")))
        .map(str::to_owned)
}

// ---------------------------------------------------------------------------
// the chart

fn docs(text: &str) -> Vec<Value> {
    let all: Vec<Value> =
        serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("not valid YAML: {e}\n{text}"));
    all.into_iter().filter(|d| !d.is_null()).collect()
}

/// `helm template` of `chart` as `helm install` would create it (hooks run later).
fn render_chart(chart: &str, extra: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(helm());
    cmd.args([
        "template",
        RELEASE,
        chart,
        "--namespace",
        NS,
        "--kube-version",
        "1.36.3",
    ])
    .args(extra)
    .current_dir(repo_root());
    docs(&output(&mut cmd).unwrap_or_else(|e| panic!("{e:#}")))
        .into_iter()
        .filter(|o| !o["metadata"]["annotations"]["helm.sh/hook"].is_string())
        .collect()
}

fn render(extra: &[&str]) -> Vec<Value> {
    let mut args = VALUES.to_vec();
    args.extend_from_slice(extra);
    render_chart("charts/raygate", &args)
}

fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

fn find<'a>(objs: &'a [Value], k: &str) -> &'a Value {
    let found: Vec<&Value> = objs.iter().filter(|o| kind(o) == k).collect();
    assert_eq!(found.len(), 1, "expected exactly one {k}");
    found[0]
}

fn pod_template(objs: &[Value]) -> &Value {
    &find(objs, "Deployment")["spec"]["template"]["spec"]
}

// ---------------------------------------------------------------------------
// the kubelet's part: the rendered container, translated for podman

/// What a kubelet knows of the Pod when it starts its container (the downward API's fields).
#[derive(Debug, Clone, Default)]
struct PodFacts {
    name: String,
    namespace: String,
    uid: String,
    node_name: String,
    pod_ip: String,
    host_ip: String,
}

impl PodFacts {
    fn from_pod(pod: &Value) -> PodFacts {
        PodFacts {
            name: str_at(pod, &["metadata", "name"]).to_owned(),
            namespace: str_at(pod, &["metadata", "namespace"]).to_owned(),
            uid: str_at(pod, &["metadata", "uid"]).to_owned(),
            node_name: str_at(pod, &["spec", "nodeName"]).to_owned(),
            pod_ip: str_at(pod, &["status", "podIP"]).to_owned(),
            host_ip: str_at(pod, &["status", "hostIP"]).to_owned(),
        }
    }

    fn field(&self, path: &str) -> Result<&str> {
        Ok(match path {
            "metadata.name" => &self.name,
            "metadata.namespace" => &self.namespace,
            "metadata.uid" => &self.uid,
            "spec.nodeName" => &self.node_name,
            "status.podIP" => &self.pod_ip,
            "status.hostIP" => &self.host_ip,
            _ => bail!("env fieldRef {path}: not carried by the translation"),
        })
    }
}

/// An httpGet probe as the chart asks for it.
#[derive(Debug, Clone, PartialEq)]
struct Probe {
    kind: String,
    path: String,
    /// The container's port.
    port: u16,
    scheme: String,
    initial_delay: u64,
    period: u64,
    timeout: u64,
    failure_threshold: u64,
}

/// A `podman run` of one Pod's container.
#[derive(Debug, Clone, Default)]
struct Run {
    /// `podman run` options (before the image).
    options: Vec<String>,
    image: String,
    /// After the image: the container's args (the image's ENTRYPOINT stays).
    args: Vec<String>,
    /// The container's ports by name.
    ports: BTreeMap<String, u16>,
    probes: Vec<Probe>,
    /// The memory limit in bytes, if any.
    memory_limit: Option<u64>,
}

/// Where the kubelet's environment points the container.
struct Cluster<'a> {
    /// KUBERNETES_SERVICE_HOST/PORT.
    api_host: &'a str,
    api_port: u16,
    /// The host directory mounted at [`SA_DIR`] (token, ca.crt, namespace).
    sa_dir: Option<&'a Path>,
}

/// Takes `key` out of `m` (so what is left over is what was not carried).
fn take(m: &mut Map<String, Value>, key: &str) -> Value {
    m.remove(key).unwrap_or(Value::Null)
}

fn object(v: Value, path: &str) -> Result<Map<String, Value>> {
    match v {
        Value::Object(m) => Ok(m),
        Value::Null => Ok(Map::new()),
        other => bail!("{path}: expected an object, got {other}"),
    }
}

fn array(v: Value, path: &str) -> Result<Vec<Value>> {
    match v {
        Value::Array(a) => Ok(a),
        Value::Null => Ok(vec![]),
        other => bail!("{path}: expected a list, got {other}"),
    }
}

fn leftover(m: &Map<String, Value>, path: &str) -> Result<()> {
    if let Some(k) = m.keys().next() {
        bail!(
            "{path}.{k} is rendered by the chart but not carried into the container by this \
             translation (e2e/tests/image.rs, translate): carry it, or say why a kubelet would not"
        );
    }
    Ok(())
}

/// Bytes of a Kubernetes memory quantity (`512Mi`, `1G`, `1048576`).
fn bytes(q: &str) -> Result<u64> {
    let (num, mult) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ]
    .iter()
    .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
    .unwrap_or((q, 1));
    let n: u64 = num
        .parse()
        .with_context(|| format!("memory quantity {q:?}"))?;
    Ok(n * mult)
}

/// Millicores of a CPU quantity (`1`, `100m`, `0.5`).
fn millicores(q: &str) -> Result<u64> {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().with_context(|| format!("cpu quantity {q:?}"));
    }
    let cores: f64 = q.parse().with_context(|| format!("cpu quantity {q:?}"))?;
    Ok((cores * 1000.0).round() as u64)
}

fn int(v: &Value, default: u64) -> u64 {
    v.as_u64().unwrap_or(default)
}

/// The pod's only container, translated field by field into a `podman run` as a kubelet
/// would run it; an error names any field of the pod spec or container it does not carry.
/// The ports are published by [`Container::start`].
fn translate(pod_spec: &Value, pod: &PodFacts, cluster: &Cluster<'_>) -> Result<Run> {
    let mut spec = object(pod_spec.clone(), "spec")?;
    let mut run = Run::default();
    let opt = |o: &mut Vec<String>, a: &[&str]| o.extend(a.iter().map(|s| s.to_string()));
    let containers = array(take(&mut spec, "containers"), "spec.containers")?;
    let [container] = <[Value; 1]>::try_from(containers)
        .map_err(|c| anyhow::anyhow!("spec.containers: expected one container, got {}", c.len()))?;
    let pod_sc = object(take(&mut spec, "securityContext"), "spec.securityContext")?;
    let sa_name = take(&mut spec, "serviceAccountName");
    let automount = take(&mut spec, "automountServiceAccountToken");
    if let Some(g) = take(&mut spec, "terminationGracePeriodSeconds").as_u64() {
        // SIGTERM, then SIGKILL after the grace period.
        opt(&mut run.options, &["--stop-timeout", &g.to_string()]);
    }
    // Decided by kube-scheduler on the real Pod this container stands for (the test
    // creates the Deployment; the scheduler places its Pods on kwok nodes).
    for k in [
        "affinity",
        "nodeSelector",
        "tolerations",
        "topologySpreadConstraints",
        "priorityClassName",
    ] {
        take(&mut spec, k);
    }
    // Pull credentials: the image is in the local store, nothing is pulled.
    take(&mut spec, "imagePullSecrets");
    leftover(&spec, "spec")?;

    // The ServiceAccount volume a kubelet projects: a bound token, the cluster CA, the
    // namespace, read-only.
    if automount != json!(false) {
        if sa_name.as_str().is_none_or(str::is_empty) {
            bail!("spec.serviceAccountName: the chart names no ServiceAccount");
        }
        let dir = cluster
            .sa_dir
            .context("the Pod mounts a ServiceAccount token, but none was made")?;
        let mount = format!("{}:{SA_DIR}:ro", dir.display());
        opt(&mut run.options, &["--volume", &mount]);
    }

    let mut c = object(container, "spec.containers[0]")?;
    let name = take(&mut c, "name");
    opt(
        &mut run.options,
        &[
            "--name",
            &format!("{}-{}", pod.name, name.as_str().unwrap_or("c")),
            "--hostname",
            &pod.name,
        ],
    );
    run.image = take(&mut c, "image")
        .as_str()
        .context("spec.containers[0].image")?
        .to_owned();
    let pull = match take(&mut c, "imagePullPolicy").as_str() {
        Some("Always") => "always",
        Some("Never") => "never",
        // IfNotPresent, and the API's default for a tagged image.
        _ => "missing",
    };
    opt(&mut run.options, &["--pull", pull]);
    if let Value::Array(cmd) = take(&mut c, "command") {
        opt(
            &mut run.options,
            &["--entrypoint", &Value::Array(cmd).to_string()],
        );
    }
    for a in array(take(&mut c, "args"), "args")? {
        run.args
            .push(a.as_str().context("args: not a string")?.to_owned());
    }

    // Environment: the container's, then what a kubelet adds (the apiserver's Service).
    for (i, e) in array(take(&mut c, "env"), "env")?.into_iter().enumerate() {
        let path = format!("spec.containers[0].env[{i}]");
        let mut e = object(e, &path)?;
        let name = take(&mut e, "name")
            .as_str()
            .context("env name")?
            .to_owned();
        let value = match (take(&mut e, "value"), take(&mut e, "valueFrom")) {
            (Value::String(v), Value::Null) => v,
            (Value::Null, Value::Object(mut from)) => {
                let mut fr = object(
                    take(&mut from, "fieldRef"),
                    &format!("{path}.valueFrom.fieldRef"),
                )?;
                leftover(&from, &format!("{path}.valueFrom"))?;
                take(&mut fr, "apiVersion");
                let fp = take(&mut fr, "fieldPath");
                leftover(&fr, &format!("{path}.valueFrom.fieldRef"))?;
                pod.field(fp.as_str().unwrap_or_default())?.to_owned()
            }
            (v, f) => bail!("{path}: value {v} / valueFrom {f} not carried"),
        };
        leftover(&e, &path)?;
        opt(&mut run.options, &["--env", &format!("{name}={value}")]);
    }
    for (k, v) in [
        ("KUBERNETES_SERVICE_HOST", cluster.api_host.to_string()),
        ("KUBERNETES_SERVICE_PORT", cluster.api_port.to_string()),
        (
            "KUBERNETES_SERVICE_PORT_HTTPS",
            cluster.api_port.to_string(),
        ),
    ] {
        opt(&mut run.options, &["--env", &format!("{k}={v}")]);
    }

    // Ports: each is published on a free loopback port of the host, where the test
    // (the "kubelet" and the "scraper") reaches it; the container listens on its own.
    for (i, p) in array(take(&mut c, "ports"), "ports")?
        .into_iter()
        .enumerate()
    {
        let path = format!("spec.containers[0].ports[{i}]");
        let mut p = object(p, &path)?;
        let port = take(&mut p, "containerPort")
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .with_context(|| format!("{path}.containerPort"))?;
        let proto = take(&mut p, "protocol");
        if proto.as_str().is_some_and(|s| s != "TCP") {
            bail!("{path}.protocol {proto}: only TCP is carried");
        }
        if let Some(n) = take(&mut p, "name").as_str() {
            run.ports.insert(n.to_owned(), port);
        }
        leftover(&p, &path)?;
    }

    for kind in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let path = format!("spec.containers[0].{kind}");
        let mut p = object(take(&mut c, kind), &path)?;
        if p.is_empty() {
            continue;
        }
        let mut get = object(take(&mut p, "httpGet"), &format!("{path}.httpGet"))?;
        let port = match take(&mut get, "port") {
            Value::String(n) => *run
                .ports
                .get(&n)
                .with_context(|| format!("{path}.httpGet.port {n}: no such container port"))?,
            Value::Number(n) => n
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .with_context(|| format!("{path}.httpGet.port"))?,
            other => bail!("{path}.httpGet.port {other}"),
        };
        let probe = Probe {
            kind: kind.to_owned(),
            path: take(&mut get, "path").as_str().unwrap_or("/").to_owned(),
            port,
            scheme: take(&mut get, "scheme")
                .as_str()
                .unwrap_or("HTTP")
                .to_owned(),
            initial_delay: int(&take(&mut p, "initialDelaySeconds"), 0),
            period: int(&take(&mut p, "periodSeconds"), 10),
            timeout: int(&take(&mut p, "timeoutSeconds"), 1),
            failure_threshold: int(&take(&mut p, "failureThreshold"), 3),
        };
        if int(&take(&mut p, "successThreshold"), 1) != 1 {
            bail!("{path}.successThreshold: only 1 is carried");
        }
        leftover(&get, &format!("{path}.httpGet"))?;
        leftover(&p, &path)?;
        run.probes.push(probe);
    }

    // Resources, as a kubelet sets the container's cgroup (v1): the memory limit,
    // the CPU quota from the limit and cpu.shares from the request. The memory request
    // only places the Pod (kube-scheduler did, on the real Pod).
    let mut res = object(take(&mut c, "resources"), "resources")?;
    let mut limits = object(take(&mut res, "limits"), "resources.limits")?;
    let mut requests = object(take(&mut res, "requests"), "resources.requests")?;
    leftover(&res, "spec.containers[0].resources")?;
    if let Some(m) = take(&mut limits, "memory").as_str() {
        let b = bytes(m)?;
        run.memory_limit = Some(b);
        opt(&mut run.options, &["--memory", &b.to_string()]);
    }
    if let Some(cpu) = take(&mut limits, "cpu").as_str() {
        let m = millicores(cpu)?;
        opt(
            &mut run.options,
            &["--cpus", &format!("{}", m as f64 / 1000.0)],
        );
    }
    if let Some(cpu) = take(&mut requests, "cpu").as_str() {
        let shares = (millicores(cpu)? * 1024 / 1000).max(2);
        opt(&mut run.options, &["--cpu-shares", &shares.to_string()]);
    }
    take(&mut requests, "memory");
    leftover(&limits, "spec.containers[0].resources.limits")?;
    leftover(&requests, "spec.containers[0].resources.requests")?;

    // The security context: the container's over the pod's.
    let mut sc = pod_sc;
    for (k, v) in object(take(&mut c, "securityContext"), "securityContext")? {
        sc.insert(k, v);
    }
    let uid = take(&mut sc, "runAsUser").as_u64();
    let gid = take(&mut sc, "runAsGroup").as_u64();
    match (uid, gid) {
        (Some(u), Some(g)) => opt(&mut run.options, &["--user", &format!("{u}:{g}")]),
        (Some(u), None) => opt(&mut run.options, &["--user", &u.to_string()]),
        (None, Some(_)) => bail!("securityContext.runAsGroup without runAsUser is not carried"),
        (None, None) => {}
    }
    if take(&mut sc, "runAsNonRoot") == json!(true) && uid == Some(0) {
        bail!("securityContext: runAsNonRoot with runAsUser 0 (a kubelet refuses to start it)");
    }
    if take(&mut sc, "readOnlyRootFilesystem") == json!(true) {
        // No tmpfs on /tmp, /run, /var/tmp either: a kubelet adds none.
        opt(
            &mut run.options,
            &["--read-only", "--read-only-tmpfs=false"],
        );
    }
    if take(&mut sc, "allowPrivilegeEscalation") == json!(false) {
        opt(&mut run.options, &["--security-opt", "no-new-privileges"]);
    }
    if take(&mut sc, "privileged") == json!(true) {
        opt(&mut run.options, &["--privileged"]);
    }
    let mut caps = object(
        take(&mut sc, "capabilities"),
        "securityContext.capabilities",
    )?;
    for (key, flag) in [("drop", "--cap-drop"), ("add", "--cap-add")] {
        for cap in array(take(&mut caps, key), "capabilities")? {
            opt(&mut run.options, &[flag, cap.as_str().unwrap_or_default()]);
        }
    }
    leftover(&caps, "securityContext.capabilities")?;
    let mut seccomp = object(
        take(&mut sc, "seccompProfile"),
        "securityContext.seccompProfile",
    )?;
    match take(&mut seccomp, "type").as_str() {
        // podman's default profile is the container runtime's default, as RuntimeDefault asks.
        None | Some("RuntimeDefault") => {}
        Some("Unconfined") => opt(&mut run.options, &["--security-opt", "seccomp=unconfined"]),
        Some(other) => bail!("securityContext.seccompProfile.type {other} is not carried"),
    }
    leftover(&seccomp, "securityContext.seccompProfile")?;
    for g in array(take(&mut sc, "supplementalGroups"), "supplementalGroups")? {
        opt(&mut run.options, &["--group-add", &g.to_string()]);
    }
    if let Some(g) = take(&mut sc, "fsGroup").as_u64() {
        opt(&mut run.options, &["--group-add", &g.to_string()]);
    }
    leftover(&sc, "securityContext (pod and container)")?;
    leftover(&c, "spec.containers[0]")?;
    Ok(run)
}

// ---------------------------------------------------------------------------
// running a Pod's container

/// A started container, removed on drop.
struct Container {
    name: String,
    /// Host port of each container port.
    published: BTreeMap<u16, u16>,
    run: Run,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Container {
    fn start(run: Run) -> Result<Container> {
        let mut published = BTreeMap::new();
        let mut args: Vec<String> = vec!["run".into(), "--detach".into()];
        args.extend(ULIMITS.iter().map(|s| s.to_string()));
        // Its own network namespace, like a pod's; the host's loopback is reachable as
        // 10.0.2.2, named kubernetes.default.svc (the apiserver's certificate holds it).
        args.extend(
            [
                "--network",
                "slirp4netns:allow_host_loopback=true",
                "--add-host",
                "kubernetes.default.svc:10.0.2.2",
            ]
            .map(String::from),
        );
        for port in run.ports.values() {
            let host = free_port();
            published.insert(*port, host);
            args.extend(["--publish".into(), format!("127.0.0.1:{host}:{port}/tcp")]);
        }
        args.extend(run.options.iter().cloned());
        args.push(run.image.clone());
        args.extend(run.args.iter().cloned());
        let name = run
            .options
            .iter()
            .skip_while(|o| *o != "--name")
            .nth(1)
            .context("no --name")?
            .clone();
        // A leftover of an interrupted run would hold the name.
        let _ = podman(&["rm", "--force", "--ignore", &name]);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        podman(&argv).with_context(|| format!("podman {}", args.join(" ")))?;
        Ok(Container {
            name,
            published,
            run,
        })
    }

    fn logs(&self) -> String {
        let out = Command::new("podman")
            .args(["logs", &self.name])
            .stdin(Stdio::null())
            .output();
        out.map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_default()
    }

    fn pid(&self) -> Result<u32> {
        let p = podman(&["inspect", "--format", "{{.State.Pid}}", &self.name])?;
        let pid: u32 = p.trim().parse().context("pid")?;
        if pid == 0 {
            bail!(
                "container {} is not running; log:\n{}",
                self.name,
                self.logs()
            );
        }
        Ok(pid)
    }

    fn host_port(&self, container_port: u16) -> u16 {
        self.published[&container_port]
    }

    /// One probe as a kubelet makes it: GET with the probe's timeout, success 200-399.
    fn probe(&self, p: &Probe) -> Result<u16> {
        let url = format!(
            "{}://127.0.0.1:{}{}",
            p.scheme.to_lowercase(),
            self.host_port(p.port),
            p.path
        );
        curl(&url, None, p.timeout)
    }

    /// Waits until every readiness probe succeeds, probing as often as the chart asks.
    fn wait_ready(&self) -> Result<()> {
        let start = Instant::now();
        for p in self
            .run
            .probes
            .iter()
            .filter(|p| p.kind == "readinessProbe")
        {
            loop {
                match self.probe(p) {
                    Ok(c) if (200..400).contains(&c) => break,
                    r if start.elapsed() > Duration::from_secs(90) => bail!(
                        "{} {} never succeeded ({r:?}); log:\n{}",
                        self.name,
                        p.kind,
                        self.logs()
                    ),
                    _ => std::thread::sleep(Duration::from_secs(p.period.min(1))),
                }
            }
        }
        Ok(())
    }

    fn kill(&self) -> Result<()> {
        podman(&["kill", "--signal", "KILL", &self.name]).map(drop)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("image: log of container {}:\n{}", self.name, self.logs());
        }
        let _ = podman(&["rm", "--force", "--ignore", &self.name]);
    }
}

/// An HTTP(S) GET with curl (HTTPS unverified, as the ServiceMonitor's insecureSkipVerify):
/// the status.
fn curl(url: &str, token: Option<&str>, timeout: u64) -> Result<u16> {
    Ok(curl_body(url, token, timeout)?.0)
}

fn curl_body(url: &str, token: Option<&str>, timeout: u64) -> Result<(u16, String)> {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-k",
        "--max-time",
        &timeout.to_string(),
        "-w",
        "\n%{http_code}",
    ]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let text = output(cmd.arg(url))?;
    let (body, code) = text.rsplit_once('\n').context("no status from curl")?;
    Ok((code.trim().parse().context("HTTP status")?, body.to_owned()))
}

/// The `podman`-visible facts of a running container's process, from /proc and its
/// memory cgroup.
fn process_facts(pid: u32) -> Result<BTreeMap<String, String>> {
    let mut f = BTreeMap::new();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    for l in status.lines() {
        if let Some((k, v)) = l.split_once(':')
            && [
                "Uid",
                "Gid",
                "CapEff",
                "CapPrm",
                "CapBnd",
                "NoNewPrivs",
                "Seccomp",
            ]
            .contains(&k)
        {
            f.insert(
                k.to_owned(),
                v.split_whitespace().collect::<Vec<_>>().join(" "),
            );
        }
    }
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    for l in mountinfo.lines() {
        let fields: Vec<&str> = l.split_whitespace().collect();
        if fields.len() > 5 && (fields[4] == "/" || fields[4] == SA_DIR) {
            f.insert(format!("mount {}", fields[4]), fields[5].to_owned());
        }
    }
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    if let Some(path) = cgroup.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (_, ctrl, path) = (p.next()?, p.next()?, p.next()?);
        ctrl.split(',')
            .any(|c| c == "memory")
            .then(|| path.to_owned())
    }) {
        let limit =
            std::fs::read_to_string(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"))
                .unwrap_or_default();
        f.insert("memory.limit_in_bytes".into(), limit.trim().to_owned());
    }
    Ok(f)
}

// ---------------------------------------------------------------------------
// the cluster side

fn get_json(cp: &ControlPlane, args: &[&str]) -> Result<Value> {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend(["-o", "json"]);
    Ok(serde_json::from_str(&cp.kubectl_ok(&a)?)?)
}

fn apply(cp: &ControlPlane, dir: &Path, file: &str, objs: &[Value]) -> Result<()> {
    let mut text = String::new();
    for o in objs {
        text.push_str("---\n");
        text.push_str(&serde_json::to_string(o)?);
        text.push('\n');
    }
    let p = dir.join(file);
    std::fs::write(&p, text)?;
    cp.kubectl_ok(&["apply", "--server-side", "-f", &p.to_string_lossy()])
        .map(drop)
}

/// The ServiceAccount volume a kubelet projects for `pod`: a token from the TokenRequest
/// API bound to the Pod, the cluster's CA (the `kube-root-ca.crt` ConfigMap every
/// namespace gets) and the namespace; files 0644 (the volume's defaultMode), read-only.
fn service_account_volume(cp: &ControlPlane, dir: &Path, pod: &Value) -> Result<PathBuf> {
    let f = PodFacts::from_pod(pod);
    let sa = str_at(pod, &["spec", "serviceAccountName"]);
    let token = cp.kubectl_ok(&[
        "create",
        "token",
        sa,
        "-n",
        &f.namespace,
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        &f.name,
        "--bound-object-uid",
        &f.uid,
        "--duration",
        "3607s",
    ])?;
    let ca = get_json(cp, &["configmap", "kube-root-ca.crt", "-n", &f.namespace])?;
    let vol = dir.join(format!("sa-{}", f.name));
    std::fs::create_dir_all(&vol)?;
    for (file, text) in [
        ("token", token.trim()),
        ("ca.crt", str_at(&ca, &["data", "ca.crt"])),
        ("namespace", f.namespace.as_str()),
    ] {
        if text.is_empty() {
            bail!("nothing to write to {file}");
        }
        std::fs::write(vol.join(file), text)?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o755))?;
    for file in ["token", "ca.crt", "namespace"] {
        std::fs::set_permissions(vol.join(file), std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(vol)
}

fn rc_count(cp: &ControlPlane, ns: &str) -> Result<usize> {
    let l = get_json(cp, &["rayclusters.ray.io", "-n", ns])?;
    Ok(l["items"].as_array().map_or(0, Vec::len))
}

async fn create(api: &Api<DynamicObject>, v: Value) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(v)?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

async fn plan_status(client: &Client, ns: &str) -> Result<Value> {
    Ok(serde_json::to_value(
        plan_api(client, ns).get("llm").await?,
    )?)
}

async fn wait_phase(client: &Client, ns: &str, want: &str) -> Result<Value> {
    wait_for(&format!("UpgradePlan llm in phase {want}"), T, || async {
        let p = plan_status(client, ns).await?;
        let phase = str_at(&p, &["status", "phase"]);
        Ok(if phase == want {
            Check::Done(p)
        } else {
            Check::NotYet(format!(
                "phase={phase} waitingFor={:?}",
                str_at(&p, &["status", "waitingFor"])
            ))
        })
    })
    .await
}

async fn wait_completed_after(client: &Client, ns: &str, after: &str) -> Result<String> {
    wait_for("UpgradePlan llm Completed with a new change", T, || async {
        let p = plan_status(client, ns).await?;
        let fp = str_at(&p, &["status", "lastTransition", "fingerprint"]);
        Ok(
            if str_at(&p, &["status", "phase"]) == "Completed" && fp != after {
                Check::Done(fp.to_owned())
            } else {
                Check::NotYet(format!("{} {fp}", str_at(&p, &["status", "phase"])))
            },
        )
    })
    .await
}

async fn gate(client: &Client, ns: &str) -> Result<String> {
    let rs = serde_json::to_value(rs_api(client, ns).get("llm").await?)?;
    Ok(str_at(&rs, &["spec", "upgradeStrategy", "type"]).to_owned())
}

/// Changes the worker image: a rayClusterConfig change, a new RayCluster for KubeRay.
async fn bump_worker(client: &Client, ns: &str, image: &str) -> Result<()> {
    let rs = serde_json::to_value(rs_api(client, ns).get("llm").await?)?;
    let mut groups = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
    groups[0]["template"]["spec"]["containers"][0]["image"] = json!(image);
    let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
    rs_api(client, ns)
        .patch("llm", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn add_node(client: &Client, name: &str, gpus: u32) -> Result<()> {
    FakeNode::new(name)
        .cpu("32")
        .memory("256Gi")
        .gpu(gpus)
        .create(client)
        .await
        .map(drop)
}

fn lease_holder(cp: &ControlPlane, name: &str) -> Result<String> {
    let l = get_json(cp, &["lease", name, "-n", NS])?;
    Ok(str_at(&l, &["spec", "holderIdentity"]).to_owned())
}

/// The CapacityBuffer CRD as Karpenter's module ships it, when `e2e/setup` fetched it:
/// `--capacity-requests=true` watches CapacityBuffers.
fn capacity_buffer_crd() -> Option<PathBuf> {
    let mod_dir = cache_dir().join("go/mod/sigs.k8s.io");
    let entries = std::fs::read_dir(&mod_dir).ok()?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("karpenter@"))
        })
        .collect();
    dirs.sort();
    dirs.into_iter().rev().find_map(|d| {
        let crds = d.join("kwok/charts/crds");
        std::fs::read_dir(crds)
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().contains("capacitybuffers"))
            })
    })
}

/// The image repository `scripts/release` is run with (a local target: nothing is pushed).
const RELEASE_REPO: &str = "registry.example.com/raygate/raygate";

/// What `scripts/release` wrote, once per test process.
#[derive(Debug, Clone)]
struct Release {
    dir: PathBuf,
    digest: String,
}

fn release() -> Release {
    static DONE: Mutex<Option<Release>> = Mutex::new(None);
    let _ = image(); // one build at a time, and the cache warm
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = done.as_ref() {
        return r.clone();
    }
    let dir = tempfile::Builder::new()
        .prefix("raygate-release-")
        .tempdir()
        .expect("dir")
        .keep();
    let t0 = Instant::now();
    let env = output(
        Command::new(repo_root().join("scripts/release"))
            .arg("--out")
            .arg(&dir)
            .args(["--image", RELEASE_REPO, "--version", "0.1.0"])
            .env("RAYGATE_HELM", helm())
            .current_dir(repo_root())
            .stderr(Stdio::inherit()),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("release: scripts/release in {:?}:\n{env}", t0.elapsed());
    let digest = key(&env, "DIGEST").expect("DIGEST");
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    let r = Release { dir, digest };
    *done = Some(r.clone());
    r
}

// ---------------------------------------------------------------------------
// tests

/// The chart renders nothing this translation cannot carry, and a field it does not carry
/// fails it (so the chart and the suite cannot drift apart).
#[test]
fn the_translation_carries_every_rendered_field_and_refuses_others() {
    let cluster = Cluster {
        api_host: "kubernetes.default.svc",
        api_port: 6443,
        sa_dir: Some(Path::new("/tmp/sa")),
    };
    let pod = PodFacts {
        name: "rg-raygate-abc".into(),
        namespace: NS.into(),
        ..PodFacts::default()
    };
    let objs = render(&[]);
    let spec = pod_template(&objs).clone();
    let run = translate(&spec, &pod, &cluster).unwrap_or_else(|e| panic!("{e:#}"));
    let opts = run.options.join(" ");
    for want in [
        "--user 65532:65532",
        "--read-only --read-only-tmpfs=false",
        "--security-opt no-new-privileges",
        "--cap-drop ALL",
        "--memory 536870912",
        "--cpus 1",
        "--cpu-shares 102",
        "--env POD_NAME=rg-raygate-abc",
        "--env POD_NAMESPACE=raygate-system",
        "--stop-timeout 30",
        "--pull missing",
        &format!("--volume /tmp/sa:{SA_DIR}:ro"),
    ] {
        assert!(opts.contains(want), "{want:?} not in {opts}");
    }
    assert!(
        run.args.contains(&"--capacity-requests=true".to_owned()),
        "{:?}",
        run.args
    );
    assert_eq!(run.memory_limit, Some(512 << 20));
    assert_eq!(
        run.probes
            .iter()
            .map(|p| (p.kind.as_str(), p.path.as_str(), p.port))
            .collect::<Vec<_>>(),
        [
            ("livenessProbe", "/healthz", 8081),
            ("readinessProbe", "/readyz", 8081)
        ]
    );

    // What the chart can render that a kubelet would do and this test does not: each
    // must fail the translation, naming the field.
    let refused: &[(&[&str], &str)] = &[
        (
            &["--set", "metrics.certSecret=raygate-metrics-tls"],
            "spec.volumes",
        ),
        (
            &[
                "--set-json",
                r#"extraEnv=[{"name":"X","valueFrom":{"secretKeyRef":{"name":"s","key":"k"}}}]"#,
            ],
            "secretKeyRef",
        ),
        (
            &["--set", "securityContext.seccompProfile.type=Localhost"],
            "Localhost",
        ),
        (
            &[
                "--set-json",
                r#"livenessProbe={"exec":{"command":["true"]}}"#,
            ],
            "exec",
        ),
    ];
    for (values, field) in refused {
        let objs = render(values);
        let err = translate(pod_template(&objs), &pod, &cluster)
            .err()
            .unwrap_or_else(|| panic!("{values:?} should not translate"));
        assert!(format!("{err:#}").contains(field), "{values:?}: {err:#}");
    }
    // A field the chart does not render today.
    let mut grown = spec.clone();
    grown["containers"][0]["lifecycle"] = json!({"preStop": {"sleep": {"seconds": 5}}});
    let err = translate(&grown, &pod, &cluster).expect_err("lifecycle is not carried");
    assert!(
        format!("{err:#}").contains("spec.containers[0].lifecycle"),
        "{err:#}"
    );
    grown = spec.clone();
    grown["hostNetwork"] = json!(true);
    let err = translate(&grown, &pod, &cluster).expect_err("hostNetwork is not carried");
    assert!(format!("{err:#}").contains("spec.hostNetwork"), "{err:#}");
}

/// The image: one layer holding only the static binary, numeric non-root user, the
/// chart's entrypoint, OCI labels, no shell, under 40 MB; it runs read-only as 65532.
#[test]
fn the_image_is_one_static_binary_on_an_empty_base() {
    let img = image();
    let inspect: Value = serde_json::from_str(
        &podman(&["image", "inspect", &img.reference]).unwrap_or_else(|e| panic!("{e:#}")),
    )
    .expect("podman image inspect JSON");
    let i = &inspect[0];
    let cfg = &i["Config"];
    assert_eq!(cfg["User"], "65532:65532", "{cfg}");
    assert_eq!(cfg["Entrypoint"], json!(["/raygate", "run"]), "{cfg}");
    for l in [
        "org.opencontainers.image.title",
        "org.opencontainers.image.source",
        "org.opencontainers.image.licenses",
        "org.opencontainers.image.version",
        "org.opencontainers.image.revision",
    ] {
        assert!(
            cfg["Labels"][l].is_string(),
            "label {l} missing: {}",
            cfg["Labels"]
        );
    }
    assert!(
        cfg["Labels"].get("io.buildah.version").is_none(),
        "builder label: {}",
        cfg["Labels"]
    );
    let layers = i["RootFS"]["Layers"].as_array().map_or(0, Vec::len);
    assert_eq!(layers, 1, "one layer: {}", i["RootFS"]);
    let size = i["Size"].as_u64().expect("Size");
    eprintln!("image: {} id {} size {size} bytes", img.reference, img.id);
    assert!(
        size <= MAX_IMAGE_BYTES,
        "the image is {size} bytes, over {MAX_IMAGE_BYTES}"
    );

    // Its only file is /raygate (podman adds the mount points of /etc/hosts and the like
    // when it creates a container, so list the image's layer instead).
    let ctr = podman(&["create", &img.reference]).expect("podman create");
    let ctr = ctr.trim();
    let files = output(Command::new("sh").arg("-c").arg(format!(
        "podman {} export {ctr} | tar -t",
        PODMAN_GLOBAL.join(" ")
    )));
    let _ = podman(&["rm", "--force", ctr]);
    let files = files.unwrap_or_else(|e| panic!("{e:#}"));
    let mut files: Vec<&str> = files.lines().filter(|l| !l.ends_with('/')).collect();
    files.retain(|f| {
        ![
            "etc/hosts",
            "etc/resolv.conf",
            "etc/hostname",
            "run/.containerenv",
        ]
        .contains(f)
            && !f.starts_with("proc")
            && !f.starts_with("dev")
            && !f.starts_with("sys")
    });
    assert_eq!(files, ["raygate"], "files in the image");

    // It runs: read-only, as the chart's user, every capability dropped.
    let mut run = vec!["run", "--rm"];
    run.extend_from_slice(ULIMITS);
    run.extend([
        "--read-only",
        "--read-only-tmpfs=false",
        "--cap-drop",
        "ALL",
        "--network",
        "none",
        &img.reference,
        "--help",
    ]);
    let help = podman(&run).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(help.contains("--metrics-addr"), "{help}");
    // No shell to exec into.
    let mut sh = vec!["run", "--rm", "--entrypoint", "/bin/sh"];
    sh.extend_from_slice(ULIMITS);
    sh.push(&img.reference);
    assert!(podman(&sh).is_err(), "the image has a shell");
}

/// The chart's pod, run from the image: in-cluster config from the mounted ServiceAccount
/// token, the chart's RBAC only, its probes, its ServiceMonitor's scrape, its Lease; a
/// RayService upgrade on the real KubeRay held then completed by the container; a second
/// replica standing by and taking over when the first is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_pod_runs_from_the_image_and_gates_an_upgrade() {
    let img = image();
    let objs = render(&[]);
    let monitor_objs = render(&["--set", "serviceMonitor.enabled=true"]);
    let monitor = find(&monitor_objs, "ServiceMonitor").clone();
    let deploy = find(&objs, "Deployment").clone();
    let spec = pod_template(&objs).clone();
    // The chart's image reference, as rendered, names the image under test.
    let image_ref = spec["containers"][0]["image"]
        .as_str()
        .expect("the rendered container's image")
        .to_owned();
    podman(&["tag", &img.id, &image_ref]).unwrap_or_else(|e| panic!("{e:#}"));

    let cp = ControlPlane::start()
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    let scratch = tempfile::tempdir().expect("scratch dir");
    let client = cp.client().await.expect("client");
    let r = story(&cp, &client, scratch.path(), &objs, &deploy, &monitor).await;
    if let Err(e) = r {
        panic!("{e:#}");
    }
}

async fn story(
    cp: &ControlPlane,
    client: &Client,
    scratch: &Path,
    objs: &[Value],
    deploy: &Value,
    monitor: &Value,
) -> Result<()> {
    cp.kubectl_ok(&["create", "namespace", NS])?;
    for entry in std::fs::read_dir(repo_root().join("charts/raygate/crds"))? {
        cp.install_crd_file(&entry?.path())?;
    }
    match capacity_buffer_crd() {
        Some(crd) => cp.install_crd_file(&crd)?,
        None => eprintln!(
            "image: no CapacityBuffer CRD in the Go module cache (Karpenter's); not installed"
        ),
    }
    // One 8-GPU node: the chart's pods are placed there too (they ask for no GPU).
    add_node(client, "gpu-0", 8).await?;
    // Everything the chart renders, the Deployment included: its controller makes the
    // Pods (names, uids, the downward API's values), kube-scheduler places them.
    apply(cp, scratch, "chart.yaml", objs)?;
    let selector = deploy["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("Deployment selector")?
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(",");
    let replicas = deploy["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
    if replicas < 2 {
        bail!(
            "the chart's default replicaCount is {replicas}; this suite runs a leader and a standby"
        );
    }
    let pods = wait_for(
        "the chart's Pods scheduled and Running (kwok)",
        T,
        || async {
            let l = get_json(cp, &["pods", "-n", NS, "-l", &selector])?;
            let items: Vec<Value> = l["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|p| {
                    str_at(p, &["status", "phase"]) == "Running"
                        && !str_at(p, &["status", "podIP"]).is_empty()
                })
                .collect();
            Ok(if items.len() >= replicas {
                Check::Done(items)
            } else {
                Check::NotYet(format!("{} running", items.len()))
            })
        },
    )
    .await?;
    let api_port = cp.apiserver_port()?;
    let spec = &deploy["spec"]["template"]["spec"];
    let mut containers = vec![];
    for pod in pods.iter().take(2) {
        let vol = service_account_volume(cp, scratch, pod)?;
        let run = translate(
            spec,
            &PodFacts::from_pod(pod),
            &Cluster {
                api_host: "kubernetes.default.svc",
                api_port,
                sa_dir: Some(&vol),
            },
        )?;
        let c = Container::start(run)?;
        // The first leads: start the standby once it is ready.
        c.wait_ready()?;
        containers.push(c);
    }
    let (leader, standby) = (&containers[0], &containers[1]);
    let pod_name = |c: &Container| c.name.trim_end_matches("-raygate").to_owned();

    // The kernel's view of the leader's process: what the securityContext and resources asked.
    let facts = process_facts(leader.pid()?)?;
    eprintln!("image: leader process {facts:?}");
    let want = [
        ("Uid", "65532 65532 65532 65532"),
        ("Gid", "65532 65532 65532 65532"),
        ("CapEff", "0000000000000000"),
        ("CapBnd", "0000000000000000"),
        ("NoNewPrivs", "1"),
        ("Seccomp", "2"),
    ];
    for (k, v) in want {
        if facts.get(k).map(String::as_str) != Some(v) {
            bail!("{k}: want {v}, the process has {:?}", facts.get(k));
        }
    }
    for m in ["mount /", &format!("mount {SA_DIR}")] {
        if !facts
            .get(m)
            .is_some_and(|o| o.split(',').any(|x| x == "ro"))
        {
            bail!("{m} is not read-only: {:?}", facts.get(m));
        }
    }
    let limit = leader
        .run
        .memory_limit
        .context("the chart sets a memory limit")?;
    if facts.get("memory.limit_in_bytes") != Some(&limit.to_string()) {
        bail!(
            "memory cgroup limit {:?}, the chart asks {limit}",
            facts.get("memory.limit_in_bytes")
        );
    }

    // The probes, as the chart asks (path, port, scheme), on both replicas, judged as a
    // kubelet judges them: a failure counts only failureThreshold times in a row.
    for c in &containers {
        for p in &c.run.probes {
            let mut seen = vec![];
            while seen.len() < p.failure_threshold as usize {
                match c.probe(p) {
                    Ok(code) if (200..400).contains(&code) => break,
                    r => seen.push(format!("{r:?}")),
                }
                std::thread::sleep(Duration::from_secs(p.period));
            }
            if seen.len() >= p.failure_threshold as usize {
                bail!(
                    "{} {} {}://:{}{} failed {} times in a row: {seen:?}",
                    c.name,
                    p.kind,
                    p.scheme,
                    p.port,
                    p.path,
                    seen.len()
                );
            }
            if !seen.is_empty() {
                eprintln!("image: {} {}: {seen:?} before a success", c.name, p.kind);
            }
        }
    }

    // The chart's Lease, held by the first Pod.
    let lease = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .find_map(|s| s.strip_prefix("--lease-name="))
        })
        .context("the chart passes --lease-name")?
        .to_owned();
    let first = pod_name(leader);
    wait_for("the chart's Lease held by the first pod", T, || async {
        let h = lease_holder(cp, &lease)?;
        Ok(if h == first {
            Check::Done(())
        } else {
            Check::NotYet(h)
        })
    })
    .await?;

    // The demo's story on the real KubeRay: an upgrade that does not fit is held, then
    // completes when a node is added.
    let ns = create_namespace(client, "img").await?;
    create(
        &plan_api(client, &ns),
        json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan", "metadata": {"name": "llm"},
               "spec": {"rayServiceRef": {"name": "llm"}}}),
    )
    .await?;
    create(
        &rs_api(client, &ns),
        GpuRayService::new("llm", "rayproject/ray:2.9.0-gpu")
            .gpus(6)
            .serve_deployment("LLM")
            .build(),
    )
    .await?;
    wait_phase(client, &ns, "Idle").await?;
    if gate(client, &ns).await? != "None" {
        bail!("the gate is not closed once the plan is Idle");
    }
    bump_worker(client, &ns, "rayproject/ray:2.10.0-gpu").await?;
    let held = wait_phase(client, &ns, "WaitingForCapacity").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    if rc_count(cp, &ns)? != 1 || gate(client, &ns).await? != "None" {
        bail!("held, yet a second RayCluster or an open gate");
    }
    eprintln!("image: held: {}", str_at(&held, &["status", "waitingFor"]));

    // /metrics as the ServiceMonitor scrapes it: the Service's port by name, the
    // container's port, its scheme, path, TLS settings and a bearer token of a
    // ServiceAccount bound to the chart's metrics-reader ClusterRole.
    let ep = &monitor["spec"]["endpoints"][0];
    let svc = find(objs, "Service");
    let svc_port = svc["spec"]["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == ep["port"]))
        .context("the ServiceMonitor's port is not the Service's")?;
    let target = svc_port["targetPort"]
        .as_str()
        .context("targetPort by name")?;
    let container_port = *leader
        .run
        .ports
        .get(target)
        .context("the Service's targetPort is no container port")?;
    let scheme = ep["scheme"].as_str().unwrap_or("http");
    let token_file = format!("{SA_DIR}/token");
    if ep["tlsConfig"]["insecureSkipVerify"] != json!(true)
        || ep["bearerTokenFile"].as_str() != Some(token_file.as_str())
    {
        bail!("the ServiceMonitor scrapes differently from what this test does: {ep}");
    }
    let reader = objs
        .iter()
        .find(|o| {
            kind(o) == "ClusterRole"
                && str_at(o, &["metadata", "name"]).ends_with("-metrics-reader")
        })
        .context("the chart's metrics-reader ClusterRole")?;
    let reader = str_at(reader, &["metadata", "name"]);
    cp.kubectl_ok(&["create", "namespace", "monitoring"])?;
    cp.kubectl_ok(&["create", "serviceaccount", "prometheus", "-n", "monitoring"])?;
    cp.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "prometheus-raygate",
        "--clusterrole",
        reader,
        "--serviceaccount",
        "monitoring:prometheus",
    ])?;
    let prom = cp.kubectl_ok(&[
        "create",
        "token",
        "prometheus",
        "-n",
        "monitoring",
        "--duration=1h",
    ])?;
    let timeout = ep["scrapeTimeout"]
        .as_str()
        .and_then(|s| s.strip_suffix('s'))
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let url = |c: &Container| {
        format!(
            "{scheme}://127.0.0.1:{}{}",
            c.host_port(container_port),
            ep["path"].as_str().unwrap_or("/metrics")
        )
    };
    let (code, body) = curl_body(&url(leader), Some(prom.trim()), timeout)?;
    let phase_line = format!(
        "raygate_upgradeplan_phase{{namespace=\"{ns}\",phase=\"WaitingForCapacity\",rayservice=\"llm\",upgradeplan=\"llm\"}} 1"
    );
    if code != 200 || !body.contains(&phase_line) {
        bail!("the leader's /metrics answered {code} without {phase_line}:\n{body}");
    }
    let (code, body) = curl_body(&url(standby), Some(prom.trim()), timeout)?;
    if code != 200 || !body.contains("raygate_build_info") {
        bail!("the standby's /metrics answered {code}:\n{body}");
    }
    let (code, _) = curl_body(&url(leader), None, timeout)?;
    if code != 401 {
        bail!("/metrics without a token answered {code}, not 401");
    }

    // Capacity arrives: the containerised raygate admits the upgrade; it completes.
    add_node(client, "gpu-1", 8).await?;
    let done = wait_completed_after(client, &ns, "").await?;
    if rc_count(cp, &ns)? != 1 {
        bail!("after completion, not one RayCluster");
    }
    if standby.logs().contains("status updated") {
        bail!("the standby wrote status:\n{}", standby.logs());
    }

    // The leader is killed (a crash, an OOM kill): the standby takes the Lease and gates
    // the next upgrade.
    leader.kill()?;
    let second = pod_name(standby);
    let t0 = Instant::now();
    wait_for("the standby holding the chart's Lease", T, || async {
        let h = lease_holder(cp, &lease)?;
        Ok(if h == second {
            Check::Done(())
        } else {
            Check::NotYet(h)
        })
    })
    .await?;
    eprintln!(
        "image: the standby took the Lease {:?} after the kill",
        t0.elapsed()
    );
    bump_worker(client, &ns, "rayproject/ray:2.11.0-gpu").await?;
    wait_completed_after(client, &ns, &done).await?;
    if !standby.logs().contains("status updated") {
        bail!("the new leader wrote no status:\n{}", standby.logs());
    }

    // A kubelet stops a container with SIGTERM and kills it after the Pod's grace period:
    // raygate (PID 1 in its container) must exit within it and give the Lease back.
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    let t0 = Instant::now();
    podman(&["stop", "--time", &grace.to_string(), &standby.name])?;
    let took = t0.elapsed();
    let code = podman(&["inspect", "--format", "{{.State.ExitCode}}", &standby.name])?;
    eprintln!("image: SIGTERM: exit code {} after {took:?}", code.trim());
    if took >= Duration::from_secs(grace) || code.trim() != "0" {
        bail!(
            "SIGTERM: exit code {} after {took:?} (grace {grace} s); log:\n{}",
            code.trim(),
            standby.logs()
        );
    }
    let holder = lease_holder(cp, &lease)?;
    if holder == second {
        bail!("the stopped leader did not give the Lease back");
    }

    // The released chart (scripts/release, pinned to the image's digest) installs on this
    // apiserver: `helm install --dry-run=server` (the chart's objects as the apiserver would
    // admit them, in a namespace of their own).
    let rel = release();
    let chart = rel.dir.join("raygate-0.1.0.tgz");
    let dry = output(
        Command::new(helm())
            .args(["install", "rel"])
            .arg(&chart)
            .args([
                "--namespace",
                "raygate-release",
                "--create-namespace",
                "--dry-run=server",
            ])
            .env("KUBECONFIG", cp.kubeconfig_path()),
    )?;
    let pinned = format!("image: \"{RELEASE_REPO}@{}\"", rel.digest);
    if !dry.contains(&pinned) {
        bail!("helm install --dry-run=server of the released chart has no {pinned}:\n{dry}");
    }

    // The chart's RBAC was enough: nothing was refused.
    for c in &containers {
        let text = c.logs();
        for bad in ["forbidden", "Forbidden", "\"code\":403", " 403 "] {
            if text.contains(bad) {
                bail!("{} logged {bad:?} with the chart's RBAC:\n{text}", c.name);
            }
        }
    }
    Ok(())
}

/// `scripts/release` end to end with a local target: the image in an OCI archive, the chart
/// pinned to that image's digest (rendered by `helm template` and `helm install --dry-run`),
/// the static plugin in its archive and the krew manifest with its checksum.
#[test]
fn the_release_script_pins_the_chart_to_the_image_digest() {
    let rel = release();
    let (dir, digest, repo) = (rel.dir.as_path(), rel.digest.as_str(), RELEASE_REPO);

    // The archive's manifest is the digest the chart pins.
    let archive = dir.join("raygate-image-0.1.0.oci.tar");
    let index: Value = serde_json::from_str(
        &output(
            Command::new("tar")
                .arg("-xOf")
                .arg(&archive)
                .arg("index.json"),
        )
        .expect("index.json"),
    )
    .expect("index.json JSON");
    assert_eq!(index["manifests"][0]["digest"], digest, "{index}");
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        format!("{repo}:0.1.0")
    );

    let chart = dir.join("raygate-0.1.0.tgz");
    let objs = render_chart(&chart.to_string_lossy(), &[]);
    let pinned = format!("{repo}@{digest}");
    assert_eq!(
        pod_template(&objs)["containers"][0]["image"],
        pinned.as_str()
    );
    // The plugin: a static binary and the license; the krew manifest names its checksum.
    let plugin = dir.join("kubectl-raygate_0.1.0_linux_amd64.tar.gz");
    let listing = output(Command::new("tar").arg("-tzf").arg(&plugin)).expect("tar");
    assert_eq!(
        listing.lines().collect::<Vec<_>>(),
        ["LICENSE", "kubectl-raygate"]
    );
    // It is raygate's own binary, and started under the plugin's name it is the plugin:
    // what `kubectl raygate` runs once krew installed the archive.
    let unpacked = tempfile::tempdir().expect("tempdir");
    output(
        Command::new("tar")
            .arg("-xzf")
            .arg(&plugin)
            .arg("-C")
            .arg(unpacked.path()),
    )
    .expect("untar the plugin");
    let help = output(Command::new(unpacked.path().join("kubectl-raygate")).arg("--help"))
        .expect("kubectl-raygate --help");
    assert!(
        help.contains("raygate's commands for a live cluster")
            && help.contains("Usage: kubectl raygate <COMMAND>"),
        "{help}"
    );
    let sum = output(Command::new("sha256sum").arg(&plugin)).expect("sha256sum");
    let sum = sum.split_whitespace().next().unwrap_or_default();
    let krew =
        docs(&std::fs::read_to_string(dir.join("raygate.krew.yaml")).expect("krew manifest"));
    let p = &krew[0]["spec"]["platforms"][0];
    assert_eq!(p["sha256"], sum, "{p}");
    assert_eq!(p["bin"], "kubectl-raygate");
    assert!(
        p["uri"]
            .as_str()
            .is_some_and(|u| u.ends_with("kubectl-raygate_0.1.0_linux_amd64.tar.gz")),
        "{p}"
    );
    assert_eq!(krew[0]["spec"]["version"], "v0.1.0");
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).expect("SHA256SUMS");
    assert!(sums.contains(sum), "{sums}");
}
