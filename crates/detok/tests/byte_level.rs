//! The byte-level fast path against the tokenizer: random id sequences
//! (characters split across tokens, invalid bytes, special tokens skipped,
//! kept or shown, added tokens whose text is outside the byte-level
//! alphabet, unknown ids, prompt context, flushes mid-stream) give the same
//! pieces, step by step, as the window decoded through the tokenizer, and
//! the same text as decoding the whole sequence.

use std::sync::Arc;

use iris_detok::{DetokTables, IncrementalDecoder};
use iris_model::tiny::{self, ENDOFTEXT_ID, IM_END_ID, IM_START_ID, ORDINARY_VOCAB_SIZE};
use iris_testkit::Rng;
use tokenizers::{AddedToken, Tokenizer};

/// Added tokens: raw text with a space (outside the alphabet), text whose
/// characters are all in the alphabet (`é` stands for byte 0xE9), CJK.
const ADDED: [&str; 3] = ["hello world", "café", "日本"];

struct Fixture {
    tok: Arc<Tokenizer>,
    fast: Arc<DetokTables>,
    window: Arc<DetokTables>,
    /// Ids to draw from.
    pool: Vec<u32>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    tiny::write_tiny_qwen2_vl(dir.path()).expect("write tiny model");
    let mut tok = Tokenizer::from_file(dir.path().join("tokenizer.json")).expect("load tokenizer");
    let added: Vec<AddedToken> = ADDED.iter().map(|t| AddedToken::from(*t, false)).collect();
    assert_eq!(tok.add_tokens(&added), ADDED.len());
    let tok = Arc::new(tok);
    let mut pool: Vec<u32> = (0..ORDINARY_VOCAB_SIZE).collect();
    for text in ["你好 😀 ñ — 👨‍👩‍👧", "café 日本 hello world"] {
        pool.extend(tok.encode(text, false).expect("encode").get_ids());
    }
    pool.extend(ADDED.iter().filter_map(|t| tok.token_to_id(t)));
    pool.extend([ENDOFTEXT_ID, IM_START_ID, IM_END_ID, 1_000_000]);
    let fast = Arc::new(DetokTables::new(tok.clone()));
    assert!(
        fast.is_byte_level(),
        "the tiny tokenizer decodes byte-level"
    );
    let window = Arc::new(DetokTables::window_only(tok.clone()));
    Fixture {
        tok,
        fast,
        window,
        pool,
    }
}

/// How special tokens are treated: skipped, skipped but one kept, shown.
const MODES: [(bool, &[u32]); 3] = [(true, &[]), (true, &[IM_START_ID]), (false, &[])];

fn random_ids(rng: &mut Rng, pool: &[u32], max: usize) -> Vec<u32> {
    let len = rng.below(max + 1);
    (0..len).map(|_| pool[rng.below(pool.len())]).collect()
}

/// The text `ids` decode to in `mode`, by the tokenizer.
fn expected(tok: &Tokenizer, ids: &[u32], (skip, kept): (bool, &[u32])) -> String {
    let shown: Vec<u32> = ids
        .iter()
        .copied()
        .filter(|id| {
            !skip || ![ENDOFTEXT_ID, IM_START_ID, IM_END_ID].contains(id) || kept.contains(id)
        })
        .collect();
    tok.decode(&shown, false).expect("decode")
}

#[test]
fn byte_path_matches_window_step_by_step() {
    let f = fixture();
    let mut rng = Rng(37);
    for case in 0..600 {
        let tail = random_ids(&mut rng, &f.pool, 8);
        let ids = random_ids(&mut rng, &f.pool, 40);
        let mode = MODES[case % MODES.len()];
        let mut fast = IncrementalDecoder::keeping(f.fast.clone(), &tail, mode.0, mode.1);
        let mut window = IncrementalDecoder::keeping(f.window.clone(), &tail, mode.0, mode.1);
        assert!(fast.is_byte_level() && !window.is_byte_level());
        let mut at = 0;
        while at < ids.len() {
            let chunk = &ids[at..(at + 1 + rng.below(3)).min(ids.len())];
            at += chunk.len();
            let (a, b) = (fast.push_many(chunk), window.push_many(chunk));
            assert_eq!(a, b, "case {case} tail {tail:?} ids {ids:?} at {at}");
            if rng.below(10) == 0 {
                assert_eq!(
                    fast.finish(),
                    window.finish(),
                    "case {case} mid flush at {at}"
                );
            }
        }
        assert_eq!(fast.finish(), window.finish(), "case {case} ids {ids:?}");
        assert_eq!(
            fast.decode_all(&ids),
            window.decode_all(&ids),
            "case {case}"
        );
        assert_eq!(fast.decode_all(&ids), Ok(expected(&f.tok, &ids, mode)));
    }
}

