//! One telegram's path through the hub: check, route, convert, journal, call,
//! map to a standard code, answer within the budget.
//!
//! The order of checks is the protocol's (section 3): header (E102), route
//! (E101), channel (E103), body (E102). Only then is anything journaled or sent.
//! Transfers go through the journal (section 8) so that at most one POST per GUID
//! may reach the core; inquiries are idempotent and retried when safe.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::config::{JournalConfig, Operation};
use crate::core_client::{CallEnd, CallFailure, CoreRequest, Target, parse_retry_after};
use crate::header::{Echo, Header, parse_header};
use crate::journal::{Claim, Finish, Journal, Row, State, now_ms};
use crate::layout::{Layout, encode_fields};
use crate::metric_names;
use crate::outcome::{Code, Outcome, classify_inquiry, classify_transfer, inquiry_is_retryable};
use crate::rules::{Route, Rules};

/// The hub's answer to one telegram: a code, the body that goes with 0000, and
/// whether the connection closes after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: Code,
    pub body: Vec<u8>,
    pub close: bool,
}

impl Reply {
    fn code(code: Code) -> Reply {
        Reply {
            code,
            body: Vec::new(),
            close: false,
        }
    }
}

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

/// A transfer being handled in this process: later telegrams with the same GUID
/// wait for its reply instead of touching the journal or the core.
struct Flight {
    fingerprint: String,
    reply: watch::Receiver<Option<Reply>>,
}

