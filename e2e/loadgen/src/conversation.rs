//! Multi-turn agent conversations (`--turns N`): the workload of a chat
//! client driving an agent that looks at a screen. Turn `k` of a
//! conversation sends the whole history again — `k` user messages, each
//! with one screenshot, and the `k − 1` assistant answers between them —
//! so a gateway that reprocesses every earlier image pays for turn `k` `k`
//! times, while one with a pixel cache pays for the new image only.
//!
//! Conversations run one after another on one keep-alive connection (one
//! request in flight), so every turn's CPU time belongs to that turn. Each
//! conversation's screenshots are the `--image` JPEG made distinct by
//! [`crate::image::prefix`] (a COM segment: new bytes, same pixels), fresh
//! per conversation and per turn, the same bytes when a later turn resends
//! them. One unmeasured warm-up conversation runs first. The report gives,
//! per turn, the time to first token and the CPU time of each `--cpu-pid`
//! process (CPU is summed over the conversations and divided by their
//! number, so the 10 ms granularity of `/proc/<pid>/stat` shrinks with
//! more conversations).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};

use crate::cpu::{self, Proc};
use crate::http;
use crate::image::{self, ChatBody};
use crate::scrape::{MetricsUrl, TENSOR_BYTES};
use crate::stats::{ms, Distribution};

/// Most turns a conversation may have.
pub const MAX_TURNS: usize = 64;
/// Most measured conversations.
pub const MAX_CONVERSATIONS: usize = 1000;

/// What a conversation run needs.
#[derive(Debug, Clone)]
pub struct ConversationConfig {
    pub turns: usize,
    pub conversations: usize,
    pub jpeg: Vec<u8>,
    pub prompt: String,
    pub model: String,
    pub max_tokens: u32,
    pub cpu_pids: Vec<u32>,
    pub request_timeout: Duration,
    /// Where the gateway's tensor bytes are read after each turn.
    pub tensor_bytes: Option<MetricsUrl>,
}

/// The bodies of one conversation's turns.
struct Screenshots {
    /// base64 of the JPEG after its SOI (shared by every screenshot).
    rest: String,
    /// Distinguishes this run's screenshots from other runs'.
    nonce: u64,
}

impl Screenshots {
    fn new(jpeg: &[u8], nonce: u64) -> anyhow::Result<Screenshots> {
        if jpeg.len() < 4 || jpeg[..2] != [0xFF, 0xD8] {
            bail!("the image is not a JPEG (no SOI marker)");
        }
        Ok(Screenshots {
            rest: STANDARD.encode(&jpeg[2..]),
            nonce,
        })
    }

    /// The data URL of screenshot `turn` (from 1) of conversation `conv`.
    fn url(&self, conv: usize, turn: usize) -> String {
        let counter = (conv * MAX_TURNS + turn) as u64;
        let head = STANDARD.encode(image::prefix(self.nonce, counter));
        format!("data:image/jpeg;base64,{head}{}", self.rest)
    }
}

/// The chat body of turn `turn` (from 1): the whole history so far.
fn turn_body(cfg: &ConversationConfig, shots: &Screenshots, conv: usize, turn: usize) -> Bytes {
    let mut messages: Vec<Value> = Vec::with_capacity(2 * turn);
    for k in 1..=turn {
        messages.push(json!({
            "role": "user",
            "content": [
                {"type": "text", "text": format!("Step {k}. {}", cfg.prompt)},
                {"type": "image_url", "image_url": {"url": shots.url(conv, k)}},
            ],
        }));
        if k < turn {
            messages.push(json!({
                "role": "assistant",
                "content": format!("I looked at screenshot {k}."),
            }));
        }
    }
    let body = json!({
        "model": cfg.model,
        "messages": messages,
        "max_tokens": cfg.max_tokens,
        "ignore_eos": true,
        "stream": true,
    });
    Bytes::from(body.to_string())
}

/// One turn, over all measured conversations.
#[derive(Debug, Serialize)]
pub struct TurnReport {
    pub turn: usize,
    /// Images in the request (= the turn).
    pub images: usize,
    /// `null` when no conversation was measured.
    pub ttft: Option<Distribution>,
    pub e2e: Option<Distribution>,
    /// Mean CPU milliseconds of each watched process for this turn, in
    /// `--cpu-pid` order.
    pub cpu_ms: Vec<f64>,
    /// Mean MB of pixel tensors the gateway sent for this turn (with
    /// `--tensor-bytes-metrics`).
    pub tensor_mb: Option<f64>,
}

/// The conversation run's report.
#[derive(Debug, Serialize)]
pub struct ConversationReport {
    pub mode: &'static str,
    pub target: String,
    pub turns: usize,
    pub conversations: usize,
    pub image_bytes: usize,
    /// `name (pid)` of each watched process.
    pub processes: Vec<String>,
    pub per_turn: Vec<TurnReport>,
}

