//! The gRPC client: `TokenSpeedScheduler.Generate` straight to a worker
//! with the pre-tokenized prompt, over a few shared HTTP/2 channels (the
//! gateway itself holds one channel per worker).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use iris_proto::scheduler::generate_response::Response as Reply;
use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use iris_proto::scheduler::GenerateRequest;
use tonic::transport::{Channel, Endpoint};

use crate::run::{Timing, TokenClock};

/// Opens `count` channels to `endpoint` (eagerly, so a dead target fails
/// before the run).
pub async fn channels(endpoint: &str, count: usize) -> anyhow::Result<Vec<Channel>> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let channel = Endpoint::from_shared(endpoint.to_owned())
            .with_context(|| format!("bad gRPC endpoint {endpoint}"))?
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("cannot connect to {endpoint}"))?;
        out.push(channel);
    }
    Ok(out)
}

/// One request loop's client; request ids are `lg-<loop>-<n>`.
pub struct GrpcClient {
    client: TokenSpeedSchedulerClient<Channel>,
    template: Arc<GenerateRequest>,
    prefix: String,
    sent: u64,
}

impl GrpcClient {
    pub fn new(channel: Channel, template: Arc<GenerateRequest>, loop_index: usize) -> GrpcClient {
        GrpcClient {
            client: TokenSpeedSchedulerClient::new(channel),
            template,
            prefix: format!("lg-{loop_index}-"),
            sent: 0,
        }
    }

    /// Sends one Generate and reads the stream to its GenerateComplete.
    pub async fn send(&mut self, start: Instant) -> anyhow::Result<Timing> {
        let mut request = GenerateRequest::clone(&self.template);
        self.sent += 1;
        request.request_id = format!("{}{}", self.prefix, self.sent);
        let mut stream = self
            .client
            .generate(request)
            .await
            .map_err(|s| anyhow::anyhow!("Generate failed: {:?} {}", s.code(), s.message()))?
            .into_inner();
        let ttfb = start.elapsed();
        let mut tokens = TokenClock::default();
        let mut finish = None;
        while let Some(reply) = stream
            .message()
            .await
            .map_err(|s| anyhow::anyhow!("stream failed: {:?} {}", s.code(), s.message()))?
        {
            match reply.response {
                Some(Reply::Chunk(c)) => {
                    let n = u32::try_from(c.token_ids.len()).unwrap_or(u32::MAX);
                    tokens.arrived(n, start.elapsed());
                }
                Some(Reply::Complete(c)) => finish = Some(c.finish_reason),
                _ => {}
            }
        }
        match finish.as_deref() {
            None => bail!("the stream ended without a GenerateComplete"),
            Some("abort") => bail!("the worker aborted the request"),
            Some(_) => Ok(Timing { ttfb, tokens }),
        }
    }
}
