//! One telegram's path through the hub: check, route, convert, journal, call,
//! map to a standard code, answer within the budget.
//!
//! The order of checks is the protocol's (section 3): header (E102), route
//! (E101), channel (E103), body (E102). Only then is anything journaled or sent.
//! Transfers go through the journal (section 8) so that at most one POST per GUID
//! may reach the core; inquiries are idempotent and retried when safe.
//!
//! # Layout
//!
//! * this file: the [`Hub`] (what every telegram shares), the checks before
//!   anything is journaled or sent, and the telegram's deadlines;
//! * `transfer`: a transfer telegram: single flight, the journal claim, the
//!   resend policy, the POST, the outcome;
//! * `inquiry`: an inquiry telegram;
//! * `core_inquiry`: the core's GET with safe retries, which an inquiry
//!   telegram, a resend after E901 and a settlement ask;
//! * `settle`: "don't know" turned into an answer: what a "never received"
//!   proves, inquiries after E901, late answers, reconcile;
//! * `flights`: single flight of a GUID inside this process;
//! * `bounded`: journal calls raced against the telegram's deadline;
//! * `reply`: replies, and the journal state and words an outcome leaves.
//!
//! What the summary line shows of the request fields is the layout's business
//! (`Layout::masked_request`): each field is masked as its layout declares.

mod bounded;
mod core_inquiry;
mod flights;
mod inquiry;
mod reply;
mod settle;
mod transfer;

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

pub use crate::layout::mask_account;
pub use reply::Reply;
pub use settle::{AttemptFacts, Verdict, judge_never_received};
pub use transfer::{fingerprint, transfer_body};

use crate::config::{JournalConfig, Operation};
use crate::core_client::Target;
use crate::header::{Echo, HEADER_LEN, HeaderError, parse_header};
use crate::journal::Journal;
use crate::outcome::Code;
use crate::rules::{ClientCert, Route, Rules};
use crate::telegram_log::{self, TelegramLog};

/// When a resend of a "not sent" GUID is allowed.
#[derive(Debug, Clone, Copy)]
pub struct ResendPolicy {
    pub max_resends: u32,
    pub cooldown: Duration,
}

impl From<&JournalConfig> for ResendPolicy {
    fn from(j: &JournalConfig) -> Self {
        ResendPolicy {
            max_resends: j.max_resends,
            cooldown: Duration::from_millis(j.resend_cooldown_ms),
        }
    }
}

/// A telegram's deadlines, all inside its budget so the answer leaves before
/// the budget ends (writing it takes a moment too).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    /// A telegram that has not started by then (it waited for room on its
    /// connection) is taken no further: a claim and a POST with less work
    /// time left could only end in E901 with the money moving (a
    /// black-box probe saw POSTs reach the core with 0-1 ms of work left).
    pub start: Instant,
    /// Calls to the core, waits and journal reads end here.
    pub work: Instant,
    /// The telegram's last journal write (its outcome) ends here; the answer
    /// goes out right after.
    pub reply: Instant,
}

impl Deadline {
    pub(crate) fn new(read_at: Instant, budget: Duration) -> Deadline {
        // Room for the outcome's journal write, then for the answer itself.
        let margin = (budget / 10).min(Duration::from_millis(50));
        Deadline {
            start: read_at + budget - margin * 2,
            work: read_at + budget - margin,
            reply: read_at + budget - margin / 2,
        }
    }
}

/// How long a draining hub waits for the journal's row of a transfer it
/// takes no further: well within the second the drain gives a connection
/// after its wait, so that the answer is not cut off by the close.
const DRAINING_READ: Duration = Duration::from_millis(250);

/// The rules in force, with their version: 1 at start, one more for each
/// reload that replaced them, and since when (ms since the epoch).
struct InForce {
    rules: Arc<Rules>,
    version: u64,
    since_ms: i64,
}

/// The hub: targets, journal, the current rules, and what is in flight.
pub struct Hub {
    rules: RwLock<InForce>,
    targets: Vec<Arc<Target>>,
    journal: Journal,
    budget: Duration,
    policy: ResendPolicy,
    flights: flights::Flights,
    late_calls: settle::LateCalls,
    draining: AtomicBool,
}

