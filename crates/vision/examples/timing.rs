//! Quick single-thread timing of decode / preprocess (min and median over
//! many runs; the minimum is robust to a shared, noisy machine).
//!
//! `cargo run --release -p iris-vision --example timing -- IMAGE [bf16] [pre | bytes] [par] [ITERS]`

#[path = "support/cpu.rs"]
mod cpu;

use std::time::{Duration, Instant};

use iris_vision::{decode, DecodeLimits, OutputDtype, PreprocessOptions};

fn stats(mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "min {:6.2} ms  median {:6.2} ms",
        v[0].as_secs_f64() * 1e3,
        v[v.len() / 2].as_secs_f64() * 1e3
    )
}

fn time(iters: usize, mut f: impl FnMut()) -> String {
    f();
    let (wall, cpu): (Vec<_>, Vec<_>) = (0..iters)
        .map(|_| {
            let (t, c) = (Instant::now(), cpu::thread_cpu());
            f();
            (t.elapsed(), cpu::thread_cpu() - c)
        })
        .unzip();
    format!("wall {}  | cpu {}", stats(wall), stats(cpu))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: timing IMAGE [bf16] [ITERS]")?;
    let bf16 = args.iter().any(|a| a == "bf16");
    let iters = args.last().and_then(|a| a.parse().ok()).unwrap_or(40usize);
    let bytes = std::fs::read(path)?;
    let config = serde_json::json!({
        "image_processor_type": "Qwen2VLImageProcessor",
        "min_pixels": 3136, "max_pixels": 12845056,
        "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2
    });
    let proc = iris_vision::processor_from_config(&config)?;
    let opts = PreprocessOptions {
        dtype: if bf16 {
            OutputDtype::Bf16
        } else {
            OutputDtype::F32
        },
        // `par`: intra-image parallelism, which takes the whole-image path
        // (with RAYON_NUM_THREADS=1: that path on one thread).
        intra_image_parallel: args.iter().any(|a| a == "par"),
        ..PreprocessOptions::default()
    };
    let rgb = decode(&bytes, &DecodeLimits::default())?;
    let only_pre = args.iter().any(|a| a == "pre");
    if args.iter().any(|a| a == "bytes") {
        // Only decode+preprocess (for `perf stat` of one path).
        println!(
            "decode+pre  {}",
            time(iters, || drop(proc.preprocess_bytes(&bytes, &opts)))
        );
        return Ok(());
    }
    if !only_pre {
        println!(
            "decode      {}",
            time(iters, || drop(decode(&bytes, &DecodeLimits::default())))
        );
    }
    println!(
        "preprocess  {}",
        time(iters, || drop(proc.preprocess(&rgb, &opts)))
    );
    if !only_pre {
        println!(
            "decode+pre  {}",
            time(iters, || drop(proc.preprocess_bytes(&bytes, &opts)))
        );
        // The whole-image path: decode (plus a copy out of scratch), then
        // preprocess.
        println!(
            "decode,pre  {}",
            time(iters, || {
                let rgb = decode(&bytes, &DecodeLimits::default()).expect("decode");
                drop(proc.preprocess(&rgb, &opts))
            })
        );
    }
    Ok(())
}
