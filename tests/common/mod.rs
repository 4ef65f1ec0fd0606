//! Shared setup for the end-to-end suites: the corebank fixture and a hub, both
//! in-process on `127.0.0.1:0`; telegram builders; raw-wire helpers; and the real
//! binaries for the process-level tests.
//!
//! Nothing here sleeps to order events: waits are on answers, the fixture's
//! counters, or ready lines, each bounded by [`PATIENCE`] so a broken hub fails a
//! test instead of hanging it.

#![allow(dead_code)] // each suite uses a different part of it

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use corebank::{CoreBank, GuidStats, default_seed};
use relayhub::client::{Answer, Channel, build_telegram, new_guid};
use relayhub::config::Overrides;
use relayhub::daemon::{Daemon, Source};
use relayhub::frame::PrefixMode;
use relayhub::header::local_timestamp;
use relayhub::layout::Layout;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Upper bound for any wait; never used to order events.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Seed accounts (fixtures/accounts.json), bank 088.
pub const BANK: &str = "088";
pub const ACC1: &str = "1002003004001"; // 1,000,000
pub const ACC2: &str = "1002003004002"; // 1,000,000
pub const ACC3: &str = "1002003004003"; // 500,000
pub const ACC5: &str = "1002003004005"; // 100,000,000
pub const UNKNOWN_ACC: &str = "1002003009999";
pub const LIMIT: u64 = 5_000_000;
/// The memo of section 11, 9 bytes in EUC-KR.
pub const MEMO: &str = "월세 11월";
pub const CHANNEL: &str = "IBANK";

// ---- hub and fixture ----------------------------------------------------

/// How a test wants its hub.
#[derive(Debug, Clone, Default)]
pub struct HubOpts {
    pub budget_ms: Option<u64>,
    pub connect_timeout_ms: Option<u64>,
    /// A TOML config written to a temp file and given as `--config`.
    pub toml: Option<String>,
    /// Points the default target elsewhere than the fixture.
    pub core_url: Option<String>,
}

impl HubOpts {
    pub fn budget(ms: u64) -> Self {
        HubOpts {
            budget_ms: Some(ms),
            ..HubOpts::default()
        }
    }

    pub fn toml(text: &str) -> Self {
        HubOpts {
            toml: Some(text.to_string()),
            ..HubOpts::default()
        }
    }
}

/// A temp file removed when dropped.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(ext: &str, text: &str) -> TempFile {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let name = format!(
            "relayhub-test-{}-{}-{nanos}.{ext}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, text).expect("write temp file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The fixture with the default seed on a free port.
pub async fn start_core() -> CoreBank {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fixture");
    corebank::start(listener, default_seed()).await
}

/// A hub with the memory journal on a free port, calling `core_url`.
pub async fn start_hub(core_url: &str, opts: &HubOpts) -> (Daemon, Option<TempFile>) {
    let file = opts.toml.as_deref().map(|t| TempFile::new("toml", t));
    let source = Source {
        file: file.as_ref().map(|f| f.0.clone()),
        overrides: Overrides {
            listen: Some("127.0.0.1:0".into()),
            core_url: Some(
                opts.core_url
                    .clone()
                    .unwrap_or_else(|| core_url.to_string()),
            ),
            budget_ms: opts.budget_ms,
            connect_timeout_ms: opts.connect_timeout_ms,
            journal: Some("memory".into()),
            admin_listen: None,
        },
    };
    let hub = Daemon::start(source).await.expect("hub starts");
    (hub, file)
}

/// A fixture and a hub in front of it.
pub struct Setup {
    pub core: CoreBank,
    pub hub: Daemon,
    _config: Option<TempFile>,
}

pub async fn setup() -> Setup {
    setup_with(HubOpts::default()).await
}

pub async fn setup_with(opts: HubOpts) -> Setup {
    let core = start_core().await;
    let (hub, config) = start_hub(&core.url(), &opts).await;
    Setup {
        core,
        hub,
        _config: config,
    }
}

impl Setup {
    pub fn addr(&self) -> String {
        self.hub.addr.to_string()
    }

    /// A new ascii-prefix connection to the hub.
    pub async fn channel(&self) -> Channel {
        connect(self.hub.addr, PrefixMode::Ascii).await
    }

