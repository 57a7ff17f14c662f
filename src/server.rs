//! The operator's small HTTP servers: Prometheus scrape and kubelet probes,
//! on two ports so that probes stay open while /metrics is protected.
//!
//! - `GET /metrics` ([`serve_metrics`]): [`Metrics::render`],
//!   `text/plain; version=0.0.4`. With [`MetricsAuth`] (the default,
//!   `--metrics-secure`), as kubebuilder operators and kube-rbac-proxy do:
//!   the bearer token is checked with a TokenReview, and the user it names
//!   must be allowed `get` on the non-resource URL `/metrics` by a
//!   SubjectAccessReview. No or an invalid token: 401; not allowed: 403.
//! - `GET /healthz` ([`serve_health`]): liveness, 200 `ok` as long as the
//!   process can answer. It deliberately checks nothing else: a restart
//!   would not fix a slow API server, it would only add load to it.
//! - `GET /readyz`: readiness, see [`Health::readiness`].
//!
//! Probes need nothing from the Kubernetes API, so they keep answering
//! while the controller waits for leadership or for the API server.
//!
//! With `--metrics-secure`, `/metrics` is HTTPS ([`tls`]): the bearer token
//! and the metrics are encrypted in transit. Probes stay plain HTTP, as the
//! kubelet's `httpGet` expects.

pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

use crate::metrics::{self, Metrics};
use crate::sync::lock;

/// Process state the probes report, shared between the controller, the
/// leader elector and the server. Plain atomics: probes must never wait on
/// a lock held by a slow reconcile.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    leader: AtomicBool,
    /// When this process started: `contact` counts milliseconds from it.
    epoch: Instant,
    /// Milliseconds after `epoch` of the last answer from the API server
    /// (a probe of `/version`, a Lease renewal); the start counts as one, so
    /// a process is not unready for its first [`STALE_AFTER`].
    contact: AtomicU64,
    /// `--kueue=true` while Kueue's API or raygate's access to it is
    /// missing ([`crate::kueue::probe::decide`]): cleared once the Kueue
    /// caches sync.
    kueue_missing: AtomicBool,
}

/// What `/readyz` says while [`Health::set_kueue_missing`] holds; the
/// start-up log line names what is missing.
pub const KUEUE_MISSING: &str = "Kueue support is required (--kueue=true) but the Kueue caches have not \
     synced: Kueue v0.19 (kueue.x-k8s.io/v1beta2) or raygate's access to it is missing (see the \
     start-up log)";

impl Default for Health {
    fn default() -> Health {
        Health {
            ready: AtomicBool::new(false),
            leader: AtomicBool::new(false),
            epoch: Instant::now(),
            contact: AtomicU64::new(0),
            kueue_missing: AtomicBool::new(false),
        }
    }
}

/// Not ready once the API server has not answered for this long: raygate
/// cannot decide (it could neither write a status nor a gate), and its caches
/// may be stale. Above the client's own read bound (5 s for a probe) with room
/// for one lost probe.
pub const STALE_AFTER: Duration = Duration::from_secs(15);
/// `/readyz` asks the API server (`GET /version`) only when nothing else
/// showed contact for this long: a kubelet probing every 10 s costs at most
/// one small request per probe, and a process that nobody probes costs none.
pub const PROBE_AFTER: Duration = Duration::from_secs(5);
/// Bound of one `/readyz` probe of the API server: under the chart's
/// readiness `timeoutSeconds` (2), so the kubelet gets an answer, not a timeout.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);

/// The readiness rule, pure: `Ok(text)` for 200, `Err(reason)` for 503.
///
/// Ready means "can decide": the caches have synced (leader) and the API
/// server answered within [`STALE_AFTER`]. A standby replica (not the
/// leader) is reported ready while it reaches the API server: it is healthy
/// and will take over on its own, and if standbys were unready a rolling
/// update (new pod must be Ready before the old leader is stopped) would
/// never finish, because the new pod cannot lead while the old one holds
/// the Lease.
pub fn readiness_rule(
    leader: bool,
    synced: bool,
    since_contact: Duration,
) -> Result<&'static str, &'static str> {
    if since_contact > STALE_AFTER {
        return Err("the API server has not answered for more than 15 s");
    }
    match (leader, synced) {
        (_, true) => Ok("ok"),
        (false, false) => Ok("ok: standby, waiting for leadership"),
        (true, false) => Err("caches not synced yet"),
    }
}

