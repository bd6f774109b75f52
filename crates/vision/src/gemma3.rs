//! Gemma 3: bit-exact with transformers 4.57.1's slow `Gemma3ImageProcessor`
//! (one image per call).
//!
//! The image is squashed (aspect ratio not kept) to the configured size
//! (896×896 for the shipped checkpoints) with Pillow's filter of the
//! config's `resample` (2, BILINEAR, in the shipped configs), rescaled,
//! normalised (mean and std 0.5) and written planar: `[1, 3, H, W]`.
//!
//! **Pan and scan** (off in the shipped configs; turned on by the config's
//! `do_pan_and_scan` or per request by [`PreprocessOptions::pan_and_scan`])
//! adds crops of a wide or tall image after it, each squashed to the same
//! size: `[1 + crops, 3, H, W]`. An image whose long side is at least
//! `pan_and_scan_min_ratio_to_activate` times its short side is cut along
//! the long side into `n` equal crops (the last one narrower when the side
//! does not divide), where `n` is the aspect ratio rounded half up, at most
//! the long side over `pan_and_scan_min_crop_size`, then held to
//! `2..=pan_and_scan_max_num_crops`; no crops at all when they would be
//! shorter than the minimum crop size on either side. Absent parameters
//! take `Gemma3Processor`'s defaults (256, 4, 1.2).
//!
//! The prompt: `Gemma3Processor` replaces each image's `<start_of_image>`
//! with `<start_of_image>`, `mm_tokens_per_image` (`image_seq_length`, 256)
//! soft image tokens and `<end_of_image>`, surrounded by blank lines; with
//! crops, the original and every crop get such a block (after a short text
//! introducing them). [`OutputLayout::num_placeholder_tokens`] counts the
//! soft tokens only: `image_seq_length × (1 + crops)`; the wrapping tokens
//! are the prompt builder's.

use crate::error::VisionError;
use crate::image::RgbView;
use crate::normalize::Normalization;
use crate::output::OutputLayout;
use crate::placeholders::{self, PlaceholderLayout};
use crate::processor::PreprocessOptions;
use crate::resize::{self, resize_copy, Bicubic};
use crate::tiles::{Cut, Each, Tiled};

/// Pan-and-scan parameters (`Gemma3Processor`'s defaults: 256, 4, 1.2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PanAndScan {
    /// `pan_and_scan_min_crop_size`: crops are at least this many pixels on
    /// both sides, or there are none.
    pub min_crop_size: usize,
    /// `pan_and_scan_max_num_crops`.
    pub max_num_crops: usize,
    /// `pan_and_scan_min_ratio_to_activate`: the long side over the short
    /// side must reach this for crops to be taken.
    pub min_ratio_to_activate: f64,
}

impl Default for PanAndScan {
    fn default() -> Self {
        PanAndScan {
            min_crop_size: 256,
            max_num_crops: 4,
            min_ratio_to_activate: 1.2,
        }
    }
}

/// The Gemma 3 image processor.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3Processor {
    /// Output `(height, width)` of the image and of every crop.
    pub size: (usize, usize),
    /// Pillow filter of the config's `resample`.
    pub filter: Bicubic,
    /// Normalisation.
    pub norm: Normalization,
    /// Soft tokens per image or crop (`image_seq_length`, the model's
    /// `mm_tokens_per_image`).
    pub tokens_per_image: usize,
    /// The config's `do_pan_and_scan`.
    pub do_pan_and_scan: bool,
    /// Pan-and-scan parameters.
    pub pan_and_scan: PanAndScan,
}

/// The crops of one image: `cols`×`rows` windows of `crop_w`×`crop_h`
/// (the last column or row clipped to the image).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Crops {
    cols: usize,
    rows: usize,
    crop_w: usize,
    crop_h: usize,
}

impl Crops {
    const NONE: Crops = Crops {
        cols: 0,
        rows: 0,
        crop_w: 0,
        crop_h: 0,
    };

    fn count(&self) -> usize {
        self.cols * self.rows
    }

    /// Window `i` (row-major) of a `width`×`height` image: `(left, top, w, h)`.
    fn window(&self, i: usize, width: usize, height: usize) -> (usize, usize, usize, usize) {
        let (left, top) = ((i % self.cols) * self.crop_w, (i / self.cols) * self.crop_h);
        (
            left,
            top,
            self.crop_w.min(width.saturating_sub(left)),
            self.crop_h.min(height.saturating_sub(top)),
        )
    }
}

impl Gemma3Processor {
    /// google/gemma-3-4b-it (and the other Gemma 3 vision checkpoints):
    /// 896×896, BILINEAR, mean and std 0.5, 256 tokens, pan and scan off.
    pub fn gemma3() -> Self {
        Gemma3Processor {
            size: (896, 896),
            filter: Bicubic::PillowBilinear,
            norm: Normalization::HALF,
            tokens_per_image: 256,
            do_pan_and_scan: false,
            pan_and_scan: PanAndScan::default(),
        }
    }

    /// Whether pan and scan runs for these options.
    fn pans(&self, opts: &PreprocessOptions) -> bool {
        opts.pan_and_scan.unwrap_or(self.do_pan_and_scan)
    }

