//! What the fault matrix and the chaos run share on top of `tests/common`: how to
//! start a real `relayhub serve` on a SQLite journal, so that a test can SIGKILL
//! it and start it again on the same file; a TCP proxy in front of the fixture that can refuse
//! or drop connections on command; and a snapshot of the fixture's ledger.
//!
//! Declare it beside `mod common;` at the test binary's root: it uses that
//! module. Nothing here orders events with a sleep: waits are on ready lines,
//! process exits, answers and the fixture's counters, each bounded.

#![allow(dead_code)] // each suite uses a different part of it

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corebank::CoreBank;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::common::{PATIENCE, Proc, TempDir, relayhub_bin, try_start};

/// The seed accounts of `fixtures/accounts.json`, all of bank 088.
pub const ACCOUNTS: [&str; 6] = [
    "1002003004001",
    "1002003004002",
    "1002003004003",
    "1002003004004",
    "1002003004005",
    "1002003004006",
];

// ---- the ledger -----------------------------------------------------------

/// Every seed account's balance and the total, at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    pub balances: BTreeMap<&'static str, u64>,
    pub total: u64,
}

impl Ledger {
    pub fn of(core: &CoreBank) -> Ledger {
        let balances = ACCOUNTS
            .iter()
            .map(|&a| (a, core.balance(a).expect("seed account")))
            .collect();
        Ledger {
            balances,
            total: core.total_money(),
        }
    }

    /// Asserts the ledger now is `self` with `moves` (from, to, amount) applied
    /// and that no money was created or lost.
    pub fn assert_now(&self, core: &CoreBank, moves: &[(&str, &str, u64)]) {
        let mut want = self.balances.clone();
        for &(from, to, amount) in moves {
            let f = want.get_mut(from).expect("seed account");
            *f = f.checked_sub(amount).expect("expected debit fits");
            *want.get_mut(to).expect("seed account") += amount;
        }
        let now = Ledger::of(core);
        assert_eq!(now.balances, want, "balances (expected moves {moves:?})");
        assert_eq!(now.total, self.total, "total money is conserved");
    }
}

// ---- the real hub process -------------------------------------------------

/// How to start `relayhub serve`; kept so it can be started again the same way.
#[derive(Debug, Clone)]
pub struct HubCommand {
    pub core_url: String,
    pub journal: PathBuf,
    /// A TOML config given as `--config`.
    pub config: PathBuf,
}

impl HubCommand {
    /// Writes `toml` next to the journal and returns the command.
    pub fn new(dir: &TempDir, core_url: &str, toml: &str) -> HubCommand {
        let config = dir.join("relayhub.toml");
        std::fs::write(&config, toml).expect("write hub config");
        HubCommand {
            core_url: core_url.to_string(),
            journal: dir.join("journal.db"),
            config,
        }
    }

    /// Starts the hub on `listen` (`127.0.0.1:0` for any port) and waits for its
    /// ready line. `Err` carries the hub's log when it did not come up.
    pub fn start(&self, listen: &str) -> Result<Proc, String> {
        let mut cmd = Command::new(relayhub_bin());
        cmd.args(["serve", "--listen", listen, "--core-url", &self.core_url])
            .arg("--journal")
            .arg(&self.journal)
            .arg("--config")
            .arg(&self.config);
        try_start(&mut cmd)
    }
}

// ---- a proxy in front of the core -----------------------------------------

/// What the proxy does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forwards every byte both ways.
    Forward,
    /// No listener: connects are refused (nothing can be sent). Idle
    /// connections are closed too, so a pooled one cannot dodge the fault.
    Refuse,
    /// Accepts and closes at once without reading: the hub may have written
    /// its request, and nothing reaches the core. Idle connections are closed.
    CloseNew,
}

/// A TCP proxy on `127.0.0.1` in front of `upstream`, switchable at run time.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    /// Connections accepted and closed in `CloseNew` mode.
    pub dropped: Arc<AtomicU64>,
    /// Idle connections closed on entering `Refuse` or `CloseNew`.
    pub reaped: Arc<AtomicU64>,
    /// Whole `POST /v1/transfers` requests (head and every body byte) passed
    /// on to the core, by `X-GUID`.
    posts: Arc<Mutex<HashMap<String, u64>>>,
}

/// A connection counts as idle after this long without a byte either way.
const IDLE: Duration = Duration::from_millis(20);

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let (mode, rx) = watch::channel(ProxyMode::Forward);
        let dropped = Arc::new(AtomicU64::new(0));
        let reaped = Arc::new(AtomicU64::new(0));
        let posts = Arc::new(Mutex::new(HashMap::new()));
        tokio::spawn(accept_loop(
            listener,
            addr,
            upstream,
            rx,
            Counters {
                dropped: dropped.clone(),
                reaped: reaped.clone(),
                posts: posts.clone(),
            },
        ));
        Proxy {
            addr,
            mode,
            dropped,
            reaped,
            posts,
        }
    }

    /// Whole transfer requests passed on for `guid`. The fixture's own count
    /// also has requests cut short (a hub killed between a request's head and
    /// its body): the core reads those as malformed and records nothing.
    pub fn whole_posts(&self, guid: &str) -> u64 {
        self.posts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(guid)
            .copied()
            .unwrap_or(0)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }
}

