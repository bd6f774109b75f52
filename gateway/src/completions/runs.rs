//! The worker requests of one completion, one per prompt of the batch:
//! started together through the router and read as one sequence of
//! events, each already placed on its choice (`prompt * n + index`).
//! Dropping [`Runs`] aborts every request still generating.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use iris_openai::{ApiError, CompletionLogprobs};
use iris_proto::scheduler::{
    generate_response::Response as Reply, GenerateResponse, OutputLogProbs,
};
use tonic::Status;

use super::choice::{CompletionText, Released};
use crate::http::errors::{route_error, stream_ended, worker_error};
use crate::http::Failure;
use crate::metrics::Outcome;
use crate::request::ReadyPrompts;
use crate::router::Generation;

/// What a worker sent for one choice.
pub(super) enum Event {
    /// New tokens (streaming workers).
    Tokens {
        choice: usize,
        ids: Vec<u32>,
        logprobs: Option<OutputLogProbs>,
    },
    /// The sequence's end, with all its tokens.
    Complete {
        choice: usize,
        ids: Vec<u32>,
        logprobs: Option<OutputLogProbs>,
        finish_reason: String,
        completion_tokens: u32,
    },
}

impl Event {
    /// The choice it is for.
    pub fn choice(&self) -> usize {
        match self {
            Event::Tokens { choice, .. } | Event::Complete { choice, .. } => *choice,
        }
    }
}

/// A generation's next response, read by a future that owns the
/// generation meanwhile and gives it back.
type Read = BoxFuture<'static, ReadDone>;

/// What a finished read gives back: the generation and its next response.
type ReadDone = (Generation, Option<Result<GenerateResponse, Status>>);

/// One prompt's worker request.
///
/// Its generation is lent to one read at a time, and a read is never
/// dropped half-way while the request goes on: reading a response may
/// involve more than one await (settling a prefill leg, starting again
/// or moving to another worker), and a read dropped there would lose what
/// it had taken.
struct Run {
    /// `None` while [`Run::read`] holds it.
    generation: Option<Generation>,
    read: Option<Read>,
    /// Prompt tokens its worker reported serving from its prefix cache.
    cached_tokens: u32,
    /// Sequences whose GenerateComplete has not arrived.
    open: u32,
    /// Moves to other workers mid-stream, as of its last response.
    migrations: u32,
}

impl Run {
    /// Starts reading the next response unless a read is under way.
    fn read(&mut self) {
        if let Some(mut generation) = self.generation.take() {
            self.read = Some(Box::pin(async move {
                let next = generation.next().await;
                (generation, next)
            }));
        }
    }
}

/// Every prompt's worker request.
pub(super) struct Runs {
    runs: Vec<Run>,
    n: u32,
    /// The run polled first by the next [`Runs::next`], turning so that
    /// one busy prompt does not starve the others.
    first: usize,
}

impl Runs {
    /// Starts every prompt's request at once; if one cannot start, those
    /// started are aborted (dropped) and its error is returned.
    pub async fn start(id: &str, prepared: &ReadyPrompts) -> Result<Runs, Failure> {
        let router = &prepared.served.router;
        let starts = (0..prepared.prompts.len()).map(|p| router.start(prepared.generate(id, p)));
        let started = futures::future::join_all(starts).await;
        let n = prepared.request.n();
        let mut runs = Vec::with_capacity(started.len());
        for generation in started {
            runs.push(Run {
                generation: Some(generation.map_err(route_error)?),
                read: None,
                cached_tokens: 0,
                open: n,
                migrations: 0,
            });
        }
        Ok(Runs { runs, n, first: 0 })
    }

    /// The next event of any prompt; `None` once every sequence of every
    /// prompt is complete (or aborted by [`Runs::abort`]). Cancel-safe:
    /// the reads under way are kept for the next call.
    pub async fn next(&mut self) -> Option<Result<Event, Failure>> {
        loop {
            let open = self.runs.iter_mut().filter(|run| run.open > 0);
            let reading = open.map(Run::read).count();
            if reading == 0 {
                return None;
            }
            let (p, (generation, next)) = std::future::poll_fn(|cx| self.poll_reads(cx)).await;
            let run = &mut self.runs[p];
            run.migrations = generation.migrations();
            run.generation = Some(generation);
            if let Some(event) = self.event(p, next) {
                return Some(event);
            }
        }
    }

    /// The first read that is ready, with its run's index.
    fn poll_reads(&mut self, cx: &mut Context<'_>) -> Poll<(usize, ReadDone)> {
        let count = self.runs.len();
        for p in (0..count).map(|k| (self.first + k) % count) {
            let run = &mut self.runs[p];
            let Some(read) = run.read.as_mut() else {
                continue;
            };
            if let Poll::Ready(done) = read.as_mut().poll(cx) {
                run.read = None;
                self.first = (p + 1) % count;
                return Poll::Ready((p, done));
            }
        }
        Poll::Pending
    }

