//! Kubernetes service discovery: with `--service-discovery`, each role
//! that has a label selector (`--selector` for aggregated workers,
//! `--encode-selector`, `--prefill-selector`, `--decode-selector`) gets a
//! watcher over the pods of one namespace. Ready pods with an IP join the
//! role's pool as workers ([`tracker`]), at the address their annotations
//! give ([`pod`]); they leave it when they lose readiness or are deleted.
//! From then on they are ordinary workers: health checks, policies and
//! circuit breakers treat them like configured ones. With
//! `--service-discovery-model-label KEY` a pod must also carry `KEY=<the
//! model's served name>`: the same role selectors then sort the pods of
//! several models (one configuration file) by model as well as role.
//!
//! The watcher (kube-runtime) lists the pods, then watches from the
//! list's resource version; when the watch expires (410 Gone) it lists
//! again, and the tracker drops the pods that list no longer has.

pub mod pod;
pub mod tracker;

use std::sync::Arc;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::workers::worker::Connect;
use crate::workers::{Pool, Role};
use pod::{PodRules, Selector, LWS_WORKER_INDEX_LABEL};
use tracker::Tracker;

/// What `--service-discovery` watches.
#[derive(Debug, Clone)]
pub struct Discovery {
    /// `None`: the client's default (in a pod, the pod's own namespace).
    pub namespace: Option<String>,
    /// The label selector of each discovered role.
    pub roles: Vec<(Role, Selector)>,
    pub rules: PodRules,
    /// The label whose value names a pod's model
    /// (`--service-discovery-model-label`).
    pub model_label: Option<String>,
    /// The model whose pods are watched ([`Discovery::for_model`]).
    pub model: Option<String>,
}

impl Discovery {
    /// Its watchers for the pods of `model` (with a model label: the
    /// pods labelled with it).
    pub fn for_model(&self, model: &str) -> Discovery {
        Discovery {
            model: Some(model.to_owned()),
            ..self.clone()
        }
    }

    /// Whether pods of `role` are discovered.
    pub fn watches(&self, role: Role) -> bool {
        self.roles.iter().any(|(r, _)| *r == role)
    }

    /// Starts the watchers with the in-cluster (or kubeconfig) client.
    pub async fn start(
        &self,
        pools: &[Arc<Pool>],
        connect: impl Into<Connect>,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        self.role_pools(pools)?;
        let client = Client::try_default()
            .await
            .context("service discovery: no Kubernetes API access (in-cluster service account or kubeconfig)")?;
        self.spawn(client, pools, connect, stop)?;
        Ok(())
    }

    /// Starts one watcher per discovered role with `client`; each feeds
    /// the pool of its role until `stop` is cancelled.
    pub fn spawn(
        &self,
        client: Client,
        pools: &[Arc<Pool>],
        connect: impl Into<Connect>,
        stop: CancellationToken,
    ) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
        let connect = connect.into();
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        let tasks = self
            .role_pools(pools)?
            .into_iter()
            .map(|(pool, selector)| {
                tracing::info!(role = pool.role.as_str(), %namespace, %selector, "watching pods");
                let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
                let tracker = Tracker::new(pool, self.rules, connect.clone());
                tokio::spawn(watch(api, selector, tracker, stop.clone()))
            })
            .collect();
        Ok(tasks)
    }

    /// Each discovered role's pool and API selector; an error when the
    /// mode has no pool for a role that has a selector.
    pub fn role_pools(&self, pools: &[Arc<Pool>]) -> anyhow::Result<Vec<(Arc<Pool>, String)>> {
        self.roles
            .iter()
            .map(|(role, selector)| {
                let pool = pools.iter().find(|p| p.role == *role).with_context(|| {
                    format!(
                        "{} has a label selector, but the mode routes to no {} workers ({})",
                        role.as_str(),
                        role.as_str(),
                        mode_hint(*role)
                    )
                })?;
                Ok((pool.clone(), self.server_selector(selector)))
            })
            .collect()
    }

    /// The selector sent to the API server (leaders only: filtered there
    /// too; with a model label, the model's pods only).
    fn server_selector(&self, selector: &Selector) -> String {
        let selector = match (&self.model_label, &self.model) {
            (Some(label), Some(model)) => selector.clone().with(label, model),
            _ => selector.clone(),
        };
        let selector = if self.rules.leaders_only {
            selector.with(LWS_WORKER_INDEX_LABEL, "0")
        } else {
            selector
        };
        selector.to_query()
    }
}

