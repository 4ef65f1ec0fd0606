//! The writer: group commit over one connection.
//!
//! Every command is a [`Task`] sent over a bounded channel to the writer
//! thread (or run where it was asked for: see the end). The thread takes
//! whatever is queued (up to `max_batch`), runs the writes in one
//! `BEGIN IMMEDIATE ... COMMIT`, each inside its own `SAVEPOINT` so a failing
//! command is undone alone (a command alone in its batch needs none: its
//! transaction is undone whole), and answers only after the `COMMIT`: an
//! outcome right then (written), a durable write once the WAL is fsynced
//! after it (below). Concurrent telegrams therefore share one fsync instead
//! of queueing for one each, and no caller hears "ok" for a claim that could
//! still be lost.
//!
//! Reads run after the batch's commit, outside any transaction: they see every
//! write acknowledged before them (and the ones of their own batch), and never
//! an uncommitted one. A durable write is seen once committed, before its
//! fsync: only its own caller waits for that.
//!
//! Every commit runs with `synchronous=NORMAL`: written, so it survives the
//! process. The answer of a [`Task::durable`] write (what only the hub knows
//! and acts on once it is answered: a claim before its POST, a URL before a
//! failover) waits for an fsync of the WAL that began after its commit, made
//! by the syncer (`syncer`) once the lock is released, so the next batch
//! commits meanwhile. An outcome (what the core can tell again) is on disk
//! with the next such fsync or checkpoint, since the WAL is one file written
//! in order and an fsync covers every frame before it. `fsync_all` makes
//! every write's answer wait for an fsync.
//!
//! Between two batches the writer also finishes a WAL checkpoint when the
//! checkpoint thread asks (see `checkpoint`): a few frames and two small
//! fsyncs, after which the WAL starts over instead of growing.
//!
//! A command from a connection's own thread (a busy connection adopted by a
//! thread, `server/adoption.rs`) need not wake the writer thread and wait to
//! be woken in turn: two wake-ups each way per command, four per transfer,
//! which cost the connection threads about as much CPU as the commands
//! themselves (docs/performance.md). [`run_here`] runs it on that thread, as
//! a batch of its own, when no batch is running or forming; otherwise it
//! joins the writer thread's next batch, so concurrent commands still share
//! a commit. Whoever holds the [`Shared`] lock runs the batch, with the same
//! code and the same durability, and finishes a checkpoint pass after it.
//! The thread that ran a durable write in place fsyncs for it too (the
//! writer thread hands its batch's answers to the syncer's thread); one
//! that would find an fsync running queues instead, since its answer would
//! wait for the next fsync anyway.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use rusqlite::Connection;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::checkpoint::Handoff;
use super::command::{Reply, Task};
use super::syncer::Syncer;

/// What callers send to the writer thread.
pub(super) enum Msg {
    Task(Box<dyn Task>),
    /// Ends the thread as if it had died, leaving queued tasks unanswered.
    #[cfg(test)]
    Stop,
}

impl Msg {
    fn into_task(self) -> Option<Box<dyn Task>> {
        match self {
            Msg::Task(task) => Some(task),
            #[cfg(test)]
            Msg::Stop => None,
        }
    }
}

/// What a command that failed to reach the connection hears.
pub(super) const STOPPED: &str = "journal writer stopped";

/// The connection, and whoever runs a batch on it.
pub(super) struct Shared {
    writer: Mutex<Writer>,
    /// Fsyncs the WAL for durable writes, after the lock is released.
    pub(super) syncer: Arc<Syncer>,
    /// Every write's answer waits for an fsync (`fsync_outcomes`).
    fsync_all: bool,
    /// The writer thread holds a batch and waits for the lock: a command
    /// from elsewhere joins its next batch rather than cut in.
    pub(super) forming: AtomicBool,
    /// Threads that found the queue full and wait for the lock.
    #[cfg(test)]
    pub(super) waiting: AtomicU64,
}

/// The connection and what each batch on it needs.
struct Writer {
    conn: Connection,
    commits: Arc<AtomicU64>,
    handoff: Option<Handoff>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Before the connection closes (fields drop after this).
        if let Some(handoff) = &self.handoff {
            handoff.before_close(&self.conn);
        }
    }
}

impl Shared {
    pub(super) fn new(
        conn: Connection,
        syncer: Arc<Syncer>,
        fsync_all: bool,
        commits: Arc<AtomicU64>,
        handoff: Option<Handoff>,
    ) -> Shared {
        // The WAL's fsync is the syncer's (see `syncer`). Should this fail,
        // FULL stays: only stricter.
        let _ = control(&conn, "PRAGMA synchronous = NORMAL");
        Shared {
            writer: Mutex::new(Writer {
                conn,
                commits,
                handoff,
            }),
            syncer,
            fsync_all,
            forming: AtomicBool::new(false),
            #[cfg(test)]
            waiting: AtomicU64::new(0),
        }
    }

