//! The `iris` command line as a library: [`main`] parses an argv and runs
//! the command on its own tokio runtime, returning the exit code. The
//! `iris` binary is `main(std::env::args_os())`; the Python bindings'
//! `iris` console script calls the same function.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::demo::DemoArgs;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use iris_gateway::ServeArgs;

/// `iris …`: the whole command line.
#[derive(Parser)]
#[command(
    name = "iris",
    version,
    about = "Iris: a gateway for multimodal LLMs split into encode, prefill and decode roles"
)]
pub struct Cli {
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
    /// Read an API key from standard input (its first line, surrounding
    /// whitespace dropped) and print its digest as `--api-keys-file` takes
    /// it (`sha256:<hex>`).
    HashKey,
}

#[derive(clap::Args)]
struct TinyModelArgs {
    /// Where the model is written (Qwen2-VL's is kept if already complete).
    dir: PathBuf,
    /// The vision-language family: qwen2_vl (the default, with its vision
    /// tower's weights), llava, llava_next, llava_onevision, gemma3,
    /// idefics3 (SmolVLM), pixtral, internvl, llama4 or phi4_multimodal
    /// (their configs, tokenizer and chat template; no weights).
    #[arg(long, default_value = "qwen2_vl")]
    family: iris_model::tiny::Family,
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

impl Cli {
    /// Parses `argv` (program name first); `iris serve` remembers which
    /// options were given ([`ServeArgs::given`]), so a configuration file
    /// may not set them again.
    pub fn parse_remembering<I, T>(argv: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = Cli::command().try_get_matches_from(argv)?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        if let (Command::Serve(args), Some(("serve", serve))) =
            (&mut cli.command, matches.subcommand())
        {
            args.given = iris_gateway::args::given(serve);
        }
        Ok(cli)
    }
}

/// Parses `argv` (program name first) and runs the command; prints clap's
/// messages, or a failure as one line `error: <what>: <cause>` (no
/// backtrace) to stderr, and returns the exit code (0, 1 on a failure,
/// clap's 2 on a usage error).
pub fn main<I, T>(argv: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let renamed = [iris_gateway::args::RENAMED_ENV, crate::demo::RENAMED_ENV].concat();
    if let Err(err) = iris_process::renamed::carry_over(&renamed) {
        eprintln!("error: {err}");
        return 1;
    }
    let cli = match Cli::parse_remembering(argv) {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return err.exit_code();
        }
    };
    iris_process::exit_code(iris_process::block_on(run(cli)))
}

/// Runs a parsed command line to its end (`iris serve`: until SIGINT or
/// SIGTERM).
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            iris_process::init_logging(args.log.format());
            iris_gateway::init_cpu_pool();
            let running = iris_gateway::start(*args).await?;
            match running.metrics_addr {
                Some(metrics) => {
                    tracing::info!(addr = %running.addr, %metrics, "iris gateway listening")
                }
                None => tracing::info!(addr = %running.addr, "iris gateway listening"),
            }
            let shutdown = running.shutdown_token();
            tokio::spawn(async move {
                iris_process::wait_for_signal().await;
                shutdown.cancel();
            });
            running.wait().await
        }
        Command::Demo(args) => {
            iris_process::init_logging(args.log.format());
            crate::demo::run(args).await
        }
        Command::TinyModel(args) => {
            crate::demo::ensure_family_model(&args.dir, args.family)?;
            println!("tiny {} model in {}", args.family, args.dir.display());
            Ok(())
        }
        Command::HashKey => {
            println!("{}", hash_key(std::io::stdin().lock())?);
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

/// The `--api-keys-file` digest of the key on `input`'s first line.
fn hash_key(mut input: impl std::io::BufRead) -> anyhow::Result<String> {
    let mut line = String::new();
    input.read_line(&mut line)?;
    let key = line.trim();
    anyhow::ensure!(!key.is_empty(), "no key on standard input");
    Ok(iris_gateway::api_key_digest(key.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_key_prints_the_files_digest() {
        let digest = hash_key(&b"test\nignored"[..]).expect("a key");
        assert_eq!(
            digest,
            "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        assert_eq!(hash_key(&b"  test \r\n"[..]).expect("a key"), digest);
        assert!(hash_key(&b"\n"[..]).is_err());
        assert!(hash_key(&b""[..]).is_err());
    }
}
