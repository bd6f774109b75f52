//! The gateway's runtime configuration: [`Config::from_args`] turns the
//! parsed command line ([`ServeArgs`]) into plain typed settings —
//! durations as [`Duration`], sizes in bytes, the worker topology, media
//! limits, the tensor lanes, discovery, connection limits — and performs
//! every check on the flags, so a bad combination is one clear start-up
//! error naming the flag. Nothing past start-up reads the command line:
//! this is the only module that imports [`crate::args`] (besides the
//! entry points that parse it). Defaults live in the clap definitions
//! alone.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use iris_process::auth::AuthToken;
use iris_process::tls::{ClientFiles, ClientTls, ServerFiles, ServerTls};
use iris_transport::{ArenaConfig, LanePolicy};
use iris_vision::OutputDtype;

use crate::args::{ConnArgs, DiscoveryArgs, InputDtype, MediaArgs, ServeArgs, TransportArgs};
use crate::discovery::pod::{PodRules, Selector};
use crate::discovery::Discovery;
use crate::keys::ApiKeys;
use crate::output::{ReasoningParserFlag, ToolParserFlag};
use crate::router::RouterSettings;
use crate::transport::TransportConfig;
use crate::workers::health::HealthSettings;
use crate::workers::policy::PolicyKind;
use crate::workers::worker::Connect;
use crate::workers::{Role, WorkerUrl};

const MIB: u64 = 1 << 20;
/// Longest duration a seconds flag may ask for (a day).
const MAX_SECS: f64 = 86_400.0;

/// A flag (or a combination of flags) that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(String);

impl ConfigError {
    fn new(message: impl Into<String>) -> ConfigError {
        ConfigError(message.into())
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// `Err(message)` unless `ok`.
fn ensure(ok: bool, message: impl FnOnce() -> String) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError(message()))
    }
}

/// Everything `iris serve` runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: ListenConfig,
    /// The served models, in the order they were configured (at least
    /// one): the flags' one model, or the `[[models]]` of `--config`.
    pub models: Vec<ModelSpec>,
    /// How workers are reached (connect timeout, auth token).
    pub connect: Connect,
    /// The admin API's token (`--admin-token-file`); `None`: open, on a
    /// loopback listener only.
    pub admin_token: Option<AuthToken>,
    /// The tenants of `--api-keys-file`, read and checked; `None`: the
    /// API is open.
    pub api_keys: Option<Arc<ApiKeys>>,
    pub health: HealthSettings,
    pub router: RouterSettings,
    /// Whole-request deadline.
    pub request_timeout: Duration,
    /// Largest request body in bytes.
    pub max_payload_bytes: usize,
    /// Largest decoding constraint in bytes.
    pub max_constraint_bytes: usize,
    /// Where stored `/v1/responses` answers are kept.
    pub responses_store: crate::responses::store::StoreSettings,
    /// Time requests in flight may finish after shutdown begins.
    pub shutdown_grace: Duration,
    pub transport: TransportConfig,
    /// The configuration file, re-read on reload; `None` without `--config`.
    pub file: Option<file::Source>,
    /// Where spans are exported (`--otlp-endpoint`) and how many.
    pub otlp: iris_otel::OtlpArgs,
}

/// One served model: its directory and names, workers, discovery and
/// media limits.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub model: ModelConfig,
    pub topology: Topology,
    pub media: MediaSettings,
    /// Kubernetes service discovery; `None` without `service_discovery`.
    pub discovery: Option<Discovery>,
    /// The settings it was built from in the configuration file (its
    /// table over the file's top-level keys): a reload rebuilds the model
    /// only when they change. `None` for the flags' model.
    pub source: Option<toml::Table>,
}

/// Where and how client connections are served.
#[derive(Debug, Clone)]
pub struct ListenConfig {
    pub host: String,
    pub port: u16,
    /// `/metrics` on a port of its own.
    pub metrics_port: Option<u16>,
    /// Connections open at once, before the open-file limit lowers it.
    pub max_connections: usize,
    /// Time for a request head to arrive.
    pub header_read_timeout: Duration,
    /// Time for a whole request body to arrive.
    pub body_read_timeout: Duration,
    /// Idle time kept after a response; `None`: one request per connection.
    pub keep_alive: Option<Duration>,
    /// Requests per connection (0: unlimited).
    pub max_requests_per_connection: u64,
    /// HTTPS on the HTTP port (`--tls-cert-file` and the rest), read and
    /// checked; `None`: plain HTTP.
    pub tls: Option<ServerTls>,
}

