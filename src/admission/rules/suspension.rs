//! Rule 3: what would take the serving cluster's pods away. A suspended
//! serving cluster (3a), and a change Kueue would turn into a suspension
//! (3b) or whose pods it would keep gated (3c), are held and said as such.

use super::*;

impl Rules<'_> {
    /// Rule 3a: the serving cluster is suspended or being suspended in
    /// place: `Suspended`, never `Idle`, whatever the verdict (once KubeRay
    /// has rewritten the cluster, the spec equals it and nothing "changed").
    /// The gate stays closed; one Warning Event when it starts.
    pub(super) fn suspended(
        &self,
        s: &crate::admission::Suspension,
        prev: &UpgradePlanStatus,
    ) -> Ruling {
        let by = match &self.svc.kueue {
            Some(k) => format!(
                "; the RayService is managed by Kueue (LocalQueue {}), which suspends a RayService \
                 whose cluster spec no longer matches its Workload and resumes it once it admits \
                 the new one (docs/kueue.md)",
                k.queue
            ),
            None => String::new(),
        };
        let (reason, short, long) = match s {
            crate::admission::Suspension::Applying { outage } => (
                Reason::Suspending,
                WaitingFor::Suspension,
                format!("spec.rayClusterConfig.suspend is true: {outage}{by}"),
            ),
            crate::admission::Suspension::Suspended { cluster } => (
                Reason::ClusterSuspended,
                WaitingFor::Suspended,
                format!(
                    "the active RayCluster {cluster} is suspended (spec.suspend: true): no pod serves; \
                     clear spec.rayClusterConfig.suspend to resume it{by}"
                ),
            ),
        };
        let news = !same_wait(prev, Some(Phase::Suspended), Some(&short), None);
        let event = ruling::plan_event(true, EventReason::ServiceSuspended, long.clone());
        Ruling::new(Phase::Suspended, short, long.clone())
            .condition(Cond::set(
                condition::SERVICE_SUSPENDED,
                Status::True,
                reason,
                long,
            ))
            .condition(Cond::set(
                condition::UPGRADE_ADMITTED,
                Status::False,
                Reason::NoPendingChange,
                "the service is suspended: nothing to admit",
            ))
            .conditions(no_new_cluster_needed())
            .requeue(REQUEUE_ACTIVE)
            .event_if(news, event)
    }
}

/// Rule 3b: a change that needs a new cluster, on a RayService Kueue
/// manages without `elastic-job`: Kueue v0.19 stops such a RayService when
/// its pod sets no longer match its Workload (`ensureOneWorkload`, "No
/// matching Workload") by setting `rayClusterConfig.suspend`, which KubeRay
/// applies in place to the serving cluster (issue 38, case b). raygate
/// keeps the gate closed and says so; it cannot keep Kueue from acting on
/// the spec: the chart's ValidatingAdmissionPolicy refuses such an edit.
pub(super) fn kueue_would_suspend(
    change: &ChangeFacts,
    kueue: &crate::kueue::Managed,
    prev: &UpgradePlanStatus,
) -> Ruling {
    let fp = &change.fingerprint;
    let path = change
        .triggering_paths
        .first()
        .map(String::as_str)
        .unwrap_or("rayClusterConfig");
    let long = format!(
        "change {fp} (spec.rayClusterConfig.{path}) is not admitted: Kueue v0.19 turns a rayClusterConfig \
         change of a RayService it manages (LocalQueue {}) into a suspension: KubeRay would rewrite \
         the serving cluster in place (an outage). Remedy: {}",
        kueue.queue,
        crate::kueue::REMEDY
    );
    kueue_hold(fp, WaitingFor::KueueWouldSuspend, long, prev)
}

/// Rule 3c: an elastic Kueue-managed RayService while raygate's Kueue
/// support is off (no `--kueue`): admitted, its new cluster's pods would stay
/// held by Kueue's `kueue.x-k8s.io/elastic-job` scheduling gate (measured on
/// Kueue v0.19.0: workload slices do not cover a NewCluster transition) and
/// its quota would be counted nowhere. Held, with the remedy.
pub(super) fn kueue_support_off(
    change: &ChangeFacts,
    kueue: &crate::kueue::Managed,
    prev: &UpgradePlanStatus,
) -> Ruling {
    let fp = &change.fingerprint;
    let long = format!(
        "change {fp} is not admitted: the RayService is an elastic Kueue job (LocalQueue {}), whose new \
         cluster's pods Kueue v0.19 keeps gated (kueue.x-k8s.io/elastic-job) and whose quota it does not \
         count; raygate completes such an upgrade only with its Kueue support on (--kueue=auto finds \
         Kueue's API and its access at start-up, see raygate's start-up log; --kueue=true requires it; \
         chart kueue.reservations.enabled; docs/kueue.md)",
        kueue.queue
    );
    kueue_hold(fp, WaitingFor::KueueSupportOff, long, prev)
}

/// The hold of a Kueue rule (3b, 3c): `UpgradeAdmitted=False`, phase
/// `Pending` waiting for `waiting_for`, and one Warning Event per change and
/// kind of hold.
fn kueue_hold(fp: &str, waiting_for: WaitingFor, long: String, prev: &UpgradePlanStatus) -> Ruling {
    let news = !same_wait(prev, None, Some(&waiting_for), Some(fp));
    let event = change_event(true, EventReason::KueueWouldSuspend, fp, long.clone());
    Ruling::new(Phase::Pending, waiting_for, long.clone())
        .condition(Cond::set(
            condition::UPGRADE_ADMITTED,
            Status::False,
            Reason::KueueWouldSuspend,
            long,
        ))
        .outcome(Outcome::HeldPolicy)
        .event_if(news, event)
}
