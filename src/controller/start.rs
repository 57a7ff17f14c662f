//! Starting the caches and the plan watcher: each relevant change wakes
//! the plans it concerns.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::{StreamExt, future};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::LimitRange;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tracing::{info, warn};

use super::observe::Stores;
use super::{Settings, buffers, cache, latency, lists, reservations};
use crate::kuberay::{LABEL_ORIGINATED_FROM_CR_NAME, RayCluster, RayService};
use crate::sync::lock;
use crate::upgradeplan::{Fingerprint, PlanKey, UpgradePlan};
use crate::{Error, Result};

/// Plans that reference a RayService.
fn plans_for(plans: &Store<UpgradePlan>, ns: &str, svc: &str) -> Vec<ObjectRef<UpgradePlan>> {
    plans
        .state()
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(ns) && p.spec.ray_service_ref.name == svc)
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// A plan's `spec.approve` set or changed (after its first sighting) is an
/// event that can let its upgrade through; any plan event queues it.
fn note_plan(
    causes: &latency::Causes,
    approvals: &mut HashMap<PlanKey, Option<Fingerprint>>,
    plan: &UpgradePlan,
) {
    let key = plan.key();
    let now = Timestamp::now();
    causes.queued([&key], now);
    let approve = plan.spec.approve.clone().filter(|a| !a.is_empty());
    let before = approvals.insert(key.clone(), approve.clone());
    if let (Some(before), Some(a)) = (before, approve)
        && before.as_ref() != Some(&a)
    {
        let object = format!("upgradeplan/{}/{}", key.namespace, key.name);
        info!(stage = "event received", cause = "approval", object = %object, fingerprint = %a, "plan approved");
        causes.note(latency::Cause {
            kind: latency::CauseKind::Approval,
            object,
            at: now,
            resources: vec![],
            plan: Some(key),
        });
    }
}

/// A RayService's spec changed (its generation moved, after its first
/// sighting): an event that can let its plans' upgrade through at once.
fn note_service(
    causes: &latency::Causes,
    generations: &std::sync::Mutex<HashMap<(String, String), Option<i64>>>,
    meta: &kube::api::ObjectMeta,
    plans: &[ObjectRef<UpgradePlan>],
) {
    let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
        return;
    };
    let now = Timestamp::now();
    let keys: Vec<PlanKey> = plans.iter().map(PlanKey::from).collect();
    causes.queued(&keys, now);
    let mut generations = lock(generations);
    let before = generations.insert((ns.clone(), name.clone()), meta.generation);
    if before.is_none() || before == Some(meta.generation) {
        return;
    }
    let object = format!("rayservice/{ns}/{name}");
    info!(stage = "event received", cause = "rayservice", object = %object, "RayService spec changed");
    for key in keys {
        causes.note(latency::Cause {
            kind: latency::CauseKind::RayService,
            object: object.clone(),
            at: now,
            resources: vec![],
            plan: Some(key),
        });
    }
}

/// Start a cache: a watcher that slims objects, fills a store, and sends the
/// plans to wake for each relevant change into `tx`.
pub(super) fn spawn_cache<K, S, P, M>(
    events: impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    slim: S,
    predicate: P,
    mapper: M,
    tx: mpsc::UnboundedSender<ObjectRef<UpgradePlan>>,
) -> Store<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
    S: FnMut(&mut K) + Send + 'static,
    P: Fn(&K) -> Option<u64> + Send + 'static,
    M: Fn(&K) -> Vec<ObjectRef<UpgradePlan>> + Send + 'static,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&Default::default()).to_string();
    let stream = events
        .modify(slim)
        .reflect(writer)
        .touched_objects()
        .predicate_filter(predicate, Default::default())
        .for_each(move |ev| {
            match ev {
                Ok(obj) => {
                    for r in mapper(&obj) {
                        let _ = tx.unbounded_send(r);
                    }
                }
                Err(e) => warn!(kind = %kind, error = %e, "watch error"),
            }
            future::ready(())
        });
    tokio::spawn(stream);
    reader
}

/// The caches a controller reads besides the plans': spawned, filling.
pub(super) struct Caches {
    services: Store<DeserializeGuard<RayService>>,
    clusters: Store<DeserializeGuard<RayCluster>>,
    capacity: cache::SharedIndex,
    capacity_ready: cache::IndexReady,
    limit_ranges: Store<LimitRange>,
    runtime_classes: Store<RuntimeClass>,
    buffers: buffers::Shell,
    reservations: reservations::Shell,
}

impl Caches {
    /// Waits until every cache has listed once; the stores to decide on.
    /// `kueue_missing`: the start-up probe found Kueue's API or access
    /// missing (`--kueue=true`): its caches are not waited for.
    pub(super) async fn synced(
        self,
        plans: Store<UpgradePlan>,
        kueue_missing: bool,
    ) -> Result<(Stores, buffers::Shell, reservations::Shell)> {
        for (what, ready) in [
            (
                "RayServices",
                self.services.wait_until_ready().await.is_ok(),
            ),
            (
                "RayClusters",
                self.clusters.wait_until_ready().await.is_ok(),
            ),
            ("Pods and Nodes", self.capacity_ready.wait().await),
            (
                "LimitRanges",
                self.limit_ranges.wait_until_ready().await.is_ok(),
            ),
            (
                "RuntimeClasses",
                self.runtime_classes.wait_until_ready().await.is_ok(),
            ),
        ] {
            if !ready {
                return Err(Error::invalid(
                    "cache",
                    format!("{what} cache did not sync"),
                ));
            }
        }
        self.buffers.wait_ready().await;
        if !kueue_missing {
            self.reservations.wait_ready().await;
        }
        let stores = Stores {
            plans,
            services: self.services,
            clusters: self.clusters,
            capacity: self.capacity,
            pass: Default::default(),
            limit_ranges: self.limit_ranges,
            runtime_classes: self.runtime_classes,
        };
        Ok((stores, self.buffers, self.reservations))
    }
}

