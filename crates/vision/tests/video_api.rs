//! The video API's contract beyond parity: finding a model's video
//! processor, refusing bad requests and frames with typed errors, the
//! every-frame case, fingerprints, and buffer reuse.

use std::path::{Path, PathBuf};

use iris_vision::video::{video_config_from_model_dir, Sampling, VideoConfig, VideoFamily};
use iris_vision::{
    pool_stats, video_processor_from_model_dir, OutputDtype, VideoOptions, VideoProcessor,
    VisionError,
};
use serde_json::json;

/// A fresh directory holding `files` (name → JSON), removed when dropped.
fn model_dir(tag: &str, files: &[(&str, serde_json::Value)]) -> ModelDir {
    let dir = std::env::temp_dir().join(format!("iris-video-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, value) in files {
        std::fs::write(dir.join(name), value.to_string()).unwrap();
    }
    ModelDir(dir)
}

/// A test's model directory, deleted with it.
struct ModelDir(PathBuf);

impl std::ops::Deref for ModelDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ModelDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn family_of(dir: &Path) -> Option<VideoFamily> {
    video_config_from_model_dir(dir).unwrap().map(|c| c.family)
}

#[test]
fn model_directories_resolve_like_transformers() {
    let qwen2_image = json!({"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 12845056});
    let dir = model_dir("q2", &[("preprocessor_config.json", qwen2_image.clone())]);
    let cfg = video_config_from_model_dir(&dir).unwrap().unwrap();
    assert_eq!(cfg.family, VideoFamily::Qwen2Vl);
    assert_eq!(
        (cfg.min_pixels, cfg.max_pixels),
        (3136, 12845056),
        "image bounds carry over"
    );
    assert!(!cfg.do_sample_frames);

    let dir = model_dir(
        "q25",
        &[
            ("preprocessor_config.json", qwen2_image.clone()),
            ("config.json", json!({"model_type": "qwen2_5_vl"})),
        ],
    );
    assert_eq!(family_of(&dir), Some(VideoFamily::Qwen25Vl));

    // The video file wins over the image one; Qwen3 ignores flat min/max_pixels.
    let dir = model_dir(
        "q3",
        &[
            ("preprocessor_config.json", qwen2_image),
            (
                "video_preprocessor_config.json",
                json!({"video_processor_type": "Qwen3VLVideoProcessor", "max_pixels": 5, "size": {"shortest_edge": 4096, "longest_edge": 25165824}}),
            ),
        ],
    );
    let p = video_processor_from_model_dir(&dir).unwrap().unwrap();
    assert_eq!(p.video_family(), VideoFamily::Qwen3Vl);
    assert_eq!(
        (p.config().min_pixels, p.config().max_pixels),
        (4096, 25165824)
    );
    assert_eq!(p.config().fps, Some(2.0));

    // A fast image processor name falls back to config.json's model_type.
    let dir = model_dir(
        "q3fast",
        &[
            (
                "preprocessor_config.json",
                json!({"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16}),
            ),
            ("config.json", json!({"model_type": "qwen3_vl_moe"})),
        ],
    );
    assert_eq!(family_of(&dir), Some(VideoFamily::Qwen3Vl));

    let clip = model_dir(
        "clip",
        &[(
            "preprocessor_config.json",
            json!({"image_processor_type": "CLIPImageProcessor"}),
        )],
    );
    assert_eq!(family_of(&clip), None);
    assert_eq!(family_of(&model_dir("empty", &[])), None);

    let broken = model_dir(
        "bad",
        &[(
            "video_preprocessor_config.json",
            json!({"video_processor_type": "Qwen3VLVideoProcessor", "size": {"shortest_edge": 10}}),
        )],
    );
    assert!(matches!(
        video_config_from_model_dir(&broken),
        Err(VisionError::Config(_))
    ));
    let inverted = model_dir(
        "inv",
        &[(
            "video_preprocessor_config.json",
            json!({"video_processor_type": "Qwen2VLVideoProcessor", "min_pixels": 10, "max_pixels": 5}),
        )],
    );
    assert!(matches!(
        video_config_from_model_dir(&inverted),
        Err(VisionError::Config(_))
    ));
}

fn frames(w: usize, h: usize, n: usize) -> Vec<u8> {
    (0..w * h * 3 * n).map(|i| (i * 7 % 251) as u8).collect()
}

#[test]
fn bad_frames_and_requests_are_typed_errors() {
    let p = VideoProcessor::new(VideoConfig::qwen2_vl());
    let data = frames(64, 48, 2);
    let opts = VideoOptions::default();
    let short = p
        .preprocess(&data[1..], &[0, 1], 64, 48, 30.0, &opts)
        .unwrap_err();
    assert!(
        matches!(short, VisionError::Video(_))
            && short.to_string().contains("2 RGB8 frames of 64x48"),
        "{short}"
    );
    assert!(short.is_bad_input());
    assert!(matches!(
        p.preprocess(&[], &[], 64, 48, 30.0, &opts),
        Err(VisionError::Video(_))
    ));
    assert!(p.preprocess(&[], &[0], 0, 48, 30.0, &opts).is_err());
    let both = VideoOptions {
        fps: Some(2.0),
        num_frames: Some(4),
        ..opts
    };
    let err = p.sample_indices(100, 30.0, &both).unwrap_err();
    assert!(err.to_string().contains("mutually exclusive"), "{err}");
    assert!(p.layout(&[0, 1], 64, 48, 30.0, &both).is_err());
    for bad in [
        VideoOptions {
            min_pixels: Some(10),
            max_pixels: Some(5),
            ..opts
        },
        VideoOptions {
            total_pixels: Some(0),
            ..opts
        },
        VideoOptions {
            fps: Some(-1.0),
            ..opts
        },
        VideoOptions {
            min_frames: Some(9),
            max_frames: Some(3),
            ..opts
        },
    ] {
        assert!(
            matches!(
                p.layout(&[0, 1], 64, 48, 30.0, &bad),
                Err(VisionError::Video(_))
            ),
            "{bad:?}"
        );
    }
    assert!(p.sample_indices(100, f64::INFINITY, &opts).is_err());
    // 1:250 frames: the aspect-ratio limit.
    assert!(matches!(
        p.layout(&[0], 2, 500, 30.0, &opts),
        Err(VisionError::Geometry(_))
    ));
}

#[test]
fn without_sampling_every_frame_is_kept_and_visible() {
    let p = VideoProcessor::new(VideoConfig::qwen2_vl());
    let opts = VideoOptions::default();
    assert_eq!(p.sampling(&opts).unwrap(), Sampling::EveryFrame);
    assert_eq!(
        p.sample_indices(7, 30.0, &opts).unwrap(),
        (0..7).collect::<Vec<_>>()
    );
    let with_fps = VideoOptions {
        fps: Some(2.0),
        ..opts
    };
    assert_eq!(p.sampling(&with_fps).unwrap(), Sampling::Fps(2.0));
    let q3 = VideoProcessor::new(VideoConfig::qwen3_vl());
    assert_eq!(q3.sampling(&opts).unwrap(), Sampling::Fps(2.0));
    let count = VideoOptions {
        num_frames: Some(8),
        ..opts
    };
    assert_eq!(
        q3.sampling(&count).unwrap(),
        Sampling::Count(8),
        "a request count replaces the config fps"
    );
}

#[test]
fn request_controls_change_the_token_count() {
    let p = VideoProcessor::new(VideoConfig::qwen2_vl());
    let tokens = |opts: VideoOptions| {
        let idx = p.sample_indices(300, 30.0, &opts).unwrap();
        p.layout(&idx, 1280, 720, 30.0, &opts).unwrap().tokens
    };
    let two = tokens(VideoOptions {
        fps: Some(2.0),
        ..VideoOptions::default()
    });
    let one = tokens(VideoOptions {
        fps: Some(1.0),
        ..VideoOptions::default()
    });
    assert_eq!(two, 2 * one, "fps doubles the temporal groups");
    let capped = tokens(VideoOptions {
        fps: Some(2.0),
        max_frames: Some(8),
        ..VideoOptions::default()
    });
    assert_eq!(capped * 20, two * 8);
    let small = tokens(VideoOptions {
        fps: Some(2.0),
        max_pixels: Some(28 * 28 * 130),
        ..VideoOptions::default()
    });
    assert!(small < two);
}

#[test]
fn fingerprints_separate_what_changes_the_output() {
    let p = VideoProcessor::new(VideoConfig::qwen2_vl());
    let q3 = VideoProcessor::new(VideoConfig::qwen3_vl());
    let base = VideoOptions::default();
    let variants = [
        base,
        VideoOptions {
            fps: Some(1.0),
            ..base
        },
        VideoOptions {
            max_pixels: Some(50_000),
            ..base
        },
        VideoOptions {
            total_pixels: Some(5_000_000),
            ..base
        },
        VideoOptions {
            dtype: OutputDtype::Bf16,
            ..base
        },
    ];
    let prints: Vec<u64> = variants.iter().map(|o| p.fingerprint(o)).collect();
    for (i, a) in prints.iter().enumerate() {
        for b in &prints[i + 1..] {
            assert_ne!(a, b);
        }
    }
    assert_eq!(
        p.fingerprint(&base),
        VideoProcessor::new(VideoConfig::qwen2_vl()).fingerprint(&base)
    );
    assert_ne!(p.fingerprint(&base), q3.fingerprint(&base));
}

#[test]
fn a_steady_stream_reuses_its_output_buffers() {
    let p = VideoProcessor::new(VideoConfig::qwen2_vl());
    let data = frames(96, 64, 4);
    let run = || {
        p.preprocess(&data, &[0, 1, 2, 3], 96, 64, 30.0, &VideoOptions::default())
            .unwrap()
    };
    drop(run());
    let before = pool_stats();
    for _ in 0..3 {
        drop(run());
    }
    let after = pool_stats();
    assert!(
        after.output_hits >= before.output_hits + 3,
        "{before:?} → {after:?}"
    );
}
