//! Command-line options of `iris serve`; every flag has an `IRIS_…`
//! environment twin (documented in docs/configuration.md). The defaults
//! live here and only here; [`crate::config`] validates these into the
//! runtime configuration, and nothing else past start-up reads them.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::Args;

use iris_transport::Transport;

use crate::output::{ReasoningParserFlag, ToolParserFlag};
use crate::workers::policy::PolicyKind;

/// Environment variables of renamed `iris serve` flags: (old, new). The
/// binary carries the old ones over ([`iris_process::renamed`]).
pub const RENAMED_ENV: &[iris_process::renamed::Renamed] = &[
    ("IRIS_MAX_PAYLOAD_SIZE", "IRIS_MAX_PAYLOAD_BYTES"),
    ("IRIS_RDMA_SLOT_TTL_S", "IRIS_RDMA_SLOT_TTL_SECS"),
];

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", env = "IRIS_HOST")]
    pub host: String,
    /// HTTP port (0 picks a free one).
    #[arg(long, default_value_t = 8000, env = "IRIS_PORT")]
    pub port: u16,
    /// A configuration file (TOML) describing the served models and
    /// gateway-wide settings (docs/configuration.md); SIGHUP or
    /// `POST /admin/reload` re-reads its models.
    #[arg(long, env = "IRIS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Hugging Face model directory: tokenizer, chat template, config
    /// (required unless --config describes the models).
    #[arg(long, env = "IRIS_MODEL_PATH", required_unless_present = "config")]
    pub model_path: Option<PathBuf>,
    /// A Jinja chat template file overriding the model's own.
    #[arg(long, env = "IRIS_CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    /// Tool-call syntax parsed out of answers into tool_calls (auto: from
    /// the model directory and its chat template).
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "IRIS_TOOL_CALL_PARSER"
    )]
    pub tool_call_parser: ToolParserFlag,
    /// Reasoning parsed out of answers into reasoning_content (auto: from
    /// the model directory and its chat template).
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "IRIS_REASONING_PARSER"
    )]
    pub reasoning_parser: ReasoningParserFlag,
    /// Model name clients use (default: the model directory's name).
    #[arg(long, env = "IRIS_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,

    /// Tokens the prompt and the completion share (default: the model's
    /// max_position_embeddings); requests over it get 400.
    #[arg(long, env = "IRIS_CONTEXT_LENGTH", value_parser = clap::value_parser!(u32).range(1..))]
    pub context_length: Option<u32>,

    /// Prompt text segments (between special tokens) whose token ids are
    /// cached (0: no cache); segments up to 256 KiB, 64 MiB in all.
    #[arg(long, default_value_t = 4096, env = "IRIS_TOKENIZER_CACHE_ENTRIES")]
    pub tokenizer_cache_entries: usize,

    /// LoRA adapters the gateway keeps loaded on one worker; loading one
    /// more unloads the least recently used idle one (at least 1).
    #[arg(long, default_value_t = 8, env = "IRIS_MAX_LORAS_PER_WORKER", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_loras_per_worker: u32,

    /// Aggregated workers: grpc://host:port (repeatable, or comma-separated).
    #[arg(long, num_args = 1.., value_delimiter = ',', env = "IRIS_WORKER_URLS")]
    pub worker_urls: Vec<String>,
    /// Route each request to a prefill and a decode worker.
    #[arg(long, env = "IRIS_PD_DISAGGREGATION")]
    pub pd_disaggregation: bool,
    /// A prefill worker: URL [BOOTSTRAP_PORT] (repeatable).
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = clap::ArgAction::Append, value_delimiter = ',', env = "IRIS_PREFILL")]
    pub prefill: Vec<String>,
    /// A decode worker URL (repeatable).
    #[arg(long, num_args = 1, action = clap::ArgAction::Append, value_delimiter = ',', env = "IRIS_DECODE")]
    pub decode: Vec<String>,

    /// Route images to encode workers, the request to a prefill and a
    /// decode worker (needs --encode, --prefill and --decode).
    #[arg(long, env = "IRIS_EPD_DISAGGREGATION")]
    pub epd_disaggregation: bool,
    /// An encode worker: URL [BOOTSTRAP_PORT] (repeatable).
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = clap::ArgAction::Append, value_delimiter = ',', env = "IRIS_ENCODE")]
    pub encode: Vec<String>,
    /// Encode worker choice per image.
    #[arg(
        long,
        value_enum,
        default_value = "consistent_hashing",
        env = "IRIS_ENCODE_POLICY"
    )]
    pub encode_policy: PolicyKind,
    /// consistent_hashing: an encoder takes an image only while its
    /// patches in flight stay under this factor times the mean.
    #[arg(long, default_value_t = 1.25, env = "IRIS_ENCODE_LOAD_FACTOR")]
    pub encode_load_factor: f64,

    /// Milliseconds an encode worker may take to accept an image.
    #[arg(long, default_value_t = 10000, env = "IRIS_ENCODE_TIMEOUT_MS")]
    pub encode_timeout_ms: u64,

    /// Encode calls (image transfers) in flight per encode worker; more
    /// images wait in the gateway (0: unlimited).
    #[arg(long, default_value_t = 8, env = "IRIS_ENCODE_MAX_IN_FLIGHT")]
    pub encode_max_in_flight: usize,

    /// Patches of the images in flight per encode worker (Qwen2-VL: a
    /// 1080p image is 10 764, a 4K one 42 196): the encode policy skips an
    /// encoder an image would take past it, and images wait in the gateway
    /// for room (0: unlimited). Default: two of the encoder's default
    /// batches (--max-batch-patches 65536).
    #[arg(
        long,
        default_value_t = 131_072,
        env = "IRIS_ENCODE_MAX_IN_FLIGHT_PATCHES"
    )]
    pub encode_max_in_flight_patches: u64,

    /// Requests of one model the gateway lets run on its workers at once
    /// (set it to what the workers run together, e.g. the sum of their
    /// --max-running-requests). More wait in one queue per tenant and are
    /// let in by weighted round robin across tenants (`weight` in
    /// --api-keys-file), so one tenant's burst cannot starve another's
    /// traffic. 0: no limit, no queue.
    #[arg(long, default_value_t = 0, env = "IRIS_MAX_RUNNING_REQUESTS")]
    pub max_running_requests: usize,

    /// Of --max-running-requests, the slots no single tenant may take:
    /// kept for the other tenants, so a request arriving during another
    /// tenant's flood starts at once instead of waiting for a flood
    /// request to end.
    #[arg(long, default_value_t = 0, env = "IRIS_RESERVED_RUNNING_REQUESTS")]
    pub reserved_running_requests: usize,

    /// Requests one tenant may have waiting for a model under
    /// --max-running-requests; one more gets a 429.
    #[arg(long, default_value_t = 256, env = "IRIS_TENANT_QUEUE_SIZE")]
    pub tenant_queue_size: usize,

    /// Worker choice for every role unless overridden. auto: cache_aware
    /// once workers publish KV events, power_of_two until then; decode
    /// workers are placed by power_of_two when this is auto or
    /// cache_aware.
    #[arg(long, value_enum, default_value = "auto", env = "IRIS_POLICY")]
    pub policy: PolicyKind,
    /// Worker choice among prefill workers (default: --policy).
    #[arg(long, value_enum, env = "IRIS_PREFILL_POLICY")]
    pub prefill_policy: Option<PolicyKind>,
    /// Worker choice among decode workers (default: --policy, placed by
    /// load: auto and cache_aware are power_of_two here).
    #[arg(long, value_enum, env = "IRIS_DECODE_POLICY")]
    pub decode_policy: Option<PolicyKind>,

    /// Seconds between health checks of each worker.
    #[arg(long, default_value_t = 5.0, env = "IRIS_HEALTH_CHECK_INTERVAL_SECS")]
    pub health_check_interval_secs: f64,
    /// Seconds a health check may take.
    #[arg(long, default_value_t = 3.0, env = "IRIS_HEALTH_CHECK_TIMEOUT_SECS")]
    pub health_check_timeout_secs: f64,
    /// Failed checks in a row that take a worker out of service.
    #[arg(long, default_value_t = 3, env = "IRIS_HEALTH_FAILURE_THRESHOLD")]
    pub health_failure_threshold: u32,
    /// Successful checks in a row that bring it back (the first already
    /// lets one probe request through, whose success brings it back).
    #[arg(long, default_value_t = 2, env = "IRIS_HEALTH_SUCCESS_THRESHOLD")]
    pub health_success_threshold: u32,

    /// Request failures in a row that take a worker out of service until
    /// its health checks pass again or, after one health interval, a probe
    /// request succeeds (0: never).
    #[arg(long, default_value_t = 3, env = "IRIS_CIRCUIT_BREAKER_FAILURES")]
    pub circuit_breaker_failures: u32,

    /// Other workers tried after a worker fails a request before its first
    /// token (not when the request itself is refused). Three: in EPD one
    /// dead worker of each role (encode, prefill, decode) costs no request.
    #[arg(long, default_value_t = 3, env = "IRIS_MAX_RETRIES")]
    pub max_retries: u32,
    /// Moves of a streamed request to another worker when its worker fails
    /// after tokens were streamed: the prompt plus the tokens already sent
    /// go to a new worker and the stream continues (0: never move).
    #[arg(long, default_value_t = 2, env = "IRIS_MAX_MIGRATIONS")]
    pub max_migrations: u32,
    /// Milliseconds to wait for a worker connection.
    #[arg(long, default_value_t = 2000, env = "IRIS_CONNECT_TIMEOUT_MS")]
    pub connect_timeout_ms: u64,
    /// File holding the shared secret the workers require (their
    /// --auth-token-file): sent as `authorization: Bearer <secret>` on
    /// every call to every worker. Unset: no header.
    #[arg(long, env = "IRIS_WORKER_AUTH_TOKEN_FILE")]
    pub worker_auth_token_file: Option<std::path::PathBuf>,
    /// PEM CA certificates that signed the `grpcs://` workers'
    /// certificates (required by grpcs:// URLs; the worker's host must be
    /// a name or address its certificate carries).
    #[arg(long, env = "IRIS_WORKER_TLS_CA_FILE")]
    pub worker_tls_ca_file: Option<std::path::PathBuf>,
    /// PEM certificate chain presented to `grpcs://` workers that ask
    /// for one (mutual TLS; needs --worker-tls-key-file).
    #[arg(long, env = "IRIS_WORKER_TLS_CERT_FILE")]
    pub worker_tls_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of --worker-tls-cert-file.
    #[arg(long, env = "IRIS_WORKER_TLS_KEY_FILE")]
    pub worker_tls_key_file: Option<std::path::PathBuf>,
    /// Whole-request deadline in seconds (504 or an error event past it).
    #[arg(long, default_value_t = 600, env = "IRIS_REQUEST_TIMEOUT_SECS")]
    pub request_timeout_secs: u64,
    /// Seconds requests in flight may finish after SIGTERM/Ctrl-C before
    /// they are ended and their workers aborted.
    #[arg(long, default_value_t = 30.0, env = "IRIS_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: f64,
    /// Largest request body in bytes (413 above it). Formerly
    /// `--max-payload-size` (still accepted).
    #[arg(
        long,
        alias = "max-payload-size",
        default_value_t = 64 << 20,
        env = "IRIS_MAX_PAYLOAD_BYTES"
    )]
    pub max_payload_bytes: usize,
    /// Largest decoding constraint in bytes: a `response_format` JSON
    /// schema (serialised), a `regex`, an `ebnf` grammar or a
    /// `structural_tag` (400 above it).
    #[arg(long, default_value_t = 65536, env = "IRIS_MAX_CONSTRAINT_BYTES")]
    pub max_constraint_bytes: usize,
    /// Where stored `/v1/responses` answers are kept (`store`, the
    /// default, and `previous_response_id`): `memory` (lost when the
    /// gateway stops), `sqlite:PATH` (an SQLite file, kept across
    /// restarts; one gateway per file) or `postgres://USER:PASS@HOST/DB`
    /// (a PostgreSQL database several gateway replicas share).
    #[arg(long, default_value = "memory", env = "IRIS_RESPONSES_STORE")]
    pub responses_store: String,
    /// Most stored responses kept; the oldest go first.
    #[arg(long, default_value_t = 10000, env = "IRIS_RESPONSES_STORE_LIMIT")]
    pub responses_store_limit: usize,
    /// Largest stored response in bytes (its JSON, with its input items
    /// and their images as sent); a larger one is answered, not stored.
    #[arg(long, default_value_t = 16 << 20, env = "IRIS_RESPONSES_STORE_MAX_BYTES")]
    pub responses_store_max_bytes: usize,
    #[command(flatten)]
    pub connections: ConnArgs,
    /// Serve /metrics on this port instead of the HTTP port (/health and
    /// /readiness are answered on both); unset: /metrics on the HTTP port.
    #[arg(long, env = "IRIS_METRICS_PORT")]
    pub metrics_port: Option<u16>,
    /// File holding the admin API's token: every admin request
    /// (`/admin/reload`, `/admin/workers`, served on the --metrics-port
    /// listener, else the HTTP port) must send `Authorization: Bearer
    /// <token>`. Unset: the admin API is open, and --host must be a
    /// loopback address.
    #[arg(long, env = "IRIS_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<std::path::PathBuf>,
    /// File of tenants and the SHA-256 digests of their API keys (TOML,
    /// docs/configuration.md): every /v1 request must then send a key
    /// (`Authorization: Bearer <key>` or `x-api-key`), and each tenant's
    /// models and limits apply. Re-read when it changes. Unset: the API
    /// is open to every client.
    #[arg(long, env = "IRIS_API_KEYS_FILE")]
    pub api_keys_file: Option<std::path::PathBuf>,
    /// Where the tenants' limits (--api-keys-file) are counted: `memory`
    /// (each gateway process on its own) or `redis://HOST:PORT[/DB]` (a
    /// Redis server that gateway replicas share). While Redis is out of
    /// reach each replica holds tenants to its own limits.
    #[arg(long, default_value = "memory", env = "IRIS_RATE_LIMIT_STORE")]
    pub rate_limit_store: String,
    /// PEM certificate chain: the HTTP port serves HTTPS (needs
    /// --tls-key-file; re-read when the files change, open connections
    /// kept). Unset: plain HTTP.
    #[arg(long, env = "IRIS_TLS_CERT_FILE")]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "IRIS_TLS_KEY_FILE")]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// PEM CA certificates: HTTPS clients must present a certificate one
    /// of them signed (needs --tls-cert-file).
    #[arg(long, env = "IRIS_TLS_CLIENT_CA_FILE")]
    pub tls_client_ca_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub media: MediaArgs,
    #[command(flatten)]
    pub discovery: DiscoveryArgs,
    #[command(flatten)]
    pub transport: TransportArgs,

    #[command(flatten)]
    pub log: iris_process::LogArgs,
    #[command(flatten)]
    pub otlp: iris_otel::OtlpArgs,

    /// The ids of the options set on the command line or in the
    /// environment (not by their defaults), filled by [`ServeArgs::from_matches`]:
    /// a configuration file may not set them again.
    #[arg(skip)]
    pub given: BTreeSet<String>,
}

