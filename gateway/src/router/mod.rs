//! Sending a GenerateRequest to workers: one aggregated worker, or a
//! prefill and a decode worker at once joined by a fresh KV room, or —
//! with images — encode workers too ([`epd`]). A worker that cannot be
//! reached before anything was streamed is replaced by another (bounded
//! retries). The returned [`Generation`] yields the streaming side's
//! responses and aborts every leg if dropped unfinished.

mod admission;
mod epd;
mod legs;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use iris_proto::scheduler::{AbortRequest, GenerateRequest, GenerateResponse};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;
use tonic::{Code, Status, Streaming};

use crate::metrics::Histogram;
use crate::transport::Lanes;
use crate::workers::affinity::EncodePolicy;
use crate::workers::worker::InFlightGuard;
use crate::workers::{Pool, Role, Worker};

pub use legs::strip_pixels;
use legs::{attempt_request, with_kv_room};

/// How requests are spread over workers.
pub enum Mode {
    Aggregated(Arc<Pool>),
    PrefillDecode {
        prefill: Arc<Pool>,
        decode: Arc<Pool>,
    },
    /// Images to encode workers; prefill fetches their embeddings.
    EncodePrefillDecode {
        encode: Arc<Pool>,
        encode_policy: EncodePolicy,
        prefill: Arc<Pool>,
        decode: Arc<Pool>,
    },
}

