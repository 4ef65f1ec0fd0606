//! Rates, latencies and trace ids for the console ([`crate::console`]): a ring of per-second counters over the
//! last minute, and totals since the process started.
//!
//! Fed by one call per answered telegram ([`record`]); read by the console's
//! JSON endpoints. A mutex around a few small maps: a telegram costs one lock
//! and two map look-ups, nothing is allocated once its tx code and answer code
//! have been seen.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::core_client::TraceId;
use crate::outcome::Code;

/// Seconds the "last minute" window holds.
pub const WINDOW_SECS: u64 = 60;

/// Upper bounds of the latency buckets, in ms; the last bucket is open.
pub const LATENCY_BOUNDS_MS: [u64; 20] = [
    1, 2, 5, 10, 20, 50, 100, 200, 300, 500, 750, 1000, 1500, 2000, 2500, 3000, 4000, 5000, 10_000,
    30_000,
];
const BUCKETS: usize = LATENCY_BOUNDS_MS.len() + 1;

/// Counts by tx code, then by answer code.
pub type Counts = BTreeMap<String, BTreeMap<String, u64>>;

#[derive(Default, Clone)]
struct Slot {
    /// The second (since start) this slot holds; a slot from an older lap is stale.
    second: u64,
    counts: Counts,
    /// E-codes by the target the telegram's route named (under the rules it
    /// was answered by, so a reload does not move them).
    errors_by_target: Counts,
    latency: [u64; BUCKETS],
}

struct Inner {
    ring: Vec<Slot>,
    totals: Counts,
    latency: [u64; BUCKETS],
}

/// The process's counters (see [`stats`]).
pub struct Stats {
    started: Instant,
    started_ms: i64,
    inner: Mutex<Inner>,
}

/// Counts and latency over one period.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Period {
    /// Telegrams answered.
    pub total: u64,
    /// Telegrams per second over the period.
    pub per_second: f64,
    /// By answer code.
    pub by_code: BTreeMap<String, u64>,
    /// By tx code (`other` for unrouted ones), then by answer code.
    pub by_tx: Counts,
    /// E-codes by the target of the telegram's route (last minute only;
    /// empty in the totals).
    #[serde(skip)]
    pub errors_by_target: Counts,
    /// Latency percentiles in ms: the upper bound of the bucket the
    /// percentile falls in (`null` past the last bound, or with no telegram).
    pub p50_ms: Option<u64>,
    pub p90_ms: Option<u64>,
    pub p99_ms: Option<u64>,
}

/// The process-wide counters, created on first use.
pub fn stats() -> &'static Stats {
    static STATS: OnceLock<Stats> = OnceLock::new();
    STATS.get_or_init(Stats::new)
}

/// Counts one answered telegram and remembers its trace id under its GUID
/// (called by `Hub::handle`).
/// `target` is the target the telegram's route named, if it had one.
pub fn record(
    guid: &str,
    tx_code: &str,
    target: Option<&str>,
    code: Code,
    elapsed: Duration,
    trace: TraceId,
) {
    let error_of = target.filter(|_| code.as_str().starts_with('E'));
    stats().record_answer(
        Instant::now(),
        tx_code,
        code.as_str(),
        Some(elapsed),
        error_of,
    );
    if !guid.is_empty() {
        traces().note(guid, code, trace);
    }
}

/// Counts an answer the hub gave without reading a telegram whole (an
/// unframeable input's E102) or without its task (E901 after a panic): in
/// the code counts, as in `relayhub_telegrams_total`, but not in the
/// latencies, which time telegrams read whole.
pub fn count_untimed(tx_code: &str, code: Code) {
    stats().record_at(Instant::now(), tx_code, code.as_str(), None);
}

/// Telegrams whose trace ids (and, separately, request fields) the console
/// remembers: the most recent ones.
pub const TRACED_TELEGRAMS: usize = 20_000;
/// Telegrams of one GUID the console shows (its latest ones).
const TRACES_PER_GUID: usize = 8;

