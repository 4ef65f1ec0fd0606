//! A journal that lives in memory: for tests and benchmarks, and for a hub that
//! is told explicitly (`--journal memory`) that forgetting on restart is fine.

use foldhash::HashMap;
use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex};

use super::{AttemptTo, Claim, Event, Finish, JournalError, Row, State};

/// What a row left `sending` by a stop says once it is unknown (its
/// `last_error`, and its history's note).
const STOPPED: &str = "was in flight when the hub stopped";

/// Each GUID's row with its history, boxed: the table itself then holds 24
/// bytes a slot instead of some 290, so growing it (a rehash copies every
/// slot into a table twice as large, each page of it touched for the first
/// time) costs a twelfth of the copying and of the page faults per telegram.
type Map = HashMap<Box<str>, Box<Kept>>;

/// The rows, and the texts many of them share.
#[derive(Default)]
struct Rows {
    map: Map,
    texts: Texts,
}

/// Texts that most rows repeat (tx codes, URLs, codes), kept once and
/// shared: a row then costs a few allocations and about half the bytes of
/// one with a string of its own for each (a busy hub's memory journal grows
/// by every transfer until its retention prunes it).
#[derive(Default)]
struct Texts(Vec<Arc<str>>);

/// Distinct texts kept for sharing; past them a text gets a copy of its
/// own, so a flood of distinct values cannot make the look-up long.
const TEXTS_MAX: usize = 64;

impl Texts {
    fn get(&mut self, text: &str) -> Arc<str> {
        if let Some(kept) = self.0.iter().find(|t| ***t == *text) {
            return kept.clone();
        }
        let kept: Arc<str> = Arc::from(text);
        if self.0.len() < TEXTS_MAX {
            self.0.push(kept.clone());
        }
        kept
    }
}

/// A row's fingerprint: the hub's (a SHA-256 in lowercase hex) as its 32
/// bytes, anything else as given.
enum Fingerprint {
    Sha256([u8; 32]),
    Text(Box<str>),
}

impl Fingerprint {
    fn new(text: &str) -> Self {
        let lower_hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
        if text.len() == 64 && text.as_bytes().iter().all(lower_hex) {
            let mut bytes = [0u8; 32];
            for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
                let nibble = |c: u8| {
                    if c.is_ascii_digit() {
                        c - b'0'
                    } else {
                        c - b'a' + 10
                    }
                };
                *byte = nibble(pair[0]) << 4 | nibble(pair[1]);
            }
            Fingerprint::Sha256(bytes)
        } else {
            Fingerprint::Text(text.into())
        }
    }

    fn text(&self) -> String {
        match self {
            Fingerprint::Sha256(bytes) => {
                let mut text = String::with_capacity(64);
                crate::hex::push(&mut text, bytes);
                text
            }
            Fingerprint::Text(text) => text.to_string(),
        }
    }
}

/// One GUID's row and its history, as [`Row`] and [`Event`] hold them but
/// with shared texts ([`Texts`]). The map's key holds the GUID; a row read
/// out gets it back ([`Kept::row`]).
struct Kept {
    tx_code: Arc<str>,
    fingerprint: Fingerprint,
    state: State,
    code: Option<Arc<str>>,
    answer: Option<Vec<u8>>,
    attempts: u32,
    last_attempt_ms: i64,
    answered_ms: Option<i64>,
    last_error: Option<String>,
    created_ms: i64,
    updated_ms: i64,
    url: Option<Arc<str>>,
    grace_ms: Option<i64>,
    events: Vec<KeptEvent>,
}

struct KeptEvent {
    at_ms: i64,
    state: State,
    code: Option<Arc<str>>,
    note: Cow<'static, str>,
}

impl Kept {
    /// The row as the journal's callers see it, its GUID included.
    fn row(&self, guid: &str) -> Row {
        Row {
            guid: guid.to_owned(),
            tx_code: self.tx_code.to_string(),
            fingerprint: self.fingerprint.text(),
            state: self.state,
            code: self.code.as_deref().map(str::to_owned),
            answer: self.answer.clone(),
            attempts: self.attempts,
            last_attempt_ms: self.last_attempt_ms,
            answered_ms: self.answered_ms,
            last_error: self.last_error.clone(),
            created_ms: self.created_ms,
            updated_ms: self.updated_ms,
            url: self.url.as_deref().map(str::to_owned),
            grace_ms: self.grace_ms,
        }
    }

    fn history(&self) -> Vec<Event> {
        self.events
            .iter()
            .map(|e| Event {
                at_ms: e.at_ms,
                state: e.state,
                code: e.code.as_deref().map(str::to_owned),
                note: e.note.to_string(),
            })
            .collect()
    }
}

