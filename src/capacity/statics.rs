//! Static filter verdicts (node name, taints, affinity) per placement
//! signature, kept across decisions by the capacity index and patched for
//! the nodes that changed. Below `node`, `fit` and `index`, which all read it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, Pod};

use super::ids::NodeId;
use super::scheduling::{Wording, node_name, static_filter};
use crate::sync::lock;

/// One placement signature's static verdicts on every usable node: the
/// reason it was filtered out (an index into `reasons`), and the nodes that
/// passed.
#[derive(Debug)]
pub(crate) struct Statics {
    pub(super) verdicts: Vec<Option<usize>>,
    pub(super) reasons: Vec<String>,
    pub(super) feasible: Vec<NodeId>,
}

impl Statics {
    /// The static filters (node name, taints, affinity) of `pod` on `nodes`.
    pub(super) fn compute(pod: &Pod, nodes: &[&Node], wording: Wording) -> Statics {
        let mut reasons = Reasons::default();
        let verdicts: Vec<Option<usize>> = nodes
            .iter()
            .map(|node| reasons.verdict(pod, node, wording))
            .collect();
        reasons.done(verdicts)
    }

    /// The verdicts on `new`, from those on `old`: a node whose object is
    /// the same (the same `Arc`: the index keeps a node's `Arc` until the
    /// node changes) keeps its verdict; only nodes added or changed are
    /// evaluated, as kube-scheduler's `UpdateSnapshot` clones only the
    /// NodeInfos whose generation moved. Both lists are sorted by name, so
    /// one merge finds them; `evaluated` counts the filter runs.
    fn patched(
        &self,
        pod: &Pod,
        old: &[Arc<Node>],
        new: &[Arc<Node>],
        wording: Wording,
        evaluated: &mut usize,
    ) -> Statics {
        let mut reasons = Reasons::from(&self.reasons);
        let mut verdicts = Vec::with_capacity(new.len());
        let mut i = 0;
        for node in new {
            // Nodes gone since `old` (sorted before this one) are skipped.
            while i < old.len()
                && !Arc::ptr_eq(&old[i], node)
                && node_name(&old[i]) < node_name(node)
            {
                i += 1;
            }
            match old.get(i) {
                Some(o) if Arc::ptr_eq(o, node) => {
                    verdicts.push(self.verdicts.get(i).copied().flatten());
                    i += 1;
                }
                _ => {
                    // Added, or changed (same name, another object).
                    if old.get(i).is_some_and(|o| node_name(o) == node_name(node)) {
                        i += 1;
                    }
                    *evaluated += 1;
                    verdicts.push(reasons.verdict(pod, node, wording));
                }
            }
        }
        reasons.done(verdicts)
    }
}

/// Reason texts, each kept once with an id.
#[derive(Default)]
struct Reasons {
    texts: Vec<String>,
    ids: HashMap<String, usize>,
}

impl Reasons {
    fn from(texts: &[String]) -> Reasons {
        Reasons {
            texts: texts.to_vec(),
            ids: texts
                .iter()
                .enumerate()
                .map(|(i, t)| (t.clone(), i))
                .collect(),
        }
    }

    fn verdict(&mut self, pod: &Pod, node: &Node, wording: Wording) -> Option<usize> {
        static_filter(pod, node, wording).err().map(|r| {
            *self.ids.entry(r.clone()).or_insert_with(|| {
                self.texts.push(r);
                self.texts.len() - 1
            })
        })
    }

    /// Reasons no node has any more stay: `explain` counts nodes per
    /// reason and leaves out those with none.
    fn done(self, verdicts: Vec<Option<usize>>) -> Statics {
        let feasible = NodeId::all(verdicts.len())
            .zip(&verdicts)
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| n)
            .collect();
        Statics {
            verdicts,
            reasons: self.texts,
            feasible,
        }
    }
}

/// The index's usable nodes as one layout, sorted by name; a node's `Arc`
/// is kept until that node changes.
pub(crate) type Layout = Arc<Vec<Arc<Node>>>;

/// Static verdicts kept across decisions, per placement signature: on the
/// layout they were computed for, or patched on a newer one by evaluating
/// only the nodes that changed ([`Statics::patched`]), so the first
/// decision after a node event costs O(changed nodes) filter runs, not
/// O(nodes).
#[derive(Debug, Default)]
pub(crate) struct StaticsCache {
    inner: Mutex<HashMap<(String, Wording), Cached>>,
    /// Static filter runs so far (tests and benches read it).
    evaluated: std::sync::atomic::AtomicUsize,
}

#[derive(Debug, Clone)]
struct Cached {
    /// The layout `statics` holds for.
    nodes: Layout,
    /// A pod of this signature (the verdicts read nothing else of it).
    pod: Arc<Pod>,
    statics: Arc<Statics>,
}

impl StaticsCache {
    /// Signatures kept at most; past it the cache starts again.
    const MAX: usize = 256;

    /// The verdicts of `pod` on `nodes`: cached, patched or computed. The
    /// lock is not held while filters run.
    pub(super) fn get(
        &self,
        key: (String, Wording),
        pod: &Pod,
        nodes: &Layout,
        wording: Wording,
    ) -> Arc<Statics> {
        let cached = lock(&self.inner).get(&key).cloned();
        let mut evaluated = 0;
        let (statics, pod) = match cached {
            Some(c) if Arc::ptr_eq(&c.nodes, nodes) => return c.statics,
            Some(c) => (
                Arc::new(
                    c.statics
                        .patched(&c.pod, &c.nodes, nodes, wording, &mut evaluated),
                ),
                c.pod,
            ),
            None => {
                let refs: Vec<&Node> = nodes.iter().map(|n| &**n).collect();
                evaluated = refs.len();
                (
                    Arc::new(Statics::compute(pod, &refs, wording)),
                    Arc::new(pod.clone()),
                )
            }
        };
        self.evaluated
            .fetch_add(evaluated, std::sync::atomic::Ordering::Relaxed);
        {
            let mut inner = lock(&self.inner);
            if inner.len() >= Self::MAX && !inner.contains_key(&key) {
                inner.clear();
            }
            inner.insert(
                key,
                Cached {
                    nodes: nodes.clone(),
                    pod,
                    statics: statics.clone(),
                },
            );
        }
        statics
    }

    /// Static filter runs so far.
    pub(crate) fn evaluated(&self) -> usize {
        self.evaluated.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Forgets every verdict: the next decision evaluates every node again.
    pub(crate) fn clear(&self) {
        lock(&self.inner).clear();
    }
}