impl Hub {
    pub fn new(
        rules: Rules,
        targets: Vec<Arc<Target>>,
        journal: Journal,
        budget: Duration,
        policy: ResendPolicy,
    ) -> Hub {
        Hub {
            rules: RwLock::new(InForce {
                rules: Arc::new(rules),
                version: 1,
                since_ms: crate::journal::now_ms(),
            }),
            targets,
            journal,
            budget,
            policy,
            flights: flights::Flights::default(),
            late_calls: settle::LateCalls::default(),
            draining: AtomicBool::new(false),
        }
    }

    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// The latest a telegram read whole at `read_at` can start to be
    /// worked on ([`Deadline`]'s `start`): one that starts later is taken
    /// no further.
    pub fn last_start(&self, read_at: Instant) -> Instant {
        Deadline::new(read_at, self.budget).start
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn targets(&self) -> &[Arc<Target>] {
        &self.targets
    }

    fn target(&self, route: &Route) -> &Target {
        &self.targets[route.target]
    }

    /// The rules in force now.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .rules
            .clone()
    }

    /// The version of the rules in force (1 at start, one more per reload)
    /// and since when they are (ms since the epoch).
    pub fn rules_version(&self) -> (u64, i64) {
        let in_force = self.rules.read().unwrap_or_else(|p| p.into_inner());
        (in_force.version, in_force.since_ms)
    }

    /// Replaces the rules as one unit (SIGHUP reload).
    pub fn set_rules(&self, rules: Rules) {
        let mut in_force = self.rules.write().unwrap_or_else(|p| p.into_inner());
        in_force.rules = Arc::new(rules);
        in_force.version += 1;
        in_force.since_ms = crate::journal::now_ms();
    }

    /// Whether the rules in force route `tx_code` as an inquiry.
    pub fn is_inquiry(&self, tx_code: &str) -> bool {
        self.rules()
            .route(tx_code)
            .is_some_and(|r| r.operation == Operation::Inquiry)
    }

    /// A telegram of this tx code and GUID, read whole, waits for room to
    /// start: its GUID counts as handled by this hub until
    /// [`Hub::no_longer_waiting`] (when its task ends; an inquiry's at its
    /// start), so an inquiry's "never
    /// received" about it is not believed (its POST may follow the GET).
    /// Whatever its tx code: it starts under the rules in force then, and
    /// a reload meanwhile may make any tx code a transfer's (an E901
    /// instead of an E904 about a GUID that turns out not to be a transfer
    /// costs the channel a later inquiry; a transfer posted after its
    /// E904 costs a payment twice; found by a review and a black-box
    /// probe). A transfer counts through [`Hub::may_post`] and its flight
    /// from its start as well; an inquiry no longer counts once started
    /// (one whose own GUID is the one it asks about must not find itself
    /// handled). Whether it was counted.
    pub fn waiting_to_start(&self, tx_code: &str, guid: &str) -> bool {
        // Rows are read ahead for transfers only: the others rarely have one.
        let transfer = routes_transfer(&self.rules(), tx_code);
        if let Some(ahead) = self
            .flights
            .waiting
            .add(guid, self.reads_ahead() && transfer)
        {
            self.read_ahead(guid, ahead);
        }
        true
    }

    /// Whether a waiting transfer's row is read while it waits: with the
    /// SQLite journal. The memory journal answers in place when the row is
    /// wanted; PostgreSQL is shared, and another hub's claim, which this
    /// hub's flights do not see, could make a row read ahead stale.
    fn reads_ahead(&self) -> bool {
        matches!(self.journal, Journal::Sqlite(_))
    }