impl ServeArgs {
    /// The options of `matches`, remembering which were given
    /// ([`ServeArgs::given`]).
    pub fn from_matches(matches: &clap::ArgMatches) -> Result<ServeArgs, clap::Error> {
        let mut args = <ServeArgs as clap::FromArgMatches>::from_arg_matches(matches)?;
        args.given = given(matches);
        Ok(args)
    }
}

/// The ids of `matches` set on the command line or in the environment.
pub fn given(matches: &clap::ArgMatches) -> BTreeSet<String> {
    use clap::parser::ValueSource;
    matches
        .ids()
        .filter(|id| {
            matches!(
                matches.value_source(id.as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .map(|id| id.as_str().to_owned())
        .collect()
}

/// Client connections: how many, and how long a client may take.
#[derive(Debug, Clone, Args)]
pub struct ConnArgs {
    /// HTTP connections open at once; past it a new connection gets a 503
    /// and is closed at once (lowered to fit the open-file limit).
    #[arg(long, default_value_t = 32768, env = "IRIS_MAX_CONNECTIONS")]
    pub max_connections: usize,
    /// Seconds a client may take to send a request's headers (on a
    /// kept-alive connection: counted from the previous response).
    #[arg(long, default_value_t = 30.0, env = "IRIS_HEADER_READ_TIMEOUT_SECS")]
    pub header_read_timeout_secs: f64,
    /// Seconds a client may take to send a whole request body (408 past it).
    #[arg(long, default_value_t = 60.0, env = "IRIS_BODY_READ_TIMEOUT_SECS")]
    pub body_read_timeout_secs: f64,
    /// Seconds an idle connection is kept open after a response (0: one
    /// request per connection; at most the header-read timeout).
    #[arg(long, default_value_t = 30.0, env = "IRIS_KEEP_ALIVE_TIMEOUT_SECS")]
    pub keep_alive_timeout_secs: f64,
    /// Requests served per connection; the last one is answered with
    /// `Connection: close` (0: unlimited).
    #[arg(long, default_value_t = 0, env = "IRIS_MAX_REQUESTS_PER_CONNECTION")]
    pub max_requests_per_connection: u64,
}

/// Tensor transport options of `iris serve`.
#[derive(Debug, Clone, Args)]
pub struct TransportArgs {
    /// How pixel tensors reach the workers that take them (encoders in EPD,
    /// aggregated and prefill workers otherwise): inline, shm, rdma or auto
    /// (a worker's `?transport=` URL option or `iris.ai/tensor-transport`
    /// annotation overrides it). A tensor that cannot take its lane goes inline.
    #[arg(long, default_value = "inline", env = "IRIS_MM_TENSOR_TRANSPORT")]
    pub multimodal_tensor_transport: Transport,
    /// Smallest tensor, in bytes, sent through /dev/shm.
    #[arg(
        long,
        default_value_t = iris_transport::lane::DEFAULT_MIN_LANE_BYTES,
        env = "IRIS_MM_SHM_MIN_BYTES"
    )]
    pub multimodal_shm_min_bytes: usize,
    /// Smallest tensor, in bytes, sent through the RDMA arena.
    #[arg(
        long,
        default_value_t = iris_transport::lane::DEFAULT_MIN_LANE_BYTES,
        env = "IRIS_MM_RDMA_MIN_BYTES"
    )]
    pub multimodal_rdma_min_bytes: usize,
    /// libnixl_capi.so to load before NIXL is used (else the dynamic
    /// linker's search path); a missing library sends tensors inline.
    #[arg(long, env = "IRIS_NIXL_LIB")]
    pub nixl_lib: Option<PathBuf>,
    /// The gateway's NIXL agent name (encoders' --nixl-sender-name; the
    /// default is the name TokenSpeed's pullers fetch).
    #[arg(
        long,
        default_value = iris_transport::DEFAULT_SENDER_AGENT_NAME,
        env = "IRIS_NIXL_AGENT_NAME"
    )]
    pub nixl_agent_name: String,
    /// Address encoders fetch the arena's NIXL metadata from.
    #[arg(long, default_value = "127.0.0.1", env = "IRIS_RDMA_LISTEN_IP")]
    pub rdma_listen_ip: String,
    /// Port of the NIXL metadata listener (fixed: it is in every descriptor).
    #[arg(long, default_value_t = 5600, env = "IRIS_RDMA_LISTEN_PORT")]
    pub rdma_listen_port: u16,
    /// Bytes per arena slot, in MiB (a tensor larger than a slot goes inline).
    #[arg(long, default_value_t = 32, env = "IRIS_RDMA_SLOT_SIZE_MB")]
    pub rdma_slot_size_mb: usize,
    /// Arena slots (tensors in flight at once).
    #[arg(long, default_value_t = 8, env = "IRIS_RDMA_SLOT_COUNT")]
    pub rdma_slot_count: usize,
    /// Seconds after which an unacknowledged slot is reaped; must exceed
    /// --rdma-receiver-hold-ms. Formerly `--rdma-slot-ttl-s` (still
    /// accepted).
    #[arg(
        long,
        alias = "rdma-slot-ttl-s",
        default_value_t = 30.0,
        env = "IRIS_RDMA_SLOT_TTL_SECS"
    )]
    pub rdma_slot_ttl_secs: f64,
    /// The encoders' longest hold of a slot in ms: their landing wait plus
    /// four READ timeouts (9000 with iris-encoder's defaults). An encode
    /// worker that reports a longer hold gets no rdma tensors.
    #[arg(long, default_value_t = 9000, env = "IRIS_RDMA_RECEIVER_HOLD_MS")]
    pub rdma_receiver_hold_ms: u64,
    /// Upper bound of the arena (slot size × count), in MiB.
    #[arg(long, default_value_t = iris_transport::arena::DEFAULT_MAX_ARENA_BYTES >> 20, env = "IRIS_RDMA_MAX_ARENA_MB")]
    pub rdma_max_arena_mb: usize,
}

