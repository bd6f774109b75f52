//! InternVL 3 / 3.5 (the Hugging Face-format checkpoints, `InternVLProcessor`):
//! bit-exact with transformers 4.57.1's `GotOcr2ImageProcessorFast` (the
//! class the shipped `preprocessor_config.json` names, so the default) and
//! with the slow `GotOcr2ImageProcessor` (one image per call).
//!
//! `InternVLProcessor` calls its image processor with `crop_to_patches`
//! on, whatever the image processor's config says (its `images_kwargs`
//! default), so the image is cut into *dynamic tiles*:
//!
//! 1. the grid is the `cols × rows` arrangement, among all with between
//!    `min_patches` and `max_patches` tiles (ordered by tile count, then
//!    columns), whose aspect ratio `cols / rows` is nearest the image's
//!    `width / height`; on a tie the later one wins when the image's area
//!    is more than half the grid's;
//! 2. the image is squashed to `cols·tile_w × rows·tile_h` and cut into
//!    tiles row by row;
//! 3. with more than one tile, a *thumbnail* follows: the whole image
//!    squashed to one tile.
//!
//! Without cropping (`max_patches` 1) the image is squashed to one tile.
//! Every frame is rescaled, normalised (ImageNet mean and std in the
//! shipped config) and written planar: `[num_patches, 3, tile_h, tile_w]`.
//!
//! The two classes differ in the resize and the float arithmetic only:
//! the fast one resizes with PyTorch's antialiased bicubic on `uint8`
//! ([`Bicubic::Torch`]) and fuses rescale into normalisation
//! ([`Normalization::fused_value`]); the slow one resizes with Pillow's
//! BICUBIC and rescales, then normalises ([`Normalization::value`]).
//! Only `resample` 3 (BICUBIC) is accepted: the slow class's tiling
//! resizes always use BICUBIC, whatever `resample` says.
//!
//! The prompt: the chat template writes `<IMG_CONTEXT>` once per image;
//! `InternVLProcessor` replaces it with `<img>`, `image_seq_length` (256)
//! × `num_patches` `<IMG_CONTEXT>` tokens and `</img>`.
//! [`OutputLayout::num_placeholder_tokens`] counts the `<IMG_CONTEXT>`
//! tokens; [`OutputLayout::tile_grid`] gives `[rows, cols]` (`[1, 1]`
//! without a thumbnail). The item carries `image_num_patches` (vLLM's
//! name for the processor's `num_patches`).

use crate::error::VisionError;
use crate::image::RgbView;
use crate::normalize::{Lut, Normalization, OutElem};
use crate::output::{ItemTensor, OutputLayout};
use crate::placeholders::{self, PlaceholderLayout};
use crate::processor::PreprocessOptions;
use crate::resize::{self, Bicubic};
use crate::tiles::{cut_frames, cut_tiles, tiles_and_global, with_global, Cut, Each, Tiled};

/// ImageNet mean, the shipped InternVL configs' `image_mean`.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet std, the shipped InternVL configs' `image_std`.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// The InternVL image processor.
#[derive(Debug, Clone, PartialEq)]
pub struct InternVlProcessor {
    /// `(height, width)` of a tile (`size`: 448×448 as shipped).
    pub tile: (usize, usize),
    /// `min_patches` and `max_patches`: the tile counts grids may have.
    pub min_patches: usize,
    pub max_patches: usize,
    /// The fast (torchvision) class; the slow (Pillow) one when false.
    pub fast: bool,
    /// Normalisation.
    pub norm: Normalization,
    /// `<IMG_CONTEXT>` tokens per tile (`image_seq_length`).
    pub image_seq_length: usize,
}

/// The tile grid of one image: `cols × rows` tiles, plus a thumbnail when
/// there is more than one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grid {
    cols: usize,
    rows: usize,
}

impl Grid {
    fn tiles(&self) -> usize {
        self.cols * self.rows
    }

    /// Tiles and the thumbnail: the processor's `num_patches`.
    fn frames(&self) -> usize {
        with_global(self.tiles())
    }
}

/// `get_all_supported_aspect_ratios`: every `(cols, rows)` with a tile
/// count in `min..=max`, ordered by tile count (stable: columns first).
fn arrangements(min: usize, max: usize) -> Vec<(usize, usize)> {
    let mut all: Vec<(usize, usize)> = (1..=max)
        .flat_map(|w| (1..=max).map(move |h| (w, h)))
        .filter(|&(w, h)| (min..=max).contains(&(w * h)))
        .collect();
    all.sort_by_key(|&(w, h)| w * h);
    all
}

/// `get_optimal_tiled_canvas` for a `width`×`height` image and
/// `tile_h`×`tile_w` tiles: `(cols, rows)`, on the reference's doubles.
pub(crate) fn optimal_grid(
    (width, height): (usize, usize),
    (tile_h, tile_w): (usize, usize),
    min: usize,
    max: usize,
) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let area = (width * height) as f64;
    let mut best_diff = f64::INFINITY;
    let mut best = (1, 1);
    for (w, h) in arrangements(min, max) {
        let diff = (aspect - w as f64 / h as f64).abs();
        if diff < best_diff {
            best_diff = diff;
            best = (w, h);
        } else if diff == best_diff
            && area > 0.5 * tile_h as f64 * tile_w as f64 * w as f64 * h as f64
        {
            best = (w, h);
        }
    }
    best
}

