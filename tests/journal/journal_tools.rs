//! The journal and its tools as an operator meets them, with the real
//! `relayhub` binary: `relayhub journal list/show/reconcile` beside a live hub
//! on the same SQLite file, two hubs on one file, and the first-time mistakes
//! (a mistyped path, epoch milliseconds, flags a command does not use).
//!
//! Waits are on answers, ready lines, process exits and the fixture's
//! counters, each bounded by [`PATIENCE`]; nothing sleeps to order events.

#![cfg(unix)]

use crate::common;
use crate::journal_support;
use crate::ops_support;

use std::path::Path;
use std::process::Command;

use common::*;
use corebank::{FaultMethod, FaultRule, Phase};
use journal_support::{relayhub, start_hub_process};

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

/// A TOML letting a resend follow its "not sent" answer at once, so that a
/// second POST, if the hub would make one, is not hidden behind an E905.
const NO_COOLDOWN: &str = "[journal]\nresend_cooldown_ms = 0\n";

/// A live hub (SQLite file) whose POST for a GUID is held in front of the
/// core's ledger (a gateway holding the request: an inquiry meanwhile says
/// NOT_FOUND) for longer than the budget: the channel gets E901 and the call
/// goes on in its late-answer window. `relayhub journal reconcile` run beside
/// it must not conclude "never received" (E904, `not_sent`): the hub's call is
/// still running, and the channel's resend would be posted a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_beside_a_live_hub_never_lets_a_held_transfer_post_twice() {
    let core = start_core().await;
    let dir = TempDir::new("tools-live");
    let file = dir.join("journal.db");
    let config = TempFile::new("toml", NO_COOLDOWN);
    let g = guid("LIVE");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(30_000)
            .phase(Phase::BeforeApply)
            .close()
            .times(1),
    );
    let url = core.url();
    let hub = ops_support::Hub::spawn(&[
        "--listen",
        "127.0.0.1:0",
        "--core-url",
        &url,
        "--journal",
        path_str(&file),
        "--budget-ms",
        "500",
        "--config",
        path_str(&config.0),
    ]);
    let hub_addr = hub.addr.parse().expect("hub address");
    let telegram = transfer(&g, 31_000);
    let mut ch = connect(hub_addr, relayhub::frame::PrefixMode::Ascii).await;
    assert_header_only(&exchange(&mut ch, &telegram).await, "TRF001", &g, "E901");
    assert_eq!(posts(&core, &g), 1);

    let reconcile = relayhub(&[
        "journal",
        "--journal",
        path_str(&file),
        "reconcile",
        "--core-url",
        &url,
    ]);
    let resend = exchange(&mut ch, &telegram).await;
    assert_eq!(
        posts(&core, &g),
        1,
        "the resend was posted a second time (answered {}); reconcile: {reconcile:?}",
        resend.code
    );
    // The hub's own call is still running: its inquiry's NOT_FOUND is not believed.
    assert_header_only(&resend, "TRF001", &g, "E901");
    assert!(
        !reconcile.stdout.contains(&format!("{g}  E904")),
        "reconcile beside the live hub said never received: {reconcile:?}"
    );
}

/// Waits (bounded) until the fixture has counted `n` POSTs for `guid`.
async fn wait_posts(core: &corebank::CoreBank, guid: &str, n: u64) {
    let g = guid.to_string();
    within(core.wait_stats(move |s| s.by_guid.get(&g).map(|x| x.post).unwrap_or(0) >= n)).await;
}

/// A POST for `guid` held in front of the core's ledger for 30 s, then
/// dropped: an inquiry meanwhile says NOT_FOUND.
fn hold_post(core: &corebank::CoreBank, guid: &str) {
    core.add_fault(
        FaultRule::guid(guid)
            .method(FaultMethod::Post)
            .delay_ms(30_000)
            .phase(Phase::BeforeApply)
            .close()
            .times(1),
    );
}

