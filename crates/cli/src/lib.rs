//! The `iris` command as a library: [`cli`] parses an argv and runs `iris
//! serve` (the gateway of `iris-gateway`), `iris demo` ([`demo`]: an encode
//! worker, reference prefill and decode engines and the gateway in one
//! process on a generated tiny model), `iris preprocess` or `iris
//! tiny-model`. The `iris` binary and the Python bindings' console script
//! both call [`cli::main`].
//!
//! This crate is the only one that links the gateway together with the
//! reference engine and the encode worker; the production libraries stay
//! free of demo code.

#![forbid(unsafe_code)]

pub mod cli;
pub mod demo;

pub use cli::{main, Cli};
