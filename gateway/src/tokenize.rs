//! `POST /v1/tokenize` and `POST /v1/detokenize` (the vLLM / SGLang
//! shapes, [`iris_openai::TokenizeRequest`]): the served model's own
//! tokenizer and chat template, without any worker. Inputs larger than
//! [`INLINE_PROMPT_BYTES`] are tokenized on the blocking pool.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use iris_openai::{ApiError, DetokenizeResponse, TokenizeInput, TokenizeResponse};

use crate::chat::errors::error_response;
use crate::chat::{read_body, INLINE_PROMPT_BYTES};
use crate::completions::check_ids;
use crate::server::AppState;

pub async fn tokenize(State(state): State<Arc<AppState>>, request: Request) -> Response {
    answer(tokenize_body(state, request).await)
}

pub async fn detokenize(State(state): State<Arc<AppState>>, request: Request) -> Response {
    answer(detokenize_body(state, request).await)
}

/// A JSON body, or the error.
fn answer(result: Result<Vec<u8>, ApiError>) -> Response {
    match result {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => error_response(&error),
    }
}

async fn tokenize_body(state: Arc<AppState>, request: Request) -> Result<Vec<u8>, ApiError> {
    let bytes = read_body(&state, request.into_body()).await?;
    let request = iris_openai::parse_tokenize_request(&bytes)?;
    check_model(&state, request.model.as_deref())?;
    let input = request.input();
    let ids = if bytes.len() <= INLINE_PROMPT_BYTES {
        tokenize_input(&state, &input)?
    } else {
        let state = state.clone();
        tokio::task::spawn_blocking(move || tokenize_input(&state, &input))
            .await
            .map_err(|e| ApiError::internal(format!("tokenization task failed: {e}")))??
    };
    let tokenizer = state.prompter.tokenizer();
    let token_strs = request.return_token_strs.unwrap_or(false).then(|| {
        ids.iter()
            .map(|&id| tokenizer.id_to_token(id).unwrap_or_default())
            .collect()
    });
    let response = TokenizeResponse {
        count: ids.len(),
        max_model_len: state.prompter.limits().context_length,
        tokens: ids,
        token_strs,
    };
    serde_json::to_vec(&response).map_err(|e| ApiError::internal(e.to_string()))
}

/// The token ids of `input`.
fn tokenize_input(state: &AppState, input: &TokenizeInput) -> Result<Vec<u32>, ApiError> {
    match input {
        TokenizeInput::Prompt {
            text,
            add_special_tokens,
        } => state
            .prompter
            .tokenizer()
            .encode(text.as_str(), *add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| ApiError::internal(format!("tokenization failed: {e}"))),
        TokenizeInput::Messages {
            messages,
            add_generation_prompt,
        } => state
            .prompter
            .conversation_ids(messages, *add_generation_prompt),
    }
}

async fn detokenize_body(state: Arc<AppState>, request: Request) -> Result<Vec<u8>, ApiError> {
    let bytes = read_body(&state, request.into_body()).await?;
    let request = iris_openai::parse_detokenize_request(&bytes)?;
    check_model(&state, request.model.as_deref())?;
    let tokenizer = state.prompter.tokenizer().clone();
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

/// A `model` given must be the served one.
fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(name) if !state.serves(name) => Err(ApiError::model_not_found(name)),
        _ => Ok(()),
    }
}
