//! The attempt loop against scripted workers: real gRPC servers whose
//! Generate answers follow a script, so each retry rule is seen end to end
//! (pick, send, classify, account, abort, retry).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iris_proto::common::{GetTokenizerChunk, GetTokenizerRequest};
use iris_proto::encoder::token_speed_encoder_server::{TokenSpeedEncoder, TokenSpeedEncoderServer};
use iris_proto::encoder::{EncodeRequest, EncodeResponse};
use iris_proto::scheduler::token_speed_scheduler_server::{
    TokenSpeedScheduler, TokenSpeedSchedulerServer,
};
use iris_proto::scheduler::*;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};

use super::{Mode, RouteError, Router, RouterSettings};
use crate::workers::policy::PolicyKind;
use crate::workers::{Pool, Role, Worker, WorkerUrl};

/// How a scripted worker answers one Generate call.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// Refuse the call with this code.
    Fail(Code),
    /// Accept the call, then end the stream with this code before any
    /// response.
    FailInStream(Code),
    /// One response, then the end of the stream.
    Respond,
    /// Accept the call and send nothing until the stream is dropped.
    Pending,
    /// Accept the call and end the stream at once, with no response.
    End,
    /// One chunk carrying a token, then fail the stream with this code.
    TokenThenFail(Code),
    /// One chunk carrying token 2, then the completion (finish "length").
    Finish,
    /// Three sequences: tokens 1, 3 and 5 for indexes 0, 1 and 2, index 2
    /// completed, then fail the stream with this code.
    ThreeSequencesThenFail(Code),
}

/// A worker that answers Generate calls by its script (the last answer
/// repeats) and counts Generate and Abort calls.
#[derive(Clone)]
struct Scripted {
    script: Arc<Mutex<Vec<Answer>>>,
    generates: Arc<AtomicUsize>,
    encodes: Arc<AtomicUsize>,
    aborts: Arc<AtomicUsize>,
    /// Refuse remote (RDMA) payloads as a TokenSpeed encode servicer
    /// whose puller is off does.
    puller_off: Arc<AtomicBool>,
    /// Refuse remote payloads in Generate as an iris-engine does (no NIXL
    /// reader): the stream fails before its first response.
    no_reader: Arc<AtomicBool>,
    /// The payload kind of every Encode call's pixels, in order.
    payloads: Arc<Mutex<Vec<&'static str>>>,
    /// The payload kind of every Generate call's first item, in order.
    generate_payloads: Arc<Mutex<Vec<&'static str>>>,
    /// Every Generate request received, in order.
    received: Arc<Mutex<Vec<GenerateRequest>>>,
}

/// The payload kind of the first item's pixels.
fn payload_kind(items: &[MultimodalItem]) -> &'static str {
    let payload = items
        .first()
        .and_then(|item| item.encoder_input.as_ref())
        .and_then(|t| t.payload.as_ref());
    match payload {
        Some(tensor_data::Payload::Inline(_)) => "inline",
        Some(tensor_data::Payload::Shm(_)) => "shm",
        Some(tensor_data::Payload::Remote(_)) => "remote",
        None => "none",
    }
}

/// Encode: every image is accepted, unless its pixels are remote and the
/// puller is off.
#[tonic::async_trait]
impl TokenSpeedEncoder for Scripted {
    async fn encode(
        &self,
        request: Request<EncodeRequest>,
    ) -> Result<Response<EncodeResponse>, Status> {
        self.encodes.fetch_add(1, Ordering::SeqCst);
        let request = request.into_inner();
        let items = request.mm_inputs.map(|m| m.items).unwrap_or_default();
        let kind = payload_kind(&items);
        self.payloads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(kind);
        if kind == "remote" && self.puller_off.load(Ordering::SeqCst) {
            return Err(Status::internal(
                "EPD RDMA: remote payload but landing pool unavailable",
            ));
        }
        Ok(Response::new(EncodeResponse { accepted: true }))
    }
}

impl Scripted {
    fn next_answer(&self) -> Answer {
        let mut script = self.script.lock().unwrap_or_else(|p| p.into_inner());
        match script.len() {
            0 => Answer::Fail(Code::Internal),
            1 => script[0],
            _ => script.remove(0),
        }
    }
}

type Stream<T> = ReceiverStream<Result<T, Status>>;

/// A chunk of sequence `index` carrying `token`.
fn chunk_of(index: u32, token: u32) -> GenerateResponse {
    let chunk = GenerateStreamChunk {
        token_ids: vec![token],
        completion_tokens: 1,
        index,
        ..GenerateStreamChunk::default()
    };
    GenerateResponse {
        response: Some(generate_response::Response::Chunk(chunk)),
        ..GenerateResponse::default()
    }
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("scripted worker"))
}

