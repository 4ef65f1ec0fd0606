//! The shipped operations files load: the example config through
//! `relayhub check`, and the systemd unit's own `ExecStart` command line run
//! through `relayhub check` with the example config in place of
//! `/etc/relayhub/relayhub.toml`. Real processes.

use crate::common;
use crate::ops_support;

use std::collections::BTreeMap;
use std::process::Command;

use common::relayhub_bin;
use ops_support::repo;

const UNIT: &str = "config/relayhub.service";
const EXAMPLE: &str = "config/relayhub.example.toml";

fn run_check(args: &[String]) -> String {
    let out = Command::new(relayhub_bin())
        .args(args)
        .output()
        .expect("run relayhub check");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "relayhub {args:?} failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

/// `[Service]` directives of the unit (the last value of a repeated key).
fn unit() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo(UNIT)).expect("read the unit file");
    let mut section = String::new();
    let mut keys = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{UNIT}: not KEY=VALUE: {line:?}"));
        keys.insert(format!("{section}{}", k.trim()), v.trim().to_string());
    }
    keys
}

#[test]
fn example_config_passes_check_and_prints_the_route_table() {
    let out = run_check(&["check".into(), "--config".into(), EXAMPLE.into()]);
    assert!(out.contains("config OK"), "{out}");
    for row in ["TRF001", "INQ001", "transfer", "inquiry", "target core"] {
        assert!(out.contains(row), "no {row:?} in:\n{out}");
    }
}

#[test]
fn unit_file_execstart_runs_check_on_the_example_config() {
    let unit = unit();
    let exec = &unit["[Service]ExecStart"];
    let argv: Vec<&str> = exec.split_whitespace().collect();
    assert_eq!(argv[0], "/usr/local/bin/relayhub", "ExecStart: {exec}");
    assert_eq!(argv[1], "serve", "ExecStart: {exec}");
    let at = argv
        .iter()
        .position(|a| *a == "--config")
        .unwrap_or_else(|| panic!("ExecStart has no --config: {exec}"));
    assert_eq!(argv[at + 1], "/etc/relayhub/relayhub.toml");

    // The same command line, as `check`, with the example config installed.
    let example = repo(EXAMPLE).display().to_string();
    let args: Vec<String> = std::iter::once("check".to_string())
        .chain(argv[2..].iter().map(|a| {
            if *a == "/etc/relayhub/relayhub.toml" {
                example.clone()
            } else {
                a.to_string()
            }
        }))
        .collect();
    let out = run_check(&args);
    assert!(out.contains("config OK"), "{out}");
}

#[test]
fn unit_file_stops_reloads_and_keeps_state_as_documented() {
    let unit = unit();
    let get = |k: &str| {
        unit.get(&format!("[Service]{k}"))
            .unwrap_or_else(|| panic!("{UNIT}: no {k}="))
            .as_str()
    };
    assert_eq!(get("Restart"), "on-failure");
    // Room for a thread per lent connection (4,096) and per core call.
    assert_eq!(get("TasksMax"), "8192");
    assert_eq!(get("KillSignal"), "SIGTERM");
    assert_eq!(get("ExecReload"), "/bin/kill -HUP $MAINPID");
    assert_eq!(get("User"), "relayhub");
    assert_eq!(get("StateDirectory"), "relayhub");
    assert_eq!(get("NoNewPrivileges"), "yes");
    assert_eq!(get("ProtectSystem"), "strict");
    assert_eq!(unit["[Install]WantedBy"], "multi-user.target");

    // Stopping drains for at most one budget: the stop timeout must exceed it.
    let example = relayhub::config::Config::from_file(&repo(EXAMPLE)).unwrap();
    let stop_s: u64 = get("TimeoutStopSec")
        .parse()
        .expect("TimeoutStopSec in whole seconds");
    assert!(
        stop_s * 1000 > 2 * example.server.budget_ms,
        "TimeoutStopSec={stop_s} is not well above the {} ms budget",
        example.server.budget_ms
    );
    // The example's journal lives in the unit's state directory.
    assert!(
        example.journal.path.starts_with("/var/lib/relayhub/"),
        "example journal path {:?} is outside StateDirectory=relayhub",
        example.journal.path
    );
}

