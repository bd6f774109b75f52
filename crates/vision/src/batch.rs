//! Many images at once, spread over the current rayon pool.

use rayon::prelude::*;

use crate::error::VisionError;
use crate::output::PreprocessOutput;
use crate::processor::{PreprocessOptions, Processor};

/// Decodes and preprocesses every image in parallel (one task per image,
/// each with its thread's scratch). Results keep the input order.
pub fn preprocess_batch<B: AsRef<[u8]> + Sync>(
    processor: &dyn Processor,
    images: &[B],
    opts: &PreprocessOptions,
) -> Vec<Result<PreprocessOutput, VisionError>> {
    images
        .par_iter()
        .map(|bytes| processor.preprocess_bytes(bytes.as_ref(), opts))
        .collect()
}
