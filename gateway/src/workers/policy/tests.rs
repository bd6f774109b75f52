//! The policies' picks: load-blind turns, load-aware picks, and the
//! encoders' content-hash affinity with bounded load.

use std::collections::HashMap;
use std::time::Duration;

use iris_fingerprint::mix64;

use super::*;
use crate::workers::affinity::ImageCost;
use crate::workers::{Role, WorkerUrl};

fn workers_on(host: &str, n: u16, role: Role) -> Vec<Arc<Worker>> {
    (1..=n)
        .map(|p| {
            let url = match host {
                "local" => WorkerUrl::parse(&format!("grpc://127.0.0.1:{p}")).unwrap(),
                _ => WorkerUrl::parse(&format!("grpc://10.0.0.{p}:7000")).unwrap(),
            };
            Worker::new(url, role, Duration::from_secs(1)).unwrap()
        })
        .collect()
}

/// Aggregated workers on 127.0.0.1, ports 1..=n.
fn local_workers(n: u16) -> Vec<Arc<Worker>> {
    workers_on("local", n, Role::Aggregated)
}

/// Encoders on 10.0.0.1..=n.
fn workers(n: u16) -> Vec<Arc<Worker>> {
    workers_on("10.0.0", n, Role::Encode)
}

fn host(w: &Worker) -> String {
    w.url.host.clone()
}

/// A request's pick, loads counted in requests.
fn request(p: &dyn Policy, ws: &[Arc<Worker>]) -> Option<Arc<Worker>> {
    let key = RouteKey {
        cost: 1,
        ..RouteKey::default()
    };
    pick_each(p, ws, &[key], |w| w.in_flight() as u64)?.pop()
}

fn encoder(kind: PolicyKind, load_factor: f64, max_load: u64) -> Box<dyn Policy> {
    kind.build(
        LoadBounds {
            load_factor,
            max_load,
        },
        &Default::default(),
    )
}

/// Encoders for each image, loads counted in patches.
fn pick_all(
    p: &dyn Policy,
    ws: &[Arc<Worker>],
    images: impl IntoIterator<Item = ImageCost>,
) -> Option<Vec<Arc<Worker>>> {
    let images: Vec<ImageCost> = images.into_iter().collect();
    let items: Vec<ItemKey> = images.iter().map(|i| i.item_key()).collect();
    let keys: Vec<RouteKey<'_>> = images
        .iter()
        .zip(&items)
        .map(|(image, item)| image.route_key(item))
        .collect();
    pick_each(p, ws, &keys, |w| w.patches_in_flight())
}

fn pick(p: &dyn Policy, ws: &[Arc<Worker>], image: ImageCost) -> Option<Arc<Worker>> {
    pick_all(p, ws, [image])?.pop()
}

/// An image of one patch: loads count images, as before patches.
fn unit(key: u64) -> ImageCost {
    ImageCost { key, patches: 1 }
}

#[tokio::test]
async fn round_robin_cycles() {
    let ws = local_workers(3);
    let p = PolicyKind::RoundRobin.build(LoadBounds::default(), &Default::default());
    let ports: Vec<u16> = (0..6)
        .map(|_| request(&*p, &ws).unwrap().url.port)
        .collect();
    assert_eq!(ports, vec![1, 2, 3, 1, 2, 3]);
    assert!(request(&*p, &[]).is_none());
}

#[tokio::test]
async fn least_load_prefers_idle() {
    let ws = local_workers(3);
    let _busy: Vec<_> = (0..3).map(|_| ws[0].start_request()).collect();
    let _one = ws[1].start_request();
    let p = PolicyKind::LeastLoad.build(LoadBounds::default(), &Default::default());
    for _ in 0..5 {
        assert_eq!(request(&*p, &ws).unwrap().url.port, 3);
    }
}

#[tokio::test]
async fn power_of_two_never_picks_the_busiest_of_two() {
    let ws = local_workers(2);
    let _busy = ws[0].start_request();
    let p = PolicyKind::PowerOfTwo.build(LoadBounds::default(), &Default::default());
    for _ in 0..50 {
        assert_eq!(request(&*p, &ws).unwrap().url.port, 2);
    }
}

#[tokio::test]
async fn random_covers_all() {
    let ws = local_workers(3);
    let p = PolicyKind::Random.build(LoadBounds::default(), &Default::default());
    let mut seen = std::collections::HashSet::new();
    for _ in 0..300 {
        seen.insert(request(&*p, &ws).unwrap().url.port);
    }
    assert_eq!(seen.len(), 3);
}

