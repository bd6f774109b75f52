//! `POST /v1/tokenize` and `POST /v1/detokenize` (the vLLM / SGLang
//! shapes, [`iris_openai::TokenizeRequest`]): the served model's own
//! tokenizer and chat template, without any worker. Inputs larger than
//! [`INLINE_PROMPT_BYTES`] are tokenized on the blocking pool.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use iris_openai::{ApiError, DetokenizeResponse, TokenizeInput, TokenizeResponse};

use crate::http::{error_response, read_body, INLINE_PROMPT_BYTES};
use crate::request::prompts::check_ids;
use crate::served::Served;
use crate::server::AppState;

pub async fn tokenize(State(state): State<Arc<AppState>>, request: Request) -> Response {
    answer(tokenize_body(state, request).await)
}

pub async fn detokenize(State(state): State<Arc<AppState>>, request: Request) -> Response {
    answer(detokenize_body(state, request).await)
}

/// The model named (the first without a name), if the caller's tenant
/// may use it (403 otherwise, [`crate::keys::check_model`]).
fn allowed(
    state: &AppState,
    extensions: &axum::http::Extensions,
    name: Option<&str>,
) -> Result<Arc<Served>, ApiError> {
    let found = state.models.named_or_first(name);
    let asked = name.unwrap_or_default();
    crate::keys::check_model(state, extensions, asked, found.as_ref().ok().map(|s| &**s))?;
    found
}

/// A JSON body, or the error.
fn answer(result: Result<Vec<u8>, ApiError>) -> Response {
    match result {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => error_response(&error),
    }
}

async fn tokenize_body(state: Arc<AppState>, request: Request) -> Result<Vec<u8>, ApiError> {
    let (parts, body) = request.into_parts();
    let bytes = read_body(&state, body).await?;
    let request = iris_openai::parse_tokenize_request(&bytes)?;
    let served = allowed(&state, &parts.extensions, request.model.as_deref())?;
    let input = request.input();
    let ids = if bytes.len() <= INLINE_PROMPT_BYTES {
        tokenize_input(&served, &input)?
    } else {
        let served = served.clone();
        tokio::task::spawn_blocking(move || tokenize_input(&served, &input))
            .await
            .map_err(|e| ApiError::internal(format!("tokenization task failed: {e}")))??
    };
    let tokenizer = served.prompter.tokenizer();
    let token_strs = request.return_token_strs.unwrap_or(false).then(|| {
        ids.iter()
            .map(|&id| tokenizer.id_to_token(id).unwrap_or_default())
            .collect()
    });
    let response = TokenizeResponse {
        count: ids.len(),
        max_model_len: served.prompter.limits().context_length,
        tokens: ids,
        token_strs,
    };
    serde_json::to_vec(&response).map_err(|e| ApiError::internal(e.to_string()))
}

/// The token ids of `input`.
fn tokenize_input(served: &Served, input: &TokenizeInput) -> Result<Vec<u32>, ApiError> {
    match input {
        TokenizeInput::Prompt {
            text,
            add_special_tokens,
        } => served
            .prompter
            .tokenizer()
            .encode(text.as_str(), *add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| ApiError::internal(format!("tokenization failed: {e}"))),
        TokenizeInput::Messages {
            messages,
            add_generation_prompt,
        } => served
            .prompter
            .conversation_ids(messages, *add_generation_prompt),
    }
}

async fn detokenize_body(state: Arc<AppState>, request: Request) -> Result<Vec<u8>, ApiError> {
    let (parts, body) = request.into_parts();
    let bytes = read_body(&state, body).await?;
    let request = iris_openai::parse_detokenize_request(&bytes)?;
    let served = allowed(&state, &parts.extensions, request.model.as_deref())?;
    let tokenizer = served.prompter.tokenizer().clone();
    check_ids(&tokenizer, &request.tokens, "tokens")?;
    let decode = move || {
        tokenizer
            .decode(&request.tokens, false)
            .map_err(|e| ApiError::bad_field("tokens", format!("tokens: cannot be decoded: {e}")))
    };
    let prompt = if bytes.len() <= INLINE_PROMPT_BYTES {
        decode()?
    } else {
        tokio::task::spawn_blocking(decode)
            .await
            .map_err(|e| ApiError::internal(format!("detokenization task failed: {e}")))??
    };
    serde_json::to_vec(&DetokenizeResponse { prompt })
        .map_err(|e| ApiError::internal(e.to_string()))
}