    /// Runs one batch on the connection `writer` holds, then lets it go.
    /// Returns the answers that wait for an fsync (durable writes
    /// committed), for whoever fsyncs.
    #[must_use]
    fn run_unlocking(
        &self,
        mut writer: MutexGuard<'_, Writer>,
        batch: impl Iterator<Item = Box<dyn Task>>,
    ) -> Vec<Box<dyn Reply>> {
        writer.run(batch, self.fsync_all, &self.syncer)
    }
}

impl Writer {
    /// Runs one batch, then finishes a checkpoint pass if asked to. Returns
    /// the answers that wait for an fsync (durable writes committed).
    #[must_use]
    fn run(
        &mut self,
        batch: impl Iterator<Item = Box<dyn Task>>,
        fsync_all: bool,
        syncer: &Syncer,
    ) -> Vec<Box<dyn Reply>> {
        /// A command that panics leaves the lock poisoned, and nothing runs
        /// on the connection again; its transaction is undone here, so that
        /// the file's write lock is not held until the last handle goes.
        struct Undo<'a>(&'a Connection);
        impl Drop for Undo<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() && !self.0.is_autocommit() {
                    let _ = self.0.execute_batch("ROLLBACK");
                }
            }
        }
        let _undo = Undo(&self.conn);
        let durable = run_batch(&self.conn, batch, fsync_all, &self.commits);
        if let Some(handoff) = &mut self.handoff {
            handoff.between_batches(&self.conn, syncer);
        }
        durable
    }
}

/// The writer thread's body: returns when every sender is gone (or a batch
/// panicked, which leaves the lock poisoned: commands then hear
/// [`STOPPED`], as from a writer thread that died).
pub(super) fn run(shared: Arc<Shared>, mut rx: mpsc::Receiver<Msg>, max_batch: usize) {
    /// However the thread ends, the syncer's thread ends after the answers
    /// queued.
    struct Close<'a>(&'a Syncer);
    impl Drop for Close<'_> {
        fn drop(&mut self) {
            self.0.close();
        }
    }
    let _close = Close(&shared.syncer);
    let max_batch = max_batch.max(1);
    let mut batch: Vec<Box<dyn Task>> = Vec::with_capacity(max_batch);
    while let Some(first) = rx.blocking_recv() {
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Task(t) => batch.push(t),
                #[cfg(test)]
                Msg::Stop => return,
            }
            if batch.len() < max_batch {
                next = rx.try_recv().ok();
            }
        }
        shared.forming.store(true, Ordering::Relaxed);
        let writer = shared.writer.lock();
        shared.forming.store(false, Ordering::Relaxed);
        let Ok(writer) = writer else {
            return;
        };
        shared
            .syncer
            .queue(shared.run_unlocking(writer, batch.drain(..)));
    }
}

/// Whether a command is worth running on the thread that asks (a batch may
/// still be running): nothing queued, the writer thread not waiting for the
/// lock with a batch in hand, and, for a command whose answer waits for an
/// fsync (`durable`, or any write with `fsync_outcomes`), no fsync
/// running: its answer would wait for the next one anyway, which commands
/// batched by the writer thread meanwhile share.
pub(super) fn idle(shared: &Shared, tx: &mpsc::Sender<Msg>, writes: bool, durable: bool) -> bool {
    let fsyncs = durable || (writes && shared.fsync_all);
    !shared.forming.load(Ordering::Relaxed)
        && tx.capacity() == tx.max_capacity()
        && !(fsyncs && shared.syncer.busy())
}

/// Runs `task` on this thread, which may block (a connection's own): alone,
/// right now, when no batch is running; otherwise it is queued for the
/// writer thread's next batch. Only if the queue filled up since the caller
/// found it empty does this thread wait for the lock and run it alone.
pub(super) fn run_here(shared: &Shared, tx: &mpsc::Sender<Msg>, task: Box<dyn Task>) {
    let task = match shared.writer.try_lock() {
        Ok(writer) => {
            return shared
                .syncer
                .sync_here(shared.run_unlocking(writer, std::iter::once(task)));
        }
        Err(TryLockError::Poisoned(_)) => return task.fail(STOPPED.into()),
        Err(TryLockError::WouldBlock) => task,
    };
    let (full, msg) = match tx.try_send(Msg::Task(task)) {
        Ok(()) => return,
        Err(TrySendError::Full(msg)) => (true, msg),
        Err(TrySendError::Closed(msg)) => (false, msg),
    };
    let Some(task) = msg.into_task() else {
        return;
    };
    if !full {
        return task.fail(STOPPED.into());
    }
    #[cfg(test)]
    shared.waiting.fetch_add(1, Ordering::Relaxed);
    match shared.writer.lock() {
        Ok(writer) => {
            let durable = shared.run_unlocking(writer, std::iter::once(task));
            shared.syncer.sync_here(durable);
        }
        Err(_) => task.fail(STOPPED.into()),
    }
}

