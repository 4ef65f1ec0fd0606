//! Liveness on the shared journal: each hub process renews a row of its own
//! in `relayhub_hubs` every `renew` on a dedicated connection (not the pool
//! the telegrams use, so a pool starved by a burst does not make a live hub
//! look dead), stamped with the database's clock.
//!
//! * Others: a hub whose row was last renewed more than its `dead_after` ago,
//!   by the database's clock, is dead; its `sending` rows may be taken over
//!   (see [`OWNER_DEAD`]).
//! * Itself: a hub that has not renewed for `fence`, measured on its own
//!   monotonic clock from the *start* of its last successful renewal, stops
//!   posting ([`Liveness::may_send`]): nothing is sent, and its transfers
//!   are answered E901 (or the core's final answer about the GUID). The renewal that started at `t` was stamped by the
//!   database at or after `t`, so the hub fences at or before
//!   `renewed + fence`, while the others wait until `renewed + dead_after`.
//!
//! Why a heartbeat and not a session advisory lock: the server releases an
//! advisory lock only when it notices the session is gone, which for a hub
//! cut off by the network takes the TCP keepalive or retransmission timeout
//! (minutes), and the hub itself cannot tell from a lock it holds when the
//! others may consider it gone. A heartbeat compares one clock, the
//! database's, and gives the hub a deadline of its own. docs/scale-out.md has
//! the timing argument.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;
use tracing::{error, info, warn};

use super::{DB_NOW, db_error};
use crate::metric_names;

/// SQL condition: the owner of the `relayhub_journal` row (aliased `j`) is a
/// hub whose liveness lapsed (by its own `dead_after_ms`, on the database's
/// clock). A row without an owner, or whose owner never had a liveness row
/// (a hub of schema version 3), is judged by its lease only.
pub(super) const OWNER_DEAD: &str = "EXISTS (SELECT 1 FROM relayhub_hubs h \
     WHERE h.hub_id = j.owner AND h.renewed_ms + h.dead_after_ms \
       < (extract(epoch FROM clock_timestamp()) * 1000)::bigint)";

/// The intervals of a hub's liveness, in ms (validated by the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessSettings {
    /// How often the hub renews its row.
    pub renew_ms: u64,
    /// The hub stops posting this long after the start of its last renewal
    /// that succeeded.
    pub fence_ms: u64,
    /// Others consider the hub dead this long after its last renewal
    /// (database clock).
    pub dead_after_ms: u64,
}

impl Default for LivenessSettings {
    fn default() -> Self {
        LivenessSettings {
            renew_ms: 250,
            fence_ms: 1_500,
            dead_after_ms: 3_000,
        }
    }
}

impl LivenessSettings {
    /// Checks the order the timing argument needs: a renewal (and one
    /// retry) inside the fence, and room between the fence and the others'
    /// deadline for the time between the hub's last check and its bytes
    /// leaving, and for the two clocks' rates differing.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.renew_ms < 10 {
            return Err(("journal.liveness_renew_ms", "must be at least 10".into()));
        }
        if self.fence_ms < self.renew_ms.saturating_mul(2) {
            return Err((
                "journal.liveness_fence_ms",
                format!(
                    "{} must be at least twice liveness_renew_ms ({}): one late renewal must not fence the hub",
                    self.fence_ms, self.renew_ms
                ),
            ));
        }
        if self.dead_after_ms < self.fence_ms.saturating_add(MIN_FENCE_MARGIN_MS) {
            return Err((
                "journal.liveness_dead_after_ms",
                format!(
                    "{} must be at least liveness_fence_ms ({}) + {MIN_FENCE_MARGIN_MS}: a hub must have \
                     stopped posting before the others may take its transfers over",
                    self.dead_after_ms, self.fence_ms
                ),
            ));
        }
        if self.dead_after_ms > 600_000 {
            return Err((
                "journal.liveness_dead_after_ms",
                "must be at most 600000".into(),
            ));
        }
        Ok(())
    }
}

