//! `encode_fields` from arbitrary JSON, for every shipped layout's request and
//! response (the response is what the hub writes from the core's answer).
//! Never a panic; a body that encodes has exactly the layout's length and
//! decodes back to the same bytes; a refusal names a real field.
//!
//! Input: JSON text. Anything that is not a JSON object is also tried as the
//! value of every field in turn, so odd values reach every field type. The
//! bytes are also read as the hub reads the core's answer (a borrowed
//! object, no map): accepted exactly when the map is, and written to the same
//! body or the same error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use relayhub::header::HEADER_LEN;
use relayhub::json_object::BorrowedObject;
use relayhub::layout::{Field, FieldType, Layout, builtin, decode_fields, encode_fields};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::OnceLock;

fn layouts() -> &'static BTreeMap<String, Layout> {
    static L: OnceLock<BTreeMap<String, Layout>> = OnceLock::new();
    L.get_or_init(builtin)
}

/// A valid value for every field, so one odd value is tested on its own.
fn base(fields: &[Field]) -> Map<String, Value> {
    fields
        .iter()
        .map(|f| {
            let v = match f.kind {
                FieldType::AN => Value::from("A"),
                FieldType::N => Value::from("0".repeat(f.length)),
                FieldType::U => Value::from(f.min.unwrap_or(0)),
                FieldType::H => Value::from("월세"),
            };
            (f.name.clone(), v)
        })
        .collect()
}

fn check(fields: &[Field], values: &Map<String, Value>) {
    let need: usize = fields.iter().map(|f| f.length).sum();
    match encode_fields(fields, values, HEADER_LEN) {
        Ok(body) => {
            assert_eq!(body.len(), need, "encoded body length");
            // What the hub writes, a channel (or the hub itself) can read back.
            match decode_fields(fields, &body, HEADER_LEN) {
                Ok(decoded) => {
                    let again = encode_fields(fields, &decoded, HEADER_LEN).expect("re-encodes");
                    assert_eq!(again, body, "JSON -> bytes -> JSON -> bytes");
                }
                Err(e) => panic!("encoded {values:?} to {body:?}, which does not decode: {e}"),
            }
        }
        Err(e) => {
            assert!(
                fields.iter().any(|f| f.name == e.field),
                "error names no field: {e}"
            );
            assert!(e.offset >= HEADER_LEN && e.offset <= HEADER_LEN + need);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let borrowed = BorrowedObject::parse(data);
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        assert!(borrowed.is_none(), "a borrowed object from bytes the map refuses");
        return;
    };
    // serde_json's reserved first key (`$`, perhaps escaped, starts it) is
    // read differently on purpose: see `BorrowedObject`.
    let reserved = data.contains(&b'$') || data.windows(6).any(|w| w == b"\\u0024");
    if !reserved {
        assert_eq!(borrowed.is_some(), value.is_object(), "read as an object");
    }
    if let (false, Value::Object(map), Some(borrowed)) = (reserved, &value, &borrowed) {
        for layout in layouts().values() {
            for fields in [&layout.request, &layout.response] {
                assert_eq!(
                    encode_fields(fields, borrowed, HEADER_LEN),
                    encode_fields(fields, map, HEADER_LEN),
                    "the borrowed object writes as the map"
                );
            }
        }
    }
    for layout in layouts().values() {
        for fields in [&layout.request, &layout.response] {
            match &value {
                Value::Object(map) => {
                    check(fields, map);
                    // The same keys over a valid base, so one odd key is enough.
                    let mut merged = base(fields);
                    merged.extend(map.clone());
                    check(fields, &merged);
                }
                other => {
                    // `other` as each field's value, the rest from a valid base.
                    let valid = base(fields);
                    check(fields, &valid);
                    for target in fields.iter() {
                        let mut map = valid.clone();
                        map.insert(target.name.clone(), other.clone());
                        check(fields, &map);
                    }
                }
            }
        }
    }
});
