//! The encoder's gRPC services: `TokenSpeedEncoder.Encode` (check the
//! declared items, read their payloads, serve items sent without their
//! pixels from the embedding cache (recalls), claim rooms, serve cache
//! hits at once, join computations in flight, queue the rest for
//! batching), a
//! health/info-only `TokenSpeedScheduler`, and the `iris.data.v1` server
//! prefill workers collect embeddings from.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iris_batcher::{Answer, BatchError, Batcher, Request as BatchRequest};
use iris_proto::common::{GetTokenizerChunk, GetTokenizerRequest, Modality};
use iris_proto::data::iris_data_server::IrisData;
use iris_proto::data::{FetchEmbeddingResponse, FetchKvStateResponse, FetchRequest};
use iris_proto::encoder::token_speed_encoder_server::TokenSpeedEncoder;
use iris_proto::encoder::{EncodeRequest, EncodeResponse};
use iris_proto::info::{fields, number, text};
use iris_proto::scheduler::token_speed_scheduler_server::TokenSpeedScheduler;
use iris_proto::scheduler::*;
use iris_proto::tensor::{self, DType};
use iris_rooms::RoomStore;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::backend::TowerBackend;
use crate::cache::EmbeddingCache;
use crate::compute::Compute;
use crate::config::EncoderConfig;
use crate::flight::Flights;
use crate::metrics::EncoderMetrics;
use crate::receive::Receiving;
use crate::validate::{self, EncodeItem, Geometry};

/// gRPC metadata entry on an Encode call with the caller's own batch limit,
/// in patches: the call's items are batched in groups within it (an item
/// above it alone), and joined with other calls' items only within it.
pub const MAX_BATCH_PATCHES_HEADER: &str = "iris-max-batch-patches";

/// A finished embedding waiting for its prefill worker.
#[derive(Clone)]
pub struct Embedding {
    pub data: Bytes,
    pub tokens: u32,
    pub content_hash: Bytes,
}

/// Everything the services share.
pub struct Encoder {
    pub config: EncoderConfig,
    pub geometry: Geometry,
    pub compute: Arc<dyn Compute>,
    pub batcher: Batcher<TowerBackend>,
    pub cache: EmbeddingCache,
    /// Computations in flight, joined by repeats of the same content.
    pub flights: Flights,
    pub rooms: Arc<RoomStore<Embedding>>,
    pub model_fingerprint: u64,
    pub model_type: String,
    /// What GetModelInfo reports as served_model_name.
    pub served_model_name: String,
    pub architectures: Vec<String>,
    pub metrics: EncoderMetrics,
    /// Shm and RDMA payloads, and the identity reported for them.
    pub receiving: Receiving,
    pub worker_id: String,
    pub started: Instant,
    /// The span exporter of `--otlp-endpoint` (`None`: no spans).
    pub traces: Option<iris_otel::Traces>,
}

impl Encoder {
    fn out_bytes(&self, item: &EncodeItem) -> u64 {
        (self.compute.tokens(item.input.grid) * self.compute.out_hidden() * 4) as u64
    }

    fn tokens(&self, item: &EncodeItem) -> u32 {
        u32::try_from(self.compute.tokens(item.input.grid)).unwrap_or(u32::MAX)
    }

