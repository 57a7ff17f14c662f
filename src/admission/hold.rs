//! What holds a pending change back before its capacity is even counted
//! (rule 4 of [`super::rules`]): the plan's policy, then its maintenance
//! windows. Pure, so `kubectl raygate fit` shows the holds the controller
//! would make from the same definition.

use jiff::Timestamp;
use serde::ser::{Serialize, SerializeStruct, Serializer};

use super::{Outcome, Settings, render};
use crate::schedule;
use crate::upgradeplan::{Fingerprint, Phase, Policy, UpgradePlan, WindowsStatus};

/// One reason the controller would not admit a pending change however much
/// capacity is free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// `policy: Paused`.
    Paused,
    /// `policy: Manual` and `spec.approve` names another change, or none.
    Approval {
        /// The plan's name, for the command that approves.
        plan: String,
        /// The plan's namespace: the command must name it (`-n`), or it
        /// approves in the user's current namespace.
        namespace: String,
        /// The change that waits for approval.
        fingerprint: Fingerprint,
    },
    /// `spec.maintenanceWindows` are set and none is open now, or one of
    /// `spec.denyWindows` is open (deny wins).
    Window {
        /// Which window, and when upgrades may start again.
        message: String,
    },
    /// `spec.batching`: gathered with the next cluster changes until `until`
    /// (the controller applies it in rule 4 itself, from `status.batch`;
    /// `kubectl raygate fit` lists it with [`batch_hold`]).
    Batching {
        /// Changes in the batch, this one included.
        changes: u32,
        until: Timestamp,
    },
    /// Another field manager owns `spec.upgradeStrategy.type` (e.g. the
    /// RayService's creator set it): raygate cannot set the gate, so a change
    /// that fits is not admitted and nothing is reserved (`GateOverridden`).
    /// The controller reports it after the fit ([`gate_hold`]).
    GateOverridden {
        /// The field manager that owns the gate.
        owner: String,
        /// The value it keeps, `unset` when none.
        value: String,
    },
}

impl Hold {
    /// The name of the hold, as `-o json` spells it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Hold::Paused => "Paused",
            Hold::Approval { .. } => "Approval",
            Hold::Window { .. } => "MaintenanceWindow",
            Hold::Batching { .. } => "Batching",
            Hold::GateOverridden { .. } => "GateOverridden",
        }
    }

    /// A hold by the plan's policy, which waits for a human; a window ends
    /// on its own.
    pub fn is_policy(&self) -> bool {
        matches!(self, Hold::Paused | Hold::Approval { .. })
    }

    /// The phase the plan is in while this hold is the one reported.
    pub fn phase(&self) -> Phase {
        match self {
            Hold::Paused => Phase::Paused,
            Hold::Approval { .. } => Phase::WaitingForApproval,
            Hold::Window { .. } | Hold::GateOverridden { .. } => Phase::Pending,
            Hold::Batching { .. } => Phase::Batching,
        }
    }

    /// `raygate_admissions_total{outcome}` of a decision held so (another
    /// field manager's gate counts as a policy: a human must act).
    pub fn outcome(&self) -> Outcome {
        if self.is_policy() || matches!(self, Hold::GateOverridden { .. }) {
            Outcome::HeldPolicy
        } else if matches!(self, Hold::Batching { .. }) {
            Outcome::HeldBatching
        } else {
            Outcome::HeldWindow
        }
    }

    /// What holds the change and what lifts the hold, as `status.message`
    /// says it.
    pub fn message(&self) -> String {
        match self {
            Hold::Paused => {
                "the plan's policy is Paused; set policy to Auto or Manual to proceed".into()
            }
            Hold::Approval {
                plan,
                namespace,
                fingerprint,
            } => render::approval_hint(plan, namespace, fingerprint),
            Hold::Window { message } => message.clone(),
            Hold::Batching { changes, until } => format!(
                "batching {changes} cluster change{} into one new cluster until {until} (spec.batching)",
                if *changes == 1 { "" } else { "s" }
            ),
            Hold::GateOverridden { owner, value } => format!(
                "field manager {owner:?} owns spec.upgradeStrategy.type ({value}): raygate cannot \
                 set it, so it admits nothing and reserves nothing; remove upgradeStrategy.type \
                 from that manager's source of truth (see the GitOps guide)"
            ),
        }
    }
}

/// `{"hold": "Approval", "phase": "WaitingForApproval", "message": "..."}`.
impl Serialize for Hold {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Hold", 3)?;
        st.serialize_field("hold", self.as_str())?;
        st.serialize_field("phase", self.phase().as_str())?;
        st.serialize_field("message", &self.message())?;
        st.end()
    }
}

