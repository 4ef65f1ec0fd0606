//! Turning "don't know" into an answer, and keeping the journal's truth.
//!
//! * [`judge_never_received`]: what the core's "never received" proves about an
//!   attempt the hub made. It is the only licence for a new POST of a GUID that
//!   may have been sent, so it is a pure function, checked by the state-machine
//!   test (`tests/` "one rule" model) as well as end to end.
//! * [`after_unknown`]: a repeat of a GUID whose transfer is unknown (or whose
//!   `sending` row was orphaned) asks the core instead of posting.
//! * late answers, late claims and outcome writes that failed: each finishes in
//!   the background, and only ever moves a row forward from the state it was
//!   seen in (`finish_if`), so it never overwrites a newer truth.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, info, warn};

use super::bounded::{self, Bounded};
use super::reply::{describe, error_of, finish_of, reply_for, reply_to_transfer};
use super::{Deadline, Hub, Reply, core_inquiry};
use crate::core_client::{LateAnswer, Target};
use crate::journal::{Finish, Journal, JournalError, Row, State, now_ms};
use crate::layout::Layout;
use crate::outcome::{Code, CodeTable, Outcome};
use crate::rules::{Route, Rules};

/// What is known about the latest attempt of a GUID when the core says it
/// never received it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptFacts {
    /// This process's own call for the GUID is still running (late-answer
    /// window, or an outcome write still in progress).
    pub call_running: bool,
    /// The inquiry asked the URL the attempt was sent to.
    pub asked_attempt_url: bool,
    /// How long ago the attempt was claimed (journal clock).
    pub attempt_age: Duration,
    /// How old an attempt must be before "never received" is proof.
    pub wire_grace: Duration,
}

/// What a "never received" is worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Proof that the attempt never reached the core: E904, and the GUID may be
    /// posted again.
    NeverReceived,
    /// No proof: the transfer stays unknown (E901), for this reason.
    NoProof(&'static str),
}

/// Judges a "never received" from the core about an attempt the hub made.
pub fn judge_never_received(f: &AttemptFacts) -> Verdict {
    if f.call_running {
        Verdict::NoProof("the hub's own call is still running")
    } else if !f.asked_attempt_url {
        Verdict::NoProof("it was asked at another URL than the one the attempt went to")
    } else if f.attempt_age < f.wire_grace {
        Verdict::NoProof("the attempt is younger than the wire grace (it may still be on the wire)")
    } else {
        Verdict::NeverReceived
    }
}

/// Where to ask about an attempt recorded as sent to `attempt_url`: the URL to
/// pin the inquiry to (None: any, in failover order), and whether a "never
/// received" can then be about that attempt at all.
pub(super) fn ask_plan<'a>(
    target: &'a Target,
    attempt_url: Option<&str>,
) -> (Option<&'a str>, bool) {
    let urls = target.urls();
    match attempt_url {
        Some(u) => match urls.iter().find(|x| x.as_str() == u) {
            Some(x) => (Some(x.as_str()), true),
            // The target's URLs changed since: nobody can be asked for proof.
            None => (None, false),
        },
        // A row from before URLs were journaled: proof only from a target with one URL.
        None if urls.len() == 1 => (Some(urls[0].as_str()), true),
        None => (None, false),
    }
}

/// Which target to ask about an attempt recorded as sent to `attempt_url`,
/// and where ([`ask_plan`]): the route's target, unless a reload moved the
/// route to another target since the attempt; then the target that still
/// has that URL, so that its "never received" can be proof and its final
/// answer settles the row (before, the new target was asked, and the row
/// stayed unknown for as long as the route pointed there). A row from before
/// URLs were journaled names no URL to look for: the route's target is
/// asked, as [`ask_plan`] says.
pub(super) fn ask_where<'a>(
    hub: &'a Hub,
    route: &Route,
    attempt_url: Option<&str>,
) -> (&'a Target, Option<&'a str>, bool) {
    let target = hub.target(route);
    let (pin, asked_attempt_url) = ask_plan(target, attempt_url);
    if asked_attempt_url {
        return (target, pin, true);
    }
    let elsewhere = attempt_url.and_then(|u| {
        hub.targets()
            .iter()
            .find_map(|t| match ask_plan(t, Some(u)) {
                (Some(pin), true) => Some((&**t, Some(pin), true)),
                _ => None,
            })
    });
    elsewhere.unwrap_or((target, pin, false))
}

