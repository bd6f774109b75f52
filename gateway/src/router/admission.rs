//! Admission control for encode workers: at most `limit` Encode calls
//! (image transfers) in flight per encoder. Further images wait in the
//! gateway — bounded by the request's deadline — instead of piling onto
//! the encoder, where they would time out downstream (the prefill's wait
//! for the embedding, the Encode deadline) and turn overload into a storm
//! of retries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::workers::Worker;

/// Per-encoder semaphores, made on first use.
pub struct Admission {
    /// Encode calls in flight per encoder (0: unlimited).
    limit: usize,
    slots: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Admission {
    pub fn new(limit: usize) -> Self {
        Admission {
            limit,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// Permits for sending one image to each of `encoders` (one entry per
    /// image). Encoders are taken in a fixed (URL) order so requests that
    /// need several never wait on each other in a cycle; a request never
    /// asks one encoder for more than `limit` permits.
    pub async fn acquire(&self, encoders: &[Arc<Worker>]) -> Vec<OwnedSemaphorePermit> {
        if self.limit == 0 {
            return Vec::new();
        }
        let mut counts: Vec<(String, u32)> = Vec::new();
        for worker in encoders {
            let url = worker.url.to_string();
            match counts.iter_mut().find(|(u, _)| *u == url) {
                Some((_, n)) => *n += 1,
                None => counts.push((url, 1)),
            }
        }
        counts.sort();
        let mut permits = Vec::with_capacity(counts.len());
        for (url, n) in counts {
            let wanted = n.min(u32::try_from(self.limit).unwrap_or(u32::MAX));
            if let Ok(permit) = self.semaphore(&url).acquire_many_owned(wanted).await {
                permits.push(permit);
            }
        }
        permits
    }

    fn semaphore(&self, url: &str) -> Arc<Semaphore> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .entry(url.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.limit)))
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

    #[tokio::test]
    async fn images_beyond_the_limit_wait_for_a_free_slot() {
        let admission = Arc::new(Admission::new(2));
        let a = encoder(1);
        let held = admission.acquire(&[a.clone(), a.clone()]).await;
        let waiting = {
            let (admission, a) = (admission.clone(), a.clone());
            tokio::spawn(async move { admission.acquire(&[a]).await.len() })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a third image must wait");
        // Another encoder is not affected.
        assert_eq!(admission.acquire(&[encoder(2)]).await.len(), 1);
        drop(held);
        let got = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert_eq!(got.unwrap().unwrap(), 1);
    }

    #[tokio::test]
    async fn a_request_never_asks_for_more_than_the_limit() {
        let admission = Admission::new(2);
        let a = encoder(1);
        let many = vec![a.clone(); 5];
        let permits = tokio::time::timeout(Duration::from_secs(5), admission.acquire(&many))
            .await
            .expect("five images on one encoder with a limit of two must not deadlock");
        assert_eq!(permits.iter().map(|p| p.num_permits()).sum::<usize>(), 2);
        assert!(
            Admission::new(0).acquire(&many).await.is_empty(),
            "0: unlimited"
        );
    }
}
