//! Kubernetes service discovery against a fake API server in this process:
//! it serves `GET /api/v1/namespaces/{ns}/pods` as a list (with a resource
//! version) and as a streaming watch (`watch=true`) from a resource
//! version, filters by label selector, and can expire every watch with
//! 410 Gone. Pods appear, become ready, lose readiness and are deleted;
//! each role selector feeds its own pool; annotations give the ports; an
//! expired watch makes the gateway list again and drop what vanished;
//! a whole gateway serves chat through a discovered reference engine; an
//! EPD gateway asks a discovered encode pod annotated rdma for that lane.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use iris_gateway::args::DiscoveryArgs;
use iris_gateway::PolicyKind;
use iris_gateway::RdmaLane;
use iris_gateway::{Pool, Role};
use iris_transport::Transport;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// The namespace the fake server has; any other is 404.
const NAMESPACE: &str = "iris";

/// One recorded change: its resource version, watch event type and pod.
type Change = (u64, &'static str, Value);

#[derive(Default)]
struct Store {
    version: u64,
    pods: BTreeMap<String, Value>,
    changes: Vec<Change>,
    /// Watches from an older resource version get 410 Gone.
    oldest: u64,
    /// Bumped to end every open watch with 410 Gone.
    expiry: u64,
    lists: usize,
}

/// The fake API server's state, shared with its handlers.
#[derive(Clone)]
struct FakeApi {
    store: Arc<Mutex<Store>>,
    /// Signals every change (and expiry) to open watches.
    bell: watch::Sender<u64>,
}

impl FakeApi {
    fn new() -> Self {
        FakeApi {
            store: Arc::default(),
            bell: watch::channel(0).0,
        }
    }

    fn with_store<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut store)
    }

    /// Creates or updates a pod (recorded as a watch event).
    fn put(&self, pod: Value) {
        self.change(pod, true);
    }

    /// Deletes a pod (recorded as a watch event).
    fn delete(&self, name: &str) {
        let pod = self.with_store(|s| s.pods.get(name).cloned());
        if let Some(pod) = pod {
            self.change(pod, false);
        }
    }

    fn change(&self, mut pod: Value, present: bool) {
        let version = self.with_store(|s| {
            s.version += 1;
            pod["metadata"]["resourceVersion"] = json!(s.version.to_string());
            let name = pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let kind = match (present, s.pods.contains_key(&name)) {
                (false, _) => {
                    s.pods.remove(&name);
                    "DELETED"
                }
                (true, true) => "MODIFIED",
                (true, false) => "ADDED",
            };
            if present {
                s.pods.insert(name, pod.clone());
            }
            s.changes.push((s.version, kind, pod));
            s.version
        });
        self.bell.send_replace(version);
    }

    /// Compacts history and expires every watch: changes made by `quietly`
    /// reach clients only through a new list.
    fn expire(&self, quietly: impl FnOnce(&mut BTreeMap<String, Value>)) {
        let version = self.with_store(|s| {
            quietly(&mut s.pods);
            s.version += 1;
            s.oldest = s.version;
            s.changes.clear();
            s.expiry += 1;
            s.version
        });
        self.bell.send_replace(version);
    }

    fn lists(&self) -> usize {
        self.with_store(|s| s.lists)
    }

    async fn serve(self) -> SocketAddr {
        let app = axum::Router::new()
            .route("/api/v1/namespaces/{ns}/pods", axum::routing::get(pods))
            .with_state(self);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }
}

async fn pods(State(api): State<FakeApi>, Path(ns): Path<String>, uri: Uri) -> Response {
    if ns != NAMESPACE {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(status_json(404, "NotFound", "no such namespace")),
        )
            .into_response();
    }
    let query = parse_query(uri.query().unwrap_or_default());
    let selector = query.get("labelSelector").cloned().unwrap_or_default();
    if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
        let from = query
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        return watch_response(api, selector, from);
    }
    let body = api.with_store(|s| {
        s.lists += 1;
        let items: Vec<&Value> = s.pods.values().filter(|p| matches(p, &selector)).collect();
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": s.version.to_string()}, "items": items})
    });
    axum::Json(body).into_response()
}

