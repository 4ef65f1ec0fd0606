//! Journal calls on the telegram path, raced against the telegram's deadline:
//! a stalled disk or a held lock must not hold a channel past its answer, and
//! a write that is under way is never cut in half (it finishes in the
//! background).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::task::Poll;

use tokio::time::Instant;

use super::Reply;
use crate::metric_names;
use crate::outcome::Code;

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
pub(super) async fn within<T: Send + 'static>(
    deadline: Instant,
    fut: impl Future<Output = T> + Send + 'static,
) -> Bounded<T> {
    let mut fut = Box::pin(fut);
    let polled = tokio::time::timeout_at(
        deadline,
        std::future::poll_fn(|cx| {
            std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx)))
                .map_or_else(|panic| Poll::Ready(Err(panic_text(&*panic))), |p| p.map(Ok))
        }),
    )
    .await;
    match polled {
        Ok(Ok(v)) => Bounded::Done(v),
        Ok(Err(why)) => Bounded::Failed(format!("journal task failed: {why}")),
        Err(_) => Bounded::Late(tokio::spawn(fut)),
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)");
    format!("panicked with message {message:?}")
}

/// Counts a journal failure on the telegram path, by stage.
pub(super) fn count_failure(stage: &'static str) {
    metrics::counter!(metric_names::JOURNAL_ERRORS, "stage" => stage).increment(1);
}

/// A failed claim: counted, and answered E903 (nothing was sent).
pub(super) fn claim_failed() -> Reply {
    count_failure("claim");
    Reply::code(Code::NO_CAPACITY)
}
