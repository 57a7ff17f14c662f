//! The PodTemplates and CapacityBuffers raygate asks the autoscaler with, for
//! one pending change. Pure.
//!
//! One shape per pod group of the new cluster (the head, each worker group),
//! with `replicas` = its pod count: the autoscaler places a buffer's
//! placeholder pods on free capacity first and provisions nodes only for the
//! rest (Karpenter v1.15.0 `provisioner.go` `GetPendingPods` adds them to the
//! pending pods it schedules against existing nodes), so asking for the whole
//! cluster asks for exactly what is missing. Plus one shape for the plan's
//! headroom, which raygate keeps free cluster-wide on top of the new cluster.
//!
//! A placeholder pod must schedule like the real one, so the template keeps
//! what kube-scheduler and the autoscaler read: labels (pod affinity and
//! topology spread select on them), node selector, affinity, tolerations,
//! topology spread, priority class, runtime class, scheduler name, host
//! network, host ports, pod-level resources, and each container's requests as
//! pod creation would leave them (defaulted from limits, LimitRange
//! defaults): no admission runs on a PodTemplate, and the autoscaler reads its
//! requests as written. Commands, env, probes and volumes are dropped
//! (Karpenter drops PVC and ephemeral volumes itself, `virtualpods.sanitizeVirtualPodSpec`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, LimitRange, Pod, PodSpec, PodTemplate, PodTemplateSpec,
    ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::buffer::{CapacityBuffer, CapacityBufferSpec, LocalObjectRef};
use super::{ANNOTATION_PLAN, LABEL_FINGERPRINT, LABEL_PLAN_UID, LABEL_SHAPE, MANAGED_BY};
use crate::capacity::requests::admitted_container_requests;
use crate::capacity::{PodGroup, ResourceList, is_extended_resource};
use crate::podgroup::PodRole;
use crate::quantity::Quantity;

/// The image of containers without one (placeholder pods never run).
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// The most placeholder pods one headroom is split into.
const MAX_HEADROOM_CHUNKS: i64 = 64;
/// Kubernetes' longest object name.
const MAX_NAME: usize = 253;
/// Kubernetes' longest label value.
const MAX_LABEL_VALUE: usize = 63;

/// One pod shape of a request: a template and how many pods of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// `head`, `worker-<group>` or `headroom`: names the objects.
    pub key: String,
    pub template: PodTemplateSpec,
    pub replicas: i32,
}

/// The shapes of a new cluster's pods (groups from
/// [`crate::kuberay::planned_groups`]) and of `headroom`. `limit_ranges`
/// are the namespace's, applied as pod creation would.
pub fn shapes(
    groups: &[PodGroup],
    headroom: &ResourceList,
    limit_ranges: &[LimitRange],
) -> crate::Result<Vec<Shape>> {
    let mut out: Vec<Shape> = Vec::new();
    for (i, g) in groups.iter().enumerate().filter(|(_, g)| g.count > 0) {
        let requests = admitted_container_requests(&g.template, limit_ranges)?;
        let mut key =
            PodRole::of(&g.template).map_or_else(|| format!("group-{i}"), |r| r.to_string());
        if out.iter().any(|s| s.key == key) {
            key = format!("{key}-{i}");
        }
        out.push(Shape {
            key,
            template: scheduling_template(&g.template, &requests),
            // Bounded by MAX_PLANNED_PODS (10,000) when the groups were planned.
            replicas: i32::try_from(g.count).unwrap_or(i32::MAX),
        });
    }
    out.extend(headroom_shape(headroom));
    Ok(out)
}

/// What a placeholder pod of `pod` must carry to schedule as it will:
/// `requests` are each container's admitted requests, by name.
pub fn scheduling_template(pod: &Pod, requests: &[(String, ResourceList)]) -> PodTemplateSpec {
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let requested = |name: &str| {
        requests
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| quantities(r))
    };
    let container = |c: &Container| Container {
        name: c.name.clone(),
        image: Some(
            c.image
                .clone()
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| PAUSE_IMAGE.to_string()),
        ),
        resources: Some(ResourceRequirements {
            requests: requested(&c.name).filter(|r| !r.is_empty()),
            limits: c
                .resources
                .as_ref()
                .and_then(|r| r.limits.clone())
                .filter(|l| !l.is_empty()),
            ..Default::default()
        }),
        ports: c
            .ports
            .as_ref()
            .map(|ps| {
                ps.iter()
                    .filter(|p| p.host_port.is_some())
                    .map(|p| ContainerPort {
                        container_port: p.container_port,
                        host_port: p.host_port,
                        host_ip: p.host_ip.clone(),
                        protocol: p.protocol.clone(),
                        name: None,
                    })
                    .collect::<Vec<_>>()
            })
            .filter(|ps| !ps.is_empty()),
        restart_policy: c.restart_policy.clone(),
        ..Default::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: pod.metadata.labels.clone(),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: spec.containers.iter().map(container).collect(),
            init_containers: spec
                .init_containers
                .as_ref()
                .map(|cs| cs.iter().map(container).collect())
                .filter(|cs: &Vec<Container>| !cs.is_empty()),
            node_selector: spec.node_selector.clone(),
            affinity: spec.affinity.clone(),
            tolerations: spec.tolerations.clone(),
            topology_spread_constraints: spec.topology_spread_constraints.clone(),
            priority_class_name: spec.priority_class_name.clone(),
            runtime_class_name: spec.runtime_class_name.clone(),
            scheduler_name: spec.scheduler_name.clone(),
            host_network: spec.host_network,
            resources: spec.resources.clone(),
            ..Default::default()
        }),
    }
}

