//! Repeated GUIDs (docs/protocol.md section 8), end to end: the same GUID in flight
//! many times at once, replays of final answers, another body under a known
//! GUID, and telegrams refused before any call, which are not journaled.
//!
//! Every test counts what reached the fixture: "no call" is `post == 0` and
//! `get == 0` for that GUID, proven at the core, not inferred from the answer.

use crate::common;
use crate::journal_support;

use common::*;
use corebank::{FaultMethod, FaultRule, Phase};
use journal_support::*;
use relayhub::journal::State;

const CONCURRENT: usize = 50;

/// 50 channels send one GUID while the core holds its POST: one POST, one
/// debit, 50 answers with the same code and the same body bytes.
async fn concurrent_same_guid(journal: &str) {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url())
        .journal(journal)
        .budget_ms(5000)
        .start()
        .await;
    let g = guid("CONC");
    // Long enough that all 50 telegrams are read while the first POST is held.
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(700)
            .phase(Phase::BeforeApply),
    );
    let telegram = transfer(&g, 10_000);
    let mut channels = Vec::with_capacity(CONCURRENT);
    for _ in 0..CONCURRENT {
        channels.push(hub.channel().await);
    }
    for ch in &mut channels {
        within(ch.send(&telegram)).await.expect("send");
    }
    assert!(
        !core.applied(&g),
        "all {CONCURRENT} telegrams must be on the wire before the core applies the first"
    );
    within(core.wait_received(&g)).await;

    let answers = futures_join(channels).await;
    let first = &answers[0];
    assert_eq!(first.code, "0000", "answer {first:?}");
    assert_eq!(first.guid, g);
    let (_, _, balance) = ok_body(first);
    assert_eq!(balance, 1_000_000 - 10_000);
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(
            (
                a.code.as_str(),
                &a.body,
                a.guid.as_str(),
                a.tx_code.as_str()
            ),
            (
                first.code.as_str(),
                &first.body,
                first.guid.as_str(),
                "TRF001"
            ),
            "answer {i} differs from answer 0"
        );
    }

    let stats = core.stats();
    assert_eq!(
        stats.by_guid.get(&g).map(|s| (s.post, s.get)),
        Some((1, 0)),
        "{stats:?}"
    );
    assert_eq!((stats.post, stats.get), (1, 0), "{stats:?}");
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 10_000), "one debit");
    assert_eq!(core.balance(ACC2), Some(1_000_000 + 10_000), "one credit");

    let row = hub.row(&g).await.expect("journaled");
    assert_eq!(
        (row.state, row.code.as_deref(), row.attempts),
        (State::Done, Some("0000"), 1)
    );
    assert_eq!(row.answer.as_deref(), Some(first.body.as_slice()));
}

/// Reads one answer from every channel, all at once.
async fn futures_join(channels: Vec<relayhub::client::Channel>) -> Vec<relayhub::client::Answer> {
    let tasks: Vec<_> = channels
        .into_iter()
        .map(|mut ch| {
            tokio::spawn(async move {
                let raw = within(ch.recv())
                    .await
                    .expect("read an answer")
                    .expect("an answer before close");
                relayhub::client::Answer::parse(&raw).expect("answer telegram")
            })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("reader task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_same_guid_one_post_memory_journal() {
    concurrent_same_guid("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_same_guid_one_post_sqlite_journal() {
    let dir = TempDir::new("journal-conc");
    concurrent_same_guid(dir.join("journal.db").to_str().unwrap()).await;
}

/// A resend after 0000 gets the stored answer byte for byte, even with a new
/// `sent_at` and on the same connection; the core sees nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_after_0000_no_call() {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url()).start().await;
    let g = guid("RPOK");
    let telegram = transfer(&g, 25_000);
    let mut ch = hub.channel().await;
    let first = exchange(&mut ch, &telegram).await;
    let (txn_id, _, balance) = ok_body(&first);
    assert!(txn_id.starts_with('T'), "txn_id {txn_id:?}");
    assert_eq!(balance, 1_000_000 - 25_000);

    let mut resend = telegram.clone();
    resend[46..60].copy_from_slice(b"20200101000000");
    let again = exchange(&mut ch, &resend).await;
    let other_conn = hub.send(&telegram).await;
    for a in [&again, &other_conn] {
        assert_eq!((&a.code, &a.body), (&first.code, &first.body), "replay");
        assert_eq!(a.guid, g);
    }
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 0));
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 25_000), "one debit");
}

