//! What tests force through annotations, and which object wins: a RayCluster's own annotation
//! beats its RayService's, so one cluster of an upgrade can fail while the other runs.

use super::serve::AppStatus;
use std::collections::BTreeMap;

/// Forces the status of every Serve application of the cluster.
pub const APP_STATUS: &str = "ray-head.e2e.raygate.dev/app-status";
/// Replaces the message Ray would give for the forced status.
pub const APP_MESSAGE: &str = "ray-head.e2e.raygate.dev/app-message";
/// `"false"` makes the Serve proxy's `/-/healthz` answer 503.
pub const PROXY_HEALTHY: &str = "ray-head.e2e.raygate.dev/proxy-healthy";

/// The statuses a test may force (the ones KubeRay's RayService controller reacts to).
const FORCEABLE: [AppStatus; 4] = [
    AppStatus::Running,
    AppStatus::DeployFailed,
    AppStatus::Unhealthy,
    AppStatus::Deploying,
];

#[derive(Clone, Debug, PartialEq)]
pub struct Control {
    pub app_status: Option<AppStatus>,
    pub app_message: Option<String>,
    pub proxy_healthy: bool,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            app_status: None,
            app_message: None,
            proxy_healthy: true,
        }
    }
}

type Annotations = BTreeMap<String, String>;

/// Resolves the control for a cluster; returns complaints about values it had to ignore.
pub fn resolve(cluster: &Annotations, service: Option<&Annotations>) -> (Control, Vec<String>) {
    let pick = |key: &str| -> Option<(&str, &'static str)> {
        if let Some(v) = cluster.get(key) {
            return Some((v.as_str(), "RayCluster"));
        }
        service
            .and_then(|s| s.get(key))
            .map(|v| (v.as_str(), "RayService"))
    };
    let mut warnings = Vec::new();
    let mut control = Control::default();
    if let Some((v, from)) = pick(APP_STATUS) {
        match AppStatus::parse(v.trim()).filter(|s| FORCEABLE.contains(s)) {
            Some(s) => control.app_status = Some(s),
            None => warnings.push(format!(
                "{from} annotation {APP_STATUS}={v:?} ignored: expected RUNNING, DEPLOY_FAILED, UNHEALTHY or DEPLOYING"
            )),
        }
    }
    if let Some((v, _)) = pick(APP_MESSAGE) {
        control.app_message = Some(v.to_string());
    }
    if let Some((v, from)) = pick(PROXY_HEALTHY) {
        match v.trim() {
            "false" => control.proxy_healthy = false,
            "true" => {}
            _ => warnings.push(format!(
                "{from} annotation {PROXY_HEALTHY}={v:?} ignored: expected \"true\" or \"false\""
            )),
        }
    }
    (control, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> Annotations {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn nothing_set_means_ray_decides() {
        let (c, w) = resolve(&ann(&[]), None);
        assert_eq!(c, Control::default());
        assert!(c.proxy_healthy);
        assert!(w.is_empty());
    }

    #[test]
    fn rayservice_annotation_is_the_default_for_its_clusters() {
        let svc = ann(&[(APP_STATUS, "UNHEALTHY"), (PROXY_HEALTHY, "false")]);
        let (c, w) = resolve(&ann(&[]), Some(&svc));
        assert_eq!(c.app_status, Some(AppStatus::Unhealthy));
        assert!(!c.proxy_healthy);
        assert!(w.is_empty());
    }

    #[test]
    fn raycluster_annotation_wins_per_key() {
        let svc = ann(&[(APP_STATUS, "DEPLOY_FAILED"), (PROXY_HEALTHY, "false")]);
        let cluster = ann(&[(APP_STATUS, "RUNNING"), (APP_MESSAGE, "ok")]);
        let (c, _) = resolve(&cluster, Some(&svc));
        assert_eq!(c.app_status, Some(AppStatus::Running));
        assert_eq!(c.app_message.as_deref(), Some("ok"));
        assert!(
            !c.proxy_healthy,
            "not overridden by the cluster, so the service's holds"
        );
    }

    #[test]
    fn bad_values_are_ignored_with_a_warning() {
        let cluster = ann(&[(APP_STATUS, "BROKEN"), (PROXY_HEALTHY, "no")]);
        let (c, w) = resolve(&cluster, None);
        assert_eq!(c, Control::default());
        assert_eq!(w.len(), 2);
        assert!(w[0].contains(APP_STATUS) && w[0].contains("RayCluster"));
        let (c, w) = resolve(&ann(&[(APP_STATUS, "DELETING")]), None);
        assert_eq!(
            c.app_status, None,
            "DELETING is Ray's own transition, not forceable"
        );
        assert_eq!(w.len(), 1);
    }
}
