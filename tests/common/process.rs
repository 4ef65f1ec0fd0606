//! The real binaries: started with stdout piped, ready once they print
//! `listening on HOST:PORT`, stopped by signals with bounded waits.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use relayhub::client::{Answer, Channel};
use relayhub::frame::PrefixMode;

use super::{PATIENCE, TempFile, connect, exchange};

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
                let mut args = vec!["build", "-p", "corebank", "--bin", "corebank"];
                // Built with relayhub's profile (its folder), so that it lands beside it.
                if dir.file_name().is_some_and(|name| name == "release") {
                    args.push("--release");
                }
                let status = Command::new(cargo)
                    .args(args)
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

/// The first word after `prefix` in a line: the HOST:PORT of a ready line.
pub fn after(line: &str, prefix: &str) -> Option<String> {
    line.split(prefix)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
}

/// A process that printed its ready line.
pub struct Listening {
    pub child: Child,
    /// The HOST:PORT of the ready line.
    pub addr: String,
    /// The whole ready line.
    pub line: String,
}

/// Spawns `cmd` with no stdin, stdout piped and stderr to the file `stderr`,
/// and waits (at most `patience`) for its first stdout line, which must say
/// `listening on HOST:PORT`; the rest of stdout is drained so the child never
/// blocks on a full pipe. `Err` says what came instead of a line; the child is
/// killed and reaped by then.
pub fn spawn_listening(
    cmd: &mut Command,
    stderr: &Path,
    patience: Duration,
) -> Result<Listening, String> {
    let program = cmd.get_program().to_string_lossy().to_string();
    let log = std::fs::File::create(stderr).expect("stderr file");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.next());
        for _ in lines {} // keep the pipe drained
    });
    let line = match rx.recv_timeout(patience) {
        Ok(Some(Ok(line))) => line,
        other => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{program} printed no ready line: {other:?}"));
        }
    };
    let addr = after(&line, "listening on ")
        .unwrap_or_else(|| panic!("ready line without `listening on HOST:PORT`: {line:?}"));
    Ok(Listening { child, addr, line })
}

/// `kill -NAME PID` (`TERM`, `KILL`, `HUP`), asserting that it was delivered.
pub fn send_signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// Waits on a thread of its own (at most `patience`) for `child` to exit.
/// `Err` says why there is no status.
pub fn wait_exit_within(mut child: Child, patience: Duration) -> Result<ExitStatus, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(patience) {
        Ok(Ok(status)) => Ok(status),
        other => Err(format!("{other:?}")),
    }
}

/// A child process that is killed if the test ends without stopping it.
pub struct Proc {
    child: Option<Child>,
    pub pid: u32,
    pub addr: SocketAddr,
    pub stderr_path: TempFile,
}

impl Proc {
    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let child = self.child.take().expect("process still owned");
        send_signal(self.pid, "TERM");
        wait_exit_within(child, PATIENCE).unwrap_or_else(|e| {
            let _ = Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .status();
            panic!(
                "process {} did not exit within {PATIENCE:?} of SIGTERM: {e}; stderr:\n{}",
                self.pid,
                self.stderr()
            )
        })
    }

    /// The exit status if the process has ended (reaped here), `None` while it
    /// runs or once it was stopped through this handle.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL: no drain, no clean-up; returns the exit status once reaped.
    pub fn sigkill(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("process still owned");
        send_signal(self.pid, "KILL");
        child.wait().expect("reap the process")
    }

    /// What the process wrote to stderr so far (for failure messages).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path.0).unwrap_or_default()
    }

    /// A new ascii-prefix connection to the process.
    pub async fn channel(&self) -> Channel {
        connect(self.addr, PrefixMode::Ascii).await
    }

    /// Sends one telegram on a connection of its own and returns the answer.
    pub async fn send(&self, telegram: &[u8]) -> Answer {
        let mut ch = self.channel().await;
        exchange(&mut ch, telegram).await
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

/// Starts `cmd`, reads its `listening on HOST:PORT` line from stdout.
/// `Err` carries what the process logged when it did not come up.
pub fn try_start(cmd: &mut Command) -> Result<Proc, String> {
    let stderr_path = TempFile::new("log", "");
    let ready = spawn_listening(cmd, &stderr_path.0, PATIENCE).map_err(|e| {
        let log = std::fs::read_to_string(&stderr_path.0).unwrap_or_default();
        format!("{e}; stderr:\n{log}")
    })?;
    assert!(
        !ready.addr.ends_with(":0"),
        "ready line shows port 0: {:?}",
        ready.line
    );
    let addr = ready.addr.parse().unwrap_or_else(|_| {
        panic!(
            "ready line without `listening on HOST:PORT`: {:?}",
            ready.line
        )
    });
    Ok(Proc {
        pid: ready.child.id(),
        child: Some(ready.child),
        addr,
        stderr_path,
    })
}

/// `--listen 127.0.0.1:0 --core-url CORE_URL --journal memory EXTRA`: the
/// arguments of `relayhub serve` for a hub in front of `core_url`.
pub fn memory_hub_args(core_url: &str, extra: &[&str]) -> Vec<String> {
    [
        "--listen",
        "127.0.0.1:0",
        "--core-url",
        core_url,
        "--journal",
        "memory",
    ]
    .iter()
    .chain(extra)
    .map(|a| a.to_string())
    .collect()
}

/// Starts `bin args`, reads its `listening on HOST:PORT` line from stdout.
pub fn spawn_ready(bin: &Path, args: &[&str]) -> Proc {
    try_start(Command::new(bin).args(args)).unwrap_or_else(|e| panic!("{e}"))
}