impl InternVlProcessor {
    /// OpenGVLab/InternVL3-1B-hf (and the other InternVL 3 / 3.5 HF
    /// checkpoints): 448-pixel tiles, 1 to 12 of them, the fast class,
    /// ImageNet normalisation, 256 tokens per tile.
    pub fn internvl3() -> Self {
        InternVlProcessor {
            tile: (448, 448),
            min_patches: 1,
            max_patches: 12,
            fast: true,
            norm: Normalization {
                rescale_factor: 1.0 / 255.0,
                mean: IMAGENET_MEAN,
                std: IMAGENET_STD,
            },
            image_seq_length: 256,
        }
    }

    fn filter(&self) -> Bicubic {
        if self.fast {
            Bicubic::Torch
        } else {
            Bicubic::Pillow
        }
    }

    fn grid(&self, width: usize, height: usize) -> Grid {
        if self.max_patches <= 1 {
            return Grid { cols: 1, rows: 1 };
        }
        let (cols, rows) = optimal_grid(
            (width, height),
            self.tile,
            self.min_patches,
            self.max_patches,
        );
        Grid { cols, rows }
    }
}

impl Tiled for InternVlProcessor {
    type Plan = Grid;

    /// `<img>`, the `<IMG_CONTEXT>` tokens of every tile, `</img>`.
    fn placeholder_layout(&self, layout: &OutputLayout) -> PlaceholderLayout {
        placeholders::internvl(layout.num_placeholder_tokens)
    }

    /// `image_num_patches`: `[1]`, the image's tiles and thumbnail.
    fn item_tensors(&self, layout: &OutputLayout) -> Vec<ItemTensor> {
        let frames = layout.shape.first().copied().unwrap_or(1);
        vec![ItemTensor::ints("image_num_patches", vec![1], &[frames])]
    }

    fn name(&self) -> &'static str {
        "internvl"
    }

    fn settings(&self, _opts: &PreprocessOptions) -> String {
        format!(
            "internvl|{:?}|{}|{}|{}|{}",
            self.tile,
            self.min_patches,
            self.max_patches,
            if self.fast {
                "torch-2.9"
            } else {
                "pillow-12.2"
            },
            self.image_seq_length,
        )
    }

    fn plan(&self, (w, h): (usize, usize), _: &PreprocessOptions) -> Result<Grid, VisionError> {
        Ok(self.grid(w, h))
    }

    fn layout(&self, grid: &Grid) -> OutputLayout {
        let tokens = self.image_seq_length * grid.frames();
        OutputLayout::frames(grid.frames(), self.tile, tokens).with_tiles([grid.rows, grid.cols])
    }

    fn resized_size(&self, grid: &Grid) -> (usize, usize) {
        (self.tile.1 * grid.cols, self.tile.0 * grid.rows)
    }

    fn buffer_bytes(&self, grid: &Grid, input: (u64, u64)) -> u64 {
        let (th, tw) = (self.tile.0 as u64, self.tile.1 as u64);
        let canvas = (grid.cols as u64 * tw, grid.rows as u64 * th);
        let resizes = resize::working_bytes(input, canvas) + resize::working_bytes(input, (tw, th));
        resizes + 3 * canvas.0 * canvas.1 + 3 * th * tw
    }

    fn norm(&self) -> &Normalization {
        &self.norm
    }

    fn lut<T: OutElem>(&self) -> Lut<T> {
        if self.fast {
            self.norm.fused_lut()
        } else {
            self.norm.lut()
        }
    }

    /// The tiles row by row, then the thumbnail.
    fn frames(&self, cut: &mut Cut<'_, Self::Plan>, each: Each<'_>) -> Result<(), VisionError> {
        cut_frames(self, cut, each)
    }

    /// The image resized to the grid's canvas, and to one tile (the
    /// thumbnail) when the grid has several.
    fn whole_resizes(&self, grid: &Grid) -> Option<(Bicubic, Vec<(usize, usize)>)> {
        let (th, tw) = self.tile;
        let mut sizes = vec![(grid.cols * tw, grid.rows * th)];
        if grid.tiles() > 1 {
            sizes.push((tw, th));
        }
        Some((self.filter(), sizes))
    }

    /// The canvas's tiles row by row, then the thumbnail.
    fn cut_resized(
        &self,
        grid: &Grid,
        resized: &[RgbView<'_>],
        buf: &mut Vec<u8>,
        each: Each<'_>,
    ) -> Result<(), VisionError> {
        let (th, tw) = self.tile;
        match tiles_and_global("internvl", grid.tiles(), resized)? {
            (whole, None) => each(0, whole),
            (canvas, Some(thumbnail)) => {
                let tiles = cut_tiles(canvas, (tw, th), buf, each)?;
                each(tiles, thumbnail);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor::Processor;

    #[test]
    fn arrangements_are_ordered_by_tile_count() {
        assert_eq!(
            arrangements(1, 4),
            [
                (1, 1),
                (1, 2),
                (2, 1),
                (1, 3),
                (3, 1),
                (1, 4),
                (2, 2),
                (4, 1)
            ]
        );
    }

    #[test]
    fn grids_follow_the_aspect_ratio() {
        let p = InternVlProcessor::internvl3();
        let grid = |w, h| {
            let g = p.grid(w, h);
            (g.cols, g.rows, g.frames())
        };
        // Square: 1×1 beats 2×2 unless the image covers half of 2×2's area.
        assert_eq!(grid(448, 448), (1, 1, 1));
        assert_eq!(grid(700, 700), (2, 2, 5));
        // 2:1 wide, small: 2×1 and a thumbnail.
        assert_eq!(grid(800, 400), (2, 1, 3));
        // Very tall: 1×12.
        assert_eq!(grid(10, 4000), (1, 12, 13));
        // A side of zero is refused before any plan (tiles.rs).
        let none = PreprocessOptions::default();
        assert!(Processor::layout_for(&p, 0, 10, &none).is_err());
    }
}
