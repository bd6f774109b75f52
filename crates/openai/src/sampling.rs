//! The generation settings of a validated request, in the form the gateway
//! hands to a worker.

use crate::{ChatCompletionRequest, Constraint};

/// Sampling and length settings. `None` means "use the worker's default".
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sampling {
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_new_tokens: Option<u32>,
    /// `min_tokens` (extension), 0 when absent.
    pub min_new_tokens: u32,
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// `top_k`; `-1` (disabled) is reported as `None`.
    pub top_k: Option<u32>,
    /// `min_p`.
    pub min_p: Option<f32>,
    /// `presence_penalty`.
    pub presence_penalty: Option<f32>,
    /// `frequency_penalty`.
    pub frequency_penalty: Option<f32>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f32>,
    /// `seed`.
    pub seed: Option<u64>,
    /// Stop strings, in request order (empty when none).
    pub stop: Vec<String>,
    /// `ignore_eos` (extension).
    pub ignore_eos: bool,
    /// At most one decoding constraint (see [`Constraint`]).
    pub constraint: Option<Constraint>,
    /// `n`: choices to generate, at least 1.
    pub n: u32,
    /// `logit_bias` as (token id, bias), in token id order.
    pub logit_bias: Vec<(u32, f32)>,
    /// `stop_token_ids` (extension), in request order.
    pub stop_token_ids: Vec<u32>,
    /// `Some(top_logprobs)` when `logprobs` is true, else `None`.
    pub logprobs: Option<u32>,
}

impl ChatCompletionRequest {
    /// The sampling settings. Meant for a request that passed
    /// [`crate::parse_chat_request`]; values are copied as they are.
    pub fn sampling(&self) -> Sampling {
        Sampling {
            max_new_tokens: self.max_completion_tokens.or(self.max_tokens),
            min_new_tokens: self.min_tokens.unwrap_or(0),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self
                .top_k
                .and_then(|k| u32::try_from(k).ok())
                .filter(|&k| k >= 1),
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
            stop: self
                .stop
                .as_ref()
                .map(|s| s.as_slice().to_vec())
                .unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            constraint: self.constraint.clone(),
            n: self
                .n
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(1)
                .max(1),
            logit_bias: crate::validate::logit_bias_ids(self.logit_bias.as_ref()),
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            logprobs: (self.logprobs == Some(true)).then(|| self.top_logprobs.unwrap_or(0)),
        }
    }

    /// True when the answer is to be streamed.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// True when a streamed answer should end with a usage chunk
    /// (`stream: true` and `stream_options.include_usage: true`).
    /// Non-streamed answers always carry usage.
    pub fn include_usage(&self) -> bool {
        self.is_stream()
            && self
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false)
    }
}
