//! `sglang.grpc.scheduler.SglangScheduler` (SGLang's gRPC mode). A request
//! carries one preprocessed pixel batch for all its images, inline (the
//! protocol has no shared-memory or remote payload), cut back into its
//! images by the model's family ([`super::sglang_batch`]), and PD by
//! `disaggregated_params` (bootstrap host, port and room, as TokenSpeed).
//! LoRA adapters are loaded, unloaded and listed by their RPCs
//! ([`crate::adapters`]); a request names one by `lora_id`.

use std::sync::Arc;

use iris_proto::common::{GetTokenizerChunk, GetTokenizerRequest};
use iris_proto::info::{fields, text};
use iris_proto::scheduler::sampling_params::Constraint;
use iris_proto::scheduler::{tensor_data::Payload, TensorData as EngineTensor};
use iris_proto::sglang::generate_complete::MatchedStop;
use iris_proto::sglang::generate_response::Response as Reply;
use iris_proto::sglang::sampling_params::Constraint as SglangConstraint;
use iris_proto::sglang::sglang_scheduler_server::{SglangScheduler, SglangSchedulerServer};
use iris_proto::sglang::*;
use tonic::{Request, Response, Status};

use super::Replies;
use crate::adapters::LoadRequest;
use crate::families::ItemRules;
use crate::output::Event;
use crate::prefix::ItemKey;
use crate::request::{self, unsupported, Intake, ItemSource, Sampling};
use crate::service::{as_i32, server_args, Engine};
use crate::Role;

/// The SglangScheduler service of `engine`.
pub fn service(engine: Arc<Engine>) -> SglangSchedulerServer<Service> {
    SglangSchedulerServer::new(Service(engine))
}

pub struct Service(Arc<Engine>);

