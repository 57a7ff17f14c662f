//! Kueue's quota as a second capacity dimension (rule 4 of [`super::rules`]):
//! a change of a Kueue-managed RayService whose new cluster fits the nodes
//! is admitted only once its ClusterQueue has the quota for it next to the
//! serving cluster's ([`crate::kueue::quota`]: nominal + what the cohort may
//! lend − reserved − raygate's reservations Kueue does not count yet), and
//! Kueue granted raygate's reservation Workload for it: Kueue counts one
//! cluster per RayService (kueue#11102), so without the reservation the
//! second cluster's quota could be taken by any other workload meanwhile.
//!
//! - quota short: `WaitingForQuota`, the numbers per resource in
//!   `status.quota` and the message, one Warning Event per change;
//! - quota there, reservation not granted yet: `WaitingForQuota` (waiting
//!   for `quota reservation`); `status.quota.reservation` names the
//!   Workload the controller creates;
//! - granted: admitted. The reservation is kept while the transition runs
//!   and deleted when it ends (the controller, `controller::reservations`);
//! - once KubeRay is building the new cluster of an elastic RayService
//!   (`UpgradeInProgress`, a pending cluster), raygate has Kueue derive the
//!   RayService's own Workload again from the spec, now the new cluster's
//!   (`refresh`): measured on Kueue v0.19.0 with KubeRay v1.6.2, deleting
//!   that Workload then suspends only the pending cluster for < 0.3 s (KubeRay
//!   applies nothing to the active cluster while `UpgradeInProgress`), Kueue
//!   admits the new Workload and the new cluster's pods are no longer held by
//!   the `kueue.x-k8s.io/elastic-job` scheduling gate; the switch completes
//!   and the serving cluster never loses a pod. raygate's reservation then
//!   stands for the old cluster until the switch.

use super::render::Builder;
use super::{ChangeFacts, EventReason, Outcome};
use crate::capacity::{ACCELERATORS, FitReport, ResourceList, sum_of};
use crate::kueue::quota::{self as q, QuotaReport};
use crate::kueue::types::{ClusterQueue, Workload};
use crate::kueue::{LocalQueueName, Managed};
use crate::quantity::Quantity;
use crate::upgradeplan::{Phase, QuotaReservation, QuotaResourceStatus, QuotaStatus, condition};
use condition::{Reason, Status};

/// What raygate read of Kueue for one plan.
#[derive(Debug, Clone)]
pub struct QuotaFacts {
    /// The ClusterQueue of the RayService's LocalQueue with every
    /// ClusterQueue (its cohort is found among them), or why not.
    pub queue: Result<QueueQuota, String>,
    /// raygate's reservation Workload of this plan, if one exists.
    pub reservation: Option<QuotaReservation>,
    /// Kueue's own Workload of the RayService, read once raygate has had
    /// it derived again (`refresh`, path B); `None` before, or when unread.
    pub service_workload: Option<ServiceWorkload>,
}

/// Kueue's own Workload of the RayService, as raygate reads it after the
/// refresh: whether Kueue admitted it and, if not, Kueue's own words why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceWorkload {
    pub name: String,
    pub admitted: bool,
    /// `QuotaReserved=False`'s reason and message (e.g. `Pending: LocalQueue
    /// team is stopped`), when Kueue gave one.
    pub why: Option<String>,
}

impl ServiceWorkload {
    /// The RayService's current Workload among `workloads` (Kueue's, with
    /// its `kueue.x-k8s.io/job-uid` label): not being deleted, not
    /// `Finished` (an elastic service's replaced slice). `None` when Kueue
    /// has made none yet.
    pub fn of(workloads: &[Workload]) -> Option<ServiceWorkload> {
        let live: Vec<&Workload> = workloads
            .iter()
            .filter(|w| w.metadata.deletion_timestamp.is_none())
            .filter(|w| {
                !w.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Finished" && c.status == "True")
                })
            })
            .collect();
        let w = live.iter().find(|w| w.quota_granted()).or(live.first())?;
        let why = w.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == crate::kueue::types::CONDITION_QUOTA_RESERVED)
                .filter(|c| c.status == "False")
                .map(|c| match (c.reason.as_str(), c.message.as_str()) {
                    ("", m) => m.to_string(),
                    (r, "") => r.to_string(),
                    (r, m) => format!("{r}: {m}"),
                })
        });
        Some(ServiceWorkload {
            name: w.metadata.name.clone().unwrap_or_default(),
            admitted: w.quota_granted(),
            why,
        })
    }
}

