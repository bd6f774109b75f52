//! What the gateway serves for each model, found by the request's `model`:
//! a [`Served`] bundle holds one model's tokenizer and chat template
//! ([`Prompter`]), its image and video pipeline, its output parsers and
//! its [`Router`] (worker pools and policies) and its metrics (the
//! `model` label). [`Models`] maps every name
//! a request may use — the served name and its aliases — to its bundle;
//! a handler looks its model up once and uses only that bundle, holding
//! its `Arc` to the end: a model a reload removes drains (its requests in
//! flight finish) before it stops. [`Registry`] holds the current
//! [`Models`], swapped whole by a reload.
//!
//! A model's LoRA adapters are served under `NAME:ADAPTER` for each of its
//! names: a view of its bundle ([`Served::adapter_view`]: the same
//! tokenizer, workers and metrics) whose requests carry the adapter.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use iris_openai::ApiError;
use tokio_util::sync::CancellationToken;

use crate::kv::KvCaches;
use crate::metrics::Metrics;
use crate::mm::Multimodal;
use crate::output::OutputParsers;
use crate::prompt::Prompter;
use crate::router::Router;
use crate::workers::identity::ModelIdentity;

/// One model's bundle.
pub struct Served {
    /// The name `/v1/models` lists and answers carry.
    pub name: String,
    /// Other names requests may use for it, listed by `/v1/models`.
    pub aliases: Vec<String>,
    /// One more name requests may use, not listed (the flags' model
    /// directory path).
    pub hidden_alias: Option<String>,
    pub prompter: Arc<Prompter>,
    /// The image and video pipeline; `None` for a text-only model.
    pub media: Option<Arc<Multimodal>>,
    /// How answers are parsed into content, reasoning and tool calls.
    pub parsers: OutputParsers,
    pub router: Arc<Router>,
    /// Its requests' outcomes, stages and tokens (`model` label).
    pub metrics: Arc<Metrics>,
    /// Its workers' prefix caches, from their KV events.
    pub kv: Arc<KvCaches>,
    /// What a worker's GetModelInfo must report to join its pools.
    pub identity: ModelIdentity,
    /// When it started being served (Unix seconds, `/v1/models`).
    pub created: u64,
    /// Stops its health checks, KV subscriptions and discovery (a child of
    /// the gateway's shutdown; cancelled once it is removed and drained).
    pub stop: CancellationToken,
    /// The configuration file's settings it was built from (`None`: flags).
    pub source: Option<toml::Table>,
    /// The LoRA adapter its requests run with (`None`: the base model).
    pub adapter: Option<String>,
}

/// The name requests give adapter `adapter` of the model named `model`.
pub fn adapter_name(model: &str, adapter: &str) -> String {
    format!("{model}:{adapter}")
}

impl Served {
    /// The entry `/v1/models` lists for it under `name` (its own or an
    /// alias, whose `root` is its own): with its context length and
    /// input modalities.
    pub fn listing(&self, name: &str) -> iris_openai::Model {
        let mut model = iris_openai::Model::new(name, self.created, "iris");
        model.max_model_len = Some(self.prompter.limits().context_length);
        model.modalities = self.modalities();
        model.root = (name != self.name).then(|| self.name.clone());
        model
    }

    /// Its entries in `/v1/models`: its name, then each alias, then each
    /// adapter as `NAME:ADAPTER` (`parent` and `root`: its name).
    pub fn listings(&self) -> Vec<iris_openai::Model> {
        let names = std::iter::once(&self.name).chain(&self.aliases);
        let adapters = self.router.adapters.names().map(|adapter| {
            let mut model = self.listing(&adapter_name(&self.name, adapter));
            model.root = Some(self.name.clone());
            model.parent = Some(self.name.clone());
            model
        });
        names
            .map(|name| self.listing(name))
            .chain(adapters)
            .collect()
    }

