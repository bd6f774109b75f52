//! The run's report: requests/s, latency and time-to-first-byte/token
//! percentiles, errors and CPU µs per request of each watched process
//! (and of the load generator itself), as a table or as JSON.

use std::fmt::Write as _;

use serde::Serialize;

use crate::args::{Config, Target};
use crate::cpu::Proc;
use crate::run::Measured;
use crate::stats::{cpu_us_per_request, rate, Distribution};

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

/// The image of image chats.
#[derive(Debug, Serialize)]
pub struct ImageReport {
    pub path: String,
    pub bytes: usize,
    /// Fraction of the requests that sent the one fixed image.
    pub repeat_fraction: f64,
}

/// Everything printed for a run.
#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub target: String,
    pub stream: bool,
    pub concurrency: usize,
    pub max_tokens: u32,
    /// Image chats: one image per request, so CPU per request is per image.
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
            max_tokens: config.max_tokens,
            image: config.image.as_ref().map(|i| ImageReport {
                path: i.path.display().to_string(),
                bytes: i.bytes.len(),
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
                    .filter_map(|s| s.timing.first_token)
                    .collect(),
            ),
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
        let _ = writeln!(
            s,
            "{} {}  stream={}  concurrency={}  max_tokens={}",
            self.mode, self.target, self.stream, self.concurrency, self.max_tokens
        );
        if let Some(i) = &self.image {
            let _ = writeln!(
                s,
                "image {} ({} bytes), repeat fraction {}, one image per request",
                i.path, i.bytes, i.repeat_fraction
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
        ] {
            if let Some(d) = d {
                let _ = writeln!(
                    s,
                    "{name:<10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                    d.p50_ms, d.p90_ms, d.p99_ms, d.mean_ms, d.max_ms
                );
            }
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
