//! The TLS plumbing over real loopback handshakes with certificates made
//! in the test: flags given both or neither, errors naming the flag and
//! the file, a reload taken only once the files settle (a bad pair
//! refused, counted once and the old certificate kept), client
//! certificates required when a client CA is given.

use std::path::Path;

use iris_testkit::tls::{Ca, Issued};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::StreamExt;

use super::*;

fn server_files(cert: &Path, key: &Path, client_ca: Option<&Path>) -> ServerFiles {
    ServerFiles::from_flags(Some(cert), Some(key), client_ca)
        .expect("flags")
        .expect("files")
}

/// A TLS server (ALPN h2) answering `b"ok"` to each connection's first
/// byte, on a loopback port.
async fn echo_server(tls: &ServerTls) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut connections = incoming(listener, Some(tls));
    tokio::spawn(async move {
        while let Some(Ok(mut conn)) = connections.next().await {
            tokio::spawn(async move {
                let mut byte = [0u8; 1];
                if conn.read_exact(&mut byte).await.is_ok() {
                    let _ = conn.write_all(b"ok").await;
                    let _ = conn.shutdown().await;
                }
            });
        }
    });
    addr
}

/// Connects to `addr` trusting `ca` (with `identity` as client
/// certificate), sends one byte and reads the answer: the server's
/// certificate, or the error.
async fn exchange(
    addr: std::net::SocketAddr,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Vec<u8>, String> {
    let files =
        ClientFiles::from_flags(Some(ca), identity.map(|(c, _)| c), identity.map(|(_, k)| k))?
            .expect("client files");
    let client = ClientTls::load(&files, &[ALPN_H2])?;
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ClientTls::server_name("127.0.0.1")?;
    let mut tls = client
        .connector()
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let served = tls.get_ref().1.peer_certificates().expect("a certificate")[0].to_vec();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(ALPN_H2));
    tls.write_all(b"?").await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    if answer != b"ok" {
        return Err(format!("answered {answer:?}"));
    }
    Ok(served)
}

#[test]
fn flags_come_in_pairs_and_name_what_is_missing() {
    let p = Path::new("/x");
    assert_eq!(ServerFiles::from_flags(None, None, None), Ok(None));
    let error = ServerFiles::from_flags(Some(p), None, None).unwrap_err();
    assert!(
        error.starts_with("--tls-cert-file needs --tls-key-file"),
        "{error}"
    );
    let error = ServerFiles::from_flags(None, Some(p), None).unwrap_err();
    assert!(
        error.starts_with("--tls-key-file needs --tls-cert-file"),
        "{error}"
    );
    let error = ServerFiles::from_flags(None, None, Some(p)).unwrap_err();
    assert!(error.starts_with("--tls-client-ca-file needs"), "{error}");
    assert_eq!(ClientFiles::from_flags(None, None, None), Ok(None));
    let error = ClientFiles::from_flags(Some(p), Some(p), None).unwrap_err();
    assert!(
        error.starts_with("--worker-tls-cert-file needs --worker-tls-key-file"),
        "{error}"
    );
    let error = ClientFiles::from_flags(None, Some(p), Some(p)).unwrap_err();
    assert!(
        error.starts_with("--worker-tls-cert-file needs --worker-tls-ca-file"),
        "{error}"
    );
}

#[test]
fn bad_files_are_refused_naming_the_flag_and_the_file() {
    let ca = Ca::new("bad");
    let server = ca.server();
    let other = ca.server();
    let (cert, key) = ca.write_pair("server", &server);
    let missing = ca.dir().join("missing.pem");
    let garbage = ca.write("garbage.pem", "not a certificate\n");
    let load = |cert: &Path, key: &Path| {
        ServerTls::load(&server_files(cert, key, None), &[ALPN_H2]).map(drop)
    };
    let error = load(&missing, &key).unwrap_err();
    assert!(
        error.starts_with(&format!(
            "--tls-cert-file {}: cannot read it",
            missing.display()
        )),
        "{error}"
    );
    let error = load(&garbage, &key).unwrap_err();
    assert!(
        error.starts_with(&format!(
            "--tls-cert-file {}: no certificate",
            garbage.display()
        )),
        "{error}"
    );
    let error = load(&cert, &cert).unwrap_err();
    assert!(
        error.starts_with(&format!(
            "--tls-key-file {}: no private key",
            cert.display()
        )),
        "{error}"
    );
    // Another certificate's key.
    let wrong_key = ca.write("other.key", &other.key_pem);
    let error = load(&cert, &wrong_key).unwrap_err();
    assert!(error.contains(&wrong_key.display().to_string()), "{error}");
    assert!(error.contains(&cert.display().to_string()), "{error}");
    load(&cert, &key).expect("the right pair loads");
    // A client CA that is not PEM.
    let files = server_files(&cert, &key, Some(&garbage));
    let error = ServerTls::load(&files, &[]).unwrap_err();
    assert!(error.starts_with("--tls-client-ca-file"), "{error}");
}

