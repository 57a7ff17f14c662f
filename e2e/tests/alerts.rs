//! The shipped alert rules, evaluated by a real Prometheus scraping a real
//! raygate during an upgrade that stalls under the real KubeRay operator
//! (its new cluster's Serve app fails in `ray-head`, the Ray stand-in).
//!
//! Prometheus scrapes as in a cluster: `/metrics` secure (raygate's default), HTTPS
//! verified against the CA of raygate's `--metrics-cert-dir` certificate, with a
//! ServiceAccount token bound to the shipped metrics-reader ClusterRole; a second job with
//! a token lacking that role is refused (403).
//!
//! Only the rules' `for:` durations are shortened (minutes would make the test
//! slow); expressions, labels and annotations are the shipped ones. Needs
//! `e2e/setup`, `e2e/setup-tools` (Debian's prometheus package) and
//! `cargo build --workspace --bins`.

use anyhow::{Context, Result};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::faults::metrics_certificates;
use raygate_e2e::json::str_at;
use raygate_e2e::{Check, ControlPlane, FakeNode, Raygate, create_namespace, wait_for};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(120);
/// ray-head's control annotation: the Serve application status it reports.
const APP_STATUS: &str = "ray-head.e2e.raygate.dev/app-status";

/// What Prometheus needs to scrape raygate's HTTPS `/metrics` as a cluster's Prometheus
/// does: the CA that signed raygate's certificate, the name in it, and a file holding a
/// ServiceAccount token.
struct Scrape<'a> {
    target: &'a str,
    ca_file: &'a Path,
    server_name: &'a str,
    token_file: &'a Path,
}

/// One scrape job of raygate's `/metrics` over verified TLS with a bearer token (as the
/// chart's ServiceMonitor: `honorLabels`, `bearerTokenFile`).
fn scrape_job(job: &str, s: &Scrape<'_>) -> String {
    format!(
        "  - job_name: {job}\n    honor_labels: true\n    scheme: https\n    \
         tls_config: {{ca_file: '{ca}', server_name: {name}}}\n    \
         authorization: {{type: Bearer, credentials_file: '{token}'}}\n    \
         static_configs: [{{targets: ['{target}']}}]\n",
        ca = s.ca_file.display(),
        name = s.server_name,
        token = s.token_file.display(),
        target = s.target,
    )
}

/// Prometheus' configuration: the shipped rules, the job `raygate` with a token allowed to
/// read `/metrics`, and the job `denied` with a valid token of a ServiceAccount without
/// that role (its name does not match the rules' `job=~".*raygate.*"`, so only `raygate`
/// counts for the down alert).
fn prometheus_config(allowed: &Scrape<'_>, denied: &Scrape<'_>) -> String {
    format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
         rule_files: [alerts.yaml]\n\
         scrape_configs:\n{}{}",
        scrape_job("raygate", allowed),
        scrape_job("denied", denied),
    )
}

/// A Prometheus server on a free loopback port, killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    log: std::path::PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, config: &str) -> Result<Prometheus> {
        let bin = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
            .into_iter()
            .find(|p| Path::new(p).is_file())
            .context("prometheus not installed: run e2e/setup-tools")?;
        let rules = std::fs::read_to_string(repo_root().join("config/prometheus/alerts.yaml"))?;
        let fast: String = rules
            .lines()
            .map(|l| match l.trim_start().strip_prefix("for:") {
                Some(_) => format!("{}for: 2s", &l[..l.len() - l.trim_start().len()]),
                None => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(dir.join("alerts.yaml"), fast)?;
        std::fs::write(dir.join("prometheus.yml"), config)?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let log = dir.join("prometheus.log");
        let file = std::fs::File::create(&log)?;
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("start prometheus")?;
        Ok(Prometheus { child, addr, log })
    }

    fn get(&self, path: &str) -> Result<Value> {
        let mut s = TcpStream::connect(&self.addr)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: prometheus\r\nConnection: close\r\n\r\n"
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            return Ok(serde_json::from_str(&dechunk(body)?)?);
        }
        Ok(serde_json::from_str(body)?)
    }
}

/// The payload of an HTTP/1.1 chunked body (larger API answers, e.g. /api/v1/targets).
fn dechunk(mut body: &str) -> Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").context("chunk size line")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("chunk size {size:?}"))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest.get(..size).context("chunk shorter than its size")?;
        out.push_str(chunk);
        body = rest.get(size + 2..).context("chunk without CRLF")?;
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "prometheus log {}:\n{}",
                self.log.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

