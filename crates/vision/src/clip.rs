//! CLIP-style processors (LLaVA-1.5): shortest-edge resize, centre crop,
//! CLIP normalisation, planar `[3, H, W]` output.
//!
//! The shortest-edge resize magnifies thin images: a 1×65 535 PNG of a few
//! kB would become 336 × 22 million pixels before the crop. The resize
//! target is therefore held to the same [`DecodeLimits`] as decoded images.

use half::bf16;

use crate::decode::DecodeLimits;
use crate::error::VisionError;
use crate::geometry::{centre_crop_origin, shortest_edge_size};
use crate::image::RgbView;
use crate::layout::planar_chw;
use crate::normalize::{Normalization, OutElem};
use crate::output::{OutputDtype, OutputLayout, PixelValues, PreprocessOutput};
use crate::pool::PooledVec;
use crate::processor::{fingerprint_of, split_image, PreprocessOptions, Processor};
use crate::resize::{self, resize_into};
use crate::scratch::Scratch;

/// A CLIP-style fixed-size processor.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipProcessor {
    /// Target of the shorter side.
    pub shortest_edge: usize,
    /// Crop `(height, width)`.
    pub crop_size: (usize, usize),
    /// Normalisation.
    pub norm: Normalization,
    /// Vision transformer patch size (for the placeholder count).
    pub patch_size: usize,
}

impl ClipProcessor {
    /// The output layout: the crop's, whatever the image's size.
    fn crop_layout(&self) -> OutputLayout {
        let (ch, cw) = self.crop_size;
        OutputLayout {
            shape: vec![3, ch, cw],
            image_grid_thw: None,
            num_placeholder_tokens: (ch / self.patch_size) * (cw / self.patch_size),
            image_sizes: None,
            tile_grid: None,
        }
    }

    /// LLaVA-1.5 (CLIP ViT-L/14 at 336 px): 576 image tokens.
    pub fn llava_1_5() -> Self {
        ClipProcessor {
            shortest_edge: 336,
            crop_size: (336, 336),
            norm: Normalization::CLIP,
            patch_size: 14,
        }
    }

    /// Resizes then crops into `scratch.cropped`; returns the resized size.
    fn resize_and_crop<'s>(
        &self,
        image: RgbView<'_>,
        limits: &DecodeLimits,
        parallel: bool,
        scratch: &'s mut Scratch,
    ) -> Result<(RgbView<'s>, (usize, usize)), VisionError> {
        let (h, w) = shortest_edge_size(image.height(), image.width(), self.shortest_edge);
        check_resize_target(image.width(), image.height(), w, h, limits)?;
        let resized = resize_into(
            image,
            w,
            h,
            &mut scratch.inter,
            &mut scratch.resized,
            parallel,
        )?;
        let (ch, cw) = self.crop_size;
        let (top, left) = centre_crop_origin(h, w, ch, cw).ok_or_else(|| {
            VisionError::Geometry(format!(
                "resized image {w}x{h} is smaller than the {cw}x{ch} crop"
            ))
        })?;
        resized.crop_into(left, top, cw, ch, &mut scratch.cropped)?;
        Ok((RgbView::new(&scratch.cropped, cw, ch)?, (w, h)))
    }

    fn write<T: OutElem>(&self, img: RgbView<'_>) -> PooledVec<T> {
        let mut out = PooledVec::<T>::take(3 * img.width() * img.height());
        planar_chw(img, &self.norm.lut::<T>(), &mut out);
        out
    }
}

/// Refuses a resize target beyond `limits` (side or pixel count).
fn check_resize_target(
    in_w: usize,
    in_h: usize,
    w: usize,
    h: usize,
    limits: &DecodeLimits,
) -> Result<(), VisionError> {
    let pixels = (w as u64).saturating_mul(h as u64);
    if w.max(h) as u64 > u64::from(limits.max_side) || pixels > limits.max_pixels {
        return Err(VisionError::Geometry(format!(
            "a {in_w}x{in_h} image would be resized to {w}x{h} before the centre crop, \
             beyond the limits ({} per side, {} pixels)",
            limits.max_side, limits.max_pixels
        )));
    }
    Ok(())
}

impl Processor for ClipProcessor {
    fn name(&self) -> &'static str {
        "clip"
    }

    fn fingerprint(&self, opts: &PreprocessOptions) -> u64 {
        fingerprint_of(
            format_args!(
                "clip|{}|{:?}|{}|pillow-12.2-bicubic",
                self.shortest_edge, self.crop_size, self.patch_size,
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
        let (in_w, in_h) = (width as usize, height as usize);
        let (h, w) = shortest_edge_size(in_h, in_w, self.shortest_edge);
        check_resize_target(in_w, in_h, w, h, &opts.limits)?;
        let (ch, cw) = self.crop_size;
        let crop = (ch * cw) as u64;
        let resize = resize::working_bytes((in_w as u64, in_h as u64), (w as u64, h as u64));
        Ok(resize + 3 * crop + 3 * crop * opts.dtype.size() as u64)
    }

    fn resized_image(
        &self,
        image: &image::RgbImage,
        opts: &PreprocessOptions,
    ) -> Result<image::RgbImage, VisionError> {
        let mut scratch = Scratch::default();
        let view = RgbView::from_image(image)?;
        let (cropped, _) = self.resize_and_crop(view, &opts.limits, false, &mut scratch)?;
        cropped.to_image()
    }

    fn preprocess_view(
        &self,
        image: RgbView<'_>,
        opts: &PreprocessOptions,
        scratch: &mut Scratch,
    ) -> Result<PreprocessOutput, VisionError> {
        let parallel = split_image(opts, image.width() * image.height());
        let (cropped, resized_size) =
            self.resize_and_crop(image, &opts.limits, parallel, scratch)?;
        let pixel_values = match opts.dtype {
            OutputDtype::F32 => PixelValues::F32(self.write::<f32>(cropped)),
            OutputDtype::Bf16 => PixelValues::Bf16(self.write::<bf16>(cropped)),
        };
        let layout = self.crop_layout();
        Ok(PreprocessOutput::from_layout(
            pixel_values,
            layout,
            resized_size,
        ))
    }

    fn layout_for(
        &self,
        _width: usize,
        _height: usize,
        _opts: &PreprocessOptions,
    ) -> Result<OutputLayout, VisionError> {
        Ok(self.crop_layout())
    }
}
