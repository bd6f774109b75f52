//! The `POST /v1/completions` request body (the legacy text completions
//! API) and its checks.
//!
//! `prompt` is a string, an array of token ids, or a batch: an array of
//! strings or an array of token-id arrays. Each batch element is answered
//! by its own `n` choices, indexed across the batch (`prompt * n + i`).
//! Every field not listed in [`CompletionRequest`] is a 400 naming it.
//! Text only: there is no way to send an image through this API.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::validate::{check_logit_bias_map, check_stops, in_range, range_error};
use crate::{ApiError, Sampling, Stop, StreamOptions};

/// `max_tokens` when the request gives none (OpenAI's default for
/// completions).
pub const DEFAULT_MAX_TOKENS: u32 = 16;
/// Most top log probabilities per token (`logprobs`) the API allows.
pub const MAX_LOGPROBS: u32 = 5;
/// Most choices per prompt (`n`).
pub const MAX_N: u32 = 16;
/// Most prompts in one batch.
pub const MAX_BATCH: usize = 64;

/// A text completion request as sent by the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    /// The model to use.
    pub model: String,
    /// The prompt(s).
    pub prompt: Prompt,
    /// Text after the completion (insertion); refused when not empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    /// Most tokens to generate per choice; [`DEFAULT_MAX_TOKENS`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature, `0..=2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass, `0 < top_p <= 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Choices per prompt, `1..=MAX_N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Stream the answer as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Streaming options (`include_usage`); only with `stream`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Stop strings: one string or a list of at most 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Put the prompt's text before each choice's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// Log probabilities of the generated tokens and of the
    /// `logprobs` most likely tokens at each step, `0..=5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Presence penalty, `-2..=2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty, `-2..=2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Token id (as a decimal string) to a bias in `-100..=100`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Candidates per prompt to pick the best `n` from; only `n` itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_of: Option<u32>,
    /// End-user id (not used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Extension: top-k sampling, `-1` (off) or at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Extension: min-p sampling, `0..=1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Extension: repetition penalty (multiplicative), `> 0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Extension: fewest tokens to generate before a stop may end a choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// Extension: keep generating past end-of-sequence tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// Extension: token ids that end a choice like end-of-sequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
}

/// `prompt`: one prompt or a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Prompt {
    /// `"prompt": "text"`.
    Text(String),
    /// `"prompt": [1, 2, 3]`.
    Tokens(Vec<u32>),
    /// `"prompt": ["a", "b"]`.
    Texts(Vec<String>),
    /// `"prompt": [[1, 2], [3]]`.
    TokenLists(Vec<Vec<u32>>),
}

/// One prompt of a request, text or token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    /// Text, to be tokenized.
    Text(String),
    /// Token ids, sent as they are.
    Tokens(Vec<u32>),
}

impl Prompt {
    /// The prompts, in batch order.
    pub fn inputs(&self) -> Vec<PromptInput> {
        match self {
            Self::Text(t) => vec![PromptInput::Text(t.clone())],
            Self::Tokens(ids) => vec![PromptInput::Tokens(ids.clone())],
            Self::Texts(texts) => texts.iter().cloned().map(PromptInput::Text).collect(),
            Self::TokenLists(lists) => lists.iter().cloned().map(PromptInput::Tokens).collect(),
        }
    }

    /// How many prompts the batch holds.
    pub fn len(&self) -> usize {
        match self {
            Self::Text(_) | Self::Tokens(_) => 1,
            Self::Texts(t) => t.len(),
            Self::TokenLists(l) => l.len(),
        }
    }

    /// True for an array of prompts (even of one).
    pub fn is_batch(&self) -> bool {
        matches!(self, Self::Texts(_) | Self::TokenLists(_))
    }

    /// True for an empty batch (`[]`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The UTF-8 bytes of text prompts (token-id prompts count 0).
    pub fn text_bytes(&self) -> usize {
        match self {
            Self::Text(t) => t.len(),
            Self::Texts(t) => t.iter().map(String::len).sum(),
            Self::Tokens(_) | Self::TokenLists(_) => 0,
        }
    }
}

/// One element of a `prompt` array, before the array's kind is known.
enum Element {
    Text(String),
    Id(u32),
    Ids(Vec<u32>),
}

