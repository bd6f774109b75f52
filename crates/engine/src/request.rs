//! The protocol-neutral Generate request: what every protocol adapter
//! ([`crate::protocol`]) hands over ([`Intake`]), the checks shared by all
//! of them, and the validated [`Plan`] the run executes.
//!
//! An adapter refuses what its protocol can say but this engine cannot do,
//! naming the field; [`plan`] then checks what is common to every protocol
//! (the prompt against the model, sampling ranges, sequences, logprobs).

use bytes::Bytes;
use iris_proto::scheduler::sampling_params::Constraint;
use iris_proto::scheduler::TensorData;
use iris_proto::tensor;
use tonic::Status;

use crate::model::SequenceParams;
use crate::prefix::ItemKey;
use crate::Role;

/// Most sequences one request may ask for.
pub const MAX_N: u32 = 16;
/// Most alternatives per token (`top_logprobs_num`, vLLM's `logprobs`).
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
    /// Preprocessed pixels carried in the request (inline, shm or remote),
    /// in the engine's tensor form whatever the protocol; kept under
    /// `hash` for recalls ([`crate::recall`]) unless it is empty.
    Pixels { tensor: TensorData, hash: Bytes },
    /// An item sent by content hash alone (`tensor` has its shape and
    /// dtype, no payload): served from [`crate::recall`]'s cache.
    Recall { tensor: TensorData, hash: Bytes },
    /// An embedding waiting on an encode worker's data server.
    Embedding { host: String, port: u16, room: i64 },
}

/// The sampling part of a request, as every protocol can express it.
#[derive(Debug, Clone, Default)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    /// Sequences; 0 is read as 1.
    pub n: u32,
    pub max_new_tokens: Option<u32>,
    pub min_new_tokens: u32,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub seed: u64,
    /// (token id, bias), as sent (checked by [`plan`]).
    pub logit_bias: Vec<(u32, f32)>,
    /// `Some(k)`: report each output token's log probability and `k`
    /// alternatives.
    pub top_logprobs: Option<i32>,
    pub constraint: Option<Constraint>,
    /// The last this-many input tokens are output already written under
    /// `constraint` (a request moved mid-stream): it resumes after them.
    pub constrained_prefix_tokens: u32,
}

/// A Generate request translated from its protocol, not yet checked
/// against the model.
#[derive(Debug, Clone)]
pub struct Intake {
    pub request_id: String,
    pub input_ids: Vec<u32>,
    pub stream: bool,
    pub sampling: Sampling,
    /// Empty for decode, which receives the state instead.
    pub items: Vec<ItemSource>,
    /// How the prefix cache keys the items: content key and placeholder
    /// span of each (empty for decode).
    pub item_keys: Vec<ItemKey>,
    /// The KV room: produced here (prefill) or collected here (decode).
    pub kv: Option<KvAddress>,
    /// The LoRA adapter it runs under, by name (`None`: the base model):
    /// its prefix blocks are the adapter's own.
    pub lora: Option<String>,
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
    /// See [`Sampling::constrained_prefix_tokens`]: checked to leave a
    /// prompt before them, and only with a constraint.
    pub constrained_prefix_tokens: u32,
    pub items: Vec<ItemSource>,
    pub item_keys: Vec<ItemKey>,
    pub kv: Option<KvAddress>,
    /// See [`Intake::lora`].
    pub lora: Option<String>,
}

/// A data server and room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvAddress {
    pub host: String,
    pub port: u16,
    pub room: i64,
}

/// Checks `intake` against the model's `limits`.
pub fn plan(intake: Intake, limits: &Limits) -> Result<Plan, Status> {
    if intake.request_id.is_empty() {
        return Err(Status::invalid_argument("request_id must not be empty"));
    }
    check_prompt(&intake.input_ids, limits)?;
    let sampling = &intake.sampling;
    check_sampling(sampling)?;
    check_constrained_prefix(sampling, intake.input_ids.len())?;
    let prompt_len = intake.input_ids.len() as u32;
    let mut sequences = sequences(sampling, prompt_len, limits)?;
    let top_logprobs = logprobs(sampling.top_logprobs)?;
    sequences
        .iter_mut()
        .for_each(|s| s.top_logprobs = top_logprobs);
    Ok(Plan {
        request_id: intake.request_id,
        item_keys: intake.item_keys,
        input_ids: intake.input_ids,
        stream: intake.stream,
        sequences,
        constraint: intake.sampling.constraint,
        constrained_prefix_tokens: intake.sampling.constrained_prefix_tokens,
        items: intake.items,
        kv: intake.kv,
        lora: intake.lora,
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

/// A constrained prefix needs a constraint and a prompt before it.
fn check_constrained_prefix(p: &Sampling, input_len: usize) -> Result<(), Status> {
    let k = p.constrained_prefix_tokens as usize;
    if k == 0 {
        return Ok(());
    }
    if p.constraint.is_none() {
        return Err(Status::invalid_argument(
            "constrained_prefix_tokens is set but the request has no constraint",
        ));
    }
    if k >= input_len {
        return Err(Status::invalid_argument(format!(
            "constrained_prefix_tokens ({k}) leaves no prompt before it ({input_len} input tokens)"
        )));
    }
    Ok(())
}

fn check_sampling(p: &Sampling) -> Result<(), Status> {
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
    p: &Sampling,
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
    let logit_bias = logit_bias(&p.logit_bias, limits.vocab_size)?;
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
            seed: p.seed,
            index,
            logit_bias: logit_bias.clone(),
            top_logprobs: None,
        })
        .collect())
}

