//! Live `explain` and `fit`: the offline commands of [`crate::cli`] fed with
//! the live RayService, its RayCluster, the UpgradePlan and the cluster state
//! (nodes, pods, LimitRanges, RuntimeClasses, DRA objects), read as the
//! controller caches them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::{KubeArgs, connect, not_found, resources};
use crate::admission::objects::ClusterObject;
use crate::admission::observed::PodRef;
use crate::admission::settings::Operator;
use crate::admission::{Hold, Settings};
use crate::capacity::{ClusterState, ResourceList, parse_status_map};
use crate::cli::{self, ExplainArgs, FitArgs, Old};
use crate::kuberay::{self, RayCluster, RayService, UpgradeType};
use crate::upgradeplan::UpgradePlan;
use crate::{Error, Result};

mod flags;
mod state;

pub use flags::OperatorFlags;
use state::live_state;

/// Where the file's RayService lives: its own namespace, else `-n`/the
/// context's. A file naming another namespace than an explicit `-n` is
/// refused, as `kubectl apply` refuses it, so the answer is about the object
/// the user is about to change.
fn service_namespace(
    svc: &RayService,
    file: &Path,
    explicit: Option<&str>,
    default_ns: &str,
) -> Result<String> {
    match (svc.namespace().filter(|n| !n.is_empty()), explicit) {
        (Some(own), Some(flag)) if own != flag => Err(Error::invalid(
            file.display().to_string(),
            format!(
                "the namespace from the provided object {own:?} does not match the namespace \
                 {flag:?}. You must pass '--namespace={own}' to perform this operation."
            ),
        )),
        (Some(own), _) => Ok(own),
        (None, flag) => Ok(flag.unwrap_or(default_ns).to_string()),
    }
}

async fn live_service(client: &Client, ns: &str, name: &str) -> Result<Option<RayService>> {
    Api::<RayService>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(Error::from)
}

/// The cluster KubeRay compares a spec with: the pending one while a
/// transition runs, else the active one (as the controller does).
fn compared_cluster(live: &RayService) -> Option<(String, &'static str)> {
    let status = live.status.as_ref()?;
    let name = |s: Option<&kuberay::RayServiceStatus>| {
        s.and_then(|s| s.ray_cluster_name.clone())
            .filter(|n| !n.is_empty())
    };
    name(status.pending_service_status.as_ref())
        .map(|n| (n, "pending"))
        .or_else(|| name(status.active_service_status.as_ref()).map(|n| (n, "active")))
}

/// Does raygate gate this RayService (own `spec.upgradeStrategy.type`, and
/// no other field manager with it: then raygate reports GateOverridden)?
fn gated_by_raygate(live: &RayService) -> bool {
    let managed = live.metadata.managed_fields.as_deref().unwrap_or(&[]);
    crate::upgradeplan::ownership::owned_by_us(managed)
        && crate::upgradeplan::ownership::other_owner(managed).is_none()
}

/// The KubeRay release whose rules apply to a live RayCluster: `--kuberay-version`
/// when given, else the release that last wrote the cluster (KubeRay stamps
/// `ray.io/kuberay-version` and rewrites the active cluster when the operator's
/// version changes, so it is the running operator's), else the newest. Judging a
/// v1.6.1 cluster by v1.7.0's rules would predict that version rewrite.
fn live_version(
    flag: Option<&str>,
    cluster: Option<&RayCluster>,
) -> Result<(kuberay::KubeRayVersion, Option<String>)> {
    if flag.is_some() {
        return Ok((cli::kuberay_version(flag)?, None));
    }
    let stamped = cluster.and_then(|c| c.annotations().get(kuberay::ANNOTATION_KUBERAY_VERSION));
    let latest = kuberay::KubeRayVersion::latest();
    Ok(
        match stamped.map(|v| (v, kuberay::release::Stamp::parse(v))) {
            Some((_, Some(s))) if s.known => (
                s.rules,
                Some(format!(
                    "{}, the release that last wrote the RayCluster (ray.io/kuberay-version)",
                    s.rules
                )),
            ),
            Some((v, Some(s))) => (
                s.rules,
                Some(format!(
                    "{}: the RayCluster was written by KubeRay {v}, a release raygate does not \
                 know; the rules of the nearest older one (--kuberay-version to choose)",
                    s.rules
                )),
            ),
            Some((v, None)) => (
                latest,
                Some(format!(
                    "{latest}: the RayCluster's ray.io/kuberay-version {v:?} is not a release \
                 (--kuberay-version to choose)"
                )),
            ),
            None => (latest, None),
        },
    )
}

