//! Field conversion: body bytes <-> JSON, one field type at a time.
//!
//! Every error names the field and a byte offset in the whole telegram, so an
//! operator can find the byte in a hex dump. Nothing here panics on any input: the
//! bytes come from the network and the JSON from the core.

use std::borrow::Cow;

use encoding_rs::{DecoderResult, EUC_KR, EncoderResult};
use serde_json::{Map, Value};

use super::decoded::{DecodedFields, FieldValue};
use super::{Field, FieldError, FieldType};
use crate::frame::ByteDisplay;
use crate::json_object::{FieldSource, JsonRef};

type Object = Map<String, Value>;

/// Sum of the field lengths (saturating, so a hand-made field list cannot overflow).
pub(crate) fn total_len(fields: &[Field]) -> usize {
    fields
        .iter()
        .fold(0usize, |n, f| n.saturating_add(f.length))
}

fn error(field: &str, offset: usize, reason: impl Into<String>) -> FieldError {
    FieldError {
        field: field.to_owned(),
        offset,
        reason: reason.into(),
    }
}

/// Bytes -> JSON object. The body must be exactly as long as the fields together;
/// each field is checked by its type (docs/protocol.md section 4).
pub fn decode_fields(fields: &[Field], bytes: &[u8], base: usize) -> Result<Object, FieldError> {
    decode_in(fields, bytes, base, None).map(|decoded| decoded.to_map())
}

/// [`decode_fields`], with the layout's tx code and list (`request`/`response`) for
/// the length error when known.
pub(crate) fn decode_in<'a>(
    fields: &'a [Field],
    bytes: &'a [u8],
    base: usize,
    context: Option<(&str, &str)>,
) -> Result<DecodedFields<'a>, FieldError> {
    let need = total_len(fields);
    if bytes.len() != need {
        let whose = match context {
            Some((tx_code, list)) => format!("layout {tx_code} {list}"),
            None => "the layout".to_owned(),
        };
        // At the first bad byte: the first one past the layout's length in
        // a long body, the first one missing (the end) in a short one.
        return Err(error(
            "body",
            base.saturating_add(bytes.len().min(need)),
            format!("body is {} bytes, {whose} needs {need}", bytes.len()),
        ));
    }
    let mut out = Vec::with_capacity(fields.len());
    let mut start = 0;
    for f in fields {
        let end = start + f.length;
        let raw = &bytes[start..end];
        let value = decode_one(f, raw, base.saturating_add(start))?;
        out.push((f.name.as_str(), value));
        start = end;
    }
    Ok(DecodedFields::from_entries(out))
}

fn decode_one<'a>(f: &Field, raw: &'a [u8], at: usize) -> Result<FieldValue<'a>, FieldError> {
    let fail = |rel: usize, reason: String| error(&f.name, at.saturating_add(rel), reason);
    match f.kind {
        FieldType::AN => {
            if let Some(i) = raw.iter().position(|&b| !(0x20..=0x7E).contains(&b)) {
                return Err(fail(
                    i,
                    format!(
                        "byte {} is not printable ASCII (0x20-0x7E)",
                        ByteDisplay(raw[i])
                    ),
                ));
            }
            let text = std::str::from_utf8(raw).unwrap_or("").trim_end_matches(' ');
            if f.required && text.is_empty() {
                return Err(fail(0, "is required but blank".into()));
            }
            Ok(FieldValue::Text(Cow::Borrowed(text)))
        }
        FieldType::N => {
            check_digits(raw).map_err(|(i, r)| fail(i, r))?;
            Ok(FieldValue::Text(Cow::Borrowed(
                std::str::from_utf8(raw).unwrap_or(""),
            )))
        }
        FieldType::U => {
            check_digits(raw).map_err(|(i, r)| fail(i, r))?;
            let n = parse_u64(raw).ok_or_else(|| fail(0, "value does not fit in a u64".into()))?;
            check_range(f, n).map_err(|r| fail(0, r))?;
            Ok(FieldValue::Number(n))
        }
        FieldType::H => {
            let text = decode_h(raw).map_err(|(i, r)| fail(i, r))?;
            if f.required && text.is_empty() {
                return Err(fail(0, "is required but blank".into()));
            }
            Ok(FieldValue::Text(text))
        }
    }
}

