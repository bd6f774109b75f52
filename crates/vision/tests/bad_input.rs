//! Bad input: every malformed, oversized or unsupported image is refused
//! with a typed error, never a panic.

mod common;

use common::{gif_with_header, jpeg_with_dims, png_with_header, read, Rng};
use iris_vision::{
    decode, probe, AnyresProcessor, ClipProcessor, DecodeLimits, Gemma3Processor,
    Idefics3Processor, PixtralProcessor, PreprocessOptions, Processor, QwenVlProcessor,
    VisionError,
};

const FORMATS: [&str; 6] = [
    "shared/coffee.jpg",
    "shared/coffee.png",
    "shared/chelsea.webp",
    "synthetic/transparent.gif",
    "synthetic/rgb.bmp",
    "synthetic/progressive.jpg",
];

fn qwen() -> QwenVlProcessor {
    QwenVlProcessor::qwen2_vl()
}

#[test]
fn empty_input_is_refused() {
    let err = qwen()
        .preprocess_bytes(&[], &PreprocessOptions::default())
        .unwrap_err();
    assert!(matches!(err, VisionError::EmptyInput), "{err}");
    assert!(err.is_bad_input());
}

#[test]
fn wrong_magic_and_unsupported_formats_are_refused() {
    for bytes in [
        &b"hello world, not an image"[..],
        b"II*\0\x08\0\0\0",
        b"\0\0\0\x0cjP  \r\n\x87\n",
        b"\x00",
    ] {
        let err = decode(bytes, &DecodeLimits::default()).unwrap_err();
        assert!(
            matches!(err, VisionError::UnsupportedFormat { .. }),
            "{err}"
        );
        let message = err.to_string();
        assert!(
            message.contains("none of JPEG, PNG, WebP, GIF, BMP"),
            "{message}"
        );
        // The bytes may come from a remote host: only their size is told.
        assert!(message.contains(&format!("the {} bytes", bytes.len())));
        assert!(
            !message.contains("hello") && !message.contains("0x"),
            "{message}"
        );
    }
}

#[test]
fn truncated_files_are_errors() {
    for name in FORMATS {
        let bytes = read(name);
        for cut in [bytes.len() / 2, bytes.len() / 4, 40, 12, 3] {
            let result = decode(&bytes[..cut.min(bytes.len() - 1)], &DecodeLimits::default());
            let err = result
                .err()
                .unwrap_or_else(|| panic!("{name} cut at {cut} decoded"));
            assert!(err.is_bad_input(), "{name}: {err}");
        }
    }
}

#[test]
fn absurd_header_dimensions_are_refused_before_decoding() {
    let limits = DecodeLimits::default();
    let err = decode(&png_with_header(100_000, 100_000), &limits).unwrap_err();
    assert!(
        matches!(
            err,
            VisionError::SideTooLong {
                width: 100_000,
                height: 100_000,
                ..
            }
        ),
        "{err}"
    );
    let err = decode(&png_with_header(60_000, 60_000), &limits).unwrap_err();
    assert!(
        matches!(
            err,
            VisionError::TooManyPixels {
                pixels: 3_600_000_000,
                ..
            }
        ),
        "{err}"
    );
    let err = decode(
        &jpeg_with_dims(&read("shared/coffee.jpg"), 65_000, 65_000),
        &limits,
    )
    .unwrap_err();
    assert!(
        matches!(err, VisionError::TooManyPixels { format: "JPEG", .. }),
        "{err}"
    );
    let err = decode(&gif_with_header(65_000, 65_000), &limits).unwrap_err();
    assert!(
        matches!(err, VisionError::TooManyPixels { format: "GIF", .. }),
        "{err}"
    );
    // The probe reads the header, and refuses a frame the data cannot fill.
    let err = probe(&png_with_header(100_000, 100_000)).unwrap_err();
    assert!(err.to_string().contains("100000x100000"), "{err}");
}

#[test]
fn zero_size_headers_are_refused() {
    assert!(decode(&png_with_header(0, 10), &DecodeLimits::default()).is_err());
    let err = decode(
        &jpeg_with_dims(&read("shared/coffee.jpg"), 0, 10),
        &DecodeLimits::default(),
    )
    .unwrap_err();
    assert!(err.is_bad_input(), "{err}");
    let err = decode(&gif_with_header(0, 0), &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            VisionError::ZeroSize { .. } | VisionError::Decode { .. }
        ),
        "{err}"
    );
}

#[test]
fn configurable_pixel_limit_applies_to_every_format() {
    let limits = DecodeLimits {
        max_side: 65_535,
        max_pixels: 100,
    };
    for name in FORMATS {
        let err = decode(&read(name), &limits).unwrap_err();
        assert!(
            matches!(
                err,
                VisionError::TooManyPixels {
                    max_pixels: 100,
                    ..
                }
            ),
            "{name}: {err}"
        );
    }
    let opts = PreprocessOptions {
        limits,
        ..PreprocessOptions::default()
    };
    assert!(qwen()
        .preprocess_bytes(&read("shared/coffee.jpg"), &opts)
        .is_err());
}

#[test]
fn extreme_aspect_ratio_is_a_geometry_error() {
    let err = qwen()
        .preprocess_bytes(
            &read("synthetic/rgb_1x4000.png"),
            &PreprocessOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(err, VisionError::Geometry(_)), "{err}");
    assert!(err.to_string().contains("aspect ratio"), "{err}");
}

/// A thin image is magnified by the shortest-edge resize (1×4000 → 336 ×
/// 1 344 000): the resize target is held to the decode limits, with a clear
/// error, instead of allocating gigabytes.
#[test]
fn clip_resize_target_is_held_to_the_limits() {
    let err = ClipProcessor::llava_1_5()
        .preprocess_bytes(
            &read("synthetic/rgb_1x4000.png"),
            &PreprocessOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(err, VisionError::Geometry(_)), "{err}");
    assert!(err.is_bad_input());
    let message = err.to_string();
    assert!(
        message.contains("1x4000 image would be resized to 336x1344000"),
        "{message}"
    );
    assert!(message.contains("89478485 pixels"), "{message}");
}