/// The file's RayService (read with `--kuberay-version`'s rules, or the newest),
/// a client for the cluster, and the namespace the answer is about.
async fn file_and_cluster(
    file: &Path,
    kuberay_version: Option<&str>,
    kube: &KubeArgs,
) -> Result<(RayService, Client, String)> {
    let first = cli::read_service(file, cli::kuberay_version(kuberay_version)?)?;
    let (client, default_ns) = connect(kube).await?;
    let ns = service_namespace(&first, file, kube.namespace.as_deref(), &default_ns)?;
    Ok((first, client, ns))
}

pub(super) async fn explain(args: &ExplainArgs, kube: &KubeArgs) -> Result<String> {
    if args.old.is_some() {
        return cli::explain(args);
    }
    // Read once for its name and namespace; again below with the live release's rules.
    let (first, client, ns) =
        file_and_cluster(&args.new, args.kuberay_version.as_deref(), kube).await?;
    let name = first.name_any();
    let Some(live) = live_service(&client, &ns, &name).await? else {
        let (version, _) = live_version(args.kuberay_version.as_deref(), None)?;
        return created(args, &first, &format!("RayService {ns}/{name}"), version);
    };
    let Some((cluster, role)) = compared_cluster(&live) else {
        let (version, _) = live_version(args.kuberay_version.as_deref(), None)?;
        return created(
            args,
            &first,
            &format!("RayService {ns}/{name} (no cluster yet)"),
            version,
        );
    };
    let rc: RayCluster = Api::<RayCluster>::namespaced(client, &ns)
        .get(&cluster)
        .await
        .map_err(|e| not_found(e, format!("RayCluster {ns}/{cluster} ({role})")))?;
    let (version, version_note) = live_version(args.kuberay_version.as_deref(), Some(&rc))?;
    let mut new = cli::read_service(&args.new, version)?;
    new.metadata.namespace = Some(ns.clone());
    let errors = cli::manifest_errors(&new);
    let mut notes = vec![(
        "Compared to:",
        format!("RayCluster {ns}/{cluster} ({role}, live)"),
    )];
    if let Some(n) = version_note {
        notes.push(("Release:", n));
    }
    if let Some(note) = with_live_gate(&mut new, &live) {
        notes.push(("Gate:", note));
    }
    let label = format!("RayCluster {ns}/{cluster}");
    cli::explain_against(
        args,
        version,
        &Old::Live(Box::new(rc), Box::new(live)),
        Path::new(&label),
        &new,
        &errors,
        &notes,
    )
}

/// The gate KubeRay will see once the file is applied: `kubectl apply` leaves
/// raygate's gate in place when the file does not set it, and what matters is
/// what KubeRay does once raygate opens it. Returns a note when raygate gates it.
fn with_live_gate(new: &mut RayService, live: &RayService) -> Option<String> {
    let file_sets_gate = new
        .spec
        .upgrade_strategy
        .as_ref()
        .and_then(|u| u.type_.as_ref())
        .is_some();
    if file_sets_gate {
        return None;
    }
    if gated_by_raygate(live) {
        new.spec
            .upgrade_strategy
            .get_or_insert_with(Default::default)
            .type_ = Some(UpgradeType::NewCluster);
        return Some(
            "raygate gates this RayService: a new cluster waits for its admission \
             (kubectl raygate queue)"
                .to_string(),
        );
    }
    new.spec.upgrade_strategy = live.spec.upgrade_strategy.clone();
    None
}

/// `explain` for a RayService that has no cluster yet: applying it creates one.
fn created(
    args: &ExplainArgs,
    new: &RayService,
    what: &str,
    version: kuberay::KubeRayVersion,
) -> Result<String> {
    let (pods, requests) = cli::in_file(&args.new, cli::new_cluster_requests(new, version))?;
    let requests = crate::capacity::canonical_map(&requests);
    let errors = cli::manifest_errors(new);
    let out = json!({
        "verdict": "Create",
        "reason": format!("{what} does not exist: applying it creates its first RayCluster, which raygate does not hold"),
        "newCluster": {"pods": pods, "requests": requests},
        "errors": errors,
    });
    if let Some(s) = args.output.structured(&out)? {
        return Ok(s);
    }
    let mut s = String::new();
    for e in &errors {
        cli::field(&mut s, "ERROR:", &format!("{}: {}", e.path, e.message));
    }
    cli::field(&mut s, "Verdict:", "Create");
    cli::field(
        &mut s,
        "Why:",
        &format!(
            "{what} does not exist: applying it creates its first RayCluster, which raygate does not hold"
        ),
    );
    cli::field(
        &mut s,
        "New spec:",
        &format!("{pods} pods, requesting in total:"),
    );
    s.push_str(&format!("  {}\n", resources(&requests)));
    Ok(s)
}

