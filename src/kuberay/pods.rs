//! The pods KubeRay creates for a RayClusterSpec (for capacity planning).
//!
//! Follows `raycluster_controller.go` `reconcilePods` and `common/pod.go`
//! (`DefaultHeadPodTemplate`, `DefaultWorkerPodTemplate`, `BuildAutoscalerContainer`),
//! identical in what matters for capacity across v1.1.0 … v1.7.0:
//!
//! - a suspended cluster (`spec.suspend: true`) has no pods at all;
//! - one head pod from `headGroupSpec.template`; with `enableInTreeAutoscaling: true` an
//!   `autoscaler` sidecar is appended, with requests = limits = `500m` CPU / `512Mi`
//!   memory unless `autoscalerOptions.resources` is set, which then *replaces* the whole
//!   `resources` (`mergeAutoscalerOverrides`);
//! - per worker group `GetWorkerGroupDesiredReplicas` (see [`desired_worker_pods`]) pods,
//!   each with the `wait-gcs-ready` init container appended after the template's init
//!   containers: requests = limits = `200m` / `256Mi`, same image as the Ray container
//!   (`ENABLE_INIT_CONTAINER_INJECTION`, default on; present in every supported release).
//!
//! Not modelled (no capacity impact, or feature-gated off by default): ports, env, probes,
//! the rayStartParams rewrite, the v1.7 mTLS `wait-for-tls-ip-san` init container
//! (50m/64Mi, `RayClusterMTLS` gate + `tlsOptions.enabled`) and history-server collector
//! sidecar (`RayClusterHistoryServer` gate). Requests are *not* defaulted from limits here.
//!
//! Names: KubeRay uses `generateName` (`<cluster>-head-`, `<cluster>-<group>-worker-`,
//! prefix cut to 50 chars, lowercased) plus a random suffix; we use `<cluster>-head` (as
//! with `ENABLE_DETERMINISTIC_HEAD_POD_NAME`) and `<cluster>-<group>-worker-<i>`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use kube::api::ObjectMeta;
use serde_json::Value;

use super::types::{
    HEAD_GROUP_LABEL_VALUE, LABEL_CLUSTER, LABEL_GROUP, LABEL_IDENTIFIER, LABEL_IS_RAY_NODE,
    LABEL_NODE_TYPE, RayClusterSpec, RayService, WorkerGroupSpec, object_name,
};
use super::valid::check_resources;
use super::version::{KubeRayVersion, ReplicaClamp, Rules};
use crate::podgroup::{HEAD, MAX_PLANNED_PODS, PodGroup, WORKER};

/// Name of the injected autoscaler sidecar (`common.AutoscalerContainerName`).
pub const AUTOSCALER_CONTAINER: &str = "autoscaler";
/// Name of the injected worker init container.
pub const WAIT_GCS_READY_CONTAINER: &str = "wait-gcs-ready";
/// Autoscaler sidecar default requests = limits (`BuildAutoscalerContainer`).
pub const AUTOSCALER_DEFAULT_CPU: &str = "500m";
pub const AUTOSCALER_DEFAULT_MEMORY: &str = "512Mi";
/// `wait-gcs-ready` requests = limits (`DefaultWorkerPodTemplate`).
pub const WAIT_GCS_READY_CPU: &str = "200m";
pub const WAIT_GCS_READY_MEMORY: &str = "256Mi";

/// A planning guard: a group asking for more pods than this is rejected as malformed.
pub const MAX_PODS_PER_GROUP: i64 = 100_000;

/// Operator settings that change the pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    /// `ENABLE_INIT_CONTAINER_INJECTION` (anything but `false` → true).
    pub init_container_injection: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            init_container_injection: true,
        }
    }
}

/// Pods KubeRay creates for `spec` (default [`PlanOptions`]).
pub fn planned_pods(
    cluster_name: &str,
    namespace: &str,
    spec: &RayClusterSpec,
    version: KubeRayVersion,
) -> crate::Result<Vec<Pod>> {
    planned_pods_with(
        cluster_name,
        namespace,
        spec,
        version,
        &PlanOptions::default(),
    )
}