/// While a hub runs, it settles its own unknown transfers: `reconcile
/// --admin` (or the admin_listen of `--config`) has the live hub do it, and
/// the hub, knowing its call is still running, does not believe NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_beside_a_live_hub_asks_that_hub() {
    let core = start_core().await;
    let dir = TempDir::new("tools-admin");
    let file = dir.join("journal.db");
    let g = guid("ADMN");
    hold_post(&core, &g);
    let url = core.url();
    let hub = ops_support::Hub::spawn(&[
        "--listen",
        "127.0.0.1:0",
        "--core-url",
        &url,
        "--journal",
        path_str(&file),
        "--budget-ms",
        "500",
    ]);
    let telegram = transfer(&g, 32_000);
    let mut ch = connect(
        hub.addr.parse().unwrap(),
        relayhub::frame::PrefixMode::Ascii,
    )
    .await;
    assert_header_only(&exchange(&mut ch, &telegram).await, "TRF001", &g, "E901");

    // Without a way to reach the hub: refused, and told how.
    let refused = relayhub(&[
        "journal",
        "--journal",
        path_str(&file),
        "reconcile",
        "--core-url",
        &url,
    ]);
    assert_ne!(refused.code, Some(0), "{refused:?}");
    assert!(
        refused.stderr.contains(path_str(&file))
            && refused.stderr.contains("held by a running hub")
            && refused.stderr.contains("--admin HOST:PORT"),
        "{refused:?}"
    );
    assert_eq!(gets(&core, &g), 0, "a refused reconcile asks nothing");
    // With no core URL either: the same advice first, not "give --core-url"
    // (found by a newcomer's walk-through).
    let bare = relayhub(&["journal", "--journal", path_str(&file), "reconcile"]);
    assert!(
        bare.code != Some(0)
            && bare.stderr.contains("held by a running hub")
            && bare.stderr.contains("--admin HOST:PORT"),
        "{bare:?}"
    );

    let asked = relayhub(&["journal", "reconcile", "--admin", &hub.admin]);
    assert_eq!(asked.code, Some(0), "{asked:?}");
    assert!(
        asked.stdout.contains(&format!("{g}  E901")),
        "the hub's call still runs: still unknown; {asked:?}"
    );
    assert_eq!(gets(&core, &g), 1, "the hub asked the core");

    // The config's admin_listen is found when the journal is held.
    let config = TempFile::new(
        "toml",
        &format!(
            "[server]\nadmin_listen = \"{}\"\n[journal]\npath = \"{}\"\n",
            hub.admin,
            path_str(&file)
        ),
    );
    let asked = relayhub(&[
        "journal",
        "reconcile",
        "--config",
        path_str(&config.0),
        "--core-url",
        &url,
    ]);
    assert_eq!(asked.code, Some(0), "{asked:?}");
    assert!(asked.stdout.contains(&format!("{g}  E901")), "{asked:?}");
    assert!(asked.stderr.contains(&hub.admin), "{asked:?}");
    assert_eq!(gets(&core, &g), 2);

    let resend = exchange(&mut ch, &telegram).await;
    assert_eq!(posts(&core, &g), 1, "resend answered {}", resend.code);
    assert_header_only(&resend, "TRF001", &g, "E901");
}

/// A second `relayhub serve` on a journal file a live hub holds is refused at
/// start, naming the file and the holder; once the first is gone (SIGTERM or
/// SIGKILL: the kernel drops the lock), the file is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_hub_on_one_journal_file_is_refused() {
    let core = start_core().await;
    let dir = TempDir::new("tools-two");
    let file = dir.join("journal.db");
    let url = core.url();
    let serve = |file: &Path| -> Vec<String> {
        [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--core-url",
            &url,
            "--journal",
            path_str(file),
        ]
        .map(String::from)
        .to_vec()
    };
    let mut first = try_start(Command::new(relayhub_bin()).args(serve(&file)))
        .unwrap_or_else(|e| panic!("{e}"));

    let args = serve(&file);
    let second = relayhub(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ne!(second.code, Some(0), "{second:?}");
    assert!(
        second.stderr.contains(path_str(&file))
            && second.stderr.contains("held by another relayhub")
            && second.stderr.contains(&format!("pid {}", first.pid)),
        "{second:?}"
    );
    assert!(
        !second.stdout.contains("listening on"),
        "the second hub announced itself: {second:?}"
    );
    // The first one is unharmed.
    let g = guid("TWO");
    let answer = first.send(&transfer(&g, 1_000)).await;
    assert_eq!(answer.code, "0000", "{answer:?}");

    // Another file is fine meanwhile.
    let other = dir.join("other.db");
    let mut beside = try_start(Command::new(relayhub_bin()).args(serve(&other)))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(beside.terminate().code(), Some(0));

    let killed = first.sigkill();
    assert!(!killed.success());
    let mut next = try_start(Command::new(relayhub_bin()).args(serve(&file)))
        .unwrap_or_else(|e| panic!("after SIGKILL the file is free: {e}"));
    assert_eq!(next.terminate().code(), Some(0));
    let mut last = try_start(Command::new(relayhub_bin()).args(serve(&file)))
        .unwrap_or_else(|e| panic!("after SIGTERM the file is free: {e}"));
    assert_eq!(last.send(&transfer(&g, 1_000)).await.code, "0000");
    assert_eq!(posts(&core, &g), 1, "replayed from the journal");
    assert_eq!(last.terminate().code(), Some(0));
}

