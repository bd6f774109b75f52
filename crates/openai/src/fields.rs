//! The policy for top-level request fields that generate nothing: every
//! field is either honoured or refused with a 400 naming it.
//!
//! - Fields the request type declares are honoured (their values are
//!   checked in [`crate::validate`]); a few OpenAI fields are declared only
//!   to accept the value that means "what Iris does anyway": `store: false`,
//!   `service_tier: "auto" | "default"`, `modalities: ["text"]`.
//! - OpenAI fields Iris cannot honour are listed in [`REFUSED`] with the
//!   reason the client reads; `null` counts as absent for them.
//! - Any other field is unknown: a 400 naming it, whatever its value.
//!
//! Accepting a field is declaring it in [`crate::ChatCompletionRequest`]:
//! a declared field never reaches [`check_extra`].

use crate::{ApiError, ChatCompletionRequest};

/// OpenAI request fields Iris refuses, with the reason.
pub const REFUSED: &[(&str, &str)] = &[
    ("audio", "audio output is not supported"),
    ("prediction", "predicted outputs are not supported"),
    (
        "web_search_options",
        "web search is not supported: the model answers from its input only",
    ),
    (
        "functions",
        "the deprecated `functions` field is not supported, send `tools`",
    ),
    (
        "function_call",
        "the deprecated `function_call` field is not supported, send `tool_choice`",
    ),
    (
        "reasoning_effort",
        "reasoning effort cannot be set for these models (a thinking model's template takes `chat_template_kwargs`)",
    ),
    (
        "metadata",
        "metadata tags stored completions, and Iris stores none",
    ),
    (
        "verbosity",
        "output verbosity cannot be set for these models",
    ),
    (
        "prompt_cache_key",
        "prompt caching keys are not supported (prefix caching needs no key)",
    ),
    (
        "safety_identifier",
        "safety identifiers are not supported; `user` is logged",
    ),
];

/// Service tiers accepted: there is one.
const SERVICE_TIERS: &[&str] = &["auto", "default"];

/// Runs the checks of this module.
pub fn check(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    check_extra(&req.extra)?;
    if req.store == Some(true) {
        return Err(ApiError::bad_field(
            "store",
            "store: stored completions are not supported, only `false`",
        ));
    }
    if let Some(tier) = req
        .service_tier
        .as_deref()
        .filter(|t| !SERVICE_TIERS.contains(t))
    {
        return Err(ApiError::bad_field(
            "service_tier",
            format!("service_tier: `{tier}` is not available, only `auto` or `default`"),
        ));
    }
    match req.modalities.as_deref() {
        Some(m) if m.iter().any(|m| m != "text") || m.is_empty() => Err(ApiError::bad_field(
            "modalities",
            "modalities: only `[\"text\"]` output is supported",
        )),
        _ => Ok(()),
    }
}

/// Refuses the first field (in the map's order) the request type does not
/// declare, unless it is a [`REFUSED`] field set to `null`.
pub fn check_extra(extra: &serde_json::Map<String, serde_json::Value>) -> Result<(), ApiError> {
    for (name, value) in extra {
        match REFUSED.iter().find(|(field, _)| field == name) {
            Some(_) if value.is_null() => continue,
            Some((_, reason)) => {
                return Err(ApiError::bad_field(
                    name.as_str(),
                    format!("{name}: {reason}"),
                ))
            }
            None => {
                return Err(ApiError::bad_field(
                    name.as_str(),
                    format!("{name}: unknown field; docs/openai.md lists the fields Iris accepts"),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extra(json: &str) -> serde_json::Map<String, serde_json::Value> {
        serde_json::from_str(json).unwrap_or_default()
    }

    #[test]
    fn unknown_and_refused_fields_are_named() {
        let err = check_extra(&extra(r#"{"temprature": 0.5}"#)).err();
        assert_eq!(err.and_then(|e| e.param), Some("temprature".into()));
        let err = check_extra(&extra(r#"{"audio": {"voice": "x"}}"#)).err();
        let err = err.map(|e| (e.param, e.message));
        assert_eq!(
            err,
            Some((
                Some("audio".into()),
                "audio: audio output is not supported".into()
            ))
        );
        // `null` is absent for a known field, not for an unknown one.
        assert!(check_extra(&extra(r#"{"functions": null}"#)).is_ok());
        assert!(check_extra(&extra(r#"{"bogus": null}"#)).is_err());
        assert!(check_extra(&extra("{}")).is_ok());
    }
}
