//! The embedded, crash-safe journal store (SQLite).
//!
//! Same semantics as [`super::memory::MemoryJournal`], kept in one database
//! file so they survive a crash.
//!
//! # Durability
//!
//! The file is in WAL mode, and every commit runs with `synchronous=NORMAL`:
//! written to the WAL, not fsynced, so a power loss may drop the last commits
//! while keeping the file consistent. If the lost commit is a claim whose
//! request already left, the GUID reads as never seen after the restart, and
//! its repeat would post the transfer a second time. So a claim, a resend's
//! claim and a failover's URL are answered "ok" only after an fsync of the
//! WAL that began after their commit (`syncer`): what `synchronous=FULL`
//! would do inside the commit, done once the connection is free, so the
//! next commands commit while it runs.
//!
//! An outcome (`finish`, `finish_if`) needs no fsync of its own unless
//! `fsync_outcomes` is set or it is an E500 (`Finish::must_be_durable`):
//! it is written before the answer leaves, so it
//! survives a crash of the process, and a power loss can only take it back to
//! the claim's `sending`, which the hub treats as E901 and settles by asking
//! the core, the system of record for what it did. The answer's path then
//! waits for one fsync (the claim's) instead of two; group commit shares each
//! among all telegrams in flight.
//!
//! # Layout
//!
//! * `lock`: one owner per file (a hub, or reconcile with no hub running).
//! * `open`: checks a file is a healthy journal of a known schema, migrates it.
//! * `command`: one command and its answer, as the writer runs it and the
//!   writer or the syncer answers it.
//! * `writer`: the connection and group commit: a thread of its own, or for
//!   a command alone, the connection thread that asks for it.
//! * `syncer`: the WAL's fsyncs for durable writes, after their commit and
//!   outside the lock on the connection.
//! * `checkpoint`: WAL checkpoints on a connection and thread of their own, so
//!   a commit does not wait for pages copied into the database file or for
//!   most of their fsync; the writer only finishes a pass once the WAL holds
//!   8,192 frames (a few frames and two small fsyncs, about 1-3 ms).
//! * this file: the handle, and the SQL of each operation.
//!
//! Reads go through the writer too: the hub reads little beyond what `claim`
//! already returns, and one connection means a read always sees every write
//! acknowledged before it, with no second connection to open or keep healthy.

mod checkpoint;
mod command;
pub mod lock;
pub(crate) mod open;
mod syncer;
#[cfg(test)]
mod tests;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{mpsc, oneshot};

use super::{AttemptTo, Claim, Event, Finish, JournalError, Row, State};
use crate::stash;
use command::{FnTask, Task};
use writer::Msg;

/// Rows a prune deletes per transaction. The writer serves the commands that
/// queued meanwhile between two such batches, so a claim waits for one batch
/// at most, not for the whole prune (see docs/performance.md for the figures).
pub const PRUNE_BATCH: usize = 2_000;

/// Commands that may queue for the writer (at least; twice `max_batch` if more).
/// Beyond that a caller waits to enqueue (a command that a connection's own
/// thread took to run in place and that finds the queue filled meanwhile
/// waits for the connection instead, and runs alone), so a stalled disk
/// pushes back on the hub instead of growing memory without limit.
const QUEUE_MIN: usize = 1024;

/// A handle on the journal file; clones share one writer, whose thread ends
/// once the last clone is dropped.
#[derive(Clone)]
pub struct SqliteJournal {
    tx: mpsc::Sender<Msg>,
    commits: Arc<AtomicU64>,
    /// `None` for a read-only journal.
    checkpoints: Option<checkpoint::Checkpointer>,
    /// The connection, for a command run on the thread that asks for it.
    shared: Arc<writer::Shared>,
}

const ROW_COLUMNS: &str = "guid, tx_code, fingerprint, state, code, answer, attempts, \
     last_attempt_ms, answered_ms, last_error, created_ms, updated_ms, url, grace_ms, grace_attempt";

