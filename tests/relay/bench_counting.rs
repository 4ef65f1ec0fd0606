//! The bench's own counting: a known mix of answers comes out as exactly that
//! mix, and answers that break the contract are counted as wrong, not dropped.
//! Nothing here is timed: speed is shown by the benchmark, not asserted.

use bytes::BytesMut;
use relayhub::bench::{LoadSpec, Stop, Target, Transfer, Tx, Weighted, run_load};
use relayhub::config::Overrides;
use relayhub::daemon::{Daemon, Source};
use relayhub::frame::{FrameCodec, PrefixMode};
use relayhub::header::{Echo, write_response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// In the fixture's seed: 100,000,000 and 0.
const RICH: &str = "1002003004005";
const EMPTY: &str = "1002003004004";

async fn fixture() -> corebank::CoreBank {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    corebank::start(listener, corebank::default_seed()).await
}

async fn hub(core_url: String) -> Daemon {
    Daemon::start(Source {
        file: None,
        overrides: Overrides {
            listen: Some("127.0.0.1:0".into()),
            core_url: Some(core_url),
            journal: Some("memory".into()),
            ..Overrides::default()
        },
    })
    .await
    .expect("hub starts")
}

/// 3 of every 4 transfers come from a rich account (0000), 1 from an empty one (B201).
fn known_mix(target: Target, count: u64) -> LoadSpec {
    let mut spec = LoadSpec::new(target, 4, Stop::Count(count));
    spec.transfer = Transfer {
        from: Weighted::new(vec![(RICH.to_string(), 3), (EMPTY.to_string(), 1)]).unwrap(),
        ..Transfer::default()
    };
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_mix_through_the_hub_is_counted_exactly() {
    let core = fixture().await;
    let daemon = hub(core.url()).await;
    let report = run_load(known_mix(
        Target::Hub {
            addr: daemon.addr.to_string(),
        },
        40,
    ))
    .await
    .unwrap();
    assert_eq!(report.sent, 40);
    assert_eq!((report.answered, report.wrong, report.errors), (40, 0, 0));
    assert_eq!(report.codes.get("0000"), Some(&30), "{report:?}");
    assert_eq!(report.codes.get("B201"), Some(&10), "{report:?}");
    assert_eq!(report.codes.len(), 2);
    assert_eq!(report.by_tx.get("TRF001"), Some(&40));
    // Each ticket was one POST with a fresh GUID.
    let stats = core.stats();
    assert_eq!(stats.post, 40);
    assert_eq!(stats.by_guid.len(), 40);
    assert_eq!(core.balance(RICH), Some(100_000_000 - 30));
    assert!(report.clean());
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_direct_baseline_counts_the_codes_the_hub_would_answer() {
    let core = fixture().await;
    let report = run_load(known_mix(Target::Direct { url: core.url() }, 20))
        .await
        .unwrap();
    assert_eq!((report.answered, report.wrong, report.errors), (20, 0, 0));
    assert_eq!(report.codes.get("0000"), Some(&15), "{report:?}");
    assert_eq!(report.codes.get("B201"), Some(&5), "{report:?}");
    assert_eq!(core.stats().post, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inquiries_ask_about_guids_this_run_transferred() {
    let core = fixture().await;
    let daemon = hub(core.url()).await;
    let mut spec = LoadSpec::new(
        Target::Hub {
            addr: daemon.addr.to_string(),
        },
        1,
        Stop::Count(20),
    );
    spec.mix = Weighted::new(vec![(Tx::Transfer, 1), (Tx::Inquiry, 1)]).unwrap();
    spec.warmup = 2;
    let report = run_load(spec).await.unwrap();
    assert!(report.clean(), "{report:?}");
    assert_eq!(report.codes.get("0000"), Some(&20), "{report:?}");
    assert_eq!(report.by_tx.get("INQ001"), Some(&10));
    let stats = core.stats();
    // The warm-up has the same mix (1 transfer, 1 inquiry), then 10 and 10.
    assert_eq!(report.warmup.sent, 2);
    assert_eq!((stats.post, stats.get), (11, 11));
    daemon.shutdown().await;
}

/// A fake hub: answers B201 with the request's GUID to odd telegrams and with a
/// GUID of its own to even ones.
async fn lying_hub() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let codec = FrameCodec::new(PrefixMode::Ascii, 4096);
                let mut buf = BytesMut::new();
                let mut n = 0u64;
                loop {
                    let telegram = match codec.decode(&mut buf) {
                        Ok(Some(t)) => t,
                        Ok(None) => match stream.read_buf(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => continue,
                        },
                        Err(_) => return,
                    };
                    n += 1;
                    let mut echo = Echo::from_telegram(&telegram);
                    if n.is_multiple_of(2) {
                        echo.guid = *b"WRONGWRONGWRONGWRONGWRONGWRONG00";
                    }
                    let mut answer = Vec::new();
                    write_response(&echo, "20261129132000", "B201", &[], &mut answer);
                    let mut framed = BytesMut::new();
                    codec.encode(&answer, &mut framed).unwrap();
                    if stream.write_all(&framed).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_a_wrong_guid_is_counted_as_wrong() {
    let addr = lying_hub().await;
    let spec = LoadSpec::new(Target::Hub { addr }, 1, Stop::Count(10));
    let report = run_load(spec).await.unwrap();
    assert_eq!(report.sent, 10);
    assert_eq!((report.answered, report.wrong, report.errors), (5, 5, 0));
    assert_eq!(report.codes.get("B201"), Some(&5));
    assert!(report.wrong_examples[0].contains("GUID echo"), "{report:?}");
    assert!(!report.clean());
    assert!(report.table().contains("WRONG"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_that_is_not_there_gives_errors_not_answers() {
    // Bind and drop: a port with no listener.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let report = run_load(LoadSpec::new(Target::Hub { addr }, 2, Stop::Count(4)))
        .await
        .unwrap();
    assert_eq!((report.answered, report.wrong, report.errors), (0, 0, 4));
    assert!(report.error_examples[0].contains("cannot connect"));
}
