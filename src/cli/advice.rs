//! Advice on a RayService change (`explain`, `fit`, the PR check): what the
//! problem statement recommends where a manifest makes recreations more
//! frequent or fights the autoscaler. Advice never changes a verdict or an
//! exit code; it is its own field, `advice`, in `-o json`.

use serde::Serialize;

use crate::kuberay::{RayService, Verdict};

/// One piece of advice, with the field it is about.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Advice {
    /// `MoveToServeConfig` or `ReplicasWithAutoscaling`.
    pub kind: &'static str,
    pub path: String,
    pub message: String,
}

/// Env var names that usually carry an application setting, not a cluster
/// setting: matched as words of the name (`MODEL_PATH`, `HF_MODEL_ID`,
/// `LEARNING_RATE`, `MAX_TOKENS`).
const APP_WORDS: [&str; 16] = [
    "MODEL",
    "CHECKPOINT",
    "WEIGHTS",
    "TOKENIZER",
    "ADAPTER",
    "LORA",
    "PROMPT",
    "TEMPERATURE",
    "LR",
    "LEARNING",
    "EPOCHS",
    "BATCH",
    "TOKENS",
    "TOP",
    "BEAM",
    "THRESHOLD",
];

/// Whether `path` (relative to `rayClusterConfig`) is a container's env value
/// that looks like an application setting, or its args; the variable's name.
fn app_setting(path: &str) -> Option<&str> {
    if !path.contains(".containers[") {
        return None;
    }
    if let Some((_, rest)) = path.split_once(".env[") {
        let name = rest.split(']').next().unwrap_or_default();
        let upper = name.to_ascii_uppercase();
        let app = upper
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| APP_WORDS.contains(&w));
        return app.then_some(name);
    }
    (path.contains(".args") || path.ends_with(".command")).then_some("args")
}

/// The advice for `new`, classified `verdict` for its `triggering` paths.
pub fn advice(verdict: Verdict, triggering: &[String], new: &RayService) -> Vec<Advice> {
    let mut out = vec![];
    if matches!(verdict, Verdict::NewCluster | Verdict::Held) {
        for p in triggering {
            let Some(what) = app_setting(p) else { continue };
            let what = if what == "args" {
                "a container's command line".to_string()
            } else {
                format!("env var {what}")
            };
            out.push(Advice {
                kind: "MoveToServeConfig",
                path: format!("spec.rayClusterConfig.{p}"),
                message: format!(
                    "this change of {what} makes KubeRay build a whole new cluster (twice the GPUs \
                     during the switch-over). If it is an application setting (a model path, a \
                     hyper-parameter, an argument of your app), move it to serveConfigV2 \
                     (applications[].runtime_env.env_vars, applications[].args or a deployment's \
                     user_config): KubeRay then applies it to the running cluster, without a new one"
                ),
            });
        }
    }
    let cluster = new.spec.ray_cluster_config.as_ref();
    if cluster.and_then(|c| c.enable_in_tree_autoscaling) == Some(true) {
        for (i, g) in cluster
            .and_then(|c| c.worker_group_specs.as_ref())
            .into_iter()
            .flatten()
            .enumerate()
        {
            if g.replicas.is_none() {
                continue;
            }
            let group = g.group_name.clone().unwrap_or_else(|| i.to_string());
            out.push(Advice {
                kind: "ReplicasWithAutoscaling",
                path: format!("spec.rayClusterConfig.workerGroupSpecs[{group}].replicas"),
                message: "the manifest sets replicas while Ray autoscaling is on \
                          (enableInTreeAutoscaling): the autoscaler changes it, and each GitOps \
                          sync sets it back, fighting the autoscaler. Leave the field to the \
                          autoscaler: Argo CD ignoreDifferences on \
                          /spec/rayClusterConfig/workerGroupSpecs/N/replicas with the sync option \
                          RespectIgnoreDifferences=true, or drop it from the manifest \
                          (docs/gitops.md)"
                    .into(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(mut v: serde_json::Value) -> RayService {
        v["apiVersion"] = json!("ray.io/v1");
        v["kind"] = json!("RayService");
        v["metadata"] = json!({"name": "llm"});
        serde_json::from_value(v).unwrap()
    }

    fn paths(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_app_setting_in_a_worker_env_is_advised_into_serve_config() {
        let new = svc(json!({"spec": {"rayClusterConfig": {}}}));
        let changed = [
            "workerGroupSpecs[gpu].template.spec.containers[ray-worker].env[MODEL_PATH].value",
            "workerGroupSpecs[gpu].template.spec.containers[ray-worker].env[NCCL_DEBUG].value",
            "workerGroupSpecs[gpu].template.spec.containers[ray-worker].args[0]",
            "workerGroupSpecs[gpu].template.spec.containers[ray-worker].image",
        ];
        let a = advice(Verdict::NewCluster, &paths(&changed), &new);
        let got: Vec<(&str, &str)> = a.iter().map(|a| (a.kind, a.path.as_str())).collect();
        assert_eq!(
            got,
            [
                (
                    "MoveToServeConfig",
                    "spec.rayClusterConfig.workerGroupSpecs[gpu].template.spec.containers[ray-worker].env[MODEL_PATH].value"
                ),
                (
                    "MoveToServeConfig",
                    "spec.rayClusterConfig.workerGroupSpecs[gpu].template.spec.containers[ray-worker].args[0]"
                ),
            ]
        );
        assert!(a[0].message.contains("serveConfigV2"), "{}", a[0].message);
        // Only for a change that recreates the cluster.
        assert!(advice(Verdict::InPlaceClusterUpdate, &paths(&changed), &new).is_empty());
    }

    #[test]
    fn replicas_under_ray_autoscaling_are_advised_against() {
        let new = svc(
            json!({"spec": {"rayClusterConfig": {"enableInTreeAutoscaling": true,
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2}, {"groupName": "cpu"}]}}}),
        );
        let a = advice(Verdict::NoChange, &[], &new);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].kind, "ReplicasWithAutoscaling");
        assert_eq!(
            a[0].path,
            "spec.rayClusterConfig.workerGroupSpecs[gpu].replicas"
        );
        assert!(a[0].message.contains("RespectIgnoreDifferences=true"));
        let off = svc(json!({"spec": {"rayClusterConfig": {
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2}]}}}));
        assert!(advice(Verdict::NoChange, &[], &off).is_empty());
    }
}