/// The first non-digit, as (offset in the field, reason).
fn check_digits(raw: &[u8]) -> Result<(), (usize, String)> {
    match raw.iter().position(|b| !b.is_ascii_digit()) {
        None => Ok(()),
        Some(i) => Err((
            i,
            format!("byte {} is not an ASCII digit", ByteDisplay(raw[i])),
        )),
    }
}

/// Digits -> u64; `None` on overflow. The caller has checked they are digits.
fn parse_u64(digits: &[u8]) -> Option<u64> {
    digits.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?
            .checked_add(u64::from(d.wrapping_sub(b'0')))
    })
}

fn check_range(f: &Field, n: u64) -> Result<(), String> {
    if let Some(min) = f.min.filter(|&min| n < min) {
        return Err(format!("{n} is below the minimum {min}"));
    }
    if let Some(max) = f.max.filter(|&max| n > max) {
        return Err(format!("{n} is above the maximum {max}"));
    }
    Ok(())
}

/// EUC-KR field bytes -> UTF-8, trailing spaces trimmed (borrowed when the
/// bytes are ASCII, which EUC-KR leaves as they are). Errors carry the offset
/// of the offending byte within the field.
fn decode_h(raw: &[u8]) -> Result<Cow<'_, str>, (usize, String)> {
    let Some(text) = EUC_KR.decode_without_bom_handling_and_without_replacement(raw) else {
        return Err(find_malformed(raw));
    };
    if let Some(control) = first_control(&text) {
        return Err(control);
    }
    let keep = text.trim_end_matches(' ').len();
    Ok(match text {
        Cow::Owned(mut s) => {
            s.truncate(keep);
            Cow::Owned(s)
        }
        Cow::Borrowed(s) => Cow::Borrowed(&s[..keep]),
    })
}

/// The first control character of decoded `H` text, at its byte offset: every
/// non-ASCII character of EUC-KR is two bytes, so the offset is recoverable
/// from the text.
fn first_control(text: &str) -> Option<(usize, String)> {
    let mut pos = 0;
    for c in text.chars() {
        if c < ' ' || c == '\x7F' {
            return Some((
                pos,
                format!("control character U+{:04X} is not allowed", u32::from(c)),
            ));
        }
        pos += if c.is_ascii() { 1 } else { 2 };
    }
    None
}

/// Slow path, only for bytes that do not decode: finds the first bad byte, a
/// control character before the first malformed one included.
fn find_malformed(raw: &[u8]) -> (usize, String) {
    let mut decoder = EUC_KR.new_decoder_without_bom_handling();
    let cap = decoder
        .max_utf8_buffer_length_without_replacement(raw.len())
        .unwrap_or(raw.len().saturating_mul(3));
    let mut sink = String::with_capacity(cap);
    let (result, read) = decoder.decode_to_string_without_replacement(raw, &mut sink, true);
    let at = match result {
        DecoderResult::Malformed(bad, after) => {
            read.saturating_sub(usize::from(bad) + usize::from(after))
        }
        // Cannot happen: the fast path said the bytes do not decode.
        DecoderResult::InputEmpty | DecoderResult::OutputFull => 0,
    };
    // `sink` holds the text before the malformed bytes.
    if let Some(control) = first_control(&sink) {
        return control;
    }
    let byte = raw.get(at).copied().unwrap_or(0);
    let reason = if at + 1 == raw.len() && (0x81..=0xFE).contains(&byte) {
        format!(
            "byte {} is the first half of a two-byte EUC-KR character cut by the field's end",
            ByteDisplay(byte)
        )
    } else {
        match raw.get(at + 1) {
            Some(&next) if (0x81..=0xFE).contains(&byte) => format!(
                "bytes {} {} are not a valid EUC-KR character",
                ByteDisplay(byte),
                ByteDisplay(next)
            ),
            _ => format!("byte {} is not valid EUC-KR", ByteDisplay(byte)),
        }
    };
    (at, reason)
}