    /// Claims every item's room (all or none).
    fn claim_rooms(&self, items: &[EncodeItem]) -> Result<(), Status> {
        for (done, item) in items.iter().enumerate() {
            if let Err(e) = self.rooms.begin(item.room, self.out_bytes(item)) {
                for earlier in &items[..done] {
                    self.rooms
                        .fail(earlier.room, format!("encode request refused: {e}"));
                }
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// The cached embedding of `item`'s content; one of another size than
    /// this item's (same hash, other grid) is none.
    fn cached(&self, item: &EncodeItem) -> Option<Bytes> {
        let key = (item.content_hash.clone(), self.model_fingerprint);
        self.cache
            .get(&key)
            .filter(|data| data.len() as u64 == self.out_bytes(item))
    }

    /// Completes rooms whose embeddings are cached; returns the rest.
    fn serve_hits(&self, items: Vec<EncodeItem>) -> Vec<EncodeItem> {
        items
            .into_iter()
            .filter(|item| match self.cached(item) {
                Some(data) => {
                    self.finish(item, data);
                    false
                }
                None => true,
            })
            .collect()
    }

    /// The embeddings of the items sent without their pixels (recalls),
    /// taken from the cache before any room is claimed; NOT_FOUND
    /// ([`iris_transport::RECALL_MISS`]) for the first one not cached, so
    /// that the sender can send its pixels under the same room.
    fn recall(&self, items: &[EncodeItem]) -> Result<Vec<Option<Bytes>>, Status> {
        let mut recalled = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            if !item.recall {
                recalled.push(None);
                continue;
            }
            match self.cached(item) {
                Some(data) => recalled.push(Some(data)),
                None => {
                    self.metrics.recall_miss();
                    return Err(Status::not_found(format!(
                        "item {index}: {}; send its pixels",
                        iris_transport::RECALL_MISS
                    )));
                }
            }
        }
        self.metrics
            .recalled_items(recalled.iter().filter(|r| r.is_some()).count());
        Ok(recalled)
    }

    fn finish(&self, item: &EncodeItem, data: Bytes) {
        let bytes = data.len() as u64;
        let embedding = Embedding {
            data,
            tokens: self.tokens(item),
            content_hash: item.content_hash.clone(),
        };
        if let Err(e) = self.rooms.complete(item.room, embedding, bytes) {
            tracing::warn!(room = item.room, error = %e, "embedding finished for a room no longer waiting");
        }
    }

    /// Queues the misses in groups of at most the batch cap (the caller's
    /// limit, if smaller than `--max-batch-patches`); a task completes (or
    /// fails) each room as soon as its item is done.
    fn queue(self: &Arc<Self>, misses: Vec<EncodeItem>, cap: Option<u64>) -> Result<(), Status> {
        let server_cap = self.config.max_batch_patches;
        let groups = split_by_cost(misses, cap.unwrap_or(server_cap).min(server_cap));
        let requests = groups
            .iter()
            .map(|group| BatchRequest {
                items: group.iter().map(|m| m.input.clone()).collect(),
                max_batch_cost: cap.map(|c| c.min(server_cap)),
            })
            .collect();
        let answers = match self.batcher.enqueue_all(requests) {
            Ok(answers) => answers,
            Err(e) => {
                let status = batch_status(&e);
                for item in groups.iter().flatten() {
                    self.refuse(item, status.message());
                }
                return Err(status);
            }
        };
        for (group, answer) in groups.into_iter().zip(answers) {
            tokio::spawn(self.clone().settle_all(group, answer));
        }
        Ok(())
    }

    /// Settles each item as its answer arrives; items left unanswered
    /// (the batcher stopped) fail.
    async fn settle_all(self: Arc<Self>, misses: Vec<EncodeItem>, mut answer: Answer<Bytes>) {
        let mut open = vec![true; misses.len()];
        while let Some((index, output)) = answer.next().await {
            if let (Some(item), Some(flag)) = (misses.get(index), open.get_mut(index)) {
                *flag = false;
                self.settle(item, output.map_err(|e| e.to_string()));
            }
        }
        for (item, _) in misses.iter().zip(open).filter(|(_, open)| *open) {
            self.settle(item, Err(BatchError::Stopped.to_string()));
        }
    }

    /// Completes an item's room (and caches its embedding) or fails it,
    /// and with it the rooms of the items that joined its flight.
    fn settle(&self, item: &EncodeItem, output: Result<Bytes, String>) {
        let joined = self.flights.land(item);
        match output {
            Ok(data) => {
                self.cache.insert(
                    (item.content_hash.clone(), self.model_fingerprint),
                    data.clone(),
                );
                for done in std::iter::once(item).chain(&joined) {
                    self.finish(done, data.clone());
                }
            }
            Err(e) => {
                for failed in std::iter::once(item).chain(&joined) {
                    self.metrics.failed_item();
                    self.rooms.fail(failed.room, format!("encode failed: {e}"));
                }
            }
        }
    }

    /// Fails a refused item's room and those of the items that joined it
    /// (their Encode was accepted, but the work they waited for is not
    /// going to run).
    fn refuse(&self, item: &EncodeItem, message: &str) {
        for refused in std::iter::once(item).chain(&self.flights.land(item)) {
            self.rooms.fail(refused.room, message.to_owned());
        }
    }

    /// Validates, claims rooms, answers cache hits, joins computations in
    /// flight and queues the rest. `cap` is the caller's own batch limit
    /// in patches, if any.
    fn accept(self: &Arc<Self>, request: &EncodeRequest, cap: Option<u64>) -> Result<(), Status> {
        let items = validate::items(request, self.geometry)?;
        let recalled = self.recall(&items)?;
        self.claim_rooms(&items)?;
        let mut to_compute = Vec::with_capacity(items.len());
        for (item, data) in items.into_iter().zip(recalled) {
            match data {
                Some(data) => self.finish(&item, data),
                None => to_compute.push(item),
            }
        }
        let misses = self.serve_hits(to_compute);
        let (leaders, joined) = self.flights.board(misses);
        self.metrics.joined_items(joined);
        if !leaders.is_empty() {
            self.queue(leaders, cap)?;
        }
        Ok(())
    }

    /// Load as GetLoads reports it: the unit of work is an item (image);
    /// waiting = items queued for a batch, running = items being computed.
    fn loads(&self) -> GetLoadsResponse {
        let as_i32 = |v: u64| i32::try_from(v).unwrap_or(i32::MAX);
        let batch = self.batcher.metrics();
        let cache = self.cache.stats();
        let lookups = cache.hits + cache.misses;
        let cache_hit_rate = match lookups {
            0 => 0.0,
            n => cache.hits as f64 / n as f64,
        };
        let load = SchedulerLoad {
            dp_rank: 0,
            num_running_reqs: as_i32(batch.running_items),
            num_waiting_reqs: as_i32(batch.queued_items),
            num_total_reqs: as_i32(batch.running_items + batch.queued_items),
            cache_hit_rate,
            ..SchedulerLoad::default()
        };
        let aggregate = AggregateMetrics {
            total_running_reqs: load.num_running_reqs,
            total_waiting_reqs: load.num_waiting_reqs,
            total_reqs: load.num_total_reqs,
            ..AggregateMetrics::default()
        };
        GetLoadsResponse {
            timestamp: iris_proto::info::timestamp_now(),
            version: env!("CARGO_PKG_VERSION").into(),
            dp_rank_count: 1,
            loads: vec![load],
            aggregate: Some(aggregate),
        }
    }
}

/// Splits `items` into consecutive groups of at most `cap` patches each (an
/// item above `cap` alone).
fn split_by_cost(items: Vec<EncodeItem>, cap: u64) -> Vec<Vec<EncodeItem>> {
    let mut groups: Vec<Vec<EncodeItem>> = Vec::new();
    let mut cost = 0u64;
    for item in items {
        let patches = item.input.patches();
        match groups.last_mut() {
            Some(group) if cost.saturating_add(patches) <= cap => {
                cost += patches;
                group.push(item);
            }
            _ => {
                cost = patches;
                groups.push(vec![item]);
            }
        }
    }
    groups
}

/// The caller's own batch limit: the positive integer in the
/// [`MAX_BATCH_PATCHES_HEADER`] metadata entry, if present.
fn caller_batch_limit(metadata: &tonic::metadata::MetadataMap) -> Result<Option<u64>, Status> {
    let Some(value) = metadata.get(MAX_BATCH_PATCHES_HEADER) else {
        return Ok(None);
    };
    let parsed = value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .filter(|&patches| patches > 0);
    match parsed {
        Some(patches) => Ok(Some(patches)),
        None => Err(Status::invalid_argument(format!(
            "metadata {MAX_BATCH_PATCHES_HEADER} must be a positive integer (patches per batch), got {value:?}"
        ))),
    }
}

fn batch_status(e: &BatchError) -> Status {
    match e {
        BatchError::QueueFull(_) => Status::resource_exhausted(format!("encoder busy: {e}")),
        BatchError::TooMany { .. } => Status::invalid_argument(format!(
            "the batch limit ({MAX_BATCH_PATCHES_HEADER} or --max-batch-patches) splits this request into too many batches: {e}; raise the limit or send fewer items per call"
        )),
        BatchError::TooCostly { .. } => Status::invalid_argument(format!(
            "an item is larger than this encoder's batches (--max-batch-patches): {e}"
        )),
        BatchError::Stopped => Status::unavailable(e.to_string()),
        other => Status::internal(other.to_string()),
    }
}

#[derive(Clone)]
pub struct EncoderService(pub Arc<Encoder>);

#[tonic::async_trait]
impl TokenSpeedEncoder for EncoderService {
    async fn encode(
        &self,
        request: Request<EncodeRequest>,
    ) -> Result<Response<EncodeResponse>, Status> {
        let encoder = &self.0;
        // Ends when the call is answered (the items are then queued).
        let _span = encoder.traces.as_ref().map(|traces| {
            let attributes = vec![iris_otel::Attribute::new(
                "worker",
                encoder.worker_id.clone(),
            )];
            traces.serve("iris-encoder.encode", request.metadata(), attributes)
        });
        let cap = caller_batch_limit(request.metadata());
        let request = request.into_inner();
        let items = request.mm_inputs.as_ref().map_or(0, |m| m.items.len());
        encoder.metrics.request(items);
        let cap = cap.inspect_err(|_| encoder.metrics.refused())?;
        // Everything the message declares is checked before any payload is
        // read: no shm file is opened, no RDMA READ issued, for a request
        // that would be refused anyway.
        validate::check(&request, encoder.geometry).inspect_err(|_| encoder.metrics.refused())?;
        let request = encoder
            .receiving
            .resolve(request)
            .await
            .inspect_err(|_| encoder.metrics.refused())?;
        encoder
            .accept(&request, cap)
            .inspect_err(|_| encoder.metrics.refused())?;
        Ok(Response::new(EncodeResponse { accepted: true }))
    }
}

#[tonic::async_trait]
impl IrisData for EncoderService {
    async fn fetch_embedding(
        &self,
        request: Request<FetchRequest>,
    ) -> Result<Response<FetchEmbeddingResponse>, Status> {
        let req = request.into_inner();
        let wait = match req.wait_ms {
            0 => self.0.config.fetch_wait,
            ms => Duration::from_millis(u64::from(ms)).min(Duration::from_secs(60)),
        };
        let embedding = self.0.rooms.take(req.room, wait).await?;
        let shape = vec![embedding.tokens, self.0.compute.out_hidden() as u32];
        Ok(Response::new(FetchEmbeddingResponse {
            embedding: Some(tensor::inline(shape, DType::Float32, embedding.data)),
            content_hash: embedding.content_hash,
            num_tokens: embedding.tokens,
        }))
    }

    async fn fetch_kv_state(
        &self,
        _: Request<FetchRequest>,
    ) -> Result<Response<FetchKvStateResponse>, Status> {
        Err(Status::failed_precondition(
            "this is an encode worker: it serves embeddings, not KV state",
        ))
    }
}

type Stream<T> = ReceiverStream<Result<T, Status>>;

#[tonic::async_trait]
impl TokenSpeedScheduler for EncoderService {
    type GenerateStream = Stream<GenerateResponse>;
    type GetTokenizerStream = Stream<GetTokenizerChunk>;
    type SubscribeKvEventsStream = Stream<iris_proto::common::KvEventBatch>;

    async fn generate(
        &self,
        _: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        Err(Status::failed_precondition(
            "this is an encode worker: send Generate to a prefill, decode or aggregated worker",
        ))
    }

    async fn health_check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(HealthCheckResponse {
            healthy: true,
            message: "iris-encoder ready".into(),
        }))
    }

