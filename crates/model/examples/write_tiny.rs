//! Writes the tiny Qwen2-VL-shaped model directory, and optionally its
//! tokenizer bundle:
//! `cargo run -p iris-model --example write_tiny -- DIR [BUNDLE.zip]`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use iris_model::{tiny, ModelDir, ModelError};

fn run(dir: &Path, bundle: Option<&Path>) -> Result<(), ModelError> {
    tiny::write_tiny_qwen2_vl(dir)?;
    println!("wrote {}", dir.display());
    if let Some(out) = bundle {
        let b = ModelDir::load(dir)?.tokenizer_bundle()?;
        std::fs::write(out, &b.zip).map_err(|source| ModelError::Io {
            path: out.to_path_buf(),
            action: "write",
            source,
        })?;
        println!("wrote {} (sha256 {})", out.display(), b.sha256_hex);
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1).map(PathBuf::from);
    let Some(dir) = args.next() else {
        eprintln!("usage: write_tiny DIR [BUNDLE.zip]");
        return ExitCode::from(2);
    };
    match run(&dir, args.next().as_deref()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
