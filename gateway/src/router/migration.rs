//! Mid-stream migration: a streamed request whose worker fails after
//! tokens reached the client continues on another worker. The request is
//! sent again with the tokens already streamed appended to its prompt and
//! its budgets (`max_new_tokens`, `min_new_tokens`) reduced by them; the
//! new worker's responses are then rewritten so the client sees one
//! sequence: its own prompt and cached token counts, completion counts and
//! a completion's output ids and log probabilities that include what came
//! before. Stop strings, reasoning and tool-call parsing live above the
//! router, so their state carries over untouched.
//!
//! A request of several sequences (`n` > 1) continues as one request per
//! unfinished sequence (each has its own prefix; `n` = 1), started
//! together; their responses are merged back under the sequences' own
//! indexes ([`super::Generation::merged`]). A later failure of any of them
//! moves every unfinished sequence again, within the same budget.
//!
//! A constrained request (JSON schema, regex, grammar) moves only when
//! every worker it could move to resumes a constraint after output
//! already written (`constraint_resume` in GetServerInfo, an Iris
//! extension): the continuation says how many of its input tokens are
//! constrained output (`constrained_prefix_tokens`), and the worker's
//! constraint picks up after them instead of starting over.
//!
//! Which requests migrate: streamed, without prompt log probabilities. Images and videos go again with the request:
//! their memory was given back at the first token, so they are found by
//! weak handles ([`RememberedImages`]) while the pixel cache still holds
//! their pixels; one it no longer holds ends the request with the failure.
//! Others end with the failure as before. At most `--max-migrations` moves
//! per request; each is counted by reason (`iris_migrations_total`) and
//! logged with the request id.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use iris_proto::scheduler::{
    generate_response, GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk,
    OutputLogProbs,
};
use tonic::{Code, Status};

use super::dispatch::Attempts;
use super::{RouteError, Router};
use crate::mm::pending::RememberedImages;
use crate::workers::Worker;

/// The reasons a migration is counted under: the failed stream's gRPC
/// code, or its ending without a completion.
pub const REASONS: [&str; 18] = [
    "ok",
    "cancelled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
    "stream_ended",
];

/// The reason index of a stream that ended without its completion.
pub const STREAM_ENDED: usize = 17;

/// The reason index of `code`.
pub fn reason_of(code: Code) -> usize {
    (code as usize).min(STREAM_ENDED - 1)
}

/// One sequence of a request as the client has seen it.
#[derive(Debug, Default)]
struct Sequence {
    /// Every token streamed to the client so far, with its log
    /// probabilities when they were asked.
    generated: Vec<u32>,
    logprobs: Option<OutputLogProbs>,
    /// Tokens the current worker did not generate (0 before a move).
    offset: usize,
    completed: bool,
}

impl Sequence {
    /// Rewrites a chunk of the current worker as this sequence's, and
    /// records its tokens.
    fn chunk(&mut self, chunk: &mut GenerateStreamChunk) {
        chunk.completion_tokens = chunk.completion_tokens.saturating_add(self.offset_u32());
        self.generated.extend_from_slice(&chunk.token_ids);
        if let Some(lp) = &chunk.output_logprobs {
            append(self.logprobs.get_or_insert_with(Default::default), lp);
        }
    }

    /// Rewrites the current worker's completion as this sequence's whole.
    fn complete(&mut self, complete: &mut GenerateComplete) {
        self.completed = true;
        complete.completion_tokens = complete.completion_tokens.saturating_add(self.offset_u32());
        if self.offset == 0 {
            return;
        }
        let mut ids = self.generated[..self.offset].to_vec();
        ids.extend_from_slice(&complete.output_ids);
        complete.output_ids = ids;
        if let (Some(before), Some(after)) = (&self.logprobs, &complete.output_logprobs) {
            let mut all = head(before, self.offset);
            append(&mut all, after);
            complete.output_logprobs = Some(all);
        }
    }

    fn offset_u32(&self) -> u32 {
        u32::try_from(self.offset).unwrap_or(u32::MAX)
    }
}

/// A streamed request that may continue on another worker.
pub(super) struct Migration {
    router: Arc<Router>,
    /// The request as first sent.
    request: GenerateRequest,
    /// Its images, while their pixels are held somewhere.
    images: RememberedImages,
    /// Its sequences, by index (`n` of them).
    sequences: Vec<Sequence>,
    /// What the first worker reported, which the client keeps seeing.
    prompt_tokens: u32,
    cached_tokens: u32,
    /// Moves made.
    made: u32,
}

