//! The journal across restarts (docs/protocol.md section 8): a GUID in flight when
//! the real `relayhub` process is SIGKILLed is unknown after the restart, so
//! its resend is an inquiry, never a second POST; final answers in a SQLite
//! journal are replayed by the next hub on the same file; and a file written
//! by an older schema keeps that promise once the hub has migrated it.

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

/// `rows` written as the build before schema version 5 wrote them: a journal
/// of schema version 4 (events keyed by GUID), the first row `unknown` after
/// an attempt whose answer never came, the second left `sending` by a crash.
/// The application id is taken from `like`, a journal of this build.
fn write_version_4(
    path: &std::path::Path,
    like: &std::path::Path,
    rows: &[relayhub::journal::Row; 2],
) {
    use rusqlite::{Connection, params};
    let app_id: i64 = Connection::open(like)
        .unwrap()
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .unwrap();
    let conn = Connection::open(path).unwrap();
    for sql in [
        include_str!("../../migrations/sqlite/0001_init.sql"),
        include_str!("../../migrations/sqlite/0002_attempt_url.sql"),
        include_str!("../../migrations/sqlite/0003_prune_index.sql"),
        include_str!("../../migrations/sqlite/0004_state_checks.sql"),
    ] {
        conn.execute_batch(sql).unwrap();
    }
    conn.execute_batch(&format!(
        "PRAGMA user_version = 4; PRAGMA application_id = {app_id}; PRAGMA journal_mode = WAL;"
    ))
    .unwrap();
    for (row, state, rowid) in [(&rows[0], "unknown", 7), (&rows[1], "sending", 3)] {
        conn.execute(
            "INSERT INTO journal (rowid, guid, tx_code, fingerprint, state, code, attempts, \
             last_attempt_ms, created_ms, updated_ms, url) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, 1000, 1000, 1001, ?7)",
            params![
                rowid,
                row.guid,
                row.tx_code,
                row.fingerprint,
                state,
                (state == "unknown").then_some("E901"),
                row.url
            ],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO journal_events (guid, at_ms, state, note) \
             VALUES (?1, 1000, 'sending', 'attempt 1')",
            [&row.guid],
        )
        .unwrap();
    }
    conn.execute(
        "INSERT INTO journal_events (guid, at_ms, state, code, note) \
         VALUES (?1, 1001, 'unknown', 'E901', 'no answer within the budget')",
        [&rows[0].guid],
    )
    .unwrap();
}

/// A journal written by the build before schema version 5, holding a GUID
/// left `unknown` and one left `sending` by a crash, both applied by the
/// core: the real hub migrates the file at its start, answers each resend by
/// inquiry (never a second POST), and each GUID's history keeps its old
/// events and goes on after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_4_journal_keeps_the_one_rule_after_the_upgrade() {
    let core = start_core().await;
    let dir = TempDir::new("journal-v4");
    let (unknown, sending) = (guid("V4UN"), guid("V4SE"));
    let telegrams = [transfer(&unknown, 11_000), transfer(&sending, 12_000)];
    // The core applies both, through a hub on a journal of its own whose
    // rows give the fingerprints and URL the older build would have written.
    let scratch = dir.join("scratch.db");
    let hub = HubSpec::new(&core.url())
        .journal(scratch.to_str().unwrap())
        .start()
        .await;
    for t in &telegrams {
        ok_body(&hub.send(t).await);
    }
    let rows = [
        hub.row(&unknown).await.expect("journaled"),
        hub.row(&sending).await.expect("journaled"),
    ];
    hub.shutdown().await;

    let journal = dir.join("journal.db");
    write_version_4(&journal, &scratch, &rows);
    let mut hub = start_hub_process(&core.url(), &journal, 2000);
    for (g, t) in [&unknown, &sending].into_iter().zip(&telegrams) {
        let (_, _, balance) = ok_body(&hub.send(t).await);
        assert!(balance < 1_000_000, "{g}: the applied transfer's answer");
        assert_eq!(posts(&core, g), 1, "{g}: no second POST after the upgrade");
        assert_eq!(gets(&core, g), 1, "{g}: answered by one inquiry");
    }
    let status = hub.terminate();
    assert_eq!(status.code(), Some(0), "log:\n{}", hub.stderr());

    // Read before this test opens the file itself (which would migrate it).
    let version: i64 = rusqlite::Connection::open(&journal)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 6, "migrated by the hub to the newest schema");

    let j = Journal::open(journal.to_str().unwrap(), 16)
        .await
        .expect("open the migrated journal");
    // (state, code, note), and when for the events the older build wrote.
    type Step = (State, Option<String>, String, Option<i64>);
    let story = |events: Vec<relayhub::journal::Event>| -> Vec<Step> {
        events
            .into_iter()
            .map(|e| {
                let old = e.at_ms <= 1001;
                (
                    e.state,
                    e.code,
                    if old { e.note } else { String::new() },
                    old.then_some(e.at_ms),
                )
            })
            .collect()
    };
    let step = |state, code: Option<&str>, note: &str, at: Option<i64>| -> Step {
        (state, code.map(str::to_string), note.to_string(), at)
    };
    let settled = step(State::Done, Some("0000"), "", None);
    assert_eq!(
        story(j.history(&unknown).await.unwrap()),
        [
            step(State::Sending, None, "attempt 1", Some(1000)),
            step(
                State::Unknown,
                Some("E901"),
                "no answer within the budget",
                Some(1001)
            ),
            settled.clone()
        ]
    );
    let recovered = j.history(&sending).await.unwrap();
    assert_eq!(
        recovered[1].note, "was in flight when the hub stopped",
        "{recovered:?}"
    );
    assert_eq!(
        story(recovered),
        [
            step(State::Sending, None, "attempt 1", Some(1000)),
            (State::Unknown, Some("E901".into()), String::new(), None),
            settled
        ],
        "recovered at the start, then settled"
    );
}

