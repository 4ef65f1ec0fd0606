//! Resends of a GUID whose last answer was not final (docs/protocol.md sections 6-8):
//! after E901 the hub asks (`GET`) instead of posting; after E902/E904 it may
//! post again, but only past the cooldown and under the maximum (else E905).
//!
//! The resend policy is measured from the previous answer, so these tests wait
//! for a cooldown to pass with `tokio::time::sleep`: there the elapsed time is
//! the subject of the test, not a way to order events. Every other wait is on
//! an answer, the fixture's counters or the journal's row.

use crate::common;
use crate::journal_support;

use std::time::Duration;

use common::*;
use corebank::{FaultMethod, FaultRule, Phase};
use journal_support::*;
use relayhub::journal::State;

/// Lets a resend cooldown of `ms` pass since the answer just received. The
/// hub counts from when it journaled that answer, which is before we read it;
/// the extra 20 ms absorbs the journal clock's millisecond rounding.
async fn cooldown_passes(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms + 20)).await;
}

/// A hub with the given resend policy whose core is down (connect refused) on
/// a port it can come back on with `start_core_on`: the hub and that port.
async fn hub_with_core_down(max_resends: u32, cooldown_ms: u64) -> (Hub, u16) {
    let port = free_port();
    let hub = HubSpec::new(&format!("http://127.0.0.1:{port}"))
        .toml(&resend_policy(max_resends, cooldown_ms))
        .start()
        .await;
    (hub, port)
}

/// E901 because the gateway lost the core's answer (the core applied it):
/// the resend is an inquiry, answered 0000 with the transfer's own body; the
/// next resend is answered from the journal, with no call at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_after_e901_is_an_inquiry_not_a_post() {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url()).start().await;
    let g = guid("U901");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .phase(Phase::AfterApply)
            .close()
            .times(1),
    );
    let telegram = transfer(&g, 11_000);
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E901");
    assert!(core.applied(&g), "after_apply: the core did the work");
    assert_eq!(
        hub.row(&g).await.map(|r| r.state),
        Some(State::Unknown),
        "E901 leaves the GUID unknown"
    );
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 0));

    let resend = hub.send(&telegram).await;
    let (txn_id, _, balance) = ok_body(&resend);
    assert!(txn_id.starts_with('T'), "txn_id {txn_id:?}");
    assert_eq!(balance, 1_000_000 - 11_000);
    assert_eq!(
        (posts(&core, &g), gets(&core, &g)),
        (1, 1),
        "one inquiry, no second POST"
    );

    let again = hub.send(&telegram).await;
    assert_eq!((&again.code, &again.body), (&resend.code, &resend.body));
    assert_eq!(
        (posts(&core, &g), gets(&core, &g)),
        (1, 1),
        "settled: replayed from the journal"
    );
    let row = hub.row(&g).await.expect("journaled");
    assert_eq!(
        (row.state, row.code.as_deref()),
        (State::Done, Some("0000"))
    );
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 11_000), "one debit");
}

/// E901 while the core is still processing (budget out, no late-answer
/// window): a resend asks and hears PROCESSING (E901 again, no POST); once
/// the fixture has applied the transfer, the next resend asks and gets 0000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_after_e901_while_processing_then_done() {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url())
        .budget_ms(600)
        .toml("[[target]]\nname = \"core\"\nlate_answer_window_ms = 0\n")
        .start()
        .await;
    let g = guid("PROC");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(2000)
            .phase(Phase::BeforeApply),
    );
    let telegram = transfer(&g, 12_000);
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E901");

    let during = hub.send(&telegram).await;
    assert_header_only(&during, "TRF001", &g, "E901");
    assert!(
        !core.applied(&g),
        "the inquiry must have come while the core was processing"
    );
    assert_eq!(posts(&core, &g), 1, "no second POST");
    let gets_during = gets(&core, &g);
    assert!(gets_during >= 1, "the resend asked the core");

    assert!(within(core.wait_applied(&g)).await, "the transfer applies");
    let after = hub.send(&telegram).await;
    let (_, _, balance) = ok_body(&after);
    assert_eq!(balance, 1_000_000 - 12_000);
    assert_eq!(posts(&core, &g), 1, "still one POST");
    assert!(gets(&core, &g) > gets_during, "answered by a new inquiry");
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 12_000), "one debit");
    let row = hub.row(&g).await.expect("journaled");
    assert_eq!(
        (row.state, row.code.as_deref()),
        (State::Done, Some("0000"))
    );
}

