//! Shared setup for the shared-journal suites (`tests/pg/`): the test
//! database from `RELAYHUB_TEST_PG` (set by `scripts/with-postgres.sh`), a
//! fresh schema per test, a TCP proxy that plays "the database is down", real
//! `relayhub` processes, and TRF001 telegrams.
//!
//! Without `RELAYHUB_TEST_PG` every test prints a skip line on stderr and
//! passes, so a plain `cargo test` needs no database; under `CI=true` it fails
//! instead. Nothing here sleeps to order events: waits
//! are on answers, the fixture's counters or ready lines, each bounded by
//! [`PATIENCE`].
//!
//! Declare it beside `mod common;` at the test binary's root: it builds on that module.

#![allow(dead_code)] // each suite uses a different part of it

use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use relayhub::client::{Answer, Channel, new_guid};
use relayhub::frame::PrefixMode;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::common::{spawn_listening, trf, trf_fields, within_for};

/// Upper bound for any wait; never used to order events.
pub const PATIENCE: Duration = Duration::from_secs(20);

// What the shared-journal suites take from `tests/common` as it is (each
// suite uses a different part of it).
#[allow(unused_imports)]
pub use crate::common::{ACC1, ACC2, BANK, TempFile, calls, free_port, relayhub_bin, start_core};

/// The test database's URL, or `None` after a line on stderr saying this test
/// is skipped. Under `CI=true` a missing database fails the test instead: CI
/// must not pass without the shared-journal tests.
///
/// The skip line is written to the process's stderr directly, not through
/// `eprintln!`, which the test harness captures and shows only for failures:
/// `cargo test` shows it even though the test passes.
pub fn test_db() -> Option<String> {
    match std::env::var("RELAYHUB_TEST_PG") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let thread = std::thread::current();
            let test = thread.name().unwrap_or("a PostgreSQL test");
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!(
                    "{test}: RELAYHUB_TEST_PG is not set and CI=true: run the tests \
                     through scripts/with-postgres.sh"
                );
            }
            // One write, so parallel tests do not interleave their lines.
            let line = format!(
                "\nskipped {test}: RELAYHUB_TEST_PG is not set (scripts/with-postgres.sh sets it)\n"
            );
            use std::io::Write;
            let _ = std::io::stderr().write_all(line.as_bytes());
            None
        }
    }
}

/// Appends query parameters to a URL.
pub fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// Creates an empty schema and returns the URL whose connections use it, so
/// each test has journal tables of its own in the one test database.
pub async fn fresh_schema(base: &str, tag: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let schema = format!(
        "t_{}_{}_{}_{}",
        tag.to_lowercase(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() % 1_000_000)
            .unwrap_or(0)
    );
    let client = raw_client(base).await;
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .expect("create a test schema");
    // `options=-c search_path=SCHEMA`, percent-encoded.
    with_params(base, &format!("options=-c%20search_path%3D{schema}"))
}

/// A plain driver connection (for a test's own SQL), its task spawned.
pub async fn raw_client(url: &str) -> tokio_postgres::Client {
    // The driver does not know the hub's keys.
    let driver_url: String = match url.split_once('?') {
        Some((base, q)) => {
            let kept: Vec<&str> = q
                .split('&')
                .filter(|p| {
                    !["hub_id=", "lease_ms=", "pool_size=", "timeout_ms="]
                        .iter()
                        .any(|k| p.starts_with(k))
                })
                .collect();
            if kept.is_empty() {
                base.to_string()
            } else {
                format!("{base}?{}", kept.join("&"))
            }
        }
        None => url.to_string(),
    };
    let (client, conn) = tokio_postgres::connect(&driver_url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    tokio::spawn(conn);
    client
}

/// Awaits `fut`, failing the test after [`PATIENCE`] (this suite's, longer
/// than `common`'s: a database is slower to answer than the fixture).
pub async fn within<F: std::future::Future>(fut: F) -> F::Output {
    within_for(PATIENCE, fut).await
}

// ---- a database that goes away ------------------------------------------

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Up,
    /// Connections stay open but nothing gets through: a server or network
    /// that stopped answering.
    Frozen,
    /// Connections drop and new ones are closed at once: a server that
    /// stopped, or its host gone.
    Cut,
}

/// A TCP proxy in front of the database, to take it away from a hub.
pub struct Proxy {
    pub addr: std::net::SocketAddr,
    mode: tokio::sync::watch::Sender<Mode>,
    /// Connections forwarding bytes now: a mode change is in force once
    /// none is left (a connection that has not seen it yet could still pass
    /// a request the test already counts as stopped).
    copying: tokio::sync::watch::Sender<usize>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: std::net::SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let (mode, _) = tokio::sync::watch::channel(Mode::Up);
        let (copying, _) = tokio::sync::watch::channel(0usize);
        let modes = mode.clone();
        let counter = copying.clone();
        let accept = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                conns.spawn(forward(
                    inbound,
                    upstream,
                    modes.subscribe(),
                    counter.clone(),
                ));
                // Reap the finished ones as we go.
                while conns.try_join_next().is_some() {}
            }
        });
        Proxy {
            addr,
            mode,
            copying,
            accept,
        }
    }

    /// Sets `mode` and returns once no connection forwards bytes any more.
    async fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
        let mut copying = self.copying.subscribe();
        let _ = copying.wait_for(|n| *n == 0).await;
    }

    /// The URL that reaches the database through this proxy.
    pub fn url(&self, url: &str) -> String {
        let db = db_addr(url);
        url.replacen(&db.to_string(), &self.addr.to_string(), 1)
    }

    /// The database "stops": connections drop, new ones are closed at once.
    pub async fn cut(&self) {
        self.set(Mode::Cut).await;
    }

    /// The database "hangs": connections stay open, nothing answers.
    pub async fn freeze(&self) {
        self.set(Mode::Frozen).await;
    }

    /// The database is back for new connections; frozen ones stay stuck, as
    /// a half-dead TCP connection would.
    pub fn restore(&self) {
        self.mode.send_replace(Mode::Up);
    }
}

