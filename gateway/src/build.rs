//! Building a model's [`Served`] bundle from its [`ModelSpec`]: the model
//! directory (tokenizer, template, processor), its parsers, its worker
//! pools and policies, and the tasks that keep them current (health
//! checks, KV events, discovery), which stop with the model's own token.
//! `iris serve` builds every configured model this way at start, and a
//! reload builds the models it adds or changes.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use iris_model::ModelDir;
use tokio_util::sync::CancellationToken;

use crate::adapters::Catalog;
use crate::config::{Config, ModelSpec, Topology};
use crate::discovery::Discovery;
use crate::kv::KvCaches;
use crate::metrics::Metrics;
use crate::mm::Multimodal;
use crate::output::OutputParsers;
use crate::prompt::{PromptOptions, Prompter};
use crate::router::{Mode, Router, RouterSettings};
use crate::served::Served;
use crate::transport::Lanes;
use crate::workers::health::{self, HealthSettings};
use crate::workers::identity::ModelIdentity;
use crate::workers::policy::{LoadBounds, PolicyKind};
use crate::workers::worker::Connect;
use crate::workers::{Pool, Role, Worker, WorkerUrl};

/// What every model's bundle shares: how workers are reached and
/// checked, the router's settings, the tensor lanes, and the gateway's
/// shutdown (each model's token is its child).
pub struct Builder {
    pub connect: Connect,
    pub health: HealthSettings,
    pub router: RouterSettings,
    pub lanes: Arc<Lanes>,
    pub shutdown: CancellationToken,
}

/// A model loaded but not yet serving: its directory's pieces and pools.
pub struct Loaded {
    spec: ModelSpec,
    name: String,
    prompter: Prompter,
    parsers: OutputParsers,
    media: Option<Arc<Multimodal>>,
    mode: Mode,
    kv: Arc<KvCaches>,
    identity: ModelIdentity,
}

impl Loaded {
    /// Loads `spec`'s model directory and builds its pools (`connect`:
    /// how their workers are reached; `router`: encode load bounds).
    pub fn load(
        spec: &ModelSpec,
        connect: &Connect,
        router: &RouterSettings,
    ) -> anyhow::Result<Loaded> {
        let model = &spec.model;
        let dir = ModelDir::load(&model.path).with_context(|| {
            let key = match (&model.hidden_alias, &model.served_name) {
                (None, Some(id)) => format!("model_path of model \"{id}\""),
                _ => "--model-path".to_owned(),
            };
            format!(
                "cannot load model directory {} ({key})",
                model.path.display()
            )
        })?;
        let mut prompter = Prompter::load(
            &dir,
            &PromptOptions {
                template_file: model.chat_template.as_deref(),
                cache_entries: model.tokenizer_cache_entries,
                context_length: model.context_length,
            },
        )?;
        let parsers = OutputParsers::choose(
            model.tool_call_parser,
            model.reasoning_parser,
            &dir,
            prompter.template_source(),
        )
        .resolve_tokens(prompter.tokenizer());
        prompter.ask_for_calls_of(parsers.tools);
        let name = model
            .served_name
            .clone()
            .unwrap_or_else(|| dir.served_model_name());
        tracing::info!(model = name, tool_calls = ?parsers.tools, reasoning = ?parsers.reasoning, "output parsers");
        let media = Multimodal::load(&dir, &spec.media)?.map(Arc::new);
        if let Topology::Disaggregated {
            encode: Some(_), ..
        } = &spec.topology
        {
            crate::mm::check_epd_family(media.as_deref())?;
        }
        let kv = Arc::new(KvCaches::default());
        let mode = build_mode(&spec.topology, connect, router, &kv)?;
        log_policies(&name, &spec.topology);
        let identity = ModelIdentity {
            model_type: dir.config.model_type.clone(),
            vocab_size: prompter.vocab_size(),
        };
        Ok(Loaded {
            spec: spec.clone(),
            name,
            prompter,
            parsers,
            media,
            mode,
            kv,
            identity,
        })
    }

