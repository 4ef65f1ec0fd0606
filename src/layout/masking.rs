//! What a log line may show of a telegram's fields.
//!
//! Each field of a layout says how it is logged (`"log": "mask" | "length" |
//! "clear"`). A field that says nothing is masked unless it is a code, an amount
//! or a date (types `N` and `U`): a new layout, or a field named in a way nobody
//! foresaw (`from_acct_no`, `note`), leaks nothing by default.

use super::Layout;
use super::decoded::{DecodedFields, FieldValue};

/// How one field's value appears in the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogRule {
    /// Only the last 4 characters, the rest as `*` (`*********4001`); a value
    /// of 4 characters or fewer is all `*`.
    Mask,
    /// Only the length (`<7 chars>`): free text such as a memo.
    Length,
    /// As it is: codes, amounts, dates.
    Clear,
}

/// A value as a log line shows it, borrowed when shown as it is.
#[derive(Debug)]
enum Shown<'a, 'v> {
    Clear(&'a FieldValue<'v>),
    Text(String),
}

impl serde::Serialize for Shown<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Shown::Clear(v) => v.serialize(s),
            Shown::Text(t) => s.serialize_str(t),
        }
    }
}

impl LogRule {
    /// The value as a log line shows it (a number's digits are its text).
    fn show<'a, 'v>(self, value: &'a FieldValue<'v>) -> Shown<'a, 'v> {
        match self {
            LogRule::Clear => Shown::Clear(value),
            LogRule::Length => Shown::Text(format!("<{} chars>", value.text().chars().count())),
            LogRule::Mask => Shown::Text(mask_account(&value.text())),
        }
    }

    /// The rule's name as written in a layout file.
    pub fn as_str(self) -> &'static str {
        match self {
            LogRule::Mask => "mask",
            LogRule::Length => "length",
            LogRule::Clear => "clear",
        }
    }
}

/// `1002003004001` -> `*********4001`; `1234` -> `****`.
pub fn mask_account(s: &str) -> String {
    let n = s.chars().count();
    let masked = if n > 4 { n - 4 } else { n };
    // Built in two pieces, not a character at a time: two account fields
    // of every transfer's summary line pass through here.
    let kept = s.char_indices().nth(masked).map_or("", |(at, _)| &s[at..]);
    let mut out = String::with_capacity(masked + kept.len());
    out.extend(std::iter::repeat_n('*', masked));
    out.push_str(kept);
    out
}

