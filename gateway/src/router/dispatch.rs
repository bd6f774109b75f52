//! The one attempt loop every request goes through, whatever the mode.
//!
//! An attempt: the [`Strategy`] picks workers (avoiding this request's
//! suspects) and builds each leg's request; the encode step (EPD), the
//! prefill leg and the streaming leg go out at once. The [`Generation`] is
//! handed to the caller as the plan's [`Handover`] says: once every call
//! was accepted, or after its first response (EPD, and any attempt whose
//! pixels went by the shm or RDMA lane), so that failures surfacing only
//! in the streams, before anything reached the client, can still be
//! retried. The pools' policies are then told which workers took it.
//! The generation keeps the request and its [`Attempts`] until its first
//! token: a leg failing after the hand-over but before it is re-planned
//! by [`Router::resume`], under the same rules and the same
//! `--max-retries`.
//!
//! After a failed attempt ([`Failure`]) the loop aborts the legs that
//! started, counts every failed call against its worker
//! ([`classify::account`]: only failures that say the worker may be
//! broken count toward its circuit), marks the workers involved as
//! suspects, and — unless the failure is [`Verdict::Fatal`] or
//! `--max-retries` is used up — counts a retry, waits a backoff if the
//! worker was [`Verdict::Busy`], and re-issues the whole request with
//! fresh ids and rooms.
//!
//! vLLM PD ([`Handover::PrefillFirst`]) runs its prefill leg to its end
//! first ([`Router::prefill_first`]): a prefill failure is an ordinary
//! failed call of the attempt (retried on other workers), and the decode
//! leg then goes out alone with the KV-transfer parameters prefill answered.
//!
//! Pixels inside a Generate leg go by the worker's lane ([`pixels`]). A
//! worker that refuses their RDMA payload because its puller is off
//! ([`classify::rdma_refused`]) has rdma turned off until it restarts and
//! the request is planned again at once, its pixels now inline: that
//! re-plan is neither a retry nor a failure of the worker.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use iris_openai::ApiError;
use iris_proto::scheduler::GenerateRequest;
use tonic::Status;

use super::classify::{self, Verdict};
use super::encode::{self, EncodeJob};
use super::generation::{FailedLeg, Generation, Leg, Resume};
use super::pixels::{self, Laned};
use super::strategy::{Handover, Plan, Strategy};
use super::{RouteError, Router};
use crate::backends::{Backend, ResponseStream};
use crate::mm::pending::PendingImages;
use crate::trace;
use crate::workers::affinity::item_patches;
use crate::workers::Worker;

/// Why an attempt failed: the failure that decides what happens next.
enum Failure {
    /// A call failed on `worker`; `verdict` says whether another worker
    /// may succeed. `through`: the workers it may only have passed the
    /// failure on from (a late failure's encoders and prefill worker).
    Worker {
        worker: Arc<Worker>,
        status: Status,
        verdict: Verdict,
        through: Vec<Arc<Worker>>,
    },
    /// The worker refused the RDMA lane of its pixels (its puller is off):
    /// plan again at once, the pixels now inline; nobody is blamed.
    LaneRefused { worker: Arc<Worker>, status: Status },
    /// The worker no longer held an image it was sent by content hash
    /// alone (`router/pixels.rs`): plan again at once, that image's pixels
    /// now sent; nobody is blamed.
    RecallMissed { worker: Arc<Worker>, status: Status },
    /// An image of the request failed to preprocess: the request ends
    /// with its error, and no worker is blamed.
    Image(ApiError),
}

/// Re-plans after RDMA refusals and recall misses per request at most
/// (each turns rdma off for one worker, or makes the missed images go with
/// their pixels, so more would mean the same worker refused again).
const MAX_LANE_REPLANS: u32 = 4;

/// A Generate leg the worker accepted.
struct Accepted {
    stream: ResponseStream,
    worker: Arc<Worker>,
    leg: Leg,
}

/// A Generate call's outcome: the accepted leg, or its worker and status.
type LegResult = Result<Accepted, (Arc<Worker>, Status)>;

impl Accepted {
    fn from_call(
        worker: Arc<Worker>,
        leg: Leg,
        result: Result<ResponseStream, Status>,
    ) -> LegResult {
        match result {
            Ok(stream) => Ok(Accepted {
                stream,
                worker,
                leg,
            }),
            Err(status) => Err((worker, status)),
        }
    }
}