/// The hub: targets, journal, the current rules, and what is in flight.
pub struct Hub {
    rules: RwLock<Arc<Rules>>,
    targets: Vec<Arc<Target>>,
    journal: Journal,
    budget: Duration,
    policy: ResendPolicy,
    flights: Mutex<HashMap<String, Flight>>,
    /// GUIDs whose POST is still running past the budget (late-answer window):
    /// while one runs, "never received" cannot be believed.
    late_calls: Arc<Mutex<HashSet<String>>>,
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
            rules: RwLock::new(Arc::new(rules)),
            targets,
            journal,
            budget,
            policy,
            flights: Mutex::new(HashMap::new()),
            late_calls: Arc::new(Mutex::new(HashSet::new())),
            draining: AtomicBool::new(false),
        }
    }

    pub fn budget(&self) -> Duration {
        self.budget
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn targets(&self) -> &[Arc<Target>] {
        &self.targets
    }

    /// The rules in force now.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the rules as one unit (SIGHUP reload).
    pub fn set_rules(&self, rules: Rules) {
        *self.rules.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(rules);
    }

    /// From now on, valid telegrams get E903 and their connection is closed.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Answers one telegram (without its length prefix) read whole at `read_at`.
    /// Returns the echo for the response header and the reply.
    pub async fn handle(&self, telegram: &[u8], peer: IpAddr, read_at: Instant) -> (Echo, Reply) {
        let deadline = read_at + self.budget;
        let echo = Echo::from_telegram(telegram);
        let span = info_span!("telegram", guid = echo.guid_str(), tx = echo.tx_code_str(), channel = tracing::field::Empty, core_ms = tracing::field::Empty, fields = tracing::field::Empty, %peer);
        // One version of the rules for the whole telegram, its metrics included.
        let rules = self.rules();
        let (reply, note) = self
            .dispatch(telegram, peer, &rules, deadline)
            .instrument(span.clone())
            .await;
        let elapsed = read_at.elapsed();
        // Only routed tx codes become label values: garbage must not grow the metrics.
        let tx = match rules.route(echo.tx_code_str()) {
            Some(r) => r.tx_code.clone(),
            None => metric_names::UNROUTED_TX.to_string(),
        };
        metrics::counter!(metric_names::TELEGRAMS, "tx_code" => tx.clone(), "code" => reply.code.as_str().to_string()).increment(1);
        metrics::histogram!(metric_names::TELEGRAM_DURATION, "tx_code" => tx)
            .record(elapsed.as_secs_f64());
        span.in_scope(|| {
            info!(code = %reply.code, ms = elapsed.as_millis() as u64, "{note}");
        });
        (echo, reply)
    }

    async fn dispatch(
        &self,
        telegram: &[u8],
        peer: IpAddr,
        rules: &Rules,
        deadline: Instant,
    ) -> (Reply, String) {
        let header = match parse_header(telegram) {
            Ok(h) => h,
            Err(e) => return (Reply::code(Code::FORMAT), e.to_string()),
        };
        tracing::Span::current().record("channel", header.channel_id.as_str());
        let Some(route) = rules.route(&header.tx_code) else {
            return (
                Reply::code(Code::NOT_ROUTED),
                format!("tx code {} has no route", header.tx_code),
            );
        };
        if let Err(refusal) = rules.check_channel(&header.channel_id, peer, &header.tx_code) {
            return (Reply::code(Code::CHANNEL), refusal.to_string());
        }
        let body = &telegram[crate::header::HEADER_LEN..];
        let fields = match route.layout.decode_request(body, crate::header::HEADER_LEN) {
            Ok(f) => f,
            Err(e) => return (Reply::code(Code::FORMAT), e.to_string()),
        };
        if self.is_draining() {
            return (
                Reply {
                    code: Code::NO_CAPACITY,
                    body: Vec::new(),
                    close: true,
                },
                "hub is draining".into(),
            );
        }
        // On the span, so the one summary line carries them (masked).
        tracing::Span::current().record(
            "fields",
            Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            match v {
                                Value::String(s) if k.ends_with("account") => {
                                    Value::String(mask_account(s))
                                }
                                Value::String(s) if k == "memo" => {
                                    Value::String(format!("<{} chars>", s.chars().count()))
                                }
                                other => other.clone(),
                            },
                        )
                    })
                    .collect(),
            )
            .to_string()
            .as_str(),
        );
        match route.operation {
            Operation::Transfer => {
                self.transfer(&header, route, rules, fields, body, deadline)
                    .await
            }
            Operation::Inquiry => self.inquiry(route, rules, &fields, deadline).await,
        }
    }

    // ---- transfers -------------------------------------------------------

    async fn transfer(
        &self,
        header: &Header,
        route: &Route,
        rules: &Rules,
        fields: Map<String, Value>,
        body: &[u8],
        deadline: Instant,
    ) -> (Reply, String) {
        let fingerprint = fingerprint(&header.tx_code, body);
        let leader = {
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            match flights.get(&header.guid) {
                Some(f) => Err((f.fingerprint.clone(), f.reply.clone())),
                None => {
                    let (tx, rx) = watch::channel(None);
                    flights.insert(
                        header.guid.clone(),
                        Flight {
                            fingerprint: fingerprint.clone(),
                            reply: rx,
                        },
                    );
                    Ok(tx)
                }
            }
        };
        match leader {
            Err((their_fp, mut rx)) => {
                if their_fp != fingerprint {
                    return (
                        Reply::code(Code::FORMAT),
                        "GUID is in flight with a different body".into(),
                    );
                }
                let waited = tokio::time::timeout_at(deadline, rx.wait_for(Option::is_some)).await;
                match waited {
                    Ok(Ok(reply)) => {
                        let reply = reply.clone().expect("waited for Some");
                        (
                            reply,
                            "answer of the telegram in flight with this GUID".into(),
                        )
                    }
                    _ => (
                        Reply::code(Code::UNKNOWN),
                        "the telegram in flight with this GUID did not finish within the budget"
                            .into(),
                    ),
                }
            }
            Ok(tx) => {
                let _done = FlightGuard {
                    hub: self,
                    guid: &header.guid,
                };
                let (reply, note) = self
                    .lead_transfer(header, route, rules, fields, &fingerprint, deadline)
                    .await;
                let _ = tx.send(Some(reply.clone()));
                (reply, note)
            }
        }
    }

    async fn lead_transfer(
        &self,
        header: &Header,
        route: &Route,
        rules: &Rules,
        fields: Map<String, Value>,
        fingerprint: &str,
        deadline: Instant,
    ) -> (Reply, String) {
        let guid = header.guid.as_str();
        // A resend that loses a race re-reads the row once; after that the row
        // is in flight elsewhere, which the `Sending` arm handles.
        for _ in 0..2 {
            let now = now_ms();
            let claim = {
                let (journal, g, tx, fp) = (
                    self.journal.clone(),
                    guid.to_string(),
                    header.tx_code.clone(),
                    fingerprint.to_string(),
                );
                within(
                    deadline,
                    async move { journal.claim(&g, &tx, &fp, now).await },
                )
                .await
            };
            let claim = match claim {
                Bounded::Done(c) => c,
                Bounded::Late(task) => {
                    self.release_late_claim(guid, async move {
                        matches!(task.await, Ok(Ok(Claim::New)))
                    });
                    return (
                        journal_failed("claim"),
                        "not sent: the journal did not answer within the budget".into(),
                    );
                }
                Bounded::Failed(e) => {
                    return (journal_failed("claim"), format!("not sent: {e}"));
                }
            };
            let row = match claim {
                Err(e) => return (journal_failed("claim"), format!("not sent: {e}")),
                Ok(Claim::New) => {
                    return self.post(header, route, rules, &fields, 1, deadline).await;
                }
                Ok(Claim::Existing(row)) => row,
            };
            if row.fingerprint != fingerprint {
                return (
                    Reply::code(Code::FORMAT),
                    "GUID already journaled with a different body or tx code".into(),
                );
            }
            match row.state {
                State::Done => {
                    return (
                        replay(&row),
                        format!(
                            "replayed the stored answer {}",
                            row.code.as_deref().unwrap_or("?")
                        ),
                    );
                }
                State::Unknown => return self.resolve_unknown(guid, route, rules, deadline).await,
                State::Sending => return self.await_other(guid, route, rules, deadline).await,
                State::NotSent => {
                    let allowed = 1 + self.policy.max_resends;
                    if row.attempts >= allowed {
                        warn!(attempts = row.attempts, "resend refused: past the maximum");
                        return (
                            Reply::code(Code::RESEND_REFUSED),
                            format!(
                                "resend refused: {} attempts made, at most {allowed} allowed",
                                row.attempts
                            ),
                        );
                    }
                    let since = now - row.answered_ms.unwrap_or(row.last_attempt_ms);
                    let cooldown = self.policy.cooldown.as_millis() as i64;
                    if since < cooldown {
                        warn!(since_ms = since, "resend refused: inside the cooldown");
                        return (
                            Reply::code(Code::RESEND_REFUSED),
                            format!(
                                "resend refused: {since} ms after the previous answer, cooldown is {cooldown} ms"
                            ),
                        );
                    }
                    let resend = {
                        let (journal, g, attempts) =
                            (self.journal.clone(), guid.to_string(), row.attempts);
                        within(deadline, async move {
                            journal.claim_resend(&g, attempts, now).await
                        })
                        .await
                    };
                    let resend = match resend {
                        Bounded::Done(r) => r,
                        Bounded::Late(task) => {
                            self.release_late_claim(guid, async move {
                                matches!(task.await, Ok(Ok(true)))
                            });
                            return (
                                journal_failed("claim"),
                                "not sent: the journal did not answer within the budget".into(),
                            );
                        }
                        Bounded::Failed(e) => {
                            return (journal_failed("claim"), format!("not sent: {e}"));
                        }
                    };
                    match resend {
                        Ok(true) => {
                            return self
                                .post(header, route, rules, &fields, row.attempts + 1, deadline)
                                .await;
                        }
                        Ok(false) => continue,
                        Err(e) => {
                            return (journal_failed("claim"), format!("not sent: {e}"));
                        }
                    }
                }
            }
        }
        (
            Reply::code(Code::UNKNOWN),
            "GUID is being resent elsewhere".into(),
        )
    }

    /// The row is `sending` and not ours: another hub (shared journal) has it.
    /// Wait for its outcome within the budget.
    async fn await_other(
        &self,
        guid: &str,
        route: &Route,
        rules: &Rules,
        deadline: Instant,
    ) -> (Reply, String) {
        loop {
            if Instant::now()
                .checked_add(Duration::from_millis(20))
                .is_none_or(|t| t >= deadline)
            {
                return (
                    Reply::code(Code::UNKNOWN),
                    "GUID in flight elsewhere past the budget".into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            match self.journal.get(guid).await {
                Ok(Some(row)) if row.state == State::Done => {
                    return (
                        replay(&row),
                        "answer of the attempt in flight elsewhere".into(),
                    );
                }
                Ok(Some(row)) if row.state == State::Unknown => {
                    return self.resolve_unknown(guid, route, rules, deadline).await;
                }
                Ok(Some(row)) if row.state == State::NotSent => {
                    let code = row
                        .code
                        .as_deref()
                        .and_then(Code::parse)
                        .unwrap_or(Code::NOT_SENT);
                    return (
                        Reply::code(code),
                        "attempt in flight elsewhere was not sent".into(),
                    );
                }
                Ok(_) => continue,
                Err(e) => return (Reply::code(Code::UNKNOWN), format!("journal: {e}")),
            }
        }
    }

    /// Posts attempt `attempt` of a claimed GUID and journals the outcome.
    async fn post(
        &self,
        header: &Header,
        route: &Route,
        rules: &Rules,
        fields: &Map<String, Value>,
        attempt: u32,
        deadline: Instant,
    ) -> (Reply, String) {
        let guid = header.guid.as_str();
        let target = &self.targets[route.target];
        let mut json = Map::with_capacity(fields.len() + 2);
        json.insert("guid".into(), Value::String(header.guid.clone()));
        json.insert(
            "channel_id".into(),
            Value::String(header.channel_id.clone()),
        );
        for (k, v) in fields {
            json.insert(k.clone(), v.clone());
        }
        let request = CoreRequest::Transfer {
            guid: guid.to_string(),
            json: serde_json::to_vec(&Value::Object(json)).expect("a JSON map serialises"),
        };
        let started = Instant::now();
        let mut tries = 0u32;
        let outcome = loop {
            match target.attempt(&request, tries, deadline).await {
                CallEnd::Done(Ok(answer)) => {
                    if answer.replayed {
                        debug!("the core replayed its stored answer");
                    }
                    if answer.status == 401 || answer.status == 403 {
                        tracing::error!(target_name = %target.name, status = answer.status, "the core refused the hub's credentials: check the target's auth configuration");
                    }
                    break classify_transfer(answer.status, &answer.body, &rules.codes);
                }
                CallEnd::Done(Err(CallFailure::MaybeSent(r))) => break Outcome::Unknown(r),
                CallEnd::Done(Err(CallFailure::NoCapacity(r))) => break Outcome::NoCapacity(r),
                CallEnd::Done(Err(CallFailure::NotSent(r))) => {
                    tries += 1;
                    // Nothing left the hub: retry (on the next endpoint) if it fits.
                    if tries < target.connect_attempts {
                        let pause = target.backoff(tries);
                        if Instant::now()
                            .checked_add(pause.saturating_add(Duration::from_millis(5)))
                            .is_some_and(|t| t < deadline)
                        {
                            metrics::counter!(metric_names::CORE_RETRIES, "target" => target.name.clone(), "operation" => "transfer").increment(1);
                            debug!(%r, "not sent; retrying");
                            tokio::time::sleep(pause).await;
                            continue;
                        }
                    }
                    break Outcome::NotSent(r);
                }
                CallEnd::Pending(late) => {
                    self.record_late(
                        guid.to_string(),
                        route.layout.clone(),
                        rules.codes.clone(),
                        late,
                    );
                    break Outcome::Unknown(
                        "no answer within the budget; the call goes on for late answers".into(),
                    );
                }
            }
        };
        metrics::histogram!(metric_names::CORE_CALL_DURATION, "target" => target.name.clone(), "operation" => "transfer")
            .record(started.elapsed().as_secs_f64());
        // Phase timing for the telegram's summary line (its span carries it).
        tracing::Span::current().record("core_ms", started.elapsed().as_millis() as u64);
        let (reply, outcome) = reply_for(outcome, &route.layout, &rules.codes);
        let state = state_for(reply.code);
        let note = describe(&outcome, attempt);
        let finish = Finish {
            state,
            code: reply.code.as_str().into(),
            answer: (!reply.body.is_empty()).then(|| reply.body.clone()),
            error: error_of(&outcome),
            note: note.clone(),
        };
        let journal = self.journal.clone();
        let g = guid.to_string();
        match within(deadline, async move {
            journal
                .finish_if(&g, &[State::Sending], finish, now_ms())
                .await
        })
        .await
        {
            Bounded::Done(Ok(_)) => {}
            // The answer is still the truth; the row stays "sending" and becomes
            // "unknown" at the next start, where an inquiry settles it.
            Bounded::Done(Err(e)) => {
                journal_failed("outcome");
                warn!(%e, "could not journal the outcome")
            }
            Bounded::Failed(e) => {
                journal_failed("outcome");
                warn!(%e, "could not journal the outcome")
            }
            Bounded::Late(_) => {
                warn!("journaling the outcome outlived the budget; it completes in the background")
            }
        }
        (reply, note)
    }

    /// Waits for a call that outlived the budget and journals what it says.
    fn record_late(
        &self,
        guid: String,
        layout: Arc<Layout>,
        codes: crate::outcome::CodeTable,
        late: crate::core_client::LateAnswer,
    ) {
        let journal = self.journal.clone();
        let late_calls = self.late_calls.clone();
        late_calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(guid.clone());
        tokio::spawn(async move {
            let result = late.await;
            late_calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&guid);
            let outcome = match result {
                Ok(Ok(answer)) => classify_transfer(answer.status, &answer.body, &codes),
                Ok(Err(f)) => Outcome::Unknown(format!("{f:?}")),
                Err(_) => Outcome::Unknown("late call dropped".into()),
            };
            let (reply, outcome) = reply_for(outcome, &layout, &codes);
            if !reply.code.is_final() {
                info!(%guid, "late call ended without a readable answer; still unknown");
                return;
            }
            let finish = Finish {
                state: State::Done,
                code: reply.code.as_str().into(),
                answer: (!reply.body.is_empty()).then_some(reply.body),
                error: error_of(&outcome),
                note: format!("late answer: {}", describe(&outcome, 0)),
            };
            match journal
                .finish_if(&guid, &[State::Sending, State::Unknown], finish, now_ms())
                .await
            {
                Ok(_) => info!(%guid, code = %reply.code, "late answer journaled"),
                Err(e) => warn!(%guid, %e, "could not journal a late answer"),
            }
        });
    }

    /// A repeat of a GUID whose transfer is unknown: ask the core instead of posting.
    async fn resolve_unknown(
        &self,
        guid: &str,
        route: &Route,
        rules: &Rules,
        deadline: Instant,
    ) -> (Reply, String) {
        let target = &self.targets[route.target];
        let outcome = self.inquire(target, guid, rules, deadline).await;
        let outcome = match outcome {
            Outcome::NeverReceived if self.call_still_running(guid) => Outcome::Unknown(
                "inquiry says never received, but the hub's call is still running".into(),
            ),
            // Whatever stopped the inquiry, the transfer itself is still unknown.
            Outcome::NotSent(r) | Outcome::NoCapacity(r) => {
                Outcome::Unknown(format!("inquiry not sent: {r}"))
            }
            o => o,
        };
        let (reply, outcome) = reply_for(outcome, &route.layout, &rules.codes);
        let note = format!("inquiry after unknown: {}", describe(&outcome, 0));
        if reply.code != Code::UNKNOWN {
            let finish = Finish {
                state: state_for(reply.code),
                code: reply.code.as_str().into(),
                answer: (!reply.body.is_empty()).then(|| reply.body.clone()),
                error: error_of(&outcome),
                note: note.clone(),
            };
            if let Err(e) = self
                .journal
                .finish_if(guid, &[State::Unknown], finish, now_ms())
                .await
            {
                warn!(%e, "could not journal the inquiry's answer");
            }
        }
        (reply, note)
    }

    /// Asks the core about every unknown transfer and journals what it says
    /// (`relayhub journal reconcile`). Returns each GUID with its code now.
    pub async fn reconcile(&self) -> Result<Vec<(String, Code)>, crate::journal::JournalError> {
        let rows = self.journal.list(State::Unknown, usize::MAX).await?;
        let rules = self.rules();
        let mut report = Vec::with_capacity(rows.len());
        for row in rows {
            let Some(route) = rules.route(&row.tx_code) else {
                warn!(guid = %row.guid, tx = %row.tx_code, "no route for this tx code any more; skipped");
                continue;
            };
            let deadline = Instant::now() + self.budget;
            let (reply, note) = self
                .resolve_unknown(&row.guid, route, &rules, deadline)
                .await;
            info!(guid = %row.guid, code = %reply.code, "{note}");
            report.push((row.guid, reply.code));
        }
        Ok(report)
    }

    /// A claim that completed after the hub already answered E903: nothing was
    /// sent, so the row must say so, or the GUID would look in flight forever.
    fn release_late_claim(
        &self,
        guid: &str,
        claimed: impl std::future::Future<Output = bool> + Send + 'static,
    ) {
        let journal = self.journal.clone();
        let guid = guid.to_string();
        tokio::spawn(async move {
            if claimed.await {
                let finish = Finish {
                    state: State::NotSent,
                    code: Code::NO_CAPACITY.as_str().into(),
                    answer: None,
                    error: Some("journal slower than the budget".into()),
                    note: "claimed after the budget ran out; nothing sent".into(),
                };
                if let Err(e) = journal
                    .finish_if(&guid, &[State::Sending], finish, now_ms())
                    .await
                {
                    warn!(%guid, %e, "could not release a late claim");
                }
            }
        });
    }

    fn call_still_running(&self, guid: &str) -> bool {
        self.late_calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(guid)
    }

    // ---- inquiries -------------------------------------------------------

    async fn inquiry(
        &self,
        route: &Route,
        rules: &Rules,
        fields: &Map<String, Value>,
        deadline: Instant,
    ) -> (Reply, String) {
        let orig = fields
            .get("orig_guid")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !is_guid(orig) {
            return (
                Reply::code(Code::FORMAT),
                format!(
                    "field `orig_guid` at byte {}: not a GUID of 32 [0-9A-Za-z_-]",
                    crate::header::HEADER_LEN
                ),
            );
        }
        let target = &self.targets[route.target];
        let mut outcome = self.inquire(target, orig, rules, deadline).await;
        if outcome == Outcome::NeverReceived && self.call_still_running(orig) {
            outcome = Outcome::Unknown(
                "inquiry says never received, but the hub's call is still running".into(),
            );
        }
        let (reply, outcome) = reply_for(outcome, &route.layout, &rules.codes);
        // An answer that settles an unknown transfer is journaled too.
        if reply.code.is_final() {
            if let Ok(Some(row)) = self.journal.get(orig).await {
                if row.state == State::Unknown {
                    let body = rules.route(&row.tx_code).and_then(|r| match &outcome {
                        Outcome::Processed(m) => {
                            encode_fields(&r.layout.response, m, crate::header::HEADER_LEN).ok()
                        }
                        _ => None,
                    });
                    if reply.code != Code::OK || body.is_some() {
                        let finish = Finish {
                            state: State::Done,
                            code: reply.code.as_str().into(),
                            answer: body,
                            error: error_of(&outcome),
                            note: "settled by an inquiry telegram".into(),
                        };
                        let _ = self
                            .journal
                            .finish_if(orig, &[State::Unknown], finish, now_ms())
                            .await;
                    }
                }
            }
        }
        (
            reply,
            format!("inquiry for {orig}: {}", describe(&outcome, 0)),
        )
    }

    /// `GET /v1/transfers/{guid}` with safe retries inside the budget.
    async fn inquire(
        &self,
        target: &Target,
        guid: &str,
        rules: &Rules,
        deadline: Instant,
    ) -> Outcome {
        let request = CoreRequest::Inquiry {
            guid: guid.to_string(),
        };
        let started = Instant::now();
        let mut tries = 0u32;
        let outcome = loop {
            let end = target.attempt(&request, tries, deadline).await;
            tries += 1;
            let (outcome, wait) = match end {
                CallEnd::Done(Ok(answer)) => {
                    let o = classify_inquiry(answer.status, &answer.body, &rules.codes);
                    let retry = inquiry_is_retryable(answer.status);
                    let wait = answer.retry_after.as_deref().and_then(parse_retry_after);
                    (
                        o,
                        retry.then(|| wait.unwrap_or_else(|| target.backoff(tries))),
                    )
                }
                CallEnd::Done(Err(CallFailure::NotSent(r))) => {
                    (Outcome::NotSent(r), Some(target.backoff(tries)))
                }
                CallEnd::Done(Err(CallFailure::MaybeSent(r))) => {
                    (Outcome::Unknown(r), Some(target.backoff(tries)))
                }
                CallEnd::Done(Err(CallFailure::NoCapacity(r))) => (Outcome::NoCapacity(r), None),
                CallEnd::Pending(_) => (
                    Outcome::Unknown("inquiry not answered within the budget".into()),
                    None,
                ),
            };
            match wait {
                // Retry only what is safe (a GET) and only if the wait fits the budget.
                Some(pause)
                    if tries < target.inquiry_attempts
                        && Instant::now()
                            .checked_add(pause.saturating_add(Duration::from_millis(5)))
                            .is_some_and(|t| t < deadline) =>
                {
                    metrics::counter!(metric_names::CORE_RETRIES, "target" => target.name.clone(), "operation" => "inquiry").increment(1);
                    debug!(?pause, "retrying the inquiry");
                    tokio::time::sleep(pause).await;
                }
                _ => break outcome,
            }
        };
        metrics::histogram!(metric_names::CORE_CALL_DURATION, "target" => target.name.clone(), "operation" => "inquiry")
            .record(started.elapsed().as_secs_f64());
        // Phase timing for the telegram's summary line (its span carries it).
        tracing::Span::current().record("core_ms", started.elapsed().as_millis() as u64);
        outcome
    }
}

