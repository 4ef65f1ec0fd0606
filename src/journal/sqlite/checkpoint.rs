//! WAL checkpoints on a connection and a thread of their own.
//!
//! Left to itself, SQLite checkpoints inside the `COMMIT` that grows the WAL
//! past `wal_autocheckpoint` pages: on the writer thread, with an fsync of the
//! database file, while every telegram queued behind that commit waits. Right
//! after a burst that showed as p99 tens of milliseconds for seconds. Here the
//! writer's automatic checkpoint is raised to a backstop, and this thread
//! runs a `PASSIVE` checkpoint every [`INTERVAL`]: it copies what the WAL
//! holds into the database file without taking the write lock, so commits
//! (and their fsync of the WAL) go on meanwhile.
//!
//! The WAL starts over (is written again from its first frame) only when a
//! transaction begins with every frame copied. Under steady writes a pass
//! never ends between two commits, so the WAL would grow to the backstop and
//! the writer would copy and fsync seconds of pages at once (a p99 of 10 ms
//! and more at 1,000 telegrams/s). So once a pass finds at least
//! [`FINISH_FRAMES`] frames in the WAL, this thread fsyncs the file itself
//! and asks the writer to [`finish`] the pass between two batches: the writer
//! copies the few frames committed since, fsyncs the WAL and the file (little
//! is left to write), and its next transaction starts the WAL over.
//!
//! Finishing every pass was measured too: at 1,000/s it fsyncs the file's
//! hot pages twice as often, the WAL's fsyncs wait behind those writes, and
//! p99 was worse; from half the backstop on, the file's fsyncs stay about as
//! rare as the backstop made them, only off the writer.
//!
//! Durability is unchanged: a commit is durable once the WAL is fsynced (by
//! the syncer for a durable write, or, for an outcome, the next durable
//! write's fsync or a checkpoint's that copies pages: SQLite fsyncs the WAL
//! before it copies, at NORMAL too); a checkpoint only moves committed
//! pages, and the WAL starts over only once the file holding them is
//! fsynced.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, ffi};

/// How often the WAL is checkpointed.
pub(super) const INTERVAL: Duration = Duration::from_millis(500);

/// The writer's own automatic checkpoint, kept only as a backstop should this
/// thread fall behind or fail: 16,384 pages (32 MiB at the 2 KiB pages of a
/// journal this build creates, 64 MiB at SQLite's default 4 KiB).
pub(super) const BACKSTOP_PAGES: i64 = 16_384;

/// A WAL this long (frames) is started over by the writer: half the
/// backstop, so the next pass still comes before the backstop while the WAL
/// grows by less than 16,384 frames a second (about 1,500 transfers/s at
/// some 10 frames each; faster, the backstop still starts it over).
pub(super) const FINISH_FRAMES: i64 = BACKSTOP_PAGES / 2;

/// Counts the thread's passes, for tests and `SqliteJournal::checkpoints`.
#[derive(Clone)]
pub(super) struct Checkpointer {
    done: Arc<AtomicU64>,
}

/// What the writer holds (with the connection, whichever thread runs a
/// batch): the thread's request to finish a pass, and the thread's life (it
/// stops once the writer is gone).
pub(super) struct Handoff {
    asked: Arc<AtomicBool>,
    _stop: mpsc::Sender<()>,
}

impl Handoff {
    /// Whether a pass asked to be finished since the last call.
    pub(super) fn take(&self) -> bool {
        self.asked.load(Ordering::Relaxed) && self.asked.swap(false, Ordering::Acquire)
    }
}

impl Checkpointer {
    /// Opens a second connection on `path` and starts the thread, which has
    /// the writer finish its passes from `finish_frames` frames on
    /// ([`FINISH_FRAMES`]; tests set fewer).
    pub(super) fn start(
        path: &Path,
        finish_frames: i64,
    ) -> Result<(Checkpointer, Handoff), String> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(super::open::file_name(path), flags)
            .map_err(|e| format!("cannot open the checkpoint connection: {e}"))?;
        conn.busy_timeout(super::open::BUSY_TIMEOUT)
            .map_err(|e| format!("cannot set busy timeout: {e}"))?;
        let (stop, stopped) = mpsc::channel::<()>();
        let done = Arc::new(AtomicU64::new(0));
        let asked = Arc::new(AtomicBool::new(false));
        let (counter, ask) = (done.clone(), asked.clone());
        std::thread::Builder::new()
            .name("relayhub-checkpoint".into())
            .stack_size(256 * 1024)
            .spawn(move || run(&conn, finish_frames, &stopped, &counter, &ask))
            .map_err(|e| format!("cannot start the checkpoint thread: {e}"))?;
        Ok((Checkpointer { done }, Handoff { asked, _stop: stop }))
    }

    /// Checkpoints run so far (that copied pages or found none to copy).
    pub(super) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }
}

