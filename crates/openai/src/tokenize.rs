//! `POST /v1/tokenize` and `POST /v1/detokenize`, in the shapes vLLM and
//! SGLang serve.
//!
//! Tokenize takes `{model?, prompt, add_special_tokens?, return_token_strs?}`
//! (a string; special tokens added by default) or `{model?, messages,
//! add_generation_prompt?, return_token_strs?}` (rendered with the chat
//! template, which places the special tokens itself) and answers
//! `{count, max_model_len, tokens, token_strs}`. Detokenize takes
//! `{model?, tokens}` and answers `{prompt}`. Unknown fields are a 400
//! naming them.

use serde::{Deserialize, Serialize};

use crate::{ApiError, ChatMessage};

/// A tokenize request as sent.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// When given, the model it names must be the served one.
    #[serde(default)]
    pub model: Option<String>,
    /// Text to tokenize.
    #[serde(default)]
    pub prompt: Option<String>,
    /// A conversation to render with the chat template and tokenize.
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    /// With `prompt`: add the tokenizer's special tokens (default true).
    /// With `messages` only `false` (the template places them).
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// With `messages`: end with the assistant turn's opening (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Also answer each token's string as the vocabulary spells it.
    #[serde(default)]
    pub return_token_strs: Option<bool>,
}

/// What to tokenize, after validation.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenizeInput {
    /// Text, with or without the tokenizer's special tokens.
    Prompt {
        text: String,
        add_special_tokens: bool,
    },
    /// Chat messages for the template.
    Messages {
        messages: Vec<ChatMessage>,
        add_generation_prompt: bool,
    },
}

impl TokenizeRequest {
    /// The input; valid after [`parse_tokenize_request`].
    pub fn input(&self) -> TokenizeInput {
        match (&self.prompt, &self.messages) {
            (Some(text), _) => TokenizeInput::Prompt {
                text: text.clone(),
                add_special_tokens: self.add_special_tokens.unwrap_or(true),
            },
            (None, messages) => TokenizeInput::Messages {
                messages: messages.clone().unwrap_or_default(),
                add_generation_prompt: self.add_generation_prompt.unwrap_or(true),
            },
        }
    }
}

/// The answer to a tokenize request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizeResponse {
    /// `tokens.len()`.
    pub count: usize,
    /// The context length requests are checked against.
    pub max_model_len: u32,
    /// The token ids.
    pub tokens: Vec<u32>,
    /// Each token as the vocabulary spells it, when asked (else `null`).
    pub token_strs: Option<Vec<String>>,
}

/// A detokenize request.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// When given, the model it names must be the served one.
    #[serde(default)]
    pub model: Option<String>,
    /// Token ids to turn back into text.
    pub tokens: Vec<u32>,
}

/// The answer to a detokenize request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    /// The text of the tokens (special tokens included).
    pub prompt: String,
}

/// Parses and validates a tokenize request body.
pub fn parse_tokenize_request(body: &[u8]) -> Result<TokenizeRequest, ApiError> {
    let request: TokenizeRequest = crate::parse::deserialize(body)?;
    match (&request.prompt, &request.messages) {
        (Some(_), Some(_)) => Err(ApiError::bad_field(
            "messages",
            "messages: give either prompt or messages, not both",
        )),
        (None, None) => Err(ApiError::bad_field(
            "prompt",
            "prompt: required (or messages, for a conversation)",
        )),
        (Some(_), None) if request.add_generation_prompt.is_some() => Err(ApiError::bad_field(
            "add_generation_prompt",
            "add_generation_prompt: only applies to messages",
        )),
        (None, Some(messages)) => check_messages(&request, messages),
        (Some(_), None) => Ok(()),
    }?;
    Ok(request)
}

/// Messages: as for chat, text only, special tokens from the template.
fn check_messages(request: &TokenizeRequest, messages: &[ChatMessage]) -> Result<(), ApiError> {
    crate::validate::check_messages(messages)?;
    if request.add_special_tokens == Some(true) {
        return Err(ApiError::bad_field(
            "add_special_tokens",
            "add_special_tokens: must be false with messages (the chat template places the special tokens)",
        ));
    }
    for (i, message) in messages.iter().enumerate() {
        if message.content.as_ref().is_some_and(|c| c.has_media()) {
            let param = format!("messages[{i}].content");
            return Err(ApiError::bad_field(
                param.clone(),
                format!("{param}: tokenize counts text only; image and video parts are not supported here"),
            ));
        }
    }
    Ok(())
}

/// Parses a detokenize request body.
pub fn parse_detokenize_request(body: &[u8]) -> Result<DetokenizeRequest, ApiError> {
    crate::parse::deserialize(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenize(body: &str) -> Result<TokenizeRequest, ApiError> {
        parse_tokenize_request(body.as_bytes())
    }

    #[test]
    fn prompt_or_messages() {
        let r = tokenize(r#"{"model":"m","prompt":"hi"}"#).expect("prompt");
        assert_eq!(
            r.input(),
            TokenizeInput::Prompt {
                text: "hi".into(),
                add_special_tokens: true
            }
        );
        let r = tokenize(
            r#"{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}"#,
        )
        .expect("messages");
        assert!(matches!(
            r.input(),
            TokenizeInput::Messages {
                add_generation_prompt: false,
                ..
            }
        ));
        let both = tokenize(r#"{"prompt":"a","messages":[{"role":"user","content":"b"}]}"#);
        assert_eq!(both.expect_err("both").param.as_deref(), Some("messages"));
        let none = tokenize(r#"{"model":"m"}"#).expect_err("neither");
        assert_eq!(none.param.as_deref(), Some("prompt"));
    }

    #[test]
    fn refusals_name_their_field() {
        let cases = [
            (r#"{"prompt":"a","bogus":1}"#, "bogus"),
            (
                r#"{"prompt":"a","add_generation_prompt":true}"#,
                "add_generation_prompt",
            ),
            (
                r#"{"messages":[{"role":"user","content":"a"}],"add_special_tokens":true}"#,
                "add_special_tokens",
            ),
            (
                r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"http://x/a.png"}]}]}"#,
                "messages[0].content",
            ),
            (r#"{"messages":[]}"#, "messages"),
        ];
        for (body, param) in cases {
            let err = tokenize(body).expect_err(body);
            assert_eq!(err.status, 400, "{body}");
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err:?}");
        }
    }

    #[test]
    fn detokenize_takes_token_ids() {
        let r = parse_detokenize_request(br#"{"model":"m","tokens":[1,2,3]}"#).expect("ok");
        assert_eq!(r.tokens, vec![1, 2, 3]);
        let err = parse_detokenize_request(br#"{"tokens":[-1]}"#).expect_err("negative");
        assert_eq!(err.param.as_deref(), Some("tokens[0]"));
        let err = parse_detokenize_request(br#"{"tokens":[1],"extra":true}"#).expect_err("unknown");
        assert_eq!(err.param.as_deref(), Some("extra"));
        let err = parse_detokenize_request(br#"{}"#).expect_err("missing");
        assert_eq!(err.param.as_deref(), Some("tokens"));
    }
}