    /// Whether its pixel-taking workers may ask for the RDMA lane.
    pub fn wants_rdma(&self) -> bool {
        rdma_wanted(&self.mode, self.spec.discovery.as_ref())
    }
}

impl Builder {
    /// The builder of `config`'s models over `lanes`, stopping with
    /// `shutdown`.
    pub fn new(config: &Config, lanes: Arc<Lanes>, shutdown: CancellationToken) -> Builder {
        Builder {
            connect: config.connect.clone(),
            health: config.health,
            router: config.router,
            lanes,
            shutdown,
        }
    }

    /// Loads `spec` ([`Loaded::load`]).
    pub fn load(&self, spec: &ModelSpec) -> anyhow::Result<Loaded> {
        Loaded::load(spec, &self.connect, &self.router)
    }

    /// Starts serving `loaded`: its discovery, health checks and KV event
    /// subscriptions run until its token (a child of the gateway's) ends.
    pub async fn start(&self, loaded: Loaded) -> anyhow::Result<Served> {
        let Loaded {
            spec,
            name,
            prompter,
            parsers,
            media,
            mode,
            kv,
            identity,
        } = loaded;
        let stop = self.shutdown.child_token();
        if let Some(discovery) = &spec.discovery {
            discovery
                .for_model(&name)
                .start(&mode.pools(), self.connect.clone(), stop.clone())
                .await?;
        }
        if rdma_wanted(&mode, spec.discovery.as_ref()) && self.lanes.rdma_off() {
            tracing::warn!(model = name, "its workers may ask for RDMA, but the gateway started without the RDMA lane (restart to add it)");
        }
        health::spawn(mode.pools(), self.health, stop.clone());
        kv.follow(mode.prefill_pools(), stop.clone());
        let adapters = Catalog::new(&spec.model.adapters, spec.model.max_loras_per_worker);
        let mut router = Router::new(mode, self.router).with_adapters(adapters);
        router.lanes = self.lanes.clone();
        Ok(Served {
            metrics: Arc::new(Metrics::new(&name)),
            name,
            aliases: spec.model.aliases.clone(),
            hidden_alias: spec.model.hidden_alias.clone(),
            prompter: Arc::new(prompter),
            media,
            parsers,
            router: Arc::new(router),
            kv,
            identity,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default(),
            stop,
            source: spec.source.clone(),
            adapter: None,
        })
    }

    /// Loads and starts `spec`.
    pub async fn build(&self, spec: &ModelSpec) -> anyhow::Result<Served> {
        let loaded = self.load(spec)?;
        self.start(loaded).await
    }
}

/// Lets `served` finish its requests in flight (until only the caller
/// holds it, at most `patience`), then stops its tasks and sends the
/// Abort RPCs still owed.
pub async fn drain(served: Arc<Served>, patience: Duration) {
    const POLL: Duration = Duration::from_millis(50);
    let started = tokio::time::Instant::now();
    while Arc::strong_count(&served) > 1 && started.elapsed() < patience {
        tokio::time::sleep(POLL).await;
    }
    served.stop.cancel();
    served.router.flush_aborts(Duration::from_secs(5)).await;
    tracing::info!(model = served.name, "model removed: drained and stopped");
}

/// Whether a worker sent pixels in this mode ([`Mode::pixel_role`]: encode
/// workers in EPD, else aggregated or PD prefill workers) may ask for the
/// RDMA lane with its own transport: a configured one through its URL
/// option, or — since their `iris.ai/tensor-transport` annotation is only
/// known once they appear — any pod discovery may bring into that pool.
/// Decided before the watchers report anything, so the lane is up when
/// such a pod joins.
pub fn rdma_wanted(mode: &Mode, discovery: Option<&Discovery>) -> bool {
    let role = mode.pixel_role();
    let configured = mode.pools().iter().any(|pool| {
        pool.role == role
            && pool.snapshot().iter().any(|w| {
                matches!(
                    w.transport(),
                    Some(iris_transport::Transport::Rdma | iris_transport::Transport::Auto)
                )
            })
    });
    configured || discovery.is_some_and(|d| d.watches(role))
}

