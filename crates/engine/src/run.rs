//! The life of one Generate request after validation: wait for a slot,
//! obtain the prompt state (prefill it here, or collect it from the prefill
//! worker), then generate and stream tokens — stopping early on Abort or
//! when the caller goes away.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::mpsc;
use tonic::Status;

use crate::inflight::Registration;
use crate::model::{print_of, Finish, ItemPrint, PromptState, Sequence};
use crate::output::{Chunk, Completion, Event, Logprobs};
use crate::prefix::Admitted;
use crate::request::{ItemSource, KvAddress, Plan};
use crate::service::{Engine, StoredState};
use crate::{constrained, Role};
use iris_proto::scheduler::TensorData;

/// Where a request's events go (to its protocol adapter).
pub type Tx = mpsc::Sender<Result<Event, Status>>;

/// Runs `plan` to the end, sending its responses on `tx`.
pub async fn run(engine: Arc<Engine>, plan: Plan, registration: Registration, tx: Tx) {
    let cancel = registration.cancel.clone();
    let outcome = tokio::select! {
        outcome = drive(&engine, &plan, &tx) => outcome,
        _ = cancel.cancelled() => Err(Stop::Aborted),
        _ = tx.closed() => Err(Stop::Gone),
    };
    if let Err(stop) = outcome {
        finish_early(&engine, &plan, &tx, stop).await;
    }
    drop(registration);
}

/// Why a request ended before its natural end.
enum Stop {
    Aborted,
    Gone,
    Failed(Status),
}

async fn drive(engine: &Engine, plan: &Plan, tx: &Tx) -> Result<(), Stop> {
    let prompt_tokens = plan.input_ids.len() as u32;
    let waiting = engine.inflight.waiting(prompt_tokens);
    let _permit = engine
        .slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| Stop::Failed(Status::unavailable("engine is shutting down")))?;
    drop(waiting);
    let _running = engine.inflight.running();
    // The request's prefix-cache blocks stay held until it ends.
    let (state, held) = match engine.role {
        Role::Aggregated | Role::Prefill => prefill(engine, plan).await.map_err(Stop::Failed)?,
        Role::Decode => (
            collect_state(engine, plan).await.map_err(Stop::Failed)?,
            None,
        ),
    };
    let prompt = PromptTokens {
        total: state.prompt_tokens,
        cached: held.as_ref().map_or(0, |h| h.cached_tokens),
    };
    if engine.role == Role::Prefill {
        return hand_over(engine, plan, state, prompt, tx).await;
    }
    decode(engine, plan, &state, prompt, tx).await
}

/// A request's prompt tokens, and how many of them the prefix cache held.
#[derive(Debug, Clone, Copy)]
struct PromptTokens {
    total: u32,
    cached: u32,
}

/// Folds the prompt and every item's bytes into the state; the simulated
/// prefill cost is charged for the tokens the prefix cache did not hold,
/// whose blocks the request holds until it ends.
async fn prefill(engine: &Engine, plan: &Plan) -> Result<(PromptState, Option<Admitted>), Status> {
    let wait = engine.config.transfer_wait;
    let fetches = plan.items.iter().enumerate().map(|(i, item)| async move {
        match item {
            ItemSource::Pixels { tensor, .. } => {
                engine.payloads.read(tensor).await.map(Fetched::Bytes)
            }
            ItemSource::Recall { tensor, hash } => {
                recall(engine, tensor, hash, i).map(Fetched::Print)
            }
            ItemSource::Embedding { host, port, room } => engine
                .peers
                .fetch_embedding(host, *port, *room, wait)
                .await
                .map(Fetched::Bytes),
        }
    });
    let fetched: Vec<Fetched> = futures::future::try_join_all(fetches).await?;
    let prints = tokio::task::spawn_blocking(move || {
        fetched
            .iter()
            .map(Fetched::print)
            .collect::<Vec<ItemPrint>>()
    })
    .await
    .map_err(|e| Status::internal(format!("prefill task failed: {e}")))?;
    keep_items(engine, plan, &prints);
    let began = SystemTime::now();
    let admitted = engine
        .prefix
        .as_ref()
        .map(|cache| cache.admit_under(&plan.input_ids, &plan.item_keys, plan.lora.as_deref()));
    // `--kv-trace`: the admission's line, stamped before its blocks were
    // stored (so a reader of the KV events sees them published after it).
    if let (Some(trace), Some(admitted)) = (&engine.config.kv_trace, &admitted) {
        trace.record(began, &plan.request_id, admitted);
    }
    let cached = admitted.as_ref().map_or(0, |a| a.cached_tokens as usize);
    let uncached = u32::try_from(plan.input_ids.len().saturating_sub(cached)).unwrap_or(u32::MAX);
    compute_prefill(engine, uncached).await?;
    let resumed = plan.constrained_prefix_tokens as usize;
    let state = PromptState::from_prints(&plan.input_ids, &prints, resumed);
    Ok((state, admitted))
}

