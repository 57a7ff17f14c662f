//! Answers one request to a resolved Ray head, as Ray's dashboard (aiohttp) or Serve proxy
//! would; plus the test-facing view of all clusters. Pure: no I/O, time passed in.

use super::control::Control;
use super::route::{Role, RouteError, Target};
use super::serve::{ClusterServe, PutError};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Ray's `SERVE_API_URL`-style route KubeRay uses for both GET and PUT.
pub const APPLICATIONS_PATH: &str = "/api/serve/applications/";
/// Serve proxy health route (KubeRay's `RayServeProxyHealthPath`).
pub const HEALTHZ_PATH: &str = "/-/healthz";
const ROUTES_PATH: &str = "/-/routes";
/// Ray's proxy answer while draining / not ready (`DRAINING_MESSAGE`).
const UNHEALTHY_MESSAGE: &str = "This node is being drained.";

#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    fn text(status: u16, body: impl Into<String>) -> Reply {
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }

    fn json(status: u16, v: &Value) -> Reply {
        Reply {
            status,
            content_type: "application/json; charset=utf-8",
            body: v.to_string(),
        }
    }
}

pub struct Req<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub body: &'a [u8],
}

/// Clock of one request: monotonic for state transitions, wall time for Ray's timestamps.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub now: Instant,
    pub unix_s: f64,
    pub deploy_delay: Duration,
}

/// Serve state of every Ray cluster seen so far, by (namespace, name).
#[derive(Debug, Default)]
pub struct Registry {
    clusters: BTreeMap<(String, String), ClusterServe>,
}

/// Upper bound on remembered clusters: beyond it, the ones the apiserver no longer has go.
pub const MAX_CLUSTERS: usize = 4096;

impl Registry {
    fn entry(&mut self, t: &Target) -> &mut ClusterServe {
        let s = self
            .clusters
            .entry((t.namespace.clone(), t.cluster.clone()))
            .or_default();
        s.observe_head(&t.head.pod_uid);
        s
    }

    /// Forgets clusters that no longer exist once the registry is over its bound.
    pub fn prune(&mut self, exists: impl Fn(&str, &str) -> bool) {
        if self.clusters.len() > MAX_CLUSTERS {
            self.clusters.retain(|(ns, n), _| exists(ns, n));
        }
    }

    pub fn handle(
        &mut self,
        t: &Target,
        control: &Control,
        req: &Req,
        clock: Clock,
    ) -> Result<Reply, RouteError> {
        let s = self.entry(t);
        s.tick(clock.now, clock.deploy_delay);
        match t.role {
            Role::Dashboard => Ok(dashboard(s, t, control, req, clock)),
            Role::ServeProxy => serve_proxy(s, control, req, clock),
        }
    }

    /// `GET /_e2e/clusters`: the given clusters (those the apiserver has) plus any with state.
    pub fn observe(&mut self, known: &[(String, String, Control)], clock: Clock) -> Value {
        let mut rows: BTreeMap<(String, String), Control> = self
            .clusters
            .keys()
            .map(|k| (k.clone(), Control::default()))
            .collect();
        for (ns, name, c) in known {
            rows.insert((ns.clone(), name.clone()), c.clone());
        }
        let list: Vec<Value> = rows
            .into_iter()
            .map(|((ns, name), control)| {
                let state = self.clusters.get_mut(&(ns.clone(), name.clone()));
                let (puts, last, apps) = match state {
                    Some(s) => {
                        s.tick(clock.now, clock.deploy_delay);
                        let apps: serde_json::Map<String, Value> = s
                            .statuses(clock.now, clock.deploy_delay, &control)
                            .into_iter()
                            .map(|(n, st)| (n, json!(st.as_str())))
                            .collect();
                        (s.config_puts, s.last_config.clone(), apps)
                    }
                    None => (0, None, serde_json::Map::new()),
                };
                json!({
                    "namespace": ns,
                    "name": name,
                    "configPuts": puts,
                    "lastConfig": last,
                    "apps": apps,
                })
            })
            .collect();
        Value::Array(list)
    }
}

fn dashboard(
    s: &mut ClusterServe,
    t: &Target,
    control: &Control,
    req: &Req,
    clock: Clock,
) -> Reply {
    if req.path != APPLICATIONS_PATH {
        return Reply::text(404, "404: Not Found");
    }
    match req.method {
        "GET" => Reply::json(
            200,
            &s.details(clock.now, clock.deploy_delay, control, &t.head),
        ),
        "PUT" => match s.put(req.body, clock.now, clock.unix_s) {
            Ok(()) => Reply::text(200, ""),
            Err(PutError::Invalid(e)) => Reply::text(400, e),
            Err(PutError::NotJson(e)) => Reply::text(
                500,
                format!("Traceback (most recent call last):\njson.decoder.JSONDecodeError: {e}"),
            ),
        },
        "DELETE" => {
            s.shutdown();
            Reply::text(200, "")
        }
        _ => Reply::text(405, "405: Method Not Allowed"),
    }
}

