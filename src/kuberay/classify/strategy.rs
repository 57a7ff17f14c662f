//! How the new RayService upgrades under a release and the operator's settings:
//! `validateRayService`'s strategy checks and `isZeroDowntimeUpgradeEnabled`.

use super::ClassifyOptions;
use crate::kuberay::types::{RayService, UpgradeType};
use crate::kuberay::version::Rules;

/// How the new RayService upgrades, under the release and the operator's settings.
pub(super) struct Strategy {
    /// `spec.upgradeStrategy.type` as given.
    pub(super) given: Option<UpgradeType>,
    /// The operator's `RayServiceIncrementalUpgrade` feature gate.
    pub(super) gate: bool,
    pub(super) zero_downtime: bool,
    /// Why no new cluster is created when `zero_downtime` is off.
    pub(super) zero_downtime_off: String,
    pub(super) incremental: bool,
}

pub(super) fn strategy(new: &RayService, rules: &Rules, opts: &ClassifyOptions) -> Strategy {
    let gate = opts
        .incremental_upgrade_gate
        .unwrap_or(rules.incremental_upgrade_gate_default);
    let given = new
        .spec
        .upgrade_strategy
        .as_ref()
        .and_then(|s| s.type_.clone());
    // Releases without the field ignore it (pruned).
    let effective = given.as_ref().filter(|_| rules.upgrade_strategy_field);
    let (zero_downtime, zero_downtime_off) = zero_downtime(effective, rules, gate, opts);
    let incremental = gate && effective == Some(&UpgradeType::NewClusterWithIncrementalUpgrade);
    Strategy {
        given,
        gate,
        zero_downtime,
        zero_downtime_off,
        incremental,
    }
}

/// KubeRay `validateRayService` checks on the upgrade strategy (v1.3.0+).
pub(super) fn validate_upgrade(new: &RayService, rules: &Rules, gate: bool) -> Option<String> {
    if !rules.upgrade_strategy_field {
        return None;
    }
    let strategy = new.spec.upgrade_strategy.as_ref()?;
    let ty = strategy.type_.as_ref()?;
    if !rules.upgrade_types.contains(ty) {
        let valid: Vec<&str> = rules
            .upgrade_types
            .iter()
            .map(UpgradeType::as_str)
            .collect();
        return Some(format!(
            "spec.upgradeStrategy.type {ty:?} is invalid for KubeRay {} (valid: {}); the RayService fails validation",
            rules.version,
            valid.join(", ")
        ));
    }
    if *ty == UpgradeType::NewClusterWithIncrementalUpgrade && gate {
        // utils/validation.go ValidateClusterUpgradeOptions.
        if let Err(p) = crate::kuberay::incremental::validate(new, rules, gate) {
            return Some(p.to_string());
        }
    }
    None
}

/// `isZeroDowntimeUpgradeEnabled` (v1.3.0+; before, only `ENABLE_ZERO_DOWNTIME`).
fn zero_downtime(
    ty: Option<&UpgradeType>,
    rules: &Rules,
    gate: bool,
    opts: &ClassifyOptions,
) -> (bool, String) {
    match ty {
        Some(t) if rules.upgrade_strategy_field => {
            let ok = *t == UpgradeType::NewCluster || (gate && *t == UpgradeType::NewClusterWithIncrementalUpgrade);
            let why = match t {
                UpgradeType::None => "spec.upgradeStrategy.type is None: KubeRay never prepares a new RayCluster and leaves the active one unchanged".to_string(),
                UpgradeType::NewClusterWithIncrementalUpgrade => format!(
                    "spec.upgradeStrategy.type is NewClusterWithIncrementalUpgrade but the operator's RayServiceIncrementalUpgrade feature gate is off (default off in {}): zero-downtime upgrade is disabled",
                    rules.version
                ),
                other => format!("spec.upgradeStrategy.type {other} disables zero-downtime upgrade"),
            };
            (ok, why)
        }
        _ => (
            opts.zero_downtime_enabled,
            "the operator runs with ENABLE_ZERO_DOWNTIME=false and spec.upgradeStrategy.type is unset: KubeRay does not prepare a new RayCluster and leaves the active one unchanged".to_string(),
        ),
    }
}
