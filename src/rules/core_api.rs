//! The core's API as each operation uses it (docs/protocol.md, section 5), as data:
//! the keys a request must carry and the keys an answer carries.
//!
//! Every route's layout is checked against it when the rules are built (start,
//! `relayhub check`, reload), so a layout that cannot work with the core is
//! refused before any telegram meets it. Without this check a response field
//! spelt `balnce` turns every processed transfer into E901 (the answer has no
//! such key), and a transfer layout without `to_bank` turns every transfer into
//! the core's 400 (E500).

use crate::config::Operation;
use crate::layout::{Field, FieldType, Layout};

/// The JSON value a key holds, and so which field types can carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Json {
    /// Any string: written by `AN` or `H`, read from `AN`, `N` or `H`.
    Text,
    /// A string of digits (a date, a bank code).
    Digits,
    /// A non-negative integer (an amount, a balance).
    Number,
}

/// One key of a request or an answer.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub name: &'static str,
    pub json: Json,
    /// The layout entry to add when the key is missing.
    pub example: &'static str,
}

/// What one operation sends to the core and what the core answers.
#[derive(Debug, Clone, Copy)]
pub struct CoreApi {
    /// The call, for messages: `POST /v1/transfers`.
    pub call: &'static str,
    /// Keys the hub fills in itself (from the header); no request field may
    /// have these names.
    pub from_header: &'static [&'static str],
    /// Keys the core requires, each from a request field of that name.
    pub request: &'static [Key],
    /// Keys of the core's answer on success: a response field must be one of
    /// them, or it is never filled and every success becomes E901.
    pub answer: &'static [Key],
}

const ANSWER: &[Key] = &[
    Key {
        name: "txn_id",
        json: Json::Text,
        example: r#"{ "name": "txn_id", "type": "AN", "length": 16 }"#,
    },
    Key {
        name: "processed_at",
        json: Json::Digits,
        example: r#"{ "name": "processed_at", "type": "N", "length": 14 }"#,
    },
    Key {
        name: "balance",
        json: Json::Number,
        example: r#"{ "name": "balance", "type": "U", "length": 15 }"#,
    },
    Key {
        name: "result",
        json: Json::Text,
        example: r#"{ "name": "result", "type": "AN", "length": 2 }"#,
    },
];

/// `POST /v1/transfers`.
pub const TRANSFER: CoreApi = CoreApi {
    call: "POST /v1/transfers",
    from_header: &["guid", "channel_id"],
    request: &[
        Key {
            name: "from_account",
            json: Json::Text,
            example: r#"{ "name": "from_account", "type": "AN", "length": 16, "required": true }"#,
        },
        Key {
            name: "to_bank",
            json: Json::Digits,
            example: r#"{ "name": "to_bank", "type": "N", "length": 3 }"#,
        },
        Key {
            name: "to_account",
            json: Json::Text,
            example: r#"{ "name": "to_account", "type": "AN", "length": 16, "required": true }"#,
        },
        Key {
            name: "amount",
            json: Json::Number,
            example: r#"{ "name": "amount", "type": "U", "length": 13, "min": 1 }"#,
        },
        Key {
            name: "memo",
            json: Json::Text,
            example: r#"{ "name": "memo", "type": "H", "length": 20, "log": "length" }"#,
        },
    ],
    answer: ANSWER,
};

/// `GET /v1/transfers/{orig_guid}`: the GUID goes in the path.
pub const INQUIRY: CoreApi = CoreApi {
    call: "GET /v1/transfers/{orig_guid}",
    from_header: &[],
    request: &[Key {
        name: "orig_guid",
        json: Json::Text,
        example: r#"{ "name": "orig_guid", "type": "AN", "length": 32, "required": true }"#,
    }],
    answer: ANSWER,
};

/// The API an operation calls.
pub fn api(op: Operation) -> &'static CoreApi {
    match op {
        Operation::Transfer => &TRANSFER,
        Operation::Inquiry => &INQUIRY,
    }
}

/// What a request field of type `kind` sends, or `None` when it is right for `json`.
fn request_mismatch(json: Json, kind: FieldType) -> Option<&'static str> {
    match (json, kind) {
        // U decodes to a JSON number; the core wants a string.
        (Json::Text | Json::Digits, FieldType::U) => Some("a number"),
        (Json::Number, FieldType::U) => None,
        (Json::Number, _) => Some("a string"),
        _ => None,
    }
}

