//! The cache-aware picks: the holder of the longest prefix wins unless its
//! queued prefill outweighs what it saves; images match by content; two
//! gateways reading the same events agree; the approximate tree learns
//! from routing and forgets a removed worker.

use std::time::Duration;

use iris_kvindex::{prompt_blocks, prompt_blocks_under, prompt_keys, Event, StoredBlock};

use super::*;
use crate::workers::policy::{pick_each, ItemKey, PolicyKind};
use crate::workers::{Role, WorkerUrl};

const BLOCK: usize = 16;

fn workers(n: u16) -> Vec<Arc<Worker>> {
    (1..=n)
        .map(|p| {
            let url = WorkerUrl::parse(&format!("grpc://127.0.0.1:{p}")).unwrap();
            Worker::new(url, Role::Aggregated, Duration::from_secs(1)).unwrap()
        })
        .collect()
}

fn name(w: &Worker) -> String {
    w.url.to_string()
}

/// `n` tokens starting at `first`.
fn prompt(first: u32, n: usize) -> Vec<u32> {
    (first..first + n as u32).collect()
}

/// `worker`'s event storing the blocks of `tokens` (with `items`).
fn stored(tokens: &[u32], items: &[RequestItem]) -> Event {
    let blocks = prompt_blocks(BLOCK, tokens, items)
        .into_iter()
        .map(|b| StoredBlock {
            engine_hash: b.key as i64,
            token_ids: b.token_ids,
            items: b.items,
        })
        .collect();
    Event::Stored {
        parent: None,
        blocks,
        lora: None,
    }
}

fn key<'a>(tokens: &'a [u32], items: &'a [ItemKey]) -> RouteKey<'a> {
    RouteKey {
        tokens,
        items,
        cost: 1,
        suspects: &[],
        adapter: 0,
    }
}

/// The route key of `tokens` (no items) run under the adapter `name`.
fn under_adapter<'a>(tokens: &'a [u32], name: &str) -> RouteKey<'a> {
    RouteKey {
        adapter: crate::workers::policy::adapter_tag(name),
        ..key(tokens, &[])
    }
}

fn pick(policy: &dyn Policy, ws: &[Arc<Worker>], key: &RouteKey<'_>) -> Arc<Worker> {
    pick_each(policy, ws, std::slice::from_ref(key), |w| {
        w.in_flight() as u64
    })
    .unwrap()
    .pop()
    .unwrap()
}

/// An image item over positions `span` with content hash `hash`.
fn image(hash: u8, span: std::ops::Range<u32>) -> ItemKey {
    let hash = bytes::Bytes::from(vec![hash; 32]);
    ItemKey {
        key: crate::workers::affinity::affinity_key(&hash),
        span,
        hash,
    }
}

/// `item` as a TokenSpeed worker's events name it.
fn event_item(item: &ItemKey) -> RequestItem {
    RequestItem {
        identifier: item_identifier(None, &item.hash),
        span: item.span.clone(),
    }
}

#[tokio::test]
async fn the_holder_of_the_longest_prefix_wins() {
    let ws = workers(4);
    let caches = Arc::new(KvCaches::default());
    let system = prompt(1000, 20 * BLOCK);
    caches.apply_events(
        &name(&ws[2]),
        BLOCK,
        1,
        &[stored(&system[..10 * BLOCK], &[])],
    );
    caches.apply_events(&name(&ws[1]), BLOCK, 1, &[stored(&system, &[])]);
    let policy = CacheAware::auto(caches.clone());
    let mut request = system.clone();
    request.extend(prompt(5, 40));
    for _ in 0..8 {
        assert_eq!(pick(&policy, &ws, &key(&request, &[])).url, ws[1].url);
    }
    let picked = ws[1].clone();
    let prediction = policy.on_picked(&picked, &key(&request, &[])).unwrap();
    assert_eq!(prediction.cached_tokens(), (20 * BLOCK) as u64);
    assert_eq!(
        picked.prefill_tokens(),
        40,
        "the uncached tail is queued there"
    );
    drop(prediction);
    assert_eq!(picked.prefill_tokens(), 0);
}

