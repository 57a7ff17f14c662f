//! Which Ray head a proxied request is for. KubeRay addresses the dashboard by the head
//! Service's cluster DNS name and the Serve proxy by the head pod's IP; we resolve both the way
//! cluster DNS and kube-proxy would (Service -> selector -> running pod -> container port), from
//! the apiserver's objects, and never connect anywhere.

use super::serve::HeadNode;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// KubeRay's `RayClusterLabelKey`.
pub const CLUSTER_LABEL: &str = "ray.io/cluster";
/// Ray's default dashboard and Serve HTTP ports (KubeRay's `DefaultDashboardPort`, `DefaultServingPort`).
const DEFAULT_DASHBOARD_PORT: i32 = 8265;
const DEFAULT_SERVE_PORT: i32 = 8000;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub ip: Option<String>,
    pub running: bool,
    pub labels: BTreeMap<String, String>,
    /// Named ports of the Ray container (`containers[0]`, KubeRay's `RayContainerIndex`).
    pub ports: Vec<(Option<String>, i32)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TargetPort {
    /// Unset: the Service port number itself.
    Same,
    Number(i32),
    Name(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServicePort {
    pub port: i32,
    pub target: TargetPort,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceInfo {
    pub namespace: String,
    pub name: String,
    pub selector: BTreeMap<String, String>,
    pub ports: Vec<ServicePort>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Dashboard,
    ServeProxy,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub namespace: String,
    pub cluster: String,
    pub head: HeadNode,
    pub role: Role,
}

/// How the request fails; both become a 502 from the proxy, as a dial error would.
#[derive(Clone, Debug, PartialEq)]
pub enum RouteError {
    /// Like `dial tcp: lookup <host>: no such host`.
    NoSuchHost(String),
    /// Like `dial tcp <addr>: connect: connection refused`.
    Refused(String),
}

impl std::fmt::Display for RouteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RouteError::NoSuchHost(m) => write!(f, "no such host: {m}"),
            RouteError::Refused(m) => write!(f, "connection refused: {m}"),
        }
    }
}

/// Resolves `host:port` of an absolute-form request.
pub fn route(
    host: &str,
    port: u16,
    cluster_domain: &str,
    services: &[ServiceInfo],
    pods: &[PodInfo],
) -> Result<Target, RouteError> {
    let port = i32::from(port);
    if host.parse::<Ipv4Addr>().is_ok() {
        let pod = pods
            .iter()
            .find(|p| p.running && p.ip.as_deref() == Some(host))
            .ok_or_else(|| RouteError::Refused(format!("no running Ray head pod has IP {host}")))?;
        return target(pod, port, &format!("{host}:{port}"));
    }
    let (svc_name, namespace) = split_service_host(host, cluster_domain)
        .ok_or_else(|| RouteError::NoSuchHost(host.to_string()))?;
    let svc = services
        .iter()
        .find(|s| s.name == svc_name && s.namespace == namespace)
        .ok_or_else(|| RouteError::NoSuchHost(host.to_string()))?;
    let addr = format!("{host}:{port}");
    let sp = svc
        .ports
        .iter()
        .find(|p| p.port == port)
        .ok_or_else(|| RouteError::Refused(format!("{addr}: Service has no port {port}")))?;
    if svc.selector.is_empty() {
        return Err(RouteError::Refused(format!(
            "{addr}: Service has no selector"
        )));
    }
    let mut backends: Vec<&PodInfo> = pods
        .iter()
        .filter(|p| {
            p.namespace == svc.namespace
                && p.running
                && p.ip.is_some()
                && svc.selector.iter().all(|(k, v)| p.labels.get(k) == Some(v))
        })
        .collect();
    backends.sort_by(|a, b| a.name.cmp(&b.name));
    let pod = backends
        .first()
        .ok_or_else(|| RouteError::Refused(format!("{addr}: no running pod behind the Service")))?;
    let container_port = match &sp.target {
        TargetPort::Same => port,
        TargetPort::Number(n) => *n,
        TargetPort::Name(name) => pod
            .ports
            .iter()
            .find(|(n, _)| n.as_deref() == Some(name.as_str()))
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                RouteError::Refused(format!("{addr}: pod {} has no port named {name}", pod.name))
            })?,
    };
    target(pod, container_port, &addr)
}

/// `<service>.<namespace>.svc.<cluster domain>` (optionally with the root dot).
fn split_service_host<'a>(host: &'a str, cluster_domain: &str) -> Option<(&'a str, &'a str)> {
    let host = host.strip_suffix('.').unwrap_or(host);
    let domain = cluster_domain.trim_matches('.');
    let rest = host.strip_suffix(domain)?.strip_suffix(".svc.")?;
    let (svc, ns) = rest.split_once('.')?;
    (!svc.is_empty() && !ns.is_empty() && !ns.contains('.')).then_some((svc, ns))
}

