//! The operator's console, end to end: a real `relayhub serve` with an admin
//! token in front of the in-process corebank fixture, a mix of telegrams
//! (0000, B201, E901, E904), then the JSON endpoints over HTTP and the page in
//! headless Chromium (Debian's `chromium`), read back from the rendered DOM.
//!
//! Without `chromium` on the PATH the browser part is skipped with a message,
//! unless `CI=true`: there it fails (`.ci/run` installs the package).
//! `RELAYHUB_CONSOLE_SCREENSHOT=PATH` copies the screenshot there (how
//! docs/console.png is made).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common;
use crate::ops_support;

use common::{
    ACC2, ACC3, BANK, TempDir, exchange, guid, relayhub_bin, start_core, transfer, trf, trf_fields,
};
use corebank::{FaultMethod, FaultRule};
use ops_support::{Hub, PATIENCE};
use relayhub::client::Channel;
use relayhub::frame::PrefixMode;
use serde_json::Value;

const TOKEN: &str = "console-test-token-7f3a";
/// The wire grace of the hub under test: past it, "never received" is proof (E904).
const GRACE_MS: u64 = 800;

/// A GET with optional bearer token: status and body.
fn get(url: &str, bearer: Option<&str>) -> (u16, String) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(PATIENCE))
        .build()
        .new_agent();
    let mut req = agent.get(url);
    if let Some(t) = bearer {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let mut resp = req.call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap_or_default())
}

