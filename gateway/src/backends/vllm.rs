//! Iris's request in vLLM's protocol (`vllm.grpc.engine`), and vLLM's
//! responses back in Iris's.
//!
//! - Prompt: `tokenized`; sampling field by field (`top_p` and the
//!   penalties unset in Iris become vLLM's neutral values, `top_k` unset
//!   becomes 0, "no limit"); `no_stop_trim` is `include_stop_str_in_output`;
//!   constraints keep their kind (`ebnf_grammar` becomes `grammar`);
//!   `return_logprob` + `top_logprobs_num` become `logprobs`.
//! - Images: each item is one `MultimodalInputs` (the first in
//!   `mm_inputs`, the others in `extra_mm_inputs`): `pixel_values` keeps
//!   its lane (inline, shm or remote), `model_specific_tensors`,
//!   placeholders and `im_token_id` carry over, `mm_hashes` is the content
//!   hash in hex, once per placeholder; `encoder_input_key` names the
//!   pixels where vLLM's model code reads them under another name
//!   (Phi-4-multimodal's `image_pixel_values`).
//! - PD: `kv_transfer_params_json`, given by the caller (the prefill leg
//!   asks for remote decode, the decode leg passes on what prefill answered).
//!
//! Refused (UNIMPLEMENTED, naming the field): TokenSpeed's KV and encode
//! bootstrap info (vLLM's PD is prefill-then-decode; EPD needs TokenSpeed
//! workers), prompt log probabilities, `token_ids_logprob`,
//! `custom_params`. A seed or logit-bias key vLLM's types cannot hold is
//! INVALID_ARGUMENT.

use std::collections::HashMap;

use iris_proto::scheduler::{
    self as ts, generate_response, sampling_params::Constraint, tensor_data::Payload,
    GenerateRequest, GenerateResponse,
};
use iris_proto::vllm as v;
use tonic::Status;

use super::{cannot_carry, hash_hex, prompt_logprobs_requested, transcode, Backend};

const BACKEND: Backend = Backend::Vllm;

/// What a PD prefill leg is sent as `kv_transfer_params_json`: keep the
/// KV state for a remote decode and answer where it waits.
pub const REMOTE_DECODE: &str = r#"{"do_remote_decode":true}"#;

