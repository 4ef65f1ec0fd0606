//! A transfer telegram: single flight in this process, the journal claim
//! (written ahead of the first request byte), the resend policy, the POST with
//! failover only while nothing was sent, and the outcome journaled.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::bounded::{self, Bounded};
use super::core_inquiry::{fits, inquire};
use super::flights::Joined;
use super::inquiry::{Record, read_record};
use super::reply::{describe, finish_of, replay, reply_for, reply_to_transfer};
use super::{Deadline, Hub, Reply, settle};
use crate::core_client::{CallEnd, CallFailure, CoreRequest, Target};
use crate::header::Header;
use crate::journal::{AttemptTo, Claim, Finish, Row, State, now_ms};
use crate::layout::DecodedFields;
use crate::metric_names;
use crate::outcome::{Code, Outcome};
use crate::rules::{Route, Rules};

/// SHA-256 over the tx code and the body: a repeat must match both.
pub fn fingerprint(tx_code: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(tx_code.as_bytes());
    h.update([0u8]);
    h.update(body);
    let mut text = String::with_capacity(64);
    crate::hex::push(&mut text, &h.finalize());
    text
}

/// The JSON body of `POST /v1/transfers`: the request's fields with `guid`
/// and `channel_id` from the header (a field of the same name wins), keys in
/// order. Written straight from the fields, with no object of its own.
pub fn transfer_body(guid: &str, channel_id: &str, fields: &DecodedFields<'_>) -> Vec<u8> {
    struct Body<'a, 'v> {
        header: [(&'a str, &'a str); 2],
        fields: &'a DecodedFields<'v>,
    }
    impl serde::Serialize for Body<'_, '_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut header = self
                .header
                .iter()
                .filter(|(k, _)| !self.fields.contains(k))
                .peekable();
            let mut map = s.serialize_map(None)?;
            for (k, v) in self.fields.iter() {
                while let Some((hk, hv)) = header.next_if(|(hk, _)| *hk < k) {
                    map.serialize_entry(hk, hv)?;
                }
                map.serialize_entry(k, v)?;
            }
            for (hk, hv) in header {
                map.serialize_entry(hk, hv)?;
            }
            map.end()
        }
    }
    // Sorted, as the keys of `fields` are.
    let body = Body {
        header: [("channel_id", channel_id), ("guid", guid)],
        fields,
    };
    let mut out = Vec::with_capacity(body_len_hint(guid, channel_id, fields));
    match serde_json::to_writer(&mut out, &body) {
        Ok(()) => out,
        Err(_) => Vec::new(),
    }
}

/// The length of the usual transfer body (every key and text quoted, no
/// escapes), so that writing it seldom grows its buffer.
fn body_len_hint(guid: &str, channel_id: &str, fields: &DecodedFields<'_>) -> usize {
    32 + guid.len() + channel_id.len() + fields.json_len_hint()
}

/// Answers a transfer telegram. `may_post` is dropped once it has joined
/// its flight.
#[allow(clippy::too_many_arguments)] // the telegram's parts, as dispatch has them
pub(super) async fn run(
    hub: &Hub,
    header: &Header<'_>,
    route: &Route,
    rules: &Rules,
    fields: &DecodedFields<'_>,
    body: &[u8],
    deadline: Deadline,
    may_post: &mut Option<Box<super::MayPost>>,
) -> (Reply, String) {
    let fingerprint = fingerprint(header.tx_code, body);
    let joined = hub.flights.join(header.guid, &fingerprint);
    // In its flight now (or following one): seen as posting from here.
    drop(may_post.take());
    match joined {
        Joined::Follow {
            fingerprint: theirs,
            mut reply,
        } => {
            if theirs != fingerprint {
                return (
                    Reply::code(Code::FORMAT),
                    guid_clash("in flight with a different body"),
                );
            }
            // Until the reply deadline, not the work one: a follower has no
            // outcome to write, and a leader read in the same millisecond
            // answers at its own work deadline (a follower that gave up
            // first said E901 beside the leader's E903; a black-box probe).
            match tokio::time::timeout_at(deadline.reply, reply.wait_for(Option::is_some)).await {
                Ok(Ok(r)) => (
                    r.clone().unwrap_or_else(|| Reply::code(Code::UNKNOWN)),
                    "answer of the telegram in flight with this GUID".into(),
                ),
                _ => (
                    Reply::code(Code::UNKNOWN),
                    "the telegram in flight with this GUID did not finish within the budget".into(),
                ),
            }
        }
        Joined::Lead(lead) => {
            let transfer = Transfer {
                hub,
                header,
                route,
                rules,
                target: hub.target(route),
                fields,
                fingerprint: &fingerprint,
                deadline,
            };
            let (reply, note) = transfer.lead().await;
            lead.finish(&reply);
            (reply, note)
        }
    }
}

