//! Reads of single rows gathered into one statement.
//!
//! A GUID's row is read on its own only off the busy path (a repeat, an
//! inquiry, a telegram taken no further), but those can come thousands at
//! once: when many channels pipeline behind calls the core holds, every
//! telegram that waited for room reaches its last start within a few
//! milliseconds, and each needs its row read in what is left of its budget.
//! One `SELECT` per GUID then queued behind the pool and the database's CPU,
//! and most of them missed the budget: a GUID never sent was answered E901
//! (`benches/pipelined_burst.sh` with `JOURNALS=pg`: 2,177 of 4,800).
//!
//! So a read joins a queue, and a few runners take the queue in batches,
//! one `guid = ANY($1)` statement each. A batch's statement starts after
//! every read in it was asked for, so each caller sees the row as fresh as
//! a read of its own would have: what the relay concludes from a read
//! ("no attempt began before this") still holds. A lone read is one
//! statement, as before, plus a task's start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::super::{JournalError, Row};

/// Batches running at once, at most: each holds one pooled connection while
/// its statement runs, so the pool keeps room for claims and outcomes.
pub(super) const MAX_RUNNERS: usize = 4;

/// GUIDs per statement, at most.
pub(super) const MAX_BATCH: usize = 1_000;

type Reply = oneshot::Sender<Result<Option<Row>, JournalError>>;

/// The reads waiting for a batch, and the runners taking them.
#[derive(Default)]
pub(super) struct Reads {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<(String, Reply)>,
    runners: usize,
}

/// A batch taken from the queue; its runner counts as running until it
/// finds the queue empty (or is dropped).
pub(super) struct Batch {
    pub(super) guids: Vec<String>,
    replies: Vec<Reply>,
}

impl Reads {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // A panic while the lock was held left the queue whole (pushes and
        // drains only).
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a read of `guid`: `true` when the caller must start a runner
    /// (fewer than [`MAX_RUNNERS`] run).
    pub(super) fn push(&self, guid: &str, reply: Reply) -> bool {
        let mut q = self.queue();
        q.waiting.push((guid.to_string(), reply));
        let start = q.runners < MAX_RUNNERS;
        if start {
            q.runners += 1;
        }
        start
    }

    /// The next batch for a runner, or `None` when none waits: the runner
    /// then stops (counted out under the same lock as a push looks, so a
    /// read queued meanwhile is taken by a runner that goes on, or starts
    /// one).
    pub(super) fn next_batch(&self) -> Option<Batch> {
        let mut q = self.queue();
        // Reads whose callers gave up (past their deadline) are not asked.
        q.waiting.retain(|(_, reply)| !reply.is_closed());
        if q.waiting.is_empty() {
            q.runners -= 1;
            return None;
        }
        // All of a burst's reads: the queue gives back the room it took.
        let (guids, replies) = if q.waiting.len() <= MAX_BATCH {
            std::mem::take(&mut q.waiting).into_iter().unzip()
        } else {
            q.waiting.drain(..MAX_BATCH).unzip()
        };
        Some(Batch { guids, replies })
    }

    /// A runner stopped without finding the queue empty (its task was
    /// dropped): the reads left are answered by the next runner a read
    /// starts, or failed now when none runs.
    pub(super) fn runner_lost(&self) {
        let mut q = self.queue();
        q.runners -= 1;
        if q.runners == 0 {
            for (_, reply) in q.waiting.drain(..) {
                let _ = reply.send(Err(JournalError::Read(
                    "the journal's reader stopped".into(),
                )));
            }
        }
    }
}

/// A batch's rows by GUID, each decoded or not.
pub(super) type Found = Vec<(String, Result<Row, JournalError>)>;

impl Batch {
    /// Gives each read its row (or none, or the error decoding it), or
    /// every read the batch's error.
    pub(super) fn answer(self, rows: Result<Found, JournalError>) {
        match rows {
            Ok(rows) => {
                let by_guid: HashMap<String, Result<Row, String>> = rows
                    .into_iter()
                    .map(|(guid, row)| (guid, row.map_err(|e| e.to_string())))
                    .collect();
                // Cloned: a GUID asked twice in one batch gets its row twice.
                for (guid, reply) in self.guids.iter().zip(self.replies) {
                    let read = match by_guid.get(guid) {
                        None => Ok(None),
                        Some(Ok(row)) => Ok(Some(row.clone())),
                        Some(Err(e)) => Err(JournalError::Read(e.clone())),
                    };
                    let _ = reply.send(read);
                }
            }
            Err(e) => {
                let reason = match e {
                    JournalError::Read(r) => r,
                    other => other.to_string(),
                };
                for reply in self.replies {
                    let _ = reply.send(Err(JournalError::Read(reason.clone())));
                }
            }
        }
    }
}

/// A runner counted in: made before its task is spawned, so that a task
/// dropped before it first runs (its runtime shutting down) still counts
/// itself out (found by a review: four such leaks and no runner ever
/// started again).
pub(super) struct Running {
    reads: Arc<Reads>,
    done: bool,
}

