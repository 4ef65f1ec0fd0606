//! The WAL's fsync, outside the lock on the connection.
//!
//! Every commit runs with `synchronous=NORMAL`: SQLite writes the commit's
//! frames to the WAL and returns without an fsync. A durable write (a claim,
//! a failover's URL) is answered only after an fsync of the WAL file that
//! *began* after its commit. The WAL is one file written in order, so that
//! fsync puts the commit, and every one before it, on disk: what
//! `synchronous=FULL` does, whose only difference in WAL mode is that fsync,
//! made inside the commit while the connection is held. Here it is made
//! after the lock is released, so the next batch (outcomes that need no
//! fsync, claims that share the next one) commits while it runs, instead of
//! queueing behind it.
//!
//! A checkpoint that copies frames into the database file fsyncs the WAL
//! first and the file after (at `NORMAL` too), and the WAL starts over only
//! after that: a frame is never overwritten before it is on disk.
//!
//! The WAL is fsynced through a descriptor of the syncer's own, opened on
//! the `-wal` file once and kept (Linux fsyncs a file, whichever descriptor
//! wrote it; SQLite holds no lock on the WAL file, so this descriptor's
//! close drops none), with `fdatasync`, as SQLite does where it has it. The
//! file is never `stat`ed: on Linux a file whose times were read gets
//! fine-grained times on its next write, which dirty its inode, and every
//! fsync then waits for one more write (the inode's) before the device's
//! flush.
//!
//! After an fsync fails, every durable write fails until the hub restarts:
//! Linux may have dropped the pages it could not write, and a later fsync
//! would succeed without them.
//!
//! The same once the journal's files are no longer where the next start will
//! look for them (deleted, or replaced by another file): what the hub writes
//! then is lost to its next start, which would post every GUID of it again.
//! After each fsync the identities of the files at the WAL's and the
//! database's names are compared with the ones opened, read with `statx`
//! asking for the inode only (no times, so the fine-grained times above are
//! not set off).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use rusqlite::Connection;

use super::command::Reply;

/// Fsyncs the WAL for the durable writes committed before each call.
pub(super) struct Syncer {
    wal: PathBuf,
    /// The database file's name and the file it named at start.
    db: Option<(PathBuf, FileId)>,
    /// Fsyncs begun so far. A commit is covered by any fsync begun after it.
    begun: AtomicU64,
    /// Fsyncs ended so far, failed ones too: fewer than `begun` while one runs.
    ended: AtomicU64,
    /// Fsyncs run one at a time, and each from the same open file.
    file: Mutex<Disk>,
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Successful fsyncs.
    done: AtomicU64,
    /// Closed: the journal is closing, and SQLite may delete the WAL.
    closing: std::sync::atomic::AtomicBool,
    /// Why durable writes are refused for good, once they are: read
    /// without waiting for an fsync (`/readyz`).
    refused: std::sync::OnceLock<String>,
    /// In tests, runs before each fsync: can hold it or make it fail.
    #[cfg(test)]
    pub(super) before: Mutex<Option<BeforeFsync>>,
    /// In tests, callers that have read `begun` and wait for an fsync.
    #[cfg(test)]
    waiting: AtomicU64,
}

/// A test's hook, run before each fsync.
#[cfg(test)]
pub(super) type BeforeFsync = Box<dyn FnMut() -> Result<(), String> + Send>;

/// The WAL file, once open, and what its fsyncs did.
#[derive(Default)]
struct Disk {
    open: Option<File>,
    /// Fsyncs that completed, counted as `begun` counts them.
    synced: u64,
    failed: Option<String>,
}

/// Durable answers committed by the writer thread, waiting for an fsync.
#[derive(Default)]
struct Queue {
    replies: Vec<Box<dyn Reply>>,
    closed: bool,
}

impl Syncer {
    /// A syncer for the journal `conn` has open, whose WAL is the file
    /// SQLite opened + `-wal` (a symbolic link is followed: SQLite keeps the
    /// WAL beside the file the link names), with its own thread.
    pub(super) fn start(conn: &Connection, path: &Path) -> std::io::Result<Arc<Syncer>> {
        let mut syncer = Syncer::new(wal_of(conn, path));
        syncer.db = db_of(&syncer.wal).and_then(|db| match file_id(&db) {
            Ok(id) => Some((db, id)),
            Err(e) => {
                tracing::warn!(%e, db = %db.display(), "cannot tell the journal file's identity: a deleted or replaced journal will not be noticed");
                None
            }
        });
        let syncer = Arc::new(syncer);
        lock(&syncer.file).open = open(&syncer.wal).ok();
        let thread = syncer.clone();
        std::thread::Builder::new()
            .name("relayhub-fsync".into())
            // It only waits on the disk and sends answers: no deep calls.
            .stack_size(128 * 1024)
            .spawn(move || thread.run())?;
        Ok(syncer)
    }

