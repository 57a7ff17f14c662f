//! The decision on small worlds: a [`Scenario`] says what differs from an
//! idle RayService `llm` serving from `llm-a` on one node of 8 GPUs, and
//! [`Scenario::decide`] runs `decide` with a real fit. The tests follow the
//! rules of [`super::rules`], one file per rule.

use super::*;
use crate::admission::observed::PodRef;
use crate::capacity::ClusterState;
use crate::kuberay::Release;
use crate::upgradeplan::{Phase, TransitionOutcome, UpgradePlanSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::json;
use std::sync::Arc;

mod batching;
mod gate;
mod inputs;
mod pending;
mod tracking;

const NOW: &str = "2026-12-02T12:00:00Z";
/// The `metadata.uid` of the RayService [`service`] describes.
const SERVICE_UID: &str = "9d4c-first";
/// The fingerprint of [`change`].
const FINGERPRINT: &str = "abc123def456";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn plan(spec: serde_json::Value, status: Option<UpgradePlanStatus>) -> UpgradePlan {
    let spec: UpgradePlanSpec = serde_json::from_value(spec).unwrap();
    let mut p = UpgradePlan::new("llm-plan", spec);
    p.metadata.namespace = Some("ml".into());
    p.metadata.generation = Some(2);
    p.status = status;
    p
}

fn auto_plan(status: Option<UpgradePlanStatus>) -> UpgradePlan {
    plan(
        json!({"rayServiceRef": {"name": "llm"}, "stallAfter": "30m"}),
        status,
    )
}

fn gpu_pod(name: &str, gpus: u32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml",
            "labels": {"ray.io/node-type": "worker", "ray.io/group": "gpu"}},
        "spec": {"containers": [{"name": "ray-worker", "resources": {
            "requests": {"cpu": "4", "memory": "16Gi"},
            "limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
    }))
    .unwrap()
}

/// Ready nodes `gpu-0..`, each with these GPUs (also for `incremental_tests`).
pub(super) fn state(gpus_per_node: &[u32]) -> ClusterState {
    let items: Vec<_> = gpus_per_node
        .iter()
        .enumerate()
        .map(|(i, g)| {
            json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": format!("gpu-{i}")},
                "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                    "nvidia.com/gpu": g.to_string()},
                    "conditions": [{"type": "Ready", "status": "True"}]}})
        })
        .collect();
    ClusterState::from_list(json!({"kind": "List", "apiVersion": "v1", "items": items})).unwrap()
}

fn change(pods: Vec<Pod>) -> ChangeFacts {
    ChangeFacts {
        fingerprint: FINGERPRINT.into(),
        triggering_paths: vec![
            "workerGroupSpecs[gpu].template.spec.containers[ray-worker].image".into(),
        ],
        new_pods: pods
            .into_iter()
            .map(crate::capacity::PodGroup::from)
            .collect(),
        surge: None,
    }
}

fn service(active: &str, pending: Option<&str>) -> Result<ServiceFacts, ServiceError> {
    Ok(ServiceFacts {
        uid: Some(SERVICE_UID.into()),
        active_cluster: Some(active.into()),
        pending_cluster: pending.map(Into::into),
        pending_apps: BTreeMap::new(),
        ..Default::default()
    })
}

fn cond<'a>(s: &'a UpgradePlanStatus, t: &str) -> &'a Condition {
    s.conditions.iter().find(|c| c.type_ == t).unwrap()
}

/// Fields of `a` and `b` that differ (for a readable assertion).
fn differing(a: &UpgradePlanStatus, b: &UpgradePlanStatus) -> Vec<String> {
    crate::controller::written::changed_fields(Some(a), b)
}

/// One decision's world. [`Scenario::new`] is an `Auto` plan (`stallAfter:
/// 30m`) of RayService `llm` serving from `llm-a`, nothing pending, one node
/// of 8 GPUs, at [`NOW`]; each method changes one thing.
pub(super) struct Scenario {
    plan: UpgradePlan,
    service: Result<ServiceFacts, ServiceError>,
    change: Result<Option<ChangeFacts>, ChangeError>,
    verdict: Option<Verdict>,
    incremental: Option<Result<incremental::Options, incremental::Problem>>,
    release: Release,
    nodes: ClusterState,
    /// `None`: the RayService's active and pending clusters.
    clusters: Option<BTreeSet<String>>,
    pods: BTreeMap<String, Vec<PodRef>>,
    pending_fingerprint: Option<String>,
    gate: GateFacts,
    now: Timestamp,
}

impl Scenario {
    pub(super) fn new() -> Self {
        Scenario {
            plan: auto_plan(None),
            service: service("llm-a", None),
            change: Ok(None),
            verdict: Some(Verdict::NewCluster),
            incremental: None,
            release: Release::assumed(crate::kuberay::KubeRayVersion::latest()),
            nodes: state(&[8]),
            clusters: None,
            pods: BTreeMap::new(),
            // A pending cluster was built from the change `change` describes.
            pending_fingerprint: Some(FINGERPRINT.into()),
            gate: GateFacts::default(),
            now: now(),
        }
    }