/// B201 is final: the resend is answered B201 from the journal, no call, and
/// no money moves (the core would still refuse, so count the calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_after_b201_no_call() {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url()).start().await;
    let g = guid("RPBZ");
    let telegram = trf(&g, &trf_fields(ACC3, BANK, ACC2, 600_000, MEMO));
    let first = hub.send(&telegram).await;
    assert_header_only(&first, "TRF001", &g, "B201");
    let again = hub.send(&telegram).await;
    assert_header_only(&again, "TRF001", &g, "B201");
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 0));
    assert_eq!(core.balance(ACC3), Some(500_000));
    let row = hub.row(&g).await.expect("journaled");
    assert_eq!(
        (row.state, row.code.as_deref()),
        (State::Done, Some("B201"))
    );
}

/// E500 is final: the resend gets E500 from the journal. The fault hits the
/// first POST only, so a second POST would have answered 0000 and moved money.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_after_e500_no_call() {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url()).start().await;
    let g = guid("RP5X");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .status(500)
            .times(1),
    );
    let telegram = transfer(&g, 30_000);
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E500");
    assert_header_only(&hub.send(&telegram).await, "TRF001", &g, "E500");
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 0));
    assert_eq!(core.balance(ACC1), Some(1_000_000));
}

/// Another body under a GUID that has a final answer: E102, no call, and the
/// journal still replays the first answer to the first body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_body_after_final_answer_is_e102_no_call() {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url()).start().await;
    let g = guid("DBDN");
    let telegram = transfer(&g, 40_000);
    let first = hub.send(&telegram).await;
    ok_body(&first);

    let other = hub.send(&transfer(&g, 40_001)).await;
    assert_header_only(&other, "TRF001", &g, "E102");
    let other_memo = hub
        .send(&trf(
            &g,
            &trf_fields(ACC1, BANK, ACC2, 40_000, "other memo"),
        ))
        .await;
    assert_header_only(&other_memo, "TRF001", &g, "E102");
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 0));

    let again = hub.send(&telegram).await;
    assert_eq!((&again.code, &again.body), (&first.code, &first.body));
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 40_000));
}

/// Another body while the first is in flight: E102 at once, no call; the
/// first still gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_body_while_in_flight_is_e102_no_call() {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url()).start().await;
    let g = guid("DBIF");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(500)
            .phase(Phase::BeforeApply),
    );
    let mut first_ch = hub.channel().await;
    within(first_ch.send(&transfer(&g, 50_000)))
        .await
        .expect("send");
    within(core.wait_received(&g)).await;

    let other = hub.send(&transfer(&g, 60_000)).await;
    assert_header_only(&other, "TRF001", &g, "E102");
    assert!(
        !core.applied(&g),
        "the E102 must come while the first is still held"
    );

    let raw = within(first_ch.recv())
        .await
        .expect("read")
        .expect("answer");
    let first = relayhub::client::Answer::parse(&raw).unwrap();
    let (_, _, balance) = ok_body(&first);
    assert_eq!(balance, 1_000_000 - 50_000);
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 0));
}

/// E102 (body) and E101 (route) refuse before any call and journal nothing,
/// so the corrected telegram reuses the GUID and is processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_telegrams_are_not_journaled() {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url()).start().await;
    let g = guid("NJRN");
    let good = transfer(&g, 70_000);

    // amount (U, min 1) at body offset 16 + 3 + 16 = 35: all zeros is invalid.
    let mut zero_amount = good.clone();
    let at = 64 + 35;
    zero_amount[at..at + 13].copy_from_slice(b"0000000000000");
    assert_header_only(&hub.send(&zero_amount).await, "TRF001", &g, "E102");
    assert!(hub.row(&g).await.is_none(), "E102 must not be journaled");

    let mut unrouted = good.clone();
    unrouted[..6].copy_from_slice(b"TRF999");
    assert_header_only(&hub.send(&unrouted).await, "TRF999", &g, "E101");
    assert!(hub.row(&g).await.is_none(), "E101 must not be journaled");
    assert_eq!(core.stats().post + core.stats().get, 0, "no call yet");

    let a = hub.send(&good).await;
    let (_, _, balance) = ok_body(&a);
    assert_eq!(balance, 1_000_000 - 70_000);
    assert_eq!((posts(&core, &g), gets(&core, &g)), (1, 0));
}