    /// The reference's `pan_and_scan` for a `width`×`height` image.
    fn crops(&self, width: usize, height: usize, opts: &PreprocessOptions) -> Crops {
        if !self.pans(opts) || width == 0 || height == 0 {
            return Crops::NONE;
        }
        let p = &self.pan_and_scan;
        let (long, short) = (width.max(height), width.min(height));
        // Python's true division and floor, on the same doubles.
        if (long as f64 / short as f64) < p.min_ratio_to_activate {
            return Crops::NONE;
        }
        let by_ratio = (long as f64 / short as f64 + 0.5).floor() as usize;
        let by_size = (long as f64 / p.min_crop_size as f64).floor() as usize;
        let n = by_ratio.min(by_size).max(2).min(p.max_num_crops);
        let (cols, rows) = if width >= height { (n, 1) } else { (1, n) };
        let crop_w = width.div_ceil(cols);
        let crop_h = height.div_ceil(rows);
        if crop_w.min(crop_h) < p.min_crop_size {
            return Crops::NONE;
        }
        Crops {
            cols,
            rows,
            crop_w,
            crop_h,
        }
    }
}

impl Tiled for Gemma3Processor {
    type Plan = Crops;

    /// The image and each crop in a `<start_of_image>` block.
    fn placeholder_layout(&self, layout: &OutputLayout) -> PlaceholderLayout {
        let frames = layout.shape.first().copied().unwrap_or(1);
        placeholders::gemma3(frames, self.tokens_per_image)
    }

    fn name(&self) -> &'static str {
        "gemma3"
    }

    fn settings(&self, opts: &PreprocessOptions) -> String {
        let p = &self.pan_and_scan;
        format!(
            "gemma3|{:?}|{:?}|{}|{}|{}|{}|{}|pillow-12.2",
            self.size,
            self.filter,
            self.tokens_per_image,
            self.pans(opts),
            p.min_crop_size,
            p.max_num_crops,
            p.min_ratio_to_activate.to_bits(),
        )
    }

    fn norm(&self) -> &Normalization {
        &self.norm
    }

    fn plan(&self, (w, h): (usize, usize), o: &PreprocessOptions) -> Result<Crops, VisionError> {
        Ok(self.crops(w, h, o))
    }

    fn layout(&self, crops: &Crops) -> OutputLayout {
        let frames = 1 + crops.count();
        OutputLayout::frames(frames, self.size, self.tokens_per_image * frames)
    }

    fn resized_size(&self, _crops: &Crops) -> (usize, usize) {
        (self.size.1, self.size.0)
    }

    /// The crops' buffers come on top of what the whole image's resize
    /// left in the scratch.
    fn buffer_bytes(&self, crops: &Crops, input: (u64, u64)) -> u64 {
        let (oh, ow) = (self.size.0 as u64, self.size.1 as u64);
        let mut resizes = resize::working_bytes(input, (ow, oh));
        if crops.count() > 0 {
            let (cw, ch) = (crops.crop_w as u64, crops.crop_h as u64);
            resizes += resize::working_bytes((cw, ch), (ow, oh)) + 3 * cw * ch;
        }
        resizes + 3 * oh * ow
    }

    /// Without pan-and-scan crops, the image's one resize.
    fn one_resize(&self, crops: &Crops) -> Option<resize::WindowedResize> {
        let (h, w) = self.size;
        (crops.count() == 0).then(|| resize::WindowedResize::whole(self.filter, (w, h)))
    }

    /// The image, then its crops.
    fn frames(&self, cut: &mut Cut<'_, Self::Plan>, each: Each<'_>) -> Result<(), VisionError> {
        let (image, parallel) = (cut.image, cut.parallel);
        let crops = cut.plan;
        let (h, w) = self.size;
        let (inter, resized, cropped, _) = cut.scratch.buffers();
        resize_copy(self.filter, image, (w, h), inter, resized, parallel)?;
        each(0, RgbView::new(resized, w, h)?);
        for i in 0..crops.count() {
            let (left, top, cw, ch) = crops.window(i, image.width(), image.height());
            if cw == 0 || ch == 0 {
                return Err(VisionError::Geometry(format!(
                    "pan-and-scan crop {i} of a {}x{} image is empty",
                    image.width(),
                    image.height()
                )));
            }
            image.crop_into(left, top, cw, ch, cropped)?;
            let crop = RgbView::new(cropped, cw, ch)?;
            resize_copy(self.filter, crop, (w, h), inter, resized, parallel)?;
            each(1 + i, RgbView::new(resized, w, h)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pas() -> PreprocessOptions {
        PreprocessOptions {
            pan_and_scan: Some(true),
            ..PreprocessOptions::default()
        }
    }

    #[test]
    fn pan_and_scan_crop_counts() {
        let g = Gemma3Processor::gemma3();
        // Off by default.
        assert_eq!(g.crops(2000, 500, &PreprocessOptions::default()).count(), 0);
        // 4:1 → 4 crops of 500×500.
        let c = g.crops(2000, 500, &pas());
        assert_eq!((c.cols, c.rows, c.crop_w, c.crop_h), (4, 1, 500, 500));
        // Below the activation ratio: none.
        assert_eq!(g.crops(1100, 1000, &pas()).count(), 0);
        // Tall 2.5:1 → rounds half up to 3 crops of 334 rows, the last 332.
        let c = g.crops(400, 1000, &pas());
        assert_eq!((c.cols, c.rows, c.crop_w, c.crop_h), (1, 3, 400, 334));
        assert_eq!(c.window(2, 400, 1000), (0, 668, 400, 332));
        // Crops narrower than 256: none.
        assert_eq!(g.crops(600, 200, &pas()).count(), 0);
    }
}