fn serve_proxy(
    s: &ClusterServe,
    control: &Control,
    req: &Req,
    clock: Clock,
) -> Result<Reply, RouteError> {
    if !s.started() {
        // Serve starts its proxy with the first deploy; until then nothing listens on 8000.
        return Err(RouteError::Refused(
            "Ray Serve is not running on this head yet (no config was submitted)".into(),
        ));
    }
    Ok(match req.path {
        HEALTHZ_PATH if !control.proxy_healthy => Reply::text(503, UNHEALTHY_MESSAGE),
        HEALTHZ_PATH => Reply::text(200, "success"),
        ROUTES_PATH => {
            let routes: serde_json::Map<String, Value> = s
                .statuses(clock.now, clock.deploy_delay, control)
                .into_keys()
                .filter_map(|name| Some((s.route_prefix(&name)?, json!(name))))
                .collect();
            Reply::json(200, &Value::Object(routes))
        }
        p => Reply::text(
            404,
            format!("Path '{p}' not found. Ping http://.../-/routes for available routes."),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ray_head::serve::{AppStatus, HeadNode};

    fn target(role: Role, uid: &str) -> Target {
        Target {
            namespace: "ns".into(),
            cluster: "c".into(),
            head: HeadNode {
                pod_uid: uid.into(),
                pod_ip: "10.244.0.2".into(),
            },
            role,
        }
    }

    fn clock(now: Instant) -> Clock {
        Clock {
            now,
            unix_s: 1.7e9,
            deploy_delay: Duration::from_secs(1),
        }
    }

    fn req<'a>(method: &'a str, path: &'a str, body: &'a [u8]) -> Req<'a> {
        Req { method, path, body }
    }

    const CONFIG: &[u8] =
        br#"{"applications":[{"name":"app","import_path":"m.app","route_prefix":"/"}]}"#;

    #[test]
    fn kuberay_round_trip() {
        let mut reg = Registry::default();
        let t0 = Instant::now();
        let dash = target(Role::Dashboard, "u1");
        let proxy = target(Role::ServeProxy, "u1");
        let c = Control::default();
        let r = reg
            .handle(&dash, &c, &req("GET", APPLICATIONS_PATH, b""), clock(t0))
            .expect("ok");
        assert_eq!(r.status, 200);
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["applications"], json!({}));
        assert!(
            reg.handle(&proxy, &c, &req("GET", HEALTHZ_PATH, b""), clock(t0))
                .is_err()
        );

        let r = reg
            .handle(&dash, &c, &req("PUT", APPLICATIONS_PATH, CONFIG), clock(t0))
            .expect("ok");
        assert_eq!((r.status, r.body.as_str()), (200, ""));
        let r = reg
            .handle(&proxy, &c, &req("GET", HEALTHZ_PATH, b""), clock(t0))
            .expect("ok");
        assert_eq!((r.status, r.body.as_str()), (200, "success"));

        let later = clock(t0 + Duration::from_secs(2));
        let r = reg
            .handle(&dash, &c, &req("GET", APPLICATIONS_PATH, b""), later)
            .expect("ok");
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["applications"]["app"]["status"], "RUNNING");
        let r = reg
            .handle(&proxy, &c, &req("GET", "/-/routes", b""), later)
            .expect("ok");
        assert_eq!(r.body, r#"{"/":"app"}"#);

        let obs = reg.observe(&[], later);
        assert_eq!(obs[0]["configPuts"], 1);
        assert_eq!(obs[0]["apps"]["app"], "RUNNING");
        assert_eq!(obs[0]["lastConfig"]["applications"][0]["name"], "app");
    }

    #[test]
    fn errors_are_rays() {
        let mut reg = Registry::default();
        let t0 = Instant::now();
        let dash = target(Role::Dashboard, "u1");
        let c = Control::default();
        let code = |reg: &mut Registry, m, p, b| {
            reg.handle(&dash, &c, &req(m, p, b), clock(t0))
                .map(|r| r.status)
        };
        assert_eq!(code(&mut reg, "PUT", APPLICATIONS_PATH, b"nope"), Ok(500));
        assert_eq!(code(&mut reg, "PUT", APPLICATIONS_PATH, b"{}"), Ok(400));
        assert_eq!(code(&mut reg, "POST", APPLICATIONS_PATH, b""), Ok(405));
        assert_eq!(
            code(&mut reg, "GET", "/api/serve/applications", b""),
            Ok(404)
        );
        assert_eq!(code(&mut reg, "GET", "/api/jobs/", b""), Ok(404));
    }

    #[test]
    fn proxy_health_follows_the_annotation() {
        let mut reg = Registry::default();
        let t0 = Instant::now();
        let c = Control::default();
        reg.handle(
            &target(Role::Dashboard, "u"),
            &c,
            &req("PUT", APPLICATIONS_PATH, CONFIG),
            clock(t0),
        )
        .expect("put");
        let sick = Control {
            proxy_healthy: false,
            ..Control::default()
        };
        let r = reg
            .handle(
                &target(Role::ServeProxy, "u"),
                &sick,
                &req("GET", HEALTHZ_PATH, b""),
                clock(t0),
            )
            .expect("reply");
        assert_eq!(r.status, 503);
    }

    #[test]
    fn observe_lists_known_clusters_with_forced_statuses() {
        let mut reg = Registry::default();
        let t0 = Instant::now();
        let c = Control::default();
        reg.handle(
            &target(Role::Dashboard, "u"),
            &c,
            &req("PUT", APPLICATIONS_PATH, CONFIG),
            clock(t0),
        )
        .expect("put");
        let forced = Control {
            app_status: Some(AppStatus::Unhealthy),
            ..Control::default()
        };
        let obs = reg.observe(
            &[
                ("ns".into(), "c".into(), forced),
                ("ns".into(), "fresh".into(), Control::default()),
            ],
            clock(t0),
        );
        assert_eq!(obs[0]["apps"]["app"], "UNHEALTHY");
        assert_eq!(obs[1]["name"], "fresh");
        assert_eq!(obs[1]["configPuts"], 0);
        assert_eq!(obs[1]["lastConfig"], Value::Null);
    }
}
