//! How a call to the core ended, and the one table from that ending to the
//! standard response code a channel sees (protocol section 6).
//!
//! The core's HTTP status and its business result are read together here and
//! nowhere else. Business results map to B-codes through a data file
//! (`layouts/codes/codes.json`), not through code.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;

use crate::json_object::BorrowedObject;

/// A four-character standard response code.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Code(pub [u8; 4]);

impl Code {
    pub const OK: Code = Code(*b"0000");
    pub const NOT_ROUTED: Code = Code(*b"E101");
    pub const FORMAT: Code = Code(*b"E102");
    pub const CHANNEL: Code = Code(*b"E103");
    pub const TARGET_ERROR: Code = Code(*b"E500");
    pub const UNKNOWN: Code = Code(*b"E901");
    pub const NOT_SENT: Code = Code(*b"E902");
    pub const NO_CAPACITY: Code = Code(*b"E903");
    pub const NEVER_RECEIVED: Code = Code(*b"E904");
    pub const RESEND_REFUSED: Code = Code(*b"E905");

    /// Parses a code from a table or a journal row: 4 of `[0-9A-Z]`.
    pub fn parse(s: &str) -> Option<Code> {
        let b: [u8; 4] = s.as_bytes().try_into().ok()?;
        b.iter()
            .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
            .then_some(Code(b))
    }

    pub fn as_str(&self) -> &str {
        // Constructed only from ASCII.
        std::str::from_utf8(&self.0).unwrap_or("????")
    }

    /// Whether the answer is final: the same GUID is replayed, never resent.
    pub fn is_final(&self) -> bool {
        *self == Code::OK || self.0[0] == b'B' || *self == Code::TARGET_ERROR
    }

    /// What the code tells a channel (for `relayhub send` and the docs).
    pub fn meaning(&self) -> &'static str {
        match &self.0 {
            b"0000" => "processed; money moved (a resend replays this answer)",
            b"E101" => "tx code not routed; nothing recorded",
            b"E102" => "framing, header or body format error; nothing recorded",
            b"E103" => "channel not allowed; nothing recorded",
            b"E500" => "the core failed or refused the request; no money moved (final)",
            b"E901" => {
                "outcome unknown (sent, or not sent while the hub's journal failed): resend the same GUID, never a new one"
            }
            b"E902" => "not sent (core unreachable); safe to resend",
            b"E903" => "not sent (hub had no capacity or is shutting down); safe to resend",
            b"E904" => "inquiry: the core never received that GUID; safe to resend",
            b"E905" => "resend refused (cooldown or maximum); nothing sent",
            [b'B', ..] => "rejected by the core for a business reason; no money moved",
            _ => "unknown code",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Code({})", self.as_str())
    }
}

/// The ways a call (or the attempt to make one) can end.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The core processed it; the JSON answer holds the response fields.
    Processed(Answer),
    /// The core refused it for a business reason; no money moved.
    Rejected(String),
    /// The core (or the path to it) failed in a way that is final: nothing moved.
    TargetError(String),
    /// Nothing left the hub; safe to send again.
    NotSent(String),
    /// The hub had no capacity (or is draining); nothing was sent.
    NoCapacity(String),
    /// Something was sent and no readable answer came back.
    Unknown(String),
    /// An inquiry: the core never received that GUID.
    NeverReceived,
}

/// A code table that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("code table {file}: {reason}")]
pub struct CodeTableError {
    pub file: String,
    pub reason: String,
}

/// Business result -> standard code, loaded from `layouts/codes/codes.json`.
#[derive(Debug, Clone)]
pub struct CodeTable {
    business: BTreeMap<String, Code>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CodeTableFile {
    #[serde(default)]
    #[allow(dead_code)]
    description: String,
    business: BTreeMap<String, String>,
}

const BUILTIN_CODES: &str = include_str!("../layouts/codes/codes.json");

/// The B-codes of the standard table (docs/protocol.md section 6): a code
/// table maps business results onto these, and a channel knows no other.
pub const STANDARD_B_CODES: [&str; 3] = ["B201", "B202", "B203"];

impl CodeTable {
    /// The shipped table, compiled in.
    pub fn builtin() -> CodeTable {
        CodeTable::from_json("builtin codes.json", BUILTIN_CODES)
            .expect("shipped code table is valid")
    }