/// `check` names a PostgreSQL journal without its password, as `serve` and
/// the journal tools do (before, it printed the URL whole; found by a
/// black-box probe).
#[test]
fn check_prints_a_postgres_journal_without_its_password() {
    let out = run_check(&[
        "check".into(),
        "--core-url".into(),
        "http://127.0.0.1:1".into(),
        "--journal".into(),
        "postgres://hub:s3cret@db.invalid:5432/j".into(),
    ]);
    assert!(
        out.contains("journal postgres://hub:***@db.invalid:5432/j"),
        "{out}"
    );
    assert!(!out.contains("s3cret"), "{out}");
}

/// `check` refuses a shared journal's lease shorter than the longest call,
/// as `serve` does at start (before, `check` said "config OK"; found by a
/// black-box probe). Nothing is connected to.
#[test]
fn check_refuses_a_lease_shorter_than_the_longest_call() {
    let out = Command::new(relayhub_bin())
        .args([
            "check",
            "--core-url",
            "http://127.0.0.1:1",
            "--budget-ms",
            "1000",
        ])
        .args([
            "--journal",
            "postgres://hub:s3cret@db.invalid:5432/j?lease_ms=2000",
        ])
        .output()
        .expect("run relayhub check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("lease_ms=2000 is shorter than the longest call"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

/// A core URL whose query or fragment would swallow the API's paths, or that
/// carries credentials, is refused at start with the key and without the
/// password (before, the hub started and every inquiry asked the same URL;
/// found by a black-box probe).
#[test]
fn serve_refuses_a_core_url_the_api_paths_cannot_follow() {
    for (url, why) in [
        ("http://127.0.0.1:1/api?x=1#frag", "query or a fragment"),
        ("http://alice:s3cretPW@127.0.0.1:1", "carries credentials"),
        ("http://127.0.0.1:99999", "a port is 1-65535"),
    ] {
        let out = Command::new(relayhub_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--journal", "memory"])
            .args(["--core-url", url])
            .output()
            .expect("run relayhub serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{url}: {stderr}");
        assert!(
            stderr.contains("target.core.urls") && stderr.contains(why),
            "{url}: {stderr}"
        );
        assert!(!stderr.contains("s3cretPW"), "{stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("listening on"));
    }
}

/// Each refusal of a start names what to fix (a black-box probe's list):
/// a negative number names its flag (before: "unexpected argument '-5'"),
/// a listen port past 65535 says so (before: "is not HOST:PORT"), and a
/// layouts folder or code table that cannot be read names its key (before:
/// only the path).
#[test]
fn start_refusals_name_the_flag_or_key_to_fix() {
    let missing = std::env::temp_dir().join("relayhub-no-such-dir/x");
    let config = |key: &str| {
        let file = std::env::temp_dir().join(format!(
            "relayhub-refusal-{key}-{}.toml",
            std::process::id()
        ));
        std::fs::write(&file, format!("[server]\n{key} = {:?}\n", missing)).unwrap();
        file.display().to_string()
    };
    let (layouts, codes) = (config("layouts_dir"), config("codes_file"));
    let base = ["check", "--core-url", "http://127.0.0.1:1"];
    for (extra, status, said) in [
        (vec!["--budget-ms", "-5"], 2, "'--budget-ms <MS>'"),
        (
            vec!["--connect-timeout-ms", "-1"],
            2,
            "'--connect-timeout-ms <MS>'",
        ),
        (
            vec!["--listen", "127.0.0.1:99999"],
            1,
            "`server.listen`: \"127.0.0.1:99999\": a port is 0-65535",
        ),
        (vec!["--config", &layouts], 1, "server.layouts_dir: "),
        (vec!["--config", &codes], 1, "server.codes_file: "),
    ] {
        let out = Command::new(relayhub_bin())
            .args(base)
            .args(&extra)
            .output()
            .expect("run relayhub check");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{extra:?}: {stderr}");
        assert!(stderr.contains(said), "{extra:?}: {stderr}");
    }
    for file in [layouts, codes] {
        let _ = std::fs::remove_file(file);
    }
}
