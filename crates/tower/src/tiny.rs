//! Deterministic random weights for a tower config, written as a
//! Hugging Face-layout safetensors file (`visual.*` keys, f32), so demos and
//! tests can run the real forward pass without a downloaded checkpoint;
//! [`write_tiny_vl_model`] writes the whole tiny vision-language model
//! (`iris_model`'s files plus its tower's weights).

use std::path::{Path, PathBuf};

use iris_fingerprint::SplitMix64;
use safetensors::{Dtype, View};

use crate::config::{Family, TowerConfig};
use crate::error::TowerError;

/// Name of the file [`write_tiny_weights`] writes into the model directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";

/// Seed of the tiny model's vision weights.
pub const TINY_SEED: u64 = 7;

/// Writes the complete tiny Qwen2-VL model into `dir`: the files of
/// `iris_model::tiny::write_tiny_qwen2_vl` plus [`WEIGHTS_FILE`] with the
/// vision tower its `config.json` describes ([`TowerConfig::tiny_qwen2_vl`],
/// merger output = the language model's hidden size), seeded with
/// [`TINY_SEED`]. Byte-identical on every run; `Tower::load(dir)` and
/// `iris-encoder --compute tower` run on it.
pub fn write_tiny_vl_model(dir: &Path) -> Result<(), TowerError> {
    iris_model::tiny::write_tiny_qwen2_vl(dir)?;
    let config = TowerConfig::from_config_json(dir)?;
    if config != TowerConfig::tiny_qwen2_vl() {
        return Err(TowerError::config(
            dir.join("config.json"),
            format!("the tiny model's vision_config describes {config:?}, not the tiny tower"),
        ));
    }
    write_tiny_weights(dir, &config, TINY_SEED)?;
    Ok(())
}

/// Names of every file [`write_tiny_vl_model`] writes.
pub fn tiny_vl_files() -> impl Iterator<Item = &'static str> {
    iris_model::tiny::FILES
        .iter()
        .copied()
        .chain(std::iter::once(WEIGHTS_FILE))
}

/// Every tensor the tower reads for `config`, un-prefixed, with its shape.
pub fn weight_shapes(config: &TowerConfig) -> Vec<(String, Vec<usize>)> {
    let d = config.embed_dim;
    let i = config.intermediate_size;
    let merged = d * config.merge_unit();
    let p = config.patch_size;
    let mut shapes = vec![(
        "patch_embed.proj.weight".to_string(),
        vec![d, config.in_channels, config.temporal_patch_size, p, p],
    )];
    let norm = |name: String, shapes: &mut Vec<(String, Vec<usize>)>| {
        shapes.push((format!("{name}.weight"), vec![d]));
        if config.family == Family::Qwen2Vl {
            shapes.push((format!("{name}.bias"), vec![d]));
        }
    };
    let linear = |name: String, out: usize, inp: usize, shapes: &mut Vec<(String, Vec<usize>)>| {
        shapes.push((format!("{name}.weight"), vec![out, inp]));
        shapes.push((format!("{name}.bias"), vec![out]));
    };
    for b in 0..config.depth {
        norm(format!("blocks.{b}.norm1"), &mut shapes);
        norm(format!("blocks.{b}.norm2"), &mut shapes);
        linear(format!("blocks.{b}.attn.qkv"), 3 * d, d, &mut shapes);
        linear(format!("blocks.{b}.attn.proj"), d, d, &mut shapes);
        match config.family {
            Family::Qwen2Vl => {
                linear(format!("blocks.{b}.mlp.fc1"), i, d, &mut shapes);
                linear(format!("blocks.{b}.mlp.fc2"), d, i, &mut shapes);
            }
            Family::Qwen25Vl => {
                linear(format!("blocks.{b}.mlp.gate_proj"), i, d, &mut shapes);
                linear(format!("blocks.{b}.mlp.up_proj"), i, d, &mut shapes);
                linear(format!("blocks.{b}.mlp.down_proj"), d, i, &mut shapes);
            }
        }
    }
    norm("merger.ln_q".to_string(), &mut shapes);
    linear("merger.mlp.0".to_string(), merged, merged, &mut shapes);
    linear(
        "merger.mlp.2".to_string(),
        config.out_hidden_size,
        merged,
        &mut shapes,
    );
    shapes
}

/// Uniform in `[-1, 1)`, from a tiny, portable, seeded generator.
fn symmetric(rng: &mut SplitMix64) -> f32 {
    ((rng.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
}

/// Values for one tensor: norm weights near 1, biases small, matrices
/// uniform with a `1/√fan_in` bound (so activations keep their scale).
fn values(name: &str, shape: &[usize], rng: &mut SplitMix64) -> Vec<f32> {
    let count: usize = shape.iter().product();
    let is_norm = name.contains("norm") || name.contains("ln_q");
    let is_bias = name.ends_with(".bias");
    let fan_in: usize = shape.iter().skip(1).product::<usize>().max(1);
    let bound = 1.0 / (fan_in as f32).sqrt();
    (0..count)
        .map(|_| {
            let r = symmetric(rng);
            match (is_norm, is_bias) {
                (true, false) => 1.0 + 0.1 * r,
                (_, true) => 0.02 * r,
                (false, false) => bound * r,
            }
        })
        .collect()
}

/// One tensor, serialisable by `safetensors`.
struct F32Tensor {
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &F32Tensor {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Writes deterministic random weights for `config` to `dir/model.safetensors`
/// under the `visual.` prefix; the same `(config, seed)` gives the same bytes.
/// Returns the file's path.
pub fn write_tiny_weights(
    dir: &Path,
    config: &TowerConfig,
    seed: u64,
) -> Result<PathBuf, TowerError> {
    std::fs::create_dir_all(dir).map_err(|e| TowerError::io(dir, "create directory", e))?;
    let mut rng = SplitMix64(seed);
    let tensors: Vec<(String, F32Tensor)> = weight_shapes(config)
        .into_iter()
        .map(|(name, shape)| {
            let bytes = values(&name, &shape, &mut rng)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            (format!("visual.{name}"), F32Tensor { shape, bytes })
        })
        .collect();
    let path = dir.join(WEIGHTS_FILE);
    safetensors::serialize_to_file(tensors.iter().map(|(n, t)| (n.as_str(), t)), None, &path)
        .map_err(|e| TowerError::format(&path, format!("cannot write safetensors: {e}")))?;
    Ok(path)
}
