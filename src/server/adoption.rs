//! Busy plain-TCP connections served by a thread of their own.
//!
//! A core call is a blocking ureq exchange, so it needs a thread. Handing each
//! telegram from the reactor to a caller thread and its answer back costs two
//! thread wake-ups per telegram, which measured as more CPU than the call
//! itself. So a connection that has a telegram and nothing else in flight is
//! *lent* to a thread (an "adopter"), which then, like a thread-per-connection
//! server:
//!
//! * handles the telegram by polling the same future the reactor would, in
//!   place; the core call the future starts is left in the thread's stash
//!   (`stash::stashing`) and run right there;
//! * writes the answer with a blocking write (within the write timeout);
//! * reads the next telegram with a blocking read.
//!
//! The connection goes back to its reactor task, which owns it throughout
//! (its permit, its gauge, the drain), whenever serving it here could change
//! what the channel sees:
//!
//! * a read that would wait longer than [`IDLE_HANDBACK`], the connection's
//!   idle timeout or a slow sender's read timeout: idle connections cost only
//!   the reactor's bytes, and the reactor applies the timeouts;
//! * more than one telegram in the buffer (pipelining: the reactor runs them
//!   side by side), unframeable bytes, the end of the stream or a read error:
//!   the reactor answers and logs them as it always does;
//! * a core call that outlasts [`PATIENCE`] keeps the connection on its
//!   adopter, like a thread-per-connection server, but from then on a clock
//!   thread watches the connection (its own `epoll` instance): bytes from the
//!   channel (a pipelined telegram, its close) or the call's deadline move the
//!   telegram's future to the reactor, which reads them and answers at the
//!   budget as always. A quick call costs a lease in a sorted map and nothing
//!   else; a long one a registration, and no task or wake-up. The call
//!   itself goes on on the adopter and hands its result to the future
//!   wherever it is, exactly as from a caller thread, so the budget, the
//!   late-answer window and the send gate keep their meaning;
//! * a telegram that waits on anything else (the journal, a retry's pause)
//!   past the patience moves to the reactor. A SQLite journal's command is
//!   left in the stash like a core call and run here, alone, when no batch
//!   is running (`journal/sqlite/writer.rs`); the clock takes the connection
//!   back at the patience if it takes longer.
//!
//! A connection that came back with a telegram still being handled stays
//! with the reactor (and the caller threads) until a telegram is quick again.

