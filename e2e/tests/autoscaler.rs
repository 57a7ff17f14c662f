//! Capacity on demand with the real Karpenter (v1.15.0, its kwok cloud provider, the
//! CapacityBuffer feature gate on): a held upgrade asks for its new cluster with
//! CapacityBuffers, Karpenter buys the nodes, raygate admits on its own fit of Ready nodes.
//!
//! One control plane for every scenario (the real KubeRay operator, kwok running the nodes
//! Karpenter creates): a static CPU node for the Ray heads, and a NodePool `gpu` of one
//! 8-GPU instance type, tainted `nvidia.com/gpu`, `consolidateAfter: 30s` when empty, with
//! a GPU limit the scenarios change. raygate runs with `--capacity-requests=true
//! --max-open-capacity-requests=1`, as the ServiceAccount of config/overlays/capacity-requests
//! with exactly its RBAC (config/rbac plus the capacity-requests component): every scenario
//! below is also the proof that those grants suffice, and `kubectl auth can-i` that they
//! grant nothing more for these resources.
//!
//! (a) an upgrade short by 8 GPUs: buffers for the whole new cluster, exactly one node
//!     bought, admitted, Completed with one cluster, buffers gone (hold → admit measured);
//! (b) Karpenter consolidates the node the old cluster left empty;
//! (c) the NodePool's limit leaves the request short: the plan reports the buffer's
//!     condition, holds, creates no cluster, and after `maxWait` reports
//!     CapacityNotDelivered (Event, `raygate_capacity_request_not_delivered` 1);
//! (d) raygate killed while the buffers are open: the same objects are found again;
//! (f) that change withdrawn: buffers deleted, the node bought for it consolidated;
//! (e) two plans waiting, cap 1: buffers in queue order, never two requests at once.
//! Then, with a request open and raygate stopped, `raygate release` deletes it with the gate.
//! On the way, the PodTemplates raygate asked with are compared with the pods the real
//! operator creates for that cluster.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Event, Node, PodTemplate};
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::json::str_at;
use raygate_e2e::{
    Check, ControlPlane, FakeNode, GpuRayService, Options, Raygate, Spawn, create_namespace,
    wait_for,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(180);
/// Priorities order the requests here (batch at 10 before chat): a ceiling above them, as a
/// platform team sets one to let its own plans rank (the chart's default caps at 0).
const RAYGATE_ARGS: &[&str] = &[
    "--capacity-requests=true",
    "--max-open-capacity-requests=1",
    "--max-priority=10",
];
const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";

struct Env {
    client: Client,
    ns: String,
    rg: Option<Raygate>,
    kubeconfig: std::path::PathBuf,
    // Dropped last: stops the control plane after the processes using it.
    cp: ControlPlane,
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

impl Env {
    fn api(&self, r: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.ns, r)
    }
    fn plans(&self) -> Api<DynamicObject> {
        self.api(&ar("raygate.io", "v1alpha1", "UpgradePlan", "upgradeplans"))
    }
    fn services(&self) -> Api<DynamicObject> {
        self.api(&ar("ray.io", "v1", "RayService", "rayservices"))
    }
    fn clusters(&self) -> Api<DynamicObject> {
        self.api(&ar("ray.io", "v1", "RayCluster", "rayclusters"))
    }
    fn buffers(&self) -> Api<DynamicObject> {
        self.api(&ar(
            "autoscaling.x-k8s.io",
            "v1beta1",
            "CapacityBuffer",
            "capacitybuffers",
        ))
    }
    fn nodepools(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.client.clone(),
            &ar("karpenter.sh", "v1", "NodePool", "nodepools"),
        )
    }

    async fn plan(&self, name: &str) -> Result<Value> {
        Ok(serde_json::to_value(self.plans().get(name).await?)?)
    }

    /// The Nodes Karpenter made (the NodePool label), by name.
    async fn bought(&self) -> Result<BTreeSet<String>> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        Ok(nodes
            .list(&ListParams::default().labels(NODEPOOL_LABEL))
            .await?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect())
    }

    /// raygate's CapacityBuffers, per plan uid: name → uid.
    async fn buffers_by_plan(&self) -> Result<BTreeMap<String, BTreeMap<String, String>>> {
        let l = self
            .buffers()
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=raygate"))
            .await?;
        let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for b in l.items {
            let plan = b
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("raygate.io/plan-uid"))
                .cloned()
                .unwrap_or_default();
            out.entry(plan).or_default().insert(
                b.metadata.name.clone().unwrap_or_default(),
                b.metadata.uid.clone().unwrap_or_default(),
            );
        }
        Ok(out)
    }

    async fn plan_uid(&self, name: &str) -> Result<String> {
        Ok(str_at(&self.plan(name).await?, &["metadata", "uid"]).to_string())
    }

    async fn events(&self, object: &str, reason: &str) -> Result<Vec<String>> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        Ok(api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.kind.as_deref() == Some("UpgradePlan")
                    && e.involved_object.name.as_deref() == Some(object)
                    && e.reason.as_deref() == Some(reason)
            })
            .filter_map(|e| e.message)
            .collect())
    }

    async fn wait_plan(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        wait_for(&format!("UpgradePlan {name}: {what}"), T, || async {
            let p = self.plan(name).await?;
            Ok(if done(&p) {
                Check::Done(p)
            } else {
                Check::NotYet(describe(&p))
            })
        })
        .await
    }

    async fn set_gpu_limit(&self, gpus: u32) -> Result<()> {
        let patch = json!({"spec": {"limits": {"nvidia.com/gpu": gpus.to_string()}}});
        self.nodepools()
            .patch("gpu", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Changes the worker image (a new cluster), and the worker count if given.
    async fn change(&self, svc: &str, image: &str, replicas: Option<i64>) -> Result<()> {
        let cur = serde_json::to_value(self.services().get(svc).await?)?;
        let mut groups = cur["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
        groups[0]["template"]["spec"]["containers"][0]["image"] = json!(image);
        if let Some(r) = replicas {
            groups[0]["replicas"] = json!(r);
        }
        let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
        self.services()
            .patch(svc, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn cluster_count(&self, svc: &str) -> Result<usize> {
        Ok(self
            .clusters()
            .list(&ListParams::default().labels(&format!("ray.io/originated-from-cr-name={svc}")))
            .await?
            .items
            .len())
    }

    fn raygate(&mut self) -> &mut Raygate {
        self.rg.as_mut().expect("raygate runs")
    }
}

fn describe(p: &Value) -> String {
    format!(
        "phase={} waitingFor={:?} capacityRequest={}",
        str_at(p, &["status", "phase"]),
        str_at(p, &["status", "waitingFor"]),
        p["status"]["capacityRequest"]
    )
}

fn phase(p: &Value) -> &str {
    str_at(p, &["status", "phase"])
}

fn request_state(p: &Value) -> &str {
    str_at(p, &["status", "capacityRequest", "state"])
}

fn or_panic<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}"))
}

/// A RayService whose GPU workers tolerate the NodePool's taint (the head cannot: it runs
/// on the CPU node), `replicas` workers of 8 GPUs.
fn ray_service(name: &str, image: &str, replicas: i64) -> Value {
    let mut v = GpuRayService::new(name, image)
        .replicas(replicas)
        .gpus(8)
        .head("1", "2Gi")
        .serve_deployment("LLM")
        .build();
    v["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["tolerations"] =
        json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]);
    v
}

fn plan(name: &str, priority: i32, capacity: Value) -> Value {
    json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan", "metadata": {"name": name},
           "spec": {"rayServiceRef": {"name": name}, "priority": priority, "stallAfter": "10m",
                    "capacity": capacity}})
}

