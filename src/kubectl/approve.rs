//! `approve`, `pause` and `resume`: merge patches of `spec.approve` and
//! `spec.policy`, conditional on the plan read, that say what they did.

use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};

use super::{KubeArgs, PAUSED_POLICY_ANNOTATION, connect, get_plan, patch_plan};
use crate::cli;
use crate::upgradeplan::{Fingerprint, Policy, UpgradePlan};
use crate::{Error, Result};

pub(super) async fn approve(kube: &KubeArgs, name: &str, want: Option<&str>) -> Result<String> {
    let (client, ns) = connect(kube).await?;
    let api: Api<UpgradePlan> = Api::namespaced(client, &ns);
    let plan = get_plan(&api, &ns, name).await?;
    let checked = approval(&plan, want, plan.status.as_ref())?;
    if plan.spec.approve.as_deref() == Some(checked.fingerprint.as_str()) {
        return Ok(checked.text);
    }
    patch_plan(
        &api,
        &plan,
        json!({"spec": {"approve": checked.fingerprint}}),
    )
    .await?;
    // The phase after the approval, once raygate has reconciled it; the
    // phase read before would say `WaitingForApproval` of a change just approved.
    let after = reconciled_status(&api, name, plan.metadata.generation.unwrap_or(0) + 1).await;
    Ok(approval(&plan, want, after.as_ref())?.text)
}

/// How long `approve` waits for raygate to reconcile the approval before it
/// prints the phase: a controller under load answers within a few seconds.
const RECONCILE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The plan's status once raygate has observed `generation` (within
/// [`RECONCILE_WAIT`]); `None` if it has not (no controller running, or slow).
async fn reconciled_status(
    api: &Api<UpgradePlan>,
    name: &str,
    generation: i64,
) -> Option<crate::upgradeplan::UpgradePlanStatus> {
    let start = std::time::Instant::now();
    while start.elapsed() < RECONCILE_WAIT {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let read = tokio::time::timeout(RECONCILE_WAIT, api.get(name)).await;
        if let Ok(Ok(p)) = read
            && let Some(st) = p.status
            && st.observed_generation.unwrap_or(0) >= generation
        {
            return Some(st);
        }
    }
    None
}

/// What `approve` will write and say; refused when nothing (or something
/// else than `want`) is pending.
struct Approval {
    fingerprint: Fingerprint,
    text: String,
}