#[tokio::test]
async fn an_image_keeps_its_encoder_and_images_spread() {
    let ws = workers(4);
    let p = encoder(PolicyKind::ConsistentHashing, 1.25, 0);
    let mut per_worker: HashMap<String, usize> = HashMap::new();
    for key in 0..4000u64 {
        let key = mix64(key);
        let first = pick(&*p, &ws, unit(key)).unwrap();
        assert_eq!(
            host(&first),
            host(&pick(&*p, &ws, unit(key)).unwrap()),
            "stable"
        );
        *per_worker.entry(host(&first)).or_default() += 1;
    }
    assert_eq!(per_worker.len(), 4);
    for (w, count) in per_worker {
        assert!((800..1200).contains(&count), "{w} got {count} of 4000");
    }
}

#[tokio::test]
async fn removing_a_worker_moves_only_its_images() {
    let ws = workers(4);
    let p = encoder(PolicyKind::ConsistentHashing, 1.25, 0);
    let fewer: Vec<_> = ws[..3].to_vec();
    for key in (0..2000u64).map(mix64) {
        let before = host(&pick(&*p, &ws, unit(key)).unwrap());
        let after = host(&pick(&*p, &fewer, unit(key)).unwrap());
        if before != host(&ws[3]) {
            assert_eq!(before, after, "key {key} moved without cause");
        }
    }
}

#[tokio::test]
async fn a_hot_image_spills_over_instead_of_overloading_one_encoder() {
    let ws = workers(4);
    let p = encoder(PolicyKind::ConsistentHashing, 1.25, 0);
    let key = 42;
    let home = host(&pick(&*p, &ws, unit(key)).unwrap());
    // 40 concurrent requests for the same image.
    let guards: Vec<_> = (0..40)
        .map(|_| pick(&*p, &ws, unit(key)).unwrap().start_encode(1))
        .collect();
    let loads: Vec<usize> = ws.iter().map(|w| w.in_flight()).collect();
    let max = *loads.iter().max().unwrap();
    assert!(
        max <= 13,
        "bounded load: ceil(1.25 × 40 / 4) = 13, loads {loads:?}"
    );
    assert!(
        loads.iter().all(|&l| l > 0),
        "spilled to every worker: {loads:?}"
    );
    drop(guards);
    assert_eq!(
        host(&pick(&*p, &ws, unit(key)).unwrap()),
        home,
        "back home when idle"
    );
}

#[tokio::test]
async fn copies_of_a_hot_image_in_one_request_spread_too() {
    let ws = workers(4);
    let p = encoder(PolicyKind::ConsistentHashing, 1.25, 0);
    // One request carrying the same image 40 times, nothing in flight.
    let picks = pick_all(&*p, &ws, [unit(42); 40]).unwrap();
    assert_eq!(picks.len(), 40);
    let mut per_worker: HashMap<String, usize> = HashMap::new();
    for w in &picks {
        *per_worker.entry(host(w)).or_default() += 1;
    }
    let max = per_worker.values().copied().max().unwrap();
    assert!(max <= 13, "bounded load within the request: {per_worker:?}");
    assert_eq!(
        per_worker.len(),
        4,
        "spilled to every worker: {per_worker:?}"
    );
    let home = host(&pick(&*p, &ws, unit(42)).unwrap());
    assert_eq!(host(&picks[0]), home, "the first copy goes home");
}

#[tokio::test]
async fn distinct_images_of_one_request_keep_their_homes() {
    let ws = workers(4);
    let p = encoder(PolicyKind::ConsistentHashing, 1.25, 0);
    // Two images whose homes differ: the request changes nothing.
    let a = 1u64;
    let home_a = host(&pick(&*p, &ws, unit(a)).unwrap());
    let b = (2..)
        .map(mix64)
        .find(|&k| host(&pick(&*p, &ws, unit(k)).unwrap()) != home_a)
        .unwrap();
    let home_b = host(&pick(&*p, &ws, unit(b)).unwrap());
    let picks: Vec<String> = pick_all(&*p, &ws, [unit(a), unit(b)])
        .unwrap()
        .iter()
        .map(|w| host(w))
        .collect();
    assert_eq!(picks, vec![home_a, home_b]);
}

#[tokio::test]
async fn least_load_counts_the_images_already_assigned() {
    let ws = workers(3);
    let p = encoder(PolicyKind::LeastLoad, 1.25, 0);
    let _busy = [
        ws[0].start_encode(1),
        ws[0].start_encode(1),
        ws[1].start_encode(1),
    ];
    // In flight 2, 1, 0: three images even the loads out at 2, 2, 2
    // instead of all going to the idle worker.
    let mut picks: Vec<String> = pick_all(&*p, &ws, [unit(7); 3])
        .unwrap()
        .iter()
        .map(|w| host(w))
        .collect();
    picks.sort();
    assert_eq!(picks, vec!["10.0.0.2", "10.0.0.3", "10.0.0.3"]);
    assert!(pick_all(&*p, &[], [unit(7)]).is_none());
}

