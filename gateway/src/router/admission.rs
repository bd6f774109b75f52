//! Admission control for encode workers: at most `max_calls` Encode calls
//! (image transfers) and `max_patches` patches in flight per encoder.
//! Further images wait in the gateway — bounded by the request's
//! deadline — instead of piling onto the encoder, where they would time
//! out downstream (the prefill's wait for the embedding, the Encode
//! deadline) and turn overload into a storm of retries. Patches weigh
//! what an image costs the encoder (a 4K image ≈ 4 × a 1080p one); the
//! call count bounds how many requests its queue holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::workers::Worker;

/// Per-encoder semaphores (calls, patches), made on first use.
pub struct Admission {
    /// Encode calls in flight per encoder (0: unlimited).
    max_calls: u32,
    /// Patches in flight per encoder (0: unlimited).
    max_patches: u32,
    slots: Mutex<HashMap<String, [Arc<Semaphore>; 2]>>,
}

/// What one request sends one encoder.
#[derive(Default)]
struct Demand {
    calls: u32,
    patches: u32,
}

impl Admission {
    pub fn new(max_calls: usize, max_patches: u64) -> Self {
        Admission {
            max_calls: u32::try_from(max_calls).unwrap_or(u32::MAX),
            max_patches: u32::try_from(max_patches).unwrap_or(u32::MAX),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// Permits for sending each image (`(encoder, patches)`, one entry per
    /// image) to its encoder. Encoders are taken in a fixed (URL) order,
    /// calls before patches, so requests that need several never wait on
    /// each other in a cycle; a request never asks one encoder for more
    /// than a bound (an image larger than the patch bound waits until the
    /// encoder has nothing else in flight). Waiting images are admitted in
    /// arrival order, so small ones never starve a large one.
    pub async fn acquire(&self, images: &[(Arc<Worker>, u64)]) -> Vec<OwnedSemaphorePermit> {
        let mut demands: Vec<(String, Demand)> = Vec::new();
        for (worker, patches) in images {
            let url = worker.url.to_string();
            let index = match demands.iter().position(|(u, _)| *u == url) {
                Some(i) => i,
                None => {
                    demands.push((url, Demand::default()));
                    demands.len() - 1
                }
            };
            let demand = &mut demands[index].1;
            demand.calls = demand.calls.saturating_add(1);
            let patches = u32::try_from(*patches).unwrap_or(u32::MAX);
            demand.patches = demand.patches.saturating_add(patches);
        }
        demands.sort_by(|a, b| a.0.cmp(&b.0));
        let mut permits = Vec::with_capacity(demands.len() * 2);
        for (url, demand) in demands {
            let semaphores = self.semaphores(&url);
            let wants = [
                (demand.calls, self.max_calls),
                (demand.patches, self.max_patches),
            ];
            for (semaphore, (wanted, bound)) in semaphores.into_iter().zip(wants) {
                if bound == 0 {
                    continue;
                }
                if let Ok(permit) = semaphore.acquire_many_owned(wanted.min(bound)).await {
                    permits.push(permit);
                }
            }
        }
        permits
    }

    fn semaphores(&self, url: &str) -> [Arc<Semaphore>; 2] {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .entry(url.to_owned())
            .or_insert_with(|| {
                [self.max_calls, self.max_patches]
                    .map(|bound| Arc::new(Semaphore::new(bound as usize)))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::workers::{Role, WorkerUrl};

    fn encoder(port: u16) -> Arc<Worker> {
        let url = WorkerUrl::parse(&format!("grpc://127.0.0.1:{port}")).unwrap();
        Worker::new(url, Role::Encode, Duration::from_secs(1)).unwrap()
    }

    fn images(worker: &Arc<Worker>, patches: &[u64]) -> Vec<(Arc<Worker>, u64)> {
        patches.iter().map(|&p| (worker.clone(), p)).collect()
    }

    fn permits(held: &[OwnedSemaphorePermit]) -> usize {
        held.iter().map(|p| p.num_permits()).sum()
    }

    #[tokio::test]
    async fn images_beyond_the_call_limit_wait_for_a_free_slot() {
        let admission = Arc::new(Admission::new(2, 0));
        let a = encoder(1);
        let held = admission.acquire(&images(&a, &[1, 1])).await;
        let waiting = {
            let (admission, a) = (admission.clone(), a.clone());
            tokio::spawn(async move { admission.acquire(&images(&a, &[1])).await.len() })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a third image must wait");
        // Another encoder is not affected.
        assert_eq!(admission.acquire(&images(&encoder(2), &[1])).await.len(), 1);
        drop(held);
        let got = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert_eq!(got.unwrap().unwrap(), 1);
    }

    #[tokio::test]
    async fn patches_bound_what_is_in_flight_whatever_the_image_count() {
        let admission = Arc::new(Admission::new(8, 100_000));
        let a = encoder(1);
        // Two 4K images (2 × 42 196) and many thumbnails fit...
        let held = admission
            .acquire(&images(&a, &[42_196, 42_196, 16, 16, 16]))
            .await;
        assert_eq!(permits(&held), 5 + 84_440);
        let thumb = tokio::time::timeout(
            Duration::from_secs(5),
            admission.acquire(&images(&a, &[16])),
        )
        .await
        .expect("a thumbnail fits beside two 4K images");
        assert_eq!(permits(&thumb), 1 + 16);
        // ...a third 4K image does not, though only 6 of 8 calls are used.
        let waiting = {
            let (admission, a) = (admission.clone(), a.clone());
            tokio::spawn(async move { permits(&admission.acquire(&images(&a, &[42_196])).await) })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a third 4K image must wait");
        drop((held, thumb));
        let got = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert_eq!(got.unwrap().unwrap(), 1 + 42_196);
    }

    #[tokio::test]
    async fn a_request_never_asks_for_more_than_a_bound() {
        let admission = Admission::new(2, 1_000);
        let a = encoder(1);
        let many = images(&a, &[400; 5]);
        let held = tokio::time::timeout(Duration::from_secs(5), admission.acquire(&many))
            .await
            .expect("five images on one encoder with a limit of two must not deadlock");
        assert_eq!(permits(&held), 2 + 1_000);
        drop(held);
        let huge = tokio::time::timeout(
            Duration::from_secs(5),
            admission.acquire(&images(&a, &[5_000])),
        )
        .await
        .expect("an image over the patch bound waits only for an idle encoder");
        assert_eq!(permits(&huge), 1 + 1_000);
        assert!(
            Admission::new(0, 0).acquire(&many).await.is_empty(),
            "0: unlimited"
        );
    }
}