/// How often the WAL of `journal` has started over (its header's checkpoint
/// sequence number) and the most frames it ever held (SQLite never shortens
/// the file while the journal is open).
fn wal_state(journal: &std::path::Path) -> (u32, u64) {
    use std::io::Read;
    let mut wal = journal.as_os_str().to_owned();
    wal.push("-wal");
    let mut header = [0u8; 16];
    let read = std::fs::File::open(&wal).and_then(|mut f| f.read_exact(&mut header));
    if read.is_err() {
        return (0, 0);
    }
    let field = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().unwrap());
    let len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    (
        field(12),
        len.saturating_sub(32) / (24 + u64::from(field(8))),
    )
}

/// Under steady transfers the SQLite journal's WAL keeps growing and starting
/// over (here, a checkpoint pass the writer finishes once the WAL holds 8,192
/// frames); the hub is SIGKILLed meanwhile, wherever in that cycle it is. The
/// next hub on the file replays every transfer the killed one had answered:
/// the same answer, no GUID posted twice, each debit once in the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_the_wal_starts_over_loses_no_answered_transfer() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    const CHANNELS: usize = 8;
    // The hub's `checkpoint::FINISH_FRAMES`.
    const FINISHED_FROM: u64 = 8_192;
    let core = start_core().await;
    let total = core.total_money();
    let dir = TempDir::new("journal-wal-kill");
    let journal = dir.join("journal.db");
    let mut hub = start_hub_process(&core.url(), &journal, 2000);
    let stop = Arc::new(AtomicBool::new(false));
    let mut channels = Vec::new();
    for _ in 0..CHANNELS {
        let mut ch = hub.channel().await;
        let stop = stop.clone();
        channels.push(tokio::spawn(async move {
            let mut answered = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let telegram = transfer(&guid("WALK"), 1);
                match within(ch.exchange(&telegram)).await {
                    Ok(answer) => answered.push((telegram, answer)),
                    // The hub was killed.
                    Err(_) => break,
                }
            }
            answered
        }));
    }
    // Kill once the WAL has started over twice, and has grown past the
    // writer's threshold (on a disk whose fsync is quick a pass can end
    // between two commits and start it over first: then at the bound).
    let (first, _) = wal_state(&journal);
    let until = Instant::now() + Duration::from_secs(30);
    let (starts, most) = loop {
        let (starts, most) = wal_state(&journal);
        if (starts >= first + 2 && most >= FINISHED_FROM) || Instant::now() > until {
            break (starts, most);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let status = hub.sigkill();
    assert_eq!(status.signal(), Some(9), "relayhub died of SIGKILL");
    stop.store(true, Ordering::SeqCst);
    let mut answered = Vec::new();
    for channel in channels {
        answered.extend(channel.await.unwrap());
    }
    answered.retain(|(_, a)| a.code == "0000");
    assert!(
        answered.len() >= 100,
        "only {} transfers answered before the kill",
        answered.len()
    );
    assert!(
        starts >= first + 2,
        "the WAL started over {} time(s) in 30 s (it held up to {most} frames)",
        starts - first
    );

    let hub = start_hub_process(&core.url(), &journal, 2000);
    let answered = Arc::new(answered);
    let mut replays = Vec::new();
    for part in 0..CHANNELS {
        let (answered, mut ch) = (answered.clone(), hub.channel().await);
        replays.push(tokio::spawn(async move {
            for (telegram, first) in answered.iter().skip(part).step_by(CHANNELS) {
                let again = exchange(&mut ch, telegram).await;
                assert_eq!(
                    (&again.code, &again.body),
                    (&first.code, &first.body),
                    "GUID {}: not the answer given before the kill",
                    first.guid
                );
            }
        }));
    }
    for replay in replays {
        replay.await.unwrap();
    }
    let stats = core.stats();
    if let Some((g, twice)) = stats.by_guid.iter().find(|(_, g)| g.post > 1) {
        panic!("{g} posted {} times", twice.post);
    }
    for (_, first) in answered.iter() {
        let core_saw = &stats.by_guid[&first.guid];
        assert!(
            core_saw.post == 1 && core_saw.applied,
            "{}: {core_saw:?}",
            first.guid
        );
    }
    // Every transfer here is 1 from ACC1 to ACC2: a debit applied twice
    // would show in ACC1's balance.
    let applied = stats.by_guid.values().filter(|g| g.applied).count() as u64;
    assert_eq!(core.balance(ACC1), Some(1_000_000 - applied));
    assert_eq!(core.total_money(), total, "no money made or lost");
}

/// A journal file deleted under a running hub (an operator's `rm`, a
/// cleanup job): what the hub journals from then on would be lost to its
/// next start, which would post every GUID again. So the next transfer is
/// not sent (E901: without its row, an earlier attempt of the GUID cannot
/// be ruled out) with an ERROR that says why, and a start
/// that finds the lock file without its journal is refused instead of
/// making an empty one. (Before: 0000 on, silently, and a fresh journal
/// after the restart: a second POST for each resend.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_deleted_under_a_running_hub_stops_the_posts() {
    let core = start_core().await;
    let dir = TempDir::new("journal-deleted");
    let file = dir.join("journal.db");
    let mut hub = start_hub_process(&core.url(), &file, 3_000);
    let mut ch = hub.channel().await;
    let before = guid("GONE1");
    let answer = within(ch.exchange(&transfer(&before, 1_000)))
        .await
        .unwrap();
    assert_eq!(answer.code, "0000", "{answer:?}");

    remove_journal_files(&file, &["", "-wal", "-shm"]);
    let after = guid("GONE2");
    let answer = within(ch.exchange(&transfer(&after, 1_000))).await.unwrap();
    assert_eq!(answer.code, "E901", "{answer:?}");
    assert_eq!(posts(&core, &after), 0, "nothing sent");
    let started = std::time::Instant::now();
    while !hub.stderr().contains("deleted while the hub runs")
        && !hub.stderr().contains("deleted or moved while the hub runs")
    {
        assert!(started.elapsed() < PATIENCE, "{}", hub.stderr());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    hub.sigkill();

    let refused = serve_on(&core.url(), &file);
    assert!(
        refused.code != Some(0)
            && refused
                .stderr
                .contains("the file is gone, but its lock file"),
        "{refused:?}"
    );
    assert!(!file.exists(), "no empty journal made");
    assert_eq!(posts(&core, &before), 1);
}

/// A journal that refuses durable writes until a restart (here its files
/// deleted under the hub; a failed fsync does the same) still answers the
/// GUIDs it holds from their rows: a transfer answered 0000 is replayed, an
/// unknown one is asked about, and a new GUID gets E903 with nothing written,
/// so its resend is E903 again, not an inquiry. (Before, every resend got
/// E903, "not sent", a transfer that had moved money included, because the
/// claim that found the row waited for the fsync that failed; found by a
/// black-box probe.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_that_refuses_writes_still_answers_the_guids_it_holds() {
    let core = start_core().await;
    let dir = TempDir::new("journal-refusing");
    let file = dir.join("journal.db");
    // A GUID certainly not sent (E902: no core listening), by an earlier hub.
    let not_sent = guid("REFNOTSENT");
    let mut first = start_hub_process("http://127.0.0.1:1", &file, 3_000);
    let mut ch = first.channel().await;
    let answer = within(ch.exchange(&transfer(&not_sent, 1_000)))
        .await
        .unwrap();
    assert_eq!(answer.code, "E902", "{answer:?}");
    let answered = std::time::Instant::now();
    assert!(first.terminate().success());

    let mut hub = start_hub_process(&core.url(), &file, 3_000);
    let mut ch = hub.channel().await;
    let done = guid("REFDONE");
    let first_done = within(ch.exchange(&transfer(&done, 1_000))).await.unwrap();
    assert_eq!(first_done.code, "0000", "{first_done:?}");
    // Applied, then the connection closed with no answer: unknown.
    let unknown = guid("REFUNK");
    core.add_fault(
        FaultRule::guid(&unknown)
            .method(FaultMethod::Post)
            .phase(Phase::AfterApply)
            .close(),
    );
    let answer = within(ch.exchange(&transfer(&unknown, 1_000)))
        .await
        .unwrap();
    assert_eq!(answer.code, "E901", "{answer:?}");

    remove_journal_files(&file, &["", "-wal", "-shm"]);
    // The write that finds the file gone refuses the journal from then on;
    // its own transfer is not sent, E901 (its claim failed, so its row
    // cannot be trusted).
    let first = guid("REFNEW1");
    let answer = within(ch.exchange(&transfer(&first, 1_000))).await.unwrap();
    assert_eq!(answer.code, "E901", "{answer:?}");
    assert_eq!(posts(&core, &first), 0, "nothing sent");

    let replay = within(ch.exchange(&transfer(&done, 1_000))).await.unwrap();
    assert_eq!(replay.code, "0000", "the stored answer: {replay:?}");
    assert_eq!(replay.body, first_done.body, "{replay:?}");
    let asked = within(ch.exchange(&transfer(&unknown, 1_000)))
        .await
        .unwrap();
    assert_eq!(asked.code, "0000", "the inquiry's answer: {asked:?}");
    assert_eq!(
        (posts(&core, &unknown), gets(&core, &unknown)),
        (1, 1),
        "asked, not posted again"
    );
    assert_eq!(posts(&core, &done), 1);

    // A new GUID: E903, and nothing written, so its resend is E903 too.
    let new = guid("REFNEW2");
    for _ in 0..2 {
        let answer = within(ch.exchange(&transfer(&new, 1_000))).await.unwrap();
        assert_eq!(answer.code, "E903", "{answer:?}");
    }
    assert_eq!(posts(&core, &new), 0, "nothing sent");

    // Not sent before: its resends are E903 with nothing written (before,
    // the first one's claim took an attempt that was never posted, and the
    // next resend found it `sending` and asked the core: E901). Past the
    // resend cooldown (1 s by default), which would answer E905 first.
    let cooldown = std::time::Duration::from_millis(1_100);
    tokio::time::sleep(cooldown.saturating_sub(answered.elapsed())).await;
    for _ in 0..2 {
        let answer = within(ch.exchange(&transfer(&not_sent, 1_000)))
            .await
            .unwrap();
        assert_eq!(answer.code, "E903", "{answer:?}");
    }
    assert_eq!((posts(&core, &not_sent), gets(&core, &not_sent)), (0, 0));
    // The operator hears of it at WARN, once for these failures, not only in
    // each telegram's INFO line (found by a black-box probe).
    let status = hub.terminate();
    assert!(status.success(), "{status:?}");
    let log = hub.stderr();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("the journal could not take transfers' claims"))
        .collect();
    assert!(
        warned.len() == 1 && warned[0].contains("WARN") && warned[0].contains("failures=1"),
        "{warned:#?}"
    );
}