/// The wire grace a "never received" about `row`'s latest attempt must wait
/// out: the asking target's, or the one the attempt was stamped with when
/// longer (a hub or a reconcile with a shorter grace than the hub that made
/// the attempt must not settle it while its request may still be on its way).
/// Where the target's grace only stands in for one not known (an offline
/// reconcile without the hub's config), a stamped attempt's own grace is
/// enough: no call of this process can be running.
pub(super) fn grace_for(target: &Target, row: &Row) -> Duration {
    let stamped = row
        .grace_ms
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis);
    match stamped {
        Some(stamped) if target.wire_grace_is_fallback => stamped,
        Some(stamped) => target.wire_grace.max(stamped),
        None => target.wire_grace,
    }
}

/// How old the row's latest attempt is, on the clock the journal stamped it
/// with (the database's for a shared journal: hubs' clocks may differ), read
/// within the telegram's deadline. Err: the clock could not be read, so a
/// "never received" proves nothing.
pub(super) async fn attempt_age(
    journal: &Journal,
    row: &Row,
    deadline: Instant,
) -> Result<Duration, String> {
    // A journal of one hub stamps with this host's clock: no call needed.
    let now = if !journal.is_shared() {
        now_ms()
    } else {
        let j = journal.clone();
        match bounded::within(deadline, async move { j.clock_ms().await }).await {
            Bounded::Done(Ok(now)) => now,
            Bounded::Done(Err(e)) => return Err(e.to_string()),
            Bounded::Failed(e) => return Err(e),
            Bounded::Late(_) => return Err("no answer within the budget".into()),
        }
    };
    Ok(Duration::from_millis(
        u64::try_from(now.saturating_sub(row.last_attempt_ms)).unwrap_or(0),
    ))
}

/// GUIDs whose POST is still running in this process past the budget
/// (late-answer window): while one runs, "never received" proves nothing.
#[derive(Clone, Default)]
pub(super) struct LateCalls(Arc<Mutex<HashSet<String>>>);

impl LateCalls {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn begin(&self, guid: &str) {
        self.lock().insert(guid.to_string());
    }

    fn end(&self, guid: &str) {
        self.lock().remove(guid);
    }

    pub(super) fn running(&self, guid: &str) -> bool {
        self.lock().contains(guid)
    }
}

/// A repeat of a GUID whose transfer is unknown: ask the core instead of
/// posting, and journal what it settles. `from` are the states the row may be
/// settled from (`unknown`; also `sending` for a row orphaned in a journal of
/// one hub).
pub(super) async fn after_unknown(
    hub: &Hub,
    row: &Row,
    route: &Route,
    rules: &Rules,
    deadline: Deadline,
    from: &'static [State],
) -> (Reply, String) {
    let guid = row.guid.as_str();
    let (target, pin, asked_attempt_url) = ask_where(hub, route, row.url.as_deref());
    let outcome = core_inquiry::inquire(target, guid, pin, &rules.codes, deadline.work).await;
    let outcome = match outcome {
        Outcome::NeverReceived => match attempt_age(&hub.journal, row, deadline.work).await {
            Ok(attempt_age) => {
                let facts = AttemptFacts {
                    call_running: hub.late_calls.running(guid),
                    asked_attempt_url,
                    attempt_age,
                    wire_grace: grace_for(target, row),
                };
                match judge_never_received(&facts) {
                    Verdict::NeverReceived => Outcome::NeverReceived,
                    Verdict::NoProof(why) => {
                        Outcome::Unknown(format!("inquiry says never received, but {why}"))
                    }
                }
            }
            Err(e) => Outcome::Unknown(format!(
                "inquiry says never received, but the journal's clock could not be read: {e}"
            )),
        },
        // Whatever stopped the inquiry, the transfer itself is still unknown.
        Outcome::NotSent(r) | Outcome::NoCapacity(r) => {
            Outcome::Unknown(format!("inquiry not sent: {r}"))
        }
        o => o,
    };
    let (reply, outcome) = reply_for(outcome, &route.layout, &rules.codes);
    let note = format!("inquiry after unknown: {}", describe(&outcome, 0));
    if reply.code == Code::UNKNOWN {
        return (reply, note);
    }
    let mut finish = finish_of(&reply, &outcome, note.clone());
    // Judged from `row`: it applies only if the row is still at that
    // attempt (a reconcile may work from a list read minutes ago).
    finish.attempt = Some(row.attempts);
    let settled = settle_write(&hub.journal, guid, from, finish, deadline).await;
    if reply.code == Code::NEVER_RECEIVED && settled != Settled::Written {
        // "Never received" is proof about the row as it was read, and E904
        // tells the channel the next resend posts: only once the row says
        // `not_sent`. Since the read, another hub may have posted the
        // transfer, or own it within its lease.
        let (reply, outcome) = reply_for(not_journaled(settled), &route.layout, &rules.codes);
        return (
            reply,
            format!("inquiry after unknown: {}", describe(&outcome, 0)),
        );
    }
    (reply, note)
}

