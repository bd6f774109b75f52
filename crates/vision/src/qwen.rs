//! Qwen2-VL / Qwen2.5-VL / Qwen3-VL: smart resize, then normalised patch rows.

use half::bf16;

use crate::error::VisionError;
use crate::geometry::smart_resize;
use crate::image::RgbView;
use crate::layout::{PatchGeometry, PatchWriter};
use crate::normalize::{Normalization, OutElem};
use crate::output::{OutputDtype, OutputLayout, PixelValues, PreprocessOutput};
use crate::pool::PooledVec;
use crate::processor::{
    decode_then_preprocess, fnv1a, split_image, streamable_rows, PreprocessOptions, Processor,
};
use crate::resize::{self, resize_banded, resize_into, resize_rows, streams, RowSource};
use crate::scratch::{with_scratch, Scratch};

/// Qwen2-VL's class default `min_pixels` (56·56).
pub const QWEN_DEFAULT_MIN_PIXELS: u64 = 56 * 56;
/// Qwen2-VL's class default `max_pixels` (28·28·1280).
pub const QWEN_DEFAULT_MAX_PIXELS: u64 = 28 * 28 * 1280;

/// Which Qwen generation (decides defaults and the name only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QwenFamily {
    /// Qwen2-VL and Qwen2.5-VL (P = 14, CLIP normalisation).
    Qwen2Vl,
    /// Qwen3-VL (P = 16, mean = std = 0.5).
    Qwen3Vl,
}

impl QwenFamily {
    /// The generation's patch geometry (its image and video processors
    /// share it).
    pub fn geometry(self) -> PatchGeometry {
        let patch_size = match self {
            QwenFamily::Qwen2Vl => 14,
            QwenFamily::Qwen3Vl => 16,
        };
        PatchGeometry {
            patch_size,
            merge_size: 2,
            temporal_patch_size: 2,
        }
    }

    /// The generation's normalisation (its image and video processors
    /// share it).
    pub fn norm(self) -> Normalization {
        match self {
            QwenFamily::Qwen2Vl => Normalization::CLIP,
            QwenFamily::Qwen3Vl => Normalization::HALF,
        }
    }
}

/// A Qwen-VL image processor.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenVlProcessor {
    /// Generation.
    pub family: QwenFamily,
    /// Patch geometry.
    pub geometry: PatchGeometry,
    /// Normalisation.
    pub norm: Normalization,
    /// Lower pixel bound of smart resize.
    pub min_pixels: u64,
    /// Upper pixel bound of smart resize.
    pub max_pixels: u64,
}

impl QwenVlProcessor {
    /// Qwen2-VL / Qwen2.5-VL with the class defaults.
    pub fn qwen2_vl() -> Self {
        QwenVlProcessor {
            family: QwenFamily::Qwen2Vl,
            geometry: QwenFamily::Qwen2Vl.geometry(),
            norm: QwenFamily::Qwen2Vl.norm(),
            min_pixels: QWEN_DEFAULT_MIN_PIXELS,
            max_pixels: QWEN_DEFAULT_MAX_PIXELS,
        }
    }

    /// Qwen3-VL as shipped (`size` 65 536 … 16 777 216).
    pub fn qwen3_vl() -> Self {
        QwenVlProcessor {
            family: QwenFamily::Qwen3Vl,
            geometry: QwenFamily::Qwen3Vl.geometry(),
            norm: QwenFamily::Qwen3Vl.norm(),
            min_pixels: 65_536,
            max_pixels: 16_777_216,
        }
    }

    /// Resized `(height, width)` for an image of `height`×`width` under `opts`.
    pub fn target_size(
        &self,
        height: usize,
        width: usize,
        opts: &PreprocessOptions,
    ) -> Result<(usize, usize), VisionError> {
        let min = opts.min_pixels.unwrap_or(self.min_pixels);
        let max = opts.max_pixels.unwrap_or(self.max_pixels);
        smart_resize(height, width, self.geometry.factor(), min, max)
    }

