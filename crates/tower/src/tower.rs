//! The tower itself: weights grouped by layer, and the forward pass.
//!
//! Order of operations (as in `transformers` 4.57.1):
//! patch embedding (Conv3d with stride = kernel, i.e. one matmul with the
//! flattened kernel) → [Qwen2.5-VL: permute merged tokens into window
//! order] → blocks `x += proj(attn(norm1(x))); x += mlp(norm2(x))` →
//! merger `fc2(gelu(fc1(ln_q(x) viewed as (tokens, M²·dim))))` →
//! [Qwen2.5-VL: undo the window permutation].

use std::path::Path;

use ndarray::{s, Array1, Array2, ArrayView2, Axis, Zip};

use crate::attention::{self, Rope};
use crate::config::{Activation, Family, TowerConfig};
use crate::error::TowerError;
use crate::layout::{self, Segment};
use crate::ops::{activate, Linear, Norm};
use crate::weights::Checkpoint;

#[derive(Debug, Clone)]
enum Mlp {
    /// Qwen2-VL: `fc2(act(fc1(x)))`.
    Plain { fc1: Linear, fc2: Linear },
    /// Qwen2.5-VL: `down(act(gate(x)) · up(x))`, gate and up fused in one GEMM.
    Gated { gate_up: Linear, down: Linear },
}

impl Mlp {
    fn forward(&self, x: ArrayView2<'_, f32>, act: Activation) -> Array2<f32> {
        match self {
            Mlp::Plain { fc1, fc2 } => {
                let mut h = fc1.forward(x);
                activate(&mut h, act);
                fc2.forward(h.view())
            }
            Mlp::Gated { gate_up, down } => {
                let gu = gate_up.forward(x);
                let inter = gu.ncols() / 2;
                let mut h = gu.slice(s![.., ..inter]).to_owned();
                Zip::from(&mut h)
                    .and(gu.slice(s![.., inter..]))
                    .par_for_each(|g, &u| *g = crate::ops::apply(act, *g) * u);
                down.forward(h.view())
            }
        }
    }

    fn flops(&self, rows: usize) -> u64 {
        match self {
            Mlp::Plain { fc1, fc2 } => fc1.flops(rows) + fc2.flops(rows),
            Mlp::Gated { gate_up, down } => gate_up.flops(rows) + down.flops(rows),
        }
    }
}

#[derive(Debug, Clone)]
struct Block {
    norm1: Norm,
    norm2: Norm,
    qkv: Linear,
    proj: Linear,
    mlp: Mlp,
}

impl Block {
    fn forward(&self, x: &mut Array2<f32>, cfg: &TowerConfig, rope: &Rope, segments: &[Segment]) {
        let qkv = self.qkv.forward(self.norm1.forward(x.view()).view());
        let attn = attention::attention(qkv.view(), cfg.num_heads, rope, segments);
        *x += &self.proj.forward(attn.view());
        *x += &self
            .mlp
            .forward(self.norm2.forward(x.view()).view(), cfg.hidden_act);
    }
}

#[derive(Debug, Clone)]
struct Merger {
    ln_q: Norm,
    fc1: Linear,
    fc2: Linear,
}

impl Merger {
    fn forward(&self, x: ArrayView2<'_, f32>, unit: usize) -> Result<Array2<f32>, TowerError> {
        let normed = self.ln_q.forward(x);
        let (rows, dim) = normed.dim();
        let grouped = normed
            .into_shape_with_order((rows / unit, dim * unit))
            .map_err(|e| TowerError::Input(format!("merger reshape: {e}")))?;
        let mut h = self.fc1.forward(grouped.view());
        activate(&mut h, Activation::Gelu);
        Ok(self.fc2.forward(h.view()))
    }
}

/// The Qwen2-VL / Qwen2.5-VL vision tower with its weights in memory (f32).
#[derive(Debug, Clone)]
pub struct Tower {
    config: TowerConfig,
    patch_embed: Linear,
    blocks: Vec<Block>,
    merger: Merger,
}

impl Tower {
    /// Loads `config.json` and the `visual.*` weights of a model directory.
    pub fn load(model_dir: &Path) -> Result<Tower, TowerError> {
        let config = TowerConfig::from_config_json(model_dir)?;
        let checkpoint = Checkpoint::open(model_dir)?;
        Tower::from_checkpoint(config, &checkpoint)
    }

