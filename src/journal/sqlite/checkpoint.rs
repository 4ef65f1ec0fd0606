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
//! The pages a pass copies are only in the page cache until the file's
//! fsync, and the disk's flush that each claim's WAL fsync makes waits for
//! every write in flight: one fsync of a second's scattered pages (30-46
//! ms once a journal has grown past its cache of hot index pages) held
//! claims for as long. So after each pass that found something new this
//! thread starts the file's writes to the disk at once ([`write_back`]:
//! `sync_file_range(SYNC_FILE_RANGE_WRITE)`, which waits for none), and
//! while the WAL grows it passes every [`BUSY_INTERVAL`]: the writes go out
//! in tenths of a second, and the file's fsync finds little left to write
//! (p99 at 1,000/s after a burst halved in docs/performance.md).
//!
//! Durability is unchanged: a commit is durable once the WAL is fsynced (by
//! the syncer for a durable write, or, for an outcome, the next durable
//! write's fsync or a checkpoint's that copies pages: SQLite fsyncs the WAL
//! before it copies, at NORMAL too); a checkpoint only moves committed
//! pages, and the WAL starts over only once the file holding them is
//! fsynced.
//!
//! A failed write or fsync of the database file ends that: Linux reports a
//! write-back error once to each open descriptor and may drop the pages it
//! could not write, so a later fsync through another descriptor (the
//! writer's, when it finishes a pass) can succeed without them, and the WAL
//! would start over on top of the only copy of those commits. So after one,
//! no pass runs or finishes again, the writer's own automatic checkpoint is
//! turned off, and durable writes are refused (as after a failed fsync of
//! the WAL) until the hub restarts; SQLite then replays the whole WAL into
//! the file.
//!
//! The writer's backstop is a WAL hook of ours, not SQLite's automatic
//! checkpoint: SQLite's own hook ignores what its checkpoint returns, so a
//! failed write or fsync of the file there would be lost, and the next
//! pass, through a descriptor that never saw the error, could start the WAL
//! over. Ours runs the same `PASSIVE` checkpoint past [`BACKSTOP_PAGES`] and
//! stops the checkpoints as above on an I/O error (the commit that ran the
//! hook stands: a hook's error would only make a committed transaction
//! report a failure).

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, mpsc};
use std::time::{Duration, Instant};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, ffi};

use super::open::BACKSTOP_PAGES;
use super::syncer::Syncer;

/// How often the WAL is checkpointed while nothing is written.
pub(super) const INTERVAL: Duration = Duration::from_millis(500);

/// How often the WAL is checkpointed while it grows (the last pass found
/// something new): each pass's writes to the file are smaller.
pub(super) const BUSY_INTERVAL: Duration = Duration::from_millis(100);

/// A WAL this long (frames) is started over by the writer: half the
/// backstop, so the next pass still comes before the backstop while the WAL
/// grows by less than 16,384 frames a second (about 1,500 transfers/s at
/// some 10 frames each; faster, the backstop still starts it over).
pub(super) const FINISH_FRAMES: i64 = BACKSTOP_PAGES / 2;

/// When the thread asks the writer to finish a pass and when the writer
/// checkpoints by itself (tests set lower marks than the hub's).
#[derive(Clone, Copy)]
pub(super) struct Marks {
    /// WAL frames from which a pass is finished by the writer.
    pub(super) finish_frames: i64,
    /// WAL frames from which the writer checkpoints in its commit.
    pub(super) backstop_pages: i64,
}

impl Default for Marks {
    fn default() -> Marks {
        Marks {
            finish_frames: FINISH_FRAMES,
            backstop_pages: BACKSTOP_PAGES,
        }
    }
}

/// The size a WAL file is cut back to once it starts over: the backstop's
/// frames (a page and its 24-byte header each) after the 32-byte file
/// header, so a WAL kept within the backstop is never cut.
pub(super) fn wal_limit(marks: Marks, page_size: i64) -> i64 {
    marks
        .backstop_pages
        .saturating_mul(page_size + 24)
        .saturating_add(32)
}

