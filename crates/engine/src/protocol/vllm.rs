//! `vllm.grpc.engine.VllmEngine` (vLLM's gRPC mode). A request carries one
//! preprocessed pixel batch per modality (`mm_inputs`, `extra_mm_inputs`),
//! inline, in shared memory or remote, split back into its items by its
//! `batched_keys` / `flat_keys` ([`super::vllm_batch`]), and PD by
//! `kv_transfer_params_json` in the shape of vLLM's NIXL connector: the
//! prefill is asked with
//! `{"do_remote_decode": true}` and answers, in its GenerateComplete, with
//! where its KV state waits (`remote_host`, `remote_port`,
//! `remote_block_ids` = [the room]); the decode is sent that answer and
//! collects the state from there (over `iris.data.v1`).

use std::sync::Arc;

use iris_proto::common::{GetTokenizerChunk, GetTokenizerRequest, Modality};
use iris_proto::scheduler::sampling_params::Constraint;
use iris_proto::scheduler::{tensor_data::Payload as EnginePayload, TensorData as EngineTensor};
use iris_proto::vllm::generate_complete::MatchedStop;
use iris_proto::vllm::generate_request::Input;
use iris_proto::vllm::generate_response::Response as Reply;
use iris_proto::vllm::sampling_params::Constraint as VllmConstraint;
use iris_proto::vllm::tensor_data::Payload;
use iris_proto::vllm::vllm_engine_server::{VllmEngine, VllmEngineServer};
use iris_proto::vllm::*;
use serde_json::{json, Map, Value};
use tonic::{Request, Response, Status};

use super::Replies;
use crate::output::{Completion, Event};
use crate::prefix::ItemKey;
use crate::request::{self, unsupported, Intake, ItemSource, KvAddress, Sampling};
use crate::service::{as_i32, Engine};
use crate::Role;

/// Longest `kv_transfer_params_json` read.
const MAX_KV_PARAMS_BYTES: usize = 64 << 10;
/// What GetServerInfo reports as the KV connector of a PD worker (the
/// shape of its `kv_transfer_params_json`).
pub const KV_CONNECTOR: &str = "NixlConnector";

/// The VllmEngine service of `engine`.
pub fn service(engine: Arc<Engine>) -> VllmEngineServer<Service> {
    VllmEngineServer::new(Service(engine))
}

pub struct Service(Arc<Engine>);