/// Streams the changes after `from` matching `selector`, then new ones as
/// they come, until the watch expires (410 Gone as an ERROR event).
fn watch_response(api: FakeApi, selector: String, from: u64) -> Response {
    let (tx, rx) = mpsc::channel::<Result<String, std::io::Error>>(64);
    tokio::spawn(async move {
        let mut bell = api.bell.subscribe();
        let mut cursor = from;
        let expiry = api.with_store(|s| s.expiry);
        loop {
            let (events, gone) = api.with_store(|s| {
                let gone = from < s.oldest || s.expiry != expiry;
                let events: Vec<Change> = s
                    .changes
                    .iter()
                    .filter(|(v, _, pod)| *v > cursor && matches(pod, &selector))
                    .cloned()
                    .collect();
                (events, gone)
            });
            if gone {
                let status = status_json(410, "Expired", "too old resource version");
                let _ = tx
                    .send(Ok(format!(
                        "{}\n",
                        json!({"type": "ERROR", "object": status})
                    )))
                    .await;
                return;
            }
            for (version, kind, pod) in events {
                cursor = version;
                let line = format!("{}\n", json!({"type": kind, "object": pod}));
                if tx.send(Ok(line)).await.is_err() {
                    return;
                }
            }
            if bell.changed().await.is_err() {
                return;
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    ([("content-type", "application/json")], body).into_response()
}

fn status_json(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

/// Equality-based label selectors, as the gateway sends them.
fn matches(pod: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        pod["metadata"]["labels"][key].as_str() == Some(value)
    })
}

fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (percent_decode(k), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A pod in the fake namespace.
fn pod(name: &str, ip: &str, ready: bool, labels: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}"), "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "worker", "image": "iris/engine"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

fn role_pod(name: &str, ip: &str, ready: bool, role: &str) -> Value {
    pod(
        name,
        ip,
        ready,
        json!({"app": "iris", "iris.ai/role": role}),
        json!({}),
    )
}

/// A gateway-side view: the pools, and discovery running against `api`.
struct Gateway {
    pools: Vec<Arc<Pool>>,
    stop: CancellationToken,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Gateway {
    /// Starts discovery for the pools of `roles` with the `iris serve`
    /// flags `flags`; the client's default namespace is `default_ns`.
    async fn start(addr: SocketAddr, roles: &[Role], flags: &[&str], default_ns: &str) -> Gateway {
        let args: DiscoveryArgs = iris_testkit::args::parse(flags.iter().copied());
        let discovery = iris_gateway::config::discovery(&args)
            .unwrap()
            .expect("discovery is on");
        let pools: Vec<Arc<Pool>> = roles
            .iter()
            .map(|r| {
                Arc::new(Pool::new(
                    *r,
                    Vec::new(),
                    PolicyKind::RoundRobin.build(Default::default(), &Default::default()),
                ))
            })
            .collect();
        let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        config.default_namespace = default_ns.to_owned();
        let client = kube::Client::try_from(config).unwrap();
        let stop = CancellationToken::new();
        discovery
            .spawn(client, &pools, Duration::from_secs(1), stop.clone())
            .unwrap();
        Gateway { pools, stop }
    }

    /// The workers of `role`'s pool as `grpc://ip:port`, sorted.
    fn workers(&self, role: Role) -> Vec<String> {
        let pool = self.pools.iter().find(|p| p.role == role).unwrap();
        let mut urls: Vec<String> = pool.snapshot().iter().map(|w| w.url.to_string()).collect();
        urls.sort();
        urls
    }

    /// Waits (bounded) until `role`'s workers are `expected`.
    async fn expect(&self, role: Role, expected: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let now = self.workers(role);
            if now == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} workers: {now:?}, expected {expected:?}",
                role.as_str()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn pods_join_when_ready_and_leave_on_lost_readiness_or_deletion() {
    let api = FakeApi::new();
    api.put(pod(
        "w0",
        "10.0.0.1",
        true,
        json!({"app": "iris"}),
        json!({}),
    ));
    api.put(pod(
        "other",
        "10.0.0.9",
        true,
        json!({"app": "else"}),
        json!({}),
    ));
    let addr = api.clone().serve().await;
    let gw = Gateway::start(
        addr,
        &[Role::Aggregated],
        &["--service-discovery", "--selector", "app=iris"],
        NAMESPACE,
    )
    .await;
    gw.expect(Role::Aggregated, &["grpc://10.0.0.1:30000"])
        .await;

    // A new pod joins only once it is Ready; its annotation gives the port.
    let annotated = |ready| {
        pod(
            "w1",
            "10.0.0.2",
            ready,
            json!({"app": "iris"}),
            json!({"iris.ai/grpc-port": "31000"}),
        )
    };
    api.put(annotated(false));
    tokio::time::sleep(Duration::from_millis(200)).await;
    gw.expect(Role::Aggregated, &["grpc://10.0.0.1:30000"])
        .await;
    api.put(annotated(true));
    gw.expect(
        Role::Aggregated,
        &["grpc://10.0.0.1:30000", "grpc://10.0.0.2:31000"],
    )
    .await;

    // Losing readiness takes it out; deletion too.
    api.put(annotated(false));
    gw.expect(Role::Aggregated, &["grpc://10.0.0.1:30000"])
        .await;
    api.delete("w0");
    gw.expect(Role::Aggregated, &[]).await;
    api.put(annotated(true));
    gw.expect(Role::Aggregated, &["grpc://10.0.0.2:31000"])
        .await;
    assert_eq!(api.lists(), 1, "no re-list without an expired watch");
}

#[tokio::test]
async fn role_selectors_feed_their_pools_with_annotated_ports() {
    let api = FakeApi::new();
    let encode = pod(
        "enc-0",
        "10.1.0.1",
        true,
        json!({"app": "iris", "iris.ai/role": "encode"}),
        json!({"iris.ai/grpc-port": "30100", "iris.ai/bootstrap-port": "8999", "iris.ai/tensor-transport": "shm"}),
    );
    let prefill = pod(
        "pre-0",
        "10.1.0.2",
        true,
        json!({"app": "iris", "iris.ai/role": "prefill"}),
        json!({"iris.ai/bootstrap-port": "9000"}),
    );
    api.put(encode);
    api.put(prefill);
    api.put(role_pod("dec-0", "10.1.0.3", true, "decode"));
    let addr = api.clone().serve().await;
    let flags = [
        "--service-discovery",
        "--service-discovery-namespace",
        NAMESPACE,
        "--encode-selector",
        "app=iris,iris.ai/role=encode",
        "--prefill-selector",
        "app=iris",
        "--prefill-selector",
        "iris.ai/role=prefill",
        "--decode-selector",
        "iris.ai/role=decode",
    ];
    let gw = Gateway::start(
        addr,
        &[Role::Encode, Role::Prefill, Role::Decode],
        &flags,
        "default",
    )
    .await;
    gw.expect(Role::Encode, &["grpc://10.1.0.1:30100"]).await;
    gw.expect(Role::Prefill, &["grpc://10.1.0.2:30000"]).await;
    gw.expect(Role::Decode, &["grpc://10.1.0.3:30000"]).await;

    let worker =
        |role: Role| gw.pools.iter().find(|p| p.role == role).unwrap().snapshot()[0].clone();
    let encoder = worker(Role::Encode);
    assert_eq!(encoder.url.bootstrap_port, Some(8999));
    assert_eq!(encoder.url.tensor_transport.as_deref(), Some("shm"));
    assert_eq!(encoder.role, Role::Encode);
    assert_eq!(
        worker(Role::Prefill).data_server(),
        ("10.1.0.2".to_owned(), 9000)
    );
    assert!(
        !encoder.is_healthy(),
        "discovered workers wait for their health checks"
    );

    // A second decode pod scales that role alone.
    api.put(role_pod("dec-1", "10.1.0.4", true, "decode"));
    gw.expect(
        Role::Decode,
        &["grpc://10.1.0.3:30000", "grpc://10.1.0.4:30000"],
    )
    .await;
    gw.expect(Role::Prefill, &["grpc://10.1.0.2:30000"]).await;
}

#[tokio::test]
async fn expired_watch_lists_again_and_drops_vanished_pods() {
    let api = FakeApi::new();
    api.put(role_pod("a", "10.2.0.1", true, "worker"));
    api.put(role_pod("b", "10.2.0.2", true, "worker"));
    let addr = api.clone().serve().await;
    let gw = Gateway::start(
        addr,
        &[Role::Aggregated],
        &["--service-discovery", "--selector", "iris.ai/role=worker"],
        NAMESPACE,
    )
    .await;
    gw.expect(
        Role::Aggregated,
        &["grpc://10.2.0.1:30000", "grpc://10.2.0.2:30000"],
    )
    .await;
    assert_eq!(api.lists(), 1);

    // Changes the watch never reports: only a new list shows them.
    api.expire(|pods| {
        pods.remove("b");
        let mut c = role_pod("c", "10.2.0.3", true, "worker");
        c["metadata"]["resourceVersion"] = json!("100");
        pods.insert("c".into(), c);
    });
    gw.expect(
        Role::Aggregated,
        &["grpc://10.2.0.1:30000", "grpc://10.2.0.3:30000"],
    )
    .await;
    assert!(api.lists() >= 2, "the expired watch led to a re-list");

    // Watching goes on after the re-list.
    api.delete("a");
    gw.expect(Role::Aggregated, &["grpc://10.2.0.3:30000"])
        .await;
}

#[tokio::test]
async fn leaders_only_takes_worker_index_zero() {
    let api = FakeApi::new();
    let lws = |name: &str, ip: &str, index: &str| {
        pod(
            name,
            ip,
            true,
            json!({"app": "iris", "leaderworkerset.sigs.k8s.io/worker-index": index}),
            json!({}),
        )
    };
    api.put(lws("g0-0", "10.3.0.1", "0"));
    api.put(lws("g0-1", "10.3.0.2", "1"));
    api.put(lws("g1-0", "10.3.0.3", "0"));
    let addr = api.clone().serve().await;
    let flags = [
        "--service-discovery",
        "--selector",
        "app=iris",
        "--lws-leaders-only",
    ];
    let gw = Gateway::start(addr, &[Role::Aggregated], &flags, NAMESPACE).await;
    gw.expect(
        Role::Aggregated,
        &["grpc://10.3.0.1:30000", "grpc://10.3.0.3:30000"],
    )
    .await;
}

#[test]
fn selector_flags_are_checked() {
    let parse = |flags: &[&str]| {
        let args: DiscoveryArgs = iris_testkit::args::parse(flags.iter().copied());
        iris_gateway::config::discovery(&args).map(|d| d.is_some())
    };
    assert!(!parse(&[]).unwrap());
    assert!(parse(&["--selector", "app=iris"])
        .unwrap_err()
        .to_string()
        .contains("--service-discovery"));
    assert!(parse(&["--service-discovery"])
        .unwrap_err()
        .to_string()
        .contains("selector"));
    assert!(parse(&["--service-discovery", "--decode-selector", "role"])
        .unwrap_err()
        .to_string()
        .contains("key=value"));
    assert!(parse(&["--service-discovery", "--decode-selector", "role=decode"]).unwrap());
}

/// The whole gateway, configured through a kubeconfig as `iris serve` is
/// outside a cluster: a discovered engine passes its health checks and
/// serves chat; once its pod is deleted the gateway is no longer ready.
#[tokio::test]
async fn discovered_engine_serves_chat_through_the_gateway() {
    let model = common::tiny_model();
    let engine = common::engine(&model, iris_engine::Role::Aggregated, 0).await;
    let api = FakeApi::new();
    let annotations = json!({"iris.ai/grpc-port": engine.grpc_addr.port().to_string()});
    api.put(pod(
        "engine-0",
        "127.0.0.1",
        true,
        json!({"app": "iris"}),
        annotations,
    ));
    let addr = api.clone().serve().await;
    let args = ["--service-discovery", "--selector", "app=iris"].map(String::from);
    let gw = gateway_through_kubeconfig(&model, addr, &args).await;
    common::ready(&gw).await;

    let body = common::chat_body(&model.name, "Hello", 4, false);
    let (status, answer) = common::post_json(&gw, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 4);

    api.delete("engine-0");
    let deadline = Instant::now() + Duration::from_secs(10);
    let readiness = common::url(&gw, "/readiness");
    while reqwest::get(&readiness).await.unwrap().status() != 503 {
        assert!(Instant::now() < deadline, "still ready without workers");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An EPD gateway whose encode pods are all discovered starts its RDMA
/// lane before any pod exists (the process flag stays inline); a pod
/// annotated `iris.ai/tensor-transport: rdma` that joins later is asked
/// for that lane. NIXL is pointed at a missing library, so the lane is
/// wanted but unavailable in every build (rdma tensors would go inline).
#[tokio::test]
async fn discovered_rdma_encode_pod_gets_the_rdma_lane() {
    let model = common::tiny_model();
    let api = FakeApi::new();
    let addr = api.clone().serve().await;
    let args = [
        "--epd-disaggregation",
        "--service-discovery",
        "--encode-selector",
        "iris.ai/role=encode",
        "--prefill-selector",
        "iris.ai/role=prefill",
        "--decode-selector",
        "iris.ai/role=decode",
        "--nixl-lib",
        "/nonexistent/libnixl_capi.so",
    ]
    .map(String::from);
    let gw = gateway_through_kubeconfig(&model, addr, &args).await;
    let lanes = gw.state.models.load().first().router.lanes.clone();
    assert_eq!(
        lanes.rdma_lane(),
        RdmaLane::Unavailable,
        "lane never wanted"
    );
    let metrics = common::metrics_text(&gw).await;
    assert!(
        metrics.contains("iris_transport_rdma_lane{state=\"unavailable\"} 1\n"),
        "{metrics}"
    );

    let annotated = |name: &str, ip: &str, transport: &str| {
        pod(
            name,
            ip,
            true,
            json!({"iris.ai/role": "encode"}),
            json!({"iris.ai/grpc-port": "30100", "iris.ai/tensor-transport": transport}),
        )
    };
    api.put(annotated("enc-rdma", "10.4.0.1", "rdma"));
    api.put(annotated("enc-inline", "10.4.0.2", "inline"));
    let encode = gw
        .state
        .models
        .load()
        .first()
        .router
        .mode
        .pools()
        .into_iter()
        .find(|p| p.role == Role::Encode)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while encode.snapshot().len() < 2 {
        assert!(Instant::now() < deadline, "encode pods never joined");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for worker in encode.snapshot().iter() {
        let expected = if worker.url.to_string().contains("10.4.0.1") {
            Transport::Rdma
        } else {
            Transport::Inline
        };
        assert_eq!(lanes.requested(worker), expected, "{}", worker.url);
    }
    gw.shutdown_token().cancel();
    gw.wait().await.unwrap();
}

/// Serialises the tests that point `KUBECONFIG` at their own fake API
/// server (`iris serve` reads it while starting, as outside a cluster).
static KUBECONFIG: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts a gateway with `args`, its Kubernetes client configured by a
/// kubeconfig for the fake API server at `addr`.
async fn gateway_through_kubeconfig(
    model: &common::Model,
    addr: SocketAddr,
    args: &[String],
) -> iris_gateway::RunningGateway {
    let _only_us = KUBECONFIG.lock().await;
    let kubeconfig = model.dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kubeconfig_yaml(addr)).unwrap();
    std::env::set_var("KUBECONFIG", &kubeconfig);
    common::gateway(model, args).await
}

/// A kubeconfig for the fake API server, default namespace [`NAMESPACE`].
fn kubeconfig_yaml(addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
  - name: fake
    cluster:
      server: http://{addr}
users:
  - name: fake
    user: {{}}
contexts:
  - name: fake
    context:
      cluster: fake
      user: fake
      namespace: {NAMESPACE}
current-context: fake
"
    )
}
