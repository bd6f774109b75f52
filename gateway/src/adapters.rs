//! LoRA adapters: the ones a model lists (`[[models.adapters]]`, requests
//! name them `BASE:NAME`) and the ones the gateway keeps loaded on each
//! worker.
//!
//! A request for an adapter carries its name in `lora_id`; before its
//! Generate call goes to a worker the router makes sure the worker holds
//! it ([`Catalog::acquire`]): loaded already, it is marked most recently
//! used; otherwise it is loaded there on demand (SGLang's
//! `LoadLoRAAdapter`, the adapter's name as its id). A worker keeps at
//! most `--max-loras-per-worker` adapters: loading one more first unloads
//! the least recently used one that has no request in flight on that
//! worker ([`AdapterUse`] counts them; an adapter in use is never
//! unloaded). A worker that cannot take the adapter — its every slot busy,
//! a load it refused or that took over a minute, a backend whose protocol
//! has no adapter RPCs
//! (TokenSpeed, vLLM) — fails the call RESOURCE_EXHAUSTED naming the
//! worker and the reason: the router tries another worker without
//! counting it toward the worker's circuit, and the client gets 503 once
//! no worker could.
//!
//! What a worker holds is learnt once from its `ListLoadedLoRAAdapters`
//! (adapters loaded before this gateway started count toward its limit and
//! are unloaded like the others) and then kept by the gateway; a worker
//! answering NOT_FOUND for an adapter the gateway thought loaded (it
//! restarted) has it forgotten ([`Catalog::forget`]), so the next request
//! loads it again.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use iris_proto::sglang::{
    ListLoadedLoRaAdaptersRequest, LoadLoRaAdapterRequest, UnloadLoRaAdapterRequest,
};
use tonic::Status;

use crate::backends::{Backend, ResponseStream};
use crate::config::AdapterConfig;
use crate::workers::Worker;

/// The adapters of one model and what loading them cost so far.
#[derive(Debug, Default)]
pub struct Catalog {
    /// (name, directory) of each adapter, in configuration order.
    paths: Vec<(String, String)>,
    /// Adapters kept loaded per worker (at least 1).
    per_worker: usize,
    loads: AtomicU64,
    unloads: AtomicU64,
}

/// One request's use of an adapter on one worker: the adapter is not
/// unloaded there while it lives.
#[derive(Debug)]
pub struct AdapterUse(Option<Arc<AtomicUsize>>);

impl Drop for AdapterUse {
    fn drop(&mut self) {
        if let Some(count) = self.0.take() {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl AdapterUse {
    /// `stream`, holding this use until it is dropped.
    pub fn hold(self, stream: ResponseStream) -> ResponseStream {
        match self.0 {
            None => stream,
            Some(_) => Box::pin(stream.map(move |item| {
                let _held = &self;
                item
            })),
        }
    }
}

/// One adapter a worker holds, as the gateway knows it.
#[derive(Debug)]
struct Held {
    name: String,
    in_flight: Arc<AtomicUsize>,
}

/// The adapters a worker holds, least recently used first; `None` until
/// its `ListLoadedLoRAAdapters` was read.
#[derive(Debug, Default)]
pub struct WorkerAdapters(tokio::sync::Mutex<Option<Vec<Held>>>);

impl Catalog {
    /// The adapters of `adapters`, at most `per_worker` loaded per worker.
    pub fn new(adapters: &[AdapterConfig], per_worker: usize) -> Catalog {
        Catalog {
            paths: adapters
                .iter()
                .map(|a| (a.name.clone(), a.path.clone()))
                .collect(),
            per_worker: per_worker.max(1),
            ..Catalog::default()
        }
    }

    /// The adapters' names, in configuration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.paths.iter().map(|(name, _)| name.as_str())
    }

    /// The directory of adapter `name`.
    fn path(&self, name: &str) -> Option<&str> {
        self.paths
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, path)| path.as_str())
    }

    /// Adapters loaded on workers so far.
    pub fn loads(&self) -> u64 {
        self.loads.load(Ordering::Relaxed)
    }

    /// Adapters unloaded from workers to make room so far.
    pub fn unloads(&self) -> u64 {
        self.unloads.load(Ordering::Relaxed)
    }

    /// Makes sure `worker` holds adapter `name` (nothing for the base
    /// model, `name` empty) and counts one request using it there.
    pub async fn acquire(&self, worker: &Worker, name: &str) -> Result<AdapterUse, Status> {
        if name.is_empty() {
            return Ok(AdapterUse(None));
        }
        let path = self.path(name).ok_or_else(|| {
            Status::not_found(format!("the model has no LoRA adapter named {name:?}"))
        })?;
        let cannot = |why: String| {
            Status::resource_exhausted(format!(
                "worker {} cannot take LoRA adapter {name:?}: {why}",
                worker.url
            ))
        };
        loads_adapters(worker).map_err(cannot)?;
        let mut guard = worker.adapters.0.lock().await;
        if guard.is_none() {
            *guard = Some(listed(worker).await.map_err(cannot)?);
        }
        let held = guard.get_or_insert_with(Vec::new);
        if let Some(count) = reuse(held, name) {
            return Ok(AdapterUse(Some(count)));
        }
        self.make_room(worker, held).await.map_err(cannot)?;
        load(worker, name, path).await.map_err(cannot)?;
        self.loads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(worker = %worker.url, adapter = %name, "LoRA adapter loaded");
        let count = Arc::new(AtomicUsize::new(1));
        held.push(Held {
            name: name.to_owned(),
            in_flight: count.clone(),
        });
        Ok(AdapterUse(Some(count)))
    }