/// The plan watcher and the controller over it: every plan event is noted
/// in `causes` (an approval can let an upgrade through). With several
/// namespaces, one watcher per namespace ([`cache::scoped_watcher`]), so
/// that reads need only Roles there.
pub(super) fn plan_controller(
    client: &Client,
    ns: &[String],
    lists: lists::InitialLists,
    causes: &Arc<latency::Causes>,
) -> (Controller<UpgradePlan>, Store<UpgradePlan>) {
    let (plans, plan_writer) = reflector::store();
    let mut approvals = std::collections::HashMap::new();
    let noted = causes.clone();
    let plan_events =
        cache::scoped_watcher::<UpgradePlan>(client, ns, lists.config().any_semantic())
            .reflect(plan_writer)
            .applied_objects()
            .inspect(move |p| {
                if let Ok(p) = p {
                    note_plan(&noted, &mut approvals, p);
                }
            });
    // No debounce: a plan's own events (an approval, a spec change) are
    // reconciled at once; the caches' wake-ups are gathered by `coalesce`.
    let controller = Controller::for_stream(plan_events, plans.clone())
        .with_config(ControllerConfig::default().debounce(Duration::ZERO));
    (controller, plans)
}

/// Starts every cache but the plans': each relevant change sends the plans
/// it concerns into `tx`.
pub(super) fn spawn_caches(
    client: &Client,
    settings: &Settings,
    plans: &Store<UpgradePlan>,
    causes: &Arc<latency::Causes>,
    tx: mpsc::UnboundedSender<ObjectRef<UpgradePlan>>,
) -> Caches {
    let ns = &settings.namespaces;
    let lists = settings.initial_lists;
    let p = plans.clone();
    let services = spawn_cache(
        cache::slimmed_watcher::<DeserializeGuard<RayService>>(
            client,
            ns,
            lists.config(),
            cache::slim_service,
        ),
        |_| {},
        cache::service_changes,
        {
            let (causes, generations) = (causes.clone(), std::sync::Mutex::new(HashMap::new()));
            move |s: &DeserializeGuard<RayService>| {
                let meta = cache::guard_meta(s);
                let plans = match (&meta.namespace, &meta.name) {
                    (Some(ns), Some(n)) => plans_for(&p, ns, n),
                    _ => vec![],
                };
                note_service(&causes, &generations, meta, &plans);
                plans
            }
        },
        tx.clone(),
    );
    let p = plans.clone();
    let clusters = spawn_cache(
        cache::slimmed_watcher::<DeserializeGuard<RayCluster>>(
            client,
            ns,
            lists.config().labels(LABEL_ORIGINATED_FROM_CR_NAME),
            cache::slim_cluster,
        ),
        |_| {},
        cache::cluster_changes,
        move |c: &DeserializeGuard<RayCluster>| {
            cache::cluster_service(c)
                .map(|(ns, svc)| plans_for(&p, &ns, &svc))
                .unwrap_or_default()
        },
        tx.clone(),
    );
    // Pods map to plans through their cluster's origin label.
    let (p, cl, tx_pods, tx_nodes) = (plans.clone(), clusters.clone(), tx.clone(), tx.clone());
    let p_all = plans.clone();
    let (queued_pods, queued_nodes) = (causes.clone(), causes.clone());
    let (capacity, capacity_ready) = cache::spawn_capacity_index(
        client.clone(),
        &settings.dra_plain_count,
        lists,
        causes.clone(),
        move |ns, cluster| {
            let plans = cl
                .get(&ObjectRef::new(cluster).within(ns))
                .and_then(|c| cache::cluster_service(&c))
                .map(|(ns, svc)| plans_for(&p, &ns, &svc))
                .unwrap_or_default();
            let keys: Vec<PlanKey> = plans.iter().map(PlanKey::from).collect();
            queued_pods.queued(&keys, Timestamp::now());
            for r in plans {
                let _ = tx_pods.unbounded_send(r);
            }
        },
        move || {
            let plans = p_all.state();
            let keys: Vec<PlanKey> = plans.iter().map(|x| x.key()).collect();
            queued_nodes.queued(&keys, Timestamp::now());
            for x in plans.iter() {
                let _ = tx_nodes.unbounded_send(ObjectRef::from_obj(x.as_ref()));
            }
        },
    );
    let limit_ranges = spawn_cache(
        // Defaults for the pods a RayCluster will create, in its own namespace.
        cache::scoped_watcher::<LimitRange>(client, ns, lists.config()),
        cache::slim_limit_range,
        |_: &LimitRange| None,
        |_: &LimitRange| vec![],
        tx.clone(),
    );
    let buffers = buffers::Shell::spawn(
        client,
        ns,
        settings.capacity.clone(),
        lists,
        plans.clone(),
        tx.clone(),
    );
    let reservations =
        reservations::Shell::spawn(client, ns, settings.kueue, lists, plans.clone(), tx.clone());
    let runtime_classes = spawn_cache(
        watcher(Api::<RuntimeClass>::all(client.clone()), lists.config()).default_backoff(),
        cache::slim_runtime_class,
        |_: &RuntimeClass| None,
        |_: &RuntimeClass| vec![],
        tx,
    );
    Caches {
        services,
        clusters,
        capacity,
        capacity_ready,
        limit_ranges,
        runtime_classes,
        buffers,
        reservations,
    }
}