fn mode_hint(role: Role) -> &'static str {
    match role {
        Role::Aggregated => "--selector is for aggregated mode",
        Role::Encode => "--encode-selector needs --epd-disaggregation",
        Role::Prefill | Role::Decode => {
            "--prefill-selector and --decode-selector need --pd-disaggregation or --epd-disaggregation"
        }
    }
}

/// Feeds `tracker` from a pod watcher until `stop` is cancelled. Errors
/// (API unreachable, watch expired) are logged; the watcher retries with
/// backoff and lists again where needed.
async fn watch(api: Api<Pod>, selector: String, mut tracker: Tracker, stop: CancellationToken) {
    let config = watcher::Config::default().labels(&selector);
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            Some(Ok(event)) => tracker.handle(event),
            Some(Err(why)) => {
                tracing::warn!(%selector, error = %why, "pod watch failed; retrying")
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::policy::PolicyKind;

    fn discovery(flags: &[&str]) -> Discovery {
        let args: crate::args::DiscoveryArgs = iris_testkit::args::parse(flags.iter().copied());
        crate::config::discovery(&args)
            .unwrap()
            .expect("discovery is on")
    }

    fn selectors(discovery: &Discovery) -> Vec<(Role, String)> {
        let pools: Vec<Arc<Pool>> = [Role::Prefill, Role::Decode]
            .into_iter()
            .map(|role| {
                let policy = PolicyKind::RoundRobin.build(Default::default(), &Default::default());
                Arc::new(Pool::new(role, Vec::new(), policy))
            })
            .collect();
        let found = discovery.role_pools(&pools).unwrap();
        found.into_iter().map(|(p, s)| (p.role, s)).collect()
    }

    /// With a model label each model's watchers select its pods by role
    /// and by model; without one, by role alone.
    #[test]
    fn a_model_label_keys_the_selectors_by_model_as_well_as_role() {
        let flags = [
            "--service-discovery",
            "--prefill-selector",
            "app=iris,iris.ai/role=prefill",
            "--decode-selector",
            "app=iris,iris.ai/role=decode",
        ];
        let plain = discovery(&flags);
        assert_eq!(
            selectors(&plain.for_model("qwen")),
            [
                (Role::Prefill, "app=iris,iris.ai/role=prefill".to_owned()),
                (Role::Decode, "app=iris,iris.ai/role=decode".to_owned()),
            ]
        );
        let keyed = discovery(
            &[
                &flags[..],
                &["--service-discovery-model-label", "iris.ai/model"],
            ]
            .concat(),
        );
        assert_eq!(
            selectors(&keyed.for_model("qwen")),
            [
                (
                    Role::Prefill,
                    "app=iris,iris.ai/role=prefill,iris.ai/model=qwen".to_owned()
                ),
                (
                    Role::Decode,
                    "app=iris,iris.ai/role=decode,iris.ai/model=qwen".to_owned()
                ),
            ]
        );
        assert_eq!(
            selectors(&keyed.for_model("gemma"))[1].1,
            "app=iris,iris.ai/role=decode,iris.ai/model=gemma"
        );
        let bad = crate::config::discovery(&iris_testkit::args::parse::<
            crate::args::DiscoveryArgs,
            _,
        >([
            "--service-discovery",
            "--selector",
            "a=b",
            "--service-discovery-model-label",
            "a=b",
        ]));
        let error = bad.expect_err("a bad key").to_string();
        assert!(error.contains("--service-discovery-model-label"), "{error}");
    }
}
