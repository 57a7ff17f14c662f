//! `raygate release`: give every gate back and drop raygate's finalizers,
//! so that raygate can be uninstalled without leaving a RayService held at
//! `upgradeStrategy: None` or an UpgradePlan stuck Terminating.
//!
//! The operator must be stopped first (else it would add the finalizers
//! again and re-apply the gates): with `--scale-down`, the command sets the
//! operator's Deployment to zero replicas and waits until its pods are gone.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::{FINALIZER, gate, guarded};
use crate::leader::Fence;
use crate::upgradeplan::UpgradePlan;
use crate::{Error, Result};

/// Removes raygate's finalizer from `plan`, keeping the others; the patch
/// is conditional on the resourceVersion read, so a concurrent change to the
/// list is never overwritten.
pub async fn remove_finalizer(
    api: &Api<UpgradePlan>,
    plan: &UpgradePlan,
    fence: &Fence,
) -> Result<()> {
    if !plan.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let rest: Vec<&String> = plan
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .collect();
    let patch = json!({"metadata": {
        "finalizers": rest,
        "resourceVersion": plan.resource_version(),
    }});
    let (name, params, patch) = (
        plan.name_any(),
        PatchParams::default(),
        Patch::Merge(&patch),
    );
    match guarded(
        fence,
        "removing the finalizer",
        api.patch(&name, &params, &patch),
    )
    .await?
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What `raygate release` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Released {
    pub gates: Vec<String>,
    pub finalizers: Vec<String>,
    /// CapacityBuffers (and their PodTemplates) deleted, `ns/name`.
    pub capacity_requests: Vec<String>,
    /// Kueue quota reservation Workloads deleted, `ns/name`.
    pub quota_reservations: Vec<String>,
}

/// Stops the operator: `deployment` (in `ns`) to zero replicas, then waits
/// until none of its pods is left (a pod that is still terminating may
/// still write).
pub async fn scale_down(client: &Client, ns: &str, deployment: &str, wait: Duration) -> Result<()> {
    let fence = Fence::open();
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let patch = json!({"spec": {"replicas": 0}});
    let d = guarded(
        &fence,
        "scaling the operator down",
        api.patch(deployment, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await??;
    let selector = d
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            Error::invalid(
                format!("deployment {ns}/{deployment}"),
                "has no spec.selector.matchLabels",
            )
        })?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let start = Instant::now();
    loop {
        let left = guarded(
            &fence,
            "listing the operator's pods",
            pods.list(&ListParams::default().labels(&selector)),
        )
        .await??
        .items
        .len();
        if left == 0 {
            return Ok(());
        }
        if start.elapsed() > wait {
            return Err(Error::invalid(
                format!("deployment {ns}/{deployment}"),
                format!(
                    "{left} pods still running after {wait:?}; stop the operator before releasing"
                ),
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Which UpgradePlans `raygate release` gives back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (uninstalling).
    All,
    /// These namespaces only (taken out of raygate's scope).
    Only(Vec<String>),
    /// Every namespace but these: raygate goes from all namespaces to these,
    /// so every other namespace left its scope. Resolved at run time from the
    /// plans listed, so a namespace created since the chart rendered counts.
    Except(Vec<String>),
}

impl Scope {
    /// The scope of `--namespace` (`only`) or `--except-namespace` (`except`),
    /// else all. An empty name is refused: `--except-namespace=` from a broken
    /// template would otherwise give back every gate in the cluster.
    pub fn new(only: &[String], except: &[String]) -> Result<Scope> {
        for (flag, names) in [("--namespace", only), ("--except-namespace", except)] {
            if names.iter().any(|n| n.trim().is_empty()) {
                return Err(Error::invalid(flag, "an empty namespace name"));
            }
        }
        Ok(match (only.is_empty(), except.is_empty()) {
            (false, _) => Scope::Only(only.to_vec()),
            (true, false) => Scope::Except(except.to_vec()),
            (true, true) => Scope::All,
        })
    }

    /// The namespaces to list plans in, one list call each; `None` is one
    /// cluster-wide list.
    fn lists(&self) -> Vec<Option<&str>> {
        match self {
            Scope::Only(nss) => nss.iter().map(|ns| Some(ns.as_str())).collect(),
            Scope::All | Scope::Except(_) => vec![None],
        }
    }

    /// Whether a plan in `ns` is given back.
    fn covers(&self, ns: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Only(nss) => nss.iter().any(|n| n == ns),
            Scope::Except(nss) => !nss.iter().any(|n| n == ns),
        }
    }
}

/// Gives back every gate of the plans in `scope` and removes their
/// finalizers.
pub async fn release(client: &Client, scope: &Scope) -> Result<Released> {
    let mut done = Released::default();
    for namespace in scope.lists() {
        let one = release_listed(client, namespace, scope).await?;
        done.gates.extend(one.gates);
        done.finalizers.extend(one.finalizers);
        // No capacity request may outlive raygate: the autoscaler would keep
        // paying for it.
        done.capacity_requests
            .extend(super::buffers::release(client, namespace, |ns| scope.covers(ns)).await?);
        // Nor a quota reservation: Kueue would keep the quota from others.
        done.quota_reservations
            .extend(super::reservations::release(client, namespace, |ns| scope.covers(ns)).await?);
    }
    Ok(done)
}

/// The plans of one list call (`namespace`, or all when `None`) that `scope`
/// covers.
async fn release_listed(
    client: &Client,
    namespace: Option<&str>,
    scope: &Scope,
) -> Result<Released> {
    let fence = Fence::open();
    let plans: Api<UpgradePlan> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let list = guarded(
        &fence,
        "listing UpgradePlans",
        plans.list(&ListParams::default()),
    )
    .await??
    .items;
    let mut done = Released::default();
    for plan in &list {
        let ns = plan.namespace().unwrap_or_default();
        if !scope.covers(&ns) {
            continue;
        }
        let services: gate::Services = Api::namespaced(client.clone(), &ns);
        let mut names = vec![plan.spec.ray_service_ref.name.clone()];
        if let Some(recorded) = plan.status.as_ref().and_then(|s| s.ray_service.clone())
            && !names.contains(&recorded)
        {
            names.push(recorded);
        }
        for name in names {
            let found = guarded(
                &fence,
                "reading a RayService",
                services.get_metadata_opt(&name),
            )
            .await??;
            let Some(svc) = found else { continue };
            if !gate::owned_by_us(svc.metadata.managed_fields.as_deref().unwrap_or(&[])) {
                continue;
            }
            let Some(uid) = svc.metadata.uid.as_deref() else {
                continue;
            };
            let target = gate::Target { name: &name, uid };
            match guarded(
                &fence,
                "giving back the gate",
                gate::release(&services, target),
            )
            .await?
            {
                Ok(()) => done.gates.push(format!("{ns}/{name}")),
                Err(e) if gate::is_gone(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let api: Api<UpgradePlan> = Api::namespaced(client.clone(), &ns);
        if plan.finalizers().iter().any(|f| f == FINALIZER) {
            remove_finalizer(&api, plan, &fence).await?;
            done.finalizers.push(format!("{ns}/{}", plan.name_any()));
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nss(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_make_the_scope_and_empty_names_are_refused() {
        assert_eq!(Scope::new(&[], &[]).ok(), Some(Scope::All));
        assert_eq!(
            Scope::new(&nss(&["a"]), &[]).ok(),
            Some(Scope::Only(nss(&["a"])))
        );
        assert_eq!(
            Scope::new(&[], &nss(&["a", "b"])).ok(),
            Some(Scope::Except(nss(&["a", "b"])))
        );
        for (only, except, flag) in [
            (nss(&[""]), vec![], "--namespace"),
            (vec![], nss(&["a", " "]), "--except-namespace"),
        ] {
            let e = Scope::new(&only, &except).err().map(|e| e.to_string());
            assert!(
                e.as_deref().is_some_and(|e| e.contains(flag)),
                "{only:?} {except:?}: {e:?}"
            );
        }
    }

    #[test]
    fn all_lists_once_and_covers_every_namespace() {
        assert_eq!(Scope::All.lists(), vec![None]);
        assert!(Scope::All.covers("anything"));
    }

    #[test]
    fn only_lists_each_namespace_and_covers_just_those() {
        let s = Scope::Only(nss(&["a", "b"]));
        assert_eq!(s.lists(), vec![Some("a"), Some("b")]);
        assert!(s.covers("a") && s.covers("b"));
        assert!(!s.covers("c"));
    }

    #[test]
    fn except_lists_once_and_skips_the_kept_namespaces() {
        let s = Scope::Except(nss(&["a"]));
        assert_eq!(s.lists(), vec![None]);
        assert!(!s.covers("a"));
        assert!(s.covers("b") && s.covers("kube-system"));
    }
}
