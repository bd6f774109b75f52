//! gRPC helpers: a stub `TokenSpeedScheduler` whose health answer each
//! test chooses (everything else UNIMPLEMENTED, Generate requests kept
//! when asked), serving any tonic router on a free loopback port, and a
//! scheduler client.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use iris_proto::common::{GetTokenizerChunk, GetTokenizerRequest};
use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use iris_proto::scheduler::token_speed_scheduler_server::{
    TokenSpeedScheduler, TokenSpeedSchedulerServer,
};
use iris_proto::scheduler::*;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::server::Router;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// A stand-in scheduler service: answers HealthCheck as configured, Abort
/// with success and GetServerInfo with `server_info` when set; every other
/// call is UNIMPLEMENTED naming `name`.
/// Serve it beside a fake of another service (an encoder) so the gateway's
/// health checks see a live worker.
#[derive(Clone, Debug)]
pub struct StubScheduler {
    /// Who this stands in for, in the health message and the errors.
    pub name: String,
    /// What HealthCheck reports.
    pub healthy: bool,
    /// What GetServerInfo answers (UNIMPLEMENTED when unset).
    pub server_info: Option<GetServerInfoResponse>,
    /// Where Generate requests are kept, when set ([`Self::recording`]).
    pub received: Option<Received>,
}

/// The Generate requests a recording stub received, in order.
pub type Received = Arc<Mutex<Vec<GenerateRequest>>>;

impl StubScheduler {
    /// A stub that reports healthy.
    pub fn healthy(name: &str) -> StubScheduler {
        StubScheduler {
            name: name.to_owned(),
            healthy: true,
            server_info: None,
            received: None,
        }
    }

    /// The stub keeping every Generate request it receives (each still
    /// answered UNIMPLEMENTED): what a gateway sends a worker.
    pub fn recording(mut self) -> (StubScheduler, Received) {
        let received = Received::default();
        self.received = Some(received.clone());
        (self, received)
    }

    /// The stub answering GetServerInfo with `info`.
    pub fn with_server_info(mut self, info: GetServerInfoResponse) -> StubScheduler {
        self.server_info = Some(info);
        self
    }

    /// The stub as a tonic service.
    pub fn service(self) -> TokenSpeedSchedulerServer<StubScheduler> {
        TokenSpeedSchedulerServer::new(self)
    }

    fn unimplemented(&self) -> Status {
        Status::unimplemented(format!("{}: not a scheduler", self.name))
    }
}

type Stream<T> = ReceiverStream<Result<T, Status>>;

#[tonic::async_trait]
impl TokenSpeedScheduler for StubScheduler {
    type GenerateStream = Stream<GenerateResponse>;
    type GetTokenizerStream = Stream<GetTokenizerChunk>;
    type SubscribeKvEventsStream = Stream<iris_proto::common::KvEventBatch>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        if let Some(received) = &self.received {
            if let Ok(mut kept) = received.lock() {
                kept.push(request.into_inner());
            }
        }
        Err(self.unimplemented())
    }

    async fn health_check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(HealthCheckResponse {
            healthy: self.healthy,
            message: self.name.clone(),
        }))
    }

    async fn abort(&self, _: Request<AbortRequest>) -> Result<Response<AbortResponse>, Status> {
        Ok(Response::new(AbortResponse::default()))
    }

    async fn get_model_info(
        &self,
        _: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        Err(self.unimplemented())
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        match &self.server_info {
            Some(info) => Ok(Response::new(info.clone())),
            None => Err(self.unimplemented()),
        }
    }

    async fn get_loads(
        &self,
        _: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        Err(self.unimplemented())
    }

    async fn subscribe_kv_events(
        &self,
        _: Request<iris_proto::common::SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        Err(self.unimplemented())
    }

    async fn get_tokenizer(
        &self,
        _: Request<GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        Err(self.unimplemented())
    }
}

/// Serves `router` on a free 127.0.0.1 port for the rest of the test.
pub async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(router.serve_with_incoming(TcpListenerStream::new(listener)));
    addr
}

/// A scheduler client of the worker at `addr`, without a response size cap.
pub async fn client(addr: SocketAddr) -> TokenSpeedSchedulerClient<Channel> {
    TokenSpeedSchedulerClient::connect(format!("http://{addr}"))
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
        .max_decoding_message_size(usize::MAX)
}

/// Requests running or waiting on the worker at `addr` (its first load).
pub async fn running(addr: SocketAddr) -> i32 {
    let loads = client(addr)
        .await
        .get_loads(GetLoadsRequest::default())
        .await
        .expect("GetLoads")
        .into_inner();
    let load = loads.loads.first().expect("one load");
    load.num_running_reqs + load.num_waiting_reqs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_stub_answers_health_as_told_and_nothing_else() {
        let addr = serve(
            tonic::transport::Server::builder()
                .add_service(StubScheduler::healthy("fake encoder").service()),
        )
        .await;
        let mut c = client(addr).await;
        let health = c
            .health_check(HealthCheckRequest::default())
            .await
            .expect("health")
            .into_inner();
        assert!(health.healthy);
        assert_eq!(health.message, "fake encoder");
        let err = c
            .get_loads(GetLoadsRequest::default())
            .await
            .expect_err("unimplemented");
        assert_eq!(err.code(), tonic::Code::Unimplemented);
        assert!(err.message().contains("fake encoder"), "{err:?}");
    }
}
