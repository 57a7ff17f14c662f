//! What a plan says about its capacity request: `status.capacityRequest`, the
//! `CapacityRequested` condition, the `Waiting For` column and the Events.
//! Pure: it completes a [`Decision`] from what was observed.
//!
//! The request never changes the decision itself: a plan waiting for
//! capacity is admitted when its new cluster fits on Ready nodes, whatever
//! the buffers' conditions say (Karpenter's `Provisioning=True` means "fits
//! existing capacity", cluster-autoscaler's only "processed").

use std::time::Duration;

use jiff::Timestamp;

use super::Request;
use super::buffer::{CapacityBuffer, PROVISIONING, READY_FOR_PROVISIONING};
use super::queue::Slot;
use super::{LABEL_FINGERPRINT, LABEL_SHAPE};
use crate::admission::stall::human_duration;
use crate::admission::{Decision, EventNote, EventReason, Outcome};
use crate::upgradeplan::{
    BufferStatus, CapacityRequestState, CapacityRequestStatus, Fingerprint, Phase, UpgradePlan,
    UpgradePlanStatus, condition,
};
use condition::{Reason, Status};

/// What was observed about one plan's request.
#[derive(Debug)]
pub struct Facts<'a> {
    /// `--capacity-requests`: raygate may create buffers at all.
    pub enabled: bool,
    /// The plan's request settings (`Ok(None)`: it asks for nothing), or the
    /// error of its `spec.capacity`.
    pub request: Result<Option<Request>, String>,
    /// Its place in the request queue, if it waits for capacity.
    pub slot: Option<Slot>,
    /// `--max-open-capacity-requests`, for the message.
    pub max_open: usize,
    /// Its CapacityBuffers in the cache, of any change.
    pub buffers: Vec<&'a CapacityBuffer>,
    /// Why creating them failed, if the last attempt did.
    pub error: Option<String>,
}

/// The fingerprint of the change `d` holds for capacity, if it does: only
/// such a change may ask the node autoscaler.
pub fn waiting_change(d: &Decision) -> Option<Fingerprint> {
    let waiting = d.status.phase == Phase::WaitingForCapacity && d.status.admitted.is_none();
    d.status
        .pending_change
        .as_ref()
        .filter(|_| waiting)
        .map(|c| c.fingerprint.clone())
}

