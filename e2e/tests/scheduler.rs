//! Scheduler conformance on Kubernetes v1.36: `raygate fit` against the real kube-scheduler
//! for what current clusters have and raygate's capacity model must match: restartable init
//! containers (sidecars), pod-level resources (`spec.resources`), pod overhead (RuntimeClass
//! admission) and pods resized in place (container `resources` / `allocatedResources` in
//! status, as the kubelet reports them, with `PodResizePending`).
//!
//! Every case has its own kwok node (selected by a label every pod of the case carries as
//! `nodeSelector`), pods already running there and a new RayCluster. One control plane runs
//! all cases at once: the existing pods are created (and resized), the cluster state is read
//! back with `kubectl get nodes,pods,limitranges,runtimeclasses -A -o yaml`, `raygate fit`
//! judges each case's RayService against it, and then the real KubeRay operator creates each
//! RayCluster and the real scheduler binds its pods or refuses them. The verdicts must agree,
//! and agree with what the case was designed to show: each case sits on the edge, so a model
//! that forgets the feature gets the other verdict.
//!
//! What the harness has to do for resizes, as a kubelet would: kwok reports no container
//! `resources` in status, and the apiserver refuses to resize a running pod without them
//! ("Pod running on node without support for resize"), so the test writes them first; a
//! pod-level resize also needs the node to declare `InPlacePodLevelResourcesVerticalScaling`
//! in `status.declaredFeatures` (the `NodeDeclaredFeatures` admission plugin, beta in v1.36).
//!
//! Dynamic Resource Allocation (ResourceSlices, DeviceClasses, claims, `nvidia.com/gpu` mapped
//! to devices) has its own cases, run at the same time on the same control plane: see
//! `scheduler_dra/mod.rs`.
//!
//! Run: `e2e/setup`, `cargo build -p raygate`, then `cargo test -p raygate-e2e --test scheduler`
//! (about 1.5 min on 2 cores).

#[path = "scheduler_dra/mod.rs"]
mod dra;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use raygate_e2e::json::{arr_at, str_at};
use raygate_e2e::{Check, ControlPlane, FakeNode, create_namespace, wait_for};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(120);
/// The node label that confines a case's pods to its node.
const CASE_LABEL: &str = "e2e.raygate.dev/scheduler-case";
const RUNTIME_CLASS: &str = "sandboxed";
/// RuntimeClass `sandboxed`'s `overhead.podFixed`.
const OVERHEAD_CPU: &str = "500m";
const OVERHEAD_MEMORY: &str = "64Mi";
const IMAGE: &str = "rayproject/ray:2.46.0";
/// The feature a node declares for pod-level in-place resize.
const POD_LEVEL_RESIZE: &str = "InPlacePodLevelResourcesVerticalScaling";