/// `list` and `show` beside a live hub only look: the hub's row in flight
/// stays `sending` (no start-up recovery by a tool), and `reconcile` does not
/// touch it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_beside_a_live_hub_leave_its_rows_in_flight_alone() {
    let core = start_core().await;
    let dir = TempDir::new("tools-look");
    let file = dir.join("journal.db");
    let g = guid("LOOK");
    hold_post(&core, &g);
    let url = core.url();
    // A budget long enough for the tools to run while the row is `sending`.
    let hub = start_hub_process(&url, &file, 20_000);
    let mut ch = hub.channel().await;
    within(ch.send(&transfer(&g, 33_000))).await.expect("send");
    wait_posts(&core, &g, 1).await;
    let journal = path_str(&file);

    let sending = |extra: &[&str]| {
        let mut args = vec![
            "journal",
            "--journal",
            journal,
            "list",
            "--state",
            "sending",
        ];
        args.extend_from_slice(extra);
        relayhub(&args)
    };
    let list = sending(&[]);
    assert_eq!(list.code, Some(0), "{list:?}");
    assert!(
        list.stdout.contains(&g) && list.stderr.contains("1 row(s) in state sending"),
        "{list:?}"
    );
    // A limit below the total says so: the count is the state's, not the page's.
    let page = sending(&["--limit", "0"]);
    assert!(
        !page.stdout.contains(&g)
            && page.stderr.contains("1 row(s) in state sending")
            && page
                .stderr
                .contains("the first 0 shown; --limit shows more"),
        "{page:?}"
    );
    let refused = relayhub(&[
        "journal",
        "--journal",
        journal,
        "reconcile",
        "--core-url",
        &url,
    ]);
    assert_ne!(refused.code, Some(0), "{refused:?}");
    let show = relayhub(&["journal", "--journal", journal, "show", &g]);
    assert_eq!(show.code, Some(0), "{show:?}");
    assert!(show.stdout.contains("\"state\": \"sending\""), "{show:?}");
    let list = relayhub(&["journal", "--journal", journal, "list"]);
    assert!(
        !list.stdout.contains(&g) && list.stderr.contains("0 row(s) in state unknown"),
        "a tool marked the live hub's call unknown: {list:?}"
    );
    assert_eq!(calls(&core, &g), (1, 0), "no inquiry, no second POST");
}

