//! What the apiserver says: head Services, head Pods, RayClusters and RayServices, kept in
//! kube-rs reflector stores, and the pure conversions the router and controls need.

use super::control::{self, Control};
use super::route::{CLUSTER_LABEL, PodInfo, ServiceInfo, ServicePort, TargetPort};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use tokio::task::JoinHandle;

/// Only head pods are ever addressed by KubeRay (`ray.io/node-type=head`).
const HEAD_SELECTOR: &str = "ray.io/node-type=head";
/// KubeRay's labels naming the custom resource a RayCluster was made for.
const ORIGIN_NAME_LABEL: &str = "ray.io/originated-from-cr-name";
const ORIGIN_CRD_LABEL: &str = "ray.io/originated-from-crd";

fn ray_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "ray.io".into(),
        version: "v1".into(),
        api_version: "ray.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

pub struct World {
    services: Store<Service>,
    pods: Store<Pod>,
    clusters: Store<DynamicObject>,
    ray_services: Store<DynamicObject>,
    cluster_ar: ApiResource,
    service_ar: ApiResource,
}

fn spawn_watch<K>(
    name: &'static str,
    api: Api<K>,
    cfg: watcher::Config,
    writer: reflector::store::Writer<K>,
) -> JoinHandle<()>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    tokio::spawn(async move {
        watcher(api, cfg)
            .default_backoff()
            .reflect(writer)
            .applied_objects()
            .for_each(|r| {
                if let Err(e) = r {
                    tracing::warn!(resource = name, error = %e, "watch failed; retrying");
                }
                futures::future::ready(())
            })
            .await;
    })
}

fn spawn_dynamic_watch(
    name: &'static str,
    api: Api<DynamicObject>,
    writer: reflector::store::Writer<DynamicObject>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .applied_objects()
            .for_each(|r| {
                if let Err(e) = r {
                    tracing::warn!(resource = name, error = %e, "watch failed; retrying");
                }
                futures::future::ready(())
            })
            .await;
    })
}

impl World {
    /// Starts the watches; they retry forever (e.g. until KubeRay's CRDs are installed).
    pub fn start(client: &Client) -> (World, Vec<JoinHandle<()>>) {
        let cluster_ar = ray_resource("RayCluster", "rayclusters");
        let service_ar = ray_resource("RayService", "rayservices");
        let (services, sw) = reflector::store::<Service>();
        let (pods, pw) = reflector::store::<Pod>();
        let cw = reflector::store::Writer::<DynamicObject>::new(cluster_ar.clone());
        let clusters = cw.as_reader();
        let rw = reflector::store::Writer::<DynamicObject>::new(service_ar.clone());
        let ray_services = rw.as_reader();
        let tasks = vec![
            spawn_watch(
                "services",
                Api::all(client.clone()),
                watcher::Config::default(),
                sw,
            ),
            spawn_watch(
                "pods",
                Api::all(client.clone()),
                watcher::Config::default().labels(HEAD_SELECTOR),
                pw,
            ),
            spawn_dynamic_watch(
                "rayclusters",
                Api::all_with(client.clone(), &cluster_ar),
                cw,
            ),
            spawn_dynamic_watch(
                "rayservices",
                Api::all_with(client.clone(), &service_ar),
                rw,
            ),
        ];
        let world = World {
            services,
            pods,
            clusters,
            ray_services,
            cluster_ar,
            service_ar,
        };
        (world, tasks)
    }

    /// Waits for the first list of Services and Pods (needed to route anything).
    pub async fn wait_core_ready(&self) -> anyhow::Result<()> {
        self.services.wait_until_ready().await?;
        self.pods.wait_until_ready().await?;
        Ok(())
    }

    /// Whether the RayCluster watch has listed once (so "unknown" means "absent").
    fn clusters_ready(&self) -> bool {
        futures::FutureExt::now_or_never(self.clusters.wait_until_ready()).is_some()
    }

    pub fn routing_snapshot(&self) -> (Vec<ServiceInfo>, Vec<PodInfo>) {
        let services = self
            .services
            .state()
            .iter()
            .map(|s| service_info(s))
            .collect();
        let pods = self.pods.state().iter().map(|p| pod_info(p)).collect();
        (services, pods)
    }

    /// The control annotations in force for a RayCluster, and complaints about bad values.
    pub fn control_for(&self, namespace: &str, cluster: &str) -> (Control, Vec<String>) {
        let key = ObjectRef::new_with(cluster, self.cluster_ar.clone()).within(namespace);
        let Some(rc) = self.clusters.get(&key) else {
            return control::resolve(&BTreeMap::new(), None);
        };
        let rs = ray_service_of(&rc).and_then(|name| {
            self.ray_services
                .get(&ObjectRef::new_with(&name, self.service_ar.clone()).within(namespace))
        });
        control::resolve(rc.annotations(), rs.as_ref().map(|s| s.annotations()))
    }

    /// Every RayCluster the apiserver has, with its control.
    pub fn known_clusters(&self) -> Vec<(String, String, Control)> {
        self.clusters
            .state()
            .iter()
            .filter_map(|rc| {
                let ns = rc.namespace()?;
                let name = rc.name_any();
                let (c, _) = self.control_for(&ns, &name);
                Some((ns, name, c))
            })
            .collect()
    }