/// How the kubelet reports an in-place resize of a running pod's first container, written
/// to its status after the spec was changed through the `resize` subresource.
#[derive(Clone, Copy)]
enum Resize {
    /// Accepted, not actuated yet: allocated = the new request, running with the old one.
    Accepted { actuated: &'static str },
    /// `PodResizePending` with this reason; allocated and actuated keep the old request.
    Pending {
        reason: &'static str,
        old: &'static str,
    },
}

struct Existing {
    spec: Value,
    resize: Option<ResizeTo>,
}

/// A resize through the `resize` subresource: the new cpu request of container `app`, or
/// of the pod (`spec.resources`, `InPlacePodLevelResourcesVerticalScaling`, beta in v1.36),
/// and what the kubelet reports about it.
#[derive(Clone, Copy)]
struct ResizeTo {
    pod_level: bool,
    cpu: &'static str,
    how: Resize,
}

struct Case {
    id: &'static str,
    why: &'static str,
    /// The node's cpu (capacity = allocatable); memory is plentiful.
    node_cpu: &'static str,
    existing: Vec<Existing>,
    /// Head pod template `spec`, and one worker (1 replica) per entry.
    head: Value,
    workers: Vec<Value>,
    /// What the real scheduler does, by design of the case.
    binds: bool,
}

fn requests(cpu: &str) -> Value {
    json!({"requests": {"cpu": cpu, "memory": "128Mi"}})
}

fn container(name: &str, cpu: &str) -> Value {
    json!({"name": name, "image": IMAGE, "resources": requests(cpu)})
}

fn sidecar(name: &str, cpu: &str) -> Value {
    json!({"name": name, "image": "busybox:1.36", "restartPolicy": "Always", "resources": requests(cpu)})
}

fn plain(cpu: &str) -> Existing {
    Existing {
        spec: json!({"containers": [container("app", cpu)]}),
        resize: None,
    }
}

fn head(cpu: &str) -> Value {
    json!({"containers": [container("ray-head", cpu)]})
}

fn with(mut spec: Value, key: &str, value: Value) -> Value {
    spec[key] = value;
    spec
}

fn cases() -> Vec<Case> {
    let sidecar_pod = || Existing {
        spec: json!({
            "initContainers": [sidecar("proxy", "1")],
            "containers": [container("app", "2")],
        }),
        resize: None,
    };
    let sidecar_worker = || {
        json!({
            "initContainers": [sidecar("proxy", "1")],
            "containers": [container("ray-worker", "100m")],
        })
    };
    let pod_level_pod = || Existing {
        spec: json!({
            "resources": {"requests": {"cpu": "3"}},
            "containers": [container("app", "1")],
        }),
        resize: None,
    };
    let pod_level_head = || {
        json!({
            "resources": {"requests": {"cpu": "2"}},
            "containers": [container("ray-head", "500m")],
        })
    };
    let overhead_pod = || Existing {
        spec: json!({
            "runtimeClassName": RUNTIME_CLASS,
            "containers": [container("app", "2")],
        }),
        resize: None,
    };
    let resized = |to: &'static str, r: Resize, from: &str| Existing {
        spec: json!({"containers": [container("app", from)]}),
        resize: Some(ResizeTo {
            pod_level: false,
            cpu: to,
            how: r,
        }),
    };
    vec![
        Case {
            id: "sidecar-running-refused",
            why: "a running pod's sidecar (1) adds to its app container (2): 3 + 1.5 > 4",
            node_cpu: "4",
            existing: vec![sidecar_pod()],
            head: head("1500m"),
            workers: vec![],
            binds: false,
        },
        Case {
            id: "sidecar-running-fits",
            why: "the same pod, 3 + 1 = 4",
            node_cpu: "4",
            existing: vec![sidecar_pod()],
            head: head("1"),
            workers: vec![],
            binds: true,
        },
        Case {
            id: "sidecar-new-refused",
            why: "KubeRay appends wait-gcs-ready (200m) after the worker's sidecar (1): the worker needs max(1 + 0.1, 1 + 0.2) = 1.2; + head 0.5 > 1.65",
            node_cpu: "1650m",
            existing: vec![],
            head: head("500m"),
            workers: vec![sidecar_worker()],
            binds: false,
        },
        Case {
            id: "sidecar-new-fits",
            why: "the same cluster, 1.2 + 0.5 = 1.7",
            node_cpu: "1700m",
            existing: vec![],
            head: head("500m"),
            workers: vec![sidecar_worker()],
            binds: true,
        },
        Case {
            id: "pod-level-running-refused",
            why: "a running pod's pod-level request (3) replaces its container's (1): 3 + 1.5 > 4",
            node_cpu: "4",
            existing: vec![pod_level_pod()],
            head: head("1500m"),
            workers: vec![],
            binds: false,
        },
        Case {
            id: "pod-level-running-fits",
            why: "the same pod, 3 + 1 = 4",
            node_cpu: "4",
            existing: vec![pod_level_pod()],
            head: head("1"),
            workers: vec![],
            binds: true,
        },
        Case {
            id: "pod-level-new-refused",
            why: "the head template's pod-level request (2) replaces its container's (0.5): 2 + 2.5 > 4",
            node_cpu: "4",
            existing: vec![plain("2500m")],
            head: pod_level_head(),
            workers: vec![],
            binds: false,
        },
        Case {
            id: "pod-level-new-fits",
            why: "the same head, 2 + 2 = 4",
            node_cpu: "4",
            existing: vec![plain("2")],
            head: pod_level_head(),
            workers: vec![],
            binds: true,
        },
        Case {
            id: "overhead-running-refused",
            why: "RuntimeClass admission set a running pod's overhead (0.5): 2 + 0.5 + 1.6 > 4",
            node_cpu: "4",
            existing: vec![overhead_pod()],
            head: head("1600m"),
            workers: vec![],
            binds: false,
        },
        Case {
            id: "overhead-running-fits",
            why: "the same pod, 2 + 0.5 + 1.5 = 4",
            node_cpu: "4",
            existing: vec![overhead_pod()],
            head: head("1500m"),
            workers: vec![],
            binds: true,
        },
        Case {
            id: "overhead-new-refused",
            why: "the head template names the RuntimeClass: 1 + 0.5 + 2.6 > 4",
            node_cpu: "4",
            existing: vec![plain("2600m")],
            head: with(head("1"), "runtimeClassName", json!(RUNTIME_CLASS)),
            workers: vec![],
            binds: false,
        },
        Case {
            id: "overhead-new-fits",
            why: "the same head, 1 + 0.5 + 2.5 = 4",
            node_cpu: "4",
            existing: vec![plain("2500m")],
            head: with(head("1"), "runtimeClassName", json!(RUNTIME_CLASS)),
            workers: vec![],
            binds: true,
        },
        Case {
            id: "resized-down-refused",
            why: "resized 3 -> 1, allocated but still running with 3: the scheduler keeps 3; 3 + 1.5 > 4",
            node_cpu: "4",
            existing: vec![resized("1", Resize::Accepted { actuated: "3" }, "3")],
            head: head("1500m"),
            workers: vec![],
            binds: false,
        },
        Case {
            id: "resized-up-infeasible-fits",
            why: "resized 1 -> 3 but the kubelet called it Infeasible: the scheduler counts 1; 1 + 2.5 <= 4",
            node_cpu: "4",
            existing: vec![resized(
                "3",
                Resize::Pending {
                    reason: "Infeasible",
                    old: "1",
                },
                "1",
            )],
            head: head("2500m"),
            workers: vec![],
            binds: true,
        },
        Case {
            id: "pod-level-resized-refused",
            why: "pod-level request resized 3 -> 2, allocated but still running with 3: the scheduler keeps 3; 3 + 1.5 > 4",
            node_cpu: "4",
            existing: vec![Existing {
                spec: json!({
                    "resources": {"requests": {"cpu": "3"}},
                    "containers": [container("app", "1")],
                }),
                resize: Some(ResizeTo {
                    pod_level: true,
                    cpu: "2",
                    how: Resize::Accepted { actuated: "3" },
                }),
            }],
            head: head("1500m"),
            workers: vec![],
            binds: false,
        },
        Case {
            id: "resized-up-deferred-refused",
            why: "resized 1 -> 3, Deferred: the scheduler already reserves 3; 3 + 1.5 > 4",
            node_cpu: "4",
            existing: vec![resized(
                "3",
                Resize::Pending {
                    reason: "Deferred",
                    old: "1",
                },
                "1",
            )],
            head: head("1500m"),
            workers: vec![],
            binds: false,
        },
    ]
}

