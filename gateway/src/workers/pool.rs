//! A pool of workers of one role, with its selection policy. The worker
//! list can change at run time (service discovery); readers take a cheap
//! snapshot. Load is counted in the pool's unit: requests in flight, or
//! for encoders the patches of the images in flight. A draining worker
//! stays in the list (its requests in flight finish) but is never picked.

use std::sync::{Arc, RwLock};

use super::policy::{pick_each, Policy, RouteKey};
use super::worker::{Role, Worker};
use crate::kv::Prediction;

pub struct Pool {
    pub role: Role,
    workers: RwLock<Arc<Vec<Arc<Worker>>>>,
    policy: Arc<dyn Policy>,
}

/// A request a pool's policy placed, accepted by `worker`: the policy is
/// told when it ends ([`Policy::on_completed`]), on drop.
pub struct Routed {
    policy: Arc<dyn Policy>,
    worker: Arc<Worker>,
    completed: bool,
}

impl Routed {
    /// Its answer was whole.
    pub fn complete(&mut self) {
        self.completed = true;
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        self.policy.on_completed(&self.worker, self.completed);
    }
}

impl Pool {
    pub fn new(role: Role, workers: Vec<Arc<Worker>>, policy: Box<dyn Policy>) -> Self {
        Pool {
            role,
            workers: RwLock::new(Arc::new(workers)),
            policy: Arc::from(policy),
        }
    }