/// A "never received" that is not journaled as `not_sent` (`settled`): still
/// unknown, since E904 tells the channel its next resend posts.
pub(super) fn not_journaled(settled: Settled) -> Outcome {
    let why = match settled {
        Settled::Changed => {
            "the journal's row changed while the core was asked, or another hub's lease holds it"
        }
        _ => "it could not be journaled as not sent",
    };
    Outcome::Unknown(format!("inquiry says never received, but {why}"))
}

/// What became of an inquiry's answer in the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settled {
    Written,
    /// Not written: the row was no longer as it was read (settled, claimed
    /// again, or another hub's within its lease).
    Changed,
    /// Not written, or not known to be, within the budget.
    Failed,
}

/// Journals what an inquiry settled, within the telegram's deadline. A final
/// answer is the truth whatever the journal does, so a failure is counted and
/// logged only; a "never received" is acted on by the caller.
pub(super) async fn settle_write(
    journal: &Journal,
    guid: &str,
    from: &'static [State],
    finish: Finish,
    deadline: Deadline,
) -> Settled {
    let (j, g) = (journal.clone(), guid.to_string());
    match bounded::within(deadline.reply, async move {
        j.finish_if(&g, from, finish, now_ms()).await
    })
    .await
    {
        Bounded::Done(Ok(true)) => Settled::Written,
        Bounded::Done(Ok(false)) => {
            info!(
                "the inquiry's answer was not journaled: the row had changed meanwhile, or another hub's lease holds it"
            );
            Settled::Changed
        }
        Bounded::Done(Err(e)) => {
            bounded::count_failure("settle");
            warn!(%e, "could not journal the inquiry's answer");
            Settled::Failed
        }
        Bounded::Failed(e) => {
            bounded::count_failure("settle");
            warn!(%e, "could not journal the inquiry's answer");
            Settled::Failed
        }
        Bounded::Late(_) => {
            bounded::count_failure("settle");
            warn!(
                "journaling the inquiry's answer outlived the budget; it completes in the background"
            );
            Settled::Failed
        }
    }
}

/// Waits for a call that outlived the budget and journals what it says.
pub(super) fn record_late(
    journal: Journal,
    late_calls: LateCalls,
    guid: String,
    layout: Arc<Layout>,
    codes: CodeTable,
    late: LateAnswer,
) {
    late_calls.begin(&guid);
    tokio::spawn(async move {
        let result = late.await;
        let (reply, outcome) = match result {
            Ok(Ok(answer)) => reply_to_transfer(answer.status, &answer.body, &layout, &codes),
            Ok(Err(f)) => reply_for(Outcome::Unknown(format!("{f:?}")), &layout, &codes),
            Err(_) => reply_for(
                Outcome::Unknown("late call dropped".into()),
                &layout,
                &codes,
            ),
        };
        if !reply.code.is_final() {
            late_calls.end(&guid);
            info!(%guid, "late call ended without a readable answer; still unknown");
            return;
        }
        let finish = Finish {
            state: State::Done,
            code: reply.code.as_str().into(),
            answer: (!reply.body.is_empty()).then_some(reply.body),
            error: error_of(&outcome),
            note: format!("late answer: {}", describe(&outcome, 0)),
            attempt: None,
        };
        let written = journal
            .finish_if(&guid, &[State::Sending, State::Unknown], finish, now_ms())
            .await;
        // Only now: until the answer is journaled, the call counts as running.
        late_calls.end(&guid);
        match written {
            Ok(true) => info!(%guid, code = %reply.code, "late answer journaled"),
            Ok(false) => info!(
                %guid,
                code = %reply.code,
                "late answer not journaled: the row had already been settled"
            ),
            Err(e) => {
                bounded::count_failure("late_answer");
                warn!(%guid, %e, "could not journal a late answer")
            }
        }
    });
}