/// Held while pages are copied into the database file and fsynced (the
/// thread's pass and its fsync, the writer's finishing, its backstop), with
/// `broken` read and set under it: a failure in one is seen by the next
/// before it copies a page. Without it, a backstop could copy the last frame
/// and fsync through a descriptor that never saw the thread's failing fsync,
/// and the WAL would start over on pages the disk dropped.
#[derive(Clone, Default)]
struct Copying(Arc<Mutex<()>>);

impl Copying {
    /// Waits for the lock (the thread: its passes are not in a hurry).
    fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock if nobody holds it (the writer: a commit waits for no pass).
    fn try_hold(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// Counts the thread's passes, for tests and `SqliteJournal::checkpoints`.
#[derive(Clone)]
pub(super) struct Checkpointer {
    done: Arc<AtomicU64>,
    /// Why the checkpoints stopped (and durable writes are refused), once
    /// they have.
    broken: Arc<OnceLock<String>>,
    /// Checkpoints the writer ran past the backstop (that succeeded).
    #[cfg(test)]
    backstops: Arc<AtomicU64>,
    /// In tests: every fsync of the file fails from now on.
    #[cfg(test)]
    fail_syncs: Arc<AtomicBool>,
    /// In tests: the writer's backstop checkpoints fail from now on.
    #[cfg(test)]
    fail_backstops: Arc<AtomicBool>,
}

/// What the writer holds (with the connection, whichever thread runs a
/// batch): the thread's request to finish a pass, and the thread's life (it
/// stops once the writer is gone).
pub(super) struct Handoff {
    asked: Arc<AtomicBool>,
    /// Why the thread stopped after a failed write or fsync of the file.
    broken: Arc<OnceLock<String>>,
    /// Held by whoever copies pages into the file (see [`Copying`]).
    copying: Copying,
    /// The writer has stopped checkpointing (its backstop off, durable
    /// writes refused).
    stopped: bool,
    _stop: mpsc::Sender<()>,
}

impl Handoff {
    /// Run by the writer between batches: finishes a pass the thread asked
    /// it to, or, once a write or fsync of the file has failed (here or on
    /// the thread), turns checkpoints off for good: the writer's automatic
    /// one on `conn`, durable writes refused through `syncer`.
    pub(super) fn between_batches(&mut self, conn: &Connection, syncer: &Syncer) {
        if self.stopped {
            return;
        }
        let why = match self.broken.get() {
            Some(why) => why.clone(),
            None if self.take() => {
                // The thread is in a pass: asked again, finished after a
                // later batch.
                let Some(_copying) = self.copying.try_hold() else {
                    self.asked.store(true, Ordering::Release);
                    return;
                };
                match self.broken.get() {
                    Some(why) => why.clone(),
                    None => match finish(conn) {
                        Ok(()) => return,
                        Err(why) => {
                            mark_broken(&self.broken, why.clone());
                            why
                        }
                    },
                }
            }
            None => return,
        };
        self.stopped = true;
        // Nor when the connection closes (SQLite's last connection otherwise
        // checkpoints and deletes the WAL).
        let off = conn
            .execute_batch("PRAGMA wal_autocheckpoint = 0")
            .and_then(|()| conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true));
        if let Err(e) = off {
            tracing::error!(error = %e, "cannot turn the journal's automatic checkpoints off");
        }
        syncer.fail(format!(
            "{why}; the journal's WAL is kept whole and durable writes are refused until \
             the hub restarts"
        ));
        tracing::error!(%why, "journal checkpoints stopped: durable writes are refused until the hub restarts, which replays the WAL into the file");
    }

    /// Run as the writer's connection closes: it never checkpoints then.
    /// SQLite's last connection to close does, and this one is not the last
    /// (the thread's closes once this `Handoff` is gone, and checkpoints
    /// unless a failure came first); a failure after a look at `broken` here
    /// could otherwise leave it the last, checkpointing a broken file.
    pub(super) fn before_close(&self, conn: &Connection) {
        keep_wal_at_close(conn);
    }

    /// Whether a pass asked to be finished since the last call.
    fn take(&self) -> bool {
        self.asked.load(Ordering::Relaxed) && self.asked.swap(false, Ordering::Acquire)
    }
}

impl Checkpointer {
    /// Opens a second connection on `path` and starts the thread, which has
    /// the writer finish its passes from `marks.finish_frames` frames on, and
    /// installs the backstop on the writer's connection `writer`.
    pub(super) fn start(
        path: &Path,
        writer: &mut Connection,
        marks: Marks,
    ) -> Result<(Checkpointer, Handoff), String> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(super::open::file_name(path), flags)
            .map_err(|e| format!("cannot open the checkpoint connection: {e}"))?;
        conn.busy_timeout(super::open::BUSY_TIMEOUT)
            .map_err(|e| format!("cannot set busy timeout: {e}"))?;
        super::open::keep_wal_file(&conn)?;
        // Only for `write_back`; without it the passes run as before.
        let file = descriptor(path);
        let (stop, stopped) = mpsc::channel::<()>();
        let done = Arc::new(AtomicU64::new(0));
        let asked = Arc::new(AtomicBool::new(false));
        let broken = Arc::new(OnceLock::new());
        let fail_syncs = Arc::new(AtomicBool::new(false));
        let copying = Copying::default();
        let backstop = Backstop {
            pages: marks.backstop_pages,
            broken: broken.clone(),
            copying: copying.clone(),
            ran: Arc::new(AtomicU64::new(0)),
            fail: Arc::new(AtomicBool::new(false)),
        };
        #[cfg(test)]
        let (backstops, fail_backstops) = (backstop.ran.clone(), backstop.fail.clone());
        // A WAL that grew past the backstop (a reader holding an old
        // snapshot keeps it from starting over, and a burst outruns the
        // passes) is cut back to the backstop's size by the first commit
        // after it starts over; without a limit its file stays at its
        // largest for good.
        let page_size: i64 = writer
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(|e| format!("cannot read page_size: {e}"))?;
        writer
            .pragma_update(None, "journal_size_limit", wal_limit(marks, page_size))
            .map_err(|e| format!("cannot set journal_size_limit: {e}"))?;
        writer
            .wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages| {
                backstop.after_commit(wal, pages);
                Ok(())
            }))
            .map_err(|e| format!("cannot install the journal's backstop checkpoint: {e}"))?;
        let thread = Thread {
            copying: copying.clone(),
            finish_frames: marks.finish_frames,
            done: done.clone(),
            asked: asked.clone(),
            broken: broken.clone(),
            fail_syncs: fail_syncs.clone(),
        };
        std::thread::Builder::new()
            .name("relayhub-checkpoint".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                thread.run(&conn, &stopped, file);
                keep_wal_if_broken(&conn, &thread.broken);
            })
            .map_err(|e| format!("cannot start the checkpoint thread: {e}"))?;
        let handoff = Handoff {
            asked,
            broken: broken.clone(),
            copying,
            stopped: false,
            _stop: stop,
        };
        #[cfg(not(test))]
        let _ = fail_syncs;
        let checkpointer = Checkpointer {
            done,
            broken,
            #[cfg(test)]
            backstops,
            #[cfg(test)]
            fail_syncs,
            #[cfg(test)]
            fail_backstops,
        };
        Ok((checkpointer, handoff))
    }

    /// In tests: every fsync of the file fails from now on.
    #[cfg(test)]
    pub(super) fn fail_file_syncs(&self) {
        self.fail_syncs.store(true, Ordering::SeqCst);
    }

    /// In tests: the writer's backstop checkpoints fail from now on.
    #[cfg(test)]
    pub(super) fn fail_backstops(&self) {
        self.fail_backstops.store(true, Ordering::SeqCst);
    }

    /// In tests: checkpoints the writer ran past the backstop.
    #[cfg(test)]
    pub(super) fn backstops(&self) -> u64 {
        self.backstops.load(Ordering::SeqCst)
    }

    /// Checkpoints run so far (that copied pages or found none to copy).
    pub(super) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Why the checkpoints stopped for good, if they did.
    pub(super) fn broken(&self) -> Option<String> {
        self.broken.get().cloned()
    }
}