fn target(pod: &PodInfo, container_port: i32, addr: &str) -> Result<Target, RouteError> {
    let declared = pod.ports.iter().find(|(_, p)| *p == container_port);
    let role = match declared.and_then(|(n, _)| n.as_deref()) {
        Some("dashboard") => Some(Role::Dashboard),
        Some("serve") => Some(Role::ServeProxy),
        Some(_) => None,
        None if declared.is_some() => None,
        None if container_port == DEFAULT_DASHBOARD_PORT => Some(Role::Dashboard),
        None if container_port == DEFAULT_SERVE_PORT => Some(Role::ServeProxy),
        None => None,
    }
    .ok_or_else(|| {
        RouteError::Refused(format!(
            "{addr}: port {container_port} of pod {}/{} is not Ray's dashboard or Serve HTTP port",
            pod.namespace, pod.name
        ))
    })?;
    let cluster = pod.labels.get(CLUSTER_LABEL).ok_or_else(|| {
        RouteError::Refused(format!(
            "{addr}: pod {} has no {CLUSTER_LABEL} label",
            pod.name
        ))
    })?;
    Ok(Target {
        namespace: pod.namespace.clone(),
        cluster: cluster.clone(),
        head: HeadNode {
            pod_uid: pod.uid.clone(),
            pod_ip: pod.ip.clone().unwrap_or_default(),
        },
        role,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn head(name: &str, cluster: &str, ip: &str, running: bool) -> PodInfo {
        PodInfo {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            ip: Some(ip.into()),
            running,
            labels: labels(&[(CLUSTER_LABEL, cluster), ("ray.io/node-type", "head")]),
            ports: vec![
                (Some("gcs-server".into()), 6379),
                (Some("dashboard".into()), 8265),
                (Some("serve".into()), 8000),
            ],
        }
    }

    fn head_svc(name: &str, cluster: &str) -> ServiceInfo {
        ServiceInfo {
            namespace: "ns".into(),
            name: name.into(),
            selector: labels(&[(CLUSTER_LABEL, cluster), ("ray.io/node-type", "head")]),
            ports: vec![
                ServicePort {
                    port: 6379,
                    target: TargetPort::Same,
                },
                ServicePort {
                    port: 8265,
                    target: TargetPort::Number(8265),
                },
                ServicePort {
                    port: 8000,
                    target: TargetPort::Name("serve".into()),
                },
            ],
        }
    }

    const D: &str = "cluster.local";

    #[test]
    fn dashboard_by_head_service_fqdn() {
        let svcs = [head_svc("rs-abc-head-svc", "rs-abc")];
        let pods = [head("rs-abc-head", "rs-abc", "10.244.0.7", true)];
        let t = route(
            "rs-abc-head-svc.ns.svc.cluster.local",
            8265,
            D,
            &svcs,
            &pods,
        )
        .expect("routed");
        assert_eq!(t.cluster, "rs-abc");
        assert_eq!(t.namespace, "ns");
        assert_eq!(t.role, Role::Dashboard);
        assert_eq!(t.head.pod_ip, "10.244.0.7");
        let t = route(
            "rs-abc-head-svc.ns.svc.cluster.local.",
            8000,
            D,
            &svcs,
            &pods,
        )
        .expect("routed");
        assert_eq!(t.role, Role::ServeProxy);
    }

    #[test]
    fn serve_proxy_by_pod_ip() {
        let pods = [
            head("old", "c1", "10.244.0.9", false),
            head("new", "c2", "10.244.0.9", true),
        ];
        let t = route("10.244.0.9", 8000, D, &[], &pods).expect("routed");
        assert_eq!((t.cluster.as_str(), t.role), ("c2", Role::ServeProxy));
    }

    #[test]
    fn unknown_names_fail_like_dns() {
        let svcs = [head_svc("a-head-svc", "a")];
        for host in [
            "b-head-svc.ns.svc.cluster.local",
            "a-head-svc.other.svc.cluster.local",
            "a-head-svc.ns.svc.example.org",
            "a-head-svc.ns",
            "example.com",
        ] {
            assert!(
                matches!(
                    route(host, 8265, D, &svcs, &[]),
                    Err(RouteError::NoSuchHost(_))
                ),
                "{host}"
            );
        }
        assert!(
            route(
                "a-head-svc.ns.svc.corp.internal",
                8265,
                "corp.internal",
                &svcs,
                &[]
            )
            .is_err()
        );
    }

    #[test]
    fn not_running_or_wrong_port_is_refused() {
        let svcs = [head_svc("a-head-svc", "a")];
        let pending = [head("a-head", "a", "10.244.0.3", false)];
        let host = "a-head-svc.ns.svc.cluster.local";
        assert!(matches!(
            route(host, 8265, D, &svcs, &pending),
            Err(RouteError::Refused(_))
        ));
        assert!(matches!(
            route("10.244.0.3", 8000, D, &[], &pending),
            Err(RouteError::Refused(_))
        ));
        let running = [head("a-head", "a", "10.244.0.3", true)];
        assert!(matches!(
            route(host, 6379, D, &svcs, &running),
            Err(RouteError::Refused(_))
        ));
        assert!(matches!(
            route(host, 9999, D, &svcs, &running),
            Err(RouteError::Refused(_))
        ));
        assert!(matches!(
            route("10.244.0.4", 8000, D, &[], &running),
            Err(RouteError::Refused(_))
        ));
    }

    #[test]
    fn undeclared_ports_fall_back_to_ray_defaults() {
        let mut p = head("h", "c", "10.0.0.1", true);
        p.ports.clear();
        let pods = [p];
        assert_eq!(
            route("10.0.0.1", 8265, D, &[], &pods).map(|t| t.role),
            Ok(Role::Dashboard)
        );
        assert_eq!(
            route("10.0.0.1", 8000, D, &[], &pods).map(|t| t.role),
            Ok(Role::ServeProxy)
        );
        assert!(route("10.0.0.1", 8080, D, &[], &pods).is_err());
    }
}
