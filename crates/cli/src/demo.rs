//! `iris demo`: writes the tiny model (once, to a cache folder), starts an
//! encode worker (the real vision tower on the CPU), a reference prefill
//! and decode engine and the gateway in EPD mode, all in this process on
//! loopback, prints how to talk to it, and stops everything on Ctrl-C.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use iris_engine::{EngineArgs, Role};
use iris_gateway::ServeArgs;

/// How long the demo's workers wait for an embedding or a KV state: the
/// CPU vision tower needs seconds for a large photo.
const DEMO_TRANSFER_WAIT_MS: u64 = 60_000;

/// Environment variables of renamed `iris demo` flags: (old, new).
pub const RENAMED_ENV: &[iris_process::renamed::Renamed] = &[(
    "IRIS_DEMO_DECODE_US_PER_STEP",
    "IRIS_DEMO_DECODE_PER_STEP_US",
)];

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// HTTP port of the gateway.
    #[arg(long, default_value_t = 8000, env = "IRIS_PORT")]
    pub port: u16,
    /// Where the tiny model is written (default: a cache folder).
    #[arg(long, env = "IRIS_DEMO_MODEL_DIR")]
    pub model_dir: Option<PathBuf>,
    /// Simulated decode time per token, in microseconds, so streaming is visible.
    /// Formerly `--decode-us-per-step` (still accepted).
    #[arg(
        long = "decode-per-step-us",
        alias = "decode-us-per-step",
        default_value_t = 20_000,
        env = "IRIS_DEMO_DECODE_PER_STEP_US"
    )]
    pub decode_us_per_step: u64,
    #[command(flatten)]
    pub log: iris_process::LogArgs,
}

/// Runs the demo until Ctrl-C.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let model_dir = args.model_dir.clone().unwrap_or_else(default_model_dir);
    ensure_tiny_model(&model_dir)?;
    let encoder = iris_encoder::start(encoder_args(&model_dir)).await?;
    let prefill = iris_engine::start(engine_args(&model_dir, Role::Prefill, 0)).await?;
    let decode = iris_engine::start(engine_args(
        &model_dir,
        Role::Decode,
        args.decode_us_per_step,
    ))
    .await?;
    let data = prefill
        .data_addr
        .context("the prefill engine has no data server")?;
    let serve = demo_serve_args(
        &model_dir,
        args.port,
        [
            &[
                encoder.grpc_addr.to_string(),
                encoder.data_addr.port().to_string(),
            ],
            &[prefill.grpc_addr.to_string(), data.port().to_string()],
        ],
        &decode.grpc_addr.to_string(),
    );
    let gateway = iris_gateway::start(serve).await?;
    wait_until_ready(&gateway).await?;
    print_banner(gateway.addr, &gateway.state.models.load().first().name);
    let tokens = [
        gateway.shutdown_token(),
        encoder.shutdown_token(),
        prefill.shutdown_token(),
        decode.shutdown_token(),
    ];
    iris_process::wait_for_signal().await;
    eprintln!("\nstopping…");
    tokens.iter().for_each(|t| t.cancel());
    gateway.wait().await?;
    encoder.wait().await?;
    prefill.wait().await?;
    decode.wait().await
}

/// Waits (bounded) until the health checker has seen every worker.
async fn wait_until_ready(gateway: &iris_gateway::RunningGateway) -> anyhow::Result<()> {
    let pools = gateway.state.models.load().first().router.mode.pools();
    for _ in 0..200 {
        if pools.iter().all(|p| p.healthy_count() > 0) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    anyhow::bail!("the demo workers did not become healthy within 10 s")
}

fn default_model_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("iris").join("tiny-qwen2-vl")
}

/// Writes the tiny model, with its vision tower's weights, unless a
/// complete one is already there.
pub fn ensure_tiny_model(dir: &std::path::Path) -> anyhow::Result<()> {
    let complete = iris_tower::tiny_vl_files().all(|f| dir.join(f).is_file());
    if !complete {
        iris_tower::write_tiny_vl_model(dir).context("cannot write the tiny model")?;
    }
    Ok(())
}

