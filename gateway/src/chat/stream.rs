//! Streaming answers: the worker's token chunks become OpenAI SSE chunks.
//! Each choice (`n` of them, told apart by the chunks' sequence `index`)
//! has its own [`ChoiceText`] (incremental, UTF-8 safe decoding; stop
//! strings, which may span chunks; logprobs) and its own role, content and
//! finish chunks, interleaved as the worker's chunks arrive. When every
//! choice has ended the stream ends with the usage chunk (when asked,
//! summed over the choices) and `[DONE]`; choices still generating after
//! their stop string are aborted then. The body is a lazy stream: when the
//! client goes away it is dropped, and dropping the [`Generation`] aborts
//! the workers (the request is then logged with status 499).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use iris_openai::sse::{self, ChunkWriter};
use iris_openai::{unix_now, ApiError, ChoiceLogprobs, FinishReason, Usage};
use iris_parsers::{OutputShaper, Piece};
use iris_proto::scheduler::{
    generate_response::Response as Reply, GenerateComplete, GenerateStreamChunk,
};

use super::choice::{ChoiceText, Visible};
use super::complete::bad_index;
use super::errors::{error_response, route_error, stream_ended, worker_error};
use super::record::CLIENT_CLOSED;
use super::Prepared;
use crate::metrics::{Outcome, Stage};
use crate::router::Generation;
use crate::server::AppState;

pub async fn respond(state: Arc<AppState>, mut prepared: Prepared) -> Response {
    let dispatch = std::time::Instant::now();
    let deadline = tokio::time::Instant::from_std(prepared.started + state.request_timeout);
    let images = std::mem::take(&mut prepared.pending);
    let start = state
        .router
        .start_with(std::mem::take(&mut prepared.generate), &images);
    let started = tokio::time::timeout_at(deadline, start).await;
    // The workers have the tensors now (or the request failed).
    drop(images);
    let generation = match started {
        Ok(Ok(generation)) => generation,
        Ok(Err(error)) => {
            let (error, outcome) = route_error(error);
            prepared.record(&state, error.status, outcome, 0, Some(&error.message));
            return error_response(&error);
        }
        Err(_) => {
            let error = ApiError::gateway_timeout(format!(
                "the workers did not start answering within {} s",
                state.request_timeout.as_secs()
            ));
            let outcome = Outcome::Timeout;
            prepared.record(&state, error.status, outcome, 0, Some(&error.message));
            return error_response(&error);
        }
    };
    state.metrics.stage(Stage::Dispatch, dispatch.elapsed());
    let streamer = match Streamer::new(state, prepared, generation) {
        Ok(s) => s,
        Err(error) => return error_response(&error),
    };
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
    /// The role chunks are next.
    Start,
    Tokens,
    Done,
}

/// One choice of the stream: its chunk writer and its text.
struct StreamChoice {
    writer: ChunkWriter,
    text: ChoiceText,
    /// Splits reasoning and tool calls out of the text.
    shaper: OutputShaper,
    /// Tool calls written so far (the next one's index).
    calls_written: u32,
    /// The worker sent this sequence's GenerateComplete.
    completed: bool,
    /// Its finish chunk was written.
    reported: bool,
}

impl StreamChoice {
    /// Writes what became visible: as content (with its tokens' log
    /// probabilities), or through the shaper when reasoning or tool calls
    /// are parsed out.
    fn write_visible(&mut self, out: &mut BytesMut, visible: Visible) {
        let logprobs = visible
            .logprobs
            .filter(|lp| !lp.is_empty())
            .map(ChoiceLogprobs::new);
        if self.shaper.is_passthrough() {
            return self.write_content(out, &visible.text, logprobs.as_ref());
        }
        let pieces = if visible.text.is_empty() {
            Vec::new()
        } else {
            self.shaper.push(&visible.text)
        };
        let mut logprobs = logprobs;
        for piece in pieces {
            if let Piece::Content(text) = &piece {
                self.write_content(out, text, logprobs.take().as_ref());
            } else {
                self.write_piece(out, piece);
            }
        }
        // Tokens that went to reasoning or a tool call keep their log
        // probabilities, on an empty content delta.
        if let Some(lp) = logprobs {
            self.writer.write_content_with_logprobs(out, "", &lp);
        }
    }

