//! What a pod means for the gateway: whether it serves (Ready, with an
//! IP, a LeaderWorkerSet leader when only leaders are wanted) and at which
//! address, from its IP and the `iris.ai/…` annotations. Also the label
//! selectors that pick a role's pods.

use k8s_openapi::api::core::v1::Pod;

use crate::workers::WorkerUrl;

/// Pod annotation: the worker's gRPC port (default: `--service-discovery-port`).
pub const GRPC_PORT_ANNOTATION: &str = "iris.ai/grpc-port";
/// Pod annotation: the worker's data server (bootstrap) port, for encode
/// and prefill workers (default: the protocol's, 8998).
pub const BOOTSTRAP_PORT_ANNOTATION: &str = "iris.ai/bootstrap-port";
/// Pod annotation: the multimodal tensor transport this worker uses
/// instead of the gateway's (`inline`, `shm`, `rdma` or `auto`).
pub const TENSOR_TRANSPORT_ANNOTATION: &str = "iris.ai/tensor-transport";
/// Pod annotation: the worker's backend (`tokenspeed`, `vllm` or
/// `sglang`); detected from the service that answers when absent.
pub const BACKEND_ANNOTATION: &str = "iris.ai/backend";
/// The values [`TENSOR_TRANSPORT_ANNOTATION`] accepts.
pub const TENSOR_TRANSPORTS: [&str; 4] = ["inline", "shm", "rdma", "auto"];
/// The LeaderWorkerSet label numbering the pods of a group (0: the leader).
pub const LWS_WORKER_INDEX_LABEL: &str = "leaderworkerset.sigs.k8s.io/worker-index";

/// A label selector: `key=value` pairs a pod must all carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector(Vec<(String, String)>);