/// What a reader should be told before it looks at the journal at `path`:
/// its lock file says a hub keeps its `-wal`, and the `-wal` is not there
/// whole, so the latest rows are missing from what it shows (a GUID shown
/// missing, or `sending`, may have moved money). Checked before the reader
/// opens it: SQLite makes an empty `-wal` where it finds none.
pub fn missing_wal_warning(path: &Path) -> Option<String> {
    if !lock::says_wal_kept(path) {
        return None;
    }
    let problem = open::wal_problem(path)?;
    Some(format!(
        "warning: the journal's -wal file {problem}, but its lock file says a hub keeps one: the \
         rows only the -wal held (the latest transfers) are missing from what is shown, and a \
         GUID shown as missing or `sending` may have moved money; put the -wal back beside \
         the file"
    ))
}

impl SqliteJournal {
    /// Opens (creating if absent) the journal at `path`, and starts its writer,
    /// which commits up to `max_batch` queued commands in one transaction.
    /// Outcomes are fsynced with the next claim (see "Durability" above).
    pub fn open(path: &Path, max_batch: usize) -> Result<SqliteJournal, JournalError> {
        SqliteJournal::open_with(path, max_batch, false)
    }

    /// [`SqliteJournal::open`], with every commit fsynced when `fsync_outcomes`.
    pub fn open_with(
        path: &Path,
        max_batch: usize,
        fsync_outcomes: bool,
    ) -> Result<SqliteJournal, JournalError> {
        SqliteJournal::open_marked(path, max_batch, fsync_outcomes, Default::default())
    }

    /// [`SqliteJournal::open_with`], the writer finishing checkpoint passes
    /// and checkpointing by itself from the frames `marks` gives (tests set
    /// fewer than the default).
    fn open_marked(
        path: &Path,
        max_batch: usize,
        fsync_outcomes: bool,
        marks: checkpoint::Marks,
    ) -> Result<SqliteJournal, JournalError> {
        let mut conn = open::open(path).map_err(|reason| open_error(path, reason))?;
        let (checkpoints, handoff) = checkpoint::Checkpointer::start(path, &mut conn, marks)
            .map_err(|reason| open_error(path, reason))?;
        let syncer = syncer::Syncer::start(&conn, path)
            .map_err(|e| open_error(path, format!("cannot start the fsync thread: {e}")))?;
        let mut journal =
            SqliteJournal::start(path, conn, syncer, max_batch, fsync_outcomes, Some(handoff))?;
        journal.checkpoints = Some(checkpoints);
        Ok(journal)
    }

    /// In tests: every fsync of the database file by the checkpoint thread
    /// fails from now on.
    #[cfg(test)]
    pub(super) fn fail_file_syncs(&self) {
        if let Some(c) = &self.checkpoints {
            c.fail_file_syncs();
        }
    }

    /// In tests: every checkpoint the writer runs past its backstop fails
    /// from now on.
    #[cfg(test)]
    pub(super) fn fail_backstops(&self) {
        if let Some(c) = &self.checkpoints {
            c.fail_backstops();
        }
    }

    /// In tests: checkpoints the writer ran past its backstop.
    #[cfg(test)]
    pub(super) fn backstops(&self) -> u64 {
        self.checkpoints.as_ref().map_or(0, |c| c.backstops())
    }

    /// Opens an existing journal for reading only: nothing is created,
    /// migrated or written (writes fail), so it is safe beside a live hub.
    pub fn open_read_only(path: &Path) -> Result<SqliteJournal, JournalError> {
        let conn = open::open_read_only(path).map_err(|reason| open_error(path, reason))?;
        let syncer = syncer::Syncer::idle(&conn, path);
        SqliteJournal::start(path, conn, syncer, 1, true, None)
    }

