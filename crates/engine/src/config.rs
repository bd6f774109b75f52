//! The engine's runtime configuration: [`EngineConfig::from_args`] turns
//! the parsed command line ([`EngineArgs`]) into typed settings (durations,
//! the shm names accepted, the auth token), each error naming its flag.
//! Only this module (and the entry points that parse) read
//! [`crate::args`]; defaults live in the clap definitions alone.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use iris_process::auth::AuthToken;
use iris_process::tls::ServerTls;
use iris_transport::ShmNames;

use crate::args::EngineArgs;
use crate::prefix::KvTrace;

/// Which part of the work this worker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Prefill and decode in one worker.
    Aggregated,
    /// Computes request state and serves it by KV room.
    Prefill,
    /// Collects request state from a prefill worker and generates.
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Aggregated => "aggregated",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// The gRPC service the engine speaks on `--port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    /// `tokenspeed.grpc.scheduler.TokenSpeedScheduler`.
    Tokenspeed,
    /// `vllm.grpc.engine.VllmEngine` (vLLM's gRPC mode).
    Vllm,
    /// `sglang.grpc.scheduler.SglangScheduler` (SGLang's gRPC mode).
    Sglang,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tokenspeed => "tokenspeed",
            Protocol::Vllm => "vllm",
            Protocol::Sglang => "sglang",
        }
    }
}

/// Everything `iris-engine` runs with.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub role: Role,
    pub protocol: Protocol,
    pub host: String,
    pub port: u16,
    pub bootstrap_port: u16,
    pub model_path: PathBuf,
    /// `None`: the model directory's name.
    pub served_model_name: Option<String>,
    pub expose_model_path: bool,
    /// Requests generating at once (at least 1).
    pub max_running_requests: u32,
    /// LoRA adapters loaded at once (`--max-loras`).
    pub max_loras: usize,
    pub default_max_new_tokens: u32,
    /// Simulated prefill cost per prompt token.
    pub prefill_per_token: Duration,
    /// Prefills computed at once (0: no bound).
    pub prefill_slots: u32,
    /// Simulated decode cost per step.
    pub decode_per_step: Duration,
    /// Tokens per prefix-cache block (at least 1).
    pub kv_block_size: u32,
    /// Tokens the prefix cache holds (0: no cache).
    pub kv_capacity_tokens: u64,
    /// Megabytes of received items kept for recalls (0: none).
    pub mm_item_cache_mb: u64,
    /// Whether mm items are checked against the model's family.
    pub mm_item_checks: bool,
    /// `--kv-trace`: the file every admission is appended to, opened.
    pub kv_trace: Option<Arc<KvTrace>>,
    /// Chance of EOS per decode step, in parts per million (at most 10⁶).
    pub eos_ppm: u32,
    /// The wait for a KV state or an embedding when a fetch asks for none.
    pub transfer_wait: Duration,
    /// How long an uncollected state is kept (at least 1 s).
    pub room_ttl: Duration,
    /// `None`: `role@host:port`.
    pub worker_id: Option<String>,
    /// `None`: no metrics server.
    pub metrics_port: Option<u16>,
    /// The shared secret of `--auth-token-file`, read once.
    pub auth_token: Option<AuthToken>,
    /// TLS on the gRPC port (`--tls-cert-file` and the rest), read and
    /// checked; `None`: plain.
    pub tls: Option<ServerTls>,
    /// The shm file-name prefixes accepted.
    pub shm_names: ShmNames,
    /// The NIXL receiver (RDMA lane for pixels in Generate requests).
    pub remote: iris_transport::RemoteSettings,
    /// Where the engine's spans go (`--otlp-endpoint`).
    pub otlp: iris_otel::OtlpArgs,
}

