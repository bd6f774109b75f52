//! A Response in one JSON body: the worker's GenerateComplete turned into
//! text ([`ChoiceText`]: decoded, cut at stop strings), shaped into
//! reasoning, text and tool calls, then the Response object (stored when
//! asked) with its usage.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use bytes::BytesMut;
use iris_openai::{ApiError, FinishReason};
use iris_parsers::Piece;

use super::object::{response, Counts, Output, Status};
use super::{save, ReadyResponse};
use crate::chat::choice::ChoiceText;
use crate::http::replies;
use crate::http::{unary, Failure, Ledger};
use crate::metrics::{Outcome, Stage};
use crate::server::AppState;

pub async fn respond(state: Arc<AppState>, ledger: Ledger, ready: ReadyResponse) -> Response {
    let run = run(&state, &ledger, ready);
    unary::respond(&state, &ledger, run).await
}

async fn run(
    state: &AppState,
    ledger: &Ledger,
    ready: ReadyResponse,
) -> Result<(Vec<u8>, u32), Failure> {
    let ReadyResponse {
        mut conversation,
        context,
    } = ready;
    let dispatch = Instant::now();
    let mut generation = conversation.start().await?;
    ledger.metrics.stage(Stage::Dispatch, dispatch.elapsed());
    let generating = Instant::now();
    let tokenizer = conversation.served.prompter.tokenizer().clone();
    let mut text = ChoiceText::new(
        conversation.served.prompter.detok().clone(),
        conversation.stop.clone(),
        false,
    )
    .keeping(conversation.output.kept_tokens());
    let complete = replies::await_complete(&mut generation).await?;
    if complete.finish_reason == "abort" {
        return Err((
            ApiError::bad_gateway("the worker aborted the request"),
            Outcome::UpstreamError,
        ));
    }
    let visible = text
        .complete(&complete)
        .map_err(|e| (e, Outcome::UpstreamError))?;
    generation.finish();
    ledger.metrics.stage(Stage::Generate, generating.elapsed());
    ledger.span("generate", generating);
    ledger
        .metrics
        .tokens(ledger.prompt_tokens, text.completion_tokens);
    let cut = matches!(text.finish, Some(FinishReason::Length));
    let shaper = conversation.output.shaper();
    let pieces = if shaper.is_passthrough() {
        vec![Piece::Content(visible.text)]
    } else {
        shaper.pieces(&visible.text)
    };
    let mut scratch = BytesMut::new();
    let mut output = Output::new(false);
    for piece in pieces {
        output.piece(&mut scratch, piece);
    }
    output.finish(&mut scratch, cut);
    let counts = Counts {
        input: ledger.prompt_tokens,
        cached: complete.cached_tokens,
        output: text.completion_tokens,
        reasoning: reasoning_tokens(&tokenizer, &output.reasoning),
    };
    let status = if cut {
        Status::Incomplete
    } else {
        Status::Completed
    };
    let object = response(
        &ledger.id,
        &conversation.served.name,
        &context,
        &status,
        &output.items,
        Some(counts.usage()),
    );
    save(state, &ledger.id, &context, &object).await;
    let body = serde_json::to_vec(&object).map_err(|e| {
        (
            ApiError::internal(format!("cannot write the response: {e}")),
            Outcome::UpstreamError,
        )
    })?;
    Ok((body, text.completion_tokens))
}

/// Tokens of the reasoning text (0 without reasoning).
pub(super) fn reasoning_tokens(tokenizer: &tokenizers::Tokenizer, reasoning: &str) -> u32 {
    if reasoning.is_empty() {
        return 0;
    }
    tokenizer
        .encode(reasoning, false)
        .map(|e| e.len() as u32)
        .unwrap_or(0)
}