/// One pass's `(busy, frames in the WAL, frames copied)`.
fn passive(conn: &Connection) -> rusqlite::Result<(i64, i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
}

fn failed(e: &dyn std::fmt::Display) {
    // The backstop keeps the WAL bounded; the next tick retries.
    metrics::counter!(crate::metric_names::JOURNAL_ERRORS, "stage" => "checkpoint").increment(1);
    tracing::warn!(error = %e, "journal checkpoint failed; retrying");
}

fn run(
    conn: &Connection,
    finish_frames: i64,
    stopped: &mpsc::Receiver<()>,
    done: &AtomicU64,
    asked: &AtomicBool,
) {
    let mut last = None;
    // Wakes every INTERVAL until the writer is gone.
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(INTERVAL) {
        let result = match passive(conn) {
            Ok(result) => result,
            Err(e) => {
                failed(&e);
                continue;
            }
        };
        done.fetch_add(1, Ordering::Relaxed);
        // A short WAL, or nothing new since the last pass: the WAL starts
        // over by itself once a pass ends between two commits, or already has.
        let (_, frames, _) = result;
        let unchanged = last.replace(result) == Some(result);
        if frames < finish_frames || unchanged {
            continue;
        }
        // SQLite fsyncs the file only when a pass copies the last frame, which
        // under steady writes it never does: the pages are written here, so
        // the writer's finishing has little left to fsync. (Durability does
        // not rest on this fsync: the WAL starts over only after the writer's
        // own checkpoint has fsynced the file with every frame in it.)
        if let Err(e) = sync_file(conn) {
            failed(&e);
            continue;
        }
        asked.store(true, Ordering::Release);
    }
}

/// Fsyncs the database file through this connection's own handle on it.
///
/// Not through a descriptor of the hub's own: closing any descriptor of a
/// file drops every POSIX lock the process holds on it, SQLite's included
/// (SQLite itself keeps such descriptors open while a lock is held), and a
/// connection without its locks can see the WAL checkpointed and deleted
/// under it by another process.
#[allow(unsafe_code)]
fn sync_file(conn: &Connection) -> Result<(), String> {
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: `conn.handle()` is the open connection borrowed for this whole
    // call (a `Connection` is not `Sync`: no other thread uses it meanwhile).
    // FILE_POINTER writes into `file` (a `*mut sqlite3_file`, passed as the
    // `void*` it expects) the pager's own handle on "main", which stays valid
    // while the connection is open.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&raw mut file).cast(),
        )
    };
    if rc != ffi::SQLITE_OK || file.is_null() {
        return Err(format!("no handle on the database file (SQLite code {rc})"));
    }
    // SAFETY: `file` is that open handle (checked non-null), and its methods
    // are checked too. The unix VFS's `xSync` touches only this handle's own
    // state and calls fsync(2) on its descriptor: safe while another
    // connection writes or syncs the same file through its own, and it
    // closes no descriptor. `SQLITE_SYNC_NORMAL` is the plain fsync SQLite's
    // own checkpoints use.
    let rc = unsafe {
        let methods = (*file).pMethods;
        match methods.as_ref().and_then(|m| m.xSync) {
            Some(sync) => sync(file, ffi::SQLITE_SYNC_NORMAL),
            None => ffi::SQLITE_MISUSE,
        }
    };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(format!(
            "fsync of the database file failed (SQLite code {rc})"
        ))
    }
}

/// Run by the writer between batches when its [`Handoff`] was asked: copies
/// what was committed since the last pass (nothing else writes meanwhile, so
/// it copies the last frame, and SQLite fsyncs the WAL and the file), so the
/// writer's next transaction starts the WAL over.
pub(super) fn finish(conn: &Connection) {
    if let Err(e) = passive(conn) {
        failed(&e);
    }
}