/// A journal file found empty (here truncated to 0 bytes, its -wal gone)
/// where an earlier hub left its lock file lost what it held: a start is
/// refused, as for a deleted one, instead of taking it for a new journal
/// and posting every resend again (before: accepted, 2 POSTs for a GUID
/// answered 0000; found by a black-box probe). The file is left as found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_found_empty_beside_its_lock_file_is_refused() {
    let core = start_core().await;
    let dir = TempDir::new("journal-emptied");
    let file = dir.join("journal.db");
    let mut hub = start_hub_process(&core.url(), &file, 3_000);
    let mut ch = hub.channel().await;
    let g = guid("EMPTIED");
    let answer = within(ch.exchange(&transfer(&g, 1_000))).await.unwrap();
    assert_eq!(answer.code, "0000", "{answer:?}");
    hub.sigkill();

    std::fs::File::create(&file).unwrap(); // truncated to 0 bytes
    remove_journal_files(&file, &["-wal", "-shm"]);
    let refused = serve_on(&core.url(), &file);
    assert!(
        refused.code != Some(0)
            && refused.stderr.contains("the file holds no journal")
            && refused.stderr.contains("its lock file"),
        "{refused:?}"
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0, "left as found");
    assert_eq!(posts(&core, &g), 1);

    // A lock file whose owner never opened the journal (a first start that
    // failed before making it: no `opened the journal` line) does not stop
    // the next start.
    let mut lock = file.clone().into_os_string();
    lock.push(".lock");
    std::fs::write(&lock, "pid 1: relayhub serve\nrelayhub journal lock 2\n").unwrap();
    let mut hub = start_hub_process(&core.url(), &file, 3_000);
    let mut ch = hub.channel().await;
    let answer = within(ch.exchange(&transfer(&guid("EMPTIED2"), 1_000)))
        .await
        .unwrap();
    assert_eq!(answer.code, "0000", "{answer:?}");
    hub.sigkill();
}

