//! The server side: a certificate and key (`--tls-cert-file`,
//! `--tls-key-file`), optionally a CA whose certificates clients must
//! present (`--tls-client-ca-file`). The certificate is handed to each
//! handshake by [`CurrentCert`], a resolver holding an `Arc` that a
//! reload swaps: connections already open keep the session they made,
//! new handshakes get the new certificate.
//!
//! [`ServerTls::watch`] reads both files every second. A change is taken
//! once the files have stayed the same for one more look (a certificate
//! written before its key is not a broken pair); a pair that does not
//! load (unreadable, not PEM, a key that is not the certificate's) is
//! logged, counted in [`ServerTls::reloads`] and the loaded certificate
//! kept. The client CA is read at start only.

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::{pair, provider, PemFile};

/// How often the certificate files are looked at.
const POLL: Duration = Duration::from_secs(1);

/// The files of a server's TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFiles {
    pub cert: PemFile,
    pub key: PemFile,
    /// Clients must present a certificate this CA signed.
    pub client_ca: Option<PemFile>,
}

impl ServerFiles {
    /// The files of `--tls-cert-file`, `--tls-key-file` and
    /// `--tls-client-ca-file`: `None` without the first two; one of them
    /// alone, or a client CA without them, is an error naming the flag.
    pub fn from_flags(
        cert: Option<&Path>,
        key: Option<&Path>,
        client_ca: Option<&Path>,
    ) -> Result<Option<ServerFiles>, String> {
        let files = pair(("--tls-cert-file", cert), ("--tls-key-file", key))?;
        let client_ca = client_ca.map(|p| PemFile::new("--tls-client-ca-file", p));
        match files {
            Some((cert, key)) => Ok(Some(ServerFiles {
                cert,
                key,
                client_ca,
            })),
            None if client_ca.is_some() => Err(
                "--tls-client-ca-file needs --tls-cert-file and --tls-key-file (client certificates are asked for over TLS)"
                    .to_owned(),
            ),
            None => Ok(None),
        }
    }
}

/// A server's TLS: its configuration (for every listener that serves it)
/// and the certificate it hands out now.
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<ServerConfig>,
    cert: Arc<CurrentCert>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.cert.files.0)
            .field("key", &self.cert.files.1)
            .field("alpn", &self.config.alpn_protocols)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads and checks `files`; the handshakes offer `alpn` (e.g.
    /// [`super::ALPN_H2`] for gRPC).
    pub fn load(files: &ServerFiles, alpn: &[&[u8]]) -> Result<ServerTls, String> {
        let provider = provider();
        let pair = (files.cert.clone(), files.key.clone());
        let (key, bytes) = certified_key(&pair, &provider)?;
        let cert = Arc::new(CurrentCert {
            files: pair,
            provider: provider.clone(),
            key: RwLock::new(key),
            looks: Mutex::new(Looks {
                loaded: Ok(bytes),
                pending: None,
                refused: None,
            }),
            reloaded: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS settings: {e}"))?;
        let builder = match &files.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(ca.roots()?), provider)
                        .build()
                        .map_err(|e| format!("{ca}: {e}"))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_cert_resolver(cert.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(ServerTls {
            config: Arc::new(config),
            cert,
        })
    }

    /// The acceptor of new connections' handshakes.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.clone())
    }

    /// Certificate reloads since start: (taken, refused).
    pub fn reloads(&self) -> (u64, u64) {
        (
            self.cert.reloaded.load(Ordering::Relaxed),
            self.cert.refused.load(Ordering::Relaxed),
        )
    }

    /// Reads the certificate files every second until `stop`, taking a
    /// changed pair once it has settled (on the blocking pool).
    pub fn watch(&self, stop: CancellationToken) {
        let cert = self.cert.clone();
        crate::watch::poll_blocking(POLL, stop, move || cert.look());
    }

    /// Looks at the files once (tests drive reloads with it).
    pub fn look_now(&self) {
        self.cert.look();
    }
}

/// The certificate and key of `files`, checked to belong together, and
/// the bytes they were made from.
fn certified_key(
    files: &(PemFile, PemFile),
    provider: &CryptoProvider,
) -> Result<(Arc<CertifiedKey>, Content), String> {
    let bytes = (files.0.read()?, files.1.read()?);
    let key = built(files, &bytes, provider)?;
    Ok((key, bytes))
}

/// The certificate and key of the files' `bytes`.
fn built(
    files: &(PemFile, PemFile),
    bytes: &Content,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, String> {
    let chain = files.0.certificates(&bytes.0)?;
    let key = files.1.private_key(&bytes.1)?;
    CertifiedKey::from_der(chain, key, provider)
        .map(Arc::new)
        .map_err(|e| format!("{} with {}: {e}", files.1, files.0))
}

/// The two files' bytes (certificate, key).
type Content = (Vec<u8>, Vec<u8>);

/// What the files held at a look: their bytes, or why they could not be
/// read.
type Seen = Result<Content, String>;

/// The certificate handed to new handshakes, and its files.
struct CurrentCert {
    files: (PemFile, PemFile),
    provider: Arc<CryptoProvider>,
    key: RwLock<Arc<CertifiedKey>>,
    looks: Mutex<Looks>,
    reloaded: AtomicU64,
    refused: AtomicU64,
}

/// What the last looks at the files saw.
struct Looks {
    /// What the served certificate was made from.
    loaded: Seen,
    /// A change seen once, taken if the next look sees it again.
    pending: Option<Seen>,
    /// The last content refused (not reported again).
    refused: Option<Seen>,
}

impl fmt::Debug for CurrentCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CurrentCert")
            .field("cert", &self.files.0)
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.key.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

impl CurrentCert {
    /// One look at the files: a change seen twice in a row is loaded, or
    /// refused (logged and counted once per content).
    fn look(&self) {
        let seen: Seen = self
            .files
            .0
            .read()
            .and_then(|cert| Ok((cert, self.files.1.read()?)));
        let mut looks = self.looks.lock().unwrap_or_else(|p| p.into_inner());
        if seen == looks.loaded || Some(&seen) == looks.refused.as_ref() {
            looks.pending = None;
            return;
        }
        if looks.pending.as_ref() != Some(&seen) {
            looks.pending = Some(seen);
            return;
        }
        looks.pending = None;
        let taken = seen
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|bytes| built(&self.files, bytes, &self.provider));
        match taken {
            Ok(key) => {
                *self.key.write().unwrap_or_else(|p| p.into_inner()) = key;
                self.reloaded.fetch_add(1, Ordering::Relaxed);
                tracing::info!(cert = %self.files.0, "TLS certificate reloaded: new connections get it");
                looks.loaded = seen;
                looks.refused = None;
            }
            Err(error) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "TLS certificate files refused: the loaded certificate is kept");
                looks.refused = Some(seen);
            }
        }
    }
}