/// A served model's directory, names and prompt settings.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub path: PathBuf,
    /// Other names clients may use, listed by `/v1/models`.
    pub aliases: Vec<String>,
    /// One more name accepted but not listed (the flags' model directory).
    pub hidden_alias: Option<String>,
    pub chat_template: Option<PathBuf>,
    /// `--tool-call-parser`.
    pub tool_call_parser: ToolParserFlag,
    /// `--reasoning-parser`.
    pub reasoning_parser: ReasoningParserFlag,
    /// `None`: the model directory's name.
    pub served_name: Option<String>,
    /// `None`: the model's own context length.
    pub context_length: Option<u32>,
    pub tokenizer_cache_entries: usize,
    /// The LoRA adapters of the model (`[[models.adapters]]`).
    pub adapters: Vec<AdapterConfig>,
    /// `--max-loras-per-worker`.
    pub max_loras_per_worker: usize,
}

/// One LoRA adapter of a model: requests name it `BASE:NAME` (or `NAME`);
/// `path` is the directory its workers load it from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterConfig {
    pub name: String,
    pub path: String,
}

/// The configured workers of each role and how one is chosen.
#[derive(Debug, Clone)]
pub enum Topology {
    /// Aggregated workers.
    Aggregated {
        workers: Vec<WorkerUrl>,
        policy: PolicyKind,
    },
    /// Prefill and decode workers, and with `encode` images go to encode
    /// workers first.
    Disaggregated {
        prefill: Vec<WorkerUrl>,
        prefill_policy: PolicyKind,
        decode: Vec<WorkerUrl>,
        decode_policy: PolicyKind,
        encode: Option<EncodeConfig>,
    },
}

/// The encode role of an EPD gateway.
#[derive(Debug, Clone)]
pub struct EncodeConfig {
    pub workers: Vec<WorkerUrl>,
    pub policy: PolicyKind,
    pub load_factor: f64,
}

/// The image pipeline's settings.
#[derive(Debug, Clone)]
pub struct MediaSettings {
    /// Fetch rules and limits.
    pub fetch: iris_media::MediaConfig,
    /// Element type of the pixel tensors sent to workers.
    pub dtype: OutputDtype,
    pub max_image_pixels: u64,
    pub pixel_cache_bytes: usize,
    /// Prepare the pixel cache's memory at startup ([`iris_vision::prepare_tensor_memory`]).
    pub prepare_pixel_memory: bool,
    pub per_request_image_limit: usize,
    /// Memory for images being decoded and tensors not yet handed over.
    pub inflight_bytes: u64,
    /// Longest wait for room in that memory.
    pub inflight_wait: Duration,
    /// Video inputs (docs/video.md).
    pub video: VideoSettings,
}

/// Limits and defaults of video inputs.
#[derive(Debug, Clone)]
pub struct VideoSettings {
    /// Byte limit of one video file (the other fetch rules are the images').
    pub max_bytes: u64,
    pub per_request_limit: usize,
    pub max_duration_secs: f64,
    /// Most frames sampled from one video.
    pub max_frames: u32,
    /// Largest frame, width × height.
    pub max_pixels: u64,
    /// Sampling rate when neither the request nor the model sets one.
    pub default_fps: f64,
}

impl Config {
    /// Validates `args` into the runtime configuration, reading the
    /// configuration file of `--config` (its models, and gateway-wide
    /// settings the flags leave unset) and the worker auth token file.
    pub fn from_args(args: ServeArgs) -> Result<Config, ConfigError> {
        let Some(path) = args.config.clone() else {
            let model = flag_model(&args)?;
            return Config::gateway(&args, vec![model], None);
        };
        let loaded = file::load(&path, &args)?;
        Config::gateway(&loaded.gateway, loaded.models, Some(loaded.source))
    }