/// The RayService's Workload that Kueue has not admitted after raygate had
/// it derived again in this transition (the deletion done: the previous
/// decision recorded it), so the new cluster stays suspended, and has said
/// why (`QuotaReserved=False`: a Workload Kueue has not looked at yet is
/// new, not held; measured, Kueue admits one it can within 0.1 s). `None`
/// otherwise.
pub(super) fn blocked<'f>(
    prev: Option<&QuotaStatus>,
    facts: Option<&'f QuotaFacts>,
) -> Option<&'f ServiceWorkload> {
    let refreshed = prev.is_some_and(|q| q.workload_refreshed_for.is_some());
    let w = facts?.service_workload.as_ref()?;
    (refreshed && !w.admitted && w.why.is_some()).then_some(w)
}

/// A ClusterQueue and what else counts against it.
#[derive(Debug, Clone)]
pub struct QueueQuota {
    pub cluster_queue: ClusterQueue,
    pub all: Vec<ClusterQueue>,
    /// Other plans' reservations in this ClusterQueue that Kueue has not
    /// admitted yet (so its status does not count them), per resource.
    pub uncounted: ResourceList,
}

/// The ClusterQueue of LocalQueue `ns/queue` and what counts against it,
/// from Kueue's objects as raygate reads them: the controller's caches
/// (`--kueue`) and `raygate fit --state` both decide through it.
/// `cluster_queue_of(ns, queue)`: the ClusterQueue a LocalQueue names;
/// `reservations`: raygate's reservation Workloads (those of
/// `own_plan_uid` are the plan's own, not another plan's).
pub fn queue_quota<'a>(
    ns: &str,
    queue: &LocalQueueName,
    cluster_queue_of: impl Fn(&str, &str) -> Option<String>,
    all: Vec<ClusterQueue>,
    reservations: impl IntoIterator<Item = &'a Workload>,
    own_plan_uid: Option<&str>,
) -> Result<QueueQuota, String> {
    let cq_name = cluster_queue_of(ns, queue.as_str()).ok_or_else(|| {
        format!("LocalQueue {ns}/{queue} not found (or it names no ClusterQueue)")
    })?;
    let cq = all
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(cq_name.as_str()))
        .cloned()
        .ok_or_else(|| format!("ClusterQueue {cq_name} not found"))?;
    let own = own_plan_uid.map(crate::kueue::reservation::label_value);
    // Other plans' reservations in this ClusterQueue Kueue has not
    // admitted yet: not in its status, but raygate means to take them.
    let mut uncounted = ResourceList::new();
    for w in reservations {
        let wns = w.metadata.namespace.as_deref().unwrap_or("default");
        let same = w
            .spec
            .queue_name
            .as_deref()
            .and_then(|q| cluster_queue_of(wns, q))
            .as_deref()
            == Some(cq_name.as_str());
        let plan = w
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::kueue::reservation::LABEL_PLAN_UID));
        if !same || w.quota_granted() || (own.is_some() && plan == own.as_ref()) {
            continue;
        }
        for ps in &w.spec.pod_sets {
            add_requests(&mut uncounted, ps);
        }
    }
    Ok(QueueQuota {
        cluster_queue: cq,
        all,
        uncounted,
    })
}

