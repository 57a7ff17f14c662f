//! A pod's effective request, the amount kube-scheduler reserves for it.
//!
//! New pods come from templates that the API server has not defaulted yet,
//! so before aggregating we do what pod creation would do:
//!
//! 1. API defaulting: a resource with a limit but no request gets
//!    request = limit (any resource, including `nvidia.com/gpu`).
//! 2. LimitRanger admission, for `type: Container` items of the pod's
//!    namespace: missing limits take `default`, missing requests take
//!    `defaultRequest`, and a request still missing takes the (possibly
//!    defaulted) limit. Across several LimitRanges the first to set a
//!    resource wins; within one, later items overwrite earlier ones.
//!
//! Then `PodRequests` from k8s.io/component-helpers/resource (v0.36), as
//! kube-scheduler v1.36 calls it with its default feature gates:
//!
//! - per container, for a pod whose kubelet reports it (a pod resized in
//!   place, `InPlacePodVerticalScaling`, GA): max(spec, `status.resources`,
//!   `allocatedResources`), or max(status, allocated) when the resize is
//!   Infeasible; regular init containers use their spec;
//! - max(app containers + sidecars, each regular init container + the
//!   sidecars started before it);
//! - pod-level `spec.resources.requests` (`PodLevelResources`, beta, on since
//!   1.34) replace that sum for cpu, memory and hugepages, after the API
//!   server's defaulting of them from pod-level limits; for a pod whose
//!   kubelet reports pod-level `status.resources`
//!   (`InPlacePodLevelResourcesVerticalScaling`, beta, on since 1.36), the
//!   same max(spec, actuated, allocated) as for containers;
//! - plus `spec.overhead` (set by RuntimeClass admission, see
//!   [`runtime_class_overhead`] for pods not created yet).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, LimitRange, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use super::ResourceList;
use crate::quantity::Quantity;

pub use crate::podgroup::pod_name;

/// Requests keyed by names borrowed from the pod or LimitRange: this runs
/// for every pod in the cluster, so it avoids copying resource names.
pub(crate) type Req<'a> = BTreeMap<&'a str, Quantity>;

fn add<'a>(acc: &mut Req<'a>, other: &Req<'a>) {
    for (&k, v) in other {
        acc.entry(k)
            .and_modify(|a| *a = a.saturating_add(v))
            .or_insert_with(|| v.clone());
    }
}

fn max<'a>(acc: &mut Req<'a>, other: &Req<'a>) {
    for (&k, v) in other {
        acc.entry(k)
            .and_modify(|a| {
                if *v > *a {
                    *a = v.clone();
                }
            })
            .or_insert_with(|| v.clone());
    }
}

fn parse<'a>(
    field: impl Fn() -> String,
    map: &'a BTreeMap<String, K8sQuantity>,
) -> crate::Result<Req<'a>> {
    map.iter()
        .map(|(k, v)| match Quantity::parse_amount(&v.0) {
            Ok(q) => Ok((k.as_str(), q)),
            Err(e) => Err(crate::Error::Quantity {
                field: format!("{}[{k}]", field()),
                value: v.0.clone(),
                reason: e.reason(),
            }),
        })
        .collect()
}

/// Default limits and requests from the LimitRanges that apply to a pod.
#[derive(Default)]
struct Defaults<'a> {
    limits: Req<'a>,
    requests: Req<'a>,
}

/// A LimitRange applies when namespaces match; an unset namespace on either
/// side (a template, a hand-written file) is taken to match.
fn applies(lr: &LimitRange, pod: &Pod) -> bool {
    match (&lr.metadata.namespace, &pod.metadata.namespace) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

fn limit_range_defaults<'a>(
    pod: &Pod,
    limit_ranges: &'a [LimitRange],
) -> crate::Result<Defaults<'a>> {
    let mut out = Defaults::default();
    for lr in limit_ranges.iter().filter(|lr| applies(lr, pod)) {
        let lr_name = || {
            format!(
                "limitrange {}/{}",
                lr.metadata.namespace.as_deref().unwrap_or(""),
                lr.metadata.name.as_deref().unwrap_or("")
            )
        };
        let mut this = Defaults::default();
        let items = lr.spec.iter().flat_map(|s| s.limits.iter()).enumerate();
        for (i, item) in items.filter(|(_, it)| it.type_ == "Container") {
            if let Some(d) = &item.default {
                this.limits
                    .extend(parse(|| format!("{}: limits[{i}].default", lr_name()), d)?);
            }
            if let Some(d) = &item.default_request {
                this.requests.extend(parse(
                    || format!("{}: limits[{i}].defaultRequest", lr_name()),
                    d,
                )?);
            }
        }
        for (k, v) in this.limits {
            out.limits.entry(k).or_insert(v);
        }
        for (k, v) in this.requests {
            out.requests.entry(k).or_insert(v);
        }
    }
    Ok(out)
}

