//! HTTPS for `/metrics`, as kubebuilder operators serve it: the certificate
//! comes from a directory holding `tls.crt` and `tls.key` (a mounted
//! `kubernetes.io/tls` Secret, e.g. from cert-manager), re-read when the files
//! change so a rotated certificate is picked up without a restart; without a
//! directory a self-signed certificate is generated at start. rustls with the
//! ring provider kube already uses: no OpenSSL.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::{Error, Result};

/// File names in the certificate directory, those of a `kubernetes.io/tls` Secret.
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// How often the certificate directory is checked for a rotated certificate
/// (cert-manager renews well before expiry; the kubelet updates a mounted
/// Secret within about a minute anyway).
const RELOAD_EVERY: Duration = Duration::from_secs(30);
/// A client that opens a connection and never finishes the handshake must not
/// hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn invalid(field: &str, reason: impl std::fmt::Display) -> Error {
    Error::invalid(field, reason.to_string())
}

/// The certificate and key in `dir` (`tls.crt`: the chain, leaf first;
/// `tls.key`: PKCS#8, PKCS#1 or SEC1 PEM). Errors name the file.
pub fn load_dir(dir: &Path) -> Result<CertifiedKey> {
    let (cert_path, key_path) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
    let field = |p: &Path| format!("--metrics-cert-dir: {}", p.display());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
        .map_err(|e| invalid(&field(&cert_path), e))?
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| invalid(&field(&cert_path), e))?;
    if chain.is_empty() {
        return Err(invalid(&field(&cert_path), "no PEM certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| invalid(&field(&key_path), e))?;
    certified(chain, key).map_err(|e| invalid(&field(dir), e))
}

/// A certificate for `names` signed by its own key, for when no certificate is
/// mounted: the traffic is encrypted, but a scraper cannot verify who serves
/// it (`insecureSkipVerify`), as with kubebuilder's default.
pub fn self_signed(names: Vec<String>) -> Result<CertifiedKey> {
    let generated = rcgen::generate_simple_self_signed(names)
        .map_err(|e| invalid("self-signed metrics certificate", e))?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        generated.signing_key.serialize_der(),
    ));
    certified(vec![generated.cert.der().clone()], key)
        .map_err(|e| invalid("self-signed metrics certificate", e))
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> std::result::Result<CertifiedKey, rustls::Error> {
    let key = provider().key_provider.load_private_key(key)?;
    let ck = CertifiedKey::new(chain, key);
    // A key that does not belong to the certificate fails here, at load, not
    // in every handshake.
    ck.keys_match()?;
    Ok(ck)
}

/// The names a self-signed certificate is issued for: loopback, the host name
/// (the pod name in Kubernetes) and the pod IP when the downward API gives it.
pub fn self_signed_names() -> Vec<String> {
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    for var in ["HOSTNAME", "POD_NAME", "POD_IP"] {
        if let Ok(v) = std::env::var(var) {
            let v = v.trim().to_owned();
            if !v.is_empty() && !names.contains(&v) {
                names.push(v);
            }
        }
    }
    names
}

/// Serves the current certificate; [`Certificates::reload_if_changed`]
/// replaces it when the files in the directory change.
#[derive(Debug)]
pub struct Certificates {
    current: RwLock<Arc<CertifiedKey>>,
    dir: Option<PathBuf>,
    stamp: RwLock<Option<Stamp>>,
}

/// What identifies one version of the files: their modification times.
type Stamp = (SystemTime, SystemTime);

fn stamp(dir: &Path) -> Option<Stamp> {
    let modified = |f: &str| {
        std::fs::metadata(dir.join(f))
            .and_then(|m| m.modified())
            .ok()
    };
    Some((modified(CERT_FILE)?, modified(KEY_FILE)?))
}

impl Certificates {
    /// From `dir`, or a self-signed certificate when `dir` is None.
    pub fn new(dir: Option<&Path>) -> Result<Certificates> {
        let (ck, stamp) = match dir {
            Some(d) => (load_dir(d)?, stamp(d)),
            None => (self_signed(self_signed_names())?, None),
        };
        Ok(Certificates {
            current: RwLock::new(Arc::new(ck)),
            dir: dir.map(Path::to_path_buf),
            stamp: RwLock::new(stamp),
        })
    }

    /// Whether the certificate was generated here rather than loaded.
    pub fn is_self_signed(&self) -> bool {
        self.dir.is_none()
    }

    /// Loads the directory again if its files changed since the last load.
    /// A broken new version keeps the old certificate (and is an error to log):
    /// a half-written Secret update must not take the endpoint down.
    pub fn reload_if_changed(&self) -> Result<bool> {
        let Some(dir) = &self.dir else {
            return Ok(false);
        };
        let now = stamp(dir);
        let last = self.stamp.read().map(|s| *s).unwrap_or(None);
        if now.is_none() || now == last {
            return Ok(false);
        }
        let ck = load_dir(dir)?;
        if let Ok(mut c) = self.current.write() {
            *c = Arc::new(ck);
        }
        if let Ok(mut s) = self.stamp.write() {
            *s = now;
        }
        Ok(true)
    }

    fn get(&self) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.clone())
    }

    /// The rustls server configuration serving these certificates (TLS 1.2
    /// and 1.3, HTTP/1.1).
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<ServerConfig>> {
        let mut cfg = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("metrics TLS", e))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }

    /// Checks the directory every `RELOAD_EVERY` until the process ends.
    pub fn spawn_reloader(self: &Arc<Self>) {
        if self.dir.is_none() {
            return;
        }
        let certs = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RELOAD_EVERY).await;
                let Some(c) = certs.upgrade() else { return };
                match c.reload_if_changed() {
                    Ok(true) => tracing::info!("metrics certificate reloaded"),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics certificate not reloaded; keeping the previous one")
                    }
                }
            }
        });
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.get()
    }
}

