//! What a decision reads of a pod that exists: its Ray labels, whether it is
//! bound, the scheduler's reason it is not, and its effective request.
//!
//! The controller hands the decision the capacity index's records
//! ([`PodRecord`]: a few hundred bytes, requests already in scheduler units)
//! and never rebuilds `Pod`s from them; the CLI and the unit tests hand it the
//! full `Pod`s they read. Both answer the same questions through
//! [`ObservedPod`], so the rules are written once.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{LimitRange, Pod};
use kube::ResourceExt;

use crate::capacity::{self, PODS, PodRecord, ResourceList};
pub use crate::podgroup::HEAD;
use crate::podgroup::{LABEL_GROUP, LABEL_NODE_TYPE, PodRole};

/// A pod as the decision sees it.
pub trait ObservedPod {
    /// `ray.io/node-type`.
    fn node_type(&self) -> Option<&str>;
    /// `ray.io/group`.
    fn group(&self) -> Option<&str>;
    /// Bound to a node (`spec.nodeName`).
    fn is_bound(&self) -> bool;
    /// Succeeded or Failed: it holds nothing.
    fn is_terminal(&self) -> bool;
    /// The scheduler's message while the pod is unschedulable
    /// (`PodScheduled=False`, reason `Unschedulable`, not bound).
    fn unschedulable_message(&self) -> Option<&str>;
    /// kube-scheduler's effective request, without the pod slot. A pod that
    /// exists was admitted with its namespace's LimitRange defaults already;
    /// `limit_ranges` only fills in what a hand-written `Pod` leaves out.
    fn requests(&self, limit_ranges: &[LimitRange]) -> crate::Result<ResourceList>;
}

/// An observed pod of either kind.
pub type DynPod = dyn ObservedPod + Send + Sync;

/// A shared observed pod, as [`super::Inputs`] holds them.
pub type PodRef = Arc<DynPod>;

/// The pod's role ([`PodRole`]): how planned and existing pods are matched
/// (real pod names carry random suffixes).
pub fn role_of<P: ObservedPod + ?Sized>(p: &P) -> Option<PodRole> {
    PodRole::from_labels(p.node_type(), p.group())
}

/// The pod's place in its cluster: [`HEAD`], or its worker group's name
/// (empty for a pod KubeRay did not label).
pub fn group_of<P: ObservedPod + ?Sized>(p: &P) -> String {
    role_of(p)
        .map(|r| r.group().to_string())
        .unwrap_or_default()
}

/// Total requests of an old cluster's pods that hold something (terminal pods
/// hold nothing), counting one pod slot each, as every new pod will take one too.
pub fn total_requests<'a, P: ObservedPod + ?Sized + 'a>(
    pods: impl IntoIterator<Item = &'a P>,
    limit_ranges: &[LimitRange],
) -> crate::Result<ResourceList> {
    let mut total = ResourceList::new();
    let mut slots: i64 = 0;
    for p in pods {
        if p.is_terminal() {
            continue;
        }
        capacity::add_into(&mut total, &p.requests(limit_ranges)?);
        slots = slots.saturating_add(1);
    }
    if slots > 0 {
        capacity::add_into(
            &mut total,
            &ResourceList::from([(
                PODS.to_string(),
                crate::quantity::Quantity::from_units(slots),
            )]),
        );
    }
    Ok(total)
}

impl ObservedPod for Pod {
    fn node_type(&self) -> Option<&str> {
        self.labels().get(LABEL_NODE_TYPE).map(String::as_str)
    }

    fn group(&self) -> Option<&str> {
        self.labels().get(LABEL_GROUP).map(String::as_str)
    }

    fn is_bound(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some()
    }

    fn is_terminal(&self) -> bool {
        capacity::requests::is_terminal(self)
    }

    fn unschedulable_message(&self) -> Option<&str> {
        if self.is_bound() {
            return None;
        }
        self.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .filter(|c| c.reason.as_deref() == Some("Unschedulable"))
            .map(|c| c.message.as_deref().unwrap_or("unschedulable"))
    }

    fn requests(&self, limit_ranges: &[LimitRange]) -> crate::Result<ResourceList> {
        capacity::pod_requests(self, limit_ranges)
    }
}

impl ObservedPod for PodRecord {
    fn node_type(&self) -> Option<&str> {
        self.body.ray.as_ref()?.node_type.as_deref()
    }

