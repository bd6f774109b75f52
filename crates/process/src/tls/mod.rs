//! TLS for the Iris binaries (rustls with the ring provider, docs/security.md
//! "TLS"): PEM files read and checked with errors naming the flag and the
//! file ([`PemFile`]); a server side whose certificate is re-read when its
//! files change, without touching open connections ([`server`]); an
//! accept stream for tonic servers that hands over finished handshakes
//! ([`incoming`]); and the client side the gateway dials `grpcs://`
//! workers with ([`client`]).

pub mod client;
pub mod incoming;
pub mod server;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

pub use client::{ClientFiles, ClientTls};
pub use incoming::{incoming, Conn, Incoming};
pub use server::{ServerFiles, ServerTls};
pub use {rustls, tokio_rustls};

/// The ALPN protocol of gRPC (HTTP/2).
pub const ALPN_H2: &[u8] = b"h2";
/// The ALPN protocol of HTTP/1.1.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The one crypto provider every Iris TLS configuration uses (ring, as
/// the rest of the workspace's rustls).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A PEM file named by a flag: every error about it names both.
#[derive(Clone, PartialEq, Eq)]
pub struct PemFile {
    pub flag: &'static str,
    pub path: PathBuf,
}

impl fmt::Debug for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.flag, self.path.display())
    }
}

impl PemFile {
    pub fn new(flag: &'static str, path: &Path) -> PemFile {
        PemFile {
            flag,
            path: path.to_owned(),
        }
    }

    /// The file's bytes.
    pub fn read(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.path).map_err(|e| format!("{self}: cannot read it: {e}"))
    }

    /// The certificates of `pem` (this file's content), at least one.
    fn certificates(&self, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{self}: not a PEM certificate file: {e}"))?;
        if certs.is_empty() {
            return Err(format!(
                "{self}: no certificate in it (expected PEM `-----BEGIN CERTIFICATE-----` blocks)"
            ));
        }
        Ok(certs)
    }

    /// The private key of `pem` (this file's content).
    fn private_key(&self, pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
        PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
            format!("{self}: no private key in it (expected a PEM PKCS#8, PKCS#1 or SEC1 key): {e}")
        })
    }

    /// The CA certificates of this file, as a trust store.
    fn roots(&self) -> Result<RootCertStore, String> {
        let mut roots = RootCertStore::empty();
        for cert in self.certificates(&self.read()?)? {
            roots
                .add(cert)
                .map_err(|e| format!("{self}: not a usable CA certificate: {e}"))?;
        }
        Ok(roots)
    }
}

/// The TLS of a gRPC server's `--tls-cert-file`, `--tls-key-file` and
/// `--tls-client-ca-file` (ALPN `h2`), read and checked; `None` without
/// them.
pub fn server_flags(
    cert: Option<&Path>,
    key: Option<&Path>,
    client_ca: Option<&Path>,
) -> Result<Option<ServerTls>, String> {
    ServerFiles::from_flags(cert, key, client_ca)?
        .map(|files| ServerTls::load(&files, &[ALPN_H2]))
        .transpose()
}

/// A certificate file and its key file, given both or neither: `None`
/// when neither is, an error naming the missing flag when one is alone.
fn pair(
    cert: (&'static str, Option<&Path>),
    key: (&'static str, Option<&Path>),
) -> Result<Option<(PemFile, PemFile)>, String> {
    match (cert.1, key.1) {
        (None, None) => Ok(None),
        (Some(c), Some(k)) => Ok(Some((PemFile::new(cert.0, c), PemFile::new(key.0, k)))),
        (Some(_), None) => Err(format!("{} needs {} (its private key)", cert.0, key.0)),
        (None, Some(_)) => Err(format!("{} needs {} (its certificate)", key.0, cert.0)),
    }
}

#[cfg(test)]
mod tests;
