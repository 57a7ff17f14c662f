//! A plan's identity: the one key every map, queue and metric series of
//! plans uses (namespace first, so plans order by namespace, then name).

use std::fmt;

use kube::runtime::reflector::ObjectRef;

use super::UpgradePlan;

/// `(namespace, name)` of an UpgradePlan, shown `namespace/name`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PlanKey {
    pub namespace: String,
    pub name: String,
}

impl PlanKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> PlanKey {
        PlanKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for PlanKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl UpgradePlan {
    /// This plan's key (an object without a namespace or name, as a bad
    /// fixture may be, keys as empty strings: never a panic).
    pub fn key(&self) -> PlanKey {
        PlanKey::new(
            self.metadata.namespace.clone().unwrap_or_default(),
            self.metadata.name.clone().unwrap_or_default(),
        )
    }
}

/// The key of the plan a watch event or a requeue names.
impl From<&ObjectRef<UpgradePlan>> for PlanKey {
    fn from(r: &ObjectRef<UpgradePlan>) -> PlanKey {
        PlanKey::new(r.namespace.clone().unwrap_or_default(), r.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upgradeplan::UpgradePlanSpec;

    fn plan(ns: &str, name: &str) -> UpgradePlan {
        let spec: UpgradePlanSpec =
            serde_json::from_value(serde_json::json!({"rayServiceRef": {"name": "llm"}})).unwrap();
        let mut p = UpgradePlan::new(name, spec);
        p.metadata.namespace = Some(ns.into());
        p
    }

    #[test]
    fn a_plan_key_shows_as_namespace_slash_name() {
        assert_eq!(PlanKey::new("ml", "chat").to_string(), "ml/chat");
    }

    #[test]
    fn a_plan_and_a_reference_to_it_have_the_same_key() {
        let p = plan("ml", "chat");
        assert_eq!(p.key(), PlanKey::new("ml", "chat"));
        assert_eq!(PlanKey::from(&ObjectRef::from_obj(&p)), p.key());
    }

    /// The order is the tuple order it replaced: namespace, then name.
    #[test]
    fn plan_keys_order_by_namespace_then_name() {
        let mut keys = [
            PlanKey::new("b", "a"),
            PlanKey::new("a", "z"),
            PlanKey::new("a", "b"),
        ];
        keys.sort();
        let shown: Vec<String> = keys.iter().map(PlanKey::to_string).collect();
        assert_eq!(shown, ["a/b", "a/z", "b/a"]);
    }
}
