//! Prometheus metrics: what raygate is doing, in a shape alert rules can use.
//!
//! Everything lives on one private [`Registry`] (not the process-global one),
//! so tests can build as many [`Metrics`] as they like and the exposition
//! contains only our own series.
//!
//! # Scheme
//!
//! All names start with `raygate_`. Per-plan series carry
//! `namespace`, `upgradeplan` and, where the plan's target matters,
//! `rayservice`.
//!
//! | series | type | labels | meaning |
//! |---|---|---|---|
//! | `raygate_upgradeplan_phase` | gauge | namespace, upgradeplan, rayservice, phase | 1 for the current phase, 0 for every other [`Phase::ALL`] value; all twelve series always exist, so `== 1` and `absent()` both work |
//! | `raygate_upgrade_waiting_seconds` | gauge | namespace, upgradeplan, rayservice | how long the pending change has been held; 0 when not waiting |
//! | `raygate_upgrade_transition_seconds` | gauge | namespace, upgradeplan, rayservice | how long the current transition (two clusters alive) has run; 0 when none |
//! | `raygate_upgrade_stalled` | gauge | namespace, upgradeplan, rayservice | 1 while the transition is judged stalled |
//! | `raygate_gate_overridden` | gauge | namespace, upgradeplan, rayservice | 1 while a human override lets the upgrade bypass the gate |
//! | `raygate_upgrade_unschedulable_pods` | gauge | namespace, upgradeplan, rayservice | pods of the new cluster Pending with `Unschedulable` |
//! | `raygate_capacity_shortfall` | gauge | namespace, upgradeplan, resource | how much of `resource` is missing for the held upgrade; a resource's series goes away when it is no longer short |
//! | `raygate_capacity_request_open_seconds` | gauge | namespace, upgradeplan | how long the plan's capacity request (CapacityBuffers) has been open; absent when none |
//! | `raygate_capacity_request_not_delivered` | gauge | namespace, upgradeplan | 1 while the request is open longer than `spec.capacity.maxWait`; absent when none |
//! | `raygate_capacity_free` | gauge | resource | free capacity on schedulable nodes, as the gate sees it |
//! | `raygate_kueue_quota_reserved` | gauge | cluster_queue, resource | Kueue quota held by raygate's reservation Workloads Kueue admitted (`--kueue`), per ClusterQueue; absent when none |
//! | `raygate_admissions_total` | counter | outcome | gate decisions, one of [`Outcome::ALL`] (all pre-created at 0 so `rate()` works from the first scrape) |
//! | `raygate_gate_overrides_total` | counter | namespace, upgradeplan | times an override was honoured |
//! | `raygate_recreations_avoided_total` | counter | namespace | new clusters a batch saved (`spec.batching`): a batch of n changes admitted as one counts n − 1 |
//! | `raygate_reconcile_duration_seconds` | histogram | – | wall time of one reconcile, buckets 1 ms .. 10 s |
//! | `raygate_admission_latency_seconds` | histogram | cause | from the event that let a held upgrade through (`node`, `pod`, `approval`, `rayservice`; see [`crate::controller::latency`]) to its gate write, buckets 10 ms .. 60 s |
//! | `raygate_reconcile_errors_total` | counter | reason | failed reconciles by short machine-readable reason |
//! | `raygate_build_info` | gauge | version | always 1; joins the version onto other series |
//!
//! Resource quantities are plain numbers in the resource's base unit
//! (cores for `cpu`, bytes for `memory`, devices for `nvidia.com/gpu`).
//!
//! When an `UpgradePlan` is deleted, [`Metrics::forget_plan`] removes every
//! series of it, so dashboards do not show ghosts and cardinality stays
//! bounded by the number of live plans.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use prometheus::proto::MetricType;
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramTimer, HistogramVec, IntCounterVec, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::admission::Outcome;
use crate::sync::lock;
use crate::upgradeplan::{Phase, PlanKey};

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Reconcile latency buckets: a cached no-op is ~1 ms, a slow API round trip
/// a few seconds; anything past 10 s is an outlier worth its own `+Inf`.
const RECONCILE_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Admission latency buckets: the target is under a second at 1,000 nodes;
/// the batch window is 0.05 s, a loaded apiserver's write up to seconds.
const ADMISSION_BUCKETS: [f64; 15] = [
    0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The `cause` label values of `raygate_admission_latency_seconds`, all
/// pre-created so `rate()` works from the first scrape.
pub const ADMISSION_CAUSES: [&str; 4] = ["node", "pod", "approval", "rayservice"];

const PLAN_LABELS: [&str; 3] = ["namespace", "upgradeplan", "rayservice"];

/// What one reconcile learned about one plan; everything
/// [`Metrics::observe_plan`] needs, borrowed so callers build it for free.
#[derive(Debug, Clone, Copy)]
pub struct PlanObservation<'a> {
    pub namespace: &'a str,
    pub plan: &'a str,
    pub rayservice: &'a str,
    pub phase: Phase,
    /// Since when the pending change is held, if it is.
    pub waiting_seconds: Option<f64>,
    /// How long the current transition has run, if one is under way.
    pub transition_seconds: Option<f64>,
    pub stalled: bool,
    pub gate_overridden: bool,
    /// Missing amount per resource name; empty when the upgrade fits.
    pub shortfall: &'a BTreeMap<String, f64>,
    pub pods_pending_unschedulable: u32,
    /// Condition KubeRayRelease is False.
    pub kuberay_release_mismatch: bool,
}

