//! `tokenspeed.grpc.scheduler.TokenSpeedScheduler`: the engine's native
//! protocol. Requests carry one tensor per multimodal item (or, in EPD, the
//! encode worker's room for it) and PD by `kv_bootstrap_info`.

use std::collections::HashMap;
use std::sync::Arc;

use iris_proto::common::{GetTokenizerChunk, GetTokenizerRequest, Modality};
use iris_proto::info::{fields, text};
use iris_proto::scheduler::generate_complete::MatchedStop;
use iris_proto::scheduler::generate_response::Response as Reply;
use iris_proto::scheduler::token_speed_scheduler_server::{
    TokenSpeedScheduler, TokenSpeedSchedulerServer,
};
use iris_proto::scheduler::*;
use tonic::{Request, Response, Status};

use super::Replies;
use crate::families::ItemRules;
use crate::output::Event;
use crate::prefix::ItemKey;
use crate::request::{self, Intake, ItemSource, Sampling};
use crate::service::{as_i32, server_args, Engine};
use crate::Role;

/// The TokenSpeedScheduler service of `engine`.
pub fn service(engine: Arc<Engine>) -> TokenSpeedSchedulerServer<Service> {
    TokenSpeedSchedulerServer::new(Service(engine))
}

pub struct Service(Arc<Engine>);

#[tonic::async_trait]
impl TokenSpeedScheduler for Service {
    type GenerateStream = Replies<GenerateResponse>;
    type GetTokenizerStream = Replies<GetTokenizerChunk>;
    type SubscribeKvEventsStream = Replies<iris_proto::common::KvEventBatch>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let span = super::traced(&self.0, request.metadata());
        let intake = intake(request.into_inner(), self.0.role, &self.0.item_rules)?;
        let request_id = intake.request_id.clone();
        let replies = super::generate(&self.0, intake, span, move |event| {
            reply(&request_id, event)
        })?;
        Ok(Response::new(replies))
    }

    async fn health_check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(HealthCheckResponse {
            healthy: true,
            message: self.0.health_message(),
        }))
    }

    async fn abort(
        &self,
        request: Request<AbortRequest>,
    ) -> Result<Response<AbortResponse>, Status> {
        let (success, message) = self.0.abort_reporting(&request.into_inner().request_id);
        Ok(Response::new(AbortResponse { success, message }))
    }

    async fn get_model_info(
        &self,
        _: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        Ok(Response::new(model_info(&self.0)))
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        let engine = &self.0;
        Ok(Response::new(GetServerInfoResponse {
            server_args: Some(server_args(engine)),
            // As TokenSpeed workers report it: gateways that find the same
            // value on their side send pixels through /dev/shm.
            scheduler_info: engine
                .payloads
                .namespace()
                .map(|id| fields([(iris_transport::SHM_NAMESPACE_FIELD, text(id))])),
            active_requests: as_i32(engine.inflight.len()),
            is_paused: false,
            uptime_seconds: engine.started.elapsed().as_secs_f64(),
            max_total_num_tokens: as_i32(engine.limits.max_context_length),
            tokenspeed_version: format!("iris-engine {}", env!("CARGO_PKG_VERSION")),
            start_time: Some(engine.start_time()),
        }))
    }

    async fn get_loads(
        &self,
        _: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        Ok(Response::new(loads(&self.0)))
    }

    async fn subscribe_kv_events(
        &self,
        request: Request<iris_proto::common::SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        super::kv_events::subscribe(&self.0, request.into_inner()).map(Response::new)
    }

    async fn get_tokenizer(
        &self,
        _: Request<GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        Ok(Response::new(super::tokenizer(&self.0)))
    }
}

/// Translates a TokenSpeed GenerateRequest for a worker of `role`, its
/// mm items checked against the model's `rules`.
fn intake(mut req: GenerateRequest, role: Role, rules: &ItemRules) -> Result<Intake, Status> {
    if !req.lora_id.is_empty() {
        return Err(request::unsupported(
            "lora_id",
            "TokenSpeed's protocol has no LoRA adapters (serve them with --protocol sglang)",
        ));
    }
    let input_ids = req.tokenized.take().map(|t| t.input_ids).ok_or_else(|| {
        Status::invalid_argument("missing tokenized input: GenerateRequest.tokenized is required")
    })?;
    super::check_rank(req.data_parallel_rank)?;
    let p = req.sampling_params.take().unwrap_or_default();
    let sampling = Sampling {
        temperature: p.temperature,
        top_p: p.top_p,
        min_p: p.min_p,
        n: p.n,
        max_new_tokens: p.max_new_tokens,
        min_new_tokens: p.min_new_tokens,
        stop_token_ids: p.stop_token_ids,
        ignore_eos: p.ignore_eos,
        seed: p.sampling_seed.unwrap_or(0),
        logit_bias: request::decimal_bias(&p.logit_bias)?,
        top_logprobs: super::top_logprobs(req.return_logprob, req.top_logprobs_num),
        constraint: p.constraint,
        constrained_prefix_tokens: p.constrained_prefix_tokens,
    };
    let (items, item_keys) = match role {
        Role::Decode => (Vec::new(), Vec::new()),
        Role::Aggregated | Role::Prefill => {
            let sources = item_sources(&req, input_ids.len())?;
            let items = req.mm_inputs.as_ref().map(|m| m.items.as_slice());
            rules.check(items.unwrap_or_default(), &input_ids)?;
            (sources, item_keys(&req))
        }
    };
    let kv = req
        .kv_bootstrap_info
        .map(|k| (k.bootstrap_host, k.bootstrap_port, k.bootstrap_room));
    Ok(Intake {
        kv: request::kv_address(kv, role, "kv_bootstrap_info")?,
        request_id: req.request_id,
        input_ids,
        stream: req.stream,
        sampling,
        items,
        item_keys,
        lora: None,
    })
}