pub(super) async fn fit(
    args: &FitArgs,
    flags: &OperatorFlags,
    kube: &KubeArgs,
) -> Result<cli::FitOutcome> {
    if let Some(path) = &args.state {
        let mut o = cli::fit(args)?;
        o.warnings = o
            .warnings
            .iter()
            .map(|w| format!("{}: {w}", path.display()))
            .collect();
        return Ok(o);
    }
    let operator = flags.operator()?;
    let (first, client, ns) =
        file_and_cluster(&args.new, args.kuberay_version.as_deref(), kube).await?;
    let name = first.name_any();
    let mut notes = vec![];
    // The old side is the live service's active cluster; its pods are the old
    // side of the fit, its KubeRay release says which pods the new one gets.
    let live = live_service(&client, &ns, &name).await?;
    let active = match live.as_ref().and_then(|l| l.status.as_ref()) {
        Some(status) => match status
            .active_service_status
            .as_ref()
            .and_then(|a| a.ray_cluster_name.as_deref())
            .filter(|n| !n.is_empty())
        {
            Some(c) => {
                Api::<RayCluster>::namespaced(client.clone(), &ns)
                    .get_opt(c)
                    .await?
            }
            None => None,
        },
        None => None,
    };
    let (version, version_note) = live_version(args.kuberay_version.as_deref(), active.as_ref())?;
    let mut svc = cli::read_service(&args.new, version)?;
    svc.metadata.namespace = Some(ns.clone());
    if let Some(n) = version_note {
        notes.push(("Release:", n));
    }
    // Nothing to fit when KubeRay builds no new cluster for the file (the
    // change completed, or only replicas or the Serve config changed).
    // Otherwise the change's fingerprint, as the controller computes it
    // (`observe::change_against`: the normalised, muted new rayClusterConfig,
    // whichever cluster and gate it is compared with).
    let mut fingerprint = None;
    let mut paths: Vec<String> = vec![];
    if let Some(live) = &live
        && let Some((cluster, role)) = compared_cluster(live)
    {
        let rc = match (&active, role) {
            (Some(a), "active") if a.name_any() == cluster => Some(a.clone()),
            _ => {
                Api::<RayCluster>::namespaced(client.clone(), &ns)
                    .get_opt(&cluster)
                    .await?
            }
        };
        if let Some(rc) = rc {
            let mut as_applied = svc.clone();
            with_live_gate(&mut as_applied, live);
            let label = format!("RayCluster {ns}/{cluster}");
            let c = cli::in_file(
                Path::new(&label),
                kuberay::classify(&kuberay::OldSide::RayCluster(&rc), &as_applied, version),
            )?;
            let c = cli::with_live_serve_config(c, live, &as_applied);
            if !cli::needs_new_cluster(&c) {
                notes.insert(
                    0,
                    (
                        "Compared to:",
                        format!("RayCluster {ns}/{cluster} ({role}, live)"),
                    ),
                );
                return cli::no_new_cluster(args, &c, &notes);
            }
            paths = c.triggering_paths.clone();
            fingerprint = Some(c.fingerprint);
        }
    }
    let gate_held = file_gate_hold(&svc).or_else(|| live.as_ref().and_then(live_gate_hold));
    let live_object = live.clone();
    match live {
        Some(live) => svc.status = live.status,
        None => {
            svc.status = None;
            notes.push((
                "Note:",
                format!("RayService {ns}/{name} does not exist yet: no old cluster"),
            ));
        }
    }
    let mut headroom: ResourceList = args.headroom.iter().cloned().collect();
    let plans = plans_in(&client, &ns).await?;
    let mut holds = None;
    let plan = plans.iter().find(|p| p.spec.ray_service_ref.name == name);
    if let Some(plan) = plan {
        // The plan's spec as the controller reads it: a spec it refuses is
        // refused here, with the same field paths.
        let settings = Settings::parse(plan, &operator).map_err(|e| {
            Error::invalid(
                format!("UpgradePlan {ns}/{}", plan.name_any()),
                e.to_string(),
            )
        })?;
        if headroom.is_empty() {
            headroom = settings.headroom.clone();
        }
        notes.push((
            "UpgradePlan:",
            format!(
                "{ns}/{} (policy {:?}, {})",
                plan.name_any(),
                plan.spec.policy,
                priority_note(plan)
            ),
        ));
        if let Some(fp) = &fingerprint {
            let mut found = plan_holds(plan, &settings, fp, &paths, Timestamp::now());
            if !is_admitted(plan, fp) {
                found.extend(gate_held);
            }
            notes.extend(hold_notes(&found));
            holds = Some(found);
        }
    }
    let mut state = live_state(&client).await?;
    state
        .dra
        .plain_count
        .extend(args.dra_plain_count_class.iter().cloned());
    let decision = match (plan, &live_object) {
        (Some(plan), Some(live)) => {
            let d = decide_live(&client, plan, &operator, live, &svc, &state, args).await?;
            notes.push(("Decision:", d.line()));
            notes.extend(d.batch.as_ref().map(cli::batch_notes).unwrap_or_default());
            Some(d)
        }
        _ => None,
    };
    let reserved = reservations(&plans, &name);
    if !reserved.is_empty() {
        notes.push((
            "Reserved:",
            format!(
                "at most {} by upgrades admitted in {ns}, until their pods are bound \
                 (not counted here; see `kubectl raygate queue`)",
                resources(&reserved)
            ),
        ));
    }
    cli::fit_in(
        args,
        version,
        state,
        Path::new("cluster state"),
        &svc,
        headroom,
        &cli::FitContext {
            notes: &notes,
            after: &[],
            holds: holds.as_deref(),
            decision: decision.as_ref(),
            quota_from_state: false,
        },
    )
}