fn pod_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods")
}

fn raycluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("ray.io", "v1", "RayCluster"),
        "rayclusters",
    )
}

fn select(spec: &Value, case: &str) -> Value {
    with(spec.clone(), "nodeSelector", json!({CASE_LABEL: case}))
}

/// The case's `rayClusterConfig`, every pod confined to the case's node.
fn cluster_config(c: &Case) -> Value {
    let workers: Vec<Value> = c
        .workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            json!({
                "groupName": format!("w{i}"),
                "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
                "rayStartParams": {},
                "template": {"spec": select(w, c.id)},
            })
        })
        .collect();
    json!({
        "rayVersion": "2.46.0",
        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": select(&c.head, c.id)}},
        "workerGroupSpecs": workers,
    })
}

fn dyn_obj(v: Value) -> Result<DynamicObject> {
    Ok(serde_json::from_value(v)?)
}

async fn create_existing(pods: &Api<DynamicObject>, c: &Case) -> Result<()> {
    for (i, e) in c.existing.iter().enumerate() {
        let name = format!("{}-running-{i}", c.id);
        pods.create(
            &PostParams::default(),
            &dyn_obj(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name},
                "spec": select(&e.spec, c.id),
            }))?,
        )
        .await
        .with_context(|| format!("create pod {name}"))?;
    }
    Ok(())
}