/// The first attempt's note, the one nearly every row has.
const FIRST_ATTEMPT: &str = "attempt 1";

/// A row to change in place, and the shared texts.
fn row_mut<'a>(rows: &'a mut Rows, guid: &str) -> Option<(&'a mut Kept, &'a mut Texts)> {
    let Rows { map, texts } = rows;
    map.get_mut(guid).map(|kept| (&mut **kept, texts))
}

#[derive(Clone, Default)]
pub struct MemoryJournal {
    rows: Arc<Mutex<Rows>>,
}

impl MemoryJournal {
    fn lock(&self) -> std::sync::MutexGuard<'_, Rows> {
        // A panic while holding the lock cannot leave a row half-written: every
        // update below replaces whole values.
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn claim(
        &self,
        guid: &str,
        tx_code: &str,
        fingerprint: &str,
        url: &str,
        now_ms: i64,
    ) -> Result<Claim, JournalError> {
        self.claim_to(guid, tx_code, fingerprint, AttemptTo::url(url), now_ms)
    }

    pub fn claim_to(
        &self,
        guid: &str,
        tx_code: &str,
        fingerprint: &str,
        to: AttemptTo<'_>,
        now_ms: i64,
    ) -> Result<Claim, JournalError> {
        let mut rows = self.lock();
        let Rows { map, texts } = &mut *rows;
        // One look-up for both outcomes (the key is made either way).
        let slot = match map.entry(guid.into()) {
            Entry::Occupied(o) => return Ok(Claim::Existing(o.get().row(guid))),
            Entry::Vacant(v) => v,
        };
        // Room for the outcome's event too, so that it does not move the list.
        let mut events = Vec::with_capacity(2);
        events.push(KeptEvent {
            at_ms: now_ms,
            state: State::Sending,
            code: None,
            note: Cow::Borrowed(FIRST_ATTEMPT),
        });
        slot.insert(Box::new(Kept {
            tx_code: texts.get(tx_code),
            fingerprint: Fingerprint::new(fingerprint),
            state: State::Sending,
            code: None,
            answer: None,
            attempts: 1,
            last_attempt_ms: now_ms,
            answered_ms: None,
            last_error: None,
            created_ms: now_ms,
            updated_ms: now_ms,
            url: Some(texts.get(to.url)),
            grace_ms: to.grace_ms,
            events,
        }));
        Ok(Claim::New)
    }

    pub fn claim_resend(
        &self,
        guid: &str,
        attempts: u32,
        url: &str,
        now_ms: i64,
    ) -> Result<bool, JournalError> {
        self.claim_resend_to(guid, attempts, AttemptTo::url(url), now_ms)
    }

    pub fn claim_resend_to(
        &self,
        guid: &str,
        attempts: u32,
        to: AttemptTo<'_>,
        now_ms: i64,
    ) -> Result<bool, JournalError> {
        let mut rows = self.lock();
        let Some((row, texts)) = row_mut(&mut rows, guid) else {
            return Ok(false);
        };
        if row.state != State::NotSent || row.attempts != attempts {
            return Ok(false);
        }
        row.state = State::Sending;
        row.attempts += 1;
        row.last_attempt_ms = now_ms;
        row.updated_ms = now_ms;
        row.url = Some(texts.get(to.url));
        row.grace_ms = to.grace_ms;
        row.events.push(KeptEvent {
            at_ms: now_ms,
            state: State::Sending,
            code: None,
            note: format!("attempt {}", row.attempts).into(),
        });
        Ok(true)
    }

    pub fn note_url(&self, guid: &str, url: &str, now_ms: i64) -> Result<bool, JournalError> {
        let mut rows = self.lock();
        let Some((row, texts)) = row_mut(&mut rows, guid) else {
            return Ok(false);
        };
        if row.state != State::Sending {
            return Ok(false);
        }
        row.url = Some(texts.get(url));
        row.updated_ms = now_ms;
        row.events.push(KeptEvent {
            at_ms: now_ms,
            state: State::Sending,
            code: None,
            note: format!("failover: attempt {} goes to {url}", row.attempts).into(),
        });
        Ok(true)
    }

    pub fn finish(&self, guid: &str, f: Finish, now_ms: i64) -> Result<(), JournalError> {
        self.finish_if(guid, &[], f, now_ms).map(|_| ())
    }

    pub fn finish_if(
        &self,
        guid: &str,
        only_if: &[State],
        f: Finish,
        now_ms: i64,
    ) -> Result<bool, JournalError> {
        let mut rows = self.lock();
        let Some((row, texts)) = row_mut(&mut rows, guid) else {
            return Ok(false);
        };
        if !only_if.is_empty() && !only_if.contains(&row.state) {
            return Ok(false);
        }
        if f.attempt.is_some_and(|n| n != row.attempts) {
            return Ok(false);
        }
        let code = texts.get(&f.code);
        row.state = f.state;
        row.code = Some(code.clone());
        row.answer = f.answer;
        if f.error.is_some() {
            row.last_error = f.error;
        }
        row.answered_ms = Some(now_ms);
        row.updated_ms = now_ms;
        row.events.push(KeptEvent {
            at_ms: now_ms,
            state: f.state,
            code: Some(code),
            note: f.note.into(),
        });
        Ok(true)
    }

