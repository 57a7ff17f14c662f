//! Who owns raygate's one field of a RayService, `spec.upgradeStrategy.type`,
//! read from its managedFields: shared by the controller (which writes the
//! gate) and `kubectl raygate` (which reports it), so neither imports the other.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

/// raygate's field manager: the owner of the gate.
pub const FIELD_MANAGER: &str = "raygate";

/// Does this managedFields entry own `spec.upgradeStrategy.type`? Either the
/// field itself, or `upgradeStrategy` as a whole: a schema without properties
/// for it (KubeRay-compatible CRDs that only preserve unknown fields) makes
/// the object atomic, and its owner owns the type too.
fn owns_gate(m: &ManagedFieldsEntry) -> bool {
    let Some(strategy) = m
        .fields_v1
        .as_ref()
        .and_then(|f| f.0.get("f:spec"))
        .and_then(|s| s.get("f:upgradeStrategy"))
    else {
        return false;
    };
    strategy.get("f:type").is_some() || strategy.as_object().is_none_or(|fields| fields.is_empty())
}

/// Another field manager that owns `spec.upgradeStrategy.type`, if any.
pub fn other_owner(managed: &[ManagedFieldsEntry]) -> Option<String> {
    managed
        .iter()
        .filter(|m| m.manager.as_deref() != Some(FIELD_MANAGER))
        .find(|m| owns_gate(m))
        .map(|m| m.manager.clone().unwrap_or_else(|| "unknown".into()))
}

/// Does raygate itself own the field (so releasing it means something)?
pub fn owned_by_us(managed: &[ManagedFieldsEntry]) -> bool {
    managed
        .iter()
        .any(|m| m.manager.as_deref() == Some(FIELD_MANAGER) && owns_gate(m))
}
