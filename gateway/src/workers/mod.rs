//! Workers the gateway routes to: their gRPC clients and live state
//! ([`worker`]; large tensors go out without a copy, `iris_process::splice`), the per-role pools ([`pool`]), how one is chosen
//! ([`policy`], and per image for encoders [`affinity`]) and the health checker that moves them in and out of
//! service ([`health`]).

pub mod affinity;
pub mod health;
pub mod policy;
pub mod pool;
pub mod recall;
pub mod url;
pub mod worker;

pub use policy::Policy;
pub use pool::Pool;
pub use url::WorkerUrl;
pub use worker::{Role, Worker};
