//! OpenAI's Responses API: `POST /v1/responses` (one JSON Response object,
//! or its events as SSE), and the stored responses: `GET` and `DELETE
//! /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`.
//!
//! A request is converted into a chat request ([`request`]: input items
//! and `instructions` become messages, `text.format` the response format,
//! `previous_response_id` the stored conversation before them), made
//! ready and started on the conversation path like a chat request; the
//! answer's text, shaped into reasoning, text and tool calls by the same
//! parsers, becomes output items ([`object`]) in one body ([`unary`]) or
//! as events ([`stream`]). A response with `store` (the default) is kept
//! ([`store`]) with its input items. docs/openai.md, "Responses", lists
//! every field and event.

mod object;
mod request;
pub mod store;
mod stream;
mod unary;

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use iris_openai::{ApiError, ChatCompletionRequest};
use serde_json::{json, Value};

use crate::http::serve::Endpoint;
use crate::http::{error_response, Failure, Ledger};
use crate::request::{ApiRequest, Input, ReadyConversation};
use crate::served::Served;
use crate::server::AppState;
use request::Context;
use store::Stored;

/// The endpoint's name in log lines and metrics.
pub const RESPONSES: &str = "responses";

/// `POST /v1/responses`.
pub struct Responses;

/// A Responses request: the chat request it converts to, and what its
/// answer needs besides.
pub struct ResponsesInput {
    chat: ChatCompletionRequest,
    context: Context,
}

/// A Responses request made ready.
pub struct ReadyResponse {
    conversation: ReadyConversation,
    context: Context,
}

crate::request::envelope_of!(ResponsesInput, chat);

impl Input for ResponsesInput {
    type Ready = ReadyResponse;

    async fn prepare(
        self,
        served: Arc<Served>,
        ledger: &mut Ledger,
    ) -> Result<ReadyResponse, Failure> {
        let conversation = self.chat.prepare(served, ledger).await?;
        Ok(ReadyResponse {
            conversation,
            context: self.context,
        })
    }
}

impl Endpoint for Responses {
    const NAME: &'static str = RESPONSES;
    type Input = ResponsesInput;

    fn new_id() -> String {
        new_item_id("resp")
    }

    fn span(id: &str) -> tracing::Span {
        tracing::info_span!("responses", request_id = %id)
    }

    async fn convert(
        state: &AppState,
        body: &[u8],
    ) -> Result<ApiRequest<ResponsesInput>, ApiError> {
        let (chat, context) =
            request::convert(body, &state.parse_options, state.responses.as_ref()).await?;
        Ok(ApiRequest::new(ResponsesInput { chat, context }))
    }

    async fn unary(state: Arc<AppState>, ledger: Ledger, ready: ReadyResponse) -> Response {
        unary::respond(state, ledger, ready).await
    }

    async fn stream(state: Arc<AppState>, ledger: Ledger, ready: ReadyResponse) -> Response {
        stream::respond(state, ledger, ready).await
    }
}

/// A new id: `prefix_` and 48 hex digits (OpenAI's ids have this shape).
pub fn new_item_id(prefix: &str) -> String {
    let mut id = String::with_capacity(prefix.len() + 49);
    id.push_str(prefix);
    id.push('_');
    for _ in 0..3 {
        id.push_str(&format!("{:016x}", fastrand::u64(..)));
    }
    id
}

/// The current Unix time in seconds.
fn now() -> u64 {
    iris_openai::unix_now()
}

/// Keeps `response` (with the request's input items) when it is to be
/// stored. A response the store refuses (too large, a failing store) is
/// still answered; the failure is logged.
async fn save(state: &AppState, id: &str, context: &Context, response: &Value) {
    if !context.store {
        return;
    }
    let stored = Stored {
        response: response.clone(),
        input: context.input.clone(),
    };
    if let Err(error) = state.responses.put(id, &stored).await {
        tracing::warn!(response_id = id, %error, "response not stored");
    }
}

fn json_response(value: &Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(value).unwrap_or_default(),
    )
        .into_response()
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("Response with id '{id}' not found.")).with_param("response_id")
}