/// The controller's decision on the change, run as the controller runs it
/// ([`crate::admission::objects::inputs`], then [`crate::admission::decide`])
/// on the live RayService with the file's spec, its RayClusters and their
/// pods, and the namespace's KubeRay release as the controller reads it. The
/// capacity is the live cluster's alone: other plans' reservations and queue
/// are not counted (the `Reserved:` note says what they hold).
async fn decide_live(
    client: &Client,
    plan: &UpgradePlan,
    operator: &Operator,
    live: &RayService,
    file: &RayService,
    state: &ClusterState,
    args: &FitArgs,
) -> Result<cli::DecisionSummary> {
    let ns = plan.namespace().unwrap_or_default();
    let clusters = Api::<RayCluster>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items;
    let flag = match args.kuberay_version.as_deref() {
        Some(_) => Some(cli::kuberay_version(args.kuberay_version.as_deref())?),
        None => None,
    };
    let stamps = clusters.iter().filter_map(|c| {
        let stamp = c.annotations().get(kuberay::ANNOTATION_KUBERAY_VERSION)?;
        Some((ns.as_str(), stamp.as_str()))
    });
    let release = kuberay::Releases::from_stamps(stamps, flag).for_namespace(&ns);
    // The live object as `kubectl apply -f FILE` would leave it: its
    // metadata and status, the file's spec with raygate's gate kept.
    let mut applied = live.clone();
    applied.spec = file.spec.clone();
    let file_sets_gate = file
        .spec
        .upgrade_strategy
        .as_ref()
        .and_then(|u| u.type_.as_ref())
        .is_some();
    if !file_sets_gate
        && let Some(t) = live
            .spec
            .upgrade_strategy
            .as_ref()
            .and_then(|u| u.type_.clone())
    {
        applied
            .spec
            .upgrade_strategy
            .get_or_insert_with(Default::default)
            .type_ = Some(t);
    }
    let own: Vec<&RayCluster> = clusters
        .iter()
        .filter(|c| crate::admission::objects::is_cluster_of(&c.metadata, live))
        .collect();
    let objects: Vec<ClusterObject<'_>> = own
        .iter()
        .map(|c| ClusterObject {
            name: c.name_any(),
            cluster: Ok(*c),
        })
        .collect();
    let mut pods: BTreeMap<String, Vec<PodRef>> = BTreeMap::new();
    for r in &state.pods {
        if &*r.key.0 != ns.as_str() {
            continue;
        }
        if let Some(c) = r
            .body
            .cluster()
            .filter(|c| objects.iter().any(|o| o.name == *c))
        {
            pods.entry(c.to_string())
                .or_default()
                .push(Arc::new(r.clone()));
        }
    }
    let alone = crate::admission::fit::Alone(state);
    let quota = live_quota(client, plan, live).await;
    let mut inputs = crate::admission::objects::inputs(
        plan,
        operator,
        &release,
        Timestamp::now(),
        false,
        &alone,
        Ok(&applied),
        &objects,
        pods,
    );
    inputs.quota = quota;
    Ok(summary(&crate::admission::decide(&inputs)))
}

