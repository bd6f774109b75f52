//! Iris's request in SGLang's protocol (`sglang.grpc.scheduler`), and
//! SGLang's responses back in Iris's.
//!
//! - Prompt and sampling carry over field by field (unset `temperature`,
//!   `top_p` and penalties become SGLang's neutral values, unset `top_k`
//!   becomes -1, "no limit"); `ebnf_grammar` and the other constraints keep
//!   their kind; `return_logprob` and `top_logprobs_num` are the same
//!   fields, with `logprob_start_len` -1 (output only).
//! - Images: SGLang takes one `pixel_values` tensor per request, inline
//!   only, which its servicer hands the model as ONE item (the other
//!   tensors its attributes). The images are joined into the tensors
//!   Hugging Face's processor returns for them together, per family
//!   ([`super::batch`]): rows or crops concatenated (Qwen-VL, Gemma 3,
//!   Llama 4, InternVL, Idefics3), images stacked under an item dimension
//!   and zero padded to the largest (LLaVA-1.5/NeXT/OneVision, Pixtral,
//!   Phi-4-multimodal); their placeholders listed in order. A PD decode
//!   leg's images (no pixels) keep their metadata without `pixel_values`.
//!   Joining many bytes runs on the blocking pool ([`translate`]).
//! - PD: TokenSpeed's `kv_bootstrap_info` becomes `disaggregated_params`
//!   (the room must fit SGLang's int32: the router picks it so).
//!
//! Refused (UNIMPLEMENTED, naming the field): pixels on a shm or remote
//! lane, `encode_bootstrap_info` (EPD needs TokenSpeed workers), prompt
//! log probabilities, images of different dtypes, ranks, tensors or
//! placeholder tokens that cannot form one batch. A `sampling_seed` is
//! INVALID_ARGUMENT (SGLang's request has none; the client can drop it).

use iris_proto::scheduler::{
    self as ts, generate_response, sampling_params::Constraint, tensor_data::Payload,
    GenerateRequest, GenerateResponse,
};
use iris_proto::sglang as s;
use tonic::Status;

use super::{batch, cannot_carry, prompt_logprobs_requested, transcode, Backend};

const BACKEND: Backend = Backend::Sglang;

/// `request` in SGLang's form.
pub fn request(request: &GenerateRequest) -> Result<s::GenerateRequest, Status> {
    if request.encode_bootstrap_info.is_some() {
        return Err(cannot_carry(
            BACKEND,
            "encode_bootstrap_info",
            "EPD needs TokenSpeed prefill workers",
        ));
    }
    if prompt_logprobs_requested(request.logprob_start_len) {
        return Err(cannot_carry(
            BACKEND,
            "logprob_start_len",
            "Iris asks no prompt log probabilities of SGLang",
        ));
    }
    Ok(s::GenerateRequest {
        request_id: request.request_id.clone(),
        tokenized: request.tokenized.as_ref().map(|t| s::TokenizedInput {
            original_text: t.original_text.clone(),
            input_ids: t.input_ids.clone(),
        }),
        mm_inputs: request
            .mm_inputs
            .as_ref()
            .filter(|m| !m.items.is_empty())
            .map(|m| mm_inputs(&m.items))
            .transpose()?,
        sampling_params: Some(sampling(
            request
                .sampling_params
                .as_ref()
                .unwrap_or(&ts::SamplingParams::default()),
        )?),
        return_logprob: request.return_logprob,
        logprob_start_len: -1,
        top_logprobs_num: request.top_logprobs_num,
        token_ids_logprob: request.token_ids_logprob.clone(),
        disaggregated_params: request
            .kv_bootstrap_info
            .as_ref()
            .map(disaggregated)
            .transpose()?,
        data_parallel_rank: request.data_parallel_rank,
        stream: request.stream,
        lora_id: request.lora_id.clone(),
        ..s::GenerateRequest::default()
    })
}

