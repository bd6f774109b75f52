//! The HTTP/1 accept loop and the limits that keep slow or idle clients
//! from exhausting the gateway (docs/configuration.md, "Connections").
//!
//! - **Connection cap** (`--max-connections`): a connection holds a
//!   permit while it is open. Past the cap a new connection is accepted,
//!   sent a fixed `503` (when the socket takes it without waiting) and
//!   closed at once, so clients fail fast instead of waiting in the
//!   kernel's backlog, and connections already open keep being served.
//! - **Header-read timeout** (`--header-read-timeout-secs`): a request's
//!   head must arrive within it (hyper's own timer; on a kept-alive
//!   connection it runs from the end of the previous response), else the
//!   connection is closed.
//! - **Keep-alive** (`--keep-alive-timeout-secs`, 0: off): a connection
//!   with no request in flight for that long after its last response is
//!   closed. `--max-requests-per-connection` answers the last request of a
//!   connection with `Connection: close`.
//!
//! - **TLS** (`--tls-cert-file`, docs/security.md "TLS"): the handshake
//!   runs on the connection's task within the header-read timeout; one
//!   that fails or times out closes the connection and is counted
//!   (`iris_tls_handshake_failures_total`). Past the cap a TLS listener
//!   closes the connection without the plain-text 503.
//!
//! The accept loop never waits on a client: each connection is its own
//! task (a few KiB), so a flood of half-sent headers (or handshakes)
//! costs memory, not the loop's attention, and `/health` on a fresh
//! connection is answered.
//! The body-read deadline is applied where bodies are read
//! (`crate::chat`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use iris_process::tls::tokio_rustls::TlsAcceptor;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long connections may go on once the hard stop (end of the shutdown
/// grace period) is signalled: enough for the requests it ended to write
/// their error event, then every connection is dropped.
const HARD_STOP_DRAIN: Duration = Duration::from_secs(1);

/// The answer to a connection past the cap.
const OVER_CAPACITY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 128\r\nconnection: close\r\nretry-after: 1\r\n\r\n{\"error\":{\"message\":\"the gateway is at its connection limit\",\"type\":\"server_error\",\"param\":null,\"code\":\"too_many_connections\"}}\n";

/// The connection limits of one listener.
#[derive(Clone)]
pub struct ConnLimits {
    /// Connections open at once; more are refused.
    pub max_connections: usize,
    /// Time for a request head to arrive.
    pub header_read_timeout: Duration,
    /// Idle time after a response before the connection is closed; `None`
    /// closes every connection after one request.
    pub keep_alive: Option<Duration>,
    /// Requests per connection (0: unlimited).
    pub max_requests: u64,
    /// TLS handshakes of the listener's connections (`None`: plain).
    pub tls: Option<TlsAcceptor>,
}

/// Connection counters, shared with `/metrics`.
#[derive(Debug, Default)]
pub struct ConnStats {
    pub open: AtomicUsize,
    pub refused: AtomicU64,
    pub header_timeouts: AtomicU64,
    pub tls_handshake_failures: AtomicU64,
}

/// Prometheus text for the connection counters of every listener (`api`,
/// `metrics`), each family once with a sample per listener.
pub fn render_stats(out: &mut String, listeners: &[(&'static str, Arc<ConnStats>)]) {
    type Read = fn(&ConnStats) -> u64;
    let families: [(&str, &str, &str, Read); 4] = [
        (
            "iris_http_connections_open",
            "gauge",
            "HTTP connections open.",
            |s| s.open.load(Ordering::Relaxed) as u64,
        ),
        (
            "iris_http_connections_refused_total",
            "counter",
            "Connections refused at the --max-connections cap.",
            |s| s.refused.load(Ordering::Relaxed),
        ),
        (
            "iris_http_header_timeouts_total",
            "counter",
            "Connections closed because a request head did not arrive within --header-read-timeout-secs.",
            |s| s.header_timeouts.load(Ordering::Relaxed),
        ),
        (
            "iris_tls_handshake_failures_total",
            "counter",
            "TLS connections closed because their handshake failed or did not finish within --header-read-timeout-secs (--tls-cert-file).",
            |s| s.tls_handshake_failures.load(Ordering::Relaxed),
        ),
    ];
    for (name, kind, help, read) in families {
        let samples = listeners
            .iter()
            .map(|(listener, stats)| (format!("listener=\"{listener}\""), read(stats)));
        iris_metrics::family(out, name, kind, help, samples);
    }
}

/// When a listener stops accepting and when its connections are cut.
#[derive(Clone)]
pub struct Stop {
    /// Cancelled: stop accepting, let requests in flight finish.
    pub graceful: CancellationToken,
    /// Cancelled: drop every connection (after [`HARD_STOP_DRAIN`]).
    pub hard: CancellationToken,
}

/// Serves `app` on `listener` under `limits` until `stop.graceful` is
/// cancelled and every connection has ended.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnLimits,
    stats: Arc<ConnStats>,
    stop: Stop,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let connections = TaskTracker::new();
    let shared = Arc::new(Shared {
        app,
        builder: builder(&limits),
        limits,
        stats,
        stop: stop.clone(),
    });
    loop {
        let stream = tokio::select! {
            biased;
            _ = stop.graceful.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(&e, &stop.graceful).await;
                    continue;
                }
            },
        };
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let shared = shared.clone();
                shared.stats.open.fetch_add(1, Ordering::Relaxed);
                connections.spawn(async move {
                    serve_connection(stream, &shared).await;
                    shared.stats.open.fetch_sub(1, Ordering::Relaxed);
                    drop(permit);
                });
            }
            Err(_) => refuse(stream, &shared.stats, shared.limits.tls.is_none()),
        }
    }
    // No new connection once shutdown began: the port is closed now.
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// What every connection of a listener shares.
struct Shared {
    app: axum::Router,
    builder: http1::Builder,
    limits: ConnLimits,
    stats: Arc<ConnStats>,
    stop: Stop,
}

