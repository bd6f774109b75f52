//! Semantic checks on a deserialised [`ChatCompletionRequest`].
//!
//! Each check returns a 400 naming the field in `param` and in the message.
//! Unsupported OpenAI features are refused here (and by [`crate::fields`]
//! for fields without a declared type) rather than silently ignored.
//! Token ids (`logit_bias` keys, `stop_token_ids`) are checked against the
//! model's vocabulary by [`check_token_ids`], which the server calls with
//! the size it knows.
//! `response_format` and the constraint extensions are read by
//! [`crate::structured`].

use std::collections::BTreeMap;

use crate::request::{ContentPart, MediaRef, MessageContent, Role, Stop};
use crate::{ApiError, ChatCompletionRequest, ChatMessage};

/// Most stop strings a request may carry.
pub const MAX_STOP_STRINGS: usize = 16;
/// Most choices (`n`) a request may ask for.
pub const MAX_N: i64 = 16;
/// Most alternatives (`top_logprobs`) per token.
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// Most `logit_bias` entries.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Largest `logit_bias` magnitude.
pub const MAX_BIAS: f64 = 100.0;
/// Most `stop_token_ids`.
pub const MAX_STOP_TOKEN_IDS: usize = 64;

/// Runs every check, in field order.
pub fn validate(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    if req.model.is_empty() {
        return Err(ApiError::bad_field("model", "model: must not be empty"));
    }
    check_messages(&req.messages)?;
    check_lengths(req)?;
    check_sampling(req)?;
    check_stops(req.stop.as_ref(), req.stop_token_ids.as_deref())?;
    check_choices(req)?;
    check_logprobs(req)?;
    check_logit_bias(req)?;
    check_stream_options(req)?;
    crate::fields::check(req)?;
    crate::media::check(req)?;
    crate::tools::check_tools(req)
}

/// `messages`: non-empty, content present (except assistant), parts allowed.
pub(crate) fn check_messages(messages: &[ChatMessage]) -> Result<(), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_field(
            "messages",
            "messages: must contain at least one message",
        ));
    }
    for (i, msg) in messages.iter().enumerate() {
        check_message(i, msg)?;
    }
    Ok(())
}

/// Echoed assistant-message fields Iris cannot honour, with the reason.
const ECHOED: [(&str, &str); 4] = [
    ("refusal", "refusals are not carried back to the model"),
    ("audio", "audio is not supported"),
    ("annotations", "annotations are not supported"),
    (
        "function_call",
        "the deprecated `function_call` is not supported, send `tool_calls`",
    ),
];

/// The echoed fields of message `i`: only `null`.
fn check_echoed(i: usize, msg: &ChatMessage) -> Result<(), ApiError> {
    let values = [
        &msg.refusal,
        &msg.audio,
        &msg.annotations,
        &msg.function_call,
    ];
    for ((name, reason), value) in ECHOED.iter().zip(values) {
        if value.as_ref().is_some_and(|v| !v.is_null()) {
            let param = format!("messages[{i}].{name}");
            return Err(ApiError::bad_field(
                param.clone(),
                format!("{param}: {reason} (only null is accepted)"),
            ));
        }
    }
    Ok(())
}

/// One message.
fn check_message(i: usize, msg: &ChatMessage) -> Result<(), ApiError> {
    check_echoed(i, msg)?;
    let param = format!("messages[{i}].content");
    let Some(content) = &msg.content else {
        if msg.role == Role::Assistant {
            return Ok(());
        }
        let role = msg.role.as_str();
        return Err(ApiError::bad_field(
            param.clone(),
            format!("{param}: content is required for `{role}` messages"),
        ));
    };
    let MessageContent::Parts(parts) = content else {
        return Ok(());
    };
    if parts.is_empty() {
        return Err(ApiError::bad_field(
            param.clone(),
            format!("{param}: must not be an empty array"),
        ));
    }
    for (j, part) in parts.iter().enumerate() {
        check_part(msg.role, &format!("{param}[{j}]"), part)?;
    }
    Ok(())
}

