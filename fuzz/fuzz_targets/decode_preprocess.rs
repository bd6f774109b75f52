//! Fuzz target: arbitrary bytes through decode + Qwen2-VL and CLIP preprocessing.
//! Any panic, abort or out-of-memory is a bug; errors are fine.
#![no_main]

use iris_vision::{ClipProcessor, DecodeLimits, PreprocessOptions, Processor, QwenVlProcessor};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Small limits keep each run fast and memory-bounded.
    let opts = PreprocessOptions {
        max_pixels: Some(100_000),
        limits: DecodeLimits {
            max_side: 4096,
            max_pixels: 4_000_000,
        },
        ..PreprocessOptions::default()
    };
    if let Ok(out) = QwenVlProcessor::qwen2_vl().preprocess_bytes(data, &opts) {
        assert_eq!(out.pixel_values.len(), out.shape.iter().product::<usize>());
    }
    let _ = ClipProcessor::llava_1_5().preprocess_bytes(data, &opts);
});
