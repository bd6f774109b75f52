//! Streamed completions ([`crate::http::sse`] runs the stream): every
//! chunk is a `text_completion` object with one choice (its new text, its
//! tokens' log probabilities, and `finish_reason` on its last chunk);
//! choices of a batch and of `n` interleave as their tokens arrive. With
//! `echo` each choice's first chunk is its prompt's text. Then an optional
//! usage chunk (`choices: []`) and `data: [DONE]`. Dropping the runs (the
//! client left) aborts the workers.

use std::future::Future;
use std::sync::Arc;

use axum::response::Response;
use bytes::BytesMut;
use iris_openai::sse::write_event;
use iris_openai::{unix_now, ApiError, CompletionChoice, TextCompletion, Usage};

use super::choice::{CompletionText, Released};
use super::runs::{feed, Event, Runs};
use super::unary::upstream;
use crate::http::sse::{self, Events};
use crate::http::{Failure, Ledger};
use crate::metrics::Outcome;
use crate::request::ReadyPrompts;
use crate::server::AppState;

pub async fn respond(state: Arc<AppState>, ledger: Ledger, prepared: ReadyPrompts) -> Response {
    let id = ledger.id.clone();
    let prompt_tokens = ledger.prompt_tokens;
    let start = async move {
        let runs = Runs::start(&id, &prepared).await?;
        Ok(CompletionEvents::new(id, prepared, runs, prompt_tokens))
    };
    sse::respond(state, ledger, start).await
}

/// The completions endpoint's side of one SSE answer.
struct CompletionEvents {
    id: String,
    prepared: ReadyPrompts,
    runs: Runs,
    choices: Vec<CompletionText>,
    created: u64,
    prompt_tokens: u32,
}

impl CompletionEvents {
    fn new(id: String, prepared: ReadyPrompts, runs: Runs, prompt_tokens: u32) -> CompletionEvents {
        let choices = prepared.choices();
        CompletionEvents {
            id,
            prepared,
            runs,
            choices,
            created: unix_now(),
            prompt_tokens,
        }
    }

    /// Writes what choice `i` released; once every choice of its prompt
    /// has ended, that prompt's workers stop; `true` once every choice has
    /// ended. (`had_ended`: the choice's end was already sent.)
    fn released(
        &mut self,
        out: &mut BytesMut,
        i: usize,
        released: Released,
        had_ended: bool,
    ) -> bool {
        let choice = &self.choices[i];
        let ends_now = choice.finish.is_some() && !had_ended;
        if !released.is_empty() || ends_now {
            let Released { text, logprobs } = released;
            let choice = CompletionChoice {
                index: choice.index,
                text,
                logprobs,
                finish_reason: choice.finish,
            };
            self.write(out, vec![choice], None);
        }
        let n = self.prepared.request.n() as usize;
        let p = i / n;
        if self.choices[p * n..(p + 1) * n]
            .iter()
            .all(|c| c.finish.is_some())
        {
            self.runs.abort(p, "stop string matched");
        }
        self.choices.iter().all(|c| c.finish.is_some())
    }

    fn write(&self, out: &mut BytesMut, choices: Vec<CompletionChoice>, usage: Option<Usage>) {
        let chunk = TextCompletion::new(
            &self.id,
            self.created,
            &self.prepared.served.name,
            choices,
            usage,
        );
        write_event(out, &chunk.to_json());
    }
}

impl Events for CompletionEvents {
    type Event = Event;

    /// With `echo`: each choice's prompt text, before any token.
    fn open(&mut self, out: &mut BytesMut) {
        for (choice, echo) in self.choices.iter().zip(self.prepared.echoes()) {
            if !echo.is_empty() {
                let choice = CompletionChoice {
                    index: choice.index,
                    text: echo.to_owned(),
                    logprobs: None,
                    finish_reason: None,
                };
                self.write(out, vec![choice], None);
            }
        }
    }

    fn next(&mut self) -> impl Future<Output = Option<Result<Event, Failure>>> + Send {
        self.runs.next()
    }

    fn carries_tokens(_: &Event) -> bool {
        true
    }

    fn event(&mut self, out: &mut BytesMut, event: Event) -> Result<bool, Failure> {
        let had_ended = self
            .choices
            .get(event.choice())
            .is_some_and(|c| c.finish.is_some());
        let (i, released) = feed(&mut self.choices, event).map_err(upstream)?;
        Ok(self.released(out, i, released, had_ended))
    }

    fn exhausted(&mut self) -> Result<(), Failure> {
        match self.choices.iter().find(|c| c.finish.is_none()) {
            Some(open) => {
                let error = ApiError::bad_gateway(format!(
                    "the workers ended without completing choice {}",
                    open.index
                ));
                Err((error, Outcome::UpstreamError))
            }
            None => Ok(()),
        }
    }

    fn finish(&mut self, out: &mut BytesMut) {
        self.runs.abort_all("stop string matched");
        if self.prepared.request.include_usage() {
            let usage = Usage::new(self.prompt_tokens, self.completion_tokens())
                .with_cached_tokens(self.runs.cached_tokens());
            self.write(out, Vec::new(), Some(usage));
        }
    }

    fn abort(&mut self, reason: &str) {
        self.runs.abort_all(reason);
    }

    fn migrations(&self) -> u32 {
        self.runs.migrations()
    }

    fn completion_tokens(&self) -> u32 {
        self.choices
            .iter()
            .map(|c| c.tokens)
            .fold(0u32, u32::saturating_add)
    }
}
