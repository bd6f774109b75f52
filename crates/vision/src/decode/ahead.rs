//! A JPEG's rows decoded ahead on a helper thread while the calling thread
//! resizes the batches already decoded: how an image alone in the pool
//! uses both cores when it streams.
//!
//! Decoding is serial (one entropy-coded scan), and at 1080p it is about
//! half of a family's work; the resize that consumes the rows is the other
//! half. Splitting only the resize over the threads, as the whole-image
//! path does, leaves the decode on one thread with the other idle for most
//! of the image. Here the decoder runs on its own scoped thread, a few
//! batches of [`MAX_BATCH_ROWS`] rows ahead (bounded channels, buffers
//! recycled), and the caller's resize takes them through [`RowSource`]:
//! the same rows in the same order, so the same bytes as decoding on the
//! calling thread.
//!
//! A crop of the columns ([`RowSource::crop_columns`]) is asked of the
//! decoder before it starts. An error on either side ends both: the
//! decoder's error is the next [`RowSource::read`]'s, and a consumer that
//! stops early drops its channel ends, which ends the decoder's loop. A
//! thread that cannot be spawned leaves the decode on the calling thread.
//! A dedicated thread, not a task on the rayon pool: a pool task blocked
//! on a channel could wait for a decoder task queued behind it.

use std::ops::Range;
use std::sync::mpsc::{sync_channel, Receiver, RecvError, SyncSender, TryRecvError};
use std::time::{Duration, Instant};

use super::{RowDecoder, MAX_BATCH_ROWS};
use crate::error::VisionError;
use crate::resize::RowSource;

/// Batches decoded ahead of the consumer at most.
const DEPTH: usize = 3;

/// How long a side waiting for the other polls before it sleeps: about
/// one batch's decoding at 1080p. Waking a sleeping thread takes tens of
/// microseconds here, once per batch, on the image's critical path (the
/// consumer of a family with little to do per row, LLaVA-1.5's crop,
/// waits for every batch): polling took LLaVA-1.5's 1080p image from
/// 5.5 to 4.3-4.6 ms, LLaVA-NeXT's from 6.7-6.9 to 5.7-5.9. The core would
/// be idle anyway (rows are decoded ahead only for an image alone in the
/// pool).
const SPIN: Duration = Duration::from_micros(100);

/// How long [`recv_soon`] polls: [`SPIN`], or nothing with a single core
/// (the thread being waited for would need the core the poll holds).
fn spin() -> Duration {
    static SPIN_HERE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN_HERE.get_or_init(|| match std::thread::available_parallelism() {
        Ok(cores) if cores.get() > 1 => SPIN,
        _ => Duration::ZERO,
    })
}

/// `rx.recv()`, polling for [`spin`] before blocking.
fn recv_soon<T>(rx: &Receiver<T>) -> Result<T, RecvError> {
    let until = Instant::now() + spin();
    loop {
        match rx.try_recv() {
            Ok(value) => return Ok(value),
            Err(TryRecvError::Disconnected) => return Err(RecvError),
            Err(TryRecvError::Empty) if Instant::now() >= until => return rx.recv(),
            Err(TryRecvError::Empty) => std::hint::spin_loop(),
        }
    }
}