    /// Reads the GUID's row into `ahead`, in a task of its own, once the
    /// telegram has waited half the time to its last start: one that gets
    /// room before then (a channel that keeps a little more in flight than
    /// its connection takes, steady) costs a timer, not a journal read;
    /// thousands that wait out their budgets together are read as spread
    /// out as they were read. A read that fails leaves it unset, and the row
    /// is then read at the telegram's turn (counted, `stage="read_ahead"`,
    /// and said at DEBUG).
    fn read_ahead(&self, guid: &str, ahead: Arc<flights::ReadAhead>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let journal = self.journal.clone();
        let guid = guid.to_string();
        let now = Instant::now();
        let at = now + (self.last_start(now) - now) / 2;
        // Gone with the last of the GUID's waiting telegrams.
        let ahead = Arc::downgrade(&ahead);
        runtime.spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(ahead) = ahead.upgrade() else {
                return;
            };
            match journal.get(&guid).await {
                Ok(row) => {
                    let _ = ahead.row.set(row);
                }
                Err(e) => {
                    bounded::count_failure("read_ahead");
                    tracing::debug!(
                        guid,
                        %e,
                        "a waiting transfer's row could not be read ahead; it is read at its turn"
                    );
                }
            }
        });
    }

    /// What a telegram starting now is handled under: the rules in force and
    /// whether the hub drains, both looked at as it starts in its
    /// connection's order, not when its task first runs (see
    /// [`Hub::handle_started`]).
    pub fn at_start(&self) -> AtStart {
        AtStart {
            rules: self.rules(),
            draining: self.is_draining(),
        }
    }

    /// A telegram [`Hub::waiting_to_start`] counted has ended.
    pub fn no_longer_waiting(&self, guid: &str) {
        self.flights.waiting.remove(guid);
    }

    /// [`Hub::handles`], for the server's tests.
    #[cfg(test)]
    pub(crate) fn counts_as_handled(&self, guid: &str) -> bool {
        self.handles(guid)
    }

    /// Whether this hub handles a transfer of the GUID now: a telegram of it
    /// in flight or waiting to start, or a call of it past its budget.
    fn handles(&self, guid: &str) -> bool {
        self.posting(guid) || self.flights.waiting.contains(guid)
    }

    /// Whether this hub has a call of the GUID's transfer under way: a
    /// telegram of it in flight, or started and about to be (its task has
    /// not run yet), or a call past its budget.
    fn posting(&self, guid: &str) -> bool {
        self.flights.contains(guid)
            || self.flights.pending.contains(guid)
            || self.late_calls.running(guid)
    }

    /// A telegram starts while the hub is not draining, in a task that
    /// may run later than the tasks of telegrams started after it: when it
    /// is a transfer, its GUID counts as being posted until it joins its
    /// flight (or ends), so that a telegram of the same GUID taken no
    /// further meanwhile (by the drain, or a budget run out waiting for
    /// room) answers E901, not E903 (before, it could answer E903 and then
    /// this one was posted; found by a review), and an INQ001 read behind
    /// it does not take the core's "never received" for an answer (before,
    /// one pipelined right behind it could run first and answer E904; a
    /// black-box probe).
    pub fn may_post(self: &Arc<Self>, start: &AtStart, telegram: &[u8]) -> Option<Box<MayPost>> {
        let echo = Echo::from_telegram(telegram);
        routes_transfer(&start.rules, echo.tx_code_str()).then(|| {
            let guid = echo.guid_str().to_string();
            self.flights.pending.add(&guid, false);
            // Boxed: the telegram's future keeps it, and stays under
            // 1 KiB (see `server::handling`).
            Box::new(MayPost {
                hub: self.clone(),
                guid,
            })
        })
    }

    /// From now on, valid telegrams get E903 and their connection is closed.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Asks the core about every unknown transfer and journals what it says
    /// (`relayhub journal reconcile`). Returns each GUID with its code now.
    pub async fn reconcile(&self) -> Result<Vec<(String, Code)>, crate::journal::JournalError> {
        settle::reconcile(self).await
    }

    /// Answers one telegram (without its length prefix) read whole at `read_at`.
    /// Returns the echo for the response header and the reply.
    /// `cert` is the connection's verified client certificate, if any.
    pub async fn handle(
        &self,
        telegram: &[u8],
        peer: IpAddr,
        cert: Option<&ClientCert>,
        read_at: Instant,
    ) -> (Echo, Reply) {
        let start = self.at_start();
        self.handle_started(telegram, peer, cert, read_at, &start, &mut None)
            .await
    }

    /// [`Hub::handle`] for a telegram that started (in its connection's
    /// order) as `start` says: under those rules, while the hub was
    /// draining or not. Taken as its task first
    /// runs, a drain could refuse a transfer and let the one pipelined
    /// behind it be posted, whose task ran first (a black-box probe): a
    /// telegram started before the drain gets its real answer, as section
    /// 10 of docs/protocol.md has it, however late its task runs.
    pub async fn handle_started(
        &self,
        telegram: &[u8],
        peer: IpAddr,
        cert: Option<&ClientCert>,
        read_at: Instant,
        start: &AtStart,
        may_post: &mut Option<Box<MayPost>>,
    ) -> (Echo, Reply) {
        let deadline = Deadline::new(read_at, self.budget);
        // An IPv4 channel on an IPv6 listener by its IPv4 address, in the
        // log lines as in `allow_from`.
        let peer = peer.to_canonical();
        let echo = Echo::from_telegram(telegram);
        let trace = crate::core_client::TraceId::new();
        let log = TelegramLog::new(echo, peer, trace.text());
        let reply = log
            .scope(trace.scope(async {
                let (mut reply, note) = self
                    .dispatch(telegram, peer, cert, start, deadline, may_post)
                    .await;
                // While the hub drains, a telegram refused before the drain's
                // own E903 (E101, E102, E103) closes its connection too.
                if matches!(reply.code, Code::FORMAT | Code::NOT_ROUTED | Code::CHANNEL)
                    && start.draining
                {
                    reply.close = true;
                }
                let elapsed = read_at.elapsed();
                let route = start.rules.route(echo.tx_code_str());
                let (tx, meters) = start.rules.telegram_meters(route);
                meters.record(tx, reply.code, elapsed);
                let target = route.map(|r| self.target(r).name.as_str());
                crate::console_stats::record(
                    echo.guid_str(),
                    tx,
                    target,
                    reply.code,
                    elapsed,
                    trace,
                );
                // Inside the telegram's scope: the line carries its fields.
                // The note as text, not a format string: written as it is.
                let ms = elapsed.as_millis() as u64;
                info!(message = note.as_str(), code = %reply.code, ms);
                reply
            }))
            .await;
        (echo, reply)
    }

    async fn dispatch(
        &self,
        telegram: &[u8],
        peer: IpAddr,
        cert: Option<&ClientCert>,
        start: &AtStart,
        deadline: Deadline,
        may_post: &mut Option<Box<MayPost>>,
    ) -> (Reply, String) {
        let rules = &*start.rules;
        let header = match parse_header(telegram) {
            Ok(h) => h,
            Err(e) => return (Reply::code(Code::FORMAT), e.to_string()),
        };
        telegram_log::record_channel();
        let Some(route) = rules.route(header.tx_code) else {
            return (
                Reply::code(Code::NOT_ROUTED),
                HeaderError::new(
                    "tx_code",
                    crate::header::TX_CODE.start,
                    format!("{} has no route", header.tx_code),
                )
                .to_string(),
            );
        };
        if let Err(refusal) = rules.check_channel(header.channel_id, peer, cert, header.tx_code) {
            let at = crate::header::CHANNEL_ID.start;
            let note = HeaderError::new("channel_id", at, refusal.to_string());
            return (Reply::code(Code::CHANNEL), note.to_string());
        }
        let body = &telegram[HEADER_LEN..];
        let fields = match route.layout.decode_request(body, HEADER_LEN) {
            Ok(f) => f,
            Err(e) => return (Reply::code(Code::FORMAT), e.to_string()),
        };
        // Taken no further: the hub is draining (nothing new is sent, and
        // the connection is closed after the answer; the row is read for a
        // moment at most: the drain closes connections a second after its
        // wait ends), or the telegram's budget ran out before its turn (it
        // waited for room behind its connection's in-flight maximum: no
        // capacity within the budget, and no claim or call, which would only
        // turn it into E901; the row is read in the room the budget keeps for
        // the outcome's write, which this telegram will not make). An
        // inquiry gets E903; a transfer, what its GUID's row holds (E903 when
        // it was never sent; E901 from a journal that cannot say in time).
        let taken_no_further = if start.draining {
            let until = deadline.reply.min(Instant::now() + DRAINING_READ);
            Some(("hub is draining", until, true))
        } else if Instant::now() >= deadline.start {
            let why = "its budget ran out before its turn on its connection";
            Some((why, deadline.reply, false))
        } else {
            None
        };
        if let Some((why, until, close)) = taken_no_further {
            // Not this telegram's own call: what it sees being posted is
            // another telegram's.
            drop(may_post.take());
            let (mut reply, note) = match route.operation {
                Operation::Transfer => {
                    Box::pin(transfer::taken_no_further(self, &header, body, why, until)).await
                }
                Operation::Inquiry => (Reply::code(Code::NO_CAPACITY), format!("not sent: {why}")),
            };
            reply.close = close;
            return (reply, note);
        }
        // On the telegram's log fields, so the one summary line carries them (masked by the layout).
        // A JSON object: the JSON log format embeds it as one. Written once,
        // straight from the fields by serde_json's writer. The console shows
        // the same masked view of an unknown transfer.
        let masked = route.layout.masked_request(&fields);
        telegram_log::record_fields(&masked);
        crate::console_stats::traces().note_fields(header.guid, masked);
        // Boxed: the telegram's own future (boxed per telegram by the server)
        // stays under 1 KiB, within the allocator's per-thread cache, and so
        // does each of these (see `Transfer::lead`).
        match route.operation {
            Operation::Transfer => {
                Box::pin(transfer::run(
                    self, &header, route, rules, &fields, body, deadline, may_post,
                ))
                .await
            }
            Operation::Inquiry => {
                Box::pin(inquiry::run(self, route, rules, &fields, deadline)).await
            }
        }
    }
}