/// Descriptors opened by [`descriptor`], by the file's device and inode.
static DESCRIPTORS: Mutex<Vec<(u64, u64, &'static File)>> = Mutex::new(Vec::new());

/// A descriptor of the database file at `path` for [`write_back`]: one per
/// file for the life of the process, never closed. POSIX drops every lock a
/// process holds on a file when any descriptor of it is closed, SQLite's
/// included; closed with its journal, it could take the locks of a journal
/// on the same file opened again since (a connection without its shared
/// lock can have its WAL checkpointed and deleted under it by another
/// process). Held, the file's inode is not reused, so its number names it.
/// `None` if the file cannot be opened: the passes run without it.
fn descriptor(path: &Path) -> Option<&'static File> {
    use std::os::unix::fs::MetadataExt;
    let path = super::open::file_name(path);
    let mut held = DESCRIPTORS.lock().unwrap_or_else(PoisonError::into_inner);
    let find = |held: &[(u64, u64, &'static File)], meta: &std::fs::Metadata| {
        held.iter()
            .find(|(dev, ino, _)| (*dev, *ino) == (meta.dev(), meta.ino()))
            .map(|(_, _, file)| *file)
    };
    if let Some(file) = find(&held, &std::fs::metadata(&path).ok()?) {
        return Some(file);
    }
    let file = File::open(&path).ok()?;
    let meta = file.metadata().ok();
    // Leaked on purpose: never closed (see above).
    let file: &'static File = Box::leak(Box::new(file));
    let meta = meta?;
    // Replaced since the look-up: a second descriptor, kept as well.
    if let Some(known) = find(&held, &meta) {
        return Some(known);
    }
    held.push((meta.dev(), meta.ino(), file));
    Some(file)
}

/// After a failure, `conn` does not checkpoint when it closes (SQLite's last
/// connection to close would, and delete the WAL: either the writer's or
/// the thread's may be the last).
fn keep_wal_if_broken(conn: &Connection, broken: &OnceLock<String>) {
    if broken.get().is_some() {
        keep_wal_at_close(conn);
    }
}

/// `conn` does not checkpoint when it closes.
fn keep_wal_at_close(conn: &Connection) {
    if let Err(e) = conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true) {
        tracing::error!(error = %e, "cannot keep the journal's WAL whole at close");
    }
}

