//! Video preprocessing for the Qwen2-VL family, bit-exact with
//! transformers 4.57.1's video processors given the same decoded RGB8
//! frames (docs/video.md):
//!
//! - [`config`]: the model directory's video processor config and class
//!   defaults ([`VideoConfig`], [`video_processor_from_model_dir`]);
//! - [`options`]: per-request overrides ([`VideoOptions`]);
//! - [`sampling`]: which frames to keep ([`VideoProcessor::sample_indices`]);
//! - [`layout`]: grid, tokens, timestamps before any pixel
//!   ([`VideoProcessor::layout`]);
//! - [`patches`]: frames into temporal patch rows;
//! - this file: [`VideoProcessor`], which resizes every frame with
//!   PyTorch's antialiased bicubic ([`crate::Bicubic::Torch`]) over rayon
//!   and writes the normalised rows.

pub mod config;
pub mod layout;
pub mod options;
mod patches;
pub mod sampling;

use std::path::Path;

use half::bf16;
use rayon::prelude::*;

use crate::error::VisionError;
use crate::image::RgbView;
use crate::normalize::OutElem;
use crate::output::{OutputDtype, PixelValues};
use crate::pool::PooledVec;
use crate::processor::fnv1a;
use crate::qwen::QwenFamily;
use crate::resize::{self, resize_with, Bicubic};
use crate::scratch::with_scratch;

pub use config::{video_config_from_json, video_config_from_model_dir, VideoConfig, VideoFamily};
pub use layout::{VideoLayout, QWEN25_DEFAULT_FPS};
pub use options::VideoOptions;
pub use sampling::{Sampling, MAX_SAMPLED_FRAMES};

/// Encoder inputs for one video.
#[derive(Debug)]
pub struct VideoOutput {
    /// `pixel_values_videos`, row-major `[t·h·w, C·T·P·P]`.
    pub pixel_values: PixelValues,
    /// Grid, tokens, sizes and timing of the output.
    pub layout: VideoLayout,
}

/// A Qwen-VL video processor.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoProcessor {
    config: VideoConfig,
}

/// Builds the video processor of a model directory; `Ok(None)` when it has
/// none or the model is not of the Qwen2-VL family
/// ([`video_config_from_model_dir`]).
pub fn video_processor_from_model_dir(dir: &Path) -> Result<Option<VideoProcessor>, VisionError> {
    Ok(video_config_from_model_dir(dir)?.map(VideoProcessor::new))
}

impl VideoProcessor {
    /// A processor for `config`.
    pub fn new(config: VideoConfig) -> Self {
        VideoProcessor { config }
    }

    /// The configuration in force.
    pub fn config(&self) -> &VideoConfig {
        &self.config
    }

    /// Image-side generation (patch size, normalisation family).
    pub fn family(&self) -> QwenFamily {
        self.config.family.qwen()
    }

    /// Video-side generation (tells Qwen2.5-VL apart).
    pub fn video_family(&self) -> VideoFamily {
        self.config.family
    }

    /// How `opts` chooses frames: [`Sampling::EveryFrame`] when neither the
    /// config nor the request samples.
    pub fn sampling(&self, opts: &VideoOptions) -> Result<Sampling, VisionError> {
        sampling::sampling(&self.config, opts)
    }

    /// Indices of the frames to decode from a clip of `total_frames` at
    /// `video_fps`, as the family's HF `sample_frames` picks them (all of
    /// them when [`Self::sampling`] is [`Sampling::EveryFrame`]).
    pub fn sample_indices(
        &self,
        total_frames: u64,
        video_fps: f64,
        opts: &VideoOptions,
    ) -> Result<Vec<u64>, VisionError> {
        sampling::sample_indices(&self.config, total_frames, video_fps, opts)
    }

    /// The output layout for frames `indices` (of a clip at `video_fps`)
    /// of `width`×`height`, before any pixel is computed.
    pub fn layout(
        &self,
        indices: &[u64],
        width: u32,
        height: u32,
        video_fps: f64,
        opts: &VideoOptions,
    ) -> Result<VideoLayout, VisionError> {
        let size = (width as usize, height as usize);
        layout::layout(&self.config, indices, size, video_fps, opts)
    }