/// Image and video inputs: fetching, limits, preprocessing and the pixel
/// cache.
#[derive(Debug, Clone, Args)]
pub struct MediaArgs {
    /// Pixel cache size in MiB (preprocessed images; 0: no cache).
    #[arg(long, default_value_t = 1024, env = "IRIS_MM_PIXEL_CACHE_MB")]
    pub mm_pixel_cache_mb: u64,
    /// Let the pixel cache's memory grow as the cache fills, and the image
    /// CPU pool's threads warm up on the first images, instead of preparing
    /// both at startup in the background (the default: the process holds
    /// that much from the start, and the first images do not pay for fresh
    /// memory or first use).
    #[arg(long, env = "IRIS_MM_PIXEL_MEMORY_ON_DEMAND")]
    pub mm_pixel_memory_on_demand: bool,
    /// MiB of memory for images being decoded and preprocessed and for the
    /// tensors of requests not yet handed to the workers, reserved from each
    /// image's header before decoding (an image needing more is refused with
    /// 400).
    #[arg(
        long,
        default_value_t = 1536,
        value_parser = clap::value_parser!(u64).range(1..=4_194_304),
        env = "IRIS_MM_MAX_INFLIGHT_MB"
    )]
    pub mm_max_inflight_mb: u64,
    /// Milliseconds an image waits for room in that memory before its
    /// request gets 503 with Retry-After.
    #[arg(long, default_value_t = 10000, env = "IRIS_MM_INFLIGHT_WAIT_MS")]
    pub mm_inflight_wait_ms: u64,
    /// Most images one request may carry.
    #[arg(long, default_value_t = 16, env = "IRIS_MM_PER_REQUEST_IMAGE_LIMIT")]
    pub mm_per_request_image_limit: usize,
    /// Let image URLs reach loopback, private, link-local and other
    /// non-public addresses (off: such URLs get 400). Cloud metadata and
    /// credential endpoints (169.254.169.254, 168.63.129.16,
    /// 169.254.170.2, ...) stay refused even then.
    #[arg(long, env = "IRIS_MM_ALLOW_PRIVATE_MEDIA_HOSTS")]
    pub mm_allow_private_media_hosts: bool,
    /// Only these domains (and their subdomains) may serve image URLs
    /// (comma-separated; empty: any public host).
    #[arg(long, value_delimiter = ',', env = "IRIS_MM_ALLOWED_MEDIA_DOMAINS")]
    pub mm_allowed_media_domains: Vec<String>,
    /// file:// image URLs are read only under this directory (unset: refused).
    #[arg(long, env = "IRIS_ALLOWED_LOCAL_MEDIA_PATH")]
    pub allowed_local_media_path: Option<PathBuf>,
    /// Largest image file in bytes (fetched, inline or local).
    #[arg(long, default_value_t = iris_media::DEFAULT_MAX_BYTES as usize, env = "IRIS_MM_MAX_IMAGE_BYTES")]
    pub mm_max_image_bytes: usize,
    /// Largest decoded image in pixels (checked from the header); for
    /// CLIP-style processors also the size the image is resized to before
    /// the centre crop.
    #[arg(long, default_value_t = 89_478_485, env = "IRIS_MM_MAX_IMAGE_PIXELS")]
    pub mm_max_image_pixels: u64,
    /// Milliseconds to connect to an image host.
    #[arg(
        long,
        default_value_t = iris_media::DEFAULT_CONNECT_TIMEOUT_MS,
        env = "IRIS_MM_FETCH_CONNECT_TIMEOUT_MS"
    )]
    pub mm_fetch_connect_timeout_ms: u64,
    /// Longest gap between two reads of an image host's response, in
    /// milliseconds; the whole fetch (redirects and body included) must end
    /// within the connect timeout plus this.
    #[arg(
        long,
        default_value_t = iris_media::DEFAULT_READ_TIMEOUT_MS,
        env = "IRIS_MM_FETCH_TIMEOUT_MS"
    )]
    pub mm_fetch_timeout_ms: u64,
    /// Redirects followed per image URL (each re-checked).
    #[arg(
        long,
        default_value_t = iris_media::DEFAULT_MAX_REDIRECTS,
        env = "IRIS_MM_MAX_REDIRECTS"
    )]
    pub mm_max_redirects: u32,
    /// Most videos one request may carry.
    #[arg(long, default_value_t = 4, env = "IRIS_MM_PER_REQUEST_VIDEO_LIMIT")]
    pub mm_per_request_video_limit: usize,
    /// Largest video file in bytes (fetched, inline or local).
    #[arg(long, default_value_t = 134_217_728, env = "IRIS_MM_MAX_VIDEO_BYTES")]
    pub mm_max_video_bytes: usize,
    /// Longest video in seconds (from the container's header).
    #[arg(long, default_value_t = 600.0, env = "IRIS_MM_MAX_VIDEO_DURATION_SECS")]
    pub mm_max_video_duration_secs: f64,
    /// Most frames sampled from one video: sampling by fps stops there, and
    /// a request asking for more (`num_frames`) gets 400.
    #[arg(
        long,
        default_value_t = 256,
        value_parser = clap::value_parser!(u32).range(1..),
        env = "IRIS_MM_MAX_VIDEO_FRAMES"
    )]
    pub mm_max_video_frames: u32,
    /// Largest video frame in pixels (width × height, from the header).
    #[arg(long, default_value_t = 8_294_400, env = "IRIS_MM_MAX_VIDEO_PIXELS")]
    pub mm_max_video_pixels: u64,
    /// Frames per second sampled from a video when neither the request
    /// (`mm_processor_kwargs`) nor the model's video processor config says.
    #[arg(long, default_value_t = 2.0, env = "IRIS_MM_VIDEO_DEFAULT_FPS")]
    pub mm_video_default_fps: f64,
    /// Element type of the pixel tensors sent to workers (bfloat16: half
    /// the bytes of float32, what TokenSpeed workers take).
    #[arg(
        long,
        value_enum,
        default_value = "bfloat16",
        env = "IRIS_MM_ENCODER_INPUT_DTYPE"
    )]
    pub mm_encoder_input_dtype: InputDtype,
}

