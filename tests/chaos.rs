//! The chaos run: many channels send own-bank transfers through a real
//! `relayhub serve` process (SQLite journal) while faults hit at random, and at
//! the end every GUID is checked against the fixture's ledger.
//!
//! Faults:
//! - per GUID, through the fixture's rules: delays around the budget before and
//!   after applying, 500/503 (with or without `Retry-After`), 502/504 after
//!   applying, `close` after applying, `truncate`, and faults on the inquiry;
//! - on the way to the core, through a proxy in the test: refused connects and
//!   connections dropped as soon as they open (idle pooled ones closed too);
//!   and a network that holds some POSTs 0.5-3 s before passing them on,
//!   delivered even when the hub was killed meanwhile;
//! - the hub itself: SIGKILL (and now and then SIGTERM) and a restart on the
//!   same journal file, mostly while held POSTs are on the wire; channels
//!   reconnect to wherever it listens again;
//! - beside the live hub: `relayhub journal reconcile` as a process of its own
//!   now and then, and the hub's own pruning every 200 ms with a retention of
//!   seconds (`[journal] retention_ms`);
//! - a bulkhead of 10 calls for 16 channels: a full one answers E903.
//!
//! Channels behave as the code table says: a new GUID after 0000, B2xx and E500;
//! the same GUID after E902/E903/E904 (after the cooldown when told E905) and
//! after a lost connection, until a final answer; a GUID refused E905 three
//! times after waiting the cooldown is given up (past the resend maximum).
//! After E901, half the channels resend the TRF001 itself (the hub answers by
//! inquiry); the other half send INQ001 for the GUID: 0000 (or a B-code) there
//! is the transfer's final answer, E904 means the TRF001 may be resent, E901
//! means ask again later. No channel sends a GUID longer than the resend
//! horizon after its first send, which the retention outlasts.
//!
//! Checked for every GUID: the core got at most one whole POST (two when the
//! first met a fixture fault that drops it unrecorded); 0000 (TRF001 or
//! INQ001) only if applied, and applied only if answered 0000; B2xx/E500 and
//! given-up GUIDs never applied; every 0000 for one GUID carries the same
//! `txn_id`; a final answer within the resend horizon; no E10x, no answer later
//! than the channel's own timeout. Then the ledger: total money unchanged and
//! each account's balance = seed + credits - debits of the 0000 answers. What
//! the reconcile tool prints is counted, never checked against: a refusal
//! beside a live hub is fine; a panic or a hang is a violation.
//!
//! Two hubs on one PostgreSQL journal (`chaos_two_hubs_on_one_postgres_journal`,
//! with `RELAYHUB_TEST_PG`; skipped without it, failed under `CI=true`): the same
//! run, faults and checks, with two `relayhub serve` processes (`hub_id` hub-a
//! and hub-b, a lease of budget + late window + 1 s) on one fresh schema. A
//! channel connects to either hub at random and, as behind a balancer, three
//! sends in ten go out on a new connection to either, so resends land on the
//! other hub; the hub stopped is either one, always by SIGKILL. On top of the
//! checks, the summary counts TRF001 resends by answer (outcome, E901, other,
//! and those that reached the other hub), the GUIDs in flight on a hub when it
//! was killed and the time from the kill to their outcome, and the takeovers in
//! the journal's history (notes of leases that ran out, fences, takeovers). A
//! hub that exits on its own fails the run with the end of its log.
//!
//! ```sh
//! cargo test --test chaos -- --nocapture                                  # CI: 3,000 transfers
//! CHAOS_TRANSFERS=20000 cargo test --release --test chaos -- --nocapture  # the long run
//! ./scripts/with-postgres.sh cargo test --test chaos two_hubs -- --nocapture   # CI: 1,000, two hubs
//! CHAOS_PG_TRANSFERS=6000 ./scripts/with-postgres.sh \
//!     cargo test --release --test chaos two_hubs -- --nocapture           # the long two-hub run
//! ```
//! `CHAOS_CHANNELS` (16) and `CHAOS_SEED` change the run; the summary prints the
//! seed and ends with one `chaos summary:` line of every figure. Timing makes no
//! two runs alike; the seed only fixes the dice. The runs of one binary go one
//! at a time.

mod chaos_support;
mod common;
mod pg_common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chaos_support::*;
use common::*;
use corebank::{CoreBank, FaultMethod, FaultRule, Phase};
use relayhub::client::Channel;
use relayhub::frame::PrefixMode;
use tokio::sync::watch;

const BUDGET_MS: u64 = 600;
const COOLDOWN_MS: u64 = 150;
const MAX_RESENDS: u32 = 5;
/// The channel waits longest: well past the hub's budget.
const CHANNEL_TIMEOUT: Duration = Duration::from_millis(BUDGET_MS * 3 + 2_000);
/// Calls to the core at once: fewer than the channels, so a held call now and
/// then leaves a telegram without a slot (E903, nothing sent).
const BULKHEAD: usize = 10;
/// Share of GUIDs that get a fault rule at the fixture, in percent.
const FAULT_PERCENT: u64 = 25;
/// The hub's own call goes on this long past the budget (a late answer is
/// journaled).
const LATE_WINDOW_MS: u64 = 1_000;
/// Share of POSTs the network holds, in percent, and for how long.
const HOLD_PERCENT: u64 = 5;
const HOLD_MIN_MS: u64 = 500;
const HOLD_MAX_MS: u64 = 3_000;
/// How old an attempt must be before the core's "never received" proves it
/// never arrived. An attempt's bytes leave the hub within the budget of its
/// claim (connect retries fit in the budget) and the network holds them at
/// most `HOLD_MAX_MS`: past budget + hold, nothing of it can still be on the
/// wire. The hub asks at least the late-answer window; late window + 3.5 s
/// covers both with room for a loaded machine.
const WIRE_GRACE_MS: u64 = LATE_WINDOW_MS + 3_500;
/// How long a channel keeps sending one GUID (TRF001 resends and INQ001s),
/// counted from its first send; a GUID without a final answer by then is a
/// violation. A GUID the core never received needs the wire grace to settle
/// (E904), and its resend can meet such a fault again: four graces fit.
const RESEND_HORIZON_MS: u64 = 20_000;
const RESEND_HORIZON: Duration = Duration::from_millis(RESEND_HORIZON_MS);
/// Rows not updated for this long are pruned, every `PRUNE_INTERVAL_MS`. A
/// row is never older than its GUID's first send, so a retention past the
/// resend horizon (plus a budget for the last send to be read) never prunes a
/// row whose GUID a channel may still send. A shorter one would be unsafe: a
/// resend of a pruned GUID is a new claim, so a new POST of a transfer the
/// core may have applied; an INQ001 about it is answered "never received".
const RETENTION_MS: u64 = RESEND_HORIZON_MS + 5_000;
const PRUNE_INTERVAL_MS: u64 = 200;
/// Two hubs: the share of sends that go out on a new connection to a hub
/// picked at random (behind a balancer, a resend may reach the other hub).
const SWITCH_PERCENT: u64 = 30;
/// Two hubs: each claim's lease on the shared journal, the least a hub accepts
/// (budget + late-answer window + 1 s). Until it ends, a resend of a dead
/// hub's GUID to the other hub finds the row `sending`.
const LEASE_MS: u64 = BUDGET_MS + LATE_WINDOW_MS + 1_000;
/// A reconcile run that takes longer than this hangs.
const RECONCILE_PATIENCE: Duration = Duration::from_secs(120);

const _: () = assert!(WIRE_GRACE_MS >= LATE_WINDOW_MS);
const _: () = assert!(WIRE_GRACE_MS > BUDGET_MS + HOLD_MAX_MS);
const _: () = assert!(RETENTION_MS > RESEND_HORIZON_MS + BUDGET_MS);

// ---- dice -----------------------------------------------------------------

/// xorshift64*: reproducible dice without a crate.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

// ---- faults -------------------------------------------------------------------

/// A fault rule put on one GUID at the fixture before its first send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    DelayBeforeApply(u64),
    DelayAfterApply(u64),
    Status500,
    Status503,
    Status503RetryAfter,
    Status502AfterApply,
    Status504AfterApply,
    CloseAfterApply,
    Truncate,
    /// The POST answer is lost (502 after applying), and the first inquiry
    /// fails too (502, retried by the hub).
    InquiryFails,
    /// The POST is held past the budget, and the first inquiry too.
    InquirySlow,
}