/// One telegram of a GUID: when it was answered, with what, and its trace id.
/// Kept as values and written as text only when the console asks (the
/// code's four characters, the id's 32 hex digits).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Traced {
    pub at_ms: i64,
    #[serde(serialize_with = "as_display")]
    pub code: Code,
    #[serde(serialize_with = "as_display")]
    pub trace_id: TraceId,
}

fn as_display<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// The trace ids of the latest telegrams, by GUID, in memory only: a restart
/// forgets them (the log lines keep them). Also each telegram's request
/// fields as its layout masks them for the log, so the console can show
/// whose transfer an unknown one is without a full account number.
///
/// Two rings of the latest telegrams, not maps by GUID: a telegram writes
/// one slot of each (no hashing, no allocation, the lock held for a copy),
/// and only the console, asking about a GUID, scans them (a few
/// milliseconds for the 200 rows of its list of unknown transfers). Maps by
/// GUID (hashed keys, an order to evict by, an allocation per new GUID)
/// cost 3-5% more of the hub's CPU per telegram (docs/performance.md).
#[derive(Default)]
pub struct Traces {
    telegrams: Mutex<Ring<Traced>>,
    fields: Mutex<Ring<String>>,
}

/// The process-wide trace store.
pub fn traces() -> &'static Traces {
    static TRACES: OnceLock<Traces> = OnceLock::new();
    TRACES.get_or_init(Traces::default)
}

impl Traces {
    fn note(&self, guid: &str, code: Code, trace: TraceId) {
        let Some(key) = Key::new(guid) else { return };
        let t = Traced {
            at_ms: crate::journal::now_ms(),
            code,
            trace_id: trace,
        };
        lock(&self.telegrams).push(key, t);
    }

    /// Keeps the masked request fields of `guid`'s latest telegram, the
    /// text of a JSON object: read back only when the console asks.
    pub fn note_fields(&self, guid: &str, masked: String) {
        let Some(key) = Key::new(guid) else { return };
        // The text it replaces is freed after the lock is let go.
        let old = lock(&self.fields).push(key, masked);
        drop(old);
    }

    /// The masked request fields of `guid`, if a recent telegram of this
    /// process carried them.
    pub fn fields_of(&self, guid: &str) -> Option<serde_json::Value> {
        let key = Key::new(guid)?;
        // Parsed after the lock is let go: telegrams take it too.
        let text = lock(&self.fields)
            .newest_first()
            .find(|(k, _)| k.is(&key))
            .map(|(_, text)| text.clone());
        text.and_then(|t| serde_json::from_str(&t).ok())
    }

