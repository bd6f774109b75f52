//! Pixels inside Generate requests: an aggregated worker (or a prefill
//! worker of a PD deployment) has no encoder in front of it and gets each
//! image's pixel values in `mm_inputs`. They travel by the lane chosen for
//! that worker exactly as an encoder's do ([`Lanes::prepare`]: its own
//! transport over the flag, what it proved in GetServerInfo, the size
//! thresholds, counted fallbacks), except the several items of one
//! modality sent to a vLLM worker: its protocol takes them joined into one
//! tensor, made from their inline bytes ([`crate::backends::batch`]),
//! so they stay inline (counted there). An RDMA lease is keyed by a fresh
//! random room per tensor, which the descriptor carries (a TokenSpeed
//! scheduler servicer's puller checks no Encode room against it).
//!
//! An image the worker already holds (it advertises recalls and accepted
//! the image's pixels before: [`crate::workers::recall`]) goes by content
//! hash alone, its tensor's shape and dtype without a payload; a leg with
//! such an item makes the attempt read ahead too, so that the worker's
//! NOT_FOUND (it evicted the image, or restarted) surfaces before the
//! hand-over, and the attempt is planned again at once with the pixels.
//! A conversation that resends its earlier screenshots every turn thus
//! sends one tensor per turn, not one per image in its history.
//!
//! The attempt settles the [`Tickets`]: delivered once the leg's first
//! response arrived (the worker read its pixels before answering), dropped
//! on any failure (shm files unlinked, slots left to the notification or
//! the reaper), freed at once when the worker refused the RDMA lane. A
//! leg whose pixels went by the shm or RDMA lane makes the attempt read
//! ahead, so that such a refusal surfaces before anything reaches the
//! client.

use std::sync::Arc;

use bytes::Bytes;
use iris_proto::scheduler::{tensor_data::Payload, GenerateRequest, MultimodalItem};
use iris_transport::{DeliveryTicket, Transport};
use tonic::Status;

use super::legs::new_room;
use crate::backends::{batch, Backend};
use crate::transport::Lanes;
use crate::workers::Worker;

/// The delivery tickets of an attempt's non-inline pixels.
#[derive(Default)]
pub(super) struct Tickets(Vec<DeliveryTicket>);

impl Tickets {
    /// Whether any pixels of the attempt went by the shm or RDMA lane.
    pub fn any_off_inline(&self) -> bool {
        !self.0.is_empty()
    }

    fn extend(&mut self, other: Tickets) {
        self.0.extend(other.0);
    }

    /// The workers read their pixels: shm files are theirs to unlink.
    pub fn delivered(self) {
        self.0.into_iter().for_each(DeliveryTicket::delivered);
    }

    /// The pixels were refused unread: slots are freed at once.
    pub fn never_sent(self) {
        self.0.into_iter().for_each(DeliveryTicket::never_sent);
    }
}

/// The pixels of an attempt's Generate legs that went by the shm or RDMA
/// lane, and the images sent to workers that keep them.
#[derive(Default)]
pub(super) struct Laned {
    pub tickets: Tickets,
    /// Workers sent at least one remote (RDMA) payload.
    remote: Vec<Arc<Worker>>,
    /// Per worker that keeps images: the ones it was sent by hash alone,
    /// and every image of its leg.
    kept: Vec<(Arc<Worker>, Kept)>,
}

/// The images of a leg to a worker that keeps them.
#[derive(Default)]
struct Kept {
    recalled: Vec<Bytes>,
    all: Vec<Bytes>,
}

impl Laned {
    /// Whether `worker` was sent a remote payload in this attempt.
    pub fn remote_to(&self, worker: &Arc<Worker>) -> bool {
        self.remote.iter().any(|w| Arc::ptr_eq(w, worker))
    }

    pub fn add(&mut self, worker: &Arc<Worker>, prepared: LegPixels) {
        if prepared.remote {
            self.remote.push(worker.clone());
        }
        self.tickets.extend(prepared.tickets);
        if !prepared.kept.all.is_empty() {
            self.kept.push((worker.clone(), prepared.kept));
        }
    }

    /// Whether any image went by hash alone (the first response settles
    /// whether the worker still had it).
    pub fn any_recalled(&self) -> bool {
        self.kept.iter().any(|(_, k)| !k.recalled.is_empty())
    }