impl Fault {
    fn kind(&self) -> &'static str {
        match self {
            Fault::DelayBeforeApply(_) => "delay before apply",
            Fault::DelayAfterApply(_) => "delay after apply",
            Fault::Status500 => "500",
            Fault::Status503 => "503",
            Fault::Status503RetryAfter => "503 + Retry-After",
            Fault::Status502AfterApply => "502 after apply",
            Fault::Status504AfterApply => "504 after apply",
            Fault::CloseAfterApply => "close after apply",
            Fault::Truncate => "truncate",
            Fault::InquiryFails => "502 after apply + 502 on inquiry",
            Fault::InquirySlow => "delay + slow inquiry",
        }
    }

    /// The core answers the POST without taking it in: it keeps no record, so
    /// an inquiry says "never received" (the truth).
    fn drops(&self) -> bool {
        matches!(
            self,
            Fault::Status500 | Fault::Status503 | Fault::Status503RetryAfter
        )
    }

    fn roll(rng: &mut Rng) -> Option<Fault> {
        if !rng.percent(FAULT_PERCENT) {
            return None;
        }
        // Delays straddle the budget: some answer in time, some do not.
        let delay = rng.range(BUDGET_MS / 2, BUDGET_MS * 3 / 2);
        Some(match rng.range(0, 12) {
            0 | 1 => Fault::DelayBeforeApply(delay),
            2 | 3 => Fault::DelayAfterApply(delay),
            4 => Fault::Status500,
            5 => Fault::Status503,
            6 => Fault::Status503RetryAfter,
            7 => Fault::Status502AfterApply,
            8 => Fault::Status504AfterApply,
            9 => Fault::CloseAfterApply,
            10 => Fault::Truncate,
            11 => Fault::InquiryFails,
            _ => Fault::InquirySlow,
        })
    }

    fn install(&self, core: &CoreBank, guid: &str) {
        let post = || FaultRule::guid(guid).method(FaultMethod::Post).times(1);
        let get = || FaultRule::guid(guid).method(FaultMethod::Get).times(1);
        let rule = match *self {
            Fault::DelayBeforeApply(ms) => post().delay_ms(ms).phase(Phase::BeforeApply),
            Fault::DelayAfterApply(ms) => post().delay_ms(ms).phase(Phase::AfterApply),
            Fault::Status500 => post().status(500),
            Fault::Status503 => post().status(503),
            Fault::Status503RetryAfter => post().status(503).retry_after("1"),
            Fault::Status502AfterApply => post().status(502).phase(Phase::AfterApply),
            Fault::Status504AfterApply => post().status(504).phase(Phase::AfterApply),
            Fault::CloseAfterApply => post().close().phase(Phase::AfterApply),
            Fault::Truncate => post().truncate().phase(Phase::AfterApply),
            Fault::InquiryFails => {
                core.add_fault(get().status(502));
                post().status(502).phase(Phase::AfterApply)
            }
            Fault::InquirySlow => {
                core.add_fault(get().delay_ms(BUDGET_MS * 2));
                post().delay_ms(BUDGET_MS * 2).phase(Phase::BeforeApply)
            }
        };
        core.add_fault(rule);
    }
}

// ---- what a channel saw ---------------------------------------------------------

/// What a channel sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tx {
    /// The transfer itself (first send or resend).
    Trf,
    /// An inquiry about it.
    Inq,
}

impl Tx {
    fn code(self) -> &'static str {
        match self {
            Tx::Trf => "TRF001",
            Tx::Inq => "INQ001",
        }
    }
}

#[derive(Debug, Clone)]
enum Seen {
    /// An answer to a TRF001 or an INQ001 with this code, after this long.
    Code(Tx, String, Duration),
    /// The connection ended without an answer (hub killed or draining).
    Lost,
    /// No answer within the channel's own timeout.
    Timeout,
    /// The hub could not be reached (restarting).
    NoHub,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// 0000, B2xx or E500 (to the TRF001 or to an INQ001).
    Final(String),
    /// E905 after waiting the cooldown, three times: past the resend maximum.
    GaveUp,
    /// No final answer within the resend horizon.
    Unresolved,
    /// An answer no transfer should get (E10x, a wrong echo).
    Unexpected(String),
}

/// One send of a GUID and what came of it.
#[derive(Debug, Clone)]
struct Step {
    /// What was sent.
    tx: Tx,
    /// When it was sent and when it ended, in ms since the run started.
    sent_ms: u128,
    at_ms: u128,
    /// The hub it went to: (slot, generation); `None` when none was reached.
    hub: Option<(usize, u64)>,
    seen: Seen,
}

impl Step {
    /// The answer's code, if there was one.
    fn code(&self) -> Option<&str> {
        match &self.seen {
            Seen::Code(_, c, _) => Some(c.as_str()),
            _ => None,
        }
    }
}

/// A hub's name in reports: its slot as a letter and its generation.
fn hub_name(slot: usize, generation: u64) -> String {
    format!("hub-{}#{generation}", char::from(b'a' + slot as u8))
}

/// 0000, B2xx or E500: the transfer's outcome, not "don't know" or "not sent".
fn is_final(code: &str) -> bool {
    matches!(code, "0000" | "E500") || code.starts_with('B')
}

#[derive(Debug, Clone)]
struct Record {
    guid: String,
    from: &'static str,
    to: &'static str,
    amount: u64,
    fault: Option<Fault>,
    /// The channel sends INQ001 after E901 (else it resends the TRF001).
    inquires: bool,
    /// Every send, in order.
    seen: Vec<Step>,
    txn_ids: Vec<String>,
    end: End,
    /// From the first send to the last answer.
    took: Duration,
}

impl Record {
    fn codes(&self) -> impl Iterator<Item = (Tx, &str)> {
        self.seen.iter().filter_map(|s| match &s.seen {
            Seen::Code(tx, c, _) => Some((*tx, c.as_str())),
            _ => None,
        })
    }

    fn saw(&self, what: fn(&Seen) -> bool) -> bool {
        self.seen.iter().any(|s| what(&s.seen))
    }

    fn history(&self) -> String {
        let mut out = String::new();
        for s in &self.seen {
            let what = match &s.seen {
                Seen::Code(tx, c, d) => format!("{} {c} in {} ms", tx.code(), d.as_millis()),
                Seen::Lost => format!("{} sent, connection lost", s.tx.code()),
                Seen::Timeout => {
                    format!("{} sent, no answer within the channel timeout", s.tx.code())
                }
                Seen::NoHub => "hub unreachable".into(),
            };
            let hub = s.hub.map_or("no hub".into(), |(slot, g)| hub_name(slot, g));
            let _ = write!(
                out,
                "\n      t={}ms (sent t={}ms) {hub}: {what}",
                s.at_ms, s.sent_ms
            );
        }
        out
    }
}

// ---- the run --------------------------------------------------------------------

/// Where each hub listens now (`None` while it restarts), and its generation,
/// by slot.
type HubAddrs = watch::Receiver<Vec<(Option<SocketAddr>, u64)>>;
type HubAddrsTx = watch::Sender<Vec<(Option<SocketAddr>, u64)>>;

struct Run {
    core: CoreBank,
    hubs: HubAddrs,
    /// How many hubs take traffic (1: SQLite; 2: the shared PostgreSQL journal).
    hub_count: usize,
    issued: AtomicU64,
    transfers: u64,
    started: Instant,
    run_id: u64,
}

impl Run {
    /// The next transfer number, or `None` when all have been handed out.
    fn take(&self) -> Option<u64> {
        let n = self.issued.fetch_add(1, Ordering::SeqCst);
        (n < self.transfers).then_some(n)
    }

    fn now_ms(&self) -> u128 {
        self.started.elapsed().as_millis()
    }
}

/// A GUID of 32 characters: date, run, kind (`C` transfer, `Q` inquiry),
/// channel, sequence.
fn chaos_guid(run_id: u64, kind: char, channel: usize, n: u64) -> String {
    let date = chrono::Local::now().format("%Y%m%d");
    let g = format!(
        "{date}CH{:06}{kind}{channel:02}N{n:012}",
        run_id % 1_000_000
    );
    assert_eq!(g.len(), 32, "{g}");
    g
}

/// A channel's connection and the hub it reaches (slot, generation).
struct Conn {
    ch: Channel,
    slot: usize,
    generation: u64,
}

