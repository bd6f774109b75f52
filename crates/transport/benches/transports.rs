//! One large pixel tensor (23 MB, bf16 `[9800, 1176]`: a ~1080p Qwen2-VL
//! input) from a sender to a receiver in this process by each lane, send
//! to bytes-in-hand, with a plain memcpy as the limit:
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
//! `cargo bench -p iris-transport --bench transports [--features nixl]`;
//! `IRIS_BENCH_ITERS` sets the timed iterations (default 10, after one
//! warm-up). Prints MB/s (10^6 bytes) from the median and the latencies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iris_proto::scheduler::TensorData;
use iris_proto::tensor::DType;
use iris_transport::{
    LanePolicy, Metrics, ShmWriter, TensorReceiver, TensorSender, Transport, WorkerCaps,
};
use prost::Message;

const ROWS: u32 = 9800;
const COLS: u32 = 1176;

fn main() {
    let data = Bytes::from(pattern((ROWS * COLS * 2) as usize));
    let iters: usize = std::env::var("IRIS_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
        .max(1);
    println!(
        "tensor {} bytes, {iters} iterations after a warm-up",
        data.len()
    );
    println!("| lane | MB/s (median) | median ms | best ms | worst ms |");
    println!("|---|---|---|---|---|");
    let mut out = vec![0u8; data.len()];
    report(
        "memcpy",
        data.len(),
        time(iters, || out.copy_from_slice(&data)),
    );
    let sender = TensorSender::new(policy(), Arc::new(Metrics::default()));
    let receiver = TensorReceiver::new("/dev/shm");
    report(
        "inline",
        data.len(),
        time(iters, || inline_once(&sender, &receiver, &data, None)),
    );
    let mut pipe = Loopback::new();
    report(
        "inline+tcp",
        data.len(),
        time(iters, || {
            inline_once(&sender, &receiver, &data, Some(&mut pipe));
        }),
    );
    match ShmWriter::new("/dev/shm", "iris-tensor") {
        Ok(writer) => {
            let sender = TensorSender::new(policy(), Arc::new(Metrics::default())).with_shm(writer);
            report(
                "shm",
                data.len(),
                time(iters, || {
                    lane_once(&sender, &receiver, Transport::Shm, 0, &data)
                }),
            );
        }
        Err(e) => println!("| shm | unavailable: {e} | | | |"),
    }
    rdma::run(iters, &data);
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

fn shape() -> Vec<u32> {
    vec![ROWS, COLS]
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
    data: &Bytes,
    pipe: Option<&mut Loopback>,
) {
    let sent = sender
        .send(
            Transport::Inline,
            WorkerCaps::default(),
            0,
            shape(),
            DType::BFloat16,
            data.clone(),
        )
        .expect("inline send");
    let mut wire = sent.tensor.encode_to_vec();
    if let Some(pipe) = pipe {
        wire = pipe.trip(wire);
    }
    let wire = Bytes::from(wire);
    let decoded = TensorData::decode(wire).expect("decode");
    let got = receiver.receive(&decoded).expect("receive");
    assert_eq!(got.data.len(), data.len());
    sent.ticket.delivered();
}

/// Send by `lane`, receive, settle the ticket.
fn lane_once(
    sender: &TensorSender,
    receiver: &TensorReceiver,
    lane: Transport,
    key: i64,
    data: &Bytes,
) {
    let caps = WorkerCaps {
        shared_shm: true,
        nixl: true,
    };
    let sent = sender
        .send(lane, caps, key, shape(), DType::BFloat16, data.clone())
        .expect("send");
    assert!(
        sent.fallback.is_none(),
        "{lane} fell back: {:?}",
        sent.fallback
    );
    let got = receiver.receive(&sent.tensor).expect("receive");
    assert_eq!(got.data.len(), data.len());
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

    pub fn run(iters: usize, data: &Bytes) {
        match setup(data.len()) {
            Ok((sender, agent, receiver)) => {
                let mut key = 0;
                let times = time(iters, || {
                    key += 1;
                    lane_once(&sender, &receiver, Transport::Rdma, key, data);
                    while agent.poll_notifications().map(|n| n == 0).unwrap_or(true) {
                        std::thread::yield_now();
                    }
                });
                report("rdma", data.len(), times);
            }
            Err(e) => println!("| rdma | unavailable: {e} | | | |"),
        }
    }

    type Setup = (TensorSender, Arc<SenderAgent>, TensorReceiver);

    fn setup(nbytes: usize) -> Result<Setup, String> {
        let lib = std::env::var_os("IRIS_NIXL_LIB").map(PathBuf::from);
        let slot = (nbytes + 16).next_multiple_of(4096);
        let cfg = ArenaConfig {
            slot_size: slot,
            slot_count: 2,
            max_bytes: 2 * slot,
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

    fn free_port() -> Result<u16, String> {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        Ok(l.local_addr().map_err(|e| e.to_string())?.port())
    }
}

#[cfg(not(feature = "nixl"))]
mod rdma {
    //! Built without feature `nixl`.

    use super::*;

    pub fn run(_: usize, _: &Bytes) {
        println!("| rdma | not built (feature `nixl`) | | | |");
    }
}
