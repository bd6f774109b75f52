//! The `TokenSpeedScheduler` service: request intake and the info, load,
//! health, abort and tokenizer RPCs.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use iris_proto::common::{GetTokenizerChunk, GetTokenizerRequest, Modality};
use iris_proto::info::{fields, number, text};
use iris_proto::scheduler::token_speed_scheduler_server::TokenSpeedScheduler;
use iris_proto::scheduler::*;
use iris_rooms::RoomStore;
use prost_types::Struct;
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::config::EngineConfig;
use crate::constrained::TextEncoder;
use crate::inflight::InFlight;
use crate::model::{PromptState, Vocab};
use crate::peers::Peers;
use crate::request::{self, Limits};
use crate::{run, Role};

/// Bytes a prefill reserves per stored state.
pub const STATE_BYTES: u64 = 32;
/// Tokenizer bundle chunk size.
const TOKENIZER_CHUNK: usize = 1 << 20;

/// A prefilled state waiting for its decode worker.
pub struct StoredState {
    pub state: PromptState,
    pub request_id: String,
}

/// What GetModelInfo reports, read once from the model directory.
pub struct ModelFacts {
    pub served_model_name: String,
    /// What is reported as model_path and tokenizer_path: the served model
    /// name unless `--expose-model-path` asks for the directory.
    pub model_path: String,
    pub model_type: String,
    pub architectures: Vec<String>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    pub bos_token_id: Option<u32>,
    pub supports_vision: bool,
    pub dtype: String,
    /// The tokenizer files as a zip (shared by every GetTokenizer stream).
    pub tokenizer_zip: bytes::Bytes,
    pub tokenizer_sha256: String,
}

/// Everything a running engine shares between requests.
pub struct Engine {
    pub role: Role,
    pub config: EngineConfig,
    pub facts: ModelFacts,
    pub limits: Limits,
    pub vocab: Vocab,
    /// The tokenizer, for constrained answers.
    pub text: TextEncoder,
    pub inflight: Arc<InFlight>,
    /// Prefill role: request states by KV room.
    pub rooms: Arc<RoomStore<StoredState>>,
    pub peers: Peers,
    /// How pixel payloads are received (shm names, `/dev/shm` id, counts).
    pub payloads: crate::payload::Payloads,
    /// One permit per running request.
    pub slots: Arc<Semaphore>,
    pub worker_id: String,
    pub started: Instant,
    pub started_at: SystemTime,
}

pub struct SchedulerService {
    engine: Arc<Engine>,
}

impl SchedulerService {
    pub fn new(engine: Arc<Engine>) -> Self {
        SchedulerService { engine }
    }
}

type ResponseStream<T> = ReceiverStream<Result<T, Status>>;

#[tonic::async_trait]
impl TokenSpeedScheduler for SchedulerService {
    type GenerateStream = ResponseStream<GenerateResponse>;
    type GetTokenizerStream = ResponseStream<GetTokenizerChunk>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let engine = &self.engine;
        let plan = request::plan(request.into_inner(), engine.role, &engine.limits)?;
        let registration = engine.inflight.register(&plan.request_id).ok_or_else(|| {
            Status::already_exists(format!(
                "request {} is already in flight on this worker",
                plan.request_id
            ))
        })?;
        if let (Role::Prefill, Some(kv)) = (engine.role, &plan.kv) {
            engine
                .rooms
                .begin(kv.room, STATE_BYTES)
                .map_err(Status::from)?;
        }
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(run::run(engine.clone(), plan, registration, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn health_check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(HealthCheckResponse {
            healthy: true,
            message: format!("iris-engine {} ready", self.engine.role.as_str()),
        }))
    }

    async fn abort(
        &self,
        request: Request<AbortRequest>,
    ) -> Result<Response<AbortResponse>, Status> {
        let req = request.into_inner();
        let found = self.engine.inflight.abort(&req.request_id);
        let message = if found {
            format!("request {} aborted", req.request_id)
        } else {
            format!("request {} is not in flight here", req.request_id)
        };
        Ok(Response::new(AbortResponse {
            success: found,
            message,
        }))
    }

    async fn get_model_info(
        &self,
        _: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        Ok(Response::new(model_info(&self.engine)))
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        let engine = &self.engine;
        let since_epoch = engine
            .started_at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Ok(Response::new(GetServerInfoResponse {
            server_args: Some(server_args(engine)),
            // As TokenSpeed workers report it: gateways that find the same
            // value on their side send pixels through /dev/shm.
            scheduler_info: engine
                .payloads
                .namespace()
                .map(|id| fields([(iris_transport::SHM_NAMESPACE_FIELD, text(id))])),
            active_requests: engine.inflight.len() as i32,
            is_paused: false,
            uptime_seconds: engine.started.elapsed().as_secs_f64(),
            max_total_num_tokens: i32::try_from(engine.limits.max_context_length)
                .unwrap_or(i32::MAX),
            tokenspeed_version: format!("iris-engine {}", env!("CARGO_PKG_VERSION")),
            start_time: Some(prost_types::Timestamp {
                seconds: since_epoch.as_secs() as i64,
                nanos: since_epoch.subsec_nanos() as i32,
            }),
        }))
    }

