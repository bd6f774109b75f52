//! `iris serve`: builds the worker pools, the router and the prompt
//! pipeline from the options, and serves the HTTP API (axum routes behind
//! the connection limits of [`crate::listen`]; HTTPS with
//! `--tls-cert-file`, its certificate re-read as its files change), with
//! `/metrics` and the admin API ([`crate::admin`]) on their own port (plain
//! HTTP) when `--metrics-port` is set.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::{Extension, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use iris_openai::{ApiError, ErrorKind};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::admin::Admin;
use crate::args::ServeArgs;
use crate::build::{Builder, Loaded};
use crate::chat::Chat;
use crate::completions::Completions;
use crate::config::{Config, ListenConfig};
use crate::http::error_response;
use crate::http::serve::serve;
use crate::keys::{ApiKeys, Caller};
use crate::listen::{ConnLimits, ConnStats, Stop};
use crate::messages::Messages;
use crate::metrics::{Metrics, ModelSources};
use crate::reload::Reloader;
use crate::served::{Models, Registry};
use crate::transport::Lanes;
use crate::workers::Pool;

/// Everything request handlers share.
pub struct AppState {
    /// Every served model's bundle, by the names requests use (swapped
    /// whole by a reload).
    pub models: Registry,
    /// Re-reads the configuration file (`None` without `--config`).
    pub reloader: Option<Reloader>,
    /// The admin API's token, settings and counters.
    pub admin: Admin,
    /// The tenants of `--api-keys-file` (`None`: the API is open).
    pub keys: Option<Arc<ApiKeys>>,
    /// The HTTP port's TLS (`None`: plain HTTP).
    pub tls: Option<iris_process::tls::ServerTls>,
    pub metrics: Arc<Metrics>,
    pub request_timeout: Duration,
    pub max_payload: usize,
    /// What the request parser is told (`--max-constraint-bytes`).
    pub parse_options: iris_openai::ParseOptions,
    /// Time for a whole request body to arrive (408 past it).
    pub body_read_timeout: Duration,
    /// Connection counters per listener (`api`, and `metrics` with
    /// `--metrics-port`).
    pub connection_stats: Vec<(&'static str, Arc<ConnStats>)>,
    /// How long requests in flight may finish after shutdown begins.
    pub shutdown_grace: Duration,
    /// Cancelled when the grace period is over: requests still running end.
    pub hard_stop: CancellationToken,
    /// Stored `/v1/responses` answers (`--responses-store`).
    pub responses: Arc<dyn crate::responses::store::ResponseStore>,
    /// The span exporter of `--otlp-endpoint` (`None`: requests are not
    /// traced).
    pub traces: Option<iris_otel::Traces>,
}

/// Longest wait, at exit, for Abort RPCs still being sent.
const ABORT_FLUSH: Duration = Duration::from_secs(5);

/// A started gateway.
pub struct RunningGateway {
    pub addr: SocketAddr,
    /// Where `/metrics` is served when `--metrics-port` is set.
    pub metrics_addr: Option<SocketAddr>,
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
        for served in state.models.load().all() {
            served.router.flush_aborts(ABORT_FLUSH).await;
        }
        iris_otel::shut_down(state.traces.clone()).await;
        served
            .context("HTTP server task panicked")?
            .context("HTTP server failed")
    }
}

/// Validates `args` ([`Config::from_args`]) and starts serving.
pub async fn start(args: ServeArgs) -> anyhow::Result<RunningGateway> {
    start_with(Config::from_args(args)?).await
}

