//! What Kueue does to a RayService it manages, and its quota as a capacity
//! dimension. Pure: typed views of the objects and the arithmetic; the
//! controller reads them.
//!
//! Evidence is Kueue v0.19.0's source (`sigs.k8s.io/kueue@v0.19.0`):
//! - a RayService joins Kueue by the label `kueue.x-k8s.io/queue-name`
//!   (`pkg/controller/constants` `QueueLabel`), read by the integration
//!   `ray.io/rayservice` (`pkg/controller/jobs/rayservice`);
//! - Kueue suspends and resumes it through `spec.rayClusterConfig.suspend`
//!   (`rayservice_controller.go` `Suspend`, `RunWithPodSetsInfo`), and when the
//!   object no longer matches its Workload (any pod-set change, e.g. a worker
//!   image edit) and is not suspended it stops the job ("No matching
//!   Workload", `jobframework/reconciler.go` `ensureOneWorkload`) — which
//!   KubeRay v1.5.2–v1.6.2 applies in place to the serving cluster (see
//!   [`crate::kuberay::classify`](mod@crate::kuberay::classify), rule 1b): an outage;
//! - except for an elastic job: annotation `kueue.x-k8s.io/elastic-job: "true"`
//!   (`pkg/constants` `ElasticJobAnnotation`, matched on key and value by
//!   `workloadslicing.Enabled`, feature gate `ElasticJobsViaWorkloadSlices`,
//!   beta and on by default).

pub mod probe;
pub mod quota;
pub mod reservation;
pub mod types;

use std::fmt;

use kube::api::ObjectMeta;
use serde::Serialize;

/// The label that puts an object under Kueue (`constants.QueueLabel`).
pub const LABEL_QUEUE_NAME: &str = "kueue.x-k8s.io/queue-name";
/// The annotation that makes a job elastic (`constants.ElasticJobAnnotation`).
pub const ANNOTATION_ELASTIC_JOB: &str = "kueue.x-k8s.io/elastic-job";
/// The value `workloadslicing.Enabled` matches (`EnabledAnnotationValue`).
pub const ELASTIC_JOB_ENABLED: &str = "true";

/// A LocalQueue's name, as a RayService's queue label gives it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct LocalQueueName(String);

impl LocalQueueName {
    pub fn new(name: impl Into<String>) -> Self {
        LocalQueueName(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LocalQueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A RayService Kueue manages: its LocalQueue, and whether it is elastic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Managed {
    pub queue: LocalQueueName,
    /// `kueue.x-k8s.io/elastic-job: "true"`: Kueue resizes it by workload
    /// slices instead of suspending it when its pod sets change.
    pub elastic: bool,
}

impl Managed {
    /// Whether Kueue manages the object with this metadata. An empty label
    /// value names no queue: Kueue's default queue applies only with the
    /// `LocalQueueDefaulting` webhook, which writes the label itself.
    pub fn of(meta: &ObjectMeta) -> Option<Managed> {
        let queue = meta
            .labels
            .as_ref()?
            .get(LABEL_QUEUE_NAME)
            .filter(|q| !q.is_empty())?;
        let elastic = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_ELASTIC_JOB))
            .is_some_and(|v| v == ELASTIC_JOB_ENABLED);
        Some(Managed {
            queue: LocalQueueName::new(queue.clone()),
            elastic,
        })
    }

    /// What Kueue v0.19 does with a change of the pod sets (a cluster
    /// change raygate would admit), in one sentence.
    pub fn behaviour(&self) -> &'static str {
        if self.elastic {
            "elastic job: Kueue resizes its Workload by slices instead of suspending it"
        } else {
            "Kueue v0.19 turns a rayClusterConfig change into a suspension (spec.rayClusterConfig.suspend: true), \
             which KubeRay applies in place to the serving cluster: an outage"
        }
    }
}

/// Kueue's objects given in a cluster state (`raygate fit --state`), as the
/// controller's caches hold them with `--kueue`: every ClusterQueue and
/// LocalQueue, and raygate's own reservation Workloads (other Workloads are
/// already counted in their ClusterQueue's status).
#[derive(Clone, Debug, Default)]
pub struct KueueObjects {
    pub cluster_queues: Vec<types::ClusterQueue>,
    pub local_queues: Vec<types::LocalQueue>,
    pub reservations: Vec<types::Workload>,
}

impl KueueObjects {
    /// No ClusterQueue or LocalQueue was given: the quota cannot be checked.
    pub fn is_empty(&self) -> bool {
        self.cluster_queues.is_empty() && self.local_queues.is_empty()
    }