    /// Builds the tower from an opened checkpoint, checking every shape.
    pub fn from_checkpoint(config: TowerConfig, ckpt: &Checkpoint) -> Result<Tower, TowerError> {
        config
            .validate()
            .map_err(|m| TowerError::config("config.json", m))?;
        let w = Loader { ckpt };
        let dim = config.embed_dim;
        let patch = config.patch_size;
        let kernel = [
            dim,
            config.in_channels,
            config.temporal_patch_size,
            patch,
            patch,
        ];
        let patch_embed = Linear::from_torch(
            w.reshaped(
                "patch_embed.proj.weight",
                &kernel,
                (dim, config.patch_features()),
            )?,
            None,
        );
        let blocks = (0..config.depth)
            .map(|i| w.block(&config, i))
            .collect::<Result<Vec<_>, _>>()?;
        let merged = dim * config.merge_unit();
        let merger = Merger {
            ln_q: w.norm(config.family, "merger.ln_q", dim)?,
            fc1: w.linear("merger.mlp.0", merged, merged, true)?,
            fc2: w.linear("merger.mlp.2", config.out_hidden_size, merged, true)?,
        };
        Ok(Tower {
            config,
            patch_embed,
            blocks,
            merger,
        })
    }

    pub fn config(&self) -> &TowerConfig {
        &self.config
    }

    /// Runs the tower on a batch: `pixel_values` holds every image's patch
    /// rows back to back, `grids` their `[t, h, w]`. Returns one
    /// `[t·h·w / M², out_hidden_size]` row-major buffer per image.
    pub fn forward(
        &self,
        pixel_values: &[f32],
        grids: &[[usize; 3]],
    ) -> Result<Vec<Vec<f32>>, TowerError> {
        let rows = self.check_inputs(pixel_values, grids)?;
        if rows == 0 {
            return Ok(vec![Vec::new(); grids.len()]);
        }
        let cfg = &self.config;
        let unit = cfg.merge_unit();
        let x = ArrayView2::from_shape((rows, cfg.patch_features()), pixel_values)
            .map_err(|e| TowerError::Input(format!("pixel_values: {e}")))?;
        let mut h = self.patch_embed.forward(x);
        let positions = layout::position_ids(grids, cfg.spatial_merge_size);
        let mut rope = Rope::new(&positions, cfg.head_dim());
        let full = layout::frame_segments(grids);
        let windows = match cfg.family {
            Family::Qwen2Vl => None,
            Family::Qwen25Vl => {
                let (index, segments) =
                    layout::window_index(grids, cfg.spatial_merge_size, cfg.window_merged());
                h = h.select(Axis(0), &layout::expand_groups(&index, unit));
                rope = rope.gather_groups(unit, &index);
                Some((index, segments))
            }
        };
        for (i, block) in self.blocks.iter().enumerate() {
            let segments = match &windows {
                Some((_, win)) if cfg.is_windowed(i) => win,
                _ => &full,
            };
            block.forward(&mut h, cfg, &rope, segments);
        }
        let mut merged = self.merger.forward(h.view(), unit)?;
        if let Some((index, _)) = &windows {
            merged = merged.select(Axis(0), &layout::inverse(index));
        }
        Ok(split_images(&merged, grids, unit))
    }

    /// Checks the grids against the config and `pixel_values`; returns the
    /// total number of patch rows.
    fn check_inputs(
        &self,
        pixel_values: &[f32],
        grids: &[[usize; 3]],
    ) -> Result<usize, TowerError> {
        let m = self.config.spatial_merge_size;
        let mut rows = 0usize;
        for (i, &[t, h, w]) in grids.iter().enumerate() {
            if t == 0 || h == 0 || w == 0 || !h.is_multiple_of(m) || !w.is_multiple_of(m) {
                return Err(TowerError::Input(format!(
                    "image {i}: grid [{t}, {h}, {w}] must be positive with h and w multiples of {m}"
                )));
            }
            rows += t * h * w;
        }
        let expected = rows * self.config.patch_features();
        if pixel_values.len() != expected {
            return Err(TowerError::Input(format!(
                "pixel_values has {} values, the grids need {rows} rows × {} = {expected}",
                pixel_values.len(),
                self.config.patch_features()
            )));
        }
        Ok(rows)
    }

    /// Floating-point operations of one forward over `grids` (GEMMs and
    /// attention matmuls; norms and activations are not counted).
    pub fn flops(&self, grids: &[[usize; 3]]) -> u64 {
        let cfg = &self.config;
        let rows: usize = grids.iter().map(|g| g[0] * g[1] * g[2]).sum();
        let full = layout::frame_segments(grids);
        let (_, windows) =
            layout::window_index(grids, cfg.spatial_merge_size, cfg.window_merged().max(1));
        let blocks: u64 = self
            .blocks
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let segs = if cfg.is_windowed(i) { &windows } else { &full };
                b.qkv.flops(rows)
                    + b.proj.flops(rows)
                    + b.mlp.flops(rows)
                    + attention::flops(segs, cfg.embed_dim)
            })
            .sum();
        let tokens = rows / cfg.merge_unit();
        self.patch_embed.flops(rows)
            + blocks
            + self.merger.fc1.flops(tokens)
            + self.merger.fc2.flops(tokens)
    }
}