/// A transfer telegram this hub takes no further: it is draining, or the
/// telegram's budget ran out before its turn on its connection. Nothing is
/// claimed or sent. E903 ("nothing was sent, no money moved") is true of
/// the telegram but not always of its GUID, so the GUID's row is read, until
/// `until`, and the answer is the GUID's: a final answer is replayed (a
/// repeat of a transfer answered 0000 is told 0000), a row whose attempt is
/// unknown or under way is E901, a different body is E102, and a GUID never
/// sent, or certainly not sent, is E903. A POST of the GUID that this hub
/// runs, and a read that fails or is late, are E901: money may have moved
/// (counted as a journal failure of stage `read`). With the memory journal
/// the read is in place; SQLite's is made while the telegram waits for
/// room (`Flights::row_read_ahead`), and PostgreSQL's may not fit in what is
/// left of a budget that ran out waiting, and then the answer is E901 even
/// for a GUID never sent: the hub does not know. (Before: E903 without a
/// look, to repeats of transfers that had moved money; found by a review of
/// the one rule.)
pub(super) async fn taken_no_further(
    hub: &Hub,
    header: &Header<'_>,
    body: &[u8],
    why: &str,
    until: Instant,
) -> (Reply, String) {
    let guid = header.guid;
    // Counted as waiting while it is answered (a telegram that waited for
    // room is already; one taken no further by a drain is not), so that a
    // flight of the GUID that ends from now on is counted: a whole transfer
    // of it on another connection may run between the row's read and the
    // look at what this hub posts (before, it was missed, and E903 answered
    // a GUID whose row said 0000; found by a review).
    let waiting = &hub.flights.waiting;
    let _counted = waiting.count_in(guid);
    let ended_before = waiting.ended(guid);
    // Read while the telegram waited for room, when that read still holds;
    // otherwise now. Polled in place: the memory journal answers in this poll.
    let record = match hub.flights.row_read_ahead(guid) {
        Some(row) => Record::Known(row),
        None => read_record(hub, guid, until).await,
    };
    let row = match record {
        Record::Known(row) => row,
        Record::Unavailable(e) => {
            bounded::count_failure("read");
            return (
                Reply::code(Code::UNKNOWN),
                format!(
                    "not sent: {why}; the GUID's row could not be read ({e}), so an earlier \
                     attempt of it cannot be ruled out"
                ),
            );
        }
    };
    // No attempt in the row that could have left. But this hub may be
    // posting the GUID now, for a telegram on another connection, its claim
    // still on its way to the journal (looked at after the read, so that a
    // flight that began during it is seen), or have posted it since the
    // read: that POST may move money.
    let not_sent = || {
        if hub.posting(guid) || waiting.ended(guid) != ended_before {
            return (
                Reply::code(Code::UNKNOWN),
                format!(
                    "not sent: {why}; this hub is posting the GUID, or has just posted it, for \
                     another telegram"
                ),
            );
        }
        (Reply::code(Code::NO_CAPACITY), format!("not sent: {why}"))
    };
    let Some(row) = row else {
        return not_sent();
    };
    if row.fingerprint != fingerprint(header.tx_code, body) {
        return (
            Reply::code(Code::FORMAT),
            guid_clash("already journaled with a different body or tx code"),
        );
    }
    match row.state {
        State::Done => (
            replay(&row),
            format!(
                "not sent: {why}; replayed the stored answer {}",
                row.code.as_deref().unwrap_or("?")
            ),
        ),
        State::NotSent => not_sent(),
        State::Unknown | State::Sending => (
            Reply::code(Code::UNKNOWN),
            format!(
                "not sent: {why}; the GUID's row says {}: an earlier attempt's outcome is \
                 not known",
                row.state.as_str()
            ),
        ),
    }
}

/// One transfer telegram that leads its GUID's flight.
struct Transfer<'a> {
    hub: &'a Hub,
    header: &'a Header<'a>,
    route: &'a Route,
    rules: &'a Rules,
    target: &'a Target,
    fields: &'a DecodedFields<'a>,
    fingerprint: &'a str,
    deadline: Deadline,
}

