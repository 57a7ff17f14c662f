//! The cluster snapshot the fit runs on.

use k8s_openapi::api::core::v1::{LimitRange, Node, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use serde_json::Value;

/// Nodes, pods, LimitRanges and RuntimeClasses, as listed by
/// `kubectl get nodes,pods,limitranges,runtimeclasses -A -o yaml` (as JSON).
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    pub nodes: Vec<Node>,
    /// Shared, so the controller can hand its cached pods over without copying them.
    pub pods: Vec<std::sync::Arc<Pod>>,
    pub limit_ranges: Vec<LimitRange>,
    /// For the overhead RuntimeClass admission gives pods not created yet.
    pub runtime_classes: Vec<RuntimeClass>,
    /// What was ignored while reading, for the user to see.
    pub warnings: Vec<String>,
}

fn describe(item: &Value) -> String {
    let meta = item.get("metadata");
    let get = |k| meta.and_then(|m| m.get(k)).and_then(Value::as_str);
    match (get("namespace"), get("name")) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.to_string(),
        _ => "<unnamed>".to_string(),
    }
}

fn decode<T: serde::de::DeserializeOwned>(path: &str, item: Value) -> crate::Result<T> {
    let what = format!("{path} ({})", describe(&item));
    serde_json::from_value(item).map_err(|e| crate::Error::invalid(what, e.to_string()))
}

impl ClusterState {
    /// Reads a `v1 List` with mixed `items` (each with its `kind`), a typed
    /// list such as `PodList` (items may lack `kind`), or a single object.
    /// Other kinds are skipped with a warning; malformed items are errors,
    /// because silently losing a node or pod would misstate capacity.
    pub fn from_list(value: Value) -> crate::Result<ClusterState> {
        let mut state = ClusterState::default();
        state.add(value, "input", None)?;
        Ok(state)
    }

    fn add(
        &mut self,
        mut value: Value,
        path: &str,
        default_kind: Option<&str>,
    ) -> crate::Result<()> {
        if !value.is_object() {
            return Err(crate::Error::invalid(
                path,
                "expected a Kubernetes object or List",
            ));
        }
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| default_kind.map(str::to_string));
        let Some(kind) = kind else {
            return Err(crate::Error::invalid(
                format!("{path} ({})", describe(&value)),
                "object has no kind",
            ));
        };
        if let Some(items) = value.get_mut("items").filter(|_| kind.ends_with("List")) {
            let items = match items.take() {
                Value::Array(a) => a,
                Value::Null => Vec::new(),
                _ => return Err(crate::Error::invalid(path, "items is not an array")),
            };
            let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
            for (i, item) in items.into_iter().enumerate() {
                self.add(item, &format!("{path}.items[{i}]"), item_kind)?;
            }
            return Ok(());
        }
        match kind.as_str() {
            "Node" => self.nodes.push(decode(path, value)?),
            "Pod" => self.pods.push(std::sync::Arc::new(decode(path, value)?)),
            "LimitRange" => self.limit_ranges.push(decode(path, value)?),
            "RuntimeClass" => self.runtime_classes.push(decode(path, value)?),
            other => self.warnings.push(format!(
                "ignored {path}: kind {other} ({})",
                describe(&value)
            )),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_mixed_list_and_warns_on_other_kinds() {
        let v = json!({
            "apiVersion": "v1", "kind": "List",
            "items": [
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}},
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1", "namespace": "ray"},
                 "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": 2}}}]}},
                {"apiVersion": "v1", "kind": "LimitRange",
                 "metadata": {"name": "lr", "namespace": "ray"}, "spec": {"limits": []}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "ray"}},
                {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata"},
                 "handler": "kata", "overhead": {"podFixed": {"cpu": "250m"}}}
            ]
        });
        let s = ClusterState::from_list(v).unwrap();
        assert_eq!(s.nodes.len(), 1);
        assert_eq!(s.pods.len(), 1);
        assert_eq!(s.limit_ranges.len(), 1);
        assert_eq!(s.runtime_classes.len(), 1);
        assert_eq!(s.warnings, ["ignored input.items[3]: kind Service (ray/s)"]);
    }

    #[test]
    fn reads_typed_lists_and_single_objects() {
        let v = json!({"kind": "PodList", "items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]});
        assert_eq!(ClusterState::from_list(v).unwrap().pods.len(), 2);
        let v = json!({"kind": "Node", "metadata": {"name": "n"}});
        assert_eq!(ClusterState::from_list(v).unwrap().nodes.len(), 1);
        let v = json!({"kind": "List", "items": null});
        assert!(ClusterState::from_list(v).unwrap().nodes.is_empty());
    }

    #[test]
    fn rejects_malformed_input() {
        let err = ClusterState::from_list(json!([1, 2]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a Kubernetes object"), "{err}");
        let v = json!({"kind": "List", "items": [{"metadata": {"name": "x"}}]});
        let err = ClusterState::from_list(v).unwrap_err().to_string();
        assert_eq!(err, "input.items[0] (x): object has no kind");
        let v = json!({"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "n"},
            "spec": {"unschedulable": "yes"}}]});
        let err = ClusterState::from_list(v).unwrap_err().to_string();
        assert!(err.starts_with("input.items[0] (n): "), "{err}");
    }
}
