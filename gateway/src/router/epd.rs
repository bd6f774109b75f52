//! Encode + prefill + decode for requests with images.
//!
//! Per image an encode worker (the encode policy, keyed by the image's
//! content hash) and a fresh room; the Encode calls and both Generate legs
//! go out at once. Everything is supervised: an Encode that fails
//! (connect error, error status, `accepted = false`), or a prefill or
//! decode leg that fails before the first token, re-issues the whole
//! request on other workers with fresh rooms (bounded by `--max-retries`;
//! the encoders' embedding caches make re-encoding a repeated image
//! cheap). Nothing waits for a receive timeout: the first response is read
//! ahead, so every failure before it is seen and can still be retried.
//!
//! Each image's pixels take the lane chosen for its encoder
//! ([`Lanes`]): inline, a `/dev/shm` file or an RDMA arena slot keyed by
//! the attempt's fresh room. The delivery ticket is settled by the Encode
//! call's outcome: delivered once accepted; otherwise dropped (the shm
//! file is unlinked, the slot is left to the NIXL notification or the
//! reaper, since the encoder may still be READing it). A retry prepares
//! the image again for its new encoder and room.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iris_proto::encoder::{EncodeItemAssignment, EncodeRequest};
use iris_proto::scheduler::{GenerateRequest, GenerateResponse, MultimodalInputs, MultimodalItem};
use tokio::sync::oneshot;
use tonic::{Code, Status, Streaming};

use super::legs::{attempt_request, new_room, strip_pixels, with_encode_info, with_kv_room};
use super::{drain_prefill, Generation, Leg, RouteError, Router};
use crate::transport::Lanes;
use crate::workers::affinity::{affinity_key, EncodePolicy};
use crate::workers::{Pool, Role, Worker};

/// The pools of an EPD deployment.
pub(super) struct Pools<'a> {
    pub encode: &'a Pool,
    pub policy: &'a EncodePolicy,
    pub prefill: &'a Pool,
    pub decode: &'a Pool,
}

/// Workers that failed during this request: later attempts prefer others.
#[derive(Default)]
struct Suspects {
    encode: Vec<Arc<Worker>>,
    prefill: Vec<Arc<Worker>>,
    decode: Vec<Arc<Worker>>,
}

/// Why one attempt failed.
struct Failure {
    worker: Arc<Worker>,
    status: Status,
    /// Another attempt may succeed.
    retryable: bool,
}

impl Failure {
    fn new(worker: &Arc<Worker>, status: Status, retryable: bool) -> Self {
        Failure {
            worker: worker.clone(),
            status,
            retryable,
        }
    }
}

/// An attempt's outcome: a generation, a failure worth reporting, or no
/// worker of some role.
enum Attempt {
    Started(Box<Generation>),
    Failed(Failure),
    NoWorker(Role),
}

impl Router {
    pub(super) async fn start_epd(
        &self,
        pools: Pools<'_>,
        request: GenerateRequest,
    ) -> Result<Generation, RouteError> {
        let items = request
            .mm_inputs
            .as_ref()
            .map(|m| m.items.clone())
            .unwrap_or_default();
        if items.is_empty() {
            return self.start_pd(pools.prefill, pools.decode, request).await;
        }
        let stripped = strip_pixels(&request);
        drop(request);
        let mut suspects = Suspects::default();
        let mut attempt = 0u32;
        loop {
            let failure = match self
                .epd_attempt(&pools, &items, &stripped, attempt, &mut suspects)
                .await
            {
                Attempt::Started(generation) => return Ok(*generation),
                Attempt::NoWorker(role) => return Err(RouteError::NoWorker(role)),
                Attempt::Failed(failure) => failure,
            };
            if !failure.retryable || attempt >= self.max_retries {
                return Err(RouteError::Upstream {
                    worker: failure.worker.url.to_string(),
                    status: failure.status,
                });
            }
            tracing::warn!(
                worker = %failure.worker.url,
                role = failure.worker.role.as_str(),
                error = %failure.status.message(),
                "EPD leg failed before the first token; re-issuing on other workers"
            );
            self.retries
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if busy(&failure.status) {
                // Give an overloaded encoder a moment instead of hammering it.
                tokio::time::sleep(Duration::from_millis(50 << attempt.min(5))).await;
            }
            attempt += 1;
        }
    }

