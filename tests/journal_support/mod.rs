//! What the journal suites share on top of `tests/common`: a hub on a chosen
//! journal (memory or a SQLite file) with a TOML of its own, a private temp
//! directory for journal files, a "core that is down, then back" on one port,
//! and the real `relayhub` binary started so that a test can SIGKILL it.
//!
//! Include it after `mod common;`: it uses that module.

#![allow(dead_code)] // each suite uses a different part of it

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use corebank::CoreBank;
use relayhub::client::{Answer, Channel};
use relayhub::config::Overrides;
use relayhub::daemon::{Daemon, Source};
use relayhub::frame::PrefixMode;
use relayhub::journal::{Row, State};

use crate::common::{PATIENCE, TempFile, connect, exchange, within};

/// A directory of its own under the system temp dir, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "relayhub-{tag}-{}-{}-{nanos}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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
                if let Some(row) = self.row(guid).await {
                    if row.state == state {
                        return row;
                    }
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

/// The POSTs the fixture counted for `guid`.
pub fn posts(core: &CoreBank, guid: &str) -> u64 {
    core.stats().by_guid.get(guid).map(|g| g.post).unwrap_or(0)
}

/// The GETs the fixture counted for `guid`.
pub fn gets(core: &CoreBank, guid: &str) -> u64 {
    core.stats().by_guid.get(guid).map(|g| g.get).unwrap_or(0)
}

/// A port on 127.0.0.1 with no listener (connect is refused), which a fixture
/// can bind later: "the core is down, then back".
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// Starts the fixture on `port` (the core coming back).
pub async fn start_core_on(port: u16) -> CoreBank {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| panic!("rebind 127.0.0.1:{port} for the fixture: {e}"));
    corebank::start(listener, corebank::default_seed()).await
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

/// A `relayhub serve` process, owned so that a test can SIGKILL it and see it die.
pub struct HubProcess {
    child: Option<Child>,
    pub addr: SocketAddr,
    log: TempFile,
}

impl HubProcess {
    /// Starts `relayhub serve` and waits for its `listening on HOST:PORT` line.
    pub fn start(core_url: &str, journal: &Path, budget_ms: u64) -> HubProcess {
        let log = TempFile::new("log", "");
        let stderr = std::fs::File::create(&log.0).expect("log file");
        let budget = budget_ms.to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_relayhub"))
            .args(["serve", "--listen", "127.0.0.1:0", "--core-url", core_url])
            .arg("--journal")
            .arg(journal)
            .args(["--budget-ms", &budget])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn relayhub");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            for _ in lines {} // keep the pipe drained
        });
        let line = match rx.recv_timeout(PATIENCE) {
            Ok(Some(Ok(line))) => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "relayhub printed no ready line ({other:?}); stderr:\n{}",
                    std::fs::read_to_string(&log.0).unwrap_or_default()
                );
            }
        };
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("ready line without `listening on HOST:PORT`: {line:?}"));
        HubProcess {
            child: Some(child),
            addr,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL: no drain, no clean-up; returns the exit status once reaped.
    pub fn sigkill(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .args(["-KILL", &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -KILL {} failed", child.id());
        child.wait().expect("reap relayhub")
    }

    /// SIGTERM, then the exit status (bounded by [`PATIENCE`]).
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {} failed", child.id());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(PATIENCE) {
            Ok(Ok(status)) => status,
            other => panic!("relayhub did not exit within {PATIENCE:?} of SIGTERM: {other:?}"),
        }
    }

    /// What the process logged so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log.0).unwrap_or_default()
    }

    pub async fn channel(&self) -> Channel {
        connect(self.addr, PrefixMode::Ascii).await
    }

    pub async fn send(&self, telegram: &[u8]) -> Answer {
        let mut ch = self.channel().await;
        exchange(&mut ch, telegram).await
    }
}

impl Drop for HubProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
