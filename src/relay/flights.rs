//! Single flight inside one process: while a transfer is handled, later
//! telegrams with the same GUID wait for its reply instead of touching the
//! journal or the core.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

use super::Reply;

struct Flight {
    fingerprint: String,
    reply: watch::Receiver<Option<Reply>>,
}

/// The transfers in flight in this process, by GUID.
#[derive(Default)]
pub(super) struct Flights(Mutex<HashMap<String, Flight>>);

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

/// The leader's hold on a flight; the flight ends when it is dropped, even if
/// the leader is cancelled (its followers then see the sender gone).
pub(super) struct Lead<'a> {
    flights: &'a Flights,
    guid: &'a str,
    tx: watch::Sender<Option<Reply>>,
}

impl Lead<'_> {
    /// Hands the reply to every follower.
    pub(super) fn finish(&self, reply: &Reply) {
        let _ = self.tx.send(Some(reply.clone()));
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        self.flights.lock().remove(self.guid);
    }
}

impl Flights {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Flight>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leads the GUID's flight, or follows the one already in the air.
    pub(super) fn join<'a>(&'a self, guid: &'a str, fingerprint: &str) -> Joined<'a> {
        let mut flights = self.lock();
        if let Some(f) = flights.get(guid) {
            return Joined::Follow {
                fingerprint: f.fingerprint.clone(),
                reply: f.reply.clone(),
            };
        }
        let (tx, rx) = watch::channel(None);
        flights.insert(
            guid.to_string(),
            Flight {
                fingerprint: fingerprint.to_string(),
                reply: rx,
            },
        );
        Joined::Lead(Lead {
            flights: self,
            guid,
            tx,
        })
    }

    /// Whether a telegram of this process is handling the GUID now.
    pub(super) fn contains(&self, guid: &str) -> bool {
        self.lock().contains_key(guid)
    }
}
