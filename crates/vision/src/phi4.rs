//! Phi-4-multimodal: transformers 4.57.1's `Phi4MultimodalImageProcessorFast`
//! (the only class there is: torchvision; `AutoImageProcessor` maps
//! `phi4_multimodal` to it and has no slow class), one image per call.
//!
//! 1. The *canvas* is `cols × rows` tiles of `size` (448²): the image's
//!    sides in whole tiles, rounded up; when that is more than
//!    `dynamic_hd` (36) tiles, the arrangement of at most `dynamic_hd`
//!    tiles whose aspect ratio is nearest the image's (InternVL's rule,
//!    [`crate::internvl`]'s `optimal_grid`).
//! 2. The image is resized, aspect ratio kept, to fill the canvas on one
//!    side (the other side `int(side · ratio)`), with PyTorch's
//!    antialiased bilinear on `uint8` ([`Bicubic::TorchBilinear`]), and
//!    padded with *white* at the right and bottom to the canvas. A side
//!    under 10 pixels is refused, as the reference refuses it.
//! 3. The canvas is rescaled and normalised (fused, in f32:
//!    [`Normalization::fused_value`]; mean and std 0.5) and cut into its
//!    tiles row by row; before them comes the *global* frame: the
//!    normalised canvas resized to one tile by PyTorch's bicubic without
//!    antialiasing (`upsample_bicubic2d`, `A = -0.75`) on the floats.
//!
//! The output is `[1 + tiles, 3, 448, 448]` (the model's
//! `image_pixel_values`, one image's row), with `image_sizes` the
//! canvas's `[height, width]` and `image_attention_mask`
//! `[1 + tiles, 32, 32]`: ones for the global frame, and per tile the
//! 14-pixel patches that are not all padding (the reference zeroes
//! `floor(padding / 14)` columns and rows when the padding is at least a
//! patch). The mask travels as the reference returns it, float32 ones and
//! zeros ([`ItemTensor::floats`]), beside `num_img_tokens` `[1]` (int64):
//! the image's token count, which vLLM's Phi-4 model code asks for with
//! the mask and `image_sizes` (its processor adds it to the HF
//! processor's output).
//!
//! The prompt (`Phi4MultimodalProcessor`): the chat template writes
//! `<|image|>` once per image and the processor repeats it
//! `num_img_tokens` times, `256 + 1 + m + r + 16` where `m` counts the
//! mask's ones at even rows and columns and `r` the even rows whose first
//! column is one: a pure function of the plan, so
//! [`OutputLayout::num_placeholder_tokens`] and the default
//! [`PlaceholderLayout`] (one run of the image token) give it.
//!
//! Exactness: every tile's value is the reference's to the bit (the
//! 8-bit canvas is, and the fused normalisation is the same f32
//! operations). The global frame's bicubic sums its sixteen taps in the
//! reference's order but without the fused multiply-adds PyTorch's
//! compiled loop may use, so a value can differ from PyTorch's in the
//! last bits (measured: at most a few 1e-7); parity checks it to 1e-5.

use crate::error::VisionError;
use crate::image::RgbView;
use crate::internvl::optimal_grid;
use crate::layout::planar_chw;
use crate::normalize::{Lut, Normalization, OutElem};
use crate::output::{ItemTensor, OutputLayout};
use crate::processor::PreprocessOptions;
use crate::resize::{resize_copy, Bicubic};
use crate::tiles::{cut_tiles, pad_into, padded_canvas_bytes, write_frames, Cut, Each, Tiled};

/// Image tokens of the global frame, its separator and its row ends, as
/// `Phi4MultimodalImageProcessorFast` counts them (fixed numbers there).
const GLOBAL_TOKENS: usize = 256 + 1 + 16;

/// The reference's smallest accepted side of the resized image.
const MIN_SIDE: usize = 10;

/// The Phi-4-multimodal image processor.
#[derive(Debug, Clone, PartialEq)]
pub struct Phi4Processor {
    /// The side of the square tiles (`size`: 448).
    pub tile: usize,
    /// `patch_size` of the vision encoder (14): the mask's cell.
    pub patch_size: usize,
    /// `dynamic_hd`: the most tiles a canvas has.
    pub dynamic_hd: usize,
    /// Normalisation (fused into one f32 step, as the fast class does).
    pub norm: Normalization,
}

/// What one image becomes: the canvas in tiles and the resized size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    cols: usize,
    rows: usize,
    /// `(width, height)` of the resized image, before the white padding.
    resized: (usize, usize),
}

impl Plan {
    fn tiles(&self) -> usize {
        self.cols * self.rows
    }
}