    pub fn from_file(path: &Path) -> Result<CodeTable, CodeTableError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| CodeTableError {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        CodeTable::from_json(&file, &text)
    }

    /// Parses a table; every value must be a B-code of the standard table
    /// ([`STANDARD_B_CODES`]): a `B299` would reach channels that know no
    /// such code (found by a black-box probe).
    pub fn from_json(file: &str, text: &str) -> Result<CodeTable, CodeTableError> {
        let err = |reason: String| CodeTableError {
            file: file.into(),
            reason,
        };
        let parsed: CodeTableFile = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        let mut business = BTreeMap::new();
        for (result, code) in parsed.business {
            let c = Code::parse(&code)
                .filter(|_| STANDARD_B_CODES.contains(&code.as_str()))
                .ok_or_else(|| {
                    err(format!(
                        "business.{result}: {code:?} is not a B-code of the standard table ({})",
                        STANDARD_B_CODES.join(", ")
                    ))
                })?;
            business.insert(result, c);
        }
        Ok(CodeTable { business })
    }

    /// The B-code for a business result, if the table knows it.
    pub fn business(&self, result: &str) -> Option<Code> {
        self.business.get(result).copied()
    }

    /// The business results that map to `code` (for explaining a B-code).
    pub fn results_for(&self, code: Code) -> Vec<&str> {
        self.business
            .iter()
            .filter(|(_, c)| **c == code)
            .map(|(r, _)| r.as_str())
            .collect()
    }

    /// The standard code for an outcome.
    pub fn code(&self, outcome: &Outcome) -> Code {
        match outcome {
            Outcome::Processed(_) => Code::OK,
            Outcome::Rejected(result) => self.business(result).unwrap_or(Code::TARGET_ERROR),
            Outcome::TargetError(_) => Code::TARGET_ERROR,
            Outcome::NotSent(_) => Code::NOT_SENT,
            Outcome::NoCapacity(_) => Code::NO_CAPACITY,
            Outcome::Unknown(_) => Code::UNKNOWN,
            Outcome::NeverReceived => Code::NEVER_RECEIVED,
        }
    }
}

/// The core's JSON answer to a processed transfer (or inquiry), as it came.
///
/// Kept as its bytes, which are one JSON object: the response layout reads
/// them again, borrowed ([`Answer::fields`]), when it writes the reply, so
/// no map of the answer's keys and values is built and dropped per telegram.
#[derive(Clone, PartialEq)]
pub struct Answer(Vec<u8>);

impl Answer {
    /// The answer's fields, for the response layout.
    pub fn fields(&self) -> BorrowedObject<'_> {
        // Made only from bytes that read as one object (or `{}`).
        BorrowedObject::parse(&self.0).unwrap_or_default()
    }
}

/// An empty object: `{}`.
impl Default for Answer {
    fn default() -> Answer {
        Answer(b"{}".to_vec())
    }
}

impl fmt::Debug for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Answer({})", String::from_utf8_lossy(&self.0))
    }
}

/// Why a body is not one JSON object, for the log and the journal: the
/// parser's words and position (a byte-order mark, EUC-KR bytes, a lone
/// surrogate, trailing bytes), read again only on this rare path.
fn unreadable(what: &str, body: &[u8]) -> String {
    let reason = match serde_json::from_slice::<serde_json::Value>(body) {
        Err(e) => e.to_string(),
        Ok(v) if !v.is_object() => "JSON, but not an object".into(),
        Ok(_) => "not one JSON object".into(),
    };
    format!("{what} with an unreadable body: {reason}")
}

