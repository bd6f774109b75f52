//! Compiles the wire contract in `proto/` with protox (pure Rust, no system
//! protoc) and generates prost messages and tonic clients and servers.

use std::path::PathBuf;

const PROTOS: [&str; 6] = [
    "common.proto",
    "tokenspeed_scheduler.proto",
    "tokenspeed_encoder.proto",
    "vllm_engine.proto",
    "sglang_scheduler.proto",
    "iris_data.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not when it was compiled: one build script
    // binary serves every checkout sharing a target directory.
    let proto_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    for file in PROTOS {
        println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    }
    let descriptors = protox::compile(PROTOS, [&proto_dir])?;
    let mut config = prost_build::Config::new();
    // Every `bytes` field becomes `bytes::Bytes`: clones share the buffer.
    config.bytes(["."]);
    tonic_prost_build::configure().compile_fds_with_config(descriptors, config)?;
    Ok(())
}
