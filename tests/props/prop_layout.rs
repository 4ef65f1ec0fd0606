//! Property tests for field conversion: valid values survive bytes -> JSON -> bytes
//! and JSON -> bytes -> JSON, bodies always have the layout's length, and no input
//! makes the converters panic.

use encoding_rs::EUC_KR;
use proptest::prelude::*;
use relayhub::layout::{Field, FieldType, builtin, decode_fields, encode_fields};
use serde_json::{Map, Value};

fn field(name: String, kind: FieldType, length: usize) -> Field {
    Field {
        name,
        kind,
        length,
        required: false,
        min: None,
        max: None,
        log: None,
    }
}

/// A character EUC-KR can encode and the H type allows: printable ASCII, Hangul
/// syllables (all 11,172, most of them from the CP949 extension), or whatever a
/// random KS X 1001 byte pair decodes to (Hanja, symbols, jamo, ...).
fn h_char() -> impl Strategy<Value = char> {
    prop_oneof![
        (0x20u8..=0x7E).prop_map(char::from),
        (0xAC00u32..=0xD7A3).prop_map(|c| char::from_u32(c).unwrap()),
        (0xA1u8..=0xFE, 0xA1u8..=0xFE).prop_filter_map("unassigned pair", |(lead, trail)| {
            EUC_KR
                .decode_without_bom_handling_and_without_replacement(&[lead, trail])
                .and_then(|s| s.chars().next())
        }),
    ]
}

fn euc_kr_len(c: char) -> usize {
    if c.is_ascii() { 1 } else { 2 }
}

/// A valid H value for a field of `length` bytes, as it decodes (no trailing space).
fn h_value(length: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(h_char(), 0..=length).prop_map(move |chars| {
        let mut s = String::new();
        let mut used = 0;
        for c in chars {
            if used + euc_kr_len(c) > length {
                break;
            }
            used += euc_kr_len(c);
            s.push(c);
        }
        s.trim_end_matches(' ').to_owned()
    })
}

fn an_value(length: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(0x20u8..=0x7E, 0..=length).prop_map(|b| {
        String::from_utf8(b)
            .unwrap()
            .trim_end_matches(' ')
            .to_owned()
    })
}

fn n_value(length: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(b'0'..=b'9', length).prop_map(|b| String::from_utf8(b).unwrap())
}

fn u_value(length: usize) -> impl Strategy<Value = u64> {
    let max = 10u64.checked_pow(length as u32).map_or(u64::MAX, |p| p - 1);
    0..=max
}

/// One field with a valid value for it.
fn field_and_value(index: usize) -> impl Strategy<Value = (Field, Value)> {
    let name = format!("f{index}");
    prop_oneof![
        (1usize..40)
            .prop_flat_map(move |n| an_value(n).prop_map(move |v| (n, Value::from(v))))
            .prop_map({
                let name = name.clone();
                move |(n, v)| (field(name.clone(), FieldType::AN, n), v)
            }),
        (1usize..30)
            .prop_flat_map(move |n| n_value(n).prop_map(move |v| (n, Value::from(v))))
            .prop_map({
                let name = name.clone();
                move |(n, v)| (field(name.clone(), FieldType::N, n), v)
            }),
        (1usize..=19)
            .prop_flat_map(move |n| u_value(n).prop_map(move |v| (n, Value::from(v))))
            .prop_map({
                let name = name.clone();
                move |(n, v)| (field(name.clone(), FieldType::U, n), v)
            }),
        (1usize..40)
            .prop_flat_map(move |n| h_value(n).prop_map(move |v| (n, Value::from(v))))
            .prop_map({
                let name = name.clone();
                move |(n, v)| (field(name.clone(), FieldType::H, n), v)
            }),
    ]
}

fn layout_and_values() -> impl Strategy<Value = (Vec<Field>, Map<String, Value>)> {
    (1usize..8).prop_flat_map(|n| {
        (0..n)
            .map(field_and_value)
            .collect::<Vec<_>>()
            .prop_map(|pairs| {
                let mut fields = Vec::new();
                let mut values = Map::new();
                for (f, v) in pairs {
                    values.insert(f.name.clone(), v);
                    fields.push(f);
                }
                (fields, values)
            })
    })
}

/// Any JSON scalar, to throw at the encoder.
fn any_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        any::<String>().prop_map(Value::from),
        "[0-9]{0,25}".prop_map(Value::from),
        h_value(24).prop_map(Value::from),
    ]
}

