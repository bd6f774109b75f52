//! Start-up: load the model directory, bind the listeners, serve the
//! `--protocol` service (over TLS with `--tls-cert-file`; and, for
//! prefill, the data service, plain) until shut down.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use iris_model::ModelDir;
use iris_process::{listen, ServerTasks};
use iris_proto::data::iris_data_server::IrisDataServer;
use iris_rooms::{RoomLimits, RoomStore};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::EngineConfig;
use crate::constrained::TextEncoder;
use crate::data::DataService;
use crate::inflight::InFlight;
use crate::model::Vocab;
use crate::peers::Peers;
use crate::prefix::PrefixCache;
use crate::protocol::{sglang, tokenspeed, vllm};
use crate::request::Limits;
use crate::service::{Engine, ModelFacts};
use crate::{EngineArgs, Protocol, Role};

/// Largest gRPC message accepted (pixels of several large images).
const MAX_MESSAGE_BYTES: usize = 512 << 20;
/// Most bytes of state a prefill worker holds for uncollected rooms.
const MAX_ROOM_BYTES: u64 = 256 << 20;

/// A started engine.
pub struct RunningEngine {
    /// Where the `--protocol` service listens.
    pub grpc_addr: SocketAddr,
    /// Where the data service listens (prefill role only).
    pub data_addr: Option<SocketAddr>,
    /// Where `/metrics` is served (with `--metrics-port` only).
    pub metrics_addr: Option<SocketAddr>,
    servers: ServerTasks,
    /// Flushed when the servers stop.
    traces: Option<iris_otel::Traces>,
}

impl RunningEngine {
    /// A token that stops the servers when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.servers.shutdown_token()
    }

    /// Waits until the servers stop (after shutdown, or on a server
    /// error), then sends the spans still queued.
    pub async fn wait(self) -> anyhow::Result<()> {
        let stopped = self.servers.wait().await;
        iris_otel::shut_down(self.traces).await;
        stopped
    }
}

/// Validates `args` ([`EngineConfig::from_args`]), loads the model and
/// starts serving.
pub async fn start(args: EngineArgs) -> anyhow::Result<RunningEngine> {
    start_configured(EngineConfig::from_args(args)?).await
}

