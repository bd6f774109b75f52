//! Streaming answers: the worker's token chunks become OpenAI SSE chunks,
//! decoded incrementally (UTF-8 safe) and cut at the first stop string,
//! which may span chunks. The body is a lazy stream: when the client goes
//! away it is dropped, and dropping the [`Generation`] aborts the workers
//! (the request is then logged with status 499).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use iris_detok::{IncrementalDecoder, StopMatcher};
use iris_openai::sse::{self, ChunkWriter};
use iris_openai::{unix_now, ApiError, FinishReason, Usage};
use iris_parsers::{OutputShaper, Piece};
use iris_proto::scheduler::{generate_response::Response as Reply, GenerateComplete};

use super::errors::{error_response, route_error, stream_ended, worker_error};
use super::record::CLIENT_CLOSED;
use super::Prepared;
use crate::metrics::{Outcome, Stage};
use crate::router::Generation;
use crate::server::AppState;

pub async fn respond(state: Arc<AppState>, mut prepared: Prepared) -> Response {
    let dispatch = std::time::Instant::now();
    let deadline = tokio::time::Instant::from_std(prepared.started + state.request_timeout);
    let start = state.router.start(std::mem::take(&mut prepared.generate));
    let started = tokio::time::timeout_at(deadline, start).await;
    // The workers have the tensors now (or the request failed).
    drop(std::mem::take(&mut prepared.images_memory));
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
    /// The role chunk is next.
    Start,
    Tokens,
    Done,
}

/// The state of one SSE answer.
struct Streamer {
    state: Arc<AppState>,
    prepared: Prepared,
    generation: Generation,
    writer: ChunkWriter,
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    /// Splits reasoning and tool calls out of the text.
    shaper: OutputShaper,
    /// Tool calls written so far (the next one's index).
    calls_written: u32,
    phase: Phase,
    completion_tokens: u32,
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
        let decoder = IncrementalDecoder::new(state.prompter.tokenizer().clone(), &[], true);
        let stops = StopMatcher::new(prepared.stop.clone());
        let shaper = prepared.output.shaper();
        let deadline = tokio::time::Instant::from_std(prepared.started + state.request_timeout);
        Ok(Streamer {
            state,
            prepared,
            generation,
            writer,
            decoder,
            stops,
            shaper,
            calls_written: 0,
            phase: Phase::Start,
            completion_tokens: 0,
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
                self.writer.write_role(&mut out);
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
                Some(Reply::Chunk(chunk)) => self.tokens(out, &chunk.token_ids),
                Some(Reply::Complete(complete)) => self.complete(out, complete),
                None => {}
            },
        }
    }

    fn tokens(&mut self, out: &mut BytesMut, ids: &[u32]) {
        if self.first_token_at.is_none() {
            self.first_token_at = Some(Instant::now());
            self.state
                .metrics
                .stage(Stage::FirstToken, self.prepared.started.elapsed());
        }
        self.completion_tokens += ids.len() as u32;
        let text = match self.decoder.push_many(ids) {
            Ok(text) => text.unwrap_or_default(),
            Err(e) => {
                let error = ApiError::internal(format!("detokenization failed: {e}"));
                return self.fail(out, &error, Outcome::UpstreamError);
            }
        };
        self.emit(out, &text);
    }

    /// Passes `text` through the stop matcher and writes what may be shown;
    /// a matched stop ends the stream and aborts the workers.
    fn emit(&mut self, out: &mut BytesMut, text: &str) {
        if text.is_empty() {
            return;
        }
        let step = self.stops.push(text);
        self.write_text(out, &step.emit);
        if step.stopped.is_some() {
            self.generation.abort("stop string matched");
            self.finish(out, FinishReason::Stop);
        }
    }

    fn complete(&mut self, out: &mut BytesMut, complete: GenerateComplete) {
        self.generation.finish();
        if complete.finish_reason == "abort" {
            let error = ApiError::bad_gateway("the worker aborted the request");
            return self.fail(out, &error, Outcome::UpstreamError);
        }
        // Tokens of a non-streaming worker arrive only here.
        if self.completion_tokens == 0 && !complete.output_ids.is_empty() {
            self.tokens(out, &complete.output_ids);
        }
        self.completion_tokens = self.completion_tokens.max(complete.completion_tokens);
        if self.phase != Phase::Tokens {
            return;
        }
        let tail = self.decoder.finish();
        self.emit(out, &tail);
        if self.phase != Phase::Tokens {
            return;
        }
        let held = self.stops.finish();
        self.write_text(out, &held);
        let reason = if complete.finish_reason == "length" {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        self.finish(out, reason);
    }

    /// Writes text that may be shown: as content, or through the shaper.
    fn write_text(&mut self, out: &mut BytesMut, text: &str) {
        if text.is_empty() {
            return;
        }
        if self.shaper.is_passthrough() {
            return self.writer.write_content(out, text);
        }
        let pieces = self.shaper.push(text);
        self.write_pieces(out, pieces);
    }

    /// Writes shaped pieces: content, reasoning, and each tool call as a
    /// chunk with its id and name then one with its arguments.
    fn write_pieces(&mut self, out: &mut BytesMut, pieces: Vec<Piece>) {
        for piece in pieces {
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
    }

    fn finish(&mut self, out: &mut BytesMut, reason: FinishReason) {
        let rest = self.shaper.finish();
        self.write_pieces(out, rest);
        let reason = if self.calls_written > 0 {
            FinishReason::ToolCalls
        } else {
            reason
        };
        self.writer.write_finish(out, reason);
        if self.prepared.request.include_usage() {
            self.writer.write_usage(
                out,
                &Usage::new(self.prepared.prompt_tokens, self.completion_tokens),
            );
        }
        sse::write_done(out);
        self.state
            .metrics
            .tokens(self.prepared.prompt_tokens, self.completion_tokens);
        if let Some(first) = self.first_token_at {
            self.state.metrics.stage(Stage::Decode, first.elapsed());
        }
        self.end(200, Outcome::Ok, None);
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
        self.prepared
            .record(&self.state, status, outcome, self.completion_tokens, error);
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