    /// A syncer with no thread and nothing open, for a journal opened for
    /// reading: it never makes a durable write.
    pub(super) fn idle(conn: &Connection, path: &Path) -> Arc<Syncer> {
        let syncer = Syncer::new(wal_of(conn, path));
        syncer.close();
        Arc::new(syncer)
    }

    /// A syncer for the WAL file `wal`, not yet open (the first fsync opens
    /// it), answering on the caller's thread until `run` has one of its own.
    fn new(wal: PathBuf) -> Syncer {
        Syncer {
            wal,
            db: None,
            begun: AtomicU64::new(0),
            ended: AtomicU64::new(0),
            file: Mutex::new(Disk::default()),
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            done: AtomicU64::new(0),
            closing: std::sync::atomic::AtomicBool::new(false),
            refused: std::sync::OnceLock::new(),
            #[cfg(test)]
            before: Mutex::new(None),
            #[cfg(test)]
            waiting: AtomicU64::new(0),
        }
    }

    /// Why every durable write is refused until a restart, if it is.
    pub(super) fn refusal(&self) -> Option<String> {
        self.refused.get().cloned()
    }

    /// Whether an fsync is running now.
    pub(super) fn busy(&self) -> bool {
        self.ended.load(Ordering::Relaxed) != self.begun.load(Ordering::Relaxed)
    }

    /// The WAL file this syncer fsyncs.
    #[cfg(test)]
    pub(super) fn wal(&self) -> &Path {
        &self.wal
    }

    /// Whether [`Syncer::close`] was called.
    #[cfg(test)]
    pub(super) fn closed(&self) -> bool {
        lock(&self.queue).closed
    }

    /// Fsyncs that succeeded so far.
    #[cfg(test)]
    pub(super) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Answers `replies` (committed, durable) once an fsync begun after now
    /// ends, run on this thread. Fsyncs that end meanwhile on other threads
    /// count, so threads that wait together share one.
    pub(super) fn sync_here(&self, replies: Vec<Box<dyn Reply>>) {
        if replies.is_empty() {
            return;
        }
        let seen = self.begun.load(Ordering::SeqCst);
        #[cfg(test)]
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let result = self.sync_after(seen);
        answer(replies, &result);
    }

    /// Hands `replies` (committed, durable) to the syncer's thread, which
    /// answers them after its next fsync.
    pub(super) fn queue(&self, replies: Vec<Box<dyn Reply>>) {
        if replies.is_empty() {
            return;
        }
        let mut queue = lock(&self.queue);
        if queue.closed {
            drop(queue);
            // No thread to hand them to (it ended): fsync here.
            return self.sync_here(replies);
        }
        queue.replies.extend(replies);
        drop(queue);
        self.ready.notify_one();
    }

    /// Refuses every durable write from now on, as after a failed fsync of
    /// the WAL: `why` is what they hear (the first reason stays).
    pub(super) fn fail(&self, why: String) {
        lock(&self.file).failed.get_or_insert(why);
    }

