//! Thin JSON-in/JSON-out wrapper over `Api<DynamicObject>`, so the simulation logic stays
//! untyped and independent of any Rust model of KubeRay's CRDs.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::Value;

use super::names::{API_VERSION, GROUP, VERSION};

/// API resource descriptions used by the simulator.
#[derive(Clone)]
pub struct Resources {
    pub ray_service: ApiResource,
    pub ray_cluster: ApiResource,
    pub pod: ApiResource,
    pub node: ApiResource,
}

impl Default for Resources {
    fn default() -> Self {
        let ray = |kind: &str, plural: &str| ApiResource {
            group: GROUP.into(),
            version: VERSION.into(),
            api_version: API_VERSION.into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        Resources {
            ray_service: ray("RayService", "rayservices"),
            ray_cluster: ray("RayCluster", "rayclusters"),
            pod: ApiResource::erase::<Pod>(&()),
            node: ApiResource::erase::<Node>(&()),
        }
    }
}

/// A client plus the resources, scoped to one namespace or all.
#[derive(Clone)]
pub struct Kube {
    pub client: Client,
    pub res: Resources,
    pub namespace: Option<String>,
}

/// Is this a 404 from the apiserver?
pub fn is_not_found(e: &anyhow::Error) -> bool {
    api_code(e) == Some(404)
}

/// Is this a 409 (conflict / already exists)?
pub fn is_conflict(e: &anyhow::Error) -> bool {
    api_code(e) == Some(409)
}

fn api_code(e: &anyhow::Error) -> Option<u16> {
    e.chain()
        .find_map(|c| match c.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(s)) => Some(s.code),
            _ => None,
        })
}

fn to_value(ar: &ApiResource, o: DynamicObject) -> Result<Value> {
    let mut v = serde_json::to_value(o)?;
    v["apiVersion"] = Value::String(ar.api_version.clone());
    v["kind"] = Value::String(ar.kind.clone());
    Ok(v)
}

fn to_dynamic(v: &Value) -> Result<DynamicObject> {
    serde_json::from_value(v.clone()).context("object is not a valid Kubernetes object")
}

impl Kube {
    fn api(&self, ar: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
        match ns {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, ar),
            None => Api::all_with(self.client.clone(), ar),
        }
    }

    /// Lists objects in the configured namespace (or cluster-wide for cluster-scoped kinds).
    pub async fn list(&self, ar: &ApiResource, lp: &ListParams) -> Result<Vec<Value>> {
        let ns = if ar.kind == "Node" {
            None
        } else {
            self.namespace.as_deref()
        };
        let list = self
            .api(ar, ns)
            .list(lp)
            .await
            .with_context(|| format!("list {}", ar.plural))?;
        list.items.into_iter().map(|o| to_value(ar, o)).collect()
    }

    pub async fn create(&self, ar: &ApiResource, ns: &str, obj: &Value) -> Result<Value> {
        let o = self
            .api(ar, Some(ns))
            .create(&PostParams::default(), &to_dynamic(obj)?)
            .await
            .with_context(|| format!("create {} in {ns}", ar.kind))?;
        to_value(ar, o)
    }

    pub async fn replace(&self, ar: &ApiResource, ns: &str, obj: &Value) -> Result<Value> {
        let name = crate::json::str_at(obj, &["metadata", "name"]);
        let o = self
            .api(ar, Some(ns))
            .replace(name, &PostParams::default(), &to_dynamic(obj)?)
            .await
            .with_context(|| format!("replace {} {ns}/{name}", ar.kind))?;
        to_value(ar, o)
    }

    /// PUT on the status subresource, with the object's resourceVersion for optimistic locking.
    pub async fn replace_status(&self, ar: &ApiResource, ns: &str, obj: &Value) -> Result<Value> {
        let name = crate::json::str_at(obj, &["metadata", "name"]);
        let o = self
            .api(ar, Some(ns))
            .replace_status(name, &PostParams::default(), &to_dynamic(obj)?)
            .await
            .with_context(|| format!("replace status of {} {ns}/{name}", ar.kind))?;
        to_value(ar, o)
    }

    pub async fn patch(
        &self,
        ar: &ApiResource,
        ns: Option<&str>,
        name: &str,
        patch: &Patch<Value>,
    ) -> Result<Value> {
        let o = self
            .api(ar, ns)
            .patch(name, &PatchParams::default(), patch)
            .await
            .with_context(|| format!("patch {} {name}", ar.kind))?;
        to_value(ar, o)
    }

    pub async fn patch_status(
        &self,
        ar: &ApiResource,
        ns: Option<&str>,
        name: &str,
        patch: &Patch<Value>,
    ) -> Result<Value> {
        let o = self
            .api(ar, ns)
            .patch_status(name, &PatchParams::default(), patch)
            .await
            .with_context(|| format!("patch status of {} {name}", ar.kind))?;
        to_value(ar, o)
    }

    /// Deletes; a 404 counts as success.
    pub async fn delete(
        &self,
        ar: &ApiResource,
        ns: &str,
        name: &str,
        dp: &DeleteParams,
    ) -> Result<()> {
        match self.api(ar, Some(ns)).delete(name, dp).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(anyhow::Error::new(e).context(format!("delete {} {ns}/{name}", ar.kind))),
        }
    }
}
