//! Structural diff of two JSON values with readable paths.
//!
//! Lists of objects are keyed by their natural name when every element on both sides
//! has one and it is unique: `groupName` (worker groups), then `name` (containers, env,
//! volumes, ports, Serve applications/deployments), then `mountPath` (volume mounts).
//! Otherwise elements are compared by index (`[3]`). Map entries (labels, resource lists,
//! rayStartParams, …) and keys containing `.` or `/` are shown in brackets:
//! `headGroupSpec.template.spec.containers[ray-head].resources.limits[nvidia.com/gpu]`.
//! An added or removed element is one change at the element
//! (`workerGroupSpecs[new-group]`). Go's JSON is order-sensitive for lists, so a keyed
//! list whose common elements changed order is reported once as a [`ChangeKind::Reordered`]
//! change at the list.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use super::normalize::is_map_at;

/// What changed at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ChangeKind {
    Added,
    Removed,
    Changed,
    Reordered,
}

/// One segment of a readable path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    /// A struct field: `.name`.
    Field(String),
    /// A map entry or a list element keyed by name: `[name]`.
    Key(String),
    /// A list element without a natural key: `[3]`.
    Index(usize),
}

/// A readable path, e.g. `workerGroupSpecs[gpu].template.spec.containers[ray-worker].image`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Path(pub Vec<Seg>);

impl Path {
    pub fn child(&self, seg: Seg) -> Path {
        let mut p = self.0.clone();
        p.push(seg);
        Path(p)
    }

    /// A path rooted at a readable prefix such as `serveConfigV2`.
    pub fn root(name: &str) -> Path {
        Path(vec![Seg::Field(name.to_string())])
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Field(k) if k.contains(['.', '/', '[', ']']) => write!(f, "[{k}]")?,
                Seg::Field(k) if i == 0 => write!(f, "{k}")?,
                Seg::Field(k) => write!(f, ".{k}")?,
                Seg::Key(k) => write!(f, "[{k}]")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// One difference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub path: Path,
    pub kind: ChangeKind,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ChangeKind::Reordered => write!(f, "{} (order)", self.path),
            _ => write!(f, "{}", self.path),
        }
    }
}

/// Differences from `old` to `new` (both optional: absent vs present is Added/Removed).
pub fn diff(old: &Value, new: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    diff_at(Some(old), Some(new), &Path::default(), &mut out);
    out
}

/// Like [`diff`], with every path below `root`.
pub fn diff_under(root: &Path, old: Option<&Value>, new: Option<&Value>) -> Vec<Change> {
    let mut out = Vec::new();
    diff_at(old, new, root, &mut out);
    out
}

/// Readable strings of changes (`path` or `path (order)`).
pub fn paths(changes: &[Change]) -> Vec<String> {
    changes.iter().map(ToString::to_string).collect()
}

fn path_is_map(path: &Path) -> bool {
    let keys: Vec<Option<&str>> = path
        .0
        .iter()
        .map(|s| match s {
            Seg::Field(k) => Some(k.as_str()),
            Seg::Key(_) | Seg::Index(_) => None,
        })
        .collect();
    is_map_at(&keys)
}

fn push(out: &mut Vec<Change>, path: &Path, kind: ChangeKind) {
    out.push(Change {
        path: path.clone(),
        kind,
    });
}

fn diff_at(old: Option<&Value>, new: Option<&Value>, path: &Path, out: &mut Vec<Change>) {
    match (old, new) {
        (None, None) => {}
        (Some(_), None) => push(out, path, ChangeKind::Removed),
        (None, Some(_)) => push(out, path, ChangeKind::Added),
        (Some(a), Some(b)) if a == b => {}
        (Some(Value::Object(a)), Some(Value::Object(b))) => {
            let is_map = path_is_map(path);
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let seg = if is_map {
                    Seg::Key(k.clone())
                } else {
                    Seg::Field(k.clone())
                };
                diff_at(a.get(k), b.get(k), &path.child(seg), out);
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) => diff_lists(a, b, path, out),
        (Some(_), Some(_)) => push(out, path, ChangeKind::Changed),
    }
}

/// The natural key field shared by every element of both lists, if any.
fn list_key(a: &[Value], b: &[Value]) -> Option<&'static str> {
    ["groupName", "name", "mountPath"]
        .into_iter()
        .find(|field| {
            [a, b].iter().all(|list| {
                let mut seen = std::collections::BTreeSet::new();
                list.iter().all(|e| {
                    e.get(*field)
                        .and_then(Value::as_str)
                        .is_some_and(|k| seen.insert(k.to_string()))
                })
            }) && !(a.is_empty() && b.is_empty())
        })
}

