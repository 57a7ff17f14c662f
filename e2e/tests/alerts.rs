//! The shipped alert rules, evaluated by a real Prometheus scraping a real
//! raygate during an upgrade that stalls under the real KubeRay operator
//! (its new cluster's Serve app fails in `ray-head`, the Ray stand-in).
//!
//! Only the rules' `for:` durations are shortened (minutes would make the test
//! slow); expressions, labels and annotations are the shipped ones. Needs
//! `e2e/setup`, `e2e/setup-tools` (Debian's prometheus package) and
//! `cargo build --workspace --bins`.

use anyhow::{Context, Result, bail};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::json::str_at;
use raygate_e2e::{Check, ControlPlane, FakeNode, Raygate, create_namespace, wait_for};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(120);
/// ray-head's control annotation: the Serve application status it reports.
const APP_STATUS: &str = "ray-head.e2e.raygate.dev/app-status";

/// Prometheus' configuration: the shipped rules, one scrape job for raygate's
/// `/metrics` at `target` (as the chart's ServiceMonitor: `honorLabels`). When
/// `/metrics` needs credentials, they go in this job (`authorization:`).
fn prometheus_config(target: &str) -> String {
    format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
         rule_files: [alerts.yaml]\n\
         scrape_configs:\n  - job_name: raygate\n    honor_labels: true\n    \
         static_configs: [{{targets: ['{target}']}}]\n"
    )
}

/// A Prometheus server on a free loopback port, killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    log: std::path::PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, scrape: &str) -> Result<Prometheus> {
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
        std::fs::write(dir.join("prometheus.yml"), prometheus_config(scrape))?;
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
        let body = out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or_default();
        if out.contains("Transfer-Encoding: chunked") {
            bail!("unexpected chunked answer");
        }
        Ok(serde_json::from_str(body)?)
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
    let rg = Raygate::spawn(&cp, &[]).unwrap_or_else(|e| panic!("{e:#}"));
    let prom_dir = cp.log_dir().join("prometheus");
    std::fs::create_dir_all(&prom_dir).expect("dir");
    let prom = Prometheus::start(&prom_dir, rg.metrics_addr()).expect("prometheus");

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
