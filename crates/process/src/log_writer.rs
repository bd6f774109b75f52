//! The log sink every Iris binary writes through: lines below `WARN`
//! (a request's `request done` line, say) are gathered in memory and
//! written in one `write` every [`FLUSH_INTERVAL`] by a background
//! thread, instead of one system call per line on the request's thread;
//! `WARN` and `ERROR` lines are written at once, after whatever was
//! gathered before them, so lines keep their order and a warning is on
//! stderr before the call that logged it returns.
//!
//! What is gathered is written out by [`BatchedWriter::flush_now`] (run
//! from a panic hook and at process exit through `atexit`, see
//! `logging.rs`), when it reaches [`FLUSH_BYTES`], and by the thread. A
//! process killed outright (SIGKILL) loses at most the last
//! [`FLUSH_INTERVAL`] of informational lines.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// Longest an informational line waits before it is written.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(2);

/// Bytes gathered that are written at once by the line that reaches them.
pub const FLUSH_BYTES: usize = 64 * 1024;

/// A line sink over `W` shared by every thread that logs; cheap to clone.
pub struct BatchedWriter<W> {
    shared: Arc<Shared<W>>,
}

impl<W> Clone for BatchedWriter<W> {
    fn clone(&self) -> Self {
        BatchedWriter {
            shared: Arc::clone(&self.shared),
        }
    }
}

struct Shared<W> {
    /// The sink and the batch being written; held while writing, so
    /// batches and urgent lines reach the sink in order.
    sink: Mutex<Sink<W>>,
    /// Lines not yet written; held only to append or swap.
    gathered: Mutex<Vec<u8>>,
    /// Signalled when the first line lands in an empty `gathered`.
    pending: Condvar,
}

struct Sink<W> {
    out: W,
    batch: Vec<u8>,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<W: Write + Send + 'static> BatchedWriter<W> {
    /// A sink over `sink` with its flushing thread (`iris-log-flush`)
    /// started; the thread ends with the process.
    pub fn start(sink: W) -> std::io::Result<BatchedWriter<W>> {
        let writer = BatchedWriter::unstarted(sink);
        let flusher = writer.clone();
        std::thread::Builder::new()
            .name("iris-log-flush".into())
            .spawn(move || flusher.flush_forever())?;
        Ok(writer)
    }
}

impl<W: Write> BatchedWriter<W> {
    /// A sink over `sink` without the flushing thread: only urgent lines,
    /// a full buffer and [`BatchedWriter::flush_now`] write.
    fn unstarted(sink: W) -> BatchedWriter<W> {
        BatchedWriter {
            shared: Arc::new(Shared {
                sink: Mutex::new(Sink {
                    out: sink,
                    batch: Vec::with_capacity(FLUSH_BYTES),
                }),
                gathered: Mutex::new(Vec::with_capacity(FLUSH_BYTES)),
                pending: Condvar::new(),
            }),
        }
    }

    /// Writes out every gathered line now.
    pub fn flush_now(&self) {
        let mut sink = locked(&self.shared.sink);
        self.write_gathered(&mut sink);
    }

    /// Takes what is gathered and writes it to the sink (whose lock the
    /// caller holds). Errors are dropped, as the unbuffered stderr writer
    /// drops them: logging never fails a request.
    fn write_gathered(&self, sink: &mut Sink<W>) {
        std::mem::swap(&mut *locked(&self.shared.gathered), &mut sink.batch);
        if !sink.batch.is_empty() {
            let _ignored = sink.out.write_all(&sink.batch);
            let _ignored = sink.out.flush();
            sink.batch.clear();
        }
    }

    /// The flushing thread: waits for a line, lets [`FLUSH_INTERVAL`]
    /// gather more, writes them all.
    fn flush_forever(&self) {
        loop {
            let mut gathered = locked(&self.shared.gathered);
            while gathered.is_empty() {
                gathered = self
                    .shared
                    .pending
                    .wait(gathered)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            drop(gathered);
            std::thread::sleep(FLUSH_INTERVAL);
            self.flush_now();
        }
    }

    /// Takes one formatted line (or part of one); `urgent` lines are
    /// written at once with everything before them.
    fn take(&self, bytes: &[u8], urgent: bool) {
        if urgent {
            let mut sink = locked(&self.shared.sink);
            locked(&self.shared.gathered).extend_from_slice(bytes);
            return self.write_gathered(&mut sink);
        }
        let mut gathered = locked(&self.shared.gathered);
        let was_empty = gathered.is_empty();
        gathered.extend_from_slice(bytes);
        let full = gathered.len() >= FLUSH_BYTES;
        drop(gathered);
        if full {
            self.flush_now();
        } else if was_empty {
            self.shared.pending.notify_one();
        }
    }
}

/// The writer tracing-subscriber formats one event into.
pub struct LineHandle<'a, W> {
    writer: &'a BatchedWriter<W>,
    urgent: bool,
}

impl<W: Write> Write for LineHandle<'_, W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.writer.take(bytes, self.urgent);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a, W: Write + 'a> MakeWriter<'a> for BatchedWriter<W> {
    type Writer = LineHandle<'a, W>;

    fn make_writer(&'a self) -> Self::Writer {
        LineHandle {
            writer: self,
            urgent: true,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        LineHandle {
            writer: self,
            urgent: *meta.level() <= Level::WARN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A sink the test can read while the writer holds it.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn informational_lines_wait_for_the_thread_and_then_arrive() {
        let sink = Shared::default();
        let writer = BatchedWriter::start(sink.clone()).unwrap();
        writer.take(b"one\n", false);
        writer.take(b"two\n", false);
        let deadline = Instant::now() + Duration::from_secs(5);
        while sink.text() != "one\ntwo\n" {
            assert!(
                Instant::now() < deadline,
                "never flushed: {:?}",
                sink.text()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn an_urgent_line_is_written_at_once_after_the_lines_before_it() {
        let sink = Shared::default();
        let writer = BatchedWriter::unstarted(sink.clone());
        writer.take(b"info\n", false);
        assert_eq!(sink.text(), "");
        writer.take(b"warn\n", true);
        assert_eq!(sink.text(), "info\nwarn\n");
        writer.take(b"later\n", false);
        writer.flush_now();
        assert_eq!(sink.text(), "info\nwarn\nlater\n");
    }

    #[test]
    fn a_full_buffer_is_written_by_the_line_that_fills_it() {
        let sink = Shared::default();
        let writer = BatchedWriter::unstarted(sink.clone());
        let line = vec![b'x'; FLUSH_BYTES / 2];
        writer.take(&line, false);
        assert!(sink.text().is_empty());
        writer.take(&line, false);
        assert_eq!(sink.text().len(), FLUSH_BYTES);
    }

    #[test]
    fn through_tracing_info_waits_and_a_warning_writes_both_in_order() {
        let sink = Shared::default();
        let writer = BatchedWriter::unstarted(sink.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("first");
            assert_eq!(sink.text(), "");
            tracing::warn!("second");
            let text = sink.text();
            let first = text.find("first").expect("the info line");
            let second = text.find("second").expect("the warning");
            assert!(first < second, "{text}");
            tracing::error!("third");
            assert!(sink.text().contains("third"));
        });
    }
}
