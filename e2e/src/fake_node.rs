//! Fake Nodes run by kwok: Node objects with capacity, labels and taints, annotated so that
//! the control plane's kwok manages them (posts Ready, renews their lease, and runs the pods
//! bound to them: Running/Ready, pod IPs, deletion). The real kube-scheduler binds pods to
//! them; the real node-lifecycle controller removes the `not-ready` taint the apiserver's
//! admission adds at creation once kwok reports Ready.

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

/// Label on every Node a test creates, so tests and humans can list (and clean up) them.
pub const FAKE_NODE_LABEL: &str = "raygate.io/fake-node";

/// The annotation kwok selects its nodes by (`--manage-nodes-with-annotation-selector`).
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// Its value.
pub const KWOK_NODE_ANNOTATION_VALUE: &str = "fake";
/// The taint admission puts on every new Node until it is Ready.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: String,
}

impl Taint {
    /// Parses `key=value:Effect` or `key:Effect`.
    pub fn parse(s: &str) -> Result<Taint> {
        let Some((kv, effect)) = s.rsplit_once(':') else {
            bail!("taint {s:?} must look like key=value:Effect");
        };
        if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
            bail!("taint effect {effect:?} must be NoSchedule, PreferNoSchedule or NoExecute");
        }
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        if key.is_empty() {
            bail!("taint {s:?} has an empty key");
        }
        Ok(Taint {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
        })
    }
}

/// Builder for one fake node.
#[derive(Debug, Clone)]
pub struct FakeNode {
    pub name: String,
    pub cpu: String,
    pub memory: String,
    pub gpu: u32,
    pub gpu_resource: String,
    pub pods: u32,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
}

impl FakeNode {
    /// A node with 32 CPUs, 256Gi, no GPUs, 110 pods.
    pub fn new(name: impl Into<String>) -> FakeNode {
        FakeNode {
            name: name.into(),
            cpu: "32".into(),
            memory: "256Gi".into(),
            gpu: 0,
            gpu_resource: "nvidia.com/gpu".into(),
            pods: 110,
            labels: BTreeMap::new(),
            taints: Vec::new(),
        }
    }
    pub fn cpu(mut self, cpu: impl Into<String>) -> Self {
        self.cpu = cpu.into();
        self
    }
    pub fn memory(mut self, memory: impl Into<String>) -> Self {
        self.memory = memory.into();
        self
    }
    pub fn gpu(mut self, gpu: u32) -> Self {
        self.gpu = gpu;
        self
    }
    pub fn gpu_resource(mut self, resource: impl Into<String>) -> Self {
        self.gpu_resource = resource.into();
        self
    }
    pub fn pods(mut self, pods: u32) -> Self {
        self.pods = pods;
        self
    }
    pub fn label(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    pub fn taint(mut self, t: Taint) -> Self {
        self.taints.push(t);
        self
    }
    /// The same node under another name (for `--count`).
    pub fn renamed(&self, name: impl Into<String>) -> FakeNode {
        FakeNode {
            name: name.into(),
            ..self.clone()
        }
    }

    fn labels_json(&self) -> Value {
        let mut l = serde_json::Map::new();
        for (k, v) in [
            ("kubernetes.io/hostname", self.name.as_str()),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
            ("beta.kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/arch", "amd64"),
            ("type", "kwok"),
            (FAKE_NODE_LABEL, "true"),
        ] {
            l.insert(k.into(), json!(v));
        }
        for (k, v) in &self.labels {
            l.insert(k.clone(), json!(v));
        }
        Value::Object(l)
    }

    fn taints_json(&self) -> Value {
        json!(
            self.taints
                .iter()
                .map(|t| {
                    let mut j = json!({"key": t.key, "effect": t.effect});
                    if !t.value.is_empty() {
                        j["value"] = json!(t.value);
                    }
                    j
                })
                .collect::<Vec<_>>()
        )
    }

    /// The status a kubelet would report about its resources: capacity = allocatable. kwok
    /// keeps them and adds conditions, addresses and node info.
    pub fn status_json(&self) -> Value {
        let mut resources = json!({
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods.to_string(),
            "ephemeral-storage": "1Ti",
        });
        if self.gpu > 0 {
            resources[&self.gpu_resource] = json!(self.gpu.to_string());
        }
        json!({"capacity": resources, "allocatable": resources})
    }

    /// The Node object, status included (the apiserver keeps a Node's status on create, so
    /// kwok never sees it without its capacity).
    pub fn object_json(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": self.labels_json(),
                "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE},
            },
            "spec": {"taints": self.taints_json()},
            "status": self.status_json(),
        })
    }

    /// Creates the node and waits until kwok reports it Ready and the node-lifecycle
    /// controller has removed the not-ready taint, so the scheduler can use it at once.
    pub async fn create(&self, client: &Client) -> Result<Node> {
        let api: Api<Node> = Api::all(client.clone());
        let node: Node = serde_json::from_value(self.object_json())?;
        api.create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("create node {}", self.name))?;
        let name = self.name.clone();
        crate::wait_for(
            &format!("node {name} Ready (kwok) and without the not-ready taint"),
            Duration::from_secs(60),
            || async {
                let n = api.get(&name).await?;
                let v = serde_json::to_value(&n)?;
                let ready = crate::json::arr_at(&v, &["status", "conditions"])
                    .iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                let tainted = crate::json::arr_at(&v, &["spec", "taints"])
                    .iter()
                    .any(|t| t["key"] == NOT_READY_TAINT);
                Ok(if ready && !tainted {
                    crate::Check::Done(n)
                } else {
                    crate::Check::NotYet(format!("ready={ready} not-ready-taint={tainted}"))
                })
            },
        )
        .await
    }
}

/// Deletes fake nodes by name (404 is fine).
pub async fn delete_nodes(client: &Client, names: &[String]) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    for n in names {
        match api.delete(n, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(anyhow::Error::new(e).context(format!("delete node {n}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_taints() {
        let t = Taint::parse("gpu=true:NoSchedule").unwrap();
        assert_eq!(
            (t.key.as_str(), t.value.as_str(), t.effect.as_str()),
            ("gpu", "true", "NoSchedule")
        );
        assert_eq!(Taint::parse("dedicated:NoExecute").unwrap().value, "");
        assert!(Taint::parse("x=y").is_err());
        assert!(Taint::parse("x=y:Sometimes").is_err());
    }

    #[test]
    fn status_has_gpu_capacity() {
        let s = FakeNode::new("n").gpu(8).status_json();
        assert_eq!(s["allocatable"]["nvidia.com/gpu"], "8");
        assert_eq!(s["capacity"]["memory"], "256Gi");
        let s = FakeNode::new("n").status_json();
        assert!(s["allocatable"].get("nvidia.com/gpu").is_none());
    }

    #[test]
    fn object_is_managed_by_kwok() {
        let o = FakeNode::new("n")
            .taint(Taint::parse("gpu=true:NoSchedule").unwrap())
            .object_json();
        assert_eq!(o["metadata"]["annotations"][KWOK_NODE_ANNOTATION], "fake");
        assert_eq!(o["spec"]["taints"][0]["key"], "gpu");
        assert_eq!(o["status"]["allocatable"]["cpu"], "32");
    }
}
