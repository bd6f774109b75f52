//! The gRPC channel to one worker: HTTP/2 on the `h2` crate, with no task
//! between a call and its connection.
//!
//! tonic's `Channel` hands every call to a `Buffer` task that owns the
//! connection's service, which hands it on to hyper's client dispatcher,
//! another task, before `h2` sees it: two cross-task hops (wake-ups,
//! channels, boxed futures) per call and per answer, a large part of the
//! gateway's CPU per small request. Here the calling task clones the
//! connection's `SendRequest`, opens its stream and queues its one message
//! itself; only the connection's IO task remains.
//!
//! The connection is made on the first call (a lazy channel, like
//! tonic's), one attempt shared by the callers that wait for it: a caller
//! that waited while an attempt failed gets that failure rather than
//! trying again. A connection that closed is replaced on the next call,
//! and a call that finds its connection closed before it sent anything
//! reconnects once. Keep-alive: a PING every 30 s, idle or not; no answer
//! within 20 s closes the connection and fails its calls, as hyper's
//! keep-alive did.
//!
//! A `grpcs://` worker's connection is TLS (rustls, ALPN `h2`) under the
//! HTTP/2 one: the worker's certificate must be signed by the CA of
//! `--worker-tls-ca-file` and name the host the URL dials; the gateway
//! presents its own certificate when given one (mutual TLS).
//!
//! Errors are tonic `Status`es shaped as before: no connection is
//! `UNAVAILABLE` with "tcp connect error" and the `io::Error` as its
//! source ([`crate::router::classify::unreachable`] reads both), a failed
//! TLS handshake too (its message says why: an unknown CA, a name the
//! certificate lacks, a client certificate refused); a failed stream is
//! mapped by tonic from its `h2::Error`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use http_body::{Body, Frame};
use iris_process::tls::rustls::pki_types::ServerName;
use iris_process::tls::tokio_rustls::TlsConnector;
use iris_process::tls::ClientTls;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tonic::{Code, Status};

/// Receive windows: as hyper's client sets them (a stream's 2 MiB, the
/// connection's 5 MiB), so answers stream as they did through tonic.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;
/// A stream's queued bytes before `h2` stops asking for send capacity.
const SEND_BUFFER: usize = 1 << 20;
/// Keep-alive: a PING this often, closed without an answer within
/// [`PING_TIMEOUT`].
const PING_EVERY: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// What hyper's connector said when no connection could be made; the
/// router's classification reads it.
const CONNECT_FAILED: &str = "tcp connect error";

/// A worker's channel as the gateway's clients use it: every call
/// carrying the worker's token, if it has one.
pub type Channel = iris_process::auth::AuthChannel<WorkerChannel>;

type CallFuture = Pin<Box<dyn Future<Output = Result<Response<AnswerBody>, Status>> + Send>>;

/// A lazily connecting HTTP/2 channel to one worker; clones share it.
#[derive(Clone)]
pub struct WorkerChannel {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WorkerChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerChannel")
            .field("authority", &self.shared.authority)
            .finish_non_exhaustive()
    }
}