#[tonic::async_trait]
impl TokenSpeedScheduler for Scripted {
    type GenerateStream = Stream<GenerateResponse>;
    type GetTokenizerStream = Stream<GetTokenizerChunk>;
    type SubscribeKvEventsStream = Stream<iris_proto::common::KvEventBatch>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        self.generates.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let request = request.into_inner();
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(request.clone());
        let items = request.mm_inputs.map(|m| m.items);
        let kind = payload_kind(&items.unwrap_or_default());
        self.generate_payloads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(kind);
        if kind == "remote" && self.puller_off.load(Ordering::SeqCst) {
            return Err(Status::internal(
                "TokenSpeed RDMA: remote payload but landing pool unavailable",
            ));
        }
        if kind == "remote" && self.no_reader.load(Ordering::SeqCst) {
            let refusal = iris_transport::ReceiveError::NoRemoteReader.to_string();
            let _ = tx.try_send(Err(Status::unavailable(format!(
                "encoder_input: {refusal}"
            ))));
            return Ok(Response::new(ReceiverStream::new(rx)));
        }
        match self.next_answer() {
            Answer::Fail(code) => return Err(Status::new(code, "fails as scripted")),
            Answer::FailInStream(code) => {
                let _ = tx.try_send(Err(Status::new(code, "fails as scripted")));
            }
            Answer::Respond => {
                let _ = tx.try_send(Ok(GenerateResponse::default()));
            }
            Answer::End => drop(tx),
            Answer::Finish => {
                let chunk = GenerateStreamChunk {
                    token_ids: vec![2],
                    prompt_tokens: 99,
                    completion_tokens: 1,
                    ..GenerateStreamChunk::default()
                };
                let complete = GenerateComplete {
                    output_ids: vec![2],
                    finish_reason: "length".into(),
                    prompt_tokens: 99,
                    completion_tokens: 1,
                    ..GenerateComplete::default()
                };
                for response in [
                    generate_response::Response::Chunk(chunk),
                    generate_response::Response::Complete(complete),
                ] {
                    let _ = tx.try_send(Ok(GenerateResponse {
                        response: Some(response),
                        ..GenerateResponse::default()
                    }));
                }
            }
            Answer::TokenThenFail(code) => {
                let chunk = GenerateStreamChunk {
                    token_ids: vec![1],
                    ..GenerateStreamChunk::default()
                };
                let response = GenerateResponse {
                    response: Some(generate_response::Response::Chunk(chunk)),
                    ..GenerateResponse::default()
                };
                let _ = tx.try_send(Ok(response));
                let _ = tx.try_send(Err(Status::new(code, "fails as scripted")));
            }
            Answer::ThreeSequencesThenFail(code) => {
                for (index, token) in [(0, 1), (1, 3), (2, 5)] {
                    let _ = tx.try_send(Ok(chunk_of(index, token)));
                }
                let complete = GenerateComplete {
                    output_ids: vec![5],
                    finish_reason: "stop".into(),
                    completion_tokens: 1,
                    index: 2,
                    ..GenerateComplete::default()
                };
                let _ = tx.try_send(Ok(GenerateResponse {
                    response: Some(generate_response::Response::Complete(complete)),
                    ..GenerateResponse::default()
                }));
                let _ = tx.try_send(Err(Status::new(code, "fails as scripted")));
            }
            Answer::Pending => {
                // The sender lives as long as the stream: no end, no message.
                let held = tx.clone();
                tokio::spawn(async move { held.closed().await });
            }
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn health_check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        unimplemented()
    }

    async fn abort(&self, _: Request<AbortRequest>) -> Result<Response<AbortResponse>, Status> {
        self.aborts.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(AbortResponse::default()))
    }

    async fn get_model_info(
        &self,
        _: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        unimplemented()
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        unimplemented()
    }

    async fn get_loads(
        &self,
        _: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        unimplemented()
    }

    async fn subscribe_kv_events(
        &self,
        _: Request<iris_proto::common::SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        unimplemented()
    }

    async fn get_tokenizer(
        &self,
        _: Request<GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        unimplemented()
    }
}

/// A running scripted worker, already healthy in the gateway's view.
struct Fake {
    worker: Arc<Worker>,
    service: Scripted,
}