/// Writes `family`'s tiny model: for Qwen2-VL [`ensure_tiny_model`]'s
/// (kept if complete), else the family's directory, always written (it
/// takes milliseconds; [`iris_model::tiny::write_tiny_model`]).
pub fn ensure_family_model(
    dir: &std::path::Path,
    family: iris_model::tiny::Family,
) -> anyhow::Result<()> {
    if family == iris_model::tiny::Family::Qwen2Vl {
        return ensure_tiny_model(dir);
    }
    iris_model::tiny::write_tiny_model(dir, family)
        .with_context(|| format!("cannot write the tiny {family} model"))
}

/// A reference engine of `role` on free loopback ports; every other
/// setting is the command line's default.
fn engine_args(model: &std::path::Path, role: Role, decode_us_per_step: u64) -> EngineArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        engine: EngineArgs,
    }
    let argv = [
        "iris-engine".to_owned(),
        "--model-path".to_owned(),
        model.display().to_string(),
        "--role".to_owned(),
        role.as_str().to_owned(),
        "--port".to_owned(),
        "0".to_owned(),
        "--bootstrap-port".to_owned(),
        "0".to_owned(),
        "--default-max-new-tokens".to_owned(),
        "64".to_owned(),
        "--decode-per-step-us".to_owned(),
        decode_us_per_step.to_string(),
        // The CPU tower takes seconds on a large photo: wait for it.
        "--transfer-wait-ms".to_owned(),
        DEMO_TRANSFER_WAIT_MS.to_string(),
        "--worker-id".to_owned(),
        format!("demo-{}", role.as_str()),
    ];
    Wrapper::parse_from(argv).engine
}

/// The encode worker: the tiny model's vision tower, on free loopback ports.
fn encoder_args(model: &std::path::Path) -> iris_encoder::EncoderArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        encoder: iris_encoder::EncoderArgs,
    }
    let model = model.display().to_string();
    let wait = DEMO_TRANSFER_WAIT_MS.to_string();
    let argv = [
        "iris-encoder",
        "--model-path",
        &model,
        "--compute",
        "tower",
        "--port",
        "0",
        "--bootstrap-port",
        "0",
        "--metrics-port",
        "0",
        "--fetch-wait-ms",
        &wait,
        "--worker-id",
        "demo-encode",
    ];
    Wrapper::parse_from(argv).encoder
}

/// `[encode, prefill]` are `[grpc address, bootstrap port]`.
fn demo_serve_args(
    model: &std::path::Path,
    port: u16,
    [encode, prefill]: [&[String]; 2],
    decode: &str,
) -> ServeArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        serve: ServeArgs,
    }
    let mut argv: Vec<String> = vec![
        "iris".into(),
        "--model-path".into(),
        model.display().to_string(),
    ];
    argv.extend([
        "--port".into(),
        port.to_string(),
        "--epd-disaggregation".into(),
    ]);
    for (flag, worker) in [("--encode", encode), ("--prefill", prefill)] {
        argv.push(flag.into());
        argv.extend(worker.iter().take(1).map(|s| format!("grpc://{s}")));
        argv.extend(worker.iter().skip(1).cloned());
    }
    argv.extend(["--decode".into(), format!("grpc://{decode}")]);
    argv.extend(["--health-check-interval-secs".into(), "1".into()]);
    Wrapper::parse_from(argv).serve
}

fn print_banner(addr: std::net::SocketAddr, model: &str) {
    println!(
        "Iris demo: gateway on http://{addr} (encode worker + prefill and decode reference engines, model {model:?})"
    );
    println!("Try:");
    println!(
        "  curl -N http://{addr}/v1/chat/completions -H 'Content-Type: application/json' \\\n    -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"stream\": true, \"max_tokens\": 32}}'"
    );
    println!("With an image (a data: URL, the body streamed from stdin so any size fits; http(s) URLs work too):");
    println!(
        "  {{ printf '{{\"model\": \"{model}\", \"max_tokens\": 32, \"messages\": [{{\"role\": \"user\", \"content\": [{{\"type\": \"text\", \"text\": \"What is in this picture?\"}}, {{\"type\": \"image_url\", \"image_url\": {{\"url\": \"data:image/jpeg;base64,'\n    base64 -w0 photo.jpg\n    printf '\"}}}}]}}]}}'; }} |\n  curl http://{addr}/v1/chat/completions -H 'Content-Type: application/json' --data-binary @-"
    );
    println!("Press Ctrl-C to stop.");
}
