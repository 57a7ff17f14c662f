//! Events off the critical path: a bounded queue drained in the background.
//!
//! A decision's Events used to be awaited in its reconcile (two creates, one
//! regarding the plan and one regarding the RayService). They came after the
//! status and gate writes, but in a burst (a node that lets a hundred held
//! upgrades through) every admission's two creates met the other admissions'
//! status and gate writes in the apiserver: at 5,000 nodes on 2 cores a
//! create took 0.6 s p50 there, a status patch 1.6 s. client-go's recorder is
//! asynchronous for the same reason. Here a reconcile queues its Events and
//! goes on; one task sends them, [`IN_FLIGHT`] at a time, so in a burst they
//! trail the writes that let upgrades through instead of competing with them.
//!
//! Bounded, and nothing dropped silently: a full queue (the apiserver far
//! behind) drops the newest Event, logs it and counts it in
//! `raygate_events_dropped_total{reason="queue_full"}`; an Event a replica
//! can no longer send because it lost its Lease is counted as
//! `not_leader`, one the apiserver refused or did not answer in time as
//! `failed`. The status, which records every decision, is never queued.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use tokio::sync::{Notify, mpsc};
use tracing::warn;

use crate::leader::Fence;
use crate::metrics::{EventDrop, Metrics};

/// Events waiting to be sent, at most: about 1 KiB each.
pub const CAPACITY: usize = 1_000;

/// Events sent at once: enough to keep up with a burst's decisions (two
/// Events per admission) without crowding the admissions' own writes.
pub const IN_FLIGHT: usize = 2;

/// One Event to create, regarding `on`.
struct Queued {
    event: Event,
    on: ObjectReference,
}

/// The sending side; the task ends when it is dropped.
pub struct EventQueue {
    tx: mpsc::Sender<Queued>,
    metrics: Arc<Metrics>,
    /// Queued and not yet sent (or dropped): for [`EventQueue::drained`].
    pending: Arc<AtomicUsize>,
    idle: Arc<Notify>,
}

impl EventQueue {
    /// Starts the sending task (needs a Tokio runtime).
    pub fn start(recorder: Recorder, fence: Arc<Fence>, metrics: Arc<Metrics>) -> EventQueue {
        let (tx, mut rx) = mpsc::channel::<Queued>(CAPACITY);
        let pending = Arc::new(AtomicUsize::new(0));
        let idle = Arc::new(Notify::new());
        let queue = EventQueue {
            tx,
            metrics: metrics.clone(),
            pending: pending.clone(),
            idle: idle.clone(),
        };
        let incoming = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        tokio::spawn(async move {
            incoming
                .for_each_concurrent(IN_FLIGHT, |q| {
                    let (recorder, fence, metrics) = (&recorder, &fence, &metrics);
                    let (pending, idle) = (&pending, &idle);
                    async move {
                        send(recorder, fence, metrics, q).await;
                        if pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                            idle.notify_waiters();
                        }
                    }
                })
                .await;
        });
        queue
    }

    /// Queues `event` regarding `on`; never waits. A full queue drops it,
    /// said in the log and counted.
    pub fn send(&self, event: Event, on: ObjectReference) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        if let Err(e) = self.tx.try_send(Queued { event, on }) {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            let q = match e {
                mpsc::error::TrySendError::Full(q) | mpsc::error::TrySendError::Closed(q) => q,
            };
            warn!(
                reason = %q.event.reason,
                regarding = ?q.on.name,
                capacity = CAPACITY,
                "Event dropped: the queue of Events to send is full (the apiserver is far behind)"
            );
            self.metrics.event_dropped(EventDrop::QueueFull);
        }
    }

    /// Returns once every Event queued so far was sent or dropped.
    pub async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            if self.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// Sends one Event: only while this replica holds the Lease, bounded by its
