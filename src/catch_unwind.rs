//! A panic while polling a future, turned into a value: a telegram handled on
//! its connection's task, or a journal call polled on the telegram's path,
//! must not take the connection (and the other telegrams on it) down with it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What ended a future early: the payload of its panic.
pub type Panic = Box<dyn std::any::Any + Send>;

/// Turns a panic while polling the inner future into an `Err`, as a task's
/// `JoinHandle` does.
pub struct CatchUnwind<F>(pub F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Panic>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(answer)) => Poll::Ready(Ok(answer)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// A panic's message, for a log line or an answer's note.
pub fn panic_message(panic: &Panic) -> String {
    let message = (**panic)
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| (**panic).downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)");
    format!("panicked with message {message:?}")
}
