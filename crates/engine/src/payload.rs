//! Reading a tensor's bytes from whichever payload carries them — inline,
//! a `/dev/shm` file, or an RDMA slot of the gateway's arena READ by this
//! worker's NIXL receiver (feature `nixl`) — and counting which lane each
//! pixel tensor came by (`/metrics`: `iris_engine_pixel_tensors_total{lane}`).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use iris_proto::scheduler::{tensor_data::Payload, TensorData};
use iris_transport::receiving::{is_request_fault, start_remote};
use iris_transport::shm::{read_and_unlink, ShmError, ShmNames, DEFAULT_SHM_DIR};
use iris_transport::{ReceiveError, RemoteSettings, TensorReceiver};
use tonic::Status;

/// The lanes a pixel tensor may arrive by, in the metric's order.
pub const LANES: [&str; 3] = ["inline", "shm", "remote"];

/// How this worker receives pixel payloads: the shm names it accepts, its
/// `/dev/shm` namespace id (reported in GetServerInfo so gateways can
/// prove they share it), its NIXL receiver if any (and its hold, reported
/// too) and the tensors received per lane.
pub struct Payloads {
    names: ShmNames,
    namespace: Option<String>,
    /// Reads remote payloads (without a NIXL reader it refuses them).
    remote: TensorReceiver,
    nixl_hold: Option<Duration>,
    received: [AtomicU64; 3],
}

impl Payloads {
    /// Starts the NIXL receiver of `remote` (if built in and enabled; a
    /// missing library only logs).
    pub fn start(names: ShmNames, remote: &RemoteSettings) -> anyhow::Result<Payloads> {
        let dir = Path::new(DEFAULT_SHM_DIR);
        let default_name = format!("iris-engine-{}", std::process::id());
        let started = start_remote(remote, &default_name).map_err(anyhow::Error::msg)?;
        let nixl_hold = started.as_ref().map(|r| r.hold);
        let mut receiver = TensorReceiver::new(dir).with_shm_names(names.clone());
        if let Some(started) = started {
            receiver = receiver.with_remote(started.reader);
        }
        Ok(Payloads {
            names,
            namespace: iris_transport::shm::namespace_id(dir),
            remote: receiver,
            nixl_hold,
            received: Default::default(),
        })
    }

    /// This worker's `/dev/shm` namespace id (`<boot id>:<st_dev>`).
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The NIXL receiver's longest hold of a sender's slot, when it is up.
    pub fn nixl_hold(&self) -> Option<Duration> {
        self.nixl_hold
    }

    /// Tensors received per lane, in [`LANES`] order.
    pub fn received(&self) -> [u64; 3] {
        self.received
            .each_ref()
            .map(|count| count.load(Ordering::Relaxed))
    }

    /// The bytes of `tensor`, counted under its lane once read.
    pub async fn read(&self, tensor: &TensorData) -> Result<Bytes, Status> {
        let (bytes, lane) = match tensor.payload {
            Some(Payload::Remote(_)) => (self.read_remote(tensor).await?, 2),
            Some(Payload::Shm(_)) => (read(tensor, &self.names).await?, 1),
            _ => (read(tensor, &self.names).await?, 0),
        };
        self.received[lane].fetch_add(1, Ordering::Relaxed);
        Ok(bytes)
    }

    /// READs a remote payload on the blocking pool. Refused UNAVAILABLE
    /// with the receiver's "no NIXL reader" message when this worker has no
    /// NIXL receiver: a gateway reads that answer as "puller off" (rdma off
    /// for this worker until it restarts, the tensor sent again inline).
    async fn read_remote(&self, tensor: &TensorData) -> Result<Bytes, Status> {
        let (receiver, tensor) = (self.remote.clone(), tensor.clone());
        tokio::task::spawn_blocking(move || receiver.receive(&tensor))
            .await
            .map_err(|e| Status::internal(format!("RDMA read task failed: {e}")))?
            .map(|received| received.data)
            .map_err(|e| receive_status(&e))
    }
}

/// The status a failed receive is answered with (see
/// [`is_request_fault`]).
fn receive_status(e: &ReceiveError) -> Status {
    let message = format!("encoder_input: {e}");
    if is_request_fault(e) {
        Status::invalid_argument(message)
    } else {
        Status::unavailable(message)
    }
}

/// The bytes of an inline or shm `tensor`. Inline payloads are shared,
/// not copied; shared memory is read and unlinked (blocking: runs on the
/// blocking pool) under the receiver's rules
/// (`iris_transport::shm::read_and_unlink`: names with an allowed prefix
/// only, no symlinks, this user's regular files of exactly the declared
/// size, checked against shape × dtype first).
pub async fn read(tensor: &TensorData, names: &ShmNames) -> Result<Bytes, Status> {
    match &tensor.payload {
        Some(Payload::Inline(bytes)) => Ok(bytes.clone()),
        Some(Payload::Shm(_)) => {
            let (tensor, names) = (tensor.clone(), names.clone());
            tokio::task::spawn_blocking(move || {
                read_shm(Path::new(DEFAULT_SHM_DIR), &tensor, &names)
            })
            .await
            .map_err(|e| Status::internal(format!("shared-memory read task failed: {e}")))?
        }
        Some(Payload::Remote(_)) => Err(Status::internal(
            "remote payloads are read by Payloads::read",
        )),
        None => Err(Status::invalid_argument("tensor has no payload")),
    }
}

