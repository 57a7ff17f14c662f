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
//!
//! A second test, on its own control plane beside the first, injects faults around the
//! requests (Karpenter down or restarted, the offering gone, objects edited by hand, a
//! bought node lost, the CRD removed, the apiserver restarted, the plan deleted). Both
//! sample the invariants of issue 36 every second throughout (`autoscaler/invariants.rs`):
//! no more NodeClaims than clusters and open requests justify, no request object outliving
//! its plan's wait by more than a sweep, never a third cluster, no gate `None` without a
//! plan, no Unschedulable pod of an admitted cluster unless a fault removed capacity.

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
            ..Spawn::default()
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
    let inv = Invariants::start(e.client.clone(), &e.ns);
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
    // maxWait passed: reported once, and the alert's series is 1. The Event is posted right
    // after the status is written: wait for it, then count.
    or_panic(
        wait_for("the CapacityNotDelivered Event", T, || async {
            let n = e.events("batch", "CapacityNotDelivered").await?.len();
            Ok(if n > 0 {
                Check::Done(())
            } else {
                Check::NotYet(n.to_string())
            })
        })
        .await,
    );
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
    inv.assert_clean("(a)-(f)");

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

#[path = "autoscaler/invariants.rs"]
mod invariants;
#[path = "autoscaler/soak.rs"]
mod soak;
use invariants::Invariants;

