//! Constrained decoding in the reference engine.
//!
//! A real engine masks the logits at every step so the output stays in
//! the constraint's language; this one has no logits, so it writes the
//! whole answer first and then emits it token by token. Under
//! `json_schema` the answer is one compact JSON document valid for the
//! schema ([`schema`]); under `regex` a string the whole of which matches
//! ([`pattern`]). Every free choice is drawn from a generator keyed by the
//! request's state, seed and sequence index, like free decoding: the same
//! request gives the same answer, another seed another valid one.
//!
//! The text becomes token ids with the model's own tokenizer
//! ([`TextEncoder`], special tokens spelt out as text), and a [`Script`]
//! hands them to the sequence one per decode step, then EOS (finish reason
//! `stop`); `max_new_tokens` still cuts it (`length`). `ebnf_grammar` and
//! `structural_tag` are refused as UNIMPLEMENTED ([`check`]); a schema or
//! expression no answer can satisfy, or whose answers would be larger than
//! [`MAX_ANSWER_BYTES`], is INVALID_ARGUMENT when decoding starts.

mod pattern;
mod schema;

use std::sync::Arc;

use iris_fingerprint::{splitmix64, SplitMix64};
use iris_proto::scheduler::sampling_params::Constraint;
use tonic::Status;

use crate::model::{Finish, PromptState, SequenceParams, Step, Vocab};
use pattern::PatternGuide;
use schema::SchemaGuide;

/// Largest answer written for a constraint, in bytes.
pub const MAX_ANSWER_BYTES: usize = 64 << 10;

/// Refuses the constraints this engine cannot follow (before any work).
pub fn check(constraint: Option<&Constraint>) -> Result<(), Status> {
    match constraint {
        Some(Constraint::EbnfGrammar(_)) => Err(Status::unimplemented(
            "iris-engine does not follow EBNF grammars (ebnf_grammar); it follows json_schema and regex constraints",
        )),
        Some(Constraint::StructuralTag(_)) => Err(Status::unimplemented(
            "iris-engine does not follow structural tags (structural_tag); it follows json_schema and regex constraints",
        )),
        _ => Ok(()),
    }
}

/// A compiled constraint that answers can be written from.
#[derive(Debug, Clone)]
enum Guide {
    Json(SchemaGuide),
    Regex(PatternGuide),
}

impl Guide {
    fn compile(constraint: &Constraint) -> Result<Guide, Status> {
        match constraint {
            Constraint::JsonSchema(text) => SchemaGuide::compile(text)
                .map(Guide::Json)
                .map_err(|e| Status::invalid_argument(format!("json_schema: {e}"))),
            Constraint::Regex(text) => PatternGuide::compile(text)
                .map(Guide::Regex)
                .map_err(|e| Status::invalid_argument(format!("regex: {e}"))),
            other => check(Some(other)).and(Err(Status::internal("unchecked constraint"))),
        }
    }

    fn answer(&self, rng: &mut Rng) -> Result<String, Status> {
        match self {
            Guide::Json(guide) => guide
                .generate(rng, MAX_ANSWER_BYTES)
                .map_err(|e| Status::invalid_argument(format!("json_schema: {e}"))),
            Guide::Regex(guide) => guide
                .generate(rng, MAX_ANSWER_BYTES)
                .map_err(|e| Status::invalid_argument(format!("regex: {e}"))),
        }
    }
}

/// The pseudo-random choices of one constrained sequence.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    /// The generator of sequence `params.index` of a request in `state`.
    fn for_sequence(state: &PromptState, params: &SequenceParams) -> Self {
        let mut head = [0u8; 8];
        head.copy_from_slice(&state.constraint_key()[8..16]);
        Rng(SplitMix64(
            u64::from_le_bytes(head)
                ^ splitmix64(params.seed ^ 0x636f_6e73_7472_6169)
                ^ splitmix64(u64::from(params.index)),
        ))
    }

    /// A generator seeded with `seed` (tests).
    #[cfg(test)]
    pub fn seeded(seed: u64) -> Self {
        Rng(SplitMix64(seed))
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        match n {
            0 => 0,
            n => self.0.next_u64() % n,
        }
    }

    /// A value in `lo..=hi` (`lo` when `hi < lo`).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below((hi - lo).saturating_add(1))
    }
}

