//! Layout files and the four field types (docs/protocol.md section 4): body bytes <-> JSON.
//!
//! A layout names a transaction's request and response bodies field by field. The
//! files are data (`layouts/*.json`, format in `layouts/README.md`) and are checked
//! hard when loaded, so a mistake in one is a start-up error rather than a wrong
//! telegram at run time. The conversion itself lives in the private `field` module,
//! re-exported here.
//!
//! - [`Layout::from_json`], [`load_dir`], [`builtin`], [`with_dir`]: load and validate.
//! - [`decode_fields`], [`encode_fields`]: one body <-> one JSON object.
//! - [`Layout::decode_request`]: a request body as [`DecodedFields`], sorted
//!   and borrowed, written straight as JSON (module `decoded`).
//! - [`Layout::masked_request`]: the request fields as a log line may show
//!   them (one JSON object's text), each by the `log` rule its layout
//!   declares (module `masking`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

mod decoded;
mod field;
mod masking;

pub use decoded::{DecodedFields, FieldValue};
pub use field::{decode_fields, encode_fields};
pub use masking::{LogRule, mask_account};

/// The four field types of section 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub enum FieldType {
    /// Printable ASCII, left-aligned, space-padded -> string, trailing spaces trimmed.
    AN,
    /// ASCII digits, exactly `length` of them -> string kept as is (leading zeros
    /// matter in dates and codes).
    N,
    /// ASCII digits, right-aligned, zero-padded -> JSON number (u64).
    U,
    /// EUC-KR (CP949) text, left-aligned, space-padded -> UTF-8 string, trimmed.
    H,
}

/// The longest `U` field: 19 digits always fit in a `u64`, 20 may not.
pub const MAX_U_DIGITS: usize = 19;

/// One field of a body, as written in a layout file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Field {
    /// The JSON key.
    pub name: String,
    /// The field type.
    #[serde(rename = "type")]
    pub kind: FieldType,
    /// Width in bytes.
    pub length: usize,
    /// Must not be blank (`AN`, `H`); must be present when encoding.
    #[serde(default)]
    pub required: bool,
    /// Smallest value allowed (`U` only).
    #[serde(default)]
    pub min: Option<u64>,
    /// Largest value allowed (`U` only).
    #[serde(default)]
    pub max: Option<u64>,
    /// How the field's value appears in the logs; `None` is the safe default of
    /// its type ([`Field::log_rule`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<LogRule>,
}

impl Field {
    /// The log rule in force: the declared one, else the default of the type
    /// (codes, amounts and dates, `N` and `U`, in clear; text, `AN` and `H`, masked).
    pub fn log_rule(&self) -> LogRule {
        self.log.unwrap_or(match self.kind {
            FieldType::N | FieldType::U => LogRule::Clear,
            FieldType::AN | FieldType::H => LogRule::Mask,
        })
    }
}

/// A validated layout: the request and response bodies of one transaction code.
/// Two layouts are equal when they convert the same way, wherever they came from.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `[A-Z0-9]{6}`, the header's `tx_code`.
    pub tx_code: String,
    /// Free text for operators.
    pub description: String,
    /// Request body fields, in byte order.
    pub request: Vec<Field>,
    /// Response body fields (sent on `0000` only), in byte order.
    pub response: Vec<Field>,
    /// Where it was loaded from: a path, or `builtin TRF001.json` (for messages).
    pub source: String,
}

impl PartialEq for Layout {
    fn eq(&self, other: &Layout) -> bool {
        (
            &self.tx_code,
            &self.description,
            &self.request,
            &self.response,
        ) == (
            &other.tx_code,
            &other.description,
            &other.request,
            &other.response,
        )
    }
}

impl Eq for Layout {}