    /// The gateway-wide settings of `args` around `models`.
    fn gateway(
        args: &ServeArgs,
        models: Vec<ModelSpec>,
        file: Option<file::Source>,
    ) -> Result<Config, ConfigError> {
        Ok(Config {
            listen: listen(args, &args.connections)?,
            models,
            connect: Connect {
                timeout: Duration::from_millis(args.connect_timeout_ms.max(1)),
                token: AuthToken::load(args.worker_auth_token_file.as_deref())
                    .map_err(|e| ConfigError::new(format!("--worker-auth-token-file: {e:#}")))?,
                tls: worker_tls(args)?,
            },
            admin_token: admin_token(args)?,
            api_keys: api_keys(args)?,
            health: health(args)?,
            router: RouterSettings {
                max_retries: args.max_retries,
                max_migrations: args.max_migrations,
                circuit_breaker_failures: args.circuit_breaker_failures,
                encode_timeout: Duration::from_millis(args.encode_timeout_ms.max(1)),
                encode_max_in_flight: args.encode_max_in_flight,
                encode_max_in_flight_patches: args.encode_max_in_flight_patches,
                max_running_requests: args.max_running_requests,
                reserved_running_requests: args.reserved_running_requests,
                tenant_queue_size: args.tenant_queue_size,
            },
            request_timeout: Duration::from_secs(args.request_timeout_secs.max(1)),
            max_payload_bytes: args.max_payload_bytes,
            max_constraint_bytes: args.max_constraint_bytes,
            responses_store: crate::responses::store::StoreSettings::from_args(args)
                .map_err(ConfigError::new)?,
            shutdown_grace: Duration::from_secs_f64(non_negative_secs(
                "--shutdown-grace-secs",
                args.shutdown_grace_secs,
            )?),
            transport: transport(&args.transport)?,
            file,
            otlp: otlp(&args.otlp)?,
        })
    }

    /// The configuration of `iris serve --model-path /m FLAGS…` (tests).
    #[cfg(test)]
    pub fn from_flags(flags: &[&str]) -> Result<Config, ConfigError> {
        let argv = ["iris", "--model-path", "/m"].iter().chain(flags);
        Config::from_argv(argv)
    }

    /// The configuration of `iris serve ARGV…` (tests), remembering which
    /// options were given as the binary does.
    #[cfg(test)]
    pub fn from_argv<'a>(
        argv: impl IntoIterator<Item = &'a &'a str>,
    ) -> Result<Config, ConfigError> {
        use clap::{CommandFactory, FromArgMatches, Parser};
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let matches = Cli::command()
            .try_get_matches_from(argv)
            .map_err(|e| ConfigError::new(e.to_string()))?;
        let mut cli =
            Cli::from_arg_matches(&matches).map_err(|e| ConfigError::new(e.to_string()))?;
        cli.serve.given = crate::args::given(&matches);
        Config::from_args(cli.serve)
    }

    /// The first configured model (tests).
    #[cfg(test)]
    pub fn first(&self) -> &ModelSpec {
        &self.models[0]
    }
}

/// The one model the flags describe (`--model-path` and the rest).
fn flag_model(args: &ServeArgs) -> Result<ModelSpec, ConfigError> {
    let path = args.model_path.clone().ok_or_else(|| {
        ConfigError::new(
            "--model-path is required: the model directory (or --config FILE describing the models)",
        )
    })?;
    let hidden_alias = Some(path.display().to_string());
    model_spec(args, path, Vec::new(), hidden_alias)
}

/// The model `args` describe (its per-model options), under its served
/// name (`--served-model-name`, else the directory's) and `aliases`.
fn model_spec(
    args: &ServeArgs,
    path: PathBuf,
    aliases: Vec<String>,
    hidden_alias: Option<String>,
) -> Result<ModelSpec, ConfigError> {
    let discovery = discovery(&args.discovery)?;
    Ok(ModelSpec {
        topology: topology(args, discovery.as_ref())?,
        media: media(&args.media)?,
        discovery,
        model: ModelConfig {
            path,
            aliases,
            hidden_alias,
            chat_template: args.chat_template.clone(),
            tool_call_parser: args.tool_call_parser,
            reasoning_parser: args.reasoning_parser,
            served_name: args.served_model_name.clone(),
            context_length: args.context_length,
            tokenizer_cache_entries: args.tokenizer_cache_entries,
            adapters: Vec::new(),
            max_loras_per_worker: args.max_loras_per_worker as usize,
        },
        source: None,
    })
}