#[tokio::test]
async fn a_saturated_holder_spills_to_the_next_cheapest() {
    let ws = workers(3);
    let caches = Arc::new(KvCaches::default());
    let system = prompt(1000, 8 * BLOCK);
    caches.apply_events(&name(&ws[0]), BLOCK, 1, &[stored(&system, &[])]);
    let policy = CacheAware::auto(caches);
    let mut request = system.clone();
    request.extend(prompt(5, 8));
    assert_eq!(pick(&policy, &ws, &key(&request, &[])).url, ws[0].url);
    // Queued prefill there now costs more than prefilling the whole
    // prompt elsewhere.
    let _queued = ws[0].start_prefill(request.len() as u64);
    let spilled = pick(&policy, &ws, &key(&request, &[]));
    assert_ne!(spilled.url, ws[0].url);
}

#[tokio::test]
async fn images_match_by_content_not_by_placeholder_ids() {
    let ws = workers(4);
    let caches = Arc::new(KvCaches::default());
    // Text, then 64 placeholder tokens of one image, then text.
    let mut tokens = prompt(1, BLOCK);
    tokens.extend(std::iter::repeat_n(7, 4 * BLOCK));
    tokens.extend(prompt(200, 2 * BLOCK));
    let span = BLOCK as u32..5 * BLOCK as u32;
    let seen = image(0xaa, span.clone());
    caches.apply_events(
        &name(&ws[3]),
        BLOCK,
        1,
        &[stored(&tokens, &[event_item(&seen)])],
    );
    let policy = CacheAware::auto(caches);
    let same = [seen.clone()];
    assert_eq!(pick(&policy, &ws, &key(&tokens, &same)).url, ws[3].url);
    let prediction = policy.on_picked(&ws[3], &key(&tokens, &same)).unwrap();
    assert_eq!(prediction.cached_tokens(), tokens.len() as u64);
    drop(prediction);
    // Another image of the same size: same ids, only the text before it
    // is held.
    let other = [image(0xbb, span)];
    let prediction = policy.on_picked(&ws[3], &key(&tokens, &other)).unwrap();
    assert_eq!(prediction.cached_tokens(), BLOCK as u64);
    // The same image after other text: its blocks chain from another
    // start, so nothing is held.
    let mut shifted = prompt(9000, BLOCK);
    shifted.extend_from_slice(&tokens[BLOCK..]);
    let prediction = policy.on_picked(&ws[3], &key(&shifted, &same)).unwrap();
    assert_eq!(prediction.cached_tokens(), 0);
}

#[tokio::test]
async fn gateways_reading_the_same_events_agree() {
    let ws = workers(4);
    let events = [
        (0, stored(&prompt(100, 4 * BLOCK), &[])),
        (1, stored(&prompt(500, 6 * BLOCK), &[])),
        (2, stored(&prompt(100, 2 * BLOCK), &[])),
    ];
    let gateway = || {
        let caches = Arc::new(KvCaches::default());
        for (w, event) in &events {
            caches.apply_events(&name(&ws[*w]), BLOCK, 1, std::slice::from_ref(event));
        }
        CacheAware::auto(caches)
    };
    let (a, b) = (gateway(), gateway());
    let mut homes = std::collections::HashSet::new();
    for first in (0..4000).step_by(97) {
        let request = prompt(first, 5 * BLOCK + 3);
        let (pa, pb) = (
            pick(&a, &ws, &key(&request, &[])),
            pick(&b, &ws, &key(&request, &[])),
        );
        assert_eq!(pa.url, pb.url, "prompt from {first}");
        homes.insert(pa.url.to_string());
    }
    assert_eq!(homes.len(), 4, "uncached prompts spread over every worker");
}