/// One content part: images and videos only from the user, and with a URL.
fn check_part(role: Role, param: &str, part: &ContentPart) -> Result<(), ApiError> {
    let (kind, key, url) = match part.media() {
        None => return Ok(()),
        Some(MediaRef::Image(image)) => ("image", "image_url", &image.url),
        Some(MediaRef::Video(video)) => ("video", "video_url", &video.url),
    };
    if role != Role::User {
        let role = role.as_str();
        return Err(ApiError::bad_field(
            param,
            format!("{param}: {kind} parts are only allowed in `user` messages, not `{role}`"),
        ));
    }
    if url.is_empty() {
        let param = format!("{param}.{key}.url");
        return Err(ApiError::bad_field(
            param.clone(),
            format!("{param}: must not be empty"),
        ));
    }
    Ok(())
}

/// `max_tokens`, `max_completion_tokens`, `min_tokens`.
fn check_lengths(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    for (name, value) in [
        ("max_tokens", req.max_tokens),
        ("max_completion_tokens", req.max_completion_tokens),
    ] {
        if value == Some(0) {
            return Err(ApiError::bad_field(
                name,
                format!("{name}: must be at least 1"),
            ));
        }
    }
    let max = req.max_completion_tokens.or(req.max_tokens);
    if let (Some(min), Some(max)) = (req.min_tokens, max) {
        if min > max {
            return Err(ApiError::bad_field(
                "min_tokens",
                format!("min_tokens: {min} is greater than the maximum of {max} tokens"),
            ));
        }
    }
    Ok(())
}

/// Numeric sampling parameters.
fn check_sampling(req: &ChatCompletionRequest) -> Result<(), ApiError> {
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
    if let Some(p) = req.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(range_error("top_p", p, "greater than 0 and at most 1"));
        }
    }
    if let Some(p) = req.repetition_penalty {
        if !(p > 0.0 && p.is_finite()) {
            return Err(range_error("repetition_penalty", p, "greater than 0"));
        }
    }
    match req.top_k {
        Some(k) if k != -1 && !(1..=i64::from(u32::MAX)).contains(&k) => Err(ApiError::bad_field(
            "top_k",
            format!("top_k: must be -1 (disabled) or at least 1, got {k}"),
        )),
        _ => Ok(()),
    }
}

/// `lo <= value <= hi` when present.
pub(crate) fn in_range(
    name: &str,
    value: Option<f32>,
    lo: f32,
    hi: f32,
    wording: &str,
) -> Result<(), ApiError> {
    match value {
        Some(v) if !(lo..=hi).contains(&v) => Err(range_error(name, v, wording)),
        _ => Ok(()),
    }
}

/// A 400 for a number out of range.
pub(crate) fn range_error(name: &str, value: f32, wording: &str) -> ApiError {
    ApiError::bad_field(name, format!("{name}: must be {wording}, got {value}"))
}

/// `stop`: at most 16 non-empty strings; `stop_token_ids`: at most 64.
pub(crate) fn check_stops(
    stop: Option<&Stop>,
    stop_token_ids: Option<&[u32]>,
) -> Result<(), ApiError> {
    let stops = stop.map(Stop::as_slice).unwrap_or_default();
    if stops.len() > MAX_STOP_STRINGS {
        return Err(ApiError::bad_field(
            "stop",
            format!(
                "stop: at most {MAX_STOP_STRINGS} stop strings are allowed, got {}",
                stops.len()
            ),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::bad_field(
            "stop",
            "stop: stop strings must not be empty",
        ));
    }
    let ids = stop_token_ids.unwrap_or_default();
    if ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::bad_field(
            "stop_token_ids",
            format!(
                "stop_token_ids: at most {MAX_STOP_TOKEN_IDS} ids are allowed, got {}",
                ids.len()
            ),
        ));
    }
    Ok(())
}

/// `n`: `1..=MAX_N`.
fn check_choices(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    match req.n {
        Some(n) if !(1..=MAX_N).contains(&n) => Err(ApiError::bad_field(
            "n",
            format!("n: must be between 1 and {MAX_N}, got {n}"),
        )),
        _ => Ok(()),
    }
}

/// `top_logprobs`: at most `MAX_TOP_LOGPROBS`, and above 0 only with
/// `logprobs: true`.
fn check_logprobs(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    let Some(k) = req.top_logprobs else {
        return Ok(());
    };
    if k > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad_field(
            "top_logprobs",
            format!("top_logprobs: must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
        ));
    }
    if k > 0 && req.logprobs != Some(true) {
        return Err(ApiError::bad_field(
            "top_logprobs",
            "top_logprobs: needs `logprobs: true`",
        ));
    }
    Ok(())
}