/// `utils.GetWorkerGroupDesiredReplicas` × hosts: the number of pods of one group.
///
/// - suspended group (v1.3.0+) → 0;
/// - v1.1–v1.5: `min > max → max`, else `replicas` nil or `< min → min`, `> max → max`;
///   v1.6.0+: no `min > max` branch (validation rejects it); nil `minReplicas` → 0,
///   nil `maxReplicas` → 2147483647 (for older releases, whose Go would dereference nil,
///   we use the same CRD defaults);
/// - × `numOfHosts` (absent → CRD default 1): v1.4.0+ inside the function (so `0` hosts
///   → 0 pods), v1.1–v1.3 in `reconcilePods` as `max(1, numOfHosts)`.
pub fn desired_worker_pods(group: &WorkerGroupSpec, rules: &Rules) -> i64 {
    if rules.worker_group_suspend && group.suspend == Some(true) {
        return 0;
    }
    let min = i64::from(group.min_replicas.unwrap_or(0));
    let max = i64::from(group.max_replicas.unwrap_or(i32::MAX));
    let replicas = group.replicas.map(i64::from);
    let clamped = match (rules.replica_clamp, replicas) {
        (ReplicaClamp::MinAboveMaxUsesMax, _) if min > max => max,
        (_, None) => min,
        (_, Some(r)) if r < min => min,
        (_, Some(r)) if r > max => max,
        (_, Some(r)) => r,
    };
    let hosts = i64::from(group.num_of_hosts.unwrap_or(1));
    if rules.desired_includes_num_of_hosts {
        clamped * hosts
    } else {
        clamped * hosts.max(1)
    }
}

fn lower_prefix(s: &str) -> String {
    let cut: String = s.chars().take(50).collect();
    cut.to_lowercase()
}

fn quantity_pair(cpu: &str, memory: &str) -> BTreeMap<String, K8sQuantity> {
    BTreeMap::from([
        ("cpu".to_string(), K8sQuantity(cpu.to_string())),
        ("memory".to_string(), K8sQuantity(memory.to_string())),
    ])
}

fn fixed_resources(cpu: &str, memory: &str) -> ResourceRequirements {
    ResourceRequirements {
        limits: Some(quantity_pair(cpu, memory)),
        requests: Some(quantity_pair(cpu, memory)),
        ..Default::default()
    }
}

fn group_labels(extra: &serde_json::Map<String, Value>) -> BTreeMap<String, String> {
    extra
        .get("labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// `labelPod`: KubeRay's labels, user labels override all but cluster/node-type/group.
fn pod_labels(
    template: &PodTemplateSpec,
    group_level: BTreeMap<String, String>,
    cluster: &str,
    node_type: &str,
    group: &str,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (LABEL_IS_RAY_NODE.to_string(), "yes".to_string()),
        (LABEL_CLUSTER.to_string(), cluster.to_string()),
        (LABEL_NODE_TYPE.to_string(), node_type.to_string()),
        (LABEL_GROUP.to_string(), group.to_string()),
        (
            LABEL_IDENTIFIER.to_string(),
            format!("{cluster}-{node_type}").chars().take(63).collect(),
        ),
        ("app.kubernetes.io/name".to_string(), "kuberay".to_string()),
        (
            "app.kubernetes.io/created-by".to_string(),
            "kuberay-operator".to_string(),
        ),
    ]);
    let user = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
        .into_iter()
        .chain(group_level);
    for (k, v) in user {
        if k == LABEL_CLUSTER || k == LABEL_NODE_TYPE || k == LABEL_GROUP {
            continue;
        }
        labels.insert(k, v);
    }
    labels
}