/// Every hold the plan puts on its pending change `fingerprint` at `now`, in
/// the order the controller applies them: the policy first, then the
/// maintenance windows. The controller reports the first (a change held by
/// its policy is not checked against the windows until the hold is lifted);
/// all are listed so that lifting one does not reveal the next.
pub fn holds(
    plan: &UpgradePlan,
    settings: &Settings,
    fingerprint: &str,
    now: Timestamp,
) -> Vec<Hold> {
    let spec = &plan.spec;
    let mut out = vec![];
    match spec.policy {
        Policy::Paused => out.push(Hold::Paused),
        Policy::Manual if spec.approve.as_deref() != Some(fingerprint) => {
            out.push(Hold::Approval {
                plan: plan.metadata.name.clone().unwrap_or_default(),
                namespace: plan.metadata.namespace.clone().unwrap_or_default(),
                fingerprint: fingerprint.into(),
            })
        }
        Policy::Manual | Policy::Auto => {}
    }
    let cal = &settings.calendar;
    if !cal.is_empty() && cal.open_now(now).is_err() {
        out.push(Hold::Window {
            message: cal.explain(&cal.state(now)),
        });
    }
    out
}

/// The batching hold `kubectl raygate fit` shows for the change
/// `fingerprint` (`paths` changed) at `now`: the batch the controller would
/// derive from the plan's `status.batch` ([`super::batch`]); none when the
/// plan does not batch or the batch is released.
pub fn batch_hold(
    plan: &UpgradePlan,
    settings: &Settings,
    fingerprint: &str,
    paths: &[String],
    now: Timestamp,
) -> Option<Hold> {
    let policy = settings.batching.as_ref()?;
    let prev = plan.status.as_ref().and_then(|s| s.batch.as_ref());
    let mut batch = super::batch::observe(prev, fingerprint, paths, now);
    let spec = &plan.spec;
    let approved = spec.policy == Policy::Manual && spec.approve.as_deref() == Some(fingerprint);
    let until = super::batch::release(&mut batch, policy, approved, now).err()?;
    Some(Hold::Batching {
        changes: batch.change_count,
        until,
    })
}

/// `status.windows`: what the plan's windows say at `now`, when it has any.
pub fn windows_status(settings: &Settings, now: Timestamp) -> Option<WindowsStatus> {
    let cal = &settings.calendar;
    if cal.is_empty() {
        return None;
    }
    let state = cal.state(now);
    Some(WindowsStatus {
        open: state.verdict.is_ok(),
        reason: match state.verdict {
            Ok(()) => "Open",
            Err(schedule::Closed::NoWindowOpen) => "NoWindowOpen",
            Err(schedule::Closed::Denied(_)) => "Denied",
        }
        .into(),
        message: cal.explain(&state),
        time_zone: cal.time_zone.clone(),
        next_open: state.next_open,
        next_close: state.next_close,
    })
}