impl Migration {
    /// The migration state of `request`, or `None` when it cannot move
    /// (see the module doc) or the router allows no move.
    pub fn of(
        router: &Arc<Router>,
        request: GenerateRequest,
        images: Option<RememberedImages>,
    ) -> Option<Migration> {
        let sampling = request.sampling_params.as_ref();
        let movable = router.max_migrations > 0
            && request.stream
            && request.logprob_start_len.is_none_or(|start| start < 0);
        let images = images?;
        let n = sampling.map_or(1, |s| s.n.max(1)) as usize;
        movable.then(|| Migration {
            router: router.clone(),
            request,
            images,
            sequences: std::iter::repeat_with(Sequence::default).take(n).collect(),
            prompt_tokens: 0,
            cached_tokens: 0,
            made: 0,
        })
    }

    /// Moves made so far.
    pub fn made(&self) -> u32 {
        self.made
    }

    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// Whether a failure now may move the request: a sequence has not
    /// completed, and moves are left.
    pub fn can_move(&self) -> bool {
        self.sequences.iter().any(|s| !s.completed) && self.made < self.router.max_migrations
    }

    /// Rewrites a response of the current worker as the client's
    /// sequence of its index, and records its tokens.
    pub fn pass(&mut self, response: &mut GenerateResponse) {
        use generate_response::Response;
        let moved = self.made > 0;
        let (index, prompt, cached) = match response.response.as_mut() {
            Some(Response::Chunk(c)) => (c.index, &mut c.prompt_tokens, &mut c.cached_tokens),
            Some(Response::Complete(c)) => (c.index, &mut c.prompt_tokens, &mut c.cached_tokens),
            None => return,
        };
        if moved {
            *prompt = self.prompt_tokens;
            *cached = self.cached_tokens;
        } else {
            self.prompt_tokens = self.prompt_tokens.max(*prompt);
            self.cached_tokens = self.cached_tokens.max(*cached);
        }
        let Some(sequence) = self.sequences.get_mut(index as usize) else {
            return; // an index out of range is the caller's to refuse
        };
        match response.response.as_mut() {
            Some(Response::Chunk(chunk)) => sequence.chunk(chunk),
            Some(Response::Complete(complete)) => sequence.complete(complete),
            None => {}
        }
    }

    /// The requests that continue the unfinished sequences on other
    /// workers, with their indexes: one request of `n` = 1 per sequence
    /// (each has its own prefix), or the request itself for one sequence.
    fn continuations(&mut self) -> Vec<(u32, GenerateRequest)> {
        let split = self.sequences.len() > 1;
        let base = &self.request;
        let made = self.made;
        let mut out = Vec::new();
        for (index, sequence) in self.sequences.iter_mut().enumerate() {
            if sequence.completed {
                continue;
            }
            sequence.offset = sequence.generated.len();
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            let mut request = base.clone();
            request.request_id = match split {
                true => format!("{}-migrated{made}-seq{index}", base.request_id),
                false => format!("{}-migrated{made}", base.request_id),
            };
            continue_after(&mut request, &sequence.generated, split);
            out.push((index, request));
        }
        out
    }
}

/// `request` continued after `generated`: the tokens appended to its
/// prompt, its budgets reduced by them, a constraint resumed after them,
/// one sequence when `single`.
fn continue_after(request: &mut GenerateRequest, generated: &[u32], single: bool) {
    let streamed = u32::try_from(generated.len()).unwrap_or(u32::MAX);
    if let Some(tokenized) = request.tokenized.as_mut() {
        tokenized.input_ids.extend_from_slice(generated);
    }
    if let Some(sampling) = request.sampling_params.as_mut() {
        sampling.max_new_tokens = sampling.max_new_tokens.map(|m| m.saturating_sub(streamed));
        sampling.min_new_tokens = sampling.min_new_tokens.saturating_sub(streamed);
        if sampling.constraint.is_some() {
            sampling.constrained_prefix_tokens = streamed;
        }
        if single {
            sampling.n = 1;
        }
    }
}

/// The first `n` entries of `lp`.
fn head(lp: &OutputLogProbs, n: usize) -> OutputLogProbs {
    OutputLogProbs {
        token_logprobs: lp.token_logprobs.iter().take(n).copied().collect(),
        token_ids: lp.token_ids.iter().take(n).copied().collect(),
        top_logprobs: lp.top_logprobs.iter().take(n).cloned().collect(),
    }
}

