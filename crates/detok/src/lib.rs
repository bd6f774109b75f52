//! iris-detok: turning generated token ids into streamed text.
//!
//! - [`IncrementalDecoder`] decodes ids one at a time into text pieces,
//!   holding back incomplete UTF-8 characters and keeping word spacing
//!   right for byte-level BPE and SentencePiece-style tokenizers.
//! - [`DetokTables`] holds what a tokenizer's decoders share (its special
//!   ids, and for byte-level tokenizers every id's bytes), built once per
//!   model.
//! - [`StopMatcher`] finds stop strings across pieces, holding back a tail
//!   that could still become one and never emitting the stop itself.

#![forbid(unsafe_code)]

mod byte_window;
mod decoder;
mod stop;
mod tables;

pub use decoder::{IncrementalDecoder, PROMPT_CONTEXT_TOKENS};
pub use stop::{StopMatcher, StopStep};
pub use tables::DetokTables;

/// A detokenization failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DetokError {
    /// The tokenizer failed to decode the window.
    #[error("decoding tokens failed: {0}")]
    Decode(String),
}
