//! raygate's reservation Workload: the quota of a new cluster held in Kueue
//! for the whole transition, since Kueue counts one cluster per RayService
//! (kueue#11102). Measured on Kueue v0.19.0 (docs/kueue.md): a Workload no
//! job owns, or owned by a non-job object, is admitted like any other and
//! counted in its ClusterQueue's `flavorsReservation` and `flavorsUsage`;
//! its owner's deletion garbage-collects it and frees the quota. Kueue's
//! `waitForPodsReady` (on by default, 30 min) would evict it for pods it
//! never gets: raygate writes condition `PodsReady=True` once it exists
//! (measured: no eviction).
//!
//! Priority: the plan's effective priority when positive (a platform that
//! lets the plan jump the queue lets its reservation too), else
//! [`LOWEST_PRIORITY`]: with any `preemption` policy of the ClusterQueue,
//! the reservation never preempts a running workload to make room.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;

use super::LocalQueueName;
use super::types::{PodSet, Workload, WorkloadSpec};
use crate::podgroup::{HEAD, PodGroup, PodRole};

/// Labels of a reservation: raygate made it, for which plan and change.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "raygate";
pub const LABEL_PLAN_UID: &str = "raygate.io/plan-uid";
pub const LABEL_FINGERPRINT: &str = "raygate.io/fingerprint";
/// Marks the Workload as a quota reservation (not a capacity request).
pub const LABEL_RESERVATION: &str = "raygate.io/reservation";
/// The selector of every reservation raygate made.
pub const SELECTOR: &str = "app.kubernetes.io/managed-by=raygate,raygate.io/reservation=quota";
/// Kueue admits at most 8 pod sets per Workload (`PodSets` `MaxItems=8`).
pub const MAX_POD_SETS: usize = 8;
/// The priority of a reservation whose plan does not outrank others.
pub const LOWEST_PRIORITY: i32 = i32::MIN;

/// The UpgradePlan a reservation belongs to.
pub struct Owner<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

/// The reservation Workload `name` for the new cluster's pod groups, in
/// `queue`, owned by the plan (garbage-collected with it).
pub fn workload(
    owner: &Owner<'_>,
    name: &str,
    queue: &LocalQueueName,
    fingerprint: &str,
    groups: &[PodGroup],
    plan_priority: i32,
) -> crate::Result<Workload> {
    let mut seen = BTreeSet::new();
    let mut pod_sets = Vec::new();
    for g in groups.iter().filter(|g| g.count > 0) {
        let base = match PodRole::of(&g.template) {
            Some(PodRole::Worker(group)) => dns_label(&group),
            _ => HEAD.to_string(),
        };
        let mut set_name = base.clone();
        let mut i = 1;
        while !seen.insert(set_name.clone()) {
            set_name = format!("{}-{i}", base.chars().take(60).collect::<String>());
            i += 1;
        }
        pod_sets.push(PodSet {
            name: set_name,
            template: PodTemplateSpec {
                metadata: None,
                spec: g.template.spec.clone(),
            },
            count: i32::try_from(g.count).map_err(|_| {
                crate::Error::invalid("reservation", format!("{} pods in one group", g.count))
            })?,
        });
    }
    if pod_sets.is_empty() {
        return Err(crate::Error::invalid(
            "reservation",
            "the new cluster has no pods",
        ));
    }
    if pod_sets.len() > MAX_POD_SETS {
        return Err(crate::Error::invalid(
            "reservation",
            format!(
                "the new cluster has {} pod groups; a Kueue Workload holds at most {MAX_POD_SETS}",
                pod_sets.len()
            ),
        ));
    }
    let priority = if plan_priority > 0 {
        plan_priority
    } else {
        LOWEST_PRIORITY
    };
    let mut w = Workload::new(
        name,
        WorkloadSpec {
            pod_sets,
            queue_name: Some(queue.to_string()),
            priority: Some(priority),
            active: None,
        },
    );
    w.metadata = ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(owner.namespace.to_string()),
        labels: Some(labels(owner.uid, fingerprint)),
        owner_references: Some(vec![OwnerReference {
            api_version: "raygate.io/v1alpha1".into(),
            kind: "UpgradePlan".into(),
            name: owner.name.to_string(),
            uid: owner.uid.to_string(),
            controller: Some(true),
            block_owner_deletion: None,
        }]),
        ..Default::default()
    };
    Ok(w)
}

