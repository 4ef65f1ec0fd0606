//! A TCP proxy in front of the core, switchable at run time: it forwards, or
//! refuses connects, or drops new connections, and it can hold the request
//! bytes of a POST for a while before passing them on: the network (a
//! balancer, a proxy, the kernel's buffers of a killed hub) delivering a
//! request late. Bytes it has read are delivered even after the hub's side of
//! the connection is gone. It counts the whole `POST /v1/transfers` requests it
//! passed on, per GUID.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::PATIENCE;

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

/// Which POSTs the proxy holds, and how long: `percent` of them (by its own
/// dice, seeded with `seed`), each for a time drawn from `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    pub percent: u64,
    pub min: Duration,
    pub max: Duration,
    pub seed: u64,
}

impl Hold {
    /// Every POST, each for `d`.
    pub fn every(d: Duration) -> Hold {
        Hold {
            percent: 100,
            min: d,
            max: d,
            seed: 1,
        }
    }
}

/// A TCP proxy on `127.0.0.1` in front of `upstream`; it runs until the test
/// ends.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    /// The mode the accept loop acts on now (it follows `mode`).
    applied: watch::Receiver<ProxyMode>,
    shared: Arc<Shared>,
}

/// What the connections share with the proxy's handle.
struct Shared {
    upstream: SocketAddr,
    hold: Mutex<Option<Hold>>,
    /// Rolls of the hold dice so far.
    rolls: AtomicU64,
    /// Connections accepted and closed in `CloseNew` mode.
    dropped: AtomicU64,
    /// Idle connections closed while the mode is `Refuse` or `CloseNew`.
    reaped: AtomicU64,
    /// POSTs held so far, held right now, and the most held at once.
    held: AtomicU64,
    holding: AtomicU64,
    peak_holding: AtomicU64,
    /// Whole `POST /v1/transfers` requests (head and every body byte) passed
    /// on to the core, by `X-GUID`.
    posts: Mutex<HashMap<String, u64>>,
    /// How long each held POST of a GUID was held.
    holds: Mutex<HashMap<String, Vec<Duration>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection counts as idle after this long without a byte either way.
const IDLE: Duration = Duration::from_millis(20);

/// Longest wait, once the hub's side is gone and everything it wrote was
/// delivered, for the core to start answering the last request.
const LINGER: Duration = Duration::from_secs(30);

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let (mode, rx) = watch::channel(ProxyMode::Forward);
        let (applied_tx, applied) = watch::channel(ProxyMode::Forward);
        let shared = Arc::new(Shared {
            upstream,
            hold: Mutex::new(None),
            rolls: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            reaped: AtomicU64::new(0),
            held: AtomicU64::new(0),
            holding: AtomicU64::new(0),
            peak_holding: AtomicU64::new(0),
            posts: Mutex::new(HashMap::new()),
            holds: Mutex::new(HashMap::new()),
        });
        tokio::spawn(accept_loop(listener, addr, rx, applied_tx, shared.clone()));
        Proxy {
            addr,
            mode,
            applied,
            shared,
        }
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

    /// Waits (bounded) until the accept loop acts on the mode last set: after
    /// `set_mode(Refuse)`, a connect is refused from then on.
    pub async fn mode_applied(&self) {
        let want = self.mode();
        let mut applied = self.applied.clone();
        tokio::time::timeout(PATIENCE, applied.wait_for(|m| *m == want))
            .await
            .expect("the proxy's accept loop applies its mode")
            .expect("the proxy's accept loop is running");
    }

    /// From now on, a chunk of request bytes that starts a POST is held as
    /// `hold` says (None: passed on at once). Bytes behind a held chunk on the
    /// same connection wait for it.
    pub fn set_hold(&self, hold: Option<Hold>) {
        *lock(&self.shared.hold) = hold;
    }

    /// Every POST held `hold` from now on (None: none).
    pub fn hold_posts(&self, hold: Option<Duration>) {
        self.set_hold(hold.map(Hold::every));
    }

    /// Whole transfer requests passed on for `guid`. The fixture's own count
    /// also has requests cut short (a hub killed between a request's head and
    /// its body): the core reads those as malformed and records nothing.
    pub fn whole_posts(&self, guid: &str) -> u64 {
        lock(&self.shared.posts).get(guid).copied().unwrap_or(0)
    }

    /// How long each held POST of `guid` was held.
    pub fn holds_of(&self, guid: &str) -> Vec<Duration> {
        lock(&self.shared.holds)
            .get(guid)
            .cloned()
            .unwrap_or_default()
    }