struct Shared {
    /// `host:port` (IPv6 hosts in brackets): what is dialled and what
    /// `:authority` says.
    authority: Authority,
    connect_timeout: Duration,
    user_agent: HeaderValue,
    /// TLS under HTTP/2 (`grpcs://`): the connector and the name the
    /// worker's certificate must carry.
    tls: Option<(TlsConnector, ServerName<'static>)>,
    /// The connection calls go on now, if any.
    current: Mutex<Option<Connection>>,
    /// Held while connecting: one attempt at a time.
    connecting: tokio::sync::Mutex<Option<Failure>>,
}

/// A live connection: its request handle, and whether its task ended.
#[derive(Clone)]
struct Connection {
    send: SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
}

/// The last failed connection attempt, for the callers that waited on it.
struct Failure {
    at: Instant,
    message: String,
}

impl WorkerChannel {
    /// A channel to `authority` that connects on its first call, over
    /// `tls` when given.
    pub fn lazy(
        authority: &str,
        connect_timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<WorkerChannel, String> {
        let authority: Authority = authority
            .parse()
            .map_err(|e| format!("{authority}: not a host:port ({e})"))?;
        let user_agent = HeaderValue::from_static(concat!("iris/", env!("CARGO_PKG_VERSION")));
        let tls = tls
            .map(|tls| {
                Ok::<_, String>((tls.connector(), ClientTls::server_name(authority.host())?))
            })
            .transpose()?;
        Ok(WorkerChannel {
            shared: Arc::new(Shared {
                authority,
                connect_timeout,
                user_agent,
                tls,
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(None),
            }),
        })
    }
}

impl tower_service::Service<Request<tonic::body::Body>> for WorkerChannel {
    type Response = Response<AnswerBody>;
    type Error = Status;
    type Future = CallFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<tonic::body::Body>) -> CallFuture {
        // A call made for a traced request continues its trace.
        crate::trace::tag(request.headers_mut());
        let shared = self.shared.clone();
        Box::pin(async move { shared.call(request).await })
    }
}

impl Shared {
    async fn call(
        &self,
        request: Request<tonic::body::Body>,
    ) -> Result<Response<AnswerBody>, Status> {
        let (mut head, body) = request.into_parts();
        head.uri = self.absolute(&head.uri)?;
        head.headers
            .entry(http::header::USER_AGENT)
            .or_insert_with(|| self.user_agent.clone());
        let mut parts = collect(body).await?;
        let mut send = self.ready_sender().await?;
        let head = Request::from_parts(head, ());
        let (answer, mut stream) = send
            .send_request(head, parts.is_empty())
            .map_err(|e| closed(&self.authority, &e))?;
        // Each part goes as it is: a tensor spliced by reference
        // (iris_process::splice) is framed from the buffer the gateway
        // holds, never copied into one message first.
        let last = parts.pop();
        for part in parts {
            stream
                .send_data(part, false)
                .map_err(|e| Status::from_error(Box::new(e)))?;
        }
        if let Some(last) = last {
            stream
                .send_data(last, true)
                .map_err(|e| Status::from_error(Box::new(e)))?;
        }
        let answer = answer.await.map_err(|e| self.answer_failed(e))?;
        Ok(answer.map(|recv| AnswerBody {
            recv,
            data_done: false,
        }))
    }

    /// The status of a call whose answer failed with `error`: a TLS alert
    /// (the worker refused the session after the handshake, e.g. TLS 1.3's
    /// client-certificate check) is `UNAVAILABLE` saying so; anything else
    /// as tonic maps it.
    fn answer_failed(&self, error: h2::Error) -> Status {
        let text = error.to_string();
        if self.tls.is_some() && error.is_io() && text.contains("alert") {
            return Status::unavailable(format!(
                "{}: the worker ended the TLS session: {} (does it ask for a client certificate? --worker-tls-cert-file)",
                self.authority,
                error.get_io().map_or(text.clone(), ToString::to_string),
            ));
        }
        Status::from_error(Box::new(error))
    }

    /// The call's URI with this worker's scheme and authority (tonic's
    /// clients give the path only).
    fn absolute(&self, uri: &Uri) -> Result<Uri, Status> {
        let path = uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let scheme = if self.tls.is_some() {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        };
        Uri::builder()
            .scheme(scheme)
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|e| Status::internal(format!("request URI for {}: {e}", self.authority)))
    }

    /// A request handle ready for one more stream: on the current
    /// connection, or a new one if it closed.
    async fn ready_sender(&self) -> Result<SendRequest<Bytes>, Status> {
        let connection = self.connection().await?;
        match connection.send.clone().ready().await {
            Ok(send) => Ok(send),
            Err(_) => {
                // Closed under us (a GOAWAY, a reset): nothing was sent on
                // it, so one fresh connection is tried.
                connection.closed.store(true, Ordering::Release);
                let fresh = self.connection().await?;
                fresh
                    .send
                    .ready()
                    .await
                    .map_err(|e| closed(&self.authority, &e))
            }
        }
    }

