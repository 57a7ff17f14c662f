//! The decision's inputs from the objects one plan concerns: its RayService,
//! that service's RayClusters and their pods, however they were read.
//!
//! The controller reads them from its caches ([`crate::controller`]'s
//! `observe`), `kubectl raygate fit` from the live cluster; both build
//! [`Inputs`] here, so the live fit is decided by the same [`super::decide`]
//! on the same facts. Pure: what to read is the caller's; what the objects
//! mean (the change, its fingerprint, the verdict, the surge, the gate's
//! owner) is decided here once.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::LimitRange;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::observed::{DynPod, PodRef};
use super::settings::Operator;
use super::surge::{self, Surge};
use super::{
    ChangeError, ChangeFacts, Cluster, GateFacts, Inputs, ServiceError, ServiceFacts, Settings,
    Suspension,
};
use crate::capacity::PodGroup;
use crate::kuberay::incremental;
use crate::kuberay::{self, KubeRayVersion, RayCluster, RayService, Release, Verdict};
use crate::upgradeplan::{Admission, PlanUpgradeType, UpgradePlan, ownership};

/// One RayCluster of the service as read: its name, and its spec or why it
/// could not be read.
pub struct ClusterObject<'o> {
    pub name: String,
    pub cluster: Result<&'o RayCluster, String>,
}

/// A RayCluster of `svc`: in its namespace, labelled with its name, and not
/// owned by another RayService object (one deleted, whose clusters the garbage
/// collector has not removed yet, under the same name). KubeRay sets the
/// RayService as the cluster's controller reference.
pub fn is_cluster_of(meta: &ObjectMeta, svc: &RayService) -> bool {
    let named = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(kuberay::LABEL_ORIGINATED_FROM_CR_NAME))
        == svc.metadata.name.as_ref();
    let owned = match svc.metadata.uid.as_deref() {
        None => true,
        Some(uid) => meta
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.kind == "RayService")
            .all(|o| o.uid == uid),
    };
    meta.namespace == svc.metadata.namespace && named && owned
}