/// Says at start how a model's requests are placed, and for `auto` what
/// changes it.
fn log_policies(model: &str, topology: &Topology) {
    let policy = match topology {
        Topology::Aggregated { policy, .. } => *policy,
        Topology::Disaggregated { prefill_policy, .. } => *prefill_policy,
    };
    match policy {
        PolicyKind::Auto => tracing::info!(
            model,
            "routing policy auto: by power_of_two until workers publish KV events, then cache_aware (prefix cache and queued prefill) for those workers' pools"
        ),
        PolicyKind::CacheAware => tracing::info!(
            model,
            "routing policy cache_aware: by prefix cache and queued prefill, from KV events where workers publish them, else from this gateway's routing history"
        ),
        other => tracing::info!(model, policy = other.as_str(), "routing policy"),
    }
}

/// The pools of `topology`, holding its configured workers (a role whose
/// pods are discovered may start with none).
pub fn build_mode(
    topology: &Topology,
    connect: &Connect,
    router: &RouterSettings,
    caches: &Arc<KvCaches>,
) -> anyhow::Result<Mode> {
    let pool = |role: Role,
                urls: &[WorkerUrl],
                policy: PolicyKind,
                bounds: LoadBounds|
     -> anyhow::Result<Arc<Pool>> {
        let workers = urls
            .iter()
            .map(|u| Worker::new(u.clone(), role, connect.clone()).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Arc::new(Pool::new(
            role,
            workers,
            policy.build(bounds, caches),
        )))
    };
    let plain = LoadBounds::default();
    Ok(match topology {
        Topology::Aggregated { workers, policy } => {
            Mode::Aggregated(pool(Role::Aggregated, workers, *policy, plain)?)
        }
        Topology::Disaggregated {
            prefill,
            prefill_policy,
            decode,
            decode_policy,
            encode,
        } => {
            let prefill = pool(Role::Prefill, prefill, *prefill_policy, plain)?;
            let decode = pool(Role::Decode, decode, *decode_policy, plain)?;
            match encode {
                None => Mode::PrefillDecode { prefill, decode },
                Some(encode) => Mode::EncodePrefillDecode {
                    encode: pool(
                        Role::Encode,
                        &encode.workers,
                        encode.policy,
                        LoadBounds {
                            load_factor: encode.load_factor,
                            max_load: router.encode_max_in_flight_patches,
                        },
                    )?,
                    prefill,
                    decode,
                },
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rdma_wanted` for the first model of `iris serve FLAGS…`.
    fn wanted_by(flags: &[&str]) -> bool {
        let config = Config::from_flags(flags).unwrap();
        let spec = config.first();
        let mode = build_mode(
            &spec.topology,
            &config.connect,
            &config.router,
            &Default::default(),
        )
        .unwrap();
        rdma_wanted(&mode, spec.discovery.as_ref())
    }

    /// `rdma_wanted` for an EPD gateway with the extra flags `flags`.
    fn wanted(flags: &[&str]) -> bool {
        wanted_by(&[&["--epd-disaggregation"][..], flags].concat())
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

    /// Without encoders the worker that gets the pixels in its Generate
    /// request asks: aggregated, or prefill in PD (not decode).
    #[tokio::test]
    async fn rdma_is_wanted_by_aggregated_and_pd_prefill_workers() {
        assert!(!wanted_by(&["--worker-urls", "grpc://a:1"]));
        assert!(wanted_by(&["--worker-urls", "grpc://a:1?transport=rdma"]));
        let pd = |p: &'static str, d: &'static str| {
            ["--pd-disaggregation", "--prefill", p, "--decode", d]
        };
        assert!(wanted_by(&pd("grpc://p:1?transport=auto", "grpc://d:1")));
        assert!(!wanted_by(&pd("grpc://p:1", "grpc://d:1?transport=rdma")));
    }
}
