//! The admin HTTP endpoints, on their own address off the telegram port:
//! `GET /metrics` (Prometheus text), `GET /healthz` (the process runs),
//! `GET /readyz` (listeners bound, config and journal loaded; it does not depend
//! on the core's health, so a core outage does not take the hub out of a load
//! balancer that could still answer E902 truthfully), and
//! `POST /journal/reconcile`, which has the hub settle its unknown transfers.
//!
//! Reconciling goes through the hub while it runs because only the hub knows
//! which of its calls are still running (late-answer window): another process
//! would believe the core's "never received" for a POST that is still on its
//! way, and the channel's resend would be posted twice. `relayhub journal
//! reconcile --admin ADDR` calls this endpoint.
//!
//! Every metric the hub records is named and described in
//! [`crate::metric_names`]; [`describe`] installs the recorder and hands it those
//! descriptions, so `/metrics` carries a `# HELP` line for each. Counters and histograms are recorded where things happen
//! (`relay.rs`, `server.rs`, `daemon.rs`); the gauges that are read rather than
//! counted (calls in flight per target, unknown transfers in the journal) are
//! refreshed by [`refresh`] before each scrape and by the 5 s housekeeping loop.
//!
//! The operator's console ([`crate::console`]) is served here too: `/` and
//! `/api/...`. With an admin token configured, every endpoint but `/healthz`
//! and `/readyz` answers 401 unless the request carries the token, as
//! `Authorization: Bearer <token>` or as the `token` query parameter (so a
//! browser can open the page).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;

use crate::metric_names::{BULKHEAD_REJECTIONS, CORE_IN_FLIGHT, CORE_RETRIES, JOURNAL_UNKNOWN};
use axum::Json;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

use crate::journal::{JournalError, State as RowState};
use crate::outcome::Code;
use crate::relay::Hub;

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

/// How often the recorder's histogram samples are folded into their buckets.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the recorder, describes every metric (the `# HELP` lines) and
/// starts its upkeep ([`keep_metrics_up`]), once per process. Called by
/// [`crate::daemon::Daemon::start`].
pub fn describe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        metrics_handle();
        crate::metric_names::describe_all();
        if let Err(e) = keep_metrics_up(UPKEEP_EVERY) {
            tracing::error!(%e, "cannot start the metrics upkeep thread; histogram samples are folded only when /metrics is scraped");
        }
    });
}

/// Folds the recorder's histogram samples into their buckets every `every`,
/// on a thread of its own for the life of the process. The recorder keeps
/// each sample (every telegram's duration, every core call's) until a
/// scrape of `/metrics` or this upkeep folds it: a hub nobody scrapes (no
/// admin listener) would otherwise hold 16 bytes per telegram for good.
fn keep_metrics_up(every: Duration) -> std::io::Result<()> {
    let handle = metrics_handle();
    std::thread::Builder::new()
        .name("relayhub-metrics".into())
        .stack_size(256 * 1024)
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                handle.run_upkeep();
            }
        })
        .map(|_| ())
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
        Err(e) => tracing::error!(%e, "cannot count unknown transfers in the journal"),
    }
}

