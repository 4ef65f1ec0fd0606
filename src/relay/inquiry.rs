//! An INQ telegram: a channel asks what became of a transfer.

use tokio::time::Instant;
use tracing::warn;

use super::bounded::{self, Bounded};
use super::core_inquiry::inquire;
use super::reply::{describe, error_of, finish_of, replay, reply_for};
use super::settle::{self, AttemptFacts, Verdict, ask_where, attempt_age};
use super::{Deadline, Hub, Reply};
use crate::header::{HEADER_LEN, first_non_guid_byte};
use crate::journal::{Finish, Row, State};
use crate::layout::{DecodedFields, encode_fields};
use crate::outcome::{Code, Outcome};
use crate::rules::{Route, Rules};

/// The hub's record of the GUID asked about.
// One per inquiry, on its task's stack for the inquiry's life: a box would
// only add an allocation.
#[allow(clippy::large_enum_variant)]
pub(super) enum Record {
    Known(Option<Row>),
    /// The journal did not answer in time: a "never received" cannot be judged.
    Unavailable(String),
}

/// Answers an inquiry telegram.
pub(super) async fn run(
    hub: &Hub,
    route: &Route,
    rules: &Rules,
    fields: &DecodedFields<'_>,
    deadline: Deadline,
) -> (Reply, String) {
    let orig = fields.text("orig_guid").unwrap_or("");
    if let Some(at) = first_non_guid_byte(orig) {
        // Where the field is in the telegram: a layout may put it after others.
        let at = HEADER_LEN + route.layout.request_offset("orig_guid").unwrap_or(0) + at;
        return (
            Reply::code(Code::FORMAT),
            format!("field `orig_guid` at byte {at}: not a GUID of 32 [0-9A-Za-z_-]"),
        );
    }
    // Half of the time left, at most: a stalled journal must leave the GET
    // its time, since the core's answer is final without the record (only a
    // "never received" needs it, and is then E901).
    let now = Instant::now();
    let halfway = now + deadline.work.saturating_duration_since(now) / 2;
    let record = read_record(hub, orig, halfway).await;
    let (target, pin, asked_attempt_url) = match &record {
        Record::Known(Some(row)) => ask_where(hub, route, row.url.as_deref()),
        _ => (hub.target(route), None, true),
    };
    // A transfer of this GUID handled by this hub around the inquiry: its
    // claim may not be in the journal yet (or a resend may be claiming a
    // `not_sent` row), and its POST may follow the GET.
    let own_call = |hub: &Hub| hub.handles(orig);
    let own_call_before = own_call(hub);
    let mut outcome = inquire(target, orig, pin, &rules.codes, deadline.work).await;
    if outcome == Outcome::NeverReceived {
        let call_running = own_call_before || own_call(hub);
        // A whole transfer may have been claimed, sent and answered while
        // the GET was out (its flight gone again by now): the journal says.
        let unchanged = match &record {
            Record::Known(row) => match read_record(hub, orig, deadline.work).await {
                Record::Known(now) => attempt_of(row) == attempt_of(&now),
                Record::Unavailable(_) => false,
            },
            Record::Unavailable(_) => true,
        };
        let verdict = match &record {
            Record::Unavailable(_) => Verdict::NoProof("the hub's journal could not be read"),
            _ if !unchanged => Verdict::NoProof("a transfer of it began while the core was asked"),
            Record::Known(Some(row)) if matches!(row.state, State::Sending | State::Unknown) => {
                match attempt_age(&hub.journal, row, deadline.work).await {
                    Ok(attempt_age) => settle::judge_never_received(&AttemptFacts {
                        call_running,
                        asked_attempt_url,
                        attempt_age,
                        wire_grace: settle::grace_for(target, row),
                    }),
                    Err(_) => Verdict::NoProof("the journal's clock could not be read"),
                }
            }
            // No attempt of it (nothing of this hub can be on the wire), or
            // one settled or never sent (the journal holds the truth), and no
            // transfer of it under way here.
            Record::Known(_) if !call_running => Verdict::NeverReceived,
            Record::Known(_) => Verdict::NoProof("the hub's own call is still running"),
        };
        if let Verdict::NoProof(why) = verdict {
            outcome = Outcome::Unknown(format!("inquiry says never received, but {why}"));
        }
    }
    let (mut reply, mut outcome) = reply_for(outcome, &route.layout, &rules.codes);
    // A row the core's final answer settled keeps that answer for every
    // resend: a "never received" (a core that failed before applying, with
    // its E500; or one that has lost the GUID) must not tell the channel
    // that a resend will post (found by a black-box probe).
    if reply.code == Code::NEVER_RECEIVED
        && let Record::Known(Some(row)) = &record
        && row.state == State::Done
    {
        (reply, outcome) = answer_settled(row);
    }
    // An answer that settles an unknown (or orphaned) transfer is journaled
    // too: a final answer, or a "never received" (the row then says
    // `not_sent`, so the channel's resend posts, as E904 tells it).
    if let Record::Known(Some(row)) = &record
        && matches!(row.state, State::Unknown | State::Sending)
    {
        let from: &'static [State] = if row.state == State::Sending {
            &[State::Sending]
        } else {
            &[State::Unknown]
        };
        if row.state == State::Sending && !orphaned(hub, row, orig) {
            // Another hub's attempt (a shared journal), or one of this hub's
            // that began meanwhile, holds the row: it is not settled here, so
            // the channel's next resend would not post, as E904 would tell it.
            if reply.code == Code::NEVER_RECEIVED {
                (reply, outcome) = reply_for(
                    settle::not_journaled(settle::Settled::Changed),
                    &route.layout,
                    &rules.codes,
                );
            }
        } else if reply.code.is_final() {
            let body = rules.route(&row.tx_code).and_then(|r| match &outcome {
                Outcome::Processed(answer) => {
                    encode_fields(&r.layout.response, &answer.fields(), HEADER_LEN).ok()
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
                    attempt: None,
                };
                settle::settle_write(&hub.journal, orig, from, finish, deadline).await;
            } else {
                // Processed, but without the body a resend would replay: the
                // row stays unknown (the channel's answer is still true), and
                // the operator sees why the unknown count did not fall (found
                // by a black-box probe).
                let why = match rules.route(&row.tx_code) {
                    None => format!("{} has no route any more", row.tx_code),
                    Some(_) => format!("the answer does not fit {}'s response layout", row.tx_code),
                };
                warn!(
                    orig_guid = orig,
                    "inquiry: the core says processed, but the transfer stays unknown in the \
                     journal: {why}, so no answer can be stored for a resend to replay; \
                     relayhub journal reconcile names it too"
                );
            }
        } else if reply.code == Code::NEVER_RECEIVED {
            let mut finish = finish_of(&reply, &outcome, "settled by an inquiry telegram".into());
            // Judged from `row`: only if the row is still at that attempt.
            finish.attempt = Some(row.attempts);
            let settled = settle::settle_write(&hub.journal, orig, from, finish, deadline).await;
            if settled != settle::Settled::Written {
                // E904 says the next resend posts: only once the row says so.
                (reply, outcome) =
                    reply_for(settle::not_journaled(settled), &route.layout, &rules.codes);
            }
        }
    }
    let mut note = format!("inquiry for {orig}: {}", describe(&outcome, 0));
    if let Record::Unavailable(e) = &record {
        note.push_str(&format!(" (journal: {e})"));
    }
    (reply, note)
}

