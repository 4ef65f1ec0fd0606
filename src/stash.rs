//! Work left for the thread that polls a future, instead of handed to
//! another thread.
//!
//! A busy connection's own thread (an adopter, `server/adoption.rs`) polls
//! its telegram's future with its stash open ([`stashing`]). A core call
//! (`core_client/caller.rs`) or a SQLite journal command
//! (`journal/sqlite/writer.rs`) that the poll starts is left here, and the
//! thread runs it itself right after the poll: no hand-off to another
//! thread, no wake-up on either side. Anywhere else the stash is closed and
//! the work goes where it always went.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Work to run on a thread that may block: a core call, or a journal
/// command.
pub(crate) type Work = Box<dyn FnOnce() + Send + 'static>;

/// Work left in a thread's stash.
pub(crate) struct Stashed {
    pub(crate) work: Work,
    /// When its caller stops waiting for it, if known.
    pub(crate) due: Option<tokio::time::Instant>,
    /// Run even if its caller is gone: a journal command, which once asked
    /// for is done (its caller may have moved it to a task of its own). A
    /// core call whose caller is gone is dropped unrun: its gate never
    /// leaves `QUEUED`, so it was not sent.
    pub(crate) must_run: bool,
}

thread_local! {
    /// `Some` while [`stashing`] runs on this thread: the first call or
    /// command made meanwhile is left here instead of going to another
    /// thread.
    static STASH: RefCell<Option<Option<Stashed>>> = const { RefCell::new(None) };
    /// The deadline of the innermost [`Bounded`] future being polled.
    static DEADLINE: Cell<Option<tokio::time::Instant>> = const { Cell::new(None) };
}

/// Runs `f` (a poll of a telegram's future) with this thread's stash open:
/// the first call or command that `f` starts is left in the stash, not
/// handed to another thread, and returned with `f`'s result. The caller must
/// run it; it may drop a core call instead (its gate then stays unstarted:
/// "not sent"), never work that [`Stashed::must_run`].
pub(crate) fn stashing<R>(f: impl FnOnce() -> R) -> (R, Option<Stashed>) {
    /// Closes the stash however `f` ends, a panic included.
    struct Close;
    impl Drop for Close {
        fn drop(&mut self) {
            STASH.with(|s| *s.borrow_mut() = None);
        }
    }
    STASH.with(|s| *s.borrow_mut() = Some(None));
    let close = Close;
    let result = f();
    let stashed = STASH.with(|s| s.borrow_mut().take().flatten());
    drop(close);
    (result, stashed)
}

/// Leaves a core call in this thread's stash if it is open and empty;
/// otherwise hands it back.
pub(crate) fn stash_call(work: Work, due: tokio::time::Instant) -> Option<Work> {
    put(work, Some(due), false, |work| work).err()
}

