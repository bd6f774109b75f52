//! "Any resolution" processors: LLaVA-NeXT (LLaVA-1.6) and LLaVA-OneVision,
//! bit-exact with transformers 4.57.1's slow `LlavaNextImageProcessor` and
//! `LlavaOnevisionImageProcessor`.
//!
//! An image becomes a stack of square tiles of side `tile`:
//!
//! 1. the *base* tile: the whole image squashed (aspect ratio not kept) to
//!    `tile`×`tile` with Pillow's bicubic filter;
//! 2. a grid resolution is picked among the configured `(height, width)`
//!    pinpoints: the one keeping the most of the image's pixels once scaled
//!    to fit, ties going to the one that wastes the least canvas, then to
//!    the earlier entry;
//! 3. the image is scaled to fit that resolution (aspect ratio kept, the
//!    free side rounded up), pasted in the middle of a black canvas of the
//!    resolution (8-bit zeros, before normalisation: the padding normalises
//!    to `-mean/std`, not to 0) and cut into `tile`×`tile` tiles, row by row.
//!
//! Every tile is then rescaled and normalised into planar `[3, tile, tile]`;
//! the output is `[1 + tiles, 3, tile, tile]` and `image_sizes` is the
//! decoded image's `[height, width]`.
//!
//! The reference also runs each tile through its shortest-edge resize and
//! centre crop; with the square tile equal to both sizes (what the shipped
//! configs say, and what [`crate::processor_from_config`] requires) those
//! steps leave the tiles untouched, so they are not repeated here.
//!
//! The prompt's placeholder count follows the model processors
//! (`LlavaNextProcessor` / `LlavaOnevisionProcessor`): the base tile's
//! `(tile / patch)²` features, plus the grid's features with the padded
//! rows or columns removed and one newline per remaining row; OneVision
//! further pools the grid features when they exceed `anyres_max_N` tiles'
//! worth. LLaVA-NeXT counts its CLS token and drops it again
//! (`vision_feature_select_strategy = "default"`), OneVision has none
//! (SigLIP, `"full"`), so both bases are `(tile / patch)²`.
//!
//! OneVision's multi-image mode ([`PreprocessOptions::multi_image`]): when
//! a prompt holds several images (the processor called with the images
//! nested per prompt), `LlavaOnevisionImageProcessor` tiles none of them:
//! each is padded to a square (centred, the padding the mean colour's
//! `int(mean · 255)`) and resized to one tile, `[1, 3, tile, tile]`, and
//! `LlavaOnevisionProcessor` gives it `(tile / patch)² + 1` tokens (the
//! features and one newline).

use crate::error::VisionError;
use crate::image::RgbView;
use crate::normalize::Normalization;
use crate::output::OutputLayout;
use crate::processor::PreprocessOptions;
use crate::resize::{self, resize_into, Bicubic};
use crate::tiles::{cut_frames, padded_tile, Cut, Each, Tiled};

/// Which model family's rules an [`AnyresProcessor`] follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnyresFamily {
    /// LLaVA-NeXT / LLaVA-1.6 (`LlavaNextImageProcessor`).
    LlavaNext,
    /// LLaVA-OneVision (`LlavaOnevisionImageProcessor`), single image.
    LlavaOnevision,
}

/// The OneVision pinpoints: every `(i·384, j·384)` for `i, j` in 1..=6.
fn onevision_pinpoints() -> Vec<(usize, usize)> {
    (1..=6)
        .flat_map(|i| (1..=6).map(move |j| (i * 384, j * 384)))
        .collect()
}