/// Loads the model and starts serving with a validated `config`.
pub async fn start_configured(config: EngineConfig) -> anyhow::Result<RunningEngine> {
    let token = config.auth_token.clone();
    let data = if config.role == Role::Prefill {
        Some(listen(&config.host, config.bootstrap_port, "--bootstrap-port").await?)
    } else {
        None
    };
    let data_addr = data.as_ref().map(|d| d.local_addr()).transpose()?;
    let engine = Arc::new(build_engine(config, data_addr)?);
    let cfg = &engine.config;
    let mut servers = ServerTasks::default();
    let grpc = listen(&cfg.host, cfg.port, "--port").await?;
    let grpc_addr = grpc.local_addr()?;
    if let Some(data) = data {
        let service = IrisDataServer::new(DataService::new(engine.clone()))
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let router = tonic::transport::Server::builder()
            .layer(iris_process::auth::require(token.clone()))
            .add_service(service);
        servers.spawn(router.serve_with_incoming_shutdown(
            iris_process::nodelay_incoming(data),
            servers.shutdown_token().cancelled_owned(),
        ));
        engine.rooms.spawn_sweeper(Duration::from_secs(1));
    }
    let mut server = iris_process::large_message_server().layer(iris_process::auth::require(token));
    let router = match cfg.protocol {
        Protocol::Tokenspeed => server.add_service(
            tokenspeed::service(engine.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        ),
        Protocol::Vllm => server.add_service(
            vllm::service(engine.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        ),
        Protocol::Sglang => server.add_service(
            sglang::service(engine.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        ),
    };
    if let Some(tls) = &cfg.tls {
        tls.watch(servers.shutdown_token());
    }
    servers.spawn(router.serve_with_incoming_shutdown(
        iris_process::tls::incoming(grpc, cfg.tls.as_ref()),
        servers.shutdown_token().cancelled_owned(),
    ));
    let metrics_addr = match cfg.metrics_port {
        Some(port) => {
            let metrics = listen(&cfg.host, port, "--metrics-port").await?;
            let addr = metrics.local_addr()?;
            servers.spawn(
                axum::serve(metrics, crate::metrics::routes(engine.clone()))
                    .with_graceful_shutdown(servers.shutdown_token().cancelled_owned())
                    .into_future(),
            );
            Some(addr)
        }
        None => None,
    };
    Ok(RunningEngine {
        grpc_addr,
        data_addr,
        metrics_addr,
        servers,
        traces: engine.traces.clone(),
    })
}

fn build_engine(cfg: EngineConfig, data_addr: Option<SocketAddr>) -> anyhow::Result<Engine> {
    let dir = ModelDir::load(&cfg.model_path).with_context(|| {
        format!(
            "cannot load model directory {} (--model-path)",
            cfg.model_path.display()
        )
    })?;
    let tokenizer = dir
        .load_tokenizer()
        .context("cannot load the model's tokenizer")?;
    let ordinary = iris_model::ordinary_token_ids(&tokenizer);
    anyhow::ensure!(
        !ordinary.is_empty(),
        "the tokenizer has no ordinary tokens to generate"
    );
    let vocab_size = dir
        .config
        .vocab_size
        .unwrap_or(0)
        .max(tokenizer.get_vocab_size(true) as u32);
    let bundle = dir
        .tokenizer_bundle()
        .context("cannot bundle the tokenizer files")?;
    let served_model_name = cfg
        .served_model_name
        .clone()
        .unwrap_or_else(|| dir.served_model_name());
    let model_path = if cfg.expose_model_path {
        dir.root.display().to_string()
    } else {
        served_model_name.clone()
    };
    let facts = ModelFacts {
        served_model_name,
        model_path,
        model_type: dir.config.model_type.clone(),
        architectures: dir.config.architectures.clone(),
        eos_token_ids: dir.eos_token_ids(),
        pad_token_id: dir.config.pad_token_id,
        bos_token_id: dir.config.bos_token_id,
        supports_vision: dir.config.supports_vision(),
        dtype: dir.config.torch_dtype.clone().unwrap_or_default(),
        tokenizer_zip: bytes::Bytes::from(bundle.zip),
        tokenizer_sha256: bundle.sha256_hex,
    };
    let limits = Limits {
        max_context_length: dir.config.max_context_length.unwrap_or(32_768),
        vocab_size,
        default_max_new_tokens: cfg.default_max_new_tokens,
    };
    let vocab = Vocab {
        ordinary,
        eos: facts.eos_token_ids.clone(),
        eos_ppm: cfg.eos_ppm,
    };
    let worker_id = cfg
        .worker_id
        .clone()
        .unwrap_or_else(|| format!("{}@{}:{}", cfg.role.as_str(), cfg.host, cfg.port));
    Ok(Engine {
        traces: cfg.otlp.start("iris-engine")?,
        role: cfg.role,
        facts,
        limits,
        vocab,
        item_rules: match cfg.mm_item_checks {
            true => crate::families::ItemRules::of(&dir),
            false => crate::families::ItemRules::unchecked(),
        },
        text: TextEncoder::new(tokenizer),
        inflight: Arc::new(InFlight::default()),
        rooms: Arc::new(RoomStore::new(RoomLimits {
            max_bytes: MAX_ROOM_BYTES,
            ttl: cfg.room_ttl,
        })),
        peers: Peers::new(worker_id.clone(), cfg.auth_token.clone()),
        payloads: crate::payload::Payloads::start(cfg.shm_names.clone(), &cfg.remote)?,
        slots: Arc::new(Semaphore::new(cfg.max_running_requests as usize)),
        prefill_slots: (cfg.prefill_slots > 0)
            .then(|| Arc::new(Semaphore::new(cfg.prefill_slots as usize))),
        worker_id,
        started: Instant::now(),
        started_at: SystemTime::now(),
        data_addr,
        next_room: AtomicI64::new(1),
        prefix: prefix_cache(&cfg),
        items: match cfg.role {
            Role::Decode => None,
            Role::Aggregated | Role::Prefill => crate::recall::item_cache(cfg.mm_item_cache_mb),
        },
        adapters: crate::adapters::Adapters::new(cfg.max_loras),
        config: cfg,
    })
}

/// The prefix cache of a worker that prefills (`--kv-capacity-tokens`;
/// none at 0, or on a decode worker).
fn prefix_cache(cfg: &EngineConfig) -> Option<Arc<PrefixCache>> {
    let capacity = usize::try_from(cfg.kv_capacity_tokens).unwrap_or(usize::MAX);
    match cfg.role {
        Role::Decode => None,
        _ if capacity == 0 => None,
        Role::Aggregated | Role::Prefill => {
            Some(PrefixCache::new(cfg.kv_block_size as usize, capacity))
        }
    }
}