fn sampling(p: &ts::SamplingParams) -> Result<s::SamplingParams, Status> {
    if p.sampling_seed.is_some() {
        // The client can drop it: INVALID_ARGUMENT, a 400 over HTTP.
        return Err(Status::invalid_argument(
            "seed: the sglang backend cannot carry sampling_seed (SGLang's GenerateRequest has no seed)",
        ));
    }
    Ok(s::SamplingParams {
        temperature: p.temperature.unwrap_or(1.0),
        top_p: p.top_p.unwrap_or(1.0),
        top_k: p.top_k.unwrap_or(-1),
        min_p: p.min_p.unwrap_or(0.0),
        frequency_penalty: p.frequency_penalty.unwrap_or(0.0),
        presence_penalty: p.presence_penalty.unwrap_or(0.0),
        repetition_penalty: p.repetition_penalty.unwrap_or(1.0),
        max_new_tokens: p.max_new_tokens,
        stop: p.stop.clone(),
        stop_token_ids: p.stop_token_ids.clone(),
        skip_special_tokens: p.skip_special_tokens,
        spaces_between_special_tokens: p.spaces_between_special_tokens,
        constraint: p.constraint.clone().map(constraint),
        n: p.n,
        min_new_tokens: p.min_new_tokens,
        ignore_eos: p.ignore_eos,
        no_stop_trim: p.no_stop_trim,
        logit_bias: p.logit_bias.clone(),
        custom_params: p.custom_params.clone(),
        ..s::SamplingParams::default()
    })
}

fn constraint(c: Constraint) -> s::sampling_params::Constraint {
    use s::sampling_params::Constraint as S;
    match c {
        Constraint::Regex(r) => S::Regex(r),
        Constraint::JsonSchema(j) => S::JsonSchema(j),
        Constraint::EbnfGrammar(g) => S::EbnfGrammar(g),
        Constraint::StructuralTag(t) => S::StructuralTag(t),
    }
}

/// TokenSpeed's KV bootstrap info as SGLang's, whose room is an int32.
fn disaggregated(info: &ts::KvBootstrapInfo) -> Result<s::DisaggregatedParams, Status> {
    let room = i32::try_from(info.bootstrap_room).map_err(|_| {
        Status::invalid_argument(format!(
            "KV room {} does not fit the SGLang backend's int32 bootstrap_room",
            info.bootstrap_room
        ))
    })?;
    Ok(s::DisaggregatedParams {
        bootstrap_host: info.bootstrap_host.clone(),
        bootstrap_port: info.bootstrap_port,
        bootstrap_room: room,
    })
}

/// [`request`], on the blocking pool when it joins many bytes of several
/// images' tensors.
pub async fn translate(request: &GenerateRequest) -> Result<s::GenerateRequest, Status> {
    let items = request.mm_inputs.as_ref().map_or(&[][..], |m| &m.items);
    if joined_bytes(items) < batch::BLOCKING_JOIN_BYTES {
        return self::request(request);
    }
    let owned = request.clone();
    tokio::task::spawn_blocking(move || self::request(&owned))
        .await
        .map_err(|e| Status::internal(format!("joining the SGLang batch failed: {e}")))?
}

/// Bytes joining `items` into one batch copies (none for one item).
fn joined_bytes(items: &[ts::MultimodalItem]) -> usize {
    match items.len() {
        0 | 1 => 0,
        _ => batch::inline_bytes(items.iter()),
    }
}

/// The images (at least one) as SGLang's one batch: the tensors Hugging
/// Face's processor returns for them together ([`batch`]).
fn mm_inputs(items: &[ts::MultimodalItem]) -> Result<s::MultimodalInputs, Status> {
    let refs: Vec<&ts::MultimodalItem> = items.iter().collect();
    let joined = batch::batch(&refs, BACKEND)?;
    Ok(s::MultimodalInputs {
        // None on a PD decode leg: its images' KV state comes from prefill.
        pixel_values: joined
            .pixels
            .map(|t| inline(t, "pixel_values"))
            .transpose()?,
        modalities: items
            .iter()
            .map(|i| modality(i.modality).to_owned())
            .collect(),
        model_specific_tensors: joined
            .tensors
            .into_iter()
            .map(|(key, t)| inline(t, &key).map(|t| (key, t)))
            .collect::<Result<_, _>>()?,
        im_token_id: joined.placeholder_token,
        mm_placeholders: items
            .iter()
            .flat_map(|i| &i.placeholders)
            .map(|p| s::PlaceholderRange {
                offset: p.offset,
                length: p.length,
            })
            .collect(),
        ..s::MultimodalInputs::default()
    })
}

