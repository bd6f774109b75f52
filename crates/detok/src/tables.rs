//! Per-tokenizer tables the decoders share: built once when a model is
//! loaded, then read by every request's decoders.
//!
//! - which ids are special (dropped when special tokens are skipped), as a
//!   sorted list, so a decoder neither rebuilds nor clones it;
//! - for tokenizers whose decoder is exactly byte-level BPE (GPT-2, Llama 3,
//!   Qwen2/2.5/3), the bytes each id decodes to, so decoding is appending
//!   bytes instead of running the tokenizer's decoder.
//!
//! The byte-level decoder maps each character of a token back through the
//! byte-level alphabet (256 printable characters standing for the 256
//! bytes); a token with a character outside the alphabet (an added token's
//! raw text) decodes to its UTF-8 bytes as they are. The decoded text is
//! the concatenation of every token's bytes, read as lossy UTF-8.

use std::sync::Arc;

use tokenizers::{DecoderWrapper, Tokenizer};

/// What the decoders of one tokenizer share.
pub struct DetokTables {
    tokenizer: Arc<Tokenizer>,
    special: IdSet,
    bytes: Option<ByteTable>,
}

impl DetokTables {
    /// The tables of `tokenizer`, with the byte table when its decoder is
    /// exactly byte-level (and its ids and bytes fit a table).
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        let bytes = if is_byte_level(&tokenizer) {
            ByteTable::of(&tokenizer)
        } else {
            None
        };
        Self::with_bytes(tokenizer, bytes)
    }

    /// The tables of `tokenizer` without the byte table: decoders always
    /// decode through the tokenizer (the general path; for comparisons).
    pub fn window_only(tokenizer: Arc<Tokenizer>) -> Self {
        Self::with_bytes(tokenizer, None)
    }

    fn with_bytes(tokenizer: Arc<Tokenizer>, bytes: Option<ByteTable>) -> Self {
        let special = IdSet::from_ids(
            tokenizer
                .get_added_tokens_decoder()
                .into_iter()
                .filter(|(_, token)| token.special)
                .map(|(id, _)| id),
        );
        Self {
            tokenizer,
            special,
            bytes,
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Whether decoders append precomputed bytes instead of decoding
    /// through the tokenizer.
    pub fn is_byte_level(&self) -> bool {
        self.bytes.is_some()
    }

    /// Whether `id` is a special token (`decode(.., true)` drops it).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(id)
    }

    /// Every id's decoded bytes, for byte-level tokenizers.
    pub(crate) fn bytes(&self) -> Option<&ByteTable> {
        self.bytes.as_ref()
    }
}

impl std::fmt::Debug for DetokTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DetokTables")
            .field("byte_level", &self.is_byte_level())
            .finish_non_exhaustive()
    }
}

/// Whether decoding is the byte-level decoder and nothing else.
fn is_byte_level(tokenizer: &Tokenizer) -> bool {
    matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_)))
}

/// A set of token ids, sorted (a few hundred at most: a binary search is
/// a handful of comparisons, and any id fits).
#[derive(Debug, Default)]
struct IdSet {
    ids: Vec<u32>,
}

impl IdSet {
    fn from_ids(ids: impl IntoIterator<Item = u32>) -> Self {
        let mut ids: Vec<u32> = ids.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        IdSet { ids }
    }

    /// Ordinary ids (below the first special one, as in most
    /// vocabularies) are answered without the search.
    fn contains(&self, id: u32) -> bool {
        match (self.ids.first(), self.ids.last()) {
            (Some(&first), Some(&last)) if (first..=last).contains(&id) => {
                self.ids.binary_search(&id).is_ok()
            }
            _ => false,
        }
    }
}

/// Ids past which no byte table is built (the tokenizer's file names an
/// id far beyond any real vocabulary): such tokenizers take the window path.
const MAX_TABLE_IDS: u32 = 1 << 24;

