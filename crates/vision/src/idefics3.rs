//! Idefics3 and SmolVLM (v1): bit-exact with transformers 4.57.1's slow
//! `Idefics3ImageProcessor` (one image per call).
//!
//! Three Pillow resizes with the config's `resample` (1, LANCZOS, in the
//! shipped configs), each from the previous one's 8-bit result:
//!
//! 1. the longest side becomes `size.longest_edge` (up or down); the other
//!    side is scaled and truncated, then rounded up to an even number (at
//!    least 1), and both are held to 4096 pixels;
//! 2. with `do_image_splitting` (the default) the long side is rounded up to
//!    a multiple of the tile (`max_image_size.longest_edge`), the short side
//!    scaled from it, truncated and also rounded up to a multiple;
//! 3. that image is cut into `rows × cols` tiles of the tile's side, row by
//!    row, and followed by a *global* image: the step-2 image squashed to one
//!    tile. An image that is a single tile after step 2 is not split (`rows =
//!    cols = 0`) and is its own global image. Without splitting, the step-1
//!    image is squashed to one tile (`rows = cols = 0`).
//!
//! Every frame is rescaled, normalised (mean and std 0.5) and written planar:
//! `[rows·cols + 1, 3, tile, tile]`. The reference pads a batch to its
//! largest frame count; one image per call never pads.
//!
//! The prompt (`Idefics3Processor`): each tile gets `<fake_token_around_image>`,
//! `<row_r_col_c>` and `image_seq_len` `<image>` tokens, each row of tiles
//! ends with a newline, and the global image gets `<fake_token_around_image>`,
//! `<global-img>` and `image_seq_len` `<image>` tokens, closed by a last
//! `<fake_token_around_image>`. `image_seq_len` is the model processor's
//! (`processor_config.json`: 81 for SmolVLM, 169 for Idefics3-8B; see
//! [`crate::processor_from_model_dir`]). [`OutputLayout::num_placeholder_tokens`]
//! counts the `<image>` tokens, `image_seq_len × (rows·cols + 1)`, and
//! [`OutputLayout::tile_grid`] gives `[rows, cols]` for the tags.
//!
//! With `do_pad` (the default) the reference also returns
//! `pixel_attention_mask`, which the model reads beside the pixels to skip
//! patches of padding: each frame zero-padded at the bottom and right to
//! the batch's largest frame, 1 over its own pixels and 0 over the padding
//! (`make_pixel_mask`), and a sample with fewer frames than the batch's
//! largest padded with all-zero frames. Every frame of an image is one
//! tile (step 2 makes the image a multiple of the tile, the global image
//! is squashed to one), and a prompt's images are concatenated frame after
//! frame, so within one prompt nothing is padded and the mask is all ones;
//! only prompts batched together pad each other's frame counts. Iris gives
//! each image's own mask as an item tensor ([`ItemTensor::mask`]),
//! `[rows·cols + 1, tile, tile]`: the reference's int64 0/1 as `uint8`
//! (vLLM concatenates the items' masks by `num_patches`, as it does the
//! pixels).

use crate::error::VisionError;
use crate::image::RgbView;
use crate::normalize::Normalization;
use crate::output::{ItemTensor, OutputLayout};
use crate::placeholders::{self, PlaceholderLayout};
use crate::processor::PreprocessOptions;
use crate::resize::{self, resize_copy, Bicubic};
use crate::tiles::{cut_tiles, Cut, Each, Tiled};

/// The reference's absolute limit on either side after step 1.
const MAX_IMAGE_SIZE: usize = 4096;

/// The Idefics3 / SmolVLM image processor.
#[derive(Debug, Clone, PartialEq)]
pub struct Idefics3Processor {
    /// `size.longest_edge`: the long side after step 1.
    pub longest_edge: usize,
    /// `max_image_size.longest_edge`: the side of the square tiles.
    pub tile: usize,
    /// `do_image_splitting`.
    pub do_image_splitting: bool,
    /// Pillow filter of the config's `resample`.
    pub filter: Bicubic,
    /// Normalisation.
    pub norm: Normalization,
    /// `<image>` tokens per frame (the model processor's `image_seq_len`).
    pub image_seq_len: usize,
}

/// What an image of a given size becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Step 1's `(width, height)`.
    first: (usize, usize),
    /// Step 2's `(width, height)` (splitting only).
    second: Option<(usize, usize)>,
    /// Tile rows and columns (0, 0 when not split).
    rows: usize,
    cols: usize,
}

impl Plan {
    fn frames(&self) -> usize {
        self.rows * self.cols + 1
    }
}