    /// Whether `worker` was sent an image by hash alone.
    pub fn recalled_from(&self, worker: &Arc<Worker>) -> bool {
        self.kept
            .iter()
            .any(|(w, k)| Arc::ptr_eq(w, worker) && !k.recalled.is_empty())
    }

    /// `worker` no longer had an image it was sent by hash: it forgets
    /// every image this attempt recalled from it (the next plan sends
    /// their pixels); returns how many.
    pub fn forget_recalled(&self, worker: &Arc<Worker>) -> usize {
        let of_worker = self.kept.iter().filter(|(w, _)| Arc::ptr_eq(w, worker));
        let mut forgotten = 0;
        for (_, kept) in of_worker {
            kept.recalled.iter().for_each(|h| worker.recall.forget(h));
            forgotten += kept.recalled.len();
        }
        forgotten
    }

    /// The legs were served: each worker keeps every image of its leg;
    /// returns how many were served by hash alone.
    pub fn kept(&self) -> usize {
        for (worker, kept) in &self.kept {
            kept.all.iter().for_each(|h| worker.recall.remember(h));
        }
        self.kept.iter().map(|(_, k)| k.recalled.len()).sum()
    }
}

/// What of a leg's pixels went by the shm or RDMA lane, and (to a worker
/// that keeps images) which images it was sent.
pub(super) struct LegPixels {
    tickets: Tickets,
    remote: bool,
    kept: Kept,
}

impl LegPixels {
    /// Nothing went by a lane: all inline, or no pixels.
    pub fn none() -> LegPixels {
        LegPixels {
            tickets: Tickets::default(),
            remote: false,
            kept: Kept::default(),
        }
    }
}

/// `request` with the images `worker` holds sent by hash alone and every
/// other inline pixel tensor moved to the worker's lane; unchanged (not
/// even copied) when the worker's transport is inline and it holds none of
/// them, or the request carries no pixels. Preparation (file write, arena
/// copy) runs on the blocking pool.
pub(super) async fn prepare(
    lanes: &Arc<Lanes>,
    worker: &Arc<Worker>,
    request: &GenerateRequest,
) -> Result<(Option<GenerateRequest>, LegPixels), Status> {
    if !carries_pixels(request) {
        return Ok((None, LegPixels::none()));
    }
    let mut prepared = LegPixels::none();
    let mut recalled = Vec::new();
    if worker.recalls_items() {
        for (i, item) in inline_items(request) {
            if worker.recall.holds(&item.content_hash) {
                recalled.push(i);
                prepared.kept.recalled.push(item.content_hash.clone());
            }
            prepared.kept.all.push(item.content_hash.clone());
        }
    }
    let joined = joined_items(worker, request);
    let inline = lanes.requested(worker) == Transport::Inline;
    if inline || !joined.is_empty() {
        let sent = inline_items(request)
            .filter(|(i, _)| !recalled.contains(i) && (inline || joined.contains(i)));
        lanes.sent_inline(sent.filter_map(|(_, item)| match payload(item) {
            Some(Payload::Inline(data)) => Some(data.len()),
            _ => None,
        }));
    }
    if inline && recalled.is_empty() {
        return Ok((None, prepared));
    }
    let mut request = request.clone();
    for item in items_mut(&mut request)
        .enumerate()
        .filter(|(i, _)| recalled.contains(i))
    {
        if let Some(tensor) = item.1.encoder_input.as_mut() {
            tensor.payload = None;
        }
    }
    if inline {
        return Ok((Some(request), prepared));
    }
    let (lanes, worker) = (lanes.clone(), worker.clone());
    tokio::task::spawn_blocking(move || {
        let items = items_mut(&mut request)
            .enumerate()
            .filter(|(i, item)| {
                !joined.contains(i) && matches!(payload(item), Some(Payload::Inline(_)))
            })
            .map(|(_, item)| item);
        for item in items {
            let (laned, ticket) = lanes.prepare(&worker, item, new_room())?;
            if payload(&laned).is_some_and(|p| !matches!(p, Payload::Inline(_))) {
                prepared.remote |= matches!(payload(&laned), Some(Payload::Remote(_)));
                prepared.tickets.0.extend(ticket);
            }
            *item = laned;
        }
        Ok((Some(request), prepared))
    })
    .await
    .map_err(|e| Status::internal(format!("preparing the images' tensors failed: {e}")))?
}

