//! One journal command and its answer: what the writer runs inside a
//! batch ([`Task`]), and what answers its caller once the batch's commit,
//! and for a durable write its fsync, are known ([`Reply`], which the writer
//! or the syncer sends).

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::journal::JournalError;

/// One command: run against the connection, answered after the commit.
pub(super) trait Task: Send {
    /// Whether the command changes the database (runs inside the batch's transaction).
    fn writes(&self) -> bool;
    /// Whether its commit must be on disk before the caller hears of it.
    fn durable(&self) -> bool;
    /// Runs the command. Returns whether it succeeded (so its savepoint is kept)
    /// and how to answer the caller once the batch's fate is known.
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Box<dyn Reply>);
    /// Answers the caller with an error without running the command.
    fn fail(self: Box<Self>, reason: String);
}

/// The answer of a command that ran, waiting for the batch's commit.
pub(super) trait Reply: Send {
    /// `commit` is `Err` when the batch was not committed: a command that itself
    /// succeeded must then not report success.
    fn send(self: Box<Self>, commit: Result<(), String>);
    /// Whether the command changed what a durable write must have on disk
    /// before its answer: a claim that found the GUID's row wrote nothing,
    /// and answers at the commit, without waiting for an fsync (which a
    /// journal that refuses durable writes would fail).
    fn wrote(&self) -> bool {
        true
    }
}

/// A command built from a closure; its result goes back through a oneshot.
pub(super) struct FnTask<T, F> {
    pub writes: bool,
    pub durable: bool,
    /// Whether a result changed the database ([`Reply::wrote`]).
    pub wrote: fn(&T) -> bool,
    pub f: F,
    pub reply: oneshot::Sender<Result<T, JournalError>>,
}

/// [`FnTask::wrote`] of a command whose every success writes.
pub(super) fn always<T>(_: &T) -> bool {
    true
}

struct FnReply<T> {
    writes: bool,
    wrote: bool,
    result: rusqlite::Result<T>,
    reply: oneshot::Sender<Result<T, JournalError>>,
}

fn error(writes: bool, reason: String) -> JournalError {
    if writes {
        JournalError::Write(reason)
    } else {
        JournalError::Read(reason)
    }
}

impl<T, F> Task for FnTask<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
{
    fn writes(&self) -> bool {
        self.writes
    }

    fn durable(&self) -> bool {
        self.durable
    }

    fn run(self: Box<Self>, conn: &Connection) -> (bool, Box<dyn Reply>) {
        let result = (self.f)(conn);
        let ok = result.is_ok();
        let reply = FnReply {
            writes: self.writes,
            wrote: result.as_ref().map_or(true, self.wrote),
            result,
            reply: self.reply,
        };
        (ok, Box::new(reply))
    }

    fn fail(self: Box<Self>, reason: String) {
        // The caller may have gone away; nothing to do then.
        let _ = self.reply.send(Err(error(self.writes, reason)));
    }
}

impl<T: Send> Reply for FnReply<T> {
    fn send(self: Box<Self>, commit: Result<(), String>) {
        let out = match (self.result, commit) {
            (Err(e), _) => Err(error(self.writes, e.to_string())),
            (Ok(_), Err(reason)) => Err(error(self.writes, reason)),
            (Ok(v), Ok(())) => Ok(v),
        };
        let _ = self.reply.send(out);
    }

    fn wrote(&self) -> bool {
        self.wrote
    }
}