/// Adds a pod set's requests (per pod, times its count) to `list`.
fn add_requests(list: &mut ResourceList, ps: &crate::kueue::types::PodSet) {
    let Some(spec) = &ps.template.spec else {
        return;
    };
    let pod = k8s_openapi::api::core::v1::Pod {
        spec: Some(spec.clone()),
        ..Default::default()
    };
    let Ok(req) = crate::capacity::requests::pod_requests(&pod, &[]) else {
        return;
    };
    let count = i128::from(ps.count.max(0));
    for (k, q) in req {
        let total = Quantity::from_nanos(q.as_nanos().saturating_mul(count), q.format());
        let e = list.entry(k).or_default();
        *e = e.saturating_add(&total);
    }
}

/// `status.waitingFor` of a change the quota holds:
/// `quota: nvidia.com/gpu 8 > 4 left`.
pub fn short_of(r: &QuotaReport) -> String {
    r.short()
        .next()
        .map(|l| {
            format!(
                "quota: {} {} > {} left",
                l.resource,
                l.needed.canonical(),
                l.left.canonical()
            )
        })
        .unwrap_or_else(|| "quota".into())
}

/// `ClusterQueue team in cohort gpus (LocalQueue team): nvidia.com/gpu 8
/// needed, 4 left in flavor default (…)`: where, and the numbers.
pub fn quota_text(r: &QuotaReport, queue: &LocalQueueName) -> String {
    format!(
        "ClusterQueue {}{} (LocalQueue {queue}): {}",
        r.cluster_queue,
        r.cohort
            .as_ref()
            .map(|c| format!(" in cohort {c}"))
            .unwrap_or_default(),
        r.text()
    )
}

/// The name of raygate's reservation Workload for `plan`'s change
/// `fingerprint`: derived, so a restarted raygate finds it again.
pub fn reservation_name(plan: &str, fingerprint: &str) -> String {
    crate::autoscale::shapes::object_name(plan, fingerprint, "quota")
}

/// `status.quota` of a report.
pub fn status_of(
    queue: &LocalQueueName,
    r: &QuotaReport,
    reservation: Option<QuotaReservation>,
) -> QuotaStatus {
    let sum = |f: &dyn Fn(&q::Line) -> Quantity| -> Option<String> {
        let list: ResourceList = r.lines.iter().map(|l| (l.resource.clone(), f(l))).collect();
        sum_of(&list, &ACCELERATORS).map(|q| q.canonical())
    };
    QuotaStatus {
        local_queue: queue.to_string(),
        cluster_queue: Some(r.cluster_queue.clone()),
        cohort: r.cohort.clone(),
        resources: r
            .lines
            .iter()
            .map(|l| QuotaResourceStatus {
                name: l.resource.clone(),
                flavor: l.flavor.clone(),
                needed: l.needed.canonical(),
                left: l.left.canonical(),
                borrowable: l.borrowable.canonical(),
            })
            .collect(),
        gpus_needed: sum(&|l| l.needed.clone()),
        gpus_left: sum(&|l| l.left.clone()),
        reservation,
        workload_refreshed_for: None,
    }
}

