//! Ray Serve state of one Ray cluster, as its dashboard reports it: the submitted declarative
//! config, each application's status over time, and the `ServeInstanceDetails` JSON that
//! `GET /api/serve/applications/` returns. Pure: time comes in as arguments.

use super::control::{APP_STATUS, Control};
use super::schema::{self, AppSpec};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Ray Serve's `ApplicationStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppStatus {
    NotStarted,
    Deploying,
    Running,
    DeployFailed,
    Unhealthy,
    Deleting,
}

impl AppStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            AppStatus::NotStarted => "NOT_STARTED",
            AppStatus::Deploying => "DEPLOYING",
            AppStatus::Running => "RUNNING",
            AppStatus::DeployFailed => "DEPLOY_FAILED",
            AppStatus::Unhealthy => "UNHEALTHY",
            AppStatus::Deleting => "DELETING",
        }
    }

    pub fn parse(s: &str) -> Option<AppStatus> {
        [
            AppStatus::NotStarted,
            AppStatus::Deploying,
            AppStatus::Running,
            AppStatus::DeployFailed,
            AppStatus::Unhealthy,
            AppStatus::Deleting,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// Where the cluster's head runs, for the ids Ray puts into its answers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeadNode {
    pub pod_uid: String,
    pub pod_ip: String,
}

#[derive(Clone, Debug)]
struct App {
    spec: AppSpec,
    /// When the current config of this app was deployed (DEPLOYING until `+ delay`).
    since: Instant,
    deployed_unix_s: f64,
    /// Removed from the config at this time: DELETING until `+ delay`, then gone.
    deleting_since: Option<Instant>,
}

/// Why a PUT was refused, with Ray's status code.
#[derive(Clone, Debug, PartialEq)]
pub enum PutError {
    /// Not JSON: aiohttp's `req.json()` raises, `init_ray_and_catch_exceptions` answers 500.
    NotJson(String),
    /// `ServeDeploySchema` validation failed: 400 with the pydantic error.
    Invalid(String),
}

/// Serve on one Ray head. Ray loses it when the head restarts (no GCS fault tolerance in the
/// tests), so it is tied to the head pod's uid.
#[derive(Clone, Debug, Default)]
pub struct ClusterServe {
    head_uid: String,
    /// Accepted PUTs over the cluster's life (kept across head restarts, for tests).
    pub config_puts: u64,
    pub last_config: Option<Value>,
    /// Serve was started on this head (the first accepted PUT starts it, as `serve_start_async`).
    started: bool,
    apps: BTreeMap<String, App>,
    target_capacity: Option<f64>,
    proxy_location: Option<String>,
}

impl ClusterServe {
    /// A head pod with another uid is a new Ray instance: Serve is gone with the old one.
    pub fn observe_head(&mut self, head_uid: &str) {
        if self.head_uid != head_uid {
            self.head_uid = head_uid.to_string();
            self.started = false;
            self.apps.clear();
            self.target_capacity = None;
            self.proxy_location = None;
        }
    }

    /// The route prefix of a live application.
    pub fn route_prefix(&self, app: &str) -> Option<String> {
        self.apps
            .get(app)
            .filter(|a| a.deleting_since.is_none())
            .and_then(|a| a.spec.route_prefix.clone())
    }

    pub fn started(&self) -> bool {
        self.started
    }

    /// `PUT /api/serve/applications/`: deploys the config declaratively. Apps whose config is
    /// unchanged keep their state; changed or new ones redeploy; missing ones are deleted.
    pub fn put(&mut self, body: &[u8], now: Instant, unix_s: f64) -> Result<(), PutError> {
        let parsed: Value =
            serde_json::from_slice(body).map_err(|e| PutError::NotJson(e.to_string()))?;
        let spec = schema::validate(&parsed).map_err(PutError::Invalid)?;
        let mut next = BTreeMap::new();
        for app in spec.apps {
            let kept = self
                .apps
                .remove(&app.name)
                .filter(|old| old.deleting_since.is_none() && old.spec.config == app.config);
            let entry = kept.unwrap_or_else(|| App {
                spec: app.clone(),
                since: now,
                deployed_unix_s: unix_s,
                deleting_since: None,
            });
            next.insert(app.name.clone(), entry);
        }
        for (name, mut old) in std::mem::take(&mut self.apps) {
            old.deleting_since.get_or_insert(now);
            next.insert(name, old);
        }
        self.apps = next;
        self.started = true;
        self.target_capacity = spec.target_capacity;
        self.proxy_location = spec.proxy_location;
        self.config_puts += 1;
        self.last_config = Some(parsed);
        Ok(())
    }

    /// `DELETE /api/serve/applications/`: `serve.shutdown()`.
    pub fn shutdown(&mut self) {
        self.started = false;
        self.apps.clear();
    }

    /// Drops apps whose deletion has finished.
    pub fn tick(&mut self, now: Instant, delay: Duration) {
        self.apps.retain(|_, a| {
            a.deleting_since
                .is_none_or(|t| now.saturating_duration_since(t) < delay)
        });
    }

    fn status_of(app: &App, now: Instant, delay: Duration, control: &Control) -> AppStatus {
        if app.deleting_since.is_some() {
            return AppStatus::Deleting;
        }
        if let Some(forced) = control.app_status {
            return forced;
        }
        if now.saturating_duration_since(app.since) < delay {
            AppStatus::Deploying
        } else {
            AppStatus::Running
        }
    }

    /// Application name -> effective status (call `tick` first).
    pub fn statuses(
        &self,
        now: Instant,
        delay: Duration,
        control: &Control,
    ) -> BTreeMap<String, AppStatus> {
        self.apps
            .iter()
            .map(|(n, a)| (n.clone(), Self::status_of(a, now, delay, control)))
            .collect()
    }

    /// The body of `GET /api/serve/applications/` (call `tick` first).
    pub fn details(
        &self,
        now: Instant,
        delay: Duration,
        control: &Control,
        head: &HeadNode,
    ) -> Value {
        if !self.started {
            // `ServeInstanceDetails.get_empty_schema_dict()`: no Serve controller running.
            return json!({
                "deploy_mode": "MULTI_APP",
                "controller_info": {},
                "proxies": {},
                "applications": {},
                "target_capacity": null,
            });
        }
        let node_id = node_id(&head.pod_uid);
        let applications: Map<String, Value> = self
            .apps
            .iter()
            .map(|(name, app)| {
                let status = Self::status_of(app, now, delay, control);
                (name.clone(), app_details(app, status, control))
            })
            .collect();
        let healthy = if control.proxy_healthy {
            "HEALTHY"
        } else {
            "UNHEALTHY"
        };
        let mut proxy = actor_fields(
            &node_id,
            &head.pod_ip,
            &format!("SERVE_PROXY_ACTOR-{node_id}"),
            "proxy",
        );
        proxy.insert("status".into(), json!(healthy));
        json!({
            "controller_info": actor(&node_id, &head.pod_ip, "SERVE_CONTROLLER_ACTOR", "controller"),
            "proxy_location": self.proxy_location.as_deref().unwrap_or("EveryNode"),
            "http_options": {"host": "0.0.0.0", "port": 8000, "root_path": "", "request_timeout_s": null, "keep_alive_timeout_s": 90},
            "grpc_options": {"port": 9000, "grpc_servicer_functions": [], "request_timeout_s": null},
            "proxies": { node_id.clone(): proxy },
            "deploy_mode": "MULTI_APP",
            "applications": applications,
            "target_capacity": self.target_capacity,
            "target_groups": [],
        })
    }
}

/// The message Ray gives an application in `status`, unless the test supplied one.
fn app_message(status: AppStatus, deployments: &[String], control: &Control) -> String {
    if control.app_status.is_some()
        && let Some(m) = &control.app_message
    {
        return m.clone();
    }
    let list = deployments
        .iter()
        .map(|d| format!("'{d}'"))
        .collect::<Vec<_>>()
        .join(", ");
    match status {
        AppStatus::DeployFailed => {
            format!("Failed to update the deployments [{list}]. (forced by {APP_STATUS})")
        }
        AppStatus::Unhealthy => {
            format!("The deployments [{list}] are UNHEALTHY. (forced by {APP_STATUS})")
        }
        _ => String::new(),
    }
}

fn app_details(app: &App, status: AppStatus, control: &Control) -> Value {
    let names = if app.spec.deployments.is_empty() {
        vec![schema::implicit_deployment(&app.spec.import_path)]
    } else {
        app.spec.deployments.clone()
    };
    let (dep_status, trigger, dep_message) = match status {
        AppStatus::Running => ("HEALTHY", "CONFIG_UPDATE_COMPLETED", ""),
        AppStatus::Deploying | AppStatus::NotStarted => ("UPDATING", "CONFIG_UPDATE_STARTED", ""),
        AppStatus::Unhealthy => (
            "UNHEALTHY",
            "HEALTH_CHECK_FAILED",
            "A replica's health check failed. This deployment will be UNHEALTHY until the replica recovers or a new deploy happens.",
        ),
        AppStatus::DeployFailed => (
            "UNHEALTHY",
            "REPLICA_STARTUP_FAILED",
            "The deployment failed to start 3 times in a row. This may be due to a problem with its constructor or initial health check failing.",
        ),
        AppStatus::Deleting => ("UPDATING", "DELETING", ""),
    };
    let listed: BTreeMap<&str, &Value> = app
        .spec
        .config
        .get("deployments")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|d| Some((d.get("name")?.as_str()?, d)))
        .collect();
    let deployments: Map<String, Value> = names
        .iter()
        .map(|n| {
            let config = listed
                .get(n.as_str())
                .map_or_else(|| json!({"name": n}), |v| (*v).clone());
            let replicas = config
                .get("num_replicas")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            (
                n.clone(),
                json!({
                    "name": n,
                    "status": dep_status,
                    "status_trigger": trigger,
                    "message": dep_message,
                    "deployment_config": config,
                    "target_num_replicas": replicas,
                    "required_resources": {"CPU": 1},
                    "replicas": [],
                }),
            )
        })
        .collect();
    json!({
        "name": app.spec.name,
        "route_prefix": app.spec.route_prefix,
        "docs_path": null,
        "status": status.as_str(),
        "message": app_message(status, &names, control),
        "last_deployed_time_s": app.deployed_unix_s,
        "deployed_app_config": app.spec.config,
        "source": "declarative",
        "deployments": deployments,
        "external_scaler_enabled": false,
    })
}