    fn start(
        path: &Path,
        conn: Connection,
        syncer: Arc<syncer::Syncer>,
        max_batch: usize,
        fsync_all: bool,
        handoff: Option<checkpoint::Handoff>,
    ) -> Result<SqliteJournal, JournalError> {
        let (tx, rx) = mpsc::channel(QUEUE_MIN.max(max_batch.saturating_mul(2)));
        let commits = Arc::new(AtomicU64::new(0));
        let shared = Arc::new(writer::Shared::new(
            conn,
            syncer.clone(),
            fsync_all,
            commits.clone(),
            handoff,
        ));
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("relayhub-journal".into())
            .spawn(move || writer::run(thread_shared, rx, max_batch))
            .map_err(|e| {
                // Its thread would otherwise wait for answers forever.
                syncer.close();
                open_error(path, format!("cannot start the writer thread: {e}"))
            })?;
        Ok(SqliteJournal {
            tx,
            commits,
            checkpoints: None,
            shared,
        })
    }

    /// Why every durable write (a claim) is refused until the hub restarts,
    /// if it is: a failed fsync, the files gone, or the checkpoints stopped
    /// by a write error of the database file.
    pub fn refusal(&self) -> Option<String> {
        self.shared
            .syncer
            .refusal()
            .or_else(|| self.checkpoints.as_ref().and_then(|c| c.broken()))
    }

    /// Transactions committed so far: with group commit, fewer than the writes.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// WAL checkpoints run so far by the checkpoint thread (0 when read-only).
    pub fn checkpoints(&self) -> u64 {
        self.checkpoints.as_ref().map_or(0, |c| c.done())
    }

