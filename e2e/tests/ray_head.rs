//! `ray-head` against a real apiserver (no KubeRay operator): it routes by the Services and the
//! kwok-run head Pods it watches, answers as Ray's dashboard and Serve proxy, follows the
//! control annotations (RayCluster over RayService) and exits cleanly on SIGTERM.
//! Requests are sent exactly as Go's HTTP client sends them through `HTTP_PROXY`.
//!
//! Run: `e2e/setup` once, then `cargo test -p raygate-e2e --test ray_head`.

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use raygate_e2e::{
    Check, ControlPlane, FakeNode, Options, create_namespace, rand_suffix, wait_for,
};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);
const APP_STATUS: &str = "ray-head.e2e.raygate.dev/app-status";
const PROXY_HEALTHY: &str = "ray-head.e2e.raygate.dev/proxy-healthy";

struct RayHead {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl RayHead {
    fn start(kubeconfig: &std::path::Path) -> Result<RayHead> {
        let dir = tempfile::tempdir()?;
        let addr_file = dir.path().join("addr");
        let log = std::fs::File::create(dir.path().join("ray-head.log"))?;
        let child = Command::new(env!("CARGO_BIN_EXE_ray-head"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--deploy-delay",
                "1s",
                "--addr-file",
            ])
            .arg(&addr_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawn ray-head")?;
        let mut rh = RayHead {
            child,
            addr: String::new(),
            _dir: dir,
        };
        for _ in 0..300 {
            if let Ok(a) = std::fs::read_to_string(&addr_file)
                && !a.trim().is_empty()
            {
                rh.addr = a.trim().to_string();
                return Ok(rh);
            }
            if let Some(status) = rh.child.try_wait()? {
                bail!(
                    "ray-head exited during startup: {status}; log: {}",
                    rh.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("ray-head wrote no address within 30 s; log: {}", rh.log())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("ray-head.log")).unwrap_or_default()
    }

    /// SIGTERM, then the exit status.
    fn stop(&mut self) -> Result<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        for _ in 0..100 {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("ray-head did not exit within 5 s of SIGTERM")
    }
}

impl Drop for RayHead {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls the Serve proxy's health `url` through `proxy` until it answers `code`.
async fn health_is(proxy: &str, url: &str, code: u16) -> Result<()> {
    wait_for(&format!("{url} answers {code}"), T, || async {
        let got = via_proxy(proxy, "GET", url, None).await?.0;
        Ok(if got == code {
            Check::Done(())
        } else {
            Check::NotYet(format!("{got}"))
        })
    })
    .await
}

/// One request through the proxy, as Go's transport writes it: absolute-form request line.
async fn via_proxy(
    proxy: &str,
    method: &str,
    url: &str,
    body: Option<&str>,
) -> Result<(u16, String)> {
    let host = url
        .strip_prefix("http://")
        .and_then(|r| r.split('/').next())
        .context("url")?;
    let mut s = std::net::TcpStream::connect(proxy)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {url} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: Go-http-client/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let out = String::from_utf8_lossy(&out).to_string();
    let (head, rest) = out.split_once("\r\n\r\n").context("no header end")?;
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .context("status line")?
        .parse()?;
    Ok((code, rest.to_string()))
}

fn ray_api(client: &Client, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("ray.io", "v1", kind), plural);
    Api::namespaced_with(client.clone(), ns, &ar)
}

async fn annotate(
    api: &Api<DynamicObject>,
    name: &str,
    key: &str,
    value: Option<&str>,
) -> Result<()> {
    let patch = json!({"metadata": {"annotations": {key: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// A RayService-owned RayCluster, its head Service and head Pod (run by kwok), the way KubeRay
/// lays them out.
async fn ray_objects(client: &Client, ns: &str, node: &str) -> Result<String> {
    let rs = ray_api(client, ns, "RayService", "rayservices");
    let created: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": "svc"},
        "spec": {"serveConfigV2": "applications: []", "rayClusterConfig": {
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}}}}}
    }))?;
    let svc_obj = rs.create(&PostParams::default(), &created).await?;
    let rc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "svc-abc", "ownerReferences": [{
            "apiVersion": "ray.io/v1", "kind": "RayService", "name": "svc",
            "uid": svc_obj.metadata.uid, "controller": true}]},
        "spec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
            {"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}}}}
    }))?;
    ray_api(client, ns, "RayCluster", "rayclusters")
        .create(&PostParams::default(), &rc)
        .await?;
    let labels = json!({"ray.io/cluster": "svc-abc", "ray.io/node-type": "head"});
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "svc-abc-head-svc", "labels": labels},
        "spec": {"selector": labels, "ports": [
            {"name": "gcs-server", "port": 6379}, {"name": "dashboard", "port": 8265},
            {"name": "serve", "port": 8000, "targetPort": "serve"}]}
    }))?;
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &service)
        .await?;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "svc-abc-head", "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "ray-head", "image": "rayproject/ray:2.46.0",
            "ports": [{"name": "dashboard", "containerPort": 8265}, {"name": "serve", "containerPort": 8000}]}]}
    }))?;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pod).await?;
    wait_for("kwok runs the head pod", T, || async {
        let p = pods.get("svc-abc-head").await?;
        let st = p.status.unwrap_or_default();
        Ok(match (st.phase.as_deref(), st.pod_ip) {
            (Some("Running"), Some(ip)) if !ip.is_empty() => Check::Done(ip),
            other => Check::NotYet(format!("{other:?}")),
        })
    })
    .await
}