/// What the hub was as a telegram started ([`Hub::at_start`]): it is
/// handled under these rules and this drain, however late its task runs.
/// A reload between its start and its first run could otherwise make it a
/// transfer that was not counted as being posted at its start (a review).
pub struct AtStart {
    /// One version of the rules for the whole telegram, its metrics included.
    pub rules: Arc<Rules>,
    pub draining: bool,
}

/// Whether `rules` route `tx_code` as a transfer.
fn routes_transfer(rules: &Rules, tx_code: &str) -> bool {
    rules
        .route(tx_code)
        .is_some_and(|r| r.operation == Operation::Transfer)
}

/// A transfer started and not yet in its flight ([`Hub::may_post`]);
/// dropped once it has joined it, or when it is taken no further.
pub struct MayPost {
    hub: Arc<Hub>,
    guid: String,
}

impl Drop for MayPost {
    fn drop(&mut self) {
        self.hub.flights.pending.remove(&self.guid);
    }
}

/// The fixture on a port of its own, and a hub with a memory journal
/// calling it, built from the relay's own parts: for the relay's unit tests.
#[cfg(test)]
pub(crate) async fn core_and_hub() -> (corebank::CoreBank, Hub) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let core = corebank::start(listener, corebank::default_seed()).await;
    let hub = test_hub(core.url());
    (core, hub)
}

