//! `--auth-token-file` on real `iris-engine` processes: calls without
//! `authorization: Bearer <token>` (or with a wrong one) are UNAUTHENTICATED
//! on the scheduler and data ports, and a decode worker given the token
//! presents it when it collects request state from its prefill worker.

mod common;

use common::*;
use iris_proto::data::iris_data_client::IrisDataClient;
use iris_proto::data::FetchRequest;
use iris_proto::scheduler::*;
use tonic::metadata::MetadataValue;
use tonic::Code;

const SECRET: &str = "engine-test-secret";

/// `message` as a request carrying `token`, if any.
fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let value: MetadataValue<_> = format!("Bearer {token}").parse().expect("header");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// Every response of a Generate stream, or the first error.
async fn drain(
    client: &mut iris_proto::scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient<
        tonic::transport::Channel,
    >,
    request: tonic::Request<GenerateRequest>,
) -> Result<Vec<GenerateResponse>, tonic::Status> {
    let mut stream = client.generate(request).await?.into_inner();
    let mut out = Vec::new();
    while let Some(message) = stream.message().await? {
        out.push(message);
    }
    Ok(out)
}

fn output_ids(responses: &[GenerateResponse]) -> Vec<u32> {
    responses
        .iter()
        .find_map(|r| match &r.response {
            Some(generate_response::Response::Complete(c)) => Some(c.output_ids.clone()),
            _ => None,
        })
        .expect("a complete message")
}

#[tokio::test]
async fn a_token_protected_prefill_and_decode_serve_only_the_token() {
    let model = tiny_model();
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{SECRET}\n")).expect("token file");
    let flag = [
        "--auth-token-file",
        token_file.to_str().expect("utf-8 path"),
    ];
    let prefill = EngineProcess::start(&model, "prefill", &flag);
    let decode = EngineProcess::start(&model, "decode", &flag);
    let data = prefill.data.expect("prefill data server");

    let mut p = prefill.client().await;
    for token in [None, Some("wrong"), Some("engine-test-secre")] {
        let health = p
            .health_check(with_token(HealthCheckRequest {}, token))
            .await;
        assert_eq!(
            health.unwrap_err().code(),
            Code::Unauthenticated,
            "{token:?}"
        );
        let mut d = IrisDataClient::connect(format!("http://{data}"))
            .await
            .expect("data");
        let fetch = FetchRequest {
            room: 1,
            wait_ms: 10,
            requester: "test".into(),
        };
        let refused = d.fetch_kv_state(with_token(fetch, token)).await;
        assert_eq!(
            refused.unwrap_err().code(),
            Code::Unauthenticated,
            "{token:?}"
        );
    }
    let health = p
        .health_check(with_token(HealthCheckRequest {}, Some(SECRET)))
        .await
        .expect("the right token");
    assert!(health.into_inner().healthy);

    // A PD leg: the decode worker collects the prefill's state over the
    // token-protected data port, presenting its own token.
    let mut leg = with_items(
        text_request("auth-pd", PROMPT.to_vec(), 8, true),
        vec![pixels(&[3; 32])],
    );
    leg.kv_bootstrap_info = Some(kv_info(data, 42));
    let mut d = decode.client().await;
    let without = drain(&mut d, with_token(leg.clone(), None)).await;
    assert_eq!(without.unwrap_err().code(), Code::Unauthenticated);
    let (dec, pre) = tokio::join!(
        drain(&mut d, with_token(leg.clone(), Some(SECRET))),
        drain(&mut p, with_token(leg.clone(), Some(SECRET)))
    );
    pre.expect("prefill served");
    let tokens = output_ids(&dec.expect("decode collected the state with its token"));
    assert_eq!(tokens.len(), 8);
}