/// With no hub running, `reconcile` owns the journal as a hub would: what a
/// crash left `sending` becomes unknown and is asked about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_without_a_hub_recovers_and_settles() {
    let core = start_core().await;
    let dir = TempDir::new("tools-alone");
    let file = dir.join("journal.db");
    let g = guid("ALON");
    // Held, then applied: an inquiry meanwhile says PROCESSING.
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(2_000)
            .phase(Phase::BeforeApply),
    );
    let url = core.url();
    let mut hub = start_hub_process(&url, &file, 20_000);
    let mut ch = hub.channel().await;
    within(ch.send(&transfer(&g, 34_000))).await.expect("send");
    within(core.wait_received(&g)).await;
    hub.sigkill();
    let journal = path_str(&file);

    let first = relayhub(&[
        "journal",
        "--journal",
        journal,
        "reconcile",
        "--core-url",
        &url,
    ]);
    assert_eq!(first.code, Some(0), "{first:?}");
    assert!(
        first.stdout.contains(&format!("{g}  E901")) && first.stderr.contains(journal),
        "{first:?}"
    );
    assert!(within(core.wait_applied(&g)).await);
    // With the service's config, whose admin token this shell does not have:
    // a reconcile with the hub stopped talks to the core, and needs none.
    let config = TempFile::new(
        "toml",
        "[server]\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_env = \"RELAYHUB_TEST_NO_SUCH_TOKEN\"\n",
    );
    let second = relayhub(&[
        "journal",
        "--journal",
        journal,
        "reconcile",
        "--config",
        path_str(&config.0),
        "--core-url",
        &url,
    ]);
    assert!(second.stdout.contains(&format!("{g}  0000")), "{second:?}");
    let show = relayhub(&["journal", "--journal", journal, "show", &g]);
    assert!(
        show.stdout.contains("\"state\": \"done\"")
            && show.stdout.contains("was in flight when the hub stopped"),
        "{show:?}"
    );
    assert_eq!(posts(&core, &g), 1);
}

/// A journal file holding one unknown row of `guid`: a `tx_code` attempt
/// to `url` made `ago_ms` ago, its answer not in time.
async fn unknown_row(file: &Path, guid: &str, tx_code: &str, url: &str, ago_ms: i64) {
    use relayhub::journal::{Journal, now_ms};
    let j = Journal::open(path_str(file), 8).await.expect("journal");
    let attempt = now_ms() - ago_ms;
    j.claim(guid, tx_code, "fp", url, attempt).await.unwrap();
    j.finish(guid, unknown_after_a_read_timeout(), attempt + 3_000)
        .await
        .unwrap();
}

/// The outcome of an attempt whose answer did not come in time.
fn unknown_after_a_read_timeout() -> relayhub::journal::Finish {
    relayhub::journal::Finish {
        state: relayhub::journal::State::Unknown,
        code: "E901".into(),
        answer: None,
        error: Some("read timeout".into()),
        note: "attempt 1: unknown".into(),
        attempt: None,
    }
}

/// Offline, without the hub's config, reconcile cannot know the hub's wire
/// grace (a longer late-answer window makes it longer than the defaults'):
/// a "never received" 40 s after the attempt stays E901, and the command
/// says to give --config; with the config, whose grace is shorter, it is
/// E904. Before, the defaults' 38 s were believed (found by a black-box
/// probe: a hub with a 45 s window, its row settled E904 after 40 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_without_the_config_does_not_guess_the_wire_grace() {
    let core = start_core().await;
    let url = core.url();
    let config = TempFile::new(
        "toml",
        &format!("[[target]]\nname = \"core\"\nurls = [{url:?}]\nlate_answer_window_ms = 0\n"),
    );
    for with_config in [false, true] {
        let dir = TempDir::new("tools-grace");
        let file = dir.join("journal.db");
        let g = guid("GRACE");
        unknown_row(&file, &g, "TRF001", &url, 40_000).await;
        let mut args = vec!["journal", "--journal", path_str(&file), "reconcile"];
        if with_config {
            args.extend(["--config", path_str(&config.0)]);
        } else {
            args.extend(["--core-url", &url]);
        }
        let out = relayhub(&args);
        assert_eq!(out.code, Some(0), "{out:?}");
        let (code, hint) = if with_config {
            ("E904", false)
        } else {
            ("E901", true)
        };
        assert!(out.stdout.contains(&format!("{g}  {code}")), "{out:?}");
        assert_eq!(out.stderr.contains("without --config"), hint, "{out:?}");
    }
    assert_eq!(core.stats().post, 0);
}

