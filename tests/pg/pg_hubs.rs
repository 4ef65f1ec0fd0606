//! Two real `relayhub serve` processes sharing one PostgreSQL journal, in front
//! of one in-process corebank fixture: the promise of at most one POST per
//! GUID holds across hubs, when a hub dies mid-transfer, and when the database
//! goes away. Also the `relayhub journal` commands on a `postgres://` URL.
//!
//! Run through `scripts/with-postgres.sh cargo test`; without
//! `RELAYHUB_TEST_PG` each test says on stderr that it is skipped and passes,
//! or fails under `CI=true` (see `pg_common::test_db`).

use crate::common::{trf, trf_fields};
use crate::pg_common;

use std::process::Command;
use std::time::{Duration, Instant};

use corebank::{FaultMethod, FaultRule, Phase};
use pg_common::*;
use relayhub::journal::postgres::PgJournal;
use relayhub::journal::{Claim, Finish, State};

/// Late-answer window short enough for a short lease (budget 1000 ms +
/// window 500 ms + 1000 ms margin <= 3000 ms).
const SHORT_WINDOW: &str = "[[target]]\nname = \"core\"\nlate_answer_window_ms = 500\n";
const SHORT_LEASE_MS: u64 = 3_000;

fn journal_url(url: &str, hub: &str, extra: &str) -> String {
    with_params(url, &format!("hub_id={hub}{extra}"))
}

/// A core and two hubs (`hub-a`, `hub-b`, budget 3 s) in front of it,
/// sharing a fresh schema named after `tag`.
async fn two_hubs(base: &str, tag: &str) -> (corebank::CoreBank, Hub, Hub) {
    let url = fresh_schema(base, tag).await;
    let core = start_core().await;
    let a = spawn_hub(&core.url(), &journal_url(&url, "hub-a", ""), 3_000, None);
    let b = spawn_hub(&core.url(), &journal_url(&url, "hub-b", ""), 3_000, None);
    (core, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_guid_sent_to_two_hubs_at_once_is_posted_once() {
    let Some(base) = test_db() else { return };
    let (core, a, b) = two_hubs(&base, "both").await;

    for round in 0..3 {
        let g = guid("BOTH");
        // The core holds the POST a while, so both telegrams are in the hubs
        // while it runs: one hub posts, the other waits for its outcome.
        core.add_fault(FaultRule::guid(&g).method(FaultMethod::Post).delay_ms(400));
        let t = transfer(&g, 1_000);
        let (ra, rb) = tokio::join!(send(&a, &t), send(&b, &t));
        assert_eq!(ra.code, "0000", "round {round}, hub a: {ra:?}");
        assert_eq!(rb.code, "0000", "round {round}, hub b: {rb:?}");
        assert_eq!(ra.body, rb.body, "both channels get the same answer");
        // The hub that finds the other's row asks the core at once (a GET).
        assert_eq!(calls(&core, &g).0, 1, "round {round}: one POST");
    }
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 3 * 1_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resend_to_another_hub_after_e901_is_an_inquiry() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "e901").await;
    let core = start_core().await;
    // Hub a's call ends 500 ms after its budget, before the core answers, so
    // no late answer settles the row: the resend must ask.
    let a = spawn_hub(
        &core.url(),
        &journal_url(&url, "hub-a", ""),
        1_000,
        Some(SHORT_WINDOW),
    );
    let b = spawn_hub(&core.url(), &journal_url(&url, "hub-b", ""), 3_000, None);

    let g = guid("E901");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(2_000),
    );
    let t = transfer(&g, 2_500);
    let first = send(&a, &t).await;
    assert_eq!(first.code, "E901", "hub a's budget ends first: {first:?}");

    // The core finishes the transfer; the resend lands on the other hub.
    assert!(
        within(core.wait_applied(&g)).await,
        "the transfer was applied"
    );
    let resend = send(&b, &t).await;
    assert_eq!(resend.code, "0000", "answered by inquiry: {resend:?}");
    let (posts, gets) = calls(&core, &g);
    assert_eq!(posts, 1, "no second POST");
    assert!(gets >= 1, "hub b asked the core (GET), got {gets}");
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 2_500));

    // A further repeat, to either hub, replays the stored answer: no call.
    let again = send(&a, &t).await;
    assert_eq!((again.code.as_str(), &again.body), ("0000", &resend.body));
    assert_eq!(calls(&core, &g), (posts, gets));
}

