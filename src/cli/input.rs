//! Reading the CLI's input: files of bounded size, YAML or JSON (multi-document, `List`s
//! flattened), parsed into typed objects with errors that name the file and the field.

use std::path::Path;

use serde_json::Value;

use super::{plan, sum_requests};
use crate::capacity::{self, ClusterState};
use crate::kuberay::{self, KubeRayVersion, OldSide, RayService};
use crate::{Error, Result};

fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// Puts the file name in front of an error about its content.
pub(crate) fn in_file<T>(path: &Path, r: Result<T>) -> Result<T> {
    r.map_err(|e| match e {
        Error::Input { .. } => e,
        other => Error::Input {
            path: shown(path),
            reason: other.to_string(),
        },
    })
}

/// The largest input file read (256 MiB): `kubectl get nodes,pods -A -o
/// yaml` of a 100,000-pod cluster fits; an endless input (`/dev/zero`, a
/// stuck pipe) stops with an error instead of growing until memory runs out.
pub const MAX_INPUT_BYTES: u64 = 256 << 20;

/// A file's text, refusing more than `max` bytes and invalid UTF-8.
fn read_bounded(path: &Path, max: u64) -> Result<String> {
    use std::io::Read;
    let err = |reason: String| Error::Input {
        path: shown(path),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| err(e.to_string()))?;
    if bytes.len() as u64 > max {
        return Err(err(format!(
            "larger than {} MiB; raygate reads at most that much",
            max >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|e| err(format!("not UTF-8 text: {e}")))
}

/// Every YAML/JSON document of a file (multi-document YAML accepted),
/// null documents dropped; each must be an object.
fn read_docs(path: &Path) -> Result<Vec<Value>> {
    let text = read_bounded(path, MAX_INPUT_BYTES)?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| Error::Input {
        path: shown(path),
        reason: format!("not valid YAML: {e}"),
    })?;
    let mut out = vec![];
    for (i, doc) in docs.into_iter().enumerate() {
        match doc {
            Value::Null => {}
            Value::Object(_) => out.push(doc),
            other => {
                return Err(Error::Input {
                    path: shown(path),
                    reason: format!(
                        "document {}: expected a Kubernetes object, found {}",
                        i + 1,
                        type_name(&other)
                    ),
                });
            }
        }
    }
    if out.is_empty() {
        return Err(Error::Input {
            path: shown(path),
            reason: "no objects found".into(),
        });
    }
    Ok(out)
}

/// Read every object in a YAML or JSON file; `List` objects are flattened
/// and multi-document YAML is accepted.
pub fn read_objects(path: &Path) -> Result<Vec<Value>> {
    let mut out = vec![];
    for doc in read_docs(path)? {
        if kind_of(&doc).ends_with("List") {
            match doc.get("items") {
                Some(Value::Array(items)) => {
                    for (i, item) in items.iter().enumerate() {
                        if !item.is_object() {
                            return Err(Error::Input {
                                path: shown(path),
                                reason: format!(
                                    "items[{i}]: expected a Kubernetes object, found {}",
                                    type_name(item)
                                ),
                            });
                        }
                        out.push(item.clone());
                    }
                }
                None | Some(Value::Null) => {}
                Some(other) => {
                    return Err(Error::Input {
                        path: shown(path),
                        reason: format!("items: expected a list, found {}", type_name(other)),
                    });
                }
            }
        } else {
            out.push(doc);
        }
    }
    Ok(out)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

pub(super) fn kind_of(v: &Value) -> &str {
    v.get("kind").and_then(Value::as_str).unwrap_or("")
}

/// Exactly one object of `kind` from a file.
pub(super) fn read_one(path: &Path, kinds: &[&str]) -> Result<Value> {
    let objs = read_objects(path)?;
    let found: Vec<String> = objs
        .iter()
        .map(|o| match kind_of(o) {
            "" => "an object without kind".to_string(),
            k => k.to_string(),
        })
        .collect();
    let mut matching: Vec<Value> = objs
        .into_iter()
        .filter(|o| kinds.contains(&kind_of(o)))
        .collect();
    match matching.len() {
        1 => Ok(matching.remove(0)),
        0 => {
            let mut found = found;
            found.dedup();
            Err(Error::Input {
                path: shown(path),
                reason: format!(
                    "no {} object found (found {})",
                    kinds.join(" or "),
                    found.join(", ")
                ),
            })
        }
        n => Err(Error::Input {
            path: shown(path),
            reason: format!("{n} {} objects found, expected one", kinds.join("/")),
        }),
    }
}

/// One step of a path into a JSON value.
#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

/// `at` as a JSON pointer (`/spec/workerGroupSpecs/0`), for `Value::pointer`.
fn pointer(at: &[Seg]) -> String {
    at.iter()
        .map(|s| match s {
            Seg::Key(k) => format!("/{}", k.replace('~', "~0").replace('/', "~1")),
            Seg::Index(i) => format!("/{i}"),
        })
        .collect()
}

fn show_path(at: &[Seg]) -> String {
    let mut s = String::new();
    for seg in at {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// The field a typed parse fails on, found without positions (serde's
/// buffering of flattened structs loses them): descend into the child whose
/// emptying (`{}`, `[]`, a scalar made `{}`) or removal makes the parse succeed, as far as that holds.
fn locate_parse_error<T: serde::de::DeserializeOwned>(v: &Value) -> Option<String> {
    const BUDGET: usize = 2_000;
    let mut tries = 0;
    let mut at: Vec<Seg> = Vec::new();
    'descend: loop {
        let children: Vec<Seg> = match v.pointer(&pointer(&at))? {
            Value::Object(m) => m.keys().cloned().map(Seg::Key).collect(),
            Value::Array(a) => (0..a.len()).map(Seg::Index).collect(),
            _ => break,
        };
        for c in children {
            for empty in [true, false] {
                tries += 1;
                if tries > BUDGET {
                    break 'descend;
                }
                let mut trial = v.clone();
                let parent = trial.pointer_mut(&pointer(&at))?;
                if empty {
                    match parent.pointer_mut(&pointer(std::slice::from_ref(&c))) {
                        Some(x @ Value::Object(_)) => *x = Value::Object(Default::default()),
                        Some(x @ Value::Array(_)) => *x = Value::Array(Vec::new()),
                        // A scalar where an object belongs (`metadata: 5`).
                        Some(x) => *x = Value::Object(Default::default()),
                        None => continue,
                    }
                } else {
                    match (&mut *parent, &c) {
                        (Value::Object(m), Seg::Key(k)) => {
                            m.remove(k);
                        }
                        (Value::Array(a), Seg::Index(i)) if *i < a.len() => {
                            a.remove(*i);
                        }
                        _ => continue,
                    }
                }
                if serde_json::from_value::<T>(trial).is_ok() {
                    at.push(c);
                    continue 'descend;
                }
            }
        }
        break;
    }
    (!at.is_empty()).then(|| show_path(&at))
}

pub(super) fn parse_as<T: serde::de::DeserializeOwned>(path: &Path, v: Value) -> Result<T> {
    match serde_json::from_value::<T>(v.clone()) {
        Ok(t) => Ok(t),
        Err(e) => {
            let at = locate_parse_error::<T>(&v)
                .map(|p| format!("{p}: "))
                .unwrap_or_default();
            Err(Error::Input {
                path: shown(path),
                reason: format!("{at}{e}"),
            })
        }
    }
}

/// Parses a RayService manifest and checks it on its own (worker groups,
/// every quantity, the pods it plans), so later errors cannot be its.
pub(crate) fn read_service(path: &Path, version: KubeRayVersion) -> Result<RayService> {
    let svc: RayService = parse_as(path, read_one(path, &["RayService"])?)?;
    in_file(
        path,
        kuberay::classify(&OldSide::RayService(&svc), &svc, version),
    )?;
    in_file(path, plan(&svc, version).and_then(|p| sum_requests(&p)))?;
    Ok(svc)
}

pub(super) fn read_state(path: &Path) -> Result<ClusterState> {
    // Streamed: a typed list (`NodeList`) gives its items their kind, and
    // pods go straight into records (a dump of 150,000 pods is GiBs).
    let err = |reason: String| Error::Input {
        path: shown(path),
        reason,
    };
    let open = || std::fs::File::open(path).map_err(|e| err(e.to_string()));
    let max = capacity::state::MAX_STATE_BYTES;
    let state = match ClusterState::read(open()?, max) {
        // JSON documents joined by `---` (a multi-document YAML file).
        Err(e) if e.to_string().contains("trailing characters") && path.is_file() => {
            ClusterState::read_as(open()?, max, Some(true))
        }
        other => other,
    }
    .map_err(|e| err(e.to_string()))?;
    if state.nodes.is_empty() {
        return Err(Error::Input {
            path: shown(path),
            reason: format!(
                "no Node objects found ({} pods, {} other objects): expected what `kubectl get nodes,pods,limitranges,runtimeclasses -A -o yaml` prints (with Dynamic Resource Allocation add resourceslices,deviceclasses,resourceclaims,resourceclaimtemplates)",
                state.pods.len(),
                state.warnings.len()
            ),
        });
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use serde_json::json;

    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn kinds(path: &Path) -> Vec<String> {
        read_objects(path)
            .unwrap()
            .iter()
            .map(|o| kind_of(o).to_string())
            .collect()
    }

    #[test]
    fn lists_are_flattened_and_null_documents_dropped() {
        let f = file("kind: List\nitems:\n- kind: A\n- kind: B\n---\n---\nkind: C\n");
        assert_eq!(kinds(f.path()), ["A", "B", "C"]);
        let f = file(r#"{"kind": "NodeList", "items": null}"#);
        assert!(kinds(f.path()).is_empty());
    }

    #[test]
    fn what_is_not_an_object_is_refused_with_its_place() {
        let e = read_objects(file("kind: A\n---\n5\n").path()).unwrap_err();
        assert!(
            e.to_string()
                .ends_with(": document 2: expected a Kubernetes object, found a number"),
            "{e}"
        );
        let e = read_objects(file("kind: List\nitems: [x]\n").path()).unwrap_err();
        assert!(
            e.to_string()
                .ends_with(": items[0]: expected a Kubernetes object, found a string"),
            "{e}"
        );
        let e = read_objects(file("---\n").path()).unwrap_err();
        assert!(e.to_string().ends_with(": no objects found"), "{e}");
    }

    #[test]
    fn a_file_over_the_bound_is_refused() {
        let f = file("kind: A\n");
        assert_eq!(read_bounded(f.path(), 8).unwrap(), "kind: A\n");
        let e = read_bounded(f.path(), 7).unwrap_err().to_string();
        assert!(e.contains("raygate reads at most that much"), "{e}");
        let f = file("\u{fffd}");
        let mut bytes = std::fs::read(f.path()).unwrap();
        bytes[0] = 0xff;
        std::fs::write(f.path(), bytes).unwrap();
        let e = read_bounded(f.path(), 8).unwrap_err().to_string();
        assert!(e.contains("not UTF-8 text"), "{e}");
    }

    #[test]
    fn exactly_one_object_of_the_kind() {
        let e = read_one(file("kind: RayCluster\n").path(), &["RayService"]).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("no RayService object found (found RayCluster)"),
            "{e}"
        );
        let two = file("kind: RayService\n---\nkind: RayService\n");
        let e = read_one(two.path(), &["RayService"]).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("2 RayService objects found, expected one"),
            "{e}"
        );
    }

    #[test]
    fn a_parse_error_names_the_field() {
        let v = json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "llm"},
            "spec": {"rayClusterConfig": {"workerGroupSpecs": [
                {"groupName": "a", "replicas": 1},
                {"groupName": "b", "replicas": "three"},
            ]}},
        });
        assert_eq!(
            locate_parse_error::<RayService>(&v).as_deref(),
            Some("spec.rayClusterConfig.workerGroupSpecs[1].replicas")
        );
        let e = parse_as::<RayService>(Path::new("new.yaml"), v).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("new.yaml: spec.rayClusterConfig.workerGroupSpecs[1].replicas: "),
            "{e}"
        );
        // A scalar where an object belongs.
        let v = json!({"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": 5, "spec": {}});
        assert_eq!(
            locate_parse_error::<RayService>(&v).as_deref(),
            Some("metadata")
        );
    }

    #[test]
    fn keys_with_slashes_are_followed() {
        let v = json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "llm", "labels": {"a/b~c": {"x": 1}}},
            "spec": {},
        });
        assert_eq!(
            locate_parse_error::<RayService>(&v).as_deref(),
            Some("metadata.labels.a/b~c")
        );
    }

    #[test]
    fn errors_about_content_get_the_file_name() {
        let e = in_file::<()>(Path::new("s.yaml"), Err(Error::invalid("spec", "bad")));
        assert_eq!(e.unwrap_err().to_string(), "s.yaml: spec: bad");
        let kept = Error::Input {
            path: "other.yaml".into(),
            reason: "r".into(),
        };
        let e = in_file::<()>(Path::new("s.yaml"), Err(kept));
        assert_eq!(e.unwrap_err().to_string(), "other.yaml: r");
    }
}
