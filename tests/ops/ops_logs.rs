//! What an operator's log shipper sees: `relayhub serve --log-format json`
//! (a real process; logs on stderr), one transfer, and the lines it leaves:
//! the GUID and the code on the telegram's summary line, account numbers masked
//! to their last four digits, and no full account number or memo anywhere.
//! The human format masks the same way.

use crate::common;
use crate::ops_support;

use common::{ACC1, ACC2, MEMO, exchange, guid, start_core, transfer};
use ops_support::Hub;
use relayhub::client::Channel;
use relayhub::frame::PrefixMode;
use serde_json::Value;

/// Runs one transfer through a hub started with `extra` flags; returns the
/// transfer's GUID and everything the hub wrote to stderr.
async fn one_transfer(extra: &[&str]) -> (String, String) {
    let core = start_core().await;
    let mut args = vec![
        "--listen".to_string(),
        "127.0.0.1:0".into(),
        "--core-url".into(),
        core.url(),
        "--journal".into(),
        "memory".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let hub = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Hub::spawn(&args)
    })
    .await
    .unwrap();
    let g = guid("OPSLOG");
    let mut ch = Channel::connect(&hub.addr, PrefixMode::Ascii)
        .await
        .expect("connect to the hub");
    let a = exchange(&mut ch, &transfer(&g, 50_000)).await;
    assert_eq!(a.code, "0000", "{a:?}");
    drop(ch);
    let mut hub = hub;
    let (status, stderr) = tokio::task::spawn_blocking(move || {
        let status = hub.terminate();
        (status, hub.stderr())
    })
    .await
    .unwrap();
    assert!(status.success(), "exit status {status:?}");
    (g, stderr)
}

fn assert_masked(stderr: &str) {
    for acc in [ACC1, ACC2] {
        assert!(
            !stderr.contains(acc),
            "full account number {acc} in the logs:\n{stderr}"
        );
    }
    assert!(!stderr.contains(MEMO), "the memo is in the logs:\n{stderr}");
    assert!(
        stderr.contains("*********4001"),
        "no masked from_account:\n{stderr}"
    );
    assert!(
        stderr.contains("*********4002"),
        "no masked to_account:\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_guid_code_and_masked_accounts_only() {
    let (g, stderr) = one_transfer(&["--log-format", "json"]).await;
    assert_masked(&stderr);

    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let of_telegram: Vec<&Value> = lines
        .iter()
        .filter(|l| l["span"]["guid"] == g.as_str())
        .collect();
    assert!(
        of_telegram
            .iter()
            .all(|l| l["span"]["name"] == "telegram" && l["span"]["tx"] == "TRF001"),
        "telegram span fields: {of_telegram:#?}"
    );
    // The summary line: one per telegram, with the code and the time taken.
    let summaries: Vec<&&Value> = of_telegram
        .iter()
        .filter(|l| l["fields"]["code"].is_string())
        .collect();
    assert_eq!(summaries.len(), 1, "summary lines: {summaries:#?}");
    let summary = summaries[0];
    assert_eq!(summary["fields"]["code"], "0000", "{summary}");
    assert!(summary["fields"]["ms"].is_u64(), "{summary}");
    // Phase timing: the time spent calling the core, on the telegram's span.
    assert!(summary["span"]["core_ms"].is_u64(), "{summary}");
    assert_eq!(summary["span"]["channel"], "IBANK", "{summary}");
    assert_eq!(summary["level"], "INFO", "{summary}");
    // The request fields, masked, on the telegram's span: the summary carries them.
    let fields = &summary["span"]["fields"];
    assert!(
        fields["from_account"] == "*********4001"
            && fields["to_account"] == "*********4002"
            && fields["amount"] == 50000,
        "{summary}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn human_logs_mask_accounts_too() {
    let (g, stderr) = one_transfer(&["--log-format", "human"]).await;
    assert_masked(&stderr);
    assert!(
        stderr.lines().any(|l| l.contains(&g) && l.contains("0000")),
        "no summary line with the GUID and the code:\n{stderr}"
    );
}
