//! The reference engine's deterministic "model".
//!
//! Prefill folds the prompt's token ids and the bytes of every multimodal
//! item (its embedding, or its pixels when no encoder is involved) into a
//! SHA-256 digest: the request's state. An item enters the digest as its
//! length and a 256-bit [`fingerprint`] of its bytes — every byte still
//! counts, but a 50 MB pixel tensor is read once at memory speed instead
//! of hashed with SHA-256 (≈ 25 ms of CPU per 1080p image), so the
//! "zero-cost" reference worker stays cheap next to the gateways it tests. Decode draws each output token from
//! the tokenizer's ordinary tokens with a keyed pseudo-random function of
//! (state, seed, sequence index, step). The same inputs therefore always
//! give the same tokens, on any worker, in any role split — which is what
//! lets tests check that the embeddings and KV state really travelled.

use sha2::{Digest, Sha256};

/// Version tag folded into every digest, so a change of the scheme changes
/// every output.
const DIGEST_TAG: &[u8] = b"iris-engine/state/v2";

/// What a prefill leaves for decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptState {
    pub digest: [u8; 32],
    pub prompt_tokens: u32,
}

impl PromptState {
    /// Folds a prompt and its multimodal payloads into a state.
    /// Hashes every byte: callers run it on a blocking thread.
    pub fn prefill<'a>(input_ids: &[u32], items: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(DIGEST_TAG);
        hasher.update((input_ids.len() as u64).to_le_bytes());
        for id in input_ids {
            hasher.update(id.to_le_bytes());
        }
        for item in items {
            hasher.update((item.len() as u64).to_le_bytes());
            hasher.update(fingerprint(item));
        }
        PromptState {
            digest: hasher.finalize().into(),
            prompt_tokens: u32::try_from(input_ids.len()).unwrap_or(u32::MAX),
        }
    }

    /// Rebuilds a state received from another worker.
    pub fn from_bytes(bytes: &[u8], prompt_tokens: u32) -> Option<Self> {
        let digest: [u8; 32] = bytes.try_into().ok()?;
        Some(PromptState {
            digest,
            prompt_tokens,
        })
    }
}

/// Lanes of [`fingerprint`]: 8 independent 64-bit multiply-rotate
/// chains, wide enough that the loop runs at memory bandwidth.
const LANES: usize = 8;
const PRIME_A: u64 = 0x9E37_79B9_7F4A_7C15;
const PRIME_B: u64 = 0xC2B2_AE3D_27D4_EB4F;

/// A fast, non-cryptographic 256-bit fingerprint of `bytes`: each 8-byte
/// word goes through a multiply-rotate chain (one per lane), the tail is
/// zero-padded, and the lanes are mixed with the length at the end. Any
/// change of a byte changes the fingerprint with overwhelming
/// probability for the inputs a test sends; it is not collision-resistant
/// against an adversary, which the reference worker does not need.
pub fn fingerprint(bytes: &[u8]) -> [u8; 32] {
    let mut lanes: [u64; LANES] =
        std::array::from_fn(|i| PRIME_B.wrapping_mul(i as u64 + 1) ^ bytes.len() as u64);
    let block = 8 * LANES;
    let mut blocks = bytes.chunks_exact(block);
    for chunk in &mut blocks {
        for (lane, word) in lanes.iter_mut().zip(chunk.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            *lane = round(*lane, u64::from_le_bytes(w));
        }
    }
    let rest = blocks.remainder();
    if !rest.is_empty() {
        let mut padded = [0u8; 8 * LANES];
        padded[..rest.len()].copy_from_slice(rest);
        for (lane, word) in lanes.iter_mut().zip(padded.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            *lane = round(*lane, u64::from_le_bytes(w) ^ rest.len() as u64);
        }
    }
    let mut out = [0u8; 32];
    for (i, part) in out.chunks_exact_mut(8).enumerate() {
        let mut h = bytes.len() as u64 ^ PRIME_A.wrapping_mul(i as u64 + 1);
        for (j, &lane) in lanes.iter().enumerate() {
            h = mix(h ^ lane.rotate_left((7 * (i + j)) as u32 % 64));
        }
        part.copy_from_slice(&h.to_le_bytes());
    }
    out
}

#[inline(always)]
fn round(acc: u64, word: u64) -> u64 {
    (acc ^ word.wrapping_mul(PRIME_B))
        .rotate_left(31)
        .wrapping_mul(PRIME_A)
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
}

/// Why a sequence ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// EOS or a stop token; carries the matched token id.
    Stop(u32),
    Length,
}

/// One decode step's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub token: u32,
    /// Set when this token ends the sequence.
    pub finish: Option<Finish>,
}

/// Draws the tokens of one sequence, step by step.
pub struct Sequence<'a> {
    vocab: &'a Vocab,
    key: u64,
    params: &'a SequenceParams,
    produced: u32,
    finished: bool,
}

impl<'a> Sequence<'a> {
    pub fn new(state: &PromptState, vocab: &'a Vocab, params: &'a SequenceParams) -> Self {
        let mut head = [0u8; 8];
        head.copy_from_slice(&state.digest[..8]);
        let key = u64::from_le_bytes(head)
            ^ mix(params.seed)
            ^ mix(u64::from(params.index).wrapping_add(0x5851_f42d_4c95_7f2d));
        Sequence {
            vocab,
            key,
            params,
            produced: 0,
            finished: false,
        }
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
        let r = mix(self.key ^ mix(u64::from(self.produced)));
        self.produced += 1;
        let may_stop = self.produced > self.params.min_new_tokens;
        let eos = self.vocab.eos.first().copied();
        if let (true, false, Some(eos)) = (may_stop, self.params.ignore_eos, eos) {
            if (r % 1_000_000) < u64::from(self.vocab.eos_ppm) {
                return Some(Step {
                    token: eos,
                    finish: Some(Finish::Stop(eos)),
                });
            }
        }
        let pick = (r >> 20) % self.vocab.ordinary.len() as u64;
        let token = self.vocab.ordinary[pick as usize];
        let finish = if may_stop && self.params.stop_token_ids.contains(&token) {
            Some(Finish::Stop(token))
        } else if self.produced >= self.params.max_new_tokens {
            Some(Finish::Length)
        } else {
            None
        };
        Some(Step { token, finish })
    }
}

/// SplitMix64's finaliser: a cheap bijective mixer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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
        }
    }

    fn run(state: &PromptState, vocab: &Vocab, params: &SequenceParams) -> Vec<Step> {
        let mut seq = Sequence::new(state, vocab, params);
        std::iter::from_fn(|| seq.step()).collect()
    }

    #[test]
    fn fingerprints_see_every_byte_and_the_length() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 253) as u8).collect();
        let base = fingerprint(&data);
        assert_eq!(base, fingerprint(&data));
        // Flip each byte position in a sample of every lane and the tail.
        for at in [0, 7, 8, 63, 64, 65, 5000, 9_983, 9_999] {
            let mut changed = data.clone();
            changed[at] ^= 1;
            assert_ne!(fingerprint(&changed), base, "byte {at}");
        }
        // Trailing zeros are not padding: the length counts.
        let mut longer = data.clone();
        longer.push(0);
        assert_ne!(fingerprint(&longer), base);
        assert_ne!(fingerprint(&[]), fingerprint(&[0]));
        // Swapping two words of different lanes changes it.
        let mut swapped = data.clone();
        swapped.swap(0, 8);
        assert_ne!(fingerprint(&swapped), base);
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
                finish: Some(Finish::Stop(2))
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
}