/// A positive, finite number of seconds (at most a day) from `flag`.
fn positive_secs(flag: &str, secs: f64) -> Result<Duration, ConfigError> {
    ensure(secs.is_finite() && secs > 0.0 && secs <= MAX_SECS, || {
        format!("{flag} must be a positive number of seconds (at most a day), not {secs}")
    })?;
    Ok(Duration::from_secs_f64(secs))
}

/// A finite number of seconds, 0 included (at most a day), from `flag`.
fn non_negative_secs(flag: &str, secs: f64) -> Result<f64, ConfigError> {
    ensure(secs.is_finite() && (0.0..=MAX_SECS).contains(&secs), || {
        format!("{flag} must be a number of seconds from 0 to a day, not {secs}")
    })?;
    Ok(secs)
}

fn listen(args: &ServeArgs, conn: &ConnArgs) -> Result<ListenConfig, ConfigError> {
    let keep_alive = match conn.keep_alive_timeout_secs {
        0.0 => None,
        s => Some(positive_secs("--keep-alive-timeout-secs", s)?),
    };
    Ok(ListenConfig {
        host: args.host.clone(),
        port: args.port,
        metrics_port: args.metrics_port,
        max_connections: conn.max_connections,
        header_read_timeout: positive_secs(
            "--header-read-timeout-secs",
            conn.header_read_timeout_secs,
        )?,
        body_read_timeout: positive_secs("--body-read-timeout-secs", conn.body_read_timeout_secs)?,
        keep_alive,
        max_requests_per_connection: conn.max_requests_per_connection,
        tls: https(args)?,
    })
}

/// The HTTP port's TLS, when `--tls-cert-file` and `--tls-key-file` are
/// given (HTTP/1.1 over it).
fn https(args: &ServeArgs) -> Result<Option<ServerTls>, ConfigError> {
    let files = ServerFiles::from_flags(
        args.tls_cert_file.as_deref(),
        args.tls_key_file.as_deref(),
        args.tls_client_ca_file.as_deref(),
    )
    .map_err(ConfigError)?;
    files
        .map(|files| ServerTls::load(&files, &[iris_process::tls::ALPN_HTTP1]))
        .transpose()
        .map_err(ConfigError)
}

/// The TLS `grpcs://` workers are reached with, when
/// `--worker-tls-ca-file` is given.
fn worker_tls(args: &ServeArgs) -> Result<Option<ClientTls>, ConfigError> {
    let files = ClientFiles::from_flags(
        args.worker_tls_ca_file.as_deref(),
        args.worker_tls_cert_file.as_deref(),
        args.worker_tls_key_file.as_deref(),
    )
    .map_err(ConfigError)?;
    files
        .map(|files| ClientTls::load(&files, &[iris_process::tls::ALPN_H2]))
        .transpose()
        .map_err(ConfigError)
}

/// The admin token of `--admin-token-file`; without one the admin routes
/// are open, which only a loopback `--host` allows (they share its address
/// whether on the API or the metrics port).
fn admin_token(args: &ServeArgs) -> Result<Option<AuthToken>, ConfigError> {
    let token = AuthToken::load(args.admin_token_file.as_deref())
        .map_err(|e| ConfigError::new(format!("--admin-token-file: {e:#}")))?;
    ensure(token.is_some() || is_loopback(&args.host), || {
        format!(
            "--host {} is not a loopback address, so the admin API (/admin/reload, /admin/workers on the {} port) needs a token: give --admin-token-file FILE, or bind --host 127.0.0.1",
            args.host,
            if args.metrics_port.is_some() { "--metrics-port" } else { "HTTP" }
        )
    })?;
    Ok(token)
}

/// The trace flags, the sample ratio checked.
fn otlp(args: &iris_otel::OtlpArgs) -> Result<iris_otel::OtlpArgs, ConfigError> {
    iris_otel::check_ratio(args.otlp_sample_ratio).map_err(|e| ConfigError::new(e.to_string()))?;
    Ok(args.clone())
}

