//! A body's fields as decoded, without a JSON map in between.
//!
//! A transfer telegram's fields are read once and written twice: as the
//! core's request body and as the summary line's masked fields. Both are
//! JSON objects with their keys in order, so the fields are kept sorted by
//! name, each value borrowed from the telegram where its bytes are already
//! the text (ASCII), and serialized straight. A `serde_json` map would clone
//! every key and value and drop them again, per telegram.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// One decoded value: text (`AN`, `N`, `H`) or a number (`U`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue<'a> {
    /// A JSON string.
    Text(Cow<'a, str>),
    /// A JSON number.
    Number(u64),
}

impl FieldValue<'_> {
    /// The value as JSON.
    pub fn to_value(&self) -> Value {
        match self {
            FieldValue::Text(s) => Value::String(s.as_ref().to_owned()),
            FieldValue::Number(n) => Value::from(*n),
        }
    }

    /// The text a log rule reads: a string as it is, a number's digits.
    pub(super) fn text(&self) -> Cow<'_, str> {
        match self {
            FieldValue::Text(s) => Cow::Borrowed(s),
            FieldValue::Number(n) => Cow::Owned(n.to_string()),
        }
    }
}

/// Written as [`FieldValue::to_value`]'s JSON would be.
impl serde::Serialize for FieldValue<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FieldValue::Text(t) => s.serialize_str(t),
            FieldValue::Number(n) => s.serialize_u64(*n),
        }
    }
}

/// A body's fields by name, in the order of a JSON object's keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecodedFields<'a> {
    /// Sorted by name; names are unique (a layout's are).
    entries: Vec<(&'a str, FieldValue<'a>)>,
}

impl<'a> DecodedFields<'a> {
    /// The fields of `entries`, sorted; a name given twice keeps its last value
    /// (as inserting into a map would).
    pub fn from_entries(mut entries: Vec<(&'a str, FieldValue<'a>)>) -> DecodedFields<'a> {
        // Reversed, then a stable sort: of equal names the last given comes
        // first, and `dedup_by` keeps the first of a run. In place, no copy.
        entries.reverse();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        entries.dedup_by(|later, first| later.0 == first.0);
        DecodedFields { entries }
    }

    /// The fields in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &FieldValue<'a>)> + '_ {
        self.entries.iter().map(|(k, v)| (*k, v))
    }

    /// The value of field `name`.
    pub fn get(&self, name: &str) -> Option<&FieldValue<'a>> {
        self.entries
            .binary_search_by(|(k, _)| (*k).cmp(name))
            .ok()
            .map(|i| &self.entries[i].1)
    }

    /// The text of field `name`, if it is text.
    pub fn text(&self, name: &str) -> Option<&str> {
        match self.get(name)? {
            FieldValue::Text(s) => Some(s),
            FieldValue::Number(_) => None,
        }
    }

    /// About the length of these fields as a JSON object's entries: each key
    /// and text quoted with its colon and comma, a number's 20 digits at most.
    pub fn json_len_hint(&self) -> usize {
        self.entries
            .iter()
            .map(|(k, v)| {
                k.len()
                    + 6
                    + match v {
                        FieldValue::Text(t) => t.len(),
                        FieldValue::Number(_) => 20,
                    }
            })
            .sum()
    }

    /// Whether there is a field `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// How many fields.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The fields as a JSON object.
    pub fn to_map(&self) -> Map<String, Value> {
        self.iter()
            .map(|(k, v)| (k.to_owned(), v.to_value()))
            .collect()
    }
}

/// Written as [`DecodedFields::to_map`]'s JSON would be.
impl serde::Serialize for DecodedFields<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn value() -> impl Strategy<Value = FieldValue<'static>> {
        prop_oneof![
            any::<u64>().prop_map(FieldValue::Number),
            "\\PC{0,8}".prop_map(|s| FieldValue::Text(Cow::Owned(s))),
        ]
    }

    proptest! {
        /// Whatever the order given and the names repeated, the fields read,
        /// look up and serialize as the map built by inserting them in turn.
        #[test]
        fn the_fields_are_the_map_of_their_entries(
            entries in proptest::collection::vec(("[a-e]{1,2}", value()), 0..10),
            probe in "[a-e]{1,2}",
        ) {
            let mut map = Map::new();
            for (k, v) in &entries {
                map.insert(k.clone(), v.to_value());
            }
            let fields = DecodedFields::from_entries(
                entries.iter().map(|(k, v)| (k.as_str(), v.clone())).collect(),
            );
            prop_assert_eq!(fields.to_map(), map.clone());
            prop_assert_eq!(fields.len(), map.len());
            let got = fields.get(&probe).map(FieldValue::to_value);
            prop_assert_eq!(got.as_ref(), map.get(&probe));
            prop_assert_eq!(fields.text(&probe), map.get(&probe).and_then(Value::as_str));
            prop_assert_eq!(
                serde_json::to_string(&fields).unwrap(),
                Value::Object(map).to_string()
            );
        }
    }
}