    fn write_content(&self, out: &mut BytesMut, text: &str, logprobs: Option<&ChoiceLogprobs>) {
        match logprobs {
            Some(lp) => self.writer.write_content_with_logprobs(out, text, lp),
            None if !text.is_empty() => self.writer.write_content(out, text),
            None => {}
        }
    }

    /// One shaped piece: content, reasoning, or a tool call as a chunk with
    /// its id and name then one with its arguments.
    fn write_piece(&mut self, out: &mut BytesMut, piece: Piece) {
        match piece {
            Piece::Content(text) => self.writer.write_content(out, &text),
            Piece::Reasoning(text) => self.writer.write_reasoning(out, &text),
            Piece::ToolCall(call) => {
                let index = self.calls_written;
                self.calls_written += 1;
                self.writer
                    .write_tool_call_start(out, index, &call.id, &call.name);
                self.writer
                    .write_tool_call_arguments(out, index, &call.arguments);
            }
        }
    }

    /// The shaper's held text, then the finish chunk (`tool_calls` once a
    /// call was written).
    fn write_end(&mut self, out: &mut BytesMut, reason: FinishReason) {
        for piece in self.shaper.finish() {
            self.write_piece(out, piece);
        }
        let reason = if self.calls_written > 0 {
            FinishReason::ToolCalls
        } else {
            reason
        };
        self.writer.write_finish(out, reason);
        self.reported = true;
    }
}

/// The state of one SSE answer.
struct Streamer {
    state: Arc<AppState>,
    prepared: Prepared,
    generation: Generation,
    choices: Vec<StreamChoice>,
    phase: Phase,
    /// When the first token reached the client.
    first_token_at: Option<Instant>,
    deadline: tokio::time::Instant,
}

impl Streamer {
    fn new(
        state: Arc<AppState>,
        prepared: Prepared,
        generation: Generation,
    ) -> Result<Streamer, ApiError> {
        let writer = ChunkWriter::new(&prepared.id, unix_now(), &state.model_name);
        let choices = prepared
            .choices(&state)
            .into_iter()
            .enumerate()
            .map(|(index, text)| StreamChoice {
                writer: writer.for_choice(index as u32),
                text,
                shaper: prepared.output.shaper(),
                calls_written: 0,
                completed: false,
                reported: false,
            })
            .collect();
        let deadline = tokio::time::Instant::from_std(prepared.started + state.request_timeout);
        Ok(Streamer {
            state,
            prepared,
            generation,
            choices,
            phase: Phase::Start,
            first_token_at: None,
            deadline,
        })
    }

    /// The next bytes to send, or `None` when the stream is over.
    async fn next_event(&mut self) -> Option<Bytes> {
        let mut out = BytesMut::with_capacity(256);
        match self.phase {
            Phase::Done => return None,
            Phase::Start => {
                for choice in &self.choices {
                    choice.writer.write_role(&mut out);
                }
                self.phase = Phase::Tokens;
                return Some(out.freeze());
            }
            Phase::Tokens => {}
        }
        while out.is_empty() && self.phase == Phase::Tokens {
            self.step(&mut out).await;
        }
        Some(out.freeze())
    }

    /// Reads one response from the worker and writes what it produces.
    async fn step(&mut self, out: &mut BytesMut) {
        let next = tokio::select! {
            biased;
            _ = self.state.hard_stop.cancelled() => {
                let error = ApiError::service_unavailable(
                    "the gateway is shutting down and its grace period ended",
                );
                return self.fail(out, &error, Outcome::Cancelled);
            }
            next = tokio::time::timeout_at(self.deadline, self.generation.next()) => next,
        };
        match next {
            Err(_) => {
                let error = ApiError::gateway_timeout(format!(
                    "no complete answer within {} s",
                    self.state.request_timeout.as_secs()
                ));
                self.fail(out, &error, Outcome::Timeout);
            }
            Ok(None) => {
                let error = stream_ended(&self.generation.worker.url.to_string());
                self.fail(out, &error, Outcome::UpstreamError);
            }
            Ok(Some(Err(status))) => {
                let (error, outcome) =
                    worker_error(&self.generation.worker.url.to_string(), &status);
                self.fail(out, &error, outcome);
            }
            Ok(Some(Ok(response))) => match response.response {
                Some(Reply::Chunk(chunk)) => self.chunk(out, &chunk),
                Some(Reply::Complete(complete)) => self.complete(out, &complete),
                None => {}
            },
        }
    }

