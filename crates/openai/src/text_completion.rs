//! Response bodies of `POST /v1/completions`: the `text_completion`
//! object, which is also the shape of every streamed chunk, and the
//! legacy log probabilities (`tokens`, `token_logprobs`, `top_logprobs`,
//! `text_offset`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{FinishReason, Usage};

/// A completion, or one chunk of a streamed one (`object: "text_completion"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextCompletion {
    /// `cmpl-…`, the same on every chunk of a stream.
    pub id: String,
    /// Always `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model that answered.
    pub model: String,
    /// The choices (none in a stream's usage chunk).
    pub choices: Vec<CompletionChoice>,
    /// Token counts: always in a whole answer, in a stream only in its
    /// last chunk and only when `stream_options.include_usage` asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl TextCompletion {
    /// A completion with `choices` and `usage`.
    pub fn new(
        id: &str,
        created: u64,
        model: &str,
        choices: Vec<CompletionChoice>,
        usage: Option<Usage>,
    ) -> Self {
        Self {
            id: id.to_owned(),
            object: "text_completion".to_owned(),
            created,
            model: model.to_owned(),
            choices,
            usage,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        // Strings, integers and finite floats: serialising cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// One choice: for prompt `p` of the batch and sequence `i` of its `n`,
/// `index` is `p * n + i`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Place across the batch.
    pub index: u32,
    /// Generated text (after the prompt's text with `echo`); in a stream,
    /// the new text.
    pub text: String,
    /// Present when `logprobs` was asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// Why the choice ended; `null` on chunks before its end.
    pub finish_reason: Option<FinishReason>,
}

/// The legacy log probabilities: one entry per generated token in each list.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log probability.
    pub token_logprobs: Vec<f32>,
    /// The most likely tokens at each step (text → log probability).
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Where each token's text starts in the choice's `text` (echoed
    /// prompt included), in characters.
    pub text_offset: Vec<u32>,
}

impl CompletionLogprobs {
    /// Number of tokens described.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when no token is described.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Keeps the first `len` tokens.
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        self.token_logprobs.truncate(len);
        self.top_logprobs.truncate(len);
        self.text_offset.truncate(len);
    }

    /// Moves every entry of `other` to the end.
    pub fn append(&mut self, other: &mut CompletionLogprobs) {
        self.tokens.append(&mut other.tokens);
        self.token_logprobs.append(&mut other.token_logprobs);
        self.top_logprobs.append(&mut other.top_logprobs);
        self.text_offset.append(&mut other.text_offset);
    }
}
