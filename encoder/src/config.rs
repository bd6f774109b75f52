//! The encoder's runtime configuration: [`EncoderConfig::from_args`] turns
//! the parsed command line ([`EncoderArgs`]) into typed settings
//! (durations, sizes in bytes, the shm names accepted, the auth token) and
//! performs every check on the flags, each error naming its flag. Only
//! this module (and the entry points that parse) read [`crate::args`];
//! defaults live in the clap definitions alone.

use std::path::PathBuf;
use std::time::Duration;

use iris_process::auth::AuthToken;
use iris_process::tls::ServerTls;
use iris_transport::shm::ShmNames;

use crate::args::{EncoderArgs, ReceiveArgs};

const MIB: u64 = 1 << 20;

/// Which vision encoder computes the embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ComputeKind {
    /// The model's vision tower on the CPU, weights from the model directory.
    Tower,
    /// A deterministic digest of the pixels with the model's output shape
    /// (no weights; for tests and routing benchmarks).
    Digest,
}

/// Everything `iris-encoder` runs with.
#[derive(Debug, Clone)]
pub struct EncoderConfig {
    pub compute: ComputeKind,
    pub host: String,
    pub port: u16,
    pub bootstrap_port: u16,
    pub metrics_port: u16,
    pub model_path: PathBuf,
    /// Largest batch, in patches (at least 1).
    pub max_batch_patches: u64,
    /// `None`: the model's largest image.
    pub max_patches_per_item: Option<u64>,
    /// `None`: one item of the largest size taken, plus slack.
    pub max_message_bytes: Option<u64>,
    /// The shared secret of `--auth-token-file`, read once.
    pub auth_token: Option<AuthToken>,
    /// TLS on the gRPC port (`--tls-cert-file` and the rest), read and
    /// checked; `None`: plain.
    pub tls: Option<ServerTls>,
    pub coalesce_window: Duration,
    /// Batches computed at once (at least 1).
    pub dispatch_width: usize,
    /// Encode requests that may wait (at least 1).
    pub queue_capacity: usize,
    pub embedding_cache_bytes: u64,
    pub max_held_bytes: u64,
    /// How long an uncollected embedding is kept (at least 1 s).
    pub room_ttl: Duration,
    /// The wait a fetch gets when it asks for none.
    pub fetch_wait: Duration,
    /// `None`: `encode@host:port`.
    pub worker_id: Option<String>,
    /// `None`: the model directory's name.
    pub served_model_name: Option<String>,
    pub expose_model_path: bool,
    pub receive: ReceiveConfig,
    /// Where the encoder's spans go (`--otlp-endpoint`).
    pub otlp: iris_otel::OtlpArgs,
}

/// How pixel tensors are received.
#[derive(Debug, Clone)]
pub struct ReceiveConfig {
    /// The NIXL receiver (RDMA lane).
    pub remote: iris_transport::RemoteSettings,
    /// The shm file-name prefixes accepted.
    pub shm_names: ShmNames,
}

