use std::path::{Path, PathBuf};

use bytes::BytesMut;
use proptest::strategy::Strategy as _;
use serde_json::{Map, Value, json};

use super::*;
use crate::frame::FrameCodec;
use crate::header::{Echo, HEADER_LEN, parse_header, write_response};

fn layouts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("layouts")
}

fn trf001() -> Layout {
    builtin().remove("TRF001").unwrap()
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn field(name: &str, kind: FieldType, length: usize) -> Field {
    Field {
        name: name.into(),
        kind,
        length,
        required: false,
        min: None,
        max: None,
        log: None,
    }
}

fn required(mut f: Field) -> Field {
    f.required = true;
    f
}

fn ranged(mut f: Field, min: Option<u64>, max: Option<u64>) -> Field {
    f.min = min;
    f.max = max;
    f
}

// --- Section 11, byte for byte ---------------------------------------------------

/// "월세 11월" in EUC-KR, padded to the 20-byte memo field.
const MEMO: &[u8; 20] = b"\xbf\xf9\xbc\xbc\x2011\xbf\xf9           ";

fn example_request_body() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"1002003004001   ");
    b.extend_from_slice(b"088");
    b.extend_from_slice(b"1002003004002   ");
    b.extend_from_slice(b"0000000050000");
    b.extend_from_slice(MEMO);
    b
}

fn example_request_wire() -> Vec<u8> {
    let mut w = b"0132TRF00120261129IBANK000000000000000001AIBANK   20261129132000    ".to_vec();
    w.extend_from_slice(&example_request_body());
    w
}

fn example_request_json() -> Map<String, Value> {
    obj(json!({
        "from_account": "1002003004001",
        "to_bank": "088",
        "to_account": "1002003004002",
        "amount": 50000,
        "memo": "월세 11월",
    }))
}

const EXAMPLE_RESPONSE_BODY: &[u8; 45] = b"T20261129000000120261129132001000000000950000";

#[test]
fn example_request_wire_to_json() {
    let wire = example_request_wire();
    assert_eq!(wire.len(), 136);
    let mut buf = BytesMut::from(&wire[..]);
    let telegram = FrameCodec::default().decode(&mut buf).unwrap().unwrap();
    assert!(buf.is_empty());
    assert_eq!(telegram.len(), 132);
    let header = parse_header(&telegram).unwrap();
    assert_eq!(header.tx_code, "TRF001");
    assert_eq!(header.channel_id, "IBANK");
    let layout = trf001();
    let body = &telegram[HEADER_LEN..];
    assert_eq!(body.len(), layout.request_len());
    let json = layout.decode_request(body, HEADER_LEN).unwrap().to_map();
    assert_eq!(json, example_request_json());
    assert_eq!(json["memo"], "월세 11월");
    assert_eq!(json["amount"], 50000);
}

#[test]
fn example_request_json_to_body() {
    let body = trf001()
        .encode_request(&example_request_json(), HEADER_LEN)
        .unwrap();
    assert_eq!(body, example_request_body());
    assert_eq!(&body[48..], MEMO);
}

#[test]
fn example_answer_json_to_response_telegram() {
    let answer = obj(json!({
        "result": "OK",
        "txn_id": "T202611290000001",
        "balance": 950000,
        "processed_at": "20261129132001",
    }));
    let layout = trf001();
    let body = layout.encode_response(&answer, HEADER_LEN).unwrap();
    assert_eq!(&body[..], &EXAMPLE_RESPONSE_BODY[..]);

    let echo = Echo::from_telegram(&example_request_wire()[4..]);
    let mut telegram = Vec::new();
    write_response(&echo, "20261129132001", "0000", &body, &mut telegram);
    let mut wire = BytesMut::new();
    FrameCodec::default().encode(&telegram, &mut wire).unwrap();
    assert_eq!(wire.len(), 113);
    assert_eq!(
        std::str::from_utf8(&wire).unwrap(),
        "0109TRF00120261129IBANK000000000000000001AIBANK   202611291320010000T20261129000000120261129132001000000000950000"
    );
}

