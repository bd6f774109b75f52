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

use axum::response::Response;
use iris_openai::{
    unix_now, ApiError, AssistantMessage, CalledFunction, ChatCompletion, Choice, ChoiceLogprobs,
    FinishReason, MessageToolCall, Usage,
};

use crate::http::replies;
use crate::http::{unary, Failure, Ledger};
use crate::metrics::{Outcome, Stage};
use crate::output::OutputPlan;
use crate::request::ReadyConversation;
use crate::router::Generation;
use crate::server::AppState;

pub async fn respond(
    state: Arc<AppState>,
    ledger: Ledger,
    prepared: ReadyConversation,
) -> Response {
    // Boxed: its future is large and would be copied on every move.
    let run = Box::pin(run(&ledger, prepared));
    unary::respond(&state, &ledger, run).await
}

async fn run(ledger: &Ledger, mut prepared: ReadyConversation) -> Result<(Vec<u8>, u32), Failure> {
    let dispatch = Instant::now();
    let mut generation = prepared.start().await?;
    ledger.metrics.stage(Stage::Dispatch, dispatch.elapsed());
    let generating = Instant::now();
    let mut choices = super::choices(&prepared);
    let mut answered = vec![None; choices.len()];
    // Prompt tokens the worker served from its prefix cache.
    let mut cached_tokens = 0;
    while answered.iter().any(Option::is_none) {
        let complete = replies::await_complete(&mut generation).await?;
        cached_tokens = cached_tokens.max(complete.cached_tokens);
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
    ledger.metrics.stage(Stage::Generate, generating.elapsed());
    ledger.span("generate", generating);
    let completion_tokens: u32 = choices.iter().map(|c| c.completion_tokens).sum();
    ledger
        .metrics
        .tokens(ledger.prompt_tokens, completion_tokens);
    let usage =
        Usage::new(ledger.prompt_tokens, completion_tokens).with_cached_tokens(cached_tokens);
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
    let model = &prepared.served.name;
    let body =
        ChatCompletion::with_choices(&ledger.id, unix_now(), model, choices, usage).to_json();
    Ok((body, completion_tokens))
}

/// A failure to turn the worker's tokens into text.
fn upstream(error: ApiError) -> Failure {
    (error, Outcome::UpstreamError)
}

/// A worker answered for a sequence the request did not ask for.
pub(super) fn bad_index(generation: &Generation, index: usize, n: usize) -> Failure {
    let error = ApiError::bad_gateway(format!(
        "worker {} answered for sequence {index} of a request for {n}",
        generation.worker.url
    ));
    (error, Outcome::UpstreamError)
}

/// The assistant message for `text`: its reasoning and tool calls parsed
/// out as the plan says; tool calls make the finish reason `tool_calls`
/// unless the answer was cut.
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
    *finish_reason = finish_reason.with_calls(!tool_calls.is_empty());
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
        index: None,
    }
}