impl Fake {
    async fn start(role: Role, script: &[Answer]) -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let service = Scripted {
            script: Arc::new(Mutex::new(script.to_vec())),
            generates: Arc::default(),
            encodes: Arc::default(),
            aborts: Arc::default(),
            puller_off: Arc::default(),
            no_reader: Arc::default(),
            payloads: Arc::default(),
            generate_payloads: Arc::default(),
            received: Arc::default(),
        };
        let server = tonic::transport::Server::builder()
            .add_service(TokenSpeedSchedulerServer::new(service.clone()))
            .add_service(TokenSpeedEncoderServer::new(service.clone()))
            .serve_with_incoming(iris_process::nodelay_incoming(listener));
        tokio::spawn(server);
        let mut url = WorkerUrl::parse(&format!("grpc://{addr}")).expect("url");
        url.bootstrap_port = Some(1);
        url.backend = Some(crate::backends::Backend::TokenSpeed);
        let worker = Worker::new(url, role, Duration::from_secs(5)).expect("worker");
        worker.set_healthy(true);
        Fake { worker, service }
    }

    fn generates(&self) -> usize {
        self.service.generates.load(Ordering::SeqCst)
    }

    fn encodes(&self) -> usize {
        self.service.encodes.load(Ordering::SeqCst)
    }

    fn aborts(&self) -> usize {
        self.service.aborts.load(Ordering::SeqCst)
    }

    /// The payload kinds of the Encode calls so far.
    fn payloads(&self) -> Vec<&'static str> {
        self.service
            .payloads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The Generate requests received so far.
    fn received(&self) -> Vec<GenerateRequest> {
        self.service
            .received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn generate_payloads(&self) -> Vec<&'static str> {
        self.service
            .generate_payloads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn pool(role: Role, fakes: &[&Fake]) -> Arc<Pool> {
    let workers = fakes.iter().map(|f| f.worker.clone()).collect();
    Arc::new(Pool::new(
        role,
        workers,
        PolicyKind::RoundRobin.build(Default::default(), &Default::default()),
    ))
}

/// A router whose circuits open at the first failure counted toward them.
fn router(mode: Mode, max_retries: u32) -> Arc<Router> {
    Arc::new(unshared(mode, max_retries, 1))
}

/// An EPD router over `encode`, a prefill worker whose stream fails with
/// `code`, a good one and a decode worker, after one image request went
/// through it (retried past the failing prefill) and finished; the router
/// and the three fakes.
async fn epd_past_a_failing_prefill(
    encode: Arc<Pool>,
    code: Code,
) -> (Arc<Router>, Fake, Fake, Fake) {
    let failing = Fake::start(Role::Prefill, &[Answer::FailInStream(code)]).await;
    let good = Fake::start(Role::Prefill, &[Answer::Respond]).await;
    let decode = Fake::start(Role::Decode, &[Answer::Pending, Answer::Respond]).await;
    let mode = Mode::EncodePrefillDecode {
        encode,
        prefill: pool(Role::Prefill, &[&failing, &good]),
        decode: pool(Role::Decode, &[&decode]),
    };
    let router = router(mode, 2);
    let mut generation = router.start(image_request()).await.expect("retried");
    assert!(matches!(generation.next().await, Some(Ok(_))));
    generation.finish();
    (router, failing, good, decode)
}

/// [`router`] with `circuit_breaker_failures`, not yet shared.
fn unshared(mode: Mode, max_retries: u32, circuit_breaker_failures: u32) -> Router {
    let settings = RouterSettings {
        max_retries,
        max_migrations: 2,
        circuit_breaker_failures,
        encode_timeout: Duration::from_secs(5),
        encode_max_in_flight: 0,
        encode_max_in_flight_patches: 0,
        max_running_requests: 0,
        reserved_running_requests: 0,
        tenant_queue_size: 0,
    };
    Router::new(mode, settings)
}

fn request() -> GenerateRequest {
    GenerateRequest {
        request_id: "chatcmpl-test".into(),
        ..GenerateRequest::default()
    }
}

/// A request with one image (its metadata only: no pixels to transfer).
fn image_request() -> GenerateRequest {
    let item = MultimodalItem {
        content_hash: vec![7; 32].into(),
        ..MultimodalItem::default()
    };
    GenerateRequest {
        mm_inputs: Some(MultimodalInputs { items: vec![item] }),
        ..request()
    }
}

#[tokio::test]
async fn pd_retries_an_internal_error_of_prefill_on_another_prefill() {
    let broken = Fake::start(Role::Prefill, &[Answer::Fail(Code::Internal)]).await;
    let good = Fake::start(Role::Prefill, &[Answer::Respond]).await;
    let decode = Fake::start(Role::Decode, &[Answer::Respond]).await;
    let mode = Mode::PrefillDecode {
        prefill: pool(Role::Prefill, &[&broken, &good]),
        decode: pool(Role::Decode, &[&decode]),
    };
    let router = router(mode, 2);
    let mut generation = router.start(request()).await.expect("retried");
    assert!(Arc::ptr_eq(&generation.worker, &decode.worker));
    assert!(matches!(generation.next().await, Some(Ok(_))));
    generation.finish();
    assert_eq!((broken.generates(), good.generates()), (1, 1));
    assert_eq!(decode.generates(), 2, "decode was part of both attempts");
    assert_eq!(router.retries(), 1);
    assert!(
        !broken.worker.is_healthy(),
        "Internal counts toward the circuit"
    );
    router.flush_aborts(Duration::from_secs(5)).await;
    assert_eq!(
        decode.aborts(),
        1,
        "the failed attempt's decode leg is aborted"
    );
}

/// EPD reads ahead: a prefill that fails in its stream (say, the
/// embedding never arrived) is replaced before the client sees anything.
#[tokio::test]
async fn epd_retries_a_failure_in_the_prefill_stream_before_the_first_response() {
    let encoder = Fake::start(Role::Encode, &[]).await;
    let encode = pool(Role::Encode, &[&encoder]);
    let (router, failing, good, decode) = epd_past_a_failing_prefill(encode, Code::Internal).await;
    assert_eq!(
        encoder.encodes(),
        2,
        "the image is encoded again for the retry"
    );
    assert_eq!((failing.generates(), good.generates()), (1, 1));
    assert_eq!(router.retries(), 1);
    assert!(
        failing.worker.is_healthy(),
        "a failure after the leg started may be a peer's: no circuit"
    );
    assert_eq!(failing.worker.request_counts(), (1, 1));
    router.flush_aborts(Duration::from_secs(5)).await;
    assert_eq!(
        decode.aborts(),
        1,
        "the failed attempt's decode leg is aborted"
    );
}

/// A prefill leg failing before the first response (an embedding it
/// could not fetch) suspects the attempt's encoders too: the retry's image
/// goes to the other encoder, though content-hash affinity would pick the
/// same one.
#[tokio::test]
async fn a_late_failure_suspects_the_attempts_encoders() {
    let encoders = [
        Fake::start(Role::Encode, &[]).await,
        Fake::start(Role::Encode, &[]).await,
    ];
    let workers = encoders.iter().map(|f| f.worker.clone()).collect();
    let affinity = PolicyKind::ConsistentHashing.build(Default::default(), &Default::default());
    let encode = Arc::new(Pool::new(Role::Encode, workers, affinity));
    let _ = epd_past_a_failing_prefill(encode, Code::Unknown).await;
    let encodes = [encoders[0].encodes(), encoders[1].encodes()];
    assert_eq!(
        encodes,
        [1, 1],
        "the retry's image went to the other encoder"
    );
}

/// Aggregated and PD hand the generation over once the legs are accepted;
/// a leg failing after that but before the first token is re-planned on
/// other workers (a new prefill and decode pair, a new room), unseen by
/// the caller.
#[tokio::test]
async fn pd_starts_again_when_decode_fails_after_the_hand_over() {
    let prefill = Fake::start(Role::Prefill, &[Answer::Respond]).await;
    let dying = Fake::start(Role::Decode, &[Answer::FailInStream(Code::Internal)]).await;
    let good = Fake::start(Role::Decode, &[Answer::TokenThenFail(Code::Unavailable)]).await;
    let mode = Mode::PrefillDecode {
        prefill: pool(Role::Prefill, &[&prefill]),
        decode: pool(Role::Decode, &[&dying, &good]),
    };
    let router = router(mode, 2);
    let mut generation = router.start(request()).await.expect("accepted");
    assert!(Arc::ptr_eq(&generation.worker, &dying.worker));
    assert!(
        matches!(generation.next().await, Some(Ok(_))),
        "the restart's token"
    );
    assert!(Arc::ptr_eq(&generation.worker, &good.worker));
    assert_eq!((dying.generates(), good.generates()), (1, 1));
    assert_eq!(prefill.generates(), 2, "a new prefill for the new room");
    assert_eq!(router.retries(), 1);
    // After a token reached the caller a failure is the caller's to see.
    match generation.next().await {
        Some(Err(status)) => assert_eq!(status.code(), Code::Unavailable),
        other => panic!("expected the failure after the token, got {other:?}"),
    }
    assert_eq!(router.retries(), 1);
    router.flush_aborts(Duration::from_secs(5)).await;
    assert!(
        prefill.aborts() >= 1,
        "the failed attempt's prefill leg is aborted"
    );
}

/// A stream that ends before its first token is a failure of its worker.
#[tokio::test]
async fn aggregated_starts_again_when_the_stream_ends_before_its_first_token() {
    let ending = Fake::start(Role::Aggregated, &[Answer::End]).await;
    let good = Fake::start(
        Role::Aggregated,
        &[Answer::TokenThenFail(Code::Unavailable)],
    )
    .await;
    let router = router(
        Mode::Aggregated(pool(Role::Aggregated, &[&ending, &good])),
        2,
    );
    let mut generation = router.start(request()).await.expect("accepted");
    assert!(matches!(generation.next().await, Some(Ok(_))));
    assert_eq!((ending.generates(), good.generates()), (1, 1));
    assert_eq!(router.retries(), 1);
    generation.finish();
}

/// Restarts count against `--max-retries` with the retries before the
/// hand-over; once used up, the failure reaches the caller.
#[tokio::test]
async fn restarts_after_the_hand_over_stop_at_max_retries() {
    let workers = [
        Fake::start(Role::Aggregated, &[Answer::FailInStream(Code::Internal)]).await,
        Fake::start(Role::Aggregated, &[Answer::FailInStream(Code::Internal)]).await,
        Fake::start(Role::Aggregated, &[Answer::FailInStream(Code::Internal)]).await,
    ];
    let fakes: Vec<&Fake> = workers.iter().collect();
    let router = router(Mode::Aggregated(pool(Role::Aggregated, &fakes)), 1);
    let mut generation = router.start(request()).await.expect("accepted");
    match generation.next().await {
        Some(Err(status)) => assert_eq!(status.code(), Code::Internal),
        other => panic!("expected the second failure, got {other:?}"),
    }
    assert_eq!(router.retries(), 1);
    let tried: usize = workers.iter().map(Fake::generates).sum();
    assert_eq!(tried, 2, "one attempt and one retry");
}

/// A streamed text request of prompt [7, 8], at most 3 new tokens.
fn streamed_request() -> GenerateRequest {
    GenerateRequest {
        tokenized: Some(TokenizedInput {
            input_ids: vec![7, 8],
            ..TokenizedInput::default()
        }),
        sampling_params: Some(SamplingParams {
            max_new_tokens: Some(3),
            min_new_tokens: 2,
            ..SamplingParams::default()
        }),
        stream: true,
        ..request()
    }
}

/// [`streamed_request`] with its sampling parameters edited by `edit`.
fn streamed_with(edit: impl FnOnce(&mut SamplingParams)) -> GenerateRequest {
    let mut request = streamed_request();
    if let Some(sampling) = request.sampling_params.as_mut() {
        edit(sampling);
    }
    request
}

/// An aggregated worker answering `first`, another that finishes, and a
/// router over both (2 retries): a stream failing mid-way and where it
/// may move.
async fn dying_then_next(first: Answer) -> (Fake, Fake, Arc<Router>) {
    let dying = Fake::start(Role::Aggregated, &[first]).await;
    let next = Fake::start(Role::Aggregated, &[Answer::Finish]).await;
    let router = router(
        Mode::Aggregated(pool(Role::Aggregated, &[&dying, &next])),
        2,
    );
    (dying, next, router)
}

fn reply(response: Option<Result<GenerateResponse, Status>>) -> generate_response::Response {
    match response {
        Some(Ok(GenerateResponse {
            response: Some(response),
            ..
        })) => response,
        other => panic!("expected a response, got {other:?}"),
    }
}

/// A worker failing after a token was streamed: the prompt plus that token
/// go to another worker with the budgets reduced, and its responses read
/// as the continuation of one sequence.
#[tokio::test]
async fn a_stream_failing_mid_way_continues_on_another_worker() {
    use generate_response::Response;
    let (_dying, next, router) = dying_then_next(Answer::TokenThenFail(Code::Unavailable)).await;
    let mut generation = router.start(streamed_request()).await.expect("accepted");
    let Response::Chunk(first) = reply(generation.next().await) else {
        panic!("expected the first chunk");
    };
    assert_eq!(first.token_ids, [1]);
    let Response::Chunk(second) = reply(generation.next().await) else {
        panic!("expected the continuation's chunk");
    };
    assert_eq!(second.token_ids, [2]);
    assert_eq!(second.completion_tokens, 2, "counts continue");
    assert_eq!(
        second.prompt_tokens, 0,
        "the client's prompt, not the longer one"
    );
    let Response::Complete(complete) = reply(generation.next().await) else {
        panic!("expected the completion");
    };
    assert_eq!(complete.output_ids, [1, 2], "the whole sequence");
    assert_eq!(complete.completion_tokens, 2);
    assert!(generation.next().await.is_none());
    let sent = &next.received()[0];
    assert_eq!(sent.tokenized.as_ref().unwrap().input_ids, [7, 8, 1]);
    let sampling = sent.sampling_params.as_ref().unwrap();
    assert_eq!(
        (sampling.max_new_tokens, sampling.min_new_tokens),
        (Some(2), 1)
    );
    assert!(
        sent.request_id.ends_with("-migrated1"),
        "{}",
        sent.request_id
    );
    let moved: u64 = router.migrations().iter().map(|(_, n)| n).sum();
    assert_eq!(moved, 1);
    assert_eq!(router.retries(), 0, "a move is not a retry");
}

/// A request of three sequences whose worker fails after each streamed a
/// token and one completed: the two unfinished ones continue as one
/// request each (their own prefix, `n` = 1), read back under their own
/// indexes; the completed one is not sent again.
#[tokio::test]
async fn the_unfinished_sequences_of_n_continue_each_on_their_own() {
    use generate_response::Response;
    let (_dying, next, router) =
        dying_then_next(Answer::ThreeSequencesThenFail(Code::Unavailable)).await;
    let request = streamed_with(|sampling| sampling.n = 3);
    let mut generation = router.start(request).await.expect("accepted");
    let mut tokens: [Vec<u32>; 3] = Default::default();
    let mut completes = std::collections::BTreeMap::new();
    while let Some(response) = generation.next().await {
        match response.expect("no failure reaches the caller").response {
            Some(Response::Chunk(chunk)) => {
                tokens[chunk.index as usize].extend(&chunk.token_ids);
                if chunk.index < 2 && chunk.token_ids == [2] {
                    assert_eq!(chunk.completion_tokens, 2, "counts continue");
                }
            }
            Some(Response::Complete(complete)) => {
                completes.insert(complete.index, complete);
            }
            None => {}
        }
    }
    assert_eq!(tokens, [vec![1, 2], vec![3, 2], vec![5]]);
    assert_eq!(completes[&0].output_ids, [1, 2]);
    assert_eq!(completes[&1].output_ids, [3, 2]);
    assert_eq!(completes[&2].output_ids, [5]);
    assert_eq!(completes[&0].prompt_tokens, 0, "the client's prompt");
    let mut sent: Vec<(Vec<u32>, u32, String)> = next
        .received()
        .into_iter()
        .map(|r| {
            let n = r.sampling_params.as_ref().map_or(0, |s| s.n);
            (r.tokenized.unwrap_or_default().input_ids, n, r.request_id)
        })
        .collect();
    sent.sort();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!((sent[0].0.as_slice(), sent[0].1), ([7, 8, 1].as_slice(), 1));
    assert_eq!((sent[1].0.as_slice(), sent[1].1), ([7, 8, 3].as_slice(), 1));
    assert!(sent[0].2.ends_with("-migrated1-seq0"), "{}", sent[0].2);
    assert!(sent[1].2.ends_with("-migrated1-seq1"), "{}", sent[1].2);
    let moved: u64 = router.migrations().iter().map(|(_, n)| n).sum();
    assert_eq!(moved, 1, "one move for the request");
}

/// A request that cannot continue elsewhere (constrained decoding would
/// start over) ends with the failure.
#[tokio::test]
async fn a_constrained_stream_is_not_moved() {
    let (_dying, next, router) = dying_then_next(Answer::TokenThenFail(Code::Unavailable)).await;
    let request = streamed_with(|sampling| {
        sampling.constraint = Some(sampling_params::Constraint::Regex("[a-z]+".into()))
    });
    let mut generation = router.start(request).await.expect("accepted");
    assert!(matches!(generation.next().await, Some(Ok(_))));
    match generation.next().await {
        Some(Err(status)) => assert_eq!(status.code(), Code::Unavailable),
        other => panic!("expected the failure, got {other:?}"),
    }
    assert_eq!(next.generates(), 0);
}

/// When every worker resumes a constraint, a constrained stream moves:
/// the continuation says how much of its input is constrained output.
#[tokio::test]
async fn a_constrained_stream_moves_among_workers_that_resume_constraints() {
    let (dying, next, router) = dying_then_next(Answer::TokenThenFail(Code::Unavailable)).await;
    for fake in [&dying, &next] {
        fake.worker.set_resumes_constraints(true);
    }
    let request = streamed_with(|sampling| {
        sampling.constraint = Some(sampling_params::Constraint::Regex("[a-z]+".into()))
    });
    let mut generation = router.start(request).await.expect("accepted");
    while let Some(response) = generation.next().await {
        response.expect("moved, not failed");
    }
    let sent = &next.received()[0];
    let sampling = sent.sampling_params.as_ref().unwrap();
    assert_eq!(sampling.constrained_prefix_tokens, 1);
    assert_eq!(sent.tokenized.as_ref().unwrap().input_ids, [7, 8, 1]);
}

#[tokio::test]
async fn a_fatal_failure_stops_at_once() {
    let refusing = Fake::start(Role::Aggregated, &[Answer::Fail(Code::InvalidArgument)]).await;
    let good = Fake::start(Role::Aggregated, &[Answer::Respond]).await;
    let router = router(
        Mode::Aggregated(pool(Role::Aggregated, &[&refusing, &good])),
        2,
    );
    match router.start(request()).await {
        Err(RouteError::Upstream { status, .. }) => {
            assert_eq!(status.code(), Code::InvalidArgument)
        }
        Err(other) => panic!("expected the worker's refusal, got {other:?}"),
        Ok(_) => panic!("expected the worker's refusal, got a generation"),
    }
    assert_eq!(good.generates(), 0, "no other worker is tried");
    assert_eq!(router.retries(), 0);
    assert!(refusing.worker.is_healthy(), "a refusal opens no circuit");
    assert_eq!(refusing.worker.request_counts(), (1, 1));
}

#[tokio::test]
async fn a_busy_worker_is_retried_and_keeps_its_circuit_closed() {
    let busy = Fake::start(Role::Aggregated, &[Answer::Fail(Code::ResourceExhausted)]).await;
    let good = Fake::start(Role::Aggregated, &[Answer::Respond]).await;
    let router = router(Mode::Aggregated(pool(Role::Aggregated, &[&busy, &good])), 2);
    let mut generation = router.start(request()).await.expect("retried");
    generation.finish();
    assert!(Arc::ptr_eq(&generation.worker, &good.worker));
    assert_eq!(router.retries(), 1);
    assert!(busy.worker.is_healthy(), "pushback opens no circuit");
    assert_eq!(busy.worker.request_counts(), (1, 1));
}

#[tokio::test]
async fn retries_are_bounded_by_max_retries() {
    let a = Fake::start(Role::Aggregated, &[Answer::Fail(Code::Unavailable)]).await;
    let b = Fake::start(Role::Aggregated, &[Answer::Fail(Code::Unavailable)]).await;
    // Keep both workers in service so every attempt finds one.
    let mode = Mode::Aggregated(pool(Role::Aggregated, &[&a, &b]));
    let router = Arc::new(unshared(mode, 3, 0));
    match router.start(request()).await {
        Err(RouteError::Upstream { status, .. }) => assert_eq!(status.code(), Code::Unavailable),
        Err(other) => panic!("expected the last failure, got {other:?}"),
        Ok(_) => panic!("every worker fails"),
    }
    assert_eq!(
        a.generates() + b.generates(),
        4,
        "the first try and three retries"
    );
    assert_eq!(router.retries(), 3);
}

/// A worker on a port where nothing listens (the listener is gone).
async fn unreachable_worker(role: Role) -> Arc<Worker> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let mut url = WorkerUrl::parse(&format!("grpc://{addr}")).expect("url");
    url.backend = Some(crate::backends::Backend::TokenSpeed);
    let worker = Worker::new(url, role, Duration::from_secs(5)).expect("worker");
    worker.set_healthy(true);
    worker
}

