//! Pixtral: bit-exact with transformers 4.57.1's slow `PixtralImageProcessor`
//! (one image per call).
//!
//! No tiling: an image larger than `size.longest_edge` on either side is
//! scaled down to fit (both sides divided by the same ratio and floored),
//! then each side is rounded *up* to a whole number of patches (the patch
//! side times the model processor's `spatial_merge_size`, 16 × 1 for
//! pixtral-12b) and the image is resized to that with Pillow's BICUBIC,
//! rescaled, CLIP-normalised and written planar: `[3, H, W]`. An image so
//! thin that a side floors to zero is refused (the reference fails too).
//!
//! The model takes the resized `[H, W]` as its `image_sizes` row
//! ([`OutputLayout::image_sizes`]). The prompt (`PixtralProcessor`): `rows =
//! H / patch` lines of `cols = W / patch` `[IMG]` tokens, each line ended
//! by `[IMG_BREAK]` except the last, ended by `[IMG_END]`: `rows × (cols +
//! 1)` tokens in all, which [`OutputLayout::num_placeholder_tokens`]
//! counts; [`OutputLayout::tile_grid`] gives `[rows, cols]`.

use crate::error::VisionError;
use crate::image::RgbView;
use crate::normalize::Normalization;
use crate::output::OutputLayout;
use crate::placeholders::{self, PlaceholderLayout};
use crate::processor::PreprocessOptions;
use crate::resize::{self, resize_copy, Bicubic};
use crate::tiles::{Cut, Each, Tiled};

/// The Pixtral image processor.
#[derive(Debug, Clone, PartialEq)]
pub struct PixtralProcessor {
    /// `size.longest_edge`: the bound on both sides.
    pub longest_edge: usize,
    /// `patch_size` `(height, width)` of the vision encoder.
    pub patch: (usize, usize),
    /// The model processor's `spatial_merge_size` (patches merged per side
    /// into one token).
    pub spatial_merge_size: usize,
    /// Pillow filter of the config's `resample`.
    pub filter: Bicubic,
    /// Normalisation.
    pub norm: Normalization,
}

impl PixtralProcessor {
    /// mistral-community/pixtral-12b: longest edge 1024, 16-pixel patches,
    /// no merge, BICUBIC, CLIP normalisation.
    pub fn pixtral_12b() -> Self {
        PixtralProcessor {
            longest_edge: 1024,
            patch: (16, 16),
            spatial_merge_size: 1,
            filter: Bicubic::Pillow,
            norm: Normalization::CLIP,
        }
    }

    /// The token patch `(height, width)`: the encoder's patch times the merge.
    fn token_patch(&self) -> (usize, usize) {
        (
            self.patch.0 * self.spatial_merge_size,
            self.patch.1 * self.spatial_merge_size,
        )
    }

    /// The resized `(width, height)` of a `width`×`height` image.
    fn target(&self, width: usize, height: usize) -> Result<(usize, usize), VisionError> {
        let edge = self.longest_edge as f64;
        let ratio = (height as f64 / edge).max(width as f64 / edge);
        let (mut h, mut w) = (height, width);
        if ratio > 1.0 {
            h = (height as f64 / ratio).floor() as usize;
            w = (width as f64 / ratio).floor() as usize;
        }
        if h == 0 || w == 0 {
            return Err(VisionError::Geometry(format!(
                "a {width}x{height} image scaled to fit {0}x{0} has a side of zero pixels",
                self.longest_edge
            )));
        }
        let (ph, pw) = self.token_patch();
        Ok((w.div_ceil(pw) * pw, h.div_ceil(ph) * ph))
    }
}

impl Tiled for PixtralProcessor {
    /// The resized `(width, height)`.
    type Plan = (usize, usize);

    /// Rows of `[IMG]` broken by `[IMG_BREAK]`, ended by `[IMG_END]`.
    fn placeholder_layout(&self, layout: &OutputLayout) -> PlaceholderLayout {
        placeholders::pixtral(placeholders::grid(layout))
    }

    fn name(&self) -> &'static str {
        "pixtral"
    }

    fn settings(&self, _opts: &PreprocessOptions) -> String {
        format!(
            "pixtral|{}|{:?}|{}|{:?}|pillow-12.2",
            self.longest_edge, self.patch, self.spatial_merge_size, self.filter,
        )
    }

    fn norm(&self) -> &Normalization {
        &self.norm
    }

    fn plan(
        &self,
        (w, h): (usize, usize),
        _: &PreprocessOptions,
    ) -> Result<(usize, usize), VisionError> {
        self.target(w, h)
    }

    fn layout(&self, &(w, h): &(usize, usize)) -> OutputLayout {
        let (ph, pw) = self.token_patch();
        let (rows, cols) = (h / ph, w / pw);
        OutputLayout::frame((h, w), rows * (cols + 1))
            .with_image_sizes([h, w])
            .with_tiles([rows, cols])
    }

    fn resized_size(&self, plan: &(usize, usize)) -> (usize, usize) {
        *plan
    }

    fn buffer_bytes(&self, &(w, h): &(usize, usize), input: (u64, u64)) -> u64 {
        let (w, h) = (w as u64, h as u64);
        resize::working_bytes(input, (w, h)) + 3 * w * h
    }

    fn one_resize(&self, &size: &(usize, usize)) -> Option<resize::WindowedResize> {
        Some(resize::WindowedResize::whole(self.filter, size))
    }

    /// The resized image: one frame.
    fn frames(&self, cut: &mut Cut<'_, Self::Plan>, each: Each<'_>) -> Result<(), VisionError> {
        let (image, parallel) = (cut.image, cut.parallel);
        let &(w, h) = cut.plan;
        let (inter, resized, ..) = cut.scratch.buffers();
        resize_copy(self.filter, image, (w, h), inter, resized, parallel)?;
        each(0, RgbView::new(resized, w, h)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_fit_and_round_up_to_patches() {
        let p = PixtralProcessor::pixtral_12b();
        // 1920×1080 → ratio 1.875 → 1024×576 (already multiples).
        assert_eq!(p.target(1920, 1080).unwrap(), (1024, 576));
        // Small images only round up.
        assert_eq!(p.target(13, 9).unwrap(), (16, 16));
        assert_eq!(p.target(333, 217).unwrap(), (336, 224));
        assert!(p.target(4000, 1).is_err());
        let layout = p.layout(&(1024, 576));
        assert_eq!(layout.num_placeholder_tokens, 36 * 65);
        assert_eq!(layout.tile_grid, Some([36, 64]));
    }
}