/// One proxied connection, following the proxy's mode.
async fn forward(
    mut inbound: TcpStream,
    upstream: std::net::SocketAddr,
    mut mode: tokio::sync::watch::Receiver<Mode>,
    copying: tokio::sync::watch::Sender<usize>,
) {
    // Counted before the mode is read: a mode change waits for this
    // connection, or this connection sees the change.
    let copy = Copying::start(copying);
    let now = *mode.borrow_and_update();
    match now {
        Mode::Cut => return,
        Mode::Frozen => {
            drop(copy);
            // Hold the socket without a byte until the proxy is cut.
            let _ = mode.wait_for(|m| *m == Mode::Cut).await;
            return;
        }
        Mode::Up => {}
    }
    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
        return;
    };
    let stopped = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => None,
        m = mode.wait_for(|m| *m != Mode::Up) => m.ok().map(|m| *m),
    };
    drop(copy);
    if stopped == Some(Mode::Frozen) {
        // Keep both sockets open, silent, until the proxy is cut.
        let _ = mode.wait_for(|m| *m == Mode::Cut).await;
    }
}

/// One connection counted as forwarding, until dropped.
struct Copying(tokio::sync::watch::Sender<usize>);

impl Copying {
    fn start(copying: tokio::sync::watch::Sender<usize>) -> Copying {
        copying.send_modify(|n| *n += 1);
        Copying(copying)
    }
}

impl Drop for Copying {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.mode.send_replace(Mode::Cut);
        self.accept.abort();
    }
}

/// The database's address from its URL (host must be an IP address).
pub fn db_addr(url: &str) -> std::net::SocketAddr {
    let cfg: tokio_postgres::Config = url.split('?').next().unwrap().parse().unwrap();
    let host = match &cfg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        other => panic!("the test database must be reached over TCP, not {other:?}"),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
        .parse()
        .expect("host is an IP address")
}

// ---- real hubs ------------------------------------------------------------

/// A running `relayhub serve`, killed if the test ends without stopping it.
pub struct Hub {
    child: Option<Child>,
    pub addr: String,
    stderr: TempFile,
    _config: Option<TempFile>,
}

/// `relayhub serve` on port 0 against `core_url` with `journal`; `toml` is
/// given as `--config` when present. Returns once the ready line is out.
pub fn spawn_hub(core_url: &str, journal: &str, budget_ms: u64, toml: Option<&str>) -> Hub {
    let config = toml.map(|t| TempFile::new("toml", t));
    let stderr = TempFile::new("log", "");
    let mut cmd = Command::new(relayhub_bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--core-url", core_url])
        .args(["--journal", journal])
        .args(["--budget-ms", &budget_ms.to_string()]);
    if let Some(c) = &config {
        cmd.arg("--config").arg(&c.0);
    }
    let ready = spawn_listening(&mut cmd, &stderr.0, PATIENCE).unwrap_or_else(|e| {
        panic!(
            "{e}; stderr:\n{}",
            std::fs::read_to_string(&stderr.0).unwrap_or_default()
        )
    });
    Hub {
        child: Some(ready.child),
        addr: ready.addr,
        stderr,
        _config: config,
    }
}

impl Hub {
    /// SIGKILL: the hub dies at once, mid-transfer if one is running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL the hub");
            child.wait().expect("reap the hub");
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr.0).unwrap_or_default()
    }

    /// SIGTERM: the hub begins its drain; returns once its log says so.
    pub async fn drain(&self) {
        let pid = self.child.as_ref().expect("the hub runs").id();
        crate::common::send_signal(pid, "TERM");
        let started = std::time::Instant::now();
        while !self.stderr().contains("draining: listeners closed") {
            assert!(started.elapsed() < PATIENCE, "{}", self.stderr());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn channel(&self) -> Channel {
        within(Channel::connect(&self.addr, PrefixMode::Ascii))
            .await
            .expect("connect to the hub")
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A telegram sent on a new connection; the answer.
pub async fn send(hub: &Hub, telegram: &[u8]) -> Answer {
    let mut ch = hub.channel().await;
    within(ch.exchange(telegram)).await.unwrap_or_else(|e| {
        panic!(
            "no answer from {}: {e}; stderr:\n{}",
            hub.addr,
            hub.stderr()
        )
    })
}

// ---- telegrams ------------------------------------------------------------

/// A fresh GUID with a tag.
pub fn guid(tag: &str) -> String {
    let g = new_guid(tag);
    assert_eq!(g.len(), 32);
    g
}

/// A TRF001 telegram: ACC1 -> ACC2 (own bank) of `amount`.
pub fn transfer(guid: &str, amount: u64) -> Vec<u8> {
    trf(guid, &trf_fields(ACC1, BANK, ACC2, amount, "scale-out"))
}