/// Counts a journal failure on the telegram path; a failed claim is answered
/// E903 (nothing was sent).
fn journal_failed(stage: &'static str) -> Reply {
    metrics::counter!(crate::metric_names::JOURNAL_ERRORS, "stage" => stage).increment(1);
    Reply::code(Code::NO_CAPACITY)
}

/// A journal call raced against the budget.
enum Bounded<T> {
    Done(T),
    /// Still running past the budget; it goes on in the background.
    Late(tokio::task::JoinHandle<T>),
    Failed(String),
}

/// Runs `fut` as its own task and waits for it until `deadline`: a stalled
/// journal must not hold a channel past its answer, and a write that is under
/// way is never cut in half (it finishes in the background).
async fn within<T: Send + 'static>(
    deadline: Instant,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Bounded<T> {
    let mut task = tokio::spawn(fut);
    match tokio::time::timeout_at(deadline, &mut task).await {
        Ok(Ok(v)) => Bounded::Done(v),
        Ok(Err(e)) => Bounded::Failed(format!("journal task failed: {e}")),
        Err(_) => Bounded::Late(task),
    }
}

/// Turns an outcome into a reply; a 0000 whose answer does not fit the response
/// layout is "unknown" (the core did something the hub cannot report).
fn reply_for(
    outcome: Outcome,
    layout: &Layout,
    codes: &crate::outcome::CodeTable,
) -> (Reply, Outcome) {
    if let Outcome::Processed(m) = &outcome {
        return match encode_fields(&layout.response, m, crate::header::HEADER_LEN) {
            Ok(body) => (
                Reply {
                    code: Code::OK,
                    body,
                    close: false,
                },
                outcome,
            ),
            Err(e) => {
                let o = Outcome::Unknown(format!("answer does not fit the response layout: {e}"));
                (Reply::code(Code::UNKNOWN), o)
            }
        };
    }
    (Reply::code(codes.code(&outcome)), outcome)
}

