//! The model's context window, enforced by the gateway.
//!
//! Two checks, both answered with a 400 (`param: messages`,
//! `code: context_length_exceeded`):
//!
//! - **Text budget, before rendering and tokenizing.** One token of a
//!   tokenizer stands for at most `L` bytes of input text, so a text of `B`
//!   bytes needs at least `B / L` tokens. `L` is computed once, at start-up,
//!   from the vocabulary: the longest token's text (plus one byte for a
//!   space a decoder may drop), times how much the tokenizer's normalizer
//!   can shrink text (3 for NFC/NFD and lowercasing, 4 for NFKC/NFKD). When
//!   the messages' text needs more tokens than the context leaves for the
//!   prompt, the request is refused in microseconds instead of after
//!   seconds of tokenization. The bound only holds for tokenizers that
//!   keep every byte of text in some token (byte-level or byte-fallback
//!   BPE, no normalizer or pre-tokenizer that deletes text, no unknown
//!   token swallowing a run of text); for others there is no text budget
//!   (logged at start-up) and only the exact check applies. The budget
//!   counts message text as sent: a template that drops text (older
//!   reasoning, say) is not credited for it.
//! - **Exact count, after tokenizing**: prompt tokens (image tokens
//!   included) plus `max_tokens` (1 when absent) must fit the context.

use anyhow::bail;
use iris_model::ModelDir;
use iris_openai::{ApiError, ChatMessage, ContentPart, MessageContent};
use serde_json::Value;
use tokenizers::models::ModelWrapper;
use tokenizers::Tokenizer;

/// The context window and the text budget derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextLimits {
    /// Tokens the prompt and the completion share.
    pub context_length: u32,
    /// Most bytes of message text one token can stand for; `None` when the
    /// tokenizer gives no such bound.
    pub bytes_per_token: Option<u64>,
}

impl ContextLimits {
    /// Limits for `tokenizer` (the bound is computed from its vocabulary).
    pub fn new(context_length: u32, tokenizer: &Tokenizer) -> Self {
        let bytes_per_token = match bytes_per_token(tokenizer) {
            Ok(bound) => Some(bound),
            Err(reason) => {
                tracing::warn!(
                    reason,
                    "no text budget for this tokenizer: prompts are only checked against the context after tokenization"
                );
                None
            }
        };
        ContextLimits {
            context_length,
            bytes_per_token,
        }
    }

    /// Refuses messages whose text cannot fit the prompt's share of the
    /// context with this tokenizer, without tokenizing it.
    pub fn check_text(
        &self,
        messages: &[ChatMessage],
        max_new_tokens: Option<u32>,
    ) -> Result<(), ApiError> {
        let Some(per_token) = self.bytes_per_token else {
            return Ok(());
        };
        let bytes: u64 = messages.iter().map(text_bytes).sum();
        let completion = completion_tokens(max_new_tokens);
        let room = u64::from(self.context_length.saturating_sub(completion));
        let min_tokens = bytes.div_ceil(per_token);
        if min_tokens <= room {
            return Ok(());
        }
        Err(exceeded(format!(
            "the messages hold {bytes} bytes of text, at least {min_tokens} tokens for this \
             model's tokenizer (at most {per_token} bytes per token); with {completion} \
             completion token(s) that exceeds the model's context of {} tokens",
            self.context_length
        )))
    }

    /// Refuses a prompt of `prompt_tokens` whose completion of
    /// `max_new_tokens` (1 when absent) does not fit the context.
    pub fn check_tokens(
        &self,
        prompt_tokens: usize,
        max_new_tokens: Option<u32>,
    ) -> Result<(), ApiError> {
        let completion = completion_tokens(max_new_tokens);
        let total = prompt_tokens as u64 + u64::from(completion);
        if total <= u64::from(self.context_length) {
            return Ok(());
        }
        let asked = match max_new_tokens {
            Some(_) => format!("max_tokens asks for {completion} more"),
            None => "the completion needs at least 1 more".to_owned(),
        };
        Err(exceeded(format!(
            "the prompt is {prompt_tokens} tokens and {asked}: {total} tokens exceed the \
             model's context of {} tokens; shorten the messages or lower max_tokens",
            self.context_length
        )))
    }
}

