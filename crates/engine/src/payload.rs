//! Reading a tensor's bytes from whichever payload carries them, and
//! counting which lane each pixel tensor came by (`/metrics`:
//! `iris_engine_pixel_tensors_total{lane}`).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use iris_proto::scheduler::{tensor_data::Payload, TensorData};
use iris_transport::shm::{read_and_unlink, ShmError, ShmNames, DEFAULT_SHM_DIR};
use iris_transport::ReceiveError;
use tonic::Status;

/// The lanes a pixel tensor may arrive by, in the metric's order.
pub const LANES: [&str; 3] = ["inline", "shm", "remote"];

/// How this worker receives pixel payloads: the shm names it accepts, its
/// `/dev/shm` namespace id (reported in GetServerInfo so gateways can
/// prove they share it) and the tensors received per lane.
pub struct Payloads {
    names: ShmNames,
    namespace: Option<String>,
    received: [AtomicU64; 3],
}

impl Payloads {
    pub fn new(names: ShmNames) -> Payloads {
        Payloads {
            names,
            namespace: iris_transport::shm::namespace_id(Path::new(DEFAULT_SHM_DIR)),
            received: Default::default(),
        }
    }

    /// This worker's `/dev/shm` namespace id (`<boot id>:<st_dev>`).
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// Tensors received per lane, in [`LANES`] order.
    pub fn received(&self) -> [u64; 3] {
        self.received
            .each_ref()
            .map(|count| count.load(Ordering::Relaxed))
    }

    /// The bytes of `tensor`, counted under its lane once read.
    pub async fn read(&self, tensor: &TensorData) -> Result<Bytes, Status> {
        let bytes = read(tensor, &self.names).await?;
        let lane = match tensor.payload {
            Some(Payload::Shm(_)) => 1,
            Some(Payload::Remote(_)) => 2,
            _ => 0,
        };
        self.received[lane].fetch_add(1, Ordering::Relaxed);
        Ok(bytes)
    }
}

/// The bytes of `tensor`. Inline payloads are shared, not copied; shared
/// memory is read and unlinked (blocking: runs on the blocking pool) under
/// the receiver's rules (`iris_transport::shm::read_and_unlink`: names
/// with an allowed prefix only, no symlinks, this user's regular files of
/// exactly the declared size, checked against shape × dtype first). A
/// remote (RDMA) payload is refused UNAVAILABLE with the receiver's "no
/// NIXL reader" message: this worker has no NIXL receiver, and a gateway
/// reads that answer as "puller off" (rdma off for this worker until it
/// restarts, the tensor sent again inline).
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
        Some(Payload::Remote(_)) => Err(Status::unavailable(format!(
            "encoder_input: {}",
            ReceiveError::NoRemoteReader
        ))),
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
                descriptor: bytes::Bytes::from_static(b"SMGRDMA1"),
                nbytes: 1,
            })),
        };
        let payloads = Payloads::new(ShmNames::default());
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