impl<'de> Deserialize<'de> for Element {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ElementVisitor;
        impl<'de> Visitor<'de> for ElementVisitor {
            type Value = Element;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, a token id or an array of token ids")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Element, E> {
                Ok(Element::Text(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Element, E> {
                Ok(Element::Text(s))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Element, E> {
                token_id(v).map(Element::Id)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Element, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("token id {v} is negative")))
                    .and_then(token_id)
                    .map(Element::Id)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Element, A::Error> {
                let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(id) = seq.next_element::<u32>()? {
                    ids.push(id);
                }
                Ok(Element::Ids(ids))
            }
        }
        d.deserialize_any(ElementVisitor)
    }
}

/// A token id from a JSON integer.
fn token_id<E: de::Error>(v: u64) -> Result<u32, E> {
    u32::try_from(v).map_err(|_| E::custom(format!("token id {v} is too large")))
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PromptVisitor;
        impl<'de> Visitor<'de> for PromptVisitor {
            type Value = Prompt;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a string, an array of token ids, an array of strings or an array of token-id arrays",
                )
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Prompt, E> {
                Ok(Prompt::Text(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Prompt, E> {
                Ok(Prompt::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
                let mut prompt: Option<Prompt> = None;
                while let Some(element) = seq.next_element::<Element>()? {
                    prompt = Some(append(prompt, element).map_err(de::Error::custom)?);
                }
                Ok(prompt.unwrap_or(Prompt::Texts(Vec::new())))
            }
        }
        d.deserialize_any(PromptVisitor)
    }
}

/// Adds `element` to the array read so far; its first element decides
/// the array's kind and every other must be of that kind.
fn append(prompt: Option<Prompt>, element: Element) -> Result<Prompt, &'static str> {
    Ok(match (prompt, element) {
        (None, Element::Text(t)) => Prompt::Texts(vec![t]),
        (None, Element::Id(id)) => Prompt::Tokens(vec![id]),
        (None, Element::Ids(ids)) => Prompt::TokenLists(vec![ids]),
        (Some(Prompt::Texts(mut v)), Element::Text(t)) => {
            v.push(t);
            Prompt::Texts(v)
        }
        (Some(Prompt::Tokens(mut v)), Element::Id(id)) => {
            v.push(id);
            Prompt::Tokens(v)
        }
        (Some(Prompt::TokenLists(mut v)), Element::Ids(ids)) => {
            v.push(ids);
            Prompt::TokenLists(v)
        }
        _ => {
            return Err(
                "the array mixes kinds: use all strings, all token ids or all token-id arrays",
            )
        }
    })
}

impl CompletionRequest {
    /// The sampling settings (`max_tokens` defaults to 16).
    pub fn sampling(&self) -> Sampling {
        Sampling {
            max_new_tokens: Some(self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
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
            n: self.n(),
            logit_bias: self.logit_bias(),
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            logprobs: self.logprobs,
            constraint: None,
        }
    }

    /// Choices per prompt.
    pub fn n(&self) -> u32 {
        self.n.unwrap_or(1)
    }

    /// True when the answer is to be streamed.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// True when a stream ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.is_stream()
            && self
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false)
    }

    /// True when each choice starts with its prompt's text.
    pub fn echo(&self) -> bool {
        self.echo.unwrap_or(false)
    }

    /// The `logit_bias` entries as (token id, bias), sorted by id; valid
    /// after [`parse_completion_request`].
    pub fn logit_bias(&self) -> Vec<(u32, f32)> {
        crate::validate::logit_bias_ids(self.logit_bias.as_ref())
    }
}

/// Parses and validates a completion request body.
pub fn parse_completion_request(body: &[u8]) -> Result<CompletionRequest, ApiError> {
    let request: CompletionRequest = crate::parse::deserialize(body)?;
    validate(&request)?;
    Ok(request)
}

/// Every check, in field order.
fn validate(req: &CompletionRequest) -> Result<(), ApiError> {
    if req.model.is_empty() {
        return Err(ApiError::bad_field("model", "model: must not be empty"));
    }
    check_prompt(&req.prompt)?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_field(
            "suffix",
            "suffix: not supported (insertion needs a fill-in-the-middle model)",
        ));
    }
    check_counts(req)?;
    check_sampling(req)?;
    check_stops(req.stop.as_ref(), req.stop_token_ids.as_deref())?;
    if req.stream_options.is_some() && !req.is_stream() {
        return Err(ApiError::bad_field(
            "stream_options",
            "stream_options: only allowed when stream is true",
        ));
    }
    if req.logprobs.is_some() && req.echo() {
        return Err(ApiError::bad_field(
            "echo",
            "echo: not supported together with logprobs (the workers return no log probabilities for prompt tokens)",
        ));
    }
    check_logit_bias_map(req.logit_bias.as_ref())
}