/// Offline without the hub's config, an attempt that carries the grace it
/// was made under is judged by that grace: settled E904 once it has passed,
/// E901 while it has not (the hint on stderr says so). Only an attempt of an
/// older build, with no grace on its row, waits the longest grace a config
/// can give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_without_the_config_takes_the_grace_an_attempt_carries() {
    use relayhub::journal::{AttemptTo, Journal, now_ms};
    let core = start_core().await;
    let url = core.url();
    let dir = TempDir::new("tools-stamped");
    let file = dir.join("journal.db");
    let (passed, running) = (guid("STAMPA"), guid("STAMPB"));
    {
        let j = Journal::open(path_str(&file), 8).await.expect("journal");
        let attempt = now_ms() - 40_000;
        for (g, grace_ms) in [(&passed, 30_000), (&running, 90_000)] {
            let to = AttemptTo {
                url: &url,
                grace_ms: Some(grace_ms),
            };
            j.claim_to(g, "TRF001", "fp", to, attempt).await.unwrap();
            j.finish(g, unknown_after_a_read_timeout(), attempt + 3_000)
                .await
                .unwrap();
        }
    }
    let out = relayhub(&[
        "journal",
        "--journal",
        path_str(&file),
        "reconcile",
        "--core-url",
        &url,
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains(&format!("{passed}  E904")), "{out:?}");
    assert!(out.stdout.contains(&format!("{running}  E901")), "{out:?}");
    assert!(out.stderr.contains("without --config"), "{out:?}");
    assert_eq!(core.stats().post, 0);
}

/// Offline, a row whose tx code no route names any more is not asked about:
/// it is printed E901, and stderr says why (before, nothing was logged by
/// the offline reconcile, so the row was printed E901 with no word why; a
/// black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_says_why_it_leaves_a_row_of_a_tx_code_no_route_names() {
    let core = start_core().await;
    let url = core.url();
    let dir = TempDir::new("tools-noroute");
    let file = dir.join("journal.db");
    let g = guid("NOROUTE");
    unknown_row(&file, &g, "TRF002", &url, 120_000).await;
    let journal = path_str(&file);
    let out = relayhub(&[
        "journal",
        "--journal",
        journal,
        "reconcile",
        "--core-url",
        &url,
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains(&format!("{g}  E901")), "{out:?}");
    assert!(
        out.stderr
            .contains("not reconciled: no route for this tx code any more")
            && out.stderr.contains(&g),
        "{out:?}"
    );
    assert_eq!(calls(&core, &g), (0, 0), "nothing asked, nothing posted");
}

/// A row whose attempt went to one address of the core, reconciled offline
/// against another: that core's "never received" proves nothing about the
/// attempt, so the row stays E901 however often it is run, and the command
/// says why at its default log level (before, only with RUST_LOG=info;
/// found by a black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_says_why_a_row_asked_at_another_url_stays_unknown() {
    let (attempted, other) = (start_core().await, start_core().await);
    let dir = TempDir::new("tools-otherurl");
    let file = dir.join("journal.db");
    let g = guid("OTHERURL");
    unknown_row(&file, &g, "TRF001", &attempted.url(), 120_000).await;
    let journal = path_str(&file);
    let other_url = other.url();
    let args = [
        "journal",
        "--journal",
        journal,
        "reconcile",
        "--core-url",
        &other_url,
    ];
    let out = relayhub(&args);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains(&format!("{g}  E901")), "{out:?}");
    assert!(
        out.stderr.contains("still unknown")
            && out
                .stderr
                .contains("asked at another URL than the one the attempt went to")
            && out.stderr.contains(&g),
        "{out:?}"
    );
    assert_eq!(calls(&other, &g), (0, 1), "asked, nothing posted");
}

/// An admin listener for one request: its address; a receiver told once
/// the request's head is in; a sender that makes it close the connection
/// without an answer; its thread.
fn admin_that_never_answers() -> (
    String,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (asked_tx, asked) = std::sync::mpsc::channel();
    let (close_tx, close) = std::sync::mpsc::channel::<()>();
    let hub = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
            head.push(byte[0]);
        }
        let _ = asked_tx.send(());
        let _ = close.recv();
    });
    (addr, asked, close_tx, hub)
}

/// An admin listener that takes the reconcile's request and closes the
/// connection without an answer (a hub that stops while it reconciles) is
/// named as such, not as unreachable (before, "cannot reach the hub's admin
/// listener ... Peer disconnected"; found by a black-box probe).
#[test]
fn a_reconcile_cut_off_by_the_hub_says_so() {
    let (addr, asked, close, hub) = admin_that_never_answers();
    let (answered, out) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = answered.send(relayhub(&["journal", "reconcile", "--admin", &addr]));
    });
    asked.recv_timeout(PATIENCE).expect("the reconcile asks");
    close.send(()).unwrap();
    hub.join().unwrap();
    let out = out.recv_timeout(PATIENCE).expect("the reconcile ends");
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(
        out.stderr
            .contains("closed the connection before answering")
            && out.stderr.contains("is the hub stopping?"),
        "{out:?}"
    );
}