/// `after`: the status to print the phase from, as raygate wrote it after the
/// approval; `None` when raygate has not reconciled it yet, and the phase
/// read before is printed as such.
fn approval(
    plan: &UpgradePlan,
    want: Option<&str>,
    after: Option<&crate::upgradeplan::UpgradePlanStatus>,
) -> Result<Approval> {
    let what = format!(
        "upgradeplan {}/{}",
        plan.namespace().unwrap_or_default(),
        plan.name_any()
    );
    let status = plan.status.clone().unwrap_or_default();
    let Some(pending) = &status.pending_change else {
        let why = match &status.admitted {
            Some(a) => format!(
                "nothing to approve: change {} is already admitted (phase {})",
                a.fingerprint,
                status.phase.as_str()
            ),
            None => format!(
                "nothing to approve: no pending change (phase {})",
                status.phase.as_str()
            ),
        };
        return Err(Error::invalid(what, why));
    };
    if let Some(w) = want
        && w != pending.fingerprint
    {
        return Err(Error::invalid(
            what,
            format!(
                "the pending change is {}, not {w}: review it again (kubectl raygate explain)",
                pending.fingerprint
            ),
        ));
    }
    let mut s = String::new();
    let already = plan.spec.approve.as_deref() == Some(pending.fingerprint.as_str());
    let verb = if already {
        "Already approved"
    } else {
        "Approved"
    };
    cli::field(
        &mut s,
        &format!("{verb}:"),
        &format!(
            "change {} of {what} (RayService {})",
            pending.fingerprint, plan.spec.ray_service_ref.name
        ),
    );
    match plan.spec.policy {
        Policy::Manual => {}
        Policy::Auto => cli::field(
            &mut s,
            "Note:",
            "policy is Auto: the change is admitted as soon as it fits, approved or not",
        ),
        Policy::Paused => cli::field(
            &mut s,
            "Note:",
            "policy is Paused: nothing is admitted until `kubectl raygate resume`",
        ),
    }
    let ns = plan.namespace().unwrap_or_default();
    let name = plan.name_any();
    let status = match after {
        Some(after) => {
            cli::field(&mut s, "Phase:", after.phase.as_str());
            after
        }
        None => {
            cli::field(
                &mut s,
                "Phase:",
                &format!(
                    "{} (before the approval: raygate has not reconciled it yet; \
                     kubectl get upgradeplan {name} -n {ns} -w)",
                    status.phase.as_str()
                ),
            );
            &status
        }
    };
    if let Some(w) = &status.waiting_for {
        cli::field(&mut s, "Waiting for:", w);
    }
    if let Some(cap) = &status.capacity {
        // Read together: each resource in one readable unit across the three
        // lines (issue 32), not the status maps' exact `195692000Ki`.
        let [needed, available, short] =
            [&cap.needed, &cap.available, &cap.shortfall].map(crate::capacity::parse_status_map);
        let texts = crate::admission::texts::in_one_sentence(&[&needed, &available, &short]);
        for ((label, m), text) in [
            ("Needs:", &needed),
            ("Free for it:", &available),
            ("Short by:", &short),
        ]
        .into_iter()
        .zip(&texts)
        {
            if !m.is_empty() {
                cli::field(&mut s, label, text);
            }
        }
    }
    s.push_str(&format!(
        "\nChanges that need a new cluster ({}):\n",
        pending.triggering_paths.len()
    ));
    for p in &pending.triggering_paths {
        s.push_str(&format!("  {p}\n"));
    }
    Ok(Approval {
        fingerprint: pending.fingerprint.clone(),
        text: s,
    })
}

pub(super) async fn pause(kube: &KubeArgs, name: &str) -> Result<String> {
    let (client, ns) = connect(kube).await?;
    let api: Api<UpgradePlan> = Api::namespaced(client, &ns);
    let plan = get_plan(&api, &ns, name).await?;
    match pause_patch(&plan) {
        None => Ok(format!("upgradeplan {ns}/{name} is already paused\n")),
        Some(patch) => {
            patch_plan(&api, &plan, patch).await?;
            Ok(format!(
                "upgradeplan {ns}/{name} paused (was {:?}); `resume` restores it\n",
                plan.spec.policy
            ))
        }
    }
}

/// The patch that pauses a plan, keeping its policy for `resume`.
fn pause_patch(plan: &UpgradePlan) -> Option<Value> {
    if plan.spec.policy == Policy::Paused {
        return None;
    }
    Some(json!({
        "metadata": {"annotations": {PAUSED_POLICY_ANNOTATION: format!("{:?}", plan.spec.policy)}},
        "spec": {"policy": "Paused"},
    }))
}

pub(super) async fn resume(kube: &KubeArgs, name: &str) -> Result<String> {
    let (client, ns) = connect(kube).await?;
    let api: Api<UpgradePlan> = Api::namespaced(client, &ns);
    let plan = get_plan(&api, &ns, name).await?;
    match resume_patch(&plan) {
        None => Ok(format!(
            "upgradeplan {ns}/{name} is not paused (policy {:?})\n",
            plan.spec.policy
        )),
        Some((policy, patch)) => {
            patch_plan(&api, &plan, patch).await?;
            Ok(format!(
                "upgradeplan {ns}/{name} resumed (policy {policy})\n"
            ))
        }
    }
}