#[test]
fn example_response_body_to_json() {
    let json = trf001()
        .decode_response(EXAMPLE_RESPONSE_BODY, HEADER_LEN)
        .unwrap();
    assert_eq!(
        Value::Object(json),
        json!({"txn_id": "T202611290000001", "processed_at": "20261129132001", "balance": 950000})
    );
}

#[test]
fn example_rejection_is_the_header_alone() {
    let echo = Echo::from_telegram(&example_request_wire()[4..]);
    let mut telegram = Vec::new();
    write_response(&echo, "20261129132001", "B201", b"", &mut telegram);
    let mut wire = BytesMut::new();
    FrameCodec::default().encode(&telegram, &mut wire).unwrap();
    assert_eq!(&wire[..4], b"0064");
    assert_eq!(&wire[64..], b"B201");
}

// --- Loading ---------------------------------------------------------------------

#[test]
fn shipped_layouts_load_and_equal_builtin() {
    let loaded = load_dir(&layouts_dir()).unwrap();
    assert_eq!(loaded, builtin());
    assert_eq!(loaded.keys().collect::<Vec<_>>(), ["INQ001", "TRF001"]);
    let trf = &loaded["TRF001"];
    assert_eq!((trf.request_len(), trf.response_len()), (68, 45));
    let names: Vec<_> = trf.request.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["from_account", "to_bank", "to_account", "amount", "memo"]
    );
    assert_eq!(trf.request[3].min, Some(1));
    assert!(trf.request[0].required && trf.request[2].required);
    let inq = &loaded["INQ001"];
    assert_eq!((inq.request_len(), inq.response_len()), (32, 45));
    assert_eq!(inq.response, trf.response);
    assert!(inq.request[0].required);
}

/// Every file under `layouts/invalid/` must fail, for the reason its name gives.
/// (`layouts/invalid/core_api/` holds well-formed layouts that do not fit the
/// core's API: the rules refuse those, see `tests/first_hour.rs`.)
#[test]
fn invalid_layouts_fail_with_a_specific_reason() {
    let expected: &[(&str, &str)] = &[
        (
            "bad_tx_code.json",
            "tx_code \"trf001\" must be 6 characters of A-Z and 0-9",
        ),
        ("duplicate_name.json", "request field `a` is listed twice"),
        (
            "duplicate_response_name.json",
            "response field `b` is listed twice",
        ),
        ("empty_name.json", "request field #1 has an empty name"),
        (
            "max_does_not_fit.json",
            "request field `count`: max 1000 does not fit in 3 digits",
        ),
        (
            "min_greater_than_max.json",
            "request field `amount`: min 100 is greater than max 10",
        ),
        (
            "min_on_an.json",
            "request field `code`: min/max only apply to type U, not AN",
        ),
        (
            "missing_response_length.json",
            "missing field `response_length`",
        ),
        (
            "negative_length.json",
            "request field `a`, key `length`: invalid value: integer `-1`",
        ),
        (
            "field_as_array.json",
            "request[0] is an array: write each field as an object with named keys",
        ),
        (
            "file_as_array.json",
            "a layout file is one JSON object with named keys (tx_code, request, ...), not an array",
        ),
        (
            "fields_short_of_length.json",
            "request_length is 10 but the request fields add up to 8: body bytes 8..10 belong to no field",
        ),
        ("not_json.json", "EOF while parsing"),
        (
            "request_length_mismatch.json",
            "request_length is 60 but the request fields add up to 68: field `memo` (body bytes 48..68) runs past byte 60",
        ),
        (
            "response_length_mismatch.json",
            "response_length is 44 but the response fields add up to 45",
        ),
        (
            "u_too_long.json",
            "request field `amount`: type U is at most 19 digits (to fit a u64), not 20",
        ),
        (
            "unknown_field_key.json",
            "request field `a`, key `pad`: unknown field `pad`",
        ),
        (
            "unknown_key.json",
            "key `encoding`: unknown field `encoding`",
        ),
        (
            "duplicate_key.json",
            "request field `account`: duplicate field `log`",
        ),
        (
            "unknown_type.json",
            "request field `a`, key `type`: unknown variant `X`, expected one of `AN`, `N`, `U`, `H`",
        ),
        (
            "zero_length.json",
            "request field `a`: length must be at least 1",
        ),
    ];
    let dir = layouts_dir().join("invalid");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            continue;
        }
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let want = expected
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{name}: add its expected reason to this test"))
            .1;
        let text = std::fs::read_to_string(&path).unwrap();
        match Layout::from_json(&name, &text) {
            Ok(_) => panic!("{name} loaded but must fail"),
            Err(LayoutError::Invalid { file, reason }) => {
                assert_eq!(file, name);
                assert!(reason.contains(want), "{name}: {reason:?} lacks {want:?}");
            }
            Err(e) => panic!("{name}: unexpected {e}"),
        }
        // Loading the folder fails too.
        seen.push(name);
    }
    seen.sort();
    let mut listed: Vec<_> = expected.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(seen, listed, "every expected file exists");
    assert!(matches!(load_dir(&dir), Err(LayoutError::Invalid { .. })));
}

