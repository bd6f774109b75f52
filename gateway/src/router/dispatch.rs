//! The one attempt loop every request goes through, whatever the mode.
//!
//! An attempt: the [`Strategy`] picks workers (avoiding this request's
//! suspects) and builds each leg's request; the encode step (EPD), the
//! prefill leg and the streaming leg go out at once. Once every call was
//! accepted the [`Generation`] is handed to the caller — after its first
//! response when the strategy reads ahead (EPD, see
//! [`Plan::read_ahead`]), so that failures surfacing only in the
//! streams, before anything reached the client, can still be retried.
//!
//! After a failed attempt the loop aborts the legs that started, counts
//! every failed call against its worker ([`classify::account`]: only
//! failures that say the worker may be broken count toward its circuit),
//! marks the workers involved as suspects, and — unless the failure is
//! [`Verdict::Fatal`] or `--max-retries` is used up — counts a retry,
//! waits a backoff if the worker was [`Verdict::Busy`], and re-issues the
//! whole request with fresh ids and rooms.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use iris_proto::scheduler::{GenerateRequest, GenerateResponse};
use tonic::{Status, Streaming};

use super::classify::{self, Verdict};
use super::encode;
use super::generation::{FailedLeg, Generation, Leg};
use super::strategy::{Plan, Strategy};
use super::{RouteError, Router};
use crate::workers::affinity::item_patches;
use crate::workers::Worker;

/// Why an attempt failed: the failure that decides what happens next.
struct Failure {
    worker: Arc<Worker>,
    status: Status,
    verdict: Verdict,
}

/// A Generate leg the worker accepted.
struct Accepted {
    stream: Streaming<GenerateResponse>,
    worker: Arc<Worker>,
    leg: Leg,
}

/// A Generate call's outcome: the accepted leg, or its worker and status.
type LegResult = Result<Accepted, (Arc<Worker>, Status)>;

impl Accepted {
    fn from_call(
        worker: Arc<Worker>,
        leg: Leg,
        result: Result<tonic::Response<Streaming<GenerateResponse>>, Status>,
    ) -> LegResult {
        match result {
            Ok(response) => Ok(Accepted {
                stream: response.into_inner(),
                worker,
                leg,
            }),
            Err(status) => Err((worker, status)),
        }
    }
}

/// The calls of an attempt, answered.
struct Sent {
    encoders: Vec<Arc<Worker>>,
    encoded: Vec<(Arc<Worker>, Result<(), Status>)>,
    prefill: Option<LegResult>,
    stream: LegResult,
}

/// The workers of a started generation's legs.
struct LegWorkers {
    prefill: Option<Arc<Worker>>,
    stream: Arc<Worker>,
}

/// The generation of accepted legs, with their workers.
fn generation(prefill: Option<Accepted>, stream: Accepted) -> (Generation, LegWorkers) {
    let workers = LegWorkers {
        prefill: prefill.as_ref().map(|p| p.worker.clone()),
        stream: stream.worker.clone(),
    };
    let (prefill_stream, mut legs) = match prefill {
        Some(p) => (Some((p.stream, p.worker)), vec![p.leg]),
        None => (None, Vec::new()),
    };
    legs.push(stream.leg);
    let generation = Generation::new(stream.stream, stream.worker, prefill_stream, legs);
    (generation, workers)
}

const ABORT_REASON: &str = "another leg of the request failed";

impl Router {
    /// Starts `request` on the mode's workers, retrying failures before
    /// its first response on other workers.
    pub async fn start(&self, request: GenerateRequest) -> Result<Generation, RouteError> {
        let strategy = Strategy::new(&self.mode, request);
        let mut suspects = Vec::new();
        let mut attempt = 0u32;
        loop {
            let plan = strategy
                .plan(attempt, &suspects)
                .map_err(RouteError::NoWorker)?;
            let failure = match self.attempt(plan, &mut suspects).await {
                Ok(generation) => return Ok(generation),
                Err(failure) => failure,
            };
            if failure.verdict == Verdict::Fatal || attempt >= self.max_retries {
                return Err(RouteError::Upstream {
                    worker: failure.worker.url.to_string(),
                    status: failure.status,
                });
            }
            tracing::warn!(
                worker = %failure.worker.url,
                role = failure.worker.role.as_str(),
                code = ?failure.status.code(),
                error = %failure.status.message(),
                "worker failed before the first token; retrying elsewhere"
            );
            self.retries.fetch_add(1, Ordering::Relaxed);
            if failure.verdict == Verdict::Busy {
                tokio::time::sleep(classify::backoff(attempt)).await;
            }
            attempt += 1;
        }
    }

