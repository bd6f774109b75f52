//! Llama 4: transformers 4.57.1's `Llama4ImageProcessorFast` (the only
//! class there is: torchvision), one image per call.
//!
//! 1. The *canvas* is chosen among the supported resolutions: every
//!    `rows × cols` arrangement of at most `max_patches` (16) tiles of
//!    `size` (336²), in the reference's order. Each canvas scales the
//!    image by the smaller of its two side ratios (in f32, as the
//!    reference's tensors do); the smallest scale ≥ 1 wins, or without
//!    one the largest below 1; among equal scales the smallest area.
//! 2. The image is resized, aspect ratio kept, to fit
//!    `min(max(side, tile), canvas side)` on each axis (the reference's
//!    `get_max_res_without_distortion`, whose arithmetic is f32 or f64
//!    as its operands are tensors or Python numbers: reproduced), with
//!    PyTorch's antialiased bilinear on `uint8`
//!    ([`Bicubic::TorchBilinear`]), and padded with black at the right
//!    and bottom to the canvas.
//! 3. The canvas is cut into its tiles row by row; with more than one
//!    tile a *global* tile follows: the whole image squashed to one tile.
//!
//! Every frame is normalised in bfloat16 ([`Normalization::bf16_value`],
//! mean and std 0.5) and written planar: `[tiles (+ 1), 3, 336, 336]`.
//!
//! The prompt (`Llama4Processor`): the chat template writes `<|image|>`
//! once per image; it becomes `<|image_start|>`, then (with more than one
//! tile) each tile's `<|patch|>` tokens row by row, the tiles of a row
//! separated by `<|tile_x_separator|>` and each row ended by
//! `<|tile_y_separator|>`, then `<|image|>`, the global tile's `<|patch|>`
//! tokens and `<|image_end|>`. A tile has `(side / patch)² / 4` patch
//! tokens (patch 14, pixel shuffle 0.5: 144).
//! [`OutputLayout::num_placeholder_tokens`] counts the `<|patch|>` tokens;
//! [`OutputLayout::tile_grid`] gives `[rows, cols]`, the item's
//! `aspect_ratios` `[1, 2]` (as the processor returns it per image) and
//! `patches_per_image` `[1]` (vLLM's split of the pixels per image).

use crate::error::VisionError;
use crate::image::RgbView;
use crate::normalize::{Lut, Normalization, OutElem};
use crate::output::{ItemTensor, OutputLayout};
use crate::placeholders::{self, PlaceholderLayout};
use crate::processor::PreprocessOptions;
use crate::resize::{self, Bicubic};
use crate::tiles::{cut_frames, padded_tile, tiles_and_global, with_global, Cut, Each, Tiled};

/// The Llama 4 image processor.
#[derive(Debug, Clone, PartialEq)]
pub struct Llama4Processor {
    /// The side of the square tiles (`size`: 336).
    pub tile: usize,
    /// `max_patches`: the most tiles a canvas has.
    pub max_patches: usize,
    /// Normalisation (in bfloat16).
    pub norm: Normalization,
    /// `<|patch|>` tokens per tile.
    pub tokens_per_tile: usize,
}

/// What one image becomes: the resized size, the canvas in tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// `(width, height)` of the resized image (before padding).
    resized: (usize, usize),
    rows: usize,
    cols: usize,
}

impl Plan {
    fn tiles(&self) -> usize {
        self.rows * self.cols
    }

    /// The tiles, and the global tile when there are several.
    fn frames(&self) -> usize {
        with_global(self.tiles())
    }
}

/// `find_supported_resolutions`: `(rows, cols)` of every canvas of at most
/// `max` tiles, grouped by aspect ratio in order of first appearance
/// (tile counts from `max` down, factors ascending).
fn supported_canvases(max: usize) -> Vec<(usize, usize)> {
    let mut groups: Vec<(f64, Vec<(usize, usize)>)> = Vec::new();
    for chunks in (1..=max).rev() {
        for rows in (1..=chunks).filter(|f| chunks % f == 0) {
            let cols = chunks / rows;
            let ratio = rows as f64 / cols as f64;
            match groups.iter_mut().find(|(r, _)| *r == ratio) {
                Some((_, members)) => members.push((rows, cols)),
                None => groups.push((ratio, vec![(rows, cols)])),
            }
        }
    }
    groups.into_iter().flat_map(|(_, m)| m).collect()
}

/// A number of the reference's arithmetic: an f32 tensor value or a
/// Python float (f64).
#[derive(Debug, Clone, Copy)]
struct Num {
    value: f64,
    tensor: bool,
}

