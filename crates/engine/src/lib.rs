//! `iris-engine`: a reference prefill/decode worker speaking the
//! `TokenSpeedScheduler` gRPC service, so every path of Iris can be tested
//! and benchmarked without GPUs.
//!
//! Its model is deterministic and cheap (see [`model`] and
//! `docs/reference-engine.md`): output tokens are a pure function of the
//! prompt, the bytes of every multimodal item's embedding (or pixels), and
//! the seed. In PD mode the prefill role serves each request's state by KV
//! room over `iris.data.v1`; the decode role collects it from there.

#![forbid(unsafe_code)]

pub mod args;
pub mod config;
pub mod constrained;
mod data;
pub mod inflight;
pub mod metrics;
pub mod model;
mod payload;
mod peers;
pub mod request;
mod run;
pub mod scores;
mod server;
mod service;

pub use args::{Cli, EngineArgs};
pub use config::{ConfigError, EngineConfig, Role};
pub use server::{start, start_configured, RunningEngine};
