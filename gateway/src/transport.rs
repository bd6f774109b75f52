//! The gateway's tensor lanes (docs/transports.md): the
//! `--multimodal-tensor-transport` options, the shm writer, the RDMA slot
//! arena with its reaper and NIXL sender agent (feature `nixl`), and the
//! lane of each pixel tensor sent to a worker — an encoder's Encode, or
//! the Generate request of an aggregated or PD prefill worker — chosen
//! per receiving worker: its own transport (URL option or pod annotation)
//! over the process flag, then what the worker proved it can receive.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use iris_proto::scheduler::{tensor_data::Payload, MultimodalItem};
use iris_proto::tensor::validate;
use iris_transport::shm::{sweep_orphans, DEFAULT_PREFIX, DEFAULT_SHM_DIR, IDENTITY_PREFIX};
use iris_transport::{
    ArenaConfig, DeliveryTicket, LanePolicy, Metrics, RdmaEndpoint, Reaper, ShmWriter,
    TensorSender, Transport,
};
use tonic::Status;

use crate::workers::Worker;

/// Files of dead processes younger than this are left alone (a process in
/// another pid namespace may share the directory).
const SWEEP_MIN_AGE: Duration = Duration::from_secs(60);
/// How often the reaper polls NIXL notifications and reaps expired slots.
#[cfg_attr(not(feature = "nixl"), allow(dead_code))]
const REAPER_INTERVAL: Duration = Duration::from_millis(20);

/// The tensor lanes' settings (`--multimodal-tensor-transport`,
/// `--multimodal-*-min-bytes`, `--nixl-*`, `--rdma-*`), validated by
/// [`crate::config`].
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// The process-wide transport (a worker's own overrides it).
    pub default: Transport,
    /// Size thresholds of the shm and RDMA lanes.
    pub policy: LanePolicy,
    /// The RDMA arena: geometry, TTL and the receivers' hold.
    pub arena: ArenaConfig,
    /// libnixl_capi.so to load (else the dynamic linker's search path).
    pub nixl_lib: Option<PathBuf>,
    /// The gateway's NIXL agent name.
    pub nixl_agent_name: String,
    /// Address encoders fetch the arena's NIXL metadata from.
    pub rdma_listen_ip: String,
    /// Port of the NIXL metadata listener.
    pub rdma_listen_port: u16,
}

/// Whether `t` may use the RDMA lane.
fn wants_rdma(t: Transport) -> bool {
    matches!(t, Transport::Rdma | Transport::Auto)
}

/// Whether this gateway's RDMA lane is up (exported as the
/// `iris_transport_rdma_lane{state}` gauge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaLane {
    /// Not started: neither the flag nor any worker may ask for rdma.
    Off,
    /// The arena is registered and the NIXL agent listens.
    Up,
    /// Wanted, but NIXL is missing (library, or the build's `nixl`
    /// feature): rdma tensors go inline.
    Unavailable,
}

impl RdmaLane {
    const ALL: [RdmaLane; 3] = [RdmaLane::Off, RdmaLane::Up, RdmaLane::Unavailable];

    /// The `state` label.
    pub fn as_str(self) -> &'static str {
        match self {
            RdmaLane::Off => "off",
            RdmaLane::Up => "up",
            RdmaLane::Unavailable => "unavailable",
        }
    }
}

/// The sender and what keeps its RDMA side alive.
pub struct Lanes {
    default: Transport,
    sender: TensorSender,
    rdma: RdmaLane,
    /// Workers that refused an RDMA payload (puller off), each
    /// counted once per life of the worker.
    rdma_refusals: AtomicU64,
    /// Images sent to encode workers without their pixels: served, missed.
    recalls: [AtomicU64; 2],
    // Stops (joins) the reaper before the agent it polls goes away.
    _reaper: Option<Reaper>,
}

impl Lanes {
    /// Whether the RDMA lane was never asked for (a model added by a
    /// reload cannot start it).
    pub fn rdma_off(&self) -> bool {
        matches!(self.rdma, RdmaLane::Off)
    }

    /// Everything inline (tests; a gateway without encode workers).
    pub fn inline() -> Lanes {
        Lanes {
            default: Transport::Inline,
            sender: TensorSender::new(LanePolicy::default(), Arc::new(Metrics::default())),
            rdma: RdmaLane::Off,
            rdma_refusals: AtomicU64::new(0),
            recalls: Default::default(),
            _reaper: None,
        }
    }

