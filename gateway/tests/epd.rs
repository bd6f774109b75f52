//! Supervised encode through a real EPD gateway: reference prefill and
//! decode engines, a real digest encoder, and a fake `TokenSpeedEncoder`
//! whose answers each test chooses (refuse, fail with a status). The fake
//! is listed first and images go round robin, so the first attempt of the
//! first request always meets it.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use iris_encoder::{EncoderArgs, RunningEncoder};
use iris_engine::{Role, RunningEngine};
use iris_gateway::RunningGateway;
use iris_proto::encoder::token_speed_encoder_server::{TokenSpeedEncoder, TokenSpeedEncoderServer};
use iris_proto::encoder::{EncodeRequest, EncodeResponse};
use iris_testkit::grpc::StubScheduler;
use tokio::net::TcpListener;
use tonic::{Code, Request, Response, Status};

/// How the fake encoder answers Encode.
#[derive(Clone, Copy)]
enum Behaviour {
    /// `accepted = false`.
    Refuse,
    /// An error status with this code.
    Fail(Code),
}

/// A fake encode worker's Encode: answers as told, counts calls (a
/// healthy `StubScheduler` beside it answers the health checks).
struct FakeEncoder {
    behaviour: Behaviour,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl TokenSpeedEncoder for FakeEncoder {
    async fn encode(&self, _: Request<EncodeRequest>) -> Result<Response<EncodeResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.behaviour {
            Behaviour::Refuse => Ok(Response::new(EncodeResponse { accepted: false })),
            Behaviour::Fail(code) => Err(Status::new(code, "the fake encoder fails as told")),
        }
    }
}

/// A running fake: its gRPC address, a data port that accepts connections
/// and never answers (a prefill fetching from it waits until aborted), and
/// its call count.
struct Fake {
    addr: SocketAddr,
    silent_data: TcpListener,
    calls: Arc<AtomicUsize>,
}

