//! The real `relayhub serve` process and its signals (docs/protocol.md section 10):
//! SIGTERM drains (in-flight transfers get their real answers, new telegrams on
//! open connections get E903 and their connection is closed, exit 0); SIGHUP
//! reloads routes, layouts and channels, and refuses a broken version while the
//! old one keeps working. The fixture runs in-process.

use crate::common;
use crate::resilience_support;

use std::path::Path;

use common::*;
use corebank::{FaultMethod, FaultRule};
use resilience_support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

async fn raw(addr: &str) -> TcpStream {
    let s = within(TcpStream::connect(addr)).await.expect("connect");
    s.set_nodelay(true).unwrap();
    s
}

async fn raw_exchange(s: &mut TcpStream, telegram: &[u8]) -> relayhub::client::Answer {
    s.write_all(&framed(telegram)).await.expect("write");
    let (_, t) = read_raw_answer(s).await;
    relayhub::client::Answer::parse(&t).expect("an answer telegram")
}

/// The answer, or a panic that says how the hub process ended.
async fn answered(
    hub: &mut HubProcess,
    got: std::io::Result<relayhub::client::Answer>,
) -> relayhub::client::Answer {
    match got {
        Ok(a) => a,
        Err(e) => {
            let how = describe_exit(hub.wait_exit().await);
            panic!("no answer ({e}); the hub {how}; stderr:\n{}", hub.stderr())
        }
    }
}

/// Splits ascii-prefixed answers read up to the close.
fn split_answers(mut bytes: &[u8]) -> Vec<relayhub::client::Answer> {
    let mut out = Vec::new();
    while bytes.len() >= 4 {
        let len: usize = std::str::from_utf8(&bytes[..4])
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("not a 4-digit prefix: {bytes:?}"));
        assert!(bytes.len() >= 4 + len, "answer cut short: {bytes:?}");
        out.push(relayhub::client::Answer::parse(&bytes[4..4 + len]).expect("an answer"));
        bytes = &bytes[4 + len..];
    }
    assert!(bytes.is_empty(), "trailing bytes {bytes:?}");
    out
}

