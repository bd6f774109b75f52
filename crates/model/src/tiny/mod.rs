//! The tiny Qwen2-VL-shaped model directory used by demos and tests.
//!
//! [`write_tiny_qwen2_vl`] writes `config.json`, `tokenizer.json`,
//! `tokenizer_config.json`, `special_tokens_map.json`, `vocab.json`,
//! `merges.txt`, `generation_config.json` and `preprocessor_config.json`.
//! The tokenizer is a byte-level BPE laid out like Qwen2's, with
//! [`ORDINARY_VOCAB_SIZE`] ordinary tokens (256 byte symbols plus merges
//! learned from a small English word list) followed by the special tokens.
//! There are no weights. The output is identical byte for byte on every run.
//!
//! [`write_tiny_model`] writes the tiny model of any [`Family`]: the other
//! vision-language families' directories are described at [`FamilySpec`].

mod bpe;
mod families;
mod files;
mod template;
mod words;

use std::fs;
use std::path::Path;

pub use families::{
    special_id, write_family, write_tiny_model, Family, FamilySpec, FAMILY_FILES, NEWLINES_ID,
};
pub use template::{CHAT_TEMPLATE, DEFAULT_SYSTEM_MESSAGE};

use crate::ModelError;

/// Ordinary (byte-level BPE) tokens: ids `0..ORDINARY_VOCAB_SIZE`.
pub const ORDINARY_VOCAB_SIZE: u32 = 640;
/// `<|endoftext|>`: bos and pad token, and a generation stop id.
pub const ENDOFTEXT_ID: u32 = ORDINARY_VOCAB_SIZE;
/// `<|im_start|>`: opens a chat turn.
pub const IM_START_ID: u32 = ORDINARY_VOCAB_SIZE + 1;
/// `<|im_end|>`: closes a chat turn; the eos token.
pub const IM_END_ID: u32 = ORDINARY_VOCAB_SIZE + 2;
/// `<|vision_start|>`: opens an image or video span.
pub const VISION_START_ID: u32 = ORDINARY_VOCAB_SIZE + 3;
/// `<|vision_end|>`: closes an image or video span.
pub const VISION_END_ID: u32 = ORDINARY_VOCAB_SIZE + 4;
/// `<|vision_pad|>`: `vision_token_id` in Qwen2-VL configs.
pub const VISION_PAD_ID: u32 = ORDINARY_VOCAB_SIZE + 5;
/// `<|image_pad|>`: the image placeholder, repeated once per merged patch.
pub const IMAGE_PAD_ID: u32 = ORDINARY_VOCAB_SIZE + 6;
/// `<|video_pad|>`: the video placeholder.
pub const VIDEO_PAD_ID: u32 = ORDINARY_VOCAB_SIZE + 7;
/// Total tokens, and the config's `vocab_size`.
pub const VOCAB_SIZE: u32 = ORDINARY_VOCAB_SIZE + 8;
/// Maximum context length (`max_position_embeddings`, `model_max_length`).
pub const MAX_CONTEXT: u32 = 32768;
/// The language model's width, which the vision merger outputs.
pub const HIDDEN_SIZE: u32 = 64;

/// The special tokens in id order, as in Qwen2-VL.
pub const SPECIAL_TOKENS: [(&str, u32); 8] = [
    ("<|endoftext|>", ENDOFTEXT_ID),
    ("<|im_start|>", IM_START_ID),
    ("<|im_end|>", IM_END_ID),
    ("<|vision_start|>", VISION_START_ID),
    ("<|vision_end|>", VISION_END_ID),
    ("<|vision_pad|>", VISION_PAD_ID),
    ("<|image_pad|>", IMAGE_PAD_ID),
    ("<|video_pad|>", VIDEO_PAD_ID),
];

/// Names of the files [`write_tiny_qwen2_vl`] writes.
pub const FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "merges.txt",
    "preprocessor_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
];

/// Writes the tiny model into `dir` (created if needed; existing files of
/// the same names are overwritten).
pub fn write_tiny_qwen2_vl(dir: &Path) -> Result<(), ModelError> {
    fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, "create directory", e))?;
    for (name, contents) in files::render_all()? {
        let path = dir.join(name);
        fs::write(&path, contents).map_err(|e| ModelError::io(&path, "write", e))?;
    }
    Ok(())
}