/// An item as fetched: its bytes, or (a recall) the print kept of them.
enum Fetched {
    Bytes(Bytes),
    Print(ItemPrint),
}

impl Fetched {
    /// Its print (hashes every byte of fetched bytes: a blocking thread's
    /// work).
    fn print(&self) -> ItemPrint {
        match self {
            Fetched::Bytes(bytes) => print_of(bytes),
            Fetched::Print(print) => *print,
        }
    }
}

/// Keeps the prints of the items that came with their pixels, for recalls.
fn keep_items(engine: &Engine, plan: &Plan, prints: &[ItemPrint]) {
    let Some(cache) = &engine.items else {
        return;
    };
    for (item, print) in plan.items.iter().zip(prints) {
        if let ItemSource::Pixels { hash, .. } = item {
            cache.put(hash, *print);
        }
    }
}

/// The bytes of item `index`, sent by content hash alone: from the item
/// cache, the size its tensor declares; NOT_FOUND ([`crate::recall`]) when
/// the cache no longer holds it.
fn recall(
    engine: &Engine,
    tensor: &TensorData,
    hash: &[u8],
    index: usize,
) -> Result<ItemPrint, Status> {
    let Some(cache) = &engine.items else {
        return Err(Status::invalid_argument(format!(
            "mm item {index}: encoder_input has no payload, and this worker keeps no items to recall (--mm-item-cache-mb 0)"
        )));
    };
    let print = cache.recall(hash, index)?;
    let expected = iris_proto::tensor::DType::parse(&tensor.dtype)
        .and_then(|dtype| iris_proto::tensor::byte_len(&tensor.shape, dtype))
        .map_err(|e| Status::invalid_argument(format!("mm item {index}, encoder_input: {e}")))?;
    if print.0 != expected {
        return Err(Status::invalid_argument(format!(
            "mm item {index}: its content hash names a kept item of {} bytes, but encoder_input declares {expected}",
            print.0
        )));
    }
    Ok(print)
}

/// The simulated compute of `uncached` prompt tokens, queued behind the
/// prefills computing when `--prefill-slots` bounds them.
async fn compute_prefill(engine: &Engine, uncached: u32) -> Result<(), Status> {
    let cost = engine.config.prefill_per_token * uncached;
    let _permit = match &engine.prefill_slots {
        Some(slots) if !cost.is_zero() => {
            let _queued = engine.inflight.prefill_queued(uncached);
            let permit = slots.clone().acquire_owned().await;
            Some(permit.map_err(|_| Status::unavailable("engine is shutting down"))?)
        }
        _ => None,
    };
    simulate(cost).await;
    Ok(())
}

/// Decode: collect the state the prefill worker left under the KV room.
async fn collect_state(engine: &Engine, plan: &Plan) -> Result<PromptState, Status> {
    let kv = plan
        .kv
        .as_ref()
        .ok_or_else(|| Status::internal("decode plan without a KV room"))?;
    let wait = engine.config.transfer_wait;
    let state = engine
        .peers
        .fetch_kv_state(&kv.host, kv.port, kv.room, wait)
        .await?;
    if state.prompt_tokens != plan.input_ids.len() as u32 {
        return Err(Status::failed_precondition(format!(
            "KV room {} holds a {}-token prompt but this request has {} tokens",
            kv.room,
            state.prompt_tokens,
            plan.input_ids.len()
        )));
    }
    Ok(state)
}

/// Prefill: publish the state under the KV room and end the prefill leg,
/// saying where the state waits.
async fn hand_over(
    engine: &Engine,
    plan: &Plan,
    state: PromptState,
    prompt: PromptTokens,
    tx: &Tx,
) -> Result<(), Stop> {
    let room = plan
        .kv
        .as_ref()
        .map(|kv| kv.room)
        .ok_or_else(|| Stop::Failed(Status::internal("no KV room")))?;
    let prompt_tokens = state.prompt_tokens;
    let stored = StoredState {
        state,
        request_id: plan.request_id.clone(),
    };
    engine
        .rooms
        .complete(room, stored, crate::service::STATE_BYTES)
        .map_err(|e| Stop::Failed(Status::from(e)))?;
    let complete = Completion {
        finish_reason: "stop",
        prompt_tokens,
        cached_tokens: prompt.cached,
        handoff: engine.data_addr.map(|addr| KvAddress {
            host: engine.config.host.clone(),
            port: addr.port(),
            room,
        }),
        ..Completion::default()
    };
    send(tx, Event::Complete(complete)).await
}

/// One sequence being decoded: its output so far and, when asked, the
/// log probabilities of that output.
struct Decoding<'a> {
    sequence: Sequence<'a>,
    output: Vec<u32>,
    logprobs: Option<Logprobs>,
    done: bool,
}

