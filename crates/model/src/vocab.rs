//! Which token ids are "ordinary": safe to emit on their own as text.

use std::collections::HashSet;

/// Ids that are not added/special tokens and whose single-token decode is
/// non-empty, valid UTF-8 without U+FFFD or control characters (text a
/// reader would see as garbage). Sorted ascending. A byte-level BPE
/// vocabulary has tokens holding partial UTF-8 sequences; those are left out.
pub fn ordinary_token_ids(tokenizer: &tokenizers::Tokenizer) -> Vec<u32> {
    let added: HashSet<u32> = tokenizer.get_added_tokens_decoder().into_keys().collect();
    let size = tokenizer.get_vocab_size(true) as u32;
    let mut ids: Vec<u32> = (0..size)
        .filter(|id| !added.contains(id))
        .filter(|&id| decodes_cleanly(tokenizer, id))
        .collect();
    ids.sort_unstable();
    ids
}

fn decodes_cleanly(tokenizer: &tokenizers::Tokenizer, id: u32) -> bool {
    if tokenizer.id_to_token(id).is_none() {
        return false;
    }
    match tokenizer.decode(&[id], false) {
        Ok(text) => !text.is_empty() && !text.chars().any(|c| c == '\u{FFFD}' || c.is_control()),
        Err(_) => false,
    }
}
