//! kube-scheduler's node filters other than resources, as pure functions:
//! NodeName, TaintToleration, NodeAffinity (nodeSelector + required node
//! affinity), run in the scheduler's plugin order, first failure reported.
//!
//! Messages follow the scheduler's wording, which changed over releases;
//! [`Wording`] picks the release family (default: current releases, 1.33-1.36, as the e2e
//! cluster's v1.36 scheduler says them).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration,
};

/// A node's name (empty when it has none, which the apiserver never serves).
pub fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

/// NodeUnschedulable plugin (same wording in every release).
pub const REASON_UNSCHEDULABLE: &str = "node(s) were unschedulable";
/// NodeResourcesFit, pod slots.
pub const REASON_TOO_MANY_PODS: &str = "Too many pods";

/// Which kube-scheduler release family's messages to produce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Wording {
    /// v1.20 and older (checked against its source): `node(s) had taint {k: v}, that
    /// the pod didn't tolerate`, `node(s) didn't match Pod's node affinity`,
    /// `node(s) didn't match the requested hostname`.
    V1_20,
    /// Current releases (1.33-1.36): `node(s) had untolerated taint {k: v}`,
    /// `node(s) didn't match Pod's node affinity/selector`,
    /// `node(s) didn't match the requested node name`.
    #[default]
    Current,
}

impl Wording {
    /// NodeAffinity plugin's reason, for nodeSelector and required affinity.
    pub fn node_affinity(self) -> &'static str {
        match self {
            Wording::V1_20 => "node(s) didn't match Pod's node affinity",
            Wording::Current => "node(s) didn't match Pod's node affinity/selector",
        }
    }

    /// NodeName plugin's reason.
    pub fn node_name(self) -> &'static str {
        match self {
            Wording::V1_20 => "node(s) didn't match the requested hostname",
            Wording::Current => "node(s) didn't match the requested node name",
        }
    }

    /// TaintToleration's reason for the first untolerated taint.
    pub fn taint(self, taint: &Taint) -> String {
        let (k, v) = (&taint.key, taint.value.as_deref().unwrap_or(""));
        match self {
            Wording::V1_20 => {
                format!("node(s) had taint {{{k}: {v}}}, that the pod didn't tolerate")
            }
            Wording::Current => format!("node(s) had untolerated taint {{{k}: {v}}}"),
        }
    }
}

/// NodeResourcesFit's reason for one resource.
pub fn insufficient(resource: &str) -> String {
    format!("Insufficient {resource}")
}

/// `Toleration.ToleratesTaint`: empty effect matches every effect, empty key
/// (with Exists) every key; operator `Equal` (or empty) compares values.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(e) = t.effect.as_deref().filter(|e| !e.is_empty())
        && e != taint.effect
    {
        return false;
    }
    if let Some(k) = t.key.as_deref().filter(|k| !k.is_empty())
        && k != taint.key
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or("") {
        "" | "Equal" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        "Exists" => true,
        _ => false,
    }
}

/// The first NoSchedule/NoExecute taint no toleration covers
/// (`FindMatchingUntoleratedTaint`); PreferNoSchedule only affects scoring.
pub fn untolerated_taint<'a>(tolerations: &[Toleration], taints: &'a [Taint]) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

