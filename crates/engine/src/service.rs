//! The engine every protocol adapter serves: its shared state, request
//! submission, abort, and the facts the info, load and tokenizer RPCs of
//! every protocol report (each adapter puts them in its own messages).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use iris_proto::common::GetTokenizerChunk;
use iris_proto::info::{fields, number, text};
use iris_rooms::RoomStore;
use prost_types::Struct;
use tokio::sync::{mpsc, Semaphore};
use tonic::Status;

use crate::config::EngineConfig;
use crate::constrained::TextEncoder;
use crate::inflight::InFlight;
use crate::model::{PromptState, Vocab};
use crate::output::Event;
use crate::peers::Peers;
use crate::request::{Limits, Plan};
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
    /// What the model's multimodal items must look like.
    pub item_rules: crate::families::ItemRules,
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
    /// One permit per prefill computing (`--prefill-slots`; `None`: no bound).
    pub prefill_slots: Option<Arc<Semaphore>>,
    pub worker_id: String,
    pub started: Instant,
    pub started_at: SystemTime,
    /// Where the data service listens (prefill role).
    pub data_addr: Option<SocketAddr>,
    /// The next KV room this worker picks itself (vLLM prefill).
    pub next_room: AtomicI64,
    /// The prefix KV cache (`--kv-capacity-tokens`; prefill and
    /// aggregated workers).
    pub prefix: Option<Arc<crate::prefix::PrefixCache>>,
    /// Received items by content hash, for recalls (`--mm-item-cache-mb`;
    /// prefill and aggregated workers).
    pub items: Option<crate::recall::ItemCache>,
    /// The LoRA adapters loaded (`--max-loras` at most).
    pub adapters: crate::adapters::Adapters,
    /// The span exporter of `--otlp-endpoint` (`None`: no spans).
    pub traces: Option<iris_otel::Traces>,
}

/// The events of one running request.
pub type Events = mpsc::Receiver<Result<Event, Status>>;

/// Load figures every protocol's GetLoads reports.
#[derive(Debug, Clone, Copy)]
pub struct LoadFigures {
    pub running: i32,
    pub waiting: i32,
    pub waiting_tokens: i32,
    pub max_total_tokens: i32,
    pub max_running: i32,
    pub utilization: f64,
}

/// A wire integer from a count, saturated.
pub fn as_i32(v: impl TryInto<i32>) -> i32 {
    v.try_into().unwrap_or(i32::MAX)
}

impl Engine {
    /// Registers a validated request and starts running it; refused when
    /// its id is already in flight here or (prefill) its room is taken.
    pub fn submit(self: &Arc<Self>, plan: Plan) -> Result<Events, Status> {
        let registration = self.inflight.register(&plan.request_id).ok_or_else(|| {
            Status::already_exists(format!(
                "request {} is already in flight on this worker",
                plan.request_id
            ))
        })?;
        if let (Role::Prefill, Some(kv)) = (self.role, &plan.kv) {
            self.rooms
                .begin(kv.room, STATE_BYTES)
                .map_err(Status::from)?;
        }
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(run::run(self.clone(), plan, registration, tx));
        Ok(rx)
    }

    /// A KV room no request of this worker has used (prefill workers whose
    /// protocol lets them pick it).
    pub fn fresh_room(&self) -> i64 {
        self.next_room.fetch_add(1, Ordering::Relaxed)
    }

    /// Cancels `request_id`; false when it is not in flight here.
    pub fn abort(&self, request_id: &str) -> bool {
        self.inflight.abort(request_id)
    }

    /// Cancels `request_id`, saying whether it was found and what happened.
    pub fn abort_reporting(&self, request_id: &str) -> (bool, String) {
        let found = self.abort(request_id);
        let message = if found {
            format!("request {request_id} aborted")
        } else {
            format!("request {request_id} is not in flight here")
        };
        (found, message)
    }

    /// What HealthCheck answers.
    pub fn health_message(&self) -> String {
        format!("iris-engine {} ready", self.role.as_str())
    }

    /// Seconds since the Unix epoch at start-up.
    pub fn start_time(&self) -> prost_types::Timestamp {
        let since_epoch = self
            .started_at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        prost_types::Timestamp {
            seconds: since_epoch.as_secs() as i64,
            nanos: since_epoch.subsec_nanos() as i32,
        }
    }

    /// The in-flight counters in GetLoads' terms.
    pub fn load_figures(&self) -> LoadFigures {
        let l = self.inflight.loads();
        let max_running = self.config.max_running_requests;
        LoadFigures {
            running: as_i32(l.running),
            waiting: as_i32(l.waiting),
            waiting_tokens: as_i32(l.waiting_tokens),
            max_total_tokens: as_i32(self.limits.max_context_length),
            max_running: as_i32(max_running),
            utilization: l.running as f64 / f64::from(max_running),
        }
    }

    /// The tokenizer bundle as a stream of chunks (the last one carries the
    /// archive's SHA-256).
    pub fn tokenizer_chunks(&self) -> mpsc::Receiver<Result<GetTokenizerChunk, Status>> {
        let zip = self.facts.tokenizer_zip.clone();
        let sha = self.facts.tokenizer_sha256.clone();
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
        rx
    }
}

/// The worker's role, ports and identity as a Struct (TokenSpeed and
/// SGLang GetServerInfo `server_args`).
pub fn server_args(engine: &Engine) -> Struct {
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
    // Resumes a constraint after output already written
    // (`constrained_prefix_tokens`): gateways move such requests here.
    pairs.push((iris_transport::CONSTRAINT_RESUME_FIELD, number(1.0)));
    // Serves items sent by content hash alone from the items it kept.
    if engine.items.is_some() {
        pairs.push((iris_transport::EMBEDDING_RECALL_FIELD, number(1.0)));
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
