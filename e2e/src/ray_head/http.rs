//! The HTTP/1.1 shell: a forward proxy that answers absolute-form requests itself as the Ray
//! head they name, and serves the `/_e2e/*` observation API to origin-form requests.

use super::dispatch::{Clock, Registry, Reply, Req};
use super::route::{self, RouteError};
use super::world::World;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;

/// aiohttp's default `client_max_size` (1 MiB): Ray's dashboard refuses bigger bodies with 413.
pub const MAX_BODY: usize = 1024 * 1024;
/// Watches may lag the operator by a moment; a proxied request waits this long for the head
/// to appear before failing like an unreachable host (KubeRay's client gives up after 2 s).
const ROUTE_PATIENCE: Duration = Duration::from_millis(1000);
const ROUTE_RETRY: Duration = Duration::from_millis(100);

pub struct Shared {
    pub world: World,
    pub registry: Mutex<Registry>,
    pub deploy_delay: Duration,
    pub cluster_domain: String,
}

impl Shared {
    fn clock(&self) -> Clock {
        Clock {
            now: Instant::now(),
            unix_s: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            deploy_delay: self.deploy_delay,
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic while holding the lock cannot leave the registry half-updated in a way
        // that matters to tests; keep serving.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Accepts connections until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => return,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(&shared, req).await) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

fn respond(r: Reply) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = Response::new(Full::new(Bytes::from(r.body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(r.content_type),
    );
    resp
}

fn text(status: u16, body: impl Into<String>) -> Response<Full<Bytes>> {
    respond(Reply {
        status,
        content_type: "text/plain; charset=utf-8",
        body: body.into(),
    })
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() == Method::CONNECT {
        return text(
            405,
            "ray-head answers plain-HTTP proxy requests only (no CONNECT)",
        );
    }
    match req.uri().authority().cloned() {
        Some(authority) => {
            if req.uri().scheme_str().is_some_and(|s| s != "http") {
                return text(400, "ray-head proxies http:// URLs only");
            }
            let host = authority.host().to_string();
            let port = authority.port_u16().unwrap_or(80);
            proxied(shared, req, &host, port).await
        }
        None => observation(shared, &req),
    }
}

fn observation(shared: &Shared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/_e2e/healthz") => text(200, "ok"),
        (&Method::GET, "/_e2e/clusters") => {
            let known = shared.world.known_clusters();
            let v = shared.registry().observe(&known, shared.clock());
            respond(Reply {
                status: 200,
                content_type: "application/json",
                body: v.to_string(),
            })
        }
        _ => text(
            404,
            "ray-head: unknown observation endpoint (GET /_e2e/clusters, /_e2e/healthz)",
        ),
    }
}

async fn proxied(
    shared: &Shared,
    req: Request<Incoming>,
    host: &str,
    port: u16,
) -> Response<Full<Bytes>> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            tracing::warn!(%method, host, port, path, "request body over 1 MiB refused");
            return text(413, "413: Request Entity Too Large");
        }
        Err(e) => return text(400, format!("ray-head: reading the request body: {e}")),
    };
    let deadline = Instant::now() + ROUTE_PATIENCE;
    let target = loop {
        let (services, pods) = shared.world.routing_snapshot();
        match route::route(host, port, &shared.cluster_domain, &services, &pods) {
            Ok(t) => break Ok(t),
            Err(e) if Instant::now() >= deadline => break Err(e),
            Err(_) => tokio::time::sleep(ROUTE_RETRY).await,
        }
    };
    let result = target.and_then(|t| {
        let (control, warnings) = shared.world.control_for(&t.namespace, &t.cluster);
        for w in warnings {
            tracing::warn!(cluster = %format!("{}/{}", t.namespace, t.cluster), "{w}");
        }
        let r = {
            let mut reg = shared.registry();
            reg.prune(|ns, n| shared.world.cluster_exists(ns, n));
            reg.handle(
                &t,
                &control,
                &Req {
                    method: &method,
                    path: &path,
                    body: &body,
                },
                shared.clock(),
            )
        };
        r.map(|reply| (t, reply))
    });
    match result {
        Ok((t, reply)) => {
            tracing::info!(
                %method, host, port, path, status = reply.status,
                cluster = %format!("{}/{}", t.namespace, t.cluster), role = ?t.role,
                "answered as Ray"
            );
            respond(reply)
        }
        Err(e) => {
            tracing::info!(%method, host, port, path, status = 502, error = %e, "unreachable");
            bad_gateway(&e, host, port)
        }
    }
}

/// What a forward proxy says when it cannot connect (Go's client then returns a non-2xx).
fn bad_gateway(e: &RouteError, host: &str, port: u16) -> Response<Full<Bytes>> {
    text(502, format!("ray-head: cannot reach {host}:{port}: {e}"))
}