/// The items a vLLM worker takes joined with the others of their modality
/// into one tensor ([`crate::backends::batch`]): they stay inline
/// whatever the worker's lane. None for the other backends.
fn joined_items(worker: &Worker, request: &GenerateRequest) -> Vec<usize> {
    match (worker.backend(), &request.mm_inputs) {
        (Some(Backend::Vllm), Some(inputs)) => batch::joined_items(&inputs.items),
        _ => Vec::new(),
    }
}

/// The request's items that carry inline pixels, with their indices.
fn inline_items(request: &GenerateRequest) -> impl Iterator<Item = (usize, &MultimodalItem)> {
    request
        .mm_inputs
        .iter()
        .flat_map(|m| &m.items)
        .enumerate()
        .filter(|(_, item)| matches!(payload(item), Some(Payload::Inline(_))))
}

fn items_mut(request: &mut GenerateRequest) -> impl Iterator<Item = &mut MultimodalItem> {
    request
        .mm_inputs
        .iter_mut()
        .flat_map(|m| m.items.iter_mut())
}

fn payload(item: &MultimodalItem) -> Option<&Payload> {
    item.encoder_input.as_ref().and_then(|t| t.payload.as_ref())
}

/// Whether `request` carries inline pixel values.
fn carries_pixels(request: &GenerateRequest) -> bool {
    request
        .mm_inputs
        .iter()
        .flat_map(|m| &m.items)
        .any(|item| matches!(payload(item), Some(Payload::Inline(_))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::workers::{Role, WorkerUrl};
    use iris_proto::common::Modality;
    use iris_proto::scheduler::MultimodalInputs;
    use iris_proto::tensor::{inline, DType};
    use iris_transport::WorkerCaps;

    fn shm_worker(backend: Backend) -> Arc<Worker> {
        let url = WorkerUrl::parse("grpc://127.0.0.1:1?transport=shm").unwrap();
        let worker = Worker::new(url, Role::Aggregated, Duration::from_secs(1)).unwrap();
        worker.set_caps(WorkerCaps {
            shared_shm: true,
            nixl: false,
        });
        worker.set_backend(backend);
        worker
    }

    fn item(modality: Modality) -> MultimodalItem {
        MultimodalItem {
            modality: modality as i32,
            encoder_input: Some(inline(vec![16], DType::Float32, Bytes::from(vec![7u8; 64]))),
            ..MultimodalItem::default()
        }
    }

    fn lanes_of(request: &GenerateRequest) -> Vec<&'static str> {
        request
            .mm_inputs
            .iter()
            .flat_map(|m| &m.items)
            .map(|item| match payload(item) {
                Some(Payload::Inline(_)) => "inline",
                Some(Payload::Shm(_)) => "shm",
                _ => "other",
            })
            .collect()
    }

    /// A vLLM worker that takes shm gets the two images inline (they are
    /// joined into one tensor) and the lone video by shm; a TokenSpeed
    /// worker gets all three by shm.
    #[tokio::test]
    async fn items_joined_for_vllm_stay_inline() {
        let flags = [
            "--worker-urls",
            "grpc://w:1",
            "--multimodal-shm-min-bytes",
            "0",
        ];
        let config = crate::config::Config::from_flags(&flags).unwrap();
        let lanes = Arc::new(Lanes::start(&config.transport, false).unwrap());
        let request = GenerateRequest {
            mm_inputs: Some(MultimodalInputs {
                items: vec![
                    item(Modality::Image),
                    item(Modality::Video),
                    item(Modality::Image),
                ],
            }),
            ..GenerateRequest::default()
        };
        for (backend, want) in [
            (Backend::Vllm, ["inline", "shm", "inline"]),
            (Backend::TokenSpeed, ["shm", "shm", "shm"]),
        ] {
            let worker = shm_worker(backend);
            let (sent, laned) = prepare(&lanes, &worker, &request).await.unwrap();
            assert_eq!(lanes_of(&sent.unwrap()), want, "{backend}");
            laned.tickets.never_sent();
        }
    }
}
