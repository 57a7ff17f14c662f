//! Polling with a deadline, for deterministic e2e assertions without fixed sleeps.

use std::future::Future;
use std::time::{Duration, Instant};

/// One observation of a polled condition.
pub enum Check<T> {
    /// The condition holds; stop with this value.
    Done(T),
    /// Not yet; the string describes what was observed (shown on timeout).
    NotYet(String),
}

/// The longest one probe of [`wait_for`] may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Polls `probe` every 250 ms until it reports `Done`, or fails after `timeout` with the
/// last observed state. Errors from `probe` count as "not yet" (the apiserver may be busy).
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Check<T>>>,
{
    let start = Instant::now();
    let mut last: String;
    loop {
        // One probe is bounded too: kube's client has no read timeout, and an
        // API call that never returns would hang the test past any deadline.
        match tokio::time::timeout(PROBE_TIMEOUT, probe()).await {
            Ok(Ok(Check::Done(v))) => return Ok(v),
            Ok(Ok(Check::NotYet(s))) => last = s,
            Ok(Err(e)) => last = format!("error: {e:#}"),
            Err(_) => last = format!("a probe took over {PROBE_TIMEOUT:?}"),
        }
        if start.elapsed() >= timeout {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}; last observed: {last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
