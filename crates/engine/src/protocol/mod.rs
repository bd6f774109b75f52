//! The wire protocols the engine speaks (`--protocol`), one thin adapter
//! each: it translates its GenerateRequest into the protocol-neutral
//! [`Intake`](crate::request::Intake), refusing with a status naming the
//! field whatever this engine cannot honour, and the run's
//! [`Event`]s back into its GenerateResponse stream. Health, abort, info,
//! loads and the tokenizer come from [`Engine`] in each protocol's own
//! messages.

/// Defines `fn logprobs(Logprobs) -> OutputLogProbs` in a protocol module
/// whose `OutputLogProbs` and `TopLogProbs` (in scope) have the shape all
/// three protocols share.
macro_rules! output_logprobs {
    () => {
        fn logprobs(l: $crate::output::Logprobs) -> OutputLogProbs {
            OutputLogProbs {
                token_logprobs: l.token_logprobs,
                token_ids: l.token_ids,
                top_logprobs: l
                    .top
                    .into_iter()
                    .map(|top| {
                        let (token_ids, values) = top.into_iter().unzip();
                        TopLogProbs { values, token_ids }
                    })
                    .collect(),
            }
        }
    };
}

pub mod kv_events;
pub mod sglang;
pub mod sglang_batch;
pub mod tokenspeed;
pub mod vllm;
pub mod vllm_batch;

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use iris_otel::opentelemetry::trace::Span as _;
use iris_otel::{Attribute, Span};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use crate::output::Event;
use crate::prefix::ItemKey;
use crate::request::{self, Intake};
use crate::service::Engine;

/// A server stream of a protocol's messages.
pub type Replies<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Checks `intake`, starts it and returns its events as `T`s made by
/// `reply` (the protocol's GenerateResponse). `span` (the call's, when
/// traced) ends when the stream does.
pub fn generate<T: Send + 'static>(
    engine: &Arc<Engine>,
    intake: Intake,
    span: Option<Span>,
    reply: impl Fn(Event) -> T + Send + 'static,
) -> Result<Replies<T>, Status> {
    let request_id = intake.request_id.clone();
    let plan = request::plan(intake, &engine.limits)?;
    let events = engine.submit(plan)?;
    let replies: Replies<T> =
        Box::pin(ReceiverStream::new(events).map(move |event| event.map(&reply)));
    Ok(match span {
        Some(mut span) => {
            span.set_attribute(Attribute::new("request_id", request_id));
            Box::pin(Spanned {
                replies,
                _span: span,
            })
        }
        None => replies,
    })
}

/// The span of a Generate call (`--otlp-endpoint`): a child of the
/// caller's `traceparent`, labelled with the engine's role and worker id;
/// `None` when the engine exports no spans.
pub fn traced(engine: &Engine, metadata: &tonic::metadata::MetadataMap) -> Option<Span> {
    let traces = engine.traces.as_ref()?;
    let attributes = vec![
        Attribute::new("role", engine.role.as_str()),
        Attribute::new("worker", engine.worker_id.clone()),
    ];
    Some(traces.serve("iris-engine.generate", metadata, attributes))
}

/// A reply stream holding its call's span until it is dropped.
struct Spanned<T> {
    replies: Replies<T>,
    _span: Span,
}

impl<T> Stream for Spanned<T> {
    type Item = Result<T, Status>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.replies.as_mut().poll_next(cx)
    }
}

/// The tokenizer bundle stream, shared by every protocol (its messages are
/// `smg.grpc.common`'s).
pub fn tokenizer(engine: &Engine) -> Replies<iris_proto::common::GetTokenizerChunk> {
    Box::pin(ReceiverStream::new(engine.tokenizer_chunks()))
}

/// `Some(top)` when an adapter's request asks for output logprobs.
pub fn top_logprobs(asked: bool, top: i32) -> Option<i32> {
    asked.then_some(top)
}

/// Refuses a data-parallel rank other than 0 (the engine has one).
pub fn check_rank(rank: Option<i32>) -> Result<(), Status> {
    match rank {
        None | Some(0) => Ok(()),
        Some(r) => Err(Status::invalid_argument(format!(
            "data_parallel_rank = {r}: iris-engine has one data-parallel rank (0)"
        ))),
    }
}

/// How the prefix cache keys one multimodal item: by its content `hash`
/// (its first 8 bytes, little-endian, as TokenSpeed's servicer reads it),
/// over the span of its placeholder `ranges` (offset, length). An item
/// without a hash gets a key of its own that nothing else shares, so its
/// blocks never match another request's.
pub fn item_key(hash: &[u8], ranges: impl IntoIterator<Item = (u32, u32)>) -> ItemKey {
    static UNIQUE: AtomicU64 = AtomicU64::new(1);
    let key = if hash.is_empty() {
        iris_fingerprint::mix64(UNIQUE.fetch_add(1, Ordering::Relaxed) ^ 0x756e_6971_7565)
    } else {
        let mut bytes = [0u8; 8];
        let n = hash.len().min(8);
        bytes[..n].copy_from_slice(&hash[..n]);
        u64::from_le_bytes(bytes)
    };
    let (mut start, mut end) = (u32::MAX, 0u32);
    for (offset, length) in ranges {
        start = start.min(offset);
        end = end.max(offset.saturating_add(length));
    }
    ItemKey {
        key,
        span: start.min(end)..end,
    }
}