    /// Every worker, healthy or not.
    pub fn snapshot(&self) -> Arc<Vec<Arc<Worker>>> {
        self.workers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Workers in service: healthy and not draining.
    pub fn healthy_count(&self) -> usize {
        self.snapshot()
            .iter()
            .filter(|w| w.is_healthy() && !w.is_draining())
            .count()
    }

    pub fn policy(&self) -> &dyn Policy {
        &*self.policy
    }

    /// `worker`'s load in the pool's unit.
    pub fn load(&self, worker: &Worker) -> u64 {
        match self.role {
            Role::Encode => worker.patches_in_flight(),
            _ => worker.in_flight() as u64,
        }
    }

    /// Picks a healthy worker for `key` with the pool's policy, preferring
    /// one not among its suspects (see [`candidates`](Self::candidates)).
    pub fn pick(&self, key: &RouteKey<'_>) -> Option<Arc<Worker>> {
        self.pick_each(std::slice::from_ref(key), key.suspects)?
            .pop()
    }

    /// A worker for each of `keys`, in order ([`pick_each`]: what is
    /// assigned earlier in the call counts as load). A worker picked with
    /// its circuit half-open carries the one probe; when another pick took
    /// that probe first, the keys are placed again without it.
    pub fn pick_each(
        &self,
        keys: &[RouteKey<'_>],
        tried: &[Arc<Worker>],
    ) -> Option<Vec<Arc<Worker>>> {
        let mut candidates = self.candidates(tried);
        loop {
            let picks = pick_each(&*self.policy, &candidates, keys, |w| self.load(w))?;
            let mut probes: Vec<&Arc<Worker>> = Vec::new();
            for worker in picks.iter().filter(|w| !w.is_healthy()) {
                if !probes.iter().any(|p| Arc::ptr_eq(p, worker)) {
                    probes.push(worker);
                }
            }
            let lost: Vec<Arc<Worker>> = probes
                .into_iter()
                .filter(|w| !w.breaker.claim_probe())
                .cloned()
                .collect();
            if lost.is_empty() {
                return Some(picks);
            }
            candidates.retain(|c| !lost.iter().any(|l| Arc::ptr_eq(l, c)));
        }
    }

    /// What the policy expects of the request `key` on `worker`, its pick.
    pub fn expect(&self, worker: &Arc<Worker>, key: &RouteKey<'_>) -> Option<Prediction> {
        self.policy.on_picked(worker, key)
    }

    /// `worker` accepted a request the policy placed with `key`; the
    /// policy hears of its end when the returned [`Routed`] is dropped.
    pub fn routed(&self, worker: &Arc<Worker>, key: &RouteKey<'_>) -> Routed {
        self.policy.on_routed(worker, key);
        Routed {
            policy: self.policy.clone(),
            worker: worker.clone(),
            completed: false,
        }
    }

    /// The healthy workers (with those whose circuit is half-open, for
    /// their probe; never a draining one) not in `tried`; when every one has been tried, those
    /// tried longest ago (`tried` is in order): a failure is often
    /// transient or another worker's doing (a decode leg whose prefill
    /// worker died), the most recent one the likeliest to repeat, and the
    /// caller bounds the attempts.
    pub fn candidates(&self, tried: &[Arc<Worker>]) -> Vec<Arc<Worker>> {
        let healthy: Vec<Arc<Worker>> = self
            .snapshot()
            .iter()
            .filter(|w| (w.is_healthy() || w.is_half_open()) && !w.is_draining())
            .cloned()
            .collect();
        let untried: Vec<Arc<Worker>> = healthy
            .iter()
            .filter(|w| !tried.iter().any(|t| Arc::ptr_eq(t, w)))
            .cloned()
            .collect();
        if !untried.is_empty() {
            return untried;
        }
        let last_tried = |w: &Arc<Worker>| tried.iter().rposition(|t| Arc::ptr_eq(t, w));
        let oldest = healthy.iter().map(last_tried).min();
        healthy
            .into_iter()
            .filter(|w| last_tried(w) == oldest.flatten())
            .collect()
    }

    /// Adds a worker; returns false (and adds nothing) if its URL is
    /// already present.
    pub fn add(&self, worker: Arc<Worker>) -> bool {
        let mut guard = self.workers.write().unwrap_or_else(|p| p.into_inner());
        if guard.iter().any(|w| w.url == worker.url) {
            return false;
        }
        let mut next = guard.as_ref().clone();
        next.push(worker);
        *guard = Arc::new(next);
        true
    }

    /// Removes the worker with `url` (the policy is told); returns
    /// whether one was removed.
    pub fn remove(&self, url: &super::WorkerUrl) -> bool {
        self.remove_where(|w| &w.url == url)
    }

    /// Removes the worker with `id` (not another at its address that
    /// joined since); returns whether it was there.
    pub fn remove_id(&self, id: u64) -> bool {
        self.remove_where(|w| w.id == id)
    }

    /// Removes the workers `gone` picks (the policy is told of each).
    fn remove_where(&self, gone: impl Fn(&Worker) -> bool) -> bool {
        let removed: Vec<Arc<Worker>> = {
            let mut guard = self.workers.write().unwrap_or_else(|p| p.into_inner());
            let (gone, kept): (Vec<_>, Vec<_>) = guard.iter().cloned().partition(|w| gone(w));
            *guard = Arc::new(kept);
            gone
        };
        for worker in &removed {
            self.policy.on_removed(worker);
        }
        !removed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::workers::policy::PolicyKind;
    use crate::workers::WorkerUrl;

    fn pool(n: u16) -> Pool {
        let workers = (1..=n)
            .map(|p| {
                let url = WorkerUrl::parse(&format!("grpc://127.0.0.1:{p}")).unwrap();
                let w = Worker::new(url, Role::Decode, Duration::from_secs(1)).unwrap();
                w.set_healthy(true);
                w.breaker.set_open_period(Duration::from_millis(40));
                w
            })
            .collect();
        Pool::new(
            Role::Decode,
            workers,
            PolicyKind::LeastLoad.build(Default::default(), &Default::default()),
        )
    }

    fn key() -> RouteKey<'static> {
        RouteKey {
            cost: 1,
            ..RouteKey::default()
        }
    }

    /// Records what a policy is told of the requests it placed.
    #[derive(Default)]
    struct Recorder {
        ends: std::sync::Mutex<Vec<(String, bool)>>,
    }

    impl Policy for Recorder {
        fn pick(&self, _: &crate::workers::policy::Candidates<'_>) -> usize {
            0
        }

        fn on_completed(&self, worker: &Worker, completed: bool) {
            let mut ends = self.ends.lock().unwrap();
            ends.push((worker.url.to_string(), completed));
        }
    }

    /// The policy hears of each placed request's end once, when its
    /// placement is dropped: completed only when it was marked so.
    #[tokio::test]
    async fn a_policy_hears_how_each_request_it_placed_ended() {
        let recorder = Arc::new(Recorder::default());
        struct Shared(Arc<Recorder>);
        impl Policy for Shared {
            fn pick(&self, among: &crate::workers::policy::Candidates<'_>) -> usize {
                self.0.pick(among)
            }
            fn on_completed(&self, worker: &Worker, completed: bool) {
                self.0.on_completed(worker, completed)
            }
        }
        let workers = pool(2).snapshot().to_vec();
        let pool = Pool::new(Role::Decode, workers, Box::new(Shared(recorder.clone())));
        let worker = pool.pick(&key()).unwrap();
        let mut done = pool.routed(&worker, &key());
        let failed = pool.routed(&worker, &key());
        assert!(
            recorder.ends.lock().unwrap().is_empty(),
            "nothing ended yet"
        );
        drop(failed);
        done.complete();
        drop(done);
        let url = worker.url.to_string();
        assert_eq!(
            *recorder.ends.lock().unwrap(),
            [(url.clone(), false), (url, true)]
        );
    }

    /// A worker's suspects are offered only when no other is usable.
    #[tokio::test]
    async fn a_key_s_suspects_are_picked_last() {
        let pool = pool(2);
        let workers = pool.snapshot();
        let suspects = [workers[0].clone()];
        let key = RouteKey {
            suspects: &suspects,
            ..key()
        };
        for _ in 0..4 {
            assert!(Arc::ptr_eq(&pool.pick(&key).unwrap(), &workers[1]));
        }
        let all = [workers[0].clone(), workers[1].clone()];
        let key = RouteKey {
            suspects: &all,
            ..key
        };
        assert!(
            Arc::ptr_eq(&pool.pick(&key).unwrap(), &workers[0]),
            "tried longest ago"
        );
    }

    /// A worker whose circuit opened gets no request until its open period
    /// is over; then one probe, and its success puts it back in service.
    #[tokio::test]
    async fn an_open_circuit_gets_one_probe_after_its_period() {
        let pool = pool(2);
        let workers = pool.snapshot();
        let (broken, other) = (&workers[0], &workers[1]);
        assert!(broken.record_failure(1), "the circuit opens");
        for _ in 0..4 {
            let picked = pool.pick(&key()).unwrap();
            assert!(Arc::ptr_eq(&picked, other), "open: never picked");
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
        // The other worker is busy, so least-load picks the half-open one.
        let _busy = other.start_request();
        let probe = pool.pick(&key()).unwrap();
        assert!(Arc::ptr_eq(&probe, broken), "half-open: the probe");
        let next = pool.pick(&key()).unwrap();
        assert!(Arc::ptr_eq(&next, other), "one probe at a time");
        probe.record_success();
        assert!(
            broken.is_healthy(),
            "the probe's success closes the circuit"
        );
    }

    /// Once every worker was tried, the one tried longest ago goes first.
    #[tokio::test]
    async fn after_trying_every_worker_the_earliest_tried_comes_back_first() {
        let pool = pool(3);
        let w = pool.snapshot();
        let tried = [w[1].clone(), w[0].clone(), w[2].clone(), w[0].clone()];
        let again = pool.candidates(&tried);
        assert_eq!(again.len(), 1);
        assert!(Arc::ptr_eq(&again[0], &w[1]), "w[1] was tried first");
        assert_eq!(pool.candidates(&tried[..1]).len(), 2, "untried ones first");
    }

    /// A draining worker is never picked, nor counted in service; the
    /// others are.
    #[tokio::test]
    async fn a_draining_worker_is_not_picked() {
        let pool = pool(2);
        let workers = pool.snapshot();
        assert!(workers[0].drain(), "draining now");
        assert!(!workers[0].drain(), "already draining");
        assert_eq!(pool.healthy_count(), 1);
        for _ in 0..4 {
            assert!(Arc::ptr_eq(&pool.pick(&key()).unwrap(), &workers[1]));
        }
        assert!(workers[1].drain());
        assert!(pool.pick(&key()).is_none(), "nothing left to pick");
        assert_eq!(pool.snapshot().len(), 2, "both still listed");
    }

    /// A removed worker leaves the pool and the policy is told.
    #[tokio::test]
    async fn removing_a_worker_takes_it_out_of_the_picks() {
        let pool = pool(2);
        let gone = pool.snapshot()[0].url.clone();
        assert!(pool.remove(&gone));
        assert!(!pool.remove(&gone));
        let other = pool.snapshot()[0].clone();
        assert!(!pool.remove_id(other.id + 1000), "no such id");
        assert!(pool.remove_id(other.id));
        assert!(pool.snapshot().is_empty());
        assert!(pool.add(other));
        for _ in 0..4 {
            assert_ne!(pool.pick(&key()).unwrap().url, gone);
        }
    }
}
