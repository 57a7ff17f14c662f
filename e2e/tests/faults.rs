//! Faults on the real control plane (Kubernetes v1.36, kwok, the real KubeRay operator):
//! a stolen leader Lease, a black-holed apiserver connection, a leader frozen past its
//! Lease while another replica takes over, apiserver and etcd restarts mid-upgrade, and a
//! second field manager forcing the gate; DRA faults (a pool republished under a new
//! generation, slices withdrawn after admission, a DeviceClass narrowed, a claim left
//! allocated while the resourceclaim controller is down) with the real scheduler.
//!
//! Every replica talks to the apiserver as a ServiceAccount of its own and the apiserver
//! writes an audit log of every write (`ControlPlane::start_audited`), so "the stale leader
//! wrote nothing after the takeover" is read from the apiserver's own record, not from
//! raygate's logs. Needs `e2e/setup` and `cargo build --workspace --bins`.

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    VersionMatch, WatchEvent, WatchParams,
};
use raygate_e2e::apis::{plan_api, rc_api, rs_api};
use raygate_e2e::control_plane::repo_root;
use raygate_e2e::dra;
use raygate_e2e::faults::{
    AuditEvent, Free, PodShape, TcpProxy, audit_events, check_admission_fit, etcd_compact,
    metrics_certificates, new_cluster_pods, quantity, recount_fit, service_account_kubeconfig,
    service_account_user,
};
use raygate_e2e::json::str_at;
use raygate_e2e::{
    Check, ControlPlane, FakeNode, GpuRayService, Options, Raygate, Spawn, create_namespace,
    wait_for,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);
const LEASE: &str = "raygate-leader";
/// Short leases so that takeovers happen within seconds: 8 s, renewed 4 s early, so every
/// API call is bounded by 1 s (grace / 4). With 4 s / 2 s (0.5 s per call) a leader on a
/// loaded 2-core machine lost its Lease to slow renewals with no fault injected.
const LEASE_SECONDS: u64 = 8;
const LEADER_ARGS: [&str; 8] = [
    "--leader-elect",
    "true",
    "--lease-namespace",
    "default",
    "--lease-duration-seconds",
    "8",
    "--lease-grace-seconds",
    "4",
];

fn or_panic<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}"))
}

/// The control plane (with audit log) and the UpgradePlan CRD.
async fn control_plane(opts: Options) -> (ControlPlane, Client) {
    let cp = ControlPlane::start_audited(opts)
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))
        .expect("install the UpgradePlan CRD");
    let client = cp.client().await.expect("client");
    (cp, client)
}

/// A replica: its own ServiceAccount (cluster-admin: RBAC is not what these tests are
/// about) and its own Lease identity, optionally through `proxy`.
struct Replica {
    id: &'static str,
    user: String,
    kubeconfig: PathBuf,
}

impl Replica {
    fn new(cp: &ControlPlane, id: &'static str, proxy: Option<&TcpProxy>) -> Replica {
        let kubeconfig = or_panic(service_account_kubeconfig(
            cp,
            "default",
            id,
            Some("cluster-admin"),
            proxy.map(TcpProxy::addr),
        ));
        Replica {
            id,
            user: service_account_user("default", id),
            kubeconfig,
        }
    }

    fn spawn(&self, cp: &ControlPlane) -> Raygate {
        let env = [("POD_NAME", self.id)];
        Raygate::spawn_with(
            cp,
            &Spawn {
                kubeconfig: Some(&self.kubeconfig),
                env: &env,
                args: &LEADER_ARGS,
                ..Spawn::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}"))
    }
}

async fn holder(client: &Client) -> Result<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "default");
    let l = api.get_opt(LEASE).await?;
    Ok(l.and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .unwrap_or_default())
}

async fn wait_holder(client: &Client, id: &str, timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    wait_for(&format!("lease held by {id}"), timeout, || async {
        let h = holder(client).await?;
        Ok(if h == id {
            Check::Done(())
        } else {
            Check::NotYet(format!("holder {h:?}"))
        })
    })
    .await?;
    Ok(start.elapsed())
}

/// Gives the Lease to someone outside the protocol, as a misbehaving replica or a person
/// with kubectl would: the holder learns it only from the Lease itself.
async fn steal_lease(client: &Client) -> Result<k8s_openapi::jiff::Timestamp> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "default");
    let now = k8s_openapi::jiff::Timestamp::now();
    let patch = json!({"spec": {
        "holderIdentity": "intruder",
        "renewTime": MicroTime(now),
        "acquireTime": MicroTime(now),
        "leaseDurationSeconds": 600,
    }});
    api.patch(LEASE, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(k8s_openapi::jiff::Timestamp::now())
}

fn plan(name: &str, service: &str) -> Value {
    json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan", "metadata": {"name": name},
           "spec": {"rayServiceRef": {"name": service}, "stallAfter": "10m"}})
}

async fn create(api: &Api<DynamicObject>, v: Value) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(v)?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

async fn get(api: &Api<DynamicObject>, name: &str) -> Result<Value> {
    Ok(serde_json::to_value(api.get(name).await?)?)
}

fn phase(p: &Value) -> &str {
    str_at(p, &["status", "phase"])
}

fn describe(p: &Value) -> String {
    format!(
        "phase={} waitingFor={:?} message={:?}",
        phase(p),
        str_at(p, &["status", "waitingFor"]),
        str_at(p, &["status", "message"])
    )
}

async fn wait_phase(client: &Client, ns: &str, plan: &str, want: &str) -> Result<Value> {
    let api = plan_api(client, ns);
    wait_for(
        &format!("UpgradePlan {ns}/{plan} in phase {want}"),
        T,
        || async {
            let p = get(&api, plan).await?;
            Ok(if phase(&p) == want {
                Check::Done(p)
            } else {
                Check::NotYet(describe(&p))
            })
        },
    )
    .await
}

/// A plan for a RayService that does not exist: the leader writes `Error` into its status,
/// so each new one makes the leader write.
async fn orphan_plan(client: &Client, ns: &str, name: &str) -> Result<()> {
    create(
        &plan_api(client, ns),
        plan(name, &format!("missing-{name}")),
    )
    .await
}

/// The successful writes `user` made that the apiserver received at or after `after`.
fn writes_after(
    cp: &ControlPlane,
    user: &str,
    after: k8s_openapi::jiff::Timestamp,
) -> Vec<AuditEvent> {
    let path = or_panic(cp.audit_log_path());
    or_panic(audit_events(&path))
        .into_iter()
        .filter(|e| e.user == user && e.succeeded() && e.received >= after)
        .collect()
}

fn writes_by(cp: &ControlPlane, user: &str) -> Vec<AuditEvent> {
    writes_after(cp, user, k8s_openapi::jiff::Timestamp::MIN)
}

/// When the Lease write that made `id`'s takeover happen completed (the apiserver's clock).
fn takeover_at(cp: &ControlPlane, user: &str) -> k8s_openapi::jiff::Timestamp {
    writes_by(cp, user)
        .into_iter()
        .find(|e| e.resource == "leases" && e.name == LEASE)
        .map(|e| e.completed)
        .unwrap_or_else(|| panic!("no Lease write by {user} in the audit log"))
}

fn show(events: &[AuditEvent]) -> String {
    events
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_lost_leadership(rg: &mut Raygate, within: Duration, what: &str) -> Duration {
    let start = Instant::now();
    let status = rg
        .wait_exit(within)
        .unwrap_or_else(|| panic!("{what}: raygate still running after {within:?}"));
    let took = start.elapsed();
    assert!(!status.success(), "{what}: exits non-zero, got {status}");
    let logs = rg.logs();
    assert!(
        logs.contains("leadership lost"),
        "{what}: says why it stopped:\n{logs}"
    );
    took
}

/// The Lease protocol between two replicas and a Lease taken away: a standby never writes
/// while the leader renews; a leader stopped cleanly hands over within a lease duration;
/// a leader whose Lease is taken stops, and writes nothing after it could have known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_waits_a_release_hands_over_and_a_stolen_lease_stops_the_leader() {
    let (cp, client) = control_plane(Options::without_kuberay()).await;
    let ns = or_panic(create_namespace(&client, "fault").await);
    let a = Replica::new(&cp, "replica-a", None);
    let b = Replica::new(&cp, "replica-b", None);

    let mut ra = a.spawn(&cp);
    or_panic(wait_holder(&client, a.id, T).await);
    let rb = b.spawn(&cp);
    or_panic(orphan_plan(&client, &ns, "p0").await);
    or_panic(wait_phase(&client, &ns, "p0", "Error").await);

    // B stays a standby for several lease durations while A renews: not one write.
    tokio::time::sleep(Duration::from_secs(2 * LEASE_SECONDS)).await;
    assert_eq!(or_panic(holder(&client).await), a.id);
    let by_b = writes_by(&cp, &b.user);
    assert!(by_b.is_empty(), "the standby wrote:\n{}", show(&by_b));
    assert!(
        writes_by(&cp, &a.user)
            .iter()
            .any(|e| e.resource == "upgradeplans" && e.subresource == "status"),
        "the leader wrote p0's status"
    );

    // A clean stop releases the Lease: B takes over within about one lease duration.
    let stopped = k8s_openapi::jiff::Timestamp::now();
    or_panic(ra.signal("TERM"));
    let status = ra.wait_exit(Duration::from_secs(30)).expect("A exits");
    assert!(status.success(), "a clean stop exits 0: {status}");
    let handover = or_panic(wait_holder(&client, b.id, T).await);
    eprintln!("hand-over after SIGTERM: {handover:?}");
    assert!(
        handover < Duration::from_secs(2 * LEASE_SECONDS),
        "{handover:?}"
    );
    let late = writes_after(&cp, &a.user, stopped);
    assert!(
        late.iter().all(|e| e.resource == "leases"),
        "A wrote only its Lease release after SIGTERM:\n{}",
        show(&late)
    );
    or_panic(orphan_plan(&client, &ns, "p1").await);
    or_panic(wait_phase(&client, &ns, "p1", "Error").await);

    // The Lease is taken from B outside the protocol. B learns it from the Lease and stops;
    // new plans keep arriving meanwhile, so a B that went on would write.
    let mut rb = rb;
    let stolen = or_panic(steal_lease(&client).await);
    let start = Instant::now();
    let mut n = 2;
    while rb.is_running() && start.elapsed() < Duration::from_secs(3 * LEASE_SECONDS) {
        or_panic(orphan_plan(&client, &ns, &format!("p{n}")).await);
        n += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let took = assert_lost_leadership(&mut rb, Duration::from_secs(5), "stolen lease");
    let noticed = start.elapsed() + took;
    eprintln!("stolen lease noticed after {noticed:?}");
    assert!(
        noticed < Duration::from_secs(LEASE_SECONDS),
        "B stops within its lease duration: {noticed:?}"
    );
    // B renews every duration - grace and reads the Lease then: a write it decided just
    // before learning may land, none after it could have known.
    let known = stolen
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
            i64::try_from(LEASE_SECONDS).unwrap_or(8),
        ))
        .expect("time");
    let late = writes_after(&cp, &b.user, known);
    assert!(
        late.is_empty(),
        "writes by B after it must have known:\n{}",
        show(&late)
    );
    assert_eq!(or_panic(holder(&client).await), "intruder");
}

