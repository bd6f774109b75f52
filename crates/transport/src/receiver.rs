//! The receiving side (the encoder): turns a received `TensorData` — inline,
//! shm or remote — back into its bytes, checked against shape × dtype.
//!
//! Blocking (file reads, RDMA waits): call it from a blocking thread.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use iris_proto::scheduler::{tensor_data::Payload, TensorData};
use iris_proto::tensor::{validate, DType, TensorError};

use crate::descriptor::{Descriptor, DescriptorError, FrameError};
use crate::lane::Lane;
use crate::shm::{read_and_unlink, ShmError, ShmNames, DEFAULT_SHM_DIR};

/// Why a remote READ failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("NIXL is unavailable: {0}")]
    Unavailable(String),
    #[error("remote READ did not complete within {0:?}")]
    Timeout(std::time::Duration),
    #[error("the sender at {0} is gone or unreachable: {1}")]
    PeerGone(String, String),
    #[error("payload of {nbytes} bytes exceeds the landing buffer of {max}")]
    TooLarge { nbytes: u64, max: u64 },
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("NIXL error: {0}")]
    Nixl(String),
}

/// Pulls a remote slot's payload (implemented over NIXL with feature `nixl`).
pub trait RemoteReader: Send + Sync {
    /// READs `nbytes + 16` at `desc.slot_addr` from the sender at
    /// `desc.ip:desc.port`, checks both generation stamps, notifies the
    /// sender with `desc.notification()`, and returns the payload.
    fn read(&self, desc: &Descriptor, nbytes: u64) -> Result<Bytes, RemoteError>;
}

/// Why a received tensor could not be turned into bytes.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error(transparent)]
    Tensor(#[from] TensorError),
    #[error(transparent)]
    Shm(#[from] ShmError),
    #[error(transparent)]
    Descriptor(#[from] DescriptorError),
    #[error("remote tensor received but this worker has no NIXL reader")]
    NoRemoteReader,
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// A received tensor's bytes and description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub shape: Vec<u32>,
    pub dtype: DType,
    pub data: Bytes,
    pub lane: Lane,
}

fn check_remote_len(
    tensor: &TensorData,
    dtype: DType,
    nbytes: u64,
    data: &Bytes,
) -> Result<(), TensorError> {
    if data.len() as u64 == nbytes {
        return Ok(());
    }
    Err(TensorError::SizeMismatch {
        shape: tensor.shape.clone(),
        dtype: dtype.as_str(),
        expected: nbytes,
        actual: data.len() as u64,
    })
}

/// Resolves `TensorData` payloads.
#[derive(Clone)]
pub struct TensorReceiver {
    shm_dir: PathBuf,
    shm_names: ShmNames,
    remote: Option<Arc<dyn RemoteReader>>,
}

impl std::fmt::Debug for TensorReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorReceiver")
            .field("shm_dir", &self.shm_dir)
            .field("shm_names", &self.shm_names)
            .field("remote", &self.remote.is_some())
            .finish()
    }
}

impl Default for TensorReceiver {
    fn default() -> Self {
        TensorReceiver::new(DEFAULT_SHM_DIR)
    }
}

impl TensorReceiver {
    /// A receiver reading shm handles from `shm_dir` (names of the default
    /// senders only, [`ShmNames::default`]), without RDMA.
    pub fn new(shm_dir: impl Into<PathBuf>) -> TensorReceiver {
        TensorReceiver {
            shm_dir: shm_dir.into(),
            shm_names: ShmNames::default(),
            remote: None,
        }
    }

    /// Opens shm names with these prefixes (instead of the defaults).
    pub fn with_shm_names(mut self, names: ShmNames) -> TensorReceiver {
        self.shm_names = names;
        self
    }

    /// Enables remote payloads.
    pub fn with_remote(mut self, reader: Arc<dyn RemoteReader>) -> TensorReceiver {
        self.remote = Some(reader);
        self
    }

    /// The tensor's bytes (an inline payload is shared, not copied). The
    /// shape and dtype are checked against `nbytes` before any file is
    /// opened or READ is issued.
    pub fn receive(&self, tensor: &TensorData) -> Result<Received, ReceiveError> {
        let (dtype, nbytes) = validate(tensor)?;
        let (data, lane) = match &tensor.payload {
            Some(Payload::Inline(bytes)) => (bytes.clone(), Lane::Inline),
            Some(Payload::Shm(handle)) => {
                let data = read_and_unlink(&self.shm_dir, handle, nbytes, &self.shm_names)
                    .inspect_err(|e| tracing::debug!(detail = %e.detail(), "shm handle refused"))?;
                (data, Lane::Shm)
            }
            Some(Payload::Remote(handle)) => {
                let desc = Descriptor::from_handle(handle)?;
                let reader = self.remote.as_ref().ok_or(ReceiveError::NoRemoteReader)?;
                let data = reader.read(&desc, nbytes)?;
                check_remote_len(tensor, dtype, nbytes, &data)?;
                (data, Lane::Rdma)
            }
            None => return Err(TensorError::MissingPayload.into()),
        };
        Ok(Received {
            shape: tensor.shape.clone(),
            dtype,
            data,
            lane,
        })
    }
}
