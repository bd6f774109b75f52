//! A 1080p image's pixel tensor for Qwen2-VL (`[10764, 1176]`: 25.3 MB in
//! bf16, 50.6 MB in float32) from a sender to a receiver in this process
//! by each lane, send to bytes-in-hand, with a plain memcpy as the limit:
//!
//! - `memcpy`: `copy_from_slice` into a preallocated buffer;
//! - `inline`: `TensorSender::send` inline, the `TensorData` message
//!   prost-encoded and decoded (gRPC's serialization, without its
//!   sockets), then `TensorReceiver::receive`;
//! - `inline+tcp`: the same with the encoded message written through a
//!   loopback TCP connection and read back whole before decoding (the
//!   least a gRPC call adds; HTTP/2 framing and flow control come on top);
//! - `shm`: written to `/dev/shm`, read and unlinked by the receiver;
//! - `rdma` (feature `nixl`, library required): leased into the arena, READ
//!   by a NIXL receiver agent over UCX (`UCX_TLS` as set, e.g. `tcp`), slot
//!   freed by the notification.
//!
//! Then the same lanes the way the gateway uses them: one
//! `TokenSpeedEncoder.Encode` call over loopback (the gateway's
//! `iris_process::splice::call` on a tonic channel, the server with the
//! encoder's HTTP/2 settings and allocator), the tensor in the request's
//! item, resolved to bytes by the server's `TensorReceiver` on the
//! blocking pool before it answers (see `grpc`). Inline runs twice more:
//! through tonic's generated client (its codec copies the whole message
//! into one growing buffer first: the figure before splicing) and against
//! a server with tonic's default HTTP/2 settings.
//!
//! `cargo bench -p iris-transport --bench transports [--features nixl] [-- WORD…]`:
//! with words, only the rows whose name (`bf16 grpc inline`, `f32 shm`…)
//! contains all of them (and none given as `!WORD`) run.
//! `IRIS_BENCH_ITERS` sets the timed iterations (default 10, after one
//! warm-up); `IRIS_BENCH_GLIBC_DEFAULTS=1` leaves out
//! `keep_large_allocations`. Prints MB/s (10^6 bytes) from the median and
//! the latencies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iris_proto::scheduler::TensorData;
use iris_proto::tensor::DType;
use iris_transport::{
    LanePolicy, Metrics, ShmWriter, TensorReceiver, TensorSender, Transport, WorkerCaps,
};
use prost::Message;

/// Patches of a 1920×1080 image for Qwen2-VL (resized to 1932×1092).
const ROWS: u32 = 10764;
/// Values per patch (3 channels × 2 frames × 14 × 14).
const COLS: u32 = 1176;

/// One tensor the lanes carry.
struct Case {
    /// `bf16` or `f32`: the first word of every row's name.
    name: &'static str,
    dtype: DType,
    data: Bytes,
}

impl Case {
    fn new(name: &'static str, dtype: DType, width: usize) -> Case {
        let data = Bytes::from(pattern(ROWS as usize * COLS as usize * width));
        Case { name, dtype, data }
    }

    fn shape(&self) -> Vec<u32> {
        vec![ROWS, COLS]
    }

    fn len(&self) -> usize {
        self.data.len()
    }
}

/// Which rows run: those whose full name contains every word given on
/// the command line (cargo's own `--bench` flag aside) and none of those
/// given as `!WORD`.
struct Filter(Vec<String>);

impl Filter {
    fn from_args() -> Filter {
        Filter(
            std::env::args()
                .skip(1)
                .filter(|a| !a.starts_with('-'))
                .collect(),
        )
    }

    fn wants(&self, row: &str) -> bool {
        self.0.iter().all(|w| match w.strip_prefix('!') {
            Some(unwanted) => !row.contains(unwanted),
            None => row.contains(w.as_str()),
        })
    }
}