/// Why a layout could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The file is not a valid layout; `reason` names the key or field at fault.
    #[error("layout {file}: {reason}")]
    Invalid {
        /// Path, or builtin name.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// The file or directory could not be read.
    #[error("layout {file}: {source}")]
    Io {
        /// Path.
        file: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// An error converting a field. `offset` is the byte offset in the whole telegram
/// (the caller passes the body's base, e.g. 64 right after the header).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("field `{field}` at byte {offset}: {reason}")]
pub struct FieldError {
    /// The field's name, or `body` when the body as a whole is wrong.
    pub field: String,
    /// Byte offset within the telegram.
    pub offset: usize,
    /// What is wrong.
    pub reason: String,
}

/// The file as written; checked further by [`Layout::from_json`].
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LayoutFile {
    tx_code: String,
    #[serde(default)]
    description: String,
    request_length: usize,
    request: Vec<Field>,
    response_length: usize,
    response: Vec<Field>,
}

impl Layout {
    /// Where request field `name` starts within the body (after the header),
    /// if the layout has it.
    pub fn request_offset(&self, name: &str) -> Option<usize> {
        let at = self.request.iter().position(|f| f.name == name)?;
        Some(self.request[..at].iter().map(|f| f.length).sum())
    }

    /// Parses and validates one layout file; `file` (a path or a name) is only used
    /// in errors.
    pub fn from_json(file: &str, text: &str) -> Result<Layout, LayoutError> {
        let invalid = |reason: String| LayoutError::Invalid {
            file: file.to_owned(),
            reason,
        };
        let raw = parse_file(text).map_err(invalid)?;
        if !is_tx_code(&raw.tx_code) {
            return Err(invalid(format!(
                "tx_code {:?} must be 6 characters of A-Z and 0-9",
                raw.tx_code
            )));
        }
        check_fields("request", &raw.request, raw.request_length).map_err(invalid)?;
        check_fields("response", &raw.response, raw.response_length).map_err(invalid)?;
        Ok(Layout {
            tx_code: raw.tx_code,
            description: raw.description,
            request: raw.request,
            response: raw.response,
            source: file.to_owned(),
        })
    }

    /// Request body length in bytes.
    pub fn request_len(&self) -> usize {
        field::total_len(&self.request)
    }

    /// Response body length in bytes.
    pub fn response_len(&self) -> usize {
        field::total_len(&self.response)
    }

    /// [`decode_fields`] for the request body, as [`DecodedFields`] (what a
    /// telegram's request body and summary line are written from); a length
    /// mismatch names this layout ("body is 60 bytes, layout TRF001 request
    /// needs 68").
    pub fn decode_request<'a>(
        &'a self,
        body: &'a [u8],
        base: usize,
    ) -> Result<DecodedFields<'a>, FieldError> {
        field::decode_in(&self.request, body, base, Some((&self.tx_code, "request")))
    }

    /// [`decode_fields`] for the response body.
    pub fn decode_response(
        &self,
        body: &[u8],
        base: usize,
    ) -> Result<serde_json::Map<String, serde_json::Value>, FieldError> {
        field::decode_in(
            &self.response,
            body,
            base,
            Some((&self.tx_code, "response")),
        )
        .map(|decoded| decoded.to_map())
    }

    /// [`encode_fields`] for the request body.
    pub fn encode_request(
        &self,
        values: &(impl crate::json_object::FieldSource + ?Sized),
        base: usize,
    ) -> Result<Vec<u8>, FieldError> {
        encode_fields(&self.request, values, base)
    }

    /// [`encode_fields`] for the response body.
    pub fn encode_response(
        &self,
        values: &(impl crate::json_object::FieldSource + ?Sized),
        base: usize,
    ) -> Result<Vec<u8>, FieldError> {
        encode_fields(&self.response, values, base)
    }
}

/// Reads a layout file: JSON first (a syntax error names its line and
/// column), then its shape, then each value from the text, a wrong one named
/// by its path (`request[2].type`) and its line and column. The file and every field must be objects: serde would
/// also read a struct from an array by position, where a value in the wrong
/// place changes a field's meaning with no key to catch it (`max` where
/// `min` was meant), which the unknown-key check exists to prevent.
fn parse_file(text: &str) -> Result<LayoutFile, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let Some(file) = value.as_object() else {
        return Err(format!(
            "a layout file is one JSON object with named keys (tx_code, request, ...), not {}",
            json_kind(&value)
        ));
    };
    for list in ["request", "response"] {
        let Some(fields) = file.get(list).and_then(serde_json::Value::as_array) else {
            continue;
        };
        if let Some((i, field)) = fields.iter().enumerate().find(|(_, f)| !f.is_object()) {
            return Err(format!(
                "{list}[{i}] is {}: write each field as an object with named keys \
                 (name, type, length, ...)",
                json_kind(field)
            ));
        }
    }
    // From the text again, not the value: a key written twice is an error
    // there (`"log": "mask", "log": "clear"` must not log in clear), where a
    // JSON value keeps the last one (found by a review).
    let mut text = serde_json::Deserializer::from_str(text);
    let raw = serde_path_to_error::deserialize(&mut text);
    raw.map_err(|e| {
        let path = e.path().to_string();
        match path.as_str() {
            // The file itself (a key missing or unknown there).
            "." => e.into_inner().to_string(),
            _ => format!("{}: {}", named_path(file, &path), e.into_inner()),
        }
    })
}

/// A value's path in the words of the other layout errors:
/// `request[2].type` as ``request field `amount`, key `type` `` (``request
/// field #3`` when it has no name), `request_length` as ``key
/// `request_length` ``.
fn named_path(file: &serde_json::Map<String, serde_json::Value>, path: &str) -> String {
    let in_list = ["request", "response"].into_iter().find_map(|list| {
        let rest = path.strip_prefix(list)?.strip_prefix('[')?;
        let (index, after) = rest.split_once(']')?;
        let index = index.parse::<usize>().ok()?;
        let field = match file.get(list)?.get(index)?.get("name") {
            Some(serde_json::Value::String(name)) => format!("{list} field `{name}`"),
            _ => format!("{list} field #{}", index + 1),
        };
        Some(match after.strip_prefix('.') {
            Some(key) => format!("{field}, key `{key}`"),
            None => field,
        })
    });
    in_list.unwrap_or_else(|| format!("key `{path}`"))
}