/// The inputs of one decision on `plan`: `service` is the RayService it
/// names (or why there is none), `clusters` that service's RayClusters, and
/// `pods` their pods per cluster name; `operator` the flags every plan's
/// settings are read under.
#[allow(clippy::too_many_arguments)]
pub fn inputs<'a>(
    plan: &'a UpgradePlan,
    operator: &Operator,
    release: &Release,
    now: Timestamp,
    admission_unseen: bool,
    cluster: &'a dyn Cluster,
    service: Result<&RayService, ServiceError>,
    clusters: &[ClusterObject<'_>],
    pods: BTreeMap<String, Vec<PodRef>>,
) -> Inputs<'a> {
    let version = release.version;
    let ns = plan.namespace().unwrap_or_default();
    let mut inp = Inputs {
        now,
        plan,
        release: release.clone(),
        settings: Settings::parse(plan, operator),
        service: Err(ServiceError::NotFound {
            namespace: ns.clone(),
            name: plan.spec.ray_service_ref.name.clone(),
        }),
        change: Ok(None),
        verdict: None,
        incremental: None,
        clusters: BTreeSet::new(),
        pods: BTreeMap::new(),
        pending_ready: false,
        pending_fingerprint: None,
        pending_stamp: Default::default(),
        gate: GateFacts::default(),
        admission_unseen,
        quota: None,
        capacity_request: None,
        cluster,
    };
    let svc = match service {
        Ok(s) => s,
        Err(e) => {
            inp.service = Err(e);
            return inp;
        }
    };
    inp.gate = gate_facts(svc);
    inp.incremental = incremental_of(plan, svc, release);
    let mut facts = service_facts(svc);

    inp.clusters = clusters.iter().map(|c| c.name.clone()).collect();
    inp.pods = pods;
    let find = |name: &Option<String>| {
        name.as_ref()
            .and_then(|n| clusters.iter().find(|c| &c.name == n))
    };
    let pending_cluster = find(&facts.pending_cluster);
    let pending = pending_cluster.and_then(|c| c.cluster.as_ref().ok().copied());
    inp.pending_ready = pending
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.state.as_deref())
        == Some("ready");
    inp.pending_fingerprint = pending.and_then(|c| cluster_fingerprint(c, version));
    inp.pending_stamp = crate::admission::quota::PendingStamp {
        service: svc.spec.ray_cluster_config.as_ref().and_then(slice_stamp),
        pending: pending.and_then(|c| slice_stamp(&c.spec)),
        pending_suspended: pending.is_some_and(|c| c.spec.suspend == Some(true)),
    };

    // KubeRay compares the spec with the pending cluster when there is one.
    let base = pending_cluster.or_else(|| find(&facts.active_cluster));
    (inp.change, inp.verdict) = match (&facts.active_cluster, base) {
        (None, _) => (Ok(None), None),
        (Some(a), None) => (
            Err(ChangeError::ActiveClusterMissing {
                namespace: ns.clone(),
                cluster: a.clone(),
            }),
            None,
        ),
        (Some(_), Some(base)) => match &base.cluster {
            Err(e) => (
                Err(ChangeError::ClusterUnreadable {
                    cluster: base.name.clone(),
                    error: e.clone(),
                }),
                None,
            ),
            Ok(cluster) => {
                let (change, verdict, outage) =
                    change_against(svc, cluster, release, plan.spec.upgrade_type);
                // Only against the active cluster: while a new cluster is
                // prepared KubeRay does not apply suspend in place.
                if facts.pending_cluster.is_none() {
                    facts.suspension = outage.map(|outage| Suspension::Applying { outage });
                }
                (change, verdict)
            }
        },
    };
    // An active cluster suspended already serves nothing, whatever the spec
    // says now (Kueue resumes it by clearing suspend: reported as it happens).
    if let Some(Ok(active)) = find(&facts.active_cluster).map(|c| c.cluster.as_ref())
        && active.spec.suspend == Some(true)
        && facts.suspension.is_none()
    {
        facts.suspension = Some(Suspension::Suspended {
            cluster: active.name_any(),
        });
    }
    // Refused from the start, not only once KubeRay has a cluster to compare
    // with: the tenant learns it as soon as the object is cached.
    if let (Ok(None), Some(e)) = (&inp.change, over_budget(svc)) {
        (inp.change, inp.verdict) = (Err(e), None);
    }
    // What the change brings: an incremental upgrade fits its surge next to
    // the active cluster.
    if let Ok(Some(c)) = &inp.change {
        let active: Vec<&DynPod> = facts
            .active_cluster
            .as_ref()
            .and_then(|a| inp.pods.get(a))
            .map(|p| p.iter().map(AsRef::as_ref).collect())
            .unwrap_or_default();
        let opts = inp.incremental.as_ref().and_then(|o| o.as_ref().ok());
        inp.change = change_pods(svc, opts, &active, version, &cluster.rules().limit_ranges)
            .map(|(new_pods, surge)| {
                Some(ChangeFacts {
                    fingerprint: c.fingerprint.clone(),
                    triggering_paths: c.triggering_paths.clone(),
                    new_pods,
                    surge,
                })
            })
            .map_err(ChangeError::from);
    }
    inp.service = Ok(facts);
    inp
}

/// The service's spec with the gate forced open with the plan's strategy:
/// raygate's own `None` must not hide what KubeRay would do once the gate opens.
fn with_gate_open(svc: &RayService, t: PlanUpgradeType) -> RayService {
    let mut s = svc.clone();
    let strategy = s.spec.upgrade_strategy.get_or_insert_with(Default::default);
    strategy.type_ = Some(match t {
        PlanUpgradeType::NewCluster => kuberay::UpgradeType::NewCluster,
        PlanUpgradeType::NewClusterWithIncrementalUpgrade => {
            kuberay::UpgradeType::NewClusterWithIncrementalUpgrade
        }
    });
    s
}

/// A plan's incremental options under the release, `None` for `NewCluster`.
pub fn incremental_of(
    plan: &UpgradePlan,
    svc: &RayService,
    release: &Release,
) -> Option<Result<incremental::Options, incremental::Problem>> {
    (plan.spec.upgrade_type == PlanUpgradeType::NewClusterWithIncrementalUpgrade)
        .then(|| incremental::validate(svc, &release.version.rules(), release.incremental_gate()))
}

/// What a plan's change brings, derived once for its own decision (the
/// [`ChangeFacts`] of [`inputs`]) and for the admission pass's queue
/// ([`pods_to_fit`]): the new cluster's pods and, for an incremental upgrade
/// (`opts`), its surge next to the `active` cluster's pods.
pub fn change_pods(
    svc: &RayService,
    opts: Option<&incremental::Options>,
    active: &[&DynPod],
    version: KubeRayVersion,
    limit_ranges: &[LimitRange],
) -> crate::Result<(Vec<PodGroup>, Option<Surge>)> {
    let new_pods = new_cluster_pods(svc, version)?;
    let surge = opts
        .map(|o| surge_of(svc, &new_pods, active, o, version, limit_ranges))
        .transpose()?;
    Ok((new_pods, surge))
}