    async fn epd_attempt(
        &self,
        pools: &Pools<'_>,
        items: &[MultimodalItem],
        stripped: &GenerateRequest,
        attempt: u32,
        suspects: &mut Suspects,
    ) -> Attempt {
        let Some(encoders) = pick_encoders(pools, items, &suspects.encode) else {
            return Attempt::NoWorker(Role::Encode);
        };
        let Some(p) = pools.prefill.pick(&suspects.prefill) else {
            return Attempt::NoWorker(Role::Prefill);
        };
        let Some(d) = pools.decode.pick(&suspects.decode) else {
            return Attempt::NoWorker(Role::Decode);
        };
        let rooms: Vec<i64> = items.iter().map(|_| new_room()).collect();
        let d_request = with_kv_room(attempt_request(stripped, attempt), &p);
        let p_request = with_encode_info(d_request.clone(), &encoders, &rooms);
        let id = d_request.request_id.clone();
        let (p_leg, d_leg) = (
            Leg::new(p.clone(), &id, &self.aborts),
            Leg::new(d.clone(), &id, &self.aborts),
        );
        let _encoding: Vec<_> = encoders.iter().map(|e| e.start_request()).collect();
        let encode_started = Instant::now();
        let permits = self.admission.acquire(&encoders).await;
        let encodes = futures::future::join_all(
            items
                .iter()
                .zip(encoders.iter().zip(&rooms))
                .enumerate()
                .map(|(i, (item, (worker, room)))| {
                    encode(
                        &self.lanes,
                        worker,
                        format!("{id}-img{i}"),
                        item,
                        *room,
                        self.encode_timeout,
                    )
                }),
        );
        let (encoded, p_result, d_result) =
            tokio::join!(encodes, p.generate(&p_request), d.generate(&d_request));
        drop(permits);
        self.encode_time.observe(encode_started.elapsed());
        let failed_encodes: Vec<(&Arc<Worker>, Status)> = encoders
            .iter()
            .zip(encoded)
            .filter_map(|(worker, result)| result.err().map(|status| (worker, status)))
            .collect();
        let failed_encode = self.encodes_failed(failed_encodes, suspects);
        const REASON: &str = "another leg of the request failed";
        let (p_stream, d_stream) = match (failed_encode, p_result, d_result) {
            (None, Ok(p_stream), Ok(d_stream)) => (p_stream.into_inner(), d_stream.into_inner()),
            (Some(failure), p_result, d_result) => {
                p_leg.abort_if(p_result.is_ok(), REASON);
                d_leg.abort_if(d_result.is_ok(), REASON);
                return Attempt::Failed(failure);
            }
            (None, Err(status), d_result) => {
                d_leg.abort_if(d_result.is_ok(), REASON);
                return Attempt::Failed(self.leg_failed(&p, status, &mut suspects.prefill));
            }
            (None, Ok(_), Err(status)) => {
                p_leg.abort(REASON);
                return Attempt::Failed(self.leg_failed(&d, status, &mut suspects.decode));
            }
        };
        encoders.iter().for_each(|e| e.record_success());
        let failure = drain_prefill(p_stream, p.clone());
        match read_ahead(d_stream, failure).await {
            Ok((stream, pending, prefill_failure)) => {
                p.record_success();
                d.record_success();
                Attempt::Started(Box::new(Generation {
                    stream: Some(stream),
                    pending,
                    worker: d,
                    prefill_failure,
                    legs: vec![p_leg, d_leg],
                    finished: false,
                }))
            }
            Err((leg, status)) => {
                p_leg.abort(REASON);
                d_leg.abort(REASON);
                // The embeddings or the KV state did not arrive: the
                // encoders of this attempt are suspects too.
                suspects.encode.extend(encoders.iter().cloned());
                let retryable = retryable_before_first_token(&status);
                let worker = match leg {
                    Role::Prefill => {
                        suspects.prefill.push(p.clone());
                        p
                    }
                    _ => {
                        suspects.decode.push(d.clone());
                        d
                    }
                };
                Attempt::Failed(Failure::new(&worker, status, retryable))
            }
        }
    }