/// Removes a flight when its leader finishes, even if the leader is cancelled.
struct FlightGuard<'a> {
    hub: &'a Hub,
    guid: &'a str,
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        self.hub
            .flights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(self.guid);
    }
}

fn replay(row: &Row) -> Reply {
    Reply {
        code: row
            .code
            .as_deref()
            .and_then(Code::parse)
            .unwrap_or(Code::UNKNOWN),
        body: row.answer.clone().unwrap_or_default(),
        close: false,
    }
}

/// The journal state a code leaves a GUID in.
fn state_for(code: Code) -> State {
    if code.is_final() {
        State::Done
    } else if code == Code::UNKNOWN {
        State::Unknown
    } else {
        State::NotSent
    }
}

fn describe(outcome: &Outcome, attempt: u32) -> String {
    let what = match outcome {
        Outcome::Processed(_) => "processed".to_string(),
        Outcome::Rejected(r) => format!("rejected: {r}"),
        Outcome::TargetError(r) => format!("target error: {r}"),
        Outcome::NotSent(r) => format!("not sent: {r}"),
        Outcome::NoCapacity(r) => format!("no capacity: {r}"),
        Outcome::Unknown(r) => format!("unknown: {r}"),
        Outcome::NeverReceived => "the core never received it".to_string(),
    };
    if attempt > 0 {
        format!("attempt {attempt}: {what}")
    } else {
        what
    }
}

