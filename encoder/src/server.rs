//! Start-up: read the model's vision geometry and the largest item it
//! takes, build the compute backend, the batching loop, the cache and the
//! room store, and serve gRPC, the data server (both behind the optional
//! shared-secret check) and `/metrics`.

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
use crate::flight::Flights;
use crate::metrics::EncoderMetrics;
use crate::receive::Receiving;
use crate::service::{Encoder, EncoderService};
use crate::validate::Geometry;
use crate::{ComputeKind, EncoderArgs};

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

    pub async fn wait(self) -> anyhow::Result<()> {
        self.servers.wait().await
    }
}

/// Starts the encoder with the `--compute` backend named in `args`.
pub async fn start(args: EncoderArgs) -> anyhow::Result<RunningEncoder> {
    start_with(args, None).await
}

/// Starts the encoder; `compute` (if given) replaces the `--compute`
/// backend, e.g. an accelerator backend or a test double.
pub async fn start_with(
    args: EncoderArgs,
    compute: Option<Arc<dyn Compute>>,
) -> anyhow::Result<RunningEncoder> {
    let token = iris_process::auth::AuthToken::load(args.auth_token_file.as_deref())?;
    let encoder = Arc::new(build(args.clone(), compute)?);
    let max_message = max_message_bytes(&args, encoder.geometry);
    tracing::info!(
        max_patches_per_item = encoder.geometry.max_patches,
        max_message_bytes = max_message,
        authentication = token.is_some(),
        "encoder limits"
    );
    let grpc = listen(&args.host, args.port, "--port").await?;
    let data = listen(&args.host, args.bootstrap_port, "--bootstrap-port").await?;
    let metrics = listen(&args.host, args.metrics_port, "--metrics-port").await?;
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
    servers.spawn(main.serve_with_incoming_shutdown(
        iris_process::nodelay_incoming(grpc),
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
    args: &EncoderArgs,
    vision: &iris_model::VisionConfig,
) -> anyhow::Result<Arc<dyn Compute>> {
    Ok(match args.compute {
        ComputeKind::Digest => Arc::new(DigestCompute {
            out_hidden: vision.out_hidden_size as usize,
            merge: vision.spatial_merge_size,
        }),
        ComputeKind::Tower => {
            let tower = iris_tower::Tower::load(&args.model_path).with_context(|| {
                format!(
                    "cannot load the vision tower from {} (use --compute digest to run without weights)",
                    args.model_path.display()
                )
            })?;
            Arc::new(TowerCompute { tower })
        }
    })
}

fn build(args: EncoderArgs, compute: Option<Arc<dyn Compute>>) -> anyhow::Result<Encoder> {
    let dir = ModelDir::load(&args.model_path)
        .with_context(|| format!("cannot load model directory {}", args.model_path.display()))?;
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
        max_patches: max_patches_per_item(&args, &dir, &vision),
    };
    let compute = match compute {
        Some(compute) => compute,
        None => compute_backend(&args, &vision)?,
    };
    let batcher = Batcher::start(
        Arc::new(TowerBackend {
            compute: compute.clone(),
        }),
        BatcherConfig {
            max_batch_cost: args.max_batch_patches.max(1),
            coalesce_window: Duration::from_millis(args.coalesce_window_ms),
            dispatch_width: args.dispatch_width.max(1),
            queue_capacity: args.queue_capacity.max(1),
            // An item still queued after the room TTL is for a request
            // that has been given up on: do not compute it.
            max_queue_wait: Some(Duration::from_secs(args.room_ttl_secs.max(1))),
        },
    );
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        dir.config.model_type.as_str(),
        format!("{vision:?}"),
        format!("{:?}", args.compute),
    )
        .hash(&mut hasher);
    let ttl = Duration::from_secs(args.room_ttl_secs.max(1));
    let worker_id = args
        .worker_id
        .clone()
        .unwrap_or_else(|| format!("encode@{}:{}", args.host, args.port));
    Ok(Encoder {
        geometry,
        compute,
        batcher,
        cache: EmbeddingCache::new(args.embedding_cache_mb.saturating_mul(MIB)),
        flights: Flights::default(),
        rooms: Arc::new(RoomStore::new(RoomLimits {
            max_bytes: args.max_held_mb.saturating_mul(MIB),
            ttl,
        })),
        model_fingerprint: hasher.finish(),
        model_type: dir.config.model_type.clone(),
        served_model_name: args
            .served_model_name
            .clone()
            .unwrap_or_else(|| dir.served_model_name()),
        architectures: dir.config.architectures.clone(),
        metrics: EncoderMetrics::default(),
        receiving: Receiving::start(&args.receive)?,
        worker_id,
        started: Instant::now(),
        args,
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
    args: &EncoderArgs,
    dir: &ModelDir,
    vision: &iris_model::VisionConfig,
) -> u64 {
    let batch = args.max_batch_patches.max(1);
    let model = model_max_patches(dir, vision);
    let wanted = args.max_patches_per_item.or(model).unwrap_or(batch).max(1);
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
fn max_message_bytes(args: &EncoderArgs, geometry: Geometry) -> usize {
    let bytes = match args.max_message_mb {
        Some(mb) => mb.saturating_mul(MIB),
        None => geometry
            .max_patches
            .saturating_mul(u64::from(geometry.patch_dim))
            .saturating_mul(4)
            .saturating_add(MESSAGE_SLACK_BYTES),
    };
    usize::try_from(bytes).unwrap_or(usize::MAX)
}