/// Whether the quota lets `change` (whose new cluster fits the nodes, by
/// `report`) be admitted now; when not, the decision is filled in.
pub(super) fn allows(
    b: &mut Builder<'_>,
    change: &ChangeFacts,
    report: &FitReport,
    kueue: &Managed,
    facts: &QuotaFacts,
    plan: &str,
) -> bool {
    let fp = &change.fingerprint;
    let name = reservation_name(plan, fp);
    // A reservation of another change is stale: the controller deletes it.
    let mine = facts
        .reservation
        .clone()
        .filter(|r| r.fingerprint == *fp && r.workload == name);
    let wanted = QuotaReservation {
        workload: name.clone(),
        fingerprint: fp.clone(),
        granted: mine.as_ref().is_some_and(|r| r.granted),
    };
    let queue = match &facts.queue {
        Ok(q) => q,
        Err(e) => {
            b.status.quota = Some(QuotaStatus {
                local_queue: kueue.queue.to_string(),
                ..Default::default()
            });
            let long = format!(
                "change {fp}: the quota of LocalQueue {} cannot be read: {e}",
                kueue.queue
            );
            b.condition(
                condition::QUOTA_AVAILABLE,
                Status::False,
                Reason::InsufficientQuota,
                &long,
            );
            wait(b, fp, "quota unknown", &long, false);
            return false;
        }
    };
    // Kueue's admission of the reservation is the grant: its quota is then
    // counted in the ClusterQueue's usage and must not be counted twice.
    if wanted.granted {
        let mut st = b.prev.quota.clone().unwrap_or_default();
        st.local_queue = kueue.queue.to_string();
        st.cluster_queue = queue.cluster_queue.metadata.name.clone();
        st.reservation = Some(wanted);
        b.status.quota = Some(st);
        b.condition(
            condition::QUOTA_AVAILABLE,
            Status::True,
            Reason::QuotaFits,
            &format!("Kueue admitted raygate's reservation Workload {name}"),
        );
        return true;
    }
    let r = q::fit(
        &queue.cluster_queue,
        &queue.all,
        &queue.uncounted,
        &report.new_requests,
    );
    let text = r.text();
    if !r.fits {
        b.status.quota = Some(status_of(&kueue.queue, &r, None));
        let long = format!(
            "change {fp}: the new cluster fits the nodes but not the quota of {}",
            quota_text(&r, &kueue.queue)
        );
        b.condition(
            condition::QUOTA_AVAILABLE,
            Status::False,
            Reason::InsufficientQuota,
            &long,
        );
        wait(b, fp, &short_of(&r), &long, true);
        return false;
    }
    b.status.quota = Some(status_of(&kueue.queue, &r, Some(wanted)));
    b.condition(
        condition::QUOTA_AVAILABLE,
        Status::True,
        Reason::QuotaPending,
        &format!(
            "ClusterQueue {} has the quota ({text}); reserving it with Workload {name}",
            r.cluster_queue
        ),
    );
    let long = format!(
        "change {fp}: the new cluster fits the nodes and ClusterQueue {} ({text}); waiting for Kueue \
         to admit raygate's reservation Workload {name} in LocalQueue {}",
        r.cluster_queue, kueue.queue
    );
    wait(b, fp, "quota reservation", &long, false);
    false
}

/// `WaitingForQuota`, with one Event per change and kind of wait when
/// `warn` (the numbers moving are no news: `quota: … > 4 left` then `> 2
/// left` is one wait).
fn wait(b: &mut Builder<'_>, fp: &str, short: &str, long: &str, warn: bool) {
    let kind = |s: &str| s.split(':').next().unwrap_or_default().to_string();
    let news = b.prev.phase != Phase::WaitingForQuota
        || b.prev
            .pending_change
            .as_ref()
            .map(|p| p.fingerprint.as_str())
            != Some(fp)
        || b.prev.waiting_for.as_deref().map(kind) != Some(kind(short));
    b.hold(Phase::WaitingForQuota, short, long, Outcome::HeldCapacity);
    if news && warn {
        b.change_event(true, EventReason::WaitingForQuota, fp, long.to_string());
    }
}

/// Rule 2 for a Kueue-managed elastic RayService with a granted reservation:
/// once KubeRay builds the new cluster (`UpgradeInProgress` and a pending
/// cluster), the RayService's Workload is to be derived again, once per
/// pending cluster (`status.quota.workloadRefreshedFor`; the controller
/// deletes Kueue's Workload of the RayService when it changes). Never
/// without `UpgradeInProgress`: then Kueue's suspension would reach the
/// serving cluster (measured: an outage).
///
/// Nor before the pending cluster has settled ([`PendingPods::settled`]): a
/// Workload deleted in the same instant KubeRay created the pending cluster
/// had its first pods deleted "due to suspension" and KubeRay v1.6.2 left
/// the cluster suspended until its periodic resync, 5 minutes later
/// (measured by the kueue e2e suite; deleted ~20 s in, the pods came back
/// in ~2 s). Waiting until its head pod exists and nothing of it is bound
/// also means the switch cannot happen meanwhile: a cluster whose pods are
/// all held by Kueue's gate is not ready.
pub fn refresh(b: &mut Builder<'_>, svc: &super::ServiceFacts, pods: PendingPods) {
    let (Some(kueue), Some(pending), Some(q)) =
        (&svc.kueue, &svc.pending_cluster, b.status.quota.as_mut())
    else {
        return;
    };
    let granted = q.reservation.as_ref().is_some_and(|r| r.granted);
    if !kueue.elastic || !granted || !svc.upgrade_in_progress || !pods.settled() {
        return;
    }
    // Once per transition: a pending cluster KubeRay built again (`rebuild`)
    // carries the re-derived Workload's stamp, which Kueue's ungater honours.
    if q.workload_refreshed_for.is_none() {
        q.workload_refreshed_for = Some(pending.clone());
    }
}