    /// Resizes the input to `w`×`h` and writes its patch rows; the vertical
    /// resize pass is fused with the patch writer band by band.
    fn write<T: OutElem>(
        &self,
        input: Input<'_, '_>,
        (w, h): (usize, usize),
        scratch: &mut Scratch,
    ) -> Result<PooledVec<T>, VisionError> {
        let geo = self.geometry;
        let writer = PatchWriter::<T>::new(geo, &self.norm);
        let rows = (w / geo.patch_size) * (h / geo.patch_size);
        let mut out = PooledVec::<T>::take(rows * geo.row_len());
        let band_len = writer.band_len(w);
        let consume = |band: RgbView<'_>, chunk: &mut [T]| writer.band(band, chunk);
        match input {
            Input::Image(image, parallel) => resize_banded(
                image,
                (w, h),
                geo.factor(),
                (&mut scratch.inter, &mut scratch.resized),
                &mut out,
                band_len,
                parallel,
                consume,
            )?,
            Input::Rows(source) => resize_rows(
                source,
                (w, h),
                geo.factor(),
                (&mut scratch.decoded, &mut scratch.inter),
                &mut out,
                band_len,
                consume,
            )?,
        }
        Ok(out)
    }

    /// Preprocesses `input`, resized to `size` (`(width, height)`).
    fn run(
        &self,
        input: Input<'_, '_>,
        (w, h): (usize, usize),
        dtype: OutputDtype,
        scratch: &mut Scratch,
    ) -> Result<PreprocessOutput, VisionError> {
        let pixel_values = match dtype {
            OutputDtype::F32 => PixelValues::F32(self.write::<f32>(input, (w, h), scratch)?),
            OutputDtype::Bf16 => PixelValues::Bf16(self.write::<bf16>(input, (w, h), scratch)?),
        };
        let layout = self.resized_layout(w, h);
        Ok(PreprocessOutput::from_layout(pixel_values, layout, (w, h)))
    }

    /// The output layout of an image resized to `w`×`h`.
    fn resized_layout(&self, w: usize, h: usize) -> OutputLayout {
        let geo = self.geometry;
        let grid = [1, h / geo.patch_size, w / geo.patch_size];
        OutputLayout {
            shape: vec![grid[1] * grid[2], geo.row_len()],
            image_grid_thw: Some(grid),
            num_placeholder_tokens: grid[0] * grid[1] * grid[2] / (geo.merge_size * geo.merge_size),
            image_sizes: None,
            tile_grid: None,
            content_size: None,
        }
    }

    /// Decodes and preprocesses `bytes` row by row, resizing each batch of
    /// rows as the decoder emits it (`crate::resize::streamed`), when that
    /// applies: a plain JPEG ([`RowDecoder::open`]), a resize whose
    /// vertical pass runs last, one thread. `Ok(None)` otherwise.
    fn preprocess_rows(
        &self,
        bytes: &[u8],
        opts: &PreprocessOptions,
        scratch: &mut Scratch,
    ) -> Result<Option<PreprocessOutput>, VisionError> {
        let Some(rows) = streamable_rows(bytes, opts)? else {
            return Ok(None);
        };
        let (in_w, in_h) = (rows.width(), rows.height());
        let (h, w) = self.target_size(in_h, in_w, opts)?;
        if !streams((in_w, in_h), (w, h)) {
            return Ok(None);
        }
        rows.run(|src| self.run(Input::Rows(src), (w, h), opts.dtype, scratch))
            .map(Some)
    }
}