#[test]
fn error_display_names_the_file() {
    let e = Layout::from_json("x/BAD.json", "{}").unwrap_err();
    assert_eq!(
        e.to_string(),
        "layout x/BAD.json: missing field `tx_code` at line 1 column 2"
    );
}

#[test]
fn description_is_optional_and_empty_lists_are_allowed() {
    let l = Layout::from_json(
        "t",
        r#"{"tx_code":"PING01","request_length":0,"request":[],"response_length":0,"response":[]}"#,
    )
    .unwrap();
    assert_eq!(l.description, "");
    assert_eq!((l.request_len(), l.response_len()), (0, 0));
    assert!(l.decode_request(b"", 64).unwrap().is_empty());
}

#[test]
fn a_request_field_s_offset_counts_the_fields_before_it() {
    let l = Layout::from_json(
        "t",
        r#"{"tx_code":"INQ002","request_length":36,"request":[
        {"name":"branch","type":"AN","length":4},
        {"name":"orig_guid","type":"AN","length":32}],"response_length":0,"response":[]}"#,
    )
    .unwrap();
    assert_eq!(l.request_offset("branch"), Some(0));
    assert_eq!(l.request_offset("orig_guid"), Some(4));
    assert_eq!(l.request_offset("memo"), None);
}

#[test]
fn u_limits_at_the_edge() {
    let ok = r#"{"tx_code":"EDGE01","request_length":19,"request":[
        {"name":"n","type":"U","length":19,"min":0,"max":9999999999999999999}],
        "response_length":0,"response":[]}"#;
    assert!(Layout::from_json("t", ok).is_ok());
    let same = r#"{"tx_code":"EDGE02","request_length":2,"request":[
        {"name":"n","type":"U","length":2,"min":5,"max":5}],"response_length":0,"response":[]}"#;
    assert!(Layout::from_json("t", same).is_ok());
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("relayhub-layout-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn load_dir_refuses_a_duplicate_tx_code() {
    let tmp = TempDir::new("dup");
    let text = include_str!("../../layouts/INQ001.json");
    std::fs::write(tmp.0.join("a.json"), text).unwrap();
    std::fs::write(tmp.0.join("b.json"), text).unwrap();
    let e = load_dir(&tmp.0).unwrap_err();
    let LayoutError::Invalid { file, reason } = e else {
        panic!("{e}")
    };
    assert!(file.ends_with("b.json"), "{file}");
    assert!(
        reason.starts_with("tx_code INQ001 is already defined in "),
        "{reason}"
    );
    assert!(reason.ends_with("a.json"), "{reason}");
}

#[test]
fn load_dir_skips_other_files_and_subfolders() {
    let tmp = TempDir::new("skip");
    std::fs::write(
        tmp.0.join("INQ001.json"),
        include_str!("../../layouts/INQ001.json"),
    )
    .unwrap();
    std::fs::write(tmp.0.join("notes.txt"), "not a layout").unwrap();
    std::fs::create_dir(tmp.0.join("sub.json")).unwrap();
    std::fs::write(tmp.0.join("sub.json").join("x.json"), "broken").unwrap();
    let loaded = load_dir(&tmp.0).unwrap();
    assert_eq!(loaded.keys().collect::<Vec<_>>(), ["INQ001"]);
}

