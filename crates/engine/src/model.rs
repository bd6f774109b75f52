//! The reference engine's deterministic "model".
//!
//! Prefill folds the prompt's token ids and the bytes of every multimodal
//! item (its embedding, or its pixels when no encoder is involved) into a
//! SHA-256 digest: the request's state. An item enters the digest as its
//! length and a 256-bit [`fingerprint`] of its bytes (`iris-fingerprint`) — every byte still
//! counts, but a 50 MB pixel tensor is read once at memory speed instead
//! of hashed with SHA-256 (≈ 25 ms of CPU per 1080p image), so the
//! "zero-cost" reference worker stays cheap next to the gateways it tests. Decode draws each output token from
//! the tokenizer's ordinary tokens with a keyed pseudo-random function of
//! (state, seed, sequence index, step), as the best of a few scored
//! candidates ([`crate::scores`]: where `logit_bias` and the reported log
//! probabilities come in). The same inputs therefore always
//! give the same tokens, on any worker, in any role split — which is what
//! lets tests check that the embeddings and KV state really travelled.

use iris_fingerprint::{fingerprint, splitmix64};
use sha2::{Digest, Sha256};

use crate::constrained::Script;
use crate::scores::{StepInput, StepScores};

/// Version tag folded into every digest, so a change of the scheme changes
/// every output.
const DIGEST_TAG: &[u8] = b"iris-engine/state/v2";

/// What a prefill leaves for decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptState {
    pub digest: [u8; 32],
    pub prompt_tokens: u32,
    /// For a request resuming a constraint (its last input tokens are
    /// constrained output already written): the digest of the prompt
    /// before them, which its constrained answers are drawn from.
    pub constraint_digest: Option<[u8; 32]>,
}

/// What a prompt's state keeps of one multimodal item: its length and a
/// 256-bit fingerprint of its bytes.
pub type ItemPrint = (u64, [u8; 32]);

/// The print of an item's bytes (hashes every byte).
pub fn print_of(item: &[u8]) -> ItemPrint {
    (item.len() as u64, fingerprint(item))
}

impl PromptState {
    /// Folds a prompt and its multimodal payloads into a state.
    /// Hashes every byte: callers run it on a blocking thread.
    pub fn prefill<'a>(input_ids: &[u32], items: impl IntoIterator<Item = &'a [u8]>) -> Self {
        Self::prefill_resuming(input_ids, items, 0)
    }

    /// [`Self::prefill`] of a request whose last `resumed` input tokens
    /// are constrained output already written (0: none).
    pub fn prefill_resuming<'a>(
        input_ids: &[u32],
        items: impl IntoIterator<Item = &'a [u8]>,
        resumed: usize,
    ) -> Self {
        let prints: Vec<ItemPrint> = items.into_iter().map(print_of).collect();
        Self::from_prints(input_ids, &prints, resumed)
    }

    /// [`Self::prefill_resuming`] from the items' prints ([`print_of`]),
    /// some of them kept from an earlier request.
    pub fn from_prints(input_ids: &[u32], prints: &[ItemPrint], resumed: usize) -> Self {
        let before = input_ids.len().saturating_sub(resumed);
        PromptState {
            digest: digest_of(input_ids, prints),
            prompt_tokens: u32::try_from(input_ids.len()).unwrap_or(u32::MAX),
            constraint_digest: (resumed > 0).then(|| digest_of(&input_ids[..before], prints)),
        }
    }

    /// What constrained answers are drawn from.
    pub fn constraint_key(&self) -> &[u8; 32] {
        self.constraint_digest.as_ref().unwrap_or(&self.digest)
    }

    /// The state as sent to a decode worker: the digest, then the
    /// constraint's when it has one.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = self.digest.to_vec();
        out.extend(self.constraint_digest.iter().flatten());
        out
    }

    /// Rebuilds a state received from another worker ([`Self::to_bytes`]).
    pub fn from_bytes(bytes: &[u8], prompt_tokens: u32) -> Option<Self> {
        let (digest, constraint) = match bytes.len() {
            32 => (bytes, None),
            64 => (&bytes[..32], Some(&bytes[32..])),
            _ => return None,
        };
        Some(PromptState {
            digest: digest.try_into().ok()?,
            prompt_tokens,
            constraint_digest: constraint.and_then(|c| c.try_into().ok()),
        })
    }
}

/// The SHA-256 of the digest tag, `input_ids` and the items' lengths and
/// fingerprints.
fn digest_of(input_ids: &[u32], prints: &[(u64, [u8; 32])]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(DIGEST_TAG);
    hasher.update((input_ids.len() as u64).to_le_bytes());
    for id in input_ids {
        hasher.update(id.to_le_bytes());
    }
    for (len, print) in prints {
        hasher.update(len.to_le_bytes());
        hasher.update(print);
    }
    hasher.finalize().into()
}