    /// The open connection, or a new one.
    async fn connection(&self) -> Result<Connection, Status> {
        if let Some(open) = self.open() {
            return Ok(open);
        }
        let asked = Instant::now();
        let mut last_failure = self.connecting.lock().await;
        if let Some(open) = self.open() {
            return Ok(open);
        }
        if let Some(failure) = last_failure.as_ref().filter(|f| f.at >= asked) {
            return Err(Status::unavailable(failure.message.clone()));
        }
        match self.connect().await {
            Ok(connection) => {
                *last_failure = None;
                *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(connection.clone());
                Ok(connection)
            }
            Err(status) => {
                *last_failure = Some(Failure {
                    at: Instant::now(),
                    message: status.message().to_string(),
                });
                Err(status)
            }
        }
    }

    /// The current connection unless its task ended.
    fn open(&self) -> Option<Connection> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current
            .as_ref()
            .filter(|c| !c.closed.load(Ordering::Acquire))
            .cloned()
    }

    /// Dials the worker (with TLS for a `grpcs://` one) and starts
    /// HTTP/2 on the connection.
    async fn connect(&self) -> Result<Connection, Status> {
        let tcp = self.dial().await?;
        let Some((connector, name)) = &self.tls else {
            return self.start_h2(tcp).await;
        };
        let authority = self.authority.as_str();
        let handshake = connector.connect(name.clone(), tcp);
        match tokio::time::timeout(self.connect_timeout, handshake).await {
            Ok(Ok(tls)) => self.start_h2(tls).await,
            Ok(Err(e)) => Err(tls_failed(authority, e)),
            Err(_) => Err(tls_failed(
                authority,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no TLS handshake within {:?}", self.connect_timeout),
                ),
            )),
        }
    }

    /// A TCP connection to the worker.
    async fn dial(&self) -> Result<TcpStream, Status> {
        let authority = self.authority.as_str();
        let dial = tokio::time::timeout(self.connect_timeout, async {
            let tcp = TcpStream::connect(authority).await?;
            tcp.set_nodelay(true)?;
            Ok::<_, std::io::Error>(tcp)
        });
        match dial.await {
            Ok(Ok(tcp)) => Ok(tcp),
            Ok(Err(e)) => Err(unreachable(authority, e)),
            Err(_) => {
                let e = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {:?}", self.connect_timeout),
                );
                Err(unreachable(authority, e))
            }
        }
    }

    /// Starts HTTP/2 on `io`; the connection's IO runs on a task of its
    /// own until it closes.
    async fn start_h2<T>(&self, io: T) -> Result<Connection, Status>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let authority = self.authority.as_str();
        let handshake = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_send_buffer_size(SEND_BUFFER)
            .handshake::<_, Bytes>(io);
        let (send, mut io) = tokio::time::timeout(self.connect_timeout, handshake)
            .await
            .map_err(|_| Status::unavailable(format!("{authority}: HTTP/2 handshake timed out")))?
            .map_err(|e| Status::unavailable(format!("{authority}: HTTP/2 handshake: {e}")))?;
        let closed = Arc::new(AtomicBool::new(false));
        let pings = io.ping_pong();
        let (done, name) = (closed.clone(), authority.to_string());
        tokio::spawn(async move {
            tokio::select! {
                ended = &mut io => {
                    if let Err(e) = ended {
                        tracing::debug!(worker = %name, error = %e, "worker connection closed");
                    }
                }
                () = keep_alive(pings) => {
                    tracing::warn!(worker = %name, "worker connection silent for {PING_TIMEOUT:?} after a PING: closed");
                }
            }
            done.store(true, Ordering::Release);
        });
        Ok(Connection { send, closed })
    }
}

/// PINGs every [`PING_EVERY`]; returns when one goes unanswered for
/// [`PING_TIMEOUT`]. Never returns on a connection that has closed (its
/// IO future ends instead).
async fn keep_alive(pings: Option<h2::PingPong>) {
    let Some(mut pings) = pings else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(PING_EVERY).await;
        match tokio::time::timeout(PING_TIMEOUT, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(_closed)) => return std::future::pending().await,
            Err(_silent) => return,
        }
    }
}