#[test]
fn byte_path_stream_equals_whole_decode() {
    let f = fixture();
    let mut rng = Rng(91);
    for case in 0..600 {
        let ids = random_ids(&mut rng, &f.pool, 48);
        let mode = MODES[case % MODES.len()];
        let mut dec = IncrementalDecoder::keeping(f.fast.clone(), &[], mode.0, mode.1);
        let mut text = String::new();
        for &id in &ids {
            if let Some(piece) = dec.push(id).expect("push") {
                assert!(!piece.ends_with('\u{FFFD}'), "held tail emitted: {piece:?}");
                text.push_str(&piece);
            }
        }
        text.push_str(&dec.finish());
        assert_eq!(
            text,
            expected(&f.tok, &ids, mode),
            "case {case} ids {ids:?}"
        );
    }
}

#[test]
fn added_tokens_decode_as_the_tokenizer_does() {
    let f = fixture();
    for text in ADDED {
        let id = f.tok.token_to_id(text).expect("added id");
        let mut dec = IncrementalDecoder::new(f.fast.clone(), &[], true);
        let out = dec.push(id).expect("push").unwrap_or_default() + &dec.finish();
        assert_eq!(out, f.tok.decode(&[id], false).expect("decode"), "{text}");
    }
    // `é` is in the byte-level alphabet: the added token is bytes, not text.
    let cafe = f.tok.token_to_id("café").expect("id");
    assert_eq!(f.tok.decode(&[cafe], false).expect("decode"), "caf\u{FFFD}");
}

/// A byte-level tokenizer over a word vocabulary with a gap in its ids, a
/// word at `far_id` and an added special token (its id follows the
/// vocabulary's: the tokenizer assigns it).
fn word_tokenizer(far_id: u32) -> Arc<Tokenizer> {
    let json = format!(
        r#"{{
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{{"id": 10, "content": "<|end|>", "single_word": false,
    "lstrip": false, "rstrip": false, "normalized": false, "special": true}}],
  "normalizer": null, "pre_tokenizer": null, "post_processor": null,
  "decoder": {{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
    "use_regex": false}},
  "model": {{"type": "WordLevel", "unk_token": "<unk>", "vocab": {{
    "<unk>": 0, "Hello": 1, "Ġworld": 2, "Ã": 3, "©": 4, "ĠcafÃ©": 9, "Ġfar": {far_id}}}}}
}}"#
    );
    Arc::new(Tokenizer::from_bytes(json.as_bytes()).expect("word tokenizer"))
}

fn decode_stream(tables: &Arc<DetokTables>, ids: &[u32], skip: bool) -> String {
    let mut dec = IncrementalDecoder::new(tables.clone(), &[], skip);
    let mut text = String::new();
    for &id in ids {
        text.push_str(&dec.push(id).expect("push").unwrap_or_default());
    }
    text + &dec.finish()
}

#[test]
fn ids_with_gaps_and_far_ids_decode_as_the_tokenizer_does() {
    // 20 is a near id (a table is built, with empty rows in the gaps);
    // 3_000_000_000 is past any table (the window path is used).
    for (far, byte_level) in [(20, true), (3_000_000_000, false)] {
        let tok = word_tokenizer(far);
        let end = tok.token_to_id("<|end|>").expect("added token");
        let tables = Arc::new(DetokTables::new(tok.clone()));
        assert_eq!(tables.is_byte_level(), byte_level, "far id {far}");
        let ids = [1, 2, 3, 5, 4, 9, far, end, 7, u32::MAX, 2];
        for skip in [true, false] {
            let expected = tok.decode(&ids, skip).expect("decode");
            assert_eq!(decode_stream(&tables, &ids, skip), expected, "far id {far}");
        }
        assert_eq!(decode_stream(&tables, &[1, 3, 4, 9], true), "Helloé café");
    }
}
