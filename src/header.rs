//! The 64-byte header every telegram starts with (docs/protocol.md section 3).
//!
//! | offset | len | field        |
//! |-------:|----:|--------------|
//! | 0      | 6   | `tx_code`    |
//! | 6      | 32  | `guid`       |
//! | 38     | 8   | `channel_id` |
//! | 46     | 14  | `sent_at`    |
//! | 60     | 4   | `resp_code`  |
//!
//! [`parse_header`] is check 1 of section 3 (anything wrong -> E102). [`Echo`] is what
//! an answer copies back even when the header is broken, so a channel can still
//! match the answer to its request. [`write_response`] builds the answer's header.

use std::ops::Range;

use crate::frame::ByteDisplay;

/// Length of the header in bytes.
pub const HEADER_LEN: usize = 64;

/// Byte range of `tx_code`.
pub const TX_CODE: Range<usize> = 0..6;
/// Byte range of `guid`.
pub const GUID: Range<usize> = 6..38;
/// Byte range of `channel_id`.
pub const CHANNEL_ID: Range<usize> = 38..46;
/// Byte range of `sent_at`.
pub const SENT_AT: Range<usize> = 46..60;
/// Byte range of `resp_code`.
pub const RESP_CODE: Range<usize> = 60..64;

/// A request header that passed every check of section 3, check 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header<'a> {
    /// `[A-Z0-9]{6}`; selects the route and layout.
    pub tx_code: &'a str,
    /// `[0-9A-Za-z_-]{32}`; identifies the business transaction.
    pub guid: &'a str,
    /// The channel, trailing spaces trimmed (never empty).
    pub channel_id: &'a str,
    /// `YYYYMMDDhhmmss`, a valid date-time (the channel's clock, not checked against
    /// the hub's).
    pub sent_at: &'a str,
}

/// Why a header was refused (E102), or the header field behind an E101 or
/// E103. `offset` is the first bad byte within the telegram, or the field's
/// start when the field as a whole is wrong.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("header field `{field}` at byte {offset}: {reason}")]
pub struct HeaderError {
    /// `header` (too short), `tx_code`, `guid`, `channel_id`, `sent_at` or `resp_code`.
    pub field: &'static str,
    /// Byte offset within the telegram.
    pub offset: usize,
    /// What is wrong, for the operator's log.
    pub reason: String,
}

impl HeaderError {
    pub fn new(field: &'static str, offset: usize, reason: impl Into<String>) -> Self {
        Self {
            field,
            offset,
            reason: reason.into(),
        }
    }
}

/// Checks a request telegram's header (check 1 of section 3) and returns its fields.
///
/// Fields are checked in header order and the first problem is reported, so the
/// operator sees the earliest bad byte.
/// The fields borrow the telegram: no copy per telegram.
pub fn parse_header(telegram: &[u8]) -> Result<Header<'_>, HeaderError> {
    let Some(h) = telegram.first_chunk::<HEADER_LEN>() else {
        return Err(HeaderError::new(
            "header",
            telegram.len(),
            format!(
                "telegram is {} bytes, shorter than the {HEADER_LEN}-byte header",
                telegram.len()
            ),
        ));
    };

    check_chars("tx_code", h, TX_CODE, "A-Z or 0-9", |b| {
        b.is_ascii_uppercase() || b.is_ascii_digit()
    })?;
    check_chars("guid", h, GUID, "0-9, A-Z, a-z, '_' or '-'", |b| {
        b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
    })?;
    // A leading space is the field's first byte: checked before the rest.
    match h[CHANNEL_ID].iter().position(|&b| b != b' ') {
        None => return Err(HeaderError::new("channel_id", CHANNEL_ID.start, "is blank")),
        Some(0) => {}
        Some(_) => {
            return Err(HeaderError::new(
                "channel_id",
                CHANNEL_ID.start,
                "starts with a space; it must be left-aligned",
            ));
        }
    }
    check_chars("channel_id", h, CHANNEL_ID, "printable ASCII", is_printable)?;
    // The characters before what they mean: a date with a letter in it is
    // refused at the letter.
    check_chars("sent_at", h, SENT_AT, "an ASCII digit", |b| {
        b.is_ascii_digit()
    })?;
    check_date_time(&h[SENT_AT])?;
    if let Some(i) = h[RESP_CODE].iter().position(|&b| b != b' ') {
        return Err(HeaderError::new(
            "resp_code",
            RESP_CODE.start + i,
            format!(
                "byte {} is not a space; a request's resp_code must be four spaces",
                ByteDisplay(h[RESP_CODE.start + i])
            ),
        ));
    }

    Ok(Header {
        tx_code: ascii(&h[TX_CODE]),
        guid: ascii(&h[GUID]),
        channel_id: ascii(&h[CHANNEL_ID]).trim_end_matches(' '),
        sent_at: ascii(&h[SENT_AT]),
    })
}