fn pod_spec<'a>(
    template: Option<&'a PodTemplateSpec>,
    what: &str,
) -> crate::Result<(&'a PodTemplateSpec, PodSpec)> {
    let template = template.ok_or_else(|| crate::Error::invalid(what, "template is missing"))?;
    let spec = template
        .spec
        .clone()
        .ok_or_else(|| crate::Error::invalid(what, "template.spec is missing"))?;
    if spec.containers.is_empty() {
        return Err(crate::Error::invalid(
            what,
            "template.spec.containers is empty (KubeRay uses the first container as the Ray container)",
        ));
    }
    Ok((template, spec))
}

fn make_pod(
    name: String,
    namespace: &str,
    template: &PodTemplateSpec,
    labels: BTreeMap<String, String>,
    spec: PodSpec,
) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.clone()),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The first container of `spec` whose resources the apiserver would refuse
/// ([`crate::kuberay::valid`]), as `(field path, reason)` under `prefix`
/// (`spec` for a RayCluster, `spec.rayClusterConfig` for a RayService).
/// Every template is checked, also of groups at zero replicas: the
/// autoscaler may scale them up.
pub fn check_cluster_resources(
    spec: &RayClusterSpec,
    prefix: &str,
) -> Result<(), (String, String)> {
    fn template(t: Option<&PodTemplateSpec>, path: &str) -> Result<(), (String, String)> {
        let Some(spec) = t.and_then(|t| t.spec.as_ref()) else {
            return Ok(());
        };
        let lists = [
            ("containers", Some(&spec.containers)),
            ("initContainers", spec.init_containers.as_ref()),
        ];
        for (kind, list) in lists {
            for (i, c) in list.into_iter().flatten().enumerate() {
                if let Some(r) = &c.resources {
                    check_resources(&format!("{path}.template.spec.{kind}[{i}]"), r)?;
                }
            }
        }
        Ok(())
    }
    if let Some(head) = &spec.head_group_spec {
        template(head.template.as_ref(), &format!("{prefix}.headGroupSpec"))?;
    }
    if spec.enable_in_tree_autoscaling == Some(true)
        && let Some(r) = spec
            .autoscaler_options
            .as_ref()
            .and_then(|o| o.resources.as_ref())
    {
        check_resources(&format!("{prefix}.autoscalerOptions"), r)?;
    }
    for (gi, group) in spec.worker_group_specs.iter().flatten().enumerate() {
        template(
            group.template.as_ref(),
            &format!("{prefix}.workerGroupSpecs[{gi}]"),
        )?;
    }
    Ok(())
}

/// A RayService's `spec.rayClusterConfig` whose pod templates the apiserver
/// would accept ([`check_cluster_resources`]): the spec a new cluster is
/// planned from.
pub fn checked_cluster_config(svc: &RayService) -> crate::Result<&RayClusterSpec> {
    let spec = svc.cluster_config()?;
    super::budget::check(spec, "spec.rayClusterConfig").map_err(|e| {
        crate::Error::invalid(
            format!("RayService {}", object_name(&svc.metadata)),
            e.to_string(),
        )
    })?;
    check_cluster_resources(spec, "spec.rayClusterConfig").map_err(|(path, why)| {
        crate::Error::invalid(
            format!("RayService {}", object_name(&svc.metadata)),
            format!("{path}: {why}"),
        )
    })?;
    Ok(spec)
}

/// Like [`planned_pods`], with operator settings.
pub fn planned_pods_with(
    cluster_name: &str,
    namespace: &str,
    spec: &RayClusterSpec,
    version: KubeRayVersion,
    opts: &PlanOptions,
) -> crate::Result<Vec<Pod>> {
    let groups = planned_groups_with(cluster_name, namespace, spec, version, opts)?;
    Ok(crate::podgroup::expand(&groups))
}

/// The pods of [`planned_pods`] as groups (head, then one per worker
/// group), refused above [`MAX_PLANNED_PODS`] in total.
pub fn planned_groups(
    cluster_name: &str,
    namespace: &str,
    spec: &RayClusterSpec,
    version: KubeRayVersion,
) -> crate::Result<Vec<PodGroup>> {
    planned_groups_with(
        cluster_name,
        namespace,
        spec,
        version,
        &PlanOptions::default(),
    )
}

