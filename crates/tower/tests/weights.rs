//! Checkpoint loading: the tiny model's weights writer, sharded checkpoints,
//! `model.visual.` keys, bf16/f16 conversion, and typed errors.

use std::collections::BTreeMap;
use std::path::Path;

use iris_tower::{
    weight_shapes, write_tiny_weights, Checkpoint, Tower, TowerConfig, TowerError, VisionBackend,
};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// Deterministic pixel rows for `grids`.
fn pixels(config: &TowerConfig, grids: &[[usize; 3]]) -> Vec<f32> {
    let rows: usize = grids.iter().map(|g| g.iter().product::<usize>()).sum();
    (0..rows * config.patch_features())
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect()
}

/// Every tensor of a safetensors file as (name, dtype, shape, bytes).
fn tensors(path: &Path) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).expect("read");
    let file = SafeTensors::deserialize(&bytes).expect("parse");
    let mut out: Vec<_> = file
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn write(path: &Path, items: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = items
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("write");
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn tiny_model(dir: &Path) -> TowerConfig {
    iris_tower::write_tiny_vl_model(dir).expect("tiny VL model");
    TowerConfig::tiny_qwen2_vl()
}

#[test]
fn tiny_vl_model_is_complete_and_deterministic() {
    let a = tempfile::tempdir().expect("tempdir");
    let b = tempfile::tempdir().expect("tempdir");
    iris_tower::write_tiny_vl_model(a.path()).expect("a");
    iris_tower::write_tiny_vl_model(b.path()).expect("b");
    let files: Vec<&str> = iris_tower::tiny_vl_files().collect();
    assert!(files.contains(&iris_tower::WEIGHTS_FILE));
    for file in &files {
        let read = |d: &tempfile::TempDir| std::fs::read(d.path().join(file)).expect(file);
        assert_eq!(read(&a), read(&b), "{file} differs between runs");
    }
    let mut written: Vec<String> = std::fs::read_dir(a.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    let mut expected: Vec<String> = files.iter().map(|f| f.to_string()).collect();
    expected.sort();
    assert_eq!(written, expected, "exactly the listed files");
    let tower = Tower::load(a.path()).expect("the tower loads");
    assert_eq!(tower.config(), &TowerConfig::tiny_qwen2_vl());
    assert_eq!(tower.out_hidden(), iris_model::tiny::HIDDEN_SIZE as usize);
}

#[test]
fn tiny_model_runs_the_real_tower() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_model(dir.path());
    assert_eq!(
        TowerConfig::from_config_json(dir.path()).expect("config"),
        config,
        "the tiny model's vision_config"
    );
    let model_dir = iris_model::ModelDir::load(dir.path()).expect("model dir");
    assert_eq!(
        TowerConfig::from_model_config(&model_dir.config).expect("from ModelConfig"),
        config
    );
    let tower = Tower::load(dir.path()).expect("load");
    let grids = [[1, 4, 6], [1, 2, 2]];
    let out = tower
        .encode(&pixels(&config, &grids), &grids)
        .expect("forward");
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].len(), 6 * 64);
    assert_eq!(out[1].len(), 64);
    assert!(out.iter().flatten().all(|v| v.is_finite()));
    let spread = out[0].iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(spread > 1e-3, "outputs are not all ~0");
    assert_eq!(tower.out_hidden(), 64);
    assert_eq!(tower.patch_cost([1, 4, 6]), 24);
}

#[test]
fn tiny_weights_are_deterministic() {
    let a = tempfile::tempdir().expect("tempdir");
    let b = tempfile::tempdir().expect("tempdir");
    let config = TowerConfig::tiny_qwen2_vl();
    let pa = write_tiny_weights(a.path(), &config, 3).expect("a");
    let pb = write_tiny_weights(b.path(), &config, 3).expect("b");
    assert_eq!(std::fs::read(pa).expect("a"), std::fs::read(pb).expect("b"));
    let ckpt = Checkpoint::open(a.path()).expect("open");
    assert_eq!(ckpt.prefix(), "visual.");
    assert_eq!(ckpt.names().len(), weight_shapes(&config).len());
}