/// Reads a shm-carried `tensor` under `dir`. Every refusal that involves
/// the file is the same UNAVAILABLE "shm handle refused" (its reason is
/// logged at debug level only).
pub fn read_shm(dir: &Path, tensor: &TensorData, names: &ShmNames) -> Result<Bytes, Status> {
    let Some(Payload::Shm(handle)) = &tensor.payload else {
        return Err(Status::invalid_argument(
            "tensor has no shared-memory payload",
        ));
    };
    let (_, nbytes) = iris_proto::tensor::validate(tensor)
        .map_err(|e| Status::invalid_argument(format!("tensor: {e}")))?;
    read_and_unlink(dir, handle, nbytes, names).map_err(|e| {
        tracing::debug!(detail = %e.detail(), "shm handle refused");
        match e {
            ShmError::Refused(_) | ShmError::Io { .. } => Status::unavailable(e.to_string()),
            _ => Status::invalid_argument(e.to_string()),
        }
    })
}

#[cfg(test)]
mod tests {
    use iris_proto::common::ShmHandle;

    use super::*;

    fn tensor(name: &str, offset: u64, nbytes: u64) -> TensorData {
        TensorData {
            shape: vec![nbytes as u32],
            dtype: "uint8".into(),
            payload: Some(Payload::Shm(ShmHandle {
                name: name.into(),
                offset,
                nbytes,
                owner_id: "test".into(),
            })),
        }
    }

    #[test]
    fn reads_range_and_unlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("iris-tensor-1-a"), b"0123456").unwrap();
        let names = ShmNames::default();
        let bytes = read_shm(dir.path(), &tensor("/iris-tensor-1-a", 2, 5), &names).unwrap();
        assert_eq!(&bytes[..], b"23456");
        assert!(!dir.path().join("iris-tensor-1-a").exists());
    }

    /// Bad names and other senders' files are refused and left in place,
    /// with one message whether the file exists or not.
    #[test]
    fn refuses_bad_names_foreign_files_and_ranges_and_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let names = ShmNames::default();
        for name in ["", "..", "a/b", "/../etc"] {
            let err = read_shm(dir.path(), &tensor(name, 0, 1), &names).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{name}");
        }
        std::fs::write(dir.path().join("victim"), b"abc").unwrap();
        let err = read_shm(dir.path(), &tensor("victim", 0, 3), &names).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(dir.path().join("victim").exists(), "not an allowed name");
        std::fs::write(dir.path().join("iris-tensor-1-short"), b"abc").unwrap();
        let short = read_shm(dir.path(), &tensor("iris-tensor-1-short", 1, 5), &names).unwrap_err();
        assert!(dir.path().join("iris-tensor-1-short").exists(), "kept");
        let missing =
            read_shm(dir.path(), &tensor("iris-tensor-1-none", 0, 1), &names).unwrap_err();
        assert_eq!(
            (short.code(), short.message()),
            (missing.code(), missing.message()),
            "a short file and a missing one read the same"
        );
        assert_eq!(missing.code(), tonic::Code::Unavailable);
    }

    /// A remote payload is refused the way gateways read as "no NIXL
    /// reader here"; inline and shm ones are counted under their lane.
    #[tokio::test]
    async fn remote_is_refused_as_no_reader_and_lanes_are_counted() {
        let remote = TensorData {
            shape: vec![1],
            dtype: "uint8".into(),
            payload: Some(Payload::Remote(iris_proto::common::RemoteTensorHandle {
                transport: "nixl".into(),
                descriptor: iris_transport::Descriptor {
                    slot_addr: 4096,
                    gen: 1,
                    slot_key: 7,
                    port: 1,
                    ip: "127.0.0.1".into(),
                }
                .encode(),
                nbytes: 1,
            })),
        };
        let payloads = Payloads::start(
            ShmNames::default(),
            &iris_transport::RemoteSettings {
                nixl_lib: None,
                agent_name: None,
                sender_name: String::new(),
                listen_port: 0,
                landing_slots: 0,
                landing_slot_bytes: 0,
                landing_wait: Duration::ZERO,
                read_timeout: Duration::ZERO,
            },
        )
        .unwrap();
        let err = payloads.read(&remote).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(
            err.message()
                .contains(&ReceiveError::NoRemoteReader.to_string()),
            "{}",
            err.message()
        );
        let inline = TensorData {
            shape: vec![2],
            dtype: "uint8".into(),
            payload: Some(Payload::Inline(bytes::Bytes::from_static(b"ab"))),
        };
        assert_eq!(&payloads.read(&inline).await.unwrap()[..], b"ab");
        assert_eq!(payloads.received(), [1, 0, 0]);
    }
}