/// The labels raygate finds a reservation by.
pub fn labels(plan_uid: &str, fingerprint: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_RESERVATION.to_string(), "quota".to_string()),
        (LABEL_PLAN_UID.to_string(), label_value(plan_uid)),
        (LABEL_FINGERPRINT.to_string(), label_value(fingerprint)),
    ])
}

/// A label value: at most 63 characters.
pub fn label_value(s: &str) -> String {
    s.chars().take(63).collect()
}

/// A pod set name: a DNS label (lower case, `[a-z0-9-]`, at most 63).
fn dns_label(s: &str) -> String {
    let v: String = s
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(63)
        .collect();
    let v = v.trim_matches('-').to_string();
    if v.is_empty() { "group".into() } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn group(node_type: &str, group: &str, gpus: u32, count: usize) -> PodGroup {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "x", "labels": {"ray.io/node-type": node_type, "ray.io/group": group}},
            "spec": {"containers": [{"name": "ray", "resources": {"requests": {"cpu": "4"},
                "limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
        }))
        .unwrap();
        PodGroup {
            count,
            ..PodGroup::from(pod)
        }
    }

    const OWNER: Owner<'static> = Owner {
        namespace: "ml",
        name: "llm-plan",
        uid: "uid-1",
    };

    #[test]
    fn the_new_clusters_groups_become_pod_sets_owned_by_the_plan() {
        let groups = [
            group("head", "headgroup", 0, 1),
            group("worker", "GPU_workers", 8, 2),
            group("worker", "spare", 1, 0),
        ];
        let w = workload(
            &OWNER,
            "llm-plan-abc-quota",
            &LocalQueueName::new("team-a"),
            "abc",
            &groups,
            0,
        )
        .unwrap();
        let sets: Vec<(&str, i32)> = w
            .spec
            .pod_sets
            .iter()
            .map(|p| (p.name.as_str(), p.count))
            .collect();
        assert_eq!(sets, [("head", 1), ("gpu-workers", 2)]);
        assert_eq!(w.spec.queue_name.as_deref(), Some("team-a"));
        assert_eq!(w.spec.priority, Some(LOWEST_PRIORITY), "never preempts");
        let o = &w.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((o.kind.as_str(), o.uid.as_str()), ("UpgradePlan", "uid-1"));
        assert_eq!(w.metadata.namespace.as_deref(), Some("ml"));
        let l = w.metadata.labels.as_ref().unwrap();
        assert_eq!(l[LABEL_PLAN_UID], "uid-1");
        assert_eq!(l[LABEL_FINGERPRINT], "abc");
        let v = serde_json::to_value(&w).unwrap();
        assert_eq!(v["apiVersion"], "kueue.x-k8s.io/v1beta2");
        assert_eq!(v["kind"], "Workload");
        assert!(v["spec"]["podSets"][1]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"].is_string());
        // A plan that outranks others passes its priority on.
        let w = workload(&OWNER, "n", &LocalQueueName::new("q"), "abc", &groups, 100).unwrap();
        assert_eq!(w.spec.priority, Some(100));
    }

    #[test]
    fn too_many_groups_or_none_is_an_error_not_a_workload_kueue_refuses() {
        let many: Vec<PodGroup> = (0..9)
            .map(|i| group("worker", &format!("g{i}"), 1, 1))
            .collect();
        let e = workload(&OWNER, "n", &LocalQueueName::new("q"), "f", &many, 0).unwrap_err();
        assert!(e.to_string().contains("at most 8"), "{e}");
        assert!(workload(&OWNER, "n", &LocalQueueName::new("q"), "f", &[], 0).is_err());
        // Same group names are kept apart.
        let twice = [group("worker", "a", 1, 1), group("worker", "a", 1, 1)];
        let w = workload(&OWNER, "n", &LocalQueueName::new("q"), "f", &twice, 0).unwrap();
        assert_eq!(w.spec.pod_sets[1].name, "a-1");
    }
}
