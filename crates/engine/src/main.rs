//! The `iris-engine` binary: a reference TokenSpeedScheduler worker.
//!
//! Prints one line `iris-engine listening grpc=ADDR [data=ADDR]
//! [metrics=ADDR]` on stdout
//! once its ports are bound (useful with `--port 0`), then serves until
//! SIGINT or SIGTERM. A start-up failure is one line `error: …` on stderr
//! and exit code 1.

#![forbid(unsafe_code)]

use clap::Parser;
use iris_engine::Cli;

fn main() -> std::process::ExitCode {
    iris_process::keep_large_allocations();
    // Before the runtime's threads start: this may set variables.
    if let Err(err) = iris_process::renamed::carry_over(iris_engine::args::RENAMED_ENV) {
        return iris_process::exit(Err(anyhow::Error::msg(err)));
    }
    iris_process::exit(iris_process::block_on(run()))
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    iris_process::init_logging(cli.log.format());
    let running = iris_engine::start(cli.engine).await?;
    let data = running
        .data_addr
        .map(|a| format!(" data={a}"))
        .unwrap_or_default();
    let metrics = running
        .metrics_addr
        .map(|a| format!(" metrics={a}"))
        .unwrap_or_default();
    println!(
        "iris-engine listening grpc={}{data}{metrics}",
        running.grpc_addr
    );
    let shutdown = running.shutdown_token();
    tokio::spawn(async move {
        iris_process::wait_for_signal().await;
        shutdown.cancel();
    });
    running.wait().await
}
