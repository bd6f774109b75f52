//! The one path every generating endpoint's request takes: a new id and
//! the span its log lines are written in, the body read within its limits
//! and deadline, the wire request converted to the gateway's own
//! ([`ApiRequest`], by the endpoint), its model looked up once, the input
//! made ready ([`Input::prepare`]), then the answer as one JSON body or as
//! server-sent events (the endpoint's shaping, on [`super::unary`] and
//! [`super::sse`]). A request refused on the way is counted and logged
//! once, in the endpoint's error shape.
//!
//! An endpoint is an [`Endpoint`] impl registered with [`serve`] in
//! `server.rs`'s route table; see docs/architecture.md, "Adding an
//! endpoint".

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use iris_openai::{ApiError, ErrorKind};
use tracing::Instrument;

use super::{read_body, refused, Failure, Ledger};
use crate::keys::limit::{Quota, Unit, Usage};
use crate::keys::Caller;
use crate::metrics::{Outcome, Stage};
use crate::request::{ApiRequest, Input};
use crate::router::fair::{Fair, Running};
use crate::served::Served;
use crate::server::AppState;
use crate::trace::RequestTrace;

/// What an endpoint supplies to the shared path: its names, the
/// conversion of its wire request, and the shape of its answers.
pub trait Endpoint: Send + Sync + 'static {
    /// Its name in the request's log line (`chat.completions`).
    const NAME: &'static str;

    /// The kind of input its requests convert to.
    type Input: Input;

    /// A new request id (`chatcmpl-…`, `cmpl-…`).
    fn new_id() -> String;

    /// The span every log line of request `id` is written in.
    fn span(id: &str) -> tracing::Span;

    /// The body parsed, checked and converted to the gateway's request
    /// (asynchronous: a conversion may read stored state, e.g. the
    /// Responses API's `previous_response_id`).
    fn convert(
        state: &AppState,
        body: &[u8],
    ) -> impl Future<Output = Result<ApiRequest<Self::Input>, ApiError>> + Send;

    /// Starts the request and answers with one JSON body.
    fn unary(
        state: Arc<AppState>,
        ledger: Ledger,
        ready: Ready<Self>,
    ) -> impl Future<Output = Response> + Send;

    /// Starts the request and answers with server-sent events.
    fn stream(
        state: Arc<AppState>,
        ledger: Ledger,
        ready: Ready<Self>,
    ) -> impl Future<Output = Response> + Send;

    /// The HTTP response for `error` in the endpoint's API's shape
    /// (OpenAI's unless the endpoint says otherwise); every error of its
    /// requests, refusals and failures alike, takes it.
    fn error_response(error: &ApiError) -> Response {
        super::error_response(error)
    }
}

/// What an endpoint's input becomes once made ready.
pub type Ready<E> = <<E as Endpoint>::Input as Input>::Ready;

/// The axum handler of endpoint `E`.
pub async fn serve<E: Endpoint>(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let id = E::new_id();
    // Every log line of the request (routing, retries, failures) carries its id.
    let span = E::span(&id);
    let caller = request.extensions().get::<Caller>().cloned();
    let started = Instant::now();
    let trace = state
        .traces
        .as_ref()
        .map(|traces| RequestTrace::start(traces, E::NAME, &id, request.headers(), started));
    let mut ledger = Ledger::new(E::NAME, id, started, state.metrics.clone());
    ledger.error_shape = E::error_response;
    ledger.trace = trace.clone();
    let respond = respond::<E>(state, request.into_body(), caller, ledger);
    crate::trace::scope(trace, respond.instrument(span)).await
}

async fn respond<E: Endpoint>(
    state: Arc<AppState>,
    body: Body,
    caller: Option<Caller>,
    mut ledger: Ledger,
) -> Response {
    // Each stage's future is boxed: held inline, the largest would make
    // every enclosing future as large, and each is moved (copied) a few
    // times on its way to the runtime.
    let prepared = Box::pin(prepare::<E>(&state, body, caller, &mut ledger)).await;
    let quotas = std::mem::take(&mut ledger.quotas);
    let mut response = match prepared {
        Ok((ready, true)) => Box::pin(E::stream(state, ledger, ready)).await,
        Ok((ready, false)) => Box::pin(E::unary(state, ledger, ready)).await,
        Err(failure) => refused(&ledger, failure),
    };
    for quota in quotas {
        quota.write(response.headers_mut());
    }
    response
}