#[tokio::test]
async fn ray_head_answers_as_the_clusters_ray_head() {
    let cp = ControlPlane::start_with(Options::without_kuberay())
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    let mut rh = RayHead::start(cp.kubeconfig_path()).expect("ray-head starts");
    if let Err(e) = scenario(&cp, &rh).await {
        panic!("{e:#}\nray-head log:\n{}", rh.log());
    }
    let status = rh.stop().expect("ray-head stops");
    assert!(status.success(), "ray-head exit status {status}");
}

async fn scenario(cp: &ControlPlane, rh: &RayHead) -> Result<()> {
    let client = cp.client().await?;
    let node = format!("rh-{}", rand_suffix());
    FakeNode::new(&node)
        .cpu("8")
        .memory("32Gi")
        .create(&client)
        .await?;
    let ns = create_namespace(&client, "rh").await?;
    let ip = ray_objects(&client, &ns, &node).await?;
    let p = rh.addr.as_str();
    let dash =
        format!("http://svc-abc-head-svc.{ns}.svc.cluster.local:8265/api/serve/applications/");
    let health = format!("http://{ip}:8000/-/healthz");

    let (code, body) = wait_for("ray-head routes the head service", T, || async {
        let r = via_proxy(p, "GET", &format!("{dash}?api_type=declarative"), None).await?;
        Ok(if r.0 == 200 {
            Check::Done(r)
        } else {
            Check::NotYet(format!("{r:?}"))
        })
    })
    .await?;
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body)?;
    assert_eq!(v["applications"], json!({}), "{v}");
    let (code, _) = via_proxy(p, "GET", &health, None).await?;
    assert_eq!(code, 502, "no Serve proxy before the first deploy");

    let config = r#"{"applications":[{"name":"app1","import_path":"fruit.deployment_graph","route_prefix":"/","deployments":[{"name":"MangoStand","num_replicas":1}]}]}"#;
    assert_eq!(via_proxy(p, "PUT", &dash, Some(config)).await?.0, 200);
    assert_eq!(
        via_proxy(p, "PUT", &dash, Some(r#"{"applications":[{}]}"#))
            .await?
            .0,
        400
    );
    let (code, body) = via_proxy(p, "GET", &health, None).await?;
    assert_eq!((code, body.as_str()), (200, "success"));
    let (_, body) = via_proxy(p, "GET", &format!("{dash}?api_type=declarative"), None).await?;
    let v: Value = serde_json::from_str(&body)?;
    assert_eq!(v["applications"]["app1"]["status"], "DEPLOYING", "{v}");
    wait_for("app1 RUNNING", T, || async {
        let (_, body) = via_proxy(p, "GET", &dash, None).await?;
        let v: Value = serde_json::from_str(&body)?;
        let s = v["applications"]["app1"]["status"].clone();
        Ok(if s == "RUNNING" {
            Check::Done(())
        } else {
            Check::NotYet(s.to_string())
        })
    })
    .await?;

    // RayService annotations are the default for its clusters; the RayCluster's win.
    let rs = ray_api(&client, &ns, "RayService", "rayservices");
    let rc = ray_api(&client, &ns, "RayCluster", "rayclusters");
    annotate(&rs, "svc", APP_STATUS, Some("UNHEALTHY")).await?;
    annotate(&rs, "svc", PROXY_HEALTHY, Some("false")).await?;
    let v = status_is(p, &dash, "UNHEALTHY").await?;
    assert_eq!(
        v["applications"]["app1"]["deployments"]["MangoStand"]["status"],
        "UNHEALTHY"
    );
    // The two annotations are two writes: the stand-in may have read the first alone.
    health_is(p, &health, 503).await?;
    annotate(&rc, "svc-abc", APP_STATUS, Some("DEPLOY_FAILED")).await?;
    status_is(p, &dash, "DEPLOY_FAILED").await?;
    annotate(&rc, "svc-abc", APP_STATUS, None).await?;
    annotate(&rs, "svc", APP_STATUS, None).await?;
    annotate(&rs, "svc", PROXY_HEALTHY, None).await?;
    status_is(p, &dash, "RUNNING").await?;
    health_is(p, &health, 200).await?;

    // Unknown names and ports fail like a proxy that cannot connect.
    let unknown =
        format!("http://nope-head-svc.{ns}.svc.cluster.local:8265/api/serve/applications/");
    assert_eq!(via_proxy(p, "GET", &unknown, None).await?.0, 502);
    assert_eq!(
        via_proxy(p, "GET", "http://10.255.255.1:8000/-/healthz", None)
            .await?
            .0,
        502
    );

    let obs = observe(p)?;
    let row = obs
        .as_array()
        .and_then(|a| a.iter().find(|r| r["namespace"] == ns.as_str()))
        .context("cluster in /_e2e/clusters")?;
    assert_eq!(row["name"], "svc-abc");
    assert_eq!(row["configPuts"], 1, "{row}");
    assert_eq!(row["apps"]["app1"], "RUNNING");
    assert_eq!(row["lastConfig"]["applications"][0]["name"], "app1");
    Ok(())
}

async fn status_is(p: &str, dash: &str, want: &str) -> Result<Value> {
    wait_for(&format!("app1 {want}"), T, || async {
        let (_, body) = via_proxy(p, "GET", dash, None).await?;
        let v: Value = serde_json::from_str(&body)?;
        let s = v["applications"]["app1"]["status"].clone();
        Ok(if s == want {
            Check::Done(v)
        } else {
            Check::NotYet(s.to_string())
        })
    })
    .await
}

/// `GET /_e2e/clusters`, an origin-form request to ray-head itself.
fn observe(addr: &str) -> Result<Value> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let req = format!("GET /_e2e/clusters HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let out = String::from_utf8_lossy(&out).to_string();
    let (_, body) = out.split_once("\r\n\r\n").context("response")?;
    Ok(serde_json::from_str(body)?)
}
