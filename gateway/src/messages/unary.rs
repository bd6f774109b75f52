//! Non-streaming answers: the worker's tokens become the answer's text
//! ([`MessageText`]), shaped into content blocks — `thinking` (reasoning
//! parsed out), `text`, then one `tool_use` per parsed call — and one
//! `message` object with its stop reason and usage.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use iris_openai::ApiError;
use iris_parsers::Shaped;
use iris_proto::scheduler::generate_response::Response as Reply;
use serde_json::{json, Value};

use super::{message_text, tool_use_block, usage, StopReason};
use crate::http::errors::{stream_ended, worker_error};
use crate::http::{unary, Failure, Ledger};
use crate::metrics::{Outcome, Stage};
use crate::request::ReadyConversation;
use crate::server::AppState;

pub async fn respond(
    state: Arc<AppState>,
    ledger: Ledger,
    prepared: ReadyConversation,
) -> Response {
    let run = run(&ledger, prepared);
    unary::respond(&state, &ledger, run).await
}

async fn run(ledger: &Ledger, mut prepared: ReadyConversation) -> Result<(Vec<u8>, u32), Failure> {
    let dispatch = Instant::now();
    let mut generation = prepared.start().await?;
    ledger.metrics.stage(Stage::Dispatch, dispatch.elapsed());
    let generating = Instant::now();
    let mut text = message_text(&prepared);
    let mut answer = String::new();
    let mut cached_tokens = 0;
    loop {
        let reply = match generation.next().await {
            Some(Ok(response)) => response.response,
            Some(Err(status)) => {
                return Err(worker_error(&generation.worker.url.to_string(), &status))
            }
            None => {
                let worker = generation.worker.url.to_string();
                return Err((stream_ended(&worker), Outcome::UpstreamError));
            }
        };
        match reply {
            Some(Reply::Chunk(chunk)) => {
                cached_tokens = cached_tokens.max(chunk.cached_tokens);
                answer.push_str(&text.push_chunk(&chunk.token_ids).map_err(upstream)?);
            }
            Some(Reply::Complete(complete)) => {
                if complete.finish_reason == "abort" {
                    let error = ApiError::bad_gateway("the worker aborted the request");
                    return Err((error, Outcome::UpstreamError));
                }
                cached_tokens = cached_tokens.max(complete.cached_tokens);
                answer.push_str(&text.complete(&complete).map_err(upstream)?);
                break;
            }
            None => {}
        }
    }
    generation.finish();
    ledger.metrics.stage(Stage::Generate, generating.elapsed());
    ledger.span("generate", generating);
    let output_tokens = text.completion_tokens;
    ledger.metrics.tokens(ledger.prompt_tokens, output_tokens);
    let shaper = prepared.output.shaper();
    let shaped = if shaper.is_passthrough() {
        Shaped {
            content: Some(answer),
            ..Shaped::default()
        }
    } else {
        shaper.shape(&answer)
    };
    let reason = text.finish.unwrap_or(StopReason::EndTurn);
    let body = message(
        &ledger.id,
        &prepared.served.name,
        shaped,
        reason,
        usage(ledger.prompt_tokens, cached_tokens, output_tokens),
    );
    Ok((body.to_string().into_bytes(), output_tokens))
}

fn upstream(error: ApiError) -> Failure {
    (error, Outcome::UpstreamError)
}

/// The `message` object of a whole answer.
fn message(id: &str, model: &str, shaped: Shaped, reason: StopReason, usage: Value) -> Value {
    let mut content = Vec::new();
    if let Some(thinking) = shaped.reasoning.filter(|t| !t.is_empty()) {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    // An empty text is no block, as in the stream (which opens a block
    // with its first text).
    if let Some(text) = shaped.content.filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": text}));
    }
    content.extend(shaped.tool_calls.iter().map(tool_use_block));
    let reason = reason.with_calls(!shaped.tool_calls.is_empty());
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason.as_str(),
        "stop_sequence": reason.sequence(),
        "usage": usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> iris_parsers::ToolCall {
        iris_parsers::ToolCall {
            id: "call_1".into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn a_text_answer_is_one_text_block() {
        let shaped = Shaped {
            content: Some("hi".into()),
            ..Shaped::default()
        };
        let body = message("msg_1", "m", shaped, StopReason::EndTurn, usage(10, 4, 2));
        assert_eq!(
            body,
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                   "content": [{"type": "text", "text": "hi"}],
                   "stop_reason": "end_turn", "stop_sequence": null,
                   "usage": {"input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": 2}})
        );
        let body = message(
            "msg_1",
            "m",
            Shaped::default(),
            StopReason::StopSequence("END".into()),
            usage(1, 0, 1),
        );
        assert_eq!(body["stop_reason"], "stop_sequence");
        assert_eq!(body["stop_sequence"], "END");
        assert_eq!(body["content"], json!([]));
    }

    #[test]
    fn reasoning_and_calls_are_their_own_blocks() {
        let shaped = Shaped {
            content: None,
            reasoning: Some("think".into()),
            tool_calls: vec![call("f", r#"{"a":1}"#), call("g", "not json")],
        };
        let body = message("msg_1", "m", shaped, StopReason::EndTurn, usage(1, 0, 1));
        assert_eq!(
            body["content"],
            json!([{"type": "thinking", "thinking": "think", "signature": ""},
                   {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
                   {"type": "tool_use", "id": "call_1", "name": "g", "input": {}}])
        );
        assert_eq!(body["stop_reason"], "tool_use");
        // Text before a call stays, before it.
        let shaped = Shaped {
            content: Some("Checking.".into()),
            reasoning: None,
            tool_calls: vec![call("f", "{}")],
        };
        let body = message("msg_1", "m", shaped, StopReason::MaxTokens, usage(1, 0, 1));
        assert_eq!(
            body["content"][0],
            json!({"type": "text", "text": "Checking."})
        );
        assert_eq!(body["content"][1]["type"], "tool_use");
    }
}
