//! The journal's life cycle as a state machine with every actor that touches
//! it, explored over random histories: the telegram path (claims, resends,
//! failover to a second URL), the core and a network that holds or drops
//! requests, late answers, inquiries (from a resend, an INQ001, the hub's
//! reconcile and the offline tool), crashes and start-up recovery, pruning.
//!
//! The hub's side is the real code where it decides: the memory journal's
//! claims, compare-and-sets, recovery and pruning, and
//! [`relayhub::relay::judge_never_received`], the one licence for a new POST of
//! a GUID that may have been sent. The model supplies time, the network and the
//! core, and the order of events the relay follows (`src/relay/`).
//!
//! The invariant is the contract's first rule: the core never receives a
//! second POST for a GUID, and the hub never says "never received" (E904) for
//! a GUID whose POST may still reach the core. A deliberately broken judge
//! ("never received" is always proof) must make the checker fail; a test
//! below shows that it does.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use relayhub::journal::memory::MemoryJournal;
use relayhub::journal::{Claim, Finish, Row, State};
use relayhub::relay::{AttemptFacts, Verdict, judge_never_received};

/// The hub's budget, late-answer window and default wire grace (ms).
const BUDGET: i64 = 1_000;
const LATE: i64 = 3_000;
const GRACE: i64 = BUDGET + LATE + 5_000;
/// The longest the network holds a request.
const HOLD_MAX: i64 = 3_000;
/// Journal retention, and how long a channel keeps sending one GUID: shorter,
/// as docs/operations.md asks of the retention (a settled row that is pruned
/// would make a later resend a new transfer).
const RETENTION: i64 = 60_000;
const HORIZON: i64 = 30_000;
const URLS: [&str; 2] = ["http://core-a", "http://core-b"];
const GUIDS: [&str; 2] = ["G0", "G1"];

/// How one POST fares.
#[derive(Debug, Clone)]
struct PostFate {
    /// The hub dies after the claim, before a byte leaves.
    crash_before_send: bool,
    /// The first URL refuses the connection (nothing sent): failover.
    first_refused: bool,
    /// Both refuse: E902.
    both_refused: bool,
    /// How long the network holds the request.
    hold: i64,
    /// The network loses the request.
    dropped: bool,
    /// The core's answer is lost on the way back.
    answer_lost: bool,
}

#[derive(Debug, Clone)]
enum Action {
    /// A channel sends (or resends) the transfer.
    Transfer(usize, PostFate),
    /// A channel sends INQ001 about the transfer.
    Inquiry(usize),
    Tick(i64),
    Crash,
    Restart,
    /// The live hub settles its unknown transfers (`journal reconcile`).
    Reconcile,
    /// The tool settles unknown transfers while no hub runs.
    ReconcileOffline,
    Prune,
}

fn fate() -> impl Strategy<Value = PostFate> {
    (
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
        prop_oneof![Just(0i64), Just(10), 0..=HOLD_MAX],
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(crash_before_send, first_refused, both_refused, hold, dropped, answer_lost)| {
                PostFate {
                    crash_before_send,
                    first_refused,
                    both_refused,
                    hold,
                    dropped,
                    answer_lost,
                }
            },
        )
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (0..GUIDS.len(), fate()).prop_map(|(g, f)| Action::Transfer(g, f)),
        2 => (0..GUIDS.len()).prop_map(Action::Inquiry),
        6 => prop_oneof![Just(1i64), Just(200), Just(900), Just(2_000), Just(5_000), Just(GRACE), Just(40_000)]
            .prop_map(Action::Tick),
        1 => Just(Action::Crash),
        1 => Just(Action::Restart),
        1 => Just(Action::Reconcile),
        1 => Just(Action::ReconcileOffline),
        1 => Just(Action::Prune),
    ]
}