    /// The choice a worker message is for; a failure for an index the
    /// request did not ask for.
    fn choice_at(&mut self, out: &mut BytesMut, index: u32) -> Option<usize> {
        if (index as usize) < self.choices.len() {
            return Some(index as usize);
        }
        let (error, outcome) = bad_index(&self.generation, index as usize, self.choices.len());
        self.fail(out, &error, outcome);
        None
    }

    fn chunk(&mut self, out: &mut BytesMut, chunk: &GenerateStreamChunk) {
        let Some(i) = self.choice_at(out, chunk.index) else {
            return;
        };
        if !chunk.token_ids.is_empty() {
            self.first_token();
        }
        let choice = &mut self.choices[i];
        let pushed = choice
            .text
            .push_chunk(&chunk.token_ids, chunk.output_logprobs.as_ref());
        self.emit(out, i, pushed);
    }

    fn complete(&mut self, out: &mut BytesMut, complete: &GenerateComplete) {
        if complete.finish_reason == "abort" {
            let error = ApiError::bad_gateway("the worker aborted the request");
            return self.fail(out, &error, Outcome::UpstreamError);
        }
        let Some(i) = self.choice_at(out, complete.index) else {
            return;
        };
        if !complete.output_ids.is_empty() {
            self.first_token();
        }
        let choice = &mut self.choices[i];
        choice.completed = true;
        let visible = choice.text.complete(complete);
        self.emit(out, i, visible);
    }

    /// Notes when the first token arrived (the `first_token` stage).
    fn first_token(&mut self) {
        if self.first_token_at.is_none() {
            self.first_token_at = Some(Instant::now());
            self.state
                .metrics
                .stage(Stage::FirstToken, self.prepared.started.elapsed());
        }
    }

    /// Writes what choice `i` made visible, and its finish chunk when it
    /// has ended; the stream ends once every choice has.
    fn emit(&mut self, out: &mut BytesMut, i: usize, visible: Result<Visible, ApiError>) {
        let visible = match visible {
            Ok(visible) => visible,
            Err(error) => return self.fail(out, &error, Outcome::UpstreamError),
        };
        let choice = &mut self.choices[i];
        choice.write_visible(out, visible);
        let Some(reason) = choice.text.finish else {
            return;
        };
        if choice.reported {
            return;
        }
        choice.write_end(out, reason);
        if self.choices.iter().all(|c| c.reported) {
            self.finish(out);
        }
    }

    /// Every choice has ended: stop the workers if they still generate,
    /// then the usage chunk and `[DONE]`.
    fn finish(&mut self, out: &mut BytesMut) {
        if self.choices.iter().all(|c| c.completed) {
            self.generation.finish();
        } else {
            self.generation.abort("stop string matched");
        }
        let completion_tokens = self.completion_tokens();
        if self.prepared.request.include_usage() {
            self.choices[0].writer.write_usage(
                out,
                &Usage::new(self.prepared.prompt_tokens, completion_tokens),
            );
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

    /// Tokens generated over every choice.
    fn completion_tokens(&self) -> u32 {
        self.choices.iter().map(|c| c.text.completion_tokens).sum()
    }

    fn fail(&mut self, out: &mut BytesMut, error: &ApiError, outcome: Outcome) {
        tracing::warn!(request_id = %self.prepared.id, error = %error.message, "stream failed");
        self.generation.abort("gateway ended the request");
        sse::write_error_event(out, error);
        sse::write_done(out);
        self.end(error.status, outcome, Some(&error.message));
    }

    fn end(&mut self, status: u16, outcome: Outcome, error: Option<&str>) {
        self.phase = Phase::Done;
        let completion_tokens = self.completion_tokens();
        self.prepared
            .record(&self.state, status, outcome, completion_tokens, error);
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
