//! Incremental detokenization: token ids in, newly completed text out.
//!
//! Decoding each new token on its own gets spaces and multi-byte characters
//! wrong: SentencePiece-style decoders drop the leading space of the first
//! token they see, and a byte-level BPE token may end in the middle of a
//! UTF-8 character. [`IncrementalDecoder`] decodes a short sliding window
//! instead, with two offsets into it:
//!
//! - `prefix_offset`: where the window starts (tokens already emitted, kept
//!   as context);
//! - `read_offset`: the end of what has been emitted.
//!
//! On each token it decodes `window[prefix..read]` and `window[prefix..]`;
//! if the second is longer and does not end in U+FFFD (an incomplete
//! character), the difference is new text and both offsets move forward.
//! Tokens before `prefix_offset` are dropped, so the work per token is
//! bounded by the window, not by the length of the sequence.
//!
//! Special tokens that `skip_special_tokens` would drop are never put in the
//! window at all; the decoded text is the same and the window stays short.

use std::collections::HashSet;
use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::DetokError;

/// Prompt tokens kept as context for the first generated token.
pub const PROMPT_CONTEXT_TOKENS: usize = 6;

/// Window length past which already-emitted tokens are dropped.
const COMPACT_AT: usize = 32;

/// Turns a stream of token ids into text, one piece at a time.
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// Ids that decoding drops when `skip_special_tokens` is set.
    special_ids: HashSet<u32>,
    /// The window: context tokens, then tokens emitted or pending.
    tokens: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder whose first output follows `prompt_tail` (the last prompt
    /// tokens, possibly empty; only the last [`PROMPT_CONTEXT_TOKENS`] are
    /// kept). The prompt itself is never emitted.
    pub fn new(tokenizer: Arc<Tokenizer>, prompt_tail: &[u32], skip_special_tokens: bool) -> Self {
        Self::keeping(tokenizer, prompt_tail, skip_special_tokens, &[])
    }

    /// [`Self::new`], but the special tokens `kept` stay in the text even
    /// when the others are skipped (an output parser reads them as
    /// markers).
    pub fn keeping(
        tokenizer: Arc<Tokenizer>,
        prompt_tail: &[u32],
        skip_special_tokens: bool,
        kept: &[u32],
    ) -> Self {
        let mut special_ids = if skip_special_tokens {
            special_ids(&tokenizer)
        } else {
            HashSet::new()
        };
        for id in kept {
            special_ids.remove(id);
        }
        let mut decoder = Self {
            tokenizer,
            skip_special_tokens,
            special_ids,
            tokens: Vec::with_capacity(COMPACT_AT + PROMPT_CONTEXT_TOKENS),
            prefix_offset: 0,
            read_offset: 0,
        };
        let start = prompt_tail.len().saturating_sub(PROMPT_CONTEXT_TOKENS);
        decoder.tokens.extend(
            prompt_tail[start..]
                .iter()
                .copied()
                .filter(|id| !decoder.special_ids.contains(id)),
        );
        decoder.read_offset = decoder.tokens.len();
        decoder
    }

    /// Adds one token; returns the text it completes, if any.
    pub fn push(&mut self, token: u32) -> Result<Option<String>, DetokError> {
        if self.special_ids.contains(&token) {
            return Ok(None);
        }
        self.tokens.push(token);
        let prefix_text = self.decode(self.prefix_offset, self.read_offset)?;
        let new_text = self.decode(self.prefix_offset, self.tokens.len())?;
        if new_text.len() <= prefix_text.len() || new_text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(None);
        }
        let piece = suffix_after(&new_text, &prefix_text).to_owned();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        self.compact();
        Ok(if piece.is_empty() { None } else { Some(piece) })
    }

    /// Adds several tokens; returns the text they complete, if any.
    pub fn push_many(&mut self, tokens: &[u32]) -> Result<Option<String>, DetokError> {
        let mut out: Option<String> = None;
        for &token in tokens {
            if let Some(piece) = self.push(token)? {
                match &mut out {
                    Some(text) => text.push_str(&piece),
                    None => out = Some(piece),
                }
            }
        }
        Ok(out)
    }

    /// Flushes text held back (an incomplete character decodes as U+FFFD).
    /// Afterwards the decoder continues as if that text had been emitted.
    /// A decoding failure (which the tokenizer does not produce for ids it
    /// knows) flushes nothing; [`Self::try_finish`] reports it instead.
    pub fn finish(&mut self) -> String {
        self.try_finish().unwrap_or_default()
    }

    /// [`Self::finish`], reporting a decoding failure.
    pub fn try_finish(&mut self) -> Result<String, DetokError> {
        if self.read_offset == self.tokens.len() {
            return Ok(String::new());
        }
        let prefix_text = self.decode(self.prefix_offset, self.read_offset)?;
        let new_text = self.decode(self.prefix_offset, self.tokens.len())?;
        let piece = suffix_after(&new_text, &prefix_text).to_owned();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        self.compact();
        Ok(piece)
    }

    /// Whether special tokens are dropped from the output.
    pub fn skip_special_tokens(&self) -> bool {
        self.skip_special_tokens
    }

    /// Tokens currently in the window (for tests and metrics).
    pub fn window_len(&self) -> usize {
        self.tokens.len()
    }

    /// Decodes `tokens[from..to]`.
    fn decode(&self, from: usize, to: usize) -> Result<String, DetokError> {
        let ids = self.tokens.get(from..to).unwrap_or(&[]);
        self.decode_ids(ids)
    }

    /// Decodes `ids` from outside the window, the way the window is
    /// decoded (the skipped special tokens dropped, the kept ones kept).
    pub fn decode_all(&self, ids: &[u32]) -> Result<String, DetokError> {
        let ids: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|id| !self.special_ids.contains(id))
            .collect();
        self.decode_ids(&ids)
    }

    /// Decodes ids already free of skipped special tokens. The window
    /// never holds them, so the tokenizer is asked to skip nothing (which
    /// would also drop the kept ones).
    fn decode_ids(&self, ids: &[u32]) -> Result<String, DetokError> {
        if ids.is_empty() {
            return Ok(String::new());
        }
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| DetokError::Decode(e.to_string()))
    }

    /// Drops tokens before `prefix_offset` once the window grows long.
    fn compact(&mut self) {
        if self.prefix_offset < COMPACT_AT {
            return;
        }
        self.tokens.drain(..self.prefix_offset);
        self.read_offset -= self.prefix_offset;
        self.prefix_offset = 0;
    }
}

impl std::fmt::Debug for IncrementalDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IncrementalDecoder")
            .field("skip_special_tokens", &self.skip_special_tokens)
            .field("tokens", &self.tokens)
            .field("prefix_offset", &self.prefix_offset)
            .field("read_offset", &self.read_offset)
            .finish()
    }
}

/// The ids of special added tokens (those `decode(.., true)` drops).
fn special_ids(tokenizer: &Tokenizer) -> HashSet<u32> {
    tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, token)| token.special)
        .map(|(id, _)| id)
        .collect()
}

/// `text` after its first `prefix.len()` bytes, moved forward to a char
/// boundary if the window's decoding did not extend the prefix exactly.
fn suffix_after<'a>(text: &'a str, prefix: &str) -> &'a str {
    let mut at = prefix.len().min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    &text[at..]
}

#[cfg(test)]
mod tests {
    use super::suffix_after;

    #[test]
    fn suffix_respects_char_boundaries() {
        assert_eq!(suffix_after("héllo", "h"), "éllo");
        assert_eq!(suffix_after("héllo", "hx"), "llo");
        assert_eq!(suffix_after("ab", "abc"), "");
    }
}