/// Kueue's quota for a Kueue-managed RayService, read live as the
/// controller's caches hold it (`--kueue`): its LocalQueue's ClusterQueue,
/// every ClusterQueue (the cohort), and the plan's reservation. `None` when
/// Kueue does not manage it or Kueue's API is not installed.
async fn live_quota(
    client: &Client,
    plan: &UpgradePlan,
    live: &RayService,
) -> Option<crate::admission::quota::QuotaFacts> {
    use crate::admission::quota::QuotaFacts;
    use crate::kueue::types::{ClusterQueue, LocalQueue, Workload};
    let managed = crate::kueue::Managed::of(&live.metadata)?;
    let ns = plan.namespace().unwrap_or_default();
    let lq = match Api::<LocalQueue>::namespaced(client.clone(), &ns)
        .get_opt(managed.queue.as_str())
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 404 => return None,
        other => other,
    };
    let reservation = match plan.metadata.uid.as_deref() {
        Some(uid) => Api::<Workload>::namespaced(client.clone(), &ns)
            .list(&ListParams::default().labels(&format!(
                "{},{}={}",
                crate::kueue::reservation::SELECTOR,
                crate::kueue::reservation::LABEL_PLAN_UID,
                crate::kueue::reservation::label_value(uid)
            )))
            .await
            .ok()
            .and_then(|l| l.items.into_iter().next())
            .map(|w| crate::upgradeplan::QuotaReservation {
                workload: w.name_any(),
                fingerprint: w
                    .labels()
                    .get(crate::kueue::reservation::LABEL_FINGERPRINT)
                    .cloned()
                    .unwrap_or_default()
                    .into(),
                granted: w.quota_granted(),
            }),
        None => None,
    };
    let queue = async {
        let lq = lq
            .map_err(|e| format!("reading LocalQueue {ns}/{}: {e}", managed.queue))?
            .ok_or_else(|| format!("LocalQueue {ns}/{} not found", managed.queue))?;
        let all = Api::<ClusterQueue>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing ClusterQueues: {e}"))?
            .items;
        // raygate's reservations of other plans, as the controller counts
        // them (cluster-wide when the user may list them, else this
        // namespace's), with the LocalQueues they name.
        let selector = ListParams::default().labels(crate::kueue::reservation::SELECTOR);
        let reservations = match Api::<Workload>::all(client.clone()).list(&selector).await {
            Ok(l) => l.items,
            Err(_) => Api::<Workload>::namespaced(client.clone(), &ns)
                .list(&selector)
                .await
                .map(|l| l.items)
                .unwrap_or_default(),
        };
        let mut queues = vec![lq];
        let namespaces: std::collections::BTreeSet<String> = reservations
            .iter()
            .filter_map(|w| w.metadata.namespace.clone())
            .filter(|n| *n != ns)
            .collect();
        for other in namespaces {
            if let Ok(l) = Api::<LocalQueue>::namespaced(client.clone(), &other)
                .list(&ListParams::default())
                .await
            {
                queues.extend(l.items);
            }
        }
        let cluster_queue_of = |qns: &str, q: &str| {
            queues
                .iter()
                .find(|l| {
                    l.metadata.name.as_deref() == Some(q)
                        && l.metadata.namespace.as_deref().unwrap_or(ns.as_str()) == qns
                })
                .and_then(|l| l.spec.cluster_queue.clone())
        };
        crate::admission::quota::queue_quota(
            &ns,
            &managed.queue,
            cluster_queue_of,
            all,
            &reservations,
            plan.metadata.uid.as_deref(),
        )
    }
    .await;
    Some(QuotaFacts {
        queue,
        reservation,
        service_workload: None,
    })
}

/// What `fit` prints of a decision.
fn summary(d: &crate::admission::Decision) -> cli::DecisionSummary {
    cli::DecisionSummary {
        phase: d.status.phase.as_str().to_string(),
        waiting_for: d.status.waiting_for.clone(),
        message: d.status.message.clone(),
        gate: d.gate.map(|g| g.strategy().to_string()),
        batch: d.status.batch.clone(),
    }
}