async fn create(api: &Api<DynamicObject>, v: Value) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(v)?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

const NODEPOOL: &str = r#"
apiVersion: karpenter.kwok.sh/v1alpha1
kind: KWOKNodeClass
metadata: {name: default}
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: gpu}
spec:
  limits: {nvidia.com/gpu: "32"}
  disruption: {consolidationPolicy: WhenEmpty, consolidateAfter: 30s}
  template:
    spec:
      nodeClassRef: {group: karpenter.kwok.sh, kind: KWOKNodeClass, name: default}
      expireAfter: Never
      taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
      requirements:
        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
"#;

async fn env() -> Result<Env> {
    let cp = ControlPlane::start_with_karpenter(Options::from_env()?)
        .context("start the control plane with Karpenter")?;
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))?;
    let client = cp.client().await?;
    let ns = create_namespace(&client, "auto").await?;
    // The heads' node: CPU only, not Karpenter's.
    FakeNode::new("cpu-0")
        .cpu("64")
        .memory("256Gi")
        .create(&client)
        .await?;
    let file = cp.log_dir().join("nodepool.yaml");
    std::fs::write(&file, NODEPOOL)?;
    cp.kubectl_ok(&["apply", "-f", &file.to_string_lossy()])?;
    let kubeconfig = service_account(&cp)?;
    let rg = spawn_raygate(&cp, &kubeconfig)?;
    Ok(Env {
        client,
        ns,
        rg: Some(rg),
        kubeconfig,
        cp,
    })
}