/// Where `s` (a field's text, trailing spaces trimmed) stops being a GUID
/// of 32 [0-9A-Za-z_-], as the header's `guid` must be: its first other
/// byte, or where it ends short.
pub fn first_non_guid_byte(s: &str) -> Option<usize> {
    s.bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
        .or_else(|| (s.len() != 32).then_some(s.len().min(32)))
}

/// Reports the first byte of `range` that `ok` refuses.
fn check_chars(
    field: &'static str,
    h: &[u8; HEADER_LEN],
    range: Range<usize>,
    allowed: &str,
    ok: impl Fn(u8) -> bool,
) -> Result<(), HeaderError> {
    let start = range.start;
    match h[range].iter().position(|&b| !ok(b)) {
        None => Ok(()),
        Some(i) => Err(HeaderError::new(
            field,
            start + i,
            format!("byte {} is not {allowed}", ByteDisplay(h[start + i])),
        )),
    }
}

/// `sent_at` is 14 digits already; checks it names a real calendar date and time.
fn check_date_time(d: &[u8]) -> Result<(), HeaderError> {
    // Two digits at `i` as a number; the caller has checked they are digits.
    let two = |i: usize| u32::from(d[i] - b'0') * 10 + u32::from(d[i + 1] - b'0');
    let year = (two(0) * 100 + two(2)) as i32;
    let (month, day) = (two(4), two(6));
    let (hour, minute, second) = (two(8), two(10), two(12));
    let at = |i: usize| SENT_AT.start + i;
    let text = ascii(d);
    if !(1..=12).contains(&month) {
        return Err(HeaderError::new(
            "sent_at",
            at(4),
            format!("{text} is not a valid date-time: month {month:02} is not 01-12"),
        ));
    }
    if chrono::NaiveDate::from_ymd_opt(year, month, day).is_none() {
        return Err(HeaderError::new(
            "sent_at",
            at(6),
            format!("{text} is not a valid date-time: {year:04}-{month:02} has no day {day:02}"),
        ));
    }
    for (value, limit, i, what) in [
        (hour, 23, 8, "hour"),
        (minute, 59, 10, "minute"),
        (second, 59, 12, "second"),
    ] {
        if value > limit {
            return Err(HeaderError::new(
                "sent_at",
                at(i),
                format!("{text} is not a valid date-time: {what} {value:02} is not 00-{limit}"),
            ));
        }
    }
    Ok(())
}

fn is_printable(b: u8) -> bool {
    (0x20..=0x7E).contains(&b)
}

/// Views bytes already checked to be ASCII as a `&str`.
fn ascii(bytes: &[u8]) -> &str {
    // Callers only pass checked ASCII; the fallback keeps this panic-free regardless.
    std::str::from_utf8(bytes).unwrap_or("")
}

/// What an answer echoes from the request: each field copied when it is wholly
/// present and all printable ASCII, else spaces (section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Echo {
    /// Bytes 0..6 of the answer.
    pub tx_code: [u8; 6],
    /// Bytes 6..38 of the answer.
    pub guid: [u8; 32],
    /// Bytes 38..46 of the answer.
    pub channel_id: [u8; 8],
}

impl Echo {
    /// All spaces: the *blank header* of section 2, for framing errors.
    pub fn blank() -> Self {
        Self {
            tx_code: [b' '; 6],
            guid: [b' '; 32],
            channel_id: [b' '; 8],
        }
    }