    /// The remembered telegrams of `guid` (its latest ones), oldest first.
    pub fn of(&self, guid: &str) -> Vec<Traced> {
        let Some(key) = Key::new(guid) else {
            return Vec::new();
        };
        let mut found: Vec<Traced> = lock(&self.telegrams)
            .newest_first()
            .filter(|(k, _)| k.is(&key))
            .take(TRACES_PER_GUID)
            .map(|(_, t)| t.clone())
            .collect();
        found.reverse();
        found
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A GUID as a ring keeps it: inline (a GUID is at most 64 bytes), with a
/// hash that a scan compares first.
#[derive(Clone, Copy)]
struct Key {
    hash: u64,
    len: u8,
    bytes: [u8; 64],
}

impl Key {
    /// `None` for text longer than any GUID (not remembered).
    fn new(guid: &str) -> Option<Key> {
        let len = guid.len();
        if len > 64 {
            return None;
        }
        let mut bytes = [0u8; 64];
        bytes[..len].copy_from_slice(guid.as_bytes());
        // FNV-1a: the scan's quick filter, not a map's hash (nothing to flood).
        let hash = guid.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        Some(Key {
            hash,
            len: len as u8,
            bytes,
        })
    }

    fn is(&self, other: &Key) -> bool {
        self.hash == other.hash
            && self.len == other.len
            && self.bytes[..usize::from(self.len)] == other.bytes[..usize::from(other.len)]
    }
}

/// The latest [`TRACED_TELEGRAMS`] entries, each under its GUID.
struct Ring<T> {
    slots: Vec<(Key, T)>,
    /// The slot the next entry overwrites, once the ring is full.
    next: usize,
}

impl<T> Default for Ring<T> {
    fn default() -> Ring<T> {
        Ring {
            slots: Vec::new(),
            next: 0,
        }
    }
}

impl<T> Ring<T> {
    /// Adds an entry; returns the one it replaces, if the ring was full.
    fn push(&mut self, key: Key, value: T) -> Option<T> {
        if self.slots.len() < TRACED_TELEGRAMS {
            self.slots.push((key, value));
            return None;
        }
        let old = std::mem::replace(&mut self.slots[self.next], (key, value));
        self.next = (self.next + 1) % TRACED_TELEGRAMS;
        Some(old.1)
    }

    /// The entries, the latest first.
    fn newest_first(&self) -> impl Iterator<Item = &(Key, T)> {
        // Once full, the slots before `next` are the latest written.
        let (newer, older) = self.slots.split_at(self.next);
        newer.iter().rev().chain(older.iter().rev())
    }
}

fn bucket(elapsed: Duration) -> usize {
    let ms = elapsed.as_millis() as u64;
    LATENCY_BOUNDS_MS
        .iter()
        .position(|&b| ms < b)
        .unwrap_or(LATENCY_BOUNDS_MS.len())
}

fn bump(counts: &mut Counts, tx: &str, code: &str) {
    let by_code = match counts.get_mut(tx) {
        Some(m) => m,
        None => counts.entry(tx.to_string()).or_default(),
    };
    match by_code.get_mut(code) {
        Some(n) => *n += 1,
        None => {
            by_code.insert(code.to_string(), 1);
        }
    }
}

fn percentile(latency: &[u64; BUCKETS], total: u64, p: f64) -> Option<u64> {
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * p).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in latency.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return LATENCY_BOUNDS_MS.get(i).copied();
        }
    }
    None
}

fn period(counts: &Counts, errors: Counts, latency: &[u64; BUCKETS], secs: f64) -> Period {
    let mut by_code = BTreeMap::new();
    let mut total = 0;
    for m in counts.values() {
        for (code, n) in m {
            *by_code.entry(code.clone()).or_insert(0) += n;
            total += n;
        }
    }
    let timed: u64 = latency.iter().sum();
    Period {
        total,
        per_second: if secs > 0.0 { total as f64 / secs } else { 0.0 },
        by_code,
        by_tx: counts.clone(),
        errors_by_target: errors,
        p50_ms: percentile(latency, timed, 0.50),
        p90_ms: percentile(latency, timed, 0.90),
        p99_ms: percentile(latency, timed, 0.99),
    }
}

impl Stats {
    fn new() -> Stats {
        Stats {
            started: Instant::now(),
            started_ms: crate::journal::now_ms(),
            inner: Mutex::new(Inner {
                ring: vec![Slot::default(); WINDOW_SECS as usize],
                totals: Counts::new(),
                latency: [0; BUCKETS],
            }),
        }
    }

    /// When the counters started (ms since the epoch).
    pub fn started_ms(&self) -> i64 {
        self.started_ms
    }

