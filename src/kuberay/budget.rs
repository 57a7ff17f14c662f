//! What raygate keeps of one RayCluster spec is bounded (issue 26).
//!
//! A RayService is a tenant's object: 5,000 worker groups of one replica each
//! (1.2 MB, under the pod cap) once raised raygate's RSS by 300 MB, because
//! every copy (the RayService, its clusters) was kept typed and every
//! reconcile turned it into JSON values again. Three bounds per spec, checked
//! as an object arrives from the watch, before it is cached:
//!
//! - [`MAX_WORKER_GROUPS`] worker groups,
//! - [`MAX_CONTAINERS`] containers and init containers per pod template,
//! - [`MAX_SPEC_BYTES`] bytes of the spec as JSON (counted while writing it,
//!   stopped at the bound, so an oversized spec costs no more than the bound).
//!
//! A spec over a bound is replaced by an empty one that only carries the
//! [`OverBudget`] finding ([`prune`]): the plan reports it with the field path
//! (`InvalidRayService`, the gate held like any change raygate cannot plan),
//! and the memory goes back with the watch event. The same check refuses such a
//! spec in the pod planning, so `raygate explain`/`fit` say the same offline.

use std::io;

use super::types::RayClusterSpec;

pub use super::over_budget::{
    Bound, MAX_CONTAINERS, MAX_SPEC_BYTES, MAX_WORKER_GROUPS, OverBudget,
};

/// Is `spec` (at field path `path`) within the bounds? A spec already pruned
/// by [`prune`] gives its finding again.
pub fn check(spec: &RayClusterSpec, path: &str) -> Result<(), OverBudget> {
    if let Some(e) = &spec.over_budget {
        return Err(e.clone());
    }
    let groups = spec.worker_group_specs.as_deref().unwrap_or_default();
    if groups.len() > MAX_WORKER_GROUPS {
        return Err(OverBudget {
            path: format!("{path}.workerGroupSpecs"),
            bound: Bound::WorkerGroups,
            found: groups.len(),
        });
    }
    let templates = std::iter::once((
        format!("{path}.headGroupSpec"),
        spec.head_group_spec
            .as_ref()
            .and_then(|h| h.template.as_ref()),
    ))
    .chain(
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| (format!("{path}.workerGroupSpecs[{i}]"), g.template.as_ref())),
    );
    for (at, template) in templates {
        let Some(pod) = template.and_then(|t| t.spec.as_ref()) else {
            continue;
        };
        let n = pod
            .containers
            .len()
            .saturating_add(pod.init_containers.as_ref().map_or(0, Vec::len));
        if n > MAX_CONTAINERS {
            return Err(OverBudget {
                path: format!("{at}.template.spec.containers"),
                bound: Bound::Containers,
                found: n,
            });
        }
    }
    let mut count = Counter::default();
    if serde_json::to_writer(&mut count, spec).is_err() || count.0 > MAX_SPEC_BYTES {
        return Err(OverBudget {
            path: path.to_string(),
            bound: Bound::SpecBytes,
            found: count.0,
        });
    }
    Ok(())
}

/// Replace a spec over the bounds by an empty one carrying the finding, so
/// the cache keeps a few bytes instead of the object. True when pruned.
pub fn prune(spec: &mut RayClusterSpec, path: &str) -> bool {
    match check(spec, path) {
        Ok(()) => false,
        Err(e) => {
            *spec = RayClusterSpec {
                over_budget: Some(e),
                ..Default::default()
            };
            true
        }
    }
}

/// Counts the bytes written and refuses past the bound, so serializing an
/// oversized spec stops there.
#[derive(Default)]
struct Counter(usize);

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        if self.0 > MAX_SPEC_BYTES {
            return Err(io::Error::other("over the bound"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(groups: usize, containers: usize, env_bytes: usize) -> RayClusterSpec {
        let container = |i: usize| {
            json!({"name": format!("c{i}"), "image": "rayproject/ray:2.46.0",
                "env": [{"name": "PAD", "value": "x".repeat(env_bytes)}]})
        };
        let template = json!({"spec": {"containers":
            (0..containers).map(container).collect::<Vec<_>>()}});
        serde_json::from_value(json!({
            "headGroupSpec": {"template": {"spec": {"containers": [container(0)]}}},
            "workerGroupSpecs": (0..groups).map(|i| json!({
                "groupName": format!("g{i}"), "replicas": 1, "template": template
            })).collect::<Vec<_>>()
        }))
        .unwrap_or_default()
    }

    #[test]
    fn an_ordinary_spec_is_kept() {
        let mut s = spec(4, 2, 100);
        assert_eq!(check(&s, "spec"), Ok(()));
        assert!(!prune(&mut s, "spec"));
        assert_eq!(s.worker_group_specs.map(|g| g.len()), Some(4));
    }

    #[test]
    fn each_bound_is_reported_with_its_field_path() {
        let groups = check(&spec(MAX_WORKER_GROUPS + 1, 1, 0), "spec.rayClusterConfig");
        assert_eq!(
            groups
                .as_ref()
                .map_err(|e| (e.path.as_str(), e.bound, e.found)),
            Err((
                "spec.rayClusterConfig.workerGroupSpecs",
                Bound::WorkerGroups,
                MAX_WORKER_GROUPS + 1
            ))
        );
        let containers = check(&spec(2, MAX_CONTAINERS + 1, 0), "spec");
        assert_eq!(
            containers.as_ref().map_err(|e| e.path.as_str()),
            Err("spec.workerGroupSpecs[0].template.spec.containers")
        );
        let bytes = check(&spec(2, 1, MAX_SPEC_BYTES), "spec").map_err(|e| e.to_string());
        assert_eq!(
            bytes,
            Err(format!(
                "spec: more than {MAX_SPEC_BYTES} bytes as JSON, more than the \
                 {MAX_SPEC_BYTES} raygate plans per RayCluster spec (a bound on what one \
                 object may cost it, docs/security.md)"
            ))
        );
    }

    #[test]
    fn exactly_at_the_bounds_is_kept() {
        assert_eq!(check(&spec(MAX_WORKER_GROUPS, 1, 0), "spec"), Ok(()));
        assert_eq!(check(&spec(1, MAX_CONTAINERS, 0), "spec"), Ok(()));
    }

    #[test]
    fn a_pruned_spec_keeps_only_its_finding() {
        let mut s = spec(5_000, 1, 0);
        assert!(prune(&mut s, "spec.rayClusterConfig"));
        assert!(s.worker_group_specs.is_none() && s.head_group_spec.is_none());
        let again = check(&s, "elsewhere").map_err(|e| (e.path, e.found));
        assert_eq!(
            again,
            Err(("spec.rayClusterConfig.workerGroupSpecs".to_string(), 5_000))
        );
        // Nothing of it is serialized: the finding is raygate's, not the object's.
        assert_eq!(serde_json::to_value(&s).ok(), Some(json!({})));
    }
}