fn get_json(hub: &Hub, path: &str) -> Value {
    let (status, body) = get(&format!("http://{}{path}", hub.admin), Some(TOKEN));
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// Whether a browser run is possible; under `CI=true` it must be.
fn chromium_available() -> bool {
    let found = Command::new("sh")
        .args(["-c", "command -v chromium"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "chromium is not installed and CI=true: .ci/run installs it"
        );
        eprintln!("chromium not installed: the browser part of the console test is skipped");
    }
    found
}

/// Runs headless Chromium on `url` with `args` and a fresh profile in
/// `profile`; returns its stdout.
fn chromium(profile: std::path::PathBuf, url: &str, args: &[&str]) -> String {
    let child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn chromium");
    let out = wait_output(child);
    assert!(out.status.success(), "chromium {args:?} {url}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The output of a child, killed if it outlives a minute.
fn wait_output(child: std::process::Child) -> std::process::Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.expect("chromium output"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("chromium did not finish within a minute");
        }
    }
}

/// The text of the first element after `marker` whose opening tag contains
/// `class_part` (e.g. the `total` cell of a code's row).
fn cell_after(dom: &str, marker: &str, class_part: &str) -> Option<String> {
    let at = dom.find(marker)?;
    let rest = &dom[at..];
    let row_end = rest.find("</tr>")?;
    let row = &rest[..row_end];
    let c = row.find(class_part)?;
    let text = &row[c..];
    let start = text.find('>')? + 1;
    let end = text[start..].find('<')? + start;
    Some(text[start..end].to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_codes_unknown_transfers_and_a_guid_behind_a_token() {
    let dir = TempDir::new("console");
    let token_file = dir.join("admin.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let config = dir.join("relayhub.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nadmin_token_file = {:?}\n\n[[target]]\nname = \"core\"\nlate_answer_window_ms = 0\nwire_grace_ms = {GRACE_MS}\n",
            token_file.display().to_string()
        ),
    )
    .unwrap();

    let core = start_core().await;
    let core_url = core.url();
    let config_arg = config.display().to_string();
    let hub = Hub::for_core(&core_url, &["--config", &config_arg, "--budget-ms", "800"]).await;

    // The token: required everywhere but the probes, as a header or a query parameter.
    let base = format!("http://{}", hub.admin);
    for path in [
        "/",
        "/api/overview",
        "/api/unknown",
        "/api/transfer/X",
        "/metrics",
    ] {
        let (status, body) = get(&format!("{base}{path}"), None);
        assert_eq!(status, 401, "{path} without the token: {body}");
        let (status, _) = get(&format!("{base}{path}"), Some("wrong"));
        assert_eq!(status, 401, "{path} with a wrong token");
    }
    for path in ["/healthz", "/readyz"] {
        assert_eq!(get(&format!("{base}{path}"), None).0, 200, "{path}");
    }
    assert_eq!(get(&format!("{base}/metrics"), Some(TOKEN)).0, 200);
    assert_eq!(get(&format!("{base}/?token={TOKEN}"), None).0, 200);
    // The scheme is case-insensitive.
    let lower = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(PATIENCE))
        .build()
        .new_agent()
        .get(format!("{base}/metrics"))
        .header("Authorization", format!("bearer {TOKEN}"))
        .call()
        .unwrap();
    assert_eq!(lower.status().as_u16(), 200, "bearer in lower case");

    // `journal reconcile` through the hub shows the token it is given, or
    // the one the hub's config names; without one it says how to give it.
    let reconcile = |extra: &[&str]| {
        let mut args = vec!["journal", "reconcile", "--admin", hub.admin.as_str()];
        args.extend_from_slice(extra);
        Command::new(relayhub_bin())
            .args(&args)
            .output()
            .expect("run relayhub journal reconcile")
    };
    let refused = reconcile(&[]);
    let said = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(
        !refused.status.success() && said.contains("401") && said.contains("--admin-token-file"),
        "{said}"
    );
    // Two reloads with the console not asked in between: version 3 (it
    // counted only the reloads it happened to see before).
    for n in 1..=2 {
        hub.signal("HUP");
        let until = std::time::Instant::now() + PATIENCE;
        while hub.stderr().matches("reload: new routes").count() < n {
            assert!(std::time::Instant::now() < until, "no reload line");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let overview = get_json(&hub, "/api/overview");
    assert_eq!(overview["rules"]["version"], 3, "{overview}");

    let token_arg = token_file.display().to_string();
    for extra in [
        ["--admin-token-file", &token_arg],
        ["--config", &config_arg],
    ] {
        let out = reconcile(&extra);
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success() && said.contains("reconciled by the hub"),
            "{extra:?}: {said}"
        );
    }

    // The mix; every answer is tallied as the channel saw it.
    let mut sent: BTreeMap<String, u64> = BTreeMap::new();
    let mut ch = Channel::connect(&hub.addr, PrefixMode::Ascii)
        .await
        .expect("connect to the hub");
    let mut send = async |t: Vec<u8>, want: &str| {
        let a = exchange(&mut ch, &t).await;
        assert_eq!(a.code, want, "{a:?}");
        *sent.entry(a.code.clone()).or_insert(0) += 1;
    };
    for _ in 0..3 {
        send(transfer(&guid("CONOK"), 1000), "0000").await;
    }
    send(
        trf(&guid("CONB2"), &trf_fields(ACC3, BANK, ACC2, 600_000, "")),
        "B201",
    )
    .await;
    // Unknown: the core holds the POST past the budget, with no late window.
    let unknown = guid("CON901");
    core.add_fault(FaultRule::guid(&unknown).delay_ms(10_000).times(1));
    send(transfer(&unknown, 1000), "E901").await;
    // Never received: a 502 in front of the core, then, past the wire grace,
    // the resend's inquiry proves it (E901 first, then E904).
    let lost = guid("CON904");
    core.add_fault(
        FaultRule::guid(&lost)
            .method(FaultMethod::Post)
            .status(502)
            .times(1),
    );
    send(transfer(&lost, 2000), "E901").await;
    // Waiting out the grace is the condition under test, not synchronisation.
    tokio::time::sleep(Duration::from_millis(GRACE_MS + 50)).await;
    send(transfer(&lost, 2000), "E904").await;
    let expected: BTreeMap<String, u64> = [("0000", 3), ("B201", 1), ("E901", 2), ("E904", 1)]
        .into_iter()
        .map(|(c, n)| (c.to_string(), n))
        .collect();
    assert_eq!(sent, expected);

    // The JSON endpoints.
    let o = get_json(&hub, "/api/overview");
    for period in ["last_minute", "since_start"] {
        let by_code: BTreeMap<String, u64> =
            serde_json::from_value(o[period]["by_code"].clone()).unwrap();
        assert_eq!(by_code, expected, "{period}: {o}");
        assert_eq!(o[period]["by_tx"]["TRF001"]["E904"], 1, "{o}");
    }
    assert_eq!(o["journal"]["unknown"], 1, "{o}");
    assert_eq!(o["draining"], false);
    assert_eq!(o["budget_ms"], 800);
    assert_eq!(o["targets"][0]["name"], "core");
    assert_eq!(
        o["targets"][0]["errors_last_minute"],
        serde_json::json!({"E901": 2, "E904": 1}),
        "{o}"
    );
    assert!(o["targets"][0]["capacity"].as_u64().unwrap() > 0, "{o}");
    assert!(o["last_minute"]["p50_ms"].as_u64().is_some(), "{o}");
    let u = get_json(&hub, "/api/unknown");
    let rows = u["transfers"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{u}");
    assert_eq!(rows[0]["guid"], unknown.as_str());
    assert_eq!(rows[0]["attempts"], 1);
    // Whose transfer it is, masked as the layout declares.
    assert_eq!(
        rows[0]["fields"]["from_account"],
        format!("*********{}", &common::ACC1[9..]),
        "{u}"
    );
    let t = get_json(&hub, &format!("/api/transfer/{lost}"));
    assert_eq!(t["row"]["state"], "not_sent", "{t}");
    assert_eq!(t["row"]["code"], "E904", "{t}");
    assert!(t["history"].as_array().unwrap().len() >= 2, "{t}");
    // Each of its two telegrams has a trace id of its own, the one its log line shows.
    let traced = t["telegrams"].as_array().unwrap();
    let codes: Vec<&str> = traced.iter().map(|x| x["code"].as_str().unwrap()).collect();
    assert_eq!(codes, ["E901", "E904"], "{t}");
    let trace_ids: Vec<String> = traced
        .iter()
        .map(|x| x["trace_id"].as_str().unwrap().to_string())
        .collect();
    assert_ne!(trace_ids[0], trace_ids[1]);
    for id in &trace_ids {
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && id != &"0".repeat(32),
            "{id}"
        );
        let line = hub.stderr_line_with(id);
        assert!(line.contains(lost.as_str()), "{line}");
    }
    let (status, body) = get(
        &format!("{base}/api/transfer/NOPE-{}", guid("X")),
        Some(TOKEN),
    );
    assert_eq!(status, 404, "{body}");
    let (status, body) = get(&format!("{base}/api/transfer/a%3Cb"), Some(TOKEN));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("byte 1"), "{body}");
    // No account number, masked or not, reaches the console's data.
    for text in [o.to_string(), u.to_string(), t.to_string()] {
        for acc in [common::ACC1, ACC2, ACC3] {
            assert!(!text.contains(acc), "account {acc} in {text}");
        }
    }

    // The Grafana dashboard queries only series this hub exports.
    let (status, text) = get(&format!("{base}/metrics"), Some(TOKEN));
    assert_eq!(status, 200);
    let exported: std::collections::BTreeSet<String> = ops_support::Metrics::parse(&text)
        .samples
        .iter()
        .map(|s| s.name.clone())
        .collect();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(ops_support::repo("config/grafana-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut queried = std::collections::BTreeSet::new();
    metric_names_in(&dashboard, &mut queried);
    assert!(queried.len() >= 8, "the dashboard queries {queried:?}");
    for name in &queried {
        assert!(
            exported.contains(name),
            "the dashboard queries {name}, which /metrics lacks:\n{text}"
        );
    }

    if !chromium_available() {
        return;
    }
    let page = format!("{base}/?token={TOKEN}");
    let dom = tokio::task::spawn_blocking({
        let page = page.clone();
        let profile = dir.join("profile-overview");
        move || chromium(profile, &page, &["--dump-dom"])
    })
    .await
    .unwrap();
    // The script ran and polled the JSON endpoints (with the token).
    let polls = cell_attr(&dom, "id=\"updated\"", "data-polls");
    assert!(
        polls.is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n > 0)),
        "no poll in the page:\n{dom}"
    );
    for (code, n) in &expected {
        let marker = format!("data-code=\"{code}\"");
        for class in ["minute", "total"] {
            assert_eq!(
                cell_after(&dom, &marker, class).as_deref(),
                Some(n.to_string().as_str()),
                "{code} {class} in:\n{dom}"
            );
        }
    }
    assert!(
        dom.contains(&format!("data-guid=\"{unknown}\"")),
        "unknown transfer not listed:\n{dom}"
    );
    let masked = format!("from_account=*********{}", &common::ACC1[9..]);
    assert!(
        dom.contains(&masked),
        "the unknown transfer's masked account ({masked}) is not on the page:\n{dom}"
    );
    for acc in [common::ACC1, ACC2, ACC3] {
        assert!(!dom.contains(acc), "account {acc} on the page");
    }

    // The GUID search, as the form submits it.
    let search = format!("{base}/?guid={unknown}&token={TOKEN}");
    let dom = tokio::task::spawn_blocking({
        let profile = dir.join("profile-search");
        move || chromium(profile, &search, &["--dump-dom"])
    })
    .await
    .unwrap();
    assert!(
        dom.contains("id=\"transfer\" data-found=\"true\"")
            && dom.contains(&format!("data-guid=\"{unknown}\" data-state=\"unknown\"")),
        "the search did not find {unknown}:\n{dom}"
    );
    assert!(dom.contains("id=\"history\""), "no history:\n{dom}");
    let u_trace = get_json(&hub, &format!("/api/transfer/{unknown}"))["telegrams"][0]["trace_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        dom.contains(&format!("data-trace=\"{u_trace}\"")),
        "trace id {u_trace} not on the GUID page:\n{dom}"
    );

    // A screenshot, kept under the test's temp dir (and copied on request).
    let shot = dir.join("console.png");
    let shot_arg = format!("--screenshot={}", shot.display());
    tokio::task::spawn_blocking({
        let profile = dir.join("profile-screenshot");
        move || {
            chromium(
                profile,
                &page,
                &[&shot_arg, "--window-size=1280,900", "--hide-scrollbars"],
            )
        }
    })
    .await
    .unwrap();
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    if let Ok(copy) = std::env::var("RELAYHUB_CONSOLE_SCREENSHOT") {
        std::fs::write(&copy, &png).expect("copy the screenshot");
    }

    drop(ch);
    let mut hub = hub;
    let status = tokio::task::spawn_blocking(move || hub.terminate())
        .await
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
}