    /// This plan (its status included).
    pub(super) fn plan(mut self, p: &UpgradePlan) -> Self {
        self.plan = p.clone();
        self
    }

    /// A plan of this spec (the status set so far kept).
    pub(super) fn spec(mut self, spec: serde_json::Value) -> Self {
        self.plan = plan(spec, self.plan.status.take());
        self
    }

    /// The plan's status, as the previous decision wrote it.
    pub(super) fn status(mut self, status: UpgradePlanStatus) -> Self {
        self.plan.status = Some(status);
        self
    }

    /// The RayService serves from `active`, no transition under way.
    pub(super) fn serving(self, active: &str) -> Self {
        self.service(service(active, None))
    }

    /// KubeRay is preparing `pending` next to `active`.
    pub(super) fn upgrading(self, active: &str, pending: &str) -> Self {
        self.service(service(active, Some(pending)))
    }

    /// The RayService `ml/llm` does not exist.
    pub(super) fn missing(self) -> Self {
        self.service(Err(ServiceError::NotFound {
            namespace: "ml".into(),
            name: "llm".into(),
        }))
    }

    pub(super) fn service(mut self, s: Result<ServiceFacts, ServiceError>) -> Self {
        self.service = s;
        self
    }

    /// This change is pending.
    pub(super) fn change(self, c: ChangeFacts) -> Self {
        self.change_is(Ok(Some(c)))
    }

    /// What the change detection says, as it is.
    pub(super) fn change_is(mut self, c: Result<Option<ChangeFacts>, ChangeError>) -> Self {
        self.change = c;
        self
    }

    pub(super) fn verdict(mut self, v: Verdict) -> Self {
        self.verdict = Some(v);
        self
    }

    /// `spec.upgradeType: NewClusterWithIncrementalUpgrade`'s options, or
    /// why the RayService cannot be upgraded so.
    pub(super) fn incremental(
        mut self,
        i: Result<incremental::Options, incremental::Problem>,
    ) -> Self {
        self.incremental = Some(i);
        self
    }

    pub(super) fn release(mut self, r: Release) -> Self {
        self.release = r;
        self
    }

    /// Ready nodes with these GPUs each ([`state`]).
    pub(super) fn capacity(self, gpus_per_node: &[u32]) -> Self {
        self.nodes(&state(gpus_per_node))
    }

    pub(super) fn nodes(mut self, st: &ClusterState) -> Self {
        self.nodes = st.clone();
        self
    }

    /// The RayClusters that exist, when not the RayService's own two.
    pub(super) fn clusters(mut self, names: &[&str]) -> Self {
        self.clusters = Some(names.iter().map(|s| s.to_string()).collect());
        self
    }

    pub(super) fn pods(mut self, pods: BTreeMap<String, Vec<PodRef>>) -> Self {
        self.pods = pods;
        self
    }

    /// The fingerprint of the pending cluster's spec (`None`: not readable
    /// yet).
    pub(super) fn built_from(mut self, fingerprint: Option<&str>) -> Self {
        self.pending_fingerprint = fingerprint.map(Into::into);
        self
    }

    pub(super) fn gate(mut self, g: GateFacts) -> Self {
        self.gate = g;
        self
    }

    pub(super) fn at(mut self, t: Timestamp) -> Self {
        self.now = t;
        self
    }

    /// `decide` with a real fit against the nodes: the one place a test
    /// builds [`Inputs`] (a field added to it is added here).
    pub(super) fn decide(self) -> Decision {
        let clusters = self.clusters.unwrap_or_else(|| {
            let svc = self.service.as_ref().ok();
            let active = svc.and_then(|s| s.active_cluster.clone());
            let pending = svc.and_then(|s| s.pending_cluster.clone());
            active.into_iter().chain(pending).collect()
        });
        decide(&Inputs {
            now: self.now,
            plan: &self.plan,
            settings: Settings::of(&self.plan),
            release: self.release,
            service: self.service,
            change: self.change,
            verdict: self.verdict,
            incremental: self.incremental,
            clusters,
            pods: self.pods,
            pending_ready: false,
            pending_fingerprint: self.pending_fingerprint.map(Into::into),
            pending_stamp: Default::default(),
            gate: self.gate,
            admission_unseen: false,
            quota: None,
            capacity_request: None,
            cluster: &fit::Alone(&self.nodes),
        })
    }
}

/// The status of [`change`] (one 8-GPU worker) admitted on the idle world.
fn admitted_status() -> UpgradePlanStatus {
    Scenario::new()
        .change(change(vec![gpu_pod("w0", 8)]))
        .decide()
        .status
}