/// Kueue's slice stamps ([`crate::kueue::slice_stamp`]) of the RayService's
/// cluster spec and of its pending RayCluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingStamp {
    pub service: Option<String>,
    pub pending: Option<String>,
    /// The pending RayCluster has `spec.suspend: true`.
    pub pending_suspended: bool,
}

/// After the refresh, KubeRay missed Kueue's stop and restart of the
/// RayService: the pending cluster still carries the deleted Workload's
/// slice stamp while the RayService carries the re-derived one's, and
/// neither is suspended. KubeRay carries Kueue's writes to a pending cluster
/// only with a `suspend` toggle (v1.6.2 `shouldUpdateCluster`); measured
/// under CI load, Kueue stopped and restarted the RayService within 0.35 s
/// and KubeRay, reconciling 3 s apart, saw neither. Kueue's ungater
/// releases pods only by their own stamp, so that cluster's pods stay gated
/// for good. The remedy (the message, for the Event): the gate opens, and
/// KubeRay, whose hash of the spec now differs from the pending cluster's in
/// more than its worker groups, builds the new cluster again from the spec
/// (`shouldPrepareNewCluster`), stamped as Kueue admitted it; the stale one
/// is dangling and KubeRay deletes it. Harmless if KubeRay caught up
/// meanwhile: with equal hashes it builds nothing. The caller makes sure no
/// further change waits (it would go with it).
pub fn rebuild(
    q: Option<&QuotaStatus>,
    svc: &super::ServiceFacts,
    stamp: &PendingStamp,
    pods: PendingPods,
) -> Option<String> {
    let elastic = svc.kueue.as_ref().is_some_and(|k| k.elastic);
    let refreshed = q.is_some_and(|q| q.workload_refreshed_for.is_some());
    let pending = svc.pending_cluster.as_deref()?;
    let (Some(now), Some(stale)) = (&stamp.service, &stamp.pending) else {
        return None;
    };
    let missed = now != stale && !svc.kueue_stopped && !stamp.pending_suspended;
    (elastic && refreshed && missed && !pods.any_bound).then(|| {
        format!(
            "KubeRay did not carry Kueue's restart of the RayService to new cluster {pending}: its pods \
             are stamped with Workload slice {stale}, which Kueue no longer admits (the RayService \
             names {now}), so Kueue would keep them gated; the gate opens so KubeRay builds the new \
             cluster again from the spec, and closes once it has"
        )
    })
}

/// How long after its admission a transition's pending cluster is left to
/// settle before the RayService's Workload is derived again (see `refresh`).
pub const REFRESH_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// What `refresh` needs to know of the pending cluster's pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingPods {
    /// Its head pod exists (KubeRay has built the cluster's pods).
    pub head: bool,
    /// Some pod of it is bound to a node (not held by Kueue's gate).
    pub any_bound: bool,
    /// Time since the transition was admitted.
    pub since_admission: std::time::Duration,
}

impl PendingPods {
    /// KubeRay has made the pending cluster's pods, Kueue's gate holds them
    /// all, and the cluster has had [`REFRESH_SETTLE`] to settle.
    pub fn settled(self) -> bool {
        self.head && !self.any_bound && self.since_admission >= REFRESH_SETTLE
    }
}
