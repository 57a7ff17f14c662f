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
//! Then `PodRequests` from k8s.io/component-helpers/resource: max(app
//! containers + sidecars, each regular init container + the sidecars started
//! before it), plus `spec.overhead`. Pod-level `spec.resources` is ignored:
//! it is alpha and off by default in Kubernetes 1.33.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, LimitRange, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use super::ResourceList;
use crate::quantity::Quantity;

/// Name for messages and keys: `metadata.name`, else `generateName`.
pub fn pod_name(pod: &Pod) -> String {
    pod.metadata
        .name
        .clone()
        .or_else(|| pod.metadata.generate_name.clone())
        .unwrap_or_else(|| "<unnamed>".to_string())
}

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

/// One container's request after defaulting and LimitRanger.
fn container_requests<'a>(
    pod: &Pod,
    list: &str,
    c: &'a Container,
    defaults: &Defaults<'a>,
) -> crate::Result<Req<'a>> {
    let field = |what: &'static str| {
        move || format!("pod {}: {list}[{}].resources.{what}", pod_name(pod), c.name)
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
    let mut total = Req::new();
    for c in &spec.containers {
        add(
            &mut total,
            &container_requests(pod, "containers", c, &defaults)?,
        );
    }
    // Sidecars (restartPolicy: Always) run alongside the app containers and
    // alongside every init container that starts after them.
    let mut sidecars = Req::new();
    let mut init_peak = Req::new();
    for c in spec.init_containers.iter().flatten() {
        let req = container_requests(pod, "initContainers", c, &defaults)?;
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut total, &req);
            add(&mut sidecars, &req);
            max(&mut init_peak, &sidecars);
        } else {
            let mut during = req;
            add(&mut during, &sidecars);
            max(&mut init_peak, &during);
        }
    }
    max(&mut total, &init_peak);
    if let Some(o) = &spec.overhead {
        add(
            &mut total,
            &parse(|| format!("pod {}: overhead", pod_name(pod)), o)?,
        );
    }
    total.retain(|_, q| !q.is_zero());
    Ok(total)
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

/// Total requests of running pods (an old cluster's), counting one pod slot
/// each, as every new pod will take one too. Terminal pods hold nothing.
pub fn total_requests<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    limit_ranges: &[LimitRange],
) -> crate::Result<ResourceList> {
    let mut total = ResourceList::new();
    let mut slots: i64 = 0;
    for p in pods {
        if super::node::is_terminal(p) {
            continue;
        }
        super::add_into(&mut total, &pod_requests(p, limit_ranges)?);
        slots = slots.saturating_add(1);
    }
    if slots > 0 {
        super::add_into(
            &mut total,
            &ResourceList::from([(super::PODS.to_string(), Quantity::from_units(slots))]),
        );
    }
    Ok(total)
}

#[cfg(test)]
mod total_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn totals_count_pod_slots_and_skip_terminal_pods() {
        let pod = |phase: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        let pods = [pod("Running"), pod("Pending"), pod("Succeeded")];
        let t = total_requests(pods.iter(), &[]).unwrap();
        assert_eq!(t.get("cpu").map(|q| q.canonical()).as_deref(), Some("4"));
        assert_eq!(t.get("pods").map(|q| q.canonical()).as_deref(), Some("2"));
        assert!(total_requests(std::iter::empty(), &[]).unwrap().is_empty());
    }
}
