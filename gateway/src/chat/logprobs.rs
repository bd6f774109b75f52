//! The worker's `OutputLogProbs` in OpenAI's shape: one
//! [`TokenLogprob`] per generated token, with the token's text (the
//! tokenizer's decoding of that one id, special tokens included) and its
//! UTF-8 bytes, and the alternatives the worker reported.

use iris_openai::{TokenLogprob, TopLogprob};
use iris_proto::scheduler::OutputLogProbs;
use tokenizers::Tokenizer;

/// One entry per token of `lp` (token ids and log probabilities are
/// parallel lists; a shorter list ends the entries, a missing `top` list
/// gives no alternatives).
pub fn entries(tokenizer: &Tokenizer, lp: &OutputLogProbs) -> Vec<TokenLogprob> {
    lp.token_ids
        .iter()
        .zip(&lp.token_logprobs)
        .enumerate()
        .map(|(i, (&id, &logprob))| {
            let top = lp.top_logprobs.get(i).map_or_else(Vec::new, |top| {
                top.token_ids
                    .iter()
                    .zip(&top.values)
                    .map(|(&id, &logprob)| TopLogprob::new(token_text(tokenizer, id), logprob))
                    .collect()
            });
            TokenLogprob::new(TopLogprob::new(token_text(tokenizer, id), logprob), top)
        })
        .collect()
}

/// The text of one token; an id the tokenizer cannot decode reads as
/// empty.
fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_proto::scheduler::TopLogProbs;

    fn tokenizer() -> Tokenizer {
        let model = iris_testkit::model::tiny_model();
        Tokenizer::from_file(model.path().join("tokenizer.json")).expect("tokenizer")
    }

    #[test]
    fn entries_carry_text_bytes_and_alternatives() {
        let tok = tokenizer();
        let ids = tok.encode("hello world", false).expect("encode");
        let ids = ids.get_ids();
        let lp = OutputLogProbs {
            token_ids: ids.to_vec(),
            token_logprobs: vec![-0.5; ids.len()],
            top_logprobs: vec![TopLogProbs {
                values: vec![-0.5, f32::NEG_INFINITY],
                token_ids: vec![ids[0], ids[0]],
            }],
        };
        let got = entries(&tok, &lp);
        assert_eq!(got.len(), ids.len());
        let text: String = got.iter().map(|e| e.token.as_str()).collect();
        assert_eq!(text, "hello world");
        for e in &got {
            assert_eq!(e.bytes.as_deref(), Some(e.token.as_bytes()));
        }
        assert_eq!(got[0].top_logprobs.len(), 2);
        assert_eq!(got[0].top_logprobs[1].logprob, iris_openai::VERY_UNLIKELY);
        assert!(got[1].top_logprobs.is_empty());
    }
}
