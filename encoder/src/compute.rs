//! What turns an image's pixels into its embedding. The [`Compute`] trait
//! is the seam for real vision towers; [`DigestCompute`] is the reference
//! backend: a cheap deterministic function of the pixel bytes with the
//! right output shape, so every path can run without weights or GPUs.

use iris_fingerprint::{fingerprint, splitmix64, GOLDEN_GAMMA};
use rayon::prelude::*;

/// One image to encode.
#[derive(Debug, Clone)]
pub struct ImageInput {
    /// Pixel values, little-endian `[patches, patch_dim]`: float32, or
    /// bfloat16 when `bf16` is set (see [`ImageInput::floats`]).
    pub pixels: bytes::Bytes,
    pub bf16: bool,
    /// `[t, h, w]` in patches.
    pub grid: [u32; 3],
}

impl ImageInput {
    pub fn patches(&self) -> u64 {
        self.grid.iter().map(|&d| u64::from(d)).product()
    }

    /// The pixel values as float32, read straight from the wire bytes
    /// (bfloat16 widened exactly: its bits are the high half of the f32's).
    /// Blocking work for large images.
    pub fn floats(&self) -> Vec<f32> {
        if self.bf16 {
            self.pixels
                .chunks_exact(2)
                .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                .collect()
        } else {
            self.pixels
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        }
    }
}

/// An embedding (float32 little-endian `[tokens, out_hidden]`) or why the
/// image could not be encoded.
pub type Encoded = Result<Vec<u8>, String>;

/// A vision encoder backend. `encode` and `encode_batch` are blocking
/// compute: callers run them on a blocking thread.
pub trait Compute: Send + Sync + 'static {
    /// Width of one embedding row.
    fn out_hidden(&self) -> usize;
    /// Output rows (LM tokens) for an image of `grid`.
    fn tokens(&self, grid: [u32; 3]) -> usize;
    /// One image's embedding; `image` holds its pixels as they came
    /// (float32 or bfloat16: [`ImageInput::floats`] reads either).
    fn encode(&self, image: &ImageInput) -> Encoded;

    /// Encodes a batch, handing each image's embedding to `done` (with its
    /// index) as soon as it is ready. The default runs the images side by
    /// side on the rayon pool, each its own forward pass, so a small image
    /// is answered without waiting for a large one. A backend that gains
    /// from fusing a batch overrides it.
    fn encode_batch(&self, images: Vec<ImageInput>, done: &(dyn Fn(usize, Encoded) + Sync)) {
        images
            .into_par_iter()
            .enumerate()
            .for_each(|(index, image)| done(index, self.encode(&image)));
    }
}

/// The reference backend: row `i` of an image's embedding is derived from
/// SHA-256 of (the image's pixel bytes, i), expanded to `out_hidden` floats
/// in [-1, 1). Same pixels, same embedding; different pixels, different.
pub struct DigestCompute {
    pub out_hidden: usize,
    pub merge: u32,
}

impl Compute for DigestCompute {
    fn out_hidden(&self) -> usize {
        self.out_hidden
    }

    fn tokens(&self, grid: [u32; 3]) -> usize {
        let merge = self.merge.max(1) * self.merge.max(1);
        (grid.iter().map(|&d| d as usize).product::<usize>()) / merge as usize
    }

    fn encode(&self, image: &ImageInput) -> Encoded {
        Ok(self.embed(image))
    }
}

impl DigestCompute {
    fn embed(&self, image: &ImageInput) -> Vec<u8> {
        // Every pixel byte counts, as sent (bfloat16 is not widened), read
        // once at memory speed (the fingerprint the reference engine uses
        // too) rather than SHA-256'd: the reference encoder stays cheap
        // next to the gateways it is benchmarked with.
        let seed = fingerprint(&image.pixels);
        let tokens = self.tokens(image.grid);
        let mut out = Vec::with_capacity(tokens * self.out_hidden * 4);
        for row in 0..tokens {
            let mut state = u64::from_le_bytes([
                seed[0], seed[1], seed[2], seed[3], seed[4], seed[5], seed[6], seed[7],
            ]) ^ (row as u64).wrapping_mul(GOLDEN_GAMMA);
            for _ in 0..self.out_hidden {
                state = splitmix64(state);
                let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
                out.extend_from_slice(&(unit * 2.0 - 1.0).to_le_bytes());
            }
        }
        out
    }
}

/// The Qwen2-VL / Qwen2.5-VL vision tower on the CPU (`iris-tower`).
pub struct TowerCompute {
    pub tower: iris_tower::Tower,
}

impl Compute for TowerCompute {
    fn out_hidden(&self) -> usize {
        self.tower.config().out_hidden_size
    }

    fn tokens(&self, grid: [u32; 3]) -> usize {
        let merge = self.tower.config().spatial_merge_size.max(1);
        grid.iter().map(|&d| d as usize).product::<usize>() / (merge * merge)
    }

    fn encode(&self, image: &ImageInput) -> Encoded {
        let pixels = image.floats();
        let grid = image.grid.map(|d| d as usize);
        let mut outputs = iris_tower::VisionBackend::encode(&self.tower, &pixels, &[grid])
            .map_err(|e| e.to_string())?;
        let rows = outputs
            .pop()
            .ok_or_else(|| "the tower returned no embedding".to_string())?;
        Ok(rows.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(byte: u8) -> ImageInput {
        ImageInput {
            pixels: bytes::Bytes::from(vec![byte; 64]),
            bf16: false,
            grid: [1, 4, 4],
        }
    }

    #[test]
    fn digest_embeddings_have_the_right_shape_and_depend_on_pixels() {
        let c = DigestCompute {
            out_hidden: 8,
            merge: 2,
        };
        let out: Vec<Vec<u8>> = [image(1), image(1), image(2)]
            .iter()
            .map(|i| c.encode(i).unwrap())
            .collect();
        assert_eq!(c.tokens([1, 4, 4]), 4);
        assert_eq!(out[0].len(), 4 * 8 * 4);
        assert_eq!(out[0], out[1]);
        assert_ne!(out[0], out[2]);
    }

    #[test]
    fn bf16_widens_to_the_same_floats() {
        let values = [1.5f32, -2.0, 0.0, -0.0078125];
        let as_input = |bf16: bool| ImageInput {
            pixels: bytes::Bytes::from(
                values
                    .iter()
                    .flat_map(|v| {
                        if bf16 {
                            ((v.to_bits() >> 16) as u16).to_le_bytes().to_vec()
                        } else {
                            v.to_le_bytes().to_vec()
                        }
                    })
                    .collect::<Vec<u8>>(),
            ),
            bf16,
            grid: [1, 1, 4],
        };
        assert_eq!(as_input(true).floats(), values);
        assert_eq!(as_input(false).floats(), values);
    }
}