fn main() {
    // The allocator as the receiving workers set it (`iris-encoder`,
    // `iris-engine`); the sending side, spliced, allocates nothing large.
    // `IRIS_BENCH_GLIBC_DEFAULTS=1` leaves glibc's defaults (as the
    // encoder ran before).
    if std::env::var_os("IRIS_BENCH_GLIBC_DEFAULTS").is_none() {
        iris_process::keep_large_allocations();
    }
    let iters: usize = std::env::var("IRIS_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
        .max(1);
    let filter = Filter::from_args();
    println!("{iters} iterations after a warm-up");
    for case in [
        Case::new("bf16", DType::BFloat16, 2),
        Case::new("f32", DType::Float32, 4),
    ] {
        println!();
        println!("{} `[{ROWS}, {COLS}]`: {} bytes", case.name, case.len());
        println!("| lane | MB/s (median) | median ms | best ms | worst ms |");
        println!("|---|---|---|---|---|");
        lanes(iters, &filter, &case);
        rdma::run(iters, &filter, &case);
        grpc::run(iters, &filter, &case);
    }
}

/// The lanes without a gRPC call.
fn lanes(iters: usize, filter: &Filter, case: &Case) {
    let row = |lane: &str| format!("{} {lane}", case.name);
    if filter.wants(&row("memcpy")) {
        let mut out = vec![0u8; case.len()];
        let data = &case.data;
        report(
            &row("memcpy"),
            case.len(),
            time(iters, || out.copy_from_slice(data)),
        );
    }
    let sender = TensorSender::new(policy(), Arc::new(Metrics::default()));
    let receiver = TensorReceiver::new("/dev/shm");
    if filter.wants(&row("inline")) {
        report(
            &row("inline"),
            case.len(),
            time(iters, || inline_once(&sender, &receiver, case, None)),
        );
    }
    if filter.wants(&row("inline+tcp")) {
        let mut pipe = Loopback::new();
        report(
            &row("inline+tcp"),
            case.len(),
            time(iters, || {
                inline_once(&sender, &receiver, case, Some(&mut pipe));
            }),
        );
    }
    if !filter.wants(&row("shm")) {
        return;
    }
    match ShmWriter::new("/dev/shm", "iris-tensor") {
        Ok(writer) => {
            let sender = TensorSender::new(policy(), Arc::new(Metrics::default())).with_shm(writer);
            report(
                &row("shm"),
                case.len(),
                time(iters, || {
                    lane_once(&sender, &receiver, Transport::Shm, 0, case)
                }),
            );
        }
        Err(e) => println!("| {} | unavailable: {e} | | | |", row("shm")),
    }
}

fn policy() -> LanePolicy {
    LanePolicy {
        min_shm_bytes: 0,
        min_rdma_bytes: 0,
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 9)) as u8)
        .collect()
}

/// A loopback TCP connection echoing length-prefixed messages back whole
/// (one copy in, one copy out, like a gRPC frame's trip).
struct Loopback {
    tx: std::net::TcpStream,
    rx: std::net::TcpStream,
}

impl Loopback {
    fn new() -> Loopback {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let tx =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (rx, _) = listener.accept().expect("accept");
        tx.set_nodelay(true).expect("nodelay");
        Loopback { tx, rx }
    }

    /// Sends `msg` and returns what arrived on the other side.
    fn trip(&mut self, msg: Vec<u8>) -> Vec<u8> {
        use std::io::{Read, Write};
        let len = msg.len();
        let mut writer = self.tx.try_clone().expect("clone");
        let send = std::thread::spawn(move || writer.write_all(&msg).expect("write"));
        let mut got = vec![0u8; len];
        self.rx.read_exact(&mut got).expect("read");
        send.join().expect("writer thread");
        got
    }
}

/// Inline through a serialized message (and a loopback socket if given).
fn inline_once(
    sender: &TensorSender,
    receiver: &TensorReceiver,
    case: &Case,
    pipe: Option<&mut Loopback>,
) {
    let sent = sender
        .send(
            Transport::Inline,
            WorkerCaps::default(),
            0,
            case.shape(),
            case.dtype,
            case.data.clone(),
        )
        .expect("inline send");
    let mut wire = sent.tensor.encode_to_vec();
    if let Some(pipe) = pipe {
        wire = pipe.trip(wire);
    }
    let wire = Bytes::from(wire);
    let decoded = TensorData::decode(wire).expect("decode");
    let got = receiver.receive(&decoded).expect("receive");
    assert_eq!(got.data.len(), case.len());
    sent.ticket.delivered();
}

