//! Parity with the Hugging Face reference processors (transformers 4.57.1,
//! Pillow 12.2.0), against crates/vision/tests/data/expected.json written
//! by scripts/vision/reference.py.
//!
//! - PNG, WebP, GIF, BMP: our decode must equal Pillow's byte for byte, and
//!   the full pipeline must give the identical resized 8-bit image and floats
//!   within 1e-5.
//! - JPEG: zune-jpeg is not libjpeg-turbo, so decoded pixels may differ by a
//!   few levels. Resize/normalise parity on JPEG input is checked exactly from
//!   Pillow's decoded pixels (committed `*.pil.png` of the synthetic JPEGs);
//!   on the real photos the geometry must be exact and the values close.

mod common;

use common::{expected, image_path, read, sample_indices};
use iris_vision::{
    decode, processor_from_config, DecodeLimits, OutputDtype, PreprocessOptions, Processor,
    RgbImage,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

const TOLERANCE: f32 = 1e-5;

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn as_usize(v: &Value) -> usize {
    v.as_u64().expect("integer") as usize
}

fn opts_from(overrides: &Value) -> PreprocessOptions {
    PreprocessOptions {
        min_pixels: overrides.get("min_pixels").and_then(Value::as_u64),
        max_pixels: overrides.get("max_pixels").and_then(Value::as_u64),
        ..PreprocessOptions::default()
    }
}

fn processor(all: &Value, name: &str) -> Box<dyn Processor> {
    processor_from_config(&all["processors"][name]).expect("processor config")
}

fn decode_file(name: &str) -> RgbImage {
    decode(&read(name), &DecodeLimits::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn is_jpeg(image: &Value) -> bool {
    image["format"] == "jpg"
}

#[test]
fn every_test_image_has_expectations() {
    let all = expected();
    let names: Vec<&str> = all["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    for entry in std::fs::read_dir(common::SHARED).expect("../shared/images exists") {
        let file = entry.unwrap().file_name().into_string().unwrap();
        if file.ends_with(".md") {
            continue;
        }
        assert!(
            names.contains(&format!("shared/{file}").as_str()),
            "no expectations for {file}: rerun reference.py"
        );
    }
    assert!(names.len() >= 40, "only {} images", names.len());
}

#[test]
fn non_jpeg_decode_is_identical_to_pillow() {
    let all = expected();
    let mut checked = 0;
    for image in all["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| !is_jpeg(i))
    {
        let name = image["name"].as_str().unwrap();
        let decoded = decode_file(name);
        let want = &image["decoded"];
        assert_eq!(
            (decoded.width() as usize, decoded.height() as usize),
            (as_usize(&want["width"]), as_usize(&want["height"])),
            "{name}"
        );
        assert_eq!(
            sha256_hex(decoded.as_raw()),
            want["sha256"],
            "{name}: decoded pixels differ from Pillow"
        );
        checked += 1;
    }
    assert!(checked >= 25);
}

#[test]
fn jpeg_decode_is_close_to_pillow() {
    let all = expected();
    for image in all["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| is_jpeg(i))
    {
        let name = image["name"].as_str().unwrap();
        let decoded = decode_file(name);
        let want = &image["decoded"];
        assert_eq!(
            (decoded.width() as usize, decoded.height() as usize),
            (as_usize(&want["width"]), as_usize(&want["height"])),
            "{name}"
        );
        let raw = decoded.as_raw();
        let diffs: Vec<i32> = want["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (i32::from(raw[as_usize(&s[0])]) - s[1].as_i64().unwrap() as i32).abs())
            .collect();
        let max = diffs.iter().copied().max().unwrap_or(0);
        let mean = diffs.iter().sum::<i32>() as f64 / diffs.len() as f64;
        eprintln!("{name}: JPEG decode vs Pillow on samples: max {max}, mean {mean:.2} levels");
        assert!(
            max <= JPEG_MAX_LEVELS && mean <= JPEG_MEAN_LEVELS,
            "{name}: max {max} mean {mean}"
        );
    }
}

/// Bounds measured on the test set (zune-jpeg vs libjpeg-turbo), with margin.
const JPEG_MAX_LEVELS: i32 = 24;
const JPEG_MEAN_LEVELS: f64 = 2.0;

/// Runs every processor case of `image` on `pixels`; `exact` demands
/// identical resized bytes and floats within 1e-5.
fn check_cases(all: &Value, image: &Value, pixels: &RgbImage, exact: bool) -> usize {
    let name = image["name"].as_str().unwrap();
    let mut count = 0;
    for case in image["cases"].as_array().unwrap() {
        let pname = case["processor"].as_str().unwrap();
        let p = processor(all, pname);
        let opts = opts_from(&case["overrides"]);
        let label = format!("{name} / {pname} {}", case["overrides"]);
        let result = p.preprocess(pixels, &opts);
        if let Some(err) = case.get("error") {
            assert!(
                result.is_err(),
                "{label}: reference failed ({err}) but we succeeded"
            );
            count += 1;
            continue;
        }
        let out = result.unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(
            out.shape,
            case["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(as_usize)
                .collect::<Vec<_>>(),
            "{label}"
        );
        assert_eq!(
            out.num_placeholder_tokens,
            as_usize(&case["tokens"]),
            "{label}"
        );
        if let Some(grid) = case.get("grid_thw") {
            let want: Vec<usize> = grid.as_array().unwrap().iter().map(as_usize).collect();
            assert_eq!(
                out.image_grid_thw.map(|g| g.to_vec()),
                Some(want),
                "{label}"
            );
        }
        let values = out.pixel_values.to_f32_vec();
        let samples = case["samples"].as_array().unwrap();
        let idx = sample_indices(values.len(), all["sample_count"].as_u64().unwrap() as usize);
        assert_eq!(idx.len(), samples.len(), "{label}");
        let mut worst = 0f32;
        for (i, s) in idx.iter().zip(samples) {
            assert_eq!(*i, as_usize(&s[0]), "{label}: sample positions");
            worst = worst.max((values[*i] - s[1].as_f64().unwrap() as f32).abs());
        }
        let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let sum_sq: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let n = values.len() as f64;
        if exact {
            let resized = p.resized_image(pixels, &opts).unwrap();
            assert_eq!(
                (resized.width() as usize, resized.height() as usize),
                (
                    as_usize(&case["resized_width"]),
                    as_usize(&case["resized_height"])
                ),
                "{label}"
            );
            assert_eq!(
                sha256_hex(resized.as_raw()),
                case["resized_sha256"],
                "{label}: resized image differs from Pillow"
            );
            assert!(worst <= TOLERANCE, "{label}: sample off by {worst}");
            assert!(
                (sum - case["sum"].as_f64().unwrap()).abs() <= 1e-6 * n + 1e-3,
                "{label}: sum {sum} vs {}",
                case["sum"]
            );
            assert!(
                (sum_sq - case["sum_sq"].as_f64().unwrap()).abs() <= 1e-5 * n + 1e-3,
                "{label}: sum_sq"
            );
        } else {
            let mean_diff = (sum - case["sum"].as_f64().unwrap()).abs() / n;
            eprintln!(
                "{label}: from our JPEG decode: worst sample {worst:.4}, mean shift {mean_diff:.5}"
            );
            assert!(
                worst <= 0.4 && mean_diff <= 0.01,
                "{label}: worst {worst} mean {mean_diff}"
            );
        }
        count += 1;
    }
    count
}

#[test]
fn processors_match_reference_exactly_on_lossless_inputs() {
    let all = expected();
    let mut count = 0;
    for image in all["images"].as_array().unwrap() {
        let pixels = match image["decoded"].get("pil_png") {
            Some(png) => decode_file(png.as_str().unwrap()),
            None if is_jpeg(image) => continue,
            None => decode_file(image["name"].as_str().unwrap()),
        };
        count += check_cases(&all, image, &pixels, true);
    }
    assert!(count >= 100, "only {count} cases");
}

#[test]
fn processors_stay_close_on_real_jpegs() {
    let all = expected();
    let mut count = 0;
    for image in all["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| is_jpeg(i) && i["decoded"].get("pil_png").is_none())
    {
        let pixels = decode_file(image["name"].as_str().unwrap());
        count += check_cases(&all, image, &pixels, false);
    }
    assert!(count >= 12, "only {count} cases");
}

#[test]
fn bytes_path_equals_image_path_and_bf16_rounds_f32() {
    let all = expected();
    let p = processor(&all, "qwen2_vl");
    let bytes = read("shared/chelsea.png");
    let opts = PreprocessOptions::default();
    let from_bytes = p.preprocess_bytes(&bytes, &opts).unwrap();
    let from_image = p
        .preprocess(&decode_file("shared/chelsea.png"), &opts)
        .unwrap();
    assert_eq!(
        from_bytes.pixel_values.as_bytes(),
        from_image.pixel_values.as_bytes()
    );
    let bf16 = p
        .preprocess_bytes(
            &bytes,
            &PreprocessOptions {
                dtype: OutputDtype::Bf16,
                ..opts
            },
        )
        .unwrap();
    assert_eq!(bf16.pixel_values.len(), from_bytes.pixel_values.len());
    let f = from_bytes.pixel_values.to_f32_vec();
    for (i, v) in bf16
        .pixel_values
        .to_f32_vec()
        .iter()
        .enumerate()
        .step_by(97)
    {
        assert_eq!(*v, half::bf16::from_f32(f[i]).to_f32());
    }
    let parallel = p
        .preprocess_bytes(
            &bytes,
            &PreprocessOptions {
                intra_image_parallel: true,
                ..opts
            },
        )
        .unwrap();
    assert_eq!(
        parallel.pixel_values.as_bytes(),
        from_bytes.pixel_values.as_bytes()
    );
    assert_ne!(
        p.fingerprint(&opts),
        p.fingerprint(&PreprocessOptions {
            dtype: OutputDtype::Bf16,
            ..opts
        })
    );
    let _ = image_path("shared/chelsea.png");
}
