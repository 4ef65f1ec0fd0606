//! Setup for the resilience and lifecycle suites, on top of `tests/common`:
//! hubs started from a whole TOML file (several targets, several endpoints, a
//! channel table), telegrams for any tx code and channel, a refused port, a tiny
//! recording HTTP core that shows which headers the hub sent, and the real hub
//! process driven by signals.
//!
//! Like `common`, nothing here orders events with a sleep: waits are on
//! answers, counters, ready lines and log lines, each bounded by `PATIENCE`.

#![allow(dead_code)] // each suite uses a different part of it

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use relayhub::client::{Answer, Channel, build_telegram};
use relayhub::config::Overrides;
use relayhub::daemon::{Daemon, Source};
use relayhub::frame::PrefixMode;
use relayhub::header::local_timestamp;
use serde_json::{Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::common::{PATIENCE, layout, relayhub_bin, send_signal, spawn_listening, within};

// ---- hubs from a config file ----------------------------------------------

/// A hub started from a TOML file in its own temp dir (kept for reloads).
pub struct FileHub {
    pub daemon: Daemon,
    pub dir: tempfile::TempDir,
}

impl FileHub {
    /// The config file's path; rewrite it and call `reload` to change the hub.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("relayhub.toml")
    }

    pub fn rewrite(&self, toml: &str) {
        std::fs::write(self.config_path(), toml).expect("rewrite config");
    }

    pub async fn channel(&self) -> Channel {
        crate::common::connect(self.daemon.addr, PrefixMode::Ascii).await
    }

    pub async fn raw(&self) -> TcpStream {
        let s = within(TcpStream::connect(self.daemon.addr))
            .await
            .expect("connect to hub");
        s.set_nodelay(true).unwrap();
        s
    }
}

/// Starts an in-process hub from `toml` alone: no `--core-url`, so the file's
/// `[[target]]` tables are used as written. Memory journal, port 0.
pub async fn start_file_hub(toml: &str) -> FileHub {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("relayhub.toml");
    std::fs::write(&path, toml).expect("write config");
    let source = Source {
        file: Some(path),
        overrides: Overrides {
            listen: Some("127.0.0.1:0".into()),
            journal: Some("memory".into()),
            ..Overrides::default()
        },
    };
    let daemon = Daemon::start(source)
        .await
        .unwrap_or_else(|e| panic!("hub does not start: {e}\nconfig:\n{toml}"));
    FileHub { daemon, dir }
}

/// A `[[target]]` table; `extra` holds more `key = value` lines.
pub fn target_toml(name: &str, urls: &[&str], extra: &str) -> String {
    let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    format!(
        "[[target]]\nname = {name:?}\nurls = [{}]\n{extra}\n",
        urls.join(", ")
    )
}

/// A `[[route]]` table; `layout` names the layout when it differs from `tx`.
pub fn route_toml(tx: &str, operation: &str, target: &str, layout: Option<&str>) -> String {
    let mut s =
        format!("[[route]]\ntx_code = {tx:?}\noperation = {operation:?}\ntarget = {target:?}\n");
    if let Some(l) = layout {
        s.push_str(&format!("layout = {l:?}\n"));
    }
    s.push('\n');
    s
}

/// The shipped routes (TRF001, INQ001) to `target`.
pub fn default_routes_toml(target: &str) -> String {
    route_toml("TRF001", "transfer", target, None) + &route_toml("INQ001", "inquiry", target, None)
}

// ---- telegrams ------------------------------------------------------------

/// A telegram built by `layout_tx`'s layout, sent as tx code `tx` by `channel`.
pub fn telegram_as(
    tx: &str,
    layout_tx: &str,
    guid: &str,
    channel: &str,
    fields: &Map<String, Value>,
) -> Vec<u8> {
    let mut t = build_telegram(layout(layout_tx), guid, channel, &local_timestamp(), fields)
        .expect("valid fields for the layout");
    assert_eq!(tx.len(), 6, "tx code {tx:?}");
    t[..6].copy_from_slice(tx.as_bytes());
    t
}

/// An own-bank transfer (ACC1 -> ACC2) as tx `tx` from `channel`.
pub fn transfer_as(tx: &str, guid: &str, channel: &str, amount: u64) -> Vec<u8> {
    use crate::common::{ACC1, ACC2, BANK, MEMO, trf_fields};
    telegram_as(
        tx,
        "TRF001",
        guid,
        channel,
        &trf_fields(ACC1, BANK, ACC2, amount, MEMO),
    )
}

/// An inquiry about `orig` as tx `tx` from `channel`.
pub fn inquiry_as(tx: &str, guid: &str, channel: &str, orig: &str) -> Vec<u8> {
    let fields = serde_json::json!({ "orig_guid": orig });
    telegram_as(tx, "INQ001", guid, channel, fields.as_object().unwrap())
}

/// Asserts a header-only answer with `code` that echoes the request.
pub fn assert_answer(a: &Answer, tx: &str, guid: &str, channel: &str, code: &str) {
    assert_eq!(a.code, code, "code; answer {a:?}");
    assert_eq!(
        (a.tx_code.as_str(), a.guid.as_str(), a.channel_id.as_str()),
        (tx, guid, channel),
        "echo of tx_code, guid, channel_id"
    );
    if code != "0000" {
        assert!(a.body.is_empty(), "a {code} answer has no body: {a:?}");
    } else {
        assert_eq!(a.body.len(), 45, "a 0000 answer carries the 45-byte body");
    }
}

// ---- the network around the hub -------------------------------------------

/// A bound port with no listener: every connect to it is refused, and as
/// long as the socket lives no other test can take the port.
pub struct RefusedPort {
    _socket: TcpSocket,
    pub url: String,
}

