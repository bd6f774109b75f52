//! A started request ([`Generation`]): the streaming leg's responses, the
//! prefill leg watched in the background, and every leg aborted if the
//! generation is dropped unfinished.
//!
//! Until its first token (a response carrying tokens, or the completion)
//! a generation keeps what it needs to start again ([`Resume`]): a leg
//! that fails before it — the decode worker dying right after the
//! hand-over, a prefill that never delivers — is re-planned on other
//! workers by the attempt loop's rules, and the caller only sees latency.
//!
//! A worker that stops answering without closing its streams (a frozen
//! process, a partitioned host) is caught by its health checks: a stream
//! silent for [`HUNG_POLL`] or longer whose worker (or, until the
//! hand-over, whose prefill worker) has failed them fails that leg as
//! UNAVAILABLE, so the request starts again or moves like after a crash
//! (and the failure counts toward the worker's circuit). One timer per
//! generation ticks for the checks; a response costs only a clock read. A
//! worker that is slow but alive passes its checks and keeps its streams,
//! however long its prefill.
//!
//! A split request's cached tokens are the prefill leg's (the decode
//! worker prefills nothing): the prefill leg's report is carried into the
//! streaming leg's responses, and settles the routing policy's
//! [`Prediction`].

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use iris_proto::scheduler::{generate_response, GenerateRequest, GenerateResponse};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;
use tonic::Status;

use super::classify::{self, Verdict};
use super::dispatch::{Attempts, ABORT_REASON};
use super::migration::Migration;
use super::{RouteError, Router};
use crate::backends::ResponseStream;
use crate::kv::Prediction;
use crate::mm::pending::PendingImages;

use crate::workers::pool::Routed;
use crate::workers::worker::InFlightGuard;
use crate::workers::Worker;

/// How long a completion waits for the prefill leg's, already sent.
const PREFILL_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How often a silent stream looks at its workers' health checks.
const HUNG_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// One worker leg of a request.
pub(super) struct Leg {
    worker: Arc<Worker>,
    request_id: String,
    _in_flight: InFlightGuard,
    /// Where the Abort RPC task is tracked (flushed at shutdown).
    aborts: TaskTracker,
}

impl Leg {
    pub(super) fn new(worker: Arc<Worker>, request_id: &str, aborts: &TaskTracker) -> Leg {
        let guard = worker.start_request();
        Leg {
            worker,
            request_id: request_id.to_owned(),
            _in_flight: guard,
            aborts: aborts.clone(),
        }
    }

    /// Aborts the leg on its worker's backend, in the background.
    pub(super) fn abort(&self, reason: &str) {
        let abort = self
            .worker
            .abort(self.request_id.clone(), reason.to_owned());
        self.aborts.spawn(abort);
    }
}

/// What a generation needs to start again before its first token: the
/// router, the request, its images and where its attempts stand.
pub(super) struct Resume {
    pub router: Arc<Router>,
    pub request: GenerateRequest,
    pub images: PendingImages,
    pub attempts: Attempts,
}

/// Which leg of a generation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FailedLeg {
    Prefill,
    Stream,
}

