//! The admin HTTP endpoints, on their own address off the telegram port:
//! `GET /metrics` (Prometheus text), `GET /healthz` (the process runs) and
//! `GET /readyz` (listeners bound, config and journal loaded; it does not depend
//! on the core's health, so a core outage does not take the hub out of a load
//! balancer that could still answer E902 truthfully).
//!
//! Every metric the hub records is named and described here ([`describe`]), so
//! `/metrics` carries a `# HELP` line for each and `docs/operations.md` has one
//! list to follow. Counters and histograms are recorded where things happen
//! (`relay.rs`, `server.rs`, `daemon.rs`); the gauges that are read rather than
//! counted (calls in flight per target, unknown transfers in the journal) are
//! refreshed by [`refresh`] before each scrape and by the 5 s housekeeping loop.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

use crate::journal::State as RowState;
use crate::relay::Hub;

/// Telegrams answered, by `tx_code` and standard `code`.
pub const TELEGRAMS: &str = "relayhub_telegrams_total";
/// Time from reading a telegram whole to its answer, by `tx_code`.
pub const TELEGRAM_DURATION: &str = "relayhub_telegram_duration_seconds";
/// Time spent calling the core (retries included), by `target` and `operation`.
pub const CORE_CALL_DURATION: &str = "relayhub_core_call_duration_seconds";
/// Calls to a target running now, by `target`.
pub const CORE_IN_FLIGHT: &str = "relayhub_core_in_flight";
/// Calls refused because a target's bulkhead stayed full, by `target`.
pub const BULKHEAD_REJECTIONS: &str = "relayhub_bulkhead_rejections_total";
/// Retries of a call inside one telegram, by `target` and `operation`.
pub const CORE_RETRIES: &str = "relayhub_core_retries_total";
/// Channel connections open now.
pub const OPEN_CONNECTIONS: &str = "relayhub_open_connections";
/// Channel connections closed at once because `max_connections` were open.
pub const CONNECTIONS_REFUSED: &str = "relayhub_connections_refused_total";
/// Transfers the journal holds as unknown (answered E901, not yet settled).
pub const JOURNAL_UNKNOWN: &str = "relayhub_journal_unknown";
/// SIGHUP reloads, by `result` (`ok` or `refused`).
pub const CONFIG_RELOADS: &str = "relayhub_config_reloads_total";
/// Journal calls on the telegram path that failed or outlived the budget, by
/// `stage` (`claim`: the transfer was not sent, E903; `outcome`: the answer
/// was given but not recorded).
pub const JOURNAL_ERRORS: &str = "relayhub_journal_errors_total";

/// The `tx_code` label of a telegram whose tx code has no route (or whose
/// header is unreadable): a channel cannot create label values at will.
pub const UNROUTED_TX: &str = "other";

/// Longest a scrape waits for the journal count; past it the last value stays.
const REFRESH_LIMIT: Duration = Duration::from_secs(1);