proptest! {
    #[test]
    fn json_to_bytes_to_json_roundtrips((fields, values) in layout_and_values(), base in 0usize..1000) {
        let body = encode_fields(&fields, &values, base).unwrap();
        let total: usize = fields.iter().map(|f| f.length).sum();
        prop_assert_eq!(body.len(), total);
        let back = decode_fields(&fields, &body, base).unwrap();
        prop_assert_eq!(back, values);
    }

    /// Whatever decodes, encodes back to the very same bytes.
    #[test]
    fn bytes_to_json_to_bytes_roundtrips((fields, values) in layout_and_values()) {
        let body = encode_fields(&fields, &values, 64).unwrap();
        let json = decode_fields(&fields, &body, 64).unwrap();
        prop_assert_eq!(encode_fields(&fields, &json, 64).unwrap(), body);
    }

    #[test]
    fn hangul_memo_roundtrips(memo in h_value(20)) {
        let trf = builtin().remove("TRF001").unwrap();
        let mut v = Map::new();
        v.insert("from_account".into(), "1002003004001".into());
        v.insert("to_bank".into(), "088".into());
        v.insert("to_account".into(), "1002003004002".into());
        v.insert("amount".into(), 50000.into());
        v.insert("memo".into(), memo.clone().into());
        let body = trf.encode_request(&v, 64).unwrap();
        prop_assert_eq!(body.len(), 68);
        let back = trf.decode_request(&body, 64).unwrap();
        prop_assert_eq!(back.text("memo").unwrap(), memo.as_str());
    }

    /// Random keys and values: the encoder answers Ok with exactly the layout's length,
    /// or an error naming one of the layout's fields at that field's offset.
    #[test]
    fn encode_is_the_layout_length_or_a_precise_error(
        values in prop::collection::btree_map(
            prop_oneof![
                Just("from_account".to_owned()), Just("to_bank".to_owned()),
                Just("to_account".to_owned()), Just("amount".to_owned()),
                Just("memo".to_owned()), Just("other".to_owned()),
            ],
            any_json(),
            0..6,
        ),
    ) {
        let trf = builtin().remove("TRF001").unwrap();
        let values: Map<String, Value> = values.into_iter().collect();
        match trf.encode_request(&values, 64) {
            Ok(body) => prop_assert_eq!(body.len(), trf.request_len()),
            Err(e) => {
                let mut at = 64;
                let mut found = false;
                for f in &trf.request {
                    if f.name == e.field {
                        prop_assert_eq!(e.offset, at);
                        found = true;
                    }
                    at += f.length;
                }
                prop_assert!(found, "{e}");
            }
        }
    }

    /// Random lead/trail pairs across the whole CP949 range: when a field decodes,
    /// it re-encodes to the same bytes (no character has two encodings), and when
    /// it does not, the error points inside the field.
    #[test]
    fn h_bytes_decode_and_reencode_identically(
        pairs in prop::collection::vec(
            prop_oneof![
                (0x81u8..=0xFE, 0x41u8..=0xFE).prop_map(|(l, t)| vec![l, t]),
                (0x21u8..=0x7E).prop_map(|b| vec![b]),
                Just(vec![b' ']),
            ],
            0..12,
        ),
    ) {
        let mut bytes: Vec<u8> = pairs.concat();
        bytes.resize(24, b' ');
        let fields = [field("memo".into(), FieldType::H, 24)];
        match decode_fields(&fields, &bytes, 64) {
            Ok(json) => prop_assert_eq!(encode_fields(&fields, &json, 64).unwrap(), bytes),
            Err(e) => prop_assert!(e.offset >= 64 && e.offset < 64 + 24, "{}", e),
        }
    }

    /// Arbitrary bytes never panic; an error names a field whose bytes hold the offset.
    #[test]
    fn decode_arbitrary_bytes_never_panics(
        body in prop::collection::vec(
            prop_oneof![any::<u8>(), Just(b' '), b'0'..=b'9', 0xA1u8..=0xFE], 0..80),
    ) {
        let layouts = builtin();
        for layout in layouts.values() {
            for fields in [&layout.request, &layout.response] {
                let mut padded = body.clone();
                let need: usize = fields.iter().map(|f| f.length).sum();
                padded.resize(need, b' ');
                for bytes in [&body[..], &padded[..]] {
                    match decode_fields(fields, bytes, 64) {
                        Ok(json) => {
                            prop_assert_eq!(bytes.len(), need);
                            // What decodes re-encodes to the same bytes.
                            prop_assert_eq!(encode_fields(fields, &json, 64).unwrap(), bytes);
                        }
                        Err(e) if e.field == "body" => {
                            // At the first bad byte: the end of a short body,
                            // the first byte past the layout in a long one.
                            prop_assert_eq!(e.offset, 64 + bytes.len().min(need));
                            prop_assert_ne!(bytes.len(), need);
                        }
                        Err(e) => {
                            let mut at = 64;
                            let mut found = false;
                            for f in fields.iter() {
                                if f.name == e.field {
                                    prop_assert!(e.offset >= at && e.offset < at + f.length, "{}", e);
                                    found = true;
                                }
                                at += f.length;
                            }
                            prop_assert!(found, "{}", e);
                        }
                    }
                }
            }
        }
    }
}