impl Fake {
    async fn start(behaviour: Behaviour) -> Fake {
        let silent_data = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let calls = Arc::new(AtomicUsize::new(0));
        let fake = FakeEncoder {
            behaviour,
            calls: calls.clone(),
        };
        let addr = iris_testkit::grpc::serve(
            tonic::transport::Server::builder()
                .add_service(TokenSpeedEncoderServer::new(fake))
                .add_service(StubScheduler::healthy("fake encoder").service()),
        )
        .await;
        Fake {
            addr,
            silent_data,
            calls,
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn url(&self) -> String {
        grpc(self.addr)
    }

    /// `--encode URL PORT` arguments.
    fn encode_args(&self) -> [String; 3] {
        let port = self.silent_data.local_addr().expect("addr").port();
        ["--encode".into(), self.url(), port.to_string()]
    }
}

async fn digest_encoder(model: &Model) -> RunningEncoder {
    iris_encoder::start(digest_encoder_args(model))
        .await
        .expect("encoder starts")
}

/// The test encoder (`iris_testkit::args::encoder_args`), holding up to 64 MB.
fn digest_encoder_args(model: &Model) -> EncoderArgs {
    iris_testkit::args::encoder_args(model.path(), &["--max-held-mb", "64"])
}

fn real_encode_args(encoder: &RunningEncoder) -> [String; 3] {
    [
        "--encode".into(),
        grpc(encoder.grpc_addr),
        encoder.data_addr.port().to_string(),
    ]
}

/// Prefill and decode that wait a long time for transferred state, so a
/// leg of a failed attempt ends early only if the gateway aborts it.
struct Pd {
    prefill: RunningEngine,
    decode: RunningEngine,
}

impl Pd {
    async fn start(model: &Model) -> Pd {
        let start = |role| {
            let mut args = engine_args(model, role, 0);
            args.transfer_wait_ms = 600_000;
            iris_engine::start(args)
        };
        Pd {
            prefill: start(Role::Prefill).await.expect("prefill starts"),
            decode: start(Role::Decode).await.expect("decode starts"),
        }
    }

    fn args(&self) -> Vec<String> {
        let data = self.prefill.data_addr.expect("prefill data server");
        vec![
            "--prefill".into(),
            grpc(self.prefill.grpc_addr),
            data.port().to_string(),
            "--decode".into(),
            grpc(self.decode.grpc_addr),
        ]
    }

    /// Waits (bounded, generously) until neither engine runs anything.
    async fn idle(&self) {
        for _ in 0..400 {
            if running(&self.prefill).await == 0 && running(&self.decode).await == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("a leg of a failed attempt was never aborted");
    }
}

/// An EPD gateway over `encoders` (each `--encode URL PORT`), images round
/// robin, waited on until every worker is healthy.
async fn epd_gateway(
    model: &Model,
    encoders: &[[String; 3]],
    pd: &Pd,
    extra: &[&str],
) -> RunningGateway {
    let mut args: Vec<String> = vec!["--epd-disaggregation".into()];
    args.extend(encoders.iter().flatten().cloned());
    args.extend(pd.args());
    args.extend(["--encode-policy".into(), "round_robin".into()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let gw = gateway(model, &args).await;
    all_healthy(&gw).await;
    gw
}

async fn all_healthy(gw: &RunningGateway) {
    for _ in 0..200 {
        let text = metrics_text(gw).await;
        let health: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("iris_worker_healthy{"))
            .collect();
        if !health.is_empty() && health.iter().all(|l| l.ends_with(" 1")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the workers never all became healthy");
}

/// The value of `metric{worker="URL",…}` in the gateway's metrics.
async fn worker_metric(gw: &RunningGateway, metric: &str, worker: &str) -> u64 {
    let prefix = format!("{metric}{{model=\"");
    let label = format!(",worker=\"{worker}\"");
    metrics_text(gw)
        .await
        .lines()
        .find(|l| l.starts_with(&prefix) && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix}"))
}

/// `iris_retries_total` of the gateway's one model.
async fn retries(gw: &RunningGateway) -> u64 {
    let text = metrics_text(gw).await;
    text.lines()
        .filter(|l| l.starts_with("iris_retries_total{model="))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no iris_retries_total in {text}"))
}

/// One image chat through a fake that fails as `behaviour` says and a real
/// encoder: the chat succeeds on the real one, the fake's failure is
/// counted against it, and the legs of the failed attempt are aborted.
async fn retried_on_the_other_encoder(behaviour: Behaviour) {
    let model = tiny_model();
    let pd = Pd::start(&model).await;
    let fake = Fake::start(behaviour).await;
    let real = digest_encoder(&model).await;
    let encoders = [fake.encode_args(), real_encode_args(&real)];
    let gw = epd_gateway(&model, &encoders, &pd, &[]).await;

    let (status, body) = post_json(&gw, &image_chat(&model.name, &[1])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 8);
    assert_eq!(fake.calls(), 1, "the first attempt went to the fake");
    let real_url = grpc(real.grpc_addr);
    assert_eq!(
        worker_metric(&gw, "iris_worker_requests_total", &real_url).await,
        1,
        "the retry went to the real encoder"
    );
    assert_eq!(
        worker_metric(&gw, "iris_worker_failures_total", &fake.url()).await,
        1
    );
    assert_eq!(
        worker_metric(&gw, "iris_worker_failures_total", &real_url).await,
        0
    );
    assert_eq!(retries(&gw).await, 1);
    // The failed attempt's prefill waits on the fake's silent data server
    // and its decode on that prefill: only the gateway's aborts end them.
    pd.idle().await;
}

#[tokio::test]
async fn a_refused_image_goes_to_the_other_encoder() {
    retried_on_the_other_encoder(Behaviour::Refuse).await;
}

#[tokio::test]
async fn an_encoder_error_status_moves_the_image_and_aborts_the_failed_legs() {
    retried_on_the_other_encoder(Behaviour::Fail(Code::Unavailable)).await;
    retried_on_the_other_encoder(Behaviour::Fail(Code::Internal)).await;
}

#[tokio::test]
async fn encoder_pushback_and_timeouts_count_as_worker_failures() {
    retried_on_the_other_encoder(Behaviour::Fail(Code::ResourceExhausted)).await;
    retried_on_the_other_encoder(Behaviour::Fail(Code::DeadlineExceeded)).await;
}

#[tokio::test]
async fn an_invalid_request_fails_at_once_without_trying_another_encoder() {
    let model = tiny_model();
    let pd = Pd::start(&model).await;
    let fake = Fake::start(Behaviour::Fail(Code::InvalidArgument)).await;
    let real = digest_encoder(&model).await;
    let encoders = [fake.encode_args(), real_encode_args(&real)];
    let gw = epd_gateway(&model, &encoders, &pd, &[]).await;

    let (status, body) = post_json(&gw, &image_chat(&model.name, &[2])).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("fails as told"), "{message}");
    assert!(
        !message.contains("127.0.0.1"),
        "no worker address: {message}"
    );
    assert_eq!(fake.calls(), 1);
    let real_url = grpc(real.grpc_addr);
    assert_eq!(
        worker_metric(&gw, "iris_worker_requests_total", &real_url).await,
        0,
        "the other encoder was not tried"
    );
    assert_eq!(retries(&gw).await, 0);
    pd.idle().await;
}

#[tokio::test]
async fn every_encoder_failing_ends_in_a_clear_error_once_retries_run_out() {
    let model = tiny_model();
    let pd = Pd::start(&model).await;
    let a = Fake::start(Behaviour::Fail(Code::Unavailable)).await;
    let b = Fake::start(Behaviour::Refuse).await;
    let gw = epd_gateway(
        &model,
        &[a.encode_args(), b.encode_args()],
        &pd,
        &["--max-retries", "3", "--circuit-breaker-failures", "0"],
    )
    .await;

    let (status, body) = post_json(&gw, &image_chat(&model.name, &[3, 4])).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    assert_eq!(body["error"]["code"], "service_unavailable", "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("encode worker"), "{message}");
    // Four attempts of two images each, round robin over both fakes.
    assert_eq!(a.calls() + b.calls(), 8);
    assert!(a.calls() > 0 && b.calls() > 0);
    // Every failed image is counted, not only the first of each attempt.
    let failures = worker_metric(&gw, "iris_worker_failures_total", &a.url()).await
        + worker_metric(&gw, "iris_worker_failures_total", &b.url()).await;
    assert_eq!(failures, 8);
    assert_eq!(retries(&gw).await, 3);
    pd.idle().await;
}

/// Workers started with `--auth-token-file` refuse every call without the
/// token; a gateway given the same secret (`--worker-auth-token-file`)
/// presents it on every call — health checks, Encode, Generate — and
/// serves an image chat through them (the prefill presenting it to the
/// encoder's data port, the decode to the prefill's).
#[tokio::test]
async fn a_gateway_with_the_worker_token_serves_through_protected_workers() {
    let model = tiny_model();
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "gateway-test-secret\n").expect("token file");
    let start = |role| {
        let mut args = engine_args(&model, role, 0);
        args.auth_token_file = Some(token.clone());
        iris_engine::start(args)
    };
    let pd = Pd {
        prefill: start(Role::Prefill).await.expect("prefill starts"),
        decode: start(Role::Decode).await.expect("decode starts"),
    };
    let encoder = EncoderArgs {
        auth_token_file: Some(token.clone()),
        ..digest_encoder_args(&model)
    };
    let encoder = iris_encoder::start(encoder).await.expect("encoder starts");
    let flag = token.display().to_string();
    let gw = epd_gateway(
        &model,
        &[real_encode_args(&encoder)],
        &pd,
        &["--worker-auth-token-file", &flag],
    )
    .await;
    let (status, body) = post_json(&gw, &image_chat(&model.name, &[5])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 8);
}

/// `iris-encoder`'s tower is Qwen-VL-shaped: EPD for another family's
/// model is refused at start, naming why, before any worker is called.
#[tokio::test]
async fn epd_is_refused_for_a_family_the_encoder_cannot_encode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let family = iris_model::tiny::Family::LlavaNext;
    iris_model::tiny::write_tiny_model(dir.path(), family).expect("tiny model");
    let argv = [
        "--port",
        "0",
        "--model-path",
        &dir.path().display().to_string(),
        "--epd-disaggregation",
        "--encode",
        "grpc://127.0.0.1:9",
        "9",
        "--prefill",
        "grpc://127.0.0.1:9",
        "9",
        "--decode",
        "grpc://127.0.0.1:9",
    ]
    .map(String::from);
    let serve: iris_gateway::ServeArgs = iris_testkit::args::parse(argv);
    let Err(error) = iris_gateway::start(serve).await else {
        panic!("an EPD gateway started for {family}");
    };
    let message = format!("{error:#}");
    assert!(
        message.contains("--epd-disaggregation is not available for this model")
            && message.contains("llava_next"),
        "{message}"
    );
}