use std::collections::{BTreeSet, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream as StdStream;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::debug;

use super::{
    Framer, Handling, InFlight, InFlightGuard, Inline, Limits, answered, failed_task,
    panic_message, write_timed_out,
};
use crate::core_client::caller::Callers;
use crate::frame::FrameCodec;
use crate::header::Echo;
use crate::relay::Reply;
use crate::stash::{self, Stashed, Work};

/// How long a telegram may wait on an adopter for anything but its core call
/// before it goes back to the reactor, and how long a core call runs before
/// the reactor watches its connection. Far above a healthy core's answer
/// time, far below any sensible budget (a call's deadline acts sooner when it
/// comes first).
pub(super) const PATIENCE: Duration = Duration::from_millis(20);

/// How long an adopter waits for a connection's next telegram before it
/// gives the connection back to the reactor.
pub(super) const IDLE_HANDBACK: Duration = Duration::from_millis(250);

/// Connections lent at once, at most; more busy connections are served by
/// the reactor and the caller threads.
pub(super) const MAX_LENT: usize = 4096;

/// An adopter's stack: it polls a telegram's future (whose state is on the
/// heap) and makes ureq calls, TLS handshakes included, like a caller thread;
/// only the pages used are resident.
const STACK_SIZE: usize = 1024 * 1024;

/// Makes the future that handles one telegram of this connection.
/// `true` when the handling may not be polled at once (see
/// [`super::Answerer::answer`]).
pub(super) type Start = Arc<dyn Fn(Bytes, Instant, bool) -> Handling + Send + Sync>;

/// A connection handed to an adopter, with the telegram it just read.
pub(super) struct Lent {
    pub stream: StdStream,
    pub telegram: Bytes,
    pub read_at: Instant,
    pub guard: InFlightGuard,
    pub start: Start,
    pub in_flight: Arc<InFlight>,
    pub limits: Limits,
    pub span: tracing::Span,
}

/// What the reactor resumes with when a connection comes back.
#[derive(Default)]
pub(super) struct Carry {
    /// Bytes read and not yet a telegram.
    pub buf: BytesMut,
    /// When the first byte of an incomplete telegram in `buf` came.
    pub started: Option<Instant>,
    /// Since when the connection has been idle (the last answer).
    pub idle_from: Option<Instant>,
    /// A telegram still being handled (past its call's deadline, with bytes
    /// from the channel during a long call, or waiting past the patience).
    pub inline: Option<Inline>,
    /// Taken from the listener's backlog by a draining hub, nothing read
    /// from it yet: its channel may not have sent its telegram yet.
    pub from_backlog: bool,
    /// A telegram was framed on this connection: its prefix mode is right,
    /// so bytes that cannot be framed later are no other mode's prefix.
    pub framed: bool,
}

/// How a lent connection comes back.
pub(super) enum Back {
    /// Closed here after a closing answer or a failed write.
    Closed,
    /// To be served by the reactor from where the adopter stopped.
    Resume(StdStream, Carry),
}

/// The adopters of one listener: a pool of threads, the count of
/// connections lent, and the clock that takes a slow telegram back.
pub(super) struct Adopters {
    threads: Callers,
    lent: Arc<AtomicUsize>,
    clock: Arc<Clock>,
    /// The clock's thread runs: without it a slow call would keep its
    /// connection (and its answer) until the call ends, so nothing is lent.
    ticking: bool,
    runtime: tokio::runtime::Handle,
    /// In tests: a connection that comes back cannot be registered with
    /// the reactor again (as when `epoll` refuses it).
    #[cfg(test)]
    pub(super) refuse_return: std::sync::atomic::AtomicBool,
}

impl Adopters {
    /// Adopters for connections served by the current runtime.
    pub(super) fn new() -> Adopters {
        let runtime = tokio::runtime::Handle::current();
        let (clock, ticking) = Clock::start();
        Adopters {
            threads: Callers::with_stack("relayhub-conn", STACK_SIZE),
            lent: Arc::new(AtomicUsize::new(0)),
            clock,
            ticking,
            runtime,
            #[cfg(test)]
            refuse_return: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Registers a connection that came back with the reactor.
    pub(super) fn resume(&self, stream: StdStream) -> std::io::Result<tokio::net::TcpStream> {
        #[cfg(test)]
        if self.refuse_return.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("refused by the test"));
        }
        stream.set_nonblocking(true)?;
        tokio::net::TcpStream::from_std(stream)
    }

    /// The same with adopter threads of `stack` bytes (a test makes them
    /// impossible to start).
    #[cfg(test)]
    pub(super) fn with_stack(stack: usize) -> Adopters {
        let mut adopters = Adopters::new();
        adopters.threads = Callers::with_stack("relayhub-conn", stack);
        adopters
    }

    /// Whether a connection could be lent now.
    pub(super) fn has_room(&self) -> bool {
        self.ticking && self.lent.load(Ordering::Relaxed) < MAX_LENT
    }

    /// Lends a connection; the receiver gets it back. When no thread can take
    /// it, it comes straight back with its telegram framed again in the
    /// buffer, for the reactor to handle as if just read.
    pub(super) fn lend(&self, lent: Lent) -> oneshot::Receiver<Back> {
        let (back, rx) = oneshot::channel();
        self.lent.fetch_add(1, Ordering::Relaxed);
        let lent_count = self.lent.clone();
        let clock = self.clock.clone();
        let runtime = self.runtime.clone();
        // The lent connection travels through a cell so that a failed start
        // can hand it back.
        let cell = Arc::new(Mutex::new(Some((lent, back))));
        let inside = cell.clone();
        let started = self.threads.run(Box::new(move || {
            let _lent = Counted(lent_count);
            let _runtime = runtime.enter();
            if let Some((lent, back)) = lock(&inside).take() {
                serve(lent, back, &clock);
            }
        }));
        if started.is_err() {
            self.lent.fetch_sub(1, Ordering::Relaxed);
            if let Some((lent, back)) = lock(&cell).take() {
                let (stream, carry) = kept(lent);
                let _ = back.send(Back::Resume(stream, carry));
            }
        }
        rx
    }
}

/// A connection that could not be lent, as the reactor takes it back: its
/// telegram already being handled (from when it was read, still counted in
/// flight), so that it is not lent again for that telegram.
fn kept(lent: Lent) -> (StdStream, Carry) {
    let carry = Carry {
        inline: Some(flight(
            &lent.start,
            lent.telegram,
            lent.read_at,
            lent.guard,
            true,
        )),
        framed: true,
        ..Carry::default()
    };
    (lent.stream, carry)
}

/// A telegram's handling started, with what its answer needs.
fn flight(
    start: &Start,
    telegram: Bytes,
    read_at: Instant,
    guard: InFlightGuard,
    deferred: bool,
) -> Inline {
    Inline {
        echo: Echo::from_telegram(&telegram),
        handling: start(telegram, read_at, deferred),
        guard,
        read_at,
    }
}

impl Drop for Adopters {
    fn drop(&mut self) {
        self.clock.stop();
    }
}

/// Takes a lent connection off the count when its adopter is done with it.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A connection while its telegram is being handled: the part the clock can
/// take back to the reactor.
struct Held {
    stream: StdStream,
    back: oneshot::Sender<Back>,
    flight: Inline,
}

/// A telegram's connection while an adopter handles it: whoever takes `held`
/// out owns the connection.
struct Slot {
    held: Mutex<Option<Held>>,
}

impl Slot {
    /// Takes the connection unless its adopter is polling it right now (an
    /// adopter that polls is not blocked in a call, and sees the patience
    /// and the deadlines itself).
    fn try_take(&self) -> Option<Held> {
        match self.held.try_lock() {
            Ok(mut held) => held.take(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().take(),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// A telegram's handling as it ended: its answer, or why its task failed.
type Handled = Result<(Echo, crate::relay::Reply), String>;

/// Serves a lent connection until it goes back or closes.
fn serve(lent: Lent, back: oneshot::Sender<Back>, clock: &Arc<Clock>) {
    let span = lent.span.clone();
    let _span = span.enter();
    if let Err(e) = prepare(&lent.stream, &lent.limits) {
        debug!(%e, "could not make the socket blocking; the reactor keeps the connection");
        let (stream, carry) = kept(lent);
        let _ = back.send(Back::Resume(stream, carry));
        return;
    }
    let Lent {
        stream,
        telegram,
        read_at,
        guard,
        start,
        in_flight,
        limits,
        span: _,
    } = lent;
    let resume = |stream: StdStream, back: oneshot::Sender<Back>, carry: Carry| {
        let _ = back.send(Back::Resume(stream, carry));
    };
    let codec = FrameCodec::new(limits.prefix, limits.max_telegram_len);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    // As `prepare` set it.
    let mut out = Answers::new(&limits, limits.write_timeout.max(Duration::from_millis(1)));
    let mut next = Some((telegram, read_at, guard));
    let mut stream = stream;
    let mut back = back;
    let mut buf = BytesMut::with_capacity(512);
    // Zeroed once for the connection's stay, not per read.
    let mut chunk = vec![0u8; 4096];
    let mut read_timeout = None;
    loop {
        if let Some((telegram, read_at, guard)) = next.take() {
            let slot = Arc::new(Slot {
                held: Mutex::new(Some(Held {
                    stream,
                    back,
                    flight: flight(&start, telegram, read_at, guard, false),
                })),
            });
            let Some((held, done)) = drive(&slot, &waker, clock, read_at + PATIENCE) else {
                // Gone to the reactor, with its telegram.
                return;
            };
            let Held {
                stream: s,
                back: b,
                flight,
            } = held;
            (stream, back) = (s, b);
            let (echo, reply) = match done {
                Ok(answer) => answer,
                Err(why) => failed_task(flight.echo, &why),
            };
            let written = out.write(&mut stream, flight.read_at, &echo, &reply);
            drop(flight.guard);
            if !written || reply.close {
                let _ = stream.shutdown(std::net::Shutdown::Write);
                let _ = back.send(Back::Closed);
                return;
            }
        }
        // The next telegram: only a lone, whole one stays here.
        let idle_from = Instant::now();
        let mut started = None;
        loop {
            // Draining: the reactor closes a connection that holds nothing
            // (bytes already here are read first, and answered).
            if buf.is_empty() && in_flight.is_closing() && !bytes_waiting(&stream) {
                return resume(stream, back, carry(buf, started, idle_from));
            }
            match codec.complete_len(&buf) {
                Ok(Some(n)) if n == buf.len() => match codec.decode(&mut buf) {
                    Ok(Some(telegram)) => {
                        next = Some((telegram, Instant::now(), in_flight.enter()));
                        break;
                    }
                    // A complete frame decodes; were it not so, the reactor
                    // would answer it.
                    _ => return resume(stream, back, carry(buf, started, idle_from)),
                },
                Ok(None) => {}
                // Pipelined, or unframeable: the reactor's business.
                Ok(Some(_)) | Err(_) => {
                    return resume(stream, back, carry(buf, started, idle_from));
                }
            }
            let wait = match started {
                Some(t) if !buf.is_empty() => {
                    // A telegram in pieces: its read timeout counts from its
                    // first byte; the reactor closes it when it is over.
                    let left = super::later(t, limits.read_timeout)
                        .saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return resume(stream, back, carry(buf, started, idle_from));
                    }
                    IDLE_HANDBACK.min(left)
                }
                _ => IDLE_HANDBACK.min(limits.idle_timeout),
            };
            let wait = wait.max(Duration::from_millis(1));
            if read_timeout != Some(wait) {
                if stream.set_read_timeout(Some(wait)).is_err() {
                    return resume(stream, back, carry(buf, started, idle_from));
                }
                read_timeout = Some(wait);
            }
            match read_into(&mut stream, &mut chunk, &mut buf) {
                // Bytes: a telegram yet?
                Ok(n) if n > 0 => {
                    started.get_or_insert_with(Instant::now);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // Timed out, the end of the stream, an error: the reactor
                // reads again and acts as it always does.
                _ => return resume(stream, back, carry(buf, started, idle_from)),
            }
        }
    }
}

/// Where the reactor takes over between telegrams: `started` counts only
/// for bytes that are not a whole telegram yet.
fn carry(buf: BytesMut, started: Option<Instant>, idle_from: Instant) -> Carry {
    Carry {
        started: started.filter(|_| !buf.is_empty()),
        buf,
        idle_from: Some(idle_from),
        inline: None,
        from_backlog: false,
        framed: true,
    }
}

/// Whether the channel's next bytes are already here: a read would not
/// wait.
fn bytes_waiting(stream: &StdStream) -> bool {
    crate::peek::peek_now(stream) == crate::peek::Peeked::Bytes
}

/// Makes a lent socket blocking, with the write timeout.
fn prepare(stream: &StdStream, limits: &Limits) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let write_timeout = limits.write_timeout.max(Duration::from_millis(1));
    stream.set_write_timeout(Some(write_timeout))
}

/// One blocking read appended to `buf`.
fn read_into(
    stream: &mut StdStream,
    chunk: &mut [u8],
    buf: &mut BytesMut,
) -> std::io::Result<usize> {
    let n = stream.read(chunk)?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// Polls the telegram's future in `slot` to the end on this thread, running
/// the core call it starts in place. `None`: the connection went back to the
/// reactor with the telegram still being handled (past `patience`).
fn drive(
    slot: &Arc<Slot>,
    waker: &Waker,
    clock: &Arc<Clock>,
    patience: Instant,
) -> Option<(Held, Handled)> {
    let mut cx = Context::from_waker(waker);
    loop {
        let mut held = lock(&slot.held);
        let h = held.as_mut()?;
        let (poll, stashed) = stash::stashing(|| Pin::new(&mut h.flight.handling).poll(&mut cx));
        match poll {
            Poll::Ready(done) => {
                let h = held.take().expect("held while polled");
                drop(held);
                // Nobody waits for a call left in the stash by a future that
                // ended: dropped unrun, its gate never leaves `QUEUED`. A
                // journal command runs all the same (its caller may have
                // moved it to a task of its own, which waits for it), but
                // not here: the answer is not held for it.
                if let Some(stashed) = stashed.filter(|s| s.must_run) {
                    run_elsewhere(stashed.work);
                }
                return Some((h, done.map_err(|p| panic_message(&p))));
            }
            Poll::Pending => match stashed {
                Some(Stashed {
                    work,
                    due,
                    must_run,
                }) => {
                    let fd = h.stream.as_raw_fd();
                    drop(held);
                    // Blocked in the call: the clock takes the connection
                    // back at its due time, and watches it from the
                    // patience on.
                    let due = lease_due(due, must_run, patience);
                    let lease = clock.lease(patience.min(due), due, slot.clone(), fd);
                    run(work);
                    clock.cancel(lease);
                }
                None if Instant::now() >= patience => {
                    let h = held.take().expect("held while polled");
                    drop(held);
                    hand_back(h);
                    return None;
                }
                None => {
                    drop(held);
                    std::thread::park_timeout(patience.saturating_duration_since(Instant::now()));
                }
            },
        }
    }
}

/// When the clock takes a connection back from work run in place: a core
/// call at its deadline; a journal command (`must_run`) no later than a
/// telegram waiting for the journal always could stay, the patience, or its
/// caller's deadline if that comes first.
fn lease_due(due: Option<Instant>, must_run: bool, patience: Instant) -> Instant {
    if must_run {
        due.map_or(patience, |due| due.min(patience))
    } else {
        due.unwrap_or(patience)
    }
}

/// Runs work on the runtime's blocking pool (here only outside a runtime).
fn run_elsewhere(work: Work) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(move || run(work))),
        Err(_) => run(work),
    }
}

/// Runs a core call; a panic in it ends the call only (its caller hears
/// "ended without a result"), as on a caller thread.
fn run(work: Work) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
}

/// Answers the telegram still being handled on a connection that could not
/// go back to the reactor (its socket not registered again), on `stream`, a
/// second descriptor of its socket, then closes it: the channel hears the
/// answer it waits for, at its budget as ever, and no next telegram is read.
pub(super) async fn answer_then_close(stream: StdStream, flight: Inline, limits: Limits) {
    let Inline {
        handling,
        echo,
        guard,
        read_at,
    } = flight;
    let (echo, reply) = match handling.await {
        Ok(answer) => answer,
        Err(p) => failed_task(echo, &panic_message(&p)),
    };
    // The socket's write timeout is not known here: the first write sets it.
    let mut answers = Answers::new(&limits, Duration::ZERO);
    let written = tokio::task::spawn_blocking(move || {
        let mut stream = stream;
        // The descriptors share the socket's flags: the reactor's were
        // non-blocking.
        if let Err(e) = stream.set_nonblocking(false) {
            debug!(%e, "cannot write the answer of a connection that could not return to the reactor");
            return;
        }
        answers.write(&mut stream, read_at, &echo, &reply);
        let _ = stream.shutdown(std::net::Shutdown::Both);
    })
    .await;
    if let Err(e) = written {
        debug!(%e, "the answer of a connection that could not return to the reactor was not written");
    }
    drop(guard);
}

/// Gives a connection whose telegram is still being handled back to the
/// reactor.
fn hand_back(held: Held) {
    let Held {
        stream,
        back,
        flight,
    } = held;
    let _ = back.send(Back::Resume(
        stream,
        Carry {
            inline: Some(flight),
            framed: true,
            ..Carry::default()
        },
    ));
}

/// Wakes the adopter that polls a future.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// How an adopter writes answers: framed, then written within the write
/// timeout as a whole.
struct Answers {
    framer: Framer,
    write_timeout: Duration,
    /// The socket's write timeout as last set.
    socket_timeout: Duration,
    budget: Duration,
}

impl Answers {
    /// Answers framed as `limits` say, on a socket whose write timeout is
    /// `socket_timeout`.
    fn new(limits: &Limits, socket_timeout: Duration) -> Answers {
        Answers {
            framer: Framer::new(FrameCodec::new(limits.prefix, limits.max_telegram_len)),
            write_timeout: limits.write_timeout,
            socket_timeout,
            budget: limits.budget,
        }
    }

    /// Writes the answer to a telegram read whole at `read_at`; `false`
    /// when the connection cannot go on.
    fn write(
        &mut self,
        stream: &mut StdStream,
        read_at: Instant,
        echo: &Echo,
        reply: &Reply,
    ) -> bool {
        let Some(framed) = self.framer.frame(echo, reply.code.as_str(), &reply.body) else {
            return false;
        };
        match write_within(stream, framed, self.write_timeout, &mut self.socket_timeout) {
            Ok(()) => {
                answered(read_at, self.budget);
                true
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                write_timed_out(self.write_timeout);
                false
            }
            Err(e) => {
                debug!(%e, "write failed; channel gone");
                false
            }
        }
    }
}

/// Writes `bytes` within `timeout` as a whole (the socket's own timeout,
/// last set to `socket_timeout`, bounds each write only).
fn write_within(
    stream: &mut StdStream,
    bytes: &[u8],
    timeout: Duration,
    socket_timeout: &mut Duration,
) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    let mut rest = bytes;
    while !rest.is_empty() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        // The socket keeps the whole timeout for a first write; a part
        // written leaves only what is left.
        let want = left.max(Duration::from_millis(1));
        if socket_timeout.abs_diff(want) > Duration::from_millis(1) {
            stream.set_write_timeout(Some(want))?;
            *socket_timeout = want;
        }
        match stream.write(rest) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Takes connections whose telegram outlasts its patience back to the
/// reactor while their adopter is blocked in a core call. One thread for
/// all adopters, with an `epoll` instance of its own:
///
/// * a lease costs an insert and a remove in a sorted map; the thread wakes
///   only when a lease is due (or every [`PATIENCE`] when there is none, so
///   that a new lease never has to wake it);
/// * at the patience it registers the connection's socket with its `epoll`
///   and keeps the lease until the call's deadline: bytes from the channel
///   (a pipelined telegram, its close) or the deadline take the connection
///   back;
/// * the call's end cancels the lease and, if it was watched, deregisters
///   the socket from the adopter's own thread: nobody is woken.
pub(super) struct Clock {
    state: Mutex<ClockState>,
    /// `None` when no `epoll` instance could be made (nothing is lent then).
    io: Option<ClockIo>,
}

struct ClockIo {
    /// Registers and deregisters watched sockets (any thread).
    registry: mio::Registry,
    /// Wakes the thread for a lease due before it would wake, or to stop.
    waker: mio::Waker,
}

struct ClockState {
    /// When each lease acts next: its patience, then its call's deadline.
    timers: BTreeSet<(Instant, Lease)>,
    leases: HashMap<Lease, Leased>,
    /// The next lease's id (the waker's token is skipped).
    next_id: Lease,
    /// When the clock thread wakes next on its own.
    wakes_at: Instant,
    stopped: bool,
}

/// A connection whose adopter is blocked in a core call.
struct Leased {
    slot: Arc<Slot>,
    /// The connection's socket, open for as long as the lease lasts (its
    /// adopter owns it and is blocked in the call).
    fd: RawFd,
    /// When the lease acts next (its key in `timers`).
    at: Instant,
    due: Instant,
    /// Registered with the clock's `epoll`.
    watched: bool,
}

/// A lease's id, to cancel it; also its socket's `epoll` token, so it is a
/// `usize` (a wider id would be cut short where `usize` is 32 bits, and the
/// event of a lease past 2^32 would name another).
pub(super) type Lease = usize;

/// The `epoll` token of the clock's waker; leases use their ids, never this
/// one.
const WAKE: mio::Token = mio::Token(usize::MAX);

impl Clock {
    /// The clock, and whether its thread runs.
    fn start() -> (Arc<Clock>, bool) {
        let made = mio::Poll::new().and_then(|poll| {
            let registry = poll.registry().try_clone()?;
            let waker = mio::Waker::new(poll.registry(), WAKE)?;
            Ok((poll, ClockIo { registry, waker }))
        });
        let (poll, io) = match made {
            Ok(parts) => parts,
            Err(e) => {
                tracing::error!(%e, "cannot make the adopters' clock an epoll instance; no connection is lent to a thread");
                let clock = Clock {
                    state: Mutex::new(ClockState::new(true)),
                    io: None,
                };
                return (Arc::new(clock), false);
            }
        };
        let clock = Arc::new(Clock {
            state: Mutex::new(ClockState::new(false)),
            io: Some(io),
        });
        let inside = clock.clone();
        let started = std::thread::Builder::new()
            .name("relayhub-clock".into())
            .stack_size(64 * 1024)
            .spawn(move || inside.run(poll));
        if let Err(e) = &started {
            tracing::error!(%e, "cannot start the adopters' clock thread; no connection is lent to a thread");
        }
        (clock, started.is_ok())
    }

    fn lease(&self, at: Instant, due: Instant, slot: Arc<Slot>, fd: RawFd) -> Lease {
        let mut state = lock(&self.state);
        let id = match state.next_id {
            id if id == WAKE.0 => 0,
            id => id,
        };
        state.next_id = id.wrapping_add(1);
        state.timers.insert((at, id));
        state.leases.insert(
            id,
            Leased {
                slot,
                fd,
                at,
                due,
                watched: false,
            },
        );
        if at < state.wakes_at {
            self.wake();
        }
        id
    }

    /// Ends a lease: the call returned (or the connection went back).
    fn cancel(&self, lease: Lease) {
        let mut state = lock(&self.state);
        if let Some(leased) = state.end(lease) {
            // Under the lock, so the clock cannot act on the socket after
            // this; its descriptor is still open (the adopter owns it).
            self.unwatch(&leased, lease);
        }
    }

    fn unwatch(&self, leased: &Leased, id: Lease) {
        if leased.watched
            && let Some(io) = &self.io
            && let Err(e) = io.registry.deregister(&mut mio::unix::SourceFd(&leased.fd))
        {
            debug!(%e, lease = id, "could not stop watching a lent connection");
        }
    }

    fn wake(&self) {
        if let Some(io) = &self.io {
            let _ = io.waker.wake();
        }
    }

    fn stop(&self) {
        lock(&self.state).stopped = true;
        self.wake();
    }

    fn run(&self, mut poll: mio::Poll) {
        let mut events = mio::Events::with_capacity(256);
        loop {
            let until = {
                let mut state = lock(&self.state);
                if state.stopped {
                    return;
                }
                // Bytes from a watched connection's channel: it goes back.
                for event in events.iter() {
                    let id = event.token().0;
                    if event.token() != WAKE
                        && let Some(leased) = state.end(id)
                    {
                        self.unwatch(&leased, id);
                        take_back(&leased.slot);
                    }
                }
                let now = Instant::now();
                while let Some(&(at, id)) = state.timers.first()
                    && at <= now
                {
                    state.timers.pop_first();
                    let Some(mut leased) = state.leases.remove(&id) else {
                        continue;
                    };
                    if now >= leased.due {
                        self.unwatch(&leased, id);
                        take_back(&leased.slot);
                        continue;
                    }
                    // The patience: watch the connection until the deadline.
                    // A socket already readable reports at once.
                    let watched = match &self.io {
                        Some(io) => io.registry.register(
                            &mut mio::unix::SourceFd(&leased.fd),
                            mio::Token(id),
                            mio::Interest::READABLE,
                        ),
                        None => Err(std::io::Error::other("no epoll instance")),
                    };
                    match watched {
                        Ok(()) => {
                            leased.watched = true;
                            leased.at = leased.due;
                            state.timers.insert((leased.due, id));
                            state.leases.insert(id, leased);
                        }
                        Err(e) => {
                            debug!(%e, "cannot watch a lent connection; it goes back to the reactor");
                            take_back(&leased.slot);
                        }
                    }
                }
                let until = match state.timers.first() {
                    Some((at, _)) => *at,
                    None => now + PATIENCE,
                };
                state.wakes_at = until;
                until
            };
            // Waits with nothing locked: adopters lease and cancel meanwhile.
            let wait = until.saturating_duration_since(Instant::now());
            if let Err(e) = poll.poll(&mut events, Some(wait))
                && e.kind() != ErrorKind::Interrupted
            {
                tracing::error!(%e, "the adopters' clock cannot wait on its epoll instance");
                events.clear();
                std::thread::sleep(PATIENCE);
            }
        }
    }
}

impl ClockState {
    /// Removes lease `id` and its timer.
    fn end(&mut self, id: Lease) -> Option<Leased> {
        let leased = self.leases.remove(&id)?;
        self.timers.remove(&(leased.at, id));
        Some(leased)
    }

    fn new(stopped: bool) -> ClockState {
        ClockState {
            timers: BTreeSet::new(),
            leases: HashMap::new(),
            next_id: 0,
            wakes_at: Instant::now(),
            stopped,
        }
    }
}

/// Gives the connection back to the reactor unless its adopter is polling it
/// (then the adopter sees the patience and the deadlines itself).
fn take_back(slot: &Slot) {
    if let Some(held) = slot.try_take() {
        hand_back(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A draining adopter hands back only a connection with nothing waiting;
    /// the peek leaves the socket blocking and the bytes unread.
    #[test]
    fn bytes_waiting_sees_sent_bytes_and_leaves_them() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut channel = StdStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut hub, _) = listener.accept().unwrap();
        assert!(!bytes_waiting(&hub));
        channel.write_all(b"0004ABCD").unwrap();
        hub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // A blocking peek returns once the bytes are here.
        hub.peek(&mut [0u8; 1]).unwrap();
        assert!(bytes_waiting(&hub));
        let mut got = [0u8; 8];
        hub.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"0004ABCD");
    }

    /// A journal command left in the stash by a poll that also ends the
    /// telegram's future (as `relay/bounded.rs` does past its deadline: the
    /// call polled once, then moved to a task) runs, but does not hold the
    /// answer: here the file's write lock is held by another connection
    /// until the adopter has returned, and the command still succeeds.
    #[test]
    fn a_journal_command_of_a_future_that_ended_runs_without_holding_the_answer() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let journal = crate::journal::sqlite::SqliteJournal::open(&path, 64).unwrap();
        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let (clock, _) = Clock::start();
        let (_channel, slot, _back) = blocked_in_a_call();
        let (late_tx, late_rx) = std::sync::mpsc::channel();
        lock(&slot.held).as_mut().unwrap().flight.handling =
            crate::catch_unwind::CatchUnwind(Box::pin(async move {
                let mut claim =
                    Box::pin(
                        async move { journal.claim("G1", "TRF001", "fp", "http://core", 1).await },
                    );
                std::future::poll_fn(|cx| {
                    let _ = claim.as_mut().poll(cx);
                    Poll::Ready(())
                })
                .await;
                late_tx.send(tokio::spawn(claim)).unwrap();
                (
                    Echo::from_telegram(&[b'0'; 64]),
                    crate::relay::Reply::code(crate::outcome::Code::UNKNOWN),
                )
            }));
        let _runtime = runtime.enter();
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let done = drive(&slot, &waker, &clock, Instant::now() + PATIENCE);
        assert!(done.is_some(), "answered on the adopter");
        // Only now may the command commit.
        other.execute_batch("ROLLBACK").unwrap();
        let late = late_rx.recv().unwrap();
        let claimed = runtime.block_on(late).unwrap();
        assert!(
            matches!(claimed, Ok(crate::journal::Claim::New)),
            "{claimed:?}"
        );
        clock.stop();
    }

    #[test]
    fn a_journal_command_goes_back_by_the_patience_or_its_callers_deadline() {
        let patience = Instant::now() + PATIENCE;
        let (sooner, later) = (patience - PATIENCE / 2, patience + PATIENCE);
        // A core call: at its own deadline, even past the patience.
        assert_eq!(lease_due(Some(later), false, patience), later);
        assert_eq!(lease_due(Some(sooner), false, patience), sooner);
        // A journal command: never past the patience, sooner if its caller's
        // deadline is (a budget shorter than the patience).
        assert_eq!(lease_due(None, true, patience), patience);
        assert_eq!(lease_due(Some(later), true, patience), patience);
        assert_eq!(lease_due(Some(sooner), true, patience), sooner);
    }

    /// A connection accepted here, in a slot as an adopter leaves it while
    /// blocked in a call: the channel's end, the slot, and the receiver of
    /// the connection when it goes back.
    fn blocked_in_a_call() -> (StdStream, Arc<Slot>, oneshot::Receiver<Back>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let channel = StdStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, _) = listener.accept().unwrap();
        let (back, rx) = oneshot::channel();
        let handling: super::super::Handling = crate::catch_unwind::CatchUnwind(Box::pin(
            std::future::pending::<(Echo, crate::relay::Reply)>(),
        ));
        let in_flight = Arc::new(InFlight::default());
        let flight = Inline {
            echo: Echo::from_telegram(&[b'0'; 64]),
            handling,
            guard: in_flight.enter(),
            read_at: Instant::now(),
        };
        let slot = Arc::new(Slot {
            held: Mutex::new(Some(Held {
                stream,
                back,
                flight,
            })),
        });
        (channel, slot, rx)
    }

    /// Waits (bounded) for the connection to go back; whether it did.
    fn went_back(rx: oneshot::Receiver<Back>, within: Duration) -> bool {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async { matches!(tokio::time::timeout(within, rx).await, Ok(Ok(_))) })
    }

    /// Every lease id is an `epoll` token of its own, never the waker's: the
    /// id that would be the waker's token is skipped, so bytes from the
    /// channel still take the connection back long before the deadline.
    #[test]
    fn bytes_take_back_the_lease_whose_id_would_be_the_wakers_token() {
        let (clock, ticking) = Clock::start();
        assert!(ticking);
        lock(&clock.state).next_id = WAKE.0;
        let (mut channel, slot, rx) = blocked_in_a_call();
        let fd = lock(&slot.held).as_ref().unwrap().stream.as_raw_fd();
        let now = Instant::now();
        let lease = clock.lease(now, now + Duration::from_secs(60), slot, fd);
        channel.write_all(b"0000").unwrap();
        let back = went_back(rx, Duration::from_secs(10));
        clock.cancel(lease);
        clock.stop();
        assert!(
            back,
            "bytes from the channel did not take the connection back (lease {lease})"
        );
    }
}