    /// Sweeps shm orphans, opens the shm writer and — when `rdma_wanted`
    /// (an encode worker's own transport may use RDMA, configured or
    /// discovered) or the flag asks for it — the arena, its reaper and
    /// the NIXL agent. A missing NIXL only logs.
    pub fn start(cfg: &TransportConfig, rdma_wanted: bool) -> anyhow::Result<Lanes> {
        let metrics = Arc::new(Metrics::default());
        sweep_shm();
        let mut sender = TensorSender::new(cfg.policy, metrics.clone());
        match ShmWriter::new(DEFAULT_SHM_DIR, DEFAULT_PREFIX) {
            Ok(writer) => sender = sender.with_shm(writer),
            Err(e) => tracing::warn!(error = %e, "no shm writer: shm tensors go inline"),
        }
        let mut reaper = None;
        let mut rdma = RdmaLane::Off;
        if rdma_wanted || wants_rdma(cfg.default) {
            rdma = RdmaLane::Unavailable;
            if let Some((endpoint, r)) = rdma::start(cfg, metrics)? {
                sender = sender.with_rdma(endpoint);
                reaper = Some(r);
                rdma = RdmaLane::Up;
            }
        }
        Ok(Lanes {
            default: cfg.default,
            sender,
            rdma,
            rdma_refusals: AtomicU64::new(0),
            recalls: Default::default(),
            _reaper: reaper,
        })
    }

    /// Whether the RDMA lane is up, and if not, whether it was wanted.
    pub fn rdma_lane(&self) -> RdmaLane {
        self.rdma
    }

    /// The transport asked for `worker`: its own, else the process flag.
    pub fn requested(&self, worker: &Worker) -> Transport {
        worker.transport().unwrap_or(self.default)
    }

    /// `item` with its pixels on the lane for `worker` (the RDMA lease
    /// keyed by `room`), and the ticket owed for it. Blocking (shm write,
    /// arena copy): run on the blocking pool.
    pub fn prepare(
        &self,
        worker: &Worker,
        item: &MultimodalItem,
        room: i64,
    ) -> Result<(MultimodalItem, Option<DeliveryTicket>), Status> {
        let Some(tensor) = item.encoder_input.as_ref() else {
            return Ok((item.clone(), None));
        };
        let Some(Payload::Inline(data)) = tensor.payload.as_ref() else {
            return Ok((item.clone(), None));
        };
        let bad = |e: iris_proto::tensor::TensorError| {
            Status::invalid_argument(format!("encoder_input: {e}"))
        };
        let (dtype, _) = validate(tensor).map_err(bad)?;
        let sent = self
            .sender
            .send(
                self.requested(worker),
                worker.caps(),
                room,
                tensor.shape.clone(),
                dtype,
                data.clone(),
            )
            .map_err(bad)?;
        let item = MultimodalItem {
            encoder_input: Some(sent.tensor),
            ..item.clone()
        };
        Ok((item, Some(sent.ticket)))
    }

    /// Counts pixel tensors sent inline without going through
    /// [`Self::prepare`] (a Generate leg to a worker whose transport is
    /// inline keeps its request as built): `bytes` of each.
    pub fn sent_inline(&self, bytes: impl IntoIterator<Item = usize>) {
        let metrics = self.sender.metrics();
        for nbytes in bytes {
            metrics.record_lane(iris_transport::Lane::Inline, nbytes);
        }
    }

