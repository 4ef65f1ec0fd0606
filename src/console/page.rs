//! The console page: one HTML document with inline CSS and script, no
//! external asset. The server puts the current data in the page (as JSON the
//! script reads at once); the script then polls `/api/overview` and
//! `/api/unknown` every second and redraws. Every value reaches the document
//! through `textContent`, never as markup. Nothing on the page sends anything
//! but GETs.

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::RowView;

/// What the page starts with.
pub struct Data {
    pub overview: Option<Value>,
    pub unknown: Option<Vec<RowView>>,
    pub guid: Option<String>,
    /// The searched transfer, or the status its look-up answered.
    pub transfer: Option<Result<Value, StatusCode>>,
}

/// JSON safe inside a `<script>` element: no `<`, `>` or `&` survives as such.
fn script_json(v: &Value) -> String {
    v.to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

pub fn render(d: &Data) -> String {
    let transfer = match &d.transfer {
        None => Value::Null,
        Some(Ok(v)) => json!({"ok": v}),
        Some(Err(status)) => json!({"status": status.as_u16()}),
    };
    let initial = json!({
        "overview": d.overview,
        "unknown": d.unknown.as_ref().map(|rows| json!({"transfers": rows})),
        "guid": d.guid,
        "transfer": transfer,
    });
    PAGE.replace("/*INITIAL*/null", &script_json(&initial))
}

const PAGE: &str = r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>relayhub console</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; background: #f4f5f7; color: #1d2330; }
header { background: #1d2330; color: #fff; padding: 10px 20px; display: flex; gap: 24px; align-items: baseline; flex-wrap: wrap; }
header h1 { font-size: 18px; margin: 0; }
header .state { font-weight: 600; }
header .draining { color: #ffb84d; }
main { display: grid; grid-template-columns: repeat(auto-fit, minmax(380px, 1fr)); gap: 16px; padding: 16px 20px; }
section { background: #fff; border-radius: 6px; padding: 12px 16px; box-shadow: 0 1px 2px rgba(0,0,0,.08); }
section.wide { grid-column: 1 / -1; }
h2 { font-size: 15px; margin: 0 0 8px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #e6e8ec; font-variant-numeric: tabular-nums; }
th { font-weight: 600; color: #5a6272; }
td.n { text-align: right; }
.ok { color: #147a3d; } .biz { color: #8a5a00; } .err { color: #b3261e; font-weight: 600; }
.muted { color: #7a8292; }
form { display: flex; gap: 8px; }
input[type=text] { flex: 1; padding: 5px 8px; font: inherit; }
button { padding: 5px 12px; font: inherit; }
.over { color: #b3261e; font-weight: 600; }
</style>
</head>
<body>
<header>
  <h1>relayhub</h1>
  <span id="hub-state" class="state">…</span>
  <span id="rules" class="muted"></span>
  <span id="updated" class="muted" data-polls="0"></span>
</header>
<main>
  <section>
    <h2>Answer codes</h2>
    <table id="codes"><thead><tr><th>code</th><th class="n">last minute</th><th class="n">since start</th></tr></thead><tbody></tbody></table>
  </section>
  <section>
    <h2>Latency (last minute)</h2>
    <table id="latency"><tbody></tbody></table>
    <p class="muted">Upper bounds of latency buckets, in ms.</p>
  </section>
  <section class="wide">
    <h2>Tx codes (last minute)</h2>
    <table id="tx"><thead><tr><th>tx code</th><th class="n">per second</th><th>answer codes</th></tr></thead><tbody></tbody></table>
  </section>
  <section class="wide">
    <h2>Targets</h2>
    <table id="targets"><thead><tr><th>target</th><th>URLs</th><th class="n">in flight</th><th class="n">capacity</th><th>errors (last minute)</th></tr></thead><tbody></tbody></table>
  </section>
  <section class="wide">
    <h2>Unknown transfers <span id="unknown-count" class="muted"></span></h2>
    <table id="unknown"><thead><tr><th>GUID</th><th>tx code</th><th class="n">age (s)</th><th class="n">attempts</th><th>last error</th><th>URL</th><th>request (masked)</th></tr></thead><tbody></tbody></table>
  </section>
  <section class="wide" id="search">
    <h2>Transfer by GUID</h2>
    <form method="get" action="/" id="search-form">
      <input type="text" name="guid" id="guid" placeholder="GUID" maxlength="64" autocomplete="off">
      <button type="submit">Search</button>
    </form>
    <div id="transfer"></div>
  </section>
</main>
<script>
"use strict";
const INITIAL = /*INITIAL*/null;
const params = new URLSearchParams(location.search);
const token = params.get("token");
const headers = token ? { "Authorization": "Bearer " + token } : {};
let polls = 0;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
  return tr;
}
function num(v) { return el("td", v, "n"); }
function codeClass(c) { return c === "0000" ? "ok" : (c && c[0] === "E" ? "err" : "biz"); }
function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows);
}
function time(ms) { return ms ? new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : ""; }
function codesText(m) { return Object.entries(m || {}).map(([c, n]) => c + " " + n).join(", "); }

function drawOverview(o) {
  if (!o) return;
  const st = document.getElementById("hub-state");
  st.textContent = o.draining ? "draining" : "serving";
  st.className = "state" + (o.draining ? " draining" : "");
  document.getElementById("rules").textContent =
    "rules v" + o.rules.version + " since " + time(o.rules.since_ms) + " · journal " + o.journal.kind +
    " · budget " + o.budget_ms + " ms";
  const codes = new Set([...Object.keys(o.last_minute.by_code), ...Object.keys(o.since_start.by_code)]);
  fill("codes", [...codes].sort().map(c => {
    const tr = row([el("td", c, codeClass(c)), num(o.last_minute.by_code[c] || 0), num(o.since_start.by_code[c] || 0)]);
    tr.dataset.code = c;
    tr.cells[1].className += " minute";
    tr.cells[2].className += " total";
    return tr;
  }));
  const lat = [["p50", o.last_minute.p50_ms], ["p90", o.last_minute.p90_ms], ["p99", o.last_minute.p99_ms]];
  fill("latency", lat.map(([k, v]) => {
    const td = el("td", v === null ? (o.last_minute.total ? "> 30000" : "–") : "≤ " + v, "n");
    if (v === null ? o.last_minute.total > 0 : v > o.budget_ms) td.className += " over";
    return row([el("th", k), td, el("td", "budget " + o.budget_ms, "muted")]);
  }));
  fill("tx", Object.entries(o.last_minute.by_tx).map(([tx, m]) => {
    const n = Object.values(m).reduce((a, b) => a + b, 0);
    const secs = o.last_minute.total ? o.last_minute.total / o.last_minute.per_second : 1;
    return row([tx, num((n / secs).toFixed(1)), codesText(m)]);
  }));
  fill("targets", o.targets.map(t => {
    const e = el("td", codesText(t.errors_last_minute), Object.keys(t.errors_last_minute).length ? "err" : "");
    return row([t.name, t.urls.join(" "), num(t.in_flight), num(t.capacity), e]);
  }));
  document.getElementById("unknown-count").textContent =
    o.journal.unknown === null ? "" : "(" + o.journal.unknown + ")";
}

function drawUnknown(u) {
  if (!u) return;
  fill("unknown", u.transfers.map(r => {
    const a = el("a", r.guid);
    a.href = "?guid=" + encodeURIComponent(r.guid) + (token ? "&token=" + encodeURIComponent(token) : "");
    const g = el("td"); g.appendChild(a);
    const fields = r.fields ? Object.entries(r.fields).map(([k, v]) => k + "=" + v).join(" ") : "";
    const tr = row([g, r.tx_code, num(r.age_s), num(r.attempts), r.last_error || "", r.url || "", fields]);
    tr.dataset.guid = r.guid;
    return tr;
  }));
}

function drawTransfer(guid, t) {
  const box = document.getElementById("transfer");
  box.replaceChildren();
  if (!guid) return;
  document.getElementById("guid").value = guid;
  if (!t || !t.ok) {
    const msg = t && t.status === 404 ? "not in the journal" : "look-up failed (" + (t ? t.status : "?") + ")";
    box.appendChild(el("p", guid + ": " + msg, "err"));
    box.dataset.found = "false";
    return;
  }
  const r = t.ok.row;
  box.dataset.found = "true";
  box.dataset.guid = r.guid;
  box.dataset.state = r.state;
  const tbl = el("table"); tbl.id = "transfer-row";
  const facts = [["GUID", r.guid], ["tx code", r.tx_code], ["state", r.state], ["code", r.code || ""],
    ["attempts", r.attempts], ["age (s)", r.age_s], ["created", time(r.created_ms)], ["updated", time(r.updated_ms)],
    ["last error", r.last_error || ""], ["URL", r.url || ""]];
  for (const [k, v] of facts) tbl.appendChild(row([el("th", k), el("td", v)]));
  box.appendChild(tbl);
  box.appendChild(el("h2", "Telegrams (trace ids, as in the log lines and the core's traceparent)"));
  const tr = el("table"); tr.id = "telegrams";
  tr.appendChild(row([el("th", "answered"), el("th", "code"), el("th", "trace id")]));
  for (const x of t.ok.telegrams) {
    const r2 = row([time(x.at_ms), el("td", x.code, codeClass(x.code)), el("td", x.trace_id, "trace")]);
    r2.dataset.trace = x.trace_id;
    tr.appendChild(r2);
  }
  if (!t.ok.telegrams.length) tr.appendChild(row([el("td", "none since the hub started", "muted")]));
  box.appendChild(tr);
  box.appendChild(el("h2", "History"));
  const h = el("table"); h.id = "history";
  h.appendChild(row([el("th", "at"), el("th", "state"), el("th", "code"), el("th", "note")]));
  for (const e of t.ok.history) h.appendChild(row([time(e.at_ms), e.state, el("td", e.code || "", codeClass(e.code)), e.note]));
  box.appendChild(h);
}

async function get(path) {
  const r = await fetch(path, { headers, cache: "no-store" });
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}

async function poll() {
  try {
    const [o, u] = await Promise.all([get("/api/overview"), get("/api/unknown")]);
    drawOverview(o);
    drawUnknown(u);
    polls += 1;
    const up = document.getElementById("updated");
    up.dataset.polls = String(polls);
    up.textContent = "updated " + time(o.now_ms);
    up.className = "muted";
  } catch (e) {
    const up = document.getElementById("updated");
    up.textContent = "not updated: " + e.message;
    up.className = "err";
  }
}

if (token) {
  const hidden = el("input"); hidden.type = "hidden"; hidden.name = "token"; hidden.value = token;
  document.getElementById("search-form").appendChild(hidden);
}
if (INITIAL) {
  drawOverview(INITIAL.overview);
  drawUnknown(INITIAL.unknown);
  drawTransfer(INITIAL.guid, INITIAL.transfer);
}
poll();
setInterval(poll, 1000);
</script>
</body>
</html>
"##;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_cannot_close_the_script() {
        let page = render(&Data {
            overview: None,
            unknown: None,
            guid: Some("</script><b>x&".into()),
            transfer: None,
        });
        assert!(!page.contains("</script><b>"));
        assert!(page.contains("\\u003c/script\\u003e\\u003cb\\u003ex\\u0026"));
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "no external asset"
        );
    }
}
