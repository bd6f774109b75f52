//! Command-line options and their validation into a [`Config`]; bad
//! values become clear errors, never panics.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;

use crate::conversation::ConversationConfig;

/// The longest measured window a run may ask for (runs are bounded).
const MAX_DURATION_SECS: f64 = 3600.0;
/// The most concurrent requests (each owns a task, and an HTTP connection).
const MAX_CONCURRENCY: usize = 4096;

/// What `iris-loadgen` was asked to do.
#[derive(Debug, Parser)]
#[command(
    name = "iris-loadgen",
    version,
    about = "Load generator (closed loop, or Poisson arrivals with --request-rate): OpenAI chat over HTTP, or TokenSpeed Generate over gRPC"
)]
pub struct Cli {
    /// OpenAI-compatible HTTP target, e.g. http://127.0.0.1:8000.
    #[arg(long, conflicts_with = "grpc")]
    pub target: Option<String>,
    /// gRPC worker target, e.g. grpc://127.0.0.1:30000 (needs --model-path).
    #[arg(long)]
    pub grpc: Option<String>,
    /// Model directory whose chat template and tokenizer turn the prompt
    /// into token ids for --grpc (the ids the gateway would send).
    #[arg(long)]
    pub model_path: Option<PathBuf>,
    /// Model name for HTTP requests (default: the first of GET /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Concurrent requests (closed loop: each sends its next request as
    /// soon as the previous one is answered).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Requests per second, arriving with gamma-distributed gaps (see
    /// --burstiness; 1 is a Poisson process), each on a free connection
    /// (at most --max-concurrency in flight). `inf`: the closed loop at
    /// --concurrency (or --max-concurrency).
    #[arg(long, default_value = "inf", allow_hyphen_values = true)]
    pub request_rate: String,
    /// Shape of the gamma distribution of the gaps between arrivals (1:
    /// Poisson; below 1: burstier; above 1: more even), as vllm's.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Most requests in flight with --request-rate (default 1024); with
    /// `--request-rate inf`, the closed loop's concurrency.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Seed of the arrival schedule and of synthetic images.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 15.0)]
    pub duration_secs: f64,
    /// Unmeasured seconds before the measurement.
    #[arg(long, default_value_t = 2.0)]
    pub warmup_secs: f64,
    /// Stop after this many measured requests (even before --duration-secs).
    #[arg(long)]
    pub requests: Option<u64>,
    /// max_tokens (max_new_tokens over gRPC) of every request.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Stream the answers (SSE over HTTP, token chunks over gRPC).
    #[arg(long)]
    pub stream: bool,
    /// The user message of every chat (the text part of image chats).
    /// Default: "Write one short sentence about the sea.", or with
    /// --image "Describe the image in one sentence."
    #[arg(long)]
    pub prompt: Option<String>,
    /// Send image chats (HTTP only): a short text part and this JPEG as a
    /// `data:image/jpeg;base64,…` image_url part. Distinct images get a
    /// counter in a JPEG comment (distinct bytes, the same pixels).
    #[arg(long, conflicts_with = "grpc")]
    pub image: Option<PathBuf>,
    /// Send image chats with synthetic JPEGs (random pixels, as vllm's
    /// random-mm) of this size: `WxH`, or `WxH:WEIGHT` to draw each image's
    /// size from several (repeatable; weights are relative, default 1).
    #[arg(long, conflicts_with_all = ["grpc", "image"])]
    pub image_size: Vec<String>,
    /// Images per chat (with --image or --image-size).
    #[arg(long, default_value_t = 1)]
    pub images_per_request: usize,
    /// Fraction of the images that are one fixed image per source (0:
    /// every image distinct, 0.5: every second image the same, 1: all the
    /// same).
    #[arg(long, default_value_t = 0.0)]
    pub image_repeat_fraction: f64,
    /// Report this process's CPU time per request (repeatable).
    #[arg(long)]
    pub cpu_pid: Vec<u32>,
    /// API key sent with every request as `Authorization: Bearer` (a
    /// gateway with --api-keys-file; HTTP request loops only).
    #[arg(long, conflicts_with_all = ["grpc", "turns"])]
    pub api_key: Option<String>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Runtime threads of the load generator (1: a single-threaded runtime).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// gRPC connections shared by the concurrent requests (the gateway
    /// uses one per worker).
    #[arg(long, default_value_t = 1)]
    pub grpc_connections: usize,
    /// Seconds one request may take before it counts as an error.
    #[arg(long, default_value_t = 30.0)]
    pub request_timeout_secs: f64,
    /// Goodput objective: time to first token at most this many ms (streams).
    #[arg(long)]
    pub slo_ttft_ms: Option<f64>,
    /// Goodput objective: time per output token after the first at most
    /// this many ms (streams).
    #[arg(long)]
    pub slo_tpot_ms: Option<f64>,
    /// Goodput objective: end-to-end latency at most this many ms.
    #[arg(long)]
    pub slo_e2e_ms: Option<f64>,
    /// Multi-turn agent conversations of this many turns instead of the
    /// load (HTTP, needs --image; one request in flight): turn k resends
    /// the history with k screenshots; the report is per turn.
    #[arg(long, conflicts_with = "grpc")]
    pub turns: Option<usize>,
    /// Measured conversations with --turns (after one warm-up conversation).
    #[arg(long, default_value_t = 5)]
    pub conversations: usize,
    /// With --turns: the gateway's Prometheus page (http://HOST:PORT/metrics),
    /// read after every turn for the bytes of pixel tensors it sent
    /// (iris_transport_bytes_total, every lane): the report's MB per turn.
    #[arg(long, value_name = "URL", requires = "turns")]
    pub tensor_bytes_metrics: Option<String>,
    /// Write the tiny test model into this directory and exit.
    #[arg(long, conflicts_with_all = ["target", "grpc"])]
    pub write_tiny_model: Option<PathBuf>,
}