/// Label values we have set for one plan, so we can remove exactly those.
#[derive(Debug, Default)]
struct PlanSeries {
    rayservice: String,
    shortfall: BTreeSet<String>,
}

/// Why an Event was not recorded: `raygate_events_dropped_total{reason}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventDrop {
    /// The queue of Events to send was full.
    QueueFull,
    /// The replica lost its Lease before sending it.
    NotLeader,
    /// The apiserver refused it or did not answer in time.
    Failed,
}

impl EventDrop {
    pub const ALL: [EventDrop; 3] = [
        EventDrop::QueueFull,
        EventDrop::NotLeader,
        EventDrop::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventDrop::QueueFull => "queue_full",
            EventDrop::NotLeader => "not_leader",
            EventDrop::Failed => "failed",
        }
    }
}

/// All raygate metric families on their own registry.
pub struct Metrics {
    registry: Registry,
    /// Every registered family's name and type, series or not.
    families: BTreeMap<String, MetricType>,
    phase: IntGaugeVec,
    waiting: GaugeVec,
    transition: GaugeVec,
    stalled: IntGaugeVec,
    overridden: IntGaugeVec,
    unschedulable: IntGaugeVec,
    release_mismatch: IntGaugeVec,
    request_open: GaugeVec,
    request_overdue: IntGaugeVec,
    quota_reserved: GaugeVec,
    shortfall: GaugeVec,
    free: GaugeVec,
    admissions: IntCounterVec,
    overrides: IntCounterVec,
    recreations_avoided: IntCounterVec,
    reconcile_duration: Histogram,
    admission_latency: HistogramVec,
    reconcile_errors: IntCounterVec,
    events_dropped: IntCounterVec,
    /// Which label values exist per plan; prometheus' vectors cannot list them.
    plans: Mutex<HashMap<PlanKey, PlanSeries>>,
    /// Resources currently exported in `raygate_capacity_free`.
    free_resources: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Observes `raygate_reconcile_duration_seconds` when dropped, so every exit
/// path of a reconcile (including `?` and panics unwinding) is measured.
#[must_use = "the duration is recorded when the timer is dropped"]
pub struct ReconcileTimer(#[allow(dead_code)] HistogramTimer);

impl std::fmt::Debug for ReconcileTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReconcileTimer")
    }
}

/// The registry being filled, and the name and type of every family put on
/// it: the registry itself only lists families that have series.
struct Registering {
    registry: Registry,
    families: Mutex<BTreeMap<String, MetricType>>,
}

fn register<C: prometheus::core::Collector + Clone + 'static>(
    r: &Registering,
    collector: C,
) -> crate::Result<C> {
    r.registry.register(Box::new(collector.clone()))?;
    let mut families = lock(&r.families);
    for mf in collector.collect() {
        families.insert(mf.name().to_string(), mf.get_field_type());
    }
    Ok(collector)
}

fn bool_gauge(b: bool) -> i64 {
    i64::from(b)
}