    /// Copies what can safely be echoed from any telegram, however broken.
    pub fn from_telegram(telegram: &[u8]) -> Self {
        Self {
            tx_code: echo_field(telegram, TX_CODE),
            guid: echo_field(telegram, GUID),
            channel_id: echo_field(telegram, CHANNEL_ID),
        }
    }

    /// The GUID, trimmed, for logs (empty when blank).
    pub fn guid_str(&self) -> &str {
        trimmed(&self.guid)
    }

    /// The tx code, trimmed, for logs (empty when blank).
    pub fn tx_code_str(&self) -> &str {
        trimmed(&self.tx_code)
    }

    /// The channel id, trimmed, for logs (empty when blank).
    pub fn channel_id_str(&self) -> &str {
        trimmed(&self.channel_id)
    }
}

impl Default for Echo {
    fn default() -> Self {
        Self::blank()
    }
}

fn echo_field<const N: usize>(telegram: &[u8], range: Range<usize>) -> [u8; N] {
    let mut out = [b' '; N];
    if let Some(src) = telegram.get(range)
        && src.len() == N
        && src.iter().all(|&b| is_printable(b))
    {
        out.copy_from_slice(src);
    }
    out
}

fn trimmed(bytes: &[u8]) -> &str {
    // The fields are public, so they may hold anything; non-UTF-8 shows as empty.
    std::str::from_utf8(bytes).unwrap_or("").trim_matches(' ')
}

/// Appends the 64-byte response header and `body` to `out`.
///
/// `sent_at` should be 14 digits (see [`local_timestamp`]) and `code` 4 characters;
/// each is fitted to its width (cut or space-padded) so the header is always exactly
/// 64 bytes whatever the caller passes.
pub fn write_response(echo: &Echo, sent_at: &str, code: &str, body: &[u8], out: &mut Vec<u8>) {
    debug_assert_eq!(sent_at.len(), SENT_AT.len(), "sent_at must be 14 digits");
    debug_assert_eq!(code.len(), RESP_CODE.len(), "code must be 4 characters");
    out.reserve(HEADER_LEN + body.len());
    out.extend_from_slice(&echo.tx_code);
    out.extend_from_slice(&echo.guid);
    out.extend_from_slice(&echo.channel_id);
    put_fitted(out, sent_at.as_bytes(), SENT_AT.len());
    put_fitted(out, code.as_bytes(), RESP_CODE.len());
    out.extend_from_slice(body);
}

fn put_fitted(out: &mut Vec<u8>, src: &[u8], width: usize) {
    let n = src.len().min(width);
    out.extend_from_slice(&src[..n]);
    out.resize(out.len() + (width - n), b' ');
}

/// The hub's local time as `YYYYMMDDhhmmss`, for `sent_at` in answers.
///
/// Made once per second for the whole process. `chrono::Local` keeps its
/// time zone per thread and looks at `/etc/localtime` again once a second on
/// each: with a thread per slow call that was a `statx` and a zone lookup for
/// most answers. The local time of a UTC second does not change within it.
pub fn local_timestamp() -> String {
    static LAST: std::sync::RwLock<(i64, [u8; 14])> = std::sync::RwLock::new((i64::MIN, [0; 14]));
    let now = chrono::Utc::now();
    let second = now.timestamp();
    let known = *LAST
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let text = if known.0 == second {
        known.1
    } else {
        let text = timestamp_of(&now.with_timezone(&chrono::Local).naive_local());
        *LAST
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (second, text);
        text
    };
    // Digits only.
    String::from_utf8_lossy(&text).into_owned()
}