/// Stops the checkpoints for good after a failed write or fsync of the file
/// (counted; the first reason stays). The writer, between batches, does the
/// rest.
fn mark_broken(broken: &OnceLock<String>, why: String) {
    metrics::counter!(crate::metric_names::JOURNAL_ERRORS, "stage" => "checkpoint").increment(1);
    let _ = broken.set(why);
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

/// Whether a checkpoint's error is the disk's (a write or fsync that
/// failed), not a lock or a busy reader's.
fn is_io(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::SystemIoFailure)
}

/// The writer's own checkpoint, run in the commit that grows the WAL past
/// `pages` frames (should the thread fall behind or stop); SQLite's
/// automatic checkpoint would do the same but drop its error.
#[derive(Clone)]
struct Backstop {
    pages: i64,
    broken: Arc<OnceLock<String>>,
    copying: Copying,
    /// Checkpoints that succeeded.
    ran: Arc<AtomicU64>,
    /// In tests: every backstop checkpoint fails as a failed fsync would.
    fail: Arc<AtomicBool>,
}

impl Backstop {
    /// The WAL hook: `pages` is the WAL's length in frames after a commit.
    fn after_commit(&self, wal: &mut rusqlite::hooks::Wal, pages: i32) {
        if i64::from(pages) < self.pages {
            return;
        }
        // A pass of the thread copies meanwhile: the next commit checks again.
        let Some(_copying) = self.copying.try_hold() else {
            return;
        };
        // Once broken, nothing checkpoints again (the writer turns this
        // hook off between batches).
        if self.broken.get().is_some() {
            return;
        }
        let result = match self.fail.load(Ordering::Relaxed) {
            true => Err("disk I/O error (a test's)".to_string()),
            false => match wal.checkpoint_v2(rusqlite::wal::CheckpointMode::PASSIVE) {
                Err(e) if is_io(&e) => Err(e.to_string()),
                // Another checkpoint holds SQLite's lock (another process's:
                // this one's are kept out by `copying`): as SQLite's own
                // hook, nothing to report.
                Err(rusqlite::Error::SqliteFailure(f, _))
                    if f.code == rusqlite::ErrorCode::DatabaseBusy =>
                {
                    Ok(())
                }
                Err(e) => {
                    failed(&e);
                    Ok(())
                }
                Ok(_) => {
                    self.ran.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
            },
        };
        if let Err(e) = result {
            mark_broken(
                &self.broken,
                format!("the writer's backstop checkpoint of the journal failed: {e}"),
            );
        }
    }
}

/// The checkpoint thread's share of the state.
struct Thread {
    copying: Copying,
    finish_frames: i64,
    done: Arc<AtomicU64>,
    asked: Arc<AtomicBool>,
    broken: Arc<OnceLock<String>>,
    fail_syncs: Arc<AtomicBool>,
}

impl Thread {
    fn run(&self, conn: &Connection, stopped: &mpsc::Receiver<()>, file: Option<&File>) {
        let (finish_frames, done, asked) = (self.finish_frames, &*self.done, &*self.asked);
        let mut last = None;
        let mut wait = INTERVAL;
        let mut finished = Instant::now();
        // Wakes every INTERVAL (BUSY_INTERVAL while the WAL grows) until the
        // writer is gone.
        while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(wait) {
            wait = INTERVAL;
            // Until the end of this pass, its fsync included.
            let _copying = self.copying.hold();
            // The writer's backstop or finishing failed: no pass again.
            if self.broken.get().is_some() {
                return;
            }
            let result = match passive(conn) {
                Ok(result) => result,
                Err(e) if is_io(&e) => {
                    return mark_broken(
                        &self.broken,
                        format!("a checkpoint of the journal failed: {e}"),
                    );
                }
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
            if !unchanged {
                wait = BUSY_INTERVAL;
                if let Some(file) = file {
                    write_back(file);
                }
            }
            // At most every INTERVAL, as when passes came no faster: while a
            // reader holds an old snapshot the WAL cannot start over, however
            // often the writer is asked.
            if frames < finish_frames || unchanged || finished.elapsed() < INTERVAL {
                continue;
            }
            // SQLite fsyncs the file only when a pass copies the last frame,
            // which under steady writes it never does: the pages are written
            // here, so the writer's finishing has little left to fsync. A
            // failure here is the disk's: the pages copied so far may be lost
            // (see the module's doc).
            let synced = match self.fail_syncs.load(Ordering::Relaxed) {
                true => Err("fsync of the database file failed (a test's)".to_string()),
                false => sync_file(conn),
            };
            if let Err(e) = synced {
                return mark_broken(&self.broken, e);
            }
            asked.store(true, Ordering::Release);
            finished = Instant::now();
        }
    }
}

/// Starts the writes of the file's dirty pages to the disk and returns
/// without waiting for them (Linux's `sync_file_range` with
/// `SYNC_FILE_RANGE_WRITE`: no flush of the disk's cache, no metadata; not
/// a durability step, only an earlier start for the fsync that is). A
/// failure changes nothing but when the pages are written: counted, not
/// retried.
#[allow(unsafe_code)]
fn write_back(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: `file` is an open descriptor borrowed for the call, and
        // sync_file_range reads no memory of ours.
        let rc =
            unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            metrics::counter!(crate::metric_names::JOURNAL_ERRORS, "stage" => "checkpoint")
                .increment(1);
            tracing::debug!(error = %e, "starting the journal file's writes failed");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
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
/// writer's next transaction starts the WAL over. `Err`: a write or fsync of
/// the file failed.
fn finish(conn: &Connection) -> Result<(), String> {
    match passive(conn) {
        Ok(_) => Ok(()),
        Err(e) if is_io(&e) => Err(format!("a checkpoint of the journal failed: {e}")),
        Err(e) => {
            failed(&e);
            Ok(())
        }
    }
}

#[cfg(all(test, target_os = "linux", target_arch = "x86_64"))]
mod tests {
    use std::io::Write;

    use super::*;

    /// Pages of `file` in the page cache that are dirty (neither written nor
    /// being written), by Linux's `cachestat` (6.5 on); `None` where the
    /// kernel has no such call.
    #[allow(unsafe_code)]
    fn dirty_pages(file: &File) -> Option<u64> {
        use std::os::fd::AsRawFd;
        #[repr(C)]
        struct Range {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct CacheStat {
            cache: u64,
            dirty: u64,
            writeback: u64,
            evicted: u64,
            recently_evicted: u64,
        }
        const SYS_CACHESTAT: libc::c_long = 451;
        let range = Range { off: 0, len: 0 };
        let mut stat = CacheStat::default();
        // SAFETY: both structs are `repr(C)` as the kernel declares them,
        // live for the call, and only `stat` is written.
        let rc = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                file.as_raw_fd(),
                &raw const range,
                &raw mut stat,
                0,
            )
        };
        (rc == 0).then_some(stat.dirty)
    }

    /// After a failure a connection keeps the WAL when it closes; before
    /// one it checkpoints as SQLite does.
    #[test]
    fn after_a_failure_no_connection_checkpoints_as_it_closes() {
        let (_dir, conn, backstop) = hooked();
        let keeps = |c: &Connection| {
            c.db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE)
                .unwrap()
        };
        keep_wal_if_broken(&conn, &backstop.broken);
        assert!(!keeps(&conn));
        let _ = backstop.broken.set("a failed fsync".into());
        keep_wal_if_broken(&conn, &backstop.broken);
        assert!(keeps(&conn));
    }

