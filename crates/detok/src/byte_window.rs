//! The decoding window of byte-level tokenizers, over bytes.
//!
//! A byte-level tokenizer decodes a run of tokens to the lossy UTF-8 of
//! their bytes, concatenated ([`crate::DetokTables`] holds each id's bytes).
//! [`ByteWindow`] applies the window rules of
//! [`crate::IncrementalDecoder`] to those bytes: it decodes
//! `bytes[prefix..read]` and `bytes[prefix..]`; when the second is longer
//! and does not end in U+FFFD, the difference is new text and both offsets
//! move forward. It gives the same pieces as decoding the ids through the
//! tokenizer, without the tokenizer. Bytes before `prefix` are dropped as
//! soon as it moves (nothing reads them), and the prefix's decoded length
//! is computed once per move rather than once per token.

use crate::decoder::suffix_after;

/// The bytes of the tokens from the window's prefix on.
#[derive(Debug, Default)]
pub(crate) struct ByteWindow {
    /// Bytes of the context tokens, then of the pending ones.
    bytes: Vec<u8>,
    /// Where the pending tokens' bytes start.
    read: usize,
    /// Length of `bytes[..read]` decoded (lossy).
    prefix_text_len: usize,
    /// Tokens before `read`.
    context_tokens: usize,
    /// Tokens after `read` (not emitted yet).
    pending_tokens: usize,
}

impl ByteWindow {
    /// Adds a prompt token's bytes as context (never emitted).
    pub(crate) fn add_context(&mut self, token: &[u8]) {
        self.bytes.extend_from_slice(token);
        self.read = self.bytes.len();
        self.context_tokens += 1;
        self.prefix_text_len = String::from_utf8_lossy(&self.bytes).len();
    }

    /// Adds one token's bytes; returns the text they complete, if any.
    pub(crate) fn push(&mut self, token: &[u8]) -> Option<String> {
        self.bytes.extend_from_slice(token);
        self.pending_tokens += 1;
        let new_text = String::from_utf8_lossy(&self.bytes);
        if new_text.len() <= self.prefix_text_len || new_text.ends_with(char::REPLACEMENT_CHARACTER)
        {
            return None;
        }
        let piece = suffix_after(&new_text, self.prefix_text_len).to_owned();
        self.advance();
        (!piece.is_empty()).then_some(piece)
    }

    /// Flushes the pending bytes, lossy.
    pub(crate) fn finish(&mut self) -> String {
        if self.pending_tokens == 0 {
            return String::new();
        }
        let new_text = String::from_utf8_lossy(&self.bytes);
        let piece = suffix_after(&new_text, self.prefix_text_len).to_owned();
        self.advance();
        piece
    }

    /// Tokens in the window.
    pub(crate) fn len(&self) -> usize {
        self.context_tokens + self.pending_tokens
    }

    /// Marks the pending bytes emitted: they become the new prefix.
    fn advance(&mut self) {
        self.bytes.drain(..self.read);
        self.read = self.bytes.len();
        self.prefix_text_len = String::from_utf8_lossy(&self.bytes).len();
        self.context_tokens = self.pending_tokens;
        self.pending_tokens = 0;
    }
}