#[tokio::test]
async fn new_prefixes_are_placed_on_the_quietest_workers() {
    let ws = workers(4);
    let caches = Arc::new(KvCaches::default());
    for w in &ws {
        caches.apply_events(&name(w), BLOCK, 1, &[]);
    }
    let policy = CacheAware::auto(caches.clone());
    // Each new system prompt is followed by its conversation's turns
    // (routed, their blocks published) before the next one appears.
    let mut homes = Vec::new();
    for (i, turns) in [6, 1, 3, 2].into_iter().enumerate() {
        let system = prompt(10_000 * (i as u32 + 1), 8 * BLOCK);
        let home = pick(&policy, &ws, &key(&system, &[]));
        assert!(!homes.contains(&home.url.to_string()), "prefix {i}");
        caches.apply_events(&name(&home), BLOCK, 2, &[stored(&system, &[])]);
        for _ in 0..turns {
            assert_eq!(pick(&policy, &ws, &key(&system, &[])).url, home.url);
            policy.on_routed(&home, &key(&system, &[]));
        }
        homes.push(home.url.to_string());
    }
    // A fifth goes where the least traffic went (the second prefix's).
    let fifth = prompt(90_000, 8 * BLOCK);
    let quiet = pick(&policy, &ws, &key(&fifth, &[]));
    let second = pick(&policy, &ws, &key(&prompt(20_000, 8 * BLOCK), &[]));
    assert_eq!(quiet.url, second.url);
}

#[tokio::test]
async fn a_short_shared_start_does_not_pull_new_conversations_to_a_busy_worker() {
    let ws = workers(3);
    let caches = Arc::new(KvCaches::default());
    let system = prompt(1000, 6 * BLOCK);
    caches.apply_events(&name(&ws[0]), BLOCK, 1, &[stored(&system, &[])]);
    let policy = CacheAware::auto(caches);
    for _ in 0..5 {
        policy.on_routed(&ws[0], &key(&system, &[]));
    }
    // The system prompt, then a screenshot's worth of new tokens: the
    // 96 tokens held are within an eighth of the prompt.
    let mut screenshot = system.clone();
    screenshot.extend(prompt(50_000, 60 * BLOCK));
    assert_ne!(pick(&policy, &ws, &key(&screenshot, &[])).url, ws[0].url);
    // The same start with a short question: most of it is held there.
    let mut question = system.clone();
    question.extend(prompt(50_000, 8));
    assert_eq!(pick(&policy, &ws, &key(&question, &[])).url, ws[0].url);
    assert_eq!(tie_slack(100), MIN_MATCH_TOKENS);
    assert_eq!(tie_slack(8000), 1000);
}

#[test]
fn recent_counts_halve_every_half_life() {
    let start = Instant::now();
    let mut recent = Recent::default();
    assert_eq!(recent.at(start), 0.0);
    recent.add_one(start);
    recent.add_one(start);
    let later = start + RECENT_HALF_LIFE;
    assert!((recent.at(later) - 1.0).abs() < 1e-9);
    recent.add_one(later);
    assert!((recent.at(later + RECENT_HALF_LIFE) - 1.0).abs() < 1e-9);
    assert_eq!(recent.millis(later), 2000);
}

#[tokio::test]
async fn without_events_cache_aware_learns_from_its_routing_and_auto_does_not() {
    let ws = workers(4);
    let caches = Arc::new(KvCaches::default());
    let learned = CacheAware::new(caches.clone());
    let auto = CacheAware::auto(caches);
    let request = prompt(300, 12 * BLOCK);
    let key = key(&request, &[]);
    assert!(
        auto.on_picked(&ws[0], &key).is_none(),
        "auto predicts nothing without events"
    );
    // Sent to worker 2 (say, by an earlier pick).
    learned.on_routed(&ws[2], &key);
    for _ in 0..8 {
        assert_eq!(pick(&learned, &ws, &key).url, ws[2].url);
    }
    let prediction = learned.on_picked(&ws[2], &key).unwrap();
    assert_eq!(prediction.cached_tokens(), (12 * BLOCK) as u64);
    drop(prediction);
    learned.on_removed(&ws[2]);
    let prediction = learned.on_picked(&ws[2], &key).unwrap();
    assert_eq!(prediction.cached_tokens(), 0, "forgotten with the worker");
}

#[test]
fn the_approximate_tree_is_bounded_and_evicts_a_prompt_tail_first() {
    let mut tree = Approximate::new(4);
    tree.insert(1, &[10, 11, 12]);
    tree.insert(2, &[20, 21]);
    assert_eq!(tree.matched(2, &[20, 21]), 2);
    assert_eq!(
        tree.matched(1, &[10, 11, 12]),
        2,
        "worker 1's tail went first"
    );
    tree.insert(3, &[30]);
    assert_eq!(tree.matched(1, &[10, 11, 12]), 1);
    assert_eq!(tree.matched(3, &[30]), 1);
}

