//! `POST /v1/chat/completions`: the body parsed into a conversation
//! ([`iris_openai::parse_chat_request_with`]; [`crate::request::conversation`]
//! makes it ready), then the answer as SSE ([`stream`]) or as one JSON body
//! ([`complete`]). The path every endpoint shares (body, model, deadlines,
//! errors, the log line) is [`crate::http::serve`]'s.

pub(crate) mod choice;
mod complete;
mod logprobs;
mod stream;

use std::sync::Arc;

use axum::response::Response;
use iris_openai::{ApiError, ChatCompletionRequest};

use crate::http::record::CHAT;
use crate::http::serve::Endpoint;
use crate::http::Ledger;
use crate::request::{ApiRequest, ReadyConversation};
use crate::server::AppState;
use choice::ChoiceText;

/// The chat completions endpoint.
pub struct Chat;

impl Endpoint for Chat {
    const NAME: &'static str = CHAT;
    type Input = ChatCompletionRequest;

    fn new_id() -> String {
        iris_openai::new_completion_id()
    }

    fn span(id: &str) -> tracing::Span {
        tracing::info_span!("chat", request_id = %id)
    }

    async fn convert(
        state: &AppState,
        body: &[u8],
    ) -> Result<ApiRequest<ChatCompletionRequest>, ApiError> {
        Ok(ApiRequest::new(iris_openai::parse_chat_request_with(
            body,
            &state.parse_options,
        )?))
    }

    async fn unary(state: Arc<AppState>, ledger: Ledger, ready: ReadyConversation) -> Response {
        complete::respond(state, ledger, ready).await
    }

    async fn stream(state: Arc<AppState>, ledger: Ledger, ready: ReadyConversation) -> Response {
        stream::respond(state, ledger, ready).await
    }
}

/// The text state of each choice of `ready`, in index order.
fn choices(ready: &ReadyConversation) -> Vec<ChoiceText> {
    (0..ready.n)
        .map(|_| {
            let tables = ready.served.prompter.detok().clone();
            ChoiceText::new(tables, ready.stop.clone(), ready.logprobs)
                .keeping(ready.output.kept_tokens())
        })
        .collect()
}
