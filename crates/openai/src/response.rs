//! Response bodies: `chat.completion`, `chat.completion.chunk` and the
//! `/v1/models` list.
//!
//! The types serialise (and deserialise, for tests and clients) with serde.
//! Non-streamed answers go through [`ChatCompletion::to_json`]; streamed
//! chunks are written on the hot path by [`crate::sse::ChunkWriter`], which
//! produces the same JSON as [`ChatCompletionChunk`] without building one.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::tools::MessageToolCall;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// The token limit (or the context) was reached.
    Length,
    /// The output was filtered.
    ContentFilter,
    /// The model called a tool.
    ToolCalls,
}

impl FinishReason {
    /// The wire name, e.g. `stop`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ContentFilter => "content_filter",
            Self::ToolCalls => "tool_calls",
        }
    }

    /// `tool_calls` when the answer made tool calls and ended on its own
    /// (`stop`); a cut answer (`length`, `content_filter`) keeps its
    /// reason, so a client knows a call's arguments may be incomplete.
    pub fn with_calls(self, calls: bool) -> FinishReason {
        match self {
            Self::Stop if calls => Self::ToolCalls,
            other => other,
        }
    }
}

/// Token counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// The sum.
    pub total_tokens: u32,
    /// How the prompt was served: present when the workers reported
    /// prompt tokens served from their prefix cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens the worker served from its prefix cache.
    pub cached_tokens: u32,
}

impl Usage {
    /// Usage with `total_tokens` computed (saturating).
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            prompt_tokens_details: None,
        }
    }

    /// With `prompt_tokens_details.cached_tokens` when the workers
    /// reported any cached prompt tokens (none: left out, as before).
    pub fn with_cached_tokens(self, cached_tokens: u32) -> Self {
        Self {
            prompt_tokens_details: (cached_tokens > 0)
                .then_some(PromptTokensDetails { cached_tokens }),
            ..self
        }
    }
}

/// A non-streamed answer (`object: "chat.completion"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletion {
    /// `chatcmpl-…`.
    pub id: String,
    /// Always `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model that answered.
    pub model: String,
    /// One choice per `n`, indexed from 0.
    pub choices: Vec<Choice>,
    /// Token counts.
    pub usage: Usage,
}

impl ChatCompletion {
    /// A one-choice answer.
    pub fn new(
        id: impl Into<String>,
        created: u64,
        model: impl Into<String>,
        content: impl Into<String>,
        finish_reason: FinishReason,
        usage: Usage,
    ) -> Self {
        let choice = Choice::new(0, content, finish_reason, None);
        Self::with_choices(id, created, model, vec![choice], usage)
    }

    /// An answer with `choices` (in index order).
    pub fn with_choices(
        id: impl Into<String>,
        created: u64,
        model: impl Into<String>,
        choices: Vec<Choice>,
        usage: Usage,
    ) -> Self {
        Self {
            id: id.into(),
            object: "chat.completion".to_owned(),
            created,
            model: model.into(),
            choices,
            usage,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising plain structs of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// One choice of a [`ChatCompletion`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// Which of the `n` choices, from 0.
    pub index: u32,
    /// The answer.
    pub message: AssistantMessage,
    /// Why generation ended.
    pub finish_reason: Option<FinishReason>,
    /// The tokens' log probabilities when `logprobs` was asked, else `null`.
    pub logprobs: Option<ChoiceLogprobs>,
}

impl Choice {
    /// Choice `index` with its text, end and log probabilities.
    pub fn new(
        index: u32,
        content: impl Into<String>,
        finish_reason: FinishReason,
        logprobs: Option<ChoiceLogprobs>,
    ) -> Self {
        Self {
            index,
            message: AssistantMessage::new(content),
            finish_reason: Some(finish_reason),
            logprobs,
        }
    }
}

/// `choices[i].logprobs`: one entry per generated token.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ChoiceLogprobs {
    /// The content tokens, in order.
    pub content: Option<Vec<TokenLogprob>>,
    /// Refusal tokens: always `null` (no refusal is told apart from content).
    #[serde(default)]
    pub refusal: Option<Vec<TokenLogprob>>,
}

impl ChoiceLogprobs {
    /// Log probabilities of `tokens`.
    pub fn new(tokens: Vec<TokenLogprob>) -> Self {
        Self {
            content: Some(tokens),
            refusal: None,
        }
    }
}

/// One generated token and its most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// The UTF-8 bytes of `token`.
    pub bytes: Option<Vec<u8>>,
    /// Its log probability (`-9999.0` stands for "very unlikely").
    pub logprob: f32,
    /// The most likely tokens at this position, most likely first.
    pub top_logprobs: Vec<TopLogprob>,
}

/// An alternative in [`TokenLogprob::top_logprobs`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// The UTF-8 bytes of `token`.
    pub bytes: Option<Vec<u8>>,
    /// Its log probability.
    pub logprob: f32,
}