/// The calls of an attempt, answered.
struct Sent {
    /// An image of the request failed to preprocess.
    image: Option<ApiError>,
    /// The Generate legs' pixels that went by the shm or RDMA lane.
    laned: Laned,
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

pub(super) const ABORT_REASON: &str = "another leg of the request failed";

/// The failure of an attempt one of whose images failed to preprocess:
/// its accepted legs are aborted and nobody is blamed.
fn image_failed(error: ApiError, prefill: Option<LegResult>, stream: LegResult) -> Failure {
    for leg in prefill.into_iter().chain([stream]).flatten() {
        leg.leg
            .abort("an image of the request could not be preprocessed");
    }
    Failure::Image(error)
}

/// A leg aborted if dropped while still set (a vLLM prefill leg whose
/// request went away before it answered).
struct AbortOnDrop(Option<Leg>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(leg) = self.0.take() {
            leg.abort("client went away");
        }
    }
}

/// Where a request's attempts stand: plans made (each with its own
/// request id), retries and lane re-plans used, and the workers that
/// failed it. Kept by a started [`Generation`] so that a failure before
/// its first token continues the same count.
#[derive(Default)]
pub(super) struct Attempts {
    made: u32,
    retried: u32,
    /// Retries that cost none of `--max-retries` (at most
    /// [`FREE_RETRIES`]): after a worker that could not be reached at all,
    /// or one whose failure was already paid for ([`Attempts::paid_for`]).
    free: u32,
    replanned: u32,
    suspects: Vec<Arc<Worker>>,
    /// The workers whose failures were charged to `--max-retries`.
    charged: Vec<Arc<Worker>>,
    /// The workers suspected because another's late failure may have
    /// been theirs (its encoders, its prefill worker).
    through: Vec<Arc<Worker>>,
}

/// Retries after unreachable workers a request may make beyond
/// `--max-retries`.
const FREE_RETRIES: u32 = 8;

impl Attempts {
    /// Whether the failure of `worker` was already paid for: an earlier
    /// late failure of another worker (a prefill that could not fetch its
    /// embedding, a decode whose prefill died) may have been its own, and
    /// it has not been charged itself. One death seen through two legs
    /// costs one retry.
    fn paid_for(&self, worker: &Arc<Worker>) -> bool {
        let has = |list: &[Arc<Worker>]| list.iter().any(|w| Arc::ptr_eq(w, worker));
        has(&self.through) && !has(&self.charged)
    }

    /// A fresh count that avoids `worker`.
    pub fn suspecting(worker: Arc<Worker>) -> Self {
        Attempts {
            suspects: vec![worker],
            ..Attempts::default()
        }
    }
}

impl Router {
    /// Starts `request` on the mode's workers, retrying failures before
    /// its first response on other workers.
    pub async fn start(
        self: &Arc<Self>,
        request: GenerateRequest,
    ) -> Result<Generation, RouteError> {
        self.start_with(request, &PendingImages::default()).await
    }

    /// [`Router::start`] for a request whose items' pixels may still be
    /// on their way (`images`): in EPD each image's Encode waits for that
    /// image alone, and an image that fails to preprocess ends the request
    /// with its error ([`RouteError::Image`]), no worker blamed.
    ///
    /// The generation keeps the request (and `images`, so their memory
    /// stays counted) until its first token: a leg that fails before it,
    /// after the hand-over, is re-planned on other workers by the same
    /// rules ([`Generation::next`]).
    pub async fn start_with(
        self: &Arc<Self>,
        request: GenerateRequest,
        images: &PendingImages,
    ) -> Result<Generation, RouteError> {
        let mut attempts = Attempts::default();
        let mut generation = Box::pin(self.run(&request, images, &mut attempts)).await?;
        generation.resume_with(Resume {
            router: self.clone(),
            request,
            images: images.clone(),
            attempts,
        });
        Ok(generation)
    }