    /// Lets the syncer's thread end once the queue is empty.
    pub(super) fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
        lock(&self.queue).closed = true;
        self.ready.notify_all();
    }

    /// The syncer's thread: takes every answer queued, fsyncs once for all
    /// of them, answers; ends after [`Syncer::close`] with nothing queued.
    pub(super) fn run(self: Arc<Self>) {
        loop {
            let replies = {
                let mut queue = lock(&self.queue);
                while queue.replies.is_empty() && !queue.closed {
                    queue = self
                        .ready
                        .wait(queue)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if queue.replies.is_empty() {
                    return;
                }
                std::mem::take(&mut queue.replies)
            };
            self.sync_here(replies);
        }
    }

    /// Makes sure an fsync numbered above `seen` (begun after the caller
    /// read `begun`) has ended.
    fn sync_after(&self, seen: u64) -> Result<(), String> {
        let mut disk = lock(&self.file);
        if let Some(why) = &disk.failed {
            return Err(why.clone());
        }
        if disk.synced > seen {
            return Ok(());
        }
        let number = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
        let synced = self.fsync(&mut disk);
        self.ended.fetch_add(1, Ordering::Relaxed);
        match synced {
            Ok(()) => {
                disk.synced = number;
                self.done.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            // Nothing was written or lost: the next fsync tries again.
            Err(Failure::Open(why)) => Err(why),
            Err(Failure::Gone(what)) => {
                let why = format!(
                    "{what} while the hub runs: what it journals now would be lost to \
                     its next start; durable writes are refused (nothing sent) \
                     until the file is back and the hub restarts"
                );
                // Closing, the last connection's close may delete the WAL.
                if !self.closing.load(Ordering::Relaxed) {
                    tracing::error!("{why}");
                    let _ = self.refused.set(why.clone());
                }
                disk.failed = Some(why.clone());
                Err(why)
            }
            Err(Failure::Sync(e)) => {
                let why = format!(
                    "fsync of {} failed: {e}; durable writes are refused until \
                     the hub restarts",
                    self.wal.display()
                );
                let _ = self.refused.set(why.clone());
                disk.failed = Some(why.clone());
                Err(why)
            }
        }
    }

    /// One fsync of the WAL file (`fdatasync`: its data, and its size when
    /// it grew; not its times).
    fn fsync(&self, disk: &mut Disk) -> Result<(), Failure> {
        #[cfg(test)]
        if let Some(before) = lock(&self.before).as_mut() {
            before().map_err(Failure::Sync)?;
        }
        let file = match &mut disk.open {
            Some(file) => file,
            none => none.insert(open(&self.wal).map_err(Failure::Open)?),
        };
        file.sync_data().map_err(|e| Failure::Sync(e.to_string()))?;
        self.still_in_place(file)
    }

    /// Whether the WAL's name still names the WAL open here, and the
    /// database's name the file opened at start.
    fn still_in_place(&self, wal: &File) -> Result<(), Failure> {
        if let Ok(open) = open_file_id(wal) {
            still_named("the WAL", &self.wal, open)?;
        }
        if let Some((db, id)) = &self.db {
            still_named("the journal file", db, *id)?;
        }
        Ok(())
    }
}

/// The WAL file of the journal `conn` has open, named as SQLite names it:
/// after the database file it opened, which it finds by following symbolic
/// links (and by reading a name that begins with `file:` as a URI). Only
/// should SQLite report no name is the link resolved here the same way.
#[allow(unsafe_code)]
fn wal_of(conn: &Connection, path: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: `conn.handle()` is the open connection, borrowed for this
    // call. `sqlite3_db_filename` returns the pager's own file name (or
    // null), which stays valid while the connection is open and is the kind
    // of pointer `sqlite3_filename_wal` takes; that returns the WAL's name
    // stored beside it. The bytes are copied before the borrow ends.
    let wal = unsafe {
        let db = rusqlite::ffi::sqlite3_db_filename(conn.handle(), c"main".as_ptr());
        let wal = if db.is_null() {
            std::ptr::null()
        } else {
            rusqlite::ffi::sqlite3_filename_wal(db)
        };
        (!wal.is_null()).then(|| std::ffi::CStr::from_ptr(wal).to_bytes().to_vec())
    };
    match wal {
        Some(wal) if !wal.is_empty() => PathBuf::from(std::ffi::OsStr::from_bytes(&wal)),
        _ => {
            let db = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
            let mut wal = db.into_os_string();
            wal.push("-wal");
            PathBuf::from(wal)
        }
    }
}

/// Why an fsync did not happen.
enum Failure {
    /// The WAL could not be opened.
    Open(String),
    /// The fsync itself failed.
    Sync(String),
    /// The journal's files are no longer where a start would find them.
    Gone(String),
}

/// Whether `path` still names the file `id` (`what` names it in the error).
/// A name that cannot be read for another reason (a permission, a file
/// system that does not say) gives no verdict.
fn still_named(what: &str, path: &Path, id: FileId) -> Result<(), Failure> {
    match file_id(path) {
        Ok(now) if now == id => Ok(()),
        Ok(_) => Err(Failure::Gone(format!(
            "{what} {} was replaced by another file",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Failure::Gone(format!(
            "{what} {} was deleted or moved",
            path.display()
        ))),
        Err(_) => Ok(()),
    }
}

/// A file's identity: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId(u32, u32, u64);

/// The database file the WAL belongs to: its name without `-wal`.
fn db_of(wal: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let name = wal.as_os_str().as_bytes();
    let db = name.strip_suffix(b"-wal")?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(db)))
}

/// `statx` asking only for the inode (never for times: see the module's
/// doc), of `path`, or with an empty `path` of the open file `fd`.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn statx_ino(fd: libc::c_int, path: &Path) -> std::io::Result<FileId> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let flags = if path.as_os_str().is_empty() {
        libc::AT_EMPTY_PATH
    } else {
        0
    };
    // SAFETY: `c` is a NUL-terminated path that outlives the call, and `buf`
    // is a zeroed statx the kernel fills.
    let s = unsafe {
        let mut buf: libc::statx = std::mem::zeroed();
        if libc::statx(fd, c.as_ptr(), flags, libc::STATX_INO, &mut buf) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        buf
    };
    // A file system that does not report the inode gives no verdict.
    if s.stx_mask & libc::STATX_INO == 0 {
        return Err(std::io::Error::from(std::io::ErrorKind::Unsupported));
    }
    Ok(FileId(s.stx_dev_major, s.stx_dev_minor, s.stx_ino))
}