/// The inquiry's answer about a GUID the journal holds as settled by the
/// core's final answer, when the core now says it never received it: that
/// final code (E500, a B-code), as a resend would replay it; E901 for a
/// transfer journaled as processed (0000), whose answer the inquiry's own
/// layout does not carry, and which the core should know.
fn answer_settled(row: &Row) -> (Reply, Outcome) {
    let stored = replay(row).code;
    let why = format!(
        "the core says it never received it, but the journal holds its final answer {stored}"
    );
    if stored == Code::OK || !stored.is_final() {
        warn!(orig_guid = %row.guid, "inquiry: {why}; answered E901: the core and the journal disagree");
        (Reply::code(Code::UNKNOWN), Outcome::Unknown(why))
    } else if stored == Code::TARGET_ERROR {
        (Reply::code(stored), Outcome::TargetError(why))
    } else {
        (Reply::code(stored), Outcome::Rejected(why))
    }
}

/// The hub's record of `guid`, read by `by`.
pub(super) async fn read_record(hub: &Hub, guid: &str, by: Instant) -> Record {
    let (journal, g) = (hub.journal.clone(), guid.to_string());
    match bounded::within(by, async move { journal.get(&g).await }).await {
        Bounded::Done(Ok(row)) => Record::Known(row),
        Bounded::Done(Err(e)) => Record::Unavailable(e.to_string()),
        Bounded::Failed(e) => Record::Unavailable(e),
        Bounded::Late(_) => Record::Unavailable("no answer in time".into()),
    }
}