/// `YYYYMMDDhhmmss` of `t`, digit by digit (`format` would parse its
/// pattern on every answer).
fn timestamp_of(t: &chrono::NaiveDateTime) -> [u8; 14] {
    use chrono::{Datelike, Timelike};
    let mut text = [b'0'; 14];
    let mut at = 0;
    // A year outside 0..=9999 (chrono allows them) keeps its low four digits.
    let year = t.year().rem_euclid(10_000) as u32;
    for (value, digits) in [
        (year, 4),
        (t.month(), 2),
        (t.day(), 2),
        (t.hour(), 2),
        (t.minute(), 2),
        // A leap second reads as 60, as `%S` writes it.
        (t.second() + t.nanosecond() / 1_000_000_000, 2),
    ] {
        for place in (0..digits).rev() {
            let digit = value / 10u32.pow(place) % 10;
            text[at] = b'0' + digit as u8;
            at += 1;
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_orig_guid_is_placed_at_its_first_bad_byte() {
        let good = "20261202IBANK0000000000000LEAD01";
        assert_eq!(first_non_guid_byte(good), None);
        assert_eq!(first_non_guid_byte("abc.def"), Some(3));
        assert_eq!(first_non_guid_byte("ABCDEF"), Some(6), "ends short");
        assert_eq!(first_non_guid_byte(""), Some(0));
        assert_eq!(
            first_non_guid_byte(" 0261202IBANK0000000000000LEAD01"),
            Some(0)
        );
        assert_eq!(
            first_non_guid_byte("20261202IBANK0000000000000LEAD0é"),
            Some(31)
        );
    }

    const GOOD: &[u8; 64] = b"TRF00120261129IBANK000000000000000001AIBANK   20261129132000    ";

    fn with(offset: usize, bytes: &[u8]) -> Vec<u8> {
        let mut t = GOOD.to_vec();
        t[offset..offset + bytes.len()].copy_from_slice(bytes);
        t
    }

    fn err(t: &[u8]) -> HeaderError {
        parse_header(t).unwrap_err()
    }

    #[test]
    fn ranges_tile_the_header() {
        assert_eq!(TX_CODE.end, GUID.start);
        assert_eq!(GUID.end, CHANNEL_ID.start);
        assert_eq!(CHANNEL_ID.end, SENT_AT.start);
        assert_eq!(SENT_AT.end, RESP_CODE.start);
        assert_eq!(RESP_CODE.end, HEADER_LEN);
    }

    #[test]
    fn parses_the_worked_example() {
        let mut t = GOOD.to_vec();
        t.extend_from_slice(b"body");
        let h = parse_header(&t).unwrap();
        assert_eq!(
            h,
            Header {
                tx_code: "TRF001",
                guid: "20261129IBANK000000000000000001A",
                channel_id: "IBANK",
                sent_at: "20261129132000",
            }
        );
        // Exactly 64 bytes (no body) is a valid header too.
        assert!(parse_header(GOOD).is_ok());
    }

    #[test]
    fn short_telegram() {
        let e = err(&GOOD[..40]);
        assert_eq!(e.field, "header");
        assert_eq!(e.offset, 40);
        assert_eq!(
            e.to_string(),
            "header field `header` at byte 40: telegram is 40 bytes, shorter than the 64-byte header"
        );
        assert_eq!(err(b"").offset, 0);
        assert_eq!(err(&GOOD[..63]).offset, 63);
    }

    #[test]
    fn bad_tx_code() {
        let e = err(&with(3, b"a"));
        assert_eq!((e.field, e.offset), ("tx_code", 3));
        assert_eq!(
            e.to_string(),
            "header field `tx_code` at byte 3: byte 0x61 ('a') is not A-Z or 0-9"
        );
        assert_eq!(err(&with(0, b" ")).offset, 0);
        assert_eq!(err(&with(5, b"-")).offset, 5);
    }

    #[test]
    fn bad_guid() {
        let e = err(&with(10, b"."));
        assert_eq!((e.field, e.offset), ("guid", 10));
        assert_eq!(e.reason, "byte 0x2E ('.') is not 0-9, A-Z, a-z, '_' or '-'");
        let e = err(&with(37, b" "));
        assert_eq!((e.field, e.offset), ("guid", 37));
        // '_' and '-' and lower case are allowed.
        assert!(parse_header(&with(6, b"ab_-")).is_ok());
    }

    #[test]
    fn bad_channel_id() {
        let e = err(&with(38, b"        "));
        assert_eq!(
            (e.field, e.offset, e.reason.as_str()),
            ("channel_id", 38, "is blank")
        );
        let e = err(&with(38, b" IBANK  "));
        assert_eq!((e.field, e.offset), ("channel_id", 38));
        assert!(e.reason.contains("left-aligned"), "{e}");
        let e = err(&with(41, b"\x00"));
        assert_eq!((e.field, e.offset), ("channel_id", 41));
        assert_eq!(e.reason, "byte 0x00 is not printable ASCII");
        let e = err(&with(45, b"\xB0"));
        assert_eq!((e.field, e.offset), ("channel_id", 45));
        // The first bad byte is reported: a leading space before a bad byte.
        let e = err(&with(38, b" IB\x00ANK "));
        assert_eq!((e.field, e.offset), ("channel_id", 38));
        assert!(e.reason.contains("left-aligned"), "{e}");
        let e = err(&with(38, b"\x00IBANK  "));
        assert_eq!((e.field, e.offset), ("channel_id", 38));
        assert_eq!(e.reason, "byte 0x00 is not printable ASCII");
        // Full width and inner spaces are fine; trailing spaces are trimmed.
        assert_eq!(
            parse_header(&with(38, b"AB CD_12")).unwrap().channel_id,
            "AB CD_12"
        );
        assert_eq!(
            parse_header(&with(38, b"X       ")).unwrap().channel_id,
            "X"
        );
    }

    #[test]
    fn bad_sent_at_digits() {
        let e = err(&with(50, b"1a"));
        assert_eq!((e.field, e.offset), ("sent_at", 51));
        assert_eq!(e.reason, "byte 0x61 ('a') is not an ASCII digit");
        assert_eq!(err(&with(46, b" ")).offset, 46);
    }

    #[test]
    fn bad_sent_at_calendar() {
        let e = err(&with(46, b"20261301000000"));
        assert_eq!((e.field, e.offset), ("sent_at", 50));
        assert_eq!(
            e.reason,
            "20261301000000 is not a valid date-time: month 13 is not 01-12"
        );
        assert_eq!(err(&with(46, b"20260001000000")).offset, 50);
        let e = err(&with(46, b"20260230120000"));
        assert_eq!((e.field, e.offset), ("sent_at", 52));
        assert_eq!(
            e.reason,
            "20260230120000 is not a valid date-time: 2026-02 has no day 30"
        );
        assert_eq!(err(&with(46, b"20260100120000")).offset, 52);
        assert_eq!(err(&with(46, b"20250229120000")).offset, 52);
        assert!(
            parse_header(&with(46, b"20240229120000")).is_ok(),
            "leap year"
        );
        let e = err(&with(46, b"20261129240000"));
        assert_eq!(
            (e.offset, e.reason.as_str()),
            (
                54,
                "20261129240000 is not a valid date-time: hour 24 is not 00-23"
            )
        );
        assert_eq!(err(&with(46, b"20261129236000")).offset, 56);
        let e = err(&with(46, b"20261129235960"));
        assert_eq!(e.offset, 58, "no leap seconds");
        assert!(parse_header(&with(46, b"20261231235959")).is_ok());
        assert!(
            parse_header(&with(46, b"00000101000000")).is_ok(),
            "year 0 exists"
        );
    }

    #[test]
    fn bad_resp_code() {
        let e = err(&with(60, b"0000"));
        assert_eq!((e.field, e.offset), ("resp_code", 60));
        let e = err(&with(63, b"X"));
        assert_eq!((e.field, e.offset), ("resp_code", 63));
        assert_eq!(
            e.reason,
            "byte 0x58 ('X') is not a space; a request's resp_code must be four spaces"
        );
    }

    #[test]
    fn first_problem_wins() {
        let mut t = with(0, b"a");
        t[60] = b'X';
        assert_eq!(err(&t).field, "tx_code");
    }

    #[test]
    fn echo_copies_printable_fields() {
        let e = Echo::from_telegram(GOOD);
        assert_eq!(&e.tx_code, b"TRF001");
        assert_eq!(&e.guid, b"20261129IBANK000000000000000001A");
        assert_eq!(&e.channel_id, b"IBANK   ");
        assert_eq!(e.tx_code_str(), "TRF001");
        assert_eq!(e.guid_str(), "20261129IBANK000000000000000001A");
        assert_eq!(e.channel_id_str(), "IBANK");
    }

    #[test]
    fn echo_blanks_unprintable_or_missing_fields() {
        let mut t = GOOD.to_vec();
        t[10] = 0x00; // guid
        let e = Echo::from_telegram(&t);
        assert_eq!(&e.tx_code, b"TRF001");
        assert_eq!(e.guid, [b' '; 32]);
        assert_eq!(&e.channel_id, b"IBANK   ");
        assert_eq!(e.guid_str(), "");

        // Too short for the guid: tx_code kept, the rest blank.
        let e = Echo::from_telegram(&GOOD[..20]);
        assert_eq!(&e.tx_code, b"TRF001");
        assert_eq!(e.guid, [b' '; 32]);
        assert_eq!(e.channel_id, [b' '; 8]);

        // Printable but malformed (lower case tx code) is still echoed.
        let e = Echo::from_telegram(b"trf001");
        assert_eq!(&e.tx_code, b"trf001");

        assert_eq!(Echo::from_telegram(b""), Echo::blank());
        assert_eq!(Echo::default(), Echo::blank());
    }

    #[test]
    fn echo_str_views_never_panic() {
        let e = Echo {
            tx_code: [0xFF; 6],
            guid: [b' '; 32],
            channel_id: [b' '; 8],
        };
        assert_eq!(e.tx_code_str(), "");
    }

    #[test]
    fn write_response_exact_bytes() {
        let echo = Echo::from_telegram(GOOD);
        let mut out = Vec::new();
        write_response(&echo, "20261129132001", "B201", b"", &mut out);
        assert_eq!(
            out,
            b"TRF00120261129IBANK000000000000000001AIBANK   20261129132001B201"
        );
        let mut out = b"keep".to_vec();
        write_response(&Echo::blank(), "20261129132001", "E102", b"xyz", &mut out);
        assert_eq!(out.len(), 4 + 64 + 3);
        assert_eq!(&out[..4], b"keep");
        assert_eq!(&out[4..50], &[b' '; 46][..]);
        assert_eq!(&out[50..], b"20261129132001E102xyz");
    }

    #[test]
    fn put_fitted_pads_and_cuts() {
        let mut out = Vec::new();
        put_fitted(&mut out, b"ab", 4);
        put_fitted(&mut out, b"abcdef", 4);
        assert_eq!(out, b"ab  abcd");
    }

    #[test]
    fn timestamps_are_written_as_the_format_would() {
        use chrono::{NaiveDate, NaiveDateTime};
        let at = |y, mo, d, h, mi, s, ms| -> NaiveDateTime {
            NaiveDate::from_ymd_opt(y, mo, d)
                .unwrap()
                .and_hms_milli_opt(h, mi, s, ms)
                .unwrap()
        };
        for t in [
            at(2026, 12, 1, 9, 5, 7, 0),
            at(1999, 1, 31, 23, 59, 59, 999),
            at(2026, 6, 30, 23, 59, 59, 1_500),
            at(2000, 2, 29, 0, 0, 0, 0),
            at(987, 10, 10, 10, 10, 10, 0),
        ] {
            assert_eq!(
                std::str::from_utf8(&timestamp_of(&t)).unwrap(),
                t.format("%Y%m%d%H%M%S").to_string(),
                "{t:?}"
            );
        }
    }

    /// The once-a-second text is the local time chrono gives now (the one
    /// before or after the call, should a second end in between), on this
    /// thread and on a new one.
    #[test]
    fn local_timestamp_is_chronos_local_time() {
        let local = || chrono::Local::now().format("%Y%m%d%H%M%S").to_string();
        for _ in 0..2 {
            let (before, ours, after) = (local(), local_timestamp(), local());
            assert!(ours == before || ours == after, "{before} {ours} {after}");
            let (before, ours, after) =
                std::thread::spawn(move || (local(), local_timestamp(), local()))
                    .join()
                    .unwrap();
            assert!(ours == before || ours == after, "{before} {ours} {after}");
        }
    }

    #[test]
    fn local_timestamp_is_a_valid_sent_at() {
        let ts = local_timestamp();
        assert_eq!(ts.len(), 14);
        assert!(parse_header(&with(46, ts.as_bytes())).is_ok(), "{ts}");
    }
}
