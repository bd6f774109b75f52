//! Validation of a GenerateRequest against the worker's role and model,
//! producing a [`Plan`]: everything the run needs, already checked.

use std::collections::HashMap;

use iris_proto::scheduler::sampling_params::Constraint;
use iris_proto::scheduler::{GenerateRequest, KvBootstrapInfo, SamplingParams, TensorData};
use iris_proto::tensor;
use tonic::Status;

use crate::model::SequenceParams;
use crate::Role;

/// Most sequences one request may ask for.
pub const MAX_N: u32 = 16;
/// Most alternatives per token (`top_logprobs_num`).
pub const MAX_TOP_LOGPROBS: i32 = 20;
/// Most `logit_bias` entries.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// Facts of the served model that requests are checked against.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_context_length: u32,
    pub vocab_size: u32,
    pub default_max_new_tokens: u32,
}

/// Where one multimodal item's bytes come from.
#[derive(Debug, Clone)]
pub enum ItemSource {
    /// Preprocessed pixels carried in the request (inline or shm).
    Pixels(TensorData),
    /// An embedding waiting on an encode worker's data server.
    Embedding { host: String, port: u16, room: i64 },
}

/// A validated request.
#[derive(Debug, Clone)]
pub struct Plan {
    pub request_id: String,
    pub input_ids: Vec<u32>,
    pub stream: bool,
    pub sequences: Vec<SequenceParams>,
    /// The decoding constraint every sequence follows (see
    /// [`crate::constrained`]).
    pub constraint: Option<Constraint>,
    /// Empty for decode, which receives the state instead.
    pub items: Vec<ItemSource>,
    /// The KV room: produced here (prefill) or collected here (decode).
    pub kv: Option<KvAddress>,
}

/// A data server and room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvAddress {
    pub host: String,
    pub port: u16,
    pub room: i64,
}

/// Checks `req` for a worker of `role` serving a model with `limits`.
pub fn plan(mut req: GenerateRequest, role: Role, limits: &Limits) -> Result<Plan, Status> {
    let input_ids = req.tokenized.take().map(|t| t.input_ids).ok_or_else(|| {
        Status::invalid_argument("missing tokenized input: GenerateRequest.tokenized is required")
    })?;
    check_prompt(&input_ids, limits)?;
    let params = req.sampling_params.take().unwrap_or_default();
    check_sampling(&params)?;
    let prompt_len = input_ids.len() as u32;
    let mut sequences = sequences(&params, prompt_len, limits)?;
    let top_logprobs = logprobs(&req)?;
    sequences
        .iter_mut()
        .for_each(|s| s.top_logprobs = top_logprobs);
    let items = match role {
        Role::Decode => Vec::new(),
        Role::Aggregated | Role::Prefill => item_sources(&req, input_ids.len())?,
    };
    let kv = kv_address(req.kv_bootstrap_info, role)?;
    if req.request_id.is_empty() {
        return Err(Status::invalid_argument("request_id must not be empty"));
    }
    Ok(Plan {
        request_id: req.request_id,
        input_ids,
        stream: req.stream,
        sequences,
        constraint: params.constraint,
        items,
        kv,
    })
}

fn check_prompt(input_ids: &[u32], limits: &Limits) -> Result<(), Status> {
    if input_ids.is_empty() {
        return Err(Status::invalid_argument(
            "input_ids is empty: a prompt needs at least one token",
        ));
    }
    if input_ids.len() >= limits.max_context_length as usize {
        return Err(Status::invalid_argument(format!(
            "prompt has {} tokens; the model's context is {} tokens",
            input_ids.len(),
            limits.max_context_length
        )));
    }
    if let Some((pos, id)) = input_ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id >= limits.vocab_size)
    {
        return Err(Status::invalid_argument(format!(
            "input_ids[{pos}] = {id} is outside the vocabulary (size {})",
            limits.vocab_size
        )));
    }
    Ok(())
}

fn check_sampling(p: &SamplingParams) -> Result<(), Status> {
    if let Some(t) = p.temperature.filter(|t| !t.is_finite() || *t < 0.0) {
        return Err(Status::invalid_argument(format!(
            "temperature must be >= 0, got {t}"
        )));
    }
    if let Some(t) = p.top_p.filter(|t| !(*t > 0.0 && *t <= 1.0)) {
        return Err(Status::invalid_argument(format!(
            "top_p must be in (0, 1], got {t}"
        )));
    }
    if let Some(t) = p.min_p.filter(|t| !(0.0..=1.0).contains(t)) {
        return Err(Status::invalid_argument(format!(
            "min_p must be in [0, 1], got {t}"
        )));
    }
    crate::constrained::check(p.constraint.as_ref())
}

fn sequences(
    p: &SamplingParams,
    prompt_len: u32,
    limits: &Limits,
) -> Result<Vec<SequenceParams>, Status> {
    let n = p.n.max(1);
    if n > MAX_N {
        return Err(Status::invalid_argument(format!(
            "n = {n} is too large: at most {MAX_N} sequences per request"
        )));
    }
    let room = limits.max_context_length - prompt_len;
    let max_new_tokens = p
        .max_new_tokens
        .unwrap_or(limits.default_max_new_tokens)
        .min(room);
    if p.min_new_tokens > max_new_tokens {
        return Err(Status::invalid_argument(format!(
            "min_new_tokens ({}) exceeds max_new_tokens ({max_new_tokens})",
            p.min_new_tokens
        )));
    }
    let seed = p.sampling_seed.unwrap_or(0);
    let logit_bias = logit_bias(p, limits.vocab_size)?;
    if let Some(id) = p.stop_token_ids.iter().find(|&&id| id >= limits.vocab_size) {
        return Err(Status::invalid_argument(format!(
            "stop_token_ids: {id} is outside the vocabulary (size {})",
            limits.vocab_size
        )));
    }
    Ok((0..n)
        .map(|index| SequenceParams {
            max_new_tokens,
            min_new_tokens: p.min_new_tokens,
            stop_token_ids: p.stop_token_ids.clone(),
            ignore_eos: p.ignore_eos,
            seed,
            index,
            logit_bias: logit_bias.clone(),
            top_logprobs: None,
        })
        .collect())
}