/// An any-resolution tiling processor (LLaVA-NeXT, LLaVA-OneVision).
#[derive(Debug, Clone, PartialEq)]
pub struct AnyresProcessor {
    /// The family (token rule, name).
    pub family: AnyresFamily,
    /// Candidate grid resolutions `(height, width)`, each a multiple of
    /// `tile` on both sides, in the config's order (it breaks ties).
    pub grid_pinpoints: Vec<(usize, usize)>,
    /// Side of the square tiles and of the squashed base image.
    pub tile: usize,
    /// Normalisation.
    pub norm: Normalization,
    /// Vision transformer patch size (for the placeholder count).
    pub patch_size: usize,
    /// OneVision's `anyres_max_N`: grids with more than `N` tiles' worth of
    /// features are pooled down in the token count. `None` for LLaVA-NeXT.
    pub max_num_patches: Option<usize>,
}

/// What an image of a given size becomes, before any pixel is touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The decoded image's `(height, width)`.
    image: (usize, usize),
    /// The chosen pinpoint `(height, width)`.
    grid: (usize, usize),
    /// The image's size scaled into the grid, `(height, width)`.
    scaled: (usize, usize),
    /// Grid tiles (the base tile excluded).
    tiles: usize,
    /// Placeholder tokens.
    tokens: usize,
    /// OneVision's multi-image mode: padded to a square, one tile.
    square: bool,
}

impl AnyresProcessor {
    /// llava-hf/llava-v1.6-mistral-7b-hf (and the other 1.6 checkpoints):
    /// 336-pixel tiles on five grids, CLIP normalisation, patch 14.
    pub fn llava_next() -> Self {
        AnyresProcessor {
            family: AnyresFamily::LlavaNext,
            grid_pinpoints: vec![(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)],
            tile: 336,
            norm: Normalization::CLIP,
            patch_size: 14,
            max_num_patches: None,
        }
    }

    /// llava-hf/llava-onevision-qwen2-*-ov-hf: 384-pixel tiles on the 36
    /// grids up to 6×6, mean and std 0.5, SigLIP patch 14, `anyres_max_9`.
    pub fn llava_onevision() -> Self {
        AnyresProcessor {
            family: AnyresFamily::LlavaOnevision,
            grid_pinpoints: onevision_pinpoints(),
            tile: 384,
            norm: Normalization::HALF,
            patch_size: 14,
            max_num_patches: Some(9),
        }
    }

    /// The grid, scaled size, tile count and token count for a decoded
    /// `width`×`height` image.
    fn plan_for(&self, width: usize, height: usize) -> Result<Plan, VisionError> {
        let grid = select_best_resolution(height, width, &self.grid_pinpoints)
            .ok_or_else(|| VisionError::Config("image_grid_pinpoints is empty".into()))?;
        let scaled = scaled_size(height, width, grid);
        let tiles = (grid.0 / self.tile) * (grid.1 / self.tile);
        let tokens = self.token_count(height, width, grid);
        Ok(Plan {
            image: (height, width),
            grid,
            scaled,
            tiles,
            tokens,
            square: false,
        })
    }

    /// OneVision's plan for an image of a multi-image prompt: one tile of
    /// the image padded to a square, the base features and a newline.
    fn square_plan(&self, width: usize, height: usize) -> Plan {
        let side = self.tile / self.patch_size;
        let t = self.tile;
        Plan {
            image: (height, width),
            grid: (t, t),
            scaled: (t, t),
            tiles: 0,
            tokens: side * side + 1,
            square: true,
        }
    }

    /// Whether `opts` asks for the multi-image mode and the family has one.
    fn squares(&self, opts: &PreprocessOptions) -> bool {
        opts.multi_image && self.family == AnyresFamily::LlavaOnevision
    }

    /// The padding of the multi-image mode: each channel's `int(mean·255)`.
    fn mean_colour(&self) -> [u8; 3] {
        self.norm
            .mean
            .map(|m| (f64::from(m) * 255.0).clamp(0.0, 255.0) as u8)
    }

