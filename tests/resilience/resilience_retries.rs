//! Safe retries inside the budget (docs/protocol.md sections 1 and 7), counted at
//! the core: a connect that was refused moves to the next endpoint; an inquiry
//! (a GET) is retried, honouring `Retry-After` only when it fits the budget; a
//! transfer that reached the core is never sent again; the core is told how
//! much of the budget is left.

use crate::common;
use crate::resilience_support;

use std::time::{Duration, Instant};

use common::*;
use corebank::{FaultMethod, FaultRule};
use resilience_support::*;

/// A hub whose `core` target is the given endpoints, in order.
async fn hub_with_urls(urls: &[&str], server: &str) -> FileHub {
    start_file_hub(&format!(
        "[server]\n{server}\n\n{}{}",
        target_toml("core", urls, ""),
        default_routes_toml("core")
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_refused_on_the_first_endpoint_fails_over_to_the_second() {
    let core = start_core().await;
    let dead = refused_port();
    let hub = hub_with_urls(&[&dead.url, &core.url()], "budget_ms = 3000").await;
    let g = guid("FAILOVER");
    let mut ch = hub.channel().await;
    let a = exchange(&mut ch, &transfer(&g, 10_000)).await;
    assert_answer(&a, "TRF001", &g, CHANNEL, "0000");
    // The refused connect sent nothing; the second endpoint got the one POST.
    let stats = core.stats();
    assert_eq!((stats.post, stats.get), (1, 0), "{stats:?}");
    assert_eq!(stats.by_guid[&g].post, 1);
    assert!(stats.by_guid[&g].applied);
    assert_eq!(core.balance(ACC1), Some(990_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_refused_is_e902_within_the_budget_and_nothing_reaches_a_core() {
    let core = start_core().await;
    let (d1, d2) = (refused_port(), refused_port());
    let budget = 1_000;
    let hub = hub_with_urls(&[&d1.url, &d2.url], &format!("budget_ms = {budget}")).await;
    let g = guid("ALLDEAD");
    let mut ch = hub.channel().await;
    let started = Instant::now();
    let a = exchange(&mut ch, &transfer(&g, 10_000)).await;
    assert_answer(&a, "TRF001", &g, CHANNEL, "E902");
    assert!(
        started.elapsed() < Duration::from_millis(budget),
        "E902 after {:?}",
        started.elapsed()
    );
    // The live fixture is not in the list: it must see nothing at all.
    assert_eq!(core.stats().post, 0);
}

/// A transfer answered 0000, so that inquiries about it have something to find.
async fn settled_transfer(s: &Setup, tag: &str) -> (String, Vec<u8>) {
    let g = guid(tag);
    let mut ch = s.channel().await;
    let a = exchange(&mut ch, &transfer(&g, 10_000)).await;
    assert_eq!(a.code, "0000", "{a:?}");
    (g, a.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inquiry_503_with_retry_after_1_is_retried_and_answered_within_the_budget() {
    let budget = 3_000u64;
    let s = setup_with(HubOpts::budget(budget)).await;
    let (orig, body) = settled_transfer(&s, "RA1").await;
    s.core.add_fault(
        FaultRule::guid(&orig)
            .method(FaultMethod::Get)
            .status(503)
            .retry_after("1")
            .times(1),
    );
    let q = guid("RA1Q");
    let mut ch = s.channel().await;
    let started = Instant::now();
    let a = exchange(&mut ch, &inquiry(&q, &orig)).await;
    let elapsed = started.elapsed();
    assert_answer(&a, "INQ001", &q, CHANNEL, "0000");
    assert_eq!(a.body, body, "the inquiry reports the transfer's result");
    assert_eq!(s.guid_stats(&orig).get, 2, "one 503, one retry");
    assert_eq!(s.guid_stats(&orig).post, 1);
    assert!(
        elapsed >= Duration::from_millis(950),
        "answered after {elapsed:?}: the 1 s Retry-After was not honoured"
    );
    assert!(
        elapsed < Duration::from_millis(budget),
        "answered after {elapsed:?}, budget {budget} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inquiry_retry_after_as_an_http_date_inside_the_budget_is_honoured() {
    let budget = 3_000u64;
    let s = setup_with(HubOpts::budget(budget)).await;
    let (orig, body) = settled_transfer(&s, "RADATE").await;
    // Whole seconds on the wire: the wait is between 1 and 2 s from now.
    let when = std::time::SystemTime::now() + Duration::from_secs(2);
    s.core.add_fault(
        FaultRule::guid(&orig)
            .method(FaultMethod::Get)
            .status(503)
            .retry_after(httpdate::fmt_http_date(when))
            .times(1),
    );
    let q = guid("RADATEQ");
    let mut ch = s.channel().await;
    let started = Instant::now();
    let a = exchange(&mut ch, &inquiry(&q, &orig)).await;
    let elapsed = started.elapsed();
    assert_answer(&a, "INQ001", &q, CHANNEL, "0000");
    assert_eq!(a.body, body);
    assert_eq!(s.guid_stats(&orig).get, 2);
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_millis(budget),
        "answered after {elapsed:?}, budget {budget} ms"
    );
}

/// An inquiry whose every GET gets 503 with `retry_after`: answered E901 at
/// once after one GET, since waiting would break the budget.
async fn retry_after_past_the_budget(retry_after: String) {
    let budget = 1_500u64;
    let s = setup_with(HubOpts::budget(budget)).await;
    let (orig, _) = settled_transfer(&s, "RALONG").await;
    s.core.add_fault(
        FaultRule::guid(&orig)
            .method(FaultMethod::Get)
            .status(503)
            .retry_after(retry_after.clone()),
    );
    let q = guid("RALONGQ");
    let mut ch = s.channel().await;
    let started = Instant::now();
    let a = exchange(&mut ch, &inquiry(&q, &orig)).await;
    let elapsed = started.elapsed();
    assert_answer(&a, "INQ001", &q, CHANNEL, "E901");
    assert_eq!(
        s.guid_stats(&orig).get,
        1,
        "Retry-After {retry_after:?} does not fit the budget: no second GET"
    );
    // "At once": well inside the budget, not at its end.
    assert!(
        elapsed < Duration::from_millis(budget / 3),
        "answered after {elapsed:?}; the hub waited although Retry-After {retry_after:?} is past the {budget} ms budget"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_seconds_past_the_budget_is_answered_at_once() {
    retry_after_past_the_budget("5".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_http_date_past_the_budget_is_answered_at_once() {
    let when = std::time::SystemTime::now() + Duration::from_secs(30);
    retry_after_past_the_budget(httpdate::fmt_http_date(when)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inquiry_failing_with_503_is_retried_up_to_its_attempts_within_the_budget() {
    let budget = 3_000u64;
    let s = setup_with(HubOpts::budget(budget)).await;
    let (orig, _) = settled_transfer(&s, "RA503").await;
    s.core
        .add_fault(FaultRule::guid(&orig).method(FaultMethod::Get).status(503));
    let q = guid("RA503Q");
    let mut ch = s.channel().await;
    let started = Instant::now();
    let a = exchange(&mut ch, &inquiry(&q, &orig)).await;
    assert_answer(&a, "INQ001", &q, CHANNEL, "E901");
    assert!(started.elapsed() < Duration::from_millis(budget));
    // inquiry_attempts defaults to 3: three GETs, then "I don't know".
    assert_eq!(s.guid_stats(&orig).get, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inquiry_answered_501_or_505_is_never_retried() {
    for status in [501u16, 505] {
        let s = setup_with(HubOpts::budget(3_000)).await;
        let (orig, _) = settled_transfer(&s, "RA501").await;
        s.core.add_fault(
            FaultRule::guid(&orig)
                .method(FaultMethod::Get)
                .status(status)
                .retry_after("0"),
        );
        let q = guid("RA501Q");
        let mut ch = s.channel().await;
        let a = exchange(&mut ch, &inquiry(&q, &orig)).await;
        assert_answer(&a, "INQ001", &q, CHANNEL, "E901");
        assert_eq!(s.guid_stats(&orig).get, 1, "{status} was retried");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_answered_503_is_not_retried_even_with_retry_after() {
    let budget = 3_000u64;
    let s = setup_with(HubOpts::budget(budget)).await;
    let g = guid("T503");
    s.core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .status(503)
            .retry_after("1"),
    );
    let mut ch = s.channel().await;
    let started = Instant::now();
    let a = exchange(&mut ch, &transfer(&g, 10_000)).await;
    let elapsed = started.elapsed();
    assert_answer(&a, "TRF001", &g, CHANNEL, "E500");
    s.assert_posts(&g, 1);
    s.assert_calls(1, 0);
    assert!(
        elapsed < Duration::from_millis(900),
        "answered after {elapsed:?}: a POST is not retried, so there is nothing to wait for"
    );
    // The channel's resend is answered from the journal: still one POST.
    let again = exchange(&mut ch, &transfer(&g, 10_000)).await;
    assert_answer(&again, "TRF001", &g, CHANNEL, "E500");
    s.assert_calls(1, 0);
    assert_eq!(s.balance(ACC1), 1_000_000);
}

// ---- the deadline header -----------------------------------------------------

fn deadline_ms(seen: &Seen) -> u64 {
    let v = seen
        .headers
        .get("x-expected-timeout-ms")
        .unwrap_or_else(|| {
            panic!(
                "no X-Expected-Timeout-Ms on {} {}: {seen:?}",
                seen.method, seen.path
            )
        });
    v.parse()
        .unwrap_or_else(|_| panic!("X-Expected-Timeout-Ms {v:?} is not a number of ms"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_core_is_told_the_remaining_budget_in_x_expected_timeout_ms() {
    // The fixture does not expose request headers, so a small recording core
    // stands in: POSTs succeed; the first GET is 503 Retry-After 1, then 200.
    let gets = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let core = RecordingCore::start({
        let gets = gets.clone();
        move |req, _| {
            if req.method == "POST" {
                return (200, vec![], OK_TRANSFER.into());
            }
            if gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                (
                    503,
                    vec![("Retry-After".into(), "1".into())],
                    r#"{"result":"FAULT"}"#.into(),
                )
            } else {
                (200, vec![], OK_INQUIRY.into())
            }
        }
    })
    .await;
    let budget = 3_000u64;
    let (hub, _cfg) = start_hub(&core.url, &HubOpts::budget(budget)).await;
    let mut ch = connect(hub.addr, relayhub::frame::PrefixMode::Ascii).await;

    let g = guid("DEADLINE");
    let a = exchange(&mut ch, &transfer(&g, 10_000)).await;
    assert_answer(&a, "TRF001", &g, CHANNEL, "0000");
    let q = guid("DEADLINEQ");
    let a = exchange(&mut ch, &inquiry(&q, &g)).await;
    assert_answer(&a, "INQ001", &q, CHANNEL, "0000");

    let seen = core.seen();
    assert_eq!(
        seen.iter().map(|s| s.method.as_str()).collect::<Vec<_>>(),
        ["POST", "GET", "GET"],
        "{seen:?}"
    );
    let post = &seen[0];
    assert_eq!(post.headers.get("x-guid"), Some(&g), "X-GUID on the POST");
    let (p, g1, g2) = (
        deadline_ms(post),
        deadline_ms(&seen[1]),
        deadline_ms(&seen[2]),
    );
    // Fresh telegrams: nearly the whole budget is left, never more.
    for (what, ms) in [("POST", p), ("first GET", g1)] {
        assert!(
            ms <= budget && ms + 500 > budget,
            "{what}: X-Expected-Timeout-Ms {ms}, budget {budget}"
        );
    }
    // The retry came after the 1 s Retry-After: what is left is less by that much.
    assert!(
        g2 + 900 <= g1 && g2 > 0,
        "retry's X-Expected-Timeout-Ms {g2} after the first GET's {g1} and a 1 s wait"
    );
    assert_eq!(seen[1].path, format!("/v1/transfers/{g}"));
}