/// Completes `d` (decided for `plan` at `now`) with the capacity request.
pub fn annotate(d: &mut Decision, plan: &UpgradePlan, f: &Facts<'_>, now: Timestamp) {
    let prev = plan.status.clone().unwrap_or_default();
    let (request, fingerprint) = match (&f.request, waiting_change(d)) {
        (Ok(Some(r)), Some(fp)) => (Ok(r), fp),
        (Err(e), Some(fp)) => (Err(e.clone()), fp),
        _ => return clear(d, &prev),
    };
    let mut st = CapacityRequestStatus {
        fingerprint: fingerprint.clone(),
        ..Default::default()
    };
    let request = match request {
        Ok(r) if f.enabled => r,
        Ok(_) => {
            let why = "capacity requests are off in this raygate (--capacity-requests=false): \
                       nothing was asked of the node autoscaler";
            return failed(d, &prev, st, why.to_string(), plan, now);
        }
        Err(e) => return failed(d, &prev, st, e, plan, now),
    };
    if let Some(Slot::Queued { position }) = f.slot {
        st.state = CapacityRequestState::Queued;
        st.queue_position = Some(position);
        let msg = format!(
            "queued: {} plans ahead have their capacity requested (--max-open-capacity-requests {}); \
             this one asks when one of them is admitted or withdrawn (place {position})",
            f.max_open, f.max_open
        );
        st.message = Some(msg.clone());
        set_condition(d, &prev, plan, now, Status::False, Reason::Queued, &msg);
        suffix(d, &format!("request queued #{position}"));
        d.status.capacity_request = Some(st);
        return;
    }
    let mut mine: Vec<&CapacityBuffer> = f
        .buffers
        .iter()
        .copied()
        .filter(|b| label(b, LABEL_FINGERPRINT) == Some(&fingerprint[..fingerprint.len().min(63)]))
        .collect();
    mine.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    if mine.is_empty()
        && let Some(e) = &f.error
    {
        return failed(d, &prev, st, e.clone(), plan, now);
    }
    let prev_same = prev
        .capacity_request
        .as_ref()
        .filter(|p| p.fingerprint == fingerprint);
    st.requested_time = mine
        .iter()
        .filter_map(|b| b.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .min()
        .or(prev_same.and_then(|p| p.requested_time))
        .or(Some(now));
    st.buffers = mine.iter().map(|b| buffer_status(b)).collect();
    let age = st
        .requested_time
        .map(|t| Duration::try_from(now.duration_since(t)).unwrap_or_default())
        .unwrap_or_default();
    let overdue = age > request.max_wait;
    if !overdue {
        // Looked at again when maxWait runs out, to report it on time.
        let left = request.max_wait.saturating_sub(age) + Duration::from_secs(1);
        d.requeue = d.requeue.min(left);
    }
    let reports = autoscaler_reports(&mine);
    let names: Vec<String> = st
        .buffers
        .iter()
        .map(|b| {
            let s = if b.replicas == 1 { "" } else { "s" };
            format!("{} ({} pod{s})", b.name, b.replicas)
        })
        .collect();
    let asked = if names.is_empty() {
        format!(
            "asking the node autoscaler for the new cluster (CapacityBuffers, {})",
            request.strategy
        )
    } else {
        format!(
            "asked the node autoscaler for the new cluster: CapacityBuffers {} ({})",
            names.join(", "),
            request.strategy
        )
    };
    let (reason, msg) = if overdue {
        st.state = CapacityRequestState::NotDelivered;
        (
            Reason::NotDelivered,
            format!(
                "not delivered within maxWait {}: {asked}; the autoscaler reports: {reports}; \
                 raygate keeps holding and the request stays open",
                human_duration(request.max_wait)
            ),
        )
    } else {
        st.state = CapacityRequestState::Requested;
        (
            Reason::Requested,
            format!("{asked}; the autoscaler reports: {reports}"),
        )
    };
    st.message = Some(msg.clone());
    set_condition(d, &prev, plan, now, Status::True, reason, &msg);
    let was = prev_same.map(|p| p.state);
    if !st.buffers.is_empty() && prev_same.is_none_or(|p| p.buffers.is_empty()) {
        d.events.push(EventNote {
            warning: false,
            reason: EventReason::CapacityRequested,
            note: format!("change {fingerprint}: {asked}"),
            change: Some(fingerprint.to_string()),
        });
    }
    if overdue && was != Some(CapacityRequestState::NotDelivered) {
        d.events.push(EventNote {
            warning: true,
            reason: EventReason::CapacityNotDelivered,
            note: format!("change {fingerprint}: {msg}"),
            change: Some(fingerprint.to_string()),
        });
    }
    suffix(
        d,
        if overdue {
            "not delivered"
        } else {
            "requested"
        },
    );
    if let Some(m) = d.status.message.as_mut() {
        m.push_str("; ");
        m.push_str(&msg);
    }
    d.status.capacity_request = Some(st);
}

/// Nothing asked (any more): no request status, no condition; an admission
/// after a request is reported as delivered.
fn clear(d: &mut Decision, prev: &UpgradePlanStatus) {
    if let Some(p) = &prev.capacity_request
        && d.outcome == Some(Outcome::Admitted)
        && matches!(
            p.state,
            CapacityRequestState::Requested | CapacityRequestState::NotDelivered
        )
    {
        let since = p
            .requested_time
            .and_then(|t| {
                d.status
                    .admitted
                    .as_ref()
                    .map(|a| a.admitted_time.duration_since(t))
            })
            .and_then(|s| Duration::try_from(s).ok())
            .map(|s| format!(" {} after it was requested", human_duration(s)))
            .unwrap_or_default();
        d.events.push(EventNote {
            warning: false,
            reason: EventReason::CapacityDelivered,
            note: format!(
                "change {}: the new cluster fits{since}; its CapacityBuffers are deleted before the gate opens",
                p.fingerprint
            ),
            change: Some(p.fingerprint.to_string()),
        });
    }
    d.status.capacity_request = None;
    d.status
        .conditions
        .retain(|c| c.type_ != condition::CAPACITY_REQUESTED);
}

fn failed(
    d: &mut Decision,
    prev: &UpgradePlanStatus,
    mut st: CapacityRequestStatus,
    why: String,
    plan: &UpgradePlan,
    now: Timestamp,
) {
    st.state = CapacityRequestState::Failed;
    st.message = Some(why.clone());
    set_condition(d, prev, plan, now, Status::False, Reason::Failed, &why);
    let again = prev.capacity_request.as_ref().is_some_and(|p| {
        p.state == CapacityRequestState::Failed && p.message.as_deref() == Some(&why)
    });
    if !again {
        d.events.push(EventNote {
            warning: true,
            reason: EventReason::CapacityRequestFailed,
            note: format!("change {}: {why}", st.fingerprint),
            change: Some(st.fingerprint.to_string()),
        });
    }
    suffix(d, "request failed");
    // As for a request made (docs/upgradeplan.md): why it failed, in the
    // message a user reads first.
    if let Some(m) = d.status.message.as_mut() {
        m.push_str("; capacity request failed: ");
        m.push_str(&why);
    }
    d.status.capacity_request = Some(st);
}

/// `capacity: nvidia.com/gpu 8` → `capacity: nvidia.com/gpu 8 (requested)`.
fn suffix(d: &mut Decision, what: &str) {
    let short = d
        .status
        .waiting_for
        .take()
        .unwrap_or_else(|| "capacity".into());
    d.status.waiting_for = Some(format!("{short} ({what})"));
}

fn label<'a>(b: &'a CapacityBuffer, key: &str) -> Option<&'a str> {
    b.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

