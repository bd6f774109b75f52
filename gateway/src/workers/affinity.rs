//! Choosing an encode worker for each image of a request (`--encode-policy`).
//!
//! Load is counted in **patches in flight**, not images: an image costs its
//! patch count (t·h·w of its grid), so a 4K image weighs ≈ 4× a 1080p one
//! and a thumbnail almost nothing.
//!
//! The default, `consistent_hashing`, sends an image to the same encoder
//! every time (so the encoder's embedding cache hits) without letting a hot
//! image overload that encoder: rendezvous hashing (each worker scores the
//! content hash; the highest score wins, so adding or removing a worker
//! moves only the images that scored highest on it) with bounded loads —
//! a worker is skipped while its patches in flight plus the image's would
//! exceed `load_factor` × the mean (the image included) or the absolute
//! bound (`--encode-max-in-flight-patches`), and the image goes to the next
//! worker in its score order; an idle worker always qualifies, so an image
//! larger than the bounds still has a home. When no worker qualifies, the
//! least loaded one gets it (admission then makes it wait for room).
//! Images assigned earlier in the same request count as load too, so one
//! request carrying many copies of a hot image spreads them.

use std::sync::Arc;

use clap::ValueEnum;
use iris_proto::scheduler::MultimodalItem;
use iris_proto::tensor::read_int64;

use super::policy::{Policy, PolicyKind};
use super::worker::Worker;

/// `--encode-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EncodePolicyKind {
    /// Content-hash affinity with bounded load (default).
    #[value(name = "consistent_hashing", alias = "consistent-hashing")]
    ConsistentHashing,
    #[value(name = "round_robin", alias = "round-robin")]
    RoundRobin,
    #[value(name = "random")]
    Random,
    #[value(name = "least_load", alias = "least-load")]
    LeastLoad,
}

/// One image to place: its affinity key and its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageCost {
    /// The content hash folded by [`affinity_key`].
    pub key: u64,
    /// Patches (at least 1).
    pub patches: u64,
}

impl ImageCost {
    /// The key and patch count of an item the gateway built.
    pub fn of(item: &MultimodalItem) -> ImageCost {
        ImageCost {
            key: affinity_key(&item.content_hash),
            patches: item_patches(item),
        }
    }
}

/// An item's patch count: the product of its `image_grid_thw` (a video's
/// `video_grid_thw`), else the first dimension of its pixels
/// (`[patches, C·T·P·P]`), at least 1.
pub fn item_patches(item: &MultimodalItem) -> u64 {
    let grids = &item.model_specific_tensors;
    let from_grid = grids
        .get("image_grid_thw")
        .or_else(|| grids.get("video_grid_thw"))
        .and_then(read_int64)
        .filter(|thw| thw.len() == 3 && thw.iter().all(|&d| d > 0))
        .map(|thw| {
            thw.iter()
                .map(|&d| d as u64)
                .fold(1u64, u64::saturating_mul)
        });
    let from_shape = || {
        item.encoder_input
            .as_ref()
            .and_then(|t| t.shape.first())
            .map(|&p| u64::from(p))
    };
    from_grid.or_else(from_shape).unwrap_or(1).max(1)
}

/// An encode policy with its state.
pub struct EncodePolicy {
    kind: EncodePolicyKind,
    /// Round robin, random and least load reuse the generic policies.
    plain: Policy,
    load_factor: f64,
    /// Most patches in flight per encoder a pick may lead to (0: no bound).
    max_patches: u64,
}

impl EncodePolicy {
    /// `load_factor` (≥ 1) bounds a worker's load relative to the mean;
    /// `max_patches` bounds it absolutely (0: unbounded).
    pub fn new(kind: EncodePolicyKind, load_factor: f64, max_patches: u64) -> Self {
        let plain = match kind {
            EncodePolicyKind::RoundRobin => PolicyKind::RoundRobin,
            EncodePolicyKind::Random => PolicyKind::Random,
            EncodePolicyKind::LeastLoad | EncodePolicyKind::ConsistentHashing => {
                PolicyKind::LeastLoad
            }
        };
        EncodePolicy {
            kind,
            plain: Policy::new(plain),
            load_factor: if load_factor.is_finite() {
                load_factor.max(1.0)
            } else {
                1.25
            },
            max_patches,
        }
    }

    pub fn kind(&self) -> EncodePolicyKind {
        self.kind
    }

    /// Picks one of `candidates` for `image`.
    pub fn pick(&self, candidates: &[Arc<Worker>], image: ImageCost) -> Option<Arc<Worker>> {
        self.pick_all(candidates, [image])?.pop()
    }

