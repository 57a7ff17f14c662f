//! A seeded random soak with the real Karpenter in the loop (issue 36, item 3), on its own
//! control plane: two RayServices of one 8-GPU worker each, both plans asking for capacity
//! with CapacityBuffers (cap: one open request), and random steps among
//!
//! - a change (a new worker image: a new cluster, so one more node to buy),
//! - the pending change withdrawn (the spec set back to the serving cluster's image),
//! - Karpenter restarted, or stopped for 3-12 s then started again,
//! - raygate killed (-9) and started again,
//! - one of raygate's CapacityBuffers deleted by hand,
//! - nothing for a few seconds,
//!
//! with the invariants of `invariants.rs` sampled every second throughout (nothing bought
//! twice, no request object outliving its plan's wait by more than a sweep, never a third
//! cluster, no gate `None` without a plan, no Unschedulable pod of a cluster raygate admitted).
//! Then every change must end, and nothing of raygate's request objects is left.
//!
//! Before the random steps, raygate is upgraded with a request open: an older build
//! (e2e/build-older-raygate: the end of round 3, the first with capacity requests) opens the
//! request of a change while Karpenter is down, is killed, and this build takes over: the same
//! CapacityBuffers and PodTemplates (names, uids, generations), one node bought once Karpenter
//! is back, admitted, completed, nothing left.
//!
//! `RAYGATE_SOAK_SEED=N` replays a run; `RAYGATE_SOAK_SECONDS` (default 100) bounds the random
//! steps, `RAYGATE_SOAK_MINUTES` overrides it for the long mode (`e2e/soak --minutes N`).
//! At the end it prints one `soak figures:` line (steps, changes, admissions, nodes bought and
//! needed, objects left) for the closing note of a long run.

use super::invariants::SWEEP_PERIOD;
use super::*;
use raygate_e2e::older_raygate;
use raygate_e2e::seeded::{self, Rng};

const SERVICES: usize = 2;
/// Longer than `T`: a change that waited behind the other's request, then for Karpenter.
const SETTLE: Duration = Duration::from_secs(420);

fn svc(i: usize) -> String {
    format!("s{i}")
}

/// What the soak did and saw, for its closing line.
#[derive(Default)]
struct Tally {
    steps: u64,
    changes: u64,
    withdrawals: u64,
    karpenter_restarts: u64,
    raygate_kills: u64,
    buffers_deleted: u64,
    /// Every RayCluster seen, per service: a new name after the first is one admission.
    clusters: BTreeMap<String, BTreeSet<String>>,
    /// Every NodeClaim seen.
    nodeclaims: BTreeSet<String>,
}

impl Env {
    /// raygate's request objects of the plan with `uid`: `kind/name` → (uid, generation).
    async fn request_objects(&self, uid: &str) -> Result<BTreeMap<String, (String, i64)>> {
        let lp = ListParams::default().labels(&format!("raygate.io/plan-uid={uid}"));
        let mut out = BTreeMap::new();
        for b in self.buffers().list(&lp).await?.items {
            out.insert(
                format!(
                    "CapacityBuffer/{}",
                    b.metadata.name.clone().unwrap_or_default()
                ),
                (
                    b.metadata.uid.clone().unwrap_or_default(),
                    b.metadata.generation.unwrap_or_default(),
                ),
            );
        }
        for t in self.templates().list(&lp).await?.items {
            out.insert(
                format!(
                    "PodTemplate/{}",
                    t.metadata.name.clone().unwrap_or_default()
                ),
                (
                    t.metadata.uid.clone().unwrap_or_default(),
                    t.metadata.generation.unwrap_or_default(),
                ),
            );
        }
        Ok(out)
    }

