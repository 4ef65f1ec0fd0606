//! Single flight inside one process: while a transfer is handled, later
//! telegrams with the same GUID wait for its reply instead of touching the
//! journal or the core.

use foldhash::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{SetOnce, watch};

use super::Reply;
use crate::journal::Row;

struct Flight {
    fingerprint: String,
    /// Made by the first follower: a flight nobody follows (nearly all of
    /// them) costs no channel, no wake-up of its waiters and no copy of the
    /// reply.
    reply: Option<watch::Sender<Option<Reply>>>,
}

/// The transfers in flight in this process, by GUID, the transfers that
/// wait for room to start or whose task has not run yet, and those of
/// them that may post once it does.
#[derive(Default)]
pub(super) struct Flights {
    by_guid: Mutex<HashMap<String, Flight>>,
    pub(super) waiting: Waiting,
    /// Transfers that started while the hub was not draining, in a task
    /// that has not run yet: they will join their flight (and may post)
    /// when it does (see [`super::MayPost`]).
    pub(super) pending: Waiting,
}

/// What joining a GUID's flight made of the caller.
pub(super) enum Joined<'a> {
    /// The first telegram for the GUID: it handles the transfer.
    Lead(Lead<'a>),
    /// A repeat while the first is in flight: it waits for that reply.
    Follow {
        fingerprint: String,
        reply: watch::Receiver<Option<Reply>>,
    },
}

/// The leader's hold on a flight; the flight ends when it is finished or
/// dropped, even if the leader is cancelled (its followers then see the
/// sender gone).
pub(super) struct Lead<'a> {
    /// `None` once the flight has ended.
    flights: Option<&'a Flights>,
    guid: &'a str,
}

impl Lead<'_> {
    /// Ends the flight and hands the reply to every follower. A telegram with
    /// the GUID that comes after this leads a flight of its own, and finds
    /// the transfer's row in the journal.
    pub(super) fn finish(mut self, reply: &Reply) {
        if let Some(tx) = self.end().and_then(|flight| flight.reply) {
            let _ = tx.send(Some(reply.clone()));
        }
    }

    /// Takes the flight out of the list, once. Its end is counted for the
    /// GUID's waiting telegrams first (a row read before it may predate its
    /// claim), so that whoever sees the flight gone sees the count.
    fn end(&mut self) -> Option<Flight> {
        let flights = self.flights.take()?;
        flights.waiting.flight_ended(self.guid);
        flights.lock().remove(self.guid)
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        self.end();
    }
}

impl Flights {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Flight>> {
        self.by_guid.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The GUID's row as read while a telegram of it waited for room, if
    /// that read is done and still holds: no flight of the GUID runs, and
    /// none ended since the read began. A row changes from "never sent" or
    /// "not sent" to anything else only by a claim, which only a flight
    /// makes, and a flight's claim is written before it ends, or nothing is
    /// sent; a row read after a flight ended has its claim.
    pub(super) fn row_read_ahead(&self, guid: &str) -> Option<Option<Row>> {
        let ahead = self.waiting.read_ahead(guid)?;
        // The flight first: one gone from the list counted its end before
        // it left.
        if self.contains(guid) || self.waiting.ended(guid) != ahead.ended_before {
            return None;
        }
        ahead.row.get().cloned()
    }

    /// Leads the GUID's flight, or follows the one already in the air.
    pub(super) fn join<'a>(&'a self, guid: &'a str, fingerprint: &str) -> Joined<'a> {
        let mut flights = self.lock();
        if let Some(f) = flights.get_mut(guid) {
            let reply = match &f.reply {
                Some(tx) => tx.subscribe(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    f.reply = Some(tx);
                    rx
                }
            };
            return Joined::Follow {
                fingerprint: f.fingerprint.clone(),
                reply,
            };
        }
        flights.insert(
            guid.to_string(),
            Flight {
                fingerprint: fingerprint.to_string(),
                reply: None,
            },
        );
        Joined::Lead(Lead {
            flights: Some(self),
            guid,
        })
    }