impl Running {
    /// Queues a read of `guid`; a runner to start when fewer than
    /// [`MAX_RUNNERS`] run.
    pub(super) fn new_if_due(reads: &Arc<Reads>, guid: &str, reply: Reply) -> Option<Running> {
        reads.push(guid, reply).then(|| Running {
            reads: reads.clone(),
            done: false,
        })
    }

    /// The runner found the queue empty and is counted out already.
    pub(super) fn finished(mut self) {
        self.done = true;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.done {
            self.reads.runner_lost();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(guid: &str) -> Row {
        Row {
            guid: guid.into(),
            tx_code: "TRF001".into(),
            fingerprint: "f".into(),
            state: crate::journal::State::Done,
            code: Some("0000".into()),
            answer: None,
            attempts: 1,
            last_attempt_ms: 0,
            answered_ms: None,
            last_error: None,
            created_ms: 0,
            updated_ms: 0,
            url: None,
            grace_ms: None,
        }
    }

    #[tokio::test]
    async fn reads_queued_together_are_answered_by_one_batch() {
        let reads = Reads::default();
        let (a, ra) = oneshot::channel();
        let (b, rb) = oneshot::channel();
        let (a2, ra2) = oneshot::channel();
        assert!(reads.push("A", a), "the first read starts a runner");
        assert!(reads.push("B", b), "so does each up to the limit");
        assert!(reads.push("A", a2));
        let batch = reads.next_batch().expect("three wait");
        assert_eq!(batch.guids, ["A", "B", "A"]);
        batch.answer(Ok(vec![("A".into(), Ok(row("A")))]));
        assert_eq!(ra.await.unwrap().unwrap(), Some(row("A")));
        assert_eq!(ra2.await.unwrap().unwrap(), Some(row("A")), "asked twice");
        assert_eq!(rb.await.unwrap().unwrap(), None, "no row");
        for _ in 0..3 {
            assert!(reads.next_batch().is_none(), "each runner stops");
        }
        assert_eq!(reads.queue().runners, 0);
    }

    #[tokio::test]
    async fn runners_are_bounded_and_a_batch_error_reaches_every_read() {
        let reads = Reads::default();
        let mut rxs = Vec::new();
        let mut started = 0;
        for i in 0..MAX_RUNNERS + 3 {
            let (tx, rx) = oneshot::channel();
            started += usize::from(reads.push(&format!("G{i}"), tx));
            rxs.push(rx);
        }
        assert_eq!(started, MAX_RUNNERS);
        let batch = reads.next_batch().expect("they wait");
        assert_eq!(batch.guids.len(), MAX_RUNNERS + 3, "one batch takes all");
        batch.answer(Err(JournalError::Read("down".into())));
        for rx in rxs {
            let e = rx.await.unwrap().unwrap_err();
            assert_eq!(e.to_string(), "journal read failed: down");
        }
    }

    #[tokio::test]
    async fn a_read_whose_caller_gave_up_is_not_asked() {
        let reads = Reads::default();
        let (tx, rx) = oneshot::channel();
        assert!(reads.push("GONE", tx));
        drop(rx);
        assert!(reads.next_batch().is_none());
        assert_eq!(reads.queue().runners, 0);
    }

    #[tokio::test]
    async fn reads_left_by_the_last_runner_lost_are_failed() {
        let reads = Arc::new(Reads::default());
        let (tx, rx) = oneshot::channel();
        let running = Running::new_if_due(&reads, "LEFT", tx).expect("a runner is due");
        drop(running);
        assert!(rx.await.unwrap().is_err());
        assert_eq!(reads.queue().runners, 0);
    }

    /// A runner whose task is dropped before it first runs (its runtime
    /// shutting down) is counted out: runners start again after four such
    /// (found by a review: before, the count leaked and every read hung).
    #[test]
    fn a_runner_dropped_before_it_ran_is_counted_out() {
        let reads = Arc::new(Reads::default());
        for i in 0..=MAX_RUNNERS {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let (tx, _rx) = oneshot::channel();
            let running = Running::new_if_due(&reads, &format!("G{i}"), tx)
                .unwrap_or_else(|| panic!("runner {i} is due: none runs"));
            let r = reads.clone();
            rt.spawn(async move {
                while r.next_batch().is_some() {}
                running.finished();
            });
            drop(rt);
        }
        assert_eq!(reads.queue().runners, 0);
    }

    /// One row that cannot be decoded fails the reads of its GUID only.
    #[tokio::test]
    async fn a_row_that_cannot_be_decoded_fails_its_own_reads_only() {
        let reads = Reads::default();
        let (bad, rbad) = oneshot::channel();
        let (good, rgood) = oneshot::channel();
        reads.push("BAD", bad);
        reads.push("GOOD", good);
        reads.next_batch().expect("two wait").answer(Ok(vec![
            (
                "BAD".into(),
                Err(JournalError::Read("unknown journal state".into())),
            ),
            ("GOOD".into(), Ok(row("GOOD"))),
        ]));
        let e = rbad.await.unwrap().unwrap_err();
        assert!(e.to_string().contains("unknown journal state"), "{e}");
        assert_eq!(rgood.await.unwrap().unwrap(), Some(row("GOOD")));
    }
}
