//! One error type for the whole crate, so callers match on a single enum and
//! every message names the file or field that was wrong.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    /// A Kubernetes quantity that does not parse; `field` is a readable path.
    #[error("{field}: invalid quantity {value:?}: {reason}")]
    Quantity {
        field: String,
        value: String,
        reason: String,
    },

    /// An input object that is structurally wrong for what we need.
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },

    /// Reading or parsing an input file.
    #[error("{path}: {reason}")]
    Input { path: String, reason: String },

    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),

    #[error("serialization: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    pub fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
