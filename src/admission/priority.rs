//! Priority ceilings: `spec.priority` is the tenant's wish, capped per
//! namespace by the operator (`--max-priority`), so a tenant cannot jump a
//! cluster-wide queue by writing `priority: 1000`.

use std::collections::BTreeMap;

use crate::upgradeplan::UpgradePlan;

/// The operator's ceilings: one for every namespace, and per-namespace overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ceilings {
    pub default: Option<i32>,
    pub namespaces: BTreeMap<String, i32>,
}

impl Ceilings {
    /// From `--max-priority` items: `N` (every namespace) or `NS=N`.
    pub fn parse(items: &[String]) -> crate::Result<Ceilings> {
        let mut c = Ceilings::default();
        for item in items.iter().map(|i| i.trim()).filter(|i| !i.is_empty()) {
            let bad =
                |why: &str| crate::Error::invalid("--max-priority", format!("{item:?}: {why}"));
            let (ns, n) = match item.split_once('=') {
                Some((ns, n)) => (Some(ns.trim()), n.trim()),
                None => (None, item),
            };
            let n: i32 = n
                .parse()
                .map_err(|_| bad("expected N or NAMESPACE=N with N an integer"))?;
            if !(-1000..=1000).contains(&n) {
                return Err(bad("must be between -1000 and 1000"));
            }
            match ns {
                Some("") => return Err(bad("empty namespace")),
                Some(ns) => {
                    c.namespaces.insert(ns.to_string(), n);
                }
                None => c.default = Some(n),
            }
        }
        Ok(c)
    }

    /// The priority a plan in `namespace` asking for `wanted` gets.
    pub fn effective(&self, namespace: &str, wanted: i32) -> i32 {
        match self.namespaces.get(namespace).copied().or(self.default) {
            Some(max) => wanted.min(max),
            None => wanted,
        }
    }

    /// A plan's priority after its namespace's ceiling.
    pub fn of(&self, plan: &UpgradePlan) -> i32 {
        let ns = plan.metadata.namespace.as_deref().unwrap_or_default();
        self.effective(ns, plan.spec.priority)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn tenants_are_capped_and_the_platform_namespace_is_not() {
        let c = Ceilings::parse(&items(&["0", "platform=1000", " batch = -10 "])).unwrap();
        assert_eq!(c.effective("tenant-a", 1000), 0);
        assert_eq!(c.effective("tenant-a", -5), -5);
        assert_eq!(c.effective("platform", 1000), 1000);
        assert_eq!(c.effective("batch", 0), -10);
        let none = Ceilings::parse(&[]).unwrap();
        assert_eq!(none.effective("x", 1000), 1000);
    }

    #[test]
    fn bad_ceilings_are_refused_with_the_flag_name() {
        for bad in ["high", "ns=", "=5", "2000", "ns=1.5"] {
            let e = Ceilings::parse(&items(&[bad])).unwrap_err().to_string();
            assert!(e.starts_with("--max-priority: "), "{bad}: {e}");
        }
    }
}