/// `request` in vLLM's form; `kv_transfer_params_json` is the PD leg's
/// KV-transfer parameters, if any.
pub fn request(
    request: &GenerateRequest,
    kv_transfer_params_json: Option<String>,
) -> Result<v::GenerateRequest, Status> {
    if request.kv_bootstrap_info.is_some() {
        return Err(cannot_carry(
            BACKEND,
            "kv_bootstrap_info",
            "vLLM's PD runs prefill then decode with kv_transfer_params_json",
        ));
    }
    if request.encode_bootstrap_info.is_some() {
        return Err(cannot_carry(
            BACKEND,
            "encode_bootstrap_info",
            "EPD needs TokenSpeed prefill workers",
        ));
    }
    if !request.token_ids_logprob.is_empty() {
        return Err(cannot_carry(
            BACKEND,
            "token_ids_logprob",
            "vLLM has no such field",
        ));
    }
    if !request.lora_id.is_empty() {
        return Err(cannot_carry(
            BACKEND,
            "lora_id",
            "vLLM's gRPC protocol has no LoRA fields",
        ));
    }
    if prompt_logprobs_requested(request.logprob_start_len) {
        return Err(cannot_carry(
            BACKEND,
            "logprob_start_len",
            "Iris asks no prompt log probabilities of vLLM",
        ));
    }
    let logprobs = request.return_logprob.then_some(request.top_logprobs_num);
    let sampling = sampling(
        request
            .sampling_params
            .as_ref()
            .unwrap_or(&ts::SamplingParams::default()),
        logprobs,
    )?;
    let mut items = request
        .mm_inputs
        .as_ref()
        .map(|m| m.items.iter().map(mm_inputs).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter();
    Ok(v::GenerateRequest {
        request_id: request.request_id.clone(),
        input: Some(v::generate_request::Input::Tokenized(v::TokenizedInput {
            original_text: String::new(),
            input_ids: request
                .tokenized
                .as_ref()
                .map(|t| t.input_ids.clone())
                .unwrap_or_default(),
        })),
        sampling_params: Some(sampling),
        stream: request.stream,
        mm_inputs: items.next(),
        extra_mm_inputs: items.collect(),
        kv_transfer_params_json,
        data_parallel_rank: request.data_parallel_rank,
        ..v::GenerateRequest::default()
    })
}

/// Iris's sampling parameters in vLLM's form, with `logprobs` (top-k per
/// token) when output log probabilities are asked for.
fn sampling(s: &ts::SamplingParams, logprobs: Option<i32>) -> Result<v::SamplingParams, Status> {
    if s.custom_params
        .as_ref()
        .is_some_and(|p| !p.fields.is_empty())
    {
        return Err(cannot_carry(
            BACKEND,
            "custom_params",
            "vLLM has no such field",
        ));
    }
    let seed = s
        .sampling_seed
        .map(|seed| {
            i32::try_from(seed).map_err(|_| {
                Status::invalid_argument(format!(
                    "seed {seed} does not fit the vLLM backend's int32 seed"
                ))
            })
        })
        .transpose()?;
    Ok(v::SamplingParams {
        temperature: s.temperature,
        top_p: s.top_p.unwrap_or(1.0),
        top_k: s.top_k.map_or(0, |k| u32::try_from(k).unwrap_or(0)),
        min_p: s.min_p.unwrap_or(0.0),
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        repetition_penalty: s.repetition_penalty.unwrap_or(1.0),
        max_tokens: s.max_new_tokens,
        min_tokens: s.min_new_tokens,
        stop: s.stop.clone(),
        stop_token_ids: s.stop_token_ids.clone(),
        skip_special_tokens: s.skip_special_tokens,
        spaces_between_special_tokens: s.spaces_between_special_tokens,
        ignore_eos: s.ignore_eos,
        n: s.n,
        logprobs,
        seed,
        include_stop_str_in_output: s.no_stop_trim,
        logit_bias: logit_bias(&s.logit_bias)?,
        constraint: s.constraint.clone().map(constraint),
        ..v::SamplingParams::default()
    })
}

/// Iris's logit bias (token ids as strings) with vLLM's int32 keys.
fn logit_bias(bias: &HashMap<String, f32>) -> Result<HashMap<i32, f32>, Status> {
    bias.iter()
        .map(|(token, value)| {
            let id = token.parse::<i32>().map_err(|_| {
                Status::invalid_argument(format!("logit_bias key {token:?} is not a token id"))
            })?;
            Ok((id, *value))
        })
        .collect()
}

fn constraint(c: Constraint) -> v::sampling_params::Constraint {
    use v::sampling_params::Constraint as V;
    match c {
        Constraint::Regex(r) => V::Regex(r),
        Constraint::JsonSchema(s) => V::JsonSchema(s),
        Constraint::EbnfGrammar(g) => V::Grammar(g),
        Constraint::StructuralTag(t) => V::StructuralTag(t),
    }
}

/// One image as a vLLM batch of one item.
fn mm_inputs(item: &ts::MultimodalItem) -> v::MultimodalInputs {
    let hash = hash_hex(&item.content_hash);
    v::MultimodalInputs {
        pixel_values: item.encoder_input.as_ref().map(tensor),
        model_specific_tensors: item
            .model_specific_tensors
            .iter()
            .map(|(key, t)| (key.clone(), tensor(t)))
            .collect(),
        im_token_id: item.placeholder_token_id,
        mm_placeholders: item
            .placeholders
            .iter()
            .map(|p| v::PlaceholderRange {
                offset: p.offset,
                length: p.length,
            })
            .collect(),
        mm_hashes: item.placeholders.iter().map(|_| hash.clone()).collect(),
        modality: item.modality,
        encoder_input_key: encoder_input_key(item),
        ..v::MultimodalInputs::default()
    }
}

/// The name vLLM's model code reads an item's pixels under, when it is
/// not `pixel_values`: `image_pixel_values` for Phi-4-multimodal
/// (`Phi4MultimodalForCausalLM`, which reads it beside `image_sizes`,
/// `image_attention_mask` and `num_img_tokens`), the one family whose
/// items carry an `image_attention_mask`.
fn encoder_input_key(item: &ts::MultimodalItem) -> Option<String> {
    item.model_specific_tensors
        .contains_key("image_attention_mask")
        .then(|| "image_pixel_values".to_owned())
}

/// A tensor with its payload on the same lane.
fn tensor(t: &ts::TensorData) -> v::TensorData {
    use v::tensor_data::Payload as V;
    v::TensorData {
        shape: t.shape.clone(),
        dtype: t.dtype.clone(),
        payload: t.payload.clone().map(|p| match p {
            Payload::Inline(bytes) => V::Inline(bytes),
            Payload::Shm(handle) => V::Shm(handle),
            Payload::Remote(handle) => V::Remote(handle),
        }),
    }
}

/// vLLM's response in Iris's form (`request_id` is the request's: vLLM's
/// responses carry none).
pub fn response(
    request_id: &str,
    response: v::GenerateResponse,
) -> Result<GenerateResponse, Status> {
    use v::generate_response::Response as V;
    let mapped = match response.response {
        Some(V::Chunk(c)) => generate_response::Response::Chunk(ts::GenerateStreamChunk {
            token_ids: c.token_ids,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.output_logprobs.as_ref().map(transcode).transpose()?,
            index: c.index,
        }),
        Some(V::Complete(c)) => generate_response::Response::Complete(complete(c)?),
        None => return Err(Status::internal("the vLLM worker sent an empty response")),
    };
    Ok(GenerateResponse {
        request_id: request_id.to_owned(),
        response: Some(mapped),
    })
}

fn complete(c: v::GenerateComplete) -> Result<ts::GenerateComplete, Status> {
    use ts::generate_complete::MatchedStop as T;
    use v::generate_complete::MatchedStop as V;
    Ok(ts::GenerateComplete {
        output_ids: c.output_ids,
        finish_reason: c.finish_reason,
        prompt_tokens: c.prompt_tokens,
        completion_tokens: c.completion_tokens,
        cached_tokens: c.cached_tokens,
        output_logprobs: c.output_logprobs.as_ref().map(transcode).transpose()?,
        matched_stop: c.matched_stop.map(|m| match m {
            V::MatchedTokenId(id) => T::MatchedTokenId(id),
            V::MatchedStopStr(s) => T::MatchedStopStr(s),
        }),
        index: c.index,
    })
}

/// The KV-transfer parameters a vLLM prefill leg answered with, from its
/// final response.
pub fn kv_transfer_params(response: &v::GenerateResponse) -> Option<String> {
    match &response.response {
        Some(v::generate_response::Response::Complete(c)) => c.kv_transfer_params_json.clone(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_proto::common::{Modality, ShmHandle};
    use iris_proto::scheduler::{
        KvBootstrapInfo, MultimodalInputs, MultimodalItem, PlaceholderRange, TensorData,
        TokenizedInput,
    };

    fn base() -> GenerateRequest {
        GenerateRequest {
            request_id: "r1".into(),
            tokenized: Some(TokenizedInput {
                input_ids: vec![1, 2, 3],
                original_text: String::new(),
            }),
            sampling_params: Some(ts::SamplingParams {
                temperature: Some(0.5),
                top_k: Some(-1),
                max_new_tokens: Some(8),
                min_new_tokens: 2,
                stop: vec!["END".into()],
                stop_token_ids: vec![9],
                n: 2,
                sampling_seed: Some(42),
                logit_bias: [("5".to_owned(), -100.0)].into(),
                no_stop_trim: true,
                constraint: Some(Constraint::EbnfGrammar("root ::= \"a\"".into())),
                ..ts::SamplingParams::default()
            }),
            return_logprob: true,
            top_logprobs_num: 3,
            logprob_start_len: Some(-1),
            stream: true,
            ..GenerateRequest::default()
        }
    }

    #[test]
    fn sampling_and_prompt_carry_over() {
        let r = request(&base(), None).unwrap();
        assert_eq!(r.request_id, "r1");
        match r.input {
            Some(v::generate_request::Input::Tokenized(t)) => assert_eq!(t.input_ids, [1, 2, 3]),
            other => panic!("{other:?}"),
        }
        let s = r.sampling_params.unwrap();
        assert_eq!(s.temperature, Some(0.5));
        assert_eq!((s.top_p, s.top_k, s.repetition_penalty), (1.0, 0, 1.0));
        assert_eq!((s.max_tokens, s.min_tokens, s.n), (Some(8), 2, 2));
        assert_eq!(s.stop, ["END"]);
        assert_eq!(s.stop_token_ids, [9]);
        assert_eq!((s.seed, s.logprobs), (Some(42), Some(3)));
        assert_eq!(s.logit_bias.get(&5), Some(&-100.0));
        assert!(s.include_stop_str_in_output);
        assert_eq!(
            s.constraint,
            Some(v::sampling_params::Constraint::Grammar(
                "root ::= \"a\"".into()
            ))
        );
        assert!(r.stream);
        assert_eq!(r.kv_transfer_params_json, None);
    }

    #[test]
    fn no_logprobs_unless_asked() {
        let mut req = base();
        req.return_logprob = false;
        let s = request(&req, None).unwrap().sampling_params.unwrap();
        assert_eq!(s.logprobs, None);
    }

    #[test]
    fn images_become_one_batch_each_with_hashes_per_placeholder() {
        let item = |hash: u8, offset| MultimodalItem {
            modality: Modality::Image as i32,
            content_hash: vec![hash, 0xff].into(),
            encoder_input: Some(TensorData {
                shape: vec![4, 6],
                dtype: "float32".into(),
                payload: Some(Payload::Shm(ShmHandle {
                    name: "/iris-x".into(),
                    nbytes: 96,
                    ..ShmHandle::default()
                })),
            }),
            model_specific_tensors: [(
                "image_grid_thw".to_owned(),
                TensorData {
                    shape: vec![1, 3],
                    dtype: "int64".into(),
                    payload: Some(Payload::Inline(vec![0u8; 24].into())),
                },
            )]
            .into(),
            placeholders: vec![PlaceholderRange { offset, length: 4 }],
            placeholder_token_id: Some(77),
        };
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs {
            items: vec![item(1, 3), item(2, 9)],
        });
        let r = request(&req, Some("{\"do_remote_decode\":true}".into())).unwrap();
        let first = r.mm_inputs.unwrap();
        assert_eq!(first.mm_hashes, ["01ff"]);
        assert_eq!(first.im_token_id, Some(77));
        assert_eq!(first.mm_placeholders[0].offset, 3);
        assert_eq!(first.modality, Modality::Image as i32);
        let pixels = first.pixel_values.unwrap();
        assert_eq!(
            (pixels.shape, pixels.dtype.as_str()),
            (vec![4, 6], "float32")
        );
        assert!(
            matches!(pixels.payload, Some(v::tensor_data::Payload::Shm(h)) if h.name == "/iris-x")
        );
        let grid = &first.model_specific_tensors["image_grid_thw"];
        assert_eq!(grid.shape, [1, 3]);
        assert_eq!(first.encoder_input_key, None);
        assert_eq!(r.extra_mm_inputs.len(), 1);
        assert_eq!(r.extra_mm_inputs[0].mm_hashes, ["02ff"]);
        assert_eq!(
            r.kv_transfer_params_json.as_deref(),
            Some("{\"do_remote_decode\":true}")
        );
    }

    /// A Phi-4-multimodal item (its `image_attention_mask`) names its
    /// pixels as vLLM's model code reads them.
    #[test]
    fn phi4_pixels_go_as_image_pixel_values() {
        let mask = TensorData {
            shape: vec![2, 32, 32],
            dtype: "float32".into(),
            payload: Some(Payload::Inline(vec![0u8; 8192].into())),
        };
        let item = MultimodalItem {
            model_specific_tensors: [("image_attention_mask".to_owned(), mask)].into(),
            ..MultimodalItem::default()
        };
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs { items: vec![item] });
        let first = request(&req, None).unwrap().mm_inputs.unwrap();
        assert_eq!(
            first.encoder_input_key.as_deref(),
            Some("image_pixel_values")
        );
        assert_eq!(
            first.model_specific_tensors["image_attention_mask"].shape,
            [2, 32, 32]
        );
    }

    #[test]
    fn what_vllm_cannot_carry_is_refused_by_name() {
        let refused = |req: GenerateRequest, field: &str| {
            let status = request(&req, None).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unimplemented, "{field}");
            assert!(status.message().contains(field), "{}", status.message());
        };
        let mut req = base();
        req.kv_bootstrap_info = Some(KvBootstrapInfo::default());
        refused(req, "kv_bootstrap_info");
        let mut req = base();
        req.encode_bootstrap_info = Some(Default::default());
        refused(req, "encode_bootstrap_info");
        let mut req = base();
        req.logprob_start_len = Some(0);
        refused(req, "logprob_start_len");
        let mut req = base();
        req.token_ids_logprob = vec![1];
        refused(req, "token_ids_logprob");
        let mut req = base();
        if let Some(s) = req.sampling_params.as_mut() {
            s.sampling_seed = Some(1 << 40);
        }
        let status = request(&req, None).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("seed"));
        let mut req = base();
        if let Some(s) = req.sampling_params.as_mut() {
            s.logit_bias = [("x".to_owned(), 1.0)].into();
        }
        assert!(request(&req, None)
            .unwrap_err()
            .message()
            .contains("logit_bias"));
    }

    #[test]
    fn responses_map_back_with_the_request_id() {
        let chunk = v::GenerateResponse {
            response: Some(v::generate_response::Response::Chunk(
                v::GenerateStreamChunk {
                    token_ids: vec![4, 5],
                    prompt_tokens: 3,
                    completion_tokens: 2,
                    cached_tokens: 1,
                    index: 1,
                    output_logprobs: Some(v::OutputLogProbs {
                        token_logprobs: vec![-0.1, -0.2],
                        token_ids: vec![4, 5],
                        top_logprobs: vec![],
                    }),
                    ..v::GenerateStreamChunk::default()
                },
            )),
        };
        let mapped = response("r1", chunk).unwrap();
        assert_eq!(mapped.request_id, "r1");
        match mapped.response {
            Some(generate_response::Response::Chunk(c)) => {
                assert_eq!((c.token_ids, c.prompt_tokens, c.index), (vec![4, 5], 3, 1));
                assert_eq!(c.output_logprobs.unwrap().token_logprobs, [-0.1, -0.2]);
            }
            other => panic!("{other:?}"),
        }
        let done = v::GenerateResponse {
            response: Some(v::generate_response::Response::Complete(
                v::GenerateComplete {
                    output_ids: vec![4, 5],
                    finish_reason: "stop".into(),
                    completion_tokens: 2,
                    matched_stop: Some(v::generate_complete::MatchedStop::MatchedTokenId(9)),
                    kv_transfer_params_json: Some("{}".into()),
                    ..v::GenerateComplete::default()
                },
            )),
        };
        assert_eq!(kv_transfer_params(&done).as_deref(), Some("{}"));
        match response("r1", done).unwrap().response {
            Some(generate_response::Response::Complete(c)) => {
                assert_eq!((c.finish_reason.as_str(), c.completion_tokens), ("stop", 2));
                assert_eq!(
                    c.matched_stop,
                    Some(ts::generate_complete::MatchedStop::MatchedTokenId(9))
                );
            }
            other => panic!("{other:?}"),
        }
        let empty = response("r1", v::GenerateResponse { response: None }).unwrap_err();
        assert_eq!(empty.code(), tonic::Code::Internal);
    }
}