/// What [`QwenVlProcessor::write`] resizes.
enum Input<'a, 'r> {
    /// Decoded pixels; bands over the rayon pool when the flag is set.
    Image(RgbView<'a>, bool),
    /// Rows straight from a decoder.
    Rows(&'r mut dyn RowSource),
}

impl Processor for QwenVlProcessor {
    fn name(&self) -> &'static str {
        match self.family {
            QwenFamily::Qwen2Vl => "qwen2_vl",
            QwenFamily::Qwen3Vl => "qwen3_vl",
        }
    }

    fn fingerprint(&self, opts: &PreprocessOptions) -> u64 {
        let n = &self.norm;
        fnv1a(&format!(
            "{}|{:?}|{:?}|{:?}|{:?}|{}|{}|{:?}|{:?}|{:?}",
            self.name(),
            self.geometry,
            n.rescale_factor.to_bits(),
            n.mean.map(f32::to_bits),
            n.std.map(f32::to_bits),
            opts.min_pixels.unwrap_or(self.min_pixels),
            opts.max_pixels.unwrap_or(self.max_pixels),
            opts.dtype,
            opts.limits,
            "pillow-12.2-bicubic",
        ))
    }

    fn working_bytes(
        &self,
        width: u32,
        height: u32,
        opts: &PreprocessOptions,
    ) -> Result<u64, VisionError> {
        let (h, w) = self.target_size(height as usize, width as usize, opts)?;
        let (w, h) = (w as u64, h as u64);
        let p = self.geometry.patch_size as u64;
        let elements = (w / p) * (h / p) * self.geometry.row_len() as u64;
        let resize = resize::working_bytes((width.into(), height.into()), (w, h));
        Ok(resize + elements * opts.dtype.size() as u64)
    }

    fn resized_image(
        &self,
        image: &image::RgbImage,
        opts: &PreprocessOptions,
    ) -> Result<image::RgbImage, VisionError> {
        let view = RgbView::from_image(image)?;
        let (h, w) = self.target_size(view.height(), view.width(), opts)?;
        let (mut inter, mut out) = (Vec::new(), Vec::new());
        resize_into(view, w, h, &mut inter, &mut out, false)?.to_image()
    }

    fn layout_for(
        &self,
        width: usize,
        height: usize,
        opts: &PreprocessOptions,
    ) -> Result<OutputLayout, VisionError> {
        let (h, w) = self.target_size(height, width, opts)?;
        Ok(self.resized_layout(w, h))
    }

    fn preprocess_view(
        &self,
        image: RgbView<'_>,
        opts: &PreprocessOptions,
        scratch: &mut Scratch,
    ) -> Result<PreprocessOutput, VisionError> {
        let (h, w) = self.target_size(image.height(), image.width(), opts)?;
        let parallel = split_image(opts, image.width() * image.height());
        self.run(Input::Image(image, parallel), (w, h), opts.dtype, scratch)
    }

    fn preprocess_bytes(
        &self,
        bytes: &[u8],
        opts: &PreprocessOptions,
    ) -> Result<PreprocessOutput, VisionError> {
        with_scratch(|s| match self.preprocess_rows(bytes, opts, s)? {
            Some(output) => Ok(output),
            None => decode_then_preprocess(self, bytes, opts, s),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::patchify;

    fn noise(w: usize, h: usize) -> Vec<u8> {
        let mut s = (w * 7919 + h) as u32;
        (0..w * h * 3)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 24) as u8
            })
            .collect()
    }

    /// Resize fully, then patchify: the unfused reference of `write`.
    fn unfused<T: OutElem>(p: &QwenVlProcessor, img: RgbView<'_>, w: usize, h: usize) -> Vec<T> {
        let (mut inter, mut full) = (Vec::new(), Vec::new());
        let resized = resize_into(img, w, h, &mut inter, &mut full, false).expect("resize");
        let geo = p.geometry;
        let mut out =
            vec![T::default(); (w / geo.patch_size) * (h / geo.patch_size) * geo.row_len()];
        patchify(resized, geo, &p.norm, &mut out);
        out
    }

    fn check<T: OutElem>(p: &QwenVlProcessor, (iw, ih): (usize, usize), (w, h): (usize, usize)) {
        let data = noise(iw, ih);
        let img = RgbView::new(&data, iw, ih).expect("view");
        let expected = unfused::<T>(p, img, w, h);
        for parallel in [false, true] {
            let mut scratch = Scratch::default();
            let got = p
                .write::<T>(Input::Image(img, parallel), (w, h), &mut scratch)
                .expect("write");
            assert!(
                bytemuck::cast_slice::<T, u8>(&got) == bytemuck::cast_slice::<T, u8>(&expected),
                "{iw}x{ih} -> {w}x{h}, parallel {parallel}"
            );
        }
    }

    #[test]
    fn fused_bands_equal_resize_then_patchify() {
        let cases = [
            ((200, 100), (196, 112)), // both passes, fused
            ((333, 217), (336, 224)), // both passes
            ((224, 300), (224, 280)), // vertical only, fused
            ((300, 224), (280, 224)), // horizontal only
            ((224, 112), (224, 112)), // no resize
            ((20, 2500), (28, 2296)), // vertical first (not fused)
            ((1920, 1080), (1932, 1092)),
        ];
        for (input, output) in cases {
            check::<f32>(&QwenVlProcessor::qwen2_vl(), input, output);
            check::<bf16>(&QwenVlProcessor::qwen2_vl(), input, output);
        }
        check::<f32>(&QwenVlProcessor::qwen3_vl(), (333, 217), (320, 224));
        check::<bf16>(&QwenVlProcessor::qwen3_vl(), (1920, 1080), (1920, 1088));
    }
}
