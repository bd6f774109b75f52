//! Start-up: read the model's vision geometry and the largest item it
//! takes, build the compute backend, the batching loop, the cache and the
//! room store, and serve gRPC (over TLS with `--tls-cert-file`), the data
//! server (plain; both behind the optional shared-secret check) and
//! `/metrics`.

use std::future::IntoFuture;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use iris_batcher::{Batcher, BatcherConfig};
use iris_model::ModelDir;
use iris_process::{listen, ServerTasks};
use iris_proto::data::iris_data_server::IrisDataServer;
use iris_proto::encoder::token_speed_encoder_server::TokenSpeedEncoderServer;
use iris_proto::scheduler::token_speed_scheduler_server::TokenSpeedSchedulerServer;
use iris_rooms::{RoomLimits, RoomStore};
use tokio_util::sync::CancellationToken;

use crate::backend::TowerBackend;
use crate::cache::EmbeddingCache;
use crate::compute::{Compute, DigestCompute, TowerCompute};
use crate::config::{ComputeKind, EncoderConfig};
use crate::flight::Flights;
use crate::metrics::EncoderMetrics;
use crate::receive::Receiving;
use crate::service::{Encoder, EncoderService};
use crate::validate::Geometry;
use crate::EncoderArgs;

/// Largest FetchEmbedding answer sent (embeddings of large images).
const MAX_EMBEDDING_MESSAGE_BYTES: usize = 512 << 20;
const MIB: u64 = 1 << 20;
/// What an Encode message may carry besides one item's pixels (grid,
/// hashes, room, framing).
const MESSAGE_SLACK_BYTES: u64 = MIB;

/// A started encoder.
pub struct RunningEncoder {
    pub grpc_addr: SocketAddr,
    pub data_addr: SocketAddr,
    /// Where `GET /metrics` is served.
    pub metrics_addr: SocketAddr,
    pub encoder: Arc<Encoder>,
    servers: ServerTasks,
}

impl RunningEncoder {
    pub fn shutdown_token(&self) -> CancellationToken {
        self.servers.shutdown_token()
    }

    /// Waits until the servers stop, then sends the spans still queued.
    pub async fn wait(self) -> anyhow::Result<()> {
        let stopped = self.servers.wait().await;
        iris_otel::shut_down(self.encoder.traces.clone()).await;
        stopped
    }
}

/// Starts the encoder with the `--compute` backend named in `args`.
pub async fn start(args: EncoderArgs) -> anyhow::Result<RunningEncoder> {
    start_with(args, None).await
}

/// Validates `args` ([`EncoderConfig::from_args`]) and starts the encoder;
/// `compute` (if given) replaces the `--compute` backend, e.g. an
/// accelerator backend or a test double.
pub async fn start_with(
    args: EncoderArgs,
    compute: Option<Arc<dyn Compute>>,
) -> anyhow::Result<RunningEncoder> {
    start_configured(EncoderConfig::from_args(args)?, compute).await
}

/// Starts the encoder from a validated `config`.
pub async fn start_configured(
    config: EncoderConfig,
    compute: Option<Arc<dyn Compute>>,
) -> anyhow::Result<RunningEncoder> {
    let token = config.auth_token.clone();
    let encoder = Arc::new(build(config, compute)?);
    let cfg = &encoder.config;
    let max_message = max_message_bytes(cfg, encoder.geometry);
    tracing::info!(
        max_patches_per_item = encoder.geometry.max_patches,
        max_message_bytes = max_message,
        authentication = token.is_some(),
        "encoder limits"
    );
    let grpc = listen(&cfg.host, cfg.port, "--port").await?;
    let data = listen(&cfg.host, cfg.bootstrap_port, "--bootstrap-port").await?;
    let metrics = listen(&cfg.host, cfg.metrics_port, "--metrics-port").await?;
    let (grpc_addr, data_addr) = (grpc.local_addr()?, data.local_addr()?);
    let metrics_addr = metrics.local_addr()?;
    let service = EncoderService(encoder.clone());
    let mut servers = ServerTasks::default();
    encoder.rooms.spawn_sweeper(Duration::from_secs(1));
    let encode =
        TokenSpeedEncoderServer::new(service.clone()).max_decoding_message_size(max_message);
    let main = iris_process::large_message_server()
        .layer(iris_process::auth::require(token.clone()))
        .add_service(encode)
        .add_service(TokenSpeedSchedulerServer::new(service.clone()));
    if let Some(tls) = &cfg.tls {
        tls.watch(servers.shutdown_token());
    }
    servers.spawn(main.serve_with_incoming_shutdown(
        iris_process::tls::incoming(grpc, cfg.tls.as_ref()),
        servers.shutdown_token().cancelled_owned(),
    ));
    let data_service =
        IrisDataServer::new(service).max_encoding_message_size(MAX_EMBEDDING_MESSAGE_BYTES);
    let data_router = tonic::transport::Server::builder()
        .layer(iris_process::auth::require(token))
        .add_service(data_service);
    servers.spawn(data_router.serve_with_incoming_shutdown(
        iris_process::nodelay_incoming(data),
        servers.shutdown_token().cancelled_owned(),
    ));
    servers.spawn(
        axum::serve(metrics, crate::metrics::routes(encoder.clone()))
            .with_graceful_shutdown(servers.shutdown_token().cancelled_owned())
            .into_future(),
    );
    Ok(RunningEncoder {
        grpc_addr,
        data_addr,
        metrics_addr,
        encoder,
        servers,
    })
}

