//! The run's report: requests/s, latency and time-to-first-byte/token
//! percentiles, errors and CPU µs per request of each watched process
//! (and of the load generator itself), as a table or as JSON.

use std::fmt::Write as _;

use serde::Serialize;

use crate::args::{Arrival, Config, Target};
use crate::cpu::Proc;
use crate::run::Measured;
use crate::stats::{cpu_us_per_request, rate, Distribution, Slo};

/// CPU of one process over the measured window.
#[derive(Debug, Serialize)]
pub struct CpuReport {
    /// `null` for the load generator itself.
    pub pid: Option<u32>,
    pub name: String,
    pub cpu_seconds: f64,
    /// CPU seconds per wall second (1.0 = one core busy).
    pub cores: f64,
    pub us_per_request: Option<f64>,
}

/// The images of image chats.
#[derive(Debug, Serialize)]
pub struct ImageReport {
    /// The first source's path (or `synthetic WxH`).
    pub path: String,
    /// The first source's JPEG size.
    pub bytes: usize,
    /// Every source: name, JPEG bytes, weight.
    pub sources: Vec<(String, usize, f64)>,
    pub images_per_request: usize,
    /// Fraction of the images that were their source's fixed image.
    pub repeat_fraction: f64,
}

/// Goodput: measured requests meeting every service-level objective.
#[derive(Debug, Serialize)]
pub struct Goodput {
    pub slo: Slo,
    pub requests: u64,
    pub requests_per_sec: f64,
}

/// Everything printed for a run.
#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub target: String,
    pub stream: bool,
    /// Closed loop: the loops; open loop: the most requests in flight.
    pub concurrency: usize,
    /// Arrivals per second (`null`: the closed loop).
    pub request_rate: Option<f64>,
    /// Gamma shape of the gaps between arrivals (open loop).
    pub burstiness: Option<f64>,
    pub seed: u64,
    pub max_tokens: u32,
    /// Image chats (CPU per request is per image with one image each).
    pub image: Option<ImageReport>,
    pub window_secs: f64,
    pub requests: u64,
    pub errors: u64,
    pub requests_per_sec: f64,
    pub latency: Option<Distribution>,
    /// Response headers (HTTP) or response metadata (gRPC).
    pub ttfb: Option<Distribution>,
    /// First generated token (streams only).
    pub ttft: Option<Distribution>,
    /// Time per output token after the first, one value per request with
    /// at least two tokens (streams only).
    pub tpot: Option<Distribution>,
    /// Inter-token latency, one value per token after the first (streams
    /// only; tokens that arrive together are 0 apart).
    pub itl: Option<Distribution>,
    /// Requests that met every objective (with --slo-*-ms).
    pub goodput: Option<Goodput>,
    /// Watched processes, then the load generator (`pid: null`).
    pub cpu: Vec<CpuReport>,
    /// `sysconf(_SC_CLK_TCK)`; CPU times have this resolution.
    pub clock_ticks_per_sec: u64,
    pub error_samples: Vec<String>,
}