/// The request's message: the data frames of tonic's body of one encoded
/// message, in order and uncopied (it is ready at once; a unary or
/// server-streaming call has no more), empty ones left out.
async fn collect(mut body: tonic::body::Body) -> Result<Vec<Bytes>, Status> {
    let mut parts: Vec<Bytes> = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if let Ok(data) = frame?.into_data() {
            if !data.is_empty() {
                parts.push(data);
            }
        }
    }
    Ok(parts)
}

/// No connection could be made to `authority`.
fn unreachable(authority: &str, error: std::io::Error) -> Status {
    let mut status = Status::new(
        Code::Unavailable,
        format!("{CONNECT_FAILED}: {authority}: {error}"),
    );
    status.set_source(Arc::new(error));
    status
}

/// The TLS handshake with `authority` failed (`error` says why); the
/// worker counts as unreachable, as for a failed dial.
fn tls_failed(authority: &str, error: std::io::Error) -> Status {
    let hint = match error.get_ref().map(ToString::to_string) {
        Some(why) if why.contains("UnknownIssuer") || why.contains("NotValidForName") => {
            " (check --worker-tls-ca-file and the names in the worker's certificate)"
        }
        _ => "",
    };
    let mut status = Status::new(
        Code::Unavailable,
        format!("{CONNECT_FAILED}: {authority}: TLS handshake failed: {error}{hint}"),
    );
    status.set_source(Arc::new(error));
    status
}

/// The connection closed before the call could be sent.
fn closed(authority: &Authority, error: &h2::Error) -> Status {
    Status::unavailable(format!("connection to {authority} closed: {error}"))
}