    /// A new raw TCP connection to the hub.
    pub async fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(self.hub.addr)
            .await
            .expect("connect to hub");
        s.set_nodelay(true).unwrap();
        s
    }

    /// The fixture's counters for one GUID (zeros when it never saw it).
    pub fn guid_stats(&self, guid: &str) -> GuidStats {
        self.core
            .stats()
            .by_guid
            .get(guid)
            .copied()
            .unwrap_or_default()
    }

    /// POSTs for `guid`, asserting it is the only GUID the fixture saw POSTed.
    pub fn assert_posts(&self, guid: &str, n: u64) {
        let stats = self.core.stats();
        let got = stats.by_guid.get(guid).map(|g| g.post).unwrap_or(0);
        assert_eq!(got, n, "POSTs for {guid}; stats {stats:?}");
    }

    /// Total calls that reached the fixture.
    pub fn assert_calls(&self, post: u64, get: u64) {
        let stats = self.core.stats();
        assert_eq!(
            (stats.post, stats.get),
            (post, get),
            "calls (post, get) that reached the fixture: {stats:?}"
        );
    }

    /// Waits (bounded) until the fixture has counted `n` POSTs for `guid`.
    pub async fn wait_posts(&self, guid: &str, n: u64) {
        let g = guid.to_string();
        within(
            self.core
                .wait_stats(move |s| s.by_guid.get(&g).map(|x| x.post).unwrap_or(0) >= n),
        )
        .await;
    }

    pub fn balance(&self, acc: &str) -> u64 {
        self.core.balance(acc).expect("seed account")
    }
}

pub async fn connect(addr: SocketAddr, prefix: PrefixMode) -> Channel {
    within(Channel::connect(&addr.to_string(), prefix))
        .await
        .expect("connect to hub")
}

/// Awaits `fut`, failing the test after [`PATIENCE`].
pub async fn within<F: std::future::Future>(fut: F) -> F::Output {
    match tokio::time::timeout(PATIENCE, fut).await {
        Ok(v) => v,
        Err(_) => panic!("no result within {PATIENCE:?}"),
    }
}

/// Sends a telegram and waits (bounded) for its answer.
pub async fn exchange(ch: &mut Channel, telegram: &[u8]) -> Answer {
    within(ch.exchange(telegram))
        .await
        .expect("an answer telegram")
}

// ---- telegrams ------------------------------------------------------------

pub fn layouts() -> &'static std::collections::BTreeMap<String, Layout> {
    static L: OnceLock<std::collections::BTreeMap<String, Layout>> = OnceLock::new();
    L.get_or_init(relayhub::layout::builtin)
}

pub fn layout(tx: &str) -> &'static Layout {
    &layouts()[tx]
}

/// A fresh GUID with a tag, unique per call.
pub fn guid(tag: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let g = new_guid(&format!(
        "{tag}{:03}",
        SEQ.fetch_add(1, Ordering::SeqCst) % 1000
    ));
    assert_eq!(g.len(), 32);
    g
}

pub fn trf_fields(
    from: &str,
    to_bank: &str,
    to: &str,
    amount: u64,
    memo: &str,
) -> Map<String, Value> {
    let v = json!({
        "from_account": from, "to_bank": to_bank, "to_account": to,
        "amount": amount, "memo": memo,
    });
    v.as_object().unwrap().clone()
}

/// A TRF001 telegram (no prefix) with the given fields.
pub fn trf(guid: &str, fields: &Map<String, Value>) -> Vec<u8> {
    build_telegram(layout("TRF001"), guid, CHANNEL, &local_timestamp(), fields)
        .expect("valid TRF001 fields")
}

/// An own-bank transfer ACC1 -> ACC2 of `amount`.
pub fn transfer(guid: &str, amount: u64) -> Vec<u8> {
    trf(guid, &trf_fields(ACC1, BANK, ACC2, amount, MEMO))
}

/// An INQ001 telegram asking about `orig_guid`.
pub fn inquiry(guid: &str, orig_guid: &str) -> Vec<u8> {
    let fields = json!({ "orig_guid": orig_guid });
    build_telegram(
        layout("INQ001"),
        guid,
        CHANNEL,
        &local_timestamp(),
        fields.as_object().unwrap(),
    )
    .expect("valid INQ001 fields")
}

/// Prefixes a telegram with its 4-digit ascii length.
pub fn framed(telegram: &[u8]) -> Vec<u8> {
    let mut v = format!("{:04}", telegram.len()).into_bytes();
    v.extend_from_slice(telegram);
    v
}