    /// `worker` refused an RDMA payload because its puller is off
    /// (`status`): rdma is off for it until it restarts. The first refusal
    /// of its life is counted and warned about; its tensors then go inline
    /// (fallback reason `nixl_unavailable`).
    pub fn rdma_refused(&self, worker: &Worker, status: &Status) {
        if !worker.refuse_rdma() {
            return;
        }
        self.rdma_refusals.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            worker = %worker.url,
            error = %status.message(),
            "worker refused an RDMA tensor: its puller is off (a TokenSpeed worker needs SMG_MM_PIXEL_RDMA=1, an Iris encoder --rdma-landing-slots > 0 and NIXL); its tensors go inline until it restarts"
        );
    }

    /// Counts an image sent to an encode worker without its pixels:
    /// `served` from its cache, or missed (its pixels then sent).
    pub fn recalled(&self, served: bool) {
        self.recalls[usize::from(!served)].fetch_add(1, Ordering::Relaxed);
    }

    /// Appends the transport counters as Prometheus text, each family
    /// once with all its samples.
    pub fn render(&self, out: &mut String) {
        let samples = self.sender.metrics().snapshot().samples();
        for (name, kind, help) in TRANSPORT_FAMILIES {
            let of_family = samples.iter().filter_map(|(sample, value)| {
                let labels = sample.strip_prefix(name)?;
                let labels = match labels.strip_prefix('{') {
                    Some(inner) => inner.strip_suffix('}')?,
                    None if labels.is_empty() => "",
                    None => return None,
                };
                Some((labels, value))
            });
            iris_metrics::family(out, name, kind, help, of_family);
        }
        iris_metrics::family(
            out,
            "iris_transport_rdma_lane",
            "gauge",
            "The RDMA tensor lane: off (not wanted), up, or unavailable (wanted, NIXL missing: inline).",
            RdmaLane::ALL.map(|state| {
                let labels = format!("state=\"{}\"", state.as_str());
                (labels, u8::from(state == self.rdma))
            }),
        );
        iris_metrics::counter(
            out,
            "iris_transport_rdma_refusals_total",
            "Workers (encode, aggregated or prefill) that refused an RDMA tensor because their puller is off (rdma then off for them until they restart).",
            self.rdma_refusals.load(Ordering::Relaxed),
        );
        iris_metrics::family(
            out,
            "iris_transport_recalls_total",
            "counter",
            "Images sent to encode workers without their pixels (the worker held their embedding): served from its cache, or missed (the pixels were then sent).",
            ["served", "missed"].iter().zip(&self.recalls).map(|(result, n)| {
                (format!("result=\"{result}\""), n.load(Ordering::Relaxed))
            }),
        );
    }
}

#[cfg(test)]
impl Lanes {
    /// Lanes whose RDMA side is an arena that no NIXL agent serves:
    /// descriptors are made and slots leased, nothing is ever READ. Tests
    /// of the gateway's side of the rdma lane, without NIXL.
    pub(crate) fn with_unserved_arena(default: Transport) -> Lanes {
        let metrics = Arc::new(Metrics::default());
        let arena = ArenaConfig {
            slot_size: 1 << 20,
            slot_count: 4,
            max_bytes: 4 << 20,
            ttl: Duration::from_secs(30),
            receiver_hold: Duration::from_secs(9),
        };
        let clock = Arc::new(iris_transport::SystemClock::default());
        let arena = iris_transport::SlotArena::new(arena, clock, metrics.clone())
            .expect("a valid test arena");
        let policy = LanePolicy {
            min_shm_bytes: 0,
            min_rdma_bytes: 0,
        };
        let endpoint = RdmaEndpoint {
            arena: Arc::new(arena),
            ip: "127.0.0.1".into(),
            port: 1,
        };
        Lanes {
            default,
            sender: TensorSender::new(policy, metrics).with_rdma(endpoint),
            rdma: RdmaLane::Up,
            rdma_refusals: AtomicU64::new(0),
            recalls: Default::default(),
            _reaper: None,
        }
    }

    /// The transport counters as `/metrics` shows them.
    pub(crate) fn rendered(&self) -> String {
        let mut text = String::new();
        self.render(&mut text);
        text
    }
}

/// The families of `iris_transport::Metrics::samples`, in the order
/// `/metrics` lists them.
const TRANSPORT_FAMILIES: [(&str, &str, &str); 8] = [
    (
        "iris_transport_tensors_total",
        "counter",
        "Tensors sent per lane (inline, shm, rdma).",
    ),
    (
        "iris_transport_bytes_total",
        "counter",
        "Payload bytes sent per lane.",
    ),
    (
        "iris_transport_fallbacks_total",
        "counter",
        "Inline fallbacks per reason.",
    ),
    (
        "iris_transport_arena_slots_in_use",
        "gauge",
        "Live leases of the RDMA arena.",
    ),
    (
        "iris_transport_arena_leases_total",
        "counter",
        "Leases granted.",
    ),
    (
        "iris_transport_arena_releases_total",
        "counter",
        "Leases freed by notification or release.",
    ),
    (
        "iris_transport_arena_stale_notifications_total",
        "counter",
        "Releases that freed nothing (late, wrong generation).",
    ),
    (
        "iris_transport_arena_reaped_total",
        "counter",
        "Leases freed by the reaper after the TTL.",
    ),
];

