//! `POST /v1/completions`: the legacy text completions API, text only.
//!
//! The body parsed into prompts ([`iris_openai::parse_completion_request`];
//! [`crate::request::prompts`] tokenizes them and builds one worker request
//! per prompt), all started through the [`crate::router::Router`]
//! (retries, admission and stage metrics as for chat), then the answer as
//! SSE ([`stream`]) or as one JSON body ([`unary`]).
//! Choices are indexed across the batch: prompt `p`, sequence `i` of its
//! `n` is choice `p * n + i`.

mod choice;
mod runs;
mod stream;
mod unary;

use std::sync::Arc;

use axum::response::Response;
use iris_openai::{ApiError, CompletionRequest};

use crate::http::record::COMPLETIONS;
use crate::http::serve::Endpoint;
use crate::http::Ledger;
use crate::request::{ApiRequest, ReadyPrompts};
use crate::server::AppState;
use choice::CompletionText;

/// The completions endpoint.
pub struct Completions;

impl Endpoint for Completions {
    const NAME: &'static str = COMPLETIONS;
    type Input = CompletionRequest;

    /// `cmpl-` and 24 random alphanumerics.
    fn new_id() -> String {
        let chat = iris_openai::new_completion_id();
        format!("cmpl-{}", chat.trim_start_matches("chatcmpl-"))
    }

    fn span(id: &str) -> tracing::Span {
        tracing::info_span!("completion", request_id = %id)
    }

    async fn convert(_: &AppState, body: &[u8]) -> Result<ApiRequest<CompletionRequest>, ApiError> {
        Ok(ApiRequest::new(iris_openai::parse_completion_request(
            body,
        )?))
    }

    async fn unary(state: Arc<AppState>, ledger: Ledger, ready: ReadyPrompts) -> Response {
        unary::respond(state, ledger, ready).await
    }

    async fn stream(state: Arc<AppState>, ledger: Ledger, ready: ReadyPrompts) -> Response {
        stream::respond(state, ledger, ready).await
    }
}

impl ReadyPrompts {
    /// The choices of every prompt, in index order.
    fn choices(&self) -> Vec<CompletionText> {
        let tables = self.served.prompter.detok();
        let n = self.request.n();
        let stops = self.request.sampling().stop;
        let logprobs = self.request.logprobs.is_some();
        let mut choices = Vec::with_capacity(self.prompts.len() * n as usize);
        for prompt in &self.prompts {
            for _ in 0..n {
                let index = choices.len() as u32;
                choices.push(CompletionText::new(
                    index,
                    tables.clone(),
                    &prompt.ids,
                    &stops,
                    &prompt.echo,
                    logprobs,
                ));
            }
        }
        choices
    }

    /// Each choice's echoed prompt text, in index order (empty strings
    /// without `echo`).
    fn echoes(&self) -> impl Iterator<Item = &str> {
        let n = self.request.n() as usize;
        self.prompts
            .iter()
            .flat_map(move |p| std::iter::repeat_n(p.echo.as_str(), n))
    }
}
