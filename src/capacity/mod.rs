//! What fits where, with kube-scheduler's rules.
//!
//! - [`requests`]: a pod's effective request, as the scheduler computes it
//!   after the API server's defaulting and LimitRange admission.
//! - [`state`]: the cluster as `kubectl get nodes,pods,limitranges,runtimeclasses -A -o yaml`.
//! - [`node`]: which nodes are usable and what is free on each.
//! - [`scheduling`]: node selector, required node affinity, taints.
//! - [`fit`](mod@fit): place the new cluster's pods by simulation and explain why not.
//!
//! Accounting unit: [`pod_requests`] is exact, but node and cluster amounts
//! are kept the way kube-scheduler keeps them (`cpu` in whole millicores,
//! every other resource in whole units, each pod rounded up), so that our
//! answer matches the scheduler's even for odd values like `100u` cpu.

pub mod dra;
pub mod fit;
pub(crate) mod ids;
pub mod index;
pub mod node;
pub mod record;
pub mod requests;
pub mod scheduling;
pub mod slim;
pub mod state;
pub mod statics;

use std::collections::BTreeMap;

use crate::quantity::{Format, Quantity};

pub use crate::podgroup::{MAX_PLANNED_PODS, PodGroup};
pub use fit::{FitOptions, FitReport, FitRequest, Unplaced, fit, fit_with};
pub use index::CapacityIndex;
pub use node::{NodeFree, NodeSummary, SkippedNode, node_free};
pub use record::{PartialPod, PodBody, PodKey, PodRecord};
pub use requests::{pod_name, pod_requests};
pub use scheduling::Wording;
pub use state::ClusterState;

/// Resource name → amount, ordered so output is stable.
pub type ResourceList = BTreeMap<String, Quantity>;

/// The pseudo-resource counting pod slots (`allocatable.pods`).
pub const PODS: &str = "pods";
/// The resource the scheduler counts in millicores.
pub const CPU: &str = "cpu";
/// Memory, counted in bytes.
pub const MEMORY: &str = "memory";

/// `acc += other`, per resource (saturating; see [`Quantity::saturating_add`]).
pub fn add_into(acc: &mut ResourceList, other: &ResourceList) {
    for (k, v) in other {
        match acc.get_mut(k) {
            Some(a) => *a = a.saturating_add(v),
            None => {
                acc.insert(k.clone(), v.clone());
            }
        }
    }
}

/// `a + b`, per resource.
pub fn sum(a: &ResourceList, b: &ResourceList) -> ResourceList {
    let mut out = a.clone();
    add_into(&mut out, b);
    out
}

/// `max(0, a - b)` per resource of `a`; resources only in `b` are dropped,
/// because there was nothing of them to take from.
pub fn sub_floor0(a: &ResourceList, b: &ResourceList) -> ResourceList {
    a.iter()
        .map(|(k, v)| {
            let left = match b.get(k) {
                Some(x) => v.saturating_sub_floor0(x),
                None => v.saturating_sub_floor0(&Quantity::zero()),
            };
            (k.clone(), left)
        })
        .collect()
}

/// Canonical strings for output (`{"memory": "1536Mi"}`).
pub fn canonical_map(list: &ResourceList) -> BTreeMap<String, String> {
    list.iter()
        .map(|(k, v)| (k.clone(), v.canonical()))
        .collect()
}

