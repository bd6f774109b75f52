//! TLS over real listeners, reference engines and certificates made in
//! the test: the HTTP port serves HTTPS (a client trusting the right CA
//! gets answers, one trusting another CA fails the handshake, a plain
//! HTTP client gets nothing); with a client CA, clients without a
//! certificate it signed are refused; the certificate is reloaded when
//! its files change while a kept-alive connection goes on with the one it
//! made, and a broken pair is refused, counted, the loaded one kept;
//! `grpcs://` workers are reached with a CA and with mutual TLS, and a
//! wrong CA keeps them out of service; flags given alone or naming bad
//! files stop the start naming them.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use iris_engine::{Role, RunningEngine};
use iris_gateway::RunningGateway;
use iris_process::tls::tokio_rustls::client::TlsStream;
use iris_process::tls::{ClientFiles, ClientTls, ALPN_HTTP1};
use iris_testkit::tls::{Ca, Issued};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A path as a command-line word.
fn word(path: &Path) -> String {
    path.display().to_string()
}

/// The gateway flags serving `cert`/`key` (and asking for client
/// certificates of `client_ca`), metrics on a plain port of their own.
fn https_flags(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Vec<String> {
    let mut flags = vec![
        "--tls-cert-file".into(),
        word(cert),
        "--tls-key-file".into(),
        word(key),
        "--metrics-port".into(),
        "0".into(),
    ];
    if let Some(ca) = client_ca {
        flags.extend(["--tls-client-ca-file".into(), word(ca)]);
    }
    flags
}

/// A gateway over `worker` with `flags`.
async fn gateway_with(model: &Model, worker: &RunningEngine, flags: &[String]) -> RunningGateway {
    let mut args = vec!["--worker-urls".to_string(), grpc(worker.grpc_addr)];
    args.extend(flags.iter().cloned());
    gateway(model, &args).await
}

/// An HTTPS connection to `addr` trusting `ca`, presenting `identity`.
async fn connect(
    addr: SocketAddr,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<TlsStream<TcpStream>, String> {
    let files = ClientFiles::from_flags(Some(ca), identity.map(|i| i.0), identity.map(|i| i.1))?
        .expect("a CA");
    let tls = ClientTls::load(&files, &[ALPN_HTTP1])?;
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ClientTls::server_name("localhost")?;
    tls.connector()
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())
}

/// The certificate the server presented on `conn`.
fn served(conn: &TlsStream<TcpStream>) -> Vec<u8> {
    conn.get_ref().1.peer_certificates().expect("a certificate")[0].to_vec()
}

/// One HTTP/1.1 request on `conn` (kept alive): status and body.
async fn request(
    conn: &mut TlsStream<TcpStream>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let io = |e: std::io::Error| e.to_string();
    conn.write_all(head.as_bytes()).await.map_err(io)?;
    conn.write_all(body.as_bytes()).await.map_err(io)?;
    conn.flush().await.map_err(io)?;
    let mut reader = BufReader::new(conn);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).await.map_err(io)?;
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line: {status_line:?}"))?;
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.map_err(io)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad length: {line}"))?;
            }
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).await.map_err(io)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `GET /health` on a new connection: the certificate it was served.
async fn health(
    addr: SocketAddr,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Vec<u8>, String> {
    let mut conn = connect(addr, ca, identity).await?;
    let (status, body) = request(&mut conn, "GET", "/health", None).await?;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
    Ok(served(&conn))
}

/// The gateway's metrics (on its plain `--metrics-port`).
async fn metrics(gw: &RunningGateway) -> String {
    iris_testkit::http::metrics(gw.metrics_addr.expect("a metrics port")).await
}

/// Waits (at most 10 s) until the metrics sample `name` reads `value`.
async fn wait_for_sample(gw: &RunningGateway, name: &str, value: f64) {
    for _ in 0..200 {
        if iris_testkit::http::sample(&metrics(gw).await, name) == value {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} never reached {value}:\n{}", metrics(gw).await);
}

#[tokio::test]
async fn https_answers_clients_trusting_its_ca_and_no_one_else() {
    let model = tiny_model();
    let ca = Ca::new("gateway");
    let stranger = Ca::new("stranger");
    let issued = ca.server();
    let (cert, key) = ca.write_pair("gateway", &issued);
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = gateway_with(&model, &worker, &https_flags(&cert, &key, None)).await;

    assert_eq!(
        health(gw.addr, ca.ca_file(), None).await.expect("HTTPS"),
        issued.cert_der
    );
    ready_on_metrics_port(&gw).await;
    // A chat over HTTPS, the connection kept for a second request.
    let mut conn = connect(gw.addr, ca.ca_file(), None).await.expect("connect");
    for _ in 0..2 {
        let body = chat_body(&model.name, "hello", 3, false);
        let (status, answer) = request(&mut conn, "POST", "/v1/chat/completions", Some(&body))
            .await
            .expect("chat");
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).expect("JSON");
        assert_eq!(answer["usage"]["completion_tokens"], 3, "{answer}");
    }

    let error = connect(gw.addr, stranger.ca_file(), None)
        .await
        .expect_err("unknown CA");
    assert!(error.contains("UnknownIssuer"), "{error}");
    // Plain HTTP on the HTTPS port gets no HTTP answer.
    let response = tokio::time::timeout(Duration::from_secs(10), reqwest::get(url(&gw, "/health")))
        .await
        .expect("answered or closed at once");
    assert!(response.is_err(), "{response:?}");
    // The stranger's handshake and the plain client's are counted.
    wait_for_sample(
        &gw,
        "iris_tls_handshake_failures_total{listener=\"api\"}",
        2.0,
    )
    .await;
    let text = metrics(&gw).await;
    iris_testkit::http::assert_lines(
        &text,
        &[
            "iris_tls_certificate_reloads_total{result=\"loaded\"} 0",
            "iris_tls_certificate_reloads_total{result=\"refused\"} 0",
        ],
    );
}

#[tokio::test]
async fn a_client_ca_lets_in_only_the_certificates_it_signed() {
    let model = tiny_model();
    let ca = Ca::new("clients");
    let stranger = Ca::new("stranger");
    let (cert, key) = ca.write_pair("gateway", &ca.server());
    let (client_cert, client_key) = ca.write_pair("client", &ca.client("team-a"));
    let (odd_cert, odd_key) = stranger.write_pair("client", &stranger.client("intruder"));
    let worker = engine(&model, Role::Aggregated, 0).await;
    let flags = https_flags(&cert, &key, Some(ca.ca_file()));
    let gw = gateway_with(&model, &worker, &flags).await;

    health(gw.addr, ca.ca_file(), Some((&client_cert, &client_key)))
        .await
        .expect("a certificate the client CA signed");
    for identity in [None, Some((odd_cert.as_path(), odd_key.as_path()))] {
        // TLS 1.3: the server judges the client's certificate after the
        // client's handshake is done, so the refusal shows on the request.
        let refused = match connect(gw.addr, ca.ca_file(), identity).await {
            Err(_) => true,
            Ok(mut conn) => request(&mut conn, "GET", "/health", None).await.is_err(),
        };
        assert!(
            refused,
            "a client without the CA's certificate was answered"
        );
    }
}

#[tokio::test]
async fn a_reload_swaps_the_certificate_and_open_connections_keep_theirs() {
    let model = tiny_model();
    let ca = Ca::new("rotation");
    let (first, second): (Issued, Issued) = (ca.server(), ca.server());
    let (cert, key) = ca.write_pair("gateway", &first);
    let worker = engine(&model, Role::Aggregated, 0).await;
    let gw = gateway_with(&model, &worker, &https_flags(&cert, &key, None)).await;

    let mut kept = connect(gw.addr, ca.ca_file(), None).await.expect("connect");
    assert_eq!(
        request(&mut kept, "GET", "/health", None)
            .await
            .expect("health")
            .0,
        200
    );
    assert_eq!(served(&kept), first.cert_der);

    ca.write_pair("gateway", &second);
    wait_for_sample(
        &gw,
        "iris_tls_certificate_reloads_total{result=\"loaded\"}",
        1.0,
    )
    .await;
    assert_eq!(
        health(gw.addr, ca.ca_file(), None).await.expect("HTTPS"),
        second.cert_der
    );
    // The connection opened before goes on, with the session it made.
    let (status, _) = request(&mut kept, "GET", "/health", None)
        .await
        .expect("kept alive");
    assert_eq!(status, 200);
    assert_eq!(served(&kept), first.cert_der);

    // A broken certificate file: refused and counted; the loaded one stays.
    ca.write(
        "gateway.crt",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    wait_for_sample(
        &gw,
        "iris_tls_certificate_reloads_total{result=\"refused\"}",
        1.0,
    )
    .await;
    assert_eq!(
        health(gw.addr, ca.ca_file(), None).await.expect("HTTPS"),
        second.cert_der
    );
    assert_eq!(
        request(&mut kept, "GET", "/health", None)
            .await
            .expect("kept")
            .0,
        200
    );
}

/// An engine serving gRPC over TLS with `flags` (`--tls-*`).
async fn tls_engine(model: &Model, flags: &[String]) -> RunningEngine {
    let mut args = vec!["--decode-per-step-us".to_string(), "0".into()];
    args.extend(flags.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let args = iris_testkit::args::engine_args(model.path(), Role::Aggregated.as_str(), &args);
    iris_engine::start(args).await.expect("engine starts")
}

/// A gateway over the `grpcs://` engine `worker` with `flags`.
async fn over_grpcs(model: &Model, worker: &RunningEngine, flags: &[String]) -> RunningGateway {
    let mut args = vec![
        "--worker-urls".to_string(),
        format!("grpcs://localhost:{}", worker.grpc_addr.port()),
        "--metrics-port".into(),
        "0".into(),
    ];
    args.extend(flags.iter().cloned());
    gateway(model, &args).await
}

#[tokio::test]
async fn grpcs_workers_are_reached_with_the_ca_and_with_mutual_tls() {
    let model = tiny_model();
    let ca = Ca::new("fleet");
    let (cert, key) = ca.write_pair("engine", &ca.server());
    let (gw_cert, gw_key) = ca.write_pair("gateway", &ca.client("gateway"));
    let server = vec![
        "--tls-cert-file".to_string(),
        word(&cert),
        "--tls-key-file".into(),
        word(&key),
    ];
    let ca_flag = vec!["--worker-tls-ca-file".to_string(), word(ca.ca_file())];

    let worker = tls_engine(&model, &server).await;
    let gw = over_grpcs(&model, &worker, &ca_flag).await;
    ready(&gw).await;
    let (status, answer) = post_json(&gw, &chat_body(&model.name, "hi", 4, false)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 4);
    let text = metrics(&gw).await;
    let worker_label = format!("worker=\"grpcs://localhost:{}\"", worker.grpc_addr.port());
    assert!(text.contains(&worker_label), "{text}");

    // A worker that asks for the gateway's certificate.
    let mut mutual = server.clone();
    mutual.extend(["--tls-client-ca-file".into(), word(ca.ca_file())]);
    let strict = tls_engine(&model, &mutual).await;
    let mut with_identity = ca_flag.clone();
    with_identity.extend([
        "--worker-tls-cert-file".into(),
        word(&gw_cert),
        "--worker-tls-key-file".into(),
        word(&gw_key),
    ]);
    let gw = over_grpcs(&model, &strict, &with_identity).await;
    ready(&gw).await;
    let (status, answer) = post_json(&gw, &chat_body(&model.name, "hi", 2, false)).await;
    assert_eq!(status, 200, "{answer}");

    // Without it the worker stays out of service.
    let gw = over_grpcs(&model, &strict, &ca_flag).await;
    assert_never_ready(&gw).await;
}

#[tokio::test]
async fn a_wrong_worker_ca_keeps_the_worker_out_of_service() {
    let model = tiny_model();
    let ca = Ca::new("fleet");
    let stranger = Ca::new("stranger");
    let (cert, key) = ca.write_pair("engine", &ca.server());
    let server = vec![
        "--tls-cert-file".to_string(),
        word(&cert),
        "--tls-key-file".into(),
        word(&key),
    ];
    let worker = tls_engine(&model, &server).await;
    let gw = over_grpcs(
        &model,
        &worker,
        &["--worker-tls-ca-file".to_string(), word(stranger.ca_file())],
    )
    .await;
    assert_never_ready(&gw).await;
    let (status, answer) = post_json(&gw, &chat_body(&model.name, "hi", 2, false)).await;
    assert_eq!(status, 503, "{answer}");
}

/// Waits (at most 10 s) until /readiness on the plain metrics port is 200.
async fn ready_on_metrics_port(gw: &RunningGateway) {
    let readiness = format!(
        "http://{}/readiness",
        gw.metrics_addr.expect("metrics port")
    );
    for _ in 0..200 {
        if reqwest::get(&readiness)
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never ready");
}

/// Asserts /readiness stays 503 through ten health checks (2 s; a
/// worker that answers is in service after the first).
async fn assert_never_ready(gw: &RunningGateway) {
    let readiness = format!(
        "http://{}/readiness",
        gw.metrics_addr.expect("metrics port")
    );
    for _ in 0..10 {
        let status = reqwest::get(&readiness).await.expect("readiness").status();
        assert_eq!(status, 503);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The start-up error of a gateway with `flags`.
async fn refused(model: &Model, flags: &[String]) -> String {
    let mut argv = vec![
        "--port".to_string(),
        "0".into(),
        "--model-path".into(),
        word(model.path()),
    ];
    argv.extend(["--worker-urls".into(), "grpc://127.0.0.1:1".into()]);
    argv.extend(flags.iter().cloned());
    let serve: iris_gateway::ServeArgs = iris_testkit::args::parse(argv);
    match iris_gateway::start(serve).await {
        Ok(_) => panic!("started with {flags:?}"),
        Err(e) => format!("{e:#}"),
    }
}

#[tokio::test]
async fn tls_flags_alone_or_bad_files_stop_the_start_naming_them() {
    let model = tiny_model();
    let ca = Ca::new("start");
    let (cert, key) = ca.write_pair("gateway", &ca.server());
    let missing: PathBuf = ca.dir().join("missing.pem");
    let garbage = ca.write("garbage.pem", "hello\n");
    let flag = |name: &str, path: &Path| vec![name.to_string(), word(path)];

    let error = refused(&model, &flag("--tls-cert-file", &cert)).await;
    assert!(
        error.contains("--tls-cert-file needs --tls-key-file"),
        "{error}"
    );
    let error = refused(&model, &flag("--tls-key-file", &key)).await;
    assert!(
        error.contains("--tls-key-file needs --tls-cert-file"),
        "{error}"
    );
    let mut flags = flag("--tls-cert-file", &missing);
    flags.extend(flag("--tls-key-file", &key));
    let error = refused(&model, &flags).await;
    assert!(
        error.contains(&format!("--tls-cert-file {}", missing.display())),
        "{error}"
    );
    let mut flags = flag("--tls-cert-file", &cert);
    flags.extend(flag("--tls-key-file", &garbage));
    let error = refused(&model, &flags).await;
    assert!(
        error.contains(&format!("--tls-key-file {}", garbage.display())),
        "{error}"
    );
    let error = refused(&model, &flag("--worker-tls-cert-file", &cert)).await;
    assert!(
        error.contains("--worker-tls-cert-file needs --worker-tls-key-file"),
        "{error}"
    );
    let error = refused(&model, &flag("--worker-tls-ca-file", &garbage)).await;
    assert!(
        error.contains(&format!("--worker-tls-ca-file {}", garbage.display())),
        "{error}"
    );
    let grpcs = vec!["--worker-urls".to_string(), "grpcs://127.0.0.1:1".into()];
    let error = refused(&model, &grpcs).await;
    assert!(error.contains("--worker-tls-ca-file"), "{error}");
}
