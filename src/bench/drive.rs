//! Running a load: tickets, pacing, the two kinds of worker, the answer checks.
//!
//! Workers are plain threads with blocking sockets, in both modes. The hub and
//! the fixture share this machine's cores with the bench, so the two modes must
//! cost the bench about the same; and `std::thread::sleep` wakes within tens of
//! microseconds, where tokio's timer wheel rounds up to the next millisecond,
//! which would add up to 1 ms of the bench's own lateness to every open-loop
//! latency.
//!
//! Pacing: every request is a *ticket* `i` taken from one counter. Closed loop, a
//! worker sends ticket `i` when it takes it. Open loop at rate `r`, ticket `i` is
//! due at `start + i / r`; a worker that is free sleeps until then, and latency
//! is measured from that intended time, so when the system under test stalls,
//! the requests that should have gone out meanwhile show the stall too
//! (coordinated omission corrected).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use serde_json::{Map, Value};

use super::report::{Recorder, Report, ReportHead, Warmup};
use super::spec::{LoadSpec, Stop, Target, Tx};
use crate::client::{Answer, build_telegram, new_guid};
use crate::frame::FrameCodec;
use crate::header::{HEADER_LEN, local_timestamp};
use crate::layout::{Layout, encode_fields};
use crate::outcome::{Code, CodeTable, Outcome, classify_inquiry, classify_transfer};

/// Transferred GUIDs kept for inquiries.
const POOL: usize = 4096;
/// Stack of a worker thread: the bench keeps little on it.
const WORKER_STACK: usize = 256 * 1024;

/// Runs a load on its own threads and returns the report; the async face of
/// [`run_load_blocking`], safe to call from a tokio runtime that also runs the
/// hub or the fixture under test.
pub async fn run_load(spec: LoadSpec) -> Result<Report, String> {
    tokio::task::spawn_blocking(move || run_load_blocking(spec))
        .await
        .map_err(|e| format!("bench coordinator failed: {e}"))?
}

/// Runs a load to its end: idle connections, warm-up, the measured phase.
pub fn run_load_blocking(spec: LoadSpec) -> Result<Report, String> {
    spec.validate()?;
    let shared = Arc::new(Shared::new(spec)?);
    let spec = &shared.spec;

    let idle = open_idle(spec)?;
    if !idle.is_empty() {
        eprintln!(
            "bench: {} idle connections open; holding {} ms before the load",
            idle.len(),
            spec.idle_hold.as_millis()
        );
        std::thread::sleep(spec.idle_hold);
    }

    let warmup = if spec.warmup > 0 {
        let (rec, sent, _) = phase(&shared, Stop::Count(spec.warmup), None, false);
        Warmup {
            sent,
            wrong: rec.wrong_count(),
            errors: rec.error_count(),
        }
    } else {
        Warmup::default()
    };

    let (rec, sent, elapsed) = phase(&shared, spec.stop, spec.rate, spec.progress);
    drop(idle);
    let (mode, target) = match &spec.target {
        Target::Hub { addr } => ("hub", addr.clone()),
        Target::Direct { url } => ("direct", url.clone()),
    };
    Ok(Report::build(
        ReportHead {
            mode,
            target,
            connections: spec.connections,
            rate: spec.rate,
            idle_connections: spec.idle_connections,
        },
        rec,
        sent,
        elapsed,
        warmup,
    ))
}

/// What every worker reads.
struct Shared {
    spec: LoadSpec,
    transfer_layout: Layout,
    inquiry_layout: Layout,
    codes: CodeTable,
    /// GUIDs this run transferred (with a final answer), for INQ001.
    transferred: Mutex<Vec<String>>,
    /// Transfers built so far: each takes its source account by this count,
    /// not by its ticket, so that `--from`'s shares hold among the
    /// transfers whatever `--mix` does with the tickets.
    transfers: std::sync::atomic::AtomicU64,
    /// Direct mode: one agent, its pool shared by the worker threads.
    agent: Option<ureq::Agent>,
}

/// One request about to be sent.
struct Request {
    tx: Tx,
    guid: String,
    fields: Map<String, Value>,
}

impl Shared {
    fn new(spec: LoadSpec) -> Result<Shared, String> {
        let layouts = crate::layout::builtin();
        let layout = |code: &str| {
            layouts
                .get(code)
                .cloned()
                .ok_or_else(|| format!("no built-in layout {code}"))
        };
        Ok(Shared {
            transfer_layout: layout("TRF001")?,
            inquiry_layout: layout("INQ001")?,
            codes: CodeTable::builtin(),
            transferred: Mutex::new(Vec::new()),
            transfers: Default::default(),
            agent: match &spec.target {
                Target::Direct { .. } => Some(direct_agent(spec.connections, spec.answer_timeout)),
                Target::Hub { .. } => None,
            },
            spec,
        })
    }

