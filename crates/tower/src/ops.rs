//! The dense building blocks: linear layers, norms and activations, all
//! row-parallel over the current rayon pool.

use ndarray::linalg::general_mat_mul;
use ndarray::parallel::prelude::*;
use ndarray::{Array1, Array2, ArrayView2, ArrayViewMut1, Axis};

use crate::config::{Activation, NORM_EPS};

/// Rows per GEMM task: the whole matrix on one thread, else a few tasks per
/// thread, rounded to the 8-row micro-kernel.
fn rows_per_task(rows: usize) -> usize {
    let threads = rayon::current_num_threads();
    if threads <= 1 {
        return rows.max(1);
    }
    let chunk = rows.div_ceil(threads * 2);
    chunk.div_ceil(8).max(4) * 8
}

/// `out = x · w` with `out` pre-filled (bias) and accumulated into, split by rows.
pub(crate) fn matmul_into(x: ArrayView2<'_, f32>, w: ArrayView2<'_, f32>, out: &mut Array2<f32>) {
    let chunk = rows_per_task(x.nrows());
    out.axis_chunks_iter_mut(Axis(0), chunk)
        .into_par_iter()
        .zip(x.axis_chunks_iter(Axis(0), chunk))
        .for_each(|(mut o, xi)| general_mat_mul(1.0, &xi, &w, 1.0, &mut o));
}

/// `y = x · Wᵀ + b`, with the weight stored transposed as `(in, out)`.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    /// `(in_features, out_features)`, row-major.
    pub(crate) wt: Array2<f32>,
    pub(crate) bias: Option<Array1<f32>>,
}

impl Linear {
    /// From a PyTorch weight `(out, in)`.
    pub(crate) fn from_torch(weight: Array2<f32>, bias: Option<Array1<f32>>) -> Linear {
        Linear {
            wt: weight.t().as_standard_layout().into_owned(),
            bias,
        }
    }

    pub(crate) fn out_features(&self) -> usize {
        self.wt.ncols()
    }

    pub(crate) fn forward(&self, x: ArrayView2<'_, f32>) -> Array2<f32> {
        let mut out = Array2::zeros((x.nrows(), self.out_features()));
        if let Some(b) = &self.bias {
            out += b;
        }
        matmul_into(x, self.wt.view(), &mut out);
        out
    }

    /// Multiply-adds of one forward over `rows` rows.
    pub(crate) fn flops(&self, rows: usize) -> u64 {
        2 * (rows * self.wt.nrows() * self.wt.ncols()) as u64
    }
}

/// LayerNorm (weight and bias) or RMSNorm (weight only), eps 1e-6.
#[derive(Debug, Clone)]
pub(crate) enum Norm {
    Layer { weight: Vec<f32>, bias: Vec<f32> },
    Rms { weight: Vec<f32> },
}

impl Norm {
    pub(crate) fn forward(&self, x: ArrayView2<'_, f32>) -> Array2<f32> {
        let mut out = x.to_owned();
        out.axis_iter_mut(Axis(0))
            .into_par_iter()
            .for_each(|row| self.normalise_row(row));
        out
    }

    fn normalise_row(&self, mut row: ArrayViewMut1<'_, f32>) {
        match row.as_slice_mut() {
            Some(values) => self.normalise(values),
            None => {
                let mut values = row.to_vec();
                self.normalise(&mut values);
                row.assign(&ndarray::ArrayView1::from(&values));
            }
        }
    }

    fn normalise(&self, row: &mut [f32]) {
        let n = row.len() as f32;
        match self {
            Norm::Layer { weight, bias } => {
                let mean = row.iter().sum::<f32>() / n;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
                let inv = 1.0 / (var + NORM_EPS).sqrt();
                for ((v, w), b) in row.iter_mut().zip(weight).zip(bias) {
                    *v = (*v - mean) * inv * w + b;
                }
            }
            Norm::Rms { weight } => {
                let ms = row.iter().map(|v| v * v).sum::<f32>() / n;
                let inv = 1.0 / (ms + NORM_EPS).sqrt();
                for (v, w) in row.iter_mut().zip(weight) {
                    *v = w * (*v * inv);
                }
            }
        }
    }
}

/// Applies `act` to every element, in parallel.
pub(crate) fn activate(x: &mut Array2<f32>, act: Activation) {
    x.par_mapv_inplace(|v| apply(act, v));
}

pub(crate) fn apply(act: Activation, v: f32) -> f32 {
    match act {
        Activation::QuickGelu => v * sigmoid(1.702 * v),
        Activation::Gelu => 0.5 * v * (1.0 + libm::erff(v * std::f32::consts::FRAC_1_SQRT_2)),
        Activation::GeluTanh => {
            let c = (2.0 / std::f32::consts::PI).sqrt();
            0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())
        }
        Activation::Silu => v * sigmoid(v),
    }
}

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}
