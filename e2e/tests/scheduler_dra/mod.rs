//! Dynamic Resource Allocation against the real v1.36 kube-scheduler: GPUs published in
//! ResourceSlices (the test creates them, standing in for a DRA driver's kubelet plugin, which
//! publishes them), a DeviceClass `gpu` that maps `nvidia.com/gpu` (DRAExtendedResource, on by
//! default in v1.36) and a class `h100` selecting on a device attribute, ResourceClaimTemplates
//! (kube-controller-manager's resourceclaim-controller makes the claims), and pods already
//! holding devices through the claims the scheduler made for them.
//!
//! Every case has its own kwok nodes; its RayCluster's pods select them. raygate's fit (read
//! from `kubectl get ...,resourceslices,deviceclasses,resourceclaims,resourceclaimtemplates`)
//! predicts how many of the cluster's pods get a node; the real scheduler then binds them or
//! marks them Unschedulable, and the counts must agree, and agree with the case's design.

use super::*;

const DRIVER: &str = "gpu.example.com";
/// A node label naming the node, for pods already running on a given node.
const NODE_LABEL: &str = "e2e.raygate.dev/dra-node";

/// One ResourceSlice of a node's pool (the pool is named after the node).
struct SliceSpec {
    generation: i64,
    count: i64,
    devices: usize,
    product: &'static str,
}

fn gpus(devices: usize, product: &'static str) -> SliceSpec {
    SliceSpec {
        generation: 1,
        count: 1,
        devices,
        product,
    }
}

struct DraNode {
    /// `nvidia.com/gpu` in allocatable (a device plugin's); 0 for none.
    plugin_gpus: u32,
    slices: Vec<SliceSpec>,
}

fn dra(slices: Vec<SliceSpec>) -> DraNode {
    DraNode {
        plugin_gpus: 0,
        slices,
    }
}

pub(crate) struct DraCase {
    id: &'static str,
    why: &'static str,
    nodes: Vec<DraNode>,
    /// Pods bound before: (node index, `nvidia.com/gpu`); the scheduler allocates their devices.
    existing: Vec<(usize, u32)>,
    /// The worker group's pod spec (container `ray-worker`'s resources, `resourceClaims`).
    worker: Value,
    replicas: u32,
    /// Pods (head included) the scheduler binds, by design.
    bound: usize,
}

fn gpu_worker(n: u32) -> Value {
    json!({"containers": [{"name": "ray-worker", "image": IMAGE, "resources": {
        "requests": {"cpu": "500m", "memory": "128Mi", "nvidia.com/gpu": n.to_string()},
        "limits": {"nvidia.com/gpu": n.to_string()}}}]})
}

fn claim_worker(template: &str) -> Value {
    json!({
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
        "containers": [{"name": "ray-worker", "image": IMAGE, "resources": {
            "requests": {"cpu": "500m", "memory": "128Mi"}, "claims": [{"name": "gpus"}]}}],
    })
}