/// Connects to a hub that is up, picked at random as a balancer would, and
/// follows the hubs across restarts (bounded).
async fn connect_hub(run: &Run, rng: &mut Rng) -> Option<Conn> {
    let mut rx = run.hubs.clone();
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        let up: Vec<(usize, SocketAddr, u64)> = rx
            .borrow_and_update()
            .iter()
            .enumerate()
            .filter_map(|(slot, (addr, generation))| addr.map(|a| (slot, a, *generation)))
            .collect();
        if !up.is_empty() {
            let (slot, addr, generation) = if up.len() == 1 { up[0] } else { *rng.pick(&up) };
            if let Ok(Ok(ch)) = tokio::time::timeout(
                Duration::from_secs(2),
                Channel::connect(&addr.to_string(), PrefixMode::Ascii),
            )
            .await
            {
                return Some(Conn {
                    ch,
                    slot,
                    generation,
                });
            }
        }
        // Restarting: wait for a new address (no event when a connect fails
        // just before the driver says "down", hence the bound).
        let _ = tokio::time::timeout(Duration::from_millis(100), rx.changed()).await;
    }
    None
}

async fn channel_loop(run: Arc<Run>, index: usize, seed: u64) -> Vec<Record> {
    let mut rng = Rng::new(seed ^ (index as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F));
    // Half the channels ask INQ001 after E901; the others resend the TRF001.
    let inquires = index % 2 == 1;
    let mut inquiries = 0u64;
    let mut records = Vec::new();
    let mut conn: Option<Conn> = None;
    while let Some(n) = run.take() {
        let from = *rng.pick(&ACCOUNTS);
        let mut to = *rng.pick(&ACCOUNTS);
        while to == from {
            to = *rng.pick(&ACCOUNTS);
        }
        // Mostly small; now and then more than most balances (B201) or over the
        // per-transfer limit (B203).
        let amount = match rng.range(0, 99) {
            0..=89 => rng.range(1, 50_000),
            90..=97 => rng.range(500_000, 3_000_000),
            _ => LIMIT + rng.range(1, 1_000),
        };
        let guid = chaos_guid(run.run_id, 'C', index, n);
        let fault = Fault::roll(&mut rng);
        if let Some(f) = fault {
            f.install(&run.core, &guid);
        }
        let mut rec = Record {
            guid: guid.clone(),
            from,
            to,
            amount,
            fault,
            inquires,
            seen: Vec::new(),
            txn_ids: Vec::new(),
            end: End::Unresolved,
            took: Duration::ZERO,
        };
        let fields = trf_fields(from, BANK, to, amount, MEMO);
        let first = Instant::now();
        let mut refused_after_cooldown = 0;
        let mut ask = Tx::Trf;
        // Nothing of this GUID is sent past the horizon (the retention outlasts it).
        while first.elapsed() < RESEND_HORIZON {
            // Behind a balancer: now and then a send goes out on a new
            // connection, to either hub.
            if run.hub_count > 1 && conn.is_some() && rng.percent(SWITCH_PERCENT) {
                conn = None;
            }
            if conn.is_none() {
                conn = connect_hub(&run, &mut rng).await;
                if conn.is_none() {
                    let now = run.now_ms();
                    rec.seen.push(Step {
                        tx: ask,
                        sent_ms: now,
                        at_ms: now,
                        hub: None,
                        seen: Seen::NoHub,
                    });
                    continue;
                }
            }
            let Conn {
                ch,
                slot,
                generation,
            } = conn.as_mut().expect("connected");
            let hub = Some((*slot, *generation));
            let (telegram, echo) = match ask {
                Tx::Trf => (trf(&guid, &fields), guid.clone()),
                Tx::Inq => {
                    inquiries += 1;
                    let q = chaos_guid(run.run_id, 'Q', index, inquiries);
                    (inquiry(&q, &guid), q)
                }
            };
            let sent = Instant::now();
            let sent_ms = run.now_ms();
            let step = |seen| Step {
                tx: ask,
                sent_ms,
                at_ms: run.now_ms(),
                hub,
                seen,
            };
            let answer = match tokio::time::timeout(CHANNEL_TIMEOUT, ch.exchange(&telegram)).await {
                Err(_) => {
                    rec.seen.push(step(Seen::Timeout));
                    conn = None;
                    continue;
                }
                Ok(Err(_)) => {
                    rec.seen.push(step(Seen::Lost));
                    conn = None;
                    continue;
                }
                Ok(Ok(a)) => a,
            };
            let took = sent.elapsed();
            rec.took = first.elapsed();
            rec.seen
                .push(step(Seen::Code(ask, answer.code.clone(), took)));
            if answer.guid != echo || answer.tx_code != ask.code() {
                rec.end = End::Unexpected(format!("echo {answer:?}"));
                break;
            }
            match (ask, answer.code.as_str()) {
                // To the transfer or to an inquiry: money moved.
                (_, "0000") => {
                    let id = String::from_utf8_lossy(answer.body.get(..16).unwrap_or(&[]));
                    rec.txn_ids.push(id.trim_end().to_string());
                    rec.end = End::Final(answer.code);
                    break;
                }
                (_, "B201" | "B202" | "B203" | "E500") => {
                    rec.end = End::Final(answer.code);
                    break;
                }
                // Unknown: the resend is answered by inquiry, or the channel asks
                // itself. A short pause so a transfer still processing has a
                // moment to finish.
                (Tx::Trf, "E901") => {
                    refused_after_cooldown = 0;
                    if inquires {
                        ask = Tx::Inq;
                    }
                    tokio::time::sleep(Duration::from_millis(rng.range(10, 80))).await;
                }
                // Still unknown, or the inquiry was not sent: ask again later.
                (Tx::Inq, "E901" | "E902" | "E903") => {
                    if answer.code == "E903" {
                        conn = None;
                    }
                    tokio::time::sleep(Duration::from_millis(rng.range(10, 80))).await;
                }
                // The core never received it: the transfer may be resent.
                (Tx::Inq, "E904") => {
                    ask = Tx::Trf;
                    tokio::time::sleep(Duration::from_millis(rng.range(0, 50))).await;
                }
                // Not sent: resend at once; the hub enforces the cooldown (E905).
                (Tx::Trf, "E902" | "E904") => refused_after_cooldown = 0,
                (Tx::Trf, "E903") => {
                    // Draining or no capacity; a draining hub closes the connection.
                    refused_after_cooldown = 0;
                    conn = None;
                }
                (Tx::Trf, "E905") => {
                    refused_after_cooldown += 1;
                    if refused_after_cooldown >= 3 {
                        rec.end = End::GaveUp;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(COOLDOWN_MS + 30)).await;
                }
                (tx, other) => {
                    rec.end = End::Unexpected(format!("{} answered {other}", tx.code()));
                    break;
                }
            }
        }
        records.push(rec);
    }
    records
}

// ---- chaos driver: the proxy and the hub process -----------------------------

/// A SIGKILL of one hub.
#[derive(Debug, Clone, Copy)]
struct Kill {
    slot: usize,
    generation: u64,
    /// Just before the signal, in ms since the run started.
    at_ms: u128,
}

#[derive(Debug, Default)]
struct Events {
    /// (ms since the run started, what happened), for reading a violation.
    log: Vec<(u128, String)>,
    sigkill: u64,
    sigterm: u64,
    /// Every SIGKILL, in order.
    kills: Vec<Kill>,
    /// Stops (SIGKILL or SIGTERM) while the network held at least one POST.
    stops_while_held: u64,
    refuse_windows: u64,
    close_windows: u64,
    restarts_on_new_port: u64,
    /// Every hub generation's log (stderr), in order.
    logs: Vec<String>,
}

/// The last `n` lines of a log.
fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Fails the test when a hub has exited without being told to, with the end of
/// its log.
fn assert_alive(hub: &mut Proc, name: &str) {
    if let Some(status) = hub.exited() {
        panic!(
            "{name} died on its own ({status}); the end of its log:\n{}",
            tail(&hub.stderr(), 40)
        );
    }
}