/// Every id's decoded bytes, back to back.
pub(crate) struct ByteTable {
    data: Vec<u8>,
    /// `ends[id]`: where id's bytes end in `data` (they start at the
    /// previous id's end).
    ends: Vec<u32>,
}

impl ByteTable {
    /// The table of `tokenizer`; `None` when its ids pass
    /// `MAX_TABLE_IDS` or its bytes do not fit `u32` offsets.
    fn of(tokenizer: &Tokenizer) -> Option<Self> {
        let alphabet = Alphabet::new();
        let ids = id_count(tokenizer).filter(|&ids| ids <= MAX_TABLE_IDS)?;
        let mut data = Vec::new();
        let mut ends = Vec::with_capacity(ids as usize);
        for id in 0..ids {
            if let Some(token) = tokenizer.id_to_token(id) {
                alphabet.append_bytes(&token, &mut data);
            }
            ends.push(u32::try_from(data.len()).ok()?);
        }
        Some(ByteTable { data, ends })
    }

    /// The bytes of `id` (empty for ids the tokenizer does not know, which
    /// decoding drops).
    pub(crate) fn get(&self, id: u32) -> &[u8] {
        let id = id as usize;
        let Some(&end) = self.ends.get(id) else {
            return &[];
        };
        let start = if id == 0 { 0 } else { self.ends[id - 1] };
        &self.data[start as usize..end as usize]
    }
}

/// One past the highest id the tokenizer knows (its model's and added
/// tokens'); `None` past `u32`.
fn id_count(tokenizer: &Tokenizer) -> Option<u32> {
    let highest = tokenizer.get_vocab(true).into_values().max();
    highest.map_or(Some(0), |id| id.checked_add(1))
}

/// The byte-level alphabet, read backwards: character to byte.
struct Alphabet {
    /// Indexed by the character's code (all below 0x144).
    bytes: [Option<u8>; 0x144],
}

impl Alphabet {
    /// Printable bytes stand for themselves; the other 68 bytes, in
    /// order, are U+0100 onwards.
    fn new() -> Self {
        let mut bytes = [None; 0x144];
        let mut next = 0x100;
        for byte in 0..=255u8 {
            let printable = matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            if printable {
                bytes[byte as usize] = Some(byte);
            } else {
                bytes[next] = Some(byte);
                next += 1;
            }
        }
        Alphabet { bytes }
    }

    fn byte(&self, c: char) -> Option<u8> {
        self.bytes.get(c as usize).copied().flatten()
    }

    /// Appends what `token` decodes to: its characters' bytes, or its
    /// UTF-8 text when a character is outside the alphabet.
    fn append_bytes(&self, token: &str, out: &mut Vec<u8>) {
        let start = out.len();
        for c in token.chars() {
            match self.byte(c) {
                Some(byte) => out.push(byte),
                None => {
                    out.truncate(start);
                    out.extend_from_slice(token.as_bytes());
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Alphabet, IdSet};

    #[test]
    fn alphabet_maps_printable_and_shifted_characters() {
        let alphabet = Alphabet::new();
        assert_eq!(alphabet.byte('a'), Some(b'a'));
        assert_eq!(alphabet.byte('Ġ'), Some(b' '));
        assert_eq!(alphabet.byte('Ċ'), Some(b'\n'));
        assert_eq!(alphabet.byte('\u{100}'), Some(0));
        assert_eq!(alphabet.byte(' '), None);
        assert_eq!(alphabet.byte('你'), None);
        let mut out = Vec::new();
        alphabet.append_bytes("ĠhiĊ", &mut out);
        assert_eq!(out, b" hi\n");
        out.clear();
        alphabet.append_bytes("a b", &mut out);
        assert_eq!(out, b"a b");
    }

    #[test]
    fn id_set_holds_exactly_its_ids() {
        let set = IdSet::from_ids([3, 64, 200]);
        for id in 0..300 {
            assert_eq!(set.contains(id), [3, 64, 200].contains(&id), "id {id}");
        }
        assert!(!set.contains(u32::MAX));
    }
}
