//! The shared journal store against a real PostgreSQL: the guarantees of the
//! embedded store (atomic claim, compare-and-set resend, conditional finish,
//! history), held across two hubs, plus what only a shared store needs
//! (leases, concurrent migrations, bounded failure when the database is gone).
//!
//! Run through `scripts/with-postgres.sh cargo test`; without
//! `RELAYHUB_TEST_PG` each test says on stderr that it is skipped and passes,
//! or fails under `CI=true` (see `pg_common::test_db`).

use crate::pg_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_common::*;
use relayhub::journal::postgres::PgJournal;
use relayhub::journal::{Claim, Finish, Journal, JournalError, State};

fn finish(state: State, code: &str, note: &str) -> Finish {
    Finish {
        state,
        code: code.into(),
        answer: (code == "0000").then(|| b"answer body".to_vec()),
        error: (state != State::Done).then(|| format!("{code} reason")),
        note: note.into(),
        attempt: None,
    }
}

/// Two hubs (two pools, two ids) on one fresh schema.
async fn two_hubs(base: &str, tag: &str, lease_ms: u64) -> (String, PgJournal, PgJournal) {
    let url = fresh_schema(base, tag).await;
    let a = PgJournal::open(&with_params(
        &url,
        &format!("hub_id=hub-a&lease_ms={lease_ms}"),
    ))
    .await
    .expect("hub a opens");
    let b = PgJournal::open(&with_params(
        &url,
        &format!("hub_id=hub-b&lease_ms={lease_ms}"),
    ))
    .await
    .expect("hub b opens");
    (url, a, b)
}

/// Ends a row's lease now, as if its time had run out.
async fn expire_lease(url: &str, guid: &str) {
    let c = raw_client(url).await;
    let n = c
        .execute(
            "UPDATE relayhub_journal SET lease_until_ms = lease_until_ms - 86400000 WHERE guid = $1",
            &[&guid],
        )
        .await
        .unwrap();
    assert_eq!(n, 1, "no row {guid} to expire");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_claims_from_two_hubs_make_one_new() {
    let Some(base) = test_db() else { return };
    let (_url, a, b) = two_hubs(&base, "claim", 60_000).await;
    for round in 0..3 {
        let g = format!("G-RACE-{round}");
        let mut tasks = Vec::new();
        for i in 0..50 {
            let j = if i % 2 == 0 { a.clone() } else { b.clone() };
            let g = g.clone();
            tasks.push(tokio::spawn(async move {
                j.claim(&g, "TRF001", "fp", "http://core", 1_000 + i).await
            }));
        }
        let mut new = 0;
        for t in tasks {
            match t.await.unwrap().expect("claim") {
                Claim::New => new += 1,
                Claim::Existing(row) => {
                    assert_eq!(row.state, State::Sending);
                    assert_eq!(row.attempts, 1);
                    assert_eq!(row.fingerprint, "fp");
                }
            }
        }
        assert_eq!(new, 1, "round {round}: Claim::New given {new} times");
        let history = a.history(&g).await.unwrap();
        assert_eq!(history.len(), 1, "{history:?}");
        assert!(
            history[0].note.starts_with("attempt 1 by hub hub-"),
            "{history:?}"
        );
        let (owner, lease) = a.lease_of(&g).await.unwrap().expect("row");
        assert!(owner.is_some() && lease.is_some(), "{owner:?} {lease:?}");
    }
}

/// Reads asked for together are answered in batches (one statement for
/// many GUIDs): each still gets its own row, or none, however many come at
/// once and whatever the order; a GUID asked for twice gets its row twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousands_of_reads_at_once_each_get_their_own_row() {
    let Some(base) = test_db() else { return };
    let (_url, a, _b) = two_hubs(&base, "reads", 60_000).await;
    for i in 0..300 {
        let g = format!("G-READ-{i}");
        assert_eq!(
            a.claim(&g, "TRF001", &format!("fp{i}"), "http://core", i)
                .await
                .unwrap(),
            Claim::New
        );
    }
    let mut tasks = Vec::new();
    for round in 0..2 {
        for i in (0..600).rev() {
            let (j, g) = (a.clone(), format!("G-READ-{i}"));
            tasks.push(tokio::spawn(async move { (round, i, j.get(&g).await) }));
        }
    }
    for t in tasks {
        let (round, i, row) = t.await.unwrap();
        let row = row.unwrap_or_else(|e| panic!("round {round}, G-READ-{i}: {e}"));
        if i < 300 {
            let row = row.unwrap_or_else(|| panic!("round {round}: G-READ-{i} has a row"));
            assert_eq!(row.guid, format!("G-READ-{i}"));
            assert_eq!(row.fingerprint, format!("fp{i}"));
            assert_eq!(row.state, State::Sending);
        } else {
            assert_eq!(row, None, "round {round}: G-READ-{i} was never claimed");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_resend_is_a_compare_and_set_across_hubs() {
    let Some(base) = test_db() else { return };
    let (_url, a, b) = two_hubs(&base, "resend", 60_000).await;
    assert_eq!(
        a.claim("g", "TRF001", "fp", "http://core", 10)
            .await
            .unwrap(),
        Claim::New
    );
    assert!(
        a.finish_if(
            "g",
            &[State::Sending],
            finish(State::NotSent, "E902", "not sent"),
            20
        )
        .await
        .unwrap()
    );
    let mut tasks = Vec::new();
    for i in 0..20 {
        let j = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            j.claim_resend("g", 1, "http://core", 30 + i).await
        }));
    }
    let mut won = 0;
    for t in tasks {
        if t.await.unwrap().expect("claim_resend") {
            won += 1;
        }
    }
    assert_eq!(won, 1, "claim_resend won {won} times");
    let row = a.get("g").await.unwrap().unwrap();
    assert_eq!((row.state, row.attempts), (State::Sending, 2));
    // A stale count, or a row that is not "not sent", never wins.
    assert!(!b.claim_resend("g", 1, "http://core", 99).await.unwrap());
    assert!(!b.claim_resend("g", 2, "http://core", 99).await.unwrap());
    assert!(!b.claim_resend("nope", 0, "http://core", 99).await.unwrap());
    let notes: Vec<String> = a
        .history("g")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.note)
        .collect();
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(notes[2].starts_with("attempt 2 by hub hub-"), "{notes:?}");
}

