//! The hub started from a shell whose soft open-file limit is low (a login
//! shell's is often 1,024): it raises its own limit as far as
//! `max_connections` and the targets' calls need, so it can hold that many
//! channels; and when the hard limit does not allow that, it says so at
//! start, naming the setting to raise. The real binary, its limits read from
//! `/proc/PID/limits`. At the limit it turns channels away at once and its
//! admin endpoint still answers. Every test starts it under limits below the
//! 1,024 a login shell's hard limit can be, so they run wherever that is the
//! hard limit too.

use std::process::Command;

use crate::common;
use crate::ops_support;

use common::{TempFile, relayhub_bin, start_core};
use ops_support::{Hub, Stderr};

/// `relayhub serve ARGS` started by `sh` after `ulimit LIMIT_ARGS`.
fn hub_under_ulimit(limit_args: &str, args: &[&str]) -> Hub {
    let mut sh = Command::new("sh");
    sh.args([
        "-c",
        &format!("ulimit {limit_args} && exec \"$0\" \"$@\""),
        relayhub_bin().to_str().expect("utf-8 path"),
    ]);
    Hub::spawn_with(sh, args, Stderr::Read)
}

/// (soft, hard) "Max open files" of process `pid`.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open-file limit in:\n{limits}"));
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(3)
        .take(2)
        .map(|v| v.parse().unwrap_or(u64::MAX))
        .collect();
    (v[0], v[1])
}

/// This process's hard open-file limit: what a child may raise its soft one to.
fn hard_limit() -> u64 {
    open_file_limits(std::process::id()).1
}

/// `max_connections = 1000`, and the core target's calls (1,024 by default)
/// and a reserve of 256: 2,280 descriptors.
const CONFIG: &str = "[server]\nmax_connections = 1000\n";
const NEEDED: u64 = 1_000 + 1_024 + 256;

/// The hub's serve arguments for `core_url` and `config`.
fn args(core_url: &str, config: &TempFile) -> Vec<String> {
    common::memory_hub_args(core_url, &["--config", config.0.to_str().unwrap()])
}

/// Starts the hub under `ulimit LIMIT_ARGS` off the runtime's workers.
async fn spawn_under(limit_args: &'static str, args: Vec<String>) -> Hub {
    tokio::task::spawn_blocking(move || {
        hub_under_ulimit(
            limit_args,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_started_under_a_low_soft_limit_raises_it_for_its_connections() {
    let core = start_core().await;
    let config = TempFile::new("toml", CONFIG);
    let hub = spawn_under("-Sn 512", args(&core.url(), &config)).await;
    // As far as the hard limit (inherited from this process) allows.
    let hard = hard_limit();
    let want = NEEDED.min(hard);
    let (soft, _) = open_file_limits(hub.pid());
    assert_eq!(
        soft,
        want,
        "the hub's soft limit; stderr:\n{}",
        hub.stderr()
    );
    if hard >= NEEDED {
        let line = hub.stderr_line_with("raised the open-file limit");
        assert!(
            line.contains("from=512") && line.contains(&format!("to={want}")),
            "{line}"
        );
        assert!(
            !hub.stderr().contains("open-file limit is below"),
            "no warning when the limit fits:\n{}",
            hub.stderr()
        );
    } else {
        // Raised as far as it goes, and still short: the warning says both.
        let line = hub.stderr_line_with("open-file limit is below");
        for part in [format!("limit={hard}"), "limit_at_start=512".into()] {
            assert!(line.contains(&part), "{part:?} missing from: {line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_limit_below_the_configuration_is_named_at_start() {
    let core = start_core().await;
    let config = TempFile::new("toml", CONFIG);
    let hub = spawn_under("-n 600", args(&core.url(), &config)).await;
    let line = hub.stderr_line_with("open-file limit is below");
    for part in [
        "limit=600",
        "hard_limit=600",
        &format!("needed={NEEDED}"),
        "LimitNOFILE",
    ] {
        assert!(line.contains(part), "{part:?} missing from: {line}");
    }
    assert_eq!(open_file_limits(hub.pid()), (600, 600));
    // The hub still serves: the warning is about its capacity, not a refusal.
    let mut ch = hub.channel().await;
    let a = common::exchange(&mut ch, &common::transfer(&common::guid("NOFILE"), 1_000)).await;
    assert_eq!(a.code, "0000", "{a:?}");
}

/// At its open-file limit the hub turns a channel away at once (it keeps a
/// descriptor in reserve for that): the channel sees its connection closed,
/// rather than waiting unanswered in the listen backlog, and the hub says so
/// (at once, then at most once per 10 s with a count: the throttle's unit
/// test in src/server/accept.rs). Its admin endpoint still answers, on descriptors
/// kept for it. Once connections close, new channels are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_past_the_limit_is_closed_at_once_and_served_once_others_close() {
    use std::io::Read;
    use std::net::TcpStream;

    const LIMIT: usize = 100;
    let core = start_core().await;
    let config = TempFile::new("toml", CONFIG);
    let hub = spawn_under("-n 100", args(&core.url(), &config)).await;
    let addr = hub.addr.clone();
    // More connections than the hub has descriptors.
    let (mut held, read) = tokio::task::spawn_blocking(move || {
        let mut held: Vec<TcpStream> = (0..LIMIT + 20)
            .map(|i| TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connect {i}: {e}")))
            .collect();
        // The last one is past the limit: closed, not left waiting.
        let mut last = held.pop().unwrap();
        last.set_read_timeout(Some(ops_support::PATIENCE)).unwrap();
        let mut byte = [0u8; 1];
        (held, last.read(&mut byte).map_err(|e| e.kind()))
    })
    .await
    .unwrap();
    assert!(
        matches!(read, Ok(0) | Err(std::io::ErrorKind::ConnectionReset)),
        "a connection past the limit read {read:?}, not its end; stderr:\n{}",
        hub.stderr()
    );
    let line = hub.stderr_line_with("connection refused: out of file descriptors");
    assert!(
        line.contains("connections=1") && line.contains("Too many open files"),
        "{line}"
    );
    // No accept was left to wait: at the limit accept fails even with none
    // waiting, and the loop must then wait for the next connection, not log
    // and back off. Checked against a line logged after the turn-aways (a
    // reload, refused or not at the limit), before anything else (the admin
    // listener's own reserve) competes for the descriptors.
    hub.signal("HUP");
    hub.stderr_line_with("reload");
    assert!(
        !hub.stderr()
            .contains("accept failed; new channel connections wait in the backlog"),
        "{}",
        hub.stderr()
    );
    // The operator still sees it: at the limit the admin endpoint answers,
    // on a descriptor kept for it (before, a scrape waited in the backlog).
    hub.scrape_until("the refusals counted", |m| {
        m.must(relayhub::metric_names::CONNECTIONS_REFUSED, &[]) >= 1.0
    })
    .await;

    // With the first LIMIT closed (every one the hub accepted, and more)
    // and seen closed by the hub, a new channel is served.
    held.truncate(held.len() - LIMIT);
    drop(held);
    hub.scrape_until("every connection closed", |m| {
        m.must(relayhub::metric_names::OPEN_CONNECTIONS, &[]) == 0.0
    })
    .await;
    let mut ch = hub.channel().await;
    let a = common::exchange(&mut ch, &common::transfer(&common::guid("AFTER"), 1_000)).await;
    assert_eq!(a.code, "0000", "{a:?}");
}