impl TopLogprob {
    /// An entry for a token whose text is `token`; a log probability that
    /// is not a finite number (JSON has none) becomes `-9999.0`.
    pub fn new(token: String, logprob: f32) -> Self {
        Self {
            bytes: Some(token.as_bytes().to_vec()),
            token,
            logprob: finite_logprob(logprob),
        }
    }
}

impl TokenLogprob {
    /// The entry for a generated token and its alternatives.
    pub fn new(top: TopLogprob, top_logprobs: Vec<TopLogprob>) -> Self {
        Self {
            token: top.token,
            bytes: top.bytes,
            logprob: top.logprob,
            top_logprobs,
        }
    }
}

/// OpenAI's stand-in for a log probability too small to report.
pub const VERY_UNLIKELY: f32 = -9999.0;

/// `logprob`, or [`VERY_UNLIKELY`] when it is not finite or below it.
fn finite_logprob(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob.max(VERY_UNLIKELY)
    } else {
        VERY_UNLIKELY
    }
}

/// The assistant's message in a [`Choice`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: String,
    /// The generated text; `null` when the answer is only tool calls.
    pub content: Option<String>,
    /// The reasoning, when a reasoning parser is active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tool calls the model made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<MessageToolCall>>,
}

impl AssistantMessage {
    /// An assistant message with `content`.
    pub fn new(content: impl Into<String>) -> Self {
        Self {
            role: "assistant".to_owned(),
            content: Some(content.into()),
            reasoning_content: None,
            tool_calls: None,
        }
    }
}

/// A streamed chunk (`object: "chat.completion.chunk"`). Written on the hot
/// path by [`crate::sse::ChunkWriter`]; this type reads chunks back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    /// Same id on every chunk of a stream.
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: String,
    /// Unix seconds, same on every chunk.
    pub created: u64,
    /// The model.
    pub model: String,
    /// One choice (its `index` says which), or none in the usage chunk.
    pub choices: Vec<ChunkChoice>,
    /// Present only in the usage chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The choice of a [`ChatCompletionChunk`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    /// Which of the `n` choices, from 0.
    pub index: u32,
    /// What is new.
    pub delta: Delta,
    /// The log probabilities of the tokens behind `delta` when asked.
    #[serde(default)]
    pub logprobs: Option<ChoiceLogprobs>,
    /// Set on the last chunk only.
    pub finish_reason: Option<FinishReason>,
}

/// The new part of the message in a chunk.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Delta {
    /// `assistant` on the first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// New text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool-call fragments: id, type and name in a call's first one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<DeltaToolCall>>,
}

/// A fragment of a streamed tool call.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeltaToolCall {
    /// Which call of the message (0, 1, ...).
    pub index: u32,
    /// The call's id (first fragment only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (first fragment only).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name (first fragment) and a piece of the arguments.
    pub function: DeltaFunction,
}

/// The function part of a [`DeltaToolCall`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeltaFunction {
    /// The function's name (first fragment only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next piece of the arguments' JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    /// The models.
    pub data: Vec<Model>,
}

impl ModelList {
    /// A list of `models`.
    pub fn new(data: Vec<Model>) -> Self {
        Self {
            object: "list".to_owned(),
            data,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// One entry of `/v1/models` (also `GET /v1/models/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model {
    /// The name clients put in `model`.
    pub id: String,
    /// Always `model`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// Who serves it.
    pub owned_by: String,
    /// Tokens the prompt and the completion share (vLLM's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u32>,
    /// Inputs it takes: `text`, `image`, `video`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modalities: Vec<String>,
    /// For an alias, the name of the model it stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// For a LoRA adapter, the base model it adapts (vLLM's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

impl Model {
    /// A model entry.
    pub fn new(id: impl Into<String>, created: u64, owned_by: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            object: "model".to_owned(),
            created,
            owned_by: owned_by.into(),
            max_model_len: None,
            modalities: Vec::new(),
            root: None,
            parent: None,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A fresh completion id: `chatcmpl-` and 24 random alphanumerics.
pub fn new_completion_id() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    let mut id = String::with_capacity(33);
    id.push_str("chatcmpl-");
    Alphanumeric.append_string(&mut rand::rng(), &mut id, 24);
    id
}

/// The current Unix time in seconds (0 if the clock is before 1970).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::FinishReason;

    #[test]
    fn tool_calls_replace_only_a_natural_stop() {
        assert_eq!(FinishReason::Stop.with_calls(true), FinishReason::ToolCalls);
        assert_eq!(FinishReason::Stop.with_calls(false), FinishReason::Stop);
        assert_eq!(FinishReason::Length.with_calls(true), FinishReason::Length);
        assert_eq!(
            FinishReason::ContentFilter.with_calls(true),
            FinishReason::ContentFilter
        );
    }
}
