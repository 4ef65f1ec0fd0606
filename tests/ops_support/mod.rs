//! What the operations suites share: `relayhub serve` as a real process with
//! its admin endpoints, plain HTTP GETs, and a reader for the Prometheus text
//! format.
//!
//! The hub prints `relayhub listening on HOST:PORT` and then
//! `admin endpoints on HOST:PORT` on stdout; [`Hub::spawn`] waits for both.
//! Waits are bounded by [`PATIENCE`]; nothing sleeps to order events.
//!
//! Declare it beside `mod common;` at the test binary's root: it uses that module.

#![allow(dead_code)] // each suite uses a different part of it

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{after, memory_hub_args, relayhub_bin, send_signal, wait_exit_within};

/// Upper bound for any wait; never used to order events.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// The repository root (where `config/` and `docs/` live).
pub fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// What a test does with the hub's stderr.
pub enum Stderr {
    /// A thread reads it into a buffer and a channel of lines.
    Read,
    /// A pipe kept open and never read: a stalled log reader.
    Stalled,
}

/// A `relayhub serve` process, killed if the test ends without stopping it.
pub struct Hub {
    child: Option<Child>,
    pub addr: String,
    pub admin: String,
    /// Everything written to stderr so far (read by a thread).
    stderr: Arc<Mutex<String>>,
    /// Stderr line by line; `None` when stderr is left unread.
    stderr_lines: Option<mpsc::Receiver<String>>,
    _stalled: Option<ChildStderr>,
}

impl Hub {
    /// Starts `relayhub serve ARGS --admin-listen 127.0.0.1:0` and waits for
    /// its two ready lines.
    pub fn spawn(args: &[&str]) -> Hub {
        let mut hub = Hub::start(args);
        hub.wait_ready();
        hub
    }

    /// From async code (the wait for the ready lines runs off the runtime's
    /// workers): `relayhub serve --listen 127.0.0.1:0 --core-url CORE_URL
    /// --journal memory EXTRA`.
    pub async fn for_core(core_url: &str, extra: &[&str]) -> Hub {
        let args = memory_hub_args(core_url, extra);
        tokio::task::spawn_blocking(move || {
            Hub::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .await
        .expect("hub start")
    }

    /// Starts the process without waiting for anything.
    pub fn start(args: &[&str]) -> Hub {
        Hub::start_with(Command::new(relayhub_bin()), args, Stderr::Read)
    }

    /// Starts `relayhub serve ARGS --admin-listen 127.0.0.1:0` from `cmd` (its
    /// environment already set), doing `stderr` with its stderr, and waits for
    /// its two ready lines.
    pub fn spawn_with(cmd: Command, args: &[&str], stderr: Stderr) -> Hub {
        let mut hub = Hub::start_with(cmd, args, stderr);
        hub.wait_ready();
        hub
    }

    fn start_with(mut cmd: Command, args: &[&str], stderr: Stderr) -> Hub {
        let mut child = cmd
            .arg("serve")
            .args(args)
            .args(["--admin-listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn relayhub serve");
        let log = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("piped stderr");
        let (stderr_lines, stalled) = match stderr {
            Stderr::Read => {
                let (tx, rx) = mpsc::channel();
                let all = log.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                        let mut all = all.lock().unwrap();
                        all.push_str(&line);
                        all.push('\n');
                        let _ = tx.send(line);
                    }
                });
                (Some(rx), None)
            }
            Stderr::Stalled => (None, Some(pipe)),
        };
        Hub {
            child: Some(child),
            addr: String::new(),
            admin: String::new(),
            stderr: log,
            stderr_lines,
            _stalled: stalled,
        }
    }

    /// Reads the two stdout lines: the hub's, then the admin endpoints'.
    pub fn wait_ready(&mut self) {
        let stdout = self
            .child
            .as_mut()
            .and_then(|c| c.stdout.take())
            .expect("stdout not read yet");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Keep draining so the child never blocks on a full pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let next = || match rx.recv_timeout(PATIENCE) {
            Ok(line) => line,
            Err(e) => panic!("no ready line ({e}); stderr:\n{}", self.stderr()),
        };
        let first = next();
        let second = next();
        self.addr = after(&first, "relayhub listening on ")
            .unwrap_or_else(|| panic!("first stdout line is not the hub's: {first:?}"));
        self.admin = after(&second, "admin endpoints on ")
            .unwrap_or_else(|| panic!("second stdout line is not the admin's: {second:?}"));
        assert!(!self.addr.ends_with(":0") && !self.admin.ends_with(":0"));
    }

    /// The next stderr line that contains `needle` (bounded wait).
    pub fn stderr_line_with(&self, needle: &str) -> String {
        let until = Instant::now() + PATIENCE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let lines = self.stderr_lines.as_ref().expect("stderr is read");
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("no stderr line with {needle:?}; stderr:\n{}", self.stderr()),
            }
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends a signal by name (`TERM`, `HUP`).
    pub fn signal(&self, name: &str) {
        send_signal(self.pid(), name);
    }