/// A worker's answer: its data frames (each one's receive window given
/// back as it is read), then its trailers.
pub struct AnswerBody {
    recv: h2::RecvStream,
    data_done: bool,
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Fails only once the stream is gone, which the next
                    // poll reports.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(Status::from_error(Box::new(e))))),
                None => this.data_done = true,
            }
        }
        match ready!(this.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(Status::from_error(Box::new(e))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    use iris_engine::RunningEngine;
    use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
    use iris_proto::scheduler::HealthCheckRequest;
    use iris_testkit::tls::Ca;

    async fn engine(model: &iris_testkit::model::TinyModel, port: u16) -> RunningEngine {
        tls_engine(model, port, &[]).await
    }

    /// An engine on `port` with `tls` flags (`--tls-cert-file` …).
    async fn tls_engine(
        model: &iris_testkit::model::TinyModel,
        port: u16,
        tls: &[&str],
    ) -> RunningEngine {
        let port = port.to_string();
        let mut extra = vec!["--port", &port];
        extra.extend_from_slice(tls);
        let args = iris_testkit::args::engine_args(model.path(), "aggregated", &extra);
        iris_engine::start(args).await.expect("engine starts")
    }

    /// The client TLS of `ca` (and `identity`: mutual TLS).
    fn client_tls(ca: &std::path::Path, identity: Option<(&Path, &Path)>) -> ClientTls {
        let files = iris_process::tls::ClientFiles::from_flags(
            Some(ca),
            identity.map(|(cert, _)| cert),
            identity.map(|(_, key)| key),
        )
        .expect("flags")
        .expect("files");
        ClientTls::load(&files, &[iris_process::tls::ALPN_H2]).expect("client TLS")
    }

    async fn health(channel: &WorkerChannel) -> Result<(), Status> {
        let mut client = TokenSpeedSchedulerClient::new(channel.clone());
        client
            .health_check(HealthCheckRequest::default())
            .await
            .map(drop)
    }

    #[tokio::test]
    async fn a_grpcs_worker_is_reached_with_its_ca_and_a_wrong_ca_is_a_clear_unavailable() {
        let model = iris_testkit::model::tiny_model();
        let ca = Ca::new("workers");
        let (cert, key) = ca.write_pair("engine", &ca.server());
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        let worker = tls_engine(
            &model,
            0,
            &["--tls-cert-file", &cert, "--tls-key-file", &key],
        )
        .await;
        // By address and by name: the certificate carries both.
        for host in ["127.0.0.1", "localhost"] {
            let authority = format!("{host}:{}", worker.grpc_addr.port());
            let tls = client_tls(ca.ca_file(), None);
            let channel = WorkerChannel::lazy(&authority, Duration::from_secs(2), Some(&tls))
                .expect("channel");
            health(&channel).await.expect("healthy over TLS");
        }
        let stranger = Ca::new("stranger");
        let tls = client_tls(stranger.ca_file(), None);
        let channel = WorkerChannel::lazy(
            &worker.grpc_addr.to_string(),
            Duration::from_secs(2),
            Some(&tls),
        )
        .expect("channel");
        let status = health(&channel).await.expect_err("an unknown CA");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        let message = status.message();
        assert!(message.contains("TLS handshake failed"), "{message}");
        assert!(message.contains("UnknownIssuer"), "{message}");
        assert!(message.contains("--worker-tls-ca-file"), "{message}");
        assert!(crate::router::classify::unreachable(&status), "{status:?}");
        // A plain channel to a TLS port gets no answer.
        let plain =
            WorkerChannel::lazy(&worker.grpc_addr.to_string(), Duration::from_secs(2), None)
                .expect("channel");
        assert!(health(&plain).await.is_err());
        worker.shutdown_token().cancel();
    }

    #[tokio::test]
    async fn a_worker_asking_for_client_certificates_takes_the_gateways() {
        let model = iris_testkit::model::tiny_model();
        let ca = Ca::new("mutual");
        let (cert, key) = ca.write_pair("engine", &ca.server());
        let (gw_cert, gw_key) = ca.write_pair("gateway", &ca.client("gateway"));
        let paths = [cert, key, ca.ca_file().to_owned()].map(|p| p.display().to_string());
        let flags = [
            "--tls-cert-file",
            &paths[0],
            "--tls-key-file",
            &paths[1],
            "--tls-client-ca-file",
            &paths[2],
        ];
        let worker = tls_engine(&model, 0, &flags).await;
        let addr = worker.grpc_addr.to_string();
        let tls = client_tls(ca.ca_file(), Some((&gw_cert, &gw_key)));
        let channel =
            WorkerChannel::lazy(&addr, Duration::from_secs(2), Some(&tls)).expect("channel");
        health(&channel).await.expect("mutual TLS");
        let anonymous = client_tls(ca.ca_file(), None);
        let channel =
            WorkerChannel::lazy(&addr, Duration::from_secs(2), Some(&anonymous)).expect("channel");
        let status = health(&channel).await.expect_err("no client certificate");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(
            status.message().contains("CertificateRequired"),
            "{status:?}"
        );
        worker.shutdown_token().cancel();
    }

    #[tokio::test]
    async fn a_worker_that_is_not_listening_is_unreachable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let channel =
            WorkerChannel::lazy(&addr.to_string(), Duration::from_secs(2), None).expect("channel");
        let status = health(&channel).await.expect_err("nothing listens");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(crate::router::classify::unreachable(&status), "{status:?}");
        assert!(WorkerChannel::lazy("not a host port/", Duration::from_secs(1), None).is_err());
    }

    #[tokio::test]
    async fn calls_share_one_connection_and_reconnect_after_a_restart() {
        let model = iris_testkit::model::tiny_model();
        let first = engine(&model, 0).await;
        let addr = first.grpc_addr;
        let channel =
            WorkerChannel::lazy(&addr.to_string(), Duration::from_secs(2), None).expect("channel");
        let calls: Vec<_> = (0..8).map(|_| health(&channel)).collect();
        for answer in futures::future::join_all(calls).await {
            answer.expect("healthy");
        }
        let connection = channel.shared.open().expect("connected");
        first.shutdown_token().cancel();
        first.wait().await.expect("stopped");
        for _ in 0..500 {
            if connection.closed.load(Ordering::Acquire) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            connection.closed.load(Ordering::Acquire),
            "the connection's end was seen"
        );
        assert!(channel.shared.open().is_none());
        let second = engine(&model, addr.port()).await;
        health(&channel).await.expect("reached after the restart");
        let reconnected = channel.shared.open().expect("connected again");
        assert!(!reconnected.closed.load(Ordering::Acquire));
        second.shutdown_token().cancel();
    }
}
