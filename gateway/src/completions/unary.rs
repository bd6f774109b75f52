//! Non-streaming completions: wait for every choice's GenerateComplete,
//! decode, cut at stop strings, answer one `text_completion` body.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use iris_openai::{unix_now, ApiError, CompletionChoice, TextCompletion, Usage};

use super::runs::{feed, Runs};
use crate::http::{unary, Failure, Ledger};
use crate::metrics::{Outcome, Stage};
use crate::request::ReadyPrompts;
use crate::server::AppState;

pub async fn respond(state: Arc<AppState>, ledger: Ledger, prepared: ReadyPrompts) -> Response {
    // Boxed: its future is large and would be copied on every move.
    unary::respond(&state, &ledger, Box::pin(run(&ledger, &prepared))).await
}

/// The body and the completion tokens.
async fn run(ledger: &Ledger, prepared: &ReadyPrompts) -> Result<(Vec<u8>, u32), Failure> {
    let dispatch = Instant::now();
    let mut runs = Runs::start(&ledger.id, prepared).await?;
    ledger.metrics.stage(Stage::Dispatch, dispatch.elapsed());
    let generating = Instant::now();
    let mut choices = prepared.choices();
    let mut out: Vec<CompletionChoice> = choices
        .iter()
        .zip(prepared.echoes())
        .map(|(c, echo)| CompletionChoice {
            index: c.index,
            text: echo.to_owned(),
            logprobs: prepared.request.logprobs.map(|_| Default::default()),
            finish_reason: None,
        })
        .collect();
    while let Some(event) = runs.next().await {
        let (i, released) = feed(&mut choices, event?).map_err(upstream)?;
        let choice = &mut out[i];
        choice.text.push_str(&released.text);
        if let (Some(mine), Some(mut new)) = (choice.logprobs.as_mut(), released.logprobs) {
            mine.append(&mut new);
        }
    }
    ledger.metrics.stage(Stage::Generate, generating.elapsed());
    ledger.span("generate", generating);
    for (choice, text) in out.iter_mut().zip(&choices) {
        choice.finish_reason = text.finish;
        if text.finish.is_none() {
            let error = ApiError::bad_gateway(format!(
                "the workers ended without completing choice {}",
                text.index
            ));
            return Err((error, Outcome::UpstreamError));
        }
    }
    let completion_tokens = choices
        .iter()
        .map(|c| c.tokens)
        .fold(0u32, u32::saturating_add);
    ledger
        .metrics
        .tokens(ledger.prompt_tokens, completion_tokens);
    let usage = Usage::new(ledger.prompt_tokens, completion_tokens)
        .with_cached_tokens(runs.cached_tokens());
    let body = TextCompletion::new(
        &ledger.id,
        unix_now(),
        &prepared.served.name,
        out,
        Some(usage),
    )
    .to_json();
    Ok((body, completion_tokens))
}

/// A failure in the gateway while reading the workers' answer.
pub(super) fn upstream(error: ApiError) -> Failure {
    (error, Outcome::UpstreamError)
}
