//! Streamed completions: every chunk is a `text_completion` object with
//! one choice (its new text, its tokens' log probabilities, and
//! `finish_reason` on its last chunk); choices of a batch and of `n`
//! interleave as their tokens arrive. With `echo` each choice's first
//! chunk is its prompt's text. Then an optional usage chunk
//! (`choices: []`) and `data: [DONE]`. Dropping the body (the client
//! left) aborts the workers.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use iris_openai::sse;
use iris_openai::{unix_now, ApiError, CompletionChoice, TextCompletion, Usage};

use super::choice::{ChoiceText, Released};
use super::runs::{feed, Runs};
use super::Prepared;
use crate::chat::errors::error_response;
use crate::chat::record::CLIENT_CLOSED;
use crate::metrics::{Outcome, Stage};
use crate::server::AppState;

pub async fn respond(state: Arc<AppState>, prepared: Prepared) -> Response {
    let dispatch = Instant::now();
    let deadline = tokio::time::Instant::from_std(prepared.started + state.request_timeout);
    let runs = match tokio::time::timeout_at(deadline, Runs::start(&state, &prepared)).await {
        Ok(Ok(runs)) => runs,
        Ok(Err((error, outcome))) => {
            prepared.record(&state, error.status, outcome, 0, Some(&error.message));
            return error_response(&error);
        }
        Err(_) => {
            let error = ApiError::gateway_timeout(format!(
                "the workers did not start answering within {} s",
                state.request_timeout.as_secs()
            ));
            prepared.record(
                &state,
                error.status,
                Outcome::Timeout,
                0,
                Some(&error.message),
            );
            return error_response(&error);
        }
    };
    state.metrics.stage(Stage::Dispatch, dispatch.elapsed());
    let streamer = Streamer::new(state, prepared, runs, deadline);
    let body = Body::from_stream(futures::stream::unfold(streamer, |mut s| async move {
        let bytes = s.next_event().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(bytes), s))
    }));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Where the stream is.
#[derive(PartialEq, Eq)]
enum Phase {
    /// The echo chunks are next.
    Start,
    Tokens,
    Done,
}

/// The state of one SSE answer.
struct Streamer {
    state: Arc<AppState>,
    prepared: Prepared,
    runs: Runs,
    choices: Vec<ChoiceText>,
    created: u64,
    phase: Phase,
    first_token_at: Option<Instant>,
    deadline: tokio::time::Instant,
}

impl Streamer {
    fn new(
        state: Arc<AppState>,
        prepared: Prepared,
        runs: Runs,
        deadline: tokio::time::Instant,
    ) -> Streamer {
        let choices = prepared.choices(state.prompter.tokenizer());
        Streamer {
            state,
            prepared,
            runs,
            choices,
            created: unix_now(),
            phase: Phase::Start,
            first_token_at: None,
            deadline,
        }
    }

    /// The next bytes to send, or `None` when the stream is over.
    async fn next_event(&mut self) -> Option<Bytes> {
        let mut out = BytesMut::with_capacity(256);
        match self.phase {
            Phase::Done => return None,
            Phase::Start => {
                self.phase = Phase::Tokens;
                self.write_echoes(&mut out);
            }
            Phase::Tokens => {}
        }
        while out.is_empty() && self.phase == Phase::Tokens {
            self.step(&mut out).await;
        }
        Some(out.freeze())
    }

    /// With `echo`: each choice's prompt text, before any token.
    fn write_echoes(&self, out: &mut BytesMut) {
        let echoes: Vec<String> = self.prepared.echoes().map(str::to_owned).collect();
        for (choice, echo) in self.choices.iter().zip(echoes) {
            if !echo.is_empty() {
                self.write_choice(out, choice, echo, None);
            }
        }
    }