/// A journal whose `-wal` was lost after a crash (deleted, or the file
/// copied without it) lost its latest rows: a start is refused, naming the
/// `-wal`, instead of posting their GUIDs again (before: accepted silently,
/// and every resend of those GUIDs was posted a second time; found by a
/// black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_whose_wal_was_lost_after_a_crash_is_refused() {
    let core = start_core().await;
    let dir = TempDir::new("journal-wal-lost");
    let file = dir.join("crashed.db");
    let wal = wal_of(&file);
    // A journal with its tables in the file, as after the hub's first
    // checkpoints, and a transfer since, in the -wal alone.
    let mut hub = start_hub_process(&core.url(), &file, 3_000);
    let mut ch = hub.channel().await;
    let answer = within(ch.exchange(&transfer(&guid("WALOLD"), 1_000)))
        .await
        .unwrap();
    assert_eq!(answer.code, "0000", "{answer:?}");
    checkpoint_keeping_the_wal(&file);
    let g = guid("WALLOST");
    let answer = within(ch.exchange(&transfer(&g, 1_000))).await.unwrap();
    assert_eq!(answer.code, "0000", "{answer:?}");
    hub.sigkill();
    assert!(wal.exists(), "the -wal is kept");

    remove_journal_files(&file, &["-wal", "-shm"]);
    let refused = serve_on(&core.url(), &file);
    assert!(
        refused.code != Some(0)
            && refused.stderr.contains("its -wal file is gone")
            && refused.stderr.contains("its lock file"),
        "{refused:?}"
    );
    // A reader that finds no -wal makes an empty one: still a lost one, and
    // so is one cut short (each named for what it is; before, all were
    // "gone": found by a black-box probe).
    // The reader says what it cannot show (before, `show` said "not in the
    // journal" of a GUID the lost -wal held, with no warning; found by a
    // black-box probe).
    let shown = relayhub(&["journal", "--journal", file.to_str().unwrap(), "show", &g]);
    assert!(
        shown
            .stderr
            .contains("warning: the journal's -wal file is gone")
            && shown.stderr.contains("may have moved money"),
        "{shown:?}"
    );
    let listed = relayhub(&["journal", "--journal", file.to_str().unwrap(), "list"]);
    assert!(listed.code == Some(0), "{listed:?}");
    assert!(
        listed
            .stderr
            .contains("warning: the journal's -wal file is empty"),
        "{listed:?}"
    );
    let refused = serve_on(&core.url(), &file);
    assert!(
        refused.code != Some(0) && refused.stderr.contains("its -wal file is empty"),
        "{refused:?}"
    );
    assert!(
        std::fs::metadata(&wal).map_or(0, |m| m.len()) == 0,
        "left as found"
    );
    std::fs::write(&wal, [0x37, 0x7f, 0x06, 0x82]).unwrap();
    let refused = serve_on(&core.url(), &file);
    assert!(
        refused.code != Some(0)
            && refused
                .stderr
                .contains("its -wal file is damaged: 4 bytes, shorter than a WAL's 32-byte header"),
        "{refused:?}"
    );
    assert_eq!(posts(&core, &g), 1);
}