/// Every `relayhub_...` name in the strings of a JSON value.
fn metric_names_in(v: &Value, out: &mut std::collections::BTreeSet<String>) {
    match v {
        Value::String(s) => {
            for (at, _) in s.match_indices("relayhub_") {
                let name: String = s[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                out.insert(name);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| metric_names_in(x, out)),
        Value::Object(o) => o.values().for_each(|x| metric_names_in(x, out)),
        _ => {}
    }
}

/// The value of attribute `attr` in the tag that contains `marker`.
fn cell_attr(dom: &str, marker: &str, attr: &str) -> Option<String> {
    let at = dom.find(marker)?;
    let tag_start = dom[..at].rfind('<')?;
    let tag_end = at + dom[at..].find('>')?;
    let tag = &dom[tag_start..tag_end];
    let a = tag.find(&format!("{attr}=\""))? + attr.len() + 2;
    let end = tag[a..].find('"')? + a;
    Some(tag[a..end].to_string())
}

/// An answer given to input that never framed a telegram (E102 with a blank
/// header) is in the console's counts as it is in `relayhub_telegrams_total`,
/// under the tx code `other` (before, the console left it out, so its totals
/// fell short of the metrics'; found by a black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unframeable_input_s_e102_is_in_the_console_s_counts() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let core = start_core().await;
    let hub = Hub::for_core(&core.url(), &[]).await;
    let mut s = tokio::net::TcpStream::connect(&hub.addr).await.unwrap();
    // A length prefix of 0: no telegram can follow.
    s.write_all(b"0000").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut answer))
        .await
        .expect("the hub answers and closes")
        .unwrap();
    assert_eq!(&answer[4..8], b"    ", "a blank header: {answer:?}");

    let (status, body) = hub.get("/api/overview");
    assert_eq!(status, 200, "{body}");
    let o: Value = serde_json::from_str(&body).unwrap();
    for period in ["last_minute", "since_start"] {
        assert_eq!(o[period]["by_tx"]["other"]["E102"], 1, "{period}: {o}");
        assert_eq!(o[period]["total"], 1, "{period}: {o}");
    }
    let metrics = hub.scrape();
    let counted = metrics.must(
        "relayhub_telegrams_total",
        &[("tx_code", "other"), ("code", "E102")],
    );
    assert_eq!(counted, 1.0);
}