/// Where requests go.
#[derive(Debug, Clone)]
pub enum Target {
    Http {
        addr: SocketAddr,
        /// The Host header.
        authority: String,
    },
    Grpc {
        /// `http://host:port`, as tonic wants it.
        endpoint: String,
        model_path: PathBuf,
        connections: usize,
    },
}

/// The images of image chats.
#[derive(Debug, Clone)]
pub struct ImageInput {
    /// The JPEGs each image is drawn from (one for --image).
    pub sources: Vec<crate::image::ImageSource>,
    pub per_request: usize,
    pub repeat_fraction: f64,
}

/// How requests are started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    /// `concurrency` loops, each sending its next request when the
    /// previous one is answered.
    Closed,
    /// Requests at `rate` per second (gamma gaps of shape `burstiness`),
    /// at most `max_concurrency` in flight.
    Rate {
        rate: f64,
        burstiness: f64,
        max_concurrency: usize,
    },
}

/// In-flight cap of a rate run without --max-concurrency.
pub const DEFAULT_MAX_CONCURRENCY: usize = 1024;

/// A validated run.
#[derive(Debug, Clone)]
pub struct Config {
    pub target: Target,
    pub model: Option<String>,
    /// Closed loop: the loops; rate: the in-flight cap (clients).
    pub concurrency: usize,
    pub arrival: Arrival,
    pub seed: u64,
    pub duration: Duration,
    pub warmup: Duration,
    pub requests: Option<u64>,
    pub max_tokens: u32,
    pub stream: bool,
    pub prompt: String,
    /// Image chats (HTTP only).
    pub image: Option<ImageInput>,
    pub cpu_pids: Vec<u32>,
    pub request_timeout: Duration,
    /// Goodput objectives (none set: no goodput in the report).
    pub slo: crate::stats::Slo,
    /// Sent as `Authorization: Bearer` (HTTP).
    pub api_key: Option<String>,
}