impl Transfer<'_> {
    fn guid(&self) -> &str {
        self.header.guid
    }

    async fn lead(&self) -> (Reply, String) {
        // A hub cut off from a shared journal stops posting before the
        // others may take its transfers over (docs/scale-out.md).
        if let Err(why) = self.hub.journal.may_send() {
            return Box::pin(self.not_claimed(why)).await;
        }
        // A resend that loses a race re-reads the row once; after that the row
        // is in flight elsewhere, which the `Sending` arm handles.
        for _ in 0..2 {
            let now = now_ms();
            // Attempt 1 (and every resend) starts at the first URL.
            let url = self.target.url_for(0);
            let grace_ms = Some(self.target.grace_ms());
            let claim = if let Some(why) = self.hub.journal.refusal() {
                match Box::pin(self.read_while_refused(why)).await {
                    Ok(row) => Bounded::Done(Ok(Claim::Existing(row))),
                    Err(answer) => return answer,
                }
            } else if let Some(store) = self.hub.journal.at_once() {
                let (g, tx, fp) = (self.guid(), &self.header.tx_code, self.fingerprint);
                let to = AttemptTo { url, grace_ms };
                match bounded::at_once(|| store.claim_to(g, tx, fp, to, now)) {
                    Ok(claim) => Bounded::Done(claim),
                    Err(panic) => Bounded::Failed(panic),
                }
            } else {
                let (journal, g, tx, fp, u) = (
                    self.hub.journal.clone(),
                    self.guid().to_string(),
                    self.header.tx_code.to_string(),
                    self.fingerprint.to_string(),
                    url.to_string(),
                );
                bounded::within(self.room_to_ask(), async move {
                    let to = AttemptTo { url: &u, grace_ms };
                    journal.claim_to(&g, &tx, &fp, to, now).await
                })
                .await
            };
            let row = match claim {
                // Boxed too, though the common path: the telegram's future
                // and this one each stay under 1 KiB, the largest block
                // glibc's per-thread cache keeps; a larger one costs a trip
                // to the shared arena, and a sweep of it, per telegram.
                Bounded::Done(Ok(Claim::New)) => return Box::pin(self.post(1)).await,
                Bounded::Done(Ok(Claim::Existing(row))) => row,
                Bounded::Done(Err(e)) => return Box::pin(self.not_claimed(e)).await,
                Bounded::Failed(e) => return Box::pin(self.not_claimed(e)).await,
                Bounded::Late(task) => {
                    let answer =
                        Box::pin(self.without_journal("the journal did not answer in time")).await;
                    // Watched from the answer on: released as of it.
                    settle::release_late_claim(self.hub.journal.clone(), self.guid(), async move {
                        matches!(task.await, Ok(Ok(Claim::New)))
                    });
                    return answer;
                }
            };
            if row.fingerprint != self.fingerprint {
                return (
                    Reply::code(Code::FORMAT),
                    guid_clash("already journaled with a different body or tx code"),
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
                // The rarer paths are boxed: a future holds the largest of
                // the futures it awaits, and a telegram's is copied into its
                // box once per telegram.
                State::Unknown => {
                    return Box::pin(self.settle(&row, &[State::Unknown])).await;
                }
                // In a journal of one hub, a `sending` row nobody in this process
                // works on was orphaned (an outcome write that failed): settle it
                // as a restart would, by inquiry.
                State::Sending if !self.hub.journal.is_shared() => {
                    return Box::pin(self.settle(&row, &[State::Sending])).await;
                }
                State::Sending => return Box::pin(self.other_hubs_attempt(&row)).await,
                State::NotSent => {
                    // A resend's claim is a durable write: a journal that
                    // refuses them would take an attempt (and its place
                    // under the maximum) for a POST it then does not allow.
                    if let Some(why) = self.hub.journal.refusal() {
                        return (bounded::claim_failed(), format!("not sent: {why}"));
                    }
                    match Box::pin(self.resend(&row, now)).await {
                        Resend::Post(attempt) => return Box::pin(self.post(attempt)).await,
                        Resend::Answer(reply, note) => return (reply, note),
                        Resend::LostRace => continue,
                    }
                }
            }
        }
        (
            Reply::code(Code::UNKNOWN),
            "GUID is being resent elsewhere".into(),
        )
    }

    /// The GUID's row, read instead of claimed while the journal refuses
    /// durable writes (until a restart: a failed fsync, a journal file gone).
    /// A GUID it holds is still answered from its row: a replay, an inquiry
    /// (before, its claim waited for an fsync that failed, and answered E903,
    /// "not sent", for a transfer that had moved money). A GUID it does not
    /// hold gets E903 with nothing written, so no row is left that a later
    /// resend would find `sending` and inquire about. A read that fails or is
    /// late is answered as a failed claim is (E901, or the core's final
    /// answer).
    async fn read_while_refused(&self, why: String) -> Result<Row, (Reply, String)> {
        let (journal, guid) = (self.hub.journal.clone(), self.guid().to_string());
        let read = bounded::within(self.room_to_ask(), async move { journal.get(&guid).await });
        match read.await {
            Bounded::Done(Ok(Some(row))) => Ok(row),
            Bounded::Done(Ok(None)) => Err(self.no_row(why)),
            Bounded::Done(Err(e)) => {
                let why = format!("{why}; reading the GUID's row failed too: {e}");
                Err(self.not_claimed(why).await)
            }
            Bounded::Failed(e) => Err(self.not_claimed(e).await),
            Bounded::Late(_) => Err(self
                .without_journal(&format!("{why}; the journal did not answer in time"))
                .await),
        }
    }

    /// Until when the journal is waited for on the way to a POST: the
    /// work deadline less a quarter of the time left (at most a second), so
    /// that a journal that does not answer still leaves the core's GET its
    /// time ([`Transfer::without_journal`]).
    fn room_to_ask(&self) -> Instant {
        let left = self.deadline.work.saturating_duration_since(Instant::now());
        self.deadline.work - (left / 4).min(Duration::from_secs(1))
    }

    /// The journal did not say, in time, what it knows of the GUID, or
    /// failed or refused the claim, or the hub is cut off from a shared
    /// journal: nothing is sent, but the GUID may have been sent before
    /// (this may be a resend of a transfer answered 0000, or of one whose
    /// POST is still on the wire, here or at another hub), so E903, "no money
    /// moved", is not the hub's to say. The core is asked, as an INQ001 would
    /// ask it, with the time left: its final answer is given (not journaled:
    /// the journal is what is stuck); anything else, "never received" and a
    /// GET that could not be sent included, is E901, since without the row
    /// the hub cannot tell an earlier attempt still on its way from none (an
    /// INQ001 does not take "never received" for proof without the row
    /// either). A 0000 is E901 too: the core's answer says nothing of the
    /// body, and without the row the hub cannot check this telegram's
    /// against the one processed (a GUID reused for another transfer would
    /// be told that it moved money; found by a review). An INQ001 gives the
    /// 0000, as the journal does once it answers. A new GUID's resend is
    /// posted once the journal takes claims again. (Before: E903, to resends
    /// of transfers that had moved money, after a stalled journal (found by
    /// black-box probes) and, until later, after a failed claim or a fence.)
    async fn without_journal(&self, why: &str) -> (Reply, String) {
        let outcome = inquire(
            self.target,
            self.guid(),
            None,
            &self.rules.codes,
            self.deadline.work,
        )
        .await;
        bounded::count_failure("claim");
        let (reply, outcome) = reply_for(outcome, &self.route.layout, &self.rules.codes);
        if reply.code == Code::OK {
            return (
                Reply::code(Code::UNKNOWN),
                format!(
                    "not sent: {why}; the core says the GUID was processed, and without the \
                     journal this telegram's body cannot be checked against that transfer's"
                ),
            );
        }
        if reply.code.is_final() {
            let note = format!(
                "not sent: {why}; the core's answer about the GUID: {}",
                describe(&outcome, 0)
            );
            return (reply, note);
        }
        (
            Reply::code(Code::UNKNOWN),
            format!(
                "not sent: {why}; without the journal an earlier attempt of the GUID cannot be \
                 ruled out, and the core's answer was not final: {}",
                describe(&outcome, 0)
            ),
        )
    }

    /// The journal refused or failed the claim, or the hub is cut off from
    /// a shared one: nothing is sent, and the answer is E901 without asking
    /// while this hub's own earlier call of the GUID still runs past its
    /// budget (the late-answer window), else the core's word as
    /// [`Transfer::without_journal`] gives it. (Before: E903 unless this hub's
    /// own call still ran.)
    async fn not_claimed(&self, why: impl std::fmt::Display) -> (Reply, String) {
        match self.own_call_running(&why) {
            Some(answer) => answer,
            None => self.without_journal(&why.to_string()).await,
        }
    }

    /// The journal was read and holds no row of the GUID, but refuses to
    /// write one: no attempt of it was made, nothing is sent, E903; or E901
    /// while this hub's own earlier call of the GUID still runs past its
    /// budget.
    fn no_row(&self, why: impl std::fmt::Display) -> (Reply, String) {
        self.own_call_running(&why)
            .unwrap_or_else(|| (bounded::claim_failed(), format!("not sent: {why}")))
    }

    /// E901, counted as a failed claim, while this hub's own earlier call of
    /// the GUID still runs past its budget: its POST may yet move money.
    fn own_call_running(&self, why: &impl std::fmt::Display) -> Option<(Reply, String)> {
        if !self.hub.late_calls.running(self.guid()) {
            return None;
        }
        bounded::count_failure("claim");
        Some((
            Reply::code(Code::UNKNOWN),
            format!(
                "not sent: {why}; this hub's earlier call of the GUID is still running, \
                 so its outcome is not known"
            ),
        ))
    }

    /// Asks the core about the row's transfer instead of posting (E901 before).
    async fn settle(&self, row: &Row, from: &'static [State]) -> (Reply, String) {
        settle::after_unknown(self.hub, row, self.route, self.rules, self.deadline, from).await
    }

    /// A resend of a GUID that was certainly not sent: allowed by the policy
    /// (maximum, cooldown), then claimed by a compare-and-set on the attempts.
    async fn resend(&self, row: &Row, now: i64) -> Resend {
        let policy = self.hub.policy;
        let allowed = attempts_allowed(policy.max_resends);
        if row.attempts >= allowed {
            info!(attempts = row.attempts, "resend refused: past the maximum");
            return Resend::Answer(
                Reply::code(Code::RESEND_REFUSED),
                format!(
                    "resend refused: {} attempts made, at most {allowed} allowed",
                    row.attempts
                ),
            );
        }
        let since = now - row.answered_ms.unwrap_or(row.last_attempt_ms);
        let cooldown = policy.cooldown.as_millis() as i64;
        if since < cooldown {
            info!(since_ms = since, "resend refused: inside the cooldown");
            return Resend::Answer(
                Reply::code(Code::RESEND_REFUSED),
                format!(
                    "resend refused: {since} ms after the previous answer, cooldown is {cooldown} ms"
                ),
            );
        }
        let (journal, g, attempts, u) = (
            self.hub.journal.clone(),
            self.guid().to_string(),
            row.attempts,
            self.target.url_for(0).to_string(),
        );
        let grace_ms = Some(self.target.grace_ms());
        let claimed = bounded::within(self.deadline.work, async move {
            let to = AttemptTo { url: &u, grace_ms };
            journal.claim_resend_to(&g, attempts, to, now).await
        })
        .await;
        match claimed {
            Bounded::Done(Ok(true)) => Resend::Post(row.attempts + 1),
            Bounded::Done(Ok(false)) => Resend::LostRace,
            Bounded::Done(Err(e)) => {
                Resend::Answer(bounded::claim_failed(), format!("not sent: {e}"))
            }
            Bounded::Failed(e) => Resend::Answer(bounded::claim_failed(), format!("not sent: {e}")),
            Bounded::Late(task) => {
                settle::release_late_claim(self.hub.journal.clone(), self.guid(), async move {
                    matches!(task.await, Ok(Ok(true)))
                });
                Resend::Answer(
                    bounded::claim_failed(),
                    "not sent: the journal did not answer within the budget".into(),
                )
            }
        }
    }

    /// The row is `sending` in a shared journal and not ours: another hub has
    /// it (or had it, and died less than its dead-after ago). Ask the core at
    /// once (a GET is always safe): a final answer is journaled and given,
    /// whoever owns the row. Otherwise ("processing", "never received" while
    /// the owner may still be posting, no answer) wait for the owner's
    /// outcome within the budget; a row whose owner dies is taken over by the
    /// claim of a later resend.
    async fn other_hubs_attempt(&self, row: &Row) -> (Reply, String) {
        let (target, pin, _) = settle::ask_where(self.hub, self.route, row.url.as_deref());
        let outcome = inquire(
            target,
            self.guid(),
            pin,
            &self.rules.codes,
            self.deadline.work,
        )
        .await;
        let why = match outcome {
            o @ (Outcome::Processed(_) | Outcome::Rejected(_) | Outcome::TargetError(_)) => {
                let (reply, outcome) = reply_for(o, &self.route.layout, &self.rules.codes);
                if reply.code.is_final() {
                    let note = format!(
                        "asked the core about another hub's attempt: {}",
                        describe(&outcome, 0)
                    );
                    let finish = finish_of(&reply, &outcome, note.clone());
                    settle::settle_write(
                        &self.hub.journal,
                        self.guid(),
                        &[State::Sending, State::Unknown],
                        finish,
                        self.deadline,
                    )
                    .await;
                    return (reply, note);
                }
                "the core's answer was not final".to_string()
            }
            Outcome::NeverReceived => "the core has not received it (yet)".to_string(),
            Outcome::Unknown(r) | Outcome::NotSent(r) | Outcome::NoCapacity(r) => r,
        };
        debug!(%why, "another hub's attempt is not settled at the core; waiting for its outcome");
        self.await_other().await
    }

    /// Waits for another hub's outcome within the budget.
    async fn await_other(&self) -> (Reply, String) {
        let step = Duration::from_millis(20);
        loop {
            if !fits(step, self.deadline.work) {
                return (
                    Reply::code(Code::UNKNOWN),
                    "GUID in flight elsewhere past the budget".into(),
                );
            }
            tokio::time::sleep(step).await;
            let (journal, g) = (self.hub.journal.clone(), self.guid().to_string());
            let read =
                bounded::within(self.deadline.work, async move { journal.get(&g).await }).await;
            let row = match read {
                Bounded::Done(Ok(Some(row))) => row,
                Bounded::Done(Ok(None)) => continue,
                Bounded::Done(Err(e)) => {
                    return (Reply::code(Code::UNKNOWN), format!("journal: {e}"));
                }
                Bounded::Failed(e) => return (Reply::code(Code::UNKNOWN), format!("journal: {e}")),
                Bounded::Late(_) => {
                    return (
                        Reply::code(Code::UNKNOWN),
                        "journal: no answer within the budget".into(),
                    );
                }
            };
            match row.state {
                State::Done => {
                    return (
                        replay(&row),
                        "answer of the attempt in flight elsewhere".into(),
                    );
                }
                State::Unknown => {
                    return self.settle(&row, &[State::Unknown]).await;
                }
                State::NotSent => {
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
                State::Sending => continue,
            }
        }
    }

    /// Posts attempt `attempt` of a claimed GUID and journals the outcome.
    async fn post(&self, attempt: u32) -> (Reply, String) {
        let guid = self.guid();
        let target = self.target;
        let deadline = self.deadline;
        let request = CoreRequest::Transfer {
            guid: Arc::from(guid),
            json: Arc::from(transfer_body(
                self.header.guid,
                self.header.channel_id,
                self.fields,
            )),
        };
        let started = Instant::now();
        let mut tries = 0u32;
        // The URL the claim recorded; a failover records the next one first.
        let mut url = target.url_for(0);
        // How the call ended, as the reply and the outcome it stands for.
        let ended = |o| reply_for(o, &self.route.layout, &self.rules.codes);
        let (reply, outcome) = loop {
            // Checked before every attempt (and again by the send gate at its
            // first byte): a hub that lost its liveness sends nothing more
            // (the others may take the row over).
            if let Err(why) = self.hub.journal.may_send() {
                break ended(Outcome::NoCapacity(why));
            }
            match target.attempt_at(&request, url, deadline.work).await {
                CallEnd::Done(Ok(answer)) => {
                    if answer.replayed {
                        debug!("the core replayed its stored answer");
                    }
                    if answer.status == 401 || answer.status == 403 {
                        tracing::error!(target_name = %target.name, status = answer.status, "the core refused the hub's credentials: check the target's auth configuration");
                    }
                    // Read once, for the code and the reply's body.
                    break reply_to_transfer(
                        answer.status,
                        &answer.body,
                        &self.route.layout,
                        &self.rules.codes,
                    );
                }
                CallEnd::Done(Err(CallFailure::MaybeSent(r))) => break ended(Outcome::Unknown(r)),
                CallEnd::Done(Err(CallFailure::NoCapacity(r))) => {
                    break ended(Outcome::NoCapacity(r));
                }
                CallEnd::Done(Err(CallFailure::NotSent(r))) => {
                    tries += 1;
                    // Nothing left the hub: retry (on the next endpoint) if it fits.
                    let pause = target.backoff(tries);
                    if tries >= target.connect_attempts || !fits(pause, deadline.work) {
                        break ended(Outcome::NotSent(r));
                    }
                    let next = target.url_for(tries);
                    if next != url {
                        // Write-ahead: the journal names a URL before a byte goes there.
                        match self.note_url(next).await {
                            Ok(()) => url = next,
                            Err(e) => {
                                break ended(Outcome::NotSent(format!("{r}; no failover: {e}")));
                            }
                        }
                    }
                    metrics::counter!(metric_names::CORE_RETRIES, "target" => target.name.clone(), "operation" => "transfer").increment(1);
                    debug!(%r, "not sent; retrying");
                    tokio::time::sleep(pause).await;
                }
                CallEnd::Pending(late) => {
                    settle::record_late(
                        self.hub.journal.clone(),
                        self.hub.late_calls.clone(),
                        guid.to_string(),
                        self.route.layout.clone(),
                        self.rules.codes.clone(),
                        late,
                    );
                    let note = if target.late_window().is_zero() {
                        "no answer within the budget; the call ends with it (late_answer_window_ms = 0)"
                    } else {
                        "no answer within the budget; the call goes on for late answers"
                    };
                    break ended(Outcome::Unknown(note.into()));
                }
            }
        };
        target.meters.record(&target.name, false, started.elapsed());
        // Phase timing for the telegram's summary line.
        crate::telegram_log::record_core_ms(started.elapsed().as_millis() as u64);
        let note = describe(&outcome, attempt);
        let mut finish = finish_of(&reply, &outcome, note.clone());
        // Only onto this attempt, even when retried in the background.
        finish.attempt = Some(attempt);
        let durable = finish.must_be_durable();
        if !self.journal_outcome(finish).await && durable {
            // An E500 not on disk could be lost to a power loss, and the
            // core may hold no record of it: "never received" would then
            // let a resend be posted. Not final until written (found by a
            // review).
            return (
                Reply::code(Code::UNKNOWN),
                format!("{note}; E901, not E500, until that outcome is on disk"),
            );
        }
        (reply, note)
    }

    /// Records a failover's URL before the first byte goes there.
    async fn note_url(&self, url: &str) -> Result<(), String> {
        let (journal, g, u) = (
            self.hub.journal.clone(),
            self.guid().to_string(),
            url.to_string(),
        );
        match bounded::within(self.deadline.work, async move {
            journal.note_url(&g, &u, now_ms()).await
        })
        .await
        {
            Bounded::Done(Ok(true)) => Ok(()),
            Bounded::Done(Ok(false)) => Err("the row is no longer sending".into()),
            Bounded::Done(Err(e)) => Err(e.to_string()),
            Bounded::Failed(e) => Err(e),
            // Not known to be written: the next URL must not be tried.
            Bounded::Late(_) => Err("the journal did not answer within the budget".into()),
        }
    }

    /// Journals the outcome within the telegram's deadline; whether it was
    /// written. The answer is the truth either way (but see
    /// [`Finish::must_be_durable`]); a write that failed or outlived the
    /// budget is finished in the background.
    async fn journal_outcome(&self, finish: Finish) -> bool {
        if let Some(store) = self.hub.journal.at_once() {
            let guid = self.guid();
            let failed = match bounded::at_once(|| {
                store.finish_if(guid, &[State::Sending], finish, now_ms())
            }) {
                Ok(Ok(true)) => return true,
                Ok(Ok(false)) => {
                    info!("outcome not journaled: the row had been changed meanwhile");
                    return false;
                }
                Ok(Err(e)) => e.to_string(),
                Err(panic) => panic,
            };
            // Only a bug fails a store in memory, and a retry would meet it
            // again: the row stays `sending`, which a repeat of the GUID
            // settles by inquiry, as after any outcome that was not written.
            bounded::count_failure("outcome");
            warn!(e = %failed, "could not journal the outcome");
            return false;
        }
        let (journal, g, f) = (
            self.hub.journal.clone(),
            self.guid().to_string(),
            finish.clone(),
        );
        let written = bounded::within(self.deadline.reply, async move {
            journal.finish_if(&g, &[State::Sending], f, now_ms()).await
        })
        .await;
        let pending = match written {
            Bounded::Done(Ok(true)) => return true,
            Bounded::Done(Ok(false)) => {
                info!("outcome not journaled: the row had been changed meanwhile");
                return false;
            }
            Bounded::Done(Err(e)) => {
                bounded::count_failure("outcome");
                warn!(%e, "could not journal the outcome; retrying in the background");
                None
            }
            Bounded::Failed(e) => {
                bounded::count_failure("outcome");
                warn!(%e, "could not journal the outcome; retrying in the background");
                None
            }
            Bounded::Late(task) => {
                bounded::count_failure("outcome");
                warn!("journaling the outcome outlived the budget; it completes in the background");
                Some(task)
            }
        };
        settle::finish_later(
            self.hub.journal.clone(),
            self.guid().to_string(),
            finish,
            pending,
        );
        false
    }
}

/// Attempts a GUID may have in all: the first and `max_resends` more (no
/// limit past `u32::MAX`, which no GUID reaches).
fn attempts_allowed(max_resends: u32) -> u32 {
    max_resends.saturating_add(1)
}

/// What the resend policy and the resend claim decided.
enum Resend {
    Post(u32),
    Answer(Reply, String),
    LostRace,
}

/// The E102 note of a GUID clash: it names the GUID's field.
fn guid_clash(what: &str) -> String {
    crate::header::HeaderError::new("guid", crate::header::GUID.start, what).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::FieldValue;
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    /// A TRF001 telegram of the GUID and amount, from IBANK.
    fn telegram(guid: &str, amount: u64) -> Vec<u8> {
        super::super::test_transfer(guid, amount)
    }

    /// A test hub on a SQLite journal of its own (kept while the folder is).
    fn sqlite_hub(
        core_url: String,
    ) -> (
        tempfile::TempDir,
        crate::journal::sqlite::SqliteJournal,
        super::super::Hub,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = crate::journal::sqlite::SqliteJournal::open(&dir.path().join("j.db"), 64)
            .expect("a journal");
        let journal = crate::journal::Journal::Sqlite(sqlite.clone());
        let hub = super::super::test_hub_on(core_url, journal);
        (dir, sqlite, hub)
    }

    /// With the SQLite journal, a transfer that waits for room on its
    /// connection has its row read while it waits, and when its budget runs
    /// out before its turn it is answered from that read, without waiting
    /// for the journal then (a probe: thousands of such reads, due at once,
    /// answered past the budget, or E901 for GUIDs never sent). A flight of
    /// the GUID since the read, which may have claimed it, makes the row be
    /// read again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_transfer_is_answered_from_its_row_read_while_it_waited() {
        let (_dir, sqlite, hub) = sqlite_hub("http://127.0.0.1:9".into());
        let never = "20261204IBANK0000000000AHEAD0001";
        let done = "20261204IBANK0000000000AHEAD0002";
        let (t_never, t_done) = (telegram(never, 10), telegram(done, 10));
        let body = |t: &[u8]| t[crate::header::HEADER_LEN..].to_vec();
        let fp = fingerprint("TRF001", &body(&t_done));
        let to = AttemptTo::url("http://127.0.0.1:9");
        let claim = hub.journal.claim_to(done, "TRF001", &fp, to, 1).await;
        assert_eq!(claim.unwrap(), Claim::New);
        let stored = Finish {
            state: State::Done,
            code: "0000".into(),
            answer: Some(b"stored answer".to_vec()),
            error: None,
            note: "set by the test".into(),
            attempt: None,
        };
        hub.journal.finish(done, stored, 2).await.unwrap();

        for guid in [never, done] {
            assert!(hub.waiting_to_start("TRF001", guid), "a transfer waits");
            let ahead = hub.flights.waiting.read_ahead(guid).expect("read ahead");
            ahead.row.wait().await;
        }
        // The journal answers nothing from now on.
        let release = sqlite.pause().await;
        let ask = |t: Vec<u8>| {
            let hub = &hub;
            async move {
                let header = crate::header::parse_header(&t).unwrap();
                let until = Instant::now() + Duration::from_millis(200);
                taken_no_further(hub, &header, &body(&t), "a test", until).await
            }
        };
        let (reply, note) = ask(t_never.clone()).await;
        assert_eq!(reply.code, Code::NO_CAPACITY, "{note}");
        let (reply, note) = ask(t_done.clone()).await;
        assert_eq!(reply.code, Code::OK, "{note}");
        assert_eq!(reply.body, b"stored answer", "{note}");
        assert!(note.contains("replayed the stored answer 0000"), "{note}");
        // Another body: E102 from the row read ahead too.
        let (reply, note) = ask(telegram(done, 11)).await;
        assert_eq!(reply.code, Code::FORMAT, "{note}");

        // A flight of the GUID began and ended since: its claim may be in
        // the row, so the row is read again, which the journal does not
        // answer in time: E901.
        let lead = hub
            .flights
            .join(never, &fingerprint("TRF001", &body(&t_never)));
        assert!(matches!(lead, Joined::Lead(_)));
        let (reply, note) = ask(t_never.clone()).await;
        assert_eq!(reply.code, Code::UNKNOWN, "while it runs: {note}");
        drop(lead);
        let (reply, note) = ask(t_never.clone()).await;
        assert_eq!(reply.code, Code::UNKNOWN, "{note}");
        assert!(note.contains("could not be read"), "{note}");
        drop(release);
        for guid in [never, done] {
            hub.no_longer_waiting(guid);
            assert!(
                hub.flights.waiting.read_ahead(guid).is_none(),
                "gone with its telegram"
            );
        }
    }

    /// SQLite's read ahead waits half the time to the telegram's last
    /// start (700 ms of this hub's 1500 ms budget): a transfer given room
    /// sooner costs no read (its row is read only if it still waits then),
    /// and one that waits longer has it read well before its last start.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_transfers_row_is_read_after_half_its_wait() {
        let (_dir, sqlite, hub) = sqlite_hub("http://127.0.0.1:9".into());
        let guid = "20261205IBANK0000000000AHEAD0009";
        let start = Instant::now();
        let half = (hub.last_start(start) - start) / 2;
        assert!(hub.waiting_to_start("TRF001", guid), "a transfer waits");
        let ahead = hub.flights.waiting.read_ahead(guid).expect("read ahead");
        // A read queued behind any the read ahead made at once: the
        // journal's commands run in their order, so that one would have
        // ended, and its row been set, by the time this one has.
        sqlite
            .get("20261205IBANK0000000000OTHER0009")
            .await
            .unwrap();
        tokio::task::yield_now().await;
        let checked = start.elapsed();
        assert!(
            ahead.row.get().is_none() || checked >= half,
            "read {checked:?} after the telegram began to wait"
        );
        assert_eq!(ahead.row.wait().await, &None, "read then: no row");
        assert!(start.elapsed() >= half, "read after {:?}", start.elapsed());
        hub.no_longer_waiting(guid);
    }

    /// A whole transfer of the GUID, on another connection, between the
    /// read of its row (none) and the look at what this hub posts: the
    /// telegram taken no further must not say "not sent" (found by a
    /// review: E903 for a GUID whose row said 0000).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transfer_posted_between_the_read_and_the_answer_is_not_told_not_sent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let core = corebank::start(listener, corebank::default_seed()).await;
        let (_dir, sqlite, hub) = sqlite_hub(core.url());
        let guid = "20261204IBANK0000000000RACE00001";
        let t = telegram(guid, 10);
        let header = crate::header::parse_header(&t).unwrap();
        let body = t[crate::header::HEADER_LEN..].to_vec();
        // The answer's read of the row is queued behind a paused writer...
        let release = sqlite.pause().await;
        let until = Instant::now() + Duration::from_secs(5);
        let mut answer = Box::pin(taken_no_further(&hub, &header, &body, "a test", until));
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(answer.as_mut().poll(cx)));
        assert!(first.await.is_pending(), "waits for its read");
        // ...and answered (none) once it goes on: the writer runs its queue
        // in order, so a read queued after it is answered after it.
        drop(release);
        hub.journal
            .get("20261204IBANK0000000000RACE00002")
            .await
            .unwrap();
        // Then the transfer runs whole on another connection, before the
        // answer's task runs again.
        let peer = std::net::IpAddr::from([127, 0, 0, 1]);
        let (_, sent) = hub.handle(&t, peer, None, Instant::now()).await;
        assert_eq!(sent.code, Code::OK, "the money moved");
        let (reply, note) = answer.await;
        assert_eq!(reply.code, Code::UNKNOWN, "{note}");
        assert!(note.contains("has just posted it"), "{note}");
    }

    /// A telegram whose turn comes with less than its last start's margin
    /// of work time left (a tenth of the budget, at most 50 ms) is taken no
    /// further: nothing claimed, nothing sent, E903 (before, it was claimed
    /// and posted with 0-1 ms left, and the money moved under an E901; a
    /// black-box probe).
    #[tokio::test]
    async fn a_telegram_too_late_to_start_is_not_sent() {
        // Budget 1500 ms: the last start is at 1400 ms, the work ends at 1450.
        let hub = super::super::test_hub("http://127.0.0.1:9".into());
        let guid = "20261204IBANK000000000000LATE001";
        let read_at = Instant::now() - Duration::from_millis(1420);
        let peer = std::net::IpAddr::from([127, 0, 0, 1]);
        let (_, reply) = hub.handle(&telegram(guid, 10), peer, None, read_at).await;
        assert_eq!(reply.code, Code::NO_CAPACITY);
        assert!(
            hub.journal.get(guid).await.unwrap().is_none(),
            "not claimed"
        );
        // With time to start, it is claimed and sent (here to no core: E902).
        let guid = "20261204IBANK000000000000LATE002";
        let read_at = Instant::now() - Duration::from_millis(1000);
        let (_, reply) = hub.handle(&telegram(guid, 10), peer, None, read_at).await;
        assert_eq!(reply.code, Code::NOT_SENT);
        assert!(hub.journal.get(guid).await.unwrap().is_some(), "claimed");
    }

    /// With the memory journal, which answers in place, nothing is read ahead.
    #[tokio::test]
    async fn the_memory_journal_reads_nothing_ahead() {
        let hub = super::super::test_hub("http://127.0.0.1:9".into());
        assert!(hub.waiting_to_start("TRF001", "20261204IBANK0000000000AHEAD0003"));
        assert!(
            hub.flights
                .waiting
                .read_ahead("20261204IBANK0000000000AHEAD0003")
                .is_none()
        );
    }

    /// A transfer the hub takes no further (draining, or its budget gone
    /// before its turn) is answered for its GUID as the journal holds it:
    /// E903 only where no attempt of it could have moved money.
    #[tokio::test]
    async fn a_transfer_taken_no_further_is_answered_as_its_guid_stands() {
        let hub = super::super::test_hub("http://127.0.0.1:9".into());
        let store = hub.journal.at_once().expect("a memory journal");
        let outcome = |state: State, code: &str, answer: Option<&[u8]>| Finish {
            state,
            code: code.into(),
            answer: answer.map(<[u8]>::to_vec),
            error: None,
            note: "set by the test".into(),
            attempt: None,
        };
        let cases: [(&str, Option<Finish>, Code); 5] = [
            ("20261204IBANK0000000000NOROW0001", None, Code::NO_CAPACITY),
            (
                "20261204IBANK00000000000DONE0001",
                Some(outcome(State::Done, "0000", Some(b"stored answer"))),
                Code::OK,
            ),
            (
                "20261204IBANK000000000UNKNOWN001",
                Some(outcome(State::Unknown, "E901", None)),
                Code::UNKNOWN,
            ),
            (
                "20261204IBANK00000000NOTSENT0001",
                Some(outcome(State::NotSent, "E902", None)),
                Code::NO_CAPACITY,
            ),
            ("20261204IBANK00000000SENDING0001", None, Code::UNKNOWN),
        ];
        for (i, (guid, finish, want)) in cases.into_iter().enumerate() {
            let t = telegram(guid, 10);
            let header = crate::header::parse_header(&t).unwrap();
            let body = &t[crate::header::HEADER_LEN..];
            if i > 0 {
                let fp = fingerprint("TRF001", body);
                let to = AttemptTo::url("http://127.0.0.1:9");
                let claim = store.claim_to(guid, "TRF001", &fp, to, 1).unwrap();
                assert_eq!(claim, Claim::New);
                if let Some(f) = finish {
                    store.finish(guid, f, 2).unwrap();
                }
            }
            let until = Instant::now() + Duration::from_secs(1);
            let (reply, note) = taken_no_further(&hub, &header, body, "a test", until).await;
            assert_eq!(reply.code, want, "{guid}: {note}");
            if want == Code::OK {
                assert_eq!(reply.body, b"stored answer", "{note}");
            }
            assert!(note.starts_with("not sent: a test"), "{note}");
            // The same GUID with another body: E102, whatever its row says.
            let other = telegram(guid, 11);
            let (reply, note) = taken_no_further(
                &hub,
                &header,
                &other[crate::header::HEADER_LEN..],
                "a test",
                until,
            )
            .await;
            let clash = if i == 0 {
                Code::NO_CAPACITY
            } else {
                Code::FORMAT
            };
            assert_eq!(reply.code, clash, "{guid}: {note}");
        }
        assert!(
            hub.journal
                .get("20261204IBANK0000000000NOROW0001")
                .await
                .unwrap()
                .is_none(),
            "nothing journaled"
        );
        // A GUID this hub is leading a flight of (its claim not written yet,
        // its POST perhaps on its way): E901, whatever the row says.
        let guid = "20261204IBANK0000000000NOROW0001";
        let t = telegram(guid, 10);
        let header = crate::header::parse_header(&t).unwrap();
        let body = &t[crate::header::HEADER_LEN..];
        let lead = hub.flights.join(guid, &fingerprint("TRF001", body));
        assert!(matches!(lead, Joined::Lead(_)));
        let until = Instant::now() + Duration::from_secs(1);
        let (reply, note) = taken_no_further(&hub, &header, body, "a test", until).await;
        assert_eq!(reply.code, Code::UNKNOWN, "{note}");
        drop(lead);
        let (reply, note) = taken_no_further(&hub, &header, body, "a test", until).await;
        assert_eq!(reply.code, Code::NO_CAPACITY, "{note}");
    }

    /// Any configured maximum is a number of attempts, the largest too
    /// (it overflowed: a panic in a debug build, no resend at all in a
    /// release one).
    #[test]
    fn every_maximum_of_resends_allows_one_attempt_more() {
        assert_eq!(attempts_allowed(0), 1);
        assert_eq!(attempts_allowed(3), 4);
        assert_eq!(attempts_allowed(u32::MAX - 1), u32::MAX);
        assert_eq!(attempts_allowed(u32::MAX), u32::MAX);
    }

    /// The body as an object built and serialized whole: the header's two
    /// keys, then the fields over them.
    fn body_as_an_object(guid: &str, channel_id: &str, fields: &Map<String, Value>) -> Vec<u8> {
        let mut json = Map::new();
        json.insert("guid".into(), Value::String(guid.into()));
        json.insert("channel_id".into(), Value::String(channel_id.into()));
        for (k, v) in fields {
            json.insert(k.clone(), v.clone());
        }
        serde_json::to_vec(&Value::Object(json)).unwrap()
    }

    /// A strategy's map of fields as decoded fields.
    fn decoded<'a>(
        fields: &'a std::collections::BTreeMap<String, FieldValue<'static>>,
    ) -> DecodedFields<'a> {
        DecodedFields::from_entries(
            fields
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .collect(),
        )
    }

    proptest! {
        #[test]
        fn the_transfer_body_is_the_object_of_header_and_fields(
            guid in "[ -~]{0,8}",
            channel in "[ -~\\u{80}-\\u{ff}]{0,8}",
            fields in proptest::collection::btree_map(
                prop_oneof!["[a-z_]{1,12}", Just("guid".to_string()), Just("channel_id".to_string()), Just("a".to_string()), Just("z".to_string())],
                prop_oneof![
                    any::<u64>().prop_map(FieldValue::Number),
                    "[ -~\\u{80}-\\u{ff}]{0,6}".prop_map(|s| FieldValue::Text(s.into())),
                ],
                0..8,
            ),
        ) {
            let fields = decoded(&fields);
            prop_assert_eq!(
                String::from_utf8(transfer_body(&guid, &channel, &fields)).unwrap(),
                String::from_utf8(body_as_an_object(&guid, &channel, &fields.to_map())).unwrap()
            );
        }
    }

    proptest! {
        /// A body with nothing to escape fits the buffer it is written
        /// into: writing it never grows (and copies) the buffer.
        #[test]
        fn a_body_without_escapes_is_written_without_growing(
            guid in "[a-zA-Z0-9]{0,40}",
            channel in "[A-Z]{0,8}",
            fields in proptest::collection::btree_map(
                "[a-z_]{1,16}",
                prop_oneof![
                    any::<u64>().prop_map(FieldValue::Number),
                    "[ !#-\\[\\]-~]{0,40}".prop_map(|s| FieldValue::Text(s.into())),
                ],
                0..24,
            ),
        ) {
            let fields = decoded(&fields);
            let body = transfer_body(&guid, &channel, &fields);
            let hint = body_len_hint(&guid, &channel, &fields);
            prop_assert!(body.len() <= hint, "{} bytes against a hint of {hint}", body.len());
            prop_assert_eq!(body.capacity(), hint);
        }
    }

    #[test]
    fn fingerprint_depends_on_tx_and_body() {
        assert_eq!(fingerprint("TRF001", b"a"), fingerprint("TRF001", b"a"));
        assert_ne!(fingerprint("TRF001", b"a"), fingerprint("TRF001", b"b"));
        assert_ne!(fingerprint("TRF001", b"a"), fingerprint("TRF002", b"a"));
    }

    #[test]
    fn fingerprint_is_the_lowercase_hex_sha256_journaled_rows_hold() {
        // SHA-256 of "TRF001\0a": rows written by earlier versions compare equal.
        assert_eq!(
            fingerprint("TRF001", b"a"),
            "da45717b6dd27a4ff9fef53c60734feef9af03b153b9763d07343a14ad23435c"
        );
    }
}
