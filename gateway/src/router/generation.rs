//! A started request ([`Generation`]): the streaming leg's responses, the
//! prefill leg watched in the background, and every leg aborted if the
//! generation is dropped unfinished.

use std::sync::Arc;

use futures::StreamExt;
use iris_proto::scheduler::GenerateResponse;
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;
use tonic::Status;

use crate::backends::ResponseStream;

use crate::workers::worker::InFlightGuard;
use crate::workers::Worker;

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
    legs: Vec<Leg>,
    finished: bool,
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
        Generation {
            stream: Some(stream),
            pending: None,
            worker,
            prefill_failure: prefill.map(|(stream, worker)| drain_prefill(stream, worker)),
            legs,
            finished: false,
        }
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
    /// failure ends the stream with that failure.
    pub async fn next(&mut self) -> Option<Result<GenerateResponse, Status>> {
        self.next_or_failed_leg()
            .await
            .map(|result| result.map_err(|(_, status)| status))
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
                    return match message {
                        Ok(Some(response)) => Some(Ok(response)),
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
            let drain = async { while let Some(Ok(_)) = stream.next().await {} };
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
    stream: &mut Option<ResponseStream>,
) -> Result<Option<GenerateResponse>, Status> {
    match stream.as_mut() {
        Some(stream) => stream.next().await.transpose(),
        None => Ok(None),
    }
}

/// Reads the prefill leg to its end in the background; a failure is sent
/// on the returned channel.
fn drain_prefill(mut stream: ResponseStream, worker: Arc<Worker>) -> oneshot::Receiver<Status> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        loop {
            match stream.next().await {
                Some(Ok(_)) => {}
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
