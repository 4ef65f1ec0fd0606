//! Whether a target's core closes its connections right after answering,
//! without saying so (no `Connection: close`).
//!
//! ureq probes a pooled connection as a call takes it out, and drops one the
//! core has closed. A core that closes every connection right after its
//! answer races that probe: when its FIN lands between the probe and the
//! request's write, the request went into a closed connection, and the
//! answer is "don't know" (E901, settled later by inquiry). In a closed loop
//! that was a quarter to a third of the calls behind a proxy that closes
//! after each answer (about one in twenty with a faster one). Such a core
//! shows itself in what the probes find, and in the calls that lost the
//! race: connections closed within [`QUICK`] of their first answer. After
//! [`SEEN`] of them within [`WINDOW`], on connections opened after the
//! window's first, with no answer on a reused connection in between, the target's
//! pooled connections are not reused for [`PAUSE`]: each call opens a new
//! one, which such a core costs anyway.
//!
//! What does not count: a close after a keep-alive timeout (seconds); a
//! connection that had answered more than once; and a restarting core's
//! burst, all the pooled connections found closed at once (each was opened
//! before the first of them was found). An answer on a reused connection
//! proves the core keeps them and starts the count over. A TLS core that
//! sends `close_notify` before closing is not seen by the probe (its alert
//! reads as bytes), so for TLS the watch rarely acts.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A connection found closed this soon after its answer was closed by a
/// core that does not keep connections.
pub(super) const QUICK: Duration = Duration::from_millis(250);
/// How many such closes, within [`WINDOW`], stop reuse.
pub(super) const SEEN: u32 = 3;
pub(super) const WINDOW: Duration = Duration::from_secs(10);
/// How long reuse stays off; then the probes look again.
pub(super) const PAUSE: Duration = Duration::from_secs(60);

/// What the probes of one target's connections have found.
#[derive(Debug)]
pub(super) struct CloseWatch {
    target: String,
    epoch: Instant,
    /// Reuse is off until this many ms after `epoch`; 0 when it is on
    /// (read on every take-out, so an atomic, not the lock).
    off_until_ms: AtomicU64,
    /// Quick closes seen in the current window.
    counted: Mutex<Counted>,
    /// `counted.closes`, read without the lock by every reused answer.
    pending: AtomicU32,
}

#[derive(Debug, Default)]
struct Counted {
    since: Option<Instant>,
    closes: u32,
}

impl CloseWatch {
    pub(super) fn new(target: &str) -> CloseWatch {
        CloseWatch {
            target: target.to_string(),
            epoch: Instant::now(),
            off_until_ms: AtomicU64::new(0),
            counted: Mutex::new(Counted::default()),
            pending: AtomicU32::new(0),
        }
    }

