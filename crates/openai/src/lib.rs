//! iris-openai: the OpenAI chat completions API surface of the Iris gateway.
//!
//! - [`parse_chat_request`] turns a `POST /v1/chat/completions` body into a
//!   validated [`ChatCompletionRequest`], or a 400 [`ApiError`] that names
//!   the field at fault; [`parse_chat_request_with`] takes the gateway's
//!   [`ParseOptions`]. [`structured`] reads `response_format` and the
//!   constraint extensions into one [`Constraint`].
//! - [`ChatCompletionRequest::sampling`] gives the generation settings as a
//!   [`Sampling`]; [`ChatCompletionRequest::include_usage`] tells whether a
//!   stream ends with a usage chunk.
//! - [`parse_completion_request`] does the same for `POST /v1/completions`
//!   ([`CompletionRequest`]); [`TextCompletion`] is its answer and stream
//!   chunk.
//! - [`parse_tokenize_request`] and [`parse_detokenize_request`] read the
//!   bodies of `POST /v1/tokenize` and `POST /v1/detokenize`.
//! - [`anthropic::parse_messages_request`] reads an Anthropic Messages API
//!   body (`POST /v1/messages`, `count_tokens`) into the same validated
//!   [`ChatCompletionRequest`].
//! - [`ApiError`] builds errors and their OpenAI-shaped body.
//! - [`ChatCompletion`], [`ChatCompletionChunk`], [`ModelList`] and
//!   [`Model`] are the response bodies; [`sse::ChunkWriter`] writes stream
//!   chunks straight into a buffer, once per token.

#![forbid(unsafe_code)]

pub mod anthropic;
mod completion;
mod constraint;
mod error;
pub mod fields;
mod json;
mod media;
mod parse;
mod request;
mod response;
mod sampling;
pub mod sse;
pub mod structured;
mod template;
mod text_completion;
mod tokenize;
pub mod tools;
pub mod validate;

pub use completion::{
    parse_completion_request, CompletionRequest, Prompt, PromptInput, DEFAULT_MAX_TOKENS,
    MAX_BATCH, MAX_LOGPROBS,
};
pub use constraint::Constraint;
pub use error::{ApiError, ErrorBody, ErrorKind, ErrorObject};
pub use media::MmProcessorKwargs;
pub use parse::{parse_chat_request, parse_chat_request_with, ParseOptions};
pub use request::{
    ChatCompletionRequest, ChatMessage, ContentPart, ImageDetail, ImageUrl, JsonSchemaFormat,
    MediaRef, MessageContent, ResponseFormat, Role, Stop, StreamOptions, VideoUrl,
};
pub use response::{
    new_completion_id, unix_now, AssistantMessage, ChatCompletion, ChatCompletionChunk, Choice,
    ChoiceLogprobs, ChunkChoice, Delta, DeltaFunction, DeltaToolCall, FinishReason, Model,
    ModelList, PromptTokensDetails, TokenLogprob, TopLogprob, Usage, VERY_UNLIKELY,
};
pub use sampling::Sampling;
pub use sse::{write_done, write_error_event, ChunkWriter, DONE};
pub use template::{
    content_as_parts, system_message_tools, template_messages, tools_fallback, FallbackSyntax,
};
pub use text_completion::{CompletionChoice, CompletionLogprobs, TextCompletion};
pub use tokenize::{
    parse_detokenize_request, parse_tokenize_request, DetokenizeRequest, DetokenizeResponse,
    TokenizeInput, TokenizeRequest, TokenizeResponse,
};
pub use tools::{CalledFunction, MessageToolCall, Tool, ToolChoice, ToolOutput};