/// A journal command started with SIGHUP ignored (`nohup`) keeps it
/// ignored: only `serve` handles SIGHUP, and the others restore what they
/// inherited, not the default (a review of the SIGHUP change found the
/// default put back, so that a hangup killed a `nohup` reconcile).
#[test]
fn a_nohup_journal_command_survives_a_hangup() {
    use std::process::{Command, Stdio};
    let (addr, asked, close_tx, hub) = admin_that_never_answers();
    let child = Command::new("nohup")
        .arg(relayhub_bin())
        .args(["journal", "reconcile", "--admin", &addr])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nohup relayhub");
    asked.recv_timeout(PATIENCE).expect("the reconcile asks");
    send_signal(child.id(), "HUP");
    close_tx.send(()).unwrap();
    hub.join().unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "ended by {:?}: {stderr}",
        out.status
    );
    assert!(
        stderr.contains("closed the connection before answering"),
        "{stderr}"
    );
}

// ---- a first-time operator ----------------------------------------------

/// A mistyped journal path is refused (naming the path and `--create`), not
/// read as an empty journal; `--create` makes one, and says where.
#[test]
fn a_journal_file_that_does_not_exist_is_refused() {
    let dir = TempDir::new("tools-typo");
    let typo = dir.join("typo.db");
    let journal = path_str(&typo);
    for args in [
        vec!["journal", "--journal", journal, "list"],
        vec!["journal", "--journal", journal, "show", "G"],
        vec![
            "journal",
            "--journal",
            journal,
            "reconcile",
            "--core-url",
            "http://127.0.0.1:9",
        ],
    ] {
        let out = relayhub(&args);
        assert_ne!(out.code, Some(0), "{args:?}: {out:?}");
        assert!(
            out.stderr.contains(journal)
                && out.stderr.contains("no such file")
                && out.stderr.contains("--create"),
            "{args:?}: {out:?}"
        );
        assert!(!typo.exists(), "{args:?} created the file");
    }

    let out = relayhub(&["journal", "--journal", journal, "list", "--create"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(typo.exists());
    assert!(
        out.stderr.contains("0 row(s) in state unknown") && out.stderr.contains(journal),
        "{out:?}"
    );
    let again = relayhub(&["journal", "--journal", journal, "list"]);
    assert_eq!(again.code, Some(0), "an existing journal opens: {again:?}");

    // A GUID with a typo is named as one, not as absent (exit 3).
    let typo_guid = relayhub(&["journal", "--journal", journal, "show", "not a guid"]);
    assert_eq!(typo_guid.code, Some(1), "{typo_guid:?}");
    assert!(typo_guid.stderr.contains("a GUID is 32"), "{typo_guid:?}");
    // A memory journal has nothing for a tool (before: an empty journal
    // read, described as PostgreSQL).
    for args in [
        vec!["journal", "--journal", "memory", "list"],
        vec![
            "journal",
            "--journal",
            "memory",
            "reconcile",
            "--core-url",
            "http://127.0.0.1:1",
        ],
    ] {
        let out = relayhub(&args);
        assert_eq!(out.code, Some(1), "{args:?}: {out:?}");
        assert!(
            out.stderr
                .contains("a memory journal lives in its hub's process")
                && !out.stderr.contains("PostgreSQL"),
            "{args:?}: {out:?}"
        );
    }
}

/// `show` and `list` give times as ISO 8601 in local time, not epoch ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_and_list_print_local_iso_times() {
    use chrono::TimeZone;
    use relayhub::journal::{Finish, Journal, State};

    let dir = TempDir::new("tools-times");
    let file = dir.join("journal.db");
    let g = guid("TIME");
    let (created, updated) = (1_764_396_187_123_i64, 1_764_396_190_456_i64);
    {
        let j = Journal::open(path_str(&file), 8).await.expect("journal");
        j.claim(&g, "TRF001", "fp", "http://core", created)
            .await
            .unwrap();
        let f = Finish {
            state: State::Unknown,
            code: "E901".into(),
            answer: None,
            error: Some("read timeout".into()),
            note: "attempt 1: unknown".into(),
            attempt: None,
        };
        j.finish(&g, f, updated).await.unwrap();
    }
    let iso = |ms: i64| {
        chrono::Local
            .timestamp_millis_opt(ms)
            .unwrap()
            .format("%Y-%m-%dT%H:%M:%S%.3f%:z")
            .to_string()
    };

    let show = relayhub(&["journal", "--journal", path_str(&file), "show", &g]);
    assert_eq!(show.code, Some(0), "{show:?}");
    assert!(
        show.stdout
            .contains(&format!("\"created\": \"{}\"", iso(created)))
            && show
                .stdout
                .contains(&format!("\"updated\": \"{}\"", iso(updated)))
            && show.stdout.contains(&format!("{}  sending", iso(created)))
            && show.stdout.contains(&format!("{}  unknown", iso(updated))),
        "{show:?}"
    );
    for ms in [created, updated] {
        assert!(
            !show.stdout.contains(&ms.to_string()),
            "epoch ms {ms} in {show:?}"
        );
    }
    assert!(show.stderr.contains(path_str(&file)), "{show:?}");

    let list = relayhub(&["journal", "--journal", path_str(&file), "list"]);
    assert!(
        list.stdout.contains(&format!(
            "created={}  updated={}",
            iso(created),
            iso(updated)
        )),
        "{list:?}"
    );
}

/// Each `journal` command's help lists the flags it uses, and only those.
#[test]
fn journal_help_lists_only_the_flags_each_command_uses() {
    let flags = |args: &[&str]| -> Vec<String> {
        let out = relayhub(args);
        assert_eq!(out.code, Some(0), "{out:?}");
        // Option lines: `      --admin <HOST:PORT>`, `  -h, --help`.
        out.stdout
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with('-'))
            .flat_map(|l| l.split_whitespace())
            .filter(|w| w.starts_with("--"))
            .map(|w| w.trim_end_matches(',').to_string())
            .collect()
    };
    let mut reconcile = flags(&["journal", "reconcile", "--help"]);
    reconcile.sort();
    reconcile.dedup();
    assert_eq!(
        reconcile,
        [
            "--admin",
            "--admin-token-file",
            "--budget-ms",
            "--config",
            "--connect-timeout-ms",
            "--core-url",
            "--create",
            "--help",
            "--journal",
        ],
    );
    let mut list = flags(&["journal", "list", "--help"]);
    list.sort();
    list.dedup();
    assert_eq!(
        list,
        ["--create", "--help", "--journal", "--limit", "--state"]
    );
}

