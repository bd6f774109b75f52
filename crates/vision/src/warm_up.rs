//! The image pipeline warmed before the first request.
//!
//! A fresh process pays first-use costs on its first images that later
//! images do not: each CPU-pool thread's scratch buffers (decoded pixels,
//! the resize's intermediate and output rows) grow and their pages fault
//! in, libjpeg-turbo and the allocator touch their first working memory.
//! [`warm_up`] pays them at start, off any request's path, by
//! preprocessing a synthetic 1080p JPEG on every thread of the pool, both
//! ways the gateway runs an image (with a second thread when it is alone:
//! its rows decoded ahead, or its resize split across the pool; on one
//! thread when others are in flight). The tensors' own memory is
//! prepared apart ([`crate::prepare_tensor_memory`]).

use std::time::{Duration, Instant};

use crate::decode::encode_rgb;
use crate::error::VisionError;
use crate::processor::{PreprocessOptions, Processor};

/// The synthetic image's size: 1080p, the common size of photos and
/// screenshots sent to vision models.
pub const WARM_UP_SIZE: (usize, usize) = (1920, 1080);

/// What a warm-up did.
#[derive(Debug, Clone, Copy)]
pub struct WarmUp {
    /// Pool threads that preprocessed the image on their own.
    pub threads: usize,
    /// Wall time of the whole warm-up, encoding the image included.
    pub elapsed: Duration,
}

/// A photo-like JPEG of `width` × `height`: smooth gradients under fine
/// texture, so entropy decoding, IDCT, upsampling and colour conversion
/// all do a photo's work.
pub fn synthetic_jpeg(width: usize, height: usize) -> Result<Vec<u8>, VisionError> {
    let mut rgb = Vec::with_capacity(width * height * 3);
    for y in 0..height {
        for x in 0..width {
            let grain = ((x * 7 + y * 13) ^ (x * y)) & 31;
            let r = x * 255 / width.max(1);
            let g = y * 255 / height.max(1);
            let b = (x + y) * 127 / (width + height).max(1);
            rgb.extend([r, g, b].map(|c| ((c + grain) & 0xff) as u8));
        }
    }
    encode_rgb(&rgb, width, height, 90)
}

/// [`WARM_UP_SIZE`], scaled down (same aspect) to what `opts`' decode
/// limits accept: a gateway that refuses 1080p images warms up on the
/// largest image it takes.
fn warm_up_size(opts: &PreprocessOptions) -> (usize, usize) {
    let (width, height) = WARM_UP_SIZE;
    let limits = &opts.limits;
    let by_side = f64::from(limits.max_side) / width.max(height) as f64;
    let by_area = (limits.max_pixels as f64 / (width * height) as f64).sqrt();
    let scale = by_side.min(by_area).min(1.0);
    let fit = |side: usize| ((side as f64 * scale).floor() as usize).max(1);
    (fit(width), fit(height))
}

/// Preprocesses a synthetic 1080p JPEG with `opts` once split across the
/// current rayon pool, then once on each of its threads alone. Call it
/// from outside the pool (it blocks until every thread is done).
pub fn warm_up(processor: &dyn Processor, opts: &PreprocessOptions) -> Result<WarmUp, VisionError> {
    let started = Instant::now();
    let (width, height) = warm_up_size(opts);
    let jpeg = synthetic_jpeg(width, height)?;
    let split = PreprocessOptions {
        intra_image_parallel: true,
        ..*opts
    };
    processor.preprocess_bytes(&jpeg, &split)?;
    let alone = PreprocessOptions {
        intra_image_parallel: false,
        ..*opts
    };
    let outcomes = rayon::broadcast(|_| processor.preprocess_bytes(&jpeg, &alone).map(drop));
    let threads = outcomes.len();
    outcomes.into_iter().collect::<Result<(), _>>()?;
    Ok(WarmUp {
        threads,
        elapsed: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::ImageFormat;

    #[test]
    fn the_synthetic_jpeg_decodes_to_its_size() {
        let jpeg = synthetic_jpeg(64, 48).unwrap();
        assert_eq!(crate::decode::sniff(&jpeg).unwrap(), ImageFormat::Jpeg);
        let info = crate::decode::probe(&jpeg).unwrap();
        assert_eq!((info.width, info.height), (64, 48));
    }

    #[test]
    fn every_pool_thread_preprocesses_the_image() {
        let config = serde_json::json!({
            "image_processor_type": "Qwen2VLImageProcessor",
            "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
            "temporal_patch_size": 2, "merge_size": 2,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711]
        });
        let processor = crate::processor_from_config(&config).unwrap();
        let done = warm_up(processor.as_ref(), &PreprocessOptions::default()).unwrap();
        assert_eq!(done.threads, rayon::current_num_threads());
    }

    #[test]
    fn the_image_fits_the_decode_limits() {
        let mut opts = PreprocessOptions::default();
        assert_eq!(warm_up_size(&opts), WARM_UP_SIZE);
        opts.limits.max_pixels = 1_000_000;
        let (w, h) = warm_up_size(&opts);
        assert!(w * h <= 1_000_000 && w > 1300 && h > 700, "{w}×{h}");
        opts.limits.max_side = 640;
        assert_eq!(warm_up_size(&opts), (640, 360));
    }

    #[test]
    fn encoding_refuses_pixels_that_do_not_fit_the_size() {
        assert!(encode_rgb(&[0; 10], 4, 4, 90).is_err());
    }
}