    async fn abort(
        &self,
        request: Request<AbortRequest>,
    ) -> Result<Response<AbortResponse>, Status> {
        let id = request.into_inner().request_id;
        Ok(Response::new(AbortResponse {
            success: false,
            message: format!("encode work cannot be aborted by request id ({id}); its rooms expire if not collected"),
        }))
    }

    async fn get_model_info(
        &self,
        _: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        let e = &self.0;
        Ok(Response::new(GetModelInfoResponse {
            model_path: if e.config.expose_model_path {
                e.config.model_path.display().to_string()
            } else {
                e.served_model_name.clone()
            },
            served_model_name: e.served_model_name.clone(),
            model_type: e.model_type.clone(),
            architectures: e.architectures.clone(),
            supports_vision: true,
            supports_multimodal: true,
            supported_modalities: vec![Modality::Image as i32, Modality::Video as i32],
            multimodal_encoder_dtype: "float32".into(),
            ..GetModelInfoResponse::default()
        }))
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        let e = &self.0;
        let identity = e.receiving.shm_identity().map(text);
        let args = fields(
            [
                ("engine", text("iris-encoder")),
                ("role", text("encode")),
                ("disaggregation_mode", text("encode")),
                ("worker_id", text(&e.worker_id)),
                (
                    "disaggregation_bootstrap_port",
                    number(f64::from(e.config.bootstrap_port)),
                ),
                (
                    iris_transport::NIXL_RECEIVER_FIELD,
                    number(if e.receiving.nixl() { 1.0 } else { 0.0 }),
                ),
                (iris_transport::EMBEDDING_RECALL_FIELD, number(1.0)),
            ]
            .into_iter()
            .chain(identity.map(|id| (iris_transport::SHM_IDENTITY_FIELD, id)))
            .chain(e.receiving.nixl_hold().map(|hold| {
                (
                    iris_transport::NIXL_RECEIVER_HOLD_FIELD,
                    number(hold.as_millis() as f64),
                )
            })),
        );
        let namespace = e.receiving.shm_namespace().map(text);
        let scheduler_info =
            namespace.map(|id| fields([(iris_transport::SHM_NAMESPACE_FIELD, id)]));
        Ok(Response::new(GetServerInfoResponse {
            server_args: Some(args),
            scheduler_info,
            active_requests: i32::try_from(e.batcher.pending()).unwrap_or(i32::MAX),
            uptime_seconds: e.started.elapsed().as_secs_f64(),
            tokenspeed_version: format!("iris-encoder {}", env!("CARGO_PKG_VERSION")),
            ..GetServerInfoResponse::default()
        }))
    }

    async fn get_loads(
        &self,
        _: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        Ok(Response::new(self.0.loads()))
    }

    async fn subscribe_kv_events(
        &self,
        _: Request<iris_proto::common::SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        Err(Status::failed_precondition(
            "encode workers keep no KV cache",
        ))
    }

    async fn get_tokenizer(
        &self,
        _: Request<GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        Err(Status::failed_precondition(
            "encode workers do not serve tokenizers",
        ))
    }
}