    /// The attempt loop: plans and attempts until one is handed over, or
    /// a failure ends the request.
    pub(super) async fn run(
        &self,
        request: &GenerateRequest,
        images: &PendingImages,
        attempts: &mut Attempts,
    ) -> Result<Generation, RouteError> {
        let strategy = Strategy::new(&self.mode, request.clone(), images);
        loop {
            let routing = Instant::now();
            let plan = strategy
                .plan(attempts.made, &attempts.suspects)
                .map_err(RouteError::NoWorker)?;
            trace::stage_on("route", routing, || plan.stream.0.url.to_string());
            let legs = plan.leg_workers();
            let failure = match self.attempt(plan, &mut attempts.suspects).await {
                Ok(mut generation) => {
                    generation.routed(strategy.routed(&legs));
                    return Ok(generation);
                }
                Err(failure) => failure,
            };
            attempts.made += 1;
            let (worker, status, verdict) = match failure {
                Failure::Image(error) => return Err(RouteError::Image(error)),
                Failure::LaneRefused { .. } | Failure::RecallMissed { .. }
                    if attempts.replanned < MAX_LANE_REPLANS =>
                {
                    attempts.replanned += 1;
                    continue;
                }
                Failure::LaneRefused { worker, status }
                | Failure::RecallMissed { worker, status } => (worker, status, Verdict::Retry),
                Failure::Worker {
                    worker,
                    status,
                    verdict,
                    through,
                } => {
                    attempts.through.extend(through);
                    (worker, status, verdict)
                }
            };
            self.retry_after(worker, status, verdict, attempts).await?;
        }
    }

    /// After `worker` failed an attempt with `status`: the request's end
    /// when no other worker would do better or `--max-retries` is used up,
    /// else a counted retry (after a backoff when the worker was busy).
    pub(super) async fn retry_after(
        &self,
        worker: Arc<Worker>,
        status: Status,
        verdict: Verdict,
        attempts: &mut Attempts,
    ) -> Result<(), RouteError> {
        // Nothing was sent to a worker that could not be reached, and its
        // circuit opened at once (`classify::account`): trying the next one
        // costs no retry. Nor does a failure already paid for.
        let free = (classify::unreachable(&status) || attempts.paid_for(&worker))
            && attempts.free < FREE_RETRIES;
        if verdict == Verdict::Fatal || (!free && attempts.retried >= self.max_retries) {
            return Err(RouteError::Upstream {
                worker: worker.url.to_string(),
                status,
            });
        }
        tracing::warn!(
            worker = %worker.url,
            role = worker.role.as_str(),
            code = ?status.code(),
            error = %status.message(),
            "worker failed before the first token; retrying elsewhere"
        );
        self.retries.fetch_add(1, Ordering::Relaxed);
        if verdict == Verdict::Busy {
            tokio::time::sleep(classify::backoff(attempts.retried)).await;
        }
        if free {
            attempts.free += 1;
        } else {
            attempts.retried += 1;
        }
        attempts.charged.push(worker);
        Ok(())
    }

    /// A started generation's leg on `worker` failed with `status` before
    /// the first token: the request's next generation on other workers,
    /// as the attempt loop would have made it.
    pub(super) async fn resume(
        &self,
        resume: &mut Resume,
        worker: Arc<Worker>,
        others: Vec<Arc<Worker>>,
        status: Status,
    ) -> Result<Generation, RouteError> {
        let Resume {
            request,
            images,
            attempts,
            ..
        } = resume;
        attempts.made += 1;
        attempts.through.extend(others.iter().cloned());
        let verdict = blame_late(&worker, &status, others, &mut attempts.suspects);
        self.retry_after(worker, status, verdict, attempts).await?;
        self.run(request, images, attempts).await
    }