#[tonic::async_trait]
impl VllmEngine for Service {
    type GenerateStream = Replies<GenerateResponse>;
    type GetTokenizerStream = Replies<GetTokenizerChunk>;
    type SubscribeKvEventsStream = Replies<iris_proto::common::KvEventBatch>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let span = super::traced(&self.0, request.metadata());
        let intake = intake(request.into_inner(), &self.0)?;
        let identity = Identity {
            request_id: intake.request_id.clone(),
            engine_id: self.0.worker_id.clone(),
        };
        let replies = super::generate(&self.0, intake, span, move |event| reply(&identity, event))?;
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
        for id in &request.get_ref().request_ids {
            self.0.abort(id);
        }
        Ok(Response::new(AbortResponse {}))
    }

    async fn get_model_info(
        &self,
        _: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        let engine = &self.0;
        let facts = &engine.facts;
        Ok(Response::new(GetModelInfoResponse {
            model_path: facts.model_path.clone(),
            is_generation: true,
            max_context_length: engine.limits.max_context_length,
            vocab_size: engine.limits.vocab_size,
            supports_vision: facts.supports_vision,
            served_model_name: facts.served_model_name.clone(),
            tokenizer_path: facts.model_path.clone(),
            model_type: facts.model_type.clone(),
            architectures: facts.architectures.clone(),
            eos_token_ids: facts.eos_token_ids.iter().map(|&v| as_i32(v)).collect(),
            pad_token_id: facts.pad_token_id.map(as_i32).unwrap_or(0),
            bos_token_id: facts.bos_token_id.map(as_i32).unwrap_or(0),
            max_req_input_len: as_i32(engine.limits.max_context_length.saturating_sub(1)),
            default_sampling_params_json: "{}".into(),
        }))
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        let engine = &self.0;
        let (connector, kv_role) = match engine.role {
            Role::Aggregated => ("", ""),
            Role::Prefill => (KV_CONNECTOR, "kv_producer"),
            Role::Decode => (KV_CONNECTOR, "kv_consumer"),
        };
        Ok(Response::new(GetServerInfoResponse {
            active_requests: u32::try_from(engine.inflight.len()).unwrap_or(u32::MAX),
            is_paused: false,
            last_receive_timestamp: 0.0,
            uptime_seconds: engine.started.elapsed().as_secs_f64(),
            server_type: "vllm-grpc".into(),
            kv_connector: connector.into(),
            kv_role: kv_role.into(),
            kv_engine_id: engine.worker_id.clone(),
            data_parallel_size: 1,
            shm_namespace_id: engine.payloads.namespace().unwrap_or_default().into(),
            model_dtype: engine.facts.dtype.clone(),
            max_num_seqs: as_i32(engine.config.max_running_requests),
            multimodal_encoder_dtype: if engine.facts.supports_vision {
                "float32".into()
            } else {
                String::new()
            },
        }))
    }

    async fn get_loads(
        &self,
        _: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        let f = self.0.load_figures();
        Ok(Response::new(GetLoadsResponse {
            timestamp: iris_proto::info::timestamp_now(),
            version: env!("CARGO_PKG_VERSION").into(),
            dp_rank_count: 1,
            loads: vec![SchedulerLoad {
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
            }],
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
}

/// Translates a vLLM GenerateRequest for `engine`.
fn intake(mut req: GenerateRequest, engine: &Engine) -> Result<Intake, Status> {
    if req.kv_transfer_params.is_some() {
        return Err(unsupported(
            "kv_transfer_params",
            "send PD parameters as kv_transfer_params_json",
        ));
    }
    if req.media_refs.as_ref().is_some_and(|m| !m.items.is_empty()) {
        return Err(unsupported(
            "media_refs",
            "it takes preprocessed pixels (mm_inputs) only",
        ));
    }
    let input_ids = match req.input.take() {
        Some(Input::Tokenized(t)) => t.input_ids,
        Some(Input::Text(_)) => {
            return Err(unsupported("text", "it takes token ids (tokenized) only"))
        }
        None => {
            return Err(Status::invalid_argument(
                "missing tokenized input: GenerateRequest.tokenized is required",
            ))
        }
    };
    super::check_rank(req.data_parallel_rank)?;
    let sampling = sampling(req.sampling_params.take().unwrap_or_default())?;
    let (items, item_keys) = match engine.role {
        Role::Decode => (Vec::new(), Vec::new()),
        Role::Aggregated | Role::Prefill => {
            let batches = req.mm_inputs.take().into_iter().chain(req.extra_mm_inputs);
            let (mut items, mut keys) = (Vec::new(), Vec::new());
            for (i, batch) in batches.enumerate() {
                let what = match i {
                    0 => "mm_inputs".to_owned(),
                    i => format!("extra_mm_inputs[{}]", i - 1),
                };
                keys.extend(batch_keys(&batch));
                items.extend(batch_items(&what, batch, input_ids.len())?);
            }
            (items, keys)
        }
    };
    Ok(Intake {
        kv: kv_leg(req.kv_transfer_params_json.as_deref(), engine)?,
        request_id: req.request_id,
        input_ids,
        stream: req.stream,
        sampling,
        items,
        item_keys,
        lora: None,
    })
}

fn sampling(p: SamplingParams) -> Result<Sampling, Status> {
    if p.prompt_logprobs.is_some() {
        return Err(unsupported(
            "sampling_params.prompt_logprobs",
            "it reports no prompt log probabilities",
        ));
    }
    if p.truncate_prompt_tokens.is_some() {
        return Err(unsupported(
            "sampling_params.truncate_prompt_tokens",
            "it never truncates a prompt",
        ));
    }
    if let Some(k) = p
        .logprobs
        .filter(|k| !(0..=request::MAX_TOP_LOGPROBS).contains(k))
    {
        return Err(Status::invalid_argument(format!(
            "sampling_params.logprobs must be in 0..={}, got {k}",
            request::MAX_TOP_LOGPROBS
        )));
    }
    let logit_bias = p
        .logit_bias
        .iter()
        .map(|(&id, &bias)| {
            u32::try_from(id).map(|id| (id, bias)).map_err(|_| {
                Status::invalid_argument(format!("logit_bias key {id} is not a token id"))
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Sampling {
        temperature: p.temperature,
        // Proto3 cannot tell an unset top_p from 0, which is no valid value.
        top_p: Some(p.top_p).filter(|&t| t != 0.0),
        min_p: Some(p.min_p),
        n: p.n,
        max_new_tokens: p.max_tokens,
        min_new_tokens: p.min_tokens,
        stop_token_ids: p.stop_token_ids,
        ignore_eos: p.ignore_eos,
        // The seed's bits, so a seed means the same under every protocol.
        seed: p.seed.map_or(0, |s| i64::from(s) as u64),
        logit_bias,
        top_logprobs: p.logprobs,
        constraint: p.constraint.map(constraint).transpose()?,
        constrained_prefix_tokens: 0,
    })
}

/// A vLLM constraint as the engine's: `json_object` is the schema of any
/// object, `choice` the expression matching exactly one of the choices.
fn constraint(c: VllmConstraint) -> Result<Constraint, Status> {
    Ok(match c {
        VllmConstraint::JsonSchema(s) => Constraint::JsonSchema(s),
        VllmConstraint::Regex(s) => Constraint::Regex(s),
        VllmConstraint::Grammar(_) => return Err(unfollowed("grammar")),
        VllmConstraint::StructuralTag(_) => return Err(unfollowed("structural_tag")),
        VllmConstraint::JsonObject(false) => {
            return Err(Status::invalid_argument(
                "sampling_params.json_object is false: set it to true or send no constraint",
            ))
        }
        VllmConstraint::JsonObject(true) => Constraint::JsonSchema(r#"{"type":"object"}"#.into()),
        VllmConstraint::Choice(c) if c.choices.is_empty() => {
            return Err(Status::invalid_argument(
                "sampling_params.choice has no choices",
            ))
        }
        VllmConstraint::Choice(c) => {
            let alternatives: Vec<String> = c.choices.iter().map(|s| regex::escape(s)).collect();
            Constraint::Regex(format!("(?:{})", alternatives.join("|")))
        }
    })
}

fn unfollowed(field: &str) -> Status {
    unsupported(
        &format!("sampling_params.{field}"),
        "it follows json_schema, regex, json_object and choice constraints",
    )
}

/// The prefix-cache key of each item of a batch: its `mm_hashes` entry
/// (fingerprinted) over its placeholders; without hashes, keys of
/// their own.
fn batch_keys(mm: &MultimodalInputs) -> Vec<ItemKey> {
    mm.mm_placeholders
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let hash = mm
                .mm_hashes
                .get(i)
                .map(|h| iris_fingerprint::fingerprint(h.as_bytes()));
            super::item_key(
                hash.as_ref().map_or(&[][..], |h| &h[..]),
                [(r.offset, r.length)],
            )
        })
        .collect()
}

/// One preprocessed batch as its items, split by its field layout
/// ([`super::vllm_batch`]); `what` names it in errors.
fn batch_items(
    what: &str,
    mut mm: MultimodalInputs,
    prompt_len: usize,
) -> Result<Vec<ItemSource>, Status> {
    if Modality::try_from(mm.modality).is_err() {
        return Err(Status::invalid_argument(format!(
            "{what}.modality = {} is not a known modality",
            mm.modality
        )));
    }
    for (name, t) in &mm.model_specific_tensors {
        let t = engine_tensor(&format!("{what}.model_specific_tensors[{name}]"), t.clone())?;
        request::check_tensor(&format!("{what}.model_specific_tensors[{name}]"), &t)?;
    }
    request::check_placeholders(
        what,
        mm.mm_placeholders.iter().map(|r| (r.offset, r.length)),
        prompt_len,
    )?;
    if !mm.mm_hashes.is_empty() && mm.mm_hashes.len() != mm.mm_placeholders.len() {
        return Err(Status::invalid_argument(format!(
            "{what}.mm_hashes has {} hashes for {} placeholders (one per item)",
            mm.mm_hashes.len(),
            mm.mm_placeholders.len()
        )));
    }
    match mm.pixel_values.take() {
        Some(pixels) => {
            let pixels = engine_tensor(&format!("{what}.pixel_values"), pixels)?;
            request::check_tensor(&format!("{what}.pixel_values"), &pixels)?;
            let items = super::vllm_batch::split(what, &mm, pixels)?;
            Ok(items
                .into_iter()
                .map(|tensor| ItemSource::Pixels {
                    tensor,
                    hash: bytes::Bytes::new(),
                })
                .collect())
        }
        None if mm.mm_placeholders.is_empty() => Ok(Vec::new()),
        None => Err(Status::invalid_argument(format!(
            "{what} has placeholders but no pixel_values"
        ))),
    }
}

/// A vLLM tensor in the engine's form (the payload lanes are the same
/// `smg.grpc.common` handles).
fn engine_tensor(what: &str, t: TensorData) -> Result<EngineTensor, Status> {
    let payload = match t.payload {
        Some(Payload::Inline(b)) => EnginePayload::Inline(b),
        Some(Payload::Shm(h)) => EnginePayload::Shm(h),
        Some(Payload::Remote(h)) => EnginePayload::Remote(h),
        None => {
            return Err(Status::invalid_argument(format!(
                "{what}: tensor has no payload"
            )))
        }
    };
    Ok(EngineTensor {
        shape: t.shape,
        dtype: t.dtype,
        payload: Some(payload),
    })
}

/// The KV room of a PD request from its `kv_transfer_params_json`: a room
/// this worker picks (prefill) or the one the prefill answered (decode).
fn kv_leg(params: Option<&str>, engine: &Engine) -> Result<Option<KvAddress>, Status> {
    const FIELD: &str = "kv_transfer_params_json";
    let role = engine.role;
    let params = match (role, params) {
        (Role::Aggregated, None) => return Ok(None),
        (Role::Aggregated, Some(_)) => {
            return Err(Status::invalid_argument(format!(
                "{FIELD} was sent to an aggregated worker; it is for prefill/decode workers"
            )))
        }
        (Role::Prefill, None) => {
            return Err(Status::invalid_argument(format!(
                "a prefill worker needs {FIELD} ({{\"do_remote_decode\": true}})"
            )))
        }
        (Role::Decode, None) => {
            return Err(Status::invalid_argument(format!(
                "a decode worker needs {FIELD} (what the prefill answered)"
            )))
        }
        (_, Some(text)) => parse_object(text)?,
    };
    let flag = |key: &str| params.get(key).and_then(Value::as_bool).unwrap_or(false);
    match role {
        Role::Prefill if flag("do_remote_prefill") || !flag("do_remote_decode") => {
            Err(Status::invalid_argument(format!(
                "{FIELD}: a prefill worker is asked with do_remote_decode = true (and no do_remote_prefill)"
            )))
        }
        Role::Prefill => Ok(Some(KvAddress {
            host: String::new(),
            port: 0,
            room: engine.fresh_room(),
        })),
        _ if !flag("do_remote_prefill") => Err(Status::invalid_argument(format!(
            "{FIELD}: a decode worker is sent do_remote_prefill = true with the prefill's remote_host, remote_port and remote_block_ids"
        ))),
        _ => remote_state(&params).map(Some),
    }
}

fn parse_object(text: &str) -> Result<Map<String, Value>, Status> {
    const FIELD: &str = "kv_transfer_params_json";
    if text.len() > MAX_KV_PARAMS_BYTES {
        return Err(Status::invalid_argument(format!(
            "{FIELD} has {} bytes, at most {MAX_KV_PARAMS_BYTES}",
            text.len()
        )));
    }
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Status::invalid_argument(format!(
            "{FIELD} is not a JSON object"
        ))),
        Err(e) => Err(Status::invalid_argument(format!(
            "{FIELD} is not valid JSON: {e}"
        ))),
    }
}

/// Where a decode collects its state: the prefill's `remote_host`,
/// `remote_port` and the room in `remote_block_ids`.
fn remote_state(params: &Map<String, Value>) -> Result<KvAddress, Status> {
    let field = |key: &str| format!("kv_transfer_params_json.{key}");
    let host = params
        .get("remote_host")
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty())
        .ok_or_else(|| {
            Status::invalid_argument(format!("{} must be a host name", field("remote_host")))
        })?;
    let port = params
        .get("remote_port")
        .and_then(Value::as_i64)
        .ok_or_else(|| {
            Status::invalid_argument(format!("{} must be a port number", field("remote_port")))
        })?;
    let port = request::port(port, &field("remote_port"))?;
    let room = match params.get("remote_block_ids").and_then(Value::as_array) {
        Some(ids) if ids.len() == 1 => ids[0].as_i64().filter(|r| *r >= 0),
        _ => None,
    }
    .ok_or_else(|| {
        Status::invalid_argument(format!(
            "{} must hold exactly one non-negative integer (the prefill's KV room)",
            field("remote_block_ids")
        ))
    })?;
    Ok(KvAddress {
        host: host.to_owned(),
        port,
        room,
    })
}

/// The request's id and this worker's engine id, for the prefill's answer.
struct Identity {
    request_id: String,
    engine_id: String,
}

/// What a prefill answers for its decode: where its state waits, in the
/// NIXL connector's terms.
fn handoff_params(identity: &Identity, at: &KvAddress) -> String {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": identity.engine_id,
        "remote_host": at.host,
        "remote_port": at.port,
        "remote_block_ids": [at.room],
        "remote_request_id": identity.request_id,
    })
    .to_string()
}

