//! The shared journal store (PostgreSQL), for two or more hubs behind one load
//! balancer: the promise of at most one POST per GUID then holds across hubs.
//!
//! Same semantics as [`super::sqlite::SqliteJournal`], each operation one
//! atomic statement (its event appended by the same statement), so two hubs
//! racing on a GUID get exactly one [`Claim::New`], and two resends of a "not
//! sent" GUID exactly one `true` from `claim_resend`.
//!
//! # Leases
//!
//! A row that says `sending` may be in flight on another, live hub; the
//! embedded store's "whatever is `sending` at start-up was left by a crash" is
//! false here. So every claim records its hub (`owner`) and a lease
//! (`lease_until_ms`, on the *database's* clock so hubs' clocks may differ):
//! the time during which that hub's call may still be running, i.e. its
//! budget, its late-answer window and a margin ([`LEASE_MARGIN_MS`]; the hub
//! checks at start-up that its lease covers them, see [`PgJournal::check_lease`]).
//!
//! * [`PgJournal::recover`] turns only `sending` rows whose lease has expired
//!   into `unknown`; a live hub's rows are left alone.
//! * [`PgJournal::claim`] does the same for the one row it finds, so a resend
//!   of a GUID whose hub died is answered by inquiry once the lease is over,
//!   without waiting for some hub to restart. Before that, the relay sees
//!   `sending`, waits for it within its budget and answers E901.
//! * An inquiry's "never received" (E904 -> `not_sent`) written by a hub that
//!   is not the owner is not recorded while the owner's lease runs: the
//!   owner's POST may still be on its way (the relay's late-call check only
//!   knows its own process's calls). The row stays `unknown`, so a repeat is
//!   asked about again instead of posted.
//!
//! # Failures
//!
//! Every call is bounded (`timeout_ms`, default 1 s: pool wait, connect and
//! statements together) and fails with [`JournalError::Write`] or
//! [`JournalError::Read`]: with the database down or stuck, the relay sends
//! nothing and answers E901, or the core's final answer about the GUID. A write whose answer was lost may still have
//! committed; the relay treats every error as "not recorded" and sends
//! nothing, so the worst case is a row `sending` that the lease settles.
//!
//! No TLS: the driver connects with `NoTls`. Keep the database on a trusted
//! network or reach it through a local TLS tunnel; see `docs/scale-out.md`.
//!
//! # Layout
//!
//! * `open`: URL settings, the pool, server checks, migrations.
//! * this file: the handle, and the SQL of each operation.

mod liveness;
mod open;
mod reads;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Pool, PoolError, TimeoutType};
use tokio_postgres::Row as PgRow;

use super::{AttemptTo, Claim, Event, Finish, JournalError, Row, State};
use crate::metric_names;
use liveness::OWNER_DEAD;
pub use liveness::{HubLiveness, Liveness, LivenessSettings, MIN_FENCE_MARGIN_MS};

/// What a lease must cover beyond the hub's longest call (budget plus
/// late-answer window): journal writes, scheduling, and the time between the
/// hub reading a telegram and its claim reaching the database.
pub const LEASE_MARGIN_MS: u64 = 1_000;

/// Rows a prune deletes per statement: small enough to finish well within one
/// call's timeout and to hold few row locks at a time.
pub const PRUNE_BATCH: usize = 2_000;

/// Now on the database's clock, in ms since the epoch: leases are compared
/// with one clock whatever the hubs' clocks say.
const DB_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

const ROW_COLUMNS: &str = "guid, tx_code, fingerprint, state, code, answer, attempts, \
     last_attempt_ms, answered_ms, last_error, created_ms, updated_ms, url, grace_ms, grace_attempt";

/// The column after [`ROW_COLUMNS`] in a statement that adds one.
const AFTER_ROW: usize = 15;

/// A handle on the shared journal; clones share one connection pool.
#[derive(Clone)]
pub struct PgJournal {
    pool: Pool,
    hub_id: String,
    lease_ms: u64,
    timeout: Duration,
    /// The driver's settings, for the liveness connection (boxed: large).
    pg: Arc<tokio_postgres::Config>,
    /// This hub's liveness, once [`PgJournal::start_liveness`] ran (a hub;
    /// tools have none and never post).
    liveness: Option<Arc<Liveness>>,
    /// Single-row reads waiting for a batch (see [`reads`]).
    reads: Arc<reads::Reads>,
}