/// A flag the engine cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl EngineConfig {
    /// Validates `args`; reads the auth token file and opens the
    /// `--kv-trace` file.
    pub fn from_args(args: EngineArgs) -> Result<EngineConfig, ConfigError> {
        if args.eos_ppm > 1_000_000 {
            return Err(ConfigError(format!(
                "--eos-ppm must be at most 1000000 (parts per million), not {}",
                args.eos_ppm
            )));
        }
        let kv_trace = match &args.kv_trace {
            None => None,
            Some(_) if args.kv_capacity_tokens == 0 || args.role == Role::Decode => {
                return Err(ConfigError(
                    "--kv-trace traces the prefix cache: it needs --kv-capacity-tokens \
                     on a prefill or aggregated worker"
                        .to_owned(),
                ))
            }
            Some(path) => Some(Arc::new(KvTrace::create(path).map_err(|e| {
                ConfigError(format!("--kv-trace: cannot open {}: {e}", path.display()))
            })?)),
        };
        iris_otel::check_ratio(args.otlp.otlp_sample_ratio)
            .map_err(|e| ConfigError(e.to_string()))?;
        Ok(EngineConfig {
            otlp: args.otlp.clone(),
            auth_token: AuthToken::load(args.auth_token_file.as_deref())
                .map_err(|e| ConfigError(format!("--auth-token-file: {e:#}")))?,
            tls: iris_process::tls::server_flags(
                args.tls_cert_file.as_deref(),
                args.tls_key_file.as_deref(),
                args.tls_client_ca_file.as_deref(),
            )
            .map_err(ConfigError)?,
            shm_names: args.shm.names().map_err(ConfigError)?,
            remote: args.nixl.settings().map_err(ConfigError)?,
            role: args.role,
            protocol: args.protocol,
            host: args.host,
            port: args.port,
            bootstrap_port: args.bootstrap_port,
            model_path: args.model_path,
            served_model_name: args.served_model_name,
            expose_model_path: args.expose_model_path,
            max_running_requests: args.max_running_requests.max(1),
            max_loras: args.max_loras as usize,
            default_max_new_tokens: args.default_max_new_tokens,
            prefill_per_token: Duration::from_micros(args.prefill_us_per_token),
            prefill_slots: args.prefill_slots,
            decode_per_step: Duration::from_micros(args.decode_us_per_step),
            kv_block_size: args.kv_block_size.max(1),
            kv_capacity_tokens: args.kv_capacity_tokens,
            mm_item_cache_mb: args.mm_item_cache_mb,
            mm_item_checks: !args.no_mm_item_checks,
            kv_trace,
            eos_ppm: args.eos_ppm,
            transfer_wait: Duration::from_millis(args.transfer_wait_ms),
            room_ttl: Duration::from_secs(args.room_ttl_secs.max(1)),
            worker_id: args.worker_id,
            metrics_port: args.metrics_port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn config(flags: &[&str]) -> Result<EngineConfig, ConfigError> {
        let argv = ["iris-engine", "--model-path", "/m"].iter().chain(flags);
        EngineConfig::from_args(crate::Cli::try_parse_from(argv).unwrap().engine)
    }

    #[test]
    fn defaults_become_durations() {
        let cfg = config(&["--decode-per-step-us", "1500"]).unwrap();
        assert_eq!(cfg.transfer_wait, Duration::from_secs(5));
        assert_eq!(cfg.room_ttl, Duration::from_secs(60));
        assert_eq!(cfg.decode_per_step, Duration::from_micros(1500));
        assert_eq!(cfg.prefill_per_token, Duration::ZERO);
        assert_eq!(cfg.role, Role::Aggregated);
        assert_eq!(cfg.protocol, Protocol::Tokenspeed);
        let cfg = config(&["--protocol", "sglang"]).unwrap();
        assert_eq!(cfg.protocol, Protocol::Sglang);
    }

    #[test]
    fn errors_name_the_flag() {
        let err = config(&["--eos-ppm", "1000001"]).unwrap_err().to_string();
        assert!(err.starts_with("--eos-ppm must be at most"), "{err}");
        let err = config(&["--shm-name-prefix", "a/b"])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("--shm-name-prefix: "), "{err}");
        let err = config(&["--auth-token-file", "/nonexistent/iris-token"])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("--auth-token-file: "), "{err}");
        let err = config(&["--kv-trace", "/tmp/never-opened.jsonl"])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("--kv-trace traces the prefix cache"),
            "{err}"
        );
        let err = config(&[
            "--kv-capacity-tokens",
            "64",
            "--kv-trace",
            "/nonexistent/dir/trace.jsonl",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("--kv-trace: cannot open "), "{err}");
    }
}