#[test]
fn vllm_workers_name_items_by_their_mm_hash() {
    let hash = [0x11u8; 32];
    let tokenspeed = item_identifier(Some(Backend::TokenSpeed), &hash);
    assert_eq!(tokenspeed, "1111111111111111");
    let vllm = item_identifier(Some(Backend::Vllm), &hash);
    let fp = iris_fingerprint::fingerprint(hash_hex(&hash).as_bytes());
    assert_eq!(vllm, format!("{:016x}", le_key(&fp)));
    assert_ne!(tokenspeed, vllm);
}

#[test]
fn cache_aware_is_for_pools_that_prefill() {
    for kind in [PolicyKind::CacheAware, PolicyKind::Auto] {
        assert!(kind.serves(Role::Aggregated) && kind.serves(Role::Prefill));
        assert!(!kind.serves(Role::Decode) && !kind.serves(Role::Encode));
        assert_eq!(kind.for_role(Role::Decode), PolicyKind::PowerOfTwo);
        assert_eq!(kind.for_role(Role::Prefill), kind);
    }
}

#[tokio::test]
async fn a_prefix_under_one_adapter_is_not_another_adapters() {
    let ws = workers(2);
    let learned = CacheAware::new(Arc::new(KvCaches::default()));
    let request = prompt(700, 12 * BLOCK);
    let base = key(&request, &[]);
    let sql = under_adapter(&request, "sql");
    let chat = under_adapter(&request, "chat");
    assert_ne!(sql.adapter, chat.adapter);
    assert_eq!(crate::workers::policy::adapter_tag(""), 0);
    // The base model's keys are the plain prompt keys; each adapter's differ.
    let plain = prompt_keys(BLOCK, &request, &[]);
    assert_eq!(block_keys(BLOCK, None, &base), plain);
    let (sql_keys, chat_keys) = (
        block_keys(BLOCK, None, &sql),
        block_keys(BLOCK, None, &chat),
    );
    assert!(sql_keys
        .iter()
        .all(|k| !plain.contains(k) && !chat_keys.contains(k)));
    // What ran under `sql` on worker 1 is a prefix there for `sql` only.
    learned.on_routed(&ws[1], &sql);
    let cached = |key: &RouteKey<'_>| learned.on_picked(&ws[1], key).unwrap().cached_tokens();
    assert_eq!(cached(&sql), (12 * BLOCK) as u64);
    assert_eq!(cached(&chat), 0);
    assert_eq!(cached(&base), 0);
    for _ in 0..4 {
        assert_eq!(pick(&learned, &ws, &sql).url, ws[1].url);
    }
}

#[tokio::test]
async fn events_of_blocks_stored_under_an_adapter_serve_that_adapter() {
    let ws = workers(3);
    let caches = Arc::new(KvCaches::default());
    let request = prompt(900, 10 * BLOCK);
    // Worker 2 ran the prompt under `sql`: its blocks hang from the root.
    let blocks = prompt_blocks_under(BLOCK, &request, &[], Some("sql"))
        .into_iter()
        .map(|b| StoredBlock {
            engine_hash: b.key as i64,
            token_ids: b.token_ids,
            items: b.items,
        })
        .collect();
    let event = Event::Stored {
        parent: None,
        blocks,
        lora: Some("sql".into()),
    };
    caches.apply_events(&name(&ws[2]), BLOCK, 1, &[event]);
    let policy = CacheAware::auto(caches);
    let sql = under_adapter(&request, "sql");
    let chat = under_adapter(&request, "chat");
    for _ in 0..4 {
        assert_eq!(pick(&policy, &ws, &sql).url, ws[2].url);
    }
    let cached = |key: &RouteKey<'_>| policy.on_picked(&ws[2], key).unwrap().cached_tokens();
    assert_eq!(cached(&sql), (10 * BLOCK) as u64);
    assert_eq!(cached(&chat), 0);
    assert_eq!(cached(&key(&request, &[])), 0, "nor the base model's");
}
