//! `iris serve`: builds the worker pools, the router and the prompt
//! pipeline from the options, and serves the HTTP API with axum.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use iris_model::ModelDir;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::args::{group_with_ports, ServeArgs};
use crate::discovery::Discovery;
use crate::metrics::Metrics;
use crate::mm::Multimodal;
use crate::prompt::Prompter;
use crate::router::{Mode, Router, RouterSettings};
use crate::transport::Lanes;
use crate::workers::affinity::EncodePolicy;
use crate::workers::health::{self, HealthSettings};
use crate::workers::policy::{Policy, PolicyKind};
use crate::workers::worker::Connect;
use crate::workers::{Pool, Role, Worker, WorkerUrl};

/// Everything request handlers share.
pub struct AppState {
    pub router: Router,
    pub prompter: Prompter,
    /// The image pipeline; `None` for a text-only model.
    pub multimodal: Option<Multimodal>,
    pub metrics: Metrics,
    pub model_name: String,
    pub model_path: String,
    pub created: u64,
    pub request_timeout: Duration,
    pub max_payload: usize,
    /// How long requests in flight may finish after shutdown begins.
    pub shutdown_grace: Duration,
    /// Cancelled when the grace period is over: requests still running end.
    pub hard_stop: CancellationToken,
}

impl AppState {
    /// Whether `name` designates the served model.
    pub fn serves(&self, name: &str) -> bool {
        name == self.model_name || name == self.model_path
    }
}

/// Longest wait, at exit, for Abort RPCs still being sent.
const ABORT_FLUSH: Duration = Duration::from_secs(5);

