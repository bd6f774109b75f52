//! The client side: the CA that signed the servers' certificates
//! (`--worker-tls-ca-file`) and optionally this client's own certificate
//! and key for servers that ask for one (`--worker-tls-cert-file`,
//! `--worker-tls-key-file`: mutual TLS). Read once, at start.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio_rustls::TlsConnector;

use super::{pair, provider, PemFile};

/// The files of a client's TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFiles {
    pub ca: PemFile,
    /// This client's certificate and key (mutual TLS).
    pub identity: Option<(PemFile, PemFile)>,
}

impl ClientFiles {
    /// The files of `--worker-tls-ca-file`, `--worker-tls-cert-file` and
    /// `--worker-tls-key-file`: `None` without a CA; a certificate
    /// without its key (or the reverse), or either without a CA, is an
    /// error naming the flag.
    pub fn from_flags(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<ClientFiles>, String> {
        let identity = pair(
            ("--worker-tls-cert-file", cert),
            ("--worker-tls-key-file", key),
        )?;
        match ca {
            Some(ca) => Ok(Some(ClientFiles {
                ca: PemFile::new("--worker-tls-ca-file", ca),
                identity,
            })),
            None if identity.is_some() => Err(
                "--worker-tls-cert-file needs --worker-tls-ca-file (the CA that signed the workers' certificates)"
                    .to_owned(),
            ),
            None => Ok(None),
        }
    }
}

/// A client's TLS configuration; clones share it.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    files: Arc<ClientFiles>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Reads and checks `files`; the handshakes offer `alpn`.
    pub fn load(files: &ClientFiles, alpn: &[&[u8]]) -> Result<ClientTls, String> {
        let provider = provider();
        let roots = files.ca.roots()?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS settings: {e}"))?
            .with_root_certificates(roots);
        let mut config = match &files.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = cert.certificates(&cert.read()?)?;
                let private = key.private_key(&key.read()?)?;
                builder
                    .with_client_auth_cert(chain, private)
                    .map_err(|e| format!("{key} with {cert}: {e}"))?
            }
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(ClientTls {
            config: Arc::new(config),
            files: Arc::new(files.clone()),
        })
    }

    /// The connector of new connections' handshakes.
    pub fn connector(&self) -> TlsConnector {
        TlsConnector::from(self.config.clone())
    }

    /// The name a server at `host` (a DNS name or an IP address, IPv6 in
    /// brackets or not) must carry in its certificate.
    pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(bare.to_owned())
            .map_err(|e| format!("{host}: not a name a TLS certificate can carry ({e})"))
    }
}