#[test]
fn load_dir_of_a_missing_folder_is_io() {
    let e = load_dir(Path::new("/nonexistent/relayhub/layouts")).unwrap_err();
    assert!(matches!(e, LayoutError::Io { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("layout /nonexistent/relayhub/layouts: ")
    );
}

// --- Decoding --------------------------------------------------------------------

fn decode_err(fields: &[Field], bytes: &[u8]) -> FieldError {
    decode_fields(fields, bytes, 64).unwrap_err()
}

#[test]
fn body_length_must_match() {
    // A short body is wrong where it ends (64 + 60), a long one at its
    // first byte past the layout (64 + 45).
    let e = trf001().decode_request(&[b' '; 60], 64).unwrap_err();
    assert_eq!(
        e,
        FieldError {
            field: "body".into(),
            offset: 124,
            reason: "body is 60 bytes, layout TRF001 request needs 68".into()
        }
    );
    assert_eq!(
        e.to_string(),
        "field `body` at byte 124: body is 60 bytes, layout TRF001 request needs 68"
    );
    let e = decode_err(&trf001().response, &[b'0'; 46]);
    assert_eq!(e.reason, "body is 46 bytes, the layout needs 45");
    assert_eq!(e.offset, 109);
    let e = trf001().decode_response(b"", 64).unwrap_err();
    assert_eq!(e.reason, "body is 0 bytes, layout TRF001 response needs 45");
}

#[test]
fn decode_an() {
    let f = [
        field("a", FieldType::AN, 4),
        required(field("b", FieldType::AN, 3)),
    ];
    let m = decode_fields(&f, b" x  ab ", 64).unwrap();
    assert_eq!(m["a"], " x", "leading spaces kept, trailing trimmed");
    assert_eq!(m["b"], "ab");
    let e = decode_err(&f, b"ab\ncxyz");
    assert_eq!((e.field.as_str(), e.offset), ("a", 66));
    assert_eq!(e.reason, "byte 0x0A is not printable ASCII (0x20-0x7E)");
    let e = decode_err(&f, b"abcdx\x7Fz");
    assert_eq!((e.field.as_str(), e.offset), ("b", 69));
    let e = decode_err(&f, b"abcd   ");
    assert_eq!(
        (e.field.as_str(), e.offset, e.reason.as_str()),
        ("b", 68, "is required but blank")
    );
    let e = decode_err(&f, b"abcd\xB0  ");
    assert_eq!(e.reason, "byte 0xB0 is not printable ASCII (0x20-0x7E)");
    // Blank is fine when not required.
    assert_eq!(decode_fields(&f, b"    xyz", 0).unwrap()["a"], "");
}

#[test]
fn decode_n() {
    let f = [field("d", FieldType::N, 3)];
    assert_eq!(decode_fields(&f, b"007", 64).unwrap()["d"], "007");
    let e = decode_err(&f, b"0 7");
    assert_eq!((e.field.as_str(), e.offset), ("d", 65));
    assert_eq!(e.reason, "byte 0x20 (' ') is not an ASCII digit");
    assert_eq!(decode_err(&f, b"   ").offset, 64, "N is never blank");
    assert_eq!(decode_err(&f, b"-12").offset, 64);
}

#[test]
fn decode_u() {
    let f = [ranged(field("amt", FieldType::U, 5), Some(1), Some(50000))];
    assert_eq!(decode_fields(&f, b"00042", 64).unwrap()["amt"], 42);
    assert_eq!(decode_fields(&f, b"50000", 64).unwrap()["amt"], 50000);
    let e = decode_err(&f, b"00000");
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (64, "0 is below the minimum 1")
    );
    let e = decode_err(&f, b"50001");
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (64, "50001 is above the maximum 50000")
    );
    let e = decode_err(&f, b"  123");
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (64, "byte 0x20 (' ') is not an ASCII digit")
    );
    let e = decode_err(&f, b"12+45");
    assert_eq!(e.offset, 66);
    // Hand-made field lists are not validated; a too-long U is an error, not a panic.
    let big = [field("n", FieldType::U, 20)];
    let e = decode_err(&big, b"99999999999999999999");
    assert_eq!(e.reason, "value does not fit in a u64");
    let max = decode_fields(&big, b"18446744073709551615", 0).unwrap();
    assert_eq!(max["n"], u64::MAX);
}

