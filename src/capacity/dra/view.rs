//! Per node, the devices kube-scheduler's allocator would consider, and which are in use.
//!
//! As `GatherPools` (`structured/internal/*/pools_*.go`): the slices of a pool (driver,
//! pool name) are those of its newest generation; a pool whose newest generation does not
//! have all `resourceSliceCount` slices yet is incomplete: none of its devices are
//! allocated, and a request for `All` devices on that node fails.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::select::Selectors;
use super::{DeviceId, DraState, Exact, Undecided};

/// One device on a node.
#[derive(Debug, Clone)]
pub struct NodeDevice<'a> {
    pub id: DeviceId,
    pub device: &'a super::Device,
    /// Its pool also publishes `sharedCounters` (partitionable devices).
    pub partitionable: bool,
}

/// A node's devices, in the order the allocator tries them.
#[derive(Debug, Default, Clone)]
pub struct NodeDevices<'a> {
    pub devices: Vec<NodeDevice<'a>>,
    /// Held by an allocated ResourceClaim.
    pub used: Vec<bool>,
    /// Some pool on the node is being updated (its newest generation is incomplete).
    pub incomplete: bool,
}

/// Per node: (class, request selectors, what raygate does not model in the request, the
/// devices it may take). A node sees a handful of request shapes, so a scan finds one
/// without building a key.
type NodeCandidates = Vec<(
    String,
    Vec<String>,
    Option<&'static str>,
    Result<Arc<[usize]>, Undecided>,
)>;

/// A pool's newest generation and its slices (by name).
type Newest<'a> = (i64, Vec<(&'a str, &'a super::Slice)>);

/// Every node's devices, with class matches computed once per (node, request shape).
#[derive(Debug)]
pub struct DraView<'a> {
    pub state: &'a DraState,
    pub nodes: HashMap<&'a str, NodeDevices<'a>>,
    selectors: Selectors,
    candidates: HashMap<&'a str, NodeCandidates>,
}

