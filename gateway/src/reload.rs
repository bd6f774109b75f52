//! Re-reading the configuration file (`SIGHUP`, `POST /admin/reload`):
//! the file is read and checked again over the command line the gateway
//! started with; a model it adds is built and starts serving, one whose
//! settings changed is rebuilt, one it no longer lists stops taking
//! requests and drains (its requests in flight finish, then its health
//! checks and subscriptions stop). The new set of models replaces the old
//! in one swap. A file that does not check out, or a model that does not
//! load, is refused whole: the running models are kept. Top-level
//! (gateway-wide) settings apply at the next start only; a change to them
//! is logged. Reloads run one at a time and are counted
//! (`iris_config_reloads_total`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use iris_openai::{ApiError, ErrorKind};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::admin::Authorized;
use crate::build::{drain, Builder};
use crate::config::file::{self, Source};
use crate::http::error_response;
use crate::served::{Models, Registry, Served};
use crate::server::AppState;

/// What a reload changed, by model name.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Every model served after it, in the file's order.
    pub models: Vec<String>,
    pub added: Vec<String>,
    /// Rebuilt: their settings changed.
    pub changed: Vec<String>,
    /// Draining, then stopped.
    pub removed: Vec<String>,
    pub unchanged: Vec<String>,
}

/// Re-reads the configuration file and swaps the served models.
pub struct Reloader {
    source: Source,
    builder: Builder,
    /// How long a removed model's requests may take to finish.
    patience: Duration,
    /// One reload at a time.
    running: tokio::sync::Mutex<()>,
    /// Reloads applied, refused.
    outcomes: [AtomicU64; 2],
}

impl Reloader {
    /// Reloads `source` with `builder`; removed models drain for at most
    /// `patience`.
    pub fn new(source: Source, builder: Builder, patience: Duration) -> Reloader {
        Reloader {
            source,
            builder,
            patience,
            running: tokio::sync::Mutex::new(()),
            outcomes: Default::default(),
        }
    }

    /// Re-reads the file and serves its models from now on, or refuses
    /// it (the running models stay).
    pub async fn reload(&self, registry: &Registry) -> anyhow::Result<Report> {
        let _one = self.running.lock().await;
        let outcome = self.apply(registry).await;
        let slot = usize::from(outcome.is_err());
        self.outcomes[slot].fetch_add(1, Ordering::Relaxed);
        match &outcome {
            Ok(report) => tracing::info!(
                added = ?report.added,
                changed = ?report.changed,
                removed = ?report.removed,
                "configuration reloaded"
            ),
            Err(error) => tracing::error!(
                error = format!("{error:#}"),
                "configuration reload refused: the running models are kept"
            ),
        }
        outcome
    }

    async fn apply(&self, registry: &Registry) -> anyhow::Result<Report> {
        let loaded = file::reload(&self.source)?;
        if loaded.source.top != self.source.top {
            tracing::warn!(
                file = %self.source.path.display(),
                "the file's top-level (gateway-wide) settings changed: they apply at the next start"
            );
        }
        let current = registry.load();
        let mut report = Report::default();
        let mut next = Vec::new();
        for spec in &loaded.models {
            let name = spec.model.served_name.clone().unwrap_or_default();
            let running = current.all().iter().find(|s| s.name == name);
            let served = match running {
                Some(served) if served.source == spec.source => {
                    report.unchanged.push(name.clone());
                    served.clone()
                }
                _ => {
                    let built = self.builder.build(spec).await;
                    let built = built.map_err(|e| {
                        stop_new(&next, &current);
                        e.context(format!("model \"{name}\" does not load"))
                    })?;
                    let list = match running {
                        Some(_) => &mut report.changed,
                        None => &mut report.added,
                    };
                    list.push(name.clone());
                    Arc::new(built)
                }
            };
            report.models.push(name);
            next.push(served);
        }
        self.first_checks(&next, &current).await;
        let old = registry.swap(Models::new(next.clone())?);
        for served in old.all() {
            if next.iter().any(|n| Arc::ptr_eq(n, served)) {
                continue;
            }
            if !report.models.contains(&served.name) {
                report.removed.push(served.name.clone());
            }
            tokio::spawn(drain(served.clone(), self.patience));
        }
        Ok(report)
    }

    /// Waits (at most one health check's timeout, and a little) until
    /// every pool of the models in `next` that `current` does not serve
    /// has a healthy worker, so they do not answer 503 for want of their
    /// first health check; a pool still without one serves as it would at
    /// start (its requests get 503 until a worker passes).
    async fn first_checks(&self, next: &[Arc<Served>], current: &Models) {
        const POLL: Duration = Duration::from_millis(20);
        let deadline = tokio::time::Instant::now() + self.builder.health.timeout + POLL * 25;
        let new = next
            .iter()
            .filter(|s| !current.all().iter().any(|c| Arc::ptr_eq(c, s)));
        let pools: Vec<_> = new.flat_map(|s| s.router.mode.pools()).collect();
        while pools.iter().any(|p| p.healthy_count() == 0) && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(POLL).await;
        }
    }

    /// `iris_config_reloads_total`.
    pub fn render(&self, out: &mut String) {
        let [ok, refused] = &self.outcomes;
        iris_metrics::family(
            out,
            "iris_config_reloads_total",
            "counter",
            "Configuration file reloads (SIGHUP, POST /admin/reload), by result.",
            [
                ("result=\"ok\"", ok.load(Ordering::Relaxed)),
                ("result=\"refused\"", refused.load(Ordering::Relaxed)),
            ],
        );
    }
}

/// Stops the models built for a reload that is refused (those in `next`
/// that `current` does not serve).
fn stop_new(next: &[Arc<Served>], current: &Models) {
    for served in next {
        if !current.all().iter().any(|c| Arc::ptr_eq(c, served)) {
            served.stop.cancel();
        }
    }
}

/// Reloads on every `SIGHUP` until `shutdown`, when the gateway has a
/// configuration file.
pub fn on_hangup(state: &Arc<AppState>, shutdown: CancellationToken) {
    if state.reloader.is_none() {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => hangups,
            Err(error) => {
                tracing::warn!(%error, "no SIGHUP handler: reload with POST /admin/reload");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                got = hangups.recv() => {
                    if got.is_none() {
                        return;
                    }
                    if let Some(reloader) = &state.reloader {
                        tracing::info!("SIGHUP: reloading the configuration file");
                        // The outcome is logged and counted.
                        let _ = reloader.reload(&state.models).await;
                    }
                }
            }
        }
    });
}

/// `POST /admin/reload`: 200 with the [`Report`], 400 naming what is
/// wrong with the file (nothing changes), 409 without `--config` (401
/// without the admin token, [`Authorized`]).
pub async fn admin_reload(_: Authorized, State(state): State<Arc<AppState>>) -> Response {
    let Some(reloader) = &state.reloader else {
        let message = "this gateway was started without --config: there is no file to reload";
        let error =
            ApiError::new(409, ErrorKind::InvalidRequest, message).with_code("no_config_file");
        return error_response(&error);
    };
    match reloader.reload(&state.models).await {
        Ok(report) => {
            let body = serde_json::json!({"reloaded": true, "report": report}).to_string();
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(error) => {
            let message = format!("{error:#}; the running configuration is kept");
            error_response(&ApiError::bad_request(message).with_code("invalid_configuration"))
        }
    }
}