#[tokio::test]
async fn other_policies_ignore_the_key() {
    let ws = workers(3);
    let p = encoder(PolicyKind::RoundRobin, 1.25, 0);
    let hosts: Vec<String> = (0..3)
        .map(|_| host(&pick(&*p, &ws, unit(7)).unwrap()))
        .collect();
    assert_eq!(hosts, vec!["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    assert!(pick(&*p, &[], unit(7)).is_none());
}

/// Patches of a 3840×2160 image on Qwen2-VL (274 × 154), a 1080p one
/// (138 × 78) and a 56×56 thumbnail (4 × 4).
const FOUR_K: u64 = 42_196;
const P1080: u64 = 10_764;
const THUMB: u64 = 16;
const BOUND: u64 = 131_072;

fn image(key: u64, patches: u64) -> ImageCost {
    ImageCost { key, patches }
}

/// Hot 4K images and many thumbnails arriving while earlier ones are
/// still in flight (the oldest finish first, keeping at most half the
/// encoders' total bound in flight, as admission would): after every
/// pick no encoder holds more than the bound — with the default load
/// factor and with one so loose that only the absolute bound holds.
#[tokio::test]
async fn mixed_4k_and_thumbnail_loads_keep_every_encoder_within_the_bound() {
    for factor in [1.25, 3.0] {
        let ws = workers(4);
        let p = encoder(PolicyKind::ConsistentHashing, factor, BOUND);
        let mut in_flight = std::collections::VecDeque::new();
        let mut total = 0u64;
        for step in 0..3000u64 {
            let r = mix64(step);
            let img = if r.is_multiple_of(4) {
                image(mix64(1000 + r % 8), FOUR_K)
            } else {
                image(mix64(5000 + r % 64), THUMB)
            };
            while total + img.patches > 2 * BOUND {
                let (guard, patches) = in_flight.pop_front().unwrap();
                total -= patches;
                drop(guard);
            }
            let w = pick(&*p, &ws, img).unwrap();
            in_flight.push_back((w.start_encode(img.patches), img.patches));
            total += img.patches;
            let loads: Vec<u64> = ws.iter().map(|w| w.patches_in_flight()).collect();
            assert!(
                loads.iter().all(|&l| l <= BOUND),
                "factor {factor}, step {step}: loads {loads:?} over {BOUND}"
            );
        }
    }
}

/// A repeated 4K image goes to the encoder that has it while that one
/// is within its fair share and the bound — small images around it do
/// not move it — leaves only when the bound would be passed, and
/// comes back when the load is gone. A thumbnail with the same home
/// still fits where the 4K image does not: cost, not count.
#[tokio::test]
async fn repeated_images_keep_their_encoder_unless_it_is_over_the_bound() {
    let ws = workers(4);
    let p = encoder(PolicyKind::ConsistentHashing, 1.25, BOUND);
    let big = image(mix64(77), FOUR_K);
    let home = pick(&*p, &ws, big).unwrap();
    let small = (0..)
        .map(|k| image(mix64(9000 + k), THUMB))
        .find(|&t| host(&pick(&*p, &ws, t).unwrap()) == host(&home))
        .unwrap();
    // Every encoder busy with a 1080p image and a few thumbnails.
    let _background: Vec<_> = ws
        .iter()
        .flat_map(|w| {
            let mut g = vec![w.start_encode(P1080)];
            g.extend((0..5).map(|_| w.start_encode(THUMB)));
            g
        })
        .collect();
    for _ in 0..3 {
        assert_eq!(host(&pick(&*p, &ws, big).unwrap()), host(&home));
        assert_eq!(host(&pick(&*p, &ws, small).unwrap()), host(&home));
    }
    // Two 4K images in flight at home: one more would pass the bound
    // (10 844 + 3 × 42 196 > 131 072) — it goes elsewhere; the
    // thumbnail still fits.
    let loaded = [home.start_encode(FOUR_K), home.start_encode(FOUR_K)];
    let p_loose = encoder(PolicyKind::ConsistentHashing, 100.0, BOUND);
    let elsewhere = pick(&*p_loose, &ws, big).unwrap();
    assert_ne!(host(&elsewhere), host(&home));
    assert!(elsewhere.patches_in_flight() + FOUR_K <= BOUND);
    assert_eq!(host(&pick(&*p_loose, &ws, small).unwrap()), host(&home));
    drop(loaded);
    assert_eq!(
        host(&pick(&*p, &ws, big).unwrap()),
        host(&home),
        "back home"
    );
}

#[tokio::test]
async fn least_load_weighs_patches_not_images() {
    let ws = workers(3);
    let p = encoder(PolicyKind::LeastLoad, 1.25, BOUND);
    let _a = ws[0].start_encode(FOUR_K);
    let _b: Vec<_> = (0..8).map(|_| ws[1].start_encode(THUMB)).collect();
    let _c = ws[2].start_encode(P1080);
    let pick = pick(&*p, &ws, image(1, P1080)).unwrap();
    assert_eq!(host(&pick), "10.0.0.2", "eight thumbnails weigh least");
}
