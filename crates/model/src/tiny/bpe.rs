//! A byte-level BPE vocabulary learned from [`super::words::WORDS`], and its
//! serialisation as `tokenizer.json`, `vocab.json` and `merges.txt` in the
//! Hugging Face layout Qwen2 uses.
//!
//! Training is a plain greedy BPE: count adjacent symbol pairs over the
//! weighted word list (each word with and without a leading space), merge
//! the most frequent pair (ties go to the smallest pair of ids), repeat until
//! the vocabulary has the requested size. Everything iterates in a fixed
//! order, so the output is the same on every run.

use std::collections::{BTreeMap, HashMap};

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{json, Value};

use crate::ModelError;

/// Qwen2's pre-tokenizer split pattern (contractions, letter runs with one
/// leading non-letter, single digits, punctuation runs, newlines, spaces).
pub(crate) const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The GPT-2 byte-to-character table: ids 0..256 in vocabulary order, each
/// with the byte it stands for and its printable character.
pub(crate) fn byte_alphabet() -> Vec<(u8, char)> {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut table: Vec<(u8, char)> = (0..=255u8)
        .filter(|&b| printable(b))
        .map(|b| (b, char::from(b)))
        .collect();
    let unprintable = (0..=255u8).filter(|&b| !printable(b));
    for (code, b) in (256u32..).zip(unprintable) {
        // 256..=323 are all valid scalar values.
        table.push((b, char::from_u32(code).unwrap_or('?')));
    }
    table
}

/// A learned vocabulary: tokens in id order and merges in rank order.
pub(crate) struct Bpe {
    pub(crate) vocab: Vec<String>,
    pub(crate) merges: Vec<(u32, u32)>,
}

/// Learns merges from `words` until the vocabulary holds `vocab_size` tokens.
pub(crate) fn train(words: &[&str], vocab_size: usize) -> Result<Bpe, ModelError> {
    let alphabet = byte_alphabet();
    let mut id_of_byte = [0u32; 256];
    for (id, &(byte, _)) in alphabet.iter().enumerate() {
        id_of_byte[usize::from(byte)] = id as u32;
    }
    let mut vocab: Vec<String> = alphabet.iter().map(|&(_, c)| c.to_string()).collect();
    let mut index: HashMap<String, u32> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let mut corpus = weighted_corpus(words, &id_of_byte);
    let mut merges = Vec::new();
    while vocab.len() < vocab_size {
        let Some((a, b)) = best_pair(&corpus) else {
            return Err(ModelError::Tiny {
                message: format!(
                    "word list exhausted at {} tokens, wanted {vocab_size}",
                    vocab.len()
                ),
            });
        };
        let merged = format!("{}{}", vocab[a as usize], vocab[b as usize]);
        let id = *index.entry(merged.clone()).or_insert_with(|| {
            vocab.push(merged);
            (vocab.len() - 1) as u32
        });
        merges.push((a, b));
        for (symbols, _) in &mut corpus {
            apply_merge(symbols, a, b, id);
        }
    }
    Ok(Bpe { vocab, merges })
}

/// Each word as byte-symbol ids, with a leading space (weight 4×) and without (1×);
/// earlier words in the list weigh more.
fn weighted_corpus(words: &[&str], id_of_byte: &[u32; 256]) -> Vec<(Vec<u32>, u64)> {
    let n = words.len() as u64;
    let mut corpus = Vec::with_capacity(words.len() * 2);
    for (rank, word) in words.iter().enumerate() {
        let base = n - rank as u64;
        let bytes = word.bytes().map(|b| id_of_byte[usize::from(b)]);
        corpus.push((
            std::iter::once(id_of_byte[usize::from(b' ')])
                .chain(bytes.clone())
                .collect(),
            4 * base,
        ));
        corpus.push((bytes.collect(), base));
    }
    corpus
}

fn best_pair(corpus: &[(Vec<u32>, u64)]) -> Option<(u32, u32)> {
    let mut counts: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for (symbols, weight) in corpus {
        for pair in symbols.windows(2) {
            *counts.entry((pair[0], pair[1])).or_insert(0) += weight;
        }
    }
    let mut best: Option<((u32, u32), u64)> = None;
    for (pair, count) in counts {
        if best.is_none_or(|(_, c)| count > c) {
            best = Some((pair, count));
        }
    }
    best.map(|(pair, _)| pair)
}

fn apply_merge(symbols: &mut Vec<u32>, a: u32, b: u32, merged: u32) {
    let mut out = Vec::with_capacity(symbols.len());
    let mut i = 0;
    while i < symbols.len() {
        if i + 1 < symbols.len() && symbols[i] == a && symbols[i + 1] == b {
            out.push(merged);
            i += 2;
        } else {
            out.push(symbols[i]);
            i += 1;
        }
    }
    *symbols = out;
}