/// A 56-hex-digit Ray node id derived from the head pod uid, stable per head.
fn node_id(pod_uid: &str) -> String {
    let hex: String = pod_uid.chars().filter(char::is_ascii_hexdigit).collect();
    format!("{hex:0<56}").chars().take(56).collect()
}

fn actor_fields(node_id: &str, ip: &str, name: &str, kind: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("node_id".into(), json!(node_id));
    m.insert("node_ip".into(), json!(ip));
    m.insert("node_instance_id".into(), json!(""));
    m.insert("actor_id".into(), json!(&node_id[..32.min(node_id.len())]));
    m.insert("actor_name".into(), json!(name));
    m.insert("worker_id".into(), json!(node_id));
    m.insert(
        "log_file_path".into(),
        json!(format!("/serve/{kind}_{ip}.log")),
    );
    m
}

fn actor(node_id: &str, ip: &str, name: &str, kind: &str) -> Value {
    Value::Object(actor_fields(node_id, ip, name, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_secs(1);

    fn head() -> HeadNode {
        HeadNode {
            pod_uid: "0b5c0a1e-1111-2222-3333-444455556666".into(),
            pod_ip: "10.244.0.5".into(),
        }
    }

    fn put(s: &mut ClusterServe, body: Value, now: Instant) {
        s.put(body.to_string().as_bytes(), now, 1.7e9)
            .expect("accepted");
    }

    fn two_apps() -> Value {
        json!({"applications": [
            {"name": "a", "import_path": "m.a", "route_prefix": "/a", "deployments": [{"name": "A", "num_replicas": 2}]},
            {"name": "b", "import_path": "m:b", "route_prefix": "/b"}]})
    }

    #[test]
    fn before_any_put_serve_is_not_running() {
        let s = ClusterServe::default();
        let d = s.details(Instant::now(), DELAY, &Control::default(), &head());
        assert_eq!(d["applications"], json!({}));
        assert_eq!(d["deploy_mode"], "MULTI_APP");
        assert!(!s.started());
    }

    #[test]
    fn apps_deploy_then_run_after_the_delay() {
        let t0 = Instant::now();
        let mut s = ClusterServe::default();
        s.observe_head("h1");
        put(&mut s, two_apps(), t0);
        let c = Control::default();
        let st = s.statuses(t0, DELAY, &c);
        assert_eq!(st["a"], AppStatus::Deploying);
        let d = s.details(t0, DELAY, &c, &head());
        assert_eq!(
            d["applications"]["a"]["deployments"]["A"]["status"],
            "UPDATING"
        );
        let later = t0 + DELAY;
        let d = s.details(later, DELAY, &c, &head());
        let a = &d["applications"]["a"];
        assert_eq!(a["status"], "RUNNING");
        assert_eq!(a["route_prefix"], "/a");
        assert_eq!(a["deployments"]["A"]["status"], "HEALTHY");
        assert_eq!(a["deployments"]["A"]["target_num_replicas"], 2);
        assert_eq!(
            d["applications"]["b"]["deployments"]["b"]["status"],
            "HEALTHY"
        );
        assert_eq!(s.config_puts, 1);
    }

    #[test]
    fn resubmitting_redeploys_only_changed_apps_and_deletes_missing_ones() {
        let t0 = Instant::now();
        let mut s = ClusterServe::default();
        put(&mut s, two_apps(), t0);
        let t1 = t0 + DELAY * 5;
        let changed = json!({"applications": [
            {"name": "a", "import_path": "m.a", "route_prefix": "/a", "deployments": [{"name": "A", "num_replicas": 2}]},
            {"name": "c", "import_path": "m.c", "route_prefix": "/c"}]});
        put(&mut s, changed, t1);
        let st = s.statuses(t1, DELAY, &Control::default());
        assert_eq!(st["a"], AppStatus::Running, "unchanged app keeps running");
        assert_eq!(st["c"], AppStatus::Deploying);
        assert_eq!(st["b"], AppStatus::Deleting);
        s.tick(t1 + DELAY, DELAY);
        let st = s.statuses(t1 + DELAY, DELAY, &Control::default());
        assert!(!st.contains_key("b"));
        assert_eq!(st["c"], AppStatus::Running);
        assert_eq!(s.config_puts, 2);
    }

    #[test]
    fn forced_status_overrides_with_ray_like_messages() {
        let t0 = Instant::now();
        let mut s = ClusterServe::default();
        put(&mut s, two_apps(), t0);
        let c = Control {
            app_status: Some(AppStatus::DeployFailed),
            ..Control::default()
        };
        let d = s.details(t0 + DELAY, DELAY, &c, &head());
        let a = &d["applications"]["a"];
        assert_eq!(a["status"], "DEPLOY_FAILED");
        assert!(
            a["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Failed to update the deployments ['A']"))
        );
        assert_eq!(a["deployments"]["A"]["status"], "UNHEALTHY");
        let c = Control {
            app_status: Some(AppStatus::Unhealthy),
            app_message: Some("boom".into()),
            ..Control::default()
        };
        let d = s.details(t0, DELAY, &c, &head());
        assert_eq!(d["applications"]["b"]["status"], "UNHEALTHY");
        assert_eq!(d["applications"]["b"]["message"], "boom");
    }

    #[test]
    fn a_new_head_pod_loses_serve() {
        let t0 = Instant::now();
        let mut s = ClusterServe::default();
        s.observe_head("h1");
        put(&mut s, two_apps(), t0);
        s.observe_head("h1");
        assert!(s.started());
        s.observe_head("h2");
        assert!(!s.started());
        assert!(s.statuses(t0, DELAY, &Control::default()).is_empty());
        assert_eq!(s.config_puts, 1, "the count is for tests, it survives");
    }

    #[test]
    fn refused_puts_change_nothing() {
        let mut s = ClusterServe::default();
        let now = Instant::now();
        assert!(matches!(
            s.put(b"{not json", now, 0.0),
            Err(PutError::NotJson(_))
        ));
        assert!(matches!(
            s.put(br#"{"applications": [{"name": "x"}]}"#, now, 0.0),
            Err(PutError::Invalid(_))
        ));
        assert_eq!(s.config_puts, 0);
        assert!(!s.started());
    }

    #[test]
    fn details_carry_what_kuberay_reads() {
        let t0 = Instant::now();
        let mut s = ClusterServe::default();
        put(
            &mut s,
            json!({"applications": [{"name": "a", "import_path": "m.a"}], "target_capacity": 40}),
            t0,
        );
        let d = s.details(t0 + DELAY, DELAY, &Control::default(), &head());
        assert_eq!(d["target_capacity"], 40.0);
        assert_eq!(d["applications"]["a"]["name"], "a");
        assert_eq!(d["applications"]["a"]["message"], "");
        assert_eq!(
            d["applications"]["a"]["deployed_app_config"]["import_path"],
            "m.a"
        );
        assert_eq!(d["proxies"].as_object().map(Map::len), Some(1));
        assert_eq!(node_id("0b5c").len(), 56);
    }
}
