//! The wire contract Iris speaks, generated from the `.proto` files in the
//! repository's `proto/` folder.
//!
//! - [`common`]: `smg.grpc.common` (shared-memory and remote tensor handles,
//!   modality, tokenizer chunks);
//! - [`scheduler`]: `tokenspeed.grpc.scheduler` (the `TokenSpeedScheduler`
//!   service spoken by prefill, decode and aggregated workers);
//! - [`encoder`]: `tokenspeed.grpc.encoder` (`TokenSpeedEncoder.Encode`);
//! - [`vllm`]: `vllm.grpc.engine` (the `VllmEngine` service of vLLM's gRPC
//!   mode);
//! - [`sglang`]: `sglang.grpc.scheduler` (the `SglangScheduler` service of
//!   SGLang's gRPC mode);
//! - [`data`]: `iris.data.v1` (Iris's worker-to-worker data service).
//!
//! Every `bytes` field is a [`bytes::Bytes`], so cloning a message shares
//! its payloads instead of copying them.

#![forbid(unsafe_code)]
#![allow(clippy::doc_lazy_continuation, clippy::large_enum_variant)]

pub mod info;
pub mod tensor;

/// Generated modules, nested by protobuf package (the generated code refers
/// across packages by relative paths).
pub mod generated {
    pub mod smg {
        pub mod grpc {
            pub mod common {
                tonic::include_proto!("smg.grpc.common");
            }
        }
    }
    pub mod tokenspeed {
        pub mod grpc {
            pub mod scheduler {
                tonic::include_proto!("tokenspeed.grpc.scheduler");
            }
            pub mod encoder {
                tonic::include_proto!("tokenspeed.grpc.encoder");
            }
        }
    }
    pub mod vllm {
        pub mod grpc {
            pub mod engine {
                tonic::include_proto!("vllm.grpc.engine");
            }
        }
    }
    pub mod sglang {
        pub mod grpc {
            pub mod scheduler {
                tonic::include_proto!("sglang.grpc.scheduler");
            }
        }
    }
    pub mod iris {
        pub mod data {
            pub mod v1 {
                tonic::include_proto!("iris.data.v1");
            }
        }
    }
}

/// `iris.data.v1`.
pub use generated::iris::data::v1 as data;
/// `sglang.grpc.scheduler`.
pub use generated::sglang::grpc::scheduler as sglang;
/// `smg.grpc.common`.
pub use generated::smg::grpc::common;
/// `tokenspeed.grpc.encoder`.
pub use generated::tokenspeed::grpc::encoder;
/// `tokenspeed.grpc.scheduler`.
pub use generated::tokenspeed::grpc::scheduler;
/// `vllm.grpc.engine`.
pub use generated::vllm::grpc::engine as vllm;

/// Bootstrap (data server) port a worker URL implies when it names none.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;
