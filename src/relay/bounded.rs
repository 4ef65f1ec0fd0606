//! Journal calls on the telegram path, raced against the telegram's deadline:
//! a stalled disk or a held lock must not hold a channel past its answer, and
//! a write that is under way is never cut in half (it finishes in the
//! background).

use std::future::Future;

use tokio::time::Instant;

use super::Reply;
use crate::catch_unwind::{CatchUnwind, Panic, panic_message};
use crate::metric_names;
use crate::outcome::Code;
use crate::stash;
use crate::throttle::Throttle;

/// A journal call raced against the deadline.
pub(super) enum Bounded<T> {
    Done(T),
    /// Still running past the deadline; it goes on in the background.
    Late(tokio::task::JoinHandle<T>),
    /// The call's task itself failed (a panic in the store).
    Failed(String),
}

/// Runs `fut` and waits for it until `deadline`: polled in place (a store
/// that answers at once, like the memory journal, costs no task), and moved
/// into a task of its own only if it is still running at the deadline, so
/// that it finishes in the background. A panic in the store is caught either
/// way and reported as [`Bounded::Failed`].
///
/// `fut` is boxed here, before the returned future exists, so that the
/// caller's future holds a pointer to it rather than the store's whole
/// future by value: every telegram's future is that much smaller, which
/// keeps it (and this box) within the allocator's per-thread caches.
pub(super) fn within<T: Send + 'static>(
    deadline: Instant,
    fut: impl Future<Output = T> + Send + 'static,
) -> impl Future<Output = Bounded<T>> + Send {
    let mut fut = CatchUnwind(Box::pin(fut));
    async move {
        // A command the store leaves to the polling thread learns the deadline.
        match tokio::time::timeout_at(deadline, stash::bounded(deadline, &mut fut)).await {
            Ok(Ok(v)) => Bounded::Done(v),
            Ok(Err(panic)) => Bounded::Failed(failed(&panic)),
            Err(_) => Bounded::Late(tokio::spawn(fut.0)),
        }
    }
}

/// Runs a call to a store that answers at once ([`Journal::at_once`]) in
/// place: its value, or the panic that ended it, in the words [`within`]
/// reports one with.
///
/// [`Journal::at_once`]: crate::journal::Journal::at_once
pub(super) fn at_once<T>(call: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).map_err(|panic| failed(&panic))
}

/// A store's panic, as a journal call's failure.
fn failed(panic: &Panic) -> String {
    format!("journal task failed: {}", panic_message(panic))
}

/// Counts a journal failure on the telegram path, by stage. A claim that
/// fails means the journal takes no new transfer (a full disk, say): said at
/// WARN, at once and then at most every 10 s with the count, beside each
/// telegram's INFO summary line (before, only those said it; found by a
/// black-box probe).
pub(super) fn count_failure(stage: &'static str) {
    metrics::counter!(metric_names::JOURNAL_ERRORS, "stage" => stage).increment(1);
    if stage == "claim" {
        static CLAIMS: std::sync::Mutex<Throttle> =
            std::sync::Mutex::new(Throttle::new(std::time::Duration::from_secs(10)));
        let due = CLAIMS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(Instant::now());
        if let Some(failures) = due {
            tracing::warn!(
                failures,
                "the journal could not take transfers' claims: nothing of them was sent, and \
                 each telegram's summary line says why (a full disk, a failed write, a \
                 database that does not answer); `failures` counts them since the last such \
                 line"
            );
        }
    }
}

/// A claim that cannot be made where the journal shows no attempt of the
/// GUID that could have left (no row, or a row `not_sent`): counted, and
/// answered E903 (nothing was sent).
pub(super) fn claim_failed() -> Reply {
    count_failure("claim");
    Reply::code(Code::NO_CAPACITY)
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// Past its deadline, `within` polls the store once and ends in that
    /// poll; a command the store left in the thread's stash meanwhile knows
    /// the deadline (and must run: see `server/adoption.rs`).
    #[test]
    fn a_command_stashed_within_a_deadline_knows_it() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let journal =
            crate::journal::sqlite::SqliteJournal::open(&dir.path().join("j.db"), 64).unwrap();
        let _runtime = runtime.enter();
        let deadline = Instant::now();
        let mut fut = Box::pin(within(deadline, async move {
            journal.claim("G1", "TRF001", "fp", "http://core", 1).await
        }));
        let mut cx = Context::from_waker(Waker::noop());
        let (poll, stashed) = stash::stashing(|| fut.as_mut().poll(&mut cx));
        let stashed = stashed.expect("the claim was left in the stash");
        assert_eq!(stashed.due, Some(deadline));
        assert!(stashed.must_run);
        assert!(
            matches!(poll, Poll::Ready(Bounded::Late(_)) | Poll::Pending),
            "polled once"
        );
    }
}