/// The tenants of `--api-keys-file`, when given, their limits counted
/// where `--rate-limit-store` says.
fn api_keys(args: &ServeArgs) -> Result<Option<Arc<ApiKeys>>, ConfigError> {
    let store = args.rate_limit_store.trim();
    let shared = match store {
        "memory" => None,
        url => Some(
            crate::keys::shared::Shared::new(url)
                .map_err(|e| ConfigError::new(format!("--rate-limit-store: {e}")))?,
        ),
    };
    let Some(path) = &args.api_keys_file else {
        return match shared {
            None => Ok(None),
            Some(_) => Err(ConfigError::new(
                "--rate-limit-store shares the limits of --api-keys-file's tenants: give --api-keys-file too",
            )),
        };
    };
    let keys =
        ApiKeys::load(path).map_err(|e| ConfigError::new(format!("--api-keys-file: {e}")))?;
    Ok(Some(Arc::new(match shared {
        Some(shared) => keys.with_shared(shared),
        None => keys,
    })))
}

/// Whether `host` names only this machine (`localhost` or a loopback IP).
pub(crate) fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn health(args: &ServeArgs) -> Result<HealthSettings, ConfigError> {
    Ok(HealthSettings {
        interval: positive_secs(
            "--health-check-interval-secs",
            args.health_check_interval_secs,
        )?,
        timeout: positive_secs(
            "--health-check-timeout-secs",
            args.health_check_timeout_secs,
        )?,
        failure_threshold: args.health_failure_threshold,
        success_threshold: args.health_success_threshold,
        rdma_receiver_hold: Duration::from_millis(args.transport.rdma_receiver_hold_ms),
    })
}

/// The worker topology the flags ask for; a role whose pods are
/// discovered may have no configured worker.
fn topology(args: &ServeArgs, discovery: Option<&Discovery>) -> Result<Topology, ConfigError> {
    request_policies(args)?;
    let discovered = |role: Role| discovery.is_some_and(|d| d.watches(role));
    let needed = |urls: Vec<WorkerUrl>, role: Role, missing: &str| {
        ensure(!urls.is_empty() || discovered(role), || missing.to_owned())?;
        Ok::<_, ConfigError>(urls)
    };
    if !args.epd_disaggregation && !args.pd_disaggregation {
        ensure(
            args.prefill.is_empty() && args.decode.is_empty() && args.encode.is_empty(),
            || {
                "--prefill/--decode need --pd-disaggregation (and --encode --epd-disaggregation)"
                    .into()
            },
        )?;
        let workers = needed(
            parse_urls("--worker-urls", &args.worker_urls)?,
            Role::Aggregated,
            "no workers: give --worker-urls (or --service-discovery with --selector), or --pd-disaggregation with --prefill and --decode",
        )?;
        return Ok(Topology::Aggregated {
            workers,
            policy: args.policy,
        });
    }
    ensure(!(args.epd_disaggregation && args.pd_disaggregation), || {
        "--epd-disaggregation and --pd-disaggregation exclude each other".into()
    })?;
    let flag = if args.epd_disaggregation {
        "--epd-disaggregation"
    } else {
        "--pd-disaggregation"
    };
    ensure(args.worker_urls.is_empty(), || {
        format!("--worker-urls is for aggregated mode; with {flag} use --prefill and --decode")
    })?;
    let prefill = needed(
        group_with_ports("--prefill", &args.prefill)?,
        Role::Prefill,
        &format!("{flag} needs at least one --prefill URL (or a --prefill-selector)"),
    )?;
    let decode = needed(
        parse_urls("--decode", &args.decode)?,
        Role::Decode,
        &format!("{flag} needs at least one --decode URL (or a --decode-selector)"),
    )?;
    let encode = if args.epd_disaggregation {
        Some(encode(args, needed)?)
    } else {
        ensure(args.encode.is_empty(), || {
            "--encode needs --epd-disaggregation".into()
        })?;
        None
    };
    Ok(Topology::Disaggregated {
        prefill,
        prefill_policy: args.prefill_policy.unwrap_or(args.policy),
        decode,
        decode_policy: args
            .decode_policy
            .unwrap_or(args.policy.for_role(Role::Decode)),
        encode,
    })
}

