//! Telegrams for the shipped layouts, and checks on the answers.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use relayhub::client::{Answer, build_telegram, new_guid};
use relayhub::header::local_timestamp;
use relayhub::layout::Layout;
use serde_json::{Map, Value, json};

use super::{ACC1, ACC2, BANK, CHANNEL, MEMO};

pub fn layouts() -> &'static BTreeMap<String, Layout> {
    static L: OnceLock<BTreeMap<String, Layout>> = OnceLock::new();
    L.get_or_init(relayhub::layout::builtin)
}

pub fn layout(tx: &str) -> &'static Layout {
    &layouts()[tx]
}

/// A fresh GUID with a tag, unique per call.
pub fn guid(tag: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let g = new_guid(&format!(
        "{tag}{:03}",
        SEQ.fetch_add(1, Ordering::SeqCst) % 1000
    ));
    assert_eq!(g.len(), 32);
    g
}

pub fn trf_fields(
    from: &str,
    to_bank: &str,
    to: &str,
    amount: u64,
    memo: &str,
) -> Map<String, Value> {
    let v = json!({
        "from_account": from, "to_bank": to_bank, "to_account": to,
        "amount": amount, "memo": memo,
    });
    v.as_object().unwrap().clone()
}

/// A TRF001 telegram (no prefix) with the given fields.
pub fn trf(guid: &str, fields: &Map<String, Value>) -> Vec<u8> {
    build_telegram(layout("TRF001"), guid, CHANNEL, &local_timestamp(), fields)
        .expect("valid TRF001 fields")
}

/// An own-bank transfer ACC1 -> ACC2 of `amount`.
pub fn transfer(guid: &str, amount: u64) -> Vec<u8> {
    trf(guid, &trf_fields(ACC1, BANK, ACC2, amount, MEMO))
}

/// An INQ001 telegram asking about `orig_guid`.
pub fn inquiry(guid: &str, orig_guid: &str) -> Vec<u8> {
    let fields = json!({ "orig_guid": orig_guid });
    build_telegram(
        layout("INQ001"),
        guid,
        CHANNEL,
        &local_timestamp(),
        fields.as_object().unwrap(),
    )
    .expect("valid INQ001 fields")
}

/// Asserts `sent_at` is a hub timestamp taken between `before` and now.
pub fn assert_hub_time(sent_at: &str, before: &str) {
    let after = local_timestamp();
    assert_eq!(sent_at.len(), 14, "sent_at {sent_at:?}");
    assert!(
        sent_at.bytes().all(|b| b.is_ascii_digit()),
        "sent_at {sent_at:?}"
    );
    assert!(
        before <= sent_at && sent_at <= after.as_str(),
        "sent_at {sent_at} is not the hub's time (between {before} and {after})"
    );
}

/// Asserts an answer is the bare 64-byte header echoing `guid` with `code`.
pub fn assert_header_only(a: &Answer, tx: &str, guid: &str, code: &str) {
    assert_eq!(a.code, code, "code; answer {a:?}");
    assert_eq!(a.tx_code, tx, "tx_code echo");
    assert_eq!(a.guid, guid, "guid echo");
    assert_eq!(a.channel_id, CHANNEL, "channel_id echo");
    assert!(
        a.body.is_empty(),
        "a {code} answer has no body, got {:?}",
        a.body
    );
}