#[tokio::test]
async fn unreachable_workers_cost_no_retry_and_leave_service_at_once() {
    let good = Fake::start(Role::Aggregated, &[Answer::Respond; 3]).await;
    let dead = [
        unreachable_worker(Role::Aggregated).await,
        unreachable_worker(Role::Aggregated).await,
    ];
    let workers = vec![dead[0].clone(), dead[1].clone(), good.worker.clone()];
    let policy = PolicyKind::RoundRobin.build(Default::default(), &Default::default());
    let mode = Mode::Aggregated(Arc::new(Pool::new(Role::Aggregated, workers, policy)));
    // No retries allowed and circuits that would take three failures.
    let router = Arc::new(unshared(mode, 0, 3));
    for _ in 0..3 {
        let mut generation = router
            .start(request())
            .await
            .expect("served by the live worker");
        assert!(matches!(generation.next().await, Some(Ok(_))));
    }
    assert_eq!(good.generates(), 3);
    for worker in &dead {
        assert!(
            !worker.is_healthy(),
            "{} is out at its first refusal",
            worker.url
        );
    }
}

#[tokio::test]
async fn no_healthy_worker_names_the_role() {
    let decode = Fake::start(Role::Decode, &[Answer::Respond]).await;
    let prefill = Fake::start(Role::Prefill, &[Answer::Respond]).await;
    prefill.worker.set_healthy(false);
    let mode = Mode::PrefillDecode {
        prefill: pool(Role::Prefill, &[&prefill]),
        decode: pool(Role::Decode, &[&decode]),
    };
    let router = router(mode, 2);
    assert!(matches!(
        router.start(request()).await,
        Err(RouteError::NoWorker(Role::Prefill))
    ));
    assert_eq!(decode.generates(), 0);
}