    /// Reads one event from the workers and writes what it produces.
    async fn step(&mut self, out: &mut BytesMut) {
        let next = tokio::select! {
            biased;
            _ = self.state.hard_stop.cancelled() => {
                let error = ApiError::service_unavailable(
                    "the gateway is shutting down and its grace period ended",
                );
                return self.fail(out, &error, Outcome::Cancelled);
            }
            next = tokio::time::timeout_at(self.deadline, self.runs.next()) => next,
        };
        let event = match next {
            Err(_) => {
                let error = ApiError::gateway_timeout(format!(
                    "no complete answer within {} s",
                    self.state.request_timeout.as_secs()
                ));
                return self.fail(out, &error, Outcome::Timeout);
            }
            Ok(None) => return self.finish(out),
            Ok(Some(Err((error, outcome)))) => return self.fail(out, &error, outcome),
            Ok(Some(Ok(event))) => event,
        };
        if self.first_token_at.is_none() {
            self.first_token_at = Some(Instant::now());
            self.state
                .metrics
                .stage(Stage::FirstToken, self.prepared.started.elapsed());
        }
        let had_ended = self
            .choices
            .get(event.choice())
            .is_some_and(|c| c.finish.is_some());
        match feed(&mut self.choices, event) {
            Ok((i, released)) => self.released(out, i, released, had_ended),
            Err(error) => self.fail(out, &error, Outcome::UpstreamError),
        }
    }

    /// Writes what choice `i` released; once every choice of its prompt
    /// has ended, that prompt's workers stop, and once every choice has,
    /// the stream ends.
    /// (`had_ended`: the choice's end was already sent.)
    fn released(&mut self, out: &mut BytesMut, i: usize, released: Released, had_ended: bool) {
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
        if self.choices.iter().all(|c| c.finish.is_some()) {
            self.finish(out);
        }
    }

    /// One chunk for `choice` with `text`.
    fn write_choice(
        &self,
        out: &mut BytesMut,
        choice: &ChoiceText,
        text: String,
        logprobs: Option<iris_openai::CompletionLogprobs>,
    ) {
        let choice = CompletionChoice {
            index: choice.index,
            text,
            logprobs,
            finish_reason: None,
        };
        self.write(out, vec![choice], None);
    }

    fn write(&self, out: &mut BytesMut, choices: Vec<CompletionChoice>, usage: Option<Usage>) {
        let chunk = TextCompletion::new(
            &self.prepared.id,
            self.created,
            &self.state.model_name,
            choices,
            usage,
        );
        sse::write_event(out, &chunk.to_json());
    }

    fn completion_tokens(&self) -> u32 {
        self.choices
            .iter()
            .map(|c| c.tokens)
            .fold(0u32, u32::saturating_add)
    }

    fn finish(&mut self, out: &mut BytesMut) {
        if self.phase == Phase::Done {
            return;
        }
        if let Some(open) = self.choices.iter().find(|c| c.finish.is_none()) {
            let error = ApiError::bad_gateway(format!(
                "the workers ended without completing choice {}",
                open.index
            ));
            return self.fail(out, &error, Outcome::UpstreamError);
        }
        self.runs.abort_all("stop string matched");
        let completion_tokens = self.completion_tokens();
        if self.prepared.request.include_usage() {
            let usage = Usage::new(self.prepared.prompt_tokens, completion_tokens);
            self.write(out, Vec::new(), Some(usage));
        }
        sse::write_done(out);
        self.state
            .metrics
            .tokens(self.prepared.prompt_tokens, completion_tokens);
        if let Some(first) = self.first_token_at {
            self.state.metrics.stage(Stage::Decode, first.elapsed());
        }
        self.end(200, Outcome::Ok, None);
    }

    fn fail(&mut self, out: &mut BytesMut, error: &ApiError, outcome: Outcome) {
        tracing::warn!(request_id = %self.prepared.id, error = %error.message, "stream failed");
        self.runs.abort_all("gateway ended the request");
        sse::write_error_event(out, error);
        sse::write_done(out);
        self.end(error.status, outcome, Some(&error.message));
    }

    fn end(&mut self, status: u16, outcome: Outcome, error: Option<&str>) {
        self.phase = Phase::Done;
        let tokens = self.completion_tokens();
        self.prepared
            .record(&self.state, status, outcome, tokens, error);
        self.state
            .metrics
            .stage(Stage::Total, self.prepared.started.elapsed());
    }
}

impl Drop for Streamer {
    /// A stream dropped before its end lost its client.
    fn drop(&mut self) {
        if self.phase != Phase::Done {
            let error = "the client went away before the end of the stream";
            self.end(CLIENT_CLOSED, Outcome::Cancelled, Some(error));
        }
    }
}