    /// raygate upgraded with a request open (issue 36): the older build opens it, this one
    /// takes it over and sees it through. Returns what it measured.
    async fn upgraded_with_a_request_open(&mut self, tally: &mut Tally) -> Result<String> {
        let older = older_raygate()?;
        let s = svc(0);
        let uid = self.plan_uid(&s).await?;
        if let Some(mut r) = self.rg.take() {
            r.kill();
        }
        self.rg = Some(Raygate::spawn_with(
            &self.cp,
            &Spawn {
                kubeconfig: Some(&self.kubeconfig),
                args: &["--capacity-requests=true", "--max-open-capacity-requests=1"],
                binary: Some(&older),
                ..Spawn::default()
            },
        )?);
        self.cp.stop("karpenter")?;
        tally.changes += 1;
        self.change(&s, "rayproject/ray:2.10.0-gpu", None).await?;
        self.worker_request(&s).await?;
        let before = self.request_objects(&uid).await?;
        anyhow::ensure!(
            before.len() == 4,
            "the older build's request: 2 CapacityBuffers and 2 PodTemplates, got {before:?}"
        );
        let nodes_before = self.nodeclaims().await?;
        if let Some(mut r) = self.rg.take() {
            r.kill();
        }
        let t = Instant::now();
        self.rg = Some(spawn_raygate(&self.cp, &self.kubeconfig)?);
        // This build has reconciled the plan once its own status write lands (the older
        // build never wrote `pendingChange.detectedTime` differently, so wait on the Event
        // stream instead: a resync of every plan happens at start). Give it a few passes.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = self.request_objects(&uid).await?;
        anyhow::ensure!(
            before == after,
            "this build did not keep the older build's objects as they were:\nbefore {before:?}\nafter  {after:?}"
        );
        anyhow::ensure!(
            request_state(&self.plan(&s).await?) == "Requested",
            "the request is not reported open by this build: {}",
            describe(&self.plan(&s).await?)
        );
        self.cp.restart("karpenter")?;
        let mut seen = nodes_before.clone();
        self.until_completed(&s, &mut seen).await?;
        let bought = seen.difference(&nodes_before).count();
        anyhow::ensure!(bought == 1, "one node bought for the change, got {bought}");
        wait_for("the request's objects gone", SWEEP_PERIOD, || async {
            let left = self.request_objects(&uid).await?;
            Ok(if left.is_empty() {
                Check::Done(())
            } else {
                Check::NotYet(format!("{left:?}"))
            })
        })
        .await?;
        Ok(format!(
            "older build {} opened the request; this build kept its {} objects (uids, generations) \
             and completed the change {:?} after taking over, with 1 node bought",
            older.display(),
            after.len(),
            t.elapsed()
        ))
    }