impl Health {
    pub fn new() -> Health {
        Health::default()
    }

    /// The state a process starts in. Without leader election it is the
    /// leader from its first probe: `/readyz` must then fail until its caches
    /// sync, not answer "standby" in the moment before the controller starts
    /// (measured: a restart at 5,000 nodes reported ready in 0.1 s, its
    /// caches synced 55 s later).
    pub fn starting(leader_election: bool) -> Health {
        let h = Health::default();
        h.set_leader(!leader_election);
        h
    }

    /// The API server answered just now.
    pub fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.contact.fetch_max(ms, Ordering::AcqRel);
    }

    /// How long since the API server last answered.
    pub fn since_contact(&self) -> Duration {
        let at = Duration::from_millis(self.contact.load(Ordering::Acquire));
        self.epoch.elapsed().saturating_sub(at)
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

    /// `--kueue=true` and Kueue's API or access missing: the leader is not
    /// ready until it is cleared.
    pub fn set_kueue_missing(&self, missing: bool) {
        self.kueue_missing.store(missing, Ordering::Release);
    }

    pub fn is_kueue_missing(&self) -> bool {
        self.kueue_missing.load(Ordering::Acquire)
    }

    /// What `/readyz` answers now: [`readiness_rule`] over this state, and
    /// a leader without the Kueue support `--kueue=true` requires is not
    /// ready (a standby is: it has nothing to decide yet).
    pub fn readiness(&self) -> Result<&'static str, &'static str> {
        let ok = readiness_rule(self.is_leader(), self.is_ready(), self.since_contact())?;
        if self.is_leader() && self.is_kueue_missing() {
            return Err(KUEUE_MISSING);
        }
        Ok(ok)
    }
}

/// What a scrape may see, decided from its bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    Allowed,
    /// 401: no token, or one the API server does not accept.
    Unauthenticated(String),
    /// 403: a known user without `get` on `/metrics`.
    Forbidden(String),
}

