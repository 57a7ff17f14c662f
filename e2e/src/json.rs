//! Small helpers for reading `serde_json::Value` objects in tests.
//!
//! The tests read RayServices and RayClusters as untyped JSON, so they carry no copy of
//! KubeRay's Go structs (and no copy of raygate's types).

use serde_json::Value;

/// Follows `path` through nested objects.
pub fn get<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut cur = v;
    for p in path {
        cur = cur.as_object()?.get(*p)?;
    }
    Some(cur)
}

/// String at `path`, or "" when absent (Go zero-value semantics).
pub fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    get(v, path).and_then(Value::as_str).unwrap_or("")
}

/// Integer at `path`, if present.
pub fn i64_at(v: &Value, path: &[&str]) -> Option<i64> {
    get(v, path).and_then(Value::as_i64)
}

/// Array at `path`, empty when absent.
pub fn arr_at<'a>(v: &'a Value, path: &[&str]) -> &'a [Value] {
    get(v, path)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_nested_values() {
        let v = json!({"a": {"b": "x", "n": 3, "l": [1, 2]}});
        assert_eq!(str_at(&v, &["a", "b"]), "x");
        assert_eq!(i64_at(&v, &["a", "n"]), Some(3));
        assert_eq!(arr_at(&v, &["a", "l"]).len(), 2);
        assert_eq!(str_at(&v, &["a", "missing"]), "");
        assert!(arr_at(&v, &["nope"]).is_empty());
    }
}