impl Cli {
    /// Checks every option and resolves the target address.
    pub fn config(&self) -> anyhow::Result<Config> {
        let arrival = self.arrival()?;
        let concurrency = match arrival {
            Arrival::Rate {
                max_concurrency, ..
            } => max_concurrency,
            Arrival::Closed => match self.max_concurrency {
                Some(m) => in_range("--max-concurrency", m, 1, MAX_CONCURRENCY)?,
                None => in_range("--concurrency", self.concurrency, 1, MAX_CONCURRENCY)?,
            },
        };
        Ok(Config {
            target: self.target()?,
            model: self.model.clone(),
            api_key: self.api_key.clone(),
            concurrency,
            arrival,
            seed: self.seed,
            duration: seconds("--duration-secs", self.duration_secs, false)?,
            warmup: seconds("--warmup-secs", self.warmup_secs, true)?,
            requests: match self.requests {
                Some(0) => bail!("--requests must be at least 1"),
                other => other,
            },
            max_tokens: in_range("--max-tokens", self.max_tokens, 1, 1 << 20)?,
            stream: self.stream,
            prompt: non_empty("--prompt", self.prompt())?,
            image: self.image()?,
            cpu_pids: self.cpu_pid.clone(),
            request_timeout: seconds("--request-timeout-secs", self.request_timeout_secs, false)?,
            slo: crate::stats::Slo {
                ttft_ms: positive_ms("--slo-ttft-ms", self.slo_ttft_ms)?,
                tpot_ms: positive_ms("--slo-tpot-ms", self.slo_tpot_ms)?,
                e2e_ms: positive_ms("--slo-e2e-ms", self.slo_e2e_ms)?,
            },
        })
    }

    fn target(&self) -> anyhow::Result<Target> {
        match (&self.target, &self.grpc) {
            (Some(url), None) => http_target(url),
            (None, Some(url)) => {
                let model_path = self
                    .model_path
                    .clone()
                    .context("--grpc needs --model-path DIR (to tokenize the prompt)")?;
                Ok(Target::Grpc {
                    endpoint: grpc_endpoint(url)?,
                    model_path,
                    connections: in_range("--grpc-connections", self.grpc_connections, 1, 256)?,
                })
            }
            _ => bail!("give exactly one of --target http://HOST:PORT or --grpc grpc://HOST:PORT"),
        }
    }

