//! Tenants' limits shared through a real Redis server
//! (`--rate-limit-store redis://…`), started by the test on a free port
//! (redis-server must be installed: the test fails without it). Two
//! gateway replicas enforce one tenant's requests per minute jointly and
//! its concurrency limit with leases; with Redis killed both keep serving
//! under their own limits and count the failures; with Redis back the
//! limits are shared again.

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use iris_engine::Role;
use iris_gateway::RunningGateway;
use serde_json::Value;

/// A redis-server on `port`, killed when dropped.
struct Redis(Child);

impl Redis {
    /// Starts redis-server on `port` (nothing kept on disk) and waits
    /// until it answers.
    async fn start(port: u16) -> Redis {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed for this test (scripts/prereqs redis-server)");
        let redis = Redis(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return redis;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server on port {port} never answered");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("addr").port()
}

fn tenant(name: &str, key: &str, extra: &str) -> String {
    use sha2::Digest;
    let hex: String = sha2::Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("[[tenants]]\nname = \"{name}\"\nkeys = [\"sha256:{hex}\"]\n{extra}\n\n")
}

/// POSTs a chat as `key`: the response, its body not read.
async fn post(gw: &RunningGateway, key: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url(gw, "/v1/chat/completions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("send")
}

/// POSTs a short chat as `key`: the status and the remaining-requests
/// header.
async fn chat(gw: &RunningGateway, key: &str, body: &Value) -> (u16, Option<String>) {
    let response = post(gw, key, body).await;
    let status = response.status().as_u16();
    let remaining = response
        .headers()
        .get("x-ratelimit-remaining-requests")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    drop(response.text().await);
    (status, remaining)
}

/// A metric's value in `gw`'s /metrics.
async fn metric(gw: &RunningGateway, name: &str) -> f64 {
    let text = metrics_text(gw).await;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in\n{text}"))
}

/// Waits until both replicas say the store is (or is not) connected.
async fn store_up(gws: &[&RunningGateway], up: bool) {
    let want = if up { 1.0 } else { 0.0 };
    for _ in 0..100 {
        let mut all = true;
        for gw in gws {
            all &= metric(gw, "iris_rate_limit_store_up").await == want;
        }
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the store never became {}", if up { "up" } else { "down" });
}

/// Waits, when less than 15 s of the current minute are left, for the
/// next one: the shared counters are one-minute windows.
async fn a_fresh_window() {
    let into = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        % 60;
    if into >= 45 {
        tokio::time::sleep(Duration::from_secs(61 - into)).await;
    }
}

/// The statuses of `n` chats sent alternately to each replica.
async fn alternate(gws: &[&RunningGateway], key: &str, body: &Value, n: usize) -> Vec<u16> {
    let mut statuses = Vec::with_capacity(n);
    for i in 0..n {
        statuses.push(chat(gws[i % gws.len()], key, body).await.0);
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_limits_through_redis_and_survive_its_loss() {
    let port = free_port();
    let redis = Redis::start(port).await;
    let model = tiny_model();
    // 50 ms a token: a 20-token stream runs a second.
    let engine = engine(&model, Role::Aggregated, 50_000).await;
    let keys = tempfile::NamedTempFile::new().expect("temp file");
    let text = format!(
        "{}{}",
        tenant("a", "sk-a", "requests_per_minute = 4"),
        tenant("one", "sk-one", "max_concurrent_requests = 1"),
    );
    std::fs::write(keys.path(), text).expect("write");
    let store = format!("redis://127.0.0.1:{port}");
    let path = keys.path().to_str().expect("UTF-8");
    let flags = ["--api-keys-file", path, "--rate-limit-store", &store];
    let gw1 = aggregated(&model, &[&engine], &flags).await;
    let gw2 = aggregated(&model, &[&engine], &flags).await;
    ready(&gw1).await;
    ready(&gw2).await;
    let both = [&gw1, &gw2];
    store_up(&both, true).await;
    let short = chat_body(&model.name, "hello", 1, false);

    // Shared: four a minute between the two replicas.
    a_fresh_window().await;
    let (status, remaining) = chat(&gw1, "sk-a", &short).await;
    assert_eq!((status, remaining.as_deref()), (200, Some("3")));
    let (status, remaining) = chat(&gw2, "sk-a", &short).await;
    assert_eq!(
        (status, remaining.as_deref()),
        (200, Some("2")),
        "one count for both"
    );
    assert_eq!(
        alternate(&both, "sk-a", &short, 4).await,
        [200, 200, 429, 429]
    );
    // The refusal says so in OpenAI's headers: when the shared window ends.
    let refused = post(&gw1, "sk-a", &short).await;
    assert_eq!(refused.status(), 429);
    let headers = refused.headers();
    assert_eq!(headers["x-ratelimit-limit-requests"], "4");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    assert!(headers.contains_key("x-ratelimit-reset-requests"));
    let retry: u64 = headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(
        metric(&gw1, "iris_rate_limit_store_errors_total").await,
        0.0
    );

    // One request at once, wherever it runs: a lease.
    let long = chat_body(&model.name, "hello", 20, true);
    let running = reqwest::Client::new()
        .post(url(&gw1, "/v1/chat/completions"))
        .bearer_auth("sk-one")
        .json(&long)
        .send()
        .await
        .expect("send");
    assert_eq!(running.status(), 200);
    assert_eq!(
        chat(&gw2, "sk-one", &short).await.0,
        429,
        "held on the other replica"
    );
    drop(running.text().await);
    let mut status = 0;
    for _ in 0..50 {
        status = chat(&gw2, "sk-one", &short).await.0;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200, "the lease is given back when the stream ends");

    // Redis gone: each replica holds the tenant to its own four a minute.
    drop(redis);
    for gw in both {
        let statuses = alternate(&[gw], "sk-a", &short, 5).await;
        assert_eq!(statuses, [200, 200, 200, 200, 429], "per replica");
        assert!(metric(gw, "iris_rate_limit_store_errors_total").await >= 1.0);
    }
    store_up(&both, false).await;

    // Redis back (empty): shared again.
    let _redis = Redis::start(port).await;
    store_up(&both, true).await;
    a_fresh_window().await;
    assert_eq!(
        alternate(&both, "sk-a", &short, 6).await,
        [200, 200, 200, 200, 429, 429]
    );
}