/// A started request: the streaming leg's responses.
pub struct Generation {
    /// `None` once handed to the background drain by [`finish`](Self::finish).
    stream: Option<ResponseStream>,
    /// The first response, read ahead by the router (so failures before
    /// it can be retried), yielded first.
    pending: Option<GenerateResponse>,
    /// The streaming leg's worker, for error messages.
    pub worker: Arc<Worker>,
    prefill_failure: Option<oneshot::Receiver<Status>>,
    /// The highest cached-token count the prefill leg reported.
    prefill_cached: Arc<AtomicU32>,
    /// What the routing policy expected, settled by the responses.
    prediction: Option<Prediction>,
    /// Its legs' placements, each pool's policy told of the end when
    /// dropped: completed once [`finish`](Self::finish)ed.
    routed: Vec<Routed>,
    /// Until the first token: how to start again elsewhere.
    resume: Option<Box<Resume>>,
    /// After it: how to continue elsewhere (streamed text requests).
    migration: Option<Box<Migration>>,
    legs: Vec<Leg>,
    /// The encode workers of its attempt: suspects too when a leg fails
    /// before the first token (a prefill that could not fetch an
    /// embedding fails because of its encoder).
    encoders: Vec<Arc<Worker>>,
    /// Reads the generations of a move's sequences ([`Self::merged`]):
    /// they watch their own workers and abort their own legs.
    merged: bool,
    finished: bool,
    /// Ticks every [`HUNG_POLL`] while the stream is read: each tick
    /// looks for a hung worker ([`hung_leg`](Self::hung_leg)).
    hung_tick: tokio::time::Interval,
    /// The stream gave a response since the last tick (a flag, not a
    /// time: no clock read per message). Silent from one tick to the
    /// next is silent for at least [`HUNG_POLL`].
    heard: bool,
}

impl Generation {
    /// A generation reading `stream` from `worker`; `prefill` is the
    /// prefill leg's stream and worker when the request is split. `legs`
    /// are aborted if it is dropped unfinished.
    pub(super) fn new(
        stream: ResponseStream,
        worker: Arc<Worker>,
        prefill: Option<(ResponseStream, Arc<Worker>)>,
        legs: Vec<Leg>,
    ) -> Self {
        let prefill_cached = Arc::new(AtomicU32::new(0));
        let prefill_failure =
            prefill.map(|(stream, worker)| drain_prefill(stream, worker, prefill_cached.clone()));
        Generation {
            stream: Some(stream),
            pending: None,
            worker,
            prefill_failure,
            prefill_cached,
            prediction: None,
            routed: Vec::new(),
            resume: None,
            migration: None,
            legs,
            encoders: Vec::new(),
            merged: false,
            finished: false,
            hung_tick: hung_ticks(),
            heard: false,
        }
    }

    /// The generations continuing a request's sequences after a move,
    /// read as one (`parts`: each sequence's index and its generation;
    /// `worker`: one of theirs, named in errors): their responses under
    /// the sequences' own indexes, as they come. Dropped unfinished, it
    /// drops the parts, which abort their legs.
    pub(super) fn merged(worker: Arc<Worker>, parts: Vec<(u32, Generation)>) -> Generation {
        let streams = parts.into_iter().map(|(index, part)| indexed(part, index));
        let stream: ResponseStream = Box::pin(futures::stream::select_all(streams));
        let mut generation = Generation::new(stream, worker, None, Vec::new());
        generation.merged = true;
        generation
    }

    /// Lets the generation start again on other workers if a leg fails
    /// before its first token.
    pub(super) fn resume_with(&mut self, resume: Resume) {
        self.resume = Some(Box::new(resume));
    }

    /// The encode workers the attempt used ([`Self::encoders`]).
    pub(super) fn encoded_by(&mut self, encoders: Vec<Arc<Worker>>) {
        self.encoders = encoders;
    }

    /// Holds what the routing policy expected of the request until it
    /// ends; its responses settle it.
    pub(super) fn expect(&mut self, prediction: Option<Prediction>) {
        self.prediction = prediction;
    }

    /// The placements of its legs ([`crate::workers::Pool::routed`]).
    pub(super) fn routed(&mut self, routed: Vec<Routed>) {
        self.routed = routed;
    }

    /// Before the streaming leg's completion is passed on: the prefill
    /// leg's own completion (and its cached tokens), which the worker sent
    /// before the decode worker could collect the prompt's state, so it is
    /// in flight if not read yet. Its failure no longer matters.
    async fn settle_prefill(&mut self) {
        if let Some(rx) = self.prefill_failure.take() {
            let _ = tokio::time::timeout(PREFILL_SETTLE, rx).await;
        }
    }

