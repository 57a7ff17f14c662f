//! Pods as groups, below both `kuberay` (which plans them) and `capacity`
//! (which places and indexes them), so neither knows the other.
//!
//! Planned pods: one template and a count, never K copies.
//!
//! A worker group of 100,000 replicas is one `Pod` and a number here; the
//! fit computes its request and its feasible nodes once per group and
//! places the copies arithmetically. [`MAX_PLANNED_PODS`] bounds how many
//! pods one plan may ask raygate to place, so no RayService can make the
//! operator allocate or compute without bound.

use k8s_openapi::api::core::v1::Pod;

/// Pod label: the RayCluster name (`utils.RayClusterLabelKey`); the capacity
/// index keys a cluster's running pods by it.
pub const LABEL_CLUSTER: &str = "ray.io/cluster";
/// Pod label: `head` or `worker` (`utils.RayNodeTypeLabelKey`).
pub const LABEL_NODE_TYPE: &str = "ray.io/node-type";
/// Pod label: the worker group name, `headgroup` for the head (`utils.RayNodeGroupLabelKey`).
pub const LABEL_GROUP: &str = "ray.io/group";

/// `ray.io/node-type` of a head pod.
pub const HEAD: &str = "head";
/// `ray.io/node-type` of a worker pod.
pub const WORKER: &str = "worker";

/// A Ray pod's place in its cluster, read from KubeRay's labels once for
/// every reader: the ledger matching planned and existing pods, the surge
/// budget per group, the capacity request's shapes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PodRole {
    Head,
    /// A worker of the named group (`ray.io/group`).
    Worker(String),
}

impl PodRole {
    /// From the `ray.io/node-type` and `ray.io/group` label values: `None`
    /// for a pod KubeRay did not label (or a worker without its group).
    pub fn from_labels(node_type: Option<&str>, group: Option<&str>) -> Option<PodRole> {
        match node_type? {
            HEAD => Some(PodRole::Head),
            WORKER => Some(PodRole::Worker(group?.to_string())),
            _ => None,
        }
    }

    /// The role of `pod` from its labels.
    pub fn of(pod: &Pod) -> Option<PodRole> {
        let labels = pod.metadata.labels.as_ref()?;
        PodRole::from_labels(
            labels.get(LABEL_NODE_TYPE).map(String::as_str),
            labels.get(LABEL_GROUP).map(String::as_str),
        )
    }

    /// `head`, or the worker group's name: how a surge budget names its group.
    pub fn group(&self) -> &str {
        match self {
            PodRole::Head => HEAD,
            PodRole::Worker(group) => group,
        }
    }
}

/// `head` or `worker-<group>`: a capacity request's shape key.
impl std::fmt::Display for PodRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PodRole::Head => f.write_str(HEAD),
            PodRole::Worker(group) => write!(f, "{WORKER}-{group}"),
        }
    }
}

/// Name for messages and keys: `metadata.name`, else `generateName`.
pub fn pod_name(pod: &Pod) -> String {
    pod.metadata
        .name
        .clone()
        .or_else(|| pod.metadata.generate_name.clone())
        .unwrap_or_else(|| "<unnamed>".to_string())
}

/// The most pods raygate places for one new cluster. Above it the plan is
/// an `Error` (see docs/upgradeplan.md): placing copy by copy costs time and
/// a placement entry per pod, and no GPU upgrade that needs a capacity gate
/// is that large.
pub const MAX_PLANNED_PODS: i64 = 10_000;

/// How the pods of a group are named.
#[derive(Clone, Debug, PartialEq)]
pub enum GroupNames {
    /// A group of one: the template's own name.
    Own,
    /// `{prefix}{start + i}` (KubeRay's `<cluster>-<group>-worker-` style).
    Indexed { prefix: String, start: usize },
}

/// `count` identical pods.
#[derive(Clone, Debug, PartialEq)]
pub struct PodGroup {
    pub template: Pod,
    pub count: usize,
    pub names: GroupNames,
}

impl From<Pod> for PodGroup {
    fn from(template: Pod) -> PodGroup {
        PodGroup {
            template,
            count: 1,
            names: GroupNames::Own,
        }
    }
}

impl PodGroup {
    /// `count` pods named `{prefix}0`, `{prefix}1`, ….
    pub fn indexed(template: Pod, count: usize, prefix: String) -> PodGroup {
        PodGroup {
            template,
            count,
            names: GroupNames::Indexed { prefix, start: 0 },
        }
    }