impl ConversationReport {
    /// A Markdown table: one row per turn.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{} conversations of {} turns against {} (one request in flight)\n\n",
            self.conversations, self.turns, self.target
        );
        out.push_str("| turn | images | TTFT p50 ms | TTFT max ms | e2e p50 ms |");
        let with_bytes = self.per_turn.iter().any(|t| t.tensor_mb.is_some());
        if with_bytes {
            out.push_str(" tensor MB sent |");
        }
        for p in &self.processes {
            out.push_str(&format!(" CPU ms {p} |"));
        }
        out.push('\n');
        let columns = 5 + usize::from(with_bytes) + self.processes.len();
        out.push_str(&"|---".repeat(columns));
        out.push_str("|\n");
        for t in &self.per_turn {
            let (p50, max) = t.ttft.as_ref().map_or((0.0, 0.0), |d| (d.p50_ms, d.max_ms));
            let e2e = t.e2e.as_ref().map_or(0.0, |d| d.p50_ms);
            out.push_str(&format!(
                "| {} | {} | {p50:.1} | {max:.1} | {e2e:.1} |",
                t.turn, t.images
            ));
            if let Some(mb) = t.tensor_mb {
                out.push_str(&format!(" {mb:.1} |"));
            }
            for ms in &t.cpu_ms {
                out.push_str(&format!(" {ms:.1} |"));
            }
            out.push('\n');
        }
        out
    }
}

/// Per turn: TTFTs, end-to-end latencies and CPU sums.
struct TurnAcc {
    ttft: Vec<Duration>,
    e2e: Vec<Duration>,
    cpu: Vec<Duration>,
    /// Tensor bytes the gateway sent, summed over the conversations.
    bytes: f64,
}

/// Runs the warm-up conversation and the measured ones.
pub async fn run(
    cfg: &ConversationConfig,
    addr: std::net::SocketAddr,
    authority: &str,
) -> anyhow::Result<ConversationReport> {
    let shots = Screenshots::new(&cfg.jpeg, image::run_nonce())?;
    let procs: Vec<Proc> = cfg.cpu_pids.iter().map(|&p| Proc::Pid(p)).collect();
    let ticks = cpu::clock_ticks_per_sec();
    let mut client = http::OneByOne::new(addr, authority.to_owned());
    let mut acc: Vec<TurnAcc> = (0..cfg.turns)
        .map(|_| TurnAcc {
            ttft: Vec::new(),
            e2e: Vec::new(),
            cpu: vec![Duration::ZERO; procs.len()],
            bytes: 0.0,
        })
        .collect();
    for conv in 0..=cfg.conversations {
        for turn in 1..=cfg.turns {
            let body = ChatBody::single(turn_body(cfg, &shots, conv, turn));
            let bytes_before = tensor_bytes(cfg).await?;
            let before = cpu_now(&procs, ticks)?;
            let start = Instant::now();
            let timing = tokio::time::timeout(cfg.request_timeout, client.send(body, start))
                .await
                .map_err(|_| anyhow::anyhow!("turn {turn} took longer than the request timeout"))?
                .with_context(|| format!("conversation {conv}, turn {turn}"))?;
            let e2e = start.elapsed();
            let after = cpu_now(&procs, ticks)?;
            let bytes_after = tensor_bytes(cfg).await?;
            if conv == 0 {
                continue; // the warm-up conversation
            }
            let slot = &mut acc[turn - 1];
            let first = timing.tokens.first.context("the stream carried no token")?;
            slot.ttft.push(first);
            slot.e2e.push(e2e);
            slot.bytes += bytes_after - bytes_before;
            for (sum, (a, b)) in slot.cpu.iter_mut().zip(after.iter().zip(&before)) {
                *sum += a.saturating_sub(*b);
            }
        }
    }
    Ok(report(cfg, &procs, acc, authority))
}

fn report(
    cfg: &ConversationConfig,
    procs: &[Proc],
    acc: Vec<TurnAcc>,
    authority: &str,
) -> ConversationReport {
    let n = cfg.conversations.max(1) as f64;
    let per_turn = acc
        .into_iter()
        .enumerate()
        .map(|(i, a)| TurnReport {
            turn: i + 1,
            images: i + 1,
            ttft: Distribution::of(a.ttft),
            e2e: Distribution::of(a.e2e),
            cpu_ms: a.cpu.iter().map(|d| ms(*d) / n).collect(),
            tensor_mb: cfg.tensor_bytes.as_ref().map(|_| a.bytes / n / 1e6),
        })
        .collect();
    ConversationReport {
        mode: "conversation",
        target: authority.to_owned(),
        turns: cfg.turns,
        conversations: cfg.conversations,
        image_bytes: cfg.jpeg.len(),
        processes: procs
            .iter()
            .zip(&cfg.cpu_pids)
            .map(|(p, pid)| format!("{} ({pid})", p.name()))
            .collect(),
        per_turn,
    }
}