/// Each mm item's prefix-cache key: its content hash over its placeholders.
fn item_keys(req: &GenerateRequest) -> Vec<ItemKey> {
    let items = req.mm_inputs.iter().flat_map(|m| &m.items);
    items
        .map(|item| {
            let ranges = item.placeholders.iter().map(|r| (r.offset, r.length));
            super::item_key(&item.content_hash, ranges)
        })
        .collect()
}

/// One source per mm item: the encode worker's room when
/// `encode_bootstrap_info` names the item, else its pixels.
fn item_sources(req: &GenerateRequest, prompt_len: usize) -> Result<Vec<ItemSource>, Status> {
    let items = req
        .mm_inputs
        .as_ref()
        .map(|m| m.items.as_slice())
        .unwrap_or_default();
    let mut encoded: HashMap<u32, ItemSource> = HashMap::new();
    for entry in req.encode_bootstrap_info.iter().flat_map(|e| &e.items) {
        if entry.item_index as usize >= items.len() {
            return Err(Status::invalid_argument(format!(
                "encode_bootstrap_info names item {} but the request has {} mm items",
                entry.item_index,
                items.len()
            )));
        }
        if entry.bootstrap_host.is_empty() || entry.bootstrap_room < 0 {
            return Err(Status::invalid_argument(format!(
                "encode_bootstrap_info for item {} needs a host and a non-negative room",
                entry.item_index
            )));
        }
        let port = request::port(
            entry.bootstrap_port.into(),
            "encode_bootstrap_info.bootstrap_port",
        )?;
        let source = ItemSource::Embedding {
            host: entry.bootstrap_host.clone(),
            port,
            room: entry.bootstrap_room,
        };
        if encoded.insert(entry.item_index, source).is_some() {
            return Err(Status::invalid_argument(format!(
                "encode_bootstrap_info names item {} twice",
                entry.item_index
            )));
        }
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            check_item(i, item, prompt_len)?;
            if let Some(source) = encoded.remove(&(i as u32)) {
                return Ok(source);
            }
            let Some(tensor) = item.encoder_input.clone() else {
                return Err(Status::invalid_argument(format!(
                    "mm item {i} has neither pixels (encoder_input) nor an encode_bootstrap_info entry"
                )));
            };
            let hash = item.content_hash.clone();
            match tensor.payload {
                Some(_) => Ok(ItemSource::Pixels { tensor, hash }),
                None if hash.is_empty() => Err(Status::invalid_argument(format!(
                    "mm item {i}: encoder_input has no payload and the item no content_hash to recall it by"
                ))),
                None => Ok(ItemSource::Recall { tensor, hash }),
            }
        })
        .collect()
}

fn check_item(index: usize, item: &MultimodalItem, prompt_len: usize) -> Result<(), Status> {
    // Without a payload the item is a recall: its shape and dtype are
    // checked when it is served.
    let named = item
        .encoder_input
        .iter()
        .filter(|t| t.payload.is_some())
        .map(|t| ("encoder_input", t));
    let specific = item
        .model_specific_tensors
        .iter()
        .map(|(k, t)| (k.as_str(), t));
    for (name, t) in named.chain(specific) {
        request::check_tensor(&format!("mm item {index}, tensor {name}"), t)?;
    }
    request::check_placeholders(
        &format!("mm item {index}"),
        item.placeholders.iter().map(|r| (r.offset, r.length)),
        prompt_len,
    )
}

/// An event as a TokenSpeed GenerateResponse.
fn reply(request_id: &str, event: Event) -> GenerateResponse {
    let response = match event {
        Event::Chunk(c) => Reply::Chunk(GenerateStreamChunk {
            token_ids: vec![c.token],
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.logprobs.map(logprobs),
            index: c.index,
        }),
        Event::Complete(c) => Reply::Complete(GenerateComplete {
            output_ids: c.output_ids,
            finish_reason: c.finish_reason.into(),
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.logprobs.map(logprobs),
            matched_stop: c.matched_token.map(MatchedStop::MatchedTokenId),
            index: c.index,
        }),
    };
    GenerateResponse {
        request_id: request_id.to_owned(),
        response: Some(response),
    }
}

output_logprobs!();

fn model_info(engine: &Engine) -> GetModelInfoResponse {
    let facts = &engine.facts;
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
            vec![Modality::Image as i32, Modality::Video as i32]
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
    let f = engine.load_figures();
    let load = SchedulerLoad {
        dp_rank: 0,
        num_running_reqs: f.running,
        num_waiting_reqs: f.waiting,
        num_total_reqs: f.running.saturating_add(f.waiting),
        num_used_tokens: 0,
        max_total_num_tokens: f.max_total_tokens,
        max_running_requests: f.max_running,
        token_usage: 0.0,
        gen_throughput: 0.0,
        cache_hit_rate: 0.0,
        utilization: f.utilization,
        num_waiting_uncached_tokens: f.waiting_tokens,
    };
    let aggregate = AggregateMetrics {
        total_running_reqs: load.num_running_reqs,
        total_waiting_reqs: load.num_waiting_reqs,
        total_reqs: load.num_total_reqs,
        avg_token_usage: 0.0,
        avg_throughput: 0.0,
        avg_utilization: f.utilization,
    };
    GetLoadsResponse {
        timestamp: iris_proto::info::timestamp_now(),
        version: env!("CARGO_PKG_VERSION").into(),
        dp_rank_count: 1,
        loads: vec![load],
        aggregate: Some(aggregate),
    }
}
