//! The sending side (the gateway): turns a tensor into a `TensorData` on the
//! lane chosen for the receiving worker, falling back to inline — never
//! losing the tensor — when that lane cannot take it.
//!
//! Each [`Sent`] carries a [`DeliveryTicket`]. Call
//! [`DeliveryTicket::delivered`] once the receiver acknowledged the message;
//! dropping the ticket instead (error, timeout, cancellation) cleans up the
//! shm file. An RDMA slot is never freed by the sender's failure path alone,
//! since the receiver may still be READing it: the notification or the
//! reaper frees it, unless [`DeliveryTicket::never_sent`] says the message
//! never left this process.

use std::sync::Arc;

use bytes::Bytes;
use iris_proto::scheduler::{tensor_data::Payload, TensorData};
use iris_proto::tensor::{byte_len, DType, TensorError};

use crate::arena::{ArenaError, SlotArena};
use crate::descriptor::Descriptor;
use crate::lane::{decide, Decision, FallbackReason, Lane, LanePolicy, Transport, WorkerCaps};
use crate::metrics::Metrics;
use crate::shm::{ShmGuard, ShmWriter};

/// This process's RDMA side: the arena the NIXL agent registered and the
/// agent's metadata listener address (written into every descriptor).
#[derive(Debug, Clone)]
pub struct RdmaEndpoint {
    pub arena: Arc<SlotArena>,
    pub ip: String,
    pub port: u16,
}

/// Builds `TensorData` payloads by lane.
#[derive(Debug)]
pub struct TensorSender {
    policy: LanePolicy,
    shm: Option<ShmWriter>,
    rdma: Option<RdmaEndpoint>,
    metrics: Arc<Metrics>,
}

/// One tensor ready to go: its message, the lane it took, the fallback
/// reason if it went inline against plan, and its clean-up ticket.
#[derive(Debug)]
pub struct Sent {
    pub tensor: TensorData,
    pub lane: Lane,
    pub fallback: Option<FallbackReason>,
    pub ticket: DeliveryTicket,
}

/// Clean-up owed for a sent tensor.
#[derive(Debug)]
#[must_use = "dropping the ticket means the message was not delivered"]
pub struct DeliveryTicket(Cleanup);

#[derive(Debug)]
enum Cleanup {
    Nothing,
    Shm(ShmGuard),
    Slot {
        arena: Arc<SlotArena>,
        key: i64,
        gen: u64,
    },
}

impl DeliveryTicket {
    /// The receiver acknowledged the message: it owns the shm file (and
    /// unlinks it); the slot waits for its notification or the reaper.
    pub fn delivered(self) {
        if let Cleanup::Shm(guard) = self.0 {
            guard.handed_over();
        }
    }

    /// The message never left this process: free everything now.
    pub fn never_sent(self) {
        if let Cleanup::Slot { arena, key, gen } = &self.0 {
            arena.release(*key, *gen);
        }
        // Dropping `self` removes a shm file.
    }
}

impl TensorSender {
    /// A sender with neither shm nor RDMA configured (everything inline).
    pub fn new(policy: LanePolicy, metrics: Arc<Metrics>) -> TensorSender {
        TensorSender {
            policy,
            shm: None,
            rdma: None,
            metrics,
        }
    }

    /// Enables the shm lane.
    pub fn with_shm(mut self, writer: ShmWriter) -> TensorSender {
        self.shm = Some(writer);
        self
    }

    /// Enables the RDMA lane (NIXL is up and registered the arena).
    pub fn with_rdma(mut self, endpoint: RdmaEndpoint) -> TensorSender {
        self.rdma = Some(endpoint);
        self
    }

    /// The shared counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Plans the lane for a tensor of `nbytes` to a worker with `caps`,
    /// counting what this process lacks as well.
    pub fn plan(&self, requested: Transport, caps: WorkerCaps, nbytes: usize) -> Decision {
        let effective = WorkerCaps {
            shared_shm: caps.shared_shm && self.shm.is_some(),
            nixl: caps.nixl && self.rdma.is_some(),
        };
        decide(requested, effective, nbytes, self.policy)
    }