impl Metrics {
    /// Creates and registers every family; fails only on a definition bug.
    pub fn new() -> crate::Result<Metrics> {
        let registry = Registry::new();
        let r = &Registering {
            registry,
            families: Mutex::default(),
        };

        let phase = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "raygate_upgradeplan_phase",
                    "1 for the UpgradePlan's current phase, 0 for every other phase.",
                ),
                &["namespace", "upgradeplan", "rayservice", "phase"],
            )?,
        )?;
        let waiting = register(
            r,
            GaugeVec::new(
                Opts::new(
                    "raygate_upgrade_waiting_seconds",
                    "Seconds the pending upgrade has been held by the gate; 0 when not waiting.",
                ),
                &PLAN_LABELS,
            )?,
        )?;
        let transition = register(
            r,
            GaugeVec::new(
                Opts::new(
                    "raygate_upgrade_transition_seconds",
                    "Seconds the current transition has run; 0 when no transition is under way.",
                ),
                &PLAN_LABELS,
            )?,
        )?;
        let stalled = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "raygate_upgrade_stalled",
                    "1 while the upgrade's transition is judged stalled.",
                ),
                &PLAN_LABELS,
            )?,
        )?;
        let overridden = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "raygate_gate_overridden",
                    "1 while a human override lets the upgrade bypass the gate.",
                ),
                &PLAN_LABELS,
            )?,
        )?;
        let unschedulable = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "raygate_upgrade_unschedulable_pods",
                    "Pods of the upgrade's new cluster that are Pending as Unschedulable.",
                ),
                &PLAN_LABELS,
            )?,
        )?;
        let release_mismatch = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "raygate_kuberay_release_mismatch",
                    "1 while the KubeRay release raygate applies is in doubt: --kuberay-version \
                     disagrees with the release the operator stamped on the RayClusters, or the \
                     stamp is a release raygate does not know (condition KubeRayRelease=False).",
                ),
                &PLAN_LABELS,
            )?,
        )?;
        let request_open = register(
            r,
            GaugeVec::new(
                Opts::new(
                    "raygate_capacity_request_open_seconds",
                    "Seconds since the plan asked the node autoscaler for its new cluster \
                     (CapacityBuffers); absent when nothing is asked.",
                ),
                &["namespace", "upgradeplan"],
            )?,
        )?;
        let quota_reserved = register(
            r,
            GaugeVec::new(
                Opts::new(
                    "raygate_kueue_quota_reserved",
                    "Kueue quota held by raygate's reservation Workloads that Kueue admitted, per \
                     ClusterQueue and resource (base units); absent when none.",
                ),
                &["cluster_queue", "resource"],
            )?,
        )?;
        let request_overdue = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "raygate_capacity_request_not_delivered",
                    "1 while the plan's capacity request is open longer than spec.capacity.maxWait \
                     (the autoscaler did not deliver); absent when nothing is asked.",
                ),
                &["namespace", "upgradeplan"],
            )?,
        )?;
        let shortfall = register(
            r,
            GaugeVec::new(
                Opts::new(
                    "raygate_capacity_shortfall",
                    "Amount of a resource missing for the held upgrade, in the resource's base unit.",
                ),
                &["namespace", "upgradeplan", "resource"],
            )?,
        )?;
        let free = register(
            r,
            GaugeVec::new(
                Opts::new(
                    "raygate_capacity_free",
                    "Free capacity on schedulable nodes, in the resource's base unit.",
                ),
                &["resource"],
            )?,
        )?;
        let admissions = register(
            r,
            IntCounterVec::new(
                Opts::new("raygate_admissions_total", "Gate decisions by outcome."),
                &["outcome"],
            )?,
        )?;
        let overrides = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "raygate_gate_overrides_total",
                    "Times a gate override was honoured.",
                ),
                &["namespace", "upgradeplan"],
            )?,
        )?;
        let recreations_avoided = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "raygate_recreations_avoided_total",
                    "Cluster recreations a batch saved (spec.batching): its changes but one.",
                ),
                &["namespace"],
            )?,
        )?;
        let reconcile_duration = register(
            r,
            Histogram::with_opts(
                HistogramOpts::new(
                    "raygate_reconcile_duration_seconds",
                    "Wall time of one UpgradePlan reconcile.",
                )
                .buckets(RECONCILE_BUCKETS.to_vec()),
            )?,
        )?;
        let admission_latency = register(
            r,
            HistogramVec::new(
                HistogramOpts::new(
                    "raygate_admission_latency_seconds",
                    "Seconds from the event that let a held upgrade through (a node usable, a pod \
                     gone, the plan approved, its RayService changed) to the gate write admitting it.",
                )
                .buckets(ADMISSION_BUCKETS.to_vec()),
                &["cause"],
            )?,
        )?;
        for cause in ADMISSION_CAUSES {
            admission_latency.with_label_values(&[cause]);
        }
        let reconcile_errors = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "raygate_reconcile_errors_total",
                    "Failed reconciles by reason.",
                ),
                &["reason"],
            )?,
        )?;
        let events_dropped = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "raygate_events_dropped_total",
                    "Events raygate did not record, by reason: queue_full, not_leader, failed.",
                ),
                &["reason"],
            )?,
        )?;
        for why in EventDrop::ALL {
            events_dropped.with_label_values(&[why.as_str()]);
        }
        let build_info = register(
            r,
            IntGaugeVec::new(
                Opts::new("raygate_build_info", "Always 1; labelled with the build."),
                &["version"],
            )?,
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        for outcome in Outcome::ALL {
            admissions.with_label_values(&[outcome.as_str()]);
        }

        Ok(Metrics {
            registry: r.registry.clone(),
            families: std::mem::take(&mut *lock(&r.families)),
            phase,
            waiting,
            transition,
            stalled,
            overridden,
            unschedulable,
            release_mismatch,
            request_open,
            request_overdue,
            quota_reserved,
            shortfall,
            free,
            admissions,
            overrides,
            recreations_avoided,
            reconcile_duration,
            admission_latency,
            reconcile_errors,
            events_dropped,
            plans: Mutex::default(),
            free_resources: Mutex::default(),
        })
    }

    /// Every series name raygate can expose (a histogram's `_bucket`, `_sum`
    /// and `_count`), whether or not it has a series yet: what dashboards and
    /// alert rules may query.
    pub fn exported_names(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (name, kind) in &self.families {
            match kind {
                MetricType::HISTOGRAM => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        out.insert(format!("{name}{suffix}"));
                    }
                }
                MetricType::SUMMARY => {
                    out.insert(name.clone());
                    for suffix in ["_sum", "_count"] {
                        out.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    out.insert(name.clone());
                }
            }
        }
        out
    }

    /// The Prometheus text exposition (format 0.0.4) of every series.
    pub fn render(&self) -> crate::Result<String> {
        Ok(TextEncoder::new().encode_to_string(&self.registry.gather())?)
    }

    /// Sets every per-plan series from one reconcile's view of the plan.
    ///
    /// Per plan: the phase gauge is 1 for the current phase and 0 for every
    /// other phase (all [`Phase::ALL`] series present, so alert rules can use
    /// `== 1`). If the plan now targets another RayService, the old
    /// RayService's series are removed; shortfall resources that are no
    /// longer short are removed too.
    pub fn observe_plan(&self, p: &PlanObservation) {
        let mut plans = lock(&self.plans);
        let tracked = plans.entry(PlanKey::new(p.namespace, p.plan)).or_default();
        if !tracked.rayservice.is_empty() && tracked.rayservice != p.rayservice {
            self.remove_plan_series(p.namespace, p.plan, &tracked.rayservice);
        }
        tracked.rayservice = p.rayservice.to_owned();

        let labels = [p.namespace, p.plan, p.rayservice];
        for phase in Phase::ALL {
            self.phase
                .with_label_values(&[p.namespace, p.plan, p.rayservice, phase.as_str()])
                .set(bool_gauge(phase == p.phase));
        }
        self.waiting
            .with_label_values(&labels)
            .set(p.waiting_seconds.unwrap_or(0.0));
        self.transition
            .with_label_values(&labels)
            .set(p.transition_seconds.unwrap_or(0.0));
        self.stalled
            .with_label_values(&labels)
            .set(bool_gauge(p.stalled));
        self.overridden
            .with_label_values(&labels)
            .set(bool_gauge(p.gate_overridden));
        self.unschedulable
            .with_label_values(&labels)
            .set(i64::from(p.pods_pending_unschedulable));
        self.release_mismatch
            .with_label_values(&labels)
            .set(bool_gauge(p.kuberay_release_mismatch));

        for gone in tracked
            .shortfall
            .iter()
            .filter(|r| !p.shortfall.contains_key(*r))
        {
            let _ = self
                .shortfall
                .remove_label_values(&[p.namespace, p.plan, gone.as_str()]);
        }
        for (resource, amount) in p.shortfall {
            self.shortfall
                .with_label_values(&[p.namespace, p.plan, resource.as_str()])
                .set(*amount);
        }
        tracked.shortfall = p.shortfall.keys().cloned().collect();
    }

    /// The plan's capacity request: `Some((open seconds, not delivered))`
    /// while one is open (requested), else its series go.
    pub fn observe_capacity_request(&self, namespace: &str, plan: &str, open: Option<(f64, bool)>) {
        let labels = [namespace, plan];
        match open {
            Some((seconds, overdue)) => {
                self.request_open.with_label_values(&labels).set(seconds);
                self.request_overdue
                    .with_label_values(&labels)
                    .set(bool_gauge(overdue));
            }
            None => {
                let _ = self.request_open.remove_label_values(&labels);
                let _ = self.request_overdue.remove_label_values(&labels);
            }
        }
    }

    /// The quota raygate's admitted reservations hold, per (ClusterQueue,
    /// resource): replaces every series, so a released one goes.
    pub fn observe_quota_reserved(&self, reserved: &BTreeMap<(String, String), f64>) {
        self.quota_reserved.reset();
        for ((cq, resource), v) in reserved {
            self.quota_reserved
                .with_label_values(&[cq.as_str(), resource.as_str()])
                .set(*v);
        }
    }

    /// Removes every series of a deleted plan.
    pub fn forget_plan(&self, namespace: &str, plan: &str) {
        self.observe_capacity_request(namespace, plan, None);
        let Some(tracked) = lock(&self.plans).remove(&PlanKey::new(namespace, plan)) else {
            // Never observed in this process (e.g. deleted before the first
            // reconcile); only the override counter may exist.
            let _ = self.overrides.remove_label_values(&[namespace, plan]);
            return;
        };
        self.remove_plan_series(namespace, plan, &tracked.rayservice);
        for resource in &tracked.shortfall {
            let _ = self
                .shortfall
                .remove_label_values(&[namespace, plan, resource.as_str()]);
        }
        let _ = self.overrides.remove_label_values(&[namespace, plan]);
    }

    /// Removes the series keyed by (namespace, plan, rayservice). Missing
    /// series are fine: removal is idempotent for our purposes.
    fn remove_plan_series(&self, namespace: &str, plan: &str, rayservice: &str) {
        let labels = [namespace, plan, rayservice];
        for phase in Phase::ALL {
            let _ = self
                .phase
                .remove_label_values(&[namespace, plan, rayservice, phase.as_str()]);
        }
        let _ = self.waiting.remove_label_values(&labels);
        let _ = self.transition.remove_label_values(&labels);
        let _ = self.stalled.remove_label_values(&labels);
        let _ = self.overridden.remove_label_values(&labels);
        let _ = self.unschedulable.remove_label_values(&labels);
        let _ = self.release_mismatch.remove_label_values(&labels);
    }

    /// Replaces `raygate_capacity_free`; resources absent from `free` are
    /// removed rather than left at their last value.
    pub fn set_cluster_free(&self, free: &BTreeMap<String, f64>) {
        let mut known = lock(&self.free_resources);
        for gone in known.iter().filter(|r| !free.contains_key(*r)) {
            let _ = self.free.remove_label_values(&[gone.as_str()]);
        }
        for (resource, amount) in free {
            self.free
                .with_label_values(&[resource.as_str()])
                .set(*amount);
        }
        *known = free.keys().cloned().collect();
    }

    /// Counts one gate decision.
    pub fn admission(&self, outcome: Outcome) {
        self.admissions.with_label_values(&[outcome.as_str()]).inc();
    }

    /// Starts timing a reconcile; the observation happens when it is dropped.
    pub fn reconcile_timer(&self) -> ReconcileTimer {
        ReconcileTimer(self.reconcile_duration.start_timer())
    }

    /// An admission's latency from its cause to the gate write; `cause`
    /// is one of [`ADMISSION_CAUSES`].
    pub fn admission_latency(&self, cause: &str, seconds: f64) {
        self.admission_latency
            .with_label_values(&[cause])
            .observe(seconds);
    }

    /// Counts a failed reconcile; `reason` must be a short fixed word, never
    /// an error message (that would explode cardinality).
    pub fn reconcile_error(&self, reason: &str) {
        self.reconcile_errors.with_label_values(&[reason]).inc();
    }

    /// Counts an Event not recorded (see [`crate::controller::events`]).
    pub fn event_dropped(&self, why: EventDrop) {
        self.events_dropped.with_label_values(&[why.as_str()]).inc();
    }

    /// Counts the recreations a batch admitted in `namespace` saved. The
    /// series exists from the first batch on (per namespace, bounded by the
    /// namespaces with plans).
    pub fn recreations_avoided(&self, namespace: &str, n: u32) {
        let c = self.recreations_avoided.with_label_values(&[namespace]);
        c.inc_by(u64::from(n));
    }

    /// Counts one honoured gate override of a plan.
    pub fn gate_override(&self, namespace: &str, plan: &str) {
        self.overrides.with_label_values(&[namespace, plan]).inc();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One sample line of the text exposition.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) struct Sample {
        pub name: String,
        pub labels: BTreeMap<String, String>,
        pub value: f64,
    }

    /// Parses the sample lines of a text exposition. Our label values never
    /// contain `"` or `,`, so a small parser is enough; it rejects anything
    /// it does not understand so a format change fails the tests loudly.
    pub(crate) fn parse(text: &str) -> Vec<Sample> {
        let mut out = Vec::new();
        for line in text.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap(),
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), BTreeMap::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').unwrap();
                    let labels = body
                        .split(',')
                        .filter(|kv| !kv.is_empty())
                        .map(|kv| {
                            let (k, v) = kv.split_once('=').unwrap();
                            let v = v.strip_prefix('"').unwrap().strip_suffix('"').unwrap();
                            (k.to_owned(), v.to_owned())
                        })
                        .collect();
                    (name.to_owned(), labels)
                }
            };
            out.push(Sample {
                name,
                labels,
                value,
            });
        }
        out
    }

    fn samples(m: &Metrics) -> Vec<Sample> {
        parse(&m.render().unwrap())
    }

    fn find<'a>(s: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
        s.iter()
            .filter(|x| x.name == name)
            .filter(|x| {
                labels
                    .iter()
                    .all(|(k, v)| x.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    fn value(s: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
        let hits = find(s, name, labels);
        assert_eq!(hits.len(), 1, "{name} {labels:?}: {hits:?}");
        hits[0].value
    }

    fn obs<'a>(
        plan: &'a str,
        rayservice: &'a str,
        phase: Phase,
        shortfall: &'a BTreeMap<String, f64>,
    ) -> PlanObservation<'a> {
        PlanObservation {
            namespace: "ml",
            plan,
            rayservice,
            phase,
            waiting_seconds: None,
            transition_seconds: None,
            stalled: false,
            gate_overridden: false,
            shortfall,
            pods_pending_unschedulable: 0,
            kuberay_release_mismatch: false,
        }
    }

    #[test]
    fn exported_names_cover_families_without_series() {
        let m = Metrics::new().unwrap();
        let names = m.exported_names();
        // No plan observed yet, and no error counted: still exported names.
        for n in [
            "raygate_upgradeplan_phase",
            "raygate_capacity_shortfall",
            "raygate_reconcile_errors_total",
            "raygate_reconcile_duration_seconds_bucket",
            "raygate_reconcile_duration_seconds_sum",
            "raygate_reconcile_duration_seconds_count",
            "raygate_build_info",
        ] {
            assert!(names.contains(n), "{n} missing from {names:?}");
        }
        assert!(!names.contains("raygate_reconcile_duration_seconds"));
        // Everything rendered once every family has series is among them.
        let short = BTreeMap::from([("nvidia.com/gpu".to_string(), 2.0)]);
        m.observe_plan(&obs("p", "s", Phase::WaitingForCapacity, &short));
        m.reconcile_error("kube_api");
        drop(m.reconcile_timer());
        for line in m.render().unwrap().lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(names.contains(name), "{name} rendered but not exported");
        }
    }

    #[test]
    fn fresh_registry_has_build_info_and_zeroed_outcomes() {
        let m = Metrics::new().unwrap();
        let s = samples(&m);
        assert_eq!(
            value(
                &s,
                "raygate_build_info",
                &[("version", env!("CARGO_PKG_VERSION"))]
            ),
            1.0
        );
        // The label values dashboards and alert rules query.
        let outcomes = Outcome::ALL.map(Outcome::as_str);
        assert_eq!(
            outcomes,
            [
                "admitted",
                "held_capacity",
                "held_policy",
                "held_window",
                "held_batching",
                "completed",
                "stalled",
                "aborted"
            ]
        );
        for outcome in outcomes {
            assert_eq!(
                value(&s, "raygate_admissions_total", &[("outcome", outcome)]),
                0.0
            );
        }
        // No plan observed: no plan series.
        assert!(find(&s, "raygate_upgradeplan_phase", &[]).is_empty());
        let text = m.render().unwrap();
        assert!(text.contains("# TYPE raygate_reconcile_duration_seconds histogram"));
        assert!(text.contains("# TYPE raygate_admissions_total counter"));
    }

    #[test]
    fn every_phase_series_present_and_flips() {
        let m = Metrics::new().unwrap();
        let none = BTreeMap::new();
        m.observe_plan(&obs("p1", "rs", Phase::WaitingForCapacity, &none));
        let s = samples(&m);
        let phases = find(
            &s,
            "raygate_upgradeplan_phase",
            &[
                ("namespace", "ml"),
                ("upgradeplan", "p1"),
                ("rayservice", "rs"),
            ],
        );
        assert_eq!(phases.len(), Phase::ALL.len());
        for p in Phase::ALL {
            let want = if p == Phase::WaitingForCapacity {
                1.0
            } else {
                0.0
            };
            assert_eq!(
                value(
                    &s,
                    "raygate_upgradeplan_phase",
                    &[("upgradeplan", "p1"), ("phase", p.as_str())]
                ),
                want,
                "{p:?}"
            );
        }

        m.observe_plan(&obs("p1", "rs", Phase::Upgrading, &none));
        let s = samples(&m);
        let ones: Vec<_> = find(&s, "raygate_upgradeplan_phase", &[("upgradeplan", "p1")])
            .into_iter()
            .filter(|x| x.value == 1.0)
            .map(|x| x.labels["phase"].clone())
            .collect();
        assert_eq!(ones, vec!["Upgrading".to_owned()]);
    }

    #[test]
    fn plan_gauges_carry_the_observation() {
        let m = Metrics::new().unwrap();
        let short = BTreeMap::from([("nvidia.com/gpu".to_owned(), 4.0)]);
        m.observe_plan(&PlanObservation {
            waiting_seconds: Some(120.5),
            stalled: true,
            gate_overridden: true,
            pods_pending_unschedulable: 3,
            kuberay_release_mismatch: true,
            ..obs("p1", "rs", Phase::Stalled, &short)
        });
        let s = samples(&m);
        let l = [
            ("namespace", "ml"),
            ("upgradeplan", "p1"),
            ("rayservice", "rs"),
        ];
        assert_eq!(value(&s, "raygate_upgrade_waiting_seconds", &l), 120.5);
        assert_eq!(value(&s, "raygate_upgrade_transition_seconds", &l), 0.0);
        assert_eq!(value(&s, "raygate_upgrade_stalled", &l), 1.0);
        assert_eq!(value(&s, "raygate_kuberay_release_mismatch", &l), 1.0);
        assert_eq!(value(&s, "raygate_gate_overridden", &l), 1.0);
        assert_eq!(value(&s, "raygate_upgrade_unschedulable_pods", &l), 3.0);
        assert_eq!(
            value(
                &s,
                "raygate_capacity_shortfall",
                &[("upgradeplan", "p1"), ("resource", "nvidia.com/gpu")]
            ),
            4.0
        );
    }

    #[test]
    fn shortfall_resource_removed_when_no_longer_short() {
        let m = Metrics::new().unwrap();
        let both = BTreeMap::from([("cpu".to_owned(), 2.0), ("nvidia.com/gpu".to_owned(), 8.0)]);
        m.observe_plan(&obs("p1", "rs", Phase::WaitingForCapacity, &both));
        assert_eq!(
            find(&samples(&m), "raygate_capacity_shortfall", &[]).len(),
            2
        );

        let gpu = BTreeMap::from([("nvidia.com/gpu".to_owned(), 6.0)]);
        m.observe_plan(&obs("p1", "rs", Phase::WaitingForCapacity, &gpu));
        let s = samples(&m);
        let left = find(&s, "raygate_capacity_shortfall", &[]);
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].labels["resource"], "nvidia.com/gpu");
        assert_eq!(left[0].value, 6.0);

        m.observe_plan(&obs("p1", "rs", Phase::Admitted, &BTreeMap::new()));
        assert!(find(&samples(&m), "raygate_capacity_shortfall", &[]).is_empty());
    }

    #[test]
    fn forget_removes_only_that_plan() {
        let m = Metrics::new().unwrap();
        let short = BTreeMap::from([("nvidia.com/gpu".to_owned(), 1.0)]);
        m.observe_plan(&obs("gone", "rs-a", Phase::WaitingForCapacity, &short));
        m.observe_plan(&obs("kept", "rs-b", Phase::Idle, &short));
        m.gate_override("ml", "gone");
        m.forget_plan("ml", "gone");

        let s = samples(&m);
        assert!(
            s.iter()
                .all(|x| x.labels.get("upgradeplan").map(String::as_str) != Some("gone")),
            "{s:?}"
        );
        assert_eq!(
            find(&s, "raygate_upgradeplan_phase", &[("upgradeplan", "kept")]).len(),
            Phase::ALL.len()
        );
        assert_eq!(
            value(&s, "raygate_capacity_shortfall", &[("upgradeplan", "kept")]),
            1.0
        );
        // Forgetting twice, or a plan never seen, is harmless.
        m.forget_plan("ml", "gone");
        m.forget_plan("ml", "never");
    }

    #[test]
    fn retargeted_plan_drops_old_rayservice_series() {
        let m = Metrics::new().unwrap();
        let none = BTreeMap::new();
        m.observe_plan(&obs("p1", "old", Phase::Idle, &none));
        m.observe_plan(&obs("p1", "new", Phase::Idle, &none));
        let s = samples(&m);
        assert!(find(&s, "raygate_upgradeplan_phase", &[("rayservice", "old")]).is_empty());
        assert!(find(&s, "raygate_upgrade_stalled", &[("rayservice", "old")]).is_empty());
        assert_eq!(
            find(&s, "raygate_upgradeplan_phase", &[("rayservice", "new")]).len(),
            Phase::ALL.len()
        );
    }

    #[test]
    fn cluster_free_replaces_resources() {
        let m = Metrics::new().unwrap();
        m.set_cluster_free(&BTreeMap::from([
            ("cpu".to_owned(), 96.0),
            ("nvidia.com/gpu".to_owned(), 8.0),
        ]));
        m.set_cluster_free(&BTreeMap::from([("nvidia.com/gpu".to_owned(), 4.0)]));
        let s = samples(&m);
        let free = find(&s, "raygate_capacity_free", &[]);
        assert_eq!(free.len(), 1);
        assert_eq!(free[0].labels["resource"], "nvidia.com/gpu");
        assert_eq!(free[0].value, 4.0);
    }

    #[test]
    fn counters_and_histogram_count() {
        let m = Metrics::new().unwrap();
        m.admission(Outcome::Admitted);
        m.admission(Outcome::Admitted);
        m.admission(Outcome::HeldCapacity);
        m.reconcile_error("kube_api");
        m.gate_override("ml", "p1");
        {
            let _t = m.reconcile_timer();
        }
        drop(m.reconcile_timer());
        let s = samples(&m);
        assert_eq!(
            value(&s, "raygate_admissions_total", &[("outcome", "admitted")]),
            2.0
        );
        assert_eq!(
            value(
                &s,
                "raygate_admissions_total",
                &[("outcome", "held_capacity")]
            ),
            1.0
        );
        assert_eq!(
            value(
                &s,
                "raygate_reconcile_errors_total",
                &[("reason", "kube_api")]
            ),
            1.0
        );
        assert_eq!(
            value(
                &s,
                "raygate_gate_overrides_total",
                &[("namespace", "ml"), ("upgradeplan", "p1")]
            ),
            1.0
        );
        assert_eq!(
            value(&s, "raygate_reconcile_duration_seconds_count", &[]),
            2.0
        );
        let buckets = find(&s, "raygate_reconcile_duration_seconds_bucket", &[]);
        assert_eq!(buckets.len(), RECONCILE_BUCKETS.len() + 1);
        assert_eq!(
            value(
                &s,
                "raygate_reconcile_duration_seconds_bucket",
                &[("le", "10")]
            ),
            2.0
        );
    }

    #[test]
    fn admission_latency_per_cause_from_the_first_scrape() {
        let m = Metrics::new().unwrap();
        let s = samples(&m);
        for cause in ADMISSION_CAUSES {
            assert_eq!(
                value(
                    &s,
                    "raygate_admission_latency_seconds_count",
                    &[("cause", cause)]
                ),
                0.0
            );
        }
        assert!(
            m.exported_names()
                .contains("raygate_admission_latency_seconds_bucket")
        );
        m.admission_latency("node", 0.4);
        m.admission_latency("node", 2.0);
        let s = samples(&m);
        let le = |b: &str| {
            value(
                &s,
                "raygate_admission_latency_seconds_bucket",
                &[("cause", "node"), ("le", b)],
            )
        };
        assert_eq!((le("0.3"), le("0.5"), le("2.5")), (0.0, 1.0, 2.0));
        assert_eq!(
            find(
                &s,
                "raygate_admission_latency_seconds_bucket",
                &[("cause", "node")]
            )
            .len(),
            ADMISSION_BUCKETS.len() + 1
        );
    }
}
