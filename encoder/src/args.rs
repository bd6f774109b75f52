//! Command-line options of `iris-encoder`, each with an `IRIS_ENCODER_…`
//! environment twin. The defaults live here and only here;
//! [`crate::config`] validates these into the runtime configuration.

use std::path::PathBuf;

use clap::Args;

pub use crate::config::ComputeKind;

#[derive(Debug, Clone, Args)]
#[command(mut_arg("otlp_endpoint", |a| a.env("IRIS_ENCODER_OTLP_ENDPOINT")))]
#[command(mut_arg("otlp_sample_ratio", |a| a.env("IRIS_ENCODER_OTLP_SAMPLE_RATIO")))]
pub struct EncoderArgs {
    /// Vision encoder backend.
    #[arg(
        long,
        value_enum,
        default_value = "tower",
        env = "IRIS_ENCODER_COMPUTE"
    )]
    pub compute: ComputeKind,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", env = "IRIS_ENCODER_HOST")]
    pub host: String,
    /// gRPC port: TokenSpeedEncoder and TokenSpeedScheduler (0: pick one).
    #[arg(long, default_value_t = 30100, env = "IRIS_ENCODER_PORT")]
    pub port: u16,
    /// Port of the iris.data.v1 server prefill workers fetch from (0: pick one).
    #[arg(long, default_value_t = iris_proto::DEFAULT_BOOTSTRAP_PORT, env = "IRIS_ENCODER_BOOTSTRAP_PORT")]
    pub bootstrap_port: u16,
    /// HTTP port serving Prometheus text on `/metrics` (0: pick one).
    /// Default: --port + 1 (30101), or 0 when --port is 0, so encoders
    /// given ports of their own never collide on it.
    #[arg(long, env = "IRIS_ENCODER_METRICS_PORT")]
    pub metrics_port: Option<u16>,
    /// Hugging Face model directory (config.json with a vision_config).
    #[arg(long, env = "IRIS_ENCODER_MODEL_PATH")]
    pub model_path: PathBuf,
    /// Largest batch, in patches. No item may be larger: a larger one is
    /// refused (INVALID_ARGUMENT) before it is read or queued. The default
    /// takes the largest image of Qwen2-VL's and Qwen3-VL's shipped
    /// configurations.
    #[arg(long, default_value_t = 65_536, env = "IRIS_ENCODER_MAX_BATCH_PATCHES")]
    pub max_batch_patches: u64,
    /// Most patches one item may have (default: the model's largest image,
    /// preprocessor_config.json's max_pixels / patch_size²); capped by
    /// --max-batch-patches.
    #[arg(long, env = "IRIS_ENCODER_MAX_PATCHES_PER_ITEM")]
    pub max_patches_per_item: Option<u64>,
    /// Largest Encode message in MiB (default: one item of the largest
    /// size taken, as float32 pixels, plus 1 MiB; bfloat16 takes half).
    #[arg(long, env = "IRIS_ENCODER_MAX_MESSAGE_MB")]
    pub max_message_mb: Option<u64>,
    /// File holding a shared secret: every gRPC call (Encode, scheduler
    /// and data service) must then carry `authorization: Bearer <secret>`,
    /// else UNAUTHENTICATED. Unset: no authentication.
    #[arg(long, env = "IRIS_ENCODER_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// PEM certificate chain the gRPC port serves TLS with (needs
    /// --tls-key-file; re-read when it changes). Unset: plain gRPC.
    #[arg(long, env = "IRIS_ENCODER_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "IRIS_ENCODER_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates: callers of the gRPC port must present a
    /// certificate one of them signed (mutual TLS; needs --tls-cert-file).
    #[arg(long, env = "IRIS_ENCODER_TLS_CLIENT_CA_FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// Tail window for staggered bursts, in ms (0: off).
    #[arg(long, default_value_t = 2, env = "IRIS_ENCODER_COALESCE_WINDOW_MS")]
    pub coalesce_window_ms: u64,
    /// Batches computed at once.
    #[arg(long, default_value_t = 1, env = "IRIS_ENCODER_DISPATCH_WIDTH")]
    pub dispatch_width: usize,
    /// Encode requests that may wait; more are refused (RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = 1024, env = "IRIS_ENCODER_QUEUE_CAPACITY")]
    pub queue_capacity: usize,
    /// Embedding cache size in MiB (0: off).
    #[arg(long, default_value_t = 1024, env = "IRIS_ENCODER_EMBEDDING_CACHE_MB")]
    pub embedding_cache_mb: u64,
    /// Most MiB of embeddings held for prefill workers; Encode pushes back beyond.
    #[arg(long, default_value_t = 4096, env = "IRIS_ENCODER_MAX_HELD_MB")]
    pub max_held_mb: u64,
    /// Seconds an uncollected embedding is kept.
    #[arg(long, default_value_t = 60, env = "IRIS_ENCODER_ROOM_TTL_SECS")]
    pub room_ttl_secs: u64,
    /// Longest wait a prefill's fetch may ask for, in ms (default for 0).
    #[arg(long, default_value_t = 5_000, env = "IRIS_ENCODER_FETCH_WAIT_MS")]
    pub fetch_wait_ms: u64,
    /// Identity reported to peers and in logs (default: encode@host:port).
    #[arg(long, env = "IRIS_ENCODER_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Name reported as served_model_name in GetModelInfo (default: the
    /// model directory's name, as iris-engine). Gateways that group workers
    /// by model (smg) need it equal to the prefill and decode workers'.
    #[arg(long, env = "IRIS_ENCODER_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Report the model directory as model_path in GetModelInfo (default:
    /// the served model name, so peers do not learn the file system
    /// layout).
    #[arg(long, env = "IRIS_ENCODER_EXPOSE_MODEL_PATH")]
    pub expose_model_path: bool,
    /// How pixel tensors are received (shm, RDMA).
    #[command(flatten)]
    pub receive: ReceiveArgs,
    /// `--otlp-endpoint` and `--otlp-sample-ratio`: the encoder's spans.
    #[command(flatten)]
    pub otlp: iris_otel::OtlpArgs,
}