/// An empty file is no journal for any tool: `reconcile` refuses it as
/// `list` does, and makes a journal of it only with `--create` (before, it
/// made one unasked, so a journal emptied by accident became a new one;
/// found by a black-box probe). Its refusal comes alone, without the note
/// about the wire grace that a reconcile prints once it has the journal.
#[test]
fn an_empty_file_is_a_journal_only_with_create() {
    let dir = TempDir::new("tools-empty");
    let file = dir.join("journal.db");
    std::fs::write(&file, b"").unwrap();
    let journal = path_str(&file);
    let core_url = "http://127.0.0.1:1";
    for args in [
        vec!["journal", "--journal", journal, "list"],
        vec![
            "journal",
            "--journal",
            journal,
            "reconcile",
            "--core-url",
            core_url,
        ],
    ] {
        let out = relayhub(&args);
        assert!(
            out.code != Some(0)
                && out
                    .stderr
                    .contains("an empty file, not a relayhub journal (yet)")
                && !out.stderr.contains("wire grace"),
            "{args:?}: {out:?}"
        );
    }
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0, "left as found");
    let made = relayhub(&[
        "journal",
        "--journal",
        journal,
        "--create",
        "reconcile",
        "--core-url",
        core_url,
    ]);
    assert_eq!(made.code, Some(0), "{made:?}");
    let list = relayhub(&["journal", "--journal", journal, "list"]);
    assert_eq!(list.code, Some(0), "{list:?}");
}
