//! The `iris` command: `iris serve` (the gateway), `iris demo` (every role
//! in one process on a generated tiny model).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use iris_gateway::demo::DemoArgs;
use iris_gateway::ServeArgs;

#[derive(Parser)]
#[command(
    name = "iris",
    version,
    about = "Iris: a gateway for multimodal LLMs split into encode, prefill and decode roles"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible API in front of workers.
    Serve(Box<ServeArgs>),
    /// Run a gateway with reference workers on a tiny generated model.
    Demo(DemoArgs),
    /// Preprocess one image as the gateway would, and report shape, grid,
    /// token count and timing.
    Preprocess(PreprocessArgs),
    /// Write the tiny generated model (the demo's) to a directory, e.g. for
    /// the Kubernetes cpu-demo overlay's workers.
    TinyModel(TinyModelArgs),
}

#[derive(clap::Args)]
struct TinyModelArgs {
    /// Where the model is written (kept if already complete).
    dir: PathBuf,
}

#[derive(clap::Args)]
struct PreprocessArgs {
    /// Model directory whose preprocessor_config.json is used.
    #[arg(long)]
    model_path: PathBuf,
    /// The image file.
    image: PathBuf,
    /// Write pixel_values as a float32 .npy file.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            iris_process::init_logging(args.log_json);
            let running = iris_gateway::start(*args).await?;
            tracing::info!(addr = %running.addr, "iris gateway listening");
            let shutdown = running.shutdown_token();
            tokio::spawn(async move {
                iris_process::wait_for_signal().await;
                shutdown.cancel();
            });
            running.wait().await
        }
        Command::Demo(args) => {
            iris_process::init_logging(false);
            iris_gateway::demo::run(args).await
        }
        Command::TinyModel(args) => {
            iris_gateway::demo::ensure_tiny_model(&args.dir)?;
            println!("tiny model in {}", args.dir.display());
            Ok(())
        }
        Command::Preprocess(args) => {
            let report = iris_vision::debug::preprocess_report(
                &args.model_path,
                &args.image,
                args.out.as_deref(),
            )?;
            println!("{report}");
            Ok(())
        }
    }
}