/// The gateway's tensor bytes sent so far (0 without `--tensor-bytes-metrics`).
async fn tensor_bytes(cfg: &ConversationConfig) -> anyhow::Result<f64> {
    match &cfg.tensor_bytes {
        Some(url) => url.counter(TENSOR_BYTES).await,
        None => Ok(0.0),
    }
}

fn cpu_now(procs: &[Proc], ticks: u64) -> anyhow::Result<Vec<Duration>> {
    procs.iter().map(|&p| cpu::cpu_time(p, ticks)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ConversationConfig {
        ConversationConfig {
            turns: 3,
            conversations: 2,
            jpeg: vec![0xFF, 0xD8, 0xFF, 0xD9, 1, 2, 3],
            prompt: "What changed?".into(),
            model: "tiny".into(),
            max_tokens: 4,
            cpu_pids: vec![],
            request_timeout: Duration::from_secs(1),
            tensor_bytes: None,
        }
    }

    fn urls(body: &Bytes) -> Vec<String> {
        let v: Value = serde_json::from_slice(body).unwrap();
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| {
                m["content"][1]["image_url"]["url"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn a_turn_resends_the_history_with_one_new_screenshot() {
        let c = cfg();
        let shots = Screenshots::new(&c.jpeg, 7).unwrap();
        let t1 = turn_body(&c, &shots, 1, 1);
        let t3 = turn_body(&c, &shots, 1, 3);
        let v: Value = serde_json::from_slice(&t3).unwrap();
        let roles: Vec<&str> = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
        let (u1, u3) = (urls(&t1), urls(&t3));
        assert_eq!(u3.len(), 3);
        // Earlier screenshots are resent byte for byte; each turn's is new.
        assert_eq!(u1[0], u3[0]);
        assert_ne!(u3[0], u3[1]);
        assert_ne!(u3[1], u3[2]);
        // Another conversation has other screenshots.
        assert_ne!(urls(&turn_body(&c, &shots, 2, 1))[0], u1[0]);
    }

    #[test]
    fn screenshots_decode_to_the_same_jpeg_body() {
        let c = cfg();
        let shots = Screenshots::new(&c.jpeg, 9).unwrap();
        let url = shots.url(1, 2);
        let b64 = url.strip_prefix("data:image/jpeg;base64,").unwrap();
        let bytes = STANDARD.decode(b64).unwrap();
        assert_eq!(&bytes[..2], &[0xFF, 0xD8]);
        assert_eq!(&bytes[image::PREFIX_LEN..], &c.jpeg[2..]);
        assert!(Screenshots::new(b"GIF89a", 1).is_err());
    }

    #[test]
    fn the_table_has_a_row_per_turn_and_a_cpu_column_per_process() {
        let c = cfg();
        let acc = (0..3)
            .map(|i| TurnAcc {
                ttft: vec![Duration::from_millis(10 + i), Duration::from_millis(12)],
                e2e: vec![Duration::from_millis(20), Duration::from_millis(22)],
                cpu: vec![Duration::from_millis(30)],
                bytes: 3e6,
            })
            .collect();
        let mut r = report(&c, &[], acc, "127.0.0.1:1");
        r.processes = vec!["iris (1)".into()];
        assert_eq!(r.per_turn[2].images, 3);
        assert_eq!(r.per_turn[0].cpu_ms, vec![15.0]);
        assert_eq!(r.per_turn[0].tensor_mb, None, "not asked for");
        let table = r.table();
        assert_eq!(table.lines().filter(|l| l.starts_with("| ")).count(), 4);
        assert!(table.contains("CPU ms iris (1)"), "{table}");
        assert!(!table.contains("tensor MB"), "{table}");
    }

    /// With the gateway's page to read, each turn's mean tensor MB.
    #[test]
    fn tensor_bytes_are_a_column_when_read() {
        let c = ConversationConfig {
            tensor_bytes: Some(MetricsUrl::parse("http://127.0.0.1:1/metrics").unwrap()),
            ..cfg()
        };
        let acc = (0..2)
            .map(|i| TurnAcc {
                ttft: vec![Duration::from_millis(10)],
                e2e: vec![Duration::from_millis(20)],
                cpu: vec![],
                bytes: 2e6 * (i + 1) as f64,
            })
            .collect();
        let r = report(&c, &[], acc, "127.0.0.1:1");
        assert_eq!(
            r.per_turn[1].tensor_mb,
            Some(2.0),
            "4 MB over 2 conversations"
        );
        let table = r.table();
        assert!(table.contains("| tensor MB sent |"), "{table}");
        assert!(table.contains("| 1.0 |"), "{table}");
    }
}