/// Waits until kwok runs the pod, then resizes it and writes the status the kubelet would.
async fn resize_existing(
    cp: &ControlPlane,
    client: &Client,
    pods: &Api<DynamicObject>,
    c: &Case,
) -> Result<()> {
    for (i, e) in c.existing.iter().enumerate() {
        let name = format!("{}-running-{i}", c.id);
        let pod = wait_for(&format!("pod {name} Running"), T, || async {
            let p = serde_json::to_value(pods.get(&name).await?)?;
            Ok(
                if str_at(&p, &["status", "phase"]) == "Running"
                    && !arr_at(&p, &["status", "containerStatuses"]).is_empty()
                {
                    Check::Done(p)
                } else {
                    Check::NotYet(format!("phase {:?}", str_at(&p, &["status", "phase"])))
                },
            )
        })
        .await?;
        let Some(ResizeTo {
            pod_level,
            cpu: to,
            how,
        }) = e.resize
        else {
            continue;
        };
        let ns = str_at(&pod, &["metadata", "namespace"]).to_string();
        let container_cpu = pod
            .pointer("/spec/containers/0/resources/requests/cpu")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        // kwok reports no container `resources`; the apiserver only resizes pods whose
        // kubelet does ("Pod running on node without support for resize"), so report them
        // first, as a v1.36 kubelet does for a running container.
        write_status(
            pods,
            &name,
            &pod,
            &container_cpu,
            &container_cpu,
            None,
            vec![],
        )
        .await?;
        let patch = if pod_level {
            // The NodeDeclaredFeatures admission plugin wants the node to declare the
            // feature, as a v1.36 kubelet with the gate on does in its status.
            let nodes: Api<DynamicObject> =
                Api::all_with(client.clone(), &ApiResource::erase::<Node>(&()));
            nodes
                .patch_status(
                    c.id,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"declaredFeatures": [POD_LEVEL_RESIZE]}})),
                )
                .await
                .with_context(|| format!("declare {POD_LEVEL_RESIZE} on node {}", c.id))?;
            json!({"spec": {"resources": {"requests": {"cpu": to}}}})
        } else {
            json!({"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": to}}}]}})
        };
        let args = [
            "patch",
            "pod",
            &name,
            "-n",
            &ns,
            "--subresource",
            "resize",
            "--type",
            "strategic",
            "-p",
            &patch.to_string(),
        ];
        // The admission plugin reads nodes from an informer: retry while it catches up.
        wait_for(&format!("resize of pod {name}"), T, || async {
            let out = cp.kubectl(&args)?;
            Ok(if out.status.success() {
                Check::Done(())
            } else {
                Check::NotYet(String::from_utf8_lossy(&out.stderr).into_owned())
            })
        })
        .await?;
        let mut conditions = Vec::new();
        let (actuated, allocated) = match how {
            Resize::Accepted { actuated } => {
                conditions.push(json!({"type": "PodResizeInProgress", "status": "True"}));
                (actuated, to)
            }
            Resize::Pending { reason, old } => {
                conditions.push(json!({
                    "type": "PodResizePending", "status": "True", "reason": reason,
                    "message": format!("Node didn't have enough capacity: cpu, requested: {to}")
                }));
                (old, old)
            }
        };
        if pod_level {
            write_status(
                pods,
                &name,
                &pod,
                &container_cpu,
                &container_cpu,
                Some((actuated, allocated)),
                conditions,
            )
            .await?;
        } else {
            write_status(pods, &name, &pod, actuated, allocated, None, conditions).await?;
        }
    }
    Ok(())
}

