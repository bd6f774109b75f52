//! The worker routes of the admin API, over the pools of every served
//! model (the same pools Kubernetes discovery feeds, changed the same way:
//! [`Pool::add`], [`Pool::remove_id`]):
//! - `GET /admin/workers`: every worker with its model, role, health,
//!   circuit, load, lanes, capabilities and whether it is draining.
//! - `POST /admin/workers` `{"url", "role", "model", "bootstrap_port"}`:
//!   connects to the worker and checks it ([`health::admit`]: its health
//!   check, then its GetModelInfo against the model) before it joins the
//!   model's pool of that role, in service at once. 400 names the field
//!   that is wrong, 404 an unknown model, 409 an address already served,
//!   502 a worker that cannot be reached or serves another model.
//! - `POST /admin/workers/{id}/drain`: no new request goes to it; once
//!   its requests in flight have finished (at most the request timeout
//!   plus the shutdown grace) it leaves its pool. 202; `GET` shows it
//!   `draining` until it is gone.
//! - `DELETE /admin/workers/{id}`: it leaves its pool at once. Requests
//!   already on it keep their connection and finish there.
//!
//! A worker added here belongs to the running model: a reload that
//! rebuilds the model (its settings changed) starts over from the file's
//! workers.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use iris_openai::ApiError;
use serde_json::{json, Map, Value};

use super::{Action, Authorized};
use crate::http::error_response;
use crate::served::Served;
use crate::server::AppState;
use crate::workers::breaker::State as Circuit;
use crate::workers::health;
use crate::workers::{Pool, Role, Worker, WorkerUrl};

/// A worker and where it serves.
struct Placed {
    served: Arc<Served>,
    pool: Arc<Pool>,
    worker: Arc<Worker>,
}

/// Every worker of every served model, in configuration order.
fn all_workers(state: &AppState) -> Vec<Placed> {
    let mut placed = Vec::new();
    for served in state.models.load().all() {
        for pool in served.router.mode.pools() {
            for worker in pool.snapshot().iter() {
                placed.push(Placed {
                    served: served.clone(),
                    pool: pool.clone(),
                    worker: worker.clone(),
                });
            }
        }
    }
    placed
}

/// The JSON entry of a worker.
fn entry(placed: &Placed) -> Value {
    let Placed {
        served,
        pool,
        worker,
    } = placed;
    let (started, failed) = worker.request_counts();
    let caps = worker.caps();
    json!({
        "id": worker.id,
        "url": worker.url.to_string(),
        "model": served.name,
        "role": worker.role.as_str(),
        "backend": worker.backend().map(|b| b.as_str()),
        "healthy": worker.is_healthy(),
        "health_checks": if worker.checks_pass() { "passing" } else { "failing" },
        "circuit": circuit_name(worker.breaker.state()),
        "draining": worker.is_draining(),
        "load": pool.load(worker),
        "in_flight": worker.in_flight(),
        "requests": {"started": started, "failed": failed},
        "bootstrap_port": worker.url.bootstrap_port,
        "lanes": {
            "transport": worker.transport().map(|t| t.to_string()),
            "shm": caps.shared_shm,
            "rdma": caps.nixl && !worker.rdma_refused(),
        },
        "capabilities": {
            "constraint_resume": worker.resumes_constraints(),
            "embedding_recall": worker.recall.enabled(),
        },
    })
}

fn circuit_name(state: Circuit) -> &'static str {
    match state {
        Circuit::Closed => "closed",
        Circuit::Open => "open",
        Circuit::HalfOpen => "half_open",
    }
}

/// A JSON answer.
fn answer(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `GET /admin/workers`.
pub async fn list(_: Authorized, State(state): State<Arc<AppState>>) -> Response {
    let workers: Vec<Value> = all_workers(&state).iter().map(entry).collect();
    answer(StatusCode::OK, json!({"workers": workers}))
}

/// What `POST /admin/workers` asks for.
struct AddRequest {
    url: WorkerUrl,
    role: Option<Role>,
    model: Option<String>,
}

/// A 400 about `field`.
fn bad_field(field: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("`{field}`: {why}")).with_param(field)
}