/// A claim that completed after the hub already answered (a first claim:
/// E901, or the core's final B-code or E500 about the GUID; a resend's: E903):
/// nothing was sent, so the row must say so, or the GUID would look in flight
/// forever. The row's code is E903 ("not sent") whatever the channel was
/// told; its note says why. It is answered as
/// of now, when the channel got its answer, not when the claim lands: the
/// resend cooldown counts from the answer the channel saw (before: from the
/// claim's landing, seconds later on a slow disk, so a resend after the
/// cooldown was refused E905; found by a black-box probe).
pub(super) fn release_late_claim(
    journal: Journal,
    guid: &str,
    claimed: impl std::future::Future<Output = bool> + Send + 'static,
) {
    let guid = guid.to_string();
    let answered_ms = now_ms();
    tokio::spawn(async move {
        if claimed.await {
            let finish = Finish {
                state: State::NotSent,
                code: Code::NO_CAPACITY.as_str().into(),
                answer: None,
                error: Some("journal slower than the budget".into()),
                note: "claimed after the budget ran out; nothing sent".into(),
                attempt: None,
            };
            if let Err(e) = journal
                .finish_if(&guid, &[State::Sending], finish, answered_ms)
                .await
            {
                bounded::count_failure("claim");
                warn!(%guid, %e, "could not release a late claim");
            }
        }
    });
}

/// An outcome that could not be journaled on the telegram path: retried in
/// the background. Until it lands, the row stays `sending`; in a journal of one
/// hub a repeat then settles it by inquiry (as after a restart).
pub(super) fn finish_later(
    journal: Journal,
    guid: String,
    finish: Finish,
    pending: Option<tokio::task::JoinHandle<Result<bool, JournalError>>>,
) {
    tokio::spawn(async move {
        if let Some(task) = pending
            && matches!(task.await, Ok(Ok(_)))
        {
            return;
        }
        let mut pause = Duration::from_millis(100);
        for _ in 0..6 {
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2);
            match journal
                .finish_if(&guid, &[State::Sending], finish.clone(), now_ms())
                .await
            {
                Ok(_) => {
                    info!(%guid, code = %finish.code, "outcome journaled on a retry");
                    return;
                }
                Err(e) => {
                    bounded::count_failure("outcome");
                    warn!(%guid, %e, "journaling the outcome failed again");
                }
            }
        }
        bounded::count_failure("outcome");
        error!(%guid, "outcome not journaled; the row stays sending and a repeat or INQ001 settles it by inquiry");
    });
}