    /// The request for ticket `i`. An inquiry before any transfer has finished
    /// becomes a transfer: there is nothing to ask about yet.
    fn request(&self, i: u64) -> Request {
        let guid = new_guid(&self.spec.guid_prefix);
        if *self.spec.mix.pick(i) == Tx::Inquiry {
            let pool = self.transferred.lock().unwrap_or_else(|p| p.into_inner());
            if !pool.is_empty() {
                let orig = pool[(i as usize / 7) % pool.len()].clone();
                let mut fields = Map::new();
                fields.insert("orig_guid".into(), orig.into());
                return Request {
                    tx: Tx::Inquiry,
                    guid,
                    fields,
                };
            }
        }
        let n = self
            .transfers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Request {
            tx: Tx::Transfer,
            guid,
            fields: self.spec.transfer.fields(n),
        }
    }

    fn layout(&self, tx: Tx) -> &Layout {
        match tx {
            Tx::Transfer => &self.transfer_layout,
            Tx::Inquiry => &self.inquiry_layout,
        }
    }

    fn remember(&self, guid: String, i: u64) {
        let mut pool = self.transferred.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < POOL {
            pool.push(guid);
        } else {
            pool[i as usize % POOL] = guid;
        }
    }
}

/// The ticket counter of one phase.
struct Phase {
    next: AtomicU64,
    sent: AtomicU64,
    done: AtomicU64,
    stop: Stop,
    rate: Option<f64>,
    start: Instant,
    finished: AtomicBool,
}

impl Phase {
    /// The next ticket and when it is due; `None` once the phase is over.
    fn take(&self) -> Option<(u64, Instant)> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let due = match self.rate {
            Some(r) => self.start + Duration::from_secs_f64(i as f64 / r),
            None => Instant::now(),
        };
        let over = match self.stop {
            Stop::Count(n) => i >= n,
            Stop::Duration(d) => due.duration_since(self.start) >= d,
        };
        if over {
            return None;
        }
        self.sent.fetch_add(1, Ordering::Relaxed);
        Some((i, due))
    }
}

/// Runs one phase on `spec.connections` threads; returns the merged counts,
/// the requests sent and the time from start to the last answer.
fn phase(
    shared: &Arc<Shared>,
    stop: Stop,
    rate: Option<f64>,
    progress: bool,
) -> (Recorder, u64, Duration) {
    let phase = Arc::new(Phase {
        next: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        done: AtomicU64::new(0),
        stop,
        rate,
        // A short lead so every thread is up before the first ticket is due.
        start: Instant::now() + Duration::from_millis(20),
        finished: AtomicBool::new(false),
    });
    let mut workers = Vec::with_capacity(shared.spec.connections);
    for n in 0..shared.spec.connections {
        let (shared, phase) = (shared.clone(), phase.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("bench-{n}"))
            .stack_size(WORKER_STACK)
            .spawn(move || worker(&shared, &phase));
        match spawned {
            Ok(h) => workers.push(h),
            Err(e) => {
                eprintln!("bench: cannot start worker {n}: {e}; going on with {n}");
                break;
            }
        }
    }
    let ticker = progress.then(|| {
        let phase = phase.clone();
        std::thread::spawn(move || show_progress(&phase))
    });
    let mut total = Recorder::default();
    for w in workers {
        match w.join() {
            Ok(rec) => total.merge(rec),
            Err(_) => total.error("bench", "a worker thread panicked".into()),
        }
    }
    let elapsed = Instant::now().saturating_duration_since(phase.start);
    phase.finished.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        let _ = t.join();
    }
    (total, phase.sent.load(Ordering::Relaxed), elapsed)
}

/// A `\r` line on stderr, four times a second.
fn show_progress(phase: &Phase) {
    let mut last = (Instant::now(), 0u64);
    while !phase.finished.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(250));
        let done = phase.done.load(Ordering::Relaxed);
        let now = Instant::now();
        let rate = (done - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
        last = (now, done);
        let of = match phase.stop {
            Stop::Count(n) => format!("{done}/{n}"),
            Stop::Duration(d) => format!(
                "{done} in {:.0}/{:.0} s",
                now.saturating_duration_since(phase.start).as_secs_f64(),
                d.as_secs_f64()
            ),
        };
        eprint!("\r  {of}  {rate:>8.0}/s   ");
        let _ = std::io::stderr().flush();
    }
    eprint!("\r{:60}\r", "");
}

