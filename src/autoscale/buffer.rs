//! The CapacityBuffer API (`autoscaling.x-k8s.io/v1beta1`), as much of it as
//! raygate writes and reads. The same API is served by Karpenter (its
//! `CapacityBuffer` feature gate; `pkg/apis/autoscaling/v1beta1` of
//! sigs.k8s.io/karpenter v1.15.0, copied from cluster-autoscaler) and by
//! cluster-autoscaler (v1beta1 since 1.35). Unknown fields are ignored on
//! read; raygate writes only `spec` (server-side apply).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

/// `ReadyForProvisioning`: the autoscaler resolved the buffer's pod template.
pub const READY_FOR_PROVISIONING: &str = "ReadyForProvisioning";
/// `Provisioning`: Karpenter writes `True`/`FitsExistingCapacity` when every
/// placeholder pod fits existing nodes and `False`/`RequiresNewCapacity`
/// ("x/n virtual pods required new capacity, f failed") otherwise;
/// cluster-autoscaler writes `True` once it has processed the buffer. Never
/// a reason to admit: raygate admits on its own fit of Ready nodes.
pub const PROVISIONING: &str = "Provisioning";

#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "autoscaling.x-k8s.io",
    version = "v1beta1",
    kind = "CapacityBuffer",
    plural = "capacitybuffers",
    namespaced,
    status = "CapacityBufferStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferSpec {
    pub provisioning_strategy: Option<String>,
    pub pod_template_ref: Option<LocalObjectRef>,
    /// Placeholder pods of the template to keep room for.
    pub replicas: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalObjectRef {
    pub name: String,
}

#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferStatus {
    pub replicas: Option<i32>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl CapacityBuffer {
    /// The condition of `type_`, if the autoscaler wrote it.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_karpenter_writes_and_ignores_the_rest() {
        let b: CapacityBuffer = serde_json::from_value(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
            "metadata": {"name": "b", "namespace": "ml"},
            "spec": {"podTemplateRef": {"name": "t"}, "replicas": 2,
                     "provisioningStrategy": "buffer.x-k8s.io/active-capacity", "limits": {"cpu": "4"}},
            "status": {"replicas": 2, "podTemplateGeneration": 1, "provisioningStrategy": "x",
                "conditions": [
                    {"type": "ReadyForProvisioning", "status": "True", "reason": "Resolved",
                     "message": "Pod template resolved successfully", "lastTransitionTime": "2026-12-04T10:00:00Z"},
                    {"type": "Provisioning", "status": "False", "reason": "RequiresNewCapacity",
                     "message": "1/2 virtual pods required new capacity, 0 failed",
                     "lastTransitionTime": "2026-12-04T10:00:01Z"}]}
        }))
        .unwrap();
        assert_eq!(b.spec.replicas, Some(2));
        assert_eq!(
            b.condition(PROVISIONING).map(|c| c.reason.as_str()),
            Some("RequiresNewCapacity")
        );
        assert!(b.condition("Ready").is_none());
        let spec = serde_json::to_value(&b.spec).unwrap();
        assert_eq!(
            spec,
            json!({"podTemplateRef": {"name": "t"}, "replicas": 2,
                   "provisioningStrategy": "buffer.x-k8s.io/active-capacity"})
        );
    }
}
