//! Choosing an encode worker for one image (`--encode-policy`).
//!
//! The default, `consistent_hashing`, sends an image to the same encoder
//! every time (so the encoder's embedding cache hits) without letting a hot
//! image overload that encoder: rendezvous hashing (each worker scores the
//! content hash; the highest score wins, so adding or removing a worker
//! moves only the images that scored highest on it) with bounded loads —
//! a worker is skipped while its in-flight count would exceed
//! `load_factor` × the mean, and the image goes to the next worker in its
//! score order.

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
        match self.kind {
            EncodePolicyKind::ConsistentHashing => self.bounded_rendezvous(candidates, key),
            _ => self.plain.pick(candidates),
        }
    }

    fn bounded_rendezvous(&self, candidates: &[Arc<Worker>], key: u64) -> Option<Arc<Worker>> {
        let n = candidates.len();
        if n == 0 {
            return None;
        }
        let total: usize = candidates.iter().map(|w| w.in_flight()).sum();
        let bound = (self.load_factor * (total + 1) as f64 / n as f64).ceil() as usize;
        let mut ranked: Vec<(u64, &Arc<Worker>)> = candidates
            .iter()
            .map(|w| (score(key, &w.url.to_string()), w))
            .collect();
        ranked.sort_unstable_by_key(|(score, _)| std::cmp::Reverse(*score));
        ranked
            .iter()
            .find(|(_, w)| w.in_flight() < bound)
            .map(|(_, w)| (*w).clone())
            .or_else(|| self.plain.pick(candidates))
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
    mix(key ^ name_hash)
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

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
            let key = mix(key);
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
        for key in (0..2000u64).map(mix) {
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