/// Step 1 (`_resize_output_size_rescale_to_max_len` then
/// `_resize_output_size_scale_below_upper_bound`): `(height, width)`.
fn longest_edge_size(height: usize, width: usize, max_len: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let (mut h, mut w) = if width >= height {
        let h = (max_len as f64 / aspect) as usize;
        (h + h % 2, max_len)
    } else {
        let w = (max_len as f64 * aspect) as usize;
        (max_len, w + w % 2)
    };
    h = h.max(1);
    w = w.max(1);
    let aspect = w as f64 / h as f64;
    if w >= h && w > MAX_IMAGE_SIZE {
        w = MAX_IMAGE_SIZE;
        h = (w as f64 / aspect) as usize;
    } else if h > w && h > MAX_IMAGE_SIZE {
        h = MAX_IMAGE_SIZE;
        w = (h as f64 * aspect) as usize;
    }
    (h.max(1), w.max(1))
}

/// Step 2 (`resize_for_vision_encoder`): `(height, width)`, multiples of `tile`.
fn tile_multiple_size(height: usize, width: usize, tile: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let up = |v: usize| v.div_ceil(tile) * tile;
    if width >= height {
        let w = up(width);
        (up((w as f64 / aspect) as usize), w)
    } else {
        let h = up(height);
        (h, up((h as f64 * aspect) as usize))
    }
}

impl Idefics3Processor {
    /// HuggingFaceTB/SmolVLM-Instruct: long side 1536, 384-pixel tiles,
    /// LANCZOS, mean and std 0.5, 81 tokens per frame.
    pub fn smolvlm() -> Self {
        Idefics3Processor {
            longest_edge: 1536,
            tile: 384,
            do_image_splitting: true,
            filter: Bicubic::PillowLanczos,
            norm: Normalization::HALF,
            image_seq_len: 81,
        }
    }

    fn plan_for(&self, width: usize, height: usize) -> Result<Plan, VisionError> {
        let (h1, w1) = longest_edge_size(height, width, self.longest_edge);
        if !self.do_image_splitting {
            return Ok(Plan {
                first: (w1, h1),
                second: None,
                rows: 0,
                cols: 0,
            });
        }
        let (h2, w2) = tile_multiple_size(h1, w1, self.tile);
        let (rows, cols) = if h2 > self.tile || w2 > self.tile {
            (h2.div_ceil(self.tile), w2.div_ceil(self.tile))
        } else {
            (0, 0)
        };
        Ok(Plan {
            first: (w1, h1),
            second: Some((w2, h2)),
            rows,
            cols,
        })
    }
}

/// The reference's `pixel_attention_mask` for frames of `(height, width)`:
/// each padded at the bottom and right to the largest, 1 over its own
/// pixels and 0 over the padding; `[frames, H, W]`.
fn pixel_attention_mask(frames: &[(usize, usize)]) -> ItemTensor {
    let height = frames.iter().map(|f| f.0).max().unwrap_or(0);
    let width = frames.iter().map(|f| f.1).max().unwrap_or(0);
    let mut ones = Vec::with_capacity(frames.len() * height * width);
    for &(h, w) in frames {
        for row in 0..height {
            let valid = if row < h { w } else { 0 };
            ones.extend(std::iter::repeat_n(1u8, valid));
            ones.extend(std::iter::repeat_n(0u8, width - valid));
        }
    }
    ItemTensor::mask(
        "pixel_attention_mask",
        vec![frames.len(), height, width],
        ones,
    )
}

impl Tiled for Idefics3Processor {
    type Plan = Plan;

    /// Each tile tagged with its row and column, then the global image.
    fn placeholder_layout(&self, layout: &OutputLayout) -> PlaceholderLayout {
        placeholders::idefics3(placeholders::grid(layout), self.image_seq_len)
    }