/// Reads and converts the request, finds its model and makes its input
/// ready; also says whether it streams. `ledger` gets the request's facts
/// as they are known (its user, then what the input's preparation adds).
async fn prepare<E: Endpoint>(
    state: &Arc<AppState>,
    body: Body,
    caller: Option<Caller>,
    ledger: &mut Ledger,
) -> Result<(Ready<E>, bool), Failure> {
    let client = |e: ApiError| (e, Outcome::ClientError);
    let bytes = read_body(state, body).await.map_err(client)?;
    ledger.body_bytes = bytes.len();
    let request = E::convert(state, &bytes).await.map_err(client)?;
    drop(bytes);
    let found = state.models.get(&request.model);
    if let Some(caller) = &caller {
        let served = found.as_ref().ok().map(|s| &**s);
        admit(state, caller, &request.model, served, ledger)
            .await
            .map_err(client)?;
    }
    let served = found.map_err(client)?;
    ledger.metrics = served.metrics.clone();
    ledger.user = request.user;
    ledger.metrics.stage(Stage::Parse, ledger.started.elapsed());
    let fair = served.router.fair.clone();
    if let Some(trace) = &ledger.trace {
        trace.label(ledger.metrics.model(), ledger.tenant.as_ref());
    }
    ledger.span("read", ledger.started);
    let ready = request.input.prepare(served, ledger).await?;
    if let Some(caller) = &caller {
        charge(state, caller, ledger).await.map_err(client)?;
    }
    if let Some(fair) = fair {
        ledger.running = Some(Arc::new(
            wait_turn(state, &fair, caller.as_ref(), ledger).await?,
        ));
    }
    Ok((ready, request.stream))
}

/// Lets the caller's request for model `asked` (resolving to `served`,
/// when served) in under its tenant's models and limits, or
/// refuses it (403, 429); `ledger` gets the tenant, the bucket's state
/// for the headers, and the request's concurrency slot.
async fn admit(
    state: &AppState,
    Caller(tenant): &Caller,
    asked: &str,
    served: Option<&Served>,
    ledger: &mut Ledger,
) -> Result<(), ApiError> {
    ledger.tenant = Some(tenant.name.clone());
    let Some(keys) = &state.keys else {
        return Ok(());
    };
    match keys.admit(tenant, asked, served).await {
        Ok(admitted) => {
            ledger.quotas = admitted.quotas;
            ledger.held = admitted.held.map(Arc::new);
            Ok(())
        }
        Err(refusal) => {
            ledger.quotas = refusal.quotas;
            Err(refusal.error)
        }
    }
}

/// Takes the built prompt's tokens, images and image bytes from the
/// caller's buckets, or refuses it (429); its completion tokens are then
/// settled when it ends ([`Ledger::settle`]).
async fn charge(
    state: &AppState,
    Caller(tenant): &Caller,
    ledger: &mut Ledger,
) -> Result<(), ApiError> {
    let Some(keys) = &state.keys else {
        return Ok(());
    };
    let usage = Usage {
        tokens: u64::from(ledger.prompt_tokens),
        images: u64::try_from(ledger.images.images).unwrap_or(u64::MAX),
        image_bytes: ledger.images.bytes,
    };
    let quotas = keys.charge(tenant, &usage).await.map_err(|refusal| {
        merge(&mut ledger.quotas, refusal.quotas);
        refusal.error
    })?;
    merge(&mut ledger.quotas, quotas);
    if tenant.limiter.limits().per_minute(Unit::Tokens).is_some() {
        ledger.settle = Some(keys.settlement(tenant.clone()));
    }
    Ok(())
}

/// Waits for the request's turn among its model's running requests
/// (fair admission): 429 when its tenant's queue is full, 503 when its
/// deadline passes first.
async fn wait_turn(
    state: &AppState,
    fair: &Arc<Fair>,
    caller: Option<&Caller>,
    ledger: &Ledger,
) -> Result<Running, Failure> {
    let (tenant, weight) = match caller {
        Some(Caller(tenant)) => (tenant.name.clone(), tenant.weight),
        None => (Arc::from(""), 1),
    };
    let left = state
        .request_timeout
        .saturating_sub(ledger.started.elapsed());
    match tokio::time::timeout(left, fair.admit(&tenant, weight)).await {
        Ok(Ok(running)) => Ok(running),
        Ok(Err(full)) => {
            let message = format!(
                "the model's workers are saturated and this API key already has {} requests waiting; retry later",
                full.queue_size
            );
            let error = ApiError::new(429, ErrorKind::RateLimit, message)
                .with_code("queue_full")
                .with_retry_after(1);
            Err((error, Outcome::Overloaded))
        }
        Err(_) => {
            let error = ApiError::service_unavailable(
                "the model's workers stayed saturated for the whole request deadline",
            );
            Err((error, Outcome::Timeout))
        }
    }
}

/// Puts `newer` quotas in `quotas`, over those of the same unit.
fn merge(quotas: &mut Vec<Quota>, newer: Vec<Quota>) {
    quotas.retain(|q| newer.iter().all(|n| n.unit != q.unit));
    quotas.extend(newer);
}
