//! The first hour of an operator and a channel developer, with the real
//! binaries: every step of the docs works, and none fails silently.
//!
//! - `check` and a SIGHUP reload refuse a layout that does not fit the core's
//!   API (a misspelt response field, a missing request field), naming the
//!   layout, the field and the fix; every shipped layout passes.
//! - Masking is declared per field; a field that declares nothing is masked
//!   unless it is a code, an amount or a date, and `check` lists what is clear.
//! - A reload names the changed keys that wait for a restart.
//! - The core's own words on a 400 reach the log line and the journal row.
//! - `send` checks what it can before sending, explains a mismatched prefix,
//!   follows a config's routes and explains each code by operation.
//! - The "First hour" walk-through of docs/operations.md, replayed command by
//!   command from the doc itself.
//!
//! Waits are on ready lines, answers and log lines, each bounded by `PATIENCE`.

use crate::common;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;

use common::*;
use corebank::{FaultMethod, FaultRule};
use relayhub::client::build_telegram;
use relayhub::header::local_timestamp;
use relayhub::layout::Layout;
use serde_json::json;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

// ---- running the binaries ------------------------------------------------------

/// What a finished command left.
struct Out {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Out {
    fn all(&self) -> String {
        format!(
            "status {:?}\n--- stdout\n{}--- stderr\n{}",
            self.status.code(),
            self.stdout,
            self.stderr
        )
    }
}

/// Runs `bin args` in `dir` to its end (bounded by `PATIENCE`).
fn run_in(dir: &Path, bin: &Path, args: &[&str]) -> Out {
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let stdout = pipe(Box::new(child.stdout.take().unwrap()));
    let stderr = pipe(Box::new(child.stderr.take().unwrap()));
    let pid = child.id();
    let status = wait_exit_within(child, PATIENCE).unwrap_or_else(|e| {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        panic!(
            "{} {args:?} did not finish within {PATIENCE:?}: {e}",
            bin.display()
        )
    });
    Out {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

fn relayhub(args: &[&str]) -> Out {
    run_in(&std::env::temp_dir(), &relayhub_bin(), args)
}

/// `relayhub serve ARGS`, ready once it printed its listening line.
fn serve(args: &[&str]) -> Proc {
    let mut cmd = Command::new(relayhub_bin());
    cmd.arg("serve").args(args).env("RUST_LOG", "info");
    try_start(&mut cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// A hub with the config file `cfg`, on port 0, with the memory journal.
fn serve_config(cfg: &Path) -> Proc {
    serve(&[
        "--config",
        cfg.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--journal",
        "memory",
    ])
}

/// Waits (bounded) for a log line containing `needle` beyond the first `skip`
/// such lines, and returns it.
fn log_line(hub: &Proc, needle: &str, skip: usize) -> String {
    let until = Instant::now() + PATIENCE;
    loop {
        let log = hub.stderr();
        if let Some(line) = log.lines().filter(|l| l.contains(needle)).nth(skip) {
            return line.to_string();
        }
        assert!(
            Instant::now() < until,
            "no log line with {needle:?} within {PATIENCE:?}; stderr:\n{log}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Sends SIGHUP and returns the hub's next line about a reload.
fn reload(hub: &Proc) -> String {
    let before = hub
        .stderr()
        .lines()
        .filter(|l| l.contains("reload"))
        .count();
    send_signal(hub.pid, "HUP");
    log_line(hub, "reload", before)
}

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write file");
    path
}

fn target(url: &str) -> String {
    format!("[[target]]\nname = \"core\"\nurls = [{url:?}]\n\n")
}

fn route(tx: &str, op: &str, layout: Option<&str>) -> String {
    let layout = layout
        .map(|l| format!("layout = {l:?}\n"))
        .unwrap_or_default();
    format!("[[route]]\ntx_code = {tx:?}\noperation = {op:?}\n{layout}\n")
}

/// A hub (memory journal) from a config in `dir` with TRF001, TRF002 (by
/// TRF001's layout) and INQ001 routed to `core_url`, and `extra` after them.
fn serve_three_routes(core_url: &str, dir: &TempDir, extra: &str) -> Proc {
    let cfg = write(
        dir,
        "relayhub.toml",
        &format!(
            "{}{}{}{}{extra}",
            target(core_url),
            route("TRF001", "transfer", None),
            route("TRF002", "transfer", Some("TRF001")),
            route("INQ001", "inquiry", None),
        ),
    );
    serve_config(&cfg)
}

fn trf_json(amount: u64) -> String {
    json!({"from_account": ACC1, "to_bank": BANK, "to_account": ACC2,
           "amount": amount, "memo": "rent"})
    .to_string()
}

// ---- layouts against the core's API ---------------------------------------------

/// The deliberately wrong layouts, and what `check` must say about each: the
/// layout, the field and the fix.
const NOT_FITTING: &[(&str, &[&str])] = &[
    (
        "response_field_typo.json",
        &[
            "layout TRF001",
            "response field `balnce`",
            "did you mean `balance`?",
        ],
    ),
    (
        "missing_to_bank.json",
        &[
            "layout TRF001",
            "no field `to_bank`",
            r#"add { "name": "to_bank", "type": "N", "length": 3 }"#,
        ],
    ),
    (
        "missing_memo.json",
        &[
            "layout TRF001",
            "no field `memo`",
            r#"add { "name": "memo""#,
        ],
    ),
    (
        "missing_orig_guid.json",
        &[
            "layout INQ001",
            "no field `orig_guid`",
            r#"add { "name": "orig_guid", "type": "AN", "length": 32"#,
        ],
    ),
    (
        "amount_as_text.json",
        &["layout TRF001", "`amount` is type AN", "\"type\": \"U\""],
    ),
];

fn not_fitting_files() -> Vec<PathBuf> {
    let dir = repo("layouts/invalid/core_api");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    let mut listed: Vec<String> = NOT_FITTING.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(
        names, listed,
        "every file under layouts/invalid/core_api is tested"
    );
    files
}

fn expected_for(file: &Path) -> &'static [&'static str] {
    let name = file.file_name().unwrap().to_string_lossy();
    NOT_FITTING.iter().find(|(n, _)| *n == name).unwrap().1
}

#[test]
fn check_accepts_every_shipped_layout() {
    let dir = TempDir::new("fh-shipped");
    let layouts = repo("layouts");
    let cfg = write(
        &dir,
        "relayhub.toml",
        &format!(
            "[server]\nlayouts_dir = {:?}\n\n{}",
            layouts.display().to_string(),
            target("http://127.0.0.1:1")
        ),
    );
    let out = relayhub(&["check", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.all());
    for tx in ["TRF001", "INQ001"] {
        let file = layouts.join(format!("{tx}.json")).display().to_string();
        assert!(
            out.stdout
                .lines()
                .any(|l| l.starts_with(tx) && l.contains(&file)),
            "route {tx} with its layout file {file}:\n{}",
            out.all()
        );
    }
}

#[test]
fn check_refuses_layouts_that_do_not_fit_the_core() {
    for file in not_fitting_files() {
        let dir = TempDir::new("fh-badlayout");
        let layouts = dir.join("layouts");
        std::fs::create_dir(&layouts).unwrap();
        std::fs::copy(&file, layouts.join("bad.json")).unwrap();
        let cfg = write(
            &dir,
            "relayhub.toml",
            &format!(
                "[server]\nlayouts_dir = {:?}\n\n{}",
                layouts.display().to_string(),
                target("http://127.0.0.1:1")
            ),
        );
        let out = relayhub(&["check", "--config", cfg.to_str().unwrap()]);
        assert!(
            !out.status.success(),
            "{}: check passed\n{}",
            file.display(),
            out.all()
        );
        for want in expected_for(&file) {
            assert!(
                out.stderr.contains(want),
                "{}: the message lacks {want:?}\n{}",
                file.display(),
                out.all()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_refuses_layouts_that_do_not_fit_the_core() {
    let core = start_core().await;
    let dir = TempDir::new("fh-reloadlayout");
    let layouts = dir.join("layouts");
    std::fs::create_dir(&layouts).unwrap();
    let cfg = write(
        &dir,
        "relayhub.toml",
        &format!(
            "[server]\nlayouts_dir = {:?}\n\n{}",
            layouts.display().to_string(),
            target(&core.url())
        ),
    );
    let hub = serve_config(&cfg);
    for file in not_fitting_files() {
        std::fs::copy(&file, layouts.join("bad.json")).unwrap();
        let line = reload(&hub);
        assert!(
            line.contains("refused"),
            "{}: reload accepted: {line}",
            file.display()
        );
        for want in expected_for(&file) {
            assert!(
                line.contains(want),
                "{}: {line} lacks {want:?}",
                file.display()
            );
        }
        std::fs::remove_file(layouts.join("bad.json")).unwrap();
    }
    // The shipped layouts stayed in force: a transfer is processed.
    let g = guid("FHRL");
    let a = hub.send(&transfer(&g, 1_000)).await;
    assert_eq!(a.code, "0000", "{a:?}\n{}", hub.stderr());
}

// ---- masking ---------------------------------------------------------------------

/// A transfer layout with two more fields, named as nobody foresaw, and no
/// `log` key anywhere.
const EXTENDED: &str = r#"{
  "tx_code": "TRF002",
  "request_length": 114,
  "request": [
    { "name": "from_account", "type": "AN", "length": 16 },
    { "name": "to_bank", "type": "N", "length": 3 },
    { "name": "to_account", "type": "AN", "length": 16 },
    { "name": "amount", "type": "U", "length": 13 },
    { "name": "memo", "type": "H", "length": 20 },
    { "name": "from_acct_no", "type": "AN", "length": 16 },
    { "name": "note", "type": "H", "length": 30 }
  ],
  "response_length": 45,
  "response": [
    { "name": "txn_id", "type": "AN", "length": 16 },
    { "name": "processed_at", "type": "N", "length": 14 },
    { "name": "balance", "type": "U", "length": 15 }
  ]
}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_that_declare_no_log_rule_are_masked() {
    let core = start_core().await;
    let dir = TempDir::new("fh-mask");
    let layouts = dir.join("layouts");
    std::fs::create_dir(&layouts).unwrap();
    std::fs::write(layouts.join("TRF002.json"), EXTENDED).unwrap();
    let cfg = write(
        &dir,
        "relayhub.toml",
        &format!(
            "[server]\nlayouts_dir = {:?}\n\n{}{}",
            layouts.display().to_string(),
            target(&core.url()),
            route("TRF002", "transfer", None)
        ),
    );

    // `check` lists, per layout, what it logs in clear.
    let out = relayhub(&["check", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.all());
    let line = out
        .stdout
        .lines()
        .find(|l| l.contains("TRF002") && l.contains("in clear"))
        .unwrap_or_else(|| panic!("no clear-fields line for TRF002:\n{}", out.all()));
    assert!(
        line.contains("request.to_bank")
            && line.contains("request.amount")
            && !line.contains("from_acct_no")
            && !line.contains("note")
            && !line.contains("memo"),
        "{line}"
    );

    let hub = serve_config(&cfg);
    let layout = Layout::from_json("TRF002.json", EXTENDED).unwrap();
    let g = guid("FHMASK");
    let fields = json!({
        "from_account": ACC1, "to_bank": BANK, "to_account": ACC2, "amount": 1000,
        "memo": "010-2345-6789", "from_acct_no": ACC5, "note": "call 010-9876-5432",
    });
    let telegram = build_telegram(
        &layout,
        &g,
        CHANNEL,
        &local_timestamp(),
        fields.as_object().unwrap(),
    )
    .unwrap();
    let a = hub.send(&telegram).await;
    assert_eq!(a.code, "0000", "{a:?}");
    let summary = log_line(&hub, &g, 0);
    assert!(
        summary.contains("from_acct_no") && summary.contains("*********4005"),
        "{summary}"
    );
    let log = hub.stderr();
    for secret in [ACC1, ACC2, ACC5, "2345-6789", "9876-5432"] {
        assert!(!log.contains(secret), "{secret} is in the log:\n{log}");
    }
}

// ---- reload and restart-only keys ------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_names_the_changed_keys_that_wait_for_a_restart() {
    let core = start_core().await;
    let other = start_core().await;
    let dir = TempDir::new("fh-restart");
    let first = format!("[server]\nbudget_ms = 3000\n\n{}", target(&core.url()));
    let cfg = write(&dir, "relayhub.toml", &first);
    let hub = serve_config(&cfg);

    // Nothing changed: a plain ok.
    let line = reload(&hub);
    assert!(
        !line.contains("refused") && !line.contains("restart"),
        "{line}"
    );

    // Restart-only keys and a route: the route is in force, the keys wait.
    std::fs::write(
        &cfg,
        format!(
            "[server]\nbudget_ms = 2000\nprefix = \"binary\"\n\n{}{}{}{}",
            target(&other.url()),
            route("TRF001", "transfer", None),
            route("TRF002", "transfer", Some("TRF001")),
            route("INQ001", "inquiry", None),
        ),
    )
    .unwrap();
    let line = reload(&hub);
    assert!(!line.contains("refused"), "{line}");
    for want in [
        "wait for a restart",
        "server.budget_ms (3000 -> 2000)",
        "server.prefix (ascii -> binary)",
        &format!(
            "target.core.urls ([\"{}\"] -> [\"{}\"])",
            core.url(),
            other.url()
        ),
    ] {
        assert!(line.contains(want), "{line} lacks {want:?}");
    }
    // What is in force: the new route, the old target and prefix.
    let g = guid("FHRS");
    let a = hub.send(&transfer_as_tx("TRF002", &g)).await;
    assert_eq!(a.code, "0000", "{a:?}");
    assert_eq!(posts(&core, &g), 1);
    assert_eq!(posts(&other, &g), 0);
}

/// A route to a target the file adds is refused by a reload, which says
/// that targets change at a restart (before: "names unknown target", of a
/// target the file plainly has; found by a black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_routes_to_an_added_target_says_it_waits_for_a_restart() {
    let core = start_core().await;
    let dir = TempDir::new("fh-addtarget");
    let cfg = write(&dir, "relayhub.toml", &target(&core.url()));
    let hub = serve_config(&cfg);
    std::fs::write(
        &cfg,
        format!(
            "{}[[target]]\nname = \"core2\"\nurls = [{:?}]\n\n{}{}[[route]]\ntx_code = \"TRF002\"\n\
             operation = \"transfer\"\nlayout = \"TRF001\"\ntarget = \"core2\"\n",
            target(&core.url()),
            core.url(),
            route("TRF001", "transfer", None),
            route("INQ001", "inquiry", None),
        ),
    )
    .unwrap();
    let line = reload(&hub);
    for want in [
        "refused",
        "route.TRF002.target",
        "\"core2\", which the running hub does not have",
        "takes effect at a restart",
    ] {
        assert!(line.contains(want), "{line} lacks {want:?}");
    }
}

/// A reload that adds the TLS listener and a channel known by its client
/// certificate is refused whole: the listener waits for a restart, and the
/// channel table alone would shut that channel out (every telegram E103,
/// no listener to show its certificate on). The running table stays, so
/// the channel's telegrams on the plain listener go on (before: the reload
/// was taken, and IBANK got E103 until a restart; found by a black-box
/// probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_needs_a_tls_listener_added_is_refused() {
    let core = start_core().await;
    let ca = common::certs::TestCa::new("channels CA");
    let hub_cert = ca.server("hub", &["127.0.0.1"], common::certs::Validity::Current);
    let dir = TempDir::new("fh-addtls");
    let cfg = write(&dir, "relayhub.toml", &target(&core.url()));
    let hub = serve_config(&cfg);
    let g = guid("ADDTLS1");
    assert_eq!(hub.send(&transfer(&g, 1_000)).await.code, "0000");
    write(
        &dir,
        "relayhub.toml",
        &format!(
            "[server]\ntls_listen = \"127.0.0.1:0\"\ntls_cert_file = {c:?}\ntls_key_file = {k:?}\n\
             tls_client_ca_file = {ca:?}\n\n[[channel]]\nid = \"IBANK\"\n\
             cert_names = [\"ibank.channels.example\"]\ntx_codes = [\"TRF001\", \"INQ001\"]\n\n{}",
            target(&core.url()),
            c = hub_cert.cert.display().to_string(),
            k = hub_cert.key.display().to_string(),
            ca = ca.cert.display().to_string(),
        ),
    );
    let line = reload(&hub);
    for want in [
        "refused",
        "channel.IBANK.cert_names",
        "server.tls_listen waits for one",
    ] {
        assert!(line.contains(want), "{line} lacks {want:?}");
    }
    let g = guid("ADDTLS2");
    assert_eq!(hub.send(&transfer(&g, 1_000)).await.code, "0000");
}

/// A SIGHUP while the hub drains reloads nothing, and says so (before: no
/// line and no count; found by a black-box probe); the transfer in flight
/// still gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_during_the_drain_is_ignored_and_says_so() {
    use tokio::io::AsyncWriteExt;
    let core = start_core().await;
    let dir = TempDir::new("fh-hupdrain");
    let cfg = write(&dir, "relayhub.toml", &target(&core.url()));
    let hub = serve_config(&cfg);
    let g = guid("HUPDRAIN");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(1_500),
    );
    let mut ch = tokio::net::TcpStream::connect(&hub.addr).await.unwrap();
    ch.write_all(&framed(&transfer(&g, 1_000))).await.unwrap();
    let seen = g.clone();
    within(core.wait_stats(move |s| s.by_guid.get(&seen).is_some_and(|x| x.post == 1))).await;
    send_signal(hub.pid, "TERM");
    log_line(&hub, "stopping: draining", 0);
    send_signal(hub.pid, "HUP");
    let line = log_line(&hub, "reload ignored", 0);
    assert!(line.contains("WARN") && line.contains("draining"), "{line}");
    let (_, raw) = read_raw_answer(&mut ch).await;
    let answer = relayhub::client::Answer::parse(&raw).unwrap();
    assert_eq!(answer.code, "0000", "{answer:?}");
}

/// An INQ001 about a transfer left unknown whose tx code has lost its route
/// (a reload took it away) gets the core's true answer, but its row stays
/// unknown, since no answer can be stored for a resend to replay; a WARN
/// line says why, as reconcile does (before: no line, and the unknown count
/// did not fall with no reason given; found by a black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inquiry_that_cannot_settle_a_transfer_without_a_route_says_why() {
    let core = start_core().await;
    let dir = TempDir::new("fh-inqnoroute");
    let hub = serve_three_routes(&core.url(), &dir, "");
    let g = guid("NOROUTE");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .status(502)
            .phase(corebank::Phase::AfterApply)
            .times(1),
    );
    let a = hub.send(&transfer_as_tx("TRF002", &g)).await;
    assert_eq!(a.code, "E901", "{a:?}");
    write(
        &dir,
        "relayhub.toml",
        &format!(
            "{}{}{}",
            target(&core.url()),
            route("TRF001", "transfer", None),
            route("INQ001", "inquiry", None),
        ),
    );
    let line = reload(&hub);
    assert!(line.contains("in force"), "{line}");
    let a = hub.send(&inquiry(&guid("NOROUTEQ"), &g)).await;
    assert_eq!(a.code, "0000", "{a:?}");
    let line = log_line(&hub, "stays unknown in the journal", 0);
    assert!(
        line.contains("WARN") && line.contains("TRF002 has no route any more") && line.contains(&g),
        "{line}"
    );
}

/// An own-bank transfer by the TRF001 layout, sent as tx code `tx`.
fn transfer_as_tx(tx: &str, guid: &str) -> Vec<u8> {
    let mut t = transfer(guid, 1_000);
    t[..6].copy_from_slice(tx.as_bytes());
    t
}

// ---- the core's reason -------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_from_the_core_keeps_the_core_s_words() {
    let core = start_core().await;
    let dir = TempDir::new("fh-400");
    let journal = dir.join("journal.db");
    let hub = serve(&[
        "--core-url",
        &core.url(),
        "--listen",
        "127.0.0.1:0",
        "--journal",
        journal.to_str().unwrap(),
    ]);
    let g = guid("FH400");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .status(400)
            .body("{\"result\":\"BAD_REQUEST\",\n\"error\":\"to_bank 088 is closed today\"}"),
    );
    let a = hub.send(&transfer(&g, 1_000)).await;
    assert_eq!(a.code, "E500", "{a:?}");
    let summary = log_line(&hub, &g, 0);
    assert!(
        summary.contains("400") && summary.contains("to_bank 088 is closed today"),
        "{summary}"
    );
    assert!(summary.contains("\\n"), "the newline is escaped: {summary}");

    let out = relayhub(&[
        "journal",
        "--journal",
        journal.to_str().unwrap(),
        "show",
        &g,
    ]);
    assert!(out.status.success(), "{}", out.all());
    assert!(
        out.stdout.contains("to_bank 088 is closed today"),
        "{}",
        out.all()
    );
}

// ---- send ---------------------------------------------------------------------------

#[test]
fn send_checks_what_it_can_before_sending() {
    // Nothing listens on port 1: each refusal below comes before any connect.
    let cases: &[(&[&str], &[&str])] = &[
        (&["--guid", "20261129SHORT"], &["--guid", "32"]),
        (
            &["--guid", "20261129IBANK000000000000000001!"],
            &["--guid", "'!'", "byte 31"],
        ),
        (&["--channel", "TOOLONGID"], &["--channel", "8"]),
        (
            &[
                "--json",
                r#"{"from_account":"1002003004001","to_bank":"088","to_account":"1","amount":"12a"}"#,
            ],
            &["field `amount` at byte 99"],
        ),
        (
            &["--json", r#"{"from_acount":"1002003004001"}"#],
            &["`from_acount`", "layout TRF001", "from_account"],
        ),
        (
            &[
                "--json",
                r#"{"from_account":"","to_bank":"088","to_account":"1","amount":1}"#,
            ],
            &["field `from_account` at byte 64", "required"],
        ),
    ];
    for (args, wants) in cases {
        let mut all = vec!["send", "--to", "127.0.0.1:1"];
        all.extend_from_slice(args);
        let out = relayhub(&all);
        assert!(!out.status.success(), "{args:?}: accepted\n{}", out.all());
        assert!(
            !out.stderr.contains("cannot connect"),
            "{args:?}: tried to send first\n{}",
            out.all()
        );
        for want in *wants {
            assert!(
                out.stderr.contains(want),
                "{args:?}: lacks {want:?}\n{}",
                out.all()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_explains_a_mismatched_prefix() {
    let core = start_core().await;
    let dir = TempDir::new("fh-prefix");
    for (hub_prefix, send_prefix, wants) in [
        (
            "ascii",
            "binary",
            &[
                "808465972 is ASCII '0064'",
                "the hub speaks the ascii prefix",
            ][..],
        ),
        (
            "binary",
            "ascii",
            &["the hub speaks the binary prefix", "--prefix binary"][..],
        ),
    ] {
        let cfg = write(
            &dir,
            &format!("{hub_prefix}.toml"),
            &format!(
                "[server]\nprefix = {hub_prefix:?}\n\n{}",
                target(&core.url())
            ),
        );
        let hub = serve_config(&cfg);
        let addr = hub.addr.to_string();
        let out = relayhub(&[
            "send",
            "--to",
            &addr,
            "--prefix",
            send_prefix,
            "--json",
            &trf_json(1_000),
        ]);
        assert!(!out.status.success(), "{}", out.all());
        for want in wants {
            assert!(
                out.stderr.contains(want),
                "hub {hub_prefix}, send {send_prefix}: lacks {want:?}\n{}",
                out.all()
            );
        }
    }
    assert_eq!(core.stats().post, 0);
}

/// The reason for every refusal is on the hub's line with the GUID, naming
/// the field and the byte that decided it: a body's E102, an unrouted tx
/// code, a channel the table refuses, a GUID clash, an inquiry's malformed
/// `orig_guid` (at its first bad byte).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_names_its_field_and_byte_on_the_hub_s_line() {
    let core = start_core().await;
    let dir = TempDir::new("fh-refusals");
    let channels =
        format!("[[channel]]\nid = \"{CHANNEL}\"\ntx_codes = [\"TRF001\", \"INQ001\"]\n");
    let hub = serve_three_routes(&core.url(), &dir, &channels);
    let with_tx = |tx: &[u8; 6], g: &str| {
        let mut t = transfer(g, 1_000);
        t[..6].copy_from_slice(tx);
        t
    };
    let mut bad_amount = transfer(&guid("FHE102"), 1_000);
    // amount (U 13) starts at byte 64 + 16 + 3 + 16 = 99.
    bad_amount[101] = b'x';
    let cases = [
        (bad_amount, "E102", "field `amount` at byte 101"),
        (
            with_tx(b"XYZ999", &guid("FHE101")),
            "E101",
            "header field `tx_code` at byte 0",
        ),
        (
            with_tx(b"TRF002", &guid("FHE103")),
            "E103",
            "header field `channel_id` at byte 38",
        ),
        (
            inquiry(&guid("FHINQ"), "abc.def"),
            "E102",
            "field `orig_guid` at byte 67",
        ),
        (
            inquiry(&guid("FHINQ"), "ABCDEF"),
            "E102",
            "field `orig_guid` at byte 70",
        ),
    ];
    for (telegram, code, want) in cases {
        let g = std::str::from_utf8(&telegram[6..38]).unwrap().to_string();
        assert_eq!(hub.send(&telegram).await.code, code, "{want}");
        assert_line_names(&hub, &g, 0, code, want);
    }
    let clash = guid("FHCLASH");
    assert_eq!(hub.send(&transfer(&clash, 1_000)).await.code, "0000");
    assert_eq!(hub.send(&transfer(&clash, 2_000)).await.code, "E102");
    assert_line_names(&hub, &clash, 1, "E102", "header field `guid` at byte 6");
}

/// The hub's line about `guid` (past the first `skip`) shows `code` and `want`.
fn assert_line_names(hub: &Proc, guid: &str, skip: usize, code: &str, want: &str) {
    let line = log_line(hub, guid, skip);
    assert!(line.contains(code) && line.contains(want), "{want}: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_follows_a_config_s_routes_and_explains_codes_by_operation() {
    let core = start_core().await;
    let dir = TempDir::new("fh-sendcfg");
    let hub = serve_three_routes(&core.url(), &dir, "");
    let cfg = dir.join("relayhub.toml");
    let addr = hub.addr.to_string();
    let send = |args: &[&str]| {
        let mut all = vec!["send", "--config", cfg.to_str().unwrap(), "--to", &addr];
        all.extend_from_slice(args);
        relayhub(&all)
    };
    let answer_line = |out: &Out| {
        out.stdout
            .lines()
            .find(|l| l.starts_with("<<"))
            .unwrap_or_else(|| panic!("no answer line\n{}", out.all()))
            .to_string()
    };

    // TRF002 is an alias of TRF001's layout, known only from the config.
    let g = guid("FHALIAS");
    let out = send(&["--tx", "TRF002", "--guid", &g, "--json", &trf_json(1_000)]);
    assert!(out.status.success(), "{}", out.all());
    let transfer_line = answer_line(&out);
    assert!(
        transfer_line.contains("0000") && transfer_line.contains("money moved"),
        "{transfer_line}"
    );
    // On the wire and at the hub it is TRF002, not the layout's TRF001.
    assert!(
        out.stdout.contains(&format!(">> TRF002{g}"))
            && transfer_line.starts_with(&format!("<< TRF002 {g}")),
        "{}",
        out.all()
    );
    let hub_line = log_line(&hub, &g, 0);
    assert!(hub_line.contains("tx=\"TRF002\""), "{hub_line}");

    // An inquiry's 0000 speaks of the transfer asked about.
    let orig = json!({ "orig_guid": g }).to_string();
    let out = send(&["--tx", "INQ001", "--json", &orig]);
    assert!(out.status.success(), "{}", out.all());
    let line = answer_line(&out);
    assert!(
        line.contains("0000") && line.contains("the original transfer was processed"),
        "{line}"
    );
    assert_ne!(
        line.split("0000").nth(1),
        transfer_line.split("0000").nth(1),
        "an inquiry's 0000 has a text of its own"
    );

    // Each B-code its own meaning, by the code table's business result.
    let rejected = |json: String| {
        let out = send(&["--json", &json]);
        assert_eq!(out.status.code(), Some(2), "{}", out.all());
        answer_line(&out)
    };
    let b201 = rejected(
        json!({"from_account": ACC3, "to_bank": BANK, "to_account": ACC2, "amount": 600_000})
            .to_string(),
    );
    let b202 = rejected(
        json!({"from_account": ACC1, "to_bank": BANK, "to_account": UNKNOWN_ACC, "amount": 1})
            .to_string(),
    );
    assert!(
        b201.contains("B201") && b201.contains("INSUFFICIENT_FUNDS"),
        "{b201}"
    );
    assert!(
        b202.contains("B202") && b202.contains("ACCOUNT_NOT_FOUND"),
        "{b202}"
    );
}

/// `check` and a reload refuse what a start would: an admin token that
/// cannot be read, a log filter that does not parse, and (reload) a TLS
/// listener added whose files are missing. Before, `check` said "config OK"
/// and the reload counted "ok" for a set the next start refused.
#[tokio::test]
async fn check_and_reload_refuse_what_a_start_would() {
    let dir = TempDir::new("fh-startchecks");
    let base = target("http://127.0.0.1:1");
    let cases = [
        (
            "[server]\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_env = \"RELAYHUB_TEST_UNSET_TOKEN\"\n\n",
            "server.admin_token_env",
        ),
        (
            "[server]\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_file = \"/nonexistent/token\"\n\n",
            "server.admin_token_file",
        ),
        ("[logging]\nfilter = \"relayhub=[\"\n\n", "logging.filter"),
    ];
    for (extra, key) in cases {
        let cfg = write(&dir, "relayhub.toml", &format!("{extra}{base}"));
        let out = relayhub(&["check", "--config", cfg.to_str().unwrap()]);
        assert!(!out.status.success(), "check passed:\n{}", out.all());
        assert!(out.stderr.contains(key), "{key}:\n{}", out.all());
    }

    let cfg = write(&dir, "relayhub.toml", &base);
    let hub = serve_config(&cfg);
    let missing = dir.join("missing.pem");
    for (extra, key) in cases {
        write(&dir, "relayhub.toml", &format!("{extra}{base}"));
        let line = reload(&hub);
        assert!(
            line.contains("refused") && line.contains(key),
            "{key}: {line}"
        );
    }
    write(
        &dir,
        "relayhub.toml",
        &format!(
            "[server]\ntls_listen = \"127.0.0.1:0\"\ntls_cert_file = {m:?}\ntls_key_file = {m:?}\n\n{base}",
            m = missing.display().to_string()
        ),
    );
    let line = reload(&hub);
    assert!(
        line.contains("refused") && line.contains("missing.pem"),
        "{line}"
    );
}

/// A config meant for `serve --admin-listen` (a token, no listener in the
/// file) passes `check`, since `serve` alone does not read the token; but
/// `check` says that the token cannot be read, which the same file under
/// `--admin-listen` refuses (before: "config OK" and nothing else).
#[test]
fn check_notes_a_token_that_serve_admin_listen_would_refuse() {
    let dir = TempDir::new("fh-tokennote");
    let base = target("http://127.0.0.1:1");
    let cfg = write(
        &dir,
        "relayhub.toml",
        &format!("[server]\nadmin_token_env = \"RELAYHUB_TEST_UNSET_TOKEN\"\n\n{base}"),
    );
    let out = relayhub(&["check", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "check refused:\n{}", out.all());
    assert!(
        out.stdout.contains("note: server.admin_token_env")
            && out.stdout.contains("`serve --admin-listen` refuses"),
        "{}",
        out.all()
    );
    assert!(
        !out.all().contains("RELAYHUB_TEST_UNSET_TOKEN"),
        "{}",
        out.all()
    );
    let with_listener = relayhub(&[
        "serve",
        "--config",
        cfg.to_str().unwrap(),
        "--admin-listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.1:0",
        "--journal",
        "memory",
    ]);
    assert!(!with_listener.status.success(), "{}", with_listener.all());
    assert!(
        with_listener.stderr.contains("server.admin_token_env"),
        "{}",
        with_listener.all()
    );
}

/// A channel that sends the other length prefix gets E102, and the hub's
/// line says which prefix the bytes are and which one the listener takes
/// (before: "telegram length 808530738 exceeds the maximum", "byte 0 is
/// 0x00").
#[tokio::test]
async fn the_hub_s_line_names_a_mismatched_prefix() {
    use tokio::io::AsyncWriteExt;
    let core = start_core().await;
    let telegram = transfer(&guid("FHPREFIX"), 1_000);
    for (listener, wire_prefix, want) in [
        (
            "ascii",
            (telegram.len() as u32).to_be_bytes().to_vec(),
            "seems to send the binary prefix, and this listener takes the ascii one",
        ),
        (
            "binary",
            format!("{:04}", telegram.len()).into_bytes(),
            "seems to send the ascii prefix, and this listener takes the binary one",
        ),
        // The start of a TLS ClientHello, to the plain listener.
        (
            "ascii",
            vec![0x16, 0x03, 0x01, 0x00, 0x50],
            "begin a TLS handshake: the channel speaks TLS, and this listener is plain",
        ),
    ] {
        let dir = TempDir::new("fh-prefix");
        let cfg = write(
            &dir,
            "relayhub.toml",
            &format!("[server]\nprefix = {listener:?}\n\n{}", target(&core.url())),
        );
        let hub = serve_config(&cfg);
        let mut s = tokio::net::TcpStream::connect(&hub.addr).await.unwrap();
        let mut wire = wire_prefix;
        wire.extend_from_slice(&telegram);
        s.write_all(&wire).await.unwrap();
        let line = log_line(&hub, "unframeable input", 0);
        assert!(line.contains(want), "{listener}: {line}");
    }
    // A prefix too short in front of a whole telegram, on the binary
    // listener: its first 100 bytes are framed (and refused), and what is
    // left, ASCII digits of the amount, is no prefix of the other mode: the
    // line says an earlier length was most likely wrong (before, it blamed
    // the ascii prefix; found by a black-box probe).
    let dir = TempDir::new("fh-prefix");
    let cfg = write(
        &dir,
        "relayhub.toml",
        &format!("[server]\nprefix = \"binary\"\n\n{}", target(&core.url())),
    );
    let hub = serve_config(&cfg);
    let mut s = tokio::net::TcpStream::connect(&hub.addr).await.unwrap();
    let mut wire = 100u32.to_be_bytes().to_vec();
    wire.extend_from_slice(&telegram);
    s.write_all(&wire).await.unwrap();
    let line = log_line(&hub, "unframeable input", 0);
    assert!(
        line.contains("a telegram was framed on this connection before")
            && line.contains("an earlier telegram's length prefix was wrong")
            && !line.contains("seems to send the ascii prefix"),
        "{line}"
    );
}

/// A core URL given as `http://` for a core that speaks TLS: its answer is
/// a TLS alert, not HTTP. The transfer is E901 (the hub cannot prove the
/// core's HTTP never saw it), and an ERROR line says to check the target's
/// urls (before, only the telegram's note said "http parse fail"; found by
/// a black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_is_not_http_is_logged_as_a_configuration_error() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tls_core = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = tls_core.local_addr().unwrap().to_string();
    let url = format!("http://{host}");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tls_core.accept().await {
            let mut request = [0u8; 4096];
            let _ = s.read(&mut request).await;
            // A TLS 1.2 fatal alert: protocol_version.
            let _ = s
                .write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46])
                .await;
        }
    });
    let dir = TempDir::new("fh-nothttp");
    let cfg = write(&dir, "relayhub.toml", &target(&url));
    let hub = serve_config(&cfg);
    let g = guid("NOTHTTP");
    let answer = hub.send(&transfer(&g, 1_000)).await;
    assert_eq!(answer.code, "E901", "{answer:?}");
    let line = log_line(&hub, "the core's answer is not HTTP", 0);
    assert!(
        line.contains("ERROR")
            && line.contains("a TLS core named http://")
            && line.contains(&format!("host=\"{host}\"")),
        "{line}"
    );
    // The resend is asked by inquiry, whose line names the host too (it
    // said `host="?"`: found by a black-box probe).
    let again = hub.send(&transfer(&g, 1_000)).await;
    assert_eq!(again.code, "E901", "{again:?}");
    let line = log_line(&hub, "the core's answer is not HTTP", 1);
    assert!(line.contains(&format!("host=\"{host}\"")), "{line}");
}

/// An admin port in use is named as the admin listener's, not taken for
/// the telegram port.
#[test]
fn an_admin_port_in_use_is_named_as_the_admin_listener_s() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = relayhub(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--journal",
        "memory",
        "--core-url",
        "http://127.0.0.1:1",
        "--admin-listen",
        &addr,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    assert!(
        out.stderr
            .contains(&format!("cannot listen on {addr} (admin_listen)")),
        "{}",
        out.all()
    );
}

/// A telegram port in use refuses the start before the journal is opened:
/// no journal file is left behind for a hub that never ran (before, the
/// SQLite file, its WAL and its lock file were made first).
#[test]
fn a_telegram_port_in_use_leaves_no_journal_behind() {
    let dir = TempDir::new("fh-port-in-use");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let journal = dir.join("journal.db");
    let out = relayhub(&[
        "serve",
        "--listen",
        &addr,
        "--journal",
        journal.to_str().unwrap(),
        "--core-url",
        "http://127.0.0.1:1",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    assert!(
        out.stderr.contains(&format!("cannot listen on {addr}")),
        "{}",
        out.all()
    );
    let left: Vec<_> = std::fs::read_dir(dir.join("")).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A journal path that is a directory, or empty, is refused with the reason
/// and nothing is left beside it (before: a directory got `DIR.lock` made
/// beside it first, and an empty path passed `check` and made `serve`
/// blame "another relayhub" with its own pid; found by a black-box probe).
#[test]
fn a_journal_path_that_cannot_be_a_journal_leaves_nothing_behind() {
    let dir = TempDir::new("fh-badjournal");
    let adir = dir.join("adir");
    std::fs::create_dir(&adir).unwrap();
    let serve = |journal: &str| {
        relayhub(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--journal",
            journal,
            "--core-url",
            "http://127.0.0.1:1",
        ])
    };
    let out = serve(adir.to_str().unwrap());
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    assert!(out.stderr.contains("is a directory"), "{}", out.all());
    let left: Vec<_> = std::fs::read_dir(dir.join("")).unwrap().flatten().collect();
    assert_eq!(left.len(), 1, "left beside it: {left:?}");

    let out = serve("");
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    assert!(
        out.stderr.contains("`journal.path`") && out.stderr.contains("is empty"),
        "{}",
        out.all()
    );
    let check = relayhub(&["check", "--journal", "", "--core-url", "http://127.0.0.1:1"]);
    assert!(!check.status.success(), "{}", check.all());

    // A journal whose directory is not there: check passes with a note (a
    // config is often checked before its machine has the directory), and
    // serve refuses, naming it.
    let missing = dir.join("missing").join("journal.db");
    let missing = missing.to_str().unwrap();
    let check = relayhub(&[
        "check",
        "--journal",
        missing,
        "--core-url",
        "http://127.0.0.1:1",
    ]);
    assert!(check.status.success(), "{}", check.all());
    assert!(
        check.stdout.contains("note: the journal's directory")
            && check.stdout.contains("does not exist here"),
        "{}",
        check.all()
    );
    let out = serve(missing);
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    assert!(out.stderr.contains("does not exist"), "{}", out.all());
}

/// A script that waits for the ready line with `grep -m1` closes the pipe
/// once it has it; stdout may as well be full. The hub serves on: it logs
/// that the line could not be written (before, it panicked and exited 101).
#[tokio::test]
async fn a_hub_whose_stdout_cannot_be_written_serves_on() {
    let core = start_core().await;
    let stderr = TempFile::new("log", "");
    let mut child = Command::new(relayhub_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--journal", "memory"])
        .args(["--admin-listen", "127.0.0.1:0", "--core-url", &core.url()])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create("/dev/full").expect("open /dev/full"))
        .stderr(std::fs::File::create(&stderr.0).unwrap())
        .spawn()
        .expect("spawn relayhub");
    let until = Instant::now() + PATIENCE;
    let log = || std::fs::read_to_string(&stderr.0).unwrap_or_default();
    while !log().contains("cannot write the start-up line") {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the hub exited ({status}); stderr:\n{}", log());
        }
        assert!(Instant::now() < until, "no line about stdout:\n{}", log());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let addr = log()
        .lines()
        .find_map(|l| after(l, "relayhub ready addr="))
        .unwrap_or_else(|| panic!("no ready line:\n{}", log()));
    let mut ch = relayhub::client::Channel::connect(&addr, relayhub::frame::PrefixMode::Ascii)
        .await
        .unwrap();
    let g = guid("FHSTDOUT");
    let answer = within(ch.exchange(&transfer(&g, 1_000))).await.unwrap();
    assert_eq!(answer.code, "0000", "{answer:?}");
    send_signal(child.id(), "TERM");
    let status = wait_exit_within(child, PATIENCE).unwrap();
    assert!(status.success(), "{status}; stderr:\n{}", log());
}

// ---- layouts_dir, check's report, the docs' paths ------------------------------------

#[test]
fn layouts_dir_adds_to_the_built_in_layouts_and_check_shows_the_whole_setup() {
    let dir = TempDir::new("fh-adds");
    let layouts = dir.join("layouts");
    std::fs::create_dir(&layouts).unwrap();
    let shipped = std::fs::read_to_string(repo("layouts/TRF001.json")).unwrap();
    let trf003 = layouts.join("TRF003.json");
    std::fs::write(&trf003, shipped.replace("\"TRF001\"", "\"TRF003\"")).unwrap();
    let cfg = write(
        &dir,
        "relayhub.toml",
        &format!(
            "[server]\nlayouts_dir = {:?}\nlisten = \"127.0.0.1:9333\"\nprefix = \"binary\"\n\n{}{}{}{}{}\
             [[channel]]\nid = \"IBANK\"\nallow_from = [\"10.0.0.0/8\"]\ntx_codes = [\"TRF001\", \"INQ001\"]\n",
            layouts.display().to_string(),
            target("http://127.0.0.1:1"),
            route("TRF001", "transfer", None),
            route("TRF002", "transfer", Some("TRF001")),
            route("TRF003", "transfer", None),
            route("INQ001", "inquiry", None),
        ),
    );
    let out = relayhub(&["check", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.all());
    let routes: HashMap<&str, &str> = out
        .stdout
        .lines()
        .filter_map(|l| Some((l.split_whitespace().next()?, l)))
        .collect();
    let trf003 = trf003.display().to_string();
    for (tx, layout) in [
        ("TRF001", "TRF001 (builtin TRF001.json)"),
        ("TRF002", "TRF001 (builtin TRF001.json)"),
        ("TRF003", &*format!("TRF003 ({trf003})")),
        ("INQ001", "INQ001 (builtin INQ001.json)"),
    ] {
        let line = routes
            .get(tx)
            .unwrap_or_else(|| panic!("no route line for {tx}\n{}", out.all()));
        assert!(line.contains(layout), "{tx}: {line} lacks {layout:?}");
    }
    for want in [
        "listen 127.0.0.1:9333",
        "prefix binary",
        "channel IBANK",
        "10.0.0.0/8",
    ] {
        assert!(out.stdout.contains(want), "lacks {want:?}\n{}", out.all());
    }
}

#[test]
fn the_docs_name_layout_files_that_exist() {
    for doc in ["docs/operations.md", "README.md", "layouts/README.md"] {
        let text = std::fs::read_to_string(repo(doc)).unwrap();
        for piece in text.split('`').skip(1).step_by(2) {
            if piece.starts_with("layouts/") && piece.ends_with(".json") {
                assert!(
                    repo(piece).is_file(),
                    "{doc} names {piece}, which does not exist"
                );
            }
        }
    }
}

// ---- the walk-through of docs/operations.md ------------------------------------------

/// The `sh` block of docs/operations.md's "First hour" section.
fn walk_through() -> String {
    let doc = std::fs::read_to_string(repo("docs/operations.md")).unwrap();
    let start = doc
        .find("\n## First hour\n")
        .expect("docs/operations.md has a `## First hour` section");
    let section = &doc[start + 1..];
    let section = &section[..section[1..].find("\n## ").map_or(section.len(), |i| i + 1)];
    let open = section.find("```sh\n").expect("a ```sh block") + "```sh\n".len();
    let len = section[open..].find("```").expect("the block's end");
    section[open..open + len].to_string()
}

/// Splits a command line into words the way `sh` does for the forms the
/// walk-through uses (quotes, `\` escapes); a word starting with `#` begins
/// the comment, returned apart.
fn words(line: &str) -> (Vec<String>, String) {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '#' if word.is_none() => return (out, chars.collect::<String>().trim().to_string()),
            ' ' | '\t' => {
                if let Some(w) = word.take() {
                    out.push(w);
                }
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    w.push(c);
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => w.extend(chars.next()),
                        c => w.push(c),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word);
    (out, String::new())
}

/// The walk-through's state: its directory, processes and the addresses the
/// doc's fixed ports stand for.
struct Replay {
    dir: TempDir,
    ports: Vec<(String, String)>,
    vars: HashMap<String, u32>,
    procs: Vec<Proc>,
    hub: Option<usize>,
    last_pid: Option<u32>,
}

impl Replay {
    fn subst(&self, text: &str) -> String {
        self.ports
            .iter()
            .fold(text.to_string(), |t, (doc, real)| t.replace(doc, real))
    }

    fn proc_by_pid(&mut self, pid: u32) -> &mut Proc {
        self.procs
            .iter_mut()
            .find(|p| p.pid == pid)
            .expect("a process the walk-through started")
    }

    /// `corebank ... &` or `relayhub serve ... &`: started on a free port.
    fn background(&mut self, argv: &[String]) {
        let listen = argv
            .iter()
            .position(|w| w == "--listen")
            .map(|i| argv[i + 1].clone())
            .expect("a background command gives --listen");
        let args: Vec<String> = argv[1..]
            .iter()
            .map(|w| {
                if *w == listen {
                    "127.0.0.1:0".into()
                } else {
                    self.subst(w)
                }
            })
            .collect();
        let bin = match argv[0].as_str() {
            "corebank" => corebank_bin(),
            "relayhub" => relayhub_bin(),
            other => panic!("the walk-through starts {other} in the background"),
        };
        let mut cmd = Command::new(bin);
        cmd.args(&args)
            .current_dir(self.dir.join(""))
            .env("RUST_LOG", "info");
        let p = try_start(&mut cmd).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        self.ports.push((listen, p.addr.to_string()));
        self.last_pid = Some(p.pid);
        if argv[0] == "relayhub" {
            self.hub = Some(self.procs.len());
        }
        self.procs.push(p);
    }

    fn kill(&mut self, argv: &[String], expect: &str) {
        let (signal, targets) = match argv[1].strip_prefix('-') {
            Some(sig) => (sig.to_string(), &argv[2..]),
            None => ("TERM".to_string(), &argv[1..]),
        };
        let hub_log_before = self.hub.map(|i| self.procs[i].stderr().lines().count());
        for t in targets {
            let name = t.strip_prefix('$').expect("kill takes $VARIABLES");
            let pid = self.vars[name];
            if signal == "TERM" {
                let status = self.proc_by_pid(pid).terminate();
                assert!(status.success(), "kill {t}: exit {status:?}");
            } else {
                send_signal(pid, &signal);
            }
        }
        if let Some(want) = expect.strip_prefix("log:") {
            let hub = &self.procs[self.hub.expect("a hub runs")];
            let before = hub_log_before.unwrap_or(0);
            let until = Instant::now() + PATIENCE;
            loop {
                let log = hub.stderr();
                if log.lines().skip(before).any(|l| l.contains(want.trim())) {
                    break;
                }
                assert!(
                    Instant::now() < until,
                    "{argv:?}: no log line with {want:?}; stderr:\n{log}"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }

    fn curl(&self, argv: &[String]) {
        let (mut method, mut headers, mut body, mut url) = ("GET", Vec::new(), None, None);
        let mut i = 1;
        while i < argv.len() {
            match argv[i].as_str() {
                "-s" => {}
                "-X" => {
                    i += 1;
                    method = argv[i].as_str();
                }
                "-H" => {
                    i += 1;
                    headers.push(argv[i].clone());
                }
                "-d" => {
                    i += 1;
                    body = Some(self.subst(&argv[i]));
                }
                u => url = Some(self.subst(u)),
            }
            i += 1;
        }
        let url = url.expect("curl names a URL");
        let url = if url.starts_with("http") {
            url
        } else {
            format!("http://{url}")
        };
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(PATIENCE))
            .build()
            .new_agent();
        let mut req = ureq::http::Request::builder().method(method).uri(&url);
        for h in &headers {
            let (k, v) = h.split_once(':').expect("-H 'Name: value'");
            req = req.header(k.trim(), v.trim());
        }
        let req = req.body(body.unwrap_or_default()).unwrap();
        let resp = agent.run(req).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        assert!(resp.status().is_success(), "{argv:?}: {}", resp.status());
    }

    fn relayhub(&self, argv: &[String], expect: &str) {
        let args: Vec<String> = argv[1..].iter().map(|w| self.subst(w)).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_in(&self.dir.join(""), &relayhub_bin(), &args);
        // `send` exits 2 for any answer but 0000; the expectation says which.
        let ok = out.status.success() || (args[0] == "send" && out.status.code() == Some(2));
        assert!(ok, "{argv:?} failed\n{}", out.all());
        // What was sent (`>>` lines) holds digits that would match anything.
        let shown: String = format!("{}\n{}", out.stdout, out.stderr)
            .lines()
            .filter(|l| !l.starts_with(">>"))
            .collect::<Vec<_>>()
            .join("\n");
        if !expect.is_empty() {
            assert!(
                shown.contains(expect),
                "{argv:?}: no {expect:?}\n{}",
                out.all()
            );
        }
        if args[0] == "send" && out.status.code() == Some(2) {
            assert!(
                expect.starts_with('E') || expect.starts_with('B'),
                "{argv:?}: not 0000 although the doc expects {expect:?}\n{}",
                out.all()
            );
        }
    }
}

#[test]
fn the_first_hour_walk_through_replays_command_by_command() {
    let block = walk_through();
    let mut replay = Replay {
        dir: TempDir::new("fh-walk"),
        ports: Vec::new(),
        vars: HashMap::new(),
        procs: Vec::new(),
        hub: None,
        last_pid: None,
    };
    // Continuation lines joined; heredocs kept with their command.
    let mut lines = block.lines().peekable();
    let mut steps = 0;
    while let Some(first) = lines.next() {
        let mut line = first.to_string();
        while line.ends_with('\\') {
            line.pop();
            line.push_str(lines.next().expect("a continued line"));
        }
        let (argv, comment) = words(&line);
        if argv.is_empty() {
            continue;
        }
        steps += 1;
        let expect = comment.strip_prefix("->").unwrap_or("").trim().to_string();
        match argv[0].as_str() {
            "cat" => {
                // cat > FILE <<'EOF' ... EOF
                assert_eq!(
                    (argv[1].as_str(), argv[3].as_str()),
                    (">", "<<EOF"),
                    "{line}"
                );
                let mut text = String::new();
                for l in lines.by_ref() {
                    if l == "EOF" {
                        break;
                    }
                    text.push_str(l);
                    text.push('\n');
                }
                std::fs::write(replay.dir.join(&argv[2]), replay.subst(&text)).unwrap();
            }
            _ if argv.last().is_some_and(|w| w == "&") => {
                replay.background(&argv[..argv.len() - 1]);
            }
            v if v.ends_with("=$!") => {
                let name = v.trim_end_matches("=$!").to_string();
                replay
                    .vars
                    .insert(name, replay.last_pid.expect("a background process"));
            }
            "kill" => replay.kill(&argv, &expect),
            "curl" => replay.curl(&argv),
            "relayhub" => replay.relayhub(&argv, &expect),
            other => {
                panic!("the walk-through runs {other:?}, which this test does not replay: {line}")
            }
        }
    }
    assert!(steps >= 15, "the walk-through has only {steps} commands");
    assert!(replay.hub.is_some(), "the walk-through starts a hub");
}
