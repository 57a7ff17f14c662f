//! `kubectl raygate` against a real kube-apiserver: the plugin binary
//! (`kubectl-raygate`, built by `cargo build --workspace --bins`).
//!
//! `approve`, `pause`, `resume` and `queue` write and read real UpgradePlans;
//! they need no KubeRay, so that control plane runs without it and a plan's
//! status is written as raygate would. `explain -f` and `fit -f` read what the
//! real KubeRay operator made of a RayService (its status, its RayCluster),
//! kwok's nodes and the pods the scheduler bound, and raygate's gate and plan.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::json::str_at;
use raygate_e2e::{
    Check, ControlPlane, FakeNode, KubeRay, Options, Raygate, create_namespace, wait_for,
    workspace_bin,
};
use serde_json::{Value, json};

fn plans(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("raygate.io", "v1alpha1", "UpgradePlan");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn plugin(cp: &ControlPlane, args: &[&str]) -> (i32, String, String) {
    let kubeconfig = cp.kubeconfig_path().to_string_lossy().into_owned();
    let mut all = args.to_vec();
    all.extend(["--kubeconfig", &kubeconfig]);
    run_plugin(&all, None)
}

/// `kubectl-raygate ARGS` with `KUBECONFIG` set (or removed), HOME elsewhere,
/// so nothing but the arguments and that variable say which cluster to use.
fn run_plugin(args: &[&str], kubeconfig_env: Option<&Path>) -> (i32, String, String) {
    let bin = workspace_bin("kubectl-raygate")
        .expect("kubectl-raygate binary (cargo build --workspace --bins)");
    let home = tempfile::tempdir().expect("home");
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env("HOME", home.path())
        .env_remove("KUBECONFIG");
    if let Some(k) = kubeconfig_env {
        cmd.env("KUBECONFIG", k);
    }
    let out = cmd.output().expect("run kubectl-raygate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn create_plan(
    api: &Api<DynamicObject>,
    name: &str,
    priority: i64,
    detected: &str,
    fp: &str,
) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
        "metadata": {"name": name},
        "spec": {"rayServiceRef": {"name": name}, "policy": "Manual", "priority": priority},
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create plan");
    let status = json!({"status": {
        "phase": "WaitingForCapacity",
        "waitingFor": "capacity: nvidia.com/gpu 8",
        "pendingChange": {"fingerprint": fp, "detectedTime": detected,
            "triggeringPaths": ["workerGroupSpecs[gpu].template.spec.containers[ray-worker].image"]},
        "capacity": {"needed": {"nvidia.com/gpu": "16"}, "available": {"nvidia.com/gpu": "8"},
            "shortfall": {"nvidia.com/gpu": "8"}, "gpusNeeded": "16", "gpusFree": "8", "gpusShort": "8"},
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("write status");
}

async fn get(api: &Api<DynamicObject>, name: &str) -> Value {
    serde_json::to_value(api.get(name).await.expect("get plan")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_pause_resume_and_queue_on_a_real_apiserver() {
    let cp = ControlPlane::start_with(Options {
        kuberay: KubeRay::None,
        crds: true,
    })
    .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))
        .expect("install the UpgradePlan CRD");
    let client = cp.client().await.expect("client");
    let ns = create_namespace(&client, "cli").await.expect("namespace");
    let api = plans(&client, &ns);
    create_plan(&api, "chat", 0, "2026-12-02T10:00:00Z", "6aca5d208cb0").await;
    create_plan(&api, "embed", 5, "2026-12-02T11:00:00Z", "0123456789ab").await;

    // approve: names the change and what it needs, writes spec.approve.
    let (code, out, err) = plugin(&cp, &["approve", "chat", "-n", &ns]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("change 6aca5d208cb0"), "{out}");
    assert!(out.contains("Needs:        nvidia.com/gpu 16"), "{out}");
    // No controller here reconciles the approval: the phase printed says it is
    // the one from before (issue 32, item 7), after a bounded wait.
    assert!(out.contains("(before the approval:"), "{out}");
    assert!(
        out.contains("workerGroupSpecs[gpu].template.spec.containers[ray-worker].image"),
        "{out}"
    );
    let p = get(&api, "chat").await;
    assert_eq!(p["spec"]["approve"], "6aca5d208cb0");
    let managers: Vec<&str> = p["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert!(managers.contains(&"kubectl-raygate"), "{managers:?}");
    // A fingerprint that is not pending is refused, exit 1; a missing plan too.
    let (code, _, err) = plugin(
        &cp,
        &[
            "approve",
            "chat",
            "-n",
            &ns,
            "--fingerprint",
            "ffffffffffff",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("the pending change is 6aca5d208cb0"), "{err}");
    let (code, _, err) = plugin(&cp, &["approve", "nope", "-n", &ns]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not found"), "{err}");

    // pause keeps the policy, resume restores it.
    let (code, _, err) = plugin(&cp, &["pause", "chat", "-n", &ns]);
    assert_eq!(code, 0, "{err}");
    let p = get(&api, "chat").await;
    assert_eq!(p["spec"]["policy"], "Paused");
    assert_eq!(
        p["metadata"]["annotations"]["raygate.io/paused-policy"],
        "Manual"
    );
    let (code, _, err) = plugin(&cp, &["resume", "chat", "-n", &ns]);
    assert_eq!(code, 0, "{err}");
    let p = get(&api, "chat").await;
    assert_eq!(p["spec"]["policy"], "Manual");
    assert!(
        p["metadata"]["annotations"]
            .get("raygate.io/paused-policy")
            .is_none()
    );

    // queue: priority first, then waiting time.
    let (code, out, err) = plugin(&cp, &["queue", "-n", &ns, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let q: Value = serde_json::from_str(&out).expect("queue json");
    let names: Vec<&str> = q["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["embed", "chat"]);
    let (code, out, err) = plugin(&cp, &["queue", "-A"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().next().unwrap_or_default().contains("NAMESPACE"),
        "{out}"
    );
    assert!(out.contains(&ns), "{out}");
}

// ------------------------------------------------------------ explain, fit

const T: Duration = Duration::from_secs(120);
const IMAGE_PATH: &str = "workerGroupSpecs[gpu-workers].template.spec.containers[ray-worker].image";

/// A RayService manifest as a user keeps it: one 8-GPU worker, one Serve app.
fn manifest(image: &str, route: &str) -> String {
    format!(
        r#"apiVersion: ray.io/v1
kind: RayService
metadata:
  name: chat
spec:
  rayClusterDeletionDelaySeconds: 2
  serveConfigV2: |
    applications:
      - name: chat
        import_path: chat.serve:app
        route_prefix: {route}
  rayClusterConfig:
    rayVersion: "2.9.0"
    headGroupSpec:
      rayStartParams: {{num-gpus: "0"}}
      template:
        spec:
          containers:
            - name: ray-head
              image: rayproject/ray:2.9.0
              resources:
                requests: {{cpu: "2", memory: 8Gi}}
                limits: {{cpu: "2", memory: 8Gi}}
    workerGroupSpecs:
      - groupName: gpu-workers
        replicas: 1
        minReplicas: 1
        maxReplicas: 4
        rayStartParams: {{}}
        template:
          spec:
            containers:
              - name: ray-worker
                image: {image}
                resources:
                  requests: {{cpu: "8", memory: 64Gi}}
                  limits: {{nvidia.com/gpu: "8"}}
"#
    )
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

fn ray_api(client: &kube::Client, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("ray.io", "v1", kind);
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

async fn gpu_node(client: &kube::Client, name: &str) {
    FakeNode::new(name)
        .cpu("32")
        .memory("256Gi")
        .gpu(8)
        .create(client)
        .await
        .expect("node");
}

/// A kubeconfig with a second context, `live`, whose namespace is `ns`.
fn kubeconfig_with_context(cp: &ControlPlane, ns: &str, dir: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(cp.kubeconfig_path()).expect("kubeconfig");
    let mut kc: Value = serde_saphyr::from_str(&text).expect("kubeconfig YAML");
    let mut ctx = kc["contexts"][0].clone();
    ctx["name"] = json!("live");
    ctx["context"]["namespace"] = json!(ns);
    kc["contexts"].as_array_mut().expect("contexts").push(ctx);
    let path = dir.join("kubeconfig");
    std::fs::write(&path, kc.to_string()).expect("write kubeconfig");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_and_fit_read_the_live_rayservice_its_cluster_and_the_nodes() {
    let cp = ControlPlane::start()
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    let client = cp.client().await.expect("client");
    let ns = create_namespace(&client, "live").await.expect("namespace");
    gpu_node(&client, "gpu-0").await;
    let dir = tempfile::tempdir().expect("dir");
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write manifest");
        p.to_string_lossy().into_owned()
    };
    let v1 = write("v1.yaml", &manifest("rayproject/ray:2.9.0-gpu", "/"));
    let v2 = write("v2.yaml", &manifest("rayproject/ray:2.10.0-gpu", "/"));
    let serve = write("serve.yaml", &manifest("rayproject/ray:2.9.0-gpu", "/chat"));

    // Before the RayService exists (and before raygate's CRD is installed):
    // applying it creates its first cluster, which fits on the one node.
    let (code, out, err) = plugin(&cp, &["explain", "-f", &v1, "-n", &ns, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v = json_of(&out);
    assert_eq!(v["verdict"], "Create", "{v}");
    assert_eq!(v["newCluster"]["requests"]["nvidia.com/gpu"], "8", "{v}");
    let (code, out, err) = plugin(&cp, &["fit", "-f", &v1, "-n", &ns, "--fail-if-no-fit"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("does not exist yet"), "{out}");

    // The real operator creates the cluster and makes it active.
    let applied = cp
        .kubectl(&["apply", "-n", &ns, "-f", &v1])
        .expect("kubectl apply");
    assert!(applied.status.success(), "{applied:?}");
    let services = ray_api(&client, &ns, "RayService", "rayservices");
    let active = wait_for("an active RayCluster", T, || async {
        let s = serde_json::to_value(services.get("chat").await?)?;
        let name = str_at(&s, &["status", "activeServiceStatus", "rayClusterName"]);
        Ok(if name.is_empty() {
            Check::NotYet(s["status"].to_string())
        } else {
            Check::Done(name.to_string())
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));

    // explain compares the file with that RayCluster.
    let (code, out, err) = plugin(&cp, &["explain", "-f", &v1, "-n", &ns]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("RayCluster {ns}/{active} (active, live)")),
        "{out}"
    );
    assert!(
        out.contains("NoChange"),
        "the applied file against its own cluster:\n{out}"
    );
    let (code, out, err) = plugin(&cp, &["explain", "-f", &v2, "-n", &ns, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v = json_of(&out);
    assert_eq!(v["verdict"], "NewCluster", "{v}");
    assert!(
        v["triggeringPaths"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p == IMAGE_PATH)),
        "{v}"
    );
    let (code, out, err) = plugin(&cp, &["explain", "-f", &serve, "-n", &ns, "-o", "yaml"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_saphyr::from_str(&out).expect("YAML");
    assert_eq!(v["verdict"], "ServeConfigUpdate", "{out}");
    // fit of what is already running (or only Serve changes): no new cluster, so
    // nothing to fit, even though the node has no GPU left for a second one.
    for (file, verdict) in [(&v1, "NoChange"), (&serve, "ServeConfigUpdate")] {
        let (code, out, err) = plugin(&cp, &["fit", "-f", file, "-n", &ns, "--fail-if-no-fit"]);
        assert_eq!(code, 0, "{verdict}: {out}{err}");
        assert!(
            out.contains("Fits:         yes: no new cluster is needed")
                && out.contains(&format!("Why:          verdict {verdict}: ")),
            "{out}"
        );
        let (_, out, _) = plugin(&cp, &["fit", "-f", file, "-n", &ns, "-o", "json"]);
        assert_eq!(json_of(&out)["newClusterNeeded"], false, "{out}");
    }

    // fit: the old cluster holds the node's 8 GPUs, so the new one does not fit.
    let (code, out, err) = plugin(&cp, &["fit", "-f", &v2, "-n", &ns, "-o", "json"]);
    assert_eq!(code, 0, "without --fail-if-no-fit: {err}");
    let v = json_of(&out);
    assert_eq!(v["fits"], false, "{v}");
    assert_eq!(v["shortfall"]["nvidia.com/gpu"], "8", "{v}");
    assert_eq!(v["oldRequests"]["nvidia.com/gpu"], "8", "{v}");
    let (code, _, err) = plugin(&cp, &["fit", "-f", &v2, "-n", &ns, "--fail-if-no-fit"]);
    assert_eq!(code, 3, "{err}");
    gpu_node(&client, "gpu-1").await;
    let (code, out, err) = plugin(&cp, &["fit", "-f", &v2, "-n", &ns, "--fail-if-no-fit"]);
    assert_eq!(code, 0, "{out}{err}");

    // kubeconfig and context as kubectl takes them: --context picks the
    // context's namespace, from --kubeconfig or from KUBECONFIG.
    let kubeconfig = kubeconfig_with_context(&cp, &ns, dir.path());
    let kc = kubeconfig.to_string_lossy().into_owned();
    let (code, out, err) = run_plugin(
        &[
            "explain",
            "-f",
            &v2,
            "--kubeconfig",
            &kc,
            "--context",
            "live",
            "-o",
            "json",
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["verdict"], "NewCluster", "{out}");
    let (code, out, err) = run_plugin(
        &["fit", "-f", &v2, "--context", "live", "-o", "json"],
        Some(&kubeconfig),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["fits"], true, "{out}");
    let (code, _, err) = run_plugin(
        &["explain", "-f", &v2, "--context", "nope"],
        Some(&kubeconfig),
    );
    assert_eq!(code, 1, "an unknown context is invalid input: {err}");
    // The file's namespace against -n, as kubectl apply checks it.
    let other = write(
        "other.yaml",
        &manifest("rayproject/ray:2.10.0-gpu", "/")
            .replace("  name: chat\n", "  name: chat\n  namespace: elsewhere\n"),
    );
    let (code, _, err) = plugin(&cp, &["explain", "-f", &other, "-n", &ns]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("does not match the namespace"), "{err}");
    // Usage, input and cluster errors: 2, 1, 4.
    let (code, _, err) = plugin(&cp, &["fit", "-n", &ns]);
    assert_eq!(code, 2, "no -f: {err}");
    let missing = dir.path().join("missing.yaml");
    let (code, _, err) = plugin(
        &cp,
        &["explain", "-f", &missing.to_string_lossy(), "-n", &ns],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("missing.yaml"), "{err}");
    let unreachable = dir.path().join("unreachable");
    let text = std::fs::read_to_string(cp.kubeconfig_path()).expect("kubeconfig");
    let mut kc: Value = serde_saphyr::from_str(&text).expect("kubeconfig YAML");
    kc["clusters"][0]["cluster"]["server"] = json!("https://127.0.0.1:1");
    std::fs::write(&unreachable, kc.to_string()).expect("write");
    for cmd in ["explain", "fit"] {
        let (code, _, err) = run_plugin(
            &[
                cmd,
                "-f",
                &v2,
                "-n",
                &ns,
                "--kubeconfig",
                &unreachable.to_string_lossy(),
            ],
            None,
        );
        assert_eq!(code, 4, "{cmd} against a closed port: {err}");
        assert!(
            err.contains("cannot reach the Kubernetes API server at https://127.0.0.1:1/"),
            "{cmd}: the server is named: {err}"
        );
    }

    // raygate gates the RayService: explain says what KubeRay does once it is
    // admitted, fit applies the plan's headroom.
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))
        .expect("install the UpgradePlan CRD");
    let plan: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
        "metadata": {"name": "chat"},
        // An integer, as in pod resources (x-kubernetes-int-or-string).
        "spec": {"rayServiceRef": {"name": "chat"}, "headroom": {"nvidia.com/gpu": 8}},
    }))
    .expect("plan");
    plans(&client, &ns)
        .create(&PostParams::default(), &plan)
        .await
        .expect("create plan");
    let _raygate = Raygate::spawn(&cp, &[]).unwrap_or_else(|e| panic!("{e:#}"));
    wait_for("raygate's gate", T, || async {
        let s = serde_json::to_value(services.get("chat").await?)?;
        let gate = str_at(&s, &["spec", "upgradeStrategy", "type"]).to_string();
        Ok(if gate == "None" {
            Check::Done(())
        } else {
            Check::NotYet(gate)
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let (code, out, err) = plugin(&cp, &["explain", "-f", &v2, "-n", &ns]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("raygate gates this RayService"), "{out}");
    assert!(out.contains("NewCluster"), "{out}");
    let (code, out, err) = plugin(&cp, &["fit", "-f", &v2, "-n", &ns, "--fail-if-no-fit"]);
    assert_eq!(code, 3, "8 GPUs free, 8 needed, 8 headroom: {out}{err}");
    assert!(out.contains(&format!("UpgradePlan:  {ns}/chat")), "{out}");
    // Policy Auto, no maintenance window: the plan holds nothing.
    let (code, out, err) = plugin(&cp, &["fit", "-f", &v2, "-n", &ns, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["holds"], json!([]), "{out}");
    // The controller's own decision on the live objects with the file's spec:
    // it waits for capacity (the headroom) and keeps the gate closed.
    let d = &json_of(&out)["decision"];
    assert_eq!(d["phase"], "WaitingForCapacity", "{out}");
    assert_eq!(d["gate"], "None", "{out}");
    // Paused: held whatever the capacity, and fit says so.
    let pause = json!({"spec": {"policy": "Paused"}});
    plans(&client, &ns)
        .patch("chat", &PatchParams::default(), &Patch::Merge(&pause))
        .await
        .expect("pause the plan");
    let (code, out, err) = plugin(&cp, &["fit", "-f", &v2, "-n", &ns, "-o", "json"]);
    assert_eq!(code, 0, "held, without --fail-if-no-fit: {err}");
    assert_eq!(json_of(&out)["holds"][0]["hold"], "Paused", "{out}");
    assert_eq!(json_of(&out)["decision"]["phase"], "Paused", "{out}");
    let (_, out, _) = plugin(&cp, &["fit", "-f", &v2, "-n", &ns]);
    assert!(out.contains("Held:"), "{out}");
    assert!(
        out.contains("Decision:     would be held: Paused (waiting for policy Paused)"),
        "{out}"
    );
}