    pub fn get(&self, guid: &str) -> Result<Option<Row>, JournalError> {
        Ok(self.lock().map.get(guid).map(|kept| kept.row(guid)))
    }

    pub fn history(&self, guid: &str) -> Result<Vec<Event>, JournalError> {
        Ok(self
            .lock()
            .map
            .get(guid)
            .map(|kept| kept.history())
            .unwrap_or_default())
    }

    pub fn list(&self, state: State, limit: usize) -> Result<Vec<Row>, JournalError> {
        let mut rows: Vec<Row> = self
            .lock()
            .map
            .iter()
            .filter(|(_, kept)| kept.state == state)
            .map(|(guid, kept)| kept.row(guid))
            .collect();
        rows.sort_by_key(|r| r.created_ms);
        rows.truncate(limit);
        Ok(rows)
    }

    pub fn count(&self, state: State) -> Result<u64, JournalError> {
        Ok(self
            .lock()
            .map
            .values()
            .filter(|kept| kept.state == state)
            .count() as u64)
    }

    pub fn recover(&self, now_ms: i64) -> Result<u64, JournalError> {
        let mut n = 0;
        let mut rows = self.lock();
        let Rows { map, texts } = &mut *rows;
        for row in map.values_mut() {
            if row.state == State::Sending {
                row.state = State::Unknown;
                row.updated_ms = now_ms;
                row.last_error = Some(STOPPED.into());
                row.events.push(KeptEvent {
                    at_ms: now_ms,
                    state: State::Unknown,
                    code: Some(texts.get("E901")),
                    note: Cow::Borrowed(STOPPED),
                });
                n += 1;
            }
        }
        Ok(n)
    }

    /// Deletes settled rows (`done`, `not_sent`) last updated before
    /// `before_ms`; rows `sending` or `unknown` stay whatever their age.
    pub fn prune(&self, before_ms: i64) -> Result<u64, JournalError> {
        let map = &mut self.lock().map;
        let before = map.len();
        map.retain(|_, kept| kept.updated_ms >= before_ms || !kept.state.is_settled());
        Ok((before - map.len()) as u64)
    }