    /// Runs one attempt of `plan`: its generation once its [`Handover`]
    /// point is reached, else the failure that decides the next step.
    /// Every worker that failed, and on a late failure its encoders and
    /// prefill worker too, joins `suspects`.
    async fn attempt(
        &self,
        mut plan: Plan<'_>,
        suspects: &mut Vec<Arc<Worker>>,
    ) -> Result<Generation, Failure> {
        let prediction = plan.prediction.take();
        let kv_transfer = match plan.handover {
            Handover::PrefillFirst => self.prefill_first(&mut plan, suspects).await?,
            Handover::Accepted | Handover::FirstResponse => None,
        };
        let mut read_ahead = plan.handover == Handover::FirstResponse;
        let mut sent = self.send(plan, kv_transfer).await;
        let laned = std::mem::take(&mut sent.laned);
        // Pixels that went by the shm or RDMA lane, and images sent by
        // hash alone, are settled by the first response.
        read_ahead |= laned.tickets.any_off_inline() || laned.any_recalled();
        let encoders = sent.encoders.clone();
        let (mut generation, workers) = match self.accepted(sent, &laned, suspects) {
            Ok(accepted) => accepted,
            Err(failure) => {
                if matches!(failure, Failure::LaneRefused { .. }) {
                    // Its puller is off: it never READs the slots, free them now.
                    laned.tickets.never_sent();
                }
                return Err(failure);
            }
        };
        encoders.iter().for_each(|e| e.record_success());
        generation.expect(prediction);
        generation.encoded_by(encoders.clone());
        if read_ahead {
            if let Err((leg, status)) = generation.read_ahead().await {
                generation.abort(ABORT_REASON);
                let worker = match (leg, &workers.prefill) {
                    (FailedLeg::Prefill, Some(p)) => p.clone(),
                    _ => workers.stream.clone(),
                };
                if let Some(refused) = self.lane_refused(&laned, &worker, &status) {
                    laned.tickets.never_sent();
                    return Err(refused);
                }
                if let Some(missed) = self.recall_missed(&laned, &worker, &status) {
                    return Err(missed);
                }
                // The other legs' workers may be the cause (a decode leg
                // passing on its prefill worker's death): suspects too.
                let others = encoders
                    .into_iter()
                    .chain(workers.prefill)
                    .filter(|w| !Arc::ptr_eq(w, &worker))
                    .collect();
                return Err(late_failure(worker, status, others, suspects));
            }
        }
        for _ in 0..laned.kept() {
            self.lanes.recalled(true);
        }
        laned.tickets.delivered();
        workers.prefill.iter().for_each(|p| p.record_success());
        workers.stream.record_success();
        Ok(generation)
    }

    /// PD on a backend whose prefill runs first (vLLM): runs `plan`'s
    /// prefill leg to its end (its answer is not streamed) and answers the
    /// hand-off parameters it returned, for the stream (decode) leg; the plan is left with the decode leg alone.
    /// The leg is aborted if the request goes away meanwhile.
    async fn prefill_first(
        &self,
        plan: &mut Plan<'_>,
        suspects: &mut Vec<Arc<Worker>>,
    ) -> Result<Option<String>, Failure> {
        let Some((p, request)) = plan.prefill.take() else {
            return Ok(None);
        };
        let decode = &plan.stream.0;
        if !decode.backend().is_some_and(Backend::prefills_first) {
            let backend = decode.backend().map_or("unknown", |b| b.as_str());
            return Err(Failure::Worker {
                worker: decode.clone(),
                status: Status::failed_precondition(format!(
                    "the {prefill} prefill worker {} needs {prefill} decode workers; {} is {backend}",
                    p.url, decode.url,
                    prefill = p.backend().map_or("unknown", |b| b.as_str()),
                )),
                verdict: Verdict::Fatal,
                through: Vec::new(),
            });
        }
        let mut leg = AbortOnDrop(Some(Leg::new(p.clone(), &request.request_id, &self.aborts)));
        let answered = match pixels::prepare(&self.lanes, &p, &request).await {
            Ok((laned_request, prepared)) => {
                let mut laned = Laned::default();
                laned.add(&p, prepared);
                let sent = Instant::now();
                let answered = p
                    .prefill_first(laned_request.as_ref().unwrap_or(&request))
                    .await;
                trace::stage_on("prefill", sent, || p.url.to_string());
                if answered.is_ok() {
                    laned.tickets.delivered();
                }
                answered
            }
            Err(status) => Err(status),
        };
        leg.0 = None;
        match answered {
            Ok(params) => {
                p.record_success();
                Ok(Some(params))
            }
            Err(status) => Err(self.calls_failed(vec![(p, status)], suspects)),
        }
    }

