//! Refusals: limits from the header, bad indices, unsupported or damaged
//! data, and a bounded fuzz of every clip (truncations and bit flips give
//! `Ok` or `Err`, never a panic or a hang).

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::{clip, CLIPS};
use iris_video::{decode_frames, probe, DecodeOptions, VideoError, VideoLimits};

/// A tightened limit and the refusal it must cause.
type LimitCase = (VideoLimits, fn(&VideoError) -> bool);

fn limits() -> VideoLimits {
    VideoLimits::default()
}

#[test]
fn each_limit_is_refused_from_the_header() {
    let bytes = clip("h264_bframes.mp4"); // 160x120, 75 frames, 3 s
    let tight = |f: &dyn Fn(&mut VideoLimits)| {
        let mut l = limits();
        f(&mut l);
        l
    };
    let cases: [LimitCase; 3] = [
        (tight(&|l| l.max_duration_secs = 2.5), |e| {
            matches!(e, VideoError::TooLong { .. })
        }),
        (tight(&|l| l.max_pixels = 160 * 120 - 1), |e| {
            matches!(e, VideoError::TooManyPixels { pixels: 19200, .. })
        }),
        (tight(&|l| l.max_stream_frames = 74), |e| {
            matches!(
                e,
                VideoError::TooManyStreamFrames {
                    frames: 75,
                    limit: 74
                }
            )
        }),
    ];
    for (limits, is_expected) in cases {
        let err = probe(&bytes, &limits).unwrap_err();
        assert!(is_expected(&err), "probe: {err}");
        let opts = DecodeOptions {
            limits,
            ..DecodeOptions::default()
        };
        let err = decode_frames(&bytes, &[0], &opts).unwrap_err();
        assert!(is_expected(&err), "decode: {err}");
    }
    let opts = DecodeOptions {
        limits: tight(&|l| l.max_frames = 2),
        ..DecodeOptions::default()
    };
    let err = decode_frames(&bytes, &[0, 1, 2], &opts).unwrap_err();
    assert!(matches!(
        err,
        VideoError::TooManyRequestedFrames {
            requested: 3,
            limit: 2
        }
    ));
    assert!(err.to_string().contains("3 frames requested"), "{err}");
}

#[test]
fn limits_apply_to_counted_and_animated_streams() {
    // Matroska has no header count: the packet count is checked.
    let l = VideoLimits {
        max_stream_frames: 23,
        ..limits()
    };
    assert!(matches!(
        probe(&clip("hevc.mkv"), &l),
        Err(VideoError::TooManyStreamFrames { frames: 24, .. })
    ));
    let l = VideoLimits {
        max_duration_secs: 0.5,
        ..limits()
    };
    for name in ["anim.gif", "anim.webp"] {
        assert!(
            matches!(probe(&clip(name), &l), Err(VideoError::TooLong { .. })),
            "{name}"
        );
    }
}

#[test]
fn indices_past_the_end_are_refused() {
    for name in CLIPS {
        let bytes = clip(name);
        let total = probe(&bytes, &limits()).unwrap().total_frames;
        let err = decode_frames(&bytes, &[0, total], &DecodeOptions::default()).unwrap_err();
        match err {
            VideoError::IndexOutOfRange {
                index,
                total_frames,
            } => {
                assert_eq!((index, total_frames), (total, total), "{name}");
            }
            other => panic!("{name}: {other}"),
        }
    }
}

#[test]
fn unsupported_and_missing_streams_are_named() {
    let png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR";
    for bytes in [&b""[..], &png[..], b"RIFF\x10\x00\x00\x00AVI LIST"] {
        assert!(matches!(
            probe(bytes, &limits()),
            Err(VideoError::UnsupportedContainer)
        ));
        assert!(matches!(
            decode_frames(bytes, &[0], &DecodeOptions::default()),
            Err(VideoError::UnsupportedContainer)
        ));
    }
    let err = probe(&clip("audio_only.m4a"), &limits()).unwrap_err();
    assert!(matches!(err, VideoError::NoVideoStream(_)), "{err}");
    // A Matroska codec id libavcodec has no decoder for.
    let mut mkv = clip("hevc.mkv");
    let at = mkv
        .windows(16)
        .position(|w| w == b"V_MPEGH/ISO/HEVC")
        .unwrap();
    mkv[at..at + 16].copy_from_slice(b"V_MPEGH/ISO/XXXX");
    let err = probe(&mkv, &limits()).unwrap_err();
    assert!(matches!(err, VideoError::UnsupportedCodec { .. }), "{err}");
}

