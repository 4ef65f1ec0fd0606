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
//! race: connections closed within [`QUICK`] of their answer. After
//! [`SEEN`] of them within [`WINDOW`], the target's pooled connections are
//! not reused for [`PAUSE`]: each call opens a new one, which such a core
//! costs anyway. A core that closes idle connections after a keep-alive
//! timeout (seconds) does not look like one.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
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
        }
    }

    /// Whether a pooled connection may be reused at `now` (no clock read
    /// while reuse is on).
    pub(super) fn reuse(&self, now: impl FnOnce() -> Instant) -> bool {
        let until = self.off_until_ms.load(Ordering::Relaxed);
        until == 0 || self.ms(now()) >= until
    }

    /// A connection taken from the pool was found closed by the core (by
    /// the probe, or by the call that wrote into it), `idle` after it went
    /// back to the pool. True when this turns reuse off.
    pub(super) fn closed(&self, idle: Duration, now: Instant) -> bool {
        if idle >= QUICK {
            return false;
        }
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        if counted
            .since
            .is_none_or(|since| now.duration_since(since) > WINDOW)
        {
            *counted = Counted {
                since: Some(now),
                closes: 0,
            };
        }
        counted.closes += 1;
        if counted.closes < SEEN {
            return false;
        }
        *counted = Counted::default();
        drop(counted);
        self.off_until_ms
            .store(self.ms(now + PAUSE).max(1), Ordering::Relaxed);
        tracing::warn!(
            target_name = %self.target,
            "the core closed {SEEN} connections within {} ms of answering on them (without \
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

    #[test]
    fn quick_closes_turn_reuse_off_for_the_pause() {
        let watch = CloseWatch::new("core");
        let t0 = Instant::now();
        assert!(watch.reuse(|| t0));
        for i in 1..SEEN {
            assert!(!watch.closed(SOON, t0 + SOON * i));
            assert!(watch.reuse(|| t0 + SOON * i), "{i} closes");
        }
        assert!(watch.closed(SOON, t0 + SOON * SEEN));
        let off = t0 + SOON * SEEN;
        assert!(!watch.reuse(|| off));
        assert!(!watch.reuse(|| off + PAUSE - Duration::from_millis(2)));
        assert!(watch.reuse(|| off + PAUSE + Duration::from_millis(2)));
        // The count started over: one more close does not turn it off again.
        assert!(!watch.closed(SOON, off + PAUSE + SOON));
        assert!(watch.reuse(|| off + PAUSE + SOON));
    }

    #[test]
    fn closes_after_a_keep_alive_timeout_do_not_count() {
        let watch = CloseWatch::new("core");
        let t0 = Instant::now();
        for i in 1..=10 * SEEN {
            assert!(!watch.closed(QUICK, t0 + SOON * i));
            assert!(!watch.closed(Duration::from_secs(5), t0 + SOON * i));
        }
        assert!(watch.reuse(|| t0 + SOON * 100));
    }

    #[test]
    fn closes_further_apart_than_the_window_do_not_add_up() {
        let watch = CloseWatch::new("core");
        let t0 = Instant::now();
        for i in 0..10 * SEEN {
            assert!(!watch.closed(SOON, t0 + (WINDOW + SOON) * i), "close {i}");
        }
        assert!(watch.reuse(|| t0 + WINDOW * 100));
    }
}
