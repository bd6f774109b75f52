//! Iris's request in vLLM's protocol (`vllm.grpc.engine`), and vLLM's
//! responses back in Iris's.
//!
//! - Prompt: `tokenized`; sampling field by field (`top_p` and the
//!   penalties unset in Iris become vLLM's neutral values, `top_k` unset
//!   becomes 0, "no limit"); `no_stop_trim` is `include_stop_str_in_output`;
//!   constraints keep their kind (`ebnf_grammar` becomes `grammar`);
//!   `return_logprob` + `top_logprobs_num` become `logprobs`.
//! - Images and videos: one `MultimodalInputs` per modality (the first in
//!   `mm_inputs`, the next in `extra_mm_inputs`), every item's tensors
//!   joined in the layout vLLM's model code gives the family, with
//!   `batched_keys` and `flat_keys` ([`super::batch`]);
//!   `im_token_id` carries over, one placeholder range and one
//!   `mm_hashes` entry (the content hash in hex) per item;
//!   `encoder_input_key` names the pixels where vLLM's model code reads
//!   them under another name (Phi-4-multimodal's `image_pixel_values`). A
//!   batch of one item keeps its pixels' lane (inline, shm or remote) and
//!   bytes; a batch of several is joined from inline bytes, on the
//!   blocking pool when large ([`translate`]).
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

use super::batch::{self, Batch};
use super::{cannot_carry, hash_hex, prompt_logprobs_requested, transcode, Backend};

const BACKEND: Backend = Backend::Vllm;

/// What a PD prefill leg is sent as `kv_transfer_params_json`: keep the
/// KV state for a remote decode and answer where it waits.
pub const REMOTE_DECODE: &str = r#"{"do_remote_decode":true}"#;

/// [`request`], on the blocking pool when it joins many bytes of several
/// items' tensors.
pub async fn translate(
    request: &GenerateRequest,
    kv_transfer_params_json: Option<String>,
) -> Result<v::GenerateRequest, Status> {
    let items = request.mm_inputs.as_ref().map_or(&[][..], |m| &m.items);
    if batch::copied_bytes(items) < batch::BLOCKING_JOIN_BYTES {
        return self::request(request, kv_transfer_params_json);
    }
    let owned = request.clone();
    tokio::task::spawn_blocking(move || self::request(&owned, kv_transfer_params_json))
        .await
        .map_err(|e| Status::internal(format!("joining the vLLM batches failed: {e}")))?
}

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
    let items = request.mm_inputs.as_ref().map_or(&[][..], |m| &m.items);
    let mut batches = batch::by_modality(items)
        .into_iter()
        .map(|group| mm_inputs(&group))
        .collect::<Result<Vec<_>, Status>>()?
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
        mm_inputs: batches.next(),
        extra_mm_inputs: batches.collect(),
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