impl Report {
    pub fn new(config: &Config, m: Measured) -> Report {
        let samples: Vec<_> = m.loops.iter().flat_map(|l| l.samples.iter()).collect();
        let requests = samples.len() as u64;
        let errors = m.loops.iter().map(|l| l.errors).sum();
        let wall = m.window.as_secs_f64();
        let cpu = m
            .cpu
            .iter()
            .map(|c| CpuReport {
                pid: match c.proc_ {
                    Proc::Pid(p) => Some(p),
                    Proc::This => None,
                },
                name: c.name.clone(),
                cpu_seconds: c.used.as_secs_f64(),
                cores: if wall > 0.0 {
                    c.used.as_secs_f64() / wall
                } else {
                    0.0
                },
                us_per_request: cpu_us_per_request(c.used, requests),
            })
            .collect();
        let (mode, target) = match &config.target {
            Target::Http { authority, .. } => ("http", format!("http://{authority}")),
            Target::Grpc { endpoint, .. } => ("grpc", endpoint.clone()),
        };
        Report {
            mode,
            target,
            stream: config.stream,
            concurrency: config.concurrency,
            request_rate: match config.arrival {
                Arrival::Closed => None,
                Arrival::Rate { rate, .. } => Some(rate),
            },
            burstiness: match config.arrival {
                Arrival::Closed => None,
                Arrival::Rate { burstiness, .. } => Some(burstiness),
            },
            seed: config.seed,
            max_tokens: config.max_tokens,
            image: config.image.as_ref().map(|i| ImageReport {
                path: i
                    .sources
                    .first()
                    .map_or_else(String::new, |s| s.name.clone()),
                bytes: i.sources.first().map_or(0, |s| s.jpeg.len()),
                sources: i
                    .sources
                    .iter()
                    .map(|s| (s.name.clone(), s.jpeg.len(), s.weight))
                    .collect(),
                images_per_request: i.per_request,
                repeat_fraction: i.repeat_fraction,
            }),
            window_secs: wall,
            requests,
            errors,
            requests_per_sec: rate(requests, m.window),
            latency: Distribution::of(samples.iter().map(|s| s.latency).collect()),
            ttfb: Distribution::of(samples.iter().map(|s| s.timing.ttfb).collect()),
            ttft: Distribution::of(
                samples
                    .iter()
                    .filter_map(|s| s.timing.tokens.first)
                    .collect(),
            ),
            tpot: Distribution::of(
                samples
                    .iter()
                    .filter_map(|s| s.timing.tokens.tpot())
                    .collect(),
            ),
            itl: Distribution::of(
                samples
                    .iter()
                    .flat_map(|s| s.timing.tokens.gaps.iter().copied())
                    .collect(),
            ),
            goodput: config.slo.is_set().then(|| {
                let good = samples
                    .iter()
                    .filter(|s| {
                        let t = &s.timing.tokens;
                        config.slo.met(t.first, t.tpot(), s.latency)
                    })
                    .count() as u64;
                Goodput {
                    slo: config.slo,
                    requests: good,
                    requests_per_sec: rate(good, m.window),
                }
            }),
            cpu,
            clock_ticks_per_sec: m.ticks_per_sec,
            error_samples: m
                .loops
                .iter()
                .flat_map(|l| l.error_messages.clone())
                .take(5)
                .collect(),
        }
    }

    /// A human-readable table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let arrivals = match (self.request_rate, self.burstiness) {
            (Some(r), Some(b)) => format!(
                "request rate {r}/s (burstiness {b}, seed {}), at most {} in flight",
                self.seed, self.concurrency
            ),
            _ => format!("closed loop, concurrency={}", self.concurrency),
        };
        let _ = writeln!(
            s,
            "{} {}  stream={}  {arrivals}  max_tokens={}",
            self.mode, self.target, self.stream, self.max_tokens
        );
        if let Some(i) = &self.image {
            let sources: Vec<String> = i
                .sources
                .iter()
                .map(|(name, bytes, weight)| format!("{name} ({bytes} bytes, weight {weight})"))
                .collect();
            let _ = writeln!(
                s,
                "images: {}; {} per request, repeat fraction {}",
                sources.join(", "),
                i.images_per_request,
                i.repeat_fraction
            );
        }
        let _ = writeln!(
            s,
            "requests {}  errors {}  window {:.2} s  => {:.1} req/s",
            self.requests, self.errors, self.window_secs, self.requests_per_sec
        );
        let _ = writeln!(
            s,
            "{:<10} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "ms", "p50", "p90", "p99", "mean", "max"
        );
        for (name, d) in [
            ("latency", &self.latency),
            ("ttfb", &self.ttfb),
            ("ttft", &self.ttft),
            ("tpot", &self.tpot),
            ("itl", &self.itl),
        ] {
            if let Some(d) = d {
                let _ = writeln!(
                    s,
                    "{name:<10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                    d.p50_ms, d.p90_ms, d.p99_ms, d.mean_ms, d.max_ms
                );
            }
        }
        if let Some(g) = &self.goodput {
            let _ = writeln!(
                s,
                "goodput {} requests => {:.1} req/s (SLO ms: ttft {:?}, tpot {:?}, e2e {:?})",
                g.requests, g.requests_per_sec, g.slo.ttft_ms, g.slo.tpot_ms, g.slo.e2e_ms
            );
        }
        for c in &self.cpu {
            let who = c.pid.map_or_else(
                || format!("{} (self)", c.name),
                |p| format!("{} ({p})", c.name),
            );
            let per = c
                .us_per_request
                .map_or("-".to_owned(), |u| format!("{u:.1}"));
            let _ = writeln!(s, "cpu {who:<24} {per:>9} µs/request  {:.2} cores", c.cores);
        }
        let _ = writeln!(s, "(CPU clock: {} ticks/s)", self.clock_ticks_per_sec);
        for e in &self.error_samples {
            let _ = writeln!(s, "error: {e}");
        }
        s
    }
}
