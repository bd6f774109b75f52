//! Running the load, for the warm-up and then the measured window (or
//! until `--requests` measured requests have started), in one of two ways:
//!
//! - closed loop (`--request-rate inf`): `concurrency` request loops, each
//!   sending its next request as soon as the previous one is answered;
//! - open loop (`--request-rate R`): a dispatcher draws arrival times from
//!   [`Arrivals`] and hands each request to an idle client, at most
//!   `--max-concurrency` in flight. As in `vllm bench serve`, a request
//!   that finds every client busy waits for one, and its latencies count
//!   from when it is sent.
//!
//! Only requests started (open loop: arriving) inside the window are
//! measured; CPU time is sampled at the window's start and after the last
//! request ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::args::{Arrival, Config, Target};
use crate::arrivals::Arrivals;
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
#[derive(Debug, Clone)]
pub struct Timing {
    /// Response headers received.
    pub ttfb: Duration,
    /// Arrivals of the generated tokens (streams only).
    pub tokens: TokenClock,
}

/// When a stream's generated tokens arrived, from the request's start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenClock {
    /// The first token (time to first token).
    pub first: Option<Duration>,
    /// The last token.
    pub last: Option<Duration>,
    /// Tokens (HTTP: SSE events with generated text) received.
    pub tokens: u32,
    /// Inter-token latencies: one per token after the first. Tokens that
    /// arrive together (one read, one gRPC chunk) are 0 apart.
    pub gaps: Vec<Duration>,
}

impl TokenClock {
    /// `n` tokens arrived together, `at` after the request's start.
    pub fn arrived(&mut self, n: u32, at: Duration) {
        if n == 0 {
            return;
        }
        match self.last {
            None => self.first = Some(at),
            Some(prev) => self.gaps.push(at.saturating_sub(prev)),
        }
        self.gaps
            .extend(std::iter::repeat_n(Duration::ZERO, (n - 1) as usize));
        self.last = Some(at);
        self.tokens = self.tokens.saturating_add(n);
    }

    /// Time per output token after the first: (last − first) / (tokens − 1);
    /// `None` with fewer than two tokens.
    pub fn tpot(&self) -> Option<Duration> {
        let (first, last) = (self.first?, self.last?);
        (self.tokens >= 2).then(|| last.saturating_sub(first) / (self.tokens - 1))
    }
}

/// One measured, successful request.
#[derive(Debug, Clone)]
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
    let handles: Vec<_> = match config.arrival {
        Arrival::Closed => clients
            .into_iter()
            .map(|c| tokio::spawn(request_loop(c, schedule.clone())))
            .collect(),
        Arrival::Rate {
            rate, burstiness, ..
        } => {
            let arrivals = Arrivals::new(rate, burstiness, config.seed);
            vec![tokio::spawn(dispatch(
                clients,
                schedule.clone(),
                arrivals,
                start,
            ))]
        }
    };
    tokio::time::sleep_until(schedule.measure_from.into()).await;
    let before = cpu_times(&procs, ticks_per_sec)?;
    // An open-loop request may wait for a client up to a timeout, then run
    // up to another.
    let grace = match config.arrival {
        Arrival::Closed => config.request_timeout,
        Arrival::Rate { .. } => config.request_timeout * 2,
    };
    let loops = join_bounded(handles, schedule.stop_at + grace).await?;
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
                None => http::first_model(*addr, authority, config.api_key.as_deref()).await?,
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
                    let chats = ImageChats::with_sources(
                        &input.sources,
                        input.per_request,
                        &fields,
                        input.repeat_fraction,
                        image::run_nonce(),
                        config.seed,
                    )
                    .context("the image chats")?;
                    Bodies::Image(chats)
                }
            };
            let target = Arc::new(HttpTarget {
                addr: *addr,
                authority: authority.clone(),
                bodies,
                stream: config.stream,
                api_key: config.api_key.clone(),
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

/// The open loop: each arrival waits for its time, then for an idle
/// client, and runs on its own task; the client returns to the idle set
/// when the request ends.
async fn dispatch(
    clients: Vec<Client>,
    schedule: Arc<Schedule>,
    mut arrivals: Arrivals,
    start: Instant,
) -> LoopResult {
    let (idle_tx, mut idle_rx) = tokio::sync::mpsc::unbounded_channel();
    for c in clients {
        let _ = idle_tx.send(c);
    }
    let mut tasks = tokio::task::JoinSet::new();
    let mut out = LoopResult::default();
    let mut at = start;
    loop {
        at += arrivals.next_gap();
        tokio::time::sleep_until(at.into()).await;
        // The window is decided by the arrival time, not the send time.
        let Some(measured) = schedule.admit(at) else {
            break;
        };
        let Some(mut client) = idle_rx.recv().await else {
            break;
        };
        let idle = idle_tx.clone();
        let timeout = schedule.request_timeout;
        tasks.spawn(async move {
            let sent = Instant::now();
            let result = tokio::time::timeout(timeout, client.send(sent)).await;
            let end = Instant::now();
            let _ = idle.send(client);
            let result = result.unwrap_or_else(|_| Err(anyhow::anyhow!("request timed out")));
            (measured, result, end - sent, end)
        });
        // Reap finished requests as we go, so the set stays small.
        while let Some(done) = tasks.try_join_next() {
            reap(&mut out, done);
        }
    }
    drop(idle_tx);
    while let Some(done) = tasks.join_next().await {
        reap(&mut out, done);
    }
    out
}

/// One open-loop request's outcome: (measured, result, latency, end).
type Outcome = (bool, anyhow::Result<Timing>, Duration, Instant);

fn reap(out: &mut LoopResult, done: Result<Outcome, tokio::task::JoinError>) {
    match done {
        Ok((measured, result, latency, end)) => {
            if measured {
                record(out, result, latency);
                out.last_end = out.last_end.max(Some(end));
            }
        }
        Err(e) => record(
            out,
            Err(anyhow::anyhow!("a request task failed: {e}")),
            Duration::ZERO,
        ),
    }
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
            tokens: TokenClock::default(),
        };
        record(&mut out, Ok(ok), Duration::from_millis(2));
        assert_eq!(out.errors, ERROR_SAMPLES as u64 + 3);
        assert_eq!(out.error_messages.len(), ERROR_SAMPLES);
        assert_eq!(out.samples.len(), 1);
    }

    #[test]
    fn token_clock_times_tokens() {
        let ms = Duration::from_millis;
        let mut c = TokenClock::default();
        c.arrived(0, ms(1));
        assert_eq!((c.first, c.tpot()), (None, None));
        c.arrived(1, ms(10));
        assert_eq!((c.first, c.tpot()), (Some(ms(10)), None));
        c.arrived(1, ms(14));
        // Two tokens in one read: the second is 0 after the first.
        c.arrived(2, ms(22));
        assert_eq!(c.tokens, 4);
        assert_eq!(c.last, Some(ms(22)));
        assert_eq!(c.gaps, vec![ms(4), ms(8), Duration::ZERO]);
        assert_eq!(c.tpot(), Some(ms(4)));
    }
}