async fn stored(state: &AppState, id: &str) -> Result<Stored, ApiError> {
    match state.responses.get(id).await {
        Ok(Some(stored)) => Ok(stored),
        Ok(None) => Err(not_found(id)),
        Err(error) => Err(ApiError::internal(error.to_string())),
    }
}

/// `GET /v1/responses/{id}`. Streaming a stored response again
/// (`?stream=true`) is refused.
pub async fn retrieve(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    for pair in query.as_deref().unwrap_or("").split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "" => {}
            "stream" if value == "false" => {}
            "include[]" | "include" | "starting_after" | "include_obfuscation" | "stream" => {
                return error_response(&ApiError::bad_field(
                    key,
                    format!("{key}: not supported when retrieving a stored response"),
                ))
            }
            _ => {
                return error_response(&ApiError::bad_field(
                    key,
                    format!("{key}: unknown query parameter"),
                ))
            }
        }
    }
    match stored(&state, &id).await {
        Ok(stored) => json_response(&stored.response),
        Err(error) => error_response(&error),
    }
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.responses.delete(&id).await {
        Ok(true) => json_response(&json!({"id": id, "object": "response", "deleted": true})),
        Ok(false) => error_response(&not_found(&id)),
        Err(error) => error_response(&ApiError::internal(error.to_string())),
    }
}

/// The query of `input_items`.
#[derive(Debug, Default)]
struct ItemsQuery {
    limit: Option<usize>,
    order: Option<String>,
    after: Option<String>,
    before: Option<String>,
}

impl ItemsQuery {
    /// Reads `limit`, `order`, `after` and `before`; any other parameter
    /// is a 400 naming it.
    fn parse(query: Option<&str>) -> Result<ItemsQuery, ApiError> {
        let mut read = ItemsQuery::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "limit" => {
                    read.limit = Some(value.parse().map_err(|_| {
                        ApiError::bad_field("limit", "limit: must be between 1 and 100")
                    })?)
                }
                "order" => read.order = Some(value.to_owned()),
                "after" => read.after = Some(value.to_owned()),
                "before" => read.before = Some(value.to_owned()),
                "include" | "include[]" => {
                    return Err(ApiError::bad_field(
                        key,
                        format!("{key}: extra item data is not supported"),
                    ))
                }
                _ => {
                    return Err(ApiError::bad_field(
                        key,
                        format!("{key}: unknown query parameter"),
                    ))
                }
            }
        }
        Ok(read)
    }
}

/// `GET /v1/responses/{id}/input_items`: a page of the request's input
/// items (`limit` 1..=100, default 20; `order` `desc` (default) or `asc`;
/// `after` / `before` an item id).
pub async fn input_items(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = match ItemsQuery::parse(query.as_deref()) {
        Ok(query) => query,
        Err(error) => return error_response(&error),
    };
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return error_response(&ApiError::bad_field(
            "limit",
            "limit: must be between 1 and 100",
        ));
    }
    let mut items = match stored(&state, &id).await {
        Ok(stored) => stored.input,
        Err(error) => return error_response(&error),
    };
    match query.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(other) => {
            return error_response(&ApiError::bad_field(
                "order",
                format!("order: `{other}` is neither `asc` nor `desc`"),
            ))
        }
    }
    let position = |cursor: &str| items.iter().position(|i| i["id"] == cursor);
    let start = match query.after.as_deref() {
        Some(after) => match position(after) {
            Some(i) => i + 1,
            None => {
                return error_response(&ApiError::bad_field(
                    "after",
                    format!("after: no input item `{after}`"),
                ))
            }
        },
        None => 0,
    };
    let end = match query.before.as_deref() {
        Some(before) => match position(before) {
            Some(i) => i,
            None => {
                return error_response(&ApiError::bad_field(
                    "before",
                    format!("before: no input item `{before}`"),
                ))
            }
        },
        None => items.len(),
    };
    let window = items.get(start..end.max(start)).unwrap_or(&[]);
    let page: Vec<Value> = window.iter().take(limit).cloned().collect();
    let body = json!({
        "object": "list",
        "data": page,
        "first_id": page.first().map(|i| i["id"].clone()),
        "last_id": page.last().map(|i| i["id"].clone()),
        "has_more": window.len() > page.len(),
    });
    let mut response = json_response(&body);
    *response.status_mut() = StatusCode::OK;
    response
}
