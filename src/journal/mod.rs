//! The GUID journal (protocol section 8): what the hub did with every transfer
//! GUID, so a repeat is answered truthfully instead of paying twice.
//!
//! One interface, several stores: [`memory`] for tests and benchmarks, the
//! embedded [`sqlite`] store, crash-safe, by default, and the shared
//! [`postgres`] store for several hubs behind one load balancer. Every store
//! gives the same guarantees, which the relay relies on:
//!
//! * [`Journal::claim`] is atomic: of any number of callers racing on a new GUID,
//!   exactly one gets [`Claim::New`]; the row says `sending` durably before it
//!   returns, so it is written ahead of the first request byte.
//! * [`Journal::claim_resend`] is a compare-and-set on the attempt count, so two
//!   resends of a "not sent" GUID cannot both post.
//! * [`Journal::recover`] turns rows left `sending` by a crash into `unknown`
//!   (in the shared store: only rows whose hub's lease has expired).
//! * [`Journal::prune`] forgets settled rows (`done`, `not_sent`) past the
//!   retention, never rows `sending` or `unknown`: a resend of one of those
//!   must still be answered by inquiry, however late it comes.
//!
//! # Who may recover and settle
//!
//! "Every `sending` row was left by a crash" is true only for the one process
//! that owns the journal. [`Journal::open_owned`] takes that ownership: for a
//! SQLite file an exclusive lock on `<file>.lock` ([`sqlite::lock`]), held by
//! the returned [`Ownership`] until it is dropped, so a second hub, or a
//! `relayhub journal reconcile` beside a live hub, is refused instead of
//! marking the live hub's calls unknown and believing "never received" for
//! them. The shared store needs no lock: its leases say which rows are a live
//! hub's. [`Journal::open_read_only`] is for tools that only look.

pub mod memory;
pub mod postgres;
pub mod sqlite;

use serde::Serialize;

/// Where a GUID stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Claimed; the request is about to leave or has left.
    Sending,
    /// A final answer (0000, B-code, E500) is known and is replayed.
    Done,
    /// Sent, outcome unknown (E901): a repeat is answered by inquiry.
    Unknown,
    /// Certainly not sent (E902/E903/E904): a repeat may post again.
    NotSent,
}

impl State {
    /// `done` or `not_sent`: nothing more will happen to the GUID unless a
    /// channel sends it again, so the row may be pruned past the retention.
    pub fn is_settled(&self) -> bool {
        matches!(self, State::Done | State::NotSent)
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            State::Sending => "sending",
            State::Done => "done",
            State::Unknown => "unknown",
            State::NotSent => "not_sent",
        }
    }

    pub fn parse(s: &str) -> Option<State> {
        Some(match s {
            "sending" => State::Sending,
            "done" => State::Done,
            "unknown" => State::Unknown,
            "not_sent" => State::NotSent,
            _ => return None,
        })
    }
}

/// One GUID's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub guid: String,
    pub tx_code: String,
    /// SHA-256 of the request body, hex: a repeat with another body is refused.
    pub fingerprint: String,
    pub state: State,
    /// The standard code last answered for it.
    pub code: Option<String>,
    /// The response body that goes with a final code (45 bytes for 0000).
    #[serde(serialize_with = "serialize_lossy")]
    pub answer: Option<Vec<u8>>,
    /// POST attempts made (a resend after "not sent" adds one).
    pub attempts: u32,
    pub last_attempt_ms: i64,
    /// When the last attempt was answered (the resend cooldown counts from here).
    pub answered_ms: Option<i64>,
    pub last_error: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// The base URL the latest attempt was (or was about to be) sent to,
    /// written before its first request byte: an inquiry asks this URL, since a
    /// "never received" from another one proves nothing.
    pub url: Option<String>,
    /// The wire grace (ms) of the hub that made the latest attempt, stamped
    /// by its claim: a "never received" proves nothing about the attempt
    /// before this much time has passed, whichever hub (or reconcile) asks
    /// and whatever its own grace. `None` for rows from before schema
    /// version 6 (SQLite) or 5 (PostgreSQL), and for claims made without one.
    pub grace_ms: Option<i64>,
}

