//! Tensor transports between the gateway and its workers: inline bytes,
//! shared-memory files, and RDMA over a NIXL-registered slot arena.
//!
//! - [`lane`] — the `inline|shm|rdma|auto` choice per tensor and the
//!   fallback reasons;
//! - [`sender`] — the gateway side, tensor → `TensorData` by lane;
//! - [`receiver`] — the worker side, `TensorData` → bytes;
//! - [`shm`] — `/dev/shm` files, their guard, orphan sweep and the
//!   "same /dev/shm" identity;
//! - [`arena`] — the slot arena, its leases and the reaper;
//! - [`descriptor`] — the `SMGRDMA1` descriptor and slot framing;
//! - [`metrics`] — counters;
//! - `nixl` (feature `nixl`) — the NIXL agent wrapper;
//! - [`remote_reads`] — whether other hosts' READs of the arena are
//!   one-sided or served in software by the gateway's UCX.
//!
//! See `docs/transports.md`.

pub mod arena;
pub mod args;
pub mod descriptor;
pub mod lane;
pub mod metrics;
#[cfg(feature = "nixl")]
pub mod nixl;
pub mod receiver;
pub mod receiving;
pub mod remote_reads;
pub mod sender;
pub mod shm;

/// GetServerInfo `server_args` field holding a worker's shm identity
/// ([`ShmIdentity::identity`]).
pub const SHM_IDENTITY_FIELD: &str = "shm_identity";
/// GetServerInfo `scheduler_info` field in which TokenSpeed workers report
/// their `/dev/shm`'s identity, `<boot id>:<st_dev>` ([`shm::namespace_id`]).
pub const SHM_NAMESPACE_FIELD: &str = "shm_namespace_id";
/// GetServerInfo `server_args` field: 1 when the worker's NIXL receiver is up.
pub const NIXL_RECEIVER_FIELD: &str = "nixl_receiver";
/// GetServerInfo `server_args` field: the longest a worker's NIXL receiver
/// may hold a sender's slot, in ms (its landing wait plus four READ
/// timeouts); a sender whose receiver hold is shorter must not use RDMA.
pub const NIXL_RECEIVER_HOLD_FIELD: &str = "nixl_receiver_hold_ms";
/// GetServerInfo `server_args` field: 1 when the encoder serves an Encode
/// item sent without its pixels (an `encoder_input` with shape and dtype
/// but no payload) from its embedding cache by `content_hash`, and refuses
/// it with NOT_FOUND ([`RECALL_MISS`]) when the embedding is not cached.
/// Iris-only: TokenSpeed encoders always need the pixels.
pub const EMBEDDING_RECALL_FIELD: &str = "embedding_recall";

/// The `server_args` field of a worker that resumes a constraint after
/// output already written (`constrained_prefix_tokens`, an Iris
/// extension of the TokenSpeed protocol): 1 when it does.
pub const CONSTRAINT_RESUME_FIELD: &str = "constraint_resume";
/// The start of the NOT_FOUND message of an Encode item sent without its
/// pixels whose embedding the encoder does not hold.
pub const RECALL_MISS: &str = "no cached embedding for this content_hash";

/// The NIXL agent name a sender (gateway) registers and receivers fetch
/// its metadata under, by default on both sides: the name TokenSpeed's
/// pullers fetch (`smg-grpc-servicer`'s `DEFAULT_GATEWAY_AGENT_NAME`), so
/// an Iris gateway drives TokenSpeed encoders and an smg gateway drives
/// Iris encoders over RDMA with default settings.
pub const DEFAULT_SENDER_AGENT_NAME: &str = "smg-gateway-encode";

pub use arena::{
    ArenaConfig, ArenaError, Clock, Lease, ManualClock, Reaper, Release, SlotArena, SystemClock,
};
pub use descriptor::{Descriptor, DescriptorError, FrameError};
pub use lane::{decide, Decision, FallbackReason, Lane, LanePolicy, Transport, WorkerCaps};
pub use metrics::{Metrics, MetricsSnapshot};
pub use receiver::{ReceiveError, Received, RemoteError, RemoteReader, TensorReceiver};
pub use receiving::{RemoteReceiving, RemoteSettings};
pub use sender::{DeliveryTicket, RdmaEndpoint, Sent, TensorSender};
pub use shm::{ShmError, ShmGuard, ShmIdentity, ShmNames, ShmWriter};