impl Mode {
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        match self {
            Mode::Aggregated(pool) => vec![pool.clone()],
            Mode::PrefillDecode { prefill, decode } => vec![prefill.clone(), decode.clone()],
            Mode::EncodePrefillDecode {
                encode,
                prefill,
                decode,
                ..
            } => vec![encode.clone(), prefill.clone(), decode.clone()],
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

/// How the router retries and supervises.
#[derive(Debug, Clone, Copy)]
pub struct RouterSettings {
    /// Other workers tried after a failure before the first token.
    pub max_retries: u32,
    /// Failures in a row that open a worker's circuit (0: never).
    pub circuit_breaker_failures: u32,
    /// Longest wait for an encode worker to accept an image.
    pub encode_timeout: std::time::Duration,
    /// Encode calls in flight per encoder; more images wait (0: unlimited).
    pub encode_max_in_flight: usize,
}

impl Default for RouterSettings {
    /// The command line's defaults.
    fn default() -> Self {
        RouterSettings {
            max_retries: 2,
            circuit_breaker_failures: 3,
            encode_timeout: std::time::Duration::from_secs(10),
            encode_max_in_flight: 8,
        }
    }
}

pub struct Router {
    pub mode: Mode,
    max_retries: u32,
    retries: AtomicU64,
    circuit_breaker_failures: u32,
    encode_timeout: std::time::Duration,
    /// How long the Encode calls of a request took (all images, in parallel).
    pub encode_time: Histogram,
    /// Abort RPCs being sent.
    aborts: TaskTracker,
    admission: admission::Admission,
    /// How pixel tensors reach encode workers.
    pub lanes: Arc<Lanes>,
}

/// One worker leg of a request.
struct Leg {
    worker: Arc<Worker>,
    request_id: String,
    _in_flight: InFlightGuard,
    /// Where the Abort RPC task is tracked (flushed at shutdown).
    aborts: TaskTracker,
}

impl Leg {
    fn new(worker: Arc<Worker>, request_id: &str, aborts: &TaskTracker) -> Leg {
        let guard = worker.start_request();
        Leg {
            worker,
            request_id: request_id.to_owned(),
            _in_flight: guard,
            aborts: aborts.clone(),
        }
    }

    fn abort_if(&self, started: bool, reason: &str) {
        if started {
            self.abort(reason);
        }
    }

    fn abort(&self, reason: &str) {
        let mut client = self.worker.client();
        let request = AbortRequest {
            request_id: self.request_id.clone(),
            reason: reason.to_owned(),
        };
        self.aborts.spawn(async move {
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
    /// A response read ahead (EPD waits for the first one before
    /// answering, so failures before it can be retried), yielded first.
    pending: Option<GenerateResponse>,
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
        if let Some(response) = self.pending.take() {
            return Some(Ok(response));
        }
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
    pub fn new(mode: Mode, settings: RouterSettings) -> Self {
        Router {
            mode,
            max_retries: settings.max_retries,
            retries: AtomicU64::new(0),
            circuit_breaker_failures: settings.circuit_breaker_failures,
            encode_timeout: settings.encode_timeout,
            encode_time: Histogram::default(),
            aborts: TaskTracker::new(),
            admission: admission::Admission::new(settings.encode_max_in_flight),
            lanes: Arc::new(Lanes::inline()),
        }
    }

    /// Waits (at most `limit`) until the Abort RPCs sent so far are out.
    pub async fn flush_aborts(&self, limit: std::time::Duration) {
        self.aborts.close();
        let _ = tokio::time::timeout(limit, self.aborts.wait()).await;
    }

    /// Sends pixel tensors to encode workers by `lanes`.
    pub fn with_lanes(mut self, lanes: Lanes) -> Self {
        self.lanes = Arc::new(lanes);
        self
    }

    /// Starts `request` on the mode's workers.
    pub async fn start(&self, request: GenerateRequest) -> Result<Generation, RouteError> {
        match &self.mode {
            Mode::Aggregated(pool) => self.start_aggregated(pool, request).await,
            Mode::PrefillDecode { prefill, decode } => {
                self.start_pd(prefill, decode, request).await
            }
            Mode::EncodePrefillDecode {
                encode,
                encode_policy,
                prefill,
                decode,
            } => {
                let pools = epd::Pools {
                    encode,
                    policy: encode_policy,
                    prefill,
                    decode,
                };
                self.start_epd(pools, request).await
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
            let leg = Leg::new(worker.clone(), &attempt.request_id, &self.aborts);
            match worker.generate(&attempt).await {
                Ok(response) => {
                    worker.record_success();
                    return Ok(Generation {
                        stream: Some(response.into_inner()),
                        pending: None,
                        worker,
                        prefill_failure: None,
                        legs: vec![leg],
                        finished: false,
                    });
                }
                Err(status) => {
                    self.retry_or_fail(&worker, status, tried.len() as u32)?;
                    tried.push(worker);
                }
            }
        }
    }

    /// Prefill and decode: the prefill leg gets the pixels of any images
    /// (it runs the vision tower itself), the decode leg only their metadata.
    async fn start_pd(
        &self,
        prefill: &Pool,
        decode: &Pool,
        request: GenerateRequest,
    ) -> Result<Generation, RouteError> {
        let decode_request = strip_pixels(&request);
        let (mut tried_p, mut tried_d) = (Vec::new(), Vec::new());
        let mut attempts = 0u32;
        loop {
            let p = prefill
                .pick(&tried_p)
                .ok_or(RouteError::NoWorker(Role::Prefill))?;
            let d = decode
                .pick(&tried_d)
                .ok_or(RouteError::NoWorker(Role::Decode))?;
            let p_request = with_kv_room(attempt_request(&request, attempts), &p);
            let d_request = GenerateRequest {
                kv_bootstrap_info: p_request.kv_bootstrap_info.clone(),
                request_id: p_request.request_id.clone(),
                ..decode_request.clone()
            };
            let (p_leg, d_leg) = (
                Leg::new(p.clone(), &p_request.request_id, &self.aborts),
                Leg::new(d.clone(), &p_request.request_id, &self.aborts),
            );
            let (p_result, d_result) = tokio::join!(p.generate(&p_request), d.generate(&d_request));
            match (p_result, d_result) {
                (Ok(p_stream), Ok(d_stream)) => {
                    p.record_success();
                    d.record_success();
                    let failure = drain_prefill(p_stream.into_inner(), p.clone());
                    return Ok(Generation {
                        stream: Some(d_stream.into_inner()),
                        pending: None,
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
        if retryable(&status) {
            worker.record_failure(self.circuit_breaker_failures);
        }
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