impl Num {
    /// `numerator / denominator`, a tensor's f32 division when the
    /// numerator is a tensor.
    fn ratio(numerator: usize, tensor: bool, denominator: usize) -> Num {
        let value = if tensor {
            f64::from(numerator as f32 / denominator as f32)
        } else {
            numerator as f64 / denominator as f64
        };
        Num { value, tensor }
    }

    /// `self < other`, in f32 when either is a tensor.
    fn lt(self, other: Num) -> bool {
        if self.tensor || other.tensor {
            (self.value as f32) < (other.value as f32)
        } else {
            self.value < other.value
        }
    }

    /// `floor(n · self)`.
    fn floor_times(self, n: usize) -> usize {
        if self.tensor {
            (n as f32 * self.value as f32).floor() as usize
        } else {
            (n as f64 * self.value).floor() as usize
        }
    }
}

impl Llama4Processor {
    /// meta-llama/Llama-4-Scout-17B-16E-Instruct (and Maverick): 336-pixel
    /// tiles, at most 16, mean and std 0.5, 144 tokens per tile.
    pub fn llama4() -> Self {
        Llama4Processor {
            tile: 336,
            max_patches: 16,
            norm: Normalization::HALF,
            tokens_per_tile: 144,
        }
    }

    /// `get_best_fit` for a `width`×`height` image: the canvas's `(rows, cols)`.
    fn best_canvas(&self, width: usize, height: usize) -> (usize, usize) {
        let t = self.tile;
        let scored: Vec<((usize, usize), f32)> = supported_canvases(self.max_patches)
            .into_iter()
            .map(|(rows, cols)| {
                let scale_w = (cols * t) as f32 / width as f32;
                let scale_h = (rows * t) as f32 / height as f32;
                let scale = if scale_h > scale_w { scale_w } else { scale_h };
                ((rows, cols), scale)
            })
            .collect();
        let up = scored.iter().map(|s| s.1).filter(|&s| s >= 1.0);
        let selected = up.reduce(f32::min).unwrap_or_else(|| {
            scored
                .iter()
                .map(|s| s.1)
                .filter(|&s| s < 1.0)
                .fold(f32::NEG_INFINITY, f32::max)
        });
        scored
            .iter()
            .filter(|s| s.1 == selected)
            .map(|s| s.0)
            .reduce(|best, c| if c.0 * c.1 < best.0 * best.1 { c } else { best })
            .unwrap_or((1, 1))
    }
}

impl Tiled for Llama4Processor {
    type Plan = Plan;

    /// The tiles' `<|patch|>` runs with their separators, then the global tile's.
    fn placeholder_layout(&self, layout: &OutputLayout) -> PlaceholderLayout {
        placeholders::llama4(placeholders::grid(layout), self.tokens_per_tile)
    }

    /// `aspect_ratios` `[1, 2]`, the canvas's `[rows, cols]` (the
    /// processor's), and `patches_per_image` `[1]`, the frames (vLLM's,
    /// which splits the pixels by it).
    fn item_tensors(&self, layout: &OutputLayout) -> Vec<ItemTensor> {
        let [rows, cols] = placeholders::grid(layout);
        let frames = layout.shape.first().copied().unwrap_or(1);
        vec![
            ItemTensor::ints("aspect_ratios", vec![1, 2], &[rows, cols]),
            ItemTensor::ints("patches_per_image", vec![1], &[frames]),
        ]
    }