#[test]
fn decode_h() {
    let f = [field("memo", FieldType::H, 20)];
    assert_eq!(decode_fields(&f, MEMO, 0).unwrap()["memo"], "월세 11월");
    assert_eq!(decode_fields(&f, &[b' '; 20], 0).unwrap()["memo"], "");
    // CP949 extension: 똠 is 0x8C 0x63, its trail byte in the ASCII range.
    let mut b = b"\x8c\x63c".to_vec();
    b.resize(20, b' ');
    assert_eq!(decode_fields(&f, &b, 0).unwrap()["memo"], "똠c");
    let req = [required(field("memo", FieldType::H, 4))];
    let e = decode_err(&req, b"    ");
    assert_eq!((e.offset, e.reason.as_str()), (64, "is required but blank"));
}

#[test]
fn decode_h_cut_character() {
    let f = [field("memo", FieldType::H, 4), field("x", FieldType::AN, 1)];
    // 0xB0 0xA1 is 가; the second one is cut after its first byte.
    let e = decode_err(&f, b"\xb0\xa1 \xb0Z");
    assert_eq!((e.field.as_str(), e.offset), ("memo", 67));
    assert_eq!(
        e.reason,
        "byte 0xB0 is the first half of a two-byte EUC-KR character cut by the field's end"
    );
    // A real trail byte at the end is fine: the last byte is 0xA1, a lead-range
    // value, but it completes 가.
    let m = decode_fields(&f, b"  \xb0\xa1Z", 0).unwrap();
    assert_eq!(m["memo"], "  가");
}

#[test]
fn decode_h_malformed_bytes() {
    let f = [field("memo", FieldType::H, 6)];
    let e = decode_err(&f, b"ab\x80   ");
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (66, "byte 0x80 is not valid EUC-KR")
    );
    let e = decode_err(&f, b"\xb0\xa1\xff   ");
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (66, "byte 0xFF is not valid EUC-KR")
    );
    // A lead byte followed by a space is broken at the lead byte.
    let e = decode_err(&f, b"a\xb0 b  ");
    assert_eq!(e.offset, 65, "{e}");
    assert_eq!(
        e.reason,
        "bytes 0xB0 0x20 (' ') are not a valid EUC-KR character"
    );
    // A lead/trail pair with no character assigned.
    let e = decode_err(&f, b"a\xc9\x41   ");
    assert_eq!(e.offset, 65, "{e}");
}

#[test]
fn decode_h_control_characters() {
    let f = [field("memo", FieldType::H, 6)];
    let e = decode_err(&f, b"\xb0\xa1a\t  ");
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (67, "control character U+0009 is not allowed")
    );
    let e = decode_err(&f, b"\x00     ");
    assert_eq!(e.offset, 64);
    let e = decode_err(&f, b"abc\x7F  ");
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (67, "control character U+007F is not allowed")
    );
    // A control character before bytes that do not decode is the first bad byte.
    let e = decode_err(&f, b"\x01AB\xb0  ");
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (64, "control character U+0001 is not allowed")
    );
    let e = decode_err(&f, b"\xb0\xa1\x1f\xff  ");
    assert_eq!(e.offset, 66, "{e}");
}

/// The first bad byte of an `H` field by a scan one character at a time: a
/// control character, or a byte that starts no valid character.
fn first_bad_h_byte(raw: &[u8]) -> Option<usize> {
    let mut at = 0;
    while at < raw.len() {
        let b = raw[at];
        if b < 0x80 {
            if b < b' ' || b == 0x7F {
                return Some(at);
            }
            at += 1;
            continue;
        }
        // A lead byte cut by the field's end is bad too.
        let Some(pair) = raw.get(at..at + 2) else {
            return Some(at);
        };
        match encoding_rs::EUC_KR.decode_without_bom_handling_and_without_replacement(pair) {
            Some(text) if text.chars().count() == 1 => at += 2,
            _ => return Some(at),
        }
    }
    None
}