#[tonic::async_trait]
impl SglangScheduler for Service {
    type GenerateStream = Replies<GenerateResponse>;
    type GetTokenizerStream = Replies<GetTokenizerChunk>;
    type SubscribeKvEventsStream = Replies<iris_proto::common::KvEventBatch>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let span = super::traced(&self.0, request.metadata());
        let request = request.into_inner();
        let adapter = self.0.adapters.find(&request.lora_id)?;
        let mut intake = intake(request, self.0.role, &self.0.item_rules)?;
        if let Some(adapter) = adapter {
            intake.sampling.seed ^= adapter.seed;
            intake.lora = Some(adapter.name);
        }
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
        let engine = &self.0;
        let facts = &engine.facts;
        Ok(Response::new(GetModelInfoResponse {
            model_path: facts.model_path.clone(),
            tokenizer_path: facts.model_path.clone(),
            is_generation: true,
            preferred_sampling_params: String::new(),
            weight_version: "reference".into(),
            served_model_name: facts.served_model_name.clone(),
            max_context_length: as_i32(engine.limits.max_context_length),
            vocab_size: as_i32(engine.limits.vocab_size),
            supports_vision: facts.supports_vision,
            model_type: facts.model_type.clone(),
            eos_token_ids: facts.eos_token_ids.iter().map(|&v| as_i32(v)).collect(),
            pad_token_id: facts.pad_token_id.map(as_i32).unwrap_or(0),
            bos_token_id: facts.bos_token_id.map(as_i32).unwrap_or(0),
            max_req_input_len: as_i32(engine.limits.max_context_length.saturating_sub(1)),
            architectures: facts.architectures.clone(),
            default_sampling_params_json: String::new(),
        }))
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        let engine = &self.0;
        Ok(Response::new(GetServerInfoResponse {
            server_args: Some(server_args(engine)),
            scheduler_info: engine
                .payloads
                .namespace()
                .map(|id| fields([(iris_transport::SHM_NAMESPACE_FIELD, text(id))])),
            active_requests: as_i32(engine.inflight.len()),
            is_paused: false,
            last_receive_timestamp: 0.0,
            uptime_seconds: engine.started.elapsed().as_secs_f64(),
            sglang_version: format!("iris-engine {}", env!("CARGO_PKG_VERSION")),
            server_type: "grpc".into(),
            start_time: Some(engine.start_time()),
            max_total_num_tokens: as_i32(engine.limits.max_context_length),
        }))
    }

    async fn get_loads(
        &self,
        _: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        let f = self.0.load_figures();
        let load = SchedulerLoad {
            dp_rank: 0,
            num_running_reqs: f.running,
            num_waiting_reqs: f.waiting,
            num_total_reqs: f.running.saturating_add(f.waiting),
            num_used_tokens: 0,
            max_total_num_tokens: f.max_total_tokens,
            token_usage: 0.0,
            gen_throughput: 0.0,
            cache_hit_rate: 0.0,
            utilization: f.utilization,
            max_running_requests: f.max_running,
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
        Ok(Response::new(GetLoadsResponse {
            timestamp: iris_proto::info::timestamp_now(),
            version: env!("CARGO_PKG_VERSION").into(),
            dp_rank_count: 1,
            loads: vec![load],
            aggregate: Some(aggregate),
        }))
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

    async fn load_lo_ra_adapter(
        &self,
        request: Request<LoadLoRaAdapterRequest>,
    ) -> Result<Response<LoadLoRaAdapterResponse>, Status> {
        let r = request.into_inner();
        let adapters = &self.0.adapters;
        let loaded = adapters.load(LoadRequest {
            id: r.lora_id,
            name: r.lora_name,
            path: r.lora_path,
            pinned: r.pinned,
        });
        let (success, message) = outcome(loaded)?;
        Ok(Response::new(LoadLoRaAdapterResponse {
            success,
            message,
            loaded_lora_ids: adapters.ids(),
        }))
    }

    async fn unload_lo_ra_adapter(
        &self,
        request: Request<UnloadLoRaAdapterRequest>,
    ) -> Result<Response<UnloadLoRaAdapterResponse>, Status> {
        let r = request.into_inner();
        let adapters = &self.0.adapters;
        let (success, message) = outcome(adapters.unload(&r.lora_name, &r.lora_id))?;
        Ok(Response::new(UnloadLoRaAdapterResponse {
            success,
            message,
            loaded_lora_ids: adapters.ids(),
        }))
    }

    async fn list_loaded_lo_ra_adapters(
        &self,
        _: Request<ListLoadedLoRaAdaptersRequest>,
    ) -> Result<Response<ListLoadedLoRaAdaptersResponse>, Status> {
        let loaded_adapters = self
            .0
            .adapters
            .list()
            .into_iter()
            .map(|a| LoadedLoRaAdapter {
                lora_id: a.id,
                lora_name: a.name,
                lora_path: a.path,
                pinned: a.pinned,
            })
            .collect();
        Ok(Response::new(ListLoadedLoRaAdaptersResponse {
            loaded_adapters,
        }))
    }
}

/// A load's or unload's answer, as SGLang's servicer gives it: a refusal
/// the caller could fix (a limit, a missing adapter, a bad directory) is
/// `success: false` with its message; a malformed request is an error.
fn outcome(result: Result<(), Status>) -> Result<(bool, String), Status> {
    match result {
        Ok(()) => Ok((true, String::new())),
        Err(status) if status.code() == tonic::Code::InvalidArgument => Err(status),
        Err(status) => Ok((false, status.message().to_owned())),
    }
}

/// Translates an SGLang GenerateRequest for a worker of `role`.
fn intake(mut req: GenerateRequest, role: Role, rules: &ItemRules) -> Result<Intake, Status> {
    refuse_unsupported(&req)?;
    let input_ids = req.tokenized.take().map(|t| t.input_ids).ok_or_else(|| {
        Status::invalid_argument("missing tokenized input: GenerateRequest.tokenized is required")
    })?;
    super::check_rank(req.data_parallel_rank)?;
    let top_logprobs = logprob_request(&req)?;
    let p = req.sampling_params.take().unwrap_or_default();
    let sampling = sampling(p, top_logprobs)?;
    let (items, item_keys) = match (role, req.mm_inputs.take()) {
        (Role::Decode, _) | (_, None) => (Vec::new(), Vec::new()),
        (Role::Aggregated | Role::Prefill, Some(mm)) => items(mm, &input_ids, rules)?,
    };
    let kv = req.disaggregated_params.map(|d| {
        (
            d.bootstrap_host,
            d.bootstrap_port,
            i64::from(d.bootstrap_room),
        )
    });
    Ok(Intake {
        kv: request::kv_address(kv, role, "disaggregated_params")?,
        request_id: req.request_id,
        input_ids,
        stream: req.stream,
        sampling,
        items,
        item_keys,
        lora: None,
    })
}

/// Request fields this engine has no means to honour.
fn refuse_unsupported(req: &GenerateRequest) -> Result<(), Status> {
    let refusals = [
        (
            !req.token_ids_logprob.is_empty(),
            "token_ids_logprob",
            "it reports the sampled token and the top alternatives only",
        ),
        (
            req.return_hidden_states,
            "return_hidden_states",
            "it has no hidden states",
        ),
        (
            !req.custom_logit_processor.is_empty(),
            "custom_logit_processor",
            "it runs no custom logit processors",
        ),
        (
            !req.input_embeds.is_empty(),
            "input_embeds",
            "it takes token ids (tokenized)",
        ),
    ];
    match refusals.into_iter().find(|(set, _, _)| *set) {
        Some((_, field, why)) => Err(unsupported(field, why)),
        None => Ok(()),
    }
}

/// The alternatives asked per output token; input logprobs are refused.
fn logprob_request(req: &GenerateRequest) -> Result<Option<i32>, Status> {
    if req.return_logprob && req.logprob_start_len >= 0 {
        return Err(unsupported(
            "logprob_start_len",
            "it reports no prompt log probabilities (send -1)",
        ));
    }
    Ok(super::top_logprobs(
        req.return_logprob,
        req.top_logprobs_num,
    ))
}

fn sampling(p: SamplingParams, top_logprobs: Option<i32>) -> Result<Sampling, Status> {
    if let Some(k) = p.stream_interval.filter(|&k| k != 1) {
        return Err(unsupported(
            "sampling_params.stream_interval",
            &format!("it streams every token (interval 1), not every {k}"),
        ));
    }
    if p.custom_params
        .as_ref()
        .is_some_and(|s| !s.fields.is_empty())
    {
        return Err(unsupported(
            "sampling_params.custom_params",
            "it reads no custom parameters",
        ));
    }
    Ok(Sampling {
        temperature: Some(p.temperature),
        // Proto3 cannot tell an unset top_p from 0, which is no valid value.
        top_p: Some(p.top_p).filter(|&t| t != 0.0),
        min_p: Some(p.min_p),
        n: p.n,
        max_new_tokens: p.max_new_tokens,
        min_new_tokens: p.min_new_tokens,
        stop_token_ids: p.stop_token_ids,
        ignore_eos: p.ignore_eos,
        seed: 0,
        logit_bias: request::decimal_bias(&p.logit_bias)?,
        top_logprobs,
        constraint: p.constraint.map(|c| match c {
            SglangConstraint::Regex(s) => Constraint::Regex(s),
            SglangConstraint::JsonSchema(s) => Constraint::JsonSchema(s),
            SglangConstraint::EbnfGrammar(s) => Constraint::EbnfGrammar(s),
            SglangConstraint::StructuralTag(s) => Constraint::StructuralTag(s),
        }),
        constrained_prefix_tokens: 0,
    })
}

/// The pixel batch as its items and their prefix-cache keys: one per
/// image, checked as TokenSpeed's items are, where the model's family
/// says how the batch cuts ([`super::sglang_batch`]); else one item the
/// engine folds whole. The original images (`image_urls`, `image_data`)
/// may come along with their pixels, as smg sends them: like the
/// published SGLang servicer, which reads only `pixel_values` when it is
/// present, the engine computes on the pixels and does not read them.
/// Media without pixels are refused.
fn items(
    mm: MultimodalInputs,
    input_ids: &[u32],
    rules: &ItemRules,
) -> Result<(Vec<ItemSource>, Vec<ItemKey>), Status> {
    let has_pixels = mm.pixel_values.is_some();
    let raw = [
        ("image_urls", mm.image_urls.is_empty() || has_pixels),
        ("video_urls", mm.video_urls.is_empty()),
        ("audio_urls", mm.audio_urls.is_empty()),
        ("image_data", mm.image_data.is_empty() || has_pixels),
        ("video_data", mm.video_data.is_empty()),
        ("audio_data", mm.audio_data.is_empty()),
    ];
    if let Some((field, _)) = raw.into_iter().find(|(_, empty)| !empty) {
        return Err(unsupported(
            &format!("mm_inputs.{field}"),
            "it takes preprocessed pixels (mm_inputs.pixel_values) only",
        ));
    }
    for (name, t) in &mm.model_specific_tensors {
        request::check_tensor(
            &format!("mm_inputs.model_specific_tensors[{name}]"),
            &engine_tensor(t.clone()),
        )?;
    }
    request::check_placeholders(
        "mm_inputs",
        mm.mm_placeholders.iter().map(|r| (r.offset, r.length)),
        input_ids.len(),
    )?;
    let Some(pixels) = &mm.pixel_values else {
        return match mm.mm_placeholders.is_empty() {
            true => Ok((Vec::new(), Vec::new())),
            false => Err(Status::invalid_argument(
                "mm_inputs has placeholders but no pixel_values",
            )),
        };
    };
    request::check_tensor("mm_inputs.pixel_values", &engine_tensor(pixels.clone()))?;
    // SGLang's request names no item hash: each item is its own.
    if let Some(items) = super::sglang_batch::cut(rules.layout, &mm)? {
        rules.check(&items, input_ids)?;
        let keys = items
            .iter()
            .map(|i| super::item_key(&[], i.placeholders.iter().map(|r| (r.offset, r.length))))
            .collect();
        let sources = items
            .into_iter()
            .filter_map(|i| i.encoder_input)
            .map(|tensor| ItemSource::Pixels {
                tensor,
                hash: bytes::Bytes::new(),
            })
            .collect();
        return Ok((sources, keys));
    }
    let keys = mm
        .mm_placeholders
        .iter()
        .map(|r| super::item_key(&[], [(r.offset, r.length)]))
        .collect();
    let whole = ItemSource::Pixels {
        tensor: engine_tensor(pixels.clone()),
        hash: bytes::Bytes::new(),
    };
    Ok((vec![whole], keys))
}

/// An SGLang tensor (always inline) in the engine's form.
fn engine_tensor(t: TensorData) -> EngineTensor {
    EngineTensor {
        shape: t.shape,
        dtype: t.dtype,
        payload: Some(Payload::Inline(t.data)),
    }
}

/// An event as an SGLang GenerateResponse.
fn reply(request_id: &str, event: Event) -> GenerateResponse {
    let response = match event {
        Event::Chunk(c) => Reply::Chunk(GenerateStreamChunk {
            token_ids: vec![c.token],
            prompt_tokens: c.prompt_tokens,
            cached_tokens: c.cached_tokens,
            completion_tokens: c.completion_tokens,
            output_logprobs: c.logprobs.map(logprobs),
            index: c.index,
            ..GenerateStreamChunk::default()
        }),
        Event::Complete(c) => Reply::Complete(GenerateComplete {
            output_ids: c.output_ids,
            finish_reason: c.finish_reason.into(),
            prompt_tokens: c.prompt_tokens,
            cached_tokens: c.cached_tokens,
            completion_tokens: c.completion_tokens,
            output_logprobs: c.logprobs.map(logprobs),
            matched_stop: c.matched_token.map(MatchedStop::MatchedTokenId),
            index: c.index,
            ..GenerateComplete::default()
        }),
    };
    GenerateResponse {
        request_id: request_id.to_owned(),
        response: Some(response),
    }
}

output_logprobs!();