/// Which response field types can be written from an answer value of `json`.
fn answer_types(json: Json) -> &'static [FieldType] {
    match json {
        Json::Text => &[FieldType::AN, FieldType::H],
        Json::Digits => &[FieldType::N, FieldType::AN, FieldType::U],
        Json::Number => &[FieldType::U, FieldType::N],
    }
}

fn names(keys: &[Key]) -> String {
    keys.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}

/// A layout that does not fit the core API of its operation; each names the
/// field, what is wrong and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiMismatch {
    #[error(
        "request field `{field}` clashes with the key the hub takes from the header; rename or remove it"
    )]
    HeaderKey { field: String },
    #[error(
        "request has no field `{field}`, which {call} needs for {what} (it takes {takes}): add {example} to \"request\" and to request_length"
    )]
    MissingRequest {
        field: &'static str,
        call: &'static str,
        what: &'static str,
        takes: String,
        example: &'static str,
    },
    #[error(
        "request field `{field}` is type {kind:?}, which sends {sends} to the core; {call} needs it as in {example}"
    )]
    RequestType {
        field: String,
        kind: FieldType,
        sends: &'static str,
        call: &'static str,
        example: &'static str,
    },
    #[error(
        "request field `orig_guid` is {kind:?} {length}, but a GUID is AN 32: make it {example}"
    )]
    OrigGuid {
        kind: FieldType,
        length: usize,
        example: &'static str,
    },
    #[error(
        "response field `{field}` is not in the core's answer to {call} (it carries {carries}), so every success would be answered E901: {hint}rename it to one of those keys"
    )]
    UnknownAnswerKey {
        field: String,
        call: &'static str,
        carries: String,
        hint: String,
    },
    #[error(
        "response field `{field}` is type {kind:?}, which cannot hold the answer's `{key}`: use {example}"
    )]
    ResponseType {
        field: String,
        kind: FieldType,
        key: &'static str,
        example: &'static str,
    },
}

/// Checks `layout` against what `op` sends and receives. The error names the
/// field, what is wrong and the fix; the caller adds the route and the layout.
pub fn check(op: Operation, layout: &Layout) -> Result<(), ApiMismatch> {
    let api = api(op);
    let what = match op {
        Operation::Transfer => "a transfer",
        Operation::Inquiry => "an inquiry",
    };
    for f in &layout.request {
        if api.from_header.contains(&f.name.as_str()) {
            return Err(ApiMismatch::HeaderKey {
                field: f.name.clone(),
            });
        }
    }
    for key in api.request {
        let Some(f) = layout.request.iter().find(|f| f.name == key.name) else {
            return Err(ApiMismatch::MissingRequest {
                field: key.name,
                call: api.call,
                what,
                takes: names(api.request),
                example: key.example,
            });
        };
        if let Some(sends) = request_mismatch(key.json, f.kind) {
            return Err(ApiMismatch::RequestType {
                field: f.name.clone(),
                kind: f.kind,
                sends,
                call: api.call,
                example: key.example,
            });
        }
    }
    if op == Operation::Inquiry {
        let f = field(&layout.request, "orig_guid");
        if let Some(f) = f.filter(|f| f.kind != FieldType::AN || f.length != 32) {
            return Err(ApiMismatch::OrigGuid {
                kind: f.kind,
                length: f.length,
                example: api.request[0].example,
            });
        }
    }
    for f in &layout.response {
        let Some(key) = api.answer.iter().find(|k| k.name == f.name) else {
            let hint = closest(&f.name, api.answer)
                .map(|k| format!("did you mean `{}`? ", k.name))
                .unwrap_or_default();
            return Err(ApiMismatch::UnknownAnswerKey {
                field: f.name.clone(),
                call: api.call,
                carries: names(api.answer),
                hint,
            });
        };
        let fits = answer_types(key.json);
        if !fits.contains(&f.kind) {
            return Err(ApiMismatch::ResponseType {
                field: f.name.clone(),
                kind: f.kind,
                key: key.name,
                example: key.example,
            });
        }
    }
    Ok(())
}

fn field<'a>(fields: &'a [Field], name: &str) -> Option<&'a Field> {
    fields.iter().find(|f| f.name == name)
}