/// `prompt`: at least one prompt, none empty, at most [`MAX_BATCH`].
fn check_prompt(prompt: &Prompt) -> Result<(), ApiError> {
    let empty = |param: String| {
        Err(ApiError::bad_field(
            param.clone(),
            format!("{param}: must not be empty"),
        ))
    };
    if prompt.is_empty() {
        return empty("prompt".into());
    }
    if prompt.len() > MAX_BATCH {
        return Err(ApiError::bad_field(
            "prompt",
            format!(
                "prompt: at most {MAX_BATCH} prompts per request, got {}",
                prompt.len()
            ),
        ));
    }
    let first_empty = match prompt {
        Prompt::Text(t) if t.is_empty() => Some("prompt".to_owned()),
        Prompt::Tokens(ids) if ids.is_empty() => Some("prompt".to_owned()),
        Prompt::Texts(texts) => texts
            .iter()
            .position(String::is_empty)
            .map(|i| format!("prompt[{i}]")),
        Prompt::TokenLists(lists) => lists
            .iter()
            .position(Vec::is_empty)
            .map(|i| format!("prompt[{i}]")),
        _ => None,
    };
    match first_empty {
        Some(param) => empty(param),
        None => Ok(()),
    }
}

/// `max_tokens`, `min_tokens`, `n`, `best_of`, `logprobs`.
fn check_counts(req: &CompletionRequest) -> Result<(), ApiError> {
    if req.max_tokens == Some(0) {
        return Err(ApiError::bad_field(
            "max_tokens",
            "max_tokens: must be at least 1",
        ));
    }
    let max = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    if let Some(min) = req.min_tokens.filter(|&min| min > max) {
        return Err(ApiError::bad_field(
            "min_tokens",
            format!("min_tokens: {min} is greater than the maximum of {max} tokens"),
        ));
    }
    let n = req.n();
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::bad_field(
            "n",
            format!("n: must be between 1 and {MAX_N}, got {n}"),
        ));
    }
    if req.best_of.is_some_and(|b| b != n) {
        return Err(ApiError::bad_field(
            "best_of",
            "best_of: not supported other than equal to n (every candidate is returned)",
        ));
    }
    match req.logprobs {
        Some(k) if k > MAX_LOGPROBS => Err(ApiError::bad_field(
            "logprobs",
            format!("logprobs: must be between 0 and {MAX_LOGPROBS}, got {k}"),
        )),
        _ => Ok(()),
    }
}