/// Reads one ascii-prefixed answer from a raw stream: (prefix bytes, telegram).
pub async fn read_raw_answer(s: &mut TcpStream) -> (Vec<u8>, Vec<u8>) {
    within(async {
        let mut prefix = [0u8; 4];
        s.read_exact(&mut prefix).await.expect("answer prefix");
        let len: usize = std::str::from_utf8(&prefix)
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("answer prefix is not 4 digits: {prefix:?}"));
        let mut t = vec![0u8; len];
        s.read_exact(&mut t).await.expect("answer telegram");
        (prefix.to_vec(), t)
    })
    .await
}

/// Asserts that the hub closes the connection (EOF) with no further bytes.
pub async fn assert_closed(s: &mut TcpStream) {
    let mut rest = Vec::new();
    within(s.read_to_end(&mut rest))
        .await
        .expect("read until close");
    assert!(rest.is_empty(), "bytes after the last answer: {rest:?}");
}

/// Writes `bytes` one at a time, flushing and yielding between them.
pub async fn write_bytewise(s: &mut TcpStream, bytes: &[u8]) {
    for b in bytes {
        s.write_all(std::slice::from_ref(b))
            .await
            .expect("write one byte");
        s.flush().await.unwrap();
        tokio::task::yield_now().await;
    }
}

/// Asserts `sent_at` is a hub timestamp taken between `before` and now.
pub fn assert_hub_time(sent_at: &str, before: &str) {
    let after = local_timestamp();
    assert_eq!(sent_at.len(), 14, "sent_at {sent_at:?}");
    assert!(
        sent_at.bytes().all(|b| b.is_ascii_digit()),
        "sent_at {sent_at:?}"
    );
    assert!(
        before <= sent_at && sent_at <= after.as_str(),
        "sent_at {sent_at} is not the hub's time (between {before} and {after})"
    );
}

/// Asserts an answer is the bare 64-byte header echoing `guid` with `code`.
pub fn assert_header_only(a: &Answer, tx: &str, guid: &str, code: &str) {
    assert_eq!(a.code, code, "code; answer {a:?}");
    assert_eq!(a.tx_code, tx, "tx_code echo");
    assert_eq!(a.guid, guid, "guid echo");
    assert_eq!(a.channel_id, CHANNEL, "channel_id echo");
    assert!(
        a.body.is_empty(),
        "a {code} answer has no body, got {:?}",
        a.body
    );
}

// ---- real processes -------------------------------------------------------

/// The relayhub binary built for these tests.
pub fn relayhub_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_relayhub"))
}

/// The corebank binary, next to relayhub's; built once when missing.
pub fn corebank_bin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = relayhub_bin().parent().expect("bin dir").to_path_buf();
            let bin = dir.join(format!("corebank{}", std::env::consts::EXE_SUFFIX));
            if !bin.exists() {
                let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
                let status = Command::new(cargo)
                    .args(["build", "-p", "corebank", "--bin", "corebank"])
                    .current_dir(env!("CARGO_MANIFEST_DIR"))
                    .status()
                    .expect("run cargo build -p corebank");
                assert!(status.success(), "cargo build -p corebank failed");
            }
            assert!(bin.exists(), "no corebank binary at {}", bin.display());
            bin
        })
        .clone()
}

/// A child process that is killed if the test ends without stopping it.
pub struct Proc {
    child: Option<Child>,
    pub pid: u32,
    pub addr: String,
    pub stderr_path: TempFile,
}

impl Proc {
    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("process still owned");
        let status = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {} failed", self.pid);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(PATIENCE) {
            Ok(Ok(status)) => status,
            other => {
                let _ = Command::new("kill")
                    .args(["-KILL", &self.pid.to_string()])
                    .status();
                panic!(
                    "process {} did not exit within {PATIENCE:?} of SIGTERM: {other:?}",
                    self.pid
                );
            }
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path.0).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `bin args`, reads its `listening on HOST:PORT` line from stdout.
pub fn spawn_ready(bin: &Path, args: &[&str]) -> Proc {
    let stderr_path = TempFile::new("log", "");
    let stderr = std::fs::File::create(&stderr_path.0).unwrap();
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next();
        let _ = tx.send(first);
        // Keep draining so the child never blocks on a full pipe.
        for _ in lines {}
    });
    let line = match rx.recv_timeout(PATIENCE) {
        Ok(Some(Ok(line))) => line,
        other => {
            let _ = child.kill();
            panic!("{} printed no ready line: {other:?}", bin.display());
        }
    };
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("ready line without `listening on HOST:PORT`: {line:?}"))
        .to_string();
    assert!(!addr.ends_with(":0"), "ready line shows port 0: {line:?}");
    Proc {
        pid: child.id(),
        child: Some(child),
        addr,
        stderr_path,
    }
}
