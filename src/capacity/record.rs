//! A pod as the capacity model reads it, not as the apiserver sends it.
//!
//! A `Pod` as received is tens of kilobytes (env, probes, managedFields); the
//! capacity model reads only its node, phase, effective request, the labels
//! that tie it to a RayCluster and two scheduling conditions. [`PartialPod`]
//! deserialises only those (the watch type), and [`PodRecord`] keeps them
//! compactly: the request is parsed once, when the event arrives, into
//! scheduler units per interned resource name.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, OnceLock, RwLock};

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Pod, PodCondition, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::Deserialize;

use super::requests::pod_requests;
use super::{PODS, scheduler_units};
use crate::podgroup::{LABEL_CLUSTER, LABEL_GROUP, LABEL_NODE_TYPE};

/// How many distinct resource names the process interns. Real clusters use
/// a few dozen; the bound keeps a tenant inventing names from growing the
/// table without end (its pods then fail to parse, like a bad quantity).
pub const MAX_RESOURCE_NAMES: usize = 4096;

/// An interned resource name (`cpu`, `nvidia.com/gpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResName(u16);

#[derive(Default)]
struct ResTable {
    ids: std::collections::HashMap<&'static str, u16>,
    names: Vec<&'static str>,
}

fn res_table() -> &'static RwLock<ResTable> {
    static T: OnceLock<RwLock<ResTable>> = OnceLock::new();
    T.get_or_init(Default::default)
}

impl ResName {
    /// The id of `name`; `None` once [`MAX_RESOURCE_NAMES`] are taken.
    pub fn intern(name: &str) -> Option<ResName> {
        if let Ok(t) = res_table().read()
            && let Some(&i) = t.ids.get(name)
        {
            return Some(ResName(i));
        }
        let mut t = res_table().write().ok()?;
        if let Some(&i) = t.ids.get(name) {
            return Some(ResName(i));
        }
        if t.names.len() >= MAX_RESOURCE_NAMES {
            return None;
        }
        // Leaked on purpose: bounded by MAX_RESOURCE_NAMES, shared for the
        // process's life.
        let s: &'static str = Box::leak(name.to_string().into_boxed_str());
        let i = t.names.len() as u16;
        t.names.push(s);
        t.ids.insert(s, i);
        Some(ResName(i))
    }

    pub fn as_str(self) -> &'static str {
        res_table()
            .read()
            .ok()
            .and_then(|t| t.names.get(usize::from(self.0)).copied())
            .unwrap_or("")
    }

    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// Shares equal strings (namespaces, node and cluster names) between records.
#[derive(Default, Debug, Clone)]
pub struct Strings(HashSet<Arc<str>>);

impl Strings {
    pub fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.0.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.0.insert(a.clone());
        a
    }

    /// Drops strings no record uses any more.
    pub fn prune(&mut self) {
        self.0.retain(|a| Arc::strong_count(a) > 1);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `(namespace, name)`.
pub type PodKey = (Arc<str>, Arc<str>);

/// `status.phase`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodPhase {
    None,
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl PodPhase {
    fn parse(s: Option<&str>) -> PodPhase {
        match s {
            None => PodPhase::None,
            Some("Pending") => PodPhase::Pending,
            Some("Running") => PodPhase::Running,
            Some("Succeeded") => PodPhase::Succeeded,
            Some("Failed") => PodPhase::Failed,
            Some(_) => PodPhase::Unknown,
        }
    }

    /// Succeeded and Failed pods hold nothing.
    pub fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

/// A `PodScheduled` or `Ready` condition; the message only while False (the
/// scheduler's reason a pod is unschedulable).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cond {
    pub ready: bool,
    pub status: Arc<str>,
    pub reason: Option<Arc<str>>,
    pub message: Option<Box<str>>,
}

/// What a Ray pod (one with `ray.io/cluster`) adds: the labels that say
/// which cluster, node type and group it is, and its scheduling conditions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RayPart {
    pub cluster: Arc<str>,
    pub node_type: Option<Arc<str>>,
    pub group: Option<Arc<str>>,
    pub conditions: Box<[Cond]>,
}

