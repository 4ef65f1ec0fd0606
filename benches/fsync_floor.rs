//! The disk's own floor under the SQLite journal's latency: how long one
//! small `fdatasync` takes on this machine, with nothing else writing.
//!
//! A claim is answered only after an fsync of the WAL that began after its
//! commit, so no percentile of a transfer through the SQLite journal can be
//! lower than the same percentile here (and a claim that commits while an
//! fsync runs waits for that one and the next). It writes BYTES at the end of
//! a scratch file and fdatasyncs it, COUNT times, PAUSE_US apart (a claim
//! every millisecond, as at 1,000 transfers/s), and prints the percentiles,
//! and the CPU time the writing thread spent per write and fdatasync (from
//! `/proc/thread-self/schedstat`: what `compare.sh` counts as the hub's CPU
//! for the same work, kernel time included).
//!
//! ```sh
//! cargo build --release --example fsync_floor
//! target/release/examples/fsync_floor [DIR] [COUNT] [BYTES] [PAUSE_US]
//! ```
//! Defaults: the current directory (put DIR on the journal's file system),
//! 2,000, 8,192 and 1,000. The scratch file is removed at the end.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: u64| -> u64 {
        args.get(i).map_or(default, |a| {
            a.parse()
                .unwrap_or_else(|_| panic!("argument {}: {a:?} is not a number", i + 1))
        })
    };
    let dir = PathBuf::from(args.first().map_or(".", String::as_str));
    let (count, bytes, pause) = (arg(1, 2_000).max(1), arg(2, 8_192), arg(3, 1_000));
    let path = dir.join(format!("fsync_floor.{}.tmp", std::process::id()));
    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
    let block = vec![b'x'; bytes as usize];
    let mut took = Vec::with_capacity(count as usize);
    let mut cpu = Duration::ZERO;
    for _ in 0..count {
        let cpu_before = thread_cpu();
        file.write_all(&block).expect("write");
        let start = Instant::now();
        file.sync_data().expect("fdatasync");
        took.push(start.elapsed());
        cpu += thread_cpu().saturating_sub(cpu_before);
        std::thread::sleep(Duration::from_micros(pause));
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    took.sort();
    let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "fdatasync of {bytes} bytes, {count} times, {pause} us apart, in {}: \
         p50 {:.3} ms, p99 {:.3} ms, p999 {:.3} ms, max {:.3} ms; \
         CPU per write and fdatasync {:.1} us",
        dir.display(),
        ms(at(0.5)),
        ms(at(0.99)),
        ms(at(0.999)),
        ms(took[took.len() - 1]),
        cpu.as_secs_f64() * 1e6 / count as f64
    );
}

/// The CPU time this thread has run, user and kernel (the first field of
/// `/proc/thread-self/schedstat`, in nanoseconds).
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("read /proc/thread-self/schedstat");
    let ns = text
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .expect("a number of nanoseconds in /proc/thread-self/schedstat");
    Duration::from_nanos(ns)
}