/// Asks the core about every unknown transfer, and every orphaned one, and
/// journals what it says.
///
/// Orphaned: left `sending` in a journal of this hub alone, with no telegram
/// or late call of this hub on it: its outcome could not be journaled and
/// the retries gave up (the next start would take it for unknown). On a
/// shared journal another hub may be sending it; its lease decides.
pub(super) async fn reconcile(hub: &Hub) -> Result<Vec<(String, Code)>, JournalError> {
    let mut rows = hub.journal.list(State::Unknown, usize::MAX).await?;
    if !hub.journal.is_shared() {
        let sending = hub.journal.list(State::Sending, usize::MAX).await?;
        rows.extend(sending.into_iter().filter(|row| !hub.handles(&row.guid)));
    }
    let rules = hub.rules();
    let mut report = Vec::with_capacity(rows.len());
    for row in rows {
        let Some(route) = rules.route(&row.tx_code) else {
            // Still unknown, and counted so: it needs its route back.
            warn!(
                guid = %row.guid, tx = %row.tx_code,
                "not reconciled: no route for this tx code any more; left unknown until a config routes it again"
            );
            report.push((row.guid, Code::UNKNOWN));
            continue;
        };
        let deadline = Deadline::new(Instant::now(), hub.budget);
        let from: &'static [State] = match row.state {
            State::Sending => &[State::Sending],
            _ => &[State::Unknown],
        };
        let (reply, note) = after_unknown(hub, &row, route, &rules, deadline, from).await;
        if reply.code == Code::UNKNOWN {
            // Why it stays unknown decides what to do (wait, or ask at the
            // URL the attempt went to): said at WARN, which an offline
            // reconcile shows (found by a black-box probe).
            warn!(guid = %row.guid, "still unknown: {note}");
        } else {
            info!(guid = %row.guid, code = %reply.code, "{note}");
        }
        report.push((row.guid, reply.code));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> AttemptFacts {
        AttemptFacts {
            call_running: false,
            asked_attempt_url: true,
            attempt_age: Duration::from_secs(60),
            wire_grace: Duration::from_secs(35),
        }
    }

    /// A row left `sending` whose outcome was never journaled, on a live
    /// hub with nothing of it in flight, is settled by a reconcile like an
    /// unknown one; one that a telegram of this hub leads is left alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reconcile_settles_orphaned_sending_rows_and_not_led_ones() {
        let (core, hub) = super::super::core_and_hub().await;
        // Claimed two minutes ago (past the wire grace), never posted.
        let long_ago = now_ms() - 120_000;
        let (orphan, led) = (
            "20261202IBANK0000000000000ORPH01",
            "20261202IBANK0000000000000LEAD02",
        );
        for g in [orphan, led] {
            hub.journal
                .claim(g, "TRF001", "fingerprint", &core.url(), long_ago)
                .await
                .unwrap();
        }
        let lead = hub.flights.join(led, "fingerprint");
        assert!(matches!(lead, super::super::flights::Joined::Lead(_)));

        let report = hub.reconcile().await.unwrap();
        let codes: Vec<(&str, &str)> = report
            .iter()
            .map(|(g, c)| (g.as_str(), c.as_str()))
            .collect();
        assert_eq!(codes, [(orphan, "E904")], "only the orphan is reconciled");
        let state = |g: &'static str| {
            let journal = hub.journal.clone();
            async move { journal.get(g).await.unwrap().unwrap().state }
        };
        assert_eq!(state(orphan).await, State::NotSent);
        assert_eq!(state(led).await, State::Sending);
        drop(lead);
    }

    /// An attempt stamped with a longer grace than the asking hub's (made
    /// by a hub, or before a restart, with a longer late-answer window) is
    /// not settled by "never received" until that grace has passed; one
    /// stamped with a grace that has passed, or none, is (before, the
    /// asker's own grace decided, and the next resend could post while the
    /// first request was still on its way; found by a black-box probe).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn never_received_waits_out_the_grace_the_attempt_was_stamped_with() {
        let (core, hub) = super::super::core_and_hub().await;
        // Two minutes ago: past this hub's grace (budget + window + 5 s).
        let long_ago = now_ms() - 120_000;
        let cases = [
            ("20261203IBANK000000000000GRACE01", Some(600_000), "E901"),
            ("20261203IBANK000000000000GRACE02", Some(60_000), "E904"),
            ("20261203IBANK000000000000GRACE03", None, "E904"),
        ];
        for (g, grace_ms, _) in cases {
            let to = crate::journal::AttemptTo {
                url: &core.url(),
                grace_ms,
            };
            hub.journal
                .claim_to(g, "TRF001", "fingerprint", to, long_ago)
                .await
                .unwrap();
        }
        let report = hub.reconcile().await.unwrap();
        let mut got: Vec<(&str, &str)> = report
            .iter()
            .map(|(g, c)| (g.as_str(), c.as_str()))
            .collect();
        got.sort();
        let want: Vec<(&str, &str)> = cases.iter().map(|(g, _, c)| (*g, *c)).collect();
        assert_eq!(got, want);
        let row = hub.journal.get(cases[0].0).await.unwrap().unwrap();
        assert_eq!(row.grace_ms, Some(600_000));
        assert_eq!(row.state, State::Sending, "still in doubt");
    }

    /// An unknown row whose tx code lost its route (a reload took it away)
    /// cannot be asked about; it is reported still unknown, not skipped, so
    /// a reconcile's count of what is left says so (before, "0 still
    /// unknown"; found by a black-box probe).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unknown_row_without_a_route_is_reported_still_unknown() {
        let (core, hub) = super::super::core_and_hub().await;
        let g = "20261203IBANK0000000000000NORT01";
        let long_ago = now_ms() - 120_000;
        hub.journal
            .claim(g, "TRF077", "fingerprint", &core.url(), long_ago)
            .await
            .unwrap();
        let unknown = Finish {
            state: State::Unknown,
            code: "E901".into(),
            answer: None,
            error: Some("lost".into()),
            note: "test".into(),
            attempt: None,
        };
        hub.journal.finish(g, unknown, long_ago).await.unwrap();
        let report = hub.reconcile().await.unwrap();
        assert_eq!(report, [(g.to_string(), Code::UNKNOWN)]);
        let row = hub.journal.get(g).await.unwrap().unwrap();
        assert_eq!(row.state, State::Unknown);
        assert!(!core.stats().by_guid.contains_key(g), "the core was asked");
    }

    #[test]
    fn never_received_is_proof_only_when_every_condition_holds() {
        assert_eq!(judge_never_received(&facts()), Verdict::NeverReceived);
        for f in [
            AttemptFacts {
                call_running: true,
                ..facts()
            },
            AttemptFacts {
                asked_attempt_url: false,
                ..facts()
            },
            AttemptFacts {
                attempt_age: Duration::from_secs(34),
                ..facts()
            },
        ] {
            assert!(
                matches!(judge_never_received(&f), Verdict::NoProof(_)),
                "{f:?}"
            );
        }
    }
}