    /// Turns prompt `p`'s response into an event (`None`: nothing in it).
    fn event(
        &mut self,
        p: usize,
        next: Option<Result<GenerateResponse, Status>>,
    ) -> Option<Result<Event, Failure>> {
        let n = self.n;
        let run = &mut self.runs[p];
        let generation = run.generation.as_mut()?;
        let worker = generation.worker.url.to_string();
        let response = match next {
            None => return Some(Err((stream_ended(&worker), Outcome::UpstreamError))),
            Some(Err(status)) => return Some(Err(worker_error(&worker, &status))),
            Some(Ok(response)) => response.response?,
        };
        let index = match &response {
            Reply::Chunk(c) => c.index,
            Reply::Complete(c) => c.index,
        };
        if index >= n {
            let error = ApiError::bad_gateway(format!(
                "a worker answered for sequence {index} of a request for {n}"
            ));
            return Some(Err((error, Outcome::UpstreamError)));
        }
        let choice = p * n as usize + index as usize;
        let cached = match &response {
            Reply::Chunk(c) => c.cached_tokens,
            Reply::Complete(c) => c.cached_tokens,
        };
        run.cached_tokens = run.cached_tokens.max(cached);
        Some(Ok(match response {
            Reply::Chunk(c) => Event::Tokens {
                choice,
                ids: c.token_ids,
                logprobs: c.output_logprobs,
            },
            Reply::Complete(c) => {
                run.open = run.open.saturating_sub(1);
                if run.open == 0 {
                    generation.finish();
                }
                if c.finish_reason == "abort" {
                    let error = ApiError::bad_gateway("the worker aborted the request");
                    return Some(Err((error, Outcome::UpstreamError)));
                }
                Event::Complete {
                    choice,
                    ids: c.output_ids,
                    logprobs: c.output_logprobs,
                    finish_reason: c.finish_reason,
                    completion_tokens: c.completion_tokens,
                }
            }
        }))
    }

    /// Moves to other workers mid-stream, over every prompt's request.
    pub fn migrations(&self) -> u32 {
        self.runs
            .iter()
            .map(|r| r.migrations)
            .fold(0, u32::saturating_add)
    }

    /// Prompt tokens the workers served from their prefix caches, summed
    /// over the prompts.
    pub fn cached_tokens(&self) -> u32 {
        self.runs
            .iter()
            .map(|r| r.cached_tokens)
            .fold(0, u32::saturating_add)
    }

    /// Aborts prompt `p`'s request if it is still generating (its choices
    /// all ended in the gateway, on stop strings). A read under way is
    /// dropped with the generation it holds, which aborts its legs.
    pub fn abort(&mut self, p: usize, reason: &str) {
        let run = &mut self.runs[p];
        if run.open > 0 {
            run.open = 0;
            run.read = None;
            if let Some(generation) = run.generation.as_mut() {
                generation.abort(reason);
            }
        }
    }

    /// Aborts every request still generating.
    pub fn abort_all(&mut self, reason: &str) {
        for p in 0..self.runs.len() {
            self.abort(p, reason);
        }
    }
}

/// Applies `event` to its choice; returns the choice's index and what it
/// releases.
pub(super) fn feed(
    choices: &mut [CompletionText],
    event: Event,
) -> Result<(usize, Released), ApiError> {
    match event {
        Event::Tokens {
            choice,
            ids,
            logprobs,
        } => {
            let released = choice_mut(choices, choice)?.push(&ids, logprobs.as_ref())?;
            Ok((choice, released))
        }
        Event::Complete {
            choice,
            ids,
            logprobs,
            finish_reason,
            completion_tokens,
        } => {
            let text = choice_mut(choices, choice)?;
            // A non-streaming worker's tokens arrive only here.
            let mut released = match text.tokens == 0 && !ids.is_empty() {
                true => text.push(&ids, logprobs.as_ref())?,
                false => Released::default(),
            };
            let end = text.end(&finish_reason)?;
            text.tokens = text.tokens.max(completion_tokens);
            released.append(end);
            Ok((choice, released))
        }
    }
}

fn choice_mut(choices: &mut [CompletionText], i: usize) -> Result<&mut CompletionText, ApiError> {
    choices
        .get_mut(i)
        .ok_or_else(|| ApiError::bad_gateway(format!("a worker answered for unknown choice {i}")))
}

impl Released {
    /// Adds what `later` released after this.
    pub fn append(&mut self, later: Released) {
        self.text.push_str(&later.text);
        match (&mut self.logprobs, later.logprobs) {
            (Some(mine), Some(mut theirs)) => mine.append(&mut theirs),
            (mine @ None, theirs) => *mine = theirs,
            (Some(_), None) => {}
        }
    }

    /// True when there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
            && self
                .logprobs
                .as_ref()
                .is_none_or(CompletionLogprobs::is_empty)
    }
}