/// The holds the controller would put on change `fingerprint` of `plan`
/// ([`crate::admission::holds`]): none once that change is admitted (the
/// controller then tracks it).
fn plan_holds(
    plan: &UpgradePlan,
    settings: &Settings,
    fingerprint: &str,
    paths: &[String],
    now: Timestamp,
) -> Vec<Hold> {
    if is_admitted(plan, fingerprint) {
        return vec![];
    }
    let mut holds = crate::admission::holds(plan, settings, fingerprint, now);
    // In the controller's order: a pause first, then the batch, then the rest.
    if let Some(b) = crate::admission::batch_hold(plan, settings, fingerprint, paths, now) {
        let at = usize::from(holds.first() == Some(&Hold::Paused));
        holds.insert(at, b);
    }
    holds
}

/// Another field manager keeping the live RayService's gate holds any change
/// (rule 4's last step), read from managedFields as the controller reads it.
fn live_gate_hold(live: &RayService) -> Option<Hold> {
    let managed = live.metadata.managed_fields.as_deref().unwrap_or(&[]);
    let value = live
        .spec
        .upgrade_strategy
        .as_ref()
        .and_then(|u| u.type_.as_ref())
        .map(UpgradeType::as_str);
    crate::admission::gate_hold(
        crate::upgradeplan::ownership::other_owner(managed).as_deref(),
        value,
    )
}

/// The plan's priority as the controller ranks it: `spec.priority` capped by
/// the operator's `--max-priority` (the chart caps every namespace at 0 by
/// default), so a `priority: 10` that ranks as 0 says so.
fn priority_note(plan: &UpgradePlan) -> String {
    let asked = plan.spec.priority;
    match plan.status.as_ref().and_then(|s| s.effective_priority) {
        Some(ranked) if ranked != asked => format!(
            "priority {asked}, ranked as {ranked}: capped by the operator's --max-priority \
             (chart value maxPriority)"
        ),
        _ => format!("priority {asked}"),
    }
}

/// A file that sets `spec.upgradeStrategy.type` takes the gate from raygate
/// once applied (its applier becomes the field's owner): the change would be
/// held as `GateOverridden`, as `explain` warns.
fn file_gate_hold(file: &RayService) -> Option<Hold> {
    let value = file
        .spec
        .upgrade_strategy
        .as_ref()
        .and_then(|u| u.type_.as_ref())?;
    crate::admission::gate_hold(
        Some("whoever applies this file (kubectl, Argo CD, Flux)"),
        Some(value.as_str()),
    )
}

/// The plan's admitted change is `fingerprint`.
fn is_admitted(plan: &UpgradePlan, fingerprint: &str) -> bool {
    plan.status
        .as_ref()
        .and_then(|s| s.admitted.as_ref())
        .is_some_and(|a| a.fingerprint == fingerprint)
}

/// One `Held:` line per hold, before the fit.
fn hold_notes(holds: &[Hold]) -> Vec<(&'static str, String)> {
    holds
        .iter()
        .map(|h| {
            (
                "Held:",
                format!(
                    "{} (phase {}): the upgrade does not proceed, whether or not it fits",
                    h.message(),
                    h.phase().as_str()
                ),
            )
        })
        .collect()
}

/// The UpgradePlans of a namespace; none where raygate's CRD is not
/// installed (the fit is then the plain scheduler question).
async fn plans_in(client: &Client, ns: &str) -> Result<Vec<UpgradePlan>> {
    match Api::<UpgradePlan>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(list.items),
        // An unknown resource type is the apiserver's plain "404 page not
        // found", not a NotFound Status.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(vec![]),
        Err(e) => Err(e.into()),
    }
}