/// Builds the gateway from `config` and starts serving.
pub async fn start_with(config: Config) -> anyhow::Result<RunningGateway> {
    let shutdown = CancellationToken::new();
    let mut loaded = Vec::new();
    for spec in &config.models {
        loaded.push(Loaded::load(spec, &config.connect, &config.router)?);
    }
    let rdma = loaded.iter().any(Loaded::wants_rdma);
    let lanes = Arc::new(Lanes::start(&config.transport, rdma)?);
    let builder = Builder::new(&config, lanes, shutdown.clone());
    let mut served = Vec::new();
    for model in loaded {
        served.push(Arc::new(builder.start(model).await?));
    }
    let limits = conn_limits(&config.listen);
    let host = config.listen.host.as_str();
    let listener = iris_process::listen(host, config.listen.port, "--port").await?;
    let metrics_listener = match config.listen.metrics_port {
        Some(port) => Some(iris_process::listen(host, port, "--metrics-port").await?),
        None => None,
    };
    let api_stats = Arc::new(ConnStats::default());
    let metrics_stats = Arc::new(ConnStats::default());
    let mut connection_stats = vec![("api", api_stats.clone())];
    if metrics_listener.is_some() {
        connection_stats.push(("metrics", metrics_stats.clone()));
    }
    let patience = config.request_timeout + config.shutdown_grace;
    let admin = Admin::new(
        config.admin_token.clone(),
        config.connect.clone(),
        config.health,
        patience,
    );
    let reloader = config
        .file
        .clone()
        .map(|source| Reloader::new(source, builder, patience));
    let state = Arc::new(AppState {
        models: Registry::new(Models::new(served)?),
        reloader,
        admin,
        keys: config.api_keys.clone(),
        tls: config.listen.tls.clone(),
        metrics: Arc::new(Metrics::new("")),
        request_timeout: config.request_timeout,
        max_payload: config.max_payload_bytes,
        parse_options: iris_openai::ParseOptions {
            max_constraint_bytes: config.max_constraint_bytes,
        },
        body_read_timeout: config.listen.body_read_timeout,
        connection_stats,
        shutdown_grace: config.shutdown_grace,
        hard_stop: CancellationToken::new(),
        responses: crate::responses::store::open(&config.responses_store).await?,
        traces: config.otlp.start("iris-gateway")?,
    });
    crate::reload::on_hangup(&state, shutdown.clone());
    crate::keys::announce(state.keys.as_deref(), host);
    if let Some(keys) = &state.keys {
        keys.watch(shutdown.clone());
    }
    if let Some(tls) = &state.tls {
        tls.watch(shutdown.clone());
    }
    let addr = listener.local_addr()?;
    let metrics_addr = metrics_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;
    let stop = Stop {
        graceful: shutdown.clone(),
        hard: state.hard_stop.clone(),
    };
    let api = crate::listen::serve(
        listener,
        routes(state.clone(), metrics_listener.is_none()),
        limits.clone(),
        api_stats,
        stop.clone(),
    );
    let metrics = metrics_listener.map(|listener| {
        // Probes and scrapes: few connections, open until the API port
        // has drained (Prometheus sees the shutdown through).
        let limits = ConnLimits {
            max_connections: METRICS_MAX_CONNECTIONS,
            tls: None,
            ..limits
        };
        let stop = Stop {
            graceful: CancellationToken::new(),
            hard: stop.hard.clone(),
        };
        let done = stop.graceful.clone();
        let served = crate::listen::serve(
            listener,
            metrics_routes(state.clone()),
            limits,
            metrics_stats,
            stop,
        );
        (served, done)
    });
    let task = tokio::spawn(async move {
        let Some((metrics, metrics_done)) = metrics else {
            return api.await;
        };
        let api = async {
            let served = api.await;
            metrics_done.cancel();
            served
        };
        let (api, metrics) = tokio::join!(api, metrics);
        api.and(metrics)
    });
    Ok(RunningGateway {
        addr,
        metrics_addr,
        state,
        shutdown,
        task,
    })
}

/// Connections the `--metrics-port` listener keeps open at once.
const METRICS_MAX_CONNECTIONS: usize = 256;

/// The connection limits the flags ask for, the cap lowered to what the
/// open-file limit (raised to its hard limit first) can hold.
fn conn_limits(listen: &ListenConfig) -> ConnLimits {
    ConnLimits {
        max_connections: fd_capped(listen.max_connections, iris_process::raise_fd_limit()),
        header_read_timeout: listen.header_read_timeout,
        keep_alive: listen.keep_alive,
        max_requests: listen.max_requests_per_connection,
        tls: listen
            .tls
            .as_ref()
            .map(iris_process::tls::ServerTls::acceptor),
    }
}

/// `max` lowered so that the connections and a reserve for everything
/// else (worker channels, files, the metrics port) fit under the open-file
/// limit `fd_limit` (`None`: unknown, `max` stands).
fn fd_capped(max: usize, fd_limit: Option<u64>) -> usize {
    let Some(limit) = fd_limit else {
        return max.max(1);
    };
    let reserve = (limit / 4).min(1024);
    let fits = usize::try_from(limit.saturating_sub(reserve)).unwrap_or(usize::MAX);
    if max > fits {
        tracing::warn!(
            max_connections = max,
            open_file_limit = limit,
            effective = fits.max(1),
            "--max-connections lowered to fit the open-file limit"
        );
    }
    max.min(fits).max(1)
}

/// A route: method, path (`{id}` stands for the rest of the path) and
/// handler.
type Route = (&'static str, &'static str, MethodRouter<Arc<AppState>>);