pub(crate) fn cases() -> Vec<DraCase> {
    let two_gens = |newest: usize| {
        vec![
            gpus(8, "H100"),
            SliceSpec {
                generation: 2,
                count: 1,
                devices: newest,
                product: "H100",
            },
        ]
    };
    vec![
        DraCase {
            id: "dra-mapped-all-fit",
            why: "nvidia.com/gpu through the DeviceClass on two 8-device DRA nodes: 2 x 8",
            nodes: vec![dra(vec![gpus(8, "H100")]), dra(vec![gpus(8, "H100")])],
            existing: vec![],
            worker: gpu_worker(8),
            replicas: 2,
            bound: 3,
        },
        DraCase {
            id: "dra-mapped-all-short",
            why: "the same nodes, 3 x 8: one worker finds no devices",
            nodes: vec![dra(vec![gpus(8, "H100")]), dra(vec![gpus(8, "H100")])],
            existing: vec![],
            worker: gpu_worker(8),
            replicas: 3,
            bound: 3,
        },
        DraCase {
            id: "dra-mapped-some",
            why: "device plugin (4 in allocatable) on one node, DRA (8) on the other: 2 x 6",
            nodes: vec![
                DraNode {
                    plugin_gpus: 4,
                    slices: vec![],
                },
                dra(vec![gpus(8, "H100")]),
            ],
            existing: vec![],
            worker: gpu_worker(6),
            replicas: 2,
            bound: 2,
        },
        DraCase {
            id: "dra-mapped-some-fit",
            why: "the same mixed nodes, 3 x 4",
            nodes: vec![
                DraNode {
                    plugin_gpus: 4,
                    slices: vec![],
                },
                dra(vec![gpus(8, "H100")]),
            ],
            existing: vec![],
            worker: gpu_worker(4),
            replicas: 3,
            bound: 4,
        },
        DraCase {
            id: "dra-template-fragmented",
            why: "a claim of 2 from a template; 7 of 8 held on each node: 2 free, not on one node",
            nodes: vec![dra(vec![gpus(8, "H100")]), dra(vec![gpus(8, "H100")])],
            existing: vec![(0, 7), (1, 7)],
            worker: claim_worker("two"),
            replicas: 1,
            bound: 1,
        },
        DraCase {
            id: "dra-template-fits",
            why: "the same claim; 7 and 6 held: 2 free on the second node",
            nodes: vec![dra(vec![gpus(8, "H100")]), dra(vec![gpus(8, "H100")])],
            existing: vec![(0, 7), (1, 6)],
            worker: claim_worker("two"),
            replicas: 1,
            bound: 2,
        },
        DraCase {
            id: "dra-allocated-refused",
            why: "5 of 8 devices held by another pod's claim: 4 more do not fit",
            nodes: vec![dra(vec![gpus(8, "H100")])],
            existing: vec![(0, 5)],
            worker: gpu_worker(4),
            replicas: 1,
            bound: 1,
        },
        DraCase {
            id: "dra-allocated-fits",
            why: "5 of 8 held: 3 fit",
            nodes: vec![dra(vec![gpus(8, "H100")])],
            existing: vec![(0, 5)],
            worker: gpu_worker(3),
            replicas: 1,
            bound: 2,
        },
        DraCase {
            id: "dra-selector",
            why: "class h100 selects productName: 8 A100 and 4 H100, 2 workers of 4 H100",
            nodes: vec![dra(vec![gpus(8, "A100")]), dra(vec![gpus(4, "H100")])],
            existing: vec![],
            worker: claim_worker("h100x4"),
            replicas: 2,
            bound: 2,
        },
        DraCase {
            id: "dra-all-mode",
            why: "allocationMode All: a node with one device held refuses, a free one takes one",
            nodes: vec![dra(vec![gpus(8, "H100")]), dra(vec![gpus(2, "H100")])],
            existing: vec![(0, 1)],
            worker: claim_worker("all"),
            replicas: 2,
            bound: 2,
        },
        DraCase {
            id: "dra-two-generations",
            why: "a pool republished: generation 1 had 8 devices, generation 2 has 2: 3 refused",
            nodes: vec![dra(two_gens(2))],
            existing: vec![],
            worker: gpu_worker(3),
            replicas: 1,
            bound: 1,
        },
        DraCase {
            id: "dra-two-generations-fit",
            why: "the same pool: 2 fit",
            nodes: vec![dra(two_gens(2))],
            existing: vec![],
            worker: gpu_worker(2),
            replicas: 1,
            bound: 2,
        },
        DraCase {
            id: "dra-incomplete-pool",
            why: "generation 2 says 2 slices, 1 is there: the pool is being updated, no device counts",
            nodes: vec![dra(vec![
                gpus(8, "H100"),
                SliceSpec {
                    generation: 2,
                    count: 2,
                    devices: 4,
                    product: "H100",
                },
            ])],
            existing: vec![],
            worker: gpu_worker(1),
            replicas: 1,
            bound: 1,
        },
        DraCase {
            id: "dra-first-available",
            why: "firstAvailable: 4 H100 (none on this A100 node), else 1 of any",
            nodes: vec![dra(vec![gpus(2, "A100")])],
            existing: vec![],
            worker: claim_worker("fa"),
            replicas: 2,
            bound: 3,
        },
    ]
}

fn node_name(c: &DraCase, i: usize) -> String {
    format!("{}-{i}", c.id)
}

/// The cluster-wide DeviceClasses and the namespace's ResourceClaimTemplates.
fn shared_objects(ns: &str) -> Vec<Value> {
    let driver = json!({"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}});
    let template = |name: &str, requests: Value| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": requests}}}})
    };
    vec![
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "gpu"},
            "spec": {"selectors": [driver], "extendedResourceName": "nvidia.com/gpu"}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "h100"},
            "spec": {"selectors": [driver, {"cel": {"expression":
                format!("device.attributes[\"{DRIVER}\"].productName == \"H100\"")}}]}}),
        template(
            "two",
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu", "count": 2}}]),
        ),
        template(
            "h100x4",
            json!([{"name": "g", "exactly": {"deviceClassName": "h100", "count": 4}}]),
        ),
        template(
            "all",
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}}]),
        ),
        template(
            "fa",
            json!([{"name": "g", "firstAvailable": [
                {"name": "h100", "deviceClassName": "h100", "count": 4},
                {"name": "any", "deviceClassName": "gpu", "count": 1}]}]),
        ),
    ]
}