/// Send by `lane`, receive, settle the ticket.
fn lane_once(
    sender: &TensorSender,
    receiver: &TensorReceiver,
    lane: Transport,
    key: i64,
    case: &Case,
) {
    let caps = WorkerCaps {
        shared_shm: true,
        nixl: true,
    };
    let sent = sender
        .send(lane, caps, key, case.shape(), case.dtype, case.data.clone())
        .expect("send");
    assert!(
        sent.fallback.is_none(),
        "{lane} fell back: {:?}",
        sent.fallback
    );
    let got = receiver.receive(&sent.tensor).expect("receive");
    assert_eq!(got.data.len(), case.len());
    sent.ticket.delivered();
}

fn time(iters: usize, mut f: impl FnMut()) -> Vec<Duration> {
    f();
    (0..iters)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed()
        })
        .collect()
}

fn report(lane: &str, nbytes: usize, mut times: Vec<Duration>) {
    times.sort();
    let median = times[times.len() / 2];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| {lane} | {:.0} | {:.2} | {:.2} | {:.2} |",
        nbytes as f64 / median.as_secs_f64() / 1e6,
        ms(median),
        ms(times[0]),
        ms(times[times.len() - 1]),
    );
}

#[cfg(feature = "nixl")]
mod rdma {
    //! The RDMA lane between two agents of this process.

    use std::path::PathBuf;

    use iris_transport::arena::{ArenaConfig, SlotArena, SystemClock};
    use iris_transport::nixl::{ReceiverAgent, ReceiverConfig, SenderAgent};
    use iris_transport::RdmaEndpoint;

    use super::*;

    pub fn run(iters: usize, filter: &Filter, case: &Case) {
        let row = format!("{} rdma", case.name);
        if !filter.wants(&row) {
            return;
        }
        match setup(case.len(), 2) {
            Ok((sender, agent, receiver)) => {
                let mut key = 0;
                let times = time(iters, || {
                    key += 1;
                    lane_once(&sender, &receiver, Transport::Rdma, key, case);
                    while agent.poll_notifications().map(|n| n == 0).unwrap_or(true) {
                        std::thread::yield_now();
                    }
                });
                report(&row, case.len(), times);
            }
            Err(e) => println!("| {row} | unavailable: {e} | | | |"),
        }
    }

    type Setup = (TensorSender, Arc<SenderAgent>, TensorReceiver);

    fn setup(nbytes: usize, slots: usize) -> Result<Setup, String> {
        let lib = std::env::var_os("IRIS_NIXL_LIB").map(PathBuf::from);
        let slot = (nbytes + 16).next_multiple_of(4096);
        let cfg = ArenaConfig {
            slot_size: slot,
            slot_count: slots,
            max_bytes: slots * slot,
            ttl: Duration::from_secs(60),
            receiver_hold: Duration::from_secs(30),
        };
        let metrics = Arc::new(Metrics::default());
        let arena = Arc::new(
            SlotArena::new(cfg, Arc::new(SystemClock::default()), metrics.clone())
                .map_err(|e| e.to_string())?,
        );
        let port = free_port()?;
        let agent = Arc::new(
            SenderAgent::start(lib.as_deref(), "iris-bench-sender", port, arena.clone())
                .map_err(|e| e.to_string())?,
        );
        let reader = ReceiverAgent::start(
            lib.as_deref(),
            ReceiverConfig {
                name: "iris-bench-receiver".into(),
                listen_port: free_port()?,
                sender_name: "iris-bench-sender".into(),
                landing_slots: 1,
                landing_slot_size: slot,
                landing_wait: Duration::from_secs(1),
                read_timeout: Duration::from_secs(5),
            },
        )
        .map_err(|e| e.to_string())?;
        let endpoint = RdmaEndpoint {
            arena,
            ip: "127.0.0.1".into(),
            port,
        };
        let sender = TensorSender::new(policy(), metrics).with_rdma(endpoint);
        let receiver = TensorReceiver::new("/dev/shm").with_remote(Arc::new(reader));
        Ok((sender, agent, receiver))
    }

