//! Certificates made in the test: a CA ([`Ca`]) and the server and client
//! certificates it signs ([`Issued`]), as PEM text and as files in a
//! temporary directory, for TLS tests of the binaries' `--tls-*` flags.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The names a test server's certificate carries: every loopback form.
pub const SERVER_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// A certificate authority made for one test, with a directory its
/// files are written to.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
    dir: tempfile::TempDir,
    ca_file: PathBuf,
}

/// A certificate the CA signed and its private key.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    /// The certificate as sent in a handshake.
    pub cert_der: Vec<u8>,
}

impl Ca {
    /// A new CA named `name`; its certificate is written to `NAME-ca.pem`.
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_file = dir.path().join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, cert.pem()).expect("write the CA's file");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
            dir,
            ca_file,
        }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// Where its files are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The file of the CA's certificate.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// A server certificate for [`SERVER_NAMES`].
    pub fn server(&self) -> Issued {
        self.issue(
            "test server",
            &SERVER_NAMES,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate for `name`.
    pub fn client(&self, name: &str) -> Issued {
        self.issue(name, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, name: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> Issued {
        let key = KeyPair::generate().expect("key");
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
        }
    }

    /// Writes `text` to the file `name` of the CA's directory.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir().join(name);
        std::fs::write(&path, text).expect("write a PEM file");
        path
    }

    /// Writes `issued` as `STEM.crt` and `STEM.key`: (certificate, key).
    pub fn write_pair(&self, stem: &str, issued: &Issued) -> (PathBuf, PathBuf) {
        (
            self.write(&format!("{stem}.crt"), &issued.cert_pem),
            self.write(&format!("{stem}.key"), &issued.key_pem),
        )
    }
}
