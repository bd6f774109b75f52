//! `iris-engine`: a reference prefill/decode worker speaking the
//! `TokenSpeedScheduler`, vLLM `VllmEngine` or SGLang `SglangScheduler`
//! gRPC service (`--protocol`), so every path of Iris can be tested and
//! benchmarked without GPUs.
//!
//! Each protocol is a thin adapter ([`protocol`]) translating its request
//! into the protocol-neutral [`request::Intake`] and the run's
//! [`output::Event`]s back into its stream; everything else is shared.
//!
//! Its model is deterministic and cheap (see [`model`] and
//! `docs/reference-engine.md`): output tokens are a pure function of the
//! prompt, the bytes of every multimodal item's embedding (or pixels), and
//! the seed. In PD mode the prefill role serves each request's state by KV
//! room over `iris.data.v1`; the decode role collects it from there.

#![forbid(unsafe_code)]

pub mod adapters;
pub mod args;
pub mod config;
pub mod constrained;
mod data;
pub mod families;
pub mod inflight;
pub mod metrics;
pub mod model;
pub mod output;
mod payload;
mod peers;
pub mod prefix;
mod protocol;
mod recall;
pub mod request;
mod run;
pub mod scores;
mod server;
mod service;

pub use args::{Cli, EngineArgs};
pub use config::{ConfigError, EngineConfig, Protocol, Role};
pub use server::{start, start_configured, RunningEngine};