/// Sends `telegram` to `hub` in a task of its own, for a hub about to be
/// killed: the exchange's result (an error once the hub died unanswering).
fn exchange_in_background(
    hub: &Hub,
    telegram: &[u8],
) -> tokio::task::JoinHandle<std::io::Result<relayhub::client::Answer>> {
    let (addr, t) = (hub.addr.clone(), telegram.to_vec());
    tokio::spawn(async move {
        let mut ch = relayhub::client::Channel::connect(&addr, relayhub::frame::PrefixMode::Ascii)
            .await
            .expect("connect to the hub");
        ch.exchange(&t).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hub_killed_mid_transfer_is_never_posted_again() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "kill").await;
    let core = start_core().await;
    let lease = format!("&lease_ms={SHORT_LEASE_MS}");
    let mut a = spawn_hub(
        &core.url(),
        &journal_url(&url, "hub-a", &lease),
        1_000,
        Some(SHORT_WINDOW),
    );
    let b = spawn_hub(
        &core.url(),
        &journal_url(&url, "hub-b", &lease),
        1_000,
        Some(SHORT_WINDOW),
    );

    let g = guid("KILL");
    // Long enough that the transfer is still running at the core when the
    // lease of the dead hub runs out.
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(SHORT_LEASE_MS + 2_000),
    );
    let t = transfer(&g, 3_000);
    let first = exchange_in_background(&a, &t);
    within(core.wait_received(&g)).await;
    a.kill();
    let killed_at = Instant::now();
    assert!(
        within(first).await.unwrap().is_err(),
        "hub a died before answering"
    );

    // Hub a's row says `sending`: hub b asks the core, which is still at it
    // ("processing"), waits for the row within its budget and answers
    // "unknown".
    let during = send(&b, &t).await;
    let waited = killed_at.elapsed();
    assert_eq!(during.code, "E901", "{during:?}");
    assert!(
        waited < Duration::from_millis(2_500),
        "answered within its budget: {waited:?}"
    );
    assert_eq!(calls(&core, &g).0, 1, "no second POST");

    // The core finishes; hub a's lease is over by then (checked, not assumed).
    assert!(within(core.wait_applied(&g)).await);
    let check = raw_client(&url).await;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let expired: bool = check
            .query_one(
                // NULL once taken over (hub b does so once a lease).
                "SELECT coalesce(lease_until_ms < (extract(epoch FROM clock_timestamp()) * 1000)::bigint, true) \
                 FROM relayhub_journal WHERE guid = $1",
                &[&g],
            )
            .await
            .unwrap()
            .get(0);
        if expired {
            break;
        }
        assert!(Instant::now() < deadline, "hub a's lease never ran out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = send(&b, &t).await;
    let settled = killed_at.elapsed();
    assert_eq!(after.code, "0000", "answered by inquiry: {after:?}");
    let (posts, gets) = calls(&core, &g);
    assert_eq!(posts, 1, "never a second POST");
    assert!(gets >= 1, "the resend became an inquiry");
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 3_000));
    println!(
        "resend during the dead hub's lease: E901 after {waited:?}; settled by inquiry {settled:?} after the kill"
    );

    let j = PgJournal::open(&journal_url(&url, "inspector", ""))
        .await
        .unwrap();
    let notes: Vec<String> = j
        .history(&g)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.note)
        .collect();
    // Taken over by hub b's claim of the resend, or by its periodic recovery.
    assert!(
        notes
            .iter()
            .any(|n| n.contains("lease of hub hub-a#") || n.contains("when hub hub-a#")),
        "{notes:?}"
    );
}