/// The answer's `result`; none when it is given twice (`{"result":"OK",
/// "result":"NOT_FOUND"}`): neither a final answer nor a "never received"
/// is read from an answer that says both.
fn result_of<'a>(m: &'a BorrowedObject<'_>) -> Option<&'a str> {
    m.sole_text("result")
}

/// Why a 200's body (read as an object) is not a processed transfer.
fn not_ok(m: &BorrowedObject<'_>) -> &'static str {
    match (m.text("result"), result_of(m)) {
        (Some(_), None) => "200 whose result is given more than once",
        _ => "200 whose result is not OK",
    }
}

/// Reads the core's answer to `POST /v1/transfers` (the request was sent).
pub fn classify_transfer(status: u16, body: &[u8], table: &CodeTable) -> Outcome {
    read_transfer(status, body, table).0
}

/// [`classify_transfer`], with the answer's fields as read when it was
/// processed: the response layout writes them without reading the body again.
pub fn read_transfer<'b>(
    status: u16,
    body: &'b [u8],
    table: &CodeTable,
) -> (Outcome, Option<BorrowedObject<'b>>) {
    let outcome = match status {
        200 => {
            return match BorrowedObject::parse(body) {
                Some(m) if result_of(&m) == Some("OK") => {
                    (Outcome::Processed(Answer(body.to_vec())), Some(m))
                }
                Some(m) => (Outcome::Unknown(not_ok(&m).into()), None),
                None => (Outcome::Unknown(unreadable("200", body)), None),
            };
        }
        201..=299 => Outcome::Unknown(format!("{status} instead of 200")),
        // A redirect is no refusal: `303 See Other` means "processed, the result
        // is elsewhere". The hub follows none (the target's URL is wrong: a
        // configuration problem), so the outcome is unknown.
        300..=399 => Outcome::Unknown(format!(
            "{status}: a redirect answered to the transfer (check the target's urls); the core may have processed it"
        )),
        // Outside HTTP's classes (a 101 Switching Protocols, or 600 and
        // above): not a refusal anyone defined, so no proof nothing moved.
        ..=199 | 600.. => Outcome::Unknown(format!(
            "{status}: a status outside HTTP's classes answered to the transfer; the core may have processed it"
        )),
        422 => match BorrowedObject::parse(body) {
            Some(m) => match result_of(&m) {
                Some(r) if table.business(r).is_some() => Outcome::Rejected(r.to_string()),
                Some(r) => Outcome::TargetError(format!("422 with unmapped result {r:?}")),
                None => Outcome::TargetError(format!("422 without a result{}", core_says(body))),
            },
            None => Outcome::TargetError(unreadable("422", body)),
        },
        409 => Outcome::Unknown("409: the core is processing this GUID right now".into()),
        502 | 504 => Outcome::Unknown(format!(
            "{status} from a gateway: the core may have processed it"
        )),
        401 | 403 => Outcome::TargetError(format!(
            "{status}: the core refused the hub's credentials (configuration problem)"
        )),
        _ => Outcome::TargetError(format!("status {status}{}", core_says(body))),
    };
    (outcome, None)
}

/// Reads the core's answer to `GET /v1/transfers/{guid}` (the request was sent).
pub fn classify_inquiry(status: u16, body: &[u8], table: &CodeTable) -> Outcome {
    let m = BorrowedObject::parse(body);
    match status {
        200 => {
            let Some(m) = m else {
                return Outcome::Unknown(unreadable("inquiry 200", body));
            };
            match (m.sole_text("status"), result_of(&m)) {
                (Some("DONE"), Some("OK")) => Outcome::Processed(Answer(body.to_vec())),
                (Some("DONE"), Some(r)) if table.business(r).is_some() => {
                    Outcome::Rejected(r.to_string())
                }
                (Some("DONE"), Some(r)) => {
                    Outcome::TargetError(format!("inquiry: DONE with unmapped result {r:?}"))
                }
                (Some("PROCESSING"), _) => {
                    Outcome::Unknown("inquiry: the core is still processing it".into())
                }
                _ => Outcome::Unknown("inquiry 200 with an unreadable status".into()),
            }
        }
        // Only the core's own NOT_FOUND says "never received": a proxy's 404 for
        // a wrong path must not make a channel resend a transfer that happened.
        404 if m.as_ref().and_then(result_of) == Some("NOT_FOUND") => Outcome::NeverReceived,
        300..=399 => Outcome::Unknown(format!(
            "inquiry answered {status}: a redirect (check the target's urls)"
        )),
        _ => Outcome::Unknown(format!("inquiry answered {status}{}", core_says(body))),
    }
}