impl Selector {
    /// Parses `key=value` items (as given to `--selector` and friends).
    pub fn parse(items: &[String]) -> Result<Selector, String> {
        let pairs = items
            .iter()
            .map(|item| item.trim())
            .filter(|item| !item.is_empty())
            .map(parse_pair)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Selector(pairs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The selector with one more required label.
    pub fn with(mut self, key: &str, value: &str) -> Selector {
        if !self.0.iter().any(|(k, v)| k == key && v == value) {
            self.0.push((key.to_owned(), value.to_owned()));
        }
        self
    }

    /// The `labelSelector` query value, e.g. `app=iris,role=decode`.
    pub fn to_query(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn parse_pair(item: &str) -> Result<(String, String), String> {
    let (key, value) = item
        .split_once('=')
        .ok_or_else(|| format!("selector {item:?} must be key=value"))?;
    let (key, value) = (key.trim(), value.trim());
    let bad = |s: &str| s.contains(['=', '!', ',', ' ', '(', ')']);
    if key.is_empty() || bad(key) || bad(value) {
        return Err(format!(
            "selector {item:?} must be key=value (label equality only)"
        ));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// How pods become worker addresses.
#[derive(Debug, Clone, Copy)]
pub struct PodRules {
    /// gRPC port when the pod has no [`GRPC_PORT_ANNOTATION`].
    pub default_port: u16,
    /// Only pods whose [`LWS_WORKER_INDEX_LABEL`] is `0`.
    pub leaders_only: bool,
}

/// The worker a pod is now: `Ok(None)` while it does not serve (not
/// Ready, no IP yet, terminating, not a leader); `Err` when its
/// annotations are invalid.
pub fn worker_url(pod: &Pod, rules: &PodRules) -> Result<Option<WorkerUrl>, String> {
    if rules.leaders_only && label(pod, LWS_WORKER_INDEX_LABEL) != Some("0") {
        return Ok(None);
    }
    if pod.metadata.deletion_timestamp.is_some() || !is_ready(pod) {
        return Ok(None);
    }
    let Some(ip) = pod_ip(pod) else {
        return Ok(None);
    };
    let port = port_annotation(pod, GRPC_PORT_ANNOTATION)?.unwrap_or(rules.default_port);
    Ok(Some(WorkerUrl {
        host: ip.to_owned(),
        port,
        // Dialled by pod IP, which no stable certificate names.
        tls: false,
        bootstrap_port: port_annotation(pod, BOOTSTRAP_PORT_ANNOTATION)?,
        tensor_transport: transport_annotation(pod)?,
        backend: annotation(pod, BACKEND_ANNOTATION)
            .map(|value| {
                value
                    .parse()
                    .map_err(|e| format!("annotation {BACKEND_ANNOTATION}: {e}"))
            })
            .transpose()?,
    }))
}

/// `namespace/name`, how the gateway names a pod in its logs and state.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether the pod's `Ready` condition is `True`.
fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

fn pod_ip(pod: &Pod) -> Option<&str> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .filter(|ip| !ip.is_empty())
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(|v| v.trim())
}

fn port_annotation(pod: &Pod, key: &str) -> Result<Option<u16>, String> {
    let Some(value) = annotation(pod, key) else {
        return Ok(None);
    };
    value
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .map(Some)
        .ok_or_else(|| format!("annotation {key}={value:?} is not a port (1-65535)"))
}

fn transport_annotation(pod: &Pod) -> Result<Option<String>, String> {
    let Some(value) = annotation(pod, TENSOR_TRANSPORT_ANNOTATION) else {
        return Ok(None);
    };
    if TENSOR_TRANSPORTS.contains(&value) {
        Ok(Some(value.to_owned()))
    } else {
        Err(format!(
            "annotation {TENSOR_TRANSPORT_ANNOTATION}={value:?} is not one of {}",
            TENSOR_TRANSPORTS.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn ready_pod(annotations: serde_json::Value, labels: serde_json::Value) -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": annotations, "labels": labels},
            "status": {"podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "True"}]},
        }))
    }

    const RULES: PodRules = PodRules {
        default_port: 30000,
        leaders_only: false,
    };

    #[test]
    fn ready_pod_with_annotations() {
        let p = ready_pod(
            serde_json::json!({GRPC_PORT_ANNOTATION: "31000", BOOTSTRAP_PORT_ANNOTATION: "9000", TENSOR_TRANSPORT_ANNOTATION: "rdma"}),
            serde_json::json!({}),
        );
        let url = worker_url(&p, &RULES).unwrap().unwrap();
        assert_eq!(url.to_string(), "grpc://10.1.2.3:31000");
        assert_eq!(url.bootstrap_port, Some(9000));
        assert_eq!(url.tensor_transport.as_deref(), Some("rdma"));
        assert_eq!(url.backend, None);
        assert_eq!(pod_key(&p), "ns/p");
    }

    #[test]
    fn backend_annotation() {
        let p = ready_pod(
            serde_json::json!({BACKEND_ANNOTATION: " vllm "}),
            serde_json::json!({}),
        );
        let url = worker_url(&p, &RULES).unwrap().unwrap();
        assert_eq!(url.backend, Some(crate::backends::Backend::Vllm));
        let bad = ready_pod(
            serde_json::json!({BACKEND_ANNOTATION: "trt"}),
            serde_json::json!({}),
        );
        let err = worker_url(&bad, &RULES).unwrap_err();
        assert!(
            err.contains(BACKEND_ANNOTATION) && err.contains("trt"),
            "{err}"
        );
    }

    #[test]
    fn defaults_without_annotations() {
        let p = ready_pod(serde_json::json!({}), serde_json::json!({}));
        let url = worker_url(&p, &RULES).unwrap().unwrap();
        assert_eq!((url.port, url.bootstrap_port), (30000, None));
        assert_eq!(url.tensor_transport, None);
    }

    #[test]
    fn not_serving_until_ready_with_an_ip() {
        let no_ip = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }));
        let not_ready = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "False"}]},
        }));
        let no_status = pod(serde_json::json!({"metadata": {"name": "p"}}));
        let terminating = pod(serde_json::json!({
            "metadata": {"name": "p", "deletionTimestamp": "2025-01-01T00:00:00Z"},
            "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
        }));
        for p in [no_ip, not_ready, no_status, terminating] {
            assert_eq!(worker_url(&p, &RULES).unwrap(), None);
        }
    }

    #[test]
    fn invalid_annotations_are_errors() {
        for (key, value) in [
            (GRPC_PORT_ANNOTATION, "0"),
            (GRPC_PORT_ANNOTATION, "http"),
            (BOOTSTRAP_PORT_ANNOTATION, "70000"),
            (TENSOR_TRANSPORT_ANNOTATION, "carrier-pigeon"),
        ] {
            let p = ready_pod(serde_json::json!({key: value}), serde_json::json!({}));
            let err = worker_url(&p, &RULES).unwrap_err();
            assert!(err.contains(key), "{err}");
        }
    }

    #[test]
    fn leaders_only_keeps_worker_index_zero() {
        let rules = PodRules {
            leaders_only: true,
            ..RULES
        };
        let leader = ready_pod(
            serde_json::json!({}),
            serde_json::json!({LWS_WORKER_INDEX_LABEL: "0"}),
        );
        let follower = ready_pod(
            serde_json::json!({}),
            serde_json::json!({LWS_WORKER_INDEX_LABEL: "1"}),
        );
        let plain = ready_pod(serde_json::json!({}), serde_json::json!({}));
        assert!(worker_url(&leader, &rules).unwrap().is_some());
        assert_eq!(worker_url(&follower, &rules).unwrap(), None);
        assert_eq!(worker_url(&plain, &rules).unwrap(), None);
        assert!(worker_url(&follower, &RULES).unwrap().is_some());
    }

    #[test]
    fn selectors() {
        let items = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let s = Selector::parse(&items(&["app=iris", " iris.ai/role = decode "])).unwrap();
        assert_eq!(s.to_query(), "app=iris,iris.ai/role=decode");
        assert_eq!(
            s.with(LWS_WORKER_INDEX_LABEL, "0").to_query(),
            "app=iris,iris.ai/role=decode,leaderworkerset.sigs.k8s.io/worker-index=0"
        );
        assert!(Selector::parse(&items(&[])).unwrap().is_empty());
        for bad in ["app", "=x", "app!=x", "app==x", "a b=c"] {
            assert!(Selector::parse(&items(&[bad])).is_err(), "{bad}");
        }
    }
}