/// A started gateway.
pub struct RunningGateway {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RunningGateway {
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Waits until the server stops (after shutdown, or on an error).
    ///
    /// Shutdown is graceful: once the shutdown token is cancelled no new
    /// connection is accepted and requests in flight may finish for the
    /// grace period (`--shutdown-grace-secs`); then the remaining ones end
    /// with an error event (or 503) and their worker legs get `Abort`,
    /// which is sent before this returns.
    pub async fn wait(self) -> anyhow::Result<()> {
        let RunningGateway {
            state,
            shutdown,
            mut task,
            ..
        } = self;
        let grace_over = async {
            shutdown.cancelled().await;
            tokio::time::sleep(state.shutdown_grace).await;
        };
        let served = tokio::select! {
            served = &mut task => served,
            _ = grace_over => {
                tracing::warn!("shutdown grace period over: ending the requests still in flight");
                state.hard_stop.cancel();
                (&mut task).await
            }
        };
        state.router.flush_aborts(ABORT_FLUSH).await;
        served
            .context("HTTP server task panicked")?
            .context("HTTP server failed")
    }
}

/// Builds the gateway from `args` and starts serving.
pub async fn start(args: ServeArgs) -> anyhow::Result<RunningGateway> {
    let dir = ModelDir::load(&args.model_path)
        .with_context(|| format!("cannot load model directory {}", args.model_path.display()))?;
    let prompter = Prompter::load(
        &dir,
        args.chat_template.as_deref(),
        args.tokenizer_cache_entries,
    )?;
    let multimodal = Multimodal::load(&dir, &args.media)?;
    let discovery = Discovery::from_args(&args.discovery)?;
    let connect = worker_connect(&args)?;
    let mode = build_mode(&args, &connect, discovery.as_ref())?;
    let shutdown = CancellationToken::new();
    if let Some(discovery) = &discovery {
        discovery
            .start(&mode.pools(), connect, shutdown.clone())
            .await?;
    }
    let lanes = Lanes::start(&args.transport, rdma_wanted(&mode, discovery.as_ref()))?;
    health::spawn(mode.pools(), health_settings(&args), shutdown.clone());
    let state = Arc::new(AppState {
        router: Router::new(
            mode,
            RouterSettings {
                max_retries: args.max_retries,
                circuit_breaker_failures: args.circuit_breaker_failures,
                encode_timeout: Duration::from_millis(args.encode_timeout_ms.max(1)),
                encode_max_in_flight: args.encode_max_in_flight,
            },
        )
        .with_lanes(lanes),
        prompter,
        multimodal,
        metrics: Metrics::default(),
        model_name: args
            .served_model_name
            .clone()
            .unwrap_or_else(|| dir.served_model_name()),
        model_path: args.model_path.display().to_string(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
        request_timeout: Duration::from_secs(args.request_timeout_secs.max(1)),
        max_payload: args.max_payload_size,
        shutdown_grace: Duration::from_secs_f64(args.shutdown_grace_secs.clamp(0.0, 86_400.0)),
        hard_stop: CancellationToken::new(),
    });
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let addr = listener.local_addr()?;
    let app = routes(state.clone());
    let token = shutdown.clone();
    let task = tokio::spawn(async move {
        axum::serve(
            listener.tap_io(|tcp| {
                // Streamed chunks must not wait for delayed ACKs.
                let _ = tcp.set_nodelay(true);
            }),
            app,
        )
        .with_graceful_shutdown(token.cancelled_owned())
        .await
    });
    Ok(RunningGateway {
        addr,
        state,
        shutdown,
        task,
    })
}

fn routes(state: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(crate::chat::handle))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/readiness", get(readiness))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

/// Whether an encode worker may ask for the RDMA lane with its own
/// transport: a configured one through its URL option, or — since their
/// `iris.ai/tensor-transport` annotation is only known once they appear —
/// any pod discovery may bring into the encode pool. Decided before the
/// watchers report anything, so the lane is up when such a pod joins.
pub fn rdma_wanted(mode: &Mode, discovery: Option<&Discovery>) -> bool {
    let configured = mode.pools().iter().any(|pool| {
        pool.role == Role::Encode
            && pool.snapshot().iter().any(|w| {
                matches!(
                    w.transport(),
                    Some(iris_transport::Transport::Rdma | iris_transport::Transport::Auto)
                )
            })
    });
    configured || discovery.is_some_and(|d| d.watches(Role::Encode))
}

fn health_settings(args: &ServeArgs) -> HealthSettings {
    let secs = |s: f64| Duration::from_secs_f64(if s.is_finite() && s > 0.0 { s } else { 1.0 });
    HealthSettings {
        interval: secs(args.health_check_interval_secs),
        timeout: secs(args.health_check_timeout_secs),
        failure_threshold: args.health_failure_threshold,
        success_threshold: args.health_success_threshold,
    }
}

/// The pools of the mode the flags ask for, holding the configured
/// workers; a role whose pods are discovered may start with none.
fn build_mode(
    args: &ServeArgs,
    connect: &Connect,
    discovery: Option<&Discovery>,
) -> anyhow::Result<Mode> {
    let discovered = |role: Role| discovery.is_some_and(|d| d.watches(role));
    let pool = |role: Role,
                urls: Vec<WorkerUrl>,
                policy: PolicyKind,
                missing: &str|
     -> anyhow::Result<Arc<Pool>> {
        anyhow::ensure!(!urls.is_empty() || discovered(role), "{missing}");
        let workers = urls
            .into_iter()
            .map(|u| Worker::new(u, role, connect.clone()).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Arc::new(Pool::new(role, workers, Policy::new(policy))))
    };
    if args.epd_disaggregation || args.pd_disaggregation {
        anyhow::ensure!(
            !(args.epd_disaggregation && args.pd_disaggregation),
            "--epd-disaggregation and --pd-disaggregation exclude each other"
        );
        let flag = if args.epd_disaggregation {
            "--epd-disaggregation"
        } else {
            "--pd-disaggregation"
        };
        anyhow::ensure!(
            args.worker_urls.is_empty(),
            "--worker-urls is for aggregated mode; with {flag} use --prefill and --decode"
        );
        let prefill = group_with_ports(&args.prefill).map_err(anyhow::Error::msg)?;
        let decode = parse_urls(&args.decode)?;
        let prefill = pool(
            Role::Prefill,
            prefill,
            args.prefill_policy.unwrap_or(args.policy),
            &format!("{flag} needs at least one --prefill URL (or a --prefill-selector)"),
        )?;
        let decode = pool(
            Role::Decode,
            decode,
            args.decode_policy.unwrap_or(args.policy),
            &format!("{flag} needs at least one --decode URL (or a --decode-selector)"),
        )?;
        if !args.epd_disaggregation {
            anyhow::ensure!(
                args.encode.is_empty(),
                "--encode needs --epd-disaggregation"
            );
            return Ok(Mode::PrefillDecode { prefill, decode });
        }
        let encode = group_with_ports(&args.encode).map_err(anyhow::Error::msg)?;
        return Ok(Mode::EncodePrefillDecode {
            encode: pool(
                Role::Encode,
                encode,
                PolicyKind::LeastLoad,
                "--epd-disaggregation needs at least one --encode URL (or an --encode-selector)",
            )?,
            encode_policy: EncodePolicy::new(args.encode_policy, args.encode_load_factor),
            prefill,
            decode,
        });
    }
    anyhow::ensure!(
        args.prefill.is_empty() && args.decode.is_empty() && args.encode.is_empty(),
        "--prefill/--decode need --pd-disaggregation (and --encode --epd-disaggregation)"
    );
    let urls = parse_urls(&args.worker_urls)?;
    Ok(Mode::Aggregated(pool(
        Role::Aggregated,
        urls,
        args.policy,
        "no workers: give --worker-urls (or --service-discovery with --selector), or --pd-disaggregation with --prefill and --decode",
    )?))
}

/// How workers are reached: `--connect-timeout-ms` and the token of
/// `--worker-auth-token-file`, read once at start-up.
fn worker_connect(args: &ServeArgs) -> anyhow::Result<Connect> {
    Ok(Connect {
        timeout: Duration::from_millis(args.connect_timeout_ms.max(1)),
        token: iris_process::auth::AuthToken::load(args.worker_auth_token_file.as_deref())?,
    })
}

fn parse_urls(urls: &[String]) -> anyhow::Result<Vec<WorkerUrl>> {
    urls.iter()
        .map(|u| WorkerUrl::parse(u))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let model = iris_openai::Model::new(state.model_name.as_str(), state.created, "iris");
    let body = iris_openai::ModelList::new(vec![model]).to_json();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn health() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"status":"ok"}"#,
    )
        .into_response()
}