    /// Picks an encoder for each image of one request, in order. Images
    /// assigned earlier in the request count as load on their encoder, so
    /// several copies of one hot image spread as they would across
    /// requests. `None` when there is no candidate.
    pub fn pick_all(
        &self,
        candidates: &[Arc<Worker>],
        images: impl IntoIterator<Item = ImageCost>,
    ) -> Option<Vec<Arc<Worker>>> {
        let mut assigned = vec![0u64; candidates.len()];
        images
            .into_iter()
            .map(|image| {
                let load = |i: usize| candidates[i].patches_in_flight() + assigned[i];
                let index = match self.kind {
                    EncodePolicyKind::ConsistentHashing => {
                        self.bounded_rendezvous(candidates, image, load)
                    }
                    _ => self
                        .plain
                        .pick_index(candidates.len(), |i| as_usize(load(i))),
                }?;
                assigned[index] += image.patches;
                candidates.get(index).cloned()
            })
            .collect()
    }

    /// The index of the highest-scoring candidate for `image` that
    /// [`fits`](Self::fits); the least loaded when none does.
    fn bounded_rendezvous(
        &self,
        candidates: &[Arc<Worker>],
        image: ImageCost,
        load: impl Fn(usize) -> u64,
    ) -> Option<usize> {
        let n = candidates.len();
        if n == 0 {
            return None;
        }
        let total: u64 = (0..n).map(&load).sum();
        let fair = self.load_factor * (total + image.patches) as f64 / n as f64;
        let mut ranked: Vec<(u64, usize)> = candidates
            .iter()
            .enumerate()
            .map(|(i, w)| (score(image.key, &w.url.to_string()), i))
            .collect();
        ranked.sort_unstable_by_key(|(score, _)| std::cmp::Reverse(*score));
        ranked
            .iter()
            .map(|(_, i)| *i)
            .find(|&i| self.fits(load(i), image.patches, fair))
            .or_else(|| self.plain.pick_index(n, |i| as_usize(load(i))))
    }

    /// Whether a worker with `load` patches in flight may take an image of
    /// `patches` more: idle, or under its fair share (`load_factor` × the
    /// mean with the image, before taking it: a large image does not lose
    /// its home to small ones) with the image keeping it within the
    /// absolute bound.
    fn fits(&self, load: u64, patches: u64, fair: f64) -> bool {
        let within_bound =
            self.max_patches == 0 || load.saturating_add(patches) <= self.max_patches;
        load == 0 || ((load as f64) < fair && within_bound)
    }
}