/// An event as a vLLM GenerateResponse.
fn reply(identity: &Identity, event: Event) -> GenerateResponse {
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
        Event::Complete(c) => Reply::Complete(complete(identity, c)),
    };
    GenerateResponse {
        response: Some(response),
    }
}

fn complete(identity: &Identity, c: Completion) -> GenerateComplete {
    GenerateComplete {
        kv_transfer_params_json: c.handoff.as_ref().map(|at| handoff_params(identity, at)),
        output_ids: c.output_ids,
        finish_reason: c.finish_reason.into(),
        prompt_tokens: c.prompt_tokens,
        cached_tokens: c.cached_tokens,
        completion_tokens: c.completion_tokens,
        output_logprobs: c.logprobs.map(logprobs),
        matched_stop: c.matched_token.map(MatchedStop::MatchedTokenId),
        index: c.index,
        ..GenerateComplete::default()
    }
}

output_logprobs!();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_answer_reads_back_as_the_decode_address() {
        let at = KvAddress {
            host: "10.0.0.7".into(),
            port: 8998,
            room: 41,
        };
        let identity = Identity {
            request_id: "r-1".into(),
            engine_id: "prefill@10.0.0.7:30001".into(),
        };
        let params = parse_object(&handoff_params(&identity, &at)).unwrap();
        assert_eq!(remote_state(&params).unwrap(), at);
        assert_eq!(params["remote_request_id"], "r-1");
    }

    #[test]
    fn a_bad_decode_address_names_its_key() {
        let cases = [
            (
                r#"{"remote_port": 1, "remote_block_ids": [1]}"#,
                "remote_host",
            ),
            (
                r#"{"remote_host": "h", "remote_block_ids": [1]}"#,
                "remote_port",
            ),
            (
                r#"{"remote_host": "h", "remote_port": 70000, "remote_block_ids": [1]}"#,
                "remote_port",
            ),
            (
                r#"{"remote_host": "h", "remote_port": 1, "remote_block_ids": [1, 2]}"#,
                "remote_block_ids",
            ),
            (
                r#"{"remote_host": "h", "remote_port": 1, "remote_block_ids": [-1]}"#,
                "remote_block_ids",
            ),
        ];
        for (json, key) in cases {
            let err = remote_state(&parse_object(json).unwrap()).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{json}");
            assert!(
                err.message()
                    .contains(&format!("kv_transfer_params_json.{key}")),
                "{json}: {}",
                err.message()
            );
        }
        assert!(parse_object("[]").is_err());
        assert!(parse_object("{").is_err());
    }

    #[test]
    fn choice_is_an_escaped_alternation_and_json_object_any_object() {
        let choices = vec!["a|b".to_owned(), "c.".to_owned()];
        let Ok(Constraint::Regex(pattern)) =
            constraint(VllmConstraint::Choice(ChoiceConstraint { choices }))
        else {
            panic!("choice becomes a regex")
        };
        let re = regex::Regex::new(&format!("^{pattern}$")).unwrap();
        assert!(re.is_match("a|b") && re.is_match("c."));
        assert!(!re.is_match("a") && !re.is_match("cx"));
        assert!(matches!(
            constraint(VllmConstraint::JsonObject(true)),
            Ok(Constraint::JsonSchema(s)) if s == r#"{"type":"object"}"#
        ));
        for refused in [
            VllmConstraint::JsonObject(false),
            VllmConstraint::Choice(ChoiceConstraint { choices: vec![] }),
            VllmConstraint::Grammar("root ::= \"a\"".into()),
        ] {
            assert!(constraint(refused).is_err());
        }
    }
}