    /// Its bundle serving LoRA adapter `adapter`, named `NAME:ADAPTER`.
    pub fn adapter_view(&self, adapter: &str) -> Served {
        Served {
            name: adapter_name(&self.name, adapter),
            aliases: Vec::new(),
            hidden_alias: None,
            prompter: self.prompter.clone(),
            media: self.media.clone(),
            parsers: self.parsers.clone(),
            router: self.router.clone(),
            metrics: self.metrics.clone(),
            kv: self.kv.clone(),
            identity: self.identity.clone(),
            created: self.created,
            stop: self.stop.clone(),
            source: self.source.clone(),
            adapter: Some(adapter.to_owned()),
        }
    }

    /// The adapter its requests carry (`lora_id`): empty for the base model.
    pub fn lora_id(&self) -> String {
        self.adapter.clone().unwrap_or_default()
    }

    /// The inputs it takes: text, and images and videos with a media
    /// pipeline.
    pub fn modalities(&self) -> Vec<String> {
        let media: &[&str] = match self.media {
            Some(_) => &["text", "image", "video"],
            None => &["text"],
        };
        media.iter().map(|m| (*m).to_owned()).collect()
    }
}

/// Every served model under each of its names.
pub struct Models {
    /// In the order they were configured.
    all: Vec<Arc<Served>>,
    by_name: HashMap<String, Arc<Served>>,
}

impl Models {
    /// `all` (at least one), each under its name and aliases; the first
    /// to claim a name keeps it.
    pub fn new(all: Vec<Arc<Served>>) -> anyhow::Result<Models> {
        anyhow::ensure!(!all.is_empty(), "no model to serve");
        let mut by_name = HashMap::new();
        for served in &all {
            let names: Vec<&String> = std::iter::once(&served.name)
                .chain(&served.aliases)
                .chain(&served.hidden_alias)
                .collect();
            for name in &names {
                by_name
                    .entry((*name).clone())
                    .or_insert_with(|| served.clone());
            }
            for adapter in served.router.adapters.names() {
                let view = Arc::new(served.adapter_view(adapter));
                for name in &names {
                    by_name
                        .entry(adapter_name(name, adapter))
                        .or_insert_with(|| view.clone());
                }
            }
        }
        Ok(Models { all, by_name })
    }

    /// The model a request names, else 404 `model_not_found`.
    pub fn get(&self, name: &str) -> Result<&Arc<Served>, ApiError> {
        self.by_name
            .get(name)
            .ok_or_else(|| ApiError::model_not_found(name))
    }

    /// Every model, in configuration order (at least one).
    pub fn all(&self) -> &[Arc<Served>] {
        &self.all
    }

    /// The first model configured.
    pub fn first(&self) -> &Arc<Served> {
        &self.all[0]
    }

    /// The model of a request that may leave `model` out (tokenize): the
    /// one named, else the first configured.
    pub fn named_or_first(&self, name: Option<&str>) -> Result<&Arc<Served>, ApiError> {
        match name {
            Some(name) => self.get(name),
            None => Ok(self.first()),
        }
    }
}

/// The models served now: read by every request, replaced whole by a
/// reload (requests already running keep the bundle they looked up).
pub struct Registry(ArcSwap<Models>);

impl Registry {
    pub fn new(models: Models) -> Registry {
        Registry(ArcSwap::from_pointee(models))
    }

    /// The current models.
    pub fn load(&self) -> Arc<Models> {
        self.0.load_full()
    }

    /// Serves `models` from now on; returns the ones it replaces.
    pub fn swap(&self, models: Models) -> Arc<Models> {
        self.0.swap(Arc::new(models))
    }

    /// The model a request names, else 404 `model_not_found`.
    pub fn get(&self, name: &str) -> Result<Arc<Served>, ApiError> {
        self.load().get(name).cloned()
    }

    /// [`Models::named_or_first`], held.
    pub fn named_or_first(&self, name: Option<&str>) -> Result<Arc<Served>, ApiError> {
        self.load().named_or_first(name).cloned()
    }
}