impl Bpe {
    /// Merges as `"left right"` lines, rank order.
    pub(crate) fn merge_lines(&self) -> Vec<String> {
        self.merges
            .iter()
            .map(|&(a, b)| format!("{} {}", self.vocab[a as usize], self.vocab[b as usize]))
            .collect()
    }

    /// `merges.txt` as the slow GPT-2/Qwen2 tokenizers read it.
    pub(crate) fn merges_txt(&self) -> String {
        let mut text = String::from("#version: 0.2\n");
        for line in self.merge_lines() {
            text.push_str(&line);
            text.push('\n');
        }
        text
    }

    /// `vocab.json`: token → id, in id order.
    pub(crate) fn vocab_json(&self) -> Result<String, ModelError> {
        to_pretty(&OrderedVocab(&self.vocab))
    }

    /// `tokenizer.json` with `special` appended as added tokens after the vocabulary.
    pub(crate) fn tokenizer_json(&self, special: &[&str]) -> Result<String, ModelError> {
        let first = self.vocab.len() as u32;
        let added_tokens: Vec<Value> = special
            .iter()
            .enumerate()
            .map(|(i, content)| added_token(first + i as u32, content))
            .collect();
        let merges = self.merge_lines();
        let file = TokenizerFile {
            version: "1.0",
            truncation: None,
            padding: None,
            added_tokens,
            normalizer: None,
            pre_tokenizer: pre_tokenizer(),
            post_processor: byte_level(),
            decoder: byte_level(),
            model: BpeModel {
                kind: "BPE",
                dropout: None,
                unk_token: None,
                continuing_subword_prefix: "",
                end_of_word_suffix: "",
                fuse_unk: false,
                byte_fallback: false,
                ignore_merges: false,
                vocab: OrderedVocab(&self.vocab),
                merges: &merges,
            },
        };
        to_pretty(&file)
    }
}

fn added_token(id: u32, content: &str) -> Value {
    json!({
        "id": id,
        "content": content,
        "single_word": false,
        "lstrip": false,
        "rstrip": false,
        "normalized": false,
        "special": true,
    })
}

fn pre_tokenizer() -> Value {
    json!({
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": { "Regex": QWEN2_SPLIT_REGEX },
                "behavior": "Isolated",
                "invert": false,
            },
            {
                "type": "ByteLevel",
                "add_prefix_space": false,
                "trim_offsets": false,
                "use_regex": false,
            },
        ],
    })
}

fn byte_level() -> Value {
    json!({
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": false,
        "use_regex": false,
    })
}

fn to_pretty<T: Serialize>(value: &T) -> Result<String, ModelError> {
    serde_json::to_string_pretty(value).map_err(|e| ModelError::Tiny {
        message: format!("cannot serialise tokenizer: {e}"),
    })
}

/// `tokenizer.json`'s top level, in the field order `tokenizers` writes.
#[derive(Serialize)]
struct TokenizerFile<'a> {
    version: &'static str,
    truncation: Option<()>,
    padding: Option<()>,
    added_tokens: Vec<Value>,
    normalizer: Option<()>,
    pre_tokenizer: Value,
    post_processor: Value,
    decoder: Value,
    model: BpeModel<'a>,
}

#[derive(Serialize)]
struct BpeModel<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    dropout: Option<f32>,
    unk_token: Option<String>,
    continuing_subword_prefix: &'static str,
    end_of_word_suffix: &'static str,
    fuse_unk: bool,
    byte_fallback: bool,
    ignore_merges: bool,
    vocab: OrderedVocab<'a>,
    merges: &'a [String],
}

/// Serialises tokens as a `{token: id}` map in id order.
struct OrderedVocab<'a>(&'a [String]);

impl Serialize for OrderedVocab<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (id, token) in self.0.iter().enumerate() {
            map.serialize_entry(token, &id)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_gpt2_order() {
        let a = byte_alphabet();
        assert_eq!(a.len(), 256);
        assert_eq!(a[0], (b'!', '!'));
        assert_eq!(a[93], (b'~', '~'));
        assert_eq!(a[94], (0xA1, '\u{A1}'));
        // The space byte is the 33rd non-printable byte: U+0100 + 32.
        assert!(a.contains(&(b' ', '\u{120}')));
        assert_eq!(a[255].1, '\u{143}');
    }

    #[test]
    fn training_is_deterministic_and_reaches_size() {
        let words = ["hello", "help", "world", "word"];
        let a = train(&words, 266).unwrap();
        let b = train(&words, 266).unwrap();
        assert_eq!(a.vocab.len(), 266);
        assert_eq!(a.vocab, b.vocab);
        assert_eq!(a.merges, b.merges);
    }

    #[test]
    fn training_reports_exhaustion() {
        assert!(train(&["ab"], 300).is_err());
    }
}
