//! Helpers shared by the encoder's integration tests: a tiny model, test
//! arguments, Encode requests with image items, clients, and fetches.
#![allow(dead_code)] // each test binary uses its own subset

use std::sync::Arc;

use bytes::Bytes;
use iris_encoder::compute::{Compute, DigestCompute};
use iris_encoder::{ComputeKind, EncoderArgs, RunningEncoder};
use iris_proto::common::Modality;
use iris_proto::data::iris_data_client::IrisDataClient;
use iris_proto::data::FetchRequest;
use iris_proto::encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use iris_proto::encoder::{EncodeItemAssignment, EncodeRequest};
use iris_proto::scheduler::*;
use iris_proto::tensor::{self, DType};
use tempfile::TempDir;
use tonic::transport::Channel;

/// Tiny Qwen2-VL: patch 14, temporal 2, 3 channels → 1176 features; merge 2.
pub const PATCH_DIM: u32 = 1176;

pub fn model() -> TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    iris_model::tiny::write_tiny_qwen2_vl(dir.path()).expect("tiny model");
    dir
}

/// Arguments for a test encoder on free ports: digest compute, no tail
/// window, one batch at a time, 30 s room TTL.
pub fn args(model: &TempDir, max_held_mb: u64) -> EncoderArgs {
    EncoderArgs {
        compute: ComputeKind::Digest,
        host: "127.0.0.1".into(),
        port: 0,
        bootstrap_port: 0,
        model_path: model.path().to_path_buf(),
        max_batch_patches: 4096,
        max_patches_per_item: None,
        max_message_mb: None,
        auth_token_file: None,
        coalesce_window_ms: 0,
        dispatch_width: 1,
        queue_capacity: 64,
        embedding_cache_mb: 16,
        max_held_mb,
        room_ttl_secs: 30,
        fetch_wait_ms: 2_000,
        worker_id: None,
        served_model_name: None,
        expose_model_path: false,
        metrics_port: 0,
        receive: Default::default(),
    }
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

/// An image item of `h`×`w` patches whose pixels are all `value`.
pub fn item(value: f32, h: u32, w: u32, hash: &'static [u8]) -> MultimodalItem {
    let patches = h * w;
    let pixels: Vec<u8> = std::iter::repeat_n(value.to_le_bytes(), (patches * PATCH_DIM) as usize)
        .flatten()
        .collect();
    MultimodalItem {
        modality: Modality::Image as i32,
        content_hash: Bytes::from_static(hash),
        encoder_input: Some(tensor::inline(
            vec![patches, PATCH_DIM],
            DType::Float32,
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

/// A GET over a plain TCP connection; returns the whole response.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
}

pub fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            text.lines().any(|l| l == *line),
            "{line:?} missing from\n{text}"
        );
    }
}