/// The pods a plan waiting in the queue must fit: its [`change_pods`], as
/// [`ChangeFacts::pods_to_fit`] picks them for its own decision. An
/// incremental upgrade whose options are invalid is an error (its own
/// decision reports the problem).
pub fn pods_to_fit(
    plan: &UpgradePlan,
    svc: &RayService,
    release: &Release,
    active: &[&DynPod],
    limit_ranges: &[LimitRange],
) -> crate::Result<Vec<PodGroup>> {
    let opts = incremental_of(plan, svc, release)
        .transpose()
        .map_err(|p| crate::Error::invalid("RayService", p.to_string()))?;
    let (new_pods, surge) = change_pods(svc, opts.as_ref(), active, release.version, limit_ranges)?;
    Ok(super::fitted_pods(new_pods, surge))
}

/// The surge of `svc`'s new cluster next to its active cluster's pods.
fn surge_of(
    svc: &RayService,
    full: &[PodGroup],
    active: &[&DynPod],
    opts: &incremental::Options,
    version: KubeRayVersion,
    limit_ranges: &[LimitRange],
) -> crate::Result<Surge> {
    let bounds = incremental::group_bounds(svc, &version.rules());
    let active = surge::active_groups(active, limit_ranges)?;
    surge::plan(full, &bounds, &active, opts, limit_ranges)
}

/// The pending cluster of an admitted change: the one the RayService names,
/// else the one the admission recorded.
pub fn pending_cluster_of(svc: &RayService, adm: &Admission) -> Option<String> {
    pending_cluster(svc).or(adm.to_cluster.clone())
}

/// The cluster the RayService's status names as pending.
fn pending_cluster(svc: &RayService) -> Option<String> {
    status_cluster(
        svc.status
            .as_ref()
            .and_then(|s| s.pending_service_status.as_ref()),
    )
}

/// The pods an admitted change still holds in the ledger: its new
/// cluster's pods the scheduler has not bound (`existing` are the pending
/// cluster's pods; `pending` is that cluster, planned from its own spec once
/// it exists), or for an incremental transition its surge budget, held to
/// the end next to the `active` cluster's pods.
pub fn admitted_pods(
    adm: &Admission,
    svc: &RayService,
    pending: Option<&RayCluster>,
    existing: &[&DynPod],
    active: &[&DynPod],
    version: KubeRayVersion,
) -> crate::Result<Vec<PodGroup>> {
    let ns = svc.namespace().unwrap_or_default();
    let planned = match pending {
        Some(c) => kuberay::planned_groups(&c.name_any(), &ns, &c.spec, version)?,
        None => new_cluster_pods(svc, version)?,
    };
    if adm.surge.is_empty() {
        return Ok(super::ledger::unbound(&planned, existing));
    }
    let full = match pending {
        Some(_) => new_cluster_pods(svc, version)?,
        None => planned,
    };
    Ok(surge::held(
        &full,
        &adm.surge,
        &surge::bound_by_group(active),
        &surge::bound_by_group(existing),
    ))
}

/// The pods KubeRay will create for the service's new cluster, named after
/// `<service>-next` (the real name is random and not known yet).
pub fn new_cluster_pods(svc: &RayService, version: KubeRayVersion) -> crate::Result<Vec<PodGroup>> {
    let ns = svc.namespace().unwrap_or_default();
    let name = format!("{}-next", svc.name_any());
    kuberay::planned_groups(&name, &ns, kuberay::checked_cluster_config(svc)?, version)
}

/// A cluster name the RayService status gives (empty means none).
pub fn status_cluster(s: Option<&kuberay::RayServiceStatus>) -> Option<String> {
    s.and_then(|s| s.ray_cluster_name.clone())
        .filter(|n| !n.is_empty())
}

/// The gate's value and who owns it.
fn gate_facts(svc: &RayService) -> GateFacts {
    let managed = svc.metadata.managed_fields.as_deref().unwrap_or(&[]);
    GateFacts {
        value: svc
            .spec
            .upgrade_strategy
            .as_ref()
            .and_then(|u| u.type_.clone()),
        other_owner: ownership::other_owner(managed),
        owned_by_us: ownership::owned_by_us(managed),
        uid: svc.metadata.uid.clone(),
    }
}

