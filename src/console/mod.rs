//! The operator's console on the admin listener: read-only JSON endpoints and
//! one server-rendered page that polls them (no build step, no external
//! assets: it works on an air-gapped network).
//!
//! * `GET /api/overview`: rates by answer code and tx code (last minute and
//!   since start), latency percentiles against the budget, targets, unknown
//!   transfers, the rules version, draining;
//! * `GET /api/unknown`: the journal's unknown transfers;
//! * `GET /api/transfer/{guid}`: one journal row and its history;
//! * `GET /`: the page (`/?guid=...` renders that transfer too).
//!
//! Nothing here changes state. The journal row holds no account number, so
//! none can be shown; request fields reach the page only masked.

mod page;

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{Html, IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};

use crate::journal::{Event, Row, State as RowState, now_ms};
use crate::relay::Hub;

use crate::console_stats::{stats, traces};

/// The hub, once start-up has built it (the admin listener runs before it exists).
pub type HubCell = Arc<std::sync::OnceLock<Arc<Hub>>>;

/// Most unknown transfers one answer lists.
pub const UNKNOWN_LIMIT: usize = 200;

/// What the console handlers share.
#[derive(Clone, Default)]
pub struct Console {
    pub hub: HubCell,
}

impl Console {
    pub fn new(hub: HubCell) -> Console {
        Console { hub }
    }
}

/// A journal row as the console shows it.
#[derive(Debug, Serialize)]
pub struct RowView {
    pub guid: String,
    pub tx_code: String,
    pub state: &'static str,
    pub code: Option<String>,
    pub attempts: u32,
    pub age_s: i64,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub last_error: Option<String>,
    pub url: Option<String>,
    /// The request fields as the layout masks them for the log (accounts keep
    /// their last four characters), when a telegram of this process carried them.
    pub fields: Option<Value>,
}

impl RowView {
    fn new(r: &Row, now: i64) -> RowView {
        RowView {
            guid: r.guid.clone(),
            tx_code: r.tx_code.clone(),
            state: r.state.as_str(),
            code: r.code.clone(),
            attempts: r.attempts,
            age_s: (now - r.created_ms).max(0) / 1000,
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
            last_error: r.last_error.clone(),
            url: r.url.clone(),
            fields: crate::console_stats::traces().fields_of(&r.guid),
        }
    }
}

/// One history entry as the console shows it.
#[derive(Debug, Serialize)]
pub struct EventView {
    pub at_ms: i64,
    pub state: &'static str,
    pub code: Option<String>,
    pub note: String,
}

impl From<&Event> for EventView {
    fn from(e: &Event) -> EventView {
        EventView {
            at_ms: e.at_ms,
            state: e.state.as_str(),
            code: e.code.clone(),
            note: e.note.clone(),
        }
    }
}

fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"error": "the hub is starting"})),
    )
        .into_response()
}

fn journal_failed(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"error": format!("journal: {e}")})),
    )
        .into_response()
}

/// `GET /api/overview`.
pub async fn overview(State(c): State<Console>) -> Response {
    let Some(hub) = c.hub.get() else {
        return unavailable();
    };
    match overview_value(hub).await {
        Ok(v) => Json(v).into_response(),
        Err(r) => r,
    }
}

async fn overview_value(hub: &Hub) -> Result<Value, Response> {
    let (minute, all) = stats().snapshot();
    let (version, since_ms) = hub.rules_version();
    let budget_ms = hub.budget().as_millis() as u64;
    let targets: Vec<Value> = hub
        .targets()
        .iter()
        .map(|t| {
            // Errors of the last minute of the telegrams routed to this
            // target, by the rules each was answered under.
            let errors = minute
                .errors_by_target
                .get(&t.name)
                .cloned()
                .unwrap_or_default();
            json!({
                "name": t.name,
                "urls": t.urls(),
                "in_flight": t.in_flight(),
                "capacity": t.capacity(),
                "errors_last_minute": errors,
            })
        })
        .collect();
    let unknown = match tokio::time::timeout(
        std::time::Duration::from_secs(1),
        hub.journal().count(RowState::Unknown),
    )
    .await
    {
        Ok(Ok(n)) => Some(n),
        Ok(Err(e)) => return Err(journal_failed(e)),
        Err(_) => None,
    };
    Ok(json!({
        "now_ms": now_ms(),
        "started_ms": stats().started_ms(),
        "draining": hub.is_draining(),
        "budget_ms": budget_ms,
        "rules": {"version": version, "since_ms": since_ms},
        "journal": {"kind": hub.journal().kind(), "unknown": unknown},
        "last_minute": minute,
        "since_start": all,
        "targets": targets,
    }))
}

