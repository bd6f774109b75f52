//! `iris-encoder`: an encode worker. It serves `TokenSpeedEncoder.Encode`
//! (accepting any number of items, each with its room), a health/info-only
//! `TokenSpeedScheduler`, and `iris.data.v1.FetchEmbedding` on its
//! bootstrap port, from which prefill workers collect embeddings by room.
//!
//! Work flows: [`validate::check`] (the declared items, before any I/O) →
//! [`receive`] (shm and RDMA payloads read into bytes) → [`validate`] →
//! rooms claimed (bounded bytes: Encode pushes back when full) → [`cache`]
//! hits answered at once → repeats of work in flight join it ([`flight`])
//! → the rest batched by `iris-batcher` → [`compute`] on the blocking pool
//! → each room completed as soon as its item is done. [`metrics`] serves Prometheus text on
//! `--metrics-port`.

#![forbid(unsafe_code)]

pub mod args;
mod backend;
pub mod cache;
pub mod compute;
pub mod config;
pub mod flight;
pub mod metrics;
pub mod receive;
mod server;
pub mod service;
pub mod validate;

pub use args::{Cli, ComputeKind, EncoderArgs};
pub use config::{ConfigError, EncoderConfig};
pub use server::{start, start_configured, start_with, RunningEncoder};