/// A node's ResourceSlices: pool = node name, one slice per spec, devices `gpu-0..`.
fn slices(c: &DraCase, i: usize) -> Vec<Value> {
    let node = node_name(c, i);
    c.nodes[i]
        .slices
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let devices: Vec<Value> = (0..s.devices)
                .map(|d| {
                    json!({"name": format!("gpu-{}-{d}", s.generation), "attributes": {
                        "productName": {"string": s.product}, "index": {"int": d}}})
                })
                .collect();
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": format!("{node}-{k}")},
                "spec": {"driver": DRIVER, "nodeName": node,
                    "pool": {"name": node, "generation": s.generation,
                        "resourceSliceCount": s.count},
                    "devices": devices}})
        })
        .collect()
}

fn kubectl_create(cp: &ControlPlane, dir: &Path, name: &str, items: Vec<Value>) -> Result<()> {
    let file = dir.join(name);
    std::fs::write(
        &file,
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": items}))?,
    )?;
    let path = file.to_string_lossy().into_owned();
    cp.kubectl_ok(&["create", "-f", &path])?;
    Ok(())
}

fn dra_cluster_config(c: &DraCase) -> Value {
    json!({
        "rayVersion": "2.46.0",
        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": select(&head("500m"), c.id)}},
        "workerGroupSpecs": [{
            "groupName": "gpu",
            "replicas": c.replicas, "minReplicas": c.replicas, "maxReplicas": c.replicas,
            "rayStartParams": {},
            "template": {"spec": select(&c.worker, c.id)},
        }],
    })
}