impl Phi4Processor {
    /// microsoft/Phi-4-multimodal-instruct: 448-pixel tiles, patch 14, at
    /// most 36 tiles, mean and std 0.5.
    pub fn phi4_multimodal() -> Self {
        Phi4Processor {
            tile: 448,
            patch_size: 14,
            dynamic_hd: 36,
            norm: Normalization::HALF,
        }
    }

    /// Mask cells per tile side (`size / patch_size`).
    fn mask_side(&self) -> usize {
        self.tile / self.patch_size
    }

    /// The canvas's unmasked `(columns, rows)` of mask cells: all but the
    /// `floor(padding / patch)` last ones when the padding is at least a
    /// patch.
    fn valid_cells(&self, plan: &Plan) -> (usize, usize) {
        let m = self.mask_side();
        let valid = |cells: usize, canvas: usize, resized: usize| {
            let pad = canvas.saturating_sub(resized);
            if pad >= self.patch_size {
                cells.saturating_sub(pad / self.patch_size)
            } else {
                cells
            }
        };
        (
            valid(m * plan.cols, plan.cols * self.tile, plan.resized.0),
            valid(m * plan.rows, plan.rows * self.tile, plan.resized.1),
        )
    }

    /// `num_img_tokens`: the global frame's tokens, the mask's ones at
    /// even rows and columns, and one per such row.
    fn tokens(&self, plan: &Plan) -> usize {
        let (cols, rows) = self.valid_cells(plan);
        let (cols, rows) = (cols.div_ceil(2), rows.div_ceil(2));
        GLOBAL_TOKENS + rows * cols + rows
    }

    /// `image_attention_mask` `[1 + tiles, m, m]`: the global frame's
    /// ones, then each tile's window of the canvas's mask.
    fn attention_mask(&self, plan: &Plan) -> Vec<usize> {
        let m = self.mask_side();
        let (valid_cols, valid_rows) = self.valid_cells(plan);
        let mut mask = vec![1; m * m];
        for tile in 0..plan.tiles() {
            let (x0, y0) = ((tile % plan.cols) * m, (tile / plan.cols) * m);
            for y in y0..y0 + m {
                mask.extend((x0..x0 + m).map(|x| usize::from(x < valid_cols && y < valid_rows)));
            }
        }
        mask
    }
}

/// One output coordinate of PyTorch's bicubic (`align_corners=False`,
/// no antialiasing): four clamped source indices and their weights.
struct CubicTaps {
    index: [usize; 4],
    weight: [f32; 4],
}

/// PyTorch's cubic convolution weights for `t` in `[0, 1]` (`A = -0.75`),
/// in its f32 operations.
fn cubic_weights(t: f32) -> [f32; 4] {
    const A: f32 = -0.75;
    let near = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    let u = 1.0 - t;
    [far(t + 1.0), near(t), near(u), far(u + 1.0)]
}

/// The taps of every output coordinate resizing `input` samples to
/// `output` (`upsample_bicubic2d`'s index and weight tables).
fn cubic_taps(input: usize, output: usize) -> Vec<CubicTaps> {
    let scale = input as f32 / output as f32;
    let last = input as i64 - 1;
    (0..output)
        .map(|i| {
            let real = scale * (i as f32 + 0.5) - 0.5;
            let base = (real.floor() as i64).min(last);
            let t = (real - base as f32).clamp(0.0, 1.0);
            let index = [-1, 0, 1, 2].map(|d| (base + d).clamp(0, last) as usize);
            CubicTaps {
                index,
                weight: cubic_weights(t),
            }
        })
        .collect()
}

/// Writes the global frame: `canvas`, normalised through `lut`, resized
/// to `side`×`side` on the floats (the canvas itself when it is one tile,
/// as torchvision returns an image already at the size).
fn global_frame<T: OutElem>(canvas: RgbView<'_>, lut: &Lut<f32>, side: usize, out: &mut [T]) {
    if (canvas.width(), canvas.height()) == (side, side) {
        let rounded = Lut::new(lut.0.map(|table| table.map(T::from_f32)));
        planar_chw(canvas, &rounded, out);
        return;
    }
    let (rows, cols) = (
        cubic_taps(canvas.height(), side),
        cubic_taps(canvas.width(), side),
    );
    let (data, width) = (canvas.data(), canvas.width());
    let value = |y: usize, x: usize, c: usize| lut.0[c][usize::from(data[(y * width + x) * 3 + c])];
    for (c, plane) in out.chunks_exact_mut(side * side).enumerate().take(3) {
        for (row, ty) in plane.chunks_exact_mut(side).zip(&rows) {
            for (v, tx) in row.iter_mut().zip(&cols) {
                let line = |y: usize| {
                    let mut acc = value(y, tx.index[0], c) * tx.weight[0];
                    for k in 1..4 {
                        acc += value(y, tx.index[k], c) * tx.weight[k];
                    }
                    acc
                };
                let mut acc = line(ty.index[0]) * ty.weight[0];
                for k in 1..4 {
                    acc += line(ty.index[k]) * ty.weight[k];
                }
                *v = T::from_f32(acc);
            }
        }
    }
}

