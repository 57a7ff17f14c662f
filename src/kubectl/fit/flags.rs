//! `kubectl raygate fit`'s copy of the controller flags that shape a plan's settings.

use crate::Result;
use crate::admission::settings::Operator;

/// The controller's flags that shape every plan's settings, with the
/// controller's defaults and environment variables: the live fit reads the
/// UpgradePlan as a controller started with the same flags does.
#[derive(clap::Args, Debug, Clone)]
pub struct OperatorFlags {
    /// The controller's --max-priority (N, or NAMESPACE=N; repeat or
    /// comma-separate): the ceiling on the UpgradePlan's spec.priority.
    /// Default: no ceiling.
    #[arg(
        long,
        env = "RAYGATE_MAX_PRIORITY",
        value_delimiter = ',',
        value_name = "[NS=]N"
    )]
    pub max_priority: Vec<String>,
    /// The controller's --default-batching-quiet-period: the batching of an
    /// UpgradePlan without spec.batching. Default: none.
    #[arg(
        long,
        env = "RAYGATE_DEFAULT_BATCHING_QUIET_PERIOD",
        default_value = "",
        value_name = "DURATION"
    )]
    pub default_batching_quiet_period: String,
    /// The controller's --default-batching-max-delay.
    #[arg(
        long,
        env = "RAYGATE_DEFAULT_BATCHING_MAX_DELAY",
        default_value = "6h",
        value_name = "DURATION"
    )]
    pub default_batching_max_delay: String,
}

impl OperatorFlags {
    /// The flags as the controller parses them.
    pub(super) fn operator(&self) -> Result<Operator> {
        Operator::parse(
            &self.max_priority,
            &self.default_batching_quiet_period,
            &self.default_batching_max_delay,
        )
    }
}