/// A listener whose connections are TLS: TCP connections are accepted and
/// their handshakes run in parallel (one slow client does not hold up the
/// others); axum gets only connections whose handshake succeeded.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = tokio::select! {
                    // The server is gone: stop accepting and close the port.
                    () = tx.closed() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::debug!(error = %e, "accepting a /metrics connection");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake on /metrics failed");
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake on /metrics timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { rx, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, names: &[&str]) -> rcgen::CertifiedKey<rcgen::KeyPair> {
        let ck = rcgen::generate_simple_self_signed(
            names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        std::fs::write(dir.join(CERT_FILE), ck.cert.pem()).unwrap();
        std::fs::write(dir.join(KEY_FILE), ck.signing_key.serialize_pem()).unwrap();
        ck
    }

    #[test]
    fn a_certificate_directory_loads_and_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_dir(dir.path()).unwrap_err().to_string();
        assert!(
            err.starts_with("--metrics-cert-dir: ") && err.contains("tls.crt"),
            "{err}"
        );
        let ck = write_pair(dir.path(), &["raygate.raygate-system.svc"]);
        let loaded = load_dir(dir.path()).unwrap();
        assert_eq!(loaded.cert[0].as_ref(), ck.cert.der().as_ref());

        std::fs::write(dir.path().join(KEY_FILE), "not a key").unwrap();
        let err = load_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("tls.key"), "{err}");

        // A key of another certificate is refused at load.
        let other = rcgen::KeyPair::generate().unwrap();
        std::fs::write(dir.path().join(KEY_FILE), other.serialize_pem()).unwrap();
        let err = load_dir(dir.path()).unwrap_err().to_string();
        assert!(err.starts_with("--metrics-cert-dir: "), "{err}");
    }

    #[test]
    fn a_self_signed_certificate_is_generated_for_loopback() {
        let names = self_signed_names();
        assert!(names.contains(&"localhost".to_owned()) && names.contains(&"127.0.0.1".to_owned()));
        let ck = self_signed(names).unwrap();
        assert_eq!(ck.cert.len(), 1);
        let certs = Arc::new(Certificates::new(None).unwrap());
        assert!(certs.is_self_signed());
        assert!(!certs.reload_if_changed().unwrap(), "nothing to reload");
        certs.server_config().unwrap();
    }

    #[test]
    fn a_rotated_certificate_is_picked_up_and_a_broken_one_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let first = write_pair(dir.path(), &["a"]);
        let certs = Certificates::new(Some(dir.path())).unwrap();
        assert!(!certs.is_self_signed());
        assert!(!certs.reload_if_changed().unwrap(), "unchanged");
        assert_eq!(
            certs.get().unwrap().cert[0].as_ref(),
            first.cert.der().as_ref()
        );

        // Modification times have a coarse resolution on some filesystems.
        std::thread::sleep(Duration::from_millis(20));
        let second = write_pair(dir.path(), &["b"]);
        let later = SystemTime::now() + Duration::from_secs(2);
        for f in [CERT_FILE, KEY_FILE] {
            std::fs::File::options()
                .write(true)
                .open(dir.path().join(f))
                .unwrap()
                .set_modified(later)
                .unwrap();
        }
        assert!(certs.reload_if_changed().unwrap());
        assert_eq!(
            certs.get().unwrap().cert[0].as_ref(),
            second.cert.der().as_ref()
        );

        std::fs::write(dir.path().join(CERT_FILE), "garbage").unwrap();
        std::fs::File::options()
            .write(true)
            .open(dir.path().join(CERT_FILE))
            .unwrap()
            .set_modified(later + Duration::from_secs(2))
            .unwrap();
        assert!(certs.reload_if_changed().is_err());
        assert_eq!(
            certs.get().unwrap().cert[0].as_ref(),
            second.cert.der().as_ref(),
            "the old certificate is kept"
        );
    }
}