proptest::proptest! {
    /// An `H` field is refused at its first bad byte, whatever else follows.
    #[test]
    fn an_h_field_is_refused_at_its_first_bad_byte(
        raw in proptest::collection::vec(
            proptest::prop_oneof![
                3 => 0x20u8..0x7F,
                1 => 0u8..0x20,
                3 => 0xA1u8..0xFF,
                1 => proptest::prelude::any::<u8>(),
            ],
            1..12,
        )
    ) {
        let f = [field("memo", FieldType::H, raw.len())];
        let got = decode_fields(&f, &raw, 64).err().map(|e| e.offset - 64);
        proptest::prop_assert_eq!(got, first_bad_h_byte(&raw));
    }
}

#[test]
fn decode_keeps_every_field() {
    let (layout, body) = (trf001(), example_request_body());
    let m = layout.decode_request(&body, 64).unwrap();
    assert_eq!(m.len(), 5);
}

// --- Encoding --------------------------------------------------------------------

fn encode_err(fields: &[Field], v: Value) -> FieldError {
    encode_fields(fields, &obj(v), 64).unwrap_err()
}

#[test]
fn encode_missing_keys() {
    let f = [
        field("a", FieldType::AN, 3),
        field("h", FieldType::H, 4),
        required(field("r", FieldType::AN, 2)),
    ];
    assert_eq!(
        encode_fields(&f, &obj(json!({"r": "x"})), 64).unwrap(),
        b"       x "
    );
    assert_eq!(
        encode_fields(&f, &obj(json!({"a": null, "r": "x"})), 64).unwrap(),
        b"       x "
    );
    let e = encode_err(&f, json!({}));
    assert_eq!(
        (e.field.as_str(), e.offset, e.reason.as_str()),
        ("r", 71, "is missing but required")
    );
    let e = encode_err(&f, json!({"r": null}));
    assert_eq!(e.reason, "is null but required");
    let e = encode_err(&[field("n", FieldType::N, 2)], json!({}));
    assert_eq!(e.reason, "is missing; an N field cannot be blank");
    let e = encode_err(&[field("u", FieldType::U, 2)], json!({}));
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (64, "is missing; a U field cannot be blank")
    );
}

#[test]
fn encode_an() {
    let f = [field("a", FieldType::AN, 5)];
    assert_eq!(
        encode_fields(&f, &obj(json!({"a": "ab"})), 0).unwrap(),
        b"ab   "
    );
    assert_eq!(
        encode_fields(&f, &obj(json!({"a": "abcde"})), 0).unwrap(),
        b"abcde"
    );
    let e = encode_err(&f, json!({"a": "abcdef"}));
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (64, "\"abcdef\" is 6 characters, longer than the field's 5")
    );
    let e = encode_err(&f, json!({"a": "aé"}));
    assert_eq!(
        e.reason,
        "character 'é' (U+00E9) at position 1 is not printable ASCII"
    );
    let e = encode_err(&f, json!({"a": "a\n"}));
    assert_eq!(
        e.reason,
        "control character U+000A at position 1 is not printable ASCII"
    );
    let e = encode_err(&f, json!({"a": 5}));
    assert_eq!(e.reason, "expected a string, got a number");
    let e = encode_err(
        &[required(field("a", FieldType::AN, 2))],
        json!({"a": "  "}),
    );
    assert_eq!(e.reason, "is required but blank");
}