    pub fn unsettled_before(&self, before_ms: i64) -> Result<u64, JournalError> {
        Ok(self
            .lock()
            .map
            .values()
            .filter(|kept| kept.updated_ms < before_ms && !kept.state.is_settled())
            .count() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_of_an_older_attempt_never_lands_on_a_newer_one() {
        let j = MemoryJournal::default();
        j.claim("g", "TRF001", "fp", "http://core", 1).unwrap();
        let not_sent = Finish {
            state: State::NotSent,
            code: "E902".into(),
            answer: None,
            error: None,
            note: "refused".into(),
            attempt: Some(1),
        };
        assert!(
            j.finish_if("g", &[State::Sending], not_sent.clone(), 2)
                .unwrap()
        );
        assert!(j.claim_resend("g", 1, "http://core", 3).unwrap());
        assert!(!j.finish_if("g", &[State::Sending], not_sent, 4).unwrap());
        assert_eq!(
            j.get("g").unwrap().map(|r| (r.state, r.attempts)),
            Some((State::Sending, 2))
        );
    }

    /// The map's key is the only copy of a GUID: every row read out has it.
    #[test]
    fn a_row_read_out_carries_its_guid() {
        let j = MemoryJournal::default();
        j.claim("g1", "TRF001", "fp", "http://core", 1).unwrap();
        assert_eq!(j.get("g1").unwrap().unwrap().guid, "g1");
        let Claim::Existing(row) = j.claim("g1", "TRF001", "fp", "http://core", 2).unwrap() else {
            panic!("a second claim of g1 is not new");
        };
        assert_eq!(row.guid, "g1");
        assert_eq!(j.list(State::Sending, 10).unwrap()[0].guid, "g1");
    }

    /// Rows keep shared texts and a binary fingerprint; read out, they are
    /// what was written, whatever the fingerprint's text.
    #[test]
    fn a_row_and_its_history_read_out_as_written() {
        let j = MemoryJournal::default();
        // A SHA-256 as the hub writes it: 64 lowercase hex digits.
        let sha = "0123456789abcdef".repeat(4);
        for (guid, fingerprint) in [
            ("g1", sha.as_str()),
            ("g2", "fp"),
            ("g3", &sha.to_uppercase()),
        ] {
            j.claim(guid, "TRF001", fingerprint, "http://core", 1)
                .unwrap();
            let done = Finish {
                state: State::Done,
                code: "0000".into(),
                answer: Some(b"answer".to_vec()),
                error: None,
                note: "processed".into(),
                attempt: Some(1),
            };
            j.finish(guid, done, 2).unwrap();
            let row = j.get(guid).unwrap().unwrap();
            assert_eq!(
                (
                    row.tx_code.as_str(),
                    row.fingerprint.as_str(),
                    row.url.as_deref()
                ),
                ("TRF001", fingerprint, Some("http://core"))
            );
            assert_eq!(
                (row.code.as_deref(), row.answer.as_deref()),
                (Some("0000"), Some(&b"answer"[..]))
            );
            let history: Vec<_> = j
                .history(guid)
                .unwrap()
                .into_iter()
                .map(|e| (e.state, e.code, e.note))
                .collect();
            assert_eq!(
                history,
                [
                    (State::Sending, None, "attempt 1".to_string()),
                    (
                        State::Done,
                        Some("0000".to_string()),
                        "processed".to_string()
                    )
                ]
            );
        }
        // One copy of each text for all rows.
        let rows = j.lock();
        let texts: Vec<&str> = rows.texts.0.iter().map(|t| &**t).collect();
        assert_eq!(texts, ["TRF001", "http://core", "0000"]);
    }

    #[test]
    fn texts_past_the_limit_get_copies_of_their_own() {
        let mut texts = Texts::default();
        for i in 0..TEXTS_MAX + 10 {
            assert_eq!(&*texts.get(&format!("url-{i}")), format!("url-{i}"));
        }
        assert_eq!(texts.0.len(), TEXTS_MAX);
        assert!(Arc::ptr_eq(&texts.get("url-0"), &texts.get("url-0")));
    }

    #[test]
    fn count_by_state() {
        let j = MemoryJournal::default();
        for g in ["a", "b", "c"] {
            j.claim(g, "TRF001", "fp", "http://core", 1).unwrap();
        }
        let done = Finish {
            state: State::Done,
            code: "0000".into(),
            answer: None,
            error: None,
            note: "ok".into(),
            attempt: None,
        };
        j.finish("c", done, 2).unwrap();
        assert_eq!(j.count(State::Sending).unwrap(), 2);
        assert_eq!(j.count(State::Done).unwrap(), 1);
        assert_eq!(j.recover(3).unwrap(), 2);
        assert_eq!(j.count(State::Unknown).unwrap(), 2);
        let recovered = j.get("a").unwrap().unwrap();
        assert_eq!(recovered.last_error.as_deref(), Some(STOPPED));
        assert_eq!(j.count(State::Sending).unwrap(), 0);
    }

    fn settle(j: &MemoryJournal, guid: &str, state: State, code: &str, at_ms: i64) {
        let f = Finish {
            state,
            code: code.into(),
            answer: None,
            error: None,
            note: "test".into(),
            attempt: None,
        };
        j.finish(guid, f, at_ms).unwrap();
    }

    #[test]
    fn prune_keeps_unsettled_and_recent_rows() {
        let j = MemoryJournal::default();
        for g in ["done", "not-sent", "unknown", "sending", "recent"] {
            j.claim(g, "TRF001", "fp", "http://core", 10).unwrap();
        }
        settle(&j, "done", State::Done, "0000", 20);
        settle(&j, "not-sent", State::NotSent, "E902", 20);
        settle(&j, "unknown", State::Unknown, "E901", 20);
        settle(&j, "recent", State::Done, "0000", 100);

        assert_eq!(j.unsettled_before(100).unwrap(), 2);
        assert_eq!(j.prune(100).unwrap(), 2);
        for g in ["done", "not-sent"] {
            assert_eq!(j.get(g).unwrap(), None, "{g} kept");
            assert!(j.history(g).unwrap().is_empty());
        }
        for g in ["unknown", "sending", "recent"] {
            assert!(j.get(g).unwrap().is_some(), "{g} pruned");
        }
        // However old: an unknown row's resend must stay an inquiry.
        assert_eq!(j.prune(i64::MAX).unwrap(), 1);
        assert_eq!(j.unsettled_before(i64::MAX).unwrap(), 2);
        assert!(matches!(
            j.claim("unknown", "TRF001", "fp", "http://core", 1_000)
                .unwrap(),
            Claim::Existing(Row {
                state: State::Unknown,
                ..
            })
        ));
        // A pruned GUID is new again.
        assert_eq!(
            j.claim("done", "TRF001", "fp", "http://core", 1_000)
                .unwrap(),
            Claim::New
        );
    }
}