    /// --request-rate, --burstiness and --max-concurrency, checked.
    fn arrival(&self) -> anyhow::Result<Arrival> {
        let text = self.request_rate.trim();
        if text.eq_ignore_ascii_case("inf") {
            return Ok(Arrival::Closed);
        }
        let rate: f64 = text.parse().map_err(|_| {
            anyhow::anyhow!("--request-rate must be a number of requests/s or inf, not {text:?}")
        })?;
        if !(rate.is_finite() && rate > 0.0 && rate <= 1e6) {
            bail!("--request-rate must be above 0 and at most 1e6 (or inf), not {rate}");
        }
        let b = self.burstiness;
        if !(b.is_finite() && (0.01..=100.0).contains(&b)) {
            bail!("--burstiness must be between 0.01 and 100, not {b}");
        }
        let cap = self.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY);
        Ok(Arrival::Rate {
            rate,
            burstiness: b,
            max_concurrency: in_range("--max-concurrency", cap, 1, MAX_CONCURRENCY)?,
        })
    }

    fn prompt(&self) -> &str {
        let images = self.image.is_some() || !self.image_size.is_empty();
        match &self.prompt {
            Some(p) => p,
            None if images => crate::image::DEFAULT_IMAGE_PROMPT,
            None => crate::prompt::DEFAULT_PROMPT,
        }
    }

    /// The images: the --image file (read and size-checked; its format
    /// is checked when the bodies are built) or the --image-size JPEGs.
    fn image(&self) -> anyhow::Result<Option<ImageInput>> {
        let f = self.image_repeat_fraction;
        let n = self.images_per_request;
        let sources = match (&self.image, self.image_size.is_empty()) {
            (Some(path), _) => vec![crate::image::ImageSource {
                name: path.display().to_string(),
                jpeg: self.image_file(path)?,
                weight: 1.0,
            }],
            (None, false) => self.synthetic()?,
            (None, true) => {
                if f != 0.0 || n != 1 {
                    bail!("--image-repeat-fraction and --images-per-request need --image or --image-size");
                }
                return Ok(None);
            }
        };
        if !(0.0..=1.0).contains(&f) {
            bail!("--image-repeat-fraction must be between 0 and 1, not {f}");
        }
        Ok(Some(ImageInput {
            sources,
            per_request: in_range(
                "--images-per-request",
                n,
                1,
                crate::image::MAX_IMAGES_PER_REQUEST,
            )?,
            repeat_fraction: f,
        }))
    }

    /// One synthetic JPEG per --image-size (seeded by --seed and the size).
    fn synthetic(&self) -> anyhow::Result<Vec<crate::image::ImageSource>> {
        self.image_size
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let spec: crate::synth::SizeSpec = text.parse().context("--image-size")?;
                let seed = iris_fingerprint::mix64(self.seed ^ (i as u64 + 1));
                Ok(crate::image::ImageSource {
                    name: format!("synthetic {}x{}", spec.width, spec.height),
                    jpeg: crate::synth::noise_jpeg(spec.width, spec.height, seed)?,
                    weight: spec.weight,
                })
            })
            .collect()
    }

    fn image_file(&self, path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
        let size = std::fs::metadata(path)
            .with_context(|| format!("--image {}", path.display()))?
            .len();
        if size > crate::image::MAX_IMAGE_BYTES as u64 {
            bail!(
                "--image {}: {size} bytes, at most {}",
                path.display(),
                crate::image::MAX_IMAGE_BYTES
            );
        }
        std::fs::read(path).with_context(|| format!("--image {}", path.display()))
    }

    /// Threads for the runtime, checked.
    /// The --turns run, when asked for: its settings and where it goes.
    pub fn conversation(&self) -> anyhow::Result<Option<(ConversationConfig, Target)>> {
        let Some(turns) = self.turns else {
            return Ok(None);
        };
        let target = match &self.target {
            Some(url) => http_target(url)?,
            None => bail!("--turns needs --target http://HOST:PORT"),
        };
        let path = self
            .image
            .as_ref()
            .context("--turns needs --image FILE (the screenshot)")?;
        if self.concurrency != 1 || self.request_rate.trim() != "inf" {
            bail!("--turns runs one request at a time: drop --concurrency and --request-rate");
        }
        let cfg = ConversationConfig {
            turns: in_range("--turns", turns, 1, crate::conversation::MAX_TURNS)?,
            conversations: in_range(
                "--conversations",
                self.conversations,
                1,
                crate::conversation::MAX_CONVERSATIONS,
            )?,
            jpeg: self.image_file(path)?,
            prompt: non_empty("--prompt", self.prompt())?,
            model: self.model.clone().unwrap_or_default(),
            max_tokens: in_range("--max-tokens", self.max_tokens, 1, 1 << 20)?,
            cpu_pids: self.cpu_pid.clone(),
            request_timeout: seconds("--request-timeout-secs", self.request_timeout_secs, false)?,
            tensor_bytes: self
                .tensor_bytes_metrics
                .as_deref()
                .map(crate::scrape::MetricsUrl::parse)
                .transpose()?,
        };
        Ok(Some((cfg, target)))
    }

    pub fn threads(&self) -> anyhow::Result<usize> {
        in_range("--threads", self.threads, 1, 256)
    }
}

/// `http://host:port[/]` → the socket address and Host header.
pub fn http_target(url: &str) -> anyhow::Result<Target> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--target {url:?}: only http:// URLs are supported"))?;
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        bail!("--target {url:?}: give the server root, e.g. http://127.0.0.1:8000");
    }
    let addr = resolve(authority, 80).with_context(|| format!("--target {url:?}"))?;
    Ok(Target::Http {
        addr,
        authority: authority.to_owned(),
    })
}