/// `spec.nodeSelector`: every pair must equal a node label.
pub fn node_selector_matches(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// One `matchExpressions` entry, with labels.Requirement's validation: an
/// invalid requirement (In without values, Gt with a non-integer, an unknown
/// operator) makes its term match nothing, as in the scheduler.
pub fn requirement_matches(
    req: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let values = req.values.as_deref().unwrap_or(&[]);
    let label = labels.get(&req.key);
    match req.operator.as_str() {
        "In" => !values.is_empty() && label.is_some_and(|l| values.contains(l)),
        "NotIn" => !values.is_empty() && label.is_none_or(|l| !values.contains(l)),
        "Exists" => values.is_empty() && label.is_some(),
        "DoesNotExist" => values.is_empty() && label.is_none(),
        op @ ("Gt" | "Lt") => {
            let [bound] = values else { return false };
            let (Some(Ok(have)), Ok(want)) =
                (label.map(|l| l.parse::<i64>()), bound.parse::<i64>())
            else {
                return false;
            };
            if op == "Gt" { have > want } else { have < want }
        }
        _ => false,
    }
}

/// One `matchFields` entry: only `metadata.name` exists; In/NotIn with
/// exactly one value, as the scheduler's field selector requires.
fn field_matches(req: &NodeSelectorRequirement, node_name: &str) -> bool {
    let values = req.values.as_deref().unwrap_or(&[]);
    let [value] = values else { return false };
    let field = if req.key == "metadata.name" {
        node_name
    } else {
        ""
    };
    match req.operator.as_str() {
        "In" => field == value,
        "NotIn" => field != value,
        _ => false,
    }
}

/// A term ANDs its expressions and fields; an empty term selects nothing.
pub fn term_matches(
    term: &NodeSelectorTerm,
    labels: &BTreeMap<String, String>,
    node_name: &str,
) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs.iter().all(|r| requirement_matches(r, labels))
        && fields.iter().all(|r| field_matches(r, node_name))
}

fn node_labels(node: &Node) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    node.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

/// The NodeAffinity filter: nodeSelector AND (any required term).
pub fn node_affinity_matches(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = &pod.spec else { return true };
    let labels = node_labels(node);
    let name = node.metadata.name.as_deref().unwrap_or("");
    if let Some(sel) = &spec.node_selector
        && !node_selector_matches(sel, labels)
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        Some(sel) => sel
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, labels, name)),
        None => true,
    }
}

/// Every filter but resources, in the scheduler's order; `Err` carries the
/// scheduler's reason. Unschedulable nodes never get here (see `node`).
pub fn static_filter(pod: &Pod, node: &Node, wording: Wording) -> Result<(), String> {
    let spec = pod.spec.as_ref();
    let node_name = node.metadata.name.as_deref().unwrap_or("");
    if let Some(want) = spec
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
        && want != node_name
    {
        return Err(wording.node_name().to_string());
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[]);
    let tolerations = spec.and_then(|s| s.tolerations.as_deref()).unwrap_or(&[]);
    if let Some(t) = untolerated_taint(tolerations, taints) {
        return Err(wording.taint(t));
    }
    if !node_affinity_matches(pod, node) {
        return Err(wording.node_affinity().to_string());
    }
    Ok(())
}

