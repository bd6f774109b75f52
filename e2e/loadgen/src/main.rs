//! `iris-loadgen`: a load generator for the Iris gateway (OpenAI chat over
//! HTTP/1.1 keep-alive) or a TokenSpeed worker directly (`Generate` over
//! gRPC with the same prompt pre-tokenized), modelled on `vllm bench serve
//! --dataset-name random-mm`: a closed loop at `--concurrency`, or
//! Poisson/gamma arrivals at `--request-rate` capped by
//! `--max-concurrency`. It reports requests/s, goodput under `--slo-*-ms`,
//! p50/p90/p99 of end-to-end latency, time to first byte/token, time per
//! output token and inter-token latency, errors and CPU µs per request of
//! the processes given with `--cpu-pid` and of itself. `--image FILE` or
//! `--image-size WxH` (synthetic random-pixel JPEGs, repeatable with
//! weights) send image chats with `--images-per-request` data: URLs each,
//! distinct or repeated per `--image-repeat-fraction`. `--turns N` runs
//! multi-turn agent conversations instead (see `conversation`). See
//! docs/benchmarks.md.
//!
//! `unsafe` is confined to libjpeg-turbo's encoder and one `sysconf` call.
#![deny(unsafe_code)]

mod args;
mod arrivals;
mod conversation;
mod cpu;
mod grpc;
mod http;
mod image;
mod prompt;
mod report;
mod run;
mod scrape;
mod stats;
mod synth;

use anyhow::Context;
use clap::Parser;

use crate::args::Cli;
use crate::report::Report;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(dir) = &cli.write_tiny_model {
        return iris_model::tiny::write_tiny_qwen2_vl(dir)
            .with_context(|| format!("cannot write the tiny model to {}", dir.display()));
    }
    if let Some((config, target)) = cli.conversation()? {
        return converse(&cli, config, target);
    }
    let config = cli.config()?;
    let runtime = runtime(cli.threads()?)?;
    let measured = runtime.block_on(run::run(&config))?;
    let report = Report::new(&config, measured);
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

/// The --turns run: conversations, then the per-turn report.
fn converse(
    cli: &Cli,
    mut config: conversation::ConversationConfig,
    target: args::Target,
) -> anyhow::Result<()> {
    let args::Target::Http { addr, authority } = target else {
        anyhow::bail!("--turns needs an HTTP target");
    };
    let runtime = runtime(1)?;
    let report = runtime.block_on(async {
        if config.model.is_empty() {
            config.model = http::first_model(addr, &authority, None).await?;
        }
        conversation::run(&config, addr, &authority).await
    })?;
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

/// A single-threaded runtime for one thread (the least overhead), else a
/// multi-threaded one.
fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}