/// The `iris-encoder` command line: [`EncoderArgs`] and the logging switch. The binary
/// parses it; tests read its definition (`clap::CommandFactory`), e.g. to
/// hold docs/configuration.md to it.
#[derive(Debug, clap::Parser)]
#[command(
    name = "iris-encoder",
    version,
    about = "Iris encode worker (TokenSpeedEncoder over gRPC)"
)]
pub struct Cli {
    #[command(flatten)]
    pub encoder: EncoderArgs,
    #[command(flatten)]
    pub log: iris_process::LogArgs,
}

/// Receiver options of `iris-encoder`: the options every tensor receiver
/// shares (`iris_transport::args`), with this binary's environment twins.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("shm_name_prefixes", |a| a.env("IRIS_ENCODER_SHM_NAME_PREFIX")))]
#[command(mut_arg("nixl_lib", |a| a.env("IRIS_ENCODER_NIXL_LIB")))]
#[command(mut_arg("nixl_agent_name", |a| a.env("IRIS_ENCODER_NIXL_AGENT_NAME")
    .help("This worker's NIXL agent name (default: iris-encoder-PID)")))]
#[command(mut_arg("nixl_sender_name", |a| a.env("IRIS_ENCODER_NIXL_SENDER_NAME")))]
#[command(mut_arg("rdma_listen_port", |a| a.env("IRIS_ENCODER_RDMA_LISTEN_PORT")))]
#[command(mut_arg("rdma_landing_slots", |a| a.env("IRIS_ENCODER_RDMA_LANDING_SLOTS")))]
#[command(mut_arg("rdma_landing_slot_size_mb", |a| a.env("IRIS_ENCODER_RDMA_LANDING_SLOT_SIZE_MB")))]
#[command(mut_arg("rdma_landing_wait_ms", |a| a.env("IRIS_ENCODER_RDMA_LANDING_WAIT_MS")))]
#[command(mut_arg("rdma_read_timeout_ms", |a| a.env("IRIS_ENCODER_RDMA_READ_TIMEOUT_MS")))]
pub struct ReceiveArgs {
    /// `--nixl-*` and `--rdma-*`: the NIXL receiver.
    #[command(flatten)]
    pub nixl: iris_transport::args::NixlReceiverArgs,
    /// `--shm-name-prefix` (env `IRIS_ENCODER_SHM_NAME_PREFIX`).
    #[command(flatten)]
    pub shm: iris_transport::args::ShmNameArgs,
}

impl Default for ReceiveArgs {
    /// The command line's defaults (with any `IRIS_ENCODER_*` twins set).
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            receive: ReceiveArgs,
        }
        <Defaults as clap::Parser>::parse_from(["iris-encoder"]).receive
    }
}
