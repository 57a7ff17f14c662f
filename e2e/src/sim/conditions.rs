//! metav1.Condition handling with `meta.SetStatusCondition` semantics:
//! `lastTransitionTime` only moves when `status` changes.

use crate::json::now_rfc3339;
use serde_json::{Value, json};

/// Finds a condition by type.
pub fn find<'a>(conds: &'a [Value], ty: &str) -> Option<&'a Value> {
    conds
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
}

/// True when the condition exists with status "True".
pub fn is_true(conds: &[Value], ty: &str) -> bool {
    find(conds, ty)
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str)
        == Some("True")
}

/// Sets or updates a condition. `observed_generation` 0 is omitted, as Go's omitempty does.
///
/// An empty `message` is replaced by the reason: the e2e kube-apiserver v1.20 build rejects
/// `""` in custom-resource string fields (it validates them as null), see SIMULATION.md.
pub fn set(
    conds: &mut Vec<Value>,
    ty: &str,
    status: &str,
    reason: &str,
    message: &str,
    observed_generation: i64,
) {
    let message = if message.is_empty() { reason } else { message };
    let mut new = json!({
        "type": ty,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339(),
    });
    if observed_generation != 0 {
        new["observedGeneration"] = json!(observed_generation);
    }
    if let Some(existing) = conds
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
    {
        if existing.get("status").and_then(Value::as_str) == Some(status)
            && let Some(t) = existing.get("lastTransitionTime")
        {
            new["lastTransitionTime"] = t.clone();
        }
        *existing = new;
    } else {
        conds.push(new);
    }
}

/// Removes a condition by type.
pub fn remove(conds: &mut Vec<Value>, ty: &str) {
    conds.retain(|c| c.get("type").and_then(Value::as_str) != Some(ty));
}

/// Conditions compared without `lastTransitionTime`-only churn: same as Go's DeepEqual on
/// values we produced ourselves, since we keep the old timestamp when status is unchanged.
pub fn equal(a: &[Value], b: &[Value]) -> bool {
    a == b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_transition_time_when_status_unchanged() {
        let mut c = vec![
            json!({"type": "Ready", "status": "False", "reason": "A", "message": "", "lastTransitionTime": "2000-01-01T00:00:00Z"}),
        ];
        set(&mut c, "Ready", "False", "B", "m", 3);
        assert_eq!(c[0]["lastTransitionTime"], "2000-01-01T00:00:00Z");
        assert_eq!(c[0]["reason"], "B");
        assert_eq!(c[0]["observedGeneration"], 3);
        set(&mut c, "Ready", "True", "B", "m", 3);
        assert_ne!(c[0]["lastTransitionTime"], "2000-01-01T00:00:00Z");
        assert!(is_true(&c, "Ready"));
    }
}