/// The vocabulary decode draws from.
#[derive(Debug, Clone)]
pub struct Vocab {
    /// Ordinary (non-special) tokens that decode to clean text.
    pub ordinary: Vec<u32>,
    /// End-of-sequence tokens; the first is the one emitted.
    pub eos: Vec<u32>,
    /// Chance per step, in parts per million, that the model emits EOS.
    pub eos_ppm: u32,
}

/// Limits of one sequence, already validated.
#[derive(Debug, Clone)]
pub struct SequenceParams {
    pub max_new_tokens: u32,
    pub min_new_tokens: u32,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub seed: u64,
    pub index: u32,
    /// (token, bias) pairs, each token once.
    pub logit_bias: Vec<(u32, f32)>,
    /// `Some(k)`: report each token's log probability and `k` alternatives.
    pub top_logprobs: Option<u32>,
}

/// Why a sequence ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// EOS or a stop token; carries the matched token id.
    Stop(u32),
    Length,
}

/// One decode step's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub token: u32,
    /// Set when this token ends the sequence.
    pub finish: Option<Finish>,
    /// The token's log probability and the most likely tokens with theirs,
    /// when the sequence reports them.
    pub logprobs: Option<(f32, Vec<(u32, f32)>)>,
}

/// Draws the tokens of one sequence, step by step.
pub struct Sequence<'a> {
    vocab: &'a Vocab,
    key: u64,
    params: &'a SequenceParams,
    produced: u32,
    finished: bool,
    /// A constrained answer to emit instead of drawing.
    script: Option<Script>,
}

impl<'a> Sequence<'a> {
    pub fn new(state: &PromptState, vocab: &'a Vocab, params: &'a SequenceParams) -> Self {
        let mut head = [0u8; 8];
        head.copy_from_slice(&state.digest[..8]);
        let key = u64::from_le_bytes(head)
            ^ splitmix64(params.seed)
            ^ splitmix64(u64::from(params.index).wrapping_add(0x5851_f42d_4c95_7f2d));
        Sequence {
            vocab,
            key,
            params,
            produced: 0,
            finished: false,
            script: None,
        }
    }

    /// Emits `script`'s tokens (a constrained answer), then EOS.
    pub fn follow(mut self, script: Option<Script>) -> Self {
        self.script = script;
        self
    }

    /// The next token, or `None` once the sequence has finished.
    pub fn step(&mut self) -> Option<Step> {
        let step = self.draw()?;
        self.finished = step.finish.is_some();
        Some(step)
    }

