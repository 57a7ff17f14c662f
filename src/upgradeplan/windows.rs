//! `status.windows`: what the plan's windows say now and when that changes,
//! so a user sees a freeze before running into it (the rules are
//! `schedule::Calendar`).

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

/// `status.windows`, present when the plan has maintenance or deny windows.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowsStatus {
    /// Whether the windows let an upgrade start now.
    pub open: bool,
    /// `Open`, `NoWindowOpen` (maintenance windows are set and none is open)
    /// or `Denied` (a deny window is open; deny wins over allow).
    #[schemars(extend("enum" = ["Open", "NoWindowOpen", "Denied"]))]
    pub reason: String,
    /// Which window, and when that changes, in words.
    pub message: String,
    /// The IANA time zone the schedules are read in.
    pub time_zone: String,
    /// When the windows next let an upgrade start (absent: not within 400 days).
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub next_open: Option<Timestamp>,
    /// When they next stop letting one start.
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub next_close: Option<Timestamp>,
}
