//! Reading a started request's worker messages for an endpoint's answer:
//! the next reply of a stream (an SSE answer's [`super::sse::Events`]
//! impls), whether it carries tokens, and the GenerateComplete a unary
//! answer waits for. A worker's failure becomes the client's error in the
//! OpenAI shape (the endpoint renders it in its own).

use iris_proto::scheduler::{generate_response::Response as Reply, GenerateComplete};

use super::errors::{stream_ended, worker_error};
use super::Failure;
use crate::metrics::Outcome;
use crate::router::Generation;

/// The generation's next reply (`None` inside: a message without one);
/// `None` when the stream has ended.
pub async fn next_reply(generation: &mut Generation) -> Option<Result<Option<Reply>, Failure>> {
    match generation.next().await? {
        Ok(response) => Some(Ok(response.response)),
        Err(status) => {
            let worker = generation.worker.url.to_string();
            Some(Err(worker_error(&worker, &status)))
        }
    }
}

/// Whether `reply` carries generated tokens.
pub fn carries_tokens(reply: &Option<Reply>) -> bool {
    match reply {
        Some(Reply::Chunk(chunk)) => !chunk.token_ids.is_empty(),
        Some(Reply::Complete(complete)) => !complete.output_ids.is_empty(),
        None => false,
    }
}

/// The generation's next GenerateComplete (stream chunks are skipped).
pub async fn await_complete(generation: &mut Generation) -> Result<GenerateComplete, Failure> {
    loop {
        match next_reply(generation).await {
            Some(Ok(Some(Reply::Complete(complete)))) => return Ok(complete),
            Some(Ok(_)) => {}
            Some(Err(failure)) => return Err(failure),
            None => {
                let error = stream_ended(&generation.worker.url.to_string());
                return Err((error, Outcome::UpstreamError));
            }
        }
    }
}
