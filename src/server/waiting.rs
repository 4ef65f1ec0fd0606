//! Telegrams that wait in their connection for room to start (the
//! connection has `max_in_flight_per_connection` in flight): counted as
//! handled from their read, and held in order.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;

use super::Answerer;
use crate::frame::FrameCodec;
use crate::header::Echo;

/// A telegram that has to wait for room to start (its connection has its
/// maximum in flight) while its budget runs: its GUID counts as handled by
/// the hub from its read, whatever its tx code (a reload meanwhile may make
/// it a transfer), so an inquiry about it in the meantime does not take the
/// core's "never received" for an answer. The count ends with its task,
/// and the row a SQLite journal read ahead for it stays there for it; an
/// inquiry's ends at its start, so that one whose own GUID is the one it
/// asks about does not find itself handled.
pub(super) struct WaitingMark<H: Answerer> {
    hub: Arc<H>,
    /// `None` when the hub did not count it.
    guid: Option<String>,
}

impl<H: Answerer> WaitingMark<H> {
    /// For a telegram that waits for room.
    pub(super) fn new(hub: &Arc<H>, echo: &Echo) -> WaitingMark<H> {
        WaitingMark {
            hub: hub.clone(),
            guid: hub
                .waiting_to_start(echo)
                .then(|| echo.guid_str().to_string()),
        }
    }

    /// The telegram's task, started now (`handling` was made: a transfer
    /// counts through it too), ending the mark with it, or here for an
    /// inquiry.
    pub(super) fn spawn_with<T: Send + 'static>(
        self,
        handling: impl Future<Output = T> + Send + 'static,
        echo: &Echo,
    ) -> tokio::task::JoinHandle<T> {
        if self.hub.counts_until_start(echo) {
            drop(self);
            return tokio::spawn(handling.in_current_span());
        }
        tokio::spawn(
            async move {
                let answer = handling.await;
                drop(self);
                answer
            }
            .in_current_span(),
        )
    }
}

impl<H: Answerer> Drop for WaitingMark<H> {
    fn drop(&mut self) {
        if let Some(guid) = &self.guid {
            self.hub.no_longer_waiting(guid);
        }
    }
}

/// The telegrams read whole that wait in the connection for room to start,
/// behind one that waits already, in their order; with their bytes, which
/// the connection's read-ahead counts (before, only the buffer was counted,
/// so a channel pipelining without end was read without end while a
/// telegram waited for room; found by a review).
pub(super) struct HeldTelegrams<H: Answerer> {
    queue: VecDeque<Held<H>>,
    pub(super) bytes: usize,
}

impl<H: Answerer> Default for HeldTelegrams<H> {
    fn default() -> Self {
        HeldTelegrams {
            queue: VecDeque::new(),
            bytes: 0,
        }
    }
}

impl<H: Answerer> HeldTelegrams<H> {
    /// Frames every telegram whole in `buf`, each marked as waiting and
    /// timed from now (a malformed one stays in `buf`, answered in its turn).
    pub(super) fn hold_whole(&mut self, codec: &FrameCodec, buf: &mut BytesMut, hub: &Arc<H>) {
        while let Ok(Some(telegram)) = codec.decode(buf) {
            let mark = WaitingMark::new(hub, &Echo::from_telegram(&telegram));
            self.bytes += telegram.len();
            self.queue.push_back(Held {
                telegram,
                read_at: Instant::now(),
                mark: Some(mark),
            });
        }
    }

    pub(super) fn pop(&mut self) -> Option<Held<H>> {
        let held = self.queue.pop_front()?;
        self.bytes -= held.telegram.len();
        Some(held)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// A telegram read whole that waits in the connection for room to start,
/// behind one that waits already: timed and marked from its read.
pub(super) struct Held<H: Answerer> {
    pub(super) telegram: Bytes,
    pub(super) read_at: Instant,
    pub(super) mark: Option<WaitingMark<H>>,
}

/// The answers of telegrams whose time to start passed while they waited for
/// room, in their order, until the writer's queue has slots for them. Each
/// task started at the telegram's own last start (it is taken no further, so
/// nothing is sent for it; a journal that reads its row to answer it has the
/// rest of its budget for that), not when a slot frees up: the queue holds
/// twice the in-flight limit, and moves only as the answers ahead are
/// written.
pub(super) struct StartedLate<A> {
    /// Each answer with its telegram's length.
    answers: VecDeque<(usize, A)>,
    /// What the connection's read-ahead counts of them.
    pub(super) bytes: usize,
}

impl<A> Default for StartedLate<A> {
    fn default() -> Self {
        StartedLate {
            answers: VecDeque::new(),
            bytes: 0,
        }
    }
}

impl<A> StartedLate<A> {
    pub(super) fn push(&mut self, len: usize, answer: A) {
        self.bytes += len;
        self.answers.push_back((len, answer));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }

    /// Queues the first answer in the slot just reserved for it.
    pub(super) fn queue_first(&mut self, slot: mpsc::Permit<'_, A>) {
        if let Some(answer) = self.pop() {
            slot.send(answer);
        }
    }

    fn pop(&mut self) -> Option<A> {
        let (len, answer) = self.answers.pop_front()?;
        self.bytes -= len;
        Some(answer)
    }

    /// Queues as many answers as the writer's queue has slots for now.
    /// `false`: the writer has stopped.
    pub(super) fn queue_ready(&mut self, tx: &mpsc::Sender<A>) -> bool {
        while !self.answers.is_empty() {
            match tx.try_reserve() {
                Ok(slot) => self.queue_first(slot),
                Err(mpsc::error::TrySendError::Full(())) => return true,
                Err(mpsc::error::TrySendError::Closed(())) => return false,
            }
        }
        true
    }

    /// Queues every answer, waiting for slots. `false`: the writer has
    /// stopped.
    pub(super) async fn queue_all(&mut self, tx: &mpsc::Sender<A>) -> bool {
        while let Some(answer) = self.pop() {
            if tx.send(answer).await.is_err() {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_started_late_go_to_the_writer_in_order_as_slots_free() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut late = StartedLate::default();
        for (len, answer) in [(10, 'a'), (20, 'b'), (30, 'c')] {
            late.push(len, answer);
        }
        assert_eq!(late.bytes, 60);
        assert!(late.queue_ready(&tx), "the writer is there");
        assert_eq!(late.bytes, 30, "two slots taken, c waits");
        assert_eq!(rx.recv().await, Some('a'));
        assert!(late.queue_ready(&tx));
        assert!(late.is_empty());
        assert_eq!(late.bytes, 0);
        assert_eq!((rx.recv().await, rx.recv().await), (Some('b'), Some('c')));
        late.push(5, 'd');
        drop(rx);
        assert!(!late.queue_ready(&tx), "the writer has stopped");
        late.push(5, 'e');
        assert!(!late.queue_all(&tx).await, "the writer has stopped");
    }
}