fn error_of(outcome: &Outcome) -> Option<String> {
    match outcome {
        Outcome::TargetError(r)
        | Outcome::NotSent(r)
        | Outcome::NoCapacity(r)
        | Outcome::Unknown(r) => Some(r.clone()),
        _ => None,
    }
}

/// SHA-256 over the tx code and the body: a repeat must match both.
pub fn fingerprint(tx_code: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(tx_code.as_bytes());
    h.update([0u8]);
    h.update(body);
    format!("{:x}", h.finalize())
}

fn is_guid(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Request fields for a log line: account numbers keep their last four characters.
pub fn masked(fields: &Map<String, Value>) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(k);
        out.push('=');
        match v {
            Value::String(s) if k.ends_with("account") => out.push_str(&mask_account(s)),
            // Free text (memos) may hold anything; keep it out of the logs.
            Value::String(s) if k == "memo" => {
                out.push_str(&format!("<{} chars>", s.chars().count()))
            }
            Value::String(s) => out.push_str(s),
            other => out.push_str(&other.to_string()),
        }
    }
    out.push('}');
    out
}

/// `1002003004001` -> `*********4001`.
pub fn mask_account(s: &str) -> String {
    let n = s.chars().count();
    s.chars()
        .enumerate()
        .map(|(i, c)| if i + 4 < n { '*' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_keeps_last_four() {
        assert_eq!(mask_account("1002003004001"), "*********4001");
        assert_eq!(mask_account("123"), "123");
        let mut m = Map::new();
        m.insert("from_account".into(), Value::String("1002003004001".into()));
        m.insert("amount".into(), Value::from(5));
        m.insert("memo".into(), Value::String("월세".into()));
        let s = masked(&m);
        assert!(
            s.contains("*********4001") && !s.contains("1002003004001") && !s.contains("월세"),
            "{s}"
        );
    }

    #[test]
    fn fingerprint_depends_on_tx_and_body() {
        assert_eq!(fingerprint("TRF001", b"a"), fingerprint("TRF001", b"a"));
        assert_ne!(fingerprint("TRF001", b"a"), fingerprint("TRF001", b"b"));
        assert_ne!(fingerprint("TRF001", b"a"), fingerprint("TRF002", b"a"));
    }

    #[test]
    fn states_for_codes() {
        assert_eq!(state_for(Code::OK), State::Done);
        assert_eq!(state_for(Code::TARGET_ERROR), State::Done);
        assert_eq!(state_for(Code::UNKNOWN), State::Unknown);
        assert_eq!(state_for(Code::NOT_SENT), State::NotSent);
        assert_eq!(state_for(Code::NO_CAPACITY), State::NotSent);
        assert_eq!(state_for(Code::NEVER_RECEIVED), State::NotSent);
    }
}