/// Parses a k8s-openapi resource map; `field` prefixes each key in errors.
pub fn parse_resource_list(
    field: &str,
    map: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> crate::Result<ResourceList> {
    parse_resource_list_with(|| field.to_string(), map)
}

/// [`parse_resource_list`] that builds the field path only on error: this
/// runs for every container of every pod in the cluster.
pub(crate) fn parse_resource_list_with(
    field: impl Fn() -> String,
    map: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> crate::Result<ResourceList> {
    map.iter()
        .map(|(k, v)| match Quantity::parse_amount(&v.0) {
            Ok(q) => Ok((k.clone(), q)),
            Err(e) => Err(crate::Error::Quantity {
                field: format!("{}[{k}]", field()),
                value: v.0.clone(),
                reason: e.reason(),
            }),
        })
        .collect()
}

/// The sum of the resources `names` in `m` (the GPUs of [`ACCELERATORS`], or
/// one resource), saturating; `None` when `m` has none of them. The status
/// columns (`gpusNeeded`, ...) and `kubectl raygate queue` add up alike.
pub fn sum_of(m: &ResourceList, names: &[&str]) -> Option<Quantity> {
    let mut total: Option<Quantity> = None;
    for n in names {
        if let Some(q) = m.get(*n) {
            total = Some(match total {
                Some(t) => t.saturating_add(q),
                None => q.clone(),
            });
        }
    }
    total
}

/// A status map (`status.capacity.needed`) as quantities; a value that does
/// not parse is left out (the controller writes canonical quantities).
pub fn parse_status_map(m: &BTreeMap<String, String>) -> ResourceList {
    m.iter()
        .filter_map(|(k, v)| Quantity::parse(v).ok().map(|q| (k.clone(), q)))
        .collect()
}

/// A quantity in the scheduler's integer unit for `resource`: millicores for
/// cpu, whole units (rounded up) for everything else.
pub fn scheduler_units(resource: &str, q: &Quantity) -> i128 {
    if resource == CPU {
        q.milli_value()
    } else {
        q.value()
    }
}

/// The inverse of [`scheduler_units`], printed in a format that reads well
/// (binary for byte-valued resources).
pub fn from_scheduler_units(resource: &str, units: i128) -> Quantity {
    const NANO: i128 = 1_000_000_000;
    if resource == CPU {
        return Quantity::from_nanos(units.saturating_mul(1_000_000), Format::DecimalSI);
    }
    let bytes =
        resource == MEMORY || resource == "ephemeral-storage" || resource.starts_with("hugepages-");
    let format = if bytes {
        Format::BinarySI
    } else {
        Format::DecimalSI
    };
    Quantity::from_nanos(units.saturating_mul(NANO), format)
}

/// The accelerators raygate counts as GPUs: the `gpus*` status fields and
/// printer columns, `kubectl raygate queue`, and the dashboard's free-GPU
/// panel (whose query a test keeps equal to this list).
pub const ACCELERATORS: [&str; 3] = ["nvidia.com/gpu", "amd.com/gpu", "google.com/tpu"];

/// Whether the fit treats `resource` as a scarce device that decides where a
/// pod can go, so such pods sort and fit first: every one of
/// [`ACCELERATORS`] and any other extended resource (a domain outside
/// `kubernetes.io`, e.g. `nvidia.com/mig-1g.10gb`, `habana.ai/gaudi`), which
/// the GPU columns do not add up because they are not whole GPUs.
pub fn is_extended_resource(resource: &str) -> bool {
    ACCELERATORS.contains(&resource)
        || match resource.split_once('/') {
            Some((domain, _)) => {
                !(domain == "kubernetes.io"
                    || domain.ends_with(".kubernetes.io")
                    || domain.starts_with("hugepages"))
            }
            None => false,
        }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A resource list from `(name, quantity)` pairs, for tests across the crate.
    pub(crate) fn rl(pairs: &[(&str, &str)]) -> ResourceList {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity::parse(v).unwrap()))
            .collect()
    }

    /// A total past what i128 nanos hold clamps at the limit; it never drops
    /// an addend (which printed a total smaller than one of its parts).
    #[test]
    fn sums_of_extreme_quantities_saturate() {
        let huge = "170141183460469231731"; // > i128::MAX nanos / 1e9 units
        let m = rl(&[("nvidia.com/gpu", "1E"), ("amd.com/gpu", huge)]);
        let total = sum_of(&m, &["nvidia.com/gpu", "amd.com/gpu"]).expect("total");
        let one_e = Quantity::parse("1E").expect("1E");
        assert!(total >= one_e, "{}", total.canonical());
        let m = rl(&[
            ("nvidia.com/gpu", "9223372036854775807"),
            ("amd.com/gpu", "100Mi"),
        ]);
        assert_eq!(
            sum_of(&m, &["nvidia.com/gpu", "amd.com/gpu"]).map(|q| q.canonical()),
            Some("9223372036959633407".to_string())
        );
        assert_eq!(sum_of(&m, &["cpu"]), None);
        let parsed = parse_status_map(&BTreeMap::from([
            ("cpu".to_string(), "500m".to_string()),
            ("memory".to_string(), "lots".to_string()),
        ]));
        assert_eq!(parsed, rl(&[("cpu", "500m")]));
    }

    #[test]
    fn list_helpers() {
        let a = rl(&[("cpu", "2"), ("memory", "1Gi")]);
        let b = rl(&[("cpu", "500m"), ("nvidia.com/gpu", "1")]);
        assert_eq!(
            canonical_map(&sum(&a, &b)),
            BTreeMap::from([
                ("cpu".to_string(), "2500m".to_string()),
                ("memory".to_string(), "1Gi".to_string()),
                ("nvidia.com/gpu".to_string(), "1".to_string()),
            ])
        );
        let d = sub_floor0(&b, &a);
        assert_eq!(d["cpu"], Quantity::zero());
        assert_eq!(d["nvidia.com/gpu"], Quantity::from_units(1));
        assert!(!d.contains_key("memory"));
    }

    #[test]
    fn units_follow_the_scheduler() {
        assert_eq!(scheduler_units("cpu", &Quantity::parse("100u").unwrap()), 1);
        assert_eq!(
            scheduler_units("cpu", &Quantity::parse("1.5").unwrap()),
            1500
        );
        assert_eq!(
            scheduler_units("memory", &Quantity::parse("1.5").unwrap()),
            2
        );
        assert_eq!(
            scheduler_units("memory", &Quantity::parse("1Gi").unwrap()),
            1 << 30
        );
        assert_eq!(from_scheduler_units("cpu", 1500).canonical(), "1500m");
        assert_eq!(from_scheduler_units("memory", 1 << 30).canonical(), "1Gi");
        assert_eq!(from_scheduler_units("nvidia.com/gpu", 8).canonical(), "8");
    }

    #[test]
    fn accelerators_are_extended_resources() {
        assert!(is_extended_resource("nvidia.com/gpu"));
        assert!(is_extended_resource("amd.com/gpu"));
        assert!(is_extended_resource("google.com/tpu"));
        assert!(!is_extended_resource("cpu"));
        assert!(!is_extended_resource("memory"));
        assert!(!is_extended_resource("hugepages-2Mi"));
        assert!(!is_extended_resource("kubernetes.io/something"));
        assert!(ACCELERATORS.iter().all(|r| is_extended_resource(r)));
    }

    /// The dashboard (and its copy in the chart) queries free GPUs with a
    /// regex of resource names; it is JSON read by Grafana, so it cannot
    /// import the list, and this test keeps it equal to it instead. The e2e
    /// crate, kept independent of this one, has no list of its own.
    #[test]
    fn the_dashboard_queries_the_same_accelerators() {
        let wanted = format!("resource=~\\\"{}\\\"", ACCELERATORS.join("|"));
        for file in [
            "config/grafana/raygate.json",
            "charts/raygate/files/grafana/raygate.json",
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            let found: Vec<&str> = text
                .match_indices("resource=~")
                .map(|(i, _)| &text[i..])
                .collect();
            assert!(!found.is_empty(), "{file}: no resource=~ query");
            for q in found {
                assert!(
                    q.starts_with(&wanted),
                    "{file}: {}",
                    &q[..wanted.len().min(q.len())]
                );
            }
        }
    }
}
