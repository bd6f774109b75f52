//! Command-line options of `iris-engine` (each with an `IRIS_ENGINE_…`
//! environment twin), shared by the binary and by in-process launchers.
//! The defaults live here and only here; [`crate::config`] validates these
//! into the runtime configuration.

use std::path::PathBuf;

use clap::Args;

pub use crate::config::{Protocol, Role};

/// Environment variables of renamed flags: (old, new). The binary carries
/// the old ones over ([`iris_process::renamed`]).
pub const RENAMED_ENV: &[iris_process::renamed::Renamed] = &[
    (
        "IRIS_ENGINE_PREFILL_US_PER_TOKEN",
        "IRIS_ENGINE_PREFILL_PER_TOKEN_US",
    ),
    (
        "IRIS_ENGINE_DECODE_US_PER_STEP",
        "IRIS_ENGINE_DECODE_PER_STEP_US",
    ),
];

#[derive(Debug, Clone, Args)]
#[command(mut_arg("shm_name_prefixes", |a| a.env("IRIS_ENGINE_SHM_NAME_PREFIX")))]
#[command(mut_arg("nixl_lib", |a| a.env("IRIS_ENGINE_NIXL_LIB")))]
#[command(mut_arg("nixl_agent_name", |a| a.env("IRIS_ENGINE_NIXL_AGENT_NAME")
    .help("This worker's NIXL agent name (default: iris-engine-PID)")))]