thread_local! {
    /// Images whose rows this thread consumed from a helper thread.
    static AHEAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many images the calling thread has resized from rows decoded ahead
/// on a helper thread: tests and diagnostics.
pub fn thread_images_decoded_ahead() -> u64 {
    AHEAD.with(std::cell::Cell::get)
}

/// What the consumer asks of the decoder before the first row.
enum Start {
    /// Decode only these columns (the answer: the first one kept, and the
    /// new row width).
    Crop(Range<usize>),
    /// Start decoding rows.
    Rows,
}

/// One batch: its buffer and row count (0: the end, checked clean), or
/// the decoder's error.
type Batch = Result<(Vec<u8>, usize), VisionError>;

/// Runs `f` on `rows` decoded ahead on a helper thread (or on this thread
/// when none can be spawned).
pub(crate) fn with_rows_ahead<R>(
    mut rows: RowDecoder<'_>,
    f: impl FnOnce(&mut dyn RowSource) -> R,
) -> R {
    std::thread::scope(|scope| {
        let (decoder_tx, decoder_rx) = sync_channel(1);
        let (start_tx, start_rx) = sync_channel(1);
        let (crop_tx, crop_rx) = sync_channel(1);
        let (full_tx, full_rx) = sync_channel(DEPTH);
        let (free_tx, free_rx) = sync_channel(DEPTH);
        let spawned = std::thread::Builder::new()
            .name("iris-jpeg-ahead".into())
            .spawn_scoped(scope, move || {
                decode_loop(decoder_rx, start_rx, crop_tx, full_tx, free_rx)
            });
        if spawned.is_err() {
            return f(&mut rows);
        }
        let (width, height) = (rows.width(), rows.height());
        if let Err(std::sync::mpsc::SendError(mut rows)) = decoder_tx.send(rows) {
            // The thread is already gone: decode here.
            return f(&mut rows);
        }
        for _ in 0..DEPTH {
            // The decoder sizes these; a full channel only means fewer.
            let _ = free_tx.try_send(Vec::new());
        }
        AHEAD.with(|n| n.set(n.get() + 1));
        let mut ahead = Ahead {
            width,
            height,
            started: false,
            ended: false,
            pending: None,
            start_tx,
            crop_rx,
            full_rx,
            free_tx,
        };
        f(&mut ahead)
        // `ahead` drops here: the decoder's sends and receives fail and
        // its thread ends before the scope joins it.
    })
}

/// The decoder thread: waits for the decoder and the start, then decodes
/// batches into recycled buffers until the end, an error, or the
/// consumer's going away.
fn decode_loop(
    decoder: Receiver<RowDecoder<'_>>,
    start: Receiver<Start>,
    crop: SyncSender<Result<(usize, usize), VisionError>>,
    full: SyncSender<Batch>,
    free: Receiver<Vec<u8>>,
) {
    let Ok(mut rows) = recv_soon(&decoder) else {
        return;
    };
    loop {
        match recv_soon(&start) {
            Ok(Start::Crop(columns)) => {
                let answer = rows.crop_columns(columns).map(|x| (x, rows.width()));
                if crop.send(answer).is_err() {
                    return;
                }
            }
            Ok(Start::Rows) => break,
            Err(_) => return,
        }
    }
    let batch_len = MAX_BATCH_ROWS * rows.width() * 3;
    loop {
        let Ok(mut buf) = recv_soon(&free) else {
            return;
        };
        buf.resize(batch_len, 0);
        let got = rows.read(&mut buf);
        let last = !matches!(got, Ok(n) if n > 0);
        if full.send(got.map(|n| (buf, n))).is_err() || last {
            return;
        }
    }
}

/// The consumer's end: a [`RowSource`] over the batches decoded ahead.
struct Ahead {
    width: usize,
    height: usize,
    /// The decoder was told to start.
    started: bool,
    /// The decoder reported the end (later reads return 0).
    ended: bool,
    /// A batch partly handed out: its buffer, first row not yet handed
    /// out, and row count.
    pending: Option<(Vec<u8>, usize, usize)>,
    start_tx: SyncSender<Start>,
    crop_rx: Receiver<Result<(usize, usize), VisionError>>,
    full_rx: Receiver<Batch>,
    free_tx: SyncSender<Vec<u8>>,
}

/// The decoder thread is gone without a word (it panicked).
fn decoder_lost() -> VisionError {
    VisionError::decode("JPEG", "the row decoder's thread stopped")
}

impl Ahead {
    /// The next batch from the decoder, or `None` at the end.
    fn next_batch(&mut self) -> Result<Option<(Vec<u8>, usize)>, VisionError> {
        if !self.started {
            self.start_tx
                .send(Start::Rows)
                .map_err(|_| decoder_lost())?;
            self.started = true;
        }
        match recv_soon(&self.full_rx) {
            Ok(Ok((_, 0))) => {
                self.ended = true;
                Ok(None)
            }
            Ok(Ok(batch)) => Ok(Some(batch)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(decoder_lost()),
        }
    }
}

impl RowSource for Ahead {
    fn width(&self) -> usize {
        self.width
    }

    fn height(&self) -> usize {
        self.height
    }

    fn read(&mut self, dst: &mut [u8]) -> Result<usize, VisionError> {
        let row = self.width * 3;
        let (buf, first, count) = match self.pending.take() {
            Some(pending) => pending,
            None if self.ended => return Ok(0),
            None => match self.next_batch()? {
                Some((buf, count)) => (buf, 0, count),
                None => return Ok(0),
            },
        };
        let n = (count - first).min(dst.len() / row.max(1));
        if n == 0 {
            return Err(VisionError::decode("JPEG", "row buffer too small"));
        }
        dst[..n * row].copy_from_slice(&buf[first * row..(first + n) * row]);
        if first + n < count {
            self.pending = Some((buf, first + n, count));
        } else {
            // A full free channel (it holds DEPTH) drops the buffer.
            let _ = self.free_tx.try_send(buf);
        }
        Ok(n)
    }

    fn crop_columns(&mut self, columns: Range<usize>) -> Result<usize, VisionError> {
        if self.started {
            return Err(VisionError::decode(
                "JPEG",
                format!("cannot crop columns {columns:?} after the first row"),
            ));
        }
        self.start_tx
            .send(Start::Crop(columns))
            .map_err(|_| decoder_lost())?;
        let (first, width) = recv_soon(&self.crop_rx).map_err(|_| decoder_lost())??;
        self.width = width;
        Ok(first)
    }
}
