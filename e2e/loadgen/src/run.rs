//! The closed loop: `concurrency` request loops, each sending its next
//! request as soon as the previous one is answered, for the warm-up and
//! then the measured window (or until `--requests` measured requests have
//! started). Only requests started inside the window are measured; CPU
//! time is sampled at the window's start and after the last loop ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::args::{Config, Target};
use crate::cpu::{self, Proc};
use crate::grpc::{self, GrpcClient};
use crate::http::{self, Bodies, HttpClient, HttpTarget};
use crate::image::{self, ChatFields, ImageChats};
use crate::prompt;

/// Pause after a failed request, so a dead target does not spin a core.
const ERROR_PAUSE: Duration = Duration::from_millis(5);
/// Error messages kept for the report.
const ERROR_SAMPLES: usize = 5;

/// Times of one answered request, from its start.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Response headers received.
    pub ttfb: Duration,
    /// First generated token received (streams only).
    pub first_token: Option<Duration>,
}

/// One measured, successful request.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub latency: Duration,
    pub timing: Timing,
}

/// What one request loop measured.
#[derive(Debug, Default)]
pub struct LoopResult {
    pub samples: Vec<Sample>,
    pub errors: u64,
    pub error_messages: Vec<String>,
    pub last_end: Option<Instant>,
}

/// CPU time of one process over the window.
#[derive(Debug, Clone)]
pub struct CpuUse {
    pub proc_: Proc,
    pub name: String,
    pub used: Duration,
}

/// Everything a run measured.
#[derive(Debug)]
pub struct Measured {
    pub loops: Vec<LoopResult>,
    pub window: Duration,
    pub cpu: Vec<CpuUse>,
    pub ticks_per_sec: u64,
}

/// A request loop's client.
enum Client {
    Http(HttpClient),
    Grpc(GrpcClient),
}

impl Client {
    async fn send(&mut self, start: Instant) -> anyhow::Result<Timing> {
        match self {
            Client::Http(c) => c.send(start).await,
            Client::Grpc(c) => c.send(start).await,
        }
    }
}

/// When loops measure and stop, shared by all of them.
struct Schedule {
    measure_from: Instant,
    stop_at: Instant,
    cap: Option<u64>,
    started: AtomicU64,
    request_timeout: Duration,
}

impl Schedule {
    /// Whether a request starting `now` may start, and whether it is
    /// measured.
    fn admit(&self, now: Instant) -> Option<bool> {
        if now >= self.stop_at {
            return None;
        }
        if now < self.measure_from {
            return Some(false);
        }
        let n = self.started.fetch_add(1, Ordering::Relaxed);
        match self.cap {
            Some(cap) if n >= cap => None,
            _ => Some(true),
        }
    }
}

/// Runs the whole load and returns the measurements.
pub async fn run(config: &Config) -> anyhow::Result<Measured> {
    let clients = clients(config).await?;
    let ticks_per_sec = cpu::clock_ticks_per_sec();
    let mut procs: Vec<Proc> = config.cpu_pids.iter().map(|&p| Proc::Pid(p)).collect();
    procs.push(Proc::This);
    let start = Instant::now();
    let schedule = Arc::new(Schedule {
        measure_from: start + config.warmup,
        stop_at: start + config.warmup + config.duration,
        cap: config.requests,
        started: AtomicU64::new(0),
        request_timeout: config.request_timeout,
    });
    let handles: Vec<_> = clients
        .into_iter()
        .map(|c| tokio::spawn(request_loop(c, schedule.clone())))
        .collect();
    tokio::time::sleep_until(schedule.measure_from.into()).await;
    let before = cpu_times(&procs, ticks_per_sec)?;
    let loops = join_bounded(handles, schedule.stop_at + config.request_timeout).await?;
    let after = cpu_times(&procs, ticks_per_sec)?;
    let last_end = loops.iter().filter_map(|l| l.last_end).max();
    let window = last_end.map_or(Duration::ZERO, |e| {
        e.saturating_duration_since(schedule.measure_from)
    });
    let cpu = procs
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(&p, (b, a))| CpuUse {
            proc_: p,
            name: p.name(),
            used: a.saturating_sub(*b),
        })
        .collect();
    Ok(Measured {
        loops,
        window,
        cpu,
        ticks_per_sec,
    })
}