/// A request with one image whose 64 bytes of pixels go to the encoder.
fn pixel_request() -> GenerateRequest {
    let pixels = bytes::Bytes::from(vec![3u8; 64]);
    let item = MultimodalItem {
        content_hash: vec![7; 32].into(),
        encoder_input: Some(iris_proto::tensor::inline(
            vec![16],
            iris_proto::tensor::DType::Float32,
            pixels,
        )),
        ..MultimodalItem::default()
    };
    GenerateRequest {
        mm_inputs: Some(MultimodalInputs { items: vec![item] }),
        ..request()
    }
}

/// Serves one request with one image, to its first response.
async fn serve_one(router: &Arc<Router>) {
    let mut generation = router.start(pixel_request()).await.expect("served");
    assert!(matches!(generation.next().await, Some(Ok(_))));
    generation.finish();
}

/// A TokenSpeed encode worker asked to take rdma advertises nothing about
/// its puller: the gateway tries it, the puller is off, and the image goes
/// inline at once, in the same attempt; rdma then stays off for that
/// worker until it restarts.
#[tokio::test]
async fn an_encoder_whose_puller_is_off_gets_the_image_inline_at_once() {
    use crate::transport::Lanes;
    use crate::workers::worker::Started;
    let encoder = Fake::start(Role::Encode, &[]).await;
    encoder.service.puller_off.store(true, Ordering::SeqCst);
    encoder.worker.set_nixl_silent(true);
    let prefill = Fake::start(Role::Prefill, &[Answer::Respond]).await;
    let decode = Fake::start(Role::Decode, &[Answer::Respond]).await;
    let mode = Mode::EncodePrefillDecode {
        encode: pool(Role::Encode, &[&encoder]),
        prefill: pool(Role::Prefill, &[&prefill]),
        decode: pool(Role::Decode, &[&decode]),
    };
    let lanes = Lanes::with_unserved_arena(iris_transport::Transport::Rdma);
    let router = Arc::new(unshared(mode, 0, 1).with_lanes(lanes));
    encoder.worker.note_start(Started {
        start_secs: Some(100),
        uptime_secs: 1.0,
    });
    serve_one(&router).await;
    assert_eq!(
        encoder.payloads(),
        ["remote", "inline"],
        "refused, then inline"
    );
    assert_eq!(router.retries(), 0, "not a retry of the request");
    assert!(encoder.worker.is_healthy(), "not a failure of the worker");
    assert_eq!(encoder.worker.request_counts(), (1, 0));
    let text = router.lanes.rendered();
    iris_testkit::http::assert_lines(
        &text,
        &[
            "iris_transport_rdma_refusals_total 1",
            "iris_transport_arena_slots_in_use 0",
            "iris_transport_tensors_total{lane=\"rdma\"} 1",
            "iris_transport_tensors_total{lane=\"inline\"} 1",
            "iris_transport_fallbacks_total{reason=\"nixl_unavailable\"} 1",
        ],
    );
    // Sticky: the next image goes inline without trying.
    serve_one(&router).await;
    assert_eq!(encoder.payloads(), ["remote", "inline", "inline"]);
    // Restarted (a new start time): tried again, refused again, counted again.
    assert!(encoder.worker.note_start(Started {
        start_secs: Some(200),
        uptime_secs: 1.0,
    }));
    serve_one(&router).await;
    assert_eq!(
        encoder.payloads(),
        ["remote", "inline", "inline", "remote", "inline"]
    );
    assert!(router
        .lanes
        .rendered()
        .contains("\niris_transport_rdma_refusals_total 2\n"));
    // A worker whose puller is on keeps the lane.
    encoder.service.puller_off.store(false, Ordering::SeqCst);
    assert!(encoder.worker.note_start(Started {
        start_secs: Some(300),
        uptime_secs: 1.0,
    }));
    serve_one(&router).await;
    serve_one(&router).await;
    assert_eq!(&encoder.payloads()[5..], ["remote", "remote"]);
}

