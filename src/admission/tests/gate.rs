//! After the rules: another field manager's hold on the gate is reported,
//! not fought; and what a decision emits (gate values, Event reasons and
//! series) is spelled as the API says.

use super::*;

fn owned_by(owner: &str, value: &str) -> GateFacts {
    GateFacts {
        value: Some(value.into()),
        other_owner: Some(owner.into()),
        owned_by_us: true,
        uid: None,
    }
}

#[test]
fn gate_override_is_reported_not_fought() {
    let d = Scenario::new()
        .verdict(Verdict::NoChange)
        .gate(GateFacts {
            value: Some("NewCluster".into()),
            other_owner: Some("argocd-controller".into()),
            owned_by_us: false,
            uid: None,
        })
        .decide();
    let c = cond(&d.status, "GateOverridden");
    assert_eq!(c.status, "True");
    assert!(c.message.contains("argocd-controller"));
    assert!(d.events.iter().any(|e| e.reason == "GateOverridden"));
    assert!(d.observed.newly_overridden);
    // Visible in `kubectl get upgradeplans` (WAITING FOR), with the manager.
    assert_eq!(
        d.status.waiting_for.as_deref(),
        Some("GateOverridden: argocd-controller keeps NewCluster")
    );
}

#[test]
fn an_override_is_new_only_in_the_decision_that_first_sees_it() {
    let first = Scenario::new()
        .gate(owned_by("argocd-controller", "NewCluster"))
        .decide();
    assert!(first.overridden_by.is_some());
    assert!(first.observed.newly_overridden);
    let again = Scenario::new()
        .status(first.status)
        .gate(owned_by("argocd-controller", "NewCluster"))
        .decide();
    assert!(again.overridden_by.is_some());
    assert!(!again.observed.newly_overridden);
    assert!(again.events.iter().all(|e| e.reason != "GateOverridden"));
}

#[test]
fn an_override_is_judged_against_the_gate_decided_in_the_same_decision() {
    // Nothing pending: raygate holds; argocd keeps the gate open.
    let d = Scenario::new()
        .gate(owned_by("argocd", "NewCluster"))
        .decide();
    assert_eq!(d.gate, Some(Gate::Hold));
    assert_eq!(d.overridden_by.as_deref(), Some("argocd"));
    assert_eq!(cond(&d.status, "GateOverridden").status, "True");
    // The value raygate wants now, but owned by argocd too: raygate could
    // not open the gate later (the apply would conflict), so it is
    // overridden all the same.
    let d = Scenario::new().gate(owned_by("argocd", "None")).decide();
    assert_eq!(d.overridden_by.as_deref(), Some("argocd"));
    assert_eq!(cond(&d.status, "GateOverridden").status, "True");
    // raygate alone: not overridden.
    let mut mine = owned_by("argocd", "None");
    mine.other_owner = None;
    let d = Scenario::new().gate(mine).decide();
    assert_eq!(d.overridden_by, None);
    assert!(
        d.status
            .conditions
            .iter()
            .all(|c| c.type_ != "GateOverridden")
    );
}

/// The RayService's creator set `spec.upgradeStrategy.type` (kubectl create /
/// apply own what they set): a change that fits is not admitted, nothing is
/// reserved, and the status says why instead of claiming an admission.
#[test]
fn a_change_that_fits_under_another_owners_gate_is_not_admitted() {
    for value in ["None", "NewCluster"] {
        let ch = Ok(Some(change(vec![gpu_pod("w0", 8)])));
        let d = Scenario::new()
            .change_is(ch)
            .gate(owned_by("kubectl-create", value))
            .decide();
        assert_eq!(d.status.phase, Phase::Pending, "{value}");
        assert!(d.status.admitted.is_none(), "nothing reserved: {value}");
        assert_eq!(d.overridden_by.as_deref(), Some("kubectl-create"));
        assert_ne!(d.gate, Some(Gate::Open), "{value}");
        let admitted = cond(&d.status, "UpgradeAdmitted");
        assert_eq!(
            (admitted.status.as_str(), admitted.reason.as_str()),
            ("False", "GateOverridden")
        );
        assert_eq!(cond(&d.status, "GateOverridden").status, "True");
        assert!(d.events.iter().all(|e| e.reason != "Admitted"), "{value}");
        assert_eq!(d.outcome, None, "{value}");
        assert_eq!(
            d.status.waiting_for.as_deref(),
            Some(format!("GateOverridden: kubectl-create keeps {value}").as_str())
        );
    }
}