/// The ServiceAccount, ClusterRoles and bindings of `kubectl kustomize
/// config/overlays/capacity-requests` applied (nothing else of it: no Deployment), checked
/// with `kubectl auth can-i`; a kubeconfig with a token of that ServiceAccount.
fn service_account(cp: &ControlPlane) -> Result<std::path::PathBuf> {
    let dir = cp.log_dir();
    let overlay = repo_root().join("config/overlays/capacity-requests");
    let rendered = cp.kubectl_ok(&["kustomize", &overlay.to_string_lossy()])?;
    let all = dir.join("capacity-requests-overlay.yaml");
    std::fs::write(&all, rendered)?;
    // One JSON object per document, concatenated.
    let objects = cp.kubectl_ok(&[
        "create",
        "--dry-run=client",
        "-o",
        "json",
        "-f",
        &all.to_string_lossy(),
    ])?;
    let keep = [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let mut items = vec![];
    for o in serde_json::Deserializer::from_str(&objects).into_iter::<Value>() {
        let o = o?;
        if keep.contains(&str_at(&o, &["kind"])) {
            items.push(o);
        }
    }
    assert!(
        items
            .iter()
            .any(|o| str_at(o, &["metadata", "name"]) == "raygate-capacity-requests"),
        "the overlay has the capacity-requests ClusterRole"
    );
    let rbac = dir.join("capacity-requests-rbac.json");
    std::fs::write(
        &rbac,
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": items}))?,
    )?;
    cp.kubectl_ok(&["apply", "-f", &rbac.to_string_lossy()])?;
    let who = "--as=system:serviceaccount:raygate-system:raygate";
    for (verb, resource, want) in [
        ("create", "capacitybuffers.autoscaling.x-k8s.io", "yes"),
        ("patch", "capacitybuffers.autoscaling.x-k8s.io", "yes"),
        ("delete", "capacitybuffers.autoscaling.x-k8s.io", "yes"),
        ("watch", "podtemplates", "yes"),
        ("get", "podtemplates", "yes"),
        ("delete", "podtemplates", "yes"),
        ("update", "capacitybuffers.autoscaling.x-k8s.io", "no"),
        ("update", "podtemplates", "no"),
        ("deletecollection", "podtemplates", "no"),
        ("create", "nodepools.karpenter.sh", "no"),
        ("delete", "pods", "no"),
    ] {
        let out = cp.kubectl(&["auth", "can-i", verb, resource, "-n", "auto", who])?;
        let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(said.starts_with(want), "can-i {verb} {resource}: {said}");
    }
    // The autoscaler writes the buffers' status, raygate never.
    let out = cp.kubectl(&[
        "auth",
        "can-i",
        "patch",
        "capacitybuffers.autoscaling.x-k8s.io",
        "--subresource=status",
        "-n",
        "auto",
        who,
    ])?;
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("no"));
    let token = cp.kubectl_ok(&[
        "-n",
        "raygate-system",
        "create",
        "token",
        "raygate",
        "--duration=2h",
    ])?;
    let admin = std::fs::read_to_string(cp.kubeconfig_path())?;
    let kubeconfig = dir.join("raygate-sa.kubeconfig");
    let mine: Vec<String> = admin
        .lines()
        .map(|l| match l.trim_start().strip_prefix("token:") {
            Some(_) => format!("    token: {token}"),
            None => l.to_string(),
        })
        .collect();
    std::fs::write(&kubeconfig, mine.join("\n"))?;
    Ok(kubeconfig)
}