fn diff_lists(a: &[Value], b: &[Value], path: &Path, out: &mut Vec<Change>) {
    let Some(field) = list_key(a, b) else {
        for i in 0..a.len().max(b.len()) {
            diff_at(a.get(i), b.get(i), &path.child(Seg::Index(i)), out);
        }
        return;
    };
    let key = |e: &Value| {
        e.get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let old: BTreeMap<String, &Value> = a.iter().map(|e| (key(e), e)).collect();
    let new: BTreeMap<String, &Value> = b.iter().map(|e| (key(e), e)).collect();
    let common_old: Vec<String> = a.iter().map(key).filter(|k| new.contains_key(k)).collect();
    let common_new: Vec<String> = b.iter().map(key).filter(|k| old.contains_key(k)).collect();
    if common_old != common_new {
        push(out, path, ChangeKind::Reordered);
    }
    // Old order first, then new-only elements in new order.
    let mut order: Vec<String> = a.iter().map(key).collect();
    order.extend(b.iter().map(key).filter(|k| !old.contains_key(k)));
    for k in order {
        diff_at(
            old.get(&k).copied(),
            new.get(&k).copied(),
            &path.child(Seg::Key(k.clone())),
            out,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strs(old: Value, new: Value) -> Vec<String> {
        paths(&diff(&old, &new))
    }

    #[test]
    fn keyed_paths() {
        let old = json!({
            "headGroupSpec": {"template": {"spec": {"containers": [
                {"name": "ray-head", "image": "ray:2.40", "resources": {"limits": {"nvidia.com/gpu": "0", "cpu": "4"}},
                 "env": [{"name": "A", "value": "1"}], "ports": [{"name": "gcs", "containerPort": 6379}]}]}}},
            "workerGroupSpecs": [
                {"groupName": "gpu-workers", "template": {"spec": {"containers": [{"name": "ray-worker", "image": "ray:2.40"}],
                  "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}], "tolerations": [{"key": "a"}, {"key": "b"}]}}}
            ]
        });
        let mut new = old.clone();
        new["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] =
            json!("1");
        new["headGroupSpec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = json!("2");
        new["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] =
            json!(6380);
        new["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] =
            json!("ray:2.41");
        new["workerGroupSpecs"][0]["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] =
            json!("1Gi");
        new["workerGroupSpecs"][0]["template"]["spec"]["tolerations"][1]["key"] = json!("c");
        new["workerGroupSpecs"]
            .as_array_mut()
            .unwrap()
            .push(json!({"groupName": "new-group", "template": {}}));
        assert_eq!(
            strs(old, new),
            vec![
                "headGroupSpec.template.spec.containers[ray-head].env[A].value",
                "headGroupSpec.template.spec.containers[ray-head].ports[gcs].containerPort",
                "headGroupSpec.template.spec.containers[ray-head].resources.limits[nvidia.com/gpu]",
                "workerGroupSpecs[gpu-workers].template.spec.containers[ray-worker].image",
                "workerGroupSpecs[gpu-workers].template.spec.tolerations[1].key",
                "workerGroupSpecs[gpu-workers].template.spec.volumes[shm].emptyDir.sizeLimit",
                "workerGroupSpecs[new-group]",
            ]
        );
    }

    #[test]
    fn map_entries_bracketed_and_removed_groups() {
        let old = json!({"headGroupSpec": {"rayStartParams": {"num-cpus": "0"}, "template": {"metadata": {"labels": {"team": "a"}}}},
                         "workerGroupSpecs": [{"groupName": "a"}, {"groupName": "b"}]});
        let new = json!({"headGroupSpec": {"rayStartParams": {"num-cpus": "1"}, "template": {"metadata": {"labels": {"team": "b"}}}},
                         "workerGroupSpecs": [{"groupName": "a"}]});
        assert_eq!(
            strs(old, new),
            vec![
                "headGroupSpec.rayStartParams[num-cpus]",
                "headGroupSpec.template.metadata.labels[team]",
                "workerGroupSpecs[b]",
            ]
        );
    }

    #[test]
    fn reorder_and_index_fallback() {
        let old = json!({"workerGroupSpecs": [{"groupName": "a"}, {"groupName": "b"}], "args": ["x", "y"]});
        let new = json!({"workerGroupSpecs": [{"groupName": "b"}, {"groupName": "a"}], "args": ["x", "z", "w"]});
        let changes = diff(&old, &new);
        assert_eq!(
            paths(&changes),
            vec!["args[1]", "args[2]", "workerGroupSpecs (order)"]
        );
        assert_eq!(changes[1].kind, ChangeKind::Added);
        assert_eq!(changes[2].kind, ChangeKind::Reordered);
        // duplicate names: index form
        let old = json!({"l": [{"name": "a", "v": 1}, {"name": "a", "v": 2}]});
        let new = json!({"l": [{"name": "a", "v": 1}, {"name": "a", "v": 3}]});
        assert_eq!(strs(old, new), vec!["l[1].v"]);
    }
}
