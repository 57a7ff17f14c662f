//! The apiserver's rules on a container's `resources` that decide whether a
//! pod can exist at all, so that raygate never admits a cluster KubeRay
//! could not create: a fractional GPU would otherwise be rounded up by the
//! scheduler's accounting, admitted, and its pod refused by the apiserver.
//!
//! From Kubernetes v1.36.3 `pkg/apis/core/validation/validation.go`
//! (`validateResourceRequirements`, `ValidateResourceQuantityValue`) and
//! `pkg/apis/core/helper/helpers.go` (`IsExtendedResourceName`,
//! `IsIntegerResourceName`, `IsOvercommitAllowed`):
//!
//! - an extended resource (a name with a domain outside `kubernetes.io`, e.g.
//!   `nvidia.com/gpu`) must be a whole number in `limits` and `requests`
//!   (`MilliValue() % 1000 == 0`: `must be an integer`);
//! - a resource that cannot be overcommitted (extended resources and
//!   `hugepages-*`) requested must have a limit (`Limit must be set for non
//!   overcommitable resources`) equal to the request (`must be equal to ...
//!   limit`).
//!
//! A quantity that does not parse is left to the parsers that report it.
//! Only the apiserver's rules live here; how much a pod takes is `capacity`'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::quantity::Quantity;

/// `helper.IsNativeResource`: no domain, or a `kubernetes.io` one.
fn is_native(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

/// `helper.IsExtendedResourceName` (the qualified-name check is the
/// apiserver's to make; an unqualified name is refused there anyway).
pub fn is_extended(name: &str) -> bool {
    !is_native(name) && !name.starts_with("requests.")
}

/// `helper.IsOvercommitAllowed`: requests may be below limits.
fn overcommit_allowed(name: &str) -> bool {
    is_native(name) && !name.starts_with("hugepages-")
}

fn parsed(q: &K8sQuantity) -> Option<Quantity> {
    Quantity::parse(&q.0).ok()
}

/// The first rule `r` breaks, as `(field path, reason)`; `path` is the
/// container's (`...containers[0]`). Names are checked in sorted order so the
/// answer is stable.
pub fn check_resources(path: &str, r: &ResourceRequirements) -> Result<(), (String, String)> {
    let empty = BTreeMap::new();
    let limits = r.limits.as_ref().unwrap_or(&empty);
    let requests = r.requests.as_ref().unwrap_or(&empty);
    for (kind, list) in [("limits", limits), ("requests", requests)] {
        for (name, q) in list {
            let Some(v) = parsed(q) else { continue };
            if is_extended(name) && v.milli_value() % 1000 != 0 {
                return Err((
                    format!("{path}.resources.{kind}[{name}]"),
                    format!(
                        "{} must be an integer: the apiserver refuses a fraction of an extended \
                         resource, so KubeRay could not create this pod",
                        q.0
                    ),
                ));
            }
        }
    }
    for (name, q) in requests {
        if overcommit_allowed(name) {
            continue;
        }
        let Some(request) = parsed(q) else { continue };
        match limits.get(name) {
            None => {
                return Err((
                    format!("{path}.resources.limits[{name}]"),
                    format!(
                        "must be set (requested {}): {name} cannot be overcommitted, the \
                         apiserver refuses a request without an equal limit",
                        q.0
                    ),
                ));
            }
            Some(l) => match parsed(l) {
                Some(limit) if limit != request => {
                    return Err((
                        format!("{path}.resources.requests[{name}]"),
                        format!(
                            "{} must be equal to the {name} limit of {}: it cannot be \
                             overcommitted",
                            q.0, l.0
                        ),
                    ));
                }
                _ => {}
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(limits: &[(&str, &str)], requests: &[(&str, &str)]) -> ResourceRequirements {
        let list = |p: &[(&str, &str)]| {
            Some(
                p.iter()
                    .map(|(k, v)| (k.to_string(), K8sQuantity(v.to_string())))
                    .collect(),
            )
        };
        ResourceRequirements {
            limits: list(limits),
            requests: list(requests),
            ..Default::default()
        }
    }

    fn check(limits: &[(&str, &str)], requests: &[(&str, &str)]) -> Result<(), (String, String)> {
        check_resources("c", &req(limits, requests))
    }

    #[test]
    fn extended_resources_are_whole_numbers() {
        let (path, why) = check(&[("nvidia.com/gpu", "1.5")], &[]).unwrap_err();
        assert_eq!(path, "c.resources.limits[nvidia.com/gpu]");
        assert!(why.contains("1.5 must be an integer"), "{why}");
        let (path, _) = check(&[], &[("amd.com/gpu", "500m")]).unwrap_err();
        assert_eq!(path, "c.resources.requests[amd.com/gpu]");
        // Go rounds MilliValue up: a billionth over is not a whole number.
        assert!(check(&[("nvidia.com/gpu", "1000000001n")], &[]).is_err());
        for whole in ["2", "2000m", "0", "1k", "1e3"] {
            assert_eq!(check(&[("nvidia.com/gpu", whole)], &[]), Ok(()), "{whole}");
        }
        // Native resources may be fractions.
        assert_eq!(
            check(&[("cpu", "1.5"), ("memory", "1.5Gi")], &[("cpu", "0.5")]),
            Ok(())
        );
        assert_eq!(check(&[("example.kubernetes.io/x", "0.5")], &[]), Ok(()));
    }

    #[test]
    fn requests_of_extended_resources_equal_their_limits() {
        let (path, why) =
            check(&[("nvidia.com/gpu", "2")], &[("nvidia.com/gpu", "1")]).unwrap_err();
        assert_eq!(path, "c.resources.requests[nvidia.com/gpu]");
        assert!(
            why.contains("equal to the nvidia.com/gpu limit of 2"),
            "{why}"
        );
        let (path, why) = check(&[], &[("nvidia.com/gpu", "1")]).unwrap_err();
        assert_eq!(path, "c.resources.limits[nvidia.com/gpu]");
        assert!(why.contains("must be set"), "{why}");
        assert_eq!(
            check(&[("nvidia.com/gpu", "2")], &[("nvidia.com/gpu", "2000m")]),
            Ok(())
        );
        // hugepages cannot be overcommitted either; cpu can.
        assert!(check(&[("hugepages-2Mi", "4Mi")], &[("hugepages-2Mi", "2Mi")]).is_err());
        assert_eq!(check(&[("cpu", "2")], &[("cpu", "1")]), Ok(()));
        // A quantity that does not parse is someone else's error.
        assert_eq!(check(&[("nvidia.com/gpu", "two")], &[]), Ok(()));
    }
}