/// The most of the core's own text a reason keeps.
pub const CORE_TEXT_MAX: usize = 200;

/// `, the core said: TEXT` with the core's body, or nothing for an empty one.
/// At most [`CORE_TEXT_MAX`] characters, control characters escaped, so it
/// fits on one log line and in the journal's `last_error`.
fn core_says(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return String::new();
    }
    let mut out = String::from(", the core said: ");
    for (n, c) in text.chars().enumerate() {
        if n == CORE_TEXT_MAX {
            out.push_str("...");
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// Whether an inquiry answer is worth another try within the budget.
pub fn inquiry_is_retryable(status: u16) -> bool {
    status == 429 || (status >= 500 && status != 501 && status != 505)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> CodeTable {
        CodeTable::builtin()
    }

    fn code_of_transfer(status: u16, body: &str) -> Code {
        t().code(&classify_transfer(status, body.as_bytes(), &t()))
    }

    /// An unreadable body's note says why, in the parser's words, so an
    /// operator can tell a byte-order mark from EUC-KR bytes or trailing
    /// bytes (before: "200 with an unreadable body" for all of them).
    #[test]
    fn an_unreadable_body_is_named_with_its_reason() {
        let note = |status: u16, body: &[u8]| match classify_transfer(status, body, &t()) {
            Outcome::Unknown(r) | Outcome::TargetError(r) => r,
            other => panic!("{other:?}"),
        };
        for (body, want) in [
            (
                &b"\xef\xbb\xbf{\"result\":\"OK\"}"[..],
                "expected value at line 1 column 1",
            ),
            (
                b"{\"result\":\"OK\"} x",
                "trailing characters at line 1 column 17",
            ),
            (b"{\"result\":\"\xb0\xa1\"}", "invalid unicode code point"),
            (b"[1]", "JSON, but not an object"),
        ] {
            let n = note(200, body);
            assert!(n.starts_with("200 with an unreadable body: "), "{n}");
            assert!(n.contains(want), "{n} lacks {want:?}");
        }
        assert!(note(422, b"<html>").starts_with("422 with an unreadable body: expected value"));
        // An object, but no result in it: said as such.
        assert!(note(422, br#"{"error":"x"}"#).starts_with("422 without a result"));
        let inq = classify_inquiry(200, b"{\"status\":\"DONE\"", &t());
        assert!(
            matches!(&inq, Outcome::Unknown(r) if r.starts_with("inquiry 200 with an unreadable body: EOF")),
            "{inq:?}"
        );
    }

    /// An answer whose `result` (or an inquiry's `status`) is given twice
    /// is read as neither: not processed, not "never received" (found by a
    /// black-box probe: a 404 with "OK" then "NOT_FOUND" was E904, and a
    /// resend posted again).
    #[test]
    fn a_repeated_result_is_read_as_no_result() {
        let twice = br#"{"result":"OK","result":"NOT_FOUND"}"#;
        assert_eq!(t().code(&classify_inquiry(404, twice, &t())), Code::UNKNOWN);
        let ok_twice = br#"{"result":"OK","txn_id":"T1","balance":1,"processed_at":"20261129132001","result":"OK"}"#;
        assert_eq!(
            classify_transfer(200, ok_twice, &t()),
            Outcome::Unknown("200 whose result is given more than once".into()),
            "the note says why"
        );
        assert_eq!(
            classify_transfer(200, br#"{"result":"FAILED"}"#, &t()),
            Outcome::Unknown("200 whose result is not OK".into())
        );
        let status_twice = br#"{"status":"PROCESSING","status":"DONE","result":"OK"}"#;
        assert_eq!(
            t().code(&classify_inquiry(200, status_twice, &t())),
            Code::UNKNOWN
        );
        let once = br#"{"result":"NOT_FOUND"}"#;
        assert_eq!(classify_inquiry(404, once, &t()), Outcome::NeverReceived);
    }

    #[test]
    fn transfer_table() {
        let ok = r#"{"result":"OK","txn_id":"T1","balance":1,"processed_at":"20261129132001"}"#;
        assert_eq!(code_of_transfer(200, ok), Code::OK);
        assert_eq!(
            code_of_transfer(422, r#"{"result":"INSUFFICIENT_FUNDS"}"#).as_str(),
            "B201"
        );
        assert_eq!(
            code_of_transfer(422, r#"{"result":"ACCOUNT_NOT_FOUND"}"#).as_str(),
            "B202"
        );
        assert_eq!(
            code_of_transfer(422, r#"{"result":"LIMIT_EXCEEDED"}"#).as_str(),
            "B203"
        );
        assert_eq!(
            code_of_transfer(422, r#"{"result":"FROZEN"}"#),
            Code::TARGET_ERROR
        );
        assert_eq!(code_of_transfer(422, "<html>"), Code::TARGET_ERROR);
        for s in [500, 501, 503, 505, 400, 401, 403, 404, 429] {
            assert_eq!(code_of_transfer(s, ""), Code::TARGET_ERROR, "{s}");
        }
        for s in [502, 504, 409, 201, 202, 204] {
            assert_eq!(code_of_transfer(s, ok), Code::UNKNOWN, "{s}");
        }
        // A redirect may follow processing (303 See Other), and a status
        // outside HTTP's classes proves nothing: never final.
        for s in [
            300, 301, 302, 303, 304, 307, 308, 399, 0, 101, 199, 600, 999,
        ] {
            assert_eq!(code_of_transfer(s, ""), Code::UNKNOWN, "{s}");
            assert_eq!(code_of_transfer(s, ok), Code::UNKNOWN, "{s}");
        }
        assert_eq!(code_of_transfer(200, "{not json"), Code::UNKNOWN);
        assert_eq!(
            code_of_transfer(200, r#"{"result":"INSUFFICIENT_FUNDS"}"#),
            Code::UNKNOWN
        );
    }

    #[test]
    fn inquiry_table() {
        let c = |s: u16, b: &str| t().code(&classify_inquiry(s, b.as_bytes(), &t()));
        assert_eq!(
            c(
                200,
                r#"{"status":"DONE","result":"OK","txn_id":"T","balance":1,"processed_at":"20261129132001"}"#
            ),
            Code::OK
        );
        assert_eq!(
            c(200, r#"{"status":"DONE","result":"LIMIT_EXCEEDED"}"#).as_str(),
            "B203"
        );
        assert_eq!(
            c(200, r#"{"status":"DONE","result":"ODD"}"#),
            Code::TARGET_ERROR
        );
        assert_eq!(c(200, r#"{"status":"PROCESSING"}"#), Code::UNKNOWN);
        assert_eq!(c(404, r#"{"result":"NOT_FOUND"}"#), Code::NEVER_RECEIVED);
        assert_eq!(c(404, "Not Found"), Code::UNKNOWN);
        assert_eq!(c(503, ""), Code::UNKNOWN);
        assert_eq!(c(200, "garbage"), Code::UNKNOWN);
        for s in [301, 302, 303, 307, 308] {
            assert_eq!(c(s, ""), Code::UNKNOWN, "{s}");
            assert!(!inquiry_is_retryable(s), "{s}");
        }
    }

    /// serde_json's reserved token as an object's first key makes a body
    /// unreadable, at any depth: never a 0000 or a "never received" that the
    /// top level alone would give.
    #[test]
    fn a_body_with_serde_jsons_reserved_first_key_proves_nothing() {
        let wrapped =
            r#"{"$serde_json::private::RawValue":"{\"result\":\"OK\",\"txn_id\":\"T1\"}"}"#;
        assert_eq!(code_of_transfer(200, wrapped), Code::UNKNOWN);
        let nested = r#"{"result":"OK","x":{"$serde_json::private::RawValue":1}}"#;
        assert_eq!(code_of_transfer(200, nested), Code::UNKNOWN);
        let inquiry = |s: u16, b: &str| t().code(&classify_inquiry(s, b.as_bytes(), &t()));
        let not_found = r#"{"result":"NOT_FOUND","x":[{"$serde_json::private::RawValue":true}]}"#;
        assert_eq!(inquiry(404, not_found), Code::UNKNOWN);
        let done = r#"{"status":"DONE","result":"OK","x":{"$serde_json::private::RawValue":"1"}}"#;
        assert_eq!(inquiry(200, done), Code::UNKNOWN);
    }

    #[test]
    fn the_core_s_text_is_kept_bounded_and_on_one_line() {
        let o = classify_transfer(
            400,
            b"{\"result\":\"BAD_REQUEST\",\"error\":\"missing field to_bank\"}\r\n",
            &t(),
        );
        assert_eq!(
            o,
            Outcome::TargetError(
                "status 400, the core said: {\"result\":\"BAD_REQUEST\",\"error\":\"missing field to_bank\"}".into()
            )
        );
        let long = format!("line one\nline two\u{1b}[31m{}", "x".repeat(500));
        let Outcome::TargetError(r) = classify_transfer(503, long.as_bytes(), &t()) else {
            panic!("503 is a target error");
        };
        assert!(r.contains("line one\\nline two\\u{1b}[31m"), "{r}");
        assert!(!r.chars().any(char::is_control), "{r}");
        assert!(
            r.ends_with("...") && r.len() < 260,
            "{} chars: {r}",
            r.len()
        );
        assert_eq!(
            classify_transfer(500, b"", &t()),
            Outcome::TargetError("status 500".into())
        );
        assert_eq!(
            classify_inquiry(503, b"busy", &t()),
            Outcome::Unknown("inquiry answered 503, the core said: busy".into())
        );
    }

    #[test]
    fn retryable_inquiry_statuses() {
        assert!(inquiry_is_retryable(503));
        assert!(inquiry_is_retryable(429));
        assert!(inquiry_is_retryable(502));
        assert!(!inquiry_is_retryable(501));
        assert!(!inquiry_is_retryable(505));
        assert!(!inquiry_is_retryable(404));
    }

    #[test]
    fn code_table_refuses_non_b_codes() {
        let e = CodeTable::from_json("x.json", r#"{"business":{"X":"E901"}}"#).unwrap_err();
        assert!(e.to_string().contains("business.X"), "{e}");
        // A B-code outside the standard table reaches channels that know none.
        let e = CodeTable::from_json("x.json", r#"{"business":{"X":"B299"}}"#).unwrap_err();
        assert!(
            e.to_string().contains(
                r#"business.X: "B299" is not a B-code of the standard table (B201, B202, B203)"#
            ),
            "{e}"
        );
        for code in STANDARD_B_CODES {
            let json = format!(r#"{{"business":{{"X":"{code}"}}}}"#);
            assert!(CodeTable::from_json("x.json", &json).is_ok(), "{code}");
        }
        assert!(CodeTable::from_json("x.json", r#"{"business":{},"extra":1}"#).is_err());
    }

    #[test]
    fn finality() {
        assert!(Code::OK.is_final());
        assert!(Code::parse("B201").unwrap().is_final());
        assert!(Code::TARGET_ERROR.is_final());
        assert!(!Code::UNKNOWN.is_final());
        assert!(!Code::NOT_SENT.is_final());
    }
}