    /// Turns `data` (little-endian, `shape` × `dtype`) into a `TensorData`
    /// for a worker with `caps`. `key` names the RDMA lease (the item's
    /// room). Only a size that disagrees with shape × dtype is an error.
    pub fn send(
        &self,
        requested: Transport,
        caps: WorkerCaps,
        key: i64,
        shape: Vec<u32>,
        dtype: DType,
        data: Bytes,
    ) -> Result<Sent, TensorError> {
        check_len(&shape, dtype, &data)?;
        let plan = self.plan(requested, caps, data.len());
        let nbytes = data.len();
        let sent = match plan.lane {
            Lane::Inline => Ok(inline_sent(shape, dtype, data, plan.fallback)),
            Lane::Shm => self.via_shm(shape, dtype, data),
            Lane::Rdma => self.via_rdma(key, shape, dtype, data),
        }?;
        self.metrics.record_lane(sent.lane, nbytes);
        if let Some(reason) = sent.fallback {
            self.metrics.record_fallback(reason);
            tracing::debug!(requested = %requested, reason = %reason, "tensor goes inline");
        }
        Ok(sent)
    }

    fn via_shm(&self, shape: Vec<u32>, dtype: DType, data: Bytes) -> Result<Sent, TensorError> {
        let Some(writer) = &self.shm else {
            return Ok(inline_sent(
                shape,
                dtype,
                data,
                Some(FallbackReason::NoSharedShm),
            ));
        };
        match writer.write(&data) {
            Ok((handle, guard)) => Ok(Sent {
                tensor: tensor(shape, dtype, Payload::Shm(handle)),
                lane: Lane::Shm,
                fallback: None,
                ticket: DeliveryTicket(Cleanup::Shm(guard)),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "shm write failed; sending inline");
                Ok(inline_sent(
                    shape,
                    dtype,
                    data,
                    Some(FallbackReason::WriteFailed),
                ))
            }
        }
    }

    fn via_rdma(
        &self,
        key: i64,
        shape: Vec<u32>,
        dtype: DType,
        data: Bytes,
    ) -> Result<Sent, TensorError> {
        let Some(ep) = &self.rdma else {
            return Ok(inline_sent(
                shape,
                dtype,
                data,
                Some(FallbackReason::NixlUnavailable),
            ));
        };
        let lease = match ep.arena.lease(key, &data) {
            Ok(lease) => lease,
            Err(e) => {
                let reason = arena_reason(&e);
                return Ok(inline_sent(shape, dtype, data, Some(reason)));
            }
        };
        let desc = Descriptor {
            slot_addr: lease.addr,
            gen: lease.gen,
            slot_key: key,
            port: ep.port,
            ip: ep.ip.clone(),
        };
        Ok(Sent {
            tensor: tensor(
                shape,
                dtype,
                Payload::Remote(desc.to_handle(data.len() as u64)),
            ),
            lane: Lane::Rdma,
            fallback: None,
            ticket: DeliveryTicket(Cleanup::Slot {
                arena: Arc::clone(&ep.arena),
                key,
                gen: lease.gen,
            }),
        })
    }
}

/// The fallback reason an arena refusal maps to.
pub fn arena_reason(err: &ArenaError) -> FallbackReason {
    match err {
        ArenaError::Full => FallbackReason::ArenaFull,
        ArenaError::Oversize { .. } => FallbackReason::Oversize,
        ArenaError::DuplicateKey(_) => FallbackReason::DuplicateKey,
        ArenaError::Config(_) | ArenaError::Alloc(_) | ArenaError::Spawn(_) => {
            FallbackReason::NixlUnavailable
        }
    }
}

fn check_len(shape: &[u32], dtype: DType, data: &Bytes) -> Result<(), TensorError> {
    let expected = byte_len(shape, dtype)?;
    if expected != data.len() as u64 {
        return Err(TensorError::SizeMismatch {
            shape: shape.to_vec(),
            dtype: dtype.as_str(),
            expected,
            actual: data.len() as u64,
        });
    }
    Ok(())
}

fn tensor(shape: Vec<u32>, dtype: DType, payload: Payload) -> TensorData {
    TensorData {
        shape,
        dtype: dtype.as_str().to_owned(),
        payload: Some(payload),
    }
}

fn inline_sent(
    shape: Vec<u32>,
    dtype: DType,
    data: Bytes,
    fallback: Option<FallbackReason>,
) -> Sent {
    Sent {
        tensor: tensor(shape, dtype, Payload::Inline(data)),
        lane: Lane::Inline,
        fallback,
        ticket: DeliveryTicket(Cleanup::Nothing),
    }
}