/// Numeric sampling parameters, with the chat request's bounds.
fn check_sampling(req: &CompletionRequest) -> Result<(), ApiError> {
    in_range("temperature", req.temperature, 0.0, 2.0, "between 0 and 2")?;
    in_range("min_p", req.min_p, 0.0, 1.0, "between 0 and 1")?;
    let penalty = "between -2 and 2";
    in_range("presence_penalty", req.presence_penalty, -2.0, 2.0, penalty)?;
    in_range(
        "frequency_penalty",
        req.frequency_penalty,
        -2.0,
        2.0,
        penalty,
    )?;
    if let Some(p) = req.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
        return Err(range_error("top_p", p, "greater than 0 and at most 1"));
    }
    if let Some(p) = req
        .repetition_penalty
        .filter(|p| !(*p > 0.0 && p.is_finite()))
    {
        return Err(range_error("repetition_penalty", p, "greater than 0"));
    }
    match req.top_k {
        Some(k) if k != -1 && !(1..=i64::from(u32::MAX)).contains(&k) => Err(ApiError::bad_field(
            "top_k",
            format!("top_k: must be -1 (disabled) or at least 1, got {k}"),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: serde_json::Value) -> Result<CompletionRequest, ApiError> {
        parse_completion_request(body.to_string().as_bytes())
    }

    #[test]
    fn prompts_of_every_shape() {
        let cases = [
            (serde_json::json!("hi"), Prompt::Text("hi".into())),
            (serde_json::json!([1, 2]), Prompt::Tokens(vec![1, 2])),
            (
                serde_json::json!(["a", "b"]),
                Prompt::Texts(vec!["a".into(), "b".into()]),
            ),
            (
                serde_json::json!([[1], [2, 3]]),
                Prompt::TokenLists(vec![vec![1], vec![2, 3]]),
            ),
        ];
        for (prompt, want) in cases {
            let r = parse(serde_json::json!({"model": "m", "prompt": prompt})).expect("valid");
            assert_eq!(r.prompt, want);
        }
        let batch = parse(serde_json::json!({"model": "m", "prompt": ["a", "b"]})).expect("ok");
        assert_eq!(
            batch.prompt.inputs(),
            vec![PromptInput::Text("a".into()), PromptInput::Text("b".into())]
        );
        assert!(batch.prompt.is_batch());
    }

    #[test]
    fn defaults_and_sampling() {
        let r = parse(serde_json::json!({"model": "m", "prompt": "x"})).expect("ok");
        assert_eq!(r.sampling().max_new_tokens, Some(DEFAULT_MAX_TOKENS));
        assert_eq!(r.n(), 1);
        assert!(!r.echo() && !r.is_stream() && !r.include_usage());
        let r = parse(serde_json::json!({
            "model": "m", "prompt": "x", "max_tokens": 5, "temperature": 0.5,
            "top_k": -1, "stop": "\n", "seed": 3, "logit_bias": {"7": -100},
            "stream": true, "stream_options": {"include_usage": true},
            "best_of": 2, "n": 2, "user": "u", "suffix": "",
        }))
        .expect("ok");
        let s = r.sampling();
        assert_eq!(s.max_new_tokens, Some(5));
        assert_eq!(s.temperature, Some(0.5));
        assert_eq!(s.top_k, None);
        assert_eq!(s.stop, vec!["\n".to_owned()]);
        assert_eq!(s.seed, Some(3));
        assert_eq!(r.logit_bias(), vec![(7, -100.0)]);
        assert!(r.include_usage());
    }

    #[test]
    fn refusals_name_their_field() {
        let cases = [
            (serde_json::json!({"prompt": "x"}), "model"),
            (serde_json::json!({"model": "m"}), "prompt"),
            (
                serde_json::json!({"model": "m", "prompt": "x", "other": 1}),
                "other",
            ),
            (
                serde_json::json!({"model": "m", "prompt": [1, "a"]}),
                "prompt",
            ),
            (
                serde_json::json!({"model": "m", "prompt": [-1]}),
                "prompt[0]",
            ),
            (
                serde_json::json!({"model": "m", "prompt": [[]]}),
                "prompt[0]",
            ),
            (serde_json::json!({"model": "m", "prompt": ""}), "prompt"),
            (
                serde_json::json!({"model": "m", "prompt": "x", "suffix": "y"}),
                "suffix",
            ),
            (
                serde_json::json!({"model": "m", "prompt": "x", "best_of": 3}),
                "best_of",
            ),
            (
                serde_json::json!({"model": "m", "prompt": "x", "logprobs": 6}),
                "logprobs",
            ),
            (
                serde_json::json!({"model": "m", "prompt": "x", "n": 0}),
                "n",
            ),
            (
                serde_json::json!({"model": "m", "prompt": "x", "top_p": 0}),
                "top_p",
            ),
            (
                serde_json::json!({"model": "m", "prompt": "x", "stop": [""]}),
                "stop",
            ),
            (
                serde_json::json!({"model": "m", "prompt": "x", "logit_bias": {"1": -101}}),
                "logit_bias",
            ),
            (
                serde_json::json!({"model": "m", "prompt": "x", "echo": true, "logprobs": 1}),
                "echo",
            ),
            (
                serde_json::json!({"model": "m", "prompt": "x", "stream_options": {}}),
                "stream_options",
            ),
        ];
        for (body, param) in cases {
            let err = parse(body.clone()).expect_err(&body.to_string());
            assert_eq!(err.status, 400, "{body}");
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err:?}");
        }
        let batch: Vec<String> = (0..=MAX_BATCH).map(|i| i.to_string()).collect();
        let err = parse(serde_json::json!({"model": "m", "prompt": batch})).expect_err("too many");
        assert_eq!(err.param.as_deref(), Some("prompt"));
    }
}