/// Least room between a hub's fence and the others' dead-after deadline.
pub const MIN_FENCE_MARGIN_MS: u64 = 500;

/// A hub's own view of its liveness, shared by the renewal task and the
/// telegrams that check it before every POST.
#[derive(Debug)]
pub struct Liveness {
    base: Instant,
    /// Nanoseconds from `base` (an hour before the handle was made) to the
    /// start of the last renewal that succeeded; 0 before the first.
    last_ok_start: AtomicU64,
    fence: Duration,
    fenced: AtomicBool,
}

impl Liveness {
    fn new(fence: Duration) -> Liveness {
        let now = Instant::now();
        Liveness {
            // An hour back, so a renewal that started "before" the handle
            // existed (tests) still has a time after the base.
            base: now.checked_sub(Duration::from_secs(3_600)).unwrap_or(now),
            last_ok_start: AtomicU64::new(0),
            fence,
            fenced: AtomicBool::new(false),
        }
    }

    fn renewed(&self, started: Instant) {
        let ns = (started.saturating_duration_since(self.base).as_nanos() as u64).max(1);
        // Renewals run one at a time, in order; keep the latest start anyway.
        self.last_ok_start.fetch_max(ns, Ordering::SeqCst);
        if self.fenced.swap(false, Ordering::SeqCst) {
            metrics::gauge!(metric_names::JOURNAL_FENCED).set(0.0);
            info!("liveness renewed again: the hub posts again");
        }
    }

    /// Whether the hub may start a POST now: its last successful renewal
    /// started less than the fence ago. Err says why not.
    pub fn may_send(&self) -> Result<(), String> {
        let last = self.last_ok_start.load(Ordering::SeqCst);
        let since = if last == 0 {
            None
        } else {
            Some(Instant::now().saturating_duration_since(self.base + Duration::from_nanos(last)))
        };
        match since {
            Some(s) if s < self.fence => Ok(()),
            _ => {
                if !self.fenced.swap(true, Ordering::SeqCst) {
                    metrics::gauge!(metric_names::JOURNAL_FENCED).set(1.0);
                    error!(
                        fence_ms = self.fence.as_millis() as u64,
                        "this hub could not renew its liveness in the journal within the fence: \
                         nothing is posted until it can (transfers are answered E901, or the core's final answer)"
                    );
                }
                Err(format!(
                    "this hub could not renew its liveness in the journal for {} ms (fence {} ms)",
                    since.map_or(0, |s| s.as_millis()),
                    self.fence.as_millis()
                ))
            }
        }
    }
}

/// Renews once now (the hub starts only if it can), then keeps renewing in a
/// task until the process ends.
pub(super) async fn start(
    pg: tokio_postgres::Config,
    hub_id: String,
    s: LivenessSettings,
    timeout: Duration,
) -> Result<Arc<Liveness>, String> {
    let state = Arc::new(Liveness::new(Duration::from_millis(s.fence_ms)));
    let mut conn = None;
    // Each renewal is bounded: one that takes longer than the fence is no use.
    let bound = timeout.min(Duration::from_millis(s.fence_ms));
    let started = Instant::now();
    renew(&pg, &mut conn, &hub_id, &s, bound)
        .await
        .map_err(|e| format!("cannot record this hub's liveness: {e}"))?;
    state.renewed(started);
    metrics::gauge!(metric_names::JOURNAL_FENCED).set(0.0);
    if let Some(c) = &conn {
        // Hubs dead for a day are forgotten; their rows were taken over long ago.
        let _ = c
            .execute(
                &format!("DELETE FROM relayhub_hubs WHERE renewed_ms + dead_after_ms < {DB_NOW} - 86400000"),
                &[],
            )
            .await;
    }
    let task_state = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(s.renew_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut failing = false;
        loop {
            tick.tick().await;
            let started = Instant::now();
            match renew(&pg, &mut conn, &hub_id, &s, bound).await {
                Ok(()) => {
                    task_state.renewed(started);
                    if failing {
                        failing = false;
                        info!("liveness renewal works again");
                    }
                }
                Err(e) => {
                    conn = None;
                    metrics::counter!(metric_names::JOURNAL_LIVENESS_FAILURES).increment(1);
                    if !failing {
                        failing = true;
                        warn!(%e, "could not renew this hub's liveness in the journal; retrying");
                    }
                }
            }
        }
    });
    Ok(state)
}