/// The string field `name` of `body`, if present.
fn string_field(body: &Map<String, Value>, name: &str) -> Result<Option<String>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(bad_field(name, format!("expected a string, got {other}"))),
    }
}

/// The port field `name` of `body`, if present (1 to 65535).
fn port_field(body: &Map<String, Value>, name: &str) -> Result<Option<u16>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(port) => port
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
            .map(Some)
            .ok_or_else(|| bad_field(name, format!("{port} is not a port"))),
    }
}

fn parse_role(text: &str) -> Result<Role, ApiError> {
    [Role::Aggregated, Role::Prefill, Role::Decode, Role::Encode]
        .into_iter()
        .find(|r| r.as_str() == text)
        .ok_or_else(|| {
            bad_field(
                "role",
                format!("{text:?} is not a role: aggregated, prefill, decode or encode"),
            )
        })
}

impl AddRequest {
    /// Reads the request body; a 400 names the field that is wrong.
    fn parse(body: &[u8]) -> Result<AddRequest, ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
        let Value::Object(body) = value else {
            return Err(ApiError::bad_request(
                "the body must be a JSON object: {\"url\", \"role\", \"model\"}",
            ));
        };
        const FIELDS: [&str; 4] = ["url", "role", "model", "bootstrap_port"];
        if let Some(unknown) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(bad_field(
                unknown,
                "unknown field; a worker takes url, role, model and bootstrap_port",
            ));
        }
        let url = string_field(&body, "url")?.ok_or_else(|| bad_field("url", "required"))?;
        let mut url = WorkerUrl::parse(&url).map_err(|why| bad_field("url", why))?;
        url.bootstrap_port = port_field(&body, "bootstrap_port")?;
        let role = string_field(&body, "role")?
            .map(|r| parse_role(&r))
            .transpose()?;
        let model = string_field(&body, "model")?;
        Ok(AddRequest { url, role, model })
    }
}

/// The model a new worker joins: the one named, or the only one served.
fn model_of(state: &AppState, name: Option<&str>) -> Result<Arc<Served>, ApiError> {
    let models = state.models.load();
    match name {
        Some(name) => models.get(name).cloned(),
        None if models.all().len() == 1 => Ok(models.first().clone()),
        None => Err(bad_field(
            "model",
            "required: this gateway serves several models",
        )),
    }
}

/// The pool of `served` a worker of `role` joins (`None`: its only pool).
fn pool_of(served: &Served, role: Option<Role>) -> Result<Arc<Pool>, ApiError> {
    let pools = served.router.mode.pools();
    let roles: Vec<&str> = pools.iter().map(|p| p.role.as_str()).collect();
    let found = match role {
        Some(role) => pools.iter().find(|p| p.role == role),
        None if pools.len() == 1 => pools.first(),
        None => {
            return Err(bad_field(
                "role",
                format!(
                    "required: model \"{}\" has {} workers",
                    served.name,
                    roles.join(", ")
                ),
            ))
        }
    };
    found.cloned().ok_or_else(|| {
        let role = role.map_or("", Role::as_str);
        bad_field(
            "role",
            format!(
                "model \"{}\" routes to no {role} workers (its roles: {})",
                served.name,
                roles.join(", ")
            ),
        )
    })
}

/// 409 when a worker at `url`'s address serves already.
fn refuse_duplicate(state: &AppState, url: &WorkerUrl) -> Result<(), ApiError> {
    let address = url.endpoint();
    match all_workers(state)
        .into_iter()
        .find(|p| p.worker.url.endpoint() == address)
    {
        None => Ok(()),
        Some(p) => Err(ApiError::new(
            409,
            iris_openai::ErrorKind::InvalidRequest,
            format!(
                "worker {} (id {}) already serves at {url} ({} of model \"{}\")",
                p.worker.url,
                p.worker.id,
                p.worker.role.as_str(),
                p.served.name
            ),
        )
        .with_code("worker_exists")
        .with_param("url")),
    }
}

/// `POST /admin/workers`.
pub async fn add(_: Authorized, State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let _one = state.admin.changing.lock().await;
    let result = add_checked(&state, &body).await;
    finish(&state, Action::Add, result)
}