/// The identity of the file at `path` now.
#[cfg(target_os = "linux")]
fn file_id(path: &Path) -> std::io::Result<FileId> {
    statx_ino(libc::AT_FDCWD, path)
}

/// The identity of an open file.
#[cfg(target_os = "linux")]
fn open_file_id(file: &File) -> std::io::Result<FileId> {
    use std::os::fd::AsRawFd;
    statx_ino(file.as_raw_fd(), Path::new(""))
}

/// The identity of the file at `path` now.
#[cfg(not(target_os = "linux"))]
fn file_id(path: &Path) -> std::io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok(FileId(0, m.dev() as u32, m.ino()))
}

/// The identity of an open file.
#[cfg(not(target_os = "linux"))]
fn open_file_id(file: &File) -> std::io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    Ok(FileId(0, m.dev() as u32, m.ino()))
}

/// Opens the WAL, which the writer's connection created when it opened the
/// journal and which stays the same file while that connection is open
/// (SQLite deletes it only when the last connection closes), and fsyncs its
/// directory: a new file's name is on disk only once its directory is.
fn open(wal: &Path) -> Result<File, String> {
    let file = File::open(wal).map_err(|e| format!("cannot open the WAL: {e}"))?;
    let dir = match wal.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("cannot fsync the WAL's directory: {e}"))?;
    Ok(file)
}

