//! Pixels inside Generate requests: an aggregated worker (or a prefill
//! worker of a PD deployment) has no encoder in front of it and gets each
//! image's pixel values in `mm_inputs`. They travel by the lane chosen for
//! that worker exactly as an encoder's do ([`Lanes::prepare`]: its own
//! transport over the flag, what it proved in GetServerInfo, the size
//! thresholds, counted fallbacks). An RDMA lease is keyed by a fresh
//! random room per tensor, which the descriptor carries (a TokenSpeed
//! scheduler servicer's puller checks no Encode room against it).
//!
//! The attempt settles the [`Tickets`]: delivered once the leg's first
//! response arrived (the worker read its pixels before answering), dropped
//! on any failure (shm files unlinked, slots left to the notification or
//! the reaper), freed at once when the worker refused the RDMA lane. A
//! leg whose pixels went by the shm or RDMA lane makes the attempt read
//! ahead, so that such a refusal surfaces before anything reaches the
//! client.

use std::sync::Arc;

use iris_proto::scheduler::{tensor_data::Payload, GenerateRequest, MultimodalItem};
use iris_transport::{DeliveryTicket, Transport};
use tonic::Status;

use super::legs::new_room;
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
/// lane.
#[derive(Default)]
pub(super) struct Laned {
    pub tickets: Tickets,
    /// Workers sent at least one remote (RDMA) payload.
    remote: Vec<Arc<Worker>>,
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
    }
}

/// What of a leg's pixels went by the shm or RDMA lane.
pub(super) struct LegPixels {
    tickets: Tickets,
    remote: bool,
}

impl LegPixels {
    /// Nothing went by a lane: all inline, or no pixels.
    pub fn none() -> LegPixels {
        LegPixels {
            tickets: Tickets::default(),
            remote: false,
        }
    }
}

/// `request` with every inline pixel tensor moved to `worker`'s lane;
/// unchanged (not even copied) when the worker's transport is inline or
/// the request carries no pixels. Preparation (file write, arena copy)
/// runs on the blocking pool.
pub(super) async fn prepare(
    lanes: &Arc<Lanes>,
    worker: &Arc<Worker>,
    request: &GenerateRequest,
) -> Result<(Option<GenerateRequest>, LegPixels), Status> {
    if lanes.requested(worker) == Transport::Inline || !carries_pixels(request) {
        return Ok((None, LegPixels::none()));
    }
    let (lanes, worker, mut request) = (lanes.clone(), worker.clone(), request.clone());
    tokio::task::spawn_blocking(move || {
        let mut prepared = LegPixels::none();
        let items = request
            .mm_inputs
            .iter_mut()
            .flat_map(|m| m.items.iter_mut());
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