/// An aggregated worker gets the pixels inside its Generate request by
/// its lane. Asked for rdma, a worker whose puller is off refuses them —
/// a TokenSpeed scheduler servicer fails the call, an iris-engine without
/// a NIXL reader fails the stream before its first response — and the
/// request is planned again at once with the pixels inline: not a retry,
/// not a failure of the worker, the slot freed; rdma then stays off for
/// that worker.
#[tokio::test]
async fn an_aggregated_worker_that_refuses_rdma_gets_the_pixels_inline_at_once() {
    use crate::transport::Lanes;
    for in_stream in [false, true] {
        let worker = Fake::start(Role::Aggregated, &[Answer::Respond]).await;
        let refusal = match in_stream {
            false => &worker.service.puller_off,
            true => &worker.service.no_reader,
        };
        refusal.store(true, Ordering::SeqCst);
        worker.worker.set_nixl_silent(true);
        let mode = Mode::Aggregated(pool(Role::Aggregated, &[&worker]));
        let lanes = Lanes::with_unserved_arena(iris_transport::Transport::Rdma);
        let router = Arc::new(unshared(mode, 0, 1).with_lanes(lanes));
        serve_one(&router).await;
        assert_eq!(
            worker.generate_payloads(),
            ["remote", "inline"],
            "{in_stream}"
        );
        assert_eq!(router.retries(), 0, "not a retry of the request");
        assert!(worker.worker.is_healthy(), "not a failure of the worker");
        iris_testkit::http::assert_lines(
            &router.lanes.rendered(),
            &[
                "iris_transport_rdma_refusals_total 1",
                "iris_transport_arena_slots_in_use 0",
                "iris_transport_tensors_total{lane=\"rdma\"} 1",
                "iris_transport_fallbacks_total{reason=\"nixl_unavailable\"} 1",
            ],
        );
        // Sticky: the next request's pixels go inline without trying.
        serve_one(&router).await;
        assert_eq!(worker.generate_payloads(), ["remote", "inline", "inline"]);
    }
}

