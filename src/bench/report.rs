//! Counting and reporting: each worker records into its own [`Recorder`] (no
//! shared lock on the hot path); the recorders are merged into one [`Report`].
//!
//! Every request ends in exactly one of three ways, so nothing is dropped:
//! `answered` with a well-formed answer (counted under its standard code),
//! `wrong` (an answer that breaks the contract: bad code, GUID echo not the
//! request's, a 0000 body that does not decode), or `errors` (no answer at all:
//! connection lost, timeout). `sent = answered + wrong + errors`.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Longest latency the histogram holds, in microseconds (larger values are
/// clamped to it, and still counted).
const MAX_US: u64 = 120_000_000;
/// Examples of each failure kind kept for the report.
const EXAMPLES: usize = 5;

fn histogram() -> Histogram<u64> {
    // 3 significant digits from 1 µs to 2 minutes: ~ 200 KB, per worker.
    Histogram::new_with_bounds(1, MAX_US, 3).expect("static bounds are valid")
}

/// One worker's counts.
pub struct Recorder {
    latency: Histogram<u64>,
    codes: BTreeMap<String, u64>,
    by_tx: BTreeMap<&'static str, u64>,
    answered: u64,
    wrong: u64,
    errors: u64,
    wrong_examples: Vec<String>,
    error_examples: Vec<String>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            latency: histogram(),
            codes: BTreeMap::new(),
            by_tx: BTreeMap::new(),
            answered: 0,
            wrong: 0,
            errors: 0,
            wrong_examples: Vec::new(),
            error_examples: Vec::new(),
        }
    }
}

impl Recorder {
    /// A well-formed answer with its standard code.
    pub fn answer(&mut self, tx: &'static str, code: &str, latency: Duration) {
        self.answered += 1;
        *self.by_tx.entry(tx).or_default() += 1;
        *self.codes.entry(code.to_string()).or_default() += 1;
        self.latency.saturating_record(micros(latency));
    }

    /// An answer that breaks the contract.
    pub fn wrong(&mut self, tx: &'static str, why: String, latency: Duration) {
        self.wrong += 1;
        *self.by_tx.entry(tx).or_default() += 1;
        self.latency.saturating_record(micros(latency));
        if self.wrong_examples.len() < EXAMPLES {
            self.wrong_examples.push(format!("{tx}: {why}"));
        }
    }

    /// No answer.
    pub fn error(&mut self, tx: &'static str, why: String) {
        self.errors += 1;
        *self.by_tx.entry(tx).or_default() += 1;
        if self.error_examples.len() < EXAMPLES {
            self.error_examples.push(format!("{tx}: {why}"));
        }
    }

    /// Requests finished so far (any way).
    pub fn done(&self) -> u64 {
        self.answered + self.wrong + self.errors
    }

    pub fn wrong_count(&self) -> u64 {
        self.wrong
    }

    pub fn error_count(&self) -> u64 {
        self.errors
    }

    pub fn merge(&mut self, other: Recorder) {
        // Same bounds on both sides, so `add` cannot fail.
        let _ = self.latency.add(&other.latency);
        for (k, v) in other.codes {
            *self.codes.entry(k).or_default() += v;
        }
        for (k, v) in other.by_tx {
            *self.by_tx.entry(k).or_default() += v;
        }
        self.answered += other.answered;
        self.wrong += other.wrong;
        self.errors += other.errors;
        for e in other.wrong_examples {
            if self.wrong_examples.len() < EXAMPLES {
                self.wrong_examples.push(e);
            }
        }
        for e in other.error_examples {
            if self.error_examples.len() < EXAMPLES {
                self.error_examples.push(e);
            }
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Latency percentiles in microseconds. Open-loop runs measure from each
/// request's intended send time, so a stall shows in every request it delayed.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Latency {
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
}

/// Requests that did not count towards the measured run.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Warmup {
    pub sent: u64,
    pub wrong: u64,
    pub errors: u64,
}

/// The result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `hub` or `direct`.
    pub mode: &'static str,
    /// The hub address or the core URL.
    pub target: String,
    pub connections: usize,
    /// Requests per second asked for (open loop); absent for closed loop.
    pub rate: Option<f64>,
    pub idle_connections: usize,
    /// Requests started (tickets taken).
    pub sent: u64,
    /// Well-formed answers, all codes.
    pub answered: u64,
    /// Answers that break the contract.
    pub wrong: u64,
    /// Requests that got no answer.
    pub errors: u64,
    /// From the first request's (intended) start to the last answer.
    pub elapsed_s: f64,
    /// Answers (well-formed or wrong) per second of `elapsed_s`.
    pub throughput: f64,
    pub latency: Latency,
    /// Well-formed answers per standard code.
    pub codes: BTreeMap<String, u64>,
    /// Requests per tx code (answered, wrong and errors).
    pub by_tx: BTreeMap<String, u64>,
    pub wrong_examples: Vec<String>,
    pub error_examples: Vec<String>,
    pub warmup: Warmup,
}