/// A claim and a resend's claim stamp the attempt's grace on the row, which
/// every hub reads, a takeover's too (schema version 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_stamp_the_attempts_grace_for_every_hub() {
    use relayhub::journal::AttemptTo;
    let Some(base) = test_db() else { return };
    let (url, a, b) = two_hubs(&base, "grace", 60_000).await;
    let to = |grace_ms| AttemptTo {
        url: "http://core",
        grace_ms,
    };
    assert_eq!(
        a.claim_to("g", "TRF001", "fp", to(Some(38_000)), 10)
            .await
            .unwrap(),
        Claim::New
    );
    expire_lease(&url, "g").await;
    let Claim::Existing(row) = b
        .claim_to("g", "TRF001", "fp", to(Some(5_000)), 20)
        .await
        .unwrap()
    else {
        panic!("the GUID exists")
    };
    assert_eq!((row.state, row.grace_ms), (State::Unknown, Some(38_000)));
    assert!(
        b.finish_if(
            "g",
            &[State::Unknown],
            finish(State::NotSent, "E904", "never received"),
            30
        )
        .await
        .unwrap()
    );
    assert!(
        b.claim_resend_to("g", 1, to(Some(90_000)), 40)
            .await
            .unwrap()
    );
    assert_eq!(a.get("g").await.unwrap().unwrap().grace_ms, Some(90_000));
    // A resend claimed by a hub of a build before the stamp (attempts moved
    // on, the grace columns left alone) reads as unstamped: the earlier
    // attempt's grace says nothing about it.
    raw_client(&url)
        .await
        .batch_execute(
            "UPDATE relayhub_journal SET state = 'not_sent' WHERE guid = 'g'; \
             UPDATE relayhub_journal SET state = 'sending', attempts = attempts + 1 \
             WHERE guid = 'g';",
        )
        .await
        .unwrap();
    assert_eq!(a.get("g").await.unwrap().unwrap().grace_ms, None);
    b.claim("plain", "TRF001", "fp", "http://core", 50)
        .await
        .unwrap();
    assert_eq!(a.get("plain").await.unwrap().unwrap().grace_ms, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_events_and_conditional_finish_round_trip() {
    let Some(base) = test_db() else { return };
    let (_url, a, b) = two_hubs(&base, "rows", 60_000).await;
    assert_eq!(
        a.claim("g1", "TRF001", "fp1", "http://core", 100)
            .await
            .unwrap(),
        Claim::New
    );
    assert_eq!(
        a.claim("g2", "TRF001", "fp2", "http://core", 101)
            .await
            .unwrap(),
        Claim::New
    );

    // finish_if only in the listed states; finish in any.
    assert!(
        !a.finish_if(
            "g1",
            &[State::Unknown],
            finish(State::Done, "0000", "x"),
            110
        )
        .await
        .unwrap()
    );
    assert!(
        a.finish_if(
            "g1",
            &[State::Sending],
            finish(State::Done, "0000", "processed"),
            120
        )
        .await
        .unwrap()
    );
    assert!(
        !b.finish_if(
            "g1",
            &[State::Sending, State::Unknown],
            finish(State::Done, "B201", "late"),
            130
        )
        .await
        .unwrap(),
        "a stale writer must not overwrite a final answer"
    );
    assert!(
        !a.finish_if("nope", &[], finish(State::Done, "0000", "x"), 1)
            .await
            .unwrap()
    );
    a.finish("g2", finish(State::Unknown, "E901", "timed out"), 140)
        .await
        .unwrap();

    let row = b.get("g1").await.unwrap().expect("row g1");
    assert_eq!(row.state, State::Done);
    assert_eq!(row.code.as_deref(), Some("0000"));
    assert_eq!(row.answer.as_deref(), Some(&b"answer body"[..]));
    assert_eq!(row.tx_code, "TRF001");
    assert_eq!(row.attempts, 1);
    assert_eq!((row.created_ms, row.answered_ms), (100, Some(120)));
    // The retention counts from `updated_ms` on the database's clock: an
    // outcome never stamps it earlier than that clock (this test's hub says
    // 120 ms after the epoch).
    assert!(
        row.updated_ms >= relayhub::journal::now_ms() - 60_000,
        "{}",
        row.updated_ms
    );
    // The attempt is stamped with the database's clock, whatever the hub's
    // says: its age is judged on one clock across hubs.
    let db_now = a.clock_ms().await.unwrap();
    assert!(
        (db_now - 60_000..=db_now).contains(&row.last_attempt_ms),
        "last_attempt_ms {} against the database's now {db_now}",
        row.last_attempt_ms
    );
    assert_eq!(row.last_error, None);
    let (_, lease) = a.lease_of("g1").await.unwrap().unwrap();
    assert_eq!(lease, None, "a final answer ends the lease");
    let (_, lease) = a.lease_of("g2").await.unwrap().unwrap();
    assert!(
        lease.is_some(),
        "unknown keeps the lease (late-answer window)"
    );

    let g2 = b.get("g2").await.unwrap().unwrap();
    assert_eq!(g2.last_error.as_deref(), Some("E901 reason"));
    assert_eq!(b.get("nope").await.unwrap(), None);

    let h = b.history("g1").await.unwrap();
    let states: Vec<State> = h.iter().map(|e| e.state).collect();
    assert_eq!(states, [State::Sending, State::Done]);
    assert_eq!(h[1].code.as_deref(), Some("0000"));
    assert_eq!(h[1].note, "processed");
    assert!(b.history("nope").await.unwrap().is_empty());

    let done = b.list(State::Done, 10).await.unwrap();
    assert_eq!(
        done.iter().map(|r| r.guid.as_str()).collect::<Vec<_>>(),
        ["g1"]
    );
    assert_eq!(b.list(State::Unknown, 0).await.unwrap().len(), 0);
    assert_eq!(b.list(State::Unknown, usize::MAX).await.unwrap().len(), 1);
    assert_eq!(b.count(State::Unknown).await.unwrap(), 1);
    assert_eq!(b.count(State::Done).await.unwrap(), 1);

    // A different body under a known GUID is visible to the other hub.
    match b
        .claim("g1", "TRF001", "other", "http://core", 200)
        .await
        .unwrap()
    {
        Claim::Existing(r) => assert_eq!(r.fingerprint, "fp1"),
        Claim::New => panic!("a known GUID claimed as new"),
    }

    // Pruning drops old settled rows and their history, never `sending` or
    // `unknown` ones.
    assert_eq!(
        a.claim("g3", "TRF001", "fp3", "http://core", 50)
            .await
            .unwrap(),
        Claim::New
    );
    // Past every row's `updated_ms` (outcomes stamp it on the database's
    // clock at the earliest).
    let later = relayhub::journal::now_ms() + 60_000;
    assert_eq!(a.unsettled_before(later).await.unwrap(), 2);
    assert_eq!(a.prune(later).await.unwrap(), 1);
    assert_eq!(a.get("g1").await.unwrap(), None);
    assert!(a.history("g1").await.unwrap().is_empty());
    assert_eq!(a.get("g3").await.unwrap().unwrap().state, State::Sending);
    assert_eq!(a.get("g2").await.unwrap().unwrap().state, State::Unknown);
    assert!(!a.history("g2").await.unwrap().is_empty());
}

/// Writes `n` settled rows (with one event each) straight into the tables,
/// updated at `at_ms + i`, every `unknown_every`-th one `unknown` instead.
/// Returns how many are unknown.
async fn fill(url: &str, n: i64, at_ms: i64, unknown_every: i64) -> u64 {
    let c = raw_client(url).await;
    c.execute(
        "INSERT INTO relayhub_journal (guid, tx_code, fingerprint, state, code, attempts, \
           last_attempt_ms, answered_ms, created_ms, updated_ms) \
         SELECT 'FILL' || lpad(i::text, 28, '0'), 'TRF001', 'fp', \
           CASE WHEN i % $3::bigint = 0 THEN 'unknown' ELSE 'done' END, \
           CASE WHEN i % $3::bigint = 0 THEN 'E901' ELSE '0000' END, 1, \
           $2::bigint + i, $2::bigint + i, $2::bigint + i, $2::bigint + i \
         FROM generate_series(0::bigint, $1::bigint - 1) AS i",
        &[&n, &at_ms, &unknown_every],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO relayhub_journal_events (guid, at_ms, state, code, note) \
         SELECT guid, updated_ms, state, code, 'filled' FROM relayhub_journal \
         WHERE guid LIKE 'FILL%'",
        &[],
    )
    .await
    .unwrap();
    ((n + unknown_every - 1) / unknown_every) as u64
}

/// Retention never forgets a transfer that is not settled: an unknown GUID
/// pruned would make its late resend a new POST. Settled rows go in batches,
/// through the partial index on `updated_ms`.
#[tokio::test(flavor = "multi_thread")]
async fn prune_in_batches_keeps_unsettled_rows() {
    let Some(base) = test_db() else { return };
    let (url, a, b) = two_hubs(&base, "prune", 60_000).await;
    let unknown = fill(&url, 5_000, 1_000, 7).await;
    assert_eq!(
        a.claim("in-flight", "TRF001", "fp", "http://core", 10)
            .await
            .unwrap(),
        Claim::New
    );
    assert_eq!(
        a.claim("fresh", "TRF001", "fp", "http://core", 100_000)
            .await
            .unwrap(),
        Claim::New
    );

    assert_eq!(b.unsettled_before(50_000).await.unwrap(), unknown + 1);
    assert_eq!(
        b.prune_in_batches(50_000, 300).await.unwrap(),
        5_000 - unknown
    );
    assert_eq!(b.count(State::Done).await.unwrap(), 0);
    assert_eq!(b.count(State::Unknown).await.unwrap(), unknown);
    assert_eq!(b.count(State::Sending).await.unwrap(), 2);
    let c = raw_client(&url).await;
    let events: i64 = c
        .query_one("SELECT count(*) FROM relayhub_journal_events", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(events, unknown as i64 + 2, "pruned rows' history stays");
    assert_eq!(b.prune(50_000).await.unwrap(), 0);

    // A resend of an unknown GUID long past the retention is still known:
    // the hub answers it by inquiry, not by a new POST.
    match a
        .claim(
            "FILL0000000000000000000000000000",
            "TRF001",
            "fp",
            "http://core",
            10_000_000,
        )
        .await
        .unwrap()
    {
        Claim::Existing(r) => assert_eq!(r.state, State::Unknown),
        Claim::New => panic!("an unknown GUID was pruned and claimed as new"),
    }

    // The prune's query can use the partial index (schema version 3).
    c.batch_execute("SET enable_seqscan = off").await.unwrap();
    let plan: Vec<String> = c
        .query(
            "EXPLAIN SELECT guid FROM relayhub_journal \
             WHERE state IN ('done', 'not_sent') AND updated_ms < 5 \
             ORDER BY updated_ms LIMIT 10",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        plan.iter()
            .any(|l| l.contains("relayhub_journal_settled_updated")),
        "{plan:?}"
    );
}

/// A tool (another process on the shared journal: `relayhub journal
/// reconcile`) beside a live hub steals nothing: recovery leaves the hub's
/// rows under lease alone, and its reconcile does not record "never
/// received" for the live hub's unknown transfer, nor print it.
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_beside_a_live_hub_takes_none_of_its_rows() {
    use relayhub::config::Overrides;
    use relayhub::daemon::{Source, build_targets};
    use relayhub::outcome::Code;
    use relayhub::relay::{Hub, ResendPolicy};
    use relayhub::rules::Rules;

    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "tool").await;
    let core = start_core().await;
    let hub = PgJournal::open(&with_params(&url, "hub_id=live&lease_ms=60000"))
        .await
        .unwrap();
    // Live: one call in flight, one answered E901 and still running.
    assert_eq!(
        hub.claim("flying", "TRF001", "fp", "http://core", 1)
            .await
            .unwrap(),
        Claim::New
    );
    assert_eq!(
        hub.claim("late", "TRF001", "fp", "http://core", 1)
            .await
            .unwrap(),
        Claim::New
    );
    assert!(
        hub.finish_if(
            "late",
            &[State::Sending],
            finish(State::Unknown, "E901", "timed out"),
            2
        )
        .await
        .unwrap()
    );

    // The tool, as `relayhub journal reconcile` builds it.
    let tool_url = with_params(&url, "hub_id=tool");
    let source = Source {
        file: None,
        overrides: Overrides {
            core_url: Some(core.url()),
            journal: Some(tool_url.clone()),
            ..Overrides::default()
        },
    };
    let config = source.load().unwrap();
    let (journal, _owner) = relayhub::daemon::open_journal(&tool_url, 16, true)
        .await
        .unwrap();
    let targets = build_targets(&config).unwrap();
    let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    let tool = Hub::new(
        Rules::build(&config, &names).unwrap(),
        targets,
        journal,
        Duration::from_millis(config.server.budget_ms),
        ResendPolicy::from(&config.journal),
    );
    assert_eq!(
        hub.get("flying").await.unwrap().unwrap().state,
        State::Sending
    );

    let report = relayhub::admin::reconcile(&tool).await.unwrap();
    assert_eq!(report, [("late".to_string(), Code::UNKNOWN)]);
    assert_eq!(calls(&core, "late"), (0, 1), "asked, not posted");
    assert_eq!(
        hub.get("late").await.unwrap().unwrap().state,
        State::Unknown
    );
    assert_eq!(
        hub.get("flying").await.unwrap().unwrap().state,
        State::Sending
    );
    let (owner, lease) = hub.lease_of("late").await.unwrap().unwrap();
    assert_eq!(owner.as_deref(), Some(hub.hub_id()));
    assert!(lease.is_some(), "the live hub keeps its lease");
}

#[tokio::test(flavor = "multi_thread")]
async fn recover_leaves_live_leases_and_settles_expired_ones() {
    let Some(base) = test_db() else { return };
    let (url, a, b) = two_hubs(&base, "lease", 60_000).await;
    assert_eq!(
        a.claim("live", "TRF001", "fp", "http://core", 1)
            .await
            .unwrap(),
        Claim::New
    );
    assert_eq!(
        a.claim("dead", "TRF001", "fp", "http://core", 2)
            .await
            .unwrap(),
        Claim::New
    );

    // Hub b starting up while hub a is mid-transfer: nothing of a's changes.
    assert_eq!(b.recover(10).await.unwrap(), 0);
    assert_eq!(b.get("live").await.unwrap().unwrap().state, State::Sending);

    // Hub a's lease on "dead" runs out (hub a died): the next start settles it.
    expire_lease(&url, "dead").await;
    assert_eq!(b.recover(20).await.unwrap(), 1);
    let dead = b.get("dead").await.unwrap().unwrap();
    assert_eq!((dead.state, dead.updated_ms), (State::Unknown, 20));
    let last = b.history("dead").await.unwrap().pop().unwrap();
    assert_eq!(
        (last.state, last.code.as_deref()),
        (State::Unknown, Some("E901"))
    );
    assert!(last.note.contains("hub-a"), "{last:?}");
    let why = dead.last_error.unwrap_or_default();
    assert!(why.starts_with("was in flight when hub hub-a"), "{why}");
    assert_eq!(b.get("live").await.unwrap().unwrap().state, State::Sending);
    assert_eq!(b.recover(30).await.unwrap(), 0, "recover is idempotent");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_that_finds_an_expired_lease_sees_unknown() {
    let Some(base) = test_db() else { return };
    let (url, a, b) = two_hubs(&base, "lazy", 60_000).await;
    assert_eq!(
        a.claim("g", "TRF001", "fp", "http://core", 1)
            .await
            .unwrap(),
        Claim::New
    );
    match b
        .claim("g", "TRF001", "fp", "http://core", 2)
        .await
        .unwrap()
    {
        Claim::Existing(r) => assert_eq!(r.state, State::Sending, "live lease"),
        Claim::New => panic!("claimed twice"),
    }
    expire_lease(&url, "g").await;
    match b
        .claim("g", "TRF001", "fp", "http://core", 3)
        .await
        .unwrap()
    {
        Claim::Existing(r) => {
            assert_eq!((r.state, r.attempts, r.updated_ms), (State::Unknown, 1, 3));
        }
        Claim::New => panic!("claimed twice"),
    }
    let h = b.history("g").await.unwrap();
    assert_eq!(h.len(), 2, "{h:?}");
    assert!(
        h[1].note.contains("lease of hub hub-a#") && h[1].note.ends_with("expired while in flight"),
        "{h:?}"
    );
    // The owner's late answer still lands on the unknown row.
    assert!(
        a.finish_if(
            "g",
            &[State::Sending, State::Unknown],
            finish(State::Done, "0000", "late"),
            4
        )
        .await
        .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_lease_runs_out_on_the_database_clock() {
    let Some(base) = test_db() else { return };
    // The shortest lease allowed: this test waits for it to end.
    let (_url, a, b) = two_hubs(&base, "clock", 1_000).await;
    assert_eq!(
        a.claim("g", "TRF001", "fp", "http://core", 1)
            .await
            .unwrap(),
        Claim::New
    );
    let claimed = Instant::now();
    assert_eq!(b.recover(2).await.unwrap(), 0);
    // Poll (bounded) for the lease's end; no event tells us.
    loop {
        if b.recover(3).await.unwrap() == 1 {
            break;
        }
        assert!(
            claimed.elapsed() < Duration::from_secs(10),
            "lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let waited = claimed.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "expired after {waited:?}"
    );
    assert_eq!(b.get("g").await.unwrap().unwrap().state, State::Unknown);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_hubs_never_received_waits_for_the_owners_lease() {
    let Some(base) = test_db() else { return };
    let (url, a, b) = two_hubs(&base, "e904", 60_000).await;
    assert_eq!(
        a.claim("g", "TRF001", "fp", "http://core", 1)
            .await
            .unwrap(),
        Claim::New
    );
    // Hub a answered E901 at its budget; its call goes on for late answers.
    assert!(
        a.finish_if(
            "g",
            &[State::Sending],
            finish(State::Unknown, "E901", "timed out"),
            2
        )
        .await
        .unwrap()
    );
    // Hub b asks the core, which has not seen the POST (yet): not recorded.
    let never = finish(State::NotSent, "E904", "never received");
    assert!(
        !b.finish_if("g", &[State::Unknown], never.clone(), 3)
            .await
            .unwrap()
    );
    assert_eq!(b.get("g").await.unwrap().unwrap().state, State::Unknown);
    // Nor from hub a restarted under the same name: the new process does
    // not know its predecessor's calls.
    let a_again = PgJournal::open(&with_params(&url, "hub_id=hub-a"))
        .await
        .unwrap();
    assert_ne!(a_again.hub_id(), a.hub_id());
    assert!(
        !a_again
            .finish_if("g", &[State::Unknown], never.clone(), 3)
            .await
            .unwrap()
    );
    // Other answers from hub b are recorded at once (here: none yet); after
    // the owner's lease, "never received" is believed.
    expire_lease(&url, "g").await;
    assert!(b.finish_if("g", &[State::Unknown], never, 4).await.unwrap());
    let row = b.get("g").await.unwrap().unwrap();
    assert_eq!(
        (row.state, row.code.as_deref()),
        (State::NotSent, Some("E904"))
    );
    // Then a resend may post again, once.
    assert!(b.claim_resend("g", 1, "http://core", 5).await.unwrap());
    let (owner, _) = a.lease_of("g").await.unwrap().unwrap();
    assert_eq!(owner.as_deref(), Some(b.hub_id()));
    assert!(b.hub_id().starts_with("hub-b#"), "{}", b.hub_id());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_owners_own_not_sent_is_recorded_at_once() {
    let Some(base) = test_db() else { return };
    let (_url, a, _b) = two_hubs(&base, "own", 60_000).await;
    assert_eq!(
        a.claim("g", "TRF001", "fp", "http://core", 1)
            .await
            .unwrap(),
        Claim::New
    );
    assert!(
        a.finish_if(
            "g",
            &[State::Sending],
            finish(State::NotSent, "E902", "refused"),
            2
        )
        .await
        .unwrap()
    );
    let (_, lease) = a.lease_of("g").await.unwrap().unwrap();
    assert_eq!(lease, None, "nothing was sent: no lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hubs_starting_together_migrate_once() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "migrate").await;
    let url = Arc::new(url);
    let mut tasks = Vec::new();
    for i in 0..6 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            PgJournal::open(&with_params(&url, &format!("hub_id=h{i}"))).await
        }));
    }
    for t in tasks {
        t.await.unwrap().expect("open while others migrate");
    }
    let c = raw_client(&url).await;
    let versions: Vec<i32> = c
        .query(
            "SELECT version FROM relayhub_schema_version ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // One row per migration under migrations/postgres, each applied once.
    let migrations = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "sql")
        })
        .count() as i32;
    assert_eq!(versions, (1..=migrations).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_newer_schema_or_a_bad_url_is_refused_at_open() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "newer").await;
    PgJournal::open(&url).await.expect("first open");
    let c = raw_client(&url).await;
    c.execute(
        "INSERT INTO relayhub_schema_version (version) VALUES (99)",
        &[],
    )
    .await
    .unwrap();
    match PgJournal::open(&url).await {
        Err(JournalError::Open { reason, .. }) => {
            assert!(reason.contains("newer than this build"), "{reason}")
        }
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("opened a schema from the future"),
    }
    match PgJournal::open(&with_params(&base, "lease_ms=5")).await {
        Err(JournalError::Open { reason, .. }) => assert!(reason.contains("lease_ms"), "{reason}"),
        _ => panic!("a 5 ms lease accepted"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_journal_enum_opens_postgres_urls() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "enum").await;
    let j = Journal::open(&url, 16).await.expect("open by URL");
    assert_eq!(j.kind(), "postgres");
    assert_eq!(
        j.claim("g", "TRF001", "fp", "http://core", 1)
            .await
            .unwrap(),
        Claim::New
    );
    assert!(matches!(
        j.claim("g", "TRF001", "fp", "http://core", 2)
            .await
            .unwrap(),
        Claim::Existing(_)
    ));
    assert_eq!(j.recover(3).await.unwrap(), 0);
    // The default lease covers the default budget and late-answer window.
    j.check_lease(3_000 + 30_000)
        .expect("default lease is long enough");
    assert!(j.check_lease(3_000 + 60_000).is_err());
    let url2 = url.replace("postgres://", "postgresql://");
    assert_eq!(Journal::open(&url2, 16).await.unwrap().kind(), "postgres");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_database_gone_every_call_fails_fast() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "down").await;
    let proxy = Proxy::start(db_addr(&base)).await;
    let j = PgJournal::open(&with_params(&proxy.url(&url), "timeout_ms=500"))
        .await
        .expect("open through the proxy");
    assert_eq!(
        j.claim("g", "TRF001", "fp", "http://core", 1)
            .await
            .unwrap(),
        Claim::New
    );

    proxy.cut().await;
    let started = Instant::now();
    let writes = [
        j.claim("g2", "TRF001", "fp", "http://core", 2)
            .await
            .map(|_| ()),
        j.claim_resend("g", 1, "http://core", 3).await.map(|_| ()),
        j.finish("g", finish(State::Done, "0000", "x"), 4).await,
        j.recover(5).await.map(|_| ()),
    ];
    for w in writes {
        assert!(matches!(w, Err(JournalError::Write(_))), "{w:?}");
    }
    let read = j.get("g").await;
    assert!(matches!(read, Err(JournalError::Read(_))), "{read:?}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "5 calls took {took:?}");

    // Back again: the pool reconnects, and nothing of the failed calls stuck.
    proxy.restore();
    let row = j.get("g").await.expect("reconnected").expect("row g");
    assert_eq!(row.state, State::Sending);
    assert_eq!(j.get("g2").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_database_hanging_calls_end_at_the_timeout() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "hang").await;
    let proxy = Proxy::start(db_addr(&base)).await;
    let j = PgJournal::open(&with_params(&proxy.url(&url), "timeout_ms=300"))
        .await
        .expect("open through the proxy");
    assert_eq!(
        j.claim("g", "TRF001", "fp", "http://core", 1)
            .await
            .unwrap(),
        Claim::New
    );

    proxy.freeze().await;
    for _ in 0..2 {
        let started = Instant::now();
        let w = j.claim("g2", "TRF001", "fp", "http://core", 2).await;
        let took = started.elapsed();
        assert!(
            matches!(&w, Err(JournalError::Write(r)) if r.contains("300 ms")),
            "{w:?}"
        );
        assert!(took < Duration::from_millis(800), "took {took:?}");
    }
    let r = j.get("g").await;
    assert!(matches!(r, Err(JournalError::Read(_))), "{r:?}");

    // Answers again at once: the stuck connections were closed, not reused.
    proxy.restore();
    assert_eq!(j.get("g").await.unwrap().unwrap().state, State::Sending);
    assert_eq!(
        j.claim("g2", "TRF001", "fp", "http://core", 3)
            .await
            .unwrap(),
        Claim::New
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_database_fails_the_open_quickly() {
    if test_db().is_none() {
        return;
    }
    // A port nobody listens on: refused at once, reported without the password.
    let port = free_port();
    let started = Instant::now();
    let url = format!("postgres://u:secret@127.0.0.1:{port}/db?timeout_ms=300");
    match PgJournal::open(&url).await {
        Err(JournalError::Open { path, reason }) => {
            assert!(
                !path.contains("secret") && !reason.contains("secret"),
                "{path}: {reason}"
            );
            assert!(reason.contains("cannot connect"), "{reason}");
        }
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("opened nothing"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// Gives `hub` a liveness row last renewed `ago_ms` ago on the database's
/// clock, with the default fence and dead-after (1500, 3000 ms).
async fn set_liveness(url: &str, hub: &str, ago_ms: i64) {
    raw_client(url)
        .await
        .execute(
            "INSERT INTO relayhub_hubs (hub_id, started_ms, renewed_ms, fence_ms, dead_after_ms) \
             VALUES ($1, 0, (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $2, 1500, 3000) \
             ON CONFLICT (hub_id) DO UPDATE SET renewed_ms = EXCLUDED.renewed_ms",
            &[&hub, &ago_ms],
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_owners_rows_are_taken_over_before_its_lease_ends() {
    let Some(base) = test_db() else { return };
    let (url, a, b) = two_hubs(&base, "live", 60_000).await;
    for g in ["g1", "g2", "g3"] {
        assert_eq!(
            a.claim(g, "TRF001", "fp", "http://core", 1).await.unwrap(),
            Claim::New
        );
    }
    // Hub a renewed 1 s ago: alive. Its rows stay `sending` for hub b, and
    // b's "never received" is not recorded while the lease runs.
    set_liveness(&url, a.hub_id(), 1_000).await;
    let Claim::Existing(row) = b
        .claim("g1", "TRF001", "fp", "http://core", 2)
        .await
        .unwrap()
    else {
        panic!("g1 exists")
    };
    assert_eq!(row.state, State::Sending);
    let never = finish(State::NotSent, "E904", "never received");
    assert!(
        !b.finish_if("g1", &[State::Sending, State::Unknown], never.clone(), 3)
            .await
            .unwrap()
    );
    assert_eq!(b.recover(3).await.unwrap(), 0, "a live hub's rows are left");

    // 3.5 s without a renewal (past its dead-after of 3 s): dead, although
    // its 60 s leases run. A claim takes the row over, and so does recovery.
    set_liveness(&url, a.hub_id(), 3_500).await;
    let Claim::Existing(row) = b
        .claim("g1", "TRF001", "fp", "http://core", 4)
        .await
        .unwrap()
    else {
        panic!("g1 exists")
    };
    assert_eq!(row.state, State::Unknown, "taken over");
    let notes: Vec<String> = b
        .history("g1")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.note)
        .collect();
    assert!(
        notes.last().is_some_and(|n| n.contains(&format!(
            "hub {} stopped renewing its liveness while in flight; taken over by hub {}",
            a.hub_id(),
            b.hub_id()
        ))),
        "{notes:?}"
    );
    assert!(
        b.finish_if("g1", &[State::Unknown], never, 5)
            .await
            .unwrap(),
        "a dead owner's row takes another hub's never received"
    );
    assert_eq!(b.recover(6).await.unwrap(), 2, "g2 and g3");
    assert_eq!(b.get("g3").await.unwrap().unwrap().state, State::Unknown);

    // `hubs` shows it dead, with no row in flight any more.
    let hubs = b.hubs().await.unwrap();
    let ha = hubs.iter().find(|h| h.hub_id == a.hub_id()).unwrap();
    assert!(ha.dead && ha.since_renewal_ms >= 3_500, "{ha:?}");
    assert_eq!(ha.sending, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hub_renews_its_liveness_and_fences_itself_when_it_cannot() {
    let Some(base) = test_db() else { return };
    let url = fresh_schema(&base, "fence").await;
    let proxy = Proxy::start(db_addr(&base)).await;
    let mut j = PgJournal::open(&with_params(
        &proxy.url(&url),
        "hub_id=hub-f&timeout_ms=200",
    ))
    .await
    .unwrap();
    assert!(
        j.may_send().is_ok(),
        "a handle without liveness (a tool) may"
    );
    let s = relayhub::journal::postgres::LivenessSettings {
        renew_ms: 50,
        fence_ms: 300,
        dead_after_ms: 1_000,
    };
    j.start_liveness(s).await.unwrap();
    assert!(j.may_send().is_ok());
    let look = PgJournal::open(&with_params(&url, "hub_id=look"))
        .await
        .unwrap();
    let first = look.hubs().await.unwrap()[0].renewed_ms;
    // It renews: the row's stamp moves on (database clock).
    let started = std::time::Instant::now();
    while look.hubs().await.unwrap()[0].renewed_ms == first {
        assert!(started.elapsed() < PATIENCE, "never renewed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The database goes away: within the fence, it may no longer send.
    proxy.cut().await;
    let cut = std::time::Instant::now();
    while j.may_send().is_ok() {
        assert!(cut.elapsed() < PATIENCE, "never fenced");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let fenced_after = cut.elapsed();
    assert!(
        // The fence runs from the last renewal's start, before the cut; the
        // rest is this loop's polling and scheduling.
        fenced_after <= std::time::Duration::from_millis(300 + 200),
        "fenced {fenced_after:?} after the cut (fence 300 ms from the last renewal's start)"
    );
    let e = j.may_send().unwrap_err();
    assert!(e.contains("fence 300 ms"), "{e}");
    // Back: the next renewal lifts the fence.
    proxy.restore();
    let back = std::time::Instant::now();
    while j.may_send().is_err() {
        assert!(back.elapsed() < PATIENCE, "never renewed again");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
