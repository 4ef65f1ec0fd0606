//! What the telegram's summary line shows of its request fields: account
//! numbers keep their last four characters, free text only its length.

use serde_json::{Map, Value};

/// Request fields for a log line: account numbers keep their last four characters.
pub fn masked(fields: &Map<String, Value>) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(k);
        out.push('=');
        match v {
            Value::String(s) if k.ends_with("account") => out.push_str(&mask_account(s)),
            // Free text (memos) may hold anything; keep it out of the logs.
            Value::String(s) if k == "memo" => {
                out.push_str(&format!("<{} chars>", s.chars().count()))
            }
            Value::String(s) => out.push_str(s),
            other => out.push_str(&other.to_string()),
        }
    }
    out.push('}');
    out
}

/// `1002003004001` -> `*********4001`.
pub fn mask_account(s: &str) -> String {
    let n = s.chars().count();
    s.chars()
        .enumerate()
        .map(|(i, c)| if i + 4 < n { '*' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_keeps_last_four() {
        assert_eq!(mask_account("1002003004001"), "*********4001");
        assert_eq!(mask_account("123"), "123");
        let mut m = Map::new();
        m.insert("from_account".into(), Value::String("1002003004001".into()));
        m.insert("amount".into(), Value::from(5));
        m.insert("memo".into(), Value::String("월세".into()));
        let s = masked(&m);
        assert!(
            s.contains("*********4001") && !s.contains("1002003004001") && !s.contains("월세"),
            "{s}"
        );
    }
}
