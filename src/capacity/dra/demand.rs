//! What a pod asks of DRA: the requests of its `resourceClaims`, and its extended resources a
//! DeviceClass maps (KEP-5004, `DRAExtendedResource`, on by default in v1.36).

use k8s_openapi::api::core::v1::Pod;

use super::{DraState, IMPLICIT_PREFIX, Request, Undecided};
use crate::capacity::ResourceList;

/// A pod's device requests, before a node is chosen.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodDemand {
    /// The requests of the claims its ResourceClaimTemplates make, in `resourceClaims` order.
    pub claims: Vec<Request>,
    /// (resource, devices, class): extended resources a DeviceClass maps. On a node whose
    /// allocatable has none of the resource they become `count` requests of the class; on a
    /// device-plugin node they stay plain extended resources.
    pub mapped: Vec<(String, u32, String)>,
    /// Why raygate cannot decide where the pod goes, if it cannot.
    pub undecided: Option<Undecided>,
    /// Why the scheduler cannot place the pod anywhere (a missing ResourceClaimTemplate).
    pub impossible: Option<String>,
}

impl PodDemand {
    /// Whether the pod asks nothing of DRA.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
            && self.mapped.is_empty()
            && self.undecided.is_none()
            && self.impossible.is_none()
    }
}

/// Kubernetes' `IsDRAExtendedResourceName`: an extended resource (a domain outside
/// `kubernetes.io`, not `requests.`) or a class's implicit name.
fn is_dra_extended(name: &str) -> bool {
    if name.starts_with(IMPLICIT_PREFIX) {
        return true;
    }
    match name.split_once('/') {
        Some((domain, _)) => {
            !(domain == "kubernetes.io"
                || domain.ends_with(".kubernetes.io")
                || name.starts_with("requests."))
        }
        None => false,
    }
}

/// The DeviceClass the scheduler maps extended resource `name` to: the newest class naming
/// it in `extendedResourceName` (equal times: the smallest name), else the class whose
/// implicit name it is (`extendedresourcecache.go`).
pub fn class_for_resource<'a>(state: &'a DraState, name: &str) -> Option<&'a str> {
    let explicit = state
        .classes
        .iter()
        .filter(|(_, c)| c.extended_resource_name.as_deref() == Some(name))
        .max_by(|(an, a), (bn, b)| a.created.cmp(&b.created).then_with(|| bn.cmp(an)))
        .map(|(n, _)| n.as_str());
    explicit.or_else(|| {
        let class = name.strip_prefix(IMPLICIT_PREFIX)?;
        state.classes.get_key_value(class).map(|(k, _)| k.as_str())
    })
}

/// The DRA requests of `pod` (not created yet) whose effective request is `requests`.
pub fn pod_demand(pod: &Pod, requests: &ResourceList, state: &DraState) -> PodDemand {
    let mut d = PodDemand::default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    for c in pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some(t) = c.resource_claim_template_name.as_deref() {
            match state.templates.get(&format!("{ns}/{t}")) {
                Some(spec) => {
                    if let Some(why) = spec.unmodeled {
                        d.undecided.get_or_insert(Undecided(format!(
                            "ResourceClaimTemplate {ns}/{t} uses {why}"
                        )));
                    }
                    d.claims.extend(spec.requests.iter().cloned());
                }
                None => {
                    d.impossible.get_or_insert(format!(
                        "ResourceClaimTemplate {ns}/{t} (claim {}) not found",
                        c.name
                    ));
                }
            }
        } else if let Some(n) = c.resource_claim_name.as_deref() {
            d.undecided.get_or_insert(Undecided(format!(
                "claim {} names ResourceClaim {ns}/{n}: claims shared between pods are not modelled",
                c.name
            )));
        }
    }
    if !state.classes.is_empty() {
        for (name, q) in requests {
            if !is_dra_extended(name) {
                continue;
            }
            let Some(class) = class_for_resource(state, name) else {
                continue;
            };
            let n = q.value();
            if n <= 0 {
                continue;
            }
            match u32::try_from(n) {
                Ok(n) => d.mapped.push((name.clone(), n, class.to_string())),
                Err(_) => {
                    d.undecided
                        .get_or_insert(Undecided(format!("{name}: {n} devices")));
                }
            }
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::super::Mode;
    use super::super::tests::*;
    use super::*;
    use crate::capacity::tests::rl;
    use serde_json::json;

    fn pod(claims: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [], "resourceClaims": claims}}))
        .unwrap()
    }

    #[test]
    fn the_newest_mapping_class_wins_then_the_implicit_name() {
        let mut older = class("a-old", None, Some("nvidia.com/gpu"));
        older["metadata"]["creationTimestamp"] = json!("2025-01-01T00:00:00Z");
        let s = state_of(&[
            older,
            class("z-new", None, Some("nvidia.com/gpu")),
            class("b-new", None, Some("nvidia.com/gpu")),
            class("plain", None, None),
        ]);
        assert_eq!(class_for_resource(&s, "nvidia.com/gpu"), Some("b-new"));
        assert_eq!(
            class_for_resource(&s, "deviceclass.resource.kubernetes.io/plain"),
            Some("plain")
        );
        assert_eq!(
            class_for_resource(&s, "deviceclass.resource.kubernetes.io/x"),
            None
        );
        assert_eq!(class_for_resource(&s, "amd.com/gpu"), None);
    }

    #[test]
    fn claims_from_templates_and_mapped_resources() {
        let s = state_of(&[
            class("gpu", None, Some("nvidia.com/gpu")),
            template(
                "ml",
                "two",
                json!([{"name": "g", "exactly": {"deviceClassName": "gpu", "count": 2}}]),
            ),
        ]);
        let p = pod(json!([{"name": "gpus", "resourceClaimTemplateName": "two"}]));
        let d = pod_demand(&p, &rl(&[("cpu", "1"), ("nvidia.com/gpu", "3")]), &s);
        assert_eq!(d.claims.len(), 1);
        assert_eq!(d.claims[0].alternatives[0].mode, Mode::Count(2));
        assert_eq!(
            d.mapped,
            [("nvidia.com/gpu".to_string(), 3, "gpu".to_string())]
        );
        assert!(d.undecided.is_none() && d.impossible.is_none());

        let missing = pod(json!([{"name": "gpus", "resourceClaimTemplateName": "nope"}]));
        let d = pod_demand(&missing, &rl(&[]), &s);
        assert!(d.impossible.unwrap().contains("ml/nope"));
        let named = pod(json!([{"name": "gpus", "resourceClaimName": "shared"}]));
        assert!(pod_demand(&named, &rl(&[]), &s).undecided.is_some());
        // Without DeviceClasses nothing maps.
        let d = pod_demand(
            &pod(json!([])),
            &rl(&[("nvidia.com/gpu", "1")]),
            &DraState::default(),
        );
        assert!(d.is_empty());
    }
}