    /// The model processor's placeholder count for an `height`×`width`
    /// image whose grid is `grid`.
    fn token_count(&self, height: usize, width: usize, grid: (usize, usize)) -> usize {
        let side = (self.tile / self.patch_size) as i64;
        let mut cur_h = side * (grid.0 / self.tile) as i64;
        let mut cur_w = side * (grid.1 / self.tile) as i64;
        let (h, w) = (height as f64, width as f64);
        // Remove the rows (or columns) of features that only saw padding.
        if w / h > cur_w as f64 / cur_h as f64 {
            let new_h = int_round7(h * (cur_w as f64 / w));
            cur_h -= 2 * (cur_h - new_h).div_euclid(2);
        } else {
            let new_w = int_round7(w * (cur_h as f64 / h));
            cur_w -= 2 * (cur_w - new_w).div_euclid(2);
        }
        let mut unpadded = cur_h * cur_w;
        let mut newlines = cur_h;
        if let Some(max) = self.max_num_patches {
            let ratio = ((cur_h * cur_w) as f64 / (max as i64 * side * side) as f64).sqrt();
            if ratio > 1.1 {
                let pooled_h = py_floor_div(cur_h as f64, ratio) as i64;
                let pooled_w = py_floor_div(cur_w as f64, ratio) as i64;
                unpadded = pooled_h * pooled_w;
                newlines = pooled_h;
            }
        }
        (unpadded + newlines + side * side).max(0) as usize
    }
}

/// transformers' `select_best_resolution`: the pinpoint `(height, width)`
/// that keeps the most of the image's pixels once it is scaled to fit
/// (never counting more than it has), then the one wasting the least of
/// its area; the first such in `pinpoints`. `None` only for an empty list.
fn select_best_resolution(
    height: usize,
    width: usize,
    pinpoints: &[(usize, usize)],
) -> Option<(usize, usize)> {
    let (oh, ow) = (height as f64, width as f64);
    let original = (height as u128) * (width as u128);
    let mut best = None;
    let mut max_effective = 0u128;
    let mut min_wasted = u128::MAX;
    for &(ph, pw) in pinpoints {
        let (sw, sh) = (pw as f64 / ow, ph as f64 / oh);
        let scale = if sh < sw { sh } else { sw };
        // Float to int truncates, as Python's int() does.
        let down_w = (ow * scale) as u128;
        let down_h = (oh * scale) as u128;
        let effective = (down_w * down_h).min(original);
        let wasted = ((ph as u128) * (pw as u128)).saturating_sub(effective);
        if effective > max_effective || (effective == max_effective && wasted < min_wasted) {
            max_effective = effective;
            min_wasted = wasted;
            best = Some((ph, pw));
        }
    }
    best
}

/// transformers' `get_patch_output_size`: the image scaled to fit `grid`
/// with its aspect ratio kept, the fitted side exact and the other rounded
/// up (but not beyond the grid). `(height, width)`.
fn scaled_size(height: usize, width: usize, grid: (usize, usize)) -> (usize, usize) {
    let (gh, gw) = grid;
    let scale_w = gw as f64 / width as f64;
    let scale_h = gh as f64 / height as f64;
    if scale_w < scale_h {
        let h = (height as f64 * scale_w).ceil() as usize;
        (h.min(gh), gw)
    } else {
        let w = (width as f64 * scale_h).ceil() as usize;
        (gh, w.min(gw))
    }
}

/// Python's `int(round(x, 7))` for `x >= 0`: the integer part, plus one
/// when the fraction rounds to 1 at seven decimals, i.e. exceeds
/// 0.99999995. That decimal is not a binary fraction, so there are no ties
/// and the nearest double (just below it) is the exact threshold.
fn int_round7(x: f64) -> i64 {
    let whole = x.floor();
    let fraction = x - whole;
    #[allow(clippy::excessive_precision)]
    let carry = fraction > 0.999_999_95;
    whole as i64 + i64::from(carry)
}

/// Python's float floor division `a // b` (CPython's `float_floor_div`:
/// from `fmod`, so it can differ from `floor(a / b)` by one).
fn py_floor_div(a: f64, b: f64) -> f64 {
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    if div != 0.0 {
        let mut floored = div.floor();
        if div - floored > 0.5 {
            floored += 1.0;
        }
        floored
    } else {
        0.0f64.copysign(a / b)
    }
}