    async fn get_loads(
        &self,
        _: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        Ok(Response::new(loads(&self.engine)))
    }

    async fn get_tokenizer(
        &self,
        _: Request<GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        let zip = self.engine.facts.tokenizer_zip.clone();
        let sha = self.engine.facts.tokenizer_sha256.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let count = zip.len().div_ceil(TOKENIZER_CHUNK).max(1);
            for i in 0..count {
                let end = ((i + 1) * TOKENIZER_CHUNK).min(zip.len());
                let sha256 = if i + 1 == count {
                    sha.clone()
                } else {
                    String::new()
                };
                let chunk = GetTokenizerChunk {
                    data: zip.slice(i * TOKENIZER_CHUNK..end),
                    sha256,
                };
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn model_info(engine: &Engine) -> GetModelInfoResponse {
    let facts = &engine.facts;
    let as_i32 = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
    GetModelInfoResponse {
        model_path: facts.model_path.clone(),
        tokenizer_path: facts.model_path.clone(),
        served_model_name: facts.served_model_name.clone(),
        model_type: facts.model_type.clone(),
        architectures: facts.architectures.clone(),
        max_context_length: as_i32(engine.limits.max_context_length),
        max_req_input_len: as_i32(engine.limits.max_context_length.saturating_sub(1)),
        vocab_size: as_i32(engine.limits.vocab_size),
        eos_token_ids: facts.eos_token_ids.iter().map(|&v| as_i32(v)).collect(),
        pad_token_id: facts.pad_token_id.map(as_i32).unwrap_or(0),
        bos_token_id: facts.bos_token_id.map(as_i32).unwrap_or(0),
        weight_version: "reference".into(),
        default_sampling_params_json: "{}".into(),
        supports_vision: facts.supports_vision,
        supports_multimodal: facts.supports_vision,
        supported_modalities: if facts.supports_vision {
            vec![Modality::Image as i32]
        } else {
            vec![]
        },
        model_dtype: facts.dtype.clone(),
        multimodal_encoder_dtype: if facts.supports_vision {
            "float32".into()
        } else {
            String::new()
        },
    }
}

fn loads(engine: &Engine) -> GetLoadsResponse {
    let l = engine.inflight.loads();
    let as_i32 = |v: i64| i32::try_from(v).unwrap_or(i32::MAX);
    let max_running = engine.config.max_running_requests;
    let utilization = l.running as f64 / f64::from(max_running);
    let load = SchedulerLoad {
        dp_rank: 0,
        num_running_reqs: as_i32(l.running),
        num_waiting_reqs: as_i32(l.waiting),
        num_total_reqs: as_i32(l.running + l.waiting),
        num_used_tokens: 0,
        max_total_num_tokens: as_i32(i64::from(engine.limits.max_context_length)),
        max_running_requests: i32::try_from(max_running).unwrap_or(i32::MAX),
        token_usage: 0.0,
        gen_throughput: 0.0,
        cache_hit_rate: 0.0,
        utilization,
        num_waiting_uncached_tokens: as_i32(l.waiting_tokens),
    };
    let aggregate = AggregateMetrics {
        total_running_reqs: load.num_running_reqs,
        total_waiting_reqs: load.num_waiting_reqs,
        total_reqs: load.num_total_reqs,
        avg_token_usage: 0.0,
        avg_throughput: 0.0,
        avg_utilization: utilization,
    };
    GetLoadsResponse {
        timestamp: iris_proto::info::timestamp_now(),
        version: env!("CARGO_PKG_VERSION").into(),
        dp_rank_count: 1,
        loads: vec![load],
        aggregate: Some(aggregate),
    }
}

fn server_args(engine: &Engine) -> Struct {
    let role = engine.role.as_str();
    let mut pairs = vec![
        ("engine", text("iris-engine")),
        ("role", text(role)),
        ("disaggregation_mode", text(role)),
        ("worker_id", text(&engine.worker_id)),
        ("model_path", text(&engine.facts.model_path)),
        ("served_model_name", text(&engine.facts.served_model_name)),
        ("host", text(&engine.config.host)),
        ("port", number(f64::from(engine.config.port))),
        (
            "max_running_requests",
            number(f64::from(engine.config.max_running_requests)),
        ),
    ];
    if engine.role == Role::Prefill {
        pairs.push((
            "disaggregation_bootstrap_port",
            number(f64::from(engine.config.bootstrap_port)),
        ));
    }
    // What gateways pick the lane of pixels in Generate requests by, as an
    // encoder reports it: whether RDMA payloads can be READ here, and the
    // longest a READ may hold the sender's slot.
    let hold = engine.payloads.nixl_hold();
    pairs.push((
        iris_transport::NIXL_RECEIVER_FIELD,
        number(if hold.is_some() { 1.0 } else { 0.0 }),
    ));
    if let Some(hold) = hold {
        pairs.push((
            iris_transport::NIXL_RECEIVER_HOLD_FIELD,
            number(hold.as_millis() as f64),
        ));
    }
    fields(pairs)
}
