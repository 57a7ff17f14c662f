//! `spec.batching` and `status.batch`: gathering the cluster-recreating
//! changes of a RayService so that several commits cost one new cluster.
//!
//! The decision is recomputed from objects every time, so everything the
//! batch needs (when it started, when the spec last moved, what it gathered)
//! lives here in the status, never in memory: a restart loses nothing.
//! The rules that fill it in are `admission::batch`.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use super::{DURATION_PATTERN, Fingerprint};

/// `spec.batching`: hold a change that needs a new cluster until the
/// RayService's cluster spec has been quiet for `quietPeriod`, but never
/// longer than `maxDelay` after the first change of the batch. Changes that
/// need no new cluster (Serve config, in place, autoscaler-owned) are never
/// held by it.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.maxDelay) || duration(self.maxDelay) >= duration(self.quietPeriod)",
    "message": "maxDelay must be at least quietPeriod"
}]))]
pub struct BatchingSpec {
    /// How long the cluster spec must stay unchanged before the batch is
    /// released (`30m`). `0s` turns batching off for this plan, whatever the
    /// operator's `--default-batching-quiet-period`.
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 72))]
    pub quiet_period: String,
    /// The longest a batch is held after its first change (`6h`), however
    /// often the spec keeps changing. Unset: the operator's
    /// `--default-batching-max-delay` (default `6h`), and never less than
    /// `quietPeriod`.
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 72))]
    pub max_delay: Option<String>,
}

/// At most this many changes are listed in `status.batch.changes`; later
/// ones replace the last entry (the count goes on): the status stays small
/// however often a spec changes.
pub const MAX_LISTED_CHANGES: usize = 20;

/// At most this many paths are listed per change.
pub const MAX_LISTED_PATHS: usize = 20;

/// `status.batch`: the cluster changes gathered since the active cluster, to
/// be admitted as one new cluster. While a transition runs, the changes made
/// meanwhile: the next batch, which waits for the transition to end.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchStatus {
    /// The fingerprint that will be admitted: the cluster spec as it is now
    /// (the one `spec.approve` names under `policy: Manual`).
    pub fingerprint: Fingerprint,
    /// Changes gathered (a revert inside the batch takes its change out).
    // `int64` in the schema: the apiserver knows no `uint32` (see queuePosition).
    #[schemars(extend("format" = "int64"))]
    pub change_count: u32,
    /// When the first change of the batch was seen: `maxDelay` counts from here.
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub first_change_time: Timestamp,
    /// When the cluster spec last changed: `quietPeriod` counts from here.
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub last_change_time: Timestamp,
    /// When the batch is released to the gate (windows, approval, capacity):
    /// `lastChangeTime + quietPeriod`, at most `firstChangeTime + maxDelay`.
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub release_time: Option<Timestamp>,
    /// Set once the batch was released, with why: `QuietPeriod`, `MaxDelay`,
    /// `Approved` or `NotBatched` (no batching configured).
    pub released: Option<String>,
    /// A transition runs: this batch waits for it to end (never a third
    /// cluster); names the cluster being created.
    pub after_transition_to: Option<String>,
    /// The changes, oldest first (at most 20 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<BatchedChange>,
}

/// One change of a batch.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchedChange {
    /// The cluster spec's fingerprint after this change.
    pub fingerprint: Fingerprint,
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub seen_time: Timestamp,
    /// The paths this change touched that the batch had not touched before
    /// (all of its paths when it changed only values already changed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}