/// Writes what the kubelet reports: container `app`'s `resources.requests.cpu` (actuated)
/// and `allocatedResources.cpu`, the pod's own when it has pod-level resources, and extra
/// conditions.
async fn write_status(
    pods: &Api<DynamicObject>,
    name: &str,
    pod: &Value,
    actuated: &str,
    allocated: &str,
    pod_level: Option<(&str, &str)>,
    extra_conditions: Vec<Value>,
) -> Result<()> {
    let mut statuses = arr_at(pod, &["status", "containerStatuses"]).to_vec();
    let mut conditions = arr_at(pod, &["status", "conditions"]).to_vec();
    conditions.extend(extra_conditions);
    for s in &mut statuses {
        if s["name"] == "app" {
            s["resources"] = json!({"requests": {"cpu": actuated, "memory": "128Mi"}});
            s["allocatedResources"] = json!({"cpu": allocated, "memory": "128Mi"});
        }
    }
    let mut status = json!({"containerStatuses": statuses, "conditions": conditions});
    if let Some((actuated, allocated)) = pod_level {
        status["resources"] = json!({"requests": {"cpu": actuated}});
        status["allocatedResources"] = json!({"cpu": allocated});
    }
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .with_context(|| format!("write the status of {name}"))?;
    Ok(())
}

/// `raygate fit -f <RayService> --state <state> -o json`: does the new cluster fit?
fn raygate_fits(bin: &Path, dir: &Path, ns: &str, c: &Case, state: &Path) -> Result<bool> {
    let svc = dir.join(format!("{}.rayservice.json", c.id));
    std::fs::write(
        &svc,
        serde_json::to_vec_pretty(&json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": c.id, "namespace": ns},
            "spec": {"rayClusterConfig": cluster_config(c)},
        }))?,
    )?;
    let out = Command::new(bin)
        .args(["fit", "-o", "json", "--kuberay-version", "1.6.1", "--state"])
        .arg(state)
        .arg("-f")
        .arg(&svc)
        .output()
        .with_context(|| format!("run {}", bin.display()))?;
    ensure!(
        out.status.success(),
        "raygate fit for {}: {}: {}",
        c.id,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("raygate fit -o json for {}: not JSON", c.id))?;
    v["fits"]
        .as_bool()
        .with_context(|| format!("raygate fit for {}: no `fits` in {v}", c.id))
}

/// Where the scheduler put the RayCluster's pods: `Some(all bound)` once every pod is
/// either bound or refused (`PodScheduled=False`, `Unschedulable`).
fn scheduled(pods: &[Value], want: usize) -> Option<bool> {
    if pods.len() < want {
        return None;
    }
    let mut all_bound = true;
    for p in pods {
        if !str_at(p, &["spec", "nodeName"]).is_empty() {
            continue;
        }
        let refused = arr_at(p, &["status", "conditions"]).iter().any(|c| {
            str_at(c, &["type"]) == "PodScheduled"
                && str_at(c, &["status"]) == "False"
                && str_at(c, &["reason"]) == "Unschedulable"
        });
        if !refused {
            return None;
        }
        all_bound = false;
    }
    Some(all_bound)
}

