//! Sending a GenerateRequest to workers: one aggregated worker, or a
//! prefill and a decode worker at once joined by a fresh KV room. A worker
//! that cannot be reached before anything was streamed is replaced by
//! another (bounded retries). The returned [`Generation`] yields the
//! streaming side's responses and aborts every leg if dropped unfinished.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use iris_proto::scheduler::{AbortRequest, GenerateRequest, GenerateResponse, KvBootstrapInfo};
use tokio::sync::oneshot;
use tonic::{Code, Status, Streaming};

use crate::workers::worker::InFlightGuard;
use crate::workers::{Pool, Role, Worker};

/// How requests are spread over workers.
pub enum Mode {
    Aggregated(Arc<Pool>),
    PrefillDecode {
        prefill: Arc<Pool>,
        decode: Arc<Pool>,
    },
}

impl Mode {
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        match self {
            Mode::Aggregated(pool) => vec![pool.clone()],
            Mode::PrefillDecode { prefill, decode } => vec![prefill.clone(), decode.clone()],
        }
    }
}

/// Why a request could not be started.
#[derive(Debug)]
pub enum RouteError {
    /// No healthy worker of this role is left to try.
    NoWorker(Role),
    /// A worker refused or failed the request.
    Upstream { worker: String, status: Status },
}

pub struct Router {
    pub mode: Mode,
    max_retries: u32,
    retries: AtomicU64,
}

/// One worker leg of a request.
struct Leg {
    worker: Arc<Worker>,
    request_id: String,
    _in_flight: InFlightGuard,
}

impl Leg {
    fn new(worker: Arc<Worker>, request_id: &str) -> Leg {
        let guard = worker.start_request();
        Leg {
            worker,
            request_id: request_id.to_owned(),
            _in_flight: guard,
        }
    }

    fn abort(&self, reason: &str) {
        let mut client = self.worker.client();
        let request = AbortRequest {
            request_id: self.request_id.clone(),
            reason: reason.to_owned(),
        };
        tokio::spawn(async move {
            let mut request = tonic::Request::new(request);
            request.set_timeout(std::time::Duration::from_secs(5));
            let _ = client.abort(request).await;
        });
    }
}

/// A started request: the streaming leg's responses.
pub struct Generation {
    /// `None` once handed to the background drain by [`finish`](Self::finish).
    stream: Option<Streaming<GenerateResponse>>,
    /// The streaming leg's worker, for error messages.
    pub worker: Arc<Worker>,
    prefill_failure: Option<oneshot::Receiver<Status>>,
    legs: Vec<Leg>,
    finished: bool,
}

impl Generation {
    /// The next response of the streaming leg; `None` at its end. A prefill
    /// failure ends the stream with that failure.
    pub async fn next(&mut self) -> Option<Result<GenerateResponse, Status>> {
        loop {
            let failure = async {
                match self.prefill_failure.as_mut() {
                    Some(rx) => rx.await.ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                message = next_message(&mut self.stream) => {
                    return match message {
                        Ok(Some(response)) => Some(Ok(response)),
                        Ok(None) => {
                            self.finished = true;
                            None
                        }
                        Err(status) => Some(Err(status)),
                    };
                }
                failed = failure => match failed {
                    Some(status) => return Some(Err(status)),
                    // The prefill leg ended well: keep reading decode.
                    None => self.prefill_failure = None,
                },
            }
        }
    }

    /// Marks the request complete: dropping it will abort nothing.
    ///
    /// The worker's stream is read to its end (the trailers) in the
    /// background rather than dropped: dropping an unfinished HTTP/2
    /// stream resets it, and a connection that sees many resets is closed
    /// by h2 ("locally-reset streams reached limit"), failing every other
    /// request on it.
    pub fn finish(&mut self) {
        self.finished = true;
        self.drain_in_background();
    }

    fn drain_in_background(&mut self) {
        let Some(mut stream) = self.stream.take() else {
            return;
        };
        tokio::spawn(async move {
            let drain = async { while let Ok(Some(_)) = stream.message().await {} };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), drain).await;
        });
    }

    /// Aborts every leg now (e.g. a stop string matched in the gateway).
    /// The worker's stream is then drained like after [`finish`](Self::finish):
    /// the aborted request ends with a complete of its own.
    pub fn abort(&mut self, reason: &str) {
        if !self.finished {
            self.legs.iter().for_each(|leg| leg.abort(reason));
            self.finished = true;
        }
        self.drain_in_background();
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.finished {
            self.abort("client went away");
        }
    }
}

/// The next message of `stream`; `Ok(None)` once it was handed off.
async fn next_message(
    stream: &mut Option<Streaming<GenerateResponse>>,
) -> Result<Option<GenerateResponse>, Status> {
    match stream.as_mut() {
        Some(stream) => stream.message().await,
        None => Ok(None),
    }
}

/// A connect failure: nothing was sent, so another worker may be tried.
fn retryable(status: &Status) -> bool {
    status.code() == Code::Unavailable
}

impl Router {
    pub fn new(mode: Mode, max_retries: u32) -> Self {
        Router {
            mode,
            max_retries,
            retries: AtomicU64::new(0),
        }
    }

