//! Simulated Ray Serve: what the Ray dashboard would report for the applications in
//! `spec.serveConfigV2` (KubeRay v1.7.0 `reconcileServe` / `getAndCheckServeStatus`).
//! There is no Ray and no dashboard: an application is RUNNING once its RayCluster is
//! `ready` (all pods running), DEPLOYING before that, unless forced by annotation.

use super::conditions;
use super::names::SERVE_STATUS_ANNOTATION;
use crate::json::{arr_at, str_at};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// An application named in serveConfigV2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSpec {
    pub name: String,
    pub deployments: Vec<String>,
}

/// Parses `applications: [{name, deployments: [{name}]}]`; an unnamed app is "default"
/// (`utils.DefaultServeAppName`). Invalid YAML yields no apps (KubeRay would fail to submit).
pub fn parse_apps(serve_config_v2: &str) -> Vec<AppSpec> {
    if serve_config_v2.trim().is_empty() {
        return Vec::new();
    }
    let v: Value = match serde_saphyr::from_str(serve_config_v2) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "serveConfigV2 is not valid YAML");
            return Vec::new();
        }
    };
    arr_at(&v, &["applications"])
        .iter()
        .map(|a| {
            let name = match str_at(a, &["name"]) {
                "" => "default".to_string(),
                n => n.to_string(),
            };
            let deployments = arr_at(a, &["deployments"])
                .iter()
                .map(|d| str_at(d, &["name"]).to_string())
                .filter(|n| !n.is_empty())
                .collect();
            AppSpec { name, deployments }
        })
        .collect()
}

/// Forced statuses from the annotation: `STATUS` for all apps, or `app=STATUS,...`.
pub fn forced_statuses(annotation: &str) -> (Option<String>, BTreeMap<String, String>) {
    let mut all = None;
    let mut per_app = BTreeMap::new();
    for part in annotation
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        match part.split_once('=') {
            Some((app, status)) => {
                per_app.insert(app.trim().to_string(), status.trim().to_string());
            }
            None => all = Some(part.to_string()),
        }
    }
    (all, per_app)
}

fn deployment_status(app_status: &str) -> &'static str {
    match app_status {
        "RUNNING" => "HEALTHY",
        "UNHEALTHY" => "UNHEALTHY",
        "DEPLOY_FAILED" => "DEPLOY_FAILED",
        _ => "UPDATING",
    }
}

/// Returns (isReady, applicationStatuses) for one cluster, as `reconcileServe` would.
/// `None` means the head is not ready yet (KubeRay returns nil statuses then).
pub fn reconcile(svc: &Value, cluster: &Value) -> (bool, Option<Map<String, Value>>) {
    if !conditions::is_true(arr_at(cluster, &["status", "conditions"]), "HeadPodReady") {
        return (false, None);
    }
    let apps = parse_apps(str_at(svc, &["spec", "serveConfigV2"]));
    let (force_all, force_app) = forced_statuses(str_at(
        svc,
        &["metadata", "annotations", SERVE_STATUS_ANNOTATION],
    ));
    let cluster_ready = str_at(cluster, &["status", "state"]) == "ready";
    let mut out = Map::new();
    let mut is_ready = !apps.is_empty();
    for app in apps {
        let forced = force_app
            .get(&app.name)
            .cloned()
            .or_else(|| force_all.clone());
        let (status, message) = match forced {
            Some(s) => (s, "status forced by kuberay-sim annotation".to_string()),
            None if cluster_ready => ("RUNNING".to_string(), String::new()),
            None => (
                "DEPLOYING".to_string(),
                "Deploying: waiting for the RayCluster's Pods to be running".to_string(),
            ),
        };
        if status != "RUNNING" {
            is_ready = false;
        }
        let mut deployments = Map::new();
        for d in &app.deployments {
            deployments.insert(d.clone(), json!({"status": deployment_status(&status)}));
        }
        let mut a = json!({"status": status});
        if !message.is_empty() {
            a["message"] = json!(message);
        }
        if !deployments.is_empty() {
            a["serveDeploymentStatuses"] = Value::Object(deployments);
        }
        out.insert(app.name, a);
    }
    (is_ready, Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_apps() {
        let y = "applications:\n  - name: llm\n    import_path: a:b\n    deployments:\n      - name: Model\n  - import_path: c:d\n";
        assert_eq!(
            parse_apps(y),
            vec![
                AppSpec {
                    name: "llm".into(),
                    deployments: vec!["Model".into()]
                },
                AppSpec {
                    name: "default".into(),
                    deployments: vec![]
                },
            ]
        );
        assert!(parse_apps("").is_empty());
    }

    #[test]
    fn forced() {
        let (all, per) = forced_statuses("DEPLOY_FAILED");
        assert_eq!(all.as_deref(), Some("DEPLOY_FAILED"));
        assert!(per.is_empty());
        let (all, per) = forced_statuses("a=UNHEALTHY, b=DEPLOYING");
        assert!(all.is_none());
        assert_eq!(per["b"], "DEPLOYING");
    }

    #[test]
    fn running_only_when_cluster_ready() {
        let svc = json!({"metadata": {}, "spec": {"serveConfigV2": "applications:\n- name: x\n"}});
        let mut cluster =
            json!({"status": {"conditions": [{"type": "HeadPodReady", "status": "True"}]}});
        let (ready, apps) = reconcile(&svc, &cluster);
        assert!(!ready);
        assert_eq!(apps.unwrap()["x"]["status"], "DEPLOYING");
        cluster["status"]["state"] = json!("ready");
        let (ready, apps) = reconcile(&svc, &cluster);
        assert!(ready);
        assert_eq!(apps.unwrap()["x"]["status"], "RUNNING");
    }
}