impl Tiled for Phi4Processor {
    type Plan = Plan;

    fn name(&self) -> &'static str {
        "phi4_multimodal"
    }

    /// `image_attention_mask` `[1 + tiles, 32, 32]` (float32) and
    /// `num_img_tokens` `[1]`.
    fn item_tensors(&self, layout: &OutputLayout) -> Vec<ItemTensor> {
        let [rows, cols] = layout.tile_grid.unwrap_or([1, 1]);
        let [h, w] = layout
            .content_size
            .unwrap_or([rows * self.tile, cols * self.tile]);
        let plan = Plan {
            cols,
            rows,
            resized: (w, h),
        };
        let m = self.mask_side();
        let shape = vec![1 + plan.tiles(), m, m];
        vec![
            ItemTensor::floats("image_attention_mask", shape, &self.attention_mask(&plan)),
            ItemTensor::ints("num_img_tokens", vec![1], &[self.tokens(&plan)]),
        ]
    }

    fn settings(&self, _opts: &PreprocessOptions) -> String {
        format!(
            "phi4_multimodal|{}|{}|{}|torch-2.9-bilinear|fused",
            self.tile, self.patch_size, self.dynamic_hd,
        )
    }

    /// `dynamic_preprocess`'s geometry for a `width`×`height` image.
    fn plan(
        &self,
        (width, height): (usize, usize),
        _: &PreprocessOptions,
    ) -> Result<Plan, VisionError> {
        let t = self.tile;
        let (mut cols, mut rows) = (width.div_ceil(t), height.div_ceil(t));
        if cols * rows > self.dynamic_hd {
            (cols, rows) = optimal_grid((width, height), (t, t), 1, self.dynamic_hd);
        }
        let (target_w, target_h) = (cols * t, rows * t);
        let ratio_w = target_w as f64 / width as f64;
        let ratio_h = target_h as f64 / height as f64;
        let resized = if ratio_w < ratio_h {
            (target_w, (height as f64 * ratio_w) as usize)
        } else {
            ((width as f64 * ratio_h) as usize, target_h)
        };
        if resized.0.min(target_w) < MIN_SIDE || resized.1.min(target_h) < MIN_SIDE {
            return Err(VisionError::Geometry(format!(
                "a {width}x{height} image resized to {}x{} for its {target_w}x{target_h} canvas \
                 has a side under {MIN_SIDE} pixels (the reference refuses such extreme aspect ratios)",
                resized.0, resized.1
            )));
        }
        Ok(Plan {
            cols,
            rows,
            resized,
        })
    }

    fn layout(&self, plan: &Plan) -> OutputLayout {
        let (t, (w, h)) = (self.tile, plan.resized);
        let frames = OutputLayout::frames(1 + plan.tiles(), (t, t), self.tokens(plan));
        OutputLayout {
            content_size: Some([h, w]),
            ..frames
                .with_image_sizes([plan.rows * t, plan.cols * t])
                .with_tiles([plan.rows, plan.cols])
        }
    }

    fn resized_size(&self, plan: &Plan) -> (usize, usize) {
        plan.resized
    }

    /// The canvas's (the global frame is computed from it in place).
    fn buffer_bytes(&self, plan: &Plan, input: (u64, u64)) -> u64 {
        padded_canvas_bytes(input, plan.resized, plan.tiles(), self.tile)
    }

    fn norm(&self) -> &Normalization {
        &self.norm
    }

    fn lut<T: OutElem>(&self) -> Lut<T> {
        self.norm.fused_lut()
    }

    /// The canvas's tiles row by row, as frames `1..`; the canvas stays in
    /// the scratch's `cropped` buffer for [`Tiled::write`]'s global frame.
    fn frames(&self, cut: &mut Cut<'_, Plan>, each: Each<'_>) -> Result<(), VisionError> {
        let (plan, t) = (cut.plan, self.tile);
        let (inter, resized, cropped, raw) = cut.scratch.buffers();
        resize_copy(
            Bicubic::TorchBilinear,
            cut.image,
            plan.resized,
            inter,
            resized,
            cut.parallel,
        )?;
        let size = (plan.cols * t, plan.rows * t);
        pad_into(resized, plan.resized, size, 255, cropped);
        let canvas = RgbView::new(cropped, size.0, size.1)?;
        cut_tiles(canvas, (t, t), raw, &mut |i, tile| each(1 + i, tile))?;
        Ok(())
    }

    /// The tiles ([`write_frames`]), then the global frame before them.
    fn write<T: OutElem>(&self, cut: &mut Cut<'_, Plan>, out: &mut [T]) -> Result<(), VisionError> {
        write_frames(self, cut, out)?;
        let (t, plan) = (self.tile, cut.plan);
        let canvas = RgbView::new(&cut.scratch.cropped, plan.cols * t, plan.rows * t)?;
        let global = out.get_mut(..cut.frames.len()).unwrap_or_default();
        global_frame(canvas, &self.norm.fused_lut(), t, global);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::ItemValues;
    use crate::processor::Processor;
    use crate::PlaceholderLayout;

    #[test]
    fn plans_follow_the_tile_counts() {
        let p = Phi4Processor::phi4_multimodal();
        // 1920×1080: 5×3 tiles, width fills 2240, height int(1080·2240/1920).
        let plan = p.plan((1920, 1080), &PreprocessOptions::default()).ok();
        assert_eq!(
            plan,
            Some(Plan {
                cols: 5,
                rows: 3,
                resized: (2240, 1260)
            })
        );
        // Beyond 36 tiles (12×9) the nearest aspect ratio of at most 36
        // tiles wins: 5:4 exactly.
        let big = p.plan((5000, 4000), &PreprocessOptions::default()).ok();
        assert_eq!(big.map(|b| (b.cols, b.rows)), Some((5, 4)));
        // Too thin: the reference refuses it.
        assert!(p.plan((4000, 3), &PreprocessOptions::default()).is_err());
        assert!(Processor::layout_for(&p, 0, 3, &PreprocessOptions::default()).is_err());
    }

    #[test]
    fn mask_and_tokens_count_the_unpadded_cells() {
        let p = Phi4Processor::phi4_multimodal();
        // 448×300: one tile, 148 rows of white padding = 10 masked rows.
        let plan = Plan {
            cols: 1,
            rows: 1,
            resized: (448, 300),
        };
        assert_eq!(p.valid_cells(&plan), (32, 22));
        assert_eq!(p.tokens(&plan), 256 + 1 + 11 * 16 + 11 + 16);
        let mask = p.attention_mask(&plan);
        assert_eq!(mask.len(), 2 * 32 * 32);
        assert!(mask[..32 * 32].iter().all(|&v| v == 1));
        let tile = &mask[32 * 32..];
        assert_eq!(tile.iter().sum::<usize>(), 22 * 32);
        assert_eq!((tile[21 * 32], tile[22 * 32]), (1, 0));
        // Less than a patch of padding masks nothing.
        let snug = Plan {
            resized: (440, 448),
            ..plan
        };
        assert_eq!(p.valid_cells(&snug), (32, 32));
    }

    #[test]
    fn the_prompt_repeats_the_image_token() {
        let p = Phi4Processor::phi4_multimodal();
        let layout = p.layout(&p.plan((1920, 1080), &PreprocessOptions::default()).unwrap());
        assert_eq!(
            Tiled::placeholder_layout(&p, &layout),
            PlaceholderLayout::repeated(layout.num_placeholder_tokens)
        );
        let tensors = Tiled::item_tensors(&p, &layout);
        assert_eq!(tensors[0].shape, [16, 32, 32]);
        assert_eq!(tensors[0].values.dtype(), "float32");
        assert_eq!(tensors[1].name, "num_img_tokens");
        assert_eq!(
            tensors[1].values,
            ItemValues::Int64(vec![layout.num_placeholder_tokens as i64])
        );
    }

    #[test]
    fn bicubic_weights_sum_to_one_and_same_size_is_identity() {
        for t in [0.0f32, 0.25, 0.5, 0.9] {
            let sum: f32 = cubic_weights(t).iter().sum();
            assert!((sum - 1.0).abs() < 1e-6, "{t}: {sum}");
        }
        let taps = cubic_taps(10, 10);
        assert!(taps
            .iter()
            .enumerate()
            .all(|(i, c)| c.index[1] == i && c.weight[1] == 1.0));
        let taps = cubic_taps(5, 2);
        assert_eq!(taps[0].index, [0, 0, 1, 2]);
        assert_eq!(taps[1].index, [2, 3, 4, 4]);
    }
}