/// Each policy flag names a policy its pools can use: `consistent_hashing`
/// keys on one image's content (encoders only), `cache_aware` on the
/// prompt (pools that prefill).
fn request_policies(args: &ServeArgs) -> Result<(), ConfigError> {
    let flags = [
        ("--policy", Some(args.policy), Role::Aggregated),
        ("--prefill-policy", args.prefill_policy, Role::Prefill),
        ("--decode-policy", args.decode_policy, Role::Decode),
        ("--encode-policy", Some(args.encode_policy), Role::Encode),
    ];
    for (flag, kind, role) in flags {
        if let Some(kind) = kind.filter(|k| !k.serves(role)) {
            let why = match kind {
                PolicyKind::ConsistentHashing => {
                    "it places an image by its content hash, for --encode-policy only"
                }
                _ => "it places a prompt by the prefix caches, for --policy and --prefill-policy only (decode and encode are placed by load)",
            };
            return Err(ConfigError(format!("{flag} {}: {why}", kind.as_str())));
        }
    }
    Ok(())
}

/// The encode role of `--epd-disaggregation`.
fn encode(
    args: &ServeArgs,
    needed: impl Fn(Vec<WorkerUrl>, Role, &str) -> Result<Vec<WorkerUrl>, ConfigError>,
) -> Result<EncodeConfig, ConfigError> {
    let factor = args.encode_load_factor;
    ensure(factor.is_finite() && factor >= 1.0, || {
        format!("--encode-load-factor must be a number of at least 1, not {factor}")
    })?;
    Ok(EncodeConfig {
        workers: needed(
            group_with_ports("--encode", &args.encode)?,
            Role::Encode,
            "--epd-disaggregation needs at least one --encode URL (or an --encode-selector)",
        )?,
        policy: args.encode_policy,
        load_factor: factor,
    })
}

fn parse_urls(flag: &str, urls: &[String]) -> Result<Vec<WorkerUrl>, ConfigError> {
    urls.iter()
        .map(|u| WorkerUrl::parse(u).map_err(|e| ConfigError::new(format!("{flag}: {e}"))))
        .collect()
}

/// Groups `URL [PORT] URL [PORT] …` of `flag` into worker URLs: a value
/// that is a bare number is the bootstrap port of the URL before it.
fn group_with_ports(flag: &str, values: &[String]) -> Result<Vec<WorkerUrl>, ConfigError> {
    let mut groups: Vec<Vec<String>> = Vec::new();
    for value in values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()) {
        let is_port = value.chars().all(|c| c.is_ascii_digit());
        match groups.last_mut() {
            Some(group) if is_port && group.len() == 1 => group.push(value.to_owned()),
            _ if is_port => {
                return Err(ConfigError::new(format!(
                    "{flag}: bootstrap port {value} does not follow a worker URL"
                )))
            }
            _ => groups.push(vec![value.to_owned()]),
        }
    }
    groups
        .iter()
        .map(|g| {
            WorkerUrl::parse_with_bootstrap(g).map_err(|e| ConfigError::new(format!("{flag}: {e}")))
        })
        .collect()
}

/// The discovery `--service-discovery` asks for (`None` without it).
pub fn discovery(args: &DiscoveryArgs) -> Result<Option<Discovery>, ConfigError> {
    let flags = [
        (Role::Aggregated, "--selector", &args.selector),
        (Role::Encode, "--encode-selector", &args.encode_selector),
        (Role::Prefill, "--prefill-selector", &args.prefill_selector),
        (Role::Decode, "--decode-selector", &args.decode_selector),
    ];
    if !args.service_discovery {
        if let Some((_, flag, _)) = flags.iter().find(|(_, _, v)| !v.is_empty()) {
            return Err(ConfigError::new(format!(
                "{flag} needs --service-discovery"
            )));
        }
        return Ok(None);
    }
    let mut roles = Vec::new();
    for (role, flag, items) in flags {
        let selector =
            Selector::parse(items).map_err(|e| ConfigError::new(format!("{flag}: {e}")))?;
        if !selector.is_empty() {
            roles.push((role, selector));
        }
    }
    ensure(!roles.is_empty(), || {
        "--service-discovery needs a label selector: --selector, or --encode-selector, --prefill-selector and --decode-selector".into()
    })?;
    let model_label = args
        .service_discovery_model_label
        .as_deref()
        .map(|key| {
            Selector::parse(&[format!("{key}=model")])
                .map(|_| key.trim().to_owned())
                .map_err(|_| {
                    ConfigError::new(format!(
                        "--service-discovery-model-label {key:?} is not a label key"
                    ))
                })
        })
        .transpose()?;
    Ok(Some(Discovery {
        namespace: args.service_discovery_namespace.clone(),
        roles,
        model_label,
        model: None,
        rules: PodRules {
            default_port: args.service_discovery_port,
            leaders_only: args.lws_leaders_only,
        },
    }))
}