/// Requests in scheduler units (see [`crate::capacity`]), zero entries
/// dropped, pod slot not included; or why the pod's request did not parse
/// (reported when the pod is counted, as the from-scratch path did).
pub type Units = Result<Box<[(ResName, i64)]>, Box<str>>;

/// A pod, minus its identity (the key it is stored under).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodBody {
    pub node: Option<Arc<str>>,
    pub phase: PodPhase,
    pub deleting: bool,
    pub requests: Units,
    pub ray: Option<Box<RayPart>>,
}

impl PodBody {
    /// Counted against its node: bound and not terminal.
    pub fn holds(&self) -> Option<&str> {
        if self.phase.is_terminal() {
            return None;
        }
        self.node.as_deref()
    }

    pub fn cluster(&self) -> Option<&str> {
        self.ray.as_ref().map(|r| &*r.cluster)
    }

    /// The request as a resource list, with one pod slot (as the fit counts).
    pub fn units_with_slot(&self) -> Result<Vec<(&'static str, i128)>, Box<str>> {
        let units = self.requests.as_ref().map_err(Clone::clone)?;
        let mut out: Vec<(&'static str, i128)> = units
            .iter()
            .filter(|(r, _)| r.as_str() != PODS)
            .map(|(r, u)| (r.as_str(), i128::from(*u)))
            .collect();
        out.push((PODS, 1));
        Ok(out)
    }
}

/// A pod with its identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRecord {
    pub key: PodKey,
    pub body: PodBody,
}

impl PodRecord {
    /// From a full pod (tests, a live list, the CLI's input).
    pub fn from_pod(pod: &Pod) -> PodRecord {
        let key: PodKey = (
            Arc::from(pod.metadata.namespace.as_deref().unwrap_or("")),
            Arc::from(pod.metadata.name.as_deref().unwrap_or("")),
        );
        let status = pod.status.as_ref();
        let body = body(
            &mut Strings::default(),
            pod.metadata.labels.as_ref(),
            pod.metadata.deletion_timestamp.is_some(),
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            status.and_then(|s| s.phase.as_deref()),
            status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]),
            units(pod),
        );
        PodRecord { key, body }
    }

    pub fn is_terminal(&self) -> bool {
        self.body.phase.is_terminal()
    }
}

/// The request of `pod` in scheduler units.
fn units(pod: &Pod) -> Units {
    let list = pod_requests(pod, &[]).map_err(|e| e.to_string().into_boxed_str())?;
    let mut out = Vec::with_capacity(list.len());
    for (k, q) in &list {
        let Some(id) = ResName::intern(k) else {
            return Err(format!(
                "pod {}: resource {k:?}: more than {MAX_RESOURCE_NAMES} distinct resource names",
                super::pod_name(pod)
            )
            .into_boxed_str());
        };
        let u = scheduler_units(k, q);
        out.push((id, i64::try_from(u).unwrap_or(i64::MAX)));
    }
    out.retain(|&(_, u)| u != 0);
    Ok(out.into_boxed_slice())
}

fn body(
    strings: &mut Strings,
    labels: Option<&BTreeMap<String, String>>,
    deleting: bool,
    node: Option<&str>,
    phase: Option<&str>,
    conditions: &[PodCondition],
    requests: Units,
) -> PodBody {
    let ray = labels.and_then(|l| {
        let cluster = l.get(LABEL_CLUSTER)?;
        let mut get = |k: &str| l.get(k).map(|v| strings.get(v));
        let (node_type, group) = (get(LABEL_NODE_TYPE), get(LABEL_GROUP));
        let conditions = conditions
            .iter()
            .filter(|c| c.type_ == "PodScheduled" || c.type_ == "Ready")
            .map(|c| Cond {
                ready: c.type_ == "Ready",
                status: strings.get(&c.status),
                reason: c.reason.as_deref().map(|r| strings.get(r)),
                message: c
                    .message
                    .as_deref()
                    .filter(|_| c.status == "False")
                    .map(Box::from),
            })
            .collect();
        Some(Box::new(RayPart {
            cluster: strings.get(cluster),
            node_type,
            group,
            conditions,
        }))
    });
    PodBody {
        node: node.map(|n| strings.get(n)),
        phase: PodPhase::parse(phase),
        deleting,
        requests,
        ray,
    }
}

