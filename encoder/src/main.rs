//! The `iris-encoder` binary. Prints `iris-encoder listening grpc=ADDR
//! data=ADDR metrics=ADDR` on stdout once bound, then serves until
//! SIGINT/SIGTERM. A start-up failure is one line `error: …` on stderr
//! and exit code 1.

#![forbid(unsafe_code)]

use clap::Parser;
use iris_encoder::Cli;

fn main() -> std::process::ExitCode {
    // No `iris_process::keep_large_allocations` here. It was blamed for the
    // encoder growing to 19 GB under a flood of 50 MB Encode calls; the
    // cause turned out to be cached content hashes that were slices of the
    // request bodies (see `validate::items`), so the setting may be worth
    // measuring again.
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
