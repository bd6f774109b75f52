//! Non-streaming answers: wait for the worker's GenerateComplete of every
//! choice (one per sequence index when `n` > 1), turn each into its text
//! ([`ChoiceText`]: decoded, cut at the first stop string, logprobs when
//! asked), answer one JSON body with the choices in index order and the
//! usage summed (the prompt counted once).
//!
//! Workers answer a non-streaming Generate in one message per sequence, so
//! the time from dispatch to the last one is one stage (`generate`); the
//! `first_token` and `decode` stages are the streaming path's.

use std::sync::Arc;
use std::time::Instant;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use iris_openai::{
    unix_now, ApiError, AssistantMessage, CalledFunction, ChatCompletion, Choice, ChoiceLogprobs,
    FinishReason, MessageToolCall, Usage,
};
use iris_proto::scheduler::{
    generate_response::Response as Reply, GenerateComplete, GenerateRequest,
};

use super::errors::{error_response, route_error, stream_ended, worker_error};
use super::record::CLIENT_CLOSED;
use super::Prepared;
use crate::metrics::{Outcome, Stage};
use crate::mm::pending::PendingImages;
use crate::output::OutputPlan;
use crate::router::Generation;
use crate::server::AppState;

pub async fn respond(state: Arc<AppState>, mut prepared: Prepared) -> Response {
    let generate = std::mem::take(&mut prepared.generate);
    let images = std::mem::take(&mut prepared.pending);
    let mut unanswered = ClientGone {
        prepared: &prepared,
        state: &state,
        armed: true,
    };
    let deadline = tokio::time::Instant::from_std(prepared.started + state.request_timeout);
    let run = tokio::time::timeout_at(deadline, run(&state, &prepared, generate, images));
    let result = match tokio::select! {
        biased;
        _ = state.hard_stop.cancelled() => Ok(Err((
            ApiError::service_unavailable("the gateway is shutting down and its grace period ended"),
            Outcome::Cancelled,
        ))),
        result = run => result,
    } {
        Ok(result) => result,
        Err(_) => Err((
            ApiError::gateway_timeout(format!(
                "no answer within {} s",
                state.request_timeout.as_secs()
            )),
            Outcome::Timeout,
        )),
    };
    unanswered.armed = false;
    state
        .metrics
        .stage(Stage::Total, prepared.started.elapsed());
    match result {
        Ok((body, completion_tokens)) => {
            prepared.record(&state, 200, Outcome::Ok, completion_tokens, None);
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err((error, outcome)) => {
            prepared.record(&state, error.status, outcome, 0, Some(&error.message));
            error_response(&error)
        }
    }
}

/// Counts and logs a request whose client left before its answer (the
/// server drops the handler's future): status 499, outcome cancelled.
struct ClientGone<'a> {
    prepared: &'a Prepared,
    state: &'a AppState,
    armed: bool,
}

impl Drop for ClientGone<'_> {
    fn drop(&mut self) {
        if self.armed {
            let error = "the client went away before the answer";
            self.prepared.record(
                self.state,
                CLIENT_CLOSED,
                Outcome::Cancelled,
                0,
                Some(error),
            );
        }
    }
}

