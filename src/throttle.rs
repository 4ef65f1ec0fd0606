//! One log line per period for an event that repeats (a refused connection,
//! a failed accept, a journal that cannot take claims): the first at once,
//! then at most one per period with the count since the last, so a burst is
//! a line and not a flood, and no occurrence is lost from the counts.

use std::time::Duration;

use tokio::time::Instant;

/// One log line per `every` for an event that repeats: the first occurrence
/// is logged at once, later ones are counted and reported with the next line.
pub struct Throttle {
    every: Duration,
    last_line: Option<Instant>,
    /// Occurrences since the last line.
    since: u64,
}

impl Throttle {
    /// A `const fn`, so that a throttle shared by a whole process can be a
    /// `static`.
    pub const fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            last_line: None,
            since: 0,
        }
    }

    /// Counts an occurrence at `now`; `Some(count)` when a line is due, with
    /// the occurrences it reports (this one included).
    pub fn note(&mut self, now: Instant) -> Option<u64> {
        self.since += 1;
        let due = self
            .last_line
            .is_none_or(|last| now.saturating_duration_since(last) >= self.every);
        due.then(|| {
            self.last_line = Some(now);
            std::mem::take(&mut self.since)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure that repeats is logged at once, then once per period with
    /// the count since the last line; none is lost from the counts.
    #[test]
    fn a_repeating_failure_gets_one_line_per_period_with_its_count() {
        let every = Duration::from_secs(10);
        let mut t = Throttle::new(every);
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(t.note(at(0)), Some(1), "the first is logged at once");
        let mut lines = Vec::new();
        // Every 50 ms for 25 s: 500 more.
        for i in 1..=500 {
            if let Some(n) = t.note(at(i * 50)) {
                lines.push((i * 50, n));
            }
        }
        assert_eq!(lines, vec![(10_000, 200), (20_000, 200)]);
        assert_eq!(t.since, 100, "the last 100 wait for the next line");
        assert_eq!(t.note(at(30_000)), Some(101));
        // A clock read earlier than the last line's waits for the period.
        assert_eq!(t.note(at(0)), None);
    }
}