/// Stops one hub (SIGKILL; with one hub, one time in five SIGTERM) and starts
/// it again, at random, and opens windows of refusals and dropped connections
/// at the proxy; checks on every tick that no hub died on its own.
#[allow(clippy::too_many_arguments)]
async fn driver(
    cmds: Vec<HubCommand>,
    hubs: Vec<Proc>,
    hub_tx: HubAddrsTx,
    proxy: Arc<Proxy>,
    stop: Arc<AtomicBool>,
    tools: Arc<std::sync::Mutex<()>>,
    seed: u64,
    started: Instant,
) -> (Vec<Proc>, Events) {
    let mut rng = Rng::new(seed ^ 0xD1B5_4A32_D192_ED03);
    let mut events = Events::default();
    let mut generations: Vec<u64> = hub_tx.borrow().iter().map(|h| h.1).collect();
    let mut hubs: Vec<Option<Proc>> = hubs.into_iter().map(Some).collect();
    let two = hubs.len() > 1;
    while !stop.load(Ordering::SeqCst) {
        // The schedule of faults is the subject here: pauses are the point.
        tokio::time::sleep(Duration::from_millis(rng.range(200, 800))).await;
        for (slot, hub) in hubs.iter_mut().enumerate() {
            assert_alive(
                hub.as_mut().expect("hub"),
                &hub_name(slot, generations[slot]),
            );
        }
        if stop.load(Ordering::SeqCst) {
            break;
        }
        match rng.range(0, 9) {
            0..=2 => {
                let slot = if two {
                    rng.range(0, hubs.len() as u64 - 1) as usize
                } else {
                    0
                };
                let term = !two && rng.percent(20);
                let hub = hubs[slot].take().expect("hub");
                let generation = generations[slot];
                let port = hub.addr.port();
                hub_tx.send_modify(|h| h[slot].0 = None);
                let held = proxy.holding();
                let (h, moved, log, killed_at) = tokio::task::spawn_blocking({
                    let cmd = cmds[slot].clone();
                    let tools = tools.clone();
                    move || {
                        let mut hub = hub;
                        let killed_at = started.elapsed().as_millis();
                        if term {
                            let status = hub.terminate();
                            assert!(status.success(), "drain exit: {status:?}\n{}", hub.stderr());
                        } else {
                            hub.sigkill();
                        }
                        let log = hub.stderr();
                        drop(hub);
                        let listen = format!("127.0.0.1:{port}");
                        let mut restarted = cmd.start(&listen);
                        // A SQLite journal serves one process at a time: a
                        // reconcile that took it while the hub was down makes
                        // the start fail. Wait for that run to end (the
                        // reconciler holds `tools` while one runs), start again
                        // before the next one can begin.
                        let _no_tool = match &restarted {
                            Err(e) if e.contains("held by another") => {
                                let g = tools.lock().unwrap_or_else(|p| p.into_inner());
                                restarted = cmd.start(&listen);
                                Some(g)
                            }
                            _ => None,
                        };
                        match restarted {
                            Ok(h) => (h, false, log, killed_at),
                            Err(_) => (
                                cmd.start("127.0.0.1:0").expect("hub restarts"),
                                true,
                                log,
                                killed_at,
                            ),
                        }
                    }
                })
                .await
                .expect("restart task");
                let addr = h.addr;
                hubs[slot] = Some(h);
                events.logs.push(log);
                generations[slot] += 1;
                hub_tx.send_modify(|h| h[slot] = (Some(addr), generations[slot]));
                events.log.push((
                    started.elapsed().as_millis(),
                    format!(
                        "{} {} (killed at t={killed_at}ms, {held} POSTs held), {} up",
                        hub_name(slot, generation),
                        if term { "SIGTERM" } else { "SIGKILL" },
                        hub_name(slot, generations[slot]),
                    ),
                ));
                if term {
                    events.sigterm += 1;
                } else {
                    events.sigkill += 1;
                    events.kills.push(Kill {
                        slot,
                        generation,
                        at_ms: killed_at,
                    });
                }
                events.stops_while_held += u64::from(held > 0);
                events.restarts_on_new_port += u64::from(moved);
            }
            3..=6 => {
                let from = started.elapsed().as_millis();
                proxy.set_mode(ProxyMode::Refuse);
                tokio::time::sleep(Duration::from_millis(rng.range(50, 300))).await;
                proxy.set_mode(ProxyMode::Forward);
                events.refuse_windows += 1;
                let to = started.elapsed().as_millis();
                events
                    .log
                    .push((from, format!("proxy refuses until t={to}ms")));
            }
            _ => {
                let from = started.elapsed().as_millis();
                proxy.set_mode(ProxyMode::CloseNew);
                tokio::time::sleep(Duration::from_millis(rng.range(50, 300))).await;
                proxy.set_mode(ProxyMode::Forward);
                events.close_windows += 1;
                let to = started.elapsed().as_millis();
                events
                    .log
                    .push((from, format!("proxy drops new connections until t={to}ms")));
            }
        }
    }
    proxy.set_mode(ProxyMode::Forward);
    (hubs.into_iter().map(|h| h.expect("hub")).collect(), events)
}

/// Prune passes that deleted rows, and the rows they deleted, from a hub's
/// JSON log.
fn prunes_in(log: &str) -> (u64, u64) {
    let (mut passes, mut rows) = (0, 0);
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let fields = &v["fields"];
        if fields["message"] == "journal rows past the retention pruned" {
            passes += 1;
            rows += fields["pruned"].as_u64().unwrap_or(0);
        }
    }
    (passes, rows)
}

// ---- the reconcile tool beside the live hub ------------------------------------

#[derive(Debug, Default)]
struct Reconciles {
    /// Runs that exited 0.
    ran: u64,
    /// Runs that refused cleanly: a hub holds the journal.
    refused: u64,
    /// Runs that failed otherwise (reported, not checked).
    failed: u64,
    /// The codes it printed for the GUIDs it asked about.
    printed: BTreeMap<String, u64>,
    first_refusal: Option<String>,
    first_failure: Option<String>,
    /// Panics and hangs: never fine.
    broken: Vec<String>,
}

/// `relayhub journal reconcile` on the hub's journal, with the hub's config,
/// as a process of its own: exit status, stdout, stderr; `Err` when it hung.
fn reconcile_once(cmd: &HubCommand) -> Result<(ExitStatus, String, String), String> {
    let (out, err) = (TempFile::new("out", ""), TempFile::new("err", ""));
    let child = Command::new(relayhub_bin())
        .args(["journal", "reconcile", "--journal"])
        .arg(&cmd.journal)
        .args(["--core-url", &cmd.core_url, "--config"])
        .arg(&cmd.config)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out.0).expect("stdout file"))
        .stderr(std::fs::File::create(&err.0).expect("stderr file"))
        .spawn()
        .expect("spawn relayhub journal reconcile");
    let pid = child.id();
    let read = |f: &TempFile| std::fs::read_to_string(&f.0).unwrap_or_default();
    match wait_exit_within(child, RECONCILE_PATIENCE) {
        Ok(status) => Ok((status, read(&out), read(&err))),
        Err(e) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            Err(format!(
                "no exit within {RECONCILE_PATIENCE:?} ({e}); stderr:\n{}",
                read(&err)
            ))
        }
    }
}

/// Whether a failed run's message says that a hub holds the journal (the
/// program's own name, "relayhub", does not count as saying "hub").
fn is_refusal(stderr: &str) -> bool {
    let s = stderr.to_lowercase().replace("relayhub", "");
    s.contains("hub")
        && [
            "holds", "held by", "in use", "running", "live", "lease", "owns", "owned by",
        ]
        .iter()
        .any(|w| s.contains(w))
}

/// `tools` is held while a reconcile process runs.
async fn reconciler(
    cmd: HubCommand,
    stop: Arc<AtomicBool>,
    tools: Arc<std::sync::Mutex<()>>,
    seed: u64,
) -> Reconciles {
    let mut rng = Rng::new(seed ^ 0x8CB9_2BA7_2F3D_8DD7);
    let mut out = Reconciles::default();
    while !stop.load(Ordering::SeqCst) {
        // Now and then, as an operator would.
        tokio::time::sleep(Duration::from_millis(rng.range(500, 2_500))).await;
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let run = tokio::task::spawn_blocking({
            let cmd = cmd.clone();
            let tools = tools.clone();
            move || {
                let _running = tools.lock().unwrap_or_else(|p| p.into_inner());
                reconcile_once(&cmd)
            }
        })
        .await
        .expect("reconcile task");
        let (status, stdout, stderr) = match run {
            Ok(r) => r,
            Err(hung) => {
                out.broken.push(format!("reconcile hung: {hung}"));
                continue;
            }
        };
        if status.success() {
            out.ran += 1;
            for line in stdout.lines() {
                if let Some(code) = line.split_whitespace().nth(1) {
                    *out.printed.entry(code.to_string()).or_default() += 1;
                }
            }
        } else if status.code().is_none_or(|c| c == 101) || stderr.contains("panicked") {
            out.broken
                .push(format!("reconcile crashed ({status}):\n{stderr}"));
        } else if is_refusal(&stderr) {
            out.refused += 1;
            out.first_refusal.get_or_insert(stderr.trim().to_string());
        } else {
            out.failed += 1;
            out.first_failure
                .get_or_insert(format!("{status}: {}", stderr.trim()));
        }
    }
    out
}