async fn add_checked(state: &AppState, body: &[u8]) -> Result<(StatusCode, Value), ApiError> {
    let asked = AddRequest::parse(body)?;
    let served = model_of(state, asked.model.as_deref())?;
    let pool = pool_of(&served, asked.role)?;
    refuse_duplicate(state, &asked.url)?;
    let worker = Worker::new(asked.url, pool.role, state.admin.connect.clone())
        .map_err(|why| bad_field("url", why))?;
    health::admit(&worker, &served.identity, &state.admin.health)
        .await
        .map_err(|why| {
            let message = format!(
                "worker {} cannot join model \"{}\": {why}",
                worker.url, served.name
            );
            ApiError::new(502, iris_openai::ErrorKind::Server, message).with_code("worker_rejected")
        })?;
    if !pool.add(worker.clone()) {
        return Err(refuse_duplicate(state, &worker.url)
            .err()
            .unwrap_or_else(|| {
                ApiError::new(
                    409,
                    iris_openai::ErrorKind::InvalidRequest,
                    "the worker joined meanwhile",
                )
            }));
    }
    let placed = Placed {
        served,
        pool,
        worker,
    };
    tracing::info!(id = placed.worker.id, worker = %placed.worker.url, model = placed.served.name, role = placed.worker.role.as_str(), "admin: worker added");
    Ok((StatusCode::CREATED, json!({"worker": entry(&placed)})))
}

/// The worker `id` names (a number in the path), else 400 or 404.
fn find(state: &AppState, id: &str) -> Result<Placed, ApiError> {
    let wanted: u64 = id.parse().map_err(|_| {
        bad_field(
            "id",
            format!("{id:?} is not a worker id (a number, GET /admin/workers)"),
        )
    })?;
    all_workers(state)
        .into_iter()
        .find(|p| p.worker.id == wanted)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no worker has id {wanted} (GET /admin/workers lists them)"
            ))
            .with_code("worker_not_found")
        })
}

/// `POST /admin/workers/{id}/drain`.
pub async fn drain(
    _: Authorized,
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Response {
    let _one = state.admin.changing.lock().await;
    let result = find(&state, &id).map(|placed| {
        if placed.worker.drain() {
            tracing::info!(id = placed.worker.id, worker = %placed.worker.url, model = placed.served.name, in_flight = placed.worker.in_flight(), "admin: worker draining");
            tokio::spawn(remove_when_idle(
                placed.pool.clone(),
                placed.worker.clone(),
                state.admin.patience,
            ));
        }
        (StatusCode::ACCEPTED, json!({"worker": entry(&placed)}))
    });
    finish(&state, Action::Drain, result)
}

/// Removes a draining `worker` from `pool` once nothing is in flight on
/// it, or after `patience`.
async fn remove_when_idle(pool: Arc<Pool>, worker: Arc<Worker>, patience: std::time::Duration) {
    const POLL: std::time::Duration = std::time::Duration::from_millis(50);
    let started = tokio::time::Instant::now();
    while !worker.is_idle() && started.elapsed() < patience {
        tokio::time::sleep(POLL).await;
    }
    if pool.remove_id(worker.id) {
        tracing::info!(id = worker.id, worker = %worker.url, in_flight = worker.in_flight(), "admin: drained worker removed");
    }
}

/// `DELETE /admin/workers/{id}`.
pub async fn delete(
    _: Authorized,
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Response {
    let _one = state.admin.changing.lock().await;
    let result = find(&state, &id).map(|placed| {
        placed.worker.drain();
        placed.pool.remove_id(placed.worker.id);
        tracing::info!(id = placed.worker.id, worker = %placed.worker.url, model = placed.served.name, in_flight = placed.worker.in_flight(), "admin: worker removed");
        (StatusCode::OK, json!({"worker": entry(&placed), "removed": true}))
    });
    finish(&state, Action::Delete, result)
}

/// Counts and answers a change; a refused one is logged too.
fn finish(
    state: &AppState,
    action: Action,
    result: Result<(StatusCode, Value), ApiError>,
) -> Response {
    match result {
        Ok((status, body)) => {
            state.admin.count(action, status.as_u16());
            answer(status, body)
        }
        Err(error) => {
            state.admin.count(action, error.status);
            tracing::info!(action = action.as_str(), status = error.status, error = %error.message, "admin: worker change refused");
            error_response(&error)
        }
    }
}
