//! Test objects shared by the suites: a GPU RayService as the controller, faults and
//! soak suites and the scale run use it, with the numbers each one needs as parameters.

use serde_json::{Value, json};

/// A GPU RayService: a CPU-only head, one worker group `gpu-workers` of `replicas` pods
/// with `gpus` GPUs each (a limit, as device plugins require), and one Serve app `llm`.
/// KubeRay deletes the old cluster 2 s after a switch (`rayClusterDeletionDelaySeconds`),
/// so transitions end quickly.
#[derive(Debug, Clone)]
pub struct GpuRayService {
    name: String,
    image: String,
    replicas: i64,
    gpus: u32,
    head: (String, String),
    worker: (String, String),
    serve_deployment: Option<String>,
    node_selector: Option<(String, String)>,
}

impl GpuRayService {
    /// `name` with workers running `image` (change it to make KubeRay build a new
    /// cluster); 1 worker with 1 GPU, head 2 CPU / 8Gi, workers 4 CPU / 16Gi.
    pub fn new(name: &str, image: &str) -> GpuRayService {
        GpuRayService {
            name: name.to_owned(),
            image: image.to_owned(),
            replicas: 1,
            gpus: 1,
            head: ("2".to_owned(), "8Gi".to_owned()),
            worker: ("4".to_owned(), "16Gi".to_owned()),
            serve_deployment: None,
            node_selector: None,
        }
    }

    pub fn replicas(mut self, replicas: i64) -> GpuRayService {
        self.replicas = replicas;
        self
    }

    /// GPUs per worker.
    pub fn gpus(mut self, gpus: u32) -> GpuRayService {
        self.gpus = gpus;
        self
    }

    /// The head's CPU and memory (requests = limits).
    pub fn head(mut self, cpu: &str, memory: &str) -> GpuRayService {
        self.head = (cpu.to_owned(), memory.to_owned());
        self
    }

    /// Each worker's CPU and memory requests.
    pub fn worker(mut self, cpu: &str, memory: &str) -> GpuRayService {
        self.worker = (cpu.to_owned(), memory.to_owned());
        self
    }

    /// Name the app's one deployment (1 replica) in `serveConfigV2`.
    pub fn serve_deployment(mut self, name: &str) -> GpuRayService {
        self.serve_deployment = Some(name.to_owned());
        self
    }

    /// Workers only on nodes labelled `key=value` (e.g. a GPU pool).
    pub fn node_selector(mut self, key: &str, value: &str) -> GpuRayService {
        self.node_selector = Some((key.to_owned(), value.to_owned()));
        self
    }

    pub fn build(&self) -> Value {
        let mut serve =
            "applications:\n  - name: llm\n    import_path: serve_llm:app\n    route_prefix: /\n"
                .to_owned();
        if let Some(d) = &self.serve_deployment {
            serve.push_str(&format!(
                "    deployments:\n      - name: {d}\n        num_replicas: 1\n"
            ));
        }
        let (head_cpu, head_mem) = &self.head;
        let (worker_cpu, worker_mem) = &self.worker;
        let mut worker_pod = json!({"containers": [{
            "name": "ray-worker", "image": self.image,
            "resources": {"requests": {"cpu": worker_cpu, "memory": worker_mem},
                          "limits": {"nvidia.com/gpu": self.gpus.to_string()}}
        }]});
        if let Some((k, v)) = &self.node_selector {
            worker_pod["nodeSelector"] = json!({ k: v });
        }
        json!({
            "apiVersion": "ray.io/v1",
            "kind": "RayService",
            "metadata": {"name": self.name},
            "spec": {
                "rayClusterDeletionDelaySeconds": 2,
                "serveConfigV2": serve,
                "rayClusterConfig": {
                    "rayVersion": "2.9.0",
                    "headGroupSpec": {
                        "rayStartParams": {"num-gpus": "0"},
                        "template": {"spec": {"containers": [{
                            "name": "ray-head", "image": "rayproject/ray:2.9.0",
                            "resources": {"requests": {"cpu": head_cpu, "memory": head_mem},
                                          "limits": {"cpu": head_cpu, "memory": head_mem}}
                        }]}}
                    },
                    "workerGroupSpecs": [{
                        "groupName": "gpu-workers",
                        "replicas": self.replicas, "minReplicas": 0, "maxReplicas": 8,
                        "rayStartParams": {},
                        "template": {"spec": worker_pod}
                    }]
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_land_where_kuberay_reads_them() {
        let v = GpuRayService::new("llm", "img:2")
            .replicas(3)
            .gpus(4)
            .head("1", "4Gi")
            .worker("2", "8Gi")
            .serve_deployment("LLM")
            .build();
        let rc = &v["spec"]["rayClusterConfig"];
        let head = &rc["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"];
        assert_eq!(head["requests"], json!({"cpu": "1", "memory": "4Gi"}));
        assert_eq!(head["limits"], head["requests"]);
        let group = &rc["workerGroupSpecs"][0];
        assert_eq!(group["replicas"], 3);
        let worker = &group["template"]["spec"]["containers"][0];
        assert_eq!(worker["image"], "img:2");
        assert_eq!(
            worker["resources"],
            json!({"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"nvidia.com/gpu": "4"}})
        );
        assert_eq!(
            v["spec"]["serveConfigV2"],
            "applications:\n  - name: llm\n    import_path: serve_llm:app\n    route_prefix: /\n    deployments:\n      - name: LLM\n        num_replicas: 1\n"
        );
        let plain = GpuRayService::new("llm", "img:1").build();
        assert_eq!(
            plain["spec"]["serveConfigV2"],
            "applications:\n  - name: llm\n    import_path: serve_llm:app\n    route_prefix: /\n"
        );
        assert_eq!(plain["metadata"], json!({"name": "llm"}));
        let pod = &plain["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"];
        assert!(pod.get("nodeSelector").is_none(), "{pod}");
        let pooled = GpuRayService::new("llm", "img:1")
            .node_selector("raygate.io/pool", "gpu")
            .build();
        assert_eq!(
            pooled["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"],
            json!({"raygate.io/pool": "gpu"})
        );
    }
}