/// The API routes, in the order the 404 lists them; the one place a new
/// endpoint is registered. All but the probes take an API key when the
/// gateway has a keys file ([`keyed`]).
fn api_routes() -> Vec<Route> {
    vec![
        ("POST", "/v1/chat/completions", post(serve::<Chat>)),
        ("POST", "/v1/completions", post(serve::<Completions>)),
        ("POST", "/v1/messages", post(serve::<Messages>)),
        (
            "POST",
            "/v1/messages/count_tokens",
            post(crate::messages::count_tokens),
        ),
        (
            "POST",
            "/v1/responses",
            post(serve::<crate::responses::Responses>),
        ),
        (
            "GET",
            "/v1/responses/{response_id}",
            get(crate::responses::retrieve),
        ),
        (
            "DELETE",
            "/v1/responses/{response_id}",
            axum::routing::delete(crate::responses::delete),
        ),
        (
            "GET",
            "/v1/responses/{response_id}/input_items",
            get(crate::responses::input_items),
        ),
        ("GET", "/v1/models", get(models)),
        ("GET", "/v1/models/{id}", get(model)),
        ("POST", "/v1/tokenize", post(crate::tokenize::tokenize)),
        ("POST", "/v1/detokenize", post(crate::tokenize::detokenize)),
        ("GET", "/health", get(health)),
        ("GET", "/readiness", get(readiness)),
    ]
}

/// Whether route `path` requires an API key (with `--api-keys-file`):
/// every `/v1/…` route; the probes, `/metrics` and the admin API (its own
/// token) do not.
fn keyed(path: &str) -> bool {
    path.starts_with("/v1/")
}

/// `/metrics`.
fn metrics_route() -> Route {
    ("GET", "/metrics", get(metrics))
}

/// The admin API ([`crate::admin`]; each handler checks the token).
fn admin_routes() -> Vec<Route> {
    use crate::admin::workers;
    vec![
        ("POST", "/admin/reload", post(crate::reload::admin_reload)),
        ("GET", "/admin/workers", get(workers::list)),
        ("POST", "/admin/workers", post(workers::add)),
        (
            "POST",
            "/admin/workers/{worker}/drain",
            post(workers::drain),
        ),
        (
            "DELETE",
            "/admin/workers/{worker}",
            axum::routing::delete(workers::delete),
        ),
    ]
}

/// The API routes, with `/metrics` and the admin API unless they have a
/// port of their own (`--metrics-port`).
fn routes(state: Arc<AppState>, with_metrics: bool) -> axum::Router {
    let mut table = api_routes();
    if with_metrics {
        table.push(metrics_route());
        table.extend(admin_routes());
    }
    router_of(table, &state).with_state(state)
}

/// The `--metrics-port` routes: `/metrics`, the probes and the admin API.
fn metrics_routes(state: Arc<AppState>) -> axum::Router {
    let mut table = vec![
        metrics_route(),
        ("GET", "/health", get(health)),
        ("GET", "/readiness", get(readiness)),
    ];
    table.extend(admin_routes());
    router_of(table, &state).with_state(state)
}

/// The router serving `table`, the [`keyed`] routes behind the API-key
/// check, with its 404 and 405 answers.
fn router_of(table: Vec<Route>, state: &Arc<AppState>) -> axum::Router<Arc<AppState>> {
    let served: Vec<(&'static str, &'static str)> = table
        .iter()
        .map(|(method, path, _)| (*method, *path))
        .collect();
    let mut open = axum::Router::new();
    let mut keys = axum::Router::new();
    let mut any_keyed = false;
    for (_, path, handler) in table {
        // `{id}` takes the rest of the path (a model id may hold slashes).
        let route = path.replace("{id}", "{*id}");
        if keyed(path) {
            keys = keys.route(&route, handler);
            any_keyed = true;
        } else {
            open = open.route(&route, handler);
        }
    }
    if any_keyed && state.keys.is_some() {
        // (A layer on a router without routes is refused.)
        let require = axum::middleware::from_fn_with_state(state.clone(), crate::keys::require);
        open = open.merge(keys.route_layer(require));
    } else {
        // Without a keys file the gateway is open: no layer on the
        // request path.
        open = open.merge(keys);
    }
    with_errors(open, &served)
}