fn builder(limits: &ConnLimits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    // One flat write buffer instead of a list of slices: hyper flushes a
    // list at 16 slices, which a streamed answer's chunks fill in half a
    // reply; flat, every chunk ready at once goes out in one `write`.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(limits.keep_alive.is_some())
        .writev(false);
    builder
}

/// A failed `accept`: per-connection errors are skipped; running out of
/// file descriptors (or memory) is logged and waited out briefly, so the
/// loop does not spin while the backlog holds the connection.
async fn accept_failed(error: &std::io::Error, stop: &CancellationToken) {
    use std::io::ErrorKind::*;
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted | WouldBlock
    ) {
        return;
    }
    tracing::warn!(%error, "accepting a connection failed (file descriptor limit?)");
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
    }
}

/// Past the cap: a fixed 503 if the socket takes it now (on a plain
/// listener: a TLS client could not read it), then close.
fn refuse(stream: TcpStream, stats: &ConnStats, plain: bool) {
    stats.refused.fetch_add(1, Ordering::Relaxed);
    if plain {
        let _ = stream.try_write(OVER_CAPACITY);
    }
    tracing::debug!("connection refused: --max-connections reached");
}

async fn serve_connection(stream: TcpStream, shared: &Shared) {
    // Streamed chunks must not wait for delayed ACKs.
    let _ = stream.set_nodelay(true);
    let Some(acceptor) = &shared.limits.tls else {
        return serve_http(stream, shared).await;
    };
    let handshake =
        tokio::time::timeout(shared.limits.header_read_timeout, acceptor.accept(stream));
    let tls = tokio::select! {
        done = handshake => done,
        _ = shared.stop.hard.cancelled() => return,
    };
    match tls {
        Ok(Ok(tls)) => serve_http(tls, shared).await,
        Ok(Err(error)) => {
            shared
                .stats
                .tls_handshake_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%error, "TLS handshake failed");
        }
        Err(_) => {
            shared
                .stats
                .tls_handshake_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!("TLS handshake not done within --header-read-timeout-secs");
        }
    }
}