fn as_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// Folds a content hash (any length) to the 64-bit affinity key.
pub fn affinity_key(content_hash: &[u8]) -> u64 {
    content_hash
        .iter()
        .take(8)
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// The rendezvous score of worker `name` for `key`.
fn score(key: u64, name: &str) -> u64 {
    let name_hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    iris_fingerprint::mix64(key ^ name_hash)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use iris_fingerprint::mix64;

    use super::*;
    use crate::workers::{Role, WorkerUrl};

    fn workers(n: u16) -> Vec<Arc<Worker>> {
        (1..=n)
            .map(|p| {
                let url = WorkerUrl::parse(&format!("grpc://10.0.0.{p}:7000")).unwrap();
                Worker::new(url, Role::Encode, Duration::from_secs(1)).unwrap()
            })
            .collect()
    }

    fn host(w: &Worker) -> String {
        w.url.host.clone()
    }

    /// An image of one patch: loads count images, as before patches.
    fn unit(key: u64) -> ImageCost {
        ImageCost { key, patches: 1 }
    }

    #[tokio::test]
    async fn an_image_keeps_its_encoder_and_images_spread() {
        let ws = workers(4);
        let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 1.25, 0);
        let mut per_worker: HashMap<String, usize> = HashMap::new();
        for key in 0..4000u64 {
            let key = mix64(key);
            let first = p.pick(&ws, unit(key)).unwrap();
            assert_eq!(
                host(&first),
                host(&p.pick(&ws, unit(key)).unwrap()),
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
        let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 1.25, 0);
        let fewer: Vec<_> = ws[..3].to_vec();
        for key in (0..2000u64).map(mix64) {
            let before = host(&p.pick(&ws, unit(key)).unwrap());
            let after = host(&p.pick(&fewer, unit(key)).unwrap());
            if before != host(&ws[3]) {
                assert_eq!(before, after, "key {key} moved without cause");
            }
        }
    }

    #[tokio::test]
    async fn a_hot_image_spills_over_instead_of_overloading_one_encoder() {
        let ws = workers(4);
        let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 1.25, 0);
        let key = 42;
        let home = host(&p.pick(&ws, unit(key)).unwrap());
        // 40 concurrent requests for the same image.
        let guards: Vec<_> = (0..40)
            .map(|_| p.pick(&ws, unit(key)).unwrap().start_encode(1))
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
            host(&p.pick(&ws, unit(key)).unwrap()),
            home,
            "back home when idle"
        );
    }

    #[tokio::test]
    async fn copies_of_a_hot_image_in_one_request_spread_too() {
        let ws = workers(4);
        let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 1.25, 0);
        // One request carrying the same image 40 times, nothing in flight.
        let picks = p.pick_all(&ws, [unit(42); 40]).unwrap();
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
        let home = host(&p.pick(&ws, unit(42)).unwrap());
        assert_eq!(host(&picks[0]), home, "the first copy goes home");
    }

    #[tokio::test]
    async fn distinct_images_of_one_request_keep_their_homes() {
        let ws = workers(4);
        let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 1.25, 0);
        // Two images whose homes differ: the request changes nothing.
        let a = 1u64;
        let home_a = host(&p.pick(&ws, unit(a)).unwrap());
        let b = (2..)
            .map(mix64)
            .find(|&k| host(&p.pick(&ws, unit(k)).unwrap()) != home_a)
            .unwrap();
        let home_b = host(&p.pick(&ws, unit(b)).unwrap());
        let picks: Vec<String> = p
            .pick_all(&ws, [unit(a), unit(b)])
            .unwrap()
            .iter()
            .map(|w| host(w))
            .collect();
        assert_eq!(picks, vec![home_a, home_b]);
    }

    #[tokio::test]
    async fn least_load_counts_the_images_already_assigned() {
        let ws = workers(3);
        let p = EncodePolicy::new(EncodePolicyKind::LeastLoad, 1.25, 0);
        let _busy = [
            ws[0].start_encode(1),
            ws[0].start_encode(1),
            ws[1].start_encode(1),
        ];
        // In flight 2, 1, 0: three images even the loads out at 2, 2, 2
        // instead of all going to the idle worker.
        let mut picks: Vec<String> = p
            .pick_all(&ws, [unit(7); 3])
            .unwrap()
            .iter()
            .map(|w| host(w))
            .collect();
        picks.sort();
        assert_eq!(picks, vec!["10.0.0.2", "10.0.0.3", "10.0.0.3"]);
        assert!(p.pick_all(&[], [unit(7)]).is_none());
    }

    #[tokio::test]
    async fn other_policies_ignore_the_key() {
        let ws = workers(3);
        let p = EncodePolicy::new(EncodePolicyKind::RoundRobin, 1.25, 0);
        let hosts: Vec<String> = (0..3)
            .map(|_| host(&p.pick(&ws, unit(7)).unwrap()))
            .collect();
        assert_eq!(hosts, vec!["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert!(p.pick(&[], unit(7)).is_none());
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
            let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, factor, BOUND);
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
                let w = p.pick(&ws, img).unwrap();
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
        let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 1.25, BOUND);
        let big = image(mix64(77), FOUR_K);
        let home = p.pick(&ws, big).unwrap();
        let small = (0..)
            .map(|k| image(mix64(9000 + k), THUMB))
            .find(|&t| host(&p.pick(&ws, t).unwrap()) == host(&home))
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
            assert_eq!(host(&p.pick(&ws, big).unwrap()), host(&home));
            assert_eq!(host(&p.pick(&ws, small).unwrap()), host(&home));
        }
        // Two 4K images in flight at home: one more would pass the bound
        // (10 844 + 3 × 42 196 > 131 072) — it goes elsewhere; the
        // thumbnail still fits.
        let loaded = [home.start_encode(FOUR_K), home.start_encode(FOUR_K)];
        let p_loose = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 100.0, BOUND);
        let elsewhere = p_loose.pick(&ws, big).unwrap();
        assert_ne!(host(&elsewhere), host(&home));
        assert!(elsewhere.patches_in_flight() + FOUR_K <= BOUND);
        assert_eq!(host(&p_loose.pick(&ws, small).unwrap()), host(&home));
        drop(loaded);
        assert_eq!(host(&p.pick(&ws, big).unwrap()), host(&home), "back home");
    }

    #[tokio::test]
    async fn least_load_weighs_patches_not_images() {
        let ws = workers(3);
        let p = EncodePolicy::new(EncodePolicyKind::LeastLoad, 1.25, BOUND);
        let _a = ws[0].start_encode(FOUR_K);
        let _b: Vec<_> = (0..8).map(|_| ws[1].start_encode(THUMB)).collect();
        let _c = ws[2].start_encode(P1080);
        let pick = p.pick(&ws, image(1, P1080)).unwrap();
        assert_eq!(host(&pick), "10.0.0.2", "eight thumbnails weigh least");
    }

    #[test]
    fn patches_come_from_the_grid_else_the_pixels() {
        use iris_proto::tensor::{inline, int64, DType};
        let mut item = MultimodalItem {
            encoder_input: Some(inline(
                vec![24, 4],
                DType::BFloat16,
                bytes::Bytes::from(vec![0u8; 24 * 4 * 2]),
            )),
            ..Default::default()
        };
        assert_eq!(item_patches(&item), 24);
        item.model_specific_tensors
            .insert("image_grid_thw".into(), int64(vec![1, 3], &[1, 154, 274]));
        assert_eq!(item_patches(&item), FOUR_K);
        assert_eq!(item_patches(&MultimodalItem::default()), 1);
        let mut video = MultimodalItem::default();
        video
            .model_specific_tensors
            .insert("video_grid_thw".into(), int64(vec![1, 3], &[8, 36, 64]));
        assert_eq!(item_patches(&video), 8 * 36 * 64);
    }

    #[test]
    fn affinity_key_reads_the_leading_bytes() {
        assert_eq!(affinity_key(&[1, 2]), 0x0102);
        assert_eq!(affinity_key(&[0xff; 32]), u64::MAX);
    }
}
