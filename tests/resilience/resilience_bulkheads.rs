//! Bulkheads (docs/protocol.md sections 6 and 7): a target takes at most
//! `max_concurrency` calls at once; a telegram that finds no slot within the
//! queue wait is answered E903 ("nothing was sent") at once, and a target that
//! hangs uses up only its own slots, never another target's.
//!
//! Timing is asserted relatively (who is answered before whom), measured at
//! the channel; the fixture's counters say how many calls were made.

use crate::common;
use crate::resilience_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use corebank::{FaultMethod, FaultRule};
use relayhub::client::Answer;
use resilience_support::*;
use tokio::sync::Barrier;

/// Sends each telegram on its own connection, all at once (after every
/// connection is open); returns each answer with when it arrived.
async fn send_all_at_once(hub: &FileHub, telegrams: Vec<Vec<u8>>) -> Vec<(Answer, Instant)> {
    let barrier = Arc::new(Barrier::new(telegrams.len()));
    let mut tasks = Vec::new();
    for t in telegrams {
        let mut ch = hub.channel().await;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let a = exchange(&mut ch, &t).await;
            (a, Instant::now())
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(within(t).await.expect("channel task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_bulkhead_answers_e903_at_once_and_only_n_posts_reach_the_core() {
    const N: usize = 4;
    let core = start_core().await;
    // Every transfer is held 1.5 s by the core (inside the 3 s budget).
    let hold = Duration::from_millis(1_500);
    core.add_fault(
        FaultRule::guid_prefix("")
            .method(FaultMethod::Post)
            .delay_ms(hold.as_millis() as u64),
    );
    let hub = start_file_hub(&format!(
        "[server]\nbudget_ms = 3000\n\n{}{}",
        target_toml(
            "core",
            &[&core.url()],
            &format!("max_concurrency = {N}\nqueue_wait_ms = 100"),
        ),
        default_routes_toml("core")
    ))
    .await;
    let guids: Vec<String> = (0..N + 10).map(|_| guid("BULK")).collect();
    let telegrams = guids.iter().map(|g| transfer(g, 1_000)).collect();
    let started = Instant::now();
    let answers = send_all_at_once(&hub, telegrams).await;

    let (ok, full): (Vec<_>, Vec<_>) = answers.iter().partition(|(a, _)| a.code == "0000");
    assert_eq!(
        (ok.len(), full.len()),
        (N, 10),
        "codes: {:?}",
        answers.iter().map(|(a, _)| &a.code).collect::<Vec<_>>()
    );
    for (a, _) in &full {
        assert_answer(a, "TRF001", &a.guid, CHANNEL, "E903");
    }
    // E903 came at once: before any slot could free up, long before the hold ends.
    let last_refusal = full.iter().map(|(_, t)| *t).max().unwrap();
    let first_ok = ok.iter().map(|(_, t)| *t).min().unwrap();
    assert!(
        last_refusal < first_ok,
        "an E903 came after a slot freed: last E903 at {:?}, first 0000 at {:?}",
        last_refusal - started,
        first_ok - started
    );
    assert!(
        last_refusal - started < hold,
        "last E903 after {:?}, the core holds calls {hold:?}",
        last_refusal - started
    );
    // Exactly N POSTs; the refused GUIDs never reached the core.
    let stats = core.stats();
    assert_eq!(stats.post, N as u64, "{stats:?}");
    for (a, _) in &full {
        assert!(
            !stats.by_guid.contains_key(&a.guid),
            "E903 GUID {} was posted",
            a.guid
        );
    }
    for (a, _) in &ok {
        assert_eq!(stats.by_guid[&a.guid].post, 1);
    }
    assert_eq!(core.balance(ACC1), Some(1_000_000 - N as u64 * 1_000));

    // The slots are back: the next transfer gets one.
    let g = guid("BULKAFTER");
    let mut ch = hub.channel().await;
    assert_eq!(exchange(&mut ch, &transfer(&g, 1_000)).await.code, "0000");
    assert_eq!(core.stats().post, N as u64 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_target_does_not_slow_transfers_routed_to_another_target() {
    let slow = start_core().await;
    let fast = start_core().await;
    // The slow core holds every transfer far past the budget.
    slow.add_fault(
        FaultRule::guid_prefix("")
            .method(FaultMethod::Post)
            .delay_ms(5_000),
    );
    let budget = 1_500u64;
    let hub = start_file_hub(&format!(
        "[server]\nbudget_ms = {budget}\n\n{}{}{}{}{}",
        target_toml(
            "slow",
            &[&slow.url()],
            "max_concurrency = 2\nqueue_wait_ms = 50\nlate_answer_window_ms = 0",
        ),
        target_toml("fast", &[&fast.url()], "max_concurrency = 16"),
        route_toml("TRF001", "transfer", "slow", None),
        route_toml("TRF002", "transfer", "fast", Some("TRF001")),
        route_toml("INQ001", "inquiry", "fast", None),
    ))
    .await;

    // Two transfers take both of the slow target's slots and hang there.
    let mut hung = Vec::new();
    for _ in 0..2 {
        let g = guid("HANG");
        let mut ch = hub.channel().await;
        hung.push(tokio::spawn(async move {
            let a = exchange(&mut ch, &transfer(&g, 1_000)).await;
            (g, a, Instant::now())
        }));
    }
    within(slow.wait_stats(|s| s.post >= 2)).await;

    // The slow target is full: more transfers to it are refused at once.
    let more: Vec<String> = (0..3).map(|_| guid("HANGFULL")).collect();
    let refused = send_all_at_once(&hub, more.iter().map(|g| transfer(g, 1_000)).collect()).await;
    for (a, _) in &refused {
        assert_eq!(a.code, "E903", "{a:?}");
    }

    // Meanwhile transfers to the healthy target go straight through.
    let quick: Vec<String> = (0..10).map(|_| guid("QUICK")).collect();
    let answers = send_all_at_once(
        &hub,
        quick
            .iter()
            .map(|g| transfer_as("TRF002", g, CHANNEL, 1_000))
            .collect(),
    )
    .await;
    for (a, _) in &answers {
        assert_answer(a, "TRF002", &a.guid, CHANNEL, "0000");
    }
    let last_quick = answers.iter().map(|(_, t)| *t).max().unwrap();

    // Only now do the hung transfers get their (budget-bound) answers.
    let mut first_hung: Option<Instant> = None;
    for h in hung {
        let (g, a, at) = within(h).await.unwrap();
        assert_answer(&a, "TRF001", &g, CHANNEL, "E901");
        first_hung = Some(first_hung.map_or(at, |f| f.min(at)));
    }
    assert!(
        last_quick < first_hung.unwrap(),
        "the healthy route waited for the hanging one: last healthy answer {:?} after the first hung answer",
        last_quick.saturating_duration_since(first_hung.unwrap())
    );
    assert_eq!(fast.stats().post, 10);
    assert_eq!(
        slow.stats().post,
        2,
        "refused transfers never reached the slow core"
    );
}