/// One container's request after defaulting and LimitRanger, then what its
/// kubelet reports for it (`status`, a pod resized in place).
fn container_requests<'a>(
    pod: &'a Pod,
    list: &str,
    c: &'a Container,
    defaults: &Defaults<'a>,
    status: Option<&'a ContainerStatus>,
) -> crate::Result<Req<'a>> {
    let spec = spec_requests(pod, list, c, defaults)?;
    match status {
        Some(cs) if cs.resources.is_some() => resized(pod, list, c, spec, cs),
        _ => Ok(spec),
    }
}

/// `determineEffectiveRequests`: the scheduler keeps the larger of what is
/// asked, actuated and allocated until a resize is done, and ignores the
/// spec once the kubelet has called the resize Infeasible.
fn resized<'a>(
    pod: &'a Pod,
    list: &str,
    c: &'a Container,
    spec: Req<'a>,
    cs: &'a ContainerStatus,
) -> crate::Result<Req<'a>> {
    let field = |what: &'static str| {
        move || {
            format!(
                "pod {}: status.{list}Statuses[{}].{what}",
                pod_name(pod),
                c.name
            )
        }
    };
    let mut out = if resize_infeasible(pod) {
        Req::new()
    } else {
        spec
    };
    if let Some(m) = cs.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        max(&mut out, &parse(field("resources.requests"), m)?);
    }
    if let Some(m) = &cs.allocated_resources {
        max(&mut out, &parse(field("allocatedResources"), m)?);
    }
    Ok(out)
}

/// `IsPodResizeInfeasible`: the first PodResizePending condition decides.
fn resize_infeasible(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodResizePending"))
        .is_some_and(|c| c.reason.as_deref() == Some("Infeasible"))
}

fn status_of<'a>(
    statuses: Option<&'a Vec<ContainerStatus>>,
    name: &str,
) -> Option<&'a ContainerStatus> {
    statuses.and_then(|v| v.iter().find(|cs| cs.name == name))
}

/// Pod-level resources cover cpu, memory and hugepages only.
fn pod_level_resource(name: &str) -> bool {
    name == super::CPU || name == super::MEMORY || name.starts_with("hugepages-")
}

/// Pod-level requests after API defaulting (`defaultPodRequests`): with
/// pod-level limits set, a missing cpu/memory request takes the containers'
/// summed request, else the pod-level limit; hugepages take the limit.
fn pod_level_requests<'a>(
    pod: &'a Pod,
    containers: impl Fn() -> crate::Result<Req<'a>>,
) -> crate::Result<Req<'a>> {
    let Some(res) = pod.spec.as_ref().and_then(|s| s.resources.as_ref()) else {
        return Ok(Req::new());
    };
    let field =
        |what: &'static str| move || format!("pod {}: spec.resources.{what}", pod_name(pod));
    let mut requests = match &res.requests {
        Some(m) => parse(field("requests"), m)?,
        None => Req::new(),
    };
    if let Some(limits) = res.limits.as_ref().filter(|l| !l.is_empty()) {
        let limits = parse(field("limits"), limits)?;
        for (k, v) in containers()? {
            if pod_level_resource(k) && !k.starts_with("hugepages-") {
                requests.entry(k).or_insert(v);
            }
        }
        for (k, v) in limits {
            if pod_level_resource(k) {
                requests.entry(k).or_insert(v);
            }
        }
    }
    requests.retain(|k, _| pod_level_resource(k));
    // `PodRequests`: a pod resized in place at pod level counts what its kubelet
    // reports as well (e2e/tests/scheduler.rs `pod-level-resized-refused`).
    if let Some(status) = pod.status.as_ref().filter(|s| s.resources.is_some())
        && !requests.is_empty()
    {
        let field = |what: &'static str| move || format!("pod {}: status.{what}", pod_name(pod));
        let mut reported = Req::new();
        if let Some(m) = status.resources.as_ref().and_then(|r| r.requests.as_ref()) {
            max(&mut reported, &parse(field("resources.requests"), m)?);
        }
        if let Some(m) = &status.allocated_resources {
            max(&mut reported, &parse(field("allocatedResources"), m)?);
        }
        let infeasible = resize_infeasible(pod);
        for (k, v) in requests.iter_mut() {
            let r = reported.get(k).cloned().unwrap_or_else(Quantity::zero);
            if infeasible || r > *v {
                *v = r;
            }
        }
    }
    Ok(requests)
}