fn history() -> impl Strategy<Value = Vec<Action>> {
    prop::collection::vec(action(), 1..40)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HubEvent {
    /// The core's answer reaches the hub within the budget.
    Answered,
    /// The budget ends with no answer: E901, the call goes on.
    BudgetEnd,
    /// The answer arrives inside the late-answer window.
    LateAnswer,
    /// The late-answer window ends.
    LateEnd,
}

struct Pending {
    at: i64,
    epoch: u32,
    guid: String,
    event: HubEvent,
}

struct InTransit {
    guid: String,
    url: &'static str,
    arrive: i64,
}

/// What the checker found wrong.
type Violation = String;

struct World {
    judge: fn(&AttemptFacts) -> Verdict,
    now: i64,
    journal: MemoryJournal,
    alive: bool,
    epoch: u32,
    flights: HashSet<String>,
    late_calls: HashSet<String>,
    events: Vec<Pending>,
    network: Vec<InTransit>,
    /// GUIDs each core received.
    received: HashSet<(&'static str, String)>,
    arrivals: HashMap<String, u32>,
    /// Every POST that left the hub: GUID, when, whether the network lost it.
    sent: Vec<(String, i64, bool)>,
    e904: Vec<(String, i64)>,
    first_sent: HashMap<String, i64>,
    finals: HashSet<String>,
}

impl World {
    fn new(judge: fn(&AttemptFacts) -> Verdict) -> World {
        World {
            judge,
            now: 1_000_000,
            journal: MemoryJournal::default(),
            alive: true,
            epoch: 0,
            flights: HashSet::new(),
            late_calls: HashSet::new(),
            events: Vec::new(),
            network: Vec::new(),
            received: HashSet::new(),
            arrivals: HashMap::new(),
            sent: Vec::new(),
            e904: Vec::new(),
            first_sent: HashMap::new(),
            finals: HashSet::new(),
        }
    }

    fn finish(&self, guid: &str, from: &[State], state: State, code: &str) {
        let f = Finish {
            state,
            code: code.into(),
            answer: None,
            error: None,
            note: "model".into(),
            attempt: None,
        };
        self.journal.finish_if(guid, from, f, self.now).unwrap();
    }

    fn schedule(&mut self, guid: &str, at: i64, event: HubEvent) {
        self.events.push(Pending {
            at,
            epoch: self.epoch,
            guid: guid.into(),
            event,
        });
    }

    fn transfer(&mut self, guid: &str, fate: &PostFate) {
        if !self.alive || self.flights.contains(guid) {
            return; // no hub to answer, or a follower of the flight in this process
        }
        let first = *self.first_sent.entry(guid.into()).or_insert(self.now);
        if self.now - first > HORIZON {
            return;
        }
        match self
            .journal
            .claim(guid, "TRF001", "fp", URLS[0], self.now)
            .unwrap()
        {
            Claim::New => self.post(guid, fate),
            Claim::Existing(row) => match row.state {
                State::Done => {
                    self.finals.insert(guid.into());
                }
                State::Unknown => self.settle(&row, &[State::Unknown], true),
                // A journal of one hub: nobody in this process works on it.
                State::Sending => self.settle(&row, &[State::Sending], true),
                State::NotSent => {
                    if self
                        .journal
                        .claim_resend(guid, row.attempts, URLS[0], self.now)
                        .unwrap()
                    {
                        self.post(guid, fate);
                    }
                }
            },
        }
    }

    fn post(&mut self, guid: &str, fate: &PostFate) {
        if fate.crash_before_send {
            self.crash();
            return;
        }
        let mut url = URLS[0];
        if fate.first_refused {
            let noted =
                !fate.both_refused && self.journal.note_url(guid, URLS[1], self.now).unwrap();
            if !noted {
                self.finish(guid, &[State::Sending], State::NotSent, "E902");
                return;
            }
            url = URLS[1];
        }
        self.flights.insert(guid.into());
        self.sent.push((guid.into(), self.now, fate.dropped));
        if !fate.dropped {
            self.network.push(InTransit {
                guid: guid.into(),
                url,
                arrive: self.now + fate.hold,
            });
        }
        let heard = !fate.dropped && !fate.answer_lost;
        if heard && fate.hold < BUDGET {
            self.schedule(guid, self.now + fate.hold, HubEvent::Answered);
        } else {
            self.schedule(guid, self.now + BUDGET, HubEvent::BudgetEnd);
            if heard && fate.hold < BUDGET + LATE {
                self.schedule(guid, self.now + fate.hold, HubEvent::LateAnswer);
            }
            self.schedule(guid, self.now + BUDGET + LATE, HubEvent::LateEnd);
        }
    }

    /// An inquiry about `row`'s transfer, as the relay makes it: at the URL the
    /// attempt went to; "never received" judged by the real judge.
    fn settle(&mut self, row: &Row, from: &[State], journal_it: bool) {
        let url = row.url.as_deref().unwrap_or(URLS[0]);
        let asked = URLS.iter().find(|u| **u == url).copied().unwrap_or(URLS[0]);
        if self.received.contains(&(asked, row.guid.clone())) {
            if journal_it {
                self.finish(&row.guid, from, State::Done, "0000");
            }
            self.finals.insert(row.guid.clone());
            return;
        }
        let facts = AttemptFacts {
            call_running: self.late_calls.contains(&row.guid) || self.flights.contains(&row.guid),
            asked_attempt_url: true,
            attempt_age: Duration::from_millis((self.now - row.last_attempt_ms).max(0) as u64),
            wire_grace: Duration::from_millis(GRACE as u64),
        };
        if (self.judge)(&facts) == Verdict::NeverReceived {
            if journal_it {
                self.finish(&row.guid, from, State::NotSent, "E904");
            }
            self.e904.push((row.guid.clone(), self.now));
        }
    }

    fn inquiry(&mut self, guid: &str) {
        let first = *self.first_sent.get(guid).unwrap_or(&self.now);
        if !self.alive || self.now - first > HORIZON {
            return;
        }
        match self.journal.get(guid).unwrap() {
            // No record (never attempted, or pruned): asked at any URL.
            None => {
                if URLS
                    .iter()
                    .any(|u| self.received.contains(&(*u, guid.to_string())))
                {
                    self.finals.insert(guid.into());
                } else if !self.late_calls.contains(guid) {
                    self.e904.push((guid.into(), self.now));
                }
            }
            Some(row) if matches!(row.state, State::Sending | State::Unknown) => {
                let orphaned = row.state == State::Sending
                    && !self.flights.contains(guid)
                    && !self.late_calls.contains(guid);
                let from: &[State] = if orphaned {
                    &[State::Sending]
                } else {
                    &[State::Unknown]
                };
                // INQ001 journals final answers only, as the relay does.
                let url = row.url.as_deref().unwrap_or(URLS[0]);
                if URLS
                    .iter()
                    .any(|u| *u == url && self.received.contains(&(*u, guid.to_string())))
                {
                    self.finish(guid, from, State::Done, "0000");
                    self.finals.insert(guid.into());
                } else {
                    self.settle(&row, from, false);
                }
            }
            Some(row) => {
                let url = row.url.as_deref().unwrap_or(URLS[0]);
                if URLS
                    .iter()
                    .any(|u| *u == url && self.received.contains(&(*u, guid.to_string())))
                {
                    self.finals.insert(guid.into());
                } else {
                    self.e904.push((guid.into(), self.now));
                }
            }
        }
    }

    fn tick(&mut self, dt: i64) {
        let until = self.now + dt;
        loop {
            let next_arrival = self
                .network
                .iter()
                .map(|m| m.arrive)
                .filter(|t| *t <= until)
                .min();
            let next_event = self
                .events
                .iter()
                .map(|e| e.at)
                .filter(|t| *t <= until)
                .min();
            let at = match (next_arrival, next_event) {
                (None, None) => break,
                (a, e) => a.into_iter().chain(e).min().unwrap(),
            };
            self.now = self.now.max(at);
            // The core first: an answer cannot reach the hub before the request arrived.
            if next_arrival == Some(at) {
                let i = self.network.iter().position(|m| m.arrive == at).unwrap();
                let m = self.network.swap_remove(i);
                *self.arrivals.entry(m.guid.clone()).or_default() += 1;
                self.received.insert((m.url, m.guid));
                continue;
            }
            let i = self.events.iter().position(|e| e.at == at).unwrap();
            let e = self.events.swap_remove(i);
            if e.epoch != self.epoch || !self.alive {
                continue; // the process that waited for it is gone
            }
            match e.event {
                HubEvent::Answered => {
                    self.finish(&e.guid, &[State::Sending], State::Done, "0000");
                    self.flights.remove(&e.guid);
                    self.finals.insert(e.guid);
                }
                HubEvent::BudgetEnd => {
                    self.finish(&e.guid, &[State::Sending], State::Unknown, "E901");
                    self.flights.remove(&e.guid);
                    self.late_calls.insert(e.guid);
                }
                HubEvent::LateAnswer => {
                    self.finish(
                        &e.guid,
                        &[State::Sending, State::Unknown],
                        State::Done,
                        "0000",
                    );
                    self.late_calls.remove(&e.guid);
                }
                HubEvent::LateEnd => {
                    self.late_calls.remove(&e.guid);
                }
            }
        }
        self.now = until;
    }

    fn crash(&mut self) {
        self.alive = false;
        self.epoch += 1;
        self.flights.clear();
        self.late_calls.clear();
    }

    fn restart(&mut self) {
        if !self.alive {
            self.alive = true;
            self.journal.recover(self.now).unwrap();
        }
    }

    fn reconcile(&mut self) {
        for row in self.journal.list(State::Unknown, usize::MAX).unwrap() {
            self.settle(&row, &[State::Unknown], true);
        }
    }

    fn run(&mut self, action: &Action) {
        match action {
            Action::Transfer(g, fate) => self.transfer(GUIDS[*g], fate),
            Action::Inquiry(g) => self.inquiry(GUIDS[*g]),
            Action::Tick(dt) => self.tick(*dt),
            Action::Crash => self.crash(),
            Action::Restart => self.restart(),
            Action::Reconcile if self.alive => self.reconcile(),
            Action::ReconcileOffline if !self.alive => {
                // The tool holds the journal alone: recovery first, as at a start.
                self.journal.recover(self.now).unwrap();
                self.reconcile();
            }
            Action::Reconcile | Action::ReconcileOffline => {}
            Action::Prune => {
                self.journal.prune(self.now - RETENTION).unwrap();
            }
        }
    }

    fn check(&self) -> Result<(), Violation> {
        for (guid, n) in &self.arrivals {
            if *n > 1 {
                return Err(format!("{guid}: the core received {n} POSTs"));
            }
        }
        for (guid, at) in &self.e904 {
            if let Some((_, sent, _)) = self
                .sent
                .iter()
                .find(|(g, sent, dropped)| g == guid && sent < at && !dropped)
            {
                return Err(format!(
                    "{guid}: E904 at {at} for a POST sent at {sent} that reaches the core"
                ));
            }
        }
        Ok(())
    }
}

/// Runs a history, then lets every request in the network arrive.
fn play(judge: fn(&AttemptFacts) -> Verdict, history: &[Action]) -> Result<(), Violation> {
    let mut w = World::new(judge);
    for a in history {
        w.run(a);
        w.check()?;
    }
    w.tick(10 * (GRACE + HOLD_MAX));
    w.check()
}

fn explore(judge: fn(&AttemptFacts) -> Verdict, cases: u32) -> Result<(), String> {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&history(), |h| play(judge, &h).map_err(TestCaseError::fail))
        .map_err(|e| e.to_string())
}

#[test]
fn ten_thousand_histories_keep_the_one_rule() {
    explore(judge_never_received, 10_000).unwrap();
}

#[test]
fn the_model_catches_a_broken_judge() {
    // "Never received" taken as proof whoever owns the row and however young
    // the attempt: the checker must find a second POST or a false E904.
    let broken = |_: &AttemptFacts| Verdict::NeverReceived;
    let found = explore(broken, 10_000).expect_err("the broken judge must be caught");
    assert!(found.contains("POST"), "{found}");
    // The shrunk history, for docs/design.md: `-- --nocapture` shows it.
    println!("{found}");
}
