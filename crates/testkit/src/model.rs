//! A tiny Qwen2-VL-shaped model directory (`iris_model::tiny`), for tests
//! that start real engines, encoders or gateways.

use tempfile::TempDir;

/// A tiny model in a temporary directory, removed on drop.
pub struct TinyModel {
    pub dir: TempDir,
    /// The directory's name: the served model name by default.
    pub name: String,
}

impl TinyModel {
    /// The model directory.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// Writes a tiny model into a fresh temporary directory.
pub fn tiny_model() -> TinyModel {
    let dir = tempfile::tempdir().expect("temp dir");
    iris_model::tiny::write_tiny_qwen2_vl(dir.path()).expect("tiny model");
    let name = dir
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .expect("temp dir names are UTF-8")
        .to_owned();
    TinyModel { dir, name }
}
