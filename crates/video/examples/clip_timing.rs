//! Decode + preprocess timing of one clip, as the gateway runs it: probe,
//! sample at 2 fps with Qwen2-VL's video processor defaults, decode the
//! sampled frames (one decoder thread) and preprocess them (rayon), min and
//! median over runs. `scripts/video/hf_clip_timing.py` times transformers'
//! PyAV loader and video processor on the same file (docs/benchmarks.md).
//!
//! `cargo run --release -p iris-video --example clip_timing -- FILE [RUNS] [bf16]`

use std::time::{Duration, Instant};

use iris_video::{decode_frames, probe, DecodeOptions, VideoLimits};
use iris_vision::video::{VideoConfig, VideoFamily};
use iris_vision::{OutputDtype, VideoOptions, VideoProcessor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: clip_timing FILE [RUNS] [bf16]")?;
    let runs: usize = args.get(1).map_or(Ok(5), |s| s.parse())?;
    let dtype = match args.iter().any(|a| a == "bf16") {
        true => OutputDtype::Bf16,
        false => OutputDtype::F32,
    };
    let bytes = std::fs::read(path)?;
    let processor = VideoProcessor::new(VideoConfig::defaults(VideoFamily::Qwen2Vl));
    let options = VideoOptions {
        fps: Some(2.0),
        dtype,
        ..VideoOptions::default()
    };
    let (mut decode, mut preprocess) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let started = Instant::now();
        let info = probe(&bytes, &VideoLimits::default())?;
        let indices = processor.sample_indices(info.total_frames, info.fps, &options)?;
        let frames = decode_frames(&bytes, &indices, &DecodeOptions::default())?;
        decode.push(started.elapsed());
        let started = Instant::now();
        let out = processor.preprocess(
            &frames.data,
            &indices,
            frames.width,
            frames.height,
            info.fps,
            &options,
        )?;
        preprocess.push(started.elapsed());
        if decode.len() == 1 {
            println!(
                "{info:?}\n{} frames sampled → grid {:?}, {} tokens, {:?}",
                indices.len(),
                out.layout.grid_thw,
                out.layout.tokens,
                dtype
            );
        }
    }
    let totals: Vec<Duration> = decode
        .iter()
        .zip(&preprocess)
        .map(|(a, b)| *a + *b)
        .collect();
    for (name, times) in [
        ("decode", decode),
        ("preprocess", preprocess),
        ("total", totals),
    ] {
        let (min, median) = min_median(times);
        println!(
            "{name:>10}: min {:7.1} ms, median {:7.1} ms",
            ms(min),
            ms(median)
        );
    }
    Ok(())
}

fn min_median(mut times: Vec<Duration>) -> (Duration, Duration) {
    times.sort();
    (times[0], times[times.len() / 2])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
