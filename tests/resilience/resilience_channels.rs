//! The channel side (docs/protocol.md sections 2, 3 and 6): the channel table
//! (E103 for an unknown channel, a peer address outside `allow_from`, a tx
//! code the channel may not use), the connection limit, and the two
//! channel-side timeouts that close a connection without an answer.

use crate::common;
use crate::resilience_support;

use std::time::{Duration, Instant};

use common::*;
use resilience_support::*;
use tokio::io::AsyncWriteExt;

/// The tests connect from 127.0.0.1: IBANK may call from there, FAR only from
/// 10.0.0.0/8, INQONLY from anywhere but only INQ001, ANY anything.
fn channel_table() -> &'static str {
    r#"
[[channel]]
id = "IBANK"
allow_from = ["127.0.0.1/32"]
tx_codes = ["TRF001", "INQ001"]

[[channel]]
id = "FAR"
allow_from = ["10.0.0.0/8"]

[[channel]]
id = "INQONLY"
tx_codes = ["INQ001"]

[[channel]]
id = "ANY"
"#
}

async fn hub_with_channels(core: &corebank::CoreBank) -> FileHub {
    start_file_hub(&format!(
        "{}{}{}",
        target_toml("core", &[&core.url()], ""),
        default_routes_toml("core"),
        channel_table()
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e103_for_an_unknown_channel_then_the_corrected_telegram_reuses_the_guid() {
    let core = start_core().await;
    let hub = hub_with_channels(&core).await;
    let mut ch = hub.channel().await;
    let g = guid("E103U");
    let a = exchange(&mut ch, &transfer_as("TRF001", &g, "NOBODY", 1_000)).await;
    assert_answer(&a, "TRF001", &g, "NOBODY", "E103");
    assert_eq!(core.stats().post, 0);
    // Same connection, same GUID, a listed channel: nothing was journaled.
    let a = exchange(&mut ch, &transfer_as("TRF001", &g, "IBANK", 1_000)).await;
    assert_answer(&a, "TRF001", &g, "IBANK", "0000");
    assert_eq!(core.stats().by_guid[&g].post, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e103_for_a_channel_calling_from_an_address_it_is_not_allowed_from() {
    let core = start_core().await;
    let hub = hub_with_channels(&core).await;
    let mut ch = hub.channel().await;
    let g = guid("E103P");
    let a = exchange(&mut ch, &transfer_as("TRF001", &g, "FAR", 1_000)).await;
    assert_answer(&a, "TRF001", &g, "FAR", "E103");
    let q = guid("E103PQ");
    let a = exchange(&mut ch, &inquiry_as("INQ001", &q, "FAR", &g)).await;
    assert_answer(&a, "INQ001", &q, "FAR", "E103");
    // The same telegram from a channel allowed from 127.0.0.1 goes through.
    let a = exchange(&mut ch, &transfer_as("TRF001", &g, "IBANK", 1_000)).await;
    assert_answer(&a, "TRF001", &g, "IBANK", "0000");
    let stats = core.stats();
    assert_eq!((stats.post, stats.get), (1, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e103_for_a_tx_code_the_channel_may_not_use() {
    let core = start_core().await;
    let hub = hub_with_channels(&core).await;
    let mut ch = hub.channel().await;
    let g = guid("E103T");
    let a = exchange(&mut ch, &transfer_as("TRF001", &g, "INQONLY", 1_000)).await;
    assert_answer(&a, "TRF001", &g, "INQONLY", "E103");
    assert_eq!(core.stats().post, 0);
    // Its own tx code is allowed: the inquiry reaches the core (never received).
    let q = guid("E103TQ");
    let a = exchange(&mut ch, &inquiry_as("INQ001", &q, "INQONLY", &g)).await;
    assert_answer(&a, "INQ001", &q, "INQONLY", "E904");
    let stats = core.stats();
    assert_eq!((stats.post, stats.get), (0, 1), "{stats:?}");
    // A channel with no tx_codes list may use every routed code.
    let a = exchange(&mut ch, &transfer_as("TRF001", &g, "ANY", 1_000)).await;
    assert_answer(&a, "TRF001", &g, "ANY", "0000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_check_comes_after_the_route_and_before_the_body() {
    let core = start_core().await;
    let hub = hub_with_channels(&core).await;
    let mut ch = hub.channel().await;
    let g = guid("E103O");
    // Unrouted tx code from an unknown channel: the route is checked first.
    let a = exchange(&mut ch, &transfer_as("ZZZ999", &g, "NOBODY", 1_000)).await;
    assert_answer(&a, "ZZZ999", &g, "NOBODY", "E101");
    // A malformed body (to_bank not digits) from an unknown channel: E103...
    let mut bad = transfer_as("TRF001", &g, "NOBODY", 1_000);
    bad[64 + 16..64 + 19].copy_from_slice(b"08X");
    let a = exchange(&mut ch, &bad).await;
    assert_answer(&a, "TRF001", &g, "NOBODY", "E103");
    // ...and from an allowed one the same body is E102.
    let mut bad = transfer_as("TRF001", &g, "IBANK", 1_000);
    bad[64 + 16..64 + 19].copy_from_slice(b"08X");
    let a = exchange(&mut ch, &bad).await;
    assert_answer(&a, "TRF001", &g, "IBANK", "E102");
    assert_eq!(core.stats().post, 0);
}

// ---- connection limits and timeouts -------------------------------------------

async fn hub_with_server(core: &corebank::CoreBank, server: &str) -> FileHub {
    start_file_hub(&format!(
        "[server]\n{server}\n\n{}{}",
        target_toml("core", &[&core.url()], ""),
        default_routes_toml("core")
    ))
    .await
}

/// A telegram the hub answers at once without calling anyone (E101).
fn unrouted(tag: &str) -> (String, Vec<u8>) {
    let g = guid(tag);
    let t = transfer_as("ZZZ999", &g, CHANNEL, 1);
    (g, t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_connection_limit_a_connection_is_closed_at_once() {
    let core = start_core().await;
    let hub = hub_with_server(&core, "max_connections = 2").await;
    // Two connections, each proven served by an answer.
    let mut c1 = hub.channel().await;
    let mut c2 = hub.channel().await;
    for c in [&mut c1, &mut c2] {
        let (g, t) = unrouted("MAXC");
        assert_eq!(exchange(c, &t).await.guid, g);
    }
    // The third is accepted by the kernel and closed by the hub, no bytes.
    let mut c3 = hub.raw().await;
    let started = Instant::now();
    let rest = read_until_closed(&mut c3).await;
    assert!(rest.is_empty(), "bytes on a refused connection: {rest:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "closed after {:?}, not at once",
        started.elapsed()
    );
    // The two open ones are untouched.
    for c in [&mut c1, &mut c2] {
        let (g, t) = unrouted("MAXC");
        assert_eq!(exchange(c, &t).await.code, "E101", "{g}");
    }
    // Closing one frees its place: a new connection is served (bounded retry,
    // since the hub learns of the close on its own schedule).
    drop(c1);
    within(async {
        loop {
            let Ok(mut c) = relayhub::client::Channel::connect(
                &hub.daemon.addr.to_string(),
                relayhub::frame::PrefixMode::Ascii,
            )
            .await
            else {
                tokio::task::yield_now().await;
                continue;
            };
            let (_, t) = unrouted("MAXC");
            if let Ok(a) = c.exchange(&t).await {
                assert_eq!(a.code, "E101");
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(core.stats().post, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_without_an_answer() {
    let core = start_core().await;
    let idle = 300u64;
    let hub = hub_with_server(&core, &format!("idle_timeout_ms = {idle}")).await;

    // Never sent anything.
    let mut s = hub.raw().await;
    let started = Instant::now();
    assert!(read_until_closed(&mut s).await.is_empty());
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(idle - 10) && elapsed < Duration::from_secs(3),
        "closed after {elapsed:?}, idle timeout {idle} ms"
    );

    // Idle after an answered telegram.
    let mut s = hub.raw().await;
    let (g, t) = unrouted("IDLE");
    s.write_all(&framed(&t)).await.unwrap();
    let (_, answer) = read_raw_answer(&mut s).await;
    assert_eq!(&answer[6..38], g.as_bytes());
    let started = Instant::now();
    assert!(read_until_closed(&mut s).await.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(idle - 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telegram_stalled_halfway_is_dropped_without_an_answer_or_a_call() {
    let core = start_core().await;
    let read = 300u64;
    let hub = hub_with_server(&core, &format!("read_timeout_ms = {read}")).await;
    // Idle is the default 60 s: whatever closes these connections is the read timeout.
    for cut in [2usize, 4 + 40, 4 + 64 + 67] {
        let g = guid("STALL");
        let whole = framed(&transfer(&g, 1_000));
        let mut s = hub.raw().await;
        s.write_all(&whole[..cut]).await.unwrap();
        let started = Instant::now();
        let rest = read_until_closed(&mut s).await;
        let elapsed = started.elapsed();
        assert!(rest.is_empty(), "an answer to a stalled telegram: {rest:?}");
        assert!(
            elapsed >= Duration::from_millis(read - 10) && elapsed < Duration::from_secs(5),
            "cut at {cut}: closed after {elapsed:?}, read timeout {read} ms"
        );
    }
    assert_eq!(
        core.stats().post,
        0,
        "a telegram never completed was forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_trickling_bytes_is_cut_off_at_the_read_timeout() {
    let core = start_core().await;
    let read = 500u64;
    let hub = hub_with_server(&core, &format!("read_timeout_ms = {read}")).await;
    let g = guid("TRICKLE");
    let whole = framed(&transfer(&g, 1_000));
    let (mut rd, mut wr) = hub.raw().await.into_split();
    let reader = tokio::spawn(async move {
        let mut rest = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut rd, &mut rest).await;
        rest
    });
    // One byte every 20 ms: each gap is far inside the timeout, the whole
    // telegram (136 bytes, ~2.7 s) is not. Pacing is the subject here.
    let started = Instant::now();
    let mut pace = tokio::time::interval(Duration::from_millis(20));
    let mut sent = 0;
    for b in &whole {
        pace.tick().await;
        if reader.is_finished() || wr.write_all(std::slice::from_ref(b)).await.is_err() {
            break;
        }
        sent += 1;
    }
    let rest = within(reader).await.unwrap();
    let elapsed = started.elapsed();
    assert!(
        rest.is_empty(),
        "an answer to a trickled telegram: {rest:?}"
    );
    assert!(
        sent < whole.len(),
        "the whole telegram went through at a byte per 20 ms"
    );
    assert!(
        elapsed >= Duration::from_millis(read - 10),
        "cut off after {elapsed:?}, before the {read} ms read timeout"
    );
    assert_eq!(core.stats().post, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_an_answer_is_not_idling() {
    let core = start_core().await;
    let idle = 300u64;
    // The budget (3 s) is longer than the idle timeout: a slow answer must
    // not cost the channel its connection.
    let hub = hub_with_server(&core, &format!("idle_timeout_ms = {idle}")).await;
    let g = guid("NOTIDLE");
    core.add_fault(
        corebank::FaultRule::guid(&g)
            .method(corebank::FaultMethod::Post)
            .delay_ms(idle * 3),
    );
    let mut s = hub.raw().await;
    s.write_all(&framed(&transfer(&g, 1_000))).await.unwrap();
    let (_, answer) = read_raw_answer(&mut s).await;
    assert_eq!(&answer[60..64], b"0000");
    // The idle clock starts with the answer: the next telegram is served.
    let (g2, t) = unrouted("NOTIDLE2");
    s.write_all(&framed(&t)).await.unwrap();
    let (_, answer) = read_raw_answer(&mut s).await;
    assert_eq!(&answer[6..38], g2.as_bytes());
    assert_eq!(&answer[60..64], b"E101");
}
