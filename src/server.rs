//! The operator's small HTTP server: Prometheus scrape and kubelet probes.
//!
//! - `GET /metrics`: [`Metrics::render`], `text/plain; version=0.0.4`.
//! - `GET /healthz`: liveness, 200 `ok` as long as the process can answer.
//!   It deliberately checks nothing else: a restart would not fix a slow
//!   API server, it would only add load to it.
//! - `GET /readyz`: readiness, see [`Health::readiness`].
//!
//! Nothing here needs the Kubernetes API, so probes keep answering while
//! the controller waits for leadership or for the API server.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::{self, Metrics};

/// Process state the probes report, shared between the controller, the
/// leader elector and the server. Plain atomics: probes must never wait on
/// a lock held by a slow reconcile.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    leader: AtomicBool,
}

impl Health {
    pub fn new() -> Health {
        Health::default()
    }

    /// The controller's caches (reflectors) have synced and it is reconciling.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// This replica holds the leader Lease (or election is disabled).
    pub fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    /// What `/readyz` answers: `Ok(text)` for 200, `Err(reason)` for 503.
    ///
    /// The leader is ready once its caches are synced. A standby replica
    /// (not the leader) is reported ready too: it is healthy and will take
    /// over on its own, and if standbys were unready a rolling update (new
    /// pod must be Ready before the old leader is stopped) would never
    /// finish, because the new pod cannot lead while the old one holds
    /// the Lease.
    pub fn readiness(&self) -> Result<&'static str, &'static str> {
        match (self.is_leader(), self.is_ready()) {
            (_, true) => Ok("ok"),
            (false, false) => Ok("ok: standby, waiting for leadership"),
            (true, false) => Err("caches not synced yet"),
        }
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// Binds `addr` (port 0 picks a free port) and returns the bound address.
pub async fn bind(addr: SocketAddr) -> crate::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| server_error(addr, source))?;
    let local = listener
        .local_addr()
        .map_err(|source| server_error(addr, source))?;
    Ok((listener, local))
}

/// Binds `addr` and serves until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> crate::Result<()> {
    let (listener, _) = bind(addr).await?;
    serve_on(listener, metrics, health, shutdown).await
}

/// Serves on an already bound listener (from [`bind`]) until `shutdown`
/// completes; in-flight requests are allowed to finish.
pub async fn serve_on(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> crate::Result<()> {
    let local = listener.local_addr().ok();
    tracing::info!(addr = ?local, "serving /metrics, /healthz, /readyz");
    axum::serve(listener, router(AppState { metrics, health }))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| crate::Error::Server {
            addr: local.map_or_else(|| "?".to_owned(), |a| a.to_string()),
            source,
        })
}

fn server_error(addr: SocketAddr, source: std::io::Error) -> crate::Error {
    crate::Error::Server {
        addr: addr.to_string(),
        source,
    }
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn render_metrics(State(s): State<AppState>) -> Response {
    match s.metrics.render() {
        Ok(body) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "rendering metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, &'static str) {
    match s.health.readiness() {
        Ok(text) => (StatusCode::OK, text),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use tokio::net::TcpStream;

    /// Status code, lower-cased header block and body of one HTTP/1.1 GET.
    /// Uses `try_read`/`try_write` because tokio's `io-util` is not enabled.
    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let s = TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        let mut sent = 0;
        while sent < req.len() {
            s.writable().await.unwrap();
            match s.try_write(&req.as_bytes()[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("write: {e}"),
            }
        }
        let mut raw = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            s.readable().await.unwrap();
            match s.try_read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("read: {e}"),
            }
        }
        let raw = String::from_utf8(raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap();
        (status, head.to_ascii_lowercase(), body.to_owned())
    }

    #[test]
    fn readiness_table() {
        let h = Health::new();
        assert!(h.readiness().is_ok(), "standby before election");
        h.set_leader(true);
        assert_eq!(h.readiness(), Err("caches not synced yet"));
        h.set_ready(true);
        assert_eq!(h.readiness(), Ok("ok"));
        assert!(h.is_ready() && h.is_leader());
    }

    #[tokio::test]
    async fn endpoints_answer_and_shut_down() {
        let metrics = Arc::new(Metrics::new().unwrap());
        let health = Arc::new(Health::new());
        let (listener, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        assert_ne!(addr.port(), 0);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_on(
            listener,
            metrics.clone(),
            health.clone(),
            async move {
                let _ = stopped.await;
            },
        ));

        let (code, head, body) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(
            head.contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert!(body.contains("raygate_build_info{version=\""), "{body}");

        let (code, _, body) = get(addr, "/healthz").await;
        assert_eq!((code, body.as_str()), (200, "ok"));

        health.set_leader(true);
        let (code, _, body) = get(addr, "/readyz").await;
        assert_eq!((code, body.as_str()), (503, "caches not synced yet"));
        health.set_ready(true);
        let (code, _, body) = get(addr, "/readyz").await;
        assert_eq!((code, body.as_str()), (200, "ok"));

        let (code, _, _) = get(addr, "/nope").await;
        assert_eq!(code, 404);

        stop.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
    }

    #[tokio::test]
    async fn bind_reports_address_in_use() {
        let (_held, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let err = bind(addr).await.unwrap_err().to_string();
        assert!(err.contains(&addr.to_string()), "{err}");
    }
}
