//! The gate: raygate's only write to a RayService.
//!
//! raygate owns exactly one field, `spec.upgradeStrategy.type`, through
//! server-side apply with its own field manager. KubeRay prepares a new
//! cluster only while it reads `NewCluster` there, so `None` holds a pending
//! `rayClusterConfig` change and `NewCluster` lets it through.
//!
//! Applies are never forced: when another manager (a GitOps tool syncing the
//! field from Git, or a `kubectl edit`) owns the field with another value,
//! the apiserver refuses and raygate reports GateOverridden instead of
//! fighting in a loop.
//!
//! raygate never creates a RayService. A server-side apply of a missing
//! object is a create, so every apply carries the `metadata.uid` raygate
//! read: the apiserver then refuses it when the object is gone (409, "uid
//! mismatch: ... no existing object was found", `patcher.applyPatch` in
//! k8s.io/apiserver's endpoints/handlers/patch.go) or was deleted and created
//! again under the same name (422, "metadata.uid: ... field is immutable").
//! Both are checked against Kubernetes v1.36 in the e2e controller suite.
//! [`is_gone`] tells these apart from a conflict with another field manager.

use kube::api::{Api, Patch, PatchParams};

use serde_json::json;

use crate::admission::Gate;
use kube::core::DeserializeGuard;

use crate::kuberay::RayService;

pub use crate::upgradeplan::ownership::{FIELD_MANAGER, other_owner, owned_by_us};

/// The RayService API as the gate uses it: responses are not needed, and a
/// RayService raygate cannot fully parse must still be gateable.
pub type Services = Api<DeserializeGuard<RayService>>;

/// The RayService a gate write is for: its name and the uid raygate read.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub name: &'a str,
    pub uid: &'a str,
}

/// The apply body: the uid is a precondition, not a field anyone owns
/// (server-side apply strips it from managedFields).
fn body(target: Target<'_>, gate: Option<Gate>) -> serde_json::Value {
    let mut patch = json!({
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": { "name": target.name, "uid": target.uid },
    });
    if let Some(g) = gate {
        patch["spec"] = json!({ "upgradeStrategy": { "type": g.strategy() } });
    }
    patch
}

/// The apiserver refused a gate write because the RayService read is not
/// there any more: not found, gone (uid precondition on a missing object)
/// or replaced by another object of the same name (uid immutable).
pub fn is_gone(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => {
            s.code == 404
                || (s.code == 409 && s.message.contains("uid mismatch"))
                || (s.code == 422 && s.message.contains("metadata.uid"))
        }
        _ => false,
    }
}

/// Set the gate. Only the one field is sent, so nothing else is touched.
pub async fn apply(api: &Services, target: Target<'_>, gate: Gate) -> Result<(), kube::Error> {
    write(api, target, Some(gate)).await
}

/// Give the field up whenever raygate stops gating the RayService (its plan
/// deleted, retargeted or out of the watched namespaces, no plan governing
/// it any more, `raygate release`): an apply without the field removes
/// raygate's ownership, and the field itself when nobody else owns it, so
/// KubeRay falls back to its default behaviour.
pub async fn release(api: &Services, target: Target<'_>) -> Result<(), kube::Error> {
    write(api, target, None).await
}

/// raygate's one server-side apply of the RayService: the gate field, or
/// (`None`) nothing, which gives the field up.
async fn write(api: &Services, target: Target<'_>, gate: Option<Gate>) -> Result<(), kube::Error> {
    let name = target.name;
    let patch = body(target, gate);
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};

    fn entry(manager: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    #[test]
    fn every_write_names_the_object_read_by_uid() {
        let t = Target {
            name: "llm",
            uid: "2f1c",
        };
        let open = body(t, Some(Gate::Open));
        assert_eq!(open["metadata"], json!({"name": "llm", "uid": "2f1c"}));
        assert_eq!(open["spec"]["upgradeStrategy"]["type"], "NewCluster");
        let release = body(t, None);
        assert_eq!(release["metadata"]["uid"], "2f1c");
        assert!(release.get("spec").is_none(), "{release}");
    }

    #[test]
    fn a_missing_or_replaced_rayservice_is_told_from_a_field_conflict() {
        let err = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(is_gone(&err(404, "rayservices.ray.io \"llm\" not found")));
        assert!(is_gone(&err(
            409,
            "Operation cannot be fulfilled on rayservices.ray.io \"llm\": uid mismatch: \
             the provided object specified uid 2f1c, and no existing object was found"
        )));
        assert!(is_gone(&err(
            422,
            "RayService.ray.io \"llm\" is invalid: metadata.uid: Invalid value: \"2f1c\": field is immutable"
        )));
        assert!(!is_gone(&err(
            409,
            "Apply failed with 1 conflict: conflict with \"argocd-controller\": .spec.upgradeStrategy.type"
        )));
    }

    #[test]
    fn finds_the_manager_that_owns_the_gate_field() {
        let mf = vec![
            entry(
                "raygate",
                json!({"f:spec": {"f:upgradeStrategy": {"f:type": {}}}}),
            ),
            entry(
                "argocd-controller",
                json!({"f:spec": {"f:serveConfigV2": {}}}),
            ),
        ];
        assert_eq!(other_owner(&mf), None);
        assert!(owned_by_us(&mf));
        let mf = vec![entry(
            "kubectl-edit",
            json!({"f:spec": {"f:upgradeStrategy": {"f:type": {}}}}),
        )];
        assert_eq!(other_owner(&mf).as_deref(), Some("kubectl-edit"));
        assert!(!owned_by_us(&mf));
    }

    #[test]
    fn owning_an_atomic_upgrade_strategy_owns_the_gate() {
        let mf = vec![
            entry(
                "argocd-controller",
                json!({"f:spec": {"f:upgradeStrategy": {}}}),
            ),
            entry(
                "helm",
                json!({"f:spec": {"f:upgradeStrategy": {".": {}, "f:clusterUpgradeOptions": {}}}}),
            ),
        ];
        assert_eq!(other_owner(&mf).as_deref(), Some("argocd-controller"));
        let only_options = vec![mf[1].clone()];
        assert_eq!(
            other_owner(&only_options),
            None,
            "owning a sibling field is not owning the gate"
        );
    }
}