/// `logit_bias`: keys are token ids (decimal), values in `-100..=100`.
fn check_logit_bias(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    check_logit_bias_map(req.logit_bias.as_ref())
}

/// `logit_bias` of any endpoint: at most [`MAX_LOGIT_BIAS`] entries, keys
/// token ids, values within ±100 (the vocabulary is checked by
/// [`check_token_ids_in`], which needs the model).
pub(crate) fn check_logit_bias_map(bias: Option<&BTreeMap<String, f64>>) -> Result<(), ApiError> {
    let Some(bias) = bias else {
        return Ok(());
    };
    if bias.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::bad_field(
            "logit_bias",
            format!(
                "logit_bias: at most {MAX_LOGIT_BIAS} entries are allowed, got {}",
                bias.len()
            ),
        ));
    }
    for (key, &value) in bias {
        token_id_key(key)?;
        if !(-MAX_BIAS..=MAX_BIAS).contains(&value) {
            return Err(ApiError::bad_field(
                "logit_bias",
                format!(
                    "logit_bias: the bias of `{key}` must be between -100 and 100, got {value}"
                ),
            ));
        }
    }
    Ok(())
}

/// `logit_bias` with its keys read as token ids (keys that are not ids
/// were refused by validation and are skipped), sorted by id.
pub(crate) fn logit_bias_ids(bias: Option<&BTreeMap<String, f64>>) -> Vec<(u32, f32)> {
    let mut ids: Vec<(u32, f32)> = bias
        .into_iter()
        .flatten()
        .filter_map(|(key, &value)| Some((token_id_key(key).ok()?, value as f32)))
        .collect();
    ids.sort_unstable_by_key(|&(id, _)| id);
    ids
}

/// A `logit_bias` key as a token id: a decimal integer without leading
/// zeros (so two keys never name the same token).
pub(crate) fn token_id_key(key: &str) -> Result<u32, ApiError> {
    let canonical = |id: &u32| id.to_string() == key;
    key.parse::<u32>().ok().filter(canonical).ok_or_else(|| {
        ApiError::bad_field(
            "logit_bias",
            format!("logit_bias: key `{key}` is not a token id (a non-negative integer)"),
        )
    })
}

/// `stream_options` only with `stream: true`.
fn check_stream_options(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    if req.stream_options.is_some() && !req.is_stream() {
        return Err(ApiError::bad_field(
            "stream_options",
            "stream_options: only allowed when `stream` is true",
        ));
    }
    Ok(())
}

/// Checks every token id of the request (`logit_bias` keys,
/// `stop_token_ids`) against a vocabulary of `vocab_size` tokens. Meant for
/// a request that passed [`validate`].
pub fn check_token_ids(req: &ChatCompletionRequest, vocab_size: u32) -> Result<(), ApiError> {
    check_token_ids_in(
        req.logit_bias.as_ref(),
        req.stop_token_ids.as_deref(),
        vocab_size,
    )
}

/// The token ids of any endpoint's `logit_bias` keys and `stop_token_ids`
/// against a vocabulary of `vocab_size` tokens.
pub fn check_token_ids_in(
    logit_bias: Option<&BTreeMap<String, f64>>,
    stop_token_ids: Option<&[u32]>,
    vocab_size: u32,
) -> Result<(), ApiError> {
    for key in logit_bias.iter().flat_map(|b| b.keys()) {
        let id = token_id_key(key)?;
        if id >= vocab_size {
            return Err(ApiError::bad_field(
                "logit_bias",
                format!(
                    "logit_bias: key `{key}` is outside the model's vocabulary of {vocab_size} tokens"
                ),
            ));
        }
    }
    let ids = stop_token_ids.unwrap_or_default();
    if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id >= vocab_size) {
        return Err(ApiError::bad_field(
            format!("stop_token_ids[{i}]"),
            format!(
                "stop_token_ids[{i}]: {id} is outside the model's vocabulary of {vocab_size} tokens"
            ),
        ));
    }
    Ok(())
}