/// Runs a transaction-control statement, prepared once per connection
/// (`execute_batch` parses its text on every call: four times per write).
fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Runs one batch: writes in one transaction, then reads. Returns the
/// answers of durable writes committed, which wait for an fsync.
fn run_batch(
    conn: &Connection,
    batch: impl Iterator<Item = Box<dyn Task>>,
    fsync_all: bool,
    commits: &AtomicU64,
) -> Vec<Box<dyn Reply>> {
    let (writes, reads): (Vec<_>, Vec<_>) = batch.partition(|t| t.writes());
    let durable = if writes.is_empty() {
        Vec::new()
    } else {
        run_writes(conn, writes, fsync_all, commits)
    };
    for task in reads {
        let (_, reply) = task.run(conn);
        reply.send(Ok(()));
    }
    durable
}

fn run_writes(
    conn: &Connection,
    mut writes: Vec<Box<dyn Task>>,
    fsync_all: bool,
    commits: &AtomicU64,
) -> Vec<Box<dyn Reply>> {
    if let Err(e) = control(conn, "BEGIN IMMEDIATE") {
        let reason = format!("cannot start a transaction: {e}");
        for task in writes {
            task.fail(reason.clone());
        }
        return Vec::new();
    }
    // Set once the transaction is gone (SQLite rolls it back by itself on some
    // errors, e.g. a full disk): the rest of the batch is then refused.
    let mut lost: Option<String> = None;
    let mut replies = Vec::with_capacity(writes.len());
    // A command alone in its batch needs no savepoint: the transaction is
    // its own, and undone whole if it fails. (A savepoint makes SQLite copy
    // every page the command changes into a sub-journal first.)
    if writes.len() == 1
        && let Some(task) = writes.pop()
    {
        let may_wait = fsync_all || task.durable();
        let (ok, reply) = task.run(conn);
        let durable = may_wait && reply.wrote();
        if !ok {
            // The reply carries the command's own error.
            lost = Some("the command failed; its transaction is rolled back".into());
        } else if conn.is_autocommit() {
            lost = Some("transaction rolled back by SQLite after an error".into());
        }
        return finish_writes(conn, lost, vec![(durable, reply)], commits);
    }
    for task in writes {
        if let Some(reason) = &lost {
            task.fail(reason.clone());
            continue;
        }
        if let Err(e) = control(conn, "SAVEPOINT cmd") {
            lost = Some(format!("cannot start a savepoint: {e}"));
            task.fail(lost.clone().unwrap_or_default());
            continue;
        }
        let may_wait = fsync_all || task.durable();
        let (ok, reply) = task.run(conn);
        let durable = may_wait && reply.wrote();
        let end = if ok {
            control(conn, "RELEASE cmd")
        } else {
            control(conn, "ROLLBACK TO cmd").and_then(|()| control(conn, "RELEASE cmd"))
        };
        if let Err(e) = end {
            lost = Some(format!("transaction aborted: {e}"));
        } else if conn.is_autocommit() {
            lost = Some("transaction rolled back by SQLite after an error".into());
        }
        replies.push((durable, reply));
    }
    finish_writes(conn, lost, replies, commits)
}

/// Commits the batch's transaction unless it was `lost` (then rolls back
/// what is left of it), and answers every command that ran, but for the
/// durable ones committed: returned, they wait for an fsync.
fn finish_writes(
    conn: &Connection,
    lost: Option<String>,
    replies: Vec<(bool, Box<dyn Reply>)>,
    commits: &AtomicU64,
) -> Vec<Box<dyn Reply>> {
    let commit = match lost {
        Some(reason) => Err(reason),
        None => control(conn, "COMMIT").map_err(|e| format!("commit failed: {e}")),
    };
    match &commit {
        Ok(()) => {
            commits.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {
            if !conn.is_autocommit() {
                // Nothing of this batch was acknowledged; undo all of it.
                let _ = control(conn, "ROLLBACK");
            }
        }
    }
    let mut durable = Vec::new();
    for (waits, reply) in replies {
        if waits && commit.is_ok() {
            durable.push(reply);
        } else {
            reply.send(commit.clone());
        }
    }
    durable
}