    /// A streaming-leg response as the client sees it: a split request's
    /// cached tokens are the prefill leg's. Settles the prediction.
    fn observe(&mut self, mut response: GenerateResponse) -> GenerateResponse {
        let prefill_cached = self.prefill_cached.load(Ordering::Relaxed);
        if let Some(cached) = cached_tokens_mut(&mut response) {
            *cached = (*cached).max(prefill_cached);
            if let Some(prediction) = self.prediction.as_mut() {
                prediction.observe(u64::from(*cached));
            }
        }
        response
    }

    /// Waits for the streaming leg's first response (kept for
    /// [`next`](Self::next)), watching the prefill leg meanwhile. A stream
    /// that ends without any response is left for `next` to report.
    pub(super) async fn read_ahead(&mut self) -> Result<(), (FailedLeg, Status)> {
        match self.next_or_failed_leg().await {
            Some(Ok(first)) => {
                self.pending = Some(first);
                Ok(())
            }
            Some(Err(failure)) => Err(failure),
            None => Ok(()),
        }
    }

    /// The next response of the streaming leg; `None` at its end. A prefill
    /// failure ends the stream with that failure — unless it comes before
    /// the first token, when the request starts again on other workers
    /// (within `--max-retries`).
    ///
    /// Not cancel-safe: one response may take several awaits (settling the
    /// prefill leg, starting again, moving), and a call dropped between
    /// them loses what it had taken. Read several generations at once
    /// with futures that own them (as `completions::runs` does), never by
    /// dropping the slower calls.
    pub async fn next(&mut self) -> Option<Result<GenerateResponse, Status>> {
        loop {
            let failure = match self.next_or_failed_leg().await {
                Some(Ok(response)) => return Some(Ok(self.pass(response))),
                Some(Err(failure)) => Some(failure),
                None => None,
            };
            let outcome = if self.resume.is_some() {
                let (leg, status) = failure.unwrap_or((
                    FailedLeg::Stream,
                    Status::unavailable("the worker's stream ended before its first token"),
                ));
                self.start_again(leg, status).await
            } else if self.may_move(failure.as_ref()) {
                self.move_on(failure.map(|(_, status)| status)).await
            } else {
                return failure.map(|(_, status)| Err(status));
            };
            if let Err(status) = outcome {
                return Some(Err(status));
            }
        }
    }

    /// A response on its way to the caller: at the first token the
    /// request's images are given back (remembered by weak handles) and a
    /// streamed request becomes movable; after a move, it is rewritten as
    /// the one sequence.
    fn pass(&mut self, mut response: GenerateResponse) -> GenerateResponse {
        if carries_tokens(&response) {
            if let Some(resume) = self.resume.take() {
                let images = resume.images.remember();
                self.migration =
                    Migration::of(&resume.router, resume.request, images).map(Box::new);
            }
        }
        if let Some(migration) = self.migration.as_mut() {
            migration.pass(&mut response);
        }
        response
    }

    /// Whether the streaming leg's `failure` (`None`: its stream ended)
    /// after tokens were streamed moves the request to another worker: a
    /// failure of the worker, not of the request, with moves left.
    fn may_move(&self, failure: Option<&(FailedLeg, Status)>) -> bool {
        let failed_worker = match failure {
            None => true,
            Some((leg, status)) => {
                *leg == FailedLeg::Stream && classify::classify(status) != Verdict::Fatal
            }
        };
        failed_worker && self.migration.as_ref().is_some_and(|m| m.can_move())
    }

    /// Continues the sequence on another worker after this one's stream
    /// failed with `status` (`None`: ended without its completion).
    async fn move_on(&mut self, status: Option<Status>) -> Result<(), Status> {
        let Some(mut migration) = self.migration.take() else {
            return Err(status.unwrap_or_else(|| Status::unavailable("the stream ended")));
        };
        let worker = self.worker.clone();
        self.abort(ABORT_REASON);
        let router = migration.router().clone();
        match router.migrate(&mut migration, worker, status.clone()).await {
            Ok(mut next) => {
                next.migration = Some(migration);
                *self = next;
                Ok(())
            }
            Err(error) => Err(status.unwrap_or_else(|| route_status(error))),
        }
    }