    fn name(&self) -> &'static str {
        "idefics3"
    }

    /// `pixel_attention_mask` `[frames, tile, tile]`: every frame is one
    /// whole tile, so all ones.
    fn item_tensors(&self, layout: &OutputLayout) -> Vec<ItemTensor> {
        let frames = layout.shape.first().copied().unwrap_or(0);
        let side = (self.tile, self.tile);
        vec![pixel_attention_mask(&vec![side; frames])]
    }

    fn settings(&self, _opts: &PreprocessOptions) -> String {
        format!(
            "idefics3|{}|{}|{}|{:?}|{}|pillow-12.2",
            self.longest_edge, self.tile, self.do_image_splitting, self.filter, self.image_seq_len,
        )
    }

    fn norm(&self) -> &Normalization {
        &self.norm
    }

    fn plan(&self, (w, h): (usize, usize), _: &PreprocessOptions) -> Result<Plan, VisionError> {
        self.plan_for(w, h)
    }

    fn layout(&self, plan: &Plan) -> OutputLayout {
        let tokens = self.image_seq_len * plan.frames();
        let side = (self.tile, self.tile);
        OutputLayout::frames(plan.frames(), side, tokens).with_tiles([plan.rows, plan.cols])
    }

    fn resized_size(&self, plan: &Plan) -> (usize, usize) {
        plan.second.unwrap_or(plan.first)
    }

    fn buffer_bytes(&self, plan: &Plan, input: (u64, u64)) -> u64 {
        let size = |(w, h): (usize, usize)| (w as u64, h as u64);
        let (w1, h1) = size(plan.first);
        let t = self.tile as u64;
        let mut bytes = resize::working_bytes(input, (w1, h1)) + 3 * w1 * h1;
        match plan.second.map(size) {
            Some((w2, h2)) => {
                bytes += resize::working_bytes((w1, h1), (w2, h2))
                    .max(resize::working_bytes((w2, h2), (t, t)))
                    + 3 * w2 * h2;
            }
            None => bytes += resize::working_bytes((w1, h1), (t, t)),
        }
        bytes + 3 * t * t
    }

    /// The tiles row by row, then the global image.
    fn frames(&self, cut: &mut Cut<'_, Self::Plan>, each: Each<'_>) -> Result<(), VisionError> {
        let (image, parallel) = (cut.image, cut.parallel);
        let plan = cut.plan;
        let t = self.tile;
        let (inter, resized, cropped, raw) = cut.scratch.buffers();
        resize_copy(self.filter, image, plan.first, inter, cropped, parallel)?;
        let first = RgbView::new(cropped, plan.first.0, plan.first.1)?;
        let Some(second_size) = plan.second else {
            resize_copy(self.filter, first, (t, t), inter, raw, parallel)?;
            each(0, RgbView::new(raw, t, t)?);
            return Ok(());
        };
        resize_copy(self.filter, first, second_size, inter, resized, parallel)?;
        let second = RgbView::new(resized, second_size.0, second_size.1)?;
        // An image that is a single tile is not cut: its global image only.
        let tiles = if plan.rows * plan.cols > 0 {
            cut_tiles(second, (t, t), raw, each)?
        } else {
            0
        };
        // The global image: a single tile is its own (the reference skips
        // the resize when the size already matches).
        resize_copy(self.filter, second, (t, t), inter, raw, parallel)?;
        each(tiles, RgbView::new(raw, t, t)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::ItemValues;

    #[test]
    fn sizes_of_known_images() {
        // 640×480 → 1536×1152 → 1536×1152 (already multiples): 3×4 tiles.
        assert_eq!(longest_edge_size(480, 640, 1536), (1152, 1536));
        assert_eq!(tile_multiple_size(1152, 1536, 384), (1152, 1536));
        let p = Idefics3Processor::smolvlm().plan_for(640, 480).unwrap();
        assert_eq!((p.rows, p.cols, p.frames()), (3, 4, 13));
        // Odd truncations round up to even; thin images keep one pixel.
        assert_eq!(longest_edge_size(217, 333, 1536), (1000, 1536));
        assert_eq!(longest_edge_size(4000, 1, 1536), (1536, 1));
        assert_eq!(tile_multiple_size(1536, 1, 384), (1536, 384));
        // Beyond 4096 the long side is held.
        assert_eq!(longest_edge_size(10, 20, 5000), (2048, 4096));
    }

    #[test]
    fn the_mask_covers_each_frame_and_zeroes_the_padding() {
        let mask = pixel_attention_mask(&[(2, 3), (1, 2)]);
        assert_eq!(mask.shape, [2, 2, 3]);
        assert_eq!(
            mask.values,
            ItemValues::UInt8(vec![1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0].into())
        );
    }

    #[test]
    fn an_image_mask_is_one_per_pixel_of_every_frame() {
        let p = Idefics3Processor::smolvlm();
        let layout = p.layout(&p.plan_for(640, 480).unwrap());
        let tensors = Tiled::item_tensors(&p, &layout);
        let [mask] = tensors.as_slice() else {
            panic!("{tensors:?}")
        };
        assert_eq!(mask.name, "pixel_attention_mask");
        assert_eq!(mask.shape, [13, 384, 384]);
        let ItemValues::UInt8(ones) = &mask.values else {
            panic!("{:?}", mask.values.dtype())
        };
        assert_eq!(ones.len(), 13 * 384 * 384);
        assert!(ones.iter().all(|&v| v == 1));
        // Unsplit, the image is one squashed tile: one frame of ones.
        let unsplit = Idefics3Processor {
            do_image_splitting: false,
            ..Idefics3Processor::smolvlm()
        };
        let layout = unsplit.layout(&unsplit.plan_for(640, 480).unwrap());
        let mask = &Tiled::item_tensors(&unsplit, &layout)[0];
        assert_eq!(mask.shape, [1, 384, 384]);
        assert_eq!(mask.values.to_i64().iter().sum::<i64>(), 384 * 384);
    }
}