fn worker(shared: &Shared, phase: &Phase) -> Recorder {
    let mut rec = Recorder::default();
    let mut hub: Option<Wire> = None;
    while let Some((i, due)) = phase.take() {
        if phase.rate.is_some() {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let req = shared.request(i);
        let from = if phase.rate.is_some() {
            due
        } else {
            Instant::now()
        };
        match &shared.spec.target {
            Target::Hub { addr } => hub_exchange(shared, addr, &mut hub, &req, i, from, &mut rec),
            Target::Direct { url } => direct_exchange(shared, url, &req, i, from, &mut rec),
        }
        phase.done.fetch_add(1, Ordering::Relaxed);
    }
    rec
}

// ---- through a hub ------------------------------------------------------

/// A blocking connection to the hub: plain TCP, or TLS over it.
enum WireStream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl WireStream {
    /// Connects (within `timeout`) and, with `tls`, completes the handshake.
    fn connect(
        addr: &str,
        tls: Option<&crate::client::TlsConnector>,
        timeout: Duration,
    ) -> std::io::Result<WireStream> {
        let stream = TcpStream::connect_timeout(&resolve(addr)?, timeout)?;
        let Some(tls) = tls else {
            return Ok(WireStream::Plain(stream));
        };
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        let conn = rustls::ClientConnection::new(tls.config(), tls.server_name(addr)?)
            .map_err(std::io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, stream);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock)?;
        }
        Ok(WireStream::Tls(Box::new(tls)))
    }

    fn tcp(&self) -> &TcpStream {
        match self {
            WireStream::Plain(s) => s,
            WireStream::Tls(s) => &s.sock,
        }
    }
}

impl Read for WireStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            WireStream::Plain(s) => s.read(buf),
            WireStream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for WireStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            WireStream::Plain(s) => s.write(buf),
            WireStream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            WireStream::Plain(s) => s.flush(),
            WireStream::Tls(s) => s.flush(),
        }
    }
}

/// A blocking channel connection.
struct Wire {
    stream: WireStream,
    codec: FrameCodec,
    buf: BytesMut,
    out: BytesMut,
}

impl Wire {
    fn connect(addr: &str, spec: &LoadSpec) -> std::io::Result<Wire> {
        let stream = WireStream::connect(addr, spec.tls.as_ref(), spec.answer_timeout)?;
        stream.tcp().set_nodelay(true)?;
        stream.tcp().set_read_timeout(Some(spec.answer_timeout))?;
        Ok(Wire {
            stream,
            codec: FrameCodec::new(spec.prefix, crate::frame::ASCII_PREFIX_MAX),
            buf: BytesMut::with_capacity(512),
            out: BytesMut::with_capacity(256),
        })
    }

    /// Sends one telegram and reads one answer (without its prefix).
    fn exchange(&mut self, telegram: &[u8]) -> std::io::Result<bytes::Bytes> {
        let invalid = |e: crate::frame::FrameError| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
        };
        self.out.clear();
        self.codec
            .encode(telegram, &mut self.out)
            .map_err(invalid)?;
        self.stream.write_all(&self.out)?;
        self.stream.flush()?;
        let mut chunk = [0u8; 1024];
        loop {
            if let Some(t) = self.codec.decode(&mut self.buf).map_err(invalid)? {
                return Ok(t);
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the hub closed the connection without an answer",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn resolve(addr: &str) -> std::io::Result<SocketAddr> {
    addr.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr}: no address"))
    })
}