async fn body(cp: &ControlPlane) -> Result<()> {
    let bin = raygate_e2e::workspace_bin("raygate").context(
        "raygate binary not found next to the test executable: run `cargo build -p raygate` first",
    )?;
    let cases = cases();
    let client: Client = cp.client().await?;
    let ns = create_namespace(&client, "sched").await?;
    let rc: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<k8s_openapi::api::node::v1::RuntimeClass>(&()),
    );
    rc.create(
        &PostParams::default(),
        &dyn_obj(json!({
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": RUNTIME_CLASS},
            "handler": RUNTIME_CLASS,
            "overhead": {"podFixed": {"cpu": OVERHEAD_CPU, "memory": OVERHEAD_MEMORY}},
        }))?,
    )
    .await
    .context("create RuntimeClass")?;
    let nodes: Vec<FakeNode> = cases
        .iter()
        .map(|c| {
            FakeNode::new(c.id)
                .cpu(c.node_cpu)
                .memory("64Gi")
                .label(CASE_LABEL, c.id)
        })
        .collect();
    for r in futures::future::join_all(nodes.iter().map(|n| n.create(&client))).await {
        r?;
    }
    let pods: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &pod_resource());
    for c in &cases {
        create_existing(&pods, c).await?;
    }
    for c in &cases {
        resize_existing(cp, &client, &pods, c).await?;
    }

    // What raygate sees: the state as kubectl prints it.
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state.yaml");
    let out = cp.kubectl(&[
        "get",
        "nodes,pods,limitranges,runtimeclasses",
        "-A",
        "-o",
        "yaml",
    ])?;
    ensure!(
        out.status.success(),
        "kubectl get: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&state, &out.stdout)?;
    let mut predicted = BTreeMap::new();
    for c in &cases {
        predicted.insert(c.id, raygate_fits(&bin, dir.path(), &ns, c, &state)?);
    }

    // What the scheduler does with the pods KubeRay creates.
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &raycluster_resource());
    for c in &cases {
        clusters
            .create(
                &PostParams::default(),
                &dyn_obj(json!({
                    "apiVersion": "ray.io/v1", "kind": "RayCluster",
                    "metadata": {"name": c.id},
                    "spec": cluster_config(c),
                }))?,
            )
            .await
            .with_context(|| format!("create RayCluster {}", c.id))?;
    }
    let mut observed = BTreeMap::new();
    for c in &cases {
        let want = 1 + c.workers.len();
        let binds = wait_for(
            &format!("the pods of RayCluster {} bound or refused", c.id),
            T,
            || async {
                let l = pods
                    .list(&ListParams::default().labels(&format!("ray.io/cluster={}", c.id)))
                    .await?;
                let v: Vec<Value> = l
                    .items
                    .iter()
                    .map(serde_json::to_value)
                    .collect::<std::result::Result<_, _>>()?;
                Ok(match scheduled(&v, want) {
                    Some(b) => Check::Done(b),
                    None => Check::NotYet(format!("{} of {want} pods, not all decided", v.len())),
                })
            },
        )
        .await?;
        observed.insert(c.id, binds);
    }

    let mut problems = Vec::new();
    for c in &cases {
        let (p, o) = (predicted[c.id], observed[c.id]);
        eprintln!(
            "{:<28} scheduler {:<7} raygate {:<7} {}",
            c.id,
            if o { "binds" } else { "refuses" },
            if p { "fits" } else { "no" },
            c.why
        );
        if p != o {
            problems.push(format!(
                "{}: the scheduler {} the pods, raygate fit says fits={p} ({})",
                c.id,
                if o { "binds" } else { "refuses" },
                c.why
            ));
        }
        if o != c.binds {
            problems.push(format!(
                "{}: the scheduler {} the pods, the case was designed for the other outcome ({})",
                c.id,
                if o { "binds" } else { "refuses" },
                c.why
            ));
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raygate_fit_agrees_with_the_real_scheduler() {
    let cp = ControlPlane::start()
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    let bin = raygate_e2e::workspace_bin("raygate").expect(
        "raygate binary not found next to the test executable: run `cargo build -p raygate` first",
    );
    // The DRA cases run at the same time, on their own nodes and namespace.
    let (plain, dra) = tokio::join!(body(&cp), dra::body(&cp, &bin));
    let problems: Vec<String> = [plain, dra]
        .into_iter()
        .filter_map(|r| r.err().map(|e| format!("{e:#}")))
        .collect();
    if !problems.is_empty() {
        panic!("{}", problems.join("\n"));
    }
}