/// Where an attempt goes, as its claim stamps it on the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptTo<'a> {
    /// The base URL the attempt will be sent to.
    pub url: &'a str,
    /// The wire grace of the hub making it, in ms ([`Row::grace_ms`]).
    pub grace_ms: Option<i64>,
}

impl<'a> AttemptTo<'a> {
    /// An attempt to `url`, with no grace stamped (tools and tests).
    pub fn url(url: &'a str) -> AttemptTo<'a> {
        AttemptTo {
            url,
            grace_ms: None,
        }
    }
}

fn serialize_lossy<S: serde::Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(b) => s.serialize_some(&String::from_utf8_lossy(b)),
        None => s.serialize_none(),
    }
}

/// One entry of a GUID's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    pub at_ms: i64,
    pub state: State,
    pub code: Option<String>,
    pub note: String,
}

/// What [`Journal::claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
// Returned once per claim and matched at once: boxing the row would cost an
// allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Claim {
    /// The GUID was new: the caller owns attempt 1 and the row says `sending`.
    New,
    /// The GUID was known; here is its row.
    Existing(Row),
}

/// The outcome to record for a GUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    pub state: State,
    pub code: String,
    pub answer: Option<Vec<u8>>,
    pub error: Option<String>,
    pub note: String,
    /// The attempt this outcome is about. When set, the write applies only
    /// while the row is still at that attempt: an outcome of attempt N (a
    /// retried write, a reconcile working from an old list) never lands on
    /// attempt N+1, which may be on its way to the core.
    pub attempt: Option<u32>,
}

impl Finish {
    /// Whether the outcome must be on disk before its answer leaves, even
    /// where outcomes are not (the SQLite journal's default): an E500 is
    /// the one final answer the core may hold no record of (a 500, a 400 or
    /// a 429 may come from a gateway in front of it). Taken back to
    /// `sending` by a power loss, the row would be asked about, the core's
    /// "never received" would make it E904, and a resend would be posted:
    /// a transfer the channel was told E500 about ("no money moved, do not
    /// resend") would then move money (found by a black-box probe). Any
    /// other outcome lost so is settled by the core's record as it was
    /// answered. Rare, so the fsync costs the telegram path nothing.
    pub fn must_be_durable(&self) -> bool {
        self.state == State::Done && self.code == crate::outcome::Code::TARGET_ERROR.as_str()
    }
}

/// A journal that cannot be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {reason}")]
    Open { path: String, reason: String },
    /// Another process owns the journal file (see [`Journal::open_owned`]).
    #[error(
        "journal {path} is held by another relayhub ({holder}; lock file {lock}): a journal \
         file serves one hub at a time, since each would take the other's transfers in flight \
         for ones a crash left behind. Stop that one first, or give this hub a journal of its \
         own (several hubs share a postgres:// journal)"
    )]
    Locked {
        path: String,
        lock: String,
        holder: String,
    },
    #[error("journal write failed: {0}")]
    Write(String),
    #[error("journal read failed: {0}")]
    Read(String),
}

/// The journal the hub uses, whatever its store.
///
/// The PostgreSQL calls on the telegram path are boxed: their futures are a
/// few KB, and a telegram's future, which holds the journal call it awaits
/// and is itself boxed (copied) once per telegram, would be that large
/// whichever store runs. A network round trip dwarfs the allocation.
#[derive(Clone)]
pub enum Journal {
    Memory(memory::MemoryJournal),
    Sqlite(sqlite::SqliteJournal),
    Postgres(postgres::PgJournal),
}

/// This process's ownership of a journal, from [`Journal::open_owned`]: for a
/// SQLite file, the lock on `<file>.lock`, released when this is dropped (or
/// the process ends, however it ends).
#[derive(Debug)]
#[must_use = "the journal is owned only while this is kept"]
pub struct Ownership {
    lock: Option<sqlite::lock::FileLock>,
}