/// A late answer (inside the late-answer window, after the channel got E901)
/// is journaled when it arrives; the resend is then answered from the journal
/// with neither a POST nor a GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_answer_is_journaled_and_replayed() {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url()).budget_ms(500).start().await;
    let g = guid("LATE");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(1000)
            .phase(Phase::BeforeApply),
    );
    let telegram = transfer(&g, 13_000);
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E901");
    assert!(within(core.wait_applied(&g)).await);

    let row = hub.wait_state(&g, State::Done).await;
    assert_eq!(row.code.as_deref(), Some("0000"));
    let resend = hub.send(&telegram).await;
    let (_, _, balance) = ok_body(&resend);
    assert_eq!(balance, 1_000_000 - 13_000);
    assert_eq!(row.answer.as_deref(), Some(resend.body.as_slice()));
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 0));
}

/// E902 (connection refused: nothing sent). A resend inside the cooldown is
/// E905 and sends nothing; another body is E102; once the core is back on the
/// same port and the cooldown has passed, the resend posts: 0000, one debit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_after_e902_posts_once_the_core_is_back() {
    const COOLDOWN: u64 = 500;
    let (hub, port) = hub_with_core_down(3, COOLDOWN).await;
    let g = guid("DOWN");
    let telegram = transfer(&g, 14_000);
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E902");
    let row = hub.row(&g).await.expect("journaled");
    assert_eq!((row.state, row.attempts), (State::NotSent, 1));

    // Inside the cooldown: refused, and nothing changes in the journal.
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E905");
    assert_header_only(&hub.send(&transfer(&g, 14_001)).await, "TRF001", &g, "E102");
    let row = hub.row(&g).await.expect("journaled");
    assert_eq!((row.state, row.attempts), (State::NotSent, 1));

    let core = start_core_on(port).await;
    cooldown_passes(COOLDOWN).await;
    let resend = hub.send(&telegram).await;
    let (_, _, balance) = ok_body(&resend);
    assert_eq!(balance, 1_000_000 - 14_000);
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 0));

    // Now final: replayed, no call, even past the cooldown.
    cooldown_passes(COOLDOWN).await;
    let again = hub.send(&telegram).await;
    assert_eq!((&again.code, &again.body), (&resend.code, &resend.body));
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 0));
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 14_000), "one debit");
    let row = hub.row(&g).await.expect("journaled");
    assert_eq!(
        (row.state, row.code.as_deref(), row.attempts),
        (State::Done, Some("0000"), 2)
    );
}

/// With `max_resends = 1`, two attempts are all a GUID gets: the third is
/// E905, and stays E905 once the core is back and the cooldown has passed,
/// while a new GUID goes through (the refusal is the policy, not the network).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_past_the_maximum_is_e905_for_good() {
    const COOLDOWN: u64 = 200;
    let (hub, port) = hub_with_core_down(1, COOLDOWN).await;
    let g = guid("MAXR");
    let telegram = transfer(&g, 15_000);
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E902");
    cooldown_passes(COOLDOWN).await;
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E902");
    assert_eq!(hub.row(&g).await.map(|r| r.attempts), Some(2));
    cooldown_passes(COOLDOWN).await;
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E905");

    let core = start_core_on(port).await;
    cooldown_passes(COOLDOWN).await;
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E905");
    assert_eq!((posts(&core, &g), gets(&core, &g)), (0, 0));
    assert_eq!(hub.row(&g).await.map(|r| r.attempts), Some(2));

    let fresh = guid("MAXF");
    ok_body(&hub.send(&transfer(&fresh, 15_000)).await);
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 15_000));
}

/// An E905 does not restart the cooldown: a resend one cooldown after the
/// E902 is allowed even though it comes less than a cooldown after the E905.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e905_does_not_restart_the_cooldown() {
    const COOLDOWN: u64 = 1000;
    let (hub, _port) = hub_with_core_down(3, COOLDOWN).await;
    let g = guid("CDWN");
    let telegram = transfer(&g, 16_000);
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E902");
    // 400 ms after the E902: inside the cooldown.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E905");
    // 700 ms after the E905, 1100 ms after the E902: past the cooldown.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let allowed = hub.send(&telegram).await;
    assert_header_only(&allowed, "TRF001", &g, "E902");
    assert_eq!(
        hub.row(&g).await.map(|r| r.attempts),
        Some(2),
        "the resend was a second attempt"
    );
}

/// The resend cooldown and the wire grace of [`unknown_behind_a_502`]'s hub.
const GATEWAY_COOLDOWN: u64 = 300;
const GATEWAY_GRACE: u64 = 400;

