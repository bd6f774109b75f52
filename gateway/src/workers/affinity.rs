//! Choosing an encode worker for each image of a request (`--encode-policy`).
//!
//! The default, `consistent_hashing`, sends an image to the same encoder
//! every time (so the encoder's embedding cache hits) without letting a hot
//! image overload that encoder: rendezvous hashing (each worker scores the
//! content hash; the highest score wins, so adding or removing a worker
//! moves only the images that scored highest on it) with bounded loads —
//! a worker is skipped while its in-flight count would exceed
//! `load_factor` × the mean, and the image goes to the next worker in its
//! score order. Images assigned earlier in the same request count as load
//! too, so one request carrying many copies of a hot image spreads them.

use std::sync::Arc;

use clap::ValueEnum;

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

/// An encode policy with its state.
pub struct EncodePolicy {
    kind: EncodePolicyKind,
    /// Round robin, random and least load reuse the generic policies.
    plain: Policy,
    load_factor: f64,
}

impl EncodePolicy {
    /// `load_factor` (≥ 1) bounds a worker's load relative to the mean.
    pub fn new(kind: EncodePolicyKind, load_factor: f64) -> Self {
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
        }
    }

    pub fn kind(&self) -> EncodePolicyKind {
        self.kind
    }

    /// Picks one of `candidates` for the image whose content hash folds to `key`.
    pub fn pick(&self, candidates: &[Arc<Worker>], key: u64) -> Option<Arc<Worker>> {
        self.pick_all(candidates, [key])?.pop()
    }

    /// Picks an encoder for each image of one request (`keys`: their
    /// affinity keys, in order). Images assigned earlier in the request
    /// count as load on their encoder, so several copies of one hot image
    /// spread as they would across requests. `None` when there is no
    /// candidate.
    pub fn pick_all(
        &self,
        candidates: &[Arc<Worker>],
        keys: impl IntoIterator<Item = u64>,
    ) -> Option<Vec<Arc<Worker>>> {
        let mut assigned = vec![0usize; candidates.len()];
        keys.into_iter()
            .map(|key| {
                let load = |i: usize| candidates[i].in_flight() + assigned[i];
                let index = match self.kind {
                    EncodePolicyKind::ConsistentHashing => {
                        self.bounded_rendezvous(candidates, key, load)
                    }
                    _ => self.plain.pick_index(candidates.len(), load),
                }?;
                assigned[index] += 1;
                candidates.get(index).cloned()
            })
            .collect()
    }

    /// The index of the highest-scoring candidate for `key` whose load
    /// stays under the bound; the plain policy's pick when none does.
    fn bounded_rendezvous(
        &self,
        candidates: &[Arc<Worker>],
        key: u64,
        load: impl Fn(usize) -> usize,
    ) -> Option<usize> {
        let n = candidates.len();
        if n == 0 {
            return None;
        }
        let total: usize = (0..n).map(&load).sum();
        let bound = (self.load_factor * (total + 1) as f64 / n as f64).ceil() as usize;
        let mut ranked: Vec<(u64, usize)> = candidates
            .iter()
            .enumerate()
            .map(|(i, w)| (score(key, &w.url.to_string()), i))
            .collect();
        ranked.sort_unstable_by_key(|(score, _)| std::cmp::Reverse(*score));
        ranked
            .iter()
            .map(|(_, i)| *i)
            .find(|&i| load(i) < bound)
            .or_else(|| self.plain.pick_index(n, &load))
    }
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

    #[tokio::test]
    async fn an_image_keeps_its_encoder_and_images_spread() {
        let ws = workers(4);
        let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 1.25);
        let mut per_worker: HashMap<String, usize> = HashMap::new();
        for key in 0..4000u64 {
            let key = mix64(key);
            let first = p.pick(&ws, key).unwrap();
            assert_eq!(host(&first), host(&p.pick(&ws, key).unwrap()), "stable");
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
        let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 1.25);
        let fewer: Vec<_> = ws[..3].to_vec();
        for key in (0..2000u64).map(mix64) {
            let before = host(&p.pick(&ws, key).unwrap());
            let after = host(&p.pick(&fewer, key).unwrap());
            if before != host(&ws[3]) {
                assert_eq!(before, after, "key {key} moved without cause");
            }
        }
    }

    #[tokio::test]
    async fn a_hot_image_spills_over_instead_of_overloading_one_encoder() {
        let ws = workers(4);
        let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 1.25);
        let key = 42;
        let home = host(&p.pick(&ws, key).unwrap());
        // 40 concurrent requests for the same image.
        let guards: Vec<_> = (0..40)
            .map(|_| p.pick(&ws, key).unwrap().start_request())
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
            host(&p.pick(&ws, key).unwrap()),
            home,
            "back home when idle"
        );
    }

    #[tokio::test]
    async fn copies_of_a_hot_image_in_one_request_spread_too() {
        let ws = workers(4);
        let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 1.25);
        // One request carrying the same image 40 times, nothing in flight.
        let picks = p.pick_all(&ws, [42u64; 40]).unwrap();
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
        let home = host(&p.pick(&ws, 42).unwrap());
        assert_eq!(host(&picks[0]), home, "the first copy goes home");
    }

    #[tokio::test]
    async fn distinct_images_of_one_request_keep_their_homes() {
        let ws = workers(4);
        let p = EncodePolicy::new(EncodePolicyKind::ConsistentHashing, 1.25);
        // Two images whose homes differ: the request changes nothing.
        let a = 1u64;
        let home_a = host(&p.pick(&ws, a).unwrap());
        let b = (2..)
            .map(mix64)
            .find(|&k| host(&p.pick(&ws, k).unwrap()) != home_a)
            .unwrap();
        let home_b = host(&p.pick(&ws, b).unwrap());
        let picks: Vec<String> = p
            .pick_all(&ws, [a, b])
            .unwrap()
            .iter()
            .map(|w| host(w))
            .collect();
        assert_eq!(picks, vec![home_a, home_b]);
    }

    #[tokio::test]
    async fn least_load_counts_the_images_already_assigned() {
        let ws = workers(3);
        let p = EncodePolicy::new(EncodePolicyKind::LeastLoad, 1.25);
        let _busy = [
            ws[0].start_request(),
            ws[0].start_request(),
            ws[1].start_request(),
        ];
        // In flight 2, 1, 0: three images even the loads out at 2, 2, 2
        // instead of all going to the idle worker.
        let mut picks: Vec<String> = p
            .pick_all(&ws, [7u64; 3])
            .unwrap()
            .iter()
            .map(|w| host(w))
            .collect();
        picks.sort();
        assert_eq!(picks, vec!["10.0.0.2", "10.0.0.3", "10.0.0.3"]);
        assert!(p.pick_all(&[], [7u64]).is_none());
    }

    #[tokio::test]
    async fn other_policies_ignore_the_key() {
        let ws = workers(3);
        let p = EncodePolicy::new(EncodePolicyKind::RoundRobin, 1.25);
        let hosts: Vec<String> = (0..3).map(|_| host(&p.pick(&ws, 7).unwrap())).collect();
        assert_eq!(hosts, vec!["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert!(p.pick(&[], 7).is_none());
    }

    #[test]
    fn affinity_key_reads_the_leading_bytes() {
        assert_eq!(affinity_key(&[1, 2]), 0x0102);
        assert_eq!(affinity_key(&[0xff; 32]), u64::MAX);
    }
}