/// What a JSON value is, for an error message.
fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn is_tx_code(s: &str) -> bool {
    s.len() == 6
        && s.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

/// The checks on one field list; the error names the list, the field and the key.
fn check_fields(list: &str, fields: &[Field], declared: usize) -> Result<(), String> {
    let mut names = BTreeSet::new();
    let mut total = 0usize;
    for (i, f) in fields.iter().enumerate() {
        let name = &f.name;
        if name.is_empty() {
            return Err(format!("{list} field #{} has an empty name", i + 1));
        }
        if !names.insert(name.as_str()) {
            return Err(format!("{list} field `{name}` is listed twice"));
        }
        if f.length == 0 {
            return Err(format!("{list} field `{name}`: length must be at least 1"));
        }
        if f.kind != FieldType::U && (f.min.is_some() || f.max.is_some()) {
            return Err(format!(
                "{list} field `{name}`: min/max only apply to type U, not {:?}",
                f.kind
            ));
        }
        if f.kind == FieldType::U {
            if f.length > MAX_U_DIGITS {
                return Err(format!(
                    "{list} field `{name}`: type U is at most {MAX_U_DIGITS} digits (to fit a u64), not {}",
                    f.length
                ));
            }
            let limit = 10u64.pow(f.length as u32); // length <= 19, so this fits.
            for (key, v) in [("min", f.min), ("max", f.max)] {
                if let Some(v) = v.filter(|&v| v >= limit) {
                    return Err(format!(
                        "{list} field `{name}`: {key} {v} does not fit in {} digits",
                        f.length
                    ));
                }
            }
            if let (Some(min), Some(max)) = (f.min, f.max)
                && min > max
            {
                return Err(format!(
                    "{list} field `{name}`: min {min} is greater than max {max}"
                ));
            }
        }
        total = total
            .checked_add(f.length)
            .ok_or_else(|| format!("{list} field lengths add up to more than usize"))?;
    }
    if total != declared {
        let mismatch =
            format!("{list}_length is {declared} but the {list} fields add up to {total}");
        let mut end = 0;
        let past = fields.iter().find_map(|f| {
            let start = end;
            end += f.length;
            (end > declared).then_some((f, start, end))
        });
        return Err(match past {
            Some((f, start, end)) => format!(
                "{mismatch}: field `{}` (body bytes {start}..{end}) runs past byte {declared}",
                f.name
            ),
            None => format!("{mismatch}: body bytes {total}..{declared} belong to no field"),
        });
    }
    Ok(())
}

/// Loads every `*.json` file directly in `dir` (subfolders are not read, so
/// `layouts/invalid/` stays out), keyed by tx code. Files are read in name order so
/// errors are reproducible; a tx code defined twice is an error.
pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, Layout>, LayoutError> {
    let io = |file: &Path, source| LayoutError::Io {
        file: file.display().to_string(),
        source,
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let path = entry.map_err(|e| io(dir, e))?.path();
        if path.extension().is_some_and(|e| e == "json") && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();

    let mut layouts = BTreeMap::new();
    let mut origin: BTreeMap<String, String> = BTreeMap::new();
    for path in paths {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| io(&path, e))?;
        let layout = Layout::from_json(&file, &text)?;
        if let Some(first) = origin.get(&layout.tx_code) {
            return Err(LayoutError::Invalid {
                reason: format!("tx_code {} is already defined in {first}", layout.tx_code),
                file,
            });
        }
        origin.insert(layout.tx_code.clone(), file);
        layouts.insert(layout.tx_code.clone(), layout);
    }
    Ok(layouts)
}

/// The shipped layout files, compiled in.
const BUILTIN: [(&str, &str); 2] = [
    (
        "builtin TRF001.json",
        include_str!("../layouts/TRF001.json"),
    ),
    (
        "builtin INQ001.json",
        include_str!("../layouts/INQ001.json"),
    ),
];

/// The built-in layouts with those of `dir` added: a file in `dir` with the tx
/// code of a built-in layout replaces it. What `layouts_dir` gives the hub.
pub fn with_dir(dir: Option<&Path>) -> Result<BTreeMap<String, Layout>, LayoutError> {
    let mut layouts = builtin();
    if let Some(dir) = dir {
        layouts.extend(load_dir(dir)?);
    }
    Ok(layouts)
}

/// The shipped layouts (TRF001, INQ001), compiled in so the hub runs from any
/// directory without `--config`.
pub fn builtin() -> BTreeMap<String, Layout> {
    BUILTIN
        .iter()
        .map(|(name, text)| {
            // The files are checked by this crate's tests; a broken one cannot ship.
            let layout = Layout::from_json(name, text)
                .unwrap_or_else(|e| panic!("shipped layout is invalid: {e}"));
            (layout.tx_code.clone(), layout)
        })
        .collect()
}

#[cfg(test)]
mod tests;
