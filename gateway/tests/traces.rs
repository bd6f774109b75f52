//! OpenTelemetry traces (`--otlp-endpoint`) against an OTLP/gRPC receiver
//! started by the test: a streamed PD chat sent with a client
//! `traceparent` comes back as one trace — the gateway's `request` span a
//! child of the client's span, its stage spans (read, route, prefill,
//! first_token, stream) children of it labelled with the model, the
//! tenant and the worker, and each reference engine's Generate span a
//! child of the request span; in EPD, an image's fetch, preprocess and
//! encode spans, and the encoder's Encode span a child of the request
//! span. A gateway without `--otlp-endpoint` builds no exporter and sends
//! workers no `traceparent`.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use iris_engine::{Role, RunningEngine};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use tokio_stream::wrappers::TcpListenerStream;

/// The client's trace and span.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// One received span, flattened: its service, ids (hex) and attributes.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: Vec<(String, String)>,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// An OTLP trace receiver keeping every span it is sent.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.0.lock().expect("lock");
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .map(|a| text(a.value.as_ref()))
                .unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                kept.push(Received {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), text(a.value.as_ref())))
                        .collect(),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Receiver {
    /// Serves on a free loopback port; its `http://` URL.
    async fn start() -> (Receiver, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr: SocketAddr = listener.local_addr().expect("addr");
        let receiver = Receiver::default();
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(TcpListenerStream::new(listener));
        tokio::spawn(server);
        (receiver, format!("http://{addr}"))
    }

    fn spans(&self) -> Vec<Received> {
        self.0.lock().expect("lock").clone()
    }

    /// The spans once `done` holds of them (within 20 s).
    async fn until(&self, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        for _ in 0..200 {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the spans never arrived; received: {:#?}", self.spans());
    }
}

/// A `[[tenants]]` file with one tenant, `team-a`, and its key.
fn keys_file(key: &str) -> tempfile::NamedTempFile {
    use sha2::Digest;
    let digest: String = sha2::Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let text = format!("[[tenants]]\nname = \"team-a\"\nkeys = [\"sha256:{digest}\"]\n");
    std::fs::write(file.path(), text).expect("write");
    file
}

async fn traced_engine(model: &Model, role: Role, endpoint: &str) -> RunningEngine {
    let args = iris_testkit::args::engine_args(
        model.path(),
        role.as_str(),
        &["--otlp-endpoint", endpoint],
    );
    iris_engine::start(args).await.expect("engine starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pd_stream_is_one_trace_from_the_client_to_the_engines() {
    let (receiver, endpoint) = Receiver::start().await;
    let model = tiny_model();
    let prefill = traced_engine(&model, Role::Prefill, &endpoint).await;
    let decode = traced_engine(&model, Role::Decode, &endpoint).await;
    let key = "sk-trace-test";
    let keys = keys_file(key);
    let keys_path = keys.path().display().to_string();
    let gw = pd(
        &model,
        &prefill,
        &decode,
        &["--otlp-endpoint", &endpoint, "--api-keys-file", &keys_path],
    )
    .await;
    assert!(gw.state.traces.is_some(), "an exporter is built");
    ready(&gw).await;

    let response = reqwest::Client::new()
        .post(url(&gw, "/v1/chat/completions"))
        .bearer_auth(key)
        .header("traceparent", format!("00-{TRACE_ID}-{CLIENT_SPAN}-01"))
        .json(&chat_body(&model.name, "hello traces", 4, true))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    let events = sse_events(&response.text().await.expect("body"));
    assert_eq!(finish_reason(&events), Some("length".to_owned()));

    let ours = |spans: &[Received]| -> Vec<Received> {
        spans
            .iter()
            .filter(|s| s.trace_id == TRACE_ID)
            .cloned()
            .collect()
    };
    let spans = receiver
        .until(|spans| {
            let ours = ours(spans);
            let has = |name: &str| ours.iter().any(|s| s.name == name);
            [
                "request",
                "read",
                "route",
                "prefill",
                "first_token",
                "stream",
            ]
            .iter()
            .all(|n| has(n))
                && ours
                    .iter()
                    .filter(|s| s.name == "iris-engine.generate")
                    .count()
                    == 2
        })
        .await;
    let spans = ours(&spans);

    let request = spans
        .iter()
        .find(|s| s.name == "request")
        .expect("request span");
    assert_eq!(request.service, "iris-gateway");
    assert_eq!(
        request.parent, CLIENT_SPAN,
        "the client's span is the parent"
    );
    assert_eq!(request.attribute("model"), Some(model.name.as_str()));
    assert_eq!(request.attribute("tenant"), Some("team-a"));
    assert_eq!(request.attribute("http.response.status_code"), Some("200"));
    assert_eq!(request.attribute("endpoint"), Some("chat.completions"));

    for stage in ["read", "route", "prefill", "first_token", "stream"] {
        let span = spans.iter().find(|s| s.name == stage).expect(stage);
        assert_eq!(
            span.parent, request.span_id,
            "{stage} hangs from the request"
        );
        assert_eq!(
            span.attribute("model"),
            Some(model.name.as_str()),
            "{stage}"
        );
        assert_eq!(span.attribute("tenant"), Some("team-a"), "{stage}");
    }
    let worker = |name: &str| {
        let span = spans.iter().find(|s| s.name == name).expect(name);
        span.attribute("worker").map(str::to_owned)
    };
    assert_eq!(worker("route"), Some(grpc(decode.grpc_addr)));
    assert_eq!(worker("prefill"), Some(grpc(prefill.grpc_addr)));

    let engines: Vec<&Received> = spans
        .iter()
        .filter(|s| s.name == "iris-engine.generate")
        .collect();
    let mut roles: Vec<&str> = engines.iter().filter_map(|s| s.attribute("role")).collect();
    roles.sort();
    assert_eq!(roles, ["decode", "prefill"]);
    for engine in engines {
        assert_eq!(engine.service, "iris-engine");
        assert_eq!(
            engine.parent, request.span_id,
            "the engine's span is the gateway's child"
        );
        assert!(engine
            .attribute("request_id")
            .is_some_and(|id| !id.is_empty()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epd_request_traces_its_image_and_the_encoder_continues_it() {
    let (receiver, endpoint) = Receiver::start().await;
    let model = tiny_model();
    let encoder_args = iris_testkit::args::encoder_args(
        model.path(),
        &["--max-held-mb", "64", "--otlp-endpoint", &endpoint],
    );
    let encoder = iris_encoder::start(encoder_args)
        .await
        .expect("encoder starts");
    let prefill = traced_engine(&model, Role::Prefill, &endpoint).await;
    let decode = traced_engine(&model, Role::Decode, &endpoint).await;
    let data = prefill.data_addr.expect("prefill data server");
    let args: Vec<String> = [
        "--epd-disaggregation".to_owned(),
        "--encode".into(),
        grpc(encoder.grpc_addr),
        encoder.data_addr.port().to_string(),
        "--prefill".into(),
        grpc(prefill.grpc_addr),
        data.port().to_string(),
        "--decode".into(),
        grpc(decode.grpc_addr),
        "--otlp-endpoint".into(),
        endpoint.clone(),
    ]
    .into();
    let gw = gateway(&model, &args).await;
    ready(&gw).await;

    let response = reqwest::Client::new()
        .post(url(&gw, "/v1/chat/completions"))
        .header("traceparent", format!("00-{TRACE_ID}-{CLIENT_SPAN}-01"))
        .json(&image_chat(&model.name, &[7]))
        .send()
        .await
        .expect("send");
    assert_eq!(
        response.status(),
        200,
        "{}",
        response.text().await.unwrap_or_default()
    );

    let stages = [
        "request",
        "read",
        "fetch",
        "preprocess",
        "route",
        "encode",
        "prefill",
        "generate",
    ];
    let spans = receiver
        .until(|spans| {
            let ours: Vec<&Received> = spans.iter().filter(|s| s.trace_id == TRACE_ID).collect();
            stages.iter().all(|n| ours.iter().any(|s| s.name == *n))
                && ours.iter().any(|s| s.name == "iris-encoder.encode")
                && ours
                    .iter()
                    .filter(|s| s.name == "iris-engine.generate")
                    .count()
                    == 2
        })
        .await;
    let spans: Vec<&Received> = spans.iter().filter(|s| s.trace_id == TRACE_ID).collect();
    let request = spans
        .iter()
        .find(|s| s.name == "request")
        .expect("request span");
    assert_eq!(request.parent, CLIENT_SPAN);
    for stage in &stages[1..] {
        let span = spans.iter().find(|s| s.name == *stage).expect(stage);
        assert_eq!(
            span.parent, request.span_id,
            "{stage} hangs from the request"
        );
        assert_eq!(
            span.attribute("model"),
            Some(model.name.as_str()),
            "{stage}"
        );
    }
    let encode = spans.iter().find(|s| s.name == "encode").expect("encode");
    assert_eq!(
        encode.attribute("worker"),
        Some(grpc(encoder.grpc_addr).as_str())
    );
    let encoder_span = spans
        .iter()
        .find(|s| s.name == "iris-encoder.encode")
        .expect("encoder span");
    assert_eq!(encoder_span.service, "iris-encoder");
    assert_eq!(
        encoder_span.parent, request.span_id,
        "the encoder's span is the gateway's child"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_built_and_workers_see_no_traceparent() {
    let (receiver, endpoint) = Receiver::start().await;
    let model = tiny_model();
    // The engine exports its spans: a traceparent from the gateway would
    // make its span a child in the client's trace.
    let engine = traced_engine(&model, Role::Aggregated, &endpoint).await;
    let gw = aggregated(&model, &[&engine], &[]).await;
    assert!(
        gw.state.traces.is_none(),
        "no exporter without --otlp-endpoint"
    );
    ready(&gw).await;

    let response = reqwest::Client::new()
        .post(url(&gw, "/v1/chat/completions"))
        .header("traceparent", format!("00-{TRACE_ID}-{CLIENT_SPAN}-01"))
        .json(&chat_body(&model.name, "hello", 2, false))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    let spans = receiver
        .until(|spans| spans.iter().any(|s| s.name == "iris-engine.generate"))
        .await;
    assert!(
        spans.iter().all(|s| s.service == "iris-engine"),
        "the gateway sent spans: {spans:#?}"
    );
    let engine_span = spans
        .iter()
        .find(|s| s.name == "iris-engine.generate")
        .expect("engine span");
    assert_ne!(
        engine_span.trace_id, TRACE_ID,
        "no traceparent reached the engine"
    );
    assert!(
        engine_span.parent.is_empty(),
        "a root span: {engine_span:?}"
    );
}