/// The any-resolution processors never scale beyond their largest grid:
/// thin images that CLIP's shortest-edge resize refuses go through under
/// the default limits, with a working set bounded by the grid.
#[test]
fn anyres_thin_images_stay_within_the_grid() {
    for p in [
        AnyresProcessor::llava_next(),
        AnyresProcessor::llava_onevision(),
    ] {
        for name in [
            "synthetic/rgb_1x4000.png",
            "synthetic/rgb_4000x1.png",
            "synthetic/rgb_1x1.png",
        ] {
            let opts = PreprocessOptions::default();
            let out = p.preprocess_bytes(&read(name), &opts).unwrap();
            assert_eq!(out.pixel_values.len(), out.shape.iter().product::<usize>());
            let info = probe(&read(name)).unwrap();
            assert!(p.memory_needed(&info, &opts).unwrap() < 64 << 20, "{name}");
        }
    }
}

/// Gemma 3 (pan and scan on), SmolVLM and Pixtral on the thinnest images:
/// bounded outputs and working sets, and Pixtral's refusal of an image
/// whose scaled side floors to zero is an error, not a panic.
#[test]
fn tiled_families_on_thin_images() {
    let processors: [&dyn Processor; 3] = [
        &Gemma3Processor::gemma3(),
        &Idefics3Processor::smolvlm(),
        &PixtralProcessor::pixtral_12b(),
    ];
    let opts = PreprocessOptions {
        pan_and_scan: Some(true),
        ..PreprocessOptions::default()
    };
    for p in processors {
        for name in [
            "synthetic/rgb_1x4000.png",
            "synthetic/rgb_4000x1.png",
            "synthetic/rgb_1x1.png",
        ] {
            let bytes = read(name);
            let info = probe(&bytes).unwrap();
            match p.preprocess_bytes(&bytes, &opts) {
                Ok(out) => {
                    assert_eq!(out.pixel_values.len(), out.shape.iter().product::<usize>());
                    assert!(p.memory_needed(&info, &opts).unwrap() < 64 << 20, "{name}");
                }
                Err(e) => {
                    assert_eq!(p.name(), "pixtral", "{name}: {e}");
                    assert!(name != "synthetic/rgb_1x1.png", "{e}");
                    assert!(p.planned_layout(&info, &opts).is_err(), "{name}");
                }
            }
        }
    }
}

/// The fuzzer's slowest input (82 s under ASan): a 4 kB WebP of 2897×8
/// that the shortest-edge resize turns into 121 674 × 336 pixels. Within
/// the default limits it is processed; a tighter pixel limit refuses it
/// before any resize work.
#[test]
fn fuzz_slow_unit_respects_the_pixel_limit() {
    let bytes = read("fuzz/slow-webp-2897x8.webp");
    let tight = PreprocessOptions {
        limits: DecodeLimits {
            max_pixels: 20_000_000,
            ..DecodeLimits::default()
        },
        ..PreprocessOptions::default()
    };
    let err = ClipProcessor::llava_1_5()
        .preprocess_bytes(&bytes, &tight)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("2897x8 image would be resized to 121674x336"),
        "{err}"
    );
}

/// The fuzz target's body, over a bounded deterministic corpus of mutations
/// (bit flips, byte overwrites, truncations, insertions) of every format.
#[test]
fn mutated_inputs_never_panic() {
    let p = qwen();
    let opts = PreprocessOptions {
        max_pixels: Some(200_000),
        ..PreprocessOptions::default()
    };
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let (mut ok, mut failed) = (0, 0);
    for name in FORMATS {
        let original = read(name);
        for _ in 0..150 {
            let mut bytes = original.clone();
            rng.mutate(&mut bytes, 8, &[]);
            match p.preprocess_bytes(&bytes, &opts) {
                Ok(out) => {
                    assert_eq!(out.pixel_values.len(), out.shape.iter().product::<usize>());
                    ok += 1;
                }
                Err(_) => failed += 1,
            }
        }
    }
    let mut real_gif = read("shared/no_time_for_that_tiny.gif");
    for _ in 0..150 {
        let at = rng.below(real_gif.len());
        real_gif[at] ^= 1 << rng.below(8);
        let _ = p.preprocess_bytes(&real_gif, &opts);
    }
    assert_eq!(ok + failed, 900);
    assert!(failed > 0 && ok > 0, "ok {ok}, failed {failed}");
}

#[test]
fn jpeg_warnings_are_errors() {
    // libjpeg pads a truncated scan with grey and only warns; Pillow refuses
    // such a file, and so do we.
    let bytes = read("shared/coffee.jpg");
    let err = decode(&bytes[..bytes.len() * 2 / 3], &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(err, VisionError::Decode { format: "JPEG", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("Premature end"), "{err}");
    // A complete file whose entropy-coded data hits a stray marker: a
    // warning (corrupt data) in libjpeg, an error here.
    let mut damaged = bytes.clone();
    let middle = damaged.len() / 2;
    damaged[middle..middle + 2].copy_from_slice(&[0xFF, 0xD3]);
    let err = decode(&damaged, &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(err, VisionError::Decode { format: "JPEG", .. }),
        "{err}"
    );
    assert!(err.is_bad_input());
    // A tables-only datastream has no frame.
    let err = decode(&[0xFF, 0xD8, 0xFF, 0xD9], &DecodeLimits::default()).unwrap_err();
    assert!(err.is_bad_input(), "{err}");
}