    /// Whether a pooled connection may be reused at `now` (no clock read
    /// while reuse is on).
    pub(super) fn reuse(&self, now: impl FnOnce() -> Instant) -> bool {
        let until = self.off_until_ms.load(Ordering::Relaxed);
        if until == 0 {
            return true;
        }
        if self.ms(now()) < until {
            return false;
        }
        // Back on: later take-outs read no clock.
        let _ = self
            .off_until_ms
            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed);
        true
    }

    /// A reused connection brought an answer: the core keeps its
    /// connections, and any count starts over.
    pub(super) fn kept(&self) {
        if self.pending.load(Ordering::Relaxed) == 0 {
            return;
        }
        *self.counted.lock().unwrap_or_else(|p| p.into_inner()) = Counted::default();
        self.pending.store(0, Ordering::Relaxed);
    }

    /// A connection taken from the pool, opened at `opened` and pooled
    /// after its first answer, was found closed by the core (by the probe,
    /// or by the call that wrote into it), `idle` after it went back to the
    /// pool. True when this turns reuse off.
    pub(super) fn closed(&self, opened: Instant, idle: Duration, now: Instant) -> bool {
        if idle >= QUICK {
            return false;
        }
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        match counted.since {
            Some(since) if now.duration_since(since) <= WINDOW => {
                if opened <= since {
                    // Opened before the window's first close: part of the
                    // burst that one told of (a restart closes them all).
                    return false;
                }
            }
            _ => {
                counted.since = Some(now);
                counted.closes = 0;
            }
        }
        counted.closes += 1;
        if counted.closes < SEEN {
            self.pending.store(counted.closes, Ordering::Relaxed);
            return false;
        }
        *counted = Counted::default();
        self.pending.store(0, Ordering::Relaxed);
        drop(counted);
        self.off_until_ms
            .store(self.ms(now + PAUSE).max(1), Ordering::Relaxed);
        metrics::counter!(crate::metric_names::CORE_REUSE_PAUSES, "target" => self.target.clone())
            .increment(1);
        tracing::warn!(
            target_name = %self.target,
            "the core closed {SEEN} connections within {} ms of their first answer (without \
             `Connection: close`); each call opens a new connection for the next {} s",
            QUICK.as_millis(),
            PAUSE.as_secs()
        );
        true
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOON: Duration = Duration::from_millis(1);

    /// A close as a core that closes after every answer makes them: the
    /// connection was opened just before.
    fn close_at(watch: &CloseWatch, at: Instant) -> bool {
        watch.closed(at - SOON / 2, SOON, at)
    }

    #[test]
    fn quick_closes_turn_reuse_off_for_the_pause() {
        let watch = CloseWatch::new("core");
        let t0 = Instant::now();
        assert!(watch.reuse(|| t0));
        for i in 1..SEEN {
            assert!(!close_at(&watch, t0 + SOON * i));
            assert!(watch.reuse(|| t0 + SOON * i), "{i} closes");
        }
        assert!(close_at(&watch, t0 + SOON * SEEN));
        let off = t0 + SOON * SEEN;
        assert!(!watch.reuse(|| off));
        assert!(!watch.reuse(|| off + PAUSE - Duration::from_millis(2)));
        assert!(watch.reuse(|| off + PAUSE + Duration::from_millis(2)));
        assert!(watch.reuse(|| panic!("no clock read once reuse is back on")));
        // The count started over: one more close does not turn it off again.
        assert!(!close_at(&watch, off + PAUSE + SOON * 3));
        assert!(watch.reuse(|| off + PAUSE + SOON * 3));
    }

    /// Every pause is counted under its target (an alert can watch the
    /// metric instead of the log).
    #[test]
    fn a_pause_is_counted_by_target() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let watch = CloseWatch::new("core-a");
            let t0 = Instant::now();
            for i in 1..=SEEN {
                close_at(&watch, t0 + SOON * i);
            }
        });
        let line = format!(
            "{}{{target=\"core-a\"}} 1",
            crate::metric_names::CORE_REUSE_PAUSES
        );
        let text = handle.render();
        assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
    }

    #[test]
    fn closes_after_a_keep_alive_timeout_do_not_count() {
        let watch = CloseWatch::new("core");
        let t0 = Instant::now();
        for i in 1..=10 * SEEN {
            let at = t0 + SOON * i;
            assert!(!watch.closed(at - SOON / 2, QUICK, at));
            assert!(!watch.closed(at - SOON / 2, Duration::from_secs(5), at));
        }
        assert!(watch.reuse(|| t0 + SOON * 100));
    }

    #[test]
    fn closes_further_apart_than_the_window_do_not_add_up() {
        let watch = CloseWatch::new("core");
        let t0 = Instant::now();
        for i in 1..10 * SEEN {
            assert!(!close_at(&watch, t0 + (WINDOW + SOON) * i), "close {i}");
        }
        assert!(watch.reuse(|| t0 + WINDOW * 100));
    }

    /// A keep-alive core that restarts closes every pooled connection at
    /// once: all of them were opened before the first one is counted.
    #[test]
    fn a_restarts_burst_counts_once() {
        let watch = CloseWatch::new("core");
        let t0 = Instant::now();
        let opened = t0 - Duration::from_secs(1);
        for i in 1..=16 {
            assert!(!watch.closed(opened, SOON, t0 + SOON * i / 16), "close {i}");
        }
        assert!(watch.reuse(|| t0 + SOON * 2));
    }

    #[test]
    fn an_answer_on_a_reused_connection_starts_the_count_over() {
        let watch = CloseWatch::new("core");
        let t0 = Instant::now();
        for round in 0..10 {
            for i in 1..SEEN {
                let at = t0 + SOON * (round * SEEN + i);
                assert!(!close_at(&watch, at), "round {round}, close {i}");
            }
            watch.kept();
        }
        assert!(watch.reuse(|| t0 + SOON * 100));
    }
}