    /// Runs one attempt of `plan`: its generation once every call was
    /// accepted (and, if the plan reads ahead, the first response
    /// arrived), else the failure that decides the next step. Every worker
    /// that failed, and on a late failure every encoder too, joins
    /// `suspects`.
    async fn attempt(
        &self,
        plan: Plan<'_>,
        suspects: &mut Vec<Arc<Worker>>,
    ) -> Result<Generation, Failure> {
        let read_ahead = plan.read_ahead;
        let sent = self.send(plan).await;
        let encoders = sent.encoders.clone();
        let (mut generation, workers) = self.accepted(sent, suspects)?;
        encoders.iter().for_each(|e| e.record_success());
        if read_ahead {
            if let Err((leg, status)) = generation.read_ahead().await {
                generation.abort(ABORT_REASON);
                let worker = match (leg, workers.prefill) {
                    (FailedLeg::Prefill, Some(p)) => p,
                    _ => workers.stream,
                };
                return Err(late_failure(worker, status, encoders, suspects));
            }
        }
        workers.prefill.iter().for_each(|p| p.record_success());
        workers.stream.record_success();
        Ok(generation)
    }

    /// Sends the plan's calls at once: the encode step (after admission)
    /// and both Generate legs.
    async fn send(&self, plan: Plan<'_>) -> Sent {
        let (s_worker, s_request) = plan.stream;
        let id = s_request.request_id.clone();
        let encoders: Vec<Arc<Worker>> = plan.encodes.iter().map(|j| j.worker.clone()).collect();
        let costs: Vec<(Arc<Worker>, u64)> = plan
            .encodes
            .iter()
            .map(|j| (j.worker.clone(), item_patches(j.item)))
            .collect();
        let _encoding: Vec<_> = costs.iter().map(|(e, p)| e.start_encode(*p)).collect();
        let p_leg = plan
            .prefill
            .as_ref()
            .map(|(p, _)| Leg::new(p.clone(), &id, &self.aborts));
        let s_leg = Leg::new(s_worker.clone(), &id, &self.aborts);
        let encode_started = Instant::now();
        let permits = self.admission.acquire(&costs).await;
        let prefill_call = async {
            match &plan.prefill {
                Some((p, request)) => Some(p.generate(request).await),
                None => None,
            }
        };
        let (encoded, p_result, s_result) = tokio::join!(
            encode::send_all(&self.lanes, &plan.encodes, &id, self.encode_timeout),
            prefill_call,
            s_worker.generate(&s_request),
        );
        drop(permits);
        if !encoders.is_empty() {
            self.encode_time.observe(encode_started.elapsed());
        }
        let prefill = plan
            .prefill
            .zip(p_leg)
            .zip(p_result)
            .map(|(((p, _), leg), result)| Accepted::from_call(p, leg, result));
        Sent {
            encoded: encoders.iter().cloned().zip(encoded).collect(),
            encoders,
            prefill,
            stream: Accepted::from_call(s_worker, s_leg, s_result),
        }
    }

    /// The generation of an attempt whose calls were all accepted, with
    /// its legs' workers; else the accepted legs are aborted and the
    /// failed calls counted.
    fn accepted(
        &self,
        sent: Sent,
        suspects: &mut Vec<Arc<Worker>>,
    ) -> Result<(Generation, LegWorkers), Failure> {
        // Every failed call, in order: the encodes, prefill, the stream.
        let mut failed: Vec<(Arc<Worker>, Status)> = sent
            .encoded
            .into_iter()
            .filter_map(|(worker, result)| result.err().map(|status| (worker, status)))
            .collect();
        match (sent.prefill, sent.stream) {
            (None, Ok(stream)) if failed.is_empty() => Ok(generation(None, stream)),
            (Some(Ok(prefill)), Ok(stream)) if failed.is_empty() => {
                Ok(generation(Some(prefill), stream))
            }
            (prefill, stream) => {
                for leg in prefill.into_iter().chain([stream]) {
                    match leg {
                        Ok(accepted) => accepted.leg.abort(ABORT_REASON),
                        Err(failure) => failed.push(failure),
                    }
                }
                Err(self.calls_failed(failed, suspects))
            }
        }
    }

    /// The failed calls of an attempt (at least one): each is counted
    /// against its worker ([`classify::account`]), which joins the
    /// suspects. The attempt's failure is the first [`Verdict::Fatal`] one
    /// (no retry could help), else the first.
    fn calls_failed(
        &self,
        failed: Vec<(Arc<Worker>, Status)>,
        suspects: &mut Vec<Arc<Worker>>,
    ) -> Failure {
        let mut failures: Vec<Failure> = failed
            .into_iter()
            .map(|(worker, status)| {
                let verdict = classify::account(&worker, &status, self.circuit_breaker_failures);
                suspects.push(worker.clone());
                Failure {
                    worker,
                    status,
                    verdict,
                }
            })
            .collect();
        let decisive = failures
            .iter()
            .position(|f| f.verdict == Verdict::Fatal)
            .unwrap_or(0);
        failures.swap_remove(decisive)
    }
}

/// A leg that failed after it started, before its first response. It is
/// counted against the leg's worker but never toward its circuit: the
/// leg may only be passing on a peer's failure (the embedding or the KV
/// state did not arrive). That worker and the attempt's encoders become
/// suspects.
fn late_failure(
    worker: Arc<Worker>,
    status: Status,
    encoders: Vec<Arc<Worker>>,
    suspects: &mut Vec<Arc<Worker>>,
) -> Failure {
    worker.record_refusal();
    suspects.extend(encoders);
    suspects.push(worker.clone());
    Failure {
        verdict: classify::classify(&status),
        worker,
        status,
    }
}