    /// The rdma lane for `grpc`: an arena with a slot per call, so no call
    /// waits for the previous one's notification (the reaper's job in the
    /// gateway); notifications are polled after each call.
    pub fn grpc_setup(nbytes: usize, iters: usize) -> Result<super::grpc::Setup, String> {
        let (sender, agent, receiver) = setup(nbytes, iters + 2)?;
        Ok(super::grpc::Setup {
            name: "rdma",
            lane: Transport::Rdma,
            sender,
            receiver,
            after: Box::new(move || {
                let _ = agent.poll_notifications();
            }),
            encoder_http2: true,
            stock_client: false,
        })
    }

    fn free_port() -> Result<u16, String> {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        Ok(l.local_addr().map_err(|e| e.to_string())?.port())
    }
}

#[cfg(not(feature = "nixl"))]
mod rdma {
    //! Built without feature `nixl`.

    use super::*;

    pub fn run(_: usize, filter: &Filter, case: &Case) {
        let row = format!("{} rdma", case.name);
        if filter.wants(&row) {
            println!("| {row} | not built (feature `nixl`) | | | |");
        }
    }

    pub fn grpc_setup(_: usize, _: usize) -> Result<super::grpc::Setup, String> {
        Err("not built (feature `nixl`)".into())
    }
}

mod grpc {
    //! Each lane through a real unary `Encode` call on loopback: the time
    //! from the sender's `send` to the reply, which the server sends once
    //! the receiver holds the bytes.

    use std::net::SocketAddr;

    use iris_proto::encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
    use iris_proto::encoder::token_speed_encoder_server::{
        TokenSpeedEncoder, TokenSpeedEncoderServer,
    };
    use iris_proto::encoder::{EncodeItemAssignment, EncodeRequest, EncodeResponse};
    use iris_proto::scheduler::{MultimodalInputs, MultimodalItem};
    use tonic::transport::{Channel, Endpoint};
    use tonic::{Request, Response, Status};

    use super::*;

    /// The gateway's and the encoder's message size cap.
    const MAX_MESSAGE_BYTES: usize = 512 << 20;
    const ENCODE_PATH: &str = "/tokenspeed.grpc.encoder.TokenSpeedEncoder/Encode";

    struct Server(TensorReceiver);

    #[tonic::async_trait]
    impl TokenSpeedEncoder for Server {
        async fn encode(
            &self,
            request: Request<EncodeRequest>,
        ) -> Result<Response<EncodeResponse>, Status> {
            let receiver = self.0.clone();
            let tensor = request
                .into_inner()
                .mm_inputs
                .and_then(|m| m.items.into_iter().next())
                .and_then(|item| item.encoder_input)
                .ok_or_else(|| Status::invalid_argument("no tensor"))?;
            let got = tokio::task::spawn_blocking(move || receiver.receive(&tensor))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            std::hint::black_box(got.data.len());
            Ok(Response::new(EncodeResponse { accepted: true }))
        }
    }

    /// One lane's sender and the receiver its server uses.
    pub struct Setup {
        pub name: &'static str,
        pub lane: Transport,
        pub sender: TensorSender,
        pub receiver: TensorReceiver,
        /// Called after each call (e.g. polling the RDMA notification).
        pub after: Box<dyn FnMut()>,
        /// The server runs with the encoder's HTTP/2 settings
        /// (`iris_process::large_message_server`), else tonic's defaults.
        pub encoder_http2: bool,
        /// The request goes through tonic's generated client (its codec
        /// copies the message into one buffer) instead of the gateway's
        /// `iris_process::splice::call`, which sends the tensor by reference.
        pub stock_client: bool,
    }

    impl Setup {
        /// A lane without RDMA state, its sender with default metrics.
        fn plain(name: &'static str, lane: Transport, encoder_http2: bool) -> Setup {
            Setup {
                name,
                lane,
                sender: TensorSender::new(policy(), Arc::new(Metrics::default())),
                receiver: TensorReceiver::new("/dev/shm"),
                after: Box::new(|| {}),
                encoder_http2,
                stock_client: false,
            }
        }
    }

