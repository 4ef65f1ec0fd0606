//! The hub started from a shell whose soft open-file limit is the common
//! 1,024: it raises its own limit as far as `max_connections` and the
//! targets' calls need, so it can hold that many channels; and when the hard
//! limit does not allow that, it says so at start, naming the setting to
//! raise. The real binary, its limits read from `/proc/PID/limits`.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_started_under_a_low_soft_limit_raises_it_for_its_connections() {
    // 3,000 connections + the core target's calls (1,024 by default) + a
    // reserve of 256: 4,280 descriptors.
    let needed = 3_000 + 1_024 + 256;
    if hard_limit() < needed {
        panic!(
            "this test needs a hard open-file limit of at least {needed} (`ulimit -Hn` is {})",
            hard_limit()
        );
    }
    let core = start_core().await;
    let config = TempFile::new("toml", "[server]\nmax_connections = 3000\n");
    let url = core.url();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--core-url",
        &url,
        "--journal",
        "memory",
        "--config",
        config.0.to_str().unwrap(),
    ]
    .map(String::from);
    let hub = tokio::task::spawn_blocking(move || {
        hub_under_ulimit(
            "-Sn 1024",
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    })
    .await
    .unwrap();
    let (soft, _) = open_file_limits(hub.pid());
    assert_eq!(
        soft,
        needed,
        "the hub's soft limit; stderr:\n{}",
        hub.stderr()
    );
    let line = hub.stderr_line_with("raised the open-file limit");
    assert!(
        line.contains("from=1024") && line.contains(&format!("to={needed}")),
        "{line}"
    );
    assert!(
        !hub.stderr().contains("open-file limit is below"),
        "no warning when the limit fits:\n{}",
        hub.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_limit_below_the_configuration_is_named_at_start() {
    let core = start_core().await;
    let config = TempFile::new("toml", "[server]\nmax_connections = 3000\n");
    let url = core.url();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--core-url",
        &url,
        "--journal",
        "memory",
        "--config",
        config.0.to_str().unwrap(),
    ]
    .map(String::from);
    let hub = tokio::task::spawn_blocking(move || {
        hub_under_ulimit(
            "-n 1500",
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    })
    .await
    .unwrap();
    let line = hub.stderr_line_with("open-file limit is below");
    for part in [
        "limit=1500",
        "hard_limit=1500",
        "needed=4280",
        "LimitNOFILE",
    ] {
        assert!(line.contains(part), "{part:?} missing from: {line}");
    }
    assert_eq!(open_file_limits(hub.pid()), (1500, 1500));
    // The hub still serves: the warning is about its capacity, not a refusal.
    let mut ch = hub.channel().await;
    let a = common::exchange(&mut ch, &common::transfer(&common::guid("NOFILE"), 1_000)).await;
    assert_eq!(a.code, "0000", "{a:?}");
}