impl<'a> DraView<'a> {
    pub fn new(state: &'a DraState) -> DraView<'a> {
        // (driver, pool) → (newest generation, its slices by name).
        let mut pools: BTreeMap<(&str, &str), Newest<'a>> = BTreeMap::new();
        for (name, s) in &state.slices {
            let e = pools
                .entry((s.driver.as_str(), s.pool.as_str()))
                .or_insert((s.generation, Vec::new()));
            if s.generation > e.0 {
                *e = (s.generation, Vec::new());
            }
            if s.generation == e.0 {
                e.1.push((name.as_str(), s));
            }
        }
        let in_use: BTreeSet<&DeviceId> = state.in_use();
        let mut nodes: HashMap<&str, NodeDevices<'a>> = HashMap::new();
        for ((driver, pool), (_, slices)) in &pools {
            let complete = slices
                .first()
                .is_some_and(|(_, s)| slices.len() as i64 == s.slice_count);
            let partitionable = slices.iter().any(|(_, s)| s.shared_counters);
            for (_, s) in slices {
                let Some(node) = s.node.as_deref() else {
                    continue;
                };
                let n = nodes.entry(node).or_default();
                if !complete {
                    n.incomplete = true;
                    continue;
                }
                for d in &s.devices {
                    let id = DeviceId {
                        driver: driver.to_string(),
                        pool: pool.to_string(),
                        device: d.name.clone(),
                    };
                    n.used.push(in_use.contains(&id));
                    n.devices.push(NodeDevice {
                        id,
                        device: d,
                        partitionable,
                    });
                }
            }
        }
        // Verdicts on every device for each selector, and as many again for devices and
        // selectors gone since: past that, start over.
        let devices: usize = nodes.values().map(|n| n.devices.len()).sum();
        let selectors: usize = state.classes.values().map(|c| c.selectors.len()).sum();
        state
            .verdicts
            .bound(2 * devices.saturating_mul(selectors.max(1)) + 4096);
        DraView {
            state,
            nodes,
            selectors: Selectors::with(state.verdicts.clone()),
            candidates: HashMap::new(),
        }
    }

    /// The devices of `node` (indices into its `devices`) that `req` may take, in order,
    /// whether in use or not: the class's selectors and the request's.
    pub fn candidates(&mut self, node: &str, req: &Exact) -> Result<Arc<[usize]>, Undecided> {
        let known = self.candidates.get(node).and_then(|shapes| {
            shapes.iter().find(|(class, selectors, unmodeled, _)| {
                *class == req.class && *selectors == req.selectors && *unmodeled == req.unmodeled
            })
        });
        if let Some((_, _, _, c)) = known {
            return c.clone();
        }
        let c = self.compute(node, req).map(Arc::from);
        // Nodes without devices have no entry of their own and are answered empty at once.
        if let Some((&name, _)) = self.nodes.get_key_value(node) {
            self.candidates.entry(name).or_default().push((
                req.class.clone(),
                req.selectors.clone(),
                req.unmodeled,
                c.clone(),
            ));
        }
        c
    }

    fn compute(&mut self, node: &str, req: &Exact) -> Result<Vec<usize>, Undecided> {
        let plain = self.state.plain_count.contains(&req.class);
        if let Some(why) = req.unmodeled.filter(|_| !plain) {
            return Err(Undecided(format!(
                "a request for class {} uses {why}",
                req.class
            )));
        }
        let Some(class) = self.state.classes.get(&req.class) else {
            // The scheduler cannot allocate it either: no device matches.
            return Ok(vec![]);
        };
        let Some(devs) = self.nodes.get(node) else {
            return Ok(vec![]);
        };
        let mut out = Vec::new();
        for (i, d) in devs.devices.iter().enumerate() {
            let mut all = true;
            for expr in class.selectors.iter().chain(&req.selectors) {
                match self.selectors.matches(expr, &d.id.driver, d.device) {
                    Ok(true) => {}
                    Ok(false) => {
                        all = false;
                        break;
                    }
                    Err(_) if plain => {}
                    Err(e) => {
                        return Err(Undecided(format!("class {}: {e}", req.class)));
                    }
                }
            }
            if !all {
                continue;
            }
            if !plain {
                let why = d.device.unmodeled.or(d
                    .partitionable
                    .then_some("partitionable devices (sharedCounters)"));
                if let Some(why) = why {
                    return Err(Undecided(format!(
                        "class {} matches device {}/{}/{} with {why}",
                        req.class, d.id.driver, d.id.pool, d.id.device
                    )));
                }
            }
            out.push(i);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Mode;
    use super::super::tests::*;
    use super::*;
    use serde_json::json;

    fn exact(class: &str) -> Exact {
        Exact {
            class: class.into(),
            selectors: vec![],
            mode: Mode::Count(1),
            unmodeled: None,
        }
    }

    #[test]
    fn only_the_newest_complete_generation_counts() {
        let s = state_of(&[
            slice("a-old", "a", "a", 1, 8),
            slice("a-new", "a", "a", 2, 4),
            // b's newest generation says two slices, only one is there.
            slice("b-old", "b", "b", 1, 8),
            slice_with("b-new", "b", "b", 2, 2, 4, "H100"),
            class("gpu", None, None),
        ]);
        let mut v = DraView::new(&s);
        assert_eq!(v.nodes["a"].devices.len(), 4);
        assert!(!v.nodes["a"].incomplete);
        assert!(v.nodes["b"].devices.is_empty());
        assert!(v.nodes["b"].incomplete);
        assert_eq!(v.candidates("a", &exact("gpu")).unwrap().len(), 4);
        assert!(v.candidates("c", &exact("gpu")).unwrap().is_empty());
        assert!(v.candidates("a", &exact("nope")).unwrap().is_empty());
    }

    #[test]
    fn allocated_claims_use_devices_and_selectors_filter() {
        let s = state_of(&[
            slice("a", "a", "a", 1, 4),
            slice_with("b", "b", "b", 1, 1, 2, "A100"),
            class(
                "h100",
                Some(r#"device.attributes["gpu.example.com"].productName == "H100""#),
                None,
            ),
            allocated_claim("ns", "c", "a", &["gpu-0", "gpu-2"]),
        ]);
        let mut v = DraView::new(&s);
        assert_eq!(v.nodes["a"].used, [true, false, true, false]);
        assert_eq!(v.candidates("a", &exact("h100")).unwrap()[..], [0, 1, 2, 3]);
        assert!(v.candidates("b", &exact("h100")).unwrap().is_empty());
        let mut req = exact("h100");
        req.selectors = vec![r#"device.attributes["gpu.example.com"].index % 2 == 1"#.into()];
        assert_eq!(v.candidates("a", &req).unwrap()[..], [1, 3]);
    }

    #[test]
    fn a_request_raygate_cannot_model_never_shares_an_answer_with_one_it_can() {
        let s = state_of(&[slice("a", "a", "a", 1, 2), class("gpu", None, None)]);
        let mut v = DraView::new(&s);
        assert_eq!(v.candidates("a", &exact("gpu")).unwrap()[..], [0, 1]);
        let mut admin = exact("gpu");
        admin.unmodeled = Some("admin access");
        assert!(v.candidates("a", &admin).is_err());
        assert_eq!(v.candidates("a", &exact("gpu")).unwrap()[..], [0, 1]);
    }

    #[test]
    fn what_cannot_be_decided_is_refused_unless_counted_plainly() {
        let mut tainted = slice("a", "a", "a", 1, 2);
        tainted["spec"]["devices"][1]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
        let mut s = state_of(&[
            tainted,
            class(
                "mem",
                Some(r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("1Gi")) > 0"#),
                None,
            ),
            class("gpu", None, None),
        ]);
        {
            let mut v = DraView::new(&s);
            let e = v.candidates("a", &exact("gpu")).unwrap_err();
            assert!(e.0.contains("device taints"), "{e}");
            let e = v.candidates("a", &exact("mem")).unwrap_err();
            assert!(e.0.contains("class mem"), "{e}");
        }
        s.plain_count.insert("gpu".into());
        s.plain_count.insert("mem".into());
        let mut v = DraView::new(&s);
        assert_eq!(v.candidates("a", &exact("gpu")).unwrap()[..], [0, 1]);
        assert_eq!(v.candidates("a", &exact("mem")).unwrap()[..], [0, 1]);
    }
}
