//! Wake-ups gathered over a fixed window, per plan.
//!
//! The caches wake a plan for every change it depends on: a burst of node or
//! pod events would be one reconcile per event. kube-runtime's `debounce`
//! gathers them, but it is trailing: every new event moves the reconcile
//! another full period out, so a plan woken faster than the period (pod
//! churn on a busy cluster) is never reconciled while the churn lasts, and
//! even a single event waits the whole period (200 ms was most of raygate's
//! own part of an admission, issue 22).
//!
//! Here the first wake-up of a plan opens a window; the ones inside it join
//! it; the plan is sent on once, when the window closes. So a burst is one
//! reconcile per window, and no wake-up waits longer than the window.

use std::collections::HashSet;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio_util::time::DelayQueue;

/// Wake-ups from `input`, each sent on at most `window` after the first of
/// its window; duplicates inside a window are dropped. Ends when `input`
/// ends and every open window has closed. A zero window passes each
/// wake-up on at once (still dropping duplicates waiting to be read).
pub fn coalesce<S>(input: S, window: Duration) -> Coalesce<S, S::Item>
where
    S: Stream + Unpin,
    S::Item: Hash + Eq + Clone,
{
    Coalesce {
        input: Some(input),
        window,
        open: HashSet::new(),
        due: DelayQueue::new(),
    }
}

/// See [`coalesce`].
pub struct Coalesce<S, T> {
    input: Option<S>,
    window: Duration,
    /// The wake-ups with a window open: at most one entry each in `due`.
    open: HashSet<T>,
    due: DelayQueue<T>,
}

impl<S, T> Stream for Coalesce<S, T>
where
    S: Stream<Item = T> + Unpin,
    T: Hash + Eq + Clone + Unpin,
{
    type Item = T;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = &mut *self;
        // Take in everything ready: the waker is then the input's (or, once
        // it has ended, nobody's but the timer's).
        while let Some(input) = this.input.as_mut() {
            match input.poll_next_unpin(cx) {
                Poll::Ready(Some(t)) => {
                    if this.open.insert(t.clone()) {
                        this.due.insert(t, this.window);
                    }
                }
                Poll::Ready(None) => this.input = None,
                Poll::Pending => break,
            }
        }
        match this.due.poll_expired(cx) {
            Poll::Ready(Some(expired)) => {
                let t = expired.into_inner();
                this.open.remove(&t);
                Poll::Ready(Some(t))
            }
            Poll::Ready(None) if this.input.is_none() => Poll::Ready(None),
            // Empty: the input's waker brings the next one.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;
    use tokio::time::{Instant, sleep};

    const WINDOW: Duration = Duration::from_millis(50);

    /// Reads `out` until it ends, with the time each item came out.
    async fn drain<S: Stream + Unpin>(mut out: S, start: Instant) -> Vec<(S::Item, Duration)> {
        let mut got = vec![];
        while let Some(t) = out.next().await {
            got.push((t, start.elapsed()));
        }
        got
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_one_wake_up_a_window_after_its_first_event() {
        let (tx, rx) = mpsc::unbounded();
        let start = Instant::now();
        let feed = tokio::spawn(async move {
            for _ in 0..10 {
                tx.unbounded_send("plan-a").unwrap();
                tx.unbounded_send("plan-b").unwrap();
                sleep(Duration::from_millis(4)).await;
            }
        });
        let got = drain(coalesce(rx, WINDOW), start).await;
        feed.await.unwrap();
        let names: Vec<_> = got.iter().map(|(t, _)| *t).collect();
        assert_eq!(names.len(), 2, "{got:?}");
        assert!(names.contains(&"plan-a") && names.contains(&"plan-b"));
        for (_, at) in &got {
            assert_eq!(
                *at, WINDOW,
                "sent a window after the first event, not the last"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn continuous_events_do_not_starve_a_plan() {
        // One event every 20 ms for a second: kube-runtime's trailing
        // debounce of 50 ms would reconcile once, after the last one.
        let (tx, rx) = mpsc::unbounded();
        let start = Instant::now();
        let feed = tokio::spawn(async move {
            for _ in 0..50 {
                tx.unbounded_send("plan").unwrap();
                sleep(Duration::from_millis(20)).await;
            }
        });
        let got = drain(coalesce(rx, WINDOW), start).await;
        feed.await.unwrap();
        assert!(got.len() >= 15, "one a window or so: {got:?}");
        assert_eq!(got[0].1, WINDOW);
        for pair in got.windows(2) {
            let gap = pair[1].1 - pair[0].1;
            assert!(gap <= WINDOW + Duration::from_millis(20), "{got:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_plan_woken_again_after_its_window_gets_a_new_one() {
        let (tx, rx) = mpsc::unbounded();
        let start = Instant::now();
        let feed = tokio::spawn(async move {
            tx.unbounded_send(1).unwrap();
            sleep(Duration::from_millis(200)).await;
            tx.unbounded_send(1).unwrap();
        });
        let got = drain(coalesce(rx, WINDOW), start).await;
        feed.await.unwrap();
        let at: Vec<_> = got.iter().map(|(_, at)| *at).collect();
        assert_eq!(
            at,
            vec![WINDOW, Duration::from_millis(200) + WINDOW],
            "{got:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_window_passes_each_on_at_once() {
        let (tx, rx) = mpsc::unbounded();
        let start = Instant::now();
        tx.unbounded_send("a").unwrap();
        tx.unbounded_send("a").unwrap();
        tx.unbounded_send("b").unwrap();
        drop(tx);
        let got = drain(coalesce(rx, Duration::ZERO), start).await;
        let names: Vec<_> = got.iter().map(|(t, _)| *t).collect();
        assert_eq!(names.len(), 2, "the duplicate waiting is dropped: {got:?}");
        assert!(got.iter().all(|(_, at)| at.is_zero()));
    }

    #[tokio::test(start_paused = true)]
    async fn it_ends_after_the_input_once_every_window_has_closed() {
        let (tx, rx) = mpsc::unbounded();
        tx.unbounded_send("last").unwrap();
        drop(tx);
        let start = Instant::now();
        let got = drain(coalesce(rx, WINDOW), start).await;
        assert_eq!(got, vec![("last", WINDOW)]);
    }
}
