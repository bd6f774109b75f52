//! Workers the gateway routes to: their gRPC clients and live state
//! ([`worker`]; large tensors go out without a copy, `iris_process::splice`),
//! that state one concern a module (health-check streaks, [`checks`]; the
//! circuit [`breaker`]; in-flight load and request counts, [`load`]; tensor
//! lanes, [`lane_caps`]; the embeddings an encoder holds, [`recall`]), their
//! addresses ([`url`]), the per-role pools ([`pool`]), how one is chosen
//! ([`policy`]; the keys and costs of images, [`affinity`]), the health
//! checker that moves them in and out of service ([`health`]) and the
//! GetServerInfo probe of what they can receive tensors by ([`probe`]), and
//! the GetModelInfo check that a worker serves a given model ([`identity`]).

pub mod affinity;
pub mod breaker;
pub mod channel;
pub mod checks;
pub mod health;
pub mod identity;
pub mod lane_caps;
pub mod load;
pub mod policy;
pub mod pool;
pub mod probe;
pub mod recall;
pub mod url;
pub mod worker;

pub use pool::Pool;
pub use url::WorkerUrl;
pub use worker::{Role, Worker};