fn spawn_raygate(cp: &ControlPlane, kubeconfig: &std::path::Path) -> Result<Raygate> {
    Raygate::spawn_with(
        cp,
        &Spawn {
            kubeconfig: Some(kubeconfig),
            env: &[],
            args: RAYGATE_ARGS,
        },
    )
}

/// The PodTemplates raygate asked with are the pods the real KubeRay operator then created
/// for that cluster, in everything scheduling and the autoscaler read: one template per
/// pod group with `replicas` = its pods; labels (those naming the cluster aside), node
/// selector, affinity, tolerations (the apiserver's DefaultTolerationSeconds additions
/// aside), topology spread, priority class, and every container's requests as admitted.
async fn templates_match_real_pods(
    e: &Env,
    asked: &[PodTemplate],
    replicas: &BTreeMap<String, i64>,
    cluster: &str,
) -> Result<()> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(e.client.clone(), &e.ns);
    let real = pods
        .list(&ListParams::default().labels(&format!("ray.io/cluster={cluster}")))
        .await?
        .items;
    anyhow::ensure!(!real.is_empty(), "no pods of {cluster}");
    let by_shape: BTreeMap<String, &PodTemplate> = asked
        .iter()
        .filter_map(|t| {
            let shape = t.metadata.labels.as_ref()?.get("raygate.io/shape")?.clone();
            Some((shape, t))
        })
        .collect();
    let mut counted: BTreeMap<String, i64> = BTreeMap::new();
    let cluster_named = ["ray.io/cluster", "ray.io/identifier"];
    for pod in &real {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let shape = match labels.get("ray.io/node-type").map(String::as_str) {
            Some("head") => "head".to_string(),
            _ => format!(
                "worker-{}",
                labels.get("ray.io/group").cloned().unwrap_or_default()
            ),
        };
        let t = by_shape
            .get(&shape)
            .with_context(|| format!("no template for {shape} ({:?})", pod.metadata.name))?;
        *counted.entry(shape.clone()).or_default() += 1;
        let tl = t
            .template
            .as_ref()
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        for (k, v) in &tl {
            if cluster_named.contains(&k.as_str()) {
                continue;
            }
            anyhow::ensure!(
                labels.get(k) == Some(v),
                "{shape}: label {k}={v} vs pod {labels:?}"
            );
        }
        let ts = t
            .template
            .as_ref()
            .and_then(|t| t.spec.clone())
            .unwrap_or_default();
        let ps = pod.spec.clone().unwrap_or_default();
        let tolerations = |v: Option<Vec<k8s_openapi::api::core::v1::Toleration>>| {
            v.unwrap_or_default()
                .into_iter()
                .filter(|t| {
                    !(t.effect.as_deref() == Some("NoExecute")
                        && t.toleration_seconds == Some(300)
                        && matches!(
                            t.key.as_deref(),
                            Some("node.kubernetes.io/not-ready" | "node.kubernetes.io/unreachable")
                        ))
                })
                .collect::<Vec<_>>()
        };
        anyhow::ensure!(
            tolerations(ts.tolerations.clone()) == tolerations(ps.tolerations.clone()),
            "{shape}: tolerations"
        );
        anyhow::ensure!(
            ts.node_selector == ps.node_selector,
            "{shape}: nodeSelector"
        );
        anyhow::ensure!(ts.affinity == ps.affinity, "{shape}: affinity");
        anyhow::ensure!(
            ts.topology_spread_constraints == ps.topology_spread_constraints,
            "{shape}: topologySpreadConstraints"
        );
        anyhow::ensure!(
            ts.priority_class_name == ps.priority_class_name,
            "{shape}: priorityClassName"
        );
        let requests = |cs: &[k8s_openapi::api::core::v1::Container]| {
            cs.iter()
                .map(|c| {
                    let r = c
                        .resources
                        .as_ref()
                        .and_then(|r| r.requests.clone())
                        .unwrap_or_default();
                    let r: BTreeMap<String, String> =
                        r.into_iter().map(|(k, q)| (k, q.0)).collect();
                    (c.name.clone(), r)
                })
                .collect::<Vec<_>>()
        };
        anyhow::ensure!(
            requests(&ts.containers) == requests(&ps.containers),
            "{shape}: containers {:?} vs real {:?}",
            requests(&ts.containers),
            requests(&ps.containers)
        );
        anyhow::ensure!(
            requests(ts.init_containers.as_deref().unwrap_or_default())
                == requests(ps.init_containers.as_deref().unwrap_or_default()),
            "{shape}: init containers {:?} vs real {:?}",
            requests(ts.init_containers.as_deref().unwrap_or_default()),
            requests(ps.init_containers.as_deref().unwrap_or_default())
        );
    }
    anyhow::ensure!(
        &counted == replicas,
        "pods per shape {counted:?}, buffers asked for {replicas:?}"
    );
    eprintln!("(a) templates match the real pods of {cluster}: {counted:?}");
    Ok(())
}