/// Removes tensor and identity files of dead processes.
fn sweep_shm() {
    let dir = std::path::Path::new(DEFAULT_SHM_DIR);
    for prefix in [DEFAULT_PREFIX, IDENTITY_PREFIX] {
        match sweep_orphans(dir, prefix, SWEEP_MIN_AGE) {
            Ok(report) => tracing::debug!(prefix, ?report, "swept shm orphans"),
            Err(e) => tracing::warn!(prefix, error = %e, "could not sweep shm orphans"),
        }
    }
}

#[cfg(feature = "nixl")]
mod rdma {
    //! The RDMA lane over NIXL: arena, sender agent, reaper.

    use super::*;
    use iris_transport::nixl::{NixlError, SenderAgent};
    use iris_transport::{SlotArena, SystemClock};

    /// The endpoint and reaper, or `None` (logged) when NIXL is missing.
    pub fn start(
        cfg: &TransportConfig,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Option<(RdmaEndpoint, Reaper)>> {
        let lib = cfg.nixl_lib.as_deref();
        let arena = Arc::new(SlotArena::new(
            cfg.arena,
            Arc::new(SystemClock::default()),
            metrics,
        )?);
        let agent = match SenderAgent::start(
            lib,
            &cfg.nixl_agent_name,
            cfg.rdma_listen_port,
            arena.clone(),
        ) {
            Ok(agent) => Arc::new(agent),
            Err(NixlError::Unavailable(why)) => {
                tracing::warn!(%why, "NIXL unavailable: rdma tensors go inline");
                return Ok(None);
            }
            Err(e) => anyhow::bail!("cannot start the NIXL sender agent: {e}"),
        };
        let reaper = Reaper::start(arena.clone(), REAPER_INTERVAL, Some(agent.tick_hook()))
            .map_err(|e| anyhow::anyhow!("cannot start the RDMA slot reaper: {e}"))?;
        tracing::info!(
            agent = %agent.name(),
            ip = %cfg.rdma_listen_ip,
            port = agent.port(),
            slots = cfg.arena.slot_count,
            slot_bytes = cfg.arena.slot_size,
            "RDMA tensor lane up"
        );
        let endpoint = RdmaEndpoint {
            arena,
            ip: cfg.rdma_listen_ip.clone(),
            port: cfg.rdma_listen_port,
        };
        Ok(Some((endpoint, reaper)))
    }
}

#[cfg(not(feature = "nixl"))]
mod rdma {
    //! Built without feature `nixl`: the RDMA lane is never up.

    use super::*;

