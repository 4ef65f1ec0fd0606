//! The journal across restarts (docs/protocol.md section 8): a GUID in flight when
//! the real `relayhub` process is SIGKILLed is unknown after the restart, so
//! its resend is an inquiry, never a second POST; and final answers in a
//! SQLite journal are replayed by the next hub on the same file.

#![cfg(unix)]

use crate::common;
use crate::journal_support;

use std::os::unix::process::ExitStatusExt;

use common::*;
use corebank::{FaultMethod, FaultRule, Phase};
use journal_support::*;
use relayhub::journal::{Journal, State};

/// The hub dies (SIGKILL) while the core holds its POST. On the same journal
/// file the next hub treats the GUID as unknown: the resend asks the core
/// (PROCESSING: E901), and once the core has applied it, asks again (0000).
/// One POST in all, one debit in the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_in_flight_then_resend_is_an_inquiry_not_a_second_post() {
    const AMOUNT: u64 = 21_000;
    let core = start_core().await;
    let total = core.total_money();
    let dir = TempDir::new("journal-crash");
    let journal = dir.join("journal.db");
    let g = guid("KILL");
    // Held long enough to kill the hub, restart it and ask while it is held.
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(3000)
            .phase(Phase::BeforeApply),
    );
    let telegram = transfer(&g, AMOUNT);

    let mut hub = start_hub_process(&core.url(), &journal, 2000);
    let mut ch = hub.channel().await;
    within(ch.send(&telegram)).await.expect("send");
    within(core.wait_received(&g)).await;
    let status = hub.sigkill();
    assert_eq!(status.signal(), Some(9), "relayhub died of SIGKILL");
    // EOF or a reset: either way, no answer.
    if let Ok(Some(raw)) = within(ch.recv()).await {
        panic!("an answer from a killed hub: {raw:?}");
    }

    // What the crash left on disk: the claim, written before the POST left.
    {
        let j = Journal::open(journal.to_str().unwrap(), 16)
            .await
            .expect("open the journal file");
        let row = j.get(&g).await.unwrap().expect("the GUID was journaled");
        assert_eq!((row.state, row.attempts), (State::Sending, 1));
    }

    let mut hub = start_hub_process(&core.url(), &journal, 2000);
    let during = hub.send(&telegram).await;
    assert_header_only(&during, "TRF001", &g, "E901");
    assert!(
        !core.applied(&g),
        "the first resend must come while the core holds the transfer"
    );
    assert_eq!(posts(&core, &g), 1, "no second POST after the restart");
    let gets_during = gets(&core, &g);
    assert!(gets_during >= 1, "the resend asked the core");

    assert!(within(core.wait_applied(&g)).await, "the transfer applies");
    let after = hub.send(&telegram).await;
    let (_, _, balance) = ok_body(&after);
    assert_eq!(balance, 1_000_000 - AMOUNT);
    assert!(gets(&core, &g) > gets_during, "answered by an inquiry");
    let settled_gets = gets(&core, &g);

    let again = hub.send(&telegram).await;
    assert_eq!((&again.code, &again.body), (&after.code, &after.body));
    assert_eq!(
        (posts(&core, &g), gets(&core, &g)),
        (1, settled_gets),
        "settled: replayed from the journal"
    );

    // The ledger: one debit, one credit, no money made or lost.
    assert_eq!(core.balance(ACC1), Some(1_000_000 - AMOUNT));
    assert_eq!(core.balance(ACC2), Some(1_000_000 + AMOUNT));
    assert_eq!(core.total_money(), total);

    let status = hub.terminate();
    assert_eq!(
        status.code(),
        Some(0),
        "relayhub exit after SIGTERM; log:\n{}",
        hub.stderr()
    );
    let j = Journal::open(journal.to_str().unwrap(), 16)
        .await
        .expect("open the journal file");
    let row = j.get(&g).await.unwrap().expect("journaled");
    assert_eq!(
        (row.state, row.code.as_deref(), row.attempts),
        (State::Done, Some("0000"), 1)
    );
    let history = j.history(&g).await.unwrap();
    assert!(
        history
            .iter()
            .any(|e| e.state == State::Unknown && e.code.as_deref() == Some("E901")),
        "the restart marked the GUID unknown: {history:?}"
    );
}

/// Final answers journaled in a SQLite file are replayed by the next hub on
/// that file: no call, same bytes; another body is still E102.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_journal_replays_final_answers_after_a_restart() {
    let core = start_core().await;
    let dir = TempDir::new("journal-restart");
    let file = dir.join("journal.db");
    let spec = HubSpec::new(&core.url()).journal(file.to_str().unwrap());
    let ok = guid("RSOK");
    let rejected = guid("RSBZ");
    let ok_telegram = transfer(&ok, 22_000);
    let rejected_telegram = trf(&rejected, &trf_fields(ACC3, BANK, ACC2, 600_000, MEMO));

    let hub = spec.start().await;
    let first_ok = hub.send(&ok_telegram).await;
    ok_body(&first_ok);
    assert_header_only(
        &hub.send(&rejected_telegram).await,
        "TRF001",
        &rejected,
        "B201",
    );
    hub.shutdown().await;

    let hub = spec.start().await;
    let again = hub.send(&ok_telegram).await;
    assert_eq!((&again.code, &again.body), (&first_ok.code, &first_ok.body));
    assert_header_only(
        &hub.send(&rejected_telegram).await,
        "TRF001",
        &rejected,
        "B201",
    );
    assert_header_only(
        &hub.send(&transfer(&ok, 22_001)).await,
        "TRF001",
        &ok,
        "E102",
    );
    assert_eq!((posts(&core, &ok), gets(&core, &ok)), (1, 0));
    assert_eq!((posts(&core, &rejected), gets(&core, &rejected)), (1, 0));
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 22_000));
}
