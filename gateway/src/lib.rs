//! The Iris gateway: an OpenAI-compatible chat API in front of
//! TokenSpeed-protocol workers (aggregated, prefill + decode, or encode +
//! prefill + decode).
//!
//! A request's steps, in order, with the module of each, are [`STEPS`]
//! (`pipeline.rs`). Every generating endpoint's request takes one path,
//! `http::serve` (body, model lookup, deadlines, errors, the request log
//! line, unary and SSE answers): an endpoint module (`chat`,
//! `completions`, `messages` for Anthropic's API) converts its wire request into the gateway's own
//! (`request`: a conversation or prompts, each made ready once for every
//! endpoint) and shapes its answer; `served` holds each model's bundle
//! (tokenizer and template, media pipeline, parsers, router, metrics); `mm`
//! fetches and preprocesses images and videos (pixel cache); `prompt`
//! renders the chat template and tokenizes; `router` picks workers from
//! the `workers` pools with each pool's policy (configured, or fed by
//! Kubernetes `discovery`) and runs the one attempt loop. `transport`
//! picks how each item's pixels reach the worker that takes them — an
//! encoder, or an aggregated or PD prefill worker inside its Generate
//! request (inline, shm or RDMA); `server` wires it to axum behind the
//! connection limits of `listen`, with the `admin` API (reload, workers
//! added, drained and removed at run time); [`config`] is the command line
//! ([`args`]) validated once at start-up.
//!
//! The `iris` command line (and `iris demo`, which runs every role in one
//! process) is the `iris-cli` crate: this library links no worker code.
//! No `unsafe`: large tensors go out through `iris_process::splice`.
#![forbid(unsafe_code)]

// The API is deliberate: the command line and its validated config (for
// `iris-cli` and the Python bindings), starting a gateway, and the pieces
// the integration tests drive directly (router, pools, prompter,
// discovery). Every module is private; what is `pub` inside one is
// crate-internal unless re-exported here.
pub mod args;
pub mod backends;
pub mod config;

mod adapters;
mod admin;
mod build;
mod chat;
mod completions;
mod context;
mod discovery;
mod http;
mod keys;
mod kv;
mod listen;
mod messages;
mod metrics;
mod mm;
pub mod output;
mod pipeline;
mod prompt;
mod reload;
mod request;
mod responses;
mod router;
mod served;
mod server;
mod tokencache;
mod tokenize;
mod trace;
mod transport;
mod usertext;
mod workers;

pub use args::ServeArgs;
pub use config::{Config, ConfigError};
pub use discovery::Discovery;
pub use keys::file::digest_text as api_key_digest;
pub use mm::cpu_pool::init_global as init_cpu_pool;
pub use pipeline::{Step, STEPS};
pub use prompt::{PromptOptions, Prompter};
pub use router::{Generation, Mode, RouteError, Router, RouterSettings};
pub use served::{Models, Served};
pub use server::{start, start_with, RunningGateway};
pub use transport::RdmaLane;
pub use workers::policy::{LoadBounds, Policy, PolicyKind, RouteKey};
pub use workers::{Pool, Role, Worker, WorkerUrl};