/// `router` answering a wrong method on one of its routes with 405 and
/// any other path with 404, both in the OpenAI error shape and naming the
/// routes (`served`) it does serve.
fn with_errors(
    router: axum::Router<Arc<AppState>>,
    served: &[(&'static str, &'static str)],
) -> axum::Router<Arc<AppState>> {
    let listing: Arc<str> = served
        .iter()
        .map(|(method, path)| format!("{method} {path}"))
        .collect::<Vec<_>>()
        .join(", ")
        .into();
    let served: Arc<[(&'static str, &'static str)]> = served.into();
    router
        .method_not_allowed_fallback(move |method, uri| wrong_method(method, uri, served.clone()))
        .fallback(move |method, uri| not_found(method, uri, listing.clone()))
}

/// `GET /v1/models`: every model (with its aliases) the caller may use.
async fn models(State(state): State<Arc<AppState>>, caller: Option<Extension<Caller>>) -> Response {
    let caller = caller.map(|Extension(c)| c);
    let listed = state
        .models
        .load()
        .all()
        .iter()
        .filter(|s| crate::keys::may_see(caller.as_ref(), s))
        .flat_map(|s| s.listings())
        .collect();
    let body = iris_openai::ModelList::new(listed).to_json();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn health() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"status":"ok"}"#,
    )
        .into_response()
}

