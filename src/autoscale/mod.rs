//! Capacity on demand: a plan waiting for capacity asks the node autoscaler
//! for its new cluster.
//!
//! On an autoscaled cluster (Karpenter, cluster-autoscaler) nodes come only
//! for pods that are pending, and a held upgrade has none: without help it
//! would wait forever. With `spec.capacity.request: CapacityBuffer`, raygate
//! keeps, while a plan waits for capacity, one PodTemplate and one
//! CapacityBuffer (`autoscaling.x-k8s.io/v1beta1`) per pod shape of the new
//! cluster, plus one for the plan's headroom. The autoscaler provisions
//! capacity for the buffers' placeholder pods on top of what runs (using
//! free capacity first); once the new cluster fits on Ready nodes raygate
//! admits it as always, and deletes the buffers before it opens the gate, or
//! the autoscaler would keep the capacity free a second time.
//!
//! - [`buffer`]: the CapacityBuffer API, as much of it as raygate writes and reads;
//! - [`shapes`]: the PodTemplates and CapacityBuffers for one change (pure);
//! - [`queue`]: which waiting plans have a request open, in queue order and
//!   under the cap (pure);
//! - [`report`]: `status.capacityRequest`, its condition and Events, from
//!   what is observed (pure);
//! - [`request`]: the three above as one step of the decision (pure:
//!   [`crate::admission::decide`] runs it).
//!
//! The I/O (reserve a slot, create, find again, delete) is `controller::buffers`.

pub mod buffer;
pub mod queue;
pub mod report;
pub mod request;
pub mod shapes;

use std::time::Duration;

use crate::upgradeplan::{CapacityRequestMode, UpgradePlan};

/// `app.kubernetes.io/managed-by` on every object raygate creates here.
pub const MANAGED_BY: &str = "raygate";
/// The owning plan's uid: a plan name may be longer than a label value.
pub const LABEL_PLAN_UID: &str = "raygate.io/plan-uid";
/// The pending change (its fingerprint) the objects ask capacity for.
pub const LABEL_FINGERPRINT: &str = "raygate.io/fingerprint";
/// The shape: `head`, `worker-<group>` or `headroom`.
pub const LABEL_SHAPE: &str = "raygate.io/shape";
/// The owning plan's name, as an annotation (no length limit).
pub const ANNOTATION_PLAN: &str = "raygate.io/upgradeplan";
/// The default (and cluster-autoscaler's only) provisioning strategy.
pub const ACTIVE_CAPACITY: &str = "buffer.x-k8s.io/active-capacity";

/// The operator's defaults for plans that do not set `spec.capacity`.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    /// `--capacity-requests`: raygate may create PodTemplates and
    /// CapacityBuffers at all (RBAC and the CRD are needed).
    pub enabled: bool,
    /// `--capacity-request-default`.
    pub mode: CapacityRequestMode,
    /// `--capacity-max-wait`.
    pub max_wait: Duration,
    /// `--max-open-capacity-requests`: plans with buffers at once.
    pub max_open: usize,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            enabled: false,
            mode: CapacityRequestMode::None,
            max_wait: Duration::from_secs(15 * 60),
            max_open: 3,
        }
    }
}

/// What one plan asks for, its spec resolved against the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub strategy: String,
    pub max_wait: Duration,
}

/// The plan's request settings; `Ok(None)` when it asks for nothing. A bad
/// field is an error naming it (the CRD's patterns make that rare).
pub fn resolve(plan: &UpgradePlan, d: &Defaults) -> crate::Result<Option<Request>> {
    let spec = plan.spec.capacity.as_ref();
    let mode = spec.and_then(|c| c.request).unwrap_or(d.mode);
    if mode == CapacityRequestMode::None {
        return Ok(None);
    }
    let max_wait = match spec.and_then(|c| c.max_wait.as_deref()) {
        Some(s) => crate::schedule::parse_duration("spec.capacity.maxWait", s)?,
        None => d.max_wait,
    };
    let strategy = spec
        .and_then(|c| c.provisioning_strategy.clone())
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| ACTIVE_CAPACITY.to_string());
    Ok(Some(Request { strategy, max_wait }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upgradeplan::UpgradePlanSpec;
    use serde_json::json;

    fn plan(capacity: serde_json::Value) -> UpgradePlan {
        let spec: UpgradePlanSpec =
            serde_json::from_value(json!({"rayServiceRef": {"name": "llm"}, "capacity": capacity}))
                .unwrap();
        UpgradePlan::new("p", spec)
    }

    #[test]
    fn the_plan_wins_over_the_flag_default_and_unset_fields_take_the_defaults() {
        let off = Defaults::default();
        let on = Defaults {
            mode: CapacityRequestMode::CapacityBuffer,
            ..Defaults::default()
        };
        assert_eq!(resolve(&plan(json!(null)), &off).unwrap(), None);
        let r = resolve(&plan(json!(null)), &on).unwrap().unwrap();
        assert_eq!(r.strategy, ACTIVE_CAPACITY);
        assert_eq!(r.max_wait, Duration::from_secs(900));
        assert_eq!(
            resolve(&plan(json!({"request": "None"})), &on).unwrap(),
            None
        );
        let r = resolve(
            &plan(json!({"request": "CapacityBuffer", "maxWait": "90s",
                         "provisioningStrategy": "example.com/warm"})),
            &off,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.max_wait, Duration::from_secs(90));
        assert_eq!(r.strategy, "example.com/warm");
    }

    #[test]
    fn a_bad_max_wait_names_its_field() {
        let e = resolve(
            &plan(json!({"request": "CapacityBuffer", "maxWait": "soon"})),
            &Defaults::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("spec.capacity.maxWait"), "{e}");
    }
}
