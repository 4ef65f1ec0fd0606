//! The log writer: lines are gathered in memory and written to stderr in
//! batches by a thread of their own, never by the task that logs them.
//!
//! A writer thread woken for every line (a queue and a wake-up per line, as
//! `tracing-appender` does) cost a busy hub a futex wake, a context switch and
//! a `write` per telegram: up to a fifth of its CPU per telegram at `info`.
//! Here a line is appended to a buffer under a mutex held for a copy, and the
//! thread writes whatever has gathered every [`FLUSH_EVERY`] (sooner when the
//! buffer passes [`EAGER_BYTES`]). While stderr is not read, the thread blocks
//! in its write, the buffer fills to [`BUFFERED_LINES`] and further lines are
//! dropped and counted, so a stalled reader never holds up a telegram.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Lines held for stderr before new ones are dropped: a few seconds of a busy
/// hub's INFO lines, a few MiB at most.
pub const BUFFERED_LINES: usize = 4096;

/// How long a line may wait in memory before it is written.
pub const FLUSH_EVERY: Duration = Duration::from_millis(10);

/// A buffer this large is written at once.
const EAGER_BYTES: usize = 64 * 1024;

#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    lines: usize,
}

struct Shared {
    batch: Mutex<Batch>,
    dropped: AtomicU64,
    stop: AtomicBool,
}

fn lock(m: &Mutex<Batch>) -> MutexGuard<'_, Batch> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The handle loggers write through (`MakeWriter`); cheap to clone.
#[derive(Clone)]
pub struct BatchedWriter {
    shared: Arc<Shared>,
    thread: std::thread::Thread,
}

/// Owns the writer thread: dropping it writes what is left and stops it,
/// waiting at most [`LAST_FLUSH`] (stderr may not be read at all).
pub struct FlushGuard {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    done: Receiver<()>,
}

/// The longest a clean stop waits for the last lines to be written.
pub const LAST_FLUSH: Duration = Duration::from_secs(1);

/// Lines dropped because stderr was not read fast enough.
#[derive(Clone)]
pub struct Dropped(Arc<Shared>);

impl Dropped {
    pub fn lines(&self) -> u64 {
        self.0.dropped.load(Ordering::Relaxed)
    }
}

/// Starts the thread writing to `out`.
pub fn batched<W: Write + Send + 'static>(
    out: W,
) -> std::io::Result<(BatchedWriter, FlushGuard, Dropped)> {
    let shared = Arc::new(Shared {
        batch: Mutex::new(Batch::default()),
        dropped: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let inside = shared.clone();
    let (done_tx, done) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("relayhub-log".into())
        // It only copies bytes to a file descriptor.
        .stack_size(128 * 1024)
        .spawn(move || write_batches(&inside, out, &done_tx))?;
    let writer = BatchedWriter {
        shared: shared.clone(),
        thread: handle.thread().clone(),
    };
    Ok((
        writer,
        FlushGuard {
            shared: shared.clone(),
            handle: Some(handle),
            done,
        },
        Dropped(shared),
    ))
}

fn write_batches<W: Write>(shared: &Shared, mut out: W, done: &Sender<()>) {
    let mut spare = Vec::new();
    loop {
        let stopping = shared.stop.load(Ordering::Acquire);
        let lines = {
            let mut batch = lock(&shared.batch);
            std::mem::swap(&mut batch.bytes, &mut spare);
            std::mem::take(&mut batch.lines)
        };
        if !spare.is_empty() {
            // Nowhere to report a failed write (stderr closed or full): the
            // batch's lines are counted as dropped (some may have been written).
            if out.write_all(&spare).and_then(|()| out.flush()).is_err() {
                shared.dropped.fetch_add(lines as u64, Ordering::Relaxed);
            }
            spare.clear();
        }
        if stopping {
            let _ = done.send(());
            return;
        }
        std::thread::park_timeout(FLUSH_EVERY);
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            // Joined only once it is done: a write to a stderr nobody
            // reads may never return.
            if self.done.recv_timeout(LAST_FLUSH).is_ok() {
                let _ = h.join();
            }
        }
    }
}

impl Write for BatchedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let eager = {
            let mut batch = lock(&self.shared.batch);
            if batch.lines >= BUFFERED_LINES {
                drop(batch);
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                return Ok(buf.len());
            }
            let before = batch.bytes.len();
            batch.bytes.extend_from_slice(buf);
            batch.lines += 1;
            before < EAGER_BYTES && batch.bytes.len() >= EAGER_BYTES
        };
        if eager {
            self.thread.unpark();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchedWriter {
    type Writer = BatchedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test reads, that can be made to block.
    #[derive(Clone, Default)]
    struct Sink {
        bytes: Arc<Mutex<Vec<u8>>>,
        gate: Arc<Mutex<()>>,
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _open = self.gate.lock().unwrap();
            self.bytes.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_reach_the_output_in_order_and_all_are_written_on_drop() {
        let sink = Sink::default();
        let (mut w, guard, dropped) = batched(sink.clone()).unwrap();
        // The subscriber writes each event whole, in one call.
        for i in 0..100 {
            w.write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        drop(guard);
        let text = String::from_utf8(sink.bytes.lock().unwrap().clone()).unwrap();
        let want: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text, want);
        assert_eq!(dropped.lines(), 0);
    }

    #[test]
    fn a_blocked_output_drops_and_counts_lines_without_blocking_the_writer() {
        let sink = Sink::default();
        let held = sink.gate.lock().unwrap();
        let (mut w, guard, dropped) = batched(sink.clone()).unwrap();
        let total = 3 * BUFFERED_LINES as u64;
        for i in 0..total {
            // Never blocks: the thread is stuck in the sink's write.
            w.write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        // At most two buffers' worth are kept (one being written, one gathering).
        assert!(
            dropped.lines() >= total - 2 * BUFFERED_LINES as u64,
            "dropped {}",
            dropped.lines()
        );
        drop(held);
        drop(guard);
        let kept = sink
            .bytes
            .lock()
            .unwrap()
            .iter()
            .filter(|b| **b == b'\n')
            .count() as u64;
        assert_eq!(kept + dropped.lines(), total);
    }

    /// An output that refuses every write (stderr closed, or full).
    struct Refusing;

    impl Write for Refusing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from_raw_os_error(28)) // ENOSPC
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_a_failed_write_loses_are_counted() {
        let (mut w, guard, dropped) = batched(Refusing).unwrap();
        for i in 0..10 {
            w.write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        drop(guard);
        assert_eq!(dropped.lines(), 10);
    }
}