/// Why one call failed, before it becomes a [`JournalError`].
enum Fail {
    Db(tokio_postgres::Error),
    Data(String),
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Self {
        Fail::Db(e)
    }
}

impl Fail {
    fn reason(&self) -> String {
        match self {
            Fail::Db(e) => db_error(e),
            Fail::Data(s) => s.clone(),
        }
    }
}

/// A driver error in words: the server's SQLSTATE and message when it sent
/// one, else the cause (connection refused, closed, ...).
pub(crate) fn db_error(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    // The driver's own text names only the kind ("error connecting to
    // server"); the cause says why (refused, reset, bad password, ...).
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

pub(crate) fn pool_error(e: &PoolError) -> String {
    match e {
        PoolError::Backend(b) => db_error(b),
        PoolError::Timeout(TimeoutType::Wait) => {
            "no free database connection within the timeout (all in use)".into()
        }
        PoolError::Timeout(TimeoutType::Create) => {
            "could not connect to PostgreSQL within the timeout".into()
        }
        PoolError::Timeout(TimeoutType::Recycle) => {
            "a pooled connection did not pass its check within the timeout".into()
        }
        other => other.to_string(),
    }
}

impl PgJournal {
    /// Opens the journal at a `postgres://` URL: builds the pool, checks the
    /// server, creates or migrates the schema. Query keys of the hub's own:
    /// `hub_id` (default `HOST-PID-RANDOM`), `lease_ms` (default 60000),
    /// `pool_size` (default 16), `timeout_ms` (bound on one call, default 1000).
    pub async fn open(url: &str) -> Result<PgJournal, JournalError> {
        PgJournal::open_schema(url, open::Schema::Migrate).await
    }

    /// [`PgJournal::open`] for tools that only look: the schema is not
    /// created or migrated, and one of another version is refused (a look
    /// from a newer build must not migrate a journal that older hubs share).
    pub async fn open_to_read(url: &str) -> Result<PgJournal, JournalError> {
        PgJournal::open_schema(url, open::Schema::Check).await
    }

    async fn open_schema(url: &str, schema: open::Schema) -> Result<PgJournal, JournalError> {
        let open_error = |reason: String| JournalError::Open {
            path: redact(url),
            reason,
        };
        let s = open::settings(url).map_err(open_error)?;
        let pool = open::open(&s, schema).await.map_err(open_error)?;
        Ok(PgJournal {
            pool,
            hub_id: s.hub_id,
            lease_ms: s.lease_ms,
            timeout: s.timeout,
            pg: Arc::new(s.pg),
            liveness: None,
            reads: Arc::default(),
        })
    }

    /// Records this hub's liveness now and keeps renewing it in the
    /// background (see [`liveness`]); fails if the first renewal fails.
    pub async fn start_liveness(&mut self, s: LivenessSettings) -> Result<(), JournalError> {
        let state = liveness::start((*self.pg).clone(), self.hub_id.clone(), s, self.timeout)
            .await
            .map_err(|reason| JournalError::Open {
                path: format!("postgres (hub {})", self.hub_id),
                reason,
            })?;
        self.liveness = Some(state);
        Ok(())
    }

    /// Whether this hub may start a POST now: Err once it could not renew its
    /// liveness within the fence. A handle without liveness (tools) may.
    pub fn may_send(&self) -> Result<(), String> {
        match &self.liveness {
            Some(l) => l.may_send(),
            None => Ok(()),
        }
    }

    /// Now on the database's clock, in ms: the clock attempts are stamped
    /// with, so an attempt's age is judged on one clock whatever the hubs'.
    pub async fn clock_ms(&self) -> Result<i64, JournalError> {
        self.bounded(false, async |c| {
            let st = c.prepare_cached(&format!("SELECT {DB_NOW}")).await?;
            Ok(c.query_one(&st, &[]).await?.get(0))
        })
        .await
    }

    /// Every hub's liveness, newest first, with its `sending` rows.
    pub async fn hubs(&self) -> Result<Vec<HubLiveness>, JournalError> {
        self.bounded(false, async |c| {
            let st = c
                .prepare_cached(&format!(
                    "SELECT h.hub_id, h.started_ms, h.renewed_ms, {DB_NOW} - h.renewed_ms, \
                       h.fence_ms, h.dead_after_ms, \
                       h.renewed_ms + h.dead_after_ms < {DB_NOW}, \
                       (SELECT count(*) FROM relayhub_journal j \
                        WHERE j.owner = h.hub_id AND j.state = 'sending') \
                     FROM relayhub_hubs h ORDER BY h.renewed_ms DESC, h.hub_id"
                ))
                .await?;
            Ok(c.query(&st, &[])
                .await?
                .iter()
                .map(|r| HubLiveness {
                    hub_id: r.get(0),
                    started_ms: r.get(1),
                    renewed_ms: r.get(2),
                    since_renewal_ms: r.get(3),
                    fence_ms: r.get(4),
                    dead_after_ms: r.get(5),
                    dead: r.get(6),
                    sending: r.get(7),
                })
                .collect())
        })
        .await
    }

    /// This hub's id, recorded as the owner of the rows it claims.
    pub fn hub_id(&self) -> &str {
        &self.hub_id
    }

    /// The lease each claim takes, in ms.
    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// Refuses a lease shorter than the hub's longest call (`budget + late
    /// answer window`) plus [`LEASE_MARGIN_MS`]: another hub could otherwise
    /// settle a row whose POST is still running here.
    pub fn check_lease(&self, longest_call_ms: u64) -> Result<(), JournalError> {
        lease_covers(self.lease_ms, longest_call_ms).map_err(|reason| JournalError::Open {
            path: format!("postgres (hub {})", self.hub_id),
            reason,
        })
    }

    /// Runs one call on a pooled connection, the wait for the connection
    /// included, within the timeout; failures become reads or writes.
    async fn bounded<T>(
        &self,
        writes: bool,
        call: impl AsyncFnOnce(&deadpool_postgres::Client) -> Result<T, Fail>,
    ) -> Result<T, JournalError> {
        let error = |reason: String| {
            if writes {
                JournalError::Write(reason)
            } else {
                JournalError::Read(reason)
            }
        };
        let timed_out = || {
            error(format!(
                "no answer from PostgreSQL within {} ms",
                self.timeout.as_millis()
            ))
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        let client = match tokio::time::timeout_at(deadline, self.pool.get()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return Err(error(format!(
                    "{} ({} ms)",
                    pool_error(&e),
                    self.timeout.as_millis()
                )));
            }
            Err(_) => return Err(timed_out()),
        };
        let result = tokio::time::timeout_at(deadline, call(&client)).await;
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(f)) => Err(error(f.reason())),
            Err(_) => {
                // A server or network that stopped answering leaves the
                // connection stuck behind this call; it must not be handed
                // out again. Taking it from the pool closes it.
                drop(deadpool_postgres::Object::take(client));
                Err(timed_out())
            }
        }
    }

    fn lease(&self) -> i64 {
        i64::try_from(self.lease_ms).unwrap_or(i64::MAX)
    }

    /// Claims a GUID for its first attempt, or returns its row. A row left
    /// `sending` by a hub whose lease has expired is returned as `unknown`
    /// (and recorded so).
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

    /// [`PgJournal::claim`], stamping the attempt's grace.
    pub async fn claim_to(
        &self,
        guid: &str,
        tx_code: &str,
        fingerprint: &str,
        to: AttemptTo<'_>,
        now_ms: i64,
    ) -> Result<Claim, JournalError> {
        let (url, grace_ms) = (to.url, to.grace_ms);
        self.bounded(true, async |c| {
            // One statement: the row and its first event, or nothing when the
            // GUID exists. A concurrent insert of the same GUID makes this one
            // wait for it, then do nothing.
            let insert = c
                .prepare_cached(&format!(
                    "WITH ins AS ( \
                       INSERT INTO relayhub_journal (guid, tx_code, fingerprint, state, attempts, \
                         last_attempt_ms, created_ms, updated_ms, owner, lease_until_ms, url, \
                         grace_ms, grace_attempt) \
                       VALUES ($1::text, $2::text, $3::text, 'sending', 1, {DB_NOW}, $4::bigint, \
                         $4, $5::text, {DB_NOW} + $6::bigint, $7::text, $8::bigint, 1) \
                       ON CONFLICT (guid) DO NOTHING RETURNING guid), \
                     ev AS ( \
                       INSERT INTO relayhub_journal_events (guid, at_ms, state, code, note) \
                       SELECT guid, $4, 'sending', NULL, 'attempt 1 by hub ' || $5 FROM ins) \
                     SELECT count(*) FROM ins"
                ))
                .await?;
            let inserted: i64 = c
                .query_one(
                    &insert,
                    &[
                        &guid,
                        &tx_code,
                        &fingerprint,
                        &now_ms,
                        &self.hub_id,
                        &self.lease(),
                        &url,
                        &grace_ms,
                    ],
                )
                .await?
                .get(0);
            if inserted == 1 {
                return Ok(Claim::New);
            }
            // Another statement, so it sees the row the insert conflicted with.
            // A `sending` row whose hub's lease expired, or whose hub stopped
            // renewing its liveness, is taken over: it becomes `unknown` and
            // is settled by inquiry like a row found at a restart.
            let existing = c
                .prepare_cached(&format!(
                    "WITH expired AS ( \
                       UPDATE relayhub_journal j SET state = 'unknown', updated_ms = $2::bigint, \
                         lease_until_ms = NULL \
                       FROM (SELECT coalesce(lease_until_ms, 0) < {DB_NOW} AS lease_over \
                             FROM relayhub_journal WHERE guid = $1::text) o \
                       WHERE j.guid = $1 AND j.state = 'sending' \
                         AND (coalesce(j.lease_until_ms, 0) < {DB_NOW} OR {OWNER_DEAD}) \
                       RETURNING {ROW_COLUMNS}, owner, o.lease_over), \
                     ev AS ( \
                       INSERT INTO relayhub_journal_events (guid, at_ms, state, code, note) \
                       SELECT guid, {DB_NOW}, 'unknown', 'E901', \
                         CASE WHEN lease_over \
                           THEN 'lease of hub ' || coalesce(owner, '?') || ' expired while in flight' \
                           ELSE 'hub ' || owner || ' stopped renewing its liveness while in flight; \
                                 taken over by hub ' || $3::text END \
                       FROM expired) \
                     SELECT {ROW_COLUMNS}, true FROM expired \
                     UNION ALL \
                     SELECT {ROW_COLUMNS}, false FROM relayhub_journal \
                     WHERE guid = $1 AND NOT EXISTS (SELECT 1 FROM expired)"
                ))
                .await?;
            let rows = c
                .query(&existing, &[&guid, &now_ms, &self.hub_id])
                .await?;
            match rows.first() {
                Some(r) => {
                    let taken_over: bool = r.try_get(AFTER_ROW)?;
                    if taken_over {
                        metrics::counter!(metric_names::JOURNAL_TAKEOVERS).increment(1);
                    }
                    Ok(Claim::Existing(read_row(r)?))
                }
                None => Err(Fail::Data(format!(
                    "GUID {guid} conflicted on insert but has no row (pruned meanwhile?)"
                ))),
            }
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

    /// [`PgJournal::claim_resend`], stamping the new attempt's grace.
    pub async fn claim_resend_to(
        &self,
        guid: &str,
        attempts: u32,
        to: AttemptTo<'_>,
        now_ms: i64,
    ) -> Result<bool, JournalError> {
        let (url, grace_ms) = (to.url, to.grace_ms);
        let attempts = i32::try_from(attempts)
            .map_err(|_| JournalError::Write(format!("attempt count {attempts} out of range")))?;
        self.bounded(true, async |c| {
            // A racing update waits for the row lock, then re-checks the
            // condition on the new row and finds it no longer `not_sent`.
            let st = c
                .prepare_cached(&format!(
                    "WITH up AS ( \
                       UPDATE relayhub_journal SET state = 'sending', attempts = attempts + 1, \
                         last_attempt_ms = {DB_NOW}, updated_ms = $2::bigint, owner = $4::text, \
                         lease_until_ms = {DB_NOW} + $5::bigint, url = $6::text, \
                         grace_ms = $7::bigint, grace_attempt = attempts + 1 \
                       WHERE guid = $1::text AND state = 'not_sent' AND attempts = $3::integer \
                       RETURNING guid, attempts), \
                     ev AS ( \
                       INSERT INTO relayhub_journal_events (guid, at_ms, state, code, note) \
                       SELECT guid, $2, 'sending', NULL, \
                         'attempt ' || attempts || ' by hub ' || $4 FROM up) \
                     SELECT count(*) FROM up"
                ))
                .await?;
            let changed: i64 = c
                .query_one(
                    &st,
                    &[
                        &guid,
                        &now_ms,
                        &attempts,
                        &self.hub_id,
                        &self.lease(),
                        &url,
                        &grace_ms,
                    ],
                )
                .await?
                .get(0);
            Ok(changed == 1)
        })
        .await
    }

    /// Before a failover inside one attempt: the attempt now goes to `url`.
    /// Only this hub's own `sending` row is changed.
    pub async fn note_url(&self, guid: &str, url: &str, now_ms: i64) -> Result<bool, JournalError> {
        self.bounded(true, async |c| {
            let st = c
                .prepare_cached(
                    "WITH up AS ( \
                       UPDATE relayhub_journal SET url = $2::text, updated_ms = $3::bigint \
                       WHERE guid = $1::text AND state = 'sending' AND owner = $4::text \
                       RETURNING guid), \
                     ev AS ( \
                       INSERT INTO relayhub_journal_events (guid, at_ms, state, code, note) \
                       SELECT guid, $3, 'sending', NULL, 'failover: the attempt goes to ' || $2 \
                       FROM up) \
                     SELECT count(*) FROM up",
                )
                .await?;
            let changed: i64 = c
                .query_one(&st, &[&guid, &url, &now_ms, &self.hub_id])
                .await?
                .get(0);
            Ok(changed == 1)
        })
        .await
    }

    /// Records an outcome.
    pub async fn finish(&self, guid: &str, f: Finish, now_ms: i64) -> Result<(), JournalError> {
        self.finish_if(guid, &[], f, now_ms).await.map(|_| ())
    }

    /// Records an outcome only if the row's state is in `only_if` (empty: any).
    /// False if the GUID is unknown, in another state, or if this is another
    /// hub's "not sent" while the owner's lease runs (see the module doc).
    pub async fn finish_if(
        &self,
        guid: &str,
        only_if: &[State],
        f: Finish,
        now_ms: i64,
    ) -> Result<bool, JournalError> {
        let only_if: Vec<&str> = only_if.iter().map(State::as_str).collect();
        self.bounded(true, async |c| {
            // A final answer or "not sent" ends the owner's call: the lease
            // goes. "Unknown" keeps it: the call may go on for late answers.
            // `updated_ms`, which the retention counts from on the
            // database's clock, is never earlier than that clock: a hub
            // whose own clock runs behind must not write rows that every
            // hub's prune takes at once.
            let st = c
                .prepare_cached(&format!(
                    "WITH up AS ( \
                       UPDATE relayhub_journal j SET state = $2::text, code = $3::text, \
                         answer = $4::bytea, last_error = coalesce($5::text, last_error), \
                         answered_ms = $6::bigint, updated_ms = GREATEST($6, {DB_NOW}), \
                         lease_until_ms = CASE WHEN $2 IN ('done', 'not_sent') THEN NULL \
                                               ELSE lease_until_ms END \
                       WHERE guid = $1::text \
                         AND (cardinality($7::text[]) = 0 OR state = ANY($7)) \
                         AND ($10::integer IS NULL OR attempts = $10) \
                         AND NOT ($2 = 'not_sent' AND owner IS DISTINCT FROM $8::text \
                                  AND coalesce(lease_until_ms, 0) >= {DB_NOW} \
                                  AND NOT {OWNER_DEAD}) \
                       RETURNING guid), \
                     ev AS ( \
                       INSERT INTO relayhub_journal_events (guid, at_ms, state, code, note) \
                       SELECT guid, $6, $2, $3, $9::text FROM up) \
                     SELECT count(*) FROM up"
                ))
                .await?;
            let changed: i64 = c
                .query_one(
                    &st,
                    &[
                        &guid,
                        &f.state.as_str(),
                        &f.code,
                        &f.answer,
                        &f.error,
                        &now_ms,
                        &only_if,
                        &self.hub_id,
                        &f.note,
                        &f.attempt.map(|n| n as i32),
                    ],
                )
                .await?
                .get(0);
            Ok(changed == 1)
        })
        .await
    }

    /// A GUID's row, if journaled: read in a batch with the reads asked
    /// for meanwhile, by a statement that starts after this call (see
    /// [`reads`]). Bounded by the call timeout, the wait for a batch
    /// included.
    pub async fn get(&self, guid: &str) -> Result<Option<Row>, JournalError> {
        let (reply, row) = tokio::sync::oneshot::channel();
        if let Some(running) = reads::Running::new_if_due(&self.reads, guid, reply) {
            tokio::spawn(self.clone().read_batches(running));
        }
        match tokio::time::timeout(self.timeout, row).await {
            Ok(Ok(read)) => read,
            Ok(Err(_)) => Err(JournalError::Read("the journal's reader stopped".into())),
            Err(_) => Err(JournalError::Read(format!(
                "no answer from PostgreSQL within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }

    /// A runner of [`PgJournal::get`]'s batches: one statement per batch,
    /// until none waits. A row that cannot be decoded fails the reads of
    /// its GUID only.
    async fn read_batches(self, running: reads::Running) {
        while let Some(batch) = self.reads.next_batch() {
            let rows = self
                .bounded(false, async |c| {
                    let st = c
                        .prepare_cached(&format!(
                            "SELECT {ROW_COLUMNS} FROM relayhub_journal WHERE guid = ANY($1::text[])"
                        ))
                        .await?;
                    let rows = c.query(&st, &[&batch.guids]).await?;
                    rows.iter()
                        .map(|r| {
                            let guid: String = r.try_get(0)?;
                            let row = read_row(r).map_err(|f| JournalError::Read(f.reason()));
                            Ok((guid, row))
                        })
                        .collect::<Result<Vec<_>, Fail>>()
                })
                .await;
            batch.answer(rows);
        }
        running.finished();
    }

    /// Who holds a GUID's row and until when (database clock, ms): `None`
    /// for an unknown GUID, `(owner, None)` once no lease runs. For tests and
    /// `journal show`-like tooling.
    pub async fn lease_of(
        &self,
        guid: &str,
    ) -> Result<Option<(Option<String>, Option<i64>)>, JournalError> {
        self.bounded(false, async |c| {
            let st = c
                .prepare_cached(
                    "SELECT owner, lease_until_ms FROM relayhub_journal WHERE guid = $1::text",
                )
                .await?;
            Ok(c.query_opt(&st, &[&guid])
                .await?
                .map(|r| (r.get(0), r.get(1))))
        })
        .await
    }

    /// A GUID's history, oldest first (empty if unknown).
    pub async fn history(&self, guid: &str) -> Result<Vec<Event>, JournalError> {
        self.bounded(false, async |c| {
            let st = c
                .prepare_cached(
                    "SELECT at_ms, state, code, note FROM relayhub_journal_events \
                     WHERE guid = $1::text ORDER BY id",
                )
                .await?;
            c.query(&st, &[&guid])
                .await?
                .iter()
                .map(|r| {
                    Ok(Event {
                        at_ms: r.try_get(0)?,
                        state: state_at(r, 1)?,
                        code: r.try_get(2)?,
                        note: r.try_get(3)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// Rows in a state, oldest first, at most `limit`.
    pub async fn list(&self, state: State, limit: usize) -> Result<Vec<Row>, JournalError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.bounded(false, async |c| {
            let st = c
                .prepare_cached(&format!(
                    "SELECT {ROW_COLUMNS} FROM relayhub_journal WHERE state = $1::text \
                     ORDER BY created_ms, guid LIMIT $2::bigint"
                ))
                .await?;
            c.query(&st, &[&state.as_str(), &limit])
                .await?
                .iter()
                .map(read_row)
                .collect()
        })
        .await
    }

    /// How many rows are in a state (the unknown-transfers gauge).
    pub async fn count(&self, state: State) -> Result<u64, JournalError> {
        self.bounded(false, async |c| {
            let st = c
                .prepare_cached("SELECT COUNT(*) FROM relayhub_journal WHERE state = $1::text")
                .await?;
            let n: i64 = c.query_one(&st, &[&state.as_str()]).await?.get(0);
            Ok(n as u64)
        })
        .await
    }

    /// Rows left `sending` whose lease has expired become `unknown` (E901 in
    /// their history). A live hub's rows keep their state. Returns how many.
    pub async fn recover(&self, now_ms: i64) -> Result<u64, JournalError> {
        self.bounded(true, async |c| {
            let st = c
                .prepare_cached(&format!(
                    "WITH r AS ( \
                       UPDATE relayhub_journal j SET state = 'unknown', updated_ms = $1::bigint, \
                         lease_until_ms = NULL, \
                         last_error = 'was in flight when hub ' || coalesce(owner, '?') || \
                           ' stopped (lease expired or liveness lapsed)' \
                       WHERE state = 'sending' \
                         AND (coalesce(lease_until_ms, 0) < {DB_NOW} OR {OWNER_DEAD}) \
                       RETURNING guid, owner, created_ms), \
                     ev AS ( \
                       INSERT INTO relayhub_journal_events (guid, at_ms, state, code, note) \
                       SELECT guid, {DB_NOW}, 'unknown', 'E901', \
                         'was in flight when hub ' || coalesce(owner, '?') || \
                         ' stopped (lease expired or liveness lapsed)' \
                       FROM r ORDER BY created_ms, guid) \
                     SELECT count(*) FROM r"
                ))
                .await?;
            let n: i64 = c.query_one(&st, &[&now_ms]).await?.get(0);
            if n > 0 {
                metrics::counter!(metric_names::JOURNAL_TAKEOVERS).increment(n as u64);
            }
            Ok(n as u64)
        })
        .await
    }

    /// Deletes settled rows (`done`, `not_sent`) and their history last
    /// updated before `before_ms`, [`PRUNE_BATCH`] rows per statement, each
    /// bounded by the call timeout like any other. Rows still `sending` or
    /// `unknown` are kept whatever their age: forgetting one would let its
    /// resend post again. Returns how many rows went.
    pub async fn prune(&self, before_ms: i64) -> Result<u64, JournalError> {
        self.prune_in_batches(before_ms, PRUNE_BATCH).await
    }

    /// [`PgJournal::prune`] with a batch size of the caller's (for tests).
    pub async fn prune_in_batches(
        &self,
        before_ms: i64,
        batch: usize,
    ) -> Result<u64, JournalError> {
        let limit = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let mut total = 0;
        loop {
            let n = self
                .bounded(true, async |c| {
                    // The oldest settled rows, through the partial index of
                    // migration 0002; rows another hub's prune holds are skipped.
                    // The DELETE checks the state again on the row it locks.
                    let st = c
                        .prepare_cached(
                            "WITH victims AS ( \
                               SELECT guid FROM relayhub_journal \
                               WHERE state IN ('done', 'not_sent') AND updated_ms < $1::bigint \
                               ORDER BY updated_ms LIMIT $2::bigint FOR UPDATE SKIP LOCKED), \
                             gone AS ( \
                               DELETE FROM relayhub_journal j USING victims v \
                               WHERE j.guid = v.guid AND j.state IN ('done', 'not_sent') \
                                 AND j.updated_ms < $1 \
                               RETURNING j.guid), \
                             ev AS ( \
                               DELETE FROM relayhub_journal_events e USING gone \
                               WHERE e.guid = gone.guid) \
                             SELECT (SELECT count(*) FROM victims), (SELECT count(*) FROM gone)",
                        )
                        .await?;
                    let row = c.query_one(&st, &[&before_ms, &limit]).await?;
                    let (seen, gone): (i64, i64) = (row.get(0), row.get(1));
                    Ok((seen as u64, gone as u64))
                })
                .await?;
            total += n.1;
            if n.0 < limit as u64 {
                return Ok(total);
            }
        }
    }

    /// Rows still `sending` or `unknown` last updated before `before_ms`: the
    /// ones a prune keeps past the retention because they are not settled.
    pub async fn unsettled_before(&self, before_ms: i64) -> Result<u64, JournalError> {
        self.bounded(false, async |c| {
            let st = c
                .prepare_cached(
                    "SELECT count(*) FROM relayhub_journal \
                     WHERE state IN ('sending', 'unknown') AND updated_ms < $1::bigint",
                )
                .await?;
            let n: i64 = c.query_one(&st, &[&before_ms]).await?.get(0);
            Ok(n as u64)
        })
        .await
    }
}

fn lease_covers(lease_ms: u64, longest_call_ms: u64) -> Result<(), String> {
    let needed = longest_call_ms.saturating_add(LEASE_MARGIN_MS);
    if lease_ms < needed {
        return Err(format!(
            "lease_ms={lease_ms} is shorter than the longest call (budget + late-answer window = \
             {longest_call_ms} ms) plus {LEASE_MARGIN_MS} ms; set lease_ms={needed} or more in \
             the journal URL"
        ));
    }
    Ok(())
}

fn read_row(r: &PgRow) -> Result<Row, Fail> {
    let attempts: i32 = r.try_get(6)?;
    Ok(Row {
        guid: r.try_get(0)?,
        tx_code: r.try_get(1)?,
        fingerprint: r.try_get(2)?,
        state: state_at(r, 3)?,
        code: r.try_get(4)?,
        answer: r.try_get(5)?,
        attempts: u32::try_from(attempts)
            .map_err(|_| Fail::Data(format!("negative attempt count {attempts}")))?,
        last_attempt_ms: r.try_get(7)?,
        answered_ms: r.try_get(8)?,
        last_error: r.try_get(9)?,
        created_ms: r.try_get(10)?,
        updated_ms: r.try_get(11)?,
        url: r.try_get(12)?,
        // Only a stamp of the latest attempt: a resend claimed by a build
        // before the stamp leaves an earlier attempt's grace on the row.
        grace_ms: {
            let (grace_ms, grace_attempt): (Option<i64>, Option<i32>) =
                (r.try_get(13)?, r.try_get(14)?);
            grace_ms.filter(|_| grace_attempt == Some(attempts))
        },
    })
}

/// A state column; the schema's CHECK makes a bad value a sign of tampering.
fn state_at(r: &PgRow, idx: usize) -> Result<State, Fail> {
    let s: String = r.try_get(idx)?;
    State::parse(&s).ok_or_else(|| Fail::Data(format!("unknown journal state {s:?}")))
}

/// What [`PgJournal::open`] and [`PgJournal::check_lease`] would refuse in
/// a `postgres://` URL, without connecting: for `relayhub check`.
pub fn check_url(url: &str, longest_call_ms: u64) -> Result<(), String> {
    let s = open::settings(url)?;
    lease_covers(s.lease_ms, longest_call_ms)
}

/// The URL without its password (in the user info, or a `password=` query
/// parameter), for messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redact_query(url);
    };
    // The user info ends at the last `@`: a password may hold `/`, `?` or
    // `@` unescaped, and the driver still reads it so (found by a probe).
    let (user, tail) = match rest.rfind('@') {
        Some(at) => {
            let user = match rest[..at].split_once(':') {
                Some((user, _)) => format!("{user}:***@"),
                None => format!("{}@", &rest[..at]),
            };
            (user, &rest[at + 1..])
        }
        None => (String::new(), rest),
    };
    format!("{scheme}://{user}{}", redact_query(tail))
}

/// `text` with the value of a `password` query key hidden.
fn redact_query(text: &str) -> String {
    match text.split_once('?') {
        Some((base, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") => {
                        format!("{key}=***")
                    }
                    _ => pair.to_string(),
                })
                .collect();
            format!("{base}?{}", query.join("&"))
        }
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(
            redact("postgres://hub:s3cr@t@db:5432/j?hub_id=a"),
            "postgres://hub:***@db:5432/j?hub_id=a"
        );
        assert_eq!(redact("postgres://hub@db/j"), "postgres://hub@db/j");
        assert_eq!(
            redact("postgres://hub@db/j?password=s3cret&hub_id=a"),
            "postgres://hub@db/j?password=***&hub_id=a"
        );
        assert_eq!(
            redact("postgres://hub:pw@db/j?hub_id=a&Password=x"),
            "postgres://hub:***@db/j?hub_id=a&Password=***"
        );
        assert_eq!(redact("postgresql://db/j"), "postgresql://db/j");
        // `/` and `?` in a password, unescaped (the driver reads them so).
        for url in [
            "postgres://relay:pw/S3CRET@127.0.0.1:5432/x",
            "postgres://relay:S3C?RET@127.0.0.1:5432/x",
            "postgres://relay:pw/?S3CRET@127.0.0.1:5432/x?hub_id=a",
        ] {
            let shown = redact(url);
            assert!(
                !shown.contains("S3C") && shown.starts_with("postgres://relay:***@127.0.0.1"),
                "{shown}"
            );
        }
    }

    /// The takeover's flag is read right after the row's columns.
    #[test]
    fn the_column_after_a_row_follows_the_row_columns() {
        assert_eq!(ROW_COLUMNS.split(',').count(), AFTER_ROW);
    }

    #[test]
    fn short_leases_are_refused() {
        assert!(lease_covers(33_999, 33_000).is_err());
        assert!(lease_covers(34_000, 33_000).is_ok());
        assert!(lease_covers(open::DEFAULT_LEASE_MS, 3_000 + 30_000).is_ok());
    }
}