fn media(args: &MediaArgs) -> Result<MediaSettings, ConfigError> {
    let fetch = iris_media::MediaConfig {
        allow_private_hosts: args.mm_allow_private_media_hosts,
        allowed_domains: args
            .mm_allowed_media_domains
            .iter()
            .map(|d| d.trim().to_owned())
            .filter(|d| !d.is_empty())
            .collect(),
        allowed_local_media_path: args.allowed_local_media_path.clone(),
        connect_timeout: Duration::from_millis(args.mm_fetch_connect_timeout_ms.max(1)),
        read_timeout: Duration::from_millis(args.mm_fetch_timeout_ms.max(1)),
        max_bytes: args.mm_max_image_bytes as u64,
        max_redirects: args.mm_max_redirects,
        ..iris_media::MediaConfig::default()
    };
    let default_fps = args.mm_video_default_fps;
    ensure(default_fps.is_finite() && default_fps > 0.0, || {
        format!("--mm-video-default-fps must be a positive number, not {default_fps}")
    })?;
    Ok(MediaSettings {
        fetch,
        dtype: match args.mm_encoder_input_dtype {
            InputDtype::Float32 => OutputDtype::F32,
            InputDtype::Bfloat16 => OutputDtype::Bf16,
        },
        max_image_pixels: args.mm_max_image_pixels,
        pixel_cache_bytes: usize::try_from(args.mm_pixel_cache_mb.saturating_mul(MIB))
            .unwrap_or(usize::MAX),
        prepare_pixel_memory: !args.mm_pixel_memory_on_demand,
        per_request_image_limit: args.mm_per_request_image_limit,
        inflight_bytes: args.mm_max_inflight_mb.saturating_mul(MIB),
        inflight_wait: Duration::from_millis(args.mm_inflight_wait_ms),
        video: VideoSettings {
            max_bytes: args.mm_max_video_bytes as u64,
            per_request_limit: args.mm_per_request_video_limit,
            max_duration_secs: positive_secs(
                "--mm-max-video-duration-secs",
                args.mm_max_video_duration_secs,
            )?
            .as_secs_f64(),
            max_frames: args.mm_max_video_frames,
            max_pixels: args.mm_max_video_pixels,
            default_fps,
        },
    })
}

/// The tensor lanes, with the RDMA arena's geometry and TTL checked.
fn transport(args: &TransportArgs) -> Result<TransportConfig, ConfigError> {
    let ttl = positive_secs("--rdma-slot-ttl-secs", args.rdma_slot_ttl_secs)?;
    let mb = |v: usize, flag: &str| {
        v.checked_mul(1 << 20)
            .ok_or_else(|| ConfigError::new(format!("{flag} {v} is too large")))
    };
    let arena = ArenaConfig {
        slot_size: mb(args.rdma_slot_size_mb, "--rdma-slot-size-mb")?,
        slot_count: args.rdma_slot_count,
        max_bytes: mb(args.rdma_max_arena_mb, "--rdma-max-arena-mb")?,
        ttl,
        receiver_hold: Duration::from_millis(args.rdma_receiver_hold_ms),
    };
    arena.validate().map_err(|e| {
        ConfigError::new(format!(
            "RDMA arena (--rdma-slot-size-mb, --rdma-slot-count, --rdma-max-arena-mb, --rdma-slot-ttl-secs, --rdma-receiver-hold-ms): {e}"
        ))
    })?;
    Ok(TransportConfig {
        default: args.multimodal_tensor_transport,
        policy: LanePolicy {
            min_shm_bytes: args.multimodal_shm_min_bytes,
            min_rdma_bytes: args.multimodal_rdma_min_bytes,
        },
        arena,
        nixl_lib: args.nixl_lib.clone(),
        nixl_agent_name: args.nixl_agent_name.clone(),
        rdma_listen_ip: args.rdma_listen_ip.clone(),
        rdma_listen_port: args.rdma_listen_port,
    })
}

pub mod file;
#[cfg(test)]
mod tests;