impl Layout {
    /// The request fields as a log line may show them, each by its layout's
    /// `log` rule (a key the layout does not name is masked), as the text of
    /// one JSON object. Written straight from `fields` (a telegram's summary
    /// line carries it): no map of cloned keys and values is built.
    pub fn masked_request(&self, fields: &DecodedFields<'_>) -> String {
        struct Masked<'a, 'v>(&'a Layout, &'a DecodedFields<'v>);
        impl serde::Serialize for Masked<'_, '_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let Masked(layout, fields) = self;
                s.collect_map(
                    fields
                        .iter()
                        .map(|(k, v)| (k, layout.request_rule(k).show(v))),
                )
            }
        }
        // Writing to memory fails only on a bug; the line then shows no field.
        serde_json::to_string(&Masked(self, fields)).unwrap_or_else(|_| "{}".into())
    }

    /// How request field `name` is logged; a key the layout does not name
    /// is masked.
    fn request_rule(&self, name: &str) -> LogRule {
        self.request
            .iter()
            .find(|f| f.name == name)
            .map_or(LogRule::Mask, |f| f.log_rule())
    }

    /// The request and response fields logged in clear, as `request.NAME` and
    /// `response.NAME` (what `relayhub check` lists).
    pub fn clear_fields(&self) -> Vec<String> {
        let lists = [("request", &self.request), ("response", &self.response)];
        lists
            .iter()
            .flat_map(|(list, fields)| {
                fields
                    .iter()
                    .filter(|f| f.log_rule() == LogRule::Clear)
                    .map(move |f| format!("{list}.{}", f.name))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use proptest::strategy::Strategy;
    use serde_json::{Map, Value, json};

    use super::*;

    /// A map's strings and numbers as decoded fields.
    fn decoded(m: &Map<String, Value>) -> DecodedFields<'_> {
        DecodedFields::from_entries(
            m.iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::String(s) => FieldValue::Text(Cow::Borrowed(s)),
                        other => FieldValue::Number(other.as_u64().expect("a u64")),
                    };
                    (k.as_str(), v)
                })
                .collect(),
        )
    }

    /// The masked fields as a map, each value shown by its rule on its own:
    /// what the text written straight must read as.
    fn masked_map(l: &Layout, fields: &Map<String, Value>) -> Map<String, Value> {
        decoded(fields)
            .iter()
            .map(|(k, v)| {
                let shown = serde_json::to_value(l.request_rule(k).show(v)).unwrap();
                (k.to_owned(), shown)
            })
            .collect()
    }

    fn layout(len: usize, fields: &str) -> Layout {
        let text = format!(
            r#"{{"tx_code":"TST001","request_length":{len},"request":[{fields}],"response_length":0,"response":[]}}"#
        );
        Layout::from_json("test", &text).unwrap()
    }

    #[test]
    fn undeclared_text_is_masked_and_codes_amounts_dates_are_clear() {
        let l = layout(
            50,
            r#"{"name":"from_acct_no","type":"AN","length":16},
               {"name":"note","type":"H","length":20},
               {"name":"bank","type":"N","length":3},
               {"name":"amount","type":"U","length":11}"#,
        );
        let m = json!({"from_acct_no":"1002003004001","note":"010-1234-5678 call me",
                       "bank":"088","amount":50000});
        let out = masked_map(&l, m.as_object().unwrap());
        assert_eq!(out["from_acct_no"], "*********4001");
        assert_eq!(out["note"], "*****************l me");
        assert_eq!(out["bank"], "088");
        assert_eq!(out["amount"], 50000);
        let text = Value::Object(out.clone()).to_string();
        assert_eq!(l.masked_request(&decoded(m.as_object().unwrap())), text);
        assert!(!text.contains("1002003004001") && !text.contains("1234-5678"));
        assert_eq!(l.clear_fields(), ["request.bank", "request.amount"]);
    }

    #[test]
    fn declared_rules_win_over_the_defaults() {
        let l = layout(
            49,
            r#"{"name":"memo","type":"H","length":20,"log":"length"},
               {"name":"branch","type":"AN","length":4,"log":"clear"},
               {"name":"pin","type":"N","length":6,"log":"mask"},
               {"name":"amount","type":"U","length":19,"log":"mask"}"#,
        );
        let m = json!({"memo":"월세 11월","branch":"B001","pin":"123456","amount":1234567,
                       "extra":"secret-value"});
        let out = masked_map(&l, m.as_object().unwrap());
        assert_eq!(
            l.masked_request(&decoded(m.as_object().unwrap())),
            Value::Object(out.clone()).to_string()
        );
        assert_eq!(out["memo"], "<6 chars>");
        assert_eq!(out["branch"], "B001");
        assert_eq!(out["pin"], "**3456");
        assert_eq!(out["amount"], "***4567");
        // A key the layout does not name is masked.
        assert_eq!(out["extra"], "********alue");
        assert_eq!(l.clear_fields(), ["request.branch"]);
    }

    proptest::proptest! {
        /// The text written straight from the fields is the masked map's
        /// JSON, byte for byte, whatever the values (text, numbers) and
        /// whether the layout names the key.
        #[test]
        fn masked_text_is_the_masked_maps_json(
            values in proptest::collection::btree_map(
                "(memo|branch|pin|amount|extra|[a-z]{1,6})",
                proptest::prop_oneof![
                    proptest::num::u64::ANY.prop_map(Value::from),
                    "\\PC{0,12}".prop_map(Value::from),
                ],
                0..8,
            )
        ) {
            let l = layout(
                49,
                r#"{"name":"memo","type":"H","length":20,"log":"length"},
                   {"name":"branch","type":"AN","length":4,"log":"clear"},
                   {"name":"pin","type":"N","length":6,"log":"mask"},
                   {"name":"amount","type":"U","length":19}"#,
            );
            let fields: Map<String, Value> = values.into_iter().collect();
            let expected = Value::Object(masked_map(&l, &fields)).to_string();
            proptest::prop_assert_eq!(l.masked_request(&decoded(&fields)), expected);
        }
    }

    #[test]
    fn short_values_are_masked_whole() {
        assert_eq!(mask_account("1234"), "****");
        assert_eq!(mask_account(""), "");
        assert_eq!(mask_account("12345"), "*2345");
        assert_eq!(mask_account("한글계좌번호"), "**계좌번호");
    }

    proptest::proptest! {
        /// Every character but the last four (all of a value of four or
        /// fewer) becomes `*`, whatever its width in bytes.
        #[test]
        fn masking_keeps_only_the_last_four_characters(s in "\\PC{0,20}") {
            let n = s.chars().count();
            let keep = if n > 4 { 4 } else { 0 };
            let want: String = s
                .chars()
                .enumerate()
                .map(|(i, c)| if i + keep < n { '*' } else { c })
                .collect();
            proptest::prop_assert_eq!(mask_account(&s), want);
        }
    }

    #[test]
    fn an_unknown_rule_is_refused_with_the_field() {
        let e = Layout::from_json(
            "t.json",
            r#"{"tx_code":"TST001","request_length":1,"request":[{"name":"a","type":"AN","length":1,"log":"hide"}],"response_length":0,"response":[]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown variant `hide`"), "{e}");
    }
}
