//! kuberay-sim: a stand-in for the KubeRay v1.7.0 operator on the RayService upgrade path.
//!
//! Level-triggered: every pass lists RayServices, RayClusters, Pods and fake Nodes and
//! reconciles all of them, so there is no cache to go stale. Passes run every `resync`
//! interval and right after any watch event on those kinds.

pub mod cluster;
pub mod conditions;
pub mod hash;
pub mod kube;
pub mod kubelet;
pub mod names;
pub mod pods;
pub mod serve;
pub mod service;

use self::kube::{Kube, Resources, is_conflict, is_not_found};
use crate::json::str_at;
use ::kube::Client;
use ::kube::api::{Api, DynamicObject, ListParams};
use ::kube::runtime::watcher;
use anyhow::Result;
use futures::StreamExt;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// (namespace, name).
pub type ClusterKey = (String, String);

/// Simulator settings.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Only this namespace (None: all namespaces).
    pub namespace: Option<String>,
    /// Replaces every RayService's `rayClusterDeletionDelaySeconds`.
    pub deletion_delay_override: Option<Duration>,
    /// Periodic requeue, like KubeRay's 2 s `ServiceDefaultRequeueDuration`.
    pub resync: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            namespace: None,
            deletion_delay_override: None,
            resync: Duration::from_secs(1),
        }
    }
}

/// In-memory controller state, as KubeRay keeps it (lost on restart).
#[derive(Debug, Default)]
pub struct SimState {
    /// When each dangling RayCluster may be deleted (`RayClusterDeletionTimestamps`).
    pub deletion_at: HashMap<ClusterKey, Instant>,
    /// Which cluster each RayService's serve Service selects.
    pub serve_target: HashMap<ClusterKey, String>,
}

/// A running simulator's reconcile loop.
pub struct Sim {
    k: Kube,
    opts: SimOptions,
    state: SimState,
}

impl Sim {
    pub fn new(client: Client, opts: SimOptions) -> Sim {
        let k = Kube {
            client,
            res: Resources::default(),
            namespace: opts.namespace.clone(),
        };
        Sim {
            k,
            opts,
            state: SimState::default(),
        }
    }

    /// Runs until the future is dropped. Transient API errors are logged and retried.
    pub async fn run(mut self) -> Result<()> {
        let notify = Arc::new(Notify::new());
        let watches = self.spawn_watches(notify.clone());
        let _abort = AbortOnDrop(watches);
        tracing::info!(namespace = ?self.opts.namespace, "kuberay-sim started");
        loop {
            if let Err(e) = self.pass().await {
                if is_conflict(&e) || is_not_found(&e) {
                    tracing::debug!(error = %format!("{e:#}"), "pass raced with another writer; retrying");
                } else {
                    tracing::warn!(error = %format!("{e:#}"), "reconcile pass failed");
                }
            }
            tokio::select! {
                _ = notify.notified() => {
                    // Coalesce bursts of events (our own writes trigger them too).
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ = tokio::time::sleep(self.opts.resync) => {}
            }
        }
    }

    fn spawn_watches(&self, notify: Arc<Notify>) -> Vec<tokio::task::JoinHandle<()>> {
        let res = &self.k.res;
        let mut out = Vec::new();
        for (ar, namespaced) in [
            (res.ray_service.clone(), true),
            (res.ray_cluster.clone(), true),
            (res.pod.clone(), true),
            (res.node.clone(), false),
        ] {
            let api: Api<DynamicObject> = match (&self.opts.namespace, namespaced) {
                (Some(ns), true) => Api::namespaced_with(self.k.client.clone(), ns, &ar),
                _ => Api::all_with(self.k.client.clone(), &ar),
            };
            let notify = notify.clone();
            out.push(tokio::spawn(async move {
                let mut stream = watcher(api, watcher::Config::default()).boxed();
                while let Some(ev) = stream.next().await {
                    match ev {
                        Ok(_) => notify.notify_one(),
                        Err(e) => {
                            tracing::debug!(kind = %ar.kind, error = %e, "watch error; the watcher retries");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
            }));
        }
        out
    }

    /// One level-triggered pass over everything in scope.
    pub async fn pass(&mut self) -> Result<()> {
        let k = &self.k;
        let lp = ListParams::default();
        let nodes = k
            .list(
                &k.res.node,
                &ListParams::default().labels(&format!("{}=true", names::FAKE_NODE_LABEL)),
            )
            .await?;
        let fake_nodes: BTreeSet<String> = nodes
            .iter()
            .map(|n| str_at(n, &["metadata", "name"]).to_string())
            .collect();
        let pods = k.list(&k.res.pod, &lp).await?;
        let pods = kubelet::run_pods(k, pods, &fake_nodes).await;

        let mut clusters: BTreeMap<ClusterKey, Value> = BTreeMap::new();
        for c in k.list(&k.res.ray_cluster, &lp).await? {
            let key = (
                str_at(&c, &["metadata", "namespace"]).to_string(),
                str_at(&c, &["metadata", "name"]).to_string(),
            );
            let stored = match cluster::reconcile(k, &c, &pods).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(cluster = %key.1, error = %format!("{e:#}"), "RayCluster reconcile failed");
                    c
                }
            };
            clusters.insert(key, stored);
        }
        // Forget deletion schedules of clusters that are gone.
        self.state
            .deletion_at
            .retain(|k, _| clusters.contains_key(k));

        let services = k.list(&k.res.ray_service, &lp).await?;
        let live: BTreeSet<ClusterKey> = services
            .iter()
            .map(|s| {
                (
                    str_at(s, &["metadata", "namespace"]).to_string(),
                    str_at(s, &["metadata", "name"]).to_string(),
                )
            })
            .collect();
        self.state.serve_target.retain(|k, _| live.contains(k));
        for svc in &services {
            if let Err(e) =
                service::reconcile(k, &mut self.state, &self.opts, svc, &clusters, &pods).await
            {
                let name = str_at(svc, &["metadata", "name"]);
                if is_conflict(&e) {
                    tracing::debug!(
                        service = name,
                        "status write conflicted; retrying next pass"
                    );
                } else {
                    tracing::warn!(service = name, error = %format!("{e:#}"), "RayService reconcile failed");
                }
            }
        }
        Ok(())
    }
}

struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

/// Runs the simulator until the returned future is dropped.
pub async fn run(client: Client, opts: SimOptions) -> Result<()> {
    Sim::new(client, opts).run().await
}
