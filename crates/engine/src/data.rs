//! The prefill role's `iris.data.v1` server: hands each request's state to
//! the decode worker that asks for its KV room.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iris_proto::data::iris_data_server::IrisData;
use iris_proto::data::{FetchEmbeddingResponse, FetchKvStateResponse, FetchRequest};
use iris_proto::tensor::{self, DType};
use tonic::{Request, Response, Status};

use crate::service::Engine;

/// Longest wait a fetch may ask for.
const MAX_WAIT: Duration = Duration::from_secs(60);

pub struct DataService {
    engine: Arc<Engine>,
}

impl DataService {
    pub fn new(engine: Arc<Engine>) -> Self {
        DataService { engine }
    }

    fn wait(&self, wait_ms: u32) -> Duration {
        match wait_ms {
            0 => self.engine.config.transfer_wait,
            ms => Duration::from_millis(u64::from(ms)).min(MAX_WAIT),
        }
    }
}

#[tonic::async_trait]
impl IrisData for DataService {
    async fn fetch_embedding(
        &self,
        _: Request<FetchRequest>,
    ) -> Result<Response<FetchEmbeddingResponse>, Status> {
        Err(Status::failed_precondition(
            "this is an iris-engine prefill worker: it serves KV state; embeddings come from encode workers",
        ))
    }

    async fn fetch_kv_state(
        &self,
        request: Request<FetchRequest>,
    ) -> Result<Response<FetchKvStateResponse>, Status> {
        let req = request.into_inner();
        let stored = self
            .engine
            .rooms
            .take(req.room, self.wait(req.wait_ms))
            .await?;
        let state = stored.state;
        tracing::debug!(room = req.room, requester = %req.requester, "KV state collected");
        Ok(Response::new(FetchKvStateResponse {
            state: {
                let bytes = state.to_bytes();
                Some(tensor::inline(
                    vec![bytes.len() as u32],
                    DType::UInt8,
                    Bytes::from(bytes),
                ))
            },
            prompt_tokens: state.prompt_tokens,
            request_id: stored.request_id,
        }))
    }
}
