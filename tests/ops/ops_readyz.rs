//! `/readyz` says "starting" (503) until the hub takes telegrams, then "ready"
//! (200); `/healthz` is 200 all along. A real process.
//!
//! The admin listener is bound before the journal is opened (`Daemon::start`).
//! To hold start-up at that point without a test hook, the test keeps an
//! exclusive SQLite lock on the journal file: the hub's open waits on it
//! (busy timeout, 5 s) until the test lets go. The hub logs the admin address
//! when it binds, before it is ready, so the test finds it on stderr.

use crate::ops_support;

use ops_support::{Hub, http_get};
use serde_json::Value;

#[test]
fn readyz_flips_from_503_to_200_once_the_journal_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.db");
    let lock = rusqlite::Connection::open(&journal).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();

    let mut hub = Hub::start(&[
        "--listen",
        "127.0.0.1:0",
        "--core-url",
        "http://127.0.0.1:1",
        "--journal",
        journal.to_str().unwrap(),
        "--log-format",
        "json",
    ]);
    let line = hub.stderr_line_with("admin endpoints listening");
    let entry: Value = serde_json::from_str(&line).expect("a JSON log line");
    let admin = entry["fields"]["admin"]
        .as_str()
        .unwrap_or_else(|| panic!("no admin address in {line}"))
        .to_string();

    // Start-up is held at the journal: alive, not ready.
    let (status, body) = http_get(&format!("http://{admin}/readyz"));
    assert_eq!((status, body.trim()), (503, "starting"));
    let (status, _) = http_get(&format!("http://{admin}/healthz"));
    assert_eq!(status, 200, "healthz while starting");

    lock.execute_batch("COMMIT").unwrap();
    drop(lock);
    hub.wait_ready();
    assert_eq!(
        hub.admin, admin,
        "the admin line on stdout names the same address"
    );

    let (status, body) = hub.get("/readyz");
    assert_eq!((status, body.trim()), (200, "ready"));
    let (status, _) = hub.get("/healthz");
    assert_eq!(status, 200, "healthz when ready");

    let status = hub.terminate();
    assert!(status.success(), "exit status {status:?}");
}

/// A journal that refuses every transfer until a restart (here its files
/// deleted under the hub) makes `/readyz` 503 with the reason: the hub
/// answers E903 to every new GUID, so a balancer should send elsewhere
/// (before, it stayed 200 `ready`; found by a black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_503_once_the_journal_refuses_every_transfer() {
    use crate::common::{guid, start_core, transfer};
    let core = start_core().await;
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.db");
    let url = core.url();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--core-url",
        &url,
        "--journal",
        journal.to_str().unwrap(),
    ]
    .map(String::from);
    let hub = tokio::task::spawn_blocking(move || {
        Hub::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    let mut ch = hub.channel().await;
    assert_eq!(
        ch.exchange(&transfer(&guid("RDY1"), 10))
            .await
            .unwrap()
            .code,
        "0000"
    );
    assert_eq!(hub.get("/readyz"), (200, "ready\n".to_string()));

    for suffix in ["", "-wal", "-shm"] {
        let mut name = journal.clone().into_os_string();
        name.push(suffix);
        let _ = std::fs::remove_file(name);
    }
    // The transfer whose write finds the files gone is not sent: E901,
    // since its claim failed (the core asked, as without a journal).
    let g = guid("RDY2");
    assert_eq!(ch.exchange(&transfer(&g, 10)).await.unwrap().code, "E901");
    // From then on the journal refuses new rows: E903.
    let g = guid("RDY3");
    assert_eq!(ch.exchange(&transfer(&g, 10)).await.unwrap().code, "E903");
    let (status, body) = hub.get("/readyz");
    assert_eq!(status, 503, "{body}");
    // The reason is the log's (this endpoint needs no token): no path here.
    assert!(
        body.starts_with("journal failed: ") && !body.contains(journal.to_str().unwrap()),
        "{body}"
    );
    let (status, _) = hub.get("/healthz");
    assert_eq!(status, 200, "alive all the same");
}

/// A draining hub says so on `/readyz`, with 200 still: its telegram listener
/// is closed, so new connections go elsewhere, and a balancer that cuts the
/// sessions of a server it marks down would cut the answers the drain is
/// finishing (before, the body said `ready`; found by a black-box probe). A
/// real process with a slow transfer in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_draining_while_the_hub_drains() {
    use crate::common::{guid, start_core, transfer, within};
    use corebank::{FaultRule, Phase};
    let core = start_core().await;
    let slow = guid("RDYSLOW");
    core.add_fault(
        FaultRule::guid(&slow)
            .delay_ms(1_500)
            .phase(Phase::BeforeApply),
    );
    let hub = Hub::for_core(&core.url(), &[]).await;
    let mut ch = hub.channel().await;
    let in_flight = tokio::spawn(async move { ch.exchange(&transfer(&slow, 10)).await });
    within(async {
        while core.stats().post == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(hub.get("/readyz"), (200, "ready\n".to_string()));

    hub.signal("TERM");
    let admin = hub.admin.clone();
    let (status, body) = tokio::task::spawn_blocking(move || {
        let until = std::time::Instant::now() + crate::common::PATIENCE;
        loop {
            let (status, body) = http_get(&format!("http://{admin}/readyz"));
            if body != "ready\n" || std::time::Instant::now() > until {
                return (status, body);
            }
            std::thread::yield_now();
        }
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("draining"), "{body}");
    // The listener closes as the drain begins: a balancer's new connections
    // are refused.
    within(async {
        while tokio::net::TcpStream::connect(&hub.addr).await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let answer = within(in_flight).await.unwrap().unwrap();
    assert_eq!(
        answer.code, "0000",
        "the transfer in flight is still answered"
    );
}