fn or_panic<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}"))
}

/// ServiceAccount `default/sa` (bound to the shipped `raygate-metrics-reader` ClusterRole
/// when `reader`) and a file in `dir` with a token the apiserver issued it, as a
/// Prometheus pod's projected token.
fn scraper_token(cp: &ControlPlane, dir: &Path, sa: &str, reader: bool) -> Result<PathBuf> {
    cp.kubectl_ok(&["create", "serviceaccount", sa, "-n", "default"])?;
    if reader {
        let role = repo_root().join("config/rbac/metrics_reader_role.yaml");
        cp.kubectl_ok(&["apply", "-f", &role.to_string_lossy()])?;
        cp.kubectl_ok(&[
            "create",
            "clusterrolebinding",
            &format!("{sa}-reads-raygate"),
            "--clusterrole",
            "raygate-metrics-reader",
            "--serviceaccount",
            &format!("default:{sa}"),
        ])?;
    }
    let token = cp.kubectl_ok(&["create", "token", sa, "-n", "default", "--duration=1h"])?;
    let path = dir.join(format!("{sa}.token"));
    std::fs::write(&path, token)?;
    Ok(path)
}

fn ray_service(image: &str) -> Value {
    json!({
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": "llm"},
        "spec": {
            "rayClusterDeletionDelaySeconds": 2,
            "serveConfigV2": "applications:\n  - name: llm\n    import_path: serve_llm:app\n",
            "rayClusterConfig": {
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
                    "name": "ray-head", "image": "rayproject/ray:2.9.0",
                    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}]}}},
                "workerGroupSpecs": [{
                    "groupName": "gpu-workers", "replicas": 1, "minReplicas": 0, "maxReplicas": 2,
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{
                        "name": "ray-worker", "image": image,
                        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"nvidia.com/gpu": "4"}}}]}}
                }]
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upgrade_fires_the_stalled_alert_in_a_real_prometheus() {
    let cp = ControlPlane::start()
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))
        .expect("install the UpgradePlan CRD");
    let client = cp.client().await.expect("client");
    let ns = create_namespace(&client, "alerts")
        .await
        .expect("namespace");
    for name in ["gpu-0", "gpu-1"] {
        FakeNode::new(name)
            .cpu("32")
            .memory("256Gi")
            .gpu(8)
            .create(&client)
            .await
            .expect("node");
    }
    // raygate as deployed: /metrics over HTTPS with a certificate of our CA, each token
    // checked with the apiserver (TokenReview, SubjectAccessReview).
    let cert_dir = cp.log_dir().join("metrics-tls");
    let ca = or_panic(metrics_certificates(&cert_dir));
    let cert_arg = format!("--metrics-cert-dir={}", cert_dir.display());
    let rg = Raygate::spawn(&cp, &["--metrics-secure=true", &cert_arg])
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(rg.metrics_https(), "{}", rg.logs());
    let prom_dir = cp.log_dir().join("prometheus");
    std::fs::create_dir_all(&prom_dir).expect("dir");
    let (allowed, denied) = (
        or_panic(scraper_token(&cp, &prom_dir, "prometheus", true)),
        or_panic(scraper_token(&cp, &prom_dir, "tenant", false)),
    );
    let scrape = |token_file| Scrape {
        target: rg.metrics_addr(),
        ca_file: &ca,
        server_name: "localhost",
        token_file,
    };
    let config = prometheus_config(&scrape(&allowed), &scrape(&denied));
    let prom = Prometheus::start(&prom_dir, &config).expect("prometheus");
    let targets = or_panic(
        wait_for("both scrape jobs scraped once", T, || async {
            let v = prom.get("/api/v1/targets")?;
            let active = v["data"]["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let scraped = active.iter().filter(|t| t["health"] != "unknown").count();
            Ok(if active.len() == 2 && scraped == 2 {
                Check::Done(active)
            } else {
                Check::NotYet(format!("{active:?}"))
            })
        })
        .await,
    );
    let job = |name: &str| {
        targets
            .iter()
            .find(|t| t["labels"]["job"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no target of job {name}: {targets:?}"))
    };
    let (ok, no) = (job("raygate"), job("denied"));
    assert_eq!(
        ok["health"], "up",
        "the metrics-reader token is served: {ok}"
    );
    assert_eq!(no["health"], "down", "a token without the role: {no}");
    let last_error = no["lastError"].as_str().unwrap_or_default();
    assert!(last_error.contains("403"), "refused with 403: {no}");
    let up = |job: &str| {
        let v = prom
            .get(&format!("/api/v1/query?query=up%7Bjob%3D%22{job}%22%7D"))
            .unwrap_or_else(|e| panic!("query up: {e:#}"));
        v["data"]["result"][0]["value"][1].clone()
    };
    assert_eq!(up("raygate"), "1");
    assert_eq!(up("denied"), "0");

    let plans = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("raygate.io", "v1alpha1", "UpgradePlan"),
            "upgradeplans",
        ),
    );
    let plan: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
        "metadata": {"name": "llm"}, "spec": {"rayServiceRef": {"name": "llm"}}
    }))
    .expect("plan");
    plans
        .create(&PostParams::default(), &plan)
        .await
        .expect("create plan");
    let ray = |kind: &str, plural: &str| {
        Api::<DynamicObject>::namespaced_with(
            client.clone(),
            &ns,
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("ray.io", "v1", kind),
                plural,
            ),
        )
    };
    let services = ray("RayService", "rayservices");
    let clusters = ray("RayCluster", "rayclusters");
    let svc: DynamicObject =
        serde_json::from_value(ray_service("rayproject/ray:2.9.0-gpu")).expect("svc");
    services
        .create(&PostParams::default(), &svc)
        .await
        .expect("create RayService");

    let phase = |want: &'static str| {
        let plans = plans.clone();
        async move {
            wait_for(&format!("plan {want}"), T, || async {
                let p = serde_json::to_value(plans.get("llm").await?)?;
                let ph = str_at(&p, &["status", "phase"]).to_string();
                Ok(if ph == want {
                    Check::Done(p)
                } else {
                    Check::NotYet(format!("{ph}: {}", str_at(&p, &["status", "message"])))
                })
            })
            .await
        }
    };
    phase("Idle").await.unwrap_or_else(|e| panic!("{e:#}"));
    let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": [{
        "groupName": "gpu-workers", "replicas": 1, "minReplicas": 0, "maxReplicas": 2, "rayStartParams": {},
        "template": {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.10.0-gpu",
            "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"nvidia.com/gpu": "4"}}}]}}}]}}});
    // The new cluster comes up, but its Serve app fails: ray-head reports
    // DEPLOY_FAILED for every cluster of the RayService except the serving one,
    // whose own annotation keeps it RUNNING.
    let active = clusters
        .list(&Default::default())
        .await
        .expect("list clusters")
        .items
        .into_iter()
        .find_map(|c| c.metadata.name)
        .expect("the serving cluster");
    let running = json!({"metadata": {"annotations": {APP_STATUS: "RUNNING"}}});
    clusters
        .patch(&active, &PatchParams::default(), &Patch::Merge(&running))
        .await
        .expect("patch");
    let failing = json!({"metadata": {"annotations": {APP_STATUS: "DEPLOY_FAILED"}}});
    services
        .patch("llm", &PatchParams::default(), &Patch::Merge(&failing))
        .await
        .expect("patch");
    services
        .patch("llm", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");
    let stalled = phase("Stalled").await.unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        str_at(&stalled, &["status", "message"]).contains("ServeNotHealthy"),
        "{}",
        stalled["status"]
    );

    let alert = wait_for(
        "RayServiceUpgradeStalled firing in Prometheus",
        T,
        || async {
            let v = prom.get("/api/v1/alerts")?;
            let alerts = v["data"]["alerts"].as_array().cloned().unwrap_or_default();
            let firing = alerts.iter().find(|a| {
                a["labels"]["alertname"] == "RayServiceUpgradeStalled" && a["state"] == "firing"
            });
            Ok(match firing {
                Some(a) => Check::Done(a.clone()),
                None => Check::NotYet(format!("{alerts:?}")),
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(alert["labels"]["upgradeplan"], "llm");
    assert_eq!(alert["labels"]["namespace"], ns.as_str());
    assert_eq!(alert["labels"]["severity"], "critical");
    let description = alert["annotations"]["description"]
        .as_str()
        .unwrap_or_default();
    assert!(description.contains(&format!("{ns}/llm")), "{description}");
    assert!(
        alert["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default()
            .contains("runbooks.md#rayserviceupgradestalled"),
        "{alert}"
    );
}
