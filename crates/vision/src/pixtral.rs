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

use half::bf16;

use crate::error::VisionError;
use crate::image::RgbView;
use crate::layout::planar_chw;
use crate::normalize::{Normalization, OutElem};
use crate::output::{OutputDtype, OutputLayout, PixelValues, PreprocessOutput};
use crate::placeholders::{self, PlaceholderLayout};
use crate::pool::PooledVec;
use crate::processor::{fingerprint_of, split_image, PreprocessOptions, Processor};
use crate::resize::{self, resize_copy, Bicubic};
use crate::scratch::Scratch;

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

    fn layout(&self, (w, h): (usize, usize)) -> OutputLayout {
        let (ph, pw) = self.token_patch();
        let (rows, cols) = (h / ph, w / pw);
        OutputLayout {
            shape: vec![3, h, w],
            image_grid_thw: None,
            num_placeholder_tokens: rows * (cols + 1),
            image_sizes: Some([h, w]),
            tile_grid: Some([rows, cols]),
        }
    }

    fn write<T: OutElem>(&self, img: RgbView<'_>) -> PooledVec<T> {
        let mut out = PooledVec::<T>::take(3 * img.width() * img.height());
        planar_chw(img, &self.norm.lut::<T>(), &mut out);
        out
    }
}

impl Processor for PixtralProcessor {
    /// Rows of `[IMG]` broken by `[IMG_BREAK]`, ended by `[IMG_END]`.
    fn placeholder_layout(&self, layout: &OutputLayout) -> PlaceholderLayout {
        placeholders::pixtral(placeholders::grid(layout))
    }

    fn name(&self) -> &'static str {
        "pixtral"
    }

    fn fingerprint(&self, opts: &PreprocessOptions) -> u64 {
        fingerprint_of(
            format_args!(
                "pixtral|{}|{:?}|{}|{:?}|pillow-12.2",
                self.longest_edge, self.patch, self.spatial_merge_size, self.filter,
            ),
            &self.norm,
            opts,
        )
    }

    fn working_bytes(
        &self,
        width: u32,
        height: u32,
        opts: &PreprocessOptions,
    ) -> Result<u64, VisionError> {
        let (w, h) = self.target(width as usize, height as usize)?;
        let (w, h) = (w as u64, h as u64);
        let resize = resize::working_bytes((u64::from(width), u64::from(height)), (w, h));
        Ok(resize + 3 * w * h + 3 * w * h * opts.dtype.size() as u64)
    }

    fn resized_image(
        &self,
        image: &image::RgbImage,
        _opts: &PreprocessOptions,
    ) -> Result<image::RgbImage, VisionError> {
        let view = RgbView::from_image(image)?;
        let (w, h) = self.target(view.width(), view.height())?;
        let (mut inter, mut out) = (Vec::new(), Vec::new());
        resize_copy(self.filter, view, (w, h), &mut inter, &mut out, false)?;
        RgbView::new(&out, w, h)?.to_image()
    }

    fn preprocess_view(
        &self,
        image: RgbView<'_>,
        opts: &PreprocessOptions,
        scratch: &mut Scratch,
    ) -> Result<PreprocessOutput, VisionError> {
        let parallel = split_image(opts, image.width() * image.height());
        let (w, h) = self.target(image.width(), image.height())?;
        let Scratch { inter, resized, .. } = scratch;
        resize_copy(self.filter, image, (w, h), inter, resized, parallel)?;
        let view = RgbView::new(resized, w, h)?;
        let pixel_values = match opts.dtype {
            OutputDtype::F32 => PixelValues::F32(self.write::<f32>(view)),
            OutputDtype::Bf16 => PixelValues::Bf16(self.write::<bf16>(view)),
        };
        let layout = self.layout((w, h));
        Ok(PreprocessOutput::from_layout(pixel_values, layout, (w, h)))
    }

    fn layout_for(
        &self,
        width: usize,
        height: usize,
        _opts: &PreprocessOptions,
    ) -> Result<OutputLayout, VisionError> {
        Ok(self.layout(self.target(width, height)?))
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
        let layout = p.layout((1024, 576));
        assert_eq!(layout.num_placeholder_tokens, 36 * 65);
        assert_eq!(layout.tile_grid, Some([36, 64]));
    }
}