/// `more` appended to `all`.
fn append(all: &mut OutputLogProbs, more: &OutputLogProbs) {
    all.token_logprobs.extend_from_slice(&more.token_logprobs);
    all.token_ids.extend_from_slice(&more.token_ids);
    all.top_logprobs.extend(more.top_logprobs.iter().cloned());
}

impl Router {
    /// Moves `migration`'s request off `worker`, whose stream failed with
    /// `status` (`None`: ended without its completion): its next
    /// generation on other workers, counted and logged.
    pub(super) async fn migrate(
        &self,
        migration: &mut Migration,
        worker: Arc<Worker>,
        status: Option<Status>,
    ) -> Result<super::Generation, RouteError> {
        if !self.may_resume(&migration.request) {
            tracing::warn!(
                request_id = %migration.request.request_id,
                worker = %worker.url,
                "worker failed mid-stream; the request cannot move: it is constrained and not every worker can resume a constraint (constraint_resume)"
            );
            return Err(RouteError::NoWorker(worker.role));
        }
        let Some(images) = migration.images.recall() else {
            tracing::warn!(
                request_id = %migration.request.request_id,
                worker = %worker.url,
                "worker failed mid-stream; the request cannot move: its images are no longer in the pixel cache"
            );
            return Err(RouteError::Image(iris_openai::ApiError::internal(
                "the worker failed mid-stream and the request could not move: its images are no longer cached",
            )));
        };
        let reason = status
            .as_ref()
            .map_or(STREAM_ENDED, |s| reason_of(s.code()));
        migration.made += 1;
        self.migrations[reason].fetch_add(1, Ordering::Relaxed);
        let streamed: usize = migration.sequences.iter().map(|s| s.generated.len()).sum();
        tracing::warn!(
            request_id = %migration.request.request_id,
            worker = %worker.url,
            reason = REASONS[reason],
            streamed_tokens = streamed,
            migration = migration.made,
            error = status.as_ref().map_or("its stream ended without a completion", |s| s.message()),
            "worker failed mid-stream; the request continues elsewhere"
        );
        let mut continuations = migration.continuations();
        if migration.sequences.len() == 1 {
            let Some((_, request)) = continuations.pop() else {
                return Err(RouteError::NoWorker(worker.role));
            };
            let mut attempts = Attempts::suspecting(worker);
            return self.run(&request, &images, &mut attempts).await;
        }
        let started = continuations.iter().map(|(index, request)| {
            let mut attempts = Attempts::suspecting(worker.clone());
            let images = &images;
            async move {
                let generation = self.run(request, images, &mut attempts).await?;
                Ok::<_, RouteError>((*index, generation))
            }
        });
        let parts = futures::future::join_all(started).await;
        let parts = parts.into_iter().collect::<Result<Vec<_>, _>>()?;
        let Some(first) = parts.first().map(|(_, part)| part.worker.clone()) else {
            return Err(RouteError::NoWorker(worker.role));
        };
        Ok(super::Generation::merged(first, parts))
    }

    /// Whether `request` may continue on any worker that could be picked:
    /// unconstrained, or every prefill, decode and aggregated worker
    /// resumes a constraint after output already written (none of the
    /// engines' own protocols can say that; Iris's engines advertise it).
    fn may_resume(&self, request: &GenerateRequest) -> bool {
        let constrained = request
            .sampling_params
            .as_ref()
            .is_some_and(|s| s.constraint.is_some());
        !constrained
            || self
                .mode
                .pools()
                .iter()
                .filter(|pool| pool.role != crate::workers::Role::Encode)
                .all(|pool| pool.snapshot().iter().all(|w| w.resumes_constraints()))
    }

    /// Requests moved mid-stream, by reason ([`REASONS`]).
    pub fn migrations(&self) -> Vec<(&'static str, u64)> {
        REASONS
            .iter()
            .zip(&self.migrations)
            .map(|(reason, n)| (*reason, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Appends `iris_migrations_total` to `/metrics` (the reasons seen).
    pub fn render_migrations(&self, out: &mut String) {
        let seen = self.migrations().into_iter().filter(|(_, n)| *n > 0);
        let samples: Vec<(String, u64)> = seen
            .map(|(reason, n)| (format!("reason=\"{reason}\""), n))
            .collect();
        iris_metrics::family(
            out,
            "iris_migrations_total",
            "counter",
            "Streamed requests moved to another worker after their worker failed mid-stream, by the failed stream's gRPC code (stream_ended: it ended without its completion).",
            samples,
        );
    }
}