/// A RayService with its plan, serving and Idle.
async fn service_with_plan(
    e: &Env,
    name: &str,
    replicas: i64,
    priority: i32,
    capacity: Value,
) -> Result<()> {
    create(&e.plans(), plan(name, priority, capacity)).await?;
    create(
        &e.services(),
        ray_service(name, "rayproject/ray:2.9.0-gpu", replicas),
    )
    .await?;
    e.wait_plan(name, "Idle", |p| phase(p) == "Idle").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_upgrades_get_their_capacity_from_karpenter() {
    let t0 = Instant::now();
    let mut e = or_panic(env().await);
    eprintln!("control plane with Karpenter up in {:?}", t0.elapsed());
    let buffer_request = json!({"request": "CapacityBuffer"});

    // (a) One 8-GPU worker, on a node Karpenter buys for its pending pod.
    or_panic(service_with_plan(&e, "chat", 1, 0, buffer_request.clone()).await);
    let first = or_panic(e.bought().await);
    assert_eq!(first.len(), 1, "one node for the first cluster: {first:?}");
    let chat_uid = or_panic(e.plan_uid("chat").await);

    or_panic(e.change("chat", "rayproject/ray:2.10.0-gpu", None).await);
    let requested = or_panic(
        e.wait_plan("chat", "capacity requested", |p| {
            request_state(p) == "Requested"
                && p["status"]["capacityRequest"]["buffers"]
                    .as_array()
                    .is_some_and(|b| b.len() == 2)
        })
        .await,
    );
    let held_at: jiff::Timestamp = str_at(&requested, &["status", "pendingChange", "detectedTime"])
        .parse()
        .expect("detectedTime");
    assert_eq!(phase(&requested), "WaitingForCapacity");
    assert!(
        str_at(&requested, &["status", "waitingFor"]).ends_with("(requested)"),
        "{}",
        describe(&requested)
    );
    // One PodTemplate + CapacityBuffer per pod shape of the new cluster: the head (fits the
    // CPU node) and the worker group (1 × 8 GPUs), labelled with the change.
    let fp = str_at(&requested, &["status", "pendingChange", "fingerprint"]).to_string();
    let mine = or_panic(e.buffers_by_plan().await);
    let names: BTreeSet<&String> = mine[&chat_uid].keys().collect();
    assert_eq!(
        names,
        BTreeSet::from([
            &format!("chat-{fp}-head"),
            &format!("chat-{fp}-worker-gpu-workers")
        ]),
    );
    let templates: Api<PodTemplate> = Api::namespaced(e.client.clone(), &e.ns);
    // Kept to compare with the pods the real operator creates once admitted.
    let asked: Vec<PodTemplate> = or_panic(
        templates
            .list(&ListParams::default().labels(&format!("raygate.io/plan-uid={chat_uid}")))
            .await
            .map_err(Into::into),
    )
    .items;
    let worker = or_panic(
        templates
            .get(&format!("chat-{fp}-worker-gpu-workers"))
            .await
            .map_err(Into::into),
    );
    let spec = worker.template.and_then(|t| t.spec).expect("template spec");
    assert_eq!(
        serde_json::to_value(&spec.tolerations).unwrap(),
        json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    );
    let req = spec.containers[0]
        .resources
        .clone()
        .unwrap()
        .requests
        .unwrap();
    assert_eq!(req["nvidia.com/gpu"].0, "8");

    let admitted = or_panic(
        e.wait_plan("chat", "admitted", |p| {
            matches!(phase(p), "Admitted" | "Upgrading" | "Completed")
        })
        .await,
    );
    let admitted_at: jiff::Timestamp =
        match str_at(&admitted, &["status", "admitted", "admittedTime"]) {
            "" => str_at(&admitted, &["status", "lastTransition", "start"]),
            t => t,
        }
        .parse()
        .expect("admittedTime");
    let hold_to_admit = admitted_at.duration_since(held_at);
    eprintln!("(a) hold -> admit: {hold_to_admit:#}");
    assert!(
        admitted["status"].get("capacityRequest").is_none(),
        "{}",
        describe(&admitted)
    );
    // Deleted before the gate opened: raygate writes the Admitted status, deletes the
    // buffers, then opens the gate, so the check waits until KubeRay has acted on the
    // open gate (Upgrading), not only for the status that precedes both.
    or_panic(
        e.wait_plan("chat", "upgrading", |p| {
            matches!(phase(p), "Upgrading" | "Completed")
        })
        .await,
    );
    assert!(
        !or_panic(e.buffers_by_plan().await).contains_key(&chat_uid),
        "buffers left after the gate opened"
    );
    let done = or_panic(
        e.wait_plan("chat", "Completed", |p| phase(p) == "Completed")
            .await,
    );
    assert_eq!(
        or_panic(e.cluster_count("chat").await),
        1,
        "{}",
        describe(&done)
    );
    let after = or_panic(e.bought().await);
    let added: Vec<_> = after.difference(&first).collect();
    assert_eq!(
        added.len(),
        1,
        "exactly one node bought: {first:?} -> {after:?}"
    );
    assert_eq!(
        or_panic(e.events("chat", "CapacityRequested").await).len(),
        1
    );
    assert_eq!(
        or_panic(e.events("chat", "CapacityDelivered").await).len(),
        1
    );
    let chat_node = (*added[0]).clone();
    let active = str_at(&done, &["status", "activeCluster"]).to_string();
    let replicas: BTreeMap<String, i64> = requested["status"]["capacityRequest"]["buffers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| {
            let name = str_at(b, &["name"]);
            let shape = name.trim_start_matches(&format!("chat-{fp}-")).to_string();
            (shape, b["replicas"].as_i64().unwrap_or(0))
        })
        .collect();
    or_panic(templates_match_real_pods(&e, &asked, &replicas, &active).await);

    // (b) The old cluster's node is left empty: Karpenter consolidates it.
    let old_node = first.iter().next().cloned().unwrap_or_default();
    or_panic(
        wait_for("the old cluster's node consolidated", T, || async {
            let now = e.bought().await?;
            Ok(if now.contains(&old_node) {
                Check::NotYet(format!("{now:?}"))
            } else {
                Check::Done(())
            })
        })
        .await,
    );
    eprintln!("(b) old node {old_node} consolidated at {:?}", t0.elapsed());

    // (c) The NodePool may grow by one node only; "batch" needs two.
    or_panic(e.set_gpu_limit(16).await);
    or_panic(
        service_with_plan(
            &e,
            "batch",
            0,
            10,
            json!({"request": "CapacityBuffer", "maxWait": "25s"}),
        )
        .await,
    );
    let batch_uid = or_panic(e.plan_uid("batch").await);
    or_panic(
        e.change("batch", "rayproject/ray:2.10.0-gpu", Some(2))
            .await,
    );
    let short = or_panic(
        e.wait_plan("batch", "the autoscaler reports the limit", |p| {
            p["status"]["capacityRequest"]["buffers"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|b| {
                    str_at(b, &["reason"]) == "RequiresNewCapacity"
                        && str_at(b, &["message"]).contains("1 failed")
                })
        })
        .await,
    );
    assert_eq!(phase(&short), "WaitingForCapacity", "{}", describe(&short));
    assert!(
        str_at(&short, &["status", "message"]).contains("1 failed"),
        "the plan's message carries the autoscaler's report: {}",
        describe(&short)
    );
    assert_eq!(
        or_panic(e.cluster_count("batch").await),
        1,
        "no cluster created while held"
    );
    let partial = or_panic(e.bought().await);
    eprintln!("(c) Karpenter bought within the limit: {partial:?}");

    // (d) raygate killed with the request open: the same objects are found again.
    let before = or_panic(e.buffers_by_plan().await)[&batch_uid].clone();
    e.raygate().kill();
    e.rg = None;
    e.rg = Some(or_panic(spawn_raygate(&e.cp, &e.kubeconfig)));
    or_panic(
        e.wait_plan("batch", "observed by the new raygate", |p| {
            request_state(p) == "NotDelivered"
        })
        .await,
    );
    let again = or_panic(e.buffers_by_plan().await)[&batch_uid].clone();
    assert_eq!(before, again, "the same CapacityBuffers (names and uids)");
    // maxWait passed: reported once, and the alert's series is 1.
    assert_eq!(
        or_panic(e.events("batch", "CapacityNotDelivered").await).len(),
        1
    );
    // The gauge is set right after the status is written.
    let rg = e.rg.as_ref().expect("raygate runs");
    or_panic(
        wait_for("raygate_capacity_request_not_delivered 1", T, || async {
            let metrics = rg.metrics()?;
            let line = metrics
                .lines()
                .find(|l| {
                    l.starts_with("raygate_capacity_request_not_delivered{")
                        && l.contains("upgradeplan=\"batch\"")
                })
                .unwrap_or_default()
                .to_string();
            Ok(if line.ends_with(" 1") {
                Check::Done(())
            } else {
                Check::NotYet(line)
            })
        })
        .await,
    );
    assert_eq!(or_panic(e.cluster_count("batch").await), 1);

    // (f) The change withdrawn: its buffers go, and the node bought for it is consolidated.
    or_panic(e.change("batch", "rayproject/ray:2.9.0-gpu", Some(0)).await);
    or_panic(e.wait_plan("batch", "Idle", |p| phase(p) == "Idle").await);
    or_panic(
        wait_for("the withdrawn change's buffers deleted", T, || async {
            let b = e.buffers_by_plan().await?;
            Ok(if b.contains_key(&batch_uid) {
                Check::NotYet(format!("{b:?}"))
            } else {
                Check::Done(())
            })
        })
        .await,
    );
    or_panic(
        wait_for(
            "no node left bought for the withdrawn change",
            T,
            || async {
                let now = e.bought().await?;
                Ok(if now == BTreeSet::from([chat_node.clone()]) {
                    Check::Done(())
                } else {
                    Check::NotYet(format!("{now:?}"))
                })
            },
        )
        .await,
    );
    eprintln!("(f) withdrawn, back to {chat_node} at {:?}", t0.elapsed());

    // (e) Both change at once, cap 1: batch (priority 10) asks first, chat after.
    or_panic(e.set_gpu_limit(32).await);
    or_panic(
        e.change("batch", "rayproject/ray:2.11.0-gpu", Some(1))
            .await,
    );
    or_panic(e.change("chat", "rayproject/ray:2.11.0-gpu", None).await);
    let mut first_seen: BTreeMap<String, Instant> = BTreeMap::new();
    let mut most = 0;
    let deadline = Instant::now() + T * 2;
    loop {
        let b = or_panic(e.buffers_by_plan().await);
        most = most.max(b.len());
        for uid in b.keys() {
            first_seen.entry(uid.clone()).or_insert_with(Instant::now);
        }
        let (c, d) = (
            or_panic(e.plan("chat").await),
            or_panic(e.plan("batch").await),
        );
        if phase(&c) == "Completed" && phase(&d) == "Completed" {
            break;
        }
        if Instant::now() > deadline {
            panic!(
                "(e) not both Completed: chat {} / batch {}",
                describe(&c),
                describe(&d)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        most <= 1,
        "at most one plan's request open at once, saw {most}"
    );
    let (b_at, c_at) = (first_seen.get(&batch_uid), first_seen.get(&chat_uid));
    match (b_at, c_at) {
        (Some(b), Some(c)) => assert!(b < c, "batch (priority 10) asked before chat"),
        other => panic!("both asked for capacity: {other:?}"),
    }
    let queued = or_panic(e.events("chat", "CapacityRequested").await);
    assert_eq!(
        queued.len(),
        2,
        "chat asked again for its second change: {queued:?}"
    );
    assert!(
        or_panic(e.buffers_by_plan().await).is_empty(),
        "no request left behind"
    );
    eprintln!("(e) both completed in queue order at {:?}", t0.elapsed());

    // Uninstall: with a request open and raygate stopped, `raygate release` (what the
    // chart's pre-delete hook runs) deletes it with the gate, as this ServiceAccount.
    or_panic(e.set_gpu_limit(0).await);
    or_panic(e.change("chat", "rayproject/ray:2.12.0-gpu", Some(4)).await);
    or_panic(
        e.wait_plan("chat", "a request open", |p| {
            request_state(p) == "Requested"
                && p["status"]["capacityRequest"]["buffers"]
                    .as_array()
                    .is_some_and(|b| b.len() == 2)
        })
        .await,
    );
    e.raygate().kill();
    e.rg = None;
    let bin = raygate_e2e::workspace_bin("raygate").expect("the raygate binary");
    let out = std::process::Command::new(bin)
        .args(["release", "--kubeconfig"])
        .arg(&e.kubeconfig)
        .args(["--namespace", &e.ns])
        .output()
        .expect("run raygate release");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        said.matches("capacity request deleted: CapacityBuffer")
            .count(),
        2,
        "{said}"
    );
    assert!(
        or_panic(e.buffers_by_plan().await).is_empty(),
        "no request left behind"
    );
    let templates: Api<PodTemplate> = Api::namespaced(e.client.clone(), &e.ns);
    let left = or_panic(
        templates
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=raygate"))
            .await
            .map_err(Into::into),
    );
    assert!(left.items.is_empty(), "PodTemplates left behind");
    eprintln!("raygate release: {}", said.trim().replace('\n', "; "));
}