    /// Logs (once, at start-up) that rdma goes inline.
    pub fn start(
        _: &TransportConfig,
        _: Arc<Metrics>,
    ) -> anyhow::Result<Option<(RdmaEndpoint, Reaper)>> {
        tracing::warn!(
            "built without the `nixl` feature: tensors for workers that ask for rdma (flag, URL option or pod annotation) go inline (fallback reason nixl_unavailable)"
        );
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::{Role, WorkerUrl};
    use bytes::Bytes;
    use iris_proto::tensor::{inline, DType};
    use iris_transport::WorkerCaps;

    /// The transport settings of an aggregated gateway with `extra` flags.
    fn args(extra: &[&str]) -> TransportConfig {
        let base = ["--worker-urls", "grpc://w:1"];
        crate::config::Config::from_flags(&[&base[..], extra].concat())
            .unwrap()
            .transport
    }

    fn worker(url: &str, caps: WorkerCaps) -> Arc<Worker> {
        let url = WorkerUrl::parse(url).unwrap();
        let w = Worker::new(url, Role::Encode, Duration::from_secs(1)).unwrap();
        w.set_caps(caps);
        w
    }

    fn item() -> MultimodalItem {
        let data = Bytes::from(vec![7u8; 64]);
        MultimodalItem {
            encoder_input: Some(inline(vec![16], DType::Float32, data)),
            ..MultimodalItem::default()
        }
    }

    fn payload(item: &MultimodalItem) -> &Payload {
        item.encoder_input
            .as_ref()
            .unwrap()
            .payload
            .as_ref()
            .unwrap()
    }

    fn rendered(lanes: &Lanes) -> String {
        let mut text = String::new();
        lanes.render(&mut text);
        text
    }

    #[tokio::test]
    async fn the_workers_own_transport_and_proof_decide_the_lane() {
        let lanes = Lanes::start(&args(&["--multimodal-shm-min-bytes", "0"]), false).unwrap();
        let shared = WorkerCaps {
            shared_shm: true,
            nixl: false,
        };
        // The URL option overrides the process flag (inline).
        let by_url = worker("grpc://127.0.0.1:1?transport=shm", shared);
        let (sent, ticket) = lanes.prepare(&by_url, &item(), 1).unwrap();
        let Payload::Shm(handle) = payload(&sent) else {
            panic!("expected shm, got {:?}", payload(&sent));
        };
        let path = std::path::Path::new(DEFAULT_SHM_DIR).join(&handle.name);
        assert!(path.exists());
        drop(ticket);
        assert!(!path.exists(), "a dropped ticket unlinks the file");
        // Not proven to share /dev/shm: inline, counted.
        let unproven = worker("grpc://127.0.0.1:2?transport=shm", WorkerCaps::default());
        let (sent, _) = lanes.prepare(&unproven, &item(), 2).unwrap();
        assert!(matches!(payload(&sent), Payload::Inline(_)));
        // The process flag: inline.
        let plain = worker("grpc://127.0.0.1:3", shared);
        let (sent, _) = lanes.prepare(&plain, &item(), 3).unwrap();
        assert!(matches!(payload(&sent), Payload::Inline(_)));
        let text = rendered(&lanes);
        assert!(
            text.contains("iris_transport_bytes_total{lane=\"shm\"} 64\n"),
            "{text}"
        );
        assert!(
            text.contains("iris_transport_bytes_total{lane=\"inline\"} 128\n"),
            "{text}"
        );
        assert!(
            text.contains("iris_transport_fallbacks_total{reason=\"no_shared_shm\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE iris_transport_arena_slots_in_use gauge\n"));
        // Every sample is rendered, under its family's one header.
        for (sample, value) in lanes.sender.metrics().snapshot().samples() {
            assert!(text.contains(&format!("\n{sample} {value}\n")), "{sample}");
        }
        for (family, _, _) in TRANSPORT_FAMILIES {
            assert_eq!(text.matches(&format!("# TYPE {family} ")).count(), 1);
            assert_eq!(text.matches(&format!("# HELP {family} ")).count(), 1);
        }
    }

    #[cfg(not(feature = "nixl"))]
    #[tokio::test]
    async fn rdma_without_the_feature_goes_inline_and_says_why() {
        let flags = [
            "--multimodal-tensor-transport",
            "rdma",
            "--multimodal-rdma-min-bytes",
            "0",
        ];
        let lanes = Lanes::start(&args(&flags), false).unwrap();
        let caps = WorkerCaps {
            shared_shm: false,
            nixl: true,
        };
        let (sent, _) = lanes
            .prepare(&worker("grpc://127.0.0.1:1", caps), &item(), 1)
            .unwrap();
        assert!(matches!(payload(&sent), Payload::Inline(_)));
        let text = rendered(&lanes);
        assert!(
            text.contains("iris_transport_fallbacks_total{reason=\"nixl_unavailable\"} 1\n"),
            "{text}"
        );
        assert_eq!(lanes.rdma_lane(), RdmaLane::Unavailable);
        assert!(
            text.contains("iris_transport_rdma_lane{state=\"unavailable\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("iris_transport_rdma_lane{state=\"off\"} 0\n"));
    }

    #[tokio::test]
    async fn the_rdma_lane_starts_only_when_wanted() {
        let missing = ["--nixl-lib", "/nonexistent/libnixl_capi.so"];
        let off = Lanes::start(&args(&missing), false).unwrap();
        assert_eq!(off.rdma_lane(), RdmaLane::Off);
        assert!(rendered(&off).contains("iris_transport_rdma_lane{state=\"off\"} 1\n"));
        // Wanted by a worker (not the flag): started, NIXL missing here.
        let wanted = Lanes::start(&args(&missing), true).unwrap();
        assert_eq!(wanted.rdma_lane(), RdmaLane::Unavailable);
    }
}