    /// The worker image of the cluster the service serves from now.
    async fn serving_image(&self, svc: &str) -> Result<Option<String>> {
        let rs = serde_json::to_value(self.services().get(svc).await?)?;
        let active = str_at(&rs, &["status", "activeServiceStatus", "rayClusterName"]);
        if active.is_empty() {
            return Ok(None);
        }
        let Some(c) = self.clusters().get_opt(active).await? else {
            return Ok(None);
        };
        let c = serde_json::to_value(c)?;
        Ok(
            c["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .map(str::to_string),
        )
    }

    async fn spec_image(&self, svc: &str) -> Result<String> {
        let rs = serde_json::to_value(self.services().get(svc).await?)?;
        Ok(
            rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]
                [0]["image"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    }

    async fn record(&self, tally: &mut Tally) -> Result<()> {
        for i in 0..SERVICES {
            let s = svc(i);
            let names = self
                .clusters()
                .list(&ListParams::default().labels(&format!("ray.io/originated-from-cr-name={s}")))
                .await?
                .items
                .into_iter()
                .filter_map(|c| c.metadata.name);
            tally.clusters.entry(s).or_default().extend(names);
        }
        tally.nodeclaims.extend(self.nodeclaims().await?);
        Ok(())
    }

    /// One random step; says what it did.
    async fn soak_step(&mut self, rng: &mut Rng, tally: &mut Tally) -> Result<String> {
        let i = rng.below(SERVICES);
        let s = svc(i);
        Ok(match rng.below(10) {
            0..=2 => {
                tally.changes += 1;
                let image = format!("rayproject/ray:2.{}.0-gpu", 10 + tally.changes);
                self.change(&s, &image, None).await?;
                format!("{s}: change to {image}")
            }
            3 | 4 => {
                let serving = self.serving_image(&s).await?;
                match serving {
                    Some(img) if img != self.spec_image(&s).await? => {
                        tally.withdrawals += 1;
                        self.change(&s, &img, None).await?;
                        format!("{s}: change withdrawn (back to {img})")
                    }
                    _ => format!("{s}: nothing to withdraw"),
                }
            }
            5 => {
                tally.karpenter_restarts += 1;
                self.cp.restart("karpenter")?;
                "Karpenter restarted".to_string()
            }
            6 => {
                tally.karpenter_restarts += 1;
                let down = Duration::from_secs(3 + rng.below(10) as u64);
                self.cp.stop("karpenter")?;
                tokio::time::sleep(down).await;
                self.cp.restart("karpenter")?;
                format!("Karpenter down for {down:?}")
            }
            7 => {
                tally.raygate_kills += 1;
                if let Some(mut r) = self.rg.take() {
                    r.kill();
                }
                self.rg = Some(spawn_raygate(&self.cp, &self.kubeconfig)?);
                "raygate killed (-9) and started again".to_string()
            }
            8 => {
                let mine = self.buffers_by_plan().await?;
                let names: Vec<String> = mine.values().flat_map(|b| b.keys().cloned()).collect();
                if names.is_empty() {
                    "no CapacityBuffer of raygate to delete".to_string()
                } else {
                    let pick = &names[rng.below(names.len())];
                    // Gone already (the plan was admitted meanwhile) is fine.
                    let _ = self.buffers().delete(pick, &Default::default()).await;
                    tally.buffers_deleted += 1;
                    format!("CapacityBuffer {pick} deleted by hand")
                }
            }
            _ => {
                tokio::time::sleep(Duration::from_secs(4)).await;
                "nothing for 4 s".to_string()
            }
        })
    }

    /// Every change ends: each plan Idle or Completed with the gate `None`, one cluster, the
    /// spec served; then none of raygate's request objects are left after one sweep.
    async fn soak_settle(&self, tally: &mut Tally) -> Result<()> {
        for i in 0..SERVICES {
            let s = svc(i);
            wait_for(&format!("{s}'s last change to end"), SETTLE, || async {
                let p = self.plan(&s).await?;
                let rs = serde_json::to_value(self.services().get(&s).await?)?;
                let gate = str_at(&rs, &["spec", "upgradeStrategy", "type"]).to_string();
                let served = self.serving_image(&s).await?;
                let clusters = self.cluster_count(&s).await?;
                let done = matches!(phase(&p), "Idle" | "Completed")
                    && gate == "None"
                    && clusters == 1
                    && served.as_deref() == Some(self.spec_image(&s).await?.as_str());
                Ok(if done {
                    Check::Done(())
                } else {
                    Check::NotYet(format!(
                        "gate {gate}, {clusters} clusters, {}",
                        describe(&p)
                    ))
                })
            })
            .await?;
        }
        self.record(tally).await?;
        wait_for("raygate's request objects gone", SWEEP_PERIOD, || async {
            let buffers: usize = self
                .buffers_by_plan()
                .await?
                .values()
                .map(BTreeMap::len)
                .sum();
            let templates = self
                .templates()
                .list(&ListParams::default().labels("app.kubernetes.io/managed-by=raygate"))
                .await?
                .items
                .len();
            Ok(if buffers + templates == 0 {
                Check::Done(())
            } else {
                Check::NotYet(format!(
                    "{buffers} CapacityBuffers, {templates} PodTemplates"
                ))
            })
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_soak_with_karpenter_keeps_every_invariant() {
    let seed = seeded::seed();
    let budget = seeded::budget(100);
    eprintln!("karpenter soak: RAYGATE_SOAK_SEED={seed}, {budget:?} of steps");
    let mut e = or_panic(env().await);
    // Empty nodes go 5 s after their last pod: a withdrawn change's node is given back
    // within the soak, so buying it again later is a new, justified purchase.
    or_panic(e.consolidate_quickly().await);
    let inv = Invariants::start(e.client.clone(), &e.ns);
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let start = Instant::now();
    let result: Result<()> = async {
        for i in 0..SERVICES {
            service_with_plan(&e, &svc(i), 1, 0, json!({"request": "CapacityBuffer"})).await?;
        }
        e.record(&mut tally).await?;
        let said = e.upgraded_with_a_request_open(&mut tally).await?;
        eprintln!("raygate upgraded with a request open: {said}");
        e.record(&mut tally).await?;
        let start = Instant::now();
        while start.elapsed() < budget {
            tally.steps += 1;
            let did = e
                .soak_step(&mut rng, &mut tally)
                .await
                .with_context(|| format!("step {}", tally.steps))?;
            eprintln!(
                "karpenter soak step {} ({:?}): {did}",
                tally.steps,
                start.elapsed()
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
            e.record(&mut tally).await?;
        }
        eprintln!(
            "karpenter soak: {} steps in {:?}; settling",
            tally.steps,
            start.elapsed()
        );
        e.soak_settle(&mut tally).await
    }
    .await;
    let logs = e.raygate().logs();
    if let Err(err) = result {
        panic!(
            "karpenter soak failed; replay with RAYGATE_SOAK_SEED={seed}: {err:#}\nraygate's log:\n{}",
            logs.lines().rev().take(60).collect::<Vec<_>>().join("\n")
        );
    }
    assert!(!logs.contains("panicked"), "raygate panicked:\n{logs}");
    let admissions: usize = tally
        .clusters
        .values()
        .map(|c| c.len().saturating_sub(1))
        .sum();
    let (peak, samples) = inv.peak();
    eprintln!(
        "soak figures: seed {seed}, {} steps in {:?}, {} changes, {} withdrawn, {admissions} admitted \
         (new clusters), {} Karpenter restarts/outages, {} raygate kills, {} buffers deleted by hand; \
         {} NodeClaims bought for {} clusters ({SERVICES} first + {admissions} new), peak {peak} live; \
         {samples} invariant samples, empty nodes unconsolidated for at most {} s; request objects \
         left: 0",
        tally.steps,
        start.elapsed(),
        tally.changes,
        tally.withdrawals,
        tally.karpenter_restarts,
        tally.raygate_kills,
        tally.buffers_deleted,
        tally.nodeclaims.len(),
        SERVICES + admissions,
        inv.longest_excess_s(),
    );
    inv.assert_clean("karpenter soak");
    inv.stop().await;
}
