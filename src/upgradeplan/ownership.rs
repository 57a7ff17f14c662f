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

/// Keep of each managedFields entry only what `owns_gate` reads (its
/// `f:spec.f:upgradeStrategy`), and only the entries that have it: a tenant's
/// 5,000-group RayService carries a field set as large as the object.
pub fn slim_managed_fields(managed: &mut Option<Vec<ManagedFieldsEntry>>) {
    let Some(entries) = managed.as_mut() else {
        return;
    };
    entries.retain_mut(|m| {
        let strategy = m
            .fields_v1
            .as_mut()
            .and_then(|f| f.0.get_mut("f:spec"))
            .and_then(|s| s.get_mut("f:upgradeStrategy"))
            .map(serde_json::Value::take);
        match strategy {
            Some(strategy) => {
                m.fields_v1 = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                    serde_json::json!({"f:spec": {"f:upgradeStrategy": strategy}}),
                ));
                true
            }
            None => false,
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
    use serde_json::json;

    fn entry(manager: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    #[test]
    fn slimming_keeps_exactly_what_ownership_reads() {
        let groups: serde_json::Map<String, serde_json::Value> = (0..100)
            .map(|i| {
                (
                    format!("k:{{\"groupName\":\"g{i}\"}}"),
                    json!({"f:replicas": {}}),
                )
            })
            .collect();
        let mut managed = Some(vec![
            entry(
                "kubectl",
                json!({"f:spec": {"f:rayClusterConfig": {"f:workerGroupSpecs": groups},
                    "f:upgradeStrategy": {"f:type": {}}}}),
            ),
            entry(
                "kuberay-operator",
                json!({"f:status": {"f:serviceStatus": {}}}),
            ),
            entry(FIELD_MANAGER, json!({"f:spec": {"f:upgradeStrategy": {}}})),
        ]);
        let before = managed.clone().unwrap_or_default();
        slim_managed_fields(&mut managed);
        let after = managed.unwrap_or_default();
        assert_eq!(other_owner(&after), other_owner(&before));
        assert_eq!(owned_by_us(&after), owned_by_us(&before));
        assert_eq!(after.len(), 2);
        assert_eq!(
            after[0].fields_v1.as_ref().map(|f| &f.0),
            Some(&json!({"f:spec": {"f:upgradeStrategy": {"f:type": {}}}}))
        );
    }
}