/// `grpc://host:port` (or `http://`) → `http://host:port` for tonic.
pub fn grpc_endpoint(url: &str) -> anyhow::Result<String> {
    let rest = url
        .strip_prefix("grpc://")
        .or_else(|| url.strip_prefix("http://"))
        .with_context(|| format!("--grpc {url:?}: expected grpc://HOST:PORT"))?;
    let authority = rest.trim_end_matches('/');
    resolve(authority, 0).with_context(|| format!("--grpc {url:?}"))?;
    Ok(format!("http://{authority}"))
}

/// The first address of `host[:port]` (`default_port` when absent; 0
/// means the port is required).
fn resolve(authority: &str, default_port: u16) -> anyhow::Result<SocketAddr> {
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_owned()
    } else if default_port != 0 {
        format!("{authority}:{default_port}")
    } else {
        bail!("{authority:?} has no port");
    };
    with_port
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {with_port:?}"))?
        .next()
        .with_context(|| format!("{with_port:?} resolves to no address"))
}

fn in_range<T: PartialOrd + std::fmt::Display + Copy>(
    name: &str,
    value: T,
    min: T,
    max: T,
) -> anyhow::Result<T> {
    if value < min || value > max {
        bail!("{name} must be between {min} and {max}, not {value}");
    }
    Ok(value)
}

