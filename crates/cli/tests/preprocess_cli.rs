//! `iris preprocess` as a user runs it: the real binary on a shared photo
//! with the tiny model's preprocessor config. The printed shape, grid and
//! token count and the written `.npy` must be what the vision crate gives
//! for the same image, and bad input must end in a clear error, not a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use iris_vision::{decode, processor_from_model_dir, DecodeLimits, PreprocessOptions};

const IMAGE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/images/coffee.jpg"
);

/// The tiny model (its preprocessor config is the one used) in a
/// temporary directory.
fn tiny_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    iris_model::tiny::write_tiny_qwen2_vl(dir.path()).expect("tiny model");
    dir
}

fn iris(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iris"))
        .arg("preprocess")
        .args(args)
        .output()
        .expect("the iris binary runs")
}

/// The value after `label` on its line of the report.
fn field<'a>(report: &'a str, label: &str) -> &'a str {
    report
        .lines()
        .find_map(|line| line.strip_prefix(label))
        .unwrap_or_else(|| panic!("no `{label}` line in:\n{report}"))
        .trim()
}

/// Shape and little-endian f32 values of a version 1.0 `.npy` file.
fn read_npy(path: &Path) -> (String, Vec<f32>) {
    let bytes = std::fs::read(path).expect("npy written");
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "npy magic and version");
    let header_len = usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).expect("ascii header");
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    assert_eq!((10 + header_len) % 64, 0, "data starts 64-byte aligned");
    let shape = header
        .split("'shape': ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("shape in header")
        .trim_start_matches('(')
        .to_owned();
    let data = &bytes[10 + header_len..];
    assert_eq!(data.len() % 4, 0);
    let values = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (shape, values)
}

#[test]
fn report_and_npy_match_the_vision_crate() {
    let model = tiny_model();
    let out_dir = tempfile::tempdir().expect("temp dir");
    let npy: PathBuf = out_dir.path().join("pixels.npy");
    let run = iris(&[
        "--model-path".as_ref(),
        model.path().as_os_str(),
        IMAGE.as_ref(),
        "--out".as_ref(),
        npy.as_os_str(),
    ]);
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let processor = processor_from_model_dir(model.path()).expect("processor");
    let bytes = std::fs::read(IMAGE).expect("shared image");
    let rgb = decode(&bytes, &DecodeLimits::default()).expect("decode");
    let expected = processor
        .preprocess(&rgb, &PreprocessOptions::default())
        .expect("preprocess");

    let image = field(&report, "image:");
    assert!(image.starts_with("JPEG 600x400 ("), "{image}");
    assert_eq!(
        field(&report, "pixel_values:"),
        format!("{:?} float32", expected.shape)
    );
    let grid = expected
        .image_grid_thw
        .expect("Qwen processors have a grid");
    assert_eq!(field(&report, "image_grid_thw:"), format!("{grid:?}"));
    assert_eq!(
        field(&report, "tokens:"),
        expected.num_placeholder_tokens.to_string()
    );
    assert_eq!(
        expected.num_placeholder_tokens,
        (grid[0] * grid[1] * grid[2] / 4) as usize,
        "t*h*w / merge^2"
    );

    let (shape, values) = read_npy(&npy);
    let dims: Vec<String> = expected.shape.iter().map(usize::to_string).collect();
    assert_eq!(shape, dims.join(", "));
    let expected_values = expected.pixel_values.to_f32_vec();
    assert_eq!(values.len(), expected_values.len());
    assert!(
        values
            .iter()
            .zip(&expected_values)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the .npy holds exactly the processor's float32 output"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let model = tiny_model();
    let dir = tempfile::tempdir().expect("temp dir");
    let corrupt = dir.path().join("corrupt.jpg");
    std::fs::write(&corrupt, b"\xFF\xD8\xFF\xE0 not really a jpeg").expect("write");
    let missing = dir.path().join("missing.png");
    let no_model = dir.path().join("no-model");

    let cases: [(&Path, &Path, &str); 3] = [
        (model.path(), &corrupt, "JPEG"),
        (model.path(), &missing, "missing.png"),
        (&no_model, Path::new(IMAGE), "no-model"),
    ];
    for (model_dir, image, fragment) in cases {
        let run = iris(&[
            "--model-path".as_ref(),
            model_dir.as_os_str(),
            image.as_os_str(),
        ]);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(fragment), "{fragment:?} in {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