/// A container's request from its spec, defaulted.
fn spec_requests<'a>(
    pod: &Pod,
    list: &str,
    c: &'a Container,
    defaults: &Defaults<'a>,
) -> crate::Result<Req<'a>> {
    let field = |what: &'static str| {
        move || {
            format!(
                "pod {}: {list}s[{}].resources.{what}",
                pod_name(pod),
                c.name
            )
        }
    };
    let res = c.resources.as_ref();
    let mut limits = match res.and_then(|r| r.limits.as_ref()) {
        Some(m) => parse(field("limits"), m)?,
        None => Req::new(),
    };
    let mut requests = match res.and_then(|r| r.requests.as_ref()) {
        Some(m) => parse(field("requests"), m)?,
        None => Req::new(),
    };
    // API defaulting happens at decode time, before admission.
    for (&k, v) in &limits {
        requests.entry(k).or_insert_with(|| v.clone());
    }
    if defaults.limits.is_empty() && defaults.requests.is_empty() {
        return Ok(requests);
    }
    for (&k, v) in &defaults.limits {
        limits.entry(k).or_insert_with(|| v.clone());
    }
    for (&k, v) in &defaults.requests {
        requests.entry(k).or_insert_with(|| v.clone());
    }
    for (k, v) in limits {
        requests.entry(k).or_insert(v);
    }
    Ok(requests)
}

/// [`pod_requests`] with borrowed names, for the per-cluster hot path.
pub(crate) fn pod_requests_borrowed<'a>(
    pod: &'a Pod,
    limit_ranges: &'a [LimitRange],
) -> crate::Result<Req<'a>> {
    let Some(spec) = &pod.spec else {
        return Ok(Req::new());
    };
    let defaults = limit_range_defaults(pod, limit_ranges)?;
    let status = pod.status.as_ref();
    let mut total = containers_requests(
        pod,
        &defaults,
        status.and_then(|s| s.container_statuses.as_ref()),
        status.and_then(|s| s.init_container_statuses.as_ref()),
    )?;
    // API defaulting of pod-level requests runs at decode time, before
    // LimitRanger: it sees the containers' own requests only.
    let pod_level = pod_level_requests(pod, || {
        containers_requests(pod, &Defaults::default(), None, None)
    })?;
    total.extend(pod_level);
    if let Some(o) = &spec.overhead {
        add(
            &mut total,
            &parse(|| format!("pod {}: overhead", pod_name(pod)), o)?,
        );
    }
    total.retain(|_, q| !q.is_zero());
    Ok(total)
}

/// `AggregateContainerRequests`: app containers and sidecars add up; each
/// regular init container runs with the sidecars started before it.
fn containers_requests<'a>(
    pod: &'a Pod,
    defaults: &Defaults<'a>,
    statuses: Option<&'a Vec<ContainerStatus>>,
    init_statuses: Option<&'a Vec<ContainerStatus>>,
) -> crate::Result<Req<'a>> {
    let Some(spec) = &pod.spec else {
        return Ok(Req::new());
    };
    let mut total = Req::new();
    for c in &spec.containers {
        let cs = status_of(statuses, &c.name);
        add(
            &mut total,
            &container_requests(pod, "container", c, defaults, cs)?,
        );
    }
    let mut sidecars = Req::new();
    let mut init_peak = Req::new();
    for c in spec.init_containers.iter().flatten() {
        if c.restart_policy.as_deref() == Some("Always") {
            let cs = status_of(init_statuses, &c.name);
            let req = container_requests(pod, "initContainer", c, defaults, cs)?;
            add(&mut total, &req);
            add(&mut sidecars, &req);
            max(&mut init_peak, &sidecars);
        } else {
            let mut during = container_requests(pod, "initContainer", c, defaults, None)?;
            add(&mut during, &sidecars);
            max(&mut init_peak, &during);
        }
    }
    max(&mut total, &init_peak);
    Ok(total)
}

