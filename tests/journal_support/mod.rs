//! What the journal suites share on top of `tests/common`: a hub on a chosen
//! journal (memory or a SQLite file) with a TOML of its own, and the real
//! `relayhub` binary on a journal file, started so that a test can SIGKILL it.
//!
//! Declare it beside `mod common;` at the test binary's root: it uses that module.

#![allow(dead_code)] // each suite uses a different part of it

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use relayhub::client::{Answer, Channel};
use relayhub::config::Overrides;
use relayhub::daemon::{Daemon, Source};
use relayhub::frame::PrefixMode;
use relayhub::journal::{Row, State};

use crate::common::{PATIENCE, Proc, TempFile, connect, exchange, relayhub_bin, try_start, within};

/// A hub started in-process on `127.0.0.1:0`.
pub struct Hub {
    pub daemon: Daemon,
    _config: Option<TempFile>,
}

/// How a journal test wants its hub.
#[derive(Debug, Clone)]
pub struct HubSpec {
    pub core_url: String,
    /// `memory` or a database file.
    pub journal: String,
    pub budget_ms: Option<u64>,
    /// A TOML config (e.g. `[journal]` resend policy), given as `--config`.
    pub toml: Option<String>,
}

impl HubSpec {
    pub fn new(core_url: &str) -> HubSpec {
        HubSpec {
            core_url: core_url.to_string(),
            journal: "memory".into(),
            budget_ms: None,
            toml: None,
        }
    }

    pub fn journal(mut self, journal: impl Into<String>) -> HubSpec {
        self.journal = journal.into();
        self
    }

    pub fn budget_ms(mut self, ms: u64) -> HubSpec {
        self.budget_ms = Some(ms);
        self
    }

    pub fn toml(mut self, toml: &str) -> HubSpec {
        self.toml = Some(toml.to_string());
        self
    }

    pub async fn start(&self) -> Hub {
        let config = self.toml.as_deref().map(|t| TempFile::new("toml", t));
        let source = Source {
            file: config.as_ref().map(|f| f.0.clone()),
            overrides: Overrides {
                listen: Some("127.0.0.1:0".into()),
                core_url: Some(self.core_url.clone()),
                budget_ms: self.budget_ms,
                connect_timeout_ms: None,
                journal: Some(self.journal.clone()),
                admin_listen: None,
            },
        };
        let daemon = Daemon::start(source).await.expect("hub starts");
        Hub {
            daemon,
            _config: config,
        }
    }
}

impl Hub {
    pub fn addr(&self) -> SocketAddr {
        self.daemon.addr
    }

    /// Sends one telegram on a connection of its own and returns the answer.
    pub async fn send(&self, telegram: &[u8]) -> Answer {
        let mut ch = connect(self.daemon.addr, PrefixMode::Ascii).await;
        exchange(&mut ch, telegram).await
    }

    pub async fn channel(&self) -> Channel {
        connect(self.daemon.addr, PrefixMode::Ascii).await
    }

    /// The journal's row for `guid`.
    pub async fn row(&self, guid: &str) -> Option<Row> {
        self.daemon
            .hub()
            .journal()
            .get(guid)
            .await
            .expect("journal readable")
    }

    /// Waits (bounded by [`PATIENCE`]) until the row for `guid` is in `state`.
    ///
    /// The journal has no change feed, so this polls it; the pause between
    /// polls orders nothing, it only keeps the loop from spinning.
    pub async fn wait_state(&self, guid: &str, state: State) -> Row {
        within(async {
            loop {
                if let Some(row) = self.row(guid).await
                    && row.state == state
                {
                    return row;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
    }

    pub async fn shutdown(self) {
        self.daemon.shutdown().await;
    }
}

/// A TOML config with the given resend policy and an otherwise default core
/// target (whose URL `--core-url` fills in).
pub fn resend_policy(max_resends: u32, cooldown_ms: u64) -> String {
    format!("[journal]\nmax_resends = {max_resends}\nresend_cooldown_ms = {cooldown_ms}\n")
}

/// The 45-byte 0000 body split into `txn_id`, `processed_at`, `balance`.
pub fn ok_body(a: &Answer) -> (String, String, u64) {
    assert_eq!(a.code, "0000", "answer {a:?}");
    assert_eq!(a.body.len(), 45, "0000 body length; answer {a:?}");
    let s = String::from_utf8(a.body.clone()).expect("ASCII body");
    let balance = s[30..45].parse().expect("balance digits");
    (
        s[..16].trim_end().to_string(),
        s[16..30].to_string(),
        balance,
    )
}

// ---- the real binary ------------------------------------------------------

/// `relayhub serve` on `journal`, owned so that a test can SIGKILL it and see
/// it die; returns once its `listening on HOST:PORT` line is out.
pub fn start_hub_process(core_url: &str, journal: &Path, budget_ms: u64) -> Proc {
    let mut cmd = Command::new(relayhub_bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--core-url", core_url])
        .arg("--journal")
        .arg(journal)
        .args(["--budget-ms", &budget_ms.to_string()]);
    try_start(&mut cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// What a finished `relayhub` command printed.
#[derive(Debug)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `relayhub ARGS` to its end (bounded by [`PATIENCE`]).
pub fn relayhub(args: &[&str]) -> Output {
    let child = Command::new(relayhub_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn relayhub");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = rx
        .recv_timeout(PATIENCE)
        .unwrap_or_else(|_| {
            // Not left running after the failed test (a hub that started
            // where a refusal was expected).
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("relayhub {args:?} did not end within {PATIENCE:?}")
        })
        .expect("relayhub output");
    Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