fn quantities(list: &ResourceList) -> BTreeMap<String, K8sQuantity> {
    list.iter()
        .filter(|(_, q)| !q.is_zero())
        .map(|(k, q)| (k.clone(), K8sQuantity(q.canonical())))
        .collect()
}

/// Resources the apiserver lets a request exceed its limit for; any other
/// (GPUs, hugepages) needs limit = request.
fn overcommittable(resource: &str) -> bool {
    matches!(resource, "cpu" | "memory" | "ephemeral-storage")
}

/// The headroom as placeholder pods: raygate keeps it free cluster-wide, not
/// on one node, so it is split into as many pods as its largest whole
/// accelerator count (2 GPUs: two 1-GPU pods), each with an equal share of
/// every resource rounded up, tolerating every taint (the fit counts free
/// capacity on every schedulable node).
fn headroom_shape(headroom: &ResourceList) -> Option<Shape> {
    let wanted: ResourceList = headroom
        .iter()
        .filter(|(_, q)| !q.is_zero() && !q.is_negative())
        .map(|(k, q)| (k.clone(), q.clone()))
        .collect();
    if wanted.is_empty() {
        return None;
    }
    let chunks = wanted
        .iter()
        .filter(|(k, _)| is_extended_resource(k))
        .map(|(_, q)| i64::try_from(q.value()).unwrap_or(i64::MAX))
        .max()
        .unwrap_or(1)
        .clamp(1, MAX_HEADROOM_CHUNKS);
    let share: ResourceList = wanted
        .iter()
        .map(|(k, q)| {
            let n = i128::from(chunks);
            let nanos = q.as_nanos();
            let each = nanos / n + i128::from(nanos % n != 0);
            (k.clone(), Quantity::from_nanos(each, q.format()))
        })
        .collect();
    let limits: ResourceList = share
        .iter()
        .filter(|(k, _)| !overcommittable(k))
        .map(|(k, q)| (k.clone(), q.clone()))
        .collect();
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    MANAGED_BY.to_string(),
                ),
                (LABEL_SHAPE.to_string(), "headroom".to_string()),
            ])),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "headroom".to_string(),
                image: Some(PAUSE_IMAGE.to_string()),
                resources: Some(ResourceRequirements {
                    requests: Some(quantities(&share)),
                    limits: Some(quantities(&limits)).filter(|l| !l.is_empty()),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".to_string()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    };
    Some(Shape {
        key: "headroom".to_string(),
        template,
        replicas: chunks as i32,
    })
}

/// The plan that owns a request.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

/// The objects of one shape: its PodTemplate and the CapacityBuffer naming it.
#[derive(Debug, Clone, PartialEq)]
pub struct Objects {
    pub template: PodTemplate,
    pub buffer: CapacityBuffer,
}

/// The PodTemplate and CapacityBuffer of each shape, named after the plan,
/// the change and the shape (so a restarted raygate applies the same names
/// and never duplicates them), owned by the plan (deleted with it) and
/// labelled so they are found again by plan uid and fingerprint.
pub fn objects(
    owner: Owner<'_>,
    fingerprint: &str,
    strategy: &str,
    shapes: &[Shape],
) -> Vec<Objects> {
    shapes
        .iter()
        .map(|s| {
            let name = object_name(owner.name, fingerprint, &s.key);
            let meta = ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(owner.namespace.to_string()),
                labels: Some(labels(owner.uid, fingerprint, &s.key)),
                annotations: Some(BTreeMap::from([(
                    ANNOTATION_PLAN.to_string(),
                    owner.name.to_string(),
                )])),
                owner_references: Some(vec![OwnerReference {
                    api_version: "raygate.io/v1alpha1".to_string(),
                    kind: "UpgradePlan".to_string(),
                    name: owner.name.to_string(),
                    uid: owner.uid.to_string(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..Default::default()
            };
            let template = PodTemplate {
                metadata: meta.clone(),
                template: Some(s.template.clone()),
            };
            let mut buffer = CapacityBuffer::new(
                &name,
                CapacityBufferSpec {
                    provisioning_strategy: Some(strategy.to_string()),
                    pod_template_ref: Some(LocalObjectRef { name: name.clone() }),
                    replicas: Some(s.replicas),
                },
            );
            buffer.metadata = meta;
            Objects { template, buffer }
        })
        .collect()
}

/// The labels raygate finds its objects by.
pub fn labels(plan_uid: &str, fingerprint: &str, shape: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_string(),
            MANAGED_BY.to_string(),
        ),
        (LABEL_PLAN_UID.to_string(), label_value(plan_uid)),
        (LABEL_FINGERPRINT.to_string(), label_value(fingerprint)),
        (LABEL_SHAPE.to_string(), label_value(shape)),
    ])
}

/// `<plan>-<fingerprint>-<shape>`, a valid object name: lower case, `[a-z0-9.-]`,
/// at most 253 characters (cut with a hash of the whole when longer).
pub fn object_name(plan: &str, fingerprint: &str, shape: &str) -> String {
    let fp: String = fingerprint.chars().take(12).collect();
    let full = sanitize(&format!("{plan}-{fp}-{shape}"));
    if full.len() <= MAX_NAME {
        return full;
    }
    let hash = short_hash(&full);
    let keep: String = full.chars().take(MAX_NAME - hash.len() - 1).collect();
    format!("{}-{hash}", keep.trim_end_matches(['-', '.']))
}

fn sanitize(s: &str) -> String {
    let lower: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = lower.trim_matches(['-', '.']);
    if trimmed.is_empty() {
        "x".to_string()
    } else {
        trimmed.to_string()
    }
}

/// A valid label value: `[A-Za-z0-9._-]`, alphanumeric at both ends, at most 63.
fn label_value(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(MAX_LABEL_VALUE)
        .collect();
    cleaned
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// 8 hex digits of FNV-1a: stable across releases and platforms.
fn short_hash(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberay::{KubeRayVersion, RayService, planned_groups};
    use serde_json::json;

    fn sample() -> RayService {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/samples/ray_v1_rayservice_llm_gpu.yaml"
        ))
        .unwrap();
        serde_saphyr::from_str(&text).unwrap()
    }

    fn groups() -> Vec<PodGroup> {
        let svc = sample();
        planned_groups(
            "llm-next",
            "ml",
            svc.cluster_config().unwrap(),
            KubeRayVersion::latest(),
        )
        .unwrap()
    }

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn one_shape_per_group_with_its_pod_count_and_the_pods_scheduling_fields() {
        let gs = groups();
        let s = shapes(&gs, &ResourceList::new(), &[]).unwrap();
        assert_eq!(s.len(), gs.len());
        assert_eq!(s[0].key, "head");
        for (shape, g) in s.iter().zip(&gs) {
            assert_eq!(shape.replicas as usize, g.count);
            let t = shape.template.spec.as_ref().unwrap();
            let p = g.template.spec.as_ref().unwrap();
            assert_eq!(t.node_selector, p.node_selector);
            assert_eq!(t.affinity, p.affinity);
            assert_eq!(t.tolerations, p.tolerations);
            assert_eq!(
                shape.template.metadata.as_ref().unwrap().labels,
                g.template.metadata.labels
            );
            let names: Vec<_> = t.containers.iter().map(|c| &c.name).collect();
            let want: Vec<_> = p.containers.iter().map(|c| &c.name).collect();
            assert_eq!(names, want);
            assert!(
                t.containers
                    .iter()
                    .all(|c| c.env.is_none() && c.command.is_none())
            );
        }
        assert!(s.iter().any(|x| x.key.starts_with("worker-")), "{s:?}");
    }

    /// The placeholder asks for what the pod will be admitted with: requests
    /// from limits, LimitRange defaults, and the same effective request.
    #[test]
    fn requests_are_written_as_admission_would_leave_them() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "w", "namespace": "ml",
                "labels": {"ray.io/node-type": "worker", "ray.io/group": "gpu"}},
            "spec": {
                "initContainers": [{"name": "init", "image": "busybox"}],
                "containers": [{"name": "ray-worker", "image": "ray:2",
                    "env": [{"name": "A", "value": "b"}],
                    "ports": [{"containerPort": 8265}, {"containerPort": 9000, "hostPort": 9000}],
                    "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "4"}}}]}
        }))
        .unwrap();
        let lr: LimitRange = serde_json::from_value(json!({
            "metadata": {"name": "d", "namespace": "ml"},
            "spec": {"limits": [{"type": "Container", "defaultRequest": {"memory": "1Gi"}}]}
        }))
        .unwrap();
        let s = shapes(
            &[PodGroup::indexed(pod.clone(), 3, "w-".into())],
            &ResourceList::new(),
            std::slice::from_ref(&lr),
        )
        .unwrap();
        assert_eq!(s[0].key, "worker-gpu");
        assert_eq!(s[0].replicas, 3);
        let t = s[0].template.spec.as_ref().unwrap();
        let c = &t.containers[0];
        let req = c.resources.as_ref().unwrap().requests.as_ref().unwrap();
        assert_eq!(req["nvidia.com/gpu"].0, "8");
        assert_eq!(req["cpu"].0, "4");
        assert_eq!(req["memory"].0, "1Gi");
        assert!(c.env.is_none());
        assert_eq!(c.ports.as_ref().unwrap().len(), 1, "only host ports matter");
        let init = &t.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            init.resources.as_ref().unwrap().requests.as_ref().unwrap()["memory"].0,
            "1Gi"
        );
        // The same effective request as the fit computes for the real pod.
        let as_pod = Pod {
            metadata: Default::default(),
            spec: s[0].template.spec.clone(),
            status: None,
        };
        assert_eq!(
            crate::capacity::pod_requests(&as_pod, &[]).unwrap(),
            crate::capacity::pod_requests(&pod, &[lr]).unwrap()
        );
    }

    #[test]
    fn headroom_is_split_per_accelerator_and_rounded_up() {
        let h = ResourceList::from([
            ("nvidia.com/gpu".to_string(), q("2")),
            ("cpu".to_string(), q("3")),
            ("memory".to_string(), q("1Gi")),
        ]);
        let s = shapes(&[], &h, &[]).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].key.as_str(), s[0].replicas), ("headroom", 2));
        let c = &s[0].template.spec.as_ref().unwrap().containers[0];
        let r = c.resources.as_ref().unwrap();
        let req = r.requests.as_ref().unwrap();
        assert_eq!(req["nvidia.com/gpu"].0, "1");
        assert_eq!(req["cpu"].0, "1500m");
        assert_eq!(req["memory"].0, "512Mi");
        let lim = r.limits.as_ref().unwrap();
        assert_eq!(lim.keys().collect::<Vec<_>>(), ["nvidia.com/gpu"]);
        let tol = s[0]
            .template
            .spec
            .as_ref()
            .unwrap()
            .tolerations
            .as_ref()
            .unwrap();
        assert_eq!(tol[0].operator.as_deref(), Some("Exists"));
        // No accelerator: one pod with all of it; 0.5 GPU of a fractional kind rounds up.
        let s = shapes(&[], &ResourceList::from([("cpu".to_string(), q("3"))]), &[]).unwrap();
        assert_eq!(s[0].replicas, 1);
        assert!(shapes(&[], &ResourceList::new(), &[]).unwrap().is_empty());
    }

    #[test]
    fn objects_are_owned_labelled_and_named_the_same_every_time() {
        let s = shapes(&groups(), &ResourceList::new(), &[]).unwrap();
        let owner = Owner {
            namespace: "ml",
            name: "llm",
            uid: "0d5e1f4c-aaaa-bbbb-cccc-000000000001",
        };
        let a = objects(owner, "07e0ddeed0e9", "buffer.x-k8s.io/active-capacity", &s);
        let b = objects(owner, "07e0ddeed0e9", "buffer.x-k8s.io/active-capacity", &s);
        assert_eq!(a, b);
        let first = &a[0];
        assert_eq!(
            first.template.metadata.name.as_deref(),
            Some("llm-07e0ddeed0e9-head")
        );
        assert_eq!(first.buffer.metadata.name, first.template.metadata.name);
        assert_eq!(
            first.buffer.spec.pod_template_ref.as_ref().unwrap().name,
            "llm-07e0ddeed0e9-head"
        );
        let labels = first.buffer.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_FINGERPRINT], "07e0ddeed0e9");
        assert_eq!(labels[LABEL_PLAN_UID], owner.uid);
        let owners = first.template.metadata.owner_references.as_ref().unwrap();
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].uid.as_str()),
            ("UpgradePlan", owner.uid)
        );
        let other = objects(owner, "ffffffffffff", "x", &s);
        assert_ne!(
            other[0].template.metadata.name,
            first.template.metadata.name
        );
    }

    #[test]
    fn names_and_label_values_stay_valid_however_long_or_odd_the_input() {
        let long = "a".repeat(250);
        let n = object_name(&long, "07e0ddeed0e9", "worker-GPU_group");
        assert!(n.len() <= 253, "{}", n.len());
        assert!(
            n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        );
        assert_ne!(n, object_name(&long, "07e0ddeed0e9", "worker-other"));
        assert_eq!(
            object_name("llm", "07e0ddeed0e9", "worker-GPU_x"),
            "llm-07e0ddeed0e9-worker-gpu-x"
        );
        let v = label_value(&format!("worker-{}", "g".repeat(80)));
        assert!(v.len() <= 63);
        assert_eq!(label_value("-x-"), "x");
    }
}