/// The process-wide Prometheus recorder, installed on first use.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ];
            let builder = PrometheusBuilder::new()
                .set_buckets(&buckets)
                .expect("bucket list is not empty");
            match builder.install_recorder() {
                Ok(handle) => handle,
                // Another recorder is installed (an embedding program's): keep a
                // private one so /metrics still answers.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}

/// Installs the recorder and describes every metric (the `# HELP` lines), once
/// per process. Series without labels start at zero so they show from the first
/// scrape. Called by [`crate::daemon::Daemon::start`].
pub fn describe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        metrics_handle();
        describe_counter!(
            TELEGRAMS,
            Unit::Count,
            "Telegrams answered, by tx code (`other` for codes without a route) and standard response code."
        );
        describe_histogram!(
            TELEGRAM_DURATION,
            Unit::Seconds,
            "Time from reading a telegram whole to its answer (the hub's latency, bounded by the budget), by tx code."
        );
        describe_histogram!(
            CORE_CALL_DURATION,
            Unit::Seconds,
            "Time spent calling the core for one telegram, bulkhead wait and retries included, by target and operation."
        );
        describe_gauge!(
            CORE_IN_FLIGHT,
            Unit::Count,
            "Calls to the target running now (late-answer calls included), by target."
        );
        describe_counter!(
            BULKHEAD_REJECTIONS,
            Unit::Count,
            "Calls not sent because the target's bulkhead stayed full for queue_wait_ms (answered E903), by target."
        );
        describe_counter!(
            CORE_RETRIES,
            Unit::Count,
            "Retries inside one telegram (connects that sent nothing; inquiries), by target and operation."
        );
        describe_gauge!(
            OPEN_CONNECTIONS,
            Unit::Count,
            "Channel connections open now."
        );
        describe_counter!(
            CONNECTIONS_REFUSED,
            Unit::Count,
            "Channel connections closed at once because max_connections were open."
        );
        describe_gauge!(
            JOURNAL_UNKNOWN,
            Unit::Count,
            "Transfers the journal holds as unknown (answered E901, not settled yet); reconcile with `relayhub journal reconcile`."
        );
        describe_counter!(
            CONFIG_RELOADS,
            Unit::Count,
            "Configuration reloads (SIGHUP), by result: ok or refused (the previous configuration stays)."
        );
        describe_counter!(
            JOURNAL_ERRORS,
            Unit::Count,
            "Journal calls on the telegram path that failed or outlived the budget, by stage: claim (transfer not sent, E903) or outcome (answered but not recorded)."
        );
        metrics::gauge!(OPEN_CONNECTIONS).increment(0.0);
        metrics::gauge!(JOURNAL_UNKNOWN).increment(0.0);
        metrics::counter!(CONNECTIONS_REFUSED).increment(0);
        for result in ["ok", "refused"] {
            metrics::counter!(CONFIG_RELOADS, "result" => result).increment(0);
        }
    });
}

/// Starts the per-target series at zero, so "no rejections" reads as 0 rather
/// than as a missing series.
pub fn register_targets(hub: &Hub) {
    for t in hub.targets() {
        let name = t.name.clone();
        metrics::counter!(BULKHEAD_REJECTIONS, "target" => name.clone()).increment(0);
        for op in ["transfer", "inquiry"] {
            metrics::counter!(CORE_RETRIES, "target" => name.clone(), "operation" => op)
                .increment(0);
        }
        metrics::gauge!(CORE_IN_FLIGHT, "target" => name).set(t.in_flight() as f64);
    }
}

/// Sets the gauges that are read rather than counted: calls in flight per
/// target, and unknown transfers in the journal.
pub async fn refresh(hub: &Hub) {
    for t in hub.targets() {
        metrics::gauge!(CORE_IN_FLIGHT, "target" => t.name.clone()).set(t.in_flight() as f64);
    }
    match hub.journal().count(RowState::Unknown).await {
        Ok(n) => metrics::gauge!(JOURNAL_UNKNOWN).set(n as f64),
        Err(e) => tracing::warn!(%e, "cannot count unknown transfers in the journal"),
    }
}

/// The hub, once start-up has built it: the admin listener runs before it exists.
pub type HubCell = Arc<OnceLock<Arc<Hub>>>;

#[derive(Clone)]
struct AdminState {
    ready: Arc<AtomicBool>,
    metrics: PrometheusHandle,
    hub: HubCell,
}

/// Serves the admin endpoints until `shutdown` resolves. `/readyz` answers 200
/// once `ready` is set; `/metrics` refreshes the read gauges of `hub` (when
/// start-up has put one there) before rendering.
pub async fn serve(
    listener: TcpListener,
    ready: Arc<AtomicBool>,
    hub: HubCell,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = AdminState {
        ready,
        metrics: metrics_handle(),
        hub,
    };
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn metrics(State(s): State<AdminState>) -> String {
    if let Some(hub) = s.hub.get() {
        // A journal that does not answer in time must not hang the scrape.
        let _ = tokio::time::timeout(REFRESH_LIMIT, refresh(hub)).await;
    }
    s.metrics.render()
}

async fn readyz(State(s): State<AdminState>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}