/// JSON object -> bytes, exactly the fields' total length.
///
/// A missing (or `null`) key is an error for `required`, `N` and `U` fields, and
/// blank for other `AN`/`H` fields. Keys the layout does not name are ignored (the
/// core's answer carries `result` and the like). Text that does not fit is an
/// error, never cut.
pub fn encode_fields(
    fields: &[Field],
    values: &(impl FieldSource + ?Sized),
    base: usize,
) -> Result<Vec<u8>, FieldError> {
    let mut out = Vec::with_capacity(total_len(fields));
    let mut start = 0usize;
    for f in fields {
        let at = base.saturating_add(start);
        encode_one(f, values.field(&f.name), at, &mut out)?;
        start = start.saturating_add(f.length);
        debug_assert_eq!(out.len(), start, "field `{}` wrote a wrong length", f.name);
    }
    Ok(out)
}

fn encode_one(
    f: &Field,
    value: Option<JsonRef<'_>>,
    at: usize,
    out: &mut Vec<u8>,
) -> Result<(), FieldError> {
    let fail = |reason: String| error(&f.name, at, reason);
    let value = match value {
        None | Some(JsonRef::Null) => {
            let what = if value.is_none() {
                "is missing"
            } else {
                "is null"
            };
            return match f.kind {
                _ if f.required => Err(fail(format!("{what} but required"))),
                FieldType::N => Err(fail(format!("{what}; an N field cannot be blank"))),
                FieldType::U => Err(fail(format!("{what}; a U field cannot be blank"))),
                FieldType::AN | FieldType::H => {
                    out.resize(out.len() + f.length, b' ');
                    Ok(())
                }
            };
        }
        Some(v) => v,
    };
    match f.kind {
        FieldType::AN => {
            let s = expect_str(value).map_err(fail)?;
            if let Some((i, c)) = s.char_indices().find(|&(_, c)| !(' '..='~').contains(&c)) {
                return Err(fail(format!(
                    "{} at position {i} is not printable ASCII",
                    CharDisplay(c)
                )));
            }
            if s.len() > f.length {
                return Err(fail(format!(
                    "{:?} is {} characters, longer than the field's {}",
                    s,
                    s.len(),
                    f.length
                )));
            }
            check_required(f, s).map_err(fail)?;
            out.extend_from_slice(s.as_bytes());
            out.resize(out.len() + (f.length - s.len()), b' ');
        }
        FieldType::H => {
            let s = expect_str(value).map_err(fail)?;
            if let Some(c) = s.chars().find(|&c| c < ' ' || c == '\x7F') {
                return Err(fail(format!("{} is not allowed", CharDisplay(c))));
            }
            check_required(f, s).map_err(fail)?;
            let start = out.len();
            encode_h(s, out).map_err(fail)?;
            let written = out.len() - start;
            if written > f.length {
                out.truncate(start);
                return Err(fail(format!(
                    "{s:?} is {written} bytes in EUC-KR, longer than the field's {}",
                    f.length
                )));
            }
            out.resize(start + f.length, b' ');
        }
        FieldType::N => match value {
            JsonRef::Str(s) => {
                if let Some((i, c)) = s.char_indices().find(|&(_, c)| !c.is_ascii_digit()) {
                    return Err(fail(format!(
                        "{} at position {i} is not an ASCII digit",
                        CharDisplay(c)
                    )));
                }
                if s.len() != f.length {
                    return Err(fail(format!(
                        "{s:?} is {} digits, the field needs exactly {}",
                        s.len(),
                        f.length
                    )));
                }
                out.extend_from_slice(s.as_bytes());
            }
            JsonRef::Number(n) => {
                let n = n.as_u64().ok_or_else(|| {
                    fail(match too_large(n) {
                        // Read as a rounded float: its digits are not known.
                        Some(big) => format!(
                            "{big} cannot be read exactly as a JSON number; send it as a string \
                             of digits"
                        ),
                        None => format!("{n} is not a non-negative integer or a string of digits"),
                    })
                })?;
                put_zero_padded(n, f.length, out).map_err(fail)?;
            }
            other => {
                return Err(fail(format!(
                    "expected a string of {} digits, got {}",
                    f.length,
                    json_kind(other)
                )));
            }
        },
        FieldType::U => {
            let n = match value {
                JsonRef::Number(n) => n.as_u64().ok_or_else(|| {
                    fail(match too_large(n) {
                        Some(big) => format!("{big} does not fit in {} digits", f.length),
                        None => format!("{n} is not a non-negative integer"),
                    })
                })?,
                JsonRef::Str(s) => {
                    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                        return Err(fail(format!("{s:?} is not a string of digits")));
                    }
                    parse_u64(s.as_bytes())
                        .ok_or_else(|| fail(format!("{s} does not fit in a u64")))?
                }
                other => {
                    return Err(fail(format!("expected a number, got {}", json_kind(other))));
                }
            };
            check_range(f, n).map_err(fail)?;
            put_zero_padded(n, f.length, out).map_err(fail)?;
        }
    }
    Ok(())
}