    /// The failure of `worker` refusing the RDMA payload of its pixels
    /// (`laned`), if `status` is that refusal: rdma is off for the worker
    /// until it restarts (counted, warned once).
    fn lane_refused(
        &self,
        laned: &Laned,
        worker: &Arc<Worker>,
        status: &Status,
    ) -> Option<Failure> {
        if !(laned.remote_to(worker) && classify::rdma_refused(status)) {
            return None;
        }
        self.lanes.rdma_refused(worker, status);
        Some(Failure::LaneRefused {
            worker: worker.clone(),
            status: status.clone(),
        })
    }

    /// The failure of `worker` no longer holding an image this attempt sent
    /// it by hash alone (`laned`), if `status` says so: the worker forgets
    /// those images (counted as missed recalls).
    fn recall_missed(
        &self,
        laned: &Laned,
        worker: &Arc<Worker>,
        status: &Status,
    ) -> Option<Failure> {
        if !(laned.recalled_from(worker) && classify::recall_missed(status)) {
            return None;
        }
        for _ in 0..laned.forget_recalled(worker) {
            self.lanes.recalled(false);
        }
        tracing::debug!(worker = %worker.url, "a worker no longer held an image sent by hash; its pixels follow");
        Some(Failure::RecallMissed {
            worker: worker.clone(),
            status: status.clone(),
        })
    }

    /// Sends the plan's calls at once: the encode step (after admission)
    /// and both Generate legs (the stream leg with `kv_transfer`, vLLM PD's
    /// parameters from its prefill).
    async fn send(&self, plan: Plan<'_>, kv_transfer: Option<String>) -> Sent {
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
                Some((p, request)) => {
                    let sent = Instant::now();
                    let answered = Box::pin(self.generate(p, request, None)).await;
                    trace::stage_on("prefill", sent, || p.url.to_string());
                    Some(answered)
                }
                None => None,
            }
        };
        // The calls' futures are boxed: inline, tonic's large call
        // futures would be copied with every enclosing future.
        let (encoded, p_result, (s_result, s_laned)) = tokio::join!(
            Box::pin(encode::send_all(
                &self.lanes,
                &plan.encodes,
                &id,
                self.encode_timeout
            )),
            prefill_call,
            Box::pin(self.generate(&s_worker, &s_request, kv_transfer)),
        );
        drop(permits);
        let mut laned = Laned::default();
        let p_result = p_result.map(|(result, prepared)| {
            if let Some((p, _)) = &plan.prefill {
                laned.add(p, prepared);
            }
            result
        });
        laned.add(&s_worker, s_laned);
        if !encoders.is_empty() {
            self.encode_time.observe(encode_started.elapsed());
            trace::stage_on("encode", encode_started, || {
                let urls: Vec<String> = encoders.iter().map(|e| e.url.to_string()).collect();
                urls.join(",")
            });
        }
        let prefill = plan
            .prefill
            .zip(p_leg)
            .zip(p_result)
            .map(|(((p, _), leg), result)| Accepted::from_call(p, leg, result));
        let image = plan.encodes.iter().find_map(EncodeJob::image_failure);
        Sent {
            image,
            laned,
            encoded: encoders.iter().cloned().zip(encoded).collect(),
            encoders,
            prefill,
            stream: Accepted::from_call(s_worker, s_leg, s_result),
        }
    }

    /// `request` to `worker`, its pixels on the worker's lane
    /// ([`pixels::prepare`]), and what of them went by a lane; `handoff`:
    /// the parameters a prefill-first backend's decode leg is sent.
    async fn generate(
        &self,
        worker: &Arc<Worker>,
        request: &GenerateRequest,
        handoff: Option<String>,
    ) -> (Result<ResponseStream, Status>, pixels::LegPixels) {
        let adapter = match self.adapters.acquire(worker, &request.lora_id).await {
            Ok(adapter) => adapter,
            Err(status) => return (Err(status), pixels::LegPixels::none()),
        };
        match pixels::prepare(&self.lanes, worker, request).await {
            Ok((laned, prepared)) => {
                let request = laned.as_ref().unwrap_or(request);
                let result = match handoff {
                    Some(params) => worker.generate_handed_off(request, params).await,
                    None => worker.generate(request).await,
                };
                let not_found = result
                    .as_ref()
                    .is_err_and(|s| s.code() == tonic::Code::NotFound);
                if not_found && !request.lora_id.is_empty() {
                    self.adapters.forget(worker, &request.lora_id).await;
                }
                (result.map(|stream| adapter.hold(stream)), prepared)
            }
            Err(status) => (Err(status), pixels::LegPixels::none()),
        }
    }

    /// The generation of an attempt whose calls were all accepted, with
    /// its legs' workers; else the accepted legs are aborted and the
    /// failed calls counted (unless a worker refused the RDMA lane of its
    /// pixels: that failure alone is returned, counted against nobody).
    fn accepted(
        &self,
        sent: Sent,
        laned: &Laned,
        suspects: &mut Vec<Arc<Worker>>,
    ) -> Result<(Generation, LegWorkers), Failure> {
        if let Some(error) = sent.image {
            return Err(image_failed(error, sent.prefill, sent.stream));
        }
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
                let refused = failed.iter().find_map(|(worker, status)| {
                    self.lane_refused(laned, worker, status)
                        .or_else(|| self.recall_missed(laned, worker, status))
                });
                match refused {
                    Some(refused) => Err(refused),
                    None => Err(self.calls_failed(failed, suspects)),
                }
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
        let mut failures: Vec<(Arc<Worker>, Status, Verdict)> = failed
            .into_iter()
            .map(|(worker, status)| {
                let verdict = classify::account(&worker, &status, self.circuit_breaker_failures);
                suspects.push(worker.clone());
                (worker, status, verdict)
            })
            .collect();
        let decisive = failures
            .iter()
            .position(|(_, _, verdict)| *verdict == Verdict::Fatal)
            .unwrap_or(0);
        let (worker, status, verdict) = failures.swap_remove(decisive);
        Failure::Worker {
            worker,
            status,
            verdict,
            through: Vec::new(),
        }
    }
}