#[test]
fn corrupt_data_is_an_error_with_libavs_message() {
    let bytes = clip("corrupt.mp4");
    // The header is intact; the damage is in the frames (PyAV decodes 9).
    let info = probe(&bytes, &limits()).unwrap();
    assert_eq!(info.total_frames, 20);
    for (seek, threads) in [(true, 1), (false, 1), (true, 2), (false, 2)] {
        let opts = DecodeOptions {
            seek,
            threads,
            ..DecodeOptions::default()
        };
        let err = decode_frames(&bytes, &[0, 19], &opts).unwrap_err();
        match &err {
            VideoError::Corrupt { message, .. } => {
                assert!(message.contains("Invalid data"), "{err}")
            }
            other => panic!("{other}"),
        }
        // Frames before the damage decode, as PyAV yields them.
        assert_eq!(decode_frames(&bytes, &[0, 8], &opts).unwrap().count, 2);
    }
}

/// A small deterministic generator for the fuzz positions.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % bound.max(1)
    }
}

/// Probes and decodes `bytes` (first, middle and last frame) and drops the
/// result: only a panic or a hang would fail.
fn try_everything(bytes: &[u8]) {
    if let Ok(info) = probe(bytes, &limits()) {
        let last = info.total_frames.saturating_sub(1);
        let _ = decode_frames(bytes, &[0, last / 2, last], &DecodeOptions::default());
    }
    let _ = decode_frames(bytes, &[1], &DecodeOptions::default());
}

#[test]
fn damaged_clips_never_panic_or_hang() {
    let (done, finished) = mpsc::channel();
    let worker = thread::spawn(move || {
        let mut rng = Lcg(22);
        for name in CLIPS.iter().chain(&["corrupt.mp4"]) {
            let bytes = clip(name);
            for k in 1..=12 {
                try_everything(&bytes[..bytes.len() * k / 13]);
            }
            for _ in 0..24 {
                let mut damaged = bytes.clone();
                for _ in 0..1 + rng.next(8) {
                    let at = rng.next(damaged.len());
                    damaged[at] ^= 1 << rng.next(8);
                }
                try_everything(&damaged);
            }
        }
        done.send(()).unwrap();
    });
    // Generous for a debug build on a loaded 2-core machine.
    finished
        .recv_timeout(Duration::from_secs(300))
        .expect("the fuzz loop hung");
    worker.join().unwrap();
}

#[test]
fn a_size_change_mid_stream_is_refused() {
    // Header 80x60; frames 0-4 are 160x120, frames 5-9 80x60.
    let bytes = clip("size_change.mkv");
    let info = probe(&bytes, &limits()).unwrap();
    assert_eq!((info.width, info.height, info.total_frames), (80, 60, 10));
    for seek in [true, false] {
        let opts = DecodeOptions {
            seek,
            ..DecodeOptions::default()
        };
        let frames = decode_frames(&bytes, &[6, 9], &opts).unwrap();
        assert_eq!((frames.width, frames.height, frames.count), (80, 60, 2));
        let err = decode_frames(&bytes, &[0], &opts).unwrap_err();
        assert!(
            matches!(
                err,
                VideoError::SizeChanged {
                    index: 0,
                    width: 160,
                    height: 120,
                    expected_width: 80,
                    expected_height: 60
                }
            ),
            "{err}"
        );
        // Under a pixel limit the header passes, the decoder itself refuses
        // the larger pictures before allocating them.
        let tight = DecodeOptions {
            limits: VideoLimits {
                max_pixels: 80 * 60,
                ..limits()
            },
            seek,
            ..DecodeOptions::default()
        };
        let err = decode_frames(&bytes, &[0], &tight).unwrap_err();
        assert!(matches!(err, VideoError::Corrupt { .. }), "{err}");
    }
}