/// `raygate fit -o json`: how many of the new cluster's pods it places.
fn raygate_placed(bin: &Path, dir: &Path, ns: &str, c: &DraCase, state: &Path) -> Result<usize> {
    let svc = dir.join(format!("{}.rayservice.json", c.id));
    std::fs::write(
        &svc,
        serde_json::to_vec_pretty(&json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": c.id, "namespace": ns},
            "spec": {"rayClusterConfig": dra_cluster_config(c)},
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
    let placed = v["placements"]
        .as_object()
        .with_context(|| format!("raygate fit for {}: no placements in {v}", c.id))?
        .len();
    if placed != c.bound {
        eprintln!("{}: raygate says {}", c.id, v["unplaced"]);
    }
    Ok(placed)
}

/// Runs every DRA case at once on `cp` (the scheduler suite's control plane).
pub(crate) async fn body(cp: &ControlPlane, bin: &Path) -> Result<()> {
    let cases = cases();
    let client: Client = cp.client().await?;
    let ns = create_namespace(&client, "dra").await?;
    let dir = tempfile::tempdir()?;
    let mut nodes = Vec::new();
    for c in &cases {
        for (i, n) in c.nodes.iter().enumerate() {
            nodes.push(
                FakeNode::new(node_name(c, i))
                    .gpu(n.plugin_gpus)
                    .label(CASE_LABEL, c.id)
                    .label(NODE_LABEL, node_name(c, i)),
            );
        }
    }
    for r in futures::future::join_all(nodes.iter().map(|n| n.create(&client))).await {
        r?;
    }
    let mut objects = shared_objects(&ns);
    for c in &cases {
        for i in 0..c.nodes.len() {
            objects.extend(slices(c, i));
        }
    }
    kubectl_create(cp, dir.path(), "dra.json", objects)?;

    // Pods already holding devices: the scheduler allocates them through its own claims.
    let pods: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &pod_resource());
    let mut running = Vec::new();
    for c in &cases {
        for (k, &(i, n)) in c.existing.iter().enumerate() {
            let name = format!("{}-holds-{k}", c.id);
            pods.create(
                &PostParams::default(),
                &dyn_obj(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {
                        "nodeSelector": {NODE_LABEL: node_name(c, i)},
                        "containers": [{"name": "app", "image": IMAGE, "resources": {
                            "requests": {"cpu": "100m", "nvidia.com/gpu": n.to_string()},
                            "limits": {"nvidia.com/gpu": n.to_string()}}}],
                    },
                }))?,
            )
            .await
            .with_context(|| format!("create pod {name}"))?;
            running.push(name);
        }
    }
    for name in &running {
        wait_for(&format!("pod {name} bound"), T, || async {
            let p = serde_json::to_value(pods.get(name).await?)?;
            Ok(if str_at(&p, &["spec", "nodeName"]).is_empty() {
                Check::NotYet("not bound".to_string())
            } else {
                Check::Done(())
            })
        })
        .await?;
    }

    // What raygate sees: the state as kubectl prints it, DRA kinds included.
    let state = dir.path().join("state.yaml");
    let out = cp.kubectl(&[
        "get",
        "nodes,pods,limitranges,runtimeclasses,resourceslices,deviceclasses,resourceclaims,resourceclaimtemplates",
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
        predicted.insert(c.id, raygate_placed(bin, dir.path(), &ns, c, &state)?);
    }

    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &raycluster_resource());
    for c in &cases {
        clusters
            .create(
                &PostParams::default(),
                &dyn_obj(json!({
                    "apiVersion": "ray.io/v1", "kind": "RayCluster",
                    "metadata": {"name": c.id},
                    "spec": dra_cluster_config(c),
                }))?,
            )
            .await
            .with_context(|| format!("create RayCluster {}", c.id))?;
    }
    let mut observed = BTreeMap::new();
    for c in &cases {
        let want = 1 + c.replicas as usize;
        let bound = wait_for(
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
                    Some(_) => Check::Done(
                        v.iter()
                            .filter(|p| !str_at(p, &["spec", "nodeName"]).is_empty())
                            .count(),
                    ),
                    None => Check::NotYet(format!("{} of {want} pods, not all decided", v.len())),
                })
            },
        )
        .await?;
        observed.insert(c.id, bound);
    }

    let mut problems = Vec::new();
    // What the real operator puts in the pods it creates: raygate plans each worker pod
    // with the template's `resourceClaims` and the container's `resources.claims` as
    // written (kuberay::pods), so KubeRay must pass them through unchanged, and a bound
    // pod's claim is the one the resourceclaim-controller made from the template.
    for c in &cases {
        let l = pods
            .list(
                &ListParams::default()
                    .labels(&format!("ray.io/cluster={},ray.io/node-type=worker", c.id)),
            )
            .await?;
        let want_claims = &c.worker["resourceClaims"];
        let want_refs = &c.worker["containers"][0]["resources"]["claims"];
        for pod in l.items.iter().map(serde_json::to_value) {
            let pod = pod?;
            let name = str_at(&pod, &["metadata", "name"]).to_string();
            let worker = arr_at(&pod, &["spec", "containers"])
                .iter()
                .find(|k| str_at(k, &["name"]) == "ray-worker")
                .cloned()
                .unwrap_or(Value::Null);
            if &pod["spec"]["resourceClaims"] != want_claims
                || &worker["resources"]["claims"] != want_refs
            {
                problems.push(format!(
                    "{}: KubeRay's pod {name} carries resourceClaims {} and container claims {}, \
                     the template {want_claims} and {want_refs}",
                    c.id, pod["spec"]["resourceClaims"], worker["resources"]["claims"]
                ));
            }
            let bound = !str_at(&pod, &["spec", "nodeName"]).is_empty();
            if bound && want_claims.is_array() {
                let made = arr_at(&pod, &["status", "resourceClaimStatuses"])
                    .iter()
                    .any(|s| {
                        str_at(s, &["name"]) == "gpus"
                            && !str_at(s, &["resourceClaimName"]).is_empty()
                    });
                if !made {
                    problems.push(format!(
                        "{}: bound pod {name} has no claim made from its template: {}",
                        c.id, pod["status"]["resourceClaimStatuses"]
                    ));
                }
            }
        }
    }
    for c in &cases {
        let (p, o) = (predicted[c.id], observed[c.id]);
        eprintln!(
            "{:<28} scheduler binds {o} raygate places {p} of {}  {}",
            c.id,
            1 + c.replicas,
            c.why
        );
        if p != o {
            problems.push(format!(
                "{}: the scheduler binds {o} pods, raygate places {p} ({})",
                c.id, c.why
            ));
        }
        if o != c.bound {
            problems.push(format!(
                "{}: the scheduler binds {o} pods, the case was designed for {} ({})",
                c.id, c.bound, c.why
            ));
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(())
}