/// A flag the encoder cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl EncoderConfig {
    /// Validates `args`; reads the auth token file.
    pub fn from_args(args: EncoderArgs) -> Result<EncoderConfig, ConfigError> {
        let auth_token = AuthToken::load(args.auth_token_file.as_deref())
            .map_err(|e| ConfigError(format!("--auth-token-file: {e:#}")))?;
        iris_otel::check_ratio(args.otlp.otlp_sample_ratio)
            .map_err(|e| ConfigError(e.to_string()))?;
        Ok(EncoderConfig {
            otlp: args.otlp.clone(),
            compute: args.compute,
            host: args.host,
            port: args.port,
            bootstrap_port: args.bootstrap_port,
            metrics_port: args
                .metrics_port
                .unwrap_or_else(|| default_metrics_port(args.port)),
            model_path: args.model_path,
            max_batch_patches: args.max_batch_patches.max(1),
            max_patches_per_item: args.max_patches_per_item,
            max_message_bytes: args
                .max_message_mb
                .map(|mb| mib("--max-message-mb", mb))
                .transpose()?,
            auth_token,
            tls: iris_process::tls::server_flags(
                args.tls_cert_file.as_deref(),
                args.tls_key_file.as_deref(),
                args.tls_client_ca_file.as_deref(),
            )
            .map_err(ConfigError)?,
            coalesce_window: Duration::from_millis(args.coalesce_window_ms),
            dispatch_width: args.dispatch_width.max(1),
            queue_capacity: args.queue_capacity.max(1),
            embedding_cache_bytes: mib("--embedding-cache-mb", args.embedding_cache_mb)?,
            max_held_bytes: mib("--max-held-mb", args.max_held_mb)?,
            room_ttl: Duration::from_secs(args.room_ttl_secs.max(1)),
            fetch_wait: Duration::from_millis(args.fetch_wait_ms),
            worker_id: args.worker_id,
            served_model_name: args.served_model_name,
            expose_model_path: args.expose_model_path,
            receive: receive(&args.receive)?,
        })
    }
}

/// `mb` MiB in bytes; an error names `flag` when it overflows.
fn mib(flag: &str, mb: u64) -> Result<u64, ConfigError> {
    mb.checked_mul(MIB)
        .ok_or_else(|| ConfigError(format!("{flag} {mb} is too large")))
}

fn receive(args: &ReceiveArgs) -> Result<ReceiveConfig, ConfigError> {
    Ok(ReceiveConfig {
        remote: args.nixl.settings().map_err(ConfigError)?,
        shm_names: args.shm.names().map_err(ConfigError)?,
    })
}

/// `--metrics-port` when unset: the port after `--port`, or 0 (pick one)
/// when `--port` is 0 or the last port.
pub fn default_metrics_port(port: u16) -> u16 {
    match port {
        0 | u16::MAX => 0,
        port => port + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn config(flags: &[&str]) -> Result<EncoderConfig, ConfigError> {
        let argv = ["iris-encoder", "--model-path", "/m"].iter().chain(flags);
        EncoderConfig::from_args(crate::Cli::try_parse_from(argv).unwrap().encoder)
    }

    #[test]
    fn defaults_become_durations_and_bytes() {
        let cfg = config(&[]).unwrap();
        assert_eq!(cfg.coalesce_window, Duration::from_millis(2));
        assert_eq!(cfg.room_ttl, Duration::from_secs(60));
        assert_eq!(cfg.max_held_bytes, 4096 * MIB);
        assert_eq!(cfg.receive.remote.landing_slot_bytes, 32 << 20);
        assert_eq!(cfg.receive.remote.landing_wait, Duration::from_millis(1000));
        assert_eq!(cfg.receive.remote.read_timeout, Duration::from_millis(2000));
        assert_eq!(cfg.max_message_bytes, None);
        assert_eq!(cfg.metrics_port, 30101, "--port + 1");
    }

    #[test]
    fn the_metrics_port_follows_the_grpc_port() {
        assert_eq!(config(&["--port", "40000"]).unwrap().metrics_port, 40001);
        assert_eq!(config(&["--port", "0"]).unwrap().metrics_port, 0, "picked");
        let given = config(&["--port", "0", "--metrics-port", "9100"]).unwrap();
        assert_eq!(given.metrics_port, 9100);
    }

    #[test]
    fn errors_name_the_flag() {
        let too_large = u64::MAX.to_string();
        for flag in ["--max-message-mb", "--embedding-cache-mb", "--max-held-mb"] {
            let err = config(&[flag, &too_large]).unwrap_err().to_string();
            assert!(err.starts_with(&format!("{flag} ")), "{err}");
        }
        let err = config(&["--shm-name-prefix", "../x"]).unwrap_err();
        assert!(err.to_string().starts_with("--shm-name-prefix: "), "{err}");
        let err = config(&["--auth-token-file", "/nonexistent/iris-token"]).unwrap_err();
        assert!(err.to_string().starts_with("--auth-token-file: "), "{err}");
    }
}
