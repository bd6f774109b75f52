//! Detokenization CPU per answer: a decoder made, 16 generated tokens
//! pushed one at a time, then flushed, as a streamed 16-token chat does, on
//! the tiny byte-level tokenizer with Llama 3's count of reserved special
//! tokens added (256 in all). `window` decodes through the tokenizer (the
//! general path), `bytes` appends precomputed bytes (byte-level
//! tokenizers); `special_ids_per_decoder` is what every decoder used to
//! pay before the special ids were computed once per model.
//!
//! `cargo bench -p iris-detok --bench detok` (figures in docs/benchmarks.md)

use std::collections::HashSet;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use iris_detok::{DetokTables, IncrementalDecoder};
use tokenizers::{AddedToken, Tokenizer};

/// The answer: mixed text, so some characters span tokens.
const ANSWER: &str = "Sure! The café on Main Street opens at 9 — 你好 😀 see you";

fn tokenizer() -> Arc<Tokenizer> {
    let dir = tempfile::tempdir().expect("tempdir");
    iris_model::tiny::write_tiny_qwen2_vl(dir.path()).expect("write tiny model");
    let mut tok = Tokenizer::from_file(dir.path().join("tokenizer.json")).expect("tokenizer");
    let reserved: Vec<AddedToken> = (0..248)
        .map(|i| AddedToken::from(format!("<|reserved_special_token_{i}|>"), true))
        .collect();
    tok.add_special_tokens(&reserved);
    Arc::new(tok)
}

/// Decodes `ids` as one answer; returns the text's length.
fn answer(tables: &Arc<DetokTables>, ids: &[u32]) -> usize {
    let mut decoder = IncrementalDecoder::new(tables.clone(), &[], true);
    let mut len = 0;
    for &id in ids {
        if let Ok(Some(piece)) = decoder.push(id) {
            len += piece.len();
        }
    }
    len + decoder.finish().len()
}

fn bench_detok(c: &mut Criterion) {
    let tok = tokenizer();
    let ids = tok
        .encode(ANSWER, false)
        .expect("encode")
        .get_ids()
        .to_vec();
    assert!(ids.len() >= 16, "the answer is {} tokens", ids.len());
    let ids = &ids[..16];
    let bytes = Arc::new(DetokTables::new(tok.clone()));
    let window = Arc::new(DetokTables::window_only(tok.clone()));
    assert_eq!(answer(&bytes, ids), answer(&window, ids));
    let mut group = c.benchmark_group("detok_16_tokens");
    group.bench_function("window", |b| b.iter(|| answer(&window, black_box(ids))));
    group.bench_function("bytes", |b| b.iter(|| answer(&bytes, black_box(ids))));
    group.bench_function("special_ids_per_decoder", |b| {
        b.iter(|| {
            let set: HashSet<u32> = tok
                .get_added_tokens_decoder()
                .into_iter()
                .filter(|(_, token)| token.special)
                .map(|(id, _)| id)
                .collect();
            black_box(set.len())
        })
    });
    group.finish();
}

criterion_group!(benches, bench_detok);
criterion_main!(benches);
