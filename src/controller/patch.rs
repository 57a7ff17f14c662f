//! Status writes: server-side apply of the whole status under raygate's
//! field manager.
//!
//! raygate owns all of an UpgradePlan's status, so each write applies all of
//! it: a field left out is removed because raygate's own apply had set it.
//! Each apply names the resourceVersion the decision was based on, so the
//! apiserver refuses it (409) when the plan changed meanwhile; the caller then
//! reads the plan again instead of re-applying blindly.
//!
//! raygate 0.1 wrote status with JSON merge patches (operation `Update`).
//! Fields set that way belong to that `Update` entry, so no apply could ever
//! remove them: a stale `admitted` would stay. [`ownership_upgrade`] turns
//! that entry into raygate's apply entry once, the way client-go's
//! `csaupgrade` migrates client-side apply.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::gate::FIELD_MANAGER;
use crate::Result;
use crate::upgradeplan::{UpgradePlan, UpgradePlanStatus};

const STATUS: &str = "status";
const APPLY: &str = "Apply";
const UPDATE: &str = "Update";

/// The apply body of a status write, conditional on the plan's resourceVersion.
pub fn status_apply(plan: &UpgradePlan, status: &UpgradePlanStatus) -> Result<Value> {
    let mut metadata = json!({ "name": plan.name_any() });
    if let Some(rv) = plan.resource_version() {
        metadata["resourceVersion"] = json!(rv);
    }
    Ok(json!({
        "apiVersion": UpgradePlan::api_version(&()),
        "kind": UpgradePlan::kind(&()),
        "metadata": metadata,
        "status": serde_json::to_value(status)?,
    }))
}

fn is_ours(e: &ManagedFieldsEntry, operation: &str) -> bool {
    e.manager.as_deref() == Some(FIELD_MANAGER)
        && e.operation.as_deref() == Some(operation)
        && e.subresource.as_deref() == Some(STATUS)
}

/// A merge patch of the plan's `managedFields` that makes raygate's old
/// `Update` entry on status its `Apply` entry (merged with an existing apply
/// entry, if any), conditional on the resourceVersion; `None` when there is
/// nothing to migrate.
pub fn ownership_upgrade(plan: &UpgradePlan) -> Option<Value> {
    let entries = plan.metadata.managed_fields.as_deref()?;
    if !entries.iter().any(|e| is_ours(e, UPDATE)) {
        return None;
    }
    let applied: Option<Value> = entries
        .iter()
        .find(|e| is_ours(e, APPLY))
        .and_then(|e| e.fields_v1.as_ref())
        .map(|f| f.0.clone());
    let migrated: Vec<ManagedFieldsEntry> = entries
        .iter()
        .filter(|e| !is_ours(e, APPLY))
        .map(|e| {
            if !is_ours(e, UPDATE) {
                return e.clone();
            }
            let mut fields = e
                .fields_v1
                .as_ref()
                .map(|f| f.0.clone())
                .unwrap_or(json!({}));
            if let Some(a) = &applied {
                union(&mut fields, a);
            }
            ManagedFieldsEntry {
                operation: Some(APPLY.into()),
                fields_v1: Some(FieldsV1(fields)),
                ..e.clone()
            }
        })
        .collect();
    let mut metadata = json!({ "managedFields": migrated });
    if let Some(rv) = plan.resource_version() {
        metadata["resourceVersion"] = json!(rv);
    }
    Some(json!({ "metadata": metadata }))
}

/// Adds every field of `other` to the field set `into` (both `fieldsV1` tries).
fn union(into: &mut Value, other: &Value) {
    match (into, other) {
        (Value::Object(i), Value::Object(o)) => {
            for (k, v) in o {
                match i.get_mut(k) {
                    Some(cur) => union(cur, v),
                    None => {
                        i.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (slot, v) if slot.is_null() => *slot = v.clone(),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upgradeplan::Phase;

    fn plan(managed: Value) -> UpgradePlan {
        serde_json::from_value(json!({
            "apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
            "metadata": {"name": "p", "namespace": "ml", "resourceVersion": "42",
                         "managedFields": managed},
            "spec": {"rayServiceRef": {"name": "llm"}},
            "status": {"phase": "Admitted", "admitted": {"fingerprint": "abc", "admittedTime": "2026-12-02T12:00:00Z"}}
        }))
        .unwrap()
    }

    fn entry(manager: &str, op: &str, sub: Option<&str>, fields: Value) -> Value {
        json!({"manager": manager, "operation": op, "subresource": sub,
               "apiVersion": "raygate.io/v1alpha1", "fieldsType": "FieldsV1", "fieldsV1": fields})
    }

    #[test]
    fn a_status_write_applies_all_of_it_conditional_on_the_version_decided_on() {
        let mut p = plan(json!([]));
        let status = UpgradePlanStatus {
            phase: Phase::Idle,
            ray_service: Some("llm".into()),
            ..Default::default()
        };
        let body = status_apply(&p, &status).unwrap();
        assert_eq!(body["apiVersion"], "raygate.io/v1alpha1");
        assert_eq!(body["kind"], "UpgradePlan");
        assert_eq!(
            body["metadata"],
            json!({"name": "p", "resourceVersion": "42"})
        );
        // `admitted` is left out, so the apply removes it.
        assert_eq!(
            body["status"],
            json!({"phase": "Idle", "rayService": "llm"})
        );
        p.metadata.resource_version = None;
        assert_eq!(
            status_apply(&p, &status).unwrap()["metadata"],
            json!({"name": "p"})
        );
    }

    #[test]
    fn nothing_to_migrate_without_an_old_update_entry() {
        let p = plan(json!([
            entry(
                "raygate",
                "Apply",
                Some("status"),
                json!({"f:status": {"f:phase": {}}})
            ),
            entry(
                "raygate",
                "Update",
                None,
                json!({"f:metadata": {"f:finalizers": {}}})
            ),
            entry(
                "kubectl-raygate",
                "Update",
                None,
                json!({"f:spec": {"f:approve": {}}})
            ),
        ]));
        assert_eq!(ownership_upgrade(&p), None);
    }

    #[test]
    fn the_old_update_entry_becomes_the_apply_entry_and_others_are_kept() {
        let p = plan(json!([
            entry("kubectl", "Update", None, json!({"f:spec": {}})),
            entry(
                "raygate",
                "Update",
                Some("status"),
                json!({"f:status": {"f:phase": {}, "f:admitted": {".": {}, "f:fingerprint": {}}}})
            ),
        ]));
        let patch = ownership_upgrade(&p).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        let m = patch["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0]["manager"], "kubectl");
        assert_eq!(m[1]["manager"], "raygate");
        assert_eq!(m[1]["operation"], "Apply");
        assert_eq!(m[1]["subresource"], "status");
        assert_eq!(
            m[1]["fieldsV1"],
            json!({"f:status": {"f:phase": {}, "f:admitted": {".": {}, "f:fingerprint": {}}}})
        );
    }

    #[test]
    fn an_existing_apply_entry_is_merged_into_one() {
        let p = plan(json!([
            entry(
                "raygate",
                "Apply",
                Some("status"),
                json!({"f:status": {"f:phase": {}, "f:capacity": {}}})
            ),
            entry(
                "raygate",
                "Update",
                Some("status"),
                json!({"f:status": {"f:admitted": {}}})
            ),
        ]));
        let patch = ownership_upgrade(&p).unwrap();
        let m = patch["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0]["operation"], "Apply");
        assert_eq!(
            m[0]["fieldsV1"],
            json!({"f:status": {"f:admitted": {}, "f:phase": {}, "f:capacity": {}}})
        );
    }
}