    /// Whether a telegram of this process is handling the GUID now.
    pub(super) fn contains(&self, guid: &str) -> bool {
        self.lock().contains_key(guid)
    }
}

/// Telegrams read whole that wait for room to start (their connection has
/// its maximum in flight; any tx code, since a reload may make it a
/// transfer's before it starts), or transfers that started in a task that
/// may not have run yet, by GUID: their budget runs and a transfer may be
/// to come, so they count as handled by this hub as much as a flight does.
/// A count per GUID: the same GUID may wait on several connections. The
/// same type counts [`Flights::pending`].
#[derive(Default)]
pub(super) struct Waiting(Mutex<HashMap<String, Waiter>>);

struct Waiter {
    count: u32,
    /// Flights of the GUID that ended while it waited.
    ended: u64,
    ahead: Option<Arc<ReadAhead>>,
}

/// A waiting GUID's row, read while its telegrams wait: when the budget
/// runs out before their turn, their answer is the row's (the stored
/// answer, E901 or E903) without a read of the journal at that moment, when
/// thousands of such telegrams may want one at once (a probe saw SQLite's
/// reads, all due together, answer them past the budget, or too late to
/// say anything but E901).
pub(super) struct ReadAhead {
    /// [`Waiting::ended`] before the read began.
    ended_before: u64,
    /// The row as read; unset while the read runs, and for good when it failed.
    pub(super) row: SetOnce<Option<Row>>,
}

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiter>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one more telegram of the GUID waiting. With `read_ahead` (the
    /// journal's reads are worth doing before they are needed), the GUID's
    /// first waiting telegram gets a [`ReadAhead`] to fill, which later
    /// ones share; the read must begin after this returns.
    pub(super) fn add(&self, guid: &str, read_ahead: bool) -> Option<Arc<ReadAhead>> {
        let mut waiting = self.lock();
        let waiter = waiting.entry(guid.to_string()).or_insert(Waiter {
            count: 0,
            ended: 0,
            ahead: None,
        });
        waiter.count += 1;
        if !read_ahead || waiter.ahead.is_some() {
            return None;
        }
        let ahead = Arc::new(ReadAhead {
            ended_before: waiter.ended,
            row: SetOnce::new(),
        });
        waiter.ahead = Some(ahead.clone());
        Some(ahead)
    }

    pub(super) fn remove(&self, guid: &str) {
        let mut waiting = self.lock();
        if let Some(waiter) = waiting.get_mut(guid) {
            waiter.count -= 1;
            if waiter.count == 0 {
                waiting.remove(guid);
            }
        }
    }

    pub(super) fn contains(&self, guid: &str) -> bool {
        self.lock().contains_key(guid)
    }

    /// The GUID's read ahead, while a telegram of it waits.
    pub(super) fn read_ahead(&self, guid: &str) -> Option<Arc<ReadAhead>> {
        self.lock().get(guid)?.ahead.clone()
    }

    /// A flight of the GUID ends: a row read before may predate its claim.
    fn flight_ended(&self, guid: &str) {
        if let Some(waiter) = self.lock().get_mut(guid) {
            waiter.ended += 1;
        }
    }

    /// How many flights of the GUID ended while a telegram of it waited:
    /// a count that moves says that a row read in between may miss a claim.
    /// Meaningful while the caller's own telegram is counted
    /// ([`Waiting::add`], [`Waiting::count_in`]), which keeps the count.
    pub(super) fn ended(&self, guid: &str) -> u64 {
        self.lock().get(guid).map_or(0, |w| w.ended)
    }

    /// Counts a telegram of the GUID as waiting until the returned guard
    /// is dropped: one answered without being sent, whose answer depends on
    /// no flight of the GUID ending meanwhile.
    pub(super) fn count_in<'a>(&'a self, guid: &'a str) -> Counted<'a> {
        self.add(guid, false);
        Counted {
            waiting: self,
            guid,
        }
    }
}

/// A telegram counted as waiting by [`Waiting::count_in`].
pub(super) struct Counted<'a> {
    waiting: &'a Waiting,
    guid: &'a str,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.waiting.remove(self.guid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Code;

    fn lead<'a>(joined: Joined<'a>) -> Lead<'a> {
        match joined {
            Joined::Lead(lead) => lead,
            Joined::Follow { .. } => panic!("expected to lead"),
        }
    }

    fn follow(joined: Joined<'_>) -> (String, watch::Receiver<Option<Reply>>) {
        match joined {
            Joined::Follow { fingerprint, reply } => (fingerprint, reply),
            Joined::Lead(_) => panic!("expected to follow"),
        }
    }

    #[tokio::test]
    async fn every_follower_gets_the_leaders_reply() {
        let flights = Flights::default();
        let first = lead(flights.join("G1", "f1"));
        let (theirs, mut a) = follow(flights.join("G1", "f2"));
        assert_eq!(theirs, "f1");
        let (_, mut b) = follow(flights.join("G1", "f1"));
        first.finish(&Reply::code(Code::OK));
        for rx in [&mut a, &mut b] {
            let got = rx.wait_for(Option::is_some).await.unwrap().clone();
            assert_eq!(got.unwrap().code, Code::OK);
        }
        assert!(!flights.contains("G1"));
    }

    #[tokio::test]
    async fn followers_see_a_cancelled_leader_gone() {
        let flights = Flights::default();
        let first = lead(flights.join("G1", "f1"));
        let (_, mut rx) = follow(flights.join("G1", "f1"));
        drop(first);
        assert!(rx.wait_for(Option::is_some).await.is_err());
        assert!(!flights.contains("G1"));
    }

    #[test]
    fn a_guid_waits_until_its_last_telegram_starts() {
        let waiting = Waiting::default();
        waiting.add("G1", false);
        waiting.add("G1", false);
        waiting.remove("G1");
        assert!(waiting.contains("G1"), "one still waits");
        waiting.remove("G1");
        assert!(!waiting.contains("G1"));
        waiting.remove("G1");
        assert!(!waiting.contains("G1"), "an extra remove changes nothing");
    }

    #[test]
    fn a_finished_flight_is_over_and_the_next_telegram_leads() {
        let flights = Flights::default();
        let first = lead(flights.join("G1", "f1"));
        assert!(flights.contains("G1"));
        first.finish(&Reply::code(Code::OK));
        assert!(!flights.contains("G1"));
        let again = lead(flights.join("G1", "f1"));
        // Flights of other GUIDs are their own.
        let other = lead(flights.join("G2", "f1"));
        drop(again);
        assert!(flights.contains("G2"));
        drop(other);
        assert!(!flights.contains("G2"));
    }
}