/// The clusters the RayService status names, and the pending one's apps.
fn service_facts(svc: &RayService) -> ServiceFacts {
    let status = svc.status.as_ref();
    let pending = status.and_then(|s| s.pending_service_status.as_ref());
    let active = status.and_then(|s| s.active_service_status.as_ref());
    ServiceFacts {
        uid: svc.metadata.uid.clone(),
        kueue: crate::kueue::Managed::of(&svc.metadata),
        kueue_stopped: crate::kueue::Managed::of(&svc.metadata).is_some()
            && svc
                .spec
                .ray_cluster_config
                .as_ref()
                .is_some_and(|c| c.suspend == Some(true)),
        suspension: None,
        upgrade_in_progress: svc.condition_true(kuberay::types::CONDITION_UPGRADE_IN_PROGRESS),
        pending_target_capacity: pending.and_then(|p| p.target_capacity),
        pending_traffic_percent: pending.and_then(|p| p.traffic_routed_percent),
        active_target_capacity: active.and_then(|a| a.target_capacity),
        active_cluster: status_cluster(active),
        pending_cluster: pending_cluster(svc),
        pending_apps: pending
            .and_then(|p| p.application_statuses.as_ref())
            .map(|apps| {
                apps.iter()
                    .map(|(k, v)| (k.clone(), v.status.clone().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// A RayService whose rayClusterConfig raygate did not keep whole
/// ([`kuberay::budget`]): the finding, with the field path.
fn over_budget(svc: &RayService) -> Option<ChangeError> {
    let e = svc.spec.ray_cluster_config.as_ref()?.over_budget.as_ref()?;
    Some(ChangeError::OverBudget {
        kind: "RayService",
        name: svc.name_any(),
        error: e.clone(),
    })
}

/// Kueue's slice stamp ([`crate::kueue::slice_stamp`]) of a cluster spec's
/// pod templates, the head group's first.
fn slice_stamp(spec: &kuberay::types::RayClusterSpec) -> Option<String> {
    let head = spec
        .head_group_spec
        .iter()
        .filter_map(|h| h.template.as_ref());
    let workers = spec
        .worker_group_specs
        .iter()
        .flatten()
        .filter_map(|g| g.template.as_ref());
    crate::kueue::slice_stamp(head.chain(workers))
}

/// The fingerprint a RayCluster's own spec has, computed as a change's is
/// (muted fields and `suspend` left out, [`kuberay::classify::change_fingerprint`]),
/// so it can be compared with an admitted one.
fn cluster_fingerprint(c: &RayCluster, version: KubeRayVersion) -> Option<kuberay::Fingerprint> {
    // A spec over raygate's bounds was not kept: no fingerprint to give.
    kuberay::budget::check(&c.spec, "spec").ok()?;
    let spec = serde_json::to_value(&c.spec).ok()?;
    let n = kuberay::normalize::normalize_cluster_spec(&spec, &version.rules(), "RayCluster spec")
        .ok()?;
    Some(kuberay::classify::change_fingerprint(&n.muted))
}

/// What the change against `cluster` makes: the change, the verdict, and
/// the outage it causes, if any ([`kuberay::Classification::outage`]).
type Against = (
    Result<Option<ChangeFacts>, ChangeError>,
    Option<Verdict>,
    Option<String>,
);

/// The change the service's spec makes against `cluster`, the verdict, and
/// the outage it causes.
fn change_against(
    svc: &RayService,
    cluster: &RayCluster,
    release: &Release,
    t: PlanUpgradeType,
) -> Against {
    let version = release.version;
    // Specs over raygate's bounds were pruned in the cache: refused here,
    // before anything would be compared or planned.
    if let Some(e) = over_budget(svc) {
        return (Err(e), None, None);
    }
    if let Some(e) = &cluster.spec.over_budget {
        let e = ChangeError::OverBudget {
            kind: "RayCluster",
            name: cluster.name_any(),
            error: e.clone(),
        };
        return (Err(e), None, None);
    }
    let open = with_gate_open(svc, t);
    // The operator's incremental-upgrade gate as raygate was told it.
    let opts = kuberay::ClassifyOptions {
        incremental_upgrade_gate: Some(release.incremental_gate()),
        ..Default::default()
    };
    let c = match kuberay::classify_with(
        &kuberay::OldSide::RayCluster(cluster),
        &open,
        version,
        &opts,
    ) {
        Ok(c) => c,
        Err(e) => return (Err(e.into()), None, None),
    };
    if c.verdict != Verdict::NewCluster {
        return (Ok(None), Some(c.verdict), c.outage);
    }
    // Its pods are filled in by `inputs` ([`change_pods`]).
    let change = ChangeFacts {
        fingerprint: c.fingerprint.clone(),
        triggering_paths: c.triggering_paths.clone(),
        new_pods: vec![],
        surge: None,
    };
    (Ok(Some(change)), Some(c.verdict), None)
}