    /// Preprocesses `frames` (`indices.len()` frames of `width`×`height`
    /// RGB8, packed `count×h×w×3`), the frames `indices` of a clip at
    /// `video_fps`.
    pub fn preprocess(
        &self,
        frames: &[u8],
        indices: &[u64],
        width: u32,
        height: u32,
        video_fps: f64,
        opts: &VideoOptions,
    ) -> Result<VideoOutput, VisionError> {
        let layout = self.layout(indices, width, height, video_fps, opts)?;
        let (w, h) = (width as usize, height as usize);
        let frame_len = check_frames(frames, indices.len(), w, h)?;
        let input = FrameSet {
            data: frames,
            frame_len,
            size: (w, h),
        };
        let pixel_values = match opts.dtype {
            OutputDtype::F32 => PixelValues::F32(self.write::<f32>(input, &layout)?),
            OutputDtype::Bf16 => PixelValues::Bf16(self.write::<bf16>(input, &layout)?),
        };
        Ok(VideoOutput {
            pixel_values,
            layout,
        })
    }

    /// Peak bytes preprocessing `frames` frames of `width`×`height` takes
    /// beyond the input frames: the output tensor plus, per worker thread,
    /// one frame's resize buffers.
    pub fn memory_needed(
        &self,
        frames: usize,
        width: u32,
        height: u32,
        opts: &VideoOptions,
    ) -> Result<u64, VisionError> {
        let indices: Vec<u64> = (0..frames as u64).collect();
        let layout = self.layout(&indices, width, height, 1.0, opts)?;
        let elements = (layout.shape[0] as u64).saturating_mul(layout.shape[1] as u64);
        let output = elements.saturating_mul(opts.dtype.size() as u64);
        let (rw, rh) = layout.resized;
        let per_worker = resize::working_bytes(
            (u64::from(width), u64::from(height)),
            (rw as u64, rh as u64),
        );
        let workers = layout.grid_thw[0].min(rayon::current_num_threads()).max(1) as u64;
        Ok(output.saturating_add(per_worker.saturating_mul(workers)))
    }

    /// Stable 64-bit fingerprint of everything that affects the output for
    /// these options (config, sampling and size overrides, dtype): the
    /// pixel cache's key part, beside the clip's own identity.
    pub fn fingerprint(&self, opts: &VideoOptions) -> u64 {
        fnv1a(&format!("video|{:?}|{:?}", self.config, opts))
    }

    /// Resizes every frame and writes the rows, one temporal group per task.
    fn write<T: OutElem>(
        &self,
        input: FrameSet<'_>,
        layout: &VideoLayout,
    ) -> Result<PooledVec<T>, VisionError> {
        let geo = self.config.geometry;
        let lut = self.config.norm.fused_lut::<T>();
        let mut out = PooledVec::<T>::take(layout.shape[0] * layout.shape[1]);
        let group_len = layout.shape[0] / layout.grid_thw[0] * layout.shape[1];
        let count = layout.frames;
        // Few groups: let each frame's resize use the pool too.
        let parallel = layout.grid_thw[0] < rayon::current_num_threads();
        out.par_chunks_mut(group_len)
            .enumerate()
            .try_for_each(|(g, group)| {
                with_scratch(|s| {
                    let first = g * geo.temporal_patch_size;
                    for f in first..(first + geo.temporal_patch_size).min(count) {
                        let src = RgbView::new(input.frame(f), input.size.0, input.size.1)?;
                        let frame = resize_with(
                            Bicubic::Torch,
                            src,
                            layout.resized,
                            (&mut s.inter, &mut s.resized),
                            parallel,
                        )?;
                        // The last frame also fills the padding slots after it.
                        let last_slot = if f + 1 == count {
                            geo.temporal_patch_size
                        } else {
                            f - first + 1
                        };
                        for slot in f - first..last_slot {
                            patches::write_slot(frame, geo, &lut, slot, group);
                        }
                    }
                    Ok(())
                })
            })?;
        Ok(out)
    }
}

/// The input frames, packed.
#[derive(Clone, Copy)]
struct FrameSet<'a> {
    data: &'a [u8],
    frame_len: usize,
    size: (usize, usize),
}

impl<'a> FrameSet<'a> {
    fn frame(&self, f: usize) -> &'a [u8] {
        &self.data[f * self.frame_len..(f + 1) * self.frame_len]
    }
}

/// Checks that `frames` holds exactly `count` frames of `w`×`h` RGB8;
/// returns the bytes per frame.
fn check_frames(frames: &[u8], count: usize, w: usize, h: usize) -> Result<usize, VisionError> {
    if w == 0 || h == 0 {
        return Err(VisionError::Video(format!(
            "frames of {w}x{h} have no pixels"
        )));
    }
    let frame_len = w
        .checked_mul(h)
        .and_then(|p| p.checked_mul(3))
        .ok_or_else(|| VisionError::Video(format!("frames of {w}x{h} overflow")))?;
    if count.checked_mul(frame_len) != Some(frames.len()) {
        return Err(VisionError::Video(format!(
            "{} bytes do not hold {count} RGB8 frames of {w}x{h} ({frame_len} bytes each)",
            frames.len()
        )));
    }
    Ok(frame_len)
}