    /// SIGTERM, then the exit status (bounded wait); stderr is complete after it.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        let pid = self.pid();
        let child = self.child.take().expect("running");
        match wait_exit_within(child, PATIENCE) {
            Ok(status) => {
                // Let the stderr reader catch up with the last lines.
                let _ = self.stderr_line_with_eof();
                status
            }
            Err(e) => {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                panic!(
                    "relayhub did not exit within {PATIENCE:?} of SIGTERM: {e}; stderr:\n{}",
                    self.stderr()
                );
            }
        }
    }

    /// Drains stderr lines until the pipe closes (the reader thread ends).
    fn stderr_line_with_eof(&self) -> Option<()> {
        let lines = self.stderr_lines.as_ref()?;
        let until = Instant::now() + PATIENCE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return Some(()),
                Err(mpsc::RecvTimeoutError::Timeout) => return None,
            }
        }
    }

    /// `GET http://ADMIN{path}`: status and body.
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(&format!("http://{}{path}", self.admin))
    }

    /// One scrape of `/metrics`, parsed.
    pub fn scrape(&self) -> Metrics {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200, "/metrics status; body:\n{text}");
        Metrics::parse(&text)
    }

    /// Scrapes until `pred` holds for a scrape (bounded by [`PATIENCE`]);
    /// returns that scrape. For async tests: the GETs run off the runtime.
    pub async fn scrape_until(&self, what: &str, pred: impl Fn(&Metrics) -> bool) -> Metrics {
        let until = Instant::now() + PATIENCE;
        loop {
            let admin = self.admin.clone();
            let m = tokio::task::spawn_blocking(move || {
                let (status, text) = http_get(&format!("http://{admin}/metrics"));
                assert_eq!(status, 200, "/metrics status; body:\n{text}");
                Metrics::parse(&text)
            })
            .await
            .unwrap();
            if pred(&m) {
                return m;
            }
            assert!(
                Instant::now() < until,
                "{what} not seen within {PATIENCE:?}; last scrape:\n{}",
                m.text
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A channel connection to the hub (ascii prefixes), bounded.
    pub async fn channel(&self) -> relayhub::client::Channel {
        crate::common::within(relayhub::client::Channel::connect(
            &self.addr,
            relayhub::frame::PrefixMode::Ascii,
        ))
        .await
        .expect("connect to the hub")
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A GET with a bounded wait; any status is an answer.
pub fn http_get(url: &str) -> (u16, String) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(PATIENCE))
        .build()
        .new_agent();
    let mut resp = agent
        .get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    (status, body)
}

/// One sample line of the Prometheus text format.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed scrape: samples, and the `# HELP` / `# TYPE` lines by metric name.
#[derive(Debug, Default)]
pub struct Metrics {
    pub text: String,
    pub samples: Vec<Sample>,
    pub help: BTreeMap<String, String>,
    pub types: BTreeMap<String, String>,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut m = Metrics {
            text: text.to_string(),
            ..Metrics::default()
        };
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                m.help.insert(name.into(), help.into());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest.split_once(' ').unwrap_or((rest, ""));
                m.types.insert(name.into(), ty.into());
            } else if !line.starts_with('#') {
                m.samples.push(parse_sample(line));
            }
        }
        m
    }

    /// The value of the one sample named `name` whose labels include `labels`;
    /// `None` when there is no such sample.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert!(
            found.len() <= 1,
            "more than one sample {name} {labels:?}: {found:?}"
        );
        found.first().map(|s| s.value)
    }

    /// Like [`Metrics::value`], but the sample must exist.
    pub fn must(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels)
            .unwrap_or_else(|| panic!("no sample {name} {labels:?} in the scrape:\n{}", self.text))
    }
}

fn parse_sample(line: &str) -> Sample {
    let (head, value) = line
        .rsplit_once(' ')
        .unwrap_or_else(|| panic!("sample line without a value: {line:?}"));
    let value: f64 = value
        .parse()
        .unwrap_or_else(|_| panic!("sample value is not a number: {line:?}"));
    let (name, labels) = match head.split_once('{') {
        None => (head.to_string(), BTreeMap::new()),
        Some((name, rest)) => {
            let body = rest
                .strip_suffix('}')
                .unwrap_or_else(|| panic!("unclosed labels: {line:?}"));
            let mut labels = BTreeMap::new();
            // Label values here never hold `,` or `"` (tx codes, codes, names).
            for pair in body.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair
                    .split_once('=')
                    .unwrap_or_else(|| panic!("label without `=`: {line:?}"));
                labels.insert(k.to_string(), v.trim_matches('"').to_string());
            }
            (name.to_string(), labels)
        }
    };
    Sample {
        name,
        labels,
        value,
    }
}