/// What RuntimeClass admission sets as `spec.overhead` on a pod not created
/// yet: its RuntimeClass's `overhead.podFixed`. Empty when the pod has an
/// overhead already or names no RuntimeClass; a RuntimeClass missing from
/// `runtime_classes` is an error, as admission rejects such a pod.
pub fn runtime_class_overhead<'a>(
    pod: &Pod,
    runtime_classes: &'a [RuntimeClass],
) -> crate::Result<Req<'a>> {
    let Some(spec) = &pod.spec else {
        return Ok(Req::new());
    };
    let Some(name) = spec.runtime_class_name.as_deref().filter(|n| !n.is_empty()) else {
        return Ok(Req::new());
    };
    if spec.overhead.is_some() {
        return Ok(Req::new());
    }
    let Some(rc) = runtime_classes
        .iter()
        .find(|rc| rc.metadata.name.as_deref() == Some(name))
    else {
        return Err(crate::Error::invalid(
            format!("pod {}: spec.runtimeClassName", pod_name(pod)),
            format!(
                "RuntimeClass {name:?} not found (the apiserver rejects such a pod; \
                 a state file must list runtimeclasses too)"
            ),
        ));
    };
    match rc.overhead.as_ref().and_then(|o| o.pod_fixed.as_ref()) {
        Some(m) => parse(|| format!("runtimeclass {name}: overhead.podFixed"), m),
        None => Ok(Req::new()),
    }
}

/// Each container's requests as pod creation leaves them (API defaulting from
/// limits, then LimitRanger's defaults), init containers first, by name: what a
/// copy of the pod that no admission will see (a PodTemplate for a node
/// autoscaler's placeholder pods) must carry explicitly.
pub fn admitted_container_requests(
    pod: &Pod,
    limit_ranges: &[LimitRange],
) -> crate::Result<Vec<(String, ResourceList)>> {
    let Some(spec) = &pod.spec else {
        return Ok(Vec::new());
    };
    let defaults = limit_range_defaults(pod, limit_ranges)?;
    let lists = [
        (
            "initContainer",
            spec.init_containers.as_deref().unwrap_or(&[]),
        ),
        ("container", spec.containers.as_slice()),
    ];
    let mut out = Vec::new();
    for (list, containers) in lists {
        for c in containers {
            let req = spec_requests(pod, list, c, &defaults)?;
            out.push((
                c.name.clone(),
                req.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            ));
        }
    }
    Ok(out)
}

/// The scheduler's effective request of `pod` (zero entries dropped).
/// `limit_ranges` may hold every namespace's; only matching ones are used.
/// Pass `&[]` for pods that already exist: admission has run for them.
pub fn pod_requests(pod: &Pod, limit_ranges: &[LimitRange]) -> crate::Result<ResourceList> {
    Ok(pod_requests_borrowed(pod, limit_ranges)?
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect())
}