/// Generates every sequence of the request, one step at a time.
async fn decode(
    engine: &Engine,
    plan: &Plan,
    state: &PromptState,
    prompt: PromptTokens,
    tx: &Tx,
) -> Result<(), Stop> {
    let written = plan
        .input_ids
        .len()
        .saturating_sub(plan.constrained_prefix_tokens as usize);
    let scripts = constrained::scripts(
        plan.constraint.as_ref(),
        &engine.text,
        state,
        &plan.sequences,
        &plan.input_ids[written..],
    )
    .await
    .map_err(Stop::Failed)?;
    let mut sequences: Vec<Decoding<'_>> = plan
        .sequences
        .iter()
        .zip(scripts)
        .map(|(p, script)| Decoding {
            sequence: Sequence::new(state, &engine.vocab, p).follow(script),
            output: Vec::new(),
            // Streamed logprobs travel with their chunk instead.
            logprobs: p
                .top_logprobs
                .filter(|_| !plan.stream)
                .map(|_| Logprobs::default()),
            done: false,
        })
        .collect();
    loop {
        simulate(engine.config.decode_per_step).await;
        let mut active = false;
        for (index, seq) in sequences.iter_mut().enumerate() {
            if seq.done {
                continue;
            }
            let Some(step) = seq.sequence.step() else {
                seq.done = true;
                let complete = completion(index as u32, prompt, seq, Some(Finish::Length));
                send(tx, Event::Complete(complete)).await?;
                continue;
            };
            seq.output.push(step.token);
            engine.inflight.count_generated(1);
            let step_logprobs = step.logprobs.map(|lp| Logprobs::step(step.token, lp));
            if plan.stream {
                let chunk = Chunk {
                    index: index as u32,
                    token: step.token,
                    prompt_tokens: prompt.total,
                    cached_tokens: prompt.cached,
                    completion_tokens: seq.output.len() as u32,
                    logprobs: step_logprobs,
                };
                send(tx, Event::Chunk(chunk)).await?;
            } else if let (Some(all), Some(step)) = (seq.logprobs.as_mut(), step_logprobs) {
                all.extend(step);
            }
            if step.finish.is_some() {
                seq.done = true;
                let complete = completion(index as u32, prompt, seq, step.finish);
                send(tx, Event::Complete(complete)).await?;
            } else {
                active = true;
            }
        }
        if !active {
            return Ok(());
        }
    }
}

/// The sequence's completion; it carries the output's log probabilities
/// when they were not streamed.
fn completion(
    index: u32,
    prompt: PromptTokens,
    seq: &mut Decoding<'_>,
    finish: Option<Finish>,
) -> Completion {
    let (finish_reason, matched_token) = match finish {
        Some(Finish::Stop(token)) => ("stop", Some(token)),
        Some(Finish::Length) | None => ("length", None),
    };
    Completion {
        index,
        output_ids: seq.output.clone(),
        finish_reason,
        matched_token,
        prompt_tokens: prompt.total,
        cached_tokens: prompt.cached,
        completion_tokens: seq.output.len() as u32,
        logprobs: seq.logprobs.take(),
        handoff: None,
    }
}

async fn send(tx: &Tx, event: Event) -> Result<(), Stop> {
    tx.send(Ok(event)).await.map_err(|_| Stop::Gone)
}

/// Reports an early end: an abort gets a completion with
/// finish_reason "abort" per sequence, a failure gets the status; a prefill
/// also fails its KV room so the decode worker learns at once.
async fn finish_early(engine: &Engine, plan: &Plan, tx: &Tx, stop: Stop) {
    let reason = match &stop {
        Stop::Aborted => "aborted".to_owned(),
        Stop::Gone => "the caller went away".to_owned(),
        Stop::Failed(status) => status.message().to_owned(),
    };
    if let (Role::Prefill, Some(kv)) = (engine.role, &plan.kv) {
        engine.rooms.fail(
            kv.room,
            format!("prefill of request {} failed: {reason}", plan.request_id),
        );
    }
    tracing::debug!(request_id = %plan.request_id, %reason, "request ended early");
    match stop {
        Stop::Aborted => {
            for index in 0..plan.sequences.len() as u32 {
                let complete = Completion {
                    finish_reason: "abort",
                    prompt_tokens: plan.input_ids.len() as u32,
                    index,
                    ..Completion::default()
                };
                if send(tx, Event::Complete(complete)).await.is_err() {
                    return;
                }
            }
        }
        Stop::Failed(status) => {
            let _ = tx.send(Err(status)).await;
        }
        Stop::Gone => {}
    }
}

/// Sleeps for a simulated compute cost.
async fn simulate(cost: Duration) {
    if !cost.is_zero() {
        tokio::time::sleep(cost).await;
    }
}
