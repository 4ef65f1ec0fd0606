//! A telegram's reply, and what an outcome leaves behind: the reply's code and
//! body, the journal state, and the words of the log line.

use std::fmt::Write as _;

use crate::header::HEADER_LEN;
use crate::journal::{Finish, Row, State};
use crate::json_object::BorrowedObject;
use crate::layout::{Layout, encode_fields};
use crate::outcome::{Code, CodeTable, Outcome, read_transfer};

/// The hub's answer to one telegram: a code, the body that goes with 0000, and
/// whether the connection closes after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: Code,
    pub body: Vec<u8>,
    pub close: bool,
}

impl Reply {
    pub(crate) fn code(code: Code) -> Reply {
        Reply {
            code,
            body: Vec::new(),
            close: false,
        }
    }
}

/// Turns an outcome into a reply; a 0000 whose answer does not fit the response
/// layout is "unknown" (the core did something the hub cannot report).
pub(super) fn reply_for(outcome: Outcome, layout: &Layout, codes: &CodeTable) -> (Reply, Outcome) {
    reply_with(outcome, None, layout, codes)
}

/// The reply to the core's answer to a transfer: [`read_transfer`] and
/// [`reply_for`], with the answer's body read once.
pub(super) fn reply_to_transfer(
    status: u16,
    body: &[u8],
    layout: &Layout,
    codes: &CodeTable,
) -> (Reply, Outcome) {
    let (outcome, fields) = read_transfer(status, body, codes);
    reply_with(outcome, fields.as_ref(), layout, codes)
}

/// [`reply_for`], with a processed answer's `fields` if already read.
fn reply_with(
    outcome: Outcome,
    fields: Option<&BorrowedObject<'_>>,
    layout: &Layout,
    codes: &CodeTable,
) -> (Reply, Outcome) {
    if let Outcome::Processed(answer) = &outcome {
        let read;
        let fields = match fields {
            Some(f) => f,
            None => {
                read = answer.fields();
                &read
            }
        };
        return match encode_fields(&layout.response, fields, HEADER_LEN) {
            Ok(body) => (
                Reply {
                    code: Code::OK,
                    body,
                    close: false,
                },
                outcome,
            ),
            Err(e) => {
                let o = Outcome::Unknown(format!("answer does not fit the response layout: {e}"));
                (Reply::code(Code::UNKNOWN), o)
            }
        };
    }
    (Reply::code(codes.code(&outcome)), outcome)
}

/// The stored answer of a settled row, replayed to a repeat.
pub(super) fn replay(row: &Row) -> Reply {
    Reply {
        code: row
            .code
            .as_deref()
            .and_then(Code::parse)
            .unwrap_or(Code::UNKNOWN),
        body: row.answer.clone().unwrap_or_default(),
        close: false,
    }
}

/// The journal state a code leaves a GUID in.
pub(super) fn state_for(code: Code) -> State {
    if code.is_final() {
        State::Done
    } else if code == Code::UNKNOWN {
        State::Unknown
    } else {
        State::NotSent
    }
}

/// What the journal records for a reply: its state, code, body and error.
pub(super) fn finish_of(reply: &Reply, outcome: &Outcome, note: String) -> Finish {
    Finish {
        state: state_for(reply.code),
        code: reply.code.as_str().into(),
        answer: (!reply.body.is_empty()).then(|| reply.body.clone()),
        error: error_of(outcome),
        note,
        attempt: None,
    }
}

/// The words of the log line (and the journal's history) for an outcome,
/// made in one piece whatever the outcome (every answered telegram has one).
pub(super) fn describe(outcome: &Outcome, attempt: u32) -> String {
    let (what, reason) = match outcome {
        Outcome::Processed(_) => ("processed", ""),
        Outcome::Rejected(r) => ("rejected: ", r.as_str()),
        Outcome::TargetError(r) => ("target error: ", r.as_str()),
        Outcome::NotSent(r) => ("not sent: ", r.as_str()),
        Outcome::NoCapacity(r) => ("no capacity: ", r.as_str()),
        Outcome::Unknown(r) => ("unknown: ", r.as_str()),
        Outcome::NeverReceived => ("the core never received it", ""),
    };
    // Room for "attempt 4294967295: " too.
    let mut text = String::with_capacity(20 + what.len() + reason.len());
    if attempt > 0 {
        let _ = write!(text, "attempt {attempt}: ");
    }
    text.push_str(what);
    text.push_str(reason);
    text
}

/// The error text a journal row keeps for an outcome.
pub(super) fn error_of(outcome: &Outcome) -> Option<String> {
    match outcome {
        Outcome::TargetError(r)
        | Outcome::NotSent(r)
        | Outcome::NoCapacity(r)
        | Outcome::Unknown(r) => Some(r.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_processed_outcome_reads_the_same_at_every_attempt() {
        let processed = Outcome::Processed(Default::default());
        assert_eq!(describe(&processed, 0), "processed");
        for n in 1..4 {
            assert_eq!(describe(&processed, n), format!("attempt {n}: processed"));
        }
        let unknown = Outcome::Unknown("timeout".into());
        assert_eq!(describe(&unknown, 1), "attempt 1: unknown: timeout");
    }

    /// A 200 without one of the fields the channel's 0000 carries is "a 200
    /// that does not fit the response layout": E901, whichever field it
    /// lacks (before, a missing `txn_id` gave 0000 with a blank one, while
    /// a missing `balance` gave E901).
    #[test]
    fn a_processed_answer_lacking_a_response_field_is_e901() {
        let layouts = crate::layout::builtin();
        let codes = CodeTable::builtin();
        let full = serde_json::json!({
            "result": "OK", "txn_id": "T1", "balance": 1, "processed_at": "20261129132001"
        });
        let layout = &layouts["TRF001"];
        let (reply, _) = reply_to_transfer(200, full.to_string().as_bytes(), layout, &codes);
        assert_eq!(reply.code, Code::OK);
        for missing in ["txn_id", "processed_at", "balance"] {
            let mut absent = full.clone();
            absent.as_object_mut().unwrap().remove(missing);
            let mut blank = full.clone();
            blank[missing] = "".into();
            for body in [absent, blank] {
                let (reply, outcome) =
                    reply_to_transfer(200, body.to_string().as_bytes(), layout, &codes);
                assert_eq!(reply.code, Code::UNKNOWN, "{body}");
                assert!(
                    error_of(&outcome)
                        .is_some_and(|e| e.contains("does not fit the response layout")),
                    "{outcome:?}"
                );
            }
        }
    }

    #[test]
    fn states_for_codes() {
        assert_eq!(state_for(Code::OK), State::Done);
        assert_eq!(state_for(Code::TARGET_ERROR), State::Done);
        assert_eq!(state_for(Code::UNKNOWN), State::Unknown);
        assert_eq!(state_for(Code::NOT_SENT), State::NotSent);
        assert_eq!(state_for(Code::NO_CAPACITY), State::NotSent);
        assert_eq!(state_for(Code::NEVER_RECEIVED), State::NotSent);
    }
}
