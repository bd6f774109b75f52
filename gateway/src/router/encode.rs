//! The encode step of an EPD attempt: each image's pixels go to its
//! encode worker under the attempt's fresh room, by the lane chosen for
//! that encoder ([`Lanes`]: inline, a `/dev/shm` file or an RDMA arena
//! slot keyed by the room). The delivery ticket is settled by the Encode
//! call's outcome: delivered once accepted; otherwise dropped (the shm
//! file is unlinked, the slot is left to the NIXL notification or the
//! reaper, since the encoder may still be READing it). A retry prepares
//! the image again for its new encoder and room; the encoders' embedding
//! caches make re-encoding a repeated image cheap.
//!
//! An image the encoder accepted before, by content hash, goes without its
//! pixels when the encoder serves recalls
//! ([`crate::workers::recall`]); if it no longer holds the embedding
//! (NOT_FOUND, [`classify::recall_missed`]) the pixels follow at once,
//! under the same room.
//!
//! An image still being preprocessed when the request was planned (EPD
//! dispatches while its images are preprocessed,
//! [`crate::mm::pending`]) is awaited by its own Encode: each image leaves
//! as soon as it is ready. A recall needs no pixels and waits for nothing.
//!
//! An encoder that refuses an RDMA payload because its puller is off
//! ([`classify::rdma_refused`]) has rdma turned off until it restarts
//! ([`Lanes::rdma_refused`]) and gets the same image again, inline, at
//! once, within the same attempt: the client never sees the refusal, and
//! it counts against neither the worker nor the request's retries.

use std::sync::Arc;
use std::time::Duration;

use iris_proto::encoder::{EncodeItemAssignment, EncodeRequest};
use iris_proto::scheduler::{tensor_data::Payload, MultimodalInputs, MultimodalItem, TensorData};
use iris_transport::DeliveryTicket;
use tonic::Status;

use super::classify;
use crate::mm::items::fill_pixels;
use crate::mm::pending::PendingImages;
use crate::transport::Lanes;
use crate::workers::Worker;

/// One image of an attempt and where it goes.
pub(super) struct EncodeJob<'a> {
    pub worker: Arc<Worker>,
    pub item: &'a MultimodalItem,
    /// Where the embedding waits on the encoder's data server.
    pub room: i64,
    /// Where the item's pixels come from when it has none yet: the
    /// request's images and this one's index.
    pub pending: Option<(&'a PendingImages, usize)>,
}

impl EncodeJob<'_> {
    /// The request's image that failed to preprocess, if one did.
    pub fn image_failure(&self) -> Option<iris_openai::ApiError> {
        self.pending.and_then(|(images, _)| images.failure())
    }
}

/// Sends every job's image at once (the `i`-th as `{request_id}-img{i}`);
/// one result per job, `Ok` once the encoder accepted it.
pub(super) async fn send_all(
    lanes: &Arc<Lanes>,
    jobs: &[EncodeJob<'_>],
    request_id: &str,
    timeout: Duration,
) -> Vec<Result<(), Status>> {
    let calls = jobs.iter().enumerate().map(|(i, job)| {
        let id = format!("{request_id}-img{i}");
        async move {
            encode(lanes, job, id, timeout)
                .await
                .map_err(|status| named(&job.worker, status))
        }
    });
    futures::future::join_all(calls).await
}

/// `status` with the encoder named, for the log (the client's copy is
/// redacted).
fn named(worker: &Worker, status: Status) -> Status {
    Status::new(
        status.code(),
        format!("encode worker {} failed: {}", worker.url, status.message()),
    )
}

/// Sends one image to its worker: without its pixels when the worker is
/// known to hold its embedding, else (or when it no longer does) with them.
async fn encode(
    lanes: &Arc<Lanes>,
    job: &EncodeJob<'_>,
    request_id: String,
    timeout: Duration,
) -> Result<(), Status> {
    let hash = &job.item.content_hash;
    let recall = &job.worker.recall;
    if recall.holds(hash) {
        let item = without_pixels(job.item);
        match call_encode(&job.worker, request_id.clone(), item, job.room, timeout).await {
            Ok(()) => {
                lanes.recalled(true);
                return Ok(());
            }
            Err(status) if classify::recall_missed(&status) => {
                lanes.recalled(false);
                recall.forget(hash);
            }
            Err(status) => return Err(status),
        }
    }
    let item = with_pixels(job).await?;
    let result = encode_pixels(lanes, job, &item, request_id, timeout).await;
    if result.is_ok() {
        recall.remember(hash);
    }
    result
}

/// The job's item with its pixels, once its image is ready.
async fn with_pixels<'a>(
    job: &EncodeJob<'a>,
) -> Result<std::borrow::Cow<'a, MultimodalItem>, Status> {
    let has_pixels = job
        .item
        .encoder_input
        .as_ref()
        .is_some_and(|t| t.payload.is_some());
    match job.pending {
        Some((images, index)) if !has_pixels => {
            let entry = images.pixels(index).await.map_err(|e| {
                Status::aborted(format!("the image was not preprocessed: {}", e.message))
            })?;
            let mut item = job.item.clone();
            fill_pixels(&mut item, &entry);
            Ok(std::borrow::Cow::Owned(item))
        }
        _ => Ok(std::borrow::Cow::Borrowed(job.item)),
    }
}