#[derive(Clone)]
struct Counters {
    dropped: Arc<AtomicU64>,
    reaped: Arc<AtomicU64>,
    posts: Arc<Mutex<HashMap<String, u64>>>,
}

async fn accept_loop(
    mut listener: TcpListener,
    addr: SocketAddr,
    upstream: SocketAddr,
    mut mode: watch::Receiver<ProxyMode>,
    counters: Counters,
) {
    loop {
        let current = *mode.borrow_and_update();
        if current == ProxyMode::Refuse {
            drop(listener);
            // Wait for the mode to change (or the proxy to go away).
            loop {
                if mode.changed().await.is_err() {
                    return;
                }
                if *mode.borrow_and_update() != ProxyMode::Refuse {
                    break;
                }
            }
            listener = rebind(addr).await;
            continue;
        }
        tokio::select! {
            changed = mode.changed() => if changed.is_err() { return },
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                if current == ProxyMode::CloseNew {
                    counters.dropped.fetch_add(1, Ordering::Relaxed);
                    drop(client);
                    continue;
                }
                tokio::spawn(pipe(client, upstream, mode.clone(), counters.clone()));
            }
        }
    }
}

/// Binds the proxy's address again after a refusal window. The port is ours
/// (nothing else binds a port another socket just released on loopback in a
/// test); a bind error is retried briefly and then fails the test.
async fn rebind(addr: SocketAddr) -> TcpListener {
    let started = Instant::now();
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) if started.elapsed() < PATIENCE => {
                // No event tells when the port is free again: poll with a bound.
                let _ = e;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("proxy cannot bind {addr} again: {e}"),
        }
    }
}

/// Copies bytes both ways; closes both sides when either ends, or when the mode
/// turns to a faulty one while the connection is idle.
async fn pipe(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<ProxyMode>,
    counters: Counters,
) {
    let mut requests = RequestScanner::default();
    let _ = client.set_nodelay(true);
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let mut a = vec![0u8; 16 * 1024];
    let mut b = vec![0u8; 16 * 1024];
    let mut last = Instant::now();
    loop {
        let idle_check = tokio::time::sleep_until((last + IDLE).into());
        tokio::select! {
            r = client.read(&mut a) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if server.write_all(&a[..n]).await.is_err() { break }
                    last = Instant::now();
                    for guid in requests.feed(&a[..n]) {
                        *counters.posts.lock().unwrap_or_else(|p| p.into_inner()).entry(guid).or_default() += 1;
                    }
                }
            },
            r = server.read(&mut b) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if client.write_all(&b[..n]).await.is_err() { break }
                    last = Instant::now();
                }
            },
            _ = idle_check, if *mode.borrow() != ProxyMode::Forward => {
                counters.reaped.fetch_add(1, Ordering::Relaxed);
                break;
            }
            changed = mode.changed() => if changed.is_err() { break },
        }
    }
    let _ = client.shutdown().await;
    let _ = server.shutdown().await;
}

/// Follows the HTTP/1.1 requests on one connection and reports each
/// `POST /v1/transfers` once its last body byte has gone by (the hub sends a
/// `Content-Length`; chunked bodies are not used by it).
#[derive(Default)]
struct RequestScanner {
    head: Vec<u8>,
    /// Body bytes still to come, and the GUID when the request is a transfer.
    body: Option<(usize, Option<String>)>,
}

impl RequestScanner {
    fn feed(&mut self, mut bytes: &[u8]) -> Vec<String> {
        let mut done = Vec::new();
        while !bytes.is_empty() {
            if let Some((left, guid)) = &mut self.body {
                let n = (*left).min(bytes.len());
                *left -= n;
                bytes = &bytes[n..];
                if *left == 0 {
                    if let Some(g) = guid.take() {
                        done.push(g);
                    }
                    self.body = None;
                }
                continue;
            }
            self.head.extend_from_slice(bytes);
            bytes = &[];
            let Some(end) = self.head.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let rest = self.head.split_off(end + 4);
            let head = String::from_utf8_lossy(&self.head).to_string();
            self.head.clear();
            let mut lines = head.split("\r\n");
            let transfer = lines
                .next()
                .is_some_and(|l| l.starts_with("POST /v1/transfers "));
            let mut guid = None;
            let mut len = 0usize;
            for line in lines {
                let Some((name, value)) = line.split_once(':') else {
                    continue;
                };
                match name.trim().to_ascii_lowercase().as_str() {
                    "x-guid" => guid = Some(value.trim().to_string()),
                    "content-length" => len = value.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
            let guid = guid.filter(|_| transfer);
            if len == 0 {
                done.extend(guid);
            } else {
                self.body = Some((len, guid));
            }
            // Whatever followed the head is body (or the next request).
            done.extend(self.feed(&rest));
        }
        done
    }
}