fn hub_exchange(
    shared: &Shared,
    addr: &str,
    conn: &mut Option<Wire>,
    req: &Request,
    i: u64,
    from: Instant,
    rec: &mut Recorder,
) {
    let tx = req.tx.code();
    let layout = shared.layout(req.tx);
    let telegram = match build_telegram(
        layout,
        &req.guid,
        &shared.spec.channel_id,
        &local_timestamp(),
        &req.fields,
    ) {
        Ok(t) => t,
        Err(e) => return rec.error(tx, format!("cannot build the telegram: {e}")),
    };
    if conn.is_none() {
        match Wire::connect(addr, &shared.spec) {
            Ok(w) => *conn = Some(w),
            Err(e) => {
                // Don't spin on a refused connect for a whole timed run.
                std::thread::sleep(Duration::from_millis(10));
                return rec.error(tx, format!("cannot connect to {addr}: {e}"));
            }
        }
    }
    let Some(wire) = conn.as_mut() else { return };
    let raw = match wire.exchange(&telegram) {
        Ok(raw) => raw,
        Err(e) => {
            // The stream may be out of step now (an answer may still come): start over.
            *conn = None;
            // A read timeout comes back as EAGAIN (WouldBlock) or TimedOut.
            let why = match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                    "no answer within {:?} (--timeout)",
                    shared.spec.answer_timeout
                ),
                _ => e.to_string(),
            };
            return rec.error(tx, why);
        }
    };
    let latency = from.elapsed();
    match check_telegram(&raw, req, layout) {
        Ok(code) => {
            if req.tx == Tx::Transfer && is_final(&code) {
                shared.remember(req.guid.clone(), i);
            }
            rec.answer(tx, &code, latency);
        }
        Err(why) => rec.wrong(tx, why, latency),
    }
}

/// The checks on a hub's answer; `Ok(code)` when it keeps the contract.
fn check_telegram(raw: &[u8], req: &Request, layout: &Layout) -> Result<String, String> {
    let a = Answer::parse(raw)?;
    if a.guid != req.guid {
        return Err(format!(
            "GUID echo {:?}, the request's is {:?}",
            a.guid, req.guid
        ));
    }
    if a.tx_code != req.tx.code() {
        return Err(format!("tx_code echo {:?}", a.tx_code));
    }
    if !is_standard(&a.code) {
        return Err(format!("code {:?} is not a standard code", a.code));
    }
    if a.code == "0000" {
        layout
            .decode_response(&a.body, HEADER_LEN)
            .map_err(|e| format!("0000 body does not decode: {e}"))?;
    } else if !a.body.is_empty() {
        return Err(format!("{} with a {}-byte body", a.code, a.body.len()));
    }
    Ok(a.code)
}

/// 0000, a business code `Bnnn`, or one of the E-codes of section 6.
fn is_standard(code: &str) -> bool {
    let b = code.as_bytes();
    code == "0000"
        || (b.len() == 4 && b[0] == b'B' && b[1..].iter().all(u8::is_ascii_digit))
        || [
            Code::NOT_ROUTED,
            Code::FORMAT,
            Code::CHANNEL,
            Code::TARGET_ERROR,
            Code::UNKNOWN,
            Code::NOT_SENT,
            Code::NO_CAPACITY,
            Code::NEVER_RECEIVED,
            Code::RESEND_REFUSED,
        ]
        .iter()
        .any(|c| c.as_str() == code)
}

/// A transfer with a final answer is one an inquiry can ask about.
fn is_final(code: &str) -> bool {
    code == "0000" || code.starts_with('B')
}

// ---- straight to the core -------------------------------------------------

fn direct_agent(connections: usize, timeout: Duration) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .no_delay(true)
        .max_idle_connections(connections.max(16))
        .max_idle_connections_per_host(connections.max(16))
        // Phase timeouts, not a global one: any timeout that covers name
        // resolution makes ureq resolve on a new thread per request (even for
        // an IP literal), which would bill the baseline for a thread spawn.
        .timeout_connect(Some(timeout))
        .timeout_send_request(Some(timeout))
        .timeout_send_body(Some(timeout))
        .timeout_recv_response(Some(timeout))
        .timeout_recv_body(Some(timeout))
        .build();
    ureq::Agent::new_with_config(config)
}

fn direct_exchange(
    shared: &Shared,
    url: &str,
    req: &Request,
    i: u64,
    from: Instant,
    rec: &mut Recorder,
) {
    let tx = req.tx.code();
    let Some(agent) = &shared.agent else {
        return rec.error(tx, "no HTTP agent".into());
    };
    let base = url.trim_end_matches('/');
    // The same request the hub would send (see core_client), budget header included.
    let sent = match req.tx {
        Tx::Transfer => {
            let mut json = Map::with_capacity(req.fields.len() + 2);
            json.insert("guid".into(), req.guid.clone().into());
            json.insert("channel_id".into(), shared.spec.channel_id.clone().into());
            for (k, v) in &req.fields {
                json.insert(k.clone(), v.clone());
            }
            let body = serde_json::to_vec(&Value::Object(json)).unwrap_or_default();
            agent
                .post(format!("{base}/v1/transfers"))
                .header("Content-Type", "application/json")
                .header("X-GUID", req.guid.as_str())
                .header(crate::core_client::DEADLINE_HEADER, "3000")
                .send(&body[..])
        }
        Tx::Inquiry => {
            let orig = req.fields.get("orig_guid").and_then(Value::as_str);
            agent
                .get(format!("{base}/v1/transfers/{}", orig.unwrap_or("")))
                .header(crate::core_client::DEADLINE_HEADER, "3000")
                .call()
        }
    };
    let answer = sent.and_then(|mut r| {
        let status = r.status().as_u16();
        r.body_mut()
            .with_config()
            .limit(64 * 1024)
            .read_to_vec()
            .map(|body| (status, body))
    });
    let (status, body) = match answer {
        Ok(a) => a,
        Err(e) => return rec.error(tx, e.to_string()),
    };
    let latency = from.elapsed();
    match check_http(shared, req.tx, status, &body) {
        Ok(code) => {
            if req.tx == Tx::Transfer && is_final(&code) {
                shared.remember(req.guid.clone(), i);
            }
            rec.answer(tx, &code, latency);
        }
        Err(why) => rec.wrong(tx, why, latency),
    }
}