/// The model's tokenizer, turning answers into token ids.
#[derive(Clone)]
pub struct TextEncoder(Arc<tokenizers::Tokenizer>);

impl TextEncoder {
    /// Wraps `tokenizer`; special tokens' text in an answer is encoded as
    /// plain text, never as the special token.
    pub fn new(mut tokenizer: tokenizers::Tokenizer) -> Self {
        tokenizer.set_encode_special_tokens(true);
        TextEncoder(Arc::new(tokenizer))
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, Status> {
        self.0
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Status::internal(format!("cannot tokenize the constrained answer: {e}")))
    }
}

/// The token ids of a constrained answer, emitted one per step.
#[derive(Debug, Clone)]
pub struct Script {
    tokens: Vec<u32>,
    next: usize,
}

impl Script {
    /// The next step: the answer's next token, then EOS. The caller has
    /// checked `max_new_tokens` and counts the step in `produced`.
    pub fn draw(
        &mut self,
        produced: &mut u32,
        params: &SequenceParams,
        vocab: &Vocab,
    ) -> Option<Step> {
        *produced += 1;
        let Some(&token) = self.tokens.get(self.next) else {
            let eos = vocab.eos.first().copied()?;
            return Some(Step {
                token: eos,
                finish: Some(Finish::Stop(eos)),
                logprobs: forced(eos, params),
            });
        };
        self.next += 1;
        let finish = if params.stop_token_ids.contains(&token) {
            Some(Finish::Stop(token))
        } else if *produced >= params.max_new_tokens {
            Some(Finish::Length)
        } else {
            None
        };
        Some(Step {
            token,
            finish,
            logprobs: forced(token, params),
        })
    }
}

/// `script` past the constrained output already `written`.
fn resumed(mut script: Script, written: &[u32]) -> Result<Script, Status> {
    if !script.tokens.starts_with(written) {
        return Err(Status::failed_precondition(format!(
            "constrained_prefix_tokens: the {} tokens already written are not the start of this engine's answer; the constraint cannot resume from them",
            written.len()
        )));
    }
    script.next = written.len();
    Ok(script)
}

/// The log probabilities of a token the constraint forces, when asked:
/// certain (0), and the only candidate.
fn forced(token: u32, params: &SequenceParams) -> Option<(f32, Vec<(u32, f32)>)> {
    params.top_logprobs.map(|_| (0.0, vec![(token, 0.0)]))
}

/// One script per sequence of a request (all `None` without a
/// constraint), written on the blocking pool: compiling a large schema
/// and tokenizing the answer take CPU.
///
/// A request resuming a constraint (`written`: the constrained output
/// already written, the end of its input) gets the scripts of the prompt
/// before it ([`PromptState::constraint_key`]), each checked to begin with
/// `written` and resumed after it: the same answer an uninterrupted run
/// gives. One that does not begin so (another engine's answer) is
/// FAILED_PRECONDITION.
pub async fn scripts(
    constraint: Option<&Constraint>,
    encoder: &TextEncoder,
    state: &PromptState,
    sequences: &[SequenceParams],
    written: &[u32],
) -> Result<Vec<Option<Script>>, Status> {
    let Some(constraint) = constraint.cloned() else {
        return Ok(vec![None; sequences.len()]);
    };
    let rngs: Vec<Rng> = sequences
        .iter()
        .map(|p| Rng::for_sequence(state, p))
        .collect();
    let encoder = encoder.clone();
    let written = written.to_vec();
    tokio::task::spawn_blocking(move || {
        let guide = Guide::compile(&constraint)?;
        rngs.into_iter()
            .map(|mut rng| {
                let text = guide.answer(&mut rng)?;
                let tokens = encoder.encode(&text)?;
                resumed(Script { tokens, next: 0 }, &written).map(Some)
            })
            .collect()
    })
    .await
    .map_err(|e| Status::internal(format!("constrained decoding task failed: {e}")))?
}

#[cfg(test)]
mod tests;
