//! `kubectl raygate` against a real kube-apiserver: the plugin binary
//! (`kubectl-raygate`, built by `cargo build --workspace --bins`) writes and
//! reads real UpgradePlans. These commands need no KubeRay, so the control
//! plane runs without it; a plan's status is written as raygate would.

use std::process::Command;

use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::{ControlPlane, KubeRay, Options, create_namespace, workspace_bin};
use serde_json::{Value, json};

fn plans(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("raygate.io", "v1alpha1", "UpgradePlan");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn plugin(cp: &ControlPlane, args: &[&str]) -> (i32, String, String) {
    let bin = workspace_bin("kubectl-raygate")
        .expect("kubectl-raygate binary (cargo build --workspace --bins)");
    let out = Command::new(bin)
        .args(args)
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .output()
        .expect("run kubectl-raygate");
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
