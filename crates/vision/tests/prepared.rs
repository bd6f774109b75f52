//! Prepared tensor memory: tensors kept alive (as a cache keeps them)
//! take prepared chunks once they are prepared, in whole 2 MiB chunks,
//! and hold exactly the pixels a heap-backed tensor holds.

mod common;

use std::time::{Duration, Instant};

use common::read;
use iris_vision::{
    prepare_tensor_memory, tensor_memory_stats, OutputDtype, PreprocessOptions, Processor,
    QwenVlProcessor,
};

const CHUNK: usize = 2 << 20;

fn wait_prepared(bytes: usize) {
    let started = Instant::now();
    while tensor_memory_stats().prepared_bytes < bytes {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not prepared: {:?}",
            tensor_memory_stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Tensors kept alive at once (as a cache keeps them) per dtype.
const KEPT: usize = 3;

/// One test function so nothing else takes chunks in this binary.
#[test]
fn kept_tensors_take_prepared_memory_with_the_same_pixels() {
    let p = QwenVlProcessor::qwen2_vl();
    let bytes = read("shared/motorcycle_1080p.jpg");
    let cases: Vec<_> = [OutputDtype::Bf16, OutputDtype::F32]
        .into_iter()
        .map(|dtype| {
            let opts = PreprocessOptions {
                dtype,
                ..PreprocessOptions::default()
            };
            // Before anything is prepared: heap memory.
            let expected = p.preprocess_bytes(&bytes, &opts).unwrap();
            (opts, expected)
        })
        .collect();
    // The dropped tensors of one dtype stay in its pool's free list, so
    // prepare room for both.
    let need: usize = cases
        .iter()
        .map(|(_, e)| KEPT * e.pixel_values.as_bytes().len().next_multiple_of(CHUNK))
        .sum();
    prepare_tensor_memory(need);
    wait_prepared(need);
    for (opts, expected) in &cases {
        let len = expected.pixel_values.as_bytes().len();
        let served = tensor_memory_stats().served;
        // Kept alive together, so the pool cannot recycle one for the next.
        let kept: Vec<_> = (0..KEPT)
            .map(|_| p.preprocess_bytes(&bytes, opts).unwrap())
            .collect();
        let stats = tensor_memory_stats();
        // The first may be the expected tensor's, recycled.
        assert!(stats.served >= served + KEPT as u64 - 1, "{stats:?}");
        for out in &kept {
            assert_eq!(
                out.pixel_values.as_bytes(),
                expected.pixel_values.as_bytes()
            );
            assert!(out.pixel_values.allocated_bytes() >= len);
        }
        let chunked = kept
            .iter()
            .filter(|o| o.pixel_values.allocated_bytes() % CHUNK == 0)
            .count();
        assert!(chunked >= KEPT - 1, "{chunked} of {KEPT} tensors in chunks");
    }
}