/// A leg that failed after it started, before its first response. It is
/// counted against the leg's worker but never toward its circuit: the
/// leg may only be passing on a peer's failure (the embedding or the KV
/// state did not arrive). That worker and the attempt's other workers
/// (`others`: its encoders and prefill worker) become suspects.
fn late_failure(
    worker: Arc<Worker>,
    status: Status,
    others: Vec<Arc<Worker>>,
    suspects: &mut Vec<Arc<Worker>>,
) -> Failure {
    Failure::Worker {
        verdict: blame_late(&worker, &status, others.clone(), suspects),
        worker,
        status,
        through: others,
    }
}

/// [`late_failure`]'s accounting: the verdict on `status`.
fn blame_late(
    worker: &Arc<Worker>,
    status: &Status,
    others: Vec<Arc<Worker>>,
    suspects: &mut Vec<Arc<Worker>>,
) -> Verdict {
    worker.record_refusal();
    suspects.extend(others);
    suspects.push(worker.clone());
    classify::classify(status)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::workers::{Role, WorkerUrl};

    fn worker(port: u16, role: Role) -> Arc<Worker> {
        let url = WorkerUrl::parse(&format!("grpc://127.0.0.1:{port}")).unwrap();
        Worker::new(url, role, Duration::from_secs(1)).unwrap()
    }

    /// A prefill failing because its encoder died is charged; the
    /// encoder then failing the retry itself is the same death: free,
    /// once. A worker failing again after being charged is charged again.
    #[tokio::test]
    async fn a_death_seen_through_two_legs_costs_one_retry() {
        let (encoder, prefill) = (worker(1, Role::Encode), worker(2, Role::Prefill));
        let mut attempts = Attempts::default();
        // Two calls failing on their own (both images' encoders) are not
        // failures seen through another.
        attempts.suspects.extend([encoder.clone(), prefill.clone()]);
        assert!(!attempts.paid_for(&encoder) && !attempts.paid_for(&prefill));
        // The prefill failing late, its encoder perhaps the cause: charged.
        attempts.through.push(encoder.clone());
        attempts.charged.push(prefill.clone());
        assert!(
            !attempts.paid_for(&prefill),
            "the prefill's failure is charged"
        );
        assert!(
            attempts.paid_for(&encoder),
            "already paid for by the prefill's failure"
        );
        attempts.charged.push(encoder.clone());
        assert!(!attempts.paid_for(&encoder), "free once only");
    }
}