fn buffer_status(b: &CapacityBuffer) -> BufferStatus {
    let ready = b.condition(READY_FOR_PROVISIONING);
    let prov = b.condition(PROVISIONING);
    BufferStatus {
        name: b.metadata.name.clone().unwrap_or_default(),
        replicas: b.spec.replicas.unwrap_or(0),
        not_ready: ready
            .filter(|c| c.status != Status::True.as_str())
            .map(|c| format!("{}: {}", c.reason, c.message)),
        provisioning: prov.map(|c| c.status.clone()),
        reason: prov.map(|c| c.reason.clone()).filter(|r| !r.is_empty()),
        message: prov.map(|c| c.message.clone()).filter(|m| !m.is_empty()),
    }
}

/// One line per buffer: its `Provisioning` condition, or why the autoscaler
/// could not use it, or that it has not written anything yet.
fn autoscaler_reports(buffers: &[&CapacityBuffer]) -> String {
    if buffers.is_empty() {
        return "nothing yet".to_string();
    }
    buffers
        .iter()
        .map(|b| {
            let shape = label(b, LABEL_SHAPE).unwrap_or("?");
            let ready = b.condition(READY_FOR_PROVISIONING);
            match (ready, b.condition(PROVISIONING)) {
                (Some(r), _) if r.status != Status::True.as_str() => {
                    format!(
                        "{shape}: not ready for provisioning ({}: {})",
                        r.reason, r.message
                    )
                }
                (_, Some(p)) => format!(
                    "{shape}: Provisioning={} {}: {}",
                    p.status, p.reason, p.message
                ),
                (Some(_), None) => format!("{shape}: resolved, not provisioned yet"),
                (None, None) => format!(
                    "{shape}: not read yet (is the autoscaler running with CapacityBuffer support?)"
                ),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Sets `CapacityRequested`, keeping its transition time while its status holds.
fn set_condition(
    d: &mut Decision,
    prev: &UpgradePlanStatus,
    plan: &UpgradePlan,
    now: Timestamp,
    status: Status,
    reason: Reason,
    message: &str,
) {
    let cond = condition::make(
        &prev.conditions,
        condition::CAPACITY_REQUESTED,
        status,
        reason,
        truncate(message),
        plan.metadata.generation,
        now,
    );
    condition::set(&mut d.status.conditions, cond);
}

/// A condition message is at most 32768 bytes.
fn truncate(s: &str) -> String {
    let mut cut = s.len().min(32_000);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s[..cut].to_string()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::admission::Gate;
    use crate::autoscale::buffer::CapacityBufferSpec;
    use crate::upgradeplan::{Admission, PendingChange, UpgradePlanSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    const FP: &str = "07e0ddeed0e9";

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn plan(prev: Option<UpgradePlanStatus>) -> UpgradePlan {
        let spec: UpgradePlanSpec =
            serde_json::from_value(json!({"rayServiceRef": {"name": "llm"}})).unwrap();
        let mut p = UpgradePlan::new("llm", spec);
        p.metadata.generation = Some(1);
        p.status = prev;
        p
    }

    /// A decision held for capacity (also `request`'s and the controller's
    /// tests').
    pub(crate) fn waiting() -> Decision {
        Decision {
            status: UpgradePlanStatus {
                phase: Phase::WaitingForCapacity,
                waiting_for: Some("capacity: nvidia.com/gpu 8".into()),
                message: Some("short by nvidia.com/gpu 8".into()),
                pending_change: Some(PendingChange {
                    fingerprint: FP.into(),
                    triggering_paths: vec![],
                    detected_time: t("2026-12-04T10:00:00Z"),
                }),
                ..Default::default()
            },
            gate: Some(Gate::Hold),
            events: vec![],
            outcome: Some(Outcome::HeldCapacity),
            requeue: Duration::from_secs(15),
            overridden_by: None,
            observed: Default::default(),
            capacity_objects: Default::default(),
        }
    }

    fn request(max_wait: u64) -> Result<Option<Request>, String> {
        Ok(Some(Request {
            strategy: crate::autoscale::ACTIVE_CAPACITY.into(),
            max_wait: Duration::from_secs(max_wait),
        }))
    }

    fn buffer(
        shape: &str,
        created: &str,
        provisioning: Option<(&str, &str, &str)>,
    ) -> CapacityBuffer {
        let mut b = CapacityBuffer::new(
            &format!("llm-{FP}-{shape}"),
            CapacityBufferSpec {
                replicas: Some(2),
                ..Default::default()
            },
        );
        b.metadata.labels = Some(crate::autoscale::shapes::labels("uid-1", FP, shape));
        b.metadata.creation_timestamp = Some(Time(t(created)));
        if let Some((status, reason, message)) = provisioning {
            b.status = Some(serde_json::from_value(json!({"conditions": [
                {"type": "ReadyForProvisioning", "status": "True", "reason": "Resolved", "message": "ok",
                 "lastTransitionTime": created},
                {"type": "Provisioning", "status": status, "reason": reason, "message": message,
                 "lastTransitionTime": created}]})).unwrap());
        }
        b
    }

    fn facts<'a>(slot: Option<Slot>, buffers: Vec<&'a CapacityBuffer>) -> Facts<'a> {
        Facts {
            enabled: true,
            request: request(900),
            slot,
            max_open: 1,
            buffers,
            error: None,
        }
    }

    #[test]
    fn an_open_request_reports_the_buffers_and_what_the_autoscaler_says() {
        let b = buffer(
            "worker-gpu",
            "2026-12-04T10:00:05Z",
            Some((
                "False",
                "RequiresNewCapacity",
                "1/2 virtual pods required new capacity, 0 failed",
            )),
        );
        let mut d = waiting();
        annotate(
            &mut d,
            &plan(None),
            &facts(Some(Slot::Open), vec![&b]),
            t("2026-12-04T10:01:00Z"),
        );
        let r = d.status.capacity_request.as_ref().unwrap();
        assert_eq!(r.state, CapacityRequestState::Requested);
        assert_eq!(r.requested_time, Some(t("2026-12-04T10:00:05Z")));
        assert_eq!(r.buffers[0].reason.as_deref(), Some("RequiresNewCapacity"));
        assert!(
            r.message
                .as_ref()
                .unwrap()
                .contains("1/2 virtual pods required new capacity"),
            "{r:?}"
        );
        assert_eq!(
            d.status.waiting_for.as_deref(),
            Some("capacity: nvidia.com/gpu 8 (requested)")
        );
        let c = d
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::CAPACITY_REQUESTED)
            .unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "Requested")
        );
        assert_eq!(
            d.events
                .iter()
                .map(|e| e.reason.as_str())
                .collect::<Vec<_>>(),
            ["CapacityRequested"]
        );
        // The decision itself is untouched: still held.
        assert_eq!(
            (d.gate, d.status.phase),
            (Some(Gate::Hold), Phase::WaitingForCapacity)
        );
        // Decided again on the same facts: the same status, no second Event.
        let prev = d.status.clone();
        let mut again = waiting();
        annotate(
            &mut again,
            &plan(Some(prev.clone())),
            &facts(Some(Slot::Open), vec![&b]),
            t("2026-12-04T10:01:15Z"),
        );
        assert_eq!(again.status.capacity_request, prev.capacity_request);
        assert!(again.events.is_empty());
    }

    #[test]
    fn past_max_wait_it_is_not_delivered_once_and_keeps_holding() {
        let b = buffer(
            "worker-gpu",
            "2026-12-04T10:00:00Z",
            Some((
                "False",
                "RequiresNewCapacity",
                "0/2 virtual pods required new capacity, 2 failed",
            )),
        );
        let mut first = waiting();
        annotate(
            &mut first,
            &plan(None),
            &facts(Some(Slot::Open), vec![&b]),
            t("2026-12-04T10:01:00Z"),
        );
        let mut d = waiting();
        let p = plan(Some(first.status.clone()));
        annotate(
            &mut d,
            &p,
            &facts(Some(Slot::Open), vec![&b]),
            t("2026-12-04T10:16:00Z"),
        );
        let r = d.status.capacity_request.as_ref().unwrap();
        assert_eq!(r.state, CapacityRequestState::NotDelivered);
        assert!(r.message.as_ref().unwrap().contains("2 failed"));
        assert_eq!(
            d.events
                .iter()
                .map(|e| e.reason.as_str())
                .collect::<Vec<_>>(),
            ["CapacityNotDelivered"]
        );
        assert!(d.events[0].warning);
        assert_eq!(d.gate, Some(Gate::Hold));
        let mut later = waiting();
        annotate(
            &mut later,
            &plan(Some(d.status.clone())),
            &facts(Some(Slot::Open), vec![&b]),
            t("2026-12-04T10:17:00Z"),
        );
        assert!(later.events.is_empty(), "reported once");
    }

    #[test]
    fn queued_plans_say_where_they_are_and_ask_nothing() {
        let mut d = waiting();
        annotate(
            &mut d,
            &plan(None),
            &facts(Some(Slot::Queued { position: 2 }), vec![]),
            t("2026-12-04T10:01:00Z"),
        );
        let r = d.status.capacity_request.as_ref().unwrap();
        assert_eq!(
            (r.state, r.queue_position),
            (CapacityRequestState::Queued, Some(2))
        );
        assert_eq!(
            d.status.waiting_for.as_deref(),
            Some("capacity: nvidia.com/gpu 8 (request queued #2)")
        );
        assert!(d.events.is_empty());
    }

    #[test]
    fn buffers_of_another_change_are_not_this_ones() {
        let mut old = buffer("worker-gpu", "2026-12-04T09:00:00Z", None);
        old.metadata.labels = Some(crate::autoscale::shapes::labels(
            "uid-1",
            "aaaaaaaaaaaa",
            "worker-gpu",
        ));
        let mut d = waiting();
        annotate(
            &mut d,
            &plan(None),
            &facts(Some(Slot::Open), vec![&old]),
            t("2026-12-04T10:01:00Z"),
        );
        let r = d.status.capacity_request.as_ref().unwrap();
        assert!(r.buffers.is_empty());
        assert_eq!(r.requested_time, Some(t("2026-12-04T10:01:00Z")));
    }

    #[test]
    fn off_or_failing_requests_are_reported_as_failed_with_why() {
        let mut d = waiting();
        let mut f = facts(Some(Slot::Open), vec![]);
        f.enabled = false;
        annotate(&mut d, &plan(None), &f, t("2026-12-04T10:01:00Z"));
        let r = d.status.capacity_request.as_ref().unwrap();
        assert_eq!(r.state, CapacityRequestState::Failed);
        assert!(r.message.as_ref().unwrap().contains("--capacity-requests"));
        assert_eq!(d.events[0].reason, "CapacityRequestFailed");
        // Issue 32, item 12: appended to status.message, as documented.
        let msg = d.status.message.as_deref().unwrap_or_default();
        assert!(
            msg.contains("; capacity request failed: capacity requests are off"),
            "{msg}"
        );
        let mut d = waiting();
        let mut f = facts(Some(Slot::Open), vec![]);
        f.error =
            Some("the CapacityBuffer API (autoscaling.x-k8s.io/v1beta1) is not installed".into());
        annotate(&mut d, &plan(None), &f, t("2026-12-04T10:01:00Z"));
        assert!(d.status.message.is_some());
        assert_eq!(
            d.status.capacity_request.as_ref().unwrap().state,
            CapacityRequestState::Failed
        );
    }

    #[test]
    fn nothing_is_reported_when_nothing_is_asked_and_an_admission_is_delivered() {
        let mut d = waiting();
        let mut f = facts(None, vec![]);
        f.request = Ok(None);
        annotate(&mut d, &plan(None), &f, t("2026-12-04T10:01:00Z"));
        assert!(d.status.capacity_request.is_none());
        assert_eq!(
            d.status.waiting_for.as_deref(),
            Some("capacity: nvidia.com/gpu 8")
        );

        let b = buffer("worker-gpu", "2026-12-04T10:00:00Z", None);
        let mut asked = waiting();
        annotate(
            &mut asked,
            &plan(None),
            &facts(Some(Slot::Open), vec![&b]),
            t("2026-12-04T10:00:10Z"),
        );
        let mut admitted = waiting();
        admitted.status.phase = Phase::Admitted;
        admitted.outcome = Some(Outcome::Admitted);
        admitted.gate = Some(Gate::Open);
        admitted.status.admitted = Some(Admission {
            fingerprint: FP.into(),
            admitted_time: t("2026-12-04T10:01:30Z"),
            from_cluster: None,
            to_cluster: None,
            surge: vec![],
        });
        annotate(
            &mut admitted,
            &plan(Some(asked.status.clone())),
            &facts(None, vec![&b]),
            t("2026-12-04T10:01:30Z"),
        );
        assert!(admitted.status.capacity_request.is_none());
        assert!(
            !admitted
                .status
                .conditions
                .iter()
                .any(|c| c.type_ == condition::CAPACITY_REQUESTED)
        );
        assert_eq!(admitted.events[0].reason, "CapacityDelivered");
        assert!(
            admitted.events[0]
                .note
                .contains("fits 1m30s after it was requested")
        );
    }
}