/// The item with its tensor's shape and dtype but no payload: a recall.
fn without_pixels(item: &MultimodalItem) -> MultimodalItem {
    let encoder_input = item.encoder_input.as_ref().map(|t| TensorData {
        shape: t.shape.clone(),
        dtype: t.dtype.clone(),
        payload: None,
    });
    MultimodalItem {
        encoder_input,
        ..item.clone()
    }
}

/// Sends one image to its worker, its pixels on the worker's lane; once
/// more, inline, if the worker refused the RDMA lane.
async fn encode_pixels(
    lanes: &Arc<Lanes>,
    job: &EncodeJob<'_>,
    pixels: &MultimodalItem,
    request_id: String,
    timeout: Duration,
) -> Result<(), Status> {
    let (item, ticket) = prepare(lanes, &job.worker, pixels, job.room).await?;
    let remote = is_remote(&item);
    let result = call_encode(&job.worker, request_id.clone(), item, job.room, timeout).await;
    match result {
        Err(status) if remote && classify::rdma_refused(&status) => {
            // Its puller is off: it never READs the slot, free it now.
            if let Some(ticket) = ticket {
                ticket.never_sent();
            }
            lanes.rdma_refused(&job.worker, &status);
            let (item, ticket) = prepare(lanes, &job.worker, pixels, job.room).await?;
            let result = call_encode(&job.worker, request_id, item, job.room, timeout).await;
            settle(ticket, &result);
            result
        }
        result => {
            settle(ticket, &result);
            result
        }
    }
}

/// Whether the item's pixels travel as a remote (RDMA) payload.
fn is_remote(item: &MultimodalItem) -> bool {
    let payload = item.encoder_input.as_ref().and_then(|t| t.payload.as_ref());
    matches!(payload, Some(Payload::Remote(_)))
}

/// Settles a ticket by the Encode call's outcome: delivered once accepted,
/// else dropped (shm file unlinked, slot left to notification or reaper).
fn settle(ticket: Option<DeliveryTicket>, result: &Result<(), Status>) {
    if let Some(ticket) = ticket {
        match result {
            Ok(()) => ticket.delivered(),
            Err(_) => drop(ticket),
        }
    }
}

/// The item with its pixels on `worker`'s lane, prepared on the blocking
/// pool unless they stay inline.
async fn prepare(
    lanes: &Arc<Lanes>,
    worker: &Arc<Worker>,
    item: &MultimodalItem,
    room: i64,
) -> Result<(MultimodalItem, Option<DeliveryTicket>), Status> {
    if lanes.requested(worker) == iris_transport::Transport::Inline {
        return lanes.prepare(worker, item, room);
    }
    let (lanes, worker, item) = (lanes.clone(), worker.clone(), item.clone());
    tokio::task::spawn_blocking(move || lanes.prepare(&worker, &item, room))
        .await
        .map_err(|e| Status::internal(format!("preparing the image's tensor failed: {e}")))?
}

async fn call_encode(
    worker: &Arc<Worker>,
    request_id: String,
    item: MultimodalItem,
    room: i64,
    timeout: Duration,
) -> Result<(), Status> {
    let request = EncodeRequest {
        request_id,
        mm_inputs: Some(MultimodalInputs { items: vec![item] }),
        items: vec![EncodeItemAssignment {
            bootstrap_room: room,
        }],
    };
    match tokio::time::timeout(timeout, worker.encode(&request, timeout)).await {
        Ok(Ok(response)) if response.accepted => Ok(()),
        Ok(Ok(_)) => Err(Status::unavailable("the encoder did not accept the item")),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer to Encode within {} ms",
            timeout.as_millis()
        ))),
    }
}
