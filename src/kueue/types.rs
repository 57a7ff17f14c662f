//! Partial, lenient typed views of Kueue's `kueue.x-k8s.io/v1beta2` objects
//! (the storage version of Kueue v0.19.0, `apis/kueue/v1beta2`): only what
//! raygate reads of a ClusterQueue's quota and usage, a LocalQueue's
//! ClusterQueue, and a Workload's admission. Every field is optional, so a
//! partial object still deserializes; quantities are exact
//! ([`crate::quantity::Quantity`]).

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;
use std::collections::BTreeMap;

use crate::quantity::Quantity;

/// The API group and the version raygate reads and writes.
pub const GROUP: &str = "kueue.x-k8s.io";
pub const VERSION: &str = "v1beta2";

/// `ClusterQueue.spec` (`clusterqueue_types.go`).
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "ClusterQueue",
    status = "ClusterQueueStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQueueSpec {
    #[serde(default)]
    pub resource_groups: Vec<ResourceGroup>,
    /// The cohort the queue borrows from and lends to (v1beta2 `cohortName`;
    /// v1beta1 spelled it `cohort`).
    pub cohort_name: Option<String>,
}

/// `spec.resourceGroups[]`: resources whose flavors are assigned together.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceGroup {
    #[serde(default)]
    pub covered_resources: Vec<String>,
    #[serde(default)]
    pub flavors: Vec<FlavorQuotas>,
}

/// `spec.resourceGroups[].flavors[]`, in the order Kueue tries them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FlavorQuotas {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub resources: Vec<ResourceQuota>,
}

/// One resource's quota in one flavor.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuota {
    #[serde(default)]
    pub name: String,
    /// What the queue may use without borrowing (Go's zero value when absent).
    pub nominal_quota: Option<Quantity>,
    /// At most this much borrowed from the cohort; absent: no limit.
    pub borrowing_limit: Option<Quantity>,
    /// At most this much of the nominal quota lent to the cohort; absent: all.
    pub lending_limit: Option<Quantity>,
}

/// `ClusterQueue.status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQueueStatus {
    /// Quota reserved by workloads (QuotaReserved, admitted or not): what
    /// another workload cannot take.
    #[serde(default)]
    pub flavors_reservation: Vec<FlavorUsage>,
    /// Quota used by admitted workloads.
    #[serde(default)]
    pub flavors_usage: Vec<FlavorUsage>,
}

/// `status.flavorsReservation[]` / `status.flavorsUsage[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FlavorUsage {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub resources: Vec<ResourceUsage>,
}

#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceUsage {
    #[serde(default)]
    pub name: String,
    pub total: Option<Quantity>,
    pub borrowed: Option<Quantity>,
}

/// `LocalQueue.spec`: the namespaced queue a RayService names, and its
/// ClusterQueue.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "LocalQueue",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct LocalQueueSpec {
    pub cluster_queue: Option<String>,
}

/// `Workload.spec`: what raygate writes of its reservation, and reads of
/// any Workload.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "Workload",
    namespaced,
    status = "WorkloadStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    #[serde(default)]
    pub pod_sets: Vec<PodSet>,
    pub queue_name: Option<String>,
    /// Kueue computes it from the priority class; a Workload without one
    /// has priority 0.
    pub priority: Option<i32>,
    pub active: Option<bool>,
}

/// `spec.podSets[]`: `count` pods of one template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub template: PodTemplateSpec,
    #[serde(default)]
    pub count: i32,
}

/// `Workload.status`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    pub admission: Option<WorkloadAdmission>,
}

/// `status.admission`: where Kueue reserved the quota.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadAdmission {
    #[serde(default)]
    pub cluster_queue: String,
    #[serde(default)]
    pub pod_set_assignments: Vec<PodSetAssignment>,
}

#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSetAssignment {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub flavors: BTreeMap<String, String>,
    #[serde(default)]
    pub resource_usage: BTreeMap<String, Quantity>,
    pub count: Option<i32>,
}

/// Workload condition: quota reserved in a ClusterQueue.
pub const CONDITION_QUOTA_RESERVED: &str = "QuotaReserved";
/// Workload condition: quota reserved and every admission check ready.
pub const CONDITION_ADMITTED: &str = "Admitted";

impl Workload {
    /// Kueue granted the quota: `QuotaReserved` or `Admitted` is `True`.
    pub fn quota_granted(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                (c.type_ == CONDITION_QUOTA_RESERVED || c.type_ == CONDITION_ADMITTED)
                    && c.status == "True"
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_a_v1beta2_clusterqueue_as_kueue_writes_it() {
        let cq: ClusterQueue = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": "team-a"},
            "spec": {"cohortName": "ml", "namespaceSelector": {},
                "resourceGroups": [{"coveredResources": ["cpu", "nvidia.com/gpu"],
                    "flavors": [{"name": "a100", "resources": [
                        {"name": "cpu", "nominalQuota": 64},
                        {"name": "nvidia.com/gpu", "nominalQuota": "16", "borrowingLimit": "8", "lendingLimit": "4"}]}]}]},
            "status": {"flavorsReservation": [{"name": "a100", "resources": [
                {"name": "nvidia.com/gpu", "total": "8", "borrowed": "0"}]}],
                "pendingWorkloads": 0, "admittedWorkloads": 1, "reservingWorkloads": 1}
        }))
        .unwrap();
        assert_eq!(cq.spec.cohort_name.as_deref(), Some("ml"));
        let gpu = &cq.spec.resource_groups[0].flavors[0].resources[1];
        assert_eq!(gpu.nominal_quota, Some(Quantity::from_units(16)));
        assert_eq!(gpu.lending_limit, Some(Quantity::from_units(4)));
        let st = cq.status.unwrap();
        assert_eq!(
            st.flavors_reservation[0].resources[0].total,
            Some(Quantity::from_units(8))
        );
    }

    #[test]
    fn a_workload_is_granted_by_quotareserved_or_admitted() {
        let wl = |conds: serde_json::Value| -> Workload {
            serde_json::from_value(json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "metadata": {"name": "w", "namespace": "ml"},
                "spec": {"queueName": "team-a", "podSets": [{"name": "head", "count": 1,
                    "template": {"spec": {"containers": [{"name": "c"}]}}}]},
                "status": {"conditions": conds}
            }))
            .unwrap()
        };
        let c = |t: &str, s: &str| {
            json!({"type": t, "status": s, "reason": "r", "message": "",
            "lastTransitionTime": "2026-12-07T00:00:00Z"})
        };
        assert!(!wl(json!([])).quota_granted());
        assert!(!wl(json!([c("QuotaReserved", "False")])).quota_granted());
        assert!(wl(json!([c("QuotaReserved", "True")])).quota_granted());
        assert!(wl(json!([c("Admitted", "True")])).quota_granted());
    }
}