/// A worker that takes the RDMA lane keeps it, and its slot is held until
/// the first response (then left to the READ's notification).
#[tokio::test]
async fn an_aggregated_worker_that_takes_rdma_keeps_the_lane() {
    use crate::transport::Lanes;
    let worker = Fake::start(Role::Aggregated, &[Answer::Respond]).await;
    worker.worker.set_nixl_silent(true);
    let mode = Mode::Aggregated(pool(Role::Aggregated, &[&worker]));
    let lanes = Lanes::with_unserved_arena(iris_transport::Transport::Rdma);
    let router = Arc::new(unshared(mode, 0, 1).with_lanes(lanes));
    serve_one(&router).await;
    serve_one(&router).await;
    assert_eq!(worker.generate_payloads(), ["remote", "remote"]);
    iris_testkit::http::assert_lines(
        &router.lanes.rendered(),
        &[
            "iris_transport_rdma_refusals_total 0",
            "iris_transport_tensors_total{lane=\"rdma\"} 2",
        ],
    );
}

/// An EPD router over one scripted encoder, prefill and decode.
async fn epd(prefill: &[Answer], decode: &[Answer]) -> (Arc<Router>, [Fake; 3]) {
    let encoder = Fake::start(Role::Encode, &[]).await;
    let prefill = Fake::start(Role::Prefill, prefill).await;
    let decode = Fake::start(Role::Decode, decode).await;
    let mode = Mode::EncodePrefillDecode {
        encode: pool(Role::Encode, &[&encoder]),
        prefill: pool(Role::Prefill, &[&prefill]),
        decode: pool(Role::Decode, &[&decode]),
    };
    (router(mode, 0), [encoder, prefill, decode])
}

