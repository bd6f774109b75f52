//! Non-streaming completions: wait for every choice's GenerateComplete,
//! decode, cut at stop strings, answer one `text_completion` body.

use std::sync::Arc;
use std::time::Instant;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use iris_openai::{unix_now, ApiError, CompletionChoice, TextCompletion, Usage};

use super::runs::{feed, Failure, Runs};
use super::Prepared;
use crate::chat::errors::error_response;
use crate::chat::record::CLIENT_CLOSED;
use crate::metrics::{Outcome, Stage};
use crate::server::AppState;

pub async fn respond(state: Arc<AppState>, prepared: Prepared) -> Response {
    let mut unanswered = ClientGone {
        prepared: &prepared,
        state: &state,
        armed: true,
    };
    let deadline = tokio::time::Instant::from_std(prepared.started + state.request_timeout);
    let result = tokio::select! {
        biased;
        _ = state.hard_stop.cancelled() => Err((
            ApiError::service_unavailable("the gateway is shutting down and its grace period ended"),
            Outcome::Cancelled,
        )),
        result = tokio::time::timeout_at(deadline, run(&state, &prepared)) => result.unwrap_or_else(|_| Err((
            ApiError::gateway_timeout(format!("no answer within {} s", state.request_timeout.as_secs())),
            Outcome::Timeout,
        ))),
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

/// Counts and logs a request whose client left before its answer.
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

/// The body and the completion tokens.
async fn run(state: &AppState, prepared: &Prepared) -> Result<(Vec<u8>, u32), Failure> {
    let dispatch = Instant::now();
    let mut runs = Runs::start(state, prepared).await?;
    state.metrics.stage(Stage::Dispatch, dispatch.elapsed());
    let generating = Instant::now();
    let mut choices = prepared.choices(state.prompter.tokenizer());
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
    state.metrics.stage(Stage::Generate, generating.elapsed());
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
    state
        .metrics
        .tokens(prepared.prompt_tokens, completion_tokens);
    let usage = Usage::new(prepared.prompt_tokens, completion_tokens);
    let body = TextCompletion::new(
        &prepared.id,
        unix_now(),
        &state.model_name,
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