    /// Starts `request` on the mode's workers.
    pub async fn start(&self, request: GenerateRequest) -> Result<Generation, RouteError> {
        match &self.mode {
            Mode::Aggregated(pool) => self.start_aggregated(pool, request).await,
            Mode::PrefillDecode { prefill, decode } => {
                self.start_pd(prefill, decode, request).await
            }
        }
    }

    async fn start_aggregated(
        &self,
        pool: &Pool,
        request: GenerateRequest,
    ) -> Result<Generation, RouteError> {
        let mut tried = Vec::new();
        loop {
            let worker = pool.pick(&tried).ok_or(RouteError::NoWorker(pool.role))?;
            let attempt = attempt_request(&request, tried.len() as u32);
            let leg = Leg::new(worker.clone(), &attempt.request_id);
            match worker.client().generate(attempt).await {
                Ok(response) => {
                    return Ok(Generation {
                        stream: Some(response.into_inner()),
                        worker,
                        prefill_failure: None,
                        legs: vec![leg],
                        finished: false,
                    })
                }
                Err(status) => {
                    self.retry_or_fail(&worker, status, tried.len() as u32)?;
                    tried.push(worker);
                }
            }
        }
    }

    async fn start_pd(
        &self,
        prefill: &Pool,
        decode: &Pool,
        request: GenerateRequest,
    ) -> Result<Generation, RouteError> {
        let (mut tried_p, mut tried_d) = (Vec::new(), Vec::new());
        let mut attempts = 0u32;
        loop {
            let p = prefill
                .pick(&tried_p)
                .ok_or(RouteError::NoWorker(Role::Prefill))?;
            let d = decode
                .pick(&tried_d)
                .ok_or(RouteError::NoWorker(Role::Decode))?;
            let leg_request = with_kv_room(attempt_request(&request, attempts), &p);
            let (p_leg, d_leg) = (
                Leg::new(p.clone(), &leg_request.request_id),
                Leg::new(d.clone(), &leg_request.request_id),
            );
            let (mut p_client, mut d_client) = (p.client(), d.client());
            let (p_result, d_result) = tokio::join!(
                p_client.generate(leg_request.clone()),
                d_client.generate(leg_request)
            );
            match (p_result, d_result) {
                (Ok(p_stream), Ok(d_stream)) => {
                    let failure = drain_prefill(p_stream.into_inner(), p.clone());
                    return Ok(Generation {
                        stream: Some(d_stream.into_inner()),
                        worker: d,
                        prefill_failure: Some(failure),
                        legs: vec![p_leg, d_leg],
                        finished: false,
                    });
                }
                (Err(status), d_result) => {
                    if d_result.is_ok() {
                        d_leg.abort("prefill leg failed");
                    }
                    self.retry_or_fail(&p, status, attempts)?;
                    attempts += 1;
                    tried_p.push(p);
                }
                (Ok(_), Err(status)) => {
                    p_leg.abort("decode leg failed");
                    self.retry_or_fail(&d, status, attempts)?;
                    attempts += 1;
                    tried_d.push(d);
                }
            }
        }
    }
}

impl Router {
    /// After `worker` failed with `status` on attempt `attempts`: Ok to try
    /// another worker (a connect failure, retries left), else the error.
    fn retry_or_fail(
        &self,
        worker: &Worker,
        status: Status,
        attempts: u32,
    ) -> Result<(), RouteError> {
        if !retryable(&status) || attempts >= self.max_retries {
            return Err(RouteError::Upstream {
                worker: worker.url.to_string(),
                status,
            });
        }
        tracing::warn!(worker = %worker.url, error = %status.message(), "worker unreachable; retrying elsewhere");
        self.retries.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Requests moved to another worker after a connect failure.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
}

/// The request as sent on attempt `attempt`: retries get their own id
/// (`ID-retryN`), so a late Abort of an earlier attempt cannot hit them and
/// a worker still running the earlier attempt does not see a duplicate.
fn attempt_request(request: &GenerateRequest, attempt: u32) -> GenerateRequest {
    let mut attempt_request = request.clone();
    if attempt > 0 {
        attempt_request.request_id = format!("{}-retry{attempt}", request.request_id);
    }
    attempt_request
}

/// The request with a fresh random 63-bit KV room on `prefill`'s data server.
fn with_kv_room(mut leg: GenerateRequest, prefill: &Worker) -> GenerateRequest {
    leg.kv_bootstrap_info = Some(KvBootstrapInfo {
        bootstrap_host: prefill.url.host.clone(),
        bootstrap_port: i32::from(
            prefill
                .url
                .bootstrap_port
                .unwrap_or(iris_proto::DEFAULT_BOOTSTRAP_PORT),
        ),
        bootstrap_room: fastrand::i64(0..=i64::MAX),
    });
    leg
}

/// Reads the prefill leg to its end in the background; a failure is sent
/// on the returned channel.
fn drain_prefill(
    mut stream: Streaming<GenerateResponse>,
    worker: Arc<Worker>,
) -> oneshot::Receiver<Status> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        loop {
            match stream.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return,
                Err(status) => {
                    let message =
                        format!("prefill worker {} failed: {}", worker.url, status.message());
                    let _ = tx.send(Status::new(status.code(), message));
                    return;
                }
            }
        }
    });
    rx
}
