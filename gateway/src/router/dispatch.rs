//! The one attempt loop every request goes through, whatever the mode.
//!
//! An attempt: the [`Strategy`] picks workers (avoiding this request's
//! suspects) and builds each leg's request; the encode step (EPD), the
//! prefill leg and the streaming leg go out at once; then the streaming
//! leg's first response is read ahead while the prefill leg is watched.
//! Only then is the [`Generation`] handed to the caller, so every failure
//! before the first response — a worker that cannot be reached, an
//! Encode that fails, a KV or embedding transfer that never arrives — is
//! seen while nothing reached the client and can still be retried.
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

use iris_proto::scheduler::GenerateRequest;
use tonic::Status;

use super::classify::{self, Verdict};
use super::encode;
use super::generation::{FailedLeg, Generation, Leg};
use super::strategy::{Plan, Strategy};
use super::{RouteError, Router};
use crate::workers::Worker;

/// Why an attempt failed: the failure that decides what happens next.
struct Failure {
    worker: Arc<Worker>,
    status: Status,
    verdict: Verdict,
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

    /// Runs one attempt of `plan`: its generation once the first response
    /// arrived, else the failure that decides the next step. Every worker
    /// that failed, and on a late failure every encoder too, joins
    /// `suspects`.
    async fn attempt(
        &self,
        plan: Plan<'_>,
        suspects: &mut Vec<Arc<Worker>>,
    ) -> Result<Generation, Failure> {
        let Plan {
            encodes,
            prefill,
            stream,
        } = plan;
        let (s_worker, s_request) = stream;
        let id = s_request.request_id.clone();
        let p_leg = prefill
            .as_ref()
            .map(|(p, _)| Leg::new(p.clone(), &id, &self.aborts));
        let s_leg = Leg::new(s_worker.clone(), &id, &self.aborts);
        let encoders: Vec<Arc<Worker>> = encodes.iter().map(|job| job.worker.clone()).collect();
        let _encoding: Vec<_> = encoders.iter().map(|e| e.start_request()).collect();
        let encode_started = Instant::now();
        let permits = self.admission.acquire(&encoders).await;
        let prefill_call = async {
            match &prefill {
                Some((p, request)) => Some(p.generate(request).await),
                None => None,
            }
        };
        let (encoded, p_result, s_result) = tokio::join!(
            encode::send_all(&self.lanes, &encodes, &id, self.encode_timeout),
            prefill_call,
            s_worker.generate(&s_request),
        );
        drop(permits);
        if !encodes.is_empty() {
            self.encode_time.observe(encode_started.elapsed());
        }

        // Every failed call, in order: the encodes, prefill, the stream.
        let mut failed: Vec<(Arc<Worker>, Status)> = encoders
            .iter()
            .zip(encoded)
            .filter_map(|(worker, result)| result.err().map(|status| (worker.clone(), status)))
            .collect();
        let mut started: Vec<&Leg> = Vec::with_capacity(2);
        let p_stream = match (prefill, p_result, &p_leg) {
            (Some((p, _)), Some(Ok(response)), Some(leg)) => {
                started.push(leg);
                Some((response.into_inner(), p))
            }
            (Some((p, _)), Some(Err(status)), _) => {
                failed.push((p, status));
                None
            }
            _ => None,
        };
        let s_stream = match s_result {
            Ok(response) => response.into_inner(),
            Err(status) => {
                failed.push((s_worker.clone(), status));
                started.iter().for_each(|leg| leg.abort(ABORT_REASON));
                return Err(self.calls_failed(failed, suspects));
            }
        };
        if !failed.is_empty() {
            started.push(&s_leg);
            started.iter().for_each(|leg| leg.abort(ABORT_REASON));
            return Err(self.calls_failed(failed, suspects));
        }
        let legs = p_leg.into_iter().chain([s_leg]).collect();
        encoders.iter().for_each(|e| e.record_success());
        let prefill_worker = p_stream.as_ref().map(|(_, p)| p.clone());
        let mut generation = Generation::new(s_stream, s_worker.clone(), p_stream, legs);
        match generation.read_ahead().await {
            Ok(()) => {
                prefill_worker.iter().for_each(|p| p.record_success());
                s_worker.record_success();
                Ok(generation)
            }
            Err((leg, status)) => {
                generation.abort(ABORT_REASON);
                let worker = match (leg, prefill_worker) {
                    (FailedLeg::Prefill, Some(p)) => p,
                    _ => s_worker,
                };
                Err(late_failure(worker, status, encoders, suspects))
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