/// What `relayhub journal show` says of `guid` (for a violation's report).
fn journal_show(cmd: &HubCommand, guid: &str) -> String {
    let out = Command::new(relayhub_bin())
        .args(["journal", "--journal"])
        .arg(&cmd.journal)
        .args(["show", guid])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) => format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => format!("journal show: {e}"),
    }
}

/// Rows in the journal now (the hubs may be writing): the SQLite file, or the
/// shared PostgreSQL table when `pg` is its URL.
async fn journal_rows(cmd: &HubCommand, pg: Option<&str>) -> Option<u64> {
    if let Some(url) = pg {
        let c = pg_common::raw_client(url).await;
        return c
            .query_one("SELECT COUNT(*) FROM relayhub_journal", &[])
            .await
            .ok()
            .map(|r| r.get::<_, i64>(0) as u64);
    }
    let c = rusqlite::Connection::open_with_flags(
        &cmd.journal,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .ok()?;
    c.busy_timeout(PATIENCE).ok()?;
    c.query_row("SELECT COUNT(*) FROM journal", [], |r| r.get::<_, i64>(0))
        .ok()
        .map(|n| n as u64)
}

// ---- takeovers in the shared journal ------------------------------------------

/// One history entry of the shared journal: (GUID, at_ms, note).
type Note = (String, i64, String);

/// The history notes of the shared journal that tell of one hub settling or
/// taking over another's row (a lease that ran out, a fence, a takeover),
/// sampled all through the run: a pruned row takes its history with it.
async fn watch_takeovers(url: String, stop: Arc<AtomicBool>) -> BTreeSet<Note> {
    const TAKEOVER_NOTES: &str = "SELECT guid, at_ms, note FROM relayhub_journal_events \
         WHERE note ILIKE '%lease%' OR note ILIKE '%fenc%' OR note ILIKE '%take%over%' \
            OR note ILIKE '%took over%'";
    let client = pg_common::raw_client(&url).await;
    let mut seen = BTreeSet::new();
    loop {
        let last = stop.load(Ordering::SeqCst);
        if let Ok(rows) = client.query(TAKEOVER_NOTES, &[]).await {
            seen.extend(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))));
        }
        if last {
            return seen;
        }
        // A sampling interval, far below the retention (25 s): nothing waits on it.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A note's kind: its words without hub names (`hub-a#3fa2c1`).
fn note_kind(note: &str) -> String {
    note.split_whitespace()
        .filter(|w| !w.contains('#'))
        .collect::<Vec<_>>()
        .join(" ")
}

// ---- what several hubs add to the summary --------------------------------------

/// Answers by class: the transfer's outcome (0000, B2xx, E500), "don't know"
/// (E901), or not sent / refused (E902-E905).
#[derive(Debug, Default, Clone, Copy)]
struct Classes {
    real: u64,
    e901: u64,
    other: u64,
}

impl Classes {
    fn add(&mut self, code: &str) {
        if is_final(code) {
            self.real += 1;
        } else if code == "E901" {
            self.e901 += 1;
        } else {
            self.other += 1;
        }
    }

    fn total(&self) -> u64 {
        self.real + self.e901 + self.other
    }

    /// `key=N key_real=N key_e901=N key_other=N`.
    fn kv(&self, key: &str) -> String {
        format!(
            "{key}={} {key}_real={} {key}_e901={} {key}_other={}",
            self.total(),
            self.real,
            self.e901,
            self.other
        )
    }
}

#[derive(Debug, Default)]
struct Figures {
    /// Answers to TRF001 resends (every TRF001 of a GUID after its first).
    resends: Classes,
    /// Of them, the resends that went to another hub than the GUID's send before.
    cross_resends: Classes,
    /// GUIDs in flight on a hub when it was SIGKILLed (sent, no answer yet).
    in_flight: u64,
    /// Of them, those the core got a whole POST of.
    in_flight_posted: u64,
    /// Their TRF001 resends and INQ001s after the kill, until the outcome.
    after_kill_resends: Classes,
    after_kill_inquiries: Classes,
    /// From the kill to the first answer with the outcome, per such GUID.
    kill_to_outcome: Vec<Duration>,
    /// Those with no outcome after the kill (given up, or a violation).
    no_outcome: u64,
    /// Of the GUIDs in flight, those whose first TRF001 was lost in the kill:
    /// the killed hub had claimed the row, which it left `sending`.
    first_send: u64,
    /// Their answers after the kill that were E901 (TRF001 and INQ001).
    first_send_e901: u64,
    /// Their time from the kill to the outcome.
    first_send_to_outcome: Vec<Duration>,
}

/// `posted(guid)`: whether the core got a whole POST of the GUID.
fn figures(records: &[Record], kills: &[Kill], posted: &dyn Fn(&str) -> bool) -> Figures {
    let mut f = Figures::default();
    for r in records {
        let mut trf_sends = 0;
        let mut previous: Option<usize> = None;
        for s in &r.seen {
            let Some((slot, _)) = s.hub else { continue };
            if s.tx == Tx::Trf {
                trf_sends += 1;
                if trf_sends > 1
                    && let Some(c) = s.code()
                {
                    f.resends.add(c);
                    if previous.is_some_and(|p| p != slot) {
                        f.cross_resends.add(c);
                    }
                }
            }
            previous = Some(slot);
        }
        for k in kills {
            let Some(i) = r.seen.iter().position(|s| {
                s.hub == Some((k.slot, k.generation))
                    && s.sent_ms <= k.at_ms
                    && matches!(s.seen, Seen::Lost | Seen::Timeout)
            }) else {
                continue;
            };
            f.in_flight += 1;
            f.in_flight_posted += u64::from(posted(&r.guid));
            let first = r.seen[i].tx == Tx::Trf && r.seen[..i].iter().all(|s| s.hub.is_none());
            f.first_send += u64::from(first);
            let mut outcome = false;
            for s in &r.seen[i + 1..] {
                let Some(c) = s.code() else { continue };
                match s.tx {
                    Tx::Trf => f.after_kill_resends.add(c),
                    Tx::Inq => f.after_kill_inquiries.add(c),
                }
                f.first_send_e901 += u64::from(first && c == "E901");
                if is_final(c) {
                    let ms = s.at_ms.saturating_sub(k.at_ms);
                    let took = Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX));
                    f.kill_to_outcome.push(took);
                    if first {
                        f.first_send_to_outcome.push(took);
                    }
                    outcome = true;
                    break;
                }
            }
            f.no_outcome += u64::from(!outcome);
        }
    }
    f.kill_to_outcome.sort();
    f.first_send_to_outcome.sort();
    f
}

// ---- the test -----------------------------------------------------------------

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `CHAOS_CHANNELS` and `CHAOS_SEED`, else 16 channels and a seed from the clock.
fn channels_and_seed() -> (usize, u64) {
    let channels = env_u64("CHAOS_CHANNELS", 16) as usize;
    let seed = env_u64(
        "CHAOS_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    );
    (channels, seed)
}

/// One run at a time: each loads both cores of a small machine, and the
/// answer times it checks assume that.
static ONE_RUN_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_every_guid_at_most_once_and_the_ledger_adds_up() {
    let _turn = ONE_RUN_AT_A_TIME.lock().await;
    let (channels, seed) = channels_and_seed();
    chaos(env_u64("CHAOS_TRANSFERS", 3_000), channels, seed, None).await;
}

/// The same run through two hubs on one PostgreSQL journal: channels reach
/// either (a resend may land on the other), and either is SIGKILLed at random.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_two_hubs_on_one_postgres_journal() {
    let Some(base) = pg_common::test_db() else {
        return;
    };
    let _turn = ONE_RUN_AT_A_TIME.lock().await;
    let url = pg_common::fresh_schema(&base, "chaos").await;
    let (channels, seed) = channels_and_seed();
    chaos(
        env_u64("CHAOS_PG_TRANSFERS", 1_000),
        channels,
        seed,
        Some(url),
    )
    .await;
}

