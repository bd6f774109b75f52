//! Keeps one role's pool in step with the pods a watcher reports: a pod
//! that serves joins the pool as a worker, one that stops serving (lost
//! readiness, deleted, or missing from a re-list) leaves it. Workers the
//! pool already had (configured on the command line) are never removed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;

use super::pod::{pod_key, worker_url, PodRules};
use crate::workers::worker::Connect;
use crate::workers::{Pool, Worker, WorkerUrl};

/// The discovered workers of one pool.
pub struct Tracker {
    pool: Arc<Pool>,
    rules: PodRules,
    connect: Connect,
    /// The address each serving pod has now, by `namespace/name`.
    pods: HashMap<String, WorkerUrl>,
    /// The addresses this tracker added to the pool.
    added: HashSet<WorkerUrl>,
    /// The pods seen so far in a re-list under way.
    relisting: Option<HashSet<String>>,
}

impl Tracker {
    pub fn new(pool: Arc<Pool>, rules: PodRules, connect: impl Into<Connect>) -> Self {
        Tracker {
            pool,
            rules,
            connect: connect.into(),
            pods: HashMap::new(),
            added: HashSet::new(),
            relisting: None,
        }
    }

    /// Applies one watcher event.
    pub fn handle(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => self.relisting = Some(HashSet::new()),
            Event::InitApply(pod) => {
                if let Some(seen) = self.relisting.as_mut() {
                    seen.insert(pod_key(&pod));
                }
                self.apply(&pod);
            }
            Event::InitDone => self.finish_relist(),
            Event::Apply(pod) => self.apply(&pod),
            Event::Delete(pod) => self.forget(&pod_key(&pod), "deleted"),
        }
    }

    /// Brings a pod's worker in line with what the pod is now.
    fn apply(&mut self, pod: &Pod) {
        let key = pod_key(pod);
        let wanted = match worker_url(pod, &self.rules) {
            Ok(wanted) => wanted,
            Err(why) => {
                tracing::warn!(pod = %key, role = self.pool.role.as_str(), %why, "pod ignored");
                None
            }
        };
        if self.pods.get(&key) == wanted.as_ref() {
            return;
        }
        self.forget(&key, "not serving");
        if let Some(url) = wanted {
            self.track(key, url);
        }
    }

    /// Drops the pods a finished re-list no longer has.
    fn finish_relist(&mut self) {
        let Some(seen) = self.relisting.take() else {
            return;
        };
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.forget(&key, "gone after re-list");
        }
    }

    fn track(&mut self, key: String, url: WorkerUrl) {
        if !self.added.contains(&url) {
            let worker = match Worker::new(url.clone(), self.pool.role, self.connect.clone()) {
                Ok(worker) => worker,
                Err(why) => {
                    tracing::warn!(pod = %key, %why, "discovered worker cannot be used");
                    return;
                }
            };
            if self.pool.add(worker) {
                tracing::info!(pod = %key, role = self.pool.role.as_str(), worker = %url, "discovered worker joins the pool");
                self.added.insert(url.clone());
            } else {
                tracing::info!(pod = %key, worker = %url, "discovered worker is already configured");
            }
        }
        self.pods.insert(key, url);
    }

    fn forget(&mut self, key: &str, why: &str) {
        let Some(url) = self.pods.remove(key) else {
            return;
        };
        let still_used = self.pods.values().any(|u| u == &url);
        if !still_used && self.added.remove(&url) && self.pool.remove(&url) {
            tracing::info!(pod = %key, role = self.pool.role.as_str(), worker = %url, why, "worker leaves the pool");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::Role;
    use std::time::Duration;

    fn pod(name: &str, ip: &str, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns"},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    fn setup(configured: &[&str]) -> (Arc<Pool>, Tracker) {
        let workers = configured
            .iter()
            .map(|u| {
                Worker::new(
                    WorkerUrl::parse(u).unwrap(),
                    Role::Decode,
                    Duration::from_secs(1),
                )
                .unwrap()
            })
            .collect();
        let pool = Arc::new(Pool::new(
            Role::Decode,
            workers,
            crate::workers::policy::PolicyKind::RoundRobin
                .build(Default::default(), &Default::default()),
        ));
        let rules = PodRules {
            default_port: 30000,
            leaders_only: false,
        };
        let tracker = Tracker::new(pool.clone(), rules, Duration::from_secs(1));
        (pool, tracker)
    }

    fn hosts(pool: &Pool) -> Vec<String> {
        let mut hosts: Vec<String> = pool.snapshot().iter().map(|w| w.url.to_string()).collect();
        hosts.sort();
        hosts
    }

    #[tokio::test]
    async fn pods_join_and_leave() {
        let (pool, mut t) = setup(&[]);
        t.handle(Event::Apply(pod("a", "10.0.0.1", false)));
        assert!(hosts(&pool).is_empty());
        t.handle(Event::Apply(pod("a", "10.0.0.1", true)));
        t.handle(Event::Apply(pod("b", "10.0.0.2", true)));
        assert_eq!(
            hosts(&pool),
            ["grpc://10.0.0.1:30000", "grpc://10.0.0.2:30000"]
        );
        t.handle(Event::Apply(pod("a", "10.0.0.1", false)));
        assert_eq!(hosts(&pool), ["grpc://10.0.0.2:30000"]);
        t.handle(Event::Delete(pod("b", "10.0.0.2", true)));
        assert!(hosts(&pool).is_empty());
    }

    #[tokio::test]
    async fn relist_drops_pods_it_no_longer_sees() {
        let (pool, mut t) = setup(&[]);
        t.handle(Event::Apply(pod("a", "10.0.0.1", true)));
        t.handle(Event::Apply(pod("b", "10.0.0.2", true)));
        t.handle(Event::Init);
        t.handle(Event::InitApply(pod("b", "10.0.0.2", true)));
        assert_eq!(
            hosts(&pool).len(),
            2,
            "nothing leaves before the re-list ends"
        );
        t.handle(Event::InitDone);
        assert_eq!(hosts(&pool), ["grpc://10.0.0.2:30000"]);
    }

    #[tokio::test]
    async fn configured_workers_stay_and_shared_addresses_are_counted() {
        let (pool, mut t) = setup(&["grpc://10.0.0.1:30000"]);
        t.handle(Event::Apply(pod("a", "10.0.0.1", true)));
        t.handle(Event::Delete(pod("a", "10.0.0.1", true)));
        assert_eq!(hosts(&pool), ["grpc://10.0.0.1:30000"]);
        t.handle(Event::Apply(pod("b", "10.0.0.9", true)));
        t.handle(Event::Apply(pod("c", "10.0.0.9", true)));
        t.handle(Event::Delete(pod("b", "10.0.0.9", true)));
        assert_eq!(hosts(&pool).len(), 2, "c still serves at that address");
        t.handle(Event::Delete(pod("c", "10.0.0.9", true)));
        assert_eq!(hosts(&pool), ["grpc://10.0.0.1:30000"]);
    }
}
