//! Open-loop arrivals for `--request-rate R`, as `vllm bench serve` draws
//! them: the gaps between requests are gamma-distributed with shape
//! `--burstiness` (1: exponential gaps, a Poisson process; below 1:
//! burstier; above 1: more even) and mean `1/R`, from a seeded generator,
//! so a run's schedule is the same every time for the same seed.
//!
//! The generator is SplitMix64 (uniforms, `iris-fingerprint`), Box–Muller
//! (normals) and Marsaglia–Tsang (gamma); no external crate, so the
//! schedule does not move when a dependency changes its algorithm.

use std::time::Duration;

/// A small, fast, seedable generator of uniform `u64`s (SplitMix64).
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: iris_fingerprint::SplitMix64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 {
            state: iris_fingerprint::SplitMix64(seed),
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state.next_u64()
    }

    /// Uniform in (0, 1]: never 0, so its logarithm is finite.
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller; one of the pair is used).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Gamma with `shape` and scale 1 (Marsaglia–Tsang; for shape < 1,
    /// `Gamma(shape + 1) · U^(1/shape)`).
    pub fn gamma(&mut self, shape: f64) -> f64 {
        if shape < 1.0 {
            let boost = self.unit().powf(1.0 / shape);
            return self.gamma(shape + 1.0) * boost;
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = 1.0 + c * x;
            if v <= 0.0 {
                continue;
            }
            let v = v * v * v;
            let u = self.unit();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }
}

/// The gaps between successive requests of an open-loop run.
#[derive(Debug, Clone)]
pub struct Arrivals {
    rng: SplitMix64,
    /// Requests per second (finite, above 0).
    rate: f64,
    /// Gamma shape (finite, above 0).
    burstiness: f64,
}

impl Arrivals {
    /// `rate` and `burstiness` must be finite and above 0 (checked by the
    /// options).
    pub fn new(rate: f64, burstiness: f64, seed: u64) -> Arrivals {
        Arrivals {
            rng: SplitMix64::new(seed),
            rate,
            burstiness,
        }
    }

    /// The next gap: Gamma(shape = burstiness, scale = 1 / (rate ·
    /// burstiness)), whose mean is 1 / rate.
    pub fn next_gap(&mut self) -> Duration {
        let theta = 1.0 / (self.rate * self.burstiness);
        let secs = self.rng.gamma(self.burstiness) * theta;
        // Bounded: a gap longer than an hour is longer than any run.
        Duration::from_secs_f64(secs.clamp(0.0, 3600.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(rate: f64, burstiness: f64, seed: u64, n: usize) -> Vec<f64> {
        let mut a = Arrivals::new(rate, burstiness, seed);
        (0..n).map(|_| a.next_gap().as_secs_f64()).collect()
    }

    fn mean_and_cv(v: &[f64]) -> (f64, f64) {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn poisson_gaps_have_the_asked_mean_and_unit_cv() {
        let v = gaps(10.0, 1.0, 42, 20_000);
        let (mean, cv) = mean_and_cv(&v);
        assert!((mean - 0.1).abs() < 0.1 * 0.03, "mean gap {mean}");
        // Exponential gaps: coefficient of variation 1.
        assert!((cv - 1.0).abs() < 0.05, "cv {cv}");
        assert!(v.iter().all(|&g| g >= 0.0));
    }

    #[test]
    fn burstiness_sets_the_spread_not_the_mean() {
        for (shape, seed) in [(0.25, 1), (0.5, 2), (2.0, 3), (8.0, 4)] {
            let v = gaps(4.0, shape, seed, 40_000);
            let (mean, cv) = mean_and_cv(&v);
            assert!(
                (mean - 0.25).abs() < 0.25 * 0.04,
                "shape {shape}: mean {mean}"
            );
            // Gamma(k): cv = 1/sqrt(k).
            let want = 1.0 / f64::sqrt(shape);
            assert!(
                (cv - want).abs() < want * 0.06,
                "shape {shape}: cv {cv}, want {want}"
            );
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        assert_eq!(gaps(3.0, 1.0, 7, 100), gaps(3.0, 1.0, 7, 100));
        assert_ne!(gaps(3.0, 1.0, 7, 100), gaps(3.0, 1.0, 8, 100));
    }

    #[test]
    fn uniforms_stay_in_the_half_open_unit_interval() {
        let mut r = SplitMix64::new(0);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!(u > 0.0 && u <= 1.0);
        }
    }
}