async fn run(
    state: &AppState,
    prepared: &Prepared,
    generate: GenerateRequest,
    images: PendingImages,
) -> Result<(Vec<u8>, u32), (ApiError, Outcome)> {
    let dispatch = Instant::now();
    let started = state.router.start_with(generate, &images).await;
    // The workers have the tensors now (or the request failed).
    drop(images);
    let mut generation = started.map_err(route_error)?;
    state.metrics.stage(Stage::Dispatch, dispatch.elapsed());
    let generating = Instant::now();
    let mut choices = prepared.choices(state);
    let mut answered = vec![None; choices.len()];
    while answered.iter().any(Option::is_none) {
        let complete = await_complete(&mut generation).await?;
        let index = complete.index as usize;
        if complete.finish_reason == "abort" {
            return Err((
                ApiError::bad_gateway("the worker aborted the request"),
                Outcome::UpstreamError,
            ));
        }
        let (Some(choice), Some(slot)) = (choices.get_mut(index), answered.get_mut(index)) else {
            return Err(bad_index(&generation, index, choices.len()));
        };
        let visible = choice.complete(&complete).map_err(upstream)?;
        *slot = Some(visible);
    }
    generation.finish();
    state.metrics.stage(Stage::Generate, generating.elapsed());
    let completion_tokens: u32 = choices.iter().map(|c| c.completion_tokens).sum();
    state
        .metrics
        .tokens(prepared.prompt_tokens, completion_tokens);
    let usage = Usage::new(prepared.prompt_tokens, completion_tokens);
    let choices = choices
        .iter()
        .zip(answered)
        .enumerate()
        .map(|(index, (choice, visible))| {
            let visible = visible.unwrap_or_default();
            let mut finish_reason = choice.finish.unwrap_or(FinishReason::Stop);
            let message = shaped_message(&prepared.output, visible.text, &mut finish_reason);
            Choice {
                message,
                ..Choice::new(
                    index as u32,
                    "",
                    finish_reason,
                    visible.logprobs.map(ChoiceLogprobs::new),
                )
            }
        })
        .collect();
    let body =
        ChatCompletion::with_choices(&prepared.id, unix_now(), &state.model_name, choices, usage)
            .to_json();
    Ok((body, completion_tokens))
}

/// A failure to turn the worker's tokens into text.
fn upstream(error: ApiError) -> (ApiError, Outcome) {
    (error, Outcome::UpstreamError)
}

/// A worker answered for a sequence the request did not ask for.
pub(super) fn bad_index(generation: &Generation, index: usize, n: usize) -> (ApiError, Outcome) {
    let error = ApiError::bad_gateway(format!(
        "worker {} answered for sequence {index} of a request for {n}",
        generation.worker.url
    ));
    (error, Outcome::UpstreamError)
}

/// The next GenerateComplete of the generation (stream chunks are skipped).
async fn await_complete(
    generation: &mut Generation,
) -> Result<GenerateComplete, (ApiError, Outcome)> {
    loop {
        match generation.next().await {
            Some(Ok(response)) => {
                if let Some(Reply::Complete(complete)) = response.response {
                    return Ok(complete);
                }
            }
            Some(Err(status)) => {
                return Err(worker_error(&generation.worker.url.to_string(), &status))
            }
            None => {
                return Err((
                    stream_ended(&generation.worker.url.to_string()),
                    Outcome::UpstreamError,
                ))
            }
        }
    }
}

/// The assistant message for `text`: its reasoning and tool calls parsed
/// out as the plan says; tool calls make the finish reason `tool_calls`.
fn shaped_message(
    plan: &OutputPlan,
    text: String,
    finish_reason: &mut FinishReason,
) -> AssistantMessage {
    let shaper = plan.shaper();
    if shaper.is_passthrough() {
        return AssistantMessage::new(text);
    }
    let shaped = shaper.shape(&text);
    let tool_calls: Vec<MessageToolCall> =
        shaped.tool_calls.into_iter().map(message_call).collect();
    if !tool_calls.is_empty() {
        *finish_reason = FinishReason::ToolCalls;
    }
    AssistantMessage {
        content: match (shaped.content, tool_calls.is_empty()) {
            (Some(c), _) => Some(c),
            (None, true) => Some(String::new()),
            (None, false) => None,
        },
        reasoning_content: shaped.reasoning,
        tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
        ..AssistantMessage::new("")
    }
}

/// A parsed call in the response's shape.
fn message_call(call: iris_parsers::ToolCall) -> MessageToolCall {
    MessageToolCall {
        id: call.id,
        kind: "function".to_owned(),
        function: CalledFunction {
            name: call.name,
            arguments: call.arguments,
        },
    }
}