/// The run: one hub on a SQLite journal, or (with `pg`, a PostgreSQL URL whose
/// schema is the run's own) two hubs sharing it.
async fn chaos(transfers: u64, channels: usize, seed: u64, pg: Option<String>) {
    let core = start_core().await;
    let before = Ledger::of(&core);
    let proxy = Arc::new(Proxy::start(core.addr()).await);
    proxy.set_hold(Some(Hold {
        percent: HOLD_PERCENT,
        min: Duration::from_millis(HOLD_MIN_MS),
        max: Duration::from_millis(HOLD_MAX_MS),
        seed,
    }));
    let dir = TempDir::new("chaos");
    // JSON logs at info for the daemon only: its prune lines are counted.
    let base = HubCommand::new(
        &dir,
        &proxy.url(),
        &format!(
            "[server]\nbudget_ms = {BUDGET_MS}\n\
             [journal]\nresend_cooldown_ms = {COOLDOWN_MS}\nmax_resends = {MAX_RESENDS}\n\
             retention_ms = {RETENTION_MS}\nprune_interval_ms = {PRUNE_INTERVAL_MS}\n\
             [logging]\nformat = \"json\"\nfilter = \"warn,relayhub::daemon=info\"\n\
             [[target]]\nname = \"core\"\nmax_concurrency = {BULKHEAD}\nqueue_wait_ms = 50\n\
             late_answer_window_ms = {LATE_WINDOW_MS}\nwire_grace_ms = {WIRE_GRACE_MS}\n"
        ),
    )
    // The admin endpoints, for a reconcile that asks the live hub.
    .args(&["--admin-listen", "127.0.0.1:0"]);
    // The hubs' commands, and the one the journal tools run with.
    let (cmds, cmd) = match &pg {
        None => (vec![base.clone()], base.clone()),
        Some(url) => {
            let named = |id: &str| {
                let mut c = base.clone();
                c.journal = PathBuf::from(pg_common::with_params(
                    url,
                    &format!("hub_id={id}&lease_ms={LEASE_MS}"),
                ));
                c
            };
            (vec![named("hub-a"), named("hub-b")], named("tools"))
        }
    };
    let hubs: Vec<Proc> = cmds
        .iter()
        .map(|c| c.start("127.0.0.1:0").expect("hub starts"))
        .collect();
    let (hub_tx, hub_rx) = watch::channel(
        hubs.iter()
            .map(|h| (Some(h.addr), 1u64))
            .collect::<Vec<_>>(),
    );
    let run = Arc::new(Run {
        core,
        hubs: hub_rx,
        hub_count: hubs.len(),
        issued: AtomicU64::new(0),
        transfers,
        started: Instant::now(),
        run_id: seed,
    });

    let stop = Arc::new(AtomicBool::new(false));
    // Held while a journal tool runs, so a hub's restart can wait for it.
    let tools = Arc::new(std::sync::Mutex::new(()));
    let chaos = tokio::spawn(driver(
        cmds.clone(),
        hubs,
        hub_tx,
        proxy.clone(),
        stop.clone(),
        tools.clone(),
        seed,
        run.started,
    ));
    let reconciling = tokio::spawn(reconciler(cmd.clone(), stop.clone(), tools, seed));
    let workers: Vec<_> = (0..channels)
        .map(|i| tokio::spawn(channel_loop(run.clone(), i, seed)))
        .collect();
    let takeovers = pg
        .clone()
        .map(|url| tokio::spawn(watch_takeovers(url, stop.clone())));
    // Chaos lasts while transfers are handed out; the last GUIDs settle in
    // calm. A driver that ended early found a hub dead: its panic fails the run.
    while run.issued.load(Ordering::SeqCst) < run.transfers && !chaos.is_finished() {
        // No event for "the counter passed N": poll with a coarse tick.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let (mut hubs, mut events) = chaos.await.expect("driver");
    let reconciles = reconciling.await.expect("reconciler");
    let mut records = Vec::new();
    for w in workers {
        records.extend(w.await.expect("channel task"));
    }
    let elapsed = run.started.elapsed();
    let core = &run.core;

    // POSTs the network still holds reach the core within the longest hold;
    // nothing signals the last one: poll the proxy's gauge, bounded.
    let held_until = Instant::now() + Duration::from_millis(HOLD_MAX_MS) + PATIENCE;
    while proxy.holding() > 0 && Instant::now() < held_until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Transfers still held by a delay finish at the core whatever the hub does
    // ("slow but thorough"); wait for the ones that were received to be decided.
    let stats = core.stats();
    for r in &records {
        let posted = stats.by_guid.get(&r.guid).is_some_and(|g| g.post > 0);
        if posted && !r.fault.is_some_and(|f| f.drops()) && r.end != End::Final("0000".into()) {
            let _ = tokio::time::timeout(Duration::from_secs(5), core.wait_applied(&r.guid)).await;
        }
    }
    let stats = core.stats();
    let rows_left = journal_rows(&cmd, pg.as_deref()).await;
    let takeovers = match takeovers {
        Some(t) => t.await.expect("takeover watch"),
        None => BTreeSet::new(),
    };
    for (slot, hub) in hubs.iter_mut().enumerate() {
        // Still up at the end: a hub that died on its own fails the run.
        assert_alive(hub, &hub_name(slot, run.hubs.borrow()[slot].1));
        events.logs.push(hub.stderr());
    }
    let (prune_passes, pruned_rows) = events
        .logs
        .iter()
        .map(|l| prunes_in(l))
        .fold((0, 0), |(p, r), (a, b)| (p + a, r + b));

    // ---- the checks ----
    let mut violations: Vec<(String, String)> = Vec::new();
    let mut cut_short = 0u64;
    let mut violate = |r: &Record, what: String| {
        let g = stats.by_guid.get(&r.guid).copied().unwrap_or_default();
        let holds: Vec<u128> = proxy
            .holds_of(&r.guid)
            .iter()
            .map(|d| d.as_millis())
            .collect();
        violations.push((
            r.guid.clone(),
            format!(
                "{}: {what}\n    transfer {} -> {} of {}, fault {:?}, {}, end {:?}, core post={} (whole {}, held ms {holds:?}) get={} applied={}{}",
                r.guid,
                r.from,
                r.to,
                r.amount,
                r.fault,
                if r.inquires { "asks INQ001 after E901" } else { "resends TRF001 after E901" },
                r.end,
                g.post,
                proxy.whole_posts(&r.guid),
                g.get,
                g.applied,
                r.history()
            ),
        ));
    };
    // Signed: the records are not in the order the core applied them.
    let mut want: BTreeMap<&str, i128> = before
        .balances
        .iter()
        .map(|(a, b)| (*a, i128::from(*b)))
        .collect();
    for r in &records {
        let g = stats.by_guid.get(&r.guid).copied().unwrap_or_default();
        let whole = proxy.whole_posts(&r.guid);
        // The first POST of a GUID whose fault drops it left no record at the
        // core, so "never received" was the truth and a second POST is allowed.
        let allowed = if r.fault.is_some_and(|f| f.drops()) {
            2
        } else {
            1
        };
        if whole > allowed {
            violate(r, format!("the core got {whole} whole POSTs for one GUID"));
        }
        cut_short += g.post.saturating_sub(whole);
        let answered_ok = r.end == End::Final("0000".into());
        if answered_ok && whole == 0 {
            violate(
                r,
                "applied, yet no whole POST went through the proxy".into(),
            );
        }
        if answered_ok && !g.applied {
            violate(r, "answered 0000 but the core did not apply it".into());
        }
        if g.applied && !answered_ok {
            violate(
                r,
                "the core applied it but the channel's last word is not 0000".into(),
            );
        }
        if r.codes().any(|(_, c)| c == "0000") && !answered_ok {
            violate(r, "a 0000 followed by another answer".into());
        }
        if let Some(first) = r.txn_ids.first()
            && r.txn_ids.iter().any(|t| t != first)
        {
            violate(
                r,
                format!("different txn_ids for one GUID: {:?}", r.txn_ids),
            );
        }
        match &r.end {
            End::Unresolved => violate(r, "no final answer within the resend horizon".into()),
            End::Unexpected(what) => violate(r, format!("unexpected answer: {what}")),
            _ => {}
        }
        if r.saw(|s| matches!(s, Seen::Timeout)) {
            violate(
                r,
                "the hub did not answer within the channel's timeout".into(),
            );
        }
        if answered_ok {
            *want.get_mut(r.from).expect("seed account") -= i128::from(r.amount);
            *want.get_mut(r.to).expect("seed account") += i128::from(r.amount);
        }
    }
    let after = Ledger::of(core);
    let mut ledger_problems = Vec::new();
    if after.total != before.total {
        ledger_problems.push(format!(
            "total money {} before, {} after",
            before.total, after.total
        ));
    }
    let now: BTreeMap<&str, i128> = after
        .balances
        .iter()
        .map(|(a, b)| (*a, i128::from(*b)))
        .collect();
    if now != want {
        ledger_problems.push(format!(
            "balances {:?}, expected from the 0000 answers {:?}",
            after.balances, want
        ));
    }

    // ---- the summary ----
    let mut faults: BTreeMap<&str, u64> = BTreeMap::new();
    let mut answers: BTreeMap<String, u64> = BTreeMap::new();
    let mut inq_answers: BTreeMap<String, u64> = BTreeMap::new();
    let mut finals: BTreeMap<String, u64> = BTreeMap::new();
    let mut resolutions: BTreeMap<String, u64> = BTreeMap::new();
    let (mut lost, mut no_hub, mut latencies) = (0u64, 0u64, Vec::new());
    let mut settle_times: Vec<Duration> = Vec::new();
    let mut held_guids = 0u64;
    // Answers measured by the channel (from its send) past the budget plus a
    // margin for the channel's own side; reported, not failed on: a channel
    // times out at CHANNEL_TIMEOUT, and that is a violation above.
    let late_after = Duration::from_millis(BUDGET_MS + 150);
    let mut late: Vec<(Duration, &str, &str)> = Vec::new();
    for r in &records {
        *faults
            .entry(r.fault.map_or("none", |f| f.kind()))
            .or_default() += 1;
        for step in &r.seen {
            match &step.seen {
                Seen::Code(tx, c, d) => {
                    let counts = match tx {
                        Tx::Trf => &mut answers,
                        Tx::Inq => &mut inq_answers,
                    };
                    *counts.entry(c.clone()).or_default() += 1;
                    latencies.push(*d);
                    if *d > late_after {
                        late.push((*d, r.guid.as_str(), c.as_str()));
                    }
                }
                Seen::Lost => lost += 1,
                Seen::NoHub => no_hub += 1,
                Seen::Timeout => {}
            }
        }
        let end = match &r.end {
            End::Final(c) => c.clone(),
            other => format!("{other:?}"),
        };
        *finals.entry(end.clone()).or_default() += 1;
        if matches!(r.end, End::Final(_)) && r.codes().count() > 1 {
            settle_times.push(r.took);
        }
        if r.codes().any(|(_, c)| c == "E901") {
            let how = match r.codes().last() {
                Some((Tx::Inq, _)) => "by INQ001",
                _ => "by TRF001",
            };
            *resolutions
                .entry(format!("E901 -> {end} {how}"))
                .or_default() += 1;
        }
        if r.saw(|s| matches!(s, Seen::Lost)) {
            *resolutions
                .entry(format!("lost connection -> {end}"))
                .or_default() += 1;
        }
        held_guids += u64::from(!proxy.holds_of(&r.guid).is_empty());
    }
    latencies.sort();
    settle_times.sort();
    let pct = |v: &[Duration], p: usize| {
        v.get((v.len().saturating_sub(1)) * p / 100)
            .map_or(0, |d| d.as_millis())
    };
    let mut summary = String::new();
    let _ = writeln!(
        summary,
        "chaos: {} transfers on {channels} channels in {:.1} s through {} (seed {seed}, budget {BUDGET_MS} ms)",
        records.len(),
        elapsed.as_secs_f64(),
        if pg.is_some() {
            format!("2 hubs on one PostgreSQL journal (lease {LEASE_MS} ms)")
        } else {
            "1 hub on a SQLite journal".to_string()
        }
    );
    let _ = writeln!(
        summary,
        "  hub: {} SIGKILL + {} SIGTERM restarts ({} while POSTs were held, {} on a new port); proxy: {} refusal windows, {} drop windows ({} connections dropped, {} idle closed)",
        events.sigkill,
        events.sigterm,
        events.stops_while_held,
        events.restarts_on_new_port,
        events.refuse_windows,
        events.close_windows,
        proxy.dropped(),
        proxy.reaped()
    );
    let _ = writeln!(
        summary,
        "  network: {} POSTs held {HOLD_MIN_MS}-{HOLD_MAX_MS} ms ({held_guids} GUIDs); wire grace {WIRE_GRACE_MS} ms, late-answer window {LATE_WINDOW_MS} ms",
        proxy.held()
    );
    let _ = writeln!(
        summary,
        "  beside the hub: reconcile {} ran ({:?} printed), {} refused, {} failed{}{}; prune every {PRUNE_INTERVAL_MS} ms, retention {RETENTION_MS} ms: {prune_passes} passes pruned {pruned_rows} rows, {} rows left",
        reconciles.ran,
        reconciles.printed,
        reconciles.refused,
        reconciles.failed,
        reconciles
            .first_refusal
            .as_ref()
            .map(|m| format!(" (refusal: {m:?})"))
            .unwrap_or_default(),
        reconciles
            .first_failure
            .as_ref()
            .map(|m| format!(" (first failure: {m:?})"))
            .unwrap_or_default(),
        rows_left.map_or("?".into(), |n| n.to_string())
    );
    let _ = writeln!(summary, "  faults per GUID: {faults:?}");
    let _ = writeln!(
        summary,
        "  TRF001 answers: {answers:?}; INQ001 answers: {inq_answers:?}; lost connections {lost}; hub unreachable {no_hub}"
    );
    let _ = writeln!(
        summary,
        "  answer time ms: p50 {} p99 {} max {}; GUIDs settled after more than one send: {} in p50 {} p99 {} max {} ms (horizon {RESEND_HORIZON_MS} ms)",
        pct(&latencies, 50),
        pct(&latencies, 99),
        pct(&latencies, 100),
        settle_times.len(),
        pct(&settle_times, 50),
        pct(&settle_times, 99),
        pct(&settle_times, 100)
    );
    late.sort();
    let _ = writeln!(
        summary,
        "  answers later than {} ms after the send: {}{}",
        late_after.as_millis(),
        late.len(),
        late.last()
            .map(|(d, g, c)| format!(" (worst {} ms, {c} for {g})", d.as_millis()))
            .unwrap_or_default()
    );
    let _ = writeln!(summary, "  final: {finals:?}");
    let _ = writeln!(summary, "  resolutions: {resolutions:?}");
    let _ = writeln!(
        summary,
        "  core: {} POSTs ({cut_short} cut short by a SIGKILL, read by the core as malformed), {} GETs, {} GUIDs applied; total money {} -> {}",
        stats.post,
        stats.get,
        stats.by_guid.values().filter(|g| g.applied).count(),
        before.total,
        after.total
    );
    let f = figures(&records, &events.kills, &|g| proxy.whole_posts(g) > 0);
    let mut takeover_kinds: BTreeMap<String, u64> = BTreeMap::new();
    for (_, _, note) in &takeovers {
        *takeover_kinds.entry(note_kind(note)).or_default() += 1;
    }
    let kills_per_hub: Vec<String> = (0..run.hub_count)
        .map(|slot| {
            let n = events.kills.iter().filter(|k| k.slot == slot).count();
            format!("{}={n}", hub_name(slot, 0).trim_end_matches("#0"))
        })
        .collect();
    let _ = writeln!(
        summary,
        "  SIGKILLs per hub: {}; TRF001 resends: {} ({} real outcome, {} E901, {} other), of them to the other hub: {} ({} real outcome, {} E901, {} other)",
        kills_per_hub.join(" "),
        f.resends.total(),
        f.resends.real,
        f.resends.e901,
        f.resends.other,
        f.cross_resends.total(),
        f.cross_resends.real,
        f.cross_resends.e901,
        f.cross_resends.other,
    );
    let _ = writeln!(
        summary,
        "  in flight on a killed hub: {} GUIDs ({} posted); after the kill their TRF001 resends got {} real outcome, {} E901, {} other, their INQ001s {} real outcome, {} E901, {} other; kill -> outcome ms p50 {} p90 {} p99 {} max {} ({} without one)",
        f.in_flight,
        f.in_flight_posted,
        f.after_kill_resends.real,
        f.after_kill_resends.e901,
        f.after_kill_resends.other,
        f.after_kill_inquiries.real,
        f.after_kill_inquiries.e901,
        f.after_kill_inquiries.other,
        pct(&f.kill_to_outcome, 50),
        pct(&f.kill_to_outcome, 90),
        pct(&f.kill_to_outcome, 99),
        pct(&f.kill_to_outcome, 100),
        f.no_outcome,
    );
    let _ = writeln!(
        summary,
        "  of them lost on their first send (the killed hub's row left `sending`): {}; answered E901 {} times after the kill; kill -> outcome ms p50 {} p90 {} p99 {} max {}",
        f.first_send,
        f.first_send_e901,
        pct(&f.first_send_to_outcome, 50),
        pct(&f.first_send_to_outcome, 90),
        pct(&f.first_send_to_outcome, 99),
        pct(&f.first_send_to_outcome, 100),
    );
    if pg.is_some() {
        let _ = writeln!(
            summary,
            "  takeovers in the shared journal's history: {} on {} GUIDs {takeover_kinds:?}",
            takeovers.len(),
            takeovers
                .iter()
                .map(|(g, _, _)| g)
                .collect::<BTreeSet<_>>()
                .len(),
        );
    }
    let _ = writeln!(
        summary,
        "  violations: {} per GUID, {} ledger, {} reconcile",
        violations.len(),
        ledger_problems.len(),
        reconciles.broken.len()
    );
    // Every figure on one line, to compare runs.
    let _ = writeln!(
        summary,
        "chaos summary: hubs={} journal={} transfers={} channels={channels} seconds={:.1} seed={seed} \
         budget_ms={BUDGET_MS} lease_ms={} sigkill={} {} sigterm={} violations={} ledger_problems={} \
         reconcile_broken={} {} {} in_flight_at_kill={} in_flight_posted={} {} {} \
         kill_to_outcome_ms_p50={} kill_to_outcome_ms_p90={} kill_to_outcome_ms_p99={} \
         kill_to_outcome_ms_max={} no_outcome_after_kill={} first_send_lost={} \
         first_send_lost_e901={} first_send_kill_to_outcome_ms_p50={} \
         first_send_kill_to_outcome_ms_max={} takeovers={} posts={} \
         answer_ms_p99={} answer_ms_max={} settle_ms_max={}",
        run.hub_count,
        if pg.is_some() { "postgres" } else { "sqlite" },
        records.len(),
        elapsed.as_secs_f64(),
        if pg.is_some() {
            LEASE_MS.to_string()
        } else {
            "-".into()
        },
        events.sigkill,
        kills_per_hub
            .iter()
            .map(|k| format!("sigkill_{k}"))
            .collect::<Vec<_>>()
            .join(" "),
        events.sigterm,
        violations.len(),
        ledger_problems.len(),
        reconciles.broken.len(),
        f.resends.kv("resends"),
        f.cross_resends.kv("cross_hub_resends"),
        f.in_flight,
        f.in_flight_posted,
        f.after_kill_resends.kv("after_kill_resends"),
        f.after_kill_inquiries.kv("after_kill_inquiries"),
        pct(&f.kill_to_outcome, 50),
        pct(&f.kill_to_outcome, 90),
        pct(&f.kill_to_outcome, 99),
        pct(&f.kill_to_outcome, 100),
        f.no_outcome,
        f.first_send,
        f.first_send_e901,
        pct(&f.first_send_to_outcome, 50),
        pct(&f.first_send_to_outcome, 100),
        if pg.is_some() {
            takeovers.len().to_string()
        } else {
            "-".into()
        },
        stats.post,
        pct(&latencies, 99),
        pct(&latencies, 100),
        pct(&settle_times, 100),
    );
    println!("{summary}");
    drop(hubs);

    let mut report = String::new();
    for (i, (guid, v)) in violations.iter().take(20).enumerate() {
        let _ = writeln!(report, "  {v}");
        if i < 5 {
            let _ = writeln!(report, "    journal:\n{}", journal_show(&cmd, guid));
        }
    }
    for l in &ledger_problems {
        let _ = writeln!(report, "  ledger: {l}");
    }
    for b in &reconciles.broken {
        let _ = writeln!(report, "  {b}");
    }
    if !report.is_empty() {
        let _ = writeln!(report, "chaos events:");
        for (ms, what) in &events.log {
            let _ = writeln!(report, "  t={ms}ms {what}");
        }
    }
    assert!(
        violations.is_empty() && ledger_problems.is_empty() && reconciles.broken.is_empty(),
        "{summary}\nviolations (first 20):\n{report}"
    );
}

#[test]
fn a_refusal_is_told_from_another_failure() {
    assert!(is_refusal(
        "relayhub: a live hub holds the journal /tmp/j.db; pass --admin ADDR to ask it"
    ));
    assert!(is_refusal(
        "Error: journal in use by a running hub (pid 42)"
    ));
    for other in [
        "relayhub: cannot open the journal: database is locked",
        "relayhub: unknown transfer(s): 3",
        "relayhub: target core: connection refused",
    ] {
        assert!(!is_refusal(other), "{other}");
    }
}

#[test]
fn the_figures_follow_a_guid_from_a_kill_to_its_outcome() {
    let step = |tx, sent_ms, at_ms, hub, seen| Step {
        tx,
        sent_ms,
        at_ms,
        hub,
        seen,
    };
    let code = |tx, c: &str| Seen::Code(tx, c.to_string(), Duration::from_millis(5));
    let record = |guid: &str, seen| Record {
        guid: guid.into(),
        from: ACCOUNTS[0],
        to: ACCOUNTS[1],
        amount: 1,
        fault: None,
        inquires: false,
        seen,
        txn_ids: Vec::new(),
        end: End::Final("0000".into()),
        took: Duration::ZERO,
    };
    let kill = Kill {
        slot: 0,
        generation: 1,
        at_ms: 1_000,
    };
    let records = [
        // In flight on hub-a#1 when it died: E901 from hub-b, then the outcome.
        record(
            "G1",
            vec![
                step(Tx::Trf, 900, 1_001, Some((0, 1)), Seen::Lost),
                step(Tx::Trf, 1_010, 1_600, Some((1, 1)), code(Tx::Trf, "E901")),
                step(Tx::Inq, 1_700, 1_710, Some((1, 1)), code(Tx::Inq, "E901")),
                step(Tx::Trf, 3_000, 3_500, Some((1, 1)), code(Tx::Trf, "0000")),
            ],
        ),
        // Sent to hub-a#1 after the kill: not in flight at it.
        record(
            "G2",
            vec![
                step(Tx::Trf, 1_005, 1_006, Some((0, 1)), Seen::Lost),
                step(Tx::Trf, 1_100, 1_200, Some((0, 2)), code(Tx::Trf, "B201")),
            ],
        ),
    ];
    let f = figures(&records, &[kill], &|g| g == "G1");
    assert_eq!((f.in_flight, f.in_flight_posted, f.no_outcome), (1, 1, 0));
    assert_eq!(f.kill_to_outcome, vec![Duration::from_millis(2_500)]);
    assert_eq!((f.first_send, f.first_send_e901), (1, 2));
    assert_eq!(f.first_send_to_outcome, f.kill_to_outcome);
    let (r, i) = (f.after_kill_resends, f.after_kill_inquiries);
    assert_eq!((r.real, r.e901, r.other, i.e901), (1, 1, 0, 1));
    // Resends: G1's second and third TRF001 (both on hub-b after hub-a), and
    // G2's second (hub-a again).
    assert_eq!(
        (f.resends.total(), f.resends.real, f.resends.e901),
        (3, 2, 1)
    );
    assert_eq!(f.cross_resends.total(), 1, "{f:?}");
    assert_eq!(
        note_kind("lease of hub hub-a#3fa2c1 expired while in flight"),
        "lease of hub expired while in flight"
    );
}

#[test]
fn a_hub_that_dies_on_its_own_fails_the_run_with_its_log() {
    let dir = TempDir::new("dies");
    let cmd = HubCommand::new(&dir, "http://127.0.0.1:9", "");
    let mut hub = cmd.start("127.0.0.1:0").expect("hub starts");
    assert_alive(&mut hub, "hub-a#1");
    // Killed behind the handle's back, as a crash would be.
    send_signal(hub.pid, "KILL");
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(s) = hub.exited() {
            break s;
        }
        assert!(Instant::now() < deadline, "the hub outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(!status.success());
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // The status was taken above: the handle still owns the child, so
        // `exited` reads it again.
        assert_alive(&mut hub, "hub-a#1")
    }));
    let message = *failed
        .expect_err("a dead hub fails the run")
        .downcast::<String>()
        .expect("a formatted panic message");
    assert!(
        message.contains("hub-a#1 died on its own") && message.contains("the end of its log"),
        "{message}"
    );
}