/// `GET /api/unknown`.
pub async fn unknown(State(c): State<Console>) -> Response {
    let Some(hub) = c.hub.get() else {
        return unavailable();
    };
    match unknown_rows(hub).await {
        Ok(rows) => Json(json!({"limit": UNKNOWN_LIMIT, "transfers": rows})).into_response(),
        Err(r) => r,
    }
}

async fn unknown_rows(hub: &Hub) -> Result<Vec<RowView>, Response> {
    let rows = hub
        .journal()
        .list(RowState::Unknown, UNKNOWN_LIMIT)
        .await
        .map_err(journal_failed)?;
    let now = now_ms();
    Ok(rows.iter().map(|r| RowView::new(r, now)).collect())
}

/// A GUID as the search accepts it: 1 to 64 ASCII letters, digits, `-`, `_`.
fn check_guid(guid: &str) -> Result<(), String> {
    if guid.is_empty() || guid.len() > 64 {
        return Err(format!(
            "guid: {} characters; 1 to 64 expected",
            guid.chars().count()
        ));
    }
    if let Some((at, ch)) = guid
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(format!(
            "guid: byte {at}: {ch:?} is not a letter, digit, - or _"
        ));
    }
    Ok(())
}

async fn transfer_value(hub: &Hub, guid: &str) -> Result<Value, Response> {
    if let Err(e) = check_guid(guid) {
        return Err((StatusCode::BAD_REQUEST, Json(json!({"error": e}))).into_response());
    }
    let row = hub.journal().get(guid).await.map_err(journal_failed)?;
    let Some(row) = row else {
        return Err((
            StatusCode::NOT_FOUND,
            Json(json!({"error": format!("guid {guid} is not in the journal")})),
        )
            .into_response());
    };
    let history = hub.journal().history(guid).await.map_err(journal_failed)?;
    let history: Vec<EventView> = history.iter().map(EventView::from).collect();
    Ok(json!({
        "row": RowView::new(&row, now_ms()),
        "telegrams": traces().of(guid),
        "history": history,
    }))
}

/// `GET /api/transfer/{guid}`.
pub async fn transfer(State(c): State<Console>, Path(guid): Path<String>) -> Response {
    let Some(hub) = c.hub.get() else {
        return unavailable();
    };
    match transfer_value(hub, &guid).await {
        Ok(v) => Json(v).into_response(),
        Err(r) => r,
    }
}

/// The value of `name` in a query string, percent-decoded (`+` is a space).
pub fn query_param(uri: &Uri, name: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                match (
                    b.get(i + 1).and_then(|&c| hex(c)),
                    b.get(i + 2).and_then(|&c| hex(c)),
                ) {
                    (Some(h), Some(l)) => {
                        out.push(h * 16 + l);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET /`: the page, with the current data rendered in (the script then
/// refreshes it every second); `?guid=` adds that transfer.
pub async fn index(State(c): State<Console>, uri: Uri) -> Response {
    let guid = query_param(&uri, "guid").filter(|g| !g.is_empty());
    let page = match c.hub.get() {
        Some(hub) => {
            let overview = overview_value(hub).await.ok();
            let unknown = unknown_rows(hub).await.ok();
            let transfer = match &guid {
                Some(g) => Some(match transfer_value(hub, g).await {
                    Ok(v) => Ok(v),
                    Err(r) => Err(r.status()),
                }),
                None => None,
            };
            page::render(&page::Data {
                overview,
                unknown,
                guid: guid.clone(),
                transfer,
            })
        }
        None => page::render(&page::Data {
            overview: None,
            unknown: None,
            guid,
            transfer: None,
        }),
    };
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            ),
        ],
        Html(page),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_check_names_the_byte() {
        assert!(check_guid("20240101-ABC_1").is_ok());
        assert_eq!(
            check_guid("ab<c").unwrap_err(),
            "guid: byte 2: '<' is not a letter, digit, - or _"
        );
        assert!(check_guid("").is_err());
        assert!(check_guid(&"a".repeat(65)).is_err());
    }

    #[test]
    fn query_params_are_decoded() {
        let uri: Uri = "/?guid=AB%2DC&token=x+y&bad=%zz&end=%4".parse().unwrap();
        assert_eq!(query_param(&uri, "guid").as_deref(), Some("AB-C"));
        assert_eq!(query_param(&uri, "token").as_deref(), Some("x y"));
        assert_eq!(query_param(&uri, "bad").as_deref(), Some("%zz"));
        assert_eq!(query_param(&uri, "end").as_deref(), Some("%4"));
        assert_eq!(query_param(&uri, "none"), None);
    }
}
