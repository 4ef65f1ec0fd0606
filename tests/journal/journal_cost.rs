//! What the GUID journal costs: the same load (2000 transfers over 32
//! connections, against the in-process fixture) through a hub with the memory
//! journal and through one with the SQLite file (WAL, `synchronous=FULL`,
//! group commit). Prints throughput, latency and the ratio.
//!
//! A measurement, not a check of speed, so it is ignored by default:
//!
//! ```text
//! cargo test --release --test journal journal_cost -- --ignored --nocapture
//! ```
//!
//! It still fails if any transfer is not 0000 or the fixture did not see
//! exactly one POST per transfer.

use crate::common;
use crate::journal_support;

use std::time::{Duration, Instant};

use common::*;
use journal_support::*;
use relayhub::journal::Journal;

const TRANSFERS: usize = 2000;
const CONNECTIONS: usize = 32;
const ROUNDS: usize = 3;

struct Run {
    label: &'static str,
    elapsed: Duration,
    latencies: Vec<Duration>,
    commits: Option<u64>,
}

impl Run {
    fn per_second(&self) -> f64 {
        TRANSFERS as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile(&self, p: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }
}

/// A GUID of 32 characters, unique per run and transfer.
fn cost_guid(run: usize, i: usize) -> String {
    format!("JC{run:02}{i:028}")
}

/// Sends `count` transfers on one connection, one after another; returns
/// each one's latency.
async fn channel_load(
    hub_addr: std::net::SocketAddr,
    run: usize,
    ids: Vec<usize>,
) -> Vec<Duration> {
    let mut ch = connect(hub_addr, relayhub::frame::PrefixMode::Ascii).await;
    let mut latencies = Vec::with_capacity(ids.len());
    for i in ids {
        let g = cost_guid(run, i);
        let telegram = trf(&g, &trf_fields(ACC5, BANK, ACC2, 1, ""));
        let started = Instant::now();
        let a = exchange(&mut ch, &telegram).await;
        latencies.push(started.elapsed());
        assert_eq!(a.code, "0000", "transfer {g}: {a:?}");
    }
    latencies
}

async fn measure(label: &'static str, journal: &str, run: usize) -> Run {
    let core = start_core().await;
    let hub = HubSpec::new(&core.url()).journal(journal).start().await;
    let addr = hub.addr();

    // Warm-up (not timed): one transfer per connection, so connections to the
    // core are pooled and the journal file exists.
    let warm = (0..CONNECTIONS).map(|c| tokio::spawn(channel_load(addr, run, vec![TRANSFERS + c])));
    for t in warm.collect::<Vec<_>>() {
        t.await.expect("warm-up task");
    }
    let commits_before = match hub.daemon.hub().journal() {
        Journal::Sqlite(j) => Some(j.commits()),
        _ => None,
    };

    let started = Instant::now();
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let ids: Vec<usize> = (c..TRANSFERS).step_by(CONNECTIONS).collect();
            tokio::spawn(channel_load(addr, run, ids))
        })
        .collect();
    let mut latencies = Vec::with_capacity(TRANSFERS);
    for t in tasks {
        latencies.extend(t.await.expect("load task"));
    }
    let elapsed = started.elapsed();
    latencies.sort();
    assert_eq!(latencies.len(), TRANSFERS);

    let stats = core.stats();
    assert_eq!(
        stats.post as usize,
        TRANSFERS + CONNECTIONS,
        "one POST per transfer"
    );
    assert!(stats.by_guid.values().all(|g| g.post == 1 && g.applied));
    let commits = match (hub.daemon.hub().journal(), commits_before) {
        (Journal::Sqlite(j), Some(before)) => Some(j.commits() - before),
        _ => None,
    };
    hub.shutdown().await;
    Run {
        label,
        elapsed,
        latencies,
        commits,
    }
}

fn print(run: &Run) {
    let commits = run
        .commits
        .map(|c| {
            format!(
                ", {c} commits ({:.2} per transfer)",
                c as f64 / TRANSFERS as f64
            )
        })
        .unwrap_or_default();
    println!(
        "  {:<7} {:>7.0} transfers/s  ({} in {:>6.0} ms; latency p50 {:>5.2} ms, p99 {:>5.2} ms{commits})",
        run.label,
        run.per_second(),
        TRANSFERS,
        run.elapsed.as_secs_f64() * 1000.0,
        run.percentile(0.50).as_secs_f64() * 1000.0,
        run.percentile(0.99).as_secs_f64() * 1000.0,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --release -- --ignored --nocapture"]
async fn journal_cost_report() {
    let dir = TempDir::new("journal-cost");
    println!(
        "journal cost: {TRANSFERS} transfers over {CONNECTIONS} connections, in-process fixture, \
         SQLite file under {}",
        std::env::temp_dir().display()
    );
    let mut memory = Vec::new();
    let mut sqlite = Vec::new();
    for round in 0..ROUNDS {
        println!("round {}", round + 1);
        let m = measure("memory", "memory", 2 * round).await;
        print(&m);
        memory.push(m.per_second());
        let file = dir.join(&format!("journal-{round}.db"));
        let s = measure("sqlite", file.to_str().unwrap(), 2 * round + 1).await;
        print(&s);
        sqlite.push(s.per_second());
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (m, s) = (mean(&memory), mean(&sqlite));
    println!(
        "mean: memory {m:.0}/s, sqlite {s:.0}/s; sqlite reaches {:.0}% of memory's throughput \
         (memory/sqlite = {:.2})",
        100.0 * s / m,
        m / s
    );
}
