//! The shared test images: `../shared/images` beside the repository root
//! (real photos, GIFs and odd formats that are not committed here).

use std::path::PathBuf;

/// The directory of the shared test images.
pub fn shared_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/images"
    ))
}

/// The path of the shared image `name`.
pub fn shared(name: &str) -> PathBuf {
    shared_dir().join(name)
}
