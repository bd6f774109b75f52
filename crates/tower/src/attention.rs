//! Multi-head self-attention with the 2D rotary position embedding,
//! restricted to segments (frames, or Qwen2.5-VL windows).
//!
//! The rotary embedding follows the reference: the head is split in two
//! halves that are rotated against each other (`rotate_half`); the angle of
//! pair `j` is `h · θ_j` for the first quarter of the head and `w · θ_j` for
//! the second, with `θ_j = 10000^(-2j / (head_dim/2))`.

use ndarray::parallel::prelude::*;
use ndarray::{s, Array2, ArrayView1, ArrayView2, ArrayViewMut1, Axis};

use crate::layout::Segment;

/// Query rows per attention task.
const QUERY_BLOCK: usize = 128;

/// cos/sin of every row's rotary angles: `half = head_dim / 2` per row.
#[derive(Debug, Clone)]
pub(crate) struct Rope {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl Rope {
    /// The tables for `positions` (one `(h, w)` per row).
    pub(crate) fn new(positions: &[(usize, usize)], head_dim: usize) -> Rope {
        let half = head_dim / 2;
        let quarter = head_dim / 4;
        let inv_freq: Vec<f32> = (0..quarter)
            .map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / half as f32))
            .collect();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &(h, w) in positions {
            for (pos, f) in [(h, &inv_freq), (w, &inv_freq)] {
                for theta in f {
                    let angle = pos as f32 * theta;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        Rope { cos, sin, half }
    }

    /// The same tables with rows grouped `unit` at a time and reordered like
    /// [`crate::layout::gather_groups`].
    pub(crate) fn gather_groups(&self, unit: usize, index: &[usize]) -> Rope {
        Rope {
            cos: crate::layout::gather_groups(&self.cos, self.half, unit, index),
            sin: crate::layout::gather_groups(&self.sin, self.half, unit, index),
            half: self.half,
        }
    }

    /// Rotates `x` (one head of row `row`) into `out`, scaled by `scale`.
    fn rotate(
        &self,
        row: usize,
        x: ArrayView1<'_, f32>,
        scale: f32,
        mut out: ArrayViewMut1<'_, f32>,
    ) {
        let h = self.half;
        let cos = &self.cos[row * h..(row + 1) * h];
        let sin = &self.sin[row * h..(row + 1) * h];
        for j in 0..h {
            let (a, b) = (x[j], x[j + h]);
            out[j] = (a * cos[j] - b * sin[j]) * scale;
            out[j + h] = (b * cos[j] + a * sin[j]) * scale;
        }
    }
}

/// One head's queries (rotated and pre-scaled), keys (rotated) and values,
/// each `(rows, head_dim)`.
struct Head {
    q: Array2<f32>,
    k: Array2<f32>,
    v: Array2<f32>,
}

/// Splits the fused `qkv` projection (`(rows, 3·dim)`, columns ordered
/// (q/k/v, head, d)) into per-head arrays with the rotary embedding applied.
fn split_heads(qkv: ArrayView2<'_, f32>, heads: usize, rope: &Rope) -> Vec<Head> {
    let dim = qkv.ncols() / 3;
    let hd = dim / heads;
    let scale = (hd as f32).powf(-0.5);
    (0..heads)
        .into_par_iter()
        .map(|h| {
            let rows = qkv.nrows();
            let mut head = Head {
                q: Array2::zeros((rows, hd)),
                k: Array2::zeros((rows, hd)),
                v: Array2::zeros((rows, hd)),
            };
            for (r, src) in qkv.axis_iter(Axis(0)).enumerate() {
                let q = src.slice(s![h * hd..(h + 1) * hd]);
                let k = src.slice(s![dim + h * hd..dim + (h + 1) * hd]);
                let v = src.slice(s![2 * dim + h * hd..2 * dim + (h + 1) * hd]);
                rope.rotate(r, q, scale, head.q.row_mut(r));
                rope.rotate(r, k, 1.0, head.k.row_mut(r));
                head.v.row_mut(r).assign(&v);
            }
            head
        })
        .collect()
}

/// Softmax of every row, in place.
fn softmax_rows(scores: &mut Array2<f32>) {
    let cols = scores.ncols().max(1);
    match scores.as_slice_mut() {
        Some(data) => data.chunks_mut(cols).for_each(softmax),
        None => {
            for mut row in scores.axis_iter_mut(Axis(0)) {
                let mut values = row.to_vec();
                softmax(&mut values);
                row.assign(&ndarray::ArrayView1::from(&values));
            }
        }
    }
}

fn softmax(row: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// One unit of work: a block of queries of one head against its segment.
#[derive(Clone, Copy)]
struct Task {
    head: usize,
    rows: (usize, usize),
    segment: Segment,
}

fn tasks(segments: &[Segment], heads: usize) -> Vec<Task> {
    let mut tasks = Vec::new();
    for &segment in segments {
        for head in 0..heads {
            let mut start = segment.0;
            while start < segment.1 {
                let end = (start + QUERY_BLOCK).min(segment.1);
                tasks.push(Task {
                    head,
                    rows: (start, end),
                    segment,
                });
                start = end;
            }
        }
    }
    tasks
}

fn run_task(head: &Head, task: Task) -> Array2<f32> {
    let q = head.q.slice(s![task.rows.0..task.rows.1, ..]);
    let k = head.k.slice(s![task.segment.0..task.segment.1, ..]);
    let v = head.v.slice(s![task.segment.0..task.segment.1, ..]);
    let mut scores = q.dot(&k.t());
    softmax_rows(&mut scores);
    scores.dot(&v)
}

/// Attention output `(rows, dim)` (before the output projection), heads
/// concatenated in order.
pub(crate) fn attention(
    qkv: ArrayView2<'_, f32>,
    heads: usize,
    rope: &Rope,
    segments: &[Segment],
) -> Array2<f32> {
    let dim = qkv.ncols() / 3;
    let hd = dim / heads;
    let per_head = split_heads(qkv, heads, rope);
    let work = tasks(segments, heads);
    let results: Vec<Array2<f32>> = work
        .par_iter()
        .map(|&t| run_task(&per_head[t.head], t))
        .collect();
    let mut out = Array2::zeros((qkv.nrows(), dim));
    for (task, block) in work.iter().zip(results) {
        let cols = task.head * hd..(task.head + 1) * hd;
        out.slice_mut(s![task.rows.0..task.rows.1, cols])
            .assign(&block);
    }
    out
}

/// Multiply-adds of attention over `segments` (QKᵀ and PV).
pub(crate) fn flops(segments: &[Segment], dim: usize) -> u64 {
    segments
        .iter()
        .map(|&(a, b)| 4 * ((b - a) * (b - a) * dim) as u64)
        .sum()
}