/// `FitError.Error()`: `0/N nodes are available: <count> <reason>, ….`
/// The histogram entries are sorted as strings, like the scheduler's
/// `sort.Strings` (so `10 x` sorts before `2 y`).
pub fn aggregate_message(total_nodes: usize, reasons: &BTreeMap<String, usize>) -> String {
    if total_nodes == 0 {
        return "no nodes available to schedule pods".to_string();
    }
    let mut parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    let mut msg = format!("0/{total_nodes} nodes are available:");
    if !parts.is_empty() {
        msg.push_str(&format!(" {}.", parts.join(", ")));
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }
    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }
    fn tol(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).unwrap()
    }
    fn taint(v: serde_json::Value) -> Taint {
        serde_json::from_value(v).unwrap()
    }
    fn req(v: serde_json::Value) -> NodeSelectorRequirement {
        serde_json::from_value(v).unwrap()
    }
    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn node_selector() {
        let l = labels(&[("pool", "gpu"), ("zone", "a")]);
        assert!(node_selector_matches(&labels(&[]), &l));
        assert!(node_selector_matches(&labels(&[("pool", "gpu")]), &l));
        assert!(!node_selector_matches(&labels(&[("pool", "cpu")]), &l));
        assert!(!node_selector_matches(
            &labels(&[("pool", "gpu"), ("x", "y")]),
            &l
        ));
    }

    #[test]
    fn requirement_operators() {
        let l = labels(&[("pool", "gpu"), ("gpus", "8"), ("empty", "")]);
        let ok = |v| requirement_matches(&req(v), &l);
        assert!(ok(
            json!({"key": "pool", "operator": "In", "values": ["cpu", "gpu"]})
        ));
        assert!(!ok(
            json!({"key": "pool", "operator": "In", "values": ["cpu"]})
        ));
        assert!(!ok(
            json!({"key": "nope", "operator": "In", "values": ["gpu"]})
        ));
        assert!(!ok(json!({"key": "pool", "operator": "In", "values": []})));
        assert!(ok(
            json!({"key": "pool", "operator": "NotIn", "values": ["cpu"]})
        ));
        assert!(ok(
            json!({"key": "nope", "operator": "NotIn", "values": ["cpu"]})
        ));
        assert!(!ok(
            json!({"key": "pool", "operator": "NotIn", "values": ["gpu"]})
        ));
        assert!(ok(json!({"key": "empty", "operator": "Exists"})));
        assert!(!ok(json!({"key": "nope", "operator": "Exists"})));
        assert!(!ok(
            json!({"key": "pool", "operator": "Exists", "values": ["gpu"]})
        ));
        assert!(ok(json!({"key": "nope", "operator": "DoesNotExist"})));
        assert!(!ok(json!({"key": "pool", "operator": "DoesNotExist"})));
        assert!(ok(
            json!({"key": "gpus", "operator": "Gt", "values": ["4"]})
        ));
        assert!(!ok(
            json!({"key": "gpus", "operator": "Gt", "values": ["8"]})
        ));
        assert!(ok(
            json!({"key": "gpus", "operator": "Lt", "values": ["+9"]})
        ));
        assert!(!ok(
            json!({"key": "gpus", "operator": "Lt", "values": ["8"]})
        ));
        assert!(!ok(
            json!({"key": "pool", "operator": "Gt", "values": ["1"]})
        ));
        assert!(!ok(
            json!({"key": "gpus", "operator": "Gt", "values": ["x"]})
        ));
        assert!(!ok(
            json!({"key": "gpus", "operator": "Gt", "values": ["1", "2"]})
        ));
        assert!(!ok(
            json!({"key": "nope", "operator": "Lt", "values": ["1"]})
        ));
        assert!(!ok(
            json!({"key": "pool", "operator": "Like", "values": ["gpu"]})
        ));
    }

    fn affinity_pod(terms: serde_json::Value) -> Pod {
        pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": terms}}}}}))
    }

    #[test]
    fn required_affinity_terms_or_and_fields() {
        let n =
            node(json!({"metadata": {"name": "gpu-1", "labels": {"pool": "gpu", "zone": "a"}}}));
        let yes = |t| node_affinity_matches(&affinity_pod(t), &n);
        // Expressions within a term are ANDed.
        assert!(yes(json!([{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["gpu"]},
            {"key": "zone", "operator": "In", "values": ["a"]}]}])));
        assert!(!yes(json!([{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["gpu"]},
            {"key": "zone", "operator": "In", "values": ["b"]}]}])));
        // Terms are ORed.
        assert!(yes(json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}])));
        // Empty term or no terms select nothing.
        assert!(!yes(json!([{}])));
        assert!(!yes(json!([])));
        // matchFields on metadata.name.
        assert!(yes(json!([{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}])));
        assert!(!yes(json!([{"matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-1"]}]}])));
        assert!(!yes(json!([{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["gpu-1", "gpu-2"]}]}])));
        assert!(!yes(json!([{
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}],
            "matchExpressions": [{"key": "pool", "operator": "DoesNotExist"}]}])));
        // nodeSelector and affinity must both match.
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [],
            "nodeSelector": {"pool": "cpu"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]}}}}}));
        assert!(!node_affinity_matches(&p, &n));
        assert_eq!(
            static_filter(&p, &n, Wording::V1_20),
            Err("node(s) didn't match Pod's node affinity".to_string())
        );
        assert_eq!(
            static_filter(&p, &n, Wording::Current),
            Err("node(s) didn't match Pod's node affinity/selector".to_string())
        );
    }

    #[test]
    fn toleration_rules() {
        let gpu =
            taint(json!({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}));
        let t = |v| tolerates(&tol(v), &gpu);
        assert!(t(
            json!({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"})
        ));
        assert!(t(json!({"key": "nvidia.com/gpu", "value": "present"})));
        assert!(!t(
            json!({"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"})
        ));
        assert!(t(json!({"key": "nvidia.com/gpu", "operator": "Exists"})));
        assert!(!t(json!({"key": "other", "operator": "Exists"})));
        assert!(t(json!({"operator": "Exists"})));
        assert!(!t(
            json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"})
        ));
        assert!(t(
            json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": ""})
        ));
        assert!(!t(
            json!({"key": "nvidia.com/gpu", "operator": "Gt", "value": "present"})
        ));
        let empty = taint(json!({"key": "dedicated", "effect": "NoExecute"}));
        assert!(tolerates(
            &tol(json!({"key": "dedicated", "operator": "Equal"})),
            &empty
        ));
        assert!(tolerates(
            &tol(json!({"key": "dedicated", "value": ""})),
            &empty
        ));
    }

    #[test]
    fn untolerated_taints_by_effect() {
        let taints = vec![
            taint(json!({"key": "soft", "effect": "PreferNoSchedule"})),
            taint(json!({"key": "gpu", "value": "yes", "effect": "NoSchedule"})),
            taint(json!({"key": "drain", "effect": "NoExecute"})),
        ];
        let found = untolerated_taint(&[], &taints).map(|t| t.key.as_str());
        assert_eq!(found, Some("gpu"));
        let tols = [tol(json!({"key": "gpu", "operator": "Exists"}))];
        assert_eq!(
            untolerated_taint(&tols, &taints).map(|t| t.key.as_str()),
            Some("drain")
        );
        let tols = [
            tol(json!({"key": "gpu", "operator": "Exists"})),
            tol(json!({"key": "drain", "operator": "Exists", "effect": "NoExecute"})),
        ];
        assert_eq!(untolerated_taint(&tols, &taints), None);
        assert_eq!(
            untolerated_taint(&[tol(json!({"operator": "Exists"}))], &taints),
            None
        );
        assert_eq!(
            Wording::V1_20.taint(&taints[1]),
            "node(s) had taint {gpu: yes}, that the pod didn't tolerate"
        );
        assert_eq!(
            Wording::Current.taint(&taints[1]),
            "node(s) had untolerated taint {gpu: yes}"
        );
        assert_eq!(
            Wording::Current.taint(&taints[2]),
            "node(s) had untolerated taint {drain: }"
        );
    }

    #[test]
    fn static_filter_order_and_node_name() {
        let n = node(
            json!({"metadata": {"name": "n1", "labels": {"pool": "cpu"}},
            "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}}),
        );
        // Taints are checked before affinity.
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [],
            "nodeSelector": {"pool": "gpu"}}}));
        assert_eq!(
            static_filter(&p, &n, Wording::V1_20),
            Err("node(s) had taint {gpu: }, that the pod didn't tolerate".to_string())
        );
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [],
            "nodeName": "n2", "tolerations": [{"operator": "Exists"}]}}));
        assert_eq!(
            static_filter(&p, &n, Wording::V1_20),
            Err("node(s) didn't match the requested hostname".to_string())
        );
        assert_eq!(
            static_filter(&p, &n, Wording::Current),
            Err("node(s) didn't match the requested node name".to_string())
        );
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [],
            "nodeName": "n1", "tolerations": [{"operator": "Exists"}]}}));
        assert_eq!(static_filter(&p, &n, Wording::V1_20), Ok(()));
    }

    #[test]
    fn aggregated_message_sorted_like_the_scheduler() {
        let reasons = BTreeMap::from([
            ("Insufficient nvidia.com/gpu".to_string(), 2),
            (Wording::Current.node_affinity().to_string(), 1),
        ]);
        assert_eq!(
            aggregate_message(3, &reasons),
            "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
             2 Insufficient nvidia.com/gpu."
        );
        let reasons = BTreeMap::from([("b".to_string(), 10), ("a".to_string(), 2)]);
        assert_eq!(
            aggregate_message(12, &reasons),
            "0/12 nodes are available: 10 b, 2 a."
        );
        assert_eq!(
            aggregate_message(0, &BTreeMap::new()),
            "no nodes available to schedule pods"
        );
    }
}