/// A hub (budget and wire grace [`GATEWAY_GRACE`], resend cooldown [`GATEWAY_COOLDOWN`], no
/// late answers) and a GUID tagged `tag` whose first POST a gateway answers
/// 502: nothing reaches the core, and the hub holds the transfer unknown.
async fn unknown_behind_a_502(tag: &str) -> (corebank::CoreBank, Hub, String) {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url())
        .budget_ms(GATEWAY_GRACE)
        .toml(&format!(
            "{}[[target]]\nname = \"core\"\nlate_answer_window_ms = 0\nwire_grace_ms = {GATEWAY_GRACE}\n",
            resend_policy(3, GATEWAY_COOLDOWN)
        ))
        .start()
        .await;
    let g = guid(tag);
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .status(502)
            .times(1),
    );
    (core, hub, g)
}

/// E901 from a 502 that stood in front of the core (nothing recorded): the
/// resend asks and hears "never received". While the attempt is younger than
/// the wire grace that proves nothing (the POST may still be on its way): E901.
/// Past it, E904, which makes the GUID safe to post again, after the cooldown.
/// Money moves once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_after_e904_posts_again_after_the_cooldown() {
    let (core, hub, g) = unknown_behind_a_502("N904").await;
    let telegram = transfer(&g, 17_000);
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E901");
    assert!(!core.applied(&g));

    // Inside the wire grace "never received" is no proof.
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E901");
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 1));
    assert_eq!(hub.row(&g).await.map(|r| r.state), Some(State::Unknown));

    cooldown_passes(GATEWAY_GRACE).await;
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E904");
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 2));
    assert_eq!(hub.row(&g).await.map(|r| r.state), Some(State::NotSent));
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E905");

    cooldown_passes(GATEWAY_COOLDOWN).await;
    let resend = hub.send(&telegram).await;
    let (_, _, balance) = ok_body(&resend);
    assert_eq!(balance, 1_000_000 - 17_000);
    assert_eq!(
        (posts(&core, &g), gets(&core, &g)),
        (2, 2),
        "the first POST never got past the gateway"
    );
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 17_000), "one debit");
}

/// The same "never received", heard by an INQ001 past the wire grace: E904,
/// and the row says `not_sent`, so the channel's TRF001 resend (after the
/// cooldown) posts, as E904 tells it. Before, the row stayed `unknown`: the
/// resend asked again and got E904 a second time, which also restarted the
/// cooldown (found by a black-box probe). Money moves once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inquiry_telegram_s_e904_lets_the_next_resend_post() {
    let (core, hub, g) = unknown_behind_a_502("Q904").await;
    let telegram = transfer(&g, 18_000);
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E901");

    cooldown_passes(GATEWAY_GRACE).await;
    let q = guid("Q904ASK");
    assert_header_only(&hub.send(&inquiry(&q, &g)).await, "INQ001", &q, "E904");
    assert_eq!(hub.row(&g).await.map(|r| r.state), Some(State::NotSent));
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 1));

    cooldown_passes(GATEWAY_COOLDOWN).await;
    let resend = hub.send(&telegram).await;
    let (_, _, balance) = ok_body(&resend);
    assert_eq!(balance, 1_000_000 - 18_000);
    assert_eq!((posts(&core, &g), gets(&core, &g)), (2, 1));
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 18_000), "one debit");
}

/// 50 concurrent resends of a GUID left unknown (E901) share one inquiry:
/// one GET, no second POST, 50 identical 0000 answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_resends_after_e901_share_one_inquiry() {
    const CONCURRENT: usize = 50;
    let core = start_core().await;
    let hub = HubSpec::new(&core.url()).start().await;
    let g = guid("U50X");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .phase(Phase::AfterApply)
            .close()
            .times(1),
    );
    // The inquiry is held so that all resends are read while it runs.
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Get)
            .delay_ms(500)
            .phase(Phase::AfterApply),
    );
    let telegram = transfer(&g, 18_000);
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E901");

    let mut channels = Vec::with_capacity(CONCURRENT);
    for _ in 0..CONCURRENT {
        channels.push(hub.channel().await);
    }
    for ch in &mut channels {
        within(ch.send(&telegram)).await.expect("send");
    }
    let mut answers = Vec::with_capacity(CONCURRENT);
    for mut ch in channels {
        let raw = within(ch.recv()).await.expect("read").expect("an answer");
        answers.push(relayhub::client::Answer::parse(&raw).expect("answer telegram"));
    }
    let (_, _, balance) = ok_body(&answers[0]);
    assert_eq!(balance, 1_000_000 - 18_000);
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(
            (&a.code, &a.body, &a.guid),
            (&answers[0].code, &answers[0].body, &g),
            "answer {i} differs from answer 0"
        );
    }
    assert_eq!(
        (posts(&core, &g), gets(&core, &g)),
        (1, 1),
        "one inquiry for all resends, no second POST"
    );
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 18_000), "one debit");
}
