//! What an operator's Prometheus sees: a real `relayhub serve` process in front
//! of the in-process corebank fixture, a mixed run of telegrams, then scrapes
//! of `/metrics` on the admin address the hub printed on stdout.
//!
//! A real process, so the counters are this run's alone (the recorder is
//! process-wide).

use crate::common;
use crate::ops_support;

use common::{ACC2, ACC3, BANK, exchange, guid, start_core, transfer, trf, trf_fields};
use corebank::FaultRule;
use ops_support::{Hub, Metrics};
use relayhub::client::Channel;
use relayhub::frame::PrefixMode;
use relayhub::metric_names;
use serde_json::json;

/// Every metric the hub describes, with the Prometheus type it must have.
const DESCRIBED: &[(&str, &str)] = &[
    (metric_names::TELEGRAMS, "counter"),
    (metric_names::TELEGRAM_DURATION, "histogram"),
    (metric_names::CORE_CALL_DURATION, "histogram"),
    (metric_names::CORE_IN_FLIGHT, "gauge"),
    (metric_names::BULKHEAD_REJECTIONS, "counter"),
    (metric_names::CORE_RETRIES, "counter"),
    (metric_names::OPEN_CONNECTIONS, "gauge"),
    (metric_names::CONNECTIONS_REFUSED, "counter"),
    (metric_names::JOURNAL_UNKNOWN, "gauge"),
    (metric_names::JOURNAL_UNSETTLED_PAST_RETENTION, "gauge"),
    (metric_names::CONFIG_RELOADS, "counter"),
    (metric_names::ANSWER_WRITE_TIMEOUTS, "counter"),
    (metric_names::ANSWERS_PAST_BUDGET, "counter"),
    (metric_names::LOG_LINES_DROPPED, "counter"),
    (metric_names::TLS_HANDSHAKE_FAILURES, "counter"),
    (metric_names::JOURNAL_TAKEOVERS, "counter"),
];