    pub fn cluster_exists(&self, namespace: &str, name: &str) -> bool {
        !self.clusters_ready()
            || self
                .clusters
                .get(&ObjectRef::new_with(name, self.cluster_ar.clone()).within(namespace))
                .is_some()
    }
}

/// The RayService a RayCluster belongs to: its controller owner, else KubeRay's origin labels.
pub fn ray_service_of(rc: &DynamicObject) -> Option<String> {
    let owner = rc
        .owner_references()
        .iter()
        .find(|o| o.kind == "RayService" && o.api_version.starts_with("ray.io/"))
        .map(|o| o.name.clone());
    owner.or_else(|| {
        let labels = rc.labels();
        (labels.get(ORIGIN_CRD_LABEL).map(String::as_str) == Some("RayService"))
            .then(|| labels.get(ORIGIN_NAME_LABEL).cloned())
            .flatten()
    })
}

pub fn pod_info(p: &Pod) -> PodInfo {
    let status = p.status.as_ref();
    let ports = p
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.ports.as_ref())
        .map(|ps| {
            ps.iter()
                .map(|cp| (cp.name.clone(), cp.container_port))
                .collect()
        })
        .unwrap_or_default();
    PodInfo {
        namespace: p.namespace().unwrap_or_default(),
        name: p.name_any(),
        uid: p.uid().unwrap_or_default(),
        ip: status
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty()),
        running: status.and_then(|s| s.phase.as_deref()) == Some("Running"),
        labels: p.labels().clone(),
        ports,
    }
}

pub fn service_info(s: &Service) -> ServiceInfo {
    let spec = s.spec.as_ref();
    let ports = spec
        .and_then(|sp| sp.ports.as_ref())
        .map(|ps| {
            ps.iter()
                .map(|p| ServicePort {
                    port: p.port,
                    target: match &p.target_port {
                        None => TargetPort::Same,
                        Some(IntOrString::Int(n)) => TargetPort::Number(*n),
                        Some(IntOrString::String(n)) => match n.parse() {
                            Ok(num) => TargetPort::Number(num),
                            Err(_) => TargetPort::Name(n.clone()),
                        },
                    },
                })
                .collect()
        })
        .unwrap_or_default();
    ServiceInfo {
        namespace: s.namespace().unwrap_or_default(),
        name: s.name_any(),
        selector: spec.and_then(|sp| sp.selector.clone()).unwrap_or_default(),
        ports,
    }
}

/// Whether a pod is a Ray head of some cluster (used only for log context).
pub fn cluster_of(p: &PodInfo) -> Option<&str> {
    p.labels.get(CLUSTER_LABEL).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pod_conversion_reads_kwok_fields() {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "c-head-x", "namespace": "ns", "uid": "u1",
                         "labels": {"ray.io/cluster": "c", "ray.io/node-type": "head"}},
            "spec": {"containers": [{"name": "ray-head", "ports": [
                {"name": "dashboard", "containerPort": 8265}, {"name": "serve", "containerPort": 8000}]}]},
            "status": {"phase": "Running", "podIP": "10.244.1.3"}
        }))
        .expect("pod");
        let i = pod_info(&p);
        assert!(i.running);
        assert_eq!(i.ip.as_deref(), Some("10.244.1.3"));
        assert_eq!(i.ports[1], (Some("serve".into()), 8000));
        assert_eq!(cluster_of(&i), Some("c"));
        let pending: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"}, "status": {"phase": "Pending", "podIP": ""}
        }))
        .expect("pod");
        let i = pod_info(&pending);
        assert!(!i.running);
        assert_eq!(i.ip, None);
    }

    #[test]
    fn service_conversion_keeps_target_ports() {
        let s: Service = serde_json::from_value(json!({
            "metadata": {"name": "c-head-svc", "namespace": "ns"},
            "spec": {"selector": {"ray.io/cluster": "c"}, "ports": [
                {"name": "dashboard", "port": 8265, "targetPort": 8265},
                {"name": "serve", "port": 8000, "targetPort": "serve"},
                {"name": "gcs", "port": 6379}]}
        }))
        .expect("svc");
        let i = service_info(&s);
        assert_eq!(i.ports[0].target, TargetPort::Number(8265));
        assert_eq!(i.ports[1].target, TargetPort::Name("serve".into()));
        assert_eq!(i.ports[2].target, TargetPort::Same);
        assert_eq!(
            i.selector.get("ray.io/cluster").map(String::as_str),
            Some("c")
        );
    }

    #[test]
    fn rayservice_by_owner_or_origin_labels() {
        let owned: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "rs-x", "ownerReferences": [
                {"apiVersion": "ray.io/v1", "kind": "RayService", "name": "rs", "uid": "u", "controller": true}]}
        }))
        .expect("rc");
        assert_eq!(ray_service_of(&owned).as_deref(), Some("rs"));
        let labelled: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "rs-y", "labels": {ORIGIN_CRD_LABEL: "RayService", ORIGIN_NAME_LABEL: "rs2"}}
        }))
        .expect("rc");
        assert_eq!(ray_service_of(&labelled).as_deref(), Some("rs2"));
        let lone: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c"}
        }))
        .expect("rc");
        assert_eq!(ray_service_of(&lone), None);
    }
}
