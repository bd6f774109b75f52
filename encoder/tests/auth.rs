//! The shared-secret check (`--auth-token-file`): every call to the
//! encoder's gRPC and data ports without the right `authorization: Bearer`
//! header is UNAUTHENTICATED, and a prefill worker given the same token
//! presents it when it collects embeddings.

use iris_encoder::EncoderArgs;
use iris_engine::EngineArgs;
use iris_process::auth::{AuthChannel, AuthToken};
use iris_proto::data::iris_data_client::IrisDataClient;
use iris_proto::data::FetchRequest;
use iris_proto::encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use iris_proto::scheduler::*;
use tempfile::TempDir;
use tonic::transport::Channel;
use tonic::Code;

mod common;
use common::*;

const SECRET: &str = "an-encoder-test-secret";

/// A token file holding `SECRET` (with the newline a Secret often has).
fn token_file() -> (TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("token");
    std::fs::write(&path, format!("{SECRET}\n")).expect("token file");
    (dir, path)
}

async fn channel(addr: std::net::SocketAddr, token: Option<&str>) -> AuthChannel {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let token = token.map(|t| AuthToken::new(t).expect("token"));
    AuthChannel::new(channel, token.as_ref())
}

fn is_unauthenticated<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> bool {
    matches!(result, Err(ref s) if s.code() == Code::Unauthenticated)
}

fn fetch_request(room: i64) -> FetchRequest {
    FetchRequest {
        room,
        wait_ms: 2_000,
        requester: "test".into(),
    }
}

/// No header and a wrong token are refused on Encode, on the scheduler
/// service (health checks included) and on the data port; the right token
/// works everywhere.
#[tokio::test]
async fn calls_without_the_token_are_unauthenticated() {
    let model = model();
    let (_keep, path) = token_file();
    let args = EncoderArgs {
        auth_token_file: Some(path),
        ..args(&model, 64)
    };
    let enc = start_with(args, std::sync::Arc::new(digest())).await;
    for token in [None, Some("wrong-secret"), Some("an-encoder-test-secre")] {
        let mut e = TokenSpeedEncoderClient::new(channel(enc.grpc_addr, token).await);
        let refused = e.encode(request(vec![item(1.0, 2, 2, b"a")], &[1])).await;
        assert!(is_unauthenticated(refused), "{token:?}");
        let mut s = TokenSpeedSchedulerClient::new(channel(enc.grpc_addr, token).await);
        let health = s.health_check(HealthCheckRequest::default()).await;
        assert!(is_unauthenticated(health), "{token:?}");
        let mut d = IrisDataClient::new(channel(enc.data_addr, token).await);
        assert!(
            is_unauthenticated(d.fetch_embedding(fetch_request(1)).await),
            "{token:?}"
        );
    }
    let mut e = TokenSpeedEncoderClient::new(channel(enc.grpc_addr, Some(SECRET)).await);
    e.encode(request(vec![item(1.0, 2, 2, b"a")], &[1]))
        .await
        .expect("the right token is accepted");
    let mut s = TokenSpeedSchedulerClient::new(channel(enc.grpc_addr, Some(SECRET)).await);
    assert!(
        s.health_check(HealthCheckRequest::default())
            .await
            .expect("health")
            .into_inner()
            .healthy
    );
    let mut d = IrisDataClient::new(channel(enc.data_addr, Some(SECRET)).await);
    let embedding = d.fetch_embedding(fetch_request(1)).await.expect("fetched");
    assert_eq!(embedding.into_inner().num_tokens, 1);
}

fn prefill_args(model: &TempDir, token: Option<std::path::PathBuf>) -> EngineArgs {
    // The request is hand-built around one embedding: no placeholder
    // ranges for the engine's per-family item checks to look at.
    let mut args: EngineArgs =
        iris_testkit::args::engine_args(model.path(), "prefill", &["--no-mm-item-checks"]);
    args.auth_token_file = token;
    args
}

/// A prefill Generate whose image embedding is in `encoder_room` on the
/// encoder's data port.
fn prefill_request(data_port: u16, encoder_room: i64) -> GenerateRequest {
    let mut meta = item(0.0, 2, 2, b"auth");
    meta.encoder_input = None;
    GenerateRequest {
        request_id: format!("auth-{encoder_room}"),
        tokenized: Some(TokenizedInput {
            input_ids: vec![641, 646, 100, 642],
            original_text: String::new(),
        }),
        sampling_params: Some(SamplingParams {
            max_new_tokens: Some(4),
            ..Default::default()
        }),
        mm_inputs: Some(MultimodalInputs { items: vec![meta] }),
        kv_bootstrap_info: Some(KvBootstrapInfo {
            bootstrap_host: "127.0.0.1".into(),
            bootstrap_port: 1,
            bootstrap_room: encoder_room,
        }),
        encode_bootstrap_info: Some(EncodeBootstrapInfo {
            items: vec![EncodeItemBootstrapInfo {
                item_index: 0,
                bootstrap_host: "127.0.0.1".into(),
                bootstrap_port: i32::from(data_port),
                bootstrap_room: encoder_room,
            }],
        }),
        ..Default::default()
    }
}

/// Reads a Generate stream to its end; the first error is the answer.
async fn drain(
    result: Result<tonic::Response<tonic::Streaming<GenerateResponse>>, tonic::Status>,
) -> Result<(), tonic::Status> {
    let mut stream = result?.into_inner();
    while stream.message().await?.is_some() {}
    Ok(())
}

/// A prefill worker started with the token collects embeddings from a
/// token-protected encoder (it presents the token on its fetches) and
/// itself requires the token; one started without it cannot collect.
#[tokio::test]
async fn a_prefill_with_the_token_collects_from_a_protected_encoder() {
    let model = model();
    let (_keep, path) = token_file();
    let args = EncoderArgs {
        auth_token_file: Some(path.clone()),
        ..args(&model, 64)
    };
    let enc = start_with(args, std::sync::Arc::new(digest())).await;
    let mut e = TokenSpeedEncoderClient::new(channel(enc.grpc_addr, Some(SECRET)).await);
    e.encode(request(
        vec![item(0.5, 2, 2, b"auth"), item(0.5, 2, 2, b"auth2")],
        &[31, 32],
    ))
    .await
    .expect("accepted");
    let port = enc.data_addr.port();

    let prefill = iris_engine::start(prefill_args(&model, Some(path)))
        .await
        .expect("prefill");
    let mut without = TokenSpeedSchedulerClient::new(channel(prefill.grpc_addr, None).await);
    let refused = drain(without.generate(prefill_request(port, 31)).await).await;
    assert!(
        is_unauthenticated(refused),
        "the prefill requires the token too"
    );
    let mut p = TokenSpeedSchedulerClient::new(channel(prefill.grpc_addr, Some(SECRET)).await);
    drain(p.generate(prefill_request(port, 31)).await)
        .await
        .expect("the prefill collected the embedding with the token");

    let open = iris_engine::start(prefill_args(&model, None))
        .await
        .expect("prefill without a token");
    let mut o = TokenSpeedSchedulerClient::new(channel(open.grpc_addr, None).await);
    let status = drain(o.generate(prefill_request(port, 32)).await)
        .await
        .expect_err("the encoder refuses its fetch");
    assert!(
        status.message().contains("authorization") || status.code() == Code::Unauthenticated,
        "{status:?}"
    );
}