    /// The name of pod `i` of the group.
    pub fn name(&self, i: usize) -> String {
        match &self.names {
            GroupNames::Own => pod_name(&self.template),
            GroupNames::Indexed { prefix, start } => format!("{prefix}{}", start + i),
        }
    }

    /// The group without its first `n` pods.
    pub fn skip(&self, n: usize) -> PodGroup {
        let n = n.min(self.count);
        let names = match &self.names {
            GroupNames::Own => GroupNames::Own,
            GroupNames::Indexed { prefix, start } => GroupNames::Indexed {
                prefix: prefix.clone(),
                start: start + n,
            },
        };
        PodGroup {
            template: self.template.clone(),
            count: self.count - n,
            names,
        }
    }

    /// The pods, one by one (for callers that need them; bounded by the
    /// cap on planned pods).
    pub fn pods(&self) -> impl Iterator<Item = Pod> + '_ {
        (0..self.count).map(|i| {
            let mut p = self.template.clone();
            if matches!(self.names, GroupNames::Indexed { .. }) {
                p.metadata.name = Some(self.name(i));
            }
            p
        })
    }
}

/// The pods of all groups.
pub fn expand(groups: &[PodGroup]) -> Vec<Pod> {
    groups.iter().flat_map(PodGroup::pods).collect()
}

/// How many pods the groups hold.
pub fn count(groups: &[PodGroup]) -> usize {
    groups.iter().map(|g| g.count).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(labels: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    #[test]
    fn a_pod_role_is_read_from_kuberays_labels() {
        let head = labelled(&[(LABEL_NODE_TYPE, "head"), (LABEL_GROUP, "headgroup")]);
        let worker = labelled(&[(LABEL_NODE_TYPE, "worker"), (LABEL_GROUP, "gpu")]);
        assert_eq!(PodRole::of(&head), Some(PodRole::Head));
        assert_eq!(PodRole::of(&worker), Some(PodRole::Worker("gpu".into())));
        assert_eq!(PodRole::of(&labelled(&[(LABEL_NODE_TYPE, "worker")])), None);
        assert_eq!(PodRole::of(&labelled(&[(LABEL_GROUP, "gpu")])), None);
        assert_eq!(PodRole::of(&Pod::default()), None);
    }

    #[test]
    fn a_pod_role_names_its_group_and_its_shape() {
        assert_eq!(PodRole::Head.group(), "head");
        assert_eq!(PodRole::Head.to_string(), "head");
        let w = PodRole::Worker("gpu".into());
        assert_eq!(w.group(), "gpu");
        assert_eq!(w.to_string(), "worker-gpu");
    }

    #[test]
    fn names_follow_the_index_and_survive_skipping() {
        let mut t = Pod::default();
        t.metadata.name = Some("c-gpu-worker-0".into());
        let g = PodGroup::indexed(t, 3, "c-gpu-worker-".into());
        assert_eq!(g.name(2), "c-gpu-worker-2");
        let rest = g.skip(1);
        assert_eq!(rest.count, 2);
        let names: Vec<_> = rest.pods().map(|p| p.metadata.name.unwrap()).collect();
        assert_eq!(names, ["c-gpu-worker-1", "c-gpu-worker-2"]);
        assert_eq!(count(&[g.clone(), rest]), 5);
        assert_eq!(expand(&[g]).len(), 3);
    }

    fn spec(groups: usize, replicas: i32) -> crate::kuberay::RayClusterSpec {
        let workers: Vec<serde_json::Value> = (0..groups)
            .map(|g| {
                serde_json::json!({"groupName": format!("g{g}"), "replicas": replicas,
                    "minReplicas": replicas, "maxReplicas": replicas,
                    "template": {"spec": {"containers": [{"name": "w", "image": "ray",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "h", "image": "ray"}]}}},
            "workerGroupSpecs": workers}))
        .unwrap()
    }

    #[test]
    fn the_cap_refuses_before_anything_is_built() {
        let v = crate::kuberay::KubeRayVersion::default();
        let err = crate::kuberay::planned_groups("huge", "ml", &spec(20, 100_000), v)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("more than the 10000 raygate places for one cluster"),
            "{err}"
        );
        // At the cap: one head and 9,999 workers, as two groups.
        let groups = crate::kuberay::planned_groups("big", "ml", &spec(1, 9_999), v).unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(count(&groups) as i64, MAX_PLANNED_PODS);
        assert_eq!(groups[1].name(9_998), "big-g0-worker-9998");
    }
}
