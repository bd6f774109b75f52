//! The gateway's own form of an API request: what every generating
//! endpoint's wire request becomes ([`ApiRequest`]) before the shared path
//! ([`crate::http::serve`]) finds its model, prepares it and starts it.
//!
//! The input is one of two kinds, each prepared once for every endpoint
//! that produces it ([`Input`]):
//! - a conversation ([`conversation`]): messages with their images and
//!   videos (each named by where the client put it, for errors), tools,
//!   the response format and sampling — the chat API's request; other
//!   conversational APIs convert to it;
//! - prompts ([`prompts`]): text or token-id prompts, a batch of them,
//!   with sampling — the legacy completions API's request.
//!
//! Preparing renders and tokenizes the prompt, starts the media's
//! fetching and preprocessing and builds the worker request; what an
//! endpoint keeps for itself is the shape of its answer.

pub mod conversation;
pub mod prompts;

use std::future::Future;
use std::sync::Arc;

use crate::http::{Failure, Ledger};
use crate::served::Served;

pub use conversation::ReadyConversation;
pub use prompts::ReadyPrompts;

/// One API request in the gateway's terms.
pub struct ApiRequest<I> {
    /// The model the client named (a served name or an alias).
    pub model: String,
    /// Whether the answer goes back as server-sent events.
    pub stream: bool,
    /// The client's end-user id, when sent (logged).
    pub user: Option<String>,
    /// What to generate from.
    pub input: I,
}

impl<I: Input> ApiRequest<I> {
    /// The request carrying `input`, its model, stream flag and user taken
    /// from it.
    pub fn new(input: I) -> ApiRequest<I> {
        ApiRequest {
            model: input.model().to_owned(),
            stream: input.streams(),
            user: input.user().map(str::to_owned),
            input,
        }
    }
}

/// What the shared path reads of a wire request before its model is
/// known.
pub trait Envelope {
    /// The model it names.
    fn model(&self) -> &str;

    /// Whether its answer streams.
    fn streams(&self) -> bool;

    /// The client's end-user id, when sent.
    fn user(&self) -> Option<&str>;
}

/// [`Envelope`] for a wire request with `model`, `user` and `is_stream()`.
macro_rules! envelope {
    ($($wire:ty),*) => {$(
        impl Envelope for $wire {
            fn model(&self) -> &str {
                &self.model
            }

            fn streams(&self) -> bool {
                self.is_stream()
            }

            fn user(&self) -> Option<&str> {
                self.user.as_deref()
            }
        }
    )*};
}

envelope!(
    iris_openai::ChatCompletionRequest,
    iris_openai::CompletionRequest
);

/// [`Envelope`] of a request that carries its conversation in a field
/// (`$wire.$field`, a `ChatCompletionRequest`): the conversation's.
macro_rules! envelope_of {
    ($wire:ty, $field:ident) => {
        impl $crate::request::Envelope for $wire {
            fn model(&self) -> &str {
                $crate::request::Envelope::model(&self.$field)
            }

            fn streams(&self) -> bool {
                $crate::request::Envelope::streams(&self.$field)
            }

            fn user(&self) -> Option<&str> {
                $crate::request::Envelope::user(&self.$field)
            }
        }
    };
}

pub(crate) use envelope_of;

/// A kind of input, and how it is made ready for the workers.
pub trait Input: Envelope + Send + Sized + 'static {
    /// The request ready to start: prompt tokenized, worker request built.
    type Ready: Send + 'static;

    /// Checks the input against `served` (vocabulary, context, media),
    /// renders and tokenizes it and builds the worker request; `ledger`
    /// gets what the request's log line says of it (images, prompt
    /// tokens) as soon as each is known.
    fn prepare(
        self,
        served: Arc<Served>,
        ledger: &mut Ledger,
    ) -> impl Future<Output = Result<Self::Ready, Failure>> + Send;
}

/// Runs `work` (a large prompt's rendering or tokenizing) on the blocking
/// pool; `what` names it if the task fails.
async fn off_runtime<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        let error = iris_openai::ApiError::internal(format!("{what} task failed: {e}"));
        (error, crate::metrics::Outcome::UpstreamError)
    })
}