    /// The thread fails after the writer's connection began to close and
    /// closes its own first: the writer's, the last, must not checkpoint.
    #[test]
    fn a_failure_while_the_writer_closes_leaves_the_wal_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let writer = super::super::open::open(&path).unwrap();
        // As the hub's: no checkpoint in a commit (backstop far away).
        writer
            .execute_batch("PRAGMA wal_autocheckpoint = 0; CREATE TABLE IF NOT EXISTS t(x)")
            .unwrap();
        let thread = Connection::open(&path).unwrap();
        for i in 0..100 {
            writer.execute("INSERT INTO t VALUES (?1)", [i]).unwrap();
        }
        let wal = dir.path().join("j.db-wal");
        assert!(std::fs::metadata(&wal).unwrap().len() > 0);
        let broken = Arc::new(OnceLock::new());
        let handoff = Handoff {
            asked: Arc::new(AtomicBool::new(false)),
            broken: broken.clone(),
            copying: Copying::default(),
            stopped: false,
            _stop: mpsc::channel().0,
        };
        // impl Drop for Writer: nothing broken yet.
        handoff.before_close(&writer);
        // The checkpoint thread's pass fails meanwhile: it stops, keeps
        // the WAL on its own connection, and closes it.
        let _ = broken.set("fsync of the database file failed".to_string());
        keep_wal_if_broken(&thread, &broken);
        drop(thread);
        // Then the writer's connection closes, the last one.
        drop(writer);
        assert!(
            std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0),
            "the WAL was checkpointed and deleted after the failure"
        );
    }

    /// A journal whose writer connection checkpoints past one frame, and
    /// that backstop's shared state.
    fn hooked() -> (tempfile::TempDir, Connection, Backstop) {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = super::super::open::open(&dir.path().join("j.db")).unwrap();
        conn.execute_batch("CREATE TABLE IF NOT EXISTS t(x)")
            .unwrap();
        let backstop = Backstop {
            pages: 1,
            broken: Arc::new(OnceLock::new()),
            copying: Copying::default(),
            ran: Arc::new(AtomicU64::new(0)),
            fail: Arc::new(AtomicBool::new(false)),
        };
        let shared = backstop.clone();
        conn.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages| {
            backstop.after_commit(wal, pages);
            Ok(())
        }))
        .unwrap();
        (dir, conn, shared)
    }

    /// While a pass of the thread copies (and fsyncs), the writer's backstop
    /// does not: a failure of that fsync is seen before it copies a page.
    #[test]
    fn the_backstop_waits_for_no_pass_and_copies_none_beside_one() {
        let (_dir, conn, backstop) = hooked();
        let pass = backstop.copying.hold();
        conn.execute("INSERT INTO t VALUES (1)", []).unwrap();
        assert_eq!(
            backstop.ran.load(Ordering::SeqCst),
            0,
            "copied beside a pass"
        );
        // The pass failed: the next commit's backstop copies nothing either.
        let _ = backstop.broken.set("the thread's fsync failed".into());
        drop(pass);
        conn.execute("INSERT INTO t VALUES (2)", []).unwrap();
        assert_eq!(
            backstop.ran.load(Ordering::SeqCst),
            0,
            "copied after a failure"
        );
    }

    /// With no pass running, it does.
    #[test]
    fn the_backstop_copies_when_no_pass_runs() {
        let (_dir, conn, backstop) = hooked();
        conn.execute("INSERT INTO t VALUES (1)", []).unwrap();
        assert_eq!(backstop.ran.load(Ordering::SeqCst), 1);
    }

    /// A backstop checkpoint that only finds another checkpoint
    /// running (SQLITE_BUSY, which SQLite's own hook ignored and the thread's
    /// PRAGMA reports as busy=1, not an error) is not a journal error.
    #[test]
    #[allow(unsafe_code)]
    fn a_busy_backstop_is_not_a_journal_error() {
        use metrics_exporter_prometheus::PrometheusBuilder;
        use std::os::fd::AsRawFd;
        let (dir, conn, backstop) = hooked();
        let (ran, broken) = (backstop.ran.clone(), backstop.broken.clone());
        // Another checkpointer holds WAL_CKPT_LOCK (byte 121 of the -shm), as
        // the checkpoint thread does during its pass (an OFD lock conflicts
        // with SQLite's own fcntl locks even within this process).
        let shm = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.path().join("j.db-shm"))
            .unwrap();
        // SAFETY: `flock` is a plain C struct of integers; all zeroes is a
        // valid value of it.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        fl.l_start = 121;
        fl.l_len = 1;
        // SAFETY: `shm` is an open descriptor for the call, and F_OFD_SETLK
        // reads the `flock` it is given, which lives for the call.
        let rc = unsafe { libc::fcntl(shm.as_raw_fd(), libc::F_OFD_SETLK, &raw mut fl) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            conn.execute("INSERT INTO t VALUES (1)", []).unwrap();
        });
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the checkpoint ran");
        assert!(broken.get().is_none());
        let text = handle.render();
        assert!(
            !text.contains(crate::metric_names::JOURNAL_ERRORS),
            "a busy backstop counted as a journal error:\n{text}"
        );
    }

    #[test]
    fn one_descriptor_per_file_whatever_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        File::create(&path).unwrap();
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let first = descriptor(&path).expect("opened");
        assert!(std::ptr::eq(first, descriptor(&path).unwrap()));
        assert!(std::ptr::eq(first, descriptor(&link).unwrap()));
        let other = dir.path().join("other.db");
        File::create(&other).unwrap();
        assert!(!std::ptr::eq(first, descriptor(&other).unwrap()));
        assert!(descriptor(&dir.path().join("absent.db")).is_none());
    }

    #[test]
    fn write_back_leaves_no_page_of_the_file_dirty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pages");
        let mut writer = File::create(&path).unwrap();
        writer.write_all(&vec![7u8; 256 * 1024]).unwrap();
        let file = File::open(&path).unwrap();
        match dirty_pages(&file) {
            Some(0) | None => {
                // tmpfs keeps no dirty pages; an old kernel has no cachestat.
                eprintln!("skipped: no dirty pages to see on this file system or kernel");
                return;
            }
            Some(_) => {}
        }
        write_back(&file);
        assert_eq!(
            dirty_pages(&file),
            Some(0),
            "every page written or being written"
        );
    }
}