impl Ownership {
    /// At a clean stop: a SQLite journal is copied into its file and its
    /// `-wal` emptied, and the lock file says so, so that the file alone is
    /// the whole journal (see [`sqlite::SqliteJournal::checkpoint_into_file`]).
    /// Other stores have nothing to do.
    /// Whether there was a file to make whole.
    pub async fn close_cleanly(&mut self, journal: &Journal) -> Result<bool, JournalError> {
        let (Some(lock), Journal::Sqlite(j)) = (self.lock.as_mut(), journal) else {
            return Ok(false);
        };
        j.checkpoint_into_file().await?;
        lock.mark_whole_in_file().map_err(|e| {
            JournalError::Write(format!(
                "the journal was copied into its file, but its lock file {} could not say so: {e}",
                lock.path().display()
            ))
        })?;
        Ok(true)
    }

    /// The lock file held, for a SQLite journal.
    pub fn lock_file(&self) -> Option<&std::path::Path> {
        self.lock.as_ref().map(|l| l.path())
    }
}

fn absolute(path: &std::path::Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// The database file a `--journal` value names, if it names one (not
/// `memory`, not a PostgreSQL URL).
pub fn file_of(spec: &str) -> Option<&std::path::Path> {
    let shared = spec.starts_with("postgres://") || spec.starts_with("postgresql://");
    (spec != "memory" && !shared).then(|| std::path::Path::new(spec))
}

impl Journal {
    /// Opens the journal named by `--journal`: `memory`, a `postgres://` (or
    /// `postgresql://`) URL, or a database file (created if absent). Takes no
    /// ownership: for tests and tools; a hub opens with [`Journal::open_owned`].
    pub async fn open(spec: &str, max_batch: usize) -> Result<Journal, JournalError> {
        Journal::open_with(spec, max_batch, false).await
    }

    /// [`Journal::open`]; a SQLite file fsyncs every commit, outcomes
    /// included, when `fsync_outcomes` (`journal.fsync_outcomes`).
    async fn open_with(
        spec: &str,
        max_batch: usize,
        fsync_outcomes: bool,
    ) -> Result<Journal, JournalError> {
        if spec == "memory" {
            return Ok(Journal::Memory(memory::MemoryJournal::default()));
        }
        match file_of(spec) {
            Some(path) => Ok(Journal::Sqlite(sqlite::SqliteJournal::open_with(
                path,
                max_batch,
                fsync_outcomes,
            )?)),
            None => Ok(Journal::Postgres(postgres::PgJournal::open(spec).await?)),
        }
    }

    /// Opens the journal as its owner, the only process that may run
    /// [`Journal::recover`] on it and settle its unknown rows on its own
    /// word: a SQLite file is locked first (refused with
    /// [`JournalError::Locked`] while another process owns it), then opened.
    pub async fn open_owned(
        spec: &str,
        max_batch: usize,
        fsync_outcomes: bool,
    ) -> Result<(Journal, Ownership), JournalError> {
        if let Some(path) = file_of(spec) {
            // Before the lock file is made beside it: a directory or a
            // missing parent leaves nothing behind.
            sqlite::open::check_path(path)
                .and_then(|()| sqlite::lock::one_link(path))
                .map_err(|reason| JournalError::Open {
                    path: path.display().to_string(),
                    reason,
                })?;
        }
        let mut lock = match file_of(spec) {
            Some(path) => Some(sqlite::lock::FileLock::acquire(path).map_err(|e| match e {
                // Absolute, so the operator can tell which file whatever the
                // working directory of either process.
                sqlite::lock::LockError::Held { lock, holder } => JournalError::Locked {
                    path: absolute(path),
                    lock: absolute(&lock),
                    holder,
                },
                sqlite::lock::LockError::Io { lock, reason } => JournalError::Open {
                    path: path.display().to_string(),
                    reason: format!("cannot lock {}: {reason}", lock.display()),
                },
            })?),
            None => None,
        };
        // Owned now, so nobody is making it. A journal an earlier owner had
        // opened (its lock file says so) that is gone, or holds nothing, lost
        // what it held (deleted, moved, truncated, or a new journal's WAL
        // deleted before its first checkpoint): taken for a new one, it
        // would post again every GUID it held. One whose -wal is gone, where
        // that owner kept it at close, lost its latest rows the same way.
        if let (Some(path), Some(held)) = (file_of(spec), &lock)
            && held.opened_before()
        {
            let lock = held.path().display();
            let empty = format!(
                "to start with an empty journal instead, remove {lock} (a resend of any GUID \
                 the old one held would then be posted again)"
            );
            let lost = if !path.exists() {
                Some((
                    format!(
                        "the file is gone, but its lock file {lock} is there: a hub had it open, \
                         so it was deleted or moved since"
                    ),
                    empty,
                ))
            } else if sqlite::open::holds_nothing(path) {
                Some((
                    format!(
                        "the file holds no journal (empty, or its tables were only in a -wal file \
                         that is gone), but its lock file {lock} is there: a hub had it open, so \
                         its content was lost since"
                    ),
                    empty,
                ))
            } else {
                let problem = held
                    .wal_kept_before()
                    .then(|| sqlite::open::wal_problem(path))
                    .flatten();
                problem.map(|problem| {
                    (
                        format!(
                            "its -wal file {problem}, but its lock file {lock} is there: a hub had \
                         the journal open, and it keeps the -wal file, so the -wal was deleted, \
                         moved, damaged or not copied with the file since, and the rows only it \
                         held (the latest transfers) may be lost. (Another SQLite program that \
                         opened the journal read-write since, with no hub running, copies the \
                         -wal into the file as it closes and deletes it: then nothing is lost)"
                        ),
                        format!(
                            "to start with what the file alone holds instead, remove {lock} (a \
                         resend of a GUID only the -wal held would then be posted again)"
                        ),
                    )
                })
            };
            if let Some((what, instead)) = lost {
                return Err(JournalError::Open {
                    path: path.display().to_string(),
                    reason: format!("{what}. Put the journal back (with its -wal file); {instead}"),
                });
            }
        }
        let journal = Journal::open_with(spec, max_batch, fsync_outcomes).await?;
        if let (Some(lock), Some(path)) = (lock.as_mut(), file_of(spec)) {
            lock.mark_opened().map_err(|e| JournalError::Open {
                path: path.display().to_string(),
                reason: format!("cannot write to {}: {e}", lock.path().display()),
            })?;
        }
        Ok((journal, Ownership { lock }))
    }

    /// Opens an existing journal to look at it: a SQLite file is opened
    /// read-only (never created, migrated or locked), so this is safe beside
    /// a live hub. A shared journal's schema is neither created nor migrated
    /// (older hubs may still share it); one of another version is refused.
    pub async fn open_read_only(spec: &str) -> Result<Journal, JournalError> {
        match file_of(spec) {
            Some(path) => Ok(Journal::Sqlite(sqlite::SqliteJournal::open_read_only(
                path,
            )?)),
            None if spec != "memory" => Ok(Journal::Postgres(
                postgres::PgJournal::open_to_read(spec).await?,
            )),
            None => Journal::open(spec, 1).await,
        }
    }

    /// A short name of the store, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Journal::Memory(_) => "memory",
            Journal::Sqlite(_) => "sqlite",
            Journal::Postgres(_) => "postgres",
        }
    }

    /// Refuses a shared journal whose lease is shorter than the hub's longest
    /// call (`budget + late-answer window`, in ms) plus a margin. Other stores
    /// have no leases.
    pub fn check_lease(&self, longest_call_ms: u64) -> Result<(), JournalError> {
        match self {
            Journal::Postgres(j) => j.check_lease(longest_call_ms),
            Journal::Memory(_) | Journal::Sqlite(_) => Ok(()),
        }
    }

    /// A hub on a shared journal: records its liveness and keeps renewing it
    /// (other stores have no other hubs: nothing to do).
    pub async fn start_liveness(
        &mut self,
        s: postgres::LivenessSettings,
    ) -> Result<(), JournalError> {
        match self {
            Journal::Postgres(j) => j.start_liveness(s).await,
            Journal::Memory(_) | Journal::Sqlite(_) => Ok(()),
        }
    }

    /// Whether this hub may start a POST now. On a shared journal, Err once it
    /// could not renew its liveness within the fence: the others may soon
    /// take its transfers over, so it must not send.
    pub fn may_send(&self) -> Result<(), String> {
        match self {
            Journal::Postgres(j) => j.may_send(),
            Journal::Memory(_) | Journal::Sqlite(_) => Ok(()),
        }
    }

    /// Now on the clock the journal stamps attempts with (`last_attempt_ms`):
    /// the database's for a shared journal, else this host's.
    pub async fn clock_ms(&self) -> Result<i64, JournalError> {
        match self {
            Journal::Postgres(j) => j.clock_ms().await,
            Journal::Memory(_) | Journal::Sqlite(_) => Ok(now_ms()),
        }
    }

    /// Claims a GUID for its first attempt, or returns its row.
    /// `url` is where attempt 1 will be sent; no grace is stamped (see
    /// [`Journal::claim_to`], which the hub's transfers use).
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

    /// Claims a GUID for its first attempt, or returns its row; `to` is where
    /// attempt 1 will be sent, with the grace it is stamped with.
    pub async fn claim_to(
        &self,
        guid: &str,
        tx_code: &str,
        fingerprint: &str,
        to: AttemptTo<'_>,
        now_ms: i64,
    ) -> Result<Claim, JournalError> {
        match self {
            Journal::Memory(j) => j.claim_to(guid, tx_code, fingerprint, to, now_ms),
            Journal::Sqlite(j) => {
                Box::pin(j.claim_to(guid, tx_code, fingerprint, to, now_ms)).await
            }
            Journal::Postgres(j) => {
                Box::pin(j.claim_to(guid, tx_code, fingerprint, to, now_ms)).await
            }
        }
    }

    /// Claims a "not sent" GUID for attempt `attempts + 1`; false if its row
    /// is no longer "not sent" with that many attempts (someone else resent it).
    /// `url` is where the new attempt will be sent; no grace is stamped.
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

    /// [`Journal::claim_resend`], the new attempt going `to`, with its grace.
    pub async fn claim_resend_to(
        &self,
        guid: &str,
        attempts: u32,
        to: AttemptTo<'_>,
        now_ms: i64,
    ) -> Result<bool, JournalError> {
        match self {
            Journal::Memory(j) => j.claim_resend_to(guid, attempts, to, now_ms),
            Journal::Sqlite(j) => j.claim_resend_to(guid, attempts, to, now_ms).await,
            Journal::Postgres(j) => Box::pin(j.claim_resend_to(guid, attempts, to, now_ms)).await,
        }
    }

    /// Before a failover inside one attempt (the previous URL certainly got
    /// nothing): the attempt now goes to `url`. False unless the row is
    /// `sending`.
    pub async fn note_url(&self, guid: &str, url: &str, now_ms: i64) -> Result<bool, JournalError> {
        match self {
            Journal::Memory(j) => j.note_url(guid, url, now_ms),
            Journal::Sqlite(j) => j.note_url(guid, url, now_ms).await,
            Journal::Postgres(j) => Box::pin(j.note_url(guid, url, now_ms)).await,
        }
    }

    /// Whether other hubs share this journal: a `sending` row may then be
    /// another live hub's call. In a journal of one hub, a `sending` row that
    /// this process is not working on was orphaned (a crash, a failed write).
    pub fn is_shared(&self) -> bool {
        matches!(self, Journal::Postgres(_))
    }

    /// A shared journal's lease: how long a row's hub holds it.
    pub fn lease(&self) -> Option<std::time::Duration> {
        match self {
            Journal::Postgres(j) => Some(std::time::Duration::from_millis(j.lease_ms())),
            _ => None,
        }
    }

    /// Why every durable write (a claim) is refused until the hub restarts,
    /// if it is: the SQLite journal's sticky failures (`/readyz` says so). A
    /// new GUID is then answered E903, one the journal holds from its row.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Journal::Sqlite(j) => j.refusal(),
            Journal::Memory(_) | Journal::Postgres(_) => None,
        }
    }

    /// The store, when it answers at once with no I/O to wait for (the
    /// memory journal): the telegram's path then calls it in place, with no
    /// deadline to race, no task to hand it to and no copies for one.
    pub fn at_once(&self) -> Option<&memory::MemoryJournal> {
        match self {
            Journal::Memory(j) => Some(j),
            Journal::Sqlite(_) | Journal::Postgres(_) => None,
        }
    }

    /// Records an outcome.
    pub async fn finish(&self, guid: &str, f: Finish, now_ms: i64) -> Result<(), JournalError> {
        match self {
            Journal::Memory(j) => j.finish(guid, f, now_ms),
            Journal::Sqlite(j) => j.finish(guid, f, now_ms).await,
            Journal::Postgres(j) => Box::pin(j.finish(guid, f, now_ms)).await,
        }
    }

    /// Records an outcome only if the row is still in `only_if`, so a late or
    /// stale writer cannot overwrite a newer truth (e.g. a final answer).
    pub async fn finish_if(
        &self,
        guid: &str,
        only_if: &[State],
        f: Finish,
        now_ms: i64,
    ) -> Result<bool, JournalError> {
        match self {
            Journal::Memory(j) => j.finish_if(guid, only_if, f, now_ms),
            Journal::Sqlite(j) => Box::pin(j.finish_if(guid, only_if, f, now_ms)).await,
            Journal::Postgres(j) => Box::pin(j.finish_if(guid, only_if, f, now_ms)).await,
        }
    }

    pub async fn get(&self, guid: &str) -> Result<Option<Row>, JournalError> {
        match self {
            Journal::Memory(j) => j.get(guid),
            Journal::Sqlite(j) => j.get(guid).await,
            Journal::Postgres(j) => Box::pin(j.get(guid)).await,
        }
    }

    /// A GUID's history, oldest first.
    pub async fn history(&self, guid: &str) -> Result<Vec<Event>, JournalError> {
        match self {
            Journal::Memory(j) => j.history(guid),
            Journal::Sqlite(j) => j.history(guid).await,
            Journal::Postgres(j) => j.history(guid).await,
        }
    }

    /// Rows in a state, oldest first, at most `limit`.
    pub async fn list(&self, state: State, limit: usize) -> Result<Vec<Row>, JournalError> {
        match self {
            Journal::Memory(j) => j.list(state, limit),
            Journal::Sqlite(j) => j.list(state, limit).await,
            Journal::Postgres(j) => j.list(state, limit).await,
        }
    }

    /// How many rows are in a state.
    pub async fn count(&self, state: State) -> Result<u64, JournalError> {
        match self {
            Journal::Memory(j) => j.count(state),
            Journal::Sqlite(j) => j.count(state).await,
            Journal::Postgres(j) => j.count(state).await,
        }
    }

    /// Start-up: rows left `sending` by a crash become `unknown`. Returns how many.
    pub async fn recover(&self, now_ms: i64) -> Result<u64, JournalError> {
        match self {
            Journal::Memory(j) => j.recover(now_ms),
            Journal::Sqlite(j) => j.recover(now_ms).await,
            Journal::Postgres(j) => j.recover(now_ms).await,
        }
    }

    /// Deletes settled rows (`done`, `not_sent`), with their history, last
    /// updated before `before_ms`; rows `sending` or `unknown` are kept
    /// whatever their age. The stores on disk delete in batches, so the
    /// telegrams' claims are not held up behind one long delete.
    pub async fn prune(&self, before_ms: i64) -> Result<u64, JournalError> {
        match self {
            Journal::Memory(j) => j.prune(before_ms),
            Journal::Sqlite(j) => j.prune(before_ms).await,
            Journal::Postgres(j) => j.prune(before_ms).await,
        }
    }

    /// Rows `sending` or `unknown` last updated before `before_ms`: those a
    /// prune keeps past the retention because they are not settled.
    pub async fn unsettled_before(&self, before_ms: i64) -> Result<u64, JournalError> {
        match self {
            Journal::Memory(j) => j.unsettled_before(before_ms),
            Journal::Sqlite(j) => j.unsettled_before(before_ms).await,
            Journal::Postgres(j) => j.unsettled_before(before_ms).await,
        }
    }
}

/// Milliseconds since the Unix epoch: the journal's clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