/// Which attempt a row shows: two reads that agree saw no transfer of the
/// GUID begin or end between them.
fn attempt_of(row: &Option<Row>) -> Option<(State, u32)> {
    row.as_ref().map(|r| (r.state, r.attempts))
}

/// A `sending` row no one works on: in a journal of one hub, left by an
/// outcome write that failed (no call of it runs in this process).
fn orphaned(hub: &Hub, row: &Row, guid: &str) -> bool {
    row.state == State::Sending && !hub.journal.is_shared() && !hub.handles(guid)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    use super::super::core_and_hub;

    /// A telegram of `tx` from IBANK with these fields.
    fn telegram(tx: &str, guid: &str, fields: serde_json::Value) -> Vec<u8> {
        let layouts = crate::layout::builtin();
        crate::client::build_telegram(
            &layouts[tx],
            guid,
            "IBANK",
            "20261202120000",
            fields.as_object().unwrap(),
        )
        .unwrap()
    }

    /// A transfer's claim stamps its target's wire grace on the row, so
    /// that whoever later judges a "never received" about it waits at least
    /// that long.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transfer_stamps_its_targets_grace() {
        let (_core, hub) = core_and_hub().await;
        let guid = "20261203IBANK00000000000STAMP001";
        let trf = crate::relay::test_transfer(guid, 1000);
        let peer = std::net::IpAddr::from([127, 0, 0, 1]);
        let (_, reply) = hub.handle(&trf, peer, None, Instant::now()).await;
        assert_eq!(reply.code, Code::OK);
        let row = hub.journal.get(guid).await.unwrap().unwrap();
        assert_eq!(row.grace_ms, Some(hub.targets()[0].grace_ms()));
        assert!(row.grace_ms > Some(0));
    }

    /// The core's "never received" about a GUID whose transfer this hub
    /// leads right now (its claim not in the journal yet, its POST still to
    /// go) proves nothing: E901, not E904 ("no money moved"), which could
    /// make the channel start a new transaction beside the first. Once no
    /// transfer of it is under way, the same answer is E904.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn never_received_while_this_hub_leads_the_transfer_is_no_proof() {
        let (core, hub) = core_and_hub().await;
        let ask = |guid: &str, orig: &str| {
            telegram("INQ001", guid, serde_json::json!({ "orig_guid": orig }))
        };
        let orig = "20261202IBANK0000000000000LEAD01";
        let peer = std::net::IpAddr::from([127, 0, 0, 1]);

        let lead = hub.flights.join(orig, "fingerprint");
        assert!(matches!(lead, super::super::flights::Joined::Lead(_)));
        let question = ask("20261202IBANK0000000000000ASK001", orig);
        let (_, reply) = hub.handle(&question, peer, None, Instant::now()).await;
        assert_eq!(reply.code, Code::UNKNOWN, "asked while the transfer is led");

        drop(lead);
        let question = ask("20261202IBANK0000000000000ASK002", orig);
        let (_, reply) = hub.handle(&question, peer, None, Instant::now()).await;
        assert_eq!(
            reply.code.as_str(),
            "E904",
            "asked once nothing is under way"
        );
        assert_eq!(
            core.stats().by_guid.get(orig).map(|g| g.post),
            Some(0),
            "no POST"
        );
    }

    /// A whole transfer of the GUID (claimed, sent, processed, its flight
    /// gone) fits while the inquiry's GET is out, the core having decided
    /// "never received" before the POST came: the journal read again after
    /// the GET shows it, and the answer is not E904.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transfer_while_the_inquiry_is_out_is_not_missed() {
        use corebank::{FaultMethod, FaultRule, Phase};
        let (core, hub) = core_and_hub().await;
        let orig = "20261202IBANK0000000000000RACE01";
        let peer = std::net::IpAddr::from([127, 0, 0, 1]);
        // The GET's answer ("never received", decided on arrival) comes late.
        core.add_fault(
            FaultRule::guid(orig)
                .method(FaultMethod::Get)
                .phase(Phase::AfterApply)
                .delay_ms(400),
        );
        let ask = telegram(
            "INQ001",
            "20261202IBANK0000000000000ASK003",
            serde_json::json!({ "orig_guid": orig }),
        );
        let trf = crate::relay::test_transfer(orig, 1000);
        let inquiry = hub.handle(&ask, peer, None, Instant::now());
        let transfer = async {
            // Once the core has the GET (bounded: the inquiry's budget).
            let give_up = Instant::now() + Duration::from_secs(10);
            while core.stats().by_guid.get(orig).map_or(0, |g| g.get) == 0 {
                assert!(Instant::now() < give_up, "the GET never reached the core");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            hub.handle(&trf, peer, None, Instant::now()).await
        };
        let ((_, asked), (_, sent)) = tokio::join!(inquiry, transfer);
        assert_eq!(sent.code, Code::OK);
        assert!(core.stats().by_guid[orig].applied);
        assert_eq!(asked.code, Code::UNKNOWN, "money moved while it asked");
    }

    /// A transfer read whole while its tx code had no route, or was routed
    /// as an inquiry, waits for room, and a reload makes it a transfer
    /// before it starts: its GUID counts as handled from its read, so an
    /// INQ001 about it meanwhile is not told "never received" (E904) and
    /// then the transfer posted (found by a review, then by a black-box
    /// probe for the inquiry's route).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_telegram_waiting_through_a_reload_that_makes_it_a_transfer_counts() {
        use crate::config::Operation;
        let (core, hub) = core_and_hub().await;
        let peer = std::net::IpAddr::from([127, 0, 0, 1]);
        let inquiry = ("INQ001", Operation::Inquiry);
        for (i, before) in [vec![inquiry], vec![inquiry, ("TRF001", Operation::Inquiry)]]
            .into_iter()
            .enumerate()
        {
            let orig = format!("20261205IBANK00000000000RELOAD0{i}");
            hub.set_rules(crate::relay::test_rules(&before));
            // Read whole, it waits for room: counted whatever its route.
            hub.waiting_to_start("TRF001", &orig);
            hub.set_rules(crate::relay::test_rules(&[
                ("TRF001", Operation::Transfer),
                inquiry,
            ]));
            let ask = telegram(
                "INQ001",
                &format!("20261205IBANK000000000000RASK00{i}"),
                serde_json::json!({ "orig_guid": orig }),
            );
            let (_, asked) = hub.handle(&ask, peer, None, Instant::now()).await;
            assert_eq!(
                asked.code,
                Code::UNKNOWN,
                "{before:?}: its transfer may still be posted"
            );
            // Its turn comes: started under the new rules, it is posted.
            hub.no_longer_waiting(&orig);
            let trf = crate::relay::test_transfer(&orig, 1000);
            let (_, sent) = hub.handle(&trf, peer, None, Instant::now()).await;
            assert_eq!(sent.code, Code::OK);
            assert_eq!(core.stats().by_guid[&orig].post, 1);
        }
    }

    /// A transfer the core failed before applying (a 500: E500, final, and
    /// the core keeps no record): an INQ001 about it answers that E500, as
    /// every resend of the GUID does, not E904, which would tell the
    /// channel a resend posts (found by a black-box probe).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_inquiry_about_a_transfer_settled_by_an_e500_answers_e500() {
        use corebank::{FaultMethod, FaultRule, Phase};
        let (core, hub) = core_and_hub().await;
        let orig = "20261205IBANK000000000000E500001";
        let peer = std::net::IpAddr::from([127, 0, 0, 1]);
        core.add_fault(
            FaultRule::guid(orig)
                .method(FaultMethod::Post)
                .phase(Phase::BeforeApply)
                .status(500),
        );
        let trf = crate::relay::test_transfer(orig, 1000);
        let (_, sent) = hub.handle(&trf, peer, None, Instant::now()).await;
        assert_eq!(sent.code, Code::TARGET_ERROR);
        let ask = telegram(
            "INQ001",
            "20261205IBANK000000000000E500ASK",
            serde_json::json!({ "orig_guid": orig }),
        );
        let (_, asked) = hub.handle(&ask, peer, None, Instant::now()).await;
        assert_eq!(asked.code, Code::TARGET_ERROR, "what a resend gets");
        let (_, resent) = hub.handle(&trf, peer, None, Instant::now()).await;
        assert_eq!(resent.code, Code::TARGET_ERROR);
        assert_eq!(core.stats().by_guid[orig].post, 1);
    }
}
