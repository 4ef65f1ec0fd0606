//! A telegram's way in, without a socket: `parse_header`, then
//! `Layout::decode_request` by every shipped layout. Never a panic; every
//! refusal names a real field at an offset inside the telegram; every body
//! that decodes converts back to the same bytes and the same JSON.
//!
//! Input: a telegram without its length prefix.
#![no_main]

use libfuzzer_sys::fuzz_target;
use relayhub::header::{HEADER_LEN, parse_header};
use relayhub::layout::{Layout, builtin, decode_fields, encode_fields};
use std::collections::BTreeMap;
use std::sync::OnceLock;

fn layouts() -> &'static BTreeMap<String, Layout> {
    static L: OnceLock<BTreeMap<String, Layout>> = OnceLock::new();
    L.get_or_init(builtin)
}

const HEADER_FIELDS: [&str; 6] = [
    "header",
    "tx_code",
    "guid",
    "channel_id",
    "sent_at",
    "resp_code",
];

fuzz_target!(|data: &[u8]| {
    match parse_header(data) {
        Ok(h) => {
            assert_eq!(h.tx_code.len(), 6);
            assert_eq!(h.guid.len(), 32);
            assert!(!h.channel_id.is_empty() && h.channel_id.len() <= 8);
            assert_eq!(h.sent_at.len(), 14);
        }
        Err(e) => {
            assert!(
                HEADER_FIELDS.contains(&e.field),
                "unknown header field {:?}",
                e.field
            );
            assert!(
                e.offset <= HEADER_LEN,
                "offset {} past the header",
                e.offset
            );
            assert!(!e.reason.is_empty());
        }
    }

    // Every layout on the body, whether the header routes to it or not: the
    // body parser must hold up on its own.
    let body = data.get(HEADER_LEN..).unwrap_or(data);
    for layout in layouts().values() {
        match layout.decode_request(body, HEADER_LEN) {
            Ok(decoded) => {
                assert_eq!(body.len(), layout.request_len());
                assert_eq!(decoded.len(), layout.request.len(), "one JSON key per field");
                let fields = decoded.to_map();
                // The text written straight from the fields is their map's JSON.
                assert_eq!(
                    serde_json::to_string(&decoded).unwrap(),
                    serde_json::Value::Object(fields.clone()).to_string()
                );
                let bytes =
                    encode_fields(&layout.request, &fields, HEADER_LEN).unwrap_or_else(|e| {
                        panic!("{}: decoded fields do not encode: {e}", layout.tx_code)
                    });
                assert_eq!(bytes, body, "{}: bytes -> JSON -> bytes", layout.tx_code);
                let again = decode_fields(&layout.request, &bytes, HEADER_LEN).expect("re-decodes");
                assert_eq!(again, fields);
            }
            Err(e) => {
                let known = e.field == "body" || layout.request.iter().any(|f| f.name == e.field);
                assert!(known, "{}: error names no field: {e}", layout.tx_code);
                assert!(
                    e.offset >= HEADER_LEN
                        && e.offset <= HEADER_LEN + body.len().max(layout.request_len())
                );
            }
        }
        // The response side too (a 0000 answer the hub replays).
        let _ = layout.decode_response(body, HEADER_LEN);
    }
});
