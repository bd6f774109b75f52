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
//!
//! When the tokenizer's decoder is exactly byte-level, the window holds the
//! tokens' precomputed bytes instead of their ids ([`ByteWindow`]): the same
//! two decodings, as lossy UTF-8 of byte slices, without the tokenizer.

use std::sync::Arc;

use crate::byte_window::ByteWindow;
use crate::{DetokError, DetokTables};

/// Prompt tokens kept as context for the first generated token.
pub const PROMPT_CONTEXT_TOKENS: usize = 6;

/// Window length past which already-emitted tokens are dropped.
const COMPACT_AT: usize = 32;

/// Turns a stream of token ids into text, one piece at a time.
pub struct IncrementalDecoder {
    tables: Arc<DetokTables>,
    skip_special_tokens: bool,
    /// Special tokens kept in the text even when the others are skipped.
    kept: Vec<u32>,
    window: Window,
}

/// The tokens being decoded: ids decoded by the tokenizer, or bytes.
enum Window {
    Tokens(TokenWindow),
    Bytes(ByteWindow),
}

impl IncrementalDecoder {
    /// A decoder whose first output follows `prompt_tail` (the last prompt
    /// tokens, possibly empty; only the last [`PROMPT_CONTEXT_TOKENS`] are
    /// kept). The prompt itself is never emitted.
    pub fn new(tables: Arc<DetokTables>, prompt_tail: &[u32], skip_special_tokens: bool) -> Self {
        Self::keeping(tables, prompt_tail, skip_special_tokens, &[])
    }

    /// [`Self::new`], but the special tokens `kept` stay in the text even
    /// when the others are skipped (an output parser reads them as
    /// markers).
    pub fn keeping(
        tables: Arc<DetokTables>,
        prompt_tail: &[u32],
        skip_special_tokens: bool,
        kept: &[u32],
    ) -> Self {
        let window = match tables.bytes() {
            Some(_) => Window::Bytes(ByteWindow::default()),
            None => Window::Tokens(TokenWindow::default()),
        };
        let mut decoder = Self {
            tables,
            skip_special_tokens,
            kept: kept.to_vec(),
            window,
        };
        let start = prompt_tail.len().saturating_sub(PROMPT_CONTEXT_TOKENS);
        for &id in &prompt_tail[start..] {
            if !decoder.skips(id) {
                decoder.add_context(id);
            }
        }
        decoder
    }

    /// Adds one token; returns the text it completes, if any.
    pub fn push(&mut self, token: u32) -> Result<Option<String>, DetokError> {
        if self.skips(token) {
            return Ok(None);
        }
        match &mut self.window {
            Window::Tokens(window) => window.push(&self.tables, token),
            Window::Bytes(window) => Ok(window.push(byte_table_get(&self.tables, token))),
        }
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
        match &mut self.window {
            Window::Tokens(window) => window.finish(&self.tables),
            Window::Bytes(window) => Ok(window.finish()),
        }
    }

    /// Whether special tokens are dropped from the output.
    pub fn skip_special_tokens(&self) -> bool {
        self.skip_special_tokens
    }

    /// Whether this decoder appends precomputed bytes (byte-level
    /// tokenizers) rather than decoding through the tokenizer.
    pub fn is_byte_level(&self) -> bool {
        matches!(self.window, Window::Bytes(_))
    }

    /// Tokens currently in the window (for tests and metrics).
    pub fn window_len(&self) -> usize {
        match &self.window {
            Window::Tokens(window) => window.tokens.len(),
            Window::Bytes(window) => window.len(),
        }
    }

