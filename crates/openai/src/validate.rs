//! Semantic checks on a deserialised [`ChatCompletionRequest`].
//!
//! Each check returns a 400 naming the field in `param` and in the message.
//! Unsupported OpenAI features (`n > 1`, log probabilities, tools) are
//! refused here rather than silently ignored; `response_format` and the
//! constraint extensions are read by [`crate::structured`].

use crate::request::{ContentPart, MessageContent, Role};
use crate::{ApiError, ChatCompletionRequest, ChatMessage};

/// Most stop strings a request may carry.
pub const MAX_STOP_STRINGS: usize = 16;

/// Runs every check, in field order.
pub fn validate(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    if req.model.is_empty() {
        return Err(ApiError::bad_field("model", "model: must not be empty"));
    }
    check_messages(&req.messages)?;
    check_lengths(req)?;
    check_sampling(req)?;
    check_stop(req)?;
    check_unsupported(req)
}

/// `messages`: non-empty, content present (except assistant), parts allowed.
fn check_messages(messages: &[ChatMessage]) -> Result<(), ApiError> {
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

/// One message.
fn check_message(i: usize, msg: &ChatMessage) -> Result<(), ApiError> {
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

/// One content part: images only from the user, and with a URL.
fn check_part(role: Role, param: &str, part: &ContentPart) -> Result<(), ApiError> {
    let ContentPart::ImageUrl { image_url } = part else {
        return Ok(());
    };
    if role != Role::User {
        let role = role.as_str();
        return Err(ApiError::bad_field(
            param,
            format!("{param}: image parts are only allowed in `user` messages, not `{role}`"),
        ));
    }
    if image_url.url.is_empty() {
        let param = format!("{param}.image_url.url");
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
fn in_range(
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
fn range_error(name: &str, value: f32, wording: &str) -> ApiError {
    ApiError::bad_field(name, format!("{name}: must be {wording}, got {value}"))
}

/// `stop`: at most 16 non-empty strings.
fn check_stop(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    let Some(stop) = &req.stop else {
        return Ok(());
    };
    let stops = stop.as_slice();
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
    Ok(())
}

/// Features this gateway does not implement.
fn check_unsupported(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_field("n", "n must be 1"));
    }
    if req.logprobs == Some(true) {
        return Err(not_supported("logprobs"));
    }
    if req.top_logprobs.is_some_and(|k| k > 0) {
        return Err(not_supported("top_logprobs"));
    }
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(not_supported("tools"));
    }
    check_tool_choice(req.tool_choice.as_ref())
}

/// `tool_choice`: absent, `null`, `"none"` or `"auto"` (there are no tools).
fn check_tool_choice(choice: Option<&serde_json::Value>) -> Result<(), ApiError> {
    match choice {
        None | Some(serde_json::Value::Null) => Ok(()),
        Some(serde_json::Value::String(s)) if s == "none" || s == "auto" => Ok(()),
        Some(_) => Err(not_supported("tool_choice")),
    }
}

/// A 400 for a feature the gateway does not support.
fn not_supported(name: &str) -> ApiError {
    ApiError::bad_field(name, format!("{name}: not supported"))
}