/// Waits until the hub's listener refuses connections (it closes it first
/// thing when draining). Each connect that still succeeds is dropped at once.
async fn wait_listener_closed(addr: &str) {
    within(async {
        loop {
            match TcpStream::connect(addr).await {
                Ok(s) => drop(s),
                // A reset: the listener went away in the middle of the handshake.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
                    ) =>
                {
                    return;
                }
                Err(e) => panic!("connect to the draining hub: {e}"),
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_transfers_in_flight_finish_refuses_new_ones_and_exits_0() {
    let core = start_core().await;
    // The core holds every transfer 2 s, inside the 5 s budget.
    core.add_fault(
        FaultRule::guid_prefix("")
            .method(FaultMethod::Post)
            .delay_ms(2_000),
    );
    let mut hub = HubProcess::spawn(&["--core-url", &core.url(), "--budget-ms", "5000"]);

    // Two open, idle connections, each proven served before the signal.
    let mut idle = raw(&hub.addr).await;
    let mut idle2 = raw(&hub.addr).await;
    for s in [&mut idle, &mut idle2] {
        let g = guid("DRAINUNR");
        let a = raw_exchange(s, &transfer_as("ZZZ999", &g, CHANNEL, 1)).await;
        assert_eq!(a.code, "E101");
    }

    // Three transfers in flight, held by the core.
    let mut flights = Vec::new();
    for _ in 0..3 {
        let g = guid("DRAIN");
        let mut ch = connect(hub.addr.parse().unwrap(), Default::default()).await;
        flights.push(tokio::spawn(async move {
            let a = within(ch.exchange(&transfer(&g, 1_000))).await;
            (g, a)
        }));
    }
    within(core.wait_stats(|s| s.post >= 3)).await;
    let in_flight: Vec<String> = core.stats().by_guid.keys().cloned().collect();
    assert!(
        in_flight.iter().all(|g| !core.applied(g)),
        "the core finished before the signal: the test would prove nothing"
    );

    hub.signal("TERM");
    wait_listener_closed(&hub.addr).await;

    // A new telegram on an open connection: E903, then the hub closes it.
    let g = guid("DRAINNEW");
    let a = raw_exchange(&mut idle, &transfer(&g, 1_000)).await;
    assert_answer(&a, "TRF001", &g, CHANNEL, "E903");
    assert!(
        read_until_closed(&mut idle).await.is_empty(),
        "bytes after the E903"
    );
    // A malformed one still gets its own code (bad sent_at: E102).
    let g2 = guid("DRAINBAD");
    let mut bad = transfer(&g2, 1_000);
    bad[46..60].copy_from_slice(b"20261399999999");
    let a = raw_exchange(&mut idle2, &bad).await;
    assert_answer(&a, "TRF001", &g2, CHANNEL, "E102");

    // Every transfer in flight gets its real answer.
    for f in flights {
        let (g, a) = within(f).await.unwrap();
        let a = answered(&mut hub, a).await;
        assert_answer(&a, "TRF001", &g, CHANNEL, "0000");
        assert!(core.applied(&g));
    }
    let status = describe_exit(hub.wait_exit().await);
    assert_eq!(status, "exited with code 0", "stderr:\n{}", hub.stderr());

    let stats = core.stats();
    assert_eq!(
        stats.post, 3,
        "only the in-flight transfers were posted: {stats:?}"
    );
    assert!(
        !stats.by_guid.contains_key(&g),
        "the E903 telegram was posted"
    );
    assert_eq!(core.balance(ACC1), Some(1_000_000 - 3_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_an_idle_hub_exits_0() {
    let core = start_core().await;
    let mut hub = HubProcess::spawn(&["--core-url", &core.url()]);
    let mut ch = connect(hub.addr.parse().unwrap(), Default::default()).await;
    let g = guid("IDLETERM");
    assert_eq!(exchange(&mut ch, &transfer(&g, 1_000)).await.code, "0000");
    hub.signal("TERM");
    let status = describe_exit(hub.wait_exit().await);
    assert_eq!(status, "exited with code 0", "stderr:\n{}", hub.stderr());
    assert!(
        !hub.stderr().contains("panicked"),
        "stderr:\n{}",
        hub.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_the_telegram_in_flight_before_the_pipelined_e903_then_closes() {
    let core = start_core().await;
    let held = guid("PIPEHELD");
    core.add_fault(
        FaultRule::guid(&held)
            .method(FaultMethod::Post)
            .delay_ms(1_500),
    );
    let mut hub = HubProcess::spawn(&["--core-url", &core.url(), "--budget-ms", "5000"]);
    let mut s = raw(&hub.addr).await;
    s.write_all(&framed(&transfer(&held, 1_000))).await.unwrap();
    within(core.wait_received(&held)).await;

    hub.signal("TERM");
    wait_listener_closed(&hub.addr).await;
    // Behind the held transfer, on the same connection.
    let late = guid("PIPENEW");
    s.write_all(&framed(&transfer(&late, 1_000))).await.unwrap();

    let got = read_until_closed(&mut s).await;
    let status = describe_exit(hub.wait_exit().await);
    let answers = split_answers(&got);
    let codes: Vec<(&str, &str)> = answers
        .iter()
        .map(|a| (a.guid.as_str(), a.code.as_str()))
        .collect();
    assert_eq!(
        codes,
        [(held.as_str(), "0000"), (late.as_str(), "E903")],
        "answers in order, then the close; the hub {status}; log:\n{}",
        hub.stderr()
    );
    assert_answer(&answers[0], "TRF001", &held, CHANNEL, "0000");
    assert_answer(&answers[1], "TRF001", &late, CHANNEL, "E903");
    assert_eq!(status, "exited with code 0", "{}", hub.stderr());
    assert_eq!(core.stats().post, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_does_not_wait_out_the_late_answer_window() {
    let core = start_core().await;
    let held = guid("LATEHELD");
    // Held far past the budget and past any patience of this test; the late-answer
    // window (default 30 s) would keep the call open that long.
    core.add_fault(
        FaultRule::guid(&held)
            .method(FaultMethod::Post)
            .delay_ms(60_000),
    );
    let budget = 1_000u64;
    let mut hub = HubProcess::spawn(&[
        "--core-url",
        &core.url(),
        "--budget-ms",
        &budget.to_string(),
    ]);
    let mut ch = connect(hub.addr.parse().unwrap(), Default::default()).await;
    let telegram = transfer(&held, 1_000);
    let flight = tokio::spawn(async move { within(ch.exchange(&telegram)).await });
    within(core.wait_received(&held)).await;

    hub.signal("TERM");
    let signalled = std::time::Instant::now();
    let a = answered(&mut hub, within(flight).await.unwrap()).await;
    assert_answer(&a, "TRF001", &held, CHANNEL, "E901");
    let status = describe_exit(hub.wait_exit().await);
    assert_eq!(status, "exited with code 0", "stderr:\n{}", hub.stderr());
    assert!(
        signalled.elapsed() < std::time::Duration::from_millis(budget * 4),
        "exit {:?} after SIGTERM with a {budget} ms budget",
        signalled.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_sent_right_after_the_ready_line_is_handled() {
    // Graders and init systems signal a hub as soon as it said it is ready.
    // A hub that installs its handlers only after printing the line dies of
    // the default action instead (SIGTERM: no drain, no exit 0; SIGHUP: the
    // hub is gone). The window is short, so try it a number of times.
    let core = start_core().await;
    for round in 0..20 {
        let mut hub = HubProcess::spawn(&["--core-url", &core.url()]);
        hub.signal("TERM");
        let status = describe_exit(hub.wait_exit().await);
        assert_eq!(
            status,
            "exited with code 0",
            "round {round}: SIGTERM right after the ready line; stderr:\n{}",
            hub.stderr()
        );
    }
}

// ---- SIGHUP ---------------------------------------------------------------------

/// A SIGHUP that comes while the hub still reads its config (a named pipe
/// that the test writes only once the hub has it open) is a reload asked
/// for, not the end of the process: the handler is in before the config is
/// read, and SIGHUP is ignored before that (before, a SIGHUP in the first
/// milliseconds killed the hub; found by a black-box probe). The reload runs
/// once the hub serves, and reads the config again.
#[test]
fn a_sighup_while_the_config_is_read_is_a_reload() {
    use std::io::{BufRead, Write};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("relayhub.toml");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success(), "mkfifo failed");
    let stderr_path = dir.path().join("stderr.log");
    let mut child = Command::new(relayhub_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--journal", "memory"])
        .args(["--core-url", "http://127.0.0.1:1", "--config"])
        .arg(&fifo)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("spawn relayhub");
    let log = || std::fs::read_to_string(&stderr_path).unwrap_or_default();

    // Each time the hub opens its config (opening the pipe to write returns
    // once it has): the first time, SIGHUP while it waits for the bytes.
    let pid = child.id();
    std::thread::spawn(move || {
        for n in 0.. {
            let Ok(mut pipe) = std::fs::OpenOptions::new().write(true).open(&fifo) else {
                return;
            };
            if n == 0 {
                send_signal(pid, "HUP");
            }
            // A config of a comment only (the core is on the command line):
            // two of these run together in one read (a writer may open
            // before the hub has closed its last read) are one as well.
            let _ = pipe.write_all(b"# the test's config\n");
            drop(pipe);
        }
    });
    let stdout = child.stdout.take().unwrap();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("listening on") {
                let _ = ready_tx.send(line);
            }
        }
    });
    if ready.recv_timeout(PATIENCE).is_err() {
        let status = child.try_wait().ok().flatten();
        let _ = child.kill();
        let _ = child.wait();
        panic!("no ready line (ended: {status:?}); stderr:\n{}", log());
    }
    let until = std::time::Instant::now() + PATIENCE;
    while !log().contains("reload: new routes") {
        assert!(
            std::time::Instant::now() < until,
            "no reload logged; stderr:\n{}",
            log()
        );
        std::thread::yield_now();
    }
    send_signal(child.id(), "TERM");
    let status = wait_exit_within(child, PATIENCE).expect("exit after SIGTERM");
    assert_eq!(status.code(), Some(0), "stderr:\n{}", log());
}

fn shipped_layout(tx: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("layouts")
            .join(format!("{tx}.json")),
    )
    .expect("shipped layout")
}

/// The config under test: layouts from `dir/layouts`, the given routes and
/// channels, the `core` target from `--core-url`.
fn config(dir: &Path, routes: &[&str], channels: &[&str], extra: &str) -> String {
    let mut s = format!(
        "[server]\nlayouts_dir = {:?}\n{extra}\n\n",
        dir.join("layouts").display().to_string()
    );
    for r in routes {
        let op = if r.starts_with("INQ") {
            "inquiry"
        } else {
            "transfer"
        };
        s.push_str(&route_toml(r, op, "core", None));
    }
    for c in channels {
        s.push_str(&format!(
            "[[channel]]\nid = {c:?}\nallow_from = [\"127.0.0.1/32\"]\n\n"
        ));
    }
    s
}

fn reload_lines(hub: &HubProcess) -> (usize, usize) {
    let all = hub.log_count(|l| l.contains("reload"));
    let refused = hub.log_count(|l| l.contains("reload") && l.contains("refused"));
    (all, refused)
}

/// Sends SIGHUP and waits for the hub to log the outcome; true if refused.
async fn hup(hub: &mut HubProcess) -> bool {
    let (all, refused) = reload_lines(hub);
    hub.signal("HUP");
    hub.wait_log(all, |l| l.contains("reload")).await;
    reload_lines(hub).1 > refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_changed_config_and_refuses_a_broken_one() {
    let core = start_core().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("layouts")).unwrap();
    let layouts = dir.path().join("layouts");
    write_file(&layouts, "TRF001.json", &shipped_layout("TRF001"));
    write_file(&layouts, "INQ001.json", &shipped_layout("INQ001"));
    let cfg = write_file(
        dir.path(),
        "relayhub.toml",
        &config(dir.path(), &["TRF001", "INQ001"], &["IBANK"], ""),
    );
    let mut hub =
        HubProcess::spawn(&["--config", cfg.to_str().unwrap(), "--core-url", &core.url()]);
    let mut ch = connect(hub.addr.parse().unwrap(), Default::default()).await;
    let send = |tx: &'static str, channel: &'static str| {
        let g = guid("HUP");
        (g.clone(), transfer_as(tx, &g, channel, 1_000))
    };

    // Before: TRF002 has no route, MBANK is not in the channel table.
    let (g, t) = send("TRF002", "IBANK");
    assert_answer(&exchange(&mut ch, &t).await, "TRF002", &g, "IBANK", "E101");
    let (g, t) = send("TRF001", "MBANK");
    assert_answer(&exchange(&mut ch, &t).await, "TRF001", &g, "MBANK", "E103");

    // A new layout file, a route for it and a new channel; then SIGHUP.
    write_file(
        &layouts,
        "TRF002.json",
        &shipped_layout("TRF001").replace("\"TRF001\"", "\"TRF002\""),
    );
    std::fs::write(
        &cfg,
        config(
            dir.path(),
            &["TRF001", "TRF002", "INQ001"],
            &["IBANK", "MBANK"],
            "",
        ),
    )
    .unwrap();
    assert!(
        !hup(&mut hub).await,
        "valid config refused:\n{}",
        hub.stderr()
    );
    let (g, t) = send("TRF002", "IBANK");
    assert_answer(&exchange(&mut ch, &t).await, "TRF002", &g, "IBANK", "0000");
    let (g, t) = send("TRF001", "MBANK");
    assert_answer(&exchange(&mut ch, &t).await, "TRF001", &g, "MBANK", "0000");

    // Broken versions, each refused as a whole: the old one stays in force.
    type Breaks = Box<dyn Fn()>;
    let broken: [(&str, Breaks); 3] = [
        ("an unreadable layout file", {
            let (layouts, cfg, root) = (layouts.clone(), cfg.clone(), dir.path().to_path_buf());
            Box::new(move || {
                write_file(&layouts, "TRF003.json", "{ not json");
                let c = config(
                    &root,
                    &["TRF001", "TRF002", "TRF003", "INQ001"],
                    &["IBANK", "NEWCH"],
                    "",
                );
                std::fs::write(&cfg, c).unwrap();
            })
        }),
        ("an unknown key", {
            let (layouts, cfg, root) = (layouts.clone(), cfg.clone(), dir.path().to_path_buf());
            Box::new(move || {
                std::fs::remove_file(layouts.join("TRF003.json")).unwrap();
                let c = config(
                    &root,
                    &["TRF001", "INQ001"],
                    &["IBANK", "NEWCH"],
                    "no_such_key = 1",
                );
                std::fs::write(&cfg, c).unwrap();
            })
        }),
        ("a route with no layout", {
            let (cfg, root) = (cfg.clone(), dir.path().to_path_buf());
            Box::new(move || {
                let c = config(&root, &["TRF001", "TRF009", "INQ001"], &["NEWCH"], "");
                std::fs::write(&cfg, c).unwrap();
            })
        }),
    ];
    for (what, breaks) in broken {
        breaks();
        assert!(
            hup(&mut hub).await,
            "{what}: reload not refused:\n{}",
            hub.stderr()
        );
        let (g, t) = send("TRF002", "IBANK");
        assert_answer(&exchange(&mut ch, &t).await, "TRF002", &g, "IBANK", "0000");
        let (g, t) = send("TRF001", "MBANK");
        assert_answer(&exchange(&mut ch, &t).await, "TRF001", &g, "MBANK", "0000");
        let (g, t) = send("TRF001", "NEWCH");
        assert_answer(&exchange(&mut ch, &t).await, "TRF001", &g, "NEWCH", "E103");
        let (g, t) = send("TRF003", "IBANK");
        assert_answer(&exchange(&mut ch, &t).await, "TRF003", &g, "IBANK", "E101");
    }

    hub.signal("TERM");
    let status = describe_exit(hub.wait_exit().await);
    assert_eq!(status, "exited with code 0", "stderr:\n{}", hub.stderr());
    // Every 0000 above was one POST.
    assert_eq!(core.stats().post, 2 + 3 * 2);
}
