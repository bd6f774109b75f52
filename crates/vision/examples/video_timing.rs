//! Wall-clock timing of video preprocessing: 20 frames of 1280×720 (a 10 s
//! 720p clip sampled at 2 fps) through [`VideoProcessor::preprocess`] for
//! each family's shipped-style config, min and median over runs.
//! `scripts/vision/video_speed.py` times transformers on the same frames.
//!
//! `cargo run --release -p iris-vision --example video_timing -- [ITERS] [bf16]`

use std::time::{Duration, Instant};

use iris_vision::video::{VideoConfig, VideoFamily};
use iris_vision::{OutputDtype, VideoOptions, VideoProcessor};

const WIDTH: u32 = 1280;
const HEIGHT: u32 = 720;
const FRAMES: usize = 20;

/// Deterministic frames: gradients plus a texture that moves per frame.
fn frames() -> Vec<u8> {
    let (w, h) = (WIDTH as usize, HEIGHT as usize);
    let mut out = Vec::with_capacity(FRAMES * w * h * 3);
    for f in 0..FRAMES {
        for y in 0..h {
            for x in 0..w {
                let t = ((x + 3 * f) * (x + 3 * f) * 5 + 3 * y * y) % 29 * 7;
                out.extend_from_slice(&[
                    ((x * 255 / (w - 1) + t) % 256) as u8,
                    ((y * 255 / (h - 1) + t * 3 % 61) % 256) as u8,
                    (((x + y + 17 * f) * 97 + t % 47) % 256) as u8,
                ]);
            }
        }
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let iters: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(10);
    let dtype = if args.iter().any(|a| a == "bf16") {
        OutputDtype::Bf16
    } else {
        OutputDtype::F32
    };
    let data = frames();
    let indices: Vec<u64> = (0..FRAMES as u64).map(|i| i * 15).collect();
    let configs = [
        // Qwen2-VL / Qwen2.5-VL shipped bounds (3136 … 12845056 per frame).
        VideoConfig {
            min_pixels: 3136,
            max_pixels: 12_845_056,
            ..VideoConfig::defaults(VideoFamily::Qwen2Vl)
        },
        VideoConfig::qwen2_vl(),
        VideoConfig {
            min_pixels: 4096,
            max_pixels: 25_165_824,
            ..VideoConfig::qwen3_vl()
        },
    ];
    let opts = VideoOptions {
        dtype,
        ..VideoOptions::default()
    };
    for cfg in configs {
        let (lo, hi) = (cfg.min_pixels, cfg.max_pixels);
        let p = VideoProcessor::new(cfg);
        let mut times = Vec::with_capacity(iters);
        let mut layout = None;
        for _ in 0..iters {
            let start = Instant::now();
            let out = match p.preprocess(&data, &indices, WIDTH, HEIGHT, 30.0, &opts) {
                Ok(out) => out,
                Err(e) => {
                    eprintln!("preprocess failed: {e}");
                    std::process::exit(1);
                }
            };
            times.push(start.elapsed());
            layout = Some(out.layout);
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        if let Some(l) = layout {
            println!(
                "{:<10} size {lo}..{hi}: {FRAMES} frames {WIDTH}x{HEIGHT} -> {}x{} grid {:?} {} ({} threads): min {:.1} ms  median {:.1} ms",
                p.video_family().name(),
                l.resized.0,
                l.resized.1,
                l.grid_thw,
                dtype.name(),
                rayon::current_num_threads(),
                ms(times[0]),
                ms(times[times.len() / 2]),
            );
        }
    }
}
