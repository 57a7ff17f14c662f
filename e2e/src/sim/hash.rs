//! The RayCluster spec hash KubeRay stores in `ray.io/hash-without-replicas-and-workers-to-delete`.
//!
//! Mirrors v1.7.0 `rayClusterSpecForHashing` + `GenerateHashWithoutReplicasAndWorkersToDelete`:
//! muted fields are `suspend`, `upgradeStrategy`, head/worker `template.spec.tolerations` and
//! `schedulingGates`, and per worker group `replicas`, `minReplicas`, `maxReplicas`,
//! `scaleStrategy.workersToDelete`. The digest is SHA-1 + base32hex like KubeRay's, but it is
//! taken over the JSON as stored (keys sorted), not over Go-marshalled structs, so the values
//! differ from real KubeRay's and any textual change (e.g. `"1"` vs `1` for a quantity) counts.

use crate::json::{canonical_string, remove};
use serde_json::Value;
use sha1::{Digest, Sha1};

/// The muted copy of a RayService `rayClusterConfig` (or RayCluster `spec`).
pub fn spec_for_hashing(spec: &Value) -> Value {
    let mut s = spec.clone();
    remove(&mut s, &["suspend"]);
    remove(&mut s, &["upgradeStrategy"]);
    remove(
        &mut s,
        &["headGroupSpec", "template", "spec", "tolerations"],
    );
    remove(
        &mut s,
        &["headGroupSpec", "template", "spec", "schedulingGates"],
    );
    if let Some(groups) = s.get_mut("workerGroupSpecs").and_then(Value::as_array_mut) {
        for g in groups {
            for k in ["replicas", "minReplicas", "maxReplicas"] {
                remove(g, &[k]);
            }
            remove(g, &["scaleStrategy", "workersToDelete"]);
            // Go always marshals the (non-pointer) ScaleStrategy struct; treat an empty one
            // and a missing one alike so `scaleStrategy: {}` is not a "change".
            if g.get("scaleStrategy")
                .and_then(Value::as_object)
                .is_some_and(|m| m.is_empty())
            {
                remove(g, &["scaleStrategy"]);
            }
            remove(g, &["template", "spec", "tolerations"]);
            remove(g, &["template", "spec", "schedulingGates"]);
        }
    }
    s
}

/// Hash of the muted spec.
pub fn hash_spec(spec: &Value) -> String {
    hash_value(&spec_for_hashing(spec))
}

/// Hash of the muted spec with only the first `n` worker groups (the in-place "groups appended" rule).
pub fn hash_spec_first_groups(spec: &Value, n: usize) -> String {
    let mut s = spec.clone();
    if let Some(groups) = s.get_mut("workerGroupSpecs").and_then(Value::as_array_mut) {
        groups.truncate(n);
    }
    hash_spec(&s)
}

fn hash_value(v: &Value) -> String {
    let digest = Sha1::digest(canonical_string(v).as_bytes());
    base32_hex(&digest)
}

/// RFC 4648 base32 "extended hex" with padding, as Go's `base32.HexEncoding`.
fn base32_hex(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHIJKLMNOPQRSTUV";
    let mut out = String::new();
    for chunk in data.chunks(5) {
        let mut buf = [0u8; 5];
        buf[..chunk.len()].copy_from_slice(chunk);
        let bits = buf.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        let chars = match chunk.len() {
            1 => 2,
            2 => 4,
            3 => 5,
            4 => 7,
            _ => 8,
        };
        for i in 0..8 {
            if i < chars {
                let idx = ((bits >> (35 - 5 * i)) & 0x1f) as usize;
                out.push(char::from(ALPHABET[idx]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> Value {
        json!({
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "ray:2.9"}]}}},
            "workerGroupSpecs": [{
                "groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 4,
                "template": {"spec": {"containers": [{"name": "w", "image": "ray:2.9"}]}}
            }]
        })
    }

    #[test]
    fn base32_matches_go_vectors() {
        assert_eq!(base32_hex(b""), "");
        assert_eq!(base32_hex(b"f"), "CO======");
        assert_eq!(base32_hex(b"foobar"), "CPNMUOJ1E8======");
        assert_eq!(hash_value(&json!({})).len(), 32);
    }

    #[test]
    fn replicas_and_tolerations_are_muted() {
        let a = spec();
        let mut b = spec();
        b["workerGroupSpecs"][0]["replicas"] = json!(3);
        b["workerGroupSpecs"][0]["maxReplicas"] = json!(9);
        b["workerGroupSpecs"][0]["scaleStrategy"] = json!({"workersToDelete": ["x"]});
        b["workerGroupSpecs"][0]["template"]["spec"]["tolerations"] = json!([{"key": "k"}]);
        b["suspend"] = json!(true);
        assert_eq!(hash_spec(&a), hash_spec(&b));
    }

    #[test]
    fn image_change_is_a_change_and_appending_groups_is_partial() {
        let a = spec();
        let mut b = spec();
        b["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] = json!("ray:2.10");
        assert_ne!(hash_spec(&a), hash_spec(&b));
        let mut c = spec();
        let extra = c["workerGroupSpecs"][0].clone();
        c["workerGroupSpecs"].as_array_mut().unwrap().push(extra);
        assert_ne!(hash_spec(&a), hash_spec(&c));
        assert_eq!(hash_spec(&a), hash_spec_first_groups(&c, 1));
    }
}