fn seconds(name: &str, value: f64, zero_ok: bool) -> anyhow::Result<Duration> {
    let ok =
        value.is_finite() && value <= MAX_DURATION_SECS && (value > 0.0 || zero_ok && value == 0.0);
    if !ok {
        let low = if zero_ok { "0" } else { "more than 0" };
        bail!("{name} must be {low} and at most {MAX_DURATION_SECS} seconds, not {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

/// An optional objective in milliseconds: finite and above 0.
fn positive_ms(name: &str, value: Option<f64>) -> anyhow::Result<Option<f64>> {
    match value {
        Some(v) if !(v.is_finite() && v > 0.0) => bail!("{name} must be more than 0 ms, not {v}"),
        other => Ok(other),
    }
}

fn non_empty(name: &str, value: &str) -> anyhow::Result<String> {
    if value.trim().is_empty() {
        bail!("{name} must not be empty");
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("iris-loadgen").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn http_targets() {
        let config = cli(&["--target", "http://127.0.0.1:8000/"])
            .config()
            .unwrap();
        match config.target {
            Target::Http { addr, authority } => {
                assert_eq!(addr.port(), 8000);
                assert_eq!(authority, "127.0.0.1:8000");
            }
            other => panic!("{other:?}"),
        }
        assert!(http_target("https://127.0.0.1:8000").is_err());
        assert!(http_target("http://127.0.0.1:8000/v1").is_err());
    }

    #[test]
    fn grpc_targets_need_a_model_and_a_port() {
        assert!(cli(&["--grpc", "grpc://127.0.0.1:1"]).config().is_err());
        let c = cli(&["--grpc", "grpc://127.0.0.1:1", "--model-path", "/m"]);
        assert!(matches!(c.config().unwrap().target, Target::Grpc { .. }));
        assert!(grpc_endpoint("grpc://127.0.0.1").is_err());
        assert_eq!(
            grpc_endpoint("grpc://127.0.0.1:9").unwrap(),
            "http://127.0.0.1:9"
        );
    }

    #[test]
    fn rejects_bad_numbers() {
        let base = ["--target", "http://127.0.0.1:1"];
        let with = |extra: &[&str]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            cli(&v).config()
        };
        assert!(with(&["--concurrency", "0"]).is_err());
        assert!(with(&["--duration-secs", "0"]).is_err());
        assert!(with(&["--duration-secs", "NaN"]).is_err());
        assert!(with(&["--duration-secs", "1e9"]).is_err());
        assert!(with(&["--warmup-secs", "0"]).is_ok());
        assert!(with(&["--requests", "0"]).is_err());
        assert!(with(&["--prompt", " "]).is_err());
        assert!(cli(&[]).config().is_err());
    }

    #[test]
    fn arrival_options() {
        let base = ["--target", "http://127.0.0.1:1"];
        let with = |extra: &[&str]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            cli(&v).config()
        };
        let closed = with(&["--concurrency", "8"]).unwrap();
        assert_eq!((closed.arrival, closed.concurrency), (Arrival::Closed, 8));
        let capped = with(&["--request-rate", "inf", "--max-concurrency", "4"]).unwrap();
        assert_eq!((capped.arrival, capped.concurrency), (Arrival::Closed, 4));
        let rate = with(&[
            "--request-rate",
            "2.5",
            "--burstiness",
            "0.5",
            "--max-concurrency",
            "16",
        ])
        .unwrap();
        assert_eq!(
            rate.arrival,
            Arrival::Rate {
                rate: 2.5,
                burstiness: 0.5,
                max_concurrency: 16
            }
        );
        assert_eq!(rate.concurrency, 16);
        let default_cap = with(&["--request-rate", "1"]).unwrap();
        assert_eq!(default_cap.concurrency, DEFAULT_MAX_CONCURRENCY);
        for bad in [
            &["--request-rate", "0"][..],
            &["--request-rate", "-1"],
            &["--request-rate", "fast"],
            &["--request-rate", "NaN"],
            &["--request-rate", "1", "--burstiness", "0"],
            &["--request-rate", "1", "--max-concurrency", "0"],
        ] {
            assert!(with(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn image_options() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.jpg");
        std::fs::write(&file, [0xFF, 0xD8, 0xFF, 0xD9]).unwrap();
        let file = file.to_str().unwrap();
        let target = ["--target", "http://127.0.0.1:1"];
        let with = |extra: &[&str]| {
            let mut v = target.to_vec();
            v.extend_from_slice(extra);
            Cli::try_parse_from(std::iter::once("iris-loadgen").chain(v))
                .map_err(anyhow::Error::from)
                .and_then(|c| c.config())
        };
        let config = with(&["--image", file, "--image-repeat-fraction", "0.5"]).unwrap();
        let image = config.image.unwrap();
        assert_eq!(image.sources.len(), 1);
        assert_eq!(image.sources[0].jpeg.len(), 4);
        assert_eq!(image.per_request, 1);
        assert_eq!(image.repeat_fraction, 0.5);
        assert_eq!(config.prompt, crate::image::DEFAULT_IMAGE_PROMPT);
        assert_eq!(with(&[]).unwrap().prompt, crate::prompt::DEFAULT_PROMPT);
        assert!(with(&[]).unwrap().image.is_none());
        assert!(with(&["--image", file, "--image-repeat-fraction", "1.5"]).is_err());
        assert!(with(&["--image", file, "--image-repeat-fraction", "NaN"]).is_err());
        assert!(with(&["--image-repeat-fraction", "0.5"]).is_err());
        assert!(with(&["--image", "/nonexistent/x.jpg"]).is_err());
        assert!(with(&["--image", file, "--images-per-request", "0"]).is_err());
        assert!(with(&["--image", file, "--image-size", "8x8"]).is_err());
        let synth = with(&[
            "--image-size",
            "32x16",
            "--image-size",
            "8x8:3",
            "--images-per-request",
            "2",
        ])
        .unwrap();
        let image = synth.image.unwrap();
        assert_eq!(image.per_request, 2);
        let names: Vec<&str> = image.sources.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["synthetic 32x16", "synthetic 8x8"]);
        assert_eq!(image.sources[1].weight, 3.0);
        assert_eq!(synth.prompt, crate::image::DEFAULT_IMAGE_PROMPT);
        assert!(with(&["--image-size", "0x8"]).is_err());
        assert!(with(&["--images-per-request", "2"]).is_err());
        let grpc = ["--grpc", "grpc://127.0.0.1:1", "--model-path", "/m"];
        let mut v = grpc.to_vec();
        v.extend_from_slice(&["--image", file]);
        assert!(Cli::try_parse_from(std::iter::once("iris-loadgen").chain(v)).is_err());
    }
}
