//! Helpers shared by the integration tests: the committed clips and the
//! PyAV reference data of `scripts/video/pyav_reference.py`.

#![allow(dead_code)]

use std::path::PathBuf;

use iris_video::{decode_frames, DecodeOptions, Frames};
use serde_json::Value;

/// The playable clips (every committed video but the corrupt one).
pub const CLIPS: [&str; 13] = [
    "h264_rotated.mp4",
    "h264_bt709.mp4",
    "h264_fullrange.mp4",
    "h264.mp4",
    "h264.mov",
    "h264_bframes.mp4",
    "h264_longgop.mp4",
    "h264_odd.mp4",
    "hevc.mkv",
    "vp9.webm",
    "av1.mp4",
    "anim.gif",
    "anim.webp",
];

pub fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

pub fn clip(name: &str) -> Vec<u8> {
    std::fs::read(data_path(name)).unwrap()
}

/// The reference entry of `name` in pyav.json.
pub fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(data_path("pyav.json")).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    json["clips"][name].clone()
}

/// Decodes `indices` with or without the keyframe jumps.
pub fn decode(bytes: &[u8], indices: &[u64], seek: bool) -> Frames {
    let opts = DecodeOptions {
        seek,
        ..DecodeOptions::default()
    };
    decode_frames(bytes, indices, &opts).unwrap()
}