#[command(mut_arg("nixl_sender_name", |a| a.env("IRIS_ENGINE_NIXL_SENDER_NAME")))]
#[command(mut_arg("rdma_listen_port", |a| a.env("IRIS_ENGINE_RDMA_LISTEN_PORT")))]
#[command(mut_arg("rdma_landing_slots", |a| a.env("IRIS_ENGINE_RDMA_LANDING_SLOTS")))]
#[command(mut_arg("rdma_landing_slot_size_mb", |a| a.env("IRIS_ENGINE_RDMA_LANDING_SLOT_SIZE_MB")))]
#[command(mut_arg("rdma_landing_wait_ms", |a| a.env("IRIS_ENGINE_RDMA_LANDING_WAIT_MS")))]
#[command(mut_arg("rdma_read_timeout_ms", |a| a.env("IRIS_ENGINE_RDMA_READ_TIMEOUT_MS")))]
#[command(mut_arg("otlp_endpoint", |a| a.env("IRIS_ENGINE_OTLP_ENDPOINT")))]
#[command(mut_arg("otlp_sample_ratio", |a| a.env("IRIS_ENGINE_OTLP_SAMPLE_RATIO")))]
pub struct EngineArgs {
    /// Role of this worker.
    #[arg(
        long,
        value_enum,
        default_value = "aggregated",
        env = "IRIS_ENGINE_ROLE"
    )]
    pub role: Role,
    /// gRPC service spoken on --port: TokenSpeedScheduler, vLLM's
    /// VllmEngine or SGLang's SglangScheduler.
    #[arg(
        long,
        value_enum,
        default_value = "tokenspeed",
        env = "IRIS_ENGINE_PROTOCOL"
    )]
    pub protocol: Protocol,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", env = "IRIS_ENGINE_HOST")]
    pub host: String,
    /// gRPC port of the --protocol service (0 picks a free port).
    #[arg(long, default_value_t = 30000, env = "IRIS_ENGINE_PORT")]
    pub port: u16,
    /// Port of the iris.data.v1 data server (prefill role; 0 picks a free port).
    #[arg(long, default_value_t = iris_proto::DEFAULT_BOOTSTRAP_PORT, env = "IRIS_ENGINE_BOOTSTRAP_PORT")]
    pub bootstrap_port: u16,
    /// Hugging Face model directory (config.json, tokenizer.json, ...).
    #[arg(long, env = "IRIS_ENGINE_MODEL_PATH")]
    pub model_path: PathBuf,
    /// Name reported as served_model_name (default: the directory name).
    #[arg(long, env = "IRIS_ENGINE_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Report the model directory as model_path / tokenizer_path in
    /// GetModelInfo and GetServerInfo (default: the served model name, so
    /// peers do not learn the worker's file system layout).
    #[arg(long, env = "IRIS_ENGINE_EXPOSE_MODEL_PATH")]
    pub expose_model_path: bool,
    /// Requests generating at once; more wait in a queue.
    #[arg(long, default_value_t = 256, env = "IRIS_ENGINE_MAX_RUNNING_REQUESTS")]
    pub max_running_requests: u32,
    /// LoRA adapters loaded at once (SGLang's LoadLoRAAdapter); a load
    /// over it is refused (0: none).
    #[arg(long, default_value_t = 8, env = "IRIS_ENGINE_MAX_LORAS")]
    pub max_loras: u32,
    /// max_new_tokens when a request sets none.
    #[arg(
        long,
        default_value_t = 128,
        env = "IRIS_ENGINE_DEFAULT_MAX_NEW_TOKENS"
    )]
    pub default_max_new_tokens: u32,
    /// Simulated prefill cost per prompt token, in microseconds.
    /// Formerly `--prefill-us-per-token` (still accepted).
    #[arg(
        long = "prefill-per-token-us",
        alias = "prefill-us-per-token",
        default_value_t = 0,
        env = "IRIS_ENGINE_PREFILL_PER_TOKEN_US"
    )]
    pub prefill_us_per_token: u64,
    /// Prefills whose simulated compute runs at once (0: no bound). At 1
    /// prefills queue one behind the other, as on one accelerator, and the
    /// uncached tokens of those waiting count in `waiting_uncached_tokens`.
    #[arg(long, default_value_t = 0, env = "IRIS_ENGINE_PREFILL_SLOTS")]
    pub prefill_slots: u32,
    /// Simulated decode cost per step, in microseconds.
    /// Formerly `--decode-us-per-step` (still accepted).
    #[arg(
        long = "decode-per-step-us",
        alias = "decode-us-per-step",
        default_value_t = 0,
        env = "IRIS_ENGINE_DECODE_PER_STEP_US"
    )]
    pub decode_us_per_step: u64,
    /// Tokens per KV-cache block of the prefix cache.
    #[arg(long, default_value_t = 16, env = "IRIS_ENGINE_KV_BLOCK_SIZE")]
    pub kv_block_size: u32,
    /// Prompt tokens the prefix cache holds (in whole blocks; least recently
    /// used blocks no request holds are evicted). 0: no prefix cache, every
    /// prompt prefilled in full and `cached_tokens` always 0.
    #[arg(long, default_value_t = 0, env = "IRIS_ENGINE_KV_CAPACITY_TOKENS")]
    pub kv_capacity_tokens: u64,
    /// Megabytes of received multimodal items (pixel tensors) kept by
    /// content hash on aggregated and prefill workers, least recently used
    /// evicted: a gateway may then send an item this worker holds by its
    /// hash alone (`embedding_recall` in GetServerInfo). 0: none kept, no
    /// recalls.
    #[arg(long, default_value_t = 1024, env = "IRIS_ENGINE_MM_ITEM_CACHE_MB")]
    pub mm_item_cache_mb: u64,
    /// Take multimodal items without checking them against the model's
    /// family (shapes, model-specific tensors, placeholder runs of the
    /// image token): for tests that send synthetic items.
    #[arg(long, env = "IRIS_ENGINE_NO_MM_ITEM_CHECKS")]
    pub no_mm_item_checks: bool,
    /// Append one JSON line per prefix-cache admission to FILE: its time,
    /// request id, the prompt's block hashes and its cached blocks (for
    /// benchmarks that compare routing with the best placement; needs
    /// --kv-capacity-tokens). Unset: no trace.
    #[arg(long, value_name = "FILE", env = "IRIS_ENGINE_KV_TRACE")]
    pub kv_trace: Option<PathBuf>,
    /// Chance per decode step of emitting EOS, in parts per million
    /// (after min_new_tokens, unless ignore_eos).
    #[arg(long, default_value_t = 20_000, env = "IRIS_ENGINE_EOS_PPM")]
    pub eos_ppm: u32,
    /// How long decode waits for a request's state to appear on the prefill
    /// worker, and prefill for an embedding on an encode worker (ms).
    #[arg(long, default_value_t = 5_000, env = "IRIS_ENGINE_TRANSFER_WAIT_MS")]
    pub transfer_wait_ms: u64,
    /// How long an uncollected state is kept on a prefill worker (s).
    #[arg(long, default_value_t = 60, env = "IRIS_ENGINE_ROOM_TTL_SECS")]
    pub room_ttl_secs: u64,
    /// Identity reported to peers and in logs (default: role@host:port).
    #[arg(long, env = "IRIS_ENGINE_WORKER_ID")]
    pub worker_id: Option<String>,
    /// HTTP port serving Prometheus text on `/metrics` (0 picks one;
    /// unset: no metrics server).
    #[arg(long, env = "IRIS_ENGINE_METRICS_PORT")]
    pub metrics_port: Option<u16>,
    /// File holding a shared secret: every gRPC call (scheduler and data
    /// service) must then carry `authorization: Bearer <secret>`, else
    /// UNAUTHENTICATED; this worker also presents it when it fetches from
    /// other workers' data ports. Unset: no authentication.
    #[arg(long, env = "IRIS_ENGINE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// PEM certificate chain the gRPC port serves TLS with (needs
    /// --tls-key-file; re-read when it changes). Unset: plain gRPC.
    #[arg(long, env = "IRIS_ENGINE_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "IRIS_ENGINE_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates: callers of the gRPC port must present a
    /// certificate one of them signed (mutual TLS; needs --tls-cert-file).
    #[arg(long, env = "IRIS_ENGINE_TLS_CLIENT_CA_FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// `--shm-name-prefix` (env `IRIS_ENGINE_SHM_NAME_PREFIX`).
    #[command(flatten)]
    pub shm: iris_transport::args::ShmNameArgs,
    /// `--nixl-*` and `--rdma-*`: the NIXL receiver that READs pixels sent
    /// over RDMA inside Generate requests (feature `nixl`).
    #[command(flatten)]
    pub nixl: iris_transport::args::NixlReceiverArgs,
    /// `--otlp-endpoint` and `--otlp-sample-ratio`: the engine's spans.
    #[command(flatten)]
    pub otlp: iris_otel::OtlpArgs,
}

/// The `iris-engine` command line: [`EngineArgs`] and the logging switch. The binary
/// parses it; tests read its definition (`clap::CommandFactory`), e.g. to
/// hold docs/configuration.md to it.
#[derive(Debug, clap::Parser)]
#[command(
    name = "iris-engine",
    version,
    about = "Reference prefill/decode worker for Iris (TokenSpeed, vLLM or SGLang over gRPC)"
)]
pub struct Cli {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub log: iris_process::LogArgs,
}
