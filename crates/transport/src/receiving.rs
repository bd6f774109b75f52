//! A worker's RDMA receiving side, from its command line: the settings of
//! [`crate::args::NixlReceiverArgs`] (shared by `iris-encoder` and
//! `iris-engine`) and the start of its NIXL receiver (feature `nixl`). A
//! missing library, or 0 landing slots, leaves the worker without one
//! (logged): its remote payloads are then refused with
//! [`ReceiveError::NoRemoteReader`], which gateways read as "puller off".

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::receiver::{ReceiveError, RemoteError, RemoteReader};
use crate::shm::ShmError;

/// How a worker receives RDMA payloads (validated flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSettings {
    pub nixl_lib: Option<PathBuf>,
    /// `None`: the worker's default name (`<binary>-<pid>`).
    pub agent_name: Option<String>,
    pub sender_name: String,
    /// 0: a free port.
    pub listen_port: u16,
    /// 0: no RDMA lane.
    pub landing_slots: usize,
    pub landing_slot_bytes: usize,
    pub landing_wait: Duration,
    pub read_timeout: Duration,
}

/// A started NIXL receiver and the longest it may hold a sender's slot
/// (reported in GetServerInfo so gateways can check their TTL against it).
pub struct RemoteReceiving {
    pub reader: Arc<dyn RemoteReader>,
    pub hold: Duration,
}

/// Whether `e` says the message itself is wrong (a bad name, descriptor or
/// size, a payload over the landing buffer) rather than that this worker
/// could not get the bytes (file gone, no NIXL reader, READ failed): the
/// former answers INVALID_ARGUMENT, the latter UNAVAILABLE (another
/// attempt, on a fresh lane, may succeed). A refused shm file is never the
/// message's fault, so the answer tells a caller nothing about the file.
pub fn is_request_fault(e: &ReceiveError) -> bool {
    matches!(
        e,
        ReceiveError::Tensor(_)
            | ReceiveError::Descriptor(_)
            | ReceiveError::Remote(RemoteError::TooLarge { .. })
            | ReceiveError::Shm(
                ShmError::BadName(_)
                    | ShmError::BadPrefix(_)
                    | ShmError::SizeMismatch { .. }
                    | ShmError::Unlisted(_)
            )
    )
}

/// Starts the NIXL receiver of `settings` (named `default_name` unless the
/// settings name it); `None` when disabled (0 landing slots) or NIXL is
/// missing (logged). Any other NIXL error is an error.
#[cfg(feature = "nixl")]
pub fn start_remote(
    settings: &RemoteSettings,
    default_name: &str,
) -> Result<Option<RemoteReceiving>, String> {
    use crate::nixl::{NixlError, ReceiverAgent, ReceiverConfig};

    if settings.landing_slots == 0 {
        return Ok(None);
    }
    let cfg = ReceiverConfig {
        name: settings
            .agent_name
            .clone()
            .unwrap_or_else(|| default_name.to_owned()),
        listen_port: listen_port(settings.listen_port)?,
        sender_name: settings.sender_name.clone(),
        landing_slots: settings.landing_slots,
        landing_slot_size: settings.landing_slot_bytes,
        landing_wait: settings.landing_wait,
        read_timeout: settings.read_timeout,
    };
    let hold = cfg.hold();
    match ReceiverAgent::start(settings.nixl_lib.as_deref(), cfg) {
        Ok(agent) => {
            tracing::info!(
                hold_ms = hold.as_millis() as u64,
                "NIXL receiver up (the gateway's --rdma-receiver-hold-ms must be at least hold_ms)"
            );
            Ok(Some(RemoteReceiving {
                reader: Arc::new(agent),
                hold,
            }))
        }
        Err(NixlError::Unavailable(why)) => {
            tracing::warn!(%why, "NIXL unavailable: this worker takes no rdma tensors");
            Ok(None)
        }
        Err(e) => Err(format!("cannot start the NIXL receiver: {e}")),
    }
}

/// `port`, or a port that was free a moment ago for 0.
#[cfg(feature = "nixl")]
fn listen_port(port: u16) -> Result<u16, String> {
    if port != 0 {
        return Ok(port);
    }
    let probe = std::net::TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port for the NIXL listener: {e}"))?;
    Ok(probe.port())
}

/// Built without feature `nixl`: no RDMA lane (logged when `--nixl-lib`
/// was given).
#[cfg(not(feature = "nixl"))]
pub fn start_remote(
    settings: &RemoteSettings,
    _default_name: &str,
) -> Result<Option<RemoteReceiving>, String> {
    if settings.nixl_lib.is_some() {
        tracing::warn!("built without the `nixl` feature: --nixl-lib is ignored, no rdma tensors");
    }
    Ok(None)
}
