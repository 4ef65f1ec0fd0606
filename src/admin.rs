//! The admin HTTP endpoints, on their own address off the telegram port:
//! `GET /metrics` (Prometheus text), `GET /healthz` (the process runs) and
//! `GET /readyz` (listeners bound, config and journal loaded; it does not depend
//! on the core's health, so a core outage does not take the hub out of a load
//! balancer that could still answer E902 truthfully).

use std::future::Future;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

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

#[derive(Clone)]
struct AdminState {
    ready: Arc<AtomicBool>,
    metrics: PrometheusHandle,
    extra: Arc<dyn Fn() + Send + Sync>,
}

/// Serves the admin endpoints until `shutdown` resolves. `refresh` runs before
/// each scrape to set gauges that are read rather than counted.
pub async fn serve(
    listener: TcpListener,
    ready: Arc<AtomicBool>,
    refresh: Arc<dyn Fn() + Send + Sync>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = AdminState {
        ready,
        metrics: metrics_handle(),
        extra: refresh,
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
    (s.extra)();
    s.metrics.render()
}

async fn readyz(State(s): State<AdminState>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}
