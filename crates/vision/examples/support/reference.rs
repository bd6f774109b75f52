//! One processor output held against a case of the Hugging Face parity
//! reference (crates/vision/tests/data/expected.json), checked the way
//! tests/parity.rs checks Iris: the same tensor shape and placeholder-token
//! count, the sampled values within 1e-5, the sum and the sum of squares
//! within the parity test's bounds; and against Hugging Face's whole tensor
//! (written by scripts/vision/reference_arrays.py), every value within 1e-5.

use std::path::Path;

use serde_json::Value;

use crate::common::sample_indices;

/// The largest difference of a sampled value the parity test accepts.
pub const TOLERANCE: f32 = 1e-5;

/// How one output compares with the reference's case.
pub struct Verdict {
    /// The output's shape (a leading batch axis of one dropped where the
    /// reference has none) and the reference's.
    pub shape: (Vec<usize>, Vec<usize>),
    /// Placeholder tokens: the output's (`None` when it has no prompt to
    /// count in) and the reference's.
    pub tokens: (Option<usize>, usize),
    /// Largest |difference| of the sampled values; `None` when the shapes
    /// differ (the samples index other elements).
    pub sample_diff: Option<f32>,
    /// The output's sum minus the reference's; `None` when the shapes differ.
    pub sum_diff: Option<f64>,
    /// Whether the sum of squares is within the parity bound.
    pub sum_sq_ok: bool,
    /// Largest |difference| from Hugging Face's whole tensor; `None` when
    /// the shapes differ.
    pub whole_diff: Option<f32>,
}

impl Verdict {
    /// Held to `case` of the reference (whose sample count is
    /// `sample_count`) and to Hugging Face's whole tensor `hf`.
    pub fn new(
        case: &Value,
        sample_count: usize,
        shape: &[usize],
        values: &[f32],
        tokens: Option<usize>,
        hf: &[f32],
    ) -> Verdict {
        let want_shape: Vec<usize> = numbers(&case["shape"]);
        let shape = without_unit_batch(shape, &want_shape);
        let want_tokens = case["tokens"].as_u64().unwrap_or(0) as usize;
        let mut verdict = Verdict {
            shape: (shape.clone(), want_shape),
            tokens: (tokens, want_tokens),
            sample_diff: None,
            sum_diff: None,
            sum_sq_ok: false,
            whole_diff: None,
        };
        if shape != verdict.shape.1 || values.is_empty() {
            return verdict;
        }
        verdict.whole_diff = (hf.len() == values.len()).then(|| {
            values
                .iter()
                .zip(hf)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max)
        });
        let samples = case["samples"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        let worst = sample_indices(values.len(), sample_count)
            .iter()
            .zip(samples)
            .map(|(i, s)| (values[*i] - s[1].as_f64().unwrap_or(f64::NAN) as f32).abs())
            .fold(0f32, f32::max);
        let n = values.len() as f64;
        let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let sum_sq: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let want_sum_sq = case["sum_sq"].as_f64().unwrap_or(f64::NAN);
        verdict.sample_diff = Some(worst);
        verdict.sum_diff = Some(sum - case["sum"].as_f64().unwrap_or(f64::NAN));
        verdict.sum_sq_ok = (sum_sq - want_sum_sq).abs() <= 1e-5 * n + 1e-3;
        verdict
    }

    /// Whether the output passes the parity test's checks and its whole
    /// tensor is Hugging Face's within 1e-5.
    pub fn exact(&self) -> bool {
        self.passes_sampled_checks() && self.whole_diff.is_some_and(|d| d <= TOLERANCE)
    }

    /// Whether the output passes the parity test's checks (samples and sums).
    pub fn passes_sampled_checks(&self) -> bool {
        let n: usize = self.shape.1.iter().product();
        self.shape.0 == self.shape.1
            && self.tokens.0.is_none_or(|t| t == self.tokens.1)
            && self.sample_diff.is_some_and(|d| d <= TOLERANCE)
            && self
                .sum_diff
                .is_some_and(|d| d.abs() <= 1e-6 * n as f64 + 1e-3)
            && self.sum_sq_ok
    }
}

/// Hugging Face's whole tensor for `family` on `photo`, as
/// scripts/vision/reference_arrays.py wrote it under `dir`.
pub fn hf_tensor(dir: &Path, family: &str, photo: &str) -> Result<Vec<f32>, String> {
    let path = dir.join(family).join(format!("{photo}.f32"));
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// The reference's case for `family` with no overrides on `image`.
pub fn case<'a>(image: &'a Value, family: &str) -> Option<&'a Value> {
    image["cases"].as_array()?.iter().find(|c| {
        c["processor"] == family && c["overrides"].as_object().is_some_and(|o| o.is_empty())
    })
}

fn numbers(v: &Value) -> Vec<usize> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|n| n as usize)
                .collect()
        })
        .unwrap_or_default()
}

/// `shape` with a leading axis of one dropped when `reference` has one
/// axis fewer (a batch of one image against the reference's single item).
pub fn without_unit_batch(shape: &[usize], reference: &[usize]) -> Vec<usize> {
    match shape.split_first() {
        Some((1, rest)) if shape.len() == reference.len() + 1 => rest.to_vec(),
        _ => shape.to_vec(),
    }
}