/// `logit_bias` as (token id, bias): keys are decimal token ids inside the
/// vocabulary, biases finite.
fn logit_bias(p: &SamplingParams, vocab_size: u32) -> Result<Vec<(u32, f32)>, Status> {
    if p.logit_bias.len() > MAX_LOGIT_BIAS {
        return Err(Status::invalid_argument(format!(
            "logit_bias has {} entries, at most {MAX_LOGIT_BIAS}",
            p.logit_bias.len()
        )));
    }
    let mut bias = Vec::with_capacity(p.logit_bias.len());
    for (key, &value) in &p.logit_bias {
        let id = key
            .parse::<u32>()
            .ok()
            .filter(|&id| id < vocab_size)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "logit_bias key {key:?} is not a token id of the vocabulary (size {vocab_size})"
                ))
            })?;
        if !value.is_finite() {
            return Err(Status::invalid_argument(format!(
                "logit_bias[{key}] = {value} is not a finite number"
            )));
        }
        bias.push((id, value));
    }
    bias.sort_unstable_by_key(|&(id, _)| id);
    if bias.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(Status::invalid_argument(
            "logit_bias names a token twice (keys must be plain decimal ids)",
        ));
    }
    Ok(bias)
}

/// The number of alternatives to report per token, when logprobs are
/// asked (`return_logprob`); input logprobs are not produced.
fn logprobs(req: &GenerateRequest) -> Result<Option<u32>, Status> {
    if !req.return_logprob {
        return Ok(None);
    }
    match u32::try_from(req.top_logprobs_num) {
        Ok(k) if req.top_logprobs_num <= MAX_TOP_LOGPROBS => Ok(Some(k)),
        _ => Err(Status::invalid_argument(format!(
            "top_logprobs_num must be in 0..={MAX_TOP_LOGPROBS}, got {}",
            req.top_logprobs_num
        ))),
    }
}

fn kv_address(info: Option<KvBootstrapInfo>, role: Role) -> Result<Option<KvAddress>, Status> {
    match (role, info) {
        (Role::Aggregated, Some(_)) => Err(Status::invalid_argument(
            "kv_bootstrap_info was sent to an aggregated worker; it is for prefill/decode workers",
        )),
        (Role::Aggregated, None) => Ok(None),
        (Role::Prefill | Role::Decode, None) => Err(Status::invalid_argument(format!(
            "a {} worker needs kv_bootstrap_info (the prefill's data server and the KV room)",
            role.as_str()
        ))),
        (Role::Prefill | Role::Decode, Some(info)) => {
            let port = port(info.bootstrap_port, "kv_bootstrap_info.bootstrap_port")?;
            if info.bootstrap_room < 0 {
                return Err(Status::invalid_argument(format!(
                    "kv_bootstrap_info.bootstrap_room = {} is negative; rooms are 63-bit non-negative",
                    info.bootstrap_room
                )));
            }
            if role == Role::Decode && info.bootstrap_host.is_empty() {
                return Err(Status::invalid_argument(
                    "kv_bootstrap_info.bootstrap_host is empty",
                ));
            }
            Ok(Some(KvAddress {
                host: info.bootstrap_host,
                port,
                room: info.bootstrap_room,
            }))
        }
    }
}

fn port(value: i32, field: &str) -> Result<u16, Status> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Status::invalid_argument(format!("{field} = {value} is not a valid port")))
}

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
        let port = port(entry.bootstrap_port, "encode_bootstrap_info.bootstrap_port")?;
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
            check_item_tensors(i, item, prompt_len)?;
            if let Some(source) = encoded.remove(&(i as u32)) {
                return Ok(source);
            }
            item.encoder_input.clone().map(ItemSource::Pixels).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "mm item {i} has neither pixels (encoder_input) nor an encode_bootstrap_info entry"
                ))
            })
        })
        .collect()
}

fn check_item_tensors(
    index: usize,
    item: &iris_proto::scheduler::MultimodalItem,
    prompt_len: usize,
) -> Result<(), Status> {
    let named = item.encoder_input.iter().map(|t| ("encoder_input", t));
    let specific = item
        .model_specific_tensors
        .iter()
        .map(|(k, t)| (k.as_str(), t));
    for (name, t) in named.chain(specific) {
        tensor::validate(t).map_err(|e| {
            Status::invalid_argument(format!("mm item {index}, tensor {name}: {e}"))
        })?;
    }
    for r in &item.placeholders {
        let end = u64::from(r.offset) + u64::from(r.length);
        if end > prompt_len as u64 {
            return Err(Status::invalid_argument(format!(
                "mm item {index}: placeholder range {}..{end} lies outside the {prompt_len}-token prompt",
                r.offset
            )));
        }
    }
    Ok(())
}