fn telegrams(m: &Metrics, tx: &str, code: &str) -> f64 {
    m.value(metric_names::TELEGRAMS, &[("tx_code", tx), ("code", code)])
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_a_mixed_run_count_what_happened() {
    let core = start_core().await;
    let core_url = core.url();
    let hub = Hub::for_core(&core_url, &["--budget-ms", "800"]).await;

    // Before any telegram: every series without labels, and the per-target
    // ones, read 0 rather than being missing.
    let m = scrape(&hub).await;
    for (name, labels) in [
        (metric_names::OPEN_CONNECTIONS, vec![]),
        (metric_names::CONNECTIONS_REFUSED, vec![]),
        (metric_names::ANSWERS_PAST_BUDGET, vec![]),
        (metric_names::JOURNAL_UNKNOWN, vec![]),
        (metric_names::BULKHEAD_REJECTIONS, vec![("target", "core")]),
        (
            metric_names::CORE_RETRIES,
            vec![("target", "core"), ("operation", "transfer")],
        ),
        (metric_names::CONFIG_RELOADS, vec![("result", "ok")]),
        (metric_names::CONFIG_RELOADS, vec![("result", "refused")]),
    ] {
        assert_eq!(m.must(name, &labels), 0.0, "{name} {labels:?} at start");
    }

    let mut ch = Channel::connect(&hub.addr, PrefixMode::Ascii)
        .await
        .expect("connect to the hub");

    // 3 x 0000.
    for _ in 0..3 {
        let a = exchange(&mut ch, &transfer(&guid("OPSOK"), 1000)).await;
        assert_eq!(a.code, "0000", "{a:?}");
    }
    // 1 x B201: ACC3 holds 500,000.
    let a = exchange(
        &mut ch,
        &trf(&guid("OPSB2"), &trf_fields(ACC3, BANK, ACC2, 600_000, "")),
    )
    .await;
    assert_eq!(a.code, "B201", "{a:?}");
    // 1 x E101: a tx code without a route.
    let mut unrouted = transfer(&guid("OPS101"), 1000);
    unrouted[..6].copy_from_slice(b"ZZZ999");
    let a = exchange(&mut ch, &unrouted).await;
    assert_eq!(a.code, "E101", "{a:?}");
    // 1 x E102: a letter in the amount (U field at byte 99).
    let mut malformed = transfer(&guid("OPS102"), 1000);
    malformed[100] = b'X';
    let a = exchange(&mut ch, &malformed).await;
    assert_eq!(a.code, "E102", "{a:?}");
    // 1 x E901: the core holds the transfer past the budget (800 ms); the call
    // goes on in the late-answer window.
    let slow = guid("OPS901");
    let rule: FaultRule = serde_json::from_value(json!({
        "match": {"guid": slow},
        "action": {"delay_ms": 10_000},
        "times": 1
    }))
    .unwrap();
    core.add_fault(rule);
    let a = exchange(&mut ch, &transfer(&slow, 1000)).await;
    assert_eq!(a.code, "E901", "{a:?}");

    let m = scrape(&hub).await;
    assert_eq!(telegrams(&m, "TRF001", "0000"), 3.0);
    assert_eq!(telegrams(&m, "TRF001", "B201"), 1.0);
    assert_eq!(telegrams(&m, "TRF001", "E102"), 1.0);
    assert_eq!(telegrams(&m, "TRF001", "E901"), 1.0);
    // Unrouted tx codes share one label value: a channel cannot grow the series.
    assert_eq!(telegrams(&m, metric_names::UNROUTED_TX, "E101"), 1.0);
    assert!(
        !m.text.contains("ZZZ999"),
        "an unrouted tx code became a label:\n{}",
        m.text
    );
    let total: f64 = m
        .samples
        .iter()
        .filter(|s| s.name == metric_names::TELEGRAMS)
        .map(|s| s.value)
        .sum();
    assert_eq!(total, 7.0, "telegrams in all");

    // Latency: one observation per telegram, one core call per transfer sent.
    let count = |name: &str, labels: &[(&str, &str)]| m.must(&format!("{name}_count"), labels);
    assert_eq!(
        count(metric_names::TELEGRAM_DURATION, &[("tx_code", "TRF001")]),
        6.0
    );
    assert_eq!(
        count(
            metric_names::TELEGRAM_DURATION,
            &[("tx_code", metric_names::UNROUTED_TX)]
        ),
        1.0
    );
    assert_eq!(
        count(
            metric_names::CORE_CALL_DURATION,
            &[("target", "core"), ("operation", "transfer")]
        ),
        5.0
    );
    // Every telegram was answered within the 800 ms budget.
    assert_eq!(
        m.must(
            &format!("{}_bucket", metric_names::TELEGRAM_DURATION),
            &[("tx_code", "TRF001"), ("le", "1")]
        ),
        6.0
    );

    // Read gauges, refreshed by the scrape itself (not 5 s later): the E901
    // transfer is unknown in the journal and its call still holds a slot.
    assert_eq!(m.must(metric_names::JOURNAL_UNKNOWN, &[]), 1.0);
    assert_eq!(
        m.must(metric_names::CORE_IN_FLIGHT, &[("target", "core")]),
        1.0
    );
    assert_eq!(m.must(metric_names::OPEN_CONNECTIONS, &[]), 1.0);
    assert_eq!(
        m.must(metric_names::BULKHEAD_REJECTIONS, &[("target", "core")]),
        0.0
    );

    // Every metric is described (HELP) and typed, and named by the conventions.
    for (name, ty) in DESCRIBED {
        assert!(
            m.help.get(*name).is_some_and(|h| !h.is_empty()),
            "no HELP for {name}:\n{}",
            m.text
        );
        assert_eq!(m.types.get(*name).map(String::as_str), Some(*ty), "{name}");
    }
    for (name, ty) in &m.types {
        if !name.starts_with("relayhub_") {
            continue;
        }
        assert!(
            DESCRIBED.iter().any(|(n, _)| n == name),
            "{name} is exported but not in the described list"
        );
        match ty.as_str() {
            "counter" => assert!(name.ends_with("_total"), "counter {name}"),
            "histogram" => assert!(name.ends_with("_seconds"), "histogram {name}"),
            _ => assert!(!name.ends_with("_total"), "gauge {name}"),
        }
    }

    // A reload (SIGHUP) is counted with its outcome.
    hub.signal("HUP");
    hub.stderr_line_with("reload: new routes");
    let m = scrape(&hub).await;
    assert_eq!(
        m.must(metric_names::CONFIG_RELOADS, &[("result", "ok")]),
        1.0
    );
    assert_eq!(
        m.must(metric_names::CONFIG_RELOADS, &[("result", "refused")]),
        0.0
    );

    drop(ch);
    let mut hub = hub;
    let status = tokio::task::spawn_blocking(move || hub.terminate())
        .await
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
}

async fn scrape(hub: &Hub) -> Metrics {
    let url = format!("http://{}/metrics", hub.admin);
    let (status, text) = tokio::task::spawn_blocking(move || ops_support::http_get(&url))
        .await
        .unwrap();
    assert_eq!(status, 200, "/metrics: {text}");
    Metrics::parse(&text)
}

/// A failed TLS handshake with the core is E902 and counted by its cause:
/// what the TLS section of docs/operations.md tells operators to alert on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_tls_handshake_with_the_core_is_counted_by_cause() {
    use common::certs::{TestCa, Validity};
    let ca = TestCa::new("core CA");
    let server = ca.server("core", &["127.0.0.1"], Validity::Expired);
    let core = common::start_core_https(&server, None).await;
    let config = common::TempFile::new(
        "toml",
        &common::target_tls_toml("core", Some(&ca.cert), None),
    );
    let core_url = core.url();
    let config_path = config.0.display().to_string();
    let hub = Hub::for_core(&core_url, &["--config", &config_path]).await;
    let mut ch = Channel::connect(&hub.addr, PrefixMode::Ascii)
        .await
        .unwrap();
    let g = guid("MTLSEXP");
    let a = exchange(&mut ch, &transfer(&g, 1_000)).await;
    assert_eq!(a.code, "E902", "{a:?}");
    let m = tokio::task::spawn_blocking(move || hub.scrape())
        .await
        .unwrap();
    let failures = m
        .value(
            metric_names::CORE_TLS_FAILURES,
            &[("target", "core"), ("cause", "certificate_expired")],
        )
        .unwrap_or(0.0);
    // Every connect attempt of the telegram failed the same way.
    assert!(failures >= 1.0, "{}", m.text);
    assert_eq!(telegrams(&m, "TRF001", "E902"), 1.0);
    assert_eq!(
        m.types
            .get(metric_names::CORE_TLS_FAILURES)
            .map(String::as_str),
        Some("counter")
    );
    assert!(
        m.help
            .get(metric_names::CORE_TLS_FAILURES)
            .is_some_and(|h| !h.is_empty())
    );
    assert_eq!(core.stats().post, 0);
}
