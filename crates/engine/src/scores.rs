//! The reference model's distribution at one decode step.
//!
//! A step has a handful of scored candidates, derived from the step's
//! pseudo-random word `r`:
//!
//! - candidate 0 is the ordinary token `r` picks (what an unbiased step
//!   draws), score 0;
//! - candidates 1..[`CANDIDATES`] are further distinct ordinary tokens
//!   hashed from `r`, with scores strictly decreasing from −0.5 (candidate
//!   `j` between −j/2 and −(j+0.9)/2, so the order is fixed but the gaps
//!   vary);
//! - the end-of-sequence token, when the sequence may end, scores 1 on the
//!   steps where the model "wants" to stop (the engine's EOS rate) and
//!   [`FLOOR`] otherwise;
//! - every `logit_bias` token adds its bias to its score, entering at
//!   [`FLOOR`] when it is not a candidate yet.
//!
//! The step draws the best-scored candidate (the first on a tie), and the
//! log probabilities are the log-softmax of the scores over the candidates:
//! the drawn token always has the largest one. A bias of +100 therefore
//! always wins (unless another token has +100 too) and −100 never does
//! while any other candidate is left. Tokens outside the candidates have
//! no probability. The cost is a few dozen hashes per step, independent of
//! the vocabulary size.

use iris_fingerprint::splitmix64;

/// Scored ordinary tokens per step: enough for 20 alternatives.
pub const CANDIDATES: usize = 21;
/// The score of an end-of-sequence token the model does not want now and
/// of a biased token that is not a candidate: below every candidate.
pub const FLOOR: f32 = -(CANDIDATES as f32) / 2.0 - 1.0;

/// What shapes one step's scores besides `r`.
#[derive(Debug, Clone, Copy)]
pub struct StepInput<'a> {
    /// The tokens an unbiased step draws from (never empty).
    pub ordinary: &'a [u32],
    /// The end-of-sequence token, when the sequence may end now.
    pub eos: Option<u32>,
    /// Whether the model wants to end here (the EOS coin came up).
    pub eos_wanted: bool,
    /// (token, bias), each token once.
    pub bias: &'a [(u32, f32)],
    /// Tokens that may not be drawn this step (end-of-sequence ids while
    /// the sequence may not end).
    pub barred: &'a [u32],
}

/// The scored candidates of one step, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct StepScores {
    scored: Vec<(u32, f32)>,
}

impl StepScores {
    /// Scores the candidates of the step with word `r`.
    pub fn new(r: u64, input: &StepInput<'_>) -> Self {
        let mut scored: Vec<(u32, f32)> = Vec::with_capacity(CANDIDATES + 1 + input.bias.len());
        let ordinary = input.ordinary;
        scored.push((ordinary[((r >> 20) % ordinary.len() as u64) as usize], 0.0));
        let wanted = CANDIDATES.min(ordinary.len());
        // A token hashed twice is skipped; the bound keeps a tiny
        // vocabulary from looping long.
        for j in 1..(8 * CANDIDATES) as u64 {
            if scored.len() >= wanted {
                break;
            }
            let h = splitmix64(r ^ splitmix64(j));
            let token = ordinary[(h % ordinary.len() as u64) as usize];
            let jitter = (h >> 40) as f32 / (1u64 << 24) as f32 * 0.9;
            let rank = scored.len() as f32;
            add(&mut scored, token, -(rank + jitter) / 2.0);
        }
        if let Some(eos) = input.eos {
            let score = if input.eos_wanted { 1.0 } else { FLOOR };
            add(&mut scored, eos, score);
        }
        for &(token, bias) in input.bias {
            match scored.iter_mut().find(|(t, _)| *t == token) {
                Some((_, score)) => *score += bias,
                None => scored.push((token, FLOOR + bias)),
            }
        }
        scored.retain(|(t, _)| !input.barred.contains(t));
        // Stable: a tie keeps the candidate order.
        scored.sort_by(|a, b| b.1.total_cmp(&a.1));
        StepScores { scored }
    }

    /// The drawn token: the best-scored candidate.
    pub fn drawn(&self) -> Option<u32> {
        self.scored.first().map(|&(t, _)| t)
    }

    /// The drawn token's log probability and the `k` most likely tokens
    /// with theirs, most likely first.
    pub fn logprobs(&self, k: usize) -> (f32, Vec<(u32, f32)>) {
        let best = self.scored.first().map_or(0.0, |&(_, s)| f64::from(s));
        let sum: f64 = self
            .scored
            .iter()
            .map(|&(_, s)| (f64::from(s) - best).exp())
            .sum();
        let norm = best + sum.ln();
        let logprob = |s: f32| (f64::from(s) - norm) as f32;
        let top = self
            .scored
            .iter()
            .take(k)
            .map(|&(t, s)| (t, logprob(s)))
            .collect();
        (self.scored.first().map_or(0.0, |&(_, s)| logprob(s)), top)
    }
}

/// Adds `token` unless it is a candidate already (the first score stays).
fn add(scored: &mut Vec<(u32, f32)>, token: u32, score: f32) {
    if !scored.iter().any(|(t, _)| *t == token) {
        scored.push((token, score));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(ordinary: &'a [u32], bias: &'a [(u32, f32)]) -> StepInput<'a> {
        StepInput {
            ordinary,
            eos: Some(2),
            eos_wanted: false,
            bias,
            barred: &[],
        }
    }

    #[test]
    fn unbiased_draw_is_the_first_candidate_and_most_likely() {
        let ordinary: Vec<u32> = (10..200).collect();
        for r in [1u64, 99, 12345, u64::MAX] {
            let scores = StepScores::new(r, &input(&ordinary, &[]));
            let expected = ordinary[((r >> 20) % ordinary.len() as u64) as usize];
            assert_eq!(scores.drawn(), Some(expected));
            let (logprob, top) = scores.logprobs(20);
            assert_eq!(top.len(), 20);
            assert_eq!(top[0], (expected, logprob));
            assert!(logprob < 0.0);
            assert!(top.windows(2).all(|w| w[0].1 >= w[1].1));
            let mass: f64 = top.iter().map(|&(_, l)| f64::from(l).exp()).sum();
            assert!(mass <= 1.0 + 1e-6);
        }
    }

    #[test]
    fn bias_forces_and_bans() {
        let ordinary: Vec<u32> = (10..200).collect();
        let free = StepScores::new(7, &input(&ordinary, &[])).drawn();
        let forced = StepScores::new(7, &input(&ordinary, &[(150, 100.0)]));
        assert_eq!(forced.drawn(), Some(150));
        assert!(forced.logprobs(1).0 > -1e-3);
        let banned = free.map(|t| [(t, -100.0)]).unwrap_or([(0, 0.0)]);
        let scores = StepScores::new(7, &input(&ordinary, &banned));
        assert_ne!(scores.drawn(), free);
        // A forced special token outside the ordinary ones is drawn too.
        let special = StepScores::new(7, &input(&ordinary, &[(5000, 100.0)]));
        assert_eq!(special.drawn(), Some(5000));
    }

    #[test]
    fn eos_wins_when_wanted_unless_barred() {
        let ordinary: Vec<u32> = (10..200).collect();
        let mut wanted = input(&ordinary, &[]);
        wanted.eos_wanted = true;
        assert_eq!(StepScores::new(3, &wanted).drawn(), Some(2));
        wanted.barred = &[2];
        assert_ne!(StepScores::new(3, &wanted).drawn(), Some(2));
        let forced = [(2, 100.0)];
        wanted.bias = &forced;
        assert_ne!(StepScores::new(3, &wanted).drawn(), Some(2));
    }
}