#[tokio::test]
async fn a_reload_is_taken_once_the_files_settle_and_a_bad_pair_is_kept_out() {
    let ca = Ca::new("reload");
    let (first, second): (Issued, Issued) = (ca.server(), ca.server());
    let (cert, key) = ca.write_pair("server", &first);
    let tls = ServerTls::load(&server_files(&cert, &key, None), &[ALPN_H2]).expect("loads");
    let addr = echo_server(&tls).await;
    let served = exchange(addr, ca.ca_file(), None).await.expect("handshake");
    assert_eq!(served, first.cert_der);

    // Half a rotation (the new certificate, the old key): not an error
    // while it may still be being written...
    ca.write_pair(
        "server",
        &Issued {
            key_pem: first.key_pem.clone(),
            ..second.clone()
        },
    );
    tls.look_now();
    assert_eq!(tls.reloads(), (0, 0));
    // ...then the key arrives: taken on the second look at it.
    ca.write_pair("server", &second);
    tls.look_now();
    assert_eq!(tls.reloads(), (0, 0), "a change is taken when seen twice");
    tls.look_now();
    assert_eq!(tls.reloads(), (1, 0));
    let served = exchange(addr, ca.ca_file(), None).await.expect("handshake");
    assert_eq!(
        served, second.cert_der,
        "new handshakes get the new certificate"
    );

    // A broken file that stays: refused once, the loaded certificate kept.
    ca.write(
        "server.crt",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    for _ in 0..4 {
        tls.look_now();
    }
    assert_eq!(tls.reloads(), (1, 1));
    let served = exchange(addr, ca.ca_file(), None).await.expect("handshake");
    assert_eq!(served, second.cert_der);
    // Removed: refused too (once).
    std::fs::remove_file(&cert).expect("remove");
    for _ in 0..3 {
        tls.look_now();
    }
    assert_eq!(tls.reloads(), (1, 2));
    // Back to the loaded pair: nothing to do.
    ca.write_pair("server", &second);
    tls.look_now();
    tls.look_now();
    assert_eq!(tls.reloads(), (1, 2));
}

#[tokio::test]
async fn an_unknown_ca_and_a_missing_client_certificate_fail_the_handshake() {
    let ca = Ca::new("trusted");
    let stranger = Ca::new("stranger");
    let (cert, key) = ca.write_pair("server", &ca.server());
    let (client_cert, client_key) = ca.write_pair("client", &ca.client("gateway"));
    let (odd_cert, odd_key) = stranger.write_pair("client", &stranger.client("intruder"));

    let open = ServerTls::load(&server_files(&cert, &key, None), &[ALPN_H2]).expect("loads");
    let addr = echo_server(&open).await;
    let error = exchange(addr, stranger.ca_file(), None).await.unwrap_err();
    assert!(error.contains("UnknownIssuer"), "{error}");

    let files = server_files(&cert, &key, Some(ca.ca_file()));
    let mutual = ServerTls::load(&files, &[ALPN_H2]).expect("loads");
    let addr = echo_server(&mutual).await;
    exchange(addr, ca.ca_file(), Some((&client_cert, &client_key)))
        .await
        .expect("a client certificate the CA signed is let in");
    let error = exchange(addr, ca.ca_file(), None).await.unwrap_err();
    assert!(error.to_lowercase().contains("certificate"), "{error}");
    let error = exchange(addr, ca.ca_file(), Some((&odd_cert, &odd_key)))
        .await
        .unwrap_err();
    assert!(!error.is_empty());
}