    /// Decodes `ids` from outside the window, the way the window is
    /// decoded (the skipped special tokens dropped, the kept ones kept).
    pub fn decode_all(&self, ids: &[u32]) -> Result<String, DetokError> {
        let ids = ids.iter().copied().filter(|&id| !self.skips(id));
        match self.window {
            Window::Tokens(_) => decode_ids(&self.tables, &ids.collect::<Vec<u32>>()),
            Window::Bytes(_) => {
                let mut bytes = Vec::new();
                for id in ids {
                    bytes.extend_from_slice(byte_table_get(&self.tables, id));
                }
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
        }
    }

    /// Whether `id` is dropped from the text.
    fn skips(&self, id: u32) -> bool {
        self.skip_special_tokens && self.tables.is_special(id) && !self.kept.contains(&id)
    }

    /// Adds a prompt token as context (never emitted).
    fn add_context(&mut self, id: u32) {
        match &mut self.window {
            Window::Tokens(window) => {
                window.tokens.push(id);
                window.read_offset = window.tokens.len();
            }
            Window::Bytes(window) => window.add_context(byte_table_get(&self.tables, id)),
        }
    }
}

impl std::fmt::Debug for IncrementalDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IncrementalDecoder")
            .field("skip_special_tokens", &self.skip_special_tokens)
            .field("byte_level", &self.is_byte_level())
            .field("window_len", &self.window_len())
            .finish()
    }
}

/// The bytes of `id` in the tables' byte table (empty without one).
fn byte_table_get(tables: &DetokTables, id: u32) -> &[u8] {
    tables.bytes().map(|table| table.get(id)).unwrap_or(&[])
}

/// Token ids decoded through the tokenizer.
#[derive(Default)]
struct TokenWindow {
    /// Context tokens, then tokens emitted or pending.
    tokens: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl TokenWindow {
    fn push(&mut self, tables: &DetokTables, token: u32) -> Result<Option<String>, DetokError> {
        self.tokens.push(token);
        let prefix_text = self.decode(tables, self.prefix_offset, self.read_offset)?;
        let new_text = self.decode(tables, self.prefix_offset, self.tokens.len())?;
        if new_text.len() <= prefix_text.len() || new_text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(None);
        }
        let piece = suffix_after(&new_text, prefix_text.len()).to_owned();
        self.advance();
        Ok(if piece.is_empty() { None } else { Some(piece) })
    }

    fn finish(&mut self, tables: &DetokTables) -> Result<String, DetokError> {
        if self.read_offset == self.tokens.len() {
            return Ok(String::new());
        }
        let prefix_text = self.decode(tables, self.prefix_offset, self.read_offset)?;
        let new_text = self.decode(tables, self.prefix_offset, self.tokens.len())?;
        let piece = suffix_after(&new_text, prefix_text.len()).to_owned();
        self.advance();
        Ok(piece)
    }

    /// Decodes `tokens[from..to]`.
    fn decode(&self, tables: &DetokTables, from: usize, to: usize) -> Result<String, DetokError> {
        decode_ids(tables, self.tokens.get(from..to).unwrap_or(&[]))
    }

    /// Marks everything emitted; drops tokens before `prefix_offset` once
    /// the window grows long.
    fn advance(&mut self) {
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        if self.prefix_offset < COMPACT_AT {
            return;
        }
        self.tokens.drain(..self.prefix_offset);
        self.read_offset -= self.prefix_offset;
        self.prefix_offset = 0;
    }
}

/// Decodes ids already free of skipped special tokens. The window never
/// holds them, so the tokenizer is asked to skip nothing (which would also
/// drop the kept ones).
fn decode_ids(tables: &DetokTables, ids: &[u32]) -> Result<String, DetokError> {
    if ids.is_empty() {
        return Ok(String::new());
    }
    tables
        .tokenizer()
        .decode(ids, false)
        .map_err(|e| DetokError::Decode(e.to_string()))
}

/// `text` after its first `prefix_len` bytes, moved forward to a char
/// boundary if the window's decoding did not extend the prefix exactly.
pub(crate) fn suffix_after(text: &str, prefix_len: usize) -> &str {
    let mut at = prefix_len.min(text.len());
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
        assert_eq!(suffix_after("héllo", 1), "éllo");
        assert_eq!(suffix_after("héllo", 2), "llo");
        assert_eq!(suffix_after("ab", 3), "");
    }
}