/// `fut`'s output if it is ready in this poll or the next one; `None` if
/// not by then. For a core call left in the stash: it runs on this thread
/// right after this poll, and the next poll comes when it has ended or when
/// the clock has moved the telegram to the reactor (at its deadline, or on
/// bytes from the channel), so a caller waits here with no timer and
/// registers one only if the call is still running at that next poll.
pub(crate) async fn by_the_next_poll<F: Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    let mut first = true;
    std::future::poll_fn(|cx| match Pin::new(&mut *fut).poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending if std::mem::take(&mut first) => Poll::Pending,
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

/// Leaves the command `make` builds from `value` in this thread's stash if
/// it is open and empty: this thread runs it right after the poll, with no
/// wake-up on either side, and runs it even if the poll ended the caller's
/// future. Its deadline is the one of the [`Bounded`] future being polled,
/// if any. Otherwise hands `value` back untouched, for the caller to send
/// wherever such a command goes from any other thread.
pub(crate) fn stash_command<T>(value: T, make: impl FnOnce(T) -> Work) -> Result<(), T> {
    put(value, DEADLINE.get(), true, make)
}

fn put<T>(
    value: T,
    due: Option<tokio::time::Instant>,
    must_run: bool,
    make: impl FnOnce(T) -> Work,
) -> Result<(), T> {
    STASH.with(|s| match &mut *s.borrow_mut() {
        Some(slot @ None) => {
            *slot = Some(Stashed {
                work: make(value),
                due,
                must_run,
            });
            Ok(())
        }
        _ => Err(value),
    })
}

/// A future whose caller waits for it until `deadline` (see [`bounded`]).
pub(crate) struct Bounded<F> {
    deadline: tokio::time::Instant,
    fut: F,
}

/// `fut`, telling a command it leaves in a stash ([`stash_command`]) that
/// its caller waits for it until `deadline`: the thread that runs it then
/// gives the telegram back to the reactor by that time, so a command that
/// blocks (a stalled disk) cannot hold the answer past its budget.
pub(crate) fn bounded<F: Future + Unpin>(deadline: tokio::time::Instant, fut: F) -> Bounded<F> {
    Bounded { deadline, fut }
}

impl<F: Future + Unpin> Future for Bounded<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        /// Puts back the outer deadline however the poll ends.
        struct Restore(Option<tokio::time::Instant>);
        impl Drop for Restore {
            fn drop(&mut self) {
                DEADLINE.set(self.0);
            }
        }
        let _restore = Restore(DEADLINE.replace(Some(self.deadline)));
        Pin::new(&mut self.fut).poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Stashes a command while `fut`'s poll runs; returns its deadline.
    fn stashed_due(poll: impl FnOnce(&mut dyn FnMut())) -> Option<tokio::time::Instant> {
        let ((), stashed) = stashing(|| {
            let mut stash = || {
                assert!(stash_command((), |()| Box::new(|| {})).is_ok());
            };
            poll(&mut stash)
        });
        let stashed = stashed.expect("stashed");
        assert!(stashed.must_run);
        stashed.due
    }

    /// Ready at the first poll or the second: its output; still pending at
    /// the second: `None`, and the caller goes on to wait with a timer.
    #[test]
    fn by_the_next_poll_waits_one_poll_and_no_more() {
        use std::task::Waker;
        let mut cx = Context::from_waker(Waker::noop());
        let mut ready = std::future::ready(7);
        let mut wait = Box::pin(by_the_next_poll(&mut ready));
        assert_eq!(wait.as_mut().poll(&mut cx), Poll::Ready(Some(7)));

        let (tx, mut rx) = tokio::sync::oneshot::channel::<u8>();
        let mut wait = Box::pin(by_the_next_poll(&mut rx));
        assert_eq!(wait.as_mut().poll(&mut cx), Poll::Pending);
        tx.send(9).unwrap();
        assert_eq!(wait.as_mut().poll(&mut cx), Poll::Ready(Some(Ok(9))));

        let (_tx, mut rx) = tokio::sync::oneshot::channel::<u8>();
        let mut wait = Box::pin(by_the_next_poll(&mut rx));
        assert_eq!(wait.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(wait.as_mut().poll(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn a_command_stashed_inside_a_bounded_future_learns_its_deadline() {
        use std::task::Waker;
        let now = tokio::time::Instant::now();
        let (outer, inner) = (now + Duration::from_secs(2), now + Duration::from_secs(1));
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(stashed_due(|stash| stash()), None, "no deadline");
        let due = stashed_due(|stash| {
            let fut = std::future::poll_fn(|_| {
                stash();
                Poll::Ready(())
            });
            let _ = Pin::new(&mut bounded(inner, Box::pin(fut))).poll(&mut cx);
        });
        assert_eq!(due, Some(inner));
        // Nested: the innermost deadline while it is polled, the outer one
        // again once its poll returns.
        let due = stashed_due(|stash| {
            let fut = std::future::poll_fn(|cx| {
                let mut inner_fut = bounded(inner, Box::pin(std::future::ready(())));
                let _ = Pin::new(&mut inner_fut).poll(cx);
                stash();
                Poll::Ready(())
            });
            let _ = Pin::new(&mut bounded(outer, Box::pin(fut))).poll(&mut cx);
        });
        assert_eq!(due, Some(outer));
        assert_eq!(DEADLINE.get(), None, "put back after the poll");
    }
}
