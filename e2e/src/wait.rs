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
        match probe().await {
            Ok(Check::Done(v)) => return Ok(v),
            Ok(Check::NotYet(s)) => last = s,
            Err(e) => last = format!("error: {e:#}"),
        }
        if start.elapsed() >= timeout {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}; last observed: {last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