/// A clean stop copies the journal into its file and empties the `-wal`
/// (its lock file then no longer says it keeps one), so the file alone is
/// the whole journal: a copy of it, without its `-wal` or its lock file,
/// replays every answer, and the original starts again without its `-wal`.
/// Before, a stopped hub's `-wal` held nearly everything (a new journal's
/// tables too): a copy of the file alone started as an empty journal and
/// posted every resend again (found by a black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_leaves_the_whole_journal_in_its_file() {
    let core = start_core().await;
    let dir = TempDir::new("journal-clean-stop");
    let file = dir.join("stopped.db");
    let mut hub = start_hub_process(&core.url(), &file, 3_000);
    let mut ch = hub.channel().await;
    let g = guid("WHOLE");
    let telegram = transfer(&g, 1_000);
    let first = within(ch.exchange(&telegram)).await.unwrap();
    assert_eq!(first.code, "0000", "{first:?}");
    assert!(hub.terminate().success());
    assert!(
        std::fs::metadata(wal_of(&file)).map_or(0, |m| m.len()) >= 32,
        "the -wal, started over, keeps its header: never empty"
    );
    let lock = std::fs::read_to_string(dir.join("stopped.db.lock")).unwrap();
    assert!(
        lock.contains("opened the journal") && !lock.contains("keeps the journal's -wal file"),
        "{lock}"
    );
    // The file alone, elsewhere.
    let elsewhere = TempDir::new("journal-clean-copy");
    let copy = elsewhere.join("copy.db");
    std::fs::copy(&file, &copy).unwrap();
    remove_journal_files(&file, &["-wal", "-shm"]);
    for journal in [&copy, &file] {
        let mut hub = start_hub_process(&core.url(), journal, 3_000);
        let mut ch = hub.channel().await;
        let again = within(ch.exchange(&telegram)).await.unwrap();
        assert_eq!(
            (&again.code, &again.body),
            (&first.code, &first.body),
            "{}: replayed",
            journal.display()
        );
        assert!(hub.terminate().success());
    }
    // A crash before the first transfer after a clean stop: the start wrote
    // to the emptied -wal before its lock file said the hub keeps it, so
    // the next start finds a -wal and is not refused (the first version of
    // this change was refused: "its -wal file is gone").
    let mut hub = start_hub_process(&core.url(), &file, 3_000);
    hub.sigkill();
    let mut hub = start_hub_process(&core.url(), &file, 3_000);
    let mut ch = hub.channel().await;
    let again = within(ch.exchange(&telegram)).await.unwrap();
    assert_eq!(again.code, "0000", "{again:?}");
    assert!(hub.terminate().success());
    assert_eq!(posts(&core, &g), 1);
}