    /// The ClusterQueue LocalQueue `ns/queue` points at.
    pub fn cluster_queue_of(&self, ns: &str, queue: &str) -> Option<String> {
        self.local_queues
            .iter()
            .find(|l| {
                l.metadata.name.as_deref() == Some(queue)
                    && l.metadata.namespace.as_deref().unwrap_or("default") == ns
            })?
            .spec
            .cluster_queue
            .clone()
    }

    /// Adds a `kueue.x-k8s.io/v1beta2` object of `kind`; a Workload only
    /// when it is raygate's reservation. `Ok(false)`: not a kind kept here.
    pub fn add(&mut self, kind: &str, value: serde_json::Value) -> serde_json::Result<bool> {
        match kind {
            "ClusterQueue" => self.cluster_queues.push(serde_json::from_value(value)?),
            "LocalQueue" => self.local_queues.push(serde_json::from_value(value)?),
            "Workload" => {
                let w: types::Workload = serde_json::from_value(value)?;
                let labels = w.metadata.labels.clone().unwrap_or_default();
                let ours = reservation::SELECTOR.split(',').all(|kv| {
                    kv.split_once('=')
                        .is_some_and(|(k, v)| labels.get(k).map(String::as_str) == Some(v))
                });
                if ours {
                    self.reservations.push(w);
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Pod-template annotations Kueue v0.19 writes into a job's templates when
/// it starts it and takes back when it stops it (`podset.FromAssignment`,
/// `jobframework/reconciler.go` `getPodSetsInfoFromStatus`: the Workload's
/// name while `TopologyAwareScheduling` is on, beta and on by default; the
/// slice name of an elastic Workload; TAS's unconstrained-topology marker).
/// Their values name Kueue's bookkeeping (a re-derived Workload has a new
/// name), not the cluster: they change at every re-admission.
pub const ADMISSION_ANNOTATIONS: [&str; 3] = [
    "kueue.x-k8s.io/workload",
    "kueue.x-k8s.io/workload-slice-name",
    "kueue.x-k8s.io/podset-unconstrained-topology",
];
/// Pod-template labels Kueue v0.19 writes alike: the pod set's name
/// (`constants.PodSetLabel`, always) and the queues
/// (`AssignQueueLabelsForPods`, beta and on by default).
pub const ADMISSION_LABELS: [&str; 3] = [
    "kueue.x-k8s.io/podset",
    "kueue.x-k8s.io/local-queue-name",
    "kueue.x-k8s.io/cluster-queue-name",
];
/// The scheduling gate Kueue adds for a topology-aware admission
/// (`kueue.TopologySchedulingGate`) and removes once it placed the pods.
pub const ADMISSION_GATE: &str = "kueue.x-k8s.io/topology";

/// A normalised cluster spec (`headGroupSpec`, `workerGroupSpecs`) without
/// what Kueue writes into its pod templates on admission and takes back on a
/// stop ([`ADMISSION_ANNOTATIONS`], [`ADMISSION_LABELS`], [`ADMISSION_GATE`]),
/// maps and lists left empty removed (`{}` and `[]` mean absent there).
///
/// Used for what *names* a change (its fingerprint and field paths), never
/// for KubeRay's verdict, which hashes them. The ResourceFlavor's node
/// labels and tolerations that Kueue writes into `nodeSelector` and
/// `tolerations` are kept, deliberately: they decide where the pods go (the
/// node fit reads them), raygate cannot tell them from the user's own
/// without reading ResourceFlavors, and Kueue writes the same ones back when
/// it admits the re-derived Workload in the same flavor.
pub fn without_admission_writes(spec: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    fn strip_map(meta: &mut serde_json::Map<String, Value>, field: &str, keys: &[&str]) {
        if let Some(Value::Object(m)) = meta.get_mut(field) {
            for k in keys {
                m.remove(*k);
            }
            if m.is_empty() {
                meta.remove(field);
            }
        }
    }
    fn strip_template(template: &mut Value) {
        let Value::Object(t) = template else {
            return;
        };
        if let Some(Value::Object(meta)) = t.get_mut("metadata") {
            strip_map(meta, "annotations", &ADMISSION_ANNOTATIONS);
            strip_map(meta, "labels", &ADMISSION_LABELS);
            if meta.is_empty() {
                t.remove("metadata");
            }
        }
        if let Some(Value::Object(spec)) = t.get_mut("spec")
            && let Some(Value::Array(gates)) = spec.get_mut("schedulingGates")
        {
            gates.retain(|g| g.get("name").and_then(Value::as_str) != Some(ADMISSION_GATE));
            if gates.is_empty() {
                spec.remove("schedulingGates");
            }
        }
    }
    let mut v = spec.clone();
    if let Some(t) = v.pointer_mut("/headGroupSpec/template") {
        strip_template(t);
    }
    if let Some(Value::Array(groups)) = v.get_mut("workerGroupSpecs") {
        for g in groups {
            if let Some(t) = g.get_mut("template") {
                strip_template(t);
            }
        }
    }
    v
}

/// The name of the Workload slice whose admission Kueue last wrote into a
/// job's pod templates (`kueue.x-k8s.io/workload-slice-name`, else
/// `kueue.x-k8s.io/workload`; the first template, in the job's order, that
/// has one). Kueue's ungater releases an elastic job's pods only by the
/// slice their template carried, so a pending RayCluster still stamped with
/// a Workload the RayService no longer names keeps its pods gated for good
/// (`admission::quota::rebuild`).
pub fn slice_stamp<'a>(
    templates: impl IntoIterator<Item = &'a k8s_openapi::api::core::v1::PodTemplateSpec>,
) -> Option<String> {
    templates.into_iter().find_map(|t| {
        let a = t.metadata.as_ref()?.annotations.as_ref()?;
        a.get(ADMISSION_ANNOTATIONS[1])
            .or_else(|| a.get(ADMISSION_ANNOTATIONS[0]))
            .cloned()
    })
}

/// The remedy for a change Kueue would turn into a suspension.
/// Kueue v0.19's webhook makes `kueue.x-k8s.io/elastic-job` immutable
/// (measured: "field is immutable"), so it is set when the RayService is
/// created, never added to a running one.
/// Suspending it alone first is no way out (measured): Kueue, whose Workload
/// is still admitted, starts it again at once, after KubeRay deleted the
/// serving pods.
pub const REMEDY: &str = "revert spec.rayClusterConfig to the active cluster's; for zero-downtime \
     upgrades the RayService must be created with the annotation kueue.x-k8s.io/elastic-job: \"true\" \
     (Kueue makes it immutable: recreate the RayService with it, or run the new version as a second \
     RayService), see docs/kueue.md; the chart's ValidatingAdmissionPolicy refuses such edits";

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        ObjectMeta {
            labels: map(labels),
            annotations: map(annotations),
            ..Default::default()
        }
    }

    #[test]
    fn managed_by_the_queue_label_elastic_only_with_true() {
        assert_eq!(Managed::of(&meta(&[], &[])), None);
        assert_eq!(Managed::of(&meta(&[(LABEL_QUEUE_NAME, "")], &[])), None);
        let m = Managed::of(&meta(&[(LABEL_QUEUE_NAME, "team-a")], &[])).unwrap();
        assert_eq!((m.queue.as_str(), m.elastic), ("team-a", false));
        assert!(m.behaviour().contains("outage"));
        for (v, elastic) in [("true", true), ("True", false), ("yes", false)] {
            let m = Managed::of(&meta(
                &[(LABEL_QUEUE_NAME, "team-a")],
                &[(ANNOTATION_ELASTIC_JOB, v)],
            ))
            .unwrap();
            assert_eq!(m.elastic, elastic, "{v}");
        }
    }

    #[test]
    fn the_slice_stamp_is_the_slice_name_else_the_workload_first_template_first() {
        let t = |a: serde_json::Value| {
            serde_json::from_value::<k8s_openapi::api::core::v1::PodTemplateSpec>(
                serde_json::json!({"metadata": {"annotations": a}}),
            )
            .unwrap()
        };
        let both = t(
            serde_json::json!({"kueue.x-k8s.io/workload": "rayservice-llm-f18c1",
                                        "kueue.x-k8s.io/workload-slice-name": "rayservice-llm-afd38"}),
        );
        let wl = t(serde_json::json!({"kueue.x-k8s.io/workload": "rayservice-llm-f18c1"}));
        let none = t(serde_json::json!({"a": "b"}));
        assert_eq!(
            slice_stamp([&both, &wl]).as_deref(),
            Some("rayservice-llm-afd38"),
            "the slice name: the chain Kueue's ungater lists pods by"
        );
        assert_eq!(
            slice_stamp([&none, &wl]).as_deref(),
            Some("rayservice-llm-f18c1")
        );
        assert_eq!(slice_stamp([&none]), None);
    }
}