    fn second(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.started).as_secs()
    }

    /// The slot of `second`, emptied first if it holds an older lap's.
    fn slot(inner: &mut Inner, second: u64) -> &mut Slot {
        let slot = &mut inner.ring[(second % WINDOW_SECS) as usize];
        if slot.second != second {
            slot.second = second;
            slot.counts.values_mut().for_each(|m| m.clear());
            slot.errors_by_target.values_mut().for_each(|m| m.clear());
            slot.latency = [0; BUCKETS];
        }
        slot
    }

    /// Counts one answer of no target.
    fn record_at(&self, at: Instant, tx: &str, code: &str, elapsed: Option<Duration>) {
        self.record_answer(at, tx, code, elapsed, None);
    }

    /// Counts one answer; an E-code also under `error_of`, the target the
    /// telegram's route named, under the same lock.
    fn record_answer(
        &self,
        at: Instant,
        tx: &str,
        code: &str,
        elapsed: Option<Duration>,
        error_of: Option<&str>,
    ) {
        let second = self.second(at);
        let b = elapsed.map(bucket);
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let slot = Stats::slot(&mut g, second);
        bump(&mut slot.counts, tx, code);
        if let Some(target) = error_of {
            bump(&mut slot.errors_by_target, target, code);
        }
        if let Some(b) = b {
            slot.latency[b] += 1;
        }
        bump(&mut g.totals, tx, code);
        if let Some(b) = b {
            g.latency[b] += 1;
        }
    }

    /// The last minute (the current second included) and the totals since start.
    pub fn snapshot(&self) -> (Period, Period) {
        let now = Instant::now();
        let second = self.second(now);
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut counts = Counts::new();
        let mut errors = Counts::new();
        let mut latency = [0; BUCKETS];
        let add = |into: &mut Counts, from: &Counts| {
            for (key, m) in from {
                for (code, n) in m.iter().filter(|(_, n)| **n > 0) {
                    *into
                        .entry(key.clone())
                        .or_default()
                        .entry(code.clone())
                        .or_insert(0) += n;
                }
            }
        };
        for slot in &g.ring {
            if slot.second + WINDOW_SECS <= second || slot.second > second {
                continue;
            }
            add(&mut counts, &slot.counts);
            add(&mut errors, &slot.errors_by_target);
            for (acc, n) in latency.iter_mut().zip(slot.latency) {
                *acc += n;
            }
        }
        let up = now.saturating_duration_since(self.started).as_secs_f64();
        let minute = period(&counts, errors, &latency, up.clamp(1.0, WINDOW_SECS as f64));
        let all = period(&g.totals, Counts::new(), &g.latency, up.max(1.0));
        (minute, all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_fall_out_of_the_window_and_stay_in_the_totals() {
        let s = Stats::new();
        let t0 = s.started;
        s.record_at(t0, "TRF001", "0000", Some(Duration::from_millis(3)));
        s.record_at(t0, "TRF001", "E901", Some(Duration::from_millis(2500)));
        s.record_at(
            t0 + Duration::from_secs(70),
            "INQ001",
            "0000",
            Some(Duration::ZERO),
        );
        let g = s.inner.lock().unwrap();
        assert_eq!(g.totals["TRF001"]["0000"], 1);
        assert_eq!(g.totals["TRF001"]["E901"], 1);
        assert_eq!(g.totals["INQ001"]["0000"], 1);
        // Second 70 took the slot of second 10, not of second 0: both live.
        assert_eq!(g.ring[0].counts["TRF001"]["0000"], 1);
        assert_eq!(g.ring[10].counts["INQ001"]["0000"], 1);
    }

    /// E-codes are kept by the target the telegram's route named when it
    /// was answered, so a reload that routes its tx code elsewhere does not
    /// move them (found by a black-box probe: the console showed a failed
    /// core's errors under the core traffic had been moved to).
    #[test]
    fn errors_stay_with_the_target_that_answered_them() {
        let s = Stats::new();
        let t0 = s.started;
        s.record_answer(t0, "TRF001", "E902", None, Some("core"));
        s.record_answer(t0, "TRF001", "E902", None, Some("core"));
        s.record_answer(t0, "TRF001", "E901", None, Some("core2"));
        let (minute, all) = s.snapshot();
        assert_eq!(minute.errors_by_target["core"]["E902"], 2);
        assert_eq!(minute.errors_by_target["core2"]["E901"], 1);
        assert!(all.errors_by_target.is_empty());
        // Out of the window: gone.
        s.record_answer(
            t0 + Duration::from_secs(60),
            "TRF001",
            "E903",
            None,
            Some("core2"),
        );
        let g = s.inner.lock().unwrap();
        assert_eq!(g.ring[0].errors_by_target["core2"]["E903"], 1);
        assert!(!g.ring[0].errors_by_target["core"].contains_key("E902"));
        assert!(!g.ring[0].errors_by_target["core2"].contains_key("E901"));
    }

    /// An answer counted untimed (an unframeable input's E102) is in the
    /// code counts and the total, and leaves the latencies to the timed.
    #[test]
    fn an_untimed_answer_is_counted_but_not_timed() {
        let s = Stats::new();
        let t0 = s.started;
        s.record_at(t0, "TRF001", "0000", Some(Duration::from_millis(3)));
        s.record_at(t0, crate::metric_names::UNROUTED_TX, "E102", None);
        let (minute, all) = s.snapshot();
        for p in [&minute, &all] {
            assert_eq!(p.total, 2);
            assert_eq!(p.by_code["E102"], 1);
            assert_eq!(p.by_tx[crate::metric_names::UNROUTED_TX]["E102"], 1);
        }
        assert_eq!(s.inner.lock().unwrap().latency.iter().sum::<u64>(), 1);
    }

    #[test]
    fn a_reused_slot_forgets_its_old_lap() {
        let s = Stats::new();
        let t0 = s.started;
        s.record_at(t0, "TRF001", "0000", Some(Duration::ZERO));
        s.record_at(
            t0 + Duration::from_secs(60),
            "TRF001",
            "E904",
            Some(Duration::ZERO),
        );
        let g = s.inner.lock().unwrap();
        assert_eq!(g.ring[0].counts["TRF001"].get("0000"), None);
        assert_eq!(g.ring[0].counts["TRF001"]["E904"], 1);
    }

    #[test]
    fn traces_keep_the_latest_guids_and_telegrams() {
        let t = Traces::default();
        for i in 0..TRACED_TELEGRAMS + 1 {
            t.note(&format!("G{i}"), Code::OK, TraceId(i as u128 + 1));
        }
        assert!(t.of("G0").is_empty(), "the oldest GUID is forgotten");
        assert_eq!(t.of("G1").len(), 1);
        for i in 0..TRACES_PER_GUID + 2 {
            t.note("G1", Code::UNKNOWN, TraceId(1000 + i as u128));
        }
        let g1 = t.of("G1");
        assert_eq!(g1.len(), TRACES_PER_GUID);
        assert_eq!(
            g1.last().unwrap().trace_id,
            TraceId(1000 + TRACES_PER_GUID as u128 + 1)
        );
        let json = serde_json::to_value(g1.last().unwrap()).unwrap();
        assert_eq!(json["code"], "E901");
        assert_eq!(
            json["trace_id"],
            TraceId(1000 + TRACES_PER_GUID as u128 + 1).to_string()
        );
    }

    /// The latest fields of a GUID win, before and after the ring wraps;
    /// a GUID no telegram carried lately has none.
    #[test]
    fn fields_are_the_latest_telegrams_and_wrap_around() {
        let t = Traces::default();
        t.note_fields("A", r#"{"n":1}"#.into());
        t.note_fields("A", r#"{"n":2}"#.into());
        assert_eq!(t.fields_of("A"), Some(serde_json::json!({"n": 2})));
        for i in 0..TRACED_TELEGRAMS - 1 {
            t.note_fields(&format!("F{i}"), "{}".into());
        }
        // A's second telegram is the oldest kept; its first is gone.
        assert_eq!(t.fields_of("A"), Some(serde_json::json!({"n": 2})));
        t.note_fields("A", r#"{"n":3}"#.into());
        assert_eq!(t.fields_of("A"), Some(serde_json::json!({"n": 3})));
        for i in 0..TRACED_TELEGRAMS {
            t.note_fields(&format!("G{i}"), "{}".into());
        }
        assert_eq!(t.fields_of("A"), None);
        assert_eq!(t.fields_of("G0"), Some(serde_json::json!({})));
        assert_eq!(t.fields_of(&"x".repeat(65)), None);
    }

    #[test]
    fn percentiles_are_bucket_bounds() {
        let mut lat = [0u64; BUCKETS];
        lat[bucket(Duration::from_millis(3))] = 90; // < 5 ms
        lat[bucket(Duration::from_millis(2600))] = 10; // < 3000 ms
        assert_eq!(percentile(&lat, 100, 0.5), Some(5));
        assert_eq!(percentile(&lat, 100, 0.9), Some(5));
        assert_eq!(percentile(&lat, 100, 0.99), Some(3000));
        assert_eq!(percentile(&lat, 0, 0.5), None);
        lat[BUCKETS - 1] = 1000;
        assert_eq!(percentile(&lat, 1100, 0.99), None, "past the last bound");
    }
}
