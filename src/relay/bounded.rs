//! Journal calls on the telegram path, raced against the telegram's deadline:
//! a stalled disk or a held lock must not hold a channel past its answer, and
//! a write that is under way is never cut in half (it finishes in the
//! background).

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

/// Runs `fut` as its own task and waits for it until `deadline`.
pub(super) async fn within<T: Send + 'static>(
    deadline: Instant,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Bounded<T> {
    let mut task = tokio::spawn(fut);
    match tokio::time::timeout_at(deadline, &mut task).await {
        Ok(Ok(v)) => Bounded::Done(v),
        Ok(Err(e)) => Bounded::Failed(format!("journal task failed: {e}")),
        Err(_) => Bounded::Late(task),
    }
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