/// Splits the merged tokens into one buffer per image.
fn split_images(merged: &Array2<f32>, grids: &[[usize; 3]], unit: usize) -> Vec<Vec<f32>> {
    let mut start = 0;
    grids
        .iter()
        .map(|g| {
            let tokens = g[0] * g[1] * g[2] / unit;
            let image = merged
                .slice(s![start..start + tokens, ..])
                .iter()
                .copied()
                .collect();
            start += tokens;
            image
        })
        .collect()
}

/// Reads tensors by their un-prefixed names with the shapes the config implies.
struct Loader<'a> {
    ckpt: &'a Checkpoint,
}

impl Loader<'_> {
    fn reshaped(
        &self,
        name: &str,
        shape: &[usize],
        to: (usize, usize),
    ) -> Result<Array2<f32>, TowerError> {
        let data = self.ckpt.tensor(name, shape)?;
        Array2::from_shape_vec(to, data).map_err(|_| TowerError::ShapeMismatch {
            name: name.to_string(),
            expected: vec![to.0, to.1],
            found: shape.to_vec(),
        })
    }

    fn vector(&self, name: &str, len: usize) -> Result<Array1<f32>, TowerError> {
        Ok(Array1::from_vec(self.ckpt.tensor(name, &[len])?))
    }

    fn linear(
        &self,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Linear, TowerError> {
        let weight = self.reshaped(&format!("{prefix}.weight"), &[out, inp], (out, inp))?;
        let bias = match bias {
            true => Some(self.vector(&format!("{prefix}.bias"), out)?),
            false => None,
        };
        Ok(Linear::from_torch(weight, bias))
    }

    fn norm(&self, family: Family, prefix: &str, dim: usize) -> Result<Norm, TowerError> {
        let weight = self.vector(&format!("{prefix}.weight"), dim)?.to_vec();
        Ok(match family {
            Family::Qwen2Vl => Norm::Layer {
                weight,
                bias: self.vector(&format!("{prefix}.bias"), dim)?.to_vec(),
            },
            Family::Qwen25Vl => Norm::Rms { weight },
        })
    }

    fn block(&self, cfg: &TowerConfig, i: usize) -> Result<Block, TowerError> {
        let p = format!("blocks.{i}");
        let dim = cfg.embed_dim;
        let inter = cfg.intermediate_size;
        let norm1 = self.norm(cfg.family, &format!("{p}.norm1"), dim)?;
        let norm2 = self.norm(cfg.family, &format!("{p}.norm2"), dim)?;
        let qkv = self.linear(&format!("{p}.attn.qkv"), 3 * dim, dim, true)?;
        let proj = self.linear(&format!("{p}.attn.proj"), dim, dim, true)?;
        let mlp = match cfg.family {
            Family::Qwen2Vl => Mlp::Plain {
                fc1: self.linear(&format!("{p}.mlp.fc1"), inter, dim, true)?,
                fc2: self.linear(&format!("{p}.mlp.fc2"), dim, inter, true)?,
            },
            Family::Qwen25Vl => Mlp::Gated {
                gate_up: fuse(
                    &format!("{p}.mlp.up_proj.weight"),
                    self.linear(&format!("{p}.mlp.gate_proj"), inter, dim, true)?,
                    self.linear(&format!("{p}.mlp.up_proj"), inter, dim, true)?,
                )?,
                down: self.linear(&format!("{p}.mlp.down_proj"), dim, inter, true)?,
            },
        };
        Ok(Block {
            norm1,
            norm2,
            qkv,
            proj,
            mlp,
        })
    }
}

/// Two linears on the same input as one, outputs side by side.
fn fuse(name: &str, a: Linear, b: Linear) -> Result<Linear, TowerError> {
    let mismatch = || TowerError::ShapeMismatch {
        name: name.to_string(),
        expected: vec![a.wt.nrows(), a.wt.ncols()],
        found: vec![b.wt.nrows(), b.wt.ncols()],
    };
    let wt = ndarray::concatenate(Axis(1), &[a.wt.view(), b.wt.view()]).map_err(|_| mismatch())?;
    let bias = match (&a.bias, &b.bias) {
        (Some(x), Some(y)) => {
            Some(ndarray::concatenate(Axis(0), &[x.view(), y.view()]).map_err(|_| mismatch())?)
        }
        _ => None,
    };
    Ok(Linear { wt, bias })
}