/// Ready when every role each model's mode needs has a healthy worker.
async fn readiness(State(state): State<Arc<AppState>>) -> Response {
    let pools: Vec<Arc<Pool>> = state
        .models
        .load()
        .all()
        .iter()
        .flat_map(|s| s.router.mode.pools())
        .collect();
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

/// `/metrics`: the request and worker families with a `model` label, one
/// sample set per served model; the media, lane, KV-index and tokenizer
/// families are the first model's.
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let models = state.models.load();
    let sources: Vec<ModelSources> = models
        .all()
        .iter()
        .map(|served| ModelSources {
            metrics: &served.metrics,
            pools: served.router.mode.pools(),
            retries: served.router.retries(),
            adapter_loads: served.router.adapters.loads(),
            adapter_unloads: served.router.adapters.unloads(),
            more_stages: vec![("encode", &served.router.encode_time)],
            admission: served.router.fair.as_ref().map(|fair| fair.counts()),
        })
        .collect();
    let mut body = crate::metrics::render(&state.metrics, &sources);
    let served = models.first();
    let router = &served.router;
    if let Some(mm) = &served.media {
        render_pixel_cache(&mut body, &mm.cache_stats());
        render_tensor_memory(&mut body, &iris_vision::tensor_memory_stats());
        mm.budget().render(&mut body);
    }
    router.lanes.render(&mut body);
    router.render_migrations(&mut body);
    served.kv.render(&mut body);
    crate::listen::render_stats(&mut body, &state.connection_stats);
    if let Some(reloader) = &state.reloader {
        reloader.render(&mut body);
    }
    state.admin.render(&mut body);
    if let Some(keys) = &state.keys {
        keys.render(&mut body);
    }
    if let Some(tls) = &state.tls {
        render_tls_reloads(&mut body, tls.reloads());
    }
    let (hits, misses) = served.prompter.cache_stats();
    iris_metrics::family(
        &mut body,
        "iris_tokenizer_cache_total",
        "counter",
        "Prompt segments tokenized, by cache result.",
        [("result=\"hit\"", hits), ("result=\"miss\"", misses)],
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// The HTTP port's certificate reloads (`--tls-cert-file`).
fn render_tls_reloads(out: &mut String, (taken, refused): (u64, u64)) {
    iris_metrics::family(
        out,
        "iris_tls_certificate_reloads_total",
        "counter",
        "Changes of the --tls-cert-file/--tls-key-file pair: loaded (new handshakes get it) or refused (the loaded certificate kept).",
        [("result=\"loaded\"", taken), ("result=\"refused\"", refused)],
    );
}

fn render_pixel_cache(out: &mut String, stats: &iris_cache::CacheStats) {
    iris_metrics::family(
        out,
        "iris_pixel_cache_lookups_total",
        "counter",
        "Image preprocessing lookups by result (joined: waited for a concurrent miss).",
        [
            ("result=\"hit\"", stats.hits),
            ("result=\"miss\"", stats.misses),
            ("result=\"joined\"", stats.joined),
        ],
    );
    let plain = [
        (
            "iris_pixel_cache_evictions_total",
            "counter",
            "Entries evicted to stay within the byte bound.",
            stats.evictions,
        ),
        (
            "iris_pixel_cache_bytes",
            "gauge",
            "Bytes held by the pixel cache.",
            stats.bytes as u64,
        ),
        (
            "iris_pixel_cache_entries",
            "gauge",
            "Entries in the pixel cache.",
            stats.entries as u64,
        ),
    ];
    for (name, kind, help, value) in plain {
        iris_metrics::family(out, name, kind, help, [("", value)]);
    }
}

/// The memory prepared for tensors ahead of the images (the pixel cache's).
fn render_tensor_memory(out: &mut String, stats: &iris_vision::TensorMemoryStats) {
    let gauges = [
        (
            "iris_mm_prepared_memory_target_bytes",
            "Bytes of tensor memory to prepare in the background (unless --mm-pixel-memory-on-demand).",
            stats.target_bytes,
        ),
        (
            "iris_mm_prepared_memory_bytes",
            "Bytes of tensor memory prepared so far (faulted in, resident).",
            stats.prepared_bytes,
        ),
        (
            "iris_mm_prepared_memory_free_bytes",
            "Prepared bytes no tensor holds now.",
            stats.free_bytes,
        ),
    ];
    for (name, help, value) in gauges {
        iris_metrics::family(out, name, "gauge", help, [("", value as u64)]);
    }
    iris_metrics::family(
        out,
        "iris_mm_prepared_memory_tensors_total",
        "counter",
        "Tensors whose memory was prepared memory.",
        [("", stats.served)],
    );
}

/// `GET /v1/models/{id}`: the served model under its name or any alias
/// `model` accepts (its path), else 404 `model_not_found` (also for a
/// model the caller's tenant may not use).
async fn model(
    State(state): State<Arc<AppState>>,
    caller: Option<Extension<Caller>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    // The wildcard drops the slash of an absolute path; either form names it.
    let absolute = format!("/{id}");
    let (served, name) = match state.models.get(&id) {
        Ok(served) => (served, id),
        Err(error) => match state.models.get(&absolute) {
            Ok(served) => (served, absolute),
            Err(_) => return error_response(&error),
        },
    };
    if !crate::keys::may_see(caller.map(|Extension(c)| c).as_ref(), &served) {
        return error_response(&ApiError::model_not_found(&name));
    }
    // An alias answers as itself; the hidden path alias as the model.
    let listed = if served.aliases.contains(&name) {
        name.as_str()
    } else {
        served.name.as_str()
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        served.listing(listed).to_json(),
    )
        .into_response()
}

/// The path as asked for, cut to 200 characters.
fn short_path(uri: &axum::http::Uri) -> String {
    uri.path().chars().take(200).collect()
}

/// 404 naming the method and path asked for and the routes served.
async fn not_found(
    method: axum::http::Method,
    uri: axum::http::Uri,
    listing: Arc<str>,
) -> Response {
    let path = short_path(&uri);
    let message = format!("no route for {method} {path}; this gateway serves {listing}");
    error_response(&ApiError::not_found(message).with_code("not_found"))
}

/// 405 naming the method, the path and the methods the path takes (also
/// in `Allow`).
async fn wrong_method(
    method: axum::http::Method,
    uri: axum::http::Uri,
    served: Arc<[(&'static str, &'static str)]>,
) -> Response {
    let path = short_path(&uri);
    let allowed: Vec<&str> = served
        .iter()
        .filter(|(_, route)| route_matches(route, uri.path()))
        .map(|(m, _)| *m)
        .collect();
    let allow = allowed.join(", ");
    let message = format!("{method} is not allowed on {path}; it takes {allow}");
    let error =
        ApiError::new(405, ErrorKind::InvalidRequest, message).with_code("method_not_allowed");
    let mut response = error_response(&error);
    if let Ok(value) = header::HeaderValue::from_str(&allow) {
        response.headers_mut().insert(header::ALLOW, value);
    }
    response
}

/// Whether `path` is one of `route`'s (`{id}` stands for the rest, any
/// other `{name}` for one segment).
fn route_matches(route: &str, path: &str) -> bool {
    if let Some(prefix) = route.strip_suffix("{id}") {
        return path.starts_with(prefix) && path.len() > prefix.len();
    }
    let mut segments = path.split('/');
    route.split('/').all(|want| {
        segments
            .next()
            .is_some_and(|got| got == want || (want.starts_with('{') && !got.is_empty()))
    }) && segments.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_cap_fits_the_open_file_limit() {
        assert_eq!(fd_capped(32768, None), 32768);
        assert_eq!(fd_capped(100, Some(20_000)), 100);
        // 20 000 descriptors: 1024 kept for workers and files.
        assert_eq!(fd_capped(32768, Some(20_000)), 18_976);
        // Small limits keep a quarter in reserve.
        assert_eq!(fd_capped(5000, Some(1024)), 768);
        assert_eq!(fd_capped(0, Some(1024)), 1);
    }
}
