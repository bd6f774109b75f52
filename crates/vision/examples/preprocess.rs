//! Try the debug report now: `cargo run --release -p iris-vision --example
//! preprocess -- MODEL_DIR IMAGE [OUT.npy]` (MODEL_DIR holds a
//! `preprocessor_config.json`). The gateway's `iris preprocess` calls the same
//! `iris_vision::debug::preprocess_report`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let (model_dir, image) = match (args.first(), args.get(1)) {
        (Some(m), Some(i)) => (m, i),
        _ => {
            eprintln!("usage: preprocess MODEL_DIR IMAGE [OUT.npy]");
            return ExitCode::from(2);
        }
    };
    match iris_vision::debug::preprocess_report(model_dir, image, args.get(2).map(PathBuf::as_path))
    {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