/// A request whose items are laid out but have no pixels yet.
fn pending_request(layouts: &[crate::mm::pixels::ItemLayout]) -> GenerateRequest {
    let ranges = (0..layouts.len())
        .map(|i| {
            vec![PlaceholderRange {
                offset: 10 * i as u32,
                length: layouts[i].tokens as u32,
            }]
        })
        .collect();
    GenerateRequest {
        mm_inputs: Some(crate::mm::items::multimodal_inputs(
            layouts,
            ranges,
            crate::mm::items::Placeholders {
                image: 9,
                video: None,
            },
        )),
        ..request()
    }
}

/// Two images on their way: their layouts, the images (the first ready)
/// and the sender that hands over the second's result.
fn two_images_first_ready() -> (
    [crate::mm::pixels::ItemLayout; 2],
    crate::mm::pending::PendingImages,
    tokio::sync::oneshot::Sender<Result<crate::mm::pending::Loaded, iris_openai::ApiError>>,
) {
    use crate::mm::pending::testing::{entry, images, layout};
    let layouts = [layout(4, 1), layout(8, 2)];
    let (images, mut ready) = images(&layouts);
    let second = ready.pop().expect("two images");
    let first = ready.pop().expect("two images");
    let _ = first.send(Ok((entry(layouts[0].clone()), None)));
    (layouts, images, second)
}

async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

/// Dispatched while its images are preprocessed, a request sends its
/// Generate legs and each image's Encode as soon as that image is ready:
/// the first image is encoded while the second is still on its way.
#[tokio::test]
async fn each_images_encode_leaves_as_soon_as_that_image_is_ready() {
    let (router, [encoder, prefill, decode]) = epd(&[Answer::Respond], &[Answer::Respond]).await;
    let (layouts, images, second) = two_images_first_ready();
    let start = router.start_with(pending_request(&layouts), &images);
    tokio::pin!(start);
    let first_out = until("the first image is encoded and both legs sent", || {
        encoder.encodes() == 1 && prefill.generates() == 1 && decode.generates() == 1
    });
    tokio::select! {
        _ = &mut start => panic!("the request started without its second image"),
        () = first_out => {}
    }
    assert_eq!(encoder.payloads(), ["inline"]);
    let _ = second.send(Ok((
        crate::mm::pending::testing::entry(layouts[1].clone()),
        None,
    )));
    let mut generation = start.await.expect("served");
    assert!(matches!(generation.next().await, Some(Ok(_))));
    generation.finish();
    assert_eq!(encoder.payloads(), ["inline", "inline"]);
    assert_eq!(router.retries(), 0);
}

/// An image that fails to preprocess after the request was dispatched
/// ends it with the image's own error: the legs already sent are
/// aborted, nothing is retried and no worker is blamed.
#[tokio::test]
async fn an_image_that_fails_after_dispatch_ends_the_request_with_its_error() {
    let (router, [encoder, prefill, decode]) = epd(&[Answer::Pending], &[Answer::Pending]).await;
    let (layouts, images, second) = two_images_first_ready();
    let start = router.start_with(pending_request(&layouts), &images);
    let fail = async {
        until("both legs are sent", || {
            prefill.generates() == 1 && decode.generates() == 1
        })
        .await;
        let corrupt = iris_openai::ApiError::bad_request("messages[0].content[2]: corrupt JPEG");
        let _ = second.send(Err(corrupt));
    };
    let (started, ()) = tokio::join!(start, fail);
    match started {
        Err(RouteError::Image(error)) => {
            assert_eq!(error.status, 400);
            assert!(error.message.contains("corrupt JPEG"), "{}", error.message);
        }
        Err(other) => panic!("not the image's error: {other:?}"),
        Ok(_) => panic!("served without its second image"),
    }
    until("both legs are aborted", || {
        prefill.aborts() == 1 && decode.aborts() == 1
    })
    .await;
    assert_eq!(router.retries(), 0);
    for fake in [&encoder, &prefill, &decode] {
        assert!(
            fake.worker.is_healthy(),
            "{} is not blamed",
            fake.worker.url
        );
    }
    assert_eq!(encoder.encodes(), 1, "only the good image was encoded");
}