#[cfg(test)]
pub(crate) fn test_hub(core_url: String) -> Hub {
    test_hub_on(core_url, Journal::Memory(Default::default()))
}

/// A TRF001 telegram of `guid` for `amount`, between two seed accounts.
#[cfg(test)]
pub(crate) fn test_transfer(guid: &str, amount: u64) -> Vec<u8> {
    let fields = serde_json::json!({ "from_account": "1002003004001", "to_bank": "088",
        "to_account": "1002003004002", "amount": amount, "memo": "x" });
    crate::client::build_telegram(
        &crate::layout::builtin()["TRF001"],
        guid,
        "IBANK",
        "20261204120000",
        fields.as_object().unwrap(),
    )
    .unwrap()
}

/// Rules with these routes (tx code, operation), all to the target `core`,
/// each on the built-in layout of its operation (TRF001's, INQ001's).
#[cfg(test)]
pub(crate) fn test_rules(routes: &[(&str, Operation)]) -> Rules {
    let mut config = crate::config::Config::default();
    config.routes = routes
        .iter()
        .map(|&(tx_code, operation)| crate::config::RouteConfig {
            tx_code: tx_code.into(),
            operation,
            target: "core".into(),
            layout: Some(match operation {
                Operation::Transfer => "TRF001".into(),
                Operation::Inquiry => "INQ001".into(),
            }),
        })
        .collect();
    Rules::build(&config, &["core".to_string()]).expect("rules")
}

/// [`test_hub`] with the journal given.
#[cfg(test)]
pub(crate) fn test_hub_on(core_url: String, journal: Journal) -> Hub {
    let mut config = crate::config::Config::default();
    config.apply(&crate::config::Overrides {
        core_url: Some(core_url),
        budget_ms: Some(1500),
        ..Default::default()
    });
    let budget = Duration::from_millis(config.server.budget_ms);
    let target = Target::new(&config.targets[0], budget).expect("target");
    let names = [target.name.clone()];
    Hub::new(
        Rules::build(&config, &names).expect("rules"),
        vec![Arc::new(target)],
        journal,
        budget,
        ResendPolicy::from(&config.journal),
    )
}