/// Ready when every role the mode needs has a healthy worker.
async fn readiness(State(state): State<Arc<AppState>>) -> Response {
    let pools = state.router.mode.pools();
    let roles: Vec<serde_json::Value> = pools
        .iter()
        .map(|p| serde_json::json!({"role": p.role.as_str(), "healthy": p.healthy_count(), "total": p.snapshot().len()}))
        .collect();
    let ready = pools.iter().all(|p| p.healthy_count() > 0);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({"ready": ready, "roles": roles}).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut body = state.metrics.render(
        &state.router.mode.pools(),
        state.router.retries(),
        &[("encode", &state.router.encode_time)],
    );
    if let Some(mm) = &state.multimodal {
        render_pixel_cache(&mut body, &mm.cache_stats());
    }
    state.router.lanes.render(&mut body);
    let (hits, misses) = state.prompter.cache_stats();
    body.push_str(&format!(
        "# HELP iris_tokenizer_cache_total Prompt segments tokenized, by cache result.\n# TYPE iris_tokenizer_cache_total counter\niris_tokenizer_cache_total{{result=\"hit\"}} {hits}\niris_tokenizer_cache_total{{result=\"miss\"}} {misses}\n"
    ));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

fn render_pixel_cache(out: &mut String, stats: &iris_cache::CacheStats) {
    use std::fmt::Write;
    let _ = write!(
        out,
        "# HELP iris_pixel_cache_lookups_total Image preprocessing lookups by result (joined: waited for a concurrent miss).\n# TYPE iris_pixel_cache_lookups_total counter\n\
         iris_pixel_cache_lookups_total{{result=\"hit\"}} {}\niris_pixel_cache_lookups_total{{result=\"miss\"}} {}\niris_pixel_cache_lookups_total{{result=\"joined\"}} {}\n\
         # HELP iris_pixel_cache_evictions_total Entries evicted to stay within the byte bound.\n# TYPE iris_pixel_cache_evictions_total counter\niris_pixel_cache_evictions_total {}\n\
         # HELP iris_pixel_cache_bytes Bytes held by the pixel cache.\n# TYPE iris_pixel_cache_bytes gauge\niris_pixel_cache_bytes {}\n\
         # HELP iris_pixel_cache_entries Entries in the pixel cache.\n# TYPE iris_pixel_cache_entries gauge\niris_pixel_cache_entries {}\n",
        stats.hits, stats.misses, stats.joined, stats.evictions, stats.bytes, stats.entries
    );
}

async fn not_found() -> Response {
    crate::chat::error_response(&iris_openai::ApiError::not_found("no such route"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    /// `rdma_wanted` for an EPD gateway with the extra flags `flags`.
    fn wanted(flags: &[&str]) -> bool {
        let base = ["iris", "--model-path", "/m", "--epd-disaggregation"];
        let argv = base.iter().chain(flags);
        let args = Cli::try_parse_from(argv).unwrap().serve;
        let discovery = Discovery::from_args(&args.discovery).unwrap();
        let mode = build_mode(&args, &worker_connect(&args).unwrap(), discovery.as_ref()).unwrap();
        rdma_wanted(&mode, discovery.as_ref())
    }

    #[tokio::test]
    async fn rdma_is_wanted_by_encode_workers_configured_or_discovered() {
        let pd = ["--prefill", "grpc://p:1", "--decode", "grpc://d:1"];
        let with = |extra: &[&'static str]| [&pd[..], extra].concat();
        assert!(!wanted(&with(&["--encode", "grpc://e:1"])));
        assert!(wanted(&with(&["--encode", "grpc://e:1?transport=rdma"])));
        assert!(wanted(&with(&["--encode", "grpc://e:1?transport=auto"])));
        // Only encode workers receive tensors.
        assert!(!wanted(&[
            "--encode",
            "grpc://e:1",
            "--prefill",
            "grpc://p:1?transport=rdma",
            "--decode",
            "grpc://d:1",
        ]));
        // Discovered encode pods may carry the annotation: wanted before
        // any pod is known; discovered prefill/decode pods alone do not.
        let discovered_pd = [
            "--service-discovery",
            "--prefill-selector",
            "r=p",
            "--decode-selector",
            "r=d",
        ];
        assert!(!wanted(
            &[&discovered_pd[..], &["--encode", "grpc://e:1"]].concat()
        ));
        assert!(wanted(
            &[&discovered_pd[..], &["--encode-selector", "r=e"]].concat()
        ));
    }
}