/// The context length: `flag` (`--context-length`), else config.json's
/// (`max_position_embeddings` and kin), else tokenizer_config.json's
/// `model_max_length` when it is a real length.
pub fn context_length(dir: &ModelDir, flag: Option<u32>) -> anyhow::Result<u32> {
    let from_tokenizer = || {
        dir.tokenizer_config
            .raw
            .get("model_max_length")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    match flag
        .or(dir.config.max_context_length)
        .or_else(from_tokenizer)
    {
        Some(0) => bail!("the context length must be at least 1 token"),
        Some(n) => Ok(n),
        None => bail!(
            "the model directory states no context length (config.json max_position_embeddings, \
             tokenizer_config.json model_max_length); pass --context-length TOKENS"
        ),
    }
}

fn exceeded(message: String) -> ApiError {
    ApiError::bad_field("messages", message).with_code("context_length_exceeded")
}

fn completion_tokens(max_new_tokens: Option<u32>) -> u32 {
    max_new_tokens.unwrap_or(1).max(1)
}

/// Bytes of text in a message (text parts only; images are counted after
/// tokenization).
fn text_bytes(message: &ChatMessage) -> u64 {
    let bytes = match &message.content {
        None => 0,
        Some(MessageContent::Text(text)) => text.len(),
        Some(MessageContent::Parts(parts)) => parts
            .iter()
            .filter_map(ContentPart::as_text)
            .map(str::len)
            .sum(),
    };
    bytes as u64
}

/// Most bytes of input text one token of `tokenizer` stands for, or why
/// there is no such bound.
pub fn bytes_per_token(tokenizer: &Tokenizer) -> Result<u64, String> {
    let normalizer = serde_json::to_value(tokenizer.get_normalizer()).map_err(|e| e.to_string())?;
    let shrink = normalizer_shrink(&normalizer)?;
    let pre_tokenizer =
        serde_json::to_value(tokenizer.get_pre_tokenizer()).map_err(|e| e.to_string())?;
    pre_tokenizer_keeps_text(&pre_tokenizer)?;
    let floor = model_floor(tokenizer.get_model())?;
    Ok(shrink * longest_token_bytes(tokenizer).max(floor))
}

/// The longest text a token decodes to, plus one byte (a Metaspace-style
/// decoder drops the leading space of a first token). Partial UTF-8 decodes
/// to U+FFFD, which is never shorter than the bytes it replaces.
fn longest_token_bytes(tokenizer: &Tokenizer) -> u64 {
    let size = tokenizer.get_vocab_size(true) as u32;
    (0..size)
        .filter_map(|id| tokenizer.decode(&[id], false).ok())
        .map(|text| text.len() as u64)
        .max()
        .unwrap_or(0)
        + 1
}

/// How many times shorter (in UTF-8 bytes) the normalizer can make text.
fn normalizer_shrink(normalizer: &Value) -> Result<u64, String> {
    if normalizer.is_null() {
        return Ok(1);
    }
    let kind = normalizer["type"].as_str().unwrap_or("?");
    match kind {
        "Prepend" | "ByteLevel" => Ok(1),
        // Composition (Hangul jamo L+V+T, 9 bytes, to one syllable, 3) and
        // singletons (KELVIN SIGN, 3 bytes, to K), and lowercasing them.
        "NFC" | "NFD" | "Lowercase" => Ok(3),
        // Compatibility forms add MATHEMATICAL BOLD A (4 bytes) to A.
        "NFKC" | "NFKD" => Ok(4),
        "Replace" => {
            let content = normalizer["content"].as_str().unwrap_or("");
            match normalizer["pattern"]["String"].as_str() {
                Some(pattern) if !content.is_empty() => {
                    Ok((pattern.len() as u64).div_ceil(content.len() as u64).max(1))
                }
                _ => Err("a Replace normalizer can delete text".to_owned()),
            }
        }
        "Sequence" => normalizer["normalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .try_fold(1, |acc, n| Ok(acc * normalizer_shrink(n)?)),
        other => Err(format!("the {other} normalizer can delete text")),
    }
}

fn pre_tokenizer_keeps_text(pre_tokenizer: &Value) -> Result<(), String> {
    if pre_tokenizer.is_null() {
        return Ok(());
    }
    match pre_tokenizer["type"].as_str().unwrap_or("?") {
        "ByteLevel" | "Metaspace" | "Digits" | "UnicodeScripts" | "FixedLength" => Ok(()),
        kind @ ("Split" | "Punctuation") if pre_tokenizer["behavior"] == "Removed" => {
            Err(format!("the {kind} pre-tokenizer removes what it matches"))
        }
        "Split" | "Punctuation" => Ok(()),
        "Sequence" => pre_tokenizer["pretokenizers"]
            .as_array()
            .into_iter()
            .flatten()
            .try_for_each(pre_tokenizer_keeps_text),
        other => Err(format!(
            "the {other} pre-tokenizer drops whitespace or delimiters"
        )),
    }
}

/// The fewest bytes the model's longest token must be counted as, or why
/// one token can stand for any amount of text.
fn model_floor(model: &ModelWrapper) -> Result<u64, String> {
    match model {
        ModelWrapper::BPE(bpe) if bpe.unk_token.is_none() || bpe.byte_fallback => Ok(1),
        // One unknown token per character (up to 4 bytes).
        ModelWrapper::BPE(bpe) if !bpe.fuse_unk => Ok(4),
        ModelWrapper::BPE(_) => {
            Err("the BPE model fuses runs of unknown text into one token".into())
        }
        ModelWrapper::Unigram(u) if u.byte_fallback() => Ok(1),
        ModelWrapper::Unigram(_) => Err("the Unigram model has no byte fallback".into()),
        ModelWrapper::WordPiece(_) | ModelWrapper::WordLevel(_) => {
            Err("the model maps whole unknown words to one token".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_openai::Role;
    use tokenizers::models::wordlevel::WordLevel;

    fn tiny() -> (tempfile::TempDir, Tokenizer) {
        let dir = tempfile::tempdir().unwrap();
        iris_model::tiny::write_tiny_qwen2_vl(dir.path()).unwrap();
        let tok = Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
        (dir, tok)
    }

    fn user(text: String) -> Vec<ChatMessage> {
        vec![ChatMessage::text(Role::User, text)]
    }

    #[test]
    fn the_bound_holds_for_the_longest_tokens() {
        let (_dir, tok) = tiny();
        let per_token = bytes_per_token(&tok).unwrap();
        // Every token's text is within the bound, so no text of B bytes is
        // fewer than B / bound tokens; the longest token alone shows the
        // bound is tight (plus the one spare byte).
        let longest = (0..tok.get_vocab_size(true) as u32)
            .map(|id| tok.decode(&[id], false).unwrap())
            .max_by_key(|t| t.len())
            .unwrap();
        assert_eq!(per_token, longest.len() as u64 + 1);
        let text = longest.repeat(100);
        let tokens = tok.encode(text.as_str(), false).unwrap().len() as u64;
        assert!(tokens >= text.len() as u64 / per_token, "{tokens} tokens");
    }

    #[test]
    fn text_budget_refuses_only_what_cannot_fit() {
        let (_dir, tok) = tiny();
        let limits = ContextLimits::new(100, &tok);
        let per_token = limits.bytes_per_token.unwrap() as usize;
        // 99 tokens' worth of bytes fit with one completion token.
        assert!(limits
            .check_text(&user("a".repeat(99 * per_token)), None)
            .is_ok());
        let err = limits
            .check_text(&user("a".repeat(99 * per_token + 1)), None)
            .unwrap_err();
        assert_eq!(err.status, 400);
        assert_eq!(err.param.as_deref(), Some("messages"));
        assert_eq!(err.code.as_deref(), Some("context_length_exceeded"));
        // max_tokens takes its share of the context.
        assert!(limits
            .check_text(&user("a".repeat(90 * per_token + 1)), Some(10))
            .is_err());
        assert!(limits
            .check_text(&user("a".repeat(90 * per_token)), Some(10))
            .is_ok());
    }

    #[test]
    fn exact_check_counts_prompt_and_completion() {
        let (_dir, tok) = tiny();
        let limits = ContextLimits::new(100, &tok);
        assert!(limits.check_tokens(99, None).is_ok());
        assert!(limits.check_tokens(90, Some(10)).is_ok());
        let err = limits.check_tokens(91, Some(10)).unwrap_err();
        assert_eq!(err.code.as_deref(), Some("context_length_exceeded"));
        assert!(err.message.contains("91 tokens"), "{}", err.message);
        assert!(err.message.contains("101 tokens"), "{}", err.message);
        assert!(
            err.message.contains("context of 100 tokens"),
            "{}",
            err.message
        );
        assert!(limits.check_tokens(100, None).is_err());
        assert!(limits.check_tokens(0, Some(u32::MAX)).is_err());
    }

    #[test]
    fn normalizers_and_pre_tokenizers_that_delete_text_give_no_bound() {
        let json = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        assert_eq!(normalizer_shrink(&json(r#"{"type":"NFC"}"#)), Ok(3));
        assert_eq!(
            normalizer_shrink(&json(
                r#"{"type":"Sequence","normalizers":[{"type":"NFKC"},{"type":"Lowercase"}]}"#
            )),
            Ok(12)
        );
        assert_eq!(
            normalizer_shrink(&json(
                r#"{"type":"Replace","pattern":{"String":" "},"content":"\u2581"}"#
            )),
            Ok(1)
        );
        for deleting in [
            r#"{"type":"StripAccents"}"#,
            r#"{"type":"Strip","strip_left":true,"strip_right":true}"#,
            r#"{"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "}"#,
            r#"{"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Nmt"}]}"#,
        ] {
            assert!(normalizer_shrink(&json(deleting)).is_err(), "{deleting}");
        }
        assert!(pre_tokenizer_keeps_text(&json(
            r#"{"type":"Sequence","pretokenizers":[{"type":"Split","behavior":"Isolated"},{"type":"ByteLevel"}]}"#
        ))
        .is_ok());
        for deleting in [
            r#"{"type":"Whitespace"}"#,
            r#"{"type":"Split","behavior":"Removed"}"#,
            r#"{"type":"Sequence","pretokenizers":[{"type":"Digits"},{"type":"WhitespaceSplit"}]}"#,
        ] {
            assert!(
                pre_tokenizer_keeps_text(&json(deleting)).is_err(),
                "{deleting}"
            );
        }
        let word_level = Tokenizer::new(WordLevel::default());
        assert!(bytes_per_token(&word_level).is_err());
        assert_eq!(ContextLimits::new(10, &word_level).bytes_per_token, None);
    }
}