    /// Replaces this generation, whose `leg` failed with `status` before
    /// the first token, with the request's next one on other workers;
    /// the failure to report when there is none.
    async fn start_again(&mut self, leg: FailedLeg, status: Status) -> Result<(), Status> {
        let Some(mut resume) = self.resume.take() else {
            return Err(status);
        };
        let worker = match leg {
            FailedLeg::Prefill if self.legs.len() > 1 => self.legs[0].worker.clone(),
            _ => self.worker.clone(),
        };
        let others = self
            .legs
            .iter()
            .map(|leg| leg.worker.clone())
            .chain(self.encoders.iter().cloned())
            .filter(|w| !Arc::ptr_eq(w, &worker))
            .collect();
        self.abort(ABORT_REASON);
        let router = resume.router.clone();
        match router.resume(&mut resume, worker, others, status).await {
            Ok(mut next) => {
                next.resume = Some(resume);
                // The failed generation is finished: dropping it aborts nothing more.
                *self = next;
                Ok(())
            }
            Err(error) => Err(route_status(error)),
        }
    }

    async fn next_or_failed_leg(
        &mut self,
    ) -> Option<Result<GenerateResponse, (FailedLeg, Status)>> {
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
                    self.heard = true;
                    return match message {
                        Ok(Some(response)) => {
                            if is_complete(&response) {
                                self.settle_prefill().await;
                            }
                            Some(Ok(self.observe(response)))
                        }
                        Ok(None) => {
                            self.finished = true;
                            None
                        }
                        Err(status) => Some(Err((FailedLeg::Stream, status))),
                    };
                }
                failed = failure => match failed {
                    Some(status) => return Some(Err((FailedLeg::Prefill, status))),
                    // The prefill leg ended well: keep reading the stream.
                    None => self.prefill_failure = None,
                },
                _ = self.hung_tick.tick() => {
                    let silent = !std::mem::take(&mut self.heard);
                    if let Some(hung) = self.hung_leg(silent) {
                        return Some(Err(hung));
                    }
                }
            }
        }
    }

    /// The leg that hangs, if the stream has been `silent` (no response
    /// for a whole tick, [`HUNG_POLL`]) and its worker (or, until the prefill leg has ended,
    /// the prefill worker) fails its health checks.
    fn hung_leg(&self, silent: bool) -> Option<(FailedLeg, Status)> {
        if self.merged || !silent {
            return None;
        }
        let prefill = self
            .legs
            .first()
            .filter(|_| self.prefill_failure.is_some() && self.legs.len() > 1)
            .map(|leg| (FailedLeg::Prefill, &leg.worker));
        let (leg, worker) = std::iter::once((FailedLeg::Stream, &self.worker))
            .chain(prefill)
            .find(|(_, w)| !w.checks_pass())?;
        let message = format!(
            "worker {} is hung: it fails its health checks and its stream has been silent",
            worker.url
        );
        Some((leg, Status::unavailable(message)))
    }

    /// Times the request moved to another worker mid-stream.
    pub fn migrations(&self) -> u32 {
        self.migration.as_ref().map_or(0, |m| m.made())
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
        self.routed.iter_mut().for_each(Routed::complete);
        self.drain_in_background();
    }

    fn drain_in_background(&mut self) {
        let Some(mut stream) = self.stream.take() else {
            return;
        };
        // Usually the trailers came with the last message: read what is
        // already here, and spawn a reader only for what is not.
        loop {
            match stream.next().now_or_never() {
                Some(Some(Ok(_))) => continue,
                Some(None | Some(Err(_))) => return,
                None => break,
            }
        }
        tokio::spawn(async move {
            let drain = async { while let Some(Ok(_)) = stream.next().await {} };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), drain).await;
        });
    }

    /// Aborts every leg now (e.g. a stop string matched in the gateway).
    /// The worker's stream is then drained like after [`finish`](Self::finish):
    /// the aborted request ends with a complete of its own.
    pub fn abort(&mut self, reason: &str) {
        let unfinished = !self.finished;
        if unfinished {
            self.legs.iter().for_each(|leg| leg.abort(reason));
            self.finished = true;
        }
        if self.merged && unfinished {
            // Dropping the parts unfinished aborts their legs.
            self.stream = None;
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
    stream: &mut Option<ResponseStream>,
) -> Result<Option<GenerateResponse>, Status> {
    match stream.as_mut() {
        Some(stream) => stream.next().await.transpose(),
        None => Ok(None),
    }
}

/// `generation`'s responses as sequence `index`'s.
fn indexed(generation: Generation, index: u32) -> ResponseStream {
    Box::pin(futures::stream::unfold(
        generation,
        move |mut part| async move {
            let item = part.next().await?;
            Some((item.map(|response| with_index(response, index)), part))
        },
    ))
}

/// `response` of sequence `index`.
fn with_index(mut response: GenerateResponse, index: u32) -> GenerateResponse {
    match response.response.as_mut() {
        Some(generate_response::Response::Chunk(chunk)) => chunk.index = index,
        Some(generate_response::Response::Complete(complete)) => complete.index = index,
        None => {}
    }
    response
}

/// One timer per generation for the hung-worker checks: its first tick
/// one [`HUNG_POLL`] from now, missed ticks not made up.
fn hung_ticks() -> tokio::time::Interval {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + HUNG_POLL, HUNG_POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// Whether `response` carries tokens or ends its sequence: what, once it
/// reaches the caller, makes a restart elsewhere no longer invisible.
fn carries_tokens(response: &GenerateResponse) -> bool {
    match &response.response {
        Some(generate_response::Response::Chunk(chunk)) => !chunk.token_ids.is_empty(),
        Some(generate_response::Response::Complete(_)) => true,
        None => false,
    }
}

/// A failed restart as the status the caller reports.
fn route_status(error: RouteError) -> Status {
    match error {
        RouteError::Upstream { worker, status } => Status::new(
            status.code(),
            format!("worker {worker}: {}", status.message()),
        ),
        RouteError::NoWorker(role) => Status::unavailable(format!(
            "no healthy {} worker left to retry on",
            role.as_str()
        )),
        RouteError::Image(error) => Status::internal(error.message),
    }
}

/// Whether `response` ends its sequence.
fn is_complete(response: &GenerateResponse) -> bool {
    matches!(
        response.response,
        Some(generate_response::Response::Complete(_))
    )
}

/// The cached-token count of a chunk or a completion.
fn cached_tokens_mut(response: &mut GenerateResponse) -> Option<&mut u32> {
    match response.response.as_mut()? {
        generate_response::Response::Chunk(chunk) => Some(&mut chunk.cached_tokens),
        generate_response::Response::Complete(complete) => Some(&mut complete.cached_tokens),
    }
}

/// Reads the prefill leg to its end in the background, keeping the highest
/// cached-token count it reports in `cached`; a failure is sent on the
/// returned channel.
fn drain_prefill(
    mut stream: ResponseStream,
    worker: Arc<Worker>,
    cached: Arc<AtomicU32>,
) -> oneshot::Receiver<Status> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        loop {
            match stream.next().await {
                Some(Ok(mut response)) => {
                    if let Some(count) = cached_tokens_mut(&mut response) {
                        cached.fetch_max(*count, Ordering::Relaxed);
                    }
                }
                None => return,
                Some(Err(status)) => {
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