impl Access {
    fn status(&self) -> StatusCode {
        match self {
            Access::Allowed => StatusCode::OK,
            Access::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Access::Forbidden(_) => StatusCode::FORBIDDEN,
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header, if well formed.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// How long a decision is reused: Prometheus scrapes every 15-60 s with the
/// same token, and two API calls per scrape per replica are not worth it;
/// a revoked permission takes effect within this bound.
const AUTH_CACHE_TTL: Duration = Duration::from_secs(30);
/// Bound on remembered tokens (a flood of random tokens must not grow memory).
const AUTH_CACHE_MAX: usize = 256;

/// Authentication and authorization of `/metrics` against the API server.
pub struct MetricsAuth {
    client: kube::Client,
    cache: Mutex<HashMap<[u8; 32], (Instant, Access)>>,
}

impl MetricsAuth {
    /// `client` should be bounded by a timeout: a scrape must not hang.
    pub fn new(client: kube::Client) -> MetricsAuth {
        MetricsAuth {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The decision for this request's headers (cached per token).
    pub async fn check(&self, headers: &HeaderMap) -> Access {
        let Some(token) = bearer_token(headers) else {
            return Access::Unauthenticated("no bearer token".into());
        };
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some((until, access)) = lock(&self.cache).get(&key)
            && *until > now
        {
            return access.clone();
        }
        let access = match self.review(token).await {
            Ok(a) => a,
            Err(e) => {
                // Not cached: the API server may answer the next scrape.
                tracing::warn!(error = %e, "checking a /metrics token");
                return Access::Unauthenticated(format!("token could not be checked: {e}"));
            }
        };
        {
            let mut cache = lock(&self.cache);
            if cache.len() >= AUTH_CACHE_MAX {
                cache.retain(|_, (until, _)| *until > now);
                if cache.len() >= AUTH_CACHE_MAX {
                    cache.clear();
                }
            }
            cache.insert(key, (now + AUTH_CACHE_TTL, access.clone()));
        }
        access
    }

    async fn review(&self, token: &str) -> Result<Access, kube::Error> {
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let status = reviews
            .create(&PostParams::default(), &review)
            .await?
            .status
            .unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => {
                return Ok(Access::Unauthenticated(
                    status.error.unwrap_or_else(|| "token not accepted".into()),
                ));
            }
        };
        let name = user.username.clone().unwrap_or_default();
        let sars: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let decision = sars
            .create(&PostParams::default(), &sar)
            .await?
            .status
            .unwrap_or_default();
        Ok(if decision.allowed {
            Access::Allowed
        } else {
            Access::Forbidden(format!("{name} may not get /metrics"))
        })
    }
}

#[derive(Clone)]
struct MetricsState {
    metrics: Arc<Metrics>,
    auth: Option<Arc<MetricsAuth>>,
}

/// Binds `addr` (port 0 picks a free port) and returns the bound address.
pub async fn bind(addr: SocketAddr) -> crate::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| server_error(Some(addr), source))?;
    let local = listener
        .local_addr()
        .map_err(|source| server_error(Some(addr), source))?;
    Ok((listener, local))
}

/// Serves `/metrics` on an already bound listener (from [`bind`]) until
/// `shutdown` completes; `auth` None serves it to anyone (`--metrics-secure=false`),
/// `tls` Some serves HTTPS only.
pub async fn serve_metrics(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    auth: Option<Arc<MetricsAuth>>,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> crate::Result<()> {
    let router = Router::new()
        .route("/metrics", get(render_metrics))
        .with_state(MetricsState { metrics, auth });
    match tls {
        None => serve(listener, router, shutdown).await,
        Some(config) => {
            let local = listener.local_addr().ok();
            let listener = tls::TlsListener::new(listener, config)
                .map_err(|source| server_error(local, source))?;
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(|source| server_error(local, source))
        }
    }
}

/// What `/readyz` needs: the state, and a client to ask the API server when
/// nothing else showed contact lately (`None` in tests of the rule alone).
#[derive(Clone)]
struct Probes {
    health: Arc<Health>,
    client: Option<kube::Client>,
}

/// Serves `/healthz` and `/readyz`, never authenticated (kubelet probes).
/// `client` is asked for `/version` by `/readyz` when the API server has not
/// answered for [`PROBE_AFTER`]; give it a short read timeout.
pub async fn serve_health(
    listener: TcpListener,
    health: Arc<Health>,
    client: Option<kube::Client>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> crate::Result<()> {
    let router = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(Probes { health, client });
    serve(listener, router, shutdown).await
}

async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> crate::Result<()> {
    let local = listener.local_addr().ok();
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| server_error(local, source))
}

/// `addr` is `None` when the listener could not say where it is bound.
fn server_error(addr: Option<SocketAddr>, source: std::io::Error) -> crate::Error {
    crate::Error::Server {
        addr: addr.map_or_else(|| "?".to_owned(), |a| a.to_string()),
        source,
    }
}

async fn render_metrics(State(s): State<MetricsState>, headers: HeaderMap) -> Response {
    if let Some(auth) = &s.auth {
        let access = auth.check(&headers).await;
        match &access {
            Access::Allowed => {}
            Access::Unauthenticated(why) | Access::Forbidden(why) => {
                tracing::debug!(reason = %why, "/metrics refused");
                let mut resp = (access.status(), format!("{why}\n")).into_response();
                if access.status() == StatusCode::UNAUTHORIZED {
                    resp.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        header::HeaderValue::from_static("Bearer"),
                    );
                }
                return resp;
            }
        }
    }
    match s.metrics.render() {
        Ok(body) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "rendering metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

async fn readyz(State(p): State<Probes>) -> (StatusCode, &'static str) {
    let h = &p.health;
    if let Some(client) = &p.client
        && h.since_contact() > PROBE_AFTER
    {
        match tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await {
            Ok(Ok(_)) => h.touch(),
            Ok(Err(e)) => tracing::debug!(error = %e, "/readyz: the API server did not answer"),
            Err(_) => {
                tracing::debug!(timeout = ?PROBE_TIMEOUT, "/readyz: the API server did not answer in time")
            }
        }
    }
    match h.readiness() {
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
        // --kueue=true without Kueue: the leader is not ready until the
        // Kueue caches sync; a standby is.
        h.set_kueue_missing(true);
        assert_eq!(h.readiness(), Err(KUEUE_MISSING));
        h.set_leader(false);
        assert!(h.readiness().is_ok());
        h.set_leader(true);
        h.set_kueue_missing(false);
        assert_eq!(h.readiness(), Ok("ok"));
        h.touch();
        assert!(h.since_contact() < STALE_AFTER);
    }

    /// Ready means "can decide": an API server silent for longer than
    /// STALE_AFTER makes every replica unready, synced or not, and the
    /// next answer makes it ready again.
    #[test]
    fn an_api_server_silent_past_the_bound_is_not_ready() {
        let fresh = STALE_AFTER - Duration::from_millis(1);
        let stale = STALE_AFTER + Duration::from_millis(1);
        for (leader, synced) in [(true, true), (true, false), (false, false), (false, true)] {
            assert!(
                readiness_rule(leader, synced, stale).is_err(),
                "{leader} {synced}"
            );
        }
        assert_eq!(readiness_rule(true, true, fresh), Ok("ok"));
        assert_eq!(readiness_rule(true, true, STALE_AFTER), Ok("ok"));
        assert!(readiness_rule(false, false, fresh).is_ok());
        assert_eq!(
            readiness_rule(true, false, fresh),
            Err("caches not synced yet")
        );
        assert!(
            PROBE_AFTER + PROBE_TIMEOUT < STALE_AFTER,
            "a probe answers before unready"
        );
    }

    /// Without leader election a starting process is not ready until its
    /// caches sync (it is no standby); with it, it is a standby until it
    /// takes the Lease.
    #[test]
    fn a_process_without_leader_election_is_not_ready_before_its_caches_sync() {
        let h = Health::starting(false);
        h.touch();
        assert_eq!(h.readiness(), Err("caches not synced yet"));
        h.set_ready(true);
        assert_eq!(h.readiness(), Ok("ok"));
        let h = Health::starting(true);
        h.touch();
        assert_eq!(h.readiness(), Ok("ok: standby, waiting for leadership"));
    }

    /// `/readyz` with a client that cannot reach any API server: ready
    /// while the process is young, then the probe fails and it stays 200
    /// only as long as the last contact is within the bound.
    #[tokio::test]
    async fn readyz_probes_the_api_server_when_contact_is_old() {
        let health = Arc::new(Health::new());
        health.set_leader(true);
        health.set_ready(true);
        // A client to a closed port: every probe fails at once.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let mut config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
        config.connect_timeout = Some(Duration::from_millis(200));
        let client = kube::Client::try_from(config).unwrap();
        let probes = Probes {
            health: health.clone(),
            client: Some(client),
        };
        // Contact set far in the past: the probe runs, fails, and the answer is 503.
        let old = Health {
            epoch: Instant::now() - STALE_AFTER - Duration::from_secs(1),
            ..Health::default()
        };
        old.set_leader(true);
        old.set_ready(true);
        let stale = Probes {
            health: Arc::new(old),
            client: probes.client.clone(),
        };
        let (code, body) = readyz(State(stale)).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        // A young process is ready although the probe fails.
        let (code, _) = readyz(State(probes)).await;
        assert_eq!(code, StatusCode::OK);
    }

    #[tokio::test]
    async fn endpoints_answer_on_their_ports_and_shut_down() {
        let metrics = Arc::new(Metrics::new().unwrap());
        let health = Arc::new(Health::new());
        let (m_listener, m_addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let (h_listener, h_addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        assert_ne!(m_addr.port(), 0);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|v| *v).await;
        };
        let m_task = tokio::spawn(serve_metrics(
            m_listener,
            metrics.clone(),
            None,
            None,
            until(stopped.clone()),
        ));
        let h_task = tokio::spawn(serve_health(
            h_listener,
            health.clone(),
            None,
            until(stopped),
        ));

        let (code, head, body) = get(m_addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(
            head.contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert!(body.contains("raygate_build_info{version=\""), "{body}");
        assert_eq!(
            get(m_addr, "/healthz").await.0,
            404,
            "probes on their own port"
        );

        let (code, _, body) = get(h_addr, "/healthz").await;
        assert_eq!((code, body.as_str()), (200, "ok"));
        assert_eq!(get(h_addr, "/metrics").await.0, 404);

        health.set_leader(true);
        let (code, _, body) = get(h_addr, "/readyz").await;
        assert_eq!((code, body.as_str()), (503, "caches not synced yet"));
        health.set_ready(true);
        let (code, _, body) = get(h_addr, "/readyz").await;
        assert_eq!((code, body.as_str()), (200, "ok"));

        stop.send(true).unwrap();
        for task in [m_task, h_task] {
            tokio::time::timeout(std::time::Duration::from_secs(5), task)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
        }
        assert!(TcpStream::connect(m_addr).await.is_err(), "listener closed");
    }

    /// One HTTPS GET with a rustls client that trusts only `ca`: (status, body).
    async fn get_tls(
        addr: SocketAddr,
        ca: &rustls::pki_types::CertificateDer<'static>,
        path: &str,
    ) -> std::io::Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone()).map_err(std::io::Error::other)?;
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
        let tcp = TcpStream::connect(addr).await?;
        let name =
            rustls::pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
        let mut tls = connector.connect(name, tcp).await?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        tls.write_all(req.as_bytes()).await?;
        let mut raw = Vec::new();
        // The server may close without close_notify after `Connection: close`.
        let _ = tls.read_to_end(&mut raw).await;
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((status, body.to_owned()))
    }

    /// What a plain-HTTP client reads back: everything until the server closes.
    async fn plain_answer(addr: SocketAddr) -> Vec<u8> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await;
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw).await;
        raw
    }

    #[tokio::test]
    async fn metrics_over_tls_answer_https_only() {
        let dir = tempfile::tempdir().unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        std::fs::write(dir.path().join(tls::CERT_FILE), ck.cert.pem()).unwrap();
        std::fs::write(
            dir.path().join(tls::KEY_FILE),
            ck.signing_key.serialize_pem(),
        )
        .unwrap();
        let certs = Arc::new(tls::Certificates::new(Some(dir.path())).unwrap());
        let (listener, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(serve_metrics(
            listener,
            Arc::new(Metrics::new().unwrap()),
            None,
            Some(certs.server_config().unwrap()),
            async move {
                let _ = stopped.wait_for(|v| *v).await;
            },
        ));
        let (code, body) = get_tls(addr, ck.cert.der(), "/metrics").await.unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("raygate_build_info"), "{body}");

        // A client that trusts another CA refuses the server.
        let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        assert!(get_tls(addr, other.cert.der(), "/metrics").await.is_err());

        // Plain HTTP gets no HTTP answer: the port only speaks TLS.
        let plain = tokio::time::timeout(Duration::from_secs(5), plain_answer(addr))
            .await
            .unwrap();
        assert!(!plain.starts_with(b"HTTP/"), "{plain:?}");

        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
    }

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header_only() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert_eq!(bearer_token(&with("Bearer abc.def")), Some("abc.def"));
        assert_eq!(bearer_token(&with("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(&with("Basic dXNlcjpwdw==")), None);
        assert_eq!(bearer_token(&with("Bearer ")), None);
        assert_eq!(bearer_token(&with("Bearer")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
        assert_eq!(Access::Allowed.status(), StatusCode::OK);
        assert_eq!(
            Access::Unauthenticated(String::new()).status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            Access::Forbidden(String::new()).status(),
            StatusCode::FORBIDDEN
        );
    }

    #[tokio::test]
    async fn a_scrape_without_a_token_is_refused_before_any_api_call() {
        // A client that points nowhere: no token must not reach the API.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let auth = MetricsAuth::new(kube::Client::try_from(config).unwrap());
        assert!(matches!(
            auth.check(&HeaderMap::new()).await,
            Access::Unauthenticated(_)
        ));
    }

    #[tokio::test]
    async fn bind_reports_address_in_use() {
        let (_held, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let err = bind(addr).await.unwrap_err().to_string();
        assert!(err.contains(&addr.to_string()), "{err}");
    }
}
