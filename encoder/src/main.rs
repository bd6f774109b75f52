//! The `iris-encoder` binary. Prints `iris-encoder listening grpc=ADDR
//! data=ADDR metrics=ADDR` on stdout once bound, then serves until
//! SIGINT/SIGTERM. A start-up failure is one line `error: …` on stderr
//! and exit code 1.

#![forbid(unsafe_code)]

use clap::Parser;
use iris_encoder::Cli;

fn main() -> std::process::ExitCode {
    // Every inline Encode request is decoded into one fresh buffer of the
    // tensor's size (25 MB in bf16, 50 MB in float32 for a 1080p image):
    // with glibc's defaults that is its own `mmap` (page faults, zeroing)
    // on every request, a third of the receive time (docs/transports.md).
    // Kept blocks are reused by the next request instead.
    iris_process::keep_large_allocations();
    iris_process::exit(iris_process::block_on(run()))
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    iris_process::init_logging(cli.log.format());
    let running = iris_encoder::start(cli.encoder).await?;
    println!(
        "iris-encoder listening grpc={} data={} metrics={}",
        running.grpc_addr, running.data_addr, running.metrics_addr
    );
    let shutdown = running.shutdown_token();
    tokio::spawn(async move {
        iris_process::wait_for_signal().await;
        shutdown.cancel();
    });
    running.wait().await
}
