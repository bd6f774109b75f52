//! Helpers shared by the encoder's integration tests: a tiny model, test
//! arguments, Encode requests with image items, clients, and fetches.
#![allow(dead_code, unused_imports)] // each test binary uses its own subset

use std::sync::Arc;

use bytes::Bytes;
use iris_encoder::compute::{Compute, DigestCompute};
use iris_encoder::{EncoderArgs, RunningEncoder};
use iris_proto::common::Modality;
use iris_proto::data::iris_data_client::IrisDataClient;
use iris_proto::data::FetchRequest;
use iris_proto::encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use iris_proto::encoder::{EncodeItemAssignment, EncodeRequest};
use iris_proto::scheduler::*;
use iris_proto::tensor::{self, DType};
pub use iris_testkit::http::{assert_lines, get as http_get};
use tempfile::TempDir;
use tonic::transport::Channel;

/// Tiny Qwen2-VL: patch 14, temporal 2, 3 channels → 1176 features; merge 2.
pub const PATCH_DIM: u32 = 1176;

/// A tiny model directory (`iris_testkit::model`), removed on drop.
pub fn model() -> TempDir {
    iris_testkit::model::tiny_model().dir
}

/// Arguments for a test encoder (`iris_testkit::args::encoder_args`: the
/// digest backend on free ports, no tail window, one batch at a time),
/// holding up to `max_held_mb`, waiting 2 s for a fetched room.
pub fn args(model: &TempDir, max_held_mb: u64) -> EncoderArgs {
    let mb = max_held_mb.to_string();
    iris_testkit::args::encoder_args(
        model.path(),
        &["--max-held-mb", &mb, "--fetch-wait-ms", "2000"],
    )
}

/// The digest backend with the tiny model's output shape.
pub fn digest() -> DigestCompute {
    DigestCompute {
        out_hidden: 64,
        merge: 2,
    }
}

/// Starts an encoder with `compute` in place of the `--compute` backend.
pub async fn start_with(args: EncoderArgs, compute: Arc<dyn Compute>) -> RunningEncoder {
    iris_encoder::start_with(args, Some(compute))
        .await
        .expect("encoder starts")
}

/// An image item of `h`×`w` patches whose pixels are all `value`, as
/// float32.
pub fn item(value: f32, h: u32, w: u32, hash: &'static [u8]) -> MultimodalItem {
    image_item(&value.to_le_bytes(), DType::Float32, h, w, hash)
}

/// The same item as bfloat16 (`value`'s high 16 bits: exact for values
/// whose low mantissa bits are zero, such as 0.5 or -0.25).
pub fn item_bf16(value: f32, h: u32, w: u32, hash: &'static [u8]) -> MultimodalItem {
    let bits = (value.to_bits() >> 16) as u16;
    image_item(&bits.to_le_bytes(), DType::BFloat16, h, w, hash)
}

/// An image item of `h`×`w` patches whose every element is `element`.
fn image_item(element: &[u8], dtype: DType, h: u32, w: u32, hash: &'static [u8]) -> MultimodalItem {
    let patches = h * w;
    let pixels: Vec<u8> = std::iter::repeat_n(element, (patches * PATCH_DIM) as usize)
        .flatten()
        .copied()
        .collect();
    MultimodalItem {
        modality: Modality::Image as i32,
        content_hash: Bytes::from_static(hash),
        encoder_input: Some(tensor::inline(
            vec![patches, PATCH_DIM],
            dtype,
            Bytes::from(pixels),
        )),
        model_specific_tensors: [(
            "image_grid_thw".to_string(),
            tensor::int64(vec![1, 3], &[1, h as i64, w as i64]),
        )]
        .into(),
        placeholders: vec![],
        placeholder_token_id: None,
    }
}

pub fn request(items: Vec<MultimodalItem>, rooms: &[i64]) -> EncodeRequest {
    EncodeRequest {
        request_id: "r".into(),
        mm_inputs: Some(MultimodalInputs { items }),
        items: rooms
            .iter()
            .map(|&bootstrap_room| EncodeItemAssignment { bootstrap_room })
            .collect(),
    }
}

pub async fn clients(
    enc: &RunningEncoder,
) -> (TokenSpeedEncoderClient<Channel>, IrisDataClient<Channel>) {
    let e = TokenSpeedEncoderClient::connect(format!("http://{}", enc.grpc_addr))
        .await
        .expect("connect");
    let d = IrisDataClient::connect(format!("http://{}", enc.data_addr))
        .await
        .expect("connect");
    (
        e.max_encoding_message_size(usize::MAX),
        d.max_decoding_message_size(usize::MAX),
    )
}

/// Fetches `room`'s embedding, waiting up to 2 s for it.
pub async fn fetch(
    data: &mut IrisDataClient<Channel>,
    room: i64,
) -> Result<TensorData, tonic::Status> {
    fetch_waiting(data, room, 2_000).await
}

/// Fetches `room`'s embedding, waiting up to `wait_ms` for it.
pub async fn fetch_waiting(
    data: &mut IrisDataClient<Channel>,
    room: i64,
    wait_ms: u32,
) -> Result<TensorData, tonic::Status> {
    let resp = data
        .fetch_embedding(FetchRequest {
            room,
            wait_ms,
            requester: "test".into(),
        })
        .await?;
    Ok(resp.into_inner().embedding.expect("tensor"))
}

pub fn inline(t: &TensorData) -> Bytes {
    match &t.payload {
        Some(tensor_data::Payload::Inline(b)) => b.clone(),
        other => panic!("expected inline, got {other:?}"),
    }
}