/// API timeout.
async fn send(recorder: &Recorder, fence: &Fence, metrics: &Metrics, q: Queued) {
    if fence.check().is_err() {
        metrics.event_dropped(EventDrop::NotLeader);
        return;
    }
    let bound: Duration = fence.api_timeout();
    let what = q.on.kind.as_deref().unwrap_or("object");
    match tokio::time::timeout(bound, recorder.publish(&q.event, &q.on)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            warn!(error = %e, regarding = what, "failed to record an Event");
            metrics.event_dropped(EventDrop::Failed);
        }
        Err(_) => {
            warn!(timeout = ?bound, regarding = what, "recording an Event timed out");
            metrics.event_dropped(EventDrop::Failed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::Client;
    use kube::client::Body;
    use kube::runtime::events::{EventType, Reporter};

    fn event(i: usize) -> (Event, ObjectReference) {
        let ev = Event {
            type_: EventType::Normal,
            reason: "Admitted".into(),
            note: Some(format!("change {i}")),
            action: "Admit".into(),
            secondary: None,
        };
        let on = ObjectReference {
            api_version: Some("raygate.io/v1alpha1".into()),
            kind: Some("UpgradePlan".into()),
            name: Some(format!("p{i}")),
            namespace: Some("ml".into()),
            ..Default::default()
        };
        (ev, on)
    }

    fn dropped(m: &Metrics, why: EventDrop) -> u64 {
        let text = m.render().unwrap_or_default();
        let series = format!(
            "raygate_events_dropped_total{{reason=\"{}\"}} ",
            why.as_str()
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(u64::MAX)
    }

    /// An apiserver that takes every request and answers none (`answer`
    /// false), or echoes every Event back.
    fn apiserver(answer: bool) -> (Client, tokio::task::JoinHandle<Vec<Request<Body>>>) {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let task = tokio::spawn(async move {
            let mut held = vec![];
            let mut kept = vec![];
            while let Some((req, send)) = handle.next_request().await {
                if answer {
                    let body = req.into_body().collect_bytes().await.unwrap_or_default();
                    let mut answer = Response::new(Body::from(body.to_vec()));
                    *answer.status_mut() = http::StatusCode::CREATED;
                    send.send_response(answer);
                } else {
                    held.push(send);
                    kept.push(req);
                }
            }
            drop(held);
            kept
        });
        (Client::new(mock, "default"), task)
    }

    fn recorder(client: Client) -> Recorder {
        Recorder::new(
            client,
            Reporter {
                controller: "raygate".into(),
                instance: Some("test".into()),
            },
        )
    }

    #[tokio::test]
    async fn queued_events_are_all_sent() {
        let (client, task) = apiserver(true);
        let metrics = Arc::new(Metrics::new().unwrap());
        let q = EventQueue::start(recorder(client), Arc::new(Fence::open()), metrics.clone());
        for i in 0..10 {
            let (ev, on) = event(i);
            q.send(ev, on);
        }
        q.drained().await;
        for why in EventDrop::ALL {
            assert_eq!(dropped(&metrics, why), 0, "{why:?}");
        }
        drop(q);
        task.abort();
    }

    /// The apiserver answers nothing: IN_FLIGHT Events wait on it, CAPACITY
    /// wait in the queue, and the rest are dropped, each counted.
    #[tokio::test]
    async fn a_full_queue_drops_the_newest_events_and_counts_them() {
        let (client, _task) = apiserver(false);
        let metrics = Arc::new(Metrics::new().unwrap());
        let q = EventQueue::start(recorder(client), Arc::new(Fence::open()), metrics.clone());
        for i in 0..IN_FLIGHT {
            let (ev, on) = event(i);
            q.send(ev, on);
        }
        // Let the task take the first ones in flight.
        tokio::time::sleep(Duration::from_millis(100)).await;
        for i in 0..CAPACITY + 7 {
            let (ev, on) = event(i);
            q.send(ev, on);
        }
        assert_eq!(dropped(&metrics, EventDrop::QueueFull), 7);
    }

    #[tokio::test]
    async fn a_replica_without_the_lease_sends_no_queued_event() {
        let (client, task) = apiserver(true);
        let metrics = Arc::new(Metrics::new().unwrap());
        let fence = Arc::new(Fence::closed(Duration::from_secs(4)));
        let q = EventQueue::start(recorder(client), fence, metrics.clone());
        for i in 0..3 {
            let (ev, on) = event(i);
            q.send(ev, on);
        }
        q.drained().await;
        assert_eq!(dropped(&metrics, EventDrop::NotLeader), 3);
        drop(q);
        let sent = task.await.unwrap_or_default();
        assert!(sent.is_empty());
    }
}