fn answer(replies: Vec<Box<dyn Reply>>, result: &Result<(), String>) {
    for reply in replies {
        reply.send(result.clone());
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// An answer that reports what it was sent.
    struct Heard(mpsc::Sender<Result<(), String>>);

    impl Reply for Heard {
        fn send(self: Box<Self>, commit: Result<(), String>) {
            let _ = self.0.send(commit);
        }
    }

    /// One answer to hand over, and where what it is sent arrives.
    type Listening = (Vec<Box<dyn Reply>>, mpsc::Receiver<Result<(), String>>);

    fn heard() -> Listening {
        let (tx, rx) = mpsc::channel();
        (vec![Box::new(Heard(tx))], rx)
    }

    /// A syncer over a WAL file of its own.
    fn syncer() -> (tempfile::TempDir, Arc<Syncer>) {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("j.db-wal");
        std::fs::write(&wal, b"frames").unwrap();
        (dir, Arc::new(Syncer::new(wal)))
    }

    const TEN_SECONDS: std::time::Duration = std::time::Duration::from_secs(10);

    /// Waits (at most 10 s) until `done`.
    fn until(what: &str, done: impl Fn() -> bool) {
        let give_up = std::time::Instant::now() + TEN_SECONDS;
        while !done() {
            assert!(std::time::Instant::now() < give_up, "still waiting: {what}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn commits_made_while_an_fsync_runs_share_the_next_one() {
        let (_dir, s) = syncer();
        let (held_tx, held) = mpsc::channel::<()>();
        let (go, go_rx) = mpsc::channel::<()>();
        *s.before.lock().unwrap() = Some(Box::new(move || {
            let _ = held_tx.send(());
            let _ = go_rx.recv();
            Ok(())
        }));
        let first = {
            let s = s.clone();
            std::thread::spawn(move || {
                let (replies, rx) = heard();
                s.sync_here(replies);
                rx.recv_timeout(TEN_SECONDS).expect("answered")
            })
        };
        held.recv_timeout(TEN_SECONDS)
            .expect("the first fsync began");
        // Committed after the first fsync began: it does not cover them.
        let later: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let (replies, rx) = heard();
                    s.sync_here(replies);
                    rx.recv_timeout(TEN_SECONDS).expect("answered")
                })
            })
            .collect();
        until("both waiting", || s.waiting.load(Ordering::SeqCst) == 3);
        assert_eq!(s.done(), 0);
        drop(go);
        assert_eq!(first.join().unwrap(), Ok(()));
        for t in later {
            assert_eq!(t.join().unwrap(), Ok(()));
        }
        assert_eq!(s.done(), 2, "one fsync for the first, one for both later");
    }

    #[test]
    fn the_thread_answers_what_was_queued_and_ends_once_closed() {
        let (_dir, s) = syncer();
        let thread = {
            let s = s.clone();
            std::thread::spawn(move || s.run())
        };
        let (replies, rx) = heard();
        s.queue(replies);
        assert_eq!(rx.recv_timeout(TEN_SECONDS), Ok(Ok(())));
        assert_eq!(s.done(), 1);
        s.close();
        thread.join().unwrap();
        // With no thread, whoever queues fsyncs.
        let (replies, rx) = heard();
        s.queue(replies);
        assert_eq!(rx.try_recv().unwrap(), Ok(()));
        assert_eq!(s.done(), 2);
    }

    /// A syncer over `j.db` and its WAL in a directory of their own, that
    /// checks both are still in place after each fsync.
    fn placed() -> (tempfile::TempDir, Syncer) {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("j.db");
        std::fs::write(&db, b"pages").unwrap();
        let wal = dir.path().join("j.db-wal");
        std::fs::write(&wal, b"frames").unwrap();
        let mut s = Syncer::new(wal);
        s.db = Some((db.clone(), file_id(&db).unwrap()));
        (dir, s)
    }

    fn sync(s: &Syncer) -> Result<(), String> {
        let (replies, rx) = heard();
        s.sync_here(replies);
        rx.try_recv().unwrap()
    }

    #[test]
    fn a_journal_file_deleted_or_replaced_refuses_durable_writes_from_then_on() {
        let (dir, s) = placed();
        assert_eq!(sync(&s), Ok(()));
        assert_eq!(s.refusal(), None);
        std::fs::remove_file(dir.path().join("j.db")).unwrap();
        let why = sync(&s).unwrap_err();
        assert!(why.contains("j.db was deleted or moved"), "{why}");
        // Readable at once, for `/readyz`.
        assert_eq!(s.refusal().as_ref(), Some(&why));
        // Put back or not, refused until a restart checks it again.
        std::fs::write(dir.path().join("j.db"), b"another").unwrap();
        assert_eq!(sync(&s), Err(why));

        let (dir, s) = placed();
        std::fs::write(dir.path().join("other"), b"x").unwrap();
        std::fs::rename(dir.path().join("other"), dir.path().join("j.db")).unwrap();
        let why = sync(&s).unwrap_err();
        assert!(why.contains("j.db was replaced by another file"), "{why}");

        let (dir, s) = placed();
        assert_eq!(sync(&s), Ok(()));
        std::fs::remove_file(dir.path().join("j.db-wal")).unwrap();
        let why = sync(&s).unwrap_err();
        assert!(why.contains("j.db-wal was deleted or moved"), "{why}");
        assert_eq!(s.done(), 1);

        // Moved away: its link count is still 1, but not at its name.
        let (dir, s) = placed();
        assert_eq!(sync(&s), Ok(()));
        std::fs::rename(dir.path().join("j.db-wal"), dir.path().join("elsewhere")).unwrap();
        let why = sync(&s).unwrap_err();
        assert!(why.contains("j.db-wal was deleted or moved"), "{why}");
        std::fs::write(dir.path().join("j.db-wal"), b"new").unwrap();
        let (dir2, s2) = placed();
        assert_eq!(sync(&s2), Ok(()));
        std::fs::write(dir2.path().join("other"), b"x").unwrap();
        std::fs::rename(dir2.path().join("other"), dir2.path().join("j.db-wal")).unwrap();
        let why = sync(&s2).unwrap_err();
        assert!(
            why.contains("j.db-wal was replaced by another file"),
            "{why}"
        );
        drop((dir, dir2));
    }

    #[test]
    fn without_its_wal_file_a_durable_write_fails() {
        let dir = tempfile::tempdir().unwrap();
        let s = Syncer::new(dir.path().join("none.db-wal"));
        let (replies, rx) = heard();
        s.sync_here(replies);
        let why = rx.try_recv().unwrap().unwrap_err();
        assert!(why.contains("cannot open the WAL"), "{why}");
        assert_eq!(s.done(), 0);
        // Not a failed fsync: once the file is there, the next one runs.
        std::fs::write(dir.path().join("none.db-wal"), b"frames").unwrap();
        let (replies, rx) = heard();
        s.sync_here(replies);
        assert_eq!(rx.try_recv().unwrap(), Ok(()));
        assert_eq!(s.done(), 1);
    }
}
