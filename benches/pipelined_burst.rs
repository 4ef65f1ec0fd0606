//! Thousands of budgets ending together: the client of
//! `benches/pipelined_burst.sh`.
//!
//! `--connections` channels each write `--depth` transfers in one write: a
//! head whose POST the fixture holds for `--hold-ms` (past the hub's
//! budget), then fresh GUIDs. Each connection has `max_in_flight_per_connection`
//! telegrams in flight behind its head, and the rest wait for room until
//! their budgets run out, all within the same few hundred milliseconds.
//! Every answer must come in order, none lost, E903 only for GUIDs never
//! posted. Prints one JSON report: the codes, order and loss, POSTs of
//! GUIDs answered "not sent", and the latest answer counted from the write
//! (an upper bound of the hub's own time: the budget runs from its read).
//!
//! ```sh
//! cargo build --release --example pipelined_burst
//! target/release/examples/pipelined_burst --hub 127.0.0.1:PORT --core http://127.0.0.1:PORT
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use relayhub::client::{Answer, Channel, build_telegram, new_guid};
use relayhub::frame::{FrameCodec, PrefixMode};

struct Args {
    hub: String,
    core: String,
    connections: usize,
    depth: usize,
    hold_ms: u64,
}

fn args() -> Args {
    let mut a = Args {
        hub: String::new(),
        core: String::new(),
        connections: 150,
        depth: 40,
        hold_ms: 8000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} wants a value"));
        let number = || value.parse().unwrap_or_else(|_| panic!("{flag}: {value}"));
        match flag.as_str() {
            "--hub" => a.hub = value.clone(),
            "--core" => a.core = value.clone(),
            "--connections" => a.connections = number() as usize,
            "--depth" => a.depth = number() as usize,
            "--hold-ms" => a.hold_ms = number(),
            _ => panic!("unknown flag {flag}"),
        }
    }
    assert!(!a.hub.is_empty() && !a.core.is_empty(), "--hub and --core");
    a
}

/// The built-in TRF001 layout, parsed once for every telegram of the run.
static TRF001: std::sync::LazyLock<relayhub::layout::Layout> = std::sync::LazyLock::new(|| {
    relayhub::layout::builtin()
        .remove("TRF001")
        .expect("TRF001")
});

fn transfer(guid: &str) -> Vec<u8> {
    let fields = json!({ "from_account": "1002003004001", "to_bank": "088",
        "to_account": "1002003004002", "amount": 1, "memo": "burst" });
    let stamp = relayhub::header::local_timestamp();
    build_telegram(
        &TRF001,
        guid,
        "IBANK",
        &stamp,
        fields.as_object().expect("an object"),
    )
    .expect("a valid transfer")
}

/// What one connection saw: per telegram, its GUID, the answer's GUID and
/// code, and the answer's time from the write.
type Seen = Vec<(String, String, String, Duration)>;

async fn connection(hub: String, guids: Vec<String>) -> Result<Seen, String> {
    let codec = FrameCodec::new(PrefixMode::Ascii, 4096);
    let mut bytes = bytes::BytesMut::new();
    for g in &guids {
        codec
            .encode(&transfer(g), &mut bytes)
            .map_err(|e| e.to_string())?;
    }
    let mut ch = Channel::connect(&hub, PrefixMode::Ascii)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let written = Instant::now();
    ch.stream_mut()
        .write_all(&bytes)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut seen = Vec::new();
    for g in guids {
        let raw = match tokio::time::timeout(Duration::from_secs(30), ch.recv()).await {
            Ok(Ok(Some(raw))) => raw,
            _ => break,
        };
        match Answer::parse(&raw) {
            Ok(a) => seen.push((g, a.guid, a.code, written.elapsed())),
            // Counted as out of order, with the answers seen before it.
            Err(e) => seen.push((
                g,
                format!("unparsable: {e}"),
                String::new(),
                written.elapsed(),
            )),
        }
    }
    // An answer more than was sent is out of order too.
    if let Ok(Ok(Some(_))) = tokio::time::timeout(Duration::from_millis(100), ch.recv()).await {
        seen.push((
            String::new(),
            "an extra answer".into(),
            String::new(),
            written.elapsed(),
        ));
    }
    Ok(seen)
}

fn main() {
    let a = args();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .proxy(None)
        .http_status_as_error(false)
        .build()
        .into();
    let day = relayhub::header::local_timestamp()[..8].to_string();
    let head_prefix = format!("{day}PBHEAD");
    let rule = json!({ "match": { "guid_prefix": head_prefix, "method": "POST" },
        "action": { "delay_ms": a.hold_ms } });
    agent
        .post(format!("{}/_admin/faults", a.core))
        .header("content-type", "application/json")
        .send(rule.to_string())
        .expect("the fixture takes the fault");

    let plans: Vec<Vec<String>> = (0..a.connections)
        .map(|_| {
            let mut gs = vec![new_guid("PBHEAD")];
            gs.extend((1..a.depth).map(|_| new_guid("PB")));
            gs
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let results = runtime.block_on(async {
        let tasks: Vec<_> = plans
            .iter()
            .map(|gs| tokio::spawn(connection(a.hub.clone(), gs.clone())))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("a connection's task"));
        }
        out
    });

    // The held POSTs end; then every POST is counted.
    std::thread::sleep(Duration::from_millis(a.hold_ms + 500));
    let stats = agent
        .get(format!("{}/_admin/stats", a.core))
        .call()
        .expect("the fixture's stats")
        .body_mut()
        .read_to_string()
        .expect("the stats' text");
    let stats: Value = serde_json::from_str(&stats).expect("stats as JSON");
    let posts = |g: &str| stats["by_guid"][g]["post"].as_u64().unwrap_or(0);

    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    let (mut out_of_order, mut lost, mut failed, mut not_sent_but_posted) = (0, 0, 0, 0);
    let mut latest = Duration::ZERO;
    for (plan, result) in plans.iter().zip(&results) {
        let seen = match result {
            Ok(seen) => seen,
            Err(e) => {
                eprintln!("a connection failed: {e}");
                failed += 1;
                lost += plan.len();
                continue;
            }
        };
        lost += plan.len().saturating_sub(seen.len());
        for (sent, echoed, code, at) in seen {
            out_of_order += usize::from(sent != echoed);
            if !code.is_empty() {
                *codes.entry(code.clone()).or_default() += 1;
            }
            latest = latest.max(*at);
            if matches!(code.as_str(), "E902" | "E903" | "E904") && posts(sent) > 0 {
                not_sent_but_posted += 1;
            }
        }
    }
    let max_posts = plans.iter().flatten().map(|g| posts(g)).max().unwrap_or(0);
    let report = json!({
        "telegrams": a.connections * a.depth,
        "codes": codes,
        "out_of_order": out_of_order,
        "lost": lost,
        "connections_failed": failed,
        "not_sent_but_posted": not_sent_but_posted,
        "max_posts_per_guid": max_posts,
        "latest_answer_ms_from_write": latest.as_millis() as u64,
    });
    println!("{}", serde_json::to_string_pretty(&report).expect("JSON"));
}
