//! CLIP-style processors (LLaVA-1.5): shortest-edge resize, centre crop,
//! CLIP normalisation, planar `[3, H, W]` output.
//!
//! The shortest-edge resize magnifies thin images: a 1×65 535 PNG of a few
//! kB would become 336 × 22 million pixels before the crop. The resize
//! target is therefore held to the same [`DecodeLimits`] as decoded images.

use crate::decode::DecodeLimits;
use crate::error::VisionError;
use crate::geometry::{centre_crop_origin, shortest_edge_size};
use crate::normalize::Normalization;
use crate::output::OutputLayout;
use crate::processor::PreprocessOptions;
use crate::resize::{self, Bicubic};
use crate::tiles::{Cut, Each, Tiled};

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
        OutputLayout::frame((ch, cw), (ch / self.patch_size) * (cw / self.patch_size))
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

impl Tiled for ClipProcessor {
    /// The resized `(width, height)`, before the crop.
    type Plan = (usize, usize);

    fn name(&self) -> &'static str {
        "clip"
    }

    fn settings(&self, _opts: &PreprocessOptions) -> String {
        format!(
            "clip|{}|{:?}|{}|pillow-12.2-bicubic",
            self.shortest_edge, self.crop_size, self.patch_size,
        )
    }

    fn norm(&self) -> &Normalization {
        &self.norm
    }

    fn plan(
        &self,
        (w, h): (usize, usize),
        o: &PreprocessOptions,
    ) -> Result<(usize, usize), VisionError> {
        let (rh, rw) = shortest_edge_size(h, w, self.shortest_edge);
        check_resize_target(w, h, rw, rh, &o.limits)?;
        Ok((rw, rh))
    }

    fn layout(&self, _plan: &(usize, usize)) -> OutputLayout {
        self.crop_layout()
    }

    fn resized_size(&self, plan: &(usize, usize)) -> (usize, usize) {
        *plan
    }

    fn buffer_bytes(&self, &(w, h): &(usize, usize), input: (u64, u64)) -> u64 {
        let crop = (self.crop_size.0 * self.crop_size.1) as u64;
        resize::working_bytes(input, (w as u64, h as u64)) + 3 * crop
    }

    fn one_resize(&self, &(w, h): &(usize, usize)) -> Option<resize::WindowedResize> {
        let (ch, cw) = self.crop_size;
        let (top, left) = centre_crop_origin(h, w, ch, cw)?;
        Some(resize::WindowedResize {
            filter: Bicubic::Pillow,
            size: (w, h),
            window: (left, top, cw, ch),
        })
    }

    /// The centre crop of the resize: one frame, computed alone (the crop's
    /// columns and the rows they read only; the bytes of resizing whole
    /// and cropping, [`resize::resize_window`]).
    fn frames(&self, cut: &mut Cut<'_, Self::Plan>, each: Each<'_>) -> Result<(), VisionError> {
        let &(w, h) = cut.plan;
        let resize = self.one_resize(cut.plan).ok_or_else(|| {
            let (ch, cw) = self.crop_size;
            VisionError::Geometry(format!(
                "resized image {w}x{h} is smaller than the {cw}x{ch} crop"
            ))
        })?;
        let buffers = (&mut cut.scratch.inter, &mut cut.scratch.cropped);
        let cropped = resize::resize_window(&resize, cut.image, buffers, cut.parallel)?;
        each(0, cropped);
        Ok(())
    }
}