fn modality(value: i32) -> &'static str {
    use iris_proto::common::Modality;
    match Modality::try_from(value) {
        Ok(Modality::Audio) => "audio",
        Ok(Modality::Video) => "video",
        _ => "image",
    }
}

/// `t` as SGLang's tensor, whose bytes travel inline only; `name` for
/// errors.
fn inline(t: ts::TensorData, name: &str) -> Result<s::TensorData, Status> {
    let Some(Payload::Inline(data)) = t.payload else {
        return Err(cannot_carry(
            BACKEND,
            &format!("{name} on a shm or remote lane"),
            "SGLang's TensorData carries data inline only",
        ));
    };
    Ok(s::TensorData {
        data,
        shape: t.shape,
        dtype: t.dtype,
    })
}

/// SGLang's response in Iris's form.
pub fn response(response: s::GenerateResponse) -> Result<GenerateResponse, Status> {
    use s::generate_response::Response as S;
    let mapped = match response.response {
        Some(S::Chunk(c)) => generate_response::Response::Chunk(ts::GenerateStreamChunk {
            token_ids: c.token_ids,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.output_logprobs.as_ref().map(transcode).transpose()?,
            index: c.index,
        }),
        Some(S::Complete(c)) => generate_response::Response::Complete(complete(c)?),
        None => return Err(Status::internal("the SGLang worker sent an empty response")),
    };
    Ok(GenerateResponse {
        request_id: response.request_id,
        response: Some(mapped),
    })
}