    /// Hands `f` to the writer and waits (without blocking the runtime) for its
    /// answer, which for a write comes only after its batch committed. Once
    /// queued (or left in a connection thread's stash, which runs it right
    /// after the poll), a command runs even if the caller stops waiting: a
    /// dropped `claim` future may still leave a `sending` row.
    async fn call<T, F>(&self, writes: bool, f: F) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.queue(writes, writes, command::always, f).await
    }

    /// Holds the writer inside a batch until the returned sender is dropped
    /// or signalled, so a test can queue commands and know they share later
    /// batches, or that they wait.
    #[cfg(test)]
    pub(crate) async fn pause(&self) -> std::sync::mpsc::Sender<()> {
        let (started_tx, started_rx) = oneshot::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let j = self.clone();
        tokio::spawn(async move {
            j.call(false, move |_| {
                let _ = started_tx.send(());
                let _ = release_rx.recv();
                Ok(())
            })
            .await
        });
        started_rx.await.expect("writer paused");
        release_tx
    }

    /// A durable write whose result says whether it wrote (`wrote`): one
    /// that did not is answered at the commit, with no fsync to wait for.
    async fn write_if<T, F>(&self, wrote: fn(&T) -> bool, f: F) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.queue(true, true, wrote, f).await
    }

    async fn queue<T, F>(
        &self,
        writes: bool,
        durable: bool,
        wrote: fn(&T) -> bool,
        f: F,
    ) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let stopped = || JournalError::Write(writer::STOPPED.into());
        let (reply, answer) = oneshot::channel();
        let task: Box<dyn Task> = Box::new(FnTask {
            writes,
            durable,
            wrote,
            f,
            reply,
        });
        // Polled by a connection's own thread with no batch running or
        // forming: that thread runs the command right after this poll (see
        // `writer`), watched by its clock like a core call.
        let here = if writer::idle(&self.shared, &self.tx, writes, durable) {
            stash::stash_command(task, |task| {
                let (shared, tx) = (self.shared.clone(), self.tx.clone());
                Box::new(move || writer::run_here(&shared, &tx, task))
            })
        } else {
            Err(task)
        };
        if let Err(task) = here {
            self.tx.send(Msg::Task(task)).await.map_err(|_| stopped())?;
        }
        answer.await.map_err(|_| stopped())?
    }

    /// Claims a GUID for its first attempt, or returns its row.
    pub async fn claim(
        &self,
        guid: &str,
        tx_code: &str,
        fingerprint: &str,
        url: &str,
        now_ms: i64,
    ) -> Result<Claim, JournalError> {
        self.claim_to(guid, tx_code, fingerprint, AttemptTo::url(url), now_ms)
            .await
    }

    /// [`SqliteJournal::claim`], stamping the attempt's grace.
    pub async fn claim_to(
        &self,
        guid: &str,
        tx_code: &str,
        fingerprint: &str,
        to: AttemptTo<'_>,
        now_ms: i64,
    ) -> Result<Claim, JournalError> {
        let (guid, tx_code, fingerprint, url, grace_ms) = (
            guid.to_owned(),
            tx_code.to_owned(),
            fingerprint.to_owned(),
            to.url.to_owned(),
            to.grace_ms,
        );
        // A GUID already journaled is answered with its row at the commit:
        // nothing was written for it to wait on.
        let wrote = |claim: &Claim| matches!(claim, Claim::New);
        self.write_if(wrote, move |c| {
            let inserted = c
                .prepare_cached(
                    "INSERT INTO journal (guid, tx_code, fingerprint, state, attempts, \
                     last_attempt_ms, created_ms, updated_ms, url, grace_ms, grace_attempt) \
                     VALUES (?1, ?2, ?3, 'sending', 1, ?4, ?4, ?4, ?5, ?6, 1) \
                     ON CONFLICT (guid) DO NOTHING",
                )?
                .execute(params![guid, tx_code, fingerprint, now_ms, url, grace_ms])?;
            if inserted == 0 {
                let row = select_row(c, &guid)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
                return Ok(Claim::Existing(row));
            }
            add_event(
                c,
                c.last_insert_rowid(),
                now_ms,
                State::Sending,
                None,
                "attempt 1",
            )?;
            Ok(Claim::New)
        })
        .await
    }

    /// Claims a "not sent" GUID for attempt `attempts + 1`: false unless the row
    /// is still "not sent" with exactly `attempts` attempts.
    pub async fn claim_resend(
        &self,
        guid: &str,
        attempts: u32,
        url: &str,
        now_ms: i64,
    ) -> Result<bool, JournalError> {
        self.claim_resend_to(guid, attempts, AttemptTo::url(url), now_ms)
            .await
    }

    /// [`SqliteJournal::claim_resend`], stamping the new attempt's grace.
    pub async fn claim_resend_to(
        &self,
        guid: &str,
        attempts: u32,
        to: AttemptTo<'_>,
        now_ms: i64,
    ) -> Result<bool, JournalError> {
        let (guid, url, grace_ms) = (guid.to_owned(), to.url.to_owned(), to.grace_ms);
        self.call(true, move |c| {
            let changed: Option<i64> = c
                .prepare_cached(
                    "UPDATE journal SET state = 'sending', attempts = attempts + 1, \
                     last_attempt_ms = ?2, updated_ms = ?2, url = ?4, grace_ms = ?5, \
                     grace_attempt = attempts + 1 \
                     WHERE guid = ?1 AND state = 'not_sent' AND attempts = ?3 RETURNING id",
                )?
                .query_row(params![guid, now_ms, attempts, url, grace_ms], |r| r.get(0))
                .optional()?;
            let Some(id) = changed else {
                return Ok(false);
            };
            let note = format!("attempt {}", u64::from(attempts) + 1);
            add_event(c, id, now_ms, State::Sending, None, &note)?;
            Ok(true)
        })
        .await
    }

    /// Before a failover inside one attempt: the attempt now goes to `url`.
    pub async fn note_url(&self, guid: &str, url: &str, now_ms: i64) -> Result<bool, JournalError> {
        let (guid, url) = (guid.to_owned(), url.to_owned());
        self.call(true, move |c| {
            let changed: Option<i64> = c
                .prepare_cached(
                    "UPDATE journal SET url = ?2, updated_ms = ?3 \
                     WHERE guid = ?1 AND state = 'sending' RETURNING id",
                )?
                .query_row(params![guid, url, now_ms], |r| r.get(0))
                .optional()?;
            let Some(id) = changed else {
                return Ok(false);
            };
            add_event(
                c,
                id,
                now_ms,
                State::Sending,
                None,
                &format!("failover: the attempt goes to {url}"),
            )?;
            Ok(true)
        })
        .await
    }

    /// Records an outcome.
    pub async fn finish(&self, guid: &str, f: Finish, now_ms: i64) -> Result<(), JournalError> {
        self.finish_if(guid, &[], f, now_ms).await.map(|_| ())
    }

    /// Records an outcome only if the row's state is in `only_if` (empty: any).
    /// False if the GUID is unknown or in another state.
    pub async fn finish_if(
        &self,
        guid: &str,
        only_if: &[State],
        f: Finish,
        now_ms: i64,
    ) -> Result<bool, JournalError> {
        let (guid, only_if) = (guid.to_owned(), only_if.to_vec());
        let durable = f.must_be_durable();
        self.queue(true, durable, command::always, move |c| {
            // The writer runs one command at a time, so nothing changes the row
            // between this read and the update.
            let current: Option<(i64, String, u32)> = c
                .prepare_cached("SELECT id, state, attempts FROM journal WHERE guid = ?1")?
                .query_row([&guid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            let Some((id, current, attempts)) = current else {
                return Ok(false);
            };
            if !only_if.is_empty() && !only_if.iter().any(|s| s.as_str() == current) {
                return Ok(false);
            }
            if f.attempt.is_some_and(|n| n != attempts) {
                return Ok(false);
            }
            c.prepare_cached(
                "UPDATE journal SET state = ?2, code = ?3, answer = ?4, \
                 last_error = COALESCE(?5, last_error), answered_ms = ?6, updated_ms = ?6 \
                 WHERE id = ?1",
            )?
            .execute(params![
                id,
                f.state.as_str(),
                f.code,
                f.answer,
                f.error,
                now_ms
            ])?;
            add_event(c, id, now_ms, f.state, Some(&f.code), &f.note)?;
            Ok(true)
        })
        .await
    }

    /// At a clean stop: copies the WAL into the database file
    /// (`wal_checkpoint(RESTART)`, which fsyncs the file), then starts the
    /// WAL over with one durable frame, so that the file alone holds the
    /// journal and the `-wal` holds nothing the file lacks. A stopped hub's
    /// `-wal` otherwise held most of it (a new journal's tables too), and a
    /// copy of the file alone was an empty journal, whose start took every
    /// GUID for new (found by a black-box probe). The `-wal` is never left
    /// empty, which a crash before the lock file says so would take for a
    /// lost one (a review found that window with `TRUNCATE`). Refused, with
    /// the WAL kept whole, when the journal refuses durable writes (a failed
    /// fsync: nothing is copied then) or when the checkpoint cannot finish
    /// (tried again while the hub's own checkpoint thread runs a pass).
    pub async fn checkpoint_into_file(&self) -> Result<(), JournalError> {
        let broken = self
            .shared
            .syncer
            .refusal()
            .or_else(|| self.checkpoints.as_ref().and_then(|c| c.broken()));
        if let Some(why) = broken {
            return Err(JournalError::Write(why));
        }
        let mut tries = 0;
        loop {
            let (busy, frames, copied): (i64, i64, i64) = self
                .call(false, |c| {
                    c.query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })
                })
                .await?;
            if busy == 0 {
                break;
            }
            // Another checkpoint (the thread's pass) is refused at once, not
            // waited for: a few more tries.
            tries += 1;
            if tries == 40 {
                return Err(JournalError::Write(format!(
                    "the checkpoint could not finish ({copied} of {frames} WAL frames copied): \
                     another connection was using the journal"
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        // The write after a finished RESTART starts the WAL over: its header
        // (new salts, which retire the frames after it) and one frame, on
        // disk before the lock file says the file alone holds the journal.
        self.call(true, |c| {
            let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            c.execute_batch(&format!("PRAGMA user_version = {version}"))
        })
        .await
    }

    /// A GUID's row, if journaled.
    pub async fn get(&self, guid: &str) -> Result<Option<Row>, JournalError> {
        let guid = guid.to_owned();
        self.call(false, move |c| select_row(c, &guid)).await
    }

    /// A GUID's history, oldest first (empty if unknown).
    pub async fn history(&self, guid: &str) -> Result<Vec<Event>, JournalError> {
        let guid = guid.to_owned();
        self.call(false, move |c| {
            let mut stmt = c.prepare_cached(HISTORY_SELECT)?;
            let events = stmt.query_map([&guid], |r| {
                Ok(Event {
                    at_ms: r.get(0)?,
                    state: state_at(r, 1)?,
                    code: r.get(2)?,
                    note: r.get(3)?,
                })
            })?;
            events.collect()
        })
        .await
    }

    /// Rows in a state, oldest first, at most `limit`.
    pub async fn list(&self, state: State, limit: usize) -> Result<Vec<Row>, JournalError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call(false, move |c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {ROW_COLUMNS} FROM journal WHERE state = ?1 ORDER BY created_ms, id LIMIT ?2"
            ))?;
            let rows = stmt.query_map(params![state.as_str(), limit], read_row)?;
            rows.collect()
        })
        .await
    }

    /// How many rows are in a state (the unknown-transfers gauge).
    pub async fn count(&self, state: State) -> Result<u64, JournalError> {
        self.call(false, move |c| {
            c.prepare_cached("SELECT COUNT(*) FROM journal WHERE state = ?1")?
                .query_row([state.as_str()], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
        })
        .await
    }

    /// Start-up: rows left `sending` by a crash become `unknown` (E901 in their
    /// history). Returns how many.
    pub async fn recover(&self, now_ms: i64) -> Result<u64, JournalError> {
        self.call(true, move |c| {
            c.prepare_cached(
                "INSERT INTO journal_events (journal_id, at_ms, state, code, note) \
                 SELECT id, ?1, 'unknown', 'E901', 'was in flight when the hub stopped' \
                 FROM journal WHERE state = 'sending' ORDER BY created_ms, id",
            )?
            .execute([now_ms])?;
            let n = c
                .prepare_cached(
                    "UPDATE journal SET state = 'unknown', updated_ms = ?1, \
                     last_error = 'was in flight when the hub stopped' WHERE state = 'sending'",
                )?
                .execute([now_ms])?;
            Ok(n as u64)
        })
        .await
    }

    /// Deletes settled rows (`done`, `not_sent`) and their history last
    /// updated before `before_ms`, [`PRUNE_BATCH`] rows per transaction, so
    /// that claims queued meanwhile are served between batches. Rows still
    /// `sending` or `unknown` are kept whatever their age: forgetting one would
    /// let its resend post again. Returns how many rows went.
    pub async fn prune(&self, before_ms: i64) -> Result<u64, JournalError> {
        self.prune_in_batches(before_ms, PRUNE_BATCH).await
    }

    pub(crate) async fn prune_in_batches(
        &self,
        before_ms: i64,
        batch: usize,
    ) -> Result<u64, JournalError> {
        let limit = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let mut total = 0;
        loop {
            // Each batch queues behind what is already waiting for the writer.
            let n = self
                .call(true, move |c| prune_batch(c, before_ms, limit))
                .await?;
            total += n;
            if n < limit as u64 {
                return Ok(total);
            }
        }
    }

    /// Rows still `sending` or `unknown` last updated before `before_ms`: the
    /// ones a prune keeps past the retention because they are not settled.
    pub async fn unsettled_before(&self, before_ms: i64) -> Result<u64, JournalError> {
        self.call(false, move |c| {
            c.prepare_cached(
                "SELECT COUNT(*) FROM journal \
                 WHERE state IN ('sending', 'unknown') AND updated_ms < ?1",
            )?
            .query_row([before_ms], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
        })
        .await
    }
}

fn open_error(path: &Path, reason: String) -> JournalError {
    JournalError::Open {
        path: path.display().to_string(),
        reason,
    }
}

/// A GUID's events, oldest first: found through the index on the row's id.
const HISTORY_SELECT: &str = "SELECT at_ms, state, code, note FROM journal_events \
     WHERE journal_id = (SELECT id FROM journal WHERE guid = ?1) ORDER BY id";

/// The oldest settled rows updated before `?1`, at most `?2`, through the
/// partial index of migration 0003: the WHERE repeats the index's condition
/// word for word, which SQLite needs to use it, and `INDEXED BY` makes the
/// statement fail rather than fall back to the state index and a sort of
/// every `done` row (the planner's pick on a table without statistics).
const PRUNE_SELECT: &str = "SELECT id FROM journal INDEXED BY journal_settled_updated \
     WHERE state IN ('done', 'not_sent') AND updated_ms < ?1 \
     ORDER BY updated_ms LIMIT ?2";

/// Deletes up to `limit` of the oldest settled rows updated before
/// `before_ms`, with their history.
fn prune_batch(c: &Connection, before_ms: i64, limit: i64) -> rusqlite::Result<u64> {
    let ids: Vec<i64> = c
        .prepare_cached(PRUNE_SELECT)?
        .query_map(params![before_ms, limit], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut events = c.prepare_cached("DELETE FROM journal_events WHERE journal_id = ?1")?;
    let mut rows = c.prepare_cached("DELETE FROM journal WHERE id = ?1")?;
    for id in &ids {
        events.execute([id])?;
        rows.execute([id])?;
    }
    Ok(ids.len() as u64)
}

/// Adds an event to the history of the row whose `id` is `journal_id`.
fn add_event(
    c: &Connection,
    journal_id: i64,
    at_ms: i64,
    state: State,
    code: Option<&str>,
    note: &str,
) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO journal_events (journal_id, at_ms, state, code, note) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![journal_id, at_ms, state.as_str(), code, note])?;
    Ok(())
}

fn select_row(c: &Connection, guid: &str) -> rusqlite::Result<Option<Row>> {
    c.prepare_cached(&format!(
        "SELECT {ROW_COLUMNS} FROM journal WHERE guid = ?1"
    ))?
    .query_row([guid], read_row)
    .optional()
}

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        guid: r.get(0)?,
        tx_code: r.get(1)?,
        fingerprint: r.get(2)?,
        state: state_at(r, 3)?,
        code: r.get(4)?,
        answer: r.get(5)?,
        attempts: r.get(6)?,
        last_attempt_ms: r.get(7)?,
        answered_ms: r.get(8)?,
        last_error: r.get(9)?,
        created_ms: r.get(10)?,
        updated_ms: r.get(11)?,
        url: r.get(12)?,
        grace_ms: stamp_of_latest(r.get(13)?, r.get(14)?, r.get(6)?),
    })
}

/// A row's stamped grace, if it was stamped by its latest attempt's claim:
/// a resend claimed by a build before the stamp leaves an earlier attempt's
/// grace on the row, which says nothing about the latest attempt.
fn stamp_of_latest(
    grace_ms: Option<i64>,
    grace_attempt: Option<i64>,
    attempts: i64,
) -> Option<i64> {
    grace_ms.filter(|_| grace_attempt == Some(attempts))
}

/// A state column; the schema's CHECK makes a bad value a sign of tampering.
fn state_at(r: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<State> {
    let s: String = r.get(idx)?;
    State::parse(&s).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            idx,
            rusqlite::types::Type::Text,
            format!("unknown journal state {s:?}").into(),
        )
    })
}