/// Splits the tiny weights into two shards under `model.visual.`, with an
/// unrelated language-model tensor, and checks the outputs do not change.
#[test]
fn sharded_checkpoint_with_model_visual_prefix() {
    let single = tempfile::tempdir().expect("tempdir");
    let config = tiny_model(single.path());
    let sharded = tempfile::tempdir().expect("tempdir");
    iris_model::tiny::write_tiny_qwen2_vl(sharded.path()).expect("tiny model");

    let mut all = tensors(&single.path().join("model.safetensors"));
    for t in &mut all {
        t.0 = t.0.replacen("visual.", "model.visual.", 1);
    }
    let lm = (
        "model.language_model.embed_tokens.weight".to_string(),
        Dtype::F32,
        vec![2, 2],
        vec![0u8; 16],
    );
    let (first, second) = all.split_at(all.len() / 2);
    let mut first = first.to_vec();
    first.push(lm.clone());
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    write(&sharded.path().join(names[0]), &first);
    write(&sharded.path().join(names[1]), second);
    let mut weight_map = BTreeMap::new();
    for (shard, items) in [(names[0], &first[..]), (names[1], second)] {
        for t in items {
            weight_map.insert(t.0.clone(), shard);
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(
        sharded.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .expect("index");

    let grids = [[1, 4, 4]];
    let x = pixels(&config, &grids);
    let a = Tower::load(single.path())
        .expect("single")
        .encode(&x, &grids)
        .expect("a");
    let ckpt = Checkpoint::open(sharded.path()).expect("sharded");
    assert_eq!(ckpt.prefix(), "model.visual.");
    assert!(!ckpt.contains("language_model.embed_tokens.weight"));
    let b = Tower::load(sharded.path())
        .expect("sharded")
        .encode(&x, &grids)
        .expect("b");
    assert_eq!(a, b);
}

fn convert(items: &mut [(String, Dtype, Vec<usize>, Vec<u8>)], dtype: Dtype) {
    for t in items.iter_mut() {
        let values =
            t.3.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        t.3 = match dtype {
            Dtype::BF16 => values
                .flat_map(|v| half::bf16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
            _ => values
                .flat_map(|v| half::f16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
        };
        t.1 = dtype;
    }
}

#[test]
fn half_precision_weights_are_converted() {
    let base = tempfile::tempdir().expect("tempdir");
    let config = tiny_model(base.path());
    let grids = [[1, 4, 4]];
    let x = pixels(&config, &grids);
    let reference = Tower::load(base.path())
        .expect("f32")
        .encode(&x, &grids)
        .expect("f32");
    let scale = reference[0].iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let original = tensors(&base.path().join("model.safetensors"));
    for (dtype, tolerance) in [(Dtype::BF16, 0.05), (Dtype::F16, 0.01)] {
        let dir = tempfile::tempdir().expect("tempdir");
        iris_model::tiny::write_tiny_qwen2_vl(dir.path()).expect("tiny");
        let mut items = original.clone();
        convert(&mut items, dtype);
        write(&dir.path().join("model.safetensors"), &items);
        let ckpt = Checkpoint::open(dir.path()).expect("open");
        let bias = ckpt.tensor("blocks.0.attn.qkv.bias", &[96]).expect("bias");
        assert_eq!(bias.len(), 96);
        let out = Tower::load(dir.path())
            .expect("load")
            .encode(&x, &grids)
            .expect("run");
        let err = max_abs_diff(&out[0], &reference[0]) / scale;
        assert!(err < tolerance, "{dtype:?}: relative error {err}");
        assert!(err > 0.0, "{dtype:?}: conversion changed nothing?");
    }
}

#[test]
fn missing_and_misshapen_weights_are_typed_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tiny_model(dir.path());
    let ckpt = Checkpoint::open(dir.path()).expect("open");

    let mut deeper = config.clone();
    deeper.depth = 3;
    match Tower::from_checkpoint(deeper, &ckpt) {
        Err(TowerError::MissingWeight { name, .. }) => assert_eq!(name, "blocks.2.norm1.weight"),
        other => panic!("expected MissingWeight, got {other:?}"),
    }
    let mut wider = config.clone();
    wider.intermediate_size = 128;
    match Tower::from_checkpoint(wider, &ckpt) {
        Err(TowerError::ShapeMismatch {
            name,
            expected,
            found,
        }) => {
            assert_eq!(name, "visual.blocks.0.mlp.fc1.weight");
            assert_eq!((expected, found), (vec![128, 32], vec![64, 32]));
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    let tower = Tower::from_checkpoint(config.clone(), &ckpt).expect("load");
    match tower.encode(&[0.0; 10], &[[1, 2, 2]]) {
        Err(TowerError::Input(message)) => assert!(message.contains("pixel_values"), "{message}"),
        other => panic!("expected Input, got {other:?}"),
    }
    match tower.encode(&pixels(&config, &[[1, 3, 2]]), &[[1, 3, 2]]) {
        Err(TowerError::Input(message)) => assert!(message.contains("multiples of 2"), "{message}"),
        other => panic!("expected Input, got {other:?}"),
    }
}

#[test]
fn unreadable_checkpoints_are_typed_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    match Checkpoint::open(dir.path()) {
        Err(TowerError::Format { message, .. }) => assert!(message.contains("model.safetensors")),
        other => panic!("expected Format, got {other:?}"),
    }
    std::fs::write(dir.path().join("model.safetensors"), b"not safetensors").expect("write");
    assert!(matches!(
        Checkpoint::open(dir.path()),
        Err(TowerError::Format { .. })
    ));

    let ints = vec![(
        "visual.patch_embed.proj.weight".to_string(),
        Dtype::I64,
        vec![1],
        vec![0u8; 8],
    )];
    write(&dir.path().join("model.safetensors"), &ints);
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    assert!(matches!(
        ckpt.tensor("patch_embed.proj.weight", &[1]),
        Err(TowerError::UnsupportedDtype { .. })
    ));
    let no_vision = vec![(
        "lm_head.weight".to_string(),
        Dtype::F32,
        vec![1],
        vec![0u8; 4],
    )];
    write(&dir.path().join("model.safetensors"), &no_vision);
    assert!(matches!(
        Checkpoint::open(dir.path()),
        Err(TowerError::Format { .. })
    ));
}