    pub fn run(iters: usize, filter: &Filter, case: &Case) {
        let row = |lane: &str| format!("{} grpc {lane}", case.name);
        let mut stock = Setup::plain("inline (tonic's client)", Transport::Inline, true);
        stock.stock_client = true;
        let mut setups = vec![
            Setup::plain("inline", Transport::Inline, true),
            stock,
            Setup::plain(
                "inline (tonic's HTTP/2 server defaults)",
                Transport::Inline,
                false,
            ),
        ];
        if filter.wants(&row("shm")) {
            match ShmWriter::new("/dev/shm", "iris-tensor") {
                Ok(writer) => {
                    let mut shm = Setup::plain("shm", Transport::Shm, true);
                    shm.sender = shm.sender.with_shm(writer);
                    setups.push(shm);
                }
                Err(e) => println!("| {} | unavailable: {e} | | | |", row("shm")),
            }
        }
        if filter.wants(&row("rdma")) {
            match rdma::grpc_setup(case.len(), iters) {
                Ok(setup) => setups.push(setup),
                Err(e) => println!("| {} | unavailable: {e} | | | |", row("rdma")),
            }
        }
        setups.retain(|s| filter.wants(&row(s.name)));
        if setups.is_empty() {
            return;
        }
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => return println!("| {} | no runtime: {e} | | | |", row("")),
        };
        for setup in setups {
            let name = row(setup.name);
            match runtime.block_on(lane(iters, case, setup)) {
                Ok(times) => report(&name, case.len(), times),
                Err(e) => println!("| {name} | failed: {e} | | | |"),
            }
        }
    }

    async fn serve(receiver: TensorReceiver, encoder_http2: bool) -> Result<SocketAddr, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let incoming = iris_process::nodelay_incoming(listener);
        let service = TokenSpeedEncoderServer::new(Server(receiver))
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let mut builder = if encoder_http2 {
            iris_process::large_message_server()
        } else {
            tonic::transport::Server::builder()
        };
        tokio::spawn(builder.add_service(service).serve_with_incoming(incoming));
        Ok(addr)
    }

    async fn connect(addr: SocketAddr) -> Result<Channel, String> {
        Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| e.to_string())
    }

    async fn call(channel: &Channel, setup: &Setup, key: i64, case: &Case) -> Result<(), String> {
        let caps = WorkerCaps {
            shared_shm: true,
            nixl: true,
        };
        let sent = setup
            .sender
            .send(
                setup.lane,
                caps,
                key,
                case.shape(),
                case.dtype,
                case.data.clone(),
            )
            .map_err(|e| e.to_string())?;
        if let Some(reason) = sent.fallback {
            return Err(format!("fell back inline: {reason}"));
        }
        let request = EncodeRequest {
            request_id: format!("bench-{key}"),
            mm_inputs: Some(MultimodalInputs {
                items: vec![MultimodalItem {
                    encoder_input: Some(sent.tensor),
                    ..Default::default()
                }],
            }),
            items: vec![EncodeItemAssignment {
                bootstrap_room: key,
            }],
        };
        if setup.stock_client {
            TokenSpeedEncoderClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
                .encode(request)
                .await
                .map_err(|e| e.to_string())?;
        } else {
            spliced(channel, &request).await?;
        }
        sent.ticket.delivered();
        Ok(())
    }

    /// The gateway's Encode call: the tensor sent by reference.
    async fn spliced(channel: &Channel, request: &EncodeRequest) -> Result<(), String> {
        let response = iris_process::splice::call::<_, _, EncodeResponse>(
            channel,
            ENCODE_PATH,
            request,
            None,
            MAX_MESSAGE_BYTES,
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut stream = response.into_inner();
        stream
            .message()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no answer")?;
        stream.trailers().await.map_err(|e| e.to_string())?;
        Ok(())
    }

    async fn lane(iters: usize, case: &Case, mut setup: Setup) -> Result<Vec<Duration>, String> {
        let addr = serve(setup.receiver.clone(), setup.encoder_http2).await?;
        let channel = connect(addr).await?;
        let mut times = Vec::with_capacity(iters);
        for key in 0..=iters as i64 {
            let t0 = Instant::now();
            call(&channel, &setup, key + 1, case).await?;
            if key > 0 {
                times.push(t0.elapsed());
            }
            (setup.after)();
        }
        Ok(times)
    }
}