fn complete(c: s::GenerateComplete) -> Result<ts::GenerateComplete, Status> {
    use s::generate_complete::MatchedStop as S;
    use ts::generate_complete::MatchedStop as T;
    Ok(ts::GenerateComplete {
        output_ids: c.output_ids,
        finish_reason: c.finish_reason,
        prompt_tokens: c.prompt_tokens,
        completion_tokens: c.completion_tokens,
        cached_tokens: c.cached_tokens,
        output_logprobs: c.output_logprobs.as_ref().map(transcode).transpose()?,
        matched_stop: c.matched_stop.map(|m| match m {
            S::MatchedTokenId(id) => T::MatchedTokenId(id),
            S::MatchedStopStr(s) => T::MatchedStopStr(s),
        }),
        index: c.index,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
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
                top_k: Some(5),
                max_new_tokens: Some(8),
                stop_token_ids: vec![9],
                n: 2,
                logit_bias: [("5".to_owned(), -100.0)].into(),
                constraint: Some(Constraint::Regex("a+".into())),
                ..ts::SamplingParams::default()
            }),
            return_logprob: true,
            top_logprobs_num: 3,
            stream: true,
            ..GenerateRequest::default()
        }
    }

    fn inline(shape: Vec<u32>, bytes: &[u8]) -> TensorData {
        TensorData {
            shape,
            dtype: "uint8".into(),
            payload: Some(Payload::Inline(Bytes::copy_from_slice(bytes))),
        }
    }

    fn image(pixels: TensorData, offset: u32) -> MultimodalItem {
        MultimodalItem {
            modality: Modality::Image as i32,
            content_hash: vec![1].into(),
            encoder_input: Some(pixels),
            model_specific_tensors: [("image_grid_thw".to_owned(), inline(vec![1, 3], &[1, 2, 2]))]
                .into(),
            placeholders: vec![PlaceholderRange { offset, length: 2 }],
            placeholder_token_id: Some(77),
        }
    }

    #[test]
    fn sampling_logprobs_and_rooms_carry_over() {
        let mut req = base();
        req.kv_bootstrap_info = Some(KvBootstrapInfo {
            bootstrap_host: "10.0.0.1".into(),
            bootstrap_port: 8998,
            bootstrap_room: 12345,
        });
        let r = request(&req).unwrap();
        let s = r.sampling_params.unwrap();
        assert_eq!((s.temperature, s.top_p, s.top_k), (1.0, 1.0, 5));
        assert_eq!((s.max_new_tokens, s.n), (Some(8), 2));
        assert_eq!(s.logit_bias.get("5"), Some(&-100.0));
        assert_eq!(
            s.constraint,
            Some(s::sampling_params::Constraint::Regex("a+".into()))
        );
        assert!(r.return_logprob && r.stream);
        assert_eq!((r.top_logprobs_num, r.logprob_start_len), (3, -1));
        let pd = r.disaggregated_params.unwrap();
        assert_eq!(
            (
                pd.bootstrap_host.as_str(),
                pd.bootstrap_port,
                pd.bootstrap_room
            ),
            ("10.0.0.1", 8998, 12345)
        );
        assert_eq!(r.mm_inputs, None);
    }

    #[test]
    fn one_image_is_sent_as_is_and_several_are_concatenated() {
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs {
            items: vec![image(inline(vec![1, 2], &[1, 2]), 4)],
        });
        let mm = request(&req).unwrap().mm_inputs.unwrap();
        let pixels = mm.pixel_values.unwrap();
        assert_eq!(
            (pixels.shape, &pixels.data[..]),
            (vec![1, 2], &[1u8, 2][..])
        );
        assert_eq!(mm.im_token_id, Some(77));
        assert_eq!(mm.modalities, ["image"]);
        req.mm_inputs = Some(MultimodalInputs {
            items: vec![
                image(inline(vec![1, 2], &[1, 2]), 4),
                image(inline(vec![2, 2], &[3, 4, 5, 6]), 9),
            ],
        });
        let mm = request(&req).unwrap().mm_inputs.unwrap();
        let pixels = mm.pixel_values.unwrap();
        assert_eq!(pixels.shape, [3, 2]);
        assert_eq!(&pixels.data[..], [1, 2, 3, 4, 5, 6]);
        assert_eq!(mm.model_specific_tensors["image_grid_thw"].shape, [2, 3]);
        let offsets: Vec<u32> = mm.mm_placeholders.iter().map(|p| p.offset).collect();
        assert_eq!(offsets, [4, 9]);
    }

    /// An image item with `pixels` (uint8, counting up from `first`) and
    /// the given model-specific tensors.
    fn family_item(
        pixels: Vec<u32>,
        first: u8,
        tensors: &[(&str, Vec<u32>)],
        offset: u32,
    ) -> MultimodalItem {
        let count = pixels.iter().product::<u32>() as usize;
        let data: Vec<u8> = (0..count).map(|i| first.wrapping_add(i as u8)).collect();
        MultimodalItem {
            model_specific_tensors: tensors
                .iter()
                .map(|(k, shape)| {
                    let n = shape.iter().product::<u32>() as usize;
                    ((*k).to_owned(), inline(shape.clone(), &vec![1; n]))
                })
                .collect(),
            ..image(inline(pixels, &data), offset)
        }
    }

    fn sent(items: Vec<MultimodalItem>) -> s::MultimodalInputs {
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs { items });
        request(&req).unwrap().mm_inputs.unwrap()
    }

    #[test]
    fn stacked_families_gain_the_item_dimension_and_pad_as_hugging_face() {
        // LLaVA-1.5: [3, S, S] per image, [n, 3, S, S] as its processor.
        let one = sent(vec![family_item(vec![3, 2, 2], 0, &[], 4)]);
        assert_eq!(one.pixel_values.unwrap().shape, [1, 3, 2, 2]);
        let two = sent(vec![
            family_item(vec![3, 2, 2], 0, &[], 4),
            family_item(vec![3, 2, 2], 100, &[], 9),
        ]);
        let pixels = two.pixel_values.unwrap();
        assert_eq!(pixels.shape, [2, 3, 2, 2]);
        assert_eq!((pixels.data[0], pixels.data[12]), (0, 100));
        assert!(two.model_specific_tensors.is_empty());

        // Phi-4-multimodal: 1 + tiles crops each, stacked and zero padded
        // to the most, under `pixel_values` (SGLang's feature).
        let phi = |crops: u32, first, offset| {
            family_item(
                vec![crops, 3, 1, 1],
                first,
                &[
                    ("image_attention_mask", vec![crops, 1, 1]),
                    ("image_sizes", vec![1, 2]),
                    ("num_img_tokens", vec![1]),
                ],
                offset,
            )
        };
        let mm = sent(vec![phi(2, 10, 4), phi(3, 50, 9)]);
        let pixels = mm.pixel_values.unwrap();
        assert_eq!(pixels.shape, [2, 3, 3, 1, 1]);
        let (first, second) = pixels.data.split_at(9);
        assert_eq!(first, [10, 11, 12, 13, 14, 15, 0, 0, 0], "a padded crop");
        assert_eq!(second, (50..59).collect::<Vec<u8>>());
        let tensors = &mm.model_specific_tensors;
        assert_eq!(tensors["image_attention_mask"].shape, [2, 3, 1, 1]);
        assert_eq!(
            tensors["image_attention_mask"].data[..],
            [1; 6],
            "a padded crop's all ones"
        );
        assert_eq!(tensors["image_sizes"].shape, [2, 2]);
        assert_eq!(tensors["num_img_tokens"].shape, [2]);
        assert!(!tensors.contains_key("image_pixel_values"));

        // Pixtral: images of different sizes padded at the bottom and the
        // right (SGLang's vision model crops each by `image_sizes`).
        let pixtral = |h, w, first, offset| {
            family_item(vec![3, h, w], first, &[("image_sizes", vec![1, 2])], offset)
        };
        let mm = sent(vec![pixtral(1, 2, 0, 4), pixtral(2, 1, 20, 9)]);
        let pixels = mm.pixel_values.unwrap();
        assert_eq!(pixels.shape, [2, 3, 2, 2]);
        assert_eq!(&pixels.data[..4], [0, 1, 0, 0]);
        assert_eq!(&pixels.data[12..16], [20, 0, 21, 0]);
        assert_eq!(mm.model_specific_tensors["image_sizes"].shape, [2, 2]);
    }

    #[test]
    fn concatenated_families_add_no_count_tensors() {
        // Gemma 3: crops concatenated, no `num_patches` (vLLM's own).
        let mm = sent(vec![
            family_item(vec![2, 3, 1, 1], 0, &[], 4),
            family_item(vec![1, 3, 1, 1], 6, &[], 9),
        ]);
        let pixels = mm.pixel_values.unwrap();
        assert_eq!(pixels.shape, [3, 3, 1, 1]);
        assert_eq!(&pixels.data[..], (0..9).collect::<Vec<u8>>());
        assert!(mm.model_specific_tensors.is_empty());
        // Qwen-VL: rows and grids concatenated, no `image_patch_counts`.
        let mm = sent(vec![image(inline(vec![1, 2], &[1, 2]), 4); 2]);
        assert_eq!(
            mm.model_specific_tensors.keys().collect::<Vec<_>>(),
            ["image_grid_thw"]
        );
    }

    /// A join of many bytes runs on the blocking pool, to the same request.
    #[tokio::test]
    async fn a_large_join_is_translated_off_the_runtime_alike() {
        let big = |first| family_item(vec![3, 256, 256], first, &[], 4);
        let items = vec![big(0), big(9)];
        assert!(joined_bytes(&items) >= batch::BLOCKING_JOIN_BYTES);
        assert_eq!(joined_bytes(&items[..1]), 0, "one image is not copied");
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs { items });
        let off = translate(&req).await.unwrap();
        assert_eq!(off, request(&req).unwrap());
        assert_eq!(
            off.mm_inputs.unwrap().pixel_values.unwrap().shape,
            [2, 3, 256, 256]
        );
    }

    #[test]
    fn what_sglang_cannot_carry_is_refused_by_name() {
        let refused = |req: GenerateRequest, field: &str| {
            let status = request(&req).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unimplemented, "{field}");
            assert!(status.message().contains(field), "{}", status.message());
        };
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs {
            items: vec![image(
                TensorData {
                    payload: Some(Payload::Shm(ShmHandle::default())),
                    ..inline(vec![1, 2], &[])
                },
                4,
            )],
        });
        refused(req, "shm or remote lane");
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs {
            items: vec![
                image(inline(vec![1, 2], &[1, 2]), 4),
                image(inline(vec![1, 3], &[1, 2, 3]), 9),
            ],
        });
        refused(req, "pixel_values");
        let mut req = base();
        let mut bare = image(inline(vec![1, 2], &[1, 2]), 9);
        bare.encoder_input = None;
        req.mm_inputs = Some(MultimodalInputs {
            items: vec![image(inline(vec![1, 2], &[1, 2]), 4), bare.clone()],
        });
        refused(req, "images with and without pixels");
        let mut req = base();
        req.mm_inputs = Some(MultimodalInputs { items: vec![bare] });
        let decode_leg = request(&req).unwrap().mm_inputs.unwrap();
        assert_eq!(decode_leg.pixel_values, None);
        assert_eq!(decode_leg.mm_placeholders.len(), 1);
        let mut req = base();
        req.encode_bootstrap_info = Some(Default::default());
        refused(req, "encode_bootstrap_info");
        let mut req = base();
        if let Some(s) = req.sampling_params.as_mut() {
            s.sampling_seed = Some(7);
        }
        let status = request(&req).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("sampling_seed"));
        let mut req = base();
        req.logprob_start_len = Some(0);
        refused(req, "logprob_start_len");
        let mut req = base();
        req.kv_bootstrap_info = Some(KvBootstrapInfo {
            bootstrap_room: i64::from(i32::MAX) + 1,
            ..KvBootstrapInfo::default()
        });
        assert_eq!(
            request(&req).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn responses_map_back() {
        let done = s::GenerateResponse {
            request_id: "r1".into(),
            response: Some(s::generate_response::Response::Complete(
                s::GenerateComplete {
                    output_ids: vec![4],
                    finish_reason: "length".into(),
                    prompt_tokens: 3,
                    completion_tokens: 1,
                    index: 1,
                    reasoning_tokens: 0,
                    matched_stop: Some(s::generate_complete::MatchedStop::MatchedStopStr(
                        "x".into(),
                    )),
                    ..s::GenerateComplete::default()
                },
            )),
        };
        let mapped = response(done).unwrap();
        assert_eq!(mapped.request_id, "r1");
        match mapped.response {
            Some(generate_response::Response::Complete(c)) => {
                assert_eq!(
                    (c.finish_reason.as_str(), c.index, c.prompt_tokens),
                    ("length", 1, 3)
                );
                assert_eq!(
                    c.matched_stop,
                    Some(ts::generate_complete::MatchedStop::MatchedStopStr(
                        "x".into()
                    ))
                );
            }
            other => panic!("{other:?}"),
        }
        let chunk = s::GenerateResponse {
            request_id: "r1".into(),
            response: Some(s::generate_response::Response::Chunk(
                s::GenerateStreamChunk {
                    token_ids: vec![8],
                    index: 0,
                    ..s::GenerateStreamChunk::default()
                },
            )),
        };
        assert!(matches!(
            response(chunk).unwrap().response,
            Some(generate_response::Response::Chunk(c)) if c.token_ids == [8]
        ));
        let empty = s::GenerateResponse::default();
        assert_eq!(response(empty).unwrap_err().code(), tonic::Code::Internal);
    }
}
