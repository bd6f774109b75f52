//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's
//! Messages API. The body is parsed and converted to a chat request by
//! [`iris_openai::anthropic`] (the wire types and every field's rule live
//! there), so a Messages request is prepared exactly as a chat completion
//! is ([`crate::request::conversation`]: chat template, tools, images,
//! output plan); this module shapes the answer in the Messages API's form —
//! one `message` object ([`unary`]) or its event stream ([`stream`]) —
//! and every error in its error shape ([`errors`]). `count_tokens`
//! prepares the same conversation without starting it and answers its
//! prompt's token count, image tokens included.
//!
//! The `anthropic-version` and `x-api-key` headers are accepted and not
//! read (the gateway has no API keys). See docs/anthropic.md.

pub mod errors;
mod stream;
mod text;
mod unary;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use iris_openai::anthropic::{parse_messages, MessagesCall, Places};
use iris_openai::{ApiError, ChatCompletionRequest};
use serde_json::{json, Value};

use crate::http::record::MESSAGES;
use crate::http::serve::Endpoint;
use crate::http::{read_body, Failure, Ledger};
use crate::request::{ApiRequest, Envelope, Input, ReadyConversation};
use crate::served::Served;
use crate::server::AppState;
use text::{MessageText, StopReason};

/// The Messages endpoint.
pub struct Messages;

/// A Messages request as the conversation it converts to, with where
/// each of its parts came from: a refusal while it is made ready (an image
/// that cannot be fetched, a prompt too long for the context) names the
/// Messages field, not the chat request's.
pub struct MessagesInput {
    chat: ChatCompletionRequest,
    places: Places,
}

impl MessagesInput {
    fn parse(state: &AppState, body: &[u8], call: MessagesCall) -> Result<Self, ApiError> {
        let (chat, places) = parse_messages(body, call, &state.parse_options)?;
        Ok(MessagesInput { chat, places })
    }
}

crate::request::envelope_of!(MessagesInput, chat);

impl Input for MessagesInput {
    type Ready = ReadyConversation;

    async fn prepare(
        self,
        served: Arc<Served>,
        ledger: &mut Ledger,
    ) -> Result<ReadyConversation, Failure> {
        let places = self.places;
        let prepared = self.chat.prepare(served, ledger).await;
        prepared.map_err(|(error, outcome)| (places.rename(error), outcome))
    }
}

impl Endpoint for Messages {
    const NAME: &'static str = MESSAGES;
    type Input = MessagesInput;

    fn new_id() -> String {
        let mut id = String::with_capacity(28);
        id.push_str("msg_");
        id.extend(std::iter::repeat_with(fastrand::alphanumeric).take(24));
        id
    }

    fn span(id: &str) -> tracing::Span {
        tracing::info_span!("messages", request_id = %id)
    }

    async fn convert(state: &AppState, body: &[u8]) -> Result<ApiRequest<MessagesInput>, ApiError> {
        let input = MessagesInput::parse(state, body, MessagesCall::Create)?;
        Ok(ApiRequest::new(input))
    }

    async fn unary(state: Arc<AppState>, ledger: Ledger, ready: ReadyConversation) -> Response {
        unary::respond(state, ledger, ready).await
    }

    async fn stream(state: Arc<AppState>, ledger: Ledger, ready: ReadyConversation) -> Response {
        stream::respond(state, ledger, ready).await
    }

    fn error_response(error: &ApiError) -> Response {
        errors::error_response(error)
    }
}

/// The answer's text state: decoded, cut at the first stop sequence.
fn message_text(ready: &ReadyConversation) -> MessageText {
    let tables = ready.served.prompter.detok().clone();
    MessageText::new(tables, ready.stop.clone(), ready.output.kept_tokens())
}

/// The `usage` object: the prompt's tokens split into those the worker
/// served from its prefix cache (`cache_read_input_tokens`) and the rest
/// (`input_tokens`), as the Messages API counts them.
fn usage(prompt_tokens: u32, cached_tokens: u32, output_tokens: u32) -> Value {
    let cached = cached_tokens.min(prompt_tokens);
    json!({
        "input_tokens": prompt_tokens - cached,
        "cache_read_input_tokens": cached,
        "output_tokens": output_tokens,
    })
}

/// A `tool_use` content block (its `input` the call's arguments; `{}`
/// when they are not a JSON object, which the parsers never produce).
fn tool_use_block(call: &iris_parsers::ToolCall) -> Value {
    let input = serde_json::from_str::<Value>(&call.arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input})
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the tokens of
/// the prompt `POST /v1/messages` would send for the same request (chat
/// template, tools and image placeholders included). Images are fetched
/// and preprocessed as for a generation: their token count depends on
/// their size.
pub async fn count_tokens(State(state): State<Arc<AppState>>, request: Request) -> Response {
    match count(&state, request).await {
        Ok(tokens) => {
            let body = json!({ "input_tokens": tokens }).to_string();
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(error) => errors::error_response(&error),
    }
}

async fn count(state: &Arc<AppState>, request: Request) -> Result<u32, ApiError> {
    let (parts, body) = request.into_parts();
    let bytes = read_body(state, body).await?;
    let input = MessagesInput::parse(state, &bytes, MessagesCall::CountTokens)?;
    let found = state.models.get(input.model());
    let named = found.as_ref().ok().map(|s| &**s);
    crate::keys::check_model(state, &parts.extensions, input.model(), named)?;
    let served = found?;
    // Not a generating request: its stages are the gateway's, not the model's.
    let id = Messages::new_id();
    let mut ledger = Ledger::new(MESSAGES, id, Instant::now(), state.metrics.clone());
    ledger.body_bytes = bytes.len();
    drop(bytes);
    let ready = input
        .prepare(served, &mut ledger)
        .await
        .map_err(|(error, _)| error)?;
    drop(ready);
    Ok(ledger.prompt_tokens)
}