impl Env {
    /// Karpenter gives back a node 5 s after its last pod left (the NodePool says 30 s).
    async fn consolidate_quickly(&self) -> Result<()> {
        let patch = json!({"spec": {"disruption": {"consolidateAfter": "5s"}}});
        self.nodepools()
            .patch("gpu", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    fn templates(&self) -> Api<PodTemplate> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Live NodeClaims (no deletion timestamp), by name.
    async fn nodeclaims(&self) -> Result<BTreeSet<String>> {
        let api = Api::<DynamicObject>::all_with(
            self.client.clone(),
            &ar("karpenter.sh", "v1", "NodeClaim", "nodeclaims"),
        );
        Ok(api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter_map(|c| c.metadata.name)
            .collect())
    }

    /// Every NodeClaim name seen so far is recorded: "bought" counts creations, not the
    /// live set, so a node bought and consolidated in between still counts.
    async fn bought_since(&self, seen: &mut BTreeSet<String>) -> Result<usize> {
        let before = seen.len();
        seen.extend(self.nodeclaims().await?);
        Ok(seen.len() - before)
    }

    /// Waits for an upgrade to complete with one cluster, recording NodeClaims on the way.
    async fn until_completed(&self, svc: &str, seen: &mut BTreeSet<String>) -> Result<Value> {
        let deadline = Instant::now() + T;
        loop {
            self.bought_since(seen).await?;
            let p = self.plan(svc).await?;
            if phase(&p) == "Completed" && self.cluster_count(svc).await? == 1 {
                return Ok(p);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{svc} not Completed: {}",
                describe(&p)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The worker shape's CapacityBuffer and PodTemplate name of the plan's open request.
    async fn worker_request(&self, svc: &str) -> Result<String> {
        let p = self
            .wait_plan(svc, "a request open for the worker", |p| {
                request_state(p) == "Requested"
                    && p["status"]["capacityRequest"]["buffers"]
                        .as_array()
                        .is_some_and(|b| b.len() == 2)
            })
            .await?;
        let fp = str_at(&p, &["status", "pendingChange", "fingerprint"]);
        Ok(format!("{svc}-{fp}-worker-gpu-workers"))
    }

    /// Waits until Karpenter has consolidated every node but `keep` (empty ones after an
    /// upgrade), so the next change cannot fit on a leftover node.
    async fn consolidated_to(&self, keep: usize, seen: &mut BTreeSet<String>) -> Result<()> {
        wait_for("empty nodes consolidated", T, || async {
            let live = self.nodeclaims().await?;
            Ok(if live.len() <= keep {
                Check::Done(())
            } else {
                Check::NotYet(format!("{live:?}"))
            })
        })
        .await?;
        self.bought_since(seen).await?;
        Ok(())
    }

    async fn buffer_json(&self, name: &str) -> Result<Option<Value>> {
        match self.buffers().get_opt(name).await? {
            Some(b) => Ok(Some(serde_json::to_value(b)?)),
            None => Ok(None),
        }
    }
}

const INSTANCE_TYPES_ON_DEMAND: &str = r#"[{"name": "gpu-8x-amd64-linux",
  "offerings": [{"Price": 32.77, "Available": true, "Requirements": [
    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a"]}]}],
  "architecture": "amd64", "operatingSystems": ["linux"],
  "resources": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8", "pods": "110"}}]"#;

/// Faults around the capacity request, on their own control plane (run beside the happy
/// path above), with the invariants of `invariants.rs` sampled every second throughout:
///
/// (k) Karpenter down while a request is open; meanwhile a user deletes raygate's worker
///     CapacityBuffer, then its PodTemplate, and scales the buffer by hand, and a foreign
///     CapacityBuffer sits in the namespace. raygate restores its objects; Karpenter back
///     buys exactly one node; admitted when delivered; the foreign buffer untouched.
/// (o) the instance type's on-demand offering gone (Karpenter restarted with a file that
///     offers only spot: the kwok provider reads it at start and forces every listed offering
///     available, so `Available: false` in the file is not honoured): held, reported, nothing
///     bought; restarted with the offering back: one node, admitted.
/// (n) the node bought for a request deleted (its NodeClaim, as an interruption) once
///     admitted, with the pool at its limit: raygate reports the stall; the limit raised,
///     Karpenter replaces the node for the pending pod and the upgrade completes.
/// (c) the CapacityBuffer CRD deleted while a request is open (every buffer with it), then
///     installed again: raygate reports it, asks again, and is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_around_capacity_requests_keep_the_invariants() {
    let t0 = Instant::now();
    let mut e = or_panic(env().await);
    eprintln!("control plane with Karpenter up in {:?}", t0.elapsed());
    // Empty nodes go 5 s after their last pod, so each scenario starts from one node.
    or_panic(e.consolidate_quickly().await);
    let inv = Invariants::start(e.client.clone(), &e.ns);
    let mut seen = BTreeSet::new();
    or_panic(service_with_plan(&e, "svc", 1, 0, json!({"request": "CapacityBuffer"})).await);
    or_panic(e.bought_since(&mut seen).await);
    assert_eq!(seen.len(), 1, "one node for the first cluster: {seen:?}");

    // A foreign CapacityBuffer (another team's, a CPU pod the static node holds).
    let foreign_template = json!({"apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": "foreign"},
        "template": {"spec": {"containers": [{"name": "c", "image": "busybox",
            "resources": {"requests": {"cpu": "100m"}}}]}}});
    or_panic(
        e.templates()
            .create(
                &PostParams::default(),
                &serde_json::from_value(foreign_template).unwrap(),
            )
            .await
            .map_err(Into::into),
    );
    or_panic(
        create(
            &e.buffers(),
            json!({"apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
               "metadata": {"name": "foreign", "labels": {"team": "other"}},
               "spec": {"podTemplateRef": {"name": "foreign"}, "replicas": 1}}),
        )
        .await,
    );
    let foreign = or_panic(e.buffer_json("foreign").await).expect("foreign buffer");

    // (k) Karpenter down, then the change.
    let tk = Instant::now();
    or_panic(e.cp.stop("karpenter"));
    or_panic(e.change("svc", "rayproject/ray:2.10.0-gpu", None).await);
    let worker = or_panic(e.worker_request("svc").await);
    let original = or_panic(e.buffer_json(&worker).await).expect("worker buffer");
    let uid = |v: &Value| str_at(v, &["metadata", "uid"]).to_string();
    // Deleted by hand: raygate applies it again (a new object, the same name).
    or_panic(
        e.buffers()
            .delete(&worker, &Default::default())
            .await
            .map(|_| ())
            .map_err(Into::into),
    );
    let td = Instant::now();
    or_panic(
        wait_for("the deleted CapacityBuffer restored", T, || async {
            Ok(match e.buffer_json(&worker).await? {
                Some(b) if uid(&b) != uid(&original) => Check::Done(()),
                other => Check::NotYet(format!("{:?}", other.map(|b| uid(&b)))),
            })
        })
        .await,
    );
    eprintln!(
        "(k) CapacityBuffer deleted by hand: restored in {:?}",
        td.elapsed()
    );
    let template_uid = or_panic(e.templates().get(&worker).await.map_err(Into::into))
        .metadata
        .uid;
    or_panic(
        e.templates()
            .delete(&worker, &Default::default())
            .await
            .map(|_| ())
            .map_err(Into::into),
    );
    let td = Instant::now();
    or_panic(
        wait_for("the deleted PodTemplate restored", T, || async {
            Ok(match e.templates().get_opt(&worker).await? {
                Some(t) if t.metadata.uid != template_uid => Check::Done(()),
                other => Check::NotYet(format!("{:?}", other.map(|t| t.metadata.uid))),
            })
        })
        .await,
    );
    eprintln!(
        "(k) PodTemplate deleted by hand: restored in {:?}",
        td.elapsed()
    );
    // Its deletion wakes the plan (before, only the periodic reconcile did, 15 s later,
    // while the autoscaler reported the buffer's template missing).
    assert!(
        td.elapsed() < Duration::from_secs(5),
        "the PodTemplate restored only after {:?}",
        td.elapsed()
    );
    // Scaled by hand to 5: Karpenter would buy five nodes.
    or_panic(
        e.buffers()
            .patch(
                &worker,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"replicas": 5}})),
            )
            .await
            .map(|_| ())
            .map_err(Into::into),
    );
    let td = Instant::now();
    or_panic(
        wait_for("the edited CapacityBuffer restored", T, || async {
            let b = e.buffer_json(&worker).await?.unwrap_or_default();
            Ok(if b["spec"]["replicas"] == json!(1) {
                Check::Done(())
            } else {
                Check::NotYet(format!("replicas {}", b["spec"]["replicas"]))
            })
        })
        .await,
    );
    eprintln!(
        "(k) CapacityBuffer scaled by hand: restored in {:?}",
        td.elapsed()
    );
    // The template's GPU request edited by hand (the buffer would then ask for 1 GPU).
    let gpus = |t: &PodTemplate| {
        t.template
            .as_ref()
            .and_then(|t| t.spec.as_ref())
            .and_then(|s| s.containers[0].resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("nvidia.com/gpu"))
            .map(|q| q.0.clone())
            .unwrap_or_default()
    };
    let mut t = or_panic(e.templates().get(&worker).await.map_err(Into::into));
    let mut spec = t.template.take().expect("template");
    let r = spec.spec.as_mut().expect("pod spec").containers[0]
        .resources
        .as_mut()
        .expect("resources");
    for m in [r.requests.as_mut(), r.limits.as_mut()]
        .into_iter()
        .flatten()
    {
        m.insert(
            "nvidia.com/gpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
        );
    }
    or_panic(
        e.templates()
            .patch(
                &worker,
                &PatchParams::default(),
                &Patch::Merge(&json!({"template": spec})),
            )
            .await
            .map(|_| ())
            .map_err(Into::into),
    );
    let td = Instant::now();
    or_panic(
        wait_for("the edited PodTemplate restored", T, || async {
            let t = e.templates().get(&worker).await?;
            Ok(if gpus(&t) == "8" {
                Check::Done(())
            } else {
                Check::NotYet(format!("nvidia.com/gpu {}", gpus(&t)))
            })
        })
        .await,
    );
    eprintln!(
        "(k) PodTemplate edited by hand: restored in {:?}",
        td.elapsed()
    );
    assert_eq!(
        or_panic(e.bought_since(&mut seen).await),
        0,
        "Karpenter is down"
    );
    assert_eq!(or_panic(e.cluster_count("svc").await), 1);
    assert_eq!(phase(&or_panic(e.plan("svc").await)), "WaitingForCapacity");
    let tu = Instant::now();
    or_panic(e.cp.restart("karpenter"));
    or_panic(
        e.wait_plan("svc", "admitted once Karpenter is back", |p| {
            matches!(phase(p), "Admitted" | "Upgrading" | "Completed")
        })
        .await,
    );
    eprintln!(
        "(k) Karpenter back: admitted {:?} after its restart",
        tu.elapsed()
    );
    or_panic(e.until_completed("svc", &mut seen).await);
    assert_eq!(
        seen.len(),
        2,
        "exactly one node bought for the change: {seen:?}"
    );
    let f = or_panic(e.buffer_json("foreign").await).expect("the foreign buffer is left alone");
    assert_eq!(uid(&f), uid(&foreign));
    assert_eq!(f["spec"], foreign["spec"]);
    assert_eq!(f["metadata"]["labels"], foreign["metadata"]["labels"]);
    inv.assert_clean("(k) Karpenter down, objects edited by hand");
    eprintln!("(k) done in {:?}", tk.elapsed());

    // (o) The offering gone: Karpenter restarted with a spot-only instance type.
    or_panic(e.consolidated_to(1, &mut seen).await);
    let to = Instant::now();
    let types = or_panic(e.cp.karpenter_instance_types());
    std::fs::write(
        &types,
        INSTANCE_TYPES_ON_DEMAND.replace("on-demand", "spot"),
    )
    .unwrap();
    or_panic(e.cp.restart("karpenter"));
    let before = seen.clone();
    or_panic(e.change("svc", "rayproject/ray:2.11.0-gpu", None).await);
    or_panic(e.worker_request("svc").await);
    let reported = or_panic(
        e.wait_plan(
            "svc",
            "the autoscaler's report of the missing offering",
            |p| {
                p["status"]["capacityRequest"]["buffers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|b| {
                        str_at(b, &["name"]).contains("-worker-")
                            && !str_at(b, &["reason"]).is_empty()
                    })
            },
        )
        .await,
    );
    eprintln!(
        "(o) offering gone: {} / {}",
        str_at(&reported, &["status", "message"]),
        reported["status"]["capacityRequest"]["buffers"]
    );
    // Karpenter's batch window is 1-10 s: ten seconds more without a NodeClaim.
    tokio::time::sleep(Duration::from_secs(10)).await;
    or_panic(e.bought_since(&mut seen).await);
    assert_eq!(seen, before, "nothing bought without an offering");
    let held = or_panic(e.plan("svc").await);
    assert_eq!(phase(&held), "WaitingForCapacity", "{}", describe(&held));
    assert_eq!(or_panic(e.cluster_count("svc").await), 1);
    // The apiserver restarted with the request open: the same objects afterwards.
    let open = or_panic(e.buffers_by_plan().await);
    let ta = Instant::now();
    or_panic(e.cp.restart("kube-apiserver"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    or_panic(e.worker_request("svc").await);
    assert_eq!(
        or_panic(e.buffers_by_plan().await),
        open,
        "the same CapacityBuffers"
    );
    eprintln!(
        "(o) apiserver restarted with the request open: same buffers ({:?})",
        ta.elapsed()
    );
    // Offered again; Karpenter restarted once more as soon as it created the NodeClaim.
    std::fs::write(&types, INSTANCE_TYPES_ON_DEMAND).unwrap();
    or_panic(e.cp.restart("karpenter"));
    or_panic(
        wait_for("a NodeClaim for the request", T, || async {
            let now = e.nodeclaims().await?;
            Ok(if now.iter().any(|c| !before.contains(c)) {
                Check::Done(())
            } else {
                Check::NotYet(format!("{now:?}"))
            })
        })
        .await,
    );
    or_panic(e.cp.restart("karpenter"));
    or_panic(e.until_completed("svc", &mut seen).await);
    assert_eq!(
        seen.len(),
        before.len() + 1,
        "one node once offered: {seen:?}"
    );
    inv.assert_clean("(o) offering unavailable, then available");
    eprintln!("(o) done in {:?}", to.elapsed());

    // (n) The node bought for the change deleted once admitted, the pool at its limit.
    or_panic(e.consolidated_to(1, &mut seen).await);
    let tn = Instant::now();
    let before = seen.clone();
    or_panic(e.change("svc", "rayproject/ray:2.12.0-gpu", None).await);
    or_panic(
        e.wait_plan("svc", "admitted", |p| {
            matches!(phase(p), "Admitted" | "Upgrading")
        })
        .await,
    );
    or_panic(e.bought_since(&mut seen).await);
    let new_claims: Vec<String> = seen.difference(&before).cloned().collect();
    assert_eq!(
        new_claims.len(),
        1,
        "one node for the change: {new_claims:?}"
    );
    // The pool may not grow: any new node would exceed 8 GPUs.
    or_panic(e.set_gpu_limit(8).await);
    inv.capacity_removed(true);
    let claims = Api::<DynamicObject>::all_with(
        e.client.clone(),
        &ar("karpenter.sh", "v1", "NodeClaim", "nodeclaims"),
    );
    or_panic(
        claims
            .delete(&new_claims[0], &Default::default())
            .await
            .map(|_| ())
            .map_err(Into::into),
    );
    let stalled = or_panic(
        e.wait_plan("svc", "the lost node reported as a stall", |p| {
            phase(p) == "Stalled"
        })
        .await,
    );
    eprintln!(
        "(n) node deleted after admission: {} ({})",
        str_at(&stalled, &["status", "message"]),
        describe(&stalled)
    );
    or_panic(e.set_gpu_limit(32).await);
    or_panic(e.until_completed("svc", &mut seen).await);
    inv.capacity_removed(false);
    assert_eq!(
        seen.len(),
        before.len() + 2,
        "the lost node replaced once: {:?}",
        seen.difference(&before).collect::<Vec<_>>()
    );
    inv.assert_clean("(n) node deleted after admission");
    eprintln!("(n) done in {:?}", tn.elapsed());

    // (c) The CapacityBuffer CRD deleted while a request is open, then installed again.
    or_panic(e.consolidated_to(1, &mut seen).await);
    let tc = Instant::now();
    let before = seen.clone();
    // The pool may not grow: any new node would exceed 8 GPUs.
    or_panic(e.set_gpu_limit(8).await);
    or_panic(e.change("svc", "rayproject/ray:2.13.0-gpu", None).await);
    or_panic(e.worker_request("svc").await);
    let crd_name = "capacitybuffers.autoscaling.x-k8s.io";
    let mut crd: Value = serde_json::from_str(&or_panic(
        e.cp.kubectl_ok(&["get", "crd", crd_name, "-o", "json"]),
    ))
    .unwrap();
    crd.as_object_mut().unwrap().remove("status");
    let meta = crd["metadata"].as_object_mut().unwrap();
    for k in [
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "managedFields",
        "generation",
    ] {
        meta.remove(k);
    }
    let crd_file = e.cp.log_dir().join("capacitybuffers-crd.json");
    std::fs::write(&crd_file, crd.to_string()).unwrap();
    or_panic(e.cp.kubectl_ok(&["delete", "crd", crd_name, "--wait=true"]));
    let gone = or_panic(
        e.wait_plan("svc", "the missing CapacityBuffer API reported", |p| {
            str_at(p, &["status", "capacityRequest", "message"]).contains("not installed")
                || str_at(p, &["status", "message"]).contains("not installed")
        })
        .await,
    );
    eprintln!("(c) CRD deleted: {}", describe(&gone));
    // Reported once and retried quietly: the plan's status and raygate's PodTemplates do
    // not churn while the API is missing (they alternated on every reconcile, each write
    // waking the plan again).
    let mut versions = BTreeSet::new();
    let mut template_uids = BTreeSet::new();
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_secs(8) {
        let p = or_panic(e.plan("svc").await);
        versions.insert(str_at(&p, &["metadata", "resourceVersion"]).to_string());
        for t in or_panic(
            e.templates()
                .list_metadata(
                    &ListParams::default().labels("app.kubernetes.io/managed-by=raygate"),
                )
                .await
                .map_err(Into::into),
        )
        .items
        {
            template_uids.insert(t.metadata.uid.unwrap_or_default());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "(c) in 8 s without the API: {} plan versions, {} PodTemplate uids",
        versions.len(),
        template_uids.len()
    );
    assert!(
        versions.len() <= 3 && template_uids.len() <= 2,
        "churn without the CRD: {} plan versions, {} PodTemplates created",
        versions.len(),
        template_uids.len()
    );
    // raygate restarted while the API is missing (as when installed before the autoscaler's
    // CRDs): it starts without the CapacityBuffer cache (20 s), reports the same failure.
    let tr = Instant::now();
    e.raygate().kill();
    e.rg = None;
    e.rg = Some(or_panic(spawn_raygate(&e.cp, &e.kubeconfig)));
    let started = jiff::Timestamp::now();
    or_panic(
        wait_for("the new raygate up and reporting", T, || async {
            let p = e.plan("svc").await?;
            let r = e.rg.as_ref().expect("raygate runs");
            let said = r.logs();
            Ok(
                if said.contains("did not sync within")
                    && request_state(&p) == "Failed"
                    && said.contains("creating the capacity request")
                {
                    Check::Done(())
                } else {
                    Check::NotYet(format!("{} since {started}", describe(&p)))
                },
            )
        })
        .await,
    );
    eprintln!(
        "(c) raygate restarted without the CRD: started and reporting in {:?}",
        tr.elapsed()
    );
    or_panic(e.cp.kubectl_ok(&["create", "-f", &crd_file.to_string_lossy()]));
    or_panic(e.cp.kubectl_ok(&["wait", "--for=condition=Established", "crd", crd_name]));
    let back = Instant::now();
    or_panic(e.worker_request("svc").await);
    or_panic(
        wait_for("the buffers applied again", T, || async {
            let b = e.buffers_by_plan().await.unwrap_or_default();
            Ok(if b.values().map(BTreeMap::len).sum::<usize>() == 2 {
                Check::Done(())
            } else {
                Check::NotYet(format!("{b:?}"))
            })
        })
        .await,
    );
    eprintln!(
        "(c) CRD back: buffers applied again in {:?}",
        back.elapsed()
    );
    or_panic(e.set_gpu_limit(32).await);
    or_panic(e.until_completed("svc", &mut seen).await);
    assert_eq!(seen.len(), before.len() + 1, "one node: {seen:?}");
    inv.assert_clean("(c) CapacityBuffer CRD removed and installed again");
    eprintln!("(c) done in {:?}", tc.elapsed());

    // (p) The plan deleted while its request is open: the gate given back, the request
    // deleted (the invariants watch both).
    or_panic(e.consolidated_to(1, &mut seen).await);
    let tp = Instant::now();
    // The pool may not grow: any new node would exceed 8 GPUs.
    or_panic(e.set_gpu_limit(8).await);
    or_panic(e.change("svc", "rayproject/ray:2.14.0-gpu", None).await);
    or_panic(e.worker_request("svc").await);
    or_panic(
        e.plans()
            .delete("svc", &Default::default())
            .await
            .map(|_| ())
            .map_err(Into::into),
    );
    or_panic(
        wait_for("the gate given back and the request deleted", T, || async {
            let svc = serde_json::to_value(e.services().get("svc").await?)?;
            let gate = str_at(&svc, &["spec", "upgradeStrategy", "type"]).to_string();
            let b = e.buffers_by_plan().await?;
            let t = e
                .templates()
                .list_metadata(
                    &ListParams::default().labels("app.kubernetes.io/managed-by=raygate"),
                )
                .await?
                .items
                .len();
            Ok(if gate != "None" && b.is_empty() && t == 0 {
                Check::Done(())
            } else {
                Check::NotYet(format!("gate {gate:?}, buffers {b:?}, templates {t}"))
            })
        })
        .await,
    );
    eprintln!(
        "(p) plan deleted with its request open: gate and request gone in {:?}",
        tp.elapsed()
    );

    // Nothing left behind: the invariants held to the end.
    tokio::time::sleep(Duration::from_secs(2)).await;
    inv.assert_clean("faults, at the end");
    e.raygate();
    inv.stop().await;
    eprintln!("faults done in {:?}", t0.elapsed());
}