/// [`planned_groups`] with operator settings.
pub fn planned_groups_with(
    cluster_name: &str,
    namespace: &str,
    spec: &RayClusterSpec,
    version: KubeRayVersion,
    opts: &PlanOptions,
) -> crate::Result<Vec<PodGroup>> {
    let rules = version.rules();
    let what = format!("RayCluster {namespace}/{cluster_name}");
    if spec.suspend == Some(true) {
        return Ok(Vec::new());
    }
    super::budget::check(spec, "spec").map_err(|e| crate::Error::invalid(&what, e.to_string()))?;
    check_cluster_resources(spec, "spec")
        .map_err(|(path, why)| crate::Error::invalid(&what, format!("{path}: {why}")))?;
    let mut pods = Vec::new();

    // Head.
    let head = spec
        .head_group_spec
        .as_ref()
        .ok_or_else(|| crate::Error::invalid(&what, "spec.headGroupSpec is missing"))?;
    let (template, mut head_spec) =
        pod_spec(head.template.as_ref(), &format!("{what} headGroupSpec"))?;
    if spec.enable_in_tree_autoscaling == Some(true) {
        let options = spec.autoscaler_options.as_ref();
        let image = options
            .and_then(|o| o.image.clone())
            .or_else(|| head_spec.containers.first().and_then(|c| c.image.clone()));
        let resources = options
            .and_then(|o| o.resources.clone())
            .unwrap_or_else(|| fixed_resources(AUTOSCALER_DEFAULT_CPU, AUTOSCALER_DEFAULT_MEMORY));
        head_spec.containers.push(Container {
            name: AUTOSCALER_CONTAINER.to_string(),
            image,
            image_pull_policy: Some("IfNotPresent".to_string()),
            resources: Some(resources),
            ..Default::default()
        });
    }
    let head_group_labels = if rules.head_fields.contains(&"labels") {
        group_labels(&head.extra)
    } else {
        BTreeMap::new()
    };
    let labels = pod_labels(
        template,
        head_group_labels,
        cluster_name,
        HEAD,
        HEAD_GROUP_LABEL_VALUE,
    );
    pods.push(PodGroup::from(make_pod(
        format!("{}-head", lower_prefix(cluster_name)),
        namespace,
        template,
        labels,
        head_spec,
    )));
    let mut total: i64 = 1;

    // Workers.
    for (gi, group) in spec.worker_group_specs.iter().flatten().enumerate() {
        let name = group
            .group_name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                crate::Error::invalid(
                    format!("{what} workerGroupSpecs[{gi}]"),
                    "worker group without groupName",
                )
            })?;
        let gwhat = format!("{what} workerGroupSpecs[{name}]");
        let count = desired_worker_pods(group, &rules);
        if count > MAX_PODS_PER_GROUP {
            return Err(crate::Error::invalid(
                gwhat,
                format!("{count} desired pods is more than {MAX_PODS_PER_GROUP}"),
            ));
        }
        if count <= 0 {
            continue;
        }
        let (template, mut worker_spec) = pod_spec(group.template.as_ref(), &gwhat)?;
        if opts.init_container_injection {
            let ray = &worker_spec.containers[0];
            let init = Container {
                name: WAIT_GCS_READY_CONTAINER.to_string(),
                image: ray.image.clone(),
                image_pull_policy: ray.image_pull_policy.clone(),
                security_context: ray.security_context.clone(),
                resources: Some(fixed_resources(WAIT_GCS_READY_CPU, WAIT_GCS_READY_MEMORY)),
                ..Default::default()
            };
            worker_spec
                .init_containers
                .get_or_insert_with(Vec::new)
                .push(init);
        }
        let group_level = if rules.worker_fields.contains(&"labels") {
            group_labels(&group.extra)
        } else {
            BTreeMap::new()
        };
        let labels = pod_labels(template, group_level, cluster_name, WORKER, name);
        let prefix = lower_prefix(&format!("{cluster_name}-{name}"));
        total = total.saturating_add(count);
        if total > MAX_PLANNED_PODS {
            return Err(crate::Error::invalid(
                &what,
                format!(
                    "{total} or more pods planned, more than the {MAX_PLANNED_PODS} raygate \
                     places for one cluster"
                ),
            ));
        }
        let worker = make_pod(
            format!("{prefix}-worker-0"),
            namespace,
            template,
            labels,
            worker_spec,
        );
        pods.push(PodGroup::indexed(
            worker,
            usize::try_from(count).unwrap_or(0),
            format!("{prefix}-worker-"),
        ));
    }
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberay::types::RayCluster;

    const MULTI: &str = include_str!("../../tests/fixtures/raycluster-multihost.yaml");
    const SVC: &str = include_str!("../../tests/fixtures/rayservice-llm.yaml");

    fn multi() -> RayCluster {
        serde_saphyr::from_str(MULTI).unwrap()
    }
    fn latest() -> KubeRayVersion {
        KubeRayVersion::latest()
    }
    fn count(pods: &[Pod], group: &str) -> usize {
        pods.iter()
            .filter(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_GROUP))
                    .map(String::as_str)
                    == Some(group)
            })
            .count()
    }
    fn res(c: &Container, kind: &str, name: &str) -> Option<String> {
        let r = c.resources.as_ref()?;
        let m = if kind == "limits" {
            r.limits.as_ref()
        } else {
            r.requests.as_ref()
        };
        m?.get(name).map(|q| q.0.clone())
    }

    #[test]
    fn multihost_clamp_and_suspend() {
        let rc = multi();
        let pods = planned_pods("train", "research", &rc.spec, latest()).unwrap();
        assert_eq!(count(&pods, HEAD_GROUP_LABEL_VALUE), 1);
        assert_eq!(count(&pods, "h100-slice"), 4, "2 replicas x 2 hosts");
        assert_eq!(
            count(&pods, "cpu-preprocess"),
            3,
            "replicas 0 clamped up to minReplicas 3"
        );
        assert_eq!(count(&pods, "a100-spare"), 0, "suspended group");
        assert_eq!(pods.len(), 8);
        let w = &pods[1];
        assert_eq!(
            w.metadata.name.as_deref(),
            Some("train-h100-slice-worker-0")
        );
        assert_eq!(w.metadata.namespace.as_deref(), Some("research"));
        let labels = w.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_CLUSTER], "train");
        assert_eq!(labels[LABEL_NODE_TYPE], "worker");
        assert_eq!(labels["accelerator"], "h100");
        let spec = w.spec.as_ref().unwrap();
        assert_eq!(spec.priority_class_name.as_deref(), Some("training-high"));
        assert!(spec.affinity.is_some() && spec.tolerations.is_some());
        assert_eq!(spec.overhead.as_ref().unwrap()["cpu"].0, "250m");
        let init = spec.init_containers.as_ref().unwrap();
        assert_eq!(init.len(), 1);
        assert_eq!(init[0].name, WAIT_GCS_READY_CONTAINER);
        assert_eq!(init[0].image.as_deref(), Some("rayproject/ray:2.41.0-gpu"));
        assert_eq!(res(&init[0], "requests", "cpu").as_deref(), Some("200m"));
        assert_eq!(res(&init[0], "limits", "memory").as_deref(), Some("256Mi"));
        assert_eq!(
            res(&spec.containers[0], "limits", "nvidia.com/gpu").as_deref(),
            Some("8")
        );
        assert!(
            res(&spec.containers[0], "requests", "cpu").is_none(),
            "no defaulting from limits here"
        );
        // Head: autoscaler with the user's resources replacing the defaults.
        let head = &pods[0];
        assert_eq!(head.metadata.name.as_deref(), Some("train-head"));
        let hs = head.spec.as_ref().unwrap();
        assert!(hs.init_containers.is_none());
        let auto = hs
            .containers
            .iter()
            .find(|c| c.name == AUTOSCALER_CONTAINER)
            .unwrap();
        assert_eq!(res(auto, "requests", "cpu").as_deref(), Some("250m"));
        assert_eq!(res(auto, "limits", "memory").as_deref(), Some("1Gi"));
        // Suspended cluster: nothing.
        let mut suspended = rc.spec.clone();
        suspended.suspend = Some(true);
        assert!(
            planned_pods("train", "research", &suspended, latest())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn autoscaler_defaults_and_version_differences() {
        let svc: RayService = serde_saphyr::from_str(SVC).unwrap();
        let spec = svc.spec.ray_cluster_config.unwrap();
        let pods = planned_pods("llm-7x9kq", "ml", &spec, latest()).unwrap();
        assert_eq!(pods.len(), 3);
        let head = pods[0].spec.as_ref().unwrap();
        assert_eq!(head.containers.len(), 2);
        let auto = &head.containers[1];
        assert_eq!(auto.name, AUTOSCALER_CONTAINER);
        assert_eq!(auto.image, head.containers[0].image);
        for kind in ["requests", "limits"] {
            assert_eq!(res(auto, kind, "cpu").as_deref(), Some("500m"));
            assert_eq!(res(auto, kind, "memory").as_deref(), Some("512Mi"));
        }
        let mut no_autoscaling = spec.clone();
        no_autoscaling.enable_in_tree_autoscaling = Some(false);
        let pods = planned_pods("x", "ml", &no_autoscaling, latest()).unwrap();
        assert_eq!(pods[0].spec.as_ref().unwrap().containers.len(), 1);
        let off = PlanOptions {
            init_container_injection: false,
        };
        let pods = planned_pods_with("x", "ml", &spec, latest(), &off).unwrap();
        assert!(pods[1].spec.as_ref().unwrap().init_containers.is_none());

        // numOfHosts 0: v1.4+ multiplies inside GetWorkerGroupDesiredReplicas → 0 pods;
        // v1.3 uses max(1, numOfHosts).
        let mut g = spec.worker_group_specs.as_ref().unwrap()[0].clone();
        g.num_of_hosts = Some(0);
        assert_eq!(desired_worker_pods(&g, &latest().rules()), 0);
        assert_eq!(
            desired_worker_pods(&g, &KubeRayVersion::parse("1.3").unwrap().rules()),
            2
        );
        // min > max: v1.5 uses max; v1.6+ clamps replicas (< min → min).
        let mut g = spec.worker_group_specs.as_ref().unwrap()[0].clone();
        g.min_replicas = Some(5);
        g.max_replicas = Some(3);
        g.replicas = Some(4);
        assert_eq!(
            desired_worker_pods(&g, &KubeRayVersion::parse("1.5").unwrap().rules()),
            3
        );
        assert_eq!(desired_worker_pods(&g, &latest().rules()), 5);
        // nil handling: replicas nil → min; min/max nil → 0 / MaxInt32.
        let g = WorkerGroupSpec {
            group_name: Some("g".into()),
            replicas: None,
            min_replicas: Some(2),
            ..Default::default()
        };
        assert_eq!(desired_worker_pods(&g, &latest().rules()), 2);
        let g = WorkerGroupSpec {
            replicas: Some(7),
            ..Default::default()
        };
        assert_eq!(desired_worker_pods(&g, &latest().rules()), 7);
        // Worker-group suspend does not exist before v1.3 (pruned by the API server).
        let g = WorkerGroupSpec {
            replicas: Some(2),
            suspend: Some(true),
            ..Default::default()
        };
        assert_eq!(
            desired_worker_pods(&g, &KubeRayVersion::parse("1.2").unwrap().rules()),
            2
        );
        assert_eq!(desired_worker_pods(&g, &latest().rules()), 0);
    }

    #[test]
    fn fractional_or_overcommitted_extended_resources_are_refused_with_their_path() {
        let gpu = |spec: &mut RayClusterSpec, kind: &str, v: &str| {
            let r = spec.worker_group_specs.as_mut().unwrap()[0]
                .template
                .as_mut()
                .unwrap()
                .spec
                .as_mut()
                .unwrap()
                .containers[0]
                .resources
                .get_or_insert_with(Default::default);
            let list = if kind == "limits" {
                r.limits.get_or_insert_with(Default::default)
            } else {
                r.requests.get_or_insert_with(Default::default)
            };
            list.insert("nvidia.com/gpu".into(), K8sQuantity(v.into()));
        };
        let gpu_error = |kind: &str, v: &str| {
            let mut spec = multi().spec;
            gpu(&mut spec, kind, v);
            planned_groups("t", "n", &spec, latest())
                .unwrap_err()
                .to_string()
        };
        let err = gpu_error("limits", "1.5");
        assert!(
            err.starts_with("RayCluster n/t: spec.workerGroupSpecs[0].template.spec.containers[0].resources.limits[nvidia.com/gpu]: 1.5 must be an integer"),
            "{err}"
        );
        let err = gpu_error("requests", "4");
        assert!(
            err.contains("resources.requests[nvidia.com/gpu]: 4 must be equal to the nvidia.com/gpu limit of 8"),
            "{err}"
        );
        // The autoscaler's resources are checked when it runs; groups at zero replicas too.
        let mut spec = multi().spec;
        spec.autoscaler_options.as_mut().unwrap().resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "example.com/fpga".to_string(),
                K8sQuantity("0.5".into()),
            )])),
            ..Default::default()
        });
        assert_eq!(
            check_cluster_resources(&spec, "spec.rayClusterConfig")
                .unwrap_err()
                .0,
            "spec.rayClusterConfig.autoscalerOptions.resources.limits[example.com/fpga]"
        );
        spec.enable_in_tree_autoscaling = Some(false);
        assert_eq!(check_cluster_resources(&spec, "spec"), Ok(()));
        let mut spec = multi().spec;
        let spare = &mut spec.worker_group_specs.as_mut().unwrap()[2];
        assert_eq!(spare.group_name.as_deref(), Some("a100-spare"));
        spare
            .template
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .resources
            .get_or_insert_with(Default::default)
            .limits
            .get_or_insert_with(Default::default)
            .insert("nvidia.com/gpu".into(), K8sQuantity("0.5".into()));
        assert_eq!(
            check_cluster_resources(&spec, "spec").unwrap_err().0,
            "spec.workerGroupSpecs[2].template.spec.containers[0].resources.limits[nvidia.com/gpu]"
        );
        // The fixtures themselves are valid.
        assert_eq!(check_cluster_resources(&multi().spec, "spec"), Ok(()));
    }

    #[test]
    fn malformed_specs_are_errors() {
        let mut spec = multi().spec;
        spec.worker_group_specs.as_mut().unwrap()[0].group_name = None;
        let err = planned_pods("t", "n", &spec, latest())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("workerGroupSpecs[0]") && err.contains("groupName"),
            "{err}"
        );
        let mut spec = multi().spec;
        spec.head_group_spec = None;
        assert!(
            planned_pods("t", "n", &spec, latest())
                .unwrap_err()
                .to_string()
                .contains("headGroupSpec")
        );
        let mut spec = multi().spec;
        spec.worker_group_specs.as_mut().unwrap()[1].template = None;
        let err = planned_pods("t", "n", &spec, latest())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cpu-preprocess") && err.contains("template"),
            "{err}"
        );
        let mut spec = multi().spec;
        spec.worker_group_specs.as_mut().unwrap()[1].replicas = Some(i32::MAX);
        spec.worker_group_specs.as_mut().unwrap()[1].max_replicas = None;
        assert!(planned_pods("t", "n", &spec, latest()).is_err());
    }
}