    fn name(&self) -> &'static str {
        "llama4"
    }

    fn settings(&self, _opts: &PreprocessOptions) -> String {
        format!(
            "llama4|{}|{}|{}|torch-2.9-bilinear|bf16",
            self.tile, self.max_patches, self.tokens_per_tile,
        )
    }

    fn plan(
        &self,
        (width, height): (usize, usize),
        _: &PreprocessOptions,
    ) -> Result<Plan, VisionError> {
        let (rows, cols) = self.best_canvas(width, height);
        let (canvas_h, canvas_w) = (rows * self.tile, cols * self.tile);
        // `min(max(side, tile), canvas side)`: the canvas's (a tensor) only
        // when strictly smaller.
        let fit = |side: usize, canvas: usize| {
            let up = side.max(self.tile);
            if canvas < up {
                (canvas, true)
            } else {
                (up, false)
            }
        };
        let (target_h, h_tensor) = fit(height, canvas_h);
        let (target_w, w_tensor) = fit(width, canvas_w);
        let scale_w = Num::ratio(target_w, w_tensor, width);
        let scale_h = Num::ratio(target_h, h_tensor, height);
        let (new_h, new_w) = if scale_w.lt(scale_h) {
            (scale_w.floor_times(height).min(target_h), target_w)
        } else {
            (target_h, scale_h.floor_times(width).min(target_w))
        };
        Ok(Plan {
            resized: (new_w.max(1), new_h.max(1)),
            rows,
            cols,
        })
    }

    fn layout(&self, plan: &Plan) -> OutputLayout {
        let (frames, t) = (plan.frames(), self.tile);
        OutputLayout::frames(frames, (t, t), self.tokens_per_tile * frames)
            .with_tiles([plan.rows, plan.cols])
    }

    fn resized_size(&self, plan: &Plan) -> (usize, usize) {
        plan.resized
    }

    /// The canvas's, and the global tile's resize.
    fn buffer_bytes(&self, plan: &Plan, input: (u64, u64)) -> u64 {
        let t = self.tile as u64;
        let (w, h) = (plan.resized.0 as u64, plan.resized.1 as u64);
        let resizes = resize::working_bytes(input, (w, h)) + resize::working_bytes(input, (t, t));
        resizes + 3 * t * t
    }

    fn norm(&self) -> &Normalization {
        &self.norm
    }

    fn lut<T: OutElem>(&self) -> Lut<T> {
        self.norm.bf16_lut()
    }

    /// The canvas's tiles row by row, then the global tile.
    fn frames(&self, cut: &mut Cut<'_, Self::Plan>, each: Each<'_>) -> Result<(), VisionError> {
        cut_frames(self, cut, each)
    }

    /// The image resized to fit the canvas, and to one tile (the global
    /// tile) when the canvas has several.
    fn whole_resizes(&self, plan: &Plan) -> Option<(Bicubic, Vec<(usize, usize)>)> {
        let mut sizes = vec![plan.resized];
        if plan.tiles() > 1 {
            sizes.push((self.tile, self.tile));
        }
        Some((Bicubic::TorchBilinear, sizes))
    }

    /// The canvas's tiles row by row (the resized image at its top left,
    /// black around it), then the global tile.
    fn cut_resized(
        &self,
        plan: &Plan,
        resized: &[RgbView<'_>],
        buf: &mut Vec<u8>,
        each: Each<'_>,
    ) -> Result<(), VisionError> {
        let (scaled, global) = tiles_and_global("llama4", plan.tiles(), resized)?;
        let t = self.tile;
        for i in 0..plan.tiles() {
            let origin = ((i / plan.cols) * t, (i % plan.cols) * t);
            padded_tile(scaled, (0, 0), origin, t, buf);
            each(i, RgbView::new(buf, t, t)?);
        }
        if let Some(global) = global {
            each(plan.tiles(), global);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor::Processor;

    #[test]
    fn canvases_follow_the_reference_order() {
        // The docstring's example (max 4 chunks): ratios in order of first
        // appearance, (1, 4) first.
        assert_eq!(
            supported_canvases(4),
            [
                (1, 4),
                (2, 2),
                (1, 1),
                (4, 1),
                (1, 3),
                (3, 1),
                (1, 2),
                (2, 1)
            ]
        );
    }

    #[test]
    fn plans_fit_the_image_without_distortion() {
        let p = Llama4Processor::llama4();
        let plan = |w, h| p.plan((w, h), &PreprocessOptions::default()).ok();
        // A small image is not upscaled past the tile: one tile.
        assert_eq!(
            plan(200, 100),
            Some(Plan {
                resized: (336, 168),
                rows: 1,
                cols: 1
            })
        );
        // 800×600: the 2×3 canvas (672×1008) scales it by 1.12, the least
        // upscale; six tiles and the global one.
        let big = p.plan((800, 600), &PreprocessOptions::default()).ok();
        assert_eq!(big.map(|b| (b.rows, b.cols, b.frames())), Some((2, 3, 7)));
        assert!(Processor::layout_for(&p, 0, 5, &PreprocessOptions::default()).is_err());
    }

    /// Every size of the reference's table (tests/data/expected.json,
    /// `tiled_layouts.llama4`: height, width, rows, cols, resized height
    /// and width) plans the same canvas and resized size.
    #[test]
    fn plans_match_the_reference_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/expected.json");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let all: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let rows = all["tiled_layouts"]["llama4"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(rows.len() > 2000, "only {} rows", rows.len());
        let p = Llama4Processor::llama4();
        for row in rows {
            let v: Vec<usize> = serde_json::from_value(row.clone()).unwrap_or_default();
            let [h, w, rows, cols, nh, nw] = v[..] else {
                panic!("bad row {row}")
            };
            let plan = p.plan((w, h), &PreprocessOptions::default()).ok();
            assert_eq!(
                plan,
                Some(Plan {
                    resized: (nw, nh),
                    rows,
                    cols
                }),
                "{row}"
            );
        }
    }
}
