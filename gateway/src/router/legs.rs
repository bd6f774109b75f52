//! What each leg of a request is sent: retry ids, rooms, and the
//! multimodal items with or without their pixels.

use iris_proto::scheduler::{
    EncodeBootstrapInfo, EncodeItemBootstrapInfo, GenerateRequest, KvBootstrapInfo,
};

use crate::backends::Backend;
use crate::workers::Worker;

/// A fresh random 63-bit room (PROTOCOL.md: 0..=i64::MAX).
pub(super) fn new_room() -> i64 {
    fastrand::i64(0..=i64::MAX)
}

/// A fresh random KV room `prefill`'s backend can carry
/// ([`Backend::max_kv_room`]).
fn new_kv_room(prefill: &Worker) -> i64 {
    fastrand::i64(0..=prefill.backend().map_or(i64::MAX, Backend::max_kv_room))
}

/// The request as sent on attempt `attempt`: retries get their own id
/// (`ID-retryN`), so a late Abort of an earlier attempt cannot hit them and
/// a worker still running the earlier attempt does not see a duplicate.
pub(super) fn attempt_request(request: &GenerateRequest, attempt: u32) -> GenerateRequest {
    let mut attempt_request = request.clone();
    if attempt > 0 {
        attempt_request.request_id = format!("{}-retry{attempt}", request.request_id);
    }
    attempt_request
}

/// The request with a fresh random 63-bit KV room on `prefill`'s data server.
pub(super) fn with_kv_room(mut leg: GenerateRequest, prefill: &Worker) -> GenerateRequest {
    let (bootstrap_host, bootstrap_port) = prefill.data_server();
    leg.kv_bootstrap_info = Some(KvBootstrapInfo {
        bootstrap_host,
        bootstrap_port,
        bootstrap_room: new_kv_room(prefill),
    });
    leg
}

/// The request without pixel payloads: every item keeps its metadata
/// (content hash, grid, placeholders) but not `encoder_input` — what a
/// decode leg, or a prefill that fetches embeddings, is sent.
pub fn strip_pixels(request: &GenerateRequest) -> GenerateRequest {
    let mut stripped = request.clone();
    if let Some(mm) = stripped.mm_inputs.as_mut() {
        mm.items
            .iter_mut()
            .for_each(|item| item.encoder_input = None);
    }
    stripped
}

/// `leg` with one `encode_bootstrap_info` entry per item: item `i`'s
/// embedding waits under `rooms[i]` on `encoders[i]`'s data server.
pub(super) fn with_encode_info(
    mut leg: GenerateRequest,
    encoders: &[std::sync::Arc<Worker>],
    rooms: &[i64],
) -> GenerateRequest {
    let items = encoders
        .iter()
        .zip(rooms)
        .enumerate()
        .map(|(index, (worker, room))| {
            let (bootstrap_host, bootstrap_port) = worker.data_server();
            EncodeItemBootstrapInfo {
                item_index: index as u32,
                bootstrap_host,
                bootstrap_port,
                bootstrap_room: *room,
            }
        })
        .collect();
    leg.encode_bootstrap_info = Some(EncodeBootstrapInfo { items });
    leg
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_proto::scheduler::{MultimodalInputs, MultimodalItem, TensorData};

    #[test]
    fn stripping_keeps_metadata_and_drops_pixels() {
        let item = MultimodalItem {
            content_hash: vec![1, 2, 3].into(),
            encoder_input: Some(TensorData::default()),
            ..MultimodalItem::default()
        };
        let request = GenerateRequest {
            mm_inputs: Some(MultimodalInputs {
                items: vec![item.clone(), item],
            }),
            ..GenerateRequest::default()
        };
        let stripped = strip_pixels(&request);
        let items = &stripped.mm_inputs.as_ref().unwrap().items;
        assert_eq!(items.len(), 2);
        assert!(items.iter().all(|i| i.encoder_input.is_none()));
        assert!(items.iter().all(|i| i.content_hash[..] == [1, 2, 3]));
        assert!(request.mm_inputs.unwrap().items[0].encoder_input.is_some());
    }
}