/// `logit_bias` sorted by token: ids inside the vocabulary, each once,
/// biases finite.
fn logit_bias(pairs: &[(u32, f32)], vocab_size: u32) -> Result<Vec<(u32, f32)>, Status> {
    if pairs.len() > MAX_LOGIT_BIAS {
        return Err(Status::invalid_argument(format!(
            "logit_bias has {} entries, at most {MAX_LOGIT_BIAS}",
            pairs.len()
        )));
    }
    let mut bias = pairs.to_vec();
    for &(id, value) in &bias {
        if id >= vocab_size {
            return Err(Status::invalid_argument(format!(
                "logit_bias key \"{id}\" is not a token id of the vocabulary (size {vocab_size})"
            )));
        }
        if !value.is_finite() {
            return Err(Status::invalid_argument(format!(
                "logit_bias[{id}] = {value} is not a finite number"
            )));
        }
    }
    bias.sort_unstable_by_key(|&(id, _)| id);
    if bias.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(Status::invalid_argument(
            "logit_bias names a token twice (keys must be plain decimal ids)",
        ));
    }
    Ok(bias)
}

/// `logit_bias` keyed by decimal token ids (TokenSpeed and SGLang).
pub fn decimal_bias<'a>(
    map: impl IntoIterator<Item = (&'a String, &'a f32)>,
) -> Result<Vec<(u32, f32)>, Status> {
    map.into_iter()
        .map(|(key, &value)| {
            key.parse::<u32>().map(|id| (id, value)).map_err(|_| {
                Status::invalid_argument(format!(
                    "logit_bias key {key:?} is not a token id of the vocabulary"
                ))
            })
        })
        .collect()
}

/// The number of alternatives to report per token, when logprobs are
/// asked; input logprobs are not produced.
fn logprobs(top: Option<i32>) -> Result<Option<u32>, Status> {
    match top {
        None => Ok(None),
        Some(k) => match u32::try_from(k) {
            Ok(k) if k <= MAX_TOP_LOGPROBS as u32 => Ok(Some(k)),
            _ => Err(Status::invalid_argument(format!(
                "top_logprobs_num must be in 0..={MAX_TOP_LOGPROBS}, got {k}"
            ))),
        },
    }
}

/// The KV room a prefill or decode worker needs from bootstrap parameters
/// (`field` names them in errors): none for an aggregated worker, required
/// for the others.
pub fn kv_address(
    info: Option<(String, i32, i64)>,
    role: Role,
    field: &str,
) -> Result<Option<KvAddress>, Status> {
    match (role, info) {
        (Role::Aggregated, Some(_)) => Err(Status::invalid_argument(format!(
            "{field} was sent to an aggregated worker; it is for prefill/decode workers"
        ))),
        (Role::Aggregated, None) => Ok(None),
        (Role::Prefill | Role::Decode, None) => Err(Status::invalid_argument(format!(
            "a {} worker needs {field} (the prefill's data server and the KV room)",
            role.as_str()
        ))),
        (Role::Prefill | Role::Decode, Some((host, port_value, room))) => {
            let port = port(port_value.into(), &format!("{field}.bootstrap_port"))?;
            if room < 0 {
                return Err(Status::invalid_argument(format!(
                    "{field}.bootstrap_room = {room} is negative; rooms are 63-bit non-negative"
                )));
            }
            if role == Role::Decode && host.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "{field}.bootstrap_host is empty"
                )));
            }
            Ok(Some(KvAddress { host, port, room }))
        }
    }
}

/// A TCP port from a wire integer (`field` names it in errors).
pub fn port(value: i64, field: &str) -> Result<u16, Status> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Status::invalid_argument(format!("{field} = {value} is not a valid port")))
}

/// Checks one tensor's shape, dtype and payload size (`what` names it).
pub fn check_tensor(what: &str, t: &TensorData) -> Result<(), Status> {
    tensor::validate(t)
        .map(|_| ())
        .map_err(|e| Status::invalid_argument(format!("{what}: {e}")))
}

/// Checks that every (offset, length) placeholder range lies inside the
/// prompt (`what` names the item).
pub fn check_placeholders(
    what: &str,
    ranges: impl IntoIterator<Item = (u32, u32)>,
    prompt_len: usize,
) -> Result<(), Status> {
    for (offset, length) in ranges {
        let end = u64::from(offset) + u64::from(length);
        if end > prompt_len as u64 {
            return Err(Status::invalid_argument(format!(
                "{what}: placeholder range {offset}..{end} lies outside the {prompt_len}-token prompt"
            )));
        }
    }
    Ok(())
}

/// The refusal of a field this engine cannot honour.
pub fn unsupported(field: &str, why: &str) -> Status {
    Status::unimplemented(format!("{field} is not supported by iris-engine: {why}"))
}