#[test]
fn encode_h() {
    let f = [field("memo", FieldType::H, 20)];
    assert_eq!(
        encode_fields(&f, &obj(json!({"memo": "월세 11월"})), 0).unwrap(),
        MEMO
    );
    assert_eq!(
        encode_fields(&f, &obj(json!({"memo": "똠"})), 0).unwrap()[..3],
        *b"\x8c\x63 "
    );
    let e = encode_err(&f, json!({"memo": "월세 😀"}));
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (64, "character '😀' (U+1F600) has no EUC-KR encoding")
    );
    // 10 Hangul fit exactly; the 11th would be 22 bytes, refused, not cut.
    let ten = "가나다라마바사아자차";
    let out = encode_fields(&f, &obj(json!({"memo": ten})), 0).unwrap();
    assert_eq!(out.len(), 20);
    let e = encode_err(&f, json!({"memo": "가나다라마바사아자차카"}));
    assert_eq!(
        e.reason,
        "\"가나다라마바사아자차카\" is 22 bytes in EUC-KR, longer than the field's 20"
    );
    // 19 ASCII + a Hangul: 21 bytes, refused rather than half a character.
    let e = encode_err(&f, json!({"memo": "aaaaaaaaaaaaaaaaaaa가"}));
    assert!(e.reason.contains("is 21 bytes in EUC-KR"), "{e}");
    let e = encode_err(&f, json!({"memo": "a\u{1}"}));
    assert_eq!(e.reason, "control character U+0001 is not allowed");
    let e = encode_err(&f, json!({"memo": ["x"]}));
    assert_eq!(e.reason, "expected a string, got an array");
    let e = encode_err(&[required(field("m", FieldType::H, 2))], json!({"m": ""}));
    assert_eq!(e.reason, "is required but blank");
}

#[test]
fn encode_n() {
    let f = [field("d", FieldType::N, 4)];
    let enc = |v: Value| encode_fields(&f, &obj(json!({ "d": v })), 64);
    assert_eq!(enc(json!("0088")).unwrap(), b"0088");
    assert_eq!(enc(json!(88)).unwrap(), b"0088", "integers are zero-padded");
    assert_eq!(enc(json!(0)).unwrap(), b"0000");
    assert_eq!(enc(json!(9999)).unwrap(), b"9999");
    assert_eq!(
        enc(json!(10000)).unwrap_err().reason,
        "10000 does not fit in 4 digits"
    );
    assert_eq!(
        enc(json!("088")).unwrap_err().reason,
        "\"088\" is 3 digits, the field needs exactly 4"
    );
    assert_eq!(
        enc(json!("08a8")).unwrap_err().reason,
        "character 'a' (U+0061) at position 2 is not an ASCII digit"
    );
    assert_eq!(
        enc(json!(-1)).unwrap_err().reason,
        "-1 is not a non-negative integer or a string of digits"
    );
    assert_eq!(
        enc(json!(1.5)).unwrap_err().reason,
        "1.5 is not a non-negative integer or a string of digits"
    );
    let over: Value = serde_json::from_str("18446744073709551616").unwrap();
    assert_eq!(
        enc(over).unwrap_err().reason,
        "a number above 18446744073709551615 cannot be read exactly as a JSON number; send it \
         as a string of digits"
    );
    assert_eq!(
        enc(json!(true)).unwrap_err().reason,
        "expected a string of 4 digits, got a boolean"
    );
}