/// Kubernetes service discovery: workers are the Ready pods matching a
/// role's label selector (see docs/deploy-kubernetes.md).
#[derive(Debug, Clone, Args)]
pub struct DiscoveryArgs {
    /// Find workers among the pods of a Kubernetes namespace (the gateway
    /// needs get/list/watch on pods there).
    #[arg(long, env = "IRIS_SERVICE_DISCOVERY")]
    pub service_discovery: bool,
    /// Label key=value selecting aggregated worker pods (repeatable or
    /// comma-separated; a pod must match all).
    #[arg(long, value_delimiter = ',', env = "IRIS_SELECTOR")]
    pub selector: Vec<String>,
    /// Label key=value selecting encode worker pods (repeatable).
    #[arg(long, value_delimiter = ',', env = "IRIS_ENCODE_SELECTOR")]
    pub encode_selector: Vec<String>,
    /// Label key=value selecting prefill worker pods (repeatable).
    #[arg(long, value_delimiter = ',', env = "IRIS_PREFILL_SELECTOR")]
    pub prefill_selector: Vec<String>,
    /// Label key=value selecting decode worker pods (repeatable).
    #[arg(long, value_delimiter = ',', env = "IRIS_DECODE_SELECTOR")]
    pub decode_selector: Vec<String>,
    /// Namespace whose pods are watched (default: the gateway's own).
    #[arg(long, env = "IRIS_SERVICE_DISCOVERY_NAMESPACE")]
    pub service_discovery_namespace: Option<String>,
    /// gRPC port of a discovered pod without an `iris.ai/grpc-port`
    /// annotation.
    #[arg(long, default_value_t = 30000, env = "IRIS_SERVICE_DISCOVERY_PORT")]
    pub service_discovery_port: u16,
    /// Only LeaderWorkerSet leaders: pods labelled
    /// `leaderworkerset.sigs.k8s.io/worker-index=0`.
    #[arg(long, env = "IRIS_LWS_LEADERS_ONLY")]
    pub lws_leaders_only: bool,
    /// A label key a discovered pod must also carry with the name of the
    /// model it serves as value (its served name: a configuration file
    /// model's `id`), so one selector per role finds every model's pods.
    #[arg(long, env = "IRIS_SERVICE_DISCOVERY_MODEL_LABEL")]
    pub service_discovery_model_label: Option<String>,
}

/// `--mm-encoder-input-dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InputDtype {
    #[value(name = "float32")]
    Float32,
    #[value(name = "bfloat16")]
    Bfloat16,
}
