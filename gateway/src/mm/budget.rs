//! The byte budget for images in flight (`--mm-max-inflight-mb`).
//!
//! Before an image is decoded, the memory its decoding and preprocessing
//! will take is read from its header ([`iris_vision::probe`] and
//! [`iris_vision::Processor::memory_needed`]: decoded pixels, the decoder's
//! own buffers, resize intermediates, the output tensor) and reserved here.
//! When the budget is in use the image waits, first come first served, for
//! at most the configured wait, then the request gets 503 with
//! `Retry-After`; an image that needs more than the whole budget is a 400.
//! When preprocessing ends, the reservation shrinks to the output tensor,
//! which the request holds until it has been answered (a cached tensor is
//! also bounded by the pixel cache; cache hits reserve nothing).
//!
//! Permits are KiB of a tokio [`Semaphore`], which is fair: a large image
//! waiting at the head is not overtaken by a stream of small ones.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

const KIB: u64 = 1024;

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetError {
    /// The image alone needs more than the whole budget.
    TooLarge { need: u64, budget: u64 },
    /// The budget stayed in use for the whole wait.
    Busy { budget: u64, waited: Duration },
}

/// The shared budget of bytes for images being decoded and preprocessed.
pub struct MemoryBudget {
    permits: Arc<Semaphore>,
    total_kib: u32,
    wait: Duration,
    refused_busy: AtomicU64,
    refused_too_large: AtomicU64,
}

/// Bytes held from the budget, given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    permits: Arc<Semaphore>,
    kib: u32,
}

impl MemoryBudget {
    /// A budget of `total_bytes` (rounded down to KiB, at least 1 KiB,
    /// at most 4 TiB) where a reservation waits at most `wait`.
    pub fn new(total_bytes: u64, wait: Duration) -> Self {
        let total_kib = u32::try_from(total_bytes / KIB).unwrap_or(u32::MAX).max(1);
        MemoryBudget {
            permits: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
            wait,
            refused_busy: AtomicU64::new(0),
            refused_too_large: AtomicU64::new(0),
        }
    }

    /// The whole budget in bytes.
    pub fn total_bytes(&self) -> u64 {
        u64::from(self.total_kib) * KIB
    }

    /// Bytes reserved now.
    pub fn reserved_bytes(&self) -> u64 {
        let free = self.permits.available_permits() as u64;
        (u64::from(self.total_kib).saturating_sub(free)) * KIB
    }

    /// Reserves `bytes`, waiting (in arrival order) at most the budget's
    /// wait for room.
    pub async fn reserve(&self, bytes: u64) -> Result<Reservation, BudgetError> {
        let kib = bytes.div_ceil(KIB).max(1);
        let Some(kib) = u32::try_from(kib).ok().filter(|&k| k <= self.total_kib) else {
            self.refused_too_large.fetch_add(1, Ordering::Relaxed);
            return Err(BudgetError::TooLarge {
                need: bytes,
                budget: self.total_bytes(),
            });
        };
        let acquire = self.permits.clone().acquire_many_owned(kib);
        match tokio::time::timeout(self.wait, acquire).await {
            Ok(Ok(permit)) => {
                permit.forget();
                Ok(Reservation {
                    permits: self.permits.clone(),
                    kib,
                })
            }
            // Timed out (the semaphore is never closed).
            _ => {
                self.refused_busy.fetch_add(1, Ordering::Relaxed);
                Err(BudgetError::Busy {
                    budget: self.total_bytes(),
                    waited: self.wait,
                })
            }
        }
    }

    /// Prometheus text for the budget.
    pub fn render(&self, out: &mut String) {
        iris_metrics::gauge(
            out,
            "iris_mm_inflight_bytes",
            "Bytes reserved by images being decoded and preprocessed and by the tensors of requests not yet handed to the workers.",
            self.reserved_bytes() as f64,
        );
        iris_metrics::gauge(
            out,
            "iris_mm_inflight_budget_bytes",
            "The budget for those bytes (--mm-max-inflight-mb).",
            self.total_bytes() as f64,
        );
        iris_metrics::family(
            out,
            "iris_mm_inflight_refusals_total",
            "counter",
            "Images refused by the budget (busy: 503 after the wait; too_large: 400).",
            [
                ("reason=\"busy\"", self.refused_busy.load(Ordering::Relaxed)),
                (
                    "reason=\"too_large\"",
                    self.refused_too_large.load(Ordering::Relaxed),
                ),
            ],
        );
    }
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        u64::from(self.kib) * KIB
    }

    /// Moves `bytes` (rounded up to KiB, at most what is held) into a
    /// reservation of their own.
    pub fn split_off(&mut self, bytes: u64) -> Reservation {
        let kib = kib_of(bytes).min(self.kib);
        self.kib -= kib;
        Reservation {
            permits: self.permits.clone(),
            kib,
        }
    }

    /// Keeps `bytes` (rounded up to KiB, at most what is held) and gives
    /// the rest back to the budget now.
    pub fn shrink_to(mut self, bytes: u64) -> Reservation {
        let keep = kib_of(bytes).min(self.kib);
        self.permits.add_permits((self.kib - keep) as usize);
        self.kib = keep;
        self
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.permits.add_permits(self.kib as usize);
    }
}