    /// The failed Encode calls of an attempt: each encoder is counted and
    /// avoided for this request. The attempt's failure (`None`: no call
    /// failed) is the first that says the request itself is wrong (no
    /// retry could help), else the first.
    fn encodes_failed(
        &self,
        failed: Vec<(&Arc<Worker>, Status)>,
        suspects: &mut Suspects,
    ) -> Option<Failure> {
        let failures: Vec<Failure> = failed
            .into_iter()
            .map(|(worker, status)| {
                count_encode_failure(worker, &status, self.circuit_breaker_failures);
                suspects.encode.push(worker.clone());
                let retryable = retryable_before_first_token(&status);
                let status = Status::new(
                    status.code(),
                    format!("encode worker {} failed: {}", worker.url, status.message()),
                );
                Failure::new(worker, status, retryable)
            })
            .collect();
        let decisive = failures.iter().position(|f| !f.retryable).unwrap_or(0);
        failures.into_iter().nth(decisive)
    }

    /// A Generate leg could not be started.
    fn leg_failed(
        &self,
        worker: &Arc<Worker>,
        status: Status,
        suspects: &mut Vec<Arc<Worker>>,
    ) -> Failure {
        let retryable = super::retryable(&status);
        if retryable {
            worker.record_failure(self.circuit_breaker_failures);
        }
        suspects.push(worker.clone());
        Failure::new(worker, status, retryable)
    }
}

/// Counts a failed Encode against `worker`. Every failure is counted; only
/// those that say the encoder is broken count toward its circuit, not
/// pushback (queue full, too slow to accept) nor a refused request.
fn count_encode_failure(worker: &Worker, status: &Status, circuit_breaker_failures: u32) {
    if busy(status) || !retryable_before_first_token(status) {
        worker.record_refusal();
    } else {
        worker.record_failure(circuit_breaker_failures);
    }
}

/// One encode worker per image, or `None` when the pool has no healthy one.
fn pick_encoders(
    pools: &Pools<'_>,
    items: &[MultimodalItem],
    suspects: &[Arc<Worker>],
) -> Option<Vec<Arc<Worker>>> {
    let candidates = pools.encode.candidates(suspects);
    let keys = items.iter().map(|item| affinity_key(&item.content_hash));
    pools.policy.pick_all(&candidates, keys)
}

/// Sends one image to `worker` under `room`, its pixels on the worker's
/// lane; `Ok` once it was accepted.
async fn encode(
    lanes: &Arc<Lanes>,
    worker: &Arc<Worker>,
    request_id: String,
    item: &MultimodalItem,
    room: i64,
    timeout: Duration,
) -> Result<(), Status> {
    let (item, ticket) = prepare(lanes, worker, item, room).await?;
    let result = call_encode(worker, request_id, item, room, timeout).await;
    if let Some(ticket) = ticket {
        match &result {
            Ok(()) => ticket.delivered(),
            Err(_) => drop(ticket),
        }
    }
    result
}

