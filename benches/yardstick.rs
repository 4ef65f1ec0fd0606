//! The yardstick: the floor a thread-per-connection relay with ureq can reach.
//!
//! A bare relay with the hub's wire and conversions and nothing else: one
//! thread per channel connection, reading one telegram at a time and calling
//! the core with ureq *inline* on that thread (one `Agent` per thread, so one
//! warm keep-alive connection each), then writing the answer. No journal, no
//! logs, no budget, no bulkhead: it is not a hub, only the price of the
//! conversions plus ureq plus the sockets, which `benches/compare.sh` sets
//! beside the hub's.
//!
//! ```sh
//! cargo build --release --example yardstick
//! target/release/examples/yardstick --listen 127.0.0.1:0 --core-url http://127.0.0.1:8080
//! ```
//! It prints `listening on ADDR` once it takes connections (ASCII 4-digit
//! length prefix; TRF001 and INQ001 with the built-in layouts).
//!
//! With `POOL=K` in its environment it runs the other candidate the speed
//! work measured instead: K threads share one `epoll` instance holding every
//! connection (one-shot), and a thread that has answered a telegram takes
//! whichever connection is ready next, so under load it blocks once per
//! telegram (for the core) instead of twice. docs/performance.md ("Two
//! context switches or one") has what it saves.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use relayhub::header::{Echo, HEADER_LEN, local_timestamp, parse_header, write_response};
use relayhub::layout::{Layout, builtin, decode_fields, encode_fields};
use relayhub::outcome::{CodeTable, Outcome, classify_inquiry, classify_transfer};

struct Relay {
    core: String,
    trf: Layout,
    inq: Layout,
    codes: CodeTable,
}

fn main() {
    let mut listen = "127.0.0.1:0".to_string();
    let mut core = String::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--listen", Some(v)) => listen = v,
            ("--core-url", Some(v)) => core = v.trim_end_matches('/').to_string(),
            _ => {
                eprintln!("usage: yardstick --listen ADDR --core-url URL");
                std::process::exit(64);
            }
        }
    }
    if core.is_empty() {
        eprintln!("yardstick: --core-url is required");
        std::process::exit(64);
    }
    let mut layouts = builtin();
    let relay = Arc::new(Relay {
        core,
        trf: layouts.remove("TRF001").expect("built-in TRF001"),
        inq: layouts.remove("INQ001").expect("built-in INQ001"),
        codes: CodeTable::builtin(),
    });
    let listener = TcpListener::bind(&listen).unwrap_or_else(|e| {
        eprintln!("yardstick: cannot listen on {listen}: {e}");
        std::process::exit(1)
    });
    println!("listening on {}", listener.local_addr().expect("bound"));
    if let Some(threads) = std::env::var("POOL").ok().and_then(|v| v.parse().ok()) {
        shared_threads(relay, listener, threads);
        return;
    }
    for stream in listener.incoming().flatten() {
        let relay = relay.clone();
        std::thread::spawn(move || {
            let _ = serve(&relay, stream);
        });
    }
}

fn agent() -> ureq::Agent {
    let t = Some(Duration::from_secs(5));
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .no_delay(true)
        .proxy(None)
        // Phase timeouts only: a timeout covering resolution makes ureq
        // resolve on a thread of its own for every request.
        .timeout_connect(t)
        .timeout_send_request(t)
        .timeout_send_body(t)
        .timeout_recv_response(t)
        .timeout_recv_body(t)
        .build()
        .new_agent()
}

fn serve(relay: &Relay, stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let agent = agent();
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = BufWriter::new(stream);
    let mut buffers = Buffers::default();
    loop {
        one_telegram(relay, &agent, &mut reader, &mut writer, &mut buffers)?;
    }
}

/// A telegram's bytes and its answer's, kept by whoever serves it.
#[derive(Default)]
struct Buffers {
    telegram: Vec<u8>,
    answer: Vec<u8>,
}

/// Reads one telegram, calls the core, writes and flushes the answer.
fn one_telegram(
    relay: &Relay,
    agent: &ureq::Agent,
    reader: &mut impl Read,
    writer: &mut BufWriter<impl Write>,
    buffers: &mut Buffers,
) -> std::io::Result<()> {
    let Buffers { telegram, answer } = buffers;
    let mut prefix = [0u8; 4];
    reader.read_exact(&mut prefix)?;
    let len: usize = std::str::from_utf8(&prefix)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad length prefix"))?;
    telegram.resize(len, 0);
    reader.read_exact(telegram)?;
    let (code, body) = relay.exchange(agent, telegram);
    answer.clear();
    write_response(
        &Echo::from_telegram(telegram),
        &local_timestamp(),
        &code,
        &body,
        answer,
    );
    write!(writer, "{:04}", answer.len())?;
    writer.write_all(answer)?;
    writer.flush()
}

