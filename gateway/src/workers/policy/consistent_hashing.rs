//! `consistent_hashing` (the encoders' default): an image goes to the same
//! encoder every time, so the encoder's embedding cache hits, without a
//! hot image overloading that encoder.
//!
//! Rendezvous hashing — each worker scores the image's content key; the
//! highest score wins, so adding or removing a worker moves only the
//! images that scored highest on it — with bounded loads: a worker is
//! skipped while its load plus the image's would exceed `load_factor` ×
//! the mean (the image included) or the absolute bound (`max_load`,
//! `--encode-max-in-flight-patches`), and the image goes to the next worker
//! in its score order; an idle worker always qualifies, so an image larger
//! than the bounds still has a home. When no worker qualifies, or the key
//! names no image, the least loaded one gets it (admission then makes it
//! wait for room).

use super::least_load::LeastLoad;
use super::{Candidates, LoadBounds, Policy};

pub struct ConsistentHashing {
    bounds: LoadBounds,
    fallback: LeastLoad,
}

impl ConsistentHashing {
    /// `bounds.load_factor` is raised to 1 at least.
    pub fn new(bounds: LoadBounds) -> Self {
        ConsistentHashing {
            bounds: LoadBounds {
                load_factor: bounds.load_factor.max(1.0),
                ..bounds
            },
            fallback: LeastLoad::default(),
        }
    }

    /// Whether a worker with `load` may take `cost` more: idle, or under
    /// its fair share (`load_factor` × the mean with the image, before
    /// taking it: a large image does not lose its home to small ones) with
    /// the image keeping it within the absolute bound.
    fn fits(&self, load: u64, cost: u64, fair: f64) -> bool {
        let max = self.bounds.max_load;
        let within_bound = max == 0 || load.saturating_add(cost) <= max;
        load == 0 || ((load as f64) < fair && within_bound)
    }
}

impl Policy for ConsistentHashing {
    fn pick(&self, among: &Candidates<'_>) -> usize {
        let Some(item) = among.key.items.first() else {
            return self.fallback.pick(among);
        };
        let n = among.len();
        let cost = among.key.cost.max(1);
        let total: u64 = (0..n).map(|i| among.load(i)).sum();
        let fair = self.bounds.load_factor * (total + cost) as f64 / n as f64;
        let mut ranked: Vec<(u64, usize)> = among
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| (score(item.key, &w.url.to_string()), i))
            .collect();
        ranked.sort_unstable_by_key(|(score, _)| std::cmp::Reverse(*score));
        ranked
            .iter()
            .map(|(_, i)| *i)
            .find(|&i| self.fits(among.load(i), cost, fair))
            .unwrap_or_else(|| self.fallback.pick(among))
    }
}

/// The rendezvous score of worker `name` for `key`.
fn score(key: u64, name: &str) -> u64 {
    let name_hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    iris_fingerprint::mix64(key ^ name_hash)
}
