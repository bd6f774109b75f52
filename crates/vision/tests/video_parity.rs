//! Video parity with transformers 4.57.1's video processors
//! (`Qwen2VLVideoProcessor`, `Qwen3VLVideoProcessor`; torch 2.9.1,
//! torchvision 0.24.1), against tests/data/video/expected.json written by
//! scripts/vision/video_reference.py: on the same RGB8 frames every
//! `pixel_values_videos` must be bit-identical (sha256 of the float32
//! bytes), with the same grid and tokens, or refused where the reference
//! refuses; frame sampling, Qwen3-VL timestamps and Qwen2.5-VL's
//! `second_per_grid_ts` must match their tables exactly.

mod common;

use std::path::PathBuf;

use common::{sample_indices, DATA};
use iris_vision::video::{video_config_from_json, VideoConfig, VideoFamily};
use iris_vision::{decode, DecodeLimits, OutputDtype, VideoOptions, VideoProcessor};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn expected() -> Value {
    let path = PathBuf::from(DATA).join("video/expected.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("expected.json parses")
}

/// The clip's frames, packed, with their size and count.
fn clip(all: &Value, name: &str) -> (Vec<u8>, u32, u32, usize) {
    let meta = &all["clips"][name];
    let (w, h, n) = (
        meta["width"].as_u64().unwrap() as u32,
        meta["height"].as_u64().unwrap() as u32,
        meta["frames"].as_u64().unwrap() as usize,
    );
    let path = PathBuf::from(DATA).join(format!("video/{name}.png"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let image = decode(&bytes, &DecodeLimits::default()).expect("clip decodes");
    assert_eq!((image.width(), image.height()), (w, h * n as u32), "{name}");
    (image.into_raw(), w, h, n)
}

fn processor(all: &Value, name: &str) -> VideoProcessor {
    let cfg = video_config_from_json(&all["processors"][name], None)
        .expect("config parses")
        .unwrap_or_else(|| panic!("{name} is a video processor"));
    let family = match name.split('_').take(2).collect::<Vec<_>>()[..] {
        ["qwen3", _] => VideoFamily::Qwen3Vl,
        ["qwen2", "5"] => VideoFamily::Qwen25Vl,
        _ => VideoFamily::Qwen2Vl,
    };
    assert_eq!(cfg.family, family, "{name}");
    VideoProcessor::new(cfg)
}

fn options(v: &Value) -> VideoOptions {
    let u64_of = |k: &str| v.get(k).and_then(Value::as_u64);
    VideoOptions {
        fps: v.get("fps").and_then(Value::as_f64),
        num_frames: u64_of("num_frames").map(|n| n as u32),
        min_frames: u64_of("min_frames").map(|n| n as u32),
        max_frames: u64_of("max_frames").map(|n| n as u32),
        min_pixels: u64_of("min_pixels"),
        max_pixels: u64_of("max_pixels"),
        total_pixels: u64_of("total_pixels"),
        dtype: OutputDtype::F32,
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// f32 → bf16 (round to nearest even) → f32.
fn bf16_round(x: f32) -> f32 {
    let b = x.to_bits();
    f32::from_bits((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000)
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

#[test]
fn pixel_values_are_bit_identical_to_the_reference() {
    let all = expected();
    let cases = all["cases"].as_array().unwrap();
    assert!(
        cases.len() >= 100,
        "expected.json holds {} cases",
        cases.len()
    );
    let (mut checked, mut refused) = (0, 0);
    for case in cases {
        let name = format!(
            "{} {} {}",
            case["clip"], case["processor"], case["overrides"]
        );
        let (frames, w, h, n) = clip(&all, case["clip"].as_str().unwrap());
        let p = processor(&all, case["processor"].as_str().unwrap());
        let indices: Vec<u64> = (0..n as u64).collect();
        let opts = options(&case["overrides"]);
        let result = p.preprocess(&frames, &indices, w, h, 25.0, &opts);
        if let Some(error) = case.get("error") {
            assert!(
                result.is_err(),
                "{name}: the reference refused ({error}), we did not"
            );
            assert!(
                p.layout(&indices, w, h, 25.0, &opts).is_err(),
                "{name}: layout"
            );
            refused += 1;
            continue;
        }
        let out = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        let layout = &out.layout;
        assert_eq!(
            layout.grid_thw.to_vec(),
            usizes(&case["grid_thw"]),
            "{name}"
        );
        assert_eq!(
            layout.tokens,
            case["tokens"].as_u64().unwrap() as usize,
            "{name}"
        );
        assert_eq!(layout.shape.to_vec(), usizes(&case["shape"]), "{name}");
        assert_eq!(
            p.layout(&indices, w, h, 25.0, &opts).unwrap(),
            *layout,
            "{name}: planned layout"
        );
        let values = out.pixel_values.to_f32_vec();
        for pair in case["samples"].as_array().unwrap() {
            let (i, bits) = (
                pair[0].as_u64().unwrap() as usize,
                pair[1].as_u64().unwrap(),
            );
            assert_eq!(u64::from(values[i].to_bits()), bits, "{name}: element {i}");
        }
        let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let want = case["sum"].as_f64().unwrap();
        assert!(
            (sum - want).abs() <= 1e-9 * want.abs().max(1.0),
            "{name}: sum {sum} vs {want}"
        );
        assert_eq!(
            sha256_hex(out.pixel_values.as_bytes()),
            case["sha256"].as_str().unwrap(),
            "{name}: pixel_values bytes"
        );
        let bf16 = p
            .preprocess(
                &frames,
                &indices,
                w,
                h,
                25.0,
                &VideoOptions {
                    dtype: OutputDtype::Bf16,
                    ..opts
                },
            )
            .unwrap();
        assert_eq!(bf16.pixel_values.dtype(), OutputDtype::Bf16);
        for (i, &v) in values.iter().enumerate() {
            let got = bf16.pixel_values.get_f32(i).unwrap();
            assert_eq!(
                got.to_bits(),
                bf16_round(v).to_bits(),
                "{name}: bf16 element {i}"
            );
        }
        assert!(
            p.memory_needed(n, w, h, &opts).unwrap() >= out.pixel_values.as_bytes().len() as u64,
            "{name}: memory_needed"
        );
        checked += 1;
    }
    assert!(
        checked >= 100 && refused >= 8,
        "{checked} checked, {refused} refused"
    );
}

#[test]
fn frame_sampling_matches_the_reference_table() {
    let all = expected();
    let rows = all["sampling"].as_array().unwrap();
    assert!(rows.len() >= 40);
    for row in rows {
        let name = format!(
            "{} {} {} {}",
            row["family"], row["total"], row["video_fps"], row["options"]
        );
        let base = match row["family"].as_str().unwrap() {
            "qwen3" => VideoConfig::qwen3_vl(),
            _ => VideoConfig::qwen2_vl(),
        };
        let p = VideoProcessor::new(VideoConfig {
            do_sample_frames: true,
            ..base
        });
        let got = p.sample_indices(
            row["total"].as_u64().unwrap(),
            row["video_fps"].as_f64().unwrap(),
            &options(&row["options"]),
        );
        match row.get("indices") {
            Some(want) => {
                let want: Vec<u64> = usizes(want).into_iter().map(|i| i as u64).collect();
                assert_eq!(
                    got.unwrap_or_else(|e| panic!("{name}: {e}")),
                    want,
                    "{name}"
                );
            }
            None => assert!(
                got.is_err(),
                "{name}: the reference refused ({})",
                row["error"]
            ),
        }
    }
}

#[test]
fn qwen3_timestamps_and_their_text_match_the_reference() {
    let all = expected();
    let p = VideoProcessor::new(VideoConfig::qwen3_vl());
    for row in all["timestamps"].as_array().unwrap() {
        let indices: Vec<u64> = usizes(&row["indices"])
            .into_iter()
            .map(|i| i as u64)
            .collect();
        let fps = row["video_fps"].as_f64().unwrap();
        // Enough frames for Qwen3-VL's resize; the timestamps depend on indices only.
        let padded: Vec<u64> = if indices.len() < 2 {
            vec![indices[0]; 2]
        } else {
            indices.clone()
        };
        let layout = p
            .layout(&padded, 64, 64, fps, &VideoOptions::default())
            .unwrap();
        let want: Vec<u64> = row["timestamp_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let got: Vec<u64> = layout
            .timestamps
            .as_ref()
            .unwrap()
            .iter()
            .map(|t| t.to_bits())
            .collect();
        assert_eq!(got, want, "{indices:?} at {fps}");
        for (t, text) in row["text"].as_array().unwrap().iter().enumerate() {
            assert_eq!(
                layout.timestamp_text(t).as_deref(),
                text.as_str(),
                "{indices:?} group {t}"
            );
        }
        assert_eq!(layout.second_per_grid_ts, None);
    }
}

#[test]
fn qwen25_second_per_grid_ts_matches_the_reference() {
    let all = expected();
    let p = processor(&all, "qwen2_5_vl");
    let q2 = processor(&all, "qwen2_vl");
    for row in all["second_per_grid_ts"].as_array().unwrap() {
        let opts = VideoOptions {
            fps: row["fps"].as_f64(),
            ..VideoOptions::default()
        };
        let layout = p.layout(&[0, 1, 2, 3], 64, 64, 30.0, &opts).unwrap();
        let want = row["second_per_grid_ts_bits"].as_u64().unwrap();
        let got = layout.second_per_grid_ts.map(|v| u64::from(v.to_bits()));
        assert_eq!(got, Some(want), "fps {:?}", row["fps"]);
        assert_eq!(layout.timestamps, None);
        assert_eq!(
            q2.layout(&[0, 1], 64, 64, 30.0, &opts)
                .unwrap()
                .second_per_grid_ts,
            None
        );
    }
}

#[test]
fn the_sample_spread_is_the_scripts() {
    // The script samples with the same formula as tests/common (first values).
    assert_eq!(sample_indices(1000, 3), vec![106, 345, 867]);
}