/// Succeeded and Failed pods hold nothing; the scheduler's informer drops them.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::canonical_map;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn lr(v: serde_json::Value) -> LimitRange {
        serde_json::from_value(v).unwrap()
    }

    fn reqs(p: &Pod, lrs: &[LimitRange]) -> BTreeMap<String, String> {
        canonical_map(&pod_requests(p, lrs).unwrap())
    }

    fn m(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn limit_only_gpu_becomes_request() {
        let p = pod(json!({
            "metadata": {"name": "gpu-worker-0"},
            "spec": {"containers": [{
                "name": "ray-worker",
                "resources": {
                    "limits": {"nvidia.com/gpu": "4", "cpu": "8", "memory": "32Gi"},
                    "requests": {"cpu": "6"}
                }
            }]}
        }));
        assert_eq!(
            reqs(&p, &[]),
            m(&[("cpu", "6"), ("memory", "32Gi"), ("nvidia.com/gpu", "4")])
        );
    }

    #[test]
    fn app_containers_sum() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"name": "b", "resources": {"requests": {"cpu": "1500m", "memory": "512Mi"}}},
            {"name": "c"}
        ]}}));
        assert_eq!(reqs(&p, &[]), m(&[("cpu", "2"), ("memory", "1536Mi")]));
    }

    #[test]
    fn bigger_init_container_wins_per_resource() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [
                {"name": "fetch", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}},
                {"name": "warm", "resources": {"requests": {"cpu": "1", "memory": "8Gi"}}}
            ],
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": "2", "memory": "2Gi"}}}
            ]
        }}));
        // cpu: max(2, 4, 1) = 4; memory: max(2Gi, 1Gi, 8Gi) = 8Gi.
        assert_eq!(reqs(&p, &[]), m(&[("cpu", "4"), ("memory", "8Gi")]));
    }

    #[test]
    fn sidecars_count_with_app_and_later_init_containers() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [
                {"name": "before", "resources": {"requests": {"cpu": "3"}}},
                {"name": "proxy", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                {"name": "after", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}},
                {"name": "logs", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "500m"}}}
            ],
            "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]
        }}));
        // App phase: main 1 + proxy 1 + logs 0.5 = 2.5 cpu, 1Gi.
        // Init "before": 3 cpu (no sidecar yet). Init "after": 3 + proxy 1
        // = 4 cpu, 1Gi + 1Gi = 2Gi. Peak of sidecars alone: 1.5 cpu.
        assert_eq!(reqs(&p, &[]), m(&[("cpu", "4"), ("memory", "2Gi")]));

        // Without the "after" init container the app phase dominates.
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "1"}}},
                {"name": "before", "resources": {"requests": {"cpu": "1500m"}}}
            ],
            "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]
        }}));
        // max(main 1 + proxy 1 = 2, before 1.5 + proxy 1 = 2.5) = 2.5
        assert_eq!(reqs(&p, &[]), m(&[("cpu", "2500m")]));
    }

    #[test]
    fn overhead_is_added() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "overhead": {"cpu": "250m", "memory": "120Mi"},
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}],
            "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]
        }}));
        assert_eq!(reqs(&p, &[]), m(&[("cpu", "4250m"), ("memory", "120Mi")]));
    }

    #[test]
    fn zero_requests_are_dropped() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "0", "nvidia.com/gpu": "0"},
                                        "limits": {"memory": "0"}}}
        ]}}));
        assert!(pod_requests(&p, &[]).unwrap().is_empty());
        let empty = pod(json!({"metadata": {"name": "p"}}));
        assert!(pod_requests(&empty, &[]).unwrap().is_empty());
    }

    fn namespaced_lr(
        ns: &str,
        default: serde_json::Value,
        request: serde_json::Value,
    ) -> LimitRange {
        lr(json!({
            "metadata": {"name": "defaults", "namespace": ns},
            "spec": {"limits": [
                {"type": "Pod", "max": {"cpu": "64"}},
                {"type": "Container", "default": default, "defaultRequest": request}
            ]}
        }))
    }

    #[test]
    fn limit_range_defaults_fill_only_missing() {
        let lrs = [namespaced_lr(
            "ray",
            json!({"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}),
            json!({"cpu": "1"}),
        )];
        let p = pod(
            json!({"metadata": {"name": "p", "namespace": "ray"}, "spec": {"containers": [
                {"name": "none"},
                {"name": "limit", "resources": {"limits": {"cpu": "3"}}},
                {"name": "req", "resources": {"requests": {"memory": "1Gi"}}}
            ]}}),
        );
        // none:  cpu defaultRequest 1, memory = default limit 4Gi, gpu = limit 1
        // limit: cpu request = own limit 3, memory 4Gi, gpu 1
        // req:   cpu 1, memory own 1Gi, gpu 1
        assert_eq!(
            reqs(&p, &lrs),
            m(&[("cpu", "5"), ("memory", "9Gi"), ("nvidia.com/gpu", "3")])
        );
        // Another namespace's LimitRange does not apply.
        let other = pod(json!({"metadata": {"name": "p", "namespace": "web"},
            "spec": {"containers": [{"name": "none"}]}}));
        assert!(pod_requests(&other, &lrs).unwrap().is_empty());
    }

    #[test]
    fn first_limit_range_wins_and_init_containers_are_defaulted() {
        let lrs = [
            namespaced_lr("ray", json!({}), json!({"cpu": "100m"})),
            namespaced_lr("ray", json!({"memory": "1Gi"}), json!({"cpu": "900m"})),
        ];
        let p = pod(
            json!({"metadata": {"name": "p", "namespace": "ray"}, "spec": {
                "initContainers": [{"name": "i"}],
                "containers": [{"name": "a"}]
            }}),
        );
        assert_eq!(reqs(&p, &lrs), m(&[("cpu", "100m"), ("memory", "1Gi")]));
    }

    #[test]
    fn resized_pods_count_the_larger_of_spec_actuated_and_allocated() {
        // Resized down from 4 to 1 cpu, not actuated yet: the scheduler keeps 4.
        let mut v = json!({"metadata": {"name": "p"}, "spec": {
        "nodeName": "n",
        "initContainers": [
            {"name": "init", "resources": {"requests": {"cpu": "2"}}},
            {"name": "proxy", "restartPolicy": "Always",
             "resources": {"requests": {"cpu": "500m"}}}
        ],
        "containers": [
            {"name": "main", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"name": "side", "resources": {"requests": {"cpu": "1"}}}
        ]},
        "status": {
            "containerStatuses": [
                {"name": "main", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "resources": {"requests": {"cpu": "4", "memory": "512Mi"}},
                 "allocatedResources": {"cpu": "3", "memory": "2Gi"}},
                // No `resources` reported: its status is not read.
                {"name": "side", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "allocatedResources": {"cpu": "8"}}
            ],
            "initContainerStatuses": [
                {"name": "init", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                 "resources": {"requests": {"cpu": "16"}}},
                {"name": "proxy", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "resources": {"requests": {"cpu": "1500m"}}}
            ]
        }});
        // main max(1, 4, 3) cpu, max(1Gi, 512Mi, 2Gi); side 1; proxy max(0.5, 1.5);
        // a regular init container's status is never read: max(4+1+1.5, 2+1.5).
        assert_eq!(
            reqs(&pod(v.clone()), &[]),
            m(&[("cpu", "6500m"), ("memory", "2Gi")])
        );
        // Infeasible: a reporting container's spec (now 32 cpu) no longer counts,
        // only actuated and allocated; the same 6.5 cpu as before.
        v["status"]["conditions"] = json!([{"type": "PodResizePending", "status": "True",
            "reason": "Infeasible"}]);
        v["spec"]["containers"][0]["resources"]["requests"] =
            json!({"cpu": "32", "memory": "64Gi"});
        assert_eq!(
            reqs(&pod(v.clone()), &[]),
            m(&[("cpu", "6500m"), ("memory", "2Gi")])
        );
        // Deferred keeps the spec.
        v["status"]["conditions"][0]["reason"] = json!("Deferred");
        assert_eq!(
            reqs(&pod(v), &[]),
            m(&[("cpu", "34500m"), ("memory", "64Gi")])
        );
    }

    #[test]
    fn pod_level_requests_replace_cpu_and_memory_only() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "resources": {"requests": {"cpu": "3", "memory": "4Gi"}},
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                            "limits": {"nvidia.com/gpu": "2"}}},
                {"name": "b", "resources": {"requests": {"cpu": "1"}}}
            ]
        }}));
        assert_eq!(
            reqs(&p, &[]),
            m(&[("cpu", "3"), ("memory", "4Gi"), ("nvidia.com/gpu", "2")])
        );
    }

    #[test]
    fn pod_level_resize_counts_what_the_kubelet_reports() {
        let resized = |spec_cpu: &str, conditions: serde_json::Value| {
            pod(json!({"metadata": {"name": "p"}, "spec": {
                "resources": {"requests": {"cpu": spec_cpu, "memory": "1Gi"}},
                "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}]
            }, "status": {
                "resources": {"requests": {"cpu": "3", "memory": "1Gi"}},
                "allocatedResources": {"cpu": "2", "memory": "512Mi"},
                "conditions": conditions
            }}))
        };
        // Resized 3 -> 2, still running with 3: the scheduler keeps 3.
        assert_eq!(
            reqs(&resized("2", json!([])), &[]),
            m(&[("cpu", "3"), ("memory", "1Gi")])
        );
        // Resized 3 -> 4, pending: the spec counts.
        assert_eq!(
            reqs(&resized("4", json!([])), &[]),
            m(&[("cpu", "4"), ("memory", "1Gi")])
        );
        // Infeasible: the spec no longer counts, only actuated and allocated.
        let infeasible =
            json!([{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]);
        assert_eq!(
            reqs(&resized("4", infeasible), &[]),
            m(&[("cpu", "3"), ("memory", "1Gi")])
        );
    }

    #[test]
    fn pod_level_requests_default_from_containers_then_pod_limits() {
        // Limits only at pod level: cpu request from the containers' 1500m,
        // memory (no container asks) from the pod limit.
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "resources": {"limits": {"cpu": "8", "memory": "16Gi"}},
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1"}}},
                {"name": "b", "resources": {"requests": {"cpu": "500m"}}}
            ]
        }}));
        assert_eq!(reqs(&p, &[]), m(&[("cpu", "1500m"), ("memory", "16Gi")]));
        // LimitRange defaults come after that defaulting: the pod level already
        // has memory from its limit, the container default does not change it.
        let lrs = [namespaced_lr(
            "ray",
            json!({}),
            json!({"memory": "1Gi", "cpu": "100m"}),
        )];
        let p = pod(
            json!({"metadata": {"name": "p", "namespace": "ray"}, "spec": {
                "resources": {"limits": {"memory": "16Gi"}},
                "containers": [{"name": "a"}]
            }}),
        );
        assert_eq!(reqs(&p, &lrs), m(&[("cpu", "100m"), ("memory", "16Gi")]));
        // Without pod-level limits nothing is defaulted; an unsupported resource
        // at pod level is ignored.
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "resources": {"requests": {"memory": "2Gi", "nvidia.com/gpu": "8"}},
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]
        }}));
        assert_eq!(reqs(&p, &[]), m(&[("cpu", "1"), ("memory", "2Gi")]));
    }

    #[test]
    fn runtime_class_overhead_for_pods_not_created_yet() {
        let rcs: Vec<RuntimeClass> = vec![
            serde_json::from_value(json!({"metadata": {"name": "kata"}, "handler": "kata",
                "overhead": {"podFixed": {"cpu": "250m", "memory": "160Mi"}}}))
            .unwrap(),
            serde_json::from_value(json!({"metadata": {"name": "nvidia"}, "handler": "nvidia"}))
                .unwrap(),
        ];
        let with = |rc: &str, overhead: Option<serde_json::Value>| {
            let mut v = json!({"metadata": {"name": "w"}, "spec": {
                "runtimeClassName": rc, "containers": []}});
            if let Some(o) = overhead {
                v["spec"]["overhead"] = o;
            }
            pod(v)
        };
        let o = |p: &Pod| {
            canonical_map(
                &runtime_class_overhead(p, &rcs)
                    .unwrap()
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            )
        };
        assert_eq!(
            o(&with("kata", None)),
            m(&[("cpu", "250m"), ("memory", "160Mi")])
        );
        assert!(o(&with("nvidia", None)).is_empty());
        // Already admitted: its own overhead counts (in pod_requests), not again.
        assert!(o(&with("kata", Some(json!({"cpu": "250m"})))).is_empty());
        let err = runtime_class_overhead(&with("gvisor", None), &rcs)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("pod w: spec.runtimeClassName") && err.contains("\"gvisor\" not found"),
            "{err}"
        );
    }

    #[test]
    fn malformed_quantity_names_the_field() {
        let p = pod(
            json!({"metadata": {"name": "gpu-worker-0"}, "spec": {"containers": [
                {"name": "ray-worker", "resources": {"limits": {"nvidia.com/gpu": "one"}}}
            ]}}),
        );
        let err = pod_requests(&p, &[]).unwrap_err();
        match &err {
            crate::Error::Quantity { field, value, .. } => {
                assert_eq!(
                    field,
                    "pod gpu-worker-0: containers[ray-worker].resources.limits[nvidia.com/gpu]"
                );
                assert_eq!(value, "one");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().starts_with(
            "pod gpu-worker-0: containers[ray-worker].resources.limits[nvidia.com/gpu]: \
             invalid quantity \"one\""
        ));

        let p = pod(json!({"metadata": {"generateName": "w-"}, "spec": {
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1.5.5"}}}],
            "containers": []}}));
        let err = pod_requests(&p, &[]).unwrap_err().to_string();
        assert!(
            err.starts_with("pod w-: initContainers[i].resources.requests[cpu]:"),
            "{err}"
        );

        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "overhead": {"memory": "lots"}, "containers": []}}));
        let err = pod_requests(&p, &[]).unwrap_err().to_string();
        assert!(err.starts_with("pod p: overhead[memory]:"), "{err}");

        let bad = [namespaced_lr("ray", json!({"cpu": "x"}), json!({}))];
        let p = pod(json!({"metadata": {"name": "p", "namespace": "ray"},
            "spec": {"containers": []}}));
        let err = pod_requests(&p, &bad).unwrap_err().to_string();
        assert!(
            err.starts_with("limitrange ray/defaults: limits[1].default[cpu]:"),
            "{err}"
        );
    }
}