/// The patch that restores the policy `pause` kept (`Auto` when it kept
/// none or something unknown), and removes the note.
fn resume_patch(plan: &UpgradePlan) -> Option<(&'static str, Value)> {
    if plan.spec.policy != Policy::Paused {
        return None;
    }
    let kept = plan.annotations().get(PAUSED_POLICY_ANNOTATION);
    let policy = match kept.map(String::as_str) {
        Some("Manual") => "Manual",
        _ => "Auto",
    };
    Some((
        policy,
        json!({
            "metadata": {"annotations": {PAUSED_POLICY_ANNOTATION: null}},
            "spec": {"policy": policy},
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubectl::tests::{plan, waiting};
    use std::collections::BTreeMap;

    #[test]
    fn approval_names_the_change_and_what_it_needs() {
        let p = plan(
            "chat",
            0,
            waiting("6aca5d208cb0", "2026-12-02T11:00:00Z", "8"),
        );
        let a = approval(&p, None, p.status.as_ref()).unwrap();
        assert_eq!(a.fingerprint, "6aca5d208cb0");
        insta::assert_snapshot!("approval", a.text);
        assert!(
            a.text
                .starts_with("Approved:     change 6aca5d208cb0 of upgradeplan ml/chat"),
            "{}",
            a.text
        );
        assert!(
            a.text.contains("Needs:        cpu 8, nvidia.com/gpu 8"),
            "{}",
            a.text
        );
        assert!(
            a.text.contains("Short by:     nvidia.com/gpu 6"),
            "{}",
            a.text
        );
        assert!(
            a.text
                .contains("  workerGroupSpecs[gpu].template.spec.containers[ray-worker].image\n")
        );
        let err = approval(&p, Some("0123456789ab"), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("the pending change is 6aca5d208cb0, not 0123456789ab"),
            "{err}"
        );
        let idle = plan("chat", 0, None);
        let err = approval(&idle, None, None).err().unwrap().to_string();
        assert_eq!(
            err,
            "upgradeplan ml/chat: nothing to approve: no pending change (phase Idle)"
        );
    }

    /// Issue 32, item 7: `approve` prints the phase after the approval, or says
    /// that the one it has is from before.
    #[test]
    fn approval_prints_the_phase_after_it_or_says_it_is_from_before() {
        let p = plan(
            "chat",
            0,
            waiting("6aca5d208cb0", "2026-12-02T11:00:00Z", "8"),
        );
        let before = approval(&p, None, None).unwrap().text;
        assert!(
            before.contains(
                "Phase:        WaitingForCapacity (before the approval: raygate has not reconciled it yet;"
            ),
            "{before}"
        );
        let admitted = crate::upgradeplan::UpgradePlanStatus {
            phase: crate::upgradeplan::Phase::Admitted,
            ..Default::default()
        };
        let after = approval(&p, None, Some(&admitted)).unwrap().text;
        assert!(after.contains("Phase:        Admitted\n"), "{after}");
        assert!(!after.contains("Waiting for:"), "{after}");
        // Item 3: readable units, one per resource across the lines.
        let mut big = p.status.clone().unwrap_or_default();
        if let Some(c) = big.capacity.as_mut() {
            c.needed.insert("memory".into(), "195692000Ki".into());
            c.available.insert("memory".into(), "729808896Ki".into());
        }
        let text = approval(&p, None, Some(&big)).unwrap().text;
        assert!(text.contains("memory 186.63Gi"), "{text}");
        assert!(text.contains("memory 696Gi"), "{text}");
    }

    #[test]
    fn pause_keeps_the_policy_and_resume_restores_it() {
        let p = plan("chat", 0, None);
        let patch = pause_patch(&p).unwrap();
        assert_eq!(patch["spec"]["policy"], "Paused");
        assert_eq!(
            patch["metadata"]["annotations"][PAUSED_POLICY_ANNOTATION],
            "Manual"
        );
        assert!(resume_patch(&p).is_none(), "not paused");
        let mut paused = p.clone();
        paused.spec.policy = Policy::Paused;
        paused.metadata.annotations = Some(BTreeMap::from([(
            PAUSED_POLICY_ANNOTATION.into(),
            "Manual".into(),
        )]));
        assert!(pause_patch(&paused).is_none(), "already paused");
        let (policy, patch) = resume_patch(&paused).unwrap();
        assert_eq!(policy, "Manual");
        assert_eq!(
            patch["metadata"]["annotations"][PAUSED_POLICY_ANNOTATION],
            Value::Null
        );
        paused.metadata.annotations = None;
        assert_eq!(resume_patch(&paused).unwrap().0, "Auto");
    }
}