/// The slice of `PodSpec` the request reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartialSpec {
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub containers: Vec<PartialContainer>,
    #[serde(default)]
    pub init_containers: Option<Vec<PartialContainer>>,
    #[serde(default)]
    pub overhead: Option<BTreeMap<String, K8sQuantity>>,
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartialContainer {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
    #[serde(default)]
    pub restart_policy: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PartialContainerStatus {
    pub name: String,
    pub resources: Option<ResourceRequirements>,
    pub allocated_resources: Option<BTreeMap<String, K8sQuantity>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PartialStatus {
    pub phase: Option<String>,
    pub conditions: Option<Vec<PodCondition>>,
    pub container_statuses: Option<Vec<PartialContainerStatus>>,
    pub init_container_statuses: Option<Vec<PartialContainerStatus>>,
    /// Pod-level resources the kubelet reports after an in-place resize.
    pub resources: Option<ResourceRequirements>,
    pub allocated_resources: Option<BTreeMap<String, K8sQuantity>>,
}

/// The metadata a pod record needs; the rest (managedFields, annotations,
/// owner references) is skipped by the parser, never allocated.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PartialMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
}

/// `metadata` as [`PartialPod`] reads it; the JSON state reader reuses it so
/// both give the same record.
pub(crate) fn partial_meta<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = PartialMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        resource_version: m.resource_version,
        labels: m.labels,
        deletion_timestamp: m.deletion_timestamp,
        ..Default::default()
    })
}

/// A Pod deserialised only as far as the capacity model reads it: what
/// raygate watches instead of `Pod`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PartialPod {
    #[serde(default, deserialize_with = "partial_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<PartialSpec>,
    #[serde(default)]
    pub status: Option<PartialStatus>,
}

impl kube::Resource for PartialPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn container(c: &PartialContainer) -> Container {
    Container {
        name: c.name.clone(),
        resources: c.resources.clone(),
        restart_policy: c.restart_policy.clone(),
        ..Default::default()
    }
}

fn container_status(c: &PartialContainerStatus) -> ContainerStatus {
    ContainerStatus {
        name: c.name.clone(),
        resources: c.resources.clone(),
        allocated_resources: c.allocated_resources.clone(),
        ..Default::default()
    }
}

impl PartialPod {
    /// The smallest `Pod` the request computation reads: one request path
    /// for full and partial pods alike.
    pub fn request_pod(&self) -> Pod {
        let spec = self.spec.as_ref().map(|s| PodSpec {
            containers: s.containers.iter().map(container).collect(),
            init_containers: s
                .init_containers
                .as_ref()
                .map(|v| v.iter().map(container).collect()),
            overhead: s.overhead.clone(),
            resources: s.resources.clone(),
            ..Default::default()
        });
        let status = self.status.as_ref().map(|s| PodStatus {
            conditions: s.conditions.as_ref().map(|cs| {
                cs.iter()
                    .filter(|c| c.type_ == "PodResizePending")
                    .cloned()
                    .collect()
            }),
            container_statuses: s
                .container_statuses
                .as_ref()
                .map(|v| v.iter().map(container_status).collect()),
            init_container_statuses: s
                .init_container_statuses
                .as_ref()
                .map(|v| v.iter().map(container_status).collect()),
            resources: s.resources.clone(),
            allocated_resources: s.allocated_resources.clone(),
            ..Default::default()
        });
        Pod {
            metadata: ObjectMeta {
                name: self.metadata.name.clone(),
                namespace: self.metadata.namespace.clone(),
                ..Default::default()
            },
            spec,
            status,
        }
    }

