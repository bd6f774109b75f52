//! What the gateway serves for each model, found by the request's `model`:
//! a [`Served`] bundle holds one model's tokenizer and chat template
//! ([`Prompter`]), its image and video pipeline, its output parsers and
//! its [`Router`] (worker pools and policies) and its metrics (the
//! `model` label). [`Models`] maps every name
//! a request may use — the served name and its aliases — to its bundle;
//! a handler looks its model up once and uses only that bundle.

use std::collections::HashMap;
use std::sync::Arc;

use iris_openai::ApiError;

use crate::kv::KvCaches;
use crate::metrics::Metrics;
use crate::mm::Multimodal;
use crate::output::OutputParsers;
use crate::prompt::Prompter;
use crate::router::Router;

/// One model's bundle.
pub struct Served {
    /// The name `/v1/models` lists and answers carry.
    pub name: String,
    /// Other names requests may use for it (its model directory's path).
    pub aliases: Vec<String>,
    pub prompter: Prompter,
    /// The image and video pipeline; `None` for a text-only model.
    pub media: Option<Arc<Multimodal>>,
    /// How answers are parsed into content, reasoning and tool calls.
    pub parsers: OutputParsers,
    pub router: Arc<Router>,
    /// Its requests' outcomes, stages and tokens (`model` label).
    pub metrics: Arc<Metrics>,
    /// Its workers' prefix caches, from their KV events.
    pub kv: Arc<KvCaches>,
    /// When it started being served (Unix seconds, `/v1/models`).
    pub created: u64,
}

impl Served {
    /// The entry `/v1/models` lists for it.
    pub fn listing(&self) -> iris_openai::Model {
        iris_openai::Model::new(self.name.as_str(), self.created, "iris")
    }
}

/// Every served model under each of its names.
pub struct Models {
    /// In the order they were configured.
    all: Vec<Arc<Served>>,
    by_name: HashMap<String, Arc<Served>>,
}

impl Models {
    /// `first` and `rest`, each under its name and aliases; the first to
    /// claim a name keeps it.
    pub fn new(first: Arc<Served>, rest: Vec<Arc<Served>>) -> Models {
        let all: Vec<Arc<Served>> = std::iter::once(first).chain(rest).collect();
        let mut by_name = HashMap::new();
        for served in &all {
            let names = std::iter::once(&served.name).chain(&served.aliases);
            for name in names {
                by_name
                    .entry(name.clone())
                    .or_insert_with(|| served.clone());
            }
        }
        Models { all, by_name }
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