/// `bytes` in KiB, rounded up (saturating).
fn kib_of(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(KIB)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn budget(mib: u64, wait_ms: u64) -> MemoryBudget {
        MemoryBudget::new(mib * MIB, Duration::from_millis(wait_ms))
    }

    #[tokio::test]
    async fn admits_within_the_budget_and_gives_back_on_drop() {
        let b = budget(100, 0);
        let first = b.reserve(60 * MIB).await.unwrap();
        let second = b.reserve(40 * MIB).await.unwrap();
        assert_eq!(b.reserved_bytes(), 100 * MIB);
        assert_eq!(first.bytes() + second.bytes(), 100 * MIB);
        drop(first);
        assert_eq!(b.reserved_bytes(), 40 * MIB);
        drop(second);
        assert_eq!(b.reserved_bytes(), 0);
    }

    #[tokio::test]
    async fn a_full_budget_is_busy_after_the_wait() {
        let b = budget(100, 20);
        let _held = b.reserve(90 * MIB).await.unwrap();
        let err = b.reserve(20 * MIB).await.unwrap_err();
        assert_eq!(
            err,
            BudgetError::Busy {
                budget: 100 * MIB,
                waited: Duration::from_millis(20)
            }
        );
        let mut text = String::new();
        b.render(&mut text);
        assert!(
            text.contains("iris_mm_inflight_refusals_total{reason=\"busy\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(&format!("iris_mm_inflight_bytes {}", 90 * MIB)),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_waiting_image_is_admitted_when_room_is_given_back() {
        let b = Arc::new(budget(100, 60_000));
        let held = b.reserve(90 * MIB).await.unwrap();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.reserve(50 * MIB).await.map(|r| r.bytes()) }
        });
        // The waiter is queued, not refused: nothing is decided until room comes back.
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(held);
        assert_eq!(waiter.await.unwrap(), Ok(50 * MIB));
        assert_eq!(b.reserved_bytes(), 0);
    }

    #[tokio::test]
    async fn an_image_larger_than_the_whole_budget_is_refused_at_once() {
        let b = budget(100, 60_000);
        let err = b.reserve(100 * MIB + 1).await.unwrap_err();
        assert_eq!(
            err,
            BudgetError::TooLarge {
                need: 100 * MIB + 1,
                budget: 100 * MIB
            }
        );
        assert!(matches!(
            b.reserve(u64::MAX).await,
            Err(BudgetError::TooLarge { .. })
        ));
        assert!(
            b.reserve(100 * MIB).await.is_ok(),
            "exactly the budget fits"
        );
    }

    #[tokio::test]
    async fn splitting_shares_one_reservation_without_creating_bytes() {
        let b = budget(100, 0);
        let mut all = b.reserve(30 * MIB).await.unwrap();
        let first = all.split_off(10 * MIB);
        let second = all.split_off(25 * MIB);
        assert_eq!(
            (first.bytes(), second.bytes(), all.bytes()),
            (10 * MIB, 20 * MIB, 0)
        );
        drop(all);
        drop(first);
        assert_eq!(b.reserved_bytes(), 20 * MIB);
        drop(second);
        assert_eq!(b.reserved_bytes(), 0);
    }

    #[tokio::test]
    async fn shrinking_keeps_the_tensor_and_returns_the_rest() {
        let b = budget(100, 0);
        let r = b.reserve(80 * MIB).await.unwrap();
        let kept = r.shrink_to(10 * MIB + 1);
        assert_eq!(kept.bytes(), 10 * MIB + KIB);
        assert_eq!(b.reserved_bytes(), 10 * MIB + KIB);
        let kept = kept.shrink_to(u64::MAX);
        assert_eq!(kept.bytes(), 10 * MIB + KIB, "never grows");
        drop(kept);
        assert_eq!(b.reserved_bytes(), 0);
    }
}