    /// The record, with strings shared through `strings`.
    pub fn to_record(&self, strings: &mut Strings) -> PodRecord {
        let meta = &self.metadata;
        let key: PodKey = (
            strings.get(meta.namespace.as_deref().unwrap_or("")),
            Arc::from(meta.name.as_deref().unwrap_or("")),
        );
        let status = self.status.as_ref();
        let body = body(
            strings,
            meta.labels.as_ref(),
            meta.deletion_timestamp.is_some(),
            self.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            status.and_then(|s| s.phase.as_deref()),
            status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]),
            units(&self.request_pod()),
        );
        PodRecord { key, body }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn full() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml",
                "labels": {"ray.io/cluster": "c", "ray.io/node-type": "worker", "ray.io/group": "gpu", "app": "x"},
                "annotations": {"big": "x"},
                "managedFields": [{"manager": "kubelet", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"nodeName": "n1",
                "containers": [{"name": "c", "image": "img", "env": [{"name": "A", "value": "1"}],
                    "resources": {"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": "4"}}}],
                "initContainers": [{"name": "i", "image": "img", "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "1"}}}],
                "overhead": {"cpu": "100m"},
                "volumes": [{"name": "v", "emptyDir": {}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                "conditions": [{"type": "PodScheduled", "status": "True"},
                               {"type": "Initialized", "status": "True"},
                               {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": "m"}]}
        })
    }

    #[test]
    fn partial_and_full_pods_give_the_same_record() {
        let pod: Pod = serde_json::from_value(full()).unwrap();
        let partial: PartialPod = serde_json::from_value(full()).unwrap();
        let a = PodRecord::from_pod(&pod);
        let b = partial.to_record(&mut Strings::default());
        assert_eq!(a, b);
        assert_eq!(a.body.node.as_deref(), Some("n1"));
        assert_eq!(a.body.cluster(), Some("c"));
        let units: BTreeMap<&str, i64> = a
            .body
            .requests
            .as_ref()
            .unwrap()
            .iter()
            .map(|(r, u)| (r.as_str(), *u))
            .collect();
        // cpu: app 2 + sidecar 1 + overhead 100m; the GPU limit is its request.
        assert_eq!(
            units,
            BTreeMap::from([("cpu", 3100), ("nvidia.com/gpu", 4)])
        );
    }

    #[test]
    fn a_pod_resized_at_pod_level_counts_what_its_kubelet_reports() {
        // Resized 3 -> 2 at pod level, still running with 3: the scheduler keeps 3
        // (e2e/tests/scheduler.rs `pod-level-resized-refused`), on both parse paths.
        let v = json!({"metadata": {"name": "p", "namespace": "ml"},
            "spec": {"nodeName": "n1", "resources": {"requests": {"cpu": "2"}},
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Running",
                "resources": {"requests": {"cpu": "3"}}, "allocatedResources": {"cpu": "2"}}});
        let pod: Pod = serde_json::from_value(v.clone()).unwrap();
        let partial: PartialPod = serde_json::from_value(v).unwrap();
        let a = PodRecord::from_pod(&pod);
        assert_eq!(a, partial.to_record(&mut Strings::default()));
        let cpu: Vec<i64> = a
            .body
            .requests
            .as_ref()
            .unwrap()
            .iter()
            .filter(|(r, _)| r.as_str() == "cpu")
            .map(|(_, u)| *u)
            .collect();
        assert_eq!(cpu, [3000]);
    }

    #[test]
    fn a_bad_quantity_is_kept_as_the_reason() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "b", "namespace": "x"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1.1.1"}}}]}}))
        .unwrap();
        let r = PodRecord::from_pod(&pod);
        let err = r.body.requests.unwrap_err();
        assert!(err.contains("invalid quantity"), "{err}");
    }

    #[test]
    fn strings_are_shared_and_pruned() {
        let mut s = Strings::default();
        let a = s.get("ns");
        let b = s.get("ns");
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        s.prune();
        assert!(s.is_empty());
    }
}