    fn draw(&mut self) -> Option<Step> {
        if self.finished
            || self.produced >= self.params.max_new_tokens
            || self.vocab.ordinary.is_empty()
        {
            return None;
        }
        if let Some(script) = self.script.as_mut() {
            return script.draw(&mut self.produced, self.params, self.vocab);
        }
        let r = splitmix64(self.key ^ splitmix64(u64::from(self.produced)));
        self.produced += 1;
        let may_stop = self.produced > self.params.min_new_tokens;
        let may_end = may_stop && !self.params.ignore_eos;
        let scores = StepScores::new(
            r,
            &StepInput {
                ordinary: &self.vocab.ordinary,
                eos: self.vocab.eos.first().copied().filter(|_| may_end),
                eos_wanted: (r % 1_000_000) < u64::from(self.vocab.eos_ppm),
                bias: &self.params.logit_bias,
                barred: if may_end { &[] } else { &self.vocab.eos },
            },
        );
        let token = scores.drawn()?;
        let logprobs = self
            .params
            .top_logprobs
            .map(|k| scores.logprobs(k as usize));
        let stops = self.vocab.eos.contains(&token)
            || (may_stop && self.params.stop_token_ids.contains(&token));
        let finish = if stops {
            Some(Finish::Stop(token))
        } else if self.produced >= self.params.max_new_tokens {
            Some(Finish::Length)
        } else {
            None
        };
        Some(Step {
            token,
            finish,
            logprobs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(eos_ppm: u32) -> Vocab {
        Vocab {
            ordinary: (10..200).collect(),
            eos: vec![2, 3],
            eos_ppm,
        }
    }

    fn params(max: u32) -> SequenceParams {
        SequenceParams {
            max_new_tokens: max,
            min_new_tokens: 0,
            stop_token_ids: vec![],
            ignore_eos: false,
            seed: 0,
            index: 0,
            logit_bias: vec![],
            top_logprobs: None,
        }
    }

    fn run(state: &PromptState, vocab: &Vocab, params: &SequenceParams) -> Vec<Step> {
        let mut seq = Sequence::new(state, vocab, params);
        std::iter::from_fn(|| seq.step()).collect()
    }

    #[test]
    fn state_depends_on_every_input() {
        let base = PromptState::prefill(&[1, 2, 3], [&b"abc"[..]]);
        assert_eq!(base, PromptState::prefill(&[1, 2, 3], [&b"abc"[..]]));
        assert_ne!(base, PromptState::prefill(&[1, 2, 4], [&b"abc"[..]]));
        assert_ne!(base, PromptState::prefill(&[1, 2, 3], [&b"abd"[..]]));
        // Item boundaries matter: "ab"+"c" is not "abc".
        assert_ne!(
            base,
            PromptState::prefill(&[1, 2, 3], [&b"ab"[..], &b"c"[..]])
        );
    }

    #[test]
    fn output_is_deterministic_and_seeded() {
        let state = PromptState::prefill(&[5, 6], []);
        let v = vocab(0);
        let a = run(&state, &v, &params(32));
        assert_eq!(a, run(&state, &v, &params(32)));
        assert_eq!(a.len(), 32);
        assert_eq!(
            a.last().and_then(|s| s.finish.clone()),
            Some(Finish::Length)
        );
        let mut seeded = params(32);
        seeded.seed = 7;
        assert_ne!(a, run(&state, &v, &seeded));
        let mut second = params(32);
        second.index = 1;
        assert_ne!(a, run(&state, &v, &second));
        assert!(a.iter().all(|s| v.ordinary.contains(&s.token)));
    }

    #[test]
    fn eos_respects_min_and_ignore() {
        let state = PromptState::prefill(&[9], []);
        let always = vocab(1_000_000);
        let steps = run(&state, &always, &params(10));
        assert_eq!(
            steps,
            vec![Step {
                token: 2,
                finish: Some(Finish::Stop(2)),
                logprobs: None,
            }]
        );
        let mut p = params(10);
        p.min_new_tokens = 4;
        let steps = run(&state, &always, &p);
        assert_eq!(steps.len(), 5);
        assert_eq!(steps[4].finish, Some(Finish::Stop(2)));
        p.ignore_eos = true;
        assert_eq!(run(&state, &always, &p).len(), 10);
    }

    #[test]
    fn stop_token_ids_end_the_sequence() {
        let state = PromptState::prefill(&[1], []);
        let v = vocab(0);
        let free = run(&state, &v, &params(50));
        let target = free[5].token;
        let mut p = params(50);
        p.stop_token_ids = vec![target];
        let stopped = run(&state, &v, &p);
        let first = free
            .iter()
            .position(|s| s.token == target)
            .unwrap_or(usize::MAX);
        assert_eq!(stopped.len(), first + 1);
        assert_eq!(
            stopped.last().and_then(|s| s.finish.clone()),
            Some(Finish::Stop(target))
        );
    }

    fn tokens(steps: &[Step]) -> Vec<u32> {
        steps.iter().map(|s| s.token).collect()
    }

    #[test]
    fn logit_bias_forces_and_bans() {
        let state = PromptState::prefill(&[4], []);
        let v = vocab(0);
        let mut forced = params(12);
        forced.logit_bias = vec![(77, 100.0)];
        assert_eq!(tokens(&run(&state, &v, &forced)), vec![77; 12]);
        let free = run(&state, &v, &params(12));
        let mut banned = params(12);
        banned.logit_bias = vec![(free[0].token, -100.0)];
        let steps = run(&state, &v, &banned);
        assert_eq!(steps.len(), 12);
        assert!(steps.iter().all(|s| s.token != free[0].token));
        // A forced EOS ends the sequence at once, unless EOS is ignored.
        let mut eos = params(12);
        eos.logit_bias = vec![(3, 100.0)];
        let steps = run(&state, &v, &eos);
        assert_eq!(tokens(&steps), vec![3]);
        assert_eq!(steps[0].finish, Some(Finish::Stop(3)));
        eos.ignore_eos = true;
        assert!(run(&state, &v, &eos)
            .iter()
            .all(|s| !v.eos.contains(&s.token)));
    }

    #[test]
    fn logprobs_describe_the_draw() {
        let state = PromptState::prefill(&[8], []);
        let v = vocab(0);
        let free = run(&state, &v, &params(10));
        let mut asked = params(10);
        asked.top_logprobs = Some(5);
        let steps = run(&state, &v, &asked);
        assert_eq!(
            tokens(&steps),
            tokens(&free),
            "asking does not change the draw"
        );
        for step in &steps {
            let Some((logprob, top)) = &step.logprobs else {
                panic!("no logprobs in {step:?}");
            };
            assert_eq!(top.len(), 5);
            assert_eq!(top[0], (step.token, *logprob));
            assert!(*logprob < 0.0);
        }
        assert!(free.iter().all(|s| s.logprobs.is_none()));
    }
}