#[test]
fn the_override_event_comes_before_the_events_of_the_rules() {
    let ch = Ok(Some(change(vec![gpu_pod("w0", 8)])));
    let d = Scenario::new()
        .change_is(ch)
        .gate(owned_by("argocd", "None"))
        .decide();
    assert_eq!(d.overridden_by.as_deref(), Some("argocd"));
    let reasons: Vec<_> = d.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons[0], "GateOverridden", "{reasons:?}");
    // Reported once: the next decision sees the condition already True.
    let ch = Ok(Some(change(vec![gpu_pod("w0", 8)])));
    let d2 = Scenario::new()
        .status(d.status)
        .change_is(ch)
        .gate(owned_by("argocd", "None"))
        .decide();
    assert!(d2.events.iter().all(|e| e.reason != "GateOverridden"));
}

#[test]
fn an_invalid_spec_leaves_an_overridden_gate_alone_without_judging_it() {
    let d = Scenario::new()
        .spec(json!({"rayServiceRef": {"name": "llm"}, "stallAfter": "soon"}))
        .gate(owned_by("argocd", "NewCluster"))
        .decide();
    assert_eq!((d.status.phase, d.gate), (Phase::Error, Some(Gate::Hold)));
    assert_eq!(d.overridden_by.as_deref(), Some("argocd"), "not written");
    assert!(
        d.status
            .conditions
            .iter()
            .all(|c| c.type_ != "GateOverridden")
    );
    assert!(
        d.status
            .message
            .as_deref()
            .unwrap()
            .starts_with("spec.stallAfter"),
        "{:?}",
        d.status.message
    );
}

/// The gate is compared with the RayService's typed value, unknown values included.
#[test]
fn a_gate_is_set_only_when_the_value_is_the_same() {
    use crate::kuberay::UpgradeType as T;
    assert!(Gate::Hold.is_set(Some(&T::None)));
    assert!(Gate::Open.is_set(Some(&T::NewCluster)));
    assert!(Gate::OpenIncremental.is_set(Some(&T::NewClusterWithIncrementalUpgrade)));
    assert!(!Gate::Hold.is_set(None));
    assert!(!Gate::Open.is_set(Some(&T::None)));
    assert!(!Gate::Open.is_set(Some(&T::Other("newcluster".into()))));
    for g in [Gate::Hold, Gate::Open, Gate::OpenIncremental] {
        assert_eq!(g.upgrade_type().as_str(), g.strategy());
    }
}

#[test]
fn events_of_different_changes_or_texts_are_never_one_series() {
    let ev = |change: Option<&str>, note: &str| EventNote {
        warning: false,
        reason: EventReason::Admitted,
        note: note.into(),
        change: change.map(Into::into),
    };
    let a = ev(Some("07e0ddeed0e9"), "admitted change 07e0ddeed0e9");
    let b = ev(Some("21dbea861227"), "admitted change 21dbea861227");
    assert!(
        a.action().starts_with("Gate 07e0ddeed0e9 "),
        "{}",
        a.action()
    );
    assert_ne!(a.action(), b.action());
    assert_ne!(
        ev(None, "spec.stallAfter: bad").action(),
        ev(None, "spec.priority: bad").action()
    );
    assert_eq!(
        a.action(),
        a.clone().action(),
        "the same Event repeated is one series"
    );
    assert!(a.action().len() <= 128, "the API's limit for action");
}

/// Reasons are API: each is spelled as its variant, and no two are alike.
#[test]
fn event_reasons_are_spelled_as_their_names() {
    let mut seen = std::collections::BTreeSet::new();
    for r in EventReason::ALL {
        assert_eq!(r.as_str(), format!("{r:?}"));
        assert!(seen.insert(r.as_str()), "{r:?} twice");
    }
    use crate::kuberay::ReleaseProblem as P;
    let release: Vec<&str> = [P::FlagMismatch, P::UnknownRelease, P::NotGateable]
        .into_iter()
        .map(|p| EventReason::from(p).as_str())
        .collect();
    assert_eq!(
        release,
        [
            "KubeRayReleaseMismatch",
            "UnknownKubeRayRelease",
            "KubeRayNotGateable"
        ]
    );
    let off = incremental::Problem::FeatureGateOff {
        version: "v1.6.2".into(),
    };
    assert_eq!(
        EventReason::from(&off).as_str(),
        "IncrementalUpgradeGateOff"
    );
    for (s, want) in [
        (stall::StallReason::Unschedulable, "Unschedulable"),
        (stall::StallReason::ServeNotHealthy, "ServeNotHealthy"),
        (stall::StallReason::Timeout, "Timeout"),
        (
            stall::StallReason::KueueWorkloadPending,
            "KueueWorkloadPending",
        ),
    ] {
        assert_eq!((s.as_str(), s.condition_reason().as_str()), (want, want));
    }
}