/// The hold of a gate another field manager owns (`other_owner`, keeping
/// `value`), as rule 4 applies it last: whatever the policy, the windows and
/// the capacity say, raygate cannot open that gate.
pub fn gate_hold(other_owner: Option<&str>, value: Option<&str>) -> Option<Hold> {
    other_owner.map(|owner| Hold::GateOverridden {
        owner: owner.to_string(),
        value: value.unwrap_or("unset").to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::rules::WaitingFor;
    use crate::upgradeplan::UpgradePlanSpec;
    use serde_json::json;

    fn plan(spec: serde_json::Value) -> (UpgradePlan, Settings) {
        let mut full = json!({"rayServiceRef": {"name": "llm"}});
        for (k, v) in spec.as_object().into_iter().flatten() {
            full[k] = v.clone();
        }
        let spec: UpgradePlanSpec = serde_json::from_value(full).unwrap();
        let p = UpgradePlan::new("chat", spec);
        let s = Settings::of(&p).unwrap();
        (p, s)
    }

    fn at(t: &str) -> Timestamp {
        t.parse().unwrap()
    }

    /// 02:00-04:00 UTC every day.
    fn nightly() -> serde_json::Value {
        json!([{"schedule": "0 2 * * *", "duration": "2h"}])
    }

    #[test]
    fn policy_then_window() {
        let noon = at("2026-12-02T12:00:00Z");
        let night = at("2026-12-02T03:00:00Z");
        let fp = "6aca5d208cb0";
        let (p, s) = plan(json!({}));
        assert_eq!(holds(&p, &s, fp, noon), []);
        let (p, s) = plan(json!({"policy": "Paused", "approve": fp}));
        assert_eq!(holds(&p, &s, fp, noon), [Hold::Paused]);
        let (p, s) = plan(json!({"policy": "Manual"}));
        let approval = Hold::Approval {
            plan: "chat".into(),
            namespace: String::new(),
            fingerprint: fp.into(),
        };
        assert_eq!(holds(&p, &s, fp, noon), vec![approval.clone()]);
        // Approved another change: this one still waits.
        let (p, s) = plan(json!({"policy": "Manual", "approve": "0123456789ab"}));
        assert_eq!(holds(&p, &s, fp, noon), vec![approval.clone()]);
        let (p, s) = plan(json!({"policy": "Manual", "approve": fp}));
        assert_eq!(holds(&p, &s, fp, noon), []);
        let (p, s) = plan(json!({"maintenanceWindows": nightly()}));
        let closed = Hold::Window {
            message: "no maintenance window is open now (UTC); the next opens at \
                      2026-12-03T02:00:00Z (2026-12-03 02:00 UTC)"
                .into(),
        };
        assert_eq!(holds(&p, &s, fp, noon), std::slice::from_ref(&closed));
        assert_eq!(holds(&p, &s, fp, night), []);
        let (p, s) = plan(json!({"policy": "Manual", "maintenanceWindows": nightly()}));
        assert_eq!(holds(&p, &s, fp, noon), [approval, closed]);
        // A freeze wins over an open maintenance window.
        let (p, s) = plan(
            json!({"maintenanceWindows": nightly(), "timeZone": "Europe/Berlin",
            "denyWindows": [{"schedule": "0 0 1 12 *", "duration": "72h"}]}),
        );
        let h = holds(&p, &s, fp, at("2026-12-02T02:00:00Z"));
        assert_eq!(h.len(), 1);
        assert!(
            h[0].message()
                .starts_with("deny window spec.denyWindows[0] is open now (Europe/Berlin)"),
            "{}",
            h[0].message()
        );
    }

    #[test]
    fn fit_shows_the_batch_the_controller_would_hold() {
        let fp = "6aca5d208cb0";
        let (p, s) = plan(json!({}));
        assert_eq!(
            batch_hold(&p, &s, fp, &[], at("2026-12-02T12:00:00Z")),
            None
        );
        let (p, s) = plan(json!({"batching": {"quietPeriod": "30m"}}));
        let h = batch_hold(&p, &s, fp, &[], at("2026-12-02T12:00:00Z")).unwrap();
        assert_eq!(
            h,
            Hold::Batching {
                changes: 1,
                until: at("2026-12-02T12:30:00Z")
            }
        );
        assert_eq!(
            (h.phase(), h.outcome(), h.as_str()),
            (Phase::Batching, Outcome::HeldBatching, "Batching")
        );
        assert!(h.message().starts_with(
            "batching 1 cluster change into one new cluster until 2026-12-02T12:30:00Z"
        ));
        let (p, s) =
            plan(json!({"batching": {"quietPeriod": "30m"}, "policy": "Manual", "approve": fp}));
        assert_eq!(
            batch_hold(&p, &s, fp, &[], at("2026-12-02T12:00:00Z")),
            None,
            "approved"
        );
    }

    #[test]
    fn a_gate_another_manager_owns_is_a_hold_naming_it() {
        assert_eq!(gate_hold(None, Some("NewCluster")), None);
        let h = gate_hold(Some("argocd-controller"), Some("NewCluster")).unwrap();
        assert_eq!(h.as_str(), "GateOverridden");
        assert_eq!(
            (h.phase(), WaitingFor::from(&h).to_string().as_str()),
            (Phase::Pending, "GateOverridden")
        );
        assert!(!h.is_policy());
        assert!(
            h.message().starts_with(
                "field manager \"argocd-controller\" owns spec.upgradeStrategy.type (NewCluster)"
            ),
            "{}",
            h.message()
        );
        let unset = gate_hold(Some("helm"), None).unwrap();
        assert!(unset.message().contains("(unset)"), "{}", unset.message());
    }

    #[test]
    fn each_hold_says_what_lifts_it() {
        let approval = Hold::Approval {
            plan: "chat".into(),
            namespace: "ml".into(),
            fingerprint: "6aca5d208cb0".into(),
        };
        // Issue 32, item 12: with the plan's namespace, or it approves elsewhere.
        assert!(
            approval
                .message()
                .contains("kubectl raygate approve chat -n ml --fingerprint 6aca5d208cb0"),
            "{}",
            approval.message()
        );
        assert_eq!(
            (
                approval.phase(),
                approval.outcome(),
                WaitingFor::from(&approval).to_string().as_str()
            ),
            (Phase::WaitingForApproval, Outcome::HeldPolicy, "approval")
        );
        let window = Hold::Window {
            message: "no maintenance window is open now (UTC)".into(),
        };
        assert_eq!(
            (window.phase(), window.outcome()),
            (Phase::Pending, Outcome::HeldWindow)
        );
        assert!(Hold::Paused.message().contains("policy is Paused"));
        assert_eq!(
            serde_json::to_value([Hold::Paused, window]).unwrap(),
            json!([
                {"hold": "Paused", "phase": "Paused",
                 "message": "the plan's policy is Paused; set policy to Auto or Manual to proceed"},
                {"hold": "MaintenanceWindow", "phase": "Pending",
                 "message": "no maintenance window is open now (UTC)"},
            ])
        );
    }
}
