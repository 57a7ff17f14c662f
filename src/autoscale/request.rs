//! A plan's capacity request as part of its decision. Pure: from what the
//! controller observed ([`Facts`]: the other plans waiting with a request,
//! the plans that have objects now, this plan's buffers, its last apply
//! error), [`settle`] picks the plan's slot in the request queue under the
//! cap ([`super::queue`]), builds the objects an open slot wants
//! ([`super::shapes`]), completes the status ([`super::report`]) and says
//! what the plan's objects should be ([`Wanted`]).
//!
//! The controller (`controller::buffers`) reserves the slot under one lock
//! (two plans reconciled at once must not both take the last one) and makes
//! the cluster match [`Wanted`]; it decides nothing.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::LimitRange;

use super::buffer::CapacityBuffer;
use super::queue::{self, PlanKey, Slot};
use super::report;
use super::shapes::{self, Objects, Owner};
use super::{Defaults, Request};
use crate::admission::ledger::QueueKey;
use crate::admission::{Decision, Inputs};
use crate::upgradeplan::{CapacityRequestState, Phase};

/// What one decision reads about capacity requests.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// `--capacity-requests` and the defaults of `spec.capacity`.
    pub defaults: Defaults,
    /// The other plans waiting for capacity with a request, as their
    /// recorded status says (the queue the slots follow).
    pub others: Vec<QueueKey>,
    /// The plans that have objects now: in the cache, or reserved by this
    /// process and not in the cache yet. They count against the cap.
    pub open_now: BTreeSet<PlanKey>,
    /// This plan's CapacityBuffers in the cache, of any change.
    pub buffers: Vec<Arc<CapacityBuffer>>,
    /// Why the last apply of this plan's objects failed, if it did.
    pub apply_error: Option<String>,
    /// The LimitRanges of the plan's namespace: the shapes are the pods as
    /// the apiserver admits them.
    pub limit_ranges: Vec<LimitRange>,
}

/// What a decision wants done with the plan's objects.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Wanted {
    /// Keep these (one change's) and no other.
    Open {
        fingerprint: String,
        objects: Vec<Objects>,
    },
    /// None.
    #[default]
    Close,
}

impl Wanted {
    /// The plan takes (or keeps) a request slot.
    pub fn opens(&self) -> bool {
        matches!(self, Wanted::Open { .. })
    }
}

/// Completes `d`, decided on `inp`, with the plan's capacity request
/// ([`report::annotate`]) and says what its objects should be.
pub fn settle(inp: &Inputs<'_>, f: &Facts, d: &mut Decision) -> Wanted {
    let plan = inp.plan;
    let request = super::resolve(plan, &f.defaults).map_err(|e| e.to_string());
    let waiting = d.status.phase == Phase::WaitingForCapacity && d.status.admitted.is_none();
    let fingerprint = d
        .status
        .pending_change
        .as_ref()
        .map(|c| c.fingerprint.clone());
    let mut slot = None;
    let mut objects = None;
    let mut error = f.apply_error.clone();
    if let (true, Ok(Some(r)), Some(fp), true) =
        (waiting, &request, &fingerprint, f.defaults.enabled)
    {
        let priority = inp.settings.as_ref().map(|s| s.priority).unwrap_or(0);
        let me = QueueKey::of(plan, priority, Some(&d.status), inp.now);
        slot = Some(queue::slot_of(
            &me,
            &f.others,
            &f.open_now,
            f.defaults.max_open,
        ));
        if slot == Some(Slot::Open) {
            match build(inp, fp, r, &f.limit_ranges) {
                Ok(o) => objects = Some(o),
                Err(e) => error = Some(e.to_string()),
            }
        }
    }
    let facts = report::Facts {
        enabled: f.defaults.enabled,
        request,
        slot,
        max_open: f.defaults.max_open,
        buffers: f.buffers.iter().map(AsRef::as_ref).collect(),
        error,
    };
    report::annotate(d, plan, &facts, inp.now);
    let state = d.status.capacity_request.as_ref().map(|r| r.state);
    let open = matches!(
        state,
        Some(CapacityRequestState::Requested | CapacityRequestState::NotDelivered)
    );
    // The last apply failed (the CRD missing, a 403) and the plan still has
    // its slot: keep what was applied and try again, without deleting in
    // between. Closing here made the status alternate Failed/Requested and
    // the PodTemplates be applied and deleted on every reconcile, each write
    // waking the plan again: a hot loop for as long as the fault lasted.
    let retrying = state == Some(CapacityRequestState::Failed)
        && objects.is_some()
        && f.apply_error.is_some();
    match (open || retrying, objects, fingerprint) {
        (true, Some(objects), Some(fingerprint)) => Wanted::Open {
            fingerprint,
            objects,
        },
        _ => Wanted::Close,
    }
}

/// The objects of the plan's pending change.
fn build(
    inp: &Inputs<'_>,
    fingerprint: &str,
    r: &Request,
    limit_ranges: &[LimitRange],
) -> crate::Result<Vec<Objects>> {
    let change = inp
        .change
        .as_ref()
        .ok()
        .and_then(|c| c.as_ref())
        .ok_or_else(|| crate::Error::invalid("capacity request", "no pending change"))?;
    let settings = inp
        .settings
        .as_ref()
        .map_err(|e| crate::Error::invalid("capacity request", e.to_string()))?;
    let shapes = shapes::shapes(change.pods_to_fit(), &settings.headroom, limit_ranges)?;
    let (ns, name) = inp.key();
    let uid = inp
        .plan
        .metadata
        .uid
        .as_deref()
        .ok_or_else(|| crate::Error::invalid("capacity request", "the plan has no uid yet"))?;
    Ok(shapes::objects(
        Owner {
            namespace: &ns,
            name: &name,
            uid,
        },
        fingerprint,
        &r.strategy,
        &shapes,
    ))
}
