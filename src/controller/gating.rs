//! The gate's writes from the loop: set after the status, remembered until
//! the cache shows them, given back when no plan governs its RayService.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, info, warn};

use super::record::Recorded;
use super::{Context, cache, gate, govern, guarded, in_scope, latency};
use crate::Result;
use crate::admission;
use crate::sync::lock;
use crate::upgradeplan::{PlanKey, UpgradePlan};

/// The gates raygate wrote, per plan: the RayService's uid, the value, and
/// the RayService's `resourceVersion` in the cache when it was written. A
/// reconcile that runs before the watch delivers the write (the plan's own
/// status write wakes it at once) sees the old value in the cache; while
/// the cache still shows that same version, nothing has been observed since
/// the write, and applying it again would be a request for nothing.
#[derive(Default)]
pub(super) struct GatesWritten(HashMap<PlanKey, (String, &'static str, String, Timestamp)>);

impl GatesWritten {
    /// Entries older than this are dropped (a plan deleted meanwhile).
    const KEEP: Duration = Duration::from_secs(600);

    fn unseen(&self, key: &PlanKey, uid: &str, gate: &str, cached: &str) -> bool {
        self.0
            .get(key)
            .is_some_and(|(u, g, rv, _)| u == uid && *g == gate && rv == cached)
    }

    fn written(
        &mut self,
        key: PlanKey,
        uid: &str,
        gate: &'static str,
        cached: String,
        now: Timestamp,
    ) {
        self.0
            .retain(|_, w| now.duration_since(w.3).as_secs_f64() < Self::KEEP.as_secs_f64());
        self.0.insert(key, (uid.to_string(), gate, cached, now));
    }
}

/// Gives back the gate of the RayService `plan` governs, unless another plan
/// governs that RayService now; the RayService given back, if any.
pub(super) async fn give_back_gate(
    ctx: &Context,
    plans: &[Arc<UpgradePlan>],
    plan: &UpgradePlan,
) -> Result<Option<String>> {
    let Some(name) = govern::gate_to_release(plans, plan) else {
        return Ok(None);
    };
    release_gate(ctx, &plan.namespace().unwrap_or_default(), &name).await?;
    Ok(Some(name))
}

/// Give back the gate of `ns/name`. Only the RayService in the cache is
/// patched, by its uid: an apply would create a missing one.
async fn release_gate(ctx: &Context, ns: &str, name: &str) -> Result<()> {
    let Some(uid) = ctx
        .stores
        .services
        .get(&ObjectRef::new(name).within(ns))
        .and_then(|s| cache::guard_meta(&s).uid.clone())
    else {
        return Ok(());
    };
    let services: gate::Services = Api::namespaced(ctx.client.clone(), ns);
    let target = gate::Target { name, uid: &uid };
    match guarded(
        &ctx.fence,
        "giving back the gate",
        gate::release(&services, target),
    )
    .await?
    {
        Ok(()) => {
            info!(namespace = %ns, rayservice = %name, "gate released");
            Ok(())
        }
        // Gone: nothing is gated any more.
        Err(e) if gate::is_gone(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Gates raygate still holds on RayServices that no plan governs any more
/// (a plan deleted after its finalizer was removed by hand, a reference
/// edited while raygate was down) are given back.
pub(super) async fn sweep_orphans(ctx: &Context) {
    let plans = ctx.stores.plans.state();
    for svc in ctx.stores.services.state() {
        let meta = cache::guard_meta(&svc);
        let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
            continue;
        };
        let owned = gate::owned_by_us(meta.managed_fields.as_deref().unwrap_or(&[]));
        if !owned || !in_scope(&ctx.settings, Some(ns)) || govern::governed(&plans, ns, name) {
            continue;
        }
        warn!(namespace = %ns, rayservice = %name, "no UpgradePlan governs this RayService; giving its gate back");
        if let Err(e) = release_gate(ctx, ns, name).await {
            warn!(namespace = %ns, rayservice = %name, error = %e, "giving back an orphaned gate");
        }
    }
}

/// Writes the gate decided, unless another manager overrides it or it is
/// already set by raygate; the requeue interval, shortened when the apply
/// finds a new owner.
pub(super) async fn set_gate(ctx: &Context, r: &Recorded) -> Result<Duration> {
    let d = &r.decision;
    let Some(gate) = d.gate.filter(|_| d.overridden_by.is_none()) else {
        return Ok(d.requeue);
    };
    let (ns, name) = (r.plan.namespace().unwrap_or_default(), r.plan.name_any());
    let key = PlanKey::new(ns.clone(), name.clone());
    if gate.is_set(r.seen.gate.value.as_ref()) && r.seen.gate.owned_by_us {
        return Ok(d.requeue);
    }
    let service = r.plan.spec.ray_service_ref.name.as_str();
    // Only the RayService the decision read: never a create.
    let Some(uid) = r.seen.gate.uid.as_deref() else {
        return Ok(d.requeue);
    };
    let cached = ctx
        .stores
        .services
        .get(&ObjectRef::new(service).within(&ns))
        .and_then(|s| cache::guard_meta(&s).resource_version.clone());
    if let Some(rv) = &cached
        && lock(&ctx.gates_written).unseen(&key, uid, gate.strategy(), rv)
    {
        debug!(plan = %name, rayservice = %service, gate = gate.strategy(),
               "gate written, not in the cache yet: not written again");
        return Ok(d.requeue);
    }
    let services: gate::Services = Api::namespaced(ctx.client.clone(), &ns);
    let target = gate::Target { name: service, uid };
    match guarded(
        &ctx.fence,
        "setting the gate",
        gate::apply(&services, target, gate),
    )
    .await?
    {
        Ok(()) => {
            let at = Timestamp::now();
            if let Some(rv) = cached {
                lock(&ctx.gates_written).written(key.clone(), uid, gate.strategy(), rv, at);
            }
            let timed = matches!(
                gate,
                admission::Gate::Open | admission::Gate::OpenIncremental
            )
            .then(|| ctx.causes.admitted(&key, at))
            .flatten();
            match timed {
                Some(t) => {
                    ctx.metrics
                        .admission_latency(t.cause.kind.as_str(), t.seconds);
                    let after = |x| latency::ms_after(t.cause.at, x);
                    info!(plan = %name, rayservice = %service, gate = gate.strategy(),
                          stage = "gate written", cause = t.cause.kind.as_str(), cause_object = %t.cause.object,
                          cause_at = %t.cause.at, latency_ms = (t.seconds * 1e3) as i64,
                          queued_ms = after(t.stages.queued), started_ms = after(t.stages.started),
                          pass_ms = after(t.stages.pass), decided_ms = after(t.stages.decided),
                          status_ms = after(t.stages.status), "gate set");
                }
                None => {
                    info!(plan = %name, rayservice = %service, gate = gate.strategy(), stage = "gate written", "gate set");
                }
            }
            Ok(d.requeue)
        }
        Err(e) if gate::is_gone(&e) => {
            // Deleted (or replaced) since the cache saw it: decide again
            // shortly, on what the cache shows then.
            info!(plan = %name, rayservice = %service, "RayService gone before the gate was set; not creating it");
            Ok(Duration::from_secs(2))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            // Taken over since our cache saw it: look again shortly, when
            // the cache shows the new owner and the override is reported.
            warn!(plan = %name, rayservice = %service, message = %e.message, "gate field owned by another manager");
            Ok(Duration::from_secs(2))
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> PlanKey {
        PlanKey::new("ns", n)
    }

    #[test]
    fn a_gate_written_is_not_written_again_until_the_cache_moves() {
        let now = Timestamp::now();
        let mut w = GatesWritten::default();
        assert!(!w.unseen(&key("a"), "uid-1", "NewCluster", "10"));
        w.written(key("a"), "uid-1", "NewCluster", "10".into(), now);
        // The cache still shows the version the write was made on.
        assert!(w.unseen(&key("a"), "uid-1", "NewCluster", "10"));
        // Anything observed since (our write, or someone else's): decide on it.
        assert!(!w.unseen(&key("a"), "uid-1", "NewCluster", "11"));
        // Another value, another RayService, another plan: written.
        assert!(!w.unseen(&key("a"), "uid-1", "None", "10"));
        assert!(!w.unseen(&key("a"), "uid-2", "NewCluster", "10"));
        assert!(!w.unseen(&key("b"), "uid-1", "NewCluster", "10"));
    }

    #[test]
    fn gates_written_are_forgotten_after_a_while() {
        let now = Timestamp::now();
        let mut w = GatesWritten::default();
        w.written(key("a"), "uid-1", "NewCluster", "10".into(), now);
        let later = now + GatesWritten::KEEP + Duration::from_secs(1);
        w.written(key("b"), "uid-2", "NewCluster", "7".into(), later);
        assert_eq!(w.0.len(), 1);
        assert!(w.unseen(&key("b"), "uid-2", "NewCluster", "7"));
    }
}
