//! A JSON object as the hub reads it: by name, one value at a time.
//!
//! The core's answer to a processed transfer is a small JSON object whose
//! values the response layout writes into the reply's body. Reading it into
//! a `serde_json` map would allocate every key and every text value, only to
//! drop them once the body is written, per telegram. [`BorrowedObject`]
//! reads the same bytes with its keys and text borrowed from them (owned
//! only where an escape had to be undone), and [`FieldSource`] lets the
//! layouts read either kind of object.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// One value of an object, as writing a field reads it. Arrays and objects
/// are only told apart: no field holds one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JsonRef<'a> {
    Null,
    Bool(bool),
    Number(&'a Number),
    Str(&'a str),
    Array,
    Object,
}

/// An object whose values can be read by name.
pub trait FieldSource {
    /// The value of key `name`, if the object has it.
    fn field(&self, name: &str) -> Option<JsonRef<'_>>;
}

impl FieldSource for Map<String, Value> {
    fn field(&self, name: &str) -> Option<JsonRef<'_>> {
        Some(match self.get(name)? {
            Value::Null => JsonRef::Null,
            Value::Bool(b) => JsonRef::Bool(*b),
            Value::Number(n) => JsonRef::Number(n),
            Value::String(s) => JsonRef::Str(s),
            Value::Array(_) => JsonRef::Array,
            Value::Object(_) => JsonRef::Object,
        })
    }
}

/// A JSON object read from bytes, its keys and text borrowed from them.
///
/// It reads as `serde_json` reads the same bytes into a map: the same bytes
/// are accepted, and a key given twice has its last value. One exception:
/// an object whose first key is `$serde_json::private::RawValue`, at any depth, is refused
/// as unreadable. `serde_json` (with its `raw_value` feature, which a
/// dependency of this crate turns on) reads such an object as the JSON text
/// of its value instead; an answer from the core has no business with it,
/// and "unreadable" is the reading that claims nothing (a 200 is then
/// E901).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BorrowedObject<'a> {
    /// In the order read.
    entries: Vec<(Cow<'a, str>, Scalar<'a>)>,
}

/// `serde_json`'s private token for a raw value, as an object's first key.
const RESERVED_KEY: &str = "$serde_json::private::RawValue";

/// A value as kept by [`BorrowedObject`].
#[derive(Debug, Clone, PartialEq)]
enum Scalar<'a> {
    Null,
    Bool(bool),
    Number(Number),
    Str(Cow<'a, str>),
    Array,
    Object,
}

impl<'a> BorrowedObject<'a> {
    /// The object `bytes` hold, or `None` unless they are one JSON object
    /// (surrounding whitespace allowed), as `serde_json` would say.
    pub fn parse(bytes: &'a [u8]) -> Option<BorrowedObject<'a>> {
        serde_json::from_slice(bytes).ok()
    }

    /// The value of key `name` if it is text.
    pub fn text(&self, name: &str) -> Option<&str> {
        match self.field(name)? {
            JsonRef::Str(s) => Some(s),
            _ => None,
        }
    }

    /// [`BorrowedObject::text`], but `None` when the key is given more than
    /// once: for the keys an answer's meaning turns on, where "the last
    /// one" is a guess.
    pub fn sole_text(&self, name: &str) -> Option<&str> {
        let given = self.entries.iter().filter(|(k, _)| k == name).count();
        if given == 1 { self.text(name) } else { None }
    }
}

impl FieldSource for BorrowedObject<'_> {
    fn field(&self, name: &str) -> Option<JsonRef<'_>> {
        // The last of a repeated key, as a map's insert keeps.
        let (_, value) = self.entries.iter().rev().find(|(k, _)| k == name)?;
        Some(match value {
            Scalar::Null => JsonRef::Null,
            Scalar::Bool(b) => JsonRef::Bool(*b),
            Scalar::Number(n) => JsonRef::Number(n),
            Scalar::Str(s) => JsonRef::Str(s),
            Scalar::Array => JsonRef::Array,
            Scalar::Object => JsonRef::Object,
        })
    }
}

impl<'de> Deserialize<'de> for BorrowedObject<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ObjectVisitor)
    }
}

/// Reads an object, at the top or nested, the same way.
struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = BorrowedObject<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8));
        while let Some(Text(key)) = map.next_key()? {
            if entries.is_empty() && key == RESERVED_KEY {
                return Err(de::Error::custom(
                    "an object whose first key is serde_json's reserved token",
                ));
            }
            entries.push((key, map.next_value()?));
        }
        Ok(BorrowedObject { entries })
    }
}

/// A string, borrowed when it has no escape to undo.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(TextVisitor).map(Text)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(s))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s.to_owned()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s))
    }
}

