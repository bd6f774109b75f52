//! Clients of other workers' data services: collecting an item's embedding
//! from an encode worker and a request's state from a prefill worker.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use iris_process::auth::AuthToken;
use iris_proto::data::iris_data_client::IrisDataClient;
use iris_proto::data::FetchRequest;
use iris_proto::scheduler::tensor_data::Payload;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

use crate::model::PromptState;

/// Extra time a fetch RPC gets beyond the server-side wait.
const RPC_MARGIN: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// One lazily connected channel per data server.
pub struct Peers {
    channels: Mutex<HashMap<(String, u16), Channel>>,
    requester: String,
    /// Presented on every fetch (the peers require it when this worker does).
    token: Option<AuthToken>,
}

impl Peers {
    pub fn new(requester: String, token: Option<AuthToken>) -> Self {
        Peers {
            channels: Mutex::new(HashMap::new()),
            requester,
            token,
        }
    }

    fn client(&self, host: &str, port: u16) -> Result<IrisDataClient<Channel>, Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let key = (host.to_owned(), port);
        if let Some(channel) = channels.get(&key) {
            return Ok(IrisDataClient::new(channel.clone()).max_decoding_message_size(usize::MAX));
        }
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let endpoint = Endpoint::from_shared(format!("http://{authority}"))
            .map_err(|e| {
                Status::invalid_argument(format!("bad data server address {authority}: {e}"))
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let channel = endpoint.connect_lazy();
        channels.insert(key, channel.clone());
        Ok(IrisDataClient::new(channel).max_decoding_message_size(usize::MAX))
    }

    fn request(&self, room: i64, wait: Duration) -> tonic::Request<FetchRequest> {
        let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        let mut req = tonic::Request::new(FetchRequest {
            room,
            wait_ms,
            requester: self.requester.clone(),
        });
        req.set_timeout(wait + RPC_MARGIN);
        if let Some(token) = &self.token {
            token.authorize(&mut req);
        }
        req
    }

    /// The embedding of `room` on the encode worker at host:port.
    pub async fn fetch_embedding(
        &self,
        host: &str,
        port: u16,
        room: i64,
        wait: Duration,
    ) -> Result<Bytes, Status> {
        let what = || format!("embedding of room {room} from encode worker {host}:{port}");
        let resp = self
            .client(host, port)?
            .fetch_embedding(self.request(room, wait))
            .await
            .map_err(|s| context(s, &what()))?
            .into_inner();
        let tensor = resp
            .embedding
            .ok_or_else(|| Status::internal(format!("{}: response has no tensor", what())))?;
        iris_proto::tensor::validate(&tensor)
            .map_err(|e| Status::internal(format!("{}: {e}", what())))?;
        match tensor.payload {
            Some(Payload::Inline(bytes)) => Ok(bytes),
            _ => Err(Status::failed_precondition(format!(
                "{}: only inline embeddings are supported",
                what()
            ))),
        }
    }

    /// The prefilled state of KV room `room` on the prefill worker at host:port.
    pub async fn fetch_kv_state(
        &self,
        host: &str,
        port: u16,
        room: i64,
        wait: Duration,
    ) -> Result<PromptState, Status> {
        let what = || format!("KV state of room {room} from prefill worker {host}:{port}");
        let resp = self
            .client(host, port)?
            .fetch_kv_state(self.request(room, wait))
            .await
            .map_err(|s| context(s, &what()))?
            .into_inner();
        let bytes = match resp.state.and_then(|t| t.payload) {
            Some(Payload::Inline(bytes)) => bytes,
            _ => {
                return Err(Status::internal(format!(
                    "{}: response carries no inline state",
                    what()
                )))
            }
        };
        PromptState::from_bytes(&bytes, resp.prompt_tokens).ok_or_else(|| {
            Status::internal(format!(
                "{}: state has {} bytes, expected 32 (or 64 resuming a constraint)",
                what(),
                bytes.len()
            ))
        })
    }
}

/// Keeps the peer's status code and says what was being fetched.
fn context(status: Status, what: &str) -> Status {
    Status::new(status.code(), format!("{what}: {}", status.message()))
}