#[test]
fn encode_u() {
    let f = [ranged(field("u", FieldType::U, 5), Some(1), Some(90000))];
    let enc = |v: Value| encode_fields(&f, &obj(json!({ "u": v })), 64);
    assert_eq!(enc(json!(42)).unwrap(), b"00042");
    assert_eq!(
        enc(json!("42")).unwrap(),
        b"00042",
        "a string of digits is accepted"
    );
    assert_eq!(
        enc(json!("0000000042")).unwrap(),
        b"00042",
        "by value, not by width"
    );
    assert_eq!(
        enc(json!(0)).unwrap_err().reason,
        "0 is below the minimum 1"
    );
    assert_eq!(
        enc(json!(90001)).unwrap_err().reason,
        "90001 is above the maximum 90000"
    );
    assert_eq!(
        enc(json!(-5)).unwrap_err().reason,
        "-5 is not a non-negative integer"
    );
    assert_eq!(
        enc(json!(2.0)).unwrap_err().reason,
        "2.0 is not a non-negative integer"
    );
    // 2^64 is read as a rounded float: said as the whole number it was.
    let over: Value = serde_json::from_str("18446744073709551616").unwrap();
    assert_eq!(
        enc(over).unwrap_err().reason,
        "a number above 18446744073709551615 does not fit in 5 digits"
    );
    assert_eq!(
        enc(json!("")).unwrap_err().reason,
        "\"\" is not a string of digits"
    );
    assert_eq!(
        enc(json!(" 42")).unwrap_err().reason,
        "\" 42\" is not a string of digits"
    );
    assert_eq!(
        enc(json!("99999999999999999999")).unwrap_err().reason,
        "99999999999999999999 does not fit in a u64"
    );
    assert_eq!(
        enc(json!({})).unwrap_err().reason,
        "expected a number, got an object"
    );
    let wide = [field("u", FieldType::U, 3)];
    let e = encode_err(&wide, json!({"u": 1000}));
    assert_eq!(
        (e.offset, e.reason.as_str()),
        (64, "1000 does not fit in 3 digits")
    );
    let full = [field("u", FieldType::U, 19)];
    let out = encode_fields(&full, &obj(json!({"u": u64::MAX / 10})), 0).unwrap();
    assert_eq!(out, b"1844674407370955161");
}

#[test]
fn encode_offsets_follow_the_fields() {
    let layout = trf001();
    let mut v = example_request_json();
    v.insert("amount".into(), json!(0));
    let e = layout.encode_request(&v, 64).unwrap_err();
    assert_eq!((e.field.as_str(), e.offset), ("amount", 64 + 35));
    v.insert("amount".into(), json!(1));
    v.insert("memo".into(), json!("😀"));
    let e = layout.encode_request(&v, 64).unwrap_err();
    assert_eq!((e.field.as_str(), e.offset), ("memo", 64 + 48));
}

#[test]
fn encode_ignores_extra_keys_and_is_field_length() {
    let layout = trf001();
    let v = obj(
        json!({"txn_id": "T1", "processed_at": "20261129132001", "balance": 0, "result": "OK"}),
    );
    let out = layout.encode_response(&v, 64).unwrap();
    assert_eq!(out.len(), layout.response_len());
    assert_eq!(&out[..], b"T1              20261129132001000000000000000");
}

/// Values of every kind for the response layouts' keys (and one they do not
/// name), as JSON text: strings with escapes, numbers of each sign and size,
/// nesting.
fn answer_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u64..1000).prop_map(|n| Value::from(n as f64 / 8.0)),
        "[ -~]{0,20}".prop_map(Value::from),
        "[0-9]{0,16}".prop_map(Value::from),
        "\\PC{0,6}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            proptest::collection::btree_map("[a-z]{1,3}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    /// The core's answer read without a map writes every shipped layout's
    /// response (and request) to the same bytes, or the same error, as the
    /// map `serde_json` reads from the same text: keys repeated, in any
    /// order, with escapes.
    #[test]
    fn an_answer_read_without_a_map_writes_as_the_map(
        entries in proptest::collection::vec(
            (
                proptest::prop_oneof![
                    proptest::sample::select(vec![
                        "txn_id", "processed_at", "balance", "result", "status",
                        "orig_guid", "memo", "amount", "unknown_key",
                    ])
                    .prop_map(str::to_string),
                    "[a-z_]{1,8}",
                ],
                answer_value(),
            ),
            0..10,
        ),
    ) {
        use crate::json_object::BorrowedObject;
        let text = format!(
            "{{{}}}",
            entries
                .iter()
                .map(|(k, v)| format!("{}:{v}", Value::from(k.as_str())))
                .collect::<Vec<_>>()
                .join(",")
        );
        let map: Map<String, Value> = serde_json::from_str(&text).unwrap();
        let borrowed = BorrowedObject::parse(text.as_bytes()).unwrap();
        for layout in builtin().values() {
            for fields in [&layout.response, &layout.request] {
                proptest::prop_assert_eq!(
                    encode_fields(fields, &borrowed, HEADER_LEN),
                    encode_fields(fields, &map, HEADER_LEN)
                );
            }
        }
    }
}
