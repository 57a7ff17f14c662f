//! raygate: a capacity gate for KubeRay RayService upgrades.
//!
//! Read it as a book, in this order:
//! - [`quantity`]: Kubernetes quantities, exact integer arithmetic.
//! - [`kuberay`]: what KubeRay does, as data and pure functions.
//! - [`kueue`]: what Kueue does to a RayService it manages, and its quota.
//! - [`capacity`]: what fits where, with kube-scheduler's rules.
//! - [`upgradeplan`]: raygate's own API, the `UpgradePlan` CRD.
//! - [`admission`]: the decision to hold, admit or track an upgrade.
//! - [`autoscale`]: asking the node autoscaler for a held upgrade's capacity.
//! - [`controller`]: the loop that watches, decides and applies.
//! - [`cli`]: the offline commands built on the same core.
//! - [`kubectl`]: `kubectl raygate`, the same commands on a live cluster.

pub mod admission;
pub mod autoscale;
pub mod capacity;
pub mod cli;
pub mod controller;
pub mod error;
pub mod kubectl;
pub mod kuberay;
pub mod kueue;
pub mod leader;
pub mod metrics;
pub mod podgroup;
pub mod quantity;
pub mod schedule;
pub mod server;
pub mod sync;
pub mod telemetry;
pub mod upgradeplan;

pub use error::{Error, Result};
