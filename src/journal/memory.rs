//! A journal that lives in memory: for tests and benchmarks, and for a hub that
//! is told explicitly (`--journal memory`) that forgetting on restart is fine.

use foldhash::HashMap;
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
type Rows = HashMap<Box<str>, Box<Kept>>;

/// One GUID's row and its history. The row's `guid` is left empty: the
/// map's key holds it, and a row read out gets it back ([`Kept::row`]).
struct Kept {
    row: Row,
    events: Vec<Event>,
}

impl Kept {
    /// The row as the journal's callers see it, its GUID included.
    fn row(&self, guid: &str) -> Row {
        Row {
            guid: guid.to_owned(),
            ..self.row.clone()
        }
    }
}

/// A row and its history, to change in place.
fn row_mut<'a>(rows: &'a mut Rows, guid: &str) -> Option<(&'a mut Row, &'a mut Vec<Event>)> {
    rows.get_mut(guid)
        .map(|kept| (&mut kept.row, &mut kept.events))
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
        // One look-up for both outcomes (the key is made either way).
        let slot = match rows.entry(guid.into()) {
            Entry::Occupied(o) => return Ok(Claim::Existing(o.get().row(guid))),
            Entry::Vacant(v) => v,
        };
        let row = Row {
            guid: String::new(),
            tx_code: tx_code.into(),
            fingerprint: fingerprint.into(),
            state: State::Sending,
            code: None,
            answer: None,
            attempts: 1,
            last_attempt_ms: now_ms,
            answered_ms: None,
            last_error: None,
            created_ms: now_ms,
            updated_ms: now_ms,
            url: Some(to.url.into()),
            grace_ms: to.grace_ms,
        };
        // Room for the outcome's event too, so that it does not move the list.
        let mut events = Vec::with_capacity(2);
        events.push(Event {
            at_ms: now_ms,
            state: State::Sending,
            code: None,
            note: "attempt 1".into(),
        });
        slot.insert(Box::new(Kept { row, events }));
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
        let Some((row, events)) = row_mut(&mut rows, guid) else {
            return Ok(false);
        };
        if row.state != State::NotSent || row.attempts != attempts {
            return Ok(false);
        }
        row.state = State::Sending;
        row.attempts += 1;
        row.last_attempt_ms = now_ms;
        row.updated_ms = now_ms;
        row.url = Some(to.url.into());
        row.grace_ms = to.grace_ms;
        events.push(Event {
            at_ms: now_ms,
            state: State::Sending,
            code: None,
            note: format!("attempt {}", row.attempts),
        });
        Ok(true)
    }

    pub fn note_url(&self, guid: &str, url: &str, now_ms: i64) -> Result<bool, JournalError> {
        let mut rows = self.lock();
        let Some((row, events)) = row_mut(&mut rows, guid) else {
            return Ok(false);
        };
        if row.state != State::Sending {
            return Ok(false);
        }
        row.url = Some(url.into());
        row.updated_ms = now_ms;
        events.push(Event {
            at_ms: now_ms,
            state: State::Sending,
            code: None,
            note: format!("failover: attempt {} goes to {url}", row.attempts),
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
        let Some((row, events)) = row_mut(&mut rows, guid) else {
            return Ok(false);
        };
        if !only_if.is_empty() && !only_if.contains(&row.state) {
            return Ok(false);
        }
        if f.attempt.is_some_and(|n| n != row.attempts) {
            return Ok(false);
        }
        row.state = f.state;
        row.code = Some(f.code.clone());
        row.answer = f.answer;
        if f.error.is_some() {
            row.last_error = f.error;
        }
        row.answered_ms = Some(now_ms);
        row.updated_ms = now_ms;
        events.push(Event {
            at_ms: now_ms,
            state: f.state,
            code: Some(f.code),
            note: f.note,
        });
        Ok(true)
    }

    pub fn get(&self, guid: &str) -> Result<Option<Row>, JournalError> {
        Ok(self.lock().get(guid).map(|kept| kept.row(guid)))
    }

    pub fn history(&self, guid: &str) -> Result<Vec<Event>, JournalError> {
        Ok(self
            .lock()
            .get(guid)
            .map(|kept| kept.events.clone())
            .unwrap_or_default())
    }

    pub fn list(&self, state: State, limit: usize) -> Result<Vec<Row>, JournalError> {
        let mut rows: Vec<Row> = self
            .lock()
            .iter()
            .filter(|(_, kept)| kept.row.state == state)
            .map(|(guid, kept)| kept.row(guid))
            .collect();
        rows.sort_by_key(|r| r.created_ms);
        rows.truncate(limit);
        Ok(rows)
    }

    pub fn count(&self, state: State) -> Result<u64, JournalError> {
        Ok(self
            .lock()
            .values()
            .filter(|kept| kept.row.state == state)
            .count() as u64)
    }

    pub fn recover(&self, now_ms: i64) -> Result<u64, JournalError> {
        let mut n = 0;
        for kept in self.lock().values_mut() {
            let Kept { row, events } = &mut **kept;
            if row.state == State::Sending {
                row.state = State::Unknown;
                row.updated_ms = now_ms;
                row.last_error = Some(STOPPED.into());
                events.push(Event {
                    at_ms: now_ms,
                    state: State::Unknown,
                    code: Some("E901".into()),
                    note: STOPPED.into(),
                });
                n += 1;
            }
        }
        Ok(n)
    }

    /// Deletes settled rows (`done`, `not_sent`) last updated before
    /// `before_ms`; rows `sending` or `unknown` stay whatever their age.
    pub fn prune(&self, before_ms: i64) -> Result<u64, JournalError> {
        let mut rows = self.lock();
        let before = rows.len();
        rows.retain(|_, kept| kept.row.updated_ms >= before_ms || !kept.row.state.is_settled());
        Ok((before - rows.len()) as u64)
    }

    pub fn unsettled_before(&self, before_ms: i64) -> Result<u64, JournalError> {
        Ok(self
            .lock()
            .values()
            .filter(|kept| kept.row.updated_ms < before_ms && !kept.row.state.is_settled())
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