    fn group(&self) -> Option<&str> {
        self.body.ray.as_ref()?.group.as_deref()
    }

    fn is_bound(&self) -> bool {
        self.body.node.is_some()
    }

    fn is_terminal(&self) -> bool {
        self.body.phase.is_terminal()
    }

    fn unschedulable_message(&self) -> Option<&str> {
        if self.is_bound() {
            return None;
        }
        self.body
            .ray
            .as_ref()?
            .conditions
            .iter()
            .find(|c| !c.ready && &*c.status == "False")
            .filter(|c| c.reason.as_deref() == Some("Unschedulable"))
            .map(|c| c.message.as_deref().unwrap_or("unschedulable"))
    }

    fn requests(&self, _: &[LimitRange]) -> crate::Result<ResourceList> {
        let units = self.body.requests.as_ref().map_err(|e| {
            crate::Error::invalid(format!("Pod {}/{}", self.key.0, self.key.1), e.to_string())
        })?;
        Ok(units
            .iter()
            .filter(|(r, _)| r.as_str() != PODS)
            .map(|(r, u)| {
                (
                    r.as_str().to_string(),
                    capacity::from_scheduler_units(r.as_str(), i128::from(*u)),
                )
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    /// Every question has the same answer from the `Pod` and from its record.
    #[test]
    fn a_record_answers_as_the_pod_it_was_made_from() {
        let pods = [
            pod(json!({
                "metadata": {"name": "w-1", "namespace": "ml", "labels": {
                    "ray.io/cluster": "c", "ray.io/node-type": "worker", "ray.io/group": "gpu"}},
                "spec": {"containers": [{"name": "w", "resources": {
                    "requests": {"cpu": "1500m", "memory": "1Gi", "nvidia.com/gpu": "2"},
                    "limits": {"nvidia.com/gpu": "2"}}}]},
                "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled",
                    "status": "False", "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}
            })),
            pod(json!({
                "metadata": {"name": "h", "namespace": "ml", "labels": {
                    "ray.io/cluster": "c", "ray.io/node-type": "head"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "h", "resources": {
                    "requests": {"cpu": "2", "memory": "4Gi"}}}]},
                "status": {"phase": "Running", "conditions": [{"type": "PodScheduled",
                    "status": "True"}]}
            })),
            pod(json!({
                "metadata": {"name": "done", "namespace": "ml", "labels": {
                    "ray.io/cluster": "c", "ray.io/node-type": "worker", "ray.io/group": "gpu"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "w", "resources": {
                    "requests": {"cpu": "1"}}}]},
                "status": {"phase": "Succeeded"}
            })),
        ];
        for p in &pods {
            let r = PodRecord::from_pod(p);
            assert_eq!(p.node_type(), r.node_type());
            assert_eq!(p.group(), r.group());
            assert_eq!(group_of(p), group_of(&r));
            assert_eq!(role_of(p), role_of(&r));
            assert_eq!(p.is_bound(), r.is_bound());
            assert_eq!(p.is_terminal(), r.is_terminal());
            assert_eq!(p.unschedulable_message(), r.unschedulable_message());
            assert_eq!(
                capacity::canonical_map(&p.requests(&[]).unwrap()),
                capacity::canonical_map(&r.requests(&[]).unwrap())
            );
        }
        let records: Vec<PodRecord> = pods.iter().map(PodRecord::from_pod).collect();
        assert_eq!(
            capacity::canonical_map(&total_requests(pods.iter(), &[]).unwrap()),
            capacity::canonical_map(&total_requests(records.iter(), &[]).unwrap())
        );
        assert_eq!(
            pods[0].unschedulable_message(),
            Some("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
        );
        assert_eq!(group_of(&pods[1]), HEAD);
    }

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
        assert!(
            total_requests::<Pod>(std::iter::empty(), &[])
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_record_whose_request_did_not_parse_is_an_error_naming_the_pod() {
        let p = pod(json!({
            "metadata": {"name": "bad", "namespace": "ml"},
            "spec": {"containers": [{"name": "w", "resources": {"requests": {"cpu": "lots"}}}]}
        }));
        let r = PodRecord::from_pod(&p);
        let e = r.requests(&[]).unwrap_err().to_string();
        assert!(e.contains("Pod ml/bad"), "{e}");
    }
}
