//! Fake Nodes (the kwok idea, our own code): Node objects with capacity and a Ready
//! condition but no kubelet behind them, so the real kube-scheduler can bind pods to them.
//!
//! No node-lifecycle controller runs in the e2e control plane, so nothing ever marks these
//! nodes NotReady or re-taints them: Ready needs no refreshing. The apiserver's
//! `TaintNodesByCondition` admission plugin does add `node.kubernetes.io/not-ready` at
//! creation; `create` removes it.

use crate::json::now_rfc3339;
use crate::sim::names::FAKE_NODE_LABEL;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;

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
            ("type", "kwok-like"),
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

    /// The status a kubelet would post: capacity = allocatable, Ready, node info.
    pub fn status_json(&self) -> Value {
        let now = now_rfc3339();
        let mut resources = json!({
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods.to_string(),
            "ephemeral-storage": "1Ti",
        });
        if self.gpu > 0 {
            resources[&self.gpu_resource] = json!(self.gpu.to_string());
        }
        let cond = |t: &str, s: &str, reason: &str, msg: &str| {
            json!({"type": t, "status": s, "reason": reason, "message": msg,
                   "lastHeartbeatTime": now, "lastTransitionTime": now})
        };
        json!({"status": {
            "capacity": resources,
            "allocatable": resources,
            "phase": "Running",
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "fake node"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "fake node"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "fake node"),
                cond("Ready", "True", "KubeletReady", "fake node managed by raygate-e2e"),
            ],
            "addresses": [{"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": self.name, "systemUUID": self.name, "bootID": self.name,
                "kernelVersion": "fake", "osImage": "raygate-e2e fake node",
                "containerRuntimeVersion": "fake://0", "kubeletVersion": "v1.20.2-fake",
                "kubeProxyVersion": "v1.20.2-fake", "operatingSystem": "linux", "architecture": "amd64",
            },
        }})
    }

    /// Creates the node, sets its status and strips the admission-added not-ready taint.
    pub async fn create(&self, client: &Client) -> Result<Node> {
        let api: Api<Node> = Api::all(client.clone());
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": self.labels_json(),
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {"taints": self.taints_json()},
        }))?;
        api.create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("create node {}", self.name))?;
        let pp = PatchParams::default();
        api.patch_status(&self.name, &pp, &Patch::Merge(self.status_json()))
            .await
            .with_context(|| format!("set status of node {}", self.name))?;
        // A merge patch replaces the whole taints list: exactly the user's taints remain.
        let taints = if self.taints.is_empty() {
            Value::Null
        } else {
            self.taints_json()
        };
        let node = api
            .patch(
                &self.name,
                &pp,
                &Patch::Merge(json!({"spec": {"taints": taints}})),
            )
            .await
            .with_context(|| format!("set taints of node {}", self.name))?;
        Ok(node)
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
        assert_eq!(s["status"]["allocatable"]["nvidia.com/gpu"], "8");
        assert_eq!(s["status"]["capacity"]["memory"], "256Gi");
        let s = FakeNode::new("n").status_json();
        assert!(s["status"]["allocatable"].get("nvidia.com/gpu").is_none());
    }
}