impl Report {
    pub(crate) fn build(
        head: ReportHead,
        rec: Recorder,
        sent: u64,
        elapsed: Duration,
        warmup: Warmup,
    ) -> Report {
        let h = &rec.latency;
        let q = |p: f64| {
            if h.is_empty() {
                0
            } else {
                h.value_at_quantile(p)
            }
        };
        let finished = rec.answered + rec.wrong;
        let secs = elapsed.as_secs_f64();
        Report {
            mode: head.mode,
            target: head.target,
            connections: head.connections,
            rate: head.rate,
            idle_connections: head.idle_connections,
            sent,
            answered: rec.answered,
            wrong: rec.wrong,
            errors: rec.errors,
            elapsed_s: secs,
            throughput: if secs > 0.0 {
                finished as f64 / secs
            } else {
                0.0
            },
            latency: Latency {
                p50_us: q(0.5),
                p90_us: q(0.9),
                p99_us: q(0.99),
                p999_us: q(0.999),
                max_us: if h.is_empty() { 0 } else { h.max() },
                mean_us: if h.is_empty() { 0.0 } else { h.mean() },
            },
            codes: rec.codes,
            by_tx: rec
                .by_tx
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            wrong_examples: rec.wrong_examples,
            error_examples: rec.error_examples,
            warmup,
        }
    }

    /// True when every request got a well-formed answer.
    pub fn clean(&self) -> bool {
        self.wrong == 0 && self.errors == 0 && self.warmup.wrong == 0 && self.warmup.errors == 0
    }

    /// The table for people.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let ms = |us: u64| format!("{:.3} ms", us as f64 / 1000.0);
        let mut s = String::new();
        let pacing = match self.rate {
            Some(r) => format!("open loop at {r:.0}/s (latency from intended send time)"),
            None => "closed loop".to_string(),
        };
        let _ = writeln!(
            s,
            "{} {}: {} connection(s), {pacing}",
            self.mode, self.target, self.connections
        );
        if self.idle_connections > 0 {
            let _ = writeln!(s, "idle connections held: {}", self.idle_connections);
        }
        let _ = writeln!(
            s,
            "{:<12} {:>12}",
            "throughput",
            format!("{:.0}/s", self.throughput)
        );
        let _ = writeln!(
            s,
            "{:<12} {:>12}",
            "elapsed",
            format!("{:.2} s", self.elapsed_s)
        );
        let l = &self.latency;
        for (name, v) in [
            ("p50", l.p50_us),
            ("p90", l.p90_us),
            ("p99", l.p99_us),
            ("p99.9", l.p999_us),
            ("max", l.max_us),
        ] {
            let _ = writeln!(s, "{name:<12} {:>12}", ms(v));
        }
        let _ = writeln!(
            s,
            "{:<12} {:>12}   answered {}, wrong {}, no answer {}",
            "sent", self.sent, self.answered, self.wrong, self.errors
        );
        if self.by_tx.len() > 1 {
            let per: Vec<String> = self.by_tx.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(s, "{:<12} {:>12}", "by tx code", per.join(", "));
        }
        for (code, n) in &self.codes {
            let meaning = crate::outcome::Code::parse(code)
                .map(|c| c.meaning())
                .unwrap_or("");
            let _ = writeln!(s, "  {code:<10} {n:>12}   {meaning}");
        }
        if self.wrong > 0 {
            let _ = writeln!(s, "  {:<10} {:>12}   contract broken:", "WRONG", self.wrong);
            for e in &self.wrong_examples {
                let _ = writeln!(s, "      {e}");
            }
        }
        if self.errors > 0 {
            let _ = writeln!(s, "  {:<10} {:>12}   no answer:", "ERROR", self.errors);
            for e in &self.error_examples {
                let _ = writeln!(s, "      {e}");
            }
        }
        if self.warmup.sent > 0 {
            let _ = writeln!(
                s,
                "warm-up: {} sent first and not measured ({} wrong, {} no answer)",
                self.warmup.sent, self.warmup.wrong, self.warmup.errors
            );
        }
        s
    }
}

/// The parts of a report fixed before the run.
pub(crate) struct ReportHead {
    pub mode: &'static str,
    pub target: String,
    pub connections: usize,
    pub rate: Option<f64>,
    pub idle_connections: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_counts_add_up_and_nothing_is_dropped() {
        let mut a = Recorder::default();
        a.answer("TRF001", "0000", Duration::from_micros(300));
        a.answer("TRF001", "B201", Duration::from_micros(500));
        let mut b = Recorder::default();
        b.wrong(
            "INQ001",
            "GUID echo differs".into(),
            Duration::from_micros(700),
        );
        b.error("TRF001", "connection closed".into());
        a.merge(b);
        assert_eq!(a.done(), 4);
        let r = Report::build(
            ReportHead {
                mode: "hub",
                target: "x".into(),
                connections: 2,
                rate: None,
                idle_connections: 0,
            },
            a,
            4,
            Duration::from_secs(1),
            Warmup::default(),
        );
        assert_eq!((r.answered, r.wrong, r.errors), (2, 1, 1));
        assert_eq!(r.codes["0000"], 1);
        assert_eq!(r.codes["B201"], 1);
        assert_eq!(r.by_tx["TRF001"], 3);
        assert!(!r.clean());
        assert!(r.latency.max_us >= 700);
        assert!(r.table().contains("WRONG"));
    }
}
