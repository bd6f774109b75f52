//! Receiving pixel tensors by any lane (docs/transports.md): inline bytes,
//! a `/dev/shm` file (read and unlinked) or an RDMA slot of the gateway's
//! arena (READ over NIXL into a registered landing pool, feature `nixl`).
//! Non-inline payloads are resolved to inline bytes on the blocking pool
//! before validation. The worker's shm identity (and its `/dev/shm`
//! namespace id, as TokenSpeed workers report it) and NIXL state are
//! reported in GetServerInfo so gateways can pick lanes.

use std::path::Path;
use std::time::Duration;

use iris_proto::encoder::EncodeRequest;
use iris_proto::scheduler::{tensor_data::Payload, MultimodalItem, TensorData};
use iris_transport::shm::{sweep_orphans, DEFAULT_SHM_DIR, IDENTITY_PREFIX};
use iris_transport::{ReceiveError, ShmIdentity, TensorReceiver};
use tonic::Status;

use crate::config::ReceiveConfig;

/// The receiving side: the receiver, the published shm identity and,
/// when the NIXL receiver is up, its longest hold of a sender's slot.
pub struct Receiving {
    receiver: TensorReceiver,
    identity: Option<ShmIdentity>,
    /// The `/dev/shm` namespace id, as TokenSpeed workers report theirs.
    namespace: Option<String>,
    nixl_hold: Option<Duration>,
}

impl Receiving {
    /// Publishes the shm identity and starts the NIXL receiver (if built
    /// in and enabled). A missing NIXL library only logs.
    pub fn start(args: &ReceiveConfig) -> anyhow::Result<Receiving> {
        let dir = Path::new(DEFAULT_SHM_DIR);
        if let Err(e) = sweep_orphans(dir, IDENTITY_PREFIX, std::time::Duration::from_secs(60)) {
            tracing::debug!(error = %e, "could not sweep shm identity orphans");
        }
        let identity = match ShmIdentity::publish(dir, IDENTITY_PREFIX) {
            Ok(identity) => Some(identity),
            Err(e) => {
                tracing::warn!(error = %e, "no shm identity: the gateway will not use shm");
                None
            }
        };
        let mut receiver = TensorReceiver::new(dir).with_shm_names(args.shm_names.clone());
        let default_name = format!("iris-encoder-{}", std::process::id());
        let remote = iris_transport::receiving::start_remote(&args.remote, &default_name)
            .map_err(anyhow::Error::msg)?;
        let nixl_hold = remote.as_ref().map(|r| r.hold);
        if let Some(remote) = remote {
            receiver = receiver.with_remote(remote.reader);
        }
        Ok(Receiving {
            receiver,
            identity,
            namespace: iris_transport::shm::namespace_id(dir),
            nixl_hold,
        })
    }

    /// The identity string for GetServerInfo.
    pub fn shm_identity(&self) -> Option<&str> {
        self.identity.as_ref().map(|i| i.identity())
    }

    /// This worker's `/dev/shm` namespace id (`<boot id>:<st_dev>`), for
    /// GetServerInfo's `scheduler_info`, where TokenSpeed workers report it
    /// to gateways that check shm locality that way (smg's).
    pub fn shm_namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// Whether RDMA payloads can be received.
    pub fn nixl(&self) -> bool {
        self.nixl_hold.is_some()
    }

    /// The NIXL receiver's longest hold of a sender's slot (landing wait
    /// plus four READ timeouts), reported in GetServerInfo so the gateway
    /// can check its `--rdma-receiver-hold-ms` against it.
    pub fn nixl_hold(&self) -> Option<Duration> {
        self.nixl_hold
    }

    /// `request` with every item's pixels inline: shm and remote payloads
    /// are read on the blocking pool.
    pub async fn resolve(&self, mut request: EncodeRequest) -> Result<EncodeRequest, Status> {
        let Some(mm) = request.mm_inputs.as_mut() else {
            return Ok(request);
        };
        for (index, item) in mm.items.iter_mut().enumerate() {
            if needs_receiving(item) {
                self.resolve_item(item)
                    .await
                    .map_err(|s| Status::new(s.code(), format!("item {index}: {}", s.message())))?;
            }
        }
        Ok(request)
    }