/// What admitted upgrades of other RayServices need, summed: the most the
/// ledger holds for them (it holds what of it is not bound yet; the status
/// does not say how much that is).
fn reservations(plans: &[UpgradePlan], except: &str) -> BTreeMap<String, String> {
    let mut total = ResourceList::new();
    for p in plans
        .iter()
        .filter(|p| p.spec.ray_service_ref.name != except)
    {
        let Some(status) = p.status.as_ref() else {
            continue;
        };
        if let (Some(_), Some(capacity)) = (&status.admitted, &status.capacity) {
            crate::capacity::add_into(&mut total, &parse_status_map(&capacity.needed));
        }
    }
    crate::capacity::canonical_map(&total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serve_config_change_is_seen_against_the_live_rayservice() {
        let svc = |route: &str| -> RayService {
            serde_json::from_value(json!({
                "apiVersion": "ray.io/v1", "kind": "RayService",
                "metadata": {"name": "chat", "namespace": "ml"},
                "spec": {
                    "serveConfigV2": format!("applications:\n  - name: chat\n    import_path: a:b\n    route_prefix: {route}\n"),
                    "rayClusterConfig": {
                        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                            {"name": "ray-head", "image": "rayproject/ray:2.9.0"}]}}},
                        "workerGroupSpecs": []
                    }
                }
            }))
            .unwrap()
        };
        let v = kuberay::KubeRayVersion::latest();
        let (live, new) = (svc("/"), svc("/chat"));
        // What the cluster side alone says: nothing changed.
        let cluster_only = kuberay::classify(&kuberay::OldSide::RayService(&new), &new, v).unwrap();
        assert_eq!(cluster_only.verdict, kuberay::Verdict::NoChange);
        let c = cli::with_live_serve_config(cluster_only.clone(), &live, &new);
        assert_eq!(c.verdict, kuberay::Verdict::ServeConfigUpdate);
        assert_eq!(
            c.serve_config_paths,
            ["serveConfigV2.applications[chat].route_prefix"]
        );
        let same = cli::with_live_serve_config(cluster_only, &new, &new);
        assert_eq!(same.verdict, kuberay::Verdict::NoChange);
        assert!(same.serve_config_paths.is_empty());
    }

    /// Every hold the controller would make on the change, one `Held:` line
    /// each; none once the change is admitted (the controller tracks it).
    #[test]
    fn live_fit_shows_every_hold_of_the_plan() {
        let spec = json!({
            "rayServiceRef": {"name": "chat"}, "policy": "Manual", "approve": "0123456789ab",
            "maintenanceWindows": [{"schedule": "0 2 * * *", "duration": "2h"}]
        });
        let mut plan = UpgradePlan::new("chat", serde_json::from_value(spec).unwrap());
        let settings = Settings::of(&plan).unwrap();
        let noon: Timestamp = "2026-12-02T12:00:00Z".parse().unwrap();
        let fp = "6aca5d208cb0";
        let holds = plan_holds(&plan, &settings, fp, &[], noon);
        let kinds: Vec<&str> = holds.iter().map(Hold::as_str).collect();
        assert_eq!(kinds, ["Approval", "MaintenanceWindow"]);
        let mut text = String::new();
        for (label, value) in hold_notes(&holds) {
            cli::field(&mut text, label, &value);
        }
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("Held:")).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].starts_with("Held:         policy Manual: approve with `kubectl raygate approve chat --fingerprint 6aca5d208cb0`"),
            "{text}"
        );
        assert!(
            text.contains(
                "no maintenance window is open now (UTC); the next opens at 2026-12-03T02:00:00Z"
            ),
            "{text}"
        );
        // At 03:00 the window is open: only the approval is missing.
        let night: Timestamp = "2026-12-02T03:00:00Z".parse().unwrap();
        assert_eq!(plan_holds(&plan, &settings, fp, &[], night).len(), 1);
        // This change is admitted already: no hold.
        plan.status = Some(crate::upgradeplan::UpgradePlanStatus {
            admitted: Some(crate::upgradeplan::Admission {
                fingerprint: fp.into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(plan_holds(&plan, &settings, fp, &[], noon).is_empty());
    }

    /// A gate kept by another field manager is a hold too, named with its
    /// manager; raygate's own gate is not.
    #[test]
    fn live_fit_shows_a_gate_another_manager_keeps() {
        let svc = |manager: &str| -> RayService {
            serde_json::from_value(json!({
                "apiVersion": "ray.io/v1", "kind": "RayService",
                "metadata": {"name": "chat", "namespace": "ml", "managedFields": [{
                    "manager": manager, "operation": "Apply", "apiVersion": "ray.io/v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:upgradeStrategy": {"f:type": {}}}}
                }]},
                "spec": {"upgradeStrategy": {"type": "NewCluster"}}
            }))
            .unwrap()
        };
        let h = live_gate_hold(&svc("argocd-controller")).unwrap();
        assert_eq!(h.as_str(), "GateOverridden");
        let mut text = String::new();
        for (label, value) in hold_notes(&[h]) {
            cli::field(&mut text, label, &value);
        }
        assert!(
            text.starts_with(
                "Held:         field manager \"argocd-controller\" owns spec.upgradeStrategy.type (NewCluster)"
            ),
            "{text}"
        );
        assert_eq!(
            live_gate_hold(&svc(crate::upgradeplan::ownership::FIELD_MANAGER)),
            None
        );
    }

    /// Issue 32, item 1: a priority the operator caps says what it ranks as.
    #[test]
    fn a_capped_priority_says_what_it_ranks_as() {
        let spec: crate::upgradeplan::UpgradePlanSpec =
            serde_json::from_value(json!({"rayServiceRef": {"name": "chat"}, "priority": 10}))
                .unwrap();
        let mut plan = UpgradePlan::new("chat", spec);
        assert_eq!(priority_note(&plan), "priority 10");
        plan.status = Some(crate::upgradeplan::UpgradePlanStatus {
            effective_priority: Some(0),
            ..Default::default()
        });
        assert_eq!(
            priority_note(&plan),
            "priority 10, ranked as 0: capped by the operator's --max-priority (chart value maxPriority)"
        );
    }

    /// Issue 32: `fit -f` of a manifest that sets `upgradeStrategy` says the
    /// gate would be overridden, as `explain` does.
    #[test]
    fn live_fit_of_a_file_setting_the_gate_says_it_would_be_overridden() {
        let file: RayService = serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "chat", "namespace": "ml"},
            "spec": {"upgradeStrategy": {"type": "NewCluster"}}
        }))
        .unwrap();
        let h = file_gate_hold(&file).unwrap();
        assert_eq!(h.as_str(), "GateOverridden");
        let mut text = String::new();
        for (label, value) in hold_notes(&[h]) {
            cli::field(&mut text, label, &value);
        }
        assert!(text.contains("whoever applies this file"), "{text}");
        let mut unset = file.clone();
        unset.spec.upgrade_strategy = None;
        assert_eq!(file_gate_hold(&unset), None);
    }

    #[test]
    fn a_live_cluster_is_judged_by_the_release_that_wrote_it() {
        let rc = |v: &str| -> RayCluster {
            serde_json::from_value(json!({
                "apiVersion": "ray.io/v1", "kind": "RayCluster",
                "metadata": {"name": "c", "annotations": {"ray.io/kuberay-version": v}},
                "spec": {"workerGroupSpecs": []}
            }))
            .unwrap()
        };
        let latest = kuberay::KubeRayVersion::latest();
        let (v, note) = live_version(None, Some(&rc("v1.6.1"))).unwrap();
        assert_eq!(v.to_string(), "v1.6.1");
        assert!(
            note.unwrap()
                .starts_with("v1.6.1, the release that last wrote")
        );
        let (v, note) = live_version(Some("1.5"), Some(&rc("v1.6.1"))).unwrap();
        assert_eq!((v.to_string(), note), ("v1.5.2".to_string(), None));
        // A release raygate does not know: the nearest older one's rules, said so.
        let (v, note) = live_version(None, Some(&rc("v9.0.0"))).unwrap();
        assert_eq!(v, latest);
        assert!(
            note.unwrap()
                .contains("KubeRay v9.0.0, a release raygate does not know")
        );
        let (v, note) = live_version(None, Some(&rc("v1.6.3"))).unwrap();
        assert_eq!(v.to_string(), "v1.6.2");
        assert!(note.unwrap().contains("nearest older"));
        let (v, note) = live_version(None, Some(&rc("nightly"))).unwrap();
        assert_eq!(v, latest);
        assert!(note.unwrap().contains("\"nightly\" is not a release"));
        assert_eq!(live_version(None, None).unwrap(), (latest, None));
        assert!(live_version(Some("0.1"), None).is_err());
    }

    #[test]
    fn the_files_namespace_must_match_an_explicit_namespace() {
        let svc = |ns: Option<&str>| {
            let mut s: RayService = serde_json::from_value(json!({
                "apiVersion": "ray.io/v1", "kind": "RayService",
                "metadata": {"name": "chat"}, "spec": {}
            }))
            .unwrap();
            s.metadata.namespace = ns.map(str::to_owned);
            s
        };
        let f = Path::new("svc.yaml");
        assert_eq!(
            service_namespace(&svc(None), f, None, "ctx").unwrap(),
            "ctx"
        );
        assert_eq!(
            service_namespace(&svc(None), f, Some("ml"), "ctx").unwrap(),
            "ml"
        );
        assert_eq!(
            service_namespace(&svc(Some("ml")), f, None, "ctx").unwrap(),
            "ml"
        );
        assert_eq!(
            service_namespace(&svc(Some("ml")), f, Some("ml"), "ctx").unwrap(),
            "ml"
        );
        let err = service_namespace(&svc(Some("ml")), f, Some("dev"), "ctx")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "svc.yaml: the namespace from the provided object \"ml\" does not match"
            ),
            "{err}"
        );
    }
}
