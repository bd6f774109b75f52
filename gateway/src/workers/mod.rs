//! Workers the gateway routes to: their gRPC clients and live state
//! ([`worker`], its circuit [`breaker`]; large tensors go out without a copy, `iris_process::splice`), the per-role pools ([`pool`]), how one is chosen
//! ([`policy`]; the keys and costs of images, [`affinity`]) and the health checker that moves them in and out of
//! service ([`health`]).

pub mod affinity;
pub mod breaker;
pub mod health;
pub mod policy;
pub mod pool;
pub mod recall;
pub mod url;
pub mod worker;

pub use pool::Pool;
pub use url::WorkerUrl;
pub use worker::{Role, Worker};