/// `image` centred on a square canvas of its longer side filled with
/// `colour` (`pad_to_square`: the shorter side's offset rounded down), in
/// `out`; the image itself when it is square.
fn pad_square<'a>(
    image: RgbView<'a>,
    colour: [u8; 3],
    out: &'a mut Vec<u8>,
) -> Result<RgbView<'a>, VisionError> {
    let (w, h) = (image.width(), image.height());
    if w == h {
        return Ok(image);
    }
    let side = w.max(h);
    out.clear();
    out.extend(std::iter::repeat_n(colour, side * side).flatten());
    let (top, left) = ((side - h) / 2, (side - w) / 2);
    for (y, row) in image.data().chunks_exact(w * 3).enumerate() {
        let start = ((top + y) * side + left) * 3;
        out[start..start + w * 3].copy_from_slice(row);
    }
    RgbView::new(out, side, side)
}

impl Tiled for AnyresProcessor {
    type Plan = Plan;

    fn name(&self) -> &'static str {
        match self.family {
            AnyresFamily::LlavaNext => "llava_next",
            AnyresFamily::LlavaOnevision => "llava_onevision",
        }
    }

    fn settings(&self, opts: &PreprocessOptions) -> String {
        format!(
            "anyres|{:?}|{:?}|{}|{}|{:?}|pillow-12.2-bicubic|multi={}",
            self.family,
            self.grid_pinpoints,
            self.tile,
            self.patch_size,
            self.max_num_patches,
            self.squares(opts),
        )
    }

    fn norm(&self) -> &Normalization {
        &self.norm
    }

    fn plan(&self, (w, h): (usize, usize), opts: &PreprocessOptions) -> Result<Plan, VisionError> {
        if self.squares(opts) {
            return Ok(self.square_plan(w, h));
        }
        self.plan_for(w, h)
    }

    fn layout(&self, plan: &Plan) -> OutputLayout {
        let side = (self.tile, self.tile);
        OutputLayout::frames(1 + plan.tiles, side, plan.tokens)
            .with_image_sizes([plan.image.0, plan.image.1])
    }

    fn resized_size(&self, plan: &Plan) -> (usize, usize) {
        (plan.scaled.1, plan.scaled.0)
    }

    fn buffer_bytes(&self, plan: &Plan, input: (u64, u64)) -> u64 {
        let t = self.tile as u64;
        if plan.square {
            let side = input.0.max(input.1);
            return 3 * side * side + resize::working_bytes((side, side), (t, t));
        }
        let (sh, sw) = (plan.scaled.0 as u64, plan.scaled.1 as u64);
        let resizes = resize::working_bytes(input, (t, t)) + resize::working_bytes(input, (sw, sh));
        resizes + 3 * t * t
    }

    /// The base tile, then the grid's tiles row by row; in the
    /// multi-image mode the square-padded image's one tile.
    fn frames(&self, cut: &mut Cut<'_, Self::Plan>, each: Each<'_>) -> Result<(), VisionError> {
        let (image, parallel) = (cut.image, cut.parallel);
        let plan = cut.plan;
        let t = self.tile;
        if plan.square {
            let padded = pad_square(image, self.mean_colour(), &mut cut.scratch.cropped)?;
            let (inter, resized) = (&mut cut.scratch.inter, &mut cut.scratch.resized);
            each(0, resize_into(padded, t, t, inter, resized, parallel)?);
            return Ok(());
        }
        cut_frames(self, cut, each)
    }

    /// The base tile and the image scaled into the grid; none in the
    /// multi-image mode.
    fn whole_resizes(&self, plan: &Plan) -> Option<(Bicubic, Vec<(usize, usize)>)> {
        let (sh, sw) = plan.scaled;
        let sizes = vec![(self.tile, self.tile), (sw, sh)];
        (!plan.square).then_some((Bicubic::Pillow, sizes))
    }

    /// The base tile, then the grid's tiles row by row.
    fn cut_resized(
        &self,
        plan: &Plan,
        resized: &[RgbView<'_>],
        buf: &mut Vec<u8>,
        each: Each<'_>,
    ) -> Result<(), VisionError> {
        let &[base, scaled] = resized else {
            return Err(VisionError::Geometry(format!(
                "{}: {} resized images, not the base and the grid",
                Tiled::name(self),
                resized.len()
            )));
        };
        each(0, base);
        let t = self.tile;
        let (sh, sw) = plan.scaled;
        let offset = ((plan.grid.0 - sh) / 2, (plan.grid.1 - sw) / 2);
        let columns = plan.grid.1 / t;
        for i in 0..plan.tiles {
            let origin = ((i / columns) * t, (i % columns) * t);
            padded_tile(scaled, offset, origin, t, buf);
            each(1 + i, RgbView::new(buf, t, t)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_resolution_prefers_kept_pixels_then_less_waste() {
        let p = AnyresProcessor::llava_next();
        // A wide 4:3 photo: 672×504 fits 672×672 keeping the most pixels.
        assert_eq!(
            select_best_resolution(480, 640, &p.grid_pinpoints),
            Some((672, 672))
        );
        // Small images keep all their pixels everywhere: least waste wins,
        // the first of the equally small grids.
        assert_eq!(
            select_best_resolution(10, 10, &p.grid_pinpoints),
            Some((336, 672))
        );
        // A 1-pixel-wide column scales to zero pixels on every grid: it
        // keeps nothing anywhere, so the smallest grid wins.
        assert_eq!(
            select_best_resolution(4000, 1, &p.grid_pinpoints),
            Some((336, 672))
        );
        assert_eq!(select_best_resolution(4000, 1, &[]), None);
    }

    #[test]
    fn scaled_size_fits_one_side_and_rounds_the_other_up() {
        assert_eq!(scaled_size(480, 640, (672, 672)), (504, 672));
        assert_eq!(scaled_size(1, 1, (336, 672)), (336, 336));
        assert_eq!(scaled_size(1000, 3, (1008, 336)), (1008, 4));
    }

    #[test]
    fn onevision_images_of_a_multi_image_prompt_are_one_padded_tile() {
        let ov = AnyresProcessor::llava_onevision();
        let multi = PreprocessOptions {
            multi_image: true,
            ..PreprocessOptions::default()
        };
        let plan = ov.plan((640, 480), &multi).unwrap();
        let layout = ov.layout(&plan);
        assert_eq!(layout.shape, [1, 3, 384, 384]);
        assert_eq!(layout.num_placeholder_tokens, 27 * 27 + 1);
        assert_eq!(layout.image_sizes, Some([480, 640]));
        assert_ne!(
            Tiled::settings(&ov, &multi),
            Tiled::settings(&ov, &PreprocessOptions::default())
        );
        // LLaVA-NeXT has no such mode.
        let next = AnyresProcessor::llava_next();
        assert_eq!(
            next.plan((640, 480), &multi).unwrap(),
            next.plan((640, 480), &PreprocessOptions::default())
                .unwrap()
        );
        assert_eq!(ov.mean_colour(), [127, 127, 127]);
    }

    #[test]
    fn pad_square_centres_the_image_on_the_colour() {
        // 2×1: one row of two red pixels, centred on a 2×2 canvas: the
        // offset (2 - 1) / 2 rounds down, so the row is the top one.
        let red = [255u8, 0, 0, 255, 0, 0];
        let mut out = Vec::new();
        let view = RgbView::new(&red, 2, 1).unwrap();
        let padded = pad_square(view, [7, 8, 9], &mut out).unwrap();
        assert_eq!((padded.width(), padded.height()), (2, 2));
        assert_eq!(padded.data(), [255, 0, 0, 255, 0, 0, 7, 8, 9, 7, 8, 9]);
        // 1×3: a column, centred at column 1 of a 3×3 canvas.
        let column = [1u8, 1, 1, 2, 2, 2, 3, 3, 3];
        let view = RgbView::new(&column, 1, 3).unwrap();
        let padded = pad_square(view, [0, 0, 0], &mut out).unwrap();
        let middle: Vec<u8> = padded
            .data()
            .chunks(3)
            .skip(1)
            .step_by(3)
            .flatten()
            .copied()
            .collect();
        assert_eq!(middle, column);
        // A square image is its own padding.
        let view = RgbView::new(&red[..3], 1, 1).unwrap();
        assert_eq!(
            pad_square(view, [0, 0, 0], &mut out).unwrap().data(),
            &red[..3]
        );
    }

    #[test]
    fn python_rounding_helpers() {
        assert_eq!(int_round7(2.999_999_95), 2);
        assert_eq!(int_round7(2.999_999_96), 3);
        assert_eq!(int_round7(7.25), 7);
        assert_eq!(py_floor_div(7.0, 2.0), 3.0);
        assert_eq!(py_floor_div(1.0, 0.1), 9.0); // floor(1.0 / 0.1) would be 10
    }

    #[test]
    fn token_counts_of_known_sizes() {
        let next = AnyresProcessor::llava_next();
        // 640×480 on 672×672: 48×48 features, 6 padded rows at each end.
        let plan = next.plan_for(640, 480).unwrap();
        assert_eq!(plan.tiles, 4);
        assert_eq!(plan.tokens, 36 * 48 + 36 + 576);
        let ov = AnyresProcessor::llava_onevision();
        let plan = ov.plan_for(640, 480).unwrap();
        // Every grid from 768×768 up keeps all pixels; 768×768 wastes least.
        assert_eq!(plan.grid, (768, 768));
        assert_eq!(plan.tiles, 4);
    }

    #[test]
    fn padding_is_black_around_the_pasted_image() {
        let src = [200u8; 6];
        let view = RgbView::new(&src, 2, 1).unwrap();
        let mut out = Vec::new();
        padded_tile(view, (1, 1), (0, 0), 3, &mut out);
        let expect = [0, 0, 0, 0, 1, 1, 0, 0, 0];
        for (px, e) in out.chunks(3).zip(expect) {
            assert_eq!(px, [200 * e; 3]);
        }
    }

    #[test]
    fn every_tile_byte_is_the_canvas_byte_whatever_the_buffer_held() {
        let (w, h) = (7, 5);
        let src: Vec<u8> = (0..w * h * 3).map(|i| (i % 251 + 1) as u8).collect();
        let view = RgbView::new(&src, w, h).unwrap();
        let tile = 4;
        for offset in [(0, 0), (1, 0), (0, 1), (3, 2)] {
            // The canvas: two tiles each way, the image pasted at `offset`.
            let side = 2 * tile;
            let canvas = |y: usize, x: usize, c: usize| {
                let (iy, ix) = (y.wrapping_sub(offset.0), x.wrapping_sub(offset.1));
                if iy < h && ix < w {
                    src[(iy * w + ix) * 3 + c]
                } else {
                    0
                }
            };
            for origin in [(0, 0), (0, tile), (tile, 0), (tile, tile)] {
                // A short buffer, then a full one of stale bytes.
                for mut out in [vec![0xAB; 5], vec![0xCD; tile * tile * 3]] {
                    padded_tile(view, offset, origin, tile, &mut out);
                    assert_eq!(out.len(), tile * tile * 3);
                    for (i, &b) in out.iter().enumerate() {
                        let (y, x, c) = (i / (tile * 3), i / 3 % tile, i % 3);
                        assert!(y < side && x < side);
                        let want = canvas(origin.0 + y, origin.1 + x, c);
                        assert_eq!(b, want, "offset {offset:?} origin {origin:?} byte {i}");
                    }
                }
            }
        }
    }
}