pub fn refused_port() -> RefusedPort {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().unwrap())
        .expect("bind without listening");
    let addr = socket.local_addr().unwrap();
    RefusedPort {
        _socket: socket,
        url: format!("http://{addr}"),
    }
}

/// Reads until the peer closes; returns what arrived (a reset counts as a close).
pub async fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    match within(s.read_to_end(&mut rest)).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("reading until the hub closes: {e}"),
    }
    rest
}

// ---- a core that shows the headers it got ------------------------------------

/// One request as the recording core saw it; header names in lower case.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: HashMap<String, String>,
    pub at: std::time::Instant,
}

/// An answer the recording core sends: status, extra headers, JSON body.
pub type Script = dyn Fn(&Seen, usize) -> (u16, Vec<(String, String)>, String) + Send + Sync;

/// A minimal HTTP/1.1 core for what the fixture does not expose (the request
/// headers). Answers each request by `script(request, index)`.
pub struct RecordingCore {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RecordingCore {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RecordingCore {
    pub async fn start(
        script: impl Fn(&Seen, usize) -> (u16, Vec<(String, String)>, String) + Send + Sync + 'static,
    ) -> RecordingCore {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let script: Arc<Script> = Arc::new(script);
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    tokio::spawn(serve_recorded(stream, seen.clone(), script.clone()));
                }
            }
        });
        RecordingCore { url, seen, task }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve_recorded(mut stream: TcpStream, seen: Arc<Mutex<Vec<Seen>>>, script: Arc<Script>) {
    let mut buf = Vec::new();
    loop {
        // The head, however it is split into segments.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 1024];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let mut lines = head.split("\r\n");
        let mut first = lines.next().unwrap_or("").split_whitespace();
        let method = first.next().unwrap_or("").to_string();
        let path = first.next().unwrap_or("").to_string();
        let headers: HashMap<String, String> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let body_len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + body_len {
            let mut chunk = [0u8; 1024];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + body_len);
        let request = Seen {
            method,
            path,
            headers,
            at: std::time::Instant::now(),
        };
        let index = {
            let mut all = seen.lock().unwrap();
            all.push(request.clone());
            all.len() - 1
        };
        let (status, extra, body) = script(&request, index);
        let mut answer = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in extra {
            answer.push_str(&format!("{k}: {v}\r\n"));
        }
        answer.push_str("\r\n");
        answer.push_str(&body);
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// The core's 200 to a transfer (section 11's numbers).
pub const OK_TRANSFER: &str = r#"{"result":"OK","txn_id":"T202611290000001","balance":950000,"processed_at":"20261129132001"}"#;
/// The core's 200 to an inquiry about a processed transfer.
pub const OK_INQUIRY: &str = r#"{"status":"DONE","result":"OK","txn_id":"T202611290000001","balance":950000,"processed_at":"20261129132001"}"#;

// ---- the real hub process ---------------------------------------------------

/// The hub binary, running until SIGTERM; killed if a test ends without it.
pub struct HubProcess {
    child: Option<Child>,
    pub pid: u32,
    pub addr: String,
    /// The whole ready line (it names every listener).
    pub ready_line: String,
    stderr_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl HubProcess {
    /// `relayhub serve --listen 127.0.0.1:0 --journal memory ARGS`; waits for
    /// the ready line. Its stderr goes to a file in its own temp dir.
    pub fn spawn(args: &[&str]) -> HubProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let stderr_path = dir.path().join("stderr.log");
        let mut cmd = Command::new(relayhub_bin());
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--journal", "memory"])
            .args(args)
            .env("RUST_LOG", "info");
        let ready = spawn_listening(&mut cmd, &stderr_path, PATIENCE).unwrap_or_else(|e| {
            let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            panic!("{e}\nstderr:\n{log}");
        });
        HubProcess {
            pid: ready.child.id(),
            child: Some(ready.child),
            addr: ready.addr,
            ready_line: ready.line,
            stderr_path,
            _dir: dir,
        }
    }

    /// Sends a signal (`TERM`, `HUP`) with `kill`.
    pub fn signal(&self, name: &str) {
        send_signal(self.pid, name);
    }

    /// Waits (bounded, off the runtime's workers) for the process to exit.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("process still owned");
        let waited = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => return Ok(status),
                    Ok(None) if started.elapsed() < PATIENCE => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Ok(None) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err("did not exit in time".to_string());
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        })
        .await
        .unwrap();
        waited.unwrap_or_else(|e| panic!("relayhub {}: {e}\nstderr:\n{}", self.pid, self.stderr()))
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// `None` while the process runs; else how it ended ("killed by signal 1").
    pub fn ended(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        Some(describe_exit(status))
    }

    /// Waits (bounded) until the log has more than `already` lines matching
    /// `pred`; returns the first line past those `already`.
    pub async fn wait_log(&mut self, already: usize, pred: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let log = self.stderr();
            if let Some(line) = log.lines().filter(|l| pred(l)).nth(already) {
                return line.to_string();
            }
            if let Some(how) = self.ended() {
                panic!(
                    "relayhub {} {how} before logging the line; stderr:\n{log}",
                    self.pid
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no new matching log line within {PATIENCE:?}; stderr:\n{log}"
            );
            // Polling a file: the wait is on the line, this only paces the reads.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log_count(&self, pred: impl Fn(&str) -> bool) -> usize {
        self.stderr().lines().filter(|l| pred(l)).count()
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

/// "exited with code 0", "killed by signal 15 (no handler installed?)".
pub fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig} (its handler was not installed)"),
        _ => format!("ended with {status:?}"),
    }
}

/// Writes `text` to `dir/name`.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write file");
    p
}