fn compute_backend(
    cfg: &EncoderConfig,
    vision: &iris_model::VisionConfig,
) -> anyhow::Result<Arc<dyn Compute>> {
    Ok(match cfg.compute {
        ComputeKind::Digest => Arc::new(DigestCompute {
            out_hidden: vision.out_hidden_size as usize,
            merge: vision.spatial_merge_size,
        }),
        ComputeKind::Tower => {
            let tower = iris_tower::Tower::load(&cfg.model_path).with_context(|| {
                format!(
                    "cannot load the vision tower from {} (use --compute digest to run without weights)",
                    cfg.model_path.display()
                )
            })?;
            Arc::new(TowerCompute { tower })
        }
    })
}

fn build(cfg: EncoderConfig, compute: Option<Arc<dyn Compute>>) -> anyhow::Result<Encoder> {
    let dir = ModelDir::load(&cfg.model_path).with_context(|| {
        format!(
            "cannot load model directory {} (--model-path)",
            cfg.model_path.display()
        )
    })?;
    let vision = dir
        .config
        .vision
        .context("config.json has no vision_config: not a vision-language model")?;
    let geometry = Geometry {
        patch_dim: vision.in_channels
            * vision.temporal_patch_size
            * vision.patch_size
            * vision.patch_size,
        merge: vision.spatial_merge_size,
        max_patches: max_patches_per_item(&cfg, &dir, &vision),
    };
    let compute = match compute {
        Some(compute) => compute,
        None => compute_backend(&cfg, &vision)?,
    };
    let batcher = Batcher::start(
        Arc::new(TowerBackend {
            compute: compute.clone(),
        }),
        BatcherConfig {
            max_batch_cost: cfg.max_batch_patches,
            coalesce_window: cfg.coalesce_window,
            dispatch_width: cfg.dispatch_width,
            queue_capacity: cfg.queue_capacity,
            // An item still queued after the room TTL is for a request
            // that has been given up on: do not compute it.
            max_queue_wait: Some(cfg.room_ttl),
        },
    );
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        dir.config.model_type.as_str(),
        format!("{vision:?}"),
        format!("{:?}", cfg.compute),
    )
        .hash(&mut hasher);
    let worker_id = cfg
        .worker_id
        .clone()
        .unwrap_or_else(|| format!("encode@{}:{}", cfg.host, cfg.port));
    Ok(Encoder {
        traces: cfg.otlp.start("iris-encoder")?,
        geometry,
        compute,
        batcher,
        cache: EmbeddingCache::new(cfg.embedding_cache_bytes),
        flights: Flights::default(),
        rooms: Arc::new(RoomStore::new(RoomLimits {
            max_bytes: cfg.max_held_bytes,
            ttl: cfg.room_ttl,
        })),
        model_fingerprint: hasher.finish(),
        model_type: dir.config.model_type.clone(),
        served_model_name: cfg
            .served_model_name
            .clone()
            .unwrap_or_else(|| dir.served_model_name()),
        architectures: dir.config.architectures.clone(),
        metrics: EncoderMetrics::default(),
        receiving: Receiving::start(&cfg.receive)?,
        worker_id,
        started: Instant::now(),
        config: cfg,
    })
}

/// The largest image the model's preprocessor produces, in patches:
/// `max_pixels / patch_size²` of its `preprocessor_config.json` (Qwen-VL's
/// resize never goes above `max_pixels`; an image is one temporal patch).
/// `None` when the directory has no such file.
fn model_max_patches(dir: &ModelDir, vision: &iris_model::VisionConfig) -> Option<u64> {
    let config = dir.preprocessor_config.as_ref()?;
    let processor = match iris_vision::qwen_from_config(config) {
        Ok(processor) => processor,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read max_pixels from preprocessor_config.json");
            return None;
        }
    };
    let side = u64::from(vision.patch_size.max(1));
    Some(processor.max_pixels / (side * side))
}

/// The per-item patch limit: `--max-patches-per-item` (default: the
/// model's largest image), never above `--max-batch-patches`.
fn max_patches_per_item(
    cfg: &EncoderConfig,
    dir: &ModelDir,
    vision: &iris_model::VisionConfig,
) -> u64 {
    let batch = cfg.max_batch_patches;
    let model = model_max_patches(dir, vision);
    let wanted = cfg.max_patches_per_item.or(model).unwrap_or(batch).max(1);
    if let Some(model) = model.filter(|&m| m > batch) {
        tracing::warn!(
            model_max_patches = model,
            max_batch_patches = batch,
            "images above --max-batch-patches are refused although the model takes up to model_max_patches; raise --max-batch-patches to take them"
        );
    }
    wanted.min(batch)
}

/// `--max-message-mb`, or one item of the largest size as float32 pixels
/// plus [`MESSAGE_SLACK_BYTES`].
fn max_message_bytes(cfg: &EncoderConfig, geometry: Geometry) -> usize {
    let bytes = match cfg.max_message_bytes {
        Some(bytes) => bytes,
        None => geometry
            .max_patches
            .saturating_mul(u64::from(geometry.patch_dim))
            .saturating_mul(4)
            .saturating_add(MESSAGE_SLACK_BYTES),
    };
    usize::try_from(bytes).unwrap_or(usize::MAX)
}