/// Reads the core's answer as the hub would, and names the standard code the
/// hub would answer. A 200 the hub could not turn into a 0000 is wrong.
fn check_http(shared: &Shared, tx: Tx, status: u16, body: &[u8]) -> Result<String, String> {
    let outcome = match tx {
        Tx::Transfer => classify_transfer(status, body, &shared.codes),
        Tx::Inquiry => classify_inquiry(status, body, &shared.codes),
    };
    match &outcome {
        Outcome::Processed(answer) => {
            encode_fields(&shared.layout(tx).response, &answer.fields(), HEADER_LEN)
                .map_err(|e| format!("200 answer does not fit the layout: {e}"))?;
            Ok(Code::OK.as_str().to_string())
        }
        Outcome::Unknown(why) if status == 200 => Err(format!("200: {why}")),
        o => Ok(shared.codes.code(o).as_str().to_string()),
    }
}

// ---- idle connections -----------------------------------------------------

/// Opens the idle connections, one after another (a burst of 10,000 connects
/// would only overflow the accept queue and add SYN retries).
/// With TLS, each one completes its handshake first.
fn open_idle(spec: &LoadSpec) -> Result<Vec<WireStream>, String> {
    let Target::Hub { addr } = &spec.target else {
        return Ok(Vec::new());
    };
    resolve(addr).map_err(|e| format!("{addr}: {e}"))?;
    let mut held = Vec::with_capacity(spec.idle_connections);
    for n in 0..spec.idle_connections {
        match WireStream::connect(addr, spec.tls.as_ref(), spec.answer_timeout) {
            Ok(s) => held.push(s),
            Err(e) => {
                return Err(format!(
                    "idle connection {} of {}: {e} (raise `ulimit -n`?)",
                    n + 1,
                    spec.idle_connections
                ));
            }
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--from`'s shares hold among the transfers whatever `--mix` does
    /// with the tickets (before, both were picked by the ticket, so with
    /// TRF001=3,INQ001=1 and A=3,B=1 no transfer came from B; found by a
    /// black-box probe).
    #[test]
    fn the_source_accounts_shares_hold_among_the_transfers() {
        let mut spec = LoadSpec::new(
            Target::Hub {
                addr: "127.0.0.1:1".into(),
            },
            1,
            crate::bench::Stop::Count(400),
        );
        spec.mix = crate::bench::spec::parse_mix("TRF001=3,INQ001=1").unwrap();
        spec.transfer.from =
            crate::bench::spec::parse_weighted("A=3,B=1", |a| Ok(a.to_string())).unwrap();
        let shared = Shared::new(spec).unwrap();
        shared
            .transferred
            .lock()
            .unwrap()
            .push("20261203BENCH000000000000000001".into());
        let mut from: std::collections::HashMap<String, u32> = Default::default();
        for i in 0..400 {
            let r = shared.request(i);
            if r.tx == Tx::Transfer {
                let a = r.fields["from_account"].as_str().unwrap().to_string();
                *from.entry(a).or_default() += 1;
            }
        }
        assert_eq!(from.get("A"), Some(&225), "{from:?}");
        assert_eq!(from.get("B"), Some(&75), "{from:?}");
    }

    #[test]
    fn standard_codes() {
        for ok in ["0000", "B201", "B999", "E901", "E905", "E101"] {
            assert!(is_standard(ok), "{ok}");
        }
        for bad in ["E999", "0001", "b201", "B20", "XXXX", "    "] {
            assert!(!is_standard(bad), "{bad}");
        }
    }
}