/// One renewal on the dedicated connection, (re)connecting first if needed.
async fn renew(
    pg: &tokio_postgres::Config,
    conn: &mut Option<tokio_postgres::Client>,
    hub_id: &str,
    s: &LivenessSettings,
    bound: Duration,
) -> Result<(), String> {
    let work = async {
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            let (client, connection) = pg.connect(NoTls).await.map_err(|e| db_error(&e))?;
            tokio::spawn(connection);
            *conn = Some(client);
        }
        let Some(c) = conn.as_ref() else {
            return Err("no connection".to_string());
        };
        let (fence, dead) = (
            i64::try_from(s.fence_ms).unwrap_or(i64::MAX),
            i64::try_from(s.dead_after_ms).unwrap_or(i64::MAX),
        );
        c.execute(
            &format!(
                "INSERT INTO relayhub_hubs (hub_id, started_ms, renewed_ms, fence_ms, dead_after_ms) \
                 VALUES ($1::text, {DB_NOW}, {DB_NOW}, $2::bigint, $3::bigint) \
                 ON CONFLICT (hub_id) DO UPDATE SET renewed_ms = {DB_NOW}"
            ),
            &[&hub_id, &fence, &dead],
        )
        .await
        .map_err(|e| db_error(&e))?;
        Ok(())
    };
    match tokio::time::timeout(bound, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} ms", bound.as_millis())),
    }
}

/// One hub's liveness as the database sees it, for `relayhub journal hubs`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HubLiveness {
    pub hub_id: String,
    pub started_ms: i64,
    pub renewed_ms: i64,
    /// How long ago the last renewal was, on the database's clock.
    pub since_renewal_ms: i64,
    pub fence_ms: i64,
    pub dead_after_ms: i64,
    /// Dead: the others may take its `sending` rows over.
    pub dead: bool,
    /// Its `sending` rows.
    pub sending: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_comes_before_the_others_deadline() {
        assert!(LivenessSettings::default().check().is_ok());
        let bad = [
            (5, 1_000, 3_000, "liveness_renew_ms"),
            (250, 400, 3_000, "liveness_fence_ms"),
            (250, 1_500, 1_500, "liveness_dead_after_ms"),
            (250, 1_500, 1_900, "liveness_dead_after_ms"),
            (250, 1_500, 700_000, "liveness_dead_after_ms"),
        ];
        for (renew_ms, fence_ms, dead_after_ms, key) in bad {
            let s = LivenessSettings {
                renew_ms,
                fence_ms,
                dead_after_ms,
            };
            let e = s.check().expect_err(&format!("{s:?} accepted"));
            assert!(e.0.ends_with(key), "{s:?}: {e:?}");
        }
    }

    #[test]
    fn a_hub_that_never_renewed_or_stopped_renewing_may_not_send() {
        let l = Liveness::new(Duration::from_millis(50));
        assert!(l.may_send().is_err(), "no renewal yet");
        l.renewed(Instant::now());
        assert!(l.may_send().is_ok());
        l.renewed(Instant::now() - Duration::from_millis(60));
        // An older start does not move the last one back.
        assert!(l.may_send().is_ok());
        let old = Liveness::new(Duration::from_millis(50));
        old.renewed(Instant::now() - Duration::from_millis(60));
        let e = old.may_send().expect_err("fenced");
        assert!(e.contains("fence 50 ms"), "{e}");
    }
}
