//! Status writes as JSON merge patches.
//!
//! A merge patch carries exactly what changed, with `null` for what was
//! removed. raygate uses it for its own status rather than server-side
//! apply because the apiserver of Kubernetes v1.20 (still supported) turns a
//! field dropped from an apply into an explicit `null` on custom resources,
//! which its own schema validation then rejects.

use serde_json::{Map, Value};

/// The merge patch that turns `old` into `new` (RFC 7386).
pub fn merge_diff(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = Map::new();
            for (k, ov) in o {
                match n.get(k) {
                    None => {
                        out.insert(k.clone(), Value::Null);
                    }
                    Some(nv) if nv != ov => {
                        out.insert(k.clone(), merge_diff(ov, nv));
                    }
                    Some(_) => {}
                }
            }
            for (k, nv) in n {
                if !o.contains_key(k) {
                    out.insert(k.clone(), nv.clone());
                }
            }
            Value::Object(out)
        }
        // Lists and scalars are replaced whole, as merge patch does.
        _ => new.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Applies a merge patch per RFC 7386, to check diffs round-trip.
    fn apply(target: &Value, patch: &Value) -> Value {
        match patch {
            Value::Object(p) => {
                let mut t = match target {
                    Value::Object(t) => t.clone(),
                    _ => Map::new(),
                };
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        let cur = t.get(k).cloned().unwrap_or(Value::Null);
                        t.insert(k.clone(), apply(&cur, v));
                    }
                }
                Value::Object(t)
            }
            _ => patch.clone(),
        }
    }

    #[test]
    fn removed_fields_become_null_and_unchanged_ones_are_left_out() {
        let old = json!({"phase": "Admitted", "capacity": {"required": {"cpu": "1"}, "free": {"cpu": "2"}},
            "admitted": {"fingerprint": "abc"}, "conditions": [{"type": "Ready"}]});
        let new = json!({"phase": "Upgrading", "capacity": {"free": {"cpu": "2"}},
            "conditions": [{"type": "Ready"}], "pendingCluster": "llm-b"});
        let d = merge_diff(&old, &new);
        assert_eq!(
            d,
            json!({"phase": "Upgrading", "capacity": {"required": null}, "admitted": null, "pendingCluster": "llm-b"})
        );
        assert_eq!(apply(&old, &d), new);
    }

    #[test]
    fn identical_values_give_an_empty_patch() {
        let v = json!({"a": {"b": [1, 2]}});
        assert_eq!(merge_diff(&v, &v), json!({}));
    }

    #[test]
    fn lists_are_replaced_whole() {
        let d = merge_diff(&json!({"l": [1, 2, 3]}), &json!({"l": [1, 3]}));
        assert_eq!(d, json!({"l": [1, 3]}));
    }
}
