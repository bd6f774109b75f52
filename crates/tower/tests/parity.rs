//! Parity with `transformers` 4.57.1 on two real images: the data in
//! `tests/data/` is written by `scripts/tower/reference.py` (tiny seeded
//! Qwen2-VL and Qwen2.5-VL towers, images from shared/images preprocessed by
//! `Qwen2VLImageProcessor`). Outputs must match within 1e-4 relative
//! (max |a − b| / max |b|).

use std::path::{Path, PathBuf};

use iris_tower::{Family, Tower, TowerConfig, VisionBackend};
use safetensors::{Dtype, SafeTensors};

const TOLERANCE: f32 = 1e-4;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("data")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32_tensor(file: &SafeTensors<'_>, name: &str) -> (Vec<usize>, Vec<f32>) {
    let view = file.tensor(name).expect("tensor present");
    assert_eq!(view.dtype(), Dtype::F32, "{name}");
    let values = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (view.shape().to_vec(), values)
}

fn grids(file: &SafeTensors<'_>) -> Vec<[usize; 3]> {
    let view = file.tensor("image_grid_thw").expect("grid present");
    assert_eq!(view.dtype(), Dtype::I64);
    let values: Vec<usize> = view
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
        .collect();
    values.chunks_exact(3).map(|g| [g[0], g[1], g[2]]).collect()
}

/// max |a − b| / max |b|.
fn relative_error(actual: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(actual.len(), expected.len());
    let diff = actual
        .iter()
        .zip(expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    let scale = expected.iter().map(|b| b.abs()).fold(0.0, f32::max);
    diff / scale
}

fn check(model_type: &str, family: Family) {
    let inputs_bytes = read(&data_dir().join("inputs.safetensors"));
    let inputs = SafeTensors::deserialize(&inputs_bytes).expect("inputs");
    let (shape, pixel_values) = f32_tensor(&inputs, "pixel_values");
    let grids = grids(&inputs);
    assert_eq!(
        shape[0],
        grids.iter().map(|g| g[0] * g[1] * g[2]).sum::<usize>()
    );

    let dir = data_dir().join(model_type);
    let tower = Tower::load(&dir).expect("load tower");
    assert_eq!(tower.config().family, family);
    let images = tower.encode(&pixel_values, &grids).expect("forward");

    let expected_bytes = read(&dir.join("expected.safetensors"));
    let expected = SafeTensors::deserialize(&expected_bytes).expect("expected");
    let (shape, expected) = f32_tensor(&expected, "embeddings");
    assert_eq!(shape[1], tower.out_hidden());
    let actual: Vec<f32> = images.concat();
    let err = relative_error(&actual, &expected);
    println!("{model_type}: {} tokens, max rel error {err:.3e}", shape[0]);
    assert!(err < TOLERANCE, "{model_type}: relative error {err}");

    // Each image alone gives the same embeddings as in the batch.
    let rows0 = grids[0].iter().product::<usize>();
    let width = tower.config().patch_features();
    let alone = tower
        .encode(&pixel_values[rows0 * width..], &grids[1..])
        .expect("second image alone");
    let err = relative_error(&alone[0], &images[1]);
    assert!(err < 1e-5, "{model_type}: batch vs single {err}");
}

#[test]
fn qwen2_vl_matches_transformers() {
    check("qwen2_vl", Family::Qwen2Vl);
}

#[test]
fn qwen2_5_vl_matches_transformers() {
    check("qwen2_5_vl", Family::Qwen25Vl);
}

#[test]
fn config_json_is_read_like_transformers() {
    let config = TowerConfig::from_config_json(&data_dir().join("qwen2_5_vl")).expect("config");
    assert_eq!(config.window_merged(), 3);
    assert_eq!(config.fullatt_block_indexes, vec![1]);
    assert!(config.is_windowed(0) && !config.is_windowed(1));
    let config = TowerConfig::from_config_json(&data_dir().join("qwen2_vl")).expect("config");
    assert_eq!(config.intermediate_size, 64);
    assert_eq!(config.out_hidden_size, 64);
}