/// The apiserver stops answering one replica (a TCP proxy in front of it swallows every
/// byte, connections stay open): raygate must notice from its own clock, within its Lease,
/// and stop, before another replica can take over; the other then leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_apiserver_stops_the_leader_before_its_lease_expires() {
    let (cp, client) = control_plane(Options::without_kuberay()).await;
    let ns = or_panic(create_namespace(&client, "fault").await);
    let api = format!("127.0.0.1:{}", or_panic(cp.apiserver_port()));
    let proxy = or_panic(TcpProxy::start(api.parse().expect("addr")));
    let a = Replica::new(&cp, "replica-a", Some(&proxy));
    let b = Replica::new(&cp, "replica-b", None);
    let mut ra = a.spawn(&cp);
    or_panic(wait_holder(&client, a.id, T).await);
    let _rb = b.spawn(&cp);
    // A standby behind the same proxy: it stays up through the fault, so its /readyz
    // shows what readiness means ("can decide": the API server answered lately).
    let c = Replica::new(&cp, "replica-c", Some(&proxy));
    let rc = c.spawn(&cp);
    or_panic(orphan_plan(&client, &ns, "p0").await);
    or_panic(wait_phase(&client, &ns, "p0", "Error").await);
    assert_eq!(
        rc.get("/readyz").expect("readyz").0,
        200,
        "standby reaching the API"
    );

    proxy.blackhole(true);
    let cut = Instant::now();
    let took = assert_lost_leadership(
        &mut ra,
        Duration::from_secs(3 * LEASE_SECONDS),
        "black-holed apiserver",
    );
    eprintln!("black hole noticed after {took:?}");
    // The Lease manager's renewals fail (time out) and it keeps retrying without ever
    // saying the Lease is lost: only the watchdog, reading the Lease on its own clock,
    // stops the work. This is the case it exists for.
    let logs = ra.logs();
    assert!(
        logs.contains("no renewal of lease") && logs.contains("confirmed in time"),
        "stopped by the watchdog:\n{logs}"
    );
    let cut_elapsed = cut.elapsed();
    // Its last renewal was before the cut, so its Lease ends within LEASE_SECONDS of it.
    assert!(
        cut_elapsed < Duration::from_secs(LEASE_SECONDS),
        "stopped before its Lease could expire: {cut_elapsed:?}"
    );
    let waited = or_panic(wait_holder(&client, b.id, T).await);
    eprintln!("B leads {waited:?} after A stopped");
    or_panic(orphan_plan(&client, &ns, "p1").await);
    or_panic(wait_phase(&client, &ns, "p1", "Error").await);
    // The standby behind the black hole: /readyz 503 once the API server has not
    // answered for 15 s (its probe of /version times out), 200 again once it answers.
    let readyz = |want: u16, within: Duration| {
        let start = Instant::now();
        loop {
            let got = rc.get("/readyz");
            if matches!(&got, Ok((code, _)) if *code == want) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "/readyz {want} within {within:?}: {got:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    readyz(503, Duration::from_secs(40));
    eprintln!("standby unready {:?} after the cut", cut.elapsed());
    proxy.blackhole(false);
    let ready = readyz(200, Duration::from_secs(20));
    eprintln!("standby ready again {ready:?} after the API server answered");
    let took_over = takeover_at(&cp, &b.user);
    let late = writes_after(&cp, &a.user, took_over);
    assert!(
        late.is_empty(),
        "writes by A after B took over:\n{}",
        show(&late)
    );
}

// ---------------------------------------------------------------------------------------
// Faults in the middle of upgrades, with the real KubeRay operator.

/// A GPU RayService: CPU head, one worker group of `replicas` x `gpus` GPUs, one Serve app.
fn ray_service(name: &str, image: &str, replicas: i64, gpus: u32) -> Value {
    GpuRayService::new(name, image)
        .replicas(replicas)
        .gpus(gpus)
        .build()
}

async fn add_node(client: &Client, name: &str, gpus: u32) {
    FakeNode::new(name)
        .cpu("32")
        .memory("256Gi")
        .gpu(gpus)
        .create(client)
        .await
        .expect("create fake node");
}

async fn bump_worker(client: &Client, ns: &str, svc: &str, image: &str) -> Result<()> {
    let rs = rs_api(client, ns);
    let current = get(&rs, svc).await?;
    let mut groups = current["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
    groups[0]["template"]["spec"]["containers"][0]["image"] = json!(image);
    let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
    rs.patch(svc, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn gate(client: &Client, ns: &str, svc: &str) -> Result<String> {
    let rs = get(&rs_api(client, ns), svc).await?;
    Ok(str_at(&rs, &["spec", "upgradeStrategy", "type"]).to_string())
}

async fn clusters(client: &Client, ns: &str) -> Result<BTreeSet<String>> {
    let l = rc_api(client, ns).list(&ListParams::default()).await?;
    Ok(l.items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect())
}

/// A held upgrade and an admitted one, both in flight, for a fault to land in.
struct Upgrades {
    ns: String,
    /// The held service's clusters before the fault (it must keep exactly these).
    held_clusters: BTreeSet<String>,
    /// `status.admitted` of the admitted plan, as first recorded.
    admitted: Value,
    /// The resourceVersion of the status write that recorded it.
    admission_rv: String,
}

const HELD: &str = "held";
const ADMITTED: &str = "admitted";
const APP_STATUS: &str = "ray-head.e2e.raygate.dev/app-status";

fn of(service: &str, clusters: &BTreeSet<String>) -> BTreeSet<String> {
    let prefix = format!("{service}-");
    clusters
        .iter()
        .filter(|c| c.starts_with(&prefix))
        .cloned()
        .collect()
}

async fn annotate(api: &Api<DynamicObject>, name: &str, value: Option<&str>) -> Result<()> {
    let patch = json!({"metadata": {"annotations": {APP_STATUS: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Nodes: 3 x 8 GPUs. `admitted` (1 x 4 GPUs) is upgraded first and kept `Upgrading`:
/// its new cluster's Serve app reports DEPLOYING (ray-head), so KubeRay does not switch
/// over. Then `held` (2 x 4 GPUs) asks for 2 x 8: 16 GPUs with 8 free, so it waits.
async fn start_upgrades(client: &Client) -> Result<Upgrades> {
    for i in 0..3 {
        add_node(client, &format!("gpu-{i}"), 8).await;
    }
    let ns = create_namespace(client, "fault").await?;
    for (svc, replicas) in [(HELD, 2), (ADMITTED, 1)] {
        create(&plan_api(client, &ns), plan(svc, svc)).await?;
        create(
            &rs_api(client, &ns),
            ray_service(svc, "rayproject/ray:2.9.0-gpu", replicas, 4),
        )
        .await?;
        wait_phase(client, &ns, svc, "Idle").await?;
    }
    // The running cluster stays RUNNING (its own annotation wins), new ones deploy forever.
    let rcs = rc_api(client, &ns);
    for c in of(ADMITTED, &clusters(client, &ns).await?) {
        annotate(&rcs, &c, Some("RUNNING")).await?;
    }
    annotate(&rs_api(client, &ns), ADMITTED, Some("DEPLOYING")).await?;
    let watch = watch_for_admission(client, &ns, ADMITTED).await?;
    bump_worker(client, &ns, ADMITTED, "rayproject/ray:2.10.0-gpu").await?;
    let (admission_rv, at_admission) = watch.await?;
    // raygate's own numbers (status.capacity, what it saw at the decision) add up...
    check_admission_fit(&at_admission).context("at the admission (raygate's numbers)")?;
    // ...and the cluster as the apiserver had it at that write has the room (the test's count).
    let fit = recount_admission(client, &ns, ADMITTED, &admission_rv).await?;
    eprintln!("admission at resourceVersion {admission_rv}: {fit}");
    wait_phase(client, &ns, ADMITTED, "Upgrading").await?;

    let rs = rs_api(client, &ns);
    let current = get(&rs, HELD).await?;
    let mut groups = current["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
    groups[0]["template"]["spec"]["containers"][0]["image"] = json!("rayproject/ray:2.10.0-gpu");
    groups[0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] =
        json!("8");
    let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
    rs.patch(HELD, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    wait_phase(client, &ns, HELD, "WaitingForCapacity").await?;
    let held_clusters = of(HELD, &clusters(client, &ns).await?);
    Ok(Upgrades {
        ns,
        held_clusters,
        admitted: at_admission["status"]["admitted"].clone(),
        admission_rv,
    })
}

/// Starts watching plan `ns/name` from its current resourceVersion; the future returned
/// ends at the first event whose object has `status.admitted`, with that event's
/// resourceVersion (the revision of the status write that recorded the admission) and the
/// plan as written. Start it before the change that leads to the admission.
async fn watch_for_admission(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<impl std::future::Future<Output = Result<(String, Value)>> + use<>> {
    let api = plan_api(client, ns);
    let from = api
        .get(name)
        .await?
        .metadata
        .resource_version
        .context("no resourceVersion")?;
    let wp = WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut events = api.watch(&wp, &from).await?.boxed();
    let what = format!("{ns}/{name}");
    Ok(async move {
        let found = tokio::time::timeout(T, async {
            while let Some(ev) = events.next().await {
                let obj = match ev? {
                    WatchEvent::Added(o) | WatchEvent::Modified(o) => o,
                    WatchEvent::Error(e) => bail!("watching {what}: {e:?}"),
                    _ => continue,
                };
                let v = serde_json::to_value(&obj)?;
                if v["status"]["admitted"].is_object() {
                    let rv = obj
                        .metadata
                        .resource_version
                        .context("no resourceVersion")?;
                    return Ok((rv, v));
                }
            }
            bail!("the watch of {what} ended before an admission")
        })
        .await;
        found.with_context(|| format!("no admission of {what} within {T:?}"))?
    })
}

/// Nodes, Pods, UpgradePlans, RayServices and RayClusters, all at one etcd revision
/// (`resourceVersionMatch=Exact`, a consistent read) or, with `None`, as they are now.
struct World {
    nodes: Vec<Node>,
    pods: Vec<Pod>,
    plans: Vec<Value>,
    services: Vec<Value>,
    clusters: Vec<Value>,
}

async fn world(client: &Client, ns: &str, rv: Option<&str>) -> kube::Result<World> {
    let lp = match rv {
        Some(rv) => ListParams::default().at(rv).matching(VersionMatch::Exact),
        None => ListParams::default(),
    };
    let values = |l: kube::api::ObjectList<DynamicObject>| {
        l.items
            .into_iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .collect::<Vec<_>>()
    };
    let plans = Api::<DynamicObject>::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("raygate.io", "v1alpha1", "UpgradePlan"),
            "upgradeplans",
        ),
    );
    Ok(World {
        nodes: Api::<Node>::all(client.clone()).list(&lp).await?.items,
        pods: Api::<Pod>::all(client.clone()).list(&lp).await?.items,
        plans: values(plans.list(&lp).await?),
        services: values(rs_api(client, ns).list(&lp).await?),
        clusters: values(rc_api(client, ns).list(&lp).await?),
    })
}

fn amounts(m: &Value, what: &str) -> Result<BTreeMap<String, f64>> {
    m.as_object()
        .into_iter()
        .flatten()
        .map(|(r, q)| {
            let v = q
                .as_str()
                .and_then(quantity)
                .with_context(|| format!("{what}.{r}: {q}"))?;
            Ok((r.clone(), v))
        })
        .collect()
}

/// The test's own count of whether plan `ns/name`'s admission had room, in the cluster as
/// it was at resourceVersion `rv` (the admission's status write): every Node and Pod, and
/// the other plans' status, listed at exactly that revision, then [`recount_fit`] (not
/// raygate's capacity code). raygate writes the status first and opens the gate second
/// (controller/mod.rs), so at that revision KubeRay has not been let through and the
/// new cluster has no pods yet; any pod of a cluster of the service other than the one
/// it retires is still left out, in case that order ever changes. If that revision is
/// compacted (410 Gone; the etcd-compaction fault does it on purpose), the count is made
/// on the cluster as it is now, the first moment we can still read, and says so.
async fn recount_admission(client: &Client, ns: &str, name: &str, rv: &str) -> Result<String> {
    let (w, at) = match world(client, ns, Some(rv)).await {
        Ok(w) => (w, format!("at resourceVersion {rv} (Exact)")),
        Err(kube::Error::Api(s)) if s.code == 410 => {
            let mut w = world(client, ns, None).await?;
            let undone = ready_as_at_admission(&mut w, ns, name)?;
            (
                w,
                format!(
                    "resourceVersion {rv} compacted (410: {}): counted after the admission \
                     instead, without the new cluster's pods, with {undone} node(s) that turned \
                     NotReady after the admission (the fault's own restarts) counted Ready",
                    s.message
                ),
            )
        }
        Err(e) => return Err(e).with_context(|| format!("list at resourceVersion {rv}")),
    };
    let verdict = recount_in(&w, ns, name).with_context(|| format!("recount {at}"))?;
    Ok(format!("{verdict} [{at}]"))
}

/// For a count made after the admission: the apiserver and etcd restarts of the fault stop
/// kwok's node heartbeats, and the node lifecycle controller marks nodes NotReady *after*
/// the admission. A node whose Ready condition changed to not-True after the admission
/// time was Ready when raygate decided; it is counted as it was then. Returns how many.
fn ready_as_at_admission(w: &mut World, ns: &str, name: &str) -> Result<usize> {
    let plan = w
        .plans
        .iter()
        .find(|p| {
            str_at(p, &["metadata", "namespace"]) == ns && str_at(p, &["metadata", "name"]) == name
        })
        .with_context(|| format!("no plan {ns}/{name}"))?;
    let admitted: jiff::Timestamp = str_at(plan, &["status", "admitted", "admittedTime"])
        .parse()
        .with_context(|| format!("plan {ns}/{name}: status.admitted.admittedTime"))?;
    let mut undone = 0;
    for n in &mut w.nodes {
        let conditions = n
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .into_iter()
            .flatten();
        let mut restored = false;
        for c in conditions {
            let since = c.last_transition_time.as_ref().map(|t| t.0);
            if c.type_ == "Ready" && c.status != "True" && since.is_some_and(|t| t > admitted) {
                c.status = "True".into();
                restored = true;
            }
        }
        if restored {
            undone += 1;
            // The taints the node lifecycle controller adds for that NotReady state.
            if let Some(taints) = n.spec.as_mut().and_then(|s| s.taints.as_mut()) {
                taints.retain(|t| {
                    t.key != "node.kubernetes.io/not-ready"
                        && t.key != "node.kubernetes.io/unreachable"
                });
            }
        }
    }
    Ok(undone)
}

fn recount_in(w: &World, ns: &str, name: &str) -> Result<String> {
    let is = |p: &Value, ns: &str, name: &str| {
        str_at(p, &["metadata", "namespace"]) == ns && str_at(p, &["metadata", "name"]) == name
    };
    let plan = w
        .plans
        .iter()
        .find(|p| is(p, ns, name))
        .with_context(|| format!("no plan {ns}/{name}"))?;
    let admitted = &plan["status"]["admitted"];
    if !admitted.is_object() {
        bail!("plan {ns}/{name} is not admitted: {}", describe(plan));
    }
    let svc = str_at(plan, &["spec", "rayServiceRef", "name"]);
    let rs = w
        .services
        .iter()
        .find(|s| is(s, ns, svc))
        .with_context(|| format!("no RayService {ns}/{svc}"))?;
    let new_pods: Vec<PodShape> = new_cluster_pods(rs)?;
    // The cluster it retires keeps its pods counted; any other cluster of the service is
    // the new one (or a leftover KubeRay is deleting) and is left out.
    let from = [
        str_at(admitted, &["fromCluster"]),
        str_at(rs, &["status", "activeServiceStatus", "rayClusterName"]),
    ]
    .into_iter()
    .find(|c| !c.is_empty())
    .unwrap_or_default();
    let mut exclude: BTreeSet<String> = w
        .clusters
        .iter()
        .filter(|c| {
            c["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|o| o["kind"] == "RayService" && o["name"] == svc)
        })
        .map(|c| str_at(c, &["metadata", "name"]).to_string())
        .filter(|c| c != from)
        .collect();
    for c in [
        str_at(admitted, &["toCluster"]),
        str_at(plan, &["status", "pendingCluster"]),
        str_at(rs, &["status", "pendingServiceStatus", "rayClusterName"]),
    ] {
        if !c.is_empty() && c != from {
            exclude.insert(c.to_string());
        }
    }
    // Other admitted upgrades hold what their new cluster still has to place: what they
    // recorded as needed, less what of it is already bound (counted on the nodes).
    let mut reserved: BTreeMap<String, f64> = BTreeMap::new();
    for q in w.plans.iter().filter(|q| !is(q, ns, name)) {
        if !q["status"]["admitted"].is_object() {
            continue;
        }
        let qns = str_at(q, &["metadata", "namespace"]);
        let needed = amounts(&q["status"]["capacity"]["needed"], "status.capacity.needed")?;
        let to = [
            str_at(q, &["status", "admitted", "toCluster"]),
            str_at(q, &["status", "pendingCluster"]),
        ]
        .into_iter()
        .find(|c| !c.is_empty());
        let mut bound: BTreeMap<String, f64> = BTreeMap::new();
        for p in &w.pods {
            let labels = p.metadata.labels.as_ref();
            let of_it = to.is_some()
                && p.metadata.namespace.as_deref() == Some(qns)
                && labels
                    .and_then(|l| l.get("ray.io/cluster"))
                    .map(String::as_str)
                    == to;
            let placed = p.spec.as_ref().is_some_and(|s| s.node_name.is_some());
            let done = matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
            if of_it && placed && !done {
                let shape = PodShape::of_spec("", &serde_json::to_value(&p.spec)?)?;
                for (r, v) in shape.requests {
                    *bound.entry(r).or_default() += v;
                }
            }
        }
        for (r, v) in needed {
            let left = (v - bound.get(&r).copied().unwrap_or(0.0)).max(0.0);
            *reserved.entry(r).or_default() += left;
        }
    }
    let headroom = amounts(&plan["spec"]["headroom"], "spec.headroom")?;
    let free = Free::count(&w.nodes, &w.pods, &exclude)?;
    // The gate as this revision had it: `None` at the admission's own write shows the
    // order (status first) held.
    let gate = str_at(rs, &["spec", "upgradeStrategy", "type"]);
    recount_fit(&free, &new_pods, &reserved, &headroom).map(|fit| {
        format!(
            "{fit}; retiring {from:?}, left out {exclude:?}, reserved {reserved:?}, gate {gate:?}"
        )
    })
}

/// After a fault: the held upgrade is still held (gate closed, its clusters unchanged);
/// the admitted one, once its new cluster's app runs, ends `Completed` with one cluster
/// and its gate closed.
async fn check_upgrades_survived(client: &Client, u: &Upgrades) -> Result<()> {
    // Right after the fault: an admission recorded since (there should be none) must
    // have fit when it was made.
    let now = get(&plan_api(client, &u.ns), ADMITTED).await?;
    if now["status"]["admitted"].is_object() && now["status"]["admitted"] != u.admitted {
        check_admission_fit(&now).context("a new admission after the fault")?;
        // Read after it, so at or after the write that recorded it: the world then.
        let rv = str_at(&now, &["metadata", "resourceVersion"]);
        recount_admission(client, &u.ns, ADMITTED, rv)
            .await
            .context("a new admission after the fault")?;
    }
    let rcs = rc_api(client, &u.ns);
    for c in of(ADMITTED, &clusters(client, &u.ns).await?) {
        annotate(&rcs, &c, Some("RUNNING")).await?;
    }
    annotate(&rs_api(client, &u.ns), ADMITTED, None).await?;
    let done = wait_completed_after_faults(client, &u.ns).await?;
    if str_at(&done, &["status", "lastTransition", "fingerprint"]).is_empty() {
        bail!("no completed transition recorded: {}", describe(&done));
    }
    wait_for("one cluster for the admitted service", T, || async {
        let n = of(ADMITTED, &clusters(client, &u.ns).await?).len();
        Ok(if n == 1 {
            Check::Done(())
        } else {
            Check::NotYet(format!("{n} clusters"))
        })
    })
    .await?;
    if gate(client, &u.ns, ADMITTED).await? != "None" {
        bail!("the admitted service's gate was not closed after it completed");
    }
    let held = get(&plan_api(client, &u.ns), HELD).await?;
    if phase(&held) != "WaitingForCapacity" {
        bail!("the held upgrade is no longer held: {}", describe(&held));
    }
    if gate(client, &u.ns, HELD).await? != "None" {
        bail!("the held upgrade's gate opened");
    }
    let held_now = of(HELD, &clusters(client, &u.ns).await?);
    if held_now != u.held_clusters {
        bail!(
            "the held service's clusters changed: {held_now:?}, were {:?}",
            u.held_clusters
        );
    }
    Ok(())
}

/// How long KubeRay may take to finish the admitted upgrade once the faults are over. Its
/// recovery is its own: after the compaction and the apiserver's restart, KubeRay v1.6.2's
/// Service informer lagged its own selector switch, so every retry of the switch was a 409
/// (measured locally: 21 s of them, retried 5 ms, 10 ms, ... 10 s, 16 s apart by
/// controller-runtime's per-item backoff; in CI's 4-suites-at-once run once more than 120 s).
/// raygate reports `Upgrading` / "serve apps" meanwhile, which is what the test checks.
const KUBERAY_RECOVERY: Duration = Duration::from_secs(300);

/// The admitted plan `Completed`. On a timeout, KubeRay's side is in the error too: which
/// cluster its Services select and which it calls active and pending.
async fn wait_completed_after_faults(client: &Client, ns: &str) -> Result<Value> {
    let api = plan_api(client, ns);
    let done = wait_for(
        &format!("UpgradePlan {ns}/{ADMITTED} in phase Completed"),
        KUBERAY_RECOVERY,
        || async {
            let p = get(&api, ADMITTED).await?;
            Ok(if phase(&p) == "Completed" {
                Check::Done(p)
            } else {
                Check::NotYet(describe(&p))
            })
        },
    )
    .await;
    match done {
        Ok(p) => Ok(p),
        Err(e) => {
            let rs = get(&rs_api(client, ns), ADMITTED).await.unwrap_or_default();
            let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
            let selects = match svcs.get(&format!("{ADMITTED}-serve-svc")).await {
                Ok(s) => format!("{:?}", s.spec.and_then(|s| s.selector)),
                Err(e) => format!("unknown ({e})"),
            };
            Err(e.context(format!(
                "KubeRay: active {:?}, pending {:?}, serve Service selects {selects}",
                rs["status"]["activeServiceStatus"]["rayClusterName"],
                rs["status"]["pendingServiceStatus"]["rayClusterName"],
            )))
        }
    }
}

/// Admission events for one plan: more than one per change means it was admitted twice.
/// Issue 26 point 3: an upgrade under way, then its RayService deleted and recreated under
/// the same name with another image. The old change's transition ends `Replaced`, never
/// `Completed` by the new object's first cluster, and the plan follows the new UID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rayservice_recreated_mid_transition_is_a_new_one() {
    let (cp, client) = control_plane(Options::from_env().expect("options")).await;
    for i in 0..2 {
        add_node(&client, &format!("gpu-{i}"), 8).await;
    }
    let rg = Raygate::spawn(&cp, &[]).unwrap_or_else(|e| panic!("{e:#}"));
    let ns = or_panic(create_namespace(&client, "recreate").await);
    let (rs, rcs, api) = (
        rs_api(&client, &ns),
        rc_api(&client, &ns),
        plan_api(&client, &ns),
    );
    const SVC: &str = "probe";
    or_panic(create(&api, plan(SVC, SVC)).await);
    or_panic(create(&rs, ray_service(SVC, "rayproject/ray:2.9.0-gpu", 1, 4)).await);
    or_panic(wait_phase(&client, &ns, SVC, "Idle").await);
    // The running cluster stays RUNNING, the new one deploys forever: Upgrading lasts.
    for c in of(SVC, &or_panic(clusters(&client, &ns).await)) {
        or_panic(annotate(&rcs, &c, Some("RUNNING")).await);
    }
    or_panic(annotate(&rs, SVC, Some("DEPLOYING")).await);
    or_panic(bump_worker(&client, &ns, SVC, "rayproject/ray:2.10.0-gpu").await);
    let upgrading = or_panic(wait_phase(&client, &ns, SVC, "Upgrading").await);
    let old_change = str_at(&upgrading, &["status", "admitted", "fingerprint"]).to_string();
    let old_uid = str_at(&upgrading, &["status", "rayServiceUID"]).to_string();
    assert!(!old_change.is_empty() && !old_uid.is_empty(), "{upgrading}");

    or_panic(
        rs.delete(SVC, &Default::default())
            .await
            .map(|_| ())
            .map_err(anyhow::Error::from),
    );
    or_panic(
        wait_for("the old RayService gone", T, || async {
            Ok(match rs.get_opt(SVC).await? {
                None => Check::Done(()),
                Some(_) => Check::NotYet("still there".into()),
            })
        })
        .await,
    );
    or_panic(create(&rs, ray_service(SVC, "rayproject/ray:2.11.0-gpu", 1, 4)).await);
    let replaced = or_panic(
        wait_for("the old transition ended Replaced", T, || async {
            let p = get(&api, SVC).await?;
            let last = &p["status"]["lastTransition"];
            if last["fingerprint"] == old_change.as_str() && last["outcome"] == "Completed" {
                bail!("the old change was reported Completed: {p}");
            }
            Ok(
                if last["fingerprint"] == old_change.as_str() && last["outcome"] == "Replaced" {
                    Check::Done(p)
                } else {
                    Check::NotYet(format!("{} lastTransition {last}", describe(&p)))
                },
            )
        })
        .await,
    );
    let new_uid = str_at(&replaced, &["status", "rayServiceUID"]).to_string();
    // The new RayService serves on its own first cluster; the record stays Replaced.
    let idle = or_panic(wait_phase(&client, &ns, SVC, "Idle").await);
    assert_eq!(
        idle["status"]["lastTransition"]["outcome"], "Replaced",
        "{idle}"
    );
    assert_eq!(
        idle["status"]["lastTransition"]["fingerprint"],
        old_change.as_str(),
        "{idle}"
    );
    let uid_now = str_at(&idle, &["status", "rayServiceUID"]);
    let live_uid = or_panic(get(&rs, SVC).await)["metadata"]["uid"].clone();
    assert!(
        uid_now != old_uid && live_uid == uid_now && (new_uid.is_empty() || new_uid == uid_now),
        "plan follows the new UID: was {old_uid}, plan {uid_now}, live {live_uid}"
    );
    assert!(idle["status"]["admitted"].is_null(), "{idle}");

    // Issue 26 point 4, on the same RayService: 1.5 GPUs (the apiserver would refuse such
    // a pod, so KubeRay could never create it) is refused with the field path, not
    // rounded up to 2 and admitted; the gate stays closed.
    let current = or_panic(get(&rs, SVC).await);
    let mut groups = current["spec"]["rayClusterConfig"]["workerGroupSpecs"].clone();
    groups[0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] =
        json!("1.5");
    let patch = json!({"spec": {"rayClusterConfig": {"workerGroupSpecs": groups}}});
    or_panic(
        rs.patch(SVC, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(anyhow::Error::from),
    );
    let refused = or_panic(wait_phase(&client, &ns, SVC, "Error").await);
    let msg = str_at(&refused, &["status", "message"]);
    assert!(
        msg.contains("workerGroupSpecs[0].template.spec.containers[0].resources.limits[nvidia.com/gpu]: 1.5 must be an integer"),
        "field path in {msg:?}"
    );
    assert_eq!(
        str_at(&refused, &["status", "waitingFor"]),
        "InvalidRayService"
    );
    assert!(refused["status"]["admitted"].is_null(), "{refused}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(or_panic(gate(&client, &ns, SVC).await), "None");
    assert!(!rg.logs().contains("panicked"), "{}", rg.logs());
}

/// Issue 26 point 5: with the chart's default ceiling (`--max-priority=0`, asserted in
/// the packaging suite) a tenant's `priority: 1000` does not jump an older plan of another
/// namespace: both rank at 0, the older goes first, and `kubectl raygate queue` shows the
/// priority the controller uses beside the one asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_priority_ceiling_keeps_a_tenant_from_jumping_the_queue() {
    let (cp, client) = control_plane(Options::from_env().expect("options")).await;
    add_node(&client, "gpu-0", 8).await;
    let rg = Raygate::spawn(&cp, &["--max-priority=0"]).unwrap_or_else(|e| panic!("{e:#}"));
    let older = or_panic(create_namespace(&client, "team-b").await);
    let pushy = or_panic(create_namespace(&client, "team-a").await);
    for (ns, name, priority) in [(&older, "older", 0), (&pushy, "pushy", 1000)] {
        let mut p = plan(name, name);
        p["spec"]["priority"] = json!(priority);
        or_panic(create(&plan_api(&client, ns), p).await);
        or_panic(
            create(
                &rs_api(&client, ns),
                ray_service(name, "rayproject/ray:2.9.0-gpu", 1, 3),
            )
            .await,
        );
        or_panic(wait_phase(&client, ns, name, "Idle").await);
    }
    // 6 of 8 GPUs used; each new cluster needs 3: both wait, the older first.
    for (ns, name) in [(&older, "older"), (&pushy, "pushy")] {
        or_panic(bump_worker(&client, ns, name, "rayproject/ray:2.10.0-gpu").await);
        or_panic(wait_phase(&client, ns, name, "WaitingForCapacity").await);
    }
    let p = or_panic(get(&plan_api(&client, &pushy), "pushy").await);
    assert_eq!(p["status"]["effectivePriority"], 0, "capped: {p}");
    let bin = raygate_e2e::workspace_bin("kubectl-raygate")
        .expect("kubectl-raygate binary (cargo build --workspace --bins)");
    let out = std::process::Command::new(bin)
        .args(["queue", "-A", "--kubeconfig"])
        .arg(cp.kubeconfig_path())
        .env_remove("KUBECONFIG")
        .output()
        .expect("run kubectl-raygate queue");
    let queue = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{queue} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (o, q) = (queue.find("older"), queue.find("pushy"));
    assert!(
        matches!((o, q), (Some(o), Some(q)) if o < q) && queue.contains("0 (asked 1000)"),
        "queue ranks by the effective priority:\n{queue}"
    );
    // Room for one of them (8 + 3 - 6 = 5 free, each needs 3): the older is admitted.
    add_node(&client, "gpu-1", 3).await;
    or_panic(wait_phase_in(&client, &older, "older", &["Admitted", "Upgrading"]).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = or_panic(get(&plan_api(&client, &pushy), "pushy").await);
    assert_eq!(phase(&p), "WaitingForCapacity", "{}", describe(&p));
    assert!(!rg.logs().contains("panicked"), "{}", rg.logs());
}

/// raygate's resident and peak memory (VmRSS, VmHWM) in MiB.
fn rss_mib(pid: u32) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
    };
    match (kib("VmRSS:"), kib("VmHWM:")) {
        (Some(r), Some(h)) => Ok((r / 1024.0, h / 1024.0)),
        _ => bail!("no VmRSS/VmHWM in /proc/{pid}/status"),
    }
}

/// Seconds from a worker image change to the plan's `status.admitted.admittedTime`.
async fn admission_seconds(client: &Client, ns: &str, svc: &str) -> Result<f64> {
    let before = k8s_openapi::jiff::Timestamp::now();
    bump_worker(client, ns, svc, "rayproject/ray:2.9.3-gpu").await?;
    let p = wait_phase_in(client, ns, svc, &["Admitted", "Upgrading"]).await?;
    let at: k8s_openapi::jiff::Timestamp = str_at(&p, &["status", "admitted", "admittedTime"])
        .parse()
        .with_context(|| format!("admittedTime of {svc}: {p}"))?;
    Ok(at.duration_since(before).as_secs_f64())
}

/// raygate's own part of `plan`'s last admission, in seconds: from the change as it
/// received it to the decision (`decided_ms` of its `gate set` log line; the batch window
/// included). Unlike [`admission_seconds`], it leaves out the apiserver's time for the
/// user's write, the watch and raygate's writes, which another workload's load moves.
/// The status is written before the gate, so the line may come a little after the
/// `Admitted` phase is seen: it is waited for.
async fn decided_seconds(rg: &Raygate, plan: &str) -> Result<f64> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match decided_in(&rg.logs(), plan) {
            Ok(s) => return Ok(s),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn decided_in(logs: &str, plan: &str) -> Result<f64> {
    let line = logs
        .lines()
        .rev()
        .filter(|l| l.contains("gate set") && l.contains(&format!(" plan={plan} ")))
        .find(|l| l.contains("decided_ms="))
        .with_context(|| format!("no `gate set` line with its stages for plan {plan}"))?;
    let ms: i64 = line
        .split("decided_ms=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit() && c != '-').next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("decided_ms in {line}"))?;
    ensure!(ms >= 0, "no decision stage recorded: {line}");
    Ok(ms as f64 / 1e3)
}

async fn wait_phase_in(client: &Client, ns: &str, plan: &str, want: &[&str]) -> Result<Value> {
    let api = plan_api(client, ns);
    wait_for(
        &format!("UpgradePlan {ns}/{plan} in {want:?}"),
        T,
        || async {
            let p = get(&api, plan).await?;
            Ok(if want.contains(&phase(&p)) {
                Check::Done(p)
            } else {
                Check::NotYet(describe(&p))
            })
        },
    )
    .await
}

/// Issue 26 point 1: a tenant's RayService with 5,000 worker groups (under the pod cap,
/// 0.8 MB) once cost raygate 300 MB per object, kept after deletion, and slowed other
/// tenants' admissions 4-5x. Now its plan is an `Error` naming the field path at once,
/// raygate's memory stays within a fixed budget while it exists and after it is deleted,
/// and another tenant's admission takes at most twice its time before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_huge_rayservices_are_refused_within_a_memory_budget() {
    const GROUPS: usize = 5_000;
    // One object (and the RayCluster KubeRay makes of it): three made KubeRay and etcd
    // rewrite 850 KB objects so often that the suite's other test, run beside this one on
    // 2 cores, was starved.
    const HOSTILE: usize = 1;
    /// Resident memory raygate may reach with the object (peak included): about
    /// 48 MiB at rest here, 75 MiB with it and 112-146 MiB at the peak (one object
    /// read from the watch costs ~85 MB transiently, `cargo bench --bench
    /// object_memory`; the RayService and its RayCluster are read by two watches at
    /// once, so the peak depends on their timing). Before the bounds: 342 MB with one,
    /// 628 MB with three, kept after deletion.
    const BUDGET_MIB: f64 = 192.0;
    /// What may stay after they are deleted, over the resident memory before them.
    const KEPT_MIB: f64 = 48.0;
    let (cp, client) = control_plane(Options::from_env().expect("options")).await;
    for i in 0..3 {
        add_node(&client, &format!("gpu-{i}"), 8).await;
    }
    let rg = Raygate::spawn(&cp, &[]).unwrap_or_else(|e| panic!("{e:#}"));
    let calm = or_panic(create_namespace(&client, "team-b").await);
    for svc in ["b1", "b2", "b3", "b4"] {
        or_panic(create(&plan_api(&client, &calm), plan(svc, svc)).await);
        or_panic(
            create(
                &rs_api(&client, &calm),
                ray_service(svc, "rayproject/ray:2.9.0-gpu", 1, 1),
            )
            .await,
        );
    }
    for svc in ["b1", "b2", "b3", "b4"] {
        or_panic(wait_phase(&client, &calm, svc, "Idle").await);
    }
    let (mut baseline, mut own_before) = (vec![], vec![]);
    for svc in ["b1", "b2"] {
        baseline.push(or_panic(admission_seconds(&client, &calm, svc).await));
        own_before.push(or_panic(decided_seconds(&rg, svc).await));
    }
    let (rss_before, _) = or_panic(rss_mib(rg.pid()));

    let hostile_ns = or_panic(create_namespace(&client, "team-a").await);
    let mut huge = ray_service("huge", "rayproject/ray:2.9.0-gpu", 0, 1);
    let group = json!({"replicas": 0, "minReplicas": 0, "maxReplicas": 1, "rayStartParams": {},
        "template": {"spec": {"containers": [
            {"name": "ray-worker", "image": "rayproject/ray:2.9.0-gpu"}]}}});
    huge["spec"]["rayClusterConfig"]["workerGroupSpecs"] = (0..GROUPS)
        .map(|i| {
            let mut g = group.clone();
            g["groupName"] = json!(format!("g{i:04}"));
            g
        })
        .collect();
    for i in 0..HOSTILE {
        let name = format!("huge-{i}");
        let mut obj = huge.clone();
        obj["metadata"]["name"] = json!(name);
        or_panic(create(&plan_api(&client, &hostile_ns), plan(&name, &name)).await);
        or_panic(create(&rs_api(&client, &hostile_ns), obj).await);
    }
    let api = plan_api(&client, &hostile_ns);
    for i in 0..HOSTILE {
        let name = format!("huge-{i}");
        let p = or_panic(
            wait_for(
                &format!("{name} refused with the field path"),
                T,
                || async {
                    let p = get(&api, &name).await?;
                    let msg = str_at(&p, &["status", "message"]);
                    Ok(
                        if phase(&p) == "Error"
                            && msg.contains(
                                "spec.rayClusterConfig.workerGroupSpecs: 5000 worker groups",
                            )
                        {
                            Check::Done(p)
                        } else {
                            Check::NotYet(describe(&p))
                        },
                    )
                },
            )
            .await,
        );
        assert_eq!(
            str_at(&p, &["status", "waitingFor"]),
            "InvalidRayService",
            "{p}"
        );
    }
    // KubeRay has made each one's RayCluster (as large), which raygate caches too.
    or_panic(
        wait_for("the huge RayClusters", T, || async {
            let n = clusters(&client, &hostile_ns).await?.len();
            Ok(if n >= HOSTILE {
                Check::Done(())
            } else {
                Check::NotYet(format!("{n} RayClusters"))
            })
        })
        .await,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (rss_with, peak_with) = or_panic(rss_mib(rg.pid()));
    let (mut after, mut own_with) = (vec![], vec![]);
    for svc in ["b3", "b4"] {
        after.push(or_panic(admission_seconds(&client, &calm, svc).await));
        own_with.push(or_panic(decided_seconds(&rg, svc).await));
    }
    for i in 0..HOSTILE {
        let name = format!("huge-{i}");
        or_panic(
            rs_api(&client, &hostile_ns)
                .delete(&name, &Default::default())
                .await
                .map(|_| ())
                .map_err(anyhow::Error::from),
        );
    }
    or_panic(
        wait_for("the huge RayClusters gone", T, || async {
            let n = clusters(&client, &hostile_ns).await?.len();
            Ok(if n == 0 {
                Check::Done(())
            } else {
                Check::NotYet(format!("{n} RayClusters"))
            })
        })
        .await,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (rss_after, peak) = or_panic(rss_mib(rg.pid()));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (base, then) = (mean(&baseline), mean(&after));
    eprintln!(
        "figures: RSS {rss_before:.0} MiB before, {rss_with:.0} MiB with {HOSTILE} x {GROUPS} \
         groups (peak {peak_with:.0}), {rss_after:.0} MiB after deletion (peak {peak:.0}); \
         other tenant's admission {baseline:.2?} s before, {after:.2?} s with them \
         (raygate's own part, change received -> decided: {own_before:.2?} s, {own_with:.2?} s)"
    );
    assert!(
        rss_with <= BUDGET_MIB && peak <= BUDGET_MIB,
        "memory over {BUDGET_MIB} MiB: {rss_with:.0} with them, peak {peak:.0}"
    );
    assert!(
        rss_after <= rss_before + KEPT_MIB,
        "memory not given back: {rss_before:.0} MiB before, {rss_after:.0} after deletion"
    );
    // What raygate itself spends on another tenant's change must not grow with the hostile
    // object (it grew 4-5x before the bounds). The debounce alone is 0.2 s: a floor of 0.5 s
    // keeps scheduling noise on a loaded CI machine from reading as a slowdown.
    let (own_base, own_then) = (mean(&own_before), mean(&own_with));
    assert!(
        own_then <= 2.0 * own_base.max(0.5),
        "raygate's part of another tenant's admission went from {own_base:.2} s to {own_then:.2} s"
    );
    // End to end, the apiserver's time is in it too, and KubeRay rewriting the hostile
    // 850 KB objects beside the other suites loads the apiserver (seen: 0.40 -> 1.16 s while
    // raygate's own part stayed 0.20 -> 0.24 s): a looser bound for the whole.
    assert!(
        then <= 2.0 * base.max(0.5) + 2.0,
        "another tenant's admission went from {base:.2} s to {then:.2} s"
    );
    assert!(!rg.logs().contains("panicked"), "{}", rg.logs());
}

async fn admissions(client: &Client, ns: &str, plan: &str) -> Result<usize> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let l = api.list(&ListParams::default()).await?;
    Ok(l.items
        .iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("UpgradePlan")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(plan)
                && e.reason.as_deref() == Some("Admitted")
        })
        .count())
}

/// The apiserver, then etcd, restarted while one upgrade is held and one is under way,
/// then etcd's history compacted and the apiserver restarted again (watches get 410 Gone):
/// raygate's watches break and relist; no hold is lost, nothing is admitted twice, no
/// third cluster appears, and what changed meanwhile is seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_and_etcd_restarts_mid_upgrade_lose_no_hold_and_admit_nothing_twice() {
    let (cp, client) = control_plane(Options::from_env().expect("options")).await;
    let mut rg = Raygate::spawn(&cp, &[]).unwrap_or_else(|e| panic!("{e:#}"));
    let u = or_panic(start_upgrades(&client).await);
    let before = or_panic(admissions(&client, &u.ns, ADMITTED).await);
    for component in ["kube-apiserver", "etcd"] {
        or_panic(
            cp.restart(component)
                .with_context(|| format!("restart {component}")),
        );
        // Let raygate notice and relist before the next fault.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let held = or_panic(get(&plan_api(&client, &u.ns), HELD).await);
        assert_eq!(
            phase(&held),
            "WaitingForCapacity",
            "after restarting {component}"
        );
    }
    // History compacted, then the apiserver restarted with a fresh watch cache: watches
    // resuming from their old resourceVersion get 410 Gone and must relist. A plan created
    // meanwhile must still be seen.
    let revision = or_panic(etcd_compact(&cp));
    or_panic(orphan_plan(&client, &u.ns, "after-compaction").await);
    or_panic(
        cp.restart("kube-apiserver")
            .context("restart the apiserver"),
    );
    eprintln!("etcd compacted at revision {revision}, apiserver restarted");
    or_panic(wait_phase(&client, &u.ns, "after-compaction", "Error").await);
    // The admission's revision is compacted now: the recount falls back to the present.
    let fit = or_panic(recount_admission(&client, &u.ns, ADMITTED, &u.admission_rv).await);
    eprintln!("after the compaction: {fit}");
    // The 410 itself, as raygate saw it: a watch error with Gone / too old resource
    // version, after which kube's watcher relists.
    let gone = rg
        .logs()
        .lines()
        .filter(|l| l.contains("watch error"))
        .filter(|l| {
            l.contains("410") || l.contains("too old resource version") || l.contains("Expired")
        })
        .count();
    assert!(
        gone > 0,
        "no watch saw 410 Gone after the compaction:\n{}",
        rg.logs()
    );
    eprintln!("{gone} watch errors with 410 Gone; raygate relisted");
    or_panic(check_upgrades_survived(&client, &u).await);
    assert_eq!(
        or_panic(admissions(&client, &u.ns, ADMITTED).await),
        before,
        "no second admission"
    );
    assert!(rg.is_running(), "raygate survived:\n{}", rg.logs());
    assert!(!rg.logs().contains("panicked"), "{}", rg.logs());
}

/// A leader frozen (SIGSTOP) past its Lease while a second replica takes over, then
/// resumed: the second one carries the upgrades on; the old one, once resumed, writes
/// nothing (its fence has expired) and stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_frozen_past_its_lease_writes_nothing_after_the_takeover() {
    let (cp, client) = control_plane(Options::from_env().expect("options")).await;
    let a = Replica::new(&cp, "replica-a", None);
    let b = Replica::new(&cp, "replica-b", None);
    let mut ra = a.spawn(&cp);
    or_panic(wait_holder(&client, a.id, T).await);
    let _rb = b.spawn(&cp);
    let u = or_panic(start_upgrades(&client).await);

    or_panic(ra.signal("STOP"));
    or_panic(wait_holder(&client, b.id, T).await);
    // While A sleeps, work arrives that A would act on: a new plan.
    or_panic(orphan_plan(&client, &u.ns, "while-frozen").await);
    or_panic(wait_phase(&client, &u.ns, "while-frozen", "Error").await);
    or_panic(ra.signal("CONT"));
    assert_lost_leadership(&mut ra, Duration::from_secs(3 * LEASE_SECONDS), "resumed");
    or_panic(check_upgrades_survived(&client, &u).await);
    assert!(
        or_panic(admissions(&client, &u.ns, ADMITTED).await) <= 1,
        "admitted once"
    );
    let took_over = takeover_at(&cp, &b.user);
    let late = writes_after(&cp, &a.user, took_over);
    assert!(
        late.is_empty(),
        "writes by the stale leader after the takeover:\n{}",
        show(&late)
    );
}

// ---------------------------------------------------------------------------------------
// Hostile clients of raygate's own endpoints.

/// `/metrics` with `--metrics-secure` (the default in a deployment): HTTPS only, with the
/// certificate of `--metrics-cert-dir` (verified against its CA) or, without one, a
/// self-signed one; raygate, running as a ServiceAccount with exactly config/rbac's
/// ClusterRole, checks each bearer token with the real apiserver (TokenReview,
/// SubjectAccessReview): a token bound to the shipped metrics-reader role gets 200,
/// another valid token 403, none or a forged one 401; plain HTTP gets no answer; the
/// probes stay open, plain HTTP, on their own port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_only_tokens_allowed_to_get_metrics() {
    let cp = ControlPlane::start_with(Options::without_kuberay())
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    cp.install_crd_file(&repo_root().join("crds/raygate.io_upgradeplans.yaml"))
        .expect("install the UpgradePlan CRD");
    let kubectl = |args: &[&str]| cp.kubectl_ok(args).unwrap_or_else(|e| panic!("{e:#}"));
    for f in [
        "config/rbac/role.yaml",
        "config/rbac/metrics_reader_role.yaml",
    ] {
        kubectl(&["apply", "-f", &repo_root().join(f).to_string_lossy()]);
    }
    let raygate_kc = or_panic(service_account_kubeconfig(
        &cp,
        "default",
        "raygate",
        Some("raygate"),
        None,
    ));
    let cert_dir = cp.log_dir().join("metrics-tls");
    let ca = or_panic(metrics_certificates(&cert_dir));
    let cert_arg = format!("--metrics-cert-dir={}", cert_dir.display());
    let mut rg = Raygate::spawn_with(
        &cp,
        &Spawn {
            kubeconfig: Some(&raygate_kc),
            env: &[],
            args: &["--metrics-secure=true", &cert_arg],
            ..Spawn::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(rg.metrics_https(), "{}", rg.logs());
    kubectl(&["create", "serviceaccount", "prometheus", "-n", "default"]);
    kubectl(&[
        "create",
        "clusterrolebinding",
        "prometheus-reads-raygate",
        "--clusterrole",
        "raygate-metrics-reader",
        "--serviceaccount",
        "default:prometheus",
    ]);
    kubectl(&["create", "serviceaccount", "tenant", "-n", "default"]);
    let token = |sa: &str| kubectl(&["create", "token", sa, "-n", "default", "--duration=1h"]);
    let (allowed, other) = (token("prometheus"), token("tenant"));

    // Verified against the CA: the mounted certificate is the one served.
    let code = |t: Option<&str>| {
        rg.get_https("/metrics", t, Some(&ca))
            .unwrap_or_else(|e| panic!("GET /metrics: {e:#}"))
    };
    let (c, body) = code(Some(&allowed));
    assert_eq!(c, 200, "metrics-reader token: {body}");
    assert!(body.contains("raygate_build_info"), "{body}");
    let plain = rg.get_plain("/metrics", Some(&allowed));
    assert!(plain.is_err(), "plain HTTP must get no answer: {plain:?}");
    let (c, body) = code(Some(&other));
    assert_eq!(c, 403, "a valid token without the role: {body}");
    assert!(
        body.contains("system:serviceaccount:default:tenant"),
        "{body}"
    );
    assert_eq!(code(None).0, 401, "no token");
    assert_eq!(code(Some("forged.token.value")).0, 401, "a forged token");
    // The admin (system:masters) may read everything, /metrics included.
    let admin =
        std::fs::read_to_string(cp.kubeconfig_path().with_file_name("token")).expect("admin token");
    assert_eq!(code(Some(admin.trim())).0, 200, "system:masters");
    assert_eq!(rg.get("/healthz").expect("healthz").0, 200);
    assert_eq!(rg.get("/readyz").expect("readyz").0, 200);

    // Without a certificate directory: a self-signed certificate, said in the log; a
    // verifying client refuses it, one that skips verification (the ServiceMonitor's
    // insecureSkipVerify) is served.
    let self_signed = Raygate::spawn_with(
        &cp,
        &Spawn {
            kubeconfig: Some(&raygate_kc),
            env: &[],
            args: &["--metrics-secure=true"],
            ..Spawn::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        self_signed
            .logs()
            .contains("generated a self-signed certificate for /metrics"),
        "{}",
        self_signed.logs()
    );
    assert!(
        self_signed
            .get_https("/metrics", Some(&allowed), Some(&ca))
            .is_err()
    );
    assert_eq!(
        or_panic(self_signed.get_https("/metrics", Some(&allowed), None)).0,
        200
    );
    assert_eq!(
        or_panic(self_signed.get_https("/metrics", None, None)).0,
        401
    );
    assert!(self_signed.get_plain("/metrics", None).is_err());
    drop(self_signed);
    // The same ClusterRole (patch, no update) suffices for the finalizer and the status.
    let client = cp.client().await.expect("client");
    let ns = or_panic(create_namespace(&client, "rbac").await);
    or_panic(orphan_plan(&client, &ns, "p").await);
    let p = or_panic(wait_phase(&client, &ns, "p", "Error").await);
    assert!(
        p["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == "raygate.io/release-gate")),
        "finalizer added: {p}"
    );
    plan_api(&client, &ns)
        .delete("p", &kube::api::DeleteParams::default())
        .await
        .expect("delete the plan");
    or_panic(
        wait_for("the plan to go (finalizer removed)", T, || async {
            Ok(match plan_api(&client, &ns).get_opt("p").await? {
                None => Check::Done(()),
                Some(_) => Check::NotYet("still there".into()),
            })
        })
        .await,
    );
    assert!(rg.is_running(), "{}", rg.logs());
    let logs = rg.logs();
    assert!(
        !logs.contains("forbidden") && !logs.contains("Forbidden"),
        "config/rbac is enough for raygate:\n{logs}"
    );
}

/// Another field manager forces the gate open (`kubectl apply --server-side
/// --force-conflicts`, a GitOps tool) on the held upgrade while the admitted one is under
/// way: raygate reports it (GateOverridden, naming the manager) instead of fighting, and the
/// admitted upgrade still completes with one cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_field_manager_forcing_the_gate_is_reported_and_the_rest_completes() {
    let (cp, client) = control_plane(Options::from_env().expect("options")).await;
    let rg = Raygate::spawn(&cp, &[]).unwrap_or_else(|e| panic!("{e:#}"));
    let u = or_panic(start_upgrades(&client).await);
    let force = json!({"apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": HELD}, "spec": {"upgradeStrategy": {"type": "NewCluster"}}});
    rs_api(&client, &u.ns)
        .patch(
            HELD,
            &PatchParams::apply("gitops-sync").force(),
            &Patch::Apply(&force),
        )
        .await
        .expect("forced apply");
    let api = plan_api(&client, &u.ns);
    let cond = or_panic(
        wait_for("GateOverridden on the held plan", T, || async {
            let p = get(&api, HELD).await?;
            let c = p["status"]["conditions"]
                .as_array()
                .and_then(|cs| {
                    cs.iter()
                        .find(|c| c["type"] == "GateOverridden" && c["status"] == "True")
                })
                .cloned();
            Ok(match c {
                Some(c) => Check::Done(c),
                None => Check::NotYet(describe(&p)),
            })
        })
        .await,
    );
    assert!(
        str_at(&cond, &["message"]).contains("gitops-sync"),
        "names the manager: {cond}"
    );
    // raygate does not take the field back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(or_panic(gate(&client, &u.ns, HELD).await), "NewCluster");
    let rcs = rc_api(&client, &u.ns);
    for c in of(ADMITTED, &or_panic(clusters(&client, &u.ns).await)) {
        or_panic(annotate(&rcs, &c, Some("RUNNING")).await);
    }
    or_panic(annotate(&rs_api(&client, &u.ns), ADMITTED, None).await);
    or_panic(wait_phase(&client, &u.ns, ADMITTED, "Completed").await);
    assert!(
        or_panic(admissions(&client, &u.ns, ADMITTED).await) <= 1,
        "admitted once"
    );
    assert!(!rg.logs().contains("panicked"), "{}", rg.logs());
}

/// A DRA driver's slice of `node`'s pool: `devices` named `gpu-<i>`, generation `generation`
/// of `count` slices.
/// What the DRA scenarios must never see, checked every 250 ms while `until` runs: a third
/// cluster, or (unless `capacity_removed`) an Unschedulable pod of a cluster raygate admitted
/// (admission on devices the scheduler does not have). Returns `until`'s value.
async fn dra_invariants<F, T>(
    client: &Client,
    ns: &str,
    svc: &str,
    capacity_removed: bool,
    until: F,
) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    let check = async {
        loop {
            let cs = of(svc, &clusters(client, ns).await?);
            ensure!(cs.len() <= 2, "a third cluster: {cs:?}");
            let p = get(&plan_api(client, ns), svc).await?;
            let s = get(&rs_api(client, ns), svc).await?;
            let pending = str_at(&s, &["status", "pendingServiceStatus", "rayClusterName"]);
            if !capacity_removed
                && !pending.is_empty()
                && matches!(phase(&p), "Admitted" | "Upgrading" | "Stalled")
            {
                let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
                let lp = ListParams::default().labels(&format!("ray.io/cluster={pending}"));
                for pod in pods.list(&lp).await?.items {
                    let stuck = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .into_iter()
                        .flatten()
                        .any(|c| {
                            c.type_ == "PodScheduled"
                                && c.reason.as_deref() == Some("Unschedulable")
                        });
                    ensure!(
                        !stuck,
                        "pod {:?} of admitted cluster {pending} Unschedulable: {}",
                        pod.metadata.name,
                        describe(&p)
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        #[allow(unreachable_code)]
        Ok::<(), anyhow::Error>(())
    };
    tokio::select! {
        r = check => { r?; bail!("the invariant check ended") }
        r = until => r,
    }
}

/// DRA faults (issue 36), with the real kube-scheduler allocating devices from
/// ResourceSlices the test publishes as a driver would (DeviceClass `gpu` maps
/// `nvidia.com/gpu` to them):
///
/// - the driver republishes node `dra-0`'s pool under generation 2 (16 devices in two
///   slices) while an upgrade is held for lack of devices: while only the first new slice
///   is there (the old generation's slice still present, the new one incomplete) the
///   upgrade stays held; once the new generation is complete it is admitted and the
///   scheduler places the new pods on it;
/// - the pool's slices deleted after the next upgrade was admitted (the driver's plugin
///   gone) and the new worker's pod recreated (not yet bound): it cannot be scheduled,
///   raygate reports the stall (`Unschedulable`), keeps the gate, and once the driver
///   publishes again the pod is placed and the upgrade completes;
/// - the DeviceClass edited so fewer devices match (those the running worker holds among
///   them): the next upgrade is held though the pool has devices free, and admitted when
///   the class matches them again;
/// - a claim left allocated by a deleted pod while kube-controller-manager (its
///   resourceclaim controller) is stopped: its devices count as used, as the scheduler
///   counts them, until the controller is back and releases them.
///
/// Throughout: never a third cluster, and no Unschedulable pod of an admitted cluster
/// except after the slice deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_pools_republished_or_withdrawn_admit_nothing_the_scheduler_cannot_place() {
    let t0 = Instant::now();
    let (cp, client) = control_plane(Options::from_env().expect("options")).await;
    let _rg = Raygate::spawn(&cp, &[]).unwrap_or_else(|e| panic!("{e:#}"));
    let ns = or_panic(create_namespace(&client, "dra").await);
    add_node(&client, "dra-0", 0).await;
    let slices = dra::slices_api(&client);
    let classes = dra::classes_api(&client);
    or_panic(create(&classes, dra::gpu_class(dra::EVERY_DEVICE)).await);
    or_panic(create(&slices, dra::slice("dra-0-g1", "dra-0", 1, 1, 0..8)).await);
    or_panic(create(&plan_api(&client, &ns), plan("llm", "llm")).await);
    or_panic(
        create(
            &rs_api(&client, &ns),
            ray_service("llm", "rayproject/ray:2.9.0-gpu", 1, 6),
        )
        .await,
    );
    or_panic(wait_phase(&client, &ns, "llm", "Idle").await);

    // Republished under generation 2 during a held upgrade.
    or_panic(bump_worker(&client, &ns, "llm", "rayproject/ray:2.10.0-gpu").await);
    let held = or_panic(wait_phase(&client, &ns, "llm", "WaitingForCapacity").await);
    eprintln!("held: {}", describe(&held));
    or_panic(create(&slices, dra::slice("dra-0-g2-a", "dra-0", 2, 2, 0..8)).await);
    or_panic(
        dra_invariants(&client, &ns, "llm", false, async {
            // Both generations present, the new one incomplete: still held.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let p = get(&plan_api(&client, &ns), "llm").await?;
            ensure!(
                phase(&p) == "WaitingForCapacity",
                "admitted on an incomplete pool generation: {}",
                describe(&p)
            );
            ensure!(gate(&client, &ns, "llm").await? == "None");
            // Said as what it is, not as a resource name no node offers.
            let msg = str_at(&p, &["status", "message"]);
            ensure!(
                msg.contains("republishing its pool on node dra-0")
                    && !msg.contains("check the name"),
                "the hold's message does not say the pool is being republished: {msg}"
            );
            eprintln!("generation 2 incomplete: {}", describe(&p));
            create(&slices, dra::slice("dra-0-g2-b", "dra-0", 2, 2, 8..16)).await?;
            let done = wait_phase(&client, &ns, "llm", "Completed").await?;
            // The driver's clean-up of the old generation.
            slices.delete("dra-0-g1", &Default::default()).await?;
            Ok(done)
        })
        .await,
    );
    eprintln!(
        "republished pool: admitted on generation 2 and completed at {:?}",
        t0.elapsed()
    );

    // The slices withdrawn after the next upgrade was admitted.
    or_panic(bump_worker(&client, &ns, "llm", "rayproject/ray:2.11.0-gpu").await);
    let admitted = or_panic(
        wait_for("the next upgrade admitted", T, || async {
            let p = get(&plan_api(&client, &ns), "llm").await?;
            Ok(if matches!(phase(&p), "Admitted" | "Upgrading") {
                Check::Done(p)
            } else {
                Check::NotYet(describe(&p))
            })
        })
        .await,
    );
    eprintln!("admitted: {}", describe(&admitted));
    for s in ["dra-0-g2-a", "dra-0-g2-b"] {
        or_panic(
            slices
                .delete(s, &Default::default())
                .await
                .map(|_| ())
                .map_err(Into::into),
        );
    }
    // The new cluster's worker pod recreated (evicted, or not bound yet): nothing to place
    // it on.
    let pending = or_panic(
        wait_for("the pending cluster's worker pod", T, || async {
            let s = get(&rs_api(&client, &ns), "llm").await?;
            let c = str_at(&s, &["status", "pendingServiceStatus", "rayClusterName"]).to_string();
            Ok(if c.is_empty() {
                Check::NotYet(String::new())
            } else {
                Check::Done(c)
            })
        })
        .await,
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let workers =
        ListParams::default().labels(&format!("ray.io/cluster={pending},ray.io/node-type=worker"));
    or_panic(
        wait_for("the new worker pod created", T, || async {
            let n = pods.list(&workers).await?.items.len();
            Ok(if n > 0 {
                Check::Done(())
            } else {
                Check::NotYet(n.to_string())
            })
        })
        .await,
    );
    or_panic(
        pods.delete_collection(&Default::default(), &workers)
            .await
            .map(|_| ())
            .map_err(Into::into),
    );
    let stalled = or_panic(
        dra_invariants(
            &client,
            &ns,
            "llm",
            true,
            wait_phase(&client, &ns, "llm", "Stalled"),
        )
        .await,
    );
    eprintln!("slices withdrawn: {}", describe(&stalled));
    assert_eq!(
        str_at(&stalled, &["status", "waitingFor"]),
        "Unschedulable",
        "{}",
        describe(&stalled)
    );
    assert!(or_panic(clusters(&client, &ns).await).len() <= 2);
    // The driver publishes again (generation 3): placed, completed.
    or_panic(create(&slices, dra::slice("dra-0-g3", "dra-0", 3, 1, 0..16)).await);
    or_panic(wait_phase(&client, &ns, "llm", "Completed").await);
    assert_eq!(of("llm", &or_panic(clusters(&client, &ns).await)).len(), 1);
    eprintln!(
        "republished after the withdrawal: completed at {:?}",
        t0.elapsed()
    );

    // The DeviceClass edited so only gpu-0..7 match: 6 of them held by the running worker,
    // so the next upgrade (6 more) is held, though the pool has 10 devices free.
    let narrow = |cel: &str| json!({"spec": {"selectors": [{"cel": {"expression": cel}}]}});
    let (all, low) = (dra::EVERY_DEVICE, dra::LOW_DEVICES);
    or_panic(
        classes
            .patch("gpu", &PatchParams::default(), &Patch::Merge(&narrow(low)))
            .await
            .map(|_| ())
            .map_err(Into::into),
    );
    or_panic(bump_worker(&client, &ns, "llm", "rayproject/ray:2.12.0-gpu").await);
    or_panic(
        dra_invariants(&client, &ns, "llm", false, async {
            let p = wait_phase(&client, &ns, "llm", "WaitingForCapacity").await?;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let p2 = get(&plan_api(&client, &ns), "llm").await?;
            ensure!(
                phase(&p2) == "WaitingForCapacity",
                "admitted on devices the class no longer selects: {}",
                describe(&p2)
            );
            eprintln!("DeviceClass narrowed: {}", describe(&p));
            classes
                .patch("gpu", &PatchParams::default(), &Patch::Merge(&narrow(all)))
                .await?;
            wait_phase(&client, &ns, "llm", "Completed").await
        })
        .await,
    );
    eprintln!("DeviceClass widened: completed at {:?}", t0.elapsed());

    // A claim left allocated by a deleted pod while the resourceclaim controller is off
    // (kube-controller-manager stopped): its devices stay in use for the scheduler, and
    // for raygate. 10 devices free, a batch pod takes 6, then is deleted: 4 stay free.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let batch: Pod = serde_json::from_value(json!({"metadata": {"name": "batch"},
        "spec": {"containers": [{"name": "c", "image": "batch",
            "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "6"},
                          "limits": {"nvidia.com/gpu": "6"}}}]}}))
    .expect("pod");
    or_panic(
        pods.create(&PostParams::default(), &batch)
            .await
            .map(|_| ())
            .map_err(Into::into),
    );
    or_panic(
        wait_for("the batch pod bound", T, || async {
            let p = pods.get("batch").await?;
            let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
            Ok(if node.is_empty() {
                Check::NotYet(String::new())
            } else {
                Check::Done(())
            })
        })
        .await,
    );
    or_panic(cp.stop("kube-controller-manager"));
    or_panic(
        pods.delete("batch", &Default::default())
            .await
            .map(|_| ())
            .map_err(Into::into),
    );
    or_panic(
        wait_for("the batch pod gone", T, || async {
            Ok(match pods.get_opt("batch").await? {
                None => Check::Done(()),
                Some(_) => Check::NotYet(String::new()),
            })
        })
        .await,
    );
    let claims = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceClaim"),
            "resourceclaims",
        ),
    );
    let left: Vec<String> = or_panic(
        claims
            .list(&ListParams::default())
            .await
            .map_err(Into::into),
    )
    .items
    .into_iter()
    .filter(|c| {
        let v = serde_json::to_value(c).unwrap_or_default();
        !v["status"]["allocation"].is_null()
            && v["status"]["reservedFor"]
                .as_array()
                .is_some_and(|r| r.iter().any(|x| x["name"] == "batch"))
    })
    .filter_map(|c| c.metadata.name)
    .collect();
    eprintln!("claims left allocated by the deleted pod: {left:?}");
    assert!(!left.is_empty(), "the batch pod's claim stays allocated");
    or_panic(bump_worker(&client, &ns, "llm", "rayproject/ray:2.13.0-gpu").await);
    or_panic(
        dra_invariants(&client, &ns, "llm", false, async {
            let p = wait_phase(&client, &ns, "llm", "WaitingForCapacity").await?;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let p2 = get(&plan_api(&client, &ns), "llm").await?;
            ensure!(
                phase(&p2) == "WaitingForCapacity",
                "admitted on devices a deleted pod's claim still holds: {}",
                describe(&p2)
            );
            eprintln!("a deleted pod's claim still allocated: {}", describe(&p));
            // The controller back: it releases the claim, and the upgrade goes ahead.
            cp.restart("kube-controller-manager")?;
            wait_phase(&client, &ns, "llm", "Completed").await
        })
        .await,
    );
    eprintln!("DRA faults done in {:?}", t0.elapsed());
}