/// A connection while no thread serves it: its read buffer (bytes of a
/// pipelined telegram stay in it) and its writer.
struct Parked {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

/// `POOL=K`: K threads serve every connection through one `epoll` instance.
/// Each connection is registered one-shot, so one thread at a time owns it
/// (the event's data is its `Box<Parked>`, taken by the thread the event
/// went to and given back to `epoll` with the re-arm).
fn shared_threads(relay: Arc<Relay>, listener: TcpListener, threads: usize) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call; the descriptor lives as long as the process.
    let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(
        epoll >= 0,
        "epoll_create1: {}",
        std::io::Error::last_os_error()
    );
    let arm = move |op, parked: *mut Parked, fd| {
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
            u64: parked as u64,
        };
        // SAFETY: `event` outlives the call; `fd` is the parked connection's.
        unsafe { libc::epoll_ctl(epoll, op, fd, &mut event) }
    };
    for _ in 0..threads {
        let relay = relay.clone();
        std::thread::spawn(move || {
            let agent = agent();
            let mut buffers = Buffers::default();
            loop {
                let mut event = libc::epoll_event { events: 0, u64: 0 };
                // SAFETY: room for the one event asked for.
                if unsafe { libc::epoll_wait(epoll, &mut event, 1, -1) } != 1 {
                    continue;
                }
                // SAFETY: the event's data is a `Box<Parked>` leaked at
                // registration; one-shot gives it to this thread alone until
                // it is re-armed or freed below.
                let mut parked = unsafe { Box::from_raw(event.u64 as *mut Parked) };
                let fd = parked.reader.get_ref().as_raw_fd();
                let served = loop {
                    let Parked { reader, writer } = &mut *parked;
                    if let Err(e) = one_telegram(&relay, &agent, reader, writer, &mut buffers) {
                        break Err(e);
                    }
                    if reader.buffer().is_empty() {
                        break Ok(());
                    }
                };
                if served.is_ok() {
                    arm(libc::EPOLL_CTL_MOD, Box::into_raw(parked), fd);
                }
                // An error drops the connection; closing its descriptor takes
                // it out of the epoll set.
            }
        });
    }
    for stream in listener.incoming().flatten() {
        let parked = stream
            .set_nodelay(true)
            .and_then(|()| stream.try_clone())
            .map(|clone| Parked {
                reader: BufReader::new(clone),
                writer: BufWriter::new(stream),
            });
        if let Ok(parked) = parked {
            let fd = parked.reader.get_ref().as_raw_fd();
            arm(libc::EPOLL_CTL_ADD, Box::into_raw(Box::new(parked)), fd);
        }
    }
}

impl Relay {
    /// One telegram to the core and back: the answer's code and body.
    fn exchange(&self, agent: &ureq::Agent, t: &[u8]) -> (String, Vec<u8>) {
        let Ok(h) = parse_header(t) else {
            return ("E001".into(), Vec::new());
        };
        let inquiry = h.tx_code == "INQ001";
        let layout = if inquiry { &self.inq } else { &self.trf };
        // A JSON map, as a relay written the plain way builds one.
        let Ok(fields) = decode_fields(&layout.request, &t[HEADER_LEN..], HEADER_LEN) else {
            return ("E003".into(), Vec::new());
        };
        let sent = if inquiry {
            let orig = fields
                .get("orig_guid")
                .and_then(Value::as_str)
                .unwrap_or("");
            agent
                .get(format!("{}/v1/transfers/{orig}", self.core))
                .header("X-Expected-Timeout-Ms", "3000")
                .call()
        } else {
            let mut json = Map::with_capacity(fields.len() + 2);
            json.insert("guid".into(), Value::String(h.guid.to_string()));
            json.insert("channel_id".into(), Value::String(h.channel_id.to_string()));
            json.extend(fields);
            let body = serde_json::to_vec(&Value::Object(json)).unwrap_or_default();
            agent
                .post(format!("{}/v1/transfers", self.core))
                .header("Content-Type", "application/json")
                .header("X-GUID", h.guid)
                .header("X-Expected-Timeout-Ms", "3000")
                .send(&body[..])
        };
        let answer = sent.and_then(|mut r| {
            let status = r.status().as_u16();
            let body = r.body_mut().with_config().limit(64 * 1024).read_to_vec()?;
            Ok((status, body))
        });
        let Ok((status, body)) = answer else {
            return ("E901".into(), Vec::new());
        };
        // A transfer's 200 read as a plain relay reads it: into a `serde_json`
        // map, whose `result` is checked and whose values the layout writes
        // (the hub reads the answer without a map; the floor is the plain way).
        if status == 200 && !inquiry {
            return match serde_json::from_slice::<Value>(&body) {
                Ok(Value::Object(m)) if m.get("result").and_then(Value::as_str) == Some("OK") => {
                    match encode_fields(&layout.response, &m, HEADER_LEN) {
                        Ok(b) => ("0000".into(), b),
                        Err(_) => ("E901".into(), Vec::new()),
                    }
                }
                _ => ("E901".into(), Vec::new()),
            };
        }
        let outcome = if inquiry {
            classify_inquiry(status, &body, &self.codes)
        } else {
            classify_transfer(status, &body, &self.codes)
        };
        match &outcome {
            Outcome::Processed(answer) => {
                match encode_fields(&layout.response, &answer.fields(), HEADER_LEN) {
                    Ok(b) => ("0000".into(), b),
                    Err(_) => ("E901".into(), Vec::new()),
                }
            }
            o => (self.codes.code(o).as_str().to_string(), Vec::new()),
        }
    }
}
