//! The Iris gateway: an OpenAI-compatible chat API in front of
//! TokenSpeed-protocol workers (aggregated, prefill + decode, or encode +
//! prefill + decode).
//!
//! Request path: [`chat`] parses and validates the body, [`mm`] fetches
//! and preprocesses its images (pixel cache), [`prompt`] renders the chat
//! template and tokenizes, [`router`] picks workers from the
//! [`workers`] pools (configured, or fed by Kubernetes [`discovery`]) and
//! starts the request, and [`chat`] streams the detokenized answer back as
//! SSE or one JSON body. [`transport`] picks how each image's pixels reach
//! its encode worker (inline, shm or RDMA). [`server`] wires it to axum behind the connection limits of [`listen`].
//!
//! The `iris` command line (and `iris demo`, which runs every role in one
//! process) is the `iris-cli` crate: this library links no worker code.
//! `unsafe` is confined to [`workers::splice`]'s buffer.
#![deny(unsafe_code)]

pub mod args;
pub mod chat;
pub mod config;
pub mod context;
pub mod discovery;
pub mod listen;
pub mod metrics;
pub mod mm;
pub mod pipeline;
pub mod prompt;
pub mod router;
pub mod server;
pub mod tokencache;
pub mod transport;
pub mod usertext;
pub mod workers;

pub use args::ServeArgs;
pub use config::{Config, ConfigError};
pub use server::{start, start_with, RunningGateway};
