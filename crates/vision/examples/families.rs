//! Decode + preprocess time of one image through every family's processor
//! (one thread, float32, as Hugging Face's processors return), for the
//! per-family comparison with transformers (`e2e/bench/families.sh`).
//!
//! `cargo run --release -p iris-vision --example families -- EXPECTED_JSON IMAGE [ITERS]`
//!
//! EXPECTED_JSON is the parity reference (crates/vision/tests/data/expected.json),
//! whose `processors` map each family to its preprocessor config. Prints
//! one tab-separated line per family, after one for the decode alone
//! (`decode`): name, median and minimum thread CPU milliseconds.

#[path = "support/cpu.rs"]
mod cpu;
#[path = "support/timed.rs"]
mod timed;

use iris_vision::{OutputDtype, PreprocessOptions};
use timed::cpu_times;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: families EXPECTED_JSON IMAGE [ITERS]";
    let expected = args.get(1).ok_or(usage)?;
    let image = args.get(2).ok_or(usage)?;
    let iters = match args.get(3) {
        Some(n) => n.parse()?,
        None => 20,
    };
    let reference: serde_json::Value = serde_json::from_slice(&std::fs::read(expected)?)?;
    let processors = reference["processors"]
        .as_object()
        .ok_or("the reference has no `processors` object")?;
    let bytes = std::fs::read(image)?;
    let options = PreprocessOptions {
        dtype: OutputDtype::F32,
        intra_image_parallel: false,
        ..PreprocessOptions::default()
    };
    // The decode alone (into reused scratch, as every processor starts):
    // the part of each figure below that Pillow's decode costs HF too.
    let mut failure = None;
    let (median, min) = cpu_times(iters, || {
        if let Err(e) = iris_vision::decode_with(&bytes, &options.limits, |_| ()) {
            failure = Some(e.to_string());
        }
    });
    if let Some(e) = failure {
        return Err(format!("decode: {e}").into());
    }
    print_times("decode", median, min);
    for (name, config) in processors {
        let processor = iris_vision::processor_from_config(config)?;
        let mut failure = None;
        let (median, min) = cpu_times(iters, || {
            if let Err(e) = processor.preprocess_bytes(&bytes, &options) {
                failure = Some(e.to_string());
            }
        });
        if let Some(e) = failure {
            return Err(format!("{name}: {e}").into());
        }
        print_times(name, median, min);
    }
    Ok(())
}

/// One output line: name, median and minimum milliseconds.
fn print_times(name: &str, median: std::time::Duration, min: std::time::Duration) {
    println!(
        "{name}\t{:.2}\t{:.2}",
        median.as_secs_f64() * 1e3,
        min.as_secs_f64() * 1e3
    );
}