    /// POSTs held so far.
    pub fn held(&self) -> u64 {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// POSTs held right now (not yet passed on).
    pub fn holding(&self) -> u64 {
        self.shared.holding.load(Ordering::SeqCst)
    }

    /// The most POSTs held at once so far.
    pub fn peak_holding(&self) -> u64 {
        self.shared.peak_holding.load(Ordering::SeqCst)
    }

    /// Connections accepted and closed in `CloseNew` mode.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Idle connections closed on entering `Refuse` or `CloseNew`.
    pub fn reaped(&self) -> u64 {
        self.shared.reaped.load(Ordering::Relaxed)
    }
}

impl Shared {
    /// How long to hold `chunk` (a read from the hub): only a chunk that
    /// starts a POST, and only as the dice say.
    fn roll_hold(&self, chunk: &[u8]) -> Option<Duration> {
        if !chunk.starts_with(b"POST ") {
            return None;
        }
        let hold = (*lock(&self.hold))?;
        let roll = splitmix(hold.seed ^ self.rolls.fetch_add(1, Ordering::SeqCst));
        if roll % 100 >= hold.percent {
            return None;
        }
        let (lo, hi) = (hold.min.as_millis() as u64, hold.max.as_millis() as u64);
        let d = Duration::from_millis(lo + (roll >> 8) % (hi.saturating_sub(lo) + 1));
        self.held.fetch_add(1, Ordering::SeqCst);
        let guid = header_value(chunk, "x-guid").unwrap_or_else(|| "?".into());
        lock(&self.holds).entry(guid).or_default().push(d);
        Some(d)
    }
}

/// splitmix64: the proxy's dice, without a crate.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The value of header `name` in an HTTP head (or the start of one).
fn header_value(head: &[u8], name: &str) -> Option<String> {
    String::from_utf8_lossy(head)
        .split("\r\n")
        .skip(1)
        .find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
}

async fn accept_loop(
    mut listener: TcpListener,
    addr: SocketAddr,
    mut mode: watch::Receiver<ProxyMode>,
    applied: watch::Sender<ProxyMode>,
    shared: Arc<Shared>,
) {
    loop {
        let current = *mode.borrow_and_update();
        if current == ProxyMode::Refuse {
            drop(listener);
            applied.send_replace(current);
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
        applied.send_replace(current);
        tokio::select! {
            changed = mode.changed() => if changed.is_err() { return },
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                if current == ProxyMode::CloseNew {
                    shared.dropped.fetch_add(1, Ordering::Relaxed);
                    drop(client);
                    continue;
                }
                tokio::spawn(pipe(client, mode.clone(), shared.clone()));
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

/// A chunk of request bytes, and how long to hold it.
type Chunk = (Vec<u8>, Option<Duration>);

/// Copies bytes both ways until either side ends, or the mode turns to a
/// faulty one while the connection is idle. Request bytes go through a queue
/// to a writer of their own: a held chunk delays the bytes behind it, not the
/// reading of them, so everything the hub wrote is delivered, held or not, even
/// once its side of the connection is closed.
async fn pipe(mut client: TcpStream, mut mode: watch::Receiver<ProxyMode>, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let Ok(server) = TcpStream::connect(shared.upstream).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (mut from_core, to_core) = server.into_split();
    let (queue, chunks) = mpsc::unbounded_channel::<Chunk>();
    let writer = tokio::spawn(deliver(to_core, chunks, shared.clone()));
    let mut a = vec![0u8; 16 * 1024];
    let mut b = vec![0u8; 16 * 1024];
    let mut last = Instant::now();
    // When the core last sent a byte (None: not yet); `core_open` until it closes.
    let mut last_answer: Option<Instant> = None;
    let mut core_open = true;
    loop {
        let idle_check = tokio::time::sleep_until((last + IDLE).into());
        tokio::select! {
            r = client.read(&mut a) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let hold = shared.roll_hold(&a[..n]);
                    if queue.send((a[..n].to_vec(), hold)).is_err() { break }
                    last = Instant::now();
                }
            },
            r = from_core.read(&mut b) => match r {
                Ok(0) | Err(_) => {
                    core_open = false;
                    break;
                }
                Ok(n) => {
                    last_answer = Some(Instant::now());
                    if client.write_all(&b[..n]).await.is_err() { break }
                    last = Instant::now();
                }
            },
            _ = idle_check, if *mode.borrow() != ProxyMode::Forward => {
                shared.reaped.fetch_add(1, Ordering::Relaxed);
                break;
            }
            changed = mode.changed() => if changed.is_err() { break },
        }
    }
    // The hub's side closes now; what it wrote goes on to the core.
    drop(client);
    drop(queue);
    let Ok((to_core, last_write)) = writer.await else {
        return;
    };
    // A request delivered after the core's last answer is still owed one: keep
    // the connection (a close could stop the core before it took the request
    // in) until the core starts answering or closes. Its answer has nowhere to go.
    let owed = last_write.is_some_and(|w| last_answer.is_none_or(|a| w > a));
    if core_open && owed {
        let _ = tokio::time::timeout(LINGER, from_core.read(&mut b)).await;
    }
    drop(to_core);
}

/// Writes the queued request bytes to the core, each held chunk after its
/// hold, and counts the whole transfer requests that went by. Returns the
/// core's side (still open) and when the last byte went to it.
async fn deliver(
    mut to_core: OwnedWriteHalf,
    mut chunks: mpsc::UnboundedReceiver<Chunk>,
    shared: Arc<Shared>,
) -> (OwnedWriteHalf, Option<Instant>) {
    let mut requests = RequestScanner::default();
    let mut last_write = None;
    while let Some((bytes, hold)) = chunks.recv().await {
        if let Some(d) = hold {
            // The network holding the request.
            let now = shared.holding.fetch_add(1, Ordering::SeqCst) + 1;
            shared.peak_holding.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(d).await;
            shared.holding.fetch_sub(1, Ordering::SeqCst);
        }
        if to_core.write_all(&bytes).await.is_err() {
            break;
        }
        last_write = Some(Instant::now());
        for guid in requests.feed(&bytes) {
            *lock(&shared.posts).entry(guid).or_default() += 1;
        }
    }
    (to_core, last_write)
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
            let transfer = self.head.starts_with(b"POST /v1/transfers ");
            let guid = header_value(&self.head, "x-guid").filter(|_| transfer);
            let len = header_value(&self.head, "content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0usize);
            self.head.clear();
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