    /// Unloads the least recently used idle adapters of `worker` until one
    /// more fits; refused when every one left has requests in flight.
    async fn make_room(&self, worker: &Worker, held: &mut Vec<Held>) -> Result<(), String> {
        while held.len() >= self.per_worker {
            let idle = held
                .iter()
                .position(|h| h.in_flight.load(Ordering::Acquire) == 0)
                .ok_or_else(|| {
                    format!(
                        "its {} adapter slots (--max-loras-per-worker) all have requests in flight",
                        self.per_worker
                    )
                })?;
            let victim = held.remove(idle);
            unload(worker, &victim.name).await?;
            self.unloads.fetch_add(1, Ordering::Relaxed);
            tracing::info!(worker = %worker.url, adapter = %victim.name, "LoRA adapter unloaded (least recently used)");
        }
        Ok(())
    }

    /// Forgets that `worker` holds `name` (it answered that it does not).
    pub async fn forget(&self, worker: &Worker, name: &str) {
        if let Some(held) = worker.adapters.0.lock().await.as_mut() {
            held.retain(|h| h.name != name);
        }
    }
}

/// Whether `worker`'s protocol loads adapters (SGLang's alone does).
fn loads_adapters(worker: &Worker) -> Result<(), String> {
    match worker.backend() {
        Some(Backend::Sglang) => Ok(()),
        Some(other) => Err(format!(
            "its {other} protocol has no adapter RPCs (only SGLang's loads adapters)"
        )),
        None => Err("its backend is not known yet".into()),
    }
}

/// Marks `name` most recently used in `held` and counts one more use of
/// it, when it is there.
fn reuse(held: &mut Vec<Held>, name: &str) -> Option<Arc<AtomicUsize>> {
    let at = held.iter().position(|h| h.name == name)?;
    let entry = held.remove(at);
    let count = entry.in_flight.clone();
    held.push(entry);
    count.fetch_add(1, Ordering::AcqRel);
    Some(count)
}

/// How long one adapter call (load, unload, list) may take: loading an
/// adapter reads its weights from disk.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// `call` (named `what`), given at most [`CALL_TIMEOUT`]; its failure in
/// words.
async fn within<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(answer)) => Ok(answer.into_inner()),
        Ok(Err(status)) => Err(format!("{what} failed: {}", status.message())),
        Err(_) => Err(format!("{what} took over {}s", CALL_TIMEOUT.as_secs())),
    }
}

/// The adapters `worker` reports loaded, as held entries.
async fn listed(worker: &Worker) -> Result<Vec<Held>, String> {
    let mut client = worker.sglang_client();
    let call = client.list_loaded_lo_ra_adapters(ListLoadedLoRaAdaptersRequest {});
    let answer = within("ListLoadedLoRAAdapters", call).await?;
    Ok(answer
        .loaded_adapters
        .into_iter()
        .map(|a| Held {
            name: a.lora_name,
            in_flight: Arc::new(AtomicUsize::new(0)),
        })
        .collect())
}

/// Loads `name` from `path` on `worker`, the name as its id.
async fn load(worker: &Worker, name: &str, path: &str) -> Result<(), String> {
    let request = LoadLoRaAdapterRequest {
        lora_name: name.to_owned(),
        lora_path: path.to_owned(),
        pinned: false,
        lora_id: name.to_owned(),
    };
    let mut client = worker.sglang_client();
    let answer = within("LoadLoRAAdapter", client.load_lo_ra_adapter(request)).await?;
    match answer.success {
        true => Ok(()),
        false => Err(format!("LoadLoRAAdapter refused: {}", answer.message)),
    }
}

/// Unloads `name` from `worker`.
async fn unload(worker: &Worker, name: &str) -> Result<(), String> {
    let request = UnloadLoRaAdapterRequest {
        lora_name: name.to_owned(),
        lora_id: String::new(),
    };
    let mut client = worker.sglang_client();
    let what = format!("UnloadLoRAAdapter of {name:?}");
    let answer = within(&what, client.unload_lo_ra_adapter(request)).await?;
    match answer.success {
        true => Ok(()),
        false => Err(format!(
            "UnloadLoRAAdapter of {name:?} refused: {}",
            answer.message
        )),
    }
}
