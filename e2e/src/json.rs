//! Small helpers for working on `serde_json::Value` objects.
//!
//! kuberay-sim deliberately works on untyped JSON for RayService/RayCluster so it
//! carries no copy of KubeRay's Go structs (and no copy of raygate's types).

use serde_json::{Map, Value};
use std::collections::BTreeMap;

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

/// Boolean at `path`, false when absent.
pub fn bool_at(v: &Value, path: &[&str]) -> bool {
    get(v, path).and_then(Value::as_bool).unwrap_or(false)
}

/// Array at `path`, empty when absent.
pub fn arr_at<'a>(v: &'a Value, path: &[&str]) -> &'a [Value] {
    get(v, path)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// Mutable object at `path`, creating empty objects (and replacing non-objects) on the way.
pub fn obj_mut<'a>(v: &'a mut Value, path: &[&str]) -> &'a mut Map<String, Value> {
    let mut cur = v;
    for p in path {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(m) = cur else {
            unreachable!("just made an object")
        };
        cur = m
            .entry((*p).to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if !cur.is_object() {
        *cur = Value::Object(Map::new());
    }
    match cur {
        Value::Object(m) => m,
        _ => unreachable!("just made an object"),
    }
}

/// Removes the key at `path` if present.
pub fn remove(v: &mut Value, path: &[&str]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for p in parents {
        match cur.as_object_mut().and_then(|m| m.get_mut(*p)) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(*last);
    }
}

/// A string map (labels/annotations) at `path`.
pub fn string_map(v: &Value, path: &[&str]) -> BTreeMap<String, String> {
    get(v, path)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Serialises with object keys sorted, independent of serde_json's `preserve_order` feature,
/// so hashes are stable whatever feature set the workspace unifies to.
pub fn canonical_string(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                if let Some(val) = m.get(*k) {
                    write_canonical(val, out);
                }
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, val) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(val, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// RFC 3339 timestamp with second precision, the format metav1.Time serialises to.
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_sorts_keys() {
        let v = json!({"b": 1, "a": {"d": [1, {"z": 1, "y": 2}], "c": "x"}});
        assert_eq!(
            canonical_string(&v),
            r#"{"a":{"c":"x","d":[1,{"y":2,"z":1}]},"b":1}"#
        );
    }

    #[test]
    fn obj_mut_creates_path() {
        let mut v = json!({});
        obj_mut(&mut v, &["a", "b"]).insert("c".into(), json!(1));
        assert_eq!(v, json!({"a": {"b": {"c": 1}}}));
        remove(&mut v, &["a", "b", "c"]);
        assert_eq!(v, json!({"a": {"b": {}}}));
    }
}