/// The item with its pixels on `worker`'s lane, prepared on the blocking
/// pool unless they stay inline.
async fn prepare(
    lanes: &Arc<Lanes>,
    worker: &Arc<Worker>,
    item: &MultimodalItem,
    room: i64,
) -> Result<(MultimodalItem, Option<iris_transport::DeliveryTicket>), Status> {
    if lanes.requested(worker) == iris_transport::Transport::Inline {
        return lanes.prepare(worker, item, room);
    }
    let (lanes, worker, item) = (lanes.clone(), worker.clone(), item.clone());
    tokio::task::spawn_blocking(move || lanes.prepare(&worker, &item, room))
        .await
        .map_err(|e| Status::internal(format!("preparing the image's tensor failed: {e}")))?
}

async fn call_encode(
    worker: &Arc<Worker>,
    request_id: String,
    item: MultimodalItem,
    room: i64,
    timeout: Duration,
) -> Result<(), Status> {
    let request = EncodeRequest {
        request_id,
        mm_inputs: Some(MultimodalInputs { items: vec![item] }),
        items: vec![EncodeItemAssignment {
            bootstrap_room: room,
        }],
    };
    match tokio::time::timeout(timeout, worker.encode(&request, timeout)).await {
        Ok(Ok(response)) if response.accepted => Ok(()),
        Ok(Ok(_)) => Err(Status::unavailable("the encoder did not accept the item")),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer to Encode within {} ms",
            timeout.as_millis()
        ))),
    }
}

type ReadAhead = (
    Streaming<GenerateResponse>,
    Option<GenerateResponse>,
    Option<oneshot::Receiver<Status>>,
);

/// Waits for decode's first response, watching the prefill leg meanwhile.
/// An error names the leg that failed.
async fn read_ahead(
    mut stream: Streaming<GenerateResponse>,
    failure: oneshot::Receiver<Status>,
) -> Result<ReadAhead, (Role, Status)> {
    let mut failure = Some(failure);
    loop {
        let prefill_failed = async {
            match failure.as_mut() {
                Some(rx) => rx.await.ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            failed = prefill_failed => match failed {
                Some(status) => return Err((Role::Prefill, status)),
                // The prefill leg ended well; keep waiting for decode.
                None => failure = None,
            },
            message = stream.message() => return match message {
                Ok(first) => Ok((stream, first, failure)),
                Err(status) => Err((Role::Decode, status)),
            },
        }
    }
}

/// The encoder is overloaded rather than broken (queue full, or too slow
/// to accept): the image goes elsewhere or waits, but the encoder's
/// circuit stays closed.
fn busy(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::ResourceExhausted | Code::DeadlineExceeded
    )
}

/// Before the first token nothing reached the client, so any failure may
/// be retried elsewhere — except errors that say the request itself is
/// wrong, which another worker would refuse too.
fn retryable_before_first_token(status: &Status) -> bool {
    !matches!(
        status.code(),
        Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::PermissionDenied
            | Code::Unauthenticated
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::WorkerUrl;

    fn encoder() -> Arc<Worker> {
        let url = WorkerUrl::parse("grpc://127.0.0.1:1").unwrap();
        let worker = Worker::new(url, Role::Encode, Duration::from_secs(1)).unwrap();
        worker.set_healthy(true);
        worker
    }

    #[tokio::test]
    async fn pushback_timeouts_and_refused_requests_count_but_keep_the_circuit_closed() {
        let codes = [
            Code::ResourceExhausted,
            Code::DeadlineExceeded,
            Code::InvalidArgument,
        ];
        for code in codes {
            let worker = encoder();
            count_encode_failure(&worker, &Status::new(code, "no"), 1);
            assert_eq!(worker.request_counts(), (0, 1), "{code:?} is counted");
            assert!(worker.is_healthy(), "{code:?} leaves the circuit closed");
        }
    }

    #[tokio::test]
    async fn a_broken_encoder_counts_toward_its_circuit() {
        for code in [Code::Unavailable, Code::Internal, Code::Unknown] {
            let worker = encoder();
            count_encode_failure(&worker, &Status::new(code, "broken"), 1);
            assert_eq!(worker.request_counts(), (0, 1));
            assert!(!worker.is_healthy(), "{code:?} opens the circuit");
        }
    }
}
