//! WAL checkpoints on a connection and a thread of their own.
//!
//! Left to itself, SQLite checkpoints inside the `COMMIT` that grows the WAL
//! past `wal_autocheckpoint` pages: on the writer thread, with an fsync of the
//! database file, while every telegram queued behind that commit waits. Right
//! after a burst that showed as p99 tens of milliseconds for seconds. Here the
//! writer's automatic checkpoint is raised to a backstop, and this thread
//! runs a `PASSIVE` checkpoint every [`INTERVAL`]: it copies what the WAL
//! holds into the database file and fsyncs that file without taking the write
//! lock, so commits (and their fsync of the WAL) go on meanwhile.
//!
//! Durability is unchanged: a commit is durable once the WAL is fsynced (a
//! FULL commit's own fsync, or, for an outcome committed with NORMAL, the
//! next FULL commit's or a checkpoint's that copies pages: SQLite fsyncs the
//! WAL before it copies); a checkpoint only moves committed pages.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// How often the WAL is checkpointed.
pub(super) const INTERVAL: Duration = Duration::from_millis(500);

/// The writer's own automatic checkpoint, kept only as a backstop should this
/// thread fall behind or fail: 16,384 pages (64 MiB at 4 KiB pages).
pub(super) const BACKSTOP_PAGES: i64 = 16_384;

/// Stops the thread when the last handle on the journal is dropped.
pub(super) struct Checkpointer {
    _stop: mpsc::Sender<()>,
    done: Arc<AtomicU64>,
}

impl Checkpointer {
    /// Opens a second connection on `path` and starts the thread.
    pub(super) fn start(path: &Path) -> Result<Checkpointer, String> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)
            .map_err(|e| format!("cannot open the checkpoint connection: {e}"))?;
        conn.busy_timeout(super::open::BUSY_TIMEOUT)
            .map_err(|e| format!("cannot set busy timeout: {e}"))?;
        let (stop, stopped) = mpsc::channel::<()>();
        let done = Arc::new(AtomicU64::new(0));
        let counter = done.clone();
        std::thread::Builder::new()
            .name("relayhub-checkpoint".into())
            .stack_size(256 * 1024)
            .spawn(move || run(&conn, &stopped, &counter))
            .map_err(|e| format!("cannot start the checkpoint thread: {e}"))?;
        Ok(Checkpointer { _stop: stop, done })
    }

    /// Checkpoints run so far (that copied pages or found none to copy).
    pub(super) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }
}

fn run(conn: &Connection, stopped: &mpsc::Receiver<()>, done: &AtomicU64) {
    // Wakes every INTERVAL until every handle (and so the sender) is gone.
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(INTERVAL) {
        let result = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        });
        match result {
            Ok(_) => {
                done.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                // The backstop keeps the WAL bounded; the next tick retries.
                metrics::counter!(crate::metric_names::JOURNAL_ERRORS, "stage" => "checkpoint")
                    .increment(1);
                tracing::warn!(error = %e, "journal checkpoint failed; retrying");
            }
        }
    }
}