/// One modality's items (prompt order) as one vLLM batch.
fn mm_inputs(items: &[&ts::MultimodalItem]) -> Result<v::MultimodalInputs, Status> {
    let Batch {
        modality,
        pixels,
        pixel_key,
        tensors,
        batched_keys,
        flat_keys,
        keep_on_cpu_keys,
        placeholders,
        placeholder_token,
    } = batch::batch(items, BACKEND)?;
    Ok(v::MultimodalInputs {
        pixel_values: pixels.as_ref().map(tensor),
        model_specific_tensors: tensors
            .iter()
            .map(|(key, t)| (key.clone(), tensor(t)))
            .collect(),
        im_token_id: placeholder_token,
        mm_placeholders: placeholders
            .iter()
            .map(|&(offset, length)| v::PlaceholderRange { offset, length })
            .collect(),
        mm_hashes: items
            .iter()
            .filter(|item| !item.placeholders.is_empty())
            .map(|item| hash_hex(&item.content_hash))
            .collect(),
        batched_keys,
        flat_keys,
        keep_on_cpu_keys,
        modality,
        encoder_input_key: (pixel_key != "pixel_values").then_some(pixel_key),
    })
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

    /// An inline tensor of `shape` whose bytes count up from `seed`.
    fn data(shape: &[u32], dtype: &str, seed: u8) -> TensorData {
        let elem = iris_proto::tensor::DType::parse(dtype).unwrap().size();
        let len = shape.iter().map(|&d| d as usize).product::<usize>() * elem;
        let bytes: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8) | 1).collect();
        TensorData {
            shape: shape.to_vec(),
            dtype: dtype.into(),
            payload: Some(Payload::Inline(bytes.into())),
        }
    }

    fn ints(shape: &[u32], values: &[i64]) -> TensorData {
        iris_proto::tensor::int64(shape.to_vec(), values)
    }

    fn item(
        pixels: TensorData,
        tensors: Vec<(&str, TensorData)>,
        runs: &[(u32, u32)],
        hash: u8,
    ) -> MultimodalItem {
        MultimodalItem {
            modality: Modality::Image as i32,
            content_hash: vec![hash, 0xff].into(),
            encoder_input: Some(pixels),
            model_specific_tensors: tensors
                .into_iter()
                .map(|(k, t)| (k.to_owned(), t))
                .collect(),
            placeholders: runs
                .iter()
                .map(|&(offset, length)| PlaceholderRange { offset, length })
                .collect(),
            placeholder_token_id: Some(77),
        }
    }

    /// What `items` are sent as: the one batch (there is no other).
    fn one_batch(items: Vec<MultimodalItem>) -> v::MultimodalInputs {
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs { items });
        let r = request(&req, None).unwrap();
        assert!(r.extra_mm_inputs.is_empty(), "one modality, one batch");
        r.mm_inputs.unwrap()
    }

    fn bytes(t: &v::TensorData) -> &[u8] {
        match &t.payload {
            Some(v::tensor_data::Payload::Inline(b)) => b,
            other => panic!("{other:?}"),
        }
    }

    fn values(t: &v::TensorData) -> Vec<i64> {
        assert_eq!(t.dtype, "int64");
        bytes(t)
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn inline(t: &TensorData) -> &[u8] {
        match &t.payload {
            Some(Payload::Inline(b)) => b,
            other => panic!("{other:?}"),
        }
    }

    fn sorted(keys: &[String]) -> Vec<&str> {
        let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        keys.sort_unstable();
        keys
    }

    fn flat(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Qwen2-VL: patch rows concatenated, flat by per-item counts the
    /// batch carries (batched, as the grid); a range and a hash per item.
    #[test]
    fn qwen_items_are_one_flat_batch_with_patch_counts() {
        let a = data(&[16, 8], "bfloat16", 1);
        let b = data(&[4, 8], "bfloat16", 9);
        let first = item(
            a.clone(),
            vec![("image_grid_thw", ints(&[1, 3], &[1, 4, 4]))],
            &[(3, 4)],
            1,
        );
        let second = item(
            b.clone(),
            vec![("image_grid_thw", ints(&[1, 3], &[1, 2, 2]))],
            &[(9, 1)],
            2,
        );
        let batch = one_batch(vec![first, second]);
        let pixels = batch.pixel_values.as_ref().unwrap();
        assert_eq!(
            (pixels.shape.as_slice(), pixels.dtype.as_str()),
            (&[20, 8][..], "bfloat16")
        );
        assert_eq!(bytes(pixels), [inline(&a), inline(&b)].concat());
        let grid = &batch.model_specific_tensors["image_grid_thw"];
        assert_eq!(
            (grid.shape.as_slice(), values(grid)),
            (&[2, 3][..], vec![1, 4, 4, 1, 2, 2])
        );
        let counts = &batch.model_specific_tensors["image_patch_counts"];
        assert_eq!(
            (counts.shape.as_slice(), values(counts)),
            (&[2][..], vec![16, 4])
        );
        assert_eq!(
            batch.flat_keys,
            flat(&[("pixel_values", "image_patch_counts")])
        );
        assert_eq!(
            sorted(&batch.batched_keys),
            ["image_grid_thw", "image_patch_counts"]
        );
        assert_eq!(batch.keep_on_cpu_keys, ["image_grid_thw"]);
        let ranges: Vec<(u32, u32)> = batch
            .mm_placeholders
            .iter()
            .map(|p| (p.offset, p.length))
            .collect();
        assert_eq!(ranges, [(3, 4), (9, 1)]);
        assert_eq!(batch.mm_hashes, ["01ff", "02ff"]);
        assert_eq!(
            (batch.im_token_id, batch.encoder_input_key),
            (Some(77), None)
        );
    }

    /// A single item's pixels go as they are: the same bytes (no copy),
    /// the same lane; only the shape gains vLLM's item dimension where the
    /// family's has one.
    #[test]
    fn one_item_passes_its_tensors_through() {
        let pixels = data(&[3, 4, 4], "float32", 5);
        let batch = one_batch(vec![item(pixels.clone(), vec![], &[(1, 2)], 1)]);
        let sent = batch.pixel_values.as_ref().unwrap();
        assert_eq!(sent.shape, [1, 3, 4, 4], "LLaVA-1.5's batch dimension");
        assert_eq!(bytes(sent).as_ptr(), inline(&pixels).as_ptr(), "not copied");
        assert_eq!(sorted(&batch.batched_keys), ["pixel_values"]);
        let shm = TensorData {
            payload: Some(Payload::Shm(ShmHandle {
                name: "/iris-x".into(),
                nbytes: 16 * 8 * 2,
                ..ShmHandle::default()
            })),
            ..data(&[16, 8], "bfloat16", 1)
        };
        let grid = ints(&[1, 3], &[1, 4, 4]);
        let batch = one_batch(vec![item(
            shm,
            vec![("image_grid_thw", grid)],
            &[(3, 4)],
            1,
        )]);
        let sent = batch.pixel_values.unwrap();
        assert_eq!(sent.shape, [16, 8]);
        assert!(
            matches!(sent.payload, Some(v::tensor_data::Payload::Shm(h)) if h.name == "/iris-x")
        );
        assert_eq!(
            values(&batch.model_specific_tensors["image_patch_counts"]),
            [16]
        );
    }

    /// Several items need their bytes inline: a pixel tensor on the shm
    /// lane is refused, naming its lane, never dropped.
    #[test]
    fn several_items_off_the_inline_lane_are_refused() {
        let mut shm = data(&[3, 4, 4], "float32", 5);
        shm.payload = Some(Payload::Shm(ShmHandle::default()));
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs {
            items: vec![
                item(data(&[3, 4, 4], "float32", 1), vec![], &[(1, 2)], 1),
                item(shm, vec![], &[(4, 2)], 2),
            ],
        });
        let status = request(&req, None).unwrap_err();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(
            status.message().contains("shared memory"),
            "{}",
            status.message()
        );
    }

    /// Image and video: one batch per modality, the video's pixels flat by
    /// its own counts, `second_per_grid_ts` batched.
    #[test]
    fn image_and_video_go_as_one_batch_each() {
        let image = item(
            data(&[4, 8], "bfloat16", 1),
            vec![("image_grid_thw", ints(&[1, 3], &[1, 2, 2]))],
            &[(2, 1)],
            1,
        );
        let mut video = item(
            data(&[8, 8], "bfloat16", 2),
            vec![
                ("video_grid_thw", ints(&[1, 3], &[2, 2, 2])),
                (
                    "second_per_grid_ts",
                    iris_proto::tensor::float32(vec![1], &[1.0]),
                ),
            ],
            &[(5, 2)],
            2,
        );
        video.modality = Modality::Video as i32;
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs {
            items: vec![image.clone(), video, image],
        });
        let r = request(&req, None).unwrap();
        let images = r.mm_inputs.unwrap();
        assert_eq!(
            images.pixel_values.unwrap().shape,
            [8, 8],
            "both images in one batch"
        );
        assert_eq!(r.extra_mm_inputs.len(), 1);
        let videos = &r.extra_mm_inputs[0];
        assert_eq!(videos.modality, Modality::Video as i32);
        assert_eq!(
            videos.flat_keys,
            flat(&[("pixel_values", "video_patch_counts")])
        );
        assert_eq!(
            sorted(&videos.batched_keys),
            ["second_per_grid_ts", "video_grid_thw", "video_patch_counts"]
        );
        assert_eq!(
            videos.model_specific_tensors["second_per_grid_ts"].shape,
            [1]
        );
    }

    /// LLaVA-NeXT / OneVision: items stacked under a new dimension, the
    /// fewer tiles padded with zero tiles as Hugging Face pads them;
    /// `image_sizes` `[n, 2]`; all batched.
    #[test]
    fn anyres_items_stack_padded_with_image_sizes() {
        let a = data(&[2, 3, 2, 2], "float32", 1);
        let b = data(&[3, 3, 2, 2], "float32", 7);
        let batch = one_batch(vec![
            item(
                a.clone(),
                vec![("image_sizes", ints(&[1, 2], &[30, 40]))],
                &[(1, 5)],
                1,
            ),
            item(
                b.clone(),
                vec![("image_sizes", ints(&[1, 2], &[50, 20]))],
                &[(8, 5)],
                2,
            ),
        ]);
        let pixels = batch.pixel_values.as_ref().unwrap();
        assert_eq!(pixels.shape, [2, 3, 3, 2, 2]);
        let tile = 3 * 2 * 2 * 4;
        assert_eq!(
            bytes(pixels),
            [inline(&a), &vec![0; tile][..], inline(&b)].concat()
        );
        let sizes = &batch.model_specific_tensors["image_sizes"];
        assert_eq!(
            (sizes.shape.as_slice(), values(sizes)),
            (&[2, 2][..], vec![30, 40, 50, 20])
        );
        assert_eq!(sorted(&batch.batched_keys), ["image_sizes", "pixel_values"]);
        assert!(batch.flat_keys.is_empty());
    }

    /// Gemma 3: crops concatenated, flat by `num_patches` (the
    /// crops of each item, batched); an item's runs make one range.
    #[test]
    fn crop_items_are_flat_by_num_patches_with_one_range_each() {
        let batch = one_batch(vec![
            item(
                data(&[2, 3, 4, 4], "bfloat16", 1),
                vec![],
                &[(3, 4), (10, 4)],
                1,
            ),
            item(data(&[1, 3, 4, 4], "bfloat16", 2), vec![], &[(20, 4)], 2),
        ]);
        assert_eq!(batch.pixel_values.unwrap().shape, [3, 3, 4, 4]);
        assert_eq!(values(&batch.model_specific_tensors["num_patches"]), [2, 1]);
        assert_eq!(batch.flat_keys, flat(&[("pixel_values", "num_patches")]));
        assert_eq!(sorted(&batch.batched_keys), ["num_patches"]);
        let ranges: Vec<(u32, u32)> = batch
            .mm_placeholders
            .iter()
            .map(|p| (p.offset, p.length))
            .collect();
        assert_eq!(ranges, [(3, 11), (20, 4)]);
        assert_eq!(batch.mm_hashes.len(), 2, "one hash per item");
    }

    /// Idefics3 / SmolVLM: frames and their `pixel_attention_mask` both
    /// concatenated, flat by `num_patches` (frames per item, batched); one
    /// item's mask passes through as it is.
    #[test]
    fn idefics3_pixel_masks_are_flat_by_num_patches_with_the_frames() {
        let mask = |frames, seed| data(&[frames, 4, 4], "uint8", seed);
        let idefics = |frames, offset, seed| {
            item(
                data(&[frames, 3, 4, 4], "bfloat16", seed),
                vec![("pixel_attention_mask", mask(frames, seed))],
                &[(offset, 4)],
                seed,
            )
        };
        let keys = flat(&[
            ("pixel_values", "num_patches"),
            ("pixel_attention_mask", "num_patches"),
        ]);
        let one = one_batch(vec![idefics(2, 3, 1)]);
        let only = &one.model_specific_tensors["pixel_attention_mask"];
        assert_eq!(
            (only.shape.as_slice(), only.dtype.as_str()),
            (&[2, 4, 4][..], "uint8")
        );
        assert_eq!(bytes(only), inline(&mask(2, 1)));
        assert_eq!(values(&one.model_specific_tensors["num_patches"]), [2]);
        assert_eq!(one.flat_keys, keys);
        assert_eq!(sorted(&one.batched_keys), ["num_patches"]);

        let two = one_batch(vec![idefics(2, 3, 1), idefics(3, 10, 2)]);
        assert_eq!(two.pixel_values.unwrap().shape, [5, 3, 4, 4]);
        let joined = &two.model_specific_tensors["pixel_attention_mask"];
        assert_eq!(
            (joined.shape.as_slice(), joined.dtype.as_str()),
            (&[5, 4, 4][..], "uint8")
        );
        assert_eq!(
            bytes(joined),
            [inline(&mask(2, 1)), inline(&mask(3, 2))].concat()
        );
        assert_eq!(values(&two.model_specific_tensors["num_patches"]), [2, 3]);
        assert_eq!(two.flat_keys, keys);
        assert_eq!(sorted(&two.batched_keys), ["num_patches"]);
    }

    /// InternVL: patches flat by the items' own `image_num_patches`.
    #[test]
    fn internvl_items_are_flat_by_image_num_patches() {
        let batch = one_batch(vec![
            item(
                data(&[3, 3, 4, 4], "bfloat16", 1),
                vec![("image_num_patches", ints(&[1], &[3]))],
                &[(1, 6)],
                1,
            ),
            item(
                data(&[1, 3, 4, 4], "bfloat16", 2),
                vec![("image_num_patches", ints(&[1], &[1]))],
                &[(9, 2)],
                2,
            ),
        ]);
        assert_eq!(batch.pixel_values.unwrap().shape, [4, 3, 4, 4]);
        let patches = &batch.model_specific_tensors["image_num_patches"];
        assert_eq!(
            (patches.shape.as_slice(), values(patches)),
            (&[2][..], vec![3, 1])
        );
        assert_eq!(
            batch.flat_keys,
            flat(&[("pixel_values", "image_num_patches")])
        );
        assert_eq!(sorted(&batch.batched_keys), ["image_num_patches"]);
    }

    /// Pixtral: images of one size stack `[n, 3, H, W]` with
    /// `image_sizes`; of different sizes they are refused by name (vLLM
    /// would read the padding as image).
    #[test]
    fn pixtral_items_stack_when_of_one_size() {
        let sizes = |h, w| ("image_sizes", ints(&[1, 2], &[h, w]));
        let batch = one_batch(vec![
            item(
                data(&[3, 4, 8], "bfloat16", 1),
                vec![sizes(4, 8)],
                &[(1, 1), (3, 2)],
                1,
            ),
            item(
                data(&[3, 4, 8], "bfloat16", 2),
                vec![sizes(4, 8)],
                &[(6, 1), (8, 2)],
                2,
            ),
        ]);
        assert_eq!(batch.pixel_values.unwrap().shape, [2, 3, 4, 8]);
        assert_eq!(
            values(&batch.model_specific_tensors["image_sizes"]),
            [4, 8, 4, 8]
        );
        assert_eq!(sorted(&batch.batched_keys), ["image_sizes", "pixel_values"]);
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs {
            items: vec![
                item(
                    data(&[3, 4, 8], "bfloat16", 1),
                    vec![sizes(4, 8)],
                    &[(1, 2)],
                    1,
                ),
                item(
                    data(&[3, 8, 4], "bfloat16", 2),
                    vec![sizes(8, 4)],
                    &[(6, 2)],
                    2,
                ),
            ],
        });
        let status = request(&req, None).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert!(
            status
                .message()
                .contains("Pixtral images of different sizes"),
            "{}",
            status.message()
        );
    }

    /// Llama 4: frames flat by `patches_per_image`; `aspect_ratios`
    /// `[n, 2]`; both batched.
    #[test]
    fn llama4_items_are_flat_by_patches_per_image() {
        let tensors = |frames, rows, cols| {
            vec![
                ("aspect_ratios", ints(&[1, 2], &[rows, cols])),
                ("patches_per_image", ints(&[1], &[frames])),
            ]
        };
        let batch = one_batch(vec![
            item(
                data(&[3, 3, 4, 4], "bfloat16", 1),
                tensors(3, 1, 2),
                &[(1, 2), (3, 2), (5, 2)],
                1,
            ),
            item(
                data(&[1, 3, 4, 4], "bfloat16", 2),
                tensors(1, 1, 1),
                &[(9, 2)],
                2,
            ),
        ]);
        assert_eq!(batch.pixel_values.unwrap().shape, [4, 3, 4, 4]);
        assert_eq!(
            values(&batch.model_specific_tensors["patches_per_image"]),
            [3, 1]
        );
        let ratios = &batch.model_specific_tensors["aspect_ratios"];
        assert_eq!(
            (ratios.shape.as_slice(), values(ratios)),
            (&[2, 2][..], vec![1, 2, 1, 1])
        );
        assert_eq!(
            batch.flat_keys,
            flat(&[("pixel_values", "patches_per_image")])
        );
        assert_eq!(
            sorted(&batch.batched_keys),
            ["aspect_ratios", "patches_per_image"]
        );
    }

    /// Phi-4-multimodal: `image_pixel_values` and the mask stacked and
    /// padded to the most crops (pixels with zeros, the mask with ones),
    /// `image_sizes` and `num_img_tokens` one row each; all batched.
    #[test]
    fn phi4_items_stack_as_image_pixel_values() {
        let tensors = |crops, h, w, tokens| {
            vec![
                ("image_attention_mask", data(&[crops, 2, 2], "float32", 3)),
                ("image_sizes", ints(&[1, 2], &[h, w])),
                ("num_img_tokens", ints(&[1], &[tokens])),
            ]
        };
        let batch = one_batch(vec![
            item(
                data(&[2, 3, 4, 4], "float32", 1),
                tensors(2, 4, 4, 10),
                &[(1, 10)],
                1,
            ),
            item(
                data(&[3, 3, 4, 4], "float32", 2),
                tensors(3, 4, 8, 14),
                &[(12, 14)],
                2,
            ),
        ]);
        assert_eq!(
            batch.encoder_input_key.as_deref(),
            Some("image_pixel_values")
        );
        assert_eq!(batch.pixel_values.unwrap().shape, [2, 3, 3, 4, 4]);
        let mask = &batch.model_specific_tensors["image_attention_mask"];
        assert_eq!(mask.shape, [2, 3, 2, 2]);
        assert_eq!(
            bytes(mask)[2 * 16..3 * 16],
            1f32.to_le_bytes().repeat(4),
            "the padded crop's mask is all ones, as Hugging Face pads it"
        );
        assert_eq!(
            values(&batch.model_specific_tensors["num_img_tokens"]),
            [10, 14]
        );
        assert_eq!(
            values(&batch.model_specific_tensors["image_sizes"]),
            [4, 4, 4, 8]
        );
        assert_eq!(
            sorted(&batch.batched_keys),
            [
                "image_attention_mask",
                "image_pixel_values",
                "image_sizes",
                "num_img_tokens"
            ]
        );
        assert!(batch.flat_keys.is_empty());
    }

    /// A join of many bytes runs on the blocking pool, to the same request.
    #[tokio::test]
    async fn a_large_join_is_translated_off_the_runtime_alike() {
        let qwen = |seed| {
            let grid = ints(&[1, 3], &[1, 16, 16]);
            item(
                data(&[256, 1024], "bfloat16", seed),
                vec![("image_grid_thw", grid)],
                &[(1, 64)],
                seed,
            )
        };
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs {
            items: vec![qwen(1), qwen(2)],
        });
        let items = &req.mm_inputs.as_ref().unwrap().items;
        assert!(batch::copied_bytes(items) >= batch::BLOCKING_JOIN_BYTES);
        let off = translate(&req, None).await.unwrap();
        assert_eq!(off, request(&req, None).unwrap());
        assert_eq!(
            off.mm_inputs.unwrap().pixel_values.unwrap().shape,
            [512, 1024]
        );
    }

    /// Only several items of one modality are joined (and counted as
    /// copied bytes).
    #[test]
    fn joined_items_are_those_sharing_a_modality() {
        let image = item(data(&[3, 4, 4], "float32", 1), vec![], &[(1, 2)], 1);
        let mut video = image.clone();
        video.modality = Modality::Video as i32;
        let items = vec![image.clone(), video, image];
        assert_eq!(batch::joined_items(&items), [0, 2]);
        assert_eq!(batch::copied_bytes(&items), 2 * 3 * 4 * 4 * 4);
        assert_eq!(batch::copied_bytes(&items[..2]), 0);
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