/// One client per request loop.
async fn clients(config: &Config) -> anyhow::Result<Vec<Client>> {
    match &config.target {
        Target::Http { addr, authority } => {
            let model = match &config.model {
                Some(m) => m.clone(),
                None => http::first_model(*addr, authority).await?,
            };
            let bodies = match &config.image {
                None => Bodies::Text(prompt::chat_body(
                    &model,
                    &config.prompt,
                    config.max_tokens,
                    config.stream,
                )),
                Some(input) => {
                    let fields = ChatFields {
                        model: &model,
                        prompt: &config.prompt,
                        max_tokens: config.max_tokens,
                        stream: config.stream,
                    };
                    let chats = ImageChats::new(
                        &input.bytes,
                        &fields,
                        input.repeat_fraction,
                        image::run_nonce(),
                    )
                    .with_context(|| format!("--image {}", input.path.display()))?;
                    Bodies::Image(chats)
                }
            };
            let target = Arc::new(HttpTarget {
                addr: *addr,
                authority: authority.clone(),
                bodies,
                stream: config.stream,
            });
            Ok((0..config.concurrency)
                .map(|_| Client::Http(HttpClient::new(target.clone())))
                .collect())
        }
        Target::Grpc {
            endpoint,
            model_path,
            connections,
        } => {
            let ids = prompt::prompt_ids(model_path, &config.prompt)?;
            let template = Arc::new(prompt::generate_template(
                ids,
                config.max_tokens,
                config.stream,
            ));
            let channels = grpc::channels(endpoint, *connections).await?;
            Ok((0..config.concurrency)
                .map(|i| {
                    let channel = channels[i % channels.len()].clone();
                    Client::Grpc(GrpcClient::new(channel, template.clone(), i))
                })
                .collect())
        }
    }
}

async fn request_loop(mut client: Client, schedule: Arc<Schedule>) -> LoopResult {
    let mut out = LoopResult::default();
    loop {
        let start = Instant::now();
        let Some(measured) = schedule.admit(start) else {
            break;
        };
        let result = tokio::time::timeout(schedule.request_timeout, client.send(start)).await;
        let end = Instant::now();
        let result = result.unwrap_or_else(|_| Err(anyhow::anyhow!("request timed out")));
        let failed = result.is_err();
        if measured {
            record(&mut out, result, end - start);
            out.last_end = Some(end);
        }
        if failed {
            tokio::time::sleep(ERROR_PAUSE).await;
        }
    }
    out
}

fn record(out: &mut LoopResult, result: anyhow::Result<Timing>, latency: Duration) {
    match result {
        Ok(timing) => out.samples.push(Sample { latency, timing }),
        Err(e) => {
            out.errors += 1;
            if out.error_messages.len() < ERROR_SAMPLES {
                out.error_messages.push(format!("{e:#}"));
            }
        }
    }
}

/// Waits for every loop, aborting the stragglers at `deadline`.
async fn join_bounded(
    handles: Vec<tokio::task::JoinHandle<LoopResult>>,
    deadline: Instant,
) -> anyhow::Result<Vec<LoopResult>> {
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        let abort = handle.abort_handle();
        match tokio::time::timeout_at(deadline.into(), handle).await {
            Ok(result) => out.push(result.context("a request loop panicked")?),
            Err(_) => {
                abort.abort();
                out.push(LoopResult {
                    errors: 1,
                    error_messages: vec!["request loop did not stop in time".into()],
                    ..LoopResult::default()
                });
            }
        }
    }
    Ok(out)
}

fn cpu_times(procs: &[Proc], ticks_per_sec: u64) -> anyhow::Result<Vec<Duration>> {
    procs
        .iter()
        .map(|&p| cpu::cpu_time(p, ticks_per_sec))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(warmup_ms: u64, run_ms: u64, cap: Option<u64>) -> (Instant, Schedule) {
        let now = Instant::now();
        let s = Schedule {
            measure_from: now + Duration::from_millis(warmup_ms),
            stop_at: now + Duration::from_millis(warmup_ms + run_ms),
            cap,
            started: AtomicU64::new(0),
            request_timeout: Duration::from_secs(1),
        };
        (now, s)
    }

    #[test]
    fn admits_warmup_then_measured_then_stops() {
        let (now, s) = schedule(100, 100, None);
        assert_eq!(s.admit(now), Some(false));
        assert_eq!(s.admit(now + Duration::from_millis(150)), Some(true));
        assert_eq!(s.admit(now + Duration::from_millis(200)), None);
    }

    #[test]
    fn request_cap_counts_measured_requests_only() {
        let (now, s) = schedule(10, 1000, Some(2));
        assert_eq!(s.admit(now), Some(false));
        let later = now + Duration::from_millis(20);
        assert_eq!(s.admit(later), Some(true));
        assert_eq!(s.admit(later), Some(true));
        assert_eq!(s.admit(later), None);
    }

    #[test]
    fn records_errors_with_a_few_messages() {
        let mut out = LoopResult::default();
        for _ in 0..(ERROR_SAMPLES + 3) {
            record(&mut out, Err(anyhow::anyhow!("boom")), Duration::ZERO);
        }
        let ok = Timing {
            ttfb: Duration::from_millis(1),
            first_token: None,
        };
        record(&mut out, Ok(ok), Duration::from_millis(2));
        assert_eq!(out.errors, ERROR_SAMPLES as u64 + 3);
        assert_eq!(out.error_messages.len(), ERROR_SAMPLES);
        assert_eq!(out.samples.len(), 1);
    }
}
