//! Times probing and decoding a video file at N evenly spaced frames, with
//! and without seeking, and checks both give the same frames.
//!
//! `cargo run --release -p iris-video --example decode_timing -- FILE [N] [THREADS]`

use std::time::Instant;

use iris_video::{decode_frames, probe, DecodeOptions, VideoLimits};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: decode_timing FILE [N] [THREADS]")?;
    let n: u64 = args.next().map_or(Ok(20), |s| s.parse())?;
    let threads: usize = args.next().map_or(Ok(1), |s| s.parse())?;
    let bytes = std::fs::read(&path)?;
    let limits = VideoLimits::default();

    let start = Instant::now();
    let info = probe(&bytes, &limits)?;
    let probe_ms = start.elapsed().as_secs_f64() * 1e3;
    println!("{info:?}");

    let n = n.min(info.total_frames).max(1);
    let indices: Vec<u64> = (0..n).map(|k| k * info.total_frames / n).collect();
    let mut results = Vec::new();
    for seek in [true, false] {
        let opts = DecodeOptions {
            limits,
            threads,
            seek,
        };
        let start = Instant::now();
        let frames = decode_frames(&bytes, &indices, &opts)?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        println!(
            "probe {probe_ms:.1} ms; decode {} frames of {}x{} (seek {seek}, threads {threads}): {ms:.1} ms",
            frames.count, frames.width, frames.height
        );
        results.push(frames);
    }
    println!("same frames both ways: {}", results[0] == results[1]);
    Ok(())
}