/// A hub dies while its POST is held on the wire, and the core answers it
/// 503 (nothing recorded). A channel that then only inquires, at the other
/// hub, gets E901 while the dead hub's lease and the wire grace run, then
/// E904: the other hub takes the dead hub's rows over once a lease, as a
/// start-up does (before: E901 for as long as it asked, since no resend
/// came to take the row over; found by a chaos run). One POST.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_inquiry_settles_a_dead_hubs_transfer_without_a_resend() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "inqdead").await;
    let core = start_core().await;
    let lease = format!("&lease_ms={SHORT_LEASE_MS}");
    let toml = format!("{SHORT_WINDOW}wire_grace_ms = 1500\n");
    let mut a = spawn_hub(
        &core.url(),
        &journal_url(&url, "hub-a", &lease),
        1_000,
        Some(&toml),
    );
    let b = spawn_hub(
        &core.url(),
        &journal_url(&url, "hub-b", &lease),
        1_000,
        Some(&toml),
    );
    let g = guid("INQDEAD");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(500)
            .status(503)
            .times(1),
    );
    let t = transfer(&g, 3_000);
    let first = exchange_in_background(&a, &t);
    let g2 = g.clone();
    within(core.wait_stats(move |s| s.by_guid.get(&g2).is_some_and(|x| x.post > 0))).await;
    a.kill();
    assert!(within(first).await.unwrap().is_err(), "hub a died first");

    let deadline = Instant::now() + PATIENCE;
    let answer = loop {
        let q = guid("INQDEADQ");
        let answer = send(&b, &crate::common::inquiry(&q, &g)).await;
        if answer.code != "E901" {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "INQ001 still E901 after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(answer.code, "E904", "{answer:?}");
    assert_eq!(calls(&core, &g).0, 1, "one POST");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_database_down_nothing_is_sent() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "dbdown").await;
    let core = start_core().await;
    let proxy = Proxy::start(db_addr(&base)).await;
    let hub = spawn_hub(
        &core.url(),
        &journal_url(&proxy.url(&url), "hub-a", ""),
        3_000,
        None,
    );

    let g1 = guid("UP");
    let t1 = transfer(&g1, 100);
    assert_eq!(send(&hub, &t1).await.code, "0000");

    proxy.cut().await;
    let g2 = guid("DOWN");
    let t2 = transfer(&g2, 200);
    let started = Instant::now();
    let down = send(&hub, &t2).await;
    let took = started.elapsed();
    // Not sent, and E901 unless the core gives a final B-code or E500:
    // without the row an earlier attempt of the GUID still on its way cannot
    // be ruled out. (Before: E903, "no money moved".)
    assert_eq!(down.code, "E901", "not sent: {down:?}");
    assert!(took < Duration::from_millis(2_000), "answered in {took:?}");
    assert_eq!(calls(&core, &g2), (0, 1), "not posted; the core was asked");
    // A resend of a transfer that moved money (its 0000 lost on the way to
    // the channel, say): the core says it was processed, so the answer is
    // E901, not E903, "no money moved". Without the row this telegram's
    // body cannot be checked against the processed one, so not its 0000.
    // (Before: E903.)
    let repeat = send(&hub, &t1).await;
    assert_eq!(repeat.code, "E901", "{repeat:?}");
    assert_eq!(calls(&core, &g1), (1, 1), "asked, not posted again");
    // One the core refused for a business reason: its final B-code.
    let g4 = guid("LIMIT");
    proxy.restore();
    // Past the core's limit.
    let poor = trf(&g4, &trf_fields(ACC1, BANK, ACC2, 900_000_000, "scale-out"));
    assert_eq!(send(&hub, &poor).await.code, "B203");
    proxy.cut().await;
    let again = send(&hub, &poor).await;
    assert_eq!(again.code, "B203", "the core's final answer: {again:?}");
    assert_eq!(calls(&core, &g4), (1, 1));
    println!("database down: E901 after {took:?}");

    // The database is back: the refused GUID was never recorded, so its
    // resend goes through as new, once.
    proxy.restore();
    let back = send(&hub, &t2).await;
    assert_eq!(back.code, "0000", "{back:?}");
    assert_eq!(calls(&core, &g2), (1, 1));
    assert_eq!(send(&hub, &t1).await.code, "0000", "replayed");
    assert_eq!(calls(&core, &g1), (1, 1));

    // The database hangs (connections open, no answers): the journal call
    // ends at its timeout (1 s by default), well inside the 3 s budget.
    proxy.freeze().await;
    let g3 = guid("HANG");
    let t3 = transfer(&g3, 300);
    let started = Instant::now();
    let hung = send(&hub, &t3).await;
    let took = started.elapsed();
    assert_eq!(hung.code, "E901", "not sent: {hung:?}");
    assert_eq!(calls(&core, &g3), (0, 1), "not posted; the core was asked");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2_000),
        "answered in {took:?}"
    );
    println!("database hanging: E901 after {took:?}");

    // Back again: the stuck connection was dropped, not reused.
    proxy.restore();
    let back = send(&hub, &t3).await;
    assert_eq!(back.code, "0000", "{back:?}");
    assert_eq!(calls(&core, &g3), (1, 1));
}

fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(relayhub_bin())
        .args(args)
        .output()
        .expect("run relayhub");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The journal tools that only look (`list`, `show`, `hubs`) neither
/// create nor migrate a shared journal: a look from a newer build at a
/// journal that older hubs share would otherwise migrate it under them, and
/// an older hub that restarts would be refused (found by a black-box
/// upgrade probe). They refuse an older schema, saying so; `--create`
/// migrates it as a hub would.
#[tokio::test(flavor = "multi_thread")]
async fn tools_that_look_do_not_migrate_a_shared_journal() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "nomigrate").await;
    let raw = raw_client(&url).await;
    let (code, _, err) = cli(&["journal", "--journal", &url, "list"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no relayhub journal in this database"),
        "{err}"
    );
    // The schema as the build before this one left it: version 4.
    raw.batch_execute(
        "CREATE TABLE relayhub_schema_version (version integer NOT NULL PRIMARY KEY, \
         applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .unwrap();
    for (i, sql) in [
        include_str!("../../migrations/postgres/0001_init.sql"),
        include_str!("../../migrations/postgres/0002_attempt_url.sql"),
        include_str!("../../migrations/postgres/0003_prune_index.sql"),
        include_str!("../../migrations/postgres/0004_liveness.sql"),
    ]
    .iter()
    .enumerate()
    {
        raw.batch_execute(sql).await.unwrap();
        let v = i as i32 + 1;
        raw.execute(
            "INSERT INTO relayhub_schema_version (version) VALUES ($1)",
            &[&v],
        )
        .await
        .unwrap();
    }
    let version = || async {
        let row = raw_client(&url)
            .await
            .query_one("SELECT max(version) FROM relayhub_schema_version", &[])
            .await
            .unwrap();
        row.get::<_, i32>(0)
    };
    let g = guid("LOOK");
    for args in [
        vec!["journal", "--journal", &url, "list"],
        vec!["journal", "--journal", &url, "hubs"],
        vec!["journal", "--journal", &url, "show", &g],
    ] {
        let (code, _, err) = cli(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains("schema version 4 is older than this build's"),
            "{err}"
        );
        assert!(
            err.contains("does not migrate") && err.contains("--create"),
            "{err}"
        );
        assert_eq!(version().await, 4, "{args:?} migrated the journal");
    }
    let (code, _, err) = cli(&["journal", "--journal", &url, "list", "--create"]);
    assert_eq!(code, 0, "{err}");
    assert!(version().await > 4, "--create migrates");
    let (code, _, err) = cli(&["journal", "--journal", &url, "list"]);
    assert_eq!(code, 0, "{err}");
    // A schema newer than this build knows is refused too.
    raw.execute(
        "INSERT INTO relayhub_schema_version (version) VALUES (99)",
        &[],
    )
    .await
    .unwrap();
    let (code, _, err) = cli(&["journal", "--journal", &url, "list"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("schema version 99 is newer than this build knows"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn journal_commands_work_on_a_postgres_url() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "cli").await;
    let core = start_core().await;

    // A transfer a hub left unknown; its lease has run out.
    let g = guid("CLI");
    let j = PgJournal::open(&journal_url(&url, "hub-gone", ""))
        .await
        .unwrap();
    assert_eq!(
        j.claim(&g, "TRF001", "fp", &core.url(), 1).await.unwrap(),
        Claim::New
    );
    let e901 = Finish {
        state: State::Unknown,
        code: "E901".into(),
        answer: None,
        error: Some("read timeout".into()),
        note: "attempt 1: unknown".into(),
        attempt: None,
    };
    assert!(j.finish_if(&g, &[State::Sending], e901, 2).await.unwrap());
    raw_client(&url)
        .await
        .execute(
            // Long ago on the database's clock: past the wire grace too.
            "UPDATE relayhub_journal SET lease_until_ms = 0, last_attempt_ms = 0 WHERE guid = $1",
            &[&g],
        )
        .await
        .unwrap();

    let (code, out, err) = cli(&["journal", "--journal", &url, "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&g) && out.contains("unknown"), "{out}");

    let (code, out, err) = cli(&["journal", "--journal", &url, "show", &g]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("\"state\": \"unknown\"") && out.contains("attempt 1 by hub hub-gone"),
        "{out}"
    );

    // The core never got it: reconcile records "never received" (E904).
    let (code, out, err) = cli(&[
        "journal",
        "--journal",
        &url,
        "reconcile",
        "--core-url",
        &core.url(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&g) && out.contains("E904"), "{out}\n{err}");
    assert_eq!(calls(&core, &g), (0, 1), "one GET, no POST");
    let (code, out, _) = cli(&["journal", "--journal", &url, "list", "--state", "not_sent"]);
    assert_eq!(code, 0);
    assert!(out.contains(&g) && out.contains("E904"), "{out}");

    let absent = guid("NOPE");
    let (code, _, err) = cli(&["journal", "--journal", &url, "show", &absent]);
    assert_eq!(code, 3, "{err}");
    // A malformed GUID is named as one.
    let (code, _, err) = cli(&["journal", "--journal", &url, "show", "NOPE"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("a GUID is 32"), "{err}");

    // A bad URL is refused without showing the password.
    let (code, _, err) = cli(&[
        "journal",
        "--journal",
        "postgres://u:hunter2@127.0.0.1:1/x?timeout_ms=200",
        "list",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("cannot connect") && !err.contains("hunter2"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hub_refuses_a_lease_shorter_than_its_calls() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "short").await;
    // Default late-answer window (30 s) with a 3 s lease: refused at start.
    let out = Command::new(relayhub_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--core-url",
            "http://127.0.0.1:9",
            "--journal",
            &journal_url(&url, "hub-a", "&lease_ms=3000"),
        ])
        .output()
        .expect("run relayhub");
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lease_ms=3000 is shorter"), "{err}");
}

/// A transfer whose POST is held on its way to the core (a balancer) past
/// the hub's budget and its call (late-answer window 0): E901. Then the
/// database goes away and the channel resends: the core has not received
/// the GUID yet, but without the row that is no proof, so the answer is
/// E901 again, not E903 ("no money moved"), and nothing is posted. The held
/// POST then lands and moves the money, once. (Before: E903; found by a
/// review.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_database_down_a_post_still_on_its_way_is_not_called_unsent() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "dbdownwire").await;
    let core = start_core().await;
    let wire = crate::common::Proxy::start(core.addr()).await;
    wire.hold_posts(Some(Duration::from_millis(2_500)));
    let db = Proxy::start(db_addr(&base)).await;
    let hub = spawn_hub(
        &wire.url(),
        &journal_url(&db.url(&url), "hub-a", ""),
        1_000,
        Some("[[target]]\nname = \"core\"\nlate_answer_window_ms = 0\n"),
    );
    let g = guid("WIRE");
    let t = transfer(&g, 100);
    assert_eq!(send(&hub, &t).await.code, "E901");
    // The hub's call is over (a call still running would make the resend
    // E901 without asking the core): it ended at the budget, or as a late
    // call handed on at the budget, which then ended.
    let call_over = |log: &str| {
        log.contains("attempt 1: unknown")
            && (!log.contains("the call ends with it") || log.contains("late call ended"))
    };
    let started = Instant::now();
    while !call_over(&hub.stderr()) {
        assert!(started.elapsed() < PATIENCE, "{}", hub.stderr());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    db.cut().await;
    let resend = send(&hub, &t).await;
    assert_eq!(resend.code, "E901", "{resend:?}");
    assert_eq!(
        calls(&core, &g),
        (0, 1),
        "asked; the POST is still held: {}",
        hub.stderr()
    );

    within(core.wait_received(&g)).await;
    assert_eq!(calls(&core, &g).0, 1, "the held POST, once");
    assert_eq!(wire.whole_posts(&g), 1);
}

/// A host cut off from both its database and the core: a resend of a
/// transfer answered 0000 (its answer lost on the way to the channel) cannot
/// be checked with either, so it is E901, not E903 ("no money moved"), and
/// nothing is posted. (Before: E903; found by a review.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cut_off_from_database_and_core_a_processed_guid_is_not_called_unsent() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "dbcorecut").await;
    let core = start_core().await;
    let wire = crate::common::Proxy::start(core.addr()).await;
    let db = Proxy::start(db_addr(&base)).await;
    let hub = spawn_hub(
        &wire.url(),
        &journal_url(&db.url(&url), "hub-a", ""),
        3_000,
        None,
    );
    let g = guid("CUTOFF");
    let t = transfer(&g, 100);
    assert_eq!(send(&hub, &t).await.code, "0000");

    db.cut().await;
    // Connects to the core are refused from now on, and the hub's pooled
    // connection is closed once idle: the GET cannot be sent.
    wire.set_mode(crate::common::ProxyMode::Refuse);
    wire.mode_applied().await;
    let started = Instant::now();
    while wire.reaped() == 0 {
        assert!(
            started.elapsed() < PATIENCE,
            "the idle connection stays open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let resend = send(&hub, &t).await;
    assert_eq!(resend.code, "E901", "{resend:?}");
    assert_eq!(calls(&core, &g), (1, 0), "not posted again, and not asked");
}

/// A draining hub takes no transfer further, but answers a repeat for its
/// GUID from the shared journal, not with E903 ("no money moved"): a
/// transfer another hub answered 0000 gets that answer, one another hub is
/// posting right now (its row `sending`) gets E901, a new GUID E903. The
/// draining hub posts and asks nothing (before: E903 for all three).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_hub_answers_a_repeat_from_the_shared_journal() {
    let Some(base) = test_db() else { return };
    let (core, a, b) = two_hubs(&base, "drain").await;
    let (done, running, new, held) = (guid("DONE"), guid("RUN"), guid("NEW"), guid("HELD"));
    let first = send(&a, &transfer(&done, 100)).await;
    assert_eq!(first.code, "0000", "{first:?}");
    // Connections to hub b, open before its drain (each proven by a first
    // exchange).
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut ch = b.channel().await;
        let t = transfer(&guid("OPEN"), 10);
        assert_eq!(within(ch.exchange(&t)).await.unwrap().code, "0000");
        open.push(ch);
    }
    // Hub a posts `running`, and hub b has `held` in flight (which keeps
    // its drain's wait going): the core holds both.
    for g in [&running, &held] {
        core.add_fault(
            FaultRule::guid(g)
                .method(FaultMethod::Post)
                .delay_ms(2_000)
                .phase(Phase::BeforeApply),
        );
    }
    let mut at_a = a.channel().await;
    within(at_a.send(&transfer(&running, 100))).await.unwrap();
    within(core.wait_received(&running)).await;
    let mut at_b = b.channel().await;
    within(at_b.send(&transfer(&held, 100))).await.unwrap();
    within(core.wait_received(&held)).await;

    b.drain().await;
    let [mut replayed, mut unknown, mut fresh]: [_; 3] = open.try_into().ok().unwrap();
    let answer = within(replayed.exchange(&transfer(&done, 100)))
        .await
        .unwrap();
    assert_eq!((answer.code.as_str(), &answer.body), ("0000", &first.body));
    let answer = within(unknown.exchange(&transfer(&running, 100)))
        .await
        .unwrap();
    assert_eq!(answer.code, "E901", "hub a is posting it: {answer:?}");
    let answer = within(fresh.exchange(&transfer(&new, 100))).await.unwrap();
    assert_eq!(answer.code, "E903", "{answer:?}");

    for ch in [&mut at_a, &mut at_b] {
        let raw = within(ch.recv()).await.unwrap().expect("an answer");
        let answer = relayhub::client::Answer::parse(&raw).unwrap();
        assert_eq!(answer.code, "0000", "{answer:?}");
    }
    assert_eq!(calls(&core, &done), (1, 0));
    assert_eq!(calls(&core, &running), (1, 0));
    assert_eq!(calls(&core, &new), (0, 0));
    assert_eq!(calls(&core, &held), (1, 0));
}
