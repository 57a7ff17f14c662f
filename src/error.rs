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

    /// Several things wrong with one input, all reported at once so that
    /// fixing one does not reveal the next.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Several(Vec<Error>),

    /// Reading or parsing an input file.
    #[error("{path}: {reason}")]
    Input { path: String, reason: String },

    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),

    #[error("serialization: {0}")]
    Json(#[from] serde_json::Error),

    // --- operator process: metrics, logging, HTTP server, leader election ---
    /// Registering or encoding Prometheus metrics (a bug in our metric
    /// definitions, so it surfaces at startup, not at scrape time).
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),

    /// Installing the global log subscriber.
    #[error("logging: {0}")]
    Telemetry(String),

    /// Binding or running the HTTP server for metrics and probes.
    #[error("http server on {addr}: {source}")]
    Server {
        addr: String,
        #[source]
        source: std::io::Error,
    },

    /// Creating or talking to the leader-election Lease.
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),

    /// This replica stopped being (or could no longer prove it is) the leader
    /// while it was working. The process exits so Kubernetes restarts it;
    /// two replicas never act at once.
    #[error("leadership lost: {reason}")]
    LeadershipLost { reason: String },

    /// A write refused because this replica cannot prove it still leads.
    #[error("write fenced: {0}")]
    Fenced(String),

    /// An API call that did not finish within its bound.
    #[error("{what}: no answer from the API server within {after:?}")]
    Timeout {
        what: String,
        after: std::time::Duration,
    },

    /// Adding or removing the plan's finalizer, or the work around it.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

impl Error {
    /// `errors` as one: itself when there is one, `None` when there is none.
    pub fn all(mut errors: Vec<Error>) -> Option<Error> {
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(Error::Several(errors)),
        }
    }

    pub fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// A short, bounded label for `raygate_reconcile_errors_total{reason}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Quantity { .. }
            | Error::Invalid { .. }
            | Error::Input { .. }
            | Error::Several(_) => "invalid_input",
            Error::Kube(_) => "kube_api",
            Error::Json(_) => "serialization",
            Error::Metrics(_) => "metrics",
            Error::Telemetry(_) => "telemetry",
            Error::Server { .. } => "server",
            Error::Lease(_) | Error::LeadershipLost { .. } | Error::Fenced(_) => "leader_election",
            Error::Timeout { .. } => "timeout",
            // The finalizer helper wraps whatever the reconcile failed on.
            Error::Finalizer(e) => match e.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(inner)
                | kube::runtime::finalizer::Error::CleanupFailed(inner) => inner.metric_label(),
                _ => "finalizer",
            },
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