fn expect_str(v: JsonRef<'_>) -> Result<&str, String> {
    match v {
        JsonRef::Str(s) => Ok(s),
        other => Err(format!("expected a string, got {}", json_kind(other))),
    }
}

fn check_required(f: &Field, s: &str) -> Result<(), String> {
    if f.required && s.trim_end_matches(' ').is_empty() {
        Err("is required but blank".into())
    } else {
        Ok(())
    }
}

/// UTF-8 -> EUC-KR appended to `out`. Never with replacement: `EUC_KR.encode` would
/// turn an unmappable character into `&#NNNN;` and silently change the length.
fn encode_h(s: &str, out: &mut Vec<u8>) -> Result<(), String> {
    let mut encoder = EUC_KR.new_encoder();
    let need = encoder
        .max_buffer_length_from_utf8_without_replacement(s.len())
        .unwrap_or(s.len().saturating_mul(2));
    out.reserve(need);
    let start = out.len();
    let (result, _read) = encoder.encode_from_utf8_to_vec_without_replacement(s, out, true);
    match result {
        EncoderResult::InputEmpty => Ok(()),
        EncoderResult::Unmappable(c) => {
            out.truncate(start);
            Err(format!("{} has no EUC-KR encoding", CharDisplay(c)))
        }
        EncoderResult::OutputFull => {
            out.truncate(start);
            Err("EUC-KR encoding ran out of buffer space".into())
        }
    }
}

/// Writes `n` right-aligned and zero-padded in `width` digits, or says it does not fit.
/// A whole number above `u64::MAX`, which JSON reading keeps only as a
/// rounded float (2^64 reads as 1.8446744073709552e+19): said as what it is,
/// not as "not a non-negative integer" in a float's digits.
fn too_large(n: &serde_json::Number) -> Option<String> {
    let f = n.as_f64()?;
    (f.is_finite() && f.fract() == 0.0 && f >= u64::MAX as f64)
        .then(|| format!("a number above {}", u64::MAX))
}

fn put_zero_padded(n: u64, width: usize, out: &mut Vec<u8>) -> Result<(), String> {
    let mut buf = [0u8; 20];
    let digits = crate::decimal::digits(n, &mut buf).as_bytes();
    if digits.len() > width {
        return Err(format!("{n} does not fit in {width} digits"));
    }
    out.resize(out.len() + (width - digits.len()), b'0');
    out.extend_from_slice(digits);
    Ok(())
}

fn json_kind(v: JsonRef<'_>) -> &'static str {
    match v {
        JsonRef::Null => "null",
        JsonRef::Bool(_) => "a boolean",
        JsonRef::Number(_) => "a number",
        JsonRef::Str(_) => "a string",
        JsonRef::Array => "an array",
        JsonRef::Object => "an object",
    }
}

/// A character as an operator wants to see it: `character '😀' (U+1F600)`, with
/// control characters shown by code point only.
struct CharDisplay(char);

impl std::fmt::Display for CharDisplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.0;
        if c.is_control() {
            write!(f, "control character U+{:04X}", u32::from(c))
        } else {
            write!(f, "character '{c}' (U+{:04X})", u32::from(c))
        }
    }
}