/// The journal's `-wal` file.
fn wal_of(file: &std::path::Path) -> std::path::PathBuf {
    let mut wal = file.as_os_str().to_owned();
    wal.push("-wal");
    std::path::PathBuf::from(wal)
}

/// A journal file with a second hard link is refused at start: a hub on
/// the other name would take a lock file of its own and own the same
/// journal beside the first (before: both started; found by a black-box
/// probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_with_a_second_hard_link_is_refused() {
    let core = start_core().await;
    let dir = TempDir::new("journal-hard-link");
    let file = dir.join("journal.db");
    let mut hub = start_hub_process(&core.url(), &file, 3_000);
    std::fs::hard_link(&file, dir.join("other.db")).unwrap();
    let refused = serve_on(&core.url(), &dir.join("other.db"));
    assert!(
        refused.code != Some(0) && refused.stderr.contains("2 hard links"),
        "{refused:?}"
    );
    hub.sigkill();
}

/// Copies what the journal's -wal holds into its file, as the hub's own
/// checkpoints do in time, and leaves the -wal in place.
fn checkpoint_keeping_the_wal(file: &std::path::Path) {
    let conn = rusqlite::Connection::open(file).unwrap();
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .unwrap();
    let busy: i64 = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(0))
        .unwrap();
    assert_eq!(busy, 0, "checkpointed");
}

/// Removes the journal `file`'s files with these suffixes ("" the file
/// itself), those that are there.
fn remove_journal_files(file: &std::path::Path, suffixes: &[&str]) {
    for suffix in suffixes {
        let mut name = file.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(name);
    }
}

/// `relayhub serve` on the journal `file`, for a start that is refused.
fn serve_on(core_url: &str, file: &std::path::Path) -> Output {
    relayhub(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--core-url",
        core_url,
        "--journal",
        file.to_str().unwrap(),
    ])
}
