//! The bounds of [`super::budget`] and what going over one is: apart, because
//! the typed spec ([`super::types::RayClusterSpec`]) carries the finding.

use std::fmt;

/// Worker groups per RayCluster spec. KubeRay sets no limit; one group per
/// accelerator or node shape is the norm, tens are rare.
pub const MAX_WORKER_GROUPS: usize = 256;
/// Containers plus init containers in one pod template.
pub const MAX_CONTAINERS: usize = 64;
/// Bytes of one RayCluster spec as JSON (a typical RayService's is 5–30 KiB).
pub const MAX_SPEC_BYTES: usize = 256 * 1024;

/// Which bound a spec passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    WorkerGroups,
    Containers,
    SpecBytes,
}

impl Bound {
    pub fn limit(self) -> usize {
        match self {
            Bound::WorkerGroups => MAX_WORKER_GROUPS,
            Bound::Containers => MAX_CONTAINERS,
            Bound::SpecBytes => MAX_SPEC_BYTES,
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Bound::WorkerGroups => "worker groups",
            Bound::Containers => "containers and init containers",
            Bound::SpecBytes => "bytes as JSON",
        }
    }
}

/// A spec over one of raygate's bounds: where, and by how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverBudget {
    /// Field path in the object, e.g. `spec.rayClusterConfig.workerGroupSpecs`.
    pub path: String,
    pub bound: Bound,
    /// What was found; for bytes, "more than the limit" (counting stops there).
    pub found: usize,
}

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = self.bound.limit();
        let found = if self.bound == Bound::SpecBytes {
            format!("more than {limit}")
        } else {
            self.found.to_string()
        };
        write!(
            f,
            "{}: {found} {}, more than the {limit} raygate plans per RayCluster spec \
             (a bound on what one object may cost it, docs/security.md)",
            self.path,
            self.bound.noun()
        )
    }
}

impl std::error::Error for OverBudget {}