    async fn resolve_item(&self, item: &mut MultimodalItem) -> Result<(), Status> {
        let Some(tensor) = item.encoder_input.take() else {
            return Ok(());
        };
        let receiver = self.receiver.clone();
        let received = tokio::task::spawn_blocking(move || {
            receiver
                .receive(&tensor)
                .map(|r| (tensor.shape, tensor.dtype, r.data))
        })
        .await
        .map_err(|e| Status::internal(format!("receiving encoder_input failed: {e}")))?
        .map_err(|e| receive_status(&e))?;
        let (shape, dtype, data) = received;
        item.encoder_input = Some(TensorData {
            shape,
            dtype,
            payload: Some(Payload::Inline(data)),
        });
        Ok(())
    }
}

fn needs_receiving(item: &MultimodalItem) -> bool {
    matches!(
        item.encoder_input.as_ref().and_then(|t| t.payload.as_ref()),
        Some(Payload::Shm(_) | Payload::Remote(_))
    )
}

/// The status a receive failure is answered with: INVALID_ARGUMENT when
/// the message itself is wrong, UNAVAILABLE when this worker could not
/// fetch the bytes (another attempt, with a fresh lane, may succeed). A
/// refused shm file is UNAVAILABLE whatever the reason, so the answer
/// tells a caller nothing about the file.
pub fn receive_status(e: &ReceiveError) -> Status {
    let message = format!("encoder_input: {e}");
    if iris_transport::receiving::is_request_fault(e) {
        Status::invalid_argument(message)
    } else {
        Status::unavailable(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_proto::common::ShmHandle;
    use iris_transport::{DescriptorError, RemoteError, ShmError};
    use tonic::Code;

    #[test]
    fn receive_errors_map_to_clear_codes() {
        let bad_name = ReceiveError::Shm(ShmError::BadName("../x".into()));
        assert_eq!(receive_status(&bad_name).code(), Code::InvalidArgument);
        assert_eq!(
            receive_status(&ReceiveError::Descriptor(DescriptorError::Short(3))).code(),
            Code::InvalidArgument
        );
        assert_eq!(
            receive_status(&ReceiveError::NoRemoteReader).code(),
            Code::Unavailable
        );
        let gone = ReceiveError::Remote(RemoteError::PeerGone("a".into(), "b".into()));
        let status = receive_status(&gone);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().starts_with("encoder_input: "));
    }

    #[tokio::test]
    async fn a_missing_shm_file_is_unavailable_and_inline_passes() {
        let receiving = Receiving {
            receiver: TensorReceiver::new(std::env::temp_dir()),
            identity: None,
            namespace: None,
            nixl_hold: None,
        };
        let item = |payload| MultimodalItem {
            encoder_input: Some(TensorData {
                shape: vec![2],
                dtype: "float32".into(),
                payload: Some(payload),
            }),
            ..MultimodalItem::default()
        };
        let shm = ShmHandle {
            name: "iris-tensor-1-no-such-file".into(),
            offset: 0,
            nbytes: 8,
            owner_id: String::new(),
        };
        let request = |items| EncodeRequest {
            mm_inputs: Some(iris_proto::scheduler::MultimodalInputs { items }),
            ..EncodeRequest::default()
        };
        let err = receiving
            .resolve(request(vec![item(Payload::Shm(shm))]))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
        assert_eq!(err.message(), "item 0: encoder_input: shm handle refused");
        let inline = item(Payload::Inline(bytes::Bytes::from(vec![0u8; 8])));
        let out = receiving
            .resolve(request(vec![inline.clone()]))
            .await
            .unwrap();
        assert_eq!(out.mm_inputs.unwrap().items, vec![inline]);
    }
}