/// Serves HTTP/1 on `io` (a TCP or TLS connection) until it closes.
async fn serve_http<I>(io: I, shared: &Shared)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::default());
    let service = ConnService {
        app: shared.app.clone(),
        activity: activity.clone(),
        max_requests: shared.limits.max_requests,
    };
    let conn = shared.builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let hard_stop = async {
        shared.stop.hard.cancelled().await;
        tokio::time::sleep(HARD_STOP_DRAIN).await;
    };
    tokio::pin!(hard_stop);
    let mut closing = false;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    if e.is_timeout() {
                        shared.stats.header_timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::trace!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = shared.stop.graceful.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = activity.idle_for(shared.limits.keep_alive), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = &mut hard_stop => return,
        }
    }
}

/// Requests in flight on one connection and when the last one ended.
#[derive(Default)]
struct Activity {
    in_flight: AtomicUsize,
    served: AtomicU64,
    /// When the last response ended (its body was dropped).
    last_done: Mutex<Option<Instant>>,
    changed: Notify,
}

impl Activity {
    /// A request starts; returns how many this connection has seen.
    fn begin(self: &Arc<Self>) -> (u64, InFlight) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let served = self.served.fetch_add(1, Ordering::AcqRel) + 1;
        self.changed.notify_one();
        (served, InFlight(self.clone()))
    }

    fn end(&self) {
        if let Ok(mut last) = self.last_done.lock() {
            *last = Some(Instant::now());
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.changed.notify_one();
    }

    /// The end of the last response, when no request is in flight.
    fn idle_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        self.last_done.lock().ok().and_then(|last| *last)
    }

    /// Completes once the connection has been idle for `limit` after a
    /// response (never before its first request: the header-read timeout
    /// covers that; never with keep-alive off: hyper closes then).
    async fn idle_for(&self, limit: Option<Duration>) {
        let Some(limit) = limit else {
            return std::future::pending().await;
        };
        loop {
            let changed = self.changed.notified();
            match self.idle_since() {
                Some(since) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(since + limit) => {
                            if self.idle_since() == Some(since) {
                                return;
                            }
                        }
                        _ = changed => {}
                    }
                }
                None => changed.await,
            }
        }
    }
}

/// Held from a request's start until its response body is dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The router as a hyper service for one connection.
#[derive(Clone)]
struct ConnService {
    app: axum::Router,
    activity: Arc<Activity>,
    max_requests: u64,
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<Response<TrackedBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let (served, in_flight) = self.activity.begin();
        let last = self.max_requests > 0 && served >= self.max_requests;
        let mut app = self.app.clone();
        Box::pin(async move {
            let request = request.map(Body::new);
            let Ok(mut response) = tower_service::Service::call(&mut app, request).await;
            if last {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response.map(|body| TrackedBody {
                body,
                _in_flight: in_flight,
            }))
        })
    }
}

/// A response body that marks its request finished when dropped (after it
/// was written, or when the connection went away).
struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_capacity_answer_is_well_formed() {
        let text = std::str::from_utf8(OVER_CAPACITY).expect("ascii");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.parse().ok())
            .expect("content-length");
        assert_eq!(body.len(), length);
        let json: serde_json::Value = serde_json::from_str(body).expect("json body");
        assert_eq!(json["error"]["code"], "too_many_connections");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_fires_only_after_a_response_and_the_limit() {
        let activity = Arc::new(Activity::default());
        let limit = Some(Duration::from_secs(5));
        // Before the first request: never (the header timeout covers it).
        let before = tokio::time::timeout(Duration::from_secs(60), activity.idle_for(limit));
        assert!(before.await.is_err());
        let (n, in_flight) = activity.begin();
        assert_eq!(n, 1);
        // A request in flight is not idleness, however long it runs.
        let busy = tokio::time::timeout(Duration::from_secs(60), activity.idle_for(limit));
        assert!(busy.await.is_err());
        drop(in_flight);
        let started = Instant::now();
        activity.idle_for(limit).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        // Keep-alive off: never (hyper closes after the response).
        let off = tokio::time::timeout(Duration::from_secs(60), activity.idle_for(None));
        assert!(off.await.is_err());
    }
}