impl<'de> Deserialize<'de> for Scalar<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;
        impl<'de> Visitor<'de> for ScalarVisitor {
            type Value = Scalar<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Scalar::Null)
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Self::Value, E> {
                Ok(Scalar::Bool(b))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
                Ok(Scalar::Number(n.into()))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
                Ok(Scalar::Number(n.into()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
                // As `serde_json::Value` reads it (JSON has no NaN).
                Ok(Number::from_f64(n).map_or(Scalar::Null, Scalar::Number))
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Scalar::Str(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Scalar::Str(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(Scalar::Str(Cow::Owned(s)))
            }
            // Nested values are read and dropped, not skipped: skipping would
            // not check that their text is UTF-8, and an answer a map refuses
            // must be refused here too.
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<Scalar>()?.is_some() {}
                Ok(Scalar::Array)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                ObjectVisitor.visit_map(map).map(|_| Scalar::Object)
            }
        }
        d.deserialize_any(ScalarVisitor)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// What the map reads for `name`, as the borrowed object must.
    fn map_field(m: &Map<String, Value>, name: &str) -> Option<String> {
        m.field(name).map(|v| format!("{v:?}"))
    }

    fn borrowed_field(o: &BorrowedObject<'_>, name: &str) -> Option<String> {
        o.field(name).map(|v| format!("{v:?}"))
    }

    #[test]
    fn keys_and_text_are_borrowed_unless_escaped() {
        let bytes = br#"{"result":"OK","memo":"a\"b","n":12,"x":[1,{"y":2}],"o":{},"z":null}"#;
        let o = BorrowedObject::parse(bytes).unwrap();
        assert!(matches!(&o.entries[0].0, Cow::Borrowed("result")));
        assert!(matches!(&o.entries[0].1, Scalar::Str(Cow::Borrowed("OK"))));
        assert!(matches!(&o.entries[1].1, Scalar::Str(Cow::Owned(s)) if s == "a\"b"));
        assert_eq!(o.text("result"), Some("OK"));
        assert_eq!(o.text("n"), None);
        assert_eq!(o.field("x"), Some(JsonRef::Array));
        assert_eq!(o.field("o"), Some(JsonRef::Object));
        assert_eq!(o.field("z"), Some(JsonRef::Null));
        assert_eq!(o.field("missing"), None);
    }

    #[test]
    fn only_one_object_reads() {
        for bad in [
            &b""[..],
            b"[]",
            b"null",
            b"\"OK\"",
            b"{",
            b"{} {}",
            b"{\"a\":1,}",
            b"{\"a\":[1,}",
            // Text that is not UTF-8, however deep: a map refuses it.
            b"{\"a\":\"\x80\"}",
            b"{\"a\":{\"b\":\"\x80\"}}",
            b"{\"a\":[\"ok\",\"\xff\"]}",
            b"{\"\xc3\":1}",
        ] {
            assert_eq!(
                BorrowedObject::parse(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(BorrowedObject::parse(b" \n{ } \t").is_some());
    }

    #[test]
    fn serde_jsons_reserved_first_key_is_unreadable_at_any_depth() {
        for bad in [
            r#"{"$serde_json::private::RawValue":"{\"result\":\"OK\"}"}"#,
            r#"{"\u0024serde_json::private::RawValue":"{}"}"#,
            r#"{"result":"OK","x":{"$serde_json::private::RawValue":1}}"#,
            r#"{"result":"NOT_FOUND","x":[{"$serde_json::private::RawValue":true}]}"#,
        ] {
            assert_eq!(BorrowedObject::parse(bad.as_bytes()), None, "{bad}");
        }
        // Anywhere but first, it is a key like any other.
        let later = br#"{"result":"OK","$serde_json::private::RawValue":"5"}"#;
        let o = BorrowedObject::parse(later).unwrap();
        assert_eq!(o.text(RESERVED_KEY), Some("5"));
        let nested_later = br#"{"x":{"a":1,"$serde_json::private::RawValue":"5"}}"#;
        assert_eq!(
            BorrowedObject::parse(nested_later).unwrap().field("x"),
            Some(JsonRef::Object)
        );
    }

    /// Any JSON text: the values and their nesting, as text.
    fn json_text() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| json!(f).to_string()),
            Just("1e400".to_string()),
            "\\PC{0,6}".prop_map(|s| json!(s).to_string()),
            Just(r#""esc\u00e9\n""#.to_string()),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                proptest::collection::vec(("[a-c]{1,2}", inner), 0..5).prop_map(|v| {
                    let kv: Vec<String> =
                        v.iter().map(|(k, x)| format!("{}:{x}", json!(k))).collect();
                    format!("{{{}}}", kv.join(","))
                }),
            ]
        })
    }

    proptest! {
        /// Whatever the bytes, the borrowed object reads as `serde_json`'s map:
        /// the same bytes accepted, the same value under every key (a key
        /// given twice included).
        #[test]
        fn reads_as_the_map_reads(
            text in json_text(),
            noise in proptest::option::of((0usize..64, any::<u8>())),
            probe in "[a-c]{1,2}",
        ) {
            let mut bytes = text.into_bytes();
            if let Some((at, b)) = noise {
                let at = at % (bytes.len() + 1);
                bytes.insert(at, b);
            }
            let map = match serde_json::from_slice::<Value>(&bytes) {
                Ok(Value::Object(m)) => Some(m),
                _ => None,
            };
            let borrowed = BorrowedObject::parse(&bytes);
            prop_assert_eq!(map.is_some(), borrowed.is_some());
            if let (Some(m), Some(o)) = (map, borrowed) {
                for k in m.keys().map(String::as_str).chain([probe.as_str()]) {
                    prop_assert_eq!(map_field(&m, k), borrowed_field(&o, k));
                }
            }
        }
    }
}