/// Asks the core about every unknown transfer of `hub`'s journal and records
/// the answers ([`Hub::reconcile`]); returns each GUID with the code its row
/// says now. That is the journal's word, not the inquiry's: a shared journal
/// does not record another hub's "never received" while the owner's lease
/// runs, and such a row is still E901.
pub async fn reconcile(hub: &Hub) -> Result<Vec<(String, Code)>, JournalError> {
    let report = hub.reconcile().await?;
    let mut out = Vec::with_capacity(report.len());
    for (guid, code) in report {
        let now = match hub.journal().get(&guid).await? {
            Some(row) if row.state == RowState::Unknown => Code::UNKNOWN,
            _ => code,
        };
        out.push((guid, now));
    }
    Ok(out)
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
/// start-up has put one there) before rendering. With a `token`, everything
/// but `/healthz` and `/readyz` requires it.
pub async fn serve(
    listener: TcpListener,
    ready: Arc<AtomicBool>,
    hub: HubCell,
    token: Option<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::console_stats::stats();
    let state = AdminState {
        ready,
        metrics: metrics_handle(),
        hub: hub.clone(),
    };
    let console = Router::new()
        .route("/", get(crate::console::index))
        .route("/api/overview", get(crate::console::overview))
        .route("/api/unknown", get(crate::console::unknown))
        .route("/api/transfer/{guid}", get(crate::console::transfer))
        .with_state(crate::console::Console::new(hub));
    // Everything but the health checks; reconcile changes rows, so it is
    // guarded like the rest (the console's pages only read).
    let guarded = Router::new()
        .route("/metrics", get(metrics))
        .route("/journal/reconcile", post(journal_reconcile))
        .with_state(state.clone())
        .merge(console)
        .layer(middleware::from_fn_with_state(
            Arc::new(token),
            require_token,
        ));
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
        .merge(guarded)
        .layer(middleware::from_fn(crate::admin_listener::answering));
    let listener = crate::admin_listener::AdminListener::new(
        listener,
        crate::admin_listener::MAX_ADMIN_CONNECTIONS,
        crate::admin_listener::ADMIN_IDLE,
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<crate::admin_listener::Busy>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// Lets a request through when no token is configured or when it carries it.
async fn require_token(
    State(token): State<Arc<Option<String>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = token.as_deref() else {
        return next.run(request).await;
    };
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim().to_string());
    let given = bearer.or_else(|| crate::console::query_param(request.uri(), "token"));
    match given {
        Some(g) if same(g.as_bytes(), token.as_bytes()) => next.run(request).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "admin token required\n",
        )
            .into_response(),
    }
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn metrics(State(s): State<AdminState>) -> String {
    if let Some(hub) = s.hub.get() {
        // A journal that does not answer in time must not hang the scrape.
        let _ = tokio::time::timeout(REFRESH_LIMIT, refresh(hub)).await;
    }
    s.metrics.render()
}

async fn readyz(State(s): State<AdminState>) -> (StatusCode, String) {
    if !s.ready.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "starting\n".into());
    }
    // A journal that refuses every claim until a restart: this hub answers
    // E903 to every new GUID, so a balancer should send elsewhere.
    // The reason (paths, the OS's words) is in the hub's ERROR line, not
    // here: this endpoint answers without the admin token.
    let Some(hub) = s.hub.get() else {
        return (StatusCode::OK, "ready\n".into());
    };
    if hub.journal().refusal().is_some() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "journal failed: every transfer is refused until a restart (see the log)\n".into(),
        );
    }
    // Draining: the telegram listener is closed, so its connects are
    // refused and a balancer retries them elsewhere. Still 200: a balancer that marks a
    // server down on a failed check and cuts its sessions (HAProxy's
    // `on-marked-down shutdown-sessions`, docs/scale-out.md) would cut the
    // connections whose answers the drain is finishing. The body says so.
    if hub.is_draining() {
        return (
            StatusCode::OK,
            "draining: the telegram listener is closed; finishing the telegrams in flight\n".into(),
        );
    }
    (StatusCode::OK, "ready\n".into())
}

/// `POST /journal/reconcile`: 200 with a JSON object of GUID -> code (`0000`,
/// a B-code, `E904` or `E901`); 503 while the hub is starting; 500 with the
/// reason when the journal cannot be read or written.
async fn journal_reconcile(State(s): State<AdminState>) -> Response {
    let Some(hub) = s.hub.get() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response();
    };
    match reconcile(hub).await {
        Ok(report) => {
            let codes: serde_json::Map<String, serde_json::Value> = report
                .into_iter()
                .map(|(guid, code)| (guid, code.as_str().into()))
                .collect();
            Json(serde_json::Value::Object(codes)).into_response()
        }
        Err(e) => {
            tracing::error!(%e, "reconcile through the admin endpoint failed");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
        }
    }
}