/// The answer key nearest to a misspelt name (at most 2 edits away).
fn closest(name: &str, keys: &'static [Key]) -> Option<&'static Key> {
    keys.iter()
        .map(|k| (strsim::levenshtein(name, k.name), k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::builtin;

    fn trf_with(request: &str, response: &str) -> Layout {
        let len = |list: &str| -> usize {
            list.split("\"length\":")
                .skip(1)
                .map(|s| {
                    s.trim()
                        .split(|c: char| !c.is_ascii_digit())
                        .next()
                        .unwrap()
                        .parse::<usize>()
                        .unwrap()
                })
                .sum()
        };
        let text = format!(
            r#"{{"tx_code":"TRF009","request_length":{},"request":[{request}],"response_length":{},"response":[{response}]}}"#,
            len(request),
            len(response)
        );
        Layout::from_json("TRF009.json", &text).unwrap()
    }

    const REQUEST: &str = r#"{"name":"from_account","type":"AN","length":16},
        {"name":"to_bank","type":"N","length":3},
        {"name":"to_account","type":"AN","length":16},
        {"name":"amount","type":"U","length":13},
        {"name":"memo","type":"H","length":20}"#;
    const RESPONSE: &str = r#"{"name":"txn_id","type":"AN","length":16},
        {"name":"processed_at","type":"N","length":14},
        {"name":"balance","type":"U","length":15}"#;

    #[test]
    fn the_shipped_layouts_fit_their_operations() {
        let l = builtin();
        check(Operation::Transfer, &l["TRF001"]).unwrap();
        check(Operation::Inquiry, &l["INQ001"]).unwrap();
        check(Operation::Transfer, &trf_with(REQUEST, RESPONSE)).unwrap();
        // An inquiry layout cannot serve a transfer, nor the reverse.
        let e = check(Operation::Transfer, &l["INQ001"]).unwrap_err();
        assert!(
            matches!(
                e,
                ApiMismatch::MissingRequest {
                    field: "from_account",
                    ..
                }
            ),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(e.contains("no field `from_account`"), "{e}");
        let e = check(Operation::Inquiry, &l["TRF001"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no field `orig_guid`"), "{e}");
    }

    #[test]
    fn a_misspelt_response_field_is_refused_with_the_fix() {
        let e = check(
            Operation::Transfer,
            &trf_with(REQUEST, &RESPONSE.replace("\"balance\"", "\"balnce\"")),
        )
        .unwrap_err();
        assert!(
            matches!(&e, ApiMismatch::UnknownAnswerKey { field, .. } if field == "balnce"),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.contains("response field `balnce` is not in the core's answer")
                && e.contains("did you mean `balance`?")
                && e.contains("E901"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_request_field_is_refused_with_an_example() {
        for name in ["to_bank", "memo", "amount"] {
            let request: Vec<&str> = REQUEST
                .split("},")
                .filter(|f| !f.contains(&format!("\"{name}\"")))
                .collect();
            let request = request.join("},");
            let request = if request.ends_with('}') {
                request
            } else {
                format!("{request}}}")
            };
            let e = check(Operation::Transfer, &trf_with(&request, RESPONSE))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("request has no field `{name}`"))
                    && e.contains("POST /v1/transfers")
                    && e.contains(&format!("{{ \"name\": \"{name}\"")),
                "{e}"
            );
        }
    }

    #[test]
    fn wrong_types_are_refused() {
        let e = check(
            Operation::Transfer,
            &trf_with(
                &REQUEST.replace(r#""amount","type":"U""#, r#""amount","type":"AN""#),
                RESPONSE,
            ),
        )
        .unwrap_err();
        assert!(matches!(e, ApiMismatch::RequestType { .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("`amount` is type AN, which sends a string"),
            "{e}"
        );
        let e = check(
            Operation::Transfer,
            &trf_with(
                REQUEST,
                &RESPONSE.replace(r#""balance","type":"U""#, r#""balance","type":"AN""#),
            ),
        )
        .unwrap_err();
        assert!(
            matches!(e, ApiMismatch::ResponseType { key: "balance", .. }),
            "{e:?}"
        );
        let e = check(
            Operation::Transfer,
            &trf_with(
                &format!(r#"{REQUEST},{{"name":"guid","type":"AN","length":32}}"#),
                RESPONSE,
            ),
        )
        .unwrap_err();
        assert!(
            matches!(&e, ApiMismatch::HeaderKey { field } if field == "guid"),
            "{e:?}"
        );
    }

    #[test]
    fn a_misspelt_answer_key_finds_its_nearest() {
        assert_eq!(closest("balnce", ANSWER).map(|k| k.name), Some("balance"));
        assert_eq!(closest("txnid", ANSWER).map(|k| k.name), Some("txn_id"));
        assert!(closest("status_code", ANSWER).is_none());
    }
}
